//! The model loop: ask the model, run the tools it asks for in the sandbox, send the results
//! back, until it answers, the step limit is reached, or something fatal happens.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::{Instrument, info_span};

use crate::events::{Event, EventSink};
use crate::model::{
    Block, Message, ModelClient, ModelError, Request, Role, StopReason, ToolCall, ToolChoice, ToolResult,
    Usage,
};
use crate::sandbox::SandboxError;
use crate::tools::{Dispatched, ToolContext, ToolRegistry};

/// Fault injection for the interruption tests (`AGENTBOX_FAULT=panic-after-tool`): proves a
/// panic mid-run still removes the sandbox. Never set in normal use.
fn fault(name: &str) -> bool {
    std::env::var("AGENTBOX_FAULT").is_ok_and(|v| v == name)
}

/// What the model is told when the server could not read its reply as a tool call.
const UNPARSABLE_REPLY: &str = "Your last reply could not be read as a tool call: it was probably cut off at the \
     reply length limit, or it repeated itself. Make one tool call, with short arguments.";

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub max_steps: u32,
    pub tool_choice: ToolChoice,
    pub temperature: Option<f32>,
    pub max_tokens: u32,
    /// Calls beyond this in one turn are answered with an error instead of run.
    pub max_calls_per_turn: usize,
    /// Refuse a call identical to an earlier one when nothing has changed since
    /// (`--no-repeat`): small models loop on the same read or the same failing edit.
    pub repeat_guard: bool,
    /// When the model says it is done but agentbox's own test run fails, send it back with
    /// the failure, this many times (`--verify-finish N`).
    pub verify_finish: u32,
    /// With the repeat guard: when every call of a reply repeats an earlier one, ask again at
    /// `resample_temperature` up to this many times before answering "not run"
    /// (`--resample-repeats N`). At temperature 0 a small model answers "not run" with the
    /// same call again, step after step; only a different sample gets it out.
    pub resample_repeats: u32,
    pub resample_temperature: f32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_steps: 50,
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: 8192,
            max_calls_per_turn: 64,
            repeat_guard: false,
            verify_finish: 0,
            resample_repeats: 0,
            resample_temperature: 0.7,
        }
    }
}

/// What ended a run early, typed, so that callers decide by what failed rather than by the
/// words of its message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Fatal {
    /// The sandbox failed: nothing more can run in it.
    #[error(transparent)]
    Sandbox(Arc<SandboxError>),
    /// The model API failed (after its retries).
    #[error(transparent)]
    Model(Arc<ModelError>),
    /// Repair's chosen files could not be written into the session's sandbox, which is still
    /// there (a failure of the sandbox itself is `Sandbox`).
    #[error("cannot write candidate {candidate}'s files into the session's sandbox: {source}")]
    Keep {
        candidate: u32,
        source: Arc<crate::workspace::FsError>,
    },
}

#[derive(Debug, Clone)]
pub enum Stop {
    /// The model's final answer (its text, or the `finish` tool's summary).
    Answered(String),
    /// Repair's own account of its candidates (`--strategy repair`, or `auto` when the loop
    /// did not run): agentbox's words, which the report must not call the model's.
    Repaired(String),
    StepLimit,
    /// The repeat guard fired in two turns in a row: the model only repeats itself, and more
    /// steps would only repeat it again. The attempt ends early (a fresh attempt may do better).
    Repeating,
    Fatal(Fatal),
}

#[derive(Debug, Clone)]
pub struct LoopResult {
    pub stop: Stop,
    pub steps: u32,
    pub usage: Usage,
}

#[derive(Clone)]
pub struct Agent<'a> {
    pub model: &'a dyn ModelClient,
    pub tools: &'a ToolRegistry,
    pub ctx: ToolContext<'a>,
    pub events: &'a dyn EventSink,
    pub config: AgentConfig,
    pub system: String,
    /// Told of every test run the loop sees: the model's `run_tests`, a `finish` checked.
    pub watch: Option<&'a dyn TestWatch>,
}

/// What hears of the loop's test runs, counted (`None`: the runner's summary was not read):
/// the session keeps the best state an attempt reached.
#[async_trait::async_trait]
pub trait TestWatch: Send + Sync {
    async fn tests_ran(&self, tally: Option<crate::tools::tally::Tally>);
}

/// What makes two calls the same call, for the repeat guard.
fn call_key(call: &ToolCall) -> (String, String) {
    (call.name.clone(), call.arguments.to_json_text())
}

/// What the loop remembers between tool calls.
struct LoopState {
    /// Verifications left for `verify_finish`.
    verify_left: u32,
    /// Calls made since the project last changed: (name, arguments) → the step and result.
    seen: HashMap<(String, String), (u32, String)>,
    /// Calls of the current turn the repeat guard refused.
    refused_this_turn: u32,
    /// Turns in a row in which the repeat guard refused a call.
    refused_turns: u32,
    usage: Usage,
}

/// Turns in a row with a refused repeat after which the attempt ends ([`Stop::Repeating`]).
const MAX_REPEATING_TURNS: u32 = 2;

/// The model's next turn, as the loop sees it.
enum Next {
    Turn(crate::model::Turn),
    /// The server could not read the reply as a tool call: the model is told, as a step.
    Unreadable,
    Fatal(Fatal),
}

impl Agent<'_> {
    /// Run until the model answers. `messages` holds the conversation so far (ending with the
    /// user's message) and receives every turn, so a chat can continue it.
    pub async fn run(&self, messages: &mut Vec<Message>) -> LoopResult {
        let specs = self.tools.specs(self.ctx.settings);
        let mut state = LoopState {
            verify_left: self.config.verify_finish,
            seen: HashMap::new(),
            refused_this_turn: 0,
            refused_turns: 0,
            usage: Usage::default(),
        };
        let end = |stop, steps, state: LoopState| LoopResult {
            stop,
            steps,
            usage: state.usage,
        };
        for step in 1..=self.config.max_steps {
            let request = Request {
                system: self.system.clone(),
                messages: messages.clone(),
                tools: specs.clone(),
                tool_choice: self.config.tool_choice,
                temperature: self.config.temperature,
                max_tokens: self.config.max_tokens,
            };
            let turn = match self.next_turn(step, &request, &mut state).await {
                Next::Turn(t) => t,
                Next::Unreadable => {
                    messages.push(Message::user_text(UNPARSABLE_REPLY));
                    continue;
                }
                Next::Fatal(e) => return end(Stop::Fatal(e), step, state),
            };
            let calls = turn.tool_calls();
            messages.push(Message::assistant(turn.content.clone()));

            if calls.is_empty() {
                if turn.stop == StopReason::MaxTokens {
                    self.events.emit(&Event::Note {
                        message: "the reply hit the output token limit; asking the model to continue".into(),
                    });
                    messages.push(Message::user_text(
                        "Your reply was cut off at the output token limit. Continue, in shorter steps.",
                    ));
                    continue;
                }
                if let Some(failure) = self.refuse_finish(&mut state).await {
                    messages.push(Message::user_text(failure));
                    continue;
                }
                return end(Stop::Answered(turn.text()), step, state);
            }

            state.refused_this_turn = 0;
            let (results, stop) = self.run_calls(step, &calls, &mut state).await;
            messages.push(Message {
                role: Role::User,
                content: results,
            });
            if let Some(stop) = stop {
                return end(stop, step, state);
            }
            // Answering "not run" again changes nothing for a model that repeats itself: it
            // repeats the same call until its steps run out (measured: 45 steps a task).
            if state.refused_this_turn > 0 {
                state.refused_turns += 1;
            } else {
                state.refused_turns = 0;
            }
            if state.refused_turns >= MAX_REPEATING_TURNS {
                self.events.emit(&Event::Note {
                    message: format!(
                        "the model repeated a call with nothing changed in {MAX_REPEATING_TURNS} turns in a \
                         row: ending this attempt"
                    ),
                });
                return end(Stop::Repeating, step, state);
            }
        }
        end(Stop::StepLimit, self.config.max_steps, state)
    }

    /// Ask for the next turn; with the repeat guard and `resample_repeats`, ask again (hotter)
    /// while every call of the reply only repeats an earlier one.
    async fn next_turn(&self, step: u32, request: &Request, state: &mut LoopState) -> Next {
        let mut turn = match self.ask(step, request, &mut state.usage).await {
            Ok(Some(t)) => t,
            Ok(None) => return Next::Unreadable,
            Err(e) => return Next::Fatal(e),
        };
        let mut resampled = 0;
        while resampled < self.config.resample_repeats && self.only_repeats(&turn, state) {
            resampled += 1;
            self.events.emit(&Event::Note {
                message: format!(
                    "the model repeated a call with nothing changed since; asking again at temperature {} ({resampled} of {})",
                    self.config.resample_temperature, self.config.resample_repeats
                ),
            });
            let again = Request {
                temperature: Some(self.config.resample_temperature),
                ..request.clone()
            };
            turn = match self.ask(step, &again, &mut state.usage).await {
                Ok(Some(t)) => t,
                // Keep the repeat: it is answered "not run".
                Ok(None) => break,
                Err(e) => return Next::Fatal(e),
            };
        }
        Next::Turn(turn)
    }

    /// Run the calls of one turn in order. Every call gets a result with its id, run or not
    /// (the APIs require it): past the per-turn cap, or after the sandbox failed, "not run".
    /// The stop, when a call ended the run.
    async fn run_calls(
        &self,
        step: u32,
        calls: &[ToolCall],
        state: &mut LoopState,
    ) -> (Vec<Block>, Option<Stop>) {
        let mut results = Vec::with_capacity(calls.len());
        let mut stop = None;
        for (i, call) in calls.iter().enumerate() {
            let (content, is_error) = if matches!(stop, Some(Stop::Fatal(_))) {
                (
                    "not run: the sandbox failed earlier in this turn".to_string(),
                    true,
                )
            } else if i >= self.config.max_calls_per_turn {
                let msg = format!(
                    "not run: {} tool calls in one turn; at most {} are run per turn",
                    calls.len(),
                    self.config.max_calls_per_turn
                );
                (msg, true)
            } else {
                let done = self.run_call(step, call, state).await;
                if fault("panic-after-tool") {
                    panic!("fault injected by AGENTBOX_FAULT=panic-after-tool");
                }
                let result = (done.content().into_owned(), done.is_error());
                match done {
                    Dispatched::Fatal(e) => stop = Some(Stop::Fatal(Fatal::Sandbox(Arc::new(e)))),
                    Dispatched::Finish { summary, .. } => stop = Some(Stop::Answered(summary)),
                    Dispatched::Output(_) | Dispatched::Error(_) => {}
                }
                result
            };
            results.push(Block::ToolResult(ToolResult {
                call_id: call.id.clone(),
                content,
                is_error,
            }));
        }
        (results, stop)
    }

    /// One model turn, recorded; its usage added to `usage`. `None` when the server could not
    /// read the model's reply as a tool call: the model gets to try again, as a step.
    async fn ask(
        &self,
        step: u32,
        request: &Request,
        usage: &mut Usage,
    ) -> Result<Option<crate::model::Turn>, Fatal> {
        self.events.emit(&Event::ModelRequest { step, request });
        let started = Instant::now();
        let turn = match self
            .model
            .complete(request)
            .instrument(info_span!("model", step))
            .await
        {
            Ok(t) => t,
            Err(e @ crate::model::ModelError::UnparsableReply { .. }) => {
                self.events.emit(&Event::Note {
                    message: format!("{e}; telling the model"),
                });
                return Ok(None);
            }
            Err(e) => return Err(Fatal::Model(Arc::new(e))),
        };
        usage.add(&turn.usage);
        self.events.emit(&Event::ModelResponse {
            step,
            turn: &turn,
            elapsed_ms: started.elapsed().as_millis() as u64,
            estimated_usage: self.model.estimated_usage(),
        });
        Ok(Some(turn))
    }

    /// With the repeat guard on: the reply has calls, and each repeats one already answered
    /// with nothing changed since.
    fn only_repeats(&self, turn: &crate::model::Turn, state: &LoopState) -> bool {
        let calls = turn.tool_calls();
        self.config.repeat_guard
            && !calls.is_empty()
            && calls.iter().all(|c| state.seen.contains_key(&call_key(c)))
    }

    /// One tool call, with the guards: a repeat of an earlier call with nothing changed since
    /// is not run, and `finish` while the tests fail is sent back.
    async fn run_call(&self, step: u32, call: &ToolCall, state: &mut LoopState) -> Dispatched {
        self.events.emit(&Event::ToolStarted { step, call });
        let t0 = Instant::now();
        let key = call_key(call);
        let repeated = if self.config.repeat_guard {
            state.seen.get(&key).cloned()
        } else {
            None
        };
        let was_repeat = repeated.is_some();
        if was_repeat {
            state.refused_this_turn += 1;
        }
        let mut done = match repeated {
            Some((at, before)) => Dispatched::Error(format!(
                "not run: you made this exact call at step {at} and nothing has changed since, so the \
                 result would be the same:\n{}\nDo something different.",
                crate::tools::clip(&before, 300)
            )),
            None => {
                self.tools
                    .dispatch(call, &self.ctx)
                    .instrument(info_span!("tool", step, name = %call.name))
                    .await
            }
        };
        if call.name == "run_tests"
            && let (Some(watch), Dispatched::Output(content)) = (self.watch, &done)
        {
            let tally = crate::tools::tally::tally_rendered(content, &self.ctx.settings.test_commands);
            watch.tests_ran(tally).await;
        }
        if matches!(done, Dispatched::Finish { .. })
            && let Some(failure) = self.refuse_finish(state).await
        {
            done = Dispatched::Error(failure);
        }
        if self.config.repeat_guard && !was_repeat {
            // A successful edit or command may have changed anything: forget what was seen.
            if matches!(call.name.as_str(), "edit_file" | "write_file" | "bash") && !done.is_error() {
                state.seen.clear();
            } else {
                state.seen.insert(key, (step, done.content().into_owned()));
            }
        }
        self.events.emit(&Event::ToolFinished {
            step,
            call_id: &call.id,
            name: &call.name,
            content: &done.content(),
            is_error: done.is_error(),
            elapsed_ms: t0.elapsed().as_millis() as u64,
        });
        done
    }

    /// With `verify_finish` left: run the tests; when they fail, the message that sends the
    /// model back to work.
    async fn refuse_finish(&self, state: &mut LoopState) -> Option<String> {
        if state.verify_left == 0 {
            return None;
        }
        if self.ctx.settings.test_commands.is_empty() {
            return None;
        }
        let runs = self.ctx.run_tests().await.ok()?;
        if let Some(watch) = self.watch {
            watch.tests_ran(crate::tools::tally::tally_runs(&runs)).await;
        }
        if crate::tools::all_passed(&runs) {
            return None;
        }
        state.verify_left -= 1;
        self.events.emit(&Event::Note {
            message: format!(
                "the model finished, but the tests fail: sending it back ({} more time(s) at most)",
                state.verify_left
            ),
        });
        let failing: Vec<String> = runs
            .iter()
            .filter(|r| !r.output.success())
            .map(|r| {
                format!(
                    "`{}` ({}):\n{}",
                    r.command,
                    r.output.status_line(),
                    r.output.stdout.shrink(0, 1500 / runs.len().max(1)).to_text()
                )
            })
            .collect();
        Some(format!(
            "agentbox ran the tests and they still fail: {}\nKeep working: change the code, not the \
             tests, until they pass.",
            failing.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests;
