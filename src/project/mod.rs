//! What agentbox knows about projects, in one place: which directories are caches and build
//! output, which files and which code are tests (for `--protect-tests`, priming and eval's
//! "tests unchanged"), which ecosystems a project is and which commands run its tests
//! ([`detect`]), and which image suits it.
//!
//! What counts as a test, per ecosystem (the book's docs/src/projects/detection.md, "What counts as a test", says the same):
//! - Python: `test_*.py`, `*_test.py`, `conftest.py`;
//! - Go: `*_test.go`, and anything under `testdata/`;
//! - JavaScript/TypeScript: `*.test.*` and `*.spec.*` (`js`, `ts`, `jsx`, `tsx`, `mjs`, `cjs`),
//!   and anything under `__tests__/`;
//! - Rust: anything under `tests/`, a `tests.rs` (the usual file of `#[cfg(test)] mod tests;`),
//!   and the test code inside any `.rs` source (see [`rust`]); benches are not tests (`cargo
//!   test` does not run them);
//! - every ecosystem: anything under a `tests/` or `test/` directory, and a task's own
//!   `test_files` patterns;
//! - and the test configuration, which is test code too: [`test_config`] lists it.

pub mod cache_key;
pub mod declared;
pub mod defs;
pub mod detect;
pub mod ini;
pub mod node;
pub mod python;
pub mod results;
pub mod rust;
pub mod services;
pub mod setup;
pub mod test_config;

pub use detect::{
    Detection, Devcontainer, Ecosystem, POLYGLOT, TestCommand, detect, devcontainer, program_check,
};

/// Caches that tools rewrite at will (defined where `--isolate` leaves them out).
pub use crate::hostfs::isolate::CACHE_DIRS;

/// Besides `.git` and the caches: environments, dependencies, build output, editor state.
const OTHER_SKIPPED_DIRS: &[&str] = &[
    ".venv",
    "venv",
    "node_modules",
    "target",
    "dist",
    "build",
    ".eggs",
    ".cache",
    ".gradle",
    ".idea",
    ".vscode",
];

/// Directories that are never worth listing or searching: VCS data, caches, build output.
pub fn skipped_dirs() -> impl Iterator<Item = &'static str> {
    std::iter::once(".git")
        .chain(CACHE_DIRS.iter().copied())
        .chain(OTHER_SKIPPED_DIRS.iter().copied())
}

/// Directories that tools fill on their own, said apart from the user's changes when a
/// command ends: the caches, and the usual dependency and build-output directories.
const TOOL_WRITTEN_DIRS: &[&str] = &[".cache", "node_modules", ".venv", "target"];

/// The cache or build-output directory `path` (relative) lies in or is, by its first such
/// component: `.pytest_cache` for `.pytest_cache/v/cache/nodeids`, `__pycache__` for
/// `pkg/__pycache__/m.pyc`.
pub fn tool_written_dir(path: &std::path::Path) -> Option<&str> {
    path.components().find_map(|c| {
        let name = c.as_os_str().to_str()?;
        CACHE_DIRS
            .iter()
            .chain(TOOL_WRITTEN_DIRS)
            .any(|d| *d == name)
            .then_some(name)
    })
}

/// A Python test module by pytest's default discovery rules, or its shared fixtures.
pub(crate) fn is_python_test(name: &str) -> bool {
    (name.starts_with("test_") && name.ends_with(".py"))
        || name.ends_with("_test.py")
        || name == "conftest.py"
}

/// `*` within a path segment, `**` across segments, `?` one character.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => {
                let rest = if p.get(2) == Some(&b'/') { &p[3..] } else { &p[2..] };
                (0..=s.len()).any(|i| (i == 0 || s[i - 1] == b'/' || rest.is_empty()) && go(rest, &s[i..]))
            }
            Some(b'*') => (0..=s.len())
                .take_while(|&i| i == 0 || s[i - 1] != b'/')
                .any(|i| go(&p[1..], &s[i..])),
            Some(b'?') => !s.is_empty() && s[0] != b'/' && go(&p[1..], &s[1..]),
            Some(c) => s.first() == Some(c) && go(&p[1..], &s[1..]),
        }
    }
    go(pattern.as_bytes(), path.as_bytes())
}

/// Is `path` (relative) a test file: by the usual names, or the task's own patterns?
pub fn is_test_file(path: &str, extra: &[String]) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let in_test_dir = path
        .split('/')
        .rev()
        .skip(1)
        .any(|d| d == "tests" || d == "test" || d == "__tests__" || d == "testdata");
    let js_test = [".test.", ".spec."].iter().any(|infix| {
        name.rsplit_once('.').is_some_and(|(stem, ext)| {
            matches!(ext, "js" | "ts" | "jsx" | "tsx" | "mjs" | "cjs") && format!("{stem}.").contains(infix)
        })
    });
    let by_name = is_python_test(name) || name.ends_with("_test.go") || name == "tests.rs" || js_test;
    in_test_dir || by_name || extra.iter().any(|g| glob_match(g, path))
}

/// What of the tests changes when `path` goes from `old` to `new` (`None`: absent), said for
/// the model and the report: the test code inside a source file (for `.rs` files, its test
/// items, see [`rust`]), or the test configuration in it ([`test_config`]); `None` when
/// neither changes. Test *files* are [`is_test_file`]'s business.
pub fn test_change(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> Option<String> {
    if path.ends_with(".rs") {
        let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
        if rust::test_code(&text(old)) != rust::test_code(&text(new)) {
            return Some(format!(
                "test code in {path} (a #[cfg(test)] module or a #[test] function)"
            ));
        }
    }
    test_config::changed(path, old, new)
}

/// Whether [`test_change`] finds a change.
pub fn test_code_changed(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> bool {
    test_change(path, old, new).is_some()
}

/// Whether `path` can hold test code or test configuration beside what [`is_test_file`]
/// names: the files worth comparing with [`test_change`].
pub fn may_hold_tests(path: &str) -> bool {
    path.ends_with(".rs") || test_config::may_hold(path)
}

/// The image a session runs, why, and what was passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageChoice {
    pub image: String,
    /// For the run's first line: `Cargo.toml`, `--image`, `.devcontainer/devcontainer.json`.
    pub reason: String,
    pub notes: Vec<String>,
}

/// Which image a session runs, in this order:
/// 1. the one the user named (`given`: the image and where it was named);
/// 2. the image of the project's dev container, if it is **already present** locally
///    (`dev_present`): agentbox never pulls an image on a repository's word;
/// 3. the agentbox image of the project's ecosystems (`polyglot` for several), resolved by
///    `known` (name → tag; `None` when this agentbox has no such image);
/// 4. `default`.
pub fn choose_image(
    given: Option<(&str, &str)>,
    detection: &Detection,
    dev: Option<&Devcontainer>,
    dev_present: bool,
    known: impl Fn(&str) -> Option<String>,
    default: &str,
) -> ImageChoice {
    let mut notes = Vec::new();
    if let Some((image, source)) = given {
        return ImageChoice {
            image: image.to_string(),
            reason: source.to_string(),
            notes,
        };
    }
    if let Some(dev) = dev {
        match &dev.image {
            Some(image) if dev_present => {
                notes.push(format!(
                    "the project's {} names the image {image}, which is present here: using it",
                    dev.file
                ));
                return ImageChoice {
                    image: image.clone(),
                    reason: format!("{}, present locally", dev.file),
                    notes,
                };
            }
            Some(image) => notes.push(format!(
                "the project's {} names the image {image}, which is not present here; agentbox never \
                 pulls an image on a repository's word (pull it yourself to use it, or pass --image)",
                dev.file
            )),
            None => notes.extend(dev.note.iter().map(|n| format!("{n}; ignored"))),
        }
    }
    let (image, reason) = match detection.image() {
        Some((name, evidence)) => match known(name) {
            Some(tag) => (tag, evidence),
            None => {
                notes.push(format!(
                    "the project looks like {name} ({evidence}), but this agentbox has no {name} image: \
                     using {default} (pass --image to choose another)"
                ));
                (
                    default.to_string(),
                    format!("{evidence}; no {name} image, the default"),
                )
            }
        },
        None => (
            default.to_string(),
            "no manifest recognised at the project's root; the default".to_string(),
        ),
    };
    ImageChoice { image, reason, notes }
}

/// pytest without its cache directory, so a run leaves no `.pytest_cache` in the project.
pub const PYTEST: &str = "python3 -m pytest -q --tb=short -p no:cacheprovider";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("spec/**", "spec/a/b.rb"));
        assert!(glob_match("**/fixtures/*.json", "x/y/fixtures/a.json"));
        assert!(glob_match("**/fixtures/*.json", "fixtures/a.json"));
        assert!(!glob_match("*.py", "a/b.py"));
        assert!(glob_match("test_?.py", "test_a.py"));
    }

    #[test]
    fn test_files_by_name_dir_and_pattern() {
        for p in [
            "test_app.py",
            "pkg/app_test.py",
            "tests/helpers.py",
            "conftest.py",
            "web/a.spec.ts",
            "x_test.go",
            "pkg/testdata/golden.txt",
            "web/a.test.mjs",
            "__tests__/a.js",
            "src/parser/tests.rs",
            "tests/it.rs",
        ] {
            assert!(is_test_file(p, &[]), "{p}");
        }
        for p in [
            "app.py",
            "testing.py",
            "contest.py",
            "src/latest.py",
            "src/lib.rs",
            "benches/b.rs",
            "a.test.json",
            "latest.js",
        ] {
            assert!(!is_test_file(p, &[]), "{p}");
        }
        assert!(is_test_file("spec/models/user.rb", &["spec/**".to_string()]));
    }

    #[test]
    fn choosing_the_image() {
        let known = |n: &str| (n != "go").then(|| format!("agentbox/{n}:9"));
        let (_d, rust) = detect::project(&[("Cargo.toml", "")]);
        let rust = detect(&rust);
        let c = choose_image(None, &rust, None, false, known, "agentbox/python:1");
        assert_eq!(
            (c.image.as_str(), c.reason.as_str()),
            ("agentbox/rust:9", "Cargo.toml")
        );
        // Given: nothing else counts.
        let c = choose_image(Some(("x:1", "--image")), &rust, None, true, known, "d");
        assert_eq!((c.image.as_str(), c.reason.as_str()), ("x:1", "--image"));
        // A dev container's image: only when present here.
        let dev = Devcontainer {
            file: ".devcontainer/devcontainer.json".into(),
            image: Some("team/dev:3".into()),
            note: None,
        };
        let c = choose_image(None, &rust, Some(&dev), true, known, "d");
        assert_eq!(c.image, "team/dev:3");
        assert_eq!(c.reason, ".devcontainer/devcontainer.json, present locally");
        let c = choose_image(None, &rust, Some(&dev), false, known, "d");
        assert_eq!(c.image, "agentbox/rust:9");
        assert!(
            c.notes[0].contains("not present here") && c.notes[0].contains("never pulls"),
            "{:?}",
            c.notes
        );
        // No image for the ecosystem in this build: the default, said.
        let (_d, go) = detect::project(&[("go.mod", "module x\n")]);
        let c = choose_image(None, &detect(&go), None, false, known, "agentbox/python:1");
        assert_eq!(c.image, "agentbox/python:1");
        assert!(c.notes[0].contains("no go image"), "{:?}", c.notes);
        let (_d, none) = detect::project(&[("README", "")]);
        let c = choose_image(None, &detect(&none), None, false, known, "agentbox/python:1");
        assert_eq!(c.image, "agentbox/python:1");
        assert!(c.reason.contains("the default"));
    }

    #[test]
    fn test_code_inside_rust_sources() {
        let before =
            b"fn f() -> u8 { 1 }\n#[cfg(test)]\nmod tests { #[test] fn t() { assert_eq!(super::f(), 2) } }\n";
        let fixed =
            b"fn f() -> u8 { 2 }\n#[cfg(test)]\nmod tests { #[test] fn t() { assert_eq!(super::f(), 2) } }\n";
        let cheated =
            b"fn f() -> u8 { 1 }\n#[cfg(test)]\nmod tests { #[test] fn t() { assert_eq!(super::f(), 1) } }\n";
        assert!(!test_code_changed("src/lib.rs", Some(before), Some(fixed)));
        assert!(test_code_changed("src/lib.rs", Some(before), Some(cheated)));
        assert!(
            test_code_changed("src/lib.rs", Some(before), None),
            "deleted with its tests"
        );
        assert!(
            test_code_changed("src/new.rs", None, Some(cheated)),
            "new test code"
        );
        assert!(!test_code_changed("src/new.rs", None, Some(b"fn g() {}")));
        assert!(
            !test_code_changed("a.py", Some(before), Some(cheated)),
            "not Rust"
        );
    }
}
