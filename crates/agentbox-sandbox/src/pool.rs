//! A warm pool (`--pool N`): sandboxes created and started ahead of need, for the faces that
//! start many (eval's tasks), so that a task's sandbox is running when it asks for one.
//!
//! A pooled sandbox is a copy-in sandbox ([`WorkspaceSource::Volume`]) whose volume starts
//! empty: the project arrives through the archive API after it is handed out
//! ([`DockerSandbox::copy_in`]). Everything else is the spec the session asked for, started by
//! [`DockerSandbox::create`] as any sandbox is: the same policy, image, user, limits, runtime,
//! caches, environment and services. The pool is keyed by that whole spec (all but the session,
//! the workspace and the cleanup owner): a request that matches no key is the first of its kind
//! and starts its own, and the pool starts filling for its key.
//!
//! Bounds: at most N per key, ready or starting; and the memory limits of the pooled sandboxes
//! together at most half the engine's memory (the rest is for the sandboxes at work). Each is
//! handed out once, in the order asked for, and never comes back: the session that took it
//! removes it. Each is registered with the run's [`Cleanup`](crate::Cleanup) and labelled with
//! its own session, this process and [`POOL_LABEL`], so an interrupted run removes it and
//! `agentbox gc` finds it after a SIGKILL; [`Pool::close`] removes those never handed out.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bollard::Docker;
use tokio::sync::mpsc;
use tracing::debug;

use super::policy::{SandboxSpec, WorkspaceSource};
use super::{DockerSandbox, Sandbox, SandboxError};

/// Label put on every sandbox the pool starts (besides the session's own).
pub const POOL_LABEL: &str = "agentbox.pool";

type Filled = Result<DockerSandbox, SandboxError>;

/// A handle to the run's pool; clones share it.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool(size {})", self.inner.size)
    }
}

struct Inner {
    docker: Docker,
    size: usize,
    /// Memory limits the pooled sandboxes may hold together, in bytes.
    budget: i64,
    state: Mutex<State>,
    /// An empty tar: what a pooled sandbox's volume is seeded with.
    empty: tempfile::NamedTempFile,
    fills: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    closed: AtomicBool,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Entry>,
    /// The memory limits of every sandbox ready or starting and not yet claimed, all keys.
    held: i64,
}

struct Entry {
    template: SandboxSpec,
    /// Ready or starting, not yet claimed.
    unclaimed: usize,
    tx: mpsc::UnboundedSender<Filled>,
    /// Claimers wait here in turn (tokio's mutex is fair): handed out in the order asked for.
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Filled>>>,
    /// A start failed: no more for this key (the session's own start says why).
    broken: bool,
}

/// What must match for a pooled sandbox to serve `spec`; `None` when it cannot be pooled (a
/// bind-mounted project is mounted at create time).
fn key(spec: &SandboxSpec) -> Option<String> {
    if !matches!(spec.workspace, WorkspaceSource::Volume { .. }) || spec.read_only {
        return None;
    }
    Some(format!(
        "{}|{}:{}|{:?}|{:?}|{}|{}|{:?}|{:?}|{:?}",
        spec.image,
        spec.uid,
        spec.gid,
        spec.limits,
        spec.runtime,
        spec.per_call_exec,
        spec.allow_weak_limits,
        spec.labels,
        spec.extras,
        spec.services,
    ))
}

impl Pool {
    /// A pool of up to `size` sandboxes per key. Nothing starts until the first request.
    pub async fn new(docker: &Docker, size: usize) -> Result<Pool, SandboxError> {
        let total = docker.info().await.ok().and_then(|i| i.mem_total).unwrap_or(0);
        let budget = if total > 0 { total / 2 } else { i64::MAX };
        let mut empty = tempfile::NamedTempFile::new()
            .map_err(|e| SandboxError::Other(format!("cannot write the pool's empty archive: {e}")))?;
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .finish()
            .map_err(|e| SandboxError::Other(format!("cannot write the pool's empty archive: {e}")))?;
        let bytes = builder
            .into_inner()
            .map_err(|e| SandboxError::Other(format!("cannot write the pool's empty archive: {e}")))?;
        empty
            .write_all(&bytes)
            .map_err(|e| SandboxError::Other(format!("cannot write the pool's empty archive: {e}")))?;
        debug!(size, budget, "warm pool");
        Ok(Pool {
            inner: Arc::new(Inner {
                docker: docker.clone(),
                size,
                budget,
                state: Mutex::new(State::default()),
                empty,
                fills: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// A running sandbox for `spec` with an empty workspace, if one of its kind was started
    /// ahead (waiting for one still starting); `None`: start one as usual. Either way, the
    /// pool refills for `spec`'s kind in the background.
    pub async fn take(&self, spec: &SandboxSpec) -> Option<DockerSandbox> {
        let inner = &self.inner;
        if inner.size == 0 || inner.closed.load(Ordering::Acquire) {
            return None;
        }
        let key = key(spec)?;
        let rx = {
            let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            let entry = state.keys.entry(key.clone()).or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                Entry {
                    template: spec.clone(),
                    unclaimed: 0,
                    tx,
                    rx: Arc::new(tokio::sync::Mutex::new(rx)),
                    broken: false,
                }
            });
            let claimed = (entry.unclaimed > 0).then(|| {
                entry.unclaimed -= 1;
                entry.rx.clone()
            });
            if claimed.is_some() {
                state.held -= spec.limits.memory_bytes;
            }
            self.refill(&mut state, &key);
            claimed
        }?;
        match rx.lock().await.recv().await {
            Some(Ok(sb)) => {
                debug!(container = %sb.info().container_id, "handed out from the warm pool");
                Some(sb)
            }
            Some(Err(e)) => {
                debug!(error = %e, "a pooled sandbox did not start");
                None
            }
            None => None,
        }
    }

    /// Start sandboxes of `key`'s kind until it has `size` unclaimed, within the memory budget.
    fn refill(&self, state: &mut State, key: &str) {
        let inner = &self.inner;
        let State { keys, held } = state;
        let Some(entry) = keys.get_mut(key) else { return };
        let memory = entry.template.limits.memory_bytes;
        let mut fills = inner.fills.lock().unwrap_or_else(|e| e.into_inner());
        fills.retain(|f| !f.is_finished());
        while !entry.broken
            && !inner.closed.load(Ordering::Acquire)
            && entry.unclaimed < inner.size
            && held.saturating_add(memory) <= inner.budget
        {
            entry.unclaimed += 1;
            *held += memory;
            let spec = pooled_spec(&entry.template, inner.empty.path());
            let (tx, pool, key) = (entry.tx.clone(), self.clone(), key.to_string());
            fills.push(tokio::spawn(async move {
                let started = DockerSandbox::create(&pool.inner.docker, spec).await;
                if started.is_err() {
                    let mut state = pool.inner.state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(entry) = state.keys.get_mut(&key) {
                        entry.broken = true;
                    }
                }
                // Received by the claimer of this one, or by `close`.
                let _ = tx.send(started);
            }));
        }
    }

    /// Remove every pooled sandbox never handed out, after the starts in flight end. Nothing
    /// starts afterwards.
    pub async fn close(&self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Release);
        let fills = std::mem::take(&mut *inner.fills.lock().unwrap_or_else(|e| e.into_inner()));
        for fill in fills {
            let _ = fill.await;
        }
        let receivers: Vec<_> = {
            let state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            state.keys.values().map(|e| e.rx.clone()).collect()
        };
        for rx in receivers {
            let mut rx = rx.lock().await;
            while let Ok(left) = rx.try_recv() {
                if let Ok(sb) = left {
                    let _ = sb.shutdown().await;
                }
            }
        }
    }
}

/// A sandbox of `template`'s kind: a session of its own, an empty volume, the pool's label.
fn pooled_spec(template: &SandboxSpec, empty: &std::path::Path) -> SandboxSpec {
    let session = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let mut labels = template.labels.clone();
    labels.push((POOL_LABEL.to_string(), "1".to_string()));
    SandboxSpec {
        workspace: WorkspaceSource::Volume {
            name: format!("agentbox-{session}"),
            seed: empty.to_path_buf(),
        },
        session,
        labels,
        ..template.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(workspace: WorkspaceSource) -> SandboxSpec {
        SandboxSpec {
            session: "s".into(),
            image: "agentbox/python:3".into(),
            workspace,
            uid: 1000,
            gid: 1000,
            limits: crate::Limits {
                memory_bytes: 1 << 30,
                cpus: 1.0,
                pids: 256,
                tmp_bytes: 1 << 20,
                home_bytes: 1 << 20,
                shm_bytes: 1 << 20,
                max_file_bytes: 1 << 20,
            },
            runtime: None,
            per_call_exec: false,
            labels: Vec::new(),
            allow_weak_limits: false,
            read_only: false,
            cleanup: Default::default(),
            extras: Default::default(),
            services: Vec::new(),
        }
    }

    fn volume(name: &str) -> WorkspaceSource {
        WorkspaceSource::Volume {
            name: name.into(),
            seed: "/x.tar".into(),
        }
    }

    #[test]
    fn the_key_leaves_out_only_the_session_and_the_workspace() {
        let a = spec(volume("agentbox-a"));
        let mut b = spec(volume("agentbox-b"));
        b.session = "t".into();
        assert_eq!(key(&a), key(&b));
        let mut other = b.clone();
        other.uid = 1001;
        assert_ne!(key(&a), key(&other));
        let mut other = b.clone();
        other.extras.env.push(("A".into(), "1".into()));
        assert_ne!(key(&a), key(&other));
        let mut other = b.clone();
        other.image = "agentbox/go:1".into();
        assert_ne!(key(&a), key(&other));
        let mut other = b.clone();
        other.limits.memory_bytes = 2 << 30;
        assert_ne!(key(&a), key(&other));
    }

    #[test]
    fn a_pooled_spec_has_its_own_session_an_empty_volume_and_the_label() {
        let a = spec(volume("agentbox-a"));
        let p = pooled_spec(&a, std::path::Path::new("/empty.tar"));
        assert_ne!(p.session, a.session);
        assert_eq!(
            p.workspace,
            WorkspaceSource::Volume {
                name: format!("agentbox-{}", p.session),
                seed: "/empty.tar".into()
            }
        );
        assert!(p.labels.contains(&(POOL_LABEL.to_string(), "1".to_string())));
        assert!(p.labels().contains_key(crate::SESSION_LABEL));
    }
}
