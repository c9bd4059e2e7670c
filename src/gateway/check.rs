//! What the gateway forwards: exact endpoints, and request bodies that ask the provider for
//! a model's answer and nothing else. A server-side tool or a URL source makes the provider
//! fetch from the network on the sandbox's behalf, which would make the gateway a way out of a
//! sandbox that has no network: each is refused unless allowed by name.

use serde_json::Value;

use super::Provider;

/// An endpoint the gateway forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    CountTokens,
    ChatCompletions,
    Responses,
    Models,
}

impl Endpoint {
    /// A request for a model's work, with a JSON body naming the model.
    pub fn has_body(self) -> bool {
        !matches!(self, Endpoint::Models)
    }
}

/// The endpoint a request line names, compared exactly (no prefix: not `/v1/files`, not
/// `/v1/messages/batches`, not `/v1/responses/ID`).
pub fn endpoint(provider: Provider, method: &str, path: &str) -> Option<Endpoint> {
    let e = match (provider, method, path) {
        (Provider::Anthropic, "POST", "/v1/messages") => Endpoint::Messages,
        (Provider::Anthropic, "POST", "/v1/messages/count_tokens") => Endpoint::CountTokens,
        (Provider::Openai, "POST", "/v1/chat/completions") => Endpoint::ChatCompletions,
        (Provider::Openai, "POST", "/v1/responses") => Endpoint::Responses,
        (_, "GET", "/v1/models") => Endpoint::Models,
        _ => return None,
    };
    Some(e)
}

/// The name `--gateway-allow-tool` takes for URL image, document and file sources.
pub const URL_SOURCE: &str = "url_source";

/// Anthropic tool types the client runs itself (the provider only describes them to the model).
const ANTHROPIC_CLIENT_TOOLS: [&str; 5] = ["custom", "bash", "text_editor", "computer", "memory"];
/// OpenAI tool types the client runs itself.
const OPENAI_CLIENT_TOOLS: [&str; 6] = [
    "function",
    "custom",
    "computer_use_preview",
    "local_shell",
    "shell",
    "apply_patch",
];

/// A tool type without its version suffix (`web_search_20250305` is `web_search`,
/// `web_search_preview` is `web_search`).
fn tool_family(kind: &str) -> &str {
    let kind = kind.strip_suffix("_preview").unwrap_or(kind);
    match kind.rsplit_once('_') {
        Some((family, date)) if date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()) => family,
        _ => kind,
    }
}

fn allowed(allow: &[String], name: &str) -> bool {
    allow.iter().any(|a| a == name)
}

/// Why a request's body is refused: the words the sandbox's client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the request body is not a JSON object")]
    NotAnObject,
    #[error("the model {model:?} is not one the gateway allows (--gateway-model: {})", allowed.join(", "))]
    Model { model: String, allowed: Vec<String> },
    #[error("the request names no model, and --gateway-model limits them")]
    NoModel,
    #[error(
        "the request asks for the server-side tool {0:?}, with which the provider acts on the network for the sandbox; allow it with --gateway-allow-tool {0}"
    )]
    Tool(String),
    #[error(
        "the request has a content source the provider would fetch ({0}); send the content itself (base64 or a data: URL), or allow it with --gateway-allow-tool {URL_SOURCE}"
    )]
    UrlSource(String),
}

fn refuse_tool(name: &str) -> Refusal {
    Refusal::Tool(name.to_string())
}

/// Check a request's body (a JSON object) against the allowlists. `Err`: why it is refused.
pub fn body(
    provider: Provider,
    endpoint: Endpoint,
    body: &Value,
    models: &[String],
    allow: &[String],
) -> Result<(), Refusal> {
    if !endpoint.has_body() {
        return Ok(());
    }
    let Some(obj) = body.as_object() else {
        return Err(Refusal::NotAnObject);
    };
    let model = obj.get("model").and_then(Value::as_str);
    if !models.is_empty() {
        match model {
            Some(m) if models.iter().any(|a| a == m) => {}
            Some(m) => {
                return Err(Refusal::Model {
                    model: m.to_string(),
                    allowed: models.to_vec(),
                });
            }
            None => return Err(Refusal::NoModel),
        }
    }
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        for tool in tools {
            let Some(kind) = tool.get("type").and_then(Value::as_str) else {
                continue;
            };
            let family = tool_family(kind);
            let client_side = match provider {
                Provider::Anthropic => ANTHROPIC_CLIENT_TOOLS.contains(&family),
                Provider::Openai => OPENAI_CLIENT_TOOLS.contains(&kind),
            };
            let name = if family.starts_with("mcp") { "mcp" } else { family };
            if !client_side && !allowed(allow, name) {
                return Err(refuse_tool(name));
            }
        }
    }
    if obj
        .get("mcp_servers")
        .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        && !allowed(allow, "mcp")
    {
        return Err(refuse_tool("mcp"));
    }
    if obj.contains_key("web_search_options") && !allowed(allow, "web_search") {
        return Err(refuse_tool("web_search"));
    }
    if !allowed(allow, URL_SOURCE)
        && let Some(url) = url_source(body, 0)
    {
        return Err(Refusal::UrlSource(url.chars().take(80).collect()));
    }
    Ok(())
}

fn is_web_url(s: &str) -> bool {
    let lower = s.trim_start().to_ascii_lowercase();
    // Anything but inline data: the provider would fetch a scheme it knows.
    !lower.starts_with("data:") && lower.contains("://")
}

/// The first content source the provider would fetch: an Anthropic `source` of type `url`, an
/// OpenAI `image_url` (a string or `{url}`) or `file_url` that is not a `data:` URL. Deeply
/// nested bodies are refused too (a depth no model call needs).
fn url_source(v: &Value, depth: usize) -> Option<String> {
    if depth > 64 {
        return Some("a body nested deeper than 64 levels".into());
    }
    match v {
        Value::Object(map) => {
            if let Some(source) = map.get("source").and_then(Value::as_object)
                && source.get("type").and_then(Value::as_str) == Some("url")
            {
                return Some(
                    source
                        .get("url")
                        .and_then(Value::as_str)
                        .unwrap_or("a URL source")
                        .to_string(),
                );
            }
            for key in ["image_url", "file_url", "audio_url", "video_url", "document_url"] {
                let url = match map.get(key) {
                    Some(Value::String(s)) => Some(s.as_str()),
                    Some(Value::Object(o)) => o.get("url").and_then(Value::as_str),
                    _ => None,
                };
                if let Some(url) = url
                    && is_web_url(url)
                {
                    return Some(url.to_string());
                }
            }
            map.values().find_map(|v| url_source(v, depth + 1))
        }
        Value::Array(items) => items.iter().find_map(|v| url_source(v, depth + 1)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(p: Provider, e: Endpoint, b: Value) -> Result<(), String> {
        body(p, e, &b, &[], &[]).map_err(|r| r.to_string())
    }

    #[test]
    fn endpoints_are_exact() {
        use Provider::*;
        assert_eq!(
            endpoint(Anthropic, "POST", "/v1/messages"),
            Some(Endpoint::Messages)
        );
        assert_eq!(
            endpoint(Anthropic, "POST", "/v1/messages/count_tokens"),
            Some(Endpoint::CountTokens)
        );
        assert_eq!(
            endpoint(Openai, "POST", "/v1/responses"),
            Some(Endpoint::Responses)
        );
        assert_eq!(endpoint(Openai, "GET", "/v1/models"), Some(Endpoint::Models));
        for (p, m, path) in [
            (Anthropic, "POST", "/v1/messages/batches"),
            (Anthropic, "POST", "/v1/messages/"),
            (Anthropic, "GET", "/v1/messages"),
            (Anthropic, "POST", "/v1/files"),
            (Anthropic, "POST", "/v1/chat/completions"),
            (Openai, "POST", "/v1/files"),
            (Openai, "POST", "/v1/responses/resp_1/cancel"),
            (Openai, "GET", "/v1/responses/resp_1"),
            (Openai, "POST", "/v1/fine_tuning/jobs"),
            (Openai, "POST", "/v1/messages"),
            (Openai, "GET", "/v1/models/gpt-4o"),
        ] {
            assert_eq!(endpoint(p, m, path), None, "{m} {path}");
        }
    }

    #[test]
    fn client_tools_pass_server_tools_are_refused() {
        use Endpoint::*;
        use Provider::*;
        let ok = json!({"model": "m", "tools": [
            {"name": "f", "input_schema": {}}, {"type": "bash_20250124", "name": "bash"},
            {"type": "custom", "name": "g"}, {"type": "text_editor_20250728", "name": "e"}]});
        assert!(check(Anthropic, Messages, ok).is_ok());
        for t in [
            "web_search_20250305",
            "web_fetch_20250910",
            "code_execution_20250825",
            "mcp_toolset",
        ] {
            let e = check(
                Anthropic,
                Messages,
                json!({"model": "m", "tools": [{"type": t, "name": "x"}]}),
            );
            assert!(e.is_err(), "{t}");
        }
        let e = check(
            Anthropic,
            Messages,
            json!({"model": "m", "tools": [{"type": "web_search_20250305"}]}),
        );
        assert!(e.unwrap_err().contains("--gateway-allow-tool web_search"));
        let allow = vec!["web_search".to_string()];
        let b = json!({"model": "m", "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(body(Anthropic, Messages, &b, &[], &allow).is_ok());
        let b = json!({"model": "m", "mcp_servers": [{"type": "url", "url": "https://x"}]});
        assert!(check(Anthropic, Messages, b).unwrap_err().contains("mcp"));
        assert!(check(Anthropic, Messages, json!({"model": "m", "mcp_servers": []})).is_ok());

        let ok = json!({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}]});
        assert!(check(Openai, ChatCompletions, ok).is_ok());
        for t in [
            "web_search",
            "web_search_preview",
            "file_search",
            "mcp",
            "code_interpreter",
        ] {
            let e = check(Openai, Responses, json!({"model": "m", "tools": [{"type": t}]}));
            assert!(e.is_err(), "{t}");
        }
        let b = json!({"model": "m", "web_search_options": {}});
        assert!(check(Openai, ChatCompletions, b).is_err());
    }

    #[test]
    fn url_sources_are_refused_inline_data_passes() {
        use Endpoint::*;
        use Provider::*;
        let img = |source: Value| {
            json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image", "source": source}]}]})
        };
        assert!(
            check(
                Anthropic,
                Messages,
                img(json!({"type": "url", "url": "https://x/a.png"}))
            )
            .is_err()
        );
        assert!(
            check(
                Anthropic,
                Messages,
                img(json!({"type": "base64", "media_type": "image/png", "data": "AA=="}))
            )
            .is_ok()
        );
        let chat = |url: &str| {
            json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}]}]})
        };
        assert!(check(Openai, ChatCompletions, chat("https://example.com/a.png")).is_err());
        assert!(check(Openai, ChatCompletions, chat("HTTP://example.com/a.png")).is_err());
        assert!(check(Openai, ChatCompletions, chat("data:image/png;base64,AA==")).is_ok());
        let resp = json!({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://x/y.png"}]}]});
        assert!(check(Openai, Responses, resp).is_err());
        let resp = json!({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "https://x/y.pdf"}]}]});
        assert!(check(Openai, Responses, resp).is_err());
        // A tool's arguments naming a URL are the model's business, not a source.
        let b = json!({"model": "m", "messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "fetch", "input": {"url": "https://x"}}]}]});
        assert!(check(Anthropic, Messages, b).is_ok());
        let mut deep = json!("x");
        for _ in 0..100 {
            deep = json!([deep]);
        }
        assert!(check(Openai, ChatCompletions, json!({"model": "m", "messages": deep})).is_err());
    }

    #[test]
    fn models_are_allowlisted() {
        let models = vec!["gpt-4o-mini".to_string()];
        let b = json!({"model": "gpt-4o-mini", "messages": []});
        assert!(body(Provider::Openai, Endpoint::ChatCompletions, &b, &models, &[]).is_ok());
        let b = json!({"model": "gpt-5", "messages": []});
        let e = body(Provider::Openai, Endpoint::ChatCompletions, &b, &models, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpt-5") && e.contains("--gateway-model"), "{e}");
        let b = json!({"messages": []});
        assert!(body(Provider::Openai, Endpoint::ChatCompletions, &b, &models, &[]).is_err());
        assert!(body(Provider::Openai, Endpoint::ChatCompletions, &json!([1]), &[], &[]).is_err());
    }
}
