//! `write_file`: the whole file at once. Small models cannot copy an exact `old` string (they
//! drop a docstring line, swap quotes) but rewrite a short file correctly; the diff in the
//! result shows them (and the user) what the rewrite changed, dropped code included.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::edit_file::{approve, unified_diff};
use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};
use crate::sandbox::human_bytes;
use crate::workspace::{FsError, Workspace};

pub struct WriteFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    content: String,
}

/// Lines of the diff the model is shown; the rest is counted.
const MAX_DIFF_LINES: usize = 60;

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn description(&self, _: &ToolSettings) -> String {
        "Write the whole content of a file: the complete corrected file, every line of it, not only \
         the changed part. Creates the file if it does not exist. The result shows what changed."
            .into()
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the project root"},
                "content": {"type": "string", "description": "The complete new content of the file"}
            },
            "required": ["path", "content"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        let s = ctx.settings;
        if args.content.len() > s.max_edit_bytes {
            return Err(ToolError::RespondToModel(format!(
                "`content` is {}; write_file writes at most {}",
                human_bytes(args.content.len() as u64),
                human_bytes(s.max_edit_bytes as u64)
            )));
        }
        let rel = super::edit_file::project_relative(&args.path);
        if s.protect_tests && crate::project::is_test_file(rel, &s.test_patterns) {
            return Err(ToolError::RespondToModel(format!(
                "{} is a test file, and the tests are the specification: leave them as they are and \
                 change the code under test instead",
                args.path
            )));
        }
        let ws = Workspace::new(ctx.sandbox);
        let before = match ws.read(&args.path, s.max_file_bytes).await {
            Ok(file) if !file.complete() => {
                return Err(ToolError::RespondToModel(format!(
                    "{} is {}, more than write_file replaces ({})",
                    args.path,
                    human_bytes(file.size),
                    human_bytes(s.max_file_bytes as u64)
                )));
            }
            Ok(file) => match String::from_utf8(file.data) {
                Ok(text) if !text.contains('\0') => Some(text),
                _ => {
                    return Err(ToolError::RespondToModel(format!(
                        "{} is not a UTF-8 text file; write_file replaces text files only",
                        args.path
                    )));
                }
            },
            Err(FsError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        if s.protect_tests
            && let Some(what) = crate::project::test_change(
                rel,
                before.as_deref().map(str::as_bytes),
                Some(args.content.as_bytes()),
            )
        {
            return Err(ToolError::RespondToModel(format!(
                "this changes {what}, and the tests and what decides how they run are the \
                 specification: leave them as they are and change the code under test instead"
            )));
        }
        let old = before.as_deref().unwrap_or("");
        if before.is_some() && old == args.content {
            return Err(ToolError::RespondToModel(format!(
                "{} already has exactly this content: nothing would change",
                args.path
            )));
        }
        approve(ctx, &args.path, old, &args.content).await?;
        let data = args.content.clone().into_bytes();
        match before {
            Some(_) => ws.replace(&args.path, data).await?,
            None => ws.create(&args.path, data).await?,
        }
        Ok(ToolOutput::text(describe_write(
            &args.path,
            before.as_deref(),
            &args.content,
        )))
    }
}

/// "wrote PATH" or "created PATH", the line counts, and the diff (bounded), so a rewrite that
/// dropped code shows as removed lines.
pub fn describe_write(path: &str, before: Option<&str>, after: &str) -> String {
    let Some(before) = before else {
        return format!("created {path} ({} lines)", after.lines().count());
    };
    let diff = unified_diff(path, before, after);
    let (mut added, mut removed) = (0, 0);
    for line in diff.lines() {
        if line.starts_with('+') && !line.starts_with("+++") {
            added += 1;
        } else if line.starts_with('-') && !line.starts_with("---") {
            removed += 1;
        }
    }
    let lines: Vec<&str> = diff.lines().collect();
    let mut out = format!(
        "wrote {path} ({} lines; +{added} -{removed}). What changed:\n",
        after.lines().count()
    );
    out.push_str(&lines[..lines.len().min(MAX_DIFF_LINES)].join("\n"));
    if lines.len() > MAX_DIFF_LINES {
        out.push_str(&format!(
            "\n[... {} more diff lines]",
            lines.len() - MAX_DIFF_LINES
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_is_a_short_diff_that_shows_dropped_lines() {
        let d = describe_write(
            "a.py",
            Some("def f():\n    \"\"\"Doc.\"\"\"\n    return 1\n"),
            "def f():\n    return 2\n",
        );
        assert!(
            d.starts_with("wrote a.py (2 lines; +1 -2). What changed:\n"),
            "{d}"
        );
        assert!(
            d.contains("-    \"\"\"Doc.\"\"\"\n-    return 1\n+    return 2"),
            "{d}"
        );
        assert_eq!(describe_write("b.py", None, "x = 1\n"), "created b.py (1 lines)");
        let long: String = (0..200).map(|i| format!("{i}\n")).collect();
        let d = describe_write("c.txt", Some(""), &long);
        assert!(d.ends_with("more diff lines]"), "{d}");
        assert!(d.lines().count() < MAX_DIFF_LINES + 3, "{d}");
    }
}
