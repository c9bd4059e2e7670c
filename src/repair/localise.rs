//! Which files a repair prompt shows, read through the sandbox: the files the failing output
//! names, the files those (and the tests) import, then the rest by how many of the failing
//! output's words they contain, until the prompt's budget is spent.

use std::collections::HashSet;

use super::reply::FileWrite;
use crate::project::is_test_file;
use crate::tools::tally::{Tally, tally_runs};
use crate::tools::{TestRun, ToolContext, all_passed, render_test_runs};
use crate::workspace::Workspace;

/// Source files worth showing whole; others are only listed.
const SOURCE_EXTENSIONS: &[&str] = &[
    ".py", ".js", ".mjs", ".cjs", ".ts", ".go", ".rs", ".rb", ".java", ".c", ".h", ".cpp", ".sh",
];
/// Largest file read for the prompt; a larger one is only listed.
const MAX_FILE: usize = 48 * 1024;
/// Files read at most, to rank them (a large repository is localised from its first ones).
const MAX_FILES_READ: usize = 120;
/// Bytes of failing test output the prompt keeps.
const MAX_FAILING_OUTPUT: usize = 6000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub path: String,
    pub text: String,
    pub test: bool,
}

/// What the prompt is made of.
#[derive(Debug, Default)]
pub struct Localised {
    /// Every test command's output as the model sees it (bounded).
    pub failing: String,
    /// Whether the tests already pass (nothing to repair).
    pub tests_pass: bool,
    /// The failing tests, counted (when the runner's summary could be read).
    pub tally: Option<Tally>,
    /// In the order they are shown.
    pub shown: Vec<Shown>,
    /// Source files that did not fit the budget (or were too large), listed by name.
    pub left_out: Vec<String>,
}

impl Localised {
    /// The shown files the model may rewrite (not the tests).
    pub fn sources(&self) -> Vec<String> {
        self.shown
            .iter()
            .filter(|s| !s.test)
            .map(|s| s.path.clone())
            .collect()
    }

    /// The prompt's view of the project with `files` written over it (a round that starts from
    /// an earlier candidate), whose tests fail with `failing`.
    pub fn with_files(&self, files: &[FileWrite], failing: &str, tally: Option<Tally>) -> Localised {
        let shown = self
            .shown
            .iter()
            .map(|s| match files.iter().find(|f| f.path == s.path) {
                Some(f) => Shown {
                    text: f.content.clone(),
                    ..s.clone()
                },
                None => s.clone(),
            })
            .collect();
        Localised {
            failing: failing.to_string(),
            tests_pass: false,
            tally,
            shown,
            left_out: self.left_out.clone(),
        }
    }

    /// The shown text of `path`, if it was shown.
    pub fn text_of(&self, path: &str) -> Option<String> {
        self.shown.iter().find(|s| s.path == path).map(|s| s.text.clone())
    }

    /// Whether `file` is a shown file given back as it was. Blank lines and trailing blanks do
    /// not count: the 1.5B model echoing a file drops or adds a blank line, and calling that a
    /// change would cost a sandbox run that can only fail the same way.
    pub fn unchanged(&self, file: &FileWrite) -> bool {
        let lines = |t: &str| -> Vec<String> {
            t.lines()
                .map(str::trim_end)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        };
        self.shown
            .iter()
            .any(|s| s.path == file.path && lines(&s.text) == lines(&file.content))
    }
}

/// Run the tests and read the files the prompt shows, within `budget` bytes of file text.
pub async fn localise(ctx: &ToolContext<'_>, budget: usize) -> Localised {
    let ws = Workspace::new(ctx.sandbox);
    let runs: Vec<TestRun> = if ctx.settings.test_commands.is_empty() {
        Vec::new()
    } else {
        ctx.run_tests().await.unwrap_or_default()
    };
    let tests_pass = !runs.is_empty() && all_passed(&runs);
    let failing = failing_output(&runs);
    let listed = ws.list(".", 1000).await.map(|l| l.lines).unwrap_or_default();
    let mut files = Vec::new();
    let mut too_big = Vec::new();
    for path in listed
        .iter()
        .filter(|p| SOURCE_EXTENSIONS.iter().any(|e| p.ends_with(e)))
        .take(MAX_FILES_READ)
    {
        match ws.read(path, MAX_FILE).await {
            Ok(f) if f.complete() && !f.data.contains(&0) => {
                if let Ok(text) = String::from_utf8(f.data) {
                    files.push(Shown {
                        path: path.clone(),
                        test: is_test_file(path, &ctx.settings.test_patterns),
                        text,
                    });
                }
            }
            Ok(_) => too_big.push(path.clone()),
            Err(_) => {}
        }
    }
    let (shown, mut left_out) = choose(files, &failing, budget);
    left_out.extend(too_big);
    Localised {
        failing,
        tests_pass,
        tally: tally_runs(&runs),
        shown,
        left_out,
    }
}

/// The test runs as the prompt shows them: the end kept, where the failing assertion is.
pub fn failing_output(runs: &[TestRun]) -> String {
    let failing = render_test_runs(runs);
    if failing.len() <= MAX_FAILING_OUTPUT {
        return failing;
    }
    let cut = failing.len() - MAX_FAILING_OUTPUT;
    let at = (cut..failing.len())
        .find(|i| failing.is_char_boundary(*i))
        .unwrap_or(cut);
    format!("[... {cut} bytes cut]\n{}", &failing[at..])
}

/// The files in the order they are shown, and the sources left out for the budget.
pub fn choose(files: Vec<Shown>, failing: &str, budget: usize) -> (Vec<Shown>, Vec<String>) {
    let named: HashSet<String> = files
        .iter()
        .filter(|f| mentions(failing, &f.path))
        .map(|f| f.path.clone())
        .collect();
    // What the named files and the tests import.
    let importers: Vec<&Shown> = files
        .iter()
        .filter(|f| named.contains(&f.path) || f.test)
        .collect();
    let imported: HashSet<String> = files
        .iter()
        .filter(|f| {
            importers
                .iter()
                .any(|i| i.path != f.path && imports(&i.text, &f.path))
        })
        .map(|f| f.path.clone())
        .collect();
    let words = words_of(failing);
    let tier = |f: &Shown| -> u8 {
        match (named.contains(&f.path), imported.contains(&f.path), f.test) {
            (true, _, false) => 0,
            (true, _, true) => 1,
            (false, true, false) => 2,
            (false, false, false) => 3,
            (false, _, true) => 4,
        }
    };
    let mut ranked: Vec<(u8, usize, Shown)> = files
        .into_iter()
        .map(|f| {
            let relevance = words.iter().filter(|w| f.text.contains(w.as_str())).count();
            (tier(&f), relevance, f)
        })
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.path.cmp(&b.2.path)));
    let mut left = budget;
    let mut shown = Vec::new();
    let mut left_out = Vec::new();
    for (_, _, f) in ranked {
        if f.text.len() <= left {
            left -= f.text.len();
            shown.push(f);
        } else if !f.test {
            left_out.push(f.path);
        }
    }
    (shown, left_out)
}

/// The output names the file: its path, or its file name as a whole word (`counter.py:12`).
fn mentions(text: &str, path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    [path, name].iter().any(|needle| {
        text.match_indices(needle).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            before.is_none_or(|c| !(c.is_alphanumeric() || "_-.".contains(c)))
        })
    })
}

/// `text` imports the module that `path` is: an import-looking line naming its stem as a word
/// (`import counter`, `from pkg.util import x`, `require('./util')`, `use crate::util`, `mod util;`).
fn imports(text: &str, path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let stem = name.split('.').next().unwrap_or(name);
    if stem.is_empty() {
        return false;
    }
    text.lines().any(|line| {
        let l = line.trim_start();
        let import_line = [
            "import ", "from ", "use ", "mod ", "#include", "pub mod ", "pub use ",
        ]
        .iter()
        .any(|p| l.starts_with(p))
            || l.contains("require(")
            || l.contains("import(");
        import_line
            && l.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|w| w == stem)
    })
}

/// The identifiers of the failing output worth looking for (4 characters or more).
fn words_of(text: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.len() >= 4 && !w.chars().all(|c| c.is_ascii_digit()))
        .filter(|w| seen.insert(w.to_string()))
        .take(300)
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> Shown {
        Shown {
            path: path.into(),
            text: text.into(),
            test: is_test_file(path, &[]),
        }
    }

    #[test]
    fn named_files_first_then_what_is_imported_then_by_relevance_within_the_budget() {
        let files = vec![
            file("zeta.py", "def unrelated():\n    pass\n"),
            file("helpers.py", "def parse_line(x):\n    return x\n"),
            file(
                "money.py",
                "from helpers import parse_line\n\ndef total(xs):\n    return 0\n",
            ),
            file(
                "test_money.py",
                "from money import total\n\ndef test_total():\n    assert total([1]) == 1\n",
            ),
            file("other.py", "def total_other():\n    return parse_line\n"),
        ];
        let failing = "test_money.py:4: AssertionError\nE  assert total([1]) == 1\n  money.py:5 in total\n";
        let (shown, left_out) = choose(files.clone(), failing, 10_000);
        let order: Vec<&str> = shown.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            order,
            ["money.py", "test_money.py", "helpers.py", "other.py", "zeta.py"]
        );
        assert!(left_out.is_empty());

        // A small budget keeps the first ones and lists the sources it left out.
        let budget = files[2].text.len() + files[3].text.len();
        let (shown, left_out) = choose(files, failing, budget);
        let order: Vec<&str> = shown.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(order, ["money.py", "test_money.py"]);
        assert_eq!(left_out, ["helpers.py", "other.py", "zeta.py"]);
    }

    #[test]
    fn a_file_name_inside_another_word_is_not_a_mention() {
        assert!(mentions("File \"/workspace/util.py\", line 3", "util.py"));
        assert!(!mentions("see my_util.py", "util.py"));
        assert!(imports("const u = require('./util');", "lib/util.js"));
        assert!(!imports("# util is not imported here", "util.py"));
    }
}
