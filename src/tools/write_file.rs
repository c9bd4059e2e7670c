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
            && crate::project::test_code_changed(
                rel,
                before.as_deref().map(str::as_bytes),
                Some(args.content.as_bytes()),
            )
        {
            return Err(ToolError::RespondToModel(format!(
                "this changes test code in {} (a #[cfg(test)] module or a #[test] function), and the \
                 tests are the specification: leave them as they are and change the code under test \
                 instead",
                args.path
            )));
        }
        let old = before.as_deref().unwrap_or("");
        if let Some(before) = &before
            && let Some(why) = destroys(rel, before, &args.content, s.removal_asked)
        {
            return Err(ToolError::RespondToModel(why));
        }
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

/// Why writing `new` over `old` (the file `path`) would destroy the file rather than change it,
/// in words the model can act on; `None` when it is a rewrite. Three shapes, each what a 1.5B
/// model wrote in the loop: only the file's name as its content, `read_file`'s numbered lines
/// pasted back, and a fragment that drops most of the file's top-level definitions (unless the
/// task asked for removals, `removal_asked`).
pub fn destroys(path: &str, old: &str, new: &str, removal_asked: bool) -> Option<String> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let bare = new.trim().trim_matches(|c| "`'\"".contains(c)).trim();
    if !old.trim().is_empty() && (bare == path || bare == name) {
        return Some(format!(
            "`content` is only the file's name, not its content: write_file replaces the whole of {path} \
             with `content`. Pass the complete new file as `content` — every line of it, the changed \
             ones included."
        ));
    }
    if numbered(new) && !numbered(old) {
        return Some(format!(
            "`content` has read_file's line numbers at the start of its lines; they are not part of \
             {path}. Pass the file's lines without the numbers and the tab after them."
        ));
    }
    if removal_asked {
        return None;
    }
    let (Some(before), Some(after)) = (
        crate::project::defs::top_level(path, old),
        crate::project::defs::top_level(path, new),
    ) else {
        return None;
    };
    let lost: Vec<&String> = before.iter().filter(|d| !after.contains(d)).collect();
    // "Most": more than half of them, and at least one.
    if lost.is_empty() || lost.len() * 2 <= before.len() {
        return None;
    }
    let names = lost
        .iter()
        .take(8)
        .map(|d| format!("`{d}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let more = if lost.len() > 8 {
        format!(" and {} more", lost.len() - 8)
    } else {
        String::new()
    };
    Some(format!(
        "not written: this would delete {names}{more} ({} of the {} top-level definitions of {path}); \
         write_file replaces the whole file, so `content` must be the complete file with your change \
         in it. Read it with read_file, then pass every line of it, with only the lines you mean to \
         change changed.",
        lost.len(),
        before.len()
    ))
}

/// Whether most of the lines of `text` start the way `read_file` numbers them (`   12\t`), or
/// as a model copies that (`12: `, `12 | `).
fn numbered(text: &str) -> bool {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() < 2 {
        return false;
    }
    let numbered = lines
        .iter()
        .filter(|l| {
            let t = l.trim_start();
            let digits = t.chars().take_while(char::is_ascii_digit).count();
            digits > 0 && {
                let rest = &t[digits..];
                rest.starts_with('\t')
                    || rest.starts_with(": ")
                    || rest.starts_with(" | ")
                    || rest.starts_with("| ")
            }
        })
        .count();
    numbered * 5 >= lines.len() * 4
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

    const LIB: &str = "DAILY = 25\n\n\ndef days_late(due, returned):\n    return max((returned - due).days + 1, 0)\n\n\ndef late_fee(due, returned, member=False):\n    fee = days_late(due, returned) * DAILY\n    if member:\n        fee = fee / 2\n    return fee\n";

    #[test]
    fn a_name_numbered_lines_or_a_fragment_is_refused_a_rewrite_is_not() {
        let name = destroys("library.py", LIB, "library.py", false).unwrap();
        assert!(name.contains("only the file's name"), "{name}");
        assert!(destroys("src/library.py", LIB, "`library.py`\n", false).is_some());
        let pasted: String = LIB
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{:>6}\t{l}\n", i + 1))
            .collect();
        let numbered = destroys("library.py", LIB, &pasted, false).unwrap();
        assert!(numbered.contains("line numbers"), "{numbered}");
        let fragment = destroys("library.py", LIB, "fee = 37\n", false).unwrap();
        assert!(
            fragment
                .contains("would delete `DAILY`, `days_late`, `late_fee` (3 of the 3 top-level definitions"),
            "{fragment}"
        );
        // The file from one function on (the model's other habit) drops two of three.
        let from_late_fee = &LIB[LIB.find("def late_fee").unwrap()..];
        assert!(destroys("library.py", LIB, from_late_fee, false).is_some());
        // One function of three removed is not most.
        let without_one = LIB.replace(
            "def days_late(due, returned):\n    return max((returned - due).days + 1, 0)\n",
            "",
        );
        assert_eq!(destroys("library.py", LIB, &without_one, false), None);
        // The fix itself, and the fragment when the task asked for removals.
        let fixed = LIB.replace("fee / 2", "fee // 2");
        assert_eq!(destroys("library.py", LIB, &fixed, false), None);
        assert_eq!(destroys("library.py", LIB, "fee = 37\n", true), None);
        // A language it does not read, and a new file, lose nothing.
        assert_eq!(destroys("notes.txt", "a\nb\n", "c\n", false), None);
    }

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
