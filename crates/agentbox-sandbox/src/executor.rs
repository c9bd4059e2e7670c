//! Host side of the in-container executor (`executor.py`).
//!
//! The executor is the container's main process; requests and responses are length-prefixed
//! JSON frames over its attached stdin and stdout. A Docker exec costs ~50 ms of runc work; a
//! request to the running executor costs a process spawn, or less for the file operations it
//! performs natively.

use std::pin::Pin;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bollard::container::LogOutput;
use bytes::BytesMut;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::{Captured, ExecOutput, ExecRequest, ProcessRefusal, SandboxError};

pub(crate) const SOURCE: &str = include_str!("executor.py");

/// What the container runs: the file-operation statuses (see `fsop`), then the executor.
pub fn source() -> String {
    format!("{}{SOURCE}", super::fsop::python_preamble())
}
const PROTOCOL: u64 = 2;
/// Largest frame we accept from the executor. Responses carry capped output, so anything near
/// this is a bug or a forgery, not data.
const MAX_FRAME: usize = 160 << 20;

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

pub(crate) struct Executor {
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Output,
    buf: BytesMut,
    /// The executor's own stderr (Python tracebacks), for the error message if it dies.
    diagnostics: Vec<u8>,
    next_id: u64,
    /// A request whose caller stopped waiting (the chat's Ctrl-C drops the call): its reply is
    /// still to come, and is read and dropped before the next request's.
    unanswered: Option<(u64, Duration)>,
    /// A request was cut off while being written: the stream is out of step for good.
    torn: bool,
}

#[derive(Deserialize)]
struct Hello {
    ready: bool,
    protocol: u64,
    #[serde(default)]
    hardened: bool,
}

#[derive(Deserialize)]
struct Stream64 {
    head: String,
    tail: String,
    total: u64,
}

#[derive(Deserialize)]
struct Response {
    id: Option<u64>,
    exit: Option<i64>,
    signal: Option<i32>,
    #[serde(default)]
    timed_out: bool,
    stdout: Option<Stream64>,
    stderr: Option<Stream64>,
    oom_kills: Option<i64>,
    elapsed: Option<f64>,
    spawn_error: Option<String>,
    errno: Option<i32>,
    internal_error: Option<String>,
    /// The answer to a job request: the jobs it concerns, or why it was refused.
    jobs: Option<Vec<JobWire>>,
    job_error: Option<String>,
}

/// One background process as the executor reports it (see `Job.state` in executor.py).
#[derive(Deserialize)]
struct JobWire {
    job_id: String,
    pid: i64,
    running: bool,
    stopped: Option<String>,
    procs: u32,
    elapsed: f64,
    exit: Option<i64>,
    signal: Option<i32>,
    oom_kills: Option<i64>,
    total: u64,
    out: Option<Stream64>,
}

impl JobWire {
    fn decode(self) -> Result<super::ProcessState, SandboxError> {
        let output = match self.out {
            Some(s) => s.decode()?,
            None => Captured {
                total: self.total,
                ..Default::default()
            },
        };
        Ok(super::ProcessState {
            id: self.job_id,
            command: String::new(),
            pid: self.pid,
            running: self.running,
            processes: self.procs,
            exit_code: self.exit,
            signal: self.signal,
            stopped: self.stopped,
            oom_killed: self.oom_kills.unwrap_or(0) > 0,
            output,
            shown: 0,
            elapsed: Duration::try_from_secs_f64(self.elapsed).unwrap_or_default(),
        })
    }
}

/// A request about background processes (see `job_request` in executor.py).
#[derive(Debug, Serialize)]
pub(crate) struct JobFrame<'a> {
    pub op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<&'a str>,
    /// Why it is stopped, for the record (`stop`, `stop_all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<&'a str>,
    /// Seconds a new job is watched before the answer (`start`).
    pub settle: f64,
    /// Send its captured output along.
    pub output: bool,
}

/// One request to the executor, as `executor.py` reads it: a misspelt field does not compile.
#[derive(Debug, Serialize)]
struct RequestFrame<'a> {
    id: u64,
    argv: &'a [String],
    cwd: &'a str,
    env: std::collections::BTreeMap<&'a str, &'a str>,
    timeout: f64,
    /// Base64; `None` gives the command `/dev/null`.
    stdin: Option<String>,
    head: usize,
    tail: usize,
    native: Option<NativeFrame<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<JobFrame<'a>>,
}

#[derive(Debug, Serialize)]
struct NativeFrame<'a> {
    op: &'static str,
    args: &'a [String],
}

impl Stream64 {
    fn decode(self) -> Result<Captured, SandboxError> {
        let bad = |e| SandboxError::ExecutorLost(format!("bad output encoding: {e}"));
        Ok(Captured {
            head: B64.decode(self.head).map_err(bad)?,
            tail: B64.decode(self.tail).map_err(bad)?,
            total: self.total,
        })
    }
}

impl Executor {
    /// Take over the attach connection of a container whose main process is the executor,
    /// and wait for its hello. `None` when it never says hello: the image has no python3 (the
    /// boot script says so and exits), or the executor could not start.
    pub(crate) async fn from_attach(attach: bollard::container::AttachContainerResults) -> Option<Executor> {
        let mut ex = Executor {
            input: attach.input,
            output: attach.output,
            buf: BytesMut::new(),
            diagnostics: Vec::new(),
            next_id: 1,
            unanswered: None,
            torn: false,
        };
        let hello = match tokio::time::timeout(Duration::from_secs(30), ex.read_frame()).await {
            Ok(Ok(frame)) => frame,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, stderr = %ex.diagnostics_text(), "no executor");
                return None;
            }
            Err(_) => return None,
        };
        match serde_json::from_slice::<Hello>(&hello) {
            Ok(h) if h.ready && h.protocol == PROTOCOL && h.hardened => Some(ex),
            Ok(h) if h.ready => {
                tracing::debug!("the executor could not make itself undumpable: one docker exec per command");
                None
            }
            _ => None,
        }
    }

    fn diagnostics_text(&self) -> String {
        String::from_utf8_lossy(&self.diagnostics).trim().to_string()
    }

    /// Read and drop the reply to a call that was given up (its command was killed by then, so
    /// it comes at once), so that the next reply is the next call's.
    async fn skip_unanswered(&mut self, watchdog: Duration) -> Result<(), SandboxError> {
        if self.torn {
            return Err(SandboxError::ExecutorLost(
                "a request was cut off while being sent".into(),
            ));
        }
        let Some((id, timeout)) = self.unanswered else {
            return Ok(());
        };
        loop {
            let frame = match tokio::time::timeout(timeout + watchdog, self.read_frame()).await {
                Ok(r) => r?,
                Err(_) => return Err(SandboxError::ExecutorLost("no reply before the watchdog".into())),
            };
            let answered = serde_json::from_slice::<Response>(&frame)
                .map_err(|e| SandboxError::ExecutorLost(format!("bad reply: {e}")))?
                .id;
            if answered == Some(id) {
                self.unanswered = None;
                return Ok(());
            }
        }
    }

    async fn read_frame(&mut self) -> Result<Vec<u8>, SandboxError> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
                if len > MAX_FRAME {
                    return Err(SandboxError::ExecutorLost(format!(
                        "oversized frame ({len} bytes)"
                    )));
                }
                if self.buf.len() >= 4 + len {
                    let frame = self.buf.split_to(4 + len);
                    return Ok(frame[4..].to_vec());
                }
            }
            match self.output.next().await {
                Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                    self.buf.extend_from_slice(&message)
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    let room = 4096usize.saturating_sub(self.diagnostics.len());
                    self.diagnostics
                        .extend_from_slice(&message[..room.min(message.len())]);
                }
                Some(Ok(LogOutput::StdIn { .. })) => {}
                Some(Err(e)) => return Err(SandboxError::ExecutorLost(e.to_string())),
                None => {
                    let why = match self.diagnostics_text() {
                        d if d.is_empty() => "its stream ended".to_string(),
                        d => format!("its stream ended: {d}"),
                    };
                    return Err(SandboxError::ExecutorLost(why));
                }
            }
        }
    }

    /// Run one request. `watchdog` bounds the wait for a reply beyond the command's own timeout.
    pub async fn call(&mut self, req: &ExecRequest, watchdog: Duration) -> Result<ExecOutput, SandboxError> {
        let resp = self.request(req, None, watchdog).await?;
        if let Some(reason) = resp.spawn_error {
            // Report it the way a shell would, so both exec modes agree: 127 = not found.
            let code = if resp.errno == Some(libc::ENOENT) {
                127
            } else {
                126
            };
            return Ok(ExecOutput {
                exit_code: code,
                stderr: Captured::complete(format!("{reason}\n").into_bytes()),
                ..Default::default()
            });
        }
        if let Some(e) = resp.internal_error {
            // The executor caught it and answered: the session goes on; this call failed.
            return Ok(ExecOutput {
                exit_code: 126,
                stderr: Captured::complete(format!("agentbox executor: {e}\n").into_bytes()),
                ..Default::default()
            });
        }
        Ok(ExecOutput {
            exit_code: resp.exit.unwrap_or(-1),
            signal: resp.signal,
            timed_out: resp.timed_out,
            oom_killed: resp.oom_kills.unwrap_or(0) > 0,
            stdout: resp.stdout.map(Stream64::decode).transpose()?.unwrap_or_default(),
            stderr: resp.stderr.map(Stream64::decode).transpose()?.unwrap_or_default(),
            elapsed: Duration::try_from_secs_f64(resp.elapsed.unwrap_or(0.0)).unwrap_or_default(),
        })
    }

    /// End the command of a request whose caller stopped waiting (see `unanswered`), and all it
    /// started except the background processes, as its timeout would; its reply is read and
    /// dropped. Nothing to do when every request was answered.
    pub async fn interrupt(&mut self, watchdog: Duration) -> Result<(), SandboxError> {
        if self.torn {
            return Err(SandboxError::ExecutorLost(
                "a request was cut off while being sent".into(),
            ));
        }
        let Some((pending, _)) = self.unanswered else {
            return Ok(());
        };
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::to_vec(&serde_json::json!({"id": id, "interrupt": pending}))
            .map_err(|e| SandboxError::ExecutorLost(format!("cannot encode the request: {e}")))?;
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        let lost = |e: std::io::Error| SandboxError::ExecutorLost(e.to_string());
        self.torn = true;
        self.input.write_all(&frame).await.map_err(lost)?;
        self.input.flush().await.map_err(lost)?;
        self.torn = false;
        // The interrupted command's reply comes first (the executor answers it, then this).
        loop {
            let frame = match tokio::time::timeout(watchdog * 2, self.read_frame()).await {
                Ok(r) => r?,
                Err(_) => return Err(SandboxError::ExecutorLost("no reply before the watchdog".into())),
            };
            let answered = serde_json::from_slice::<Response>(&frame)
                .map_err(|e| SandboxError::ExecutorLost(format!("bad reply: {e}")))?
                .id;
            if answered == Some(id) {
                self.unanswered = None;
                return Ok(());
            }
        }
    }

    /// A request about background processes; `req` is the command for `start` (its timeout
    /// only bounds the wait for the answer). `Ok(Err(why))`: refused (an unknown id, too many).
    pub async fn job(
        &mut self,
        req: &ExecRequest,
        job: JobFrame<'_>,
        watchdog: Duration,
    ) -> Result<Result<Vec<super::ProcessState>, ProcessRefusal>, SandboxError> {
        let resp = self.request(req, Some(job), watchdog).await?;
        if let Some(why) = resp.job_error.or(resp.internal_error) {
            return Ok(Err(ProcessRefusal(why)));
        }
        let jobs = resp
            .jobs
            .ok_or_else(|| SandboxError::ExecutorLost("a job request without an answer".into()))?;
        jobs.into_iter()
            .map(JobWire::decode)
            .collect::<Result<_, _>>()
            .map(Ok)
    }

    async fn request(
        &mut self,
        req: &ExecRequest,
        job: Option<JobFrame<'_>>,
        watchdog: Duration,
    ) -> Result<Response, SandboxError> {
        let id = self.next_id;
        self.next_id += 1;
        let body = RequestFrame {
            id,
            argv: &req.argv,
            cwd: req.workdir.as_deref().unwrap_or(super::WORKSPACE),
            env: req.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            timeout: req.timeout.as_secs_f64(),
            stdin: req.stdin.as_ref().map(|d| B64.encode(d)),
            head: req.head,
            tail: req.tail,
            native: req.native.as_ref().map(|n| NativeFrame {
                op: n.op,
                args: &n.args,
            }),
            job,
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| SandboxError::ExecutorLost(format!("cannot encode the request: {e}")))?;
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        let lost = |e: std::io::Error| SandboxError::ExecutorLost(e.to_string());
        self.skip_unanswered(watchdog).await?;
        self.torn = true;
        self.input.write_all(&frame).await.map_err(lost)?;
        self.input.flush().await.map_err(lost)?;
        self.torn = false;
        self.unanswered = Some((id, req.timeout));

        let reply = match tokio::time::timeout(req.timeout + watchdog, self.read_frame()).await {
            Ok(r) => r?,
            Err(_) => return Err(SandboxError::ExecutorLost("no reply before the watchdog".into())),
        };
        self.unanswered = None;
        let resp: Response = serde_json::from_slice(&reply)
            .map_err(|e| SandboxError::ExecutorLost(format!("bad reply: {e}")))?;
        if resp.id != Some(id) {
            return Err(SandboxError::ExecutorLost("reply out of order".into()));
        }
        Ok(resp)
    }
}
