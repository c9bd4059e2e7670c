//! `--runtime`: a runtime the daemon does not know is refused by name, and under gVisor
//! (`runsc`) the two ways a command can end the whole sandbox are said in those words.
//! The gVisor tests need runsc registered with the daemon (`scripts/ci-runsc`): without it they
//! skip loudly, or fail when AGENTBOX_REQUIRE_ENGINES=1.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::time::Duration;

use crate::support::*;
use agentbox::sandbox::{DockerSandbox, ExecRequest, Sandbox, SandboxError};

/// The runtimes the daemon knows, and its default.
async fn runtimes() -> (Vec<String>, String) {
    let info = docker().await.info().await.expect("docker info");
    let mut names: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    names.sort();
    (names, info.default_runtime.unwrap_or_default())
}

/// Whether gVisor's tests can run here; if not, say so loudly (or fail, in CI).
async fn runsc_registered(test: &str) -> bool {
    if runtimes().await.0.iter().any(|n| n == "runsc") {
        return true;
    }
    let why = "the Docker daemon has no runtime \"runsc\" (scripts/ci-runsc registers it)";
    if std::env::var("AGENTBOX_REQUIRE_ENGINES").as_deref() == Ok("1") {
        panic!("{test}: {why}, and AGENTBOX_REQUIRE_ENGINES=1");
    }
    eprintln!("\n!!! SKIPPED {test}: {why}\n");
    false
}

async fn gvisor_sandbox(project: &Project, memory: &str, pids: i64) -> DockerSandbox {
    gvisor_sandbox_with(project, memory, pids, false).await
}

async fn gvisor_sandbox_with(project: &Project, memory: &str, pids: i64, per_call: bool) -> DockerSandbox {
    let args = agentbox::cli::SandboxArgs {
        image: Some(agentbox::sandbox::image::DEFAULT_IMAGE.into()),
        image_source: None,
        command_timeout: Some(60),
        memory: memory.into(),
        cpus: None,
        pids_limit: pids,
        tmp_size: "64m".into(),
        max_file_size: "1g".into(),
        runtime: Some("runsc".into()),
        per_call_exec: per_call,
        allow_weak_limits: false,
        host_scan_limit: 2_000_000,
        host_scan_timeout: 30,
        service: Vec::new(),
        service_timeout: 60,
        service_definitions: Vec::new(),
    };
    let cfg = agentbox::config::SandboxConfig::from_args(&args).unwrap();
    sandbox_with(project, &cfg).await
}

/// The container is removed (auto-remove, or our cleanup) once it died.
async fn assert_removed(sb: &DockerSandbox) {
    let docker = docker().await;
    let id = sb.info().container_id.clone();
    let gone = eventually(Duration::from_secs(30), || async {
        !container_exists(&docker, &id).await
    })
    .await;
    assert!(gone, "container {id} outlived the sandbox's death");
}

#[test]
fn a_runtime_the_daemon_does_not_know_is_named_with_those_it_knows() {
    let project = Project::new(&[("a.txt", "x")]);
    let out = run(agentbox()
        .args(["exec", "--runtime", "no-such-runtime"])
        .arg(project.path())
        .args(["--", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("the Docker daemon has no runtime \"no-such-runtime\" (it knows: ")
            && err.contains("runc"),
        "{err}"
    );
    assert!(err.contains("daemon.json"), "{err}");
}

#[tokio::test]
async fn doctor_lists_the_daemons_runtimes_and_its_default() {
    let (names, default) = runtimes().await;
    let out = run(agentbox().args(["doctor", "--no-network"]));
    let report = text(&out.stdout);
    let line = report
        .lines()
        .find(|l| l.starts_with("[ok  ] runtimes: "))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        line.contains(&format!("{} (default {default})", names.join(", "))),
        "{line}"
    );
    assert_eq!(
        line.contains("gVisor available: --runtime runsc"),
        names.iter().any(|n| n == "runsc"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gvisor_running_out_of_memory_says_the_whole_sandbox_stopped() {
    if !runsc_registered("under_gvisor_running_out_of_memory_says_the_whole_sandbox_stopped").await {
        return;
    }
    let project = Project::new(&[]);
    let sb = gvisor_sandbox(&project, "256m", 256).await;
    // Touches every page (as the hostile memory hog does), well past --memory.
    let hog = "x = [b'x' * (64 << 20) for _ in range(64)]; print('the memory limit did not hold')";
    let got = sb
        .exec(ExecRequest::argv(
            ["python3", "-c", hog],
            Duration::from_secs(120),
        ))
        .await;
    match &got {
        Err(SandboxError::SandboxOutOfMemory { runtime, .. }) => assert_eq!(runtime, "runsc"),
        other => panic!("expected the whole-sandbox out-of-memory error, got {other:?}"),
    }
    let message = got.unwrap_err().to_string();
    assert!(
        message
            .contains("ran out of memory (--memory) and gVisor (--runtime runsc) stopped the whole sandbox"),
        "{message}"
    );
    // Nothing runs there any more, and nothing is left behind.
    let after = sb
        .exec(ExecRequest::argv(["true"], Duration::from_secs(10)))
        .await;
    assert!(matches!(after, Err(SandboxError::ContainerGone(_))), "{after:?}");
    assert_removed(&sb).await;
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gvisor_a_fork_bomb_at_the_pids_limit_says_gvisor_ended_the_sandbox() {
    if !runsc_registered("under_gvisor_a_fork_bomb_at_the_pids_limit_says_gvisor_ended_the_sandbox").await {
        return;
    }
    let project = Project::new(&[]);
    let sb = gvisor_sandbox(&project, "1g", 128).await;
    let got = sb
        .exec(ExecRequest::shell(
            "timeout -s KILL 8 bash -c ':(){ :|:& };:'; sleep 2; echo survived",
            Duration::from_secs(60),
        ))
        .await;
    // Under runc the pids limit contains the bomb and the call returns; under gVisor (runsc
    // 2022-12, ptrace platform) its kernel cannot get a host thread and ends the sandbox.
    match &got {
        Err(SandboxError::SandboxEnded { runtime, .. }) => assert_eq!(runtime, "runsc"),
        other => panic!("expected gVisor to end the sandbox, got {other:?}"),
    }
    let message = got.unwrap_err().to_string();
    assert!(
        message.contains("gVisor (--runtime runsc) ended the whole sandbox")
            && message.contains("--pids-limit"),
        "{message}"
    );
    assert_removed(&sb).await;
    sb.shutdown().await.unwrap();
}

#[test]
fn under_gvisor_exec_past_memory_ends_with_the_reason_not_the_timeout() {
    if !tokio::runtime::Runtime::new().unwrap().block_on(runsc_registered(
        "under_gvisor_exec_past_memory_ends_with_the_reason_not_the_timeout",
    )) {
        return;
    }
    let project = Project::new(&[]);
    // A 40 GiB allocation: under runc a MemoryError; under gVisor the whole sandbox stops, and
    // the exec's stream stays open (without watching the container, exec waits for the timeout).
    let out = run(agentbox()
        .args([
            "exec",
            "--runtime",
            "runsc",
            "--memory",
            "1g",
            "--command-timeout",
            "100",
        ])
        .arg(project.path())
        .args(["--", "python3", "-c", "b = bytearray(40 * 2**30); print(len(b))"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(
            "the sandbox ran out of memory (--memory) and gVisor (--runtime runsc) stopped the whole sandbox"
        ),
        "{err}"
    );
    assert!(!err.contains("timed out"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gvisor_the_file_tools_work_with_one_docker_exec_per_call() {
    if !runsc_registered("under_gvisor_the_file_tools_work_with_one_docker_exec_per_call").await {
        return;
    }
    let project = Project::new(&[("notes.txt", "one\n")]);
    std::fs::set_permissions(
        project.file("notes.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    let sb = gvisor_sandbox_with(&project, "1g", 256, true).await;
    let ws = agentbox::workspace::Workspace::new(&sb);
    // Reading needs the size and replacing the mode: coreutils' `stat` cannot give either
    // under this gVisor (statx with AT_NO_AUTOMOUNT: EINVAL).
    let read = ws.read("notes.txt", 100).await.unwrap();
    assert_eq!((read.data.as_slice(), read.size), (&b"one\n"[..], 4));
    ws.replace("notes.txt", b"two\n".to_vec()).await.unwrap();
    assert_eq!(project.read("notes.txt"), "two\n");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(project.file("notes.txt"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o7777, 0o640, "the mode survives the atomic replace");
    sb.shutdown().await.unwrap();
}
