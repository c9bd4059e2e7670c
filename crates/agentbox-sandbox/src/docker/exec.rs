//! Running a command in the sandbox: through the executor (one stream for the session), or
//! with one Docker exec per call and a sweep after it; interrupting, cancelling, and the
//! background jobs the executor keeps.

use super::*;

/// Per-call mode runs `"$@"` and then sweeps, so a background child that holds stdout open
/// cannot keep the exec stream (and the caller) waiting. The command gets the highest OOM score
/// first (its own, inherited by all it starts), so that when the sandbox runs out of memory the
/// kernel kills it rather than the keep-alive, whose end would be the session's.
///
/// It also lowers the limits `AGENTBOX_RLIMITS` names, as the executor does for its commands:
/// rootless Podman 4.3 drops a container's ulimits. `ulimit -f` counts 512-byte blocks in a
/// POSIX `sh` (dash, busybox, bash as sh).
pub(crate) fn per_call_wrapper() -> String {
    format!("echo 1000 > /proc/self/oom_score_adj 2>/dev/null\n{RLIMITS}\n\"$@\"\nrc=$?\n{SWEEP}\nexit $rc")
}

pub(crate) const RLIMITS: &str = r#"case "$AGENTBOX_RLIMITS" in fsize:*) f=${AGENTBOX_RLIMITS#fsize:}; ulimit -f $((${f%%,*} / 512)) 2>/dev/null;; esac
ulimit -n 4096 2>/dev/null; ulimit -c 0 2>/dev/null"#;

/// Grace for a sweep to take effect and the streams to drain, beyond a command's timeout.
pub(crate) const WATCHDOG: Duration = Duration::from_secs(10);

/// What a request about background processes may take beyond its own wait (a stop kills a
/// tree for up to 5 s, then sweeps for up to 5 s more).
pub(crate) const JOB_REQUEST_TIME: Duration = Duration::from_secs(15);

impl DockerSandbox {
    pub(crate) async fn exec_persistent(&self, req: &ExecRequest) -> Result<ExecOutput, SandboxError> {
        let mut guard = self.executor.lock().await;
        let Some(ex) = guard.as_mut() else {
            return Err(SandboxError::ExecutorLost(
                "it failed earlier in this session".into(),
            ));
        };
        match ex.call(req, WATCHDOG).await {
            Ok(out) => Ok(out),
            Err(err) => {
                // The executor is the container's main process: without it there is no
                // session. Tell "killed from outside" apart from a failure of our own.
                *guard = None;
                drop(guard);
                self.gone.store(true, Ordering::Release);
                for _ in 0..10 {
                    if !self.container_running().await {
                        return Err(SandboxError::ContainerGone(format!(
                            "container {} stopped while running a command",
                            short(&self.info.container_id)
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err)
            }
        }
    }

    pub(crate) async fn exec_per_call(&self, req: &ExecRequest) -> Result<ExecOutput, SandboxError> {
        let _serial = self.executor.lock().await;
        let cid = &self.info.container_id;
        let started = Instant::now();
        let wrapper = per_call_wrapper();
        let mut cmd: Vec<&str> = vec!["/bin/sh", "-c", &wrapper, "agentbox-run"];
        cmd.extend(req.argv.iter().map(String::as_str));
        let env: Vec<String> = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let user = self.user();
        let exec = self
            .docker
            .create_exec(
                cid,
                CreateExecOptions {
                    cmd: Some(cmd),
                    env: Some(env.iter().map(String::as_str).collect()),
                    attach_stdin: Some(req.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(user.as_str()),
                    working_dir: Some(req.workdir.as_deref().unwrap_or(crate::WORKSPACE)),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| container_error(cid, "create exec", e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| container_error(cid, "start exec", e))?
        else {
            return Err(SandboxError::Other("exec started detached".into()));
        };
        let writer = req.stdin.clone().map(|data| {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
                input
            })
        });
        let mut out = HeadTail::new(req.head, req.tail);
        let mut err = HeadTail::new(req.head, req.tail);
        let mut timed_out = false;
        let mut oom_after = None;
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        let stopped = self.stopped();
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                item = output.next() => match item {
                    Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => out.push(&message),
                    Some(Ok(LogOutput::StdErr { message })) => err.push(&message),
                    Some(Ok(LogOutput::StdIn { .. })) => {}
                    Some(Err(e)) => return Err(container_error(cid, "exec stream", e)),
                    None => break,
                },
                gone = &mut stopped => return Err(gone),
                _ = &mut deadline => {
                    if timed_out {
                        // The sweep did not close the stream in time; stop waiting for it.
                        break;
                    }
                    timed_out = true;
                    oom_after = self.sweep().await?;
                    deadline.as_mut().reset(tokio::time::Instant::now() + WATCHDOG);
                }
            }
        }
        if let Some(w) = writer {
            w.abort();
        }
        // Under gVisor an exec whose sandbox died can also end at once, with runsc's own status
        // (128: "waiting on PID ...: EOF"), a moment before the container is seen to stop.
        if !timed_out && self.runtime.as_deref().is_some_and(crate::is_gvisor) {
            let code = self
                .docker
                .inspect_exec(&exec.id)
                .await
                .ok()
                .and_then(|i| i.exit_code);
            if code.is_none_or(|c| c >= 128)
                && let Ok(gone) = tokio::time::timeout(Duration::from_secs(2), &mut stopped).await
            {
                return Err(gone);
            }
        }
        // The wrapper's own sweep can be escaped by a command that kills the wrapper: sweep again
        // from a fresh exec, so nothing outlives the command in this mode either.
        if !timed_out {
            oom_after = self.sweep().await?;
        }
        let inspect = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| container_error(cid, "inspect exec", e))?;
        let exit_code = inspect.exit_code.unwrap_or(if timed_out { 137 } else { -1 });
        let mut result = ExecOutput {
            exit_code,
            signal: (exit_code > 128 && exit_code < 160).then(|| (exit_code - 128) as i32),
            timed_out,
            oom_killed: false,
            stdout: out.finish(),
            stderr: err.finish(),
            elapsed: started.elapsed(),
        };
        // Any OOM kill while the command ran counts, not only of the command itself: with many
        // processes the killer may take one of its children and the command goes on.
        if oom_after.is_none() && exit_code == 137 {
            // The sweep could not say (the container was going): ask as the keep-alive's uid.
            oom_after = self.read_oom_kills().await;
        }
        let now = oom_after.unwrap_or(-1);
        let before = self.oom_seen.swap(now, Ordering::Relaxed);
        result.oom_killed = before >= 0 && now > before;
        Ok(result)
    }

    /// Kill every process the sandbox user runs (the command of a call that was given up, and
    /// all it started), leaving the sandbox itself up for the next call.
    pub async fn interrupt(&self) -> Result<(), SandboxError> {
        self.check_open()?;
        self.sweep().await.map(|_| ())
    }

    /// End the command of a call that was given up (the chat's Ctrl-C) and all it started, but
    /// not the background processes: the executor is told to, as if its timeout had come. With
    /// one docker exec per call (no background processes there), [`Self::interrupt`].
    pub async fn cancel_call(&self) -> Result<(), SandboxError> {
        self.check_open()?;
        if self.info.exec_mode == ExecMode::PerCall {
            return self.interrupt().await;
        }
        let mut guard = self.executor.lock().await;
        let Some(ex) = guard.as_mut() else {
            return Err(SandboxError::ExecutorLost(
                "it failed earlier in this session".into(),
            ));
        };
        match ex.interrupt(WATCHDOG).await {
            Ok(()) => Ok(()),
            Err(e) => {
                *guard = None;
                self.gone.store(true, Ordering::Release);
                Err(e)
            }
        }
    }

    /// One request about background processes to the executor; a failure of the executor
    /// ends the session as a failed command does.
    pub(crate) async fn job(
        &self,
        req: &ExecRequest,
        frame: JobFrame<'_>,
    ) -> Result<Result<Vec<ProcessState>, ProcessRefusal>, SandboxError> {
        self.check_open()?;
        if self.info.exec_mode == ExecMode::PerCall {
            return Ok(Err(ProcessRefusal(crate::NO_BACKGROUND.into())));
        }
        let mut guard = self.executor.lock().await;
        let Some(ex) = guard.as_mut() else {
            return Err(SandboxError::ExecutorLost(
                "it failed earlier in this session".into(),
            ));
        };
        match ex.job(req, frame, WATCHDOG).await {
            Ok(r) => Ok(r),
            Err(err) => {
                *guard = None;
                drop(guard);
                self.gone.store(true, Ordering::Release);
                if !self.container_running().await {
                    return Err(self
                        .explain_death(format!("container {} stopped", short(&self.info.container_id)))
                        .await);
                }
                Err(err)
            }
        }
    }

    /// Take in what the executor said of some processes: the record keeps each one's command
    /// and how much of its output was shown; with `shown`, what is returned now counts as shown.
    pub(crate) fn record(&self, states: &mut [ProcessState], shown: bool) {
        let mut log = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        for state in states.iter_mut() {
            match log.iter_mut().find(|p| p.id == state.id) {
                Some(seen) => {
                    state.command = seen.command.clone();
                    state.shown = seen.shown;
                    let mut kept = state.clone();
                    if shown {
                        kept.shown = state.output.total;
                    }
                    // The record keeps only the count of the output, not the bytes.
                    kept.output = Captured {
                        total: state.output.total,
                        ..Default::default()
                    };
                    *seen = kept;
                }
                None => log.push(ProcessState {
                    output: Captured {
                        total: state.output.total,
                        ..Default::default()
                    },
                    shown: if shown { state.output.total } else { 0 },
                    ..state.clone()
                }),
            }
        }
    }

    /// Kill every process of the sandbox user, through a fresh exec, which then reads the memory
    /// cgroup's OOM-kill counter (so per-call mode learns of an OOM kill without another exec).
    pub(crate) async fn sweep(&self) -> Result<Option<i64>, SandboxError> {
        let cid = &self.info.container_id;
        let user = self.user();
        let script = format!("{SWEEP}\n{READ_OOM_KILLS}");
        let exec = self
            .docker
            .create_exec(
                cid,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh", "-c", script.as_str()]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(user.as_str()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| container_error(cid, "create exec", e))?;
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| container_error(cid, "start exec", e))?
        {
            let mut text = Vec::new();
            let drain = async {
                while let Some(Ok(item)) = output.next().await {
                    if text.len() < 4096 {
                        text.extend_from_slice(item.as_ref());
                    }
                }
            };
            let _ = tokio::time::timeout(WATCHDOG, drain).await;
            return Ok(parse_oom_kills(&text));
        }
        Ok(None)
    }
}
