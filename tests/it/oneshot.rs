//! `exec`'s fast path: the command as the sandbox's own process, under agentbox's static
//! supervisor (`oneshot.c`). The policy, the status, the output's first bytes, an image with no
//! python or shell, and no container after a SIGKILL while the command runs.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

const FAST_PATH: &str = "exec_mode=one command as the sandbox's process";

/// Whether this run's sandboxes can take the fast path (not under gVisor, whose streams can
/// outlive a container; see `session::open_one_shot`).
fn fast_path_expected() -> bool {
    test_runtime().is_none_or(|r| !agentbox::sandbox::is_gvisor(&r))
}

#[test]
fn the_command_is_the_sandboxs_process_with_the_full_policy() {
    let project = Project::new(&[("notes.txt", "one\n")]);
    let script = "id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; \
                  ls /sys/class/net | tr '\\n' ' '; echo; \
                  touch /etc/x 2>/dev/null && echo root-writable || echo root-read-only; \
                  test -e /var/run/docker.sock && echo socket || echo no-socket; \
                  echo two >> notes.txt; tr '\\0' ' ' < /proc/1/cmdline | cut -c1-40; \
                  ulimit -n; cat /proc/self/oom_score_adj; \
                  echo x > /run/agentbox-init 2>/dev/null && echo init-writable || echo init-read-only; \
                  cat /proc/1/environ > /dev/null 2>&1 && echo init-dumpable || echo init-undumpable";
    let out = run(agentbox()
        .arg("-v")
        .arg("exec")
        .arg(project.path())
        .args(["--", "sh", "-c", script]));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    if fast_path_expected() {
        assert!(stderr.contains(FAST_PATH), "{stderr}");
    }
    let lines: Vec<&str> = stdout.lines().collect();
    let (uid, gid) = project.owner();
    assert_eq!(lines[0], uid.to_string(), "{stdout}");
    assert_eq!(lines[1], gid.to_string(), "{stdout}");
    assert_eq!(lines[2], "CapEff:\t0000000000000000", "{stdout}");
    assert_eq!(lines[3], "NoNewPrivs:\t1", "{stdout}");
    assert_eq!(lines[4].trim(), "lo", "loopback only: {stdout}");
    assert_eq!(lines[5], "root-read-only", "{stdout}");
    assert_eq!(lines[6], "no-socket", "{stdout}");
    if fast_path_expected() {
        assert!(
            lines[7].starts_with("/run/agentbox-init sh -c"),
            "PID 1 is the supervisor: {stdout}"
        );
    }
    // The limits and the OOM score the usual path gives a command; the supervisor cannot be
    // changed from inside.
    assert_eq!(lines[8], "4096", "{stdout}");
    assert_eq!(lines[9], "1000", "{stdout}");
    assert_eq!(lines[10], "init-read-only", "{stdout}");
    if fast_path_expected() {
        // Its /proc files are root's: a command of its uid can neither read nor ptrace it.
        assert_eq!(lines[11], "init-undumpable", "{stdout}");
    }
    assert_eq!(
        std::fs::read_to_string(project.path().join("notes.txt")).unwrap(),
        "one\ntwo\n"
    );
}

#[test]
fn output_status_and_a_command_that_kills_all_it_can() {
    let project = Project::new(&[]);
    // The supervisor's hello comes before the command exists: the same words from the command
    // are the command's output, passed on whole.
    let out =
        run(agentbox()
            .arg("exec")
            .arg(project.path())
            .args(["--", "printf", "agentbox-oneshot 1\\nmore"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "agentbox-oneshot 1\nmore");

    let out = run(agentbox().arg("exec").arg(project.path()).args([
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]));
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "out\n");
    assert!(text(&out.stderr).contains("err\n"), "{}", text(&out.stderr));

    // `kill -9 -1` ends every process of the sandbox user but the caller and PID 1 (the
    // background `sleep` here); the shell then kills itself. The supervisor lives on to say so.
    let out = run(agentbox().arg("exec").arg(project.path()).args([
        "--",
        "sh",
        "-c",
        "sleep 300 & kill -9 -1; echo after; kill -9 $$",
    ]));
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "after\n");
    assert!(text(&out.stderr).contains("SIGKILL"), "{}", text(&out.stderr));

    // A program that does not exist: the shell's word and status, as on the usual path.
    let out = run(agentbox()
        .arg("exec")
        .arg(project.path())
        .args(["--", "no-such-program-here"]));
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
}

#[tokio::test]
async fn an_image_without_python_takes_the_fast_path_too_and_runs_the_command_once() {
    // The supervisor is static and mounted from the host: it needs nothing from the image.
    let docker = docker().await;
    let image = no_python_image(&docker).await;
    let project = Project::new(&[]);
    let out = run(agentbox()
        .arg("-v")
        .arg("exec")
        .args(["--image", image])
        .arg(project.path())
        .args(["--", "sh", "-c", "echo ran >> count; cat count"]));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(text(&out.stdout), "ran\n", "{stderr}");
    if fast_path_expected() {
        assert!(stderr.contains(FAST_PATH), "{stderr}");
    }
}

#[tokio::test]
async fn sigkill_while_the_command_runs_ends_its_sandbox() {
    // The supervisor's stdin is this process's connection: when the process dies, it reads
    // end-of-input, ends the command and exits, and the daemon removes the container.
    let docker = docker().await;
    let project = Project::new(&[]);
    let mut child = tokio::process::Command::from(agentbox())
        .arg("exec")
        .arg(project.path())
        .args(["--", "sh", "-c", "echo started; sleep 300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use tokio::io::AsyncBufReadExt;
    tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
        .await
        .expect("the command did not start")
        .unwrap();
    assert_eq!(line, "started\n");
    assert_eq!(containers_of_pid(&docker, pid).await, 1);
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = child.wait().await;
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "the sandbox outlived its SIGKILLed process");
}
