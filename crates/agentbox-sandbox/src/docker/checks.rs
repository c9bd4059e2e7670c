//! What must hold before a sandbox is created on an engine: a remote engine gets no bind mount
//! of this machine, and an engine that cannot enforce the limits is refused unless allowed.

use super::*;

/// What a remote engine cannot do, refused before anything is created: it cannot mount a
/// directory or a socket of this machine (it would mount whatever has that path on its own).
pub(crate) fn remote_check(spec: &SandboxSpec) -> Result<(), SandboxError> {
    let engine = crate::engine::current();
    if !engine.is_remote() {
        return Ok(());
    }
    let refuse = |what: &str| SandboxError::Engine {
        endpoint: engine.host.clone(),
        reason: format!("{what} is not available on a remote engine: it cannot mount this machine's files"),
    };
    if matches!(spec.workspace, WorkspaceSource::Bind { .. }) {
        return Err(refuse(
            "a bind-mounted project (use --isolate: copy in, patch out)",
        ));
    }
    if let Some(forward) = spec.extras.forwards.first() {
        return Err(refuse(forward.purpose));
    }
    Ok(())
}

/// Refuse what the engine cannot give this sandbox: its limits (unless the user accepted that,
/// in which case every run says so), or, rootless, the project owner's uid.
pub(crate) fn check_engine(
    engine: &crate::flavor::EngineInfo,
    spec: &SandboxSpec,
) -> Result<(), SandboxError> {
    let endpoint = crate::engine::current();
    if endpoint.is_remote() {
        // Podman takes the seccomp profile as a path (see `seccomp_as_file`), which a remote
        // engine would open on its own host, where anyone could have put a profile of their own.
        if engine.is_podman() {
            return Err(SandboxError::Engine {
                endpoint: endpoint.describe(),
                reason: "a remote Podman engine cannot be given agentbox's seccomp profile (Podman \
                         reads it from a file on its own host); use Podman on this machine, or a \
                         remote Docker engine"
                    .into(),
            });
        }
    } else {
        // The engine's user is known only for a local socket (its owner).
        engine.check_owner(spec.uid)?;
    }
    if engine.rootless
        && engine.kind == crate::flavor::EngineKind::Docker
        && matches!(spec.workspace, WorkspaceSource::Bind { .. })
    {
        // Without Podman's keep-id, rootless Docker maps the sandbox's uid to a subordinate uid
        // on the host, which can neither write the project nor leave files owned by its owner.
        return Err(SandboxError::Engine {
            endpoint: endpoint.describe(),
            reason: "rootless Docker maps the sandbox's user to a subordinate uid, which cannot \
                     write a mounted project; use --isolate (copy in, patch out), or rootless \
                     Podman"
                .into(),
        });
    }
    if engine.enforces_limits() {
        return Ok(());
    }
    if !spec.allow_weak_limits {
        return Err(SandboxError::WeakLimits {
            engine: format!("{} {}", engine.kind, engine.version),
        });
    }
    tracing::warn!(
        "WEAK SANDBOX: the engine ({} {}, rootless on cgroup v1) enforces no memory, pids or CPU \
         limit; a fork bomb or a memory hog in this sandbox reaches the whole machine \
         (--allow-weak-limits)",
        engine.kind,
        engine.version
    );
    Ok(())
}
