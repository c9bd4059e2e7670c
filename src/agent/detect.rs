//! Which command runs the project's tests, decided from its file names (listed through the
//! sandbox).

/// pytest without its cache directory, so a run leaves no `.pytest_cache` in the project.
pub const PYTEST: &str = "python3 -m pytest -q --tb=short -p no:cacheprovider";

/// The test command for a project with these files (paths relative to its root).
pub fn test_command(files: &[String]) -> Option<String> {
    let name = |p: &String| p.rsplit('/').next().unwrap_or(p).to_string();
    let at_root = |n: &str| files.iter().any(|p| p == n);
    let python_tests = files.iter().any(|p| {
        let n = name(p);
        n.ends_with(".py") && (n.starts_with("test_") || n.ends_with("_test.py") || n == "conftest.py")
    });
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
