//! Test configuration is test code: what decides which tests a test command runs and how it
//! judges them can fake a verdict as surely as an edited test (`addopts = --collect-only` in a
//! `pytest.ini` makes pytest run nothing and exit 0). The list, per ecosystem, in one place
//! (the book's docs/src/projects/detection.md, "What counts as a test", says the same):
//!
//! - pytest: `pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml` (whole);
//!   `pyproject.toml`'s `[tool.pytest]` (and `[tool.pytest.ini_options]` in it); `setup.cfg`'s
//!   `[tool:pytest]`; `tox.ini`'s `[pytest]`; and what `python3 -m pytest` would import in
//!   pytest's place from the project's root (`pytest.py`, `pytest/`, `_pytest/`);
//! - Node: `package.json`'s `scripts` `test*`, `pretest` and `posttest`, and its `jest`,
//!   `mocha` and `ava` settings; `.npmrc` (its `script-shell` runs `npm test`); the runners'
//!   own files (`jest.config.*`, `vitest.config.*`, `vitest.workspace.*`, `vite.config.*`,
//!   `.mocharc.*`, `ava.config.*`, `.taprc`); anything under `node_modules/`;
//! - make: a `Makefile` (`makefile`, `GNUmakefile`) with a `test` target, whole: what `make
//!   test` does depends on its variables, prerequisites and pattern rules, not only its recipe;
//! - Rust: `Cargo.toml`'s `[[test]]` targets, the `test`, `harness` and `doctest` keys of its
//!   `[lib]`, `[[bin]]` and `[[example]]` targets, `package.autotests`, and the workspace's
//!   `members`, `default-members` and `exclude`; `.cargo/config.toml` and `.cargo/config`
//!   (whole: a target `runner` decides what runs a test binary);
//! - Go: nothing besides its test files (`go test` has no configuration file).
//!
//! A file is matched by its name wherever it is (a subproject's configuration can matter for a
//! given `--test-cmd`), except the stand-ins for pytest, which matter at the root only.

use super::detect::has_make_target;
use super::ini;

/// What kind of test configuration `path` (relative to the project root) can hold, for the
/// message; `None`: none.
fn kind(path: &str) -> Option<Kind> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let parent = path.rsplit('/').nth(1);
    let first = path.split('/').next().unwrap_or(path);
    let stem = name.split('.').next().unwrap_or(name);
    let js_config = |stems: &[&str]| {
        stems.contains(&stem)
            && name
                .rsplit_once('.')
                .is_some_and(|(_, ext)| matches!(ext, "js" | "cjs" | "mjs" | "ts" | "cts" | "mts" | "json"))
    };
    Some(match name {
        "pytest.ini" | ".pytest.ini" | "pytest.toml" | ".pytest.toml" => {
            Kind::Whole("pytest's configuration")
        }
        "pyproject.toml" => Kind::Pyproject,
        "setup.cfg" => Kind::Ini("tool:pytest"),
        "tox.ini" => Kind::Ini("pytest"),
        "package.json" => Kind::PackageJson,
        ".npmrc" => Kind::Whole("npm's configuration (its script-shell runs npm test)"),
        ".taprc" => Kind::Whole("a Node test runner's configuration"),
        "Makefile" | "makefile" | "GNUmakefile" => Kind::Makefile,
        "Cargo.toml" => Kind::CargoToml,
        "config.toml" | "config" if parent == Some(".cargo") => Kind::Whole("cargo's configuration"),
        _ if first == "node_modules" => Kind::Whole("the installed Node packages the tests run with"),
        _ if matches!(first, "pytest" | "_pytest") && path.contains('/') => {
            Kind::Whole("a stand-in for pytest (python3 -m pytest would import it)")
        }
        "pytest.py" if path == name => {
            Kind::Whole("a stand-in for pytest (python3 -m pytest would import it)")
        }
        _ if name.starts_with(".mocharc.") => Kind::Whole("mocha's configuration"),
        _ if js_config(&["jest", "vitest", "vite", "ava"])
            && (name.contains(".config.") || name.starts_with("vitest.workspace.")) =>
        {
            Kind::Whole("a Node test runner's configuration")
        }
        _ if name.starts_with("vitest.workspace.") => Kind::Whole("a Node test runner's configuration"),
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Every byte of it.
    Whole(&'static str),
    /// `[tool.pytest]`.
    Pyproject,
    /// One INI section.
    Ini(&'static str),
    PackageJson,
    Makefile,
    CargoToml,
}

/// Whether `path` can hold test configuration at all (the files worth comparing).
pub fn may_hold(path: &str) -> bool {
    kind(path).is_some()
}

/// What of the test configuration changes from `old` to `new` (`None`: absent), said for the
/// model and the report (`pytest's configuration in pyproject.toml ([tool.pytest])`); `None`
/// when nothing of it changes.
pub fn changed(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> Option<String> {
    let kind = kind(path)?;
    let (a, b) = (projection(kind, old), projection(kind, new));
    if a == b {
        return None;
    }
    Some(match kind {
        Kind::Whole(what) => format!("{what}: {path}"),
        Kind::Pyproject => format!("pytest's configuration in {path} ([tool.pytest])"),
        Kind::Ini(section) => format!("pytest's configuration in {path} ([{section}])"),
        Kind::PackageJson => format!("the test scripts or test runner settings in {path}"),
        Kind::Makefile => format!("{path}, which defines `make test`"),
        Kind::CargoToml => format!("the test targets or their settings in {path}"),
    })
}

/// The part of a file that is test configuration, as comparable text; a file that cannot be
/// parsed counts whole (what cannot be read cannot be trusted to be unchanged).
fn projection(kind: Kind, data: Option<&[u8]>) -> Option<String> {
    let data = data?;
    let text = String::from_utf8_lossy(data);
    let whole = || Some(format!("whole:{text}"));
    match kind {
        Kind::Whole(_) => whole(),
        Kind::Ini(section) => ini::section(&text, section),
        Kind::Makefile => has_make_target(&text, "test").then(whole).flatten(),
        Kind::Pyproject => match text.parse::<toml::Table>() {
            Ok(doc) => doc
                .get("tool")
                .and_then(|t| t.get("pytest"))
                .map(|p| p.to_string()),
            Err(_) => whole(),
        },
        Kind::CargoToml => match text.parse::<toml::Table>() {
            Ok(doc) => cargo_tests(&doc),
            Err(_) => whole(),
        },
        Kind::PackageJson => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => {
                let mut kept = serde_json::Map::new();
                if let Some(scripts) = v.get("scripts").and_then(|s| s.as_object()) {
                    for (k, s) in scripts {
                        if k.starts_with("test") || k == "pretest" || k == "posttest" {
                            kept.insert(format!("scripts.{k}"), s.clone());
                        }
                    }
                }
                for key in ["jest", "mocha", "ava"] {
                    if let Some(s) = v.get(key) {
                        kept.insert(key.to_string(), s.clone());
                    }
                }
                (!kept.is_empty()).then(|| serde_json::Value::Object(kept).to_string())
            }
            Err(_) => whole(),
        },
    }
}

/// Cargo's test targets and the keys that decide what `cargo test` builds and runs.
fn cargo_tests(doc: &toml::Table) -> Option<String> {
    let mut kept = toml::Table::new();
    if let Some(t) = doc.get("test") {
        kept.insert("test".into(), t.clone());
    }
    let target_keys = |t: &toml::Value| -> toml::Table {
        ["test", "harness", "doctest"]
            .iter()
            .filter_map(|k| t.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect()
    };
    if let Some(lib) = doc.get("lib") {
        kept.insert("lib".into(), toml::Value::Table(target_keys(lib)));
    }
    for kind in ["bin", "example"] {
        if let Some(targets) = doc.get(kind).and_then(|b| b.as_array()) {
            let keys: Vec<toml::Value> = targets
                .iter()
                .map(|t| toml::Value::Table(target_keys(t)))
                .collect();
            kept.insert(kind.into(), toml::Value::Array(keys));
        }
    }
    if let Some(auto) = doc.get("package").and_then(|p| p.get("autotests")) {
        kept.insert("autotests".into(), auto.clone());
    }
    if let Some(ws) = doc.get("workspace") {
        for key in ["members", "default-members", "exclude"] {
            if let Some(v) = ws.get(key) {
                kept.insert(format!("workspace.{key}"), v.clone());
            }
        }
    }
    (!kept.is_empty()).then(|| kept.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str, old: &str, new: &str) -> Option<String> {
        changed(path, Some(old.as_bytes()), Some(new.as_bytes()))
    }

    #[test]
    fn whole_files() {
        assert!(
            change(
                "pytest.ini",
                "[pytest]\n",
                "[pytest]\naddopts = --collect-only -q\n"
            )
            .is_some()
        );
        assert!(
            changed("pytest.ini", None, Some(b"[pytest]\n")).is_some(),
            "created"
        );
        assert!(
            changed("sub/pytest.ini", Some(b"x"), None).is_some(),
            "deleted, anywhere"
        );
        assert!(
            change(
                ".cargo/config.toml",
                "",
                "[target.x86_64-unknown-linux-gnu]\nrunner = \"true\"\n"
            )
            .is_some()
        );
        assert!(change(".npmrc", "", "script-shell=/bin/true\n").is_some());
        assert!(changed("pytest.py", None, Some(b"raise SystemExit(0)\n")).is_some());
        assert!(changed("pytest/__main__.py", None, Some(b"")).is_some());
        assert!(
            changed("lib/pytest.py", None, Some(b"")).is_none(),
            "not at the root: not what python3 -m pytest imports"
        );
        assert!(changed("jest.config.js", Some(b"a"), Some(b"b")).is_some());
        assert!(changed("node_modules/.bin/jest", None, Some(b"exit 0")).is_some());
        assert!(changed("src/app.py", None, Some(b"x")).is_none());
        assert!(change("pytest.ini", "same", "same").is_none());
        assert!(!may_hold("README.md") && may_hold("tox.ini"));
    }

    #[test]
    fn pytest_settings_inside_other_files() {
        let before = "[project]\nname = \"x\"\nversion = \"1\"\n\n[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n";
        let version = before.replace("version = \"1\"", "version = \"2\"");
        assert!(
            change("pyproject.toml", before, &version).is_none(),
            "not pytest's part"
        );
        let cheat = format!("{before}addopts = \"--collect-only -q\"\n");
        assert_eq!(
            change("pyproject.toml", before, &cheat).unwrap(),
            "pytest's configuration in pyproject.toml ([tool.pytest])"
        );
        assert!(
            change(
                "pyproject.toml",
                "[project]\nname = \"x\"\n",
                "[project]\nname = \"x\"\n[tool.pytest]\naddopts = [\"-k\", \"nothing\"]\n"
            )
            .is_some(),
            "pytest 9's native table"
        );
        let cfg = "[metadata]\nname = x\n[tool:pytest]\ntestpaths = tests\n";
        assert!(change("setup.cfg", cfg, &cfg.replace("name = x", "name = y")).is_none());
        assert!(change("setup.cfg", cfg, &format!("{cfg}addopts = --co\n")).is_some());
        let tox = "[tox]\nenvlist = py3\n[pytest]\naddopts = -q\n";
        assert!(change("tox.ini", tox, &tox.replace("py3", "py311")).is_none());
        assert!(change("tox.ini", tox, &tox.replace("-q", "-q --collect-only")).is_some());
    }

    #[test]
    fn node_make_and_cargo() {
        let pkg =
            r#"{"name": "x", "version": "1.0.0", "scripts": {"test": "node --test", "lint": "eslint ."}}"#;
        assert!(change("package.json", pkg, &pkg.replace("1.0.0", "1.0.1")).is_none());
        assert!(change("package.json", pkg, &pkg.replace("eslint .", "eslint src")).is_none());
        assert!(change("package.json", pkg, &pkg.replace("node --test", "exit 0")).is_some());
        assert!(
            change("package.json", pkg, &pkg.replace("\"lint\"", "\"posttest\"")).is_some(),
            "a posttest script"
        );
        assert!(
            change(
                "package.json",
                pkg,
                &pkg.replace("}}", "}, \"jest\": {\"testMatch\": []}}")
            )
            .is_some()
        );
        let make = "CFLAGS = -O2\ntest: build\n\t./run-tests\nbuild:\n\tcc -o x x.c\n";
        assert!(
            change("Makefile", make, &make.replace("-O2", "-O0")).is_some(),
            "a Makefile with a test target is whole"
        );
        assert!(
            change("Makefile", "all:\n\tcc x.c\n", "all:\n\tcc -O2 x.c\n").is_none(),
            "no test target"
        );
        let cargo =
            "[package]\nname = \"x\"\nversion = \"0.1.0\"\n\n[dependencies]\n\n[[test]]\nname = \"it\"\n";
        assert!(
            change(
                "Cargo.toml",
                cargo,
                &cargo.replace("[dependencies]\n", "[dependencies]\nserde = \"1\"\n")
            )
            .is_none()
        );
        assert!(change("Cargo.toml", cargo, &format!("{cargo}harness = false\n")).is_some());
        assert!(
            change(
                "Cargo.toml",
                cargo,
                &cargo.replace("[package]\n", "[package]\nautotests = false\n")
            )
            .is_some()
        );
        assert!(change("Cargo.toml", cargo, &format!("{cargo}\n[lib]\ntest = false\n")).is_some());
        assert!(
            change(
                "crates/a/Cargo.toml",
                "[package]\nname = \"a\"\n",
                "[package]\nname = \"a\"\n[lib]\nharness = false\n"
            )
            .is_some()
        );
        assert!(
            change("Cargo.toml", cargo, "not toml [").is_some(),
            "unreadable counts whole"
        );
    }
}
