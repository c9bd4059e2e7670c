//! The agent end to end: `agentbox run` against a scripted model server on 127.0.0.1 in both
//! wire formats, with every tool call executed in the real Docker sandbox.

use std::os::unix::fs::MetadataExt;
use std::process::{Output, Stdio};

use crate::support::model_server::{ModelServer, Reply, anthropic_turn, openai_turn};
use crate::support::*;
use serde_json::{Value, json};

const KEY: &str = "sk-test-sentinel-4f1c9a7e2b";
const LIBRARY: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo/library.py"));
const TESTS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/demo/test_library.py"
));

fn demo_project() -> Project {
    Project::new(&[("library.py", LIBRARY), ("test_library.py", TESTS)])
}

fn fix_one() -> Value {
    json!({"path": "library.py", "old": "    return max((returned - due).days + 1, 0)", "new": "    return max((returned - due).days, 0)"})
}

fn fix_two() -> Value {
    json!({"path": "library.py", "old": "        fee = fee / 2", "new": "        fee = fee // 2"})
}

/// Run the agentbox binary without blocking the runtime the model server lives on.
async fn agentbox_async(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(args)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("AGENTBOX_PROVIDER")
        .env_remove("AGENTBOX_MODEL")
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn agentbox");
    let pid = child.id().unwrap();
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).await.unwrap();
        drop(pipe);
    }
    let out = child.wait_with_output().await.unwrap();
    // Whatever happened, nothing of this run is left behind.
    let docker = docker().await;
    let gone = eventually(std::time::Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "a container of agentbox pid {pid} outlived the run");
    out
}

fn tool_results(body: &Value) -> Vec<Value> {
    let msgs = body["messages"].as_array().unwrap();
    msgs.last().unwrap()["content"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_loop_fixes_the_project_and_answers_every_call() {
    let project = demo_project();
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn(
            "Looking around.",
            &[
                ("list_files", json!({})),
                ("read_file", json!({"path": "library.py"})),
                ("read_file", json!({"path": "../../etc/passwd"})),
                ("launch_rockets", json!({})),
                (
                    "edit_file",
                    json!({"path": "library.py", "old": "fee =", "new": "x ="}),
                ),
                (
                    "edit_file",
                    json!({"path": "library.py", "old": "not in the file", "new": "x"}),
                ),
            ],
        )),
        Reply::ok(anthropic_turn(
            "Fixing.",
            &[
                ("edit_file", fix_one()),
                ("edit_file", fix_two()),
                ("run_tests", json!({})),
            ],
        )),
        Reply::ok(anthropic_turn(
            "Fixed the off-by-one and the float division.",
            &[],
        )),
    ])
    .await;
    let out = agentbox_async(
        &[
            "run",
            "--json",
            "--base-url",
            &server.anthropic_url(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", KEY)],
        None,
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("--json report");
    assert_eq!(report["outcome"], "finished");
    assert_eq!(report["tests"]["passed"], true);
    assert_eq!(report["steps"], 3);
    assert_eq!(report["usage"]["output_tokens"], 60);
    assert!(
        report["diff"]
            .as_str()
            .unwrap()
            .contains("+        fee = fee // 2")
    );
    assert_eq!(report["changed_files"][0]["path"], "library.py");

    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert!(!r.raw.contains(KEY), "the key must only travel in the header");
    }
    let first = &reqs[0].body;
    assert_eq!(first["system"][0]["cache_control"]["type"], "ephemeral");
    assert_eq!(
        first["tools"].as_array().unwrap().last().unwrap()["cache_control"]["type"],
        "ephemeral"
    );
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "list_files",
            "read_file",
            "edit_file",
            "search",
            "run_tests",
            "bash",
            "process_output",
            "stop_process"
        ]
    );

    // Every tool_use of turn 1 answered, in order, with its id, in one message.
    let results = tool_results(&reqs[1].body);
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "toolu_0_list_files",
            "toolu_1_read_file",
            "toolu_2_read_file",
            "toolu_3_launch_rockets",
            "toolu_4_edit_file",
            "toolu_5_edit_file"
        ]
    );
    let errors: Vec<bool> = results.iter().map(|r| r["is_error"].as_bool().unwrap()).collect();
    assert_eq!(errors, [false, false, true, true, true, true]);
    let content = |i: usize| results[i]["content"].as_str().unwrap().to_string();
    assert!(
        content(0).contains("library.py\ntest_library.py"),
        "{}",
        content(0)
    );
    assert!(content(1).contains("     9\tdef days_late"), "{}", content(1));
    assert!(content(2).contains("outside the project"), "{}", content(2));
    assert!(
        content(3).contains("unknown tool \"launch_rockets\""),
        "{}",
        content(3)
    );
    assert!(
        content(4).contains("`old` was found 2 times in library.py (at lines 16, 18)"),
        "{}",
        content(4)
    );
    assert!(
        content(5).contains("`old` was found 0 times in library.py"),
        "{}",
        content(5)
    );

    let results = tool_results(&reqs[2].body);
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("edited library.py")
    );
    assert!(
        results[2]["content"].as_str().unwrap().contains("5 passed"),
        "{}",
        results[2]
    );

    assert_eq!(
        project.read("test_library.py"),
        TESTS,
        "the test file is unchanged"
    );
    assert!(project.read("library.py").contains("fee // 2"));
    let meta = std::fs::metadata(project.file("library.py")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        project.owner(),
        "edited file owned by the project's owner"
    );
    assert!(
        !project.file(".pytest_cache").exists() && !project.file("__pycache__").exists(),
        "no litter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_loop_reports_bad_calls_and_a_run_that_does_not_fix_exits_1() {
    let project = demo_project();
    let server = ModelServer::start(vec![
        Reply::ok(openai_turn(
            "",
            &[
                ("read_file", json!("{\"path\": ")),
                ("edit_file", json!({"path": "library.py", "old": "x"})),
                ("read_file", json!({"path": 5})),
                (
                    "bash",
                    json!({"command": "yes 0123456789 | head -c 300000; echo; echo tail-marker"}),
                ),
                ("search", json!({"pattern": "def late_fee"})),
            ],
        )),
        Reply::ok(openai_turn("I could not fix it.", &[])),
    ])
    .await;
    let out = agentbox_async(
        &[
            "run",
            "--json",
            "--model",
            "local-test",
            project.path().to_str().unwrap(),
        ],
        &[("OPENAI_BASE_URL", &server.openai_url()), ("OPENAI_API_KEY", KEY)],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tests"]["passed"], false);
    assert_eq!(report["summary"], "I could not fix it.");

    let reqs = server.requests();
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(reqs.iter().all(|r| !r.raw.contains(KEY)));
    assert_eq!(reqs[0].body["model"], "local-test");
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tool_msgs: Vec<&Value> = msgs.iter().filter(|m| m["role"] == "tool").collect();
    let ids: Vec<&str> = tool_msgs
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "call_0_read_file",
            "call_1_edit_file",
            "call_2_read_file",
            "call_3_bash",
            "call_4_search"
        ]
    );
    let content = |i: usize| tool_msgs[i]["content"].as_str().unwrap().to_string();
    assert!(
        content(0).starts_with("ERROR: the arguments for read_file are not valid JSON"),
        "{}",
        content(0)
    );
    assert!(
        content(1).starts_with("ERROR: invalid arguments for edit_file: missing field `new`"),
        "{}",
        content(1)
    );
    assert!(
        content(2).starts_with("ERROR: invalid arguments for read_file: invalid type: integer `5`"),
        "{}",
        content(2)
    );
    let bash = content(3);
    assert!(!bash.starts_with("ERROR"));
    assert!(
        bash.contains("cut:") && bash.contains("tail-marker\nexit 0"),
        "{bash}"
    );
    assert!(bash.len() < 16_000, "bounded: {} bytes", bash.len());
    assert_eq!(
        content(4),
        "library.py:14:def late_fee(due: date, returned: date, member: bool = False) -> int:"
    );
    // The assistant message with the malformed call is echoed back verbatim.
    let assistant = msgs.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(assistant["tool_calls"][0]["function"]["arguments"], "{\"path\": ");
    assert_eq!(project.read("library.py"), LIBRARY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_limit_stops_the_run_with_exit_3() {
    let project = demo_project();
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn("", &[("list_files", json!({}))])),
        Reply::ok(anthropic_turn("", &[("list_files", json!({}))])),
        Reply::ok(anthropic_turn("never reached", &[])),
    ])
    .await;
    let out = agentbox_async(
        &[
            "run",
            "--max-steps",
            "2",
            "--base-url",
            &server.anthropic_url(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", KEY)],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("stopped at the step limit after 2 steps"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_protocol_parses_tool_lines_and_reports_results_as_text() {
    let project = demo_project();
    let server = ModelServer::start(vec![
        Reply::ok(openai_turn(
            "I will read the code.\ntool: read_file({\"path\": \"library.py\", \"limit\": 3})\ntool: read_file({\"path\": })\ntool: run_tests({})",
            &[],
        )),
        Reply::ok(openai_turn("Done looking.", &[])),
    ])
    .await;
    let out = agentbox_async(
        &["run", "--tool-protocol", "text", project.path().to_str().unwrap()],
        &[("OPENAI_BASE_URL", &server.openai_url())],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let reqs = server.requests();
    assert!(
        reqs[0].body.get("tools").is_none(),
        "no native tools in text mode"
    );
    assert!(reqs[0].header("authorization").is_none(), "no key, no header");
    let system = reqs[0].body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("tool: read_file({\"path\": \"src/app.py\"})") && system.contains("## edit_file")
    );
    let last = reqs[1].body["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["role"], "user");
    let results = last["content"].as_str().unwrap();
    assert!(
        results.starts_with("[result 1 (ok)]\n     1\t\"\"\"Late fees"),
        "{results}"
    );
    assert!(
        results.contains("[result 2 (ERROR)]\nthe arguments for read_file are not valid JSON"),
        "{results}"
    );
    assert!(
        results.contains("[result 3 (ok)]\n$ python3 -m pytest"),
        "{results}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tool_choice_ends_with_finish_and_reads_agents_md() {
    let project = demo_project();
    std::fs::write(project.file("AGENTS.md"), "Always say please.\n").unwrap();
    project.chown_all();
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn(
            "",
            &[("edit_file", fix_one()), ("edit_file", fix_two())],
        )),
        Reply::ok(anthropic_turn(
            "",
            &[("finish", json!({"summary": "fixed both bugs, please"}))],
        )),
    ])
    .await;
    let out = agentbox_async(
        &[
            "run",
            "--json",
            "--tool-choice",
            "required",
            "--no-shell",
            "--base-url",
            &server.anthropic_url(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", KEY)],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["summary"], "fixed both bugs, please");
    let first = &server.requests()[0].body;
    assert_eq!(first["tool_choice"]["type"], "any");
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "list_files",
            "read_file",
            "edit_file",
            "search",
            "run_tests",
            "finish"
        ]
    );
    let system = first["system"][0]["text"].as_str().unwrap();
    assert!(
        system.contains("Instructions from the project") && system.contains("Always say please."),
        "{system}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_clear_and_nothing_is_left_behind() {
    let project = demo_project();
    let server = ModelServer::start(vec![Reply::status(
        401,
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
    )])
    .await;
    let out = agentbox_async(
        &[
            "run",
            "--base-url",
            &server.anthropic_url(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", KEY)],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(4));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("error:    anthropic rejected the API key (401): invalid x-api-key"),
        "{stdout}"
    );
    assert_eq!(server.requests().len(), 1, "401 is not retried");
    assert_eq!(project.read("library.py"), LIBRARY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trajectory_has_every_event_and_no_secret_even_in_trace_logs() {
    let project = demo_project();
    let dir = tempfile::tempdir().unwrap();
    let trajectory = dir.path().join("run.jsonl");
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn(
            "",
            &[("bash", json!({"command": "env; echo done"}))],
        )),
        Reply::ok(anthropic_turn("ok", &[])),
    ])
    .await;
    let out = agentbox_async(
        &[
            "run",
            "--trajectory",
            trajectory.to_str().unwrap(),
            "--base-url",
            &server.anthropic_url(),
            project.path().to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", KEY), ("RUST_LOG", "trace")],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let log = std::fs::read_to_string(&trajectory).unwrap();
    let events: Vec<String> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for e in [
        "started",
        "model_request",
        "model_response",
        "tool_started",
        "tool_finished",
        "verifying",
        "finished",
    ] {
        assert!(events.iter().any(|x| x == e), "no {e} in {events:?}");
    }
    assert!(
        log.contains("HOME=/home/agentbox"),
        "the bash result is in the trajectory"
    );
    assert!(!log.contains(KEY), "secret in the trajectory");
    assert!(!text(&out.stderr).contains(KEY), "secret in the logs");
    assert!(!text(&out.stdout).contains(KEY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_keeps_one_sandbox_for_the_conversation() {
    let project = demo_project();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("chat.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo first > /tmp/marker; hostname"}}]},
            {"text": "Wrote the marker."},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "cat /tmp/marker"}}, {"name": "edit_file", "arguments": fix_two()}]},
            {"text": "The marker is still there."}
        ]})
        .to_string(),
    )
    .unwrap();
    let dir_s = script.to_str().unwrap();
    let out = agentbox_async(
        &[
            "chat",
            "--script",
            dir_s,
            "--trajectory",
            dir.path().join("t.jsonl").to_str().unwrap(),
            project.path().to_str().unwrap(),
        ],
        &[],
        Some("write a marker\n/diff\ncheck the marker\n/exit\n"),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("agent> Wrote the marker."), "{stdout}");
    assert!(stdout.contains("(no changes)"), "{stdout}");
    assert!(stdout.contains("agent> The marker is still there."), "{stdout}");
    // Each reply once: on stdout, not again in the progress on stderr.
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("Wrote the marker."), "{stderr}");
    assert!(!stderr.contains("The marker is still there."), "{stderr}");
    // And, as after `shell`, what changed in the project.
    assert!(
        stderr.contains("agentbox: sandbox removed; 1 path changed in ") && stderr.contains(": library.py\n"),
        "{stderr}"
    );
    let log = std::fs::read_to_string(dir.path().join("t.jsonl")).unwrap();
    assert!(
        log.contains("\"content\":\"$ cat /tmp/marker\\nfirst\\nexit 0\""),
        "same container across turns"
    );
    assert!(project.read("library.py").contains("fee // 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_sends_a_refusal_to_the_model() {
    let project = demo_project();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "edit_file", "arguments": fix_one()}]},
            {"tool_calls": [{"name": "edit_file", "arguments": fix_two()}, {"name": "bash", "arguments": {"command": "rm -rf /workspace/*"}}]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let trajectory = dir.path().join("t.jsonl");
    let out = agentbox_async(
        &[
            "run",
            "--approve",
            "--script",
            script.to_str().unwrap(),
            "--trajectory",
            trajectory.to_str().unwrap(),
            project.path().to_str().unwrap(),
        ],
        &[],
        Some("n\ny\nn\n"),
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("-    return max((returned - due).days + 1, 0)"),
        "the diff is shown: {stderr}"
    );
    assert!(stderr.contains("$ rm -rf /workspace/*"), "{stderr}");
    let lib = project.read("library.py");
    assert!(
        lib.contains("days + 1") && lib.contains("fee // 2"),
        "only the approved edit: {lib}"
    );
    assert!(project.file("test_library.py").exists());
    let log = std::fs::read_to_string(&trajectory).unwrap();
    assert!(log.contains("the user declined this edit to library.py"));
    assert!(log.contains("the user declined to run this command"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_provider_the_user_is_told_how_to_configure_one() {
    let project = demo_project();
    let out = agentbox_async(&["run", project.path().to_str().unwrap()], &[], None).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no model is configured: set ANTHROPIC_API_KEY"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_replays_offline_and_says_so() {
    let out = agentbox_async(&["demo"], &[], None).await;
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("SCRIPTED REPLAY"), "{stderr}");
    assert!(stdout.contains("tests:    PASS"), "{stdout}");
    assert!(stdout.contains("+        fee = fee // 2"), "{stdout}");
}
