//! Printing that never panics. `println!` panics when stdout is a pipe whose reader has gone
//! (`agentbox demo | head`), which would turn a finished run into exit 101; a reader that stops
//! reading is not our error, so these write and ignore the failure. The run goes on, cleans up
//! and exits with its own status.

/// `println!` to stdout, ignoring a closed reader.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // Formatted first: no lock is held while the arguments are evaluated (or awaited).
        let text = format!($($arg)*);
        let _ = writeln!(std::io::stdout().lock(), "{text}");
    }};
}

/// `print!` to stdout, ignoring a closed reader.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }};
}

/// `eprintln!` to stderr, ignoring a closed reader.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }};
}

/// `eprint!` to stderr, ignoring a closed reader.
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }};
}
