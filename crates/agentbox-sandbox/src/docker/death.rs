//! Why a sandbox died: the daemon's events (an `oom`, a `kill`, a `die` with its status) and
//! the memory cgroup's OOM counter, told as one clear error.

use super::*;

impl DockerSandbox {
    /// Why the container died, from the daemon's event log, which outlives the auto-removed
    /// container: an `oom` event and the exit status of its `die` event (`None`: no `die`
    /// event, or no answer). Under runc, commands get the highest OOM score so that an OOM
    /// kill of the sandbox does not happen; when it does anyway (a command lowered its own
    /// score), the user hears "out of memory", not "killed from outside". Under gVisor the
    /// host's OOM killer can only take the whole sandbox (its kernel is one host process).
    pub(crate) async fn death(&self) -> Option<Death> {
        use bollard::query_parameters::EventsOptionsBuilder;
        // What the live watch saw; its `die` can trail the end by a moment.
        for _ in 0..30 {
            let seen = self.events.lock().unwrap_or_else(|p| p.into_inner()).death();
            if seen.is_some() {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let filters = HashMap::from([
            ("container".to_string(), vec![self.info.container_id.clone()]),
            ("type".to_string(), vec!["container".to_string()]),
            (
                "event".to_string(),
                vec!["oom".to_string(), "kill".to_string(), "die".to_string()],
            ),
        ]);
        let look = async {
            // The `die` event can trail the container's end by a moment (seconds on a loaded
            // machine); this runs only once a sandbox has died.
            for _ in 0..25 {
                let until = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let opts = EventsOptionsBuilder::default()
                    .since(&self.created_at.saturating_sub(1).to_string())
                    .until(&until.to_string())
                    .filters(&filters)
                    .build();
                let mut seen = Seen::default();
                let mut events = self.docker.events(Some(opts));
                while let Some(event) = events.next().await {
                    // No answer from the daemon: nothing to learn, and no reason to wait.
                    let Ok(event) = event else { return None };
                    seen.record(event);
                }
                if let Some(death) = seen.death() {
                    return Some(death);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(10), look)
            .await
            .unwrap_or(None)
    }

    /// Its `die` as the live watch saw it, asked again after 2 ms, the pause doubling up to
    /// 50 ms, for up to `within`: for a container that ended on its own a moment ago, whose
    /// `die` is on its way (a one-shot sandbox's end is on its user's path).
    pub(crate) async fn died(&self, within: Duration) -> Option<Death> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            let seen = self.events.lock().unwrap_or_else(|p| p.into_inner()).death();
            if seen.is_some() || started.elapsed() >= within {
                return seen;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// The error for a container that died under a command, said in the words that fit why.
    pub(crate) async fn explain_death(&self, why: String) -> SandboxError {
        // The events can lag or miss the OOM under load (seen under gVisor in CI); the
        // container's own state, while it still exists, says OOMKilled and the exit code too.
        let state = self
            .docker
            .inspect_container(&self.info.container_id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .filter(|s| s.running != Some(true));
        let death = match (self.death().await, state) {
            (Some(mut d), Some(s)) => {
                d.oom |= s.oom_killed == Some(true);
                Some(d)
            }
            (Some(d), None) => Some(d),
            (None, Some(s)) => Some(Death {
                oom: s.oom_killed == Some(true),
                killed: false,
                exit_code: s.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            }),
            (None, None) => None,
        };
        let Some(death) = death else {
            return SandboxError::ContainerGone(why);
        };
        let gvisor = self.runtime.as_deref().filter(|r| crate::is_gvisor(r));
        match (gvisor, death) {
            (
                None,
                Death {
                    oom: true, exit_code, ..
                },
            ) if exit_code == "137" => SandboxError::OutOfMemory(why),
            (Some(runtime), Death { oom: true, .. }) => SandboxError::SandboxOutOfMemory {
                runtime: runtime.to_string(),
                detail: why,
            },
            // gVisor's kernel (the sentry) ends with its own status when the host refuses it a
            // process or thread: measured with Debian's runsc 2022-12 on the ptrace platform,
            // a fork bomb reaching --pids-limit ends the whole sandbox with status 2.
            (
                Some(runtime),
                Death {
                    killed: false,
                    exit_code,
                    ..
                },
            ) if exit_code != "0" && exit_code != "137" => SandboxError::SandboxEnded {
                runtime: runtime.to_string(),
                exit_code,
                detail: why,
            },
            _ => SandboxError::ContainerGone(why),
        }
    }

    /// The memory cgroup's OOM-kill counter (cgroup v2 or v1), read as the keep-alive's uid.
    pub(crate) async fn read_oom_kills(&self) -> Option<i64> {
        let exec = self
            .docker
            .create_exec(
                &self.info.container_id,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", READ_OOM_KILLS]),
                    attach_stdout: Some(true),
                    user: Some("65534:65534"),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        let StartExecResults::Attached { mut output, .. } =
            self.docker.start_exec(&exec.id, None).await.ok()?
        else {
            return None;
        };
        let mut text = Vec::new();
        while let Some(Ok(item)) = output.next().await {
            text.extend_from_slice(item.as_ref());
        }
        parse_oom_kills(&text)
    }
}

/// Prints the memory cgroup's counters, among them `oom_kill N` (cgroup v2, then v1).
pub(crate) const READ_OOM_KILLS: &str =
    "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null";

pub(crate) fn parse_oom_kills(text: &[u8]) -> Option<i64> {
    String::from_utf8_lossy(text)
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
}

/// What [`watch_events`] has seen of one container.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    oom: bool,
    killed: bool,
    /// The `die` event's exit status.
    died_with: Option<String>,
}

impl Seen {
    /// Take in one event; true once the container has ended (`die`, `destroy`).
    pub(crate) fn record(&mut self, event: bollard::models::EventMessage) -> bool {
        match event.action.as_deref() {
            Some("oom") => self.oom = true,
            Some("kill") => self.killed = true,
            Some("die") => {
                let code = event
                    .actor
                    .and_then(|a| a.attributes)
                    .and_then(|a| a.get("exitCode").cloned());
                self.died_with = Some(code.unwrap_or_default());
                return true;
            }
            Some("destroy") => return true,
            _ => {}
        }
        false
    }

    /// How it died, once its `die` has been seen.
    pub(crate) fn death(&self) -> Option<Death> {
        self.died_with.clone().map(|exit_code| Death {
            oom: self.oom,
            killed: self.killed,
            exit_code,
        })
    }
}

/// Follow one container's `oom`, `kill` and `die` events from now on, until it dies or is
/// destroyed (a sandbox dropped without shutdown ends its container too).
pub(crate) fn watch_events(docker: &Docker, cid: &str) -> Arc<Mutex<Seen>> {
    use bollard::query_parameters::EventsOptionsBuilder;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let filters = HashMap::from([
        ("container".to_string(), vec![cid.to_string()]),
        ("type".to_string(), vec!["container".to_string()]),
        (
            "event".to_string(),
            ["oom", "kill", "die", "destroy"].map(String::from).to_vec(),
        ),
    ]);
    let (docker, record) = (docker.clone(), seen.clone());
    tokio::spawn(async move {
        let opts = EventsOptionsBuilder::default().filters(&filters).build();
        let mut events = docker.events(Some(opts));
        while let Some(Ok(event)) = events.next().await {
            if record.lock().unwrap_or_else(|p| p.into_inner()).record(event) {
                return;
            }
        }
    });
    seen
}

/// How a container ended, from its events.
pub(crate) struct Death {
    /// The memory cgroup's OOM killer fired in it.
    pub(super) oom: bool,
    /// It was killed through the API (`docker kill`, `docker rm -f`): from outside.
    killed: bool,
    /// The `die` event's exit status, as the daemon gives it ("137": SIGKILL).
    pub(super) exit_code: String,
}
