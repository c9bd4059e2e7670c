//! agentbox against Podman's Docker-compatible service, unchanged: the sandbox policy observed
//! from inside, the timeout's kill, cleanup by label, and a run that fixes a task.
//!
//! The service's socket comes from `AGENTBOX_TEST_PODMAN_HOST` (e.g.
//! `unix:///run/agentbox-ci-podman/podman.sock`, which `.ci/run` starts with the python image
//! loaded). Without it, or if it does not answer, the tests say so loudly and pass, unless
//! `AGENTBOX_REQUIRE_ENGINES=1`, when they fail. The hostile suite runs against Podman too:
//! `DOCKER_HOST=... cargo test --test it -- hostile::` (see `.ci/run`).
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use crate::support::model_server::{ModelServer, Reply, anthropic_turn};
use crate::support::scripted::{Run, bash, done, read_events, spawn_run};
use crate::support::*;
use bollard::Docker;
use serde_json::{Value, json};

const KEY: &str = "sk-test-podman-sentinel-71d0c3";

/// The Podman endpoint and a client for it, or `None` (after saying why) when the tests
/// cannot run and are not required to.
async fn podman() -> Option<(String, Docker)> {
    let required = std::env::var("AGENTBOX_REQUIRE_ENGINES").is_ok_and(|v| v == "1");
    let skip = |why: String| {
        assert!(!required, "AGENTBOX_REQUIRE_ENGINES=1 and {why}");
        // Straight to the stream, past the test harness's capture of `eprintln!`.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED: Podman engine test: {why} (set AGENTBOX_TEST_PODMAN_HOST) ***"
        );
        None
    };
    let Some(host) = std::env::var("AGENTBOX_TEST_PODMAN_HOST")
        .ok()
        .filter(|h| !h.is_empty())
    else {
        return skip("AGENTBOX_TEST_PODMAN_HOST is not set".into());
    };
    let Some(path) = host.strip_prefix("unix://") else {
        return skip(format!("{host} is not a unix:// socket"));
    };
    let docker = match Docker::connect_with_unix(path, 120, bollard::API_DEFAULT_VERSION) {
        Ok(d) => d,
        Err(e) => return skip(format!("cannot connect to {host}: {e}")),
    };
    let version = match docker.version().await {
        Ok(v) => v,
        Err(e) => return skip(format!("{host} does not answer: {e}")),
    };
    let is_podman = version
        .components
        .unwrap_or_default()
        .iter()
        .any(|c| c.name.starts_with("Podman"));
    assert!(is_podman, "{host} answers, but it is not Podman");
    let image = agentbox::sandbox::image::DEFAULT_IMAGE;
    assert!(
        docker.inspect_image(image).await.is_ok(),
        "Podman at {host} has no {image}: `docker save {image} | podman load`"
    );
    Some((host, docker))
}

/// Containers labelled by the agentbox process `pid` on Podman. While Podman removes a
/// container it may list it in a state bollard cannot read: that counts as still there.
async fn podman_containers_of(docker: &Docker, pid: u32) -> Option<usize> {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let filters = HashMap::from([("label".to_string(), vec![format!("agentbox.pid={pid}")])]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .ok()
        .map(|l| l.len())
}

async fn assert_nothing_left(docker: &Docker, pid: u32) {
    let gone = eventually(Duration::from_secs(30), || async {
        podman_containers_of(docker, pid).await == Some(0)
    })
    .await;
    assert!(
        gone,
        "a container of agentbox pid {pid} outlived the run on Podman"
    );
}

/// `agentbox ARGS` against Podman; waits, checks no container of it is left, returns its
/// output.
async fn agentbox_on(host: &str, docker: &Docker, args: &[&str]) -> std::process::Output {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(args)
        .env("DOCKER_HOST", host)
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", test_data_dir())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn agentbox");
    let pid = child.id().unwrap();
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("agentbox did not finish")
        .unwrap();
    assert_nothing_left(docker, pid).await;
    out
}

/// What the sandbox looks like from inside, one `key=value` a line.
const PROBE: &str = r#"
echo "net=$(ls /sys/class/net | tr '\n' ' ' | sed 's/ *$//')"
echo "capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)"
echo "id=$(id -u):$(id -g)"
if touch /probe 2>/dev/null; then echo root=writable; else echo root=readonly; fi
if touch /workspace/.git/probe 2>/dev/null; then echo git=writable; else echo git=readonly; fi
echo "home=$(stat -c %u:%a "$HOME")"
if touch "$HOME/probe" /tmp/probe; then echo homewrite=ok; fi
echo "mem=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
echo "pids=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)"
echo "nofile=$(awk '/^Max open files/ {print $5}' /proc/self/limits)"
echo "fsize=$(awk '/^Max file size/ {print $5}' /proc/self/limits)"
echo "seccomp=$(awk '/^Seccomp:/ {print $2}' /proc/self/status)"
echo written > /workspace/from-the-sandbox
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_holds_inside_a_podman_sandbox() {
    let Some((host, docker)) = podman().await else {
        return;
    };
    let project = Project::new(&[("README", "probe\n")]);
    std::fs::create_dir(project.file(".git")).unwrap();
    project.chown_all();
    let out = agentbox_on(
        &host,
        &docker,
        &[
            "exec",
            "--memory",
            "512m",
            "--pids-limit",
            "128",
            "--max-file-size",
            "64m",
            project.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            PROBE,
        ],
    )
    .await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let facts: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let (uid, gid) = project.owner();
    let expect = [
        ("net", "lo".to_string()),
        ("capeff", "0000000000000000".into()),
        ("nonewprivs", "1".into()),
        ("id", format!("{uid}:{gid}")),
        ("root", "readonly".into()),
        ("git", "readonly".into()),
        ("home", format!("{uid}:700")),
        ("homewrite", "ok".into()),
        ("mem", (512i64 << 20).to_string()),
        ("pids", "128".into()),
        ("nofile", "4096".into()),
        ("fsize", (64i64 << 20).to_string()),
        ("seccomp", "2".into()),
    ];
    for (key, want) in expect {
        assert_eq!(facts.get(key).copied(), Some(want.as_str()), "{key}:\n{stdout}");
    }
    // What the sandbox wrote belongs to the project's owner on the host.
    assert_eq!(project.read("from-the-sandbox"), "written\n");
    scripted::assert_owned_by_owner(&project);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_timeout_is_killed_with_its_children() {
    let Some((host, docker)) = podman().await else {
        return;
    };
    let project = Project::new(&[("README", "timeout\n")]);
    let spawned = spawn_run(
        &project,
        json!([
            {"tool_calls": [bash("sleep 600 & (sleep 700; echo late) & sleep 800; echo never")]},
            {"tool_calls": [bash("ps -eo comm= | sort | uniq -c")]},
            done("killed")
        ]),
        &["--command-timeout", "3"],
        &[("DOCKER_HOST", host.as_str())],
    );
    let pid = spawned.pid;
    let out = tokio::time::timeout(Duration::from_secs(300), spawned.child.wait_with_output())
        .await
        .expect("agentbox did not finish")
        .unwrap();
    assert_nothing_left(&docker, pid).await;
    let run = Run {
        code: out.status.code(),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        report: serde_json::from_slice(&out.stdout).ok(),
        events: read_events(&spawned.trajectory),
        dir: spawned.dir,
    };
    let (_, first, _) = run.result(0);
    assert!(first.contains("timed out after"), "{first}");
    // Below the command line it echoes: nothing the killed commands would have printed.
    let printed: String = first.lines().skip(1).collect();
    assert!(!printed.contains("never") && !printed.contains("late"), "{first}");
    let (_, after, is_error) = run.result(1);
    assert!(!is_error, "{after}");
    assert!(!after.contains("sleep"), "a child outlived the timeout:\n{after}");
    assert_eq!(run.steps(), 3, "the loop went on: {}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_fixes_the_demo_on_podman() {
    let Some((host, docker)) = podman().await else {
        return;
    };
    let project = Project::new(&[
        (
            "library.py",
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo/library.py")),
        ),
        (
            "test_library.py",
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/demo/test_library.py"
            )),
        ),
    ]);
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn(
            "Fixing both bugs.",
            &[
                (
                    "edit_file",
                    json!({"path": "library.py", "old": "    return max((returned - due).days + 1, 0)", "new": "    return max((returned - due).days, 0)"}),
                ),
                (
                    "edit_file",
                    json!({"path": "library.py", "old": "        fee = fee / 2", "new": "        fee = fee // 2"}),
                ),
                ("run_tests", json!({})),
            ],
        )),
        Reply::ok(anthropic_turn("Fixed the off-by-one and the float division.", &[])),
    ])
    .await;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args([
            "run",
            "--json",
            "--base-url",
            &server.anthropic_url(),
            project.path().to_str().unwrap(),
        ])
        .env("DOCKER_HOST", &host)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", test_data_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("agentbox did not finish")
        .unwrap();
    assert_nothing_left(&docker, pid).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("--json report");
    assert_eq!(report["outcome"], "finished", "{report}");
    assert_eq!(report["tests"]["passed"], true, "{report}");
    assert!(project.read("library.py").contains("fee = fee // 2"));
    scripted::assert_owned_by_owner(&project);
    // The key reached the model server, and never the sandbox's engine.
    assert!(!stderr.contains(KEY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_podman_and_what_it_adapts() {
    let Some((host, docker)) = podman().await else {
        return;
    };
    let out = agentbox_on(&host, &docker, &["doctor", "--no-network"]).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("engine: Podman "), "{stdout}");
    assert!(stdout.contains("Podman's `U` option"), "{stdout}");
    assert!(stdout.contains("[ok  ] sandbox: ready in"), "{stdout}");
    assert!(
        stdout.contains("[ok  ] capabilities: CapEff 0000000000000000"),
        "{stdout}"
    );
}
