//! The host's side of a sandbox: what agentbox does on the host with the project before a
//! sandbox gets it and with what the sandbox left behind. Every byte a sandbox could have
//! written is hostile here: names may hold any byte, links may lead anywhere, a "file" may be a
//! FIFO, sizes may be huge. So nothing here follows a link the sandbox could have made, opens
//! anything but a regular file, reads without a bound, or changes the project except by
//! `rename(2)`.
//!
//! - [`hostscan`]: the scans of a bind-mounted project before and after a session (hard links
//!   leading outside, git metadata whose hooks or config would run on the host, what changed),
//!   and the quarantine of what should not stay.
//! - [`isolate`]: `--isolate`'s copy in (a manifest of the project) and read-back (an archive
//!   from the sandbox, bounded in bytes, entries and time), the patch and `--apply`.
//! - [`gitquote`]: every path shown the way git quotes it, so no name can forge a line.
//!
//! Nothing here talks to a container engine: the sandbox crate (`agentbox-sandbox`) does, and
//! hands the bytes here. So it is tested without Docker, and fuzzed (agentbox's `fuzz/`).

pub mod gitquote;
pub mod hostscan;
pub mod isolate;

/// A byte count as people read it: "512 bytes", "1.5 MiB".
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    format!("{value:.1} {unit}")
}
