//! Which container engine answers the Docker EngineInfo API, and what agentbox adapts for it.
//!
//! agentbox speaks only the Docker EngineInfo API, and two engines answer it: Docker, and Podman's
//! compatible service (`podman system service`). They differ in details the sandbox policy
//! depends on, and this module says which details, so the policy can keep its promise on both
//! (measured against Podman 4.3.1, Debian bookworm's, with runc, on cgroup v1):
//!
//! - tmpfs options: Podman refuses `uid=`/`gid=` ("unknown mount option"); its own option `U`
//!   gives the mount to the container's user instead.
//! - ulimits: Podman's conmon runs with RLIMIT_NPROC lowered to the kernel's `pid_max` (32768 by
//!   default), and runc cannot raise a hard limit without CAP_SYS_RESOURCE, so Docker's 65536
//!   fails with "error setting rlimit type 6"; and without an explicit `nofile` Podman asks
//!   for 1048576 ("error setting rlimit type 7").
//! - seccomp: the profile goes as a file path, not inline JSON (see `seccomp`).
//! - rootless: under a user namespace the engine's own uid is the only host uid a container
//!   can write as (see [`EngineInfo::userns_mode`]), and on cgroup v1 a rootless engine can enforce
//!   no memory, pids or CPU limit at all (see [`EngineInfo::enforces_limits`]).
//!
//! One process talks to one engine (`DOCKER_HOST`), so the answer is asked once and kept.

use bollard::Docker;

use super::SandboxError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Docker,
    Podman,
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineKind::Docker => "Docker",
            EngineKind::Podman => "Podman",
        })
    }
}

/// What the engine told us about itself (its version and info endpoints).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    pub kind: EngineKind,
    /// The engine's own version (Docker's, or Podman's), not the API's.
    pub version: String,
    pub api_version: String,
    /// Runs as an ordinary user, in a user namespace.
    pub rootless: bool,
    /// "1" or "2"; `None` when the engine did not say.
    pub cgroup_version: Option<String>,
    /// The uid the engine runs as, when rootless: the owner of its socket (a rootless engine's
    /// socket is its user's own, under `XDG_RUNTIME_DIR`), else this process's uid.
    pub owner_uid: Option<u32>,
}

/// RLIMIT_NPROC in the sandbox. Counted per uid across the host, so generous: the pids limit
/// is the real cap.
const NPROC_DOCKER: i64 = 65536;
/// Podman: at most the kernel's default `pid_max`, which is what its conmon is limited to (see
/// the module's notes); no uid can hold more processes than that on such a kernel anyway.
const NPROC_PODMAN: i64 = 32768;

impl EngineInfo {
    /// Ask the engine (version and info endpoints). Errors only if the version query fails;
    /// a failed info query leaves rootless and cgroup version unknown (treated as rootful).
    pub async fn detect(docker: &Docker) -> Result<EngineInfo, SandboxError> {
        // Asked together: both are on every command's path (a few ms each, measured).
        let (v, info) = tokio::join!(docker.version(), docker.info());
        let v = v.map_err(|e| SandboxError::docker("query the engine's version", e))?;
        let components = v.components.unwrap_or_default();
        let podman = components.iter().find(|c| c.name.starts_with("Podman"));
        let platform = v.platform.map(|p| p.name).unwrap_or_default();
        let kind = if podman.is_some() || platform.to_ascii_lowercase().contains("podman") {
            EngineKind::Podman
        } else {
            EngineKind::Docker
        };
        let version = podman
            .map(|c| c.version.clone())
            .or(v.version)
            .unwrap_or_default();
        let info = info.ok();
        // Docker says it in SecurityOptions; Podman in a field of its own.
        let rootless = info
            .as_ref()
            .and_then(|i| i.security_options.as_ref())
            .is_some_and(|opts| opts.iter().any(|o| o.split(',').any(|kv| kv == "name=rootless")))
            || (kind == EngineKind::Podman && podman_says_rootless().await == Some(true));
        let cgroup_version = info
            .and_then(|i| i.cgroup_version)
            .map(|c| c.to_string())
            .filter(|c| !c.is_empty());
        Ok(EngineInfo {
            kind,
            version,
            api_version: v.api_version.unwrap_or_default(),
            rootless,
            cgroup_version,
            owner_uid: if rootless { Some(engine_uid()) } else { None },
        })
    }

    /// Docker, rootful, as assumed when nothing else is known (unit tests, the policy's
    /// defaults).
    pub fn docker() -> EngineInfo {
        EngineInfo {
            kind: EngineKind::Docker,
            version: String::new(),
            api_version: String::new(),
            rootless: false,
            cgroup_version: None,
            owner_uid: None,
        }
    }

    pub fn is_podman(&self) -> bool {
        self.kind == EngineKind::Podman
    }

    /// Whether the memory, pids and CPU limits are enforced. A rootless engine on cgroup v1 has
    /// no cgroup it may configure: Podman then drops the limits with a warning in its own log
    /// ("resource limits are not supported and ignored on cgroups V1 rootless systems").
    pub fn enforces_limits(&self) -> bool {
        // Fail closed: a rootless engine whose cgroup version could not be read counts as v1.
        !(self.rootless && self.cgroup_version.as_deref() != Some("2"))
    }

    /// The tmpfs option that gives a mount to the sandbox user: Docker takes `uid=`/`gid=`;
    /// Podman refuses them and takes `U` (chown to the container's user).
    pub(crate) fn tmpfs_owner(&self, uid: u32, gid: u32) -> String {
        match self.kind {
            EngineKind::Docker => format!("uid={uid},gid={gid}"),
            EngineKind::Podman => "U".into(),
        }
    }

    pub(crate) fn nproc_limit(&self) -> i64 {
        match self.kind {
            EngineKind::Docker => NPROC_DOCKER,
            EngineKind::Podman => NPROC_PODMAN,
        }
    }

    /// The user namespace mode a rootless Podman needs: `keep-id`.
    ///
    /// Under a rootless engine's user namespace, container uid 0 maps to the engine's user and
    /// every other container uid to a subordinate uid (100000 and up). Commands run as the
    /// project owner's uid, as everywhere; without `keep-id` that uid would be a subuid on the
    /// host, and what they write in the project would belong to a uid the user cannot even
    /// remove files of without `podman unshare`. Running as container uid 0 instead would map
    /// to the user, but would run commands as (capability-less) root inside, against the
    /// policy's "non-root uid". `keep-id` maps the user's uid to itself (measured: Podman
    /// 4.3.1's compatible API takes it as `HostConfig.UsernsMode`), so both hold: a non-root
    /// uid inside, the user's own uid on the host.
    pub(crate) fn userns_mode(&self) -> Option<&'static str> {
        (self.rootless && self.is_podman()).then_some("keep-id")
    }

    /// Rootless: the only host uid the sandbox can write as is the engine's own, so the project
    /// must belong to it. `Err` names both uids.
    pub(crate) fn check_owner(&self, project_uid: u32) -> Result<(), SandboxError> {
        match self.owner_uid {
            Some(owner) if self.rootless && owner != project_uid => Err(SandboxError::Other(format!(
                "the engine is rootless {} running as uid {owner}, and the project belongs to uid \
                 {project_uid}: a rootless engine can only write files as its own user. Run \
                 agentbox on a project of uid {owner}, or use a rootful engine",
                self.kind
            ))),
            _ => Ok(()),
        }
    }

    /// What agentbox does differently for this engine, for `doctor`.
    pub fn adaptations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.is_podman() {
            out.push(
                "tmpfs mounts given to the sandbox user with Podman's `U` option (it refuses uid=/gid=)"
                    .into(),
            );
            out.push(format!(
                "explicit ulimits nofile 4096, nproc {NPROC_PODMAN} (Podman's defaults exceed what its conmon may set)"
            ));
            out.push("seccomp profile passed as a file (Podman's API refuses inline JSON)".into());
        }
        if self.userns_mode().is_some() {
            out.push("user namespace keep-id: commands run as your uid inside and on the host".into());
        }
        if !self.enforces_limits() {
            out.push(
                "memory, pids and CPU limits cannot be enforced (rootless on cgroup v1): refused unless \
                 --allow-weak-limits"
                    .into(),
            );
        }
        out
    }
}

/// The path of a `unix://` `DOCKER_HOST` (or the default socket).
fn socket_path() -> Option<std::path::PathBuf> {
    super::engine::current()
        .host
        .strip_prefix("unix://")
        .map(std::path::PathBuf::from)
}

fn engine_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    socket_path()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.uid())
        // SAFETY: getuid has no preconditions and cannot fail.
        .unwrap_or_else(|| unsafe { libc::getuid() })
}

/// Podman's compatible `/info` says `"Rootless": true|false` in a field bollard's model does
/// not have (and drops), so that document is read raw.
async fn podman_says_rootless() -> Option<bool> {
    raw_get("/v1.41/info")
        .await?
        .get("Rootless")
        .and_then(serde_json::Value::as_bool)
}

/// GET `path` (with its query, percent-encoded) from a `unix://` endpoint and parse the JSON
/// body, for answers bollard's models cannot read (Podman's extra fields and container states).
/// `None` for any other endpoint or failure. Bounded in size (16 MiB) and time (10 s).
pub(crate) async fn raw_get(path: &str) -> Option<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = socket_path()?;
    let ask = async {
        let mut stream = tokio::net::UnixStream::connect(&socket).await.ok()?;
        // HTTP/1.0: the answer is not chunked and ends when the connection closes.
        let request = format!("GET {path} HTTP/1.0\r\nHost: engine\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.take(16 << 20).read_to_end(&mut raw).await.ok()?;
        let at = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        if !raw.starts_with(b"HTTP/1.1 200") && !raw.starts_with(b"HTTP/1.0 200") {
            return None;
        }
        serde_json::from_slice(&raw[at + 4..]).ok()
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), ask)
        .await
        .ok()
        .flatten()
}

/// Percent-encode a query value (everything but RFC 3986's unreserved characters).
pub(crate) fn query_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What each engine is, asked once per endpoint and process (`eval --engine` talks to several).
static KNOWN: std::sync::Mutex<Vec<(String, EngineInfo)>> = std::sync::Mutex::new(Vec::new());

/// The engine behind `docker` (the endpoint in force, see `engine::current`), asked once.
/// If it cannot be asked, Docker rootful is assumed and the next call asks again.
pub async fn info(docker: &Docker) -> EngineInfo {
    let host = super::engine::current().host;
    let cached = KNOWN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(h, _)| *h == host)
        .map(|(_, e)| e.clone());
    if let Some(e) = cached {
        return e;
    }
    match EngineInfo::detect(docker).await {
        Ok(e) => {
            KNOWN
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((host, e.clone()));
            e
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot tell the engine: assuming Docker");
            EngineInfo::docker()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(
            query_escape(r#"{"label":["a.b=1"]}"#),
            "%7B%22label%22%3A%5B%22a.b%3D1%22%5D%7D"
        );
    }

    #[test]
    fn rootless_on_cgroup_v1_cannot_enforce_limits() {
        let mut e = EngineInfo::docker();
        assert!(e.enforces_limits());
        e.rootless = true;
        e.cgroup_version = Some("2".into());
        assert!(e.enforces_limits());
        e.cgroup_version = Some("1".into());
        assert!(!e.enforces_limits());
        e.cgroup_version = None;
        assert!(!e.enforces_limits(), "an unknown cgroup version fails closed");
    }

    #[test]
    fn the_refusal_names_the_flag_that_accepts_weak_limits() {
        let text = SandboxError::WeakLimits {
            engine: "Podman 4.3.1".into(),
        }
        .to_string();
        assert!(text.contains("--allow-weak-limits"), "{text}");
        assert!(
            text.contains("Podman 4.3.1") && text.contains("cgroup v1"),
            "{text}"
        );
    }

    #[test]
    fn podman_gets_its_own_tmpfs_owner_option_and_nproc() {
        let mut e = EngineInfo::docker();
        assert_eq!(e.tmpfs_owner(1000, 100), "uid=1000,gid=100");
        assert_eq!(e.nproc_limit(), 65536);
        assert!(e.adaptations().is_empty());
        e.kind = EngineKind::Podman;
        assert_eq!(e.tmpfs_owner(1000, 100), "U");
        assert_eq!(e.nproc_limit(), 32768);
        assert!(!e.adaptations().is_empty());
    }

    #[test]
    fn rootless_podman_keeps_the_users_id_and_needs_their_project() {
        let mut e = EngineInfo::docker();
        assert_eq!(e.userns_mode(), None);
        assert!(e.check_owner(4242).is_ok());
        e.kind = EngineKind::Podman;
        e.rootless = true;
        e.owner_uid = Some(1000);
        assert_eq!(e.userns_mode(), Some("keep-id"));
        assert!(e.check_owner(1000).is_ok());
        let err = e.check_owner(4242).unwrap_err().to_string();
        assert!(err.contains("uid 1000") && err.contains("uid 4242"), "{err}");
    }
}
