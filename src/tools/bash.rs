use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Approval, Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args, process, render_command,
};

pub struct Bash;

/// How long a command started in the background is watched before the call returns: a typo,
/// a missing file or a port in use shows in the result instead of in a later read.
const SETTLE: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct Args {
    command: String,
    #[serde(default)]
    background: bool,
}

#[async_trait]
impl Tool for Bash {
    fn name(&self) -> &'static str {
        "bash"
    }

    fn description(&self, s: &ToolSettings) -> String {
        format!(
            "Run a bash command in the project directory, inside an isolated container with no \
             network. Shows stdout and stderr together (the start and the end when long) and the exit \
             status. Commands are killed after {} seconds, and whatever a command leaves running is \
             killed when it ends. To keep something running between calls (a server to query, a \
             watcher), pass \"background\": true: the call returns after a second with an id and \
             the output so far, the command keeps running with all it starts, and process_output \
             reads what it printed since; stop it with stop_process. Background processes are \
             stopped before agentbox's own final test run and when the session ends.",
            s.command_timeout.as_secs()
        )
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line, e.g. \"python3 -m pytest -q -x\""},
                "background": {"type": "boolean", "description": "Keep it running after the call (default false)"}
            },
            "required": ["command"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        if args.command.trim().is_empty() {
            return Err(ToolError::RespondToModel("the command is empty".into()));
        }
        if let Some(approver) = ctx.approver
            && let super::Decision::Decline { why } = approver
                .decide(&Approval::Command {
                    command: if args.background {
                        format!("{}  (in the background)", args.command)
                    } else {
                        args.command.clone()
                    },
                })
                .await
        {
            return Err(super::declined(
                "the user declined to run this command".into(),
                why,
            ));
        }
        if args.background {
            let req = ctx.shell_request(&args.command, process::HEAD, process::TAIL);
            let state = ctx
                .sandbox
                .start_process(req, args.command.clone(), SETTLE)
                .await?
                .map_err(|r| ToolError::RespondToModel(r.0))?;
            return Ok(ToolOutput::text(process::render_start(&state, ctx.settings)));
        }
        let out = ctx.shell(&args.command).await?;
        Ok(ToolOutput::text(render_command(&args.command, &out)))
    }
}
