//! `agentbox chat PROJECT`: a conversation with the model on one sandbox.
//!
//! On a terminal it behaves like the tools people know: line editing and history (rustyline),
//! a multi-line paste is one message (bracketed paste), Ctrl-C cancels the request or tool call
//! under way and returns to the prompt with the conversation kept, a second Ctrl-C at the
//! prompt (or Ctrl-D) leaves. Without a terminal it reads one message per line.

use std::io::BufRead;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::agent::Stop;
use crate::cli::ChatArgs;
use crate::config::AgentSettings;
use crate::events::{Event, EventSink, for_terminal};
use crate::model::{Block, Message, Role, ToolResult};
use crate::output::escaped;
use crate::report::exit;
use crate::sandbox::Cleanup;
use crate::session::{Session, baseline, conversation_event_sinks, run_tests_now};

const HELP: &str = "Type a request for the agent (a pasted block of lines is one request). Commands:\n  \
                    /diff   what changed since the session began\n  \
                    /tests  run the tests\n  \
                    /undo   put the project back as it was before the last request\n  \
                    /help   this\n  \
                    /exit   leave (or Ctrl-D, or Ctrl-C twice at the prompt)\n\
                    Ctrl-C while the agent works cancels the request and keeps the conversation. \
                    Start a message with // to send one that begins with /.";

/// What a cancelled tool call is answered with, so the next request is well-formed.
pub const CANCELLED: &str = "cancelled by the user";

pub async fn run(args: ChatArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    crate::config::project_arg(&args.project)?;
    let mut settings = AgentSettings::from_args(&args.agent, &args.session)?;
    settings.sandbox.cleanup = cleanup.clone();
    // `--env`: locked for the whole chat, its flags kept, the session in its copy.
    let mut env_lock = None;
    let mut made_here = false;
    if let Some(name) = &args.env {
        let name = crate::envs::EnvName::parse(name).map_err(|e| crate::config::UsageError(e.to_string()))?;
        env_lock = Some(crate::envs::lock(&crate::envs::envs_dir()?, &name)?);
        made_here = super::env_turn::keep_flags(&mut settings.setup, &mut settings.sandbox, &name)?;
        settings.isolate = Some(crate::config::IsolateSettings {
            exclude: Vec::new(),
            patch: None,
            write_patch: false,
            apply: false,
            env: Some(name),
        });
    }
    let env_name = settings.isolate.as_ref().and_then(|i| i.env.clone());
    let engine = crate::sandbox::engine::current();
    if engine.is_remote() && env_name.is_none() {
        return Err(crate::config::UsageError(format!(
            "chat works on a bind-mounted project, which the remote engine {} cannot mount; use `agentbox run` \
             (the project is copied in and the changes come back as a patch) or `agentbox shell`",
            engine.describe()
        ))
        .into());
    }
    let published = super::publish::Published::start(&args.publish)?;
    settings.published = published.forwards();
    let events = conversation_event_sinks(&settings)?;
    let session = Session::open(&settings, &args.project, events.clone()).await?;
    if let Err(e) = published.announce(&session.sandbox).await {
        let _ = session.close().await;
        return Err(e.into());
    }
    if let (Some(name), true) = (&env_name, made_here)
        && let Err(e) = crate::envs::record_flags(name, &super::env_turn::given_flags(&settings.setup))
    {
        errln!(
            "agentbox: WARNING: the environment's flags were not kept: {}",
            escaped(&e)
        );
    }
    errln!("{}", HELP);
    // From here on Ctrl-C cancels what the chat waits for; the edge leaves it to us.
    let _claim = cleanup.claim_interrupts();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut input = Input::new();
    // A resumed environment's conversation goes on.
    let mut messages: Vec<Message> = session.history().to_vec();
    if !messages.is_empty() {
        errln!(
            "agentbox: the conversation of environment {} goes on ({} messages)",
            escaped(env_name.as_ref().map(|n| n.as_str()).unwrap_or_default()),
            messages.len()
        );
    }
    // Checkpoints of the project before each request, for /undo (newest last), and whether
    // the request became a turn of the environment's log.
    let mut undo: Vec<(String, usize, bool)> = Vec::new();
    let mut env_changed: Option<usize> = None;
    let timeout = session.tool_settings.command_timeout.max(Duration::from_secs(60));
    let mut code = 0;
    let mut interrupted_once = false;
    loop {
        let line = match input.read("you> ").await {
            Read::Line(l) => l,
            Read::Interrupted if interrupted_once => break,
            Read::Interrupted => {
                interrupted_once = true;
                errln!("(Ctrl-C again, Ctrl-D or /exit to leave)");
                continue;
            }
            Read::Eof => break,
        };
        interrupted_once = false;
        let line = line.trim().to_string();
        let text = match line.as_str() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => {
                errln!("{}", HELP);
                continue;
            }
            "/diff" => {
                match session.diff().await {
                    Ok(d) if d.is_empty() => outln!("(no changes)"),
                    Ok(d) => out!("{}", for_terminal(&d)),
                    Err(e) => errln!("diff unavailable: {}", escaped(&e)),
                }
                continue;
            }
            "/tests" => {
                outln!("{}", for_terminal(&run_tests_now(&session).await));
                continue;
            }
            "/undo" => {
                match undo.pop() {
                    None => errln!("nothing to undo"),
                    Some((name, len, logged)) => match baseline::restore(&session.sandbox, timeout, &name)
                        .await
                    {
                        Ok(()) => {
                            // The turn is taken back whole: the project and the conversation
                            // (and the environment's log).
                            messages.truncate(len);
                            if let Some(env) = &env_name {
                                let kept = (if logged {
                                    crate::env_checkpoint::drop_last_turn(env)
                                } else {
                                    Ok(())
                                })
                                .and_then(|()| {
                                    crate::envs::save_conversation(&crate::envs::envs_dir()?, env, &messages)
                                });
                                if let Err(e) = kept {
                                    errln!(
                                        "agentbox: WARNING: the environment's log was not updated: {}",
                                        escaped(&e)
                                    );
                                }
                            }
                            errln!("the project is back as it was before your last request");
                        }
                        Err(e) => errln!("cannot undo: {}", escaped(&e)),
                    },
                }
                continue;
            }
            l if l.starts_with("//") => l[1..].to_string(),
            l if l.starts_with('/') && !l.contains(char::is_whitespace) => {
                errln!("unknown command {}; /help lists them", for_terminal(l));
                continue;
            }
            _ => line,
        };
        let name = format!("turn-{}", undo.len() + 1);
        let request = text.clone();
        match baseline::checkpoint(&session.sandbox, timeout, &name).await {
            Ok(()) => undo.push((name, messages.len(), false)),
            Err(e) => errln!("agentbox: no /undo for this request: {}", escaped(&e)),
        }
        messages.push(Message::user_text(text));
        drain(&mut sigint).await;
        let ran = {
            let agent = session.agent();
            let work = agent.run(&mut messages);
            tokio::select! {
                result = work => Some(result),
                _ = sigint.recv() => None,
            }
        };
        let Some(result) = ran else {
            // The call under way was dropped; what it started in the sandbox is killed so the
            // next request finds it idle (background processes go on).
            if let Err(e) = session.sandbox.cancel_call().await {
                errln!("agentbox: error: {}", escaped(&e));
                code = exit::ERROR;
                break;
            }
            settle_cancelled(&mut messages);
            // Through the events: the printer's spinner of the dropped call ends with it.
            events.emit(&Event::Note {
                message: "cancelled; the conversation is kept".into(),
            });
            continue;
        };
        let verdict = match result.stop {
            Stop::Answered(text) | Stop::Repaired(text) => {
                outln!("\nagent> {}\n", for_terminal(text.trim()));
                "answered"
            }
            Stop::Repeating => {
                errln!("agentbox: stopped early: the model only repeated itself");
                "repeating"
            }
            Stop::StepLimit => {
                errln!(
                    "agentbox: stopped at the step limit ({} steps) for this request",
                    settings.max_steps
                );
                // Leave the conversation answerable: the next message follows tool results.
                "step_limit"
            }
            Stop::Fatal(e) => {
                errln!("agentbox: error: {}", escaped(&e));
                code = exit::ERROR;
                break;
            }
        };
        if let Some(env) = &env_name {
            match keep_turn(&session, env, &request, verdict, &messages).await {
                Ok(changed) => {
                    env_changed = Some(changed);
                    if let Some(last) = undo.last_mut() {
                        last.2 = true;
                    }
                }
                Err(e) => errln!(
                    "agentbox: WARNING: this request is not in the environment's log: {}",
                    escaped(&e)
                ),
            }
        }
    }
    events.emit(&Event::Note {
        message: "chat ended; removing the sandbox".into(),
    });
    drop(published);
    let check = session.close().await;
    for w in check.iter().flat_map(|c| &c.warnings) {
        errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
    }
    match &env_name {
        Some(env) => {
            if let Some(changed) = env_changed {
                errln!("agentbox: {}", escaped(super::env_turn::summary(env, changed)));
            }
        }
        // What changed over the whole conversation, as `shell` says it.
        None => {
            for line in super::summary::changes(&args.project, false, check.as_ref()) {
                errln!("agentbox: {}", line);
            }
        }
    }
    drop(env_lock);
    Ok(code)
}

/// A chat request in an environment: its checkpoint and log line, and the conversation kept.
/// Returns how many files differ from what was first copied in.
async fn keep_turn(
    session: &Session,
    env: &crate::envs::EnvName,
    request: &str,
    verdict: &str,
    messages: &[Message],
) -> anyhow::Result<usize> {
    crate::envs::save_conversation(&crate::envs::envs_dir()?, env, messages)?;
    let (changed, warnings) = session.keep_env_turn(request, verdict.to_string()).await?;
    for w in &warnings {
        errln!("agentbox: WARNING: {}", for_terminal(w));
    }
    Ok(changed.len())
}

/// Forget a Ctrl-C that arrived while nothing was under way (at an approval question).
async fn drain(sigint: &mut tokio::signal::unix::Signal) {
    while tokio::time::timeout(Duration::ZERO, sigint.recv()).await.is_ok() {}
}

/// Make the conversation well-formed after a cancelled request: every tool call gets a result
/// ("cancelled by the user"), and a request cancelled before the model answered gets an
/// assistant turn that says so, so the next user message does not follow a user message.
pub fn settle_cancelled(messages: &mut Vec<Message>) {
    let Some(last) = messages.last() else { return };
    match last.role {
        Role::Assistant => {
            let results: Vec<Block> = last
                .tool_calls()
                .map(|c| {
                    Block::ToolResult(ToolResult {
                        call_id: c.id.clone(),
                        content: CANCELLED.into(),
                        is_error: true,
                    })
                })
                .collect();
            if !results.is_empty() {
                messages.push(Message {
                    role: Role::User,
                    content: results,
                });
                messages.push(Message::assistant(vec![Block::Text {
                    text: format!("({CANCELLED})"),
                }]));
            }
        }
        Role::User => messages.push(Message::assistant(vec![Block::Text {
            text: format!("({CANCELLED})"),
        }])),
    }
}

enum Read {
    Line(String),
    Interrupted,
    Eof,
}

/// The prompt: rustyline on a terminal, plain lines otherwise (a script, a test's pipe).
struct Input {
    editor: Option<rustyline::DefaultEditor>,
}

impl Input {
    fn new() -> Input {
        let terminal = crate::terminal::is_tty(crate::terminal::STDIN)
            && crate::terminal::is_tty(crate::terminal::STDOUT);
        let editor = terminal
            .then(|| {
                let config = rustyline::Config::builder()
                    .auto_add_history(true)
                    .max_history_size(1000)
                    .ok()?
                    .bracketed_paste(true)
                    .build();
                rustyline::DefaultEditor::with_config(config).ok()
            })
            .flatten();
        Input { editor }
    }

    async fn read(&mut self, prompt: &'static str) -> Read {
        let Some(mut editor) = self.editor.take() else {
            return match read_plain_line(prompt).await {
                Some(l) => Read::Line(l),
                None => Read::Eof,
            };
        };
        let joined = tokio::task::spawn_blocking(move || {
            let r = editor.readline(prompt);
            (editor, r)
        })
        .await;
        let Ok((editor, r)) = joined else { return Read::Eof };
        self.editor = Some(editor);
        match r {
            Ok(l) => Read::Line(l),
            Err(rustyline::error::ReadlineError::Interrupted) => Read::Interrupted,
            Err(_) => Read::Eof,
        }
    }
}

async fn read_plain_line(prompt: &'static str) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        err!("{}", prompt);
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    })
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ToolArgs, ToolCall};

    #[test]
    fn a_cancelled_tool_call_is_answered() {
        let mut m = vec![
            Message::user_text("fix it"),
            Message::assistant(vec![Block::ToolCall(ToolCall {
                id: "c1".into(),
                name: "bash".into(),
                arguments: ToolArgs::Json(serde_json::json!({"command": "sleep 100"})),
            })]),
        ];
        settle_cancelled(&mut m);
        assert_eq!(m.len(), 4);
        assert!(
            matches!(&m[2].content[0], Block::ToolResult(r) if r.call_id == "c1" && r.content == CANCELLED)
        );
        assert_eq!(m[3].role, Role::Assistant);
    }

    #[test]
    fn a_cancelled_model_request_leaves_turns_alternating() {
        let mut m = vec![Message::user_text("fix it")];
        settle_cancelled(&mut m);
        assert_eq!(m[1].role, Role::Assistant);
        let mut done = vec![
            Message::user_text("a"),
            Message::assistant(vec![Block::Text { text: "b".into() }]),
        ];
        settle_cancelled(&mut done);
        assert_eq!(done.len(), 2);
    }
}
