//! Validated settings, resolved once from the command line and the environment.

use std::path::Path;
use std::time::Duration;

use crate::cli::{AgentArgs, ModelArgs, Provider, SandboxArgs, ToolProtocol};
use crate::model::anthropic::Anthropic;
use crate::model::openai::OpenAi;
use crate::model::retry::RetryPolicy;
use crate::model::scripted::Scripted;
use crate::model::text_protocol::TextProtocol;
use crate::model::{HttpSettings, ModelClient, ModelError, RetryObserver, ToolChoice};
use crate::sandbox::services::{ServiceKind, ServiceSpec};
use crate::sandbox::{Limits, MIN_MEMORY, MemoryBudget, SandboxSpec, human_bytes, parse_size};

/// A bad flag value or configuration: exit status 2, message to the user, no stack trace.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A command's time limit when neither `--command-timeout` nor the image says otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// The image sandboxes start from: the one given, or [`DEFAULT_IMAGE`] until a session
    /// chooses one for its project (`session::choose_image`).
    ///
    /// [`DEFAULT_IMAGE`]: crate::sandbox::image::DEFAULT_IMAGE
    pub image: String,
    /// Where the user named the image (`--image`, `AGENTBOX_IMAGE`, the config file, a task's
    /// `task.toml`); `None`: not named, so it is chosen from the project.
    pub image_source: Option<String>,
    /// `--command-timeout`, or [`DEFAULT_COMMAND_TIMEOUT`] when it was not given; see
    /// [`SandboxConfig::command_timeout_for`].
    pub command_timeout: Duration,
    /// Whether `--command-timeout` (or its variable, or the config file) set it.
    pub command_timeout_given: bool,
    pub limits: Limits,
    pub runtime: Option<String>,
    pub per_call_exec: bool,
    /// `--allow-weak-limits`: start where the engine cannot enforce the limits, loudly.
    pub allow_weak_limits: bool,
    /// The run's cleanup owner (from `app.rs`), handed to every sandbox this config starts.
    pub cleanup: crate::sandbox::Cleanup,
    /// Egress socket and dependency caches for the sandboxes this config starts (the session
    /// sets them; none by default).
    pub extras: crate::sandbox::Extras,
    /// `--host-scan-limit`, `--host-scan-timeout`: how far the host's scans of a bind-mounted
    /// project go.
    pub host_scan: crate::hostfs::hostscan::ScanBounds,
    /// `--service`: servers started beside every sandbox of the agent (not setup's).
    pub services: Vec<ServiceSpec>,
    /// `--pool N` (eval): where a copy-in sandbox comes from when one of its kind was started
    /// ahead (see `sandbox::pool`); `None`: each starts its own.
    pub pool: Option<crate::sandbox::Pool>,
}

fn size(flag: &str, value: &str) -> Result<i64, UsageError> {
    parse_size(value).map_err(|e| UsageError(format!("--{flag}: {e}")))
}

/// `--tmp-size`: `auto` (512m, or less under a small `--memory`), or a size that fits the
/// memory budget. An explicit size that does not fit is refused rather than shrunk: the user
/// asked for it, and should choose which of the two flags to change.
fn tmp_size(value: &str, memory_flag: &str, budget: &MemoryBudget) -> Result<i64, UsageError> {
    if value.trim().eq_ignore_ascii_case("auto") {
        return Ok(budget.auto_tmp());
    }
    let tmp = size("tmp-size", value)?;
    if budget.fits(tmp) {
        return Ok(tmp);
    }
    Err(UsageError(format!(
        "--tmp-size {value} does not fit --memory {memory_flag}: files in /tmp, in agentbox's own \
         scratch space (as much again as /tmp), in HOME and in /dev/shm ({} each) are held in \
         memory, and {} of --memory stays for processes so that a full /tmp cannot leave the \
         sandbox's command runner without memory. Use --tmp-size {} or less (or auto), or \
         --memory {} or more",
        human_bytes(budget.home as u64),
        human_bytes(budget.reserve as u64),
        mebibytes(budget.largest_tmp()),
        mebibytes(MemoryBudget::memory_for(tmp)),
    )))
}

/// A size as a flag takes it: `72m`.
fn mebibytes(bytes: i64) -> String {
    format!("{}m", bytes >> 20)
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
        if memory < MIN_MEMORY {
            return Err(UsageError(format!(
                "--memory: at least {}m is needed to run anything",
                MIN_MEMORY >> 20
            )));
        }
        let budget = MemoryBudget::new(memory);
        let limits = Limits {
            memory_bytes: memory,
            cpus,
            pids: args.pids_limit,
            tmp_bytes: tmp_size(&args.tmp_size, &args.memory, &budget)?,
            home_bytes: budget.home,
            shm_bytes: budget.shm,
            max_file_bytes: size("max-file-size", &args.max_file_size)?,
        };
        if args.image.as_ref().is_some_and(|i| i.trim().is_empty()) {
            return Err(UsageError("--image: must not be empty".into()));
        }
        let services = services(args)?;
        if !services.is_empty() && args.runtime.as_deref().is_some_and(crate::sandbox::is_gvisor) {
            return Err(UsageError(format!(
                "--service with --runtime {}: {}",
                args.runtime.as_deref().unwrap_or_default(),
                crate::sandbox::services::NOT_UNDER_GVISOR
            )));
        }
        Ok(SandboxConfig {
            image: args
                .image
                .clone()
                .unwrap_or_else(|| crate::sandbox::image::DEFAULT_IMAGE.to_string()),
            image_source: args
                .image
                .as_ref()
                .map(|_| args.image_source.clone().unwrap_or_else(|| "--image".to_string())),
            command_timeout: args
                .command_timeout
                .map_or(DEFAULT_COMMAND_TIMEOUT, Duration::from_secs),
            command_timeout_given: args.command_timeout.is_some(),
            limits,
            runtime: args.runtime.clone().filter(|r| !r.is_empty()),
            per_call_exec: args.per_call_exec,
            allow_weak_limits: args.allow_weak_limits,
            cleanup: Default::default(),
            extras: Default::default(),
            pool: None,
            host_scan: crate::hostfs::hostscan::ScanBounds {
                entries: usize::try_from(args.host_scan_limit).unwrap_or(usize::MAX),
                time: Duration::from_secs(args.host_scan_timeout),
            },
            services,
        })
    }

    /// The command timeout for sandboxes of `image`: the one given, else the image's own
    /// default (the first `cargo test` or `go test` compiles a lot; see
    /// `KnownImage::command_timeout`).
    pub fn command_timeout_for(&self, image: &str) -> Duration {
        if self.command_timeout_given {
            return self.command_timeout;
        }
        crate::sandbox::image::KnownImage::by_tag(image)
            .and_then(|k| k.command_timeout())
            .unwrap_or(DEFAULT_COMMAND_TIMEOUT)
    }

    /// The spec for a sandbox with `project` copied into a fresh volume from the tar `seed`.
    pub fn volume_spec(
        &self,
        project: &Path,
        seed: &Path,
    ) -> Result<SandboxSpec, crate::sandbox::SandboxError> {
        // No bind mount: the hard-link and git checks of `bind_spec` do not apply to a copy.
        let dir = crate::sandbox::inspect_project(project)?;
        let session = new_session_id();
        Ok(SandboxSpec {
            workspace: crate::sandbox::WorkspaceSource::Volume {
                name: format!("agentbox-{session}"),
                seed: seed.to_path_buf(),
            },
            session,
            image: self.image.clone(),
            uid: dir.uid,
            gid: dir.gid,
            limits: self.limits.clone(),
            runtime: self.runtime.clone(),
            per_call_exec: self.per_call_exec,
            labels: Vec::new(),
            allow_weak_limits: self.allow_weak_limits,
            read_only: false,
            cleanup: self.cleanup.clone(),
            extras: self.extras.clone(),
            services: self.services.clone(),
        })
    }

    /// The spec for a sandbox with `project` bind-mounted.
    pub fn bind_spec(&self, project: &Path) -> Result<SandboxSpec, crate::sandbox::SandboxError> {
        let (workspace, uid, gid) = crate::sandbox::bind_workspace(project, &self.host_scan)?;
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
            allow_weak_limits: self.allow_weak_limits,
            read_only: false,
            cleanup: self.cleanup.clone(),
            extras: self.extras.clone(),
            services: self.services.clone(),
        })
    }
}

/// `--service NAME[=IMAGE]` as the sandbox crate takes it: a definition of the config file
/// by its name, else a server agentbox knows, else (with `=IMAGE`) any image. `=IMAGE` on a
/// known name keeps its port and connection variables, and starts the image its own way.
fn services(args: &SandboxArgs) -> Result<Vec<ServiceSpec>, UsageError> {
    let timeout = Duration::from_secs(args.service_timeout);
    let mut out = Vec::new();
    for given in &args.service {
        let (name, image) = match given.split_once('=') {
            Some((n, i)) if !i.trim().is_empty() => (n.trim(), Some(i.trim())),
            Some(_) => {
                return Err(UsageError(format!(
                    "--service {given}: the image after '=' is empty"
                )));
            }
            None => (given.trim(), None),
        };
        let defined = args.service_definitions.iter().find(|d| d.name == name);
        let kind = ServiceKind::by_name(name);
        let mut spec = match (defined, kind, image) {
            (Some(d), _, None) => d.clone(),
            (Some(d), _, Some(image)) => {
                // Another image starts its own way: agentbox's start and user for a known name
                // stay only where the table changed them.
                let known = d.kind.map(|k| ServiceSpec::known(k, name));
                let from_known = |same: &dyn Fn(&ServiceSpec) -> bool| known.as_ref().is_some_and(same);
                ServiceSpec {
                    image: image.to_string(),
                    kind: None,
                    command: d
                        .command
                        .clone()
                        .filter(|c| !from_known(&|k| k.command.as_ref() == Some(c))),
                    user: d
                        .user
                        .clone()
                        .filter(|u| !from_known(&|k| k.user.as_ref() == Some(u))),
                    ..d.clone()
                }
            }
            (None, Some(kind), None) => ServiceSpec::known(kind, name),
            (None, Some(kind), Some(image)) => ServiceSpec::known_on(kind, name, image),
            (None, None, Some(image)) => ServiceSpec::image(name, image),
            (None, None, None) => {
                return Err(UsageError(format!(
                    "--service {name}: not a service agentbox knows (postgres, redis, mariadb or \
                     mysql); give an image (--service {name}=IMAGE) or define [services.{name}] \
                     in the config file"
                )));
            }
        };
        spec.ready_timeout = timeout;
        out.push(spec);
    }
    crate::sandbox::services::check_services(&out).map_err(|e| UsageError(format!("--service: {e}")))?;
    Ok(out)
}

pub fn new_session_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// The model settings, resolved: which provider, where, with which key.
#[derive(Clone)]
pub struct ModelConfig {
    pub provider: Provider,
    pub model: String,
    pub base_url: String,
    pub api_key: Option<String>,
    pub script: Option<std::path::PathBuf>,
    pub tool_choice: ToolChoice,
    pub tool_protocol: ToolProtocol,
    pub temperature: Option<f32>,
    pub max_tokens: u32,
    pub request_timeout: Duration,
    pub max_retries: u32,
}

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .finish_non_exhaustive()
    }
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

pub const NO_PROVIDER: &str = "no model is configured: set ANTHROPIC_API_KEY (Anthropic), or \
     OPENAI_API_KEY / OPENAI_BASE_URL (OpenAI or a local OpenAI-compatible server such as Ollama or \
     llama.cpp), or replay a script with --provider scripted --script FILE";

impl ModelConfig {
    /// Replays a script instead of asking a model.
    pub fn is_scripted(&self) -> bool {
        self.provider == Provider::Scripted
    }

    pub fn from_args(args: &ModelArgs) -> Result<Self, UsageError> {
        Self::resolve(args, false)
    }

    /// `per_task_scripts`: the scripted provider may go without `--script` (each eval task
    /// brings its own `script.json`).
    pub fn resolve(args: &ModelArgs, per_task_scripts: bool) -> Result<Self, UsageError> {
        let provider = match (args.provider, &args.script) {
            (Some(p), _) => p,
            (None, Some(_)) => Provider::Scripted,
            (None, None) if env_nonempty("ANTHROPIC_API_KEY").is_some() => Provider::Anthropic,
            (None, None)
                if env_nonempty("OPENAI_API_KEY").is_some() || env_nonempty("OPENAI_BASE_URL").is_some() =>
            {
                Provider::Openai
            }
            (None, None) => return Err(UsageError(NO_PROVIDER.into())),
        };
        let (key_var, base_var, default_base, default_model) = match provider {
            Provider::Anthropic => (
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL",
                crate::model::anthropic::DEFAULT_BASE_URL,
                crate::model::anthropic::DEFAULT_MODEL,
            ),
            Provider::Openai => (
                "OPENAI_API_KEY",
                "OPENAI_BASE_URL",
                crate::model::openai::DEFAULT_BASE_URL,
                crate::model::openai::DEFAULT_MODEL,
            ),
            Provider::Scripted => ("", "", "", "scripted"),
        };
        let api_key = if key_var.is_empty() {
            None
        } else {
            env_nonempty(key_var)
        };
        if provider == Provider::Anthropic && api_key.is_none() {
            return Err(UsageError(
                "--provider anthropic needs ANTHROPIC_API_KEY in the environment".into(),
            ));
        }
        if provider == Provider::Scripted && args.script.is_none() && !per_task_scripts {
            return Err(UsageError("--provider scripted needs --script FILE".into()));
        }
        if let Some(script) = &args.script
            && !script.is_file()
        {
            return Err(UsageError(format!("--script {}: no such file", script.display())));
        }
        let base_url = args
            .base_url
            .clone()
            .or_else(|| {
                if base_var.is_empty() {
                    None
                } else {
                    env_nonempty(base_var)
                }
            })
            .unwrap_or_else(|| default_base.to_string());
        if provider != Provider::Scripted
            && !(base_url.starts_with("http://") || base_url.starts_with("https://"))
        {
            return Err(UsageError(format!(
                "--base-url {base_url:?}: must start with http:// or https://"
            )));
        }
        if let Some(t) = args.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(UsageError(format!("--temperature {t}: must be between 0 and 2")));
        }
        Ok(ModelConfig {
            provider,
            model: args.model.clone().unwrap_or_else(|| default_model.to_string()),
            base_url,
            api_key,
            script: args.script.clone(),
            tool_choice: args.tool_choice,
            tool_protocol: args.tool_protocol,
            temperature: args.temperature,
            max_tokens: args.max_tokens.unwrap_or(8192),
            request_timeout: Duration::from_secs(args.request_timeout),
            max_retries: args.max_retries,
        })
    }

    /// The client, wrapped for the text tool protocol when asked.
    pub fn client(&self, on_retry: Option<RetryObserver>) -> Result<Box<dyn ModelClient>, ModelError> {
        let settings = HttpSettings {
            base_url: self.base_url.clone(),
            api_key: self.api_key.clone(),
            model: self.model.clone(),
            request_timeout: self.request_timeout,
            retry: RetryPolicy {
                max_retries: self.max_retries,
                ..Default::default()
            },
            on_retry,
        };
        let inner: Box<dyn ModelClient> = match self.provider {
            Provider::Anthropic => Box::new(Anthropic::new(settings)?),
            Provider::Openai => Box::new(OpenAi::new(settings)?),
            Provider::Scripted => {
                let script = self
                    .script
                    .as_deref()
                    .ok_or_else(|| ModelError::Config("no script for the scripted provider".into()))?;
                Box::new(Scripted::from_file(script)?)
            }
        };
        Ok(match self.tool_protocol {
            ToolProtocol::Native => inner,
            ToolProtocol::Text => Box::new(TextProtocol::new(inner)),
        })
    }

    /// Values that must never be written anywhere.
    pub fn secrets(&self) -> Vec<String> {
        self.api_key.iter().cloned().collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct IsolateSettings {
    /// Project paths (relative, `/`-separated) not copied in, e.g. an eval task's TASK.md.
    pub exclude: Vec<String>,
    /// Where the patch goes; `None`: `./agentbox-SESSION.patch`, or nowhere for eval.
    pub patch: Option<std::path::PathBuf>,
    pub write_patch: bool,
    pub apply: bool,
    /// `--env NAME`: the copy is the named environment's volume, kept after the run (made
    /// from the project on first use, resumed as it was left after).
    pub env: Option<crate::envs::EnvName>,
}

/// The project a command was given must be an existing directory: said as a usage error
/// (exit 2) before any model or sandbox work starts.
pub fn project_arg(path: &std::path::Path) -> Result<(), UsageError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(UsageError(format!(
            "project path {} is not a directory",
            path.display()
        ))),
        Err(_) => Err(UsageError(format!(
            "project path {} does not exist",
            path.display()
        ))),
    }
}

/// Everything `run`, `chat` and `demo` need, resolved and validated.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub sandbox: SandboxConfig,
    pub model: ModelConfig,
    /// Copy in, patch out, instead of a bind mount.
    pub isolate: Option<IsolateSettings>,
    pub max_steps: u32,
    /// Given test commands (`--test-cmd`, a task's `test_cmd`); empty: detected.
    pub test_cmd: Vec<String>,
    pub shell: bool,
    pub trajectory: Option<std::path::PathBuf>,
    pub approve: bool,
    /// The harness aids for small models (see `--small-model`).
    pub aids: Aids,
    pub edit_format: crate::tools::EditFormat,
    pub strategy: crate::cli::Strategy,
    /// Every `--strategy` given (`eval` runs each); `strategy` is the first.
    pub strategies: Vec<crate::cli::Strategy>,
    pub repair: RepairSettings,
    pub setup: SetupSettings,
    /// `--publish`: forwards for the session's own sandbox only (not setup's, not a
    /// candidate's: one sandbox answers a published port).
    pub published: Vec<crate::sandbox::Forward>,
}

/// The setup phase: what it runs, how long it may take, and where it may connect.
#[derive(Debug, Clone, Default)]
pub struct SetupSettings {
    /// Given commands (`--setup`, `setup = [...]`); empty: the ecosystems' defaults.
    pub commands: Vec<String>,
    pub disabled: bool,
    pub timeout: Duration,
    /// `--allow-host` and `[network] allow`.
    pub allow: Vec<crate::egress::Rule>,
    /// `--agent-network allowlist`.
    pub agent_network: bool,
    /// `--no-default-registries`.
    pub no_default_registries: bool,
    /// `--refresh-setup`: a cache that fits is removed and filled again.
    pub refresh: bool,
    /// The CAs the setup phase trusts beyond the image's.
    pub trust: TrustSettings,
}

/// `--ca-cert`, `[network] ca_certs` and `--no-host-ca`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrustSettings {
    /// Pass the host's CA bundle (`SSL_CERT_FILE`, else the system bundle).
    pub host_ca: bool,
    pub ca_certs: Vec<std::path::PathBuf>,
}

impl TrustSettings {
    pub fn from_args(args: &crate::cli::TrustArgs) -> Self {
        TrustSettings {
            host_ca: !args.no_host_ca,
            ca_certs: args.ca_cert.clone(),
        }
    }
}

impl SetupSettings {
    pub fn from_args(args: &crate::cli::SetupArgs) -> Result<Self, UsageError> {
        if args.setup.iter().any(|c| c.trim().is_empty()) {
            return Err(UsageError("--setup: must not be empty".into()));
        }
        let allow = args
            .allow_host
            .iter()
            .map(|r| r.parse::<crate::egress::Rule>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| UsageError(format!("--allow-host: {e}")))?;
        Ok(SetupSettings {
            commands: args.setup.clone(),
            disabled: args.no_setup,
            timeout: Duration::from_secs(args.setup_timeout),
            allow,
            agent_network: args.agent_network == crate::cli::AgentNetwork::Allowlist,
            no_default_registries: args.no_default_registries,
            refresh: args.refresh_setup,
            trust: TrustSettings::from_args(&args.trust),
        })
    }
}

/// `--repair-mutants` under `--small-model`: enough for every one-token change of a few short
/// functions (the demo's two give 6 a round), few enough that a round of them costs about one
/// of the local model's candidates (20-60 s on 2 cores) when the tests run in a second or two.
pub const SMALL_MODEL_MUTANTS: u32 = 24;

/// `--strategy repair` and `auto`: how many candidates, how many tested at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepairSettings {
    pub candidates: u32,
    pub candidate_jobs: u32,
    pub reply: crate::cli::RepairReply,
    /// Rounds of candidates, each from the best partial fix of the round before.
    pub rounds: u32,
    /// Temperature of the candidates that are each about one failing test.
    pub focus_temperature: f32,
    /// One-token changes tested per round before the model is asked (`--repair-mutants`).
    pub mutants: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Aids {
    pub prime: bool,
    pub protect_tests: bool,
    pub no_repeat: bool,
    pub resample_repeats: u32,
    pub verify_finish: u32,
    pub attempts: u32,
    pub retry_temperature: f32,
}

impl Default for Aids {
    fn default() -> Self {
        Aids {
            prime: false,
            protect_tests: false,
            no_repeat: false,
            resample_repeats: 0,
            verify_finish: 0,
            attempts: 1,
            retry_temperature: 0.7,
        }
    }
}

impl AgentSettings {
    /// For a session a person watches (`run`, `chat`, `demo`).
    pub fn from_args(args: &AgentArgs, session: &crate::cli::SessionArgs) -> Result<Self, UsageError> {
        if args.strategy.len() > 1 {
            return Err(UsageError(
                "--strategy: one strategy here (only eval runs several)".into(),
            ));
        }
        let mut settings = Self::resolve(args, false)?;
        settings.trajectory = session.trajectory.clone();
        settings.approve = session.approve;
        Ok(settings)
    }

    pub fn resolve(args: &AgentArgs, per_task_scripts: bool) -> Result<Self, UsageError> {
        let mut args = args.clone();
        let small = args.small_model;
        if small {
            // The preset fills what was left at its default.
            args.model.tool_choice = crate::model::ToolChoice::Required;
            args.model.temperature.get_or_insert(0.0);
            args.model.max_tokens.get_or_insert(1024);
            args.no_shell = true;
        }
        let args = &args;
        if args.resample_repeats.is_some_and(|n| n > 0) && !(args.no_repeat || small) {
            return Err(UsageError(
                "--resample-repeats needs --no-repeat (it is what notices a repeat)".into(),
            ));
        }
        if args.test_cmd.iter().any(|cmd| cmd.trim().is_empty()) {
            return Err(UsageError("--test-cmd: must not be empty".into()));
        }
        Ok(AgentSettings {
            sandbox: SandboxConfig::from_args(&args.sandbox)?,
            model: ModelConfig::resolve(&args.model, per_task_scripts)?,
            isolate: None,
            max_steps: args.max_steps,
            test_cmd: args.test_cmd.clone(),
            shell: !args.no_shell,
            trajectory: None,
            approve: false,
            edit_format: args.edit_format.unwrap_or(if small {
                crate::tools::EditFormat::Whole
            } else {
                crate::tools::EditFormat::Exact
            }),
            strategy: args.strategy.first().copied().unwrap_or(if small {
                crate::cli::Strategy::Auto
            } else {
                crate::cli::Strategy::Loop
            }),
            strategies: args.strategy.clone(),
            repair: RepairSettings {
                candidates: args.candidates,
                candidate_jobs: args.candidate_jobs,
                reply: args.repair_reply.unwrap_or_default(),
                rounds: args.repair_rounds,
                focus_temperature: args.focus_temperature,
                mutants: args
                    .repair_mutants
                    .unwrap_or(if small { SMALL_MODEL_MUTANTS } else { 0 }),
            },
            aids: Aids {
                prime: args.prime || small,
                protect_tests: args.protect_tests || small,
                no_repeat: args.no_repeat || small,
                // Not in the preset: measured on examples/tasks it cost up to 2.4x the time
                // and fixed nothing more (the model mostly samples the same call again).
                resample_repeats: args.resample_repeats.unwrap_or(0),
                verify_finish: args.verify_finish.unwrap_or(if small { 2 } else { 0 }),
                attempts: args.attempts.unwrap_or(if small { 3 } else { 1 }),
                retry_temperature: args.retry_temperature,
            },
            setup: SetupSettings::from_args(&args.setup)?,
            published: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn run_settings(args: &[&str]) -> AgentSettings {
        let mut argv = vec![
            "agentbox",
            "run",
            "--provider",
            "openai",
            "--base-url",
            "http://127.0.0.1:1/v1",
        ];
        argv.extend_from_slice(args);
        argv.push("project");
        let Command::Run(run) = Cli::parse_from(argv).command else {
            panic!()
        };
        AgentSettings::from_args(&run.agent, &run.session).unwrap()
    }

    /// The usage error of `agentbox run ARGS... p`.
    fn settings_error(args: &[&str]) -> String {
        let argv = ["agentbox", "run"].iter().chain(args).chain(&["p"]);
        let Command::Run(run) = Cli::parse_from(argv).command else {
            panic!()
        };
        AgentSettings::from_args(&run.agent, &run.session).unwrap_err().0
    }

    #[test]
    fn the_command_timeout_is_the_images_unless_given() {
        let default = run_settings(&[]).sandbox;
        assert!(!default.command_timeout_given);
        assert_eq!(
            default.command_timeout_for("agentbox/python:3"),
            DEFAULT_COMMAND_TIMEOUT
        );
        assert_eq!(
            default.command_timeout_for("agentbox/rust:1"),
            Duration::from_secs(600)
        );
        assert_eq!(
            default.command_timeout_for("someone/else:1"),
            DEFAULT_COMMAND_TIMEOUT
        );
        let given = run_settings(&["--command-timeout", "30"]).sandbox;
        assert_eq!(
            given.command_timeout_for("agentbox/rust:1"),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn small_model_turns_on_every_aid_and_keeps_explicit_values() {
        let plain = run_settings(&[]);
        assert_eq!(plain.aids, Aids::default());
        assert!(plain.shell);
        let small = run_settings(&["--small-model"]);
        assert_eq!(small.model.tool_choice, ToolChoice::Required);
        assert_eq!(small.model.temperature, Some(0.0));
        assert!(!small.shell);
        assert!(small.aids.prime && small.aids.protect_tests && small.aids.no_repeat);
        assert_eq!((small.aids.verify_finish, small.aids.attempts), (2, 3));
        assert_eq!(small.aids.resample_repeats, 0);
        assert_eq!((plain.model.max_tokens, small.model.max_tokens), (8192, 1024));
        assert_eq!(
            (plain.edit_format, plain.strategy),
            (crate::tools::EditFormat::Exact, crate::cli::Strategy::Loop)
        );
        assert_eq!(
            (small.edit_format, small.strategy),
            (crate::tools::EditFormat::Whole, crate::cli::Strategy::Auto)
        );
        let chosen = run_settings(&["--small-model", "--edit-format", "both", "--strategy", "repair"]);
        assert_eq!(
            (chosen.edit_format, chosen.strategy),
            (crate::tools::EditFormat::Both, crate::cli::Strategy::Repair)
        );
        let tuned = run_settings(&["--small-model", "--attempts", "1", "--temperature", "0.2"]);
        assert_eq!(tuned.aids.attempts, 1);
        assert_eq!(tuned.model.temperature, Some(0.2));
        // Mutants: none unless asked for, the preset's number under --small-model, and 0
        // given there is 0.
        assert_eq!(
            (plain.repair.mutants, small.repair.mutants),
            (0, SMALL_MODEL_MUTANTS)
        );
        let off = run_settings(&["--small-model", "--repair-mutants", "0"]);
        assert_eq!(off.repair.mutants, 0);
    }

    #[test]
    fn resampling_repeats_needs_the_repeat_guard() {
        let err = settings_error(&["--script", "s.json", "--resample-repeats", "2"]);
        assert!(err.contains("--no-repeat"), "{err}");
        assert_eq!(
            run_settings(&["--no-repeat", "--resample-repeats", "1"])
                .aids
                .resample_repeats,
            1
        );
    }

    #[test]
    fn files_in_memory_must_leave_room_for_processes() {
        // auto: 512m under the default 2g; less, to fit, under a small --memory.
        assert_eq!(run_settings(&[]).sandbox.limits.tmp_bytes, 512 << 20);
        let small = run_settings(&["--memory", "256m"]).sandbox.limits;
        assert_eq!(
            (small.tmp_bytes, small.home_bytes, small.shm_bytes),
            (72 << 20, 24 << 20, 24 << 20)
        );
        assert_eq!(
            run_settings(&["--memory", "1g", "--tmp-size", "256m"])
                .sandbox
                .limits
                .tmp_bytes,
            256 << 20
        );
        // An explicit size that does not fit is refused, naming both flags and a way out each.
        let err = settings_error(&["--script", "s.json", "--memory", "256m", "--tmp-size", "512m"]);
        assert!(
            err.starts_with("--tmp-size 512m does not fit --memory 256m")
                && err.contains("--tmp-size 72m or less")
                && err.contains("--memory 1536m or more"),
            "{err}"
        );
        let err = settings_error(&["--script", "s.json", "--memory", "64m"]);
        assert!(err.contains("at least 128m"), "{err}");
    }

    #[test]
    fn bad_model_settings_are_usage_errors() {
        assert!(settings_error(&["--provider", "scripted"]).contains("needs --script"));
        assert!(
            settings_error(&["--provider", "openai", "--base-url", "ftp://x"])
                .contains("must start with http")
        );
    }
}
