//! `agentbox eval` over a handful of tasks with a scripted model: the counts, the rule that a
//! task whose tests were changed is not fixed, resuming, running tasks at once, and Ctrl-C.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use serde_json::Value;

fn tasks_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval")
}

async fn eval(out: &Path, extra: &[&str]) -> (Option<i32>, String, String, u32) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(["eval", "--provider", "scripted", "--out"])
        .arg(out)
        .args(extra)
        .arg(tasks_dir())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let o = child.wait_with_output().await.unwrap();
    (o.status.code(), text(&o.stdout), text(&o.stderr), pid)
}

fn results(out: &Path) -> BTreeMap<String, Value> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["task"].as_str().unwrap().to_string(), v))
        .collect()
}

/// The most tasks that were running at one instant, from their start and finish times.
fn max_overlap(rs: &BTreeMap<String, Value>) -> usize {
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for r in rs.values() {
        edges.push((r["started_at"].as_f64().unwrap(), 1));
        edges.push((r["finished_at"].as_f64().unwrap(), -1));
    }
    edges.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        max = max.max(now);
    }
    max as usize
}

async fn nothing_left(pid: u32) {
    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "containers left by eval pid {pid}");
    assert_eq!(
        volumes_of_pid(&docker, pid).await,
        0,
        "volumes left by eval pid {pid}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_counts_fixed_tasks_and_does_not_count_changed_tests() {
    let out = tempfile::tempdir().unwrap();
    let (code, stdout, stderr, pid) = eval(out.path(), &["--jobs", "4"]).await;
    assert_eq!(code, Some(1), "not every task is fixed\n{stderr}");
    assert!(
        stdout.starts_with("1 of 4 fixed (1 with changed tests, 1 errors)"),
        "{stdout}\n{stderr}"
    );
    nothing_left(pid).await;

    let rs = results(out.path());
    assert_eq!(rs.len(), 4);
    assert_eq!(rs["fixes-it"]["fixed"], true);
    assert_eq!(rs["fixes-it"]["changed_files"], serde_json::json!(["counter.py"]));
    assert_eq!(rs["gives-up"]["fixed"], false);
    assert_eq!(rs["gives-up"]["tests_passed"], false);
    // The cheat made the tests pass by rewriting them: not fixed.
    assert_eq!(rs["cheats"]["tests_passed"], true);
    assert_eq!(rs["cheats"]["tests_changed"], true);
    assert_eq!(rs["cheats"]["fixed"], false);
    assert_eq!(rs["broken-image"]["exit_reason"], "error");
    assert!(
        rs["broken-image"]["error"]
            .as_str()
            .unwrap()
            .contains("agentbox/no-such-image:0 is missing")
    );
    assert!(max_overlap(&rs) >= 2, "tasks ran one after another: {rs:?}");

    // The originals are untouched: the task files and the tests the cheat rewrote.
    let original = std::fs::read_to_string(tasks_dir().join("cheats/test_counter.py")).unwrap();
    assert!(original.contains("def test_extra_spaces"));
    assert!(!tasks_dir().join("fixes-it/.pytest_cache").exists());

    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(summary.contains("**1 of 4 fixed (25%)**"), "{summary}");
    assert!(summary.contains("| cheats | no | pass | yes |"), "{summary}");
    // Stamped: when (UTC), by which agentbox, and the model: here each task's own script.
    let stamp = summary.lines().nth(2).unwrap_or_default();
    let (written, rest) = stamp.split_at(stamp.find(" by ").unwrap_or(0));
    assert!(
        written.starts_with("written 20")
            && written.ends_with(" UTC")
            && written.len() == "written 2026-12-05 02:40 UTC".len(),
        "{summary}"
    );
    let said = format!(
        " by agentbox {} · model: scripted replay of each task's own script.json",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(rest, said, "{summary}");
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains(&format!("{written}{said}")), "{html}");
    assert!(
        html.starts_with("<!doctype html>") && html.contains("<svg") && html.contains("id=\"task-cheats\"")
    );
    assert!(
        !html.contains("<script") && !html.contains("http://") && !html.contains("https://"),
        "self-contained"
    );
    assert!(
        html.contains("<span class=\"add\">+    return len(text.split())</span>"),
        "the fix's diff is in the report"
    );
    assert!(out.path().join("trajectories/fixes-it.jsonl").exists());
    // Why each task ended and its final test run: in the results, the summary and the page.
    assert_eq!(rs["gives-up"]["exit_reason"], "finished");
    assert!(
        rs["gives-up"]["test_command"]
            .as_str()
            .unwrap()
            .contains("pytest")
    );
    assert_eq!(rs["gives-up"]["test_exit_code"], 1);
    let gave_up_output = rs["gives-up"]["test_output"].as_str().unwrap();
    assert!(
        gave_up_output.contains("FAILED test_counter.py::"),
        "{gave_up_output}"
    );
    assert!(
        summary.contains("### gives-up: not fixed\n\n- ended: the model finished"),
        "{summary}"
    );
    assert!(
        summary.contains("- final test run: failed (exit 1), `python3 -m pytest"),
        "{summary}"
    );
    assert!(
        summary.contains("<details><summary>final test output</summary>"),
        "{summary}"
    );
    assert!(
        summary.contains("### broken-image: not fixed\n\n- ended: an error stopped it"),
        "{summary}"
    );
    assert!(html.contains("<summary>final test run: failed (exit 1) · <code>python3 -m pytest"));
    assert!(html.contains("an error stopped it"));
    assert!(
        std::fs::read_to_string(out.path().join("diffs/fixes-it.diff"))
            .unwrap()
            .contains("text.split()")
    );
    // The instruction and the script are not in the project the model saw.
    let traj = std::fs::read_to_string(out.path().join("trajectories/fixes-it.jsonl")).unwrap();
    let listing = traj
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "tool_finished" && e["name"] == "list_files")
        .unwrap();
    assert_eq!(listing["content"], "counter.py\ntest_counter.py");

    // Resume: nothing runs again; --task with --force reruns just that one.
    let (_, _, stderr, _) = eval(out.path(), &["--jobs", "4"]).await;
    assert!(
        stderr.contains("4 task(s)") && stderr.contains("4 already done"),
        "{stderr}"
    );
    let again = results(out.path());
    assert_eq!(again["fixes-it"]["started_at"], rs["fixes-it"]["started_at"]);
    let (_, stdout, _, _) = eval(out.path(), &["--force", "--task", "fixes-it"]).await;
    assert!(stdout.starts_with("1 of 1 fixed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_keeps_the_results_so_far_and_leaves_nothing_behind() {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(["eval", "--provider", "scripted", "--jobs", "1", "--out"])
        .arg(out.path())
        .arg(tasks_dir())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let path = out.path().join("results.jsonl");
    let one_done = eventually(Duration::from_secs(120), || {
        let path = path.clone();
        async move { std::fs::read_to_string(&path).is_ok_and(|t| t.lines().count() >= 1) }
    })
    .await;
    assert!(one_done);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let o = child.wait_with_output().await.unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    nothing_left(pid).await;
    // A create request in flight at the interrupt must not produce a container later either.
    tokio::time::sleep(Duration::from_secs(3)).await;
    nothing_left(pid).await;
    let kept = results(out.path());
    assert!(!kept.is_empty() && kept.len() < 4, "{kept:?}");
}

/// Running (not yet removed) sandboxes of the eval `pid`, seeding containers left out.
async fn live_sandboxes(docker: &bollard::Docker, pid: u32) -> usize {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let filters = std::collections::HashMap::from([
        ("label".to_string(), vec![format!("agentbox.pid={pid}")]),
        ("status".to_string(), vec!["running".to_string()]),
    ]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .unwrap()
        .iter()
        .filter(|c| !c.names.iter().flatten().any(|n| n.ends_with("-seed")))
        .count()
}

/// With one job, the second task's sandbox is made while the first task runs (its first tool
/// call sleeps), and an interrupt then removes both. (With `--prepare-ahead 0` this fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_sandbox_is_made_while_a_task_runs() {
    let tasks = tempfile::tempdir().unwrap();
    let script = r#"{"turns": [
  {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 120"}}]},
  {"text": "done"}
]}"#;
    for name in ["first", "second"] {
        let dir = tasks.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in ["TASK.md", "counter.py", "test_counter.py"] {
            std::fs::copy(tasks_dir().join("fixes-it").join(f), dir.join(f)).unwrap();
        }
        std::fs::write(dir.join("script.json"), script).unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(["eval", "--provider", "scripted", "--jobs", "1", "--out"])
        .arg(out.path())
        .arg(tasks.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let docker = docker().await;
    let both = eventually(Duration::from_secs(90), || async {
        live_sandboxes(&docker, pid).await >= 2
    })
    .await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let o = child.wait_with_output().await.unwrap();
    assert!(
        both,
        "no second sandbox while the first task ran\n{}",
        text(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    nothing_left(pid).await;
}
