//! Background processes (`bash` with `"background": true`): tracked by the executor, alive
//! between calls, stopped before the final test run and at the end, bounded like any command;
//! and everything not tracked still swept after every call.

use std::time::Duration;

use crate::support::scripted::{bash, call, done, hostile};
use crate::support::*;
use agentbox::sandbox::{ExecRequest, ProcessState, Sandbox};
use serde_json::json;

/// A shell command that prints the body at `url` (the images have no curl).
fn fetch(url: &str) -> String {
    format!(
        "python3 -c \"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('{url}', timeout=5).read().decode())\""
    )
}

fn shell(cmd: &str) -> ExecRequest {
    ExecRequest::shell(cmd, Duration::from_secs(60))
}

async fn out_of(sb: &dyn Sandbox, cmd: &str) -> String {
    let out = sb.exec(shell(cmd)).await.expect("exec");
    format!("{}{}", out.stdout.to_text(), out.stderr.to_text())
}

async fn start(sb: &dyn Sandbox, cmd: &str) -> ProcessState {
    sb.start_process(shell(cmd), cmd.into(), Duration::from_millis(500))
        .await
        .expect("sandbox")
        .expect("started")
}

async fn state(sb: &dyn Sandbox, id: &str) -> ProcessState {
    sb.processes(Some(id), true)
        .await
        .unwrap()
        .unwrap()
        .pop()
        .unwrap()
}

/// Live processes whose command line starts with a match of the extended regular expression
/// `pattern` (the probe's and the helpers' command lines carry the pattern further in).
async fn running(sb: &dyn Sandbox, pattern: &str) -> usize {
    let probe = format!(
        "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep -Eq -- '^{pattern}' && echo $d; done | wc -l"
    );
    out_of(sb, &probe).await.trim().parse().unwrap()
}

#[tokio::test]
async fn a_background_server_answers_in_later_calls_and_untracked_daemons_are_still_swept() {
    let project = Project::new(&[("index.html", "hello from the sandbox\n")]);
    let sb = sandbox(&project).await;
    // Through bash, the way the tool starts it; the server daemonises nothing, but its bash
    // parent ends at once: the job is the helper's tree, not one pid.
    let server = start(&sb, "python3 -m http.server 8765 --bind 127.0.0.1 &").await;
    assert_eq!(server.id, "p1");
    assert!(server.running, "{server:?}");
    let mut answered = String::new();
    for _ in 0..50 {
        answered = out_of(&sb, &fetch("http://127.0.0.1:8765/index.html")).await;
        if answered.contains("hello") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answered, "hello from the sandbox\n");
    // Its log line for that request is there to read, and only once.
    let first = state(&sb, "p1").await;
    assert!(
        first
            .output
            .since(first.shown)
            .to_text()
            .contains("GET /index.html"),
        "{first:?}"
    );
    let again = state(&sb, "p1").await;
    assert!(again.output.since(again.shown).is_empty(), "{again:?}");

    // An untracked daemon, started while the job runs (the sweep that spares the job's tree)
    // and again with none running (the plain sweep), does not outlive its call.
    out_of(
        &sb,
        "setsid sleep 1001 > /dev/null 2>&1 < /dev/null & disown; nohup sleep 1002 >/dev/null 2>&1 &",
    )
    .await;
    assert_eq!(
        running(&sb, "sleep 100[12]").await,
        0,
        "an untracked daemon outlived its call"
    );
    // A daemon the job itself starts is the job's: it survives calls, and goes with the job.
    let daemonised = start(
        &sb,
        "setsid sleep 1003 > /dev/null 2>&1 < /dev/null & disown; echo started",
    )
    .await;
    assert!(daemonised.output.to_text().contains("started"), "{daemonised:?}");
    assert_eq!(running(&sb, "sleep 1003").await, 1, "a job's daemon was swept");
    assert!(state(&sb, &daemonised.id).await.running);

    let stopped = sb
        .stop_processes(None, "before the final test run")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped.len(), 2);
    assert!(stopped.iter().all(|p| !p.running), "{stopped:?}");
    assert!(
        stopped
            .iter()
            .all(|p| p.stopped.as_deref() == Some("before the final test run")),
        "{stopped:?}"
    );
    assert_eq!(running(&sb, "python3 -m http.server").await, 0);
    assert_eq!(running(&sb, "sleep 1003").await, 0);
    assert!(
        out_of(&sb, &fetch("http://127.0.0.1:8765/"))
            .await
            .contains("Connection refused"),
        "the server outlived its stop"
    );
    let untracked = start(&sb, "true").await;
    assert!(!untracked.running);
    assert_eq!(untracked.status_line(), format!("ended after 0s: exit 0"));
    let log = sb.process_log();
    assert_eq!(
        log.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["p1", "p2", "p3"]
    );
    assert_eq!(log[0].command, "python3 -m http.server 8765 --bind 127.0.0.1 &");
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn runaway_background_processes_are_bounded_and_the_session_goes_on() {
    let project = Project::new(&[]);
    let mut cfg = config();
    cfg.limits.memory_bytes = 512 << 20;
    cfg.limits.tmp_bytes = 64 << 20;
    let sb = sandbox_with(&project, &cfg).await;
    // A fork bomb in the background: stopped once its tree passes half of --pids-limit (256
    // here), so the next command still gets processes.
    let bomb = start(&sb, "bomb() { bomb | bomb & }; bomb").await;
    let mut seen = bomb.clone();
    for _ in 0..100 {
        seen = state(&sb, &bomb.id).await;
        if !seen.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!seen.running, "{seen:?}");
    let why = seen.stopped.clone().unwrap_or_default();
    assert!(
        why.contains("processes") && why.contains("--pids-limit"),
        "{seen:?}"
    );
    assert_eq!(out_of(&sb, "echo still here").await, "still here\n");
    assert_eq!(running(&sb, "bash -c bomb").await, 0);

    // A memory hog in the background: the OOM killer takes it (commands run at the highest
    // score), not the executor.
    let hog = start(
        &sb,
        "python3 -c 'a = bytearray(2 << 30); import time; time.sleep(60)'",
    )
    .await;
    let mut seen = hog.clone();
    for _ in 0..100 {
        seen = state(&sb, &hog.id).await;
        if !seen.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!seen.running, "{seen:?}");
    assert!(
        seen.status_line().contains("memory") || seen.output.to_text().contains("MemoryError"),
        "{}: {}",
        seen.status_line(),
        seen.output.to_text()
    );
    assert_eq!(out_of(&sb, "echo still here").await, "still here\n");

    // A flood of output is kept to its bounds.
    let flood = start(&sb, "yes agentbox | head -c 50000000; echo; echo the end").await;
    let mut seen = flood.clone();
    for _ in 0..200 {
        seen = state(&sb, &flood.id).await;
        if !seen.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!seen.running, "{seen:?}");
    assert_eq!(seen.output.total, 50_000_000 + 9);
    assert!(seen.output.head.len() + seen.output.tail.len() <= 80 * 1024);
    assert!(seen.output.to_text().ends_with("the end\n"));
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancelling_a_call_spares_the_background_processes() {
    let project = Project::new(&[]);
    let sb = std::sync::Arc::new(sandbox(&project).await);
    let job = start(sb.as_ref(), "sleep 1004").await;
    // A call given up while it runs (the chat's Ctrl-C drops it), then cancelled.
    let given_up = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.exec(shell("sleep 1005 & touch started; sleep 1006")).await })
    };
    // Seen from the host: the executor is busy with the call.
    let marker = project.file("started");
    assert!(eventually(Duration::from_secs(10), || async { marker.exists() }).await);
    given_up.abort();
    let _ = given_up.await;
    sb.cancel_call().await.unwrap();
    assert_eq!(
        running(sb.as_ref(), "sleep 100[56]").await,
        0,
        "the cancelled call's processes live on"
    );
    assert!(
        state(sb.as_ref(), &job.id).await.running,
        "the background process was killed"
    );
    assert_eq!(running(sb.as_ref(), "sleep 1004").await, 1);
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn background_processes_are_refused_with_one_exec_per_call() {
    let project = Project::new(&[]);
    let mut cfg = config();
    cfg.per_call_exec = true;
    let sb = sandbox_with(&project, &cfg).await;
    let refused = sb
        .start_process(shell("sleep 5"), "sleep 5".into(), Duration::ZERO)
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.0.contains("command runner"), "{refused}");
    sb.shutdown().await.unwrap();
}

/// The agent's view: a server started in one call answers a request in the next; agentbox's own
/// test run finds it stopped (the test command passes only when nothing listens on its port);
/// the report lists it; nothing is left after the run.
#[tokio::test]
async fn the_agent_runs_a_server_in_the_background_and_the_verdict_runs_without_it() {
    let project = Project::new(&[("index.html", "served\n")]);
    let nothing_listens =
        "python3 -c \"import socket, sys; sys.exit(socket.socket().connect_ex(('127.0.0.1', 8766)) == 0)\"";
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [{"name": "bash", "arguments": {"command": "python3 -m http.server 8766 --bind 127.0.0.1", "background": true}}]},
            {"tool_calls": [bash(&format!("for i in $(seq 50); do {} && break; sleep 0.1; done", fetch("http://127.0.0.1:8766/index.html")))]},
            {"tool_calls": [call("process_output", json!({"id": "p1"}))]},
            {"tool_calls": [call("process_output", json!({}))]},
            {"tool_calls": [bash(nothing_listens)]},
            done("the server works"),
        ]),
        &["--test-cmd", nothing_listens],
    )
    .await;
    let (tool, started, is_error) = run.result(0);
    assert_eq!(tool, "bash");
    assert!(
        !is_error && started.contains("background process p1 started"),
        "{started}"
    );
    let (_, fetched, _) = run.result(1);
    assert!(fetched.contains("served"), "{fetched}");
    let (_, log, _) = run.result(2);
    assert!(
        log.contains("p1 `python3 -m http.server") && log.contains("GET /index.html"),
        "{log}"
    );
    let (_, list, _) = run.result(3);
    assert!(
        list.contains("p1 `python3 -m http.server 8766 --bind 127.0.0.1`: running"),
        "{list}"
    );
    let (_, probe, _) = run.result(4);
    assert!(
        probe.contains("exit 1"),
        "the server did not answer the model: {probe}"
    );
    let report = run.report.as_ref().unwrap();
    assert_eq!(report["tests"]["passed"], true, "{}", run.stderr);
    let processes = report["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{processes:?}");
    assert_eq!(processes[0]["stopped"], "before the final test run");
    assert!(run.stderr.contains("background process p1"), "{}", run.stderr);
}
