//! Setup in an environment reads the environment's manifests (issue 34), not the checkout's:
//! where the environment's turns changed what setup reads (`project::cache_key::is_setup_input`:
//! a `requirements.txt`, a `Cargo.toml`...), setup works on a *view* — the project as the
//! environment has it, made on the host under the environment's directory from the project and
//! the environment's last checkpoint. Unchanged manifests need no view: setup reads the project
//! as before, and shares its caches.
//!
//! The view is written by `--apply`'s path (every path checked, no link followed out of it) onto
//! a fresh copy of the project, so what a checkpoint holds stays sandbox data here too. Its
//! caches are labelled with the view's path: an environment whose manifests changed has caches
//! of its own, and `env rm` removes them.

use std::path::{Path, PathBuf};

use crate::env_checkpoint::Checkpoint;
use crate::envs::{EnvError, EnvName};

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Kept(#[from] crate::env_checkpoint::RewindError),
    #[error("copying the project for the environment's view: {0}")]
    Copy(#[from] crate::hostfs::isolate::IsolateError),
    #[error("writing the environment's view {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where `name`'s view is made (see the module's documentation).
pub fn view_dir(base: &Path, name: &EnvName) -> PathBuf {
    base.join(name.as_str()).join("view")
}

/// Whether `cp` changes something setup reads.
fn touches_setup(cp: &Checkpoint) -> bool {
    cp.changed
        .entries
        .keys()
        .chain(cp.deleted.entries.keys())
        .any(|p| crate::project::cache_key::is_setup_input(&String::from_utf8_lossy(p.as_bytes())))
}

/// The directory setup should read for environment `name` of `project`: its view when its last
/// checkpoint changed what setup reads (made afresh), else `None` (the project itself). An
/// environment not made yet has no view.
pub fn for_setup(name: &EnvName, project: &Path) -> Result<Option<PathBuf>, ViewError> {
    let base = crate::envs::envs_dir()?;
    if !crate::envs::record_path(&base, name).exists() {
        return Ok(None);
    }
    let (_, latest) = crate::env_checkpoint::latest(&base, name)?;
    if !touches_setup(&latest) {
        return Ok(None);
    }
    let manifest = crate::envs::load_manifest(&base, name)?;
    let changes = crate::env_merge::changes_between(&base, name, &manifest, &Checkpoint::default(), &latest)?;
    let dir = view_dir(&base, name);
    let io = |source| ViewError::Io {
        path: dir.display().to_string(),
        source,
    };
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    std::fs::create_dir_all(&dir).map_err(io)?;
    let owner =
        crate::sandbox::inspect_project(project).map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let packed = crate::hostfs::isolate::pack(project, owner.uid, owner.gid, &|_| false)?;
    let mut archive = tar::Archive::new(std::fs::File::open(packed.tar.path()).map_err(io)?);
    archive.set_preserve_permissions(true);
    archive.unpack(&dir).map_err(io)?;
    // Onto the copy as it was packed: only the environment's changes differ from it.
    crate::hostfs::isolate::apply(&dir, &packed.manifest, &changes)?;
    Ok(Some(dir))
}
