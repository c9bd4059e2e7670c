//! OpenAI-compatible Chat Completions: `POST {base}/chat/completions`. OpenAI itself, and local
//! servers that speak the same API (Ollama, llama.cpp's server, vLLM).

use std::collections::HashSet;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::retry::post_json;
use super::{
    Block, HttpSettings, ModelClient, ModelError, Request, Role, StopReason, ToolArgs, ToolCall, ToolChoice,
    Turn, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_MODEL: &str = "gpt-4.1";

pub struct OpenAi {
    settings: HttpSettings,
    client: reqwest::Client,
    url: String,
}

impl OpenAi {
    pub fn new(settings: HttpSettings) -> Result<Self, ModelError> {
        // The base includes /v1, as in the OpenAI SDKs' OPENAI_BASE_URL.
        let url = format!("{}/chat/completions", settings.base_url.trim_end_matches('/'));
        Ok(OpenAi {
            client: super::http_client(settings.request_timeout)?,
            settings,
            url,
        })
    }

    fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // Optional: local servers take no key.
        if let Some(key) = self.settings.api_key.as_deref().filter(|k| !k.is_empty()) {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| ModelError::Config("OPENAI_API_KEY is not a valid header value".into()))?;
            value.set_sensitive(true);
            h.insert(AUTHORIZATION, value);
        }
        Ok(h)
    }

    /// OpenAI's own newer models take `max_completion_tokens`; compatible servers `max_tokens`.
    fn official(&self) -> bool {
        self.url.starts_with(DEFAULT_BASE_URL)
    }
}

/// The request body, as the API defines it: a misspelt field does not compile.
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    /// OpenAI's own newer models take `max_completion_tokens`; compatible servers `max_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: String,
    },
    Assistant {
        /// `null` when the turn is only tool calls.
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

#[derive(Debug, Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    /// The model's own text, sent back verbatim (even when it was not valid JSON).
    arguments: String,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

pub(crate) fn request_body<'a>(model: &'a str, req: &'a Request, official: bool) -> Body<'a> {
    let mut messages = vec![WireMessage::System { content: &req.system }];
    for m in &req.messages {
        match m.role {
            Role::Assistant => {
                let text = m.text();
                let tool_calls = m
                    .tool_calls()
                    .map(|c| WireCall {
                        id: &c.id,
                        kind: "function",
                        function: WireFunctionCall {
                            name: &c.name,
                            arguments: c.arguments.to_json_text(),
                        },
                    })
                    .collect();
                messages.push(WireMessage::Assistant {
                    content: (!text.is_empty()).then_some(text),
                    tool_calls,
                });
            }
            Role::User => {
                // Tool results are messages of their own; any text follows them.
                for b in &m.content {
                    if let Block::ToolResult(r) = b {
                        let content = if r.is_error {
                            format!("ERROR: {}", r.content)
                        } else {
                            r.content.clone()
                        };
                        messages.push(WireMessage::Tool {
                            tool_call_id: &r.call_id,
                            content,
                        });
                    }
                }
                let text = m.text();
                if !text.is_empty() {
                    messages.push(WireMessage::User { content: text });
                }
            }
        }
    }
    let tools: Vec<WireTool> = req
        .tools
        .iter()
        .map(|t| WireTool {
            kind: "function",
            function: WireFunction {
                name: &t.name,
                description: &t.description,
                parameters: &t.input_schema,
            },
        })
        .collect();
    let tool_choice = (!tools.is_empty()).then_some(match req.tool_choice {
        ToolChoice::Auto => "auto",
        ToolChoice::Required => "required",
    });
    Body {
        model,
        messages,
        max_tokens: (!official).then_some(req.max_tokens),
        max_completion_tokens: official.then_some(req.max_tokens),
        tools,
        tool_choice,
        temperature: req.temperature,
    }
}

#[derive(Debug, Deserialize)]
struct WireResponse {
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Debug, Deserialize)]
struct WireChoice {
    message: WireReply,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireReply {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireReplyCall>,
}

#[derive(Debug, Deserialize)]
struct WireReplyCall {
    #[serde(default)]
    id: Option<String>,
    function: WireReplyFunction,
}

#[derive(Debug, Deserialize)]
struct WireReplyFunction {
    name: String,
    /// A JSON string per the API; some local servers send the object itself.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
}

#[derive(Debug, Default, Deserialize)]
struct WirePromptDetails {
    #[serde(default)]
    cached_tokens: u64,
}

pub fn parse_response(body: &[u8]) -> Result<Turn, ModelError> {
    let bad = |message: String| ModelError::BadResponse {
        provider: "openai",
        message,
    };
    let v: WireResponse =
        serde_json::from_slice(body).map_err(|e| bad(super::body_error("a chat completion", &e)))?;
    let choice = v
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| bad("no choices".into()))?;
    let mut content = Vec::new();
    if let Some(text) = choice.message.content.filter(|t| !t.is_empty()) {
        content.push(Block::Text { text });
    }
    let mut seen = HashSet::new();
    for (i, c) in choice.message.tool_calls.into_iter().enumerate() {
        // Some local servers send no ids, or repeat them; every call needs its own.
        let mut id = c.id.unwrap_or_default();
        if id.is_empty() || !seen.insert(id.clone()) {
            id = format!("call_{i}");
            seen.insert(id.clone());
        }
        let arguments = match c.function.arguments {
            Some(Value::String(s)) => ToolArgs::parse(&s),
            Some(obj @ Value::Object(_)) => ToolArgs::Json(obj),
            _ => ToolArgs::Json(Value::Object(Default::default())),
        };
        content.push(Block::ToolCall(ToolCall {
            id,
            name: c.function.name,
            arguments,
        }));
    }
    let stop = match choice.finish_reason.as_deref() {
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::Other("none".into()),
    };
    let cached = v.usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    let usage = Usage {
        input_tokens: v.usage.prompt_tokens.saturating_sub(cached),
        output_tokens: v.usage.completion_tokens,
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    };
    Ok(Turn { content, stop, usage })
}

#[async_trait]
impl ModelClient for OpenAi {
    fn describe(&self) -> String {
        format!(
            "openai-compatible {} at {}",
            self.settings.model, self.settings.base_url
        )
    }

    fn model(&self) -> &str {
        &self.settings.model
    }

    async fn complete(&self, request: &Request) -> Result<Turn, ModelError> {
        let body = request_body(&self.settings.model, request, self.official());
        let sent = post_json(
            "openai",
            &self.client,
            &self.url,
            self.headers()?,
            &body,
            &self.settings.retry,
            self.settings.on_retry.as_ref(),
        )
        .await;
        crate::html::read_answer("openai", &self.settings.base_url, true, sent, parse_response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, ToolResult, ToolSpec};
    use serde_json::json;

    #[test]
    fn tool_results_become_tool_messages() {
        let req = Request {
            system: "sys".into(),
            messages: vec![
                Message::user_text("task"),
                Message::assistant(vec![Block::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "bash".into(),
                    arguments: ToolArgs::parse("{\"command\": "),
                })]),
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult(ToolResult {
                        call_id: "c1".into(),
                        content: "bad json".into(),
                        is_error: true,
                    })],
                },
            ],
            tools: vec![ToolSpec {
                name: "bash".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Required,
            temperature: None,
            max_tokens: 100,
        };
        let body = serde_json::to_value(request_body("m", &req, false)).unwrap();
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs[0]["role"], "system");
        assert_eq!(msgs[2]["content"], Value::Null);
        assert_eq!(
            msgs[2]["tool_calls"][0]["function"]["arguments"], "{\"command\": ",
            "sent back verbatim"
        );
        assert_eq!(
            msgs[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "ERROR: bad json"})
        );
        assert_eq!(body["tool_choice"], "required");
        assert_eq!(body["max_tokens"], 100);
        let official = serde_json::to_value(request_body("m", &req, true)).unwrap();
        assert_eq!(official["max_completion_tokens"], 100);
        assert!(official.get("max_tokens").is_none());
    }

    #[test]
    fn responses_parse_with_missing_or_repeated_ids() {
        let turn = parse_response(
            br#"{"choices":[{"message":{"content":null,"tool_calls":[
                {"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}},
                {"id":"x","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b\"}"}},
                {"id":"x","type":"function","function":{"name":"bash","arguments":"{oops"}}]},
                "finish_reason":"tool_calls"}],
                "usage":{"prompt_tokens":50,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":20}}}"#,
        )
        .unwrap();
        let calls = turn.tool_calls();
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_0", "x", "call_2"]);
        assert!(matches!(calls[2].arguments, ToolArgs::Invalid { .. }));
        assert_eq!(turn.stop, StopReason::ToolUse);
        assert_eq!(
            (
                turn.usage.input_tokens,
                turn.usage.cache_read_tokens,
                turn.usage.output_tokens
            ),
            (30, 20, 7)
        );
    }
}
