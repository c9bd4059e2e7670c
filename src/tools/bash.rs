use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Approval, Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args, render_command};

pub struct Bash;

#[derive(Deserialize)]
struct Args {
    command: String,
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
             status. Commands are killed after {} seconds, and nothing started in the background \
             outlives the command.",
            s.command_timeout.as_secs()
        )
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line, e.g. \"python3 -m pytest -q -x\""}},
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
                    command: args.command.clone(),
                })
                .await
        {
            return Err(super::declined(
                "the user declined to run this command".into(),
                why,
            ));
        }
        let out = ctx.shell(&args.command).await?;
        Ok(ToolOutput::text(render_command(&args.command, &out)))
    }
}
