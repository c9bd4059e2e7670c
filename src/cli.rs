//! Command-line arguments, parsed once by clap and then resolved into validated config
//! (`config.rs`). Nothing below `config` sees raw arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::image::DEFAULT_IMAGE;

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
    /// Run one command in a fresh sandbox and print its output; exits with its status.
    Exec(ExecArgs),
    /// Check Docker, the image and the sandbox policy; print a fix for each problem.
    Doctor(DoctorArgs),
    /// Remove containers and volumes left by agentbox processes that were killed.
    Gc(GcArgs),
    /// Build or inspect sandbox images.
    #[command(subcommand)]
    Image(ImageCommand),
}

/// Sandbox settings shared by every command that starts one.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// Image the sandbox runs.
    #[arg(long, env = "AGENTBOX_IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,

    /// Seconds before a command, and everything it started, is killed.
    #[arg(long, value_name = "SECS", env = "AGENTBOX_COMMAND_TIMEOUT", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub command_timeout: u64,

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

    /// Size of the sandbox's /tmp (a tmpfs, counted against --memory).
    #[arg(long, value_name = "SIZE", default_value = "512m")]
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
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Bytes of output kept from the start and from the end of each stream.
    #[arg(long, value_name = "SIZE", default_value = "1m")]
    pub output_limit: String,

    /// The project directory, mounted at /workspace.
    pub project: PathBuf,

    /// The command and its arguments (no shell; use `bash -lc '...'` for one).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Also check this project directory (owner, .git) before you run agentbox on it.
    pub project: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Also remove resources of agentbox processes that are still running.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an agentbox image (default: python) through the Docker API, or offline.
    Build(ImageBuildArgs),
    /// List the images agentbox knows how to build, and whether each is present.
    List,
}

#[derive(Debug, Args)]
pub struct ImageBuildArgs {
    /// Image to build: a name from `agentbox image list`.
    #[arg(default_value = "python")]
    pub name: String,

    /// Build from Debian packages with mmdebstrap and import the result, for machines that
    /// reach no container registry.
    #[arg(long)]
    pub offline: bool,

    /// Debian mirror for --offline [default: this host's APT sources].
    #[arg(long, value_name = "URL", requires = "offline")]
    pub mirror: Option<String>,

    /// Rebuild even if the image exists.
    #[arg(long)]
    pub force: bool,
}
