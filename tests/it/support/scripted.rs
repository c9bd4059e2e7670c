//! Runs of the real binary with a scripted model: `agentbox run --json --script ...`, its report
//! and trajectory read back, and the invariant every such test shares (no container left).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Project, containers_of_pid, docker, eventually, text};

pub struct Run {
    pub code: Option<i32>,
    /// The run's own directory: its script, trajectory, patch and data directory.
    pub dir: tempfile::TempDir,
    pub stdout: String,
    pub stderr: String,
    pub events: Vec<Value>,
    pub report: Option<Value>,
}

impl Run {
    /// (tool name, result content, is_error) for every tool call, in order.
    pub fn results(&self) -> Vec<(String, String, bool)> {
        self.events
            .iter()
            .filter(|e| e["event"] == "tool_finished")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["content"].as_str().unwrap().to_string(),
                    e["is_error"].as_bool().unwrap(),
                )
            })
            .collect()
    }

    pub fn result(&self, i: usize) -> (String, String, bool) {
        self.results()
            .get(i)
            .cloned()
            .unwrap_or_else(|| panic!("no tool result {i}: {}", self.stderr))
    }

    /// Where this run's quarantined items are: `quarantine/SESSION/` under its data directory.
    pub fn quarantined(&self, rel: &str) -> PathBuf {
        let session = self
            .report
            .as_ref()
            .and_then(|r| r["session"].as_str())
            .unwrap_or_default();
        self.dir.path().join("data/quarantine").join(session).join(rel)
    }

    pub fn warnings(&self) -> String {
        self.report
            .as_ref()
            .map(|r| r["warnings"].to_string())
            .unwrap_or_default()
    }

    pub fn steps(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e["event"] == "model_response")
            .count()
    }
}

pub fn read_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub struct Spawned {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub trajectory: PathBuf,
    pub dir: tempfile::TempDir,
}

/// Start `agentbox run --json --script ... --trajectory ...` on `project`.
pub fn spawn_run(project: &Project, turns: Value, args: &[&str], env: &[(&str, &str)]) -> Spawned {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, json!({ "turns": turns }).to_string()).unwrap();
    let trajectory = dir.path().join("trajectory.jsonl");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    // From the run's own directory: an --isolate patch lands there, not in the repository.
    cmd.current_dir(dir.path())
        .arg("run")
        .arg("--json")
        .arg("--script")
        .arg(&script)
        .arg("--trajectory")
        .arg(&trajectory)
        .args(args)
        .arg(project.path())
        .env("AGENTBOX_CONFIG", "")
        // Its own data directory: what a run quarantines stays with the test.
        .env("AGENTBOX_DATA_DIR", dir.path().join("data"))
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("AGENTBOX_RUNTIME")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A run that hangs is ended when the test gives up.
        .kill_on_drop(true);
    if let Some(r) = super::test_runtime() {
        cmd.env("AGENTBOX_RUNTIME", r);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    Spawned {
        child,
        pid,
        trajectory,
        dir,
    }
}

/// Wait for the run, then check the invariant every scenario shares: no container left.
pub async fn finish(spawned: Spawned) -> Run {
    finish_within(spawned, Duration::from_secs(300)).await
}

/// [`finish`], for a run that may take longer than five minutes.
pub async fn finish_within(spawned: Spawned, limit: Duration) -> Run {
    let docker = docker().await;
    let out = tokio::time::timeout(limit, spawned.child.wait_with_output())
        .await
        .expect("agentbox did not finish")
        .unwrap();
    let pid = spawned.pid;
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "a container of agentbox pid {pid} outlived the run");
    let stdout = text(&out.stdout);
    Run {
        code: out.status.code(),
        report: serde_json::from_str(&stdout).ok(),
        stdout,
        stderr: text(&out.stderr),
        events: read_events(&spawned.trajectory),
        dir: spawned.dir,
    }
}

pub async fn hostile(project: &Project, turns: Value, args: &[&str]) -> Run {
    finish(spawn_run(project, turns, args, &[])).await
}

pub fn bash(command: &str) -> Value {
    json!({"name": "bash", "arguments": {"command": command}})
}

pub fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

pub fn done(text: &str) -> Value {
    json!({"text": text})
}

/// No file in the project is owned by anyone but its owner (never root, unless root owns it).
pub fn assert_owned_by_owner(project: &Project) {
    let (uid, _) = project.owner();
    let mut stack = vec![project.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            assert_eq!(
                meta.uid(),
                uid,
                "{} is owned by {}",
                entry.path().display(),
                meta.uid()
            );
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
}
