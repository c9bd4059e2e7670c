//! `agentbox doctor`: check everything a run depends on and say how to fix what is wrong.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use bollard::Docker;

use crate::cli::DoctorArgs;
use crate::config::SandboxConfig;
use crate::project::Ecosystem;
use crate::sandbox::Cleanup;
use crate::sandbox::image::{KNOWN, KnownImage, image_exists, image_labels, which};
use crate::sandbox::{DockerSandbox, ExecRequest, Sandbox, connect_docker, docker_endpoint, gc};
use crate::toolchain::{Toolchain, image_toolchains};

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Report {
    problems: usize,
}

impl Report {
    fn line(&mut self, level: Level, what: &str, detail: impl AsRef<str>, fix: Option<&str>) {
        let mark = match level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        outln!(
            "[{}] {}: {}",
            mark,
            crate::output::escaped(what),
            crate::output::escaped(detail.as_ref())
        );
        if let Some(fix) = fix {
            outln!("       fix: {}", crate::output::escaped(fix));
        }
        if level == Level::Fail {
            self.problems += 1;
        }
    }
}

pub async fn run(args: DoctorArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    cfg.cleanup = cleanup;
    let mut r = Report { problems: 0 };

    let endpoint = docker_endpoint();
    let docker = match connect_docker().await {
        Ok(d) => d,
        Err(e) => {
            r.line(
                Level::Fail,
                "docker",
                e.to_string(),
                Some(
                    "start the daemon (e.g. `sudo systemctl start docker`, or `sudo dockerd &`), \
                      or point DOCKER_HOST at one; check you may use its socket (the docker group)",
                ),
            );
            return Ok(1);
        }
    };
    let engine = match crate::sandbox::EngineInfo::detect(&docker).await {
        Ok(engine) => engine,
        Err(e) => {
            r.line(Level::Fail, "docker", format!("version query failed: {e}"), None);
            return Ok(1);
        }
    };
    check_engine(&engine, &endpoint, &cfg, &mut r);
    check_runtimes(&docker, &cfg, engine.is_podman(), &mut r).await;
    let image_ok = check_image(&docker, &cfg, &mut r).await;
    let mut detected = None;
    if let Some(project) = &args.project {
        check_project(project, &mut r);
        detected = check_detection(&docker, &cfg, project, &mut r).await;
    }
    if image_ok {
        check_policy(&docker, &cfg, engine.enforces_limits(), &mut r).await;
    }
    if args.no_network {
        r.line(Level::Ok, "registries", "not checked (--no-network)", None);
    } else if image_ok || detected.is_some() {
        // The image and ecosystems a run would set up: the project's, else the default
        // image's own toolchains.
        let (image, ecosystems) = match detected {
            Some(d) => d,
            None => {
                let labels = image_labels(&docker, &cfg.image)
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                let ecosystems = image_toolchains(&labels)
                    .into_iter()
                    .map(|(t, _)| ecosystem_of(t))
                    .collect::<Vec<_>>();
                (cfg.image.clone(), ecosystems)
            }
        };
        check_registries(&cfg, &args, image, &ecosystems, &mut r).await;
    }
    match gc::collect(&docker, false, true)
        .await
        .map(|g| g.containers_removed.len() + g.volumes_removed.len())
    {
        Ok(0) => r.line(
            Level::Ok,
            "leftovers",
            "no containers or volumes left by killed runs",
            None,
        ),
        Ok(n) => r.line(
            Level::Warn,
            "leftovers",
            format!("{n} left by agentbox processes that are gone"),
            Some("agentbox gc"),
        ),
        Err(e) => r.line(Level::Warn, "leftovers", format!("cannot list: {e}"), None),
    }

    if r.problems == 0 {
        outln!("\nall checks passed");
        Ok(0)
    } else {
        outln!("\n{} problem(s) found", r.problems);
        Ok(1)
    }
}

fn version_lt(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    v < min
}

async fn check_runtimes(docker: &Docker, cfg: &SandboxConfig, podman: bool, r: &mut Report) {
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

/// Which engine answers, how it runs, and what agentbox adapts for it; a rootless engine on
/// cgroup v1 cannot enforce the limits, which is a failure unless `--allow-weak-limits`.
fn check_engine(engine: &crate::sandbox::EngineInfo, endpoint: &str, cfg: &SandboxConfig, r: &mut Report) {
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

async fn check_image(docker: &Docker, cfg: &SandboxConfig, r: &mut Report) -> bool {
    // agentbox's images: which are here (a session picks one by project, so any may be needed).
    let mut missing = Vec::new();
    let mut present = Vec::new();
    for known in KNOWN {
        match image_labels(docker, known.tag).await {
            Ok(Some(labels)) => {
                let tools: Vec<String> = image_toolchains(&labels)
                    .into_iter()
                    .map(|(t, v)| format!("{} {v}", t.display()))
                    .collect();
                present.push(format!("{} ({})", known.tag, tools.join(", ")));
            }
            Ok(None) => missing.push(known),
            Err(e) => {
                r.line(Level::Fail, "images", e.to_string(), None);
                return false;
            }
        }
    }
    if !present.is_empty() {
        r.line(
            Level::Ok,
            "images",
            format!("present: {}", present.join("; ")),
            None,
        );
    }
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|k| k.name).collect();
        let fix = if which("mmdebstrap").is_some() {
            format!(
                "agentbox image build {0}   (needs a registry), or offline: agentbox image build {0} --offline   (just image builds them all)",
                names.join(" ")
            )
        } else {
            format!(
                "agentbox image build {0}   (needs a registry), or offline: apt-get install mmdebstrap && agentbox image build {0} --offline",
                names.join(" ")
            )
        };
        let tags: Vec<&str> = missing.iter().map(|k| k.tag).collect();
        r.line(
            Level::Warn,
            "images",
            format!(
                "missing: {} (a session whose project needs one builds it, which needs a registry)",
                tags.join(", ")
            ),
            Some(&fix),
        );
    }
    // The image this check runs (`--image`, or the default).
    if KnownImage::by_tag(&cfg.image).is_some() {
        let here = !missing.iter().any(|k| k.tag == cfg.image);
        if !here {
            r.line(
                Level::Fail,
                "image",
                format!("{}, which the policy check below runs, is missing", cfg.image),
                None,
            );
        }
        return here;
    }
    match image_exists(docker, &cfg.image).await {
        Ok(true) => {
            r.line(Level::Ok, "image", format!("{} present", cfg.image), None);
            true
        }
        Ok(false) => {
            r.line(
                Level::Fail,
                "image",
                format!("{} is missing", cfg.image),
                Some("pull or load that image (docker pull, docker load), or drop --image to use agentbox's own"),
            );
            false
        }
        Err(e) => {
            r.line(Level::Fail, "image", e.to_string(), None);
            false
        }
    }
}

/// What `run` would choose for the project: its image (and whether it is here) and its test
/// commands, with what detection left out.
/// The image a run would use and the project's ecosystems, when that image is here.
async fn check_detection(
    docker: &Docker,
    cfg: &SandboxConfig,
    project: &Path,
    r: &mut Report,
) -> Option<(String, Vec<Ecosystem>)> {
    if !project.is_dir() {
        return None;
    }
    let root = project.to_path_buf();
    let Ok(detection) = tokio::task::spawn_blocking(move || crate::project::detect(&root)).await else {
        return None;
    };
    let mut usable = None;
    let choice = crate::session::choose_image(cfg, project, &detection).await;
    for note in &choice.notes {
        r.line(Level::Warn, "project", note, None);
    }
    match image_exists(docker, &choice.image).await {
        Ok(true) => {
            r.line(
                Level::Ok,
                "project",
                format!("runs in {} ({})", choice.image, choice.reason),
                None,
            );
            usable = Some((
                choice.image.clone(),
                detection.ecosystems.iter().map(|(e, _)| *e).collect(),
            ));
        }
        _ => r.line(
            Level::Fail,
            "project",
            format!("runs in {} ({}), which is missing", choice.image, choice.reason),
            Some(if KnownImage::by_name(&choice.image).is_some() {
                "`agentbox image list` names it; `agentbox image build NAME --offline` builds it"
            } else {
                "pull or build it, or pass --image"
            }),
        ),
    }
    let commands = detection.command_lines();
    if commands.is_empty() {
        r.line(
            Level::Warn,
            "project",
            "no test command detected: agentbox cannot judge a run",
            Some("pass --test-cmd"),
        );
    } else {
        r.line(
            Level::Ok,
            "project",
            format!("tests: {} (all must pass)", commands.join("; ")),
            None,
        );
    }
    for note in &detection.notes {
        r.line(Level::Ok, "project", note, None);
    }
    usable
}

fn ecosystem_of(t: Toolchain) -> Ecosystem {
    match t {
        Toolchain::Python => Ecosystem::Python,
        Toolchain::Node => Ecosystem::Node,
        Toolchain::Rust => Ecosystem::Rust,
        Toolchain::Go => Ecosystem::Go,
    }
}

/// TLS to each registry setup would reach, verified from a sandbox of `image` through the
/// egress proxy with the trust setup passes in: a re-signing proxy the sandbox does not trust
/// is found here, before a setup fails on it.
async fn check_registries(
    cfg: &SandboxConfig,
    args: &DoctorArgs,
    image: String,
    ecosystems: &[Ecosystem],
    r: &mut Report,
) {
    let allow = match args
        .allow_host
        .iter()
        .map(|h| h.parse::<crate::egress::Rule>())
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(a) => a,
        Err(e) => {
            r.line(Level::Fail, "registries", format!("--allow-host: {e}"), None);
            return;
        }
    };
    let setup = crate::config::SetupSettings {
        allow,
        no_default_registries: args.no_default_registries,
        trust: crate::config::TrustSettings::from_args(&args.trust),
        ..Default::default()
    };
    let mut cfg = cfg.clone();
    cfg.image = image;
    let check = match crate::session::setup_phase::check_registry_tls(&cfg, &setup, ecosystems).await {
        Ok(c) => c,
        Err(e @ crate::session::setup_phase::SetupError::Remote { .. }) => {
            r.line(Level::Warn, "registries", format!("not checked: {e}"), None);
            return;
        }
        Err(e) => {
            // Not a finding about TLS: the policy check above already fails when no sandbox
            // starts.
            r.line(Level::Warn, "registries", format!("cannot check TLS: {e}"), None);
            return;
        }
    };
    for note in &check.notes {
        r.line(Level::Ok, "registries", note.trim_start_matches("setup: "), None);
    }
    if check.results.is_empty() {
        r.line(
            Level::Ok,
            "registries",
            format!(
                "none to check in {} (no default registry for its ecosystems, no --allow-host)",
                cfg.image
            ),
            None,
        );
    }
    for (host, verdict) in &check.results {
        use crate::session::setup_phase::TlsVerdict;
        match verdict {
            TlsVerdict::Verified => r.line(
                Level::Ok,
                "registries",
                format!(
                    "TLS to {host} verifies from {} (trusting the image's CAs and {})",
                    cfg.image, check.trusted
                ),
                None,
            ),
            TlsVerdict::Untrusted(why) => r.line(
                Level::Fail,
                "registries",
                format!("TLS to {host} does not verify from {}: {why}", cfg.image),
                Some(&check.hint),
            ),
            TlsVerdict::Unreachable(why) => r.line(
                Level::Warn,
                "registries",
                format!("{host} not reached from {} through the proxy: {why}", cfg.image),
                Some("setup needs it reachable: check this network's route or proxy to it"),
            ),
        }
    }
}

fn check_project(project: &Path, r: &mut Report) {
    match crate::sandbox::bind_workspace(project, &Default::default()) {
        Ok((_, uid, gid)) => {
            if uid == 0 {
                r.line(
                    Level::Warn,
                    "project",
                    format!(
                        "{} is owned by root: commands will run as uid 0 (with no capabilities)",
                        project.display()
                    ),
                    Some("chown the project to an ordinary user so the sandbox runs as that user"),
                );
            } else {
                r.line(
                    Level::Ok,
                    "project",
                    format!("{}: commands run as {uid}:{gid}", project.display()),
                    None,
                );
            }
            if let Ok(home) = std::env::var("HOME")
                && Path::new(&home).canonicalize().ok() == project.canonicalize().ok()
            {
                r.line(
                    Level::Warn,
                    "project",
                    "this is your home directory: the model could read your keys and dotfiles",
                    Some("point agentbox at a project directory, not $HOME"),
                );
            }
        }
        Err(e) => r.line(Level::Fail, "project", e.to_string(), None),
    }
}

/// Start a real sandbox on a scratch project and observe the policy from inside it.
async fn check_policy(docker: &Docker, cfg: &SandboxConfig, limits_enforced: bool, r: &mut Report) {
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
    let started = Instant::now();
    let result = async {
        // A remote engine cannot mount the scratch project: it gets a copy, as a run would.
        let _seed;
        let spec = if remote {
            let d = crate::sandbox::inspect_project(&dir)?;
            let packed = crate::hostfs::isolate::pack(&dir, d.uid, d.gid, &|_| false).map_err(|e| {
                crate::sandbox::SandboxError::Other(format!("cannot copy the scratch project: {e}"))
            })?;
            let spec = cfg.volume_spec(&dir, packed.tar.path())?;
            _seed = packed;
            spec
        } else {
            cfg.bind_spec(&dir)?
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
        Ok::<_, crate::sandbox::SandboxError>((out?, ready, mode))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let (out, ready, mode) = match result {
        Ok(v) => v,
        Err(crate::sandbox::SandboxError::RuntimeStart {
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
            return;
        }
        Err(e) => {
            r.line(
                Level::Fail,
                "sandbox",
                format!("cannot start one: {e}"),
                Some("run with -v for details"),
            );
            return;
        }
    };
    r.line(
        Level::Ok,
        "sandbox",
        format!("ready in {} ms ({mode})", ready.as_millis()),
        None,
    );
    let facts: HashMap<String, String> = out
        .stdout
        .to_text()
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let fact = |k: &str| facts.get(k).map(String::as_str).unwrap_or("?");
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
            format!("runs as {} ({})", fact("uid"), fact("uname")),
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
    check_kernel(&facts, cfg, r);
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

/// What stands between a command and the shared kernel: agentbox's seccomp profile (see
/// `sandbox::seccomp`) and the OOM score that makes commands, not the sandbox's main process,
/// the OOM killer's choice. Observed from inside, whatever the engine claims.
fn check_kernel(facts: &HashMap<String, String>, cfg: &SandboxConfig, r: &mut Report) {
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

/// Creates (and closes) an AF_VSOCK socket and an io_uring, or says why it could not: the
/// errno's name, `created`, or `unknown`. Never connects anywhere.
const KERNEL_PROBE: &str = r#"
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
