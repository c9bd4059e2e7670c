//! `agentbox mcp` driven by a real third-party MCP client: the official MCP Python SDK from
//! PyPI, in a venv `scripts/mcp-client-venv` makes (idempotently) on first use. Real Docker.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is the failure report

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{Project, agentbox, containers_of_pid, docker, eventually, text};

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
        .env("AGENTBOX_DATA_DIR", support::test_data_dir())
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
