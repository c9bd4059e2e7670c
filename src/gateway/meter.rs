//! Token usage read from the provider's responses: a JSON body, or the events of a streamed
//! (SSE) one, in either provider's words.

use serde_json::Value;

use super::Provider;
use crate::model::Usage;

/// The usage a response reported, each field as last said (a stream says `output_tokens`
/// again, cumulatively, in its last events).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reported {
    input: Option<u64>,
    output: Option<u64>,
    cache_read: Option<u64>,
    cache_write: Option<u64>,
    pub model: Option<String>,
}

impl Reported {
    pub fn any(&self) -> bool {
        self.input.is_some() || self.output.is_some()
    }

    /// In the model crate's terms: input excludes the cached tokens (OpenAI counts them in
    /// its `prompt_tokens`, Anthropic apart).
    pub fn usage(&self, provider: Provider) -> Usage {
        let cache_read = self.cache_read.unwrap_or(0);
        let input = self.input.unwrap_or(0);
        Usage {
            input_tokens: match provider {
                Provider::Anthropic => input,
                Provider::Openai => input.saturating_sub(cache_read),
            },
            output_tokens: self.output.unwrap_or(0),
            cache_read_tokens: cache_read,
            cache_write_tokens: self.cache_write.unwrap_or(0),
        }
    }

    /// Input tokens, cached ones included.
    pub fn tokens_in(&self, provider: Provider) -> u64 {
        let u = self.usage(provider);
        u.input_tokens + u.cache_read_tokens + u.cache_write_tokens
    }

    pub fn tokens_out(&self) -> u64 {
        self.output.unwrap_or(0)
    }

    /// Take what one JSON document (a whole response, or one event's data) says.
    pub fn read(&mut self, doc: &Value) {
        if let Some(m) = doc.get("model").and_then(Value::as_str) {
            self.model = Some(m.chars().take(200).collect());
        }
        // Anthropic's `message_start` nests the message; OpenAI's `response.completed` the response.
        for nested in ["message", "response"] {
            if let Some(inner) = doc.get(nested).filter(|v| v.is_object()) {
                self.read(inner);
            }
        }
        let Some(u) = doc.get("usage").filter(|v| v.is_object()) else {
            return;
        };
        let n = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(v) = n("input_tokens").or_else(|| n("prompt_tokens")) {
            self.input = Some(v);
        }
        if let Some(v) = n("output_tokens").or_else(|| n("completion_tokens")) {
            self.output = Some(v);
        }
        if let Some(v) = n("cache_read_input_tokens").or_else(|| {
            ["prompt_tokens_details", "input_tokens_details"]
                .iter()
                .find_map(|d| {
                    u.get(*d)
                        .and_then(|d| d.get("cached_tokens"))
                        .and_then(Value::as_u64)
                })
        }) {
            self.cache_read = Some(v);
        }
        if let Some(v) = n("cache_creation_input_tokens") {
            self.cache_write = Some(v);
        }
    }
}

/// Reads the `data:` lines of an event stream as its bytes pass, bounded: a line longer than
/// [`MAX_LINE`] is skipped.
#[derive(Debug, Default)]
pub struct SseMeter {
    line: Vec<u8>,
    skipping: bool,
    pub reported: Reported,
}

const MAX_LINE: usize = 1 << 20;

impl SseMeter {
    pub fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                if !self.skipping {
                    self.line_done();
                }
                self.line.clear();
                self.skipping = false;
            } else if !self.skipping {
                if self.line.len() >= MAX_LINE {
                    self.skipping = true;
                    self.line.clear();
                } else {
                    self.line.push(b);
                }
            }
        }
    }

    fn line_done(&mut self) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if let Ok(doc) = serde_json::from_slice::<Value>(data) {
            self.reported.read(&doc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_usage_in_both_dialects() {
        let mut r = Reported::default();
        r.read(
            &json!({"model": "claude-x", "usage": {"input_tokens": 100, "output_tokens": 20,
            "cache_read_input_tokens": 50, "cache_creation_input_tokens": 10}}),
        );
        assert_eq!((r.tokens_in(Provider::Anthropic), r.tokens_out()), (160, 20));
        assert_eq!(r.usage(Provider::Anthropic).input_tokens, 100);
        let mut r = Reported::default();
        r.read(&json!({"usage": {"prompt_tokens": 30, "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 10}}}));
        assert_eq!((r.tokens_in(Provider::Openai), r.tokens_out()), (30, 7));
        assert_eq!(r.usage(Provider::Openai).input_tokens, 20);
        let r = Reported::default();
        assert!(!r.any());
    }

    #[test]
    fn stream_usage_from_events_split_anywhere() {
        let anthropic = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\r\n\r\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n";
        for split in [1, 7, 50, anthropic.len()] {
            let mut m = SseMeter::default();
            for chunk in anthropic.as_bytes().chunks(split) {
                m.push(chunk);
            }
            assert_eq!(
                (m.reported.tokens_in(Provider::Anthropic), m.reported.tokens_out()),
                (12, 9)
            );
            assert_eq!(m.reported.model.as_deref(), Some("claude-x"));
        }
        let openai = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        let mut m = SseMeter::default();
        m.push(openai.as_bytes());
        assert_eq!(
            (m.reported.tokens_in(Provider::Openai), m.reported.tokens_out()),
            (5, 3)
        );
        let responses = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":2}}}\n\n";
        let mut m = SseMeter::default();
        m.push(responses.as_bytes());
        assert_eq!(m.reported.tokens_out(), 2);
    }
}
