//! `--strategy repair` and `--strategy auto`: localise, ask for whole corrected files in one
//! reply, and test each candidate in its own isolated sandbox (a copy of the project, as
//! `--isolate` makes it). The winner is the lowest-numbered candidate whose tests all pass with
//! no test changed; only its files reach the session's sandbox, and from there the project by
//! the session's own path (the patch, `--apply`).
//!
//! Measured with a 1.5B local model: the agent loop fixed 1 of 10 small projects, one prompt
//! asking for whole files with a few samples fixed 9 to 10 of them (`../shared/notes` in the
//! issue). `auto` runs the loop on what repair leaves, with the candidates' test output.

pub mod localise;
pub mod reply;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::agent::{Fatal, LoopResult, Stop};
use crate::cli::{RepairReply, Strategy};
use crate::config::{AgentSettings, SandboxConfig};
use crate::events::{Event, EventSink};
use crate::model::{Message, ModelError, Request, ToolChoice, Turn, Usage};
use crate::report::{CandidateReport, CandidateVerdict};
use crate::sandbox::Sandbox;
use crate::session::Session;
use crate::tools::{ToolContext, ToolRegistry, ToolSettings, all_passed, render_test_runs};
use crate::workspace::{FsError, Workspace};
use reply::FileWrite;

/// The context the prompt is planned for, in tokens: the local model's (`scripts/serve-local-model`
/// serves Qwen2.5-Coder-1.5B with 16384), the smallest agentbox is meant to work with. Larger
/// models have more; the prompt stays this small anyway, which also keeps it fast on a CPU.
pub const CONTEXT_TOKENS: u32 = 16384;
/// Room for the reply: whole files, however low `--max-tokens` is (the small-model preset's
/// 1024 is for a loop's short calls).
const MIN_REPLY_TOKENS: u32 = 4096;
/// The system prompt, the task and the instructions, in tokens, with room to spare.
const PROMPT_OVERHEAD_TOKENS: u32 = 1200;
/// Bytes per token of source code: a deliberately low figure (code usually runs 3 to 4), so
/// that the budget errs on the small side.
const BYTES_PER_TOKEN: u32 = 3;
/// The end of a failed candidate's test output kept for the report and the loop.
const DETAIL_BYTES: usize = 1500;

/// The system prompt, before the sentence that says how files come back.
const SYSTEM: &str = "You fix bugs in code. You are given a task, the output of the project's failing \
     tests, the test files and the source files. The tests are the specification: never change them. \
     Find the bug, then reply with the complete corrected content of each source file you change: \
     the whole file, every line of it, not only the changed part. Change as little as needed and keep \
     everything else exactly as it is.";
const SYSTEM_TEXT: &str = " For each file you change, write its path on a line of its own, then the \
     whole file in a fenced code block.";
const SYSTEM_TOOLS: &str = " Call write_file once for each file you change, with the whole file as content.";
/// The reply's room beyond the files it may rewrite: a whole file comes back a little longer
/// than it went out (JSON escapes, a fence, a changed line), and a reply that runs on past
/// that is a runaway (one ran to 4 096 tokens, 7 minutes on 2 cores).
const REPLY_SLACK_TOKENS: u32 = 256;

/// What a strategy did: the loop's result (steps and usage over everything), its attempts, and
/// the repair candidates.
pub struct Work {
    pub result: LoopResult,
    pub attempts: u32,
    pub candidates: Vec<CandidateReport>,
}

/// Work on `task` with the session, by `settings.strategy`.
pub async fn work(session: &Session, settings: &AgentSettings, project: &Path, task: &str) -> Work {
    let loop_only = |(result, attempts): (LoopResult, u32)| Work {
        result,
        attempts,
        candidates: Vec::new(),
    };
    match settings.strategy {
        Strategy::Loop => loop_only(session.work(task).await),
        Strategy::Repair => {
            let r = repair(session, settings, project, task).await;
            Work {
                result: r.result(),
                attempts: 1,
                candidates: r.candidates,
            }
        }
        Strategy::Auto => {
            let r = repair(session, settings, project, task).await;
            if r.winner.is_some() || r.fatal.is_some() || r.tests_pass {
                return Work {
                    result: r.result(),
                    attempts: 1,
                    candidates: r.candidates,
                };
            }
            session.events.emit(&Event::Note {
                message: "no repair candidate passed: the agent loop takes over".into(),
            });
            let task = format!("{task}{}", r.context_for_loop());
            let (mut result, attempts) = session.work(&task).await;
            result.steps += r.requests;
            result.usage.add(&r.usage);
            Work {
                result,
                attempts,
                candidates: r.candidates,
            }
        }
    }
}

/// What repair did.
#[derive(Default)]
struct Repaired {
    winner: Option<u32>,
    candidates: Vec<CandidateReport>,
    usage: Usage,
    /// Model requests made (the report's steps).
    requests: u32,
    fatal: Option<Fatal>,
    tests_pass: bool,
    summary: String,
}

impl Repaired {
    fn result(&self) -> LoopResult {
        LoopResult {
            stop: match &self.fatal {
                Some(f) => Stop::Fatal(f.clone()),
                None => Stop::Answered(self.summary.clone()),
            },
            steps: self.requests,
            usage: self.usage,
        }
    }

    /// For the loop after failed candidates: what they tried and how their tests failed.
    fn context_for_loop(&self) -> String {
        let failed: Vec<String> = self
            .candidates
            .iter()
            .filter(|c| c.verdict == CandidateVerdict::Failed)
            .take(3)
            .map(|c| {
                format!(
                    "Candidate {} changed {} and its tests still failed:\n{}",
                    c.number,
                    c.files.join(", "),
                    c.detail.trim_end()
                )
            })
            .collect();
        if failed.is_empty() {
            return String::new();
        }
        format!(
            "\n\nEarlier attempts to fix this (each tested apart; none was kept, the project is as it \
             was) did not make the tests pass:\n\n{}",
            failed.join("\n\n")
        )
    }
}

/// Candidate sandboxes: the session's sandbox settings and image, a copy of the project each.
struct Validator<'a> {
    cfg: SandboxConfig,
    project: PathBuf,
    /// The project's archive; removed with the validator.
    seed: tempfile::NamedTempFile,
    tool_settings: &'a ToolSettings,
    session: String,
    /// Each test command's counts before the first turn: a candidate that runs no test where
    /// tests ran then has not passed.
    before: Vec<(String, Option<crate::project::results::TestCounts>)>,
}

async fn repair(session: &Session, settings: &AgentSettings, project: &Path, task: &str) -> Repaired {
    let events = session.events.as_ref();
    let ctx = ToolContext {
        sandbox: &session.sandbox,
        settings: &session.tool_settings,
        approver: None,
    };
    let mut out = Repaired::default();
    if session.tool_settings.test_commands.is_empty() {
        out.summary = "repair needs a test command to judge its candidates, and none is known \
                       (pass --test-cmd): nothing was changed"
            .into();
        return out;
    }
    let reply_tokens = settings.model.max_tokens.max(MIN_REPLY_TOKENS);
    let reply_format = settings.repair.reply;
    let mut system = SYSTEM.to_string();
    system.push_str(match reply_format {
        RepairReply::Text => SYSTEM_TEXT,
        RepairReply::Tools => SYSTEM_TOOLS,
    });
    // The project's own notes (AGENTS.md), as the loop's system prompt has them: conventions a
    // fix must follow ("money is integer cents").
    if let Ok(Some(text)) = crate::session::prompt::project_instructions(&session.sandbox).await {
        system.push_str("\n\n# Instructions from the project (its AGENTS.md)\n\n");
        system.push_str(text.trim());
        system.push('\n');
    }
    let budget = (CONTEXT_TOKENS.saturating_sub(reply_tokens + PROMPT_OVERHEAD_TOKENS) * BYTES_PER_TOKEN)
        .saturating_sub(system.len() as u32);
    let loc = localise::localise(&ctx, budget as usize, session.before_runs()).await;
    if loc.tests_pass {
        out.tests_pass = true;
        out.summary = "the tests already pass: nothing to repair".into();
        return out;
    }
    let sources = loc.sources();
    events.emit(&Event::Note {
        message: format!(
            "repair: {} file(s) in the prompt ({} to rewrite){}",
            loc.shown.len(),
            sources.len(),
            if loc.left_out.is_empty() {
                String::new()
            } else {
                format!("; left out for the budget: {}", loc.left_out.join(", "))
            }
        ),
    });
    let validator = match Validator::new(session, settings, project).await {
        Ok(v) => v,
        Err(e) => {
            out.fatal = Some(Fatal::Sandbox(Arc::new(e)));
            return out;
        }
    };
    let (tools, tool_choice) = match reply_format {
        RepairReply::Text => (Vec::new(), ToolChoice::Auto),
        RepairReply::Tools => (
            ToolRegistry::write_only().specs(&session.tool_settings),
            ToolChoice::Required,
        ),
    };
    let request = Request {
        system,
        messages: vec![Message::user_text(prompt(task, &loc, reply_format))],
        tools,
        tool_choice,
        temperature: Some(0.0),
        max_tokens: reply_limit(&loc, reply_tokens, settings.model.max_tokens),
    };
    let jobs = tokio::sync::Semaphore::new(settings.repair.candidate_jobs as usize);
    let mut validating = FuturesUnordered::new();
    let mut judged: Vec<CandidateReport> = Vec::new();
    let mut replies: Vec<(u32, Vec<FileWrite>)> = Vec::new();
    let mut model_error = None;
    let any_passed =
        |judged: &[CandidateReport]| judged.iter().any(|c| c.verdict == CandidateVerdict::Passed);
    let record = |c: CandidateReport, judged: &mut Vec<CandidateReport>| {
        events.emit(&Event::Candidate { candidate: &c });
        judged.push(c);
    };
    for number in 1..=settings.repair.candidates {
        // A passing candidate ends the sampling: a later one could never win.
        if any_passed(&judged) {
            break;
        }
        let temperature = if number == 1 {
            0.0
        } else {
            settings.aids.retry_temperature
        };
        let request = Request {
            temperature: Some(temperature),
            ..request.clone()
        };
        // Sample the next candidate while the earlier ones are tested.
        let asked = sample(session, number, &request);
        tokio::pin!(asked);
        let turn = loop {
            tokio::select! {
                turn = &mut asked => break Some(turn),
                Some(c) = validating.next() => {
                    record(c, &mut judged);
                    // This sample could never win now: drop its request rather than wait
                    // for a reply as long as the winner's (20-60 s for the local model).
                    if any_passed(&judged) {
                        break None;
                    }
                }
            }
        };
        let Some(turn) = turn else {
            events.emit(&Event::Note {
                message: format!("repair: candidate {number} not waited for: an earlier one passed"),
            });
            break;
        };
        out.requests += 1;
        let turn = match turn {
            Ok(t) => t,
            // The server could not read the model's tool call: this candidate has no file.
            Err(e @ ModelError::UnparsableReply { .. }) => {
                record(
                    CandidateReport {
                        number,
                        temperature,
                        verdict: CandidateVerdict::Unparsable,
                        files: Vec::new(),
                        detail: e.to_string(),
                    },
                    &mut judged,
                );
                continue;
            }
            Err(e) => {
                // A failed model request (after its retries) would fail the next one too. It
                // ends the run only if no candidate passes.
                let detail = e.to_string();
                model_error = Some(e);
                record(
                    CandidateReport {
                        number,
                        temperature,
                        verdict: CandidateVerdict::Error,
                        files: Vec::new(),
                        detail,
                    },
                    &mut judged,
                );
                break;
            }
        };
        out.usage.add(&turn.usage);
        if number == 1 && !session.model.estimated_usage() {
            // What the budget planned, against what the model counted.
            events.emit(&Event::Note {
                message: format!(
                    "repair: the prompt took {} tokens and the reply {} (planned: {} for the prompt, \
                     {} for the reply, in a {CONTEXT_TOKENS}-token context)",
                    turn.usage.total_input(),
                    turn.usage.output_tokens,
                    CONTEXT_TOKENS.saturating_sub(reply_tokens),
                    request.max_tokens
                ),
            });
        }
        match reply::files_from_turn(&turn, &sources) {
            Ok(files) if files.iter().all(|f| loc.unchanged(f)) => record(
                CandidateReport {
                    number,
                    temperature,
                    verdict: CandidateVerdict::Unchanged,
                    files: files.iter().map(|f| f.path.clone()).collect(),
                    detail: "the reply gave the file(s) back as they were".into(),
                },
                &mut judged,
            ),
            Ok(files) => {
                replies.push((number, files.clone()));
                validating.push(validator.validate(number, temperature, files, &jobs));
            }
            Err(why) => record(
                CandidateReport {
                    number,
                    temperature,
                    verdict: CandidateVerdict::Unparsable,
                    files: Vec::new(),
                    detail: why,
                },
                &mut judged,
            ),
        }
    }
    while let Some(c) = validating.next().await {
        record(c, &mut judged);
    }
    drop(validating);
    judged.sort_by_key(|c| c.number);
    let winner = judged
        .iter()
        .find(|c| c.verdict == CandidateVerdict::Passed)
        .map(|c| c.number);
    if winner.is_none()
        && let Some(e) = model_error
    {
        out.fatal = Some(Fatal::Model(Arc::new(e)));
    }
    let discarded = judged.iter().filter(|c| c.verdict.discarded()).count();
    out.summary = match winner {
        Some(n) => {
            let files = judged
                .iter()
                .find(|c| c.number == n)
                .map(|c| c.files.join(", "))
                .unwrap_or_default();
            format!(
                "repair: candidate {n} of {} passed the tests in its own sandbox; its files were kept: \
                 {files} ({discarded} discarded)",
                judged.len()
            )
        }
        None => format!(
            "repair: none of {} candidates passed the tests ({discarded} discarded); nothing was changed",
            judged.len()
        ),
    };
    if let Some(n) = winner
        && out.fatal.is_none()
        && let Some((_, files)) = replies.iter().find(|(k, _)| *k == n)
        && let Err((_, detail)) = write_files(&session.sandbox, &session.tool_settings, files).await
    {
        out.fatal = Some(Fatal::Sandbox(Arc::new(crate::sandbox::SandboxError::Other(
            format!("cannot write the winning candidate into the session's sandbox: {detail}"),
        ))));
    }
    out.winner = winner;
    out.candidates = judged;
    // Only now: the winner's files are still wanted until they are in the session's sandbox.
    drop(validator);
    out
}

/// The reply's `max_tokens`: room for every shown source file rewritten (at the budget's
/// bytes per token, half as much again, and some slack), within what the budget planned, and
/// never below the user's own `--max-tokens`.
fn reply_limit(loc: &localise::Localised, planned: u32, max_tokens: u32) -> u32 {
    let bytes: usize = loc.shown.iter().filter(|f| !f.test).map(|f| f.text.len()).sum();
    let files = u32::try_from(bytes).unwrap_or(u32::MAX) / BYTES_PER_TOKEN;
    files
        .saturating_add(files / 2)
        .saturating_add(REPLY_SLACK_TOKENS)
        .min(planned)
        .max(max_tokens)
}

/// The prompt: the task, the failing output, the tests (read-only), the sources to rewrite.
fn prompt(task: &str, loc: &localise::Localised, reply: RepairReply) -> String {
    let mut s = format!("{task}\n\nThe tests fail now:\n{}\n", loc.failing.trim_end());
    let block =
        |f: &localise::Shown| format!("\n### {}\n```\n{}\n```\n", f.path, f.text.trim_end_matches('\n'));
    let tests: Vec<String> = loc.shown.iter().filter(|f| f.test).map(block).collect();
    if !tests.is_empty() {
        s.push_str("\nThe test files (the specification: do not change them):\n");
        s.push_str(&tests.concat());
    }
    s.push_str("\nThe source files:\n");
    s.push_str(
        &loc.shown
            .iter()
            .filter(|f| !f.test)
            .map(block)
            .collect::<String>(),
    );
    if !loc.left_out.is_empty() {
        s.push_str(&format!(
            "\nOther source files, not shown: {}\n",
            loc.left_out.join(", ")
        ));
    }
    s.push_str(match reply {
        RepairReply::Text => {
            "\nReply with each source file you change: its path on a line of its own, then the complete \
             corrected file in a fenced code block.\n"
        }
        RepairReply::Tools => {
            "\nReply with write_file calls, one for each source file you change, each with the complete \
             corrected file. If you cannot call tools, write each changed file's path on a line of its \
             own followed by the whole file in a fenced code block.\n"
        }
    });
    s
}

/// One candidate's reply, recorded as a step of the trajectory.
async fn sample(session: &Session, number: u32, request: &Request) -> Result<Turn, ModelError> {
    session.events.emit(&Event::ModelRequest {
        step: number,
        request,
    });
    let started = Instant::now();
    let turn = session.model.complete(request).await?;
    session.events.emit(&Event::ModelResponse {
        step: number,
        turn: &turn,
        elapsed_ms: started.elapsed().as_millis() as u64,
        estimated_usage: session.model.estimated_usage(),
    });
    Ok(turn)
}

impl<'a> Validator<'a> {
    /// Pack the project once; every candidate's volume is seeded from the same archive.
    async fn new(
        session: &'a Session,
        settings: &AgentSettings,
        project: &Path,
    ) -> Result<Validator<'a>, crate::sandbox::SandboxError> {
        let other = |e: String| crate::sandbox::SandboxError::Other(format!("cannot copy the project: {e}"));
        let dir = crate::sandbox::inspect_project(project)?;
        let root = project.canonicalize().map_err(|e| other(e.to_string()))?;
        let exclude = settings
            .isolate
            .as_ref()
            .map(|i| i.exclude.clone())
            .unwrap_or_default();
        let packed = tokio::task::spawn_blocking(move || {
            crate::isolate::pack(&root, dir.uid, dir.gid, &|p| {
                exclude.iter().any(|e| e.as_bytes() == p.as_bytes())
            })
        })
        .await
        .map_err(|e| other(e.to_string()))?
        .map_err(|e| other(e.to_string()))?;
        let mut cfg = settings.sandbox.clone();
        cfg.image = session.sandbox.info().image.clone();
        Ok(Validator {
            cfg,
            project: project.to_path_buf(),
            seed: packed.tar,
            tool_settings: &session.tool_settings,
            session: session.sandbox.info().session.clone(),
            before: session.before_counts(),
        })
    }

    /// Write the candidate's files into a fresh copy of the project and run every test command.
    async fn validate(
        &self,
        number: u32,
        temperature: f32,
        files: Vec<FileWrite>,
        jobs: &tokio::sync::Semaphore,
    ) -> CandidateReport {
        let paths: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
        let report = |verdict, detail: String| CandidateReport {
            number,
            temperature,
            verdict,
            files: paths.clone(),
            detail,
        };
        // What can be told without a sandbox is told first.
        for f in &files {
            if let Err(e) = crate::workspace::check_path(&f.path) {
                return report(CandidateVerdict::Outside, e.to_string());
            }
            if crate::project::is_test_file(&f.path, &self.tool_settings.test_patterns) {
                return report(
                    CandidateVerdict::ChangesTests,
                    format!("{} is a test file", f.path),
                );
            }
        }
        let Ok(_permit) = jobs.acquire().await else {
            return report(CandidateVerdict::Error, "the candidates were cancelled".into());
        };
        let mut spec = match self.cfg.volume_spec(&self.project, self.seed.path()) {
            Ok(s) => s,
            Err(e) => return report(CandidateVerdict::Error, e.to_string()),
        };
        spec.labels
            .push(("agentbox.candidate".into(), number.to_string()));
        spec.labels
            .push(("agentbox.candidate-of".into(), self.session.clone()));
        let sandbox = match crate::session::open_spec(&self.cfg, spec).await {
            Ok((_, sb)) => sb,
            Err(e) => return report(CandidateVerdict::Error, format!("its sandbox: {e}")),
        };
        let (verdict, detail) = self.judge(&sandbox, &files).await;
        let _ = sandbox.shutdown().await;
        report(verdict, detail)
    }

    async fn judge(&self, sandbox: &dyn Sandbox, files: &[FileWrite]) -> (CandidateVerdict, String) {
        if let Err((verdict, detail)) = write_files(sandbox, self.tool_settings, files).await {
            return (verdict, detail);
        }
        let ctx = ToolContext {
            sandbox,
            settings: self.tool_settings,
            approver: None,
        };
        match ctx.run_tests().await {
            Ok(runs) if all_passed(&runs) => {
                match crate::session::before::no_tests_ran(&runs, &self.before) {
                    None => (CandidateVerdict::Passed, String::new()),
                    Some(why) => (CandidateVerdict::Failed, format!("its tests exited 0, but {why}")),
                }
            }
            Ok(runs) => {
                let text = render_test_runs(&runs);
                let cut = text.len().saturating_sub(DETAIL_BYTES);
                let at = (cut..text.len())
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(cut);
                (CandidateVerdict::Failed, text[at..].to_string())
            }
            Err(e) => (CandidateVerdict::Error, format!("the tests could not run: {e}")),
        }
    }
}

/// Write `files` through the sandbox (paths resolved inside it), refusing test code changes.
async fn write_files(
    sandbox: &dyn Sandbox,
    settings: &ToolSettings,
    files: &[FileWrite],
) -> Result<(), (CandidateVerdict, String)> {
    let ws = Workspace::new(sandbox);
    let fs_verdict = |e: FsError| match e {
        FsError::Outside { .. } | FsError::InvalidPath { .. } => (CandidateVerdict::Outside, e.to_string()),
        other => (CandidateVerdict::Error, other.to_string()),
    };
    for f in files {
        let old = match ws.read(&f.path, settings.max_file_bytes).await {
            Ok(b) => Some(b.data),
            Err(FsError::NotFound(_)) => None,
            Err(e) => return Err(fs_verdict(e)),
        };
        if let Some(what) = crate::project::test_change(&f.path, old.as_deref(), Some(f.content.as_bytes())) {
            return Err((CandidateVerdict::ChangesTests, format!("it changes {what}")));
        }
        let data = f.content.clone().into_bytes();
        let written = match old {
            Some(_) => ws.replace(&f.path, data).await,
            None => ws.create(&f.path, data).await,
        };
        written.map_err(fs_verdict)?;
    }
    Ok(())
}
