//! `agentbox exec PROJECT -- CMD...`

use std::io::Write;

use crate::cli::ExecArgs;
use crate::config::{SandboxConfig, UsageError};
use crate::sandbox::Cleanup;
use crate::sandbox::{ExecRequest, Sandbox, parse_size};

/// timeout(1)'s status for a command that ran out of time.
pub const EXIT_TIMED_OUT: u8 = 124;

pub async fn run(args: ExecArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    if args.tty {
        // `exec -it`: the same as `shell PROJECT -- CMD`.
        let options = super::shell::Options {
            read_only: false,
            session_timeout: None,
        };
        return super::shell::interactive(&args.sandbox, &args.project, args.command, options, cleanup).await;
    }
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    cfg.cleanup = cleanup;
    let limit =
        parse_size(&args.output_limit).map_err(|e| UsageError(format!("--output-limit: {e}")))? as usize;
    if limit > 16 << 20 {
        return Err(UsageError("--output-limit: at most 16m (from each end of each stream)".into()).into());
    }
    if !args.interactive && wants_a_terminal(&args.command) && crate::terminal::is_tty(crate::terminal::STDIN)
    {
        // Without stdin an interactive shell reads EOF and exits at once, and the user's next
        // line would run on the host while they believe they are inside.
        errln!(
            "agentbox: `{}` is an interactive shell, and exec gives it no terminal and no input: it              would exit at once. Use `agentbox shell {}` for a shell in the sandbox (or `exec -it`).",
            crate::events::for_terminal(&args.command.join(" ")),
            crate::events::for_terminal(&args.project.display().to_string()),
        );
        return Ok(crate::app::EXIT_USAGE);
    }
    choose_image_quietly(&mut cfg, &args.project).await?;
    let stdin = if args.interactive {
        Some(read_stdin().await?)
    } else {
        None
    };
    let (_docker, sandbox) = crate::session::open_sandbox(&cfg, &args.project).await?;
    for warning in crate::image::toolchain_warnings(&cfg.image, &args.project).await {
        errln!("agentbox: WARNING: {warning}");
    }
    let timeout = cfg.command_timeout_for(&cfg.image);
    let mut request = ExecRequest::argv(args.command.clone(), timeout).capture(limit, limit);
    if let Some(data) = stdin {
        request = request.stdin(data);
    }
    let result = sandbox.exec(request).await;
    sandbox.shutdown().await?;
    let check = sandbox.check_host().unwrap_or_default();
    for w in &check.warnings {
        errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
    }
    if check.unresolved {
        // Said after the warnings, instead of the command's status: what the command left
        // would run on this machine.
        anyhow::bail!("something git would run could not be moved out of the project (see the warnings)");
    }
    let out = result?;

    let mut stdout = std::io::stdout().lock();
    reader_gone_is_fine(stdout.write_all(out.stdout.to_text().as_bytes()))?;
    reader_gone_is_fine(stdout.flush())?;
    let mut stderr = std::io::stderr().lock();
    reader_gone_is_fine(stderr.write_all(out.stderr.to_text().as_bytes()))?;
    if out.truncated() {
        writeln!(
            stderr,
            "agentbox: output was cut to the first and last {} of each stream (--output-limit)",
            args.output_limit
        )?;
    }
    let code = if out.timed_out {
        writeln!(
            stderr,
            "agentbox: {} (--command-timeout {} raises the limit)",
            out.status_line(),
            timeout.as_secs()
        )?;
        EXIT_TIMED_OUT
    } else {
        if out.oom_killed || out.signal.is_some() {
            writeln!(stderr, "agentbox: {}", out.status_line())?;
        }
        u8::try_from(out.exit_code).unwrap_or(1)
    };
    Ok(code)
}

/// The image for `project` as `run` chooses it, unless one was given (said only in the debug
/// log: stdout and stderr are the command's).
pub(crate) async fn choose_image_quietly(
    cfg: &mut SandboxConfig,
    project: &std::path::Path,
) -> anyhow::Result<()> {
    if cfg.image_source.is_none() && project.is_dir() {
        let root = project.to_path_buf();
        let detection = tokio::task::spawn_blocking(move || crate::project::detect(&root)).await?;
        let choice = crate::session::choose_image(cfg, project, &detection).await;
        tracing::debug!(image = %choice.image, reason = %choice.reason, "image chosen");
        cfg.image = choice.image;
    }
    Ok(())
}

/// A shell started with nothing to run: it would read commands from a terminal.
fn wants_a_terminal(command: &[String]) -> bool {
    let shells = [
        "bash", "sh", "zsh", "dash", "fish", "ksh", "python", "python3", "node", "irb",
    ];
    match command {
        [one] => {
            let base = one.rsplit('/').next().unwrap_or(one);
            shells.contains(&base)
        }
        [first, flags @ ..] => {
            let base = first.rsplit('/').next().unwrap_or(first);
            matches!(base, "bash" | "sh" | "zsh" | "dash")
                && flags
                    .iter()
                    .all(|f| matches!(f.as_str(), "-l" | "--login" | "-i"))
        }
        [] => false,
    }
}

/// `exec -i`: the host's stdin, all of it, up to the limit the sandbox's executor takes.
async fn read_stdin() -> anyhow::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let cap = MAX_STDIN;
    let mut data = Vec::new();
    let n = tokio::io::stdin()
        .take(cap as u64 + 1)
        .read_to_end(&mut data)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read stdin: {e}"))?;
    if n > cap {
        return Err(UsageError(format!(
            "exec -i: stdin is larger than {}; pass a file in the project instead",
            crate::sandbox::human_bytes(cap as u64)
        ))
        .into());
    }
    Ok(data)
}

/// Most stdin `exec -i` forwards: it is held in memory on both sides.
const MAX_STDIN: usize = 64 << 20;

/// A reader that stopped reading (`agentbox exec ... | head`) is not a failure of the command;
/// any other write error (a full disk behind a redirect) still is.
fn reader_gone_is_fine(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
