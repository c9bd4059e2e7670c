//! Hostile code against the kernel the sandbox shares with the host: memory that belongs to no
//! process (files in the in-memory filesystems) used to get the command runner OOM-killed, and
//! sockets and rings the engine's default seccomp profile allowed. Each scenario runs against
//! the real daemon, in both exec modes where they differ, and checks the effect from inside.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::time::Duration;

use crate::support::scripted::*;
use crate::support::*;
use agentbox::sandbox::{ExecMode, ExecRequest, Sandbox};
use serde_json::json;

/// Fills every in-memory filesystem the sandbox user can write (each until it is full), then
/// starts many small memory users: together more than `--memory` holds. (Forty users of 8 MiB
/// do the same, but the kernel then spends half a minute reclaiming before it kills.)
const FILL_AND_FORK: &str = r#"for d in /tmp /run/agentbox "$HOME" /dev/shm; do
  dd if=/dev/zero of="$d/fill" bs=1M count=4096 2>&1 | grep -o 'No space left on device' | head -n 1
done
for i in $(seq 20); do
  python3 -c 'import time; b = bytearray(16 << 20); time.sleep(3)' 2>/dev/null &
done
wait
echo fill-and-fork-done
"#;

async fn memory_backed_files_then_many_processes(per_call: bool) {
    let project = Project::new(&[("fill_and_fork.sh", FILL_AND_FORK)]);
    let mut args = vec!["--memory", "256m"];
    if per_call {
        args.push("--per-call-exec");
    }
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("bash fill_and_fork.sh")]},
            // The in-memory filesystems are still full here: the reserve is what runs this.
            {"tool_calls": [bash("echo alive; cat /proc/self/oom_score_adj; df -m /tmp /run/agentbox | tail -n 2")]},
            {"tool_calls": [bash("rm -f /tmp/fill /run/agentbox/fill \"$HOME/fill\" /dev/shm/fill; echo emptied")]},
            {"text": "the sandbox survived"}
        ]),
        &args,
    )
    .await;
    let (_, fill, _) = run.result(0);
    if under_gvisor() {
        // Known gap (docs/src/engines/gvisor.md): the in-memory filesystems are gVisor's kernel's memory,
        // one host process the host's OOM killer takes whole. The limit held, the run says so
        // in those words and stops, and no container is left (`finish`).
        assert!(
            fill.contains("ran out of memory (--memory) and gVisor (--runtime"),
            "{fill}"
        );
        assert_eq!(run.code, Some(4), "{}", run.stderr);
        eprintln!("under gVisor the whole sandbox ran out of memory (known gap)");
        return;
    }
    assert!(
        fill.matches("No space left on device").count() == 4,
        "each in-memory filesystem filled up before the memory did: {fill}"
    );
    assert!(
        fill.contains("(out of memory)"),
        "the OOM kills are reported as such: {fill}"
    );
    let (_, after, is_error) = run.result(1);
    assert!(
        !is_error && after.contains("alive"),
        "the next call works: {after}"
    );
    assert!(
        after.lines().any(|l| l.trim() == "1000"),
        "commands are the OOM killer's first choice: {after}"
    );
    assert!(run.result(2).1.contains("emptied"));
    assert_eq!(run.steps(), 4, "the loop went on: {}", run.stderr);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report.expect("a JSON report");
    assert!(report["error"].is_null(), "{}", report["error"]);
    assert!(report["diff_error"].is_null(), "{}", report["diff_error"]);
    assert!(!run.stderr.contains("container is gone"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_memory_filesystems_and_many_processes_kill_commands_not_the_executor() {
    memory_backed_files_then_many_processes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_memory_filesystems_and_many_processes_kill_commands_not_the_keepalive() {
    memory_backed_files_then_many_processes(true).await;
}

#[test]
fn a_tmp_size_that_leaves_no_room_for_processes_is_refused() {
    let project = Project::new(&[]);
    let out = run(agentbox()
        .args(["exec", "--memory", "256m", "--tmp-size", "512m"])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let err = text(&out.stderr);
    assert!(
        err.contains("--tmp-size 512m does not fit --memory 256m") && err.contains("--tmp-size 72m or less"),
        "{err}"
    );
}

/// Tries what the engine's default profile allowed; prints one `name=result` line each.
/// Creating a socket object is local: nothing is connected anywhere.
const KERNEL_PROBE: &str = r#"
import ctypes, errno, os, socket
def attempt(name, make):
    try:
        make()
        print(f"{name}=created")
    except OSError as e:
        print(f"{name}={errno.errorcode.get(e.errno, e.errno)}")
attempt("vsock", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close())
attempt("vsock_dgram", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_DGRAM).close())
attempt("vsock_pair", lambda: socket.socketpair(socket.AF_VSOCK))
attempt("unix_pair", lambda: [s.close() for s in socket.socketpair(socket.AF_UNIX)])
attempt("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
libc = ctypes.CDLL(None, use_errno=True)
def syscall(name, number, *args):
    def call():
        r = libc.syscall(number, *args)
        if r < 0:
            raise OSError(ctypes.get_errno(), name)
        os.close(r)
    attempt(name, call)
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
syscall("io_uring_setup", 425, 4, params)  # same number on x86_64 and aarch64
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print("seccomp=" + status.get("Seccomp", "?").strip())
print("kernel=" + os.uname().release)
"#;

async fn vsock_and_io_uring_are_refused(per_call: bool) {
    let project = Project::new(&[]);
    let mut cfg = config();
    cfg.per_call_exec = per_call;
    let sb = sandbox_with(&project, &cfg).await;
    assert_eq!(sb.info().exec_mode == ExecMode::PerCall, per_call);
    let out = sb
        .exec(ExecRequest::argv(
            ["python3", "-c", KERNEL_PROBE],
            Duration::from_secs(60),
        ))
        .await
        .expect("exec");
    sb.shutdown().await.unwrap();
    let stdout = out.stdout.to_text();
    assert!(out.success(), "{} {}", out.status_line(), out.stderr.to_text());
    let lines: Vec<&str> = stdout.lines().collect();
    if under_gvisor() {
        // gVisor's own kernel answers every call, not the host's: it has no vsock at all, its
        // io_uring is its own (the host's is out of reach), and it does not apply the OCI
        // seccomp profile (see `doctor`). Said by the kernel gVisor reports, not the host's.
        let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_ne!(host.trim(), "4.4.0", "the host itself reports gVisor's version");
        for expected in [
            "vsock=EAFNOSUPPORT",
            "vsock_dgram=EAFNOSUPPORT",
            "vsock_pair=EAFNOSUPPORT",
            "unix_pair=created",
            "inet=created",
            "kernel=4.4.0",
        ] {
            assert!(lines.contains(&expected), "{expected} missing: {stdout}");
        }
        return;
    }
    for expected in [
        "vsock=EPERM",
        "vsock_dgram=EPERM",
        "vsock_pair=EPERM",
        "io_uring_setup=ENOSYS",
        "unix_pair=created",
        "inet=created",
        "seccomp=2",
    ] {
        assert!(lines.contains(&expected), "{expected} missing: {stdout}");
    }
}

#[tokio::test]
async fn vsock_sockets_and_io_uring_are_refused_to_the_executors_commands() {
    vsock_and_io_uring_are_refused(false).await;
}

#[tokio::test]
async fn vsock_sockets_and_io_uring_are_refused_to_per_call_commands() {
    vsock_and_io_uring_are_refused(true).await;
}
