//! The policy as a sandbox sees it: a real sandbox started on a scratch project, observed from
//! inside by a probe script.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use bollard::Docker;

use super::kernel::{KERNEL_PROBE, check_kernel};
use super::{Level, Report};
use crate::config::SandboxConfig;
use crate::sandbox::{DockerSandbox, ExecMode, ExecOutput, ExecRequest, Sandbox, SandboxError};

/// Start a real sandbox on a scratch project and observe the policy from inside it.
pub(super) async fn check_policy(
    docker: &Docker,
    cfg: &SandboxConfig,
    limits_enforced: bool,
    r: &mut Report,
) {
    let dir = std::env::temp_dir().join(format!("agentbox-doctor-{}", crate::config::new_session_id()));
    if let Err(e) = std::fs::create_dir_all(dir.join(".git")) {
        r.line(
            Level::Warn,
            "policy",
            format!("cannot create a scratch project: {e}"),
            None,
        );
        return;
    }
    // The sandbox must run as whoever owns the project: here, whoever created the scratch dir.
    let expect_uid = std::fs::metadata(&dir)
        .ok()
        .map(|m| format!("{}:{}", m.uid(), m.gid()));
    let remote = crate::sandbox::engine::current().is_remote();
    let probed = probe(docker, cfg, &dir, remote).await;
    let _ = std::fs::remove_dir_all(&dir);
    let Some(facts) = check_start(probed, r) else {
        return;
    };
    check_confinement(&facts, remote, expect_uid, r);
    check_kernel(&facts, cfg, r);
    check_memory_limit(&facts, cfg, limits_enforced, r);
}

/// What the probe printed, how long the sandbox took to be ready, and how it runs commands.
struct Probed {
    out: ExecOutput,
    ready: Duration,
    mode: ExecMode,
}

/// Start a sandbox on the scratch project `dir`, run [`PROBE`] in it, and shut it down.
async fn probe(
    docker: &Docker,
    cfg: &SandboxConfig,
    dir: &Path,
    remote: bool,
) -> Result<Probed, SandboxError> {
    let started = Instant::now();
    // A remote engine cannot mount the scratch project: it gets a copy, as a run would.
    let _seed;
    let spec = if remote {
        let d = crate::sandbox::inspect_project(dir)?;
        let packed = crate::hostfs::isolate::pack(dir, d.uid, d.gid, &|_| false)?;
        let spec = cfg.volume_spec(dir, packed.tar.path())?;
        _seed = packed;
        spec
    } else {
        cfg.bind_spec(dir)?
    };
    let sandbox = DockerSandbox::create(docker, spec).await?;
    let ready = started.elapsed();
    let out = sandbox
        .exec(ExecRequest {
            env: vec![("KERNEL_PROBE".into(), KERNEL_PROBE.into())],
            ..ExecRequest::argv(["/bin/sh", "-c", PROBE], Duration::from_secs(30))
        })
        .await;
    let mode = sandbox.info().exec_mode;
    sandbox.shutdown().await?;
    Ok(Probed {
        out: out?,
        ready,
        mode,
    })
}

/// Whether a sandbox started: if so, the facts its probe printed (`key=value` lines).
fn check_start(probed: Result<Probed, SandboxError>, r: &mut Report) -> Option<HashMap<String, String>> {
    let Probed { out, ready, mode } = match probed {
        Ok(p) => p,
        Err(SandboxError::RuntimeStart {
            runtime,
            message,
            fix,
        }) => {
            r.line(
                Level::Fail,
                "sandbox",
                format!("the runtime {runtime} cannot start one: {message}"),
                Some(fix.unwrap_or(
                    "run with -v for details; check the runtime works: \
                     `docker run --rm --runtime NAME --network none IMAGE true`",
                )),
            );
            return None;
        }
        Err(e) => {
            r.line(
                Level::Fail,
                "sandbox",
                format!("cannot start one: {e}"),
                Some("run with -v for details"),
            );
            return None;
        }
    };
    r.line(
        Level::Ok,
        "sandbox",
        format!("ready in {} ms ({mode})", ready.as_millis()),
        None,
    );
    let facts = out
        .stdout
        .to_text()
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    Some(facts)
}

/// A fact the probe printed, `?` when it printed none.
fn fact_of<'a>(facts: &'a HashMap<String, String>, key: &str) -> &'a str {
    facts.get(key).map(String::as_str).unwrap_or("?")
}

/// The confinement every sandbox has: no network, no capabilities, no new privileges, a
/// read-only root and `.git`, no Docker socket, the project's owner, a writable workspace.
fn check_confinement(
    facts: &HashMap<String, String>,
    remote: bool,
    expect_uid: Option<String>,
    r: &mut Report,
) {
    let fact = |k: &str| fact_of(facts, k);
    let checks: [(&str, bool, String, &str); 8] = [
        (
            "network",
            fact("net") == "lo",
            format!("interfaces: {}", fact("net")),
            "the daemon must honour network_mode none",
        ),
        (
            "capabilities",
            fact("capeff") == "0000000000000000",
            format!("CapEff {}", fact("capeff")),
            "the daemon must honour cap_drop ALL",
        ),
        (
            "no-new-privileges",
            fact("nonewprivs") == "1",
            format!("NoNewPrivs {}", fact("nonewprivs")),
            "the daemon must honour security_opt no-new-privileges",
        ),
        (
            "root filesystem",
            fact("rootfs") == "readonly",
            fact("rootfs").to_string(),
            "the daemon must honour read-only rootfs",
        ),
        if remote {
            // A copy: what the sandbox does to its .git is never brought back (`--apply`
            // refuses anything inside a .git).
            (
                ".git",
                true,
                format!("{} inside the sandbox, a copy (remote engine)", fact("git")),
                "",
            )
        } else {
            (
                ".git",
                fact("git") == "readonly",
                format!("{} inside the sandbox", fact("git")),
                "the .git bind mount must be read-only",
            )
        },
        (
            "docker socket",
            fact("sock") == "absent",
            fact("sock").to_string(),
            "nothing may mount the Docker socket into the sandbox",
        ),
        (
            "user",
            Some(fact("uid").to_string()) == expect_uid && fact("uname") != "none",
            // Said of the scratch project, so it is not read as the user's project's (see
            // `project:`) nor as the user agentbox or the engine runs as.
            format!(
                "the sandbox's commands run as the project's owner: {} ({}) on doctor's scratch project, made by agentbox's own user ({})",
                fact("uid"),
                fact("uname"),
                expect_uid.as_deref().unwrap_or("unknown")
            ),
            "commands must run as the project's owner, who must have a name (/etc/passwd)",
        ),
        (
            "workspace",
            fact("ws") == "writable",
            format!("/workspace {}", fact("ws")),
            "check the project is writable by its owner",
        ),
    ];
    for (what, ok, detail, fix) in checks {
        if ok {
            r.line(Level::Ok, what, detail, None);
        } else {
            r.line(Level::Fail, what, detail, Some(fix));
        }
    }
}

/// The memory limit, as the sandbox's cgroup reports it.
fn check_memory_limit(
    facts: &HashMap<String, String>,
    cfg: &SandboxConfig,
    limits_enforced: bool,
    r: &mut Report,
) {
    let fact = |k: &str| fact_of(facts, k);
    let mem = fact("mem").parse::<i64>().unwrap_or(-1);
    if mem == cfg.limits.memory_bytes {
        r.line(Level::Ok, "memory limit", format!("{} MiB", mem >> 20), None);
    } else {
        r.line(
            Level::Warn,
            "memory limit",
            format!(
                "the cgroup reports {}, not {}",
                fact("mem"),
                cfg.limits.memory_bytes
            ),
            Some(if limits_enforced {
                "enable the memory cgroup controller in the kernel"
            } else {
                "expected here: this engine cannot enforce limits (see cgroups above)"
            }),
        );
    }
}

/// Prints the facts the checks read, one `key=value` a line (the kernel's from [`KERNEL_PROBE`]).
const PROBE: &str = r#"
echo "net=$(ls /sys/class/net | tr '\n' ' ' | sed 's/ *$//')"
echo "capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)"
echo "uid=$(id -u):$(id -g)"
echo "uname=$(id -un 2>/dev/null || echo none)"
if touch /.agentbox-probe 2>/dev/null; then echo rootfs=writable; else echo rootfs=readonly; fi
if touch /workspace/.git/.agentbox-probe 2>/dev/null; then echo git=writable; else echo git=readonly; fi
if [ -e /var/run/docker.sock ] || [ -e /run/docker.sock ]; then echo sock=present; else echo sock=absent; fi
if touch /workspace/.agentbox-probe 2>/dev/null; then echo ws=writable; rm -f /workspace/.agentbox-probe; else echo ws=readonly; fi
echo "mem=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
echo "seccomp=$(awk '/^Seccomp:/ {print $2}' /proc/self/status)"
echo "oomadj=$(cat /proc/self/oom_score_adj)"
failed=
check() { command -v "$1" >/dev/null 2>&1 || return 0; "$@" >/dev/null 2>&1 || failed="$failed $1"; }
check python3 -c 'import threading; t = threading.Thread(target=int); t.start(); t.join()'
check git --version
check rg --version
check sh -c true
echo "toolsfailed=$failed"
if command -v python3 >/dev/null 2>&1; then python3 -c "$KERNEL_PROBE"; fi
"#;
