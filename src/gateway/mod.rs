//! The model gateway (`--model-gateway`): an Anthropic- and an OpenAI-compatible endpoint on the
//! sandbox's own loopback, so that an agent CLI inside can call its model while the key stays on
//! the host. The sandbox keeps `network_mode: none`: each endpoint is an outbound
//! [`Forward`](crate::sandbox::Forward) from the sandbox's `127.0.0.1:PORT` to a Unix socket
//! this process listens on.
//!
//! The sandbox is given a sentinel in place of the key. A request that does not carry it is
//! refused (401); one that does is checked (exact endpoint paths, the model allowlist, the
//! token budget, server-side tools that would make the provider fetch on the sandbox's behalf)
//! and sent to the one configured upstream with the host's real key. Every request, forwarded
//! or refused, is told to an [`Observer`] as a [`Record`].
//!
//! It imports nothing from the rest of the crate but the sandbox's `Forward` and the model
//! crate's pricing, like `egress`.

pub mod check;
pub mod meter;
pub mod secrets;
mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sandbox::{Direction, Forward};

/// The sandbox's loopback port of the Anthropic-compatible endpoint.
pub const ANTHROPIC_PORT: u16 = 8781;
/// The sandbox's loopback port of the OpenAI-compatible endpoint.
pub const OPENAI_PORT: u16 = 8782;
/// The largest request body forwarded (a long conversation with a few images fits).
pub const MAX_BODY: usize = 8 << 20;
/// The largest non-streamed response read (to count its usage) before it is passed on.
pub const MAX_RESPONSE: usize = 32 << 20;
/// Requests forwarded at once; more are answered 429 at once.
pub const MAX_CONCURRENT: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Anthropic,
    Openai,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
        }
    }

    pub fn sandbox_port(self) -> u16 {
        match self {
            Provider::Anthropic => ANTHROPIC_PORT,
            Provider::Openai => OPENAI_PORT,
        }
    }

    /// The variables the provider's SDKs and CLIs read, as the sandbox sees them: the base URL
    /// on its own loopback (OpenAI's convention includes `/v1`, Anthropic's does not) and the
    /// sentinel as the key.
    pub fn sandbox_env(self, sentinel: &str) -> Vec<(String, String)> {
        let port = self.sandbox_port();
        match self {
            Provider::Anthropic => vec![
                ("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}")),
                ("ANTHROPIC_API_KEY".into(), sentinel.to_string()),
            ],
            Provider::Openai => vec![
                ("OPENAI_BASE_URL".into(), format!("http://127.0.0.1:{port}/v1")),
                ("OPENAI_API_KEY".into(), sentinel.to_string()),
            ],
        }
    }
}

/// Where one provider's requests go, and the key they carry there.
pub struct Upstream {
    pub provider: Provider,
    /// `https://`, or `http://` to a loopback address (a local server, the tests).
    pub base_url: reqwest::Url,
    /// The host's real key; `None` for a loopback upstream that needs none.
    pub key: Option<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url.as_str())
            .field("key", &self.key.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

/// Why an upstream URL is not one the gateway sends a key to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("{0:?} is not a URL")]
    NotAUrl(String),
    #[error(
        "{0:?}: the gateway sends the key over https only (plain http only to a loopback address, such as a local model server)"
    )]
    PlainHttp(String),
    #[error("{0:?}: not an http(s) URL without credentials, query or fragment")]
    Unsupported(String),
}

/// Check an upstream base URL: https, or http to 127.0.0.0/8, `::1` or `localhost`.
pub fn parse_upstream(url: &str) -> Result<reqwest::Url, UpstreamError> {
    let parsed = reqwest::Url::parse(url.trim()).map_err(|_| UpstreamError::NotAUrl(url.into()))?;
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
        || parsed.host().is_none()
    {
        return Err(UpstreamError::Unsupported(url.into()));
    }
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if is_loopback(&parsed) => Ok(parsed),
        "http" => Err(UpstreamError::PlainHttp(url.into())),
        _ => Err(UpstreamError::Unsupported(url.into())),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// What the gateway lets through.
#[derive(Debug)]
pub struct Settings {
    pub upstreams: Vec<Upstream>,
    /// Models a request may name; empty: any.
    pub models: Vec<String>,
    /// Server-side tools allowed by name (`web_search`, `web_fetch`, `mcp`, `file_search`,
    /// `url_source`, ...), see [`check`].
    pub allow_tools: Vec<String>,
    /// Input and output tokens, counted from the responses, after which requests are refused.
    pub budget_tokens: Option<u64>,
    /// Estimated dollars (list prices of the models agentbox knows), counted from the
    /// responses, after which requests are refused; while set, a model without a known price
    /// is refused too (what it costs could not be counted).
    pub budget_usd: Option<f64>,
    pub max_body: usize,
    pub max_concurrent: usize,
    /// Each upstream request's limit.
    pub request_timeout: std::time::Duration,
}

/// One request the sandbox sent, forwarded or refused.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Record {
    pub provider: Provider,
    pub method: String,
    pub path: String,
    pub model: Option<String>,
    pub stream: bool,
    /// The status the sandbox got (the upstream's, or the gateway's own for a refusal).
    pub status: u16,
    /// Input tokens, cached ones included; `None` when the response said none.
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Dollars, from the model's list price; `None` when unknown.
    pub cost_usd: Option<f64>,
    /// From the request's arrival to the response's end.
    pub latency_ms: u64,
    /// Why the gateway refused it (the upstream saw nothing).
    pub refused: Option<String>,
}

pub type Observer = Arc<dyn Fn(&Record) + Send + Sync>;

/// The tokens counted so far, against the budget.
#[derive(Debug, Default)]
pub struct Spent {
    tokens: AtomicU64,
    /// Millionths of a dollar: an integer, so adding from concurrent requests is atomic.
    micro_usd: AtomicU64,
}

impl Spent {
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    pub fn usd(&self) -> f64 {
        self.micro_usd.load(Ordering::Relaxed) as f64 / 1e6
    }

    fn add(&self, tokens: u64) {
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
    }

    fn add_usd(&self, usd: f64) {
        // Rounded up: a budget is never spent by less than it says.
        let micro = (usd.max(0.0) * 1e6).ceil() as u64;
        self.micro_usd.fetch_add(micro, Ordering::Relaxed);
    }
}

/// A running gateway: one socket per provider in a private directory, mounted into the
/// sandbox. Dropping it closes them and every connection.
pub struct Gateway {
    sentinel: String,
    sockets: Vec<(Provider, PathBuf)>,
    spent: Arc<Spent>,
    _dir: tempfile::TempDir,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A fresh sentinel: the sandbox's "key", worth nothing outside this run's gateway.
pub fn new_sentinel() -> String {
    format!("agentbox-gateway-{}", uuid::Uuid::new_v4().simple())
}

impl Gateway {
    /// Listen (inside a tokio runtime) for each upstream's provider.
    pub fn start(settings: Settings, observer: Observer) -> Result<Gateway, GatewayError> {
        // rustls needs a process-wide crypto provider; ring is the one compiled in.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // A redirect would carry the key to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.request_timeout)
            .connect_timeout(std::time::Duration::from_secs(15))
            .build()
            .map_err(|e| GatewayError::Client(e.to_string()))?;
        let dir = tempfile::Builder::new().prefix("agentbox-gateway-").tempdir()?;
        // The sandbox user is the project's owner, not necessarily us: it must be able to
        // connect. Whoever connects still needs the sentinel.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let sentinel = new_sentinel();
        let spent = Arc::new(Spent::default());
        let providers: Vec<Provider> = settings.upstreams.iter().map(|u| u.provider).collect();
        let shared = Arc::new(server::Shared::new(
            settings,
            sentinel.clone(),
            client,
            spent.clone(),
            observer,
        ));
        let mut sockets = Vec::new();
        let mut tasks = Vec::new();
        for provider in providers {
            let path = dir.path().join(format!("{}.sock", provider.name()));
            let listener = tokio::net::UnixListener::bind(&path)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
            tasks.push(tokio::spawn(server::serve(listener, provider, shared.clone())));
            sockets.push((provider, path));
        }
        Ok(Gateway {
            sentinel,
            sockets,
            spent,
            _dir: dir,
            tasks,
        })
    }

    pub fn sentinel(&self) -> &str {
        &self.sentinel
    }

    pub fn providers(&self) -> Vec<Provider> {
        self.sockets.iter().map(|(p, _)| *p).collect()
    }

    /// The host's socket of a provider (for tests that speak to it directly).
    pub fn socket(&self, provider: Provider) -> Option<&std::path::Path> {
        self.sockets
            .iter()
            .find(|(p, _)| *p == provider)
            .map(|(_, s)| s.as_path())
    }

    /// The sandbox's side, for `Extras::forwards`.
    pub fn forwards(&self) -> Vec<Forward> {
        self.sockets
            .iter()
            .map(|(provider, socket)| Forward {
                name: format!("gateway-{}", provider.name()),
                socket: socket.clone(),
                direction: Direction::Outbound {
                    port: provider.sandbox_port(),
                },
                purpose: "the model gateway (--model-gateway)",
            })
            .collect()
    }

    /// The sandbox's variables, for `Extras::env`: base URLs and the sentinel, never the key.
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        self.sockets
            .iter()
            .flat_map(|(p, _)| p.sandbox_env(&self.sentinel))
            .collect()
    }

    pub fn spent_tokens(&self) -> u64 {
        self.spent.tokens()
    }

    pub fn spent_usd(&self) -> f64 {
        self.spent.usd()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot build the gateway's HTTP client: {0}")]
    Client(String),
    #[error("cannot listen for the gateway: {0}")]
    Io(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_are_https_or_loopback() {
        assert!(parse_upstream("https://api.anthropic.com").is_ok());
        assert!(parse_upstream("http://127.0.0.1:8080/v1").is_ok());
        assert!(parse_upstream("http://127.9.0.1:8080").is_ok());
        assert!(parse_upstream("http://localhost:11434/v1").is_ok());
        assert!(parse_upstream("http://[::1]:8080").is_ok());
        assert!(matches!(
            parse_upstream("http://api.openai.com/v1"),
            Err(UpstreamError::PlainHttp(_))
        ));
        assert!(matches!(
            parse_upstream("http://10.0.0.1/v1"),
            Err(UpstreamError::PlainHttp(_))
        ));
        for bad in [
            "ftp://x",
            "https://u:p@x",
            "https://x/?a=b",
            "nonsense",
            "file:///etc",
        ] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_sandbox_sees_the_sentinel_and_loopback() {
        let s = new_sentinel();
        assert!(s.starts_with("agentbox-gateway-") && s.len() > 40);
        assert_ne!(s, new_sentinel());
        let env = Provider::Openai.sandbox_env(&s);
        assert!(env.contains(&(
            "OPENAI_BASE_URL".into(),
            format!("http://127.0.0.1:{OPENAI_PORT}/v1")
        )));
        assert!(env.contains(&("OPENAI_API_KEY".into(), s.clone())));
        let env = Provider::Anthropic.sandbox_env(&s);
        assert!(env.contains(&(
            "ANTHROPIC_BASE_URL".into(),
            format!("http://127.0.0.1:{ANTHROPIC_PORT}")
        )));
    }
}
