//! What the host must know about a bind-mounted project before the sandbox starts, and check
//! after it is gone: hard links that lead outside, git metadata whose hooks or config would run
//! on the host, and what changed — all of it, including what the diff cannot show.
//!
//! The scans read metadata only and never follow a link, so a hostile repository cannot point
//! them anywhere; the few files read (git configs) are regular files, bounded
//! ([`git::read_small`]). Before the run we record:
//! - every git entry (a `.git` of any type, or a directory git would take for a repository);
//! - the paths their configs make git run or read (hooks directory and each hook in it,
//!   included configs, scripts named by values), mounted read-only where they are real paths,
//!   and for each of them and its ancestors, which object it is (device, inode, and for
//!   non-directories size, times and mode) or that it does not exist;
//! - a fingerprint of every entry, for the host's own account of what changed.
//!
//! After the run, anything new that git would take for a repository, and any protected path
//! that is no longer the object it was (replaced, reached through a renamed parent, created
//! where nothing was), is moved out of the project into agentbox's data directory
//! ([`quarantine`]), where no link the sandbox left in the project can reach it.

pub mod git;
pub mod quarantine;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Entries fingerprinted for the host's account of changes; past this the account says it is
/// incomplete rather than costing unbounded memory (about 70 bytes an entry).
pub const MAX_ENTRIES: usize = 1_000_000;

/// How far one scan goes: the sandbox makes entries for free (a hard link costs no inode, and
/// one `exec` can make millions), and every entry is a `stat` on the host. Past either bound
/// the scan stops and says so ([`Scan::stopped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanBounds {
    /// Entries looked at (`--host-scan-limit`).
    pub entries: usize,
    /// Time spent (`--host-scan-timeout`).
    pub time: std::time::Duration,
}

impl Default for ScanBounds {
    fn default() -> Self {
        ScanBounds {
            entries: 2_000_000,
            time: std::time::Duration::from_secs(30),
        }
    }
}

impl ScanBounds {
    /// What stopped a scan, as the user can act on it.
    fn stop_reason(&self, entries: bool) -> String {
        if entries {
            format!("it stopped after {} entries (--host-scan-limit)", self.entries)
        } else {
            format!("it stopped after {}s (--host-scan-timeout)", self.time.as_secs())
        }
    }
}

/// How many paths of the "changed outside the diff" list a report carries.
pub const MAX_LISTED_CHANGES: usize = 1000;

#[derive(Debug, Default)]
pub struct Scan {
    /// Regular files (relative) sharing their inode with a file outside the project.
    pub linked_outside: Vec<PathBuf>,
    /// Every git entry (relative): anything named `.git` in any case and of any type, and
    /// directories git would take for a git directory.
    pub git: BTreeSet<PathBuf>,
    /// Directories the scan could not read.
    pub unreadable: Vec<PathBuf>,
    /// Every entry and its fingerprint, sorted by path.
    pub entries: Vec<(PathBuf, u64)>,
    /// More than [`MAX_ENTRIES`]: `entries` holds the first ones only.
    pub truncated: bool,
    /// Why the scan stopped before the end ([`ScanBounds`]): what it did not reach is unknown —
    /// its links, its git metadata, its changes.
    pub stopped: Option<String>,
}

/// Keys for the fingerprints, random per process: the sandbox controls most of what is
/// hashed (sizes, times, modes, link targets) and must not be able to aim at a collision.
fn hash_keys() -> &'static std::collections::hash_map::RandomState {
    static K: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    K.get_or_init(Default::default)
}

/// Which object is at a path, and in which state. A directory is its identity only (its times
/// change whenever an entry in it does; the entries speak for themselves). Anything else also
/// by its size, mode, times (the change time cannot be set back by the sandbox) and a link's
/// target.
fn fingerprint(path: &Path, meta: &std::fs::Metadata) -> u64 {
    let mut h = hash_keys().build_hasher();
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        0u8
    } else if ft.is_file() {
        1
    } else if ft.is_symlink() {
        2
    } else {
        3
    };
    (kind, meta.dev(), meta.ino(), meta.mode()).hash(&mut h);
    if kind != 0 {
        (
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
        )
            .hash(&mut h);
    }
    if kind == 2 {
        std::fs::read_link(path).ok().hash(&mut h);
    }
    h.finish()
}

fn fingerprint_at(path: &Path) -> Option<u64> {
    let meta = path.symlink_metadata().ok()?;
    Some(fingerprint(path, &meta))
}

pub fn scan(project: &Path, bounds: &ScanBounds) -> Scan {
    let started = std::time::Instant::now();
    let mut seen = 0usize;
    let mut out = Scan::default();
    // (dev, inode) → (links the file has, links found inside the project, first path seen).
    let mut inodes: HashMap<(u64, u64), (u64, u64, PathBuf)> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let dir = project.join(&rel_dir);
        let Ok(read) = std::fs::read_dir(&dir) else {
            out.unreadable.push(rel_dir);
            continue;
        };
        // Streamed: one directory of millions of entries (hard links cost the sandbox no
        // inodes) must not be held in memory at once. Whether the directory is shaped like a
        // git directory is decided from the names seen on the way; the project root included,
        // for git takes a root with HEAD, objects and refs for a repository too.
        let mut shape = git::GitDirShape::default();
        for entry in read.flatten() {
            seen += 1;
            if seen > bounds.entries {
                out.stopped = Some(bounds.stop_reason(true));
            } else if seen.is_multiple_of(1024) && started.elapsed() > bounds.time {
                out.stopped = Some(bounds.stop_reason(false));
            }
            if out.stopped.is_some() {
                out.truncated = true;
                stack.clear();
                break;
            }
            shape.see(&entry.file_name());
            let rel = rel_dir.join(entry.file_name());
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if out.entries.len() < MAX_ENTRIES {
                out.entries.push((rel.clone(), fingerprint(&entry.path(), &meta)));
            } else {
                out.truncated = true;
            }
            let ft = meta.file_type();
            if git::is_git_name(&entry.file_name()) {
                // Of any type: git follows a `.git` link, reads a `.git` file. Its contents are
                // git's; the entry as a whole is what must be protected.
                out.git.insert(rel);
                continue;
            }
            if ft.is_dir() {
                stack.push(rel);
            } else if ft.is_file() && meta.nlink() > 1 && inodes.len() < MAX_ENTRIES {
                let e = inodes
                    .entry((meta.dev(), meta.ino()))
                    .or_insert((meta.nlink(), 0, rel));
                e.1 += 1;
            }
        }
        if shape.is_git_dir() {
            out.git.insert(rel_dir);
        }
        if out.stopped.is_some() {
            break;
        }
    }
    out.entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    out.linked_outside = inodes
        .into_values()
        .filter(|(n, seen, _)| seen < n)
        .map(|(_, _, p)| p)
        .collect();
    out.linked_outside.sort();
    out
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

/// What the session must not change, worked out before it starts.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Protection {
    /// Mounted read-only on top of the project (relative; real paths, no link on the way).
    pub mounts: Vec<PathBuf>,
    /// The paths git would run or read (relative): each must be the same object afterwards,
    /// reached through the same directories, or still not exist.
    pub named: BTreeSet<PathBuf>,
    /// Fingerprints of the named paths and their ancestors (`None`: did not exist).
    pub watched: BTreeMap<PathBuf, Option<u64>>,
    /// Hooks directories with a hook installed (absolute): hooks that may run project files.
    pub active_hooks: Vec<PathBuf>,
}

/// Work out [`Protection`] for a project from its scan: every repository in it, read the way
/// git reads it (its config, `config.worktree`, the common directory's, includes, and the
/// user's own configs, whose relative `core.hooksPath` points into every worktree).
pub fn protection(project: &Path, scan: &Scan) -> Protection {
    let user_configs = git::user_config_paths();
    let mut named: BTreeSet<PathBuf> = BTreeSet::new();
    let mut absent: BTreeSet<PathBuf> = BTreeSet::new();
    let mut active_hooks = Vec::new();
    let mut run_dirs = BTreeSet::new();
    let found = scan.git.iter().map(|g| project.join(g));
    // A project that is no repository of its own may sit in one (a monorepo's subdirectory):
    // git run there uses that one. It is outside the project, so nothing of it is protected
    // itself, only what its config names inside.
    let own_repo = scan.git.iter().any(|g| {
        g.as_os_str().is_empty() || (g.parent() == Some(Path::new("")) && git::is_git_name(g.as_os_str()))
    });
    let enclosing = if own_repo {
        None
    } else {
        git::enclosing_repo(project)
    };
    for entry in found.chain(enclosing) {
        named.insert(entry.clone());
        let repo = git::Repo::open(&entry, &user_configs);
        named.extend(repo.git_dir.iter().cloned());
        named.extend(repo.common_dir.iter().cloned());
        named.extend(repo.configs.iter().map(|c| c.path.clone()));
        absent.extend(repo.absent_configs.iter().cloned());
        for (p, looks_like_path) in repo.named_paths() {
            if p.symlink_metadata().is_ok() {
                named.insert(p);
            } else if looks_like_path {
                absent.insert(p);
            }
        }
        if let Some(hooks) = repo.hooks_dir() {
            if hooks.symlink_metadata().is_ok() {
                named.insert(hooks.clone());
            } else {
                absent.insert(hooks.clone());
            }
            for name in git::HOOK_NAMES {
                let hook = hooks.join(name);
                if hook.symlink_metadata().is_ok() {
                    named.insert(hook);
                } else {
                    absent.insert(hook);
                }
            }
            // husky: `_/h` (v9) or `_/husky.sh` (v4–8) run the hook scripts one level up.
            if ["h", "husky.sh"].iter().any(|f| hooks.join(f).is_file())
                && let Some(parent) = hooks.parent()
            {
                named.insert(parent.to_path_buf());
            }
            if has_active_hook(&hooks) {
                active_hooks.push(hooks);
            }
        }
        run_dirs.insert(repo.run_dir);
    }
    if !active_hooks.is_empty() {
        for dir in &run_dirs {
            for c in git::HOOK_MANAGER_CONFIGS {
                let f = dir.join(c);
                if f.symlink_metadata().is_ok() {
                    named.insert(f);
                }
            }
        }
    }

    // A named link is watched as a link, and what it leads to inside the project is protected
    // too: git follows it.
    let mut real_targets = Vec::new();
    for p in &named {
        if p.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink())
            && let Ok(real) = p.canonicalize()
        {
            real_targets.push(real);
        }
    }
    named.extend(real_targets);

    let mut out = Protection {
        active_hooks,
        ..Default::default()
    };
    let mut mounts: BTreeSet<PathBuf> = BTreeSet::new();
    for p in &named {
        let Some(rel) = git::lexical_rel(project, p) else {
            continue;
        };
        if let Some(real_rel) = inside(project, p) {
            mounts.insert(real_rel);
        }
        watch_with_ancestors(project, &rel, &mut out.watched);
        out.named.insert(rel);
    }
    for p in &absent {
        let Some(rel) = git::lexical_rel(project, p) else {
            continue;
        };
        if out.named.contains(&rel) {
            continue;
        }
        watch_with_ancestors(project, &rel, &mut out.watched);
        out.named.insert(rel);
    }
    // Nested inside another protected path: already read-only.
    let all: Vec<PathBuf> = mounts.iter().cloned().collect();
    mounts.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    out.mounts = mounts.into_iter().collect();
    out
}

fn watch_with_ancestors(project: &Path, rel: &Path, watched: &mut BTreeMap<PathBuf, Option<u64>>) {
    let mut cur = PathBuf::new();
    for c in rel.components() {
        cur.push(c);
        watched
            .entry(cur.clone())
            .or_insert_with(|| fingerprint_at(&project.join(&cur)));
    }
}

/// A hooks directory with anything in it that git would run (not a `*.sample`).
fn has_active_hook(dir: &Path) -> bool {
    git::HOOK_NAMES
        .iter()
        .any(|name| dir.join(name).symlink_metadata().is_ok_and(|m| !m.is_dir()))
}

/// What changed on the host between two scans, by path (relative). Directories count only
/// when they appear, vanish or change mode; their contents are listed themselves.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HostChanges {
    pub paths: Vec<PathBuf>,
    /// One of the scans stopped at [`MAX_ENTRIES`]: there may be more.
    pub incomplete: bool,
}

pub fn changes(before: &Scan, after: &Scan) -> HostChanges {
    let mut paths = Vec::new();
    let (mut i, mut j) = (0, 0);
    let (a, b) = (&before.entries, &after.entries);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                if x.1 != y.1 {
                    paths.push(y.0.clone());
                }
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                paths.push(x.0.clone());
                i += 1;
            }
            (Some(x), None) => {
                paths.push(x.0.clone());
                i += 1;
            }
            (_, Some(y)) => {
                paths.push(y.0.clone());
                j += 1;
            }
            (None, None) => break,
        }
    }
    HostChanges {
        paths,
        incomplete: before.truncated || after.truncated,
    }
}

/// Everything recorded about a bind-mounted project before its session.
#[derive(Debug, Default)]
pub struct Baseline {
    pub scan: Scan,
    pub protection: Protection,
    /// The bounds of this scan, and of the one after the session.
    pub bounds: ScanBounds,
}

impl PartialEq for Baseline {
    fn eq(&self, other: &Self) -> bool {
        self.scan.entries == other.scan.entries && self.protection == other.protection
    }
}

impl Baseline {
    pub fn take(project: &Path, bounds: &ScanBounds) -> Baseline {
        let scan = scan(project, bounds);
        let protection = protection(project, &scan);
        Baseline {
            scan,
            protection,
            bounds: *bounds,
        }
    }
}

/// What the host found after a session.
#[derive(Debug, Default)]
pub struct HostCheck {
    pub warnings: Vec<String>,
    /// Every path that changed, by the host's own scan.
    pub changes: HostChanges,
    /// Something git would run could not be moved out of the project: the run must not end
    /// as a success.
    pub unresolved: bool,
}

/// Check a project against its baseline: quarantine git metadata that appeared and protected
/// paths that are no longer what they were, and list every change. Run it only when nothing
/// of the sandbox runs any more.
pub fn check(project: &Path, before: &Baseline, session: &str) -> HostCheck {
    let after = scan(project, &before.bounds);
    let mut suspects: BTreeMap<PathBuf, String> = BTreeMap::new();
    for new in after.git.difference(&before.scan.git) {
        let existed = new.as_os_str().is_empty()
            || before
                .scan
                .entries
                .binary_search_by(|(p, _)| p.as_path().cmp(new.as_path()))
                .is_ok();
        if existed && !new.file_name().is_some_and(git::is_git_name) {
            // A directory the project had (its root, `src/`) now looks like a git directory:
            // only what makes it one goes — git needs HEAD (or commondir) to take a directory
            // for a repository — and the project's own files stay.
            for name in defusing_entries(&project.join(new)) {
                suspects.insert(
                    new.join(name),
                    "makes a directory of the project look like a git repository".into(),
                );
            }
        } else {
            suspects.insert(new.clone(), "git metadata the session created".into());
        }
    }
    let watched = &before.protection.watched;
    for rel in &before.protection.named {
        // Inside a read-only mount nothing can change from the sandbox, and the mount point
        // itself cannot be renamed or removed (EBUSY): only the directories above it can. What
        // changed in there changed on the host (the user, meanwhile) and is not ours to move.
        let mount = before.protection.mounts.iter().find(|m| rel.starts_with(m));
        let changed_on_the_way = rel
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty() && mount.is_none_or(|m| !a.starts_with(m)))
            .find(|a| {
                watched
                    .get(*a)
                    .is_some_and(|fp| *fp != fingerprint_at(&project.join(a)))
            });
        let Some(changed) = changed_on_the_way else {
            continue;
        };
        let why = match (changed == rel.as_path(), watched.get(changed)) {
            (true, Some(None)) => "a path git would run or read, which did not exist before".to_string(),
            (true, _) => "a path git would run or read, replaced during the session".to_string(),
            (false, _) => format!(
                "a path git would run or read, now reached through {} which the session replaced or renamed",
                quote(changed)
            ),
        };
        suspects.entry(rel.clone()).or_insert(why);
    }
    // A directory the session made unreadable (or planted unreadable) may hide anything: it
    // goes as a whole.
    let before_unreadable: BTreeSet<&PathBuf> = before.scan.unreadable.iter().collect();
    for dir in after.unreadable.iter().filter(|d| !d.as_os_str().is_empty()) {
        if !before_unreadable.contains(dir) {
            suspects.insert(
                dir.clone(),
                "a directory the session left unreadable, so it cannot be checked for git metadata".into(),
            );
        }
    }
    // Every suspect is acted on where it really is: if a directory on its way is no longer a
    // real directory (a link the sandbox made), that link is the suspect, never what it leads
    // to (the project's own `.git`, or a path outside the project).
    let suspects: BTreeMap<PathBuf, String> = suspects
        .into_iter()
        .filter_map(|(rel, why)| match first_non_directory(project, &rel) {
            Ok(()) if project.join(&rel).symlink_metadata().is_ok() => Some((rel, why)),
            Ok(()) => None,
            Err(link) => Some((link, format!("{why} (reached through it)"))),
        })
        .collect();
    // The outermost of nested suspects carries the rest along.
    let all: Vec<PathBuf> = suspects.keys().cloned().collect();
    let suspects: BTreeMap<PathBuf, String> = suspects
        .into_iter()
        .filter(|(p, _)| !all.iter().any(|q| q != p && p.starts_with(q)))
        .collect();

    let mut warnings = Vec::new();
    let mut unresolved = false;
    for (rel, why) in &suspects {
        let shown = quote(rel);
        match quarantine::move_out(project, rel, session) {
            Ok(to) => warnings.push(format!(
                "{shown}: {why}; moved out of the project to {} so that nothing in it runs on your \
                 machine. Inspect it there; move it back only if you trust it",
                quote(&to)
            )),
            Err(e) => {
                unresolved = true;
                warnings.push(format!(
                    "{shown}: {why}, and it could not be moved away ({e}): do not run git in this project \
                     before inspecting it"
                ));
            }
        }
    }
    for dir in after
        .unreadable
        .iter()
        .filter(|d| !d.as_os_str().is_empty() && before_unreadable.contains(d))
    {
        warnings.push(format!(
            "{} cannot be read, so it was not checked for planted git metadata: inspect it",
            quote(dir)
        ));
    }
    if let Some(why) = &after.stopped {
        // Planted git metadata is looked for by the same walk: what it did not reach was not
        // checked. Said, like an unreadable directory, rather than walking on without bound.
        warnings.push(format!(
            "the host's scan of the project after the session was incomplete ({why}): git metadata \
             the session may have planted past that point was not looked for, and the account of \
             changes is incomplete. Inspect the project (`find . -name .git`) before running git in it"
        ));
    }
    let changes = changes(&before.scan, &after);
    if !changes.paths.is_empty() {
        for hooks in &before.protection.active_hooks {
            warnings.push(format!(
                "this repository has git hooks installed ({}); hooks that run the project's own files \
                 (a hook manager's config, `npm test`, a script) run what the session left there. Review \
                 the changes before your next commit, or commit once with `git -c core.hooksPath=/dev/null`",
                quote(hooks)
            ));
        }
    }
    HostCheck {
        warnings,
        changes,
        unresolved,
    }
}

/// The entries named HEAD or commondir, in any case, in `dir`.
fn defusing_entries(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name())
                .filter(|n| {
                    n.to_str().is_some_and(|n| {
                        n.eq_ignore_ascii_case("head") || n.eq_ignore_ascii_case("commondir")
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `Err(prefix)`: the first proper ancestor of `rel` (from the project down) that is not a
/// real directory now — a link, a file, or missing; `Ok` when every one is a directory.
fn first_non_directory(project: &Path, rel: &Path) -> Result<(), PathBuf> {
    let mut cur = PathBuf::new();
    let parts: Vec<_> = rel.components().collect();
    for c in parts.iter().take(parts.len().saturating_sub(1)) {
        cur.push(c);
        match project.join(&cur).symlink_metadata() {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(cur),
            // Missing: nothing below it to act on.
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// A path for a message: C-quoted as git quotes names, so no name can forge lines.
pub fn quote(p: &Path) -> String {
    crate::gitquote::quote_path(p.as_os_str().as_encoded_bytes())
}

/// Holds a bind-mounted project's baseline until [`HostGuard::finish`], which runs the check
/// once: after the session, or from the run's cleanup if the session was cut short.
#[derive(Debug)]
pub struct HostGuard {
    project: PathBuf,
    baseline: std::sync::Arc<Baseline>,
    session: String,
    done: std::sync::atomic::AtomicBool,
}

impl HostGuard {
    pub fn new(project: &Path, baseline: std::sync::Arc<Baseline>, session: &str) -> HostGuard {
        HostGuard {
            project: project.to_path_buf(),
            baseline,
            session: session.to_string(),
            done: Default::default(),
        }
    }

    /// A guard with nothing left to check: [`HostGuard::finish`] returns `None` (for what holds
    /// guards, e.g. the cleanup's own tests).
    pub fn finished() -> HostGuard {
        let g = HostGuard::new(Path::new("/nonexistent"), Default::default(), "test");
        g.done.store(true, std::sync::atomic::Ordering::Relaxed);
        g
    }

    /// The check, once: later calls return `None`.
    pub fn finish(&self) -> Option<HostCheck> {
        if self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return None;
        }
        Some(check(&self.project, &self.baseline, &self.session))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_data_dir<T>(f: impl FnOnce(&Path) -> T) -> T {
        let data = tempfile::tempdir().unwrap();
        quarantine::set_test_root(data.path());
        f(data.path())
    }

    #[test]
    fn finds_links_leading_outside_but_not_links_within() {
        let outside = tempfile::tempdir().unwrap();
        let p = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("cache.py"), "x").unwrap();
        std::fs::create_dir_all(p.path().join(".venv/lib")).unwrap();
        std::fs::hard_link(outside.path().join("cache.py"), p.path().join(".venv/lib/mod.py")).unwrap();
        std::fs::write(p.path().join("a.txt"), "a").unwrap();
        std::fs::hard_link(p.path().join("a.txt"), p.path().join("b.txt")).unwrap();
        let s = scan(p.path(), &ScanBounds::default());
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
        // git takes a dangling `HEAD -> refs/heads/main` link, and a `.git` that is a link.
        std::fs::create_dir_all(root.join("tools/cache/objects")).unwrap();
        std::fs::create_dir_all(root.join("tools/cache/refs/heads")).unwrap();
        std::os::unix::fs::symlink("refs/heads/main", root.join("tools/cache/HEAD")).unwrap();
        std::fs::create_dir_all(root.join("docs")).unwrap();
        std::os::unix::fs::symlink("../tools/cache", root.join("docs/.git")).unwrap();
        // A linked worktree's git directory: HEAD and commondir only.
        std::fs::create_dir_all(root.join("wt")).unwrap();
        std::fs::write(root.join("wt/HEAD"), "ref: refs/heads/x").unwrap();
        std::fs::write(root.join("wt/commondir"), "../bare").unwrap();
        let s = scan(root, &ScanBounds::default());
        let git: Vec<&Path> = s.git.iter().map(|p| p.as_path()).collect();
        assert_eq!(
            git,
            [
                Path::new(".git"),
                Path::new("bare"),
                Path::new("deep/.GIT"),
                Path::new("docs/.git"),
                Path::new("lib/sub/.git"),
                Path::new("tools/cache"),
                Path::new("wt"),
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
        std::fs::write(
            root.join(".gitconfig-extra"),
            "[core]\n\tsshCommand = tools/ssh.sh\n",
        )
        .unwrap();
        std::fs::write(
            root.join(".git/config"),
            "[core]\n\thooksPath = .husky/_\n\tfsmonitor = sh fsmon.sh\n[include]\n\tpath = ../.gitconfig-extra\n[remote \"o\"]\n\turl = /elsewhere\n",
        )
        .unwrap();
        let protection = protection(&root, &scan(&root, &ScanBounds::default()));
        let want: Vec<PathBuf> = [".git", ".gitconfig-extra", ".husky/_", "fsmon.sh"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(protection.mounts, want);
        // Named but missing: must still be missing afterwards.
        for absent in ["tools/ssh.sh", ".husky/_/pre-commit"] {
            assert_eq!(protection.watched.get(Path::new(absent)), Some(&None), "{absent}");
        }
        assert!(
            protection
                .watched
                .get(Path::new(".husky"))
                .is_some_and(|f| f.is_some())
        );
    }

    #[test]
    fn new_git_metadata_is_moved_out_of_the_project() {
        with_data_dir(|data| {
            let p = tempfile::tempdir().unwrap();
            let root = p.path();
            std::fs::create_dir_all(root.join(".git")).unwrap();
            let before = Baseline::take(root, &ScanBounds::default());
            std::fs::create_dir_all(root.join("sub/.git")).unwrap();
            let check = check(root, &before, "s1");
            assert_eq!(check.warnings.len(), 1, "{:?}", check.warnings);
            assert!(!root.join("sub/.git").exists());
            assert!(data.join("quarantine/s1/sub/.git").is_dir());
            assert!(root.join(".git").exists(), "the project's own is left alone");
            assert_eq!(
                check.changes.paths,
                [PathBuf::from("sub"), PathBuf::from("sub/.git")]
            );
        })
    }

    #[test]
    fn a_replaced_or_created_hook_path_is_moved_out() {
        with_data_dir(|data| {
            let p = tempfile::tempdir().unwrap();
            let root = p.path().canonicalize().unwrap();
            std::fs::create_dir_all(root.join(".git")).unwrap();
            std::fs::create_dir_all(root.join(".husky/_")).unwrap();
            std::fs::write(root.join(".husky/_/pre-commit"), "ok").unwrap();
            std::fs::write(
                root.join(".git/config"),
                "[core]\n\thooksPath = .husky/_\n[x]\n\ty = scripts/later.sh\n",
            )
            .unwrap();
            let before = Baseline::take(&root, &ScanBounds::default());
            // The parent renamed (the read-only mount moves with it), a new hook in its place,
            // and a script created where the config names one.
            std::fs::rename(root.join(".husky"), root.join(".husky-old")).unwrap();
            std::fs::create_dir_all(root.join(".husky/_")).unwrap();
            std::fs::write(root.join(".husky/_/pre-commit"), "evil").unwrap();
            std::fs::create_dir_all(root.join("scripts")).unwrap();
            std::fs::write(root.join("scripts/later.sh"), "evil").unwrap();
            let check = check(&root, &before, "s2");
            assert!(!root.join(".husky/_/pre-commit").exists(), "{:?}", check.warnings);
            assert!(!root.join("scripts/later.sh").exists());
            assert!(data.join("quarantine/s2/scripts/later.sh").is_file());
            assert_eq!(
                std::fs::read_to_string(root.join(".husky-old/_/pre-commit")).unwrap(),
                "ok"
            );
            let moved = check
                .warnings
                .iter()
                .filter(|w| w.contains("moved out of the project"))
                .count();
            assert_eq!(moved, 2, "{:?}", check.warnings);
            assert!(
                check.warnings.iter().any(|w| w.contains("git hooks installed")),
                "hooks that run project files are warned about: {:?}",
                check.warnings
            );
        })
    }

    #[test]
    fn the_quarantine_cannot_complete_a_planted_link() {
        with_data_dir(|_| {
            let p = tempfile::tempdir().unwrap();
            let root = p.path();
            let before = Baseline::take(root, &ScanBounds::default());
            for d in ["vendor/cache/objects", "vendor/cache/refs", "docs"] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            std::fs::write(root.join("vendor/cache/HEAD"), "ref: refs/heads/main").unwrap();
            std::os::unix::fs::symlink("../vendor/cache-agentbox-quarantine", root.join("docs/.git"))
                .unwrap();
            let check = check(root, &before, "s3");
            assert!(root.join("docs").is_dir());
            assert!(
                root.join("docs/.git").symlink_metadata().is_err(),
                "{:?}",
                check.warnings
            );
            let names: Vec<_> = std::fs::read_dir(root.join("vendor")).unwrap().collect();
            assert!(names.is_empty(), "nothing left for a link to reach");
        })
    }

    #[test]
    fn a_directory_of_the_project_made_a_repository_loses_only_its_head() {
        with_data_dir(|data| {
            let p = tempfile::tempdir().unwrap();
            let root = p.path();
            std::fs::create_dir_all(root.join("src")).unwrap();
            std::fs::write(root.join("src/a.py"), "mine").unwrap();
            let before = Baseline::take(root, &ScanBounds::default());
            for d in ["src/objects", "src/refs", "objects", "refs"] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            std::fs::write(root.join("src/HEAD"), "ref: refs/heads/main").unwrap();
            std::fs::write(root.join("HEAD"), "ref: refs/heads/main").unwrap();
            let check = check(root, &before, "s5");
            assert_eq!(std::fs::read_to_string(root.join("src/a.py")).unwrap(), "mine");
            assert!(
                !root.join("src/HEAD").exists() && !root.join("HEAD").exists(),
                "{:?}",
                check.warnings
            );
            assert!(data.join("quarantine/s5/src/HEAD").is_file());
            assert!(!check.unresolved);
        })
    }

    #[test]
    fn on_another_file_system_the_quarantine_is_next_to_the_project() {
        // /dev/shm is a tmpfs: never the file system of a project in a temporary directory.
        let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let p = tempfile::tempdir().unwrap();
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(shm.path()).unwrap().dev() == std::fs::metadata(p.path()).unwrap().dev() {
            return;
        }
        quarantine::set_test_root(shm.path());
        let project = p.path().join("proj");
        std::fs::create_dir_all(project.join("sub")).unwrap();
        let before = Baseline::take(&project, &ScanBounds::default());
        std::fs::create_dir_all(project.join("sub/.git")).unwrap();
        let session = format!("s6-{}", std::process::id());
        let check = check(&project, &before, &session);
        let holding = p.path().join(".agentbox-quarantine").join(&session);
        assert!(holding.join("sub/.git").is_dir(), "{:?}", check.warnings);
        assert!(!project.join("sub/.git").exists());
        assert!(!check.unresolved);
    }

    #[test]
    fn the_host_account_sees_ignored_and_changed_files() {
        let p = tempfile::tempdir().unwrap();
        let root = p.path();
        std::fs::create_dir_all(root.join(".venv/lib")).unwrap();
        std::fs::write(root.join("a.py"), "x").unwrap();
        std::fs::write(root.join("gone.py"), "x").unwrap();
        let before = scan(root, &ScanBounds::default());
        std::fs::write(root.join(".venv/lib/evil.pth"), "import os").unwrap();
        std::fs::remove_file(root.join("gone.py")).unwrap();
        // Same size, same mtime put back: the change time still tells.
        let mtime = std::fs::metadata(root.join("a.py")).unwrap().modified().unwrap();
        std::fs::write(root.join("a.py"), "y").unwrap();
        std::fs::File::options()
            .write(true)
            .open(root.join("a.py"))
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let got = changes(&before, &scan(root, &ScanBounds::default()));
        let want: Vec<PathBuf> = [".venv/lib/evil.pth", "a.py", "gone.py"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(got.paths, want);
    }

    #[test]
    fn a_scan_stops_at_its_bound_and_says_why() {
        let p = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(p.path().join(i.to_string()), "x").unwrap();
        }
        let bounds = ScanBounds {
            entries: 10,
            time: std::time::Duration::from_secs(60),
        };
        let s = scan(p.path(), &bounds);
        assert_eq!(s.entries.len(), 10);
        assert!(s.truncated);
        assert_eq!(
            s.stopped.as_deref(),
            Some("it stopped after 10 entries (--host-scan-limit)")
        );
        let all = scan(p.path(), &ScanBounds::default());
        assert_eq!((all.entries.len(), all.stopped), (50, None));
    }
}
