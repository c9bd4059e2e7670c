//! The containment policy, as one pure function from a spec to Docker's create request.
//!
//! Everything the security model (docs/src/security/index.md) promises is set here, so a unit
//! test can read the request and an integration test can observe the result from inside the
//! container.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountType, MountVolumeOptions, ResourcesUlimits,
};

pub use agentbox_hostfs::hostscan::git::{GitPiece, LinkedGit, LinkedGitKind};

use super::flavor::EngineInfo;
use super::{HOST_LABEL, PID_LABEL, SESSION_LABEL, WORKSPACE};

/// The sandbox user's home: a tmpfs, so nothing a command leaves there outlives the run.
pub const HOME: &str = "/home/agentbox";
/// Where toolchain caches and build output go (`CARGO_HOME`, `CARGO_TARGET_DIR`, `GOCACHE`,
/// `GOPATH`, npm's and pip's caches, `XDG_CACHE_HOME`): a Docker volume of the session's own,
/// on the daemon's disk. Not HOME: a tmpfs, charged to the memory limit, where one cold `cargo
/// test` or `go test` (the Go standard library is compiled into GOCACHE on first use) would take
/// tens of MiB. Not the project: build output there is the user's to clean up, and slows
/// every check agentbox makes of the project after a run. The volume is anonymous and labelled
/// with the session; the daemon removes it with the container (auto-remove, and agentbox's own
/// forced removals, remove a container's anonymous volumes). `/var/tmp` is mode 1777 in Debian
/// based images, and Docker gives a fresh volume the mode of the directory it is mounted on,
/// so the sandbox user can write there in any image without a chown. Each variable names its own
/// directory, which a later, longer-lived cache volume can be mounted on.
pub const CACHE_DIR: &str = "/var/tmp";

/// Harness-private scratch (e.g. the baseline snapshot for the diff), apart from `/tmp` so a
/// command that fills `/tmp` cannot break the harness.
pub const HARNESS_DIR: &str = "/run/agentbox";

/// The sandbox's `PATH` (the setup phase puts its virtualenv in front).
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the egress proxy's socket is mounted (read-only) in a sandbox that may use it.
pub const EGRESS_SOCKET: &str = "/run/agentbox-egress.sock";
/// The sandbox's own loopback port on which the executor forwards to [`EGRESS_SOCKET`].
pub const EGRESS_PORT: u16 = 3128;
/// Where a CA bundle the host made for a sandbox that may use the network is mounted
/// (read-only): certificates only, which the sandbox's tools are told to trust.
pub const CA_BUNDLE: &str = "/run/agentbox-ca.pem";

/// One way between the sandbox's loopback and a service on the host, through a Unix socket the
/// host listens on, bind-mounted read-only at [`Forward::target`]. The executor (the sandbox's
/// command runner) does the sandbox's side of every forward; the container keeps
/// `network_mode: none`. The host only ever listens on its socket, in a directory of its own:
/// it never connects to a path or an address the sandbox could name or replace.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// Names the mount (`/run/agentbox-NAME.sock`): a word of the code's (and a port number),
    /// never text of the sandbox's or the user's.
    pub name: String,
    /// The host's socket.
    pub socket: PathBuf,
    pub direction: Direction,
    /// What it is for, in the words of a message that refuses it (a remote engine).
    pub purpose: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The sandbox's connections to its own `127.0.0.1:PORT` go to the host's socket, one
    /// connection there for each (the egress proxy, a model gateway).
    Outbound { port: u16 },
    /// A published port: the host's connections to it are joined to new connections to the
    /// sandbox's own `127.0.0.1:PORT`. The host still only listens: the executor keeps
    /// connections open to the host's socket and, told on one that a client came, connects to
    /// the port (see `sandbox::publish`).
    Inbound { port: u16 },
}

impl Forward {
    /// The egress proxy's socket, forwarded from the sandbox's `127.0.0.1:`[`EGRESS_PORT`].
    pub fn egress(socket: PathBuf) -> Forward {
        Forward {
            name: "egress".into(),
            socket,
            direction: Direction::Outbound { port: EGRESS_PORT },
            purpose: "the egress proxy (the setup phase's network, --agent-network allowlist)",
        }
    }

    /// Where the socket is mounted inside the sandbox.
    pub fn target(&self) -> String {
        format!("/run/agentbox-{}.sock", self.name)
    }

    /// This forward as the executor reads it from `AGENTBOX_FORWARD` (`out:PORT:PATH` or
    /// `in:PORT:PATH`, comma-separated).
    fn spec(&self) -> String {
        match self.direction {
            Direction::Outbound { port } => format!("out:{port}:{}", self.target()),
            Direction::Inbound { port } => format!("in:{port}:{}", self.target()),
        }
    }
}

/// What a sandbox has beyond the fixed policy: forwards to host services (the egress proxy of
/// the setup phase or `--agent-network allowlist`, published ports), dependency cache volumes,
/// and environment for them. The policy itself (network none, capabilities, limits) is the
/// same with or without them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extras {
    /// Host sockets mounted read-only, each with the executor forwarding to or from it.
    pub forwards: Vec<Forward>,
    /// Named volumes (dependency caches), mounted at their targets.
    pub volumes: Vec<VolumeMount>,
    /// Variables set after the fixed list, replacing any of the same name.
    pub env: Vec<(String, String)>,
    /// Mount a bind-mounted project read-only (the setup phase of an `--isolate` run, which
    /// promises not to write the project).
    pub workspace_read_only: bool,
    /// A host file of CA certificates, mounted read-only at [`CA_BUNDLE`].
    pub ca_bundle: Option<PathBuf>,
    /// A read-only directory (setup's build cache) whose entries are copied into [`CACHE_DIR`]
    /// when the sandbox starts and again before the verdict (see `DockerSandbox::fresh_scratch`):
    /// each session builds on a copy, so nothing it builds outlives it.
    pub seed: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VolumeMount {
    pub name: String,
    pub target: String,
    pub read_only: bool,
}

/// Resource limits. Memory, CPUs, pids, `/tmp` and the largest file have flags; the other
/// in-memory filesystems are sized from the memory limit (see [`MemoryBudget`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub memory_bytes: i64,
    pub cpus: f64,
    pub pids: i64,
    /// `/tmp`, and the harness's own scratch space ([`HARNESS_DIR`]) as much again.
    pub tmp_bytes: i64,
    /// `HOME`.
    pub home_bytes: i64,
    /// `/dev/shm`.
    pub shm_bytes: i64,
    /// RLIMIT_FSIZE: the largest file any command may write, in the project too, where Docker
    /// has no quota for a bind mount.
    pub max_file_bytes: i64,
}

impl Default for Limits {
    fn default() -> Self {
        let budget = MemoryBudget::new(2 << 30);
        Limits {
            memory_bytes: budget.memory,
            cpus: 2.0,
            pids: 512,
            tmp_bytes: budget.auto_tmp(),
            home_bytes: budget.home,
            shm_bytes: budget.shm,
            max_file_bytes: 1 << 30,
        }
    }
}

/// How a memory limit is shared between files held in memory and processes.
///
/// Files in a tmpfs are charged to the container's memory cgroup but belong to no process, and
/// a full tmpfs cannot be reclaimed (there is no swap). If the tmpfs mounts could hold all of
/// `--memory`, filling them would leave the executor, the container's main process, without
/// memory: the kernel's OOM killer would take it, whatever its score, and the session would
/// end. So their sizes together stay below the limit, and a reserve is kept for processes:
/// a quarter of the limit, at least [`MIN_RESERVE`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryBudget {
    pub memory: i64,
    /// Kept for processes, whatever the tmpfs mounts hold.
    pub reserve: i64,
    pub home: i64,
    pub shm: i64,
}

/// The least memory kept for processes: the executor (~15 MiB), the harness's git, a shell.
pub(crate) const MIN_RESERVE: i64 = 64 << 20;
/// The smallest `--memory` that leaves room for anything besides the reserve.
pub const MIN_MEMORY: i64 = 128 << 20;
/// `/tmp` when `--tmp-size` is `auto` and the memory limit allows it.
pub(crate) const DEFAULT_TMP: i64 = 512 << 20;

const MIB: i64 = 1 << 20;

impl MemoryBudget {
    pub fn new(memory: i64) -> Self {
        let reserve = (memory / 4).max(MIN_RESERVE);
        // HOME and /dev/shm rarely hold much: 64 MiB each, less under a small limit.
        let small = ((memory - reserve) / 8 / MIB * MIB).clamp(MIB, 64 * MIB);
        MemoryBudget {
            memory,
            reserve,
            home: small,
            shm: small,
        }
    }

    /// What `/tmp` and the harness's scratch space share.
    fn for_tmp(&self) -> i64 {
        self.memory - self.reserve - self.home - self.shm
    }

    /// The largest `/tmp` that fits, in whole MiB.
    pub fn largest_tmp(&self) -> i64 {
        (self.for_tmp() / 2 / MIB * MIB).max(MIB)
    }

    /// `/tmp` when `--tmp-size` is `auto`: [`DEFAULT_TMP`], or less to fit.
    pub fn auto_tmp(&self) -> i64 {
        self.largest_tmp().min(DEFAULT_TMP)
    }

    /// Whether a `/tmp` of `tmp` bytes (and as much for the harness) fits.
    pub fn fits(&self, tmp: i64) -> bool {
        tmp.checked_mul(2).is_some_and(|both| both <= self.for_tmp())
    }

    /// The smallest memory limit under which a `/tmp` of `tmp` bytes fits, in whole MiB (and at
    /// least [`MIN_MEMORY`]).
    pub fn memory_for(tmp: i64) -> i64 {
        if tmp > i64::MAX / 8 {
            return i64::MAX;
        }
        let fits = |mib: i64| MemoryBudget::new(mib * MIB).fits(tmp);
        // An upper bound: the reserve is a quarter (above 256 MiB) or 64 MiB, HOME and /dev/shm
        // 64 MiB or less; then a little rounding.
        let mut high = (2 * tmp + 192 * MIB).max((2 * tmp + 128 * MIB) / 3 * 4) / MIB + 16;
        if !fits(high) {
            return high * MIB;
        }
        // Binary search: `low` never fits (below the minimum counts as not fitting).
        let mut low = MIN_MEMORY / MIB - 1;
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if fits(mid) {
                high = mid;
            } else {
                low = mid;
            }
        }
        high * MIB
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {0:?}: use a number with an optional unit, e.g. 512m, 2g, 100k")]
pub struct ParseSizeError(pub String);

/// "512m", "2g", "100k", "1048576" → bytes (binary units, like Docker's flags).
pub fn parse_size(text: &str) -> Result<i64, ParseSizeError> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (digits, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        Some('t') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let value: f64 = digits
        .trim()
        .parse()
        .map_err(|_| ParseSizeError(text.to_string()))?;
    let bytes = value * (1u64 << shift) as f64;
    // Below one byte rounds to 0, which Docker reads as "no limit".
    if !bytes.is_finite() || bytes < 1.0 || bytes > i64::MAX as f64 {
        return Err(ParseSizeError(text.to_string()));
    }
    Ok(bytes as i64)
}

/// What runs as the container's main process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MainProcess {
    /// The executor, as PID 1 and as the sandbox user: commands are spawned by it, it reaps
    /// orphans, and no signal from inside the sandbox can end it.
    Executor,
    /// A keep-alive under docker-init, as another uid (so the sandbox user's `kill -9 -1`
    /// cannot end it); every command is a Docker exec. For images without python3.
    KeepAlive,
    /// One command and nothing else (`exec`'s fast path): a small static supervisor as PID 1
    /// and as the sandbox user, as the executor is, which starts the command at once and ends
    /// with it (`oneshot.c`, mounted at [`ONE_SHOT_INIT`]). The caller mounts it and appends
    /// the command to the body's `cmd`.
    OneShot,
}

/// Runs the executor when the image has python3; otherwise says so and exits, and agentbox
/// starts the sandbox again in keep-alive mode.
const BOOT: &str = "command -v python3 >/dev/null 2>&1 || { echo agentbox-no-python; exit 3; }; \
                    exec python3 -I -S -c \"$1\"";

/// Where a one-shot sandbox's supervisor is mounted (read-only, from the host).
pub(crate) const ONE_SHOT_INIT: &str = "/run/agentbox-init";

/// No setuid gains, and agentbox's seccomp profile (the engine's default without vsock and
/// io_uring; see `seccomp.rs`) instead of the engine's own.
fn security_opts() -> Vec<String> {
    vec!["no-new-privileges".into(), super::seccomp::security_opt()]
}

/// Processes and memory of a helper container (a volume's seeder, the `/etc` reader, an
/// image's toolchain probe): each runs one small program (`chown`, nothing, `--version`s), so a
/// bound far below a sandbox's costs nothing and keeps an image's odd entrypoint or a
/// misbehaving tool from taking the machine.
pub(crate) const HELPER_PIDS: i64 = 64;
pub(crate) const HELPER_MEMORY: i64 = 256 << 20;
/// Processes of one service: a database's workers and connections.
pub(crate) const SERVICE_PIDS: i64 = 256;
/// Label naming the service a container runs (beside the session's).
pub(crate) const SERVICE_LABEL: &str = "agentbox.service";

/// What a helper container is: its image, user, command and labels; the rest is
/// [`locked_down`]'s.
pub(crate) struct Helper<'a> {
    pub image: &'a str,
    pub user: &'a str,
    pub cmd: Vec<String>,
    pub labels: HashMap<String, String>,
    pub engine: &'a EngineInfo,
    pub runtime: Option<String>,
    pub max_file_bytes: i64,
}

/// The lockdown every helper container starts from, as the sandbox's own does (see
/// `SandboxSpec::create_body`): no network, no capability, no new privileges, agentbox's
/// seccomp profile, a read-only root, the ulimits, no log, the chosen runtime, and bounded
/// processes and memory ([`HELPER_PIDS`], [`HELPER_MEMORY`]). A caller adds only what its job
/// needs (a capability, a mount, a writable scratch), so a limit it lacks is a decision here,
/// not an omission there.
pub(crate) fn locked_down(h: Helper<'_>) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(h.image.to_string()),
        cmd: Some(h.cmd),
        entrypoint: Some(vec![]),
        user: Some(h.user.to_string()),
        labels: Some(h.labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(security_opts()),
            readonly_rootfs: Some(true),
            pids_limit: Some(HELPER_PIDS),
            memory: Some(HELPER_MEMORY),
            memory_swap: Some(HELPER_MEMORY),
            ulimits: Some(ulimits(h.engine, h.max_file_bytes)),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            runtime: h.runtime,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Open files per process.
const NOFILE: i64 = 4096;

/// Resource limits of every process: open files, processes of the uid, file size, no core dumps.
/// Podman needs them explicit (its defaults exceed what it may set; see `engine`), and they are
/// good hardening on any engine.
fn ulimits(engine: &EngineInfo, max_file_bytes: i64) -> Vec<ResourcesUlimits> {
    let ulimit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.to_string()),
        soft: Some(value),
        hard: Some(value),
    };
    vec![
        ulimit("nofile", NOFILE),
        // Counted per uid across the host, so generous; the pids limit is the real cap.
        ulimit("nproc", engine.nproc_limit()),
        ulimit("fsize", max_file_bytes),
        ulimit("core", 0),
    ]
}

/// Where the repository of a project that is a linked worktree (or a submodule's checkout)
/// appears inside the sandbox, read-only: the pieces git reads to look (status, diff, log),
/// and a config agentbox writes. The project's `.git` file names a host path; rather than
/// mounting the pieces at that path (which may be anywhere: under `/tmp` or `HOME`, tmpfs mounts
/// of the sandbox's own, or shadowing the image's files), the sandbox sees a `.git` file of
/// agentbox's (`gitdir:` naming this directory) mounted read-only over the project's own, which
/// stays untouched on the host. No `GIT_DIR` in the environment: it would hold for every
/// repository the sandbox's commands make or open (a test suite's temporary ones).
pub const GIT_ROOT: &str = "/run/agentbox-git";

/// What agentbox writes for a linked worktree next to the sandbox's `/etc` files (see
/// `identity::etc_files`), all the sandbox user's: the `.git` file; an empty file; and the
/// directory seen as [`GIT_ROOT`], holding the config and an empty mount point for each piece.
/// git refuses a git directory that is not the user's own ("dubious ownership"), so
/// [`GIT_ROOT`] cannot be a directory Docker makes (root's).
pub(crate) const LINKED_GIT_FILE: &str = "git-file";
pub(crate) const LINKED_GIT_EMPTY: &str = "git-empty";
pub(crate) const LINKED_GIT_ROOT: &str = "git-root";

/// Where a piece of a linked worktree's repository is mounted inside.
pub(crate) fn git_target(piece: GitPiece) -> String {
    format!("{GIT_ROOT}/{}", piece.rel())
}

/// The `.git` file seen at `/workspace/.git`.
pub fn dot_git(linked: &LinkedGit) -> String {
    match linked.kind {
        LinkedGitKind::Worktree => format!("gitdir: {GIT_ROOT}/{}\n", GitPiece::Worktree.rel()),
        LinkedGitKind::Submodule => format!("gitdir: {GIT_ROOT}\n"),
    }
}

/// How the project reaches `/workspace`.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkspaceSource {
    /// The host directory itself, read-write, with its `.git` read-only on top.
    Bind {
        project: PathBuf,
        /// Paths (relative) mounted read-only on top: every git directory or `.git` file, and
        /// what their configs name (a hooks path, an fsmonitor script...).
        protected: Vec<PathBuf>,
        /// What the host recorded before the session, to check the project against after it.
        baseline: std::sync::Arc<agentbox_hostfs::hostscan::Baseline>,
        /// The project is a linked worktree (or a submodule's checkout) whose repository is
        /// outside it: what of that repository is mounted, read-only.
        linked_git: Option<LinkedGit>,
        /// What the user must hear about this mount (git will not work inside, and why).
        warnings: Vec<String>,
    },
    /// A labelled Docker volume the project is copied into (`--isolate`): `seed` is a tar of
    /// the project, extracted into the volume before the sandbox starts.
    Volume { name: String, seed: PathBuf },
    /// A named environment's volume (`agentbox run --env NAME`): like `Volume`, but it outlives
    /// the process. It carries [`ENV_LABEL`] (the name) and the host, not the per-process
    /// labels the Ctrl-C sweep and plain `gc` match; nothing registers it with `Cleanup` once
    /// seeded, and the sandbox's shutdown leaves it. `seed`: a new environment's copy of the
    /// project; `None` resumes an existing volume as it is.
    Env {
        name: String,
        env: String,
        seed: Option<PathBuf>,
    },
}

/// The label of a named environment's volume; its value is the environment's name.
pub const ENV_LABEL: &str = "agentbox.env";

/// Everything needed to create one sandbox container.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub session: String,
    pub image: String,
    pub workspace: WorkspaceSource,
    pub uid: u32,
    pub gid: u32,
    pub limits: Limits,
    /// A Docker runtime such as gVisor's `runsc`; `None` is the daemon's default.
    pub runtime: Option<String>,
    /// Use one Docker exec per command even when the image could host the executor.
    pub per_call_exec: bool,
    /// Extra labels (e.g. an eval task's name).
    pub labels: Vec<(String, String)>,
    /// Start even where the engine cannot enforce the memory, pids and CPU limits (a rootless
    /// engine on cgroup v1), with a warning; refused otherwise.
    pub allow_weak_limits: bool,
    /// Mount a bind-mounted project read-only (`shell --read-only`: look without risk).
    pub read_only: bool,
    /// Who removes what this sandbox creates if the run is cut short.
    pub cleanup: super::cleanup::Cleanup,
    /// The egress socket, cache volumes and their environment, if any.
    pub extras: Extras,
    /// Servers started beside it, in its network namespace (see `services`).
    pub services: Vec<super::services::ServiceSpec>,
}

impl SandboxSpec {
    /// The uid the keep-alive process runs as: not the sandbox user's, so the sandbox user's
    /// `kill -9 -1` (ours after every command, or the model's) cannot end the container.
    pub(crate) fn keepalive_uid(&self) -> u32 {
        if self.uid == 65534 { 65533 } else { 65534 }
    }

    pub fn user(&self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }

    /// The environment every command sees. Nothing comes from the host: no credentials, no
    /// proxies, no `DOCKER_HOST`.
    pub fn env(&self) -> Vec<String> {
        let mut env = self.fixed_env();
        if matches!(
            &self.workspace,
            WorkspaceSource::Bind {
                linked_git: Some(_),
                ..
            }
        ) {
            // Its repository is read-only: git need not try to refresh the index on `status`.
            env.push("GIT_OPTIONAL_LOCKS=0".into());
        }
        // A service's connection settings; where two set one variable (two databases and
        // `DATABASE_URL`), the first named wins.
        let mut extra: Vec<(String, String)> = Vec::new();
        for (k, v) in self.services.iter().flat_map(|s| s.sandbox_env.iter()) {
            if !extra.iter().any(|(e, _)| e == k) {
                extra.push((k.clone(), v.clone()));
            }
        }
        extra.extend(self.extras.env.iter().cloned());
        let forwards: Vec<String> = self.extras.forwards.iter().map(Forward::spec).collect();
        if !forwards.is_empty() {
            // The executor reads this to start forwarding; commands see it too, which tells
            // them nothing they could not find out.
            extra.push(("AGENTBOX_FORWARD".into(), forwards.join(",")));
        }
        for (k, v) in extra {
            let prefix = format!("{k}=");
            env.retain(|e| !e.starts_with(&prefix));
            env.push(format!("{k}={v}"));
        }
        env
    }

    fn fixed_env(&self) -> Vec<String> {
        [
            format!("PATH={BASE_PATH}"),
            // The executor sets these limits itself as well (see `lower_rlimits` in
            // executor.py): not every engine applies the container's ulimits.
            format!(
                "AGENTBOX_RLIMITS=fsize:{},nofile:{NOFILE},core:0",
                self.limits.max_file_bytes
            ),
            format!("HOME={HOME}"),
            "LANG=C.UTF-8".into(),
            "TERM=dumb".into(),
            "NO_COLOR=1".into(),
            "PAGER=cat".into(),
            "GIT_PAGER=cat".into(),
            // Keep the user's project free of __pycache__ litter from test runs.
            "PYTHONDONTWRITEBYTECODE=1".into(),
            "PIP_NO_INPUT=1".into(),
            "PIP_DISABLE_PIP_VERSION_CHECK=1".into(),
            format!("PIP_CACHE_DIR={CACHE_DIR}/pip"),
            format!("XDG_CACHE_HOME={CACHE_DIR}/cache"),
            // Toolchains: caches on the session's volume (see CACHE_DIR), and no attempt to
            // reach the network, which the sandbox does not have: an offline build fails at
            // once with the tool's own message instead of after its retries.
            format!("CARGO_HOME={CACHE_DIR}/cargo"),
            format!("CARGO_TARGET_DIR={CACHE_DIR}/cargo-target"),
            "CARGO_NET_OFFLINE=true".into(),
            format!("GOPATH={CACHE_DIR}/go"),
            format!("GOCACHE={CACHE_DIR}/go-build"),
            "GOPROXY=off".into(),
            // The image's Go, never a download of the version go.mod names.
            "GOTOOLCHAIN=local".into(),
            format!("npm_config_cache={CACHE_DIR}/npm"),
            "npm_config_offline=true".into(),
            "npm_config_update_notifier=false".into(),
            "npm_config_audit=false".into(),
            "npm_config_fund=false".into(),
        ]
        .into()
    }

    pub fn labels(&self) -> HashMap<String, String> {
        let mut labels: HashMap<String, String> = HashMap::from([
            (SESSION_LABEL.to_string(), self.session.clone()),
            (PID_LABEL.to_string(), std::process::id().to_string()),
            (HOST_LABEL.to_string(), super::gc::hostname()),
        ]);
        labels.extend(self.labels.iter().cloned());
        labels
    }

    /// A service's container (see `services`): the helpers' lockdown (no capability, no new
    /// privileges, agentbox's seccomp profile, a read-only root, the ulimits), never root, in the
    /// sandbox's network namespace (`sandbox_id`), with its data and sockets on tmpfs mounts
    /// counted against its own memory limit. Its log is kept (bounded) to say why it stopped.
    pub(crate) fn service_body(
        &self,
        service: &super::services::ServiceSpec,
        (user, volumes): (&str, &[String]),
        sandbox_id: &str,
        engine: &EngineInfo,
    ) -> ContainerCreateBody {
        let mut labels = self.labels();
        labels.insert(SERVICE_LABEL.to_string(), service.name.clone());
        let mut body = locked_down(Helper {
            image: &service.image,
            user,
            cmd: service.command.clone().unwrap_or_default(),
            labels,
            engine,
            runtime: self.runtime.clone(),
            max_file_bytes: self.limits.max_file_bytes,
        });
        if service.command.is_none() {
            // The image's own entrypoint and command.
            body.cmd = None;
            body.entrypoint = None;
        }
        // The namespace is the sandbox's, which has only `lo`.
        body.network_disabled = None;
        body.env = Some(service.env.iter().map(|(k, v)| format!("{k}={v}")).collect());
        if let Some(hc) = body.host_config.as_mut() {
            hc.network_mode = Some(format!("container:{sandbox_id}"));
            hc.memory = Some(service.memory_bytes);
            hc.memory_swap = Some(service.memory_bytes);
            hc.pids_limit = Some(SERVICE_PIDS);
            hc.nano_cpus = Some((self.limits.cpus * 1e9) as i64);
            // A quarter of the memory for the data, the rest for the server: both count
            // against the one limit, so a test that fills the data ends in ENOSPC, not OOM.
            let tmpfs = |size: i64| format!("rw,nosuid,nodev,size={size},mode=1777");
            let data = tmpfs(service.memory_bytes / 4);
            // The image's own volumes too (another image's data directory): an anonymous
            // volume would be on the host's disk, outside the memory limit.
            let mut mounts: HashMap<String, String> =
                volumes.iter().map(|v| (v.clone(), data.clone())).collect();
            mounts.insert(super::image::SERVICE_DATA_DIR.to_string(), data);
            mounts.insert("/tmp".to_string(), tmpfs(64 << 20));
            mounts.insert("/run".to_string(), tmpfs(16 << 20));
            hc.tmpfs = Some(mounts);
            hc.log_config = Some(HostConfigLogConfig {
                typ: Some("json-file".into()),
                config: Some(HashMap::from([
                    ("max-size".to_string(), "1m".to_string()),
                    ("max-file".to_string(), "1".to_string()),
                ])),
            });
        }
        body
    }

    /// A short-lived root container with only CAP_CHOWN that gives the fresh volume's root to
    /// the sandbox user (the archive API cannot). It runs no project code: only `chown`.
    pub(crate) fn seeder_body(&self, volume: &str, engine: &EngineInfo) -> ContainerCreateBody {
        let mut body = locked_down(Helper {
            image: &self.image,
            user: "0:0",
            cmd: vec!["chown".into(), self.user(), WORKSPACE.into()],
            labels: self.labels(),
            engine,
            runtime: self.runtime.clone(),
            max_file_bytes: self.limits.max_file_bytes,
        });
        if let Some(hc) = body.host_config.as_mut() {
            hc.cap_add = Some(vec!["CHOWN".into()]);
            hc.mounts = Some(vec![Mount {
                target: Some(WORKSPACE.to_string()),
                source: Some(volume.to_string()),
                typ: Some(MountType::VOLUME),
                ..Default::default()
            }]);
            // The same mapping as the sandbox's, so the owner it gives is the sandbox user.
            hc.userns_mode = engine.userns_mode().map(String::from);
        }
        body
    }

    /// A container that is created and never started: the image's `/etc/passwd` and
    /// `/etc/group` are read out of it through the archive API (see `identity`).
    pub(crate) fn reader_body(&self, engine: &EngineInfo) -> ContainerCreateBody {
        locked_down(Helper {
            image: &self.image,
            user: "65534:65534",
            cmd: vec!["true".into()],
            labels: self.labels(),
            engine,
            runtime: self.runtime.clone(),
            max_file_bytes: self.limits.max_file_bytes,
        })
    }

    /// A container that is created and never started: the sandbox user's `/etc` files are
    /// uploaded into it and it is committed as an image (see `identity::image_with_user`). Its
    /// root is writable, which is harmless: it never runs.
    pub(crate) fn identity_body(&self, engine: &EngineInfo) -> ContainerCreateBody {
        let mut body = self.reader_body(engine);
        if let Some(hc) = body.host_config.as_mut() {
            hc.readonly_rootfs = Some(false);
        }
        body
    }

    pub(crate) fn container_name(&self) -> String {
        format!("agentbox-{}", self.session)
    }

    /// The sandbox container on `engine`. `etc`: a host directory holding the `passwd` and
    /// `group` files mounted read-only over the image's (see `identity`).
    pub(crate) fn create_body(
        &self,
        main: MainProcess,
        etc: Option<&std::path::Path>,
        engine: &EngineInfo,
    ) -> ContainerCreateBody {
        let labels = self.labels();

        // HOME and the harness's scratch belong to the sandbox user, mode 0700. Podman's `U`
        // gives a mount to the container's user, which in keep-alive mode is the keep-alive's
        // uid, not the sandbox user's: there (Podman, images without python3 only) the two are
        // mode 1777 instead, like /tmp; the keep-alive runs nothing but `read`.
        let owned = !(engine.is_podman() && main == MainProcess::KeepAlive);
        let tmpfs_opts = |size: i64, owner: bool| {
            let mode = if owner && owned { "0700" } else { "1777" };
            let mut o = format!("rw,nosuid,nodev,exec,size={size},mode={mode}");
            if owner && owned {
                o.push(',');
                o.push_str(&engine.tmpfs_owner(self.uid, self.gid));
            }
            o
        };
        let tmpfs = HashMap::from([
            ("/tmp".to_string(), tmpfs_opts(self.limits.tmp_bytes, false)),
            (HOME.to_string(), tmpfs_opts(self.limits.home_bytes, true)),
            (HARNESS_DIR.to_string(), tmpfs_opts(self.limits.tmp_bytes, true)),
        ]);

        let mounts = match &self.workspace {
            WorkspaceSource::Bind {
                project,
                protected,
                linked_git,
                ..
            } => {
                let bind = |source: &PathBuf, target: String, read_only: bool| Mount {
                    target: Some(target),
                    source: Some(source.to_string_lossy().into_owned()),
                    typ: Some(MountType::BIND),
                    read_only: Some(read_only),
                    bind_options: Some(MountBindOptions {
                        // Host mounts made later under the project must not appear inside.
                        propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let mut m = vec![bind(
                    project,
                    WORKSPACE.to_string(),
                    self.read_only || self.extras.workspace_read_only,
                )];
                // With the files agentbox writes for it: none on a remote engine, which refuses
                // a bind-mounted project anyway.
                let linked = linked_git.as_ref().zip(etc);
                // Docker mounts parents first, so these land on top of the workspace bind.
                for rel in protected {
                    if linked.is_some() && rel.as_path() == std::path::Path::new(".git") {
                        // Covered by agentbox's own `.git` file below.
                        continue;
                    }
                    m.push(bind(
                        &project.join(rel),
                        format!("{WORKSPACE}/{}", rel.display()),
                        true,
                    ));
                }
                if let Some((linked, etc)) = linked {
                    m.push(bind(
                        &etc.join(LINKED_GIT_FILE),
                        format!("{WORKSPACE}/.git"),
                        true,
                    ));
                    m.push(bind(&etc.join(LINKED_GIT_ROOT), GIT_ROOT.to_string(), true));
                    for (piece, source) in &linked.pieces {
                        let source = match piece {
                            GitPiece::WorktreeConfig => etc.join(LINKED_GIT_EMPTY),
                            _ => source.clone(),
                        };
                        m.push(bind(&source, git_target(*piece), true));
                    }
                }
                m
            }
            WorkspaceSource::Volume { name, .. } | WorkspaceSource::Env { name, .. } => vec![Mount {
                target: Some(WORKSPACE.to_string()),
                source: Some(name.clone()),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                // An empty volume (a pooled sandbox's, the project copied in later) would get
                // the image's `/workspace` copied over it at the mount, owner and all: root's,
                // where the seeder gave it to the sandbox user.
                volume_options: Some(MountVolumeOptions {
                    no_copy: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        let mut mounts = mounts;
        for v in &self.extras.volumes {
            mounts.push(Mount {
                target: Some(v.target.clone()),
                source: Some(v.name.clone()),
                typ: Some(MountType::VOLUME),
                read_only: Some(v.read_only),
                ..Default::default()
            });
        }
        for forward in &self.extras.forwards {
            mounts.push(Mount {
                target: Some(forward.target()),
                source: Some(forward.socket.to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            });
        }
        if let Some(bundle) = &self.extras.ca_bundle {
            mounts.push(Mount {
                target: Some(CA_BUNDLE.to_string()),
                source: Some(bundle.to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            });
        }
        // No source: an anonymous volume, created with the container and removed with it.
        mounts.push(Mount {
            target: Some(CACHE_DIR.to_string()),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            volume_options: Some(MountVolumeOptions {
                labels: Some(labels.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
        if let Some(etc) = etc {
            for name in ["passwd", "group"] {
                mounts.push(Mount {
                    target: Some(format!("/etc/{name}")),
                    source: Some(etc.join(name).to_string_lossy().into_owned()),
                    typ: Some(MountType::BIND),
                    read_only: Some(true),
                    ..Default::default()
                });
            }
        }

        let host_config = HostConfig {
            network_mode: Some("none".into()),
            mounts: Some(mounts),
            tmpfs: Some(tmpfs),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(security_opts()),
            readonly_rootfs: Some(true),
            privileged: Some(false),
            // As PID 1 the executor reaps zombies itself; docker-init does it for the keep-alive.
            init: Some(main == MainProcess::KeepAlive),
            pids_limit: Some(self.limits.pids),
            memory: Some(self.limits.memory_bytes),
            // Equal to memory: no swap, so the memory limit is a real limit.
            memory_swap: Some(self.limits.memory_bytes),
            nano_cpus: Some((self.limits.cpus * 1e9) as i64),
            ulimits: Some(ulimits(engine, self.limits.max_file_bytes)),
            userns_mode: engine.userns_mode().map(String::from),
            ipc_mode: Some("private".into()),
            // /dev/shm is a tmpfs too: part of the memory budget.
            shm_size: Some(self.limits.shm_bytes),
            // System V IPC objects outlive their processes and are charged to the container:
            // like a tmpfs, memory no process holds. Shared memory segments go with their last
            // user; message queues (at most 32 x 16 KiB of text) and semaphores (32000) are
            // bounded to a few MiB. The kernel's defaults allow gigabytes.
            sysctls: Some(HashMap::from([
                ("kernel.shm_rmid_forced".to_string(), "1".to_string()),
                ("kernel.msgmni".to_string(), "32".to_string()),
                ("kernel.sem".to_string(), "250 32000 32 128".to_string()),
            ])),
            // If the host runs short of memory, the sandbox goes first.
            oom_score_adj: Some(500),
            // The daemon removes the container as soon as it stops: when our attach connection
            // drops (even on SIGKILL) the main process reads EOF, exits, and the container is gone.
            auto_remove: Some(true),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            runtime: self.runtime.clone(),
            ..Default::default()
        };

        let (cmd, user) = match main {
            MainProcess::Executor => (
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    BOOT.into(),
                    "agentbox-executor".into(),
                    super::executor::source(),
                ],
                self.user(),
            ),
            // Waits for EOF on stdin, which agentbox holds open for the life of the session.
            MainProcess::KeepAlive => (
                vec!["/bin/sh".into(), "-c".into(), "read -r _ || true".into()],
                format!("{0}:{0}", self.keepalive_uid()),
            ),
            MainProcess::OneShot => (vec![ONE_SHOT_INIT.into()], self.user()),
        };
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(cmd),
            entrypoint: Some(vec![]),
            user: Some(user),
            working_dir: Some(WORKSPACE.into()),
            env: Some(self.env()),
            labels: Some(labels),
            open_stdin: Some(true),
            stdin_once: Some(true),
            attach_stdin: Some(true),
            attach_stdout: Some(main != MainProcess::KeepAlive),
            attach_stderr: Some(main != MainProcess::KeepAlive),
            tty: Some(false),
            network_disabled: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            session: "abc".into(),
            image: "agentbox/python:3".into(),
            workspace: WorkspaceSource::Bind {
                project: "/p".into(),
                protected: vec![".git".into(), "lib/sub/.git".into()],
                baseline: Default::default(),
                linked_git: None,
                warnings: vec![],
            },
            uid: 1000,
            gid: 1000,
            limits: Limits::default(),
            runtime: None,
            per_call_exec: false,
            labels: vec![],
            allow_weak_limits: false,
            read_only: false,
            cleanup: Default::default(),
            extras: Default::default(),
            services: vec![],
        }
    }

    fn docker() -> EngineInfo {
        EngineInfo::docker()
    }

    #[test]
    fn every_helper_container_is_locked_down_like_the_sandbox_and_bounded() {
        let s = spec();
        let sandbox = s
            .create_body(MainProcess::Executor, None, &docker())
            .host_config
            .unwrap();
        for (what, body) in [
            ("seeder", s.seeder_body("vol", &docker())),
            ("reader", s.reader_body(&docker())),
            ("identity", s.identity_body(&docker())),
        ] {
            assert_eq!(body.network_disabled, Some(true), "{what}");
            let hc = body.host_config.unwrap();
            assert_eq!(hc.network_mode.as_deref(), Some("none"), "{what}");
            assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]), "{what}");
            assert_eq!(
                hc.security_opt, sandbox.security_opt,
                "{what}: the sandbox's seccomp"
            );
            assert_eq!(hc.ulimits, sandbox.ulimits, "{what}");
            assert_eq!(hc.pids_limit, Some(HELPER_PIDS), "{what}");
            assert_eq!(hc.memory, Some(HELPER_MEMORY), "{what}");
            assert_eq!(hc.memory_swap, Some(HELPER_MEMORY), "{what}: no swap");
            assert_eq!(hc.runtime, sandbox.runtime, "{what}");
            let caps = hc.cap_add.unwrap_or_default();
            assert!(caps.is_empty() || caps == ["CHOWN"], "{what}: {caps:?}");
        }
    }

    #[test]
    fn a_read_only_spec_mounts_the_project_read_only() {
        let mounts = |s: &SandboxSpec| {
            s.create_body(MainProcess::Executor, None, &docker())
                .host_config
                .unwrap()
                .mounts
                .unwrap()
        };
        let workspace = |s: &SandboxSpec| {
            mounts(s)
                .into_iter()
                .find(|m| m.target.as_deref() == Some(WORKSPACE))
                .unwrap()
                .read_only
        };
        let mut s = spec();
        assert_eq!(workspace(&s), Some(false));
        s.read_only = true;
        assert_eq!(workspace(&s), Some(true));
    }

    #[test]
    fn a_linked_worktrees_repository_is_mounted_read_only_under_the_git_root() {
        let mut s = spec();
        if let WorkspaceSource::Bind { linked_git, .. } = &mut s.workspace {
            *linked_git = Some(LinkedGit {
                kind: LinkedGitKind::Worktree,
                pieces: vec![
                    (GitPiece::Head, "/m/.git/HEAD".into()),
                    (GitPiece::Objects, "/m/.git/objects".into()),
                    (GitPiece::Refs, "/m/.git/refs".into()),
                    (GitPiece::Worktree, "/m/.git/worktrees/w".into()),
                    (
                        GitPiece::WorktreeConfig,
                        "/m/.git/worktrees/w/config.worktree".into(),
                    ),
                ],
                config: String::new(),
            });
        }
        let body = s.create_body(
            MainProcess::Executor,
            Some(std::path::Path::new("/h/etc")),
            &docker(),
        );
        assert!(body.env.unwrap().contains(&"GIT_OPTIONAL_LOCKS=0".to_string()));
        let mounts = body.host_config.unwrap().mounts.unwrap();
        let at = |target: &str| {
            let found: Vec<&Mount> = mounts
                .iter()
                .filter(|m| m.target.as_deref() == Some(target))
                .collect();
            assert_eq!(found.len(), 1, "{target}: {mounts:?}");
            assert_eq!(found[0].read_only, Some(true), "{target}");
            found[0].source.clone().unwrap()
        };
        assert_eq!(
            at("/workspace/.git"),
            "/h/etc/git-file",
            "agentbox's, over the project's own"
        );
        assert_eq!(
            at("/run/agentbox-git"),
            "/h/etc/git-root",
            "agentbox's, with its config"
        );
        assert_eq!(at("/run/agentbox-git/objects"), "/m/.git/objects");
        assert_eq!(at("/run/agentbox-git/worktrees/workspace"), "/m/.git/worktrees/w");
        assert_eq!(
            at("/run/agentbox-git/worktrees/workspace/config.worktree"),
            "/h/etc/git-empty"
        );
        for m in &mounts {
            let source = m.source.as_deref().unwrap_or_default();
            if source.starts_with("/m/") {
                assert!(m.target.as_deref().unwrap().starts_with(GIT_ROOT), "{m:?}");
                assert_eq!(m.read_only, Some(true), "{m:?}");
            }
        }
        assert!(
            !mounts
                .iter()
                .any(|m| m.source.as_deref() == Some("/m/.git/worktrees/w/config.worktree"))
        );
        assert!(!spec().env().iter().any(|e| e.starts_with("GIT_OPTIONAL_LOCKS")));
    }

    #[test]
    fn sizes_parse_like_docker_flags() {
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("100kb"), Ok(100 << 10));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1m").is_err());
        assert!(parse_size("").is_err());
        assert!(
            parse_size("0.5").is_err(),
            "rounds to zero, which Docker reads as unlimited"
        );
    }

    #[test]
    fn the_policy_is_locked_down() {
        let body = spec().create_body(MainProcess::Executor, None, &docker());
        assert_eq!(
            body.user.as_deref(),
            Some("1000:1000"),
            "the executor runs as the project owner"
        );
        assert_eq!(body.cmd.as_ref().unwrap()[4], crate::executor::source());
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        let opts = hc.security_opt.clone().unwrap();
        assert_eq!(opts[0], "no-new-privileges");
        assert_eq!(opts[1], super::super::seccomp::security_opt());
        assert_eq!(opts.len(), 2);
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.init, Some(false), "the executor is PID 1 and reaps");
        assert_eq!(
            spec()
                .create_body(MainProcess::KeepAlive, None, &docker())
                .host_config
                .unwrap()
                .init,
            Some(true)
        );
        assert_eq!(hc.memory, hc.memory_swap);
        assert!(hc.binds.is_none());
        let mounts = hc.mounts.unwrap();
        assert_eq!(mounts.len(), 4);
        // Toolchain caches: an anonymous volume of the session's, not HOME's tmpfs.
        let cache = &mounts[3];
        assert_eq!(cache.target.as_deref(), Some(CACHE_DIR));
        assert_eq!(cache.typ, Some(MountType::VOLUME));
        assert_eq!(cache.source, None, "anonymous: removed with the container");
        assert_eq!(
            cache.volume_options.as_ref().unwrap().labels.as_ref().unwrap()[SESSION_LABEL],
            "abc"
        );
        assert_eq!(mounts[2].target.as_deref(), Some("/workspace/lib/sub/.git"));
        assert_eq!(mounts[2].source.as_deref(), Some("/p/lib/sub/.git"));
        assert_eq!(mounts[2].read_only, Some(true));
        assert_eq!(mounts[0].target.as_deref(), Some("/workspace"));
        assert_eq!(mounts[0].read_only, Some(false));
        assert_eq!(mounts[1].target.as_deref(), Some("/workspace/.git"));
        assert_eq!(mounts[1].read_only, Some(true));
        let tmpfs = hc.tmpfs.unwrap();
        assert!(tmpfs["/tmp"].contains(&format!("size={}", 512 << 20)));
        assert!(tmpfs[HOME].contains("uid=1000,gid=1000"));
        let labels = body.labels.unwrap();
        assert_eq!(labels[SESSION_LABEL], "abc");
        // No host environment leaks in: the list is fixed.
        assert!(
            body.env
                .unwrap()
                .iter()
                .all(|e| !e.contains("KEY") && !e.contains("TOKEN"))
        );
    }

    #[test]
    fn files_in_memory_always_leave_room_for_processes() {
        for memory in [128 << 20, 256 << 20, 1 << 30, 2 << 30, 16i64 << 30] {
            let b = MemoryBudget::new(memory);
            let tmp = b.auto_tmp();
            assert!(b.fits(tmp), "{memory}: auto /tmp {tmp} does not fit");
            let files = 2 * tmp + b.home + b.shm;
            assert!(
                files + b.reserve <= memory && b.reserve >= MIN_RESERVE,
                "{memory}: {files} in files leaves less than {} for processes",
                b.reserve
            );
        }
        // The defaults, as before the budget: 512 MiB /tmp, 64 MiB HOME, under 2 GiB.
        let d = Limits::default();
        assert_eq!(
            (d.tmp_bytes, d.home_bytes, d.shm_bytes),
            (512 << 20, 64 << 20, 64 << 20)
        );
        // A small limit shrinks everything.
        let small = MemoryBudget::new(256 << 20);
        assert_eq!(
            (small.auto_tmp(), small.home, small.reserve),
            (72 << 20, 24 << 20, 64 << 20)
        );
        assert!(!small.fits(512 << 20));
    }

    #[test]
    fn the_memory_a_tmp_size_needs_is_the_least_that_fits() {
        for mib in (1..=4096).step_by(7) {
            let tmp = mib << 20;
            let memory = MemoryBudget::memory_for(tmp);
            assert!(MemoryBudget::new(memory).fits(tmp), "{mib} MiB");
            assert!(
                memory == MIN_MEMORY || !MemoryBudget::new(memory - (1 << 20)).fits(tmp),
                "{mib} MiB: {memory} is not the least"
            );
        }
        assert_eq!(MemoryBudget::memory_for(512 << 20), 1536 << 20);
        assert_eq!(MemoryBudget::memory_for(i64::MAX), i64::MAX);
    }

    #[test]
    fn in_memory_filesystems_and_ipc_are_bounded() {
        let hc = spec()
            .create_body(MainProcess::Executor, None, &docker())
            .host_config
            .unwrap();
        let tmpfs = hc.tmpfs.unwrap();
        let l = Limits::default();
        assert!(tmpfs[HOME].contains(&format!("size={}", l.home_bytes)));
        assert!(tmpfs[HARNESS_DIR].contains(&format!("size={}", l.tmp_bytes)));
        assert_eq!(tmpfs.len(), 3);
        assert_eq!(hc.shm_size, Some(l.shm_bytes));
        let sysctls = hc.sysctls.unwrap();
        assert_eq!(sysctls["kernel.shm_rmid_forced"], "1");
        assert_eq!(sysctls["kernel.msgmni"], "32");
        assert!(sysctls["kernel.sem"].starts_with("250 32000 "));
    }

    #[test]
    fn the_sandbox_user_files_are_mounted_read_only_over_the_images() {
        let body = spec().create_body(
            MainProcess::Executor,
            Some(std::path::Path::new("/h/etc")),
            &docker(),
        );
        let mounts = body.host_config.unwrap().mounts.unwrap();
        for name in ["passwd", "group"] {
            let m = mounts
                .iter()
                .find(|m| m.target.as_deref() == Some(&format!("/etc/{name}")))
                .unwrap();
            assert_eq!(m.source.as_deref(), Some(format!("/h/etc/{name}").as_str()));
            assert_eq!(m.read_only, Some(true));
            assert_eq!(m.typ, Some(MountType::BIND));
        }
        let env = spec().env();
        for var in [
            "CARGO_HOME=",
            "CARGO_TARGET_DIR=",
            "GOCACHE=",
            "GOPATH=",
            "npm_config_cache=",
            "PIP_CACHE_DIR=",
            "XDG_CACHE_HOME=",
        ] {
            let e = env.iter().find(|e| e.starts_with(var)).unwrap();
            assert!(
                e[var.len()..].starts_with(CACHE_DIR),
                "{e} is not on the cache volume"
            );
        }
    }

    #[test]
    fn the_egress_socket_and_caches_are_only_there_when_given() {
        let plain = spec().create_body(MainProcess::Executor, None, &docker());
        let mounts = plain.host_config.unwrap().mounts.unwrap();
        assert!(
            mounts
                .iter()
                .all(|m| m.target.as_deref() != Some(EGRESS_SOCKET) && m.target.as_deref() != Some(CA_BUNDLE))
        );
        assert!(
            plain
                .env
                .unwrap()
                .iter()
                .all(|e| !e.starts_with("AGENTBOX_FORWARD"))
        );
        let mut s = spec();
        s.extras = Extras {
            forwards: vec![Forward::egress("/tmp/x/proxy.sock".into())],
            volumes: vec![VolumeMount {
                name: "cache".into(),
                target: "/opt/deps".into(),
                read_only: true,
            }],
            env: vec![("PATH".into(), "/opt/deps/bin:/usr/bin".into())],
            workspace_read_only: true,
            ca_bundle: Some("/tmp/x/ca.pem".into()),
            seed: None,
        };
        let body = s.create_body(MainProcess::Executor, None, &docker());
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"), "still no network");
        let mounts = hc.mounts.unwrap();
        let sock = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some(EGRESS_SOCKET))
            .unwrap();
        assert_eq!((sock.read_only, sock.typ), (Some(true), Some(MountType::BIND)));
        let cache = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some("/opt/deps"))
            .unwrap();
        assert_eq!(cache.read_only, Some(true));
        let ca = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some(CA_BUNDLE))
            .unwrap();
        assert_eq!(
            (ca.read_only, ca.typ, ca.source.as_deref()),
            (Some(true), Some(MountType::BIND), Some("/tmp/x/ca.pem"))
        );
        let env = body.env.unwrap();
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
        assert!(env.contains(&"PATH=/opt/deps/bin:/usr/bin".to_string()));
        assert!(env.contains(&format!("AGENTBOX_FORWARD=out:{EGRESS_PORT}:{EGRESS_SOCKET}")));
    }

    #[test]
    fn podman_gets_the_same_policy_in_its_own_words() {
        let podman = EngineInfo {
            kind: crate::EngineKind::Podman,
            ..EngineInfo::docker()
        };
        let hc = spec()
            .create_body(MainProcess::Executor, None, &podman)
            .host_config
            .unwrap();
        let tmpfs = hc.tmpfs.unwrap();
        for dir in [HOME, HARNESS_DIR] {
            assert!(tmpfs[dir].ends_with("mode=0700,U"), "{}", tmpfs[dir]);
            assert!(!tmpfs[dir].contains("uid="), "Podman 4.3 refuses uid=");
        }
        let nproc = hc
            .ulimits
            .unwrap()
            .into_iter()
            .find(|u| u.name.as_deref() == Some("nproc"))
            .unwrap();
        assert_eq!(nproc.hard, Some(32768));
        assert_eq!(hc.userns_mode, None, "rootful: no user namespace");
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.readonly_rootfs, Some(true));
        // Keep-alive mode: `U` would give HOME to the keep-alive's uid, so it is shared instead.
        let keepalive = spec()
            .create_body(MainProcess::KeepAlive, None, &podman)
            .host_config
            .unwrap()
            .tmpfs
            .unwrap();
        assert!(keepalive[HOME].ends_with("mode=1777"), "{}", keepalive[HOME]);
        // Rootless: keep-id, so the owner's uid is the owner's on the host too.
        let rootless = EngineInfo {
            rootless: true,
            owner_uid: Some(1000),
            ..podman
        };
        let body = spec().create_body(MainProcess::Executor, None, &rootless);
        assert_eq!(body.user.as_deref(), Some("1000:1000"), "not root inside");
        assert_eq!(body.host_config.unwrap().userns_mode.as_deref(), Some("keep-id"));
        let seeder = spec().seeder_body("v", &rootless).host_config.unwrap();
        assert_eq!(seeder.userns_mode.as_deref(), Some("keep-id"));
    }

    #[test]
    fn keepalive_runs_as_another_uid() {
        let mut s = spec();
        assert_eq!(s.keepalive_uid(), 65534);
        s.uid = 65534;
        assert_eq!(s.keepalive_uid(), 65533);
        assert_eq!(
            s.create_body(MainProcess::KeepAlive, None, &docker())
                .user
                .as_deref(),
            Some("65533:65533")
        );
    }
}
