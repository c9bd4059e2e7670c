//! The Docker implementation of [`Sandbox`], through the Engine API (bollard). No `docker` CLI.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tracing::{Instrument, debug, info_span};

use super::api::{SWEEP, container_error, remove_container, remove_volume, short};
use super::capture::HeadTail;
use super::cleanup::{Cleanup, Registration, Resource};
use super::containers::{create_tracked, start_error};
use super::executor::{Executor, JobFrame};
use super::policy::{MainProcess, SandboxSpec, WorkspaceSource};
use super::{
    Captured, ExecMode, ExecOutput, ExecRequest, ProcessRefusal, ProcessState, Sandbox, SandboxError,
    SandboxInfo,
};
use agentbox_hostfs::hostscan::HostGuard;

mod checks;
mod death;
mod exec;
mod oneshot;
mod scratch;
mod services;
mod volume;

use checks::{check_engine, remote_check};
pub(crate) use death::{READ_OOM_KILLS, parse_oom_kills};
use death::{Seen, watch_events};
use exec::JOB_REQUEST_TIME;
pub(crate) use exec::per_call_wrapper;
pub use oneshot::{OneShot, OneShotEnd};
use volume::{prepare_env_volume, prepare_volume};

/// One sandbox container, alive until [`Sandbox::shutdown`] or drop.
pub struct DockerSandbox {
    docker: Docker,
    info: SandboxInfo,
    /// The attach connection to the keep-alive's stdin (per-call mode), or the one-shot
    /// supervisor's (in executor mode the executor holds its own). Dropping it (shutdown, drop,
    /// or this process dying) ends the main process, and auto-remove removes the container.
    keepalive: Mutex<Option<Box<dyn Send>>>,
    /// A one-shot sandbox's command output and exit, until [`DockerSandbox::run_once`] takes them.
    one_shot: Mutex<Option<oneshot::Parts>>,
    executor: tokio::sync::Mutex<Option<Executor>>,
    closed: AtomicBool,
    /// The container died under us (killed or removed from outside): every later call fails.
    gone: AtomicBool,
    /// OOM-kill count seen last (per-call mode reads it after every command to say "out of
    /// memory"; the executor counts for itself).
    oom_seen: AtomicI64,
    /// When the container was created, in seconds since the epoch: where its events start.
    created_at: u64,
    /// Its `oom`/`kill`/`die` events as they happen (see [`watch_events`]): the daemon keeps
    /// only its last 256 events for a later query, which a busy daemon overwrites in seconds.
    /// The watch ends by itself with the container (its `die` or `destroy`).
    events: Arc<Mutex<Seen>>,
    /// The `--runtime` it runs under (`None`: the daemon's default), to explain its death.
    runtime: Option<String>,
    /// The run's cleanup, and this container's registration with it (released once removed).
    cleanup: Cleanup,
    registration: Mutex<Option<Registration>>,
    /// The host files mounted as the sandbox's `/etc/passwd` and `/etc/group`; removed when
    /// the sandbox is dropped (a running container keeps what it mounted).
    /// `None` on a remote engine: the entries are in the image (see `identity`).
    _etc: Option<super::identity::EtcFiles>,
    /// The `--isolate` volume this sandbox owns and removes.
    volume: Option<(String, Registration)>,
    /// A bind-mounted project's state at the start (see `hostscan`), registered for the
    /// after-run check.
    guard: Mutex<Option<(Arc<HostGuard>, Registration)>>,
    /// Setup's build cache, copied into the session's `CACHE_DIR` (see `Extras::seed`).
    seed: Option<String>,
    /// Every background process started, as last seen (for the report).
    processes: Mutex<Vec<ProcessState>>,
    /// A background process was asked for (its answer may have been dropped with its call).
    asked_for_processes: AtomicBool,
    /// Its services (`SandboxSpec::services`), in the order started.
    services: Mutex<Vec<Arc<services::RunningService>>>,
    /// The spec the services start from again (for the verdict); `None` without services.
    service_spec: Option<SandboxSpec>,
    /// Service containers started so far: each gets a name of its own.
    service_starts: std::sync::atomic::AtomicUsize,
}

/// The engine's facts, once `spec` has been checked against them (and against a remote engine).
async fn checked_engine(docker: &Docker, spec: &SandboxSpec) -> Result<crate::EngineInfo, SandboxError> {
    remote_check(spec)?;
    let engine = super::flavor::info(docker).await;
    check_engine(&engine, spec)?;
    debug!(step = "engine checks", "engine checked");
    Ok(engine)
}

impl DockerSandbox {
    /// Start a sandbox: the executor as the container's main process when the image has
    /// python3 (and `per_call_exec` is off), otherwise a keep-alive and one exec per command.
    pub async fn create(docker: &Docker, spec: SandboxSpec) -> Result<DockerSandbox, SandboxError> {
        let span = info_span!("sandbox", session = %spec.session);
        async {
            checked_engine(docker, &spec).await?;
            let volume = match &spec.workspace {
                WorkspaceSource::Volume { name, seed } => {
                    let registration = spec.cleanup.register_creating(Resource::Creating {
                        docker: docker.clone(),
                        name: name.clone(),
                        volume: true,
                    })?;
                    if let Err(e) =
                        prepare_volume(docker, &spec, name, seed, spec.labels(), &registration).await
                    {
                        remove_volume(docker, name).await;
                        spec.cleanup.release(registration);
                        return Err(e);
                    }
                    Some((name.clone(), registration))
                }
                WorkspaceSource::Env { name, env, seed } => {
                    prepare_env_volume(docker, &spec, name, env, seed.as_deref()).await?;
                    None
                }
                WorkspaceSource::Bind { .. } => None,
            };
            let created = async {
                if !spec.per_call_exec {
                    if let Some(sb) = Self::create_as(docker, &spec, MainProcess::Executor, &[]).await? {
                        return Ok(sb);
                    }
                    debug!("the image has no python3: one docker exec per command");
                }
                Self::create_as(docker, &spec, MainProcess::KeepAlive, &[])
                    .await?
                    .ok_or_else(|| SandboxError::Other("the sandbox's keep-alive did not start".into()))
            }
            .await;
            match (created, volume) {
                (Ok(mut sb), volume) => {
                    sb.volume = volume;
                    if !spec.services.is_empty() {
                        sb.service_spec = Some(spec.clone());
                    }
                    if let Err(e) = sb.start_services(&spec).await {
                        // Removes what was started, the sandbox and its volume.
                        let _ = sb.shutdown().await;
                        return Err(e);
                    }
                    if sb.seed.is_some()
                        && let Err(e) = sb.seed_caches().await
                    {
                        // The sandbox works without it: every build starts cold.
                        tracing::warn!(error = %e, "the build cache was not copied in");
                    }
                    sb.guard_project(&spec);
                    Ok(sb)
                }
                (Err(e), Some((name, registration))) => {
                    remove_volume(docker, &name).await;
                    spec.cleanup.release(registration);
                    Err(e)
                }
                (Err(e), None) => Err(e),
            }
        }
        .instrument(span)
        .await
    }

    /// A bind-mounted project's state now, registered for the host's check after the run.
    fn guard_project(&self, spec: &SandboxSpec) {
        if let WorkspaceSource::Bind {
            project, baseline, ..
        } = &spec.workspace
        {
            let guard = Arc::new(HostGuard::new(project, baseline.clone(), &spec.session));
            let registration = spec.cleanup.register(Resource::HostCheck(guard.clone()));
            *self.guard.lock().unwrap_or_else(|e| e.into_inner()) = Some((guard, registration));
        }
    }

    /// `Ok(None)`: the container started but cannot host the executor (no python3), or the
    /// one-shot supervisor that runs `command` (which then did not run).
    async fn create_as(
        docker: &Docker,
        spec: &SandboxSpec,
        main: MainProcess,
        command: &[String],
    ) -> Result<Option<DockerSandbox>, SandboxError> {
        let t0 = Instant::now();
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let name = match main {
            MainProcess::Executor => spec.container_name(),
            MainProcess::KeepAlive => format!("{}-percall", spec.container_name()),
            MainProcess::OneShot => format!("{}-once", spec.container_name()),
        };
        let engine = super::flavor::info(docker).await;
        let (etc, mut body) = if super::engine::current().is_remote() {
            // No bind mount of this machine's files: the entries come in an image layer.
            let mut with_user = spec.clone();
            with_user.image = super::identity::image_with_user(docker, spec).await?;
            (None, with_user.create_body(main, None, &engine))
        } else {
            let etc = super::identity::etc_files(docker, spec).await?;
            let body = spec.create_body(main, Some(etc.dir()), &engine);
            (Some(etc), body)
        };
        if main == MainProcess::OneShot {
            // No supervisor built for this machine: the usual way.
            let Some(init) = oneshot::init_binary() else {
                return Ok(None);
            };
            oneshot::mount_init(&mut body, &init, command);
        }
        debug!(
            step = "image facts",
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "image facts read"
        );
        let (id, registration) = create_tracked(
            docker,
            &spec.cleanup,
            &name,
            body,
            "create container",
            spec.user(),
        )
        .await?;
        let mut registration = Some(registration);
        debug!(
            step = "create",
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "container created"
        );
        let events = watch_events(docker, &id);
        let mut exit = None;
        // A one-shot container's status is waited for from before it starts: it may be gone
        // (auto-removed) by the time its output ends.
        if main == MainProcess::OneShot {
            exit = Some(oneshot::wait_exit(docker, &id));
        }
        let result = async {
            let executor_mode = main != MainProcess::KeepAlive;
            // Attached before start, so nothing the main process writes is missed, and so its
            // stdin is ours from the first instant: when this connection drops, stdin closes.
            let attach = docker
                .attach_container(
                    &id,
                    Some(
                        AttachContainerOptionsBuilder::default()
                            .stdin(true)
                            .stdout(executor_mode)
                            .stderr(executor_mode)
                            .stream(true)
                            .build(),
                    ),
                )
                .await
                .map_err(|e| container_error(&id, "attach", e))?;
            docker
                .start_container(&id, None::<bollard::query_parameters::StartContainerOptions>)
                .await
                .map_err(|e| start_error(spec, &id, "start container", e))?;
            debug!(
                step = "start",
                elapsed_ms = t0.elapsed().as_millis() as u64,
                "container started"
            );
            let (executor, keepalive, one_shot, exec_mode) = match main {
                MainProcess::Executor => match Executor::from_attach(attach).await {
                    Some(ex) => (Some(ex), None, None, ExecMode::Persistent),
                    None => return Ok(None),
                },
                MainProcess::KeepAlive => (
                    None,
                    Some(Box::new(attach) as Box<dyn Send>),
                    None,
                    ExecMode::PerCall,
                ),
                MainProcess::OneShot => {
                    let Some(output) = oneshot::hello(attach.output).await else {
                        return Ok(None);
                    };
                    let parts = oneshot::Parts {
                        output,
                        exit: exit.take(),
                    };
                    (
                        None,
                        Some(Box::new(attach.input) as Box<dyn Send>),
                        Some(parts),
                        ExecMode::OneShot,
                    )
                }
            };
            debug!(
                step = "executor ready",
                elapsed_ms = t0.elapsed().as_millis() as u64,
                %exec_mode,
                "sandbox ready"
            );
            let sb = DockerSandbox {
                seed: spec.extras.seed.clone(),
                docker: docker.clone(),
                info: SandboxInfo {
                    session: spec.session.clone(),
                    container_id: id.clone(),
                    image: spec.image.clone(),
                    uid: spec.uid,
                    gid: spec.gid,
                    exec_mode,
                    warnings: match &spec.workspace {
                        WorkspaceSource::Bind { warnings, .. } => warnings.clone(),
                        WorkspaceSource::Volume { .. } | WorkspaceSource::Env { .. } => Vec::new(),
                    },
                },
                keepalive: Mutex::new(keepalive),
                one_shot: Mutex::new(one_shot),
                executor: tokio::sync::Mutex::new(executor),
                closed: AtomicBool::new(false),
                gone: AtomicBool::new(false),
                oom_seen: AtomicI64::new(-1),
                created_at,
                events: events.clone(),
                runtime: spec.runtime.clone(),
                cleanup: spec.cleanup.clone(),
                registration: Mutex::new(registration.take()),
                _etc: etc,
                volume: None,
                guard: Mutex::new(None),
                processes: Mutex::new(Vec::new()),
                asked_for_processes: AtomicBool::new(false),
                services: Mutex::new(Vec::new()),
                service_spec: None,
                service_starts: std::sync::atomic::AtomicUsize::new(0),
            };
            if exec_mode == ExecMode::PerCall {
                let n = sb.read_oom_kills().await;
                sb.oom_seen.store(n.unwrap_or(-1), Ordering::Relaxed);
            }
            Ok::<_, SandboxError>(Some(sb))
        }
        .await;
        if !matches!(result, Ok(Some(_))) {
            remove_container(docker, &id).await;
            // Never handed to a sandbox: released here, once the container is gone.
            if let Some(r) = registration.take() {
                spec.cleanup.release(r);
            }
        }
        result
    }

    /// What is appended to the file `path` in the sandbox, as it is written (`tail -f` as the
    /// sandbox user, through a Docker exec of its own, so it runs beside a command of the
    /// executor). It ends when the sweep after that command kills it, or the sandbox goes.
    pub async fn follow(
        &self,
        path: &str,
    ) -> Result<impl futures_util::Stream<Item = Vec<u8>> + Send + use<>, SandboxError> {
        self.check_open()?;
        let cid = &self.info.container_id;
        let user = self.user();
        let exec = self
            .docker
            .create_exec(
                cid,
                CreateExecOptions {
                    cmd: Some(vec!["tail", "-n", "+1", "-s", "0.2", "-f", path]),
                    attach_stdout: Some(true),
                    user: Some(user.as_str()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| container_error(cid, "create exec", e))?;
        match self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| container_error(cid, "start exec", e))?
        {
            StartExecResults::Attached { output, .. } => Ok(output.filter_map(|item| async move {
                match item {
                    Ok(LogOutput::StdOut { message }) => Some(message.to_vec()),
                    _ => None,
                }
            })),
            StartExecResults::Detached => Err(SandboxError::Other("exec started detached".into())),
        }
    }

    /// Copy a project's archive into the workspace of a sandbox started with an empty one (a
    /// pooled sandbox, see `pool`): the same tar (owned by the sandbox user) as an `--isolate`
    /// volume's seeding. A small one is unpacked by `tar` in the sandbox, as the sandbox user,
    /// through the executor (no request to the daemon; a one-file project: 41 ms median on a
    /// loaded 2-core machine, where the archive API took 65 ms): nothing of the host takes
    /// part, and what it writes is the sandbox's own workspace. A larger one, or one `tar`
    /// could not unpack (an image without it), goes through the archive API.
    pub async fn copy_in(&self, archive: &Path) -> Result<(), SandboxError> {
        /// The executor carries stdin in memory, base64 in a frame.
        const THROUGH_THE_EXECUTOR: u64 = 4 << 20;
        self.check_open()?;
        let read_err =
            |e: std::io::Error| SandboxError::Other(format!("cannot read the project archive: {e}"));
        let size = tokio::fs::metadata(archive).await.map_err(read_err)?.len();
        if self.info.exec_mode == ExecMode::Persistent && size <= THROUGH_THE_EXECUTOR {
            let tar = tokio::fs::read(archive).await.map_err(read_err)?;
            let unpack = ExecRequest::argv(
                ["tar", "-x", "-p", "-f", "-", "-C", super::WORKSPACE],
                Duration::from_secs(120),
            )
            .stdin(tar)
            .capture(4096, 4096);
            match self.exec(unpack).await? {
                out if out.success() => return Ok(()),
                out => debug!(
                    status = %out.status_line(),
                    stderr = %out.stderr.to_text(),
                    "tar in the sandbox did not unpack the project: the archive API instead"
                ),
            }
        }
        let file = tokio::fs::File::open(archive).await.map_err(read_err)?;
        let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
        let opts = UploadToContainerOptionsBuilder::default()
            .path(super::WORKSPACE)
            .build();
        self.docker
            .upload_to_container(&self.info.container_id, Some(opts), body)
            .await
            .map_err(|e| SandboxError::docker("copy the project into the sandbox", e))
    }

    /// For a bind-mounted project: move out git metadata the session planted or replaced, and
    /// list what changed. Call after [`Sandbox::shutdown`]: nothing may write while the host
    /// looks. `None` for an isolated project (the host's copy was not mounted), or when the
    /// check already ran.
    /// Runs under gVisor, whose execs can end with runsc's own status when the sandbox dies.
    pub fn under_gvisor(&self) -> bool {
        self.runtime.as_deref().is_some_and(super::is_gvisor)
    }

    pub fn check_host(&self) -> Option<agentbox_hostfs::hostscan::HostCheck> {
        let (guard, registration) = self.guard.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        let check = guard.finish();
        self.cleanup.release(registration);
        check
    }

    fn user(&self) -> String {
        format!("{}:{}", self.info.uid, self.info.gid)
    }

    /// The daemon connection, for the attached processes of `tty.rs`.
    pub(super) fn docker(&self) -> &Docker {
        &self.docker
    }

    fn check_open(&self) -> Result<(), SandboxError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SandboxError::ContainerGone("the sandbox was shut down".into()));
        }
        if self.gone.load(Ordering::Acquire) {
            return Err(SandboxError::ContainerGone(format!(
                "container {} is no longer running",
                short(&self.info.container_id)
            )));
        }
        Ok(())
    }

    /// Resolves once the container is no longer running. Under gVisor a Docker exec's stream
    /// can stay open after the whole sandbox died (runsc's wait for the process fails and
    /// nothing closes the stream), so whoever reads one also waits for this: the container's
    /// own end is the answer then, not the command's timeout.
    async fn stopped(&self) -> SandboxError {
        let cid = &self.info.container_id;
        loop {
            let mut wait = self
                .docker
                .wait_container(cid, None::<bollard::query_parameters::WaitContainerOptions>);
            let _ = wait.next().await;
            if !self.container_running().await {
                break;
            }
            // An answer while it runs (a dropped connection): ask again, without spinning.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.gone.store(true, Ordering::Release);
        SandboxError::ContainerGone(format!(
            "container {} stopped while running a command",
            short(cid)
        ))
    }

    /// [`Self::stopped`], said in the words that fit why (see [`Self::explain_death`]), for
    /// those that read an attached process's streams (`exec`, `shell`).
    pub async fn ended(&self) -> SandboxError {
        match self.stopped().await {
            SandboxError::ContainerGone(why) => self.explain_death(why).await,
            other => other,
        }
    }

    /// Is the container still running? Used to tell "the command runner died" from "the whole
    /// container was killed from outside".
    async fn container_running(&self) -> bool {
        match self.docker.inspect_container(&self.info.container_id, None).await {
            Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
            Err(_) => false,
        }
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn info(&self) -> &SandboxInfo {
        &self.info
    }

    fn ended_services(&self) -> Vec<String> {
        self.newly_ended_services()
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        self.check_open()?;
        if req.argv.is_empty()
            || req
                .argv
                .iter()
                .chain(req.env.iter().map(|(_, v)| v))
                .any(|a| a.contains('\0'))
        {
            // No process can receive such an argument: answer as a shell would, in both modes.
            return Ok(ExecOutput {
                exit_code: 126,
                stderr: Captured::complete(
                    b"cannot run: the command or an argument is empty or contains a NUL byte\n".to_vec(),
                ),
                ..Default::default()
            });
        }
        let span = info_span!("exec", argv0 = req.argv.first().map(String::as_str).unwrap_or(""));
        async {
            let result = match self.info.exec_mode {
                ExecMode::Persistent => self.exec_persistent(&req).await,
                ExecMode::PerCall => self.exec_per_call(&req).await,
                ExecMode::OneShot => Err(SandboxError::Other(
                    "a one-shot sandbox runs its own command only".into(),
                )),
            };
            match result {
                Err(SandboxError::ContainerGone(why)) => Err(self.explain_death(why).await),
                other => other,
            }
        }
        .instrument(span)
        .await
    }

    async fn put_archive(&self, dest: &str, tar: Vec<u8>) -> Result<(), SandboxError> {
        self.check_open()?;
        let opts = UploadToContainerOptionsBuilder::default().path(dest).build();
        self.docker
            .upload_to_container(
                &self.info.container_id,
                Some(opts),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| container_error(&self.info.container_id, "upload archive", e))
    }

    async fn get_archive(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, SandboxError> {
        self.check_open()?;
        let opts = DownloadFromContainerOptionsBuilder::default().path(path).build();
        let mut stream = self
            .docker
            .download_from_container(&self.info.container_id, Some(opts));
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| container_error(&self.info.container_id, "download archive", e))?;
            data.extend_from_slice(&chunk);
            if data.len() as u64 > max_bytes {
                return Err(SandboxError::Other(format!(
                    "archive of {path} is larger than {max_bytes} bytes"
                )));
            }
        }
        Ok(data)
    }

    async fn archive_reader(
        &self,
        path: &str,
    ) -> Result<Box<dyn tokio::io::AsyncRead + Send + Unpin>, SandboxError> {
        self.check_open()?;
        let opts = DownloadFromContainerOptionsBuilder::default().path(path).build();
        let stream = self
            .docker
            .download_from_container(&self.info.container_id, Some(opts))
            .map(|r| r.map_err(std::io::Error::other));
        Ok(Box::new(tokio_util::io::StreamReader::new(Box::pin(stream))))
    }

    async fn start_process(
        &self,
        req: ExecRequest,
        command: String,
        settle: Duration,
    ) -> Result<Result<ProcessState, ProcessRefusal>, SandboxError> {
        let frame = JobFrame {
            op: "start",
            job_id: None,
            why: None,
            settle: settle.as_secs_f64(),
            output: true,
        };
        let mut bounded = req.clone();
        bounded.timeout = settle + JOB_REQUEST_TIME;
        self.asked_for_processes.store(true, Ordering::Release);
        let mut states = match self.job(&bounded, frame).await? {
            Ok(states) => states,
            Err(why) => return Ok(Err(why)),
        };
        let Some(mut state) = states.pop() else {
            return Err(SandboxError::ExecutorLost("a start without its process".into()));
        };
        // The record starts with its command; `record` keeps it from then on.
        self.processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ProcessState {
                id: state.id.clone(),
                command,
                ..Default::default()
            });
        self.record(std::slice::from_mut(&mut state), true);
        Ok(Ok(state))
    }

    async fn processes(
        &self,
        id: Option<&str>,
        output: bool,
    ) -> Result<Result<Vec<ProcessState>, ProcessRefusal>, SandboxError> {
        let frame = JobFrame {
            op: if output { "output" } else { "list" },
            job_id: id,
            why: None,
            settle: 0.0,
            output,
        };
        let req = ExecRequest::argv(Vec::<String>::new(), JOB_REQUEST_TIME);
        let mut states = match self.job(&req, frame).await? {
            Ok(states) => states,
            Err(why) => return Ok(Err(why)),
        };
        self.record(&mut states, output);
        Ok(Ok(states))
    }

    async fn stop_processes(
        &self,
        id: Option<&str>,
        why: &str,
    ) -> Result<Result<Vec<ProcessState>, ProcessRefusal>, SandboxError> {
        if id.is_none() && !self.asked_for_processes.load(Ordering::Acquire) {
            // A session that started none pays nothing.
            return Ok(Ok(Vec::new()));
        }
        let frame = JobFrame {
            op: if id.is_some() { "stop" } else { "stop_all" },
            job_id: id,
            why: Some(why),
            settle: 0.0,
            output: true,
        };
        let req = ExecRequest::argv(Vec::<String>::new(), JOB_REQUEST_TIME);
        let mut states = match self.job(&req, frame).await? {
            Ok(states) => states,
            Err(why) => return Ok(Err(why)),
        };
        self.record(&mut states, true);
        Ok(Ok(states))
    }

    fn process_log(&self) -> Vec<ProcessState> {
        self.processes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn shutdown(&self) -> Result<(), SandboxError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let id = self.info.container_id.clone();
        // Ending the executor and the keep-alive first lets the container stop on its own;
        // the forced remove below makes it prompt and certain.
        self.executor.lock().await.take();
        self.keepalive.lock().unwrap_or_else(|e| e.into_inner()).take();
        debug!(step = "kill", "executor and keep-alive ended");
        self.remove_services().await;
        remove_container(&self.docker, &id).await;
        debug!(step = "remove", "sandbox container removed");
        if let Some(r) = self.registration.lock().unwrap_or_else(|e| e.into_inner()).take() {
            self.cleanup.release(r);
        }
        if let Some((name, _)) = &self.volume {
            remove_volume(&self.docker, name).await;
            debug!(step = "volume removal", "workspace volume removed");
        }
        Ok(())
    }
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            // No async here: dropping the keep-alive connection makes the container exit and
            // the daemon auto-removes it; the run's cleanup also still has it registered.
            debug!(
                container = short(&self.info.container_id),
                "sandbox dropped without shutdown"
            );
        }
    }
}
