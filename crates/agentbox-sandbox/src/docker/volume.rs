//! A project copied into a volume (`--isolate`, a remote engine): the volume created, given
//! to the sandbox user, and filled through the archive API.

use super::*;
use crate::containers::Seeding;

/// Create the session's volume and fill it: the project's tar goes in through the archive
/// API, then a seeder with only CAP_CHOWN gives the volume's root to the sandbox user.
pub(crate) async fn prepare_volume(
    docker: &Docker,
    spec: &SandboxSpec,
    name: &str,
    seed: &Path,
    volume: &Registration,
) -> Result<(), SandboxError> {
    let labels = spec.labels();
    let made = docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        })
        .await;
    made.map_err(|e| SandboxError::docker("create volume", e))?;
    spec.cleanup.replace(
        volume,
        Resource::Volume {
            docker: docker.clone(),
            name: name.to_string(),
        },
    );
    let seeder = format!("{}-seed", spec.container_name());
    crate::containers::seed_volume(docker, spec, name, &seeder, Seeding::Project { archive: seed }).await
}
