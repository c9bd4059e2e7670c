//! One filler per dependency cache: two setups of one project starting cold at once (parallel
//! `--env` runs, say) would otherwise both find the cache empty and fill the same volume
//! together. A `flock(2)` on a file named after the cache, in agentbox's data directory, is held
//! from the check to the commit; the second setup waits, then finds the cache ready. The kernel
//! lets go when a process ends however it ends.

use std::path::{Path, PathBuf};

/// Held while a setup checks and fills one cache.
#[derive(Debug)]
pub struct CacheLock {
    _file: std::fs::File,
}

/// The lock file of cache `name` under `data_dir`.
fn path(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("locks").join(format!("{name}.lock"))
}

/// Take the lock of cache `name` (a volume name agentbox made: letters, digits and dashes),
/// calling `waiting` first when another process holds it. `None` without a data directory or
/// where the file cannot be made: setup then goes on as before, unlocked (said in the log).
pub async fn lock(data_dir: Option<PathBuf>, name: &str, waiting: impl FnOnce()) -> Option<CacheLock> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = data_dir.and_then(|d| {
        let p = path(&d, name);
        let dir = p.parent()?;
        std::fs::create_dir_all(dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&p)
            })
            .map_err(|e| tracing::info!(path = %p.display(), error = %e, "no cache lock"))
            .ok()
    })?;
    match file.try_lock() {
        Ok(()) => return Some(CacheLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => waiting(),
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::info!(error = %e, "no cache lock");
            return None;
        }
    }
    tokio::task::spawn_blocking(move || file.lock().map(|()| CacheLock { _file: file }))
        .await
        .ok()?
        .map_err(|e| tracing::info!(error = %e, "no cache lock"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_filler_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock(Some(dir.path().into()), "agentbox-deps-x", || {
            panic!("nobody holds it")
        })
        .await
        .expect("the lock");
        let waited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = waited.clone();
        let base = dir.path().to_path_buf();
        let second = tokio::spawn(async move {
            lock(Some(base), "agentbox-deps-x", move || {
                flag.store(true, std::sync::atomic::Ordering::SeqCst)
            })
            .await
        });
        // Another cache's lock is not this one's.
        assert!(
            lock(Some(dir.path().into()), "agentbox-deps-y", || panic!(
                "another cache"
            ))
            .await
            .is_some()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            !second.is_finished(),
            "the second filler went on while the first held the lock"
        );
        drop(first);
        assert!(second.await.unwrap().is_some());
        assert!(waited.load(std::sync::atomic::Ordering::SeqCst));
    }
}
