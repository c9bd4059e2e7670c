//! Which ecosystems a project is, and which test commands apply to it, from its root manifests.
//!
//! The rule that keeps a verdict honest: **the ecosystems of a project are those of its root
//! manifests**. A test file deeper down adds nothing (a Rust crate's `scripts/test_release.py`
//! must not make pytest the judge of the crate). Python is the one ecosystem that can also be
//! recognised by its tests alone — test files at the root or under `tests/` — and only when no
//! other root manifest claims the project.
//!
//! A command is *applicable* when it can run: `cargo test` for a root `Cargo.toml`, `go test
//! ./...` for `go.mod`, `npm test` when `package.json` has a real `test` script (not npm's
//! placeholder), `make test` when the Makefile has that target, pytest for Python with test
//! files. All applicable commands run; the verdict is PASS only if every one passes.
//!
//! This reads the project on the host, before any sandbox exists, so it treats the repository
//! as hostile data: only regular files are opened (a link is followed only when it stays
//! inside the project), every read is bounded, and directory walks stop at a fixed count.

use std::path::Path;

use serde::Serialize;

use super::{PYTEST, is_python_test, skipped_dirs};
use crate::hostfs::hostscan::git::read_small;

/// Entries looked at in one walk (the root, `tests/`, the search for Python tests): enough for
/// any real layout, and a bound on a hostile one.
const MAX_WALK_ENTRIES: usize = 20_000;

/// npm's own placeholder `test` script (`npm init`): it fails on purpose, so it is no test
/// command.
const NPM_PLACEHOLDER: &str = "no test specified";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    Rust,
    Go,
    Node,
    Python,
}

impl Ecosystem {
    /// The agentbox image for it (`crate::sandbox::image::KnownImage::sandbox_named`).
    pub fn image_name(self) -> &'static str {
        match self {
            Ecosystem::Rust => "rust",
            Ecosystem::Go => "go",
            Ecosystem::Node => "node",
            Ecosystem::Python => "python",
        }
    }
}

/// The image for a project of several ecosystems.
pub const POLYGLOT: &str = "polyglot";

/// An applicable test command and the files it was chosen from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TestCommand {
    pub command: String,
    /// Project paths, e.g. `["Cargo.toml"]` or `["pyproject.toml", "tests/test_app.py"]`.
    pub based_on: Vec<String>,
}

/// What detection found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Detection {
    /// Each ecosystem with the root files that make the project one.
    pub ecosystems: Vec<(Ecosystem, Vec<String>)>,
    pub commands: Vec<TestCommand>,
    /// What was looked at and left out, and why (for the user, not the verdict).
    pub notes: Vec<String>,
}

impl Detection {
    /// The agentbox image name for this project (`None`: nothing recognised), and why.
    pub fn image(&self) -> Option<(&'static str, String)> {
        let evidence = || {
            self.ecosystems
                .iter()
                .map(|(_, files)| files.first().cloned().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.ecosystems.as_slice() {
            [] => None,
            [(one, _)] => Some((one.image_name(), evidence())),
            _ => Some((POLYGLOT, evidence())),
        }
    }

    pub fn command_lines(&self) -> Vec<String> {
        self.commands.iter().map(|c| c.command.clone()).collect()
    }
}

/// A root entry: its name and whether it is a directory (links are not followed).
struct Entry {
    name: String,
    is_dir: bool,
}

fn entries(dir: &Path) -> Vec<Entry> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.flatten()
        .take(MAX_WALK_ENTRIES)
        .map(|e| Entry {
            name: e.file_name().to_string_lossy().into_owned(),
            is_dir: e.file_type().is_ok_and(|t| t.is_dir()),
        })
        .collect()
}

/// A file of the project, read on the host: a regular file, or a link that resolves to one
/// inside the project. `Err` says why it was not read.
pub(crate) fn read_project_file(root: &Path, rel: &str) -> Result<Vec<u8>, &'static str> {
    let path = root.join(rel);
    let meta = path.symlink_metadata().map_err(|_| "it cannot be read")?;
    let real = if meta.file_type().is_symlink() {
        let real = path.canonicalize().map_err(|_| "it is a dangling link")?;
        let root = root.canonicalize().map_err(|_| "it cannot be read")?;
        if !real.starts_with(&root) {
            return Err("it is a link that leads out of the project");
        }
        real
    } else {
        path
    };
    read_small(&real).ok_or("it is not a regular file of at most 1 MiB")
}

/// Python test files under `dir` (relative to `root`), walking at most [`MAX_WALK_ENTRIES`]
/// entries, skipping caches, dependencies and build output, following no link.
fn python_tests_under(root: &Path, dir: &str, limit: usize) -> Vec<String> {
    let skipped: Vec<&str> = skipped_dirs().collect();
    let mut found = Vec::new();
    let mut seen = 0;
    let mut stack = vec![dir.to_string()];
    while let Some(rel) = stack.pop() {
        let Ok(read) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in read.flatten() {
            seen += 1;
            if seen > MAX_WALK_ENTRIES || found.len() >= limit {
                return found;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            match entry.file_type() {
                Ok(t) if t.is_dir() && !skipped.contains(&name.as_str()) => stack.push(path),
                Ok(t) if t.is_file() && is_python_test(&name) => found.push(path),
                _ => {}
            }
        }
    }
    found.sort();
    found
}

/// Files whose presence at the root makes a project a Python one.
fn is_python_manifest(name: &str) -> bool {
    matches!(
        name,
        "pyproject.toml" | "setup.py" | "setup.cfg" | "Pipfile" | "pytest.ini" | "tox.ini"
    ) || (name.starts_with("requirements") && name.ends_with(".txt"))
}

const MAKEFILES: &[&str] = &["GNUmakefile", "makefile", "Makefile"];

/// Detect from the project directory on the host.
pub fn detect(root: &Path) -> Detection {
    let root_entries = entries(root);
    let file_at_root = |name: &str| root_entries.iter().any(|e| e.name == name && !e.is_dir);
    let mut d = Detection::default();

    if file_at_root("Cargo.toml") {
        d.ecosystems.push((Ecosystem::Rust, vec!["Cargo.toml".into()]));
        d.commands.push(TestCommand {
            command: "cargo test".into(),
            based_on: vec!["Cargo.toml".into()],
        });
    }
    if file_at_root("go.mod") {
        d.ecosystems.push((Ecosystem::Go, vec!["go.mod".into()]));
        d.commands.push(TestCommand {
            command: "go test ./...".into(),
            based_on: vec!["go.mod".into()],
        });
    }
    if file_at_root("package.json") {
        d.ecosystems.push((Ecosystem::Node, vec!["package.json".into()]));
        match read_project_file(root, "package.json") {
            Ok(data) => match npm_test_script(&data) {
                NpmTest::Script => d.commands.push(TestCommand {
                    command: "npm test".into(),
                    based_on: vec!["package.json".into()],
                }),
                NpmTest::Placeholder => d.notes.push(
                    "package.json's test script is npm's placeholder (\"no test specified\"): npm test not run"
                        .into(),
                ),
                NpmTest::Missing => {
                    d.notes.push("package.json has no test script: npm test not run".into())
                }
                NpmTest::Unreadable(why) => {
                    // Run it anyway: npm itself will say what is wrong, and a run that cannot
                    // be judged must fail, not pass.
                    d.notes.push(format!("package.json is not valid JSON ({why}): npm test will say more"));
                    d.commands.push(TestCommand {
                        command: "npm test".into(),
                        based_on: vec!["package.json".into()],
                    });
                }
            },
            Err(why) => {
                d.notes.push(format!("package.json was not read ({why}): npm test assumed"));
                d.commands.push(TestCommand {
                    command: "npm test".into(),
                    based_on: vec!["package.json".into()],
                });
            }
        }
    }

    // Python: its own root manifests always count; test files at the root or under tests/
    // only when no other manifest claims the project.
    let manifests: Vec<String> = {
        let mut m: Vec<String> = root_entries
            .iter()
            .filter(|e| !e.is_dir && is_python_manifest(&e.name))
            .map(|e| e.name.clone())
            .collect();
        m.sort();
        m
    };
    let claimed = !d.ecosystems.is_empty();
    let shallow_tests = || {
        let mut t: Vec<String> = root_entries
            .iter()
            .filter(|e| !e.is_dir && is_python_test(&e.name))
            .map(|e| e.name.clone())
            .collect();
        t.sort();
        if root_entries.iter().any(|e| e.name == "tests" && e.is_dir) {
            t.extend(python_tests_under(root, "tests", 3));
        }
        t
    };
    if !manifests.is_empty() {
        // A manifest without a single test file anywhere gives pytest nothing to collect (exit
        // 5): a Rust extension's pyproject.toml is no Python test suite.
        let tests = python_tests_under(root, "", 3);
        d.ecosystems.push((Ecosystem::Python, manifests.clone()));
        if tests.is_empty() && !manifests.iter().any(|m| m == "pytest.ini") {
            d.notes.push(format!(
                "{} but no Python test files: pytest not run",
                manifests.join(", ")
            ));
        } else {
            d.commands.push(TestCommand {
                command: PYTEST.into(),
                based_on: manifests.iter().cloned().chain(tests).collect(),
            });
        }
    } else {
        let tests = shallow_tests();
        if !tests.is_empty() && claimed {
            let claimants: Vec<String> = d.ecosystems.iter().flat_map(|(_, f)| f.clone()).collect();
            d.notes.push(format!(
                "Python test files ({}) but no Python manifest, and {} claims the project: pytest not run",
                tests.join(", "),
                claimants.join(", ")
            ));
        } else if !tests.is_empty() {
            d.ecosystems.push((Ecosystem::Python, tests.clone()));
            d.commands.push(TestCommand {
                command: PYTEST.into(),
                based_on: tests,
            });
        }
    }

    if let Some(makefile) = MAKEFILES.iter().find(|m| file_at_root(m)) {
        match read_project_file(root, makefile) {
            Ok(data) if has_make_target(&String::from_utf8_lossy(&data), "test") => {
                d.commands.push(TestCommand {
                    command: "make test".into(),
                    based_on: vec![makefile.to_string()],
                })
            }
            Ok(_) => d
                .notes
                .push(format!("{makefile} has no `test` target: make test not run")),
            Err(why) => d
                .notes
                .push(format!("{makefile} was not read ({why}): make test not run")),
        }
    }
    d
}

#[derive(Debug, PartialEq, Eq)]
enum NpmTest {
    Script,
    Placeholder,
    Missing,
    Unreadable(String),
}

fn npm_test_script(data: &[u8]) -> NpmTest {
    let value: serde_json::Value = match serde_json::from_slice(data) {
        Ok(v) => v,
        Err(e) => return NpmTest::Unreadable(e.to_string()),
    };
    match value.pointer("/scripts/test").and_then(|t| t.as_str()) {
        None => NpmTest::Missing,
        Some(s) if s.trim().is_empty() => NpmTest::Missing,
        Some(s) if s.contains(NPM_PLACEHOLDER) => NpmTest::Placeholder,
        Some(_) => NpmTest::Script,
    }
}

/// Whether a Makefile defines `target` as a rule target (`test:`, `test::`, `check test: x`),
/// not as a variable (`test := 1`) or only as a prerequisite. Recipe lines, comments and
/// `define` blocks are skipped; continuation lines are joined.
pub fn has_make_target(makefile: &str, target: &str) -> bool {
    let mut in_define = false;
    let mut logical = String::new();
    for raw in makefile.lines() {
        if raw.starts_with('\t') && logical.is_empty() {
            continue;
        }
        if let Some(cont) = raw.strip_suffix('\\') {
            logical.push_str(cont);
            logical.push(' ');
            continue;
        }
        logical.push_str(raw);
        let line = std::mem::take(&mut logical);
        let line = line.split('#').next().unwrap_or_default().trim();
        let first = line.split_whitespace().next().unwrap_or_default();
        if first == "define" {
            in_define = true;
            continue;
        }
        if in_define {
            in_define = first != "endef";
            continue;
        }
        let Some(colon) = line.find(':') else { continue };
        let (targets, rest) = line.split_at(colon);
        // `X := y`, `X ::= y`, `X = a:b`: assignments, not rules.
        if rest.starts_with(":=")
            || rest.starts_with("::=")
            || rest.starts_with(":::=")
            || targets.contains('=')
        {
            continue;
        }
        if targets.split_whitespace().any(|t| t == target) {
            return true;
        }
    }
    false
}

/// The image named by the project's dev container configuration, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devcontainer {
    /// `.devcontainer/devcontainer.json` or `.devcontainer.json`.
    pub file: String,
    /// Its `image`; `None` when it builds one instead (agentbox builds nothing from a
    /// repository) or the file cannot be read.
    pub image: Option<String>,
    /// Why no image was taken from it, when none was.
    pub note: Option<String>,
}

pub fn devcontainer(root: &Path) -> Option<Devcontainer> {
    for file in [".devcontainer/devcontainer.json", ".devcontainer.json"] {
        if root.join(file).symlink_metadata().is_err() {
            continue;
        }
        let data = match read_project_file(root, file) {
            Ok(d) => d,
            Err(why) => {
                return Some(Devcontainer {
                    file: file.into(),
                    image: None,
                    note: Some(format!("{file} was not read ({why})")),
                });
            }
        };
        let text = strip_jsonc(&String::from_utf8_lossy(&data));
        let value: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                return Some(Devcontainer {
                    file: file.into(),
                    image: None,
                    note: Some(format!("{file} is not valid JSON ({e})")),
                });
            }
        };
        let image = value
            .get("image")
            .and_then(|v| v.as_str())
            .map(str::trim)
            .filter(|s| !s.is_empty() && image_name_ok(s));
        let note = image.is_none().then(|| {
            if value.get("build").is_some() || value.get("dockerFile").is_some() {
                format!("{file} builds its image from a Dockerfile; agentbox builds nothing a repository describes")
            } else {
                format!("{file} names no image")
            }
        });
        return Some(Devcontainer {
            file: file.into(),
            image: image.map(String::from),
            note,
        });
    }
    None
}

/// An image reference as Docker writes them: no spaces, no control characters, not too long.
fn image_name_ok(s: &str) -> bool {
    s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c))
}

/// JSON with comments (`//`, `/* */`) and trailing commas, as dev container files are written,
/// made plain JSON: comments go first, then the commas they may have hidden.
pub fn strip_jsonc(text: &str) -> String {
    let no_comments = rewrite_outside_strings(text.as_bytes(), |b, i, out| match b[i] {
        b'/' if b.get(i + 1) == Some(&b'/') => {
            let mut j = i;
            while j < b.len() && b[j] != b'\n' {
                j += 1;
            }
            j
        }
        b'/' if b.get(i + 1) == Some(&b'*') => {
            let mut j = i + 2;
            while j < b.len() && !(b[j] == b'*' && b.get(j + 1) == Some(&b'/')) {
                j += 1;
            }
            (j + 2).min(b.len())
        }
        c => {
            out.push(c);
            i + 1
        }
    });
    let plain = rewrite_outside_strings(&no_comments, |b, i, out| {
        let next = b[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
        if !(b[i] == b',' && matches!(next, Some(b'}') | Some(b']'))) {
            out.push(b[i]);
        }
        i + 1
    });
    String::from_utf8_lossy(&plain).into_owned()
}

/// Copies `b`, strings (`"..."`, escapes honoured) as they are; everything else goes through
/// `step`, which writes what it keeps and returns where to go on.
fn rewrite_outside_strings(b: &[u8], step: impl Fn(&[u8], usize, &mut Vec<u8>) -> usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            out.extend_from_slice(&b[start..i]);
        } else {
            i = step(b, i, &mut out);
        }
    }
    out
}

/// How to check, inside the sandbox, that a test command can start: the program it needs, as
/// shown to the user, and a `sh` command that succeeds only if it is there. `None` when the
/// command starts with shell syntax that cannot be checked this simply.
pub fn program_check(command: &str) -> Option<(String, String)> {
    let mut words = command
        .split_whitespace()
        .skip_while(|w| is_assignment(w))
        .peekable();
    let first = *words.peek()?;
    if !first
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._/+-".contains(c))
    {
        return None;
    }
    let mut rest = words.skip(1);
    if first.starts_with("python") && rest.next() == Some("-m") {
        let module = rest.next()?;
        if module
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            // Found, not imported: importing pytest costs more than the rest of the preflight.
            return Some((
                format!("{first} with the module {module}"),
                format!(
                    "command -v {first} >/dev/null 2>&1 && {first} -c 'import importlib.util, sys; \
                     sys.exit(importlib.util.find_spec(\"{module}\") is None)' >/dev/null 2>&1"
                ),
            ));
        }
    }
    Some((first.to_string(), format!("command -v {first} >/dev/null 2>&1")))
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Tests' project directories.
#[cfg(test)]
pub(crate) fn project(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for (path, body) in files {
        let full = dir.path().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, body).unwrap();
    }
    let path = dir.path().to_path_buf();
    (dir, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(files: &[(&str, &str)]) -> Vec<String> {
        let (_d, root) = project(files);
        detect(&root).command_lines()
    }

    const CARGO: (&str, &str) = ("Cargo.toml", "[package]\nname = \"x\"\n");

    #[test]
    fn a_stray_test_script_does_not_make_a_crate_a_python_project() {
        let files = [
            CARGO,
            ("src/lib.rs", "#[test] fn t() { assert!(false) }"),
            ("scripts/test_release.py", "def test_ok(): pass"),
        ];
        let (_d, root) = project(&files);
        let d = detect(&root);
        assert_eq!(d.command_lines(), ["cargo test"]);
        assert_eq!(d.image(), Some(("rust", "Cargo.toml".into())));
        // Even at the root or in tests/: Cargo.toml claims the project.
        assert_eq!(
            commands(&[CARGO, ("test_x.py", ""), ("tests/test_y.py", "")]),
            ["cargo test"]
        );
        let (_d, root) = project(&[CARGO, ("tests/test_y.py", "")]);
        assert!(
            detect(&root).notes[0].contains("tests/test_y.py"),
            "{:?}",
            detect(&root).notes
        );
    }

    #[test]
    fn python_counts_by_its_manifest_or_its_tests_at_the_root_or_in_tests() {
        assert_eq!(commands(&[("app.py", ""), ("test_app.py", "")]), [PYTEST]);
        assert_eq!(
            commands(&[("app.py", ""), ("tests/unit/test_app.py", "")]),
            [PYTEST]
        );
        assert_eq!(
            commands(&[("lib/x_test.py", "")]),
            Vec::<String>::new(),
            "deeper down: not by tests alone"
        );
        assert_eq!(
            commands(&[("pyproject.toml", ""), ("src/pkg/tests/test_a.py", "")]),
            [PYTEST],
            "with a manifest, tests anywhere count"
        );
        assert_eq!(
            commands(&[("requirements-dev.txt", ""), ("tests/test_a.py", "")]),
            [PYTEST]
        );
        // A manifest and no test anywhere: pytest would collect nothing.
        let (_d, root) = project(&[CARGO, ("pyproject.toml", "[build-system]\n")]);
        let d = detect(&root);
        assert_eq!(d.command_lines(), ["cargo test"]);
        assert_eq!(d.image().unwrap().0, POLYGLOT);
        // Caches and environments are not searched.
        assert!(commands(&[("setup.py", ""), (".venv/lib/test_x.py", "")]).is_empty());
    }

    #[test]
    fn a_crate_with_a_python_manifest_runs_both_and_is_polyglot() {
        let (_d, root) = project(&[CARGO, ("pyproject.toml", ""), ("tests/test_a.py", "")]);
        let d = detect(&root);
        assert_eq!(d.command_lines(), ["cargo test", PYTEST]);
        assert_eq!(d.commands[1].based_on, ["pyproject.toml", "tests/test_a.py"]);
        assert_eq!(d.image(), Some((POLYGLOT, "Cargo.toml, pyproject.toml".into())));
    }

    #[test]
    fn npm_test_only_for_a_real_test_script() {
        let placeholder = r#"{"scripts": {"test": "echo \"Error: no test specified\" && exit 1"}}"#;
        assert!(commands(&[("package.json", placeholder)]).is_empty());
        assert!(commands(&[("package.json", r#"{"name": "x"}"#)]).is_empty());
        assert!(commands(&[("package.json", r#"{"scripts": {"test": "  "}}"#)]).is_empty());
        assert_eq!(
            commands(&[("package.json", r#"{"scripts": {"test": "node --test"}}"#)]),
            ["npm test"]
        );
        // Unreadable: run it, so that npm says what is wrong and the verdict fails.
        assert_eq!(commands(&[("package.json", "{oops")]), ["npm test"]);
        let (_d, root) = project(&[("package.json", placeholder)]);
        let d = detect(&root);
        assert_eq!(d.image(), Some(("node", "package.json".into())));
        assert!(d.notes[0].contains("placeholder"), "{:?}", d.notes);
    }

    #[test]
    fn makefile_targets() {
        assert!(has_make_target("test:\n\tpytest\n", "test"));
        assert!(has_make_target(
            "all: build\n\ncheck test: build\n\tgo test\n",
            "test"
        ));
        assert!(has_make_target("test::\n\ttrue\n", "test"));
        assert!(has_make_target("lint \\\n  test: x\n", "test"));
        assert!(!has_make_target("test := 1\nTEST = a:b\n", "test"));
        assert!(
            !has_make_target(".PHONY: test\nall: test\n", "test"),
            "a prerequisite only"
        );
        assert!(!has_make_target("# test: old\nbuild:\n\techo test: no\n", "test"));
        assert!(!has_make_target("define T\ntest:\nendef\n", "test"));
        assert!(!has_make_target("testing:\n\ttrue\n", "test"));
        assert_eq!(
            commands(&[("Makefile", "test:\n\tcc t.c && ./a.out\n")]),
            ["make test"]
        );
        assert!(commands(&[("Makefile", "all:\n\tcc t.c\n")]).is_empty());
        assert_eq!(
            commands(&[("go.mod", "module x\n"), ("Makefile", "test:\n\tgo vet\n")]),
            ["go test ./...", "make test"]
        );
    }

    #[test]
    fn nothing_recognised_is_no_image_and_no_command() {
        let (_d, root) = project(&[("README.md", "hi")]);
        let d = detect(&root);
        assert_eq!((d.image(), d.commands.len()), (None, 0));
    }

    #[test]
    fn links_are_read_only_inside_the_project() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("p.json"), r#"{"scripts": {"test": "x"}}"#).unwrap();
        let (_d, root) = project(&[("real.json", r#"{"scripts": {"test": "jest"}}"#)]);
        std::os::unix::fs::symlink("real.json", root.join("package.json")).unwrap();
        assert_eq!(read_project_file(&root, "package.json").unwrap().len(), 29);
        std::fs::remove_file(root.join("package.json")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("p.json"), root.join("package.json")).unwrap();
        assert_eq!(
            read_project_file(&root, "package.json"),
            Err("it is a link that leads out of the project")
        );
    }

    #[test]
    fn devcontainer_image_with_comments_and_trailing_commas() {
        let jsonc = "// dev\n{\n  /* the image */ \"image\": \"mcr.example/devcontainers/rust:1\", // pinned\n  \"features\": {\"a\": [1, 2,],},\n}\n";
        let (_d, root) = project(&[(".devcontainer/devcontainer.json", jsonc)]);
        let dc = devcontainer(&root).unwrap();
        assert_eq!(dc.image.as_deref(), Some("mcr.example/devcontainers/rust:1"));
        let (_d, root) = project(&[(".devcontainer.json", r#"{"build": {"dockerfile": "Dockerfile"}}"#)]);
        let dc = devcontainer(&root).unwrap();
        assert_eq!(dc.image, None);
        assert!(dc.note.unwrap().contains("builds its image"));
        let (_d, root) = project(&[(".devcontainer.json", r#"{"image": "x; rm -rf /"}"#)]);
        assert_eq!(devcontainer(&root).unwrap().image, None);
        assert_eq!(
            strip_jsonc(r#"{"a": "// not a comment, ]"}"#),
            r#"{"a": "// not a comment, ]"}"#
        );
        // A comment between the last comma and the brace still leaves the comma trailing.
        assert_eq!(
            strip_jsonc("{\n  \"image\": \"x:1\", // pinned\n  /* more */\n}\n")
                .replace(char::is_whitespace, ""),
            r#"{"image":"x:1"}"#
        );
        assert!(devcontainer(&project(&[]).1).is_none());
    }

    #[test]
    fn the_program_a_test_command_needs() {
        assert_eq!(program_check("cargo test").unwrap().0, "cargo");
        assert_eq!(
            program_check("RUST_BACKTRACE=1 cargo test --all").unwrap().0,
            "cargo"
        );
        let (shown, check) = program_check(PYTEST).unwrap();
        assert_eq!(shown, "python3 with the module pytest");
        assert!(check.contains("find_spec(\"pytest\")"), "{check}");
        assert_eq!(program_check("./run-tests.sh").unwrap().0, "./run-tests.sh");
        assert_eq!(program_check("(cd x && make)"), None);
        assert_eq!(program_check("$(which go) test"), None);
        assert_eq!(program_check(""), None);
    }
}
