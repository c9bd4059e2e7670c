//! Where suspicious things found in a project after a session go: agentbox's own data
//! directory, `quarantine/SESSION/` + the path they had in the project. Outside the project, no
//! link the sandbox left there can reach them, and the user can still inspect or restore them.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Most bytes copied when a move has to cross file systems; past this the item stays where it
/// is (and the caller says so) rather than filling the disk with what the sandbox made.
const MAX_COPY_BYTES: u64 = 1 << 30;

thread_local! {
    static TEST_ROOT: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// Unit tests: quarantine under `root` on this thread.
#[cfg(test)]
pub fn set_test_root(root: &Path) {
    TEST_ROOT.with(|r| *r.borrow_mut() = Some(root.to_path_buf()));
}

/// `$AGENTBOX_DATA_DIR`, else `$XDG_DATA_HOME/agentbox`, else `~/.local/share/agentbox`.
pub fn data_dir() -> Result<PathBuf, String> {
    if let Some(root) = TEST_ROOT.with(|r| r.borrow().clone()) {
        return Ok(root);
    }
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("AGENTBOX_DATA_DIR")
        .or_else(|| var("XDG_DATA_HOME").map(|d| d.join("agentbox")))
        .or_else(|| var("HOME").map(|h| h.join(".local/share/agentbox")))
        .ok_or_else(|| "no data directory: set AGENTBOX_DATA_DIR or HOME".to_string())
}

pub fn session_dir(session: &str) -> Result<PathBuf, String> {
    Ok(data_dir()?.join("quarantine").join(session))
}

/// Move `project/rel` to `dest/rel` (numbered if taken): a rename, or a copy and removal
/// across file systems. Never follows a link: links move as links.
pub fn move_out(project: &Path, rel: &Path, dest: &Path) -> std::io::Result<PathBuf> {
    let from = project.join(rel);
    let mut to = dest.join(rel);
    let parent = to.parent().unwrap_or(dest).to_path_buf();
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
    match std::fs::rename(&from, &to) {
        Ok(()) => Ok(to),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let mut budget = MAX_COPY_BYTES;
            if let Err(e) = copy_tree(&from, &to, &mut budget) {
                let _ = remove_tree(&to);
                return Err(e);
            }
            remove_tree(&from)?;
            Ok(to)
        }
        Err(e) => Err(e),
    }
}

fn remove_tree(p: &Path) -> std::io::Result<()> {
    // `remove_dir_all` does not follow links (and is safe against swaps since Rust 1.58).
    match p.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) => Err(e),
    }
}

/// Directories, regular files and links, as they are; anything else is left out.
fn copy_tree(from: &Path, to: &Path, budget: &mut u64) -> std::io::Result<()> {
    let meta = from.symlink_metadata()?;
    let ft = meta.file_type();
    if ft.is_dir() {
        std::fs::DirBuilder::new().mode(0o700).create(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()), budget)?;
        }
    } else if ft.is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
    } else if ft.is_file() {
        let src = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(from)?;
        let len = src.metadata()?.len();
        if !src.metadata()?.is_file() || len > *budget {
            return Err(std::io::Error::other(format!(
                "{} is too large to copy out",
                from.display()
            )));
        }
        *budget -= len;
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)?;
        std::io::copy(&mut src.take(len), &mut dst)?;
    }
    Ok(())
}
