//! `--isolate`: copy the project in, bring a patch out. The host directory is only read (to
//! pack it) until the user asks for `--apply`, and then it is written only with what changed,
//! refusing if the host files changed meanwhile.

pub mod hostfs;
pub mod links;
pub mod names;
pub mod patch;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::workspace::CACHE_DIRS;

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
}

/// What a path was when the project was packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    File { sha256: [u8; 32], mode: u32 },
    Symlink { target: PathBuf },
}

/// Every packed path (relative, `/`-separated) and what it was.
#[derive(Debug, Default, Clone)]
pub struct Manifest {
    pub entries: BTreeMap<String, Entry>,
}

pub struct Packed {
    pub tar: tempfile::NamedTempFile,
    pub manifest: Manifest,
    pub bytes: u64,
}

fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().into())
}

fn rel_string(rel: &Path) -> String {
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Tar the project (symlinks as symlinks, never followed; sockets, fifos and devices
/// skipped), owned by `uid:gid` inside, and record what each path was.
pub fn pack(
    project: &Path,
    uid: u32,
    gid: u32,
    exclude: &dyn Fn(&str) -> bool,
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
    let mut stack = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let dir = project.join(&rel_dir);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(read_err(&dir))?
            .collect::<Result<_, _>>()
            .map_err(read_err(&dir))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let rel = rel_dir.join(entry.file_name());
            let key = rel_string(&rel);
            if exclude(&key) {
                continue;
            }
            let full = project.join(&rel);
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
                    .append_data(&mut header, &rel, std::io::empty())
                    .map_err(read_err(&full))?;
                manifest.entries.insert(key, Entry::Dir);
                stack.push(rel);
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&full).map_err(read_err(&full))?;
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder
                    .append_link(&mut header, &rel, &target)
                    .map_err(read_err(&full))?;
                manifest.entries.insert(key, Entry::Symlink { target });
            } else if ft.is_file() {
                let sha256 = sha256_file(&full).map_err(read_err(&full))?;
                let file = std::fs::File::open(&full).map_err(read_err(&full))?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(meta.len());
                builder
                    .append_data(&mut header, &rel, file)
                    .map_err(read_err(&full))?;
                bytes += meta.len();
                manifest.entries.insert(
                    key,
                    Entry::File {
                        sha256,
                        mode: meta.mode() & 0o7777,
                    },
                );
            }
        }
    }
    builder.into_inner().map_err(read_err(project))?;
    Ok(Packed {
        tar: tar_file,
        manifest,
        bytes,
    })
}

/// One changed path: A (added), M (content or mode), D (deleted) or T (a file became a link,
/// or the reverse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub status: char,
    pub path: String,
}

/// The new state of a changed path, from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    File { data: Vec<u8>, mode: u32 },
    Symlink(PathBuf),
}

fn is_git_component(c: &str) -> bool {
    // Case-insensitively: on a case-insensitive file system `.GIT` is `.git`.
    c.eq_ignore_ascii_case(".git")
}

/// Left out of a changeset: anything in a `.git` (at any depth) or a cache, and `.pyc` files.
fn ignored(rel: &str) -> bool {
    rel.split('/')
        .any(|c| is_git_component(c) || CACHE_DIRS.contains(&c))
        || rel.ends_with(".pyc")
}

/// Most bytes of changed files a changeset holds, and per file.
pub const MAX_CHANGED_BYTES: u64 = 256 << 20;
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// What changed, computed on the host by reading the sandbox's `/workspace` as a tar stream
/// (the archive API) against the manifest of what was copied in. Nothing the sandbox runs
/// takes part: a hostile repository can change files, not the account of which ones changed.
pub fn changeset_from_archive<R: Read>(
    tar: R,
    manifest: &Manifest,
) -> Result<Vec<(Change, Option<Content>)>, IsolateError> {
    let bad = |reason: String| IsolateError::Archive {
        path: "/workspace".into(),
        reason,
    };
    let mut archive = tar::Archive::new(tar);
    let mut seen: std::collections::BTreeSet<String> = Default::default();
    let mut out: BTreeMap<String, (Change, Option<Content>)> = BTreeMap::new();
    let mut held = 0u64;
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
        // Entries are `workspace/...`; anything else (absolute, `..`) is not ours to read.
        let mut comps = path.components();
        if comps.next().map(|c| c.as_os_str() != "workspace").unwrap_or(true) {
            continue;
        }
        let rest: Vec<String> = comps
            .map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        if rest.is_empty() {
            continue;
        }
        let rel = rest.join("/");
        if ignored(&rel) {
            continue;
        }
        let header = entry.header().clone();
        let new = match header.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = header.size().map_err(|e| bad(e.to_string()))?;
                if size > MAX_FILE_BYTES {
                    return Err(IsolateError::Refused(format!(
                        "{rel} is {size} bytes, more than agentbox brings back"
                    )));
                }
                let mut data = Vec::with_capacity(size as usize);
                entry.read_to_end(&mut data).map_err(|e| bad(e.to_string()))?;
                Content::File {
                    data,
                    mode: header.mode().map_err(|e| bad(e.to_string()))? & 0o7777,
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| bad(e.to_string()))?
                    .ok_or_else(|| bad(format!("{rel}: a link without a target")))?;
                Content::Symlink(target.into_owned())
            }
            tar::EntryType::Link => {
                return Err(IsolateError::Refused(format!(
                    "{rel} is a hard link in the sandbox; agentbox does not bring those back"
                )));
            }
            _ => continue,
        };
        seen.insert(rel.clone());
        let status = match (manifest.entries.get(&rel), &new) {
            (None, _) => 'A',
            (Some(Entry::File { sha256, mode }), Content::File { data, mode: m }) => {
                let same =
                    Sha256::digest(data).as_slice() == sha256 && (mode & 0o111 != 0) == (m & 0o111 != 0);
                if same {
                    continue;
                }
                'M'
            }
            (Some(Entry::Symlink { target }), Content::Symlink(t)) if target == t => continue,
            (Some(Entry::Symlink { .. }), Content::Symlink(_)) => 'M',
            (Some(_), _) => 'T',
        };
        if let Content::File { data, .. } = &new {
            held += data.len() as u64;
            if held > MAX_CHANGED_BYTES {
                return Err(IsolateError::Refused(format!(
                    "the changes add up to more than {MAX_CHANGED_BYTES} bytes, more than agentbox brings back"
                )));
            }
        }
        out.insert(rel.clone(), (Change { status, path: rel }, Some(new)));
    }
    for (path, entry) in &manifest.entries {
        if !matches!(entry, Entry::Dir) && !seen.contains(path) && !ignored(path) {
            out.insert(
                path.clone(),
                (
                    Change {
                        status: 'D',
                        path: path.clone(),
                    },
                    None,
                ),
            );
        }
    }
    Ok(out.into_values().collect())
}

/// A path from the sandbox, checked: relative, no `..`, nothing named `.git` anywhere in it.
fn checked_rel(path: &str) -> Result<PathBuf, IsolateError> {
    let p = Path::new(path);
    let ok =
        !path.is_empty() && !path.ends_with('/') && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(IsolateError::Refused(format!(
            "the change list names an invalid path {path:?}"
        )));
    }
    if p.components()
        .any(|c| is_git_component(&c.as_os_str().to_string_lossy()))
    {
        return Err(IsolateError::Refused(format!("{path} is inside a .git")));
    }
    Ok(p.to_path_buf())
}

/// Every existing ancestor of `rel` under `project` must be a real directory: a symlink there
/// (planted by the sandbox, or already on the host) could send a write outside the project.
fn check_ancestors(project: &Path, rel: &Path) -> Result<(), IsolateError> {
    let mut cur = project.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for c in &parts[..parts.len().saturating_sub(1)] {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(IsolateError::Refused(format!(
                    "{} is not a plain directory on the host",
                    cur.strip_prefix(project).unwrap_or(&cur).display()
                )));
            }
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// A link the sandbox made must point inside the project: elsewhere, other tools on the host
/// would follow it.
fn check_link_target(rel: &Path, target: &Path) -> Result<(), IsolateError> {
    let mut depth = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth -= 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => depth = -1,
        }
        if depth < 0 {
            return Err(IsolateError::Refused(format!(
                "{} is a link to {}, outside the project",
                rel.display(),
                target.display()
            )));
        }
    }
    Ok(())
}

/// What the host has at `path` now, in manifest terms.
fn host_entry(path: &Path) -> Option<Entry> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        std::fs::read_link(path)
            .ok()
            .map(|target| Entry::Symlink { target })
    } else if ft.is_dir() {
        Some(Entry::Dir)
    } else {
        sha256_file(path).ok().map(|sha256| Entry::File {
            sha256,
            mode: meta.mode() & 0o7777,
        })
    }
}

fn same_content(a: &Entry, b: &Entry) -> bool {
    match (a, b) {
        // Compare bytes, not modes: a `chmod` by the user is not a conflicting edit.
        (Entry::File { sha256: x, .. }, Entry::File { sha256: y, .. }) => x == y,
        (x, y) => x == y,
    }
}

#[derive(Debug, Default)]
pub struct Applied {
    pub written: Vec<String>,
    pub deleted: Vec<String>,
}

/// Held while an apply renames files, so an interruption waits for it to finish (see
/// [`wait_for_apply`]): a half-applied change set is what `--apply` promises never to leave.
static APPLYING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Block until no apply is in progress (the interruption path calls this before exiting).
pub fn wait_for_apply() {
    drop(APPLYING.lock());
}

fn tmp_name(dir: &Path, what: &str) -> PathBuf {
    dir.join(format!(
        ".agentbox-{what}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ))
}

/// Apply a changeset to the host project, all or nothing: check every path (relative, not in a
/// `.git`, no symlinked directory on the way, links pointing inside) and that each touched host
/// file is still what was packed; stage every new file next to its target; move the originals
/// aside; rename the new ones in. Any failure puts everything back.
pub fn apply(
    project: &Path,
    manifest: &Manifest,
    changes: &[(Change, Option<Content>)],
) -> Result<Applied, IsolateError> {
    let _applying = APPLYING.lock().unwrap_or_else(|e| e.into_inner());
    let mut plan: Vec<(String, PathBuf, Option<&Content>)> = Vec::new();
    for (ch, content) in changes {
        let rel = checked_rel(&ch.path)?;
        check_ancestors(project, &rel)?;
        if let Some(Content::Symlink(t)) = content {
            check_link_target(&rel, t)?;
        }
        let target = project.join(&rel);
        let now = host_entry(&target);
        match (ch.status, manifest.entries.get(&ch.path), &now) {
            ('A', _, Some(_)) => {
                return Err(IsolateError::Refused(format!(
                    "{} was created on the host meanwhile",
                    ch.path
                )));
            }
            ('A', _, None) => {}
            (_, Some(Entry::Dir), _) | (_, _, Some(Entry::Dir)) => {
                return Err(IsolateError::Refused(format!(
                    "{} is a directory on the host",
                    ch.path
                )));
            }
            (_, Some(was), Some(now)) if same_content(was, now) => {}
            (_, Some(_), _) => {
                return Err(IsolateError::Refused(format!(
                    "{} changed on the host meanwhile",
                    ch.path
                )));
            }
            (_, None, _) => {
                return Err(IsolateError::Refused(format!(
                    "{} was not part of the project when it was copied",
                    ch.path
                )));
            }
        }
        if ch.status != 'D' && content.is_none() {
            return Err(IsolateError::Refused(format!("no content for {}", ch.path)));
        }
        plan.push((ch.path.clone(), target, content.as_ref()));
    }

    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut made_dirs: Vec<PathBuf> = Vec::new();
    let mut moved_aside: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut placed: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<(), IsolateError> {
        for (rel, target, content) in &plan {
            let Some(content) = content else { continue };
            let werr = |source| IsolateError::Write {
                path: rel.clone(),
                source,
            };
            let dir = target.parent().expect("inside the project");
            if !dir.exists() {
                let mut missing = Vec::new();
                let mut d = dir.to_path_buf();
                while !d.exists() {
                    missing.push(d.clone());
                    d.pop();
                }
                std::fs::create_dir_all(dir).map_err(werr)?;
                made_dirs.extend(missing.into_iter().rev());
            }
            let tmp = tmp_name(dir, "apply");
            match content {
                Content::File { data, mode } => {
                    std::fs::write(&tmp, data).map_err(werr)?;
                    staged.push((tmp.clone(), target.clone()));
                    // git's two modes: executable or not. No setuid, no world-writable file.
                    let perm = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
                    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(perm)).map_err(werr)?;
                }
                Content::Symlink(link) => {
                    std::os::unix::fs::symlink(link, &tmp).map_err(werr)?;
                    staged.push((tmp.clone(), target.clone()));
                }
            }
        }
        for (rel, target, _) in &plan {
            if target.symlink_metadata().is_ok() {
                let aside = tmp_name(target.parent().expect("inside the project"), "old");
                std::fs::rename(target, &aside).map_err(|source| IsolateError::Write {
                    path: rel.clone(),
                    source,
                })?;
                moved_aside.push((aside, target.clone()));
            }
        }
        for (tmp, target) in &staged {
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
    for (rel, _, content) in plan {
        if content.is_some() {
            applied.written.push(rel);
        } else {
            applied.deleted.push(rel);
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn change(status: char, path: &str, content: Option<Content>) -> (Change, Option<Content>) {
        (
            Change {
                status,
                path: path.into(),
            },
            content,
        )
    }

    #[test]
    fn pack_records_files_links_and_dirs_and_honours_excludes() {
        let d = project();
        std::fs::write(d.path().join("TASK.md"), "task").unwrap();
        let packed = pack(d.path(), 4242, 4242, &|p| p == "TASK.md").unwrap();
        let keys: Vec<&String> = packed.manifest.entries.keys().collect();
        assert_eq!(keys, ["gone.txt", "link", "src", "src/a.py"]);
        assert_eq!(
            packed.manifest.entries["link"],
            Entry::Symlink {
                target: "src/a.py".into()
            }
        );
        let mut archive = tar::Archive::new(std::fs::File::open(packed.tar.path()).unwrap());
        for e in archive.entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(
                (e.header().uid().unwrap(), e.header().gid().unwrap()),
                (4242, 4242)
            );
        }
    }

    /// A tar like the archive API's: everything under `workspace/`.
    fn workspace_tar(entries: &[(&str, Option<&[u8]>, u32)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data, mode) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(*mode);
            match data {
                Some(d) => {
                    h.set_size(d.len() as u64);
                    h.set_entry_type(tar::EntryType::Regular);
                    b.append_data(&mut h, format!("workspace/{path}"), *d).unwrap();
                }
                None => {
                    h.set_size(0);
                    h.set_entry_type(tar::EntryType::Directory);
                    b.append_data(&mut h, format!("workspace/{path}"), std::io::empty())
                        .unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn the_changeset_is_read_from_the_archive_against_the_manifest() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let tar = workspace_tar(&[
            ("src", None, 0o755),
            ("src/a.py", Some(b"a = 2\n"), 0o644),
            ("new.txt", Some(b"n\n"), 0o755),
            ("src/__pycache__/a.pyc", Some(b"junk"), 0o644),
            ("sub/.git/config", Some(b"[core]\n"), 0o644),
            ("x.pyc", Some(b"junk"), 0o644),
        ]);
        let changes = changeset_from_archive(tar.as_slice(), &packed.manifest).unwrap();
        let summary: Vec<(char, &str)> = changes.iter().map(|(c, _)| (c.status, c.path.as_str())).collect();
        // The link is absent from this archive, so it counts as deleted, like gone.txt.
        assert_eq!(
            summary,
            [
                ('D', "gone.txt"),
                ('D', "link"),
                ('A', "new.txt"),
                ('M', "src/a.py")
            ]
        );
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
            "../x",
            "/etc/x",
            "dir/",
        ] {
            let changes = vec![change('A', path, file(b"x", 0o644))];
            assert!(apply(d.path(), &packed.manifest, &changes).is_err(), "{path}");
        }
        for target in ["/etc/passwd", "../../outside", "a/../../x"] {
            let changes = vec![change('A', "l", Some(Content::Symlink(target.into())))];
            assert!(apply(d.path(), &packed.manifest, &changes).is_err(), "{target}");
        }
        let ok = vec![change('A', "sub/l", Some(Content::Symlink("../src/a.py".into())))];
        apply(d.path(), &packed.manifest, &ok).unwrap();
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_failure_midway_puts_everything_back() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        // The second target is a directory on the host: refused before anything moves.
        std::fs::create_dir_all(d.path().join("adir")).unwrap();
        let mut manifest = packed.manifest.clone();
        manifest.entries.insert(
            "adir".into(),
            Entry::File {
                sha256: [0; 32],
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
}
