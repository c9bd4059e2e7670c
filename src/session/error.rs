//! Why a session could not open, or could not tell what it changed. Each layer's own error is
//! kept whole (its message and its sources print as they would alone); the ones here are the
//! session's own words.

use crate::config::UsageError;
use crate::hostfs::isolate::IsolateError;
use crate::model::ModelError;
use crate::sandbox::SandboxError;
use crate::workspace::FsError;

use super::setup_phase::SetupError;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A bad flag or configuration: exit status 2 (see `app::report_error`).
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// A named environment's record (`--env`).
    #[error(transparent)]
    Env(#[from] crate::envs::EnvError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Isolate(#[from] IsolateError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Work handed to a blocking thread did not come back (it panicked).
    #[error("an internal task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Baseline(#[from] super::baseline::BaselineError),
    /// The change snapshot at the start failed, so no diff can be told.
    #[error(transparent)]
    NoBaseline(std::sync::Arc<super::baseline::BaselineError>),
    #[error("not an isolated session")]
    NotIsolated,
    #[error("cannot stop the background processes: {0}")]
    StopProcesses(String),
    /// `--apply` refused, with why (nothing was written).
    #[error("{0}")]
    Refused(String),
}
