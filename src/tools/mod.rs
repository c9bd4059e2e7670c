//! The tools the model may call. Names and arguments are a public contract.
//!
//! A tool failure is either told to the model (`is_error: true`, the loop goes on) or fatal
//! (the sandbox is gone; the run stops with a clear message) — codex-rs draws the same line.

mod bash;
mod edit_file;
mod finish;
mod list_files;
pub mod process;
pub mod read_file;
mod run_tests;
mod search;
pub mod tally;
mod write_file;

use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::model::text_protocol::MALFORMED;
use crate::model::{ToolArgs, ToolCall, ToolSpec};
use crate::sandbox::{ExecOutput, ExecRequest, NativeOp, Sandbox, SandboxError};
use crate::workspace::FsError;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Goes back to the model as an error result.
    #[error("{0}")]
    RespondToModel(String),
    /// The sandbox failed: no later command can succeed either, so the run stops.
    #[error(transparent)]
    Fatal(SandboxError),
}

/// A call that cannot be done as asked, in words for the model (no sandbox failure behind it:
/// the model can fix its call). Becomes [`ToolError::RespondToModel`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToModel(pub String);

impl std::ops::Deref for ToModel {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for ToModel {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<ToModel> for ToolError {
    fn from(e: ToModel) -> Self {
        ToolError::RespondToModel(e.0)
    }
}

impl From<FsError> for ToolError {
    fn from(e: FsError) -> Self {
        match e {
            FsError::Sandbox(s) => s.into(),
            other => ToolError::RespondToModel(other.to_string()),
        }
    }
}

impl From<SandboxError> for ToolError {
    /// A sandbox error means no later command can succeed either: the run stops.
    fn from(e: SandboxError) -> Self {
        ToolError::Fatal(e)
    }
}

/// What a tool returns on success.
#[derive(Debug, Default)]
pub struct ToolOutput {
    pub content: String,
    /// Set by `finish`: the run is over, with this summary.
    pub finish: Option<String>,
}

impl ToolOutput {
    pub fn text(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            finish: None,
        }
    }
}

/// Something the user is asked to allow (`--approve`).
#[derive(Debug, Clone)]
pub enum Approval {
    Edit { path: String, diff: String },
    Command { command: String },
}

impl Approval {
    /// What kind of thing is asked, for "always, for this session".
    pub fn kind(&self) -> &'static str {
        match self {
            Approval::Edit { .. } => "edits",
            Approval::Command { .. } => "commands",
        }
    }
}

/// The user's answer, with what to tell the model when it is no.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Decline { why: Option<String> },
}

#[async_trait]
pub trait Approver: Send + Sync {
    async fn approve(&self, request: &Approval) -> bool;

    /// The answer with the user's reason, if they gave one.
    async fn decide(&self, request: &Approval) -> Decision {
        if self.approve(request).await {
            Decision::Allow
        } else {
            Decision::Decline { why: None }
        }
    }
}

/// The refusal the model reads: `what`, and the user's reason when there is one.
pub fn declined(what: String, why: Option<String>) -> ToolError {
    ToolError::RespondToModel(match why {
        Some(why) => format!("{what}; they said: {why}"),
        None => what,
    })
}

/// Limits and settings the tools share; one per run.
#[derive(Debug, Clone)]
pub struct ToolSettings {
    pub command_timeout: Duration,
    /// The project's test commands, run by `run_tests` and by the final check: all of them,
    /// in order; the tests pass only if every one passes.
    pub test_commands: Vec<String>,
    /// Bytes of command output shown to the model: the start and the end.
    pub output_head: usize,
    pub output_tail: usize,
    pub read_max_lines: usize,
    pub list_max: usize,
    pub search_max: usize,
    /// Largest file `read_file` and `edit_file` load.
    pub max_file_bytes: usize,
    /// Largest `new` text one edit may write.
    pub max_edit_bytes: usize,
    /// `edit_file` refuses test files (`--protect-tests`): the tests are the specification.
    pub protect_tests: bool,
    /// Extra test-file patterns (an eval task's `test_files`).
    pub test_patterns: Vec<String>,
    /// The task asks to remove, rename or move code: `write_file` may then drop most of a
    /// file's top-level definitions (otherwise it refuses, see `write_file`).
    pub removal_asked: bool,
}

impl Default for ToolSettings {
    fn default() -> Self {
        ToolSettings {
            command_timeout: Duration::from_secs(120),
            test_commands: Vec::new(),
            output_head: 4000,
            output_tail: 8000,
            read_max_lines: 500,
            list_max: 500,
            search_max: 200,
            max_file_bytes: 4 << 20,
            max_edit_bytes: 1 << 20,
            protect_tests: false,
            test_patterns: Vec::new(),
            removal_asked: false,
        }
    }
}

#[derive(Clone, Copy)]
pub struct ToolContext<'a> {
    pub sandbox: &'a dyn Sandbox,
    pub settings: &'a ToolSettings,
    pub approver: Option<&'a dyn Approver>,
}

impl ToolContext<'_> {
    /// Run a shell command with stderr merged into stdout, bounded for the model.
    pub async fn shell(&self, command: &str) -> Result<ExecOutput, SandboxError> {
        self.shell_bounded(command, self.settings.output_head, self.settings.output_tail)
            .await
    }

    /// [`ToolContext::shell`], keeping `head` and `tail` bytes of the output.
    pub async fn shell_bounded(
        &self,
        command: &str,
        head: usize,
        tail: usize,
    ) -> Result<ExecOutput, SandboxError> {
        self.sandbox.exec(self.shell_request(command, head, tail)).await
    }

    /// The request [`ToolContext::shell_bounded`] sends (also what a background process runs).
    pub fn shell_request(&self, command: &str, head: usize, tail: usize) -> ExecRequest {
        // Not a login shell (`-l`): on Debian-based images /etc/profile replaces the image's own
        // PATH (the one `docker exec` and the Dockerfile's RUN use) with a fixed one, and reading
        // it costs about 4 ms a command, as much as the rest of a `true` call.
        let argv = ["/bin/sh", "-c", "exec 2>&1; exec bash -c \"$1\"", "sh", command];
        let mut req = ExecRequest::argv(argv, self.settings.command_timeout).capture(head, tail);
        // The executor runs the same bash with stderr on stdout's pipe itself: no `sh` first.
        req.native = Some(NativeOp {
            op: "shell",
            args: vec![command.to_string()],
        });
        req
    }
}

/// One test command's run.
#[derive(Debug)]
pub struct TestRun {
    pub command: String,
    pub output: ExecOutput,
}

/// Whether every test command passed (none at all: nothing failed).
pub fn all_passed(runs: &[TestRun]) -> bool {
    runs.iter().all(|r| r.output.success())
}

/// The least each of several test commands keeps of its output's start and end.
const MIN_SHARE: (usize, usize) = (1000, 2000);

impl ToolContext<'_> {
    /// Run every test command, in order, each to its end even when an earlier one failed.
    /// Together they keep about what one command's output is allowed (each an equal share,
    /// never less than [`MIN_SHARE`]).
    pub async fn run_tests(&self) -> Result<Vec<TestRun>, SandboxError> {
        let commands = &self.settings.test_commands;
        let n = commands.len().max(1);
        let head = (self.settings.output_head / n).max(MIN_SHARE.0.min(self.settings.output_head));
        let tail = (self.settings.output_tail / n).max(MIN_SHARE.1.min(self.settings.output_tail));
        let mut runs = Vec::with_capacity(commands.len());
        for command in commands {
            let output = self.shell_bounded(command, head, tail).await?;
            runs.push(TestRun {
                command: command.clone(),
                output,
            });
        }
        Ok(runs)
    }
}

/// Test runs the way the model sees them: one command as [`render_command`]; several each in
/// turn, then a line with every verdict (the line the progress printer shows).
pub fn render_test_runs(runs: &[TestRun]) -> String {
    match runs {
        [one] => render_command(&one.command, &one.output),
        many => {
            let mut s = many
                .iter()
                .map(|r| render_command(&r.command, &r.output))
                .collect::<Vec<_>>()
                .join("\n\n");
            let verdicts: Vec<String> = many
                .iter()
                .map(|r| {
                    if r.output.success() {
                        format!("`{}` passed", r.command)
                    } else {
                        format!("`{}` FAILED ({})", r.command, r.output.status_line())
                    }
                })
                .collect();
            s.push_str(&format!(
                "\n\n{} test commands, all must pass: {}",
                many.len(),
                verdicts.join("; ")
            ));
            s
        }
    }
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn name(&self) -> &'static str;
    fn description(&self, settings: &ToolSettings) -> String;
    fn schema(&self) -> Value;
    /// Whether the tool only reads (told to MCP clients as an annotation).
    fn read_only(&self) -> bool {
        false
    }
    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<ToolOutput, ToolError>;
}

/// Typed arguments, or an error the model can fix.
pub fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::RespondToModel(format!("invalid arguments for {tool}: {e}")))
}

/// Command output the way the model sees it: the output, then how it ended.
pub fn render_command(command: &str, out: &ExecOutput) -> String {
    let mut s = format!("$ {command}\n");
    let text = out.stdout.to_text();
    s.push_str(&text);
    if !text.is_empty() && !text.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&out.status_line());
    if out.timed_out {
        // The model cannot raise it; the user it reports to can.
        s.push_str(" (the user can raise the limit with --command-timeout)");
    }
    s
}

/// The outcome of one call.
#[derive(Debug)]
pub enum Dispatched {
    /// The tool ran; its output goes back to the model.
    Output(String),
    /// Told to the model as an error; the loop goes on.
    Error(String),
    /// `finish`: the run is over, with the model's summary.
    Finish { content: String, summary: String },
    /// The sandbox failed: the run stops.
    Fatal(SandboxError),
}

impl Dispatched {
    /// What the model is sent as the call's result.
    pub fn content(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Dispatched::Output(c) | Dispatched::Error(c) | Dispatched::Finish { content: c, .. } => c.into(),
            Dispatched::Fatal(e) => format!("the sandbox failed: {e}").into(),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Dispatched::Error(_) | Dispatched::Fatal(_))
    }
}

/// Which edit tools the model gets (`--edit-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum EditFormat {
    /// `edit_file`: exact search and replace.
    #[default]
    Exact,
    /// `write_file`: the whole file (small models copy an exact `old` badly).
    Whole,
    /// Both.
    Both,
}

pub struct ToolRegistry {
    tools: Vec<Box<dyn Tool>>,
}

impl ToolRegistry {
    /// The standard set: the five file and test tools, `bash` and the two tools for its
    /// background processes unless `shell` is false, and `finish` when the model must call a
    /// tool every turn.
    pub fn standard(shell: bool, finish: bool) -> Self {
        let mut tools: Vec<Box<dyn Tool>> = vec![
            Box::new(list_files::ListFiles),
            Box::new(read_file::ReadFile),
            Box::new(edit_file::EditFile),
            Box::new(search::Search),
            Box::new(run_tests::RunTests),
        ];
        if shell {
            tools.push(Box::new(bash::Bash));
            tools.push(Box::new(process::ProcessOutput));
            tools.push(Box::new(process::StopProcess));
        }
        if finish {
            tools.push(Box::new(finish::Finish));
        }
        ToolRegistry { tools }
    }

    /// The edit tools `format` asks for: `edit_file`, `write_file` after it, or both.
    pub fn with_edit_format(mut self, format: EditFormat) -> Self {
        let at = self.tools.iter().position(|t| t.name() == "edit_file");
        if matches!(format, EditFormat::Whole | EditFormat::Both) {
            let i = at.map_or(self.tools.len(), |i| i + 1);
            self.tools.insert(i, Box::new(write_file::WriteFile));
        }
        if format == EditFormat::Whole
            && let Some(i) = at
        {
            self.tools.remove(i);
        }
        self
    }

    /// Only `write_file`: what a repair candidate may call.
    pub fn write_only() -> Self {
        ToolRegistry {
            tools: vec![Box::new(write_file::WriteFile)],
        }
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|t| t.name()).collect()
    }

    /// Whether the tool `name` only reads.
    pub fn is_read_only(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name() == name && t.read_only())
    }

    pub fn specs(&self, settings: &ToolSettings) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name().into(),
                description: t.description(settings),
                input_schema: t.schema(),
            })
            .collect()
    }

    pub async fn dispatch(&self, call: &ToolCall, ctx: &ToolContext<'_>) -> Dispatched {
        let error = Dispatched::Error;
        let args = match &call.arguments {
            ToolArgs::Invalid { raw, error: why } if call.name == MALFORMED => {
                return error(format!(
                    "could not read this tool call ({why}); you wrote: {}. Write `tool: NAME({{...json...}})`.",
                    clip(raw, 300)
                ));
            }
            ToolArgs::Invalid { raw, error: why } => {
                return error(format!(
                    "the arguments for {} are not valid JSON ({why}); you sent: {}. Send one JSON object.",
                    call.name,
                    clip(raw, 300)
                ));
            }
            ToolArgs::Json(v) => v.clone(),
        };
        let Some(tool) = self.tools.iter().find(|t| t.name() == call.name) else {
            return error(format!(
                "unknown tool {:?}; the tools are: {}",
                clip(&call.name, 100),
                self.names().join(", ")
            ));
        };
        let args = match args {
            Value::Object(_) => args,
            Value::Null => Value::Object(Default::default()),
            other => {
                return error(format!(
                    "the arguments for {} must be a JSON object, not {other}",
                    call.name
                ));
            }
        };
        let ended = ctx.sandbox.ended_services();
        if !ended.is_empty() {
            // Said before the call, so a test does not wait on a server that is gone.
            return error(format!(
                "{}. This call was not run. The service's data is gone and connections to it are \
                 refused from now on; tests that need it will fail, so say so when you finish",
                ended.join("; ")
            ));
        }
        match tool.call(args, ctx).await {
            Ok(ToolOutput {
                content,
                finish: Some(summary),
            }) => Dispatched::Finish { content, summary },
            Ok(out) => Dispatched::Output(out.content),
            Err(ToolError::RespondToModel(msg)) => error(msg),
            Err(ToolError::Fatal(e)) => Dispatched::Fatal(e),
        }
    }
}

/// At most `max` characters of `s`, marked when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}… [{} more characters]", s.chars().count() - max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_set_is_the_public_contract() {
        assert_eq!(
            ToolRegistry::standard(true, false).names(),
            [
                "list_files",
                "read_file",
                "edit_file",
                "search",
                "run_tests",
                "bash",
                "process_output",
                "stop_process"
            ]
        );
        assert_eq!(
            ToolRegistry::standard(false, true).names(),
            [
                "list_files",
                "read_file",
                "edit_file",
                "search",
                "run_tests",
                "finish"
            ]
        );
        assert_eq!(
            ToolRegistry::standard(false, true)
                .with_edit_format(EditFormat::Whole)
                .names(),
            [
                "list_files",
                "read_file",
                "write_file",
                "search",
                "run_tests",
                "finish"
            ]
        );
        assert_eq!(
            ToolRegistry::standard(false, false)
                .with_edit_format(EditFormat::Both)
                .names(),
            [
                "list_files",
                "read_file",
                "edit_file",
                "write_file",
                "search",
                "run_tests"
            ]
        );
        let specs = ToolRegistry::standard(true, true).specs(&ToolSettings::default());
        let edit = specs.iter().find(|s| s.name == "edit_file").unwrap();
        assert_eq!(
            edit.input_schema["required"],
            serde_json::json!(["path", "old", "new"])
        );
    }

    #[test]
    fn several_test_runs_are_shown_in_turn_with_a_last_line_of_verdicts() {
        let run = |command: &str, exit_code: i64, out: &str| TestRun {
            command: command.into(),
            output: ExecOutput {
                exit_code,
                stdout: crate::sandbox::Captured::complete(out.as_bytes().to_vec()),
                ..Default::default()
            },
        };
        let one = [run("cargo test", 101, "test t ... FAILED\n")];
        assert_eq!(
            render_test_runs(&one),
            render_command("cargo test", &one[0].output)
        );
        assert!(!all_passed(&one));
        let two = [run("cargo test", 0, "ok\n"), run("make test", 2, "boom\n")];
        let text = render_test_runs(&two);
        assert!(text.starts_with("$ cargo test\nok\n"), "{text}");
        assert!(text.contains("\n\n$ make test\nboom\n"), "{text}");
        assert!(
            text.ends_with(
                "2 test commands, all must pass: `cargo test` passed; `make test` FAILED (exit 2)"
            ),
            "{text}"
        );
        assert!(!all_passed(&two));
        assert!(all_passed(&two[..1]));
    }

    #[test]
    fn clip_marks_what_it_cut() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abcdef", 3), "abc… [3 more characters]");
    }
}
