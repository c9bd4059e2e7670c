//! `agentbox env fork NAME NEW`: a new environment with NAME's files (a volume-to-volume copy)
//! and its record, manifest and checkpoints; the new record names its origin.

use std::path::Path;

use crate::envs::{EnvError, EnvName, EnvRecord, envs_dir, load_manifest, now, save_manifest, volume_name};
use crate::sandbox::{Cleanup, SandboxError};

#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("environment {0} exists already")]
    Exists(String),
    #[error("copying the environment's files: {0}")]
    Sandbox(#[from] SandboxError),
}

/// Fork `from` into `to`: the files first (the volume copied by a locked-down helper), then
/// the host's files, so a record never names a volume that is not there; a failure after the
/// copy removes the new volume and whatever of the new record was written.
pub async fn fork(
    docker: &bollard::Docker,
    cleanup: &Cleanup,
    from: &EnvName,
    to: &EnvName,
) -> Result<EnvRecord, ForkError> {
    let base = envs_dir()?;
    let source = EnvRecord::load(&base, from)?;
    if base.join(to.as_str()).exists() {
        return Err(ForkError::Exists(to.to_string()));
    }
    let manifest = load_manifest(&base, from)?;
    let volume = volume_name(to);
    crate::sandbox::env_copy::fork_env_volume(
        docker,
        cleanup,
        crate::sandbox::env_copy::VolumeFork {
            image: &source.image,
            from: &source.volume,
            from_env: from.as_str(),
            to: &volume,
            env: to.as_str(),
            session: &crate::config::new_session_id(),
            runtime: None,
        },
    )
    .await?;
    let at = now();
    let record = EnvRecord {
        name: to.clone(),
        volume: volume.clone(),
        created: at,
        last_used: at,
        forked_from: Some(from.clone()),
        ..source
    };
    let written = write_host_side(&base, from, &record, &manifest);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(base.join(to.as_str()));
        let _ = docker
            .remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>)
            .await;
        return Err(e.into());
    }
    Ok(record)
}

/// The new environment's directory: its manifest, its checkpoints, then its record last (a
/// directory without a record is not an environment `env list` shows).
fn write_host_side(
    base: &Path,
    from: &EnvName,
    record: &EnvRecord,
    manifest: &crate::hostfs::isolate::Manifest,
) -> Result<(), EnvError> {
    save_manifest(base, &record.name, manifest)?;
    crate::env_checkpoint::copy_checkpoints(base, from, &record.name)?;
    let conversation = crate::envs::load_conversation(base, from)?;
    crate::envs::save_conversation(base, &record.name, &conversation)?;
    record.save(base)?;
    Ok(())
}
