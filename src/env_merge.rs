//! `agentbox env diff NAME` and `agentbox env merge NAME` (issue 34): an environment's changes
//! as its last checkpointed turn left them, computed on the host from its checkpoint and kept
//! contents (no container, nothing read from the volume), shown as a patch or brought into the
//! project through `--apply`'s path (every path checked, all or nothing, a path the user changed
//! since refused).
//!
//! Both work against the environment's *merge base*: what was first copied in, overlaid with
//! what the last `env merge` wrote (`merged.json`). So a second merge brings only what changed
//! since the first, and merging twice brings nothing.

use std::collections::BTreeSet;
use std::path::Path;

use crate::env_checkpoint::{Checkpoint, RewindError, merged_path};
use crate::envs::{EnvError, EnvName, EnvRecord};
use crate::hostfs::isolate::{self, Change, ChangeKind, Content, Entry, Manifest, RelPath};

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Kept(#[from] RewindError),
    #[error(
        "nothing merged: {paths} could not be brought back from the sandbox when turn {turn} ended \
         (too large, or not a file or link); change or remove them in the environment, then merge"
    )]
    Missing { paths: String, turn: usize },
    #[error(
        "nothing merged into {project} from environment {name}: {reason} (since {name} was made, \
         or last merged); `agentbox env diff {name}` shows what it would change"
    )]
    Apply {
        project: String,
        name: String,
        reason: String,
    },
    #[error("merging was interrupted: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// What the last merge wrote (empty before any).
fn load_merged(base: &Path, name: &EnvName) -> Result<Checkpoint, EnvError> {
    match crate::envs::read_json(&merged_path(base, name), name) {
        Err(EnvError::NotFound(_)) => Ok(Checkpoint::default()),
        other => other,
    }
}

/// What a path is in `state` laid over `manifest` (`None`: absent).
fn at<'a>(manifest: &'a Manifest, state: &'a Checkpoint, p: &RelPath) -> Option<&'a Entry> {
    if state.deleted.entries.contains_key(p) {
        return None;
    }
    state.changed.entries.get(p).or_else(|| manifest.entries.get(p))
}

/// The same for the project: the same bytes and the same executable bit, or the same link.
fn same(a: Option<&Entry>, b: Option<&Entry>) -> bool {
    match (a, b) {
        (None, None) | (Some(Entry::Dir), Some(Entry::Dir)) => true,
        (
            Some(Entry::File {
                sha256: x, mode: mx, ..
            }),
            Some(Entry::File {
                sha256: y, mode: my, ..
            }),
        ) => x == y && (mx & 0o111 != 0) == (my & 0o111 != 0),
        (Some(Entry::Symlink { target: x }), Some(Entry::Symlink { target: y })) => x == y,
        _ => false,
    }
}

/// What to change in the project, from `base` (what it has, as far as agentbox knows) to
/// `want`: the isolate path's changeset, file contents from the environment's kept blobs.
/// Directories are not changes of their own (the read-back reports files and links; a file's
/// directories are made when it is written).
pub fn changes_between(
    base_dir: &Path,
    name: &EnvName,
    manifest: &Manifest,
    base: &Checkpoint,
    want: &Checkpoint,
) -> Result<Vec<(Change, Option<Content>)>, RewindError> {
    let paths: BTreeSet<&RelPath> = [base, want]
        .iter()
        .flat_map(|c| c.changed.entries.keys().chain(c.deleted.entries.keys()))
        .collect();
    let mut out = Vec::new();
    for p in paths {
        let (was, now) = (at(manifest, base, p), at(manifest, want, p));
        // A directory is made by writing a file under it; a directory that became a file or a
        // link is a change (which `apply` refuses while the host has the directory), never
        // dropped: a merge that skipped it would record as merged what it never wrote.
        if same(was, now)
            || matches!(now, Some(Entry::Dir))
            || (matches!(was, Some(Entry::Dir)) && now.is_none())
        {
            continue;
        }
        let status = match (was, now) {
            (_, None) => ChangeKind::Deleted,
            (None, _) => ChangeKind::Added,
            (Some(Entry::File { .. }), Some(Entry::File { .. }))
            | (Some(Entry::Symlink { .. }), Some(Entry::Symlink { .. })) => ChangeKind::Modified,
            _ => ChangeKind::TypeChanged,
        };
        let content = match now {
            None | Some(Entry::Dir) => None,
            Some(Entry::Symlink { target }) => Some(Content::Symlink(target.clone())),
            Some(Entry::File {
                sha256, size, mode, ..
            }) => match crate::env_checkpoint::blob(base_dir, name, sha256, *size)? {
                Some(data) => Some(Content::File { data, mode: *mode }),
                None => return Err(RewindError::NotKept(p.quoted())),
            },
        };
        out.push((
            Change {
                status,
                path: p.clone(),
            },
            content,
        ));
    }
    Ok(out)
}

/// What `env diff` shows and `env merge` applies.
pub struct Pending {
    pub record: EnvRecord,
    /// The merge base as a manifest (what the project is expected to have at each path).
    pub base: Manifest,
    pub changes: Vec<(Change, Option<Content>)>,
    /// The checkpoint's turn, and the environment's last turn (more when that turn's checkpoint
    /// could not be kept).
    pub turn: usize,
    pub turns: usize,
    latest: Checkpoint,
}

impl Pending {
    /// A line for the user when the last turn's checkpoint is not the last turn.
    pub fn stale(&self) -> Option<String> {
        (self.turn < self.turns).then(|| {
            format!(
                "turn {} left no checkpoint (see that run's warnings): this is the environment as turn {} left it",
                self.turns, self.turn
            )
        })
    }
}

/// `name`'s changes since it was made, or since its last merge.
pub fn pending(base_dir: &Path, name: &EnvName) -> Result<Pending, MergeError> {
    let record = EnvRecord::load(base_dir, name)?;
    let manifest = crate::envs::load_manifest(base_dir, name)?;
    let merged = load_merged(base_dir, name)?;
    let (turn, latest) = crate::env_checkpoint::latest(base_dir, name)?;
    let changes = changes_between(base_dir, name, &manifest, &merged, &latest)?;
    let mut base = manifest;
    for p in merged.deleted.entries.keys() {
        base.entries.remove(p);
    }
    base.entries.extend(merged.changed.entries.clone());
    let turns = record.turns.len();
    Ok(Pending {
        record,
        base,
        changes,
        turn,
        turns,
        latest,
    })
}

/// `env merge NAME`: the pending changes into the project, all or none (inside the run's
/// critical section, as `--apply`), then the merge base moved to what was merged. The caller
/// holds the environment's lock.
pub async fn merge(
    base_dir: &Path,
    name: &EnvName,
    cleanup: &crate::sandbox::Cleanup,
) -> Result<(Pending, isolate::Applied), MergeError> {
    let pending = pending(base_dir, name)?;
    if !pending.latest.missing.is_empty() {
        return Err(MergeError::Missing {
            paths: pending.latest.missing.join(", "),
            turn: pending.turn,
        });
    }
    if pending.changes.is_empty() {
        return Ok((pending, isolate::Applied::default()));
    }
    let cleanup = cleanup.clone();
    let (project, base, changes) = (
        pending.record.project.clone(),
        pending.base.clone(),
        pending.changes.clone(),
    );
    let json = serde_json::to_vec(&pending.latest).map_err(|source| EnvError::Record {
        path: merged_path(base_dir, name).display().to_string(),
        source,
    })?;
    let merged = merged_path(base_dir, name);
    // The new merge base in the same critical section as the writes: an interruption finds
    // both done or neither.
    let (applied, kept) = tokio::task::spawn_blocking(move || {
        let _held = cleanup.critical();
        let applied = isolate::apply(&project, &base, &changes);
        let kept = match &applied {
            Ok(_) => crate::envs::write_atomic(&merged, &json),
            Err(_) => Ok(()),
        };
        (applied, kept)
    })
    .await?;
    let applied = applied.map_err(|e| MergeError::Apply {
        project: pending.record.project.display().to_string(),
        name: name.to_string(),
        reason: match e {
            isolate::IsolateError::Refused(why) => why,
            other => other.to_string(),
        },
    })?;
    kept?;
    Ok((pending, applied))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn file(base: &Path, name: &EnvName, data: &[u8], mode: u32) -> Entry {
        use sha2::Digest as _;
        let sha256: [u8; 32] = sha2::Sha256::digest(data).into();
        crate::envs::write_atomic(
            &base
                .join(name.as_str())
                .join("blobs")
                .join(isolate::patch::hex(&sha256)),
            data,
        )
        .unwrap();
        Entry::File {
            sha256,
            blob: isolate::patch::blob_id_bytes(data),
            size: data.len() as u64,
            mode,
        }
    }

    fn state(changed: &[(&str, Entry)], deleted: &[&str]) -> Checkpoint {
        let mut c = Checkpoint::default();
        for (p, e) in changed {
            c.changed.entries.insert(rel(p), e.clone());
        }
        for p in deleted {
            c.deleted.entries.insert(rel(p), Entry::Dir);
        }
        c
    }

    fn shown(changes: &[(Change, Option<Content>)]) -> Vec<String> {
        changes
            .iter()
            .map(|(c, n)| {
                let what = match n {
                    None => "-".to_string(),
                    Some(Content::File { data, .. }) => String::from_utf8_lossy(data).into_owned(),
                    Some(Content::Symlink(t)) => format!("-> {}", t.display()),
                };
                format!("{:?} {} {what}", c.status, c.path)
            })
            .collect()
    }

    #[test]
    fn a_second_merge_brings_only_what_changed_since_the_first_and_a_revert_puts_the_original_back() {
        let tmp = tempfile::tempdir().unwrap();
        let name = EnvName::parse("e").unwrap();
        let b = tmp.path();
        let mut manifest = Manifest::default();
        manifest.entries.insert(rel("a.py"), file(b, &name, b"a0", 0o644));
        manifest.entries.insert(rel("b.py"), file(b, &name, b"b0", 0o644));
        manifest
            .entries
            .insert(rel("gone.py"), file(b, &name, b"g0", 0o644));
        manifest.entries.insert(rel("lib"), Entry::Dir);

        let turn1 = state(
            &[
                ("a.py", file(b, &name, b"a1", 0o644)),
                ("new.py", file(b, &name, b"n1", 0o755)),
            ],
            &["gone.py"],
        );
        let first = changes_between(b, &name, &manifest, &Checkpoint::default(), &turn1).unwrap();
        assert_eq!(
            shown(&first),
            ["Modified a.py a1", "Deleted gone.py -", "Added new.py n1"]
        );
        // Merged: nothing more to bring.
        assert!(
            changes_between(b, &name, &manifest, &turn1, &turn1)
                .unwrap()
                .is_empty()
        );

        // Turn 2 changes b.py and puts a.py back as it was copied in.
        let turn2 = state(
            &[
                ("b.py", file(b, &name, b"b2", 0o644)),
                ("new.py", file(b, &name, b"n1", 0o755)),
            ],
            &["gone.py"],
        );
        assert_eq!(
            shown(&changes_between(b, &name, &manifest, &turn1, &turn2).unwrap()),
            ["Modified a.py a0", "Modified b.py b2"]
        );
        // Only the executable bit: still a change.
        let chmod = state(&[("a.py", file(b, &name, b"a0", 0o755))], &[]);
        assert_eq!(
            shown(&changes_between(b, &name, &manifest, &Checkpoint::default(), &chmod).unwrap()),
            ["Modified a.py a0"]
        );
    }

    #[test]
    fn a_directory_that_became_a_file_is_a_change_not_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let name = EnvName::parse("e").unwrap();
        let b = tmp.path();
        let mut manifest = Manifest::default();
        manifest.entries.insert(rel("lib"), Entry::Dir);
        manifest
            .entries
            .insert(rel("lib/a.py"), file(b, &name, b"a", 0o644));
        let want = state(&[("lib", file(b, &name, b"x", 0o644))], &["lib/a.py"]);
        assert_eq!(
            shown(&changes_between(b, &name, &manifest, &Checkpoint::default(), &want).unwrap()),
            ["TypeChanged lib x", "Deleted lib/a.py -"]
        );
    }

    #[test]
    fn a_content_that_is_not_kept_is_refused_not_guessed() {
        let tmp = tempfile::tempdir().unwrap();
        let name = EnvName::parse("e").unwrap();
        let b = tmp.path();
        let entry = file(b, &name, b"x", 0o644);
        let Entry::File { sha256, .. } = &entry else {
            unreachable!()
        };
        std::fs::remove_file(b.join("e").join("blobs").join(isolate::patch::hex(sha256))).unwrap();
        let want = state(&[("x.py", entry)], &[]);
        assert!(matches!(
            changes_between(b, &name, &Manifest::default(), &Checkpoint::default(), &want),
            Err(RewindError::NotKept(_))
        ));
    }
}
