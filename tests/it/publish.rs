//! `--publish [HOST_PORT:]PORT`: a server in the sandbox (which keeps no network) answers the
//! host through the published port; the port listens on loopback only and closes with the
//! session; and a sandbox that replaces its side of the transport still cannot make the host
//! connect anywhere.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// `agentbox exec --publish 0:8000 PROJECT -- bash -c SCRIPT` with stdin kept open (the script
/// ends when it reads EOF), up to its "agentbox: http://ADDR:P -> sandbox:8000" line.
struct Published {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    stderr: std::sync::mpsc::Receiver<String>,
}

fn publish(project: &Project, script: &str, extra: &[&str]) -> Published {
    let mut child = agentbox()
        .args([
            "exec",
            "-i",
            "--image",
            agentbox::sandbox::image::DEFAULT_IMAGE,
            "--publish",
            "0:8000",
        ])
        .args(extra)
        .arg(project.path())
        .args(["--", "bash", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentbox exec");
    let stdin = child.stdin.take();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let port = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no published line; stderr so far: {seen:?}"));
        if let Some(rest) = line.strip_prefix("agentbox: http://") {
            let (addr, target) = rest.split_once(' ').unwrap();
            assert_eq!(target, "-> sandbox:8000", "{line}");
            let (_, port) = addr.rsplit_once(':').unwrap();
            break port.parse().unwrap();
        }
        seen.push(line);
    };
    Published {
        child,
        stdin,
        port,
        stderr: rx,
    }
}

impl Published {
    /// End the session (EOF on the script's stdin) and wait for agentbox to exit.
    fn end(mut self) -> (std::process::ExitStatus, Vec<String>) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        (status, self.stderr.try_iter().collect())
    }
}

/// One HTTP/1.0 request to 127.0.0.1:`port`; the whole answer, or the error.
fn get(port: u16, path: &str) -> std::io::Result<String> {
    get_as(port, path, &format!("127.0.0.1:{port}"))
}

/// The same, naming `host` (as a browser does the name in its address bar).
fn get_as(port: u16, path: &str, host: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The first answer that is not empty (the server in the sandbox starts after the port is
/// published: until then a client's connection is closed without one).
fn get_when_up(port: u16, path: &str) -> String {
    let start = Instant::now();
    loop {
        match get(port, path) {
            Ok(answer) if !answer.is_empty() => return answer,
            other => assert!(
                start.elapsed() < Duration::from_secs(30),
                "no answer through the published port: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every local address listening on TCP `port` (`/proc/net/tcp` and `tcp6`), in the kernel's
/// hex.
fn listeners(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ...; st 0A is LISTEN.
            let Some((addr, p)) = fields[1].rsplit_once(':') else {
                continue;
            };
            if fields[3] == "0A" && u16::from_str_radix(p, 16).unwrap() == port {
                found.push(addr.to_string());
            }
        }
    }
    found
}

const SERVE: &str =
    "cd /workspace && python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & read _; kill %1; exit 0";

#[tokio::test]
async fn a_server_in_the_sandbox_answers_the_host_on_loopback_until_the_session_ends() {
    let project = Project::new(&[("index.html", "hello from the sandbox\n")]);
    let p = publish(&project, SERVE, &[]);
    let port = p.port;
    let answer = get_when_up(port, "/index.html");
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.ends_with("hello from the sandbox\n"), "{answer}");
    // Several at once, each its own connection through the sandbox.
    let many: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || get(port, "/index.html").unwrap()))
        .collect();
    for t in many {
        assert!(t.join().unwrap().ends_with("hello from the sandbox\n"));
    }
    assert!(
        get_as(port, "/index.html", &format!("localhost:{port}"))
            .unwrap()
            .ends_with("sandbox\n")
    );
    // A web page that makes its own name resolve to 127.0.0.1 (DNS rebinding) gets a page of
    // the sandbox's only as its own origin: its requests name it, and are refused here.
    let rebound = get_as(port, "/index.html", &format!("rebind.example:{port}")).unwrap();
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    assert!(!rebound.contains("hello from the sandbox"), "{rebound}");
    // Loopback only: the one listener on the port is 127.0.0.1's (0100007F in the kernel's
    // byte order), not 0.0.0.0, not any other address of this machine.
    assert_eq!(listeners(port), vec!["0100007F".to_string()]);
    let (status, stderr) = p.end();
    assert!(status.success(), "{stderr:?}");
    // The session is over: the port is closed, and the sandbox is gone.
    let refused = TcpStream::connect(("127.0.0.1", port));
    assert!(
        refused.is_err(),
        "the published port still accepts after the session"
    );
    assert!(listeners(port).is_empty());
}

#[tokio::test]
async fn another_address_needs_its_own_flag() {
    let project = Project::new(&[]);
    // The address form of docker's -p is refused, with the way to ask for it.
    let out = run(agentbox()
        .args(["exec", "--publish", "0.0.0.0:8000:8000"])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--unsafe-publish-address"),
        "{}",
        text(&out.stderr)
    );
    // Asked for, it listens there (another loopback address: tests listen on nothing else).
    let p = publish(&project, SERVE, &["--unsafe-publish-address", "127.0.0.2"]);
    assert_eq!(listeners(p.port), vec!["0200007F".to_string()]);
    let (status, stderr) = p.end();
    assert!(status.success(), "{stderr:?}");
}

/// The sandbox tries to replace its side of the transport: it points its socket, and a socket
/// path in the project (which the host can see), at the Docker socket, and it answers the
/// host's connections itself, with garbage naming the Docker socket and with a server of its
/// own. Every answer the host relays is the sandbox's; none is the engine's (`GET /version`
/// on the Docker socket names its ApiVersion).
#[tokio::test]
async fn a_sandbox_that_replaces_its_side_cannot_make_the_host_connect_elsewhere() {
    const IMPOSTOR: &str = r#"
import socket, sys, threading
path = "/run/agentbox-publish-8000.sock"
def one(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if s.recv(1) != b"c":
        return
    if n % 2:
        # Not the protocol: a path, as if the host would follow it.
        s.sendall(b"/var/run/docker.sock\n")
    else:
        # A server of its own, which reads the request as a server does.
        s.sendall(b"+")
        request = b""
        while b"\r\n\r\n" not in request:
            request += s.recv(4096)
        s.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nimpostor")
    s.close()
threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
for t in threads: t.start()
print("impostors waiting", flush=True)
for t in threads: t.join()
"#;
    let project = Project::new(&[("index.html", "the real server\n"), ("impostor.py", IMPOSTOR)]);
    let script = "cd /workspace && python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & \
         ln -sf /var/run/docker.sock /run/agentbox-publish-8000.sock 2>>/workspace/tries; \
         rm -f /run/agentbox-publish-8000.sock 2>>/workspace/tries; \
         mv /run/agentbox-publish-8000.sock /run/moved.sock 2>>/workspace/tries; \
         ln -s /var/run/docker.sock /workspace/port.sock; \
         python3 /workspace/impostor.py > /workspace/impostor.log 2>&1 & \
         read _; kill %1 %2 2>/dev/null; exit 0";
    let p = publish(&project, script, &[]);
    let port = p.port;
    get_when_up(port, "/index.html");
    let start = Instant::now();
    while !project.read("impostor.log").contains("waiting") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the impostor did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its connections queue behind the executor's own: enough requests reach all of them.
    let mut impostor = 0;
    for _ in 0..16 {
        let answer = get(port, "/version").unwrap_or_default();
        assert!(
            !answer.contains("ApiVersion") && !answer.contains("Docker"),
            "the host relayed the engine's answer: {answer}"
        );
        assert!(
            answer.is_empty() || answer.ends_with("impostor") || answer.contains("404"),
            "an answer from neither server in the sandbox: {answer}"
        );
        if answer.ends_with("impostor") {
            impostor += 1;
        }
    }
    assert_eq!(impostor, 3, "every impostor that answered was relayed, once");
    // The port still works for the real server afterwards.
    assert!(get_when_up(port, "/index.html").ends_with("the real server\n"));
    let (status, stderr) = p.end();
    assert!(status.success(), "{stderr:?}");
    // The mount could not be replaced (the attempts failed), for what that is worth: the host
    // never connects to it either way.
    let tries = project.read("tries");
    assert_eq!(tries.lines().count(), 3, "{tries}");
}
