//! Opening a session: the model client, the sandbox (bind-mounted or isolated), the baseline
//! for the diff, the test command, the system prompt and the tools.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;

use super::{Session, TerminalApprover, baseline, isolated, prompt};
use crate::agent::AgentConfig;
use crate::config::{AgentSettings, SandboxConfig};
use crate::events::{Event, EventSink, Fanout, Printer, Redactor, TrajectoryWriter};
use crate::image::{ensure_image, stderr_progress};
use crate::isolate;
use crate::model::ToolChoice;
use crate::sandbox::{DockerSandbox, Sandbox, SandboxError, SandboxSpec, connect_docker};
use crate::tools::{ToolRegistry, ToolSettings};
use crate::workspace::Workspace;

/// The progress printer, plus the trajectory file when asked for.
pub fn event_sinks(settings: &AgentSettings) -> anyhow::Result<Arc<Fanout>> {
    let redactor = Redactor::new(settings.model.secrets());
    let mut sinks: Vec<Box<dyn EventSink>> = vec![Box::new(Printer::new(redactor.clone()))];
    if let Some(path) = &settings.trajectory {
        let writer = TrajectoryWriter::create(path, redactor)
            .map_err(|e| anyhow::anyhow!("cannot write the trajectory {}: {e}", path.display()))?;
        sinks.push(Box::new(writer));
    }
    Ok(Arc::new(Fanout(sinks)))
}

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
    let docker = connect_docker().await?;
    ensure_image(&docker, &cfg.image, &cfg.cleanup, &mut stderr_progress).await?;
    let sandbox = DockerSandbox::create(&docker, spec).await?;
    Ok((docker, sandbox))
}

impl Session {
    pub async fn open(
        settings: &AgentSettings,
        project: &Path,
        events: Arc<Fanout>,
    ) -> anyhow::Result<Session> {
        let observer_events = events.clone();
        let on_retry: crate::model::RetryObserver = Arc::new(move |attempt, wait, reason: &str| {
            observer_events.emit(&Event::Retry {
                attempt,
                wait_ms: wait.as_millis() as u64,
                reason: reason.to_string(),
            });
        });
        // The model client first: a missing script or key fails before any container starts.
        let model = settings.model.client(Some(on_retry))?;
        let (sandbox, isolation) = match &settings.isolate {
            None => (open_sandbox(&settings.sandbox, project).await?.1, None),
            Some(iso) => {
                let crate::sandbox::ProjectDir { uid, gid, .. } = crate::sandbox::inspect_project(project)?;
                let root = project.canonicalize()?;
                let exclude = iso.exclude.clone();
                let dir = root.clone();
                let packed = tokio::task::spawn_blocking(move || {
                    isolate::pack(&dir, uid, gid, &|p| {
                        exclude.iter().any(|e| e.as_bytes() == p.as_bytes())
                    })
                })
                .await??;
                let spec = settings.sandbox.volume_spec(project, packed.tar.path())?;
                let (_, sb) = open_spec(&settings.sandbox, spec).await?;
                (
                    sb,
                    Some(isolated::Isolation {
                        project: root,
                        manifest: Arc::new(packed.manifest),
                        settings: iso.clone(),
                    }),
                )
            }
        };
        let timeout = settings.sandbox.command_timeout_for(&sandbox.info().image);
        let baseline_error = baseline::snapshot(&sandbox, timeout.max(Duration::from_secs(60)))
            .await
            .err();
        let test_command = match &settings.test_cmd {
            Some(cmd) => Some(cmd.clone()),
            None => {
                let listing = Workspace::new(&sandbox).list(".", 5000).await?;
                crate::project::test_command(&listing.lines)
            }
        };
        let instructions = prompt::project_instructions(&sandbox).await?;
        let finish = settings.model.tool_choice == ToolChoice::Required;
        let tools = ToolRegistry::standard(settings.shell, finish);
        let system = prompt::system_prompt(
            test_command.as_deref(),
            finish,
            settings.shell,
            instructions.as_deref(),
        );
        let tool_settings = ToolSettings {
            command_timeout: timeout,
            test_command,
            protect_tests: settings.aids.protect_tests,
            ..Default::default()
        };
        events.emit(&Event::Started {
            session: sandbox.info().session.clone(),
            model: model.describe(),
            project: project.display().to_string(),
            image: sandbox.info().image.clone(),
            exec_mode: sandbox.info().exec_mode.to_string(),
            tools: tools.names().iter().map(|s| s.to_string()).collect(),
            test_command: tool_settings.test_command.clone(),
        });
        if instructions.is_some() {
            events.emit(&Event::Note {
                message: "the project's AGENTS.md is part of the system prompt".into(),
            });
        }
        for warning in crate::image::toolchain_warnings(&sandbox.info().image, project).await {
            events.emit(&Event::Note {
                message: format!("WARNING: {warning}"),
            });
        }
        Ok(Session {
            sandbox,
            model,
            tools,
            tool_settings,
            system,
            events,
            agent_config: AgentConfig {
                max_steps: settings.max_steps,
                tool_choice: settings.model.tool_choice,
                temperature: settings.model.temperature,
                max_tokens: settings.model.max_tokens,
                repeat_guard: settings.aids.no_repeat,
                resample_repeats: settings.aids.resample_repeats,
                resample_temperature: settings.aids.retry_temperature,
                verify_finish: settings.aids.verify_finish,
                ..Default::default()
            },
            aids: settings.aids.clone(),
            baseline_error,
            isolation,
            approver: settings.approve.then_some(TerminalApprover),
            cleanup: settings.sandbox.cleanup.clone(),
            started: Instant::now(),
        })
    }
}
