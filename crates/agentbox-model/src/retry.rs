//! Sending a model request with retries: backoff on overload and transient failures, honouring
//! `retry-after`; an immediate, clear error on what no retry can fix (400, 401, 403, 404).
//!
//! A retry re-sends the same model request; tools are never re-run by it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderMap;

use super::{ModelError, RetryObserver};

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub base: Duration,
    /// Longest single wait, whatever `retry-after` asks for.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff with ±25% jitter, so parallel runs do not retry in lockstep.
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.base.saturating_mul(1u32 << attempt.min(10));
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let jitter = 0.75 + (nanos % 1000) as f64 / 2000.0;
        exp.mul_f64(jitter).min(self.max_wait)
    }
}

/// Statuses worth retrying: rate limits, server errors, Anthropic's 529 "overloaded".
pub(crate) fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// `retry-after` (seconds or an HTTP date) or `retry-after-ms`.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
    {
        return Some(seconds(ms / 1000.0));
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return Some(seconds(secs));
    }
    // A date in the past means now.
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// A number of seconds a server asked for: negative (or NaN) is now; more than a `Duration`
/// holds (or infinite) is the longest wait, which the policy's `max_wait` caps.
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX)
}

/// An HTTP date (IMF-fixdate, and the obsolete RFC 850 and asctime forms a server may still
/// send) to Unix seconds.
#[cfg(test)]
fn httpdate_to_unix(s: &str) -> Option<u64> {
    let when = httpdate::parse_http_date(s).ok()?;
    Some(when.duration_since(UNIX_EPOCH).ok()?.as_secs())
}

/// The `message` of a JSON error body (both providers' shapes), else the start of the body.
pub fn error_message(body: &[u8]) -> String {
    if super::looks_like_html(body) {
        return super::html_message(body);
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let msg = v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(|m| m.as_str());
        if let Some(m) = msg {
            return m.to_string();
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".into()
    } else {
        text.chars().take(500).collect()
    }
}

/// Largest successful response body read: far beyond any real reply (a turn at the token limit
/// is a few hundred KiB), small enough that a hostile or broken server cannot make the host
/// hold gigabytes.
pub(crate) const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// How much of an error response is read: its message is all that is used.
const MAX_ERROR_BYTES: usize = 64 << 10;

enum Body {
    /// All of it.
    Whole(bytes::Bytes),
    /// An error body's start; the rest was not read.
    Start(bytes::Bytes),
    /// A successful body over the limit (reading stopped there).
    TooLarge,
}

/// Read a response body, at most `limit` bytes of it: a declared length over the limit is
/// refused before reading, an undeclared one as soon as it passes it.
async fn read_body(mut resp: reqwest::Response, limit: usize) -> Result<Body, reqwest::Error> {
    let ok = resp.status().is_success();
    if ok && resp.content_length().is_some_and(|n| n > limit as u64) {
        return Ok(Body::TooLarge);
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > limit {
            if ok {
                return Ok(Body::TooLarge);
            }
            let room = limit - body.len();
            body.extend_from_slice(&chunk[..room]);
            return Ok(Body::Start(body.freeze()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Body::Whole(body.freeze()))
}

/// POST `body` to `url`, retrying per `policy`; returns the successful response's body.
pub(crate) async fn post_json(
    provider: &'static str,
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: &impl serde::Serialize,
    policy: &RetryPolicy,
    on_retry: Option<&RetryObserver>,
) -> Result<bytes::Bytes, ModelError> {
    let payload = serde_json::to_vec(body)
        .map_err(|e| ModelError::Config(format!("cannot encode the request: {e}")))?;
    let mut attempt = 0u32;
    loop {
        let sent = client
            .post(url)
            .headers(headers.clone())
            .body(payload.clone())
            .send()
            .await;
        let (wait, reason, final_err) = match sent {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let hinted = retry_after(resp.headers());
                let ok = (200..300).contains(&status);
                // A body cut off mid-way is a transport failure, worth another try.
                match read_body(resp, if ok { MAX_RESPONSE_BYTES } else { MAX_ERROR_BYTES }).await {
                    Ok(Body::Whole(bytes)) if ok => return Ok(bytes),
                    Ok(Body::TooLarge) => {
                        // Only a successful reply is refused so; the same request gets the
                        // same reply: no retry.
                        return Err(ModelError::TooLarge {
                            provider,
                            limit_mib: MAX_RESPONSE_BYTES >> 20,
                        });
                    }
                    Ok(Body::Whole(bytes)) | Ok(Body::Start(bytes)) => {
                        let message = error_message(&bytes);
                        match status {
                            401 | 403 => {
                                return Err(ModelError::Auth {
                                    provider,
                                    status,
                                    message,
                                });
                            }
                            _ if crate::messages::unparsable_tool_call(&message) => {
                                return Err(ModelError::UnparsableReply { provider, message });
                            }
                            s if !retryable_status(s) => {
                                return Err(ModelError::BadRequest {
                                    provider,
                                    status,
                                    message,
                                });
                            }
                            _ => {
                                let reason = format!("{status}: {message}");
                                let err = ModelError::Server {
                                    provider,
                                    status,
                                    attempts: attempt + 1,
                                    message,
                                };
                                (hinted, reason, err)
                            }
                        }
                    }
                    Err(e) => {
                        let message = format!("the response body was cut off: {e}");
                        let err = ModelError::Transport {
                            provider,
                            url: url.to_string(),
                            attempts: attempt + 1,
                            message: message.clone(),
                        };
                        (None, message, err)
                    }
                }
            }
            Err(e) => {
                let message = describe_transport(&e);
                let err = ModelError::Transport {
                    provider,
                    url: url.to_string(),
                    attempts: attempt + 1,
                    message: message.clone(),
                };
                (None, message, err)
            }
        };
        if attempt >= policy.max_retries {
            return Err(final_err);
        }
        let wait = wait
            .map(|w| w.min(policy.max_wait))
            .unwrap_or_else(|| policy.backoff(attempt));
        attempt += 1;
        tracing::info!(provider, attempt, wait_ms = wait.as_millis() as u64, %reason, "retrying model request");
        if let Some(observe) = on_retry {
            observe(attempt, wait, &reason);
        }
        tokio::time::sleep(wait).await;
    }
}

fn describe_transport(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "no response before the request timeout (--request-timeout)".into();
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderValue, RETRY_AFTER};

    #[test]
    fn retry_after_in_seconds_dates_and_ms() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        let mut h = HeaderMap::new();
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(
            retry_after(&h),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(
            httpdate_to_unix("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        // The obsolete forms a server may still send, and a date to wait for.
        assert_eq!(
            httpdate_to_unix("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(httpdate_to_unix("Sun Nov  6 08:49:37 1994"), Some(784_111_777));
        assert_eq!(httpdate_to_unix("06 Nov 1994"), None);
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        h.insert(RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        let wait = retry_after(&h).unwrap();
        assert!(
            wait > Duration::from_secs(28) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
    }

    /// Found by the `model_reply` fuzz target (fuzz/regressions/model_reply): a number past what
    /// a `Duration` holds panicked in `Duration::from_secs_f64`.
    #[test]
    fn a_retry_after_too_long_for_a_duration_is_the_longest_wait_not_a_panic() {
        for (name, value) in [
            ("retry-after", "777777777777777777777777"),
            ("retry-after", "1e400"),
            ("retry-after", "inf"),
            ("retry-after-ms", "1e30"),
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            assert_eq!(retry_after(&h), Some(Duration::MAX), "{name}: {value}");
        }
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("NaN"));
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
    }

    #[test]
    fn which_statuses_retry() {
        for s in [429, 500, 502, 503, 529] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [400, 401, 403, 404, 413, 422] {
            assert!(!retryable_status(s), "{s}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_retries: 5,
            base: Duration::from_secs(1),
            max_wait: Duration::from_secs(5),
        };
        let b0 = p.backoff(0);
        assert!(
            b0 >= Duration::from_millis(750) && b0 <= Duration::from_millis(1250),
            "{b0:?}"
        );
        assert!(p.backoff(2) >= Duration::from_secs(3));
        assert_eq!(p.backoff(9), Duration::from_secs(5));
    }

    #[test]
    fn error_messages_from_both_providers() {
        assert_eq!(
            error_message(br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            "Overloaded"
        );
        assert_eq!(
            error_message(br#"{"error":{"message":"Invalid key","type":"invalid_request_error"}}"#),
            "Invalid key"
        );
        assert_eq!(
            error_message(b"<html><head><title>502</title></head><body>bad   gateway</body></html>"),
            "the server answered with an HTML page, not the API's JSON (\"502 bad gateway\")"
        );
        assert_eq!(error_message(b""), "(empty body)");
    }
}
