//! A sandbox's services (see `crate::services`): started after the sandbox, in its network
//! namespace; ready before the sandbox is handed out; watched; removed before it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::{LogsOptionsBuilder, WaitContainerOptions};
use futures_util::StreamExt;
use tracing::debug;

use super::DockerSandbox;
use crate::api::{container_error, remove_container};
use crate::cleanup::Registration;
use crate::containers::{create_tracked, start_error};
use crate::policy::SandboxSpec;
use crate::services::{ServiceSpec, is_root};
use crate::{ExecRequest, Sandbox, SandboxError};

/// One service container of a sandbox.
pub(super) struct RunningService {
    pub name: String,
    pub id: String,
    /// Where it listens (see `service_port`), for readiness.
    port: Option<u16>,
    registration: Mutex<Option<Registration>>,
    /// Why it stopped, once it did (set by its watch).
    ended: Arc<Mutex<Option<String>>>,
    /// Its stop was told to the model already.
    reported: AtomicBool,
}

/// Lines of a service's log kept to say why it stopped.
const LOG_LINES: &str = "15";

/// Its log's last lines, as one indented block (empty if there is none).
async fn log_tail(docker: &Docker, id: &str) -> String {
    let opts = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail(LOG_LINES)
        .build();
    let mut stream = docker.logs(id, Some(opts));
    let mut text = String::new();
    let read = async {
        while let Some(Ok(item)) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(item.as_ref()));
            if text.len() > 8 * 1024 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    format!("; its last lines:\n  {}", lines.join("\n  "))
}

/// What a service's image decides: the user it runs as (the one given, else the image's unless
/// that is root, then nobody), the port it listens on (the one given, else the first TCP port the
/// image exposes), and the paths it declares as volumes (each gets a tmpfs: an anonymous volume
/// would put the data on the host's disk, outside the memory limit).
struct ImageFacts {
    user: String,
    port: Option<u16>,
    volumes: Vec<String>,
}

async fn image_facts(docker: &Docker, service: &ServiceSpec) -> ImageFacts {
    let config = docker
        .inspect_image(&service.image)
        .await
        .ok()
        .and_then(|i| i.config);
    let configured = config.as_ref().and_then(|c| c.user.clone()).unwrap_or_default();
    let user = match &service.user {
        Some(u) => u.clone(),
        None if is_root(&configured) => "65534:65534".to_string(),
        None => configured,
    };
    let port = if service.port.is_some() || service.kind.is_some() {
        service.port
    } else {
        let mut ports: Vec<u16> = config
            .as_ref()
            .and_then(|c| c.exposed_ports.clone())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.strip_suffix("/tcp").unwrap_or(p).parse().ok())
            .collect();
        ports.sort_unstable();
        ports.first().copied()
    };
    let mut volumes: Vec<String> = config
        .and_then(|c| c.volumes)
        .map(|v| v.into_iter().collect())
        .unwrap_or_default();
    volumes.sort();
    ImageFacts { user, port, volumes }
}

impl DockerSandbox {
    /// Start every service of `spec` beside this sandbox and wait until each takes connections
    /// (or its timeout). On an error, what was started is removed by the caller's shutdown.
    pub(super) async fn start_services(&self, spec: &SandboxSpec) -> Result<(), SandboxError> {
        if spec.services.is_empty() {
            return Ok(());
        }
        // The daemon's default runtime counts when none is given.
        let runtime = match &spec.runtime {
            Some(r) => Some(r.clone()),
            None => self.docker.info().await.ok().and_then(|i| i.default_runtime),
        };
        if runtime.as_deref().is_some_and(crate::is_gvisor) {
            return Err(SandboxError::Service {
                name: spec.services[0].name.clone(),
                why: crate::services::NOT_UNDER_GVISOR.into(),
            });
        }
        // A killed process's sandbox removes itself (its keep-alive ends with the process), but
        // a service has no such tie and runs on: the next run that starts services on this
        // machine removes those, once.
        if spec.cleanup.first_service_sweep() {
            crate::gc::remove_orphaned(&self.docker, crate::policy::SERVICE_LABEL).await;
        }
        let engine = crate::flavor::info(&self.docker).await;
        let mut started = Vec::new();
        for service in &spec.services {
            let t0 = Instant::now();
            let ImageFacts { user, port, volumes } = image_facts(&self.docker, service).await;
            if is_root(&user) {
                return Err(SandboxError::Service {
                    name: service.name.clone(),
                    why: format!("its user {user:?} is root, and a service never runs as root"),
                });
            }
            let body = spec.service_body(service, (&user, &volumes), &self.info.container_id, &engine);
            // Unique per start: the verdict's fresh services replace the agent's.
            let name = format!(
                "{}-svc-{}-{}",
                spec.container_name(),
                service.name,
                self.service_starts.fetch_add(1, Ordering::Relaxed)
            );
            let (id, registration) = create_tracked(
                &self.docker,
                &spec.cleanup,
                &name,
                body,
                "create a service container",
                user,
            )
            .await
            .map_err(|e| match e {
                SandboxError::ImageMissing { image, .. } => SandboxError::ImageMissing {
                    image,
                    detail: format!(
                        " (the service {}; `agentbox image build NAME` builds agentbox's own \
                         service images)",
                        service.name
                    ),
                },
                other => other,
            })?;
            let running = Arc::new(RunningService {
                name: service.name.clone(),
                id: id.clone(),
                port,
                registration: Mutex::new(Some(registration)),
                ended: Arc::new(Mutex::new(None)),
                reported: AtomicBool::new(false),
            });
            self.services
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(running.clone());
            self.docker
                .start_container(&id, None::<bollard::query_parameters::StartContainerOptions>)
                .await
                .map_err(|e| start_error(spec, &id, "start a service container", e))?;
            watch(&self.docker, &id, running.ended.clone());
            debug!(service = %service.name, elapsed_ms = t0.elapsed().as_millis() as u64, "service started");
            started.push(running);
        }
        for (service, running) in spec.services.iter().zip(&started) {
            let t0 = Instant::now();
            self.wait_ready(service, running).await?;
            debug!(service = %service.name, elapsed_ms = t0.elapsed().as_millis() as u64, "service ready");
        }
        Ok(())
    }

    /// New services for the verdict: what the agent phase left in a database (a table, a key
    /// the tests look for) must not decide it, as the scratch directories must not.
    pub(super) async fn restart_services(&self) -> Result<(), SandboxError> {
        let Some(spec) = &self.service_spec else {
            return Ok(());
        };
        self.remove_services().await;
        self.start_services(spec).await
    }

    /// Poll until `service` takes connections: its own probe for a known server, else a TCP
    /// connect from the sandbox; an error when it stops or its timeout passes.
    async fn wait_ready(&self, service: &ServiceSpec, running: &RunningService) -> Result<(), SandboxError> {
        let deadline = Instant::now() + service.ready_timeout;
        loop {
            if let Some(why) = running.ended.lock().map(|e| e.clone()).unwrap_or_default() {
                running.reported.store(true, Ordering::Relaxed);
                return Err(SandboxError::Service {
                    name: service.name.clone(),
                    why: format!("it stopped before it took connections: {why}"),
                });
            }
            let last = match self.probe(service, running).await {
                Ok(None) => return Ok(()),
                Ok(Some(why)) => why,
                // The sandbox itself is gone: waiting longer cannot help.
                Err(e @ SandboxError::ContainerGone(_)) => return Err(e),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                let log = log_tail(&self.docker, &running.id).await;
                return Err(SandboxError::Service {
                    name: service.name.clone(),
                    why: format!(
                        "it did not take connections within {}s (--service-timeout){}{log}",
                        service.ready_timeout.as_secs(),
                        if last.is_empty() {
                            String::new()
                        } else {
                            format!(" ({last})")
                        }
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// `None` when ready, else why not (for the timeout's message).
    async fn probe(
        &self,
        service: &ServiceSpec,
        running: &RunningService,
    ) -> Result<Option<String>, SandboxError> {
        if let Some(kind) = service.kind {
            let status = exec_status(&self.docker, &running.id, kind.probe()).await?;
            return Ok((status != 0).then(|| format!("its probe exited with status {status}")));
        }
        let Some(port) = running.port else {
            // Nothing to connect to: running is all that can be known.
            return Ok(None);
        };
        // From the sandbox's side, as the project will connect (bash's /dev/tcp: no client
        // program needed in either image).
        let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
        let out = self
            .exec(ExecRequest::argv(
                ["bash", "-c", &connect],
                Duration::from_secs(5),
            ))
            .await?;
        if out.success() {
            return Ok(None);
        }
        let said = out.stderr.to_text();
        let said = said.lines().last().unwrap_or("").trim().to_string();
        Ok(Some(format!(
            "a TCP connect to 127.0.0.1:{port} from the sandbox (bash's /dev/tcp): {}{}",
            out.status_line(),
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        )))
    }

    /// Services that stopped since the last call and were not told yet, each with why.
    pub(super) fn newly_ended_services(&self) -> Vec<String> {
        self.services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|s| {
                let why = s.ended.lock().ok()?.clone()?;
                (!s.reported.swap(true, Ordering::Relaxed)).then(|| format!("the service {} {why}", s.name))
            })
            .collect()
    }

    /// Remove every service (before the sandbox, whose namespace they are in).
    pub(super) async fn remove_services(&self) {
        let all: Vec<Arc<RunningService>> =
            std::mem::take(&mut *self.services.lock().unwrap_or_else(|e| e.into_inner()));
        for s in all {
            // Its end is ours, not news for the model.
            s.reported.store(true, Ordering::Relaxed);
            remove_container(&self.docker, &s.id).await;
            if let Some(r) = s.registration.lock().unwrap_or_else(|e| e.into_inner()).take() {
                self.cleanup.release(r);
            }
        }
    }
}

/// Wait for the container's end in the background; record how it ended and its last lines.
fn watch(docker: &Docker, id: &str, ended: Arc<Mutex<Option<String>>>) {
    let docker = docker.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        let status = loop {
            let mut wait = docker.wait_container(&id, None::<WaitContainerOptions>);
            match wait.next().await {
                Some(Ok(r)) => break format!("exited with status {}", r.status_code),
                // Docker reports a non-zero exit as an error of the wait.
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                    break format!("exited with status {code}");
                }
                // The connection, not the container (a daemon restarting): wait again while it
                // still runs.
                other => {
                    let running = docker
                        .inspect_container(&id, None::<bollard::query_parameters::InspectContainerOptions>)
                        .await
                        .ok()
                        .and_then(|c| c.state)
                        .and_then(|s| s.running)
                        .unwrap_or(false);
                    if !running {
                        break match other {
                            Some(Err(e)) => format!("stopped ({e})"),
                            _ => "stopped".to_string(),
                        };
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let oom = docker
            .inspect_container(&id, None::<bollard::query_parameters::InspectContainerOptions>)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.oom_killed)
            .unwrap_or(false);
        let log = log_tail(&docker, &id).await;
        let why = format!(
            "{status}{}{log}",
            if oom {
                " (out of memory: the kernel killed it)"
            } else {
                ""
            }
        );
        if let Ok(mut e) = ended.lock() {
            *e = Some(why);
        }
    });
}

/// Run `argv` in the container `id` as its own user; its exit status.
async fn exec_status(docker: &Docker, id: &str, argv: Vec<String>) -> Result<i64, SandboxError> {
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(argv),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| container_error(id, "create exec", e))?;
    let run = async {
        if let StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| container_error(id, "start exec", e))?
        {
            while output.next().await.is_some() {}
        }
        Ok::<_, SandboxError>(())
    };
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(r) => r?,
        Err(_) => return Ok(-1),
    }
    let inspected = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| container_error(id, "inspect exec", e))?;
    Ok(inspected.exit_code.unwrap_or(-1))
}
