//! `agentbox env merge NAME --branch BRANCH`: a git branch in the user's repository with one
//! commit per turn, on the commit the environment was created from, built with git's plumbing
//! from objects agentbox computes itself: the bytes of each file come from the checkpoints
//! (`env_checkpoint`), go in by `hash-object -w --no-filters --stdin` (no `.gitattributes`
//! filter is run, whoever wrote it), into a temporary index (`GIT_INDEX_FILE`: the user's index
//! and working tree are never touched), `write-tree`, `commit-tree` and `update-ref` (which
//! refuses a branch that exists), every command with `core.hooksPath=/dev/null` (`update-ref`
//! runs `reference-transaction` hooks) and `core.fsmonitor=false`.

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::envs::{EnvError, EnvName, EnvRecord, GitBase};
use crate::hostfs::isolate::{Entry, Manifest, RelPath};

#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("bad branch name {0:?}")]
    BadName(String),
    #[error("branch {0} exists already")]
    Exists(String),
    #[error(
        "environment {0} was not made in a git repository's checkout (or before agentbox kept its base commit)"
    )]
    NoBase(String),
    #[error("git {what}: {detail}")]
    Git { what: String, detail: String },
    #[error("{0} as it was at the environment's creation is no longer anywhere agentbox can read it")]
    Lost(String),
    #[error("the content of {0} after a turn is not kept")]
    NotKept(String),
}

fn git(project: &Path) -> Command {
    let mut cmd = Command::new("git");
    // --no-optional-locks: `status` does not write the refreshed index back (the user's
    // index is never written).
    cmd.arg("-C")
        .arg(project)
        .arg("--no-optional-locks")
        .args(["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"])
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null());
    cmd
}

/// Run `cmd` with `input` on its stdin; its trimmed stdout.
fn output(mut cmd: Command, what: &str, input: Option<&[u8]>) -> Result<Vec<u8>, BranchError> {
    let err = |detail: String| BranchError::Git {
        what: what.to_string(),
        detail,
    };
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| err(e.to_string()))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(data).map_err(|e| err(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    let mut s = out.stdout;
    while s.last().is_some_and(|b| b.is_ascii_whitespace()) {
        s.pop();
    }
    Ok(s)
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).into_owned()
}

/// At an environment's creation: `HEAD` and whether tracked files differ from it; `None` when
/// the project is not a git checkout with a commit.
pub fn base_of(project: &Path) -> Option<GitBase> {
    let mut cmd = git(project);
    cmd.args(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]);
    let head = text(output(cmd, "rev-parse", None).ok()?);
    let mut cmd = git(project);
    cmd.args(["status", "--porcelain", "--untracked-files=no", "-z"]);
    let dirty = !output(cmd, "status", None).ok()?.is_empty();
    Some(GitBase { head, dirty })
}

/// A path git would refuse or act on: any `.git` component (any case).
fn committable(p: &RelPath) -> bool {
    p.components().all(|c| !c.eq_ignore_ascii_case(b".git"))
}

struct Repo<'a> {
    project: &'a Path,
    index: PathBuf,
}

impl Repo<'_> {
    fn git(&self) -> Command {
        let mut cmd = git(self.project);
        cmd.env("GIT_INDEX_FILE", &self.index);
        cmd
    }

    fn run(&self, args: &[&str], input: Option<&[u8]>) -> Result<String, BranchError> {
        let mut cmd = self.git();
        cmd.args(args);
        output(cmd, args[0], input).map(text)
    }

    /// Store `data` as a blob, as it is: no filter, whatever attributes say.
    fn blob(&self, data: &[u8]) -> Result<String, BranchError> {
        self.run(&["hash-object", "-w", "--no-filters", "--stdin"], Some(data))
    }

    fn has_blob(&self, id: &str) -> bool {
        let mut cmd = self.git();
        cmd.args(["cat-file", "-e", &format!("{id}^{{blob}}")]);
        output(cmd, "cat-file", None).is_ok()
    }

    /// Set the paths `lines` name in the temporary index (see [`index_line`]), in one call.
    fn set(&self, lines: &[u8]) -> Result<(), BranchError> {
        if !lines.is_empty() {
            self.run(&["update-index", "-z", "--index-info"], Some(lines))?;
        }
        Ok(())
    }

    fn commit(&self, parent: &str, message: &str) -> Result<String, BranchError> {
        let tree = self.run(&["write-tree"], None)?;
        self.run(
            &["commit-tree", &tree, "-p", parent, "-F", "-"],
            Some(message.as_bytes()),
        )
    }
}

/// One `update-index --index-info` record: `path` as (mode, blob), or removed (`None`).
fn index_line(lines: &mut Vec<u8>, path: &RelPath, entry: Option<(u32, &str)>) {
    match entry {
        Some((mode, id)) => lines.extend_from_slice(format!("{mode:o} {id}\t").as_bytes()),
        None => lines.extend_from_slice(b"0 0000000000000000000000000000000000000000\t"),
    }
    lines.extend_from_slice(path.as_bytes());
    lines.push(0);
}

fn hex(b: &[u8]) -> String {
    crate::hostfs::isolate::patch::hex(b)
}

fn file_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 { 0o100755 } else { 0o100644 }
}

/// Create `branch` in `record`'s project from its checkpoints; returns the commits made.
pub fn merge_branch(base: &Path, record: &EnvRecord, branch: &str) -> Result<Vec<String>, BranchError> {
    let name: &EnvName = &record.name;
    let git_base = record
        .base
        .clone()
        .ok_or_else(|| BranchError::NoBase(name.to_string()))?;
    let project = record.project.as_path();
    let mut cmd = git(project);
    cmd.args(["check-ref-format", "--branch", branch]);
    if output(cmd, "check-ref-format", None).is_err() || branch.starts_with('-') {
        return Err(BranchError::BadName(branch.to_string()));
    }
    let refname = format!("refs/heads/{branch}");
    let mut cmd = git(project);
    cmd.args(["rev-parse", "--verify", "--quiet", &refname]);
    if output(cmd, "rev-parse", None).is_ok() {
        return Err(BranchError::Exists(branch.to_string()));
    }
    let manifest = crate::envs::load_manifest(base, name)?;
    let tmp = tempfile::tempdir().map_err(|e| EnvError::Io {
        what: "create",
        path: "a temporary directory".into(),
        source: e,
    })?;
    let repo = Repo {
        project,
        index: tmp.path().join("index"),
    };
    repo.run(&["read-tree", &git_base.head], None)?;
    let mut parent = git_base.head.clone();
    let mut commits = Vec::new();
    if git_base.dirty {
        creation_state(&repo, &manifest)?;
        parent = repo.commit(&parent, "state at creation")?;
        commits.push(parent.clone());
    }
    let creation_tree = repo.run(&["write-tree"], None)?;
    for (i, turn) in record.turns.iter().enumerate() {
        let cp = crate::env_checkpoint::load(base, name, i + 1)?;
        repo.run(&["read-tree", &creation_tree], None)?;
        let mut lines = Vec::new();
        for (path, entry) in &cp.changed.entries {
            if !committable(path) {
                continue;
            }
            match entry {
                Entry::File {
                    sha256, size, mode, ..
                } => {
                    let data = crate::env_checkpoint::blob(base, name, sha256, *size)?
                        .ok_or_else(|| BranchError::NotKept(path.quoted()))?;
                    let id = repo.blob(&data)?;
                    index_line(&mut lines, path, Some((file_mode(*mode), &id)));
                }
                Entry::Symlink { target } => {
                    let id = repo.blob(target.as_os_str().as_bytes())?;
                    index_line(&mut lines, path, Some((0o120000, &id)));
                }
                Entry::Dir => {}
            }
        }
        for path in cp.deleted.entries.keys().filter(|p| committable(p)) {
            index_line(&mut lines, path, None);
        }
        repo.set(&lines)?;
        let message = if turn.task.trim().is_empty() {
            format!("turn {}", i + 1)
        } else {
            turn.task.clone()
        };
        parent = repo.commit(&parent, &message)?;
        commits.push(parent.clone());
    }
    // Refused if the branch appeared meanwhile: the old value must be "none".
    repo.run(
        &[
            "update-ref",
            &refname,
            &parent,
            "0000000000000000000000000000000000000000",
        ],
        None,
    )?;
    Ok(commits)
}

/// Into the temporary index (holding `HEAD`): every tracked path as it was copied in, where
/// it differs. Its bytes: the repository's object when it has it, else the host's file if it
/// still hashes to what was copied.
fn creation_state(repo: &Repo<'_>, manifest: &Manifest) -> Result<(), BranchError> {
    let listed = repo.run(&["ls-files", "-s", "-z"], None)?;
    let mut lines = Vec::new();
    for rec in listed.split('\0').filter(|r| !r.is_empty()) {
        let Some((meta, path)) = rec.split_once('\t') else {
            continue;
        };
        let mut f = meta.split(' ');
        let (Some(mode), Some(id)) = (f.next(), f.next()) else {
            continue;
        };
        let Some(rel) = RelPath::new(path.as_bytes().to_vec()) else {
            continue;
        };
        match manifest.entries.get(&rel) {
            None => index_line(&mut lines, &rel, None),
            Some(Entry::File {
                blob, mode: m, size, ..
            }) => {
                let want = hex(blob);
                let want_mode = file_mode(*m);
                if want == id && format!("{want_mode:o}") == mode {
                    continue;
                }
                if !repo.has_blob(&want) {
                    let host = repo.project.join(rel.as_path());
                    let data = crate::hostfs::isolate::hostfs::read_bounded(&host, *size)
                        .ok()
                        .flatten()
                        .filter(|d| hex(&crate::hostfs::isolate::patch::blob_id_bytes(d)) == want)
                        .ok_or_else(|| BranchError::Lost(rel.quoted()))?;
                    repo.blob(&data)?;
                }
                index_line(&mut lines, &rel, Some((want_mode, &want)));
            }
            Some(Entry::Symlink { target }) => {
                let id = repo.blob(OsStr::new(target.as_os_str()).as_bytes())?;
                index_line(&mut lines, &rel, Some((0o120000, &id)));
            }
            Some(Entry::Dir) => index_line(&mut lines, &rel, None),
        }
    }
    repo.set(&lines)
}
