//! The proxy itself: HTTP/1.1 `CONNECT host:port` (for TLS: the ClientHello must ask for the
//! CONNECT host; the bytes after it are opaque) and plain HTTP with an absolute URI
//! (`GET http://host/path`), one request per connection, written upstream by the proxy from
//! what it checked (see `http`).
//! It listens on a Unix socket; the sandbox reaches it through its executor (see
//! `sandbox::executor`), never through a network of its own.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::http::{BodyEnd, parse_head};
use super::matcher::{Allowlist, DEFAULT_PORTS, Target};
use super::resolve::{Resolve, special};

/// The bounds on what goes through the proxy.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once; one more is answered 503 at once.
    pub max_connections: usize,
    /// For the request head to arrive, and for the upstream connection to open.
    pub header_timeout: Duration,
    pub connect_timeout: Duration,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// The longest one connection may live.
    pub max_connection_time: Duration,
    /// Bytes through the proxy in both directions, over its whole life (all connections).
    pub max_total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(120),
            max_connection_time: Duration::from_secs(30 * 60),
            max_total_bytes: 16 << 30,
        }
    }
}

/// The largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// One decision of the proxy, recorded when its connection ends.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// `CONNECT` or the plain HTTP method.
    pub method: String,
    /// Why it was refused, or why an allowed connection was cut short.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The address connected to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Bytes from the sandbox to the destination, and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
}

pub type Observer = Arc<dyn Fn(&Decision) + Send + Sync>;

/// Which destinations are allowed, and how names become addresses.
#[derive(Clone)]
pub struct Policy {
    pub allowlist: Allowlist,
    pub resolver: Arc<dyn Resolve>,
    /// The host's own addresses (see `resolve::own_addresses`).
    pub own: HashSet<IpAddr>,
}

/// A refusal, with the line the user sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

fn suggestion(host: &str, port: u16) -> String {
    let h = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    if DEFAULT_PORTS.contains(&port) {
        h
    } else {
        format!("{h}:{port}")
    }
}

impl Policy {
    /// The one address to connect to, or why not. The address returned is the one checked: the
    /// caller connects to it and resolves nothing again.
    pub async fn check(&self, host: &str, port: u16) -> Result<SocketAddr, Refusal> {
        let blocked = |host: &str| {
            Refusal(format!(
                "blocked {host}:{port} — not in the allowlist; allow it with --allow-host {}",
                suggestion(host, port)
            ))
        };
        match Target::parse(host) {
            None => Err(Refusal(format!(
                "blocked {host}:{port} — not a host name or address"
            ))),
            // An address given as such is allowed only by a rule naming it: no name rule can
            // stand for it, and naming it is explicit enough to reach a private one.
            Some(Target::Ip(ip)) => {
                if self.allowlist.names_ip(ip, port) {
                    Ok(SocketAddr::new(ip, port))
                } else {
                    Err(blocked(&ip.to_string()))
                }
            }
            Some(Target::Name(name)) => {
                if !self.allowlist.allows_name(&name, port) {
                    return Err(blocked(&name));
                }
                let ips = self
                    .resolver
                    .resolve(&name, port)
                    .await
                    .map_err(|e| Refusal(format!("blocked {name}:{port} — it does not resolve ({e})")))?;
                let mut why = None;
                for addr in ips {
                    let ip = super::matcher::canonical(addr.ip());
                    match special(ip, &self.own) {
                        None => return Ok(SocketAddr::new(ip, addr.port())),
                        Some(_) if self.allowlist.names_ip(ip, port) => {
                            return Ok(SocketAddr::new(ip, addr.port()));
                        }
                        Some(kind) => {
                            why.get_or_insert((ip, kind));
                        }
                    }
                }
                Err(match why {
                    Some((ip, kind)) => Refusal(format!(
                        "blocked {name}:{port} — it resolves to {ip}, {kind}, which a host name cannot \
                         allow; allow the address itself with --allow-host {}",
                        suggestion(&ip.to_string(), port)
                    )),
                    None => Refusal(format!("blocked {name}:{port} — it resolves to no address")),
                })
            }
        }
    }
}

struct Shared {
    policy: std::sync::RwLock<Policy>,
    limits: Limits,
    observer: Option<Observer>,
    decisions: Mutex<Vec<Decision>>,
    total: AtomicU64,
    slots: Arc<Semaphore>,
}

impl Shared {
    fn record(&self, d: Decision) {
        if let Some(o) = &self.observer {
            o(&d);
        }
        self.decisions.lock().unwrap_or_else(|e| e.into_inner()).push(d);
    }
}

/// A running proxy on a Unix socket in a directory of its own; dropping it stops it and removes
/// the socket.
pub struct Proxy {
    socket: PathBuf,
    _dir: Option<tempfile::TempDir>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on a fresh socket in a new private directory.
    pub fn start(policy: Policy, limits: Limits, observer: Option<Observer>) -> io::Result<Proxy> {
        let dir = tempfile::Builder::new().prefix("agentbox-egress-").tempdir()?;
        let socket = dir.path().join("proxy.sock");
        let mut p = Self::listen_at(&socket, policy, limits, observer)?;
        // The sandbox user is the project's owner, not necessarily us: it must be able to
        // reach the socket (a connection gets exactly what the allowlist allows, whoever
        // makes it).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        p._dir = Some(dir);
        Ok(p)
    }

    /// Listen at `socket` (which must not exist).
    pub fn listen_at(
        socket: &Path,
        policy: Policy,
        limits: Limits,
        observer: Option<Observer>,
    ) -> io::Result<Proxy> {
        let listener = UnixListener::bind(socket)?;
        let shared = Arc::new(Shared {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            policy: std::sync::RwLock::new(policy),
            limits,
            observer,
            decisions: Mutex::new(Vec::new()),
            total: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            socket: socket.to_path_buf(),
            _dir: None,
            shared,
            task,
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Every decision so far (a connection's once it ended).
    pub fn decisions(&self) -> Vec<Decision> {
        self.shared
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Allow more destinations from now on (e.g. the registries the image's tools name, learnt
    /// once the sandbox runs).
    pub fn allow(&self, rules: impl IntoIterator<Item = super::Rule>) {
        let mut p = self.shared.policy.write().unwrap_or_else(|e| e.into_inner());
        p.allowlist.extend(rules);
    }

    /// The allowlist in force.
    pub fn allowlist(&self) -> Allowlist {
        self.shared
            .policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .allowlist
            .clone()
    }

    /// Bytes through the proxy so far.
    pub fn total_bytes(&self) -> u64 {
        self.shared.total.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        if self._dir.is_none() {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    // Connections die with the proxy: they are spawned into a set the loop owns.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let shared = shared.clone();
                match shared.slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        conns.spawn(async move {
                            handle(stream, &shared).await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        conns.spawn(async move {
                            let mut stream = stream;
                            let _ = respond(&mut stream, 503, "Service Unavailable",
                                "too many connections through the egress proxy at once\n").await;
                        });
                    }
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn respond<W: AsyncWrite + Unpin>(w: &mut W, code: u16, reason: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).await?;
    w.write_all(body.as_bytes()).await?;
    w.shutdown().await
}

/// Read up to the end of the head; returns (head text, bytes after it).
async fn read_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<(String, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head =
                String::from_utf8(buf[..end].to_vec()).map_err(|_| "the head is not UTF-8".to_string())?;
            return Ok((head, buf[end + 4..].to_vec()));
        }
        if buf.len() > MAX_HEAD {
            return Err("request head too large".into());
        }
        let n = r.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before the request head ended".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The method and target of a request line the parser refused, bounded (a head is up to 16 KiB
/// of whatever the sandbox wrote).
fn request_line_words(head: &str) -> (String, String) {
    const MAX: usize = 200;
    let first = head.split(['\r', '\n']).next().unwrap_or_default();
    let mut words = first.split(' ');
    let bounded = |w: Option<&str>| {
        let w = w.unwrap_or_default();
        let mut end = w.len().min(MAX);
        while !w.is_char_boundary(end) {
            end -= 1;
        }
        if end < w.len() {
            format!("{}…", &w[..end])
        } else {
            w.to_string()
        }
    };
    let method = bounded(words.next());
    let target = bounded(words.next());
    (
        method,
        if target.is_empty() {
            "(no target)".into()
        } else {
            target
        },
    )
}

async fn handle(mut client: tokio::net::UnixStream, shared: &Shared) {
    let limits = &shared.limits;
    let head = match tokio::time::timeout(limits.header_timeout, read_head(&mut client)).await {
        Ok(Ok(h)) => h,
        // Nothing to record: no destination was named.
        Ok(Err(why)) => {
            let _ = respond(&mut client, 400, "Bad Request", &format!("{why}\n")).await;
            return;
        }
        Err(_) => return,
    };
    let (head, rest) = head;
    let req = match parse_head(&head) {
        Ok(r) => r,
        Err(why) => {
            let _ = respond(&mut client, 400, "Bad Request", &format!("{why}\n")).await;
            // A head the parser refuses still named a destination: the user sees the refusal
            // like any other (the line is escaped where it is printed, never here).
            let (method, target) = request_line_words(&head);
            shared.record(Decision {
                reason: Some(format!("blocked {target} — {why}")),
                host: target,
                port: 0,
                allowed: false,
                method,
                address: None,
                bytes_up: 0,
                bytes_down: 0,
            });
            return;
        }
    };
    let mut decision = Decision {
        host: req.host.clone(),
        port: req.port,
        allowed: false,
        method: req.method.clone(),
        reason: None,
        address: None,
        bytes_up: 0,
        bytes_down: 0,
    };
    if shared.total.load(Ordering::Relaxed) >= limits.max_total_bytes {
        let why = "blocked: the egress byte limit for this session is used up".to_string();
        let _ = respond(&mut client, 403, "Forbidden", &format!("{why}\n")).await;
        decision.reason = Some(why);
        shared.record(decision);
        return;
    }
    let policy = shared.policy.read().unwrap_or_else(|e| e.into_inner()).clone();
    let addr = match policy.check(&req.host, req.port).await {
        Ok(a) => a,
        Err(Refusal(line)) => {
            tracing::info!(%line, "egress refused");
            let _ = respond(&mut client, 403, "Forbidden", &format!("{line}\n")).await;
            decision.reason = Some(line);
            shared.record(decision);
            return;
        }
    };
    // A CONNECT to a name: the ClientHello must ask for that name, or the tunnel could reach
    // any other site the same address serves (a CDN's other tenants). Read before connecting:
    // TLS speaks first, and nothing reaches the destination unless it passes.
    let mut first = rest;
    let sni_name = match Target::parse(&req.host) {
        Some(Target::Name(name)) if req.forward.is_none() && policy.allowlist.wants_tls(&name, req.port) => {
            Some(name)
        }
        _ => None,
    };
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    if let Some(name) = &sni_name {
        if client.write_all(established).await.is_err() {
            shared.record(decision);
            return;
        }
        match tokio::time::timeout(limits.header_timeout, read_client_hello(&mut client, &mut first)).await {
            Ok(Ok(Some(asked)))
                if super::matcher::normalize_name(&asked).as_deref() == Some(name.as_str()) => {}
            outcome => {
                let why = match outcome {
                    Ok(Ok(Some(asked))) => {
                        format!("the TLS ClientHello asks for {asked}, not the CONNECT host")
                    }
                    Ok(Ok(None)) => "the TLS ClientHello names no server (no SNI)".to_string(),
                    Ok(Err(e)) => e,
                    Err(_) => format!("no TLS ClientHello within {}s", limits.header_timeout.as_secs()),
                };
                let line = format!("blocked {name}:{} — {why}", req.port);
                tracing::info!(%line, "egress refused");
                decision.reason = Some(line);
                shared.record(decision);
                return;
            }
        }
    }
    decision.allowed = true;
    decision.address = Some(addr.to_string());
    let upstream = match tokio::time::timeout(limits.connect_timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let why = format!("cannot connect to {addr}: {e}");
            if sni_name.is_none() {
                let _ = respond(&mut client, 502, "Bad Gateway", &format!("{why}\n")).await;
            }
            decision.reason = Some(why);
            shared.record(decision);
            return;
        }
        Err(_) => {
            let why = format!(
                "no connection to {addr} within {}s",
                limits.connect_timeout.as_secs()
            );
            if sni_name.is_none() {
                let _ = respond(&mut client, 504, "Gateway Timeout", &format!("{why}\n")).await;
            }
            decision.reason = Some(why);
            shared.record(decision);
            return;
        }
    };
    let mut upstream = upstream;
    if req.forward.is_none() && sni_name.is_none() && client.write_all(established).await.is_err() {
        shared.record(decision);
        return;
    }
    // Plain HTTP: the proxy's own head, then exactly the declared body.
    let mut body = None;
    if let Some(fwd) = &req.forward {
        let mut end = BodyEnd::new(fwd.body);
        let taken = match end.feed(&first) {
            Ok(n) => n,
            Err(why) => {
                let _ = respond(&mut client, 400, "Bad Request", &format!("{why}\n")).await;
                decision.reason = Some(format!("refused: {why}"));
                shared.record(decision);
                return;
            }
        };
        let extra = first.len() - taken;
        first.truncate(taken);
        let mut v = fwd.head.clone();
        v.extend_from_slice(&first);
        first = v;
        if extra > 0 {
            decision.reason = Some(after_the_body(extra as u64));
        }
        body = Some(end);
    }
    if !first.is_empty() {
        if upstream.write_all(&first).await.is_err() {
            shared.record(decision);
            return;
        }
        decision.bytes_up += first.len() as u64;
        shared.total.fetch_add(first.len() as u64, Ordering::Relaxed);
    }
    let refused_after = decision.reason.take();
    let (up, down, cut) = pump(&mut client, &mut upstream, shared, body).await;
    decision.bytes_up += up;
    decision.bytes_down += down;
    decision.reason = cut.or(refused_after);
    shared.record(decision);
}

fn after_the_body(extra: u64) -> String {
    format!("refused: {extra} bytes after the request's body were not forwarded (one request per connection)")
}

/// Read the client's ClientHello into `buf` (which may hold its start already), bounded; its
/// server name, or why it is none.
async fn read_client_hello(
    client: &mut tokio::net::UnixStream,
    buf: &mut Vec<u8>,
) -> Result<Option<String>, String> {
    let mut chunk = [0u8; 4096];
    loop {
        match super::tls::client_hello(buf) {
            Ok(Some(hello)) => return Ok(hello.server_name),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        let room = super::tls::MAX_INPUT + 1 - buf.len().min(super::tls::MAX_INPUT);
        let n = client
            .read(&mut chunk[..room.min(4096)])
            .await
            .map_err(|e| format!("the ClientHello could not be read: {e}"))?;
        if n == 0 {
            return Err("closed before the TLS ClientHello ended".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Copy both ways until both sides end, or a bound is hit. Returns the bytes each way and why
/// it was cut, if it was.
async fn pump(
    client: &mut tokio::net::UnixStream,
    upstream: &mut TcpStream,
    shared: &Shared,
    mut body: Option<BodyEnd>,
) -> (u64, u64, Option<String>) {
    let limits = &shared.limits;
    let (mut cr, mut cw) = client.split();
    let (mut ur, mut uw) = upstream.split();
    let mut a = vec![0u8; 64 * 1024];
    let mut b = vec![0u8; 64 * 1024];
    let (mut up, mut down) = (0u64, 0u64);
    let (mut client_done, mut upstream_done) = (false, false);
    let mut refused = None;
    let deadline = Instant::now() + limits.max_connection_time;
    let mut idle = Instant::now() + limits.idle_timeout;
    let cut = loop {
        if client_done && upstream_done {
            break None;
        }
        if shared.total.load(Ordering::Relaxed) > limits.max_total_bytes {
            break Some("cut: the egress byte limit for this session was reached".to_string());
        }
        tokio::select! {
            r = cr.read(&mut a), if !client_done => match r {
                Ok(0) | Err(_) => { client_done = true; let _ = uw.shutdown().await; }
                Ok(n) => {
                    // Plain HTTP: only what is left of the declared body goes on; a byte after
                    // it (a pipelined request) ends what is read from the client.
                    let take = match body.as_mut() {
                        None => n,
                        Some(end) if end.is_done() => 0,
                        Some(end) => match end.feed(&a[..n]) {
                            Ok(t) => t,
                            Err(why) => break Some(format!("cut: {why}")),
                        },
                    };
                    if take > 0 {
                        if uw.write_all(&a[..take]).await.is_err() { break None; }
                        up += take as u64;
                        shared.total.fetch_add(take as u64, Ordering::Relaxed);
                    }
                    if take < n {
                        refused = Some(after_the_body((n - take) as u64));
                        client_done = true;
                    }
                    idle = Instant::now() + limits.idle_timeout;
                }
            },
            r = ur.read(&mut b), if !upstream_done => match r {
                Ok(0) | Err(_) => { upstream_done = true; let _ = cw.shutdown().await; }
                Ok(n) => {
                    if cw.write_all(&b[..n]).await.is_err() { break None; }
                    down += n as u64;
                    shared.total.fetch_add(n as u64, Ordering::Relaxed);
                    idle = Instant::now() + limits.idle_timeout;
                }
            },
            _ = tokio::time::sleep_until(deadline) => break Some(format!(
                "cut: the connection outlived {}s", limits.max_connection_time.as_secs())),
            _ = tokio::time::sleep_until(idle) => break Some(format!(
                "cut: idle for {}s", limits.idle_timeout.as_secs())),
        }
    };
    (up, down, cut.or(refused))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::resolve::StaticResolver;

    fn policy(rules: &[&str], table: &[(&str, &str)]) -> Policy {
        Policy {
            allowlist: Allowlist::parse(rules).unwrap(),
            resolver: Arc::new(StaticResolver(
                table
                    .iter()
                    .map(|(n, ip)| (n.to_string(), vec![ip.parse().unwrap()]))
                    .collect(),
            )),
            own: HashSet::new(),
        }
    }

    #[tokio::test]
    async fn names_resolving_to_special_addresses_need_an_address_rule() {
        let p = policy(
            &["pkg.example", "meta.example", "lan.example", "ok.example"],
            &[
                ("pkg.example", "10.1.2.3"),
                ("meta.example", "169.254.169.254"),
                ("lan.example", "192.168.0.10"),
                ("ok.example", "203.0.113.9"),
            ],
        );
        for name in ["pkg.example", "meta.example", "lan.example"] {
            let Refusal(line) = p.check(name, 443).await.unwrap_err();
            assert!(
                line.starts_with(&format!("blocked {name}:443 — it resolves to ")),
                "{line}"
            );
        }
        // 203.0.113.0/24 is a documentation range, but not one of the special ones here.
        assert_eq!(
            p.check("ok.example", 443).await.unwrap(),
            "203.0.113.9:443".parse().unwrap()
        );
        // Naming the range explicitly allows the private answer.
        let p2 = policy(&["pkg.example", "10.0.0.0/8"], &[("pkg.example", "10.1.2.3")]);
        assert_eq!(
            p2.check("PKG.example.", 443).await.unwrap(),
            "10.1.2.3:443".parse().unwrap()
        );
    }

    #[tokio::test]
    async fn the_blocked_line_says_how_to_allow_it() {
        let p = policy(&["pkg.example"], &[]);
        let Refusal(line) = p.check("other.example", 443).await.unwrap_err();
        assert_eq!(
            line,
            "blocked other.example:443 — not in the allowlist; allow it with --allow-host other.example"
        );
        let Refusal(line) = p.check("pkg.example", 22).await.unwrap_err();
        assert!(line.ends_with("--allow-host pkg.example:22"), "{line}");
        let Refusal(line) = p.check("127.0.0.1", 8080).await.unwrap_err();
        assert!(line.ends_with("--allow-host 127.0.0.1:8080"), "{line}");
    }

    #[test]
    fn a_refused_heads_target_is_kept_bounded() {
        let (m, t) = request_line_words("CONNECT a\x1b]0;x.example:443 HTTP/1.1\r\nHost: x");
        assert_eq!((m.as_str(), t.as_str()), ("CONNECT", "a\x1b]0;x.example:443"));
        let long = format!("GET http://{}é/ HTTP/1.1", "a".repeat(199));
        let (_, t) = request_line_words(&long);
        assert!(t.ends_with('…') && t.chars().count() <= 201, "{t}");
        assert_eq!(request_line_words("").1, "(no target)");
    }
}
