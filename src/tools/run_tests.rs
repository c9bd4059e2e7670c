use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, render_test_runs};

pub struct RunTests;

#[async_trait]
impl Tool for RunTests {
    fn name(&self) -> &'static str {
        "run_tests"
    }

    fn description(&self, s: &ToolSettings) -> String {
        match s.test_commands.as_slice() {
            [] => "Run the project's test suite. No test command is known for this project yet.".into(),
            [cmd] => format!(
                "Run the project's test suite (`{cmd}`) and show its output (the start and the end \
                 when long) and exit status. Takes no arguments."
            ),
            many => format!(
                "Run the project's test suites, each in turn: {}. Shows each one's output (the start and \
                 the end when long) and exit status; the tests pass only when every one passes. Takes no \
                 arguments.",
                many.iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn schema(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }

    async fn call(&self, _args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        if ctx.settings.test_commands.is_empty() {
            return Err(ToolError::RespondToModel(
                "no test command is known for this project (the user can set one with --test-cmd)".into(),
            ));
        }
        let runs = ctx.run_tests().await?;
        Ok(ToolOutput::text(render_test_runs(&runs)))
    }
}
