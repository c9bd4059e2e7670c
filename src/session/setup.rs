//! Opening a session: the model client, what the project is (its image and test commands,
//! detected on the host), the preflight checks (see `preflight`), the sandbox (bind-mounted or
//! isolated), the baseline for the diff, the system prompt and the tools.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Session, SessionError, TerminalApprover, baseline, isolated, preflight, prompt};
use crate::agent::AgentConfig;
use crate::config::{AgentSettings, SandboxConfig};
use crate::events::{Event, EventSink, Fanout, Printer, Redactor, TrajectoryWriter};
use crate::model::ToolChoice;
use crate::project::{Detection, ImageChoice, TestCommand};
use crate::sandbox::image::{DEFAULT_IMAGE, KnownImage, image_exists};
use crate::sandbox::{DockerSandbox, Sandbox, connect_docker};
use crate::tools::{ToolRegistry, ToolSettings};

/// The progress printer, plus the trajectory file when asked for.
pub fn event_sinks(settings: &AgentSettings) -> Result<Arc<Fanout>, SessionError> {
    sinks_with(settings, Printer::new)
}

/// [`event_sinks`] for `chat`, which prints the model's replies itself.
pub fn conversation_event_sinks(settings: &AgentSettings) -> Result<Arc<Fanout>, SessionError> {
    sinks_with(settings, Printer::for_conversation)
}

fn sinks_with(
    settings: &AgentSettings,
    printer: fn(Redactor) -> Printer,
) -> Result<Arc<Fanout>, SessionError> {
    let redactor = Redactor::new(settings.model.secrets());
    let mut sinks: Vec<Box<dyn EventSink>> = vec![Box::new(printer(redactor.clone()))];
    if let Some(path) = &settings.trajectory {
        let writer = TrajectoryWriter::create(path, redactor).map_err(|source| SessionError::Io {
            what: "write the trajectory",
            path: path.display().to_string(),
            source,
        })?;
        sinks.push(Box::new(writer));
    }
    Ok(Arc::new(Fanout(sinks)))
}

/// What a session knows about its project before any sandbox exists: the image it runs and
/// the test commands, each with the reason.
#[derive(Debug, Clone)]
pub struct ProjectPlan {
    pub image: ImageChoice,
    pub tests: Vec<TestCommand>,
    /// The commands were given (`--test-cmd`, a task's `test_cmd`), not detected.
    pub tests_given: bool,
    /// What detection left out, and why.
    pub notes: Vec<String>,
}

/// The image for `project`: the one given, else its dev container's image when present
/// locally, else by its ecosystems (see `project::choose_image`).
pub async fn choose_image(cfg: &SandboxConfig, project: &Path, detection: &Detection) -> ImageChoice {
    let given = cfg.image_source.as_deref().map(|src| (cfg.image.as_str(), src));
    let root = project.to_path_buf();
    let dev = if given.is_none() {
        tokio::task::spawn_blocking(move || crate::project::devcontainer(&root))
            .await
            .ok()
            .flatten()
    } else {
        None
    };
    // Whether the image is here decides; if Docker cannot say, it is not (the sandbox's own
    // start says what is wrong with Docker).
    let present = match dev.as_ref().and_then(|d| d.image.as_deref()) {
        Some(image) => match connect_docker().await {
            Ok(docker) => image_exists(&docker, image).await.unwrap_or(false),
            Err(_) => false,
        },
        None => false,
    };
    crate::project::choose_image(
        given,
        detection,
        dev.as_ref(),
        present,
        sandbox_tag,
        DEFAULT_IMAGE,
    )
}

/// The tag of agentbox's sandbox image called `name` (what detection names: `rust`,
/// `polyglot`). Never a service image's: a database image has no shell tools to run a project
/// in.
fn sandbox_tag(name: &str) -> Option<String> {
    KnownImage::sandbox_named(name).map(|k| k.tag.to_string())
}

/// Detect, on the host, what `project` is; choose its image and test commands.
pub async fn plan_project(settings: &AgentSettings, project: &Path) -> Result<ProjectPlan, SessionError> {
    let root = project.to_path_buf();
    let detection = tokio::task::spawn_blocking(move || crate::project::detect(&root)).await?;
    let image = choose_image(&settings.sandbox, project, &detection).await;
    let tests_given = !settings.test_cmd.is_empty();
    let tests = if tests_given {
        settings
            .test_cmd
            .iter()
            .map(|c| TestCommand {
                command: c.clone(),
                based_on: Vec::new(),
            })
            .collect()
    } else {
        detection.commands.clone()
    };
    Ok(ProjectPlan {
        image,
        tests,
        tests_given,
        notes: if tests_given { Vec::new() } else { detection.notes },
    })
}

impl Session {
    pub async fn open(
        settings: &AgentSettings,
        project: &Path,
        events: Arc<Fanout>,
    ) -> Result<Session, SessionError> {
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
        // An environment's conversation so far, read before any container starts.
        let history = match settings.isolate.as_ref().and_then(|i| i.env.as_ref()) {
            Some(name) => crate::envs::load_conversation(&crate::envs::envs_dir()?, name)?,
            None => Vec::new(),
        };
        let plan = plan_project(settings, project).await?;
        events.emit(&Event::ImageChosen {
            image: plan.image.image.clone(),
            reason: plan.image.reason.clone(),
        });
        for message in plan.image.notes.iter().chain(&plan.notes) {
            events.emit(&Event::Note {
                message: message.clone(),
            });
        }
        let mut warnings = Vec::new();
        if let Ok(dir) = crate::sandbox::inspect_project(project)
            && dir.uid == 0
        {
            let w = format!(
                "{} is owned by root: the sandbox's commands run as uid 0 (without capabilities); chown \
                 the project to an ordinary user so they run as that user",
                project.display()
            );
            events.emit(&Event::Note {
                message: format!("WARNING: {w}"),
            });
            warnings.push(w);
        }
        preflight::model_endpoint(&settings.model, events.as_ref()).await?;
        let mut sandbox_cfg = settings.sandbox.clone();
        sandbox_cfg.image = plan.image.image.clone();
        let egress = super::setup_phase::EgressLog::default();
        let scope = super::setup_phase::Scope {
            setup: &settings.setup,
            isolate: settings.isolate.as_ref(),
            say_why_nothing: true,
        };
        let setup = super::setup_phase::run(scope, &sandbox_cfg, project, &events, &egress).await?;
        sandbox_cfg.extras = setup.agent_extras;
        warnings.extend(setup.notes.iter().cloned());
        sandbox_cfg
            .extras
            .forwards
            .extend(settings.published.iter().cloned());
        let opened = open_session_sandbox(settings, &sandbox_cfg, project).await;
        preflight::report(
            events.as_ref(),
            preflight::Step::Sandbox,
            preflight::Outcome::of(&opened, |(sb, _)| sb.info().session.clone()),
        );
        let (sandbox, isolation) = opened?;
        if isolation.as_ref().is_some_and(|i| i.from_pool) {
            events.emit(&Event::Note {
                message: format!(
                    "sandbox: from the warm pool (container {}), the project copied in",
                    sandbox.info().container_id
                ),
            });
        }
        for w in &sandbox.info().warnings {
            events.emit(&Event::Note {
                message: format!("WARNING: {w}"),
            });
            warnings.push(w.clone());
        }
        if let Err(e) = preflight::test_programs(
            &sandbox,
            project,
            &plan.tests,
            plan.tests_given,
            &plan.image.image,
            events.as_ref(),
        )
        .await
        {
            let _ = sandbox.shutdown().await;
            return Err(match e {
                Ok(usage) => usage.into(),
                Err(sandbox_error) => sandbox_error.into(),
            });
        }
        let timeout = settings.sandbox.command_timeout_for(&sandbox.info().image);
        let baseline_error = baseline::snapshot(&sandbox, timeout.max(Duration::from_secs(60)))
            .await
            .err()
            .map(std::sync::Arc::new);
        let test_commands: Vec<String> = plan.tests.iter().map(|t| t.command.clone()).collect();
        let instructions = prompt::project_instructions(&sandbox).await?;
        let finish = settings.model.tool_choice == ToolChoice::Required;
        let tools = ToolRegistry::standard(settings.shell, finish).with_edit_format(settings.edit_format);
        let system = prompt::system_prompt(&test_commands, finish, settings.shell, instructions.as_deref());
        let tool_settings = ToolSettings {
            command_timeout: timeout,
            test_commands,
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
            test_commands: tool_settings.test_commands.clone(),
        });
        if instructions.is_some() {
            events.emit(&Event::Note {
                message: "the project's AGENTS.md is part of the system prompt".into(),
            });
        }
        for warning in crate::toolchain::toolchain_warnings(&sandbox.info().image, project).await {
            events.emit(&Event::Note {
                message: format!("WARNING: {warning}"),
            });
        }
        for hint in crate::project::services::service_hints(project, &settings.sandbox.services) {
            events.emit(&Event::Note {
                message: format!("hint: {hint}"),
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
            approver: settings.approve.then(TerminalApprover::default),
            cleanup: settings.sandbox.cleanup.clone(),
            started: Instant::now(),
            plan,
            warnings,
            egress,
            _agent_proxy: setup.proxy,
            _agent_ca: setup.ca_bundle,
            before: std::sync::OnceLock::new(),
            history,
            conversation: std::sync::Mutex::new(None),
        })
    }
}

/// The session's sandbox: the project bind-mounted, or copied into a volume (`--isolate`).
async fn open_session_sandbox(
    settings: &AgentSettings,
    cfg: &SandboxConfig,
    project: &Path,
) -> Result<(DockerSandbox, Option<isolated::Isolation>), SessionError> {
    Ok(match &settings.isolate {
        None => (super::open::open_sandbox(cfg, project).await?.1, None),
        Some(iso) => {
            let (sb, isolation) = isolated::open_isolated(cfg, project, iso).await?;
            (sb, Some(isolation))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::{Ecosystem, POLYGLOT};

    #[test]
    fn a_project_is_only_ever_given_a_sandbox_image() {
        let names =
            [Ecosystem::Rust, Ecosystem::Go, Ecosystem::Node, Ecosystem::Python].map(Ecosystem::image_name);
        for name in names.into_iter().chain([POLYGLOT]) {
            let tag = sandbox_tag(name).unwrap_or_else(|| panic!("no sandbox image {name}"));
            assert!(KnownImage::by_tag(&tag).unwrap().is_sandbox(), "{tag}");
        }
        // Were detection ever to name a service, the project would get the default instead.
        for service in KnownImage::services() {
            assert_eq!(sandbox_tag(service.name), None, "{}", service.name);
            assert_eq!(sandbox_tag(service.tag), None, "{}", service.tag);
        }
        assert!(KnownImage::services().count() >= 3);
    }
}
