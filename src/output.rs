//! What reaches the user's terminal, and printing that never panics.
//!
//! Text from the sandbox, the repository, the model, an image or the network can carry escape
//! sequences that set the window title, clear the screen, rewrite what the user reads (a diff
//! under review, an approval prompt) or write the clipboard (OSC 52). It reaches the terminal
//! only as [`Escaped`]: every control character but `\n` and `\t` (and the bidirectional
//! overrides that reorder what is shown) written visibly as `\x1b`, `\u{202e}` and so on.
//!
//! The printing macros (`outln!`, `errln!`, `out!`, `err!`) and [`escaped!`] take a format
//! literal — agentbox's own text — and arguments that are [`Safe`]: an [`Escaped`], a number, a
//! `bool` or a `&'static str` (agentbox's own literal). A `String`, a path, an error or a
//! borrowed `&str` does not compile until it is escaped (`escaped(&e)`); a name captured inside
//! the literal (`"{warning}"`) does not compile either, since it would bypass the check.
//! `tests/it/terminal_compile.rs` proves both. Direct `std::io::stdout()`/`stderr()` and
//! `println!`-style macros are refused by clippy (`clippy.toml`) outside the few places that
//! hand the sandbox a terminal on purpose (`shell`, `exec -it`).
//!
//! `println!` also panics when stdout is a pipe whose reader has gone (`agentbox demo | head`),
//! which would turn a finished run into exit 101; a reader that stops reading is not our error,
//! so these write and ignore the failure. The run goes on, cleans up and exits with its own
//! status.

use std::fmt;

/// Text made safe for a terminal: no escape sequence survives in it. The only ways in are
/// [`Escaped::new`]/[`escaped`] (which escape) and [`escaped!`] (agentbox's literal with
/// arguments that are already [`Safe`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Escaped(String);

impl Escaped {
    /// `text` with every control character but `\n`/`\t` shown visibly.
    pub fn new(text: &str) -> Escaped {
        let mut out = String::with_capacity(text.len());
        push_escaped(&mut out, text);
        Escaped(out)
    }

    /// Built by [`escaped!`] from a checked literal and [`Safe`] arguments; not for other use.
    #[doc(hidden)]
    pub fn __from_checked(text: String) -> Escaped {
        Escaped(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Append more text that is already safe.
    pub fn push(&mut self, more: &Escaped) {
        self.0.push_str(&more.0);
    }

    /// JSON for the terminal: serde escapes C0 controls inside strings but writes C1 controls
    /// (U+0080–U+009F, which some terminals read as CSI/OSC) and bidirectional overrides as
    /// they are; here they become `\u` escapes, which keeps the JSON valid (they can only occur
    /// inside strings).
    pub fn json(json: &str) -> Escaped {
        let mut out = String::with_capacity(json.len());
        for c in json.chars() {
            if c.is_control() && !matches!(c, '\n' | '\t') || is_reordering(c) {
                out.push_str(&format!("\\u{:04x}", c as u32));
            } else {
                out.push(c);
            }
        }
        Escaped(out)
    }
}

/// Anything displayable, formatted and then escaped: an error, a path, a command's output.
pub fn escaped(x: impl fmt::Display) -> Escaped {
    Escaped::new(&x.to_string())
}

/// The same, for text at hand.
pub fn for_terminal(s: &str) -> Escaped {
    Escaped::new(s)
}

fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        if c.is_control() && !matches!(c, '\n' | '\t') {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else if is_reordering(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
}

/// The bidirectional controls that make a terminal show text in another order than it is
/// (the "Trojan Source" characters): a diff could show one line and apply another.
fn is_reordering(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Display for Escaped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad` keeps width and alignment (`{:<20}`) working.
        f.pad(&self.0)
    }
}

impl AsRef<str> for Escaped {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Bytes of a stream (a command's output) escaped as they come: a character split between two
/// chunks is held until its end arrives, so it is neither torn nor mistaken for garbage.
#[derive(Default)]
pub struct EscapeStream {
    pending: Vec<u8>,
}

impl EscapeStream {
    pub fn push(&mut self, bytes: &[u8]) -> Escaped {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    push_escaped(&mut out, s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    if let Ok(good) = std::str::from_utf8(good) {
                        push_escaped(&mut out, good);
                    }
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &bad[n..];
                        }
                        // An incomplete character at the end: wait for the next chunk.
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        Escaped(out)
    }

    /// What is left at the end of the stream (an incomplete character).
    pub fn finish(&mut self) -> Escaped {
        let rest = std::mem::take(&mut self.pending);
        if rest.is_empty() {
            Escaped::default()
        } else {
            Escaped::new(&String::from_utf8_lossy(&rest))
        }
    }
}

/// What may be an argument of the printing macros: text that cannot carry an escape sequence.
#[diagnostic::on_unimplemented(
    message = "`{Self}` may carry text from the sandbox, the repository, the model or the network",
    label = "not known to be safe for the terminal",
    note = "escape it first: `agentbox::output::escaped(&x)` (or `for_terminal(&s)`); only `Escaped`, numbers, `bool` and `&'static str` literals are printed as they are"
)]
pub trait Safe: fmt::Display {}

impl Safe for Escaped {}
impl<T: Safe + ?Sized> Safe for &T {}
/// agentbox's own literals (and constants): nothing read at run time is `'static` without a
/// deliberate leak.
impl Safe for &'static str {}

macro_rules! safe_numbers {
    ($($t:ty),*) => { $(impl Safe for $t {})* };
}
safe_numbers!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64, bool
);

/// The identity, only for the types that are [`Safe`]: the macros pass every argument through it.
#[doc(hidden)]
pub fn __safe<T: Safe>(x: &T) -> &T {
    x
}

/// Refuses, at compile time, a format literal that names its arguments (`"{warning}"`,
/// `"{:width$}"`): a captured name is not passed through [`Safe`]'s check.
#[doc(hidden)]
pub const fn __check_format(fmt: &str) {
    let b = fmt.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' {
            if i + 1 < b.len() && b[i + 1] == b'{' {
                i += 2;
                continue;
            }
            i += 1;
            while i < b.len() && b[i] != b'}' && b[i] != b':' {
                if !b[i].is_ascii_digit() {
                    panic!(
                        "a name inside the format literal is not checked for the terminal: pass it as a positional argument, escaped if it is text"
                    );
                }
                i += 1;
            }
            if i < b.len() && b[i] == b':' {
                let spec = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'}' {
                    if b[i] == b'$' {
                        let mut j = i;
                        while j > spec && (b[j - 1].is_ascii_alphanumeric() || b[j - 1] == b'_') {
                            if !b[j - 1].is_ascii_digit() {
                                panic!(
                                    "a named width or precision (`name$`) is not checked: use a positional one (`1$`)"
                                );
                            }
                            j -= 1;
                        }
                    }
                    i += 1;
                }
            }
        }
        i += 1;
    }
}

/// `format!` for the terminal: agentbox's literal with [`Safe`] arguments, as an [`Escaped`].
#[macro_export]
macro_rules! escaped {
    ($fmt:literal $(, $arg:expr)* $(,)?) => {{
        const _: () = $crate::output::__check_format($fmt);
        $crate::output::Escaped::__from_checked(format!($fmt $(, $crate::output::__safe(&$arg))*))
    }};
}

/// `println!` to stdout, ignoring a closed reader; arguments must be [`Safe`](crate::output::Safe).
#[macro_export]
macro_rules! outln {
    () => { $crate::outln!("") };
    ($fmt:literal $(, $arg:expr)* $(,)?) => {{
        // Formatted first: no lock is held while the arguments are evaluated (or awaited).
        let text = $crate::escaped!($fmt $(, $arg)*);
        $crate::output::__write_out(text, true);
    }};
}

/// `print!` to stdout, ignoring a closed reader; arguments must be [`Safe`](crate::output::Safe).
#[macro_export]
macro_rules! out {
    ($fmt:literal $(, $arg:expr)* $(,)?) => {{
        let text = $crate::escaped!($fmt $(, $arg)*);
        $crate::output::__write_out(text, false);
    }};
}

/// `eprintln!` to stderr, ignoring a closed reader; arguments must be [`Safe`](crate::output::Safe).
#[macro_export]
macro_rules! errln {
    () => { $crate::errln!("") };
    ($fmt:literal $(, $arg:expr)* $(,)?) => {{
        let text = $crate::escaped!($fmt $(, $arg)*);
        $crate::output::__write_err(text, true);
    }};
}

/// `eprint!` to stderr, ignoring a closed reader; arguments must be [`Safe`](crate::output::Safe).
#[macro_export]
macro_rules! err {
    ($fmt:literal $(, $arg:expr)* $(,)?) => {{
        let text = $crate::escaped!($fmt $(, $arg)*);
        $crate::output::__write_err(text, false);
    }};
}

#[doc(hidden)]
#[allow(
    clippy::disallowed_methods,
    reason = "the one writer of escaped text to stdout"
)]
pub fn __write_out(text: Escaped, newline: bool) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_str().as_bytes());
    if newline {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
}

#[doc(hidden)]
#[allow(
    clippy::disallowed_methods,
    reason = "the one writer of escaped text to stderr"
)]
pub fn __write_err(text: Escaped, newline: bool) {
    use std::io::Write as _;
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_str().as_bytes());
    if newline {
        let _ = stderr.write_all(b"\n");
    }
    let _ = stderr.flush();
}

/// Where `exec` writes its command's stdout or stderr: to a terminal escaped as it comes (a
/// test's output cannot set the title, clear the screen or write the clipboard), to a pipe or a
/// file as the bytes are (`exec -- cat image.png > copy.png` stays a copy).
pub struct CommandStream {
    to_stdout: bool,
    escape: Option<EscapeStream>,
}

impl CommandStream {
    pub fn stdout() -> CommandStream {
        CommandStream {
            to_stdout: true,
            escape: crate::terminal::is_tty(crate::terminal::STDOUT).then(EscapeStream::default),
        }
    }

    pub fn stderr() -> CommandStream {
        CommandStream {
            to_stdout: false,
            escape: crate::terminal::is_tty(crate::terminal::STDERR).then(EscapeStream::default),
        }
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "bytes for a pipe or a file, escaped for a terminal"
    )]
    fn write_bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        if self.to_stdout {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes)?;
            out.flush()
        } else {
            std::io::stderr().lock().write_all(bytes)
        }
    }

    /// What an escaped stream still holds (a character cut at the end).
    pub fn finish(&mut self) -> std::io::Result<()> {
        match self.escape.as_mut().map(EscapeStream::finish) {
            Some(rest) if !rest.is_empty() => self.write_bytes(rest.as_str().as_bytes()),
            _ => Ok(()),
        }
    }
}

impl std::io::Write for CommandStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.escape.as_mut() {
            Some(escape) => {
                let shown = escape.push(buf);
                self.write_bytes(shown.as_str().as_bytes())?;
            }
            None => self.write_bytes(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Close stdout for whoever reads it, once a command has written all it will (`exec`, whose
/// teardown follows): fd 1 is pointed at `/dev/null` after a flush, so a pipe's reader sees its
/// end now, not at the process's exit. A failure leaves stdout as it was (it closes at exit).
#[allow(
    clippy::disallowed_methods,
    reason = "flushes what was written; writes nothing"
)]
pub fn end_stdout() {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    let mut stdout = std::io::stdout().lock();
    if stdout.flush().is_err() {
        return;
    }
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    // SAFETY: dup2(2) on a descriptor we own onto fd 1, with stdout's lock held so no write
    // interleaves; fd 1 stays valid (now /dev/null) for anything written later.
    unsafe { libc::dup2(null.as_raw_fd(), crate::terminal::STDOUT) };
}

/// The writer of the debug log (`RUST_LOG`, `-v`): what it logs (a command, a server's reply)
/// is escaped like everything else on stderr (tracing's own sanitizing leaves `\r` and the
/// other C0 controls as they are).
#[derive(Default)]
pub struct LogWriter(EscapeStream);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        __write_err(self.0.push(buf), false);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        let rest = self.0.finish();
        if !rest.is_empty() {
            __write_err(rest, false);
        }
    }
}

/// The terminal handed to the sandbox on purpose (`shell`, `exec -it`): an interactive session
/// whose programs draw the screen themselves, so their bytes go through as they are — what
/// runs there can send the terminal escape sequences, as over ssh (the book: docs/src/security/index.md).
#[allow(clippy::disallowed_methods, reason = "the sandbox's own terminal session")]
pub fn terminal_for_the_sandbox() -> std::io::Stdout {
    std::io::stdout()
}

/// stderr held for a question and its answer: while it lives nothing else (a spinner's redraw,
/// another line) writes between the question and what the user types.
pub struct StderrHeld(std::io::StderrLock<'static>);

impl StderrHeld {
    #[allow(clippy::disallowed_methods, reason = "writes only Escaped text")]
    pub fn lock() -> StderrHeld {
        StderrHeld(std::io::stderr().lock())
    }

    pub fn write(&mut self, text: &Escaped) {
        use std::io::Write as _;
        let _ = self.0.write_all(text.as_str().as_bytes());
        let _ = self.0.flush();
    }
}

/// Whether stderr is a terminal (progress is drawn only then).
#[allow(clippy::disallowed_methods, reason = "only asks; writes nothing")]
pub fn stderr_is_terminal() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal()
}

/// Escaped text written to stderr, for [`crate::events::StatusLine`], which takes only
/// [`Escaped`] lines.
pub struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    #[allow(
        clippy::disallowed_methods,
        reason = "StatusLine writes only Escaped text through it"
    )]
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().lock().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Print an image build's or pull's progress line to stderr.
pub fn stderr_progress(line: &str) {
    errln!("  {}", escaped(line));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_text_cannot_carry_escape_sequences() {
        assert_eq!(
            for_terminal("ok\x1b[2Kgone\r\u{9b}31m\tline\n").as_str(),
            "ok\\x1b[2Kgone\\x0d\\x9b31m\tline\n"
        );
        assert_eq!(for_terminal("plain – text ✓").as_str(), "plain – text ✓");
        assert_eq!(for_terminal("a\u{202e}b\u{7f}").as_str(), "a\\u{202e}b\\x7f");
    }

    #[test]
    fn the_macros_keep_agentbox_text_and_escape_the_rest() {
        let hostile = "x\x1b]0;T\x07";
        let e = escaped!("{} of {} = {:>4}: {}", 2, 3usize, "ok", escaped(hostile));
        assert_eq!(e.as_str(), "2 of 3 =   ok: x\\x1b]0;T\\x07");
        assert_eq!(
            escaped!("{{literal}} {0} {0}", true).as_str(),
            "{literal} true true"
        );
    }

    #[test]
    fn json_stays_json_without_c1_controls() {
        let v = serde_json::json!({"text": "a\u{9b}31m\x1b\u{202e}"});
        let shown = Escaped::json(&v.to_string());
        assert!(!shown.as_str().contains('\u{9b}') && !shown.as_str().contains('\u{1b}'));
        let back: serde_json::Value = serde_json::from_str(shown.as_str()).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn a_stream_split_inside_a_character_is_escaped_whole() {
        let text = "é\u{9b}2J✓\x1b";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut s = EscapeStream::default();
            let mut out = s.push(&bytes[..cut]);
            out.push(&s.push(&bytes[cut..]));
            out.push(&s.finish());
            assert_eq!(out.as_str(), "é\\x9b2J✓\\x1b", "cut at {cut}");
        }
        let mut s = EscapeStream::default();
        let mut out = s.push(b"a\xffb\xe2\x9c");
        out.push(&s.finish());
        assert_eq!(out.as_str(), "a\u{fffd}b\u{fffd}");
    }

    #[test]
    fn names_inside_the_literal_are_refused() {
        let refused = |f: &'static str| std::panic::catch_unwind(|| __check_format(f)).is_err();
        assert!(refused("{warning}"));
        assert!(refused("{:width$}"));
        assert!(refused("{0:.prec$}"));
        assert!(!refused("{} {0} {:>5} {:1$} {{x}} {:?} {:$>3}"));
    }
}
