//! Reaching the engine in force (see `engine`), and naming it in messages.

use bollard::Docker;
use tracing::debug;

use super::SandboxError;

/// The Docker endpoint in use, for messages: the task's engine, else `DOCKER_HOST`, else the
/// default socket.
pub fn docker_endpoint() -> String {
    super::engine::current().describe()
}

/// Connect to the engine in force (see `engine`) and check it answers.
pub async fn connect_docker() -> Result<Docker, SandboxError> {
    let docker = super::engine::current().connect().await?;
    // Which engine, now: the policy adapts to it (see `flavor`).
    let info = super::flavor::info(&docker).await;
    debug!(engine = %info.kind, version = %info.version, rootless = info.rootless, "connected");
    Ok(docker)
}
