//! `agentbox chat PROJECT`: a conversation with the model on one sandbox.

use std::io::{BufRead, Write};

use crate::agent::Stop;
use crate::cli::ChatArgs;
use crate::config::AgentSettings;
use crate::events::{Event, EventSink, for_terminal};
use crate::model::Message;
use crate::report::exit;
use crate::sandbox::Cleanup;
use crate::session::{Session, event_sinks, run_tests_now};

const HELP: &str = "Type a request for the agent. Commands: /diff (what changed), /tests (run the tests), \
                    /exit (or Ctrl-D) to end.";

pub async fn run(args: ChatArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    crate::config::project_arg(&args.project)?;
    let mut settings = AgentSettings::from_args(&args.agent, &args.session)?;
    settings.sandbox.cleanup = cleanup;
    let events = event_sinks(&settings)?;
    let session = Session::open(&settings, &args.project, events.clone()).await?;
    errln!("{HELP}");
    let mut messages: Vec<Message> = Vec::new();
    let mut code = 0;
    while let Some(line) = read_line("you> ").await {
        let line = line.trim().to_string();
        match line.as_str() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => errln!("{HELP}"),
            "/diff" => match session.diff().await {
                Ok(d) if d.is_empty() => outln!("(no changes)"),
                Ok(d) => out!("{}", for_terminal(&d)),
                Err(e) => errln!("diff unavailable: {e}"),
            },
            "/tests" => outln!("{}", for_terminal(&run_tests_now(&session).await)),
            _ => {
                messages.push(Message::user_text(line));
                let result = session.agent().run(&mut messages).await;
                match result.stop {
                    Stop::Answered(text) => outln!("\nagent> {}\n", for_terminal(text.trim())),
                    Stop::Repeating => errln!("agentbox: stopped early: the model only repeated itself"),
                    Stop::StepLimit => {
                        errln!(
                            "agentbox: stopped at the step limit ({} steps) for this request",
                            settings.max_steps
                        );
                        // Leave the conversation answerable: the next message follows tool results.
                    }
                    Stop::Fatal(e) => {
                        errln!("agentbox: error: {e}");
                        code = exit::ERROR;
                        break;
                    }
                }
            }
        }
    }
    events.emit(&Event::Note {
        message: "chat ended; removing the sandbox".into(),
    });
    let warnings = session.close().await.map(|c| c.warnings).unwrap_or_default();
    for w in warnings {
        errln!("agentbox: WARNING: {}", crate::events::for_terminal(&w));
    }
    Ok(code)
}

async fn read_line(prompt: &'static str) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{prompt}");
        let _ = err.flush();
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
