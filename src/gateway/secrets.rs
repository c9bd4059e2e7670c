//! Secrets for named hosts (`--secret NAME@https://HOST[:PORT]:HEADER`): the sandbox holds a
//! sentinel in `NAME` and talks plain HTTP to a local endpoint
//! (`AGENTBOX_SECRET_NAME_URL=http://127.0.0.1:PORT`) that an outbound forward joins to this
//! process; here the request goes to the one upstream, over TLS, with the sentinel replaced by
//! the real value in the one header it is bound to: never in a body, another header, or a
//! request to another host. No TLS of the sandbox's is intercepted: the host makes the TLS
//! connection itself.

use std::convert::Infallible;
use std::path::PathBuf;
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
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::sandbox::{Direction, Forward};

/// The sandbox's loopback port of the first secret's endpoint; the next ones follow.
pub const FIRST_PORT: u16 = 8790;
/// Requests at once per secret; more are answered 429.
const MAX_CONCURRENT: usize = 16;

/// One `--secret`: the variable, the upstream it is bound to, and the header it goes in.
#[derive(Debug, Clone, PartialEq)]
pub struct SecretSpec {
    pub name: String,
    pub upstream: reqwest::Url,
    pub header: HeaderName,
}

/// A `--secret` that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("--secret {spec}: {why}")]
pub struct BadSecret {
    spec: String,
    why: SecretFault,
}

/// What is wrong with a `--secret`.
#[derive(Debug, thiserror::Error)]
pub enum SecretFault {
    #[error("the form is NAME@https://HOST[:PORT]:HEADER")]
    Form,
    #[error("{0:?} must be an environment variable's name (A-Z, 0-9, _)")]
    NotAName(String),
    #[error("{0} is a variable the sandbox needs for itself")]
    Reserved(String),
    #[error("{0:?} is not a header name (the form is NAME@https://HOST[:PORT]:HEADER)")]
    NotAHeader(String),
    #[error("not a header a secret can go in")]
    ForbiddenHeader,
    #[error(transparent)]
    Upstream(#[from] super::UpstreamError),
}

/// Parse `NAME@https://HOST[:PORT][/PATH]:HEADER`. Plain http only to a loopback address.
pub fn parse_secret(spec: &str) -> Result<SecretSpec, BadSecret> {
    let bad = |why: SecretFault| BadSecret {
        spec: spec.to_string(),
        why,
    };
    let Some((name, rest)) = spec.split_once('@') else {
        return Err(bad(SecretFault::Form));
    };
    let valid_name = name.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if !valid_name {
        return Err(bad(SecretFault::NotAName(name.to_string())));
    }
    let reserved = ["PATH", "HOME", "LANG", "TERM", "USER", "SHELL", "PWD", "TMPDIR"];
    if reserved.contains(&name) || name.starts_with("AGENTBOX_") || name.ends_with("_BASE_URL") {
        return Err(bad(SecretFault::Reserved(name.to_string())));
    }
    let Some((url, header)) = rest.rsplit_once(':') else {
        return Err(bad(SecretFault::Form));
    };
    let header = HeaderName::from_bytes(header.as_bytes())
        .map_err(|_| bad(SecretFault::NotAHeader(header.to_string())))?;
    if matches!(
        header.as_str(),
        "host" | "content-length" | "transfer-encoding" | "connection"
    ) {
        return Err(bad(SecretFault::ForbiddenHeader));
    }
    let upstream = super::parse_upstream(url).map_err(|e| bad(e.into()))?;
    Ok(SecretSpec {
        name: name.to_string(),
        upstream,
        header,
    })
}

/// A secret with its value (from the host), never printed.
pub struct Binding {
    pub spec: SecretSpec,
    pub value: String,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("spec", &self.spec)
            .field("value", &"[redacted]")
            .finish()
    }
}

/// One request through a secret's endpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SecretRecord {
    pub name: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Whether the sentinel was found in the bound header (and replaced).
    pub substituted: bool,
    pub latency_ms: u64,
    pub error: Option<String>,
}

pub type SecretObserver = Arc<dyn Fn(&SecretRecord) + Send + Sync>;

struct Endpoint {
    spec: SecretSpec,
    value: String,
    sentinel: String,
    client: reqwest::Client,
    observer: SecretObserver,
    slots: Semaphore,
}

/// The secrets' endpoints, listening; dropping it closes them.
pub struct Secrets {
    sandbox: Vec<(String, String, u16, PathBuf)>,
    _dir: tempfile::TempDir,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Secrets {
    pub fn start(bindings: Vec<Binding>, observer: SecretObserver) -> Result<Secrets, super::GatewayError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // A redirect would carry the value to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(600))
            .connect_timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| super::GatewayError::Client(e.to_string()))?;
        let dir = tempfile::Builder::new().prefix("agentbox-secrets-").tempdir()?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let mut sandbox = Vec::new();
        let mut tasks = Vec::new();
        for (i, b) in bindings.into_iter().enumerate() {
            let port = FIRST_PORT + u16::try_from(i).unwrap_or(u16::MAX - FIRST_PORT);
            let path = dir.path().join(format!("secret-{port}.sock"));
            let listener = UnixListener::bind(&path)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
            let sentinel = format!("agentbox-secret-{}", uuid::Uuid::new_v4().simple());
            sandbox.push((b.spec.name.clone(), sentinel.clone(), port, path));
            let endpoint = Arc::new(Endpoint {
                spec: b.spec,
                value: b.value,
                sentinel,
                client: client.clone(),
                observer: observer.clone(),
                slots: Semaphore::new(MAX_CONCURRENT),
            });
            tasks.push(tokio::spawn(serve(listener, endpoint)));
        }
        Ok(Secrets {
            sandbox,
            _dir: dir,
            tasks,
        })
    }

    pub fn forwards(&self) -> Vec<Forward> {
        self.sandbox
            .iter()
            .map(|(_, _, port, socket)| Forward {
                name: format!("secret-{port}"),
                socket: socket.clone(),
                direction: Direction::Outbound { port: *port },
                purpose: "a secret's endpoint (--secret)",
            })
            .collect()
    }

    /// `NAME=sentinel` and `AGENTBOX_SECRET_NAME_URL=http://127.0.0.1:PORT` for each.
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        self.sandbox
            .iter()
            .flat_map(|(name, sentinel, port, _)| {
                [
                    (name.clone(), sentinel.clone()),
                    (
                        format!("AGENTBOX_SECRET_{name}_URL"),
                        format!("http://127.0.0.1:{port}"),
                    ),
                ]
            })
            .collect()
    }

    /// (NAME, the sandbox's URL) for each, to tell the user.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        self.sandbox
            .iter()
            .map(|(name, _, port, _)| (name.clone(), format!("http://127.0.0.1:{port}")))
            .collect()
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

async fn serve(listener: UnixListener, endpoint: Arc<Endpoint>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let endpoint = endpoint.clone();
                    conns.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let endpoint = endpoint.clone();
                            async move { Ok::<_, Infallible>(handle(req, &endpoint).await) }
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

/// Headers of this hop, or that reqwest writes itself.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "host"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}

/// The request's headers as they go upstream: the bound header with the sentinel replaced
/// by the value; every other header as it came (a sentinel there stays a sentinel).
fn upstream_headers(
    headers: &HeaderMap,
    bound: &HeaderName,
    sentinel: &str,
    value: &str,
) -> Option<(HeaderMap, bool)> {
    let mut out = HeaderMap::new();
    let mut substituted = false;
    for (name, v) in headers {
        if hop_by_hop(name.as_str()) {
            continue;
        }
        if name == bound
            && let Ok(text) = v.to_str()
            && text.contains(sentinel)
        {
            let mut real = HeaderValue::from_str(&text.replace(sentinel, value)).ok()?;
            real.set_sensitive(true);
            out.append(name.clone(), real);
            substituted = true;
        } else {
            out.append(name.clone(), v.clone());
        }
    }
    Some((out, substituted))
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!("agentbox secret endpoint: {message}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

async fn handle(req: Request<Incoming>, e: &Endpoint) -> Response<Body> {
    let started = Instant::now();
    let mut record = SecretRecord {
        name: e.spec.name.clone(),
        method: req.method().as_str().to_string(),
        path: req.uri().path().chars().take(200).collect(),
        status: 0,
        substituted: false,
        latency_ms: 0,
        error: None,
    };
    let finish = |mut record: SecretRecord, status: StatusCode, error: Option<String>| {
        record.status = status.as_u16();
        record.error = error;
        record.latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        (e.observer)(&record);
    };
    let Ok(_slot) = e.slots.try_acquire() else {
        finish(
            record,
            StatusCode::TOO_MANY_REQUESTS,
            Some("too many requests at once".into()),
        );
        return plain(StatusCode::TOO_MANY_REQUESTS, "too many requests at once");
    };
    let Some((headers, substituted)) = upstream_headers(req.headers(), &e.spec.header, &e.sentinel, &e.value)
    else {
        let why = "the value is not valid in a header";
        finish(record, StatusCode::BAD_GATEWAY, Some(why.into()));
        return plain(StatusCode::BAD_GATEWAY, why);
    };
    record.substituted = substituted;
    let mut url = e.spec.upstream.clone();
    url.set_path(&format!(
        "{}{}",
        e.spec.upstream.path().trim_end_matches('/'),
        req.uri().path()
    ));
    url.set_query(req.uri().query());
    let method = req.method().clone();
    let body = match Limited::new(req.into_body(), super::MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            let why = "the request body could not be read (at most 8 MiB)";
            finish(record, StatusCode::PAYLOAD_TOO_LARGE, Some(why.into()));
            return plain(StatusCode::PAYLOAD_TOO_LARGE, why);
        }
    };
    let sent = e
        .client
        .request(method, url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream = match sent {
        Ok(r) => r,
        Err(err) => {
            let why = format!("the upstream could not be reached: {}", err.without_url());
            finish(record, StatusCode::BAD_GATEWAY, Some(why.clone()));
            return plain(StatusCode::BAD_GATEWAY, &why);
        }
    };
    let status = upstream.status();
    let mut response_headers = HeaderMap::new();
    for (name, v) in upstream.headers() {
        if !hop_by_hop(name.as_str()) {
            response_headers.append(name.clone(), v.clone());
        }
    }
    finish(record, status, None);
    let chunks = upstream.bytes_stream().map(|c| match c {
        Ok(b) => Ok(Frame::data(b)),
        Err(err) => Err(std::io::Error::other(err.without_url())),
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(chunks)));
    *response.status_mut() = status;
    *response.headers_mut() = response_headers;
    response.headers_mut().remove(header::CONTENT_LENGTH);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_of_secret() {
        let s = parse_secret("GITHUB_TOKEN@https://api.github.com:Authorization").unwrap();
        assert_eq!(s.name, "GITHUB_TOKEN");
        assert_eq!(s.upstream.as_str(), "https://api.github.com/");
        assert_eq!(s.header.as_str(), "authorization");
        let s = parse_secret("K@http://127.0.0.1:8080:x-api-key").unwrap();
        assert_eq!(s.upstream.port(), Some(8080));
        for bad in [
            "K",
            "k@https://x:A",
            "K@http://example.com:A",
            "K@https://x:bad header",
            "K@https://x:host",
            "1K@https://x:A",
            "PATH@https://x:A",
            "AGENTBOX_X@https://x:A",
        ] {
            assert!(parse_secret(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_the_bound_header_is_substituted() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer SENT"));
        h.insert("x-other", HeaderValue::from_static("SENT"));
        h.insert("host", HeaderValue::from_static("evil"));
        let bound = HeaderName::from_static("authorization");
        let (out, substituted) = upstream_headers(&h, &bound, "SENT", "real").unwrap();
        assert!(substituted);
        assert_eq!(out["authorization"], "Bearer real");
        assert_eq!(out["x-other"], "SENT");
        assert!(!out.contains_key("host"));
        assert!(upstream_headers(&h, &bound, "SENT", "bad\nvalue").is_none());
    }
}
