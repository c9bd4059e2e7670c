use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};
use crate::workspace::Workspace;

pub struct Search;

#[derive(Deserialize)]
struct Args {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl Tool for Search {
    fn name(&self) -> &'static str {
        "search"
    }

    fn read_only(&self) -> bool {
        true
    }

    fn description(&self, s: &ToolSettings) -> String {
        format!(
            "Search the project's files for a regular expression (ripgrep syntax). Prints matching \
             lines as path:line:text, at most {}. Skips .git, caches, build output and ignored files.",
            s.search_max
        )
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "A regular expression (ripgrep syntax)"},
                "path": {"type": "string", "description": "File or directory to search, relative to the project root; default \".\""}
            },
            "required": ["pattern"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        if args.pattern.is_empty() {
            return Err(ToolError::RespondToModel("the pattern is empty".into()));
        }
        let path = args
            .path
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| ".".into());
        let hits = Workspace::new(ctx.sandbox)
            .search(&args.pattern, &path, ctx.settings.search_max)
            .await?;
        if hits.lines.is_empty() {
            return Ok(ToolOutput::text(format!(
                "no matches for {:?} in {path}",
                args.pattern
            )));
        }
        let mut out = hits.lines.join("\n");
        if hits.total > hits.lines.len() as u64 {
            out.push_str(&format!(
                "\n[{} of {} matching lines shown; narrow the pattern or the path]",
                hits.lines.len(),
                hits.total
            ));
        }
        Ok(ToolOutput::text(out))
    }
}
