//! The gateway's HTTP side: one hyper server per provider on its Unix socket, each request
//! checked, then forwarded with reqwest to the one upstream with the host's key.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::UnixListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::check::{self, Endpoint};
use super::meter::{Reported, SseMeter};
use super::{MAX_RESPONSE, Observer, Provider, Record, Settings, Spent};

type Body = BoxBody<Bytes, std::io::Error>;

pub(super) struct Shared {
    settings: Settings,
    sentinel: String,
    client: reqwest::Client,
    spent: Arc<Spent>,
    observer: Observer,
    slots: Arc<Semaphore>,
}

impl Shared {
    pub(super) fn new(
        settings: Settings,
        sentinel: String,
        client: reqwest::Client,
        spent: Arc<Spent>,
        observer: Observer,
    ) -> Shared {
        let slots = Arc::new(Semaphore::new(settings.max_concurrent.max(1)));
        Shared {
            settings,
            sentinel,
            client,
            spent,
            observer,
            slots,
        }
    }
}

/// Accept the sandbox's connections (the executor bounds how many) and serve HTTP/1.1 on each.
pub(super) async fn serve(listener: UnixListener, provider: Provider, shared: Arc<Shared>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    conns.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let shared = shared.clone();
                            async move { Ok::<_, Infallible>(handle(req, provider, shared).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(Duration::from_secs(30))
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Request headers passed upstream; the rest (cookies, the sandbox's own auth, an
/// organisation or project header that would pick another of the key's accounts,
/// `accept-encoding`, which would hide the usage) are dropped.
fn forwarded_request_header(name: &str) -> bool {
    matches!(
        name,
        "content-type"
            | "accept"
            | "anthropic-version"
            | "anthropic-beta"
            | "openai-beta"
            | "user-agent"
            | "idempotency-key"
    ) || name.starts_with("x-stainless-")
}

fn forwarded_response_header(name: &str) -> bool {
    matches!(
        name,
        "content-type" | "retry-after" | "request-id" | "x-request-id" | "openai-processing-ms"
    ) || name.starts_with("anthropic-ratelimit-")
        || name.starts_with("x-ratelimit-")
}

/// The key the request presents: `x-api-key`, or `Authorization: Bearer`; and whether it
/// came as a bearer token.
fn presented_key(headers: &HeaderMap) -> Option<(&str, bool)> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some((v.trim(), false));
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = auth.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some((token.trim(), true))
}

/// Equal, in a time that does not depend on where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An error in the provider's own shape, so the SDK inside shows the message.
fn error_response(provider: Provider, status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let message = format!("agentbox gateway: {message}");
    let body = match provider {
        Provider::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        Provider::Openai => json!({"error": {"message": message, "type": kind, "code": kind}}),
    };
    let mut response = Response::new(full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// A request's record, finished and told to the observer once, whichever way it ends.
struct Pending {
    record: Record,
    started: Instant,
    shared: Arc<Shared>,
}

impl Pending {
    fn refuse(mut self, status: StatusCode, kind: &str, message: String) -> Response<Body> {
        let response = error_response(self.record.provider, status, kind, &message);
        self.record.status = status.as_u16();
        self.record.refused = Some(message);
        self.finish(None);
        response
    }

    /// Record what the upstream answered (`reported`: the usage it said, if any).
    fn finish(mut self, reported: Option<&Reported>) {
        if let Some(r) = reported.filter(|r| r.any()) {
            let provider = self.record.provider;
            let (tokens_in, tokens_out) = (r.tokens_in(provider), r.tokens_out());
            self.shared.spent.add(tokens_in + tokens_out);
            self.record.input_tokens = Some(tokens_in);
            self.record.output_tokens = Some(tokens_out);
            let model = r.model.clone().or_else(|| self.record.model.clone());
            self.record.cost_usd = model
                .as_deref()
                .and_then(|m| crate::model::pricing::estimate_cost(m, &r.usage(provider)));
            if let Some(cost) = self.record.cost_usd {
                self.shared.spent.add_usd(cost);
            }
        }
        self.record.latency_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        (self.shared.observer)(&self.record);
    }
}

/// A streamed response's metering: fed as the bytes pass, recorded when the stream is dropped
/// (its end, or the client's going away). Holds the request's slot until then.
struct Metered {
    pending: Option<Pending>,
    meter: SseMeter,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            p.finish(Some(&self.meter.reported));
        }
    }
}

async fn handle(req: Request<Incoming>, provider: Provider, shared: Arc<Shared>) -> Response<Body> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let pending = Pending {
        record: Record {
            provider,
            method: method.clone(),
            path: path.chars().take(200).collect(),
            model: None,
            stream: false,
            status: 0,
            input_tokens: None,
            output_tokens: None,
            cost_usd: None,
            latency_ms: 0,
            refused: None,
        },
        started: Instant::now(),
        shared: shared.clone(),
    };
    let bearer = match presented_key(req.headers()) {
        Some((key, bearer)) if same_secret(key, &shared.sentinel) => bearer,
        Some(_) => {
            return pending.refuse(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "the key is not this sandbox's gateway key (use the one in the environment)".into(),
            );
        }
        None => {
            return pending.refuse(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "no key (x-api-key or Authorization: Bearer)".into(),
            );
        }
    };
    let Some(endpoint) = check::endpoint(provider, &method, &path) else {
        let allowed = match provider {
            Provider::Anthropic => "POST /v1/messages, POST /v1/messages/count_tokens, GET /v1/models",
            Provider::Openai => "POST /v1/chat/completions, POST /v1/responses, GET /v1/models",
        };
        let why = format!(
            "{method} {} is not forwarded; only {allowed}",
            pending.record.path
        );
        return pending.refuse(StatusCode::NOT_FOUND, "not_found_error", why);
    };
    let Ok(slot) = shared.slots.clone().try_acquire_owned() else {
        return pending.refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("more than {} requests at once", shared.settings.max_concurrent),
        );
    };
    if let Some(budget) = shared.settings.budget_tokens {
        let spent = shared.spent.tokens();
        if spent >= budget {
            return pending.refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "budget_exceeded",
                format!("the token budget is spent ({spent} of {budget} tokens, --gateway-budget)"),
            );
        }
    }
    if let Some(budget) = shared.settings.budget_usd {
        let spent = shared.spent.usd();
        if spent >= budget {
            return pending.refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "budget_exceeded",
                format!("the cost budget is spent (${spent:.4} of ${budget}, --gateway-budget-usd)"),
            );
        }
    }
    let (parts, body) = req.into_parts();
    let max_body = shared.settings.max_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return pending.refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the request body is larger than {max_body} bytes"),
        );
    }
    let body = match Limited::new(body, max_body).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return pending.refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!("the request body is larger than {max_body} bytes"),
            );
        }
        Err(_) => {
            return pending.refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the request body could not be read".into(),
            );
        }
    };
    let mut pending = pending;
    let mut body = body;
    let mut stream = false;
    if endpoint.has_body() {
        let mut doc: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => {
                return pending.refuse(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "the request body is not JSON".into(),
                );
            }
        };
        pending.record.model = doc
            .get("model")
            .and_then(Value::as_str)
            .map(|m| m.chars().take(200).collect());
        stream = doc.get("stream").and_then(Value::as_bool) == Some(true);
        pending.record.stream = stream;
        if let Err(why) = check::body(
            provider,
            endpoint,
            &doc,
            &shared.settings.models,
            &shared.settings.allow_tools,
        ) {
            return pending.refuse(StatusCode::FORBIDDEN, "permission_error", why.to_string());
        }
        if shared.settings.budget_usd.is_some() {
            let model = doc.get("model").and_then(Value::as_str).unwrap_or("");
            let priced = crate::model::pricing::estimate_cost(model, &crate::model::Usage::default());
            if priced.is_none() {
                let why = format!(
                    "the model {:?} has no price agentbox knows, so --gateway-budget-usd cannot count what it costs; name a priced model, or bound it with --gateway-budget TOKENS",
                    model.chars().take(200).collect::<String>()
                );
                return pending.refuse(StatusCode::FORBIDDEN, "permission_error", why);
            }
        }
        // A streamed chat completion reports its usage only when asked: asked always, or the
        // budget could be spent uncounted.
        if stream
            && endpoint == Endpoint::ChatCompletions
            && let Some(obj) = doc.as_object_mut()
        {
            let options = obj.entry("stream_options").or_insert_with(|| json!({}));
            if let Some(options) = options.as_object_mut() {
                options.insert("include_usage".into(), Value::Bool(true));
            } else {
                *options = json!({"include_usage": true});
            }
        }
        // What goes upstream is the document that was checked, written again: a body the
        // provider's parser could read differently (a key given twice, of which serde keeps the
        // last and another parser the first) cannot carry past the checks what they refused.
        body = Bytes::from(doc.to_string());
    }
    let Some(upstream) = shared.settings.upstreams.iter().find(|u| u.provider == provider) else {
        return pending.refuse(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "no upstream for this provider".into(),
        );
    };
    let mut url = upstream.base_url.clone();
    // OpenAI's base URL includes `/v1`, Anthropic's does not.
    let rest = match provider {
        Provider::Anthropic => path.as_str(),
        Provider::Openai => path.strip_prefix("/v1").unwrap_or(&path),
    };
    url.set_path(&format!(
        "{}{rest}",
        upstream.base_url.path().trim_end_matches('/')
    ));
    url.set_query(parts.uri.query());
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if forwarded_request_header(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Some(key) = &upstream.key {
        let (name, value) = match (provider, bearer) {
            (Provider::Anthropic, false) => (HeaderName::from_static("x-api-key"), key.clone()),
            _ => (header::AUTHORIZATION, format!("Bearer {key}")),
        };
        match HeaderValue::from_str(&value) {
            Ok(mut v) => {
                v.set_sensitive(true);
                headers.insert(name, v);
            }
            Err(_) => {
                return pending.refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "api_error",
                    "the host's key is not a valid header value".into(),
                );
            }
        }
    }
    let sent = shared
        .client
        .request(parts.method.clone(), url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream_response = match sent {
        Ok(r) => r,
        Err(e) => {
            let why = if e.is_timeout() {
                "the upstream did not answer in time".to_string()
            } else {
                format!("the upstream could not be reached: {}", e.without_url())
            };
            return pending.refuse(StatusCode::BAD_GATEWAY, "api_error", why);
        }
    };
    let status = upstream_response.status();
    pending.record.status = status.as_u16();
    let mut response_headers = HeaderMap::new();
    for (name, value) in upstream_response.headers() {
        if forwarded_response_header(name.as_str()) {
            response_headers.append(name.clone(), value.clone());
        }
    }
    let event_stream = upstream_response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body: Body = if stream || event_stream {
        let mut metered = Metered {
            pending: Some(pending),
            meter: SseMeter::default(),
            _slot: slot,
        };
        let chunks = upstream_response.bytes_stream().map(move |chunk| match chunk {
            Ok(bytes) => {
                metered.meter.push(&bytes);
                Ok(Frame::data(bytes))
            }
            Err(e) => Err(std::io::Error::other(e.without_url())),
        });
        BodyExt::boxed(StreamBody::new(chunks))
    } else {
        let mut read = Vec::new();
        let mut chunks = upstream_response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            match chunk {
                Ok(bytes) if read.len() + bytes.len() <= MAX_RESPONSE => read.extend_from_slice(&bytes),
                Ok(_) => {
                    return pending.refuse(
                        StatusCode::BAD_GATEWAY,
                        "api_error",
                        format!("the upstream's response is larger than {MAX_RESPONSE} bytes"),
                    );
                }
                Err(e) => {
                    return pending.refuse(
                        StatusCode::BAD_GATEWAY,
                        "api_error",
                        format!("the upstream's response broke off: {}", e.without_url()),
                    );
                }
            }
        }
        // An upstream that quotes the key back (an error naming it) does not hand it to the
        // sandbox: the sentinel stands in for it there too.
        if let Some(key) = upstream.key.as_deref() {
            read = replace_all(&read, key.as_bytes(), shared.sentinel.as_bytes());
        }
        let mut reported = Reported::default();
        if let Ok(doc) = serde_json::from_slice::<Value>(&read) {
            reported.read(&doc);
        }
        pending.finish(Some(&reported));
        drop(slot);
        full(Bytes::from(read))
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = response_headers;
    response
}

/// `haystack` with every `needle` replaced by `with`.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    if needle.is_empty() {
        return haystack.to_vec();
    }
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(i) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(with);
        rest = &rest[i + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_from_either_header() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(presented_key(&h), Some(("abc", true)));
        h.insert("x-api-key", HeaderValue::from_static("xyz"));
        assert_eq!(presented_key(&h), Some(("xyz", false)));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(presented_key(&h), None);
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }

    #[test]
    fn a_quoted_key_is_replaced() {
        assert_eq!(
            replace_all(b"bad key sk-1 (sk-1)", b"sk-1", b"S"),
            b"bad key S (S)"
        );
        assert_eq!(replace_all(b"none", b"sk-1", b"S"), b"none");
        assert_eq!(replace_all(b"x", b"", b"S"), b"x");
    }

    #[test]
    fn only_known_headers_pass() {
        for h in ["content-type", "anthropic-version", "x-stainless-lang"] {
            assert!(forwarded_request_header(h), "{h}");
        }
        for h in [
            "authorization",
            "x-api-key",
            "cookie",
            "openai-organization",
            "accept-encoding",
            "host",
        ] {
            assert!(!forwarded_request_header(h), "{h}");
        }
        assert!(forwarded_response_header("anthropic-ratelimit-tokens-remaining"));
        assert!(!forwarded_response_header("set-cookie"));
    }
}
