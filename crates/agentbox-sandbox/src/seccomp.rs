//! agentbox's own seccomp profile: the container engine's default, minus what reaches past the
//! sandbox's walls.
//!
//! **Base.** The behaviour of Docker Engine's default profile (moby's
//! `profiles/seccomp/default.json`, as shipped with Engine 25 to 28, which containerd and
//! Podman's `containers/common` mirror): an allowlist, everything else fails with `EPERM`;
//! namespace flags refused to `clone`, `clone3` answered `ENOSYS` (its flags cannot be filtered,
//! so libc falls back to `clone`); `personality` only with the harmless personas; `ptrace` and
//! its relatives on kernels from 4.8; none of the calls the engine reserves for a capability
//! (agentbox drops them all, so those rules could never apply). The lists below are written
//! here by purpose, not copied; a syscall name the host's libseccomp does not know is skipped by
//! runc, and runc answers `ENOSYS` to syscalls newer than any the profile names, so libc's
//! fallbacks keep working on newer kernels.
//!
//! **What it adds.** Docker 20.10 (what Debian ships) allowed both of these:
//! - `socket`/`socketpair` with `AF_VSOCK`: a vsock socket talks to the hypervisor and the
//!   host's vsock services and ignores `network_mode: none`. Refused with `EPERM`.
//!   `socketcall(2)` (32-bit x86's multiplexer, whose arguments sit in memory where seccomp
//!   cannot read them) is not allowed either, or it would be a way around that rule: 32-bit x86
//!   programs built to create sockets through it get `EPERM`.
//! - io_uring (`io_uring_setup`, `_enter`, `_register`): the operations a ring performs are
//!   never seen by seccomp, so a ring bypasses every argument filter here, and it has been a
//!   steady source of kernel bugs. Refused with `ENOSYS`, as a kernel without io_uring does, so
//!   libuv (Node) and the like fall back to threads. Engine 25 refuses them too.
//!
//! **Keeping it current.** When the engine's default profile changes (its release notes say so
//! under "seccomp"), read the change and mirror it here if the calls are ones an unprivileged
//! process may make. The unit tests pin the calls the toolchains agentbox runs need (seen with
//! `strace -f -c` on a workload of python, pytest, git, ripgrep, sh and coreutils in the image)
//! and the calls that must stay refused. To learn what another toolchain needs, run it under
//! this profile with `SCMP_ACT_LOG` as the default action: the kernel log then names each call
//! the profile would have refused (`audit: type=1326 ... syscall=N`). Done for the image's tools
//! and for the integration suites (`tests/it/sandbox.rs`, `tests/it/hostile.rs`), it named none.
//! `agentbox doctor` starts a real sandbox and checks from inside that the filter is on, that
//! the tools run, and that a vsock socket and an io_uring cannot be created.
//!
//! **Engines.** Docker (runc) applies a profile passed as `seccomp=<JSON>` in the create
//! request's `security_opt`: what the docker CLI sends for `--security-opt seccomp=FILE`, and
//! checked when the container starts. Podman's Docker-compatible API (4.3) opens the value as a
//! file instead, so for Podman the profile is written to a file only this user can change and
//! its path is passed (checked against Podman 4.3.1 with runc: vsock and io_uring refused, as
//! is `unshare`, which Podman's own default allows). gVisor (`--runtime runsc`) does not apply
//! it unless runsc runs with `--oci-seccomp`, and needs it less: its own kernel serves the
//! sandbox, without vsock, and an io_uring there is gVisor's, not the host's. Debian's runsc
//! (2022-12) with `--oci-seccomp` ignores a rule's errno, so `clone3` gets `EPERM` instead of
//! `ENOSYS` and no thread can start, under the engine's default profile as under this one: use
//! runsc without that flag. `doctor` reports what it observes, whatever the engine.

use std::sync::OnceLock;

use serde_json::{Value, json};

/// Address family number of vsock (`AF_VSOCK` in `<sys/socket.h>`).
pub const AF_VSOCK: u64 = 40;

/// The io_uring calls, refused.
pub(crate) const IO_URING: [&str; 3] = ["io_uring_setup", "io_uring_enter", "io_uring_register"];

/// Namespace flags `clone` may not be given without CAP_SYS_ADMIN (which the sandbox never has):
/// a new user namespace would hand the sandbox user capabilities over fresh kernel objects.
const CLONE_NAMESPACE_FLAGS: u64 = 0x0002_0000 // CLONE_NEWNS
    | 0x0200_0000 // CLONE_NEWCGROUP
    | 0x0400_0000 // CLONE_NEWUTS
    | 0x0800_0000 // CLONE_NEWIPC
    | 0x1000_0000 // CLONE_NEWUSER
    | 0x2000_0000 // CLONE_NEWPID
    | 0x4000_0000; // CLONE_NEWNET

/// `personality(2)` values allowed: Linux, 32-bit Linux, each with `UNAME26`, and the query.
/// Not `ADDR_NO_RANDOMIZE`, which would switch address space randomisation off.
const PERSONAS: [u64; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// Files, directories, links, attributes and descriptors.
const FILES: &[&str] = &[
    "access",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "close",
    "close_range",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futimesat",
    "getcwd",
    "getdents",
    "getdents64",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "ioctl",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listxattr",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "name_to_handle_at",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pipe",
    "pipe2",
    "pread64",
    "preadv",
    "preadv2",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "rmdir",
    "sendfile",
    "sendfile64",
    "setxattr",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "tee",
    "truncate",
    "truncate64",
    "umask",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vmsplice",
    "write",
    "writev",
];

/// Waiting on many descriptors, and descriptors that are events.
const EVENTS: &[&str] = &[
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "_newselect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "pselect6",
    "pselect6_time64",
    "select",
    "signalfd",
    "signalfd4",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
];

/// Asynchronous I/O of the older kind (libaio), whose requests seccomp does see at submission.
const AIO: &[&str] = &[
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "io_setup",
    "io_submit",
];

/// Processes, threads, credentials (within what the sandbox user already holds) and limits.
const PROCESSES: &[&str] = &[
    "capget",
    "capset",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "fork",
    "getcpu",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "get_thread_area",
    "gettid",
    "getuid",
    "getuid32",
    "ioprio_get",
    "ioprio_set",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "membarrier",
    "pidfd_open",
    "pidfd_send_signal",
    "prctl",
    "prlimit64",
    "restart_syscall",
    "rseq",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "ugetrlimit",
    "uname",
    "vfork",
    "wait4",
    "waitid",
    "waitpid",
];

/// Memory mappings, locks (bounded by RLIMIT_MEMLOCK) and NUMA placement.
const MEMORY: &[&str] = &[
    "brk",
    "get_mempolicy",
    "madvise",
    "map_shadow_stack",
    "mbind",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mremap",
    "mseal",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "process_mrelease",
    "remap_file_pages",
    "set_mempolicy",
    "set_mempolicy_home_node",
];

/// Signals, futexes and timers.
const SIGNALS_AND_TIME: &[&str] = &[
    "alarm",
    "adjtimex",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "futex",
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "getitimer",
    "gettimeofday",
    "kill",
    "nanosleep",
    "pause",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "setitimer",
    "sigaltstack",
    "sigprocmask",
    "sigreturn",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "times",
    "tkill",
];

/// Sockets once created (creating one is filtered by family, below).
const SOCKETS: &[&str] = &[
    "accept",
    "accept4",
    "bind",
    "connect",
    "getpeername",
    "getsockname",
    "getsockopt",
    "listen",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "send",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setsockopt",
    "shutdown",
];

/// System V and POSIX IPC, private to the container's IPC namespace.
const IPC: &[&str] = &[
    "ipc",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
];

/// Reads about the system that reveal nothing the container does not already see.
const SYSTEM: &[&str] = &["cachestat", "getrandom", "sysinfo"];

/// Tracing and inspecting other processes: refused by the kernels before 4.8 in a way seccomp
/// could be bypassed with, so only on newer ones (the engine's rule). Same-uid and
/// no-new-privileges rules still apply, and the executor makes itself undumpable.
const TRACING: &[&str] = &[
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
];

/// Every syscall allowed without conditions on its arguments (arch-specific ones aside): what
/// the tests hold the profile to.
#[cfg(test)]
fn allowed() -> impl Iterator<Item = &'static str> {
    [
        FILES,
        EVENTS,
        AIO,
        PROCESSES,
        MEMORY,
        SIGNALS_AND_TIME,
        SOCKETS,
        IPC,
        SYSTEM,
        TRACING,
    ]
    .into_iter()
    .flatten()
    .copied()
}

fn allow(names: &[&str]) -> Value {
    json!({"names": names, "action": "SCMP_ACT_ALLOW"})
}

fn refuse(names: &[&str], errno: i32) -> Value {
    json!({"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno})
}

fn arg(index: u32, op: &str, value: u64) -> Value {
    json!({"index": index, "value": value, "op": op})
}

/// The profile, in the format of the engine's `seccomp=` security option.
pub fn profile() -> Value {
    let mut rules: Vec<Value> = vec![
        allow(
            &[
                FILES,
                EVENTS,
                AIO,
                PROCESSES,
                MEMORY,
                SIGNALS_AND_TIME,
                SOCKETS,
                IPC,
                SYSTEM,
            ]
            .concat(),
        ),
        {
            let mut r = allow(TRACING);
            r["includes"] = json!({"minKernel": "4.8"});
            r
        },
    ];
    for persona in PERSONAS {
        let mut r = allow(&["personality"]);
        r["args"] = json!([arg(0, "SCMP_CMP_EQ", persona)]);
        rules.push(r);
    }
    // Sockets of every family but vsock, which meets the default `EPERM`. (A second rule giving
    // vsock another errno is refused by libseccomp: "error adding seccomp rule for syscall
    // socket: file exists".)
    for call in ["socket", "socketpair"] {
        let mut ok = allow(&[call]);
        ok["args"] = json!([arg(0, "SCMP_CMP_NE", AF_VSOCK)]);
        rules.push(ok);
    }
    rules.push(refuse(&IO_URING, libc::ENOSYS));
    // clone: no namespace flags. The flags are the first argument, except on s390.
    let mut clone = allow(&["clone"]);
    clone["args"] =
        json!([{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]);
    clone["excludes"] = json!({"arches": ["s390", "s390x"]});
    let mut clone_s390 = allow(&["clone"]);
    clone_s390["args"] =
        json!([{"index": 1, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]);
    clone_s390["includes"] = json!({"arches": ["s390", "s390x"]});
    rules.extend([clone, clone_s390, refuse(&["clone3"], libc::ENOSYS)]);
    // Calls that exist on some architectures only.
    for (arches, names) in [
        (&["amd64", "x32", "x86"][..], &["arch_prctl", "modify_ldt"][..]),
        (
            &["arm", "arm64"][..],
            &[
                "arm_fadvise64_64",
                "arm_sync_file_range",
                "sync_file_range2",
                "breakpoint",
                "cacheflush",
                "set_tls",
            ][..],
        ),
        (&["ppc64le"][..], &["sync_file_range2", "swapcontext"][..]),
        (
            &["s390", "s390x"][..],
            &["s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr"][..],
        ),
        (&["riscv64"][..], &["riscv_flush_icache"][..]),
    ] {
        let mut r = allow(names);
        r["includes"] = json!({"arches": arches});
        rules.push(r);
    }
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": libc::EPERM,
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
            {"architecture": "SCMP_ARCH_PPC64LE", "subArchitectures": ["SCMP_ARCH_PPC64", "SCMP_ARCH_PPC"]},
            {"architecture": "SCMP_ARCH_S390X", "subArchitectures": ["SCMP_ARCH_S390"]},
            {"architecture": "SCMP_ARCH_RISCV64", "subArchitectures": []},
        ],
        "syscalls": rules,
    })
}

/// The profile as the JSON text the engine takes, built once.
pub(crate) fn profile_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| profile().to_string())
}

/// The `security_opt` entry that applies the profile.
pub fn security_opt() -> String {
    format!("seccomp={}", profile_json())
}

/// The same entry in the form Podman's Docker-compatible API takes: a path to the profile on
/// the engine's host (it opens the value as a file, and refuses inline JSON with "opening
/// seccomp profile failed"). The file is written once per profile, where only this user can
/// change it: whoever could rewrite it could loosen the sandbox.
pub(crate) fn security_opt_as_file() -> std::io::Result<String> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(run) => std::path::PathBuf::from(run).join("agentbox"),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => std::env::temp_dir().join(format!("agentbox-{}", unsafe { libc::getuid() })),
    };
    write_profile_file(&dir).map(|path| format!("seccomp={}", path.display()))
}

fn write_profile_file(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use sha2::Digest;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    // A directory someone else made (in a shared /tmp, say) could hold a profile of theirs.
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory only this user can write",
            dir.display()
        )));
    }
    let digest = sha2::Sha256::digest(profile_json().as_bytes());
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("seccomp-{name}.json"));
    if std::fs::read(&path).is_ok_and(|held| held == profile_json().as_bytes()) {
        return Ok(path);
    }
    // Whole or absent: a concurrent run must never read half a profile.
    let mut tmp = tempfile::Builder::new().prefix(".seccomp-").tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, profile_json().as_bytes())?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The rules that name `call`, as (action, args, includes).
    fn rules_for(call: &str) -> Vec<Value> {
        profile()["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == call))
            .cloned()
            .collect()
    }

    /// Allowed with no condition on the arguments, on every architecture.
    fn plainly_allowed(call: &str) -> bool {
        rules_for(call).iter().any(|r| {
            r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none() && r.get("includes").is_none()
        })
    }

    /// What the toolchains agentbox runs need, as seen by `strace -f -c` on the executor
    /// running a workload in the image (pytest with threads, subprocesses, asyncio and a
    /// multiprocessing pool; git init, add, commit, diff, status, stash, a second GIT_DIR;
    /// rg; bash, sh and coreutils; python's sqlite3, ssl, ctypes, socketpair), plus
    /// `exit`/`exit_group`, which strace does not count. The same workload under the profile
    /// with `SCMP_ACT_LOG` as its default logged nothing: it needs no call outside the lists.
    const NEEDED: &[&str] = &[
        "access",
        "arch_prctl",
        "brk",
        "chdir",
        "chmod",
        "clock_nanosleep",
        "clone",
        "clone3",
        "close",
        "close_range",
        "connect",
        "copy_file_range",
        "creat",
        "dup2",
        "dup3",
        "epoll_create1",
        "epoll_ctl",
        "epoll_wait",
        "execve",
        "exit",
        "exit_group",
        "faccessat2",
        "fadvise64",
        "fchdir",
        "fchmodat",
        "fcntl",
        "fstatfs",
        "ftruncate",
        "futex",
        "getcwd",
        "getdents64",
        "getegid",
        "geteuid",
        "getgid",
        "getgroups",
        "getpeername",
        "getpgrp",
        "getpid",
        "getppid",
        "getrandom",
        "getsockname",
        "gettid",
        "getuid",
        "getxattr",
        "ioctl",
        "kill",
        "lgetxattr",
        "link",
        "lseek",
        "madvise",
        "mkdir",
        "mmap",
        "mprotect",
        "munmap",
        "newfstatat",
        "openat",
        "pidfd_open",
        "pipe2",
        "poll",
        "prctl",
        "pread64",
        "prlimit64",
        "read",
        "readlink",
        "rename",
        "renameat2",
        "rmdir",
        "rseq",
        "rt_sigaction",
        "rt_sigprocmask",
        "rt_sigreturn",
        "rt_sigsuspend",
        "sched_getaffinity",
        "set_robust_list",
        "set_tid_address",
        "setpgid",
        "setsid",
        "sigaltstack",
        "socket",
        "socketpair",
        "statfs",
        "statx",
        "symlink",
        "symlinkat",
        "sysinfo",
        "timer_create",
        "timer_settime",
        "umask",
        "uname",
        "unlink",
        "unlinkat",
        "utimensat",
        "vfork",
        "wait4",
        "write",
    ];

    #[test]
    fn the_toolchains_syscalls_are_allowed() {
        // Each has its own rule, checked below or in the other tests.
        let own_rule = ["arch_prctl", "clone", "clone3", "socket", "socketpair"];
        let missing: Vec<&str> = NEEDED
            .iter()
            .copied()
            .filter(|c| !plainly_allowed(c) && !own_rule.contains(c))
            .collect();
        assert!(missing.is_empty(), "needed but not allowed: {missing:?}");
        let clone = rules_for("clone");
        assert!(clone.iter().any(|r| r["action"] == "SCMP_ACT_ALLOW"
            && r["args"][0]["index"] == 0
            && r["args"][0]["op"] == "SCMP_CMP_MASKED_EQ"
            && r["args"][0]["valueTwo"] == 0));
        assert!(rules_for("arch_prctl").iter().any(|r| {
            r["includes"]["arches"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "amd64")
        }));
    }

    #[test]
    fn vsock_is_refused_and_other_families_are_not() {
        for call in ["socket", "socketpair"] {
            // The only rule: allowed unless the family is vsock (then the default, EPERM).
            let rules = rules_for(call);
            assert_eq!(rules.len(), 1, "{call}: {rules:?}");
            assert_eq!(rules[0]["action"], "SCMP_ACT_ALLOW");
            assert_eq!(
                rules[0]["args"],
                json!([{"index": 0, "value": 40, "op": "SCMP_CMP_NE"}])
            );
        }
        assert_eq!(profile()["defaultAction"], "SCMP_ACT_ERRNO");
        assert!(
            rules_for("socketcall").is_empty(),
            "its arguments cannot be filtered: it would bypass the family rule"
        );
    }

    #[test]
    fn io_uring_is_refused_as_if_absent() {
        for call in IO_URING {
            let rules = rules_for(call);
            assert_eq!(rules.len(), 1, "{call}");
            assert_eq!(rules[0]["action"], "SCMP_ACT_ERRNO");
            assert_eq!(rules[0]["errnoRet"], libc::ENOSYS);
        }
    }

    #[test]
    fn what_the_engine_reserves_for_capabilities_stays_refused() {
        // Namespaces, mounts, modules, keyrings, BPF, perf, clocks, reboot, swap, accounting:
        // the engine allows them only with a capability agentbox never grants.
        for call in [
            "unshare",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "open_tree",
            "move_mount",
            "fsopen",
            "fsmount",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "add_key",
            "request_key",
            "keyctl",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "clock_settime",
            "settimeofday",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "syslog",
            "lookup_dcookie",
            "iopl",
            "ioperm",
            "sethostname",
            "setdomainname",
            "vhangup",
            "fanotify_init",
            "open_by_handle_at",
            "nfsservctl",
            "uselib",
            "ustat",
            "sysfs",
            "_sysctl",
            "personality",
        ] {
            assert!(!plainly_allowed(call), "{call} must not be allowed outright");
        }
        assert!(rules_for("unshare").is_empty() && rules_for("keyctl").is_empty());
        let clone3 = rules_for("clone3");
        assert_eq!(clone3.len(), 1);
        assert_eq!(
            clone3[0]["errnoRet"],
            libc::ENOSYS,
            "libc then falls back to clone"
        );
        let personas: BTreeSet<u64> = rules_for("personality")
            .iter()
            .map(|r| r["args"][0]["value"].as_u64().unwrap())
            .collect();
        assert!(!personas.contains(&0x0040000), "ADDR_NO_RANDOMIZE");
    }

    #[test]
    fn the_profile_file_is_whole_and_only_ours() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("agentbox");
        let path = write_profile_file(&dir).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), profile_json());
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // Written once: the second run finds it.
        assert_eq!(write_profile_file(&dir).unwrap(), path);
        // A profile someone changed is put back.
        std::fs::write(&path, "{}").unwrap();
        assert_eq!(
            std::fs::read_to_string(write_profile_file(&dir).unwrap()).unwrap(),
            profile_json()
        );
        // A directory others may write is refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(write_profile_file(&dir).is_err());
    }

    #[test]
    fn the_lists_are_sorted_out() {
        let all: Vec<&str> = allowed().collect();
        let unique: BTreeSet<&str> = all.iter().copied().collect();
        assert_eq!(all.len(), unique.len(), "a syscall is listed twice");
        let conditional = [
            "socket",
            "socketpair",
            "clone",
            "clone3",
            "personality",
            "socketcall",
        ];
        for name in conditional.iter().chain(IO_URING.iter()) {
            assert!(!unique.contains(name), "{name} has its own rule");
        }
        // The engine takes it as one security option; keep it small.
        assert!(profile_json().len() < 16 * 1024, "{} bytes", profile_json().len());
        assert_eq!(profile()["defaultErrnoRet"], libc::EPERM);
        assert!(security_opt().starts_with("seccomp={\""));
    }
}
