//! The egress proxy: a host-side HTTP proxy that lets the setup phase (and, if asked, the
//! agent phase) reach the hosts of an allowlist and nothing else. The sandbox keeps
//! `network_mode: none`; it reaches the proxy through a Unix socket (see [`transport`]).
//!
//! It imports nothing from the rest of the crate, like `sandbox` and `model`.

pub(crate) mod http;
pub mod matcher;
pub mod proxy;
pub mod resolve;
pub(crate) mod tls;

pub use matcher::{Allowlist, Rule, RuleError};
pub use proxy::{Decision, Limits, Observer, Policy, Proxy, Refusal};
pub use resolve::{PinnedResolver, Resolve, StaticResolver, SystemResolver};

/// The port the executor listens on inside the sandbox (its own loopback) and forwards to the
/// proxy's socket.
pub const SANDBOX_PORT: u16 = 3128;

/// How a sandbox reaches the proxy: the sandbox's forwarder (`sandbox::Forward::egress`), from
/// its own loopback to the proxy's Unix socket, bind-mounted read-only. Engines that cannot
/// bind-mount this machine's files (remote ones) need another transport, which replaces this
/// answer.
pub mod transport {
    use std::path::Path;

    /// The host path the sandbox mounts (at `sandbox::EGRESS_SOCKET`, read-only).
    pub fn mount_source(proxy: &super::Proxy) -> &Path {
        proxy.socket_path()
    }
}

/// A proxy with the host's resolver and addresses.
pub fn start(allowlist: Allowlist, limits: Limits, observer: Option<Observer>) -> std::io::Result<Proxy> {
    let policy = Policy {
        allowlist,
        resolver: std::sync::Arc::new(SystemResolver),
        own: resolve::own_addresses(),
    };
    Proxy::start(policy, limits, observer)
}

/// The refusals among `decisions`, each said once in the order first seen, with how many times
/// it happened when more than once: a tool that retries (pip tries five times) is refused
/// the same way each time, and the user needs the one line that says which host to allow.
pub fn refusals(decisions: &[Decision]) -> Vec<String> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for reason in decisions
        .iter()
        .filter(|d| !d.allowed)
        .filter_map(|d| d.reason.as_deref())
    {
        match seen.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => seen.push((reason, 1)),
        }
    }
    seen.into_iter()
        .map(|(reason, n)| match n {
            1 => reason.to_string(),
            n => format!("{reason} ({n} times)"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(host: &str, allowed: bool, reason: Option<&str>) -> Decision {
        Decision {
            host: host.into(),
            port: 443,
            allowed,
            method: "CONNECT".into(),
            reason: reason.map(String::from),
            address: None,
            bytes_up: 0,
            bytes_down: 0,
        }
    }

    #[test]
    fn a_refusal_repeated_by_retries_is_said_once_with_its_count() {
        let a = "blocked a.example:443 — not in the allowlist; allow it with --allow-host a.example";
        let b = "blocked b.example:443 — it does not resolve (no such host)";
        let decisions = [
            decision("a.example", false, Some(a)),
            decision("pypi.org", true, None),
            decision("a.example", false, Some(a)),
            decision("b.example", false, Some(b)),
            decision("a.example", false, Some(a)),
            decision("a.example", false, Some(a)),
        ];
        assert_eq!(refusals(&decisions), [format!("{a} (4 times)"), b.to_string()]);
        assert!(refusals(&decisions[1..2]).is_empty());
    }
}
