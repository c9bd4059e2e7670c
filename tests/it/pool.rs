//! The warm pool (`eval --pool N`): each pooled sandbox handed out once and refilled after, the
//! full policy in a pooled one, and nothing left behind on the normal end, SIGINT, SIGTERM, or
//! SIGKILL followed by `agentbox gc`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use agentbox::sandbox::{Pool, Sandbox};
use serde_json::{Value, json};

/// `n` tasks, each a tiny Python project whose scripted model runs `command` and finishes.
fn tasks(n: usize, command: &str) -> Project {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"text": "done"}
    ]})
    .to_string();
    let mut files = Vec::new();
    for i in 0..n {
        files.push((
            format!("task-{i}/TASK.md"),
            "Say which machine you are on.\n".to_string(),
        ));
        files.push((
            format!("task-{i}/counter.py"),
            "def count(text):\n    return len(text.split())\n".to_string(),
        ));
        files.push((
            format!("task-{i}/test_counter.py"),
            "from counter import count\n\n\ndef test_count():\n    assert count('a b') == 2\n".to_string(),
        ));
        files.push((format!("task-{i}/script.json"), script.clone()));
    }
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
    Project::new(&refs)
}

fn eval_cmd(tasks: &Path, out: &Path, extra: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(["eval", "--provider", "scripted", "--out"])
        .arg(out)
        .args(extra)
        .arg(tasks)
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", test_data_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn events(out: &Path, task: &str) -> Vec<Value> {
    std::fs::read_to_string(out.join(format!("trajectories/{task}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect()
}

/// Containers labelled with the pool's label and `pid`'s, in any state.
async fn pooled_of_pid(docker: &bollard::Docker, pid: u32) -> usize {
    containers_labelled(
        docker,
        &[format!("agentbox.pid={pid}"), "agentbox.pool=1".to_string()],
    )
    .await
}

async fn nothing_left(pid: u32) {
    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "containers left by eval pid {pid}");
    assert_eq!(volumes_of_pid(&docker, pid).await, 0, "volumes left by pid {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_hands_out_each_sandbox_once_and_refills() {
    // Writing at the workspace's root: it is the sandbox user's, as in a sandbox of its own.
    let dir = tasks(4, "echo x > made.txt && hostname");
    let out = tempfile::tempdir().unwrap();
    let child = eval_cmd(dir.path(), out.path(), &["--pool", "2", "--jobs", "1"])
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let o = child.wait_with_output().await.unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{}\n{stderr}", text(&o.stdout));
    assert!(text(&o.stdout).starts_with("4 of 4 fixed"), "{}", text(&o.stdout));
    nothing_left(pid).await;

    // Each task's machine (its container's hostname: the id's first 12 digits), and whether
    // the sandbox came from the pool.
    let mut machines: BTreeMap<String, String> = BTreeMap::new();
    let mut pooled: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..4 {
        let task = format!("task-{i}");
        let evs = events(out.path(), &task);
        let host = evs
            .iter()
            .find(|e| e["event"] == "tool_finished" && e["name"] == "bash")
            .and_then(|e| e["content"].as_str())
            .and_then(|c| {
                c.lines()
                    .find(|l| l.len() == 12 && l.chars().all(|c| c.is_ascii_hexdigit()))
            })
            .unwrap_or_else(|| panic!("{task}: no hostname in {evs:?}"))
            .to_string();
        machines.insert(task.clone(), host);
        if let Some(note) = evs.iter().find_map(|e| {
            e["message"]
                .as_str()
                .filter(|m| m.starts_with("sandbox: from the warm pool"))
        }) {
            let id = note
                .split("container ")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .unwrap();
            pooled.insert(task, id.to_string());
        }
    }
    // What changed is what the model did, nothing of the copy-in (owners, modes, times).
    for line in std::fs::read_to_string(out.path().join("results.jsonl"))
        .unwrap()
        .lines()
    {
        let r: Value = serde_json::from_str(line).unwrap();
        assert_eq!(r["changed_files"], json!(["made.txt"]), "{r}");
    }
    let distinct: BTreeSet<&String> = machines.values().collect();
    assert_eq!(distinct.len(), 4, "a sandbox served two tasks: {machines:?}");
    // The first task asks before anything is pooled; every later one gets a pooled sandbox,
    // three from a pool of two: it refilled.
    assert!(pooled.len() >= 3, "pooled: {pooled:?}\n{stderr}");
    for (task, id) in &pooled {
        assert!(id.starts_with(&machines[task]), "{task}: {id} vs {machines:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_sandbox_has_the_full_policy_and_takes_the_project() {
    let docker = docker().await;
    let project = Project::new(&[("hello.txt", "hi\n"), ("bin/run.sh", "#!/bin/sh\necho ran\n")]);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(project.file("bin/run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    }
    let (uid, gid) = project.owner();
    let cfg = config();
    let dir = project.path().to_path_buf();
    let packed = agentbox::hostfs::isolate::pack(&dir, uid, gid, &|_| false).unwrap();
    let spec = cfg.volume_spec(project.path(), packed.tar.path()).unwrap();
    let pool = Pool::new(&docker, 1).await.unwrap();
    // The first of its kind starts the pool's filling and is not served from it.
    assert!(pool.take(&spec).await.is_none());
    let sb = pool.take(&spec).await.expect("a pooled sandbox");
    let again = pool.take(&spec).await.expect("the pool refilled");
    assert_ne!(sb.info().container_id, again.info().container_id);

    let inspected = docker
        .inspect_container(&sb.info().container_id, None)
        .await
        .unwrap();
    let labels = inspected.config.unwrap().labels.unwrap();
    assert_eq!(labels.get("agentbox.pool").map(String::as_str), Some("1"));
    assert_eq!(labels.get("agentbox.session"), Some(&sb.info().session));
    assert_eq!(labels.get("agentbox.pid"), Some(&std::process::id().to_string()));
    let hc = inspected.host_config.unwrap();
    assert_eq!(hc.network_mode.as_deref(), Some("none"));
    assert_eq!(hc.readonly_rootfs, Some(true));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    let mounts = hc.mounts.unwrap_or_default();
    let workspace = mounts
        .iter()
        .find(|m| m.target.as_deref() == Some("/workspace"))
        .unwrap();
    // No project bind mount: an empty volume of its own, the project copied in later.
    assert_eq!(workspace.typ, Some(bollard::models::MountType::VOLUME));
    crate::sandbox::policy_holds_inside(&sb, uid, gid).await;

    // Empty until the project is copied in; then the project, owned by the sandbox user.
    let listed = sb
        .exec(agentbox::sandbox::ExecRequest::shell(
            "ls -A /workspace",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(listed.stdout.to_text(), "");
    sb.copy_in(packed.tar.path()).await.unwrap();
    let seen = sb
        .exec(agentbox::sandbox::ExecRequest::shell(
            "cat /workspace/hello.txt; stat -c %u:%g /workspace/hello.txt /workspace/bin; stat -c %a /workspace/bin/run.sh; bin/run.sh; echo more > /workspace/new.txt",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert!(seen.success(), "{}", seen.stderr.to_text());
    assert_eq!(
        seen.stdout.to_text(),
        format!("hi\n{uid}:{gid}\n{uid}:{gid}\n750\nran\n")
    );

    sb.shutdown().await.unwrap();
    again.shutdown().await.unwrap();
    pool.close().await;
    let me = std::process::id();
    let gone = eventually(Duration::from_secs(30), || async {
        pooled_of_pid(&docker, me).await == 0
    })
    .await;
    assert!(gone, "pooled containers left after close");
}

/// Interrupted while a task runs and the pool holds sandboxes: nothing is left.
async fn interrupted_with(signal: i32) {
    let dir = tasks(2, "sleep 60");
    let out = tempfile::tempdir().unwrap();
    let child = eval_cmd(dir.path(), out.path(), &["--pool", "2", "--jobs", "1"])
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let docker = docker().await;
    let filled = eventually(Duration::from_secs(120), || async {
        pooled_of_pid(&docker, pid).await >= 2
    })
    .await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, signal) };
    let o = child.wait_with_output().await.unwrap();
    assert!(filled, "the pool never filled\n{}", text(&o.stderr));
    if signal == libc::SIGKILL {
        // Killed: its pooled volumes outlive it until the sweep.
        assert!(volumes_of_pid(&docker, pid).await > 0, "nothing for gc to find");
        let gc = run(agentbox().arg("gc"));
        assert!(gc.status.success(), "{}", text(&gc.stderr));
    } else {
        let code = if signal == libc::SIGINT { 130 } else { 143 };
        assert_eq!(o.status.code(), Some(code), "{}", text(&o.stderr));
    }
    nothing_left(pid).await;
    // A start in flight at the signal must not produce a container later either.
    tokio::time::sleep(Duration::from_secs(3)).await;
    nothing_left(pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_mid_run_leaves_no_pooled_sandbox() {
    interrupted_with(libc::SIGINT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_leaves_no_pooled_sandbox() {
    interrupted_with(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_gc_removes_the_pooled_sandboxes() {
    interrupted_with(libc::SIGKILL).await;
}
