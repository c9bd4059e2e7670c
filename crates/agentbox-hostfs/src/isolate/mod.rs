//! `--isolate`: copy the project in, bring a patch out. The host directory is only read (to
//! pack it) until the user asks for `--apply`, and then it is written only with what changed,
//! refusing if the host files changed meanwhile.
//!
//! Everything the sandbox left is hostile data here: names may hold any byte ([`names`]),
//! links may be chained to lead outside ([`links`]), the project may hold FIFOs and the
//! sandbox huge files ([`hostfs`], [`readback`]).

pub mod hostfs;
pub mod links;
pub mod names;
pub mod patch;
pub mod readback;
pub mod wire;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha1::Sha1;
use sha2::{Digest, Sha256};

use hostfs::{OpenError, Owner, open_regular};
pub use names::RelPath;
pub use readback::{ChangeSet, Skip, Skipped};

/// Caches that tools rewrite at will: never brought back out of an isolated sandbox, and left
/// out of the change snapshot and of what the agent lists or searches (the CLI's `project`).
pub const CACHE_DIRS: &[&str] = &[
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
];

#[derive(Debug, thiserror::Error)]
pub enum IsolateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to apply: {0}")]
    Refused(String),
    #[error("the sandbox returned an unreadable archive for {path}: {reason}")]
    Archive { path: String, reason: String },
    #[error(
        "the sandbox's files came to more than the {budget} bytes agentbox reads back \
         (what was listed before reading, and what was copied in, allow no more)"
    )]
    TooMuch { budget: u64 },
    #[error("reading the sandbox's files back took longer than {0} s")]
    TooSlow(u64),
}

/// What a path was when the project was packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    File {
        sha256: [u8; 32],
        /// git's blob id, so a patch can name the original without reading it again.
        blob: [u8; 20],
        size: u64,
        mode: u32,
    },
    Symlink {
        target: PathBuf,
    },
}

/// Every packed path and what it was.
#[derive(Debug, Default, Clone)]
pub struct Manifest {
    pub entries: BTreeMap<RelPath, Entry>,
}

pub struct Packed {
    pub tar: tempfile::NamedTempFile,
    pub manifest: Manifest,
    pub bytes: u64,
    /// What was left out of the copy, and why (one line each, for the user).
    pub left_out: Vec<String>,
}

/// Whether a link's target, taken relative to the link's directory (`rel`'s parent), climbs
/// above the project's root. The engine's archive API refuses such a link outright ("invalid
/// symlink"), failing the whole copy; an absolute target is taken inside the extraction
/// directory by it, and is copied.
fn climbs_out(rel: &Path, target: &Path) -> bool {
    use std::path::Component;
    let mut depth = rel.parent().map_or(0, |p| p.components().count());
    for c in target.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return false,
            Component::ParentDir if depth == 0 => return true,
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
        }
    }
    false
}

/// Hashes what passes through, for the manifest, while the tar builder copies it.
struct Hashing<R> {
    inner: R,
    sha256: Sha256,
    sha1: Sha1,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let got = self.inner.read(buf)?;
        self.sha256.update(&buf[..got]);
        self.sha1.update(&buf[..got]);
        self.n += got as u64;
        Ok(got)
    }
}

/// Tar the project (symlinks as symlinks, never followed; sockets, fifos and devices
/// skipped, and never opened), owned by `uid:gid` inside, and record what each path was.
pub fn pack(
    project: &Path,
    uid: u32,
    gid: u32,
    exclude: &dyn Fn(&RelPath) -> bool,
) -> Result<Packed, IsolateError> {
    let read_err = |p: &Path| {
        let path = p.display().to_string();
        move |source| IsolateError::Read { path, source }
    };
    let tar_file = tempfile::Builder::new()
        .prefix("agentbox-pack-")
        .suffix(".tar")
        .tempfile()
        .map_err(read_err(project))?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(
        tar_file.reopen().map_err(read_err(project))?,
    ));
    builder.follow_symlinks(false);
    let mut manifest = Manifest::default();
    let mut bytes = 0u64;
    let mut left_out = Vec::new();
    let mut stack: Vec<Option<RelPath>> = vec![None];
    while let Some(rel_dir) = stack.pop() {
        let dir = match &rel_dir {
            Some(r) => project.join(r.as_path()),
            None => project.to_path_buf(),
        };
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(read_err(&dir))?
            .collect::<Result<_, _>>()
            .map_err(read_err(&dir))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name();
            let mut key = rel_dir
                .as_ref()
                .map(|r| r.as_bytes().to_vec())
                .unwrap_or_default();
            if !key.is_empty() {
                key.push(b'/');
            }
            key.extend_from_slice(name.as_bytes());
            let Some(key) = RelPath::new(key) else { continue };
            if exclude(&key) {
                continue;
            }
            let full = project.join(key.as_path());
            let meta = std::fs::symlink_metadata(&full).map_err(read_err(&full))?;
            let mut header = tar::Header::new_gnu();
            header.set_uid(uid as u64);
            header.set_gid(gid as u64);
            header.set_mtime(meta.mtime().max(0) as u64);
            header.set_mode(meta.mode() & 0o7777);
            let ft = meta.file_type();
            if ft.is_dir() {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, key.as_path(), std::io::empty())
                    .map_err(read_err(&full))?;
                manifest.entries.insert(key.clone(), Entry::Dir);
                stack.push(Some(key));
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&full).map_err(read_err(&full))?;
                if climbs_out(key.as_path(), &target) {
                    // Nothing inside the copy is there to resolve to; left out of the copy and
                    // of the manifest (the read-back takes it for untouched, never deleted).
                    left_out.push(format!(
                        "{} is a symbolic link leading out of the project (to {}); it is left out of \
                         the copy (the sandbox does not have it; the project keeps it)",
                        crate::hostscan::quote(key.as_path()),
                        crate::hostscan::quote(&target)
                    ));
                    continue;
                }
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder
                    .append_link(&mut header, key.as_path(), &target)
                    .map_err(read_err(&full))?;
                manifest.entries.insert(key, Entry::Symlink { target });
            } else if ft.is_file() {
                let (file, meta) = match open_regular(&full) {
                    Ok(opened) => opened,
                    // Swapped for something else since the lstat: like any special file, not
                    // copied in.
                    Err(OpenError::NotRegular(_)) => continue,
                    Err(OpenError::Io(e)) => return Err(read_err(&full)(e)),
                };
                let size = meta.len();
                let mut sha1 = Sha1::new();
                sha1.update(format!("blob {size}\0").as_bytes());
                // Exactly `size` bytes, hashed as they go into the archive: one read, and the
                // manifest describes what the sandbox got.
                let mut hashing = Hashing {
                    inner: file.take(size),
                    sha256: Sha256::new(),
                    sha1,
                    n: 0,
                };
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(size);
                builder
                    .append_data(&mut header, key.as_path(), &mut hashing)
                    .map_err(read_err(&full))?;
                if hashing.n != size {
                    return Err(read_err(&full)(std::io::Error::other(
                        "it changed while it was being copied",
                    )));
                }
                bytes += size;
                manifest.entries.insert(
                    key,
                    Entry::File {
                        sha256: hashing.sha256.finalize().into(),
                        blob: hashing.sha1.finalize().into(),
                        size,
                        mode: meta.mode() & 0o7777,
                    },
                );
            }
        }
    }
    builder
        .into_inner()
        .and_then(|mut w| w.flush())
        .map_err(read_err(project))?;
    Ok(Packed {
        tar: tar_file,
        manifest,
        bytes,
        left_out,
    })
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    /// Its content, or whether it is executable.
    Modified,
    Deleted,
    /// A file became a link, or the reverse.
    TypeChanged,
}

#[cfg(test)]
impl ChangeKind {
    /// git's letter for it (`--name-status`): how the tests name an expected change.
    pub(crate) fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
            ChangeKind::TypeChanged => 'T',
        }
    }
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub status: ChangeKind,
    pub path: RelPath,
}

/// The new state of a changed path, from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    File { data: Vec<u8>, mode: u32 },
    Symlink(PathBuf),
}

fn is_git_component(c: &[u8]) -> bool {
    // Case-insensitively: on a case-insensitive file system `.GIT` is `.git`.
    c.eq_ignore_ascii_case(b".git")
}

/// Every existing ancestor of `rel` under `project` must be a real directory: a symlink there
/// (planted by the sandbox, or already on the host) could send a write outside the project.
fn check_ancestors(project: &Path, rel: &RelPath) -> Result<(), IsolateError> {
    for a in rel.ancestors() {
        match std::fs::symlink_metadata(project.join(a.as_path())) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(m) => {
                return Err(IsolateError::Refused(format!(
                    "{a} is {} on the host, not a plain directory",
                    hostfs::describe(m.file_type())
                )));
            }
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// What the host has at a path now.
#[derive(Debug)]
enum HostEntry {
    Dir,
    File {
        sha256: [u8; 32],
        owner: Owner,
    },
    Symlink {
        target: PathBuf,
        owner: Owner,
    },
    /// A FIFO, socket or device: never opened, always a conflict.
    Special(&'static str),
}

/// What the host has at `path` now, found without following a link or opening anything but a
/// regular file.
fn host_entry(path: &Path, rel: &RelPath) -> Result<Option<HostEntry>, IsolateError> {
    let read_err = |source| IsolateError::Read {
        path: rel.quoted(),
        source,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let ft = meta.file_type();
    Ok(Some(if ft.is_symlink() {
        HostEntry::Symlink {
            target: std::fs::read_link(path).map_err(read_err)?,
            owner: Owner::of(&meta),
        }
    } else if ft.is_dir() {
        HostEntry::Dir
    } else {
        match open_regular(path) {
            Ok((file, meta)) => HostEntry::File {
                sha256: hostfs::sha256_of(file).map_err(read_err)?.0,
                owner: Owner::of(&meta),
            },
            Err(OpenError::NotRegular(kind)) => HostEntry::Special(kind),
            Err(OpenError::Io(e)) => return Err(read_err(e)),
        }
    }))
}

/// Whether the host still has what was packed.
fn unchanged(was: &Entry, now: &HostEntry) -> bool {
    match (was, now) {
        // Compare bytes, not modes: a `chmod` by the user is not a conflicting edit.
        (Entry::File { sha256: x, .. }, HostEntry::File { sha256: y, .. }) => x == y,
        (Entry::Symlink { target: x }, HostEntry::Symlink { target: y, .. }) => x == y,
        _ => false,
    }
}

#[derive(Debug, Default)]
pub struct Applied {
    /// Paths as git prints them.
    pub written: Vec<String>,
    pub deleted: Vec<String>,
}

fn tmp_name(dir: &Path, what: &str) -> PathBuf {
    dir.join(format!(
        ".agentbox-{what}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ))
}

fn escape_words(e: &links::Escape) -> &'static str {
    match e {
        links::Escape::Absolute => "an absolute path",
        links::Escape::AboveTheRoot => {
            "followed through the links on its way, it goes above the project's root"
        }
        links::Escape::TooManyLinks => "too many links to follow",
    }
}

/// One path to write or delete, checked.
struct Step<'a> {
    rel: &'a RelPath,
    target: PathBuf,
    content: Option<&'a Content>,
    owner: Owner,
}

/// Check every path before anything is written: not in a `.git`, no symlinked or special
/// directory on the way (on the host, or made by the changes), each touched host path still
/// what was packed and nothing that must not be opened, and no link (new, or already in the
/// project) that leads outside once the changes are in.
fn check<'a>(
    project: &Path,
    manifest: &Manifest,
    changes: &'a [(Change, Option<Content>)],
    project_owner: Owner,
) -> Result<Vec<Step<'a>>, IsolateError> {
    let changed: BTreeMap<&RelPath, Option<&Content>> =
        changes.iter().map(|(c, n)| (&c.path, n.as_ref())).collect();
    let mut steps = Vec::new();
    for (ch, content) in changes {
        let rel = &ch.path;
        if rel.components().any(is_git_component) {
            return Err(IsolateError::Refused(format!("{rel} is inside a .git")));
        }
        check_ancestors(project, rel)?;
        for a in rel.ancestors() {
            if let Some(c) = changed.get(&a) {
                let what = match c {
                    Some(Content::Symlink(_)) => "a link",
                    Some(Content::File { .. }) => "a file",
                    None => "deleted",
                };
                return Err(IsolateError::Refused(format!(
                    "{rel} is under {a}, which the changes make {what}"
                )));
            }
        }
        let target = project.join(rel.as_path());
        let now = host_entry(&target, rel)?;
        if let Some(HostEntry::Special(kind)) = &now {
            return Err(IsolateError::Refused(format!(
                "{rel} is {kind} on the host; agentbox never opens one, so it cannot tell \
                 whether writing there is safe"
            )));
        }
        match (ch.status, manifest.entries.get(rel), &now) {
            (ChangeKind::Added, _, Some(_)) => {
                return Err(IsolateError::Refused(format!(
                    "{rel} was created on the host meanwhile"
                )));
            }
            (ChangeKind::Added, _, None) => {}
            (_, Some(Entry::Dir), _) | (_, _, Some(HostEntry::Dir)) => {
                return Err(IsolateError::Refused(format!("{rel} is a directory on the host")));
            }
            (_, Some(was), Some(now)) if unchanged(was, now) => {}
            (_, Some(_), _) => {
                return Err(IsolateError::Refused(format!(
                    "{rel} changed on the host meanwhile"
                )));
            }
            (_, None, _) => {
                return Err(IsolateError::Refused(format!(
                    "{rel} was not part of the project when it was copied"
                )));
            }
        }
        if ch.status != ChangeKind::Deleted && content.is_none() {
            return Err(IsolateError::Refused(format!("no content for {rel}")));
        }
        let owner = match &now {
            Some(HostEntry::File { owner, .. } | HostEntry::Symlink { owner, .. }) => *owner,
            _ => project_owner,
        };
        steps.push(Step {
            rel,
            target,
            content: content.as_ref(),
            owner,
        });
    }

    // Links, resolved in the tree as it will be: each one's text alone proves nothing.
    let after = links::After::new(project, changed.iter().map(|(p, c)| (*p, *c)));
    for (ch, content) in changes {
        if let Some(Content::Symlink(t)) = content
            && let Err(e) = links::resolve(&after, &ch.path, t.as_os_str().as_bytes())
        {
            return Err(IsolateError::Refused(format!(
                "{} is a link to {}, which leads outside the project ({})",
                ch.path,
                crate::gitquote::quote_path(t.as_os_str().as_bytes()),
                escape_words(&e)
            )));
        }
    }
    let host = links::Host { root: project };
    for (path, entry) in &manifest.entries {
        if !matches!(entry, Entry::Symlink { .. }) || changed.contains_key(path) {
            continue;
        }
        let Ok(target) = std::fs::read_link(project.join(path.as_path())) else {
            continue;
        };
        let target = target.as_os_str().as_bytes();
        if let Err(e) = links::resolve_existing(&after, path, target)
            && links::resolve_existing(&host, path, target).is_ok()
        {
            return Err(IsolateError::Refused(format!(
                "{path}, a link already in the project, would lead outside the project once \
                 the changes are in ({})",
                escape_words(&e)
            )));
        }
    }
    Ok(steps)
}

/// Create the missing directories above `rel`, one at a time, each given to `owner`.
fn make_dirs(project: &Path, rel: &RelPath, owner: Owner, made: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for a in rel.ancestors() {
        let dir = project.join(a.as_path());
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_dir() => continue,
            // Checked before anything was written; changed since, by someone else.
            Ok(_) => return Err(std::io::Error::other("not a directory any more")),
            Err(_) => {}
        }
        std::fs::create_dir(&dir)?;
        made.push(dir.clone());
        owner.give_path(&dir)?;
    }
    Ok(())
}

/// Apply a changeset to the host project, all or nothing (the caller holds the run's critical
/// section, so an interruption waits for it; nothing done here can block: no FIFO or device is
/// ever opened): [`check`] every path, stage every
/// new file next to its target (owned as the file it replaces, or as the project), move the
/// originals aside, rename the new ones in. Any failure puts everything back.
pub fn apply(
    project: &Path,
    manifest: &Manifest,
    changes: &[(Change, Option<Content>)],
) -> Result<Applied, IsolateError> {
    let project_owner = std::fs::symlink_metadata(project)
        .map(|m| Owner::of(&m))
        .map_err(|source| IsolateError::Read {
            path: project.display().to_string(),
            source,
        })?;
    let plan = check(project, manifest, changes, project_owner)?;

    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut made_dirs: Vec<PathBuf> = Vec::new();
    let mut moved_aside: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut placed: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<(), IsolateError> {
        for step in &plan {
            let Some(content) = step.content else { continue };
            let werr = |source| IsolateError::Write {
                path: step.rel.quoted(),
                source,
            };
            make_dirs(project, step.rel, project_owner, &mut made_dirs).map_err(werr)?;
            let dir = step.target.parent().unwrap_or(project);
            let tmp = tmp_name(dir, "apply");
            match content {
                Content::File { data, mode } => {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&tmp)
                        .map_err(werr)?;
                    staged.push((tmp.clone(), step.target.clone()));
                    f.write_all(data).map_err(werr)?;
                    step.owner.give_file(&f).map_err(werr)?;
                    // git's two modes: executable or not. No setuid, no world-writable file.
                    let perm = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
                    f.set_permissions(std::fs::Permissions::from_mode(perm))
                        .map_err(werr)?;
                }
                Content::Symlink(link) => {
                    std::os::unix::fs::symlink(link, &tmp).map_err(werr)?;
                    staged.push((tmp.clone(), step.target.clone()));
                    step.owner.give_path(&tmp).map_err(werr)?;
                }
            }
        }
        for step in &plan {
            if step.target.symlink_metadata().is_ok() {
                let aside = tmp_name(step.target.parent().unwrap_or(project), "old");
                std::fs::rename(&step.target, &aside).map_err(|source| IsolateError::Write {
                    path: step.rel.quoted(),
                    source,
                })?;
                moved_aside.push((aside, step.target.clone()));
            }
        }
        for (tmp, target) in &staged {
            #[cfg(test)]
            if tests::FAIL_AFTER_PLACING.with(|n| n.get()) == Some(placed.len()) {
                return Err(IsolateError::Write {
                    path: target.display().to_string(),
                    source: std::io::Error::other("injected by the test"),
                });
            }
            std::fs::rename(tmp, target).map_err(|source| IsolateError::Write {
                path: target.display().to_string(),
                source,
            })?;
            placed.push(target.clone());
        }
        Ok(())
    })();
    if let Err(e) = result {
        // Put everything back as it was.
        for p in &placed {
            let _ = std::fs::remove_file(p);
        }
        for (aside, target) in moved_aside.iter().rev() {
            let _ = std::fs::rename(aside, target);
        }
        for (tmp, _) in &staged {
            let _ = std::fs::remove_file(tmp);
        }
        for d in made_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        return Err(e);
    }
    for (aside, _) in &moved_aside {
        let _ = std::fs::remove_file(aside);
    }
    let mut applied = Applied::default();
    for step in plan {
        if step.content.is_some() {
            applied.written.push(step.rel.quoted());
        } else {
            applied.deleted.push(step.rel.quoted());
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn project() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src")).unwrap();
        std::fs::write(d.path().join("src/a.py"), "a = 1\n").unwrap();
        std::fs::write(d.path().join("gone.txt"), "bye\n").unwrap();
        std::os::unix::fs::symlink("src/a.py", d.path().join("link")).unwrap();
        d
    }

    fn file(data: &[u8], mode: u32) -> Option<Content> {
        Some(Content::File {
            data: data.to_vec(),
            mode,
        })
    }

    fn change(letter: char, path: &str, content: Option<Content>) -> (Change, Option<Content>) {
        let status = [
            ChangeKind::Added,
            ChangeKind::Modified,
            ChangeKind::Deleted,
            ChangeKind::TypeChanged,
        ]
        .into_iter()
        .find(|k| k.letter() == letter)
        .unwrap();
        (
            Change {
                status,
                path: rel(path),
            },
            content,
        )
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    #[test]
    fn pack_records_files_links_and_dirs_and_honours_excludes() {
        let d = project();
        std::fs::write(d.path().join("TASK.md"), "task").unwrap();
        mkfifo(&d.path().join("fifo"));
        let packed = pack(d.path(), 4242, 4242, &|p| p.as_bytes() == b"TASK.md").unwrap();
        let keys: Vec<String> = packed.manifest.entries.keys().map(|k| k.quoted()).collect();
        assert_eq!(
            keys,
            ["gone.txt", "link", "src", "src/a.py"],
            "no FIFO, nothing excluded"
        );
        assert_eq!(
            packed.manifest.entries[&rel("link")],
            Entry::Symlink {
                target: "src/a.py".into()
            }
        );
        let Entry::File { blob, size, .. } = &packed.manifest.entries[&rel("src/a.py")] else {
            panic!("not a file")
        };
        assert_eq!(*size, 6);
        assert_eq!(patch::hex(blob), patch::blob_id(b"a = 1\n"));
        let mut archive = tar::Archive::new(std::fs::File::open(packed.tar.path()).unwrap());
        for e in archive.entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(
                (e.header().uid().unwrap(), e.header().gid().unwrap()),
                (4242, 4242)
            );
        }
    }

    #[test]
    fn apply_writes_deletes_and_refuses_conflicts_and_escapes() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let changes = vec![
            change('M', "src/a.py", file(b"a = 2\n", 0o644)),
            change('A', "new/dir/b.sh", file(b"#!/bin/sh\n", 0o4777)),
            change('D', "gone.txt", None),
        ];
        // The host changed a.py meanwhile: nothing is applied.
        std::fs::write(d.path().join("src/a.py"), "a = 9\n").unwrap();
        let err = apply(d.path(), &packed.manifest, &changes).unwrap_err();
        assert!(
            err.to_string().contains("src/a.py changed on the host meanwhile"),
            "{err}"
        );
        assert!(!d.path().join("new").exists() && d.path().join("gone.txt").exists());
        std::fs::write(d.path().join("src/a.py"), "a = 1\n").unwrap();

        let done = apply(d.path(), &packed.manifest, &changes).unwrap();
        assert_eq!(done.written, ["src/a.py", "new/dir/b.sh"]);
        assert_eq!(
            std::fs::read_to_string(d.path().join("src/a.py")).unwrap(),
            "a = 2\n"
        );
        let mode = std::fs::metadata(d.path().join("new/dir/b.sh")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755, "git's modes only: no setuid, no world-writable");
        assert!(!d.path().join("gone.txt").exists());
        let leftovers: Vec<_> = std::fs::read_dir(d.path().join("src")).unwrap().collect();
        assert_eq!(leftovers.len(), 1);
    }

    #[test]
    fn apply_never_writes_through_a_symlink_into_a_git_or_links_outside() {
        let d = project();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("out")).unwrap();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        for path in [
            "out/evil.txt",
            ".git/hooks/pre-commit",
            "x/.git/config",
            "deep/.GIT/hooks/a",
        ] {
            let changes = vec![change('A', path, file(b"x", 0o644))];
            assert!(apply(d.path(), &packed.manifest, &changes).is_err(), "{path}");
        }
        for target in ["/etc/passwd", "../../outside", "a/../../x"] {
            let changes = vec![change('A', "l", Some(Content::Symlink(target.into())))];
            let err = apply(d.path(), &packed.manifest, &changes).unwrap_err();
            assert!(err.to_string().contains("outside the project"), "{target}: {err}");
        }
        // A chain of links, each inside by its text.
        let chain = vec![
            change('A', "sub/b", Some(Content::Symlink("..".into()))),
            change('A', "sub/c", Some(Content::Symlink("b/..".into()))),
            change('A', "sub/z", Some(Content::Symlink("c/SECRET".into()))),
        ];
        let err = apply(d.path(), &packed.manifest, &chain).unwrap_err();
        assert!(err.to_string().contains("sub/c is a link to b/.."), "{err}");
        assert!(!d.path().join("sub").exists(), "nothing written");
        // A file under a path the changes make a link.
        let under = vec![
            change('A', "d", Some(Content::Symlink("src".into()))),
            change('A', "d/x", file(b"x", 0o644)),
        ];
        assert!(apply(d.path(), &packed.manifest, &under).is_err());
        let ok = vec![
            change('A', "sub/l", Some(Content::Symlink("../src/a.py".into()))),
            change('A', "lib", Some(Content::Symlink("src".into()))),
            change('A', "alias", Some(Content::Symlink("lib/a.py".into()))),
        ];
        apply(d.path(), &packed.manifest, &ok).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("alias")).unwrap(),
            "a = 1\n"
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_link_already_in_the_project_that_the_changes_send_outside_is_refused() {
        let d = project();
        std::os::unix::fs::symlink("d/../x", d.path().join("h")).unwrap();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let changes = vec![change('A', "d", Some(Content::Symlink("src/..".into())))];
        let err = apply(d.path(), &packed.manifest, &changes).unwrap_err();
        assert!(
            err.to_string().contains("h, a link already in the project"),
            "{err}"
        );
        assert!(std::fs::symlink_metadata(d.path().join("d")).is_err());
    }

    #[test]
    fn a_fifo_on_the_host_is_a_conflict_never_opened() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        mkfifo(&d.path().join("queue"));
        // Where a file is added, and in place of a packed file: neither blocks.
        let added = vec![change('A', "queue", file(b"x", 0o644))];
        let err = apply(d.path(), &packed.manifest, &added).unwrap_err();
        assert!(err.to_string().contains("queue is a FIFO on the host"), "{err}");
        std::fs::remove_file(d.path().join("gone.txt")).unwrap();
        mkfifo(&d.path().join("gone.txt"));
        let deleted = vec![change('D', "gone.txt", None)];
        let err = apply(d.path(), &packed.manifest, &deleted).unwrap_err();
        assert!(
            err.to_string().contains("gone.txt is a FIFO on the host"),
            "{err}"
        );
    }

    thread_local! {
        /// Make `apply` fail once this many files are in place: the rollback of a swap that
        /// is half done is otherwise unreachable from a test.
        pub(super) static FAIL_AFTER_PLACING: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }

    #[test]
    fn a_failure_while_swapping_puts_everything_back() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let before = snapshot(d.path());
        let changes = vec![
            change('M', "src/a.py", file(b"a = 2\n", 0o644)),
            change('A', "new/dir/b.txt", file(b"b\n", 0o644)),
            change('D', "gone.txt", None),
            change('M', "link", Some(Content::Symlink("gone.txt".into()))),
        ];
        for placed in 0..3 {
            FAIL_AFTER_PLACING.with(|n| n.set(Some(placed)));
            let err = apply(d.path(), &packed.manifest, &changes).unwrap_err();
            assert!(err.to_string().contains("injected by the test"), "{err}");
            assert_eq!(snapshot(d.path()), before, "after {placed} file(s) in place");
        }
        FAIL_AFTER_PLACING.with(|n| n.set(None));
        apply(d.path(), &packed.manifest, &changes).unwrap();
        assert_ne!(snapshot(d.path()), before, "and without the fault it applies");
    }

    /// Every entry of a tree: path, and the file's bytes or the link's target (no temporary
    /// file, no directory left over goes unseen).
    fn snapshot(root: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                let m = p.symlink_metadata().unwrap();
                let content = if m.is_dir() {
                    stack.push(p.clone());
                    None
                } else if m.file_type().is_symlink() {
                    Some(
                        std::fs::read_link(&p)
                            .unwrap()
                            .into_os_string()
                            .into_encoded_bytes(),
                    )
                } else {
                    Some(std::fs::read(&p).unwrap())
                };
                out.push((p.strip_prefix(root).unwrap().to_path_buf(), content));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_failure_midway_puts_everything_back() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        // The second target is a directory on the host: refused before anything moves.
        std::fs::create_dir_all(d.path().join("adir")).unwrap();
        let mut manifest = packed.manifest.clone();
        manifest.entries.insert(
            rel("adir"),
            Entry::File {
                sha256: [0; 32],
                blob: [0; 20],
                size: 0,
                mode: 0o644,
            },
        );
        let changes = vec![
            change('M', "src/a.py", file(b"a = 2\n", 0o644)),
            change('M', "adir", file(b"x", 0o644)),
        ];
        assert!(apply(d.path(), &manifest, &changes).is_err());
        assert_eq!(
            std::fs::read_to_string(d.path().join("src/a.py")).unwrap(),
            "a = 1\n"
        );
        let names: Vec<String> = std::fs::read_dir(d.path().join("src"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.py"], "no staged or moved-aside files left");
    }

    #[test]
    fn apply_as_root_gives_what_it_writes_to_the_owner() {
        if !hostfs::can_chown() {
            return;
        }
        let d = project();
        std::os::unix::fs::lchown(d.path(), Some(4242), Some(4243)).unwrap();
        std::os::unix::fs::lchown(d.path().join("src/a.py"), Some(4344), Some(4345)).unwrap();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let changes = vec![
            change('M', "src/a.py", file(b"a = 2\n", 0o644)),
            change('A', "new/deep/f", file(b"f", 0o644)),
            change('A', "new/l", Some(Content::Symlink("deep/f".into()))),
        ];
        apply(d.path(), &packed.manifest, &changes).unwrap();
        let owner = |p: &str| {
            let m = std::fs::symlink_metadata(d.path().join(p)).unwrap();
            (m.uid(), m.gid())
        };
        assert_eq!(owner("src/a.py"), (4344, 4345), "as the file it replaced");
        for p in ["new", "new/deep", "new/deep/f", "new/l"] {
            assert_eq!(owner(p), (4242, 4243), "{p}: as the project");
        }
    }

    #[test]
    fn a_link_climbing_out_of_the_project_is_left_out_and_said() {
        assert!(climbs_out(Path::new("sub/up"), Path::new("../../")));
        assert!(climbs_out(Path::new("up"), Path::new("..")));
        assert!(climbs_out(Path::new("a/b"), Path::new("c/../../../x")));
        assert!(!climbs_out(Path::new("sub/up"), Path::new("..")));
        assert!(!climbs_out(Path::new("sub/l"), Path::new("../a.py")));
        assert!(!climbs_out(Path::new("l"), Path::new("/etc/passwd")));
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("../../", d.path().join("sub/up")).unwrap();
        std::os::unix::fs::symlink("..", d.path().join("sub/root")).unwrap();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        assert_eq!(packed.left_out.len(), 1, "{:?}", packed.left_out);
        assert!(packed.left_out[0].starts_with("sub/up is a symbolic link leading out"));
        let keys: Vec<_> = packed
            .manifest
            .entries
            .keys()
            .map(|k| k.as_path().to_path_buf())
            .collect();
        assert!(!keys.contains(&PathBuf::from("sub/up")) && keys.contains(&PathBuf::from("sub/root")));
    }
}
