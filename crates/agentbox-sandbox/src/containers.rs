//! Containers of a sandbox's spec (the sandbox's own, and the helpers that seed a volume or
//! read an image), created so that the run's cleanup knows them from the moment their create
//! request is sent.

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::query_parameters::CreateContainerOptionsBuilder;

use super::SandboxError;
use super::api::{container_error, status_of};
use super::cleanup::{Cleanup, Registration, Resource};
use super::policy::SandboxSpec;

/// Create the container `body` describes, named `name`, registered with the run's cleanup from the
/// moment its create request is sent (by name) and, once answered, as the container with the
/// user cleanup tidies as: no interruption can leave it behind. A 404 means the image is missing.
pub(crate) async fn create_tracked(
    docker: &Docker,
    cleanup: &Cleanup,
    name: &str,
    mut body: bollard::models::ContainerCreateBody,
    what: &'static str,
    user: String,
) -> Result<(String, Registration), SandboxError> {
    if super::flavor::info(docker).await.is_podman() {
        seccomp_as_file(&mut body)?;
    }
    let image = body.image.clone().unwrap_or_default();
    let runtime = body.host_config.as_ref().and_then(|h| h.runtime.clone());
    let registration = cleanup.register_creating(Resource::Creating {
        docker: docker.clone(),
        name: name.to_string(),
        volume: false,
    })?;
    let made = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::default().name(name).build()),
            body,
        )
        .await;
    // Answered (no await from here on, so no cancellation in between).
    match made {
        Ok(m) => {
            cleanup.replace(
                &registration,
                Resource::Container {
                    docker: docker.clone(),
                    id: m.id.clone(),
                    user,
                },
            );
            Ok((m.id, registration))
        }
        Err(e) => {
            cleanup.release(registration);
            Err(match (status_of(&e), &runtime) {
                (Some(404), _) => SandboxError::ImageMissing {
                    image,
                    detail: String::new(),
                },
                (Some(400), Some(runtime)) if super::messages::UNKNOWN_RUNTIME.in_message(&e.to_string()) => {
                    SandboxError::UnknownRuntime {
                        name: runtime.clone(),
                        known: known_runtimes(docker).await,
                    }
                }
                _ => SandboxError::docker(what, e),
            })
        }
    }
}

/// What a seeder fills: the session's project volume (its tar uploaded first) or a fresh
/// dependency cache (only given to the sandbox user).
pub(crate) enum Seeding<'a> {
    Project { archive: &'a std::path::Path },
    Cache,
}

impl Seeding<'_> {
    fn container(&self) -> &'static str {
        match self {
            Seeding::Project { .. } => "the seeding container",
            Seeding::Cache => "the cache seeding container",
        }
    }
}

/// Give the fresh volume `volume` to the sandbox user, and for a project fill it first: a
/// seeder (`SandboxSpec::seeder_body`: root with only CAP_CHOWN, running `chown` and nothing
/// else) created tracked, the project's tar uploaded into it through the archive API, started,
/// waited for, and removed whatever happened.
pub(crate) async fn seed_volume(
    docker: &Docker,
    spec: &SandboxSpec,
    volume: &str,
    name: &str,
    seeding: Seeding<'_>,
) -> Result<(), SandboxError> {
    use futures_util::StreamExt;
    let what = seeding.container();
    let (id, seeder) = create_tracked(
        docker,
        &spec.cleanup,
        name,
        spec.seeder_body(volume, &super::flavor::info(docker).await),
        match seeding {
            Seeding::Project { .. } => "create the seeding container",
            Seeding::Cache => "create the cache seeding container",
        },
        "0:0".into(),
    )
    .await?;
    let result = async {
        if let Seeding::Project { archive } = seeding {
            let file = tokio::fs::File::open(archive)
                .await
                .map_err(|e| SandboxError::Other(format!("cannot read the project archive: {e}")))?;
            let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
            let opts = bollard::query_parameters::UploadToContainerOptionsBuilder::default()
                .path(super::WORKSPACE)
                .build();
            docker
                .upload_to_container(&id, Some(opts), body)
                .await
                .map_err(|e| SandboxError::docker("copy the project into the sandbox", e))?;
        }
        docker
            .start_container(&id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| start_error(spec, &id, &format!("start {what}"), e))?;
        let mut wait = docker.wait_container(&id, None::<bollard::query_parameters::WaitContainerOptions>);
        match wait.next().await {
            Some(Ok(r)) if r.status_code == 0 => Ok(()),
            Some(Ok(r)) => Err(SandboxError::Other(format!(
                "preparing the volume failed ({what} ended with status {})",
                r.status_code
            ))),
            Some(Err(e)) => Err(SandboxError::docker(format!("wait for {what}"), e)),
            None => Err(SandboxError::Other(format!("{what} vanished"))),
        }
    }
    .await;
    super::api::remove_container(docker, &id).await;
    spec.cleanup.release(seeder);
    result
}

/// The runtimes the daemon knows, for an error that names what to pick instead.
async fn known_runtimes(docker: &Docker) -> String {
    match docker.info().await {
        Ok(info) => {
            let mut names: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
            names.sort();
            let default = info.default_runtime.unwrap_or_else(|| "runc".into());
            format!("{} (default {default})", names.join(", "))
        }
        Err(e) => format!("cannot ask it: {e}"),
    }
}

/// A start the chosen runtime refused: name the runtime, and give the known fix when the
/// failure is a known one. Without `--runtime`, the plain container error.
pub(super) fn start_error(spec: &SandboxSpec, id: &str, context: &str, e: BollardError) -> SandboxError {
    match (&spec.runtime, &e, status_of(&e)) {
        (Some(runtime), BollardError::DockerResponseServerError { message, .. }, Some(code))
            if code != 404 && code != 409 =>
        {
            SandboxError::RuntimeStart {
                runtime: runtime.clone(),
                message: message.trim().to_string(),
                fix: super::runtime_fix(message),
            }
        }
        _ => container_error(id, context, e),
    }
}

/// Podman's compatible API takes the seccomp profile as a path on its host, not inline.
pub(super) fn seccomp_as_file(body: &mut bollard::models::ContainerCreateBody) -> Result<(), SandboxError> {
    let Some(opts) = body.host_config.as_mut().and_then(|h| h.security_opt.as_mut()) else {
        return Ok(());
    };
    for opt in opts.iter_mut().filter(|o| o.starts_with("seccomp={")) {
        *opt = super::seccomp::security_opt_as_file()
            .map_err(|e| SandboxError::Other(format!("cannot write the seccomp profile for Podman: {e}")))?;
    }
    Ok(())
}
