//! The engine: which answers, how it runs, its runtimes.

use bollard::Docker;

use super::{Level, Report};
use crate::config::SandboxConfig;

/// Which engine answers, how it runs, and what agentbox adapts for it; a rootless engine on
/// cgroup v1 cannot enforce the limits, which is a failure unless `--allow-weak-limits`.
pub(super) fn check_engine(
    engine: &crate::sandbox::EngineInfo,
    endpoint: &str,
    cfg: &SandboxConfig,
    r: &mut Report,
) {
    let api = &engine.api_version;
    r.line(
        Level::Ok,
        "engine",
        format!(
            "{} {} at {endpoint}, API {api}, {}",
            engine.kind,
            engine.version,
            if engine.rootless { "rootless" } else { "rootful" }
        ),
        None,
    );
    if version_lt(api, (1, 41)) {
        r.line(
            Level::Warn,
            "docker API",
            format!("{api} is older than 1.41, the oldest tested"),
            Some("upgrade the engine"),
        );
    }
    for adaptation in engine.adaptations() {
        r.line(Level::Ok, "adapted", adaptation, None);
    }
    let cgroups = engine.cgroup_version.as_deref().unwrap_or("?");
    if engine.enforces_limits() {
        r.line(
            Level::Ok,
            "cgroups",
            format!("v{cgroups} (memory, pids and CPU limits apply)"),
            None,
        );
    } else {
        let level = if cfg.allow_weak_limits {
            Level::Warn
        } else {
            Level::Fail
        };
        r.line(
            level,
            "cgroups",
            format!(
                "v{cgroups}, rootless: the engine cannot enforce memory, pids or CPU limits; agentbox {}",
                if cfg.allow_weak_limits {
                    "runs anyway (--allow-weak-limits) and warns on every run"
                } else {
                    "refuses to start a sandbox"
                }
            ),
            Some(
                "use a rootful engine or a machine with cgroup v2, or accept the weaker sandbox with \
                 --allow-weak-limits",
            ),
        );
    }
}

pub(super) async fn check_runtimes(docker: &Docker, cfg: &SandboxConfig, podman: bool, r: &mut Report) {
    let Ok(info) = docker.info().await else {
        r.line(Level::Warn, "runtimes", "cannot query the daemon's info", None);
        return;
    };
    let mut names: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    names.sort();
    let default = info.default_runtime.unwrap_or_else(|| "runc".into());
    // Podman lists every runtime its containers.conf names, installed or not.
    let gvisor = if podman {
        "; Podman lists the runtimes it is configured for, installed or not"
    } else if names.iter().any(|n| n == "runsc") {
        "; gVisor available: --runtime runsc"
    } else {
        ""
    };
    r.line(
        Level::Ok,
        "runtimes",
        format!("{} (default {default}){gvisor}", names.join(", ")),
        None,
    );
    if let Some(wanted) = &cfg.runtime
        && !names.contains(wanted)
    {
        r.line(
            Level::Fail,
            "runtime",
            format!("--runtime {wanted} is not configured in the daemon"),
            Some(if crate::sandbox::is_gvisor(wanted) {
                crate::sandbox::RUNSC_FIX
            } else {
                "install it and merge it into \"runtimes\" in /etc/docker/daemon.json, then reload \
                 the daemon: sudo kill -HUP $(cat /var/run/docker.pid)"
            }),
        );
    }
}

fn version_lt(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    v < min
}
