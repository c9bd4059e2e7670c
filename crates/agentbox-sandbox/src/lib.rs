//! The sandbox seam: run a command, move files, tear down.
//!
//! [`DockerSandbox`] is the product. The trait exists so another engine (a remote Docker host,
//! Kubernetes) can stand behind the same tools later, not to mock Docker in tests: integration
//! tests run against the real daemon.

pub(crate) mod api;
pub mod caches;
mod capture;
mod cleanup;
mod connect;
mod containers;
mod docker;
pub mod engine;
pub mod env_copy;
pub(crate) mod executor;
mod flavor;
pub mod fsop;
pub mod gc;
mod identity;
pub mod image;
mod messages;
mod policy;
pub mod pool;
mod project;
pub mod publish;
mod seccomp;
pub mod services;
pub mod tty;

use std::time::Duration;

use async_trait::async_trait;

pub use agentbox_hostfs::hostscan::ScanBounds;
pub use api::{remove_container, root_cause};
pub use capture::{Captured, HeadTail, human_bytes};
pub use cleanup::Cleanup;
pub use connect::{connect_docker, docker_endpoint};
pub use docker::{DockerSandbox, OneShot, OneShotEnd};
pub use flavor::{EngineInfo, EngineKind};
pub use policy::{
    BASE_PATH, CA_BUNDLE, CACHE_DIR, Direction, EGRESS_PORT, EGRESS_SOCKET, ENV_LABEL, Extras, Forward,
    GIT_ROOT, HARNESS_DIR, HOME, Limits, MIN_MEMORY, MainProcess, MemoryBudget, ParseSizeError, SandboxSpec,
    VolumeMount, WorkspaceSource, parse_size,
};
pub use pool::{POOL_LABEL, Pool};
pub use project::{ProjectDir, bind_workspace, inspect_project};

/// Where the project is mounted inside every sandbox.
pub const WORKSPACE: &str = "/workspace";

/// Label put on every container and volume agentbox creates; `agentbox gc` sweeps by it.
pub(crate) const SESSION_LABEL: &str = "agentbox.session";
/// Label holding the host PID of the agentbox process that owns the container.
pub(crate) const PID_LABEL: &str = "agentbox.pid";
/// Label holding the name of the host that process runs on.
pub(crate) const HOST_LABEL: &str = "agentbox.host";

#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Bytes fed to the command's stdin; `None` gives it `/dev/null` so a command that reads
    /// stdin gets EOF instead of hanging until the timeout.
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    pub workdir: Option<String>,
    pub env: Vec<(String, String)>,
    /// Bytes kept from the start and from the end of each stream.
    pub head: usize,
    pub tail: usize,
    /// An operation the executor may perform in-process instead of spawning `argv`, with the
    /// same exit code and output. One exec per call (and other engines) run `argv`.
    pub native: Option<NativeOp>,
}

/// A file operation the in-container executor implements natively (see `executor.py`).
#[derive(Debug, Clone)]
pub struct NativeOp {
    pub op: &'static str,
    pub args: Vec<String>,
}

impl ExecRequest {
    /// `bash -c COMMAND` in the workspace: the shell the `bash` tool runs (not a login shell:
    /// see `ToolContext::shell`).
    pub fn shell(command: impl Into<String>, timeout: Duration) -> Self {
        Self::argv(
            ["bash", "-c"]
                .map(String::from)
                .into_iter()
                .chain([command.into()]),
            timeout,
        )
    }

    pub fn argv<I, S>(argv: I, timeout: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            stdin: None,
            timeout,
            workdir: None,
            env: Vec::new(),
            head: 32 * 1024,
            tail: 32 * 1024,
            native: None,
        }
    }

    pub fn stdin(mut self, data: Vec<u8>) -> Self {
        self.stdin = Some(data);
        self
    }

    /// Keep up to `head` leading and `tail` trailing bytes of each stream.
    pub fn capture(mut self, head: usize, tail: usize) -> Self {
        self.head = head;
        self.tail = tail;
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    /// The exit status; 128+N when ended by signal N (the shell's convention).
    pub exit_code: i64,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The memory cgroup's OOM killer fired while the command ran.
    pub oom_killed: bool,
    pub stdout: Captured,
    pub stderr: Captured,
    pub elapsed: Duration,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.exit_code == 0 && !self.timed_out
    }

    pub fn truncated(&self) -> bool {
        self.stdout.truncated() || self.stderr.truncated()
    }

    /// One line a human or a model can act on, e.g. "exit 137: killed: out of memory".
    pub fn status_line(&self) -> String {
        if self.timed_out {
            // Whole seconds, rounded down: killing takes a moment after the limit, and a
            // loaded machine made "1.6s" read as "2s" for a 1 s limit.
            format!(
                "timed out after {}s: the command and everything it started were killed",
                self.elapsed.as_secs()
            )
        } else if self.oom_killed && self.signal == Some(libc::SIGKILL) {
            format!(
                "exit {}: killed by the sandbox's memory limit (out of memory)",
                self.exit_code
            )
        } else if self.oom_killed {
            // The OOM killer took a process the command started, and the command went on.
            format!(
                "exit {}; the sandbox's memory limit killed a process it started (out of memory)",
                self.exit_code
            )
        } else if let Some(sig) = self.signal {
            format!("exit {}: killed by signal {}", self.exit_code, signal_name(sig))
        } else {
            format!("exit {}", self.exit_code)
        }
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        libc::SIGXFSZ => "SIGXFSZ (file size limit)".into(),
        other => other.to_string(),
    }
}

/// A background process (a job of the executor): a command that outlives the call that started
/// it, with everything it started, until it ends or is stopped. As last seen.
#[derive(Debug, Clone, Default)]
pub struct ProcessState {
    /// `p1`, `p2`, ... in the order started, per sandbox.
    pub id: String,
    /// What was started (the host's own record of it).
    pub command: String,
    /// The helper's pid in the sandbox (its tree is the process).
    pub pid: i64,
    pub running: bool,
    /// Live processes in its tree.
    pub processes: u32,
    /// Its command's status, once its whole tree has ended; 128+N for signal N.
    pub exit_code: Option<i64>,
    pub signal: Option<i32>,
    /// Why agentbox stopped it, when it did.
    pub stopped: Option<String>,
    /// The memory cgroup's OOM killer fired while it ran.
    pub oom_killed: bool,
    /// Its stdout and stderr together, bounded (the first and last bytes).
    pub output: Captured,
    /// Bytes of output already shown (by an earlier `process_output`).
    pub shown: u64,
    pub elapsed: Duration,
}

impl ProcessState {
    /// Its command on one line, at most `max` characters: what a line about it shows.
    pub fn label(&self, max: usize) -> String {
        let flat: String = self
            .command
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        match flat.char_indices().nth(max) {
            Some((at, _)) => format!("{}…", &flat[..at]),
            None => flat,
        }
    }

    /// "running (3 processes)", "exit 0", "stopped before the final test run", ...
    pub fn status_line(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        if self.running {
            let n = self.processes;
            return format!(
                "running for {secs:.0}s ({n} process{})",
                if n == 1 { "" } else { "es" }
            );
        }
        if let Some(why) = &self.stopped {
            return format!("stopped by agentbox after {secs:.0}s: {why}");
        }
        let end = ExecOutput {
            exit_code: self.exit_code.unwrap_or(-1),
            signal: self.signal,
            oom_killed: self.oom_killed,
            ..Default::default()
        };
        format!("ended after {secs:.0}s: {}", end.status_line())
    }
}

/// How the sandbox runs commands; chosen at start, reported by `doctor` and the benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecMode {
    /// One long-lived executor process in the container; a call costs a process spawn.
    Persistent,
    /// One Docker exec per call (images without python3, or when asked).
    PerCall,
    /// One command, the container's own process (`exec`'s fast path): no calls at all.
    OneShot,
}

impl std::fmt::Display for ExecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExecMode::Persistent => "persistent executor",
            ExecMode::PerCall => "one docker exec per call",
            ExecMode::OneShot => "one command as the sandbox's process",
        })
    }
}

/// The known remedy when gVisor cannot start a container on a machine like CI's VMs: runsc
/// registered plainly tries to set up its own network stack in the host's network namespace
/// ("cannot run with network enabled in root network namespace"). The sandbox has no network
/// anyway, so gVisor's stack goes off; the ptrace platform needs no KVM. `scripts/ci-runsc`
/// applies it.
pub const RUNSC_FIX: &str = "register runsc with runtimeArgs [\"--network=none\", \
     \"--platform=ptrace\"]: in /etc/docker/daemon.json merge \"runtimes\": {\"runsc\": \
     {\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \
     \"--platform=ptrace\"]}} into the settings already there, then reload the daemon \
     without restarting it: sudo kill -HUP $(cat /var/run/docker.pid)";

/// Whether `runtime` is gVisor's (`runsc`, or a name registered for it such as `runsc-kvm`).
pub fn is_gvisor(runtime: &str) -> bool {
    runtime.contains("runsc")
}

/// The fix for a runtime's start failure, when the failure is a known one.
pub(crate) fn runtime_fix(message: &str) -> Option<&'static str> {
    messages::RUNSC_ROOT_NETNS
        .in_message(message)
        .then_some(RUNSC_FIX)
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot reach Docker at {endpoint}: is the daemon running? ({reason})")]
    Unreachable { endpoint: String, reason: String },
    /// The endpoint or its TLS material is wrong: nothing was tried that a running daemon
    /// would fix.
    #[error("Docker engine {endpoint}: {reason}")]
    Engine { endpoint: String, reason: String },
    #[error("project path {0} does not exist")]
    ProjectMissing(String),
    #[error("project path {0} is not a directory")]
    ProjectNotDirectory(String),
    /// `detail` says what was tried and how to get the image (the image layer knows which
    /// images agentbox builds and which it pulls).
    #[error("image {image} is missing{detail}")]
    ImageMissing { image: String, detail: String },
    #[error(transparent)]
    Image(#[from] image::ImageError),
    #[error("the sandbox container is gone (removed or killed from outside): {0}")]
    ContainerGone(String),
    /// The run is being cleaned up (interrupted, or at its end): nothing more is created.
    #[error("agentbox is stopping: no sandbox is started any more")]
    Closing,
    /// A service (`--service`) that could not start or become ready.
    #[error("the service {name} cannot serve the sandbox: {why}")]
    Service { name: String, why: String },
    /// `--runtime NAME` that the daemon has not registered.
    #[error(
        "the Docker daemon has no runtime {name:?} (it knows: {known}); register it under \
         \"runtimes\" in the daemon's daemon.json and reload the daemon (SIGHUP), or pick \
         one it knows"
    )]
    UnknownRuntime { name: String, known: String },
    /// The chosen runtime refused to start the container; `fix` is the known remedy, if any.
    #[error(
        "the runtime {runtime} cannot start the sandbox: {message}{}",
        fix.map(|f| format!("\nfix: {f}")).unwrap_or_default()
    )]
    RuntimeStart {
        runtime: String,
        message: String,
        fix: Option<&'static str>,
    },
    /// gVisor ended the whole sandbox at its memory limit (runc would have killed only the
    /// command): the container and all it held in memory are gone.
    #[error(
        "the sandbox ran out of memory (--memory) and gVisor (--runtime {runtime}) stopped the \
         whole sandbox, not only the command, so the session cannot go on ({detail}); give it \
         more --memory, or keep the command's memory use down"
    )]
    SandboxOutOfMemory { runtime: String, detail: String },
    /// gVisor's kernel ended the whole sandbox while a command ran (not from outside).
    #[error(
        "gVisor (--runtime {runtime}) ended the whole sandbox (status {exit_code}) while a \
         command ran, so the session cannot go on ({detail}); under gVisor a command that \
         reaches the sandbox's process limit (--pids-limit), e.g. a fork bomb, does this"
    )]
    SandboxEnded {
        runtime: String,
        exit_code: String,
        detail: String,
    },
    #[error(
        "the sandbox ran out of memory and the kernel's OOM killer ended it, so the session \
         cannot go on ({0})"
    )]
    OutOfMemory(String),
    #[error(
        "the engine ({engine}) is rootless on cgroup v1 and cannot enforce the sandbox's memory, \
         pids and CPU limits: a fork bomb or memory hog in the sandbox would reach the whole \
         machine. Use a rootful engine, or cgroup v2, or accept the weaker sandbox with \
         --allow-weak-limits (AGENTBOX_ALLOW_WEAK_LIMITS=1)"
    )]
    WeakLimits { engine: String },
    #[error("the sandbox's command runner failed ({0}); the session cannot go on")]
    ExecutorLost(String),
    #[error("docker: {context}: {source}")]
    Docker {
        context: String,
        #[source]
        source: bollard::errors::Error,
    },
    /// The project could not be packed for a copy into a volume (`--isolate`, a remote
    /// engine, repair's candidates).
    #[error("cannot copy the project: {0}")]
    CopyIn(#[from] agentbox_hostfs::isolate::IsolateError),
    /// Work handed to a blocking thread did not come back (it panicked).
    #[error("an internal task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Other(String),
}

impl SandboxError {
    fn docker(context: impl Into<String>, source: bollard::errors::Error) -> Self {
        SandboxError::Docker {
            context: context.into(),
            source,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub session: String,
    pub container_id: String,
    pub image: String,
    pub uid: u32,
    pub gid: u32,
    pub exec_mode: ExecMode,
    /// What the user must hear about the sandbox as it was made (git will not work inside a
    /// linked worktree whose repository could not be followed, and why).
    pub warnings: Vec<String>,
}

/// A running, contained environment with the project at [`WORKSPACE`].
#[async_trait]
pub trait Sandbox: Send + Sync {
    fn info(&self) -> &SandboxInfo;

    /// Run one command to completion, its timeout, or its output caps. A command's own failure
    /// (non-zero exit, timeout, OOM) is an `Ok` with the facts; `Err` means the sandbox failed.
    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError>;

    /// Extract a tar archive at `dest` inside the sandbox (archive API).
    async fn put_archive(&self, dest: &str, tar: Vec<u8>) -> Result<(), SandboxError>;

    /// A tar archive of `path` inside the sandbox, refused past `max_bytes`.
    async fn get_archive(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, SandboxError>;

    /// The same archive as a stream, for reading a whole project without holding it.
    async fn archive_reader(
        &self,
        path: &str,
    ) -> Result<Box<dyn tokio::io::AsyncRead + Send + Unpin>, SandboxError>;

    /// Remove the sandbox. Idempotent; later calls to `exec` fail.
    async fn shutdown(&self) -> Result<(), SandboxError>;

    /// Start `req` as a background process, labelled `command` in the record, and watch it for
    /// up to `settle` (its first output, or its end). `Ok(Err(why))`: refused, for the model to
    /// read (too many running; a sandbox without the executor).
    async fn start_process(
        &self,
        req: ExecRequest,
        command: String,
        settle: Duration,
    ) -> Result<Result<ProcessState, ProcessRefusal>, SandboxError> {
        let _ = (req, command, settle);
        Ok(Err(ProcessRefusal(NO_BACKGROUND.into())))
    }

    /// The background processes (or the one `id` names), with their output when `output`.
    /// Reading the output marks it shown (see [`ProcessState::shown`]).
    async fn processes(
        &self,
        id: Option<&str>,
        output: bool,
    ) -> Result<Result<Vec<ProcessState>, ProcessRefusal>, SandboxError> {
        let _ = (id, output);
        Ok(Ok(Vec::new()))
    }

    /// Stop the background processes (or the one `id` names) with all they started; `why` is
    /// kept in the record. Returns them as they ended.
    async fn stop_processes(
        &self,
        id: Option<&str>,
        why: &str,
    ) -> Result<Result<Vec<ProcessState>, ProcessRefusal>, SandboxError> {
        let _ = (id, why);
        Ok(Ok(Vec::new()))
    }

    /// Every background process of this sandbox, as last seen, in the order started.
    fn process_log(&self) -> Vec<ProcessState> {
        Vec::new()
    }

    /// Services (`SandboxSpec::services`) that stopped since the last call, each said once:
    /// the next tool call tells the model instead of letting a test wait on a dead server.
    fn ended_services(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A request about background processes that the sandbox declined (too many running, an
/// unknown id, no command runner): words for the model to read, not a failure of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProcessRefusal(pub String);

/// Why a sandbox without the executor has no background processes.
pub(crate) const NO_BACKGROUND: &str = "background processes need the sandbox's command runner, and this \
     sandbox runs one docker exec per command (an image without python3, or --per-call-exec)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gvisors_network_failure_gets_the_runsc_fix_and_others_none() {
        // As Docker 20.10 relays it from Debian's runsc 2022-12.
        let seen = "OCI runtime start failed: starting container: setting up network: creating \
                    interfaces from net namespace \"/proc/16625/ns/net\": cannot run with network \
                    enabled in root network namespace: unknown";
        assert_eq!(runtime_fix(seen), Some(RUNSC_FIX));
        assert!(RUNSC_FIX.contains("\"--network=none\", \"--platform=ptrace\""));
        assert!(RUNSC_FIX.contains("kill -HUP"));
        assert_eq!(runtime_fix("OCI runtime create failed: exec format error"), None);
    }

    #[test]
    fn gvisor_is_told_by_the_runtimes_name() {
        assert!(is_gvisor("runsc"));
        assert!(is_gvisor("runsc-kvm"));
        assert!(!is_gvisor("runc"));
        assert!(!is_gvisor("crun"));
    }
}
