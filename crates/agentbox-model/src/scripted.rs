//! The scripted provider: replays assistant turns from a JSON file, for demos, tests and load
//! tests. It never sees the conversation's content beyond counting it.
//!
//! ```json
//! {"turns": [
//!   {"text": "Let me look.", "tool_calls": [{"name": "list_files", "arguments": {}}]},
//!   {"tool_calls": [{"name": "read_file", "arguments": {"path": "app.py"}}]},
//!   {"text": "Done: fixed the off-by-one."}
//! ]}
//! ```
//! A top-level array of turns works too. `arguments` given as a JSON *string* is sent as the
//! raw argument text (to replay a model that sends malformed JSON).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::{Block, ModelClient, ModelError, Request, StopReason, ToolArgs, ToolCall, Turn, Usage};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptTurn {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
    /// Pretend the reply was cut off ("max_tokens") or another stop reason.
    #[serde(default)]
    pub stop: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptFile {
    Turns(Vec<ScriptTurn>),
    Object { turns: Vec<ScriptTurn> },
}

pub struct Scripted {
    turns: Vec<ScriptTurn>,
    next: AtomicUsize,
    name: String,
}

impl Scripted {
    pub fn from_json(text: &str, name: &str) -> Result<Self, ModelError> {
        let file: ScriptFile =
            serde_json::from_str(text).map_err(|e| ModelError::Config(format!("script {name}: {e}")))?;
        let turns = match file {
            ScriptFile::Turns(t) | ScriptFile::Object { turns: t } => t,
        };
        if turns.is_empty() {
            return Err(ModelError::Config(format!("script {name} has no turns")));
        }
        Ok(Scripted {
            turns,
            next: AtomicUsize::new(0),
            name: name.to_string(),
        })
    }

    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ModelError::Config(format!("cannot read script {}: {e}", path.display())))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        Self::from_json(&text, &name)
    }

    pub fn len(&self) -> usize {
        self.turns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

/// About four characters a token: what the estimates in the report are based on.
fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[async_trait]
impl ModelClient for Scripted {
    fn describe(&self) -> String {
        format!("scripted replay of {} ({} turns)", self.name, self.turns.len())
    }

    fn model(&self) -> &str {
        "scripted"
    }

    fn estimated_usage(&self) -> bool {
        true
    }

    async fn complete(&self, request: &Request) -> Result<Turn, ModelError> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let turn = self.turns.get(n).ok_or_else(|| {
            ModelError::Script(format!(
                "the script {} has no turn {} (it has {})",
                self.name,
                n + 1,
                self.turns.len()
            ))
        })?;
        let mut content = Vec::new();
        if let Some(text) = &turn.text {
            content.push(Block::Text { text: text.clone() });
        }
        for (i, c) in turn.tool_calls.iter().enumerate() {
            let arguments = match &c.arguments {
                None => ToolArgs::Json(Value::Object(Default::default())),
                Some(Value::String(raw)) => ToolArgs::parse(raw),
                Some(v) => ToolArgs::Json(v.clone()),
            };
            content.push(Block::ToolCall(ToolCall {
                id: c
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("script_{}_{}", n + 1, i + 1)),
                name: c.name.clone(),
                arguments,
            }));
        }
        let stop = match turn.stop.as_deref() {
            Some("max_tokens") => StopReason::MaxTokens,
            Some(other) => StopReason::Other(other.to_string()),
            None if turn.tool_calls.is_empty() => StopReason::EndTurn,
            None => StopReason::ToolUse,
        };
        let request_chars = serde_json::to_string(&request.messages)
            .map(|s| s.len())
            .unwrap_or(0)
            + request.system.len()
            + serde_json::to_string(&request.tools)
                .map(|s| s.len())
                .unwrap_or(0);
        let reply_chars = serde_json::to_string(&content).map(|s| s.len()).unwrap_or(0);
        let usage = Usage {
            input_tokens: estimate_tokens(request_chars),
            output_tokens: estimate_tokens(reply_chars),
            ..Default::default()
        };
        Ok(Turn { content, stop, usage })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolChoice;

    fn req() -> Request {
        Request {
            system: String::new(),
            messages: vec![],
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: 10,
        }
    }

    #[tokio::test]
    async fn replays_turns_in_order_then_says_it_ran_out() {
        let s = Scripted::from_json(
            r#"{"turns":[{"text":"a","tool_calls":[{"name":"bash","arguments":{"command":"ls"}},{"name":"x","arguments":"{bad"}]},{"text":"done"}]}"#,
            "t.json",
        )
        .unwrap();
        let t1 = s.complete(&req()).await.unwrap();
        assert_eq!(t1.stop, StopReason::ToolUse);
        let calls = t1.tool_calls();
        assert_eq!(calls[0].id, "script_1_1");
        assert!(matches!(calls[1].arguments, ToolArgs::Invalid { .. }));
        let t2 = s.complete(&req()).await.unwrap();
        assert_eq!(
            (t2.stop.clone(), t2.text()),
            (StopReason::EndTurn, "done".to_string())
        );
        let err = s.complete(&req()).await.unwrap_err();
        assert_eq!(err.to_string(), "the script t.json has no turn 3 (it has 2)");
    }

    #[test]
    fn bad_scripts_are_refused_with_the_reason() {
        assert!(Scripted::from_json("[]", "e").is_err());
        let err = Scripted::from_json(r#"[{"txt": "typo"}]"#, "e").err().unwrap();
        assert!(err.to_string().contains("script e"), "{err}");
    }
}
