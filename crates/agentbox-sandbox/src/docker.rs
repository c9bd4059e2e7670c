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
use super::{Captured, ExecMode, ExecOutput, ExecRequest, ProcessState, Sandbox, SandboxError, SandboxInfo};
use agentbox_hostfs::hostscan::HostGuard;

/// Per-call mode runs `"$@"` and then sweeps, so a background child that holds stdout open
/// cannot keep the exec stream (and the caller) waiting. The command gets the highest OOM score
/// first (its own, inherited by all it starts), so that when the sandbox runs out of memory the
/// kernel kills it rather than the keep-alive, whose end would be the session's.
///
/// It also lowers the limits `AGENTBOX_RLIMITS` names, as the executor does for its commands:
/// rootless Podman 4.3 drops a container's ulimits. `ulimit -f` counts 512-byte blocks in a
/// POSIX `sh` (dash, busybox, bash as sh).
pub(super) fn per_call_wrapper() -> String {
    format!("echo 1000 > /proc/self/oom_score_adj 2>/dev/null\n{RLIMITS}\n\"$@\"\nrc=$?\n{SWEEP}\nexit $rc")
}

const RLIMITS: &str = r#"case "$AGENTBOX_RLIMITS" in fsize:*) f=${AGENTBOX_RLIMITS#fsize:}; ulimit -f $((${f%%,*} / 512)) 2>/dev/null;; esac
ulimit -n 4096 2>/dev/null; ulimit -c 0 2>/dev/null"#;

/// Grace for a sweep to take effect and the streams to drain, beyond a command's timeout.
const WATCHDOG: Duration = Duration::from_secs(10);

/// What a request about background processes may take beyond its own wait (a stop kills a
/// tree for up to 5 s, then sweeps for up to 5 s more).
const JOB_REQUEST_TIME: Duration = Duration::from_secs(15);

/// What a remote engine cannot do, refused before anything is created: it cannot mount a
/// directory or a socket of this machine (it would mount whatever has that path on its own).
fn remote_check(spec: &SandboxSpec) -> Result<(), SandboxError> {
    let engine = super::engine::current();
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
fn check_engine(engine: &super::flavor::EngineInfo, spec: &SandboxSpec) -> Result<(), SandboxError> {
    let endpoint = super::engine::current();
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
        && engine.kind == super::flavor::EngineKind::Docker
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

/// Create the session's volume and fill it: the project's tar goes in through the archive
/// API, then a seeder with only CAP_CHOWN gives the volume's root to the sandbox user.
async fn prepare_volume(
    docker: &Docker,
    spec: &SandboxSpec,
    name: &str,
    seed: &Path,
    volume: &Registration,
) -> Result<(), SandboxError> {
    let labels = spec.labels();
    let made = docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        })
        .await;
    made.map_err(|e| SandboxError::docker("create volume", e))?;
    spec.cleanup.replace(
        volume,
        Resource::Volume {
            docker: docker.clone(),
            name: name.to_string(),
        },
    );
    let seeder_name = format!("{}-seed", spec.container_name());
    let (id, seeder) = create_tracked(
        docker,
        &spec.cleanup,
        &seeder_name,
        spec.seeder_body(name, &super::flavor::info(docker).await),
        "create the seeding container",
        "0:0".into(),
    )
    .await?;
    let result = async {
        let file = tokio::fs::File::open(seed)
            .await
            .map_err(|e| SandboxError::Other(format!("cannot read the project archive: {e}")))?;
        let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
        let opts = UploadToContainerOptionsBuilder::default()
            .path(super::WORKSPACE)
            .build();
        docker
            .upload_to_container(&id, Some(opts), body)
            .await
            .map_err(|e| SandboxError::docker("copy the project into the sandbox", e))?;
        docker
            .start_container(&id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| start_error(spec, &id, "start the seeding container", e))?;
        let mut wait = docker.wait_container(&id, None::<bollard::query_parameters::WaitContainerOptions>);
        match wait.next().await {
            Some(Ok(r)) if r.status_code == 0 => Ok(()),
            Some(Ok(r)) => Err(SandboxError::Other(format!(
                "preparing the volume failed (status {})",
                r.status_code
            ))),
            Some(Err(e)) => Err(SandboxError::docker("wait for the seeding container", e)),
            None => Err(SandboxError::Other("the seeding container vanished".into())),
        }
    }
    .await;
    remove_container(docker, &id).await;
    spec.cleanup.release(seeder);
    result
}

/// One sandbox container, alive until [`Sandbox::shutdown`] or drop.
pub struct DockerSandbox {
    docker: Docker,
    info: SandboxInfo,
    /// The attach connection to the keep-alive's stdin (per-call mode; in executor mode the
    /// executor holds its own). Dropping it (shutdown, drop, or this process dying) ends the
    /// main process, and auto-remove removes the container.
    keepalive: Mutex<Option<bollard::container::AttachContainerResults>>,
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
}

/// The sandbox's scratch directories: what a command may leave behind outside the project.
const SCRATCH: &[&str] = &["/tmp", super::policy::HOME, super::policy::CACHE_DIR, "/dev/shm"];

impl DockerSandbox {
    /// Copy setup's build cache (see `Extras::seed`) into `CACHE_DIR`, replacing what is there
    /// of the same name. A copy that fails is removed whole: a half-copied artifact with its
    /// fingerprint would be taken for a good one.
    async fn seed_caches(&self) -> Result<(), SandboxError> {
        let Some(seed) = &self.seed else {
            return Ok(());
        };
        let script = format!(
            "for d in \"$1\"/*; do [ -d \"$d\" ] || continue; t={cache}/${{d##*/}}; rm -rf \"$t\"; \
             cp -a \"$d\" \"$t\" || {{ rm -rf \"$t\"; exit 1; }}; done",
            cache = super::policy::CACHE_DIR,
        );
        let out = self
            .exec(ExecRequest::argv(
                ["sh", "-c", script.as_str(), "sh", seed.as_str()],
                Duration::from_secs(600),
            ))
            .await?;
        if out.success() {
            Ok(())
        } else {
            Err(SandboxError::Other(format!(
                "copying the build cache: {}: {}",
                out.status_line(),
                out.stderr.to_text().trim()
            )))
        }
    }

    /// Empty the scratch directories (`/tmp`, `HOME`, `CACHE_DIR`, `/dev/shm`) and copy the
    /// build cache in again: the state a session starts from, with only the project as the
    /// commands left it. For agentbox's own test run, once nothing runs any more: what the agent
    /// phase left there (a planted test binary with a fresh fingerprint, a Go test result, a
    /// `usercustomize.py`, a tool's configuration in `HOME`) could otherwise decide the verdict.
    pub async fn fresh_scratch(&self) -> Result<(), SandboxError> {
        let dirs = SCRATCH.join(" ");
        // The sandbox user owns everything it wrote there; what it made unreadable is made
        // readable first so that `rm` can go through it.
        let script = format!(
            "for d in {dirs}; do chmod -R u+rwX \"$d\" 2>/dev/null; \
             find \"$d\" -mindepth 1 -maxdepth 1 -exec rm -rf {{}} + 2>/dev/null; done; \
             for d in {dirs}; do [ -z \"$(ls -A \"$d\")\" ] || {{ echo \"$d could not be emptied\" >&2; exit 1; }}; done"
        );
        let out = self
            .exec(ExecRequest::argv(["sh", "-c", &script], Duration::from_secs(300)))
            .await?;
        if !out.success() {
            return Err(SandboxError::Other(format!(
                "resetting the scratch directories: {}: {}",
                out.status_line(),
                out.stderr.to_text().trim()
            )));
        }
        self.seed_caches().await
    }
    /// Start a sandbox: the executor as the container's main process when the image has
    /// python3 (and `per_call_exec` is off), otherwise a keep-alive and one exec per command.
    pub async fn create(docker: &Docker, spec: SandboxSpec) -> Result<DockerSandbox, SandboxError> {
        let span = info_span!("sandbox", session = %spec.session);
        async {
            remote_check(&spec)?;
            let engine = super::flavor::info(docker).await;
            check_engine(&engine, &spec)?;
            let volume = match &spec.workspace {
                WorkspaceSource::Volume { name, seed } => {
                    let registration = spec.cleanup.register(Resource::Creating {
                        docker: docker.clone(),
                        name: name.clone(),
                        volume: true,
                    });
                    if let Err(e) = prepare_volume(docker, &spec, name, seed, &registration).await {
                        remove_volume(docker, name).await;
                        spec.cleanup.release(registration);
                        return Err(e);
                    }
                    Some((name.clone(), registration))
                }
                WorkspaceSource::Bind { .. } => None,
            };
            let created = async {
                if !spec.per_call_exec {
                    if let Some(sb) = Self::create_as(docker, &spec, MainProcess::Executor).await? {
                        return Ok(sb);
                    }
                    debug!("the image has no python3: one docker exec per command");
                }
                Self::create_as(docker, &spec, MainProcess::KeepAlive)
                    .await?
                    .ok_or_else(|| SandboxError::Other("the sandbox's keep-alive did not start".into()))
            }
            .await;
            match (created, volume) {
                (Ok(mut sb), volume) => {
                    sb.volume = volume;
                    if sb.seed.is_some()
                        && let Err(e) = sb.seed_caches().await
                    {
                        // The sandbox works without it: every build starts cold.
                        tracing::warn!(error = %e, "the build cache was not copied in");
                    }
                    if let WorkspaceSource::Bind {
                        project, baseline, ..
                    } = &spec.workspace
                    {
                        let guard = Arc::new(HostGuard::new(project, baseline.clone(), &spec.session));
                        let registration = spec.cleanup.register(Resource::HostCheck(guard.clone()));
                        sb.guard = Mutex::new(Some((guard, registration)));
                    }
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

    /// `Ok(None)`: the container started but cannot host the executor (no python3).
    async fn create_as(
        docker: &Docker,
        spec: &SandboxSpec,
        main: MainProcess,
    ) -> Result<Option<DockerSandbox>, SandboxError> {
        let t0 = Instant::now();
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let name = match main {
            MainProcess::Executor => spec.container_name(),
            MainProcess::KeepAlive => format!("{}-percall", spec.container_name()),
        };
        let engine = super::flavor::info(docker).await;
        let (etc, body) = if super::engine::current().is_remote() {
            // No bind mount of this machine's files: the entries come in an image layer.
            let mut with_user = spec.clone();
            with_user.image = super::identity::image_with_user(docker, spec).await?;
            (None, with_user.create_body(main, None, &engine))
        } else {
            let etc = super::identity::etc_files(docker, spec).await?;
            let body = spec.create_body(main, Some(etc.dir()), &engine);
            (Some(etc), body)
        };
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
        debug!(elapsed_ms = t0.elapsed().as_millis() as u64, "container created");
        let events = watch_events(docker, &id);
        let result = async {
            let executor_mode = main == MainProcess::Executor;
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
            debug!(elapsed_ms = t0.elapsed().as_millis() as u64, "container started");
            let (executor, keepalive) = if executor_mode {
                match Executor::from_attach(attach).await {
                    Some(ex) => (Some(ex), None),
                    None => return Ok(None),
                }
            } else {
                (None, Some(attach))
            };
            let exec_mode = if executor.is_some() {
                ExecMode::Persistent
            } else {
                ExecMode::PerCall
            };
            debug!(elapsed_ms = t0.elapsed().as_millis() as u64, %exec_mode, "sandbox ready");
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
                        WorkspaceSource::Volume { .. } => Vec::new(),
                    },
                },
                keepalive: Mutex::new(keepalive),
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

    async fn exec_persistent(&self, req: &ExecRequest) -> Result<ExecOutput, SandboxError> {
        let mut guard = self.executor.lock().await;
        let Some(ex) = guard.as_mut() else {
            return Err(SandboxError::ExecutorLost(
                "it failed earlier in this session".into(),
            ));
        };
        match ex.call(req, WATCHDOG).await {
            Ok(out) => Ok(out),
            Err(err) => {
                // The executor is the container's main process: without it there is no
                // session. Tell "killed from outside" apart from a failure of our own.
                *guard = None;
                drop(guard);
                self.gone.store(true, Ordering::Release);
                for _ in 0..10 {
                    if !self.container_running().await {
                        return Err(SandboxError::ContainerGone(format!(
                            "container {} stopped while running a command",
                            short(&self.info.container_id)
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err)
            }
        }
    }

    async fn exec_per_call(&self, req: &ExecRequest) -> Result<ExecOutput, SandboxError> {
        let _serial = self.executor.lock().await;
        let cid = &self.info.container_id;
        let started = Instant::now();
        let wrapper = per_call_wrapper();
        let mut cmd: Vec<&str> = vec!["/bin/sh", "-c", &wrapper, "agentbox-run"];
        cmd.extend(req.argv.iter().map(String::as_str));
        let env: Vec<String> = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let user = self.user();
        let exec = self
            .docker
            .create_exec(
                cid,
                CreateExecOptions {
                    cmd: Some(cmd),
                    env: Some(env.iter().map(String::as_str).collect()),
                    attach_stdin: Some(req.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(user.as_str()),
                    working_dir: Some(req.workdir.as_deref().unwrap_or(super::WORKSPACE)),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| container_error(cid, "create exec", e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| container_error(cid, "start exec", e))?
        else {
            return Err(SandboxError::Other("exec started detached".into()));
        };
        let writer = req.stdin.clone().map(|data| {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
                input
            })
        });
        let mut out = HeadTail::new(req.head, req.tail);
        let mut err = HeadTail::new(req.head, req.tail);
        let mut timed_out = false;
        let mut oom_after = None;
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        let stopped = self.stopped();
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                item = output.next() => match item {
                    Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => out.push(&message),
                    Some(Ok(LogOutput::StdErr { message })) => err.push(&message),
                    Some(Ok(LogOutput::StdIn { .. })) => {}
                    Some(Err(e)) => return Err(container_error(cid, "exec stream", e)),
                    None => break,
                },
                gone = &mut stopped => return Err(gone),
                _ = &mut deadline => {
                    if timed_out {
                        // The sweep did not close the stream in time; stop waiting for it.
                        break;
                    }
                    timed_out = true;
                    oom_after = self.sweep().await?;
                    deadline.as_mut().reset(tokio::time::Instant::now() + WATCHDOG);
                }
            }
        }
        if let Some(w) = writer {
            w.abort();
        }
        // Under gVisor an exec whose sandbox died can also end at once, with runsc's own status
        // (128: "waiting on PID ...: EOF"), a moment before the container is seen to stop.
        if !timed_out && self.runtime.as_deref().is_some_and(super::is_gvisor) {
            let code = self
                .docker
                .inspect_exec(&exec.id)
                .await
                .ok()
                .and_then(|i| i.exit_code);
            if code.is_none_or(|c| c >= 128)
                && let Ok(gone) = tokio::time::timeout(Duration::from_secs(2), &mut stopped).await
            {
                return Err(gone);
            }
        }
        // The wrapper's own sweep can be escaped by a command that kills the wrapper: sweep again
        // from a fresh exec, so nothing outlives the command in this mode either.
        if !timed_out {
            oom_after = self.sweep().await?;
        }
        let inspect = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| container_error(cid, "inspect exec", e))?;
        let exit_code = inspect.exit_code.unwrap_or(if timed_out { 137 } else { -1 });
        let mut result = ExecOutput {
            exit_code,
            signal: (exit_code > 128 && exit_code < 160).then(|| (exit_code - 128) as i32),
            timed_out,
            oom_killed: false,
            stdout: out.finish(),
            stderr: err.finish(),
            elapsed: started.elapsed(),
        };
        // Any OOM kill while the command ran counts, not only of the command itself: with many
        // processes the killer may take one of its children and the command goes on.
        if oom_after.is_none() && exit_code == 137 {
            // The sweep could not say (the container was going): ask as the keep-alive's uid.
            oom_after = self.read_oom_kills().await;
        }
        let now = oom_after.unwrap_or(-1);
        let before = self.oom_seen.swap(now, Ordering::Relaxed);
        result.oom_killed = before >= 0 && now > before;
        Ok(result)
    }

    /// Kill every process the sandbox user runs (the command of a call that was given up, and
    /// all it started), leaving the sandbox itself up for the next call.
    pub async fn interrupt(&self) -> Result<(), SandboxError> {
        self.check_open()?;
        self.sweep().await.map(|_| ())
    }

    /// End the command of a call that was given up (the chat's Ctrl-C) and all it started, but
    /// not the background processes: the executor is told to, as if its timeout had come. With
    /// one docker exec per call (no background processes there), [`Self::interrupt`].
    pub async fn cancel_call(&self) -> Result<(), SandboxError> {
        self.check_open()?;
        if self.info.exec_mode == ExecMode::PerCall {
            return self.interrupt().await;
        }
        let mut guard = self.executor.lock().await;
        let Some(ex) = guard.as_mut() else {
            return Err(SandboxError::ExecutorLost(
                "it failed earlier in this session".into(),
            ));
        };
        match ex.interrupt(WATCHDOG).await {
            Ok(()) => Ok(()),
            Err(e) => {
                *guard = None;
                self.gone.store(true, Ordering::Release);
                Err(e)
            }
        }
    }

    /// One request about background processes to the executor; a failure of the executor
    /// ends the session as a failed command does.
    async fn job(
        &self,
        req: &ExecRequest,
        frame: JobFrame<'_>,
    ) -> Result<Result<Vec<ProcessState>, String>, SandboxError> {
        self.check_open()?;
        if self.info.exec_mode == ExecMode::PerCall {
            return Ok(Err(super::NO_BACKGROUND.into()));
        }
        let mut guard = self.executor.lock().await;
        let Some(ex) = guard.as_mut() else {
            return Err(SandboxError::ExecutorLost(
                "it failed earlier in this session".into(),
            ));
        };
        match ex.job(req, frame, WATCHDOG).await {
            Ok(r) => Ok(r),
            Err(err) => {
                *guard = None;
                drop(guard);
                self.gone.store(true, Ordering::Release);
                if !self.container_running().await {
                    return Err(self
                        .explain_death(format!("container {} stopped", short(&self.info.container_id)))
                        .await);
                }
                Err(err)
            }
        }
    }

    /// Take in what the executor said of some processes: the record keeps each one's command
    /// and how much of its output was shown; with `shown`, what is returned now counts as shown.
    fn record(&self, states: &mut [ProcessState], shown: bool) {
        let mut log = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        for state in states.iter_mut() {
            match log.iter_mut().find(|p| p.id == state.id) {
                Some(seen) => {
                    state.command = seen.command.clone();
                    state.shown = seen.shown;
                    let mut kept = state.clone();
                    if shown {
                        kept.shown = state.output.total;
                    }
                    // The record keeps only the count of the output, not the bytes.
                    kept.output = Captured {
                        total: state.output.total,
                        ..Default::default()
                    };
                    *seen = kept;
                }
                None => log.push(ProcessState {
                    output: Captured {
                        total: state.output.total,
                        ..Default::default()
                    },
                    shown: if shown { state.output.total } else { 0 },
                    ..state.clone()
                }),
            }
        }
    }

    /// Kill every process of the sandbox user, through a fresh exec, which then reads the memory
    /// cgroup's OOM-kill counter (so per-call mode learns of an OOM kill without another exec).
    async fn sweep(&self) -> Result<Option<i64>, SandboxError> {
        let cid = &self.info.container_id;
        let user = self.user();
        let script = format!("{SWEEP}\n{READ_OOM_KILLS}");
        let exec = self
            .docker
            .create_exec(
                cid,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", script.as_str()]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(user.as_str()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| container_error(cid, "create exec", e))?;
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| container_error(cid, "start exec", e))?
        {
            let mut text = Vec::new();
            let drain = async {
                while let Some(Ok(item)) = output.next().await {
                    if text.len() < 4096 {
                        text.extend_from_slice(item.as_ref());
                    }
                }
            };
            let _ = tokio::time::timeout(WATCHDOG, drain).await;
            return Ok(parse_oom_kills(&text));
        }
        Ok(None)
    }

    /// Why the container died, from the daemon's event log, which outlives the auto-removed
    /// container: an `oom` event and the exit status of its `die` event (`None`: no `die`
    /// event, or no answer). Under runc, commands get the highest OOM score so that an OOM
    /// kill of the sandbox does not happen; when it does anyway (a command lowered its own
    /// score), the user hears "out of memory", not "killed from outside". Under gVisor the
    /// host's OOM killer can only take the whole sandbox (its kernel is one host process).
    async fn death(&self) -> Option<Death> {
        use bollard::query_parameters::EventsOptionsBuilder;
        // What the live watch saw; its `die` can trail the end by a moment.
        for _ in 0..30 {
            let seen = self.events.lock().unwrap_or_else(|p| p.into_inner()).death();
            if seen.is_some() {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let filters = HashMap::from([
            ("container".to_string(), vec![self.info.container_id.clone()]),
            ("type".to_string(), vec!["container".to_string()]),
            (
                "event".to_string(),
                vec!["oom".to_string(), "kill".to_string(), "die".to_string()],
            ),
        ]);
        let look = async {
            // The `die` event can trail the container's end by a moment (seconds on a loaded
            // machine); this runs only once a sandbox has died.
            for _ in 0..25 {
                let until = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let opts = EventsOptionsBuilder::default()
                    .since(&self.created_at.saturating_sub(1).to_string())
                    .until(&until.to_string())
                    .filters(&filters)
                    .build();
                let mut seen = Seen::default();
                let mut events = self.docker.events(Some(opts));
                while let Some(event) = events.next().await {
                    // No answer from the daemon: nothing to learn, and no reason to wait.
                    let Ok(event) = event else { return None };
                    seen.record(event);
                }
                if let Some(death) = seen.death() {
                    return Some(death);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(10), look)
            .await
            .unwrap_or(None)
    }

    /// The error for a container that died under a command, said in the words that fit why.
    async fn explain_death(&self, why: String) -> SandboxError {
        // The events can lag or miss the OOM under load (seen under gVisor in CI); the
        // container's own state, while it still exists, says OOMKilled and the exit code too.
        let state = self
            .docker
            .inspect_container(&self.info.container_id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .filter(|s| s.running != Some(true));
        let death = match (self.death().await, state) {
            (Some(mut d), Some(s)) => {
                d.oom |= s.oom_killed == Some(true);
                Some(d)
            }
            (Some(d), None) => Some(d),
            (None, Some(s)) => Some(Death {
                oom: s.oom_killed == Some(true),
                killed: false,
                exit_code: s.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            }),
            (None, None) => None,
        };
        let Some(death) = death else {
            return SandboxError::ContainerGone(why);
        };
        let gvisor = self.runtime.as_deref().filter(|r| super::is_gvisor(r));
        match (gvisor, death) {
            (
                None,
                Death {
                    oom: true, exit_code, ..
                },
            ) if exit_code == "137" => SandboxError::OutOfMemory(why),
            (Some(runtime), Death { oom: true, .. }) => SandboxError::SandboxOutOfMemory {
                runtime: runtime.to_string(),
                detail: why,
            },
            // gVisor's kernel (the sentry) ends with its own status when the host refuses it a
            // process or thread: measured with Debian's runsc 2022-12 on the ptrace platform,
            // a fork bomb reaching --pids-limit ends the whole sandbox with status 2.
            (
                Some(runtime),
                Death {
                    killed: false,
                    exit_code,
                    ..
                },
            ) if exit_code != "0" && exit_code != "137" => SandboxError::SandboxEnded {
                runtime: runtime.to_string(),
                exit_code,
                detail: why,
            },
            _ => SandboxError::ContainerGone(why),
        }
    }

    /// The memory cgroup's OOM-kill counter (cgroup v2 or v1), read as the keep-alive's uid.
    pub(super) async fn read_oom_kills(&self) -> Option<i64> {
        let exec = self
            .docker
            .create_exec(
                &self.info.container_id,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", READ_OOM_KILLS]),
                    attach_stdout: Some(true),
                    user: Some("65534:65534"),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        let StartExecResults::Attached { mut output, .. } =
            self.docker.start_exec(&exec.id, None).await.ok()?
        else {
            return None;
        };
        let mut text = Vec::new();
        while let Some(Ok(item)) = output.next().await {
            text.extend_from_slice(item.as_ref());
        }
        parse_oom_kills(&text)
    }
}

/// Prints the memory cgroup's counters, among them `oom_kill N` (cgroup v2, then v1).
const READ_OOM_KILLS: &str =
    "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null";

fn parse_oom_kills(text: &[u8]) -> Option<i64> {
    String::from_utf8_lossy(text)
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
}

/// What [`watch_events`] has seen of one container.
#[derive(Debug, Default, Clone)]
struct Seen {
    oom: bool,
    killed: bool,
    /// The `die` event's exit status.
    died_with: Option<String>,
}

impl Seen {
    /// Take in one event; true once the container has ended (`die`, `destroy`).
    fn record(&mut self, event: bollard::models::EventMessage) -> bool {
        match event.action.as_deref() {
            Some("oom") => self.oom = true,
            Some("kill") => self.killed = true,
            Some("die") => {
                let code = event
                    .actor
                    .and_then(|a| a.attributes)
                    .and_then(|a| a.get("exitCode").cloned());
                self.died_with = Some(code.unwrap_or_default());
                return true;
            }
            Some("destroy") => return true,
            _ => {}
        }
        false
    }

    /// How it died, once its `die` has been seen.
    fn death(&self) -> Option<Death> {
        self.died_with.clone().map(|exit_code| Death {
            oom: self.oom,
            killed: self.killed,
            exit_code,
        })
    }
}

/// Follow one container's `oom`, `kill` and `die` events from now on, until it dies or is
/// destroyed (a sandbox dropped without shutdown ends its container too).
fn watch_events(docker: &Docker, cid: &str) -> Arc<Mutex<Seen>> {
    use bollard::query_parameters::EventsOptionsBuilder;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let filters = HashMap::from([
        ("container".to_string(), vec![cid.to_string()]),
        ("type".to_string(), vec!["container".to_string()]),
        (
            "event".to_string(),
            ["oom", "kill", "die", "destroy"].map(String::from).to_vec(),
        ),
    ]);
    let (docker, record) = (docker.clone(), seen.clone());
    tokio::spawn(async move {
        let opts = EventsOptionsBuilder::default().filters(&filters).build();
        let mut events = docker.events(Some(opts));
        while let Some(Ok(event)) = events.next().await {
            if record.lock().unwrap_or_else(|p| p.into_inner()).record(event) {
                return;
            }
        }
    });
    seen
}

/// How a container ended, from its events.
struct Death {
    /// The memory cgroup's OOM killer fired in it.
    oom: bool,
    /// It was killed through the API (`docker kill`, `docker rm -f`): from outside.
    killed: bool,
    /// The `die` event's exit status, as the daemon gives it ("137": SIGKILL).
    exit_code: String,
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn info(&self) -> &SandboxInfo {
        &self.info
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
    ) -> Result<Result<ProcessState, String>, SandboxError> {
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
    ) -> Result<Result<Vec<ProcessState>, String>, SandboxError> {
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
    ) -> Result<Result<Vec<ProcessState>, String>, SandboxError> {
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
        remove_container(&self.docker, &id).await;
        if let Some(r) = self.registration.lock().unwrap_or_else(|e| e.into_inner()).take() {
            self.cleanup.release(r);
        }
        if let Some((name, _)) = &self.volume {
            remove_volume(&self.docker, name).await;
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
