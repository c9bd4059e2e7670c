//! `agentbox mcp PROJECT`: an MCP server on stdio (stdout is the protocol; everything else goes
//! to stderr) offering agentbox's tools on one sandbox, removed when the client goes away.

use std::time::Duration;

use rmcp::ServiceExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::McpArgs;
use crate::config::SandboxConfig;
use crate::mcp::{Server, Tools};
use crate::sandbox::{Cleanup, Sandbox};
use crate::session::{IsolatedCopy, baseline};
use crate::tools::{ToolRegistry, ToolSettings};

pub async fn run(args: McpArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    crate::config::project_arg(&args.project)?;
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    let cleanup_claims = cleanup.clone();
    cfg.cleanup = cleanup;
    let root = args.project.clone();
    let detection = tokio::task::spawn_blocking(move || crate::project::detect(&root)).await?;
    let choice = crate::session::choose_image(&cfg, &args.project, &detection).await;
    tracing::info!(image = %choice.image, reason = %choice.reason, "image chosen");
    cfg.image = choice.image;
    let test_commands: Vec<String> = if args.test_cmd.is_empty() {
        detection.commands.iter().map(|t| t.command.clone()).collect()
    } else {
        args.test_cmd.clone()
    };
    let published = super::publish::Published::start(&args.publish)?;
    cfg.extras.forwards.extend(published.forwards());
    // The sandbox exists before the first message is read: the client's `initialize` is
    // answered by a server whose tools are ready.
    let (sandbox, copy) = if args.isolate || super::copy_for_remote_engine(&args.project) {
        let (sandbox, copy) = IsolatedCopy::open(&cfg, &args.project, args.patch.clone()).await?;
        (sandbox, Some(copy))
    } else {
        (crate::session::open_sandbox(&cfg, &args.project).await?.1, None)
    };
    if let Err(e) = published.announce(&sandbox).await {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    for warning in crate::image::toolchain_warnings(&cfg.image, &args.project).await {
        errln!("agentbox: WARNING: {}", crate::output::escaped(&warning));
    }
    let timeout = cfg.command_timeout_for(&sandbox.info().image);
    let baseline_error = baseline::snapshot(&sandbox, timeout.max(Duration::from_secs(60)))
        .await
        .err();
    let settings = ToolSettings {
        command_timeout: timeout,
        test_commands,
        protect_tests: args.protect_tests,
        ..Default::default()
    };
    errln!(
        "agentbox: MCP server on stdio; sandbox {} ({}) on {}",
        crate::output::escaped(&sandbox.info().session),
        crate::output::escaped(&sandbox.info().image),
        crate::output::escaped(args.project.display())
    );
    let server = Server::new(Tools {
        sandbox,
        registry: ToolRegistry::standard(!args.no_shell, false),
        settings,
        baseline_error,
    });
    // SIGINT and SIGTERM end the session here, like the client's going away, so that the
    // patch is written before the sandbox goes.
    let _interrupts = cleanup_claims.claim_interrupts();
    let _termination = cleanup_claims.claim_termination();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut code = 0;
    let served = async {
        let running = server
            .clone()
            .serve((server.stdin(), tokio::io::stdout()))
            .await
            .map_err(|e| anyhow::anyhow!("MCP: {e}"))?;
        let stop = running.cancellation_token();
        tokio::select! {
            // Ends when the client closes stdin (it disconnected or died).
            reason = running.waiting() => tracing::info!(?reason, "MCP session over"),
            _ = sigint.recv() => { stop.cancel(); code = 130; }
            _ = sigterm.recv() => { stop.cancel(); code = 143; }
        }
        anyhow::Ok(())
    }
    .await;
    // From here no call runs: those waiting give up, the one running is stopped, and the turn
    // is held to the end, so the read-back sees the sandbox as the calls answered left it.
    let _turn = server.end().await;
    // The client is gone: what it left running in the background ends with the session (before
    // the read-back, which needs the sandbox quiet).
    if let Ok(Ok(stopped)) = server
        .sandbox()
        .stop_processes(None, "at the end of the session")
        .await
    {
        let why = Some("at the end of the session");
        for p in stopped.iter().filter(|p| p.stopped.as_deref() == why) {
            errln!(
                "agentbox: background process {} `{}` stopped at the end of the session",
                crate::output::escaped(&p.id),
                crate::events::for_terminal(&p.label(100))
            );
        }
    }
    if let Some(copy) = &copy {
        let sandbox = server.sandbox();
        // Nothing may write while the changes are read back.
        let _ = sandbox.interrupt().await;
        match copy.finish(sandbox, timeout, &sandbox.info().session).await {
            Ok(p) => {
                for w in &p.warnings {
                    errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
                }
                errln!(
                    "agentbox: {} untouched; {} file(s) changed in the copy; patch: {}",
                    crate::output::escaped(args.project.display()),
                    p.changed,
                    crate::output::escaped(p.path.display())
                );
            }
            Err(e) => errln!(
                "agentbox: cannot tell what changed in the copy: {}",
                crate::output::escaped(&e)
            ),
        }
    }
    drop(published);
    server.sandbox().shutdown().await?;
    if let Some(check) = server.sandbox().check_host() {
        for w in &check.warnings {
            errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
        }
        errln!(
            "agentbox: sandbox removed; {} path(s) changed in {}",
            check.changes.paths.len(),
            crate::output::escaped(args.project.display())
        );
    }
    served?;
    Ok(code)
}
