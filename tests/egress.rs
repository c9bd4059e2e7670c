//! The egress proxy: driven over its Unix socket from the host, and from inside a real sandbox
//! through the executor's loopback forwarder. Every destination is on 127.0.0.1; private
//! ranges are only ever answers of an injected resolver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentbox::egress::{Allowlist, Decision, Limits, Policy, Proxy, StaticResolver};
use agentbox::sandbox::{ExecRequest, Sandbox};
use support::upstream::{Body, Upstream};
use support::*;
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
            name: "test-first",
            socket: first,
            direction: Direction::Outbound { port: 4101 },
            purpose: "a test service",
        },
        Forward {
            name: "test-second",
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
