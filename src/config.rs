//! Validated settings, resolved once from the command line and the environment.

use std::path::Path;
use std::time::Duration;

use crate::cli::SandboxArgs;
use crate::sandbox::{Limits, SandboxSpec, parse_size};

/// A bad flag value or configuration: exit status 2, message to the user, no stack trace.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub image: String,
    pub command_timeout: Duration,
    pub limits: Limits,
    pub runtime: Option<String>,
    pub per_call_exec: bool,
}

fn size(flag: &str, value: &str) -> Result<i64, UsageError> {
    parse_size(value).map_err(|e| UsageError(format!("--{flag}: {e}")))
}

impl SandboxConfig {
    pub fn from_args(args: &SandboxArgs) -> Result<Self, UsageError> {
        let host_cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let cpus = match args.cpus {
            None => host_cpus.min(2.0),
            Some(c) if c > 0.0 && c <= host_cpus => c,
            Some(c) => {
                return Err(UsageError(format!(
                    "--cpus {c}: must be more than 0 and at most this machine's {host_cpus} CPUs"
                )));
            }
        };
        let memory = size("memory", &args.memory)?;
        if memory < 64 << 20 {
            return Err(UsageError(
                "--memory: at least 64m is needed to run anything".into(),
            ));
        }
        let limits = Limits {
            memory_bytes: memory,
            cpus,
            pids: args.pids_limit,
            tmp_bytes: size("tmp-size", &args.tmp_size)?,
            max_file_bytes: size("max-file-size", &args.max_file_size)?,
        };
        if args.image.trim().is_empty() {
            return Err(UsageError("--image: must not be empty".into()));
        }
        Ok(SandboxConfig {
            image: args.image.clone(),
            command_timeout: Duration::from_secs(args.command_timeout),
            limits,
            runtime: args.runtime.clone().filter(|r| !r.is_empty()),
            per_call_exec: args.per_call_exec,
        })
    }

    /// The spec for a sandbox with `project` bind-mounted.
    pub fn bind_spec(&self, project: &Path) -> Result<SandboxSpec, crate::sandbox::SandboxError> {
        let (workspace, uid, gid) = crate::sandbox::bind_workspace(project)?;
        Ok(SandboxSpec {
            session: new_session_id(),
            image: self.image.clone(),
            workspace,
            uid,
            gid,
            limits: self.limits.clone(),
            runtime: self.runtime.clone(),
            per_call_exec: self.per_call_exec,
            labels: Vec::new(),
        })
    }
}

pub fn new_session_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}
