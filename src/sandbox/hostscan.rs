//! What the host must know about a project before mounting it, and check after: hard links
//! that lead outside it, and git metadata whose hooks or config would run on the host.
//!
//! The scan reads metadata only and never follows a symlink, so a hostile repository cannot
//! point it anywhere. It runs before the sandbox starts and after it is gone.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

#[derive(Debug, Default)]
pub struct Scan {
    /// Regular files (relative) sharing their inode with a file outside the project.
    pub linked_outside: Vec<PathBuf>,
    /// Every git directory or `.git` file (relative): entries named `.git` in any case, and
    /// directories shaped like a bare repository (HEAD, objects/, refs/).
    pub git: BTreeSet<PathBuf>,
    /// Directories the scan could not read.
    pub unreadable: Vec<PathBuf>,
}

fn is_git_name(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|n| n.eq_ignore_ascii_case(".git"))
}

fn looks_like_bare_repo(dir: &Path) -> bool {
    dir.join("HEAD").is_file() && dir.join("objects").is_dir() && dir.join("refs").is_dir()
}

pub fn scan(project: &Path) -> Scan {
    let mut out = Scan::default();
    // (dev, inode) → (links the file has, links found inside the project, first path seen).
    let mut inodes: HashMap<(u64, u64), (u64, u64, PathBuf)> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let dir = project.join(&rel_dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            out.unreadable.push(rel_dir);
            continue;
        };
        for entry in entries.flatten() {
            let rel = rel_dir.join(entry.file_name());
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            let ft = meta.file_type();
            if is_git_name(&entry.file_name()) && !ft.is_symlink() {
                // Its contents are git's; the entry as a whole is what must be protected.
                out.git.insert(rel);
                continue;
            }
            if ft.is_dir() {
                if looks_like_bare_repo(&entry.path()) {
                    out.git.insert(rel.clone());
                }
                stack.push(rel);
            } else if ft.is_file() && meta.nlink() > 1 {
                let e = inodes
                    .entry((meta.dev(), meta.ino()))
                    .or_insert((meta.nlink(), 0, rel));
                e.1 += 1;
            }
        }
    }
    out.linked_outside = inodes
        .into_values()
        .filter(|(n, seen, _)| seen < n)
        .map(|(_, _, p)| p)
        .collect();
    out.linked_outside.sort();
    out
}

/// Paths inside the project named by a git config's values (`core.hooksPath = .husky/_`,
/// `include.path`, an fsmonitor script, a filter's program...): they decide what git runs on
/// the host, so the sandbox must not be able to change them. Tokens are tried relative to the
/// project root and to the config's own directory.
pub fn paths_named_by_config(project: &Path, git_dir: &Path, config: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for line in config.lines() {
        let Some((_, value)) = line.split_once('=') else {
            continue;
        };
        for token in value.split_whitespace() {
            let token = token.trim_matches(|c| c == '"' || c == '\'');
            if token.is_empty() || token.starts_with('-') {
                continue;
            }
            let candidates = if Path::new(token).is_absolute() {
                vec![PathBuf::from(token)]
            } else {
                vec![project.join(token), git_dir.join(token)]
            };
            for c in candidates {
                if let Some(rel) = inside(project, &c) {
                    found.push(rel);
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// `path` relative to `project`, if it exists, is inside, is not a symlink, and no directory on
/// the way is one either (a bind mount of it must not resolve anywhere else).
pub fn inside(project: &Path, path: &Path) -> Option<PathBuf> {
    let meta = path.symlink_metadata().ok()?;
    if meta.file_type().is_symlink() {
        return None;
    }
    let real = path.canonicalize().ok()?;
    let rel = real.strip_prefix(project).ok()?.to_path_buf();
    (project.join(&rel) == real && !rel.as_os_str().is_empty()).then_some(rel)
}

/// The read-only mounts a project needs: every git entry, and what their configs name.
pub fn protected_paths(project: &Path, scan: &Scan) -> Vec<PathBuf> {
    let mut paths: BTreeSet<PathBuf> = scan
        .git
        .iter()
        .filter_map(|g| inside(project, &project.join(g)))
        .collect();
    for g in &scan.git {
        let dir = project.join(g);
        for config in [dir.join("config"), dir.clone()] {
            if config.is_file()
                && let Ok(text) = std::fs::read_to_string(&config)
                && text.len() < 1 << 20
            {
                paths.extend(paths_named_by_config(project, &dir, &text));
            }
        }
    }
    // Nested inside another protected path: already read-only.
    let all: Vec<PathBuf> = paths.iter().cloned().collect();
    paths.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    paths.into_iter().collect()
}

/// Git metadata that appeared during a session: moved out of the way, on the host, and
/// reported. Between the scans nothing of ours writes the project, so a new entry came from
/// the sandbox.
pub fn quarantine_new(project: &Path, before: &BTreeSet<PathBuf>) -> Vec<String> {
    let after = scan(project);
    let mut warnings = Vec::new();
    for new in after.git.difference(before) {
        let from = project.join(new);
        let mut n = 0;
        let to = loop {
            let suffix = if n == 0 { String::new() } else { format!("-{n}") };
            let candidate = PathBuf::from(format!("{}-agentbox-quarantine{suffix}", from.display()));
            if candidate.symlink_metadata().is_err() {
                break candidate;
            }
            n += 1;
        };
        match std::fs::rename(&from, &to) {
            Ok(()) => warnings.push(format!(
                "the session created {} — renamed to {} so that no git hook or config in it runs on your \
                 machine; inspect it, then delete it",
                new.display(),
                to.strip_prefix(project).unwrap_or(&to).display()
            )),
            Err(e) => warnings.push(format!(
                "the session created {} and it could not be moved away ({e}): do not run git there before \
                 inspecting it",
                new.display()
            )),
        }
    }
    for dir in after.unreadable.iter().filter(|d| !d.as_os_str().is_empty()) {
        warnings.push(format!(
            "{} cannot be read, so it was not checked for planted git metadata: inspect it",
            dir.display()
        ));
    }
    warnings
}

/// A project and its git entries at the start.
type Started = (PathBuf, BTreeSet<PathBuf>);

/// Projects whose post-session check has not run yet: an interruption runs it on the way out.
fn pending() -> &'static Mutex<Vec<Started>> {
    static P: OnceLock<Mutex<Vec<Started>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

/// Remember a bind-mounted project's git entries until [`GitGuard::finish`].
#[derive(Debug)]
pub struct GitGuard {
    project: PathBuf,
    before: BTreeSet<PathBuf>,
}

impl GitGuard {
    pub fn start(project: &Path, before: BTreeSet<PathBuf>) -> GitGuard {
        pending()
            .lock()
            .expect("guard lock")
            .push((project.to_path_buf(), before.clone()));
        GitGuard {
            project: project.to_path_buf(),
            before,
        }
    }

    /// Check for planted git metadata; the warnings say what was found and done.
    pub fn finish(&self) -> Vec<String> {
        pending()
            .lock()
            .expect("guard lock")
            .retain(|(p, _)| p != &self.project);
        quarantine_new(&self.project, &self.before)
    }
}

/// For the interruption path: every project whose check did not run.
pub fn finish_pending() -> Vec<String> {
    let all: Vec<Started> = pending().lock().expect("guard lock").drain(..).collect();
    all.iter()
        .flat_map(|(p, before)| quarantine_new(p, before))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_links_leading_outside_but_not_links_within() {
        let outside = tempfile::tempdir().unwrap();
        let p = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("cache.py"), "x").unwrap();
        std::fs::create_dir_all(p.path().join(".venv/lib")).unwrap();
        std::fs::hard_link(outside.path().join("cache.py"), p.path().join(".venv/lib/mod.py")).unwrap();
        std::fs::write(p.path().join("a.txt"), "a").unwrap();
        std::fs::hard_link(p.path().join("a.txt"), p.path().join("b.txt")).unwrap();
        let s = scan(p.path());
        assert_eq!(s.linked_outside, [PathBuf::from(".venv/lib/mod.py")]);
    }

    #[test]
    fn finds_git_entries_of_every_kind() {
        let p = tempfile::tempdir().unwrap();
        let root = p.path();
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(root.join("lib/sub")).unwrap();
        std::fs::write(root.join("lib/sub/.git"), "gitdir: ../../.git/modules/sub").unwrap();
        std::fs::create_dir_all(root.join("deep/.GIT")).unwrap();
        std::fs::create_dir_all(root.join("bare/objects")).unwrap();
        std::fs::create_dir_all(root.join("bare/refs")).unwrap();
        std::fs::write(root.join("bare/HEAD"), "ref: refs/heads/main").unwrap();
        let s = scan(root);
        let git: Vec<&Path> = s.git.iter().map(|p| p.as_path()).collect();
        assert_eq!(
            git,
            [
                Path::new(".git"),
                Path::new("bare"),
                Path::new("deep/.GIT"),
                Path::new("lib/sub/.git")
            ]
        );
    }

    #[test]
    fn config_values_naming_project_paths_are_protected() {
        let p = tempfile::tempdir().unwrap();
        let root = p.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join(".husky/_")).unwrap();
        std::fs::write(root.join("fsmon.sh"), "#!/bin/sh").unwrap();
        std::fs::write(root.join(".gitconfig-extra"), "").unwrap();
        std::fs::write(
            root.join(".git/config"),
            "[core]\n\thooksPath = .husky/_\n\tfsmonitor = sh fsmon.sh\n[include]\n\tpath = ../.gitconfig-extra\n[remote \"o\"]\n\turl = /elsewhere\n",
        )
        .unwrap();
        let protected = protected_paths(&root, &scan(&root));
        let want: Vec<PathBuf> = [".git", ".gitconfig-extra", ".husky/_", "fsmon.sh"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(protected, want);
    }

    #[test]
    fn new_git_metadata_is_quarantined() {
        let p = tempfile::tempdir().unwrap();
        let root = p.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        let before = scan(root).git;
        std::fs::create_dir_all(root.join("sub/.git")).unwrap();
        let warnings = quarantine_new(root, &before);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(!root.join("sub/.git").exists());
        assert!(root.join("sub/.git-agentbox-quarantine").exists());
        assert!(root.join(".git").exists(), "the project's own is left alone");
    }
}
