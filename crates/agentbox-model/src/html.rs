//! A web page where the API's JSON was expected: said as one, with a hint at the base URL
//! (usually one path segment off), the same way for every provider.

use crate::ModelError;

/// What an error says when the server answered with a web page instead of the API: usually a
/// base URL one path segment off.
pub const HTML_PAGE: &str = "the server answered with an HTML page, not the API's JSON";

pub fn looks_like_html(body: &[u8]) -> bool {
    let start = String::from_utf8_lossy(&body[..body.len().min(1024)]).to_ascii_lowercase();
    let start = start.trim_start();
    // A page, not a JSON error that quotes one.
    start.starts_with('<') && (start.starts_with("<!doctype html") || start.contains("<html"))
}

/// [`HTML_PAGE`], with the start of the page's text (a proxy's "502 bad gateway" says a lot).
pub fn html_message(body: &[u8]) -> String {
    let page = String::from_utf8_lossy(&body[..body.len().min(64 * 1024)]);
    let mut text = String::new();
    let mut in_tag = false;
    for c in page.chars() {
        match c {
            '<' => {
                in_tag = true;
                text.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let snippet: String = words.join(" ").chars().take(100).collect();
    if snippet.is_empty() {
        HTML_PAGE.to_string()
    } else {
        format!("{HTML_PAGE} ({snippet:?})")
    }
}

/// An HTML answer (see [`HTML_PAGE`]) with a hint at the base URL the provider expects:
/// OpenAI-compatible ones end in `/v1` (`wants_v1`), Anthropic's does not.
pub fn hint_html(err: ModelError, base_url: &str, wants_v1: bool) -> ModelError {
    let base = base_url.trim_end_matches('/');
    let hint = match (wants_v1, base.ends_with("/v1")) {
        (true, false) => format!("did you mean --base-url {base}/v1?"),
        (false, true) => format!(
            "did you mean --base-url {}? (the Anthropic base URL has no /v1)",
            base.trim_end_matches("/v1")
        ),
        _ => format!("is {base} the API's base URL?"),
    };
    let add = |message: String| {
        if message.starts_with(HTML_PAGE) {
            format!("{message}: {hint}")
        } else {
            message
        }
    };
    match err {
        ModelError::BadRequest {
            provider,
            status,
            message,
        } => ModelError::BadRequest {
            provider,
            status,
            message: add(message),
        },
        ModelError::Server {
            provider,
            status,
            attempts,
            message,
        } => ModelError::Server {
            provider,
            status,
            attempts,
            message: add(message),
        },
        ModelError::BadResponse { provider, message } => ModelError::BadResponse {
            provider,
            message: add(message),
        },
        other => other,
    }
}

/// A provider's answer read by `parse`: an HTML page in its place, whether the request failed
/// or the body does not parse, is said as one with the hint for `base_url` (see [`hint_html`]).
pub(crate) fn read_answer<T>(
    provider: &'static str,
    base_url: &str,
    wants_v1: bool,
    sent: Result<bytes::Bytes, ModelError>,
    parse: impl FnOnce(&[u8]) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let bytes = sent.map_err(|e| hint_html(e, base_url, wants_v1))?;
    parse(&bytes).map_err(|e| {
        let e = if looks_like_html(&bytes) {
            ModelError::BadResponse {
                provider,
                message: html_message(&bytes),
            }
        } else {
            e
        };
        hint_html(e, base_url, wants_v1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_html_answer_hints_at_the_base_url() {
        assert!(looks_like_html(
            b"\n<!DOCTYPE html><html><body>Welcome</body></html>"
        ));
        assert!(!looks_like_html(br#"{"error": "<html> in a message"}"#));
        let page = || ModelError::BadRequest {
            provider: "openai",
            status: 404,
            message: HTML_PAGE.into(),
        };
        let e = hint_html(page(), "http://127.0.0.1:8080/", true).to_string();
        assert!(
            e.ends_with("did you mean --base-url http://127.0.0.1:8080/v1?"),
            "{e}"
        );
        let e = hint_html(page(), "https://api.example/v1", false).to_string();
        assert!(e.contains("did you mean --base-url https://api.example?"), "{e}");
        let other = ModelError::BadRequest {
            provider: "openai",
            status: 404,
            message: "model not found".into(),
        };
        assert!(
            !hint_html(other, "http://x", true)
                .to_string()
                .contains("did you mean")
        );
    }
}
