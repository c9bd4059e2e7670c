//! Anthropic Messages API: `POST {base}/v1/messages`.

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::retry::post_json;
use super::{
    Block, HttpSettings, Message, ModelClient, ModelError, Request, Role, StopReason, ToolArgs, ToolCall,
    ToolChoice, Turn, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
const API_VERSION: &str = "2023-06-01";

pub struct Anthropic {
    settings: HttpSettings,
    client: reqwest::Client,
    url: String,
}

impl Anthropic {
    pub fn new(settings: HttpSettings) -> Result<Self, ModelError> {
        if settings.api_key.as_deref().is_none_or(str::is_empty) {
            return Err(ModelError::Config(
                "the anthropic provider needs ANTHROPIC_API_KEY".into(),
            ));
        }
        // The SDKs' convention: the base URL has no /v1.
        let url = format!("{}/v1/messages", settings.base_url.trim_end_matches('/'));
        Ok(Anthropic {
            client: super::http_client(settings.request_timeout)?,
            settings,
            url,
        })
    }

    fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut h = HeaderMap::new();
        let key = self.settings.api_key.as_deref().unwrap_or_default();
        let mut value = HeaderValue::from_str(key)
            .map_err(|_| ModelError::Config("ANTHROPIC_API_KEY is not a valid header value".into()))?;
        // Sensitive values are never printed by the HTTP stack's debug output.
        value.set_sensitive(true);
        h.insert("x-api-key", value);
        h.insert("anthropic-version", HeaderValue::from_static(API_VERSION));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(h)
    }
}

/// The request body. Cache breakpoints on the tool definitions, the system prompt and the
/// newest message: an agent resends the whole conversation every step.
pub fn request_body(model: &str, req: &Request) -> Value {
    let ephemeral = json!({"type": "ephemeral"});
    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
        .collect();
    if let Some(last) = tools.last_mut() {
        last["cache_control"] = ephemeral.clone();
    }
    let mut messages: Vec<Value> = req.messages.iter().filter_map(message).collect();
    if let Some(last) = messages
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
    {
        last["cache_control"] = ephemeral.clone();
    }
    let mut body = json!({
        "model": model,
        "max_tokens": req.max_tokens,
        "system": [{"type": "text", "text": req.system, "cache_control": ephemeral}],
        "messages": messages,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
        body["tool_choice"] = match req.tool_choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::Required => json!({"type": "any"}),
        };
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    body
}

fn message(m: &Message) -> Option<Value> {
    let content: Vec<Value> = m
        .content
        .iter()
        .filter_map(|b| match b {
            // The API refuses empty text blocks.
            Block::Text { text } if text.trim().is_empty() => None,
            Block::Text { text } => Some(json!({"type": "text", "text": text})),
            Block::ToolCall(c) => Some(
                json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments.to_object()}),
            ),
            Block::ToolResult(r) => Some(json!({
                "type": "tool_result",
                "tool_use_id": r.call_id,
                "content": if r.content.is_empty() { "(no output)" } else { r.content.as_str() },
                "is_error": r.is_error,
            })),
        })
        .collect();
    if content.is_empty() {
        return None;
    }
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    Some(json!({"role": role, "content": content}))
}

pub fn parse_response(body: &[u8]) -> Result<Turn, ModelError> {
    let bad = |message: String| ModelError::BadResponse {
        provider: "anthropic",
        message,
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON ({e})")))?;
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no content array".into()))?;
    let mut content = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => content.push(Block::Text {
                text: b["text"].as_str().unwrap_or_default().to_string(),
            }),
            Some("tool_use") => {
                let id = b["id"]
                    .as_str()
                    .ok_or_else(|| bad("tool_use without an id".into()))?;
                let name = b["name"]
                    .as_str()
                    .ok_or_else(|| bad("tool_use without a name".into()))?;
                content.push(Block::ToolCall(ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: ToolArgs::Json(b.get("input").cloned().unwrap_or(json!({}))),
                }));
            }
            // Thinking and other blocks are not part of the conversation we keep.
            _ => {}
        }
    }
    let stop = match v.get("stop_reason").and_then(Value::as_str) {
        Some("end_turn") | Some("stop_sequence") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::Other("none".into()),
    };
    let u = &v["usage"];
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let usage = Usage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_read_tokens: n("cache_read_input_tokens"),
        cache_write_tokens: n("cache_creation_input_tokens"),
    };
    Ok(Turn { content, stop, usage })
}

#[async_trait]
impl ModelClient for Anthropic {
    fn describe(&self) -> String {
        format!("anthropic {}", self.settings.model)
    }

    fn model(&self) -> &str {
        &self.settings.model
    }

    async fn complete(&self, request: &Request) -> Result<Turn, ModelError> {
        let body = request_body(&self.settings.model, request);
        let bytes = post_json(
            "anthropic",
            &self.client,
            &self.url,
            self.headers()?,
            &body,
            &self.settings.retry,
            self.settings.on_retry.as_ref(),
        )
        .await?;
        parse_response(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ToolResult, ToolSpec};

    fn request() -> Request {
        Request {
            system: "be careful".into(),
            messages: vec![
                Message::user_text("fix it"),
                Message::assistant(vec![
                    Block::Text { text: "".into() },
                    Block::ToolCall(ToolCall {
                        id: "toolu_1".into(),
                        name: "read_file".into(),
                        arguments: ToolArgs::Json(json!({"path": "a.py"})),
                    }),
                ]),
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult(ToolResult {
                        call_id: "toolu_1".into(),
                        content: "1 x".into(),
                        is_error: false,
                    })],
                },
            ],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Read".into(),
                input_schema: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Required,
            temperature: Some(0.0),
            max_tokens: 1000,
        }
    }

    #[test]
    fn the_request_has_cache_breakpoints_and_no_empty_text() {
        let body = request_body("claude-x", &request());
        assert_eq!(body["tools"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(body["tool_choice"]["type"], "any");
        let assistant = &body["messages"][1]["content"];
        assert_eq!(assistant.as_array().unwrap().len(), 1, "empty text dropped");
        assert_eq!(assistant[0]["type"], "tool_use");
        let result = &body["messages"][2]["content"][0];
        assert_eq!(result["tool_use_id"], "toolu_1");
        assert_eq!(result["is_error"], false);
        assert_eq!(result["cache_control"]["type"], "ephemeral");
    }

    #[test]
    fn responses_parse_into_turns() {
        let turn = parse_response(
            br#"{"content":[{"type":"text","text":"Looking."},{"type":"tool_use","id":"t1","name":"bash","input":{"command":"ls"}}],
                "stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":100}}"#,
        )
        .unwrap();
        assert_eq!(turn.stop, StopReason::ToolUse);
        assert_eq!(turn.tool_calls()[0].name, "bash");
        assert_eq!(turn.text(), "Looking.");
        assert_eq!(turn.usage.total_input(), 110);
        assert!(matches!(
            parse_response(b"{not json"),
            Err(ModelError::BadResponse { .. })
        ));
        assert!(matches!(
            parse_response(b"{}"),
            Err(ModelError::BadResponse { .. })
        ));
    }
}
