//! Anthropic Messages API: `POST {base}/v1/messages`.

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// The request body, as the API defines it: a misspelt field does not compile.
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    model: &'a str,
    max_tokens: u32,
    system: [SystemBlock<'a>; 1],
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum CacheControl {
    Ephemeral,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum SystemBlock<'a> {
    Text {
        text: &'a str,
        cache_control: CacheControl,
    },
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireToolChoice {
    Auto,
    /// Some tool, the model's choice: what `required` means here.
    Any,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<WireBlock<'a>>,
}

#[derive(Debug, Serialize)]
struct WireBlock<'a> {
    #[serde(flatten)]
    content: WireContent<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireContent<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
}

/// The request body. Cache breakpoints on the tool definitions, the system prompt and the
/// newest message: an agent resends the whole conversation every step.
pub(crate) fn request_body<'a>(model: &'a str, req: &'a Request) -> Body<'a> {
    let mut tools: Vec<WireTool> = req
        .tools
        .iter()
        .map(|t| WireTool {
            name: &t.name,
            description: &t.description,
            input_schema: &t.input_schema,
            cache_control: None,
        })
        .collect();
    if let Some(last) = tools.last_mut() {
        last.cache_control = Some(CacheControl::Ephemeral);
    }
    let mut messages: Vec<WireMessage> = req.messages.iter().filter_map(message).collect();
    if let Some(last) = messages.last_mut().and_then(|m| m.content.last_mut()) {
        last.cache_control = Some(CacheControl::Ephemeral);
    }
    let tool_choice = (!tools.is_empty()).then_some(match req.tool_choice {
        ToolChoice::Auto => WireToolChoice::Auto,
        ToolChoice::Required => WireToolChoice::Any,
    });
    Body {
        model,
        max_tokens: req.max_tokens,
        system: [SystemBlock::Text {
            text: &req.system,
            cache_control: CacheControl::Ephemeral,
        }],
        messages,
        tools,
        tool_choice,
        temperature: req.temperature,
    }
}

fn message(m: &Message) -> Option<WireMessage<'_>> {
    let content: Vec<WireBlock> = m
        .content
        .iter()
        .filter_map(|b| match b {
            // The API refuses empty text blocks.
            Block::Text { text } if text.trim().is_empty() => None,
            Block::Text { text } => Some(WireContent::Text { text }),
            Block::ToolCall(c) => Some(WireContent::ToolUse {
                id: &c.id,
                name: &c.name,
                input: c.arguments.to_object(),
            }),
            Block::ToolResult(r) => Some(WireContent::ToolResult {
                tool_use_id: &r.call_id,
                content: if r.content.is_empty() {
                    "(no output)"
                } else {
                    &r.content
                },
                is_error: r.is_error,
            }),
        })
        .map(|content| WireBlock {
            content,
            cache_control: None,
        })
        .collect();
    if content.is_empty() {
        return None;
    }
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    Some(WireMessage { role, content })
}

#[derive(Debug, Deserialize)]
struct WireResponse {
    content: Vec<ResponseBlock>,
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Option<Value>,
    },
    /// Thinking and other blocks are not part of the conversation we keep.
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

pub fn parse_response(body: &[u8]) -> Result<Turn, ModelError> {
    let v: WireResponse = serde_json::from_slice(body).map_err(|e| ModelError::BadResponse {
        provider: "anthropic",
        message: super::body_error("a Messages response", &e),
    })?;
    let content = v
        .content
        .into_iter()
        .filter_map(|b| match b {
            ResponseBlock::Text { text } => Some(Block::Text { text }),
            ResponseBlock::ToolUse { id, name, input } => Some(Block::ToolCall(ToolCall {
                id,
                name,
                arguments: ToolArgs::Json(input.unwrap_or_else(|| Value::Object(Default::default()))),
            })),
            ResponseBlock::Other => None,
        })
        .collect();
    let stop = match v.stop_reason.as_deref() {
        Some("end_turn") | Some("stop_sequence") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::Other("none".into()),
    };
    let usage = Usage {
        input_tokens: v.usage.input_tokens,
        output_tokens: v.usage.output_tokens,
        cache_read_tokens: v.usage.cache_read_input_tokens,
        cache_write_tokens: v.usage.cache_creation_input_tokens,
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
        let sent = post_json(
            "anthropic",
            &self.client,
            &self.url,
            self.headers()?,
            &body,
            &self.settings.retry,
            self.settings.on_retry.as_ref(),
        )
        .await;
        crate::html::read_answer("anthropic", &self.settings.base_url, false, sent, parse_response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolResult, ToolSpec};
    use serde_json::json;

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
        let request = request();
        let body = serde_json::to_value(request_body("claude-x", &request)).unwrap();
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
        // The whole body, as the API documents it.
        assert_eq!(
            body,
            json!({
                "model": "claude-x",
                "max_tokens": 1000,
                "system": [{"type": "text", "text": "be careful", "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}
                    ]},
                    {"role": "user", "content": [{
                        "type": "tool_result", "tool_use_id": "toolu_1", "content": "1 x", "is_error": false,
                        "cache_control": {"type": "ephemeral"}
                    }]}
                ],
                "tools": [{"name": "read_file", "description": "Read", "input_schema": {"type": "object"},
                           "cache_control": {"type": "ephemeral"}}],
                "tool_choice": {"type": "any"},
                "temperature": 0.0
            })
        );
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
