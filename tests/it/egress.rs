//! The egress proxy: driven over its Unix socket from the host, and from inside a real sandbox
//! through the executor's loopback forwarder. Every destination is on 127.0.0.1; private
//! ranges are only ever answers of an injected resolver.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::support::upstream::{Body, Upstream};
use crate::support::*;
use agentbox::egress::{Allowlist, Decision, Limits, Policy, Proxy, StaticResolver};
use agentbox::sandbox::{ExecRequest, Sandbox};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn proxy(rules: &[String], table: &[(&str, &str)], limits: Limits) -> Proxy {
    let policy = Policy {
        allowlist: Allowlist::parse(rules).unwrap(),
        resolver: Arc::new(StaticResolver(
            table
                .iter()
                .map(|(n, ip)| (n.to_string(), vec![ip.parse().unwrap()]))
                .collect(),
        )),
        own: HashSet::new(),
    };
    Proxy::start(policy, limits, None).unwrap()
}

/// Send `request` through the proxy; all that comes back (bounded).
async fn through(p: &Proxy, request: &str, max: usize) -> Vec<u8> {
    let mut s = UnixStream::connect(p.socket_path()).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.len() > max {
                        break;
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read).await.unwrap();
    out
}

/// The decisions once `n` are recorded (a connection's is recorded when it ends).
async fn decisions(p: &Proxy, n: usize) -> Vec<Decision> {
    for _ in 0..600 {
        let d = p.decisions();
        if d.len() >= n {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("only {:?}", p.decisions());
}

fn routes() -> HashMap<String, Body> {
    HashMap::from([(
        "/hello".to_string(),
        Body::Bytes(b"hello through the proxy".to_vec()),
    )])
}

#[tokio::test]
async fn an_allowed_address_is_forwarded_and_recorded() {
    let up = Upstream::http(routes()).await;
    let port = up.addr.port();
    let p = proxy(&[format!("127.0.0.1:{port}")], &[], Limits::default());
    let got = through(
        &p,
        &format!("GET http://127.0.0.1:{port}/hello HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        1 << 20,
    )
    .await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("hello through the proxy"),
        "{text}"
    );
    let d = &decisions(&p, 1).await[0];
    assert!(d.allowed && d.port == port && d.host == "127.0.0.1", "{d:?}");
    assert_eq!(d.bytes_down, got.len() as u64);
    assert!(d.bytes_up > 0);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn refusals_forward_nothing() {
    let up = Upstream::http(routes()).await;
    let port = up.addr.port();
    // A name allowed by a rule, but it resolves to loopback and no rule names the address.
    let p = proxy(
        &["pkg.test".into(), format!("pkg.test:{port}"), "other.test".into()],
        &[("pkg.test", "127.0.0.1")],
        Limits::default(),
    );
    let cases = [
        (
            format!("GET http://127.0.0.1:{port}/hello HTTP/1.1\r\n\r\n"),
            format!(
                "blocked 127.0.0.1:{port} — not in the allowlist; allow it with --allow-host 127.0.0.1:{port}"
            ),
        ),
        (
            format!("CONNECT pkg.test:{port} HTTP/1.1\r\n\r\n"),
            format!("blocked pkg.test:{port} — it resolves to 127.0.0.1, a loopback address"),
        ),
        (
            "CONNECT other.test:22 HTTP/1.1\r\n\r\n".to_string(),
            "blocked other.test:22 — not in the allowlist; allow it with --allow-host other.test:22"
                .to_string(),
        ),
        (
            "CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n".to_string(),
            "blocked nowhere.test:443 — not in the allowlist; allow it with --allow-host nowhere.test"
                .to_string(),
        ),
    ];
    for (request, line) in &cases {
        let got = String::from_utf8_lossy(&through(&p, request, 1 << 16).await).to_string();
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        assert!(got.contains(line.as_str()), "{got}\nwants: {line}");
    }
    let d = decisions(&p, cases.len()).await;
    assert!(
        d.iter()
            .all(|d| !d.allowed && d.bytes_down == 0 && d.reason.is_some()),
        "{d:?}"
    );
    assert_eq!(up.count(), 0, "nothing reached the destination");
}

#[tokio::test]
async fn a_flood_is_cut_at_the_byte_limit_and_connections_are_bounded() {
    let up = Upstream::http(HashMap::from([("/flood".to_string(), Body::Endless)])).await;
    let port = up.addr.port();
    let limits = Limits {
        max_total_bytes: 4 << 20,
        max_connections: 2,
        ..Limits::default()
    };
    let p = proxy(&[format!("127.0.0.1:{port}")], &[], limits);
    let got = through(
        &p,
        &format!("GET http://127.0.0.1:{port}/flood HTTP/1.1\r\n\r\n"),
        64 << 20,
    )
    .await;
    assert!(got.len() < 8 << 20, "{} bytes came through", got.len());
    let d = &decisions(&p, 1).await[0];
    assert!(d.reason.as_deref().unwrap_or("").contains("byte limit"), "{d:?}");
    // Once the budget is spent, new connections are refused.
    let got = String::from_utf8_lossy(
        &through(
            &p,
            &format!("GET http://127.0.0.1:{port}/flood HTTP/1.1\r\n\r\n"),
            1 << 16,
        )
        .await,
    )
    .to_string();
    assert!(
        got.starts_with("HTTP/1.1 403") && got.contains("byte limit"),
        "{got}"
    );

    // Two connections held open (their heads never end) fill the slots: a third is turned away.
    let p = proxy(
        &[format!("127.0.0.1:{port}")],
        &[],
        Limits {
            max_connections: 2,
            ..Limits::default()
        },
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = UnixStream::connect(p.socket_path()).await.unwrap();
        s.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    let mut third = String::new();
    for _ in 0..100 {
        third =
            String::from_utf8_lossy(&through(&p, "GET http://127.0.0.1/ HTTP/1.1\r\n\r\n", 1 << 16).await)
                .to_string();
        if third.starts_with("HTTP/1.1 503") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(third.starts_with("HTTP/1.1 503"), "{third}");
    drop(held);
}

/// A sandbox given the proxy's socket reaches allowed loopback servers through the executor's
/// forwarder, over plain HTTP and over TLS through CONNECT; one without it has no proxy at all.
#[tokio::test]
async fn the_sandbox_reaches_the_proxy_only_when_given_it() {
    let plain = Upstream::http(routes()).await;
    let tls = Upstream::https(routes(), "pkg.test").await;
    let p = proxy(
        &[
            format!("127.0.0.1:{}", plain.addr.port()),
            format!("127.0.0.1:{}", tls.addr.port()),
        ],
        &[],
        Limits::default(),
    );
    let project = Project::new(&[("ca.pem", tls.ca_pem.as_deref().unwrap())]);
    let mut cfg = config();
    cfg.extras.forwards = vec![agentbox::sandbox::Forward::egress(p.socket_path().to_path_buf())];
    let sb = sandbox_with(&project, &cfg).await;
    let script = format!(
        r#"
import ssl, urllib.request
proxy = urllib.request.ProxyHandler({{"http": "http://127.0.0.1:3128", "https": "http://127.0.0.1:3128"}})
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
opener = urllib.request.build_opener(proxy, urllib.request.HTTPSHandler(context=ctx))
print(opener.open("http://127.0.0.1:{}/hello", timeout=30).read().decode())
print(opener.open("https://127.0.0.1:{}/hello", timeout=30).read().decode())
"#,
        plain.addr.port(),
        tls.addr.port()
    );
    let out = sb
        .exec(ExecRequest::argv(
            ["python3", "-c", script.as_str()],
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let stdout = out.stdout.to_text();
    assert!(out.success(), "{}\n{}", stdout, out.stderr.to_text());
    assert_eq!(stdout.matches("hello through the proxy").count(), 2, "{stdout}");
    assert_eq!((plain.count(), tls.count()), (1, 1));
    let d = decisions(&p, 2).await;
    assert!(
        d.iter()
            .any(|d| d.method == "CONNECT" && d.allowed && d.bytes_down > 0),
        "{d:?}"
    );
    sb.shutdown().await.unwrap();

    // The default: no socket, no listener.
    let sb = sandbox(&project).await;
    let out = sb
        .exec(ExecRequest::shell(
            "test ! -e /run/agentbox-egress.sock && python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3128), 5)'",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert!(!out.success(), "a proxy was reachable: {}", out.stdout.to_text());
    assert!(
        out.stderr.to_text().contains("Connection refused"),
        "{}",
        out.stderr.to_text()
    );
    sb.shutdown().await.unwrap();
    assert_eq!(p.decisions().len(), 2, "nothing more reached the proxy");
}

/// A host service on a Unix socket of its own, in a directory the sandbox user may enter (as
/// the proxy's is): answers every connection with `name` and what it read.
fn unix_service(name: &'static str) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("service.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let reply = format!("{name}:{}", String::from_utf8_lossy(&buf[..n]));
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (dir, path)
}

/// The forwarder is one mechanism for any number of host services: each sandbox port reaches
/// its own socket, each mounted read-only, and the sandbox cannot put anything in its place.
#[tokio::test]
async fn each_forward_reaches_its_own_socket() {
    use agentbox::sandbox::{Direction, Forward};
    let (_a, first) = unix_service("first");
    let (_b, second) = unix_service("second");
    let project = Project::new(&[]);
    let mut cfg = config();
    cfg.extras.forwards = vec![
        Forward {
            name: "test-first".into(),
            socket: first,
            direction: Direction::Outbound { port: 4101 },
            purpose: "a test service",
        },
        Forward {
            name: "test-second".into(),
            socket: second,
            direction: Direction::Outbound { port: 4102 },
            purpose: "a test service",
        },
    ];
    let sb = sandbox_with(&project, &cfg).await;
    let script = r#"
import socket
for port in (4101, 4102):
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.sendall(b"ping%d" % port)
    s.shutdown(socket.SHUT_WR)
    print(s.recv(64).decode())
"#;
    let out = sb
        .exec(ExecRequest::argv(
            ["python3", "-c", script],
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(
        out.stdout.to_text(),
        "first:ping4101\nsecond:ping4102\n",
        "{}",
        out.stderr.to_text()
    );
    let replaced = sb
        .exec(ExecRequest::shell(
            "rm -f /run/agentbox-test-first.sock; ln -sf /tmp /run/agentbox-test-first.sock; \
             mv /run/agentbox-test-second.sock /tmp/x; ls -l /run/agentbox-test-first.sock",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let seen = replaced.stdout.to_text();
    assert!(seen.starts_with('s'), "the mounted socket was replaced: {seen}");
    sb.shutdown().await.unwrap();
}

/// A loopback server that records every byte each connection sends it (until the client closes
/// or stays quiet for a second) and answers an HTTP head with a short 200.
struct Recorder {
    addr: std::net::SocketAddr,
    seen: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = vec![0u8; 65536];
                    let mut answered = false;
                    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await
                    {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                        if !answered
                            && got.windows(4).any(|w| w == b"\r\n\r\n")
                            && (got.starts_with(b"GET") || got.starts_with(b"POST"))
                        {
                            answered = true;
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                                .await;
                        }
                    }
                    log.lock().unwrap().push(got);
                });
            }
        });
        Recorder { addr, seen }
    }

    /// What each connection sent, once `n` have ended.
    async fn connections(&self, n: usize) -> Vec<Vec<u8>> {
        for _ in 0..100 {
            let seen = self.seen.lock().unwrap().clone();
            if seen.len() >= n {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.seen.lock().unwrap().clone()
    }
}

/// Send `parts` through the proxy with a pause between them (separate segments); all that comes
/// back until the proxy closes or a second of quiet.
async fn in_parts(p: &Proxy, parts: &[&[u8]]) -> Vec<u8> {
    let mut s = UnixStream::connect(p.socket_path()).await.unwrap();
    for part in parts {
        s.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[tokio::test]
async fn plain_http_goes_upstream_as_the_proxy_wrote_it_one_request_only() {
    let rec = Recorder::start().await;
    let port = rec.addr.port();
    let p = proxy(&[format!("127.0.0.1:{port}")], &[], Limits::default());
    // The client's Host names another tenant; a second request follows the declared body.
    let request = format!(
        "POST http://127.0.0.1:{port}/upload HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 5\r\n\r\nhello\
         GET http://127.0.0.1:{port}/second HTTP/1.1\r\nHost: evil.example\r\n\r\n"
    );
    let got = in_parts(&p, &[request.as_bytes(), b"GET /third HTTP/1.1\r\n\r\n"]).await;
    assert!(String::from_utf8_lossy(&got).contains("200 OK"), "{got:?}");
    let sent = rec.connections(1).await;
    assert_eq!(
        String::from_utf8_lossy(&sent[0]),
        format!(
            "POST /upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
        )
    );
    assert_eq!(sent.len(), 1);
    let d = decisions(&p, 1).await;
    assert!(
        d[0].reason
            .as_deref()
            .is_some_and(|r| r.contains("after the request's body were not forwarded")),
        "{d:?}"
    );

    // A chunked body arrives whole and exactly; what follows it does not.
    let chunked = format!(
        "POST http://127.0.0.1:{port}/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"
    );
    in_parts(&p, &[chunked.as_bytes()]).await;
    let sent = rec.connections(2).await;
    assert_eq!(
        String::from_utf8_lossy(&sent[1]),
        format!(
            "POST /c HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
    );

    // Framing a server could read otherwise is refused before anything is sent.
    let both = format!(
        "POST http://127.0.0.1:{port}/x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    );
    let got = in_parts(&p, &[both.as_bytes()]).await;
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 400"),
        "{got:?}"
    );
    assert_eq!(
        rec.connections(3).await.len(),
        2,
        "the refused request reached the server"
    );
}

/// A ClientHello asking for `name`, as rustls writes it.
fn client_hello(name: &str) -> Vec<u8> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut bytes = Vec::new();
    conn.write_tls(&mut bytes).unwrap();
    bytes
}

/// The same handshake message in records of at most `size` bytes (a large ClientHello, e.g.
/// with post-quantum key shares, may come in several).
fn refragment(hello: &[u8], size: usize) -> Vec<u8> {
    let message = &hello[5..];
    let mut out = Vec::new();
    for chunk in message.chunks(size) {
        out.extend([22, 3, 1]);
        out.extend((chunk.len() as u16).to_be_bytes());
        out.extend(chunk);
    }
    out
}

#[tokio::test]
async fn a_connect_to_a_name_must_ask_tls_for_that_name() {
    let rec = Recorder::start().await;
    let port = rec.addr.port();
    // pkg.example (and plain.example, on a port its rule names) "resolve" to the recorder.
    let policy = Policy {
        allowlist: Allowlist::parse(&[
            "pkg.example".to_string(),
            "plain.example:9418".to_string(),
            "127.0.0.1".to_string(),
            "127.0.0.1:9418".to_string(),
            format!("127.0.0.1:{port}"),
        ])
        .unwrap(),
        resolver: Arc::new(agentbox::egress::PinnedResolver(vec![
            ("pkg.example".into(), rec.addr),
            ("plain.example".into(), rec.addr),
        ])),
        own: HashSet::new(),
    };
    let p = Proxy::start(policy, Limits::default(), None).unwrap();

    // The right name, in three records sent as three segments: it arrives upstream whole.
    let good = refragment(&client_hello("pkg.example"), 100);
    let (a, rest) = good.split_at(7);
    let (b, c) = rest.split_at(rest.len() / 2);
    let got = in_parts(&p, &[b"CONNECT pkg.example:443 HTTP/1.1\r\n\r\n", a, b, c]).await;
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(rec.connections(1).await, vec![good.clone()]);
    assert!(decisions(&p, 1).await[0].allowed);

    // Another name, no name, or not TLS at all: refused, nothing reaches the server.
    let other = client_hello("other.example");
    // rustls sends no SNI for an address.
    let no_sni = client_hello("127.0.0.2");
    for (bytes, why) in [
        (
            other.clone(),
            "the TLS ClientHello asks for other.example, not the CONNECT host",
        ),
        (no_sni, "the TLS ClientHello names no server (no SNI)"),
        (
            b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n".to_vec(),
            "not TLS",
        ),
    ] {
        let n = p.decisions().len();
        in_parts(&p, &[b"CONNECT pkg.example:443 HTTP/1.1\r\n\r\n", &bytes]).await;
        let d = decisions(&p, n + 1).await;
        let last = &d[n];
        assert!(!last.allowed, "{last:?}");
        assert!(
            last.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("blocked pkg.example:443 — ") && r.contains(why)),
            "{last:?} wants {why}"
        );
    }
    assert_eq!(
        rec.connections(1).await.len(),
        1,
        "a refused tunnel reached the server"
    );

    // Not read: a CONNECT to an address an IP rule names, and to a name on a port its rule names.
    let plain = b"not tls at all\n".to_vec();
    in_parts(
        &p,
        &[
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes(),
            &plain,
        ],
    )
    .await;
    in_parts(&p, &[b"CONNECT plain.example:9418 HTTP/1.1\r\n\r\n", &plain]).await;
    let sent = rec.connections(3).await;
    assert_eq!(&sent[1..], &[plain.clone(), plain], "{sent:?}");
}
