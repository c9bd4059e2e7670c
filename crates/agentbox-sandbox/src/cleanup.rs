//! One owner for everything a run must not leave behind: containers, volumes, create requests
//! still in flight, projects whose after-run host check has not run, and critical sections
//! (`--apply`) that an interruption must wait for.
//!
//! A [`Cleanup`] is created at the edge (`app.rs`) and handed to whatever creates these things,
//! the way a server hands its shutdown handle to each connection. What is created registers;
//! what is removed in the normal course releases its registration; after an interruption or
//! a panic, [`Cleanup::run`] removes what is left. A fresh handle (tests, benchmarks) works the
//! same; nothing runs it unless asked.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bollard::Docker;

use agentbox_hostfs::hostscan::HostGuard;

/// Something a run may have to clean up.
pub enum Resource {
    /// A create request was sent and its answer not seen: if the request's future is dropped
    /// (Ctrl-C), the daemon may still create it, so cleanup looks for it by name.
    Creating {
        docker: Docker,
        name: String,
        volume: bool,
    },
    /// A container; `user` is who tidies the project in it before it goes.
    Container {
        docker: Docker,
        id: String,
        user: String,
    },
    /// An `--isolate` volume. (Volumes that must outlive a run, such as dependency caches,
    /// are never registered here, so no sweep can take them.)
    Volume { docker: Docker, name: String },
    /// A bind-mounted project whose after-run check has not run.
    HostCheck(Arc<HostGuard>),
}

#[derive(Default)]
struct Inner {
    resources: Mutex<BTreeMap<u64, Resource>>,
    next: AtomicU64,
    /// Set once anything asked Docker to create something: only then does cleanup sweep the
    /// daemon by this process's labels.
    created_any: AtomicBool,
    critical: Mutex<()>,
    /// A command handles Ctrl-C itself for now (the chat cancels the request it is waiting for):
    /// the edge leaves SIGINT to it.
    interrupts_claimed: AtomicBool,
    /// The same for SIGTERM (the MCP server ends its session and writes its patch itself).
    termination_claimed: AtomicBool,
    /// Services left by killed processes were swept (see `DockerSandbox::start_services`).
    services_swept: AtomicBool,
    /// [`Cleanup::run`] has begun: nothing may be created any more, since its sweep may be
    /// past already (a background task — the warm pool's refill — would otherwise start a
    /// sandbox after the sweep, and leave it).
    closing: AtomicBool,
}

#[derive(Clone, Default)]
pub struct Cleanup {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.lock().len();
        write!(f, "Cleanup({n} registered)")
    }
}

impl PartialEq for Cleanup {
    /// The same owner.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// See [`Cleanup::claim_interrupts`].
pub struct InterruptClaim(Cleanup);

impl Drop for InterruptClaim {
    fn drop(&mut self) {
        self.0.inner.interrupts_claimed.store(false, Ordering::Release);
    }
}

/// See [`Cleanup::claim_termination`].
pub struct TerminationClaim(Cleanup);

impl Drop for TerminationClaim {
    fn drop(&mut self) {
        self.0.inner.termination_claimed.store(false, Ordering::Release);
    }
}

/// A registered resource; give it back with [`Cleanup::release`] once it is gone.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "release it once the resource is gone, or cleanup will remove it again"]
pub struct Registration(u64);

impl Cleanup {
    /// True the first time only: the run's one sweep of services left by killed processes.
    pub(crate) fn first_service_sweep(&self) -> bool {
        !self.inner.services_swept.swap(true, Ordering::Relaxed)
    }

    /// From now until the guard drops, SIGINT is the caller's to handle, not a reason to stop
    /// the run (SIGTERM still is).
    pub fn claim_interrupts(&self) -> InterruptClaim {
        self.inner.interrupts_claimed.store(true, Ordering::Release);
        InterruptClaim(self.clone())
    }

    pub fn interrupts_claimed(&self) -> bool {
        self.inner.interrupts_claimed.load(Ordering::Acquire)
    }

    /// The same for SIGTERM: the caller ends its work itself, promptly.
    pub fn claim_termination(&self) -> TerminationClaim {
        self.inner.termination_claimed.store(true, Ordering::Release);
        TerminationClaim(self.clone())
    }

    pub fn termination_claimed(&self) -> bool {
        self.inner.termination_claimed.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Resource>> {
        // A panic while holding this lock left the map as it was: still the truth.
        self.inner.resources.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, resource: Resource) -> Registration {
        if matches!(resource, Resource::Creating { .. }) {
            self.inner.created_any.store(true, Ordering::Relaxed);
        }
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, resource);
        Registration(id)
    }

    /// Register a resource about to be created ([`Resource::Creating`]), unless cleanup has
    /// begun: then [`SandboxError::Closing`], and the caller creates nothing. Checked under the
    /// lock [`Cleanup::run`] takes its list under, so a creation is either in that list or
    /// refused.
    pub(crate) fn register_creating(&self, resource: Resource) -> Result<Registration, super::SandboxError> {
        let mut map = self.lock();
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(super::SandboxError::Closing);
        }
        self.inner.created_any.store(true, Ordering::Relaxed);
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        map.insert(id, resource);
        Ok(Registration(id))
    }

    /// The resource is gone (or another registration now stands for it).
    pub fn release(&self, registration: Registration) {
        self.lock().remove(&registration.0);
    }

    /// Swap what a registration stands for, with no moment in which neither is registered
    /// (a create request answered: from "creating NAME" to "container ID").
    pub fn replace(&self, registration: &Registration, resource: Resource) {
        self.lock().insert(registration.0, resource);
    }

    /// Held while the project is being changed all-or-nothing (`--apply`); [`Cleanup::run`]
    /// waits for it, so an interruption never leaves half a change set.
    pub fn critical(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner.critical.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remove everything still registered: containers (tidied first), then what was still
    /// being created, then volumes, then anything of this process the daemon still has by its
    /// labels; then, with nothing of the sandbox left running, the host checks. Returns their
    /// warnings. Waits for a critical section in progress first.
    pub async fn run(&self) -> Vec<String> {
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || drop(this.critical())).await;
        let all: Vec<Resource> = {
            let mut map = self.lock();
            self.inner.closing.store(true, Ordering::Release);
            std::mem::take(&mut *map)
        }
        .into_values()
        // Newest first: a service before the sandbox whose network namespace it is in
        // (Podman refuses to remove a container others depend on).
        .rev()
        .collect();
        let mut creating = Vec::new();
        let mut volumes = Vec::new();
        let mut checks = Vec::new();
        let mut any_docker = None;
        for r in all {
            match r {
                Resource::Container { docker, id, user } => {
                    super::api::tidy(&docker, &id, &user).await;
                    super::api::remove_container(&docker, &id).await;
                    any_docker = Some(docker);
                }
                Resource::Creating { docker, name, volume } => creating.push((docker, name, volume)),
                Resource::Volume { docker, name } => volumes.push((docker, name)),
                Resource::HostCheck(guard) => checks.push(guard),
            }
        }
        for (docker, name, _) in creating.iter().filter(|c| !c.2) {
            super::api::remove_when_it_appears(docker, false, name).await;
        }
        for (docker, name, _) in creating.iter().filter(|c| c.2) {
            super::api::remove_when_it_appears(docker, true, name).await;
        }
        for (docker, name) in volumes {
            super::api::remove_volume(&docker, &name).await;
            any_docker = Some(docker);
        }
        // A create request still in flight when we were interrupted can finish on the daemon's
        // side after we stopped listening for its answer: sweep by our own labels as well (only
        // if this run ever created anything, so other commands exit without a Docker round trip).
        if self.inner.created_any.load(Ordering::Relaxed) {
            let docker = match any_docker.or_else(|| creating.first().map(|c| c.0.clone())) {
                Some(d) => Some(d),
                None => super::connect_docker().await.ok(),
            };
            if let Some(docker) = docker {
                let _ = super::gc::remove_owned_by_this_process(&docker).await;
            }
        }
        checks
            .iter()
            .flat_map(|g| g.finish().map(|c| c.warnings).unwrap_or_default())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_come_and_go_and_replace_without_a_gap() {
        let c = Cleanup::default();
        let guard = Arc::new(HostGuard::finished());
        let a = c.register(Resource::HostCheck(guard.clone()));
        let b = c.register(Resource::HostCheck(guard.clone()));
        assert_eq!(c.lock().len(), 2);
        c.replace(&a, Resource::HostCheck(guard));
        assert_eq!(c.lock().len(), 2);
        c.release(a);
        c.release(b);
        assert!(c.lock().is_empty());
        assert!(!c.inner.created_any.load(Ordering::Relaxed));
        assert_eq!(c.clone(), c, "clones are the same owner");
        assert_ne!(Cleanup::default(), c);
    }

    #[tokio::test]
    async fn nothing_is_created_once_cleanup_has_begun() {
        // A client that never connects: nothing here talks to a daemon.
        let docker =
            Docker::connect_with_http("http://127.0.0.1:9", 1, bollard::API_DEFAULT_VERSION).unwrap();
        let creating = || Resource::Creating {
            docker: docker.clone(),
            name: "x".into(),
            volume: false,
        };
        let before = Cleanup::default();
        let r = before.register_creating(creating()).unwrap();
        before.release(r);
        // Nothing ever created: `run` has no daemon to sweep.
        let c = Cleanup::default();
        assert!(c.run().await.is_empty());
        assert!(matches!(
            c.register_creating(creating()),
            Err(crate::SandboxError::Closing)
        ));
        assert!(c.lock().is_empty());
    }
}
