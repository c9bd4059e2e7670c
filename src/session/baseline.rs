//! What changed: a snapshot of the project taken in the sandbox before the model starts, and a
//! diff against it at the end, both computed inside the container by git.
//!
//! The snapshot lives in a private git directory on the harness tmpfs, never in the project's
//! own `.git` (read-only, and its config is the repository's to set, not ours to run). With a
//! separate `GIT_DIR`, no hook, fsmonitor or diff driver configured by the repository runs.
//! For a git project (a linked worktree's or a submodule's too), its object store is borrowed
//! read-only (alternates) and its index copied, so the snapshot costs little more than hashing
//! what is new.

use std::time::Duration;

use crate::project::CACHE_DIRS;
use crate::report::ChangedFile;
use crate::sandbox::{ExecRequest, GIT_ROOT, HARNESS_DIR, Sandbox};

fn env_prefix() -> String {
    format!(
        "export GIT_DIR={HARNESS_DIR}/baseline.git GIT_WORK_TREE=/workspace GIT_CONFIG_NOSYSTEM=1 \
         GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0\n"
    )
}

fn snapshot_script() -> String {
    // Left out besides what `.gitignore` says. Build output is usually ignored by the project
    // itself; when it is not, it is the project's.
    let excludes: Vec<String> = CACHE_DIRS.iter().map(|d| format!("'{d}/'")).collect();
    format!(
        r#"set -e
{env}rm -rf "$GIT_DIR"
git init -q
git config core.autocrlf false
git config core.quotepath false
git config gc.auto 0
printf '%s\n' {excludes} '*.pyc' > "$GIT_DIR/info/exclude"
borrow() {{
  echo "$1/objects" > "$GIT_DIR/objects/info/alternates"
  cp "$2" "$GIT_DIR/index" 2>/dev/null || true
}}
if [ -d /workspace/.git/objects ]; then
  borrow /workspace/.git /workspace/.git/index
elif [ -d {git_root}/worktrees/workspace ]; then
  borrow {git_root} {git_root}/worktrees/workspace/index
elif [ -d {git_root}/objects ]; then
  borrow {git_root} {git_root}/index
fi
git add -A 2>/dev/null
git write-tree > "$GIT_DIR/BASELINE"
"#,
        env = env_prefix(),
        excludes = excludes.join(" "),
        // A linked worktree's or a submodule's repository (see `policy::GIT_ROOT`).
        git_root = GIT_ROOT,
    )
}

fn diff_script() -> String {
    format!(
        r#"set -e
{env}git add -A 2>/dev/null
base=$(cat "$GIT_DIR/BASELINE")
if [ "$1" = numstat ]; then exec git diff --cached --no-renames --numstat "$base"; fi
exec git diff --cached --no-color --no-ext-diff --no-textconv --no-renames "$base"
"#,
        env = env_prefix(),
    )
}

/// Why a baseline script did not do its work: the sandbox could not run it, or it failed.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("{what} failed ({status}): {stderr}")]
    Failed {
        what: &'static str,
        status: String,
        stderr: String,
    },
}

/// Run one of the scripts; its output (kept as `capture` says), or what failed, said as `what`.
async fn run(
    sandbox: &dyn Sandbox,
    timeout: Duration,
    argv: &[&str],
    (head, tail): (usize, usize),
    what: &'static str,
) -> Result<String, BaselineError> {
    let req = ExecRequest::argv(argv.iter().copied(), timeout).capture(head, tail);
    let out = sandbox.exec(req).await?;
    if !out.success() {
        return Err(BaselineError::Failed {
            what,
            status: out.status_line(),
            stderr: out.stderr.to_text().trim().to_string(),
        });
    }
    Ok(out.stdout.to_text())
}

/// Snapshot the project as it is now. An error here only costs the diff, not the run.
pub async fn snapshot(sandbox: &dyn Sandbox, timeout: Duration) -> Result<(), BaselineError> {
    run(
        sandbox,
        timeout,
        &["/bin/sh", "-c", &snapshot_script()],
        (8192, 8192),
        "the snapshot",
    )
    .await
    .map(drop)
}

/// The unified diff against the snapshot, up to `max_bytes` (then cut, and marked).
pub async fn diff(
    sandbox: &dyn Sandbox,
    timeout: Duration,
    max_bytes: usize,
) -> Result<String, BaselineError> {
    run(
        sandbox,
        timeout,
        &["/bin/sh", "-c", &diff_script(), "sh", "patch"],
        (max_bytes, 0),
        "git diff",
    )
    .await
}

/// Files changed since the snapshot, with line counts (`None` for binary files).
pub async fn changed_files(
    sandbox: &dyn Sandbox,
    timeout: Duration,
) -> Result<Vec<ChangedFile>, BaselineError> {
    let numstat = run(
        sandbox,
        timeout,
        &["/bin/sh", "-c", &diff_script(), "sh", "numstat"],
        (1 << 20, 0),
        "git diff",
    )
    .await?;
    Ok(parse_numstat(&numstat))
}

/// A tree of the project: the snapshot's (`BASELINE`) or a checkpoint's (`CHECKPOINT-NAME`),
/// in the private git directory.
enum Tree<'a> {
    Baseline,
    Checkpoint(&'a str),
}

/// Run `action` (a git command, `$tree` standing for the tree's file) with the index brought up
/// to date with the project first; `what` names it in an error.
async fn on_tree(
    sandbox: &dyn Sandbox,
    timeout: Duration,
    tree: Tree<'_>,
    action: &str,
    what: &'static str,
) -> Result<(), BaselineError> {
    // The checkpoint's name goes in as `$1`, never into the script's text.
    let (file, name) = match tree {
        Tree::Baseline => ("\"$GIT_DIR/BASELINE\"", None),
        Tree::Checkpoint(name) => ("\"$GIT_DIR/CHECKPOINT-$1\"", Some(name)),
    };
    let script = format!(
        "set -e\n{env}git add -A 2>/dev/null\n{action}\n",
        env = env_prefix(),
        action = action.replace("$tree", file)
    );
    let mut argv = vec!["/bin/sh", "-c", &script];
    if let Some(name) = name {
        argv.extend(["sh", name]);
    }
    run(sandbox, timeout, &argv, (8192, 8192), what).await.map(drop)
}

/// Put the project back as it was at the snapshot (for a fresh attempt): files changed are
/// restored, files added are removed, files deleted come back. Ignored files stay.
pub async fn reset(sandbox: &dyn Sandbox, timeout: Duration) -> Result<(), BaselineError> {
    on_tree(
        sandbox,
        timeout,
        Tree::Baseline,
        READ_TREE,
        "resetting the project",
    )
    .await
}

/// Record the project as it is now as checkpoint `name` (the chat's `/undo` goes back to it).
pub async fn checkpoint(sandbox: &dyn Sandbox, timeout: Duration, name: &str) -> Result<(), BaselineError> {
    on_tree(
        sandbox,
        timeout,
        Tree::Checkpoint(name),
        "git write-tree > $tree",
        "the checkpoint",
    )
    .await
}

/// Put the project back as it was at checkpoint `name`, as [`reset`] does for the snapshot.
pub async fn restore(sandbox: &dyn Sandbox, timeout: Duration, name: &str) -> Result<(), BaselineError> {
    on_tree(
        sandbox,
        timeout,
        Tree::Checkpoint(name),
        READ_TREE,
        "restoring the checkpoint",
    )
    .await
}

/// The project's files made the tree's: changed ones restored, added ones removed.
const READ_TREE: &str = "git read-tree -u --reset \"$(cat $tree)\"";

pub fn parse_numstat(text: &str) -> Vec<ChangedFile> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, '\t');
            let added = parts.next()?;
            let removed = parts.next()?;
            let path = parts.next()?;
            Some(ChangedFile {
                path: path.to_string(),
                added: added.parse().ok(),
                removed: removed.parse().ok(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numstat_parses_text_and_binary_files() {
        let files = parse_numstat("3\t1\tsrc/a.py\n-\t-\timg.png\n");
        assert_eq!(files.len(), 2);
        assert_eq!((files[0].added, files[0].removed), (Some(3), Some(1)));
        assert_eq!(files[1].added, None);
    }

    #[test]
    fn the_scripts_never_touch_the_projects_git_config() {
        let s = snapshot_script();
        assert!(s.contains("GIT_DIR=/run/agentbox/baseline.git"));
        assert!(s.contains("GIT_CONFIG_NOSYSTEM=1"));
        assert!(diff_script().contains("--no-ext-diff --no-textconv"));
    }
}
