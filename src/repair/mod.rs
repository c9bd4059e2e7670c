//! `--strategy repair` and `--strategy auto`: localise, ask for whole corrected files in one
//! reply, and test each candidate in its own isolated sandbox (a copy of the project, as
//! `--isolate` makes it). The winner is the lowest-numbered candidate whose tests all pass with
//! no test changed; only its files reach the session's sandbox, and from there the project by
//! the session's own path (the patch, `--apply`).
//!
//! Measured with a 1.5B local model: the agent loop fixed 1 of 10 small projects, one prompt
//! asking for whole files with a few samples fixed 9 to 10 of them (`../shared/notes` in the
//! issue). `auto` runs the loop on what repair leaves, with the candidates' test output.

pub mod blocks;
pub mod focus;
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
use crate::tools::tally::{Tally, tally_runs};
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
/// The system prompt for `--repair-reply blocks`: only the lines that change come back.
const SYSTEM_BLOCKS: &str = "You fix bugs in code. You are given a task, the output of the project's failing \
     tests, the test files and the source files. The tests are the specification: never change them. \
     Find the bug, then reply with one search/replace block for each change, in this form:\n\n\
     path/of/the/file.py\n\
     <<<<<<< SEARCH\n\
     the lines to change, copied exactly from the file\n\
     =======\n\
     the corrected lines\n\
     >>>>>>> REPLACE\n\n\
     Copy whole lines into SEARCH, with their indentation, and enough of them to find the place. \
     Fix every bug the failing tests show; change as little as needed.";
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
            let (mut result, attempts) = if r.kept.is_some() {
                session.work_changed(&task).await
            } else {
                session.work(&task).await
            };
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
    /// No candidate passed, and the best partial one (fewer failing tests, none newly failing)
    /// was written into the session's sandbox: its number and what its tests say.
    kept: Option<(u32, String)>,
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

    /// For the loop after failed candidates: what they tried and how their tests failed, and
    /// which one the project now holds.
    fn context_for_loop(&self) -> String {
        let failed: Vec<String> = self
            .candidates
            .iter()
            .filter(|c| c.verdict == CandidateVerdict::Failed && !c.kept)
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
        let kept = match &self.kept {
            Some((n, tests)) => format!(
                "\n\nThe best earlier attempt (candidate {n}) fixed part of it and is already applied: \
                 the project is in that state now ({tests}). Fix what is left; do not undo it."
            ),
            None => String::new(),
        };
        if failed.is_empty() {
            return kept;
        }
        let state = if self.kept.is_some() {
            "each tested apart"
        } else {
            "each tested apart; none was kept, the project is as it was"
        };
        format!(
            "{kept}\n\nEarlier attempts to fix this ({state}) did not make the tests pass:\n\n{}",
            failed.join("\n\n")
        )
    }
}

/// A candidate as judged: its report, the files it was tested with (the round's starting
/// point with its own changes over it), and how its tests failed.
struct Judged {
    report: CandidateReport,
    files: Vec<FileWrite>,
    tally: Option<Tally>,
    failing: String,
}

impl Judged {
    fn discarded(report: CandidateReport) -> Judged {
        Judged {
            report,
            files: Vec::new(),
            tally: None,
            failing: String::new(),
        }
    }

    fn passed(&self) -> bool {
        self.report.verdict == CandidateVerdict::Passed
    }

    /// Failed, but fewer failing tests than `from` and none newly failing.
    fn progress_over(&self, from: &State) -> bool {
        self.report.verdict == CandidateVerdict::Failed
            && match (&self.tally, &from.tally) {
                (Some(now), Some(then)) => now.improves_on(then),
                _ => false,
            }
    }
}

/// Where a round starts: the files changed so far (none in round 1) and how the tests fail.
struct State {
    files: Vec<FileWrite>,
    tally: Option<Tally>,
    failing: String,
    /// The candidate it came from.
    from: Option<u32>,
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

/// `files` written over `base`: a later write of a path replaces the earlier one.
fn merged(base: &[FileWrite], files: &[FileWrite]) -> Vec<FileWrite> {
    let mut out: Vec<FileWrite> = base
        .iter()
        .filter(|b| !files.iter().any(|f| f.path == b.path))
        .cloned()
        .collect();
    out.extend(files.iter().cloned());
    out
}

/// What a reply asks to change, as whole files over the round's view, or the report of a
/// candidate discarded without a sandbox.
fn changes_of(
    turn: &Turn,
    reply_format: RepairReply,
    view: &localise::Localised,
    sources: &[String],
    number: u32,
    round: u32,
    temperature: f32,
) -> Result<Vec<FileWrite>, CandidateReport> {
    let discard = |verdict, files: Vec<String>, detail: String| CandidateReport {
        files,
        detail,
        ..CandidateReport::new(number, round, temperature, verdict)
    };
    let mut notes = Vec::new();
    let files = if reply_format == RepairReply::Blocks {
        match blocks::parse(&turn.text(), sources) {
            Ok(found) if !found.is_empty() => {
                let applied = blocks::apply_all(&found, &|p| view.text_of(p));
                notes = applied.notes;
                if applied.files.is_empty() {
                    let paths = found.iter().map(|b| b.path.clone()).collect::<Vec<_>>();
                    return Err(discard(
                        CandidateVerdict::Unmatched,
                        dedup(paths),
                        notes.join("\n"),
                    ));
                }
                applied.files
            }
            // Whole files in fenced blocks, as the model may answer anyway.
            Ok(_) => reply::files_from_turn(turn, sources)
                .map_err(|why| discard(CandidateVerdict::Unparsable, Vec::new(), why))?,
            Err(why) => return Err(discard(CandidateVerdict::Unparsable, Vec::new(), why)),
        }
    } else {
        reply::files_from_turn(turn, sources)
            .map_err(|why| discard(CandidateVerdict::Unparsable, Vec::new(), why))?
    };
    if files.iter().all(|f| view.unchanged(f)) {
        let detail = if notes.is_empty() {
            "the reply gave the file(s) back as they were".to_string()
        } else {
            format!("its blocks change nothing:\n{}", notes.join("\n"))
        };
        return Err(discard(
            CandidateVerdict::Unchanged,
            files.iter().map(|f| f.path.clone()).collect(),
            detail,
        ));
    }
    Ok(files)
}

fn dedup(mut paths: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    paths.retain(|p| seen.insert(p.clone()));
    paths
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
    let mut system = match reply_format {
        RepairReply::Text => format!("{SYSTEM}{SYSTEM_TEXT}"),
        RepairReply::Tools => format!("{SYSTEM}{SYSTEM_TOOLS}"),
        RepairReply::Blocks => SYSTEM_BLOCKS.to_string(),
    };
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
        RepairReply::Text | RepairReply::Blocks => (Vec::new(), ToolChoice::Auto),
        RepairReply::Tools => (
            ToolRegistry::write_only().specs(&session.tool_settings),
            ToolChoice::Required,
        ),
    };
    let max_tokens = reply_limit(&loc, reply_tokens, settings.model.max_tokens);
    let jobs = tokio::sync::Semaphore::new(settings.repair.candidate_jobs as usize);
    let mut all: Vec<Judged> = Vec::new();
    let mut model_error = None;
    let mut state = State {
        files: Vec::new(),
        tally: loc.tally.clone(),
        failing: loc.failing.clone(),
        from: None,
    };
    let mut number = 0;
    // Each candidate's failing test, when its prompt was about one (`focus`).
    let focused: std::sync::Mutex<std::collections::HashMap<u32, String>> = Default::default();
    let record = |mut j: Judged, judged: &mut Vec<Judged>| {
        j.report.focus = focused.lock().ok().and_then(|m| m.get(&j.report.number).cloned());
        events.emit(&Event::Candidate { candidate: &j.report });
        judged.push(j);
    };
    for round in 1..=settings.repair.rounds {
        let view = if round == 1 {
            loc.with_files(&[], &loc.failing, loc.tally.clone())
        } else {
            loc.with_files(&state.files, &state.failing, state.tally.clone())
        };
        let progress_note = match (state.from, &loc.tally, &state.tally) {
            (Some(n), Some(before), Some(now)) => Some(format!(
                "An earlier reply (candidate {n}) fixed part of it, and the files below have its fix: \
                 {} before, {} now. Fix what is left.",
                before.describe(),
                now.describe()
            )),
            _ => None,
        };
        // The round's failing tests, in the output's order: candidates after the first are
        // each about one of them (see `focus`), at temperature 0 while there are tests left to
        // ask about, then at the retry temperature.
        let failing_tests = view
            .tally
            .as_ref()
            .filter(|t| !t.broken)
            .map(|t| focus::in_output_order(&view.failing, &t.failing))
            .unwrap_or_default();
        let request = Request {
            system: system.clone(),
            messages: vec![Message::user_text(prompt(
                task,
                &view,
                reply_format,
                progress_note.as_deref(),
                None,
            ))],
            tools: tools.clone(),
            tool_choice,
            temperature: Some(0.0),
            max_tokens,
        };
        let mut validating = FuturesUnordered::new();
        let mut judged: Vec<Judged> = Vec::new();
        // A passing candidate ends the sampling: a later one could never win. One that makes
        // progress ends the round: the next round starts from it, at temperature 0 again.
        let round_over = |judged: &[Judged]| judged.iter().any(|c| c.passed() || c.progress_over(&state));
        for k in 1..=settings.repair.candidates {
            if round_over(&judged) {
                break;
            }
            number += 1;
            let on = (k >= 2 && !failing_tests.is_empty())
                .then(|| failing_tests[(k as usize - 2) % failing_tests.len()].clone());
            let temperature = if k == 1 || on.is_some() && (k as usize - 2) < failing_tests.len() {
                0.0
            } else {
                settings.aids.retry_temperature
            };
            let request = match &on {
                Some(test) => {
                    if let Ok(mut m) = focused.lock() {
                        m.insert(number, test.clone());
                    }
                    Request {
                        temperature: Some(temperature),
                        messages: vec![Message::user_text(prompt(
                            task,
                            &view,
                            reply_format,
                            progress_note.as_deref(),
                            Some(test),
                        ))],
                        ..request.clone()
                    }
                }
                None => Request {
                    temperature: Some(temperature),
                    ..request.clone()
                },
            };
            // A line per candidate before its wait (20-60 s for the local model on 2 cores), so
            // that the screen says what is going on even where no spinner is drawn.
            events.emit(&Event::Note {
                message: format!(
                    "repair: round {round}, candidate {number}: asking the model{} (temperature {temperature}, \
                     at most {} tokens)",
                    on.as_ref().map(|t| format!(" about {t}")).unwrap_or_default(),
                    request.max_tokens
                ),
            });
            // Sample the next candidate while the earlier ones are tested.
            let asked = sample(session, number, &request);
            tokio::pin!(asked);
            let turn = loop {
                tokio::select! {
                    turn = &mut asked => break Some(turn),
                    Some(c) = validating.next() => {
                        record(c, &mut judged);
                        // This sample could not matter now: drop its request rather than wait
                        // for a reply as long as the winner's (20-60 s for the local model).
                        if round_over(&judged) {
                            break None;
                        }
                    }
                }
            };
            let Some(turn) = turn else {
                events.emit(&Event::Note {
                    message: format!(
                        "repair: candidate {number} not waited for: an earlier one {}",
                        if judged.iter().any(Judged::passed) {
                            "passed"
                        } else {
                            "made progress"
                        }
                    ),
                });
                break;
            };
            out.requests += 1;
            let turn = match turn {
                Ok(t) => t,
                // The server could not read the model's tool call: this candidate has no file.
                Err(e @ ModelError::UnparsableReply { .. }) => {
                    let c = CandidateReport {
                        detail: e.to_string(),
                        ..CandidateReport::new(number, round, temperature, CandidateVerdict::Unparsable)
                    };
                    record(Judged::discarded(c), &mut judged);
                    continue;
                }
                Err(e) => {
                    // A failed model request (after its retries) would fail the next one too. It
                    // ends the run only if no candidate passes.
                    let c = CandidateReport {
                        detail: e.to_string(),
                        ..CandidateReport::new(number, round, temperature, CandidateVerdict::Error)
                    };
                    model_error = Some(e);
                    record(Judged::discarded(c), &mut judged);
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
            match changes_of(&turn, reply_format, &view, &sources, number, round, temperature) {
                Ok(files) => {
                    let paths = files.iter().map(|f| f.path.clone()).collect();
                    let tested = merged(&state.files, &files);
                    validating.push(validator.validate(number, round, temperature, paths, tested, &jobs));
                }
                Err(report) => record(Judged::discarded(report), &mut judged),
            }
        }
        while let Some(c) = validating.next().await {
            record(c, &mut judged);
        }
        drop(validating);
        judged.sort_by_key(|c| c.report.number);
        let passed = judged.iter().any(Judged::passed);
        // The round's best partial fix: the fewest failing tests, the earliest among equals.
        let best = (!passed)
            .then(|| {
                judged
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.progress_over(&state))
                    .min_by_key(|(_, c)| (c.tally.as_ref().map_or(u32::MAX, |t| t.failed), c.report.number))
                    .map(|(i, _)| i)
            })
            .flatten();
        if let Some(i) = best {
            let c = &mut judged[i];
            c.report.kept = true;
            state = State {
                files: c.files.clone(),
                tally: c.tally.clone(),
                failing: c.failing.clone(),
                from: Some(c.report.number),
            };
            let tests = state.tally.as_ref().map(Tally::describe).unwrap_or_default();
            events.emit(&Event::Note {
                message: if round < settings.repair.rounds && model_error.is_none() {
                    format!(
                        "repair: round {round}: candidate {} fixed part of it ({tests}); round {} starts from it",
                        c.report.number,
                        round + 1
                    )
                } else {
                    format!("repair: round {round}: candidate {} fixed part of it ({tests})", c.report.number)
                },
            });
        }
        all.extend(judged);
        if passed || best.is_none() || model_error.is_some() {
            break;
        }
    }
    let winner = all.iter().find(|c| c.passed()).map(|c| c.report.number);
    if winner.is_none()
        && let Some(e) = model_error
    {
        out.fatal = Some(Fatal::Model(Arc::new(e)));
    }
    let discarded = all.iter().filter(|c| c.report.verdict.discarded()).count();
    let rounds = all.iter().map(|c| c.report.round).max().unwrap_or(1);
    let in_rounds = if rounds > 1 {
        format!(" in {rounds} rounds")
    } else {
        String::new()
    };
    let total = all.len();
    let files_of = |n: u32| {
        all.iter()
            .find(|c| c.report.number == n)
            .map(|c| {
                c.files
                    .iter()
                    .map(|f| f.path.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    // What reaches the session's sandbox: the winner, else the best partial fix.
    let keep = winner.or(state.from);
    out.summary = match (winner, state.from) {
        (Some(n), _) => format!(
            "repair: candidate {n} of {total}{in_rounds} passed the tests in its own sandbox; its files \
             were kept: {} ({discarded} discarded)",
            files_of(n)
        ),
        (None, Some(n)) => {
            let tests = state.tally.as_ref().map(Tally::describe).unwrap_or_default();
            out.kept = Some((n, tests.clone()));
            format!(
                "repair: none of {total} candidates{in_rounds} passed the tests ({discarded} discarded); \
                 the best, candidate {n}, fixed part of it and was kept ({tests}): {}",
                files_of(n)
            )
        }
        (None, None) => format!(
            "repair: none of {total} candidates{in_rounds} passed the tests ({discarded} discarded); \
             nothing was changed"
        ),
    };
    if let Some(n) = keep
        && out.fatal.is_none()
        && let Some(c) = all.iter().find(|c| c.report.number == n)
        && let Err((_, detail)) = write_files(&session.sandbox, &session.tool_settings, &c.files).await
    {
        out.fatal = Some(Fatal::Sandbox(Arc::new(crate::sandbox::SandboxError::Other(
            format!("cannot write candidate {n}'s files into the session's sandbox: {detail}"),
        ))));
    }
    out.winner = winner;
    out.candidates = all.into_iter().map(|c| c.report).collect();
    // Only now: the kept files are still wanted until they are in the session's sandbox.
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

/// The prompt: the task, the failing output, the tests (read-only), the sources to rewrite;
/// in a later round, first what the round before fixed (`progress`).
/// With `focus`, a paragraph about that one failing test comes last before the reply's form:
/// the rest of the prompt is the round's first candidate's, a prefix the model's server can
/// keep in its cache.
fn prompt(
    task: &str,
    loc: &localise::Localised,
    reply: RepairReply,
    progress: Option<&str>,
    focus: Option<&str>,
) -> String {
    let mut s = match progress {
        Some(p) => format!(
            "{task}\n\n{p}\n\nThe tests that still fail:\n{}\n",
            loc.failing.trim_end()
        ),
        None => format!("{task}\n\nThe tests fail now:\n{}\n", loc.failing.trim_end()),
    };
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
    if let Some(test) = focus {
        s.push_str(&focus::paragraph(loc, test));
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
        RepairReply::Blocks => {
            "\nReply with a search/replace block for each change: the file's path on a line of its own, \
             then <<<<<<< SEARCH, the lines as they are, =======, the corrected lines, >>>>>>> REPLACE.\n"
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
            crate::hostfs::isolate::pack(&root, dir.uid, dir.gid, &|p| {
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

    /// Write the candidate's files (`files`: its own changes, `paths`, over the round's
    /// starting point) into a fresh copy of the project and run every test command.
    async fn validate(
        &self,
        number: u32,
        round: u32,
        temperature: f32,
        paths: Vec<String>,
        files: Vec<FileWrite>,
        jobs: &tokio::sync::Semaphore,
    ) -> Judged {
        let report = |verdict, detail: String| {
            Judged::discarded(CandidateReport {
                files: paths.clone(),
                detail,
                ..CandidateReport::new(number, round, temperature, verdict)
            })
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
        let judged = self.judge(&sandbox, &files).await;
        let _ = sandbox.shutdown().await;
        let (verdict, detail, tally, failing) = judged;
        let mut j = report(verdict, detail);
        j.report.tests_passed = tally.as_ref().and_then(|t| t.passed);
        j.report.tests_failed = tally.as_ref().map(|t| t.failed);
        j.files = files;
        j.tally = tally;
        j.failing = failing;
        j
    }

    /// The verdict, its detail, the tests counted and their output as a prompt shows it.
    async fn judge(
        &self,
        sandbox: &dyn Sandbox,
        files: &[FileWrite],
    ) -> (CandidateVerdict, String, Option<Tally>, String) {
        if let Err((verdict, detail)) = write_files(sandbox, self.tool_settings, files).await {
            return (verdict, detail, None, String::new());
        }
        let ctx = ToolContext {
            sandbox,
            settings: self.tool_settings,
            approver: None,
        };
        match ctx.run_tests().await {
            Ok(runs) if all_passed(&runs) => {
                match crate::session::before::no_tests_ran(&runs, &self.before) {
                    None => (
                        CandidateVerdict::Passed,
                        String::new(),
                        tally_runs(&runs),
                        String::new(),
                    ),
                    Some(why) => (
                        CandidateVerdict::Failed,
                        format!("its tests exited 0, but {why}"),
                        tally_runs(&runs),
                        localise::failing_output(&runs),
                    ),
                }
            }
            Ok(runs) => {
                let text = render_test_runs(&runs);
                let cut = text.len().saturating_sub(DETAIL_BYTES);
                let at = (cut..text.len())
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(cut);
                let detail = text[at..].to_string();
                (
                    CandidateVerdict::Failed,
                    detail,
                    tally_runs(&runs),
                    localise::failing_output(&runs),
                )
            }
            Err(e) => (
                CandidateVerdict::Error,
                format!("the tests could not run: {e}"),
                None,
                String::new(),
            ),
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
