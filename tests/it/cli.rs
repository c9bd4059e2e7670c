//! The `agentbox` binary end to end: exit statuses, error messages, and no container left
//! behind on success, error, SIGINT, SIGTERM or SIGKILL.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

#[test]
fn exec_runs_the_projects_tests_and_passes_their_status_through() {
    let project = Project::new(&[
        ("test_ok.py", "def test_ok():\n    assert 1 + 1 == 2\n"),
        ("test_bad.py", "def test_bad():\n    assert 1 + 1 == 3\n"),
    ]);
    let out = run(agentbox().arg("exec").arg(project.path()).args([
        "--",
        "python3",
        "-m",
        "pytest",
        "-q",
        "test_ok.py",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("1 passed"), "{}", text(&out.stdout));

    let out = run(agentbox()
        .arg("exec")
        .arg(project.path())
        .args(["--", "python3", "-m", "pytest", "-q"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("1 failed, 1 passed"),
        "{}",
        text(&out.stdout)
    );

    let out = run(agentbox().arg("exec").arg(project.path()).args([
        "--",
        "sh",
        "-c",
        "echo to-stderr >&2; exit 7",
    ]));
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stderr), "to-stderr\n");
}

#[test]
fn exec_timeout_exits_124() {
    let project = Project::new(&[]);
    let out = run(agentbox()
        .args(["exec", "--command-timeout", "1"])
        .arg(project.path())
        .args(["--", "sh", "-c", "sleep 600 & sleep 600"]));
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("timed out after 1s"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn exec_cuts_output_to_the_limit() {
    let project = Project::new(&[]);
    let out = run(agentbox()
        .args(["exec", "--output-limit", "1k"])
        .arg(project.path())
        .args(["--", "sh", "-c", "seq 1 100000"]));
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("1\n2\n3\n") && stdout.ends_with("99999\n100000\n"),
        "{stdout}"
    );
    assert!(stdout.len() < 3000, "{} bytes", stdout.len());
    assert!(text(&out.stderr).contains("output was cut"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let out = run(agentbox().args(["exec", "/definitely/not/here", "--", "true"]));
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(
        text(&out.stderr).trim(),
        "agentbox: error: project path /definitely/not/here does not exist"
    );

    let project = Project::new(&[("file.txt", "x")]);
    let out = run(agentbox()
        .arg("exec")
        .arg(project.file("file.txt"))
        .args(["--", "true"]));
    assert!(
        text(&out.stderr).contains("is not a directory"),
        "{}",
        text(&out.stderr)
    );

    let out = run(agentbox()
        .args(["exec", "--memory", "lots"])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--memory: invalid size \"lots\""),
        "{}",
        text(&out.stderr)
    );

    let out = run(agentbox()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .arg("exec")
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(
            "agentbox: error: cannot reach Docker at unix:///nonexistent/docker.sock: is the daemon running?"
        ),
        "{err}"
    );
    assert!(!err.contains("panicked") && err.lines().count() == 1, "{err}");

    let out = run(agentbox()
        .args(["exec", "--image", "agentbox/no-such-image:0"])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("image agentbox/no-such-image:0 is missing"),
        "{}",
        text(&out.stderr)
    );
    // Not agentbox's own image: it was pulled (no registry answers here), and the one message
    // says how to get it, without sending the user to `agentbox image build`.
    let err = text(&out.stderr);
    assert!(err.contains("pulling it failed"), "{err}");
    assert!(err.contains("docker pull"), "{err}");
    assert!(!err.contains("agentbox image build"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");

    // An older revision of one of agentbox's images: the current one, and how to build it.
    let out = run(agentbox()
        .args(["exec", "--image", "agentbox/rust:0"])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("this agentbox uses agentbox/rust:1"), "{err}");
    assert!(err.contains("agentbox image build rust --offline"), "{err}");
}

#[test]
fn a_git_symlink_is_refused() {
    let project = Project::new(&[]);
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), project.file(".git")).unwrap();
    let out = run(agentbox().arg("exec").arg(project.path()).args(["--", "true"]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains(".git is a symbolic link"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn doctor_passes_here_and_explains_a_missing_daemon() {
    let project = Project::new(&[("a.txt", "a\n")]);
    let out = run(agentbox().args(["doctor", "--no-network"]).arg(project.path()));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    // Which user is whose: the project's owner, and doctor's own scratch project's.
    let (uid, gid, own) = if crate::support::is_root() {
        (
            crate::support::TEST_UID,
            crate::support::TEST_UID,
            "0:0".to_string(),
        )
    } else {
        let (u, g) = unsafe { (libc::getuid(), libc::getgid()) };
        (u, g, format!("{u}:{g}"))
    };
    let owned = format!(
        "[ok  ] project: {} is owned by {uid}:{gid}: the sandbox's commands run as {uid}:{gid} on it",
        project.path().display()
    );
    assert!(stdout.contains(&owned), "missing {owned:?} in:\n{stdout}");
    let user = format!("[ok  ] user: the sandbox's commands run as the project's owner: {own} (");
    assert!(stdout.contains(&user), "missing {user:?} in:\n{stdout}");
    assert!(
        stdout.contains(&format!(
            "on doctor's scratch project, made by agentbox's own user ({own})"
        )),
        "{stdout}"
    );
    for check in [
        "network: interfaces: lo",
        "capabilities: CapEff 0000000000000000",
        "root filesystem: readonly",
        ".git: readonly",
    ] {
        assert!(stdout.contains(check), "missing {check:?} in:\n{stdout}");
    }
    let out = run(agentbox()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["doctor", "--no-network"]));
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("[FAIL] docker: cannot reach Docker at unix:///nonexistent/docker.sock"),
        "{stdout}"
    );
    assert!(stdout.contains("fix: start the daemon"), "{stdout}");
}

/// Start `agentbox exec PROJECT -- sleep 300`, wait until its container runs, then `signal` it.
async fn interrupt_with(signal: i32) -> (Option<i32>, usize, String) {
    let docker = docker().await;
    let project = Project::new(&[]);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .arg("exec")
        .arg(project.path())
        .args(["--", "sleep", "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    // Running, not only created: a SIGKILL between create and start leaves a container that
    // never ran (auto-removal needs a start; `agentbox gc` removes it), and on a loaded machine
    // that window is longer than the pause below.
    let up = eventually(Duration::from_secs(60), || async {
        running_containers_of_pid(&docker, pid).await == 1
    })
    .await;
    assert!(up, "the sandbox never started");
    // Let the command start inside it, so the signal lands mid-command.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, signal) };
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("agentbox did not exit after the signal")
        .unwrap();
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    let left = if gone {
        0
    } else {
        containers_of_pid(&docker, pid).await
    };
    (out.status.code(), left, text(&out.stderr))
}

#[tokio::test]
async fn sigint_removes_the_container() {
    let (code, left, stderr) = interrupt_with(libc::SIGINT).await;
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(left, 0);
    assert!(stderr.contains("SIGINT received"), "{stderr}");
}

#[tokio::test]
async fn sigterm_removes_the_container() {
    let (code, left, stderr) = interrupt_with(libc::SIGTERM).await;
    assert_eq!(code, Some(143), "{stderr}");
    assert_eq!(left, 0);
}

#[tokio::test]
async fn sigkill_leaves_no_container_either() {
    // No handler runs on SIGKILL: the keep-alive sees its stdin close and the daemon
    // auto-removes the container.
    let (code, left, _) = interrupt_with(libc::SIGKILL).await;
    assert_eq!(code, None);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn gc_removes_leftovers_of_dead_processes_only() {
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::{CreateContainerOptionsBuilder, StartContainerOptions};
    let docker = docker().await;
    // A leftover as a killed agentbox (pid that cannot be alive) would leave it.
    let name = format!("agentbox-gc-test-{}", std::process::id());
    let body = ContainerCreateBody {
        image: Some(agentbox::sandbox::image::DEFAULT_IMAGE.into()),
        cmd: Some(vec!["sleep".into(), "300".into()]),
        labels: Some(
            [
                ("agentbox.session".to_string(), "gc-test".to_string()),
                ("agentbox.pid".to_string(), "999999999".to_string()),
            ]
            .into(),
        ),
        host_config: Some(bollard::models::HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::default().name(&name).build()),
            body,
        )
        .await
        .unwrap();
    docker
        .start_container(&created.id, None::<StartContainerOptions>)
        .await
        .unwrap();
    let out = run(agentbox().arg("gc"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("removed container {}", &created.id[..12])),
        "{}",
        text(&out.stdout)
    );
    assert!(!container_exists(&docker, &created.id).await);
}

#[test]
fn new_users_edges_are_usage_errors_and_quiet_pipes() {
    // A missing project is a usage error for the agent commands (exec keeps its 125).
    for cmd in ["run", "chat"] {
        let out = run(agentbox()
            .args([cmd, "--provider", "openai", "--base-url", "http://127.0.0.1:9/v1"])
            .arg("/definitely/not/here"));
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("project path /definitely/not/here does not exist"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = run(agentbox().args(["eval", "--provider", "scripted", "/definitely/not/here"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // A missing script is a usage error too, said before any sandbox starts.
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let out = run(agentbox()
        .args([
            "run",
            "--provider",
            "scripted",
            "--script",
            "/definitely/not/here.json",
        ])
        .arg(project.path()));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--script /definitely/not/here.json: no such file"),
        "{}",
        text(&out.stderr)
    );

    // Each subcommand's help lists only what it accepts.
    let help = text(&run(agentbox().args(["eval", "--help"])).stdout);
    assert!(
        !help.contains("--approve") && !help.contains("--trajectory"),
        "{help}"
    );
    let help = text(&run(agentbox().args(["run", "--help"])).stdout);
    assert!(
        help.contains("--approve") && help.contains("--trajectory"),
        "{help}"
    );

    // A reader that goes away (`agentbox run ... | head -0`) is not a crash: the run finishes,
    // cleans up and exits with its own status.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        r#"[{"tool_calls": [{"name": "bash", "arguments": {"command": "seq 1 3000"}}]}, {"text": "done"}]"#,
    )
    .unwrap();
    let mut child = agentbox()
        .args(["run", "--provider", "scripted", "--test-cmd", "true", "--script"])
        .arg(&script)
        .arg(project.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{err}"
    );
}

/// Containers of the agentbox process `pid` that are running.
async fn running_containers_of_pid(docker: &bollard::Docker, pid: u32) -> usize {
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
        .len()
}

/// `just lint`'s import-cycle check: it finds a cycle between two sibling files (through a
/// `use` group and through a path in code, a re-export followed), ignores a parent using its
/// child and back, and passes agentbox's own source.
#[test]
fn the_import_cycle_check_finds_a_cycle_and_passes_the_source() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/module-cycles");
    let check = |dir: &std::path::Path| {
        let out = std::process::Command::new(&script).arg(dir).output().unwrap();
        (out.status.code(), text(&out.stdout))
    };
    let dir = tempfile::tempdir().unwrap();
    let write = |rel: &str, body: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write(
        "a/mod.rs",
        "mod inner;\npub use inner::Thing;\nuse super::b::helper;\n",
    );
    write(
        "a/inner.rs",
        "pub struct Thing;\nfn f() { super::Other; crate::b::helper(); }\n",
    );
    write(
        "b.rs",
        "pub fn helper() {}\n// crate::a::Thing in a comment is no use\n",
    );
    let (code, out) = check(dir.path());
    assert_eq!(code, Some(0), "a parent and its child, no cycle: {out}");
    write("b.rs", "use crate::a::{Thing, self};\npub fn helper() {}\n");
    let (code, out) = check(dir.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("a/inner.rs") && out.contains("b.rs"),
        "the re-export followed: {out}"
    );
    let (code, out) = check(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        check(&dir.path().join("missing")).0,
        Some(2),
        "a wrong directory is no pass"
    );
}

#[tokio::test]
async fn sigkill_right_after_the_output_leaves_no_container() {
    // `exec` writes the output and the status, closes stdout, then removes the sandbox: a kill
    // in that window (a reader that saw the end of the output and stopped the process) finds
    // the container running or half removed. The executor's stdin closes with the process, the
    // container exits and the daemon's auto-removal finishes the job.
    use tokio::io::AsyncReadExt;
    let docker = docker().await;
    let project = Project::new(&[]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .arg("exec")
        .arg(project.path())
        .args(["--", "echo", "printed"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut out = Vec::new();
    // To the end of stdout: with the teardown after it, that is the moment the output is all
    // there and the removal has not necessarily begun.
    tokio::time::timeout(Duration::from_secs(60), stdout.read_to_end(&mut out))
        .await
        .expect("no end of stdout")
        .unwrap();
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let status = child.wait().await.unwrap();
    assert_eq!(text(&out), "printed\n");
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(
        gone,
        "{} container(s) left after SIGKILL (exit {status:?})",
        containers_of_pid(&docker, pid).await
    );
}

#[test]
fn exec_says_when_the_memory_limit_killed_the_command_or_a_process_it_started() {
    // The memory cgroup's count is read by the executor in its own process (no Docker exec),
    // before and after the command: both reads must see the kill.
    let project = Project::new(&[]);
    let hog = "x = bytearray(400 * 1024 * 1024)";
    let out = run(agentbox()
        .arg("exec")
        .args(["--memory", "128m"])
        .arg(project.path())
        .args(["--", "python3", "-c", hog]));
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("killed by the sandbox's memory limit (out of memory)"),
        "{}",
        text(&out.stderr)
    );
    let out = run(agentbox()
        .arg("exec")
        .args(["--memory", "128m"])
        .arg(project.path())
        .args(["--", "sh", "-c", &format!("python3 -c '{hog}'; echo survived")]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "survived\n");
    assert!(
        text(&out.stderr).contains("the sandbox's memory limit killed a process it started"),
        "{}",
        text(&out.stderr)
    );
}
