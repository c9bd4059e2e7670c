//! What setup installs for a Python project, as its CI would: the project itself when it is a
//! package (`pip install -e .`, even with no dependencies: its tests may read its own
//! metadata, a src layout needs it on the path), with its test extras and dependency groups,
//! plus the requirement files projects keep for their tests. One `pip install` for all of it,
//! so pip resolves them together.
//!
//! The rules are general: files and table names projects use, never a package's name. Read
//! on the host as detection reads the project (regular files, no link out of it, bounded).

use std::path::Path;

use super::detect::read_project_file;
use super::ini;

/// Extras (`[project.optional-dependencies]`, `extras_require`) a test run wants.
const TEST_EXTRAS: &[&str] = &["test", "tests", "testing", "dev"];
/// Dependency groups (`[dependency-groups]`, pip's `--group`) a test run wants.
const TEST_GROUPS: &[&str] = &["test", "tests", "dev"];

/// What setup does for a Python project: one `pip install` and why, or why nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PythonSetup {
    Install {
        /// The `pip install ...` command (run with the venv active).
        command: String,
        /// What it installs and why, for the `agentbox: setup:` line.
        why: String,
        /// It installs the project itself or a local path: the project's own build code runs.
        runs_project_code: bool,
    },
    Nothing(String),
}

fn text(root: &Path, rel: &str) -> Option<String> {
    read_project_file(root, rel)
        .ok()
        .map(|d| String::from_utf8_lossy(&d).into_owned())
}

/// A file name that is safe in a shell command as it is.
fn shell_plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

/// A requirements file with at least one line that is neither blank nor a comment.
fn has_lines(root: &Path, rel: &str) -> bool {
    text(root, rel).is_some_and(|t| {
        t.lines().any(|l| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with('#')
        })
    })
}

fn files_in(root: &Path, dir: &str) -> Vec<String> {
    let mut names = super::declared::list(root, dir);
    names.sort();
    names
}

/// The requirement files a test run installs: `requirements.txt`, and those projects keep
/// for their tests (`requirements-test*.txt`, `test-requirements.txt`, `requirements/test*.txt`;
/// `_` for `-` too) — or, when there are none, for development (`requirements-dev.txt`,
/// `dev-requirements.txt`, `requirements/dev*.txt`). Only files with a requirement.
///
/// Test files win because a development file is often a pinned lock of the whole development
/// environment (`pip-compile dev.in`: docs, linters, tox), which can pin the package itself or
/// its dependents at other versions than the checkout: installed beside `-e .` it makes the
/// resolution impossible, and the tests never needed it. That is what a project's CI installs
/// for its tests too.
pub fn requirement_files(root: &Path) -> Vec<String> {
    let root_name = |n: &str| n.replace('_', "-");
    let test_at_root = |n: &str| {
        let n = root_name(n);
        (n.starts_with("requirements-test") && n.ends_with(".txt"))
            || n == "test-requirements.txt"
            || n == "tests-requirements.txt"
    };
    let dev_at_root = |n: &str| {
        let n = root_name(n);
        n == "requirements-dev.txt" || n == "dev-requirements.txt"
    };
    let usable = |f: &String| shell_plain(f) && has_lines(root, f);
    let at_root = files_in(root, "");
    let under = files_in(root, "requirements");
    let pick = |top: &dyn Fn(&str) -> bool, prefix: &str| -> Vec<String> {
        at_root
            .iter()
            .filter(|n| top(n))
            .cloned()
            .chain(
                under
                    .iter()
                    .filter(|n| n.starts_with(prefix) && n.ends_with(".txt"))
                    .map(|n| format!("requirements/{n}")),
            )
            .filter(usable)
            .collect()
    };
    // requirements.txt first: what the project needs, then what its tests add.
    let mut out: Vec<String> = at_root
        .iter()
        .filter(|n| n.as_str() == "requirements.txt" && usable(n))
        .cloned()
        .collect();
    let tests = pick(&test_at_root, "test");
    out.extend(if tests.is_empty() {
        pick(&dev_at_root, "dev")
    } else {
        tests
    });
    out
}

/// Why the project is a package pip can install, or `None`. pip needs `pyproject.toml` or
/// `setup.py`; a `setup.cfg` alone is only configuration to it.
fn package_evidence(root: &Path, pyproject: Option<&toml::Table>) -> Option<String> {
    if let Some(doc) = pyproject {
        for table in ["project", "build-system"] {
            if doc.get(table).is_some_and(|t| t.is_table()) {
                return Some(format!("pyproject.toml [{table}]"));
            }
        }
    }
    if read_project_file(root, "setup.py").is_ok() {
        return Some("setup.py".into());
    }
    None
}

/// The test extras the project declares, and where.
fn test_extras(root: &Path, pyproject: Option<&toml::Table>) -> Vec<(String, &'static str)> {
    let mut out: Vec<(String, &'static str)> = Vec::new();
    let mut add = |name: &str, source: &'static str| {
        if TEST_EXTRAS.contains(&name) && !out.iter().any(|(n, _)| n == name) {
            out.push((name.to_string(), source));
        }
    };
    if let Some(extras) = pyproject
        .and_then(|d| d.get("project"))
        .and_then(|p| p.get("optional-dependencies"))
        .and_then(|o| o.as_table())
    {
        for name in extras.keys() {
            add(name, "pyproject.toml [project.optional-dependencies]");
        }
    }
    if let Some(t) = text(root, "setup.cfg")
        && let Some(section) = ini::section(&t, "options.extras_require")
    {
        for (name, _) in ini::values(&section) {
            add(&name, "setup.cfg [options.extras_require]");
        }
    }
    // setup.py is code: an extra is taken when `extras_require` is there and the name appears
    // as a key (`"test": [...]` or `test=[...]`). Asking pip for an extra a package lacks is
    // only a warning, so a wrong guess costs nothing.
    if let Some(t) = text(root, "setup.py")
        && t.contains("extras_require")
    {
        for name in TEST_EXTRAS {
            let keyed = ["\"", "'"].iter().any(|q| {
                t.match_indices(&format!("{q}{name}{q}"))
                    .any(|(i, m)| t[i + m.len()..].trim_start().starts_with(':'))
            }) || t.match_indices(name).any(|(i, m)| {
                let before = t[..i].chars().next_back();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '"' || c == '\'')
                    && t[i + m.len()..].trim_start().starts_with('=')
                    && !t[i + m.len()..].trim_start().starts_with("==")
            });
            if keyed {
                add(name, "setup.py extras_require");
            }
        }
    }
    out.retain(|(n, _)| shell_plain(n));
    out
}

fn test_groups(pyproject: Option<&toml::Table>) -> Vec<String> {
    pyproject
        .and_then(|d| d.get("dependency-groups"))
        .and_then(|g| g.as_table())
        .map(|g| {
            TEST_GROUPS
                .iter()
                .filter(|name| g.contains_key(**name))
                .map(|n| n.to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A line of a requirements file that names a local path (`-e ./lib`, `./pkg`, `file:...`):
/// installing it runs that directory's build code.
pub(crate) fn local_requirement(line: &str) -> Option<String> {
    let line = line.split(" #").next().unwrap_or_default().trim();
    let target = line
        .strip_prefix("-e ")
        .or_else(|| line.strip_prefix("--editable "))
        .or_else(|| line.strip_prefix("--editable="))
        .unwrap_or(line)
        .trim();
    let target = target.split(" @ ").nth(1).unwrap_or(target).trim();
    let target = target
        .strip_prefix("file://")
        .or_else(|| target.strip_prefix("file:"))
        .unwrap_or(target);
    (target.starts_with('.') || target.starts_with('/')).then(|| target.to_string())
}

/// What setup installs for the Python project at `root`, and why.
pub fn setup(root: &Path) -> PythonSetup {
    let pyproject: Option<toml::Table> = text(root, "pyproject.toml").and_then(|t| t.parse().ok());
    let files = requirement_files(root);
    let package = package_evidence(root, pyproject.as_ref());
    let extras = if package.is_some() {
        test_extras(root, pyproject.as_ref())
    } else {
        Vec::new()
    };
    let groups = test_groups(pyproject.as_ref());
    if files.is_empty() && package.is_none() && groups.is_empty() {
        let cfg = if read_project_file(root, "setup.cfg").is_ok() {
            " (a setup.cfg alone is configuration to pip, not a package)"
        } else {
            ""
        };
        return PythonSetup::Nothing(format!(
            "Python: nothing to install: no requirements file with a requirement, and the project \
             is no package (no [project] or [build-system] in pyproject.toml, no setup.py){cfg}"
        ));
    }
    let mut args = Vec::new();
    let mut why = Vec::new();
    for f in &files {
        args.push(format!("-r {f}"));
    }
    if !files.is_empty() {
        why.push(format!("the requirements in {}", files.join(", ")));
    }
    if let Some(evidence) = &package {
        if extras.is_empty() {
            args.push("-e .".to_string());
            why.push(format!(
                "the project itself, editable (it is a package: {evidence})"
            ));
        } else {
            let names: Vec<&str> = extras.iter().map(|(n, _)| n.as_str()).collect();
            args.push(format!("-e '.[{}]'", names.join(",")));
            let mut sources: Vec<&str> = extras.iter().map(|(_, s)| *s).collect();
            sources.dedup();
            why.push(format!(
                "the project itself, editable (it is a package: {evidence}), with its extras {} ({})",
                names.join(", "),
                sources.join(", ")
            ));
        }
    }
    for g in &groups {
        args.push(format!("--group {g}"));
    }
    if !groups.is_empty() {
        why.push(format!(
            "the dependency groups {} (pyproject.toml [dependency-groups])",
            groups.join(", ")
        ));
    }
    let local = files
        .iter()
        .any(|f| text(root, f).is_some_and(|t| t.lines().any(|l| local_requirement(l).is_some())));
    PythonSetup::Install {
        command: format!("pip install {}", args.join(" ")),
        why: format!("Python: installing {}", why.join("; ")),
        runs_project_code: package.is_some() || local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::detect::project;

    fn command(files: &[(&str, &str)]) -> PythonSetup {
        let (_dir, root) = project(files);
        setup(&root)
    }

    fn cmd(s: &PythonSetup) -> &str {
        match s {
            PythonSetup::Install { command, .. } => command,
            PythonSetup::Nothing(why) => panic!("nothing: {why}"),
        }
    }

    #[test]
    fn a_package_with_no_dependencies_is_installed() {
        let s = command(&[("pyproject.toml", "[project]\nname = \"x\"\nversion = \"1\"\n")]);
        assert_eq!(cmd(&s), "pip install -e .");
        let s = command(&[("setup.py", "from setuptools import setup\nsetup()\n")]);
        assert_eq!(cmd(&s), "pip install -e .");
        let s = command(&[(
            "pyproject.toml",
            "[build-system]\nrequires = [\"flit_core\"]\nbuild-backend = \"flit_core.buildapi\"\n",
        )]);
        assert_eq!(cmd(&s), "pip install -e .");
        let PythonSetup::Install {
            why,
            runs_project_code,
            ..
        } = s
        else {
            panic!()
        };
        assert!(
            why.contains("pyproject.toml [build-system]") && runs_project_code,
            "{why}"
        );
    }

    #[test]
    fn configuration_alone_is_nothing_to_install_and_says_so() {
        for files in [
            vec![("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-q\"\n")],
            vec![("setup.cfg", "[flake8]\nmax-line-length = 99\n")],
            vec![("requirements.txt", "# nothing yet\n\n")],
            vec![("tox.ini", "[tox]\n")],
        ] {
            match command(&files) {
                PythonSetup::Nothing(why) => assert!(why.contains("nothing to install"), "{why}"),
                other => panic!("{files:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn test_extras_groups_and_requirement_files_come_along() {
        let pyproject = "[project]\nname = \"x\"\nversion = \"1\"\n\
            [project.optional-dependencies]\ntest = [\"a\"]\ndocs = [\"b\"]\ndev = [\"c\"]\n\
            [dependency-groups]\ntests = [\"d\"]\nlint = [\"e\"]\n";
        let s = command(&[
            ("pyproject.toml", pyproject),
            ("requirements.txt", "f\n"),
            ("requirements-dev.txt", "g\n"),
            ("requirements_test.txt", "h\n"),
            ("test-requirements.txt", "i\n"),
            ("requirements-docs.txt", "j\n"),
            ("requirements/tests.txt", "k\n"),
            ("requirements/docs.txt", "l\n"),
            ("requirements/dev-extra.txt", "# only a comment\n"),
        ]);
        assert_eq!(
            cmd(&s),
            "pip install -r requirements.txt -r requirements_test.txt -r test-requirements.txt \
             -r requirements/tests.txt -e '.[dev,test]' --group tests"
        );
        let PythonSetup::Install { why, .. } = s else {
            panic!()
        };
        assert!(
            why.contains("extras dev, test (pyproject.toml [project.optional-dependencies])")
                && why.contains("dependency groups tests"),
            "{why}"
        );
    }

    /// Development files count only when the project keeps no test requirements: a pinned
    /// `requirements/dev.txt` beside `requirements/tests.txt` (as pip-compiled projects keep
    /// them) is the whole development environment and may pin the package itself.
    #[test]
    fn development_requirements_only_without_test_requirements() {
        let s = command(&[
            ("requirements-dev.txt", "g\n"),
            ("requirements/dev.txt", "h\n"),
            ("requirements/docs.txt", "i\n"),
        ]);
        assert_eq!(
            cmd(&s),
            "pip install -r requirements-dev.txt -r requirements/dev.txt"
        );
        let s = command(&[
            ("pyproject.toml", "[project]\nname = \"x\"\nversion = \"1\"\n"),
            ("requirements/dev.txt", "x==0.9\nsphinx==8\n"),
            ("requirements/tests.txt", "pytest==8\n"),
        ]);
        assert_eq!(cmd(&s), "pip install -r requirements/tests.txt -e .");
    }

    #[test]
    fn extras_of_setup_cfg_and_setup_py() {
        let s = command(&[
            ("setup.py", "from setuptools import setup\nsetup()\n"),
            (
                "setup.cfg",
                "[metadata]\nname = x\n[options.extras_require]\ntesting =\n    a\ndocs = b\n",
            ),
        ]);
        assert_eq!(cmd(&s), "pip install -e '.[testing]'");
        let s = command(&[(
            "setup.py",
            "setup(name='x', extras_require={'tests': ['a'], \"docs\": ['b']})\n",
        )]);
        assert_eq!(cmd(&s), "pip install -e '.[tests]'");
        let s = command(&[("setup.py", "setup(extras_require=dict(dev=['a']), name='x')\n")]);
        assert_eq!(cmd(&s), "pip install -e '.[dev]'");
        // A name that only appears elsewhere is no extra.
        let s = command(&[("setup.py", "setup(name='test', extras_require={})\n")]);
        assert_eq!(cmd(&s), "pip install -e .");
    }

    #[test]
    fn groups_without_a_package_and_local_paths() {
        let s = command(&[("pyproject.toml", "[dependency-groups]\ndev = [\"a\"]\n")]);
        assert_eq!(cmd(&s), "pip install --group dev");
        let PythonSetup::Install {
            runs_project_code, ..
        } = command(&[("requirements.txt", "six\n")])
        else {
            panic!()
        };
        assert!(!runs_project_code);
        let PythonSetup::Install {
            runs_project_code, ..
        } = command(&[("requirements.txt", "-e ./lib\n")])
        else {
            panic!()
        };
        assert!(runs_project_code);
        assert_eq!(
            local_requirement("pkg @ file:///srv/pkg"),
            Some("/srv/pkg".into())
        );
        assert_eq!(local_requirement("./vendored"), Some("./vendored".into()));
        assert_eq!(local_requirement("six==1"), None);
    }
}
