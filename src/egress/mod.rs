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
