//! Command-line arguments, parsed once by clap and then resolved into validated config
//! (`config.rs`). Nothing below `config` sees raw arguments.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::model::ToolChoice;

/// The options `-h` lists, by id, in every command that has them: what a user needs first.
/// `--help` lists every option, under its heading.
const SHORT_HELP: &[&str] = &[
    "verbose",
    "help",
    "version",
    // the model
    "provider",
    "model",
    "base_url",
    "small_model",
    // the task and its verdict
    "max_steps",
    "test_cmd",
    "strategy",
    "approve",
    // the sandbox and what it gets
    "image",
    "service",
    "publish",
    "setup",
    "allow_host",
    "model_gateway",
    "secret",
    // the project
    "isolate",
    "apply",
    "env",
    "read_only",
    "interactive",
    "tty",
    // output
    "json",
    "trajectory",
    "out",
    // eval
    "jobs",
    "engines",
    "tasks",
    // doctor, gc, image build
    "no_network",
    "all",
    "caches",
    "offline",
    "force",
    "replay",
];

/// The command line as agentbox parses it: [`Cli`]'s definitions, with `-h` showing only
/// [`SHORT_HELP`]'s options.
pub fn command() -> clap::Command {
    short_help(Cli::command())
}

fn short_help(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|arg| {
        if arg.is_positional() {
            // Under "Arguments": the heading of a struct flattened before them would carry over.
            arg.help_heading(None::<&str>)
        } else if SHORT_HELP.contains(&arg.get_id().as_str()) {
            arg
        } else {
            arg.hide_short_help(true)
        }
    })
    .mut_subcommands(short_help)
}

#[derive(Debug, Parser)]
#[command(
    name = "agentbox",
    version,
    about = "A coding agent whose every tool call runs in a locked-down Docker container",
    propagate_version = true
)]
pub struct Cli {
    /// More log output on stderr (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Let the model work on a project until the task is done; the harness checks the result.
    Run(RunArgs),
    /// An interactive session with the model, on one sandbox that lives for the whole session.
    Chat(ChatArgs),
    /// Run the bundled example: a live model when one is configured, else (or with --replay) a
    /// scripted replay.
    Demo(DemoArgs),
    /// Run every task of a directory (isolated, in parallel) and report how many were fixed.
    Eval(EvalArgs),
    /// Run one command in a fresh sandbox and print its output; exits with its status.
    Exec(ExecArgs),
    /// An interactive shell (or CMD) in a sandbox, on your terminal; exits with its status.
    Shell(ShellArgs),
    /// Serve agentbox's tools to another agent: a Model Context Protocol server on stdio.
    Mcp(McpArgs),
    /// Check Docker, the image and the sandbox policy; print a fix for each problem.
    Doctor(DoctorArgs),
    /// Remove containers and volumes left by agentbox processes that were killed.
    Gc(GcArgs),
    /// Build or inspect sandbox images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Named environments (`run --env NAME`): list, show, diff, merge, fork, rewind, remove.
    #[command(subcommand)]
    Env(EnvCommand),
}

#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Every environment: name, project, created, last used, turns, paths changed, bytes kept
    /// on the host (record, manifest, checkpoints).
    List,
    /// An environment's log of turns: task, verdict, changed files.
    Show { name: String },
    /// The environment's changes as a patch: what `env merge` would bring into the project
    /// (everything since it was made, or since its last merge).
    Diff { name: String },
    /// Remove an environment: its volume and its record.
    Rm { name: String },
    /// Copy an environment into a new one: its files (a volume copy), its record and log.
    Fork { name: String, new: String },
    /// Put an environment's files back as turn TURN left them (0: as created) and cut its log
    /// after that turn.
    Rewind { name: String, turn: usize },
    /// Bring an environment's changes into the project: written into the checkout as `--apply`
    /// writes them (all or nothing; refused where the project changed since), or with --branch
    /// as a new branch with a commit per turn (the working tree and index untouched, no hook
    /// run).
    Merge {
        name: String,
        /// Create this branch, one commit per turn (message: the turn's task), on the commit
        /// the environment was created from, instead of writing into the checkout.
        #[arg(long, value_name = "BRANCH")]
        branch: Option<String>,
    },
}

/// Sandbox settings shared by every command that starts one.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sandbox")]
pub struct SandboxArgs {
    /// Image the sandbox runs [default: chosen from the project's manifests (run, chat, eval,
    /// exec), else agentbox/python].
    #[arg(long, value_name = "IMAGE", env = "AGENTBOX_IMAGE")]
    pub image: Option<String>,

    /// Where `image` came from ("--image", "AGENTBOX_IMAGE", the config file), for messages;
    /// filled in after parsing.
    #[arg(skip)]
    pub image_source: Option<String>,

    /// Seconds before a command, and everything it started, is killed [default: 120; 600 for
    /// the rust, go and polyglot images, whose first build compiles a lot].
    #[arg(long, value_name = "SECS", env = "AGENTBOX_COMMAND_TIMEOUT",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub command_timeout: Option<u64>,

    /// Memory limit of the sandbox (no swap on top), e.g. 512m, 2g.
    #[arg(long, value_name = "SIZE", default_value = "2g")]
    pub memory: String,

    /// CPUs the sandbox may use [default: 2, or fewer if the machine has fewer].
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,

    /// Most processes alive at once in the sandbox.
    #[arg(long, value_name = "N", default_value_t = 512,
          value_parser = clap::value_parser!(i64).range(16..=1_000_000))]
    pub pids_limit: i64,

    /// Size of the sandbox's /tmp (a tmpfs, counted against --memory). `auto`: 512m, or less
    /// when --memory is under 1536m; files in memory must leave room for processes.
    #[arg(long, value_name = "SIZE", default_value = "auto")]
    pub tmp_size: String,

    /// Largest file a command may write, in the project too (RLIMIT_FSIZE).
    #[arg(long, value_name = "SIZE", default_value = "1g")]
    pub max_file_size: String,

    /// Docker runtime for the sandbox, e.g. runsc (gVisor) for a stronger boundary.
    #[arg(long, value_name = "NAME", env = "AGENTBOX_RUNTIME")]
    pub runtime: Option<String>,

    /// Start one Docker exec per command instead of the in-sandbox executor (slower; for
    /// images without python3 this is chosen automatically).
    #[arg(long)]
    pub per_call_exec: bool,

    /// Run even where the engine cannot enforce the memory, pids and CPU limits (rootless
    /// Podman or Docker on cgroup v1), with a warning on every run. Refused without it.
    #[arg(long, env = "AGENTBOX_ALLOW_WEAK_LIMITS", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub allow_weak_limits: bool,

    /// Most entries agentbox's own scan of a bind-mounted project looks at, before and after the
    /// session (for hard links leading outside, git metadata, and what changed). A scan that
    /// stops there refuses the mount before a session and says "incomplete" after one.
    #[arg(long, value_name = "N", default_value_t = 2_000_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub host_scan_limit: u64,

    /// Most seconds that scan takes, likewise.
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub host_scan_timeout: u64,

    /// Start a server beside every sandbox, in its own network namespace, reachable on
    /// 127.0.0.1: postgres, redis or mariadb (agentbox's images, connection variables such as
    /// DATABASE_URL set), a [services.NAME] of the config file, or NAME=IMAGE. Repeatable.
    #[arg(help_heading = "Services and ports", long, value_name = "NAME[=IMAGE]")]
    pub service: Vec<String>,

    /// Seconds a service may take to take connections before the session stops.
    #[arg(help_heading = "Services and ports", long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub service_timeout: u64,

    /// The config file's `[services.NAME]` tables; filled in after parsing.
    #[arg(skip)]
    pub service_definitions: Vec<crate::sandbox::services::ServiceSpec>,
}

/// `--publish` (shell, run, chat, exec, mcp).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Services and ports")]
pub struct PublishArgs {
    /// Forward this machine's 127.0.0.1:HOST_PORT to the sandbox's own 127.0.0.1:PORT
    /// (HOST_PORT: PORT if not given; 0 for any free port, printed). Repeat it for several. The
    /// sandbox keeps no network; the port closes when the session ends.
    #[arg(long, value_name = "[HOST_PORT:]PORT")]
    pub publish: Vec<String>,

    /// Listen for --publish on ADDR instead of 127.0.0.1, e.g. 0.0.0.0: anyone who can reach
    /// ADDR then reaches the sandbox's server, and agentbox warns on every run.
    #[arg(long, value_name = "ADDR", requires = "publish")]
    pub unsafe_publish_address: Option<std::net::IpAddr>,
}

/// `--model-gateway` and its settings (shell, exec, mcp).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Model gateway and secrets")]
pub struct GatewayArgs {
    /// Give the sandbox a model endpoint on its own loopback (ANTHROPIC_BASE_URL,
    /// OPENAI_BASE_URL) with a per-run sentinel as the key: the host's gateway checks it, puts
    /// the host's real key in its place and forwards to the provider. PROVIDERS: anthropic,
    /// openai or both, comma-separated [default: each whose key variable is set].
    #[arg(long, value_name = "PROVIDERS", num_args = 0..=1, require_equals = true,
          default_missing_value = "auto")]
    pub model_gateway: Option<String>,

    /// Where the gateway forwards [default: ANTHROPIC_BASE_URL / OPENAI_BASE_URL, else the
    /// provider's own]: https, or http to a loopback address. PROVIDER= is needed when both
    /// providers are on.
    #[arg(long, value_name = "[PROVIDER=]URL", requires = "model_gateway")]
    pub gateway_upstream: Vec<String>,

    /// The host variable holding the real key [default: ANTHROPIC_API_KEY / OPENAI_API_KEY].
    #[arg(long, value_name = "[PROVIDER=]NAME", requires = "model_gateway")]
    pub gateway_key_env: Vec<String>,

    /// A model the sandbox may ask for; repeat it for several [default: any].
    #[arg(long, value_name = "MODEL", requires = "model_gateway")]
    pub gateway_model: Vec<String>,

    /// Input plus output tokens (as the responses count them) after which the gateway refuses
    /// further requests (429).
    #[arg(long, value_name = "TOKENS", requires = "model_gateway")]
    pub gateway_budget: Option<u64>,

    /// Estimated dollars (list prices, for the models agentbox knows the price of) after which
    /// the gateway refuses further requests (429); while set, a model without a known price is
    /// refused.
    #[arg(long, value_name = "DOLLARS", requires = "model_gateway", value_parser = positive_dollars)]
    pub gateway_budget_usd: Option<f64>,

    /// Let a server-side tool through, by name: web_search, web_fetch, code_execution, mcp,
    /// file_search, code_interpreter, url_source (URL image/document sources). Each makes the
    /// provider reach the network for the sandbox.
    #[arg(long, value_name = "NAME", requires = "model_gateway")]
    pub gateway_allow_tool: Vec<String>,

    /// Write every gateway request (model, tokens, cost estimate, latency, status, refusal)
    /// to FILE as JSON lines.
    #[arg(long, value_name = "FILE", requires = "model_gateway")]
    pub gateway_log: Option<PathBuf>,

    /// A secret for one host: the sandbox gets NAME=agentbox-secret-... (a sentinel) and
    /// AGENTBOX_SECRET_NAME_URL=http://127.0.0.1:PORT; requests there go to the upstream over
    /// TLS with the host's $NAME in place of the sentinel in HEADER only. Repeatable.
    #[arg(long, value_name = "NAME@https://HOST[:PORT]:HEADER")]
    pub secret: Vec<String>,

    /// The value of `--secret NAME` read from FILE (one trailing newline dropped) instead of
    /// the host's environment: for a token kept in a file, never in a shell's environment.
    #[arg(long, value_name = "NAME=FILE")]
    pub secret_file: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub publish: PublishArgs,

    #[command(flatten)]
    pub gateway: GatewayArgs,

    #[command(flatten)]
    pub setup: SetupArgs,

    /// Forward stdin to the command.
    #[arg(help_heading = "Terminal", short, long)]
    pub interactive: bool,

    /// Give the command a terminal (with -i: the same as `agentbox shell PROJECT -- CMD`).
    #[arg(help_heading = "Terminal", short, long)]
    pub tty: bool,

    /// Bytes of output kept from the start and from the end of each stream.
    #[arg(help_heading = "Output", long, value_name = "SIZE", default_value = "1m")]
    pub output_limit: String,

    /// Run in the named environment (as `run --env`): its kept copy of the project, made on
    /// first use; the command is a turn in its log.
    #[arg(help_heading = "Workspace", long, value_name = "NAME")]
    pub env: Option<String>,

    /// The project directory, mounted at /workspace.
    pub project: PathBuf,

    /// The command and its arguments (no shell; use `bash -lc '...'` for one).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub publish: PublishArgs,

    #[command(flatten)]
    pub gateway: GatewayArgs,

    #[command(flatten)]
    pub setup: SetupArgs,

    /// Mount the project read-only: look around without risk.
    #[arg(help_heading = "Workspace", long, conflicts_with = "isolate")]
    pub read_only: bool,

    /// Copy the project into the sandbox instead of mounting it: the project directory is not
    /// written; what changed comes out as a patch file.
    #[arg(help_heading = "Workspace", long)]
    pub isolate: bool,

    /// Where --isolate writes the patch [default: ./agentbox-SESSION.patch].
    #[arg(help_heading = "Workspace", long, value_name = "FILE", requires = "isolate")]
    pub patch: Option<PathBuf>,

    /// Work in the named environment (as `run --env`): its kept copy of the project, made on
    /// first use; the session is a turn in its log.
    #[arg(help_heading = "Workspace", long, value_name = "NAME", conflicts_with_all = ["isolate", "read_only"])]
    pub env: Option<String>,

    /// Seconds before the whole shell session is ended (no limit by default; --command-timeout
    /// does not apply to an interactive shell).
    #[arg(help_heading = "Sandbox", long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub session_timeout: Option<u64>,

    /// The project directory, mounted at /workspace.
    pub project: PathBuf,

    /// The command to run instead of `bash -l`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub publish: PublishArgs,

    #[command(flatten)]
    pub gateway: GatewayArgs,

    #[command(flatten)]
    pub setup: SetupArgs,

    /// The project's test command for `run_tests`; repeat it for several [default: detected
    /// from the project's root manifests].
    #[arg(help_heading = "Verification", long, value_name = "CMD")]
    pub test_cmd: Vec<String>,

    /// No `bash` tool.
    #[arg(help_heading = "Agent", long)]
    pub no_shell: bool,

    /// edit_file refuses to change test files.
    #[arg(help_heading = "Agent", long)]
    pub protect_tests: bool,

    /// Copy the project into the sandbox instead of mounting it: the project directory is not
    /// written; at the end what changed is written as a patch file (its path on stderr).
    #[arg(help_heading = "Workspace", long)]
    pub isolate: bool,

    /// Where --isolate writes the patch [default: ./agentbox-SESSION.patch].
    #[arg(help_heading = "Workspace", long, value_name = "FILE", requires = "isolate")]
    pub patch: Option<PathBuf>,

    /// Serve the named environment (as `run --env`): its kept copy of the project, made on
    /// first use; the session is a turn in its log.
    #[arg(
        help_heading = "Workspace",
        long,
        value_name = "NAME",
        conflicts_with = "isolate"
    )]
    pub env: Option<String>,

    /// The project directory, mounted at /workspace.
    pub project: PathBuf,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub trust: TrustArgs,

    /// A host setup may reach (as for `run`): TLS to it is checked too.
    #[arg(help_heading = "Setup and network", long, value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,

    /// Check only the --allow-host hosts, not the registries the image's package managers use.
    #[arg(help_heading = "Setup and network", long)]
    pub no_default_registries: bool,

    /// Skip the check that reaches the network (TLS to the registries, from a sandbox).
    #[arg(help_heading = "Setup and network", long)]
    pub no_network: bool,

    /// Also check this project directory (owner, .git) before you run agentbox on it.
    pub project: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Also remove resources of agentbox processes that are still running.
    #[arg(long)]
    pub all: bool,

    /// List the dependency caches instead (setup's volumes, kept across runs) and remove each
    /// that no run is using.
    #[arg(long)]
    pub caches: bool,

    /// With --caches: only the caches of the project in this directory.
    #[arg(long, value_name = "DIR", requires = "caches")]
    pub project: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build agentbox images (default: python) through the Docker API, or offline.
    Build(ImageBuildArgs),
    /// List the images agentbox knows how to build, whether each is present, and their
    /// toolchains (a service image: where it listens).
    List,
}

#[derive(Debug, Args)]
pub struct ImageBuildArgs {
    /// Images to build: names from `agentbox image list` (the sandboxes python, node, rust, go,
    /// polyglot; the services postgres, redis, mariadb).
    #[arg(value_name = "NAME", conflicts_with = "all")]
    pub names: Vec<String>,

    /// Build every image agentbox knows, the services' too.
    #[arg(long)]
    pub all: bool,

    /// Build from Debian packages with mmdebstrap and import the result, for machines that
    /// reach no container registry (needs root, or sudo).
    #[arg(long)]
    pub offline: bool,

    /// Debian mirror for --offline [default: this host's APT sources].
    #[arg(long, value_name = "URL", requires = "offline")]
    pub mirror: Option<String>,

    /// Rebuild even if the image exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// Anthropic Messages API (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL).
    Anthropic,
    /// OpenAI-compatible Chat Completions: OpenAI, Ollama, llama.cpp, vLLM (OPENAI_API_KEY, OPENAI_BASE_URL).
    Openai,
    /// Replay assistant turns from a JSON file (--script).
    Scripted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ToolProtocol {
    /// The provider's own tool calling.
    #[default]
    Native,
    /// Tools described in the prompt, calls parsed from `tool: NAME({json})` lines.
    Text,
}

/// Which model, and how to talk to it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelArgs {
    /// Model provider [default: anthropic if ANTHROPIC_API_KEY is set, else openai if
    /// OPENAI_API_KEY or OPENAI_BASE_URL is set].
    #[arg(long, env = "AGENTBOX_PROVIDER", value_enum)]
    pub provider: Option<Provider>,

    /// Model name [default: claude-sonnet-4-5 (anthropic), gpt-4.1 (openai)].
    #[arg(long, env = "AGENTBOX_MODEL")]
    pub model: Option<String>,

    /// API base URL [default: ANTHROPIC_BASE_URL or OPENAI_BASE_URL, else the provider's own].
    /// Anthropic's has no /v1; OpenAI-compatible ones end in /v1.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,

    /// The JSON file of assistant turns the scripted provider replays.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,

    /// `required` makes the model call a tool every turn and adds a `finish` tool that ends
    /// the run (small local models need this).
    #[arg(long, value_enum, default_value_t = ToolChoice::Auto)]
    pub tool_choice: ToolChoice,

    /// How tools are offered to the model.
    #[arg(long, value_enum, default_value_t = ToolProtocol::Native)]
    pub tool_protocol: ToolProtocol,

    /// Sampling temperature [default: the provider's].
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,

    /// Most tokens in one model reply [default: 8192; 1024 with --small-model, whose runaway
    /// replies would otherwise take minutes].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(16..))]
    pub max_tokens: Option<u32>,

    /// Seconds to wait for one model reply before retrying.
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout: u64,

    /// Retries of a failed model request (429, 5xx, 529, connection errors), with backoff.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub max_retries: u32,
}

/// Settings shared by `run`, `chat` and `demo`.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    // The model's options first in `--help`, the sandbox's after them.
    #[command(flatten)]
    pub model: ModelArgs,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Most model turns before the run stops (exit 3).
    #[arg(help_heading = "Agent", long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: u32,

    /// The project's test command; repeat it for several (all must pass) [default: detected
    /// from the project's root manifests: cargo test, go test ./..., npm test, make test,
    /// pytest].
    #[arg(help_heading = "Verification", long, value_name = "CMD")]
    pub test_cmd: Vec<String>,

    /// No `bash` tool: only list_files, read_file, edit_file, search and run_tests.
    #[arg(help_heading = "Agent", long)]
    pub no_shell: bool,

    /// Put the file list, the failing test output and the source files in the first message.
    #[arg(help_heading = "Agent", long)]
    pub prime: bool,

    /// edit_file refuses to change test files.
    #[arg(help_heading = "Agent", long)]
    pub protect_tests: bool,

    /// A tool call identical to an earlier one, with nothing changed since, is not run again.
    #[arg(help_heading = "Agent", long)]
    pub no_repeat: bool,

    /// With --no-repeat: when every call of a reply repeats an earlier one, ask the model
    /// again at --retry-temperature, up to N times, before answering "not run" [default: 0].
    #[arg(help_heading = "Agent", long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10))]
    pub resample_repeats: Option<u32>,

    /// When the model says it is done but the tests fail, send it back with the failure, up to
    /// N times [default: 0].
    #[arg(help_heading = "Verification", long, value_name = "N")]
    pub verify_finish: Option<u32>,

    /// If the tests still fail at the end, reset the project and start over, up to N attempts
    /// in all; later attempts use --retry-temperature [default: 1].
    #[arg(help_heading = "Verification", long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub attempts: Option<u32>,

    /// Temperature of the second and later attempts.
    #[arg(help_heading = "Verification", long, value_name = "T", default_value_t = 0.7)]
    pub retry_temperature: f32,

    /// Which edit tools the model gets: `exact` (edit_file), `whole` (write_file: the whole
    /// file), or `both` [default: exact; whole with --small-model].
    #[arg(help_heading = "Agent", long, value_enum, value_name = "FORMAT")]
    pub edit_format: Option<crate::tools::EditFormat>,

    /// How the task is worked on: `loop` (the agent loop), `repair` (whole corrected files
    /// asked for in one reply, several candidates, each tested in its own sandbox), `auto`
    /// (repair, then the loop on what is left) [default: loop; auto with --small-model].
    /// Not for `chat`. `eval` takes several, comma-separated: each runs over every task, and
    /// the summary puts them side by side.
    #[arg(
        help_heading = "Strategy",
        long,
        value_enum,
        value_name = "STRATEGY",
        value_delimiter = ','
    )]
    pub strategy: Vec<Strategy>,

    /// With --strategy repair or auto: candidate fixes asked for per round (the first at
    /// temperature 0 about every failure; the others each about one failing test, at
    /// --focus-temperature until each has had one, then at --retry-temperature).
    #[arg(help_heading = "Strategy", long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub candidates: u32,

    /// With --strategy repair or auto: the temperature of the candidates that are each about
    /// one failing test. At 0 a 1.5B model mostly gives the function back unchanged when it
    /// cannot see the bug; hotter, some of its samples change it.
    #[arg(help_heading = "Strategy", long, value_name = "T", default_value_t = 0.0)]
    pub focus_temperature: f32,

    /// With --strategy repair or auto: candidate sandboxes tested at once (in eval, per task:
    /// up to --jobs times this many candidate sandboxes exist at once).
    #[arg(help_heading = "Strategy", long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub candidate_jobs: u32,

    /// With --strategy repair or auto: how the model returns its changes: `text` (each file's
    /// path, then the whole file in a fenced code block), `functions` (only the functions
    /// that change, each whole in a fenced code block, written into the file in place of the
    /// definitions of the same name), `blocks` (search/replace
    /// blocks: only the lines that change), or `tools` (write_file calls). A 1.5B model asked for
    /// tool calls wrote junk for content (the file's name) where, asked for text, it wrote the
    /// fixed file [default: text].
    #[arg(help_heading = "Strategy", long, value_enum, value_name = "FORMAT")]
    pub repair_reply: Option<RepairReply>,

    /// With --strategy repair or auto: rounds of candidates. When no candidate passes but the
    /// best one makes some failing tests pass and breaks none, the next round starts from it,
    /// with the tests that still fail (a round without such progress is the last).
    #[arg(help_heading = "Strategy", long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub repair_rounds: u32,

    /// With --strategy repair or auto: before the model is asked, each round tests up to N
    /// one-token changes to the functions the failing tests call (and those they call): `/`
    /// and `//`, `<` and `<=`, `==` and `!=`, `+` and `-`, `min` and `max`, `and` and `or`, a
    /// `+ 1` or `- 1` dropped or turned round; then a line or an `else` branch deleted, and in
    /// Python a mutable default argument made new each call and a parameter's alias made a
    /// copy; outside strings and comments, in Python,
    /// JavaScript/TypeScript, Rust, Go and other C-like files. Each is a candidate in its own
    /// sandbox; one that passes wins, one that fixes some failing tests and breaks none
    /// starts the next round. 0: none [default: 0; with --small-model: 24].
    #[arg(help_heading = "Strategy", long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=200))]
    pub repair_mutants: Option<u32>,

    /// Settings for small local models: --tool-choice required, --temperature 0, --no-shell,
    /// --max-tokens 1024, --prime, --protect-tests, --no-repeat, --verify-finish 2, --attempts 3,
    /// --edit-format whole, --strategy auto, --repair-mutants 24 (each can still be set otherwise).
    #[arg(help_heading = "Model", long)]
    pub small_model: bool,

    #[command(flatten)]
    pub setup: SetupArgs,
}

/// The setup phase and its network (see the book: docs/src/projects/setup.md).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Setup and network")]
pub struct SetupArgs {
    /// A command that installs what the tests need, run before the agent's first turn in a
    /// container of its own whose only way out is the egress proxy; repeat it for several
    /// [default: per ecosystem: a venv with the requirements or the project, npm ci, cargo
    /// fetch, go mod download].
    #[arg(long, value_name = "CMD")]
    pub setup: Vec<String>,

    /// Skip the setup phase.
    #[arg(long, conflicts_with = "setup")]
    pub no_setup: bool,

    /// Fill the setup cache again even when one fits (removing it first).
    #[arg(long, conflicts_with = "no_setup")]
    pub refresh_setup: bool,

    /// The longest the whole setup phase may take.
    #[arg(long, value_name = "SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub setup_timeout: u64,

    /// A host the egress proxy may connect to: NAME, *.SUFFIX, an IP address or CIDR range,
    /// each with an optional :PORT (default 80 and 443); repeat it for several. A name never
    /// reaches a loopback, private or link-local address: name the address itself for that.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,

    /// Do not allow the registries the image's package managers use by default (asked of
    /// the tools in the image): only --allow-host and [network] allow.
    #[arg(long)]
    pub no_default_registries: bool,

    /// The agent phase's network: none (the default), or the setup phase's allowlist through
    /// the egress proxy.
    #[arg(long, value_enum, default_value_t = AgentNetwork::None)]
    pub agent_network: AgentNetwork,

    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Which certificate authorities the setup phase (and `--agent-network allowlist`) trusts,
/// beyond the image's own (see the book: docs/src/security/index.md).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Setup and network")]
pub struct TrustArgs {
    /// A PEM file of CA certificates the setup phase trusts too (a proxy that re-signs TLS, a
    /// private registry's CA); repeat it for several. Only its certificates are passed in.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,

    /// Do not pass the host's CA bundle (SSL_CERT_FILE, else the system bundle) to the setup
    /// phase: its tools trust the image's own CAs, or, with --ca-cert, those files only.
    #[arg(long)]
    pub no_host_ca: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentNetwork {
    #[default]
    None,
    Allowlist,
}

/// How a task is worked on (`--strategy`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The agent loop: the model calls tools step by step.
    #[default]
    Loop,
    /// Localise, ask for whole corrected files, test each candidate in its own sandbox.
    Repair,
    /// Repair first; the agent loop on what it leaves unfixed.
    Auto,
}

/// `--repair-reply`: how a repair candidate's files come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RepairReply {
    /// Each file's path on a line of its own, then the whole file in a fenced code block.
    #[default]
    Text,
    /// `write_file` calls (tool calls), one per file.
    Tools,
    /// Search/replace blocks: each change's file, the lines as they are, and what replaces them.
    Blocks,
    /// Only the functions that change, each whole under its file's path, written into the file
    /// in place of the definitions of the same name.
    Functions,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Loop => "loop",
            Strategy::Repair => "repair",
            Strategy::Auto => "auto",
        }
    }
}

/// Settings of one session watched by a person: `run`, `chat` and `demo` (not `eval`, which
/// writes a trajectory per task and cannot ask anyone).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Output")]
pub struct SessionArgs {
    /// Write every request, response, tool call and result to FILE as JSON lines (secrets
    /// redacted).
    #[arg(long, value_name = "FILE")]
    pub trajectory: Option<PathBuf>,

    /// Show each edit as a diff and each shell command, and ask before running it; "n" is sent
    /// to the model as a refusal.
    #[arg(help_heading = "Agent", long)]
    pub approve: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub agent: AgentArgs,

    #[command(flatten)]
    pub session: SessionArgs,

    #[command(flatten)]
    pub publish: PublishArgs,

    /// Print the final report as JSON on stdout (progress stays on stderr).
    #[arg(help_heading = "Output", long)]
    pub json: bool,

    /// Copy the project into the sandbox instead of mounting it: the project directory is not
    /// written during the run; the changes come out as a patch file.
    #[arg(help_heading = "Workspace", long)]
    pub isolate: bool,

    /// Where --isolate writes the patch [default: ./agentbox-SESSION.patch].
    #[arg(help_heading = "Workspace", long, value_name = "FILE")]
    pub patch: Option<PathBuf>,

    /// With --isolate (implied on a remote engine): apply the changes to the project
    /// afterwards, all or nothing, refusing if the project's files changed during the run.
    #[arg(help_heading = "Workspace", long)]
    pub apply: bool,

    /// Work in the named environment: an isolated copy of the project kept after the run
    /// (made on first use, resumed after). NAME: [a-z0-9][a-z0-9._-]*, at most 64 characters.
    #[arg(help_heading = "Workspace", long, value_name = "NAME")]
    pub env: Option<String>,

    /// The project directory, mounted at /workspace.
    pub project: PathBuf,

    /// What to do [default: "The test suite is failing. Find out why and fix the code."].
    #[arg(value_name = "TASK")]
    pub task: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub agent: AgentArgs,

    #[command(flatten)]
    pub session: SessionArgs,

    #[command(flatten)]
    pub publish: PublishArgs,

    /// Chat in the named environment (as `run --env`): its kept copy of the project and its
    /// conversation, made on first use; each request is a turn in its log.
    #[arg(help_heading = "Workspace", long, value_name = "NAME")]
    pub env: Option<String>,

    /// The project directory, mounted at /workspace.
    pub project: PathBuf,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub agent: AgentArgs,

    #[command(flatten)]
    pub session: SessionArgs,

    /// Print the final report as JSON on stdout.
    #[arg(help_heading = "Output", long)]
    pub json: bool,

    /// Put the example's copy here (kept afterwards) instead of a temporary directory.
    #[arg(help_heading = "Workspace", long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Replay the recorded script of model turns even when a model is configured (CI, or a
    /// machine that cannot take the local model's download).
    #[arg(help_heading = "Model", long)]
    pub replay: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct EvalArgs {
    #[command(subcommand)]
    pub command: Option<EvalCommand>,

    #[command(flatten)]
    pub agent: AgentArgs,

    /// Tasks run at once [default: the number of CPUs].
    #[arg(help_heading = "Evaluation", long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,

    /// Run the tasks on this Docker engine: `URL[=JOBS][,certs=DIR]` (repeatable), e.g.
    /// `unix:///var/run/docker.sock=2` or `tcp://host:2376=4,certs=$HOME/.docker/host` (a `~`
    /// inside the word is not expanded by the shell). JOBS: its tasks at once [default: --jobs, else its CPU count]; certs: its TLS material (ca.pem,
    /// cert.pem, key.pem) [default for tcp://: DOCKER_TLS_VERIFY/DOCKER_CERT_PATH]. A task on
    /// an engine that dies goes to another.
    #[arg(
        help_heading = "Evaluation",
        long = "engine",
        value_name = "URL[=JOBS][,certs=DIR]"
    )]
    pub engines: Vec<String>,

    /// Sandboxes made ready ahead of the running tasks, so the next task starts on a sandbox
    /// that exists already (0: make each one when its task starts) [default: as many as --jobs].
    #[arg(help_heading = "Evaluation", long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=256))]
    pub prepare_ahead: Option<u32>,

    /// Sandboxes kept started ahead of need (a warm pool), with the full policy and an empty
    /// workspace: a task takes the next one and its project is copied in. Up to N of each
    /// kind (image, user, limits, caches, services), within half the engine's memory; each
    /// used once; removed at the end (0: none; not with --engine).
    #[arg(help_heading = "Evaluation", long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub pool: u32,

    /// Where results.jsonl, summary.md, report.html, diffs/ and trajectories/ go
    /// [default: eval-results/NAME-OF-TASKS_DIR].
    #[arg(help_heading = "Output", long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Run every task again, even those with results.
    #[arg(help_heading = "Evaluation", long)]
    pub force: bool,

    /// Only this task (repeatable).
    #[arg(help_heading = "Evaluation", long = "task", value_name = "NAME")]
    pub tasks: Vec<String>,

    /// A directory of tasks: each subdirectory holds a project and its TASK.md.
    #[arg(required = true)]
    pub tasks_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Result directories side by side: per task fixed, seconds and tokens; then the totals.
    Compare(CompareArgs),
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Result directories of `agentbox eval` (each with its results.jsonl), two or more.
    #[arg(required = true, num_args = 2..)]
    pub dirs: Vec<PathBuf>,
}

impl Command {
    /// The sandbox settings of a command that starts a sandbox.
    pub fn sandbox_args_mut(&mut self) -> Option<&mut SandboxArgs> {
        match self {
            Command::Run(a) => Some(&mut a.agent.sandbox),
            Command::Chat(a) => Some(&mut a.agent.sandbox),
            Command::Demo(a) => Some(&mut a.agent.sandbox),
            Command::Eval(a) => Some(&mut a.agent.sandbox),
            Command::Exec(a) => Some(&mut a.sandbox),
            Command::Shell(a) => Some(&mut a.sandbox),
            Command::Mcp(a) => Some(&mut a.sandbox),
            Command::Doctor(a) => Some(&mut a.sandbox),
            Command::Gc(_) | Command::Image(_) | Command::Env(_) => None,
        }
    }
}

/// `--gateway-budget-usd`: a positive, finite number of dollars (`2.50`, `$2.50`).
fn positive_dollars(text: &str) -> Result<f64, String> {
    let n: f64 = text
        .trim()
        .trim_start_matches('$')
        .parse()
        .map_err(|_| format!("{text:?} is not a number of dollars (e.g. 2.50)"))?;
    if n.is_finite() && n > 0.0 {
        Ok(n)
    } else {
        Err(format!("{text:?}: the budget must be more than 0 dollars"))
    }
}
