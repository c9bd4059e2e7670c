//! Before a run starts any sandbox: does the model endpoint accept a connection? A TCP connect,
//! plus the TLS handshake (with the certificate checked) for `https`; no HTTP request, so no
//! model request and no key sent, and no retries: an unreachable model fails in seconds
//! instead of after a sandbox was built and the first request retried for a minute.
//!
//! When a proxy is configured for the URL (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, as
//! reqwest reads them, minus `NO_PROXY`), the proxy is what must answer.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::ModelError;

/// How long the connect, and then the handshake, may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Check that `base_url` accepts a connection (and a TLS handshake for https).
pub async fn check_endpoint(base_url: &str, timeout: Duration) -> Result<(), ModelError> {
    let fail = |message: String| ModelError::Unreachable {
        url: base_url.to_string(),
        message,
    };
    let url = reqwest::Url::parse(base_url).map_err(|e| fail(format!("not a URL ({e})")))?;
    let host = url
        .host_str()
        .ok_or_else(|| fail("no host in the URL".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = url
        .port_or_known_default()
        .ok_or_else(|| fail("no port for this scheme".into()))?;
    if let Some(proxy) = proxy_for(url.scheme(), &host) {
        let p =
            reqwest::Url::parse(&proxy).map_err(|e| fail(format!("the proxy {proxy} is not a URL ({e})")))?;
        let (Some(phost), Some(pport)) = (p.host_str(), p.port_or_known_default()) else {
            return Err(fail(format!("the proxy {proxy} names no host and port")));
        };
        connect(phost, pport, timeout)
            .await
            .map_err(|e| fail(format!("the proxy {proxy} does not answer: {e}")))?;
        return Ok(());
    }
    let stream = connect(&host, port, timeout)
        .await
        .map_err(|e| fail(e.to_string()))?;
    if url.scheme() == "https" {
        handshake(stream, &host, timeout)
            .await
            .map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}

/// Why the endpoint (or its proxy) took no connection.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("resolving {host} took longer than {secs}s")]
    ResolveTimeout { host: String, secs: u64 },
    #[error("cannot resolve {host}: {source}")]
    Resolve { host: String, source: std::io::Error },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("{source} ({addr})")]
    Refused {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("no answer from {addr} in {secs}s")]
    NoAnswer { addr: std::net::SocketAddr, secs: u64 },
}

/// Why the TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("cannot set up TLS: {0}")]
    Setup(rustls::Error),
    #[error("{host} is not a valid TLS server name: {source}")]
    ServerName {
        host: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("the TLS handshake took longer than {0}s")]
    Timeout(u64),
    #[error("the TLS handshake failed: {0}")]
    Failed(std::io::Error),
}

async fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<std::net::SocketAddr> =
        tokio::time::timeout(timeout, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| ConnectError::ResolveTimeout {
                host: host.to_string(),
                secs: timeout.as_secs(),
            })?
            .map_err(|source| ConnectError::Resolve {
                host: host.to_string(),
                source,
            })?
            .collect();
    let mut last = ConnectError::NoAddress {
        host: host.to_string(),
    };
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(source)) => last = ConnectError::Refused { addr, source },
            Err(_) => {
                last = ConnectError::NoAnswer {
                    addr,
                    secs: timeout.as_secs(),
                }
            }
        }
    }
    Err(last)
}

async fn handshake(stream: TcpStream, host: &str, timeout: Duration) -> Result<(), HandshakeError> {
    use rustls_platform_verifier::BuilderVerifierExt;
    super::install_crypto_provider();
    let config = rustls::ClientConfig::builder()
        .with_platform_verifier()
        .map_err(HandshakeError::Setup)?
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|source| {
        HandshakeError::ServerName {
            host: host.to_string(),
            source,
        }
    })?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tokio::time::timeout(timeout, connector.connect(name, stream))
        .await
        .map_err(|_| HandshakeError::Timeout(timeout.as_secs()))?
        .map_err(HandshakeError::Failed)?;
    Ok(())
}

fn env(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
}

/// The proxy reqwest would use for `scheme://host`, if any.
fn proxy_for(scheme: &str, host: &str) -> Option<String> {
    let proxy = match scheme {
        "https" => env(&["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]),
        _ => env(&["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]),
    }?;
    let no_proxy = env(&["NO_PROXY", "no_proxy"]).unwrap_or_default();
    (!bypasses(&no_proxy, host)).then(|| {
        if proxy.contains("://") {
            proxy
        } else {
            format!("http://{proxy}")
        }
    })
}

/// `NO_PROXY` matching as curl and reqwest do it: `*`, exact hosts, and domain suffixes.
fn bypasses(no_proxy: &str, host: &str) -> bool {
    no_proxy
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|e| {
            let e = e.trim_start_matches('.');
            e == "*" || host == e || host.ends_with(&format!(".{e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_nobody_listens_on_fails_at_once_and_a_listener_passes() {
        // Take a free port, then free it: nothing listens there.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = check_endpoint(&format!("http://{addr}/v1"), CONNECT_TIMEOUT)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("refused"), "{err}");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        check_endpoint(&url, CONNECT_TIMEOUT).await.unwrap();
    }

    #[tokio::test]
    async fn https_needs_a_tls_handshake_not_just_a_listener() {
        // A listener that accepts and says nothing TLS: the handshake fails.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        let err = check_endpoint(&format!("https://{addr}"), Duration::from_secs(5))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("TLS"), "{err}");
    }

    #[test]
    fn no_proxy_rules() {
        assert!(bypasses("localhost, .internal.example", "api.internal.example"));
        assert!(bypasses("*", "x"));
        assert!(!bypasses("example.com", "notexample.com"));
        assert!(!bypasses("", "x"));
    }
}
