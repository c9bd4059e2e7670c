//! The model loop: ask the model, run the tools it asks for in the sandbox, send the results
//! back, until it answers, the step limit is reached, or something fatal happens.

pub mod baseline;
pub mod detect;
pub mod guard;
pub mod prompt;

use std::time::Instant;

use tracing::{Instrument, info_span};

use crate::events::{Event, EventSink};
use crate::model::{Block, Message, ModelClient, Request, Role, StopReason, ToolChoice, ToolResult, Usage};
use crate::tools::{ToolContext, ToolRegistry};

/// Fault injection for the interruption tests (`AGENTBOX_FAULT=panic-after-tool`): proves a
/// panic mid-run still removes the sandbox. Never set in normal use.
fn fault(name: &str) -> bool {
    std::env::var("AGENTBOX_FAULT").is_ok_and(|v| v == name)
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub max_steps: u32,
    pub tool_choice: ToolChoice,
    pub temperature: Option<f32>,
    pub max_tokens: u32,
    /// Calls beyond this in one turn are answered with an error instead of run.
    pub max_calls_per_turn: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_steps: 50,
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: 8192,
            max_calls_per_turn: 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The model's final answer (its text, or the `finish` tool's summary).
    Answered(String),
    StepLimit,
    Fatal(String),
}

#[derive(Debug, Clone)]
pub struct LoopResult {
    pub stop: Stop,
    pub steps: u32,
    pub usage: Usage,
}

pub struct Agent<'a> {
    pub model: &'a dyn ModelClient,
    pub tools: &'a ToolRegistry,
    pub ctx: ToolContext<'a>,
    pub events: &'a dyn EventSink,
    pub config: AgentConfig,
    pub system: String,
}

impl Agent<'_> {
    /// Run until the model answers. `messages` holds the conversation so far (ending with the
    /// user's message) and receives every turn, so a chat can continue it.
    pub async fn run(&self, messages: &mut Vec<Message>) -> LoopResult {
        let specs = self.tools.specs(self.ctx.settings);
        let mut usage = Usage::default();
        for step in 1..=self.config.max_steps {
            let request = Request {
                system: self.system.clone(),
                messages: messages.clone(),
                tools: specs.clone(),
                tool_choice: self.config.tool_choice,
                temperature: self.config.temperature,
                max_tokens: self.config.max_tokens,
            };
            self.events.emit(&Event::ModelRequest {
                step,
                request: &request,
            });
            let started = Instant::now();
            let turn = match self
                .model
                .complete(&request)
                .instrument(info_span!("model", step))
                .await
            {
                Ok(t) => t,
                Err(e) => {
                    return LoopResult {
                        stop: Stop::Fatal(e.to_string()),
                        steps: step,
                        usage,
                    };
                }
            };
            usage.add(&turn.usage);
            self.events.emit(&Event::ModelResponse {
                step,
                turn: &turn,
                elapsed_ms: started.elapsed().as_millis() as u64,
                estimated_usage: self.model.estimated_usage(),
            });
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
                return LoopResult {
                    stop: Stop::Answered(turn.text()),
                    steps: step,
                    usage,
                };
            }

            let mut results = Vec::with_capacity(calls.len());
            let mut finished = None;
            let mut fatal = None;
            for (i, call) in calls.iter().enumerate() {
                // Every call gets a result with its id, run or not: the API requires it.
                let (content, is_error) = if fatal.is_some() {
                    (
                        "not run: the sandbox failed earlier in this turn".to_string(),
                        true,
                    )
                } else if i >= self.config.max_calls_per_turn {
                    (
                        format!(
                            "not run: {} tool calls in one turn; at most {} are run per turn",
                            calls.len(),
                            self.config.max_calls_per_turn
                        ),
                        true,
                    )
                } else {
                    self.events.emit(&Event::ToolStarted { step, call });
                    let t0 = Instant::now();
                    let done = self
                        .tools
                        .dispatch(call, &self.ctx)
                        .instrument(info_span!("tool", step, name = %call.name))
                        .await;
                    self.events.emit(&Event::ToolFinished {
                        step,
                        call_id: &call.id,
                        name: &call.name,
                        content: &done.content,
                        is_error: done.is_error,
                        elapsed_ms: t0.elapsed().as_millis() as u64,
                    });
                    if fault("panic-after-tool") {
                        panic!("fault injected by AGENTBOX_FAULT=panic-after-tool");
                    }
                    if done.finish.is_some() {
                        finished = done.finish;
                    }
                    if done.fatal.is_some() {
                        fatal = done.fatal;
                    }
                    (done.content, done.is_error)
                };
                results.push(Block::ToolResult(ToolResult {
                    call_id: call.id.clone(),
                    content,
                    is_error,
                }));
            }
            messages.push(Message {
                role: Role::User,
                content: results,
            });
            if let Some(error) = fatal {
                return LoopResult {
                    stop: Stop::Fatal(error),
                    steps: step,
                    usage,
                };
            }
            if let Some(summary) = finished {
                return LoopResult {
                    stop: Stop::Answered(summary),
                    steps: step,
                    usage,
                };
            }
        }
        LoopResult {
            stop: Stop::StepLimit,
            steps: self.config.max_steps,
            usage,
        }
    }
}
