use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};

pub struct Finish;

#[derive(Deserialize)]
struct Args {
    summary: String,
}

#[async_trait]
impl Tool for Finish {
    fn name(&self) -> &'static str {
        "finish"
    }

    fn description(&self, _: &ToolSettings) -> String {
        "Call this when the task is done (or cannot be done), with a short summary of what you \
         changed and why. It ends the session."
            .into()
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "What you changed and why"}},
            "required": ["summary"]
        })
    }

    async fn call(&self, args: Value, _ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        Ok(ToolOutput {
            content: "finished".into(),
            finish: Some(args.summary),
        })
    }
}
