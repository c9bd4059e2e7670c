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
    labels: HashMap<String, String>,
    volume: &Registration,
) -> Result<(), SandboxError> {
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

/// A named environment's volume (`WorkspaceSource::Env`): with a seed, created and filled as
/// `--isolate`'s is, registered with `Cleanup` only until it is filled (an interrupted copy is
/// removed), then left to outlive the process; without one, it must exist already and carry
/// the environment's label.
pub(crate) async fn prepare_env_volume(
    docker: &Docker,
    spec: &SandboxSpec,
    name: &str,
    env: &str,
    seed: Option<&Path>,
) -> Result<(), SandboxError> {
    let Some(seed) = seed else {
        let found = docker
            .inspect_volume(name)
            .await
            .map_err(|e| SandboxError::docker("inspect volume", e))?;
        return if found.labels.get(crate::policy::ENV_LABEL).map(String::as_str) == Some(env) {
            Ok(())
        } else {
            Err(SandboxError::Other(format!(
                "volume {name} is not environment {env}'s (its label does not say so)"
            )))
        };
    };
    let labels = HashMap::from([
        (crate::policy::ENV_LABEL.to_string(), env.to_string()),
        (crate::HOST_LABEL.to_string(), crate::gc::hostname()),
    ]);
    // A volume of that name already (a first run cut short before its record was written):
    // Docker would hand it back as created, and the copy would land on top of what is in it.
    if docker.inspect_volume(name).await.is_ok() {
        return Err(SandboxError::Other(format!(
            "volume {name} exists already but environment {env} has no record (a first run cut \
             short?): remove it with `agentbox env rm {env}` and run again"
        )));
    }
    let registration = spec.cleanup.register_creating(Resource::Creating {
        docker: docker.clone(),
        name: name.to_string(),
        volume: true,
    })?;
    let made = prepare_volume(docker, spec, name, seed, labels, &registration).await;
    if made.is_err() {
        remove_volume(docker, name).await;
    }
    spec.cleanup.release(registration);
    made
}
