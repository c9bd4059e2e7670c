//! Dependency caches: named volumes that outlive a run, filled by the setup phase and mounted
//! read-only in the agent phase.
//!
//! A cache carries [`CACHE_LABEL`], never the session label, so neither the interrupt sweep nor
//! plain `agentbox gc` takes it; `agentbox gc --caches` does. A cache is trusted only once
//! committed: its fill happens under a cleanup registration (an interrupted setup removes it),
//! and the commit is a second, empty volume `NAME-ok` created after the setup succeeded. A data
//! volume without its `-ok` twin (the process was SIGKILLed mid-fill) is removed and filled
//! again.

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::ListVolumesOptionsBuilder;

use super::api::{remove_volume, status_of};
use super::cleanup::{Registration, Resource};
use super::containers::{Seeding, seed_volume};
use super::{SandboxError, SandboxSpec};

/// The label on every cache volume (and its commit marker); its value is the project's path.
pub const CACHE_LABEL: &str = "agentbox.cache";
/// The suffix of the commit marker's name.
pub const COMMITTED: &str = "-ok";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// Filled by a setup that finished.
    Ready,
    /// Absent, or a fill that never finished (now removed).
    Empty,
}

async fn exists(docker: &Docker, name: &str) -> Result<bool, SandboxError> {
    match docker.inspect_volume(name).await {
        Ok(_) => Ok(true),
        Err(e) if status_of(&e) == Some(404) => Ok(false),
        Err(e) => Err(SandboxError::docker("inspect volume", e)),
    }
}

/// Whether `name` holds a finished fill; a half-filled one is removed on the way.
pub async fn state(docker: &Docker, name: &str) -> Result<CacheState, SandboxError> {
    let data = exists(docker, name).await?;
    let committed = exists(docker, &format!("{name}{COMMITTED}")).await?;
    match (data, committed) {
        (true, true) => Ok(CacheState::Ready),
        (false, false) => Ok(CacheState::Empty),
        (true, false) => {
            tracing::info!(
                volume = name,
                "a dependency cache that was never committed: removed"
            );
            remove_volume(docker, name).await;
            Ok(CacheState::Empty)
        }
        (false, true) => {
            remove_volume(docker, &format!("{name}{COMMITTED}")).await;
            Ok(CacheState::Empty)
        }
    }
}

/// A label of the committed cache `name` (set by [`commit`]), if it has it.
pub async fn committed_label(docker: &Docker, name: &str, label: &str) -> Option<String> {
    docker
        .inspect_volume(&format!("{name}{COMMITTED}"))
        .await
        .ok()
        .and_then(|v| v.labels.get(label).cloned())
}

/// Create the cache volume `name`, owned by the sandbox user of `spec`, registered with the
/// run's cleanup until [`commit`]: an interruption removes it.
pub async fn create(
    docker: &Docker,
    spec: &SandboxSpec,
    name: &str,
    labels: HashMap<String, String>,
) -> Result<Registration, SandboxError> {
    let registration = spec.cleanup.register_creating(Resource::Creating {
        docker: docker.clone(),
        name: name.to_string(),
        volume: true,
    })?;
    let made = docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        })
        .await;
    if let Err(e) = made {
        spec.cleanup.release(registration);
        return Err(SandboxError::docker("create the cache volume", e));
    }
    spec.cleanup.replace(
        &registration,
        Resource::Volume {
            docker: docker.clone(),
            name: name.to_string(),
        },
    );
    // A fresh volume belongs to root: a container with only CAP_CHOWN gives it to the user.
    let seeder = format!("{}-cache-seed", spec.container_name());
    let chowned = seed_volume(docker, spec, name, &seeder, Seeding::Cache).await;
    if let Err(e) = chowned {
        remove_volume(docker, name).await;
        spec.cleanup.release(registration);
        return Err(e);
    }
    Ok(registration)
}

/// The fill finished: mark it trusted, and let it outlive the run.
pub async fn commit(
    docker: &Docker,
    spec: &SandboxSpec,
    name: &str,
    labels: HashMap<String, String>,
    registration: Registration,
) -> Result<(), SandboxError> {
    docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(format!("{name}{COMMITTED}")),
            labels: Some(labels),
            ..Default::default()
        })
        .await
        .map_err(|e| SandboxError::docker("commit the cache volume", e))?;
    spec.cleanup.release(registration);
    Ok(())
}

/// Remove a cache that was filled but is not to be trusted (the setup failed).
pub async fn discard(docker: &Docker, spec: &SandboxSpec, name: &str, registration: Registration) {
    remove_volume(docker, name).await;
    spec.cleanup.release(registration);
}

/// Every cache volume (data and marker), with the project it belongs to.
pub async fn list(docker: &Docker) -> Result<Vec<(String, String)>, SandboxError> {
    let filters = HashMap::from([("label".to_string(), vec![CACHE_LABEL.to_string()])]);
    let volumes = docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .map_err(|e| SandboxError::docker("list volumes", e))?;
    let mut out: Vec<(String, String)> = volumes
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| {
            let project = v.labels.get(CACHE_LABEL).cloned().unwrap_or_default();
            (v.name, project)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Remove a cache volume; `false` if it is in use (a run is using it) or could not go.
pub async fn remove(docker: &Docker, name: &str) -> bool {
    let opts = bollard::query_parameters::RemoveVolumeOptionsBuilder::default().build();
    match docker.remove_volume(name, Some(opts)).await {
        Ok(()) => true,
        Err(e) => status_of(&e) == Some(404),
    }
}
