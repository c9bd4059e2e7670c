//! Where suspicious things found in a project after a session go: out of the project, into
//! agentbox's own data directory (`quarantine/SESSION/` + the path they had in the project),
//! where no link the sandbox left in the project can reach them and the user can still inspect
//! or restore them.
//!
//! Only ever by `rename(2)`, which moves a link as a link and a tree at once: nothing the
//! sandbox made is read or copied. When the data directory is on another file system, the
//! holding directory is `.agentbox-quarantine/` next to the project (the same file system, and
//! still outside the project); if neither can take it, the item stays and the caller says so.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

thread_local! {
    static TEST_ROOT: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// Unit tests: quarantine under `root` on this thread.
#[cfg(test)]
pub(crate) fn set_test_root(root: &Path) {
    TEST_ROOT.with(|r| *r.borrow_mut() = Some(root.to_path_buf()));
}

/// `$AGENTBOX_DATA_DIR`, else `$XDG_DATA_HOME/agentbox`, else `~/.local/share/agentbox`.
pub fn data_dir() -> Option<PathBuf> {
    if let Some(root) = TEST_ROOT.with(|r| r.borrow().clone()) {
        return Some(root);
    }
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("AGENTBOX_DATA_DIR")
        .or_else(|| var("XDG_DATA_HOME").map(|d| d.join("agentbox")))
        .or_else(|| var("HOME").map(|h| h.join(".local/share/agentbox")))
}

/// Where a session's quarantine goes: the data directory's when it is on the project's file
/// system, else next to the project.
fn holding_dir(project: &Path, session: &str) -> std::io::Result<PathBuf> {
    let dev = project.metadata()?.dev();
    let mut candidates = Vec::new();
    if let Some(d) = data_dir() {
        candidates.push(d.join("quarantine").join(session));
    }
    if let Some(parent) = project.parent() {
        candidates.push(parent.join(".agentbox-quarantine").join(session));
    }
    for dir in candidates {
        if std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .is_ok()
            && dir.metadata().is_ok_and(|m| m.dev() == dev)
            && !dir.starts_with(project)
        {
            return Ok(dir);
        }
    }
    Err(std::io::Error::other(
        "no quarantine directory on the project's file system (set AGENTBOX_DATA_DIR to one)",
    ))
}

/// Move `project/rel` to the session's holding directory (same relative path, numbered if
/// taken). Every directory on the way in the project must be a real directory: the caller
/// made sure, and nothing of the sandbox runs any more.
pub(crate) fn move_out(project: &Path, rel: &Path, session: &str) -> std::io::Result<PathBuf> {
    let dest = holding_dir(project, session)?;
    let from = project.join(rel);
    let mut to = dest.join(rel);
    let parent = to.parent().unwrap_or(&dest).to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)?;
    let mut n = 1;
    while to.symlink_metadata().is_ok() {
        let name = rel.file_name().unwrap_or_default().to_string_lossy();
        to = parent.join(format!("{name}-{n}"));
        n += 1;
    }
    std::fs::rename(&from, &to)?;
    Ok(to)
}
