//! The loop in milliseconds: the scripted model and a stub sandbox whose commands answer from a
//! function. These test the loop's own rules (the per-turn cap, the repeat guard, resampling,
//! verify-finish, a sandbox failure mid-turn); that commands really run contained is what the
//! integration tests against the real daemon are for.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use super::*;
use crate::events::Fanout;
use crate::model::scripted::Scripted;
use crate::model::{ModelClient, Turn};
use crate::sandbox::{Captured, ExecMode, ExecOutput, ExecRequest, Sandbox, SandboxInfo};
use crate::tools::{ToolContext, ToolRegistry, ToolSettings};

type Respond = dyn Fn(&str, usize) -> Result<i64, SandboxError> + Send + Sync;

/// Every command is answered by `respond(command, how many ran before)`: an exit code, or a
/// sandbox failure. What ran is recorded.
struct StubSandbox {
    info: SandboxInfo,
    respond: Box<Respond>,
    ran: Mutex<Vec<String>>,
}

impl StubSandbox {
    fn new(respond: impl Fn(&str, usize) -> Result<i64, SandboxError> + Send + Sync + 'static) -> Self {
        StubSandbox {
            info: SandboxInfo {
                session: "stub".into(),
                container_id: "stub".into(),
                image: "stub".into(),
                uid: 1000,
                gid: 1000,
                exec_mode: ExecMode::Persistent,
                warnings: Vec::new(),
            },
            respond: Box::new(respond),
            ran: Mutex::new(Vec::new()),
        }
    }

    fn ran(&self) -> Vec<String> {
        self.ran.lock().unwrap().clone()
    }
}

#[async_trait]
impl Sandbox for StubSandbox {
    fn info(&self) -> &SandboxInfo {
        &self.info
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        // The shell tools pass the command as the last argument.
        let command = req.argv.last().cloned().unwrap_or_default();
        let before = {
            let mut ran = self.ran.lock().unwrap();
            ran.push(command.clone());
            ran.len() - 1
        };
        let exit_code = (self.respond)(&command, before)?;
        Ok(ExecOutput {
            exit_code,
            signal: None,
            timed_out: false,
            oom_killed: false,
            stdout: Captured::complete(format!("output of {command}\n").into_bytes()),
            stderr: Captured::default(),
            elapsed: Duration::from_millis(1),
        })
    }

    async fn put_archive(&self, _: &str, _: Vec<u8>) -> Result<(), SandboxError> {
        Err(SandboxError::Other("not in the stub".into()))
    }

    async fn get_archive(&self, _: &str, _: u64) -> Result<Vec<u8>, SandboxError> {
        Err(SandboxError::Other("not in the stub".into()))
    }

    async fn archive_reader(
        &self,
        _: &str,
    ) -> Result<Box<dyn tokio::io::AsyncRead + Send + Unpin>, SandboxError> {
        Err(SandboxError::Other("not in the stub".into()))
    }

    async fn shutdown(&self) -> Result<(), SandboxError> {
        Ok(())
    }
}

/// The scripted model, with the temperature of every request it was sent.
struct Recording {
    inner: Scripted,
    temperatures: Mutex<Vec<Option<f32>>>,
}

#[async_trait]
impl ModelClient for Recording {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn estimated_usage(&self) -> bool {
        true
    }

    async fn complete(&self, request: &Request) -> Result<Turn, ModelError> {
        self.temperatures.lock().unwrap().push(request.temperature);
        self.inner.complete(request).await
    }
}

fn bash(command: &str) -> serde_json::Value {
    json!({"name": "bash", "arguments": {"command": command}})
}

fn run_tests() -> serde_json::Value {
    json!({"name": "run_tests", "arguments": {}})
}

struct Outcome {
    result: LoopResult,
    messages: Vec<Message>,
    ran: Vec<String>,
    temperatures: Vec<Option<f32>>,
}

impl Outcome {
    /// The results sent back for every call, in order.
    fn results(&self) -> Vec<(String, bool)> {
        self.messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                Block::ToolResult(r) => Some((r.content.clone(), r.is_error)),
                _ => None,
            })
            .collect()
    }
}

/// What an agent needs besides the model and the sandbox: "the tests" as the test command,
/// the standard tools with `bash`, no event sinks.
fn parts() -> (ToolSettings, ToolRegistry, Fanout) {
    let settings = ToolSettings {
        test_commands: vec!["the tests".into()],
        ..Default::default()
    };
    (settings, ToolRegistry::standard(true, false), Fanout::default())
}

fn agent<'a>(
    model: &'a dyn ModelClient,
    sandbox: &'a StubSandbox,
    settings: &'a ToolSettings,
    tools: &'a ToolRegistry,
    events: &'a Fanout,
    config: AgentConfig,
) -> Agent<'a> {
    Agent {
        model,
        tools,
        ctx: ToolContext {
            sandbox,
            settings,
            approver: None,
        },
        events,
        config,
        system: "system".into(),
        watch: None,
    }
}

async fn run_loop(turns: serde_json::Value, config: AgentConfig, sandbox: StubSandbox) -> Outcome {
    let model = Recording {
        inner: Scripted::from_json(&turns.to_string(), "test").unwrap(),
        temperatures: Mutex::new(Vec::new()),
    };
    let (settings, tools, events) = parts();
    let agent = agent(&model, &sandbox, &settings, &tools, &events, config);
    let mut messages = vec![Message::user_text("fix it")];
    let result = agent.run(&mut messages).await;
    Outcome {
        result,
        messages,
        ran: sandbox.ran(),
        temperatures: model.temperatures.into_inner().unwrap(),
    }
}

fn passing() -> StubSandbox {
    StubSandbox::new(|_, _| Ok(0))
}

#[tokio::test]
async fn calls_past_the_per_turn_cap_are_answered_not_run() {
    let config = AgentConfig {
        max_calls_per_turn: 3,
        ..Default::default()
    };
    let calls: Vec<_> = (0..5).map(|i| bash(&format!("echo {i}"))).collect();
    let out = run_loop(
        json!([{"tool_calls": calls}, {"text": "done"}]),
        config,
        passing(),
    )
    .await;
    assert_eq!(out.ran, ["echo 0", "echo 1", "echo 2"]);
    let results = out.results();
    assert_eq!(results.len(), 5, "every call gets a result");
    for (content, is_error) in &results[3..] {
        assert!(
            *is_error && content.starts_with("not run: 5 tool calls in one turn; at most 3"),
            "{content}"
        );
    }
    assert!(matches!(out.result.stop, Stop::Answered(ref t) if t == "done"));
    assert_eq!(out.result.steps, 2);
}

#[tokio::test]
async fn a_sandbox_failure_stops_the_run_and_the_rest_of_the_turn() {
    let sandbox = StubSandbox::new(|cmd, _| match cmd {
        "boom" => Err(SandboxError::ContainerGone("killed".into())),
        _ => Ok(0),
    });
    let turns = json!([{"tool_calls": [bash("ok"), bash("boom"), bash("after")]}, {"text": "never"}]);
    let out = run_loop(turns, AgentConfig::default(), sandbox).await;
    assert_eq!(out.ran, ["ok", "boom"]);
    assert!(
        matches!(&out.result.stop, Stop::Fatal(Fatal::Sandbox(e)) if matches!(**e, SandboxError::ContainerGone(_))),
        "{:?}",
        out.result.stop
    );
    let results = out.results();
    assert!(results[1].1 && results[1].0.starts_with("the sandbox failed"));
    assert_eq!(
        results[2],
        ("not run: the sandbox failed earlier in this turn".into(), true)
    );
    assert_eq!(out.result.steps, 1);
}

#[tokio::test]
async fn a_model_failure_is_typed_as_the_models() {
    // The script runs out after one turn: the scripted model's own error.
    let out = run_loop(
        json!([{"tool_calls": [bash("ls")]}]),
        AgentConfig::default(),
        passing(),
    )
    .await;
    assert!(
        matches!(out.result.stop, Stop::Fatal(Fatal::Model(_))),
        "{:?}",
        out.result.stop
    );
}

#[tokio::test]
async fn the_repeat_guard_answers_a_repeat_until_something_changes() {
    let config = AgentConfig {
        repeat_guard: true,
        ..Default::default()
    };
    let turns = json!([
        {"tool_calls": [run_tests()]},
        {"tool_calls": [run_tests()]},
        {"tool_calls": [bash("edit something")]},
        {"tool_calls": [run_tests()]},
        {"text": "done"}
    ]);
    let out = run_loop(turns, config, passing()).await;
    assert_eq!(out.ran, ["the tests", "edit something", "the tests"]);
    let (repeat, is_error) = &out.results()[1];
    assert!(
        *is_error && repeat.starts_with("not run: you made this exact call at step 1"),
        "{repeat}"
    );

    // Without the guard every call runs.
    let turns = json!([{"tool_calls": [run_tests()]}, {"tool_calls": [run_tests()]}, {"text": "done"}]);
    let out = run_loop(turns, AgentConfig::default(), passing()).await;
    assert_eq!(out.ran, ["the tests", "the tests"]);
}

#[tokio::test]
async fn a_model_that_only_repeats_ends_its_attempt_early_not_after_all_its_steps() {
    let config = AgentConfig {
        repeat_guard: true,
        max_steps: 15,
        ..Default::default()
    };
    let same = json!({"tool_calls": [run_tests()]});
    let turns = json!([same, same, same, same, same, same, same, same, same, same]);
    let out = run_loop(turns, config, passing()).await;
    assert!(
        matches!(out.result.stop, Stop::Repeating),
        "{:?}",
        out.result.stop
    );
    assert_eq!(out.result.steps, 3, "one real call, then two refused repeats");
    assert_eq!(out.ran, ["the tests"]);

    // A refused repeat followed by something new is not a streak.
    let config = AgentConfig {
        repeat_guard: true,
        ..Default::default()
    };
    let turns = json!([
        {"tool_calls": [run_tests()]},
        {"tool_calls": [run_tests()]},
        {"tool_calls": [bash("something new")]},
        {"tool_calls": [bash("something new")]},
        {"text": "done"}
    ]);
    let out = run_loop(turns, config, passing()).await;
    assert!(
        matches!(out.result.stop, Stop::Answered(_)),
        "{:?}",
        out.result.stop
    );
}

#[tokio::test]
async fn a_reply_of_only_repeats_is_resampled_hotter_and_not_counted_as_a_step() {
    let config = AgentConfig {
        repeat_guard: true,
        resample_repeats: 2,
        resample_temperature: 0.9,
        temperature: Some(0.0),
        ..Default::default()
    };
    let turns = json!([
        {"tool_calls": [run_tests()]},
        {"tool_calls": [run_tests()]},
        {"tool_calls": [bash("something new")]},
        {"text": "done"}
    ]);
    let out = run_loop(turns, config, passing()).await;
    assert_eq!(out.ran, ["the tests", "something new"]);
    assert_eq!(out.temperatures, [Some(0.0), Some(0.0), Some(0.9), Some(0.0)]);
    assert_eq!(out.result.steps, 3, "the resample is part of step 2");
    assert!(out.results().iter().all(|(_, e)| !e), "{:?}", out.results());
}

#[tokio::test]
async fn finishing_while_the_tests_fail_sends_the_model_back_as_often_as_allowed() {
    // The tests fail the first time agentbox runs them, then pass.
    let sandbox = StubSandbox::new(|_, before| Ok(if before == 0 { 1 } else { 0 }));
    let config = AgentConfig {
        verify_finish: 2,
        ..Default::default()
    };
    let out = run_loop(
        json!([{"text": "done"}, {"text": "done, really"}]),
        config,
        sandbox,
    )
    .await;
    assert_eq!(out.ran, ["the tests", "the tests"]);
    assert!(matches!(out.result.stop, Stop::Answered(ref t) if t == "done, really"));
    let sent_back = out.messages[2].text();
    assert!(
        sent_back.contains("agentbox ran the tests and they still fail"),
        "{sent_back}"
    );

    // With no verification left, the second "done" is taken as it is.
    let sandbox = StubSandbox::new(|_, _| Ok(1));
    let config = AgentConfig {
        verify_finish: 1,
        ..Default::default()
    };
    let out = run_loop(
        json!([{"text": "done"}, {"text": "done anyway"}]),
        config,
        sandbox,
    )
    .await;
    assert!(matches!(out.result.stop, Stop::Answered(ref t) if t == "done anyway"));
    assert_eq!(
        out.ran,
        ["the tests"],
        "no verification left: the tests are not run again"
    );
}

#[tokio::test]
async fn the_step_limit_ends_the_run() {
    let config = AgentConfig {
        max_steps: 3,
        ..Default::default()
    };
    let turns: Vec<_> = (0..10)
        .map(|i| json!({"tool_calls": [bash(&format!("step {i}"))]}))
        .collect();
    let out = run_loop(json!(turns), config, passing()).await;
    assert!(matches!(out.result.stop, Stop::StepLimit));
    assert_eq!(out.result.steps, 3);
    assert_eq!(out.ran.len(), 3);
}

#[tokio::test]
async fn attempts_start_over_from_a_reset_project_hotter_while_the_tests_fail() {
    // The tests fail: the first attempt ends with them failing, so the project is reset and
    // a second, hotter attempt starts; it is the last one, so its end is taken as it is.
    let sandbox = StubSandbox::new(|cmd, _| Ok(if cmd == "the tests" { 1 } else { 0 }));
    let model = Recording {
        inner: Scripted::from_json(
            &json!([{"text": "done"}, {"tool_calls": [bash("fix it")]}, {"text": "done again"}]).to_string(),
            "test",
        )
        .unwrap(),
        temperatures: Mutex::new(Vec::new()),
    };
    let (settings, tools, events) = parts();
    let config = AgentConfig {
        temperature: Some(0.0),
        ..Default::default()
    };
    let agent = agent(&model, &sandbox, &settings, &tools, &events, config);
    let aids = crate::config::Aids {
        attempts: 2,
        retry_temperature: 0.8,
        ..Default::default()
    };
    let (result, attempts, _) = crate::session::work(&agent, &aids, &[], "fix it", None).await;
    assert_eq!(attempts, 2);
    assert_eq!(result.steps, 3, "steps are summed over the attempts");
    assert!(matches!(result.stop, Stop::Answered(ref t) if t == "done again"));
    assert_eq!(
        model.temperatures.lock().unwrap().as_slice(),
        [Some(0.0), Some(0.8), Some(0.8)]
    );
    let ran = sandbox.ran();
    // Before the first attempt the start is checkpointed and its tests counted; after each
    // attempt the tests run (to decide, and to know whether the end is the best state); the
    // reset goes back to the start checkpoint.
    // (The stub records a command's last argument: the checkpoint's name.)
    assert_eq!(
        ran,
        [
            "loop-start",
            "the tests",
            "the tests",
            "loop-start",
            "fix it",
            "the tests"
        ]
    );
}
