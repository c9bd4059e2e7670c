//! The Docker Engine calls every part of the sandbox layer shares: error status, removal that
//! waits until a container or volume is really gone, and the tidy-up before an interrupted
//! session's container goes. Nothing here knows a sandbox's policy or the run's cleanup: they
//! call into this module, never the reverse.

use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures_util::StreamExt;
use tracing::debug;

use super::SandboxError;

/// Kills every process the sandbox user may signal except the calling shell, until none of that
/// uid is left (zombies aside). `kill -1` skips the caller and the namespace's init, and the
/// keep-alive runs as another uid. `kill -1` succeeds while any process exists, even one it may
/// not signal, so what is left is read from /proc, with builtins only (no fork per round).
pub(super) const SWEEP: &str = r#"me=$$; n=0
while [ $n -lt 500 ]; do
  kill -9 -1 2>/dev/null
  left=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$me" ] || [ "$p" = 1 ] || ! [ -O "$d" ] && continue
    read -r st < "$d/stat" 2>/dev/null || continue
    case "$st" in *") Z "*) continue ;; esac
    left=1; break
  done
  [ $left = 0 ] && break
  n=$((n+1))
done"#;

/// The innermost error of a chain: what the daemon, the socket or TLS said, without the layers
/// that wrapped it.
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

pub(super) fn status_of(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Map an error from a call on a container: "no such container" and "not running" mean it was
/// removed or killed from outside, which the user needs to hear in those words.
pub(super) fn container_error(container: &str, context: &str, e: BollardError) -> SandboxError {
    match (&e, status_of(&e)) {
        (BollardError::DockerResponseServerError { message, .. }, Some(404 | 409)) => {
            SandboxError::ContainerGone(format!("{container}: {message}"))
        }
        _ => SandboxError::docker(context, e),
    }
}

/// Remove a container or volume that may not exist yet (its create request was in flight):
/// retry on "no such" for a few seconds.
pub(super) async fn remove_when_it_appears(docker: &Docker, volume: bool, name: &str) {
    for _ in 0..15 {
        let r = if volume {
            let opts = bollard::query_parameters::RemoveVolumeOptionsBuilder::default()
                .force(true)
                .build();
            docker.remove_volume(name, Some(opts)).await
        } else {
            let opts = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            docker.remove_container(name, Some(opts)).await
        };
        match r {
            Err(e) if status_of(&e) == Some(404) || status_of(&e) == Some(409) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            _ => return,
        }
    }
}

pub(crate) async fn remove_volume(docker: &Docker, name: &str) {
    let opts = bollard::query_parameters::RemoveVolumeOptionsBuilder::default()
        .force(true)
        .build();
    // A volume is busy until its container is gone; the container's removal can lag a little.
    for _ in 0..300 {
        match docker.remove_volume(name, Some(opts.clone())).await {
            Ok(()) => return,
            Err(e) if status_of(&e) == Some(404) => return,
            Err(e) if status_of(&e) == Some(409) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                tracing::warn!(volume = name, error = %e, "could not remove volume");
                return;
            }
        }
    }
    tracing::warn!(
        volume = name,
        "volume still in use; `agentbox gc` removes it later"
    );
}

/// Before removing a container whose session was interrupted: stop what runs in it, and delete
/// the temporary file of an atomic write that was cut short, so the project holds only whole
/// files. Bounded: an interruption must not hang on a busy daemon.
pub(super) async fn tidy(docker: &Docker, id: &str, user: &str) {
    let script = format!(
        "{SWEEP}\nfind /workspace -xdev -name .git -prune -o -type f -name '.agentbox-????????' -print -delete 2>/dev/null"
    );
    let run = async {
        let exec = docker
            .create_exec(
                id,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", script.as_str()]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(user),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await.ok()? {
            while let Some(Ok(item)) = output.next().await {
                debug!(container = short(id), removed = %String::from_utf8_lossy(item.as_ref()).trim(), "tidied");
            }
        }
        Some(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), run).await;
}

pub async fn remove_container(docker: &Docker, id: &str) {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(id, Some(opts)).await {
        Ok(()) => debug!(container = id, "removed"),
        Err(e) if status_of(&e) == Some(404) => debug!(container = id, "already gone"),
        // Auto-remove is already removing it: wait until it is really gone, so that "no
        // container is left" holds when we return. Docker answers 409 then; Podman 500
        // ("could not be stopped: ... container state improper: stopped"), measured.
        Err(e) => {
            if wait_gone(docker, id).await {
                return;
            }
            if status_of(&e) != Some(409) {
                tracing::warn!(container = id, error = %e, "could not remove container");
            }
        }
    }
}

/// Wait (up to 10 s) until the container `id`, which something else is removing (auto-remove,
/// a daemon that came back and finishes what it was doing), is really gone: `false` if it is
/// still there or the daemon stops answering.
pub(crate) async fn wait_gone(docker: &Docker, id: &str) -> bool {
    // A removal under way takes tens of ms (a one-shot sandbox's, after its command, is on the
    // user's path): asked again after 5 ms, the pause doubling up to 100 ms, ~10 s in all.
    let mut pause = Duration::from_millis(5);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        match docker.inspect_container(id, None).await {
            Err(gone) if status_of(&gone) == Some(404) => return true,
            // Still there, in a state only Podman has ("stopped"), which bollard's model cannot
            // read; or still there.
            Err(BollardError::JsonDataError { .. }) | Ok(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(_) => return false,
        }
    }
    false
}

pub(super) fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}
