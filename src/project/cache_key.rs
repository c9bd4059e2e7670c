//! What a setup cache's key covers: everything setup reads. A cache is reused only while every
//! input of its fill is what it was, or a poisoned fill outlives the fix (a `.pth` planted
//! through an included requirements file stays after the include is fixed).
//!
//! - every manifest, lockfile and package-manager configuration at the root (`requirements*.txt`,
//!   `pyproject.toml`, `setup.py`, `setup.cfg`, `Cargo.lock`, `.cargo/config.toml`, `go.work`,
//!   `.npmrc`, `package-lock.json`...) and every `Cargo.toml`, `package.json`, `go.mod` and
//!   `go.sum` below it (workspace members, path dependencies);
//! - the requirement files setup installs and what their `-r`/`-c` lines include, followed;
//! - where setup runs the project's own code (the project or a local path installed, npm's
//!   lifecycle scripts, a `--setup` command), a digest of every file of the project: that code
//!   may read any of them. Build output and caches setup itself writes (`*.egg-info`, an
//!   in-place `.so`, `node_modules`, `target`...) are left out, or the key would change
//!   because of the fill.
//!
//! Read as detection reads the project (regular files, no link followed, bounded).

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::detect::read_project_file;

/// Bumped when what setup does for the same files changes (a fill of an older agentbox is not
/// this one's).
const RULES: &str = "setup-rules-4";

/// Root files whose content decides a cache's key.
const ROOT_FILES: &[&str] = &[
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "MANIFEST.in",
    "poetry.lock",
    "uv.lock",
    "pdm.lock",
    "Pipfile",
    "Pipfile.lock",
    "pip.conf",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    ".npmrc",
    "yarn.lock",
    "pnpm-lock.yaml",
    "Cargo.toml",
    "Cargo.lock",
    ".cargo/config.toml",
    ".cargo/config",
    "rust-toolchain.toml",
    "rust-toolchain",
    "go.mod",
    "go.sum",
    "go.work",
    "go.work.sum",
];

/// Manifests looked for throughout the tree (workspace members, path dependencies).
const TREE_MANIFESTS: &[&str] = &[
    "Cargo.toml",
    "package.json",
    "go.mod",
    "go.sum",
    "pyproject.toml",
    "setup.py",
];

/// Whether setup reads the file at `rel` (a path from the root) to decide what it installs: a
/// root manifest, lockfile or package-manager configuration, a manifest anywhere in the tree,
/// a requirements or constraints file. (Where setup runs the project's own code it may read
/// any file; this is what decides *what* is installed.)
pub fn is_setup_input(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    ROOT_FILES.contains(&rel)
        || TREE_MANIFESTS.contains(&name)
        || ((name.ends_with(".txt") || name.ends_with(".in"))
            && (rel.contains("requirements") || rel.contains("constraints")))
}

/// Entries one walk looks at, at most.
const MAX_ENTRIES: usize = 50_000;
/// Includes followed from one requirements file, at most this deep; files read, at most.
const MAX_INCLUDE_DEPTH: usize = 8;
const MAX_INCLUDED: usize = 256;

/// Directories a walk skips: caches and what setup and the tests write (coverage's HTML
/// report, hypothesis's example database).
fn skipped(name: &str) -> bool {
    super::skipped_dirs().any(|d| d == name)
        || name.ends_with(".egg-info")
        || name == "htmlcov"
        || name == ".hypothesis"
}

/// Files the whole-project digest leaves out: what a build writes in place, and the coverage
/// data a test run writes at the root (`addopts = --cov` in a project's pytest configuration
/// writes `.coverage` on every run, so every run would otherwise fill a new cache).
fn build_output(name: &str) -> bool {
    [".so", ".pyd", ".pyc", ".o"].iter().any(|s| name.ends_with(s))
        || name == ".coverage"
        || name.starts_with(".coverage.")
        || name == "coverage.xml"
}

/// Every regular file under `root` (relative, sorted), skipping [`skipped`] directories,
/// following no link; `None` past [`MAX_ENTRIES`].
fn walk(root: &Path) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = 0usize;
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let Ok(read) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in read.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                return None;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            match entry.file_type() {
                Ok(t) if t.is_dir() && !skipped(&name) => stack.push(path),
                Ok(t) if t.is_file() || t.is_symlink() => out.push(path),
                _ => {}
            }
        }
    }
    out.sort();
    Some(out)
}

fn absent(h: &mut Sha256, rel: &str) {
    h.update(rel.as_bytes());
    h.update([0]);
    h.update(b"absent");
    h.update([0]);
}

fn add_file(h: &mut Sha256, root: &Path, rel: &str) {
    h.update(rel.as_bytes());
    h.update([0]);
    let path = root.join(rel);
    match path.symlink_metadata() {
        Ok(m) if m.file_type().is_symlink() => {
            h.update(b"link:");
            if let Ok(target) = std::fs::read_link(&path) {
                h.update(target.to_string_lossy().as_bytes());
            }
        }
        Ok(m) if m.is_file() => match read_project_file(root, rel) {
            Ok(data) => {
                h.update((data.len() as u64).to_le_bytes());
                h.update(&data);
            }
            // Larger than a read is allowed: its size and time of change stand for it.
            Err(_) => {
                h.update(b"large:");
                h.update(m.len().to_le_bytes());
                if let Ok(t) = m.modified()
                    && let Ok(d) = t.duration_since(std::time::UNIX_EPOCH)
                {
                    h.update(d.as_nanos().to_le_bytes());
                }
            }
        },
        _ => h.update(b"absent"),
    }
    h.update([0]);
}

/// A requirements line's include (`-r FILE`, `-c FILE`, their long forms), relative to the
/// project root; `None` for anything else or a path out of the project.
fn include(dir: &str, line: &str) -> Option<String> {
    let line = line.split(" #").next().unwrap_or_default().trim();
    let target = ["-r", "-c", "--requirement", "--constraint"]
        .iter()
        .find_map(|flag| {
            let rest = line.strip_prefix(flag)?;
            Some(rest.strip_prefix('=').unwrap_or(rest).trim())
        })?;
    if target.is_empty() || target.starts_with('/') || target.contains("://") {
        return None;
    }
    let mut parts: Vec<&str> = if dir.is_empty() {
        Vec::new()
    } else {
        dir.split('/').collect()
    };
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

/// The requirement files setup installs and every file their includes reach; whether any of
/// them names a local path (whose build code setup runs).
pub fn requirement_closure(root: &Path) -> (Vec<String>, bool) {
    let mut todo: Vec<(String, usize)> = super::python::requirement_files(root)
        .into_iter()
        .map(|f| (f, 0))
        .collect();
    let mut done: Vec<String> = Vec::new();
    let mut local = false;
    while let Some((file, depth)) = todo.pop() {
        if done.contains(&file) || done.len() >= MAX_INCLUDED {
            continue;
        }
        done.push(file.clone());
        let Ok(data) = read_project_file(root, &file) else {
            continue;
        };
        let text = String::from_utf8_lossy(&data);
        let dir = file.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        for line in text.lines() {
            if let Some(inc) = include(dir, line) {
                if depth < MAX_INCLUDE_DEPTH {
                    todo.push((inc, depth + 1));
                }
            } else if super::python::local_requirement(line).is_some() {
                local = true;
            }
        }
    }
    done.sort();
    (done, local)
}

/// The cache key (see the module's documentation). `runs_project_code`: setup runs code of
/// the project (given commands, a package installed from the checkout, npm's scripts).
pub fn cache_key(root: &Path, image: &str, uid: u32, commands: &[String], runs_project_code: bool) -> String {
    cache_key_as_found(root, image, uid, commands, runs_project_code, &BTreeMap::new())
}

/// The same key with the files setup wrote (`as_found`: paths from the root) as setup found
/// them: each one's state before setup ([`file_state`]), or `None` where it was not there. With
/// it, the next run's key is the one its cache was filled under while those files are as setup
/// left them (a `Cargo.lock` cargo wrote, a version file a build backend rewrote).
pub fn cache_key_as_found(
    root: &Path,
    image: &str,
    uid: u32,
    commands: &[String],
    runs_project_code: bool,
    as_found: &BTreeMap<String, Option<String>>,
) -> String {
    let mut h = Sha256::new();
    for part in [RULES, image] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(uid.to_le_bytes());
    for c in commands {
        h.update(c.as_bytes());
        h.update([0]);
    }
    // Each file by its state; one setup wrote, by its state before setup.
    let state = |rel: &str| match as_found.get(rel) {
        Some(Some(before)) => before.clone(),
        Some(None) => absent_state(rel),
        None => file_state(root, rel),
    };
    for f in ROOT_FILES {
        h.update(state(f).as_bytes());
    }
    let (requirements, local) = requirement_closure(root);
    for f in &requirements {
        h.update(state(f).as_bytes());
    }
    let files = walk(root);
    // A file setup created is left out of the walk: it was not there.
    let counted = |f: &str| !matches!(as_found.get(f), Some(None));
    match &files {
        Some(files) if runs_project_code || local => {
            h.update(b"every file\0");
            for f in files {
                let name = f.rsplit('/').next().unwrap_or(f);
                if !build_output(name) && counted(f) {
                    h.update(state(f).as_bytes());
                }
            }
        }
        Some(files) => {
            h.update(b"manifests\0");
            for f in files {
                let name = f.rsplit('/').next().unwrap_or(f);
                if f.contains('/') && TREE_MANIFESTS.contains(&name) && counted(f) {
                    h.update(state(f).as_bytes());
                }
            }
        }
        // Too many files to digest: a key no later run shares, so setup runs every time.
        None => h.update(uuid::Uuid::new_v4().as_bytes()),
    }
    hex(&h.finalize())[..16].to_string()
}

/// Each file the key may read — every regular file or link the whole-project digest covers —
/// with a digest of what it is; `None` past [`MAX_ENTRIES`]. Taken before and after setup, the
/// difference ([`written`]) is what setup wrote into the project.
pub fn file_states(root: &Path) -> Option<BTreeMap<String, String>> {
    Some(
        walk(root)?
            .into_iter()
            .filter(|f| !build_output(f.rsplit('/').next().unwrap_or(f)))
            .map(|f| {
                let state = file_state(root, &f);
                (f, state)
            })
            .collect(),
    )
}

/// One file's entry of [`file_states`]: a digest of its path and what it holds (a file that is
/// not there has one too, [`absent_state`]).
pub fn file_state(root: &Path, rel: &str) -> String {
    let mut h = Sha256::new();
    add_file(&mut h, root, rel);
    hex(&h.finalize())
}

/// The state of a file that is not there.
fn absent_state(rel: &str) -> String {
    let mut h = Sha256::new();
    absent(&mut h, rel);
    hex(&h.finalize())
}

/// What setup wrote: each file of `after` that is new or changed since `before`, with its state
/// after and before (`None`: it was not there).
pub fn written(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> BTreeMap<String, (String, Option<String>)> {
    after
        .iter()
        .filter(|(f, state)| before.get(*f) != Some(*state))
        .map(|(f, state)| (f.clone(), (state.clone(), before.get(f).cloned())))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::detect::project;

    fn key(root: &Path, code: bool) -> String {
        cache_key(root, "img", 1000, &["c".into()], code)
    }

    #[test]
    fn includes_are_followed_and_stay_inside() {
        assert_eq!(include("", "-r reqs/base.txt"), Some("reqs/base.txt".into()));
        assert_eq!(
            include("reqs", "-c ../constraints.txt"),
            Some("constraints.txt".into())
        );
        assert_eq!(include("", "--requirement=a.txt"), Some("a.txt".into()));
        assert_eq!(include("", "-r ../../etc/passwd"), None);
        assert_eq!(include("", "-r /etc/passwd"), None);
        assert_eq!(include("", "six==1"), None);
        let (_d, root) = project(&[
            ("requirements.txt", "-r reqs/base.txt\n"),
            ("reqs/base.txt", "-c ../constraints.txt\n-r more/x.txt\n"),
            ("reqs/more/x.txt", "./vendored\n"),
            ("constraints.txt", "six<2\n"),
        ]);
        let (files, local) = requirement_closure(&root);
        assert_eq!(
            files,
            [
                "constraints.txt",
                "reqs/base.txt",
                "reqs/more/x.txt",
                "requirements.txt"
            ]
        );
        assert!(local);
    }

    #[test]
    fn the_key_follows_what_setup_reads() {
        let (_d, root) = project(&[
            ("requirements.txt", "-r reqs/base.txt\n"),
            ("reqs/base.txt", "six\n"),
            ("crates/a/Cargo.toml", "[package]\n"),
            ("src/app.py", "x = 1\n"),
        ]);
        let k = key(&root, false);
        assert_eq!(k, key(&root, false));
        std::fs::write(root.join("reqs/base.txt"), "seven\n").unwrap();
        let k2 = key(&root, false);
        assert_ne!(k, k2, "an included file");
        std::fs::write(root.join("crates/a/Cargo.toml"), "[package]\nname = \"a\"\n").unwrap();
        let k3 = key(&root, false);
        assert_ne!(k2, k3, "a workspace member's manifest");
        for f in [".cargo/config.toml", "go.work", ".npmrc"] {
            std::fs::create_dir_all(root.join(f).parent().unwrap()).unwrap();
            std::fs::write(root.join(f), "x").unwrap();
            assert_ne!(k3, key(&root, false), "{f}");
            std::fs::remove_file(root.join(f)).unwrap();
        }
        std::fs::write(root.join("src/app.py"), "x = 2\n").unwrap();
        assert_eq!(k3, key(&root, false), "source is not read by a registry install");
        let all = key(&root, true);
        std::fs::write(root.join("src/app.py"), "x = 3\n").unwrap();
        assert_ne!(
            all,
            key(&root, true),
            "source is read by the project's own build code"
        );
        let all = key(&root, true);
        // What setup and the tests write does not change it.
        for f in [
            "src/app.egg-info/PKG-INFO",
            "src/_ext.cpython-313-x86_64-linux-gnu.so",
            "node_modules/x/package.json",
            "__pycache__/a.pyc",
            ".coverage",
            ".coverage.host.123.456",
            "htmlcov/index.html",
            ".hypothesis/examples/x",
        ] {
            std::fs::create_dir_all(root.join(f).parent().unwrap()).unwrap();
            std::fs::write(root.join(f), "x").unwrap();
        }
        assert_eq!(all, key(&root, true));
    }
}
