//! `agentbox mcp` driven by a real third-party MCP client: the official MCP Python SDK from
//! PyPI, in a venv `scripts/mcp-client-venv` makes (idempotently) on first use. Real Docker.
#![allow(
    clippy::disallowed_macros,
    reason = "a test's own report (the peak RSS measured), not agentbox's output"
)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{Project, agentbox, containers_of_pid, docker, eventually, text};
use serde_json::Value;

/// The client's python; a venv that cannot be made fails the test with the reason (nothing is
/// skipped).
fn client_python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/mcp-client-venv"))
        .arg(root.join("target/mcp-client-venv"))
        .output()
        .expect("run scripts/mcp-client-venv");
    assert!(
        out.status.success(),
        "cannot make the MCP client's venv (the official MCP Python SDK from PyPI): {}",
        text(&out.stderr)
    );
    PathBuf::from(text(&out.stdout).trim())
}

fn run_client(project: &Project, extra: &[&str]) -> (Value, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let out = Command::new(client_python())
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_agentbox"))
        .arg(project.path())
        .args(extra)
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .output()
        .expect("run the MCP client");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "the MCP client failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("client output is not JSON ({e}): {}", text(&out.stdout)));
    (report, stderr)
}

fn session_of(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.split("sandbox ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no session id on stderr:\n{stderr}"))
        .to_string()
}

async fn containers_of_session(session: &str) -> usize {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let filters =
        std::collections::HashMap::from([("label".to_string(), vec![format!("agentbox.session={session}")])]);
    docker()
        .await
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
        .len()
}

fn result<'a>(report: &'a Value, key: &str) -> (&'a str, bool) {
    let r = &report[key];
    (
        r["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no result for {key}: {report}")),
        r["is_error"].as_bool().unwrap(),
    )
}

#[tokio::test]
async fn an_mcp_client_lists_and_calls_every_tool() {
    let _ = docker().await;
    let project = Project::new(&[("hello.py", "def greet():\n    return \"hello\"\n")]);
    let (report, stderr) = run_client(&project, &["--test-cmd", "grep -q howdy hello.py"]);

    let tools = report["tools"].as_object().unwrap();
    let names: Vec<&str> = tools.keys().map(String::as_str).collect();
    for name in [
        "list_files",
        "read_file",
        "edit_file",
        "search",
        "run_tests",
        "bash",
        "process_output",
        "stop_process",
        "diff",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for (name, read_only) in [
        ("read_file", true),
        ("list_files", true),
        ("search", true),
        ("diff", true),
    ]
    .into_iter()
    .chain([
        ("edit_file", false),
        ("bash", false),
        ("run_tests", false),
        ("process_output", true),
        ("stop_process", false),
    ]) {
        assert_eq!(tools[name]["read_only"], read_only, "annotation of {name}");
    }

    assert_eq!(result(&report, "list_files"), ("hello.py", false));
    assert!(result(&report, "read_file").0.contains("return \"hello\""));
    assert!(result(&report, "search").0.contains("hello.py:1:"));
    assert!(!result(&report, "edit_file").1, "{report}");
    // The edit is in the project, and the tests see it.
    assert_eq!(project.read("hello.py"), "def greet():\n    return \"howdy\"\n");
    let (tests, failed) = result(&report, "run_tests");
    assert!(!failed && tests.contains("exit 0"), "{tests}");
    assert!(
        result(&report, "diff").0.contains("+    return \"howdy\""),
        "{report}"
    );
    let (bash, failed) = result(&report, "bash");
    assert!(!failed && bash.contains("in-sandbox"), "{bash}");

    // Failures are results with isError, never protocol errors (the client would have thrown).
    let (outside, failed) = result(&report, "outside");
    assert!(failed && outside.contains("outside the project"), "{outside}");
    assert!(result(&report, "unknown").1);
    assert!(result(&report, "bad_args").1);

    // A fork bomb is contained as in `run`, and the session goes on.
    assert!(result(&report, "fork_bomb").0.contains("survived"), "{report}");
    assert_eq!(
        result(&report, "after_bomb"),
        ("$ echo still-here\nstill-here\nexit 0", false)
    );

    // A background server outlives its call, and the fork bomb's sweep: it answers a later
    // call, its log is readable, and it is stopped when the client goes.
    let (started, failed) = result(&report, "background");
    assert!(
        !failed && started.contains("background process p1 started"),
        "{started}"
    );
    let (fetched, failed) = result(&report, "background_fetch");
    assert!(!failed && fetched.contains("200"), "{fetched}");
    let (log, failed) = result(&report, "background_output");
    assert!(!failed && log.contains("GET /hello.py"), "{log}");
    assert!(
        stderr.contains("background process p1 `python3 -m http.server 8767 --bind 127.0.0.1` stopped at the end of the session"),
        "{stderr}"
    );

    // Two calls in flight: both answered, one after the other (the second never ran while the
    // first slept, or the first's sweep would have killed it).
    let both = report["concurrent"].as_array().unwrap();
    assert!(
        both[0]["text"].as_str().unwrap().contains("first-done"),
        "{report}"
    );
    assert!(
        both[1]["text"].as_str().unwrap().contains("second-done"),
        "{report}"
    );
    assert!(!both[0]["is_error"].as_bool().unwrap() && !both[1]["is_error"].as_bool().unwrap());

    // The client disconnected: the sandbox is gone.
    let session = session_of(&stderr);
    let gone = eventually(Duration::from_secs(30), || {
        let session = session.clone();
        async move { containers_of_session(&session).await == 0 }
    })
    .await;
    assert!(gone, "the MCP session's sandbox is left:\n{stderr}");
    assert!(!stderr.contains("\"jsonrpc\""), "protocol on stderr:\n{stderr}");
}

#[tokio::test]
async fn no_shell_leaves_bash_out() {
    let _ = docker().await;
    let project = Project::new(&[("hello.py", "def greet():\n    return \"hello\"\n")]);
    let (report, _) = run_client(&project, &["--no-shell", "--test-cmd", "true"]);
    let tools = report["tools"].as_object().unwrap();
    assert!(!tools.contains_key("bash"), "{report}");
    assert!(tools.contains_key("read_file"));
}

/// SIGTERM (and the client closing stdin) end the server and remove its sandbox.
#[tokio::test]
async fn the_sandbox_goes_with_the_server() {
    let docker = docker().await;
    let project = Project::new(&[]);
    for how in ["SIGTERM", "EOF"] {
        let mut child = agentbox()
            .args(["mcp"])
            .arg(project.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // The sandbox opens behind the client's `initialize`.
        {
            use std::io::Write;
            let init = serde_json::json!({
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "raw-test", "version": "0"}}
            });
            let stdin = child.stdin.as_mut().unwrap();
            writeln!(stdin, "{init}").unwrap();
            stdin.flush().unwrap();
        }
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("MCP server on stdio") {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "agentbox mcp ended early"
            );
        }
        assert_eq!(
            containers_of_pid(&docker, pid).await,
            1,
            "{how}: no sandbox while serving"
        );
        match how {
            "SIGTERM" => unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            },
            _ => drop(child.stdin.take()),
        }
        let status = child.wait().unwrap();
        assert!(
            status.code().is_some(),
            "{how}: agentbox died without cleaning up: {status:?}"
        );
        let gone = eventually(Duration::from_secs(30), || {
            let docker = docker.clone();
            async move { containers_of_pid(&docker, pid).await == 0 }
        })
        .await;
        assert!(gone, "{how}: the sandbox is left");
    }
}

/// `--isolate`: the host directory is not written; the patch at the end has the edit.
#[tokio::test]
async fn isolate_keeps_the_project_and_writes_the_patch() {
    let _ = docker().await;
    let project = Project::new(&[("hello.py", "def greet():\n    return \"hello\"\n")]);
    let out = tempfile::tempdir().unwrap();
    let patch = out.path().join("mcp.patch");
    let (report, stderr) = run_client(
        &project,
        &[
            "--isolate",
            "--patch",
            patch.to_str().unwrap(),
            "--test-cmd",
            "true",
        ],
    );
    assert!(!result(&report, "edit_file").1, "{report}");
    assert!(
        result(&report, "diff").0.contains("+    return \"howdy\""),
        "{report}"
    );
    assert_eq!(project.read("hello.py"), "def greet():\n    return \"hello\"\n");
    let written = std::fs::read_to_string(&patch).unwrap();
    assert!(written.contains("+    return \"howdy\""), "{written}");
    assert!(stderr.contains(patch.to_str().unwrap()), "{stderr}");
}

/// `--env NAME`: the client works in the environment's copy; the session is a turn of its log,
/// and its changes are the environment's to show and merge.
#[tokio::test]
async fn env_serves_the_environment_and_logs_the_session() {
    let _ = docker().await;
    let project = Project::new(&[("hello.py", "def greet():\n    return \"hello\"\n")]);
    let env = format!("it-mcp-{}", uuid::Uuid::new_v4().simple());
    let (report, stderr) = run_client(&project, &["--env", &env, "--test-cmd", "true"]);
    assert!(!result(&report, "edit_file").1, "{report}");
    assert_eq!(project.read("hello.py"), "def greet():\n    return \"hello\"\n");
    assert!(
        stderr.contains(&format!("changed in environment {env}")),
        "{stderr}"
    );
    let env_cmd = |args: &[&str]| {
        let mut cmd = agentbox();
        cmd.env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
            .arg("env")
            .args(args);
        crate::support::run(&mut cmd)
    };
    let show = env_cmd(&["show", &env]);
    let (shown, why) = (text(&show.stdout), text(&show.stderr));
    assert!(
        shown.contains("mcp session") && shown.contains("hello.py"),
        "{shown}{why}\nserver: {stderr}"
    );
    let diff = text(&env_cmd(&["diff", &env]).stdout);
    assert!(diff.contains("+    return \"howdy\""), "{diff}");
    let rm = env_cmd(&["rm", &env]);
    assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
}

/// `agentbox mcp` driven line by line over stdio (JSON-RPC), for what a well-behaved SDK client
/// never does: many calls at once, huge arguments, cancellations, closing stdin mid-call. Every
/// wait has a limit; on drop the server gets SIGTERM (it removes its sandbox), then SIGKILL.
struct Raw {
    child: std::process::Child,
    /// Lines to write; dropped to close the server's stdin (the writer thread owns the pipe so
    /// that a server that stops reading never blocks the test).
    lines: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    replies: std::sync::mpsc::Receiver<Value>,
    /// Replies read while waiting for another one, in the order they came.
    seen: Vec<Value>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Raw {
    fn start(project: &Project, extra: &[&str]) -> Raw {
        let mut child = agentbox()
            .arg("mcp")
            .args(extra)
            .arg(project.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let (lines, to_write) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            use std::io::Write;
            for line in to_write {
                if stdin.write_all(&line).is_err() {
                    break;
                }
            }
        });
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let keep = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while err.read_line(&mut line).is_ok_and(|n| n > 0) {
                keep.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let mut raw = Raw {
            child,
            lines: Some(lines),
            replies,
            seen: Vec::new(),
            stderr,
        };
        raw.send(&serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "raw-test", "version": "0"}}
        }));
        let init = raw.reply(0, Duration::from_secs(180));
        assert!(init.get("result").is_some(), "initialize: {init}");
        raw.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        raw
    }

    fn send(&self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.lines.as_ref().expect("stdin closed").send(line).unwrap();
    }

    fn call(&self, id: u64, name: &str, arguments: Value) {
        self.send(&serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}
        }));
    }

    fn cancel(&self, id: u64) {
        self.send(&serde_json::json!({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the test gave up"}
        }));
    }

    /// The reply to request `id`, within `limit`; others read meanwhile are kept in `seen`.
    fn reply(&mut self, id: u64, limit: Duration) -> Value {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(v) = self.seen.iter().find(|v| v["id"] == id) {
                return v.clone();
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(v) => self.seen.push(v),
                Err(e) => panic!(
                    "no reply to {id} within {limit:?} ({e}); replies so far: {:?}\nstderr:\n{}",
                    self.seen.iter().map(|v| v["id"].clone()).collect::<Vec<_>>(),
                    self.stderr()
                ),
            }
        }
    }

    /// The ids of the next `n` replies, each within `limit`, which must all be refusals (the
    /// calls admitted wait behind a slow one, so nothing else can be answered meanwhile).
    fn refusals(&mut self, n: usize, limit: Duration) -> Vec<u64> {
        let mut ids = Vec::new();
        while ids.len() < n {
            let r = self.replies.recv_timeout(limit).unwrap_or_else(|e| {
                panic!(
                    "{} refusal(s) of {n} within {limit:?} ({e}): {ids:?}\nstderr:\n{}",
                    ids.len(),
                    self.stderr()
                )
            });
            // A log message (`notifications/message`, the session's progress) is no reply.
            if r.get("id").is_none() {
                self.seen.push(r);
                continue;
            }
            assert!(is_refused(&r), "not a refusal: {r}");
            ids.push(r["id"].as_u64().unwrap());
            self.seen.push(r);
        }
        ids
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Close stdin (the client went away) and wait for the server to end, within `limit`.
    fn close_and_wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.lines = None;
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // What it printed last (the patch's path) is read before the pipe's end.
                std::thread::sleep(Duration::from_millis(200));
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "agentbox mcp still running {limit:?} after stdin closed:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The most memory the server process has held so far (VmHWM), in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.lines = None;
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        for _ in 0..300 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait for a call to have made `marker` in the project: it holds the turn (calls sent at once
/// race for it).
fn started(project: &Project, marker: &str) {
    let marker = project.file(marker);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow call did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn is_refused(reply: &Value) -> bool {
    reply["result"]["isError"] == true
        && reply["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("queue is full"))
}

/// Calls in flight are bounded, in number and in the bytes of their arguments: behind one slow
/// call (it waits for a file the test creates on the host), the calls beyond the bound get an
/// error result at once, while it still runs; the others run after it.
#[tokio::test]
async fn calls_beyond_the_bound_are_refused_at_once() {
    let _ = docker().await;
    let project = Project::new(&[]);
    let mut mcp = Raw::start(&project, &[]);
    let gated = |gate: &str| serde_json::json!({"command": format!("touch {gate}.running; until [ -e {gate} ]; do sleep 0.1; done; echo slow-done")});
    // The slow call holds the turn before the others are sent (they could take it first).
    let running = |gate: &str| started(&project, &format!("{gate}.running"));

    // By number: the slow call and four more are in flight; two more are refused.
    mcp.call(1, "bash", gated("gate1"));
    running("gate1");
    for id in 2..=7 {
        mcp.call(
            id,
            "bash",
            serde_json::json!({"command": format!("echo small-{id}")}),
        );
    }
    let refused = mcp.refusals(2, Duration::from_secs(60));
    std::fs::write(project.file("gate1"), "").unwrap();
    let slow = mcp.reply(1, Duration::from_secs(60));
    assert!(slow.to_string().contains("slow-done"), "{slow}");
    for id in (2..=7).filter(|id| !refused.contains(id)) {
        let r = mcp.reply(id, Duration::from_secs(60));
        assert!(r.to_string().contains(&format!("small-{id}")), "{r}");
    }

    // By bytes: 15 MB of arguments each (a padding field the tool refuses, once it runs); two
    // fit in the bound, the other eight are refused.
    let pad = "x".repeat(15_000_000);
    mcp.call(10, "bash", gated("gate2"));
    running("gate2");
    for id in 11..=20 {
        mcp.call(id, "bash", serde_json::json!({"command": "true", "pad": pad}));
    }
    let refused = mcp.refusals(8, Duration::from_secs(120));
    std::fs::write(project.file("gate2"), "").unwrap();
    let slow = mcp.reply(10, Duration::from_secs(60));
    assert!(slow.to_string().contains("slow-done"), "{slow}");
    for id in (11..=20).filter(|id| !refused.contains(id)) {
        let r = mcp.reply(id, Duration::from_secs(60));
        assert!(!is_refused(&r), "{r}");
    }
    let peak = mcp.peak_rss_kib();
    eprintln!("agentbox mcp peak RSS (VmHWM) after 10 calls of 15 MB behind a slow one: {peak} KiB");
    let status = mcp.close_and_wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", mcp.stderr());
}

/// A cancelled call that waits never runs; a cancelled call that runs is stopped, and the next
/// call is answered at once.
#[tokio::test]
async fn a_cancelled_call_never_runs_and_a_running_one_stops() {
    let _ = docker().await;
    let project = Project::new(&[]);
    let mut mcp = Raw::start(&project, &[]);
    mcp.call(
        1,
        "bash",
        serde_json::json!({"command": "touch started; sleep 40; echo slow > slow.txt"}),
    );
    started(&project, "started");
    mcp.call(2, "bash", serde_json::json!({"command": "echo ran > queued.txt"}));
    std::thread::sleep(Duration::from_secs(1));
    mcp.cancel(2);
    std::thread::sleep(Duration::from_millis(500));
    mcp.cancel(1);
    mcp.call(3, "bash", serde_json::json!({"command": "ls; echo listed"}));
    let after = mcp.reply(3, Duration::from_secs(25));
    assert!(after.to_string().contains("listed"), "{after}");
    assert!(!after.to_string().contains(".txt"), "{after}");
    // The calls after write as the cancelled ones would have.
    mcp.call(4, "bash", serde_json::json!({"command": "echo ok > control.txt"}));
    let control = mcp.reply(4, Duration::from_secs(25));
    assert!(control.to_string().contains("exit 0"), "{control}");
    let status = mcp.close_and_wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    assert_eq!(project.read("control.txt"), "ok\n");
    assert!(!project.file("queued.txt").exists(), "the cancelled call ran");
    assert!(
        !project.file("slow.txt").exists(),
        "the cancelled running call went on"
    );
}

/// `--isolate`: the client goes away with a call running and one waiting; neither runs on
/// while the changes are read back, so the patch has what was answered and nothing else.
#[tokio::test]
async fn isolate_reads_back_only_what_ran_before_the_client_went() {
    let _ = docker().await;
    // Files that exist: the copy's root is not the sandbox user's to create files in when the
    // project belongs to another uid (the tests' projects do, as root).
    let project = Project::new(&[
        ("before.txt", "old\n"),
        ("slow.txt", "old\n"),
        ("queued.txt", "old\n"),
    ]);
    let out = tempfile::tempdir().unwrap();
    let patch = out.path().join("mcp.patch");
    let mut mcp = Raw::start(&project, &["--isolate", "--patch", patch.to_str().unwrap()]);
    mcp.call(
        1,
        "bash",
        serde_json::json!({"command": "echo before > before.txt"}),
    );
    let first = mcp.reply(1, Duration::from_secs(60));
    assert!(first.to_string().contains("exit 0"), "{first}");
    mcp.call(
        2,
        "bash",
        serde_json::json!({"command": "sleep 5; echo slow > slow.txt"}),
    );
    // The copy is not the host's to watch: time for the slow call to take the turn.
    std::thread::sleep(Duration::from_secs(1));
    mcp.call(
        3,
        "bash",
        serde_json::json!({"command": "echo queued > queued.txt"}),
    );
    std::thread::sleep(Duration::from_secs(1));
    let status = mcp.close_and_wait(Duration::from_secs(90));
    let stderr = mcp.stderr();
    assert!(status.success(), "{status:?}\n{stderr}");
    let written = std::fs::read_to_string(&patch).unwrap_or_else(|e| panic!("no patch ({e}):\n{stderr}"));
    assert!(written.contains("before.txt"), "{written}\n{stderr}");
    assert!(
        !written.contains("queued.txt"),
        "a call queued when the client went ran:\n{written}"
    );
    assert!(
        !written.contains("slow.txt"),
        "the running call went on after the client went:\n{written}"
    );
    assert!(stderr.contains("1 file(s) changed"), "{stderr}");
}

/// mcp opens the environment `run` gives the agent (setup, its cache), behind the client's
/// `initialize`: the answer comes while setup still runs (here it waits for a file the test
/// creates only after that answer), setup's progress arrives as log messages, and a call sent
/// meanwhile waits for setup and then sees the dependency it installed.
// Multi-threaded: the test's own index serves while the test blocks on the server's replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_is_answered_before_setup_ends_and_calls_wait_for_it() {
    use crate::support::upstream::{Upstream, simple_index, wheel};
    let _ = docker().await;
    let (file, data) = wheel("agentbox_fixture_pkg", "1.0", "from the local index");
    let index = Upstream::http(simple_index("agentbox-fixture-pkg", &file, data)).await;
    let port = index.addr.port();
    let project = Project::new(&[("requirements.txt", "agentbox-fixture-pkg==1.0\n")]);
    let setup = format!(
        "until [ -e /workspace/.gate ]; do sleep 0.1; done; \
         pip install --index-url http://127.0.0.1:{port}/simple/ -r requirements.txt"
    );
    let allow = format!("127.0.0.1:{port}");
    // `Raw::start` waits for the answer to `initialize`: setup is blocked until the gate exists.
    let mut mcp = Raw::start(&project, &["--setup", &setup, "--allow-host", &allow]);
    assert!(
        !project.file(".gate").exists() && index.count() == 0,
        "answered before setup went on"
    );
    mcp.call(
        1,
        "bash",
        serde_json::json!({"command": "python3 -c 'import agentbox_fixture_pkg as p; print(p.VALUE)'"}),
    );
    std::fs::write(project.file(".gate"), "").unwrap();
    let reply = mcp.reply(1, Duration::from_secs(300));
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("from the local index"), "{reply}\n{}", mcp.stderr());
    let logs: Vec<String> = mcp
        .seen
        .iter()
        .filter(|v| v["method"] == "notifications/message")
        .filter_map(|v| v["params"]["data"].as_str().map(String::from))
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.starts_with("agentbox: setup: running `until"))
            && logs.iter().any(|l| l.contains("ready")),
        "setup's progress as log messages: {logs:?}"
    );
    assert!(
        mcp.close_and_wait(Duration::from_secs(120)).success(),
        "{}",
        mcp.stderr()
    );
    let docker = docker().await;
    for (name, of) in agentbox::sandbox::caches::list(&docker).await.unwrap() {
        if of == project.path().display().to_string() {
            agentbox::sandbox::caches::remove(&docker, &name).await;
        }
    }
}

/// A setup that fails: the client still gets its answers, and every call says why there is no
/// sandbox; the server ends with exit 4 when the client goes.
#[tokio::test]
async fn a_failed_setup_is_every_calls_error() {
    let _ = docker().await;
    let project = Project::new(&[]);
    let mut mcp = Raw::start(&project, &["--setup", "echo setup-broke >&2; exit 3"]);
    mcp.call(1, "list_files", serde_json::json!({}));
    let reply = mcp.reply(1, Duration::from_secs(180));
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("not run: the sandbox could not be opened") && text.contains("setup failed"),
        "{reply}"
    );
    assert_eq!(
        mcp.close_and_wait(Duration::from_secs(60)).code(),
        Some(4),
        "{}",
        mcp.stderr()
    );
}
