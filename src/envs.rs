//! Named environments (`--env NAME`, issue 34): the record kept on the host for each one.
//!
//! The name is checked before any path is built from it; the record lives in a directory of
//! its own under the user's data directory (0700), and is replaced whole, by `rename(2)`, so a
//! reader never sees half of one.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hostfs::isolate::Manifest;

/// The longest name an environment may have.
pub const MAX_NAME_LEN: usize = 64;

pub use crate::sandbox::ENV_LABEL;

/// The Docker volume of environment `name`.
pub fn volume_name(name: &EnvName) -> String {
    format!("agentbox-env-{name}")
}

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(
        "bad environment name {0:?}: it must match [a-z0-9][a-z0-9._-]* and have at most {MAX_NAME_LEN} characters"
    )]
    BadName(String),
    #[error("no data directory: none of AGENTBOX_DATA_DIR, XDG_DATA_HOME, HOME is set")]
    NoDataDir,
    #[error("environment {0} does not exist")]
    NotFound(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("environment {0} is in use: another `run --env {0}` holds its lock; wait for it to end")]
    Busy(String),
    #[error("{path} is larger than {max} bytes: not read")]
    TooLarge { path: String, max: u64 },
    #[error("environment record {path}: {source}")]
    Record {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A checked environment name: `[a-z0-9][a-z0-9._-]*`, at most [`MAX_NAME_LEN`] characters.
/// The one way a name reaches a path or a label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EnvName(String);

impl EnvName {
    pub fn parse(name: &str) -> Result<EnvName, EnvError> {
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let rest_ok =
            chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
        if first_ok && rest_ok && name.len() <= MAX_NAME_LEN {
            Ok(EnvName(name.to_string()))
        } else {
            Err(EnvError::BadName(name.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for EnvName {
    type Error = EnvError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        EnvName::parse(&s)
    }
}

impl From<EnvName> for String {
    fn from(n: EnvName) -> String {
        n.0
    }
}

impl std::fmt::Display for EnvName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One `run --env` turn, for `env show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub task: String,
    pub verdict: String,
    pub changed: Vec<String>,
    /// Seconds since the epoch.
    pub at: u64,
}

/// What is kept on the host for one environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvRecord {
    pub name: EnvName,
    /// The project's canonical path: `--env` with another project is refused.
    pub project: PathBuf,
    /// The Docker volume holding the environment's copy of the project.
    pub volume: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub last_used: u64,
    pub image: String,
    /// The flags a resume does not widen unless they are given again.
    pub network: bool,
    pub allow_hosts: Vec<String>,
    /// `--setup` commands it was made with.
    #[serde(default)]
    pub setup: Vec<String>,
    /// The model's messages so far, as the model client serialises them.
    pub conversation: serde_json::Value,
    pub turns: Vec<Turn>,
    /// The environment this one was forked from (`env fork`), if any.
    #[serde(default)]
    pub forked_from: Option<EnvName>,
    /// The commit the project's checkout was at when the environment was made (`env merge
    /// --branch` starts there); `None` outside a git checkout.
    #[serde(default)]
    pub base: Option<GitBase>,
}

/// The commit an environment was created from, kept in its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GitBase {
    /// `HEAD` at creation.
    pub head: String,
    /// Tracked files differed from `HEAD` at creation: the branch then starts with a commit
    /// "state at creation" holding them as they were copied in.
    pub dirty: bool,
}

/// `envs/` under agentbox's data directory (`$AGENTBOX_DATA_DIR`, else
/// `$XDG_DATA_HOME/agentbox`, else `~/.local/share/agentbox`).
pub fn envs_dir() -> Result<PathBuf, EnvError> {
    crate::hostfs::hostscan::quarantine::data_dir()
        .map(|d| d.join("envs"))
        .ok_or(EnvError::NoDataDir)
}

/// The record's file, under `base` (see [`envs_dir`]).
pub fn record_path(base: &Path, name: &EnvName) -> PathBuf {
    base.join(name.as_str()).join("record.json")
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EnvError {
    let path = path.display().to_string();
    move |source| EnvError::Io { what, path, source }
}

/// The isolate manifest's file, beside the record: kept apart, as `env list` reads every
/// record and a manifest has a line per file of the project.
pub fn manifest_path(base: &Path, name: &EnvName) -> PathBuf {
    base.join(name.as_str()).join("manifest.json")
}

/// Write `bytes` to `path` atomically (a temporary file in the same directory, flushed, then
/// renamed over the old one), the directory created 0700.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), EnvError> {
    let dir = path
        .parent()
        .ok_or_else(|| io("write", path)(std::io::ErrorKind::InvalidInput.into()))?;
    private_dir(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io("create a file in", dir))?;
    tmp.write_all(bytes).map_err(io("write", tmp.path()))?;
    tmp.as_file().sync_all().map_err(io("sync", tmp.path()))?;
    tmp.persist(path).map_err(|e| io("replace", path)(e.error))?;
    Ok(())
}

/// The most a kept conversation may weigh when read back.
pub const MAX_CONVERSATION_BYTES: u64 = 64 << 20;

/// The conversation's file, beside the record (kept apart: `env list` reads every record).
pub fn conversation_path(base: &Path, name: &EnvName) -> PathBuf {
    base.join(name.as_str()).join("conversation.json")
}

/// Keep `name`'s conversation (0600, replaced whole by `rename(2)`).
pub fn save_conversation(
    base: &Path,
    name: &EnvName,
    messages: &[crate::model::Message],
) -> Result<(), EnvError> {
    let path = conversation_path(base, name);
    let json = serde_json::to_vec(messages).map_err(|source| EnvError::Record {
        path: path.display().to_string(),
        source,
    })?;
    write_atomic(&path, &json)
}

/// `name`'s conversation so far, read as data: bounded, and messages or nothing (empty when
/// none was kept yet).
pub fn load_conversation(base: &Path, name: &EnvName) -> Result<Vec<crate::model::Message>, EnvError> {
    use std::io::Read;
    let path = conversation_path(base, name);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read", &path)(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_CONVERSATION_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read", &path))?;
    if bytes.len() as u64 > MAX_CONVERSATION_BYTES {
        return Err(EnvError::TooLarge {
            path: path.display().to_string(),
            max: MAX_CONVERSATION_BYTES,
        });
    }
    serde_json::from_slice(&bytes).map_err(|source| EnvError::Record {
        path: path.display().to_string(),
        source,
    })
}

/// Keep what was copied into `name`'s volume (what its patch and merge are computed against).
pub fn save_manifest(base: &Path, name: &EnvName, manifest: &Manifest) -> Result<(), EnvError> {
    let path = manifest_path(base, name);
    let json = serde_json::to_vec(manifest).map_err(|source| EnvError::Record {
        path: path.display().to_string(),
        source,
    })?;
    write_atomic(&path, &json)
}

/// What was copied into `name`'s volume.
pub fn load_manifest(base: &Path, name: &EnvName) -> Result<Manifest, EnvError> {
    read_json(&manifest_path(base, name), name)
}

/// One of `name`'s JSON files: [`EnvError::NotFound`] when it is not there.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path, name: &EnvName) -> Result<T, EnvError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(EnvError::NotFound(name.to_string()));
        }
        Err(e) => return Err(io("read", path)(e)),
    };
    serde_json::from_slice(&bytes).map_err(|source| EnvError::Record {
        path: path.display().to_string(),
        source,
    })
}

/// Create `dir` and its parents, 0700 for those created.
fn private_dir(dir: &Path) -> Result<(), EnvError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("create", dir))
}

impl EnvRecord {
    /// Write the record under `base`, atomically: a temporary file in the same directory,
    /// flushed, then renamed over the old one.
    pub fn save(&self, base: &Path) -> Result<PathBuf, EnvError> {
        let path = record_path(base, &self.name);
        let json = serde_json::to_vec_pretty(self).map_err(|source| EnvError::Record {
            path: path.display().to_string(),
            source,
        })?;
        write_atomic(&path, &json)?;
        Ok(path)
    }

    /// Read `name`'s record under `base`.
    pub fn load(base: &Path, name: &EnvName) -> Result<EnvRecord, EnvError> {
        read_json(&record_path(base, name), name)
    }

    /// Every record under `base`, by name; a directory whose name is not an environment's is
    /// not read.
    pub fn list(base: &Path) -> Result<Vec<EnvRecord>, EnvError> {
        let entries = match std::fs::read_dir(base) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("list", base)(e)),
        };
        let mut records = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io("list", base))?;
            let Some(name) = entry.file_name().to_str().and_then(|n| EnvName::parse(n).ok()) else {
                continue;
            };
            match EnvRecord::load(base, &name) {
                Ok(r) => records.push(r),
                Err(EnvError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        records.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(records)
    }

    /// Remove `name`'s record and its directory under `base`.
    pub fn remove(base: &Path, name: &EnvName) -> Result<(), EnvError> {
        let dir = base.join(name.as_str());
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(EnvError::NotFound(name.to_string())),
            Err(e) => Err(io("remove", &dir)(e)),
        }
    }
}

/// The lock file of `name`, in its directory.
pub fn lock_path(base: &Path, name: &EnvName) -> PathBuf {
    base.join(name.as_str()).join("lock")
}

/// Held while a run works on an environment: an advisory `flock(2)`, so the kernel lets go of
/// it when the process ends however it ends (a killed run's lock does not block the next).
#[derive(Debug)]
pub struct EnvLock {
    _file: std::fs::File,
}

/// Take `name`'s lock, or [`EnvError::Busy`] when another process holds it.
pub fn lock(base: &Path, name: &EnvName) -> Result<EnvLock, EnvError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = lock_path(base, name);
    if let Some(dir) = path.parent() {
        private_dir(dir)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io("open", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(EnvLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(EnvError::Busy(name.to_string())),
        Err(std::fs::TryLockError::Error(e)) => Err(io("lock", &path)(e)),
    }
}

/// The flags an environment was made with (`--agent-network allowlist`, `--allow-host`,
/// `--setup`): what a resumed run gets unless it gives them again.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Flags {
    pub agent_network: bool,
    pub allow_hosts: Vec<String>,
    pub setup: Vec<String>,
}

impl Flags {
    pub fn of(record: &EnvRecord) -> Flags {
        Flags {
            agent_network: record.network,
            allow_hosts: record.allow_hosts.clone(),
            setup: record.setup.clone(),
        }
    }

    /// What `given` adds to these, as flags (empty: nothing wider).
    pub fn widened_by(&self, given: &Flags) -> Vec<String> {
        let mut wider = Vec::new();
        if given.agent_network && !self.agent_network {
            wider.push("--agent-network allowlist".to_string());
        }
        for h in given.allow_hosts.iter().filter(|h| !self.allow_hosts.contains(h)) {
            wider.push(format!("--allow-host {h}"));
        }
        for c in given.setup.iter().filter(|c| !self.setup.contains(c)) {
            wider.push(format!("--setup {c:?}"));
        }
        wider
    }
}

/// Keep the flags a new environment was made with.
pub fn record_flags(name: &EnvName, flags: &Flags) -> Result<(), EnvError> {
    let base = envs_dir()?;
    let mut record = EnvRecord::load(&base, name)?;
    record.network = flags.agent_network;
    record.allow_hosts = flags.allow_hosts.clone();
    record.setup = flags.setup.clone();
    record.save(&base)?;
    Ok(())
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// After a `run --env` turn: its task, verdict and changed files in the log.
pub fn record_turn(name: &EnvName, task: &str, report: &crate::report::Report) -> Result<(), EnvError> {
    let verdict = serde_json::to_value(report.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let changed = report.changed_files.iter().map(|c| c.path.clone()).collect();
    record_turn_as(name, task, verdict, changed)
}

/// A turn in `name`'s log, whatever its end (an error's message is its verdict).
pub fn record_turn_as(
    name: &EnvName,
    task: &str,
    verdict: String,
    changed: Vec<String>,
) -> Result<(), EnvError> {
    let base = envs_dir()?;
    let mut record = EnvRecord::load(&base, name)?;
    record.turns.push(Turn {
        task: task.to_string(),
        verdict,
        changed,
        at: now(),
    });
    record.last_used = now();
    record.save(&base)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "0", "try-1", "fix.bug_2", &"a".repeat(MAX_NAME_LEN)] {
            assert!(EnvName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "A",
            "../x",
            ".x",
            "-x",
            "_x",
            "a/b",
            "a b",
            "é",
            "a\0",
            &"a".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(EnvName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_lock_at_a_time_and_none_left_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let name = EnvName::parse("one").unwrap();
        let held = lock(tmp.path(), &name).unwrap();
        assert!(matches!(lock(tmp.path(), &name), Err(EnvError::Busy(_))));
        drop(held);
        // The file is still there, unlocked: it does not block.
        assert!(lock_path(tmp.path(), &name).exists());
        lock(tmp.path(), &name).unwrap();
    }

    #[test]
    fn flags_wider_than_the_kept_ones() {
        let kept = Flags {
            agent_network: false,
            allow_hosts: vec!["a.example".into()],
            setup: vec!["make".into()],
        };
        assert!(kept.widened_by(&kept).is_empty());
        assert!(kept.widened_by(&Flags::default()).is_empty());
        let given = Flags {
            agent_network: true,
            allow_hosts: vec!["a.example".into(), "b.example".into()],
            setup: vec!["make".into()],
        };
        assert_eq!(
            kept.widened_by(&given),
            ["--agent-network allowlist", "--allow-host b.example"]
        );
    }

    #[test]
    fn a_bad_name_in_a_record_is_refused() {
        let json = r#""../x""#;
        assert!(serde_json::from_str::<EnvName>(json).is_err());
    }

    fn record(name: &str) -> EnvRecord {
        EnvRecord {
            name: EnvName::parse(name).unwrap(),
            project: "/p".into(),
            volume: format!("agentbox-env-{name}"),
            created: 1,
            last_used: 2,
            image: "agentbox/python:3.12".into(),
            network: false,
            allow_hosts: vec![],
            setup: vec![],
            conversation: serde_json::json!([{"role": "user", "content": "hi"}]),
            turns: vec![Turn {
                task: "t".into(),
                verdict: "fixed".into(),
                changed: vec!["a.py".into()],
                at: 2,
            }],
            forked_from: None,
            base: None,
        }
    }

    #[test]
    fn saved_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("envs");
        let r = record("one");
        let path = r.save(&base).unwrap();
        let mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            std::fs::metadata(&base).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(EnvRecord::load(&base, &r.name).unwrap(), r);
        // Replaced whole: no temporary file left beside it.
        r.save(&base).unwrap();
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
        record("two").save(&base).unwrap();
        std::fs::create_dir(base.join("Not-a-name")).unwrap();
        let names: Vec<String> = EnvRecord::list(&base)
            .unwrap()
            .into_iter()
            .map(|r| r.name.to_string())
            .collect();
        assert_eq!(names, ["one", "two"]);
        let mut m = Manifest::default();
        m.entries.insert(
            crate::hostfs::isolate::RelPath::new(b"a.py".to_vec()).unwrap(),
            crate::hostfs::isolate::Entry::Dir,
        );
        save_manifest(&base, &r.name, &m).unwrap();
        assert_eq!(load_manifest(&base, &r.name).unwrap().entries, m.entries);
        let said = vec![crate::model::Message::user_text("fix it".to_string())];
        save_conversation(&base, &r.name, &said).unwrap();
        let conv = conversation_path(&base, &r.name);
        assert_eq!(
            std::fs::metadata(&conv).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load_conversation(&base, &r.name).unwrap(), said);
        std::fs::write(&conv, b"{\"not\": \"messages\"}").unwrap();
        assert!(matches!(
            load_conversation(&base, &r.name),
            Err(EnvError::Record { .. })
        ));
        std::fs::File::create(&conv)
            .unwrap()
            .set_len(MAX_CONVERSATION_BYTES + 1)
            .unwrap();
        assert!(matches!(
            load_conversation(&base, &r.name),
            Err(EnvError::TooLarge { .. })
        ));
        EnvRecord::remove(&base, &r.name).unwrap();
        assert!(matches!(
            load_manifest(&base, &r.name),
            Err(EnvError::NotFound(_))
        ));
        assert!(matches!(
            EnvRecord::load(&base, &r.name),
            Err(EnvError::NotFound(_))
        ));
    }
}
