//! OpenAI-compatible Chat Completions: `POST {base}/chat/completions`. OpenAI itself, and local
//! servers that speak the same API (Ollama, llama.cpp's server, vLLM).

use std::collections::HashSet;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};

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

pub fn request_body(model: &str, req: &Request, official: bool) -> Value {
    let mut messages = vec![json!({"role": "system", "content": req.system})];
    for m in &req.messages {
        match m.role {
            Role::Assistant => {
                let text = m.text();
                let calls: Vec<Value> = m
                    .tool_calls()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments.to_json_text()}})
                    })
                    .collect();
                let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                messages.push(msg);
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
                        messages.push(json!({"role": "tool", "tool_call_id": r.call_id, "content": content}));
                    }
                }
                let text = m.text();
                if !text.is_empty() {
                    messages.push(json!({"role": "user", "content": text}));
                }
            }
        }
    }
    let mut body = json!({"model": model, "messages": messages});
    body[if official {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }] = json!(req.max_tokens);
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}))
            .collect();
        body["tool_choice"] = json!(match req.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::Required => "required",
        });
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    body
}

pub fn parse_response(body: &[u8]) -> Result<Turn, ModelError> {
    let bad = |message: String| ModelError::BadResponse {
        provider: "openai",
        message,
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON ({e})")))?;
    let choice = v.pointer("/choices/0").ok_or_else(|| bad("no choices".into()))?;
    let msg = choice
        .get("message")
        .ok_or_else(|| bad("no message in the choice".into()))?;
    let mut content = Vec::new();
    if let Some(text) = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(Block::Text {
            text: text.to_string(),
        });
    }
    let mut seen = HashSet::new();
    for (i, c) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("tool call without a name".into()))?;
        // Some local servers send no ids, or repeat them; every call needs its own.
        let mut id = c
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if id.is_empty() || !seen.insert(id.clone()) {
            id = format!("call_{i}");
            seen.insert(id.clone());
        }
        let arguments = match c.pointer("/function/arguments") {
            Some(Value::String(s)) => ToolArgs::parse(s),
            Some(obj @ Value::Object(_)) => ToolArgs::Json(obj.clone()),
            _ => ToolArgs::Json(json!({})),
        };
        content.push(Block::ToolCall(ToolCall {
            id,
            name: name.to_string(),
            arguments,
        }));
    }
    let stop = match choice.get("finish_reason").and_then(Value::as_str) {
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::Other("none".into()),
    };
    let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("/usage/prompt_tokens_details/cached_tokens");
    let usage = Usage {
        input_tokens: n("/usage/prompt_tokens").saturating_sub(cached),
        output_tokens: n("/usage/completion_tokens"),
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
        let bytes = post_json(
            "openai",
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
    use crate::model::{Message, ToolResult, ToolSpec};

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
        let body = request_body("m", &req, false);
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
        assert!(
            request_body("m", &req, true)
                .get("max_completion_tokens")
                .is_some()
        );
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
