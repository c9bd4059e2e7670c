//! `--repair-reply blocks`: search/replace blocks in the reply's text, the convention aider's
//! users know —
//!
//! ```text
//! library.py
//! <<<<<<< SEARCH
//!         fee = fee / 2
//! =======
//!         fee = fee // 2
//! >>>>>>> REPLACE
//! ```
//!
//! A block is applied where its SEARCH text occurs exactly once; otherwise a tolerant match
//! (whitespace, quote style where the language makes `'` and `"` the same, a docstring or
//! comment line the model left out) may locate it, but only if it finds one place: never a
//! guess between two. The tolerant match only *locates* the lines; the REPLACE text is written
//! as the model wrote it.

use super::reply::{FileWrite, named_in};

/// One SEARCH/REPLACE block and the file it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditBlock {
    pub path: String,
    pub search: String,
    pub replace: String,
}

/// How a block's SEARCH text was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    Exact,
    Tolerant,
}

/// Why a block was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The SEARCH text is nowhere in the file, not even tolerantly.
    Absent,
    /// It matches at several places (1-based first lines); applying it would be a guess.
    Ambiguous(Vec<usize>),
    /// An empty SEARCH for a file that exists: where would it go?
    EmptySearch,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Absent => write!(f, "its SEARCH text is not in the file"),
            Refused::Ambiguous(lines) => write!(
                f,
                "its SEARCH text matches {} places (lines {}), so it was not applied",
                lines.len(),
                lines.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
            ),
            Refused::EmptySearch => write!(f, "its SEARCH text is empty and the file exists"),
        }
    }
}

const SEARCH: &str = "SEARCH";
const REPLACE: &str = "REPLACE";

/// `<<<<<<< SEARCH` (5 to 9 markers, the word optional after them).
fn marker_line(line: &str, ch: char, word: &str) -> bool {
    let t = line.trim();
    let n = t.chars().take_while(|c| *c == ch).count();
    if !(5..=9).contains(&n) {
        return false;
    }
    let rest = t[n..].trim();
    rest.is_empty() && ch == '=' || rest.eq_ignore_ascii_case(word)
}

/// The blocks of `text`, each with its file: named on a line above the block (or in the
/// fence's info string), else the file of the block before it, else the one file shown. A
/// block cut off before its REPLACE marker is an error: the reply ran out.
pub fn parse(text: &str, shown: &[String]) -> Result<Vec<EditBlock>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut named: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if !marker_line(line, '<', SEARCH) {
            if let Some(path) = named_in(line.trim_start_matches('`'), shown) {
                named = Some(path);
            }
            i += 1;
            continue;
        }
        let mut search = Vec::new();
        let mut j = i + 1;
        while j < lines.len() && !marker_line(lines[j], '=', "") {
            search.push(lines[j]);
            j += 1;
        }
        let mut replace = Vec::new();
        let mut k = j + 1;
        while k < lines.len() && !marker_line(lines[k], '>', REPLACE) {
            replace.push(lines[k]);
            k += 1;
        }
        if k >= lines.len() {
            return Err(format!(
                "a SEARCH/REPLACE block (from line {}) is cut off before its {} marker",
                i + 1,
                if j >= lines.len() {
                    "======="
                } else {
                    ">>>>>>> REPLACE"
                }
            ));
        }
        let path = match (&named, shown) {
            (Some(p), _) => p.clone(),
            (None, [only]) => only.clone(),
            (None, _) => {
                return Err(format!(
                    "a SEARCH/REPLACE block (line {}) names no file, and several were shown",
                    i + 1
                ));
            }
        };
        blocks.push(EditBlock {
            path,
            search: join(&search),
            replace: join(&replace),
        });
        i = k + 1;
    }
    Ok(blocks)
}

fn join(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    if !lines.is_empty() {
        s.push('\n');
    }
    s
}

/// Whether `'` and `"` delimit the same strings in the file's language.
fn quotes_equal(path: &str) -> bool {
    [".py", ".pyi", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx"]
        .iter()
        .any(|e| path.ends_with(e))
}

/// Apply one block to `content` (the file `path`): the new content and how the text was found.
pub fn apply(path: &str, content: &str, search: &str, replace: &str) -> Result<(String, Located), Refused> {
    if search.trim().is_empty() {
        return Err(Refused::EmptySearch);
    }
    // Exact: whole lines, once. A match inside a line (the SEARCH text without its
    // indentation) is left to the tolerant match, which replaces whole lines.
    let at_line_start = |i: usize| i == 0 || content[..i].ends_with('\n');
    let exact: Vec<usize> = content
        .match_indices(search)
        .map(|(i, _)| i)
        .filter(|i| at_line_start(*i))
        .collect();
    if let [i] = exact.as_slice() {
        let out = format!("{}{replace}{}", &content[..*i], &content[i + search.len()..]);
        return Ok((out, Located::Exact));
    }
    // Without its final newline: the last line of a file may have none.
    let bare = search.strip_suffix('\n').unwrap_or(search);
    if exact.is_empty() && !content.ends_with('\n') && content.ends_with(bare) {
        let i = content.len() - bare.len();
        if at_line_start(i) && content.matches(bare).count() == 1 {
            let bare_replace = replace.strip_suffix('\n').unwrap_or(replace);
            return Ok((format!("{}{bare_replace}", &content[..i]), Located::Exact));
        }
    }
    let (first, last) = locate(content, search, quotes_equal(path))?;
    let lines: Vec<&str> = content.split_inclusive('\n').collect();
    let mut out: String = lines[..first].concat();
    out.push_str(replace);
    if !replace.is_empty() && !replace.ends_with('\n') && last + 1 < lines.len() {
        out.push('\n');
    }
    out.push_str(&lines[last + 1..].concat());
    Ok((out, Located::Tolerant))
}

/// A line as the tolerant match compares it: no whitespace at all, and with `quotes`, every
/// `'` read as `"`.
fn normalised(line: &str, quotes: bool) -> String {
    line.chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| if quotes && c == '\'' { '"' } else { c })
        .collect()
}

/// The file's lines the tolerant match may step over when the SEARCH text left them out:
/// comment lines and the lines of a docstring (or any triple-quoted string) on lines of its own.
fn skippable(lines: &[&str]) -> Vec<bool> {
    let mut inside = false;
    lines
        .iter()
        .map(|l| {
            let t = l.trim();
            let triple = t.matches("\"\"\"").count() + t.matches("'''").count();
            let was_inside = inside;
            if triple % 2 == 1 {
                inside = !inside;
            }
            was_inside
                || triple > 0 && (t.starts_with("\"\"\"") || t.starts_with("'''") || t.starts_with("r\"\"\""))
                || t.starts_with('#')
                || t.starts_with("//")
                || t.starts_with("/*")
                || t.starts_with("* ")
                || t == "*/"
        })
        .collect()
}

/// The first and last line (0-based, inclusive) of the one place where `search` matches
/// tolerantly: its non-blank lines in order, each equal to a file line once normalised, with
/// the file's blank lines and skippable lines between them stepped over.
fn locate(content: &str, search: &str, quotes: bool) -> Result<(usize, usize), Refused> {
    let file: Vec<&str> = content.lines().collect();
    let skip = skippable(&file);
    let norm: Vec<String> = file.iter().map(|l| normalised(l, quotes)).collect();
    let wanted: Vec<String> = search
        .lines()
        .map(|l| normalised(l, quotes))
        .filter(|l| !l.is_empty())
        .collect();
    if wanted.is_empty() {
        return Err(Refused::EmptySearch);
    }
    let mut found = Vec::new();
    for start in 0..file.len() {
        if norm[start] != wanted[0] {
            continue;
        }
        let mut at = start + 1;
        let mut last = start;
        let mut ok = true;
        for w in &wanted[1..] {
            loop {
                if at >= file.len() {
                    ok = false;
                    break;
                }
                if norm[at] == *w {
                    last = at;
                    at += 1;
                    break;
                }
                if norm[at].is_empty() || skip[at] {
                    at += 1;
                    continue;
                }
                ok = false;
                break;
            }
            if !ok {
                break;
            }
        }
        if ok {
            found.push((start, last));
        }
    }
    match found.as_slice() {
        [] => Err(Refused::Absent),
        [one] => Ok(*one),
        many => Err(Refused::Ambiguous(many.iter().map(|(s, _)| s + 1).collect())),
    }
}

/// What applying a reply's blocks came to: the files as they now are, and each block's fate.
#[derive(Debug, Default)]
pub struct Applied {
    pub files: Vec<FileWrite>,
    /// One line per block: "block 1 (library.py): exact", "block 2 (library.py): refused: ...".
    pub notes: Vec<String>,
    pub refused: usize,
}

/// Apply `blocks` in order to the files they name, starting from `current` (path → content;
/// a path not in it does not exist, and only an empty SEARCH may create it).
pub fn apply_all(blocks: &[EditBlock], current: &dyn Fn(&str) -> Option<String>) -> Applied {
    let mut out = Applied::default();
    let mut files: Vec<FileWrite> = Vec::new();
    for (n, b) in blocks.iter().enumerate() {
        let label = format!("block {} ({})", n + 1, b.path);
        let now = files
            .iter()
            .find(|f| f.path == b.path)
            .map(|f| f.content.clone())
            .or_else(|| current(&b.path));
        let result = match now {
            None if b.search.trim().is_empty() => Ok((b.replace.clone(), Located::Exact)),
            None => {
                out.refused += 1;
                out.notes.push(format!("{label}: refused: there is no such file"));
                continue;
            }
            Some(text) => apply(&b.path, &text, &b.search, &b.replace),
        };
        match result {
            Ok((content, how)) => {
                out.notes.push(format!(
                    "{label}: {}",
                    match how {
                        Located::Exact => "applied (exact match)",
                        Located::Tolerant => "applied (tolerant match)",
                    }
                ));
                files.retain(|f| f.path != b.path);
                files.push(FileWrite {
                    path: b.path.clone(),
                    content,
                });
            }
            Err(why) => {
                out.refused += 1;
                out.notes.push(format!("{label}: refused: {why}"));
            }
        }
    }
    out.files = files;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "\"\"\"Late fees.\"\"\"\n\n\ndef days_late(due, returned):\n    \"\"\"Whole days after the due date.\"\"\"\n    return max((returned - due).days + 1, 0)\n\n\ndef late_fee(due, returned, member=False):\n    fee = min(days_late(due, returned) * 25, 1000)\n    if member:\n        fee = fee / 2\n    return fee\n";

    fn one(path: &str) -> Vec<String> {
        vec![path.to_string()]
    }

    #[test]
    fn blocks_are_read_with_their_file_and_cut_off_ones_are_an_error() {
        let reply = "The fix:\n\n```python\nlibrary.py\n<<<<<<< SEARCH\n        fee = fee / 2\n=======\n        fee = fee // 2\n>>>>>>> REPLACE\n```\n\n<<<<<<< SEARCH\n    return max((returned - due).days + 1, 0)\n=======\n    return max((returned - due).days, 0)\n>>>>>>> REPLACE\n";
        let shown = vec!["library.py".to_string(), "other.py".to_string()];
        let blocks = parse(reply, &shown).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].path, "library.py");
        assert_eq!(blocks[0].search, "        fee = fee / 2\n");
        assert_eq!(blocks[0].replace, "        fee = fee // 2\n");
        assert_eq!(blocks[1].path, "library.py", "the file of the block before");
        let cut = "<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n";
        assert!(parse(cut, &one("a.py")).unwrap_err().contains("cut off"));
        assert!(parse("no blocks here", &one("a.py")).unwrap().is_empty());
        let unnamed = "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n";
        assert!(parse(unnamed, &shown).unwrap_err().contains("names no file"));
        assert_eq!(parse(unnamed, &one("a.py")).unwrap()[0].path, "a.py");
    }

    #[test]
    fn an_exact_match_is_applied_as_it_is() {
        let (out, how) = apply(
            "library.py",
            LIB,
            "        fee = fee / 2\n",
            "        fee = fee // 2\n",
        )
        .unwrap();
        assert_eq!(how, Located::Exact);
        assert_eq!(out, LIB.replace("fee / 2", "fee // 2"));
    }

    #[test]
    fn a_tolerant_match_locates_despite_whitespace_quotes_and_a_dropped_docstring_line() {
        // Indentation lost, the docstring line left out, and the replacement is written verbatim.
        let search = "def days_late(due, returned):\n  return max((returned - due).days + 1, 0)\n";
        let replace = "def days_late(due, returned):\n    return max((returned - due).days, 0)\n";
        let (out, how) = apply("library.py", LIB, search, replace).unwrap();
        assert_eq!(how, Located::Tolerant);
        assert!(out.contains(
            "\n\ndef days_late(due, returned):\n    return max((returned - due).days, 0)\n\n\ndef late_fee"
        ), "{out}");
        assert!(
            !out.contains("Whole days"),
            "the located lines are replaced whole: {out}"
        );
        // Quotes: the same string in Python, not in Rust.
        let py = "x = {'a': 1}\ny = 2\n";
        let (out, how) = apply("a.py", py, "x = {\"a\": 1}\n", "x = {\"a\": 3}\n").unwrap();
        assert_eq!(
            (out.as_str(), how),
            ("x = {\"a\": 3}\ny = 2\n", Located::Tolerant)
        );
        let rs = "let c = 'a';\n";
        assert_eq!(
            apply("a.rs", rs, "let c = \"a\";\n", "let c = 'b';\n"),
            Err(Refused::Absent)
        );
    }

    #[test]
    fn an_ambiguous_or_absent_search_is_refused() {
        let twice = "def a():\n    return 1\n\n\ndef b():\n    return 1\n";
        assert_eq!(
            apply("m.py", twice, "    return 1\n", "    return 2\n"),
            Err(Refused::Ambiguous(vec![2, 6]))
        );
        // Tolerantly twice, exactly not at all: still a guess.
        assert_eq!(
            apply("m.py", twice, "return  1\n", "return 2\n"),
            Err(Refused::Ambiguous(vec![2, 6]))
        );
        assert_eq!(
            apply("m.py", twice, "return 3\n", "return 2\n"),
            Err(Refused::Absent)
        );
        assert_eq!(apply("m.py", twice, "\n", "x\n"), Err(Refused::EmptySearch));
    }

    #[test]
    fn apply_all_keeps_the_blocks_that_apply_and_counts_the_refused() {
        let blocks = vec![
            EditBlock {
                path: "library.py".into(),
                search: "fee = fee / 2\n".into(),
                replace: "        fee = fee // 2\n".into(),
            },
            EditBlock {
                path: "library.py".into(),
                search: "return nothing\n".into(),
                replace: "x\n".into(),
            },
            EditBlock {
                path: "new.py".into(),
                search: String::new(),
                replace: "Y = 1\n".into(),
            },
        ];
        let applied = apply_all(&blocks, &|p| (p == "library.py").then(|| LIB.to_string()));
        assert_eq!(applied.refused, 1);
        assert_eq!(applied.files.len(), 2);
        assert!(
            applied.files[0].content.contains("\n        fee = fee // 2\n"),
            "{:?}",
            applied.files
        );
        assert!(
            !applied.files[0].content.contains("          fee"),
            "whole lines replaced: {:?}",
            applied.files
        );
        assert_eq!(applied.files[1].content, "Y = 1\n");
        assert!(
            applied.notes[1].contains("refused: its SEARCH text is not in the file"),
            "{:?}",
            applied.notes
        );
    }
}
