//! One agent session: a model client, a sandbox on the project, the tools, the event sinks.
//! Shared by `run`, `chat` and `demo`.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::agent::{Agent, AgentConfig, Fatal, LoopResult, Stop, baseline, detect, prime, prompt};
use crate::commands::{open_sandbox, open_spec};
use crate::config::AgentSettings;
use crate::config::IsolateSettings;
use crate::events::{Event, EventSink, Fanout, Printer, Redactor, TrajectoryWriter};
use crate::isolate::{self, Manifest};
use crate::model::{Message, ModelClient, ToolChoice, pricing};
use crate::report::{Outcome, Report, TestVerdict};
use crate::sandbox::{DockerSandbox, Sandbox};
use crate::tools::{Approval, Approver, ToolContext, ToolRegistry, ToolSettings, render_command};
use crate::workspace::Workspace;

/// Largest diff kept for the report.
const MAX_DIFF_BYTES: usize = 4 << 20;

/// `./agentbox-SESSION.patch`, unless the current directory is inside the project (which
/// `--isolate` promises not to write): then the system's temporary directory.
fn default_patch_path(project: &std::path::Path, session: &str) -> std::path::PathBuf {
    let name = format!("agentbox-{session}.patch");
    let cwd = std::env::current_dir().and_then(|d| d.canonicalize()).ok();
    match cwd {
        Some(d) if !d.starts_with(project) => d.join(name),
        _ => std::env::temp_dir().join(name),
    }
}

/// An `--isolate` session: what was copied in, to check the host against before `--apply`.
struct Isolation {
    project: std::path::PathBuf,
    manifest: Arc<Manifest>,
    settings: IsolateSettings,
}

pub struct Session {
    pub sandbox: DockerSandbox,
    pub model: Box<dyn ModelClient>,
    pub tools: ToolRegistry,
    pub tool_settings: ToolSettings,
    pub system: String,
    pub events: Arc<Fanout>,
    pub agent_config: AgentConfig,
    aids: crate::config::Aids,
    baseline_error: Option<String>,
    isolation: Option<Isolation>,
    approver: Option<TerminalApprover>,
    started: Instant,
}

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
                    Some(Isolation {
                        project: root,
                        manifest: Arc::new(packed.manifest),
                        settings: iso.clone(),
                    }),
                )
            }
        };
        let timeout = settings.sandbox.command_timeout;
        let baseline_error = baseline::snapshot(&sandbox, timeout.max(Duration::from_secs(60)))
            .await
            .err();
        let test_command = match &settings.test_cmd {
            Some(cmd) => Some(cmd.clone()),
            None => {
                let listing = Workspace::new(&sandbox).list(".", 5000).await?;
                detect::test_command(&listing.lines)
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
            started: Instant::now(),
        })
    }

    pub fn agent(&self) -> Agent<'_> {
        Agent {
            model: self.model.as_ref(),
            tools: &self.tools,
            ctx: ToolContext {
                sandbox: &self.sandbox,
                settings: &self.tool_settings,
                approver: self.approver.as_ref().map(|a| a as &dyn Approver),
            },
            events: self.events.as_ref(),
            config: self.agent_config.clone(),
            system: self.system.clone(),
        }
    }

    /// Work on `task` from a fresh conversation: primed if asked, and again from a reset
    /// project (hotter) while the tests fail and attempts are left. Returns the last attempt's
    /// stop, with steps and usage summed over all attempts, and how many attempts ran.
    pub async fn work(&self, task: &str) -> (LoopResult, u32) {
        let mut steps = 0;
        let mut usage = crate::model::Usage::default();
        let mut attempt = 1;
        loop {
            let mut agent = self.agent();
            if attempt > 1 {
                agent.config.temperature = Some(self.aids.retry_temperature);
            }
            let first = if self.aids.prime {
                prime::first_message(task, &agent.ctx).await
            } else {
                task.to_string()
            };
            let mut messages = vec![Message::user_text(first)];
            let result = agent.run(&mut messages).await;
            steps += result.steps;
            usage.add(&result.usage);
            let done = LoopResult {
                stop: result.stop.clone(),
                steps,
                usage,
            };
            if attempt >= self.aids.attempts
                || matches!(result.stop, Stop::Fatal(_))
                || self.tests_pass().await
            {
                return (done, attempt);
            }
            self.events.emit(&Event::Note {
                message: format!(
                    "attempt {attempt} left the tests failing: resetting the project and starting over"
                ),
            });
            if let Err(e) = baseline::reset(&self.sandbox, self.tool_settings.command_timeout).await {
                self.events.emit(&Event::Note {
                    message: format!("cannot start over: {e}"),
                });
                return (done, attempt);
            }
            attempt += 1;
        }
    }

    async fn tests_pass(&self) -> bool {
        let Some(cmd) = &self.tool_settings.test_command else {
            return true;
        };
        let ctx = ToolContext {
            sandbox: &self.sandbox,
            settings: &self.tool_settings,
            approver: None,
        };
        ctx.shell(cmd).await.is_ok_and(|o| o.success())
    }

    /// Run the tests ourselves: the model's word is not evidence.
    pub async fn verify(&self) -> TestVerdict {
        let Some(cmd) = self.tool_settings.test_command.clone() else {
            return TestVerdict {
                command: None,
                passed: None,
                exit_code: None,
                output_tail: String::new(),
            };
        };
        self.events.emit(&Event::Verifying { command: cmd.clone() });
        let ctx = ToolContext {
            sandbox: &self.sandbox,
            settings: &self.tool_settings,
            approver: None,
        };
        match ctx.shell(&cmd).await {
            Ok(out) => {
                let tail = out.stdout.shrink(0, 3000).to_text();
                self.events.emit(&Event::Note {
                    message: format!("tests: {}", out.status_line()),
                });
                TestVerdict {
                    command: Some(cmd),
                    passed: Some(out.success()),
                    exit_code: Some(out.exit_code),
                    output_tail: tail,
                }
            }
            Err(e) => TestVerdict {
                command: Some(cmd),
                passed: None,
                exit_code: None,
                output_tail: format!("the test command could not be run: {e}"),
            },
        }
    }

    /// The diff against the start of the session.
    pub async fn diff(&self) -> Result<String, String> {
        if let Some(e) = &self.baseline_error {
            return Err(e.clone());
        }
        baseline::diff(&self.sandbox, self.tool_settings.command_timeout, MAX_DIFF_BYTES).await
    }

    pub async fn report(&self, result: &LoopResult) -> Report {
        let (outcome, summary, error) = match &result.stop {
            Stop::Answered(text) => (Outcome::Finished, Some(text.clone()), None),
            Stop::StepLimit => (Outcome::StepLimit, None, None),
            Stop::Fatal(e) => (Outcome::Error, None, Some(e.to_string())),
        };
        // After a sandbox failure nothing more can run in it; after a model failure it is
        // still there, and the tests and the diff are still worth having.
        let sandbox_alive = !matches!(&result.stop, Stop::Fatal(Fatal::Sandbox(_)));
        let tests = if sandbox_alive {
            self.verify().await
        } else {
            TestVerdict {
                command: self.tool_settings.test_command.clone(),
                passed: None,
                exit_code: None,
                output_tail: String::new(),
            }
        };
        let (diff, diff_error) = if self.isolation.is_some() {
            // `finish_isolated` gives the host's own account instead.
            (None, None)
        } else if sandbox_alive {
            match self.diff().await {
                Ok(d) => (Some(d), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            (None, Some("the sandbox is gone".into()))
        };
        let changed_files = if diff.is_some() {
            baseline::changed_files(&self.sandbox, self.tool_settings.command_timeout)
                .await
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let exit_code = Report::exit_code_for(&outcome, &tests);
        let estimated = self.model.estimated_usage();
        Report {
            session: self.sandbox.info().session.clone(),
            model: self.model.describe(),
            outcome,
            summary,
            error,
            steps: result.steps,
            attempts: 1,
            usage: result.usage,
            usage_estimated: estimated,
            cost_usd: if estimated {
                None
            } else {
                pricing::estimate_cost(self.model.model(), &result.usage)
            },
            tests,
            changed_files,
            diff,
            diff_error,
            elapsed_secs: self.started.elapsed().as_secs_f64(),
            exit_code,
            warnings: Vec::new(),
            changed_outside_diff: None,
            patch_file: None,
            applied: None,
            apply_error: None,
        }
    }

    /// `--isolate`: what changed, computed on the host from the sandbox's files and what was
    /// copied in (see `isolate::readback`): listed, pruned of what is never brought back, then
    /// read from the archive API within a byte budget and a deadline.
    pub async fn changeset(&self) -> Result<isolate::ChangeSet, String> {
        use isolate::readback;
        let Some(iso) = &self.isolation else {
            return Err("not an isolated session".into());
        };
        let timeout = self.tool_settings.command_timeout.max(Duration::from_secs(60));
        let listed = self
            .sandbox
            .exec(
                crate::sandbox::ExecRequest::argv(readback::listing_command(), timeout)
                    .capture(readback::MAX_LISTING_BYTES, 0),
            )
            .await
            .map_err(|e| e.to_string())?;
        // A partial listing (an unreadable directory) still helps; a cut one does not.
        let listing = (!listed.timed_out)
            .then(|| listed.stdout.bytes())
            .flatten()
            .map(|out| readback::parse_listing(&out));
        let manifest = iso.manifest.clone();
        let plan = readback::plan(&manifest, listing.as_ref(), readback::Limits::default());
        if !plan.prune.is_empty() {
            let prune = crate::sandbox::ExecRequest::argv(readback::prune_command(), timeout)
                .stdin(plan.prune_input())
                .capture(4096, 4096);
            // What is not removed is read and left out as it comes: only slower.
            if let Ok(out) = self.sandbox.exec(prune).await
                && !out.success()
            {
                tracing::debug!(status = %out.status_line(), "pruning before the read-back failed");
            }
        }
        let reader = self
            .sandbox
            .archive_reader(crate::sandbox::WORKSPACE)
            .await
            .map_err(|e| e.to_string())?;
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = readback::Deadline::new(
            reader,
            Duration::from_secs(readback::MAX_READBACK_SECS),
            fired.clone(),
        );
        let bridge = tokio_util::io::SyncIoBridge::new(reader);
        tokio::task::spawn_blocking(move || readback::changeset_from_archive(bridge, &manifest, plan, &fired))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// `--isolate`: the changes, the patch (from the manifest and the host's originals), and
    /// with `--apply` the changes in the project. The report's diff and file list become the
    /// host's account, including what was not brought back and why.
    /// `Err` when what changed cannot be told (then nothing is written or applied).
    pub async fn finish_isolated(&self, report: &mut Report) -> Result<(), String> {
        let Some(iso) = &self.isolation else { return Ok(()) };
        let set = match self.changeset().await {
            Ok(c) => c,
            Err(e) => {
                report.warnings.push(format!("cannot tell what changed: {e}"));
                if iso.settings.apply {
                    report.apply_error = Some(e.clone());
                    report.exit_code = crate::report::exit::ERROR;
                }
                return Err(e);
            }
        };
        self.events.emit(&Event::Note {
            message: format!(
                "read back {} bytes from the sandbox ({} entries); {} changed, {} not brought back",
                set.bytes_read,
                set.entries,
                set.changes.len(),
                set.skipped.len()
            ),
        });
        if let Some(message) = isolate::readback::caches_note(&set.skipped) {
            self.events.emit(&Event::Note { message });
        }
        report.warnings.extend(isolate::readback::warnings(
            &set.skipped,
            isolate::readback::Limits::default(),
        ));
        let patch_path = iso.settings.write_patch.then(|| {
            iso.settings
                .patch
                .clone()
                .unwrap_or_else(|| default_patch_path(&iso.project, &report.session))
        });
        let (project, manifest) = (iso.project.clone(), iso.manifest.clone());
        let target = patch_path.clone();
        // Written section by section to the file; the report keeps only its start.
        let (set, written) = tokio::task::spawn_blocking(move || {
            let write = |out: &mut dyn Write| -> std::io::Result<isolate::patch::Written> {
                let w = isolate::patch::write_patch(out, &project, &manifest, &set.changes, MAX_DIFF_BYTES)?;
                out.flush()?;
                Ok(w)
            };
            let written = match &target {
                Some(path) => {
                    std::fs::File::create(path).and_then(|f| write(&mut std::io::BufWriter::new(f)))
                }
                None => write(&mut std::io::sink()),
            };
            (set, written)
        })
        .await
        .map_err(|e| e.to_string())?;
        let counts = match written {
            Ok(w) => {
                report.diff = Some(w.report);
                report.patch_file = patch_path.map(|p| p.display().to_string());
                w.counts
            }
            Err(e) => {
                report.warnings.push(format!(
                    "cannot write the patch {}: {e}",
                    patch_path.map(|p| p.display().to_string()).unwrap_or_default()
                ));
                Vec::new()
            }
        };
        report.diff_error = None;
        report.changed_files = set
            .changes
            .iter()
            .enumerate()
            .map(|(i, (c, _))| {
                let counts = counts.get(i).copied().flatten();
                crate::report::ChangedFile {
                    path: c.path.quoted(),
                    added: counts.map(|c| c.0),
                    removed: counts.map(|c| c.1),
                }
            })
            // Project files the patch lacks are changes all the same (an eval must see a
            // test file among them); caches and `.git` are listed apart, as "not in the diff".
            .chain(
                set.skipped
                    .iter()
                    .filter(|s| !s.is_cache())
                    .map(|s| crate::report::ChangedFile {
                        path: s.shown(),
                        added: None,
                        removed: None,
                    }),
            )
            .collect();
        let caches: Vec<String> = set
            .skipped
            .iter()
            .filter(|s| s.is_cache())
            .map(|s| s.shown())
            .collect();
        report.changed_outside_diff = Some(crate::report::OutsideDiff {
            total: caches.len(),
            paths: caches
                .into_iter()
                .take(crate::sandbox::hostscan::MAX_LISTED_CHANGES)
                .collect(),
            incomplete: false,
        });
        if iso.settings.apply {
            let missing: Vec<String> = set.missing().iter().map(|s| s.shown()).collect();
            let applied = if !missing.is_empty() {
                Err(format!(
                    "nothing applied: {} could not be brought back from the sandbox (see the warnings)",
                    missing.join(", ")
                ))
            } else {
                let (project, manifest) = (iso.project.clone(), iso.manifest.clone());
                tokio::task::spawn_blocking(move || isolate::apply(&project, &manifest, &set.changes))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            };
            match applied {
                Ok(a) => report.applied = Some(a.written.into_iter().chain(a.deleted).collect()),
                Err(e) => {
                    report.apply_error = Some(e);
                    report.exit_code = crate::report::exit::ERROR;
                }
            }
        }
        Ok(())
    }

    /// Remove the sandbox, then check the project on the host (bind-mounted runs: planted git
    /// metadata moved out, every change listed). The check comes after the removal so that
    /// nothing of the sandbox can write while the host looks.
    pub async fn close(self) -> Option<crate::sandbox::hostscan::HostCheck> {
        let _ = self.sandbox.shutdown().await;
        self.sandbox.check_host()
    }
}

/// Prints what is about to happen and reads y/n from stdin.
pub struct TerminalApprover;

#[async_trait]
impl Approver for TerminalApprover {
    async fn approve(&self, request: &Approval) -> bool {
        // What is shown for approval must be exactly what will happen: no escape sequence in
        // the diff or the command may hide or rewrite any of it.
        let prompt = crate::events::for_terminal(&match request {
            Approval::Edit { path, diff } => format!("\nagentbox: the model wants to edit {path}:\n{diff}"),
            Approval::Command { command } => format!("\nagentbox: the model wants to run:\n  $ {command}\n"),
        });
        tokio::task::spawn_blocking(move || {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{prompt}allow? [y/N] ");
            let _ = err.flush();
            let mut line = String::new();
            if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
                return false;
            }
            matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
        })
        .await
        .unwrap_or(false)
    }
}

/// `render_command` for the chat's `/tests`.
pub async fn run_tests_now(session: &Session) -> String {
    match &session.tool_settings.test_command {
        None => "no test command is known (pass --test-cmd)".into(),
        Some(cmd) => {
            let ctx = ToolContext {
                sandbox: &session.sandbox,
                settings: &session.tool_settings,
                approver: None,
            };
            match ctx.shell(cmd).await {
                Ok(out) => render_command(cmd, &out),
                Err(e) => format!("cannot run the tests: {e}"),
            }
        }
    }
}
