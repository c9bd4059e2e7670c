//! `agentbox mcp PROJECT`: an MCP server on stdio (stdout is the protocol; everything else goes
//! to stderr) offering agentbox's tools on one sandbox, removed when the client goes away.

use std::time::Duration;

use rmcp::ServiceExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::McpArgs;
use crate::config::SandboxConfig;
use crate::mcp::{Ready, Server, Tools};
use crate::sandbox::{Cleanup, Sandbox};

use crate::session::{IsolatedCopy, baseline};
use crate::tools::{ToolRegistry, ToolSettings};

pub async fn run(args: McpArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    crate::config::project_arg(&args.project)?;
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    // A bad setup flag is a usage error before any work, not a failed session.
    let mut setup = crate::config::SetupSettings::from_args(&args.setup)?;
    // Held for the whole session; its flags decide the setup.
    let env_turn = match &args.env {
        Some(name) => Some(super::env_turn::EnvTurn::begin(name, &mut setup, &mut cfg)?),
        None => None,
    };
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
    // Each request is said on stderr as it ends: an MCP server's stderr is its log.
    let gateway = super::gateway::ModelGateway::start(&args.gateway, true)?.map(std::sync::Arc::new);
    if let Some(g) = &gateway {
        cfg.extras.forwards.extend(g.forwards());
    }
    for warning in crate::toolchain::toolchain_warnings(&cfg.image, &args.project).await {
        errln!("agentbox: WARNING: {}", crate::output::escaped(&warning));
    }
    for hint in crate::project::services::service_hints(&args.project, &cfg.services) {
        errln!("agentbox: hint: {}", crate::output::escaped(&hint));
    }
    let timeout = cfg.command_timeout_for(&cfg.image);
    let settings = ToolSettings {
        command_timeout: timeout,
        test_commands,
        protect_tests: args.protect_tests,
        ..Default::default()
    };
    // The tools are known before the sandbox is: the client's `initialize` and `tools/list`
    // are answered at once, and setup (which may take minutes) runs behind them, its progress
    // sent as log messages; a call that comes meanwhile waits for it.
    let server = Server::new(Tools {
        registry: ToolRegistry::standard(!args.no_shell, false),
        settings,
    });
    // SIGINT and SIGTERM end the session here, like the client's going away, so that the
    // patch is written before the sandbox goes.
    let _interrupts = cleanup_claims.claim_interrupts();
    let _termination = cleanup_claims.claim_termination();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut code = 0;
    let isolate = args.isolate || super::copy_for_remote_engine(&args.project);
    let mut opener = None;
    let served = async {
        let running = server
            .clone()
            .serve((server.stdin(), tokio::io::stdout()))
            .await
            .map_err(|e| anyhow::anyhow!("MCP: {e}"))?;
        let environment = Environment {
            cfg: cfg.clone(),
            setup: setup.clone(),
            project: args.project.clone(),
            isolate: isolate.then(|| args.patch.clone()),
            env: env_turn.as_ref().map(|t| t.name.clone()),
            peer: running.peer().clone(),
            gateway: gateway.clone(),
        };
        opener = Some(tokio::spawn(open(environment, server.clone(), published)));
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
    // An environment still being set up is given up: what it made is registered with the
    // cleanup, which removes it.
    let opened = match opener {
        Some(task) if task.is_finished() => task.await.ok(),
        Some(task) => {
            task.abort();
            let _ = task.await;
            None
        }
        None => None,
    };
    let Some(sandbox) = server.sandbox() else {
        served?;
        // The environment could not be opened: said on stderr and to the client.
        return Ok(if code == 0 && matches!(opened, Some(Err(()))) {
            4
        } else {
            code
        });
    };
    let (copy, published) = match opened {
        Some(Ok(kept)) => (kept.copy, Some(kept.published)),
        _ => (None, None),
    };
    // The client is gone: what it left running in the background ends with the session (before
    // the read-back, which needs the sandbox quiet).
    if let Ok(Ok(stopped)) = sandbox.stop_processes(None, "at the end of the session").await {
        let why = Some("at the end of the session");
        for p in stopped.iter().filter(|p| p.stopped.as_deref() == why) {
            errln!(
                "agentbox: background process {} `{}` stopped at the end of the session",
                crate::output::escaped(&p.id),
                crate::events::for_terminal(&p.label(100))
            );
        }
    }
    if let (Some(copy), Some(env)) = (&copy, &env_turn) {
        // Nothing may write while the changes are read back.
        let _ = sandbox.interrupt().await;
        let task = "mcp session";
        let kept = copy.finish_env(sandbox, timeout).await;
        env.close(&setup, task, "ended".into(), kept, "");
    } else if let Some(copy) = &copy {
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
    if let Some(g) = &gateway {
        g.summary();
    }
    drop(gateway);
    sandbox.shutdown().await?;
    if let Some(check) = sandbox.check_host() {
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

/// What opening the session's environment needs, moved into its task.
struct Environment {
    cfg: SandboxConfig,
    setup: crate::config::SetupSettings,
    project: std::path::PathBuf,
    /// `--isolate` (or a remote engine), with `--patch` if given.
    isolate: Option<Option<std::path::PathBuf>>,
    /// `--env NAME` (its lock held by the session).
    env: Option<crate::envs::EnvName>,
    peer: rmcp::Peer<rmcp::RoleServer>,
    gateway: Option<std::sync::Arc<super::gateway::ModelGateway>>,
}

/// What lives as long as the sandbox, besides it.
struct Kept {
    copy: Option<IsolatedCopy>,
    published: super::publish::Published,
    _prepared: crate::session::setup_phase::Prepared,
}

/// Setup (or its cache), then the sandbox: the environment `run` gives the agent. The server is
/// told the outcome; a failure is printed, sent as an error log message, and the answer to
/// every call.
#[allow(
    deprecated,
    reason = "MCP logging (notifications/message) is what clients show today; SEP-2577 deprecates it for a later protocol release"
)]
async fn open(env: Environment, server: Server, published: super::publish::Published) -> Result<Kept, ()> {
    let log = PeerLog::start(env.peer.clone());
    let project = env.project.clone();
    let opened = open_inner(env, published, log.clone()).await;
    match opened {
        Ok((ready, kept)) => {
            errln!(
                "agentbox: MCP server on stdio; sandbox {} ({}) on {}",
                crate::output::escaped(&ready.sandbox.info().session),
                crate::output::escaped(&ready.sandbox.info().image),
                crate::output::escaped(project.display()),
            );
            log.send(
                rmcp::model::LoggingLevel::Info,
                format!("agentbox: sandbox {} ready", ready.sandbox.info().session),
            );
            server.opened(Ok(ready));
            Ok(kept)
        }
        Err(e) => {
            let e = format!("{e:#}");
            errln!("agentbox: error: {}", crate::output::escaped(&e));
            log.send(rmcp::model::LoggingLevel::Error, format!("agentbox: {e}"));
            server.opened(Err(crate::mcp::NotReady(e)));
            Err(())
        }
    }
}

async fn open_inner(
    mut env: Environment,
    published: super::publish::Published,
    log: PeerLog,
) -> anyhow::Result<(Ready, Kept)> {
    let prepared = super::prepare_environment(
        &env.setup,
        (env.isolate.is_some(), env.env.as_ref()),
        &mut env.cfg,
        &env.project,
        vec![Box::new(log)],
    )
    .await?;
    // After setup, which sets the agent phase's environment afresh (keeping the forwards).
    if let Some(g) = &env.gateway {
        env.cfg.extras.env.extend(g.sandbox_env());
    }
    let (sandbox, copy) = match (env.env, env.isolate) {
        (Some(name), _) => {
            let (sandbox, copy) = IsolatedCopy::open_env(&env.cfg, &env.project, name).await?;
            (sandbox, Some(copy))
        }
        (None, Some(patch)) => {
            let (sandbox, copy) = IsolatedCopy::open(&env.cfg, &env.project, patch).await?;
            (sandbox, Some(copy))
        }
        (None, None) => (
            crate::session::open_sandbox(&env.cfg, &env.project).await?.1,
            None,
        ),
    };
    if let Err(e) = published.announce(&sandbox).await {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    if let Some(Err(e)) = env.gateway.as_ref().map(|g| g.announce(&sandbox)) {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    let timeout = env.cfg.command_timeout_for(&sandbox.info().image);
    let baseline_error = baseline::snapshot(&sandbox, timeout.max(Duration::from_secs(60)))
        .await
        .err()
        .map(std::sync::Arc::new);
    Ok((
        Ready {
            sandbox,
            baseline_error,
        },
        Kept {
            copy,
            published,
            _prepared: prepared,
        },
    ))
}

/// The session's progress lines (setup's, the sandbox's start), sent to the client as MCP log
/// messages (`notifications/message`) in the order they came, by a task of its own.
#[allow(
    deprecated,
    reason = "MCP logging (notifications/message) is what clients show today; SEP-2577 deprecates it for a later protocol release"
)]
#[derive(Clone)]
struct PeerLog(tokio::sync::mpsc::UnboundedSender<(rmcp::model::LoggingLevel, String)>);

#[allow(
    deprecated,
    reason = "MCP logging (notifications/message) is what clients show today; SEP-2577 deprecates it for a later protocol release"
)]
impl PeerLog {
    fn start(peer: rmcp::Peer<rmcp::RoleServer>) -> PeerLog {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(rmcp::model::LoggingLevel, String)>();
        tokio::spawn(async move {
            while let Some((level, line)) = rx.recv().await {
                let message =
                    rmcp::model::LoggingMessageNotificationParam::new(level, serde_json::Value::String(line))
                        .with_logger("agentbox");
                if peer.notify_logging_message(message).await.is_err() {
                    break;
                }
            }
        });
        PeerLog(tx)
    }

    fn send(&self, level: rmcp::model::LoggingLevel, line: String) {
        let _ = self.0.send((level, line));
    }
}

#[allow(
    deprecated,
    reason = "MCP logging (notifications/message) is what clients show today; SEP-2577 deprecates it for a later protocol release"
)]
impl crate::events::EventSink for PeerLog {
    fn emit(&self, event: &crate::events::Event<'_>) {
        use crate::events::Event;
        use rmcp::model::LoggingLevel;
        match event {
            Event::Note { message } => self.send(LoggingLevel::Info, format!("agentbox: {message}")),
            Event::SetupOutput { command, status, .. } => self.send(
                LoggingLevel::Info,
                format!("agentbox: setup: `{command}`: {status}"),
            ),
            Event::Egress { decision, .. } if !decision.allowed => self.send(
                LoggingLevel::Warning,
                format!("agentbox: setup: blocked {}:{}", decision.host, decision.port),
            ),
            _ => {}
        }
    }
}
