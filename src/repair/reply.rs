//! A candidate's files, read from the model's reply: `write_file` calls (native tool calls, or
//! `tool: write_file({...})` lines the text protocol parsed), else fenced code blocks in the
//! text. A 1.5B model asked for whole files often answers with a fenced block and the file's
//! name above it (or in the fence's info string, or nowhere when only one file was shown).

use serde_json::Value;

use crate::model::{ToolArgs, Turn};

/// One file of a candidate: its path (relative to the project root) and whole new content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    pub path: String,
    pub content: String,
}

/// The files of a reply, or why there are none, in the reply's order: a file as often as the
/// reply gives it (a function at a time; [`super::splice::apply`] writes them over one
/// another). `shown` are the source files the prompt offered for rewriting (a block with no
/// name is the only one of them, if there is one).
pub fn writes_from_turn(turn: &Turn, shown: &[String]) -> Result<Vec<FileWrite>, String> {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for call in turn.tool_calls() {
        if call.name != "write_file" {
            problems.push(format!("a call to {} (only write_file is read)", call.name));
            continue;
        }
        match &call.arguments {
            ToolArgs::Json(Value::Object(map)) => match (map.get("path"), map.get("content")) {
                (Some(Value::String(path)), Some(Value::String(content))) => files.push(FileWrite {
                    path: normalise(path),
                    content: content.clone(),
                }),
                _ => problems.push("a write_file call without a string path and content".into()),
            },
            _ => problems.push("a write_file call whose arguments are not a JSON object".into()),
        }
    }
    if files.is_empty() {
        files = fenced_blocks(&turn.text(), shown);
    }
    if files.is_empty() {
        let why = if problems.is_empty() {
            "the reply has no write_file call and no code block naming a file".to_string()
        } else {
            problems.join("; ")
        };
        return Err(why);
    }
    Ok(files)
}

/// The path as the project sees it: `./a.py` and `/workspace/a.py` are `a.py`.
pub fn normalise(path: &str) -> String {
    let p = path.trim();
    let p = p.strip_prefix("/workspace/").unwrap_or(p);
    p.trim_start_matches("./").to_string()
}

/// Whether `token` names `path`: the path itself, or its file name when that is unambiguous
/// among `shown`.
fn names<'a>(token: &str, shown: &'a [String]) -> Option<&'a String> {
    let token = normalise(token.trim_matches(|c: char| "`*:'\"()[]#,".contains(c)));
    if token.is_empty() {
        return None;
    }
    if let Some(p) = shown.iter().find(|p| **p == token) {
        return Some(p);
    }
    let mut by_name = shown
        .iter()
        .filter(|p| p.rsplit('/').next() == Some(token.as_str()) || p.ends_with(&format!("/{token}")));
    match (by_name.next(), by_name.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

/// The first word-like token of `line` that names a shown file.
pub(crate) fn named_in(line: &str, shown: &[String]) -> Option<String> {
    line.split(|c: char| c.is_whitespace() || c == ',')
        .find_map(|t| names(t, shown))
        .cloned()
}

/// Fenced code blocks whose file can be told: from the fence's info string, the line above
/// the fence (`### a.py`, `**a.py**`, `File: a.py`), a first-line comment naming it, or, with
/// one file shown and one unnamed block, that file.
fn fenced_blocks(text: &str, shown: &[String]) -> Vec<FileWrite> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found: Vec<(Option<String>, String)> = Vec::new();
    let mut label = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        let Some(info) = line.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let fence_len = 3 + info.chars().take_while(|c| *c == '`').count();
        let info = info.trim_start_matches('`');
        let mut body = Vec::new();
        let mut j = i + 1;
        let mut closed = false;
        while j < lines.len() {
            let l = lines[j].trim_start();
            if l.starts_with(&"`".repeat(fence_len)) && l.trim_matches('`').trim().is_empty() {
                closed = true;
                break;
            }
            body.push(lines[j]);
            j += 1;
        }
        // An unclosed block at the end (a reply cut off at its limit) is not a whole file.
        if !closed {
            break;
        }
        let above = lines[..i]
            .iter()
            .rev()
            .take(2)
            .find(|l| !l.trim().is_empty())
            .copied()
            .unwrap_or("");
        // A block holding nothing but a file's name is a label, not that file's content
        // (the 1.5B model writes "```\ncounter.py\n```"): it names the next block, if any.
        if let [only] = body.as_slice()
            && let Some(path) = named_in(only, shown)
            && only.split_whitespace().count() == 1
        {
            label = Some(path);
            i = j + 1;
            continue;
        }
        let pending = label.take();
        let first_comment = body.first().and_then(|l| {
            let t = l.trim();
            (t.starts_with('#') || t.starts_with("//")).then_some(t)
        });
        let path = named_in(info, shown)
            .or_else(|| named_in(above, shown))
            .or_else(|| first_comment.and_then(|c| named_in(c, shown)))
            .or(pending);
        let mut content = body.join("\n");
        content.push('\n');
        found.push((path, content));
        i = j + 1;
    }
    let unnamed = found.iter().filter(|(p, _)| p.is_none()).count();
    found
        .into_iter()
        .filter_map(|(path, content)| match path {
            Some(path) => Some(FileWrite { path, content }),
            None if unnamed == 1 && shown.len() == 1 => Some(FileWrite {
                path: shown[0].clone(),
                content,
            }),
            None => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Block, StopReason, ToolCall, Usage};

    /// The files as repair takes them: the writes, a later one of a path over an earlier one
    /// (no file to splice into here).
    fn files_from_turn(turn: &Turn, shown: &[String]) -> Result<Vec<FileWrite>, String> {
        Ok(crate::repair::splice::apply(writes_from_turn(turn, shown)?, &|_| None).0)
    }

    fn text_turn(text: &str) -> Turn {
        Turn {
            content: vec![Block::Text { text: text.into() }],
            stop: StopReason::EndTurn,
            usage: Usage::default(),
        }
    }

    fn shown() -> Vec<String> {
        vec!["counter.py".into(), "pkg/util.py".into()]
    }

    #[test]
    fn write_file_calls_are_the_files() {
        let turn = Turn {
            content: vec![Block::ToolCall(ToolCall {
                id: "1".into(),
                name: "write_file".into(),
                arguments: ToolArgs::Json(serde_json::json!({"path": "./counter.py", "content": "x = 1\n"})),
            })],
            stop: StopReason::ToolUse,
            usage: Usage::default(),
        };
        assert_eq!(
            files_from_turn(&turn, &shown()).unwrap(),
            [FileWrite {
                path: "counter.py".into(),
                content: "x = 1\n".into()
            }]
        );
    }

    #[test]
    fn fenced_blocks_are_read_by_the_name_above_in_the_fence_or_in_a_comment() {
        let reply = "Here is the fix.\n\n### counter.py\n```python\ndef f():\n    return 2\n```\n\n```python pkg/util.py\nY = 3\n```\n";
        let files = files_from_turn(&text_turn(reply), &shown()).unwrap();
        assert_eq!(files.len(), 2, "{files:?}");
        assert_eq!(files[0].path, "counter.py");
        assert_eq!(files[0].content, "def f():\n    return 2\n");
        assert_eq!(files[1].path, "pkg/util.py");
        let comment = "```python\n# util.py\nY = 4\n```";
        let files = files_from_turn(&text_turn(comment), &shown()).unwrap();
        assert_eq!(files[0].path, "pkg/util.py");
        assert_eq!(files[0].content, "# util.py\nY = 4\n");
    }

    #[test]
    fn one_unnamed_block_is_the_one_file_shown_and_otherwise_nothing() {
        let reply = "```\nx = 2\n```";
        let one = vec!["a.py".to_string()];
        assert_eq!(files_from_turn(&text_turn(reply), &one).unwrap()[0].path, "a.py");
        let err = files_from_turn(&text_turn(reply), &shown()).unwrap_err();
        assert!(err.contains("no write_file call"), "{err}");
        // Cut off: not a whole file.
        assert!(files_from_turn(&text_turn("```python\nx = 2\n"), &one).is_err());
        assert!(files_from_turn(&text_turn("I cannot help."), &one).is_err());
    }

    #[test]
    fn a_block_holding_only_a_file_name_is_a_label_not_the_file() {
        let one = vec!["counter.py".to_string()];
        let err = files_from_turn(&text_turn("```\ncounter.py\n```"), &one).unwrap_err();
        assert!(err.contains("no write_file call"), "{err}");
        let labelled = "```\npkg/util.py\n```\n\n```python\nY = 5\n```\n";
        let files = files_from_turn(&text_turn(labelled), &shown()).unwrap();
        assert_eq!(
            files,
            [FileWrite {
                path: "pkg/util.py".into(),
                content: "Y = 5\n".into()
            }]
        );
    }
}
