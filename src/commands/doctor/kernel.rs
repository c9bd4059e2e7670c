//! What stands between a command and the shared kernel, as the probe found it.

use std::collections::HashMap;

use super::{Level, Report};
use crate::config::SandboxConfig;

/// What stands between a command and the shared kernel: agentbox's seccomp profile (see
/// `sandbox::seccomp`) and the OOM score that makes commands, not the sandbox's main process,
/// the OOM killer's choice. Observed from inside, whatever the engine claims.
pub(super) fn check_kernel(facts: &HashMap<String, String>, cfg: &SandboxConfig, r: &mut Report) {
    let fact = |k: &str| facts.get(k).map(String::as_str).unwrap_or("?");
    // gVisor serves the sandbox from its own kernel: it has no vsock, and an io_uring there is
    // gVisor's, not the host's. It applies an OCI seccomp profile only when runsc runs with
    // --oci-seccomp, which the runsc measured here (Debian's, 2022-12) cannot take: it ignores a
    // rule's errno, so clone3 gets EPERM instead of ENOSYS and no thread can start (with the
    // engine's own default profile too).
    let gvisor = cfg.runtime.as_deref().is_some_and(crate::sandbox::is_gvisor);
    let apply = "the engine must apply the seccomp profile agentbox passes in security_opt: \
                 `docker info` should list seccomp under Security Options; a runtime other than \
                 runc or crun may ignore it";
    match fact("seccomp") {
        "2" => r.line(
            Level::Ok,
            "seccomp",
            "agentbox's profile is on (filter mode)",
            None,
        ),
        other if gvisor => r.line(
            Level::Ok,
            "seccomp",
            format!("not applied by gVisor (Seccomp: {other}); gVisor's own kernel serves the sandbox"),
            None,
        ),
        other => r.line(
            Level::Fail,
            "seccomp",
            format!("no seccomp filter in the sandbox (Seccomp: {other})"),
            Some(apply),
        ),
    }
    let failed = fact("toolsfailed");
    if failed.is_empty() {
        r.line(
            Level::Ok,
            "tools",
            "python3 (with a thread), git, rg and sh run under the profile",
            None,
        );
    } else {
        let fix = if gvisor && fact("seccomp") == "2" {
            "this runsc applies the profile (--oci-seccomp) but ignores a rule's errno, so clone3 \
             gets EPERM and threads cannot start: drop --oci-seccomp from the runtime's \
             runtimeArgs, or use a gVisor that honours errnoRet"
        } else {
            "run `agentbox -v exec PROJECT -- TOOL --version` to see the error; if a syscall is \
             refused (EPERM), report it with the tool's version"
        };
        r.line(
            Level::Fail,
            "tools",
            format!("failed under the sandbox's policy: {failed}"),
            Some(fix),
        );
    }
    for (what, key, reach) in [
        (
            "vsock",
            "vsock",
            "an AF_VSOCK socket reaches the hypervisor and host services past network_mode none",
        ),
        (
            "io_uring",
            "io_uring",
            "an io_uring's operations are never seen by seccomp",
        ),
    ] {
        match fact(key) {
            "created" if gvisor => r.line(
                Level::Ok,
                what,
                "can be created, in gVisor's own kernel (not the host's)",
                None,
            ),
            "created" => r.line(
                Level::Fail,
                what,
                format!("can be created in the sandbox: {reach}"),
                Some(apply),
            ),
            "?" | "unknown" => r.line(
                Level::Warn,
                what,
                "not checked (the image has no python3 with ctypes)",
                None,
            ),
            errno => r.line(Level::Ok, what, format!("cannot be created ({errno})"), None),
        }
    }
    match fact("oomadj") {
        // Measured: the host's OOM killer sees gVisor's kernel, not the processes inside it.
        "1000" if gvisor => r.line(
            Level::Warn,
            "oom score",
            "1000 inside gVisor, but running out of memory ends the whole sandbox (and the session)",
            None,
        ),
        "1000" => r.line(Level::Ok, "oom score", "commands are the OOM killer's first choice (1000)", None),
        other => r.line(
            Level::Fail,
            "oom score",
            format!("commands run at OOM score {other}, not 1000: when memory runs out the kernel may end the sandbox's main process, and the session"),
            Some("the sandbox's /proc must let a process raise its own oom_score_adj; run with -v and report it"),
        ),
    }
    let budget = crate::sandbox::MemoryBudget::new(cfg.limits.memory_bytes);
    let mib = |b: i64| b >> 20;
    r.line(
        Level::Ok,
        "memory budget",
        format!(
            "of {} MiB: /tmp {} MiB and as much for agentbox's scratch space, HOME {} MiB, /dev/shm {} MiB; at least {} MiB stays for processes",
            mib(cfg.limits.memory_bytes),
            mib(cfg.limits.tmp_bytes),
            mib(cfg.limits.home_bytes),
            mib(cfg.limits.shm_bytes),
            mib(budget.reserve),
        ),
        None,
    );
}

/// Creates (and closes) an AF_VSOCK socket and an io_uring, or says why it could not: the
/// errno's name, `created`, or `unknown`. Never connects anywhere.
pub(super) const KERNEL_PROBE: &str = r#"
import errno, os, socket
def attempt(make):
    try:
        make()
        return "created"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def vsock():
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
def io_uring():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(425, 4, params)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    os.close(fd)
print("vsock=" + (attempt(vsock) if hasattr(socket, "AF_VSOCK") else "unknown"))
try:
    print("io_uring=" + attempt(io_uring))
except ImportError:
    print("io_uring=unknown")
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(facts: &[(&str, &str)], runtime: Option<&str>) -> usize {
        let facts: HashMap<String, String> = facts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut cfg = crate::config::SandboxConfig::from_args(&crate::cli::SandboxArgs {
            image: Some("i".into()),
            image_source: None,
            command_timeout: Some(60),
            memory: "2g".into(),
            cpus: Some(1.0),
            pids_limit: 64,
            tmp_size: "auto".into(),
            max_file_size: "1g".into(),
            runtime: None,
            per_call_exec: false,
            allow_weak_limits: false,
            host_scan_limit: 2_000_000,
            host_scan_timeout: 30,
            service: Vec::new(),
            service_timeout: 60,
            service_definitions: Vec::new(),
        })
        .unwrap();
        cfg.runtime = runtime.map(String::from);
        let mut r = Report { problems: 0 };
        check_kernel(&facts, &cfg, &mut r);
        r.problems
    }

    #[test]
    fn each_way_past_the_kernel_policy_is_a_problem() {
        let good = [
            ("seccomp", "2"),
            ("toolsfailed", ""),
            ("vsock", "EPERM"),
            ("io_uring", "ENOSYS"),
            ("oomadj", "1000"),
        ];
        assert_eq!(problems(&good, None), 0);
        let open = [
            ("seccomp", "0"),
            ("toolsfailed", " git"),
            ("vsock", "created"),
            ("io_uring", "created"),
            ("oomadj", "500"),
        ];
        assert_eq!(problems(&open, None), 5);
        // gVisor without --oci-seccomp (as measured): no filter, no vsock, its own io_uring.
        let gvisor = [
            ("seccomp", "0"),
            ("toolsfailed", ""),
            ("vsock", "EAFNOSUPPORT"),
            ("io_uring", "created"),
            ("oomadj", "1000"),
        ];
        assert_eq!(problems(&gvisor, Some("runsc")), 0);
        assert_eq!(
            problems(&gvisor, None),
            2,
            "under runc: no filter, a host io_uring"
        );
        // gVisor with --oci-seccomp: threads fail.
        let oci = [
            ("seccomp", "2"),
            ("toolsfailed", " python3"),
            ("vsock", "EPERM"),
            ("io_uring", "EPERM"),
            ("oomadj", "1000"),
        ];
        assert_eq!(problems(&oci, Some("runsc")), 1);
    }
}
