//! `agentbox exec PROJECT -- CMD...`

use std::io::Write;

use crate::cli::ExecArgs;
use crate::config::{SandboxConfig, UsageError};
use crate::sandbox::Cleanup;
use crate::sandbox::{ExecRequest, Sandbox, parse_size};

/// timeout(1)'s status for a command that ran out of time.
pub const EXIT_TIMED_OUT: u8 = 124;

pub async fn run(args: ExecArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    cfg.cleanup = cleanup;
    let limit =
        parse_size(&args.output_limit).map_err(|e| UsageError(format!("--output-limit: {e}")))? as usize;
    if limit > 16 << 20 {
        return Err(UsageError("--output-limit: at most 16m (from each end of each stream)".into()).into());
    }
    if cfg.image_source.is_none() && args.project.is_dir() {
        // As `run` chooses it (said only in the debug log: stdout and stderr are the command's).
        let root = args.project.clone();
        let detection = tokio::task::spawn_blocking(move || crate::project::detect(&root)).await?;
        let choice = crate::session::choose_image(&cfg, &args.project, &detection).await;
        tracing::debug!(image = %choice.image, reason = %choice.reason, "image chosen");
        cfg.image = choice.image;
    }
    let (_docker, sandbox) = crate::session::open_sandbox(&cfg, &args.project).await?;
    for warning in crate::image::toolchain_warnings(&cfg.image, &args.project).await {
        errln!("agentbox: WARNING: {warning}");
    }
    let timeout = cfg.command_timeout_for(&cfg.image);
    let request = ExecRequest::argv(args.command.clone(), timeout).capture(limit, limit);
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

/// A reader that stopped reading (`agentbox exec ... | head`) is not a failure of the command;
/// any other write error (a full disk behind a redirect) still is.
fn reader_gone_is_fine(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
