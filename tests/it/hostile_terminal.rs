//! Hostile text against the user's terminal: one fixture full of ESC/OSC/CSI sequences (window
//! title, clear screen, clipboard write through OSC 52, 8-bit CSI) fed through every path that
//! prints what the sandbox, the repository, the model, an image or the network wrote: toolchain
//! warnings (requires-python, rust-version, engines.node, the go directive, an image's toolchain
//! label), setup output and a failed setup's final error, the proxy's refusal of a CONNECT host,
//! the report, chat, exec's output on a terminal, shell's exit summary, mcp's stderr and eval's
//! console lines. No ESC (nor BEL, nor a C1 control) may reach stdout or stderr; the fixture's
//! marker must, escaped, so each path is known to have printed it.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::process::Stdio;
use std::time::Duration;

use crate::support::pty::Pty;
use crate::support::scripted::{bash, done};
use crate::support::{Project, containers_of_pid, docker, eventually, text};
use serde_json::json;

const MARKER: &str = "AGENTBOX-PWNED";
/// Window title, clear screen, clipboard write (OSC 52), an 8-bit CSI and a carriage return.
const HOSTILE: &str = "\x1b]0;AGENTBOX-PWNED\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u{9b}31m\rX";

/// The bytes a terminal would act on: ESC, BEL, and C1 controls (U+0080..U+009F in UTF-8).
fn controls_in(bytes: &[u8]) -> Vec<(usize, u8)> {
    let mut found = Vec::new();
    for (i, w) in bytes.windows(2).enumerate() {
        if w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]) {
            found.push((i, w[1]));
        }
    }
    found.extend(
        bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| matches!(**b, 0x1b | 0x07))
            .map(|(i, b)| (i, *b)),
    );
    found
}

/// What each path did wrong: every path is checked before a test fails, so one run says all.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    /// `what` printed the fixture (its marker is there) and no control sequence of it.
    fn check(&mut self, what: &str, bytes: &[u8], must_show: &[&str]) {
        let shown = text(bytes);
        let found = controls_in(bytes);
        if !found.is_empty() {
            self.0.push(format!(
                "{what}: {} control bytes reached the terminal (first at {:?}):\n{shown:?}",
                found.len(),
                found.iter().min()
            ));
        }
        for needle in must_show {
            if !shown.contains(needle) {
                self.0
                    .push(format!("{what}: {needle:?} was never printed:\n{shown}"));
            }
        }
    }

    fn assert_none(self) {
        assert!(self.0.is_empty(), "{}", self.0.join("\n\n"));
    }
}

/// One project whose every manifest asks for a toolchain through a hostile string.
fn hostile_project(extra: &[(&str, &str)]) -> Project {
    let toml_h = HOSTILE
        .replace('\x1b', "\\u001b")
        .replace('\x07', "\\u0007")
        .replace('\r', "\\r");
    let pyproject =
        format!("[project]\nname = \"x\"\nversion = \"0.1\"\nrequires-python = \">=3.99{toml_h}\"\n");
    let cargo = format!(
        "[package]\nname = \"x\"\nversion = \"0.1.0\"\nedition = \"2021\"\nrust-version = \"1.99{toml_h}\"\n"
    );
    let package =
        json!({"name": "x", "version": "1.0.0", "engines": {"node": format!(">=99{HOSTILE}")}}).to_string();
    let gomod = format!("module example.com/x\n\ngo 1.99{HOSTILE}\n");
    let mut files: Vec<(&str, &str)> = vec![
        ("pyproject.toml", &pyproject),
        ("Cargo.toml", &cargo),
        ("package.json", &package),
        ("go.mod", &gomod),
    ];
    files.extend_from_slice(extra);
    Project::new(&files)
}

/// An image whose toolchain label carries the fixture: the polyglot image with its python label
/// replaced. Removed when dropped.
struct HostileImage(String);

impl HostileImage {
    fn build() -> HostileImage {
        let tag = format!("agentbox-test/hostile-label:{}", std::process::id());
        let mut child = std::process::Command::new("docker")
            .args(["build", "-q", "-t", &tag, "--label"])
            .arg(format!("org.agentbox.toolchain.python=3.13.5{HOSTILE}"))
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"FROM agentbox/polyglot:2\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "docker build: {}", text(&out.stderr));
        HostileImage(tag)
    }
}

impl Drop for HostileImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["image", "rm", "-f", &self.0])
            .output();
    }
}

struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// The real binary with `args`, `stdin` as its input; then no container of it may be left.
async fn agentbox(args: &[&str], stdin: &[u8]) -> Ran {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(args)
        .current_dir(data.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", data.path().join("data"))
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("AGENTBOX_RUNTIME")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(r) = crate::support::test_runtime() {
        cmd.env("AGENTBOX_RUNTIME", r);
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    {
        use tokio::io::AsyncWriteExt as _;
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(stdin).await;
    }
    let out = tokio::time::timeout(Duration::from_secs(400), child.wait_with_output())
        .await
        .expect("agentbox did not finish")
        .unwrap();
    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || {
        let docker = docker.clone();
        async move { containers_of_pid(&docker, pid).await == 0 }
    })
    .await;
    assert!(gone, "a container of agentbox {args:?} is left");
    Ran {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

fn script(dir: &std::path::Path, turns: serde_json::Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    path.display().to_string()
}

/// What setup runs: prints the fixture on both streams, asks the proxy for a CONNECT to a host
/// named by it (refused), and ends with the status it is given.
const SETUP_PY: &str = r#"
import socket, sys
H = "\x1b]0;AGENTBOX-PWNED\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u009b31m\rX"
print("setup says " + H, flush=True)
print("setup warns " + H, file=sys.stderr, flush=True)
s = socket.create_connection(("127.0.0.1", 3128), 10)
s.sendall(("CONNECT " + H + ".example:443 HTTP/1.1\r\nHost: x\r\n\r\n").encode())
s.recv(4096)
sys.exit(int(sys.argv[1]))
"#;

/// The warnings of exec and mcp (manifests and an image label), and exec's output on a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_exec_and_mcp_escape_the_repository_and_the_image() {
    let mut seen = Findings::default();
    let image = HostileImage::build();
    let project = hostile_project(&[]);
    let path = project.path().to_str().unwrap();
    let warned = [
        MARKER,
        "requires-python",
        "rust-version",
        "engines.node",
        "go directive",
        "\\x1b]0;",
    ];

    // --no-setup: the fixture's manifests are there to be warned about, not installed (pip
    // would refuse its requires-python).
    let exec = agentbox(
        &["exec", "--no-setup", "--image", &image.0, path, "--", "true"],
        b"",
    )
    .await;
    assert_eq!(exec.code, Some(0), "{}", text(&exec.stderr));
    seen.check("exec's warnings", &exec.stderr, &warned);
    // The python label's own fixture (the image's, not the manifest's) is in the warning too.
    seen.check(
        "exec's warning of the image label",
        &exec.stderr,
        &["3.13.5\\x1b]0;"],
    );

    let mcp = agentbox(&["mcp", "--image", &image.0, path], b"").await;
    seen.check("mcp's stderr", &mcp.stderr, &warned);

    // exec's command output, on a terminal, is escaped as it comes (bytes to a pipe stay bytes).
    let printed = format!(
        "printf '%s' \"$(printf 'out \\033]0;{MARKER}\\007 \\302\\233 done')\"; printf '\\033]52;c;eA==\\007' >&2"
    );
    let mut pty = Pty::spawn(&["exec", "--no-setup", path, "--", "sh", "-c", &printed]);
    pty.wait_exit();
    let screen = pty.screen();
    seen.check(
        "exec's output on a terminal",
        screen.as_bytes(),
        &[MARKER, "\\x1b]52;"],
    );
    seen.assert_none();
}

/// A run: setup's output and the proxy's refusal while it runs, the model's tool output and its
/// final answer in the progress lines and the report; then a setup that fails, whose final error
/// block repeats the output and the refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_escapes_setup_the_proxy_the_model_and_the_report() {
    let mut seen = Findings::default();
    let project = hostile_project(&[("hostile_setup.py", SETUP_PY)]);
    let path = project.path().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let turns = json!([
        {"tool_calls": [bash("true")]},
        done(&format!("Finished. {HOSTILE}")),
    ]);
    let s = script(dir.path(), turns);
    let run = agentbox(
        &[
            "run",
            "--script",
            &s,
            "--image",
            "agentbox/polyglot:2",
            "--setup",
            "python3 hostile_setup.py 0",
            path,
            "look",
        ],
        b"",
    )
    .await;
    let both = [run.stdout.clone(), run.stderr.clone()].concat();
    seen.check(
        "run (progress and report)",
        &both,
        &[
            MARKER,
            "setup says",
            "setup warns",
            "egress: blocked \\x1b]0;",
            "Finished. \\x1b]0;",
        ],
    );
    seen.check("run's report on stdout", &run.stdout, &["Finished. \\x1b]0;"]);

    let failed = agentbox(
        &[
            "run",
            "--script",
            &s,
            "--image",
            "agentbox/polyglot:2",
            "--setup",
            "python3 hostile_setup.py 3",
            path,
            "look",
        ],
        b"",
    )
    .await;
    assert_eq!(failed.code, Some(4), "{}", text(&failed.stderr));
    let stderr = text(&failed.stderr);
    let block = stderr
        .rfind("agentbox: error:")
        .map(|i| &failed.stderr[i..])
        .unwrap_or_else(|| panic!("no final error: {stderr}"));
    seen.check(
        "a failed setup's final error",
        block,
        &["setup says", "blocked", MARKER],
    );
    seen.check("a failed setup's whole stderr", &failed.stderr, &[MARKER]);
    seen.assert_none();
}

/// chat: the model's answer printed as `agent> ...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_escapes_the_models_answer() {
    let mut seen = Findings::default();
    let project = Project::new(&[("a.txt", "a\n")]);
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), json!([done(&format!("Answer: {HOSTILE}"))]));
    let chat = agentbox(
        &["chat", "--script", &s, project.path().to_str().unwrap()],
        b"hello\n",
    )
    .await;
    let both = [chat.stdout.clone(), chat.stderr.clone()].concat();
    seen.check("chat", &both, &["Answer: \\x1b]0;", MARKER]);
    seen.assert_none();
}

/// shell: the summary on leaving names the paths the session changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shells_exit_summary_escapes_the_changed_paths() {
    let mut seen = Findings::default();
    let project = Project::new(&[("a.txt", "a\n")]);
    let path = project.path().to_str().unwrap();
    let touch = format!("touch \"$(printf 'new-\\033]0;{MARKER}\\007-\\302\\233')\"");
    let mut pty = Pty::spawn(&["shell", path, "--", "sh", "-c", &touch]);
    assert_eq!(pty.wait_exit(), 0, "{}", pty.screen());
    let screen = pty.screen();
    seen.check(
        "shell's exit summary",
        screen.as_bytes(),
        &["new-\\x1b]0;", MARKER],
    );
    seen.assert_none();
}

/// eval: a task whose name (its directory) and final answer carry the fixture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evals_console_lines_escape_task_names() {
    let mut seen = Findings::default();
    let tasks = tempfile::tempdir().unwrap();
    let task = tasks.path().join(format!("task-{HOSTILE}"));
    std::fs::create_dir(&task).unwrap();
    std::fs::write(task.join("TASK.md"), "Make the test pass.\n").unwrap();
    std::fs::write(task.join("test_x.py"), "def test_x():\n    assert False\n").unwrap();
    std::fs::write(
        task.join("script.json"),
        json!({"turns": [done(&format!("gave up {HOSTILE}"))]}).to_string(),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let eval = agentbox(
        &[
            "eval",
            "--provider",
            "scripted",
            "--out",
            out.path().to_str().unwrap(),
            tasks.path().to_str().unwrap(),
        ],
        b"",
    )
    .await;
    let both = [eval.stdout.clone(), eval.stderr.clone()].concat();
    seen.check("eval", &both, &["task-\\x1b]0;", MARKER]);
    seen.assert_none();
}
