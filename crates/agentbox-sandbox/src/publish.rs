//! Published ports (`--publish [HOST_PORT:]PORT`): this machine's `127.0.0.1:HOST_PORT` joined
//! to the sandbox's own `127.0.0.1:PORT`, through an inbound [`Forward`].
//!
//! The sandbox keeps `network_mode: none`, and the host never connects to anything the
//! sandbox could name or replace (a swapped socket path could be the engine's own socket). The
//! host listens twice: on the TCP port for clients, and on a Unix socket in a private directory
//! of its own, bind-mounted read-only into the sandbox, where the executor keeps a few
//! connections waiting. A client's arrival is one byte ([`GO`]) on a waiting connection; the
//! executor connects to the port inside and answers one byte ([`JOINED`] or [`REFUSED`]); then
//! bytes are copied both ways. Whatever the sandbox sends, and whoever in it connects to the
//! socket, the host only accepts, reads, writes and closes.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Mutex, Semaphore, mpsc, watch};

use super::policy::{Direction, Forward};

/// "A client arrived: connect to the port."
pub(crate) const GO: u8 = b'c';
/// "Connected; what follows is the port's."
pub(crate) const JOINED: u8 = b'+';
/// "Nothing listens on the port."
pub(crate) const REFUSED: u8 = b'-';

/// Clients joined at once per published port; more are closed as they arrive (each costs two
/// threads in the sandbox, counted against its pids limit).
pub(crate) const MAX_CLIENTS: usize = 64;
/// Waiting connections from the sandbox the host keeps; more are closed (the executor keeps
/// two; anything past a few is a sandbox trying to hold the host's file descriptors).
const MAX_WAITING: usize = 8;
/// How long a client waits for the sandbox to offer a connection, and for its answer.
const WAIT: Duration = Duration::from_secs(10);
/// How long a new client has to speak before it is taken for one that waits for the server
/// to speak first (no browser does): its connection then goes through unread.
const SPEAKS_FIRST: Duration = Duration::from_millis(300);
/// The most of a first request head read before it is passed on (browsers send a few KiB).
const MAX_HEAD: usize = 16 << 10;

/// One `--publish`: where the host listens, and the sandbox port it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishSpec {
    pub address: IpAddr,
    /// 0: any free port (the one chosen is printed).
    pub host_port: u16,
    pub port: u16,
}

/// A `--publish` value that is not `[HOST_PORT:]PORT`, with what is wrong and the form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPublish(pub String);

impl PublishSpec {
    /// `[HOST_PORT:]PORT`, listening on loopback.
    pub fn parse(value: &str) -> Result<PublishSpec, BadPublish> {
        let port = |text: &str, what: &str, zero: bool| -> Result<u16, BadPublish> {
            match text.trim().parse::<u16>() {
                Ok(0) if !zero => Err(BadPublish(format!(
                    "--publish {value}: {what} must be 1 to 65535"
                ))),
                Ok(p) => Ok(p),
                Err(_) => Err(BadPublish(format!(
                    "--publish {value}: {what} must be a port number (the form is [HOST_PORT:]PORT)"
                ))),
            }
        };
        let parts: Vec<&str> = value.split(':').collect();
        let (host_port, sandbox_port) = match parts.as_slice() {
            [p] => {
                let p = port(p, "PORT", false)?;
                (p, p)
            }
            [h, p] => (port(h, "HOST_PORT", true)?, port(p, "PORT", false)?),
            _ => {
                return Err(BadPublish(format!(
                    "--publish {value}: the form is [HOST_PORT:]PORT; the host side always listens on \
                     127.0.0.1 (another address needs --unsafe-publish-address)"
                )));
            }
        };
        Ok(PublishSpec {
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            host_port,
            port: sandbox_port,
        })
    }
}

/// A published port's host side, listening; dropping it closes the port, every connection
/// through it, and its socket.
pub struct Publisher {
    spec: PublishSpec,
    local: SocketAddr,
    socket: PathBuf,
    _dir: tempfile::TempDir,
    ready: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// The `Host` values a browser sends for this port when it really means this machine's
/// loopback; `None` (no check) on a non-loopback address, whose names agentbox cannot know.
fn own_hosts(local: SocketAddr) -> Option<Arc<Vec<String>>> {
    if !local.ip().is_loopback() {
        return None;
    }
    let port = local.port();
    let mut names = vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        "[::1]".to_string(),
        match local.ip() {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        },
    ];
    names.dedup();
    let mut hosts: Vec<String> = names.iter().map(|n| format!("{n}:{port}")).collect();
    if port == 80 {
        hosts.extend(names);
    }
    Some(Arc::new(hosts))
}

impl Publisher {
    /// Listen on the host port and on a fresh socket in a new private directory (inside a
    /// tokio runtime).
    pub fn start(spec: PublishSpec) -> std::io::Result<Publisher> {
        let tcp = std::net::TcpListener::bind((spec.address, spec.host_port))?;
        tcp.set_nonblocking(true)?;
        let local = tcp.local_addr()?;
        let tcp = TcpListener::from_std(tcp)?;
        let dir = tempfile::Builder::new().prefix("agentbox-publish-").tempdir()?;
        let socket = dir.path().join("port.sock");
        let unix = UnixListener::bind(&socket)?;
        // The sandbox user is the project's owner, not necessarily us: it must be able to
        // connect. Whoever connects only gets to answer clients of this port.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        let (ready_tx, ready) = watch::channel(false);
        let task = tokio::spawn(serve(tcp, unix, ready_tx, own_hosts(local)));
        Ok(Publisher {
            spec,
            local,
            socket,
            _dir: dir,
            ready,
            task,
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn spec(&self) -> PublishSpec {
        self.spec
    }

    /// The sandbox's side, for [`super::Extras::forwards`].
    pub fn forward(&self) -> Forward {
        Forward {
            name: format!("publish-{}", self.spec.port),
            socket: self.socket.clone(),
            direction: Direction::Inbound { port: self.spec.port },
            purpose: "a published port (--publish)",
        }
    }

    /// Resolves once the sandbox's side has connected (a client can then be joined; whether
    /// anything listens on the port inside is the sandbox's business).
    pub fn ready(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut ready = self.ready.clone();
        async move {
            let _ = ready.wait_for(|r| *r).await;
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Waiting = Arc<Mutex<mpsc::Receiver<UnixStream>>>;

async fn serve(
    tcp: TcpListener,
    unix: UnixListener,
    ready: watch::Sender<bool>,
    hosts: Option<Arc<Vec<String>>>,
) {
    let (offer, waiting) = mpsc::channel::<UnixStream>(MAX_WAITING);
    let waiting: Waiting = Arc::new(Mutex::new(waiting));
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    // Connections die with the port: they are spawned into a set this task owns.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = unix.accept() => match accepted {
                // Past MAX_WAITING the connection is dropped, that is closed.
                Ok((sandbox, _)) => {
                    if offer.try_send(sandbox).is_ok() {
                        ready.send_replace(true);
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            accepted = tcp.accept() => match accepted {
                Ok((client, _)) => match slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let waiting = waiting.clone();
                        let hosts = hosts.clone();
                        conns.spawn(async move {
                            join(client, &waiting, hosts.as_deref().map(Vec::as_slice)).await;
                            drop(permit);
                        });
                    }
                    Err(_) => drop(client),
                },
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Join `client` to the port inside, through one of the sandbox's waiting connections. One
/// that is gone or answers anything but the protocol's byte is closed and the next tried,
/// until [`WAIT`] has passed. A first HTTP request that names another host (`hosts`) is
/// answered here and never reaches the sandbox.
async fn join(mut client: TcpStream, waiting: &Waiting, hosts: Option<&[String]>) {
    let Ok(first) = first_bytes(&mut client).await else {
        return;
    };
    if let Some(hosts) = hosts
        && let Some(host) = foreign_host(&first, hosts)
    {
        tracing::info!(host = %host.escape_debug(), "published port: a request for another host refused");
        let body = "agentbox: this published port answers requests for 127.0.0.1 and localhost only \
                    (another name that resolves to this machine is how DNS rebinding reaches it)\n";
        let head = format!(
            "HTTP/1.1 421 Misdirected Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = client.write_all(head.as_bytes()).await;
        let _ = client.write_all(body.as_bytes()).await;
        let _ = client.shutdown().await;
        return;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let next = {
            let mut waiting = waiting.lock().await;
            tokio::time::timeout_at(deadline, waiting.recv()).await
        };
        let Ok(Some(mut sandbox)) = next else {
            return;
        };
        if sandbox.write_all(&[GO]).await.is_err() {
            continue;
        }
        let mut answer = [0u8; 1];
        match tokio::time::timeout_at(deadline, sandbox.read(&mut answer)).await {
            Ok(Ok(1)) if answer[0] == JOINED => {
                let _ = client.set_nodelay(true);
                relay(&mut client, &mut sandbox, &first).await;
                return;
            }
            // Nothing listens inside: the client's connection is closed, as a refused one.
            Ok(Ok(1)) if answer[0] == REFUSED => return,
            Err(_) => return,
            _ => continue,
        }
    }
}

/// What the client sends before the sandbox is asked: nothing if it waits for the server
/// to speak first ([`SPEAKS_FIRST`]); the first request's head (bounded) if it speaks HTTP;
/// else its first bytes. `Err`: it went away.
async fn first_bytes(client: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    match tokio::time::timeout(SPEAKS_FIRST, client.read(&mut chunk)).await {
        Err(_) => return Ok(buf),
        Ok(Ok(0)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        Ok(Err(e)) => return Err(e),
    }
    if !looks_like_http(&buf) {
        return Ok(buf);
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while head_end(&buf).is_none() && buf.len() < MAX_HEAD {
        match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    Ok(buf)
}

/// A request line's start: a method token (capitals) and a space.
fn looks_like_http(buf: &[u8]) -> bool {
    let method = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    (3..=10).contains(&method) && buf.get(method) == Some(&b' ')
}

fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// The `Host` of an HTTP request head when it is not one of `hosts` (compared without case).
/// A head without one passes: browsers always send it, and only a browser can be made to
/// connect by a web page.
fn foreign_host(buf: &[u8], hosts: &[String]) -> Option<String> {
    if !looks_like_http(buf) {
        return None;
    }
    let head = &buf[..head_end(buf).unwrap_or(buf.len())];
    let head = String::from_utf8_lossy(head);
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("host") {
            let value = value.trim();
            return (!hosts.iter().any(|h| h.eq_ignore_ascii_case(value))).then(|| value.to_string());
        }
    }
    None
}

/// Copy both ways (the client's `first` bytes, read already, ahead) until both directions end, each direction's end passed on as a shutdown:
/// one direction failing (a server that answers and closes before reading the whole request)
/// does not cut the other short, as `copy_bidirectional` would.
async fn relay(client: &mut TcpStream, sandbox: &mut UnixStream, first: &[u8]) {
    let (mut client_in, mut client_out) = client.split();
    let (mut sandbox_in, mut sandbox_out) = sandbox.split();
    let up = async {
        if sandbox_out.write_all(first).await.is_ok() {
            let _ = tokio::io::copy(&mut client_in, &mut sandbox_out).await;
        }
        let _ = sandbox_out.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut sandbox_in, &mut client_out).await;
        let _ = client_out.shutdown().await;
    };
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_another_host_is_foreign() {
        let hosts = own_hosts("127.0.0.1:8000".parse().unwrap()).unwrap();
        let req = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n");
        for ours in ["127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000", "[::1]:8000"] {
            assert_eq!(foreign_host(req(ours).as_bytes(), &hosts), None, "{ours}");
        }
        for theirs in ["rebind.example:8000", "127.0.0.1:9000", "localhost", "127.0.0.1"] {
            assert_eq!(
                foreign_host(req(theirs).as_bytes(), &hosts).as_deref(),
                Some(theirs),
                "{theirs}"
            );
        }
        // Not HTTP, or HTTP without a Host: not a browser's, passed on.
        assert_eq!(foreign_host(b"\x16\x03\x01 hello", &hosts), None);
        assert_eq!(foreign_host(b"GET / HTTP/1.0\r\n\r\n", &hosts), None);
        assert!(own_hosts("0.0.0.0:8000".parse().unwrap()).is_none());
        let on_80 = own_hosts("127.0.0.1:80".parse().unwrap()).unwrap();
        assert_eq!(foreign_host(req("localhost").as_bytes(), &on_80), None);
    }

    #[test]
    fn the_forms_of_publish() {
        let p = PublishSpec::parse("8000").unwrap();
        assert_eq!((p.host_port, p.port), (8000, 8000));
        assert!(p.address.is_loopback());
        let p = PublishSpec::parse("0:3000").unwrap();
        assert_eq!((p.host_port, p.port), (0, 3000));
        for bad in ["", "0", "8000:0", "x", "70000", "0.0.0.0:80:80", "1:2:3", "-1"] {
            assert!(PublishSpec::parse(bad).is_err(), "{bad}");
        }
        assert!(
            PublishSpec::parse("0.0.0.0:80:80")
                .unwrap_err()
                .0
                .contains("--unsafe-publish-address")
        );
    }

    /// Past MAX_CLIENTS, a client is closed at once instead of queueing behind the others
    /// (which wait for a sandbox side that never comes).
    #[tokio::test]
    async fn clients_are_bounded() {
        let p = Publisher::start(PublishSpec {
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            host_port: 0,
            port: 1,
        })
        .unwrap();
        let mut held = Vec::new();
        for _ in 0..MAX_CLIENTS {
            held.push(TcpStream::connect(p.local_addr()).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut extra = TcpStream::connect(p.local_addr()).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        // The held ones are still waiting, not closed.
        let read = tokio::time::timeout(Duration::from_millis(200), held[0].read(&mut buf)).await;
        assert!(read.is_err(), "{read:?}");
    }

    /// The host's side against a scripted sandbox side: the handshake, a refused port, a
    /// waiting connection that answers garbage (the next one is used), and no sandbox at all.
    #[tokio::test]
    async fn a_client_is_joined_through_a_waiting_connection() {
        let p = Publisher::start(PublishSpec {
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            host_port: 0,
            port: 1,
        })
        .unwrap();
        let socket = p.forward().socket;
        // The first waiting connection answers garbage; the second is joined.
        let mut garbage = UnixStream::connect(&socket).await.unwrap();
        p.ready().await;
        let mut good = UnixStream::connect(&socket).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let garbage = async move {
            let mut go = [0u8; 1];
            garbage.read_exact(&mut go).await.unwrap();
            assert_eq!(go[0], GO);
            garbage.write_all(b"/var/run/docker.sock").await.unwrap();
        };
        let sandbox = async move {
            let mut go = [0u8; 1];
            good.read_exact(&mut go).await.unwrap();
            assert_eq!(go[0], GO);
            good.write_all(&[JOINED]).await.unwrap();
            let mut req = [0u8; 4];
            good.read_exact(&mut req).await.unwrap();
            assert_eq!(&req, b"ping");
            good.write_all(b"pong").await.unwrap();
        };
        let client = async {
            let mut c = TcpStream::connect(p.local_addr()).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            c.shutdown().await.unwrap();
            let mut reply = Vec::new();
            c.read_to_end(&mut reply).await.unwrap();
            reply
        };
        let ((), (), reply) = tokio::join!(garbage, sandbox, client);
        assert_eq!(reply, b"pong");
        // A refused port: the client's connection ends with nothing.
        let refused = async {
            let mut s = UnixStream::connect(&socket).await.unwrap();
            let mut go = [0u8; 1];
            s.read_exact(&mut go).await.unwrap();
            s.write_all(&[REFUSED]).await.unwrap();
        };
        let client = async {
            let mut c = TcpStream::connect(p.local_addr()).await.unwrap();
            let mut reply = Vec::new();
            let _ = c.read_to_end(&mut reply).await;
            reply
        };
        let ((), reply) = tokio::join!(refused, client);
        assert!(reply.is_empty());
        let addr = p.local_addr();
        drop(p);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the port closes with its publisher"
        );
    }
}
