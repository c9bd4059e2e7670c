//! The MCP face: agentbox's tools, on one sandbox, for another agent (an MCP client) to call.
//! Only protocol translation lives here: the tools, their contracts and the sandbox's policy
//! are the same objects `run` uses (`tools::ToolRegistry`, `sandbox::DockerSandbox`).

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use crate::model::{ToolArgs, ToolCall};
use crate::sandbox::DockerSandbox;
use crate::session::baseline;
use crate::tools::{Dispatched, ToolContext, ToolRegistry, ToolSettings};

/// Largest diff the `diff` tool returns.
const MAX_DIFF_BYTES: usize = 1 << 20;

/// The name of the tool that shows what changed since the session began.
pub const DIFF_TOOL: &str = "diff";

/// What the server offers, on one sandbox.
pub struct Tools {
    pub sandbox: DockerSandbox,
    pub registry: ToolRegistry,
    pub settings: ToolSettings,
    /// Why there is no `diff` (the baseline could not be taken), if so.
    pub baseline_error: Option<String>,
}

/// The MCP server. Cheap to clone; every clone shares the one sandbox.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    tools: Tools,
    /// One call at a time on the sandbox: the executor's after-command sweep would kill a
    /// concurrent one. Tokio's mutex is fair, so calls run in the order they arrived.
    turn: tokio::sync::Mutex<()>,
}

impl Server {
    pub fn new(tools: Tools) -> Server {
        Server {
            inner: Arc::new(Inner {
                tools,
                turn: tokio::sync::Mutex::new(()),
            }),
        }
    }

    pub fn sandbox(&self) -> &DockerSandbox {
        &self.inner.tools.sandbox
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

    /// Run one call; a tool's failure is a result with `isError`, never a protocol error.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<serde_json::Map<String, Value>>,
    ) -> CallToolResult {
        let _turn = self.inner.turn.lock().await;
        let t = &self.inner.tools;
        if name == DIFF_TOOL {
            if let Some(e) = &t.baseline_error {
                return CallToolResult::error(vec![ContentBlock::text(format!("no diff: {e}"))]);
            }
            let timeout = t.settings.command_timeout.max(Duration::from_secs(60));
            return match baseline::diff(&t.sandbox, timeout, MAX_DIFF_BYTES).await {
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
            sandbox: &t.sandbox,
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

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agentbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Tools that run in a locked-down container (no network, only the project mounted at \
                 /workspace). Paths are relative to the project root. Calls run one at a time.",
            )
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(self.call(&request.name, request.arguments).await.into())
    }
}
