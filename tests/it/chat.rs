//! `agentbox chat` on a terminal (a pty the test opens): Ctrl-C cancels a long tool call and the
//! conversation goes on, `/undo`, a pasted block is one request, unknown commands stay local.
//! The model is the scripted provider; the trajectory shows what it was sent.

use std::time::Duration;

use crate::support::pty::Pty;
use crate::support::{Project, containers_of_pid, docker, eventually};
use serde_json::{Value, json};

#[tokio::test]
async fn chat_on_a_terminal_cancels_undoes_and_takes_a_paste_whole() {
    let _ = docker().await;
    let project = Project::new(&[("a.txt", "one\n")]);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("chat.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "edit_file", "arguments": {"path": "a.txt", "old": "one", "new": "two"}}]},
            {"text": "Edited."},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7)) > started; sleep 300"}}]},
            {"text": "Second answer."}
        ]})
        .to_string(),
    )
    .unwrap();
    let trajectory = dir.path().join("t.jsonl");
    let mut pty = Pty::spawn_with(
        &[
            "chat",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--trajectory",
            trajectory.to_str().unwrap(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", ""), ("OPENAI_API_KEY", "")],
    );
    let pid = pty.child.id();
    let mut at = pty.wait_for("you> ", 0);

    // An unknown command is answered here, not sent to the model (which would use a turn).
    pty.type_keys("/frobnicate\r");
    at = pty.wait_for("unknown command /frobnicate", at);
    at = pty.wait_for("you> ", at);

    pty.type_keys("change one to two\r");
    at = pty.wait_for("agent> Edited.", at);
    at = pty.wait_for("you> ", at);
    assert_eq!(project.read("a.txt"), "two\n");

    // /undo puts the project back as it was before that request.
    pty.type_keys("/undo\r");
    at = pty.wait_for("back as it was", at);
    at = pty.wait_for("you> ", at);
    assert_eq!(project.read("a.txt"), "one\n");

    // Ctrl-C during a long tool call: back at the prompt, the sandbox still there.
    pty.type_keys("run the slow thing\r");
    let started = project.file("started");
    let deadline = std::time::Instant::now() + crate::support::pty::WAIT;
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started: {}",
            pty.screen()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    pty.type_keys("\x03");
    at = pty.wait_for("cancelled; the conversation is kept", at);
    at = pty.wait_for("you> ", at);

    // A pasted block of two lines is one request.
    pty.type_keys("\x1b[200~first line\nsecond line\x1b[201~\r");
    at = pty.wait_for("agent> Second answer.", at);
    at = pty.wait_for("you> ", at);

    // Ctrl-D leaves, and the sandbox goes.
    pty.type_keys("\x04");
    let _ = at;
    assert_eq!(pty.wait_exit(), 0, "{}", pty.screen());

    let requests: Vec<Value> = std::fs::read_to_string(&trajectory)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "model_request" || v["event"] == "model_request")
        .collect();
    assert_eq!(requests.len(), 4, "one request per model turn: {requests:?}");
    let last = requests.last().unwrap().to_string();
    // The request after the cancel still has the earlier turn, the cancelled call answered,
    // and the pasted lines as one message.
    assert!(last.contains("run the slow thing"), "{last}");
    assert!(last.contains("cancelled by the user"), "{last}");
    assert!(last.contains("first line\\nsecond line"), "{last}");
    // The undone turn is gone from the conversation as from the project.
    assert!(!last.contains("change one to two"), "{last}");

    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || {
        let docker = docker.clone();
        async move { containers_of_pid(&docker, pid).await == 0 }
    })
    .await;
    assert!(gone, "the chat's sandbox is left");
}

/// `--approve`: "always for this session" stops asking for that kind of action; "why not"
/// declines and the model reads the user's reason.
#[tokio::test]
async fn approve_offers_always_and_a_reason() {
    use std::io::Write;
    let _ = docker().await;
    let project = Project::new(&[("a.txt", "one\n")]);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "edit_file", "arguments": {"path": "a.txt", "old": "one", "new": "two"}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo first-ran"}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo second-ran"}}]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let trajectory = dir.path().join("t.jsonl");
    let mut child = crate::support::agentbox()
        .args([
            "run",
            "--approve",
            "--provider",
            "scripted",
            "--test-cmd",
            "true",
            "--script",
        ])
        .arg(&script)
        .arg("--trajectory")
        .arg(&trajectory)
        .arg(project.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"w\nkeep the old word\na\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = crate::support::text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(project.read("a.txt"), "one\n", "the declined edit was made");
    assert_eq!(
        stderr.matches("the model wants to run").count(),
        1,
        "asked again after always: {stderr}"
    );
    let log = std::fs::read_to_string(&trajectory).unwrap();
    assert!(
        log.contains("the user declined this edit to a.txt; they said: keep the old word"),
        "{log}"
    );
    assert!(log.contains("first-ran") && log.contains("second-ran"), "{log}");
}

/// Ctrl-C at an `--approve` question cancels the request, and the question does not take the
/// next line typed at the chat's prompt.
#[tokio::test]
async fn ctrl_c_at_an_approval_question_returns_to_the_prompt() {
    let _ = docker().await;
    let project = Project::new(&[("a.txt", "one\n")]);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("chat.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "touch ran"}}]},
            {"text": "Fine."}
        ]})
        .to_string(),
    )
    .unwrap();
    let mut pty = Pty::spawn_with(
        &[
            "chat",
            "--approve",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", ""), ("OPENAI_API_KEY", "")],
    );
    let mut at = pty.wait_for("you> ", 0);
    pty.type_keys("run something\r");
    at = pty.wait_for("allow?", at);
    pty.type_keys("\x03");
    at = pty.wait_for("cancelled; the conversation is kept", at);
    at = pty.wait_for("you> ", at);
    pty.type_keys("never mind\r");
    at = pty.wait_for("agent> Fine.", at);
    pty.wait_for("you> ", at);
    pty.type_keys("\x04");
    assert_eq!(pty.wait_exit(), 0, "{}", pty.screen());
    assert!(!project.file("ran").exists(), "the command ran without a yes");
}
