//! `agentbox shell PROJECT [-- CMD...]` (and `exec -it`): a person's terminal on a process in a
//! sandbox with the full policy. The host terminal is raw while the process runs and restored
//! on every way out; its size follows the window; the process's status is agentbox's.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::ShellArgs;
use crate::config::{SandboxConfig, UsageError};
use crate::exit::TIMED_OUT as EXIT_TIMED_OUT;
use crate::sandbox::tty::{AttachRequest, Chunk};
use crate::sandbox::{Cleanup, DockerSandbox, Sandbox};
use crate::session::IsolatedCopy;
use crate::terminal::{self, RawMode, STDIN, STDOUT, StdinPump};

pub async fn run(args: ShellArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    let command = if args.command.is_empty() {
        vec!["bash".to_string(), "-l".to_string()]
    } else {
        args.command.clone()
    };
    let options = Options {
        read_only: args.read_only,
        isolate: args.isolate.then(|| args.patch.clone()),
        session_timeout: args.session_timeout.map(Duration::from_secs),
        gateway: args.gateway.clone(),
        env: args.env.clone(),
    };
    interactive(
        &args.sandbox,
        &args.publish,
        &args.setup,
        &args.project,
        command,
        options,
        cleanup,
    )
    .await
}

pub struct Options {
    pub read_only: bool,
    /// `--isolate`, with the `--patch` path if given.
    pub isolate: Option<Option<std::path::PathBuf>>,
    pub session_timeout: Option<Duration>,
    /// `--model-gateway` and its settings.
    pub gateway: crate::cli::GatewayArgs,
    /// `--env NAME`.
    pub env: Option<String>,
}

/// `shell`, and `exec -it` with its command.
pub async fn interactive(
    sandbox_args: &crate::cli::SandboxArgs,
    publish: &crate::cli::PublishArgs,
    setup_args: &crate::cli::SetupArgs,
    project: &Path,
    command: Vec<String>,
    mut options: Options,
    cleanup: Cleanup,
) -> anyhow::Result<u8> {
    crate::config::project_arg(project)?;
    if options.isolate.is_none() && super::copy_for_remote_engine(project) {
        options.isolate = Some(None);
    }
    if !terminal::is_tty(STDIN) || !terminal::is_tty(STDOUT) {
        return Err(UsageError(
            "an interactive shell needs a terminal on stdin and stdout; without one, run a command \
             with `agentbox exec PROJECT -- CMD` (add -i to give it stdin)"
                .into(),
        )
        .into());
    }
    let mut cfg = SandboxConfig::from_args(sandbox_args)?;
    cfg.cleanup = cleanup;
    let mut setup = crate::config::SetupSettings::from_args(setup_args)?;
    // Locked before its image and setup, which what it was made with decides.
    let env = match &options.env {
        Some(name) => Some(super::env_turn::EnvTurn::begin(name, &mut setup, &mut cfg)?),
        None => None,
    };
    super::exec::choose_image_quietly(&mut cfg, project).await?;
    // The environment `run` gives the agent: setup (or its cache) before the sandbox. With
    // --isolate, --read-only or --env the project is only read: setup works on a copy of its
    // own.
    let copied = options.isolate.is_some() || options.read_only || env.is_some();
    let _prepared = super::prepare_environment(
        &setup,
        (copied, env.as_ref().map(|e| &e.name)),
        &mut cfg,
        project,
        Vec::new(),
    )
    .await?;
    let published = super::publish::Published::start(publish)?;
    cfg.extras.forwards.extend(published.forwards());
    let gateway = super::gateway::ModelGateway::start(&options.gateway, false)?;
    if let Some(g) = &gateway {
        cfg.extras.forwards.extend(g.forwards());
        cfg.extras.env.extend(g.sandbox_env());
    }
    let (sandbox, copy) = match (&env, &options.isolate) {
        (Some(env), _) => {
            let (sandbox, copy) = IsolatedCopy::open_env(&cfg, project, env.name.clone()).await?;
            (sandbox, Some(copy))
        }
        (None, Some(patch)) => {
            let (sandbox, copy) = IsolatedCopy::open(&cfg, project, patch.clone()).await?;
            (sandbox, Some(copy))
        }
        (None, None) => {
            let mut spec = cfg.bind_spec(project)?;
            spec.read_only = options.read_only;
            (crate::session::open_spec(&cfg, spec).await?.1, None)
        }
    };
    if let Err(e) = published.announce(&sandbox).await {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    if let Some(Err(e)) = gateway.as_ref().map(|g| g.announce(&sandbox)) {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    super::exec::say_warnings(&sandbox, &cfg, project).await;
    let name = prompt_name(project);
    errln!(
        "agentbox: a shell in sandbox {} ({}), the project {}at /workspace, no network. Leave with \
         `exit` or Ctrl-D; the sandbox is then removed.",
        crate::output::escaped(&sandbox.info().session),
        crate::output::escaped(&sandbox.info().image),
        if options.read_only {
            "read-only "
        } else if env.is_some() {
            "(environment's copy: your directory is not written) "
        } else if copy.is_some() {
            "(a copy: your directory is not written) "
        } else {
            ""
        },
    );
    let ended = {
        // While the terminal is raw, SIGTERM and SIGINT end the shell here: the terminal is
        // restored before anything is printed, and an --isolate patch is still written.
        let _interrupts = cfg.cleanup.claim_interrupts();
        let _termination = cfg.cleanup.claim_termination();
        attach_terminal(&sandbox, command.clone(), &name, options.session_timeout).await
    };
    let mut kept = None;
    let patch = match &copy {
        Some(copy) => {
            // Nothing may write while the changes are read back.
            let _ = sandbox.interrupt().await;
            let timeout = cfg.command_timeout_for(&sandbox.info().image);
            if env.is_some() {
                kept = Some(copy.finish_env(&sandbox, timeout).await);
                None
            } else {
                Some(copy.finish(&sandbox, timeout, &sandbox.info().session).await)
            }
        }
        None => None,
    };
    // Every process of the session ends with the container; the ports close first.
    drop(published);
    if let Some(g) = &gateway {
        g.summary();
    }
    drop(gateway);
    sandbox.shutdown().await?;
    let check = sandbox.check_host();
    let ended = ended?;
    let said = verdict(&ended);
    if let Some(check) = &check {
        for w in &check.warnings {
            errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
        }
    }
    let code = match ended {
        Ended::Exited(code) => u8::try_from(code).unwrap_or(1),
        Ended::TimedOut(limit) => {
            errln!(
                "agentbox: the session ended after --session-timeout {}s",
                limit.as_secs()
            );
            EXIT_TIMED_OUT
        }
        Ended::HungUp => 129,
        Ended::Signalled(name, code) => {
            errln!("agentbox: {} received; the shell was ended", name);
            code
        }
    };
    if let (Some(env), Some(kept)) = (&env, kept) {
        let task = format!("shell: {}", command.join(" "));
        env.close(&setup, &task, said, kept, "sandbox removed; ");
    }
    match patch {
        None if env.is_some() => {}
        None => {
            for line in super::summary::changes(project, options.read_only, check.as_ref()) {
                errln!("agentbox: {}", line);
            }
        }
        Some(Ok(p)) => {
            for w in &p.warnings {
                errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
            }
            errln!(
                "agentbox: sandbox removed; {} untouched; {} file{} changed in the copy; patch: {} (apply with `git apply`)",
                crate::output::escaped(project.display()),
                p.changed,
                if p.changed == 1 { "" } else { "s" },
                crate::output::escaped(p.path.display())
            );
        }
        Some(Err(e)) => errln!(
            "agentbox: sandbox removed; cannot tell what changed in the copy: {}",
            crate::output::escaped(&e)
        ),
    }
    if check.is_some_and(|c| c.unresolved) {
        anyhow::bail!("something git would run could not be moved out of the project (see the warnings)");
    }
    Ok(code)
}

/// How a session ended, as an environment's log says it.
fn verdict(ended: &Ended) -> String {
    match ended {
        Ended::Exited(code) => format!("exit {code}"),
        Ended::TimedOut(limit) => format!("ended after --session-timeout {}s", limit.as_secs()),
        Ended::HungUp => "hung up".into(),
        Ended::Signalled(name, _) => format!("{name} received"),
    }
}

enum Ended {
    Exited(i64),
    TimedOut(Duration),
    HungUp,
    Signalled(&'static str, u8),
}

/// The name in the prompt: the project directory's, reduced to characters that mean nothing to
/// bash's prompt expansion (a directory named `$(...)` must not run anything).
fn prompt_name(project: &Path) -> String {
    let name = project
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "project".into());
    let clean: String = name
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() { "project".into() } else { clean }
}

/// The shell's environment on top of the sandbox's: a terminal type, and the prompt. PS1 alone
/// would be replaced by the image's start-up files (Debian's bash.bashrc sets its own);
/// PROMPT_COMMAND sets it again before every prompt.
pub fn shell_env(name: &str) -> Vec<(String, String)> {
    let term = std::env::var("TERM")
        .ok()
        .filter(|t| {
            !t.is_empty()
                && t.len() <= 64
                && t.chars().all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
        })
        .filter(|t| t != "dumb")
        .unwrap_or_else(|| "xterm-256color".into());
    let ps1 = format!("[agentbox {name}] \\w \\$ ");
    vec![
        ("TERM".into(), term),
        ("PS1".into(), ps1.clone()),
        ("PROMPT_COMMAND".into(), format!("PS1='{ps1}'")),
        ("AGENTBOX_SHELL".into(), "1".into()),
    ]
}

async fn attach_terminal(
    sandbox: &DockerSandbox,
    command: Vec<String>,
    name: &str,
    session_timeout: Option<Duration>,
) -> anyhow::Result<Ended> {
    let mut winch = signal(SignalKind::window_change())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let attached = sandbox
        .attach_process(&AttachRequest {
            argv: command,
            env: shell_env(name),
            tty: true,
            stdin: true,
            as_command: false,
            size: terminal::window_size(STDOUT),
        })
        .await?;
    let exec_id = attached.exec_id.clone();
    let mut output = attached.output;
    let mut input = attached.input;
    // From here on the terminal is raw; the guard restores it however this function is left.
    let raw = RawMode::enter(STDIN)?;
    let (pump, mut keys) = StdinPump::start(STDIN);
    let deadline = async {
        match session_timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut stdin_open = true;
    let mut stdout = crate::output::terminal_for_the_sandbox();
    let mut early = None;
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(Chunk::Out(b) | Chunk::Err(b))) => {
                    if stdout.write_all(&b).and_then(|()| stdout.flush()).is_err() {
                        early = Some(Ended::HungUp);
                        break;
                    }
                }
                Some(Err(e)) => {
                    drop(raw);
                    return Err(e.into());
                }
                None => break,
            },
            data = keys.recv(), if stdin_open => match data {
                // A write that fails means the process is ending; its output's end says so.
                Some(d) => { let _ = input.write_all(&d).await; let _ = input.flush().await; }
                None => stdin_open = false,
            },
            _ = winch.recv() => {
                if let Some((rows, cols)) = terminal::window_size(STDOUT) {
                    let _ = sandbox.resize_process(&exec_id, rows, cols).await;
                }
            }
            _ = hangup.recv() => { early = Some(Ended::HungUp); break; }
            _ = sigterm.recv() => { early = Some(Ended::Signalled("SIGTERM", 143)); break; }
            _ = sigint.recv() => { early = Some(Ended::Signalled("SIGINT", 130)); break; }
            _ = &mut deadline => {
                early = Some(Ended::TimedOut(session_timeout.unwrap_or_default()));
                break;
            }
        }
    }
    drop(pump);
    drop(raw);
    if let Some(e) = early {
        return Ok(e);
    }
    // The stream ends a moment before the daemon records the status.
    for _ in 0..50 {
        if let Some(code) = sandbox.process_status(&exec_id).await? {
            return Ok(Ended::Exited(code));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Ended::Exited(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_name_cannot_expand() {
        let dir = tempfile::tempdir().unwrap();
        let hostile = dir.path().join("$(touch x)`id`\\u");
        std::fs::create_dir(&hostile).unwrap();
        assert_eq!(prompt_name(&hostile), "__touch_x__id__u");
        let ok = dir.path().join("my-project_1.2");
        std::fs::create_dir(&ok).unwrap();
        assert_eq!(prompt_name(&ok), "my-project_1.2");
    }

    #[test]
    fn the_prompt_survives_startup_files() {
        let env = shell_env("p");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(get("PS1"), "[agentbox p] \\w \\$ ");
        assert_eq!(get("PROMPT_COMMAND"), "PS1='[agentbox p] \\w \\$ '");
    }
}
