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
mod mutants;
mod prompt;
pub mod reply;
mod splice;
mod validate;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::agent::{Fatal, LoopResult, Stop};
use crate::cli::{RepairReply, Strategy};
use crate::config::AgentSettings;
use crate::events::{Event, EventSink};
use crate::model::{Message, ModelError, Request, ToolChoice, ToolSpec, Turn, Usage};
use crate::report::{CandidateReport, CandidateVerdict};
use crate::session::Session;
use crate::tools::tally::Tally;
use crate::tools::{ToolContext, ToolRegistry};
pub use prompt::CONTEXT_TOKENS;
use prompt::MIN_REPLY_TOKENS;
use reply::FileWrite;
use validate::{Judged, Validator, write_files};

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
                None => Stop::Repaired(self.summary.clone()),
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

/// Where a round starts: the files changed so far (none in round 1) and how the tests fail.
struct State {
    files: Vec<FileWrite>,
    tally: Option<Tally>,
    failing: String,
    /// The candidate it came from.
    from: Option<u32>,
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
) -> Result<Vec<FileWrite>, Box<CandidateReport>> {
    let discard = |verdict, files: Vec<String>, detail: String| {
        Box::new(CandidateReport {
            files,
            detail,
            ..CandidateReport::new(number, round, temperature, verdict)
        })
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
            // Whole files (or functions) in fenced blocks, as the model may answer anyway.
            Ok(_) => spliced(turn, view, sources, &mut notes)
                .map_err(|why| discard(CandidateVerdict::Unparsable, Vec::new(), why))?,
            Err(why) => return Err(discard(CandidateVerdict::Unparsable, Vec::new(), why)),
        }
    } else {
        spliced(turn, view, sources, &mut notes)
            .map_err(|why| discard(CandidateVerdict::Unparsable, Vec::new(), why))?
    };
    if files.iter().all(|f| view.unchanged(f)) {
        let detail = if notes.is_empty() {
            "the reply gave the file(s) back as they were".to_string()
        } else if reply_format == RepairReply::Blocks {
            format!("its blocks change nothing:\n{}", notes.join("\n"))
        } else {
            // Functions written into their files ([`splice`]) that are as they were.
            format!(
                "the reply gave the file(s) back as they were:\n{}",
                notes.join("\n")
            )
        };
        return Err(discard(
            CandidateVerdict::Unchanged,
            files.iter().map(|f| f.path.clone()).collect(),
            detail,
        ));
    }
    Ok(files)
}

/// A reply's files, a fragment of one (only the functions it changes) written into it.
fn spliced(
    turn: &Turn,
    view: &localise::Localised,
    sources: &[String],
    notes: &mut Vec<String>,
) -> Result<Vec<FileWrite>, String> {
    let writes = reply::writes_from_turn(turn, sources)?;
    let (files, spliced) = splice::apply(writes, &|p| view.text_of(p));
    notes.extend(spliced);
    Ok(files)
}

fn dedup(mut paths: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    paths.retain(|p| seen.insert(p.clone()));
    paths
}

/// Localise, sample and judge candidates round after round, and keep the winner (else the
/// best partial fix) in the session's sandbox.
async fn repair(session: &Session, settings: &AgentSettings, project: &Path, task: &str) -> Repaired {
    let mut out = Repaired::default();
    let r = match Repairing::start(session, settings, project, task).await {
        Ok(r) => r,
        Err(early) => return early,
    };
    let rounds = r.rounds(&mut out).await;
    r.conclude(rounds, &mut out).await;
    // Only now does `r` go, and its validator's copy of the project with it: the kept files
    // were wanted until they were in the session's sandbox.
    drop(r);
    out
}

/// What repair works with once the project is localised: the prompt's parts, and where the
/// candidates are judged.
struct Repairing<'a> {
    session: &'a Session,
    settings: &'a AgentSettings,
    task: &'a str,
    reply_format: RepairReply,
    reply_tokens: u32,
    system: String,
    loc: localise::Localised,
    sources: Vec<String>,
    tools: Vec<ToolSpec>,
    tool_choice: ToolChoice,
    max_tokens: u32,
    validator: Validator<'a>,
    /// Candidates judged at once (`--candidate-jobs`).
    jobs: tokio::sync::Semaphore,
    /// Each candidate's failing test, when its prompt was about one (`focus`).
    focused: Mutex<HashMap<u32, String>>,
}

/// How far the rounds went: every candidate judged, where the last round left the project,
/// the candidates numbered so far, and the model's failure that ended them.
struct Rounds {
    all: Vec<Judged>,
    state: State,
    number: u32,
    model_error: Option<ModelError>,
}

/// Where a round starts, as its prompts show it (see [`Repairing::opening`]).
struct Opening {
    view: localise::Localised,
    progress_note: Option<String>,
    failing_tests: Vec<String>,
    request: Request,
}

impl<'a> Repairing<'a> {
    /// Plan the prompt and localise: or the result, when there is nothing to repair or no
    /// way to judge a candidate.
    async fn start(
        session: &'a Session,
        settings: &'a AgentSettings,
        project: &Path,
        task: &'a str,
    ) -> Result<Repairing<'a>, Repaired> {
        let mut out = Repaired::default();
        if session.tool_settings.test_commands.is_empty() {
            out.summary = "repair needs a test command to judge its candidates, and none is known \
                           (pass --test-cmd): nothing was changed"
                .into();
            return Err(out);
        }
        let reply_tokens = settings.model.max_tokens.max(MIN_REPLY_TOKENS);
        let reply_format = settings.repair.reply;
        let system = prompt::system(session, reply_format).await;
        let ctx = ToolContext {
            sandbox: &session.sandbox,
            settings: &session.tool_settings,
            approver: None,
        };
        let loc =
            localise::localise(&ctx, prompt::budget(reply_tokens, &system), session.before_runs()).await;
        if loc.tests_pass {
            out.tests_pass = true;
            out.summary = "the tests already pass: nothing to repair".into();
            return Err(out);
        }
        let sources = loc.sources();
        session.events.emit(&Event::Note {
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
                return Err(out);
            }
        };
        let (tools, tool_choice) = match reply_format {
            RepairReply::Text | RepairReply::Functions | RepairReply::Blocks => {
                (Vec::new(), ToolChoice::Auto)
            }
            RepairReply::Tools => (
                ToolRegistry::write_only().specs(&session.tool_settings),
                ToolChoice::Required,
            ),
        };
        let max_tokens = prompt::reply_limit(&loc, reply_tokens, settings.model.max_tokens);
        Ok(Repairing {
            session,
            settings,
            task,
            reply_format,
            reply_tokens,
            system,
            loc,
            sources,
            tools,
            tool_choice,
            max_tokens,
            validator,
            jobs: tokio::sync::Semaphore::new(settings.repair.candidate_jobs as usize),
            focused: Default::default(),
        })
    }

    fn note(&self, message: String) {
        self.session.events.emit(&Event::Note { message });
    }

    /// A judged candidate, with the test its prompt was about, told and kept.
    fn record(&self, mut j: Judged, judged: &mut Vec<Judged>) {
        j.report.focus = self
            .focused
            .lock()
            .ok()
            .and_then(|m| m.get(&j.report.number).cloned());
        self.session
            .events
            .emit(&Event::Candidate { candidate: &j.report });
        judged.push(j);
    }

    /// Round after round, each from the best partial fix of the one before, until a candidate
    /// passes, a round makes no progress, the model fails, or `--repair-rounds` is reached.
    async fn rounds(&self, out: &mut Repaired) -> Rounds {
        let mut rounds = Rounds {
            all: Vec::new(),
            state: State {
                files: Vec::new(),
                tally: self.loc.tally.clone(),
                failing: self.loc.failing.clone(),
                from: None,
            },
            number: 0,
            model_error: None,
        };
        for round in 1..=self.settings.repair.rounds {
            let mut judged = self.round(round, &mut rounds, out).await;
            judged.sort_by_key(|c| c.report.number);
            let passed = judged.iter().any(Judged::passed);
            let best = if passed {
                None
            } else {
                self.keep_best(round, &mut judged, &mut rounds)
            };
            rounds.all.extend(judged);
            if passed || best.is_none() || rounds.model_error.is_some() {
                break;
            }
        }
        rounds
    }

    /// One round's candidates, sampled one after another and judged meanwhile.
    async fn round(&self, round: u32, rounds: &mut Rounds, out: &mut Repaired) -> Vec<Judged> {
        let state = &rounds.state;
        let Opening {
            view,
            progress_note,
            failing_tests,
            request,
        } = self.opening(round, state);
        let mut validating = FuturesUnordered::new();
        let mut judged: Vec<Judged> = Vec::new();
        // A passing candidate ends the sampling: a later one could never win. One that makes
        // progress ends the round: the next round starts from it, at temperature 0 again.
        let round_over = |judged: &[Judged]| judged.iter().any(|c| c.passed() || c.progress_over(state));
        // Mutants first (`--repair-mutants`): each costs one test run, where the local model's
        // candidate costs 20-60 s on 2 cores. Judged `--candidate-jobs` at a time, all of them
        // unless one passes: the first to make progress is often not the best (`max` → `min`
        // can pass an on-time test that dropping the `+ 1` passes with two more), and the
        // round keeps the best. One that made progress ends the round before the model.
        let tried = mutants::mutants(&view, &failing_tests, self.settings.repair.mutants as usize);
        if !tried.is_empty() {
            self.note(format!(
                "repair: round {round}: {} small change(s) to the code the failing tests call, each \
                 tested before the model is asked",
                tried.len()
            ));
        }
        let (one_token, structural): (Vec<_>, Vec<_>) = tried.iter().partition(|m| !m.structural);
        let jobs = self.settings.repair.candidate_jobs.max(1) as usize;
        let batches = one_token.chunks(jobs).chain(structural.chunks(jobs));
        for batch in batches {
            if judged.iter().any(Judged::passed) {
                break;
            }
            // Changes of a line or a block only when no one-token change made progress: they
            // are fewer fixes for the runs they cost (the demo's rounds took 8-16 s with them
            // against 5 s without).
            if batch[0].structural && judged.iter().any(|c| c.progress_over(state)) {
                break;
            }
            let tests: Vec<_> = batch
                .iter()
                .map(|m| {
                    rounds.number += 1;
                    let files = [FileWrite {
                        path: m.path.clone(),
                        content: m.content.clone(),
                    }];
                    self.validator.validate(
                        rounds.number,
                        round,
                        0.0,
                        vec![m.path.clone()],
                        merged(&state.files, &files),
                        &self.jobs,
                    )
                })
                .collect();
            // `join_all` keeps the batch's order: each result is its mutant's.
            for (m, mut c) in batch.iter().zip(futures_util::future::join_all(tests).await) {
                c.report.mutation = Some(m.what.clone());
                self.record(c, &mut judged);
            }
        }
        for k in 1..=self.settings.repair.candidates {
            if round_over(&judged) {
                break;
            }
            rounds.number += 1;
            let number = rounds.number;
            let on = (k >= 2 && !failing_tests.is_empty())
                .then(|| failing_tests[(k as usize - 2) % failing_tests.len()].clone());
            let temperature = if k == 1 {
                0.0
            } else if on.is_some() && (k as usize - 2) < failing_tests.len() {
                self.settings.repair.focus_temperature
            } else {
                self.settings.aids.retry_temperature
            };
            let request = self.candidate_request(
                &request,
                &view,
                number,
                temperature,
                on.as_deref(),
                progress_note.as_deref(),
            );
            // A line per candidate before its wait (20-60 s for the local model on 2 cores), so
            // that the screen says what is going on even where no spinner is drawn.
            self.note(format!(
                "repair: round {round}, candidate {number}: asking the model{} (temperature {temperature}, \
                 at most {} tokens)",
                on.as_ref().map(|t| format!(" about {t}")).unwrap_or_default(),
                request.max_tokens
            ));
            // Sample the next candidate while the earlier ones are tested.
            let asked = sample(self.session, number, &request);
            let Some(turn) = self
                .reply_unless_over(asked, &mut validating, &mut judged, &round_over)
                .await
            else {
                self.note(format!(
                    "repair: candidate {number} not waited for: an earlier one {}",
                    if judged.iter().any(Judged::passed) {
                        "passed"
                    } else {
                        "made progress"
                    }
                ));
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
                    self.record(Judged::discarded(c), &mut judged);
                    continue;
                }
                Err(e) => {
                    // A failed model request (after its retries) would fail the next one too. It
                    // ends the run only if no candidate passes.
                    let c = CandidateReport {
                        detail: e.to_string(),
                        ..CandidateReport::new(number, round, temperature, CandidateVerdict::Error)
                    };
                    rounds.model_error = Some(e);
                    self.record(Judged::discarded(c), &mut judged);
                    break;
                }
            };
            out.usage.add(&turn.usage);
            if number == 1 && !self.session.model.estimated_usage() {
                self.note_usage(&turn, &request);
            }
            match changes_of(
                &turn,
                self.reply_format,
                &view,
                &self.sources,
                number,
                round,
                temperature,
            ) {
                Ok(files) => {
                    let paths = files.iter().map(|f| f.path.clone()).collect();
                    let tested = merged(&state.files, &files);
                    validating.push(self.validator.validate(
                        number,
                        round,
                        temperature,
                        paths,
                        tested,
                        &self.jobs,
                    ));
                }
                Err(report) => self.record(Judged::discarded(*report), &mut judged),
            }
        }
        while let Some(c) = validating.next().await {
            self.record(c, &mut judged);
        }
        judged
    }

    /// What a round's candidates are asked from: the files as the round starts (`state`), what
    /// the round before fixed, the failing tests, and the first candidate's request.
    fn opening(&self, round: u32, state: &State) -> Opening {
        let view = if round == 1 {
            self.loc
                .with_files(&[], &self.loc.failing, self.loc.tally.clone())
        } else {
            self.loc
                .with_files(&state.files, &state.failing, state.tally.clone())
        };
        let progress_note = match (state.from, &self.loc.tally, &state.tally) {
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
            system: self.system.clone(),
            messages: vec![Message::user_text(prompt::prompt(
                self.task,
                &view,
                self.reply_format,
                progress_note.as_deref(),
                None,
            ))],
            tools: self.tools.clone(),
            tool_choice: self.tool_choice,
            temperature: Some(0.0),
            max_tokens: self.max_tokens,
        };
        Opening {
            view,
            progress_note,
            failing_tests,
            request,
        }
    }

    /// The model's reply to `asked`, with the candidates judged meanwhile recorded; `None` when
    /// one of them ends the round (`round_over`): the reply could not matter now, and its
    /// request is dropped rather than waited for as long as the winner's (20-60 s for the local
    /// model).
    async fn reply_unless_over<J: std::future::Future<Output = Judged>>(
        &self,
        asked: impl std::future::Future<Output = Result<Turn, ModelError>>,
        validating: &mut FuturesUnordered<J>,
        judged: &mut Vec<Judged>,
        round_over: &(dyn Fn(&[Judged]) -> bool + Sync),
    ) -> Option<Result<Turn, ModelError>> {
        tokio::pin!(asked);
        loop {
            tokio::select! {
                turn = &mut asked => return Some(turn),
                Some(c) = validating.next() => {
                    self.record(c, judged);
                    if round_over(judged) {
                        return None;
                    }
                }
            }
        }
    }

    /// The round's request for candidate `number`: at `temperature`, and about the failing
    /// test `on` when there is one.
    fn candidate_request(
        &self,
        request: &Request,
        view: &localise::Localised,
        number: u32,
        temperature: f32,
        on: Option<&str>,
        progress_note: Option<&str>,
    ) -> Request {
        match on {
            Some(test) => {
                if let Ok(mut m) = self.focused.lock() {
                    m.insert(number, test.to_string());
                }
                Request {
                    temperature: Some(temperature),
                    messages: vec![Message::user_text(prompt::prompt(
                        self.task,
                        view,
                        self.reply_format,
                        progress_note,
                        Some(test),
                    ))],
                    ..request.clone()
                }
            }
            None => Request {
                temperature: Some(temperature),
                ..request.clone()
            },
        }
    }

    /// What the budget planned, against what the model counted (for the first candidate).
    fn note_usage(&self, turn: &Turn, request: &Request) {
        self.note(format!(
            "repair: the prompt took {} tokens and the reply {} (planned: {} for the prompt, \
             {} for the reply, in a {CONTEXT_TOKENS}-token context)",
            turn.usage.total_input(),
            turn.usage.output_tokens,
            CONTEXT_TOKENS.saturating_sub(self.reply_tokens),
            request.max_tokens
        ));
    }

    /// The round's best partial fix (the fewest failing tests, the earliest among equals), kept:
    /// the next round starts from it. Its index in `judged`, if any made progress.
    fn keep_best(&self, round: u32, judged: &mut [Judged], rounds: &mut Rounds) -> Option<usize> {
        let best = judged
            .iter()
            .enumerate()
            .filter(|(_, c)| c.progress_over(&rounds.state))
            .min_by_key(|(_, c)| (c.tally.as_ref().map_or(u32::MAX, |t| t.failed), c.report.number))
            .map(|(i, _)| i)?;
        let c = &mut judged[best];
        c.report.kept = true;
        rounds.state = State {
            files: c.files.clone(),
            tally: c.tally.clone(),
            failing: c.failing.clone(),
            from: Some(c.report.number),
        };
        let tests = rounds
            .state
            .tally
            .as_ref()
            .map(Tally::describe)
            .unwrap_or_default();
        self.note(
            if round < self.settings.repair.rounds && rounds.model_error.is_none() {
                format!(
                    "repair: round {round}: candidate {} fixed part of it ({tests}); round {} starts from it",
                    c.report.number,
                    round + 1
                )
            } else {
                format!(
                    "repair: round {round}: candidate {} fixed part of it ({tests})",
                    c.report.number
                )
            },
        );
        Some(best)
    }

    /// The winner (else the best partial fix) written into the session's sandbox, and the
    /// summary of it all.
    async fn conclude(&self, rounds: Rounds, out: &mut Repaired) {
        let Rounds {
            all,
            state,
            model_error,
            ..
        } = rounds;
        let winner = all.iter().find(|c| c.passed()).map(|c| c.report.number);
        if winner.is_none()
            && let Some(e) = model_error
        {
            out.fatal = Some(Fatal::Model(Arc::new(e)));
        }
        out.summary = summary(&all, winner, &state, out);
        // What reaches the session's sandbox: the winner, else the best partial fix.
        let keep = winner.or(state.from);
        if let Some(n) = keep
            && out.fatal.is_none()
            && let Some(c) = all.iter().find(|c| c.report.number == n)
            && let Err(e) = write_files(&self.session.sandbox, &self.session.tool_settings, &c.files).await
        {
            out.fatal = Some(e.fatal(n));
        }
        out.winner = winner;
        out.candidates = all.into_iter().map(|c| c.report).collect();
    }
}

/// What repair says it did; `out.kept` set when the best partial fix is kept.
fn summary(all: &[Judged], winner: Option<u32>, state: &State, out: &mut Repaired) -> String {
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
    let mutation = |n: u32| {
        all.iter()
            .find(|c| c.report.number == n)
            .and_then(|c| c.report.mutation.as_ref())
            .map(|m| format!(" (no model: {m})"))
            .unwrap_or_default()
    };
    match (winner, state.from) {
        (Some(n), _) => format!(
            "repair: candidate {n}{} of {total}{in_rounds} passed the tests in its own sandbox; its files \
             were kept: {} ({discarded} discarded)",
            mutation(n),
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
    }
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
