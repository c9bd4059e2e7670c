use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Approval, Tool, ToolContext, ToolError, ToolOutput, ToolSettings, parse_args};
use crate::sandbox::human_bytes;
use crate::workspace::{FsError, Workspace};

pub struct EditFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    old: String,
    new: String,
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &'static str {
        "edit_file"
    }

    fn description(&self, _: &ToolSettings) -> String {
        "Replace one exact piece of text in a file. `old` must appear exactly once in the file, \
         character for character, including whitespace and indentation (copy it from read_file's \
         output without the line numbers); include enough surrounding lines to make it unique. To \
         create a new file, give an empty `old` and the whole file as `new`."
            .into()
    }

    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the project root"},
                "old": {"type": "string", "description": "The exact text to replace; empty to create a new file"},
                "new": {"type": "string", "description": "The replacement text"}
            },
            "required": ["path", "old", "new"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(self.name(), args)?;
        let s = ctx.settings;
        if args.new.len() > s.max_edit_bytes {
            return Err(ToolError::RespondToModel(format!(
                "`new` is {}; one edit writes at most {}: make smaller edits",
                human_bytes(args.new.len() as u64),
                human_bytes(s.max_edit_bytes as u64)
            )));
        }
        let rel = project_relative(&args.path);
        if s.protect_tests && crate::project::is_test_file(rel, &s.test_patterns) {
            return Err(ToolError::RespondToModel(format!(
                "{} is a test file, and the tests are the specification: leave them as they are and \
                 change the code under test instead",
                args.path
            )));
        }
        let ws = Workspace::new(ctx.sandbox);
        if args.old.is_empty() {
            if s.protect_tests
                && let Some(what) = crate::project::test_change(rel, None, Some(args.new.as_bytes()))
            {
                return Err(ToolError::RespondToModel(format!(
                    "this creates {what}, and the tests and what decides how they run are the \
                     specification: leave them as they are"
                )));
            }
            approve(ctx, &args.path, "", &args.new).await?;
            return match ws.create(&args.path, args.new.clone().into_bytes()).await {
                Ok(()) => Ok(ToolOutput::text(format!(
                    "created {} ({} lines)",
                    args.path,
                    args.new.lines().count()
                ))),
                Err(FsError::Exists(p)) => Err(ToolError::RespondToModel(format!(
                    "{p} already exists; to change it, read it and give the exact text to replace as `old`"
                ))),
                Err(e) => Err(e.into()),
            };
        }
        // The file and the match come first: "old and new are the same" is no help when the
        // file does not exist or `old` is not in it (a small model's usual case).
        let file = ws.read(&args.path, s.max_file_bytes).await?;
        if !file.complete() {
            return Err(ToolError::RespondToModel(format!(
                "{} is {}, more than edit_file loads ({})",
                args.path,
                human_bytes(file.size),
                human_bytes(s.max_file_bytes as u64)
            )));
        }
        if file.data.contains(&0) {
            return Err(ToolError::RespondToModel(format!(
                "{} is a binary file; edit_file edits text files only",
                args.path
            )));
        }
        let Ok(text) = String::from_utf8(file.data) else {
            return Err(ToolError::RespondToModel(format!(
                "{} is not UTF-8 text; edit it with bash",
                args.path
            )));
        };
        let at = find_exactly_once(&text, &args.old, &args.path).map_err(ToolError::from)?;
        if args.old == args.new {
            return Err(ToolError::RespondToModel(
                "`old` and `new` are the same: nothing would change. Put the corrected text in `new`.".into(),
            ));
        }
        let mut updated = String::with_capacity(text.len() + args.new.len());
        updated.push_str(&text[..at]);
        updated.push_str(&args.new);
        updated.push_str(&text[at + args.old.len()..]);
        if s.protect_tests
            && let Some(what) =
                crate::project::test_change(rel, Some(text.as_bytes()), Some(updated.as_bytes()))
        {
            return Err(ToolError::RespondToModel(format!(
                "this edit changes {what}, and the tests and what decides how they run are the \
                 specification: leave them as they are and change the code under test instead"
            )));
        }
        approve(ctx, &args.path, &text, &updated).await?;
        ws.replace(&args.path, updated.clone().into_bytes()).await?;
        Ok(ToolOutput::text(describe_edit(
            &args.path,
            &updated,
            at,
            args.new.len(),
        )))
    }
}

/// The path as the test-file rules see it: relative to the project root.
pub(super) fn project_relative(path: &str) -> &str {
    path.trim_start_matches("./").trim_start_matches("/workspace/")
}

pub(super) async fn approve(
    ctx: &ToolContext<'_>,
    path: &str,
    before: &str,
    after: &str,
) -> Result<(), ToolError> {
    let Some(approver) = ctx.approver else {
        return Ok(());
    };
    let diff = unified_diff(path, before, after);
    match approver
        .decide(&Approval::Edit {
            path: path.to_string(),
            diff,
        })
        .await
    {
        super::Decision::Allow => Ok(()),
        super::Decision::Decline { why } => Err(super::declined(
            format!("the user declined this edit to {path}"),
            why,
        )),
    }
}

pub fn unified_diff(path: &str, before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

/// The byte offset of the one occurrence of `old`, or an error naming how many there are.
/// Overlapping occurrences count: "aa" in "aaa" is ambiguous.
pub fn find_exactly_once(text: &str, old: &str, path: &str) -> Result<usize, super::ToModel> {
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(old) {
        starts.push(from + i);
        from += i + old[..].chars().next().map_or(1, char::len_utf8);
        if starts.len() > 50 {
            break;
        }
    }
    match starts.as_slice() {
        [one] => Ok(*one),
        [] => {
            let hint = if text.contains(old.trim()) && !old.trim().is_empty() {
                " (it does appear once leading/trailing whitespace is ignored: check the indentation)"
                    .to_string()
            } else {
                closest_line(text, old).unwrap_or_default()
            };
            Err(super::ToModel(format!(
                "`old` was found 0 times in {path}. It must match the file exactly, including \
                 whitespace and quotes; copy it from read_file's output (without the line numbers).{hint}"
            )))
        }
        many => {
            let lines: Vec<String> = many
                .iter()
                .take(10)
                .map(|&i| (line_of(text, i)).to_string())
                .collect();
            Err(super::ToModel(format!(
                "`old` was found {} times in {path} (at lines {}); include more surrounding lines so it \
                 matches exactly once.",
                if many.len() > 50 {
                    "more than 50".to_string()
                } else {
                    many.len().to_string()
                },
                lines.join(", ")
            )))
        }
    }
}

/// Where the file has something like the first line of `old`: models that copy code drop a
/// docstring or swap quote characters, and then need to see the file's own line.
fn closest_line(text: &str, old: &str) -> Option<String> {
    let norm = |l: &str| {
        l.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('\'', "\"")
    };
    let want = norm(old.lines().find(|l| !l.trim().is_empty())?);
    if want.len() < 4 {
        return None;
    }
    let (n, ratio) = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            (
                i,
                similar::TextDiff::from_chars(want.as_str(), norm(l).as_str()).ratio(),
            )
        })
        .max_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))?;
    if ratio < 0.6 {
        return None;
    }
    let lines: Vec<&str> = text.lines().collect();
    let shown: Vec<String> = (n.saturating_sub(1)..(n + 3).min(lines.len()))
        .map(|i| format!("{:>6}\t{}", i + 1, lines[i]))
        .collect();
    Some(format!(
        "\nThe closest text in the file is at line {}:\n{}",
        n + 1,
        shown.join("\n")
    ))
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

/// "edited PATH" and the changed region with line numbers, so the model sees the result.
fn describe_edit(path: &str, updated: &str, at: usize, new_len: usize) -> String {
    let first = line_of(updated, at);
    let last = line_of(
        updated,
        at + new_len.saturating_sub(1).min(updated.len().saturating_sub(at)),
    );
    let lines: Vec<&str> = updated.lines().collect();
    let from = first.saturating_sub(3).max(1);
    let to = (last + 3).min(lines.len()).min(from + 40);
    let mut out = format!("edited {path}; lines {from}-{to} now read:\n");
    for n in from..=to {
        if let Some(l) = lines.get(n - 1) {
            out.push_str(&format!("{n:>6}\t{l}\n"));
        }
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_once_or_an_error_naming_the_count() {
        assert_eq!(find_exactly_once("a = 1\nb = 2\n", "b = 2", "f.py"), Ok(6));
        let zero = find_exactly_once("a = 1\n", "c = 3", "f.py").unwrap_err();
        assert!(zero.starts_with("`old` was found 0 times in f.py."), "{zero}");
        let two = find_exactly_once("x = 1\nx = 1\n", "x = 1", "f.py").unwrap_err();
        assert!(
            two.starts_with("`old` was found 2 times in f.py (at lines 1, 2)"),
            "{two}"
        );
        assert!(
            find_exactly_once("aaa", "aa", "f")
                .unwrap_err()
                .contains("2 times"),
            "overlaps count"
        );
        let ws = find_exactly_once("    return x\n", "  return x  ", "f").unwrap_err();
        assert!(ws.contains("check the indentation"), "{ws}");
        let quotes = find_exactly_once(
            "a = 1\n    counts[entry[\"status\"]] += 1\nb = 2\n",
            "counts[entry['status']] += 1",
            "f",
        )
        .unwrap_err();
        assert!(quotes.contains("closest text in the file is at line 2:\n     1\ta = 1\n     2\t    counts[entry[\"status\"]] += 1"), "{quotes}");
        assert_eq!(find_exactly_once("é = 1; é = 2", "é = 2", "f"), Ok(8));
    }

    #[test]
    fn the_result_shows_the_edited_lines() {
        let text = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let at = text.find("d").unwrap();
        let d = describe_edit("f.txt", text, at, 1);
        assert_eq!(
            d,
            "edited f.txt; lines 1-7 now read:\n     1\ta\n     2\tb\n     3\tc\n     4\td\n     5\te\n     6\tf\n     7\tg"
        );
    }

    #[test]
    fn diffs_are_unified() {
        let d = unified_diff("a.py", "x = 1\n", "x = 2\n");
        assert!(
            d.contains("--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"),
            "{d}"
        );
    }
}
