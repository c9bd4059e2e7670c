//! What a project declares it needs, and where: for the before-verdict's "the tests cannot
//! start because the environment lacks a declared dependency" (exit 2, before any model
//! request), which must tell that apart from a wrong import that is the bug itself. Only a
//! name the project declares counts; each comes with the setup command that installs it.
//!
//! Read on the host as detection reads the project (regular files, no link out of it,
//! bounded); nothing here names a package.

use std::path::Path;

use super::detect::read_project_file;
use super::ini;

/// One declared dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// As the module or program is named: normalised by [`normalise`].
    pub name: String,
    /// Where it is declared: `pyproject.toml [project.optional-dependencies] test`.
    pub source: String,
    /// The setup command that installs it, for `--setup`.
    pub install: String,
}

/// A distribution's name as Python would import it, and a module's as pip would name it:
/// lower case, runs of `-`, `_` and `.` one `_` (PEP 503, with `_` for the separator).
pub fn normalise(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('_');
        }
        sep = false;
        out.extend(c.to_lowercase());
    }
    out
}

/// The name a requirement line names (`freezegun>=1.2; python_version > "3.8"`,
/// `pkg[extra]==1`, `name @ https://...`), or `None` for an option, a path or a URL.
fn requirement_name(line: &str) -> Option<String> {
    let line = line.split(" #").next().unwrap_or_default().trim();
    if line.is_empty()
        || line.starts_with(['#', '-', '.', '/'])
        || (line.contains("://") && !line.contains(" @ "))
    {
        return None;
    }
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(line.len());
    let name = &line[..end];
    (!name.is_empty()).then(|| normalise(name))
}

/// Requirement files projects use, at the root and under `requirements/`.
fn is_requirements_file(name: &str) -> bool {
    name.ends_with(".txt") && (name.starts_with("requirements") || name.ends_with("requirements.txt"))
}

/// Includes followed (`-r other.txt`) from one requirements file, at most this deep.
const MAX_INCLUDE_DEPTH: usize = 3;
/// Files read for one project, at most.
const MAX_FILES: usize = 64;

fn text(root: &Path, rel: &str) -> Option<String> {
    read_project_file(root, rel)
        .ok()
        .map(|d| String::from_utf8_lossy(&d).into_owned())
}

/// Every dependency a Python project declares: its requirements files (with their `-r`
/// includes), `pyproject.toml` (`[project]` dependencies, optional dependencies, dependency
/// groups, Poetry's tables), `setup.cfg` and `Pipfile`; and the project itself (its
/// `[project] name`), which a src layout needs installed.
pub fn python(root: &Path) -> Vec<Declared> {
    let mut out = Vec::new();
    let mut files: Vec<String> = list(root, "")
        .into_iter()
        .filter(|n| is_requirements_file(n))
        .collect();
    files.extend(
        list(root, "requirements")
            .into_iter()
            .filter(|n| n.ends_with(".txt"))
            .map(|n| format!("requirements/{n}")),
    );
    files.sort();
    let mut read = 0;
    for file in &files {
        requirements(root, file, file, 0, &mut read, &mut out);
    }
    if let Some(t) = text(root, "pyproject.toml")
        && let Ok(doc) = t.parse::<toml::Table>()
    {
        pyproject(&doc, &mut out);
    }
    if let Some(t) = text(root, "setup.cfg") {
        setup_cfg(&t, &mut out);
    }
    if let Some(t) = text(root, "Pipfile")
        && let Ok(doc) = t.parse::<toml::Table>()
    {
        for table in ["packages", "dev-packages"] {
            for name in doc
                .get(table)
                .and_then(|v| v.as_table())
                .into_iter()
                .flat_map(|t| t.keys())
                .filter(|k| plain(k))
            {
                push(
                    &mut out,
                    normalise(name),
                    format!("Pipfile [{table}]"),
                    format!("pip install {name}"),
                );
            }
        }
    }
    out
}

/// The regular files directly in `dir` (at most 1000), unsorted.
pub(super) fn list(root: &Path, dir: &str) -> Vec<String> {
    std::fs::read_dir(root.join(dir))
        .map(|r| {
            r.flatten()
                .take(1000)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A name as packaging allows it (PEP 508 names, PEP 685 extras, dependency groups): these
/// reach the user's terminal in the hint, so nothing else is taken.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn push(out: &mut Vec<Declared>, name: String, source: String, install: String) {
    if plain(&name) && !out.iter().any(|d| d.name == name) {
        out.push(Declared {
            name,
            source,
            install,
        });
    }
}

/// `file`'s requirements, installed by `pip install -r top` (the file the user would name).
fn requirements(root: &Path, top: &str, file: &str, depth: usize, read: &mut usize, out: &mut Vec<Declared>) {
    *read += 1;
    if *read > MAX_FILES {
        return;
    }
    let Some(t) = text(root, file) else { return };
    let dir = file.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    for line in t.lines() {
        let line = line.trim();
        let include = line
            .strip_prefix("-r ")
            .or_else(|| line.strip_prefix("--requirement "))
            .or_else(|| line.strip_prefix("--requirement="));
        if let Some(inc) = include {
            let inc = inc.trim();
            // Inside the project only: a path with `..` or an absolute one is not followed.
            if depth < MAX_INCLUDE_DEPTH && !inc.starts_with('/') && !inc.split('/').any(|s| s == "..") {
                let rel = if dir.is_empty() {
                    inc.to_string()
                } else {
                    format!("{dir}/{inc}")
                };
                requirements(root, top, &rel, depth + 1, read, out);
            }
            continue;
        }
        if let Some(name) = requirement_name(line) {
            push(out, name, top.to_string(), format!("pip install -r {top}"));
        }
    }
}

fn strings(v: Option<&toml::Value>) -> Vec<String> {
    v.and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn pyproject(doc: &toml::Table, out: &mut Vec<Declared>) {
    let project = doc.get("project").and_then(|p| p.as_table());
    if let Some(project) = project {
        if let Some(name) = project.get("name").and_then(|n| n.as_str()) {
            push(
                out,
                normalise(name),
                "pyproject.toml [project] name (the project itself)".into(),
                "pip install -e .".into(),
            );
        }
        for req in strings(project.get("dependencies")) {
            if let Some(name) = requirement_name(&req) {
                push(
                    out,
                    name,
                    "pyproject.toml [project] dependencies".into(),
                    "pip install -e .".into(),
                );
            }
        }
        if let Some(extras) = project.get("optional-dependencies").and_then(|o| o.as_table()) {
            for (extra, reqs) in extras.iter().filter(|(e, _)| plain(e)) {
                for req in strings(Some(reqs)) {
                    if let Some(name) = requirement_name(&req) {
                        push(
                            out,
                            name,
                            format!("pyproject.toml [project.optional-dependencies] {extra}"),
                            format!("pip install -e '.[{extra}]'"),
                        );
                    }
                }
            }
        }
    }
    if let Some(groups) = doc.get("dependency-groups").and_then(|g| g.as_table()) {
        for (group, reqs) in groups.iter().filter(|(g, _)| plain(g)) {
            for req in strings(Some(reqs)) {
                if let Some(name) = requirement_name(&req) {
                    push(
                        out,
                        name,
                        format!("pyproject.toml [dependency-groups] {group}"),
                        format!("pip install --group {group}"),
                    );
                }
            }
        }
    }
    let poetry = doc
        .get("tool")
        .and_then(|t| t.get("poetry"))
        .and_then(|p| p.as_table());
    if let Some(poetry) = poetry {
        let mut tables: Vec<(String, &toml::Table)> = Vec::new();
        for key in ["dependencies", "dev-dependencies"] {
            if let Some(t) = poetry.get(key).and_then(|t| t.as_table()) {
                tables.push((format!("[tool.poetry.{key}]"), t));
            }
        }
        if let Some(groups) = poetry.get("group").and_then(|g| g.as_table()) {
            for (group, g) in groups.iter().filter(|(g, _)| plain(g)) {
                if let Some(t) = g.get("dependencies").and_then(|t| t.as_table()) {
                    tables.push((format!("[tool.poetry.group.{group}.dependencies]"), t));
                }
            }
        }
        for (source, table) in tables {
            for name in table.keys().filter(|k| *k != "python" && plain(k)) {
                push(
                    out,
                    normalise(name),
                    format!("pyproject.toml {source}"),
                    format!("pip install {name}"),
                );
            }
        }
    }
}

fn setup_cfg(text: &str, out: &mut Vec<Declared>) {
    let split = |v: &str| -> Vec<String> { v.split(['\n', ';', ',']).filter_map(requirement_name).collect() };
    if let Some(options) = ini::section(text, "options") {
        for (key, value) in ini::values(&options) {
            let install = match key.as_str() {
                "install_requires" => "pip install -e .".to_string(),
                "tests_require" => String::new(),
                _ => continue,
            };
            for name in split(&value) {
                let install = if install.is_empty() {
                    format!("pip install {name}")
                } else {
                    install.clone()
                };
                push(out, name, format!("setup.cfg [options] {key}"), install);
            }
        }
    }
    if let Some(extras) = ini::section(text, "options.extras_require") {
        for (extra, value) in ini::values(&extras).into_iter().filter(|(e, _)| plain(e)) {
            for name in split(&value) {
                push(
                    out,
                    name,
                    format!("setup.cfg [options.extras_require] {extra}"),
                    format!("pip install -e '.[{extra}]'"),
                );
            }
        }
    }
}

/// What the tests' output says is missing, when the project declares it: a Python module
/// (`ModuleNotFoundError: No module named 'x'`, top-level only: a missing submodule of a
/// package that is there is a wrong import), or a program the shell did not find (`sh: 1: x:
/// not found`, `x: command not found`).
pub fn gap(root: &Path, output: &str) -> Option<Gap> {
    let mut python_declared: Option<Vec<Declared>> = None;
    let mut node_declared: Option<Vec<Declared>> = None;
    for line in output.lines() {
        if let Some(module) = missing_module(line) {
            if module.contains('.') {
                continue;
            }
            let declared = python_declared.get_or_insert_with(|| python(root));
            let name = normalise(&module);
            if let Some(d) = declared.iter().find(|d| d.name == name) {
                return Some(Gap {
                    missing: format!("the module {module}"),
                    declared: d.clone(),
                });
            }
        } else if let Some(program) = missing_program(line) {
            let node = node_declared.get_or_insert_with(|| node(root));
            let py = python_declared.get_or_insert_with(|| python(root));
            let found = node
                .iter()
                .find(|d| d.name == program)
                .or_else(|| py.iter().find(|d| d.name == normalise(&program)));
            if let Some(d) = found {
                return Some(Gap {
                    missing: format!("the program {program}"),
                    declared: d.clone(),
                });
            }
        }
    }
    None
}

/// A declared dependency the tests' environment lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// "the module freezegun", "the program jest".
    pub missing: String,
    pub declared: Declared,
}

fn missing_module(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("No module named ")?;
    let rest = rest.trim();
    let name = match rest.strip_prefix('\'') {
        Some(quoted) => quoted.split('\'').next()?,
        None => rest.split_whitespace().next()?,
    };
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.');
    ok.then(|| name.to_string())
}

/// `sh: 1: jest: not found` (dash), `bash: line 1: jest: command not found`, `sh: jest: not
/// found`.
fn missing_program(line: &str) -> Option<String> {
    let rest = line
        .trim_end()
        .strip_suffix(": command not found")
        .or_else(|| line.trim_end().strip_suffix(": not found"))?;
    let program = rest.rsplit(": ").next()?.trim();
    let ok = !program.is_empty()
        && program.len() <= 200
        && program
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | '/'));
    ok.then(|| program.to_string())
}

/// Every package a Node project declares in `package.json` (dependencies of every kind),
/// installed by `npm ci` (with a lockfile) or `npm install`.
pub fn node(root: &Path) -> Vec<Declared> {
    let mut out = Vec::new();
    let Some(t) = text(root, "package.json") else {
        return out;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) else {
        return out;
    };
    let lock = ["package-lock.json", "npm-shrinkwrap.json"]
        .iter()
        .any(|f| root.join(f).symlink_metadata().is_ok_and(|m| m.is_file()));
    let install = if lock { "npm ci" } else { "npm install" };
    for key in [
        "dependencies",
        "devDependencies",
        "optionalDependencies",
        "peerDependencies",
    ] {
        for name in v
            .get(key)
            .and_then(|d| d.as_object())
            .into_iter()
            .flat_map(|o| o.keys())
        {
            // A scoped package's program is usually its last part (`@scope/tool` → `tool`).
            let program = name.rsplit('/').next().unwrap_or(name);
            let scoped = name.strip_prefix('@').and_then(|n| n.split_once('/'));
            let ok = match scoped {
                Some((scope, last)) => plain(scope) && plain(last),
                None => plain(name),
            };
            if ok && !out.iter().any(|d: &Declared| d.name == program) {
                out.push(Declared {
                    name: program.to_string(),
                    source: format!("package.json {key} ({name})"),
                    install: install.to_string(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::detect::project;

    fn names(d: &[Declared]) -> Vec<&str> {
        d.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn names_normalise_as_pip_and_python_see_them() {
        assert_eq!(normalise("Flask-SQLAlchemy"), "flask_sqlalchemy");
        assert_eq!(normalise("zope.interface"), "zope_interface");
        assert_eq!(
            requirement_name("freezegun>=1.2; python_version > \"3.8\""),
            Some("freezegun".into())
        );
        assert_eq!(requirement_name("pkg[extra]==1"), Some("pkg".into()));
        assert_eq!(
            requirement_name("name @ https://example.invalid/x.whl"),
            Some("name".into())
        );
        for not_one in [
            "-e .",
            "--index-url x",
            "./local",
            "https://example.invalid/x.whl",
            "# c",
            "",
        ] {
            assert_eq!(requirement_name(not_one), None, "{not_one}");
        }
    }

    #[test]
    fn python_declarations_and_how_to_install_them() {
        let pyproject = "[project]\nname = \"My-Pkg\"\ndependencies = [\"attrs>=22\"]\n\
            [project.optional-dependencies]\ntest = [\"freezegun\"]\n\
            [dependency-groups]\ndev = [\"pytest-mock\", {include-group = \"test\"}]\n";
        let (_d, root) = project(&[
            ("pyproject.toml", pyproject),
            (
                "requirements-dev.txt",
                "-r requirements/base.txt\nhypothesis==6 # pinned\n",
            ),
            ("requirements/base.txt", "-r ../../etc/passwd\nsix\n"),
            (
                "setup.cfg",
                "[options]\ninstall_requires =\n    requests\n[options.extras_require]\ndocs = sphinx\n",
            ),
        ]);
        let d = python(&root);
        assert_eq!(
            names(&d),
            [
                "six",
                "hypothesis",
                "my_pkg",
                "attrs",
                "freezegun",
                "pytest_mock",
                "requests",
                "sphinx"
            ]
        );
        let by = |n: &str| d.iter().find(|x| x.name == n).unwrap();
        assert_eq!(by("six").install, "pip install -r requirements-dev.txt");
        assert_eq!(by("freezegun").install, "pip install -e '.[test]'");
        assert_eq!(
            by("freezegun").source,
            "pyproject.toml [project.optional-dependencies] test"
        );
        assert_eq!(by("pytest_mock").install, "pip install --group dev");
        assert_eq!(by("sphinx").install, "pip install -e '.[docs]'");
        assert_eq!(by("my_pkg").install, "pip install -e .");
    }

    #[test]
    fn what_is_missing_and_declared_is_the_environment() {
        let (_d, root) = project(&[
            (
                "pyproject.toml",
                "[project]\nname = \"p\"\n[project.optional-dependencies]\ntest = [\"freezegun\"]\n",
            ),
            ("package.json", r#"{"devDependencies": {"jest": "29"}}"#),
        ]);
        let g = gap(&root, "E   ModuleNotFoundError: No module named 'freezegun'\n").unwrap();
        assert_eq!(g.missing, "the module freezegun");
        assert_eq!(g.declared.install, "pip install -e '.[test]'");
        assert_eq!(
            gap(&root, "ImportError: No module named freezegun\n")
                .unwrap()
                .declared
                .name,
            "freezegun"
        );
        // Not declared: perhaps the bug itself (a misspelt import).
        assert_eq!(
            gap(&root, "E   ModuleNotFoundError: No module named 'freezgun'\n"),
            None
        );
        // A submodule of what is there: a wrong import.
        assert_eq!(
            gap(&root, "E   ModuleNotFoundError: No module named 'p.utilz'\n"),
            None
        );
        assert_eq!(
            gap(&root, "sh: 1: jest: not found\n").unwrap().missing,
            "the program jest"
        );
        assert_eq!(
            gap(&root, "bash: line 1: jest: command not found\n")
                .unwrap()
                .declared
                .install,
            "npm install"
        );
        assert_eq!(gap(&root, "sh: 1: tsc: not found\n"), None);
    }

    #[test]
    fn node_declarations() {
        let (_d, root) = project(&[(
            "package.json",
            r#"{"devDependencies": {"jest": "29", "@scope/tool": "1"}, "dependencies": {"left-pad": "1"}}"#,
        )]);
        let d = node(&root);
        // serde_json's objects are sorted by key.
        assert_eq!(names(&d), ["left-pad", "tool", "jest"]);
        assert_eq!(d[2].install, "npm install");
    }
}
