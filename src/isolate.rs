//! `--isolate`: copy the project in, bring a patch out. The host directory is only read (to
//! pack it) until the user asks for `--apply`, and then it is written only with what changed,
//! refusing if the host files changed meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

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

/// One changed path, as `git diff --name-status` reports it: A, M, D or T (type change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub status: char,
    pub path: String,
}

/// `git diff --name-status -z` output.
pub fn parse_name_status(raw: &[u8]) -> Vec<Change> {
    let mut out = Vec::new();
    let mut parts = raw.split(|b| *b == 0).filter(|p| !p.is_empty());
    while let (Some(status), Some(path)) = (parts.next(), parts.next()) {
        let status = status.first().copied().unwrap_or(b'?') as char;
        out.push(Change {
            status,
            path: String::from_utf8_lossy(path).into_owned(),
        });
    }
    out
}

/// The new state of a changed path, from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    File { data: Vec<u8>, mode: u32 },
    Symlink(PathBuf),
}

/// The one entry of a `get_archive` tar.
pub fn content_from_archive(path: &str, tar_bytes: &[u8]) -> Result<Content, IsolateError> {
    let bad = |reason: String| IsolateError::Archive {
        path: path.to_string(),
        reason,
    };
    let mut archive = tar::Archive::new(tar_bytes);
    let mut entries = archive.entries().map_err(|e| bad(e.to_string()))?;
    let mut entry = entries
        .next()
        .ok_or_else(|| bad("empty".into()))?
        .map_err(|e| bad(e.to_string()))?;
    let header = entry.header().clone();
    match header.entry_type() {
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            let mut data = Vec::new();
            entry.read_to_end(&mut data).map_err(|e| bad(e.to_string()))?;
            Ok(Content::File {
                data,
                mode: header.mode().map_err(|e| bad(e.to_string()))?,
            })
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name()
                .map_err(|e| bad(e.to_string()))?
                .ok_or_else(|| bad("a link without a target".into()))?;
            Ok(Content::Symlink(target.into_owned()))
        }
        other => Err(bad(format!("unsupported entry type {other:?}"))),
    }
}

/// A path from the sandbox, checked: relative, no `..`, not inside `.git`.
fn checked_rel(path: &str) -> Result<PathBuf, IsolateError> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(IsolateError::Refused(format!(
            "the change list names an invalid path {path:?}"
        )));
    }
    if p.components().next().is_some_and(|c| c.as_os_str() == ".git") {
        return Err(IsolateError::Refused(format!("{path} is inside .git")));
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

/// Apply `changes` (with their new `contents`) to the host project: check everything first
/// (paths, and that each touched host file is still what was packed), stage every new file
/// next to its target, then rename them all into place. A failure before the renames leaves
/// the project as it was.
pub fn apply(
    project: &Path,
    manifest: &Manifest,
    changes: &[Change],
    contents: &HashMap<String, Content>,
) -> Result<Applied, IsolateError> {
    let mut plan = Vec::new();
    for ch in changes {
        let rel = checked_rel(&ch.path)?;
        check_ancestors(project, &rel)?;
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
        let content = if ch.status == 'D' {
            None
        } else {
            Some(
                contents
                    .get(&ch.path)
                    .ok_or_else(|| IsolateError::Refused(format!("no content for {}", ch.path)))?,
            )
        };
        plan.push((ch.path.clone(), target, content));
    }

    // Stage: temporary files and links next to their targets.
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut made_dirs: Vec<PathBuf> = Vec::new();
    let stage = |staged: &mut Vec<(PathBuf, PathBuf)>, made: &mut Vec<PathBuf>| -> Result<(), IsolateError> {
        for (rel, target, content) in &plan {
            let Some(content) = content else { continue };
            let dir = target.parent().expect("inside the project");
            if !dir.exists() {
                let mut missing = Vec::new();
                let mut d = dir.to_path_buf();
                while !d.exists() {
                    missing.push(d.clone());
                    d.pop();
                }
                std::fs::create_dir_all(dir).map_err(|source| IsolateError::Write {
                    path: rel.clone(),
                    source,
                })?;
                made.extend(missing.into_iter().rev());
            }
            let tmp = dir.join(format!(
                ".agentbox-apply-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ));
            match content {
                Content::File { data, mode } => {
                    std::fs::write(&tmp, data).map_err(|source| IsolateError::Write {
                        path: rel.clone(),
                        source,
                    })?;
                    staged.push((tmp.clone(), target.clone()));
                    // Only permission bits: no setuid or setgid from the sandbox.
                    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o777)).map_err(
                        |source| IsolateError::Write {
                            path: rel.clone(),
                            source,
                        },
                    )?;
                }
                Content::Symlink(link) => {
                    std::os::unix::fs::symlink(link, &tmp).map_err(|source| IsolateError::Write {
                        path: rel.clone(),
                        source,
                    })?;
                    staged.push((tmp.clone(), target.clone()));
                }
            }
        }
        Ok(())
    };
    if let Err(e) = stage(&mut staged, &mut made_dirs) {
        for (tmp, _) in &staged {
            let _ = std::fs::remove_file(tmp);
        }
        for d in made_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        return Err(e);
    }

    // Commit.
    let mut applied = Applied::default();
    for (tmp, target) in staged {
        std::fs::rename(&tmp, &target).map_err(|source| IsolateError::Write {
            path: target.display().to_string(),
            source,
        })?;
    }
    for (rel, target, content) in &plan {
        if content.is_none() {
            std::fs::remove_file(target).map_err(|source| IsolateError::Write {
                path: rel.clone(),
                source,
            })?;
            applied.deleted.push(rel.clone());
        } else {
            applied.written.push(rel.clone());
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

    #[test]
    fn name_status_parses() {
        let c = parse_name_status(b"M\0src/a.py\0A\0new file.txt\0D\0gone.txt\0");
        assert_eq!(
            c[1],
            Change {
                status: 'A',
                path: "new file.txt".into()
            }
        );
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn apply_writes_deletes_and_refuses_conflicts_and_escapes() {
        let d = project();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let changes = vec![
            Change {
                status: 'M',
                path: "src/a.py".into(),
            },
            Change {
                status: 'A',
                path: "new/dir/b.sh".into(),
            },
            Change {
                status: 'D',
                path: "gone.txt".into(),
            },
        ];
        let contents = HashMap::from([
            (
                "src/a.py".to_string(),
                Content::File {
                    data: b"a = 2\n".to_vec(),
                    mode: 0o644,
                },
            ),
            (
                "new/dir/b.sh".to_string(),
                Content::File {
                    data: b"#!/bin/sh\n".to_vec(),
                    mode: 0o4755,
                },
            ),
        ]);
        // The host changed a.py meanwhile: nothing is applied.
        std::fs::write(d.path().join("src/a.py"), "a = 9\n").unwrap();
        let err = apply(d.path(), &packed.manifest, &changes, &contents).unwrap_err();
        assert!(
            err.to_string().contains("src/a.py changed on the host meanwhile"),
            "{err}"
        );
        assert!(!d.path().join("new").exists() && d.path().join("gone.txt").exists());
        std::fs::write(d.path().join("src/a.py"), "a = 1\n").unwrap();

        let done = apply(d.path(), &packed.manifest, &changes, &contents).unwrap();
        assert_eq!(done.written, ["src/a.py", "new/dir/b.sh"]);
        assert_eq!(
            std::fs::read_to_string(d.path().join("src/a.py")).unwrap(),
            "a = 2\n"
        );
        let mode = std::fs::metadata(d.path().join("new/dir/b.sh")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755, "no setuid from the sandbox");
        assert!(!d.path().join("gone.txt").exists());
        let leftovers = std::fs::read_dir(d.path().join("src")).unwrap().count();
        assert_eq!(leftovers, 1);
    }

    #[test]
    fn apply_never_writes_through_a_symlink_or_into_git() {
        let d = project();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("out")).unwrap();
        let packed = pack(d.path(), 0, 0, &|_| false).unwrap();
        let file = Content::File {
            data: b"x".to_vec(),
            mode: 0o644,
        };
        for path in ["out/evil.txt", ".git/hooks/pre-commit", "../x", "/etc/x"] {
            let changes = vec![Change {
                status: 'A',
                path: path.into(),
            }];
            let contents = HashMap::from([(path.to_string(), file.clone())]);
            assert!(
                apply(d.path(), &packed.manifest, &changes, &contents).is_err(),
                "{path}"
            );
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}
