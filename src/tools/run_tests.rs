use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, render_command};

pub struct RunTests;

#[async_trait]
impl Tool for RunTests {
    fn name(&self) -> &'static str {
        "run_tests"
    }

    fn description(&self, s: &ToolSettings) -> String {
        match &s.test_command {
            Some(cmd) => format!(
                "Run the project's test suite (`{cmd}`) and show its output (the start and the end \
                 when long) and exit status. Takes no arguments."
            ),
            None => "Run the project's test suite. No test command is known for this project yet.".into(),
        }
    }

    fn schema(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }

    async fn call(&self, _args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let Some(cmd) = &ctx.settings.test_command else {
            return Err(ToolError::RespondToModel(
                "no test command is known for this project (the user can set one with --test-cmd)".into(),
            ));
        };
        let out = ctx.shell(cmd).await?;
        Ok(ToolOutput::text(render_command(cmd, &out)))
    }
}
