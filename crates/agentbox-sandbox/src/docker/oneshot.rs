//! A one-shot sandbox: the command is the container's own process (under a small static
//! supervisor, `oneshot.c`), as `docker run --rm` runs it: no executor to start and no Docker
//! exec per command. For `agentbox exec`, which runs one command and ends; the policy is the
//! sandbox's, the same create body with another main process.

use std::path::PathBuf;

use bollard::models::{Mount, MountType};
use bollard::query_parameters::{KillContainerOptionsBuilder, WaitContainerOptionsBuilder};

use super::*;
use crate::policy::ONE_SHOT_INIT;
use crate::tty::ChunkStream;

/// The supervisor's first words on stdout, written before the command exists.
const HELLO: &[u8] = b"agentbox-oneshot 1\n";

/// The supervisor, built static for this machine by build.rs (empty where it could not be).
const INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/agentbox-init"));

/// The supervisor as a file on this machine, to mount: in the user's cache directory, named by
/// its digest, written once (by rename) and checked byte for byte before each use. `None`: not
/// built for this machine, or nowhere to write it.
pub(super) fn init_binary() -> Option<PathBuf> {
    use sha2::Digest;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    if INIT.is_empty() {
        return None;
    }
    let digest = sha2::Sha256::digest(INIT);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let dir = crate::identity::disk_cache::root()?.join("init");
    let path = dir.join(format!("agentbox-init-{hex}"));
    if std::fs::read(&path).is_ok_and(|on_disk| on_disk == INIT) {
        return Some(path);
    }
    let written = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let mut file = tempfile::NamedTempFile::new_in(&dir)?;
        file.write_all(INIT)?;
        file.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o755))?;
        file.persist(&path).map_err(|e| e.error)?;
        Ok(())
    })();
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            debug!(error = %e, path = %path.display(), "cannot write the one-shot supervisor");
            None
        }
    }
}

/// Mount the supervisor `init` read-only at [`ONE_SHOT_INIT`] and give it `command`.
pub(super) fn mount_init(
    body: &mut bollard::models::ContainerCreateBody,
    init: &std::path::Path,
    command: &[String],
) {
    if let Some(host) = body.host_config.as_mut() {
        host.mounts.get_or_insert_with(Vec::new).push(Mount {
            target: Some(ONE_SHOT_INIT.into()),
            source: Some(init.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        });
    }
    body.cmd
        .get_or_insert_with(|| vec![ONE_SHOT_INIT.into()])
        .extend(command.iter().cloned());
}

type Output =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// What a one-shot container hands over once started: its output after the hello, and the
/// wait for its exit status.
pub(super) struct Parts {
    pub(super) output: Output,
    pub(super) exit: Option<tokio::task::JoinHandle<Option<i64>>>,
}

/// The exit status of container `id`'s next exit, asked for before it starts (with auto-remove
/// it may be gone by the time its output ends, and its status with it). `None`: no answer.
pub(super) fn wait_exit(docker: &Docker, id: &str) -> tokio::task::JoinHandle<Option<i64>> {
    let (docker, id) = (docker.clone(), id.to_string());
    tokio::spawn(async move {
        let opts = WaitContainerOptionsBuilder::default()
            .condition("next-exit")
            .build();
        match docker.wait_container(&id, Some(opts)).next().await? {
            Ok(r) => Some(r.status_code),
            // bollard reports a non-zero status as an error that carries it.
            Err(bollard::errors::Error::DockerContainerWaitError { code, .. }) => Some(code),
            Err(e) => {
                debug!(error = %e, "no exit status from the wait");
                None
            }
        }
    })
}

/// Read the supervisor's hello off `output`; what follows it (the command's output) is the
/// stream returned. `None`: the container ended or answered otherwise (the supervisor could
/// not run, or could not make itself undumpable): the command did not run.
pub(super) async fn hello(mut output: Output) -> Option<Output> {
    let mut seen = Vec::new();
    let mut before = Vec::new();
    let read = async {
        while seen.len() < HELLO.len() {
            match output.next().await? {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    seen.extend_from_slice(&message)
                }
                // The runtime's complaint, if any, comes before a hello that never does.
                Ok(LogOutput::StdErr { message }) => before.push(LogOutput::StdErr { message }),
                Ok(LogOutput::StdIn { .. }) => {}
                Err(e) => {
                    debug!(error = %e, "one-shot stream");
                    return None;
                }
            }
        }
        Some(())
    };
    if tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .ok()
        .flatten()
        .is_none()
        || !seen.starts_with(HELLO)
    {
        let said: Vec<u8> = before
            .iter()
            .flat_map(|o| o.as_ref().to_vec())
            .chain(seen)
            .collect();
        // Debug-formatted: escaped, whatever the container wrote.
        debug!(said = ?String::from_utf8_lossy(&said), "no one-shot supervisor");
        return None;
    }
    // Only stderr can have come before the hello, and the supervisor writes none: what did is
    // passed on in order, then the rest of stdout's chunk.
    let rest = bytes::Bytes::copy_from_slice(&seen[HELLO.len()..]);
    let mut first: Vec<Result<LogOutput, bollard::errors::Error>> = before.into_iter().map(Ok).collect();
    if !rest.is_empty() {
        first.push(Ok(LogOutput::StdOut { message: rest }));
    }
    Some(Box::pin(futures_util::stream::iter(first).chain(output)))
}

/// A command running as a sandbox's own process (see [`DockerSandbox::run_once`]).
pub struct OneShot {
    sandbox: DockerSandbox,
    /// In a mutex only so that a `&OneShot` (its `kill`) can be held across an await.
    output: Mutex<Option<ChunkStream>>,
    exit: Option<tokio::task::JoinHandle<Option<i64>>>,
}

/// How a one-shot command ended.
#[derive(Debug, Clone, Copy)]
pub struct OneShotEnd {
    /// Its status (128 + N: killed by signal N).
    pub exit_code: i64,
    /// The memory cgroup's OOM killer fired in the sandbox while it ran.
    pub oom_killed: bool,
}

impl DockerSandbox {
    /// Start a sandbox whose one process is `argv`, as a command of the tools runs (the highest
    /// OOM score, the same limits), its output streamed from the first byte. For a
    /// bind-mounted project with no services and no build cache to copy in (those need a
    /// command before the user's): anything else is refused. `Ok(None)`: not on this engine
    /// (Podman), or no supervisor for this machine, or it could not run; nothing ran, so start
    /// a sandbox the usual way.
    pub async fn run_once(
        docker: &Docker,
        spec: SandboxSpec,
        argv: &[String],
    ) -> Result<Option<OneShot>, SandboxError> {
        if !matches!(spec.workspace, WorkspaceSource::Bind { .. })
            || !spec.services.is_empty()
            || spec.extras.seed.is_some()
        {
            return Err(SandboxError::Other(
                "a one-shot sandbox is for a mounted project with no services or cache".into(),
            ));
        }
        let span = info_span!("sandbox", session = %spec.session);
        async {
            let engine = checked_engine(docker, &spec).await?;
            // Podman's compatible API waits and reports events otherwise than Docker's.
            if engine.is_podman() {
                return Ok(None);
            }
            let Some(sb) = Self::create_as(docker, &spec, MainProcess::OneShot, argv).await? else {
                return Ok(None);
            };
            sb.guard_project(&spec);
            let Some(parts) = sb.one_shot.lock().unwrap_or_else(|e| e.into_inner()).take() else {
                return Err(SandboxError::Other(
                    "a one-shot sandbox without its output".into(),
                ));
            };
            let output = crate::tty::chunks(parts.output, &sb.info.container_id, "attach stream");
            Ok(Some(OneShot {
                sandbox: sb,
                output: Mutex::new(Some(output)),
                exit: parts.exit,
            }))
        }
        .instrument(span)
        .await
    }
}

impl OneShot {
    pub fn sandbox(&self) -> &DockerSandbox {
        &self.sandbox
    }

    /// The command's stdout and stderr as they come; they end when it does. Taken once.
    pub fn take_output(&mut self) -> Option<ChunkStream> {
        self.output.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// End the command and everything it started now (its timeout): the whole sandbox goes.
    pub async fn kill(&self) -> Result<(), SandboxError> {
        let id = &self.sandbox.info.container_id;
        let opts = KillContainerOptionsBuilder::default().signal("KILL").build();
        match self.sandbox.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            // It ended on its own meanwhile.
            Err(e) if matches!(crate::api::status_of(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(container_error(id, "kill", e)),
        }
    }

    /// How it ended, once its output has: its status, and whether the memory limit killed
    /// anything in it (the daemon's `oom` event, which comes before the container's `die`).
    /// The `die` event carries the status too and comes first (the wait's answer trailed it by
    /// ~11 ms in a `-vv` log), so whichever says it first is taken; the wait covers a `die` the
    /// live watch missed.
    pub async fn end(&mut self) -> Result<OneShotEnd, SandboxError> {
        let sandbox = &self.sandbox;
        let died = sandbox.died(Duration::from_secs(2));
        tokio::pin!(died);
        let (waited, mut death) = match self.exit.take() {
            Some(mut wait) => tokio::select! {
                d = &mut died => match d.as_ref().and_then(|d| d.exit_code.parse::<i64>().ok()) {
                    Some(code) => (Some(code), d),
                    None => ((&mut wait).await.ok().flatten(), d),
                },
                w = &mut wait => (w.ok().flatten(), sandbox.died(Duration::from_millis(500)).await),
            },
            None => (None, died.await),
        };
        if death.is_none() && waited.is_none() {
            // Neither: the daemon's log, as for any sandbox that died.
            death = sandbox.death().await;
        }
        let exit_code = match (waited, &death) {
            (Some(code), _) => code,
            (None, Some(d)) => d.exit_code.parse().unwrap_or(-1),
            (None, None) => {
                return Err(SandboxError::ContainerGone(format!(
                    "no exit status from container {}",
                    short(&sandbox.info.container_id)
                )));
            }
        };
        Ok(OneShotEnd {
            exit_code,
            oom_killed: death.is_some_and(|d| d.oom),
        })
    }

    /// The sandbox, for its shutdown and the host's check after the run.
    pub fn into_sandbox(self) -> DockerSandbox {
        self.sandbox
    }
}
