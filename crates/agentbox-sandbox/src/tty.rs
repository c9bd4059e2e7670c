//! An interactive process in the sandbox: a real Docker exec with a TTY (or plain pipes) and
//! stdin attached, for `agentbox shell` and `exec -i`. Commands of the tools go through the
//! executor instead; this is for a person at a terminal, whose session has no command timeout.

use std::pin::Pin;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures_util::{Stream, StreamExt};

use super::api::container_error;
use super::{DockerSandbox, Sandbox, SandboxError, WORKSPACE};

/// What an attached process writes: with a TTY one stream (`Out`), without one stdout and
/// stderr apart.
#[derive(Debug)]
pub enum Chunk {
    Out(bytes::Bytes),
    Err(bytes::Bytes),
}

pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<Chunk, SandboxError>> + Send>>;

/// An attach stream of container `cid` (an exec's, or the container's own) as chunks; an error
/// is said as `what` failing.
pub(crate) fn chunks(
    output: impl Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send + 'static,
    cid: &str,
    what: &'static str,
) -> ChunkStream {
    let cid = cid.to_string();
    Box::pin(output.filter_map(move |item| {
        let cid = cid.clone();
        async move {
            match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    Some(Ok(Chunk::Out(message)))
                }
                Ok(LogOutput::StdErr { message }) => Some(Ok(Chunk::Err(message))),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(container_error(&cid, what, e))),
            }
        }
    }))
}

/// A process started with [`DockerSandbox::attach_process`].
pub struct Attached {
    pub exec_id: String,
    pub output: ChunkStream,
    pub input: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

/// How to start an attached process.
#[derive(Debug, Clone, Default)]
pub struct AttachRequest {
    pub argv: Vec<String>,
    /// Added to (and overriding) the sandbox's environment, which every tool command sees too.
    pub env: Vec<(String, String)>,
    pub tty: bool,
    /// Attach stdin (otherwise the process reads end-of-input at once).
    pub stdin: bool,
    /// Run it as one command of the tools is run without the executor: at the highest OOM
    /// score, and with everything it left running killed when it ends, so a background child
    /// holding its output open cannot keep the stream (and the caller) waiting.
    pub as_command: bool,
    /// The terminal's size (rows, columns), set before the process reads it.
    pub size: Option<(u16, u16)>,
}

impl DockerSandbox {
    /// Start `req.argv` as the sandbox user in the workspace, stdin attached. The container's
    /// policy holds for it as for every command; the session's end (shutdown) kills it.
    pub async fn attach_process(&self, req: &AttachRequest) -> Result<Attached, SandboxError> {
        let docker = self.docker();
        let cid = self.info().container_id.clone();
        let user = format!("{}:{}", self.info().uid, self.info().gid);
        let env: Vec<String> = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let wrapper = super::docker::per_call_wrapper();
        let mut argv: Vec<&str> = Vec::new();
        if req.as_command {
            argv.extend(["/bin/sh", "-c", wrapper.as_str(), "agentbox-run"]);
        }
        argv.extend(req.argv.iter().map(String::as_str));
        let exec = docker
            .create_exec(
                &cid,
                CreateExecOptions {
                    cmd: Some(argv),
                    env: Some(env.iter().map(String::as_str).collect()),
                    attach_stdin: Some(req.stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(req.tty),
                    user: Some(user.as_str()),
                    working_dir: Some(WORKSPACE),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| container_error(&cid, "create exec", e))?;
        let started = docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: req.tty,
                    // A TTY's output is one byte stream, cut anywhere; larger frames only
                    // batch it.
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| container_error(&cid, "start exec", e))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(SandboxError::Other("exec started detached".into()));
        };
        if let Some((rows, cols)) = req.size {
            // Best effort: a terminal of the wrong size is still a terminal.
            let _ = self.resize_process(&exec.id, rows, cols).await;
        }
        Ok(Attached {
            exec_id: exec.id,
            output: chunks(output, &cid, "exec stream"),
            input,
        })
    }

    /// The memory cgroup's OOM-kill count, to tell whether a command died of the memory limit.
    /// Asked of the executor when there is one: it reads the counter in its own process (no
    /// spawn, no sweep), where a Docker exec costs tens of milliseconds (~65 ms measured, twice
    /// per `agentbox exec`, on its user's path). Anything else falls back to the Docker exec.
    pub async fn oom_kills(&self) -> Option<i64> {
        if self.info().exec_mode == crate::ExecMode::Persistent {
            let mut req = crate::ExecRequest::argv(
                ["/bin/sh", "-c", super::docker::READ_OOM_KILLS],
                std::time::Duration::from_secs(10),
            );
            req.native = Some(crate::NativeOp {
                op: "oom_kills",
                args: Vec::new(),
            });
            if let Ok(out) = self.exec_persistent(&req).await
                && out.exit_code == 0
                && let Some(n) = out
                    .stdout
                    .bytes()
                    .and_then(|b| super::docker::parse_oom_kills(&b))
            {
                return Some(n);
            }
        }
        self.read_oom_kills().await
    }

    /// Tell an attached TTY process its terminal's new size.
    pub async fn resize_process(&self, exec_id: &str, rows: u16, cols: u16) -> Result<(), SandboxError> {
        self.docker()
            .resize_exec(
                exec_id,
                ResizeExecOptions {
                    height: rows,
                    width: cols,
                },
            )
            .await
            .map_err(|e| container_error(&self.info().container_id, "resize exec", e))
    }

    /// The exit status of an attached process that has ended (`None` while it runs).
    pub async fn process_status(&self, exec_id: &str) -> Result<Option<i64>, SandboxError> {
        let inspect = self
            .docker()
            .inspect_exec(exec_id)
            .await
            .map_err(|e| container_error(&self.info().container_id, "inspect exec", e))?;
        Ok(if inspect.running == Some(true) {
            None
        } else {
            inspect.exit_code
        })
    }
}
