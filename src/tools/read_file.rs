use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};
use crate::sandbox::human_bytes;
use crate::workspace::Workspace;

pub struct ReadFile;

/// Longest line shown; minified files would otherwise flood the context.
const MAX_LINE_CHARS: usize = 2000;

#[derive(Deserialize)]
struct Args {
    path: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn read_only(&self) -> bool {
        true
    }

    fn description(&self, s: &ToolSettings) -> String {
        format!(
            "Read a text file of the project. Each line is shown with its line number, a tab, then \
             the line as it is in the file (the number and tab are not part of the file). Shows {} \
             lines from `offset` (1-based, default 1) unless `limit` says otherwise; long files say how \
             to read on. Binary files are refused.",
            s.read_max_lines
        )
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the project root"},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to show (1-based)"},
                "limit": {"type": "integer", "minimum": 1, "description": "How many lines to show"}
            },
            "required": ["path"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        let s = ctx.settings;
        let file = Workspace::new(ctx.sandbox)
            .read(&args.path, s.max_file_bytes)
            .await?;
        if !file.complete() {
            return Err(ToolError::RespondToModel(format!(
                "{} is {}, more than read_file loads ({}); use search, or bash with `sed -n 'A,Bp'`",
                args.path,
                human_bytes(file.size),
                human_bytes(s.max_file_bytes as u64)
            )));
        }
        if file.data.contains(&0) {
            return Err(ToolError::RespondToModel(format!(
                "{} is a binary file ({}); read_file shows text files only",
                args.path,
                human_bytes(file.size)
            )));
        }
        let text = String::from_utf8_lossy(&file.data);
        Ok(ToolOutput::text(
            number_lines(&text, args.offset, args.limit, s.read_max_lines).map_err(ToolError::from)?,
        ))
    }
}

/// `offset`/`limit` paging with line numbers, and a note on how to read on.
pub fn number_lines(
    text: &str,
    offset: Option<u64>,
    limit: Option<u64>,
    default_limit: usize,
) -> Result<String, super::ToModel> {
    let lines: Vec<&str> = text.lines().collect();
    let total = lines.len();
    if total == 0 {
        return Ok("(empty file)".into());
    }
    let start = offset.unwrap_or(1).max(1) as usize;
    if start > total {
        return Err(super::ToModel(format!(
            "offset {start} is past the end: the file has {total} lines"
        )));
    }
    let limit = limit
        .map(|l| l as usize)
        .unwrap_or(default_limit)
        .clamp(1, 10 * default_limit.max(1));
    let end = (start - 1 + limit).min(total);
    let mut out = String::new();
    for (i, line) in lines[start - 1..end].iter().enumerate() {
        let shown = if line.chars().count() > MAX_LINE_CHARS {
            let cut: String = line.chars().take(MAX_LINE_CHARS).collect();
            format!("{cut}… [line cut at {MAX_LINE_CHARS} characters]")
        } else {
            line.to_string()
        };
        out.push_str(&format!("{:>6}\t{shown}\n", start + i));
    }
    if end < total {
        out.push_str(&format!(
            "[lines {start}-{end} of {total}; read on with offset={}]",
            end + 1
        ));
    } else if start > 1 {
        out.push_str(&format!("[lines {start}-{end} of {total}]"));
    } else {
        out.pop();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_pages() {
        let text = "a\nb\nc\nd\n";
        assert_eq!(
            number_lines(text, None, None, 10).unwrap(),
            "     1\ta\n     2\tb\n     3\tc\n     4\td"
        );
        assert_eq!(
            number_lines(text, Some(2), Some(2), 10).unwrap(),
            "     2\tb\n     3\tc\n[lines 2-3 of 4; read on with offset=4]"
        );
        assert_eq!(
            number_lines(text, Some(4), None, 10).unwrap(),
            "     4\td\n[lines 4-4 of 4]"
        );
        assert_eq!(
            number_lines(text, Some(9), None, 10).unwrap_err(),
            "offset 9 is past the end: the file has 4 lines"
        );
        assert_eq!(number_lines("", None, None, 10).unwrap(), "(empty file)");
        let long = "x".repeat(3000);
        assert!(
            number_lines(&long, None, None, 10)
                .unwrap()
                .contains("[line cut at 2000 characters]")
        );
    }
}
