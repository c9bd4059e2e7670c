//! The harness aids for small models, each driven through `agentbox run` with a scripted model:
//! protected tests, the repeat guard, verify-on-finish, a primed first message, fresh attempts.

use std::process::Stdio;

use crate::support::*;
use serde_json::{Value, json};

const COUNTER: &str = "def count_words(text):\n    \"\"\"Number of whitespace-separated words.\"\"\"\n    return len(text.split(\" \"))\n";
const TESTS: &str = "from counter import count_words\n\n\ndef test_simple():\n    assert count_words(\"a b c\") == 3\n\n\ndef test_extra_spaces():\n    assert count_words(\"  a   b \") == 2\n";

fn project() -> Project {
    Project::new(&[("counter.py", COUNTER), ("test_counter.py", TESTS)])
}

fn fix() -> Value {
    json!({"name": "edit_file", "arguments": {"path": "counter.py", "old": "text.split(\" \")", "new": "text.split()"}})
}

struct Out {
    code: Option<i32>,
    report: Value,
    stderr: String,
    events: Vec<Value>,
}

impl Out {
    fn results(&self) -> Vec<(String, bool)> {
        self.events
            .iter()
            .filter(|e| e["event"] == "tool_finished")
            .map(|e| {
                (
                    e["content"].as_str().unwrap().to_string(),
                    e["is_error"].as_bool().unwrap(),
                )
            })
            .collect()
    }
}

async fn run(project: &Project, turns: Value, flags: &[&str]) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.json");
    std::fs::write(&script, json!({ "turns": turns }).to_string()).unwrap();
    let trajectory = dir.path().join("t.jsonl");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["run", "--json", "--script"])
        .arg(&script)
        .arg("--trajectory")
        .arg(&trajectory)
        .args(flags)
        .arg(project.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let events = std::fs::read_to_string(&trajectory)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Out {
        code: out.status.code(),
        report: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: text(&out.stderr),
        events,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_tests_cannot_be_edited() {
    let p = project();
    let out = run(
        &p,
        json!([
            {"tool_calls": [{"name": "edit_file", "arguments": {"path": "./test_counter.py", "old": "== 2", "new": "== 4"}}]},
            {"text": "gave up"}
        ]),
        &["--protect-tests"],
    )
    .await;
    let (content, is_error) = &out.results()[0];
    assert!(*is_error && content.contains("is a test file"), "{content}");
    assert_eq!(p.read("test_counter.py"), TESTS);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_call_with_nothing_changed_is_not_run_again() {
    let p = project();
    let read = json!({"name": "read_file", "arguments": {"path": "counter.py"}});
    let out = run(
        &p,
        json!([
            {"tool_calls": [read.clone()]},
            {"tool_calls": [read.clone()]},
            {"tool_calls": [fix()]},
            {"tool_calls": [read.clone()]},
            {"text": "done"}
        ]),
        &["--no-repeat"],
    )
    .await;
    let r = out.results();
    assert!(!r[0].1);
    assert!(
        r[1].1 && r[1].0.starts_with("not run: you made this exact call at step 1"),
        "{:?}",
        r[1]
    );
    assert!(
        !r[3].1 && r[3].0.contains("text.split()"),
        "after an edit the read runs again: {:?}",
        r[3]
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_is_asked_again_hotter_before_it_costs_a_step() {
    let p = project();
    let read = json!({"name": "read_file", "arguments": {"path": "counter.py"}});
    let list = json!({"name": "list_files", "arguments": {}});
    // The scripted model answers each request with its next turn: the two repeats of the read
    // are consumed by the two resamples, and the list comes from the second of them.
    let out = run(
        &p,
        json!([
            {"tool_calls": [read.clone()]},
            {"tool_calls": [read.clone()]},
            {"tool_calls": [read.clone()]},
            {"tool_calls": [list]},
            {"tool_calls": [read.clone()]},
            {"tool_calls": [read.clone()]},
            {"tool_calls": [read.clone()]},
            {"text": "done"}
        ]),
        &["--no-repeat", "--resample-repeats", "2", "--temperature", "0"],
    )
    .await;
    let r = out.results();
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(!r[0].1 && !r[1].1, "{r:?}");
    assert!(r[1].0.contains("counter.py"), "the list ran: {:?}", r[1]);
    // Step 3: the read repeats three times (one reply, two resamples): now it is answered.
    assert!(r[2].1 && r[2].0.starts_with("not run:"), "{:?}", r[2]);
    // Tenths: the temperature is an f32, recorded as a JSON number.
    let temps: Vec<i64> = out
        .events
        .iter()
        .filter(|e| e["event"] == "model_request")
        .map(|e| (e["request"]["temperature"].as_f64().unwrap() * 10.0).round() as i64)
        .collect();
    assert_eq!(
        temps,
        [0, 0, 7, 7, 0, 7, 7, 0],
        "resamples are hotter, the next step is not"
    );
    assert_eq!(out.report["steps"], 4, "resamples are not steps: {}", out.report);
    assert_eq!(out.code, Some(1), "the bug is still there: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishing_with_failing_tests_is_sent_back() {
    let p = project();
    let out = run(
        &p,
        json!([
            {"text": "I think it is fine."},
            {"tool_calls": [fix()]},
            {"text": "Now it is fixed."}
        ]),
        &["--verify-finish", "2"],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.report["steps"], 3);
    assert_eq!(out.report["summary"], "Now it is fixed.");
    let second = out
        .events
        .iter()
        .find(|e| e["event"] == "model_request" && e["step"] == 2)
        .unwrap();
    let pushed = second["request"]["messages"].as_array().unwrap().last().unwrap()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        pushed.starts_with("agentbox ran the tests and they still fail"),
        "{pushed}"
    );
    assert!(
        pushed.contains("assert 4 == 2") || pushed.contains("failed"),
        "{pushed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primed_first_message_has_the_files_the_failure_and_the_code() {
    let p = project();
    let out = run(&p, json!([{"text": "looked"}]), &["--prime"]).await;
    let first = out.events.iter().find(|e| e["event"] == "model_request").unwrap();
    let msg = first["request"]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(msg.starts_with("The test suite is failing."), "{msg}");
    assert!(msg.contains("Its files:\ncounter.py\ntest_counter.py"), "{msg}");
    assert!(
        msg.contains("fails now (exit 1)") && msg.contains("1 failed, 1 passed"),
        "{msg}"
    );
    assert!(
        msg.contains("The file counter.py") && msg.contains("     3\t    return len(text.split(\" \"))"),
        "{msg}"
    );
    assert!(
        !msg.contains("The file test_counter.py"),
        "test files are in the failure, not repeated whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_undone_and_the_next_starts_fresh() {
    let p = project();
    let out = run(
        &p,
        json!([
            {"tool_calls": [
                {"name": "edit_file", "arguments": {"path": "counter.py", "old": "return len", "new": "return 1 + len"}},
                {"name": "edit_file", "arguments": {"path": "junk.txt", "old": "", "new": "scratch"}}
            ]},
            {"text": "attempt one gives up"},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "counter.py"}}, {"name": "list_files", "arguments": {}}]},
            {"tool_calls": [fix()]},
            {"text": "attempt two fixed it"}
        ]),
        &["--attempts", "3"],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.report["attempts"], 2);
    assert_eq!(out.report["steps"], 5);
    let r = out.results();
    assert!(
        r[2].0.contains("return len(text.split(\" \"))"),
        "attempt 2 sees the original code: {}",
        r[2].0
    );
    assert_eq!(
        r[3].0, "counter.py\ntest_counter.py",
        "junk.txt was removed by the reset"
    );
    assert!(!p.file("junk.txt").exists());
    assert_eq!(
        p.read("counter.py"),
        COUNTER.replace("text.split(\" \")", "text.split()")
    );
    let second = out
        .events
        .iter()
        .filter(|e| e["event"] == "model_request")
        .nth(2)
        .unwrap();
    assert_eq!(
        second["request"]["temperature"]
            .as_f64()
            .map(|t| (t * 10.0).round()),
        Some(7.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_errors_point_at_what_to_do() {
    let p = project();
    let same = "text.split(\" \")";
    let out = run(
        &p,
        json!([
            {"tool_calls": [
                {"name": "edit_file", "arguments": {"path": "src/main.py", "old": "x", "new": "x"}},
                {"name": "edit_file", "arguments": {"path": "counter.py", "old": "return len(text.split(' '))", "new": "return len(text.split(' '))"}},
                {"name": "edit_file", "arguments": {"path": "counter.py", "old": same, "new": same}}
            ]},
            {"text": "done"}
        ]),
        &[],
    )
    .await;
    let r = out.results();
    assert!(
        r[0].0
            .contains("src/main.py: no such file or directory (list_files shows what exists)"),
        "{}",
        r[0].0
    );
    assert!(
        r[1].0.contains("found 0 times") && r[1].0.contains("closest text in the file is at line 3"),
        "{}",
        r[1].0
    );
    assert!(r[2].0.starts_with("`old` and `new` are the same"), "{}", r[2].0);
}
