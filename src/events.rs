//! What the loop reports. The loop prints nothing itself: the terminal printer and the
//! trajectory writer subscribe to these events.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::model::{Block, Request, StopReason, ToolCall, Turn, Usage};
use crate::report::Report;

#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event<'a> {
    /// The first thing a session says: the image it will run, and why.
    ImageChosen {
        image: String,
        reason: String,
    },
    /// A check before the first model request (see `session::preflight`), passed or not.
    Preflight {
        step: &'static str,
        ok: bool,
        detail: String,
    },
    Started {
        session: String,
        model: String,
        project: String,
        image: String,
        exec_mode: String,
        tools: Vec<String>,
        test_commands: Vec<String>,
    },
    ModelRequest {
        step: u32,
        request: &'a Request,
    },
    ModelResponse {
        step: u32,
        turn: &'a Turn,
        elapsed_ms: u64,
        estimated_usage: bool,
    },
    Retry {
        attempt: u32,
        wait_ms: u64,
        reason: String,
    },
    ToolStarted {
        step: u32,
        call: &'a ToolCall,
    },
    ToolFinished {
        step: u32,
        call_id: &'a str,
        name: &'a str,
        content: &'a str,
        is_error: bool,
        elapsed_ms: u64,
    },
    Note {
        message: String,
    },
    /// A decision of the egress proxy (`phase`: setup or agent), recorded when its connection
    /// ended.
    Egress {
        phase: &'static str,
        decision: crate::egress::Decision,
    },
    /// A line of a setup command's output, as it is written.
    SetupLine {
        line: String,
    },
    /// One setup command's end and output (head and tail).
    SetupOutput {
        command: String,
        status: String,
        output: String,
    },
    Verifying {
        command: String,
    },
    /// A repair candidate was judged in its own sandbox (`--strategy repair`, `auto`).
    Candidate {
        candidate: &'a crate::report::CandidateReport,
    },
    Finished {
        report: &'a Report,
    },
}

pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Event<'_>);
}

/// Sends every event to each sink in turn.
#[derive(Default)]
pub struct Fanout(pub Vec<Box<dyn EventSink>>);

impl EventSink for Fanout {
    fn emit(&self, event: &Event<'_>) {
        for s in &self.0 {
            s.emit(event);
        }
    }
}

/// Replaces every known secret with `[REDACTED]`; applied to everything written to disk.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        // Short values would redact ordinary words; real keys are long.
        Redactor {
            secrets: secrets.into_iter().filter(|s| s.len() >= 8).collect(),
        }
    }

    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "[REDACTED]");
            }
        }
        out
    }
}

/// JSONL: one event per line, with a timestamp, flushed as it happens so a killed run keeps
/// its trajectory.
pub struct TrajectoryWriter {
    file: Mutex<std::io::BufWriter<std::fs::File>>,
    redactor: Redactor,
}

impl TrajectoryWriter {
    pub fn create(path: &Path, redactor: Redactor) -> std::io::Result<Self> {
        let file = std::fs::File::create(path)?;
        Ok(TrajectoryWriter {
            file: Mutex::new(std::io::BufWriter::new(file)),
            redactor,
        })
    }
}

impl EventSink for TrajectoryWriter {
    fn emit(&self, event: &Event<'_>) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let mut value = serde_json::to_value(event).unwrap_or_default();
        value["ts"] = serde_json::json!((ts * 1000.0).round() / 1000.0);
        let line = self.redactor.redact(&value.to_string());
        let mut f = lock(&self.file);
        let _ = writeln!(f, "{line}");
        let _ = f.flush();
    }
}

/// Progress on stderr, like the seed's `--- step N: ...` lines, with a spinner while waiting on
/// the model or a command when stderr is a terminal.
pub struct Printer {
    status: StatusLine,
    /// The API key never reaches the terminal either, even echoed in a server's error message.
    redactor: Redactor,
    /// The face prints the model's replies itself (`chat`'s `agent> ...` on stdout): the text
    /// of a turn that ends the request is not said here too.
    replies_shown_elsewhere: bool,
}

impl Printer {
    pub fn new(redactor: Redactor) -> Self {
        Printer {
            status: StatusLine::stderr(),
            redactor,
            replies_shown_elsewhere: false,
        }
    }

    /// For a conversation (`chat`), which prints each reply in full on stdout.
    pub fn for_conversation(redactor: Redactor) -> Self {
        Printer {
            replies_shown_elsewhere: true,
            ..Printer::new(redactor)
        }
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

use crate::output::Escaped;
pub use crate::output::for_terminal;

impl EventSink for Printer {
    fn emit(&self, event: &Event<'_>) {
        use std::fmt::Write as _;
        // Every event ends the wait the spinner was showing; some start the next one.
        self.status.clear();
        let mut out = String::new();
        let mut spin = None;
        match event {
            Event::ImageChosen { image, reason } => {
                let _ = writeln!(out, "agentbox: image {image} ({reason})");
            }
            // Passed checks are quiet; a failed one ends the run with its own error message.
            Event::Preflight { .. } => {}
            Event::Started {
                session,
                model,
                image,
                exec_mode,
                test_commands,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "agentbox: session {session}: {model}; sandbox {image} ({exec_mode})"
                );
                match test_commands.as_slice() {
                    [] => {}
                    [cmd] => {
                        let _ = writeln!(out, "agentbox: test command: {cmd}");
                    }
                    many => {
                        let _ = writeln!(
                            out,
                            "agentbox: test commands (all must pass): {}",
                            many.iter()
                                .map(|c| format!("`{c}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                }
            }
            Event::ModelRequest { step, .. } => spin = Some(format!("step {step}: waiting for the model")),
            Event::ModelResponse {
                step,
                turn,
                estimated_usage,
                ..
            } => {
                let approx = if *estimated_usage { "≈" } else { "=" };
                let _ = writeln!(
                    out,
                    "--- step {step}: stop_reason={} in{approx}{} out{approx}{}",
                    turn.stop,
                    turn.usage.total_input(),
                    turn.usage.output_tokens
                );
                // A reply (no tool call, not cut off) is the conversation's to print.
                let reply = turn.tool_calls().is_empty() && turn.stop != StopReason::MaxTokens;
                let text = if self.replies_shown_elsewhere && reply {
                    String::new()
                } else {
                    turn.text()
                };
                for line in text.lines().filter(|l| !l.trim().is_empty()).take(6) {
                    let _ = writeln!(out, "  {}", one_line(line, 160));
                }
            }
            Event::Retry {
                attempt,
                wait_ms,
                reason,
            } => {
                let _ = writeln!(
                    out,
                    "  (model request failed: {}; retry {attempt} in {:.1}s)",
                    one_line(reason, 120),
                    *wait_ms as f64 / 1000.0
                );
            }
            Event::ToolStarted { call, .. } => {
                // JSON text has no raw newlines; keep its spaces, they can be the point of an edit.
                let _ = writeln!(
                    out,
                    "[{}] {}",
                    call.name,
                    crate::tools::clip(&call.arguments.to_json_text(), 120)
                );
                spin = Some(format!("running {}", call.name));
            }
            Event::ToolFinished {
                content,
                is_error,
                name,
                ..
            } => {
                if *is_error {
                    let _ = writeln!(out, "  ! {}", one_line(content, 160));
                } else if *name == "run_tests" || *name == "bash" {
                    let last = content.lines().last().unwrap_or_default();
                    let _ = writeln!(out, "  → {}", one_line(last, 120));
                }
            }
            Event::Note { message } => {
                let _ = writeln!(out, "agentbox: {message}");
            }
            // Refusals are what the user acts on; allowed connections are in the trajectory
            // and the report.
            Event::Egress { decision, .. } => {
                if !decision.allowed
                    && let Some(reason) = &decision.reason
                {
                    let _ = writeln!(out, "agentbox: egress: {reason}");
                }
            }
            Event::SetupLine { line } => {
                let _ = writeln!(out, "  | {line}");
            }
            // The output was shown line by line as it came.
            Event::SetupOutput { command, status, .. } => {
                let _ = writeln!(out, "agentbox: setup: `{}`: {status}", one_line(command, 120));
            }
            Event::Verifying { command } => {
                let _ = writeln!(out, "agentbox: verifying: running `{command}` in the sandbox");
                spin = Some("running the tests".into());
            }
            Event::Candidate { candidate: c } => {
                let _ = writeln!(out, "agentbox: {}", c.line(crate::report::LineStyle::Plain));
                if c.verdict != crate::report::CandidateVerdict::Passed
                    && let Some(line) = c.detail.lines().rev().find(|l| !l.trim().is_empty())
                {
                    let _ = writeln!(out, "  → {}", one_line(line, 160));
                }
            }
            Event::Finished { .. } => {}
        }
        self.status.print(&for_terminal(&self.redactor.redact(&out)));
        if let Some(label) = spin {
            self.status.spin(&for_terminal(&self.redactor.redact(&label)));
        }
    }
}

/// The one owner of stderr's last line: a spinner or a progress line drawn by `indicatif`
/// when stderr is a terminal, with every other line printed above it through [`StatusLine::print`]
/// so the two never tear each other. When stderr is not a terminal nothing but those plain
/// lines is written (logs and tests read them).
#[derive(Clone)]
pub struct StatusLine {
    inner: Arc<StatusInner>,
}

struct StatusInner {
    /// Whether anything but plain lines may be drawn.
    live: bool,
    shown: Mutex<Option<(Shown, ProgressBar)>>,
    plain: Mutex<Box<dyn Write + Send>>,
}

#[derive(Clone, Copy, PartialEq)]
enum Shown {
    Spinner,
    Text,
}

/// Locks that only guard output: a panic elsewhere while one was held leaves nothing to
/// repair, so the poison is ignored rather than spreading the panic to the terminal.
fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StatusLine {
    /// Drawn on stderr when it is a terminal; plain lines only otherwise.
    pub fn stderr() -> Self {
        StatusLine::new(
            crate::output::stderr_is_terminal(),
            Box::new(crate::output::EscapedStderr),
        )
    }

    fn new(live: bool, plain: Box<dyn Write + Send>) -> Self {
        StatusLine {
            inner: Arc::new(StatusInner {
                live,
                shown: Mutex::new(None),
                plain: Mutex::new(plain),
            }),
        }
    }

    /// Whether a status line is drawn at all (stderr is a terminal).
    pub fn is_live(&self) -> bool {
        self.inner.live
    }

    /// Print `text` (whole lines) above the status line, which is drawn again below it.
    pub fn print(&self, text: &Escaped) {
        let text = text.as_str();
        if text.is_empty() {
            return;
        }
        let write = || {
            let mut out = lock(&self.inner.plain);
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        };
        match lock(&self.inner.shown).as_ref() {
            Some((_, bar)) => bar.suspend(write),
            None => write(),
        }
    }

    /// A spinner with `label` and the seconds since this call, until [`StatusLine::clear`].
    pub fn spin(&self, label: &Escaped) {
        if !self.inner.live {
            return;
        }
        const FRAMES: [&str; 11] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏", " "];
        let style = ProgressStyle::with_template("{spinner} {msg} ({secs}s)")
            .unwrap_or_else(|_| ProgressStyle::default_spinner())
            .with_key("secs", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{}", s.elapsed().as_secs());
            })
            .tick_strings(&FRAMES);
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_style(style)
            .with_message(label.as_str().to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        self.replace(Some((Shown::Spinner, bar)));
    }

    /// `text` as the status line, as it is, until the next call or [`StatusLine::clear`].
    pub fn show(&self, text: &Escaped) {
        let text = text.as_str();
        if !self.inner.live {
            return;
        }
        let mut shown = lock(&self.inner.shown);
        if let Some((Shown::Text, bar)) = shown.as_ref() {
            bar.set_message(text.to_string());
            return;
        }
        let style =
            ProgressStyle::with_template("{wide_msg}").unwrap_or_else(|_| ProgressStyle::default_spinner());
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_style(style)
            .with_message(text.to_string());
        bar.tick();
        if let Some((_, old)) = shown.replace((Shown::Text, bar)) {
            old.finish_and_clear();
        }
    }

    /// Remove the status line.
    pub fn clear(&self) {
        self.replace(None);
    }

    fn replace(&self, next: Option<(Shown, ProgressBar)>) {
        let old = std::mem::replace(&mut *lock(&self.inner.shown), next);
        if let Some((_, bar)) = old {
            bar.finish_and_clear();
        }
    }
}

impl Drop for StatusInner {
    /// The last handle gone (a finished or interrupted command): take the line away with it.
    fn drop(&mut self) {
        if let Some((_, bar)) = lock(&self.shown).take() {
            bar.finish_and_clear();
        }
    }
}

/// A trajectory line read back, as the eval report shows it: the owned mirror of the
/// [`Event`]s it shows, with the same tag and field names. Everything else is `Other`.
/// `tests::recorded_events_read_back_what_the_writer_wrote` writes real events and reads them
/// back, so a field or variant misspelt here fails there rather than vanishing from reports.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Recorded {
    ModelResponse {
        step: u32,
        turn: RecordedTurn,
        elapsed_ms: u64,
        estimated_usage: bool,
    },
    ToolStarted {
        step: u32,
        call: ToolCall,
    },
    ToolFinished {
        step: u32,
        call_id: String,
        name: String,
        content: String,
        is_error: bool,
        elapsed_ms: u64,
    },
    Verifying {
        command: String,
    },
    /// The events the report does not show (and any a later version adds).
    #[serde(other)]
    Other,
}

/// [`Turn`] read back (the model layer's `Turn` is written, never read).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RecordedTurn {
    pub content: Vec<Block>,
    pub stop: StopReason,
    pub usage: Usage,
}

/// The events of one trajectory file.
#[derive(Debug, Default)]
pub struct Trajectory {
    pub events: Vec<Recorded>,
    /// Lines that are not an event this version can read: the last line of a killed run, or
    /// a file written by another version.
    pub unreadable: usize,
}

impl Trajectory {
    pub fn read(path: &Path) -> std::io::Result<Trajectory> {
        let text = std::fs::read_to_string(path)?;
        let mut t = Trajectory::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Recorded>(line) {
                Ok(e) => t.events.push(e),
                Err(_) => t.unreadable += 1,
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_replaces_every_occurrence_of_long_secrets() {
        let r = Redactor::new(["sk-ant-1234567890".to_string(), "short".to_string()]);
        assert_eq!(
            r.redact("key sk-ant-1234567890 and sk-ant-1234567890, short"),
            "key [REDACTED] and [REDACTED], short"
        );
    }

    #[test]
    fn trajectory_lines_are_json_with_timestamps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let w = TrajectoryWriter::create(&path, Redactor::new(["secret-value-123".to_string()])).unwrap();
        w.emit(&Event::Note {
            message: "has secret-value-123 inside".into(),
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["event"], "note");
        assert_eq!(v["message"], "has [REDACTED] inside");
        assert!(v["ts"].as_f64().unwrap() > 1.0e9);
    }

    #[test]
    fn recorded_events_read_back_what_the_writer_wrote() {
        use crate::model::{Role, ToolArgs};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let w = TrajectoryWriter::create(&path, Redactor::default()).unwrap();
        let call = ToolCall {
            id: "c1".into(),
            name: "edit_file".into(),
            arguments: ToolArgs::Json(serde_json::json!({"path": "a.py", "new": "x = 1\n"})),
        };
        let turn = Turn {
            content: vec![
                Block::Text {
                    text: "I will edit a.py".into(),
                },
                Block::ToolCall(call.clone()),
            ],
            stop: StopReason::ToolUse,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 2,
                cache_write_tokens: 1,
            },
        };
        let request = Request {
            system: "s".into(),
            messages: vec![crate::model::Message {
                role: Role::User,
                content: vec![Block::Text { text: "fix".into() }],
            }],
            tools: vec![],
            tool_choice: Default::default(),
            temperature: None,
            max_tokens: 100,
        };
        w.emit(&Event::Started {
            session: "s1".into(),
            model: "m".into(),
            project: "/p".into(),
            image: "i".into(),
            exec_mode: "executor".into(),
            tools: vec!["bash".into()],
            test_commands: vec!["pytest".into()],
        });
        w.emit(&Event::ModelRequest {
            step: 1,
            request: &request,
        });
        w.emit(&Event::ModelResponse {
            step: 1,
            turn: &turn,
            elapsed_ms: 7,
            estimated_usage: true,
        });
        w.emit(&Event::ToolStarted { step: 1, call: &call });
        w.emit(&Event::ToolFinished {
            step: 1,
            call_id: "c1",
            name: "edit_file",
            content: "edited a.py",
            is_error: true,
            elapsed_ms: 3,
        });
        w.emit(&Event::Note {
            message: "tests: passed".into(),
        });
        w.emit(&Event::Verifying {
            command: "pytest -q".into(),
        });
        drop(w);
        // A run killed mid-line leaves half an event behind.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"event\":\"tool_fini");
        std::fs::write(&path, text).unwrap();

        let t = Trajectory::read(&path).unwrap();
        assert_eq!(
            t.events,
            vec![
                Recorded::Other,
                Recorded::Other,
                Recorded::ModelResponse {
                    step: 1,
                    turn: RecordedTurn {
                        content: turn.content.clone(),
                        stop: StopReason::ToolUse,
                        usage: turn.usage,
                    },
                    elapsed_ms: 7,
                    estimated_usage: true,
                },
                Recorded::ToolStarted { step: 1, call },
                Recorded::ToolFinished {
                    step: 1,
                    call_id: "c1".into(),
                    name: "edit_file".into(),
                    content: "edited a.py".into(),
                    is_error: true,
                    elapsed_ms: 3,
                },
                Recorded::Other,
                Recorded::Verifying {
                    command: "pytest -q".into()
                },
            ]
        );
        assert_eq!(t.unreadable, 1);
    }

    /// A shared buffer standing in for stderr.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn without_a_terminal_the_status_line_writes_plain_lines_only() {
        let out = Captured::default();
        let status = StatusLine::new(false, Box::new(out.clone()));
        assert!(!status.is_live());
        status.spin(&for_terminal("waiting for the model"));
        status.print(&for_terminal("--- step 1\n"));
        status.show(&for_terminal("[1/2 done]"));
        status.print(&for_terminal(""));
        status.print(&for_terminal("  task fixed\n"));
        status.clear();
        assert_eq!(
            String::from_utf8(out.0.lock().unwrap().clone()).unwrap(),
            "--- step 1\n  task fixed\n"
        );
    }
}
