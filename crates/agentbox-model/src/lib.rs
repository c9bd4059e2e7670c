//! The model seam: one request in (system, messages, tool specs), one assistant turn out.
//!
//! The provider-neutral conversation lives here and only here; each provider translates it to
//! and from its wire format.

pub mod anthropic;
mod html;
mod messages;
pub mod openai;
pub mod preflight;
pub mod pricing;
pub mod retry;
pub mod scripted;
pub mod text_protocol;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use html::{HTML_PAGE, hint_html, html_message, looks_like_html};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Block>,
}

impl Message {
    pub fn user_text(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    pub fn assistant(content: Vec<Block>) -> Self {
        Message {
            role: Role::Assistant,
            content,
        }
    }

    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolCall(c) => Some(c),
            _ => None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text { text: String },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

/// What the model asked to run. `arguments` is what it sent, parsed when it parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: ToolArgs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolArgs {
    Json(Value),
    /// Not valid JSON: kept verbatim so it can be echoed back to the provider and the model
    /// told exactly what was wrong.
    Invalid {
        raw: String,
        error: String,
    },
}

impl ToolArgs {
    /// Parse a JSON text as the providers that send arguments as a string do.
    pub fn parse(raw: &str) -> ToolArgs {
        let text = if raw.trim().is_empty() { "{}" } else { raw };
        match serde_json::from_str::<Value>(text) {
            Ok(v) => ToolArgs::Json(v),
            Err(e) => ToolArgs::Invalid {
                raw: raw.to_string(),
                error: e.to_string(),
            },
        }
    }

    /// The arguments as JSON text, for wire formats that carry a string.
    pub fn to_json_text(&self) -> String {
        match self {
            ToolArgs::Json(v) => v.to_string(),
            ToolArgs::Invalid { raw, .. } => raw.clone(),
        }
    }

    /// The arguments as an object, for wire formats that carry one (invalid ones become `{}`).
    pub(crate) fn to_object(&self) -> Value {
        match self {
            ToolArgs::Json(v @ Value::Object(_)) => v.clone(),
            _ => Value::Object(Default::default()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub content: String,
    pub is_error: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model may answer in text or call tools.
    #[default]
    Auto,
    /// The model must call a tool every turn; the `finish` tool ends the run.
    Required,
}

#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    pub temperature: Option<f32>,
    pub max_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    Other(String),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::EndTurn => f.write_str("end_turn"),
            StopReason::ToolUse => f.write_str("tool_use"),
            StopReason::MaxTokens => f.write_str("max_tokens"),
            StopReason::Other(s) => f.write_str(s),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }

    /// All input tokens, cached or not.
    pub fn total_input(&self) -> u64 {
        self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
    }
}

/// One assistant turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Turn {
    pub content: Vec<Block>,
    pub stop: StopReason,
    pub usage: Usage,
}

impl Turn {
    pub fn tool_calls(&self) -> Vec<ToolCall> {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::ToolCall(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn text(&self) -> String {
        Message::assistant(self.content.clone()).text()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{provider} rejected the API key ({status}): {message}")]
    Auth {
        provider: &'static str,
        status: u16,
        message: String,
    },
    #[error("{provider} rejected the request ({status}): {message}")]
    BadRequest {
        provider: &'static str,
        status: u16,
        message: String,
    },
    #[error("{provider} answered {status} after {attempts} attempts: {message}")]
    Server {
        provider: &'static str,
        status: u16,
        attempts: u32,
        message: String,
    },
    #[error("cannot reach {provider} at {url} after {attempts} attempts: {message}")]
    Transport {
        provider: &'static str,
        url: String,
        attempts: u32,
        message: String,
    },
    /// A successful reply over [`retry::MAX_RESPONSE_BYTES`]: reading stopped at the limit.
    #[error(
        "{provider} sent a response larger than {limit_mib} MiB, the most agentbox reads of one reply (reading stopped there)"
    )]
    TooLarge {
        provider: &'static str,
        limit_mib: usize,
    },
    #[error("{provider} sent a response agentbox cannot read: {message}")]
    BadResponse { provider: &'static str, message: String },
    /// The server could not turn the model's own output into a tool call (llama.cpp answers
    /// 500 "Failed to parse tool call arguments as JSON" when a reply is cut off at the token
    /// limit or loops). Asking again with the same request gives the same output: the loop
    /// tells the model instead.
    #[error("{provider} could not read the model's reply as a tool call: {message}")]
    UnparsableReply { provider: &'static str, message: String },
    /// The endpoint check before a run (`preflight`): no request was sent.
    #[error(
        "cannot reach the model at {url}: {message} (checked before starting the sandbox; no request was sent)"
    )]
    Unreachable { url: String, message: String },
    #[error("{0}")]
    Script(String),
    #[error("model configuration: {0}")]
    Config(String),
}

/// Why a response body could not be read: not JSON at all, or JSON of the wrong shape.
pub(crate) fn body_error(what: &str, e: &serde_json::Error) -> String {
    match e.classify() {
        serde_json::error::Category::Data => format!("not {what} ({e})"),
        _ => format!("invalid JSON ({e})"),
    }
}

/// A model provider. Implementations translate [`Request`] and [`Turn`] to their wire format.
#[async_trait]
pub trait ModelClient: Send + Sync {
    /// "anthropic claude-sonnet-4-5", for messages and the report.
    fn describe(&self) -> String;
    fn model(&self) -> &str;
    async fn complete(&self, request: &Request) -> Result<Turn, ModelError>;
    /// Usage numbers are estimates (the scripted provider), not billed tokens.
    fn estimated_usage(&self) -> bool {
        false
    }
}

#[async_trait]
impl<T: ModelClient + ?Sized> ModelClient for Box<T> {
    fn describe(&self) -> String {
        (**self).describe()
    }

    fn model(&self) -> &str {
        (**self).model()
    }

    async fn complete(&self, request: &Request) -> Result<Turn, ModelError> {
        (**self).complete(request).await
    }

    fn estimated_usage(&self) -> bool {
        (**self).estimated_usage()
    }
}

/// Called before each retry, so the loop can report it: (attempt, wait, reason).
pub type RetryObserver = std::sync::Arc<dyn Fn(u32, Duration, &str) + Send + Sync>;

/// Settings for the HTTP providers.
#[derive(Clone)]
pub struct HttpSettings {
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub request_timeout: Duration,
    pub retry: retry::RetryPolicy,
    pub on_retry: Option<RetryObserver>,
}

impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key, whatever the log level.
        f.debug_struct("HttpSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

pub(crate) fn http_client(timeout: Duration) -> Result<reqwest::Client, ModelError> {
    install_crypto_provider();
    reqwest::Client::builder()
        // A redirect would carry the key header to wherever it points.
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(15))
        .build()
        .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))
}

/// rustls needs a process-wide crypto provider; ring is the one compiled in.
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_or_are_kept_verbatim() {
        assert_eq!(
            ToolArgs::parse(r#"{"path":"a"}"#),
            ToolArgs::Json(serde_json::json!({"path": "a"}))
        );
        assert_eq!(ToolArgs::parse(""), ToolArgs::Json(serde_json::json!({})));
        let bad = ToolArgs::parse(r#"{"path": "a""#);
        assert!(matches!(&bad, ToolArgs::Invalid { raw, .. } if raw == r#"{"path": "a""#));
        assert_eq!(bad.to_json_text(), r#"{"path": "a""#);
        assert_eq!(bad.to_object(), serde_json::json!({}));
    }

    #[test]
    fn message_round_trips_through_json() {
        let m = Message::assistant(vec![
            Block::Text { text: "hi".into() },
            Block::ToolCall(ToolCall {
                id: "c1".into(),
                name: "bash".into(),
                arguments: ToolArgs::Json(serde_json::json!({"command": "ls"})),
            }),
        ]);
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Message>(&text).unwrap(), m);
        assert_eq!(m.text(), "hi");
        assert_eq!(m.tool_calls().count(), 1);
    }

    #[test]
    fn settings_debug_hides_the_key() {
        let s = HttpSettings {
            base_url: "http://x".into(),
            api_key: Some("sk-secret".into()),
            model: "m".into(),
            request_timeout: Duration::from_secs(1),
            retry: retry::RetryPolicy::default(),
            on_retry: None,
        };
        assert!(!format!("{s:?}").contains("sk-secret"));
    }
}
