//! Opening a session's sandbox: connect, make sure the image exists, create it on the project
//! (bind-mounted; `isolated::open_isolated` copies it in for `--isolate`).

use std::path::Path;

use bollard::Docker;

use crate::config::SandboxConfig;
use crate::output::stderr_progress;
use crate::sandbox::image::ensure_image;
use crate::sandbox::{DockerSandbox, OneShot, SandboxError, SandboxSpec, connect_docker};

/// Connect, make sure the image exists (building a known one if not), start a sandbox on
/// `project`.
pub async fn open_sandbox(
    cfg: &SandboxConfig,
    project: &Path,
) -> Result<(Docker, DockerSandbox), SandboxError> {
    let spec = cfg.bind_spec(project)?;
    open_spec(cfg, spec).await
}

/// The same, for any spec (e.g. an `--isolate` volume).
pub async fn open_spec(
    cfg: &SandboxConfig,
    spec: SandboxSpec,
) -> Result<(Docker, DockerSandbox), SandboxError> {
    let docker = ensure_images(cfg).await?;
    let sandbox = DockerSandbox::create(&docker, spec).await?;
    Ok((docker, sandbox))
}

/// `exec`'s fast path: `argv` as the own process of a sandbox on `project` (see
/// [`DockerSandbox::run_once`]). `Ok(None)`: not for this run (services, a build cache to copy
/// in, ports, per-call mode, gVisor, Podman, a remote engine) or not in this image; nothing ran,
/// and the caller opens a sandbox the usual way.
pub(crate) async fn open_one_shot(
    cfg: &SandboxConfig,
    project: &Path,
    argv: &[String],
) -> Result<Option<OneShot>, SandboxError> {
    let spec = cfg.bind_spec(project)?;
    // Each of these needs the executor or a command before the user's; under gVisor a
    // container's streams can outlive it.
    if !spec.services.is_empty()
        || spec.extras.seed.is_some()
        || !spec.extras.forwards.is_empty()
        || spec.per_call_exec
        || spec.runtime.as_deref().is_some_and(crate::sandbox::is_gvisor)
        || crate::sandbox::engine::current().is_remote()
        || argv.is_empty()
        || argv.iter().any(|a| a.is_empty() || a.contains('\0'))
    {
        return Ok(None);
    }
    let docker = ensure_images(cfg).await?;
    DockerSandbox::run_once(&docker, spec, argv).await
}

/// Connect, and make sure the image and every `--service`'s exist.
pub(super) async fn ensure_images(cfg: &SandboxConfig) -> Result<Docker, SandboxError> {
    let docker = connect_docker().await?;
    ensure_image(&docker, &cfg.image, &cfg.cleanup, &mut stderr_progress).await?;
    ensure_service_images(&docker, cfg).await?;
    tracing::debug!(step = "image present", "images present");
    Ok(docker)
}

/// Make sure every `--service`'s image exists (agentbox's own are built on first use).
pub async fn ensure_service_images(docker: &Docker, cfg: &SandboxConfig) -> Result<(), SandboxError> {
    for service in &cfg.services {
        ensure_image(docker, &service.image, &cfg.cleanup, &mut stderr_progress).await?;
    }
    Ok(())
}
