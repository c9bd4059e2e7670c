//! What agentbox knows about projects, in one place: which directories are caches and build
//! output, which files are tests (for `--protect-tests`, priming and eval's "tests unchanged"),
//! and which command runs the tests.

/// Caches that tools rewrite at will: left out of the change snapshot and never brought back
/// out of an isolated sandbox; nor listed or searched (`skipped_dirs`).
pub const CACHE_DIRS: &[&str] = &[
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
];

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

/// A Python test module by pytest's default discovery rules, or its shared fixtures.
fn is_python_test(name: &str) -> bool {
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
        .any(|d| d == "tests" || d == "test" || d == "__tests__");
    let by_name = is_python_test(name)
        || name.ends_with("_test.go")
        || [
            ".test.js",
            ".test.ts",
            ".spec.js",
            ".spec.ts",
            ".test.jsx",
            ".test.tsx",
        ]
        .iter()
        .any(|s| name.ends_with(s));
    in_test_dir || by_name || extra.iter().any(|g| glob_match(g, path))
}

/// pytest without its cache directory, so a run leaves no `.pytest_cache` in the project.
pub const PYTEST: &str = "python3 -m pytest -q --tb=short -p no:cacheprovider";

/// The test command for a project with these files (paths relative to its root).
pub fn test_command(files: &[String]) -> Option<String> {
    let at_root = |n: &str| files.iter().any(|p| p == n);
    let python_tests = files
        .iter()
        .any(|p| is_python_test(p.rsplit('/').next().unwrap_or(p)));
    if python_tests || at_root("pytest.ini") {
        return Some(PYTEST.into());
    }
    if at_root("Cargo.toml") {
        return Some("cargo test".into());
    }
    if at_root("go.mod") {
        return Some("go test ./...".into());
    }
    if at_root("package.json") {
        return Some("npm test".into());
    }
    if at_root("Makefile") {
        return Some("make test".into());
    }
    None
}

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
        ] {
            assert!(is_test_file(p, &[]), "{p}");
        }
        for p in ["app.py", "testing.py", "contest.py", "src/latest.py"] {
            assert!(!is_test_file(p, &[]), "{p}");
        }
        assert!(is_test_file("spec/models/user.rb", &["spec/**".to_string()]));
    }

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn detects_common_layouts() {
        assert_eq!(
            test_command(&files(&["app.py", "tests/test_app.py"])).as_deref(),
            Some(PYTEST)
        );
        assert_eq!(test_command(&files(&["lib/x_test.py"])).as_deref(), Some(PYTEST));
        assert_eq!(
            test_command(&files(&["Cargo.toml", "src/lib.rs"])).as_deref(),
            Some("cargo test")
        );
        assert_eq!(
            test_command(&files(&["package.json"])).as_deref(),
            Some("npm test")
        );
        assert_eq!(test_command(&files(&["README.md", "notes.txt"])), None);
    }
}
