//! Which Docker engine a sandbox is made on, and how to reach it.
//!
//! By default the one `DOCKER_HOST` names, read as the docker CLI reads it: `unix://PATH`
//! (default `/var/run/docker.sock`), `tcp://HOST:PORT` with TLS when `DOCKER_TLS_VERIFY` is
//! set (to anything non-empty), the client certificate and CA from `DOCKER_CERT_PATH` (default
//! `~/.docker`: `ca.pem`, `cert.pem`, `key.pem`). `eval --engine` gives each task its own
//! engine instead: [`scope`] sets it for everything the task's future does.
//!
//! An engine that is not on this machine (any scheme but `unix://` and `npipe://`) cannot
//! bind-mount a directory of this machine: [`Engine::is_remote`] decides that the project is
//! copied in (the `--isolate` path) and that the sandbox user's `/etc` entries come in an
//! image layer instead of a bind mount (see `identity`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, Docker};

use super::SandboxError;

/// The default endpoint, as the docker CLI has it on Linux.
pub(crate) const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// Seconds bollard waits for a response's headers (its own default).
const CLIENT_TIMEOUT: u64 = 120;

/// A Docker engine: its endpoint, and the directory of its TLS material when it speaks TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub host: String,
    pub tls: Option<PathBuf>,
}

tokio::task_local! {
    /// The engine of the task in progress (`eval --engine`), instead of `DOCKER_HOST`.
    static TASK_ENGINE: Engine;
}

/// Run `f` with `engine` as the engine of every sandbox, image check and cleanup it makes.
/// (Task-local: a future it spawns with `tokio::spawn` falls back to `DOCKER_HOST`.)
pub async fn scope<F: std::future::Future>(engine: Engine, f: F) -> F::Output {
    TASK_ENGINE.scope(engine, f).await
}

/// The engine in force: the task's, else the environment's.
pub fn current() -> Engine {
    TASK_ENGINE
        .try_with(|e| e.clone())
        .unwrap_or_else(|_| Engine::from_env())
}

impl Engine {
    /// `DOCKER_HOST`, `DOCKER_TLS_VERIFY` and `DOCKER_CERT_PATH`, as the docker CLI reads them.
    pub fn from_env() -> Engine {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let host = var("DOCKER_HOST").unwrap_or_else(|| DEFAULT_HOST.to_string());
        let tls = var("DOCKER_TLS_VERIFY").map(|_| default_cert_path());
        Engine { host, tls }
    }

    /// A local engine on `host` (no TLS).
    pub fn plain(host: &str) -> Engine {
        Engine {
            host: host.to_string(),
            tls: None,
        }
    }

    /// Not on this machine: it cannot bind-mount this machine's files. A socket forwarded from
    /// another machine looks local; `AGENTBOX_ENGINE_REMOTE=1` says it is not.
    pub fn is_remote(&self) -> bool {
        std::env::var_os("AGENTBOX_ENGINE_REMOTE").is_some_and(|v| v == "1")
            || !(self.host.starts_with("unix://") || self.host.starts_with("npipe://"))
    }

    /// The endpoint, for messages (with "TLS" when it speaks it).
    pub fn describe(&self) -> String {
        match &self.tls {
            Some(_) => format!("{} (TLS)", self.host),
            None => self.host.clone(),
        }
    }

    /// A client for the engine (no request made yet). Errors say what to fix.
    pub fn client(&self) -> Result<Docker, EndpointError> {
        let host = self.host.as_str();
        let (scheme, _) = host.split_once("://").unwrap_or(("", host));
        match scheme {
            "unix" => Docker::connect_with_unix(host, CLIENT_TIMEOUT, API_DEFAULT_VERSION)
                .map_err(EndpointError::Client),
            "tcp" | "http" | "https" => match &self.tls {
                Some(dir) => {
                    let files = check_cert_dir(dir)?;
                    // bollard's TLS client takes rustls's process-wide provider: the same ring
                    // the model client installs (installing it twice is harmless).
                    let _ = rustls::crypto::ring::default_provider().install_default();
                    Docker::connect_with_ssl(
                        host,
                        &files.key,
                        &files.cert,
                        &files.ca,
                        CLIENT_TIMEOUT,
                        API_DEFAULT_VERSION,
                    )
                    .map_err(EndpointError::Client)
                }
                None if scheme == "https" => Err(EndpointError::HttpsWithoutTls),
                None => Docker::connect_with_http(host, CLIENT_TIMEOUT, API_DEFAULT_VERSION)
                    .map_err(EndpointError::Client),
            },
            "ssh" => Err(EndpointError::Unsupported(
                "ssh:// engines are not supported: the Docker client agentbox is built with (bollard \
                 0.21) has SSH only behind a feature agentbox does not enable. Forward the remote \
                 socket instead (`ssh -NL /tmp/remote-docker.sock:/var/run/docker.sock USER@HOST`), \
                 then DOCKER_HOST=unix:///tmp/remote-docker.sock and pass --isolate yourself (a \
                 forwarded socket looks local), or serve the engine over TLS (tcp:// with \
                 DOCKER_TLS_VERIFY=1)",
            )),
            "npipe" => Err(EndpointError::Unsupported(
                "npipe:// (Windows named pipes) is not supported on this system",
            )),
            _ => Err(EndpointError::Unsupported(
                "unsupported endpoint (expected unix:///PATH, or tcp://HOST:PORT with DOCKER_TLS_VERIFY=1 \
                 and DOCKER_CERT_PATH)",
            )),
        }
    }

    /// Connect and check the engine answers.
    pub async fn connect(&self) -> Result<Docker, SandboxError> {
        let unreachable = |reason: String| SandboxError::Unreachable {
            endpoint: self.describe(),
            reason,
        };
        let docker = self.client().map_err(|e| {
            let reason = e.to_string();
            if self.host.starts_with("unix://") {
                // A socket that is not there: the daemon is not running (or not there).
                unreachable(reason)
            } else {
                SandboxError::Engine {
                    endpoint: self.host.clone(),
                    reason,
                }
            }
        })?;
        match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
            Ok(Ok(_)) => Ok(docker),
            Ok(Err(e)) => Err(match &self.tls {
                Some(dir) if is_tls_failure(&e) => SandboxError::Engine {
                    endpoint: self.host.clone(),
                    reason: format!(
                        "the TLS handshake failed ({}): the engine's certificate must be signed by \
                         {}/ca.pem and name the host you connect to, and the engine must accept the \
                         client certificate {}/cert.pem",
                        super::api::root_cause(&e),
                        dir.display(),
                        dir.display()
                    ),
                },
                None if super::messages::PLAIN_HTTP_TO_TLS.in_message(&super::api::root_cause(&e)) => SandboxError::Engine {
                    endpoint: self.host.clone(),
                    reason:
                        "the engine speaks TLS: set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (a directory \
                             with ca.pem, cert.pem and key.pem), as for the docker CLI"
                            .into(),
                },
                _ => unreachable(super::api::root_cause(&e)),
            }),
            Err(_) => Err(unreachable("no answer within 10s".into())),
        }
    }
}

/// `$DOCKER_CERT_PATH`, else `~/.docker` (the docker CLI's default).
fn default_cert_path() -> PathBuf {
    match std::env::var_os("DOCKER_CERT_PATH").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".docker"),
    }
}

/// Why no client can be made for an endpoint: what to fix, said before any connection.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("{0}")]
    Client(#[source] bollard::errors::Error),
    #[error(
        "https:// needs TLS material: set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (ca.pem, cert.pem, \
         key.pem)"
    )]
    HttpsWithoutTls,
    #[error("{0}")]
    Unsupported(&'static str),
    #[error(
        "the TLS certificate directory {0} does not exist (DOCKER_CERT_PATH, default ~/.docker; it \
         holds ca.pem, cert.pem and key.pem)"
    )]
    NoCertDir(String),
    #[error(
        "cannot read {path} ({source}): the TLS directory must hold ca.pem (the CA that signed the \
         engine's certificate), cert.pem and key.pem (this client's certificate and key)"
    )]
    CertUnreadable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM {marker}")]
    NoPem { path: String, marker: &'static str },
}

struct CertFiles {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// The three files exist and hold PEM: said before any connection, by name, since bollard
/// reads the key only during the handshake and would then fail with a bare I/O error.
fn check_cert_dir(dir: &Path) -> Result<CertFiles, EndpointError> {
    if !dir.is_dir() {
        return Err(EndpointError::NoCertDir(dir.display().to_string()));
    }
    let file = |name: &str, marker: &'static str| -> Result<PathBuf, EndpointError> {
        let path = dir.join(name);
        let text = std::fs::read(&path).map_err(|source| EndpointError::CertUnreadable {
            path: path.display().to_string(),
            source,
        })?;
        if !text.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            return Err(EndpointError::NoPem {
                path: path.display().to_string(),
                marker,
            });
        }
        Ok(path)
    };
    Ok(CertFiles {
        ca: file("ca.pem", "CERTIFICATE")?,
        cert: file("cert.pem", "CERTIFICATE")?,
        key: file("key.pem", "PRIVATE KEY")?,
    })
}

/// The connection failed in TLS (a certificate refused either way), not in reaching the host.
fn is_tls_failure(e: &bollard::errors::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        let text = err.to_string();
        if super::messages::TLS_FAILURE.iter().any(|w| w.in_message(&text)) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// One `--engine` value: `URL[=JOBS][,certs=DIR]`. `certs=DIR` turns TLS on with that
/// directory's `ca.pem`, `cert.pem` and `key.pem`; a `tcp://` URL without it takes
/// `DOCKER_TLS_VERIFY`/`DOCKER_CERT_PATH` from the environment, like `DOCKER_HOST`.
pub fn parse_engine_arg(arg: &str) -> Result<(Engine, Option<usize>), String> {
    let mut parts = arg.split(',');
    let head = parts.next().unwrap_or_default();
    let (url, jobs) = match head.rsplit_once('=') {
        Some((url, n)) => {
            let jobs: usize = n
                .parse()
                .ok()
                .filter(|&j| j > 0)
                .ok_or_else(|| format!("--engine {arg}: JOBS must be a number above 0, not {n:?}"))?;
            (url, Some(jobs))
        }
        None => (head, None),
    };
    if !url.contains("://") {
        return Err(format!(
            "--engine {arg}: expected an endpoint like unix:///var/run/docker.sock or \
             tcp://HOST:2376 (docker context names are not read)"
        ));
    }
    let mut tls = None;
    for opt in parts {
        match opt.split_once('=') {
            Some(("certs", dir)) if !dir.is_empty() => tls = Some(PathBuf::from(dir)),
            _ => {
                return Err(format!(
                    "--engine {arg}: unknown option {opt:?} (the only one is certs=DIR)"
                ));
            }
        }
    }
    let engine = if tls.is_none() && !url.starts_with("unix://") {
        let env = Engine::from_env();
        Engine {
            host: url.to_string(),
            tls: env.tls,
        }
    } else {
        Engine {
            host: url.to_string(),
            tls,
        }
    };
    Ok((engine, jobs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_args_parse_with_jobs_and_certs() {
        let (e, jobs) = parse_engine_arg("unix:///run/d.sock").unwrap();
        assert_eq!(e, Engine::plain("unix:///run/d.sock"));
        assert_eq!(jobs, None);
        assert!(!e.is_remote());
        let (e, jobs) = parse_engine_arg("tcp://127.0.0.1:2376=3,certs=/c").unwrap();
        assert_eq!(e.host, "tcp://127.0.0.1:2376");
        assert_eq!(e.tls.as_deref(), Some(Path::new("/c")));
        assert_eq!(jobs, Some(3));
        assert!(e.is_remote());
        for bad in [
            "docker-desktop",
            "unix:///s=0",
            "unix:///s=x",
            "unix:///s,cert=/c",
            "unix:///s,certs=",
        ] {
            assert!(parse_engine_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_tls_material_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine {
            host: "tcp://127.0.0.1:1".into(),
            tls: Some(dir.path().join("nope")),
        };
        assert!(e.client().unwrap_err().to_string().contains("does not exist"));
        let e = Engine {
            host: "tcp://127.0.0.1:1".into(),
            tls: Some(dir.path().to_path_buf()),
        };
        assert!(e.client().unwrap_err().to_string().contains("ca.pem"));
        std::fs::write(dir.path().join("ca.pem"), "not pem").unwrap();
        assert!(e.client().unwrap_err().to_string().contains("no PEM"));
    }

    #[test]
    fn ssh_and_unknown_schemes_say_what_to_do() {
        let ssh = Engine::plain("ssh://me@host").client().unwrap_err().to_string();
        assert!(ssh.contains("not supported") && ssh.contains("tcp://"), "{ssh}");
        assert!(Engine::plain("ftp://x").client().is_err());
    }
}
