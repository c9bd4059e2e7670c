//! Checkpoints of a named environment (issue 34): after each `run --env` turn, what rewinding
//! needs, kept on the host under the environment's directory, out of the sandbox's reach.
//!
//! `checkpoints/N.json` is the state after turn N of every path that differs from what was
//! first copied in (the manifest): `changed` (files by hash and mode, links, directories) and
//! `deleted`. File contents are kept once each, by their SHA-256, in `blobs/`: the contents the
//! turn's read-back brought (bounded by its limits) and, for a path changed for the first time,
//! the original from the host project (kept only when it still hashes to the manifest's). Every
//! file is 0600 in 0700 directories, written whole by rename; paths are checked again when read
//! (`RelPath`), and a blob is used only if it hashes to its name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::envs::{EnvError, EnvName};
use crate::hostfs::isolate::{ChangeKind, ChangeSet, Content, Entry, Manifest, RelPath};

/// The state after one turn of every path that is not as first copied in.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub changed: Manifest,
    /// Only the paths count (each stored as a directory entry).
    pub deleted: Manifest,
    /// What the turn's read-back could not bring back and `--apply` cannot do without (as the
    /// user reads it): `env merge` refuses while any is listed.
    #[serde(default)]
    pub missing: Vec<String>,
}

fn dir(base: &Path, name: &EnvName) -> PathBuf {
    base.join(name.as_str())
}

fn checkpoint_path(base: &Path, name: &EnvName, turn: usize) -> PathBuf {
    dir(base, name).join("checkpoints").join(format!("{turn}.json"))
}

fn blob_path(base: &Path, name: &EnvName, sha256: &[u8; 32]) -> PathBuf {
    dir(base, name)
        .join("blobs")
        .join(crate::hostfs::isolate::patch::hex(sha256))
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EnvError {
    let path = path.display().to_string();
    move |source| EnvError::Io { what, path, source }
}

/// Keep `data` under its hash, unless it is kept already.
fn keep_blob(base: &Path, name: &EnvName, data: &[u8]) -> Result<[u8; 32], EnvError> {
    let sum = sha256(data);
    let path = blob_path(base, name, &sum);
    if !path.exists() {
        crate::envs::write_atomic(&path, data)?;
    }
    Ok(sum)
}

/// The kept content of hash `sum`, `size` bytes: `None` when it is not kept (or does not hash
/// to its name).
pub fn blob(base: &Path, name: &EnvName, sum: &[u8; 32], size: u64) -> Result<Option<Vec<u8>>, EnvError> {
    let path = blob_path(base, name, sum);
    match crate::hostfs::isolate::hostfs::read_bounded(&path, size) {
        Ok(Some(data)) if sha256(&data) == *sum => Ok(Some(data)),
        Ok(_) => Ok(None),
        Err(crate::hostfs::isolate::hostfs::OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(io("read", &path)(std::io::Error::other(e.to_string()))),
    }
}

/// After turn `turn`: the state `set` read back (every change since the copy), its contents
/// kept, and the originals of the paths it changed, from `project` where they still match.
pub fn save(
    base: &Path,
    name: &EnvName,
    turn: usize,
    manifest: &Manifest,
    set: &ChangeSet,
    project: &Path,
) -> Result<(), EnvError> {
    let mut cp = Checkpoint {
        missing: set.missing().iter().map(|s| s.shown()).collect(),
        ..Checkpoint::default()
    };
    for (change, content) in &set.changes {
        let path = change.path.clone();
        match (change.status, content) {
            (ChangeKind::Deleted, _) => {
                cp.deleted.entries.insert(path.clone(), Entry::Dir);
            }
            (_, Some(Content::File { data, mode })) => {
                let sum = keep_blob(base, name, data)?;
                cp.changed.entries.insert(
                    path.clone(),
                    Entry::File {
                        sha256: sum,
                        blob: crate::hostfs::isolate::patch::blob_id_bytes(data),
                        size: data.len() as u64,
                        mode: *mode,
                    },
                );
            }
            (_, Some(Content::Symlink(target))) => {
                cp.changed.entries.insert(
                    path.clone(),
                    Entry::Symlink {
                        target: target.clone(),
                    },
                );
            }
            (_, None) => {
                cp.changed.entries.insert(path.clone(), Entry::Dir);
            }
        }
        if let Some(Entry::File {
            sha256: sum, size, ..
        }) = manifest.entries.get(&path)
            && !blob_path(base, name, sum).exists()
        {
            let host = project.join(path.as_path());
            if let Ok(Some(data)) = crate::hostfs::isolate::hostfs::read_bounded(&host, *size)
                && sha256(&data) == *sum
            {
                keep_blob(base, name, &data)?;
            }
        }
    }
    let json = serde_json::to_vec(&cp).map_err(|source| EnvError::Record {
        path: checkpoint_path(base, name, turn).display().to_string(),
        source,
    })?;
    crate::envs::write_atomic(&checkpoint_path(base, name, turn), &json)
}

/// The checkpoint after turn `turn` (0: nothing changed yet).
pub fn load(base: &Path, name: &EnvName, turn: usize) -> Result<Checkpoint, EnvError> {
    if turn == 0 {
        return Ok(Checkpoint::default());
    }
    let path = checkpoint_path(base, name, turn);
    match crate::envs::read_json(&path, name) {
        // Not "the environment does not exist": this turn's checkpoint is not there (a turn
        // whose changes could not be read back, or logged before checkpoints were kept).
        Err(EnvError::NotFound(_)) => Err(io("read the checkpoint", &path)(
            std::io::ErrorKind::NotFound.into(),
        )),
        other => other,
    }
}

/// The last checkpoint kept and its turn (0 and an empty one when none is).
pub fn latest(base: &Path, name: &EnvName) -> Result<(usize, Checkpoint), EnvError> {
    match turns(base, name)?.last() {
        Some(&turn) => Ok((turn, load(base, name, turn)?)),
        None => Ok((0, Checkpoint::default())),
    }
}

/// The turns that have a checkpoint, in order.
pub fn turns(base: &Path, name: &EnvName) -> Result<Vec<usize>, EnvError> {
    let d = dir(base, name).join("checkpoints");
    let entries = match std::fs::read_dir(&d) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("list", &d)(e)),
    };
    let mut out: Vec<usize> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Drop the checkpoints after turn `turn`.
pub fn truncate(base: &Path, name: &EnvName, turn: usize) -> Result<(), EnvError> {
    for t in turns(base, name)?.into_iter().filter(|&t| t > turn) {
        let p = checkpoint_path(base, name, t);
        std::fs::remove_file(&p).map_err(io("remove", &p))?;
    }
    Ok(())
}

/// `chat`'s `/undo` in an environment: its last turn taken out of the log, with its checkpoint.
pub fn drop_last_turn(name: &EnvName) -> Result<(), EnvError> {
    let base = crate::envs::envs_dir()?;
    let mut record = crate::envs::EnvRecord::load(&base, name)?;
    record.turns.pop();
    record.last_used = crate::envs::now();
    record.save(&base)?;
    truncate(&base, name, record.turns.len())
}

/// `merged.json`, beside the record: the state the last `env merge` brought into the project.
pub fn merged_path(base: &Path, name: &EnvName) -> PathBuf {
    dir(base, name).join("merged.json")
}

/// `env fork`: `from`'s checkpoints and blobs, copied under `to`.
pub fn copy_checkpoints(base: &Path, from: &EnvName, to: &EnvName) -> Result<(), EnvError> {
    let merged = merged_path(base, from);
    match std::fs::read(&merged) {
        Ok(data) => crate::envs::write_atomic(&merged_path(base, to), &data)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("read", &merged)(e)),
    }
    for sub in ["checkpoints", "blobs"] {
        let src = dir(base, from).join(sub);
        let entries = match std::fs::read_dir(&src) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("list", &src)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io("list", &src))?;
            let data = std::fs::read(entry.path()).map_err(io("read", &entry.path()))?;
            crate::envs::write_atomic(&dir(base, to).join(sub).join(entry.file_name()), &data)?;
        }
    }
    Ok(())
}

/// What a path must be after a rewind.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    Absent,
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("environment {name} has {turns} turns: there is no turn {turn} to go back to")]
    NoTurn { name: String, turns: usize, turn: usize },
    #[error("the content of {0} at that turn is not kept (its original had changed on the host)")]
    NotKept(String),
}

/// Every path a rewind to `turn` must set, and what to: the paths changed in `turn`'s
/// checkpoint or any later one, each as `turn` left it (else as first copied in, else absent).
pub fn plan(
    base: &Path,
    name: &EnvName,
    manifest: &Manifest,
    turn: usize,
) -> Result<BTreeMap<RelPath, Want>, RewindError> {
    let target = load(base, name, turn)?;
    let mut paths: BTreeSet<RelPath> = target
        .changed
        .entries
        .keys()
        .chain(target.deleted.entries.keys())
        .cloned()
        .collect();
    for t in turns(base, name)?.into_iter().filter(|&t| t > turn) {
        let later = load(base, name, t)?;
        paths.extend(later.changed.entries.into_keys());
        paths.extend(later.deleted.entries.into_keys());
    }
    let mut out = BTreeMap::new();
    for p in paths {
        let entry = if target.deleted.entries.contains_key(&p) {
            None
        } else {
            target
                .changed
                .entries
                .get(&p)
                .or_else(|| manifest.entries.get(&p))
        };
        let want = match entry {
            None => Want::Absent,
            Some(Entry::Dir) => Want::Dir,
            Some(Entry::Symlink { target }) => Want::Symlink(target.clone()),
            Some(Entry::File {
                sha256, size, mode, ..
            }) => match blob(base, name, sha256, *size)? {
                Some(data) => Want::File { data, mode: *mode },
                None => return Err(RewindError::NotKept(p.quoted())),
            },
        };
        out.insert(p, want);
    }
    Ok(out)
}

/// The restoring container's archive for `plan` (see `sandbox::env_copy::restore_env_volume`):
/// `dirs` (each wanted directory and every ancestor of a wanted file or link, shallowest
/// first), `remove` (every planned path not wanted as a directory), `prune` (the ancestors of
/// removed paths that neither `manifest` nor the plan wants, deepest first: removed if empty,
/// as the read-back does not report directories), `tree/` (the files and links).
pub fn archive(
    plan: &BTreeMap<RelPath, Want>,
    manifest: &Manifest,
) -> std::io::Result<tempfile::NamedTempFile> {
    let depth = |d: &RelPath| (d.components().count(), d.as_bytes().to_vec());
    let ancestors = |p: &RelPath| {
        let mut out = Vec::new();
        let mut a = p.parent();
        while let Some(d) = a {
            a = d.parent();
            out.push(d);
        }
        out
    };
    let mut dirs: BTreeSet<(usize, Vec<u8>)> = BTreeSet::new();
    let mut maybe_empty: BTreeSet<(usize, Vec<u8>)> = BTreeSet::new();
    let mut remove = Vec::new();
    for (p, want) in plan {
        match want {
            Want::Absent => {
                maybe_empty.extend(
                    ancestors(p)
                        .iter()
                        .filter(|d| !matches!(manifest.entries.get(*d), Some(Entry::Dir)))
                        .map(depth),
                );
            }
            _ => dirs.extend(ancestors(p).iter().map(depth)),
        }
        if *want == Want::Dir {
            dirs.insert(depth(p));
        } else {
            remove.extend_from_slice(p.as_bytes());
            remove.push(0);
        }
    }
    let nul_list = |set: Vec<(usize, Vec<u8>)>| -> Vec<u8> {
        set.into_iter()
            .flat_map(|(_, d)| d.into_iter().chain(std::iter::once(0)))
            .collect()
    };
    let mut prune: Vec<_> = maybe_empty.difference(&dirs).cloned().collect();
    prune.reverse();
    let prune = nul_list(prune);
    let dirs = nul_list(dirs.into_iter().collect());
    let file = tempfile::NamedTempFile::new()?;
    let mut tar = tar::Builder::new(file.reopen()?);
    let plain = |size: usize, mode: u32, kind: tar::EntryType| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size as u64);
        h.set_mode(mode);
        h.set_mtime(crate::envs::now());
        h
    };
    for (n, data) in [("dirs", &dirs), ("remove", &remove), ("prune", &prune)] {
        let mut h = plain(data.len(), 0o600, tar::EntryType::Regular);
        tar.append_data(&mut h, n, data.as_slice())?;
    }
    let mut h = plain(0, 0o755, tar::EntryType::Directory);
    tar.append_data(&mut h, "tree", std::io::empty())?;
    for (p, want) in plan.iter().filter(|(_, w)| **w != Want::Absent) {
        let at = Path::new("tree").join(p.as_path());
        for d in ancestors(p).iter().rev() {
            let mut h = plain(0, 0o755, tar::EntryType::Directory);
            tar.append_data(&mut h, Path::new("tree").join(d.as_path()), std::io::empty())?;
        }
        match want {
            Want::File { data, mode } => {
                let mut h = plain(data.len(), *mode & 0o7777, tar::EntryType::Regular);
                tar.append_data(&mut h, &at, data.as_slice())?;
            }
            Want::Symlink(target) => {
                let mut h = plain(0, 0o777, tar::EntryType::Symlink);
                tar.append_link(&mut h, &at, target)?;
            }
            Want::Dir => {
                let mut h = plain(0, 0o755, tar::EntryType::Directory);
                tar.append_data(&mut h, &at, std::io::empty())?;
            }
            Want::Absent => {}
        }
    }
    tar.into_inner()?.sync_all()?;
    Ok(file)
}

/// At the end of a `run --env` turn (before it is logged): its checkpoint, numbered one past
/// the turns logged.
pub fn save_turn(
    name: &EnvName,
    manifest: &Manifest,
    set: &ChangeSet,
    project: &Path,
) -> Result<(), EnvError> {
    let base = crate::envs::envs_dir()?;
    let turn = crate::envs::EnvRecord::load(&base, name)?.turns.len() + 1;
    save(&base, name, turn, manifest, set, project)
}

/// `env rewind NAME TURN`: the volume's files as turn `turn` left them (0: as created), then the
/// turn log cut after it, the checkpoints after it dropped, and the conversation dropped when
/// turns were (its next run starts the model afresh on the rewound files).
pub async fn rewind(
    docker: &bollard::Docker,
    cleanup: &crate::sandbox::Cleanup,
    name: &EnvName,
    turn: usize,
) -> Result<(), RewindAllError> {
    let base = crate::envs::envs_dir()?;
    let mut record = crate::envs::EnvRecord::load(&base, name)?;
    if turn > record.turns.len() {
        return Err(RewindError::NoTurn {
            name: name.to_string(),
            turns: record.turns.len(),
            turn,
        }
        .into());
    }
    let manifest = crate::envs::load_manifest(&base, name)?;
    let plan = plan(&base, name, &manifest, turn)?;
    let archive = archive(&plan, &manifest).map_err(|e| EnvError::Io {
        what: "write",
        path: "the rewind's archive".into(),
        source: e,
    })?;
    crate::sandbox::env_copy::restore_env_volume(
        docker,
        cleanup,
        crate::sandbox::env_copy::VolumeRestore {
            image: &record.image,
            volume: &record.volume,
            env: name.as_str(),
            session: &crate::config::new_session_id(),
            runtime: None,
        },
        archive.path(),
    )
    .await?;
    if turn < record.turns.len() {
        record.turns.truncate(turn);
        record.conversation = serde_json::Value::Null;
        // The kept conversation speaks of turns that are gone: the next run starts afresh.
        crate::envs::save_conversation(&base, name, &[])?;
    }
    record.last_used = crate::envs::now();
    record.save(&base)?;
    truncate(&base, name, turn)?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum RewindAllError {
    #[error(transparent)]
    Rewind(#[from] RewindError),
    #[error("rewinding the environment's files: {0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
}

impl From<EnvError> for RewindAllError {
    fn from(e: EnvError) -> Self {
        RewindAllError::Rewind(RewindError::Env(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn a_checkpoint_naming_a_path_outside_is_refused_and_a_bad_blob_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let name = EnvName::parse("e").unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x"] {
            let json =
                format!(r#"{{"changed":[{{"kind":"symlink","path":"{bad}","target":"t"}}],"deleted":[]}}"#);
            crate::envs::write_atomic(&checkpoint_path(tmp.path(), &name, 1), json.as_bytes()).unwrap();
            assert!(load(tmp.path(), &name, 1).is_err(), "{bad}");
        }
        let sum = keep_blob(tmp.path(), &name, b"good").unwrap();
        assert_eq!(
            blob(tmp.path(), &name, &sum, 4).unwrap().as_deref(),
            Some(&b"good"[..])
        );
        std::fs::write(blob_path(tmp.path(), &name, &sum), b"evil").unwrap();
        assert_eq!(blob(tmp.path(), &name, &sum, 4).unwrap(), None);
    }

    #[test]
    fn the_archive_lists_dirs_shallowest_first_and_prunes_what_was_added() {
        let mut manifest = Manifest::default();
        manifest.entries.insert(rel("lib"), Entry::Dir);
        let plan = BTreeMap::from([
            (rel("new/deep/x.txt"), Want::Absent),
            (
                rel("lib/keep.py"),
                Want::File {
                    data: b"k\n".to_vec(),
                    mode: 0o644,
                },
            ),
            (rel("lib"), Want::Dir),
            (rel("one.txt"), Want::Absent),
        ]);
        let file = archive(&plan, &manifest).unwrap();
        let mut files = BTreeMap::new();
        for e in tar::Archive::new(std::fs::File::open(file.path()).unwrap())
            .entries()
            .unwrap()
        {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            files.insert(e.path().unwrap().display().to_string(), data);
        }
        assert_eq!(files["dirs"], b"lib\0");
        assert_eq!(files["remove"], b"lib/keep.py\0new/deep/x.txt\0one.txt\0");
        assert_eq!(files["prune"], b"new/deep\0new\0");
        assert_eq!(files["tree/lib/keep.py"], b"k\n");
        assert!(
            !files.keys().any(|k| k.starts_with("tree/new")),
            "{:?}",
            files.keys()
        );
    }
}
