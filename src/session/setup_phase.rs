//! The setup phase: before the agent's first turn, install what the project's tests need, in a
//! container of its own whose only way out is the egress proxy, into a cache volume that the
//! agent phase then mounts read-only.
//!
//! The setup container has the same policy, uid and limits as the agent's; what differs is the
//! proxy's socket (forwarded on its loopback by the executor), the proxy variables, and the
//! cache volume mounted writable. A cache whose key (image, uid, commands, and what setup reads:
//! see `project::cache_key`) matches a committed one skips the phase: nothing is downloaded again.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{IsolateSettings, SandboxConfig, SetupSettings};
use crate::egress::{Decision, Proxy};
use crate::events::{Event, EventSink, Fanout};
use crate::project::setup::{self as plan, DEPS_DIR, Phase};
use crate::sandbox::caches::{self, CACHE_LABEL, CacheState};
use crate::sandbox::{
    BASE_PATH, DockerSandbox, EGRESS_PORT, ExecRequest, Extras, Sandbox, SandboxError, VolumeMount,
};

/// What the setup phase needs of a session's settings, the same for every face (`run`, `chat`,
/// `eval`, `exec`, `shell`, `mcp`): the setup flags, and whether the project is copied in
/// (`--isolate`: setup then works on a copy of its own).
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    pub setup: &'a SetupSettings,
    pub isolate: Option<&'a IsolateSettings>,
    /// Say why setup has nothing to install (`run`'s report), or stay quiet then.
    pub say_why_nothing: bool,
}

/// Every decision of the session's proxies, for the report.
pub type EgressLog = Arc<Mutex<Vec<(String, Decision)>>>;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("setup failed: `{command}` ended with {status}{blocked}\n{output}{hint}")]
    Failed {
        command: String,
        status: String,
        output: String,
        /// The proxy's refusals, which usually say why.
        blocked: String,
        /// What to do about a failure agentbox recognises (an untrusted certificate), on a
        /// line of its own; else empty.
        hint: String,
    },
    #[error(transparent)]
    Trust(#[from] super::trust::TrustError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Image(#[from] crate::sandbox::image::ImageError),
    #[error("--refresh-setup: the cache {0} cannot be removed: a run is using it (try again when it ends)")]
    InUse(String),
    #[error("cannot start the egress proxy: {0}")]
    Proxy(std::io::Error),
    #[error("cannot copy the project for setup: {0}")]
    Copy(String),
    #[error("cannot create a scratch project: {0}")]
    Scratch(std::io::Error),
    #[error(
        "{what} cannot run on the remote engine {endpoint}: it needs this machine's egress proxy socket \
         and a bind mount of the project, which a remote engine cannot mount (run without it, or on a \
         local engine)"
    )]
    Remote { what: &'static str, endpoint: String },
}

/// What the agent phase gets from setup.
#[derive(Default)]
pub struct SetupOutcome {
    /// The cache mounted read-only, its environment, and the proxy with `--agent-network
    /// allowlist`.
    pub agent_extras: Extras,
    /// Kept alive for the agent phase (`--agent-network allowlist`), else `None`.
    pub proxy: Option<Proxy>,
    /// The CA bundle the agent phase mounts with `--agent-network allowlist`; removed when
    /// dropped.
    pub ca_bundle: Option<super::trust::Bundle>,
    /// What the report must say (a lockfile setup wrote into the project).
    pub notes: Vec<String>,
}

/// The label of a committed cache whose setup wrote files into the project: a JSON object of
/// each file and its state then (`project::setup::file_state`).
const WRITTEN_LABEL: &str = "agentbox.cache.written-by-setup";

/// Files setup wrote into the project that a cache records, at most; beyond, none are (the
/// next run fills a cache again, as when its key changed).
const MAX_WRITTEN_RECORDED: usize = 64;

/// [`WRITTEN_LABEL`]'s content: each file setup wrote, its state after setup and before
/// (`None`: setup created it).
type Written = BTreeMap<String, (String, Option<String>)>;

/// The proxy variables, set for the setup phase only (and the agent's with `--agent-network
/// allowlist`). `NO_PROXY` is empty on purpose: the host's loopback is reached through the
/// proxy too, where the allowlist decides.
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{EGRESS_PORT}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((name.to_string(), url.clone()));
    }
    env.push(("NO_PROXY".into(), String::new()));
    env.push(("no_proxy".into(), String::new()));
    env
}

/// While set, the proxy's decisions are agentbox's own questions (the cargo probe's refusal),
/// not the setup's: neither shown nor reported.
type Quiet = Arc<std::sync::atomic::AtomicBool>;

fn start_proxy(
    settings: Scope<'_>,
    events: &Arc<Fanout>,
    log: &EgressLog,
    phase: &'static str,
    quiet: Quiet,
) -> Result<Proxy, SetupError> {
    let events = events.clone();
    let log = log.clone();
    let observer: crate::egress::Observer = Arc::new(move |d: &Decision| {
        if quiet.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        events.emit(&Event::Egress {
            phase,
            decision: d.clone(),
        });
        log.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((phase.to_string(), d.clone()));
    });
    crate::egress::start(
        crate::egress::Allowlist::new(settings.setup.allow.clone()),
        crate::egress::Limits::default(),
        Some(observer),
    )
    .map_err(SetupError::Proxy)
}

fn note(events: &Fanout, message: String) {
    events.emit(&Event::Note { message });
}

/// Run the setup phase for `project` (see the module's documentation). `cfg` has the image the
/// session will use.
pub async fn run(
    settings: Scope<'_>,
    cfg: &SandboxConfig,
    project: &Path,
    events: &Arc<Fanout>,
    log: &EgressLog,
) -> Result<SetupOutcome, SetupError> {
    let mut outcome = SetupOutcome::default();
    let setup = settings.setup;
    // An environment's setup reads the environment's manifests where its turns changed them.
    let view = match settings.isolate.and_then(|i| i.env.clone()) {
        Some(name) if !setup.disabled => {
            let root = project.to_path_buf();
            let made = tokio::task::spawn_blocking(move || crate::env_view::for_setup(&name, &root))
                .await
                .map_err(|e| SetupError::Copy(e.to_string()))?;
            match made {
                Ok(view) => view,
                Err(e) => {
                    note(
                        events,
                        format!(
                            "setup: WARNING: the environment's manifests could not be read ({e}): setup reads the project's"
                        ),
                    );
                    None
                }
            }
        }
        _ => None,
    };
    if let Some(v) = &view {
        note(
            events,
            format!(
                "setup: the environment changed what setup reads: setup works on its version of the project ({})",
                v.display()
            ),
        );
    }
    let project = view.as_deref().unwrap_or(project);
    let root = project.to_path_buf();
    let detection = tokio::task::spawn_blocking(move || crate::project::detect(&root))
        .await
        .unwrap_or_default();
    let python = detection
        .ecosystems
        .iter()
        .any(|(e, _)| *e == crate::project::Ecosystem::Python);
    // Given commands may read anything in the project; so may a default that runs the
    // project's own build code. Either way the cache key then digests the whole project.
    let mut runs_project_code = !setup.commands.is_empty();
    let mut commands: Vec<String> = if setup.disabled {
        Vec::new()
    } else if !setup.commands.is_empty() {
        setup.commands.clone()
    } else {
        let defaults = plan::defaults(project, &detection);
        // A face whose stderr is the user's command's (`exec`) says nothing when there is
        // nothing to do.
        if settings.say_why_nothing || !defaults.commands.is_empty() {
            for line in &defaults.notes {
                note(events, format!("setup: {line}"));
            }
        }
        runs_project_code = defaults.runs_project_code;
        defaults.commands.into_iter().map(|(_, c)| c).collect()
    };
    // After the commands, what the tests build (see `Prebuild`): never with `--no-setup`.
    let mut prebuilds = if setup.disabled {
        Vec::new()
    } else {
        plan::Prebuild::for_project(project, &detection)
    };
    // Not in an image whose labels say it lacks the toolchain (the run stops at the test
    // programs' check instead); an image without agentbox's labels gets the pre-build, which
    // says so itself when the tool is missing.
    if !prebuilds.is_empty()
        && let Ok(docker) = crate::sandbox::connect_docker().await
        && let Ok(Some(labels)) = crate::sandbox::image::image_labels(&docker, &cfg.image).await
    {
        let have = crate::toolchain::image_toolchains(&labels);
        if !have.is_empty() {
            prebuilds.retain(|p| have.iter().any(|(t, _)| *t == p.toolchain()));
        }
    }
    // The venv comes first, so every command (a default or `--setup`'s `pip install ...`)
    // runs with it active, as CI's would: the image's pip refuses to install outside one
    // (PEP 668). A project that is not Python gets one only for its given commands, and only
    // where the image can make one.
    if !commands.is_empty() && (python || !setup.commands.is_empty()) {
        note(
            events,
            format!(
                "setup: the venv {} first; every setup command runs with it active (VIRTUAL_ENV, PATH, its pip)",
                plan::VENV
            ),
        );
        commands.insert(
            0,
            if python {
                plan::venv_command()
            } else {
                format!(
                    "command -v python3 >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || exit 0; {}",
                    plan::venv_command()
                )
            },
        );
    }
    let engine = crate::sandbox::engine::current();
    let (commands, prebuilds) = if engine.is_remote() && !(commands.is_empty() && prebuilds.is_empty()) {
        if !setup.commands.is_empty() {
            return Err(SetupError::Remote {
                what: "--setup",
                endpoint: engine.describe(),
            });
        }
        note(
            events,
            format!(
                "setup: skipped on the remote engine {} (it cannot mount the egress proxy's socket); the \
                 agent works without the project's dependencies installed",
                engine.describe()
            ),
        );
        (Vec::new(), Vec::new())
    } else {
        (commands, prebuilds)
    };
    if engine.is_remote() && setup.agent_network {
        return Err(SetupError::Remote {
            what: "--agent-network allowlist",
            endpoint: engine.describe(),
        });
    }
    if setup.disabled {
        super::preflight::report(
            events.as_ref(),
            super::preflight::Step::Setup,
            super::preflight::Outcome::Passed("skipped (--no-setup)".into()),
        );
    }
    if !commands.is_empty() || !prebuilds.is_empty() {
        for p in &prebuilds {
            if settings.say_why_nothing || !commands.is_empty() {
                note(events, format!("setup: {}", p.describe()));
            }
        }
        let docker = crate::sandbox::connect_docker().await?;
        crate::sandbox::image::ensure_image(
            &docker,
            &cfg.image,
            &cfg.cleanup,
            &mut crate::output::stderr_progress,
        )
        .await?;
        let owner = crate::sandbox::inspect_project(project)?;
        let prefix = format!("agentbox-cache-{}", plan::project_key(project));
        // What the pre-builds run is part of what the cache holds.
        let keyed: Vec<String> = commands
            .iter()
            .cloned()
            .chain(prebuilds.iter().map(|p| p.command()))
            .collect();
        let key_of = |as_found: BTreeMap<String, Option<String>>| {
            let (root, image, uid, commands) =
                (project.to_path_buf(), cfg.image.clone(), owner.uid, keyed.clone());
            async move {
                tokio::task::spawn_blocking(move || {
                    plan::cache_key_as_found(&root, &image, uid, &commands, runs_project_code, &as_found)
                })
                .await
                // A key computation that panicked matches no cache: setup runs.
                .unwrap_or_else(|_| uuid::Uuid::new_v4().simple().to_string()[..16].to_string())
            }
        };
        let mut name = format!("{prefix}-{}", key_of(BTreeMap::new()).await);
        // What an earlier setup wrote into the project (a Cargo.lock stable cargo cannot put
        // elsewhere, the version file a build backend writes from VCS metadata) is not the
        // user's: the cache filled before it was there still fits while each such file is as
        // setup left it.
        let mut from_setup: Vec<String> = Vec::new();
        if !setup.refresh && caches::state(&docker, &name).await? != CacheState::Ready {
            let of_project = project.display().to_string();
            for (cache, of) in caches::list(&docker).await? {
                if of != of_project
                    || !cache.starts_with(&format!("{prefix}-"))
                    || cache.ends_with(caches::COMMITTED)
                {
                    continue;
                }
                let Some(wrote) = caches::committed_label(&docker, &cache, WRITTEN_LABEL)
                    .await
                    .and_then(|l| serde_json::from_str::<Written>(&l).ok())
                    .filter(|w| !w.is_empty())
                else {
                    continue;
                };
                let root = project.to_path_buf();
                let files: Vec<String> = wrote.keys().cloned().collect();
                let as_found = wrote
                    .iter()
                    .map(|(f, (_, before))| (f.clone(), before.clone()))
                    .collect();
                let unchanged = tokio::task::spawn_blocking(move || {
                    wrote
                        .iter()
                        .all(|(f, (after, _))| plan::file_state(&root, f) == *after)
                })
                .await
                .unwrap_or(false);
                if unchanged
                    && format!("{prefix}-{}", key_of(as_found).await) == cache
                    && caches::state(&docker, &cache).await? == CacheState::Ready
                {
                    name = cache;
                    from_setup = files;
                    break;
                }
            }
        }
        // From here to the commit, one process per cache: another setup filling it is waited
        // for, and then its fill is used.
        let _filling =
            super::cache_lock::lock(crate::hostfs::hostscan::quarantine::data_dir(), &name, || {
                note(
                    events,
                    format!("setup: another agentbox is filling the cache {name}: waiting for it"),
                )
            })
            .await;
        if setup.refresh {
            // The marker first: a cache without it is never trusted, whatever happens next.
            let marker = format!("{name}-ok");
            if !caches::remove(&docker, &marker).await || !caches::remove(&docker, &name).await {
                return Err(SetupError::InUse(name));
            }
            note(
                events,
                format!("setup: --refresh-setup: the cache {name} is filled again"),
            );
        }
        let labels = HashMap::from([
            (CACHE_LABEL.to_string(), project.display().to_string()),
            ("agentbox.cache.image".to_string(), cfg.image.clone()),
        ]);
        match caches::state(&docker, &name).await? {
            CacheState::Ready => {
                note(
                    events,
                    format!("setup: dependencies from the cache {name} (agentbox gc --caches removes it)"),
                );
                super::preflight::report(
                    events.as_ref(),
                    super::preflight::Step::Setup,
                    super::preflight::Outcome::Passed(format!("cached in {name}")),
                );
            }
            CacheState::Empty => {
                let result = fill(
                    settings,
                    cfg,
                    project,
                    (events, log),
                    &docker,
                    &name,
                    labels,
                    (&commands, &prebuilds),
                    &detection,
                )
                .await;
                if let Ok(wrote) = &result {
                    from_setup = wrote.clone();
                }
                super::preflight::report(
                    events.as_ref(),
                    super::preflight::Step::Setup,
                    super::preflight::Outcome::of(&result, |_| format!("filled {name}")),
                );
                result?;
            }
        }
        if !from_setup.is_empty() {
            let (it, them) = if from_setup.len() == 1 {
                ("it", "it")
            } else {
                ("them", "them")
            };
            let message = format!(
                "{}: written into the project by setup (stable cargo cannot put a lockfile elsewhere; a \
                 build backend writes its version file beside the package); left out of the cache key \
                 and of the run's changes; delete {it} if you do not want {them}",
                from_setup.join(", "),
            );
            note(events, format!("setup: {message}"));
            outcome.notes.push(message);
        }
        outcome.agent_extras.volumes.push(VolumeMount {
            name,
            target: DEPS_DIR.to_string(),
            read_only: true,
        });
        if !prebuilds.is_empty() {
            outcome.agent_extras.seed = Some(plan::BUILD_DIR.to_string());
        }
        outcome.agent_extras.env = plan::env(Phase::Agent, BASE_PATH);
    }
    if setup.agent_network {
        let proxy = start_proxy(settings, events, log, "agent", Quiet::default())?;
        outcome
            .agent_extras
            .forwards
            .push(crate::sandbox::Forward::egress(
                crate::egress::transport::mount_source(&proxy).to_path_buf(),
            ));
        outcome.agent_extras.env.extend(proxy_env());
        if let Some(bundle) = super::trust::bundle(&setup.trust)? {
            outcome.agent_extras.ca_bundle = Some(bundle.path());
            outcome.agent_extras.env.extend(bundle.env());
            outcome.ca_bundle = Some(bundle);
        }
        note(
            events,
            format!(
                "WARNING: --agent-network allowlist: the agent's commands can reach {} through \
                 the HTTP proxy at 127.0.0.1:{} (HTTP_PROXY, HTTPS_PROXY), not directly: a client \
                 that ignores the proxy variables (a database driver) gets no route; for a \
                 database, use --service",
                describe(&proxy),
                crate::sandbox::EGRESS_PORT
            ),
        );
        outcome.proxy = Some(proxy);
    }
    Ok(outcome)
}

fn describe(proxy: &Proxy) -> String {
    let rules: Vec<String> = proxy.allowlist().rules().iter().map(|r| r.to_string()).collect();
    if rules.is_empty() {
        "nothing (the allowlist is empty)".into()
    } else {
        rules.join(", ")
    }
}

/// What a face that opens its own sandbox keeps for as long as the sandbox lives: the agent
/// phase's proxy and CA bundle (`--agent-network allowlist`).
pub struct Prepared {
    _proxy: Option<Proxy>,
    _ca_bundle: Option<super::trust::Bundle>,
}

/// The setup phase for a face that opens its sandbox itself (`exec`, `shell`, `mcp`): the same
/// phase, caches and flags as `run`'s, its progress on stderr (and to `also`). `cfg`, with the
/// session's image, gains what the agent phase mounts (the cache read-only, its environment,
/// and with `--agent-network allowlist` the proxy), beside the forwards it already has.
pub async fn prepare(
    scope: Scope<'_>,
    cfg: &mut SandboxConfig,
    project: &Path,
    also: Vec<Box<dyn EventSink>>,
) -> Result<Prepared, SetupError> {
    let printer = crate::events::Printer::new(crate::events::Redactor::new(Vec::new()));
    let mut sinks: Vec<Box<dyn EventSink>> = vec![Box::new(printer)];
    sinks.extend(also);
    let events = Arc::new(Fanout(sinks));
    let outcome = run(scope, cfg, project, &events, &EgressLog::default()).await?;
    let forwards = std::mem::take(&mut cfg.extras.forwards);
    cfg.extras = outcome.agent_extras;
    cfg.extras.forwards.extend(forwards);
    Ok(Prepared {
        _proxy: outcome.proxy,
        _ca_bundle: outcome.ca_bundle,
    })
}

/// Fill the cache `name`: a setup container, the registries asked of the image's tools, the
/// commands in turn. Committed only if every command succeeds; removed otherwise.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the phase's whole context"
)]
async fn fill(
    settings: Scope<'_>,
    cfg: &SandboxConfig,
    project: &Path,
    (events, log): (&Arc<Fanout>, &EgressLog),
    docker: &bollard::Docker,
    name: &str,
    labels: HashMap<String, String>,
    (commands, prebuilds): (&[String], &[plan::Prebuild]),
    detection: &crate::project::Detection,
) -> Result<Vec<String>, SetupError> {
    let started = Instant::now();
    // Before the proxy and the container: a bad --ca-cert is the user's to fix, and costs nothing.
    let bundle = super::trust::bundle(&settings.setup.trust)?;
    let quiet = Quiet::default();
    let proxy = start_proxy(settings, events, log, "setup", quiet.clone())?;
    let mut setup_cfg = cfg.clone();
    // Services are the agent's, for its tests: setup installs, it does not test.
    setup_cfg.services.clear();
    setup_cfg.extras = Extras {
        forwards: vec![crate::sandbox::Forward::egress(
            crate::egress::transport::mount_source(&proxy).to_path_buf(),
        )],
        volumes: vec![VolumeMount {
            name: name.to_string(),
            target: DEPS_DIR.to_string(),
            read_only: false,
        }],
        env: plan::env(Phase::Setup, BASE_PATH)
            .into_iter()
            .chain(proxy_env())
            .chain(bundle.iter().flat_map(|b| b.env()))
            .collect(),
        workspace_read_only: false,
        ca_bundle: bundle.as_ref().map(|b| b.path()),
        seed: None,
    };
    // `--isolate` promises the project is only read until `--apply`: setup works on a copy,
    // as the agent does, so what installing writes into the tree (an editable install's
    // `.egg-info`, a generated `Cargo.lock`) goes with that copy instead of failing on a
    // read-only mount. The agent phase gets a fresh copy of its own.
    let _seed;
    let spec = match &settings.isolate {
        Some(iso) => {
            let dir = crate::sandbox::inspect_project(project)?;
            let root = project.to_path_buf();
            let exclude = iso.exclude.clone();
            let packed = tokio::task::spawn_blocking(move || {
                crate::hostfs::isolate::pack(&root, dir.uid, dir.gid, &|p| {
                    exclude.iter().any(|e| e.as_bytes() == p.as_bytes())
                })
            })
            .await
            .map_err(|e| SetupError::Copy(e.to_string()))?
            .map_err(|e| SetupError::Copy(e.to_string()))?;
            let spec = setup_cfg.volume_spec(project, packed.tar.path())?;
            _seed = packed;
            spec
        }
        None => setup_cfg.bind_spec(project)?,
    };
    note(
        events,
        format!(
            "setup: egress proxy on {}",
            crate::egress::transport::mount_source(&proxy).display()
        ),
    );
    match &bundle {
        Some(b) => note(
            events,
            format!("setup: TLS trusts the image's CAs and {}", b.describe()),
        ),
        None => note(events, "setup: TLS trusts the image's CAs only".to_string()),
    }
    // The project as setup finds it, when setup writes into it (bind-mounted, not a copy).
    let states_before = if settings.isolate.is_none() {
        let root = project.to_path_buf();
        tokio::task::spawn_blocking(move || plan::file_states(&root))
            .await
            .ok()
            .flatten()
    } else {
        None
    };
    let registration = caches::create(docker, &spec, name, labels.clone()).await?;
    let sandbox = match DockerSandbox::create(docker, spec.clone()).await {
        Ok(sb) => sb,
        Err(e) => {
            caches::discard(docker, &spec, name, registration).await;
            return Err(e.into());
        }
    };
    let result = run_commands(
        settings,
        &sandbox,
        (&proxy, &quiet),
        events,
        (commands, prebuilds),
        detection,
        started,
        bundle.as_ref(),
    )
    .await;
    let _ = sandbox.shutdown().await;
    if let Some(check) = sandbox.check_host() {
        for w in check.warnings {
            note(events, format!("WARNING: {w}"));
        }
    }
    match result {
        Ok(()) => {
            let mut labels = labels;
            // What setup wrote into the project goes with the cache (see `run`); past a bound
            // none of it is recorded, and the next run fills a cache again.
            let wrote = match states_before {
                Some(before) => {
                    let root = project.to_path_buf();
                    tokio::task::spawn_blocking(move || {
                        plan::file_states(&root).map(|after| plan::written(&before, &after))
                    })
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_default()
                }
                None => BTreeMap::new(),
            };
            let recorded = (!wrote.is_empty() && wrote.len() <= MAX_WRITTEN_RECORDED)
                .then(|| serde_json::to_string(&wrote).ok())
                .flatten();
            if let Some(json) = recorded {
                labels.insert(WRITTEN_LABEL.to_string(), json);
            }
            let files: Vec<String> = if labels.contains_key(WRITTEN_LABEL) {
                wrote.into_keys().collect()
            } else {
                Vec::new()
            };
            caches::commit(docker, &spec, name, labels, registration).await?;
            note(
                events,
                format!(
                    "setup: done in {:.1}s; cached in {name}",
                    started.elapsed().as_secs_f64()
                ),
            );
            Ok(files)
        }
        Err(e) => {
            caches::discard(docker, &spec, name, registration).await;
            Err(e)
        }
    }
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the phase's whole context"
)]
async fn run_commands(
    settings: Scope<'_>,
    sandbox: &DockerSandbox,
    (proxy, quiet): (&Proxy, &Quiet),
    events: &Arc<Fanout>,
    (commands, prebuilds): (&[String], &[plan::Prebuild]),
    detection: &crate::project::Detection,
    started: Instant,
    bundle: Option<&super::trust::Bundle>,
) -> Result<(), SetupError> {
    let ecosystems: Vec<crate::project::Ecosystem> = detection.ecosystems.iter().map(|(e, _)| *e).collect();
    let found = default_registries(
        sandbox,
        (proxy, quiet),
        &ecosystems,
        &sandbox.info().image,
        !settings.setup.no_default_registries,
    )
    .await;
    let env = found.env;
    for n in found.notes {
        note(events, n);
    }
    note(events, format!("setup: egress allowed to {}", describe(proxy)));
    let deadline = started + settings.setup.timeout;
    for command in commands {
        let left = deadline.saturating_duration_since(Instant::now());
        note(events, format!("setup: running `{command}`"));
        let seen = proxy.decisions().len();
        let (out, output) = run_logged(sandbox, events, command, command, left, &env).await?;
        if !out.success() {
            let blocked = crate::egress::refusals(&proxy.decisions()[seen..]);
            let status = if out.timed_out {
                format!(
                    "the setup timeout ({}s, --setup-timeout): it and everything it started were killed",
                    settings.setup.timeout.as_secs()
                )
            } else {
                out.status_line()
            };
            let hint = if crate::messages::is_certificate_failure(&output) {
                format!(
                    "\nhint: {}",
                    super::trust::certificate_hint(bundle, &settings.setup.trust)
                )
            } else {
                String::new()
            };
            return Err(SetupError::Failed {
                command: command.clone(),
                status,
                output,
                blocked: if blocked.is_empty() {
                    String::new()
                } else {
                    format!("; the egress proxy refused: {}", blocked.join("; "))
                },
                hint,
            });
        }
    }
    for p in prebuilds {
        let left = deadline.saturating_duration_since(Instant::now());
        let begun = Instant::now();
        let label = match p {
            plan::Prebuild::Rust => "the Rust pre-build",
            plan::Prebuild::Go => "the Go pre-build",
        };
        let (out, output) = run_logged(sandbox, events, label, &p.command(), left, &env).await?;
        if out.success() {
            note(
                events,
                format!("setup: {label} done in {:.1}s", begun.elapsed().as_secs_f64()),
            );
            continue;
        }
        // Not setup's failure: the agent phase builds what is missing, as it would without a
        // cache (a package that does not compile may be the very bug to fix).
        let why = output
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default();
        note(
            events,
            format!(
                "setup: {label} ended with {}: {why}; the agent phase builds what is missing",
                out.status_line()
            ),
        );
        // The skeleton's own stubs may still be there when it did not end by itself: an
        // artifact of a stub would pass for the project's crate (cargo trusts its mtimes).
        if *p == plan::Prebuild::Rust && (out.timed_out || out.exit_code != 1) {
            let target = format!("{}/{}", plan::BUILD_DIR, plan::CARGO_TARGET);
            harness_step(
                sandbox,
                vec!["rm".into(), "-rf".into(), target],
                Duration::from_secs(120),
            )
            .await?;
        }
    }
    // Every tool's directory exists before the cache turns read-only: a tool that finds its
    // home missing would try to create it, and fail, in the agent phase.
    let mkdir = ["mkdir", "-p"]
        .into_iter()
        .map(String::from)
        .chain(["cargo", "go-mod", "npm"].map(|d| format!("{DEPS_DIR}/{d}")))
        .collect();
    harness_step(sandbox, mkdir, Duration::from_secs(30)).await
}

/// One of setup's own commands (not the project's): its failure is setup's, with its stderr.
async fn harness_step(
    sandbox: &DockerSandbox,
    argv: Vec<String>,
    timeout: Duration,
) -> Result<(), SetupError> {
    let out = sandbox.exec(ExecRequest::argv(argv.clone(), timeout)).await?;
    if out.success() {
        return Ok(());
    }
    Err(SetupError::Failed {
        command: argv.join(" "),
        status: out.status_line(),
        output: out.stderr.to_text(),
        blocked: String::new(),
        hint: String::new(),
    })
}

/// Run one setup step with its output followed live and kept (see `run_commands`); `shown` is
/// what the events call it. The output is merged stdout and stderr.
async fn run_logged(
    sandbox: &DockerSandbox,
    events: &Arc<Fanout>,
    shown: &str,
    command: &str,
    left: Duration,
    env: &[(String, String)],
) -> Result<(crate::sandbox::ExecOutput, String), SetupError> {
    let follower = follow_output(sandbox, events).await;
    // The output goes to a file the follower streams from, and is printed from it once the
    // command is done (for the verdict's capture). Not through a pipe to `tee`: a daemon the
    // command leaves holding the pipe would keep tee, and so the command, running until
    // --setup-timeout. Like an agent's command, this one ends when its own process does, and
    // the executor's sweep then ends whatever it left behind. A subshell, so that an `exit` in
    // the command still leaves its output printed; its status is the verdict.
    let wrapped = format!(
        "o=$(stat -c %s {SETUP_LOG} 2>/dev/null || echo 0)\n( {command}\n) >> {SETUP_LOG} 2>&1\n\
         s=$?\ntail -c +$((o + 1)) {SETUP_LOG}\nexit $s"
    );
    let mut req = ExecRequest::shell(wrapped, left.max(Duration::from_secs(1))).capture(16 * 1024, 48 * 1024);
    req.env = env.to_vec();
    let out = sandbox.exec(req).await;
    let mut followed = 0;
    if let Some((mut task, printed)) = follower {
        // The sweep after the command ended the follower; let it print what it had.
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
            let _ = task.await;
        }
        followed = printed.load(std::sync::atomic::Ordering::SeqCst);
    }
    let out = out?;
    show_missed_lines(events, &out.stdout, followed);
    let output = merge(&out.stdout.to_text(), &out.stderr.to_text());
    events.emit(&Event::SetupOutput {
        command: shown.to_string(),
        status: out.status_line(),
        output: output.clone(),
    });
    Ok((out, output))
}

/// Where a setup command's output is written as it runs, for the follower.
const SETUP_LOG: &str = "/run/agentbox/setup-output";

/// Lines of one command shown as they come.
const MAX_LIVE_LINES: usize = 2000;

/// Stream what the next command writes to [`SETUP_LOG`] as `Event::SetupLine`s, with the count
/// of complete lines printed so far. `None` if it cannot (the output is still in the error when
/// the command fails).
async fn follow_output(
    sandbox: &DockerSandbox,
    events: &Arc<Fanout>,
) -> Option<(tokio::task::JoinHandle<()>, Arc<std::sync::atomic::AtomicUsize>)> {
    let truncate = ExecRequest::argv(["sh", "-c", &format!(": > {SETUP_LOG}")], Duration::from_secs(30));
    if !sandbox.exec(truncate).await.ok()?.success() {
        return None;
    }
    let stream = sandbox.follow(SETUP_LOG).await.ok()?;
    let events = events.clone();
    // Complete lines seen so far, read after the task ended or was aborted.
    let printed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = printed.clone();
    let task = tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut stream = Box::pin(stream);
        let mut pending: Vec<u8> = Vec::new();
        let mut shown = 0usize;
        while let Some(chunk) = stream.next().await {
            pending.extend_from_slice(&chunk);
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                // Bounded: past this, a flood is summed up, not printed.
                if shown < MAX_LIVE_LINES {
                    events.emit(&Event::SetupLine {
                        line: String::from_utf8_lossy(&line[..line.len() - 1]).into_owned(),
                    });
                }
                shown += 1;
                counter.store(shown, std::sync::atomic::Ordering::SeqCst);
            }
            if pending.len() > 64 * 1024 {
                pending.clear();
            }
        }
        if shown > MAX_LIVE_LINES {
            events.emit(&Event::SetupLine {
                line: format!(
                    "... {} more lines (the trajectory has the head and the tail)",
                    shown - MAX_LIVE_LINES
                ),
            });
        }
    });
    Some((task, printed))
}

/// Print the lines of a finished command's output the follower did not get to: the sweep after
/// the command may end the follower's `tail` before it read the last writes (or before it
/// started, for a command that ends at once), and what a setup command printed is shown either
/// way. `shown` counts the complete lines the follower printed. When the capture lost its
/// middle, the lines cannot be lined up with the follower's, and only a follower that printed
/// nothing is made up for (with the head and the tail).
fn show_missed_lines(events: &Arc<Fanout>, captured: &crate::sandbox::Captured, shown: usize) {
    if shown >= MAX_LIVE_LINES || (captured.truncated() && shown > 0) {
        return;
    }
    let text = captured.to_text();
    for line in text.lines().skip(shown).take(MAX_LIVE_LINES - shown) {
        events.emit(&Event::SetupLine {
            line: line.to_string(),
        });
    }
}

/// What [`default_registries`] found.
#[derive(Debug, Default)]
pub(crate) struct Registries {
    /// Host rules (`HOST` or `HOST:PORT`).
    pub hosts: Vec<String>,
    /// Variables setup runs with (Go's own `GOPROXY`/`GOSUMDB`, not the sandbox's `off`).
    pub env: Vec<(String, String)>,
    /// What was learned and how, for the user.
    pub notes: Vec<String>,
}

/// The registries the image's package managers use by default, asked of the tools in the
/// image from a directory outside the project (whose own config files are not trusted). Cargo
/// cannot say: it is probed (an empty directory, an empty `CARGO_HOME`, the proxy allowing
/// nothing; the host it asks for is its index, whose `config.json` names the download host),
/// and what was learned is kept per image (`image`: its name, for the image's id) in the data
/// directory. With `allow`, every host found is allowed in `proxy` before this returns;
/// without it (`--no-default-registries`) only Go's variables are wanted, and nothing is probed.
pub(crate) async fn default_registries(
    sandbox: &DockerSandbox,
    (proxy, quiet): (&Proxy, &Quiet),
    ecosystems: &[crate::project::Ecosystem],
    image: &str,
    allow: bool,
) -> Registries {
    use crate::project::Ecosystem;
    let mut found = Registries::default();
    for eco in ecosystems {
        if *eco == Ecosystem::Rust {
            if !allow {
                continue;
            }
            let hosts = cargo_registry(sandbox, proxy, quiet, image).await;
            match &hosts {
                Ok((hosts, how)) => found
                    .notes
                    .push(format!("setup: cargo's registry ({how}): {}", hosts.join(", "))),
                Err(why) => found.notes.push(format!(
                    "setup: cargo's registry is unknown ({why}); allow it with --allow-host"
                )),
            }
            if let Ok((hosts, _)) = hosts {
                for h in hosts {
                    if !found.hosts.contains(&h) {
                        found.hosts.push(h);
                    }
                }
            }
            continue;
        }
        let Some(question) = plan::registry_question(*eco) else {
            continue;
        };
        let mut req = ExecRequest::shell(question, Duration::from_secs(60)).capture(4096, 0);
        req.workdir = Some("/tmp".into());
        let Ok(out) = sandbox.exec(req).await else {
            continue;
        };
        if !out.success() {
            continue;
        }
        let answer = out.stdout.to_text();
        if *eco == Ecosystem::Go {
            // The sandbox says GOPROXY=off; setup uses the image's own default.
            let mut lines = answer.lines();
            for name in ["GOPROXY", "GOSUMDB"] {
                if let Some(v) = lines.next().filter(|v| !v.trim().is_empty()) {
                    found.env.push((name.to_string(), v.trim().to_string()));
                }
            }
        }
        for h in plan::hosts_from_answer(&answer) {
            if !found.hosts.contains(&h) {
                found.hosts.push(h);
            }
        }
    }
    if allow {
        proxy.allow(
            found
                .hosts
                .iter()
                .filter_map(|h| h.parse::<crate::egress::Rule>().ok()),
        );
    }
    found
}

/// Where what the cargo probe learned is kept: one file per image id.
fn learned_path(image_id: &str) -> Option<std::path::PathBuf> {
    let id: String = image_id
        .trim_start_matches("sha256:")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(64)
        .collect();
    (!id.is_empty()).then(|| {
        crate::hostfs::hostscan::quarantine::data_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("registries")
            .join(format!("cargo-{id}"))
    })
}

/// Cargo's registry hosts: from the file kept for this image, else probed (see
/// [`default_registries`]). The hosts, and how they were learned.
async fn cargo_registry(
    sandbox: &DockerSandbox,
    proxy: &Proxy,
    quiet: &Quiet,
    image: &str,
) -> Result<(Vec<String>, &'static str), String> {
    let image_id = match crate::sandbox::connect_docker().await {
        Ok(docker) => docker.inspect_image(image).await.ok().and_then(|i| i.id),
        Err(_) => None,
    };
    let kept = image_id.as_deref().and_then(learned_path);
    if let Some(path) = &kept
        && let Ok(text) = std::fs::read_to_string(path)
    {
        let hosts: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|h| h.parse::<crate::egress::Rule>().is_ok())
            .map(String::from)
            .collect();
        if !hosts.is_empty() {
            return Ok((hosts, "learned from this image before"));
        }
    }
    use std::sync::atomic::Ordering;
    let seen = proxy.decisions().len();
    quiet.store(true, Ordering::SeqCst);
    let mut probe = ExecRequest::shell(plan::cargo_probe(), Duration::from_secs(90)).capture(4096, 4096);
    probe.workdir = Some("/tmp".into());
    let probed = sandbox.exec(probe).await;
    quiet.store(false, Ordering::SeqCst);
    probed.map_err(|e| format!("the probe failed: {e}"))?;
    let Some(index) = proxy.decisions()[seen..]
        .iter()
        .find(|d| !d.allowed && d.method == "CONNECT")
        .map(|d| {
            if d.port == 443 {
                d.host.clone()
            } else {
                format!("{}:{}", d.host, d.port)
            }
        })
    else {
        return Err("cargo asked the proxy for nothing".into());
    };
    let mut hosts = vec![index.clone()];
    if let Ok(rule) = index.parse::<crate::egress::Rule>() {
        proxy.allow(vec![rule]);
    }
    // The download host, from the index's own configuration.
    let mut ask = ExecRequest::argv(
        [
            "python3".to_string(),
            "-c".to_string(),
            plan::CARGO_INDEX_CONFIG.to_string(),
            format!("https://{index}/"),
        ],
        Duration::from_secs(60),
    )
    .capture(4096, 4096);
    ask.workdir = Some("/tmp".into());
    if let Ok(out) = sandbox.exec(ask).await
        && out.success()
    {
        for h in plan::hosts_from_answer(out.stdout.to_text().split('{').next().unwrap_or_default()) {
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
    }
    if let Some(path) = &kept {
        let _ = write_atomic(path, format!("{}\n", hosts.join("\n")).as_bytes());
    }
    Ok((hosts, "asked of the image's cargo"))
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(data)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn merge(stdout: &str, stderr: &str) -> String {
    match (stdout.trim().is_empty(), stderr.trim().is_empty()) {
        (_, true) => stdout.to_string(),
        (true, false) => stderr.to_string(),
        (false, false) => format!("{stdout}\n{stderr}"),
    }
}

/// What `doctor` learned of one registry setup would use.
#[derive(Debug, Clone, PartialEq)]
pub enum TlsVerdict {
    /// The handshake verified (whatever the server then answered).
    Verified,
    /// The certificate was not trusted: the image's CAs and what was passed in do not vouch
    /// for it. The client's words.
    Untrusted(String),
    /// Not reached (the proxy refused, no route, a timeout): says nothing of TLS.
    Unreachable(String),
}

/// `doctor`'s registry check: each host and its verdict, what was learned on the way, and
/// what to do if a certificate was not trusted.
#[derive(Debug, Default)]
pub struct TlsCheck {
    pub results: Vec<(String, TlsVerdict)>,
    pub notes: Vec<String>,
    /// What the sandbox trusted besides the image's CAs.
    pub trusted: String,
    /// The certificate hint setup itself would give.
    pub hint: String,
}

/// A TLS handshake with each `HOST[:PORT]` given, through the proxy named by the sandbox's
/// environment, with the sandbox's trust (OpenSSL's default paths read `SSL_CERT_FILE`). A
/// server that answers at all, with any status, has passed verification.
const TLS_PROBE: &str = r#"
import ssl, sys, urllib.error, urllib.request
for host in sys.argv[1:]:
    try:
        urllib.request.urlopen(urllib.request.Request("https://" + host + "/", method="HEAD"), timeout=20).close()
        verdict, why = "ok", ""
    except urllib.error.HTTPError:
        verdict, why = "ok", ""
    except Exception as e:
        reason = getattr(e, "reason", e)
        untrusted = isinstance(reason, ssl.SSLCertVerificationError) or isinstance(e, ssl.SSLCertVerificationError)
        verdict, why = ("untrusted" if untrusted else "unreachable"), str(reason)
    print(host, verdict, " ".join(why.split())[:300], sep="\t", flush=True)
"#;

/// From a sandbox of `cfg`'s image, through an egress proxy allowing what setup would allow
/// (the image's default registries for `ecosystems`, unless `--no-default-registries`, and
/// the given rules) and trusting what setup would trust: does TLS to each registry verify?
/// Host names and addresses among the given rules are checked too (a range or `*.SUFFIX` names
/// no server).
pub async fn check_registry_tls(
    cfg: &SandboxConfig,
    setup: &crate::config::SetupSettings,
    ecosystems: &[crate::project::Ecosystem],
) -> Result<TlsCheck, SetupError> {
    let engine = crate::sandbox::engine::current();
    if engine.is_remote() {
        return Err(SetupError::Remote {
            what: "the setup phase (and so its TLS check)",
            endpoint: engine.describe(),
        });
    }
    let bundle = super::trust::bundle(&setup.trust)?;
    let proxy = crate::egress::start(
        crate::egress::Allowlist::new(setup.allow.clone()),
        crate::egress::Limits::default(),
        None,
    )
    .map_err(SetupError::Proxy)?;
    let scratch = tempfile::Builder::new()
        .prefix("agentbox-doctor-tls-")
        .tempdir()
        .map_err(SetupError::Scratch)?;
    let mut check_cfg = cfg.clone();
    check_cfg.services.clear();
    check_cfg.extras = Extras {
        forwards: vec![crate::sandbox::Forward::egress(
            crate::egress::transport::mount_source(&proxy).to_path_buf(),
        )],
        volumes: Vec::new(),
        env: proxy_env()
            .into_iter()
            .chain(bundle.iter().flat_map(|b| b.env()))
            .collect(),
        workspace_read_only: true,
        ca_bundle: bundle.as_ref().map(|b| b.path()),
        seed: None,
    };
    let spec = check_cfg.bind_spec(scratch.path())?;
    let docker = crate::sandbox::connect_docker().await?;
    let sandbox = DockerSandbox::create(&docker, spec).await?;
    let mut check = TlsCheck {
        trusted: match &bundle {
            Some(b) => b.describe(),
            None => "nothing besides the image's CAs".into(),
        },
        hint: super::trust::certificate_hint(bundle.as_ref(), &setup.trust),
        ..TlsCheck::default()
    };
    let found = default_registries(
        &sandbox,
        (&proxy, &Quiet::default()),
        ecosystems,
        &cfg.image,
        !setup.no_default_registries,
    )
    .await;
    check.notes = found.notes;
    let mut hosts = if setup.no_default_registries {
        Vec::new()
    } else {
        found.hosts
    };
    use crate::egress::matcher::HostPattern;
    for rule in &setup.allow {
        let host = rule.to_string();
        if matches!(rule.host, HostPattern::Exact(_) | HostPattern::Ip(_)) && !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    let result = if hosts.is_empty() {
        Ok(())
    } else {
        let mut argv = vec!["python3".to_string(), "-c".to_string(), TLS_PROBE.to_string()];
        argv.extend(hosts.iter().cloned());
        let limit = Duration::from_secs(30 * hosts.len() as u64 + 10);
        let mut req = ExecRequest::argv(argv, limit).capture(64 * 1024, 4096);
        req.workdir = Some("/tmp".into());
        sandbox.exec(req).await.map(|out| {
            let text = out.stdout.to_text();
            for host in &hosts {
                let line = text.lines().find_map(|l| {
                    let mut parts = l.splitn(3, '\t');
                    (parts.next() == Some(host.as_str())).then(|| (parts.next(), parts.next().unwrap_or("")))
                });
                let verdict = match line {
                    Some((Some("ok"), _)) => TlsVerdict::Verified,
                    Some((Some("untrusted"), why)) => TlsVerdict::Untrusted(why.to_string()),
                    Some((_, why)) => TlsVerdict::Unreachable(why.to_string()),
                    None => TlsVerdict::Unreachable(format!(
                        "the check did not finish ({})",
                        merge(&text, &out.stderr.to_text()).trim()
                    )),
                };
                check.results.push((host.clone(), verdict));
            }
        })
    };
    let _ = sandbox.shutdown().await;
    result?;
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventSink, Fanout};
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    impl EventSink for Lines {
        fn emit(&self, event: &Event<'_>) {
            if let Event::SetupLine { line } = event
                && let Ok(mut lines) = self.0.lock()
            {
                lines.push(line.clone());
            }
        }
    }

    fn shown_after(captured: &crate::sandbox::Captured, follower_showed: usize) -> Vec<String> {
        let lines = Lines::default();
        let events = Arc::new(Fanout(vec![Box::new(lines.clone())]));
        show_missed_lines(&events, captured, follower_showed);
        lines.0.lock().map(|l| l.clone()).unwrap_or_default()
    }

    #[test]
    fn what_the_follower_missed_is_printed_once_from_the_capture() {
        let out = crate::sandbox::Captured::complete(b"setup says\nsetup warns\nlast, no newline".to_vec());
        // The sweep ended the follower before it read anything (a command that ends at once).
        assert_eq!(
            shown_after(&out, 0),
            ["setup says", "setup warns", "last, no newline"]
        );
        // It printed the first line: the rest follows, nothing twice.
        assert_eq!(shown_after(&out, 1), ["setup warns", "last, no newline"]);
        // It printed every complete line: only the unfinished last one is left.
        assert_eq!(shown_after(&out, 2), ["last, no newline"]);

        // A capture that lost its middle cannot be lined up with what was printed.
        let mut cut = crate::sandbox::HeadTail::new(8, 8);
        cut.push(b"first line\nmiddle\nmiddle\nlast line\n");
        let cut = cut.finish();
        assert!(cut.truncated());
        assert!(shown_after(&cut, 1).is_empty());
        let all = shown_after(&cut, 0);
        assert!(all.first().is_some_and(|l| l.starts_with("first li")), "{all:?}");
        assert!(all.iter().any(|l| l.contains("cut")), "{all:?}");
    }
}
