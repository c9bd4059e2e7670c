//! One agent session: a model client, a sandbox on the project, the tools, the event sinks.
//! Shared by `run`, `chat` and `demo`.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

pub mod baseline;
pub mod before;
mod cache_lock;
mod error;
mod isolated;
mod open;
pub mod preflight;
pub mod prime;
pub mod prompt;
mod setup;
pub mod setup_phase;
pub mod trust;

pub use error::SessionError;
pub use isolated::{IsolatedCopy, PatchWritten};
pub(crate) use open::open_one_shot;
pub use open::{ensure_service_images, open_sandbox, open_spec};
pub use setup::{ProjectPlan, choose_image, conversation_event_sinks, event_sinks, plan_project};

use crate::agent::{Agent, AgentConfig, Fatal, LoopResult, Stop};
use crate::events::{Event, EventSink, Fanout};
use crate::model::{Message, ModelClient, pricing};
use crate::project::results;
use crate::report::{CommandVerdict, Outcome, Report, TestVerdict};
use crate::sandbox::{DockerSandbox, Sandbox};
use crate::tools::{
    Approval, Approver, Decision, ToolContext, ToolRegistry, ToolSettings, all_passed, render_test_runs,
};

/// Largest diff kept for the report.
const MAX_DIFF_BYTES: usize = 4 << 20;

pub struct Session {
    pub sandbox: DockerSandbox,
    pub model: Box<dyn ModelClient>,
    pub tools: ToolRegistry,
    pub tool_settings: ToolSettings,
    pub system: String,
    pub events: Arc<Fanout>,
    pub agent_config: AgentConfig,
    aids: crate::config::Aids,
    baseline_error: Option<std::sync::Arc<baseline::BaselineError>>,
    isolation: Option<isolated::Isolation>,
    approver: Option<TerminalApprover>,
    /// The run's cleanup owner: `--apply` runs inside its critical section.
    cleanup: crate::sandbox::Cleanup,
    started: Instant,
    /// The image and test commands, and why (for the report).
    plan: ProjectPlan,
    /// Known before the run, for the report (a root-owned project).
    warnings: Vec<String>,
    /// Every egress decision of the session (setup and, if allowed, agent phase).
    egress: setup_phase::EgressLog,
    /// The egress proxy of the agent phase (`--agent-network allowlist`); stops when dropped.
    _agent_proxy: Option<crate::egress::Proxy>,
    /// The CA bundle its sandbox mounts (`--agent-network allowlist`); removed when dropped.
    _agent_ca: Option<trust::Bundle>,
    /// The tests before the model's first turn (`before`).
    before: std::sync::OnceLock<Vec<crate::tools::TestRun>>,
    /// An environment's conversation before this run (`--env`): each attempt continues it.
    history: Vec<Message>,
    /// The last loop attempt's messages, history included (what an environment keeps).
    conversation: std::sync::Mutex<Option<Vec<Message>>>,
}

impl Session {
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
            watch: None,
        }
    }

    /// Count the session's time from now, plus `already` spent preparing it: a session
    /// prepared ahead (eval) does not count the time it waited for its turn.
    pub fn restart_clock(&mut self, already: std::time::Duration) {
        self.started = Instant::now().checked_sub(already).unwrap_or_else(Instant::now);
    }

    /// Work on `task`: see [`work`].
    pub async fn work(&self, task: &str) -> (LoopResult, u32) {
        let (result, attempts, messages) =
            work(&self.agent(), &self.aids, &self.history, task, self.before_runs()).await;
        self.keep_conversation(messages);
        (result, attempts)
    }

    fn keep_conversation(&self, messages: Vec<Message>) {
        if let Ok(mut kept) = self.conversation.lock() {
            *kept = Some(messages);
        }
    }

    /// The conversation to keep for the next turn of an environment: the last attempt's, else
    /// (no loop ran: repair, or an error before the first turn) the history and the task.
    /// The conversation kept by a resumed environment (`--env`), empty otherwise.
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    pub fn conversation(&self, task: &str) -> Vec<Message> {
        let kept = self.conversation.lock().ok().and_then(|mut k| k.take());
        kept.unwrap_or_else(|| {
            let mut messages = self.history.clone();
            messages.push(Message::user_text(task.to_string()));
            messages
        })
    }

    /// [`Session::work`] on a project that changed since the tests ran before the first turn
    /// (`auto`'s loop after repair kept a candidate): `--prime` runs them again.
    pub async fn work_changed(&self, task: &str) -> (LoopResult, u32) {
        let (result, attempts, messages) = work(&self.agent(), &self.aids, &self.history, task, None).await;
        self.keep_conversation(messages);
        (result, attempts)
    }

    /// The verdict before any test ran: every command, none run yet.
    fn unrun_verdict(&self) -> TestVerdict {
        TestVerdict {
            passed: None,
            commands: self
                .plan
                .tests
                .iter()
                .map(|t| CommandVerdict {
                    command: t.command.clone(),
                    based_on: t.based_on.clone(),
                    ..Default::default()
                })
                .collect(),
            given: self.plan.tests_given,
            notes: self.plan.notes.clone(),
        }
    }

    /// Run the tests ourselves, every command to its end: the model's word is not evidence.
    pub async fn verify(&self) -> TestVerdict {
        let mut verdict = self.unrun_verdict();
        let ctx = ToolContext {
            sandbox: &self.sandbox,
            settings: &self.tool_settings,
            approver: None,
        };
        // From the state a session starts in, with only the project as the agent left it (see
        // `fresh_scratch`); a verdict that cannot have that is none.
        let mut broken = if verdict.commands.is_empty() {
            None
        } else {
            self.sandbox
                .fresh_scratch()
                .await
                .err()
                .map(|e| format!("the sandbox could not be reset for the test run: {e}"))
        };
        for c in &mut verdict.commands {
            let ran_before = self
                .before_runs()
                .and_then(|runs| runs.iter().find(|r| r.command == c.command));
            c.before = ran_before.map(|r| crate::report::RunBefore {
                passed: r.output.success(),
                exit_code: r.output.exit_code,
                counts: results::of_run(&r.command, &r.output),
            });
            if let Some(e) = &broken {
                c.output_tail = format!("not run: {e}");
                continue;
            }
            self.events.emit(&Event::Verifying {
                command: c.command.clone(),
            });
            let mut req = ctx.shell_request(
                &c.command,
                self.tool_settings.output_head,
                self.tool_settings.output_tail,
            );
            // Go reuses a cached test result for an unchanged package: agentbox's own run
            // never does (a command's own `-count` still wins).
            req.env.push(("GOFLAGS".into(), "-count=1".into()));
            match self.sandbox.exec(req).await {
                Ok(out) => {
                    let counts = results::of_run(&c.command, &out);
                    let was = c.before.as_ref().and_then(|b| b.counts.as_ref());
                    c.refused = if out.success() {
                        results::no_tests_ran(was, counts.as_ref())
                    } else {
                        None
                    };
                    self.events.emit(&Event::Note {
                        message: format!(
                            "tests: `{}`: {}{}{}",
                            c.command,
                            out.status_line(),
                            counts.map(|n| format!(" ({n})")).unwrap_or_default(),
                            c.refused
                                .as_ref()
                                .map(|w| format!(": no PASS, {w}"))
                                .unwrap_or_default()
                        ),
                    });
                    c.passed = Some(out.success() && c.refused.is_none());
                    c.exit_code = Some(out.exit_code);
                    c.counts = counts;
                    c.output_tail = out.stdout.shrink(0, 3000).to_text();
                }
                Err(e) => {
                    c.output_tail = format!("the test command could not be run: {e}");
                    broken = Some(e.to_string());
                }
            }
        }
        verdict.passed = if verdict.commands.is_empty() {
            None
        } else if verdict.commands.iter().any(|c| c.passed == Some(false)) {
            Some(false)
        } else if verdict.commands.iter().all(|c| c.passed == Some(true)) {
            Some(true)
        } else {
            None
        };
        verdict
    }

    /// The diff against the start of the session.
    pub async fn diff(&self) -> Result<String, SessionError> {
        if let Some(e) = &self.baseline_error {
            return Err(SessionError::NoBaseline(e.clone()));
        }
        Ok(baseline::diff(&self.sandbox, self.tool_settings.command_timeout, MAX_DIFF_BYTES).await?)
    }

    pub async fn report(&self, result: &LoopResult) -> Report {
        let (outcome, summary, error) = match &result.stop {
            Stop::Answered(text) | Stop::Repaired(text) => (Outcome::Finished, Some(text.clone()), None),
            Stop::StepLimit => (Outcome::StepLimit, None, None),
            Stop::Repeating => (Outcome::Repeating, None, None),
            Stop::Fatal(e) => (Outcome::Error, None, Some(e.to_string())),
        };
        // After a sandbox failure nothing more can run in it; after a model failure it is
        // still there, and the tests and the diff are still worth having.
        let sandbox_alive = !matches!(&result.stop, Stop::Fatal(Fatal::Sandbox(_)));
        if sandbox_alive {
            // The verdict is agentbox's own test run: nothing the model left running may take
            // part in it (a server holding a port, a watcher rewriting files).
            self.stop_processes("before the final test run").await;
        }
        let tests = if sandbox_alive {
            self.verify().await
        } else {
            self.unrun_verdict()
        };
        let (diff, diff_error) = if self.isolation.is_some() {
            // `finish_isolated` gives the host's own account instead.
            (None, None)
        } else if sandbox_alive {
            match self.diff().await {
                Ok(d) => (Some(d), None),
                Err(e) => (None, Some(e.to_string())),
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
            summary_by_agentbox: matches!(result.stop, Stop::Repaired(_)),
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
            image: self.plan.image.image.clone(),
            image_reason: self.plan.image.reason.clone(),
            tests,
            changed_files,
            diff,
            diff_error,
            elapsed_secs: self.started.elapsed().as_secs_f64(),
            exit_code,
            warnings: self.warnings.clone(),
            egress: self
                .egress
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(phase, d)| crate::report::EgressRecord {
                    phase: phase.clone(),
                    decision: d.clone(),
                })
                .collect(),
            processes: self.sandbox.process_log().iter().map(Into::into).collect(),
            changed_outside_diff: None,
            patch_file: None,
            applied: None,
            apply_error: None,
            strategy: None,
            candidates: Vec::new(),
        }
    }

    /// Stop the background processes still running, each told as a note (the report lists
    /// them all).
    pub async fn stop_processes(&self, why: &str) {
        match self.sandbox.stop_processes(None, why).await {
            Ok(Ok(stopped)) => {
                for p in stopped.iter().filter(|p| p.stopped.as_deref() == Some(why)) {
                    self.events.emit(&Event::Note {
                        message: format!("background process {} `{}` stopped {why}", p.id, p.label(100)),
                    });
                }
            }
            Ok(Err(e)) => self.events.emit(&Event::Note {
                message: format!("cannot stop the background processes: {e}"),
            }),
            // The sandbox is gone: so is everything that ran in it.
            Err(_) => {}
        }
    }

    /// Remove the sandbox, then check the project on the host (bind-mounted runs: planted git
    /// metadata moved out, every change listed). The check comes after the removal so that
    /// nothing of the sandbox can write while the host looks.
    pub async fn close(self) -> Option<crate::hostfs::hostscan::HostCheck> {
        self.stop_processes("at the end of the session").await;
        let _ = self.sandbox.shutdown().await;
        self.sandbox.check_host()
    }
}

/// Checkpoints of the project the loop keeps (`baseline::checkpoint`): where it started (for
/// `auto`, with repair's best candidate in it) and the best state seen since.
const LOOP_START: &str = "loop-start";
const LOOP_BEST: &str = "loop-best";

/// The best state the loop's attempts reached: the fewest failing tests seen in any test run
/// (a run that does not even collect counts as every test failing), kept as a checkpoint.
struct Best<'a> {
    sandbox: &'a dyn crate::sandbox::Sandbox,
    timeout: std::time::Duration,
    seen: tokio::sync::Mutex<Option<crate::tools::tally::Tally>>,
}

impl Best<'_> {
    /// Whether `now` has fewer failing tests than the best so far (and if so, it is the best).
    async fn offer(&self, now: Option<crate::tools::tally::Tally>) -> bool {
        let Some(now) = now else { return false };
        let mut seen = self.seen.lock().await;
        let better = match &*seen {
            None => true,
            Some(best) => now.failing_score() < best.failing_score(),
        };
        if better
            && baseline::checkpoint(self.sandbox, self.timeout, LOOP_BEST)
                .await
                .is_ok()
        {
            *seen = Some(now);
            return true;
        }
        false
    }
}

#[async_trait]
impl crate::agent::TestWatch for Best<'_> {
    async fn tests_ran(&self, tally: Option<crate::tools::tally::Tally>) {
        self.offer(tally).await;
    }
}

/// Whether the task asks for code to go (so that `write_file` may drop definitions).
fn asks_for_removal(task: &str) -> bool {
    let t = task.to_lowercase();
    [
        "remove", "delete", "drop ", "rename", "move ", "split", "merge", "rewrite", "replace", "refactor",
    ]
    .iter()
    .any(|w| t.contains(w))
}

/// Work on `task` from a fresh conversation: primed if asked, and again from the state it
/// started from (hotter) while the tests fail and attempts are left. When the tests still fail
/// at the end, the project is left at the best state any attempt reached, not the last. Returns
/// the last attempt's stop, with steps and usage summed over all attempts, and how many
/// attempts ran. `before`: the tests as they ran before the first turn, for `--prime` to show
/// (`None` when the project changed since).
pub async fn work(
    base: &Agent<'_>,
    aids: &crate::config::Aids,
    history: &[Message],
    task: &str,
    before: Option<&[crate::tools::TestRun]>,
) -> (LoopResult, u32, Vec<Message>) {
    let mut steps = 0;
    let mut usage = crate::model::Usage::default();
    let mut attempt = 1;
    let mut tool_settings = base.ctx.settings.clone();
    tool_settings.removal_asked = asks_for_removal(task);
    let timeout = tool_settings.command_timeout;
    let best = Best {
        sandbox: base.ctx.sandbox,
        timeout,
        seen: tokio::sync::Mutex::new(None),
    };
    // Where each attempt starts; without it, the session's baseline.
    let start = baseline::checkpoint(base.ctx.sandbox, timeout, LOOP_START)
        .await
        .is_ok();
    if !tool_settings.test_commands.is_empty() {
        let ctx = ToolContext {
            settings: &tool_settings,
            ..base.ctx
        };
        // The tests before the first turn, when they are the project's state now.
        let now = match before {
            Some(runs) => crate::tools::tally::tally_runs(runs),
            None => ctx
                .run_tests()
                .await
                .ok()
                .and_then(|r| crate::tools::tally::tally_runs(&r)),
        };
        best.offer(now).await;
    }
    loop {
        let mut agent = base.clone();
        agent.ctx.settings = &tool_settings;
        agent.watch = Some(&best);
        if attempt > 1 {
            agent.config.temperature = Some(aids.retry_temperature);
        }
        let first = if aids.prime {
            prime::first_message(task, &agent.ctx, before).await
        } else {
            task.to_string()
        };
        let mut messages = history.to_vec();
        messages.push(Message::user_text(first));
        let result = agent.run(&mut messages).await;
        steps += result.steps;
        usage.add(&result.usage);
        let done = LoopResult {
            stop: result.stop.clone(),
            steps,
            usage,
        };
        if matches!(result.stop, Stop::Fatal(Fatal::Sandbox(_))) {
            return (done, attempt, messages);
        }
        let end = agent.ctx.run_tests().await.ok();
        if end.as_ref().is_some_and(|runs| all_passed(runs)) || agent.ctx.settings.test_commands.is_empty() {
            return (done, attempt, messages);
        }
        let end_tally = end.as_ref().and_then(|r| crate::tools::tally::tally_runs(r));
        let improved = best.offer(end_tally.clone()).await;
        if attempt >= aids.attempts || matches!(result.stop, Stop::Fatal(_)) {
            if !improved {
                keep_best(&agent, &best, end_tally.as_ref()).await;
            }
            return (done, attempt, messages);
        }
        agent.events.emit(&Event::Note {
            message: format!(
                "attempt {attempt} left the tests failing: resetting the project and starting over"
            ),
        });
        let reset = if start {
            baseline::restore(agent.ctx.sandbox, timeout, LOOP_START).await
        } else {
            baseline::reset(agent.ctx.sandbox, timeout).await
        };
        if let Err(e) = reset {
            agent.events.emit(&Event::Note {
                message: format!("cannot start over: {e}"),
            });
            return (done, attempt, messages);
        }
        attempt += 1;
    }
}

/// The attempts are over with the tests failing (`end`, counted): unless the end is as good as
/// the best state seen (no more failing, none failing that passed there), put the project back
/// to that state. A tie on the count is not enough: an end that fixed one test and broke
/// another that passed would otherwise be kept over the state it broke.
async fn keep_best(agent: &Agent<'_>, best: &Best<'_>, end: Option<&crate::tools::tally::Tally>) {
    let seen = best.seen.lock().await;
    let Some(kept) = seen.as_ref() else { return };
    let worse = end.is_none_or(|e| !e.as_good_as(kept));
    if !worse {
        return;
    }
    let message =
        match baseline::restore(agent.ctx.sandbox, agent.ctx.settings.command_timeout, LOOP_BEST).await {
            Ok(()) => format!(
                "the attempt ended with {}; the project is left at the best state it reached ({})",
                end.map_or_else(|| "tests that could not be counted".to_string(), |e| e.describe()),
                kept.describe()
            ),
            Err(e) => format!("cannot go back to the best state the attempt reached: {e}"),
        };
    agent.events.emit(&Event::Note { message });
}

/// Prints what is about to happen and asks: yes, no, always (for this session, for this kind
/// of action), or no with a reason the model is told.
#[derive(Default)]
pub struct TerminalApprover {
    always: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
}

#[async_trait]
impl Approver for TerminalApprover {
    async fn approve(&self, request: &Approval) -> bool {
        self.decide(request).await == Decision::Allow
    }

    async fn decide(&self, request: &Approval) -> Decision {
        let kind = request.kind();
        if self
            .always
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(kind)
        {
            return Decision::Allow;
        }
        // What is shown for approval must be exactly what will happen: no escape sequence in
        // the diff or the command may hide or rewrite any of it.
        let prompt = crate::events::for_terminal(&match request {
            Approval::Edit { path, diff } => format!("\nagentbox: the model wants to edit {path}:\n{diff}"),
            Approval::Command { command } => format!("\nagentbox: the model wants to run:\n  $ {command}\n"),
        });
        // Dropped with this future (the chat's Ctrl-C): the reading thread stops, instead of
        // taking the next line typed at the chat's prompt.
        let stop = StopOnDrop::default();
        let flag = stop.0.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let mut err = crate::output::StderrHeld::lock();
            err.write(&crate::escaped!(
                "{}allow? [y]es, [N]o, [a]lways for {} this session, [w]hy not (no, and tell the model why): ",
                prompt,
                crate::output::escaped(kind)
            ));
            let line = read_stdin_line(&flag)?;
            let choice = line.trim().to_ascii_lowercase();
            if matches!(choice.as_str(), "w" | "why") {
                err.write(&crate::escaped!("tell the model why: "));
                let why = read_stdin_line(&flag).unwrap_or_default();
                return Some((choice, Some(why.trim().to_string()).filter(|w| !w.is_empty())));
            }
            Some((choice, None))
        })
        .await
        .ok()
        .flatten();
        match answer {
            Some((choice, _)) if matches!(choice.as_str(), "y" | "yes") => Decision::Allow,
            Some((choice, _)) if matches!(choice.as_str(), "a" | "always") => {
                self.always.lock().unwrap_or_else(|e| e.into_inner()).insert(kind);
                Decision::Allow
            }
            Some((_, why)) => Decision::Decline { why },
            None => Decision::Decline { why: None },
        }
    }
}

/// Set when dropped.
#[derive(Default)]
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// One line from stdin; `None` at its end, or once `stop` is set. On a terminal it polls (a
/// line is one read there), so that it can stop; elsewhere (a pipe) it reads through std's
/// buffer, which other readers of stdin share.
fn read_stdin_line(stop: &std::sync::atomic::AtomicBool) -> Option<String> {
    use crate::terminal::{STDIN, is_tty};
    if !is_tty(STDIN) {
        let mut line = String::new();
        return match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        };
    }
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: STDIN,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        // SAFETY: reads one byte into a buffer we own.
        match unsafe { libc::read(STDIN, byte.as_mut_ptr().cast(), 1) } {
            1 if byte[0] == b'\n' => return Some(String::from_utf8_lossy(&line).into_owned()),
            1 => line.push(byte[0]),
            0 => return None,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return None,
        }
    }
    None
}

/// The chat's `/tests`: every test command, as `run_tests` shows them.
pub async fn run_tests_now(session: &Session) -> String {
    if session.tool_settings.test_commands.is_empty() {
        return "no test command is known (pass --test-cmd)".into();
    }
    let ctx = ToolContext {
        sandbox: &session.sandbox,
        settings: &session.tool_settings,
        approver: None,
    };
    match ctx.run_tests().await {
        Ok(runs) => render_test_runs(&runs),
        Err(e) => format!("cannot run the tests: {e}"),
    }
}
