//! `process_output` and `stop_process`: the background processes `bash` starts with
//! `"background": true` (tracked by the sandbox's executor, see `sandbox::ProcessState`).

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};
use crate::sandbox::ProcessState;

/// Bytes of a background process's output kept in the sandbox: its start, and its latest.
pub const HEAD: usize = 16 * 1024;
pub const TAIL: usize = 64 * 1024;

/// The call that started it: its id, how it is, what it printed in its first moment.
pub fn render_start(state: &ProcessState, settings: &ToolSettings) -> String {
    let mut s = format!("$ {}\n", state.command);
    s.push_str(&output_text(state, settings));
    if state.running {
        s.push_str(&format!(
            "background process {} started: {}. process_output {{\"id\": \"{}\"}} shows what it prints \
             next; stop_process {{\"id\": \"{}\"}} ends it.",
            state.id,
            state.status_line(),
            state.id,
            state.id
        ));
    } else {
        s.push_str(&format!(
            "background process {} {}",
            state.id,
            state.status_line()
        ));
    }
    s
}

/// The output not shown before, bounded as a command's is for the model.
fn output_text(state: &ProcessState, settings: &ToolSettings) -> String {
    let new = state
        .output
        .since(state.shown)
        .shrink(settings.output_head, settings.output_tail);
    let mut text = new.to_text();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

fn render(state: &ProcessState, settings: &ToolSettings) -> String {
    let mut s = format!("{} `{}`: {}\n", state.id, state.command, state.status_line());
    let text = output_text(state, settings);
    if text.is_empty() {
        s.push_str("(no new output)\n");
    } else {
        s.push_str(&text);
    }
    s
}

pub struct ProcessOutput;

#[derive(Deserialize)]
struct OutputArgs {
    #[serde(default)]
    id: Option<String>,
}

#[async_trait]
impl Tool for ProcessOutput {
    fn name(&self) -> &'static str {
        "process_output"
    }

    fn description(&self, _: &ToolSettings) -> String {
        "Show what a background process (started by bash with \"background\": true) printed since \
         you last looked, and whether it still runs. Without an id, list the background processes."
            .into()
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The process's id, e.g. \"p1\""}}
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: OutputArgs = parse_args(self.name(), args)?;
        let Some(id) = args.id.filter(|i| !i.trim().is_empty()) else {
            let all = ctx
                .sandbox
                .processes(None, false)
                .await?
                .map_err(|r| ToolError::RespondToModel(r.0))?;
            if all.is_empty() {
                return Ok(ToolOutput::text(
                    "no background processes (start one with bash and \"background\": true)",
                ));
            }
            let lines: Vec<String> = all
                .iter()
                .map(|p| format!("{} `{}`: {}", p.id, p.command, p.status_line()))
                .collect();
            return Ok(ToolOutput::text(lines.join("\n")));
        };
        let mut found = ctx
            .sandbox
            .processes(Some(id.trim()), true)
            .await?
            .map_err(|r| ToolError::RespondToModel(r.0))?;
        match found.pop() {
            Some(state) => Ok(ToolOutput::text(render(&state, ctx.settings))),
            None => Err(ToolError::RespondToModel(format!("no background process {id:?}"))),
        }
    }
}

pub struct StopProcess;

#[derive(Deserialize)]
struct StopArgs {
    id: String,
}

#[async_trait]
impl Tool for StopProcess {
    fn name(&self) -> &'static str {
        "stop_process"
    }

    fn description(&self, _: &ToolSettings) -> String {
        "Stop a background process and everything it started; shows its last output.".into()
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The process's id, e.g. \"p1\""}},
            "required": ["id"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: StopArgs = parse_args(self.name(), args)?;
        let mut stopped = ctx
            .sandbox
            .stop_processes(Some(args.id.trim()), "stop_process was called")
            .await?
            .map_err(|r| ToolError::RespondToModel(r.0))?;
        match stopped.pop() {
            Some(state) => Ok(ToolOutput::text(render(&state, ctx.settings))),
            None => Err(ToolError::RespondToModel(format!(
                "no background process {:?}",
                args.id
            ))),
        }
    }
}
