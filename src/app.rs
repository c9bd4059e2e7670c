//! The edge: parse, set up logging, run a command, and make sure that on every way out —
//! success, error, panic, Ctrl-C, SIGTERM — no sandbox container is left behind.

use std::process::ExitCode;

use clap::FromArgMatches;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{Cli, Command};
use crate::config::UsageError;
use crate::sandbox::Cleanup;

use crate::exit::{AGENTBOX_ERROR as EXIT_AGENTBOX_ERROR, USAGE as EXIT_USAGE};

pub fn main() -> ExitCode {
    let cli = match parse_args() {
        Ok(cli) => cli,
        Err(e) => {
            errln!("agentbox: error: {}", crate::output::escaped(&e));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            errln!(
                "agentbox: cannot start the async runtime: {}",
                crate::output::escaped(&e)
            );
            return ExitCode::from(EXIT_AGENTBOX_ERROR);
        }
    };
    let code = runtime.block_on(run_with_cleanup(cli));
    // Anything still running (a stuck Docker call) must not delay the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    ExitCode::from(code)
}

/// Flags > environment > config file > defaults: the file's values become clap's defaults.
fn parse_args() -> Result<Cli, UsageError> {
    let mut cmd = crate::cli::command();
    let mut services = Vec::new();
    if let Some((path, table)) = crate::config_file::load()? {
        cmd = crate::config_file::apply(cmd, &table, &path)?;
        services = crate::config_file::services(&table, &path)?;
    }
    let matches = cmd.get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(args) = cli.command.sandbox_args_mut() {
        args.service_definitions = services;
    }
    // Only commands with sandbox settings have an `image` argument to ask about.
    if let Some(args) = cli.command.sandbox_args_mut()
        && args.image.is_some()
    {
        let source = matches
            .subcommand()
            .and_then(|(_, sub)| sub.value_source("image"))
            .map(|s| match s {
                clap::parser::ValueSource::CommandLine => "--image",
                clap::parser::ValueSource::EnvVariable => "AGENTBOX_IMAGE",
                // The config file's values are clap's defaults; there is no built-in one.
                _ => "the config file",
            });
        args.image_source = source.map(String::from);
    }
    Ok(cli)
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "agentbox=warn",
        1 => "agentbox=debug",
        _ => "agentbox=trace,bollard=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::output::LogWriter::default)
        .with_ansi(false)
        .with_target(false)
        .init();
}

async fn run_with_cleanup(cli: Cli) -> u8 {
    // Without them Ctrl-C could not remove the sandbox: refuse to start rather than risk it.
    let (mut sigint, mut sigterm) = match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            errln!(
                "agentbox: error: cannot listen for Ctrl-C and SIGTERM: {}",
                crate::output::escaped(&e)
            );
            return 1;
        }
    };
    let error_code = error_code_for(&cli.command);
    // The one owner of what the run must not leave behind; every command gets a handle.
    let cleanup = Cleanup::default();
    let mut task = tokio::spawn(dispatch(cli.command, cleanup.clone()));
    let code = loop {
        break tokio::select! {
            joined = &mut task => match joined {
                Ok(Ok(code)) => code,
                Ok(Err(err)) => report_error(&err, error_code),
                Err(join) if join.is_panic() => {
                    errln!("agentbox: internal error (panic); removing the sandbox");
                    101
                }
                Err(_) => error_code,
            },
            // The chat cancels what it waits for on Ctrl-C, and stays.
            _ = sigint.recv() => if cleanup.interrupts_claimed() {
                continue;
            } else {
                interrupted(&mut task, "SIGINT", 130).await
            },
            // The MCP server ends its session itself (it writes its patch first).
            _ = sigterm.recv() => if cleanup.termination_claimed() {
                continue;
            } else {
                interrupted(&mut task, "SIGTERM", 143).await
            },
        };
    };
    // After a normal end nothing is left; after an interruption or a panic: the containers and
    // volumes, then the host check of a session cut short (planted git metadata).
    for w in cleanup.run().await {
        errln!("agentbox: WARNING: {}", crate::events::for_terminal(&w));
    }
    code
}

async fn interrupted(task: &mut tokio::task::JoinHandle<anyhow::Result<u8>>, name: &str, code: u8) -> u8 {
    errln!(
        "\nagentbox: {} received; stopping and removing the sandbox",
        crate::output::escaped(name)
    );
    // Dropping the command's future drops its sandbox: the keep-alive connection closes and the
    // explicit removal after this makes it certain. Edits are atomic renames, so a file is
    // either edited or not.
    task.abort();
    let _ = task.await;
    // An `--apply` in progress finishes before cleanup goes on (see `Cleanup::run`).
    code
}

fn error_code_for(command: &Command) -> u8 {
    match command {
        Command::Exec(_) | Command::Shell(_) => EXIT_AGENTBOX_ERROR,
        Command::Run(_) | Command::Chat(_) | Command::Demo(_) | Command::Eval(_) => {
            crate::report::exit::ERROR
        }
        _ => 1,
    }
}

fn report_error(err: &anyhow::Error, code: u8) -> u8 {
    errln!(
        "agentbox: error: {}",
        crate::output::escaped(format_args!("{err:#}"))
    );
    let usage = err.downcast_ref::<UsageError>().is_some()
        || matches!(
            err.downcast_ref::<crate::session::SessionError>(),
            Some(crate::session::SessionError::Usage(_))
        );
    if usage { EXIT_USAGE } else { code }
}

async fn dispatch(command: Command, cleanup: Cleanup) -> anyhow::Result<u8> {
    match command {
        Command::Run(args) => crate::commands::run::run(args, cleanup).await,
        Command::Chat(args) => crate::commands::chat::run(args, cleanup).await,
        Command::Demo(args) => crate::commands::demo::run(args, cleanup).await,
        Command::Eval(args) => crate::commands::eval::run(args, cleanup).await,
        Command::Exec(args) => crate::commands::exec::run(args, cleanup).await,
        Command::Shell(args) => crate::commands::shell::run(args, cleanup).await,
        Command::Mcp(args) => crate::commands::mcp::run(args, cleanup).await,
        Command::Doctor(args) => crate::commands::doctor::run(args, cleanup).await,
        Command::Gc(args) => crate::commands::gc::run(args).await,
        Command::Env(command) => crate::commands::env::run(command, &cleanup).await,
        Command::Image(cmd) => crate::commands::image::run(cmd, cleanup).await,
    }
}
