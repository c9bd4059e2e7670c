use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};
use crate::workspace::Workspace;

pub struct ListFiles;

#[derive(Deserialize)]
struct Args {
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl Tool for ListFiles {
    fn name(&self) -> &'static str {
        "list_files"
    }

    fn read_only(&self) -> bool {
        true
    }

    fn description(&self, s: &ToolSettings) -> String {
        format!(
            "List the files under a directory of the project (default: the whole project), one path \
             per line, relative to the project root. Skips .git, caches and build output, and files \
             ignored by .gitignore. Shows at most {} paths.",
            s.list_max
        )
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory relative to the project root; default \".\""}
            }
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        let path = args
            .path
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| ".".into());
        let listing = Workspace::new(ctx.sandbox)
            .list(&path, ctx.settings.list_max)
            .await?;
        if listing.lines.is_empty() {
            return Ok(ToolOutput::text(format!("(no files under {path})")));
        }
        let mut out = listing.lines.join("\n");
        if listing.total > listing.lines.len() as u64 {
            out.push_str(&format!(
                "\n[{} of {} files shown; list a subdirectory to see the rest]",
                listing.lines.len(),
                listing.total
            ));
        }
        Ok(ToolOutput::text(out))
    }
}
