//! Tools for models without native tool calling: the tools are described in the system prompt
//! and calls are parsed from lines of the form `tool: NAME({...json...})` in the reply.
//!
//! A wrapper around any provider: the loop keeps speaking in tool calls and results, this
//! rewrites them to text on the way out and parses them back on the way in.

use async_trait::async_trait;

use super::{
    Block, Message, ModelClient, ModelError, Request, Role, StopReason, ToolArgs, ToolCall, ToolChoice, Turn,
};

pub struct TextProtocol<M> {
    inner: M,
}

impl<M: ModelClient> TextProtocol<M> {
    pub fn new(inner: M) -> Self {
        TextProtocol { inner }
    }
}

/// Appended to the system prompt.
pub(crate) fn tool_prompt(req: &Request) -> String {
    let mut s = String::from(
        "\n\n# Tools\nYou act by calling tools. To call one, write a line that starts with `tool:` \
         followed by the tool's name and its arguments as one JSON object in parentheses:\n\n\
         tool: read_file({\"path\": \"src/app.py\"})\n\n\
         Write each call on a line of its own; you may make several calls in one reply. The results \
         come back in the next message, in the same order. Do not invent results.",
    );
    s.push_str(match req.tool_choice {
        ToolChoice::Required => " When the task is done, call the finish tool.\n\nAvailable tools:\n",
        ToolChoice::Auto => " When the task is done, reply without any tool line.\n\nAvailable tools:\n",
    });
    for t in &req.tools {
        s.push_str(&format!(
            "\n## {}\n{}\nArguments (JSON schema): {}\n",
            t.name, t.description, t.input_schema
        ));
    }
    s
}

/// Every `tool:` line in `text`, parsed; malformed ones become calls with invalid arguments so
/// the model is told what was wrong.
pub fn parse_calls(text: &str, id_prefix: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let mut offset = 0;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        offset += line.len();
        i += 1;
        let trimmed = line.trim_start().trim_start_matches('`');
        let Some(rest) = trimmed.strip_prefix("tool:") else {
            continue;
        };
        let id = format!("{id_prefix}{}", calls.len() + 1);
        let rest = rest.trim_start();
        let Some(paren) = rest.find('(') else {
            calls.push(malformed(id, line.trim(), "expected `tool: NAME({...})`"));
            continue;
        };
        let name = rest[..paren].trim().to_string();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            calls.push(malformed(id, line.trim(), "expected a tool name before `(`"));
            continue;
        }
        // The JSON may run over several lines: parse one value from here on. `rest` is a slice
        // of `text`, so its offset is a pointer difference.
        let json_start = rest.as_ptr() as usize - text.as_ptr() as usize + paren + 1;
        let tail = &text[json_start..];
        let mut stream = serde_json::Deserializer::from_str(tail).into_iter::<serde_json::Value>();
        match stream.next() {
            Some(Ok(value)) => {
                let consumed = stream.byte_offset();
                let after = tail[consumed..].trim_start();
                if !after.starts_with(')') {
                    calls.push(malformed(
                        id,
                        line.trim(),
                        "expected `)` after the JSON arguments",
                    ));
                    continue;
                }
                // Skip the lines the JSON spanned.
                let end = json_start + consumed + (tail[consumed..].len() - after.len()) + 1;
                while offset < end && i < lines.len() {
                    offset += lines[i].len();
                    i += 1;
                }
                let arguments = if value.is_object() {
                    ToolArgs::Json(value)
                } else {
                    ToolArgs::Invalid {
                        raw: value.to_string(),
                        error: "the arguments must be a JSON object".into(),
                    }
                };
                calls.push(ToolCall { id, name, arguments });
            }
            Some(Err(e)) => calls.push(ToolCall {
                id,
                name,
                arguments: ToolArgs::Invalid {
                    raw: line.trim().to_string(),
                    error: e.to_string(),
                },
            }),
            None => calls.push(malformed(id, line.trim(), "no arguments after `(`")),
        }
    }
    calls
}

fn malformed(id: String, line: &str, why: &str) -> ToolCall {
    ToolCall {
        id,
        name: MALFORMED.to_string(),
        arguments: ToolArgs::Invalid {
            raw: line.to_string(),
            error: why.to_string(),
        },
    }
}

/// Name given to a `tool:` line that could not be parsed at all.
pub const MALFORMED: &str = "<malformed tool line>";

/// The conversation as plain text: calls stay in the assistant's text, results become text.
fn to_text_messages(messages: &[Message]) -> Vec<Message> {
    messages
        .iter()
        .map(|m| {
            let mut parts = Vec::new();
            let mut n = 0;
            for b in &m.content {
                match b {
                    Block::Text { text } => parts.push(text.clone()),
                    Block::ToolCall(_) => {}
                    Block::ToolResult(r) => {
                        n += 1;
                        let status = if r.is_error { "ERROR" } else { "ok" };
                        parts.push(format!("[result {n} ({status})]\n{}", r.content));
                    }
                }
            }
            Message {
                role: m.role,
                content: vec![Block::Text {
                    text: parts.join("\n\n"),
                }],
            }
        })
        .collect()
}

#[async_trait]
impl<M: ModelClient> ModelClient for TextProtocol<M> {
    fn describe(&self) -> String {
        format!("{} (text tool protocol)", self.inner.describe())
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn estimated_usage(&self) -> bool {
        self.inner.estimated_usage()
    }

    async fn complete(&self, request: &Request) -> Result<Turn, ModelError> {
        let inner_req = Request {
            system: format!("{}{}", request.system, tool_prompt(request)),
            messages: to_text_messages(&request.messages),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            temperature: request.temperature,
            max_tokens: request.max_tokens,
        };
        let mut turn = self.inner.complete(&inner_req).await?;
        let text = turn.text();
        let step = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count()
            + 1;
        let calls = parse_calls(&text, &format!("text_{step}_"));
        // Keep the model's own words (with its tool lines) as the assistant's text.
        turn.content = vec![Block::Text { text }];
        if !calls.is_empty() {
            turn.stop = StopReason::ToolUse;
            turn.content.extend(calls.into_iter().map(Block::ToolCall));
        }
        Ok(turn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_one_line_and_multi_line_calls() {
        let text = "I will read it.\ntool: read_file({\"path\": \"a.py\"})\n  tool: edit_file({\n  \"path\": \"a.py\",\n  \"old\": \"x)\",\n  \"new\": \"y\"\n})\nThen test.\ntool: run_tests({})";
        let calls = parse_calls(text, "t");
        let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["read_file", "edit_file", "run_tests"]);
        assert_eq!(
            calls[1].arguments,
            ToolArgs::Json(json!({"path": "a.py", "old": "x)", "new": "y"}))
        );
        assert_eq!(calls[2].id, "t3");
    }

    #[test]
    fn malformed_lines_become_explained_errors() {
        let calls = parse_calls(
            "tool: read_file({\"path\": )\ntool: oops\ntool: bash(\"ls\")\nno tool here",
            "t",
        );
        assert_eq!(calls.len(), 3);
        assert!(matches!(&calls[0].arguments, ToolArgs::Invalid { .. }));
        assert_eq!(calls[1].name, MALFORMED);
        assert!(
            matches!(&calls[2].arguments, ToolArgs::Invalid { error, .. } if error.contains("JSON object"))
        );
        assert!(parse_calls("Nothing to do.", "t").is_empty());
    }

    #[test]
    fn results_are_rendered_as_text() {
        let msgs = to_text_messages(&[Message {
            role: Role::User,
            content: vec![Block::ToolResult(crate::ToolResult {
                call_id: "t1".into(),
                content: "boom".into(),
                is_error: true,
            })],
        }]);
        assert_eq!(msgs[0].text(), "[result 1 (ERROR)]\nboom");
    }
}
