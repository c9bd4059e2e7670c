//! `agentbox exec PROJECT -- CMD...`

use std::io::Write;

use crate::output::CommandStream;

use crate::cli::ExecArgs;
use crate::config::{SandboxConfig, UsageError};
use crate::exit::TIMED_OUT as EXIT_TIMED_OUT;
use crate::sandbox::Cleanup;
use crate::sandbox::{Captured, HeadTail, Sandbox, human_bytes, parse_size};

pub async fn run(args: ExecArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    if args.tty {
        // `exec -it`: the same as `shell PROJECT -- CMD`.
        let options = super::shell::Options {
            read_only: false,
            isolate: None,
            session_timeout: None,
            gateway: args.gateway.clone(),
            env: args.env.clone(),
        };
        return super::shell::interactive(
            &args.sandbox,
            &args.publish,
            &args.setup,
            &args.project,
            args.command,
            options,
            cleanup,
        )
        .await;
    }
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    cfg.cleanup = cleanup;
    tracing::debug!(step = "config", "configuration read");
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
            "agentbox: `{}` is an interactive shell, and exec gives it no terminal and no input: it would exit at once. Use `agentbox shell {}` for a shell in the sandbox (or `exec -it`).",
            crate::events::for_terminal(&args.command.join(" ")),
            crate::events::for_terminal(&args.project.display().to_string()),
        );
        return Ok(crate::exit::USAGE);
    }
    let mut setup = crate::config::SetupSettings::from_args(&args.setup)?;
    // Locked before its image and setup, which what it was made with decides.
    let env = match &args.env {
        Some(name) => Some(super::env_turn::EnvTurn::begin(name, &mut setup, &mut cfg)?),
        None => None,
    };
    choose_image_quietly(&mut cfg, &args.project).await?;
    // The environment `run` gives the agent: setup (or its cache) before the sandbox.
    let copied = env.is_some() || super::copy_for_remote_engine(&args.project);
    let _prepared = super::prepare_environment(
        &setup,
        (copied, env.as_ref().map(|e| &e.name)),
        &mut cfg,
        &args.project,
        Vec::new(),
    )
    .await?;
    let published = super::publish::Published::start(&args.publish)?;
    cfg.extras.forwards.extend(published.forwards());
    let mut gateway = super::gateway::ModelGateway::start(&args.gateway, false)?;
    if let Some(g) = &gateway {
        cfg.extras.forwards.extend(g.forwards());
        cfg.extras.env.extend(g.sandbox_env());
    }
    // The fast path: the command as the sandbox's own process, as `docker run` starts it (no
    // executor to wait for, no Docker exec). Only where nothing needs a process before it.
    if env.is_none()
        && !copied
        && !args.interactive
        && let Some(once) = crate::session::open_one_shot(&cfg, &args.project, &args.command).await?
    {
        drop(published);
        return run_once(once, &cfg, &args, limit, gateway).await;
    }
    // A remote engine cannot mount the project: the command works on a copy, and what it
    // changed comes back as a patch.
    let (sandbox, copy) = if let Some(env) = &env {
        let (sandbox, copy) =
            crate::session::IsolatedCopy::open_env(&cfg, &args.project, env.name.clone()).await?;
        (sandbox, Some(copy))
    } else if copied {
        let (sandbox, copy) = crate::session::IsolatedCopy::open(&cfg, &args.project, None).await?;
        (sandbox, Some(copy))
    } else {
        (crate::session::open_sandbox(&cfg, &args.project).await?.1, None)
    };
    if let Err(e) = published.announce(&sandbox).await {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    if let Some(Err(e)) = gateway.as_ref().map(|g| g.announce(&sandbox)) {
        let _ = sandbox.shutdown().await;
        return Err(e.into());
    }
    say_warnings(&sandbox, &cfg, &args.project).await;
    let timeout = cfg.command_timeout_for(&cfg.image);
    let result = stream(&sandbox, &args.command, args.interactive, timeout, limit).await;
    tracing::debug!(step = "command", "command done");
    let mut kept = None;
    if let (Some(copy), Some(_)) = (&copy, &env) {
        let _ = sandbox.interrupt().await;
        kept = Some(copy.finish_env(&sandbox, timeout).await);
    } else if let Some(copy) = &copy {
        let _ = sandbox.interrupt().await;
        match copy.finish(&sandbox, timeout, &sandbox.info().session).await {
            Ok(p) if p.changed > 0 => {
                for w in &p.warnings {
                    errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
                }
                errln!(
                    "agentbox: {} file{} changed in the copy; patch: {} (apply with `git apply`)",
                    p.changed,
                    if p.changed == 1 { "" } else { "s" },
                    crate::output::escaped(p.path.display())
                );
            }
            // Nothing changed: no empty patch file left behind.
            Ok(p) if p.warnings.is_empty() => {
                let _ = std::fs::remove_file(&p.path);
            }
            Ok(p) => {
                for w in &p.warnings {
                    errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
                }
            }
            Err(e) => errln!(
                "agentbox: cannot tell what changed in the copy: {}",
                crate::output::escaped(&e)
            ),
        }
    }
    // The ports close with the session, before its sandbox goes.
    drop(published);
    if let Some(g) = gateway.take() {
        g.summary();
    }
    // What was asked for is known: the output is written and the status can be said. Said
    // now, and stdout closed, so a reader of the pipe goes on while the sandbox is removed.
    // The process still exits only after the removal and the host's check ("no container
    // outlives the run"; planted git metadata is moved out before exit); that check's
    // findings are warnings that follow, and one it could not resolve still fails the run.
    let code = match &result {
        Ok(out) => say_status(out, &args.output_limit, timeout),
        // The error is said by the caller, after the teardown.
        Err(_) => 1,
    };
    if let (Some(env), Some(kept)) = (&env, kept) {
        let task = format!("exec: {}", args.command.join(" "));
        let verdict = match &result {
            Ok(_) => format!("exit {code}"),
            Err(e) => format!("error: {e}"),
        };
        env.close(&setup, &task, verdict, kept, "");
    }
    crate::output::end_stdout();
    tracing::debug!(step = "result written", "result written");
    sandbox.shutdown().await?;
    finish_with_host_check(&sandbox)?;
    result?;
    Ok(code)
}

/// `run` on a one-shot sandbox: the command is running already.
async fn run_once(
    mut once: crate::sandbox::OneShot,
    cfg: &SandboxConfig,
    args: &ExecArgs,
    limit: usize,
    gateway: Option<super::gateway::ModelGateway>,
) -> anyhow::Result<u8> {
    say_warnings(once.sandbox(), cfg, &args.project).await;
    let timeout = cfg.command_timeout_for(&cfg.image);
    let result = stream_once(&mut once, timeout, limit).await;
    tracing::debug!(step = "command", "command done");
    if let Some(g) = gateway {
        g.summary();
    }
    // As in `run`: the status said and stdout closed before the sandbox is gone.
    let code = match &result {
        Ok(out) => say_status(out, &args.output_limit, timeout),
        Err(_) => 1,
    };
    crate::output::end_stdout();
    tracing::debug!(step = "result written", "result written");
    let sandbox = once.into_sandbox();
    sandbox.shutdown().await?;
    finish_with_host_check(&sandbox)?;
    result?;
    Ok(code)
}

/// What the user should know of the sandbox before its output: the project's, the image's.
pub(super) async fn say_warnings(
    sandbox: &crate::sandbox::DockerSandbox,
    cfg: &SandboxConfig,
    project: &std::path::Path,
) {
    for warning in &sandbox.info().warnings {
        errln!("agentbox: WARNING: {}", crate::output::escaped(warning));
    }
    for warning in crate::toolchain::toolchain_warnings(&cfg.image, project).await {
        errln!("agentbox: WARNING: {}", crate::output::escaped(&warning));
    }
    for hint in crate::project::services::service_hints(project, &cfg.services) {
        errln!("agentbox: hint: {}", crate::output::escaped(&hint));
    }
    tracing::trace!("warnings checked");
}

/// The host's check of the project after the sandbox is gone: its warnings said, and the run
/// failed if something git would run is still in the project.
fn finish_with_host_check(sandbox: &crate::sandbox::DockerSandbox) -> anyhow::Result<()> {
    let check = sandbox.check_host().unwrap_or_default();
    tracing::debug!(step = "host scan after", "host scan after the run done");
    for w in &check.warnings {
        errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
    }
    if check.unresolved {
        // What the command left would run on this machine: the run fails whatever its status.
        anyhow::bail!("something git would run could not be moved out of the project (see the warnings)");
    }
    Ok(())
}

/// The lines that follow the command's output (cut, timed out, killed), and the exit status.
fn say_status(out: &crate::sandbox::ExecOutput, output_limit: &str, timeout: std::time::Duration) -> u8 {
    if out.truncated() {
        errln!(
            "agentbox: output was cut to the first and last {} of each stream (--output-limit)",
            crate::output::escaped(output_limit)
        );
    }
    if out.timed_out {
        errln!(
            "agentbox: {} (--command-timeout {} raises the limit)",
            crate::output::escaped(out.status_line()),
            timeout.as_secs()
        );
        EXIT_TIMED_OUT
    } else {
        if out.oom_killed || out.signal.is_some() {
            errln!("agentbox: {}", crate::output::escaped(out.status_line()));
        }
        u8::try_from(out.exit_code).unwrap_or(1)
    }
}

/// Run `command` with its output written as it comes: the first `limit` bytes of each stream
/// at once, then only the last `limit` kept (in memory, bounded) and written at the end, after
/// a line saying how much was cut. With `interactive`, the host's stdin is forwarded as it is
/// read. The timeout kills the command and everything it started.
async fn stream(
    sandbox: &crate::sandbox::DockerSandbox,
    command: &[String],
    interactive: bool,
    timeout: std::time::Duration,
    limit: usize,
) -> anyhow::Result<crate::sandbox::ExecOutput> {
    use crate::sandbox::tty::AttachRequest;

    let started = std::time::Instant::now();
    let oom_before = sandbox.oom_kills().await;
    tracing::trace!("memory cgroup read");
    let attached = sandbox
        .attach_process(&AttachRequest {
            argv: command.to_vec(),
            env: Vec::new(),
            tty: false,
            stdin: interactive,
            as_command: true,
            size: None,
        })
        .await?;
    let exec_id = attached.exec_id.clone();
    tracing::trace!("command started");
    let mut output = attached.output;
    // Not interactive: the input half is held, unused, until the command ends.
    let (input, _held) = if interactive {
        (Some(attached.input), None)
    } else {
        (None, Some(attached.input))
    };
    // A sandbox that died under the command (under gVisor its stream may stay open).
    let ended = sandbox.ended();
    tokio::pin!(ended);
    let pumped = pump(
        &mut output,
        input,
        timeout,
        limit,
        || sandbox.interrupt(),
        &mut ended,
    )
    .await?;
    tracing::trace!("command's streams ended");
    // The memory cgroup's count is read while the command's status is awaited, not after it:
    // both only follow the command's end, and without the executor (`--per-call-exec`) the
    // count is a Docker exec of its own, tens of ms.
    let status = async {
        // The daemon records the status a moment after the streams close: asked again after
        // 5 ms, the pause doubling up to 100 ms, for up to ~5 s as before.
        let mut pause = std::time::Duration::from_millis(5);
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_secs(5) {
            if let Some(code) = sandbox.process_status(&exec_id).await? {
                return Ok::<_, crate::sandbox::SandboxError>(Some(code));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
        Ok(None)
    };
    let (exit_code, oom_after) = tokio::join!(status, sandbox.oom_kills());
    let exit_code = exit_code?;
    // Under gVisor an exec whose sandbox died can end at once with runsc's own status (128,
    // "waiting on PID ...: EOF"), a moment before the container is seen to stop: give the
    // container's end a moment to show, so the reason is said rather than a bare 128.
    if !pumped.timed_out
        && sandbox.under_gvisor()
        && exit_code.is_none_or(|c| c >= 128)
        && let Ok(gone) = tokio::time::timeout(std::time::Duration::from_secs(2), &mut ended).await
    {
        return Err(gone.into());
    }
    let timed_out = pumped.timed_out;
    let exit_code = exit_code.unwrap_or(if timed_out { 137 } else { -1 });
    let oom_killed = matches!((oom_before, oom_after), (Some(b), Some(a)) if a > b);
    Ok(pumped.finish(exit_code, oom_killed, started))
}

/// `stream` for a one-shot sandbox, whose own process is the command: its output is the
/// container's, its status the container's, and the timeout kills the container.
async fn stream_once(
    once: &mut crate::sandbox::OneShot,
    timeout: std::time::Duration,
    limit: usize,
) -> anyhow::Result<crate::sandbox::ExecOutput> {
    let started = std::time::Instant::now();
    let Some(mut output) = once.take_output() else {
        anyhow::bail!("the one-shot sandbox's output was taken before");
    };
    // Its end is the command's: the stream ending says so.
    let mut ended = std::future::pending();
    let pumped = {
        let once = &*once;
        pump(&mut output, None, timeout, limit, || once.kill(), &mut ended).await?
    };
    tracing::trace!("command's streams ended");
    let end = once.end().await?;
    let exit_code = if pumped.timed_out { 137 } else { end.exit_code };
    Ok(pumped.finish(exit_code, end.oom_killed, started))
}

/// A command's two streams as [`pump`] left them.
struct Pumped {
    out: Streamed,
    err: Streamed,
    host_out: CommandStream,
    host_err: CommandStream,
    timed_out: bool,
}

impl Pumped {
    /// Write what was kept of each stream's end, and say how the command ended.
    fn finish(
        self,
        exit_code: i64,
        oom_killed: bool,
        started: std::time::Instant,
    ) -> crate::sandbox::ExecOutput {
        let Pumped {
            out,
            err,
            mut host_out,
            mut host_err,
            timed_out,
        } = self;
        let (stdout, stderr) = (out.finish(&mut host_out), err.finish(&mut host_err));
        let _ = (host_out.finish(), host_err.finish());
        crate::sandbox::ExecOutput {
            exit_code,
            signal: (exit_code > 128 && exit_code < 160).then(|| (exit_code - 128) as i32),
            timed_out,
            oom_killed,
            stdout,
            stderr,
            elapsed: started.elapsed(),
        }
    }
}

/// Copy a command's output to the user's terminal as it comes (and, with `input`, the host's
/// stdin to the command) until its streams end; at the timeout, `kill` ends it and its
/// streams with it. `ended`: the sandbox died under it.
async fn pump<K, F>(
    output: &mut crate::sandbox::tty::ChunkStream,
    input: Option<std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>>,
    timeout: std::time::Duration,
    limit: usize,
    kill: K,
    ended: &mut (impl std::future::Future<Output = crate::sandbox::SandboxError> + Unpin),
) -> anyhow::Result<Pumped>
where
    K: Fn() -> F,
    F: std::future::Future<Output = Result<(), crate::sandbox::SandboxError>>,
{
    use crate::sandbox::tty::Chunk;
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;

    let mut input = input;
    let (pump, mut keys) = if input.is_some() {
        let (p, rx) = crate::terminal::StdinPump::start(crate::terminal::STDIN);
        (Some(p), Some(rx))
    } else {
        (None, None)
    };
    let mut out = Streamed::new(limit);
    let mut err = Streamed::new(limit);
    let (mut host_out, mut host_err) = (CommandStream::stdout(), CommandStream::stderr());
    let mut timed_out = false;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(Chunk::Out(b))) => out.push(&b, &mut host_out),
                Some(Ok(Chunk::Err(b))) => err.push(&b, &mut host_err),
                Some(Err(e)) => return Err(e.into()),
                None => break,
            },
            gone = &mut *ended => return Err(gone.into()),
            data = async { keys.as_mut()?.recv().await }, if keys.is_some() && input.is_some() => match data {
                Some(d) => {
                    if let Some(w) = input.as_mut()
                        && w.write_all(&d).await.is_err()
                    {
                        input = None;
                    }
                }
                // End of the host's stdin: the command reads end-of-input too.
                None => {
                    if let Some(mut w) = input.take() {
                        let _ = w.shutdown().await;
                    }
                    keys = None;
                }
            },
            _ = &mut deadline, if !timed_out => {
                timed_out = true;
                // Kills the command's whole tree; its streams then end.
                kill().await?;
            }
        }
    }
    drop(pump);
    Ok(Pumped {
        out,
        err,
        host_out,
        host_err,
        timed_out,
    })
}

/// One output stream: its head written as it comes, its tail kept until the end.
struct Streamed {
    limit: usize,
    written: usize,
    rest: HeadTail,
    /// The reader went away (`| head`): the rest is read and dropped.
    gone: bool,
}

impl Streamed {
    fn new(limit: usize) -> Self {
        Streamed {
            limit,
            written: 0,
            rest: HeadTail::new(0, limit),
            gone: false,
        }
    }

    fn push(&mut self, data: &[u8], to: &mut dyn Write) {
        let now = data.len().min(self.limit - self.written);
        if now > 0 {
            self.write(&data[..now], to);
            self.written += now;
        }
        if now < data.len() {
            self.rest.push(&data[now..]);
        }
    }

    fn write(&mut self, data: &[u8], to: &mut dyn Write) {
        if !self.gone && to.write_all(data).and_then(|()| to.flush()).is_err() {
            self.gone = true;
        }
    }

    /// Write what was kept of the end; what was cut is said in a line of its own. Returns what
    /// followed the streamed head (for whether anything was cut).
    fn finish(mut self, to: &mut dyn Write) -> Captured {
        let written = self.written;
        let rest = std::mem::replace(&mut self.rest, HeadTail::new(0, 0)).finish();
        if rest.truncated() {
            self.write(
                format!(
                    "\n[... {} cut: the first {} and the last {} bytes of {} shown ...]\n",
                    human_bytes(rest.cut()),
                    written,
                    rest.tail.len(),
                    written as u64 + rest.total
                )
                .as_bytes(),
                to,
            );
        }
        self.write(&rest.head, to);
        self.write(&rest.tail, to);
        rest
    }
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
        tracing::debug!(step = "image choice", image = %choice.image, reason = %choice.reason, "image chosen");
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
