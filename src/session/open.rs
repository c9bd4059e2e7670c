//! Opening a session's sandbox: connect, make sure the image exists, create it on the project
//! (bind-mounted; `isolated::open_isolated` copies it in for `--isolate`).

use std::path::Path;

use bollard::Docker;

use crate::config::SandboxConfig;
use crate::output::stderr_progress;
use crate::sandbox::image::ensure_image;
use crate::sandbox::{DockerSandbox, SandboxError, SandboxSpec, connect_docker};

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
