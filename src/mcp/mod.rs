//! The MCP face: agentbox's tools, on one sandbox, for another agent (an MCP client) to call.
//! Only protocol translation lives here: the tools, their contracts and the sandbox's policy
//! are the same objects `run` uses (`tools::ToolRegistry`, `sandbox::DockerSandbox`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::model::{ToolArgs, ToolCall};
use crate::sandbox::DockerSandbox;
use crate::session::baseline;
use crate::tools::{Dispatched, ToolContext, ToolRegistry, ToolSettings};

/// Largest diff the `diff` tool returns.
const MAX_DIFF_BYTES: usize = 1 << 20;

/// The name of the tool that shows what changed since the session began.
pub const DIFF_TOOL: &str = "diff";

/// Calls in flight at once: the one running and four waiting for it. Each holds its arguments
/// (a task apiece in rmcp), so a client sending faster than the sandbox answers would make the
/// server grow without end; beyond the bound a call is refused at once.
pub const MAX_CALLS_IN_FLIGHT: usize = 5;

/// Bytes of arguments (as JSON) the calls in flight hold together. One message is at most
/// 16 MiB (rmcp's line limit), so two of the largest fit.
pub const MAX_ARGUMENT_BYTES_IN_FLIGHT: usize = 32 << 20;

/// What the server offers: known before the sandbox exists, so the client's `initialize` and
/// `tools/list` are answered while setup runs.
pub struct Tools {
    pub registry: ToolRegistry,
    pub settings: ToolSettings,
}

/// The session's sandbox, once setup and the sandbox's start are over.
pub struct Ready {
    pub sandbox: DockerSandbox,
    /// Why there is no `diff` (the baseline could not be taken), if so.
    pub baseline_error: Option<Arc<crate::session::baseline::BaselineError>>,
}

/// The MCP server. Cheap to clone; every clone shares the one sandbox.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// Why the session has no sandbox (setup failed, the engine refused), in the words the user
/// was told on stderr; each waiting call is told the same.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

struct Inner {
    tools: Tools,
    /// The sandbox, or why there is none (setup failed, the engine refused): calls wait for it.
    ready: tokio::sync::SetOnce<Result<Ready, NotReady>>,
    /// One call at a time on the sandbox: the executor's after-command sweep would kill a
    /// concurrent one. Tokio's mutex is fair, so calls run in the order they arrived.
    turn: tokio::sync::Mutex<()>,
    /// What the calls in flight hold, counted against the bounds above.
    load: Mutex<Load>,
    /// Cancelled when the session ends (the client closed stdin, a signal): a waiting call
    /// gives up without running, the running one is stopped.
    over: CancellationToken,
}

#[derive(Default)]
struct Load {
    calls: usize,
    bytes: usize,
}

/// A call's place among those in flight, given back when it is answered.
struct Admitted<'a> {
    load: &'a Mutex<Load>,
    bytes: usize,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut load = self.load.lock().unwrap_or_else(PoisonError::into_inner);
        load.calls = load.calls.saturating_sub(1);
        load.bytes = load.bytes.saturating_sub(self.bytes);
    }
}

/// Why a call did not run, or did not run to its end.
enum Stopped {
    Cancelled,
    SessionOver,
}

impl Server {
    pub fn new(tools: Tools) -> Server {
        Server {
            inner: Arc::new(Inner {
                tools,
                ready: tokio::sync::SetOnce::new(),
                turn: tokio::sync::Mutex::new(()),
                load: Mutex::new(Load::default()),
                over: CancellationToken::new(),
            }),
        }
    }

    /// The session's environment is ready (or failed): calls waiting for it run (or are told
    /// why not). Said once; a second word is ignored.
    pub fn opened(&self, ready: Result<Ready, NotReady>) {
        let _ = self.inner.ready.set(ready);
    }

    /// The sandbox, once there is one.
    pub fn sandbox(&self) -> Option<&DockerSandbox> {
        match self.inner.ready.get() {
            Some(Ok(ready)) => Some(&ready.sandbox),
            _ => None,
        }
    }

    /// Every tool as MCP describes tools: the registry's specs and the `diff` tool, each
    /// annotated with whether it only reads.
    pub fn tool_list(&self) -> Vec<Tool> {
        let t = &self.inner.tools;
        let mut list: Vec<Tool> = t
            .registry
            .specs(&t.settings)
            .into_iter()
            .map(|spec| {
                let read_only = t.registry.is_read_only(&spec.name);
                describe(spec.name, spec.description, spec.input_schema, read_only)
            })
            .collect();
        list.push(describe(
            DIFF_TOOL.into(),
            "Show what changed in the project since this session began, as a unified diff (computed \
             inside the sandbox)."
                .into(),
            serde_json::json!({"type": "object", "properties": {}}),
            true,
        ));
        list
    }

    /// End the session: no call runs from now on (those waiting give up, the running one is
    /// stopped), and the turn is held for what the session does last (the read-back of
    /// `--isolate`, the sandbox's removal), so nothing writes while it does.
    pub async fn end(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.over.cancel();
        self.inner.turn.lock().await
    }

    /// stdin for the transport: its end (the client closed it, or died) ends the session at
    /// once. rmcp itself lets the calls under way and waiting go on for seconds after (it
    /// drains their answers), and they would run with no one to answer.
    pub fn stdin(&self) -> impl AsyncRead + Unpin + use<> {
        EndAtEof {
            inner: tokio::io::stdin(),
            over: self.inner.over.clone(),
        }
    }

    /// Run one call, unless the bounds on calls in flight are reached (then it is refused at
    /// once), `cancelled` fires or the session ends first. A tool's failure is a result with
    /// `isError`, never a protocol error.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<serde_json::Map<String, Value>>,
        cancelled: &CancellationToken,
    ) -> CallToolResult {
        let bytes = arguments.as_ref().map_or(0, json_len);
        let Some(_admitted) = self.admit(bytes) else {
            tracing::warn!(tool = name, bytes, "call refused: the queue is full");
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "not run: the queue is full (at most {MAX_CALLS_IN_FLIGHT} calls and {} MiB of \
                 arguments in flight; calls run one at a time): send it again once an earlier \
                 call is answered",
                MAX_ARGUMENT_BYTES_IN_FLIGHT >> 20
            ))]);
        };
        let stop = async {
            tokio::select! {
                _ = self.inner.over.cancelled() => Stopped::SessionOver,
                _ = cancelled.cancelled() => Stopped::Cancelled,
            }
        };
        tokio::pin!(stop);
        // `biased`: a call whose session ended or that was cancelled while it waited never runs,
        // even if the turn came in the same instant.
        let _turn = tokio::select! {
            biased;
            why = &mut stop => return not_run(why),
            turn = self.inner.turn.lock() => turn,
        };
        // Boxed, not pinned on the stack: dropping it must end it (and free the executor it
        // holds) before the sandbox is told to stop its command.
        let mut run = Box::pin(self.run(name, arguments));
        tokio::select! {
            biased;
            done = &mut run => done,
            why = &mut stop => {
                // The call is given up as the chat's Ctrl-C gives one up: what it started is
                // killed (background processes aside) before the next call, or the read-back,
                // gets the turn.
                drop(run);
                let message = match why {
                    Stopped::Cancelled => "stopped: the call was cancelled",
                    Stopped::SessionOver => "stopped: the session ended",
                };
                let Some(sandbox) = self.sandbox() else {
                    // It was still waiting for setup: nothing ran.
                    return CallToolResult::error(vec![ContentBlock::text(message)]);
                };
                match sandbox.cancel_call().await {
                    Ok(()) => CallToolResult::error(vec![ContentBlock::text(message)]),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot stop the cancelled call");
                        CallToolResult::error(vec![ContentBlock::text(format!("{message}; stopping it failed: {e}"))])
                    }
                }
            }
        }
    }

    /// A place among the calls in flight for a call holding `bytes` of arguments, if the
    /// bounds leave one.
    fn admit(&self, bytes: usize) -> Option<Admitted<'_>> {
        let mut load = self.inner.load.lock().unwrap_or_else(PoisonError::into_inner);
        if load.calls >= MAX_CALLS_IN_FLIGHT
            || load.bytes.saturating_add(bytes) > MAX_ARGUMENT_BYTES_IN_FLIGHT
        {
            return None;
        }
        load.calls += 1;
        load.bytes += bytes;
        Some(Admitted {
            load: &self.inner.load,
            bytes,
        })
    }

    async fn run(&self, name: &str, arguments: Option<serde_json::Map<String, Value>>) -> CallToolResult {
        let t = &self.inner.tools;
        // A call that comes while setup runs waits for it (the client was answered at once).
        let ready = match self.inner.ready.wait().await {
            Ok(ready) => ready,
            Err(e) => {
                return CallToolResult::error(vec![ContentBlock::text(format!(
                    "not run: the sandbox could not be opened: {e}"
                ))]);
            }
        };
        if name == DIFF_TOOL {
            if let Some(e) = &ready.baseline_error {
                return CallToolResult::error(vec![ContentBlock::text(format!("no diff: {e}"))]);
            }
            let timeout = t.settings.command_timeout.max(Duration::from_secs(60));
            return match baseline::diff(&ready.sandbox, timeout, MAX_DIFF_BYTES).await {
                Ok(d) if d.is_empty() => CallToolResult::success(vec![ContentBlock::text("(no changes)")]),
                Ok(d) => CallToolResult::success(vec![ContentBlock::text(d)]),
                Err(e) => CallToolResult::error(vec![ContentBlock::text(format!("no diff: {e}"))]),
            };
        }
        let call = ToolCall {
            id: String::new(),
            name: name.to_string(),
            arguments: ToolArgs::Json(arguments.map(Value::Object).unwrap_or(Value::Null)),
        };
        let ctx = ToolContext {
            sandbox: &ready.sandbox,
            settings: &t.settings,
            approver: None,
        };
        let span = tracing::info_span!("mcp_call", tool = name);
        let _enter = span.enter();
        let done = t.registry.dispatch(&call, &ctx).await;
        let text = done.content().into_owned();
        if let Dispatched::Fatal(e) = &done {
            tracing::error!(error = %e, "the sandbox failed; later calls will fail too");
        }
        if done.is_error() {
            CallToolResult::error(vec![ContentBlock::text(text)])
        } else {
            CallToolResult::success(vec![ContentBlock::text(text)])
        }
    }
}

fn not_run(why: Stopped) -> CallToolResult {
    let message = match why {
        Stopped::Cancelled => "not run: the call was cancelled",
        Stopped::SessionOver => "not run: the session ended",
    };
    CallToolResult::error(vec![ContentBlock::text(message)])
}

/// The length of `arguments` as JSON, counted without writing it out.
fn json_len(arguments: &serde_json::Map<String, Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to `Count` cannot fail, nor can a `Value` fail to serialize: a failure counts
    // what was written.
    let _ = serde_json::to_writer(&mut count, arguments);
    count.0
}

/// A reader that ends the session when it reaches the end (or an error) of its input.
struct EndAtEof<R> {
    inner: R,
    over: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for EndAtEof<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            std::task::Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.over.cancel();
            }
            std::task::Poll::Ready(Err(_)) => self.over.cancel(),
            _ => {}
        }
        polled
    }
}

fn describe(name: String, description: String, schema: Value, read_only: bool) -> Tool {
    let schema = match schema {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    let annotations = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(!read_only)
        .open_world(false);
    Tool::new(name, description, Arc::new(schema)).annotate(annotations)
}

#[allow(
    deprecated,
    reason = "MCP logging (notifications/message) is what clients show today; SEP-2577 deprecates it for a later protocol release"
)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new("agentbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Tools that run in a locked-down container (no network, only the project mounted at \
                 /workspace). Paths are relative to the project root. Calls run one at a time; at most five \
                 wait or run at once (more are refused: send them again once one is answered).",
        )
    }

    /// Setup's progress comes as log messages whatever the level (a few lines per session).
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // `context.ct` fires on the client's `notifications/cancelled` for this call.
        Ok(self
            .call(&request.name, request.arguments, &context.ct)
            .await
            .into())
    }
}
