//! `--publish [HOST_PORT:]PORT` for `shell`, `run`, `chat`, `exec` and `mcp`: the host's side
//! of each published port (`sandbox::publish`), listening before the sandbox starts (its
//! socket is mounted into it) and closed when the command's session ends.

use crate::cli::PublishArgs;
use crate::config::UsageError;
use crate::output::escaped;
use crate::sandbox::publish::{PublishSpec, Publisher};
use crate::sandbox::{ExecMode, Forward, Sandbox};

/// The published ports of one session; dropping it closes them.
#[derive(Default)]
pub struct Published {
    publishers: Vec<Publisher>,
}

/// How long the sandbox's side of the ports may take to connect (the executor does it as it
/// starts).
const READY: std::time::Duration = std::time::Duration::from_secs(10);

impl Published {
    /// Parse every `--publish` and listen on each host port; nothing listens if one fails.
    pub fn start(args: &PublishArgs) -> Result<Published, UsageError> {
        let mut specs: Vec<PublishSpec> = Vec::new();
        for value in &args.publish {
            let mut spec = PublishSpec::parse(value).map_err(|e| UsageError(e.0))?;
            if let Some(address) = args.unsafe_publish_address {
                spec.address = address;
            }
            if specs.iter().any(|s| s.port == spec.port) {
                return Err(UsageError(format!(
                    "--publish {value}: sandbox port {} is published twice",
                    spec.port
                )));
            }
            specs.push(spec);
        }
        if let Some(address) = args.unsafe_publish_address
            && !address.is_loopback()
        {
            errln!(
                "agentbox: WARNING: --unsafe-publish-address {}: the published ports listen beyond this machine's loopback; anyone who can reach {} reaches the sandbox's servers, which the sandbox (a model, a hostile repository) controls",
                escaped(address),
                escaped(address)
            );
        }
        let mut publishers = Vec::new();
        for spec in specs {
            let publisher = Publisher::start(spec).map_err(|e| {
                UsageError(format!(
                    "--publish: cannot listen on {}: {}",
                    std::net::SocketAddr::new(spec.address, spec.host_port),
                    e
                ))
            })?;
            publishers.push(publisher);
        }
        Ok(Published { publishers })
    }

    pub fn is_empty(&self) -> bool {
        self.publishers.is_empty()
    }

    /// The sandbox's side of every published port.
    pub fn forwards(&self) -> Vec<Forward> {
        self.publishers.iter().map(Publisher::forward).collect()
    }

    /// Refuse a sandbox that cannot forward (no command runner: an image without python3, or
    /// `--per-call-exec`); otherwise wait for each port's sandbox side to connect, and print
    /// its line (before a shell takes the terminal, so said in order).
    pub async fn announce(&self, sandbox: &dyn Sandbox) -> Result<(), UsageError> {
        if self.publishers.is_empty() {
            return Ok(());
        }
        if sandbox.info().exec_mode != ExecMode::Persistent {
            return Err(UsageError(
                "--publish needs the sandbox's command runner, which forwards the ports: an image with \
                 python3, without --per-call-exec"
                    .into(),
            ));
        }
        let deadline = tokio::time::Instant::now() + READY;
        for p in &self.publishers {
            let port = p.spec().port;
            if tokio::time::timeout_at(deadline, p.ready()).await.is_ok() {
                errln!("agentbox: http://{} -> sandbox:{}", escaped(p.local_addr()), port);
            } else {
                errln!(
                    "agentbox: WARNING: the sandbox did not connect its side of --publish for port {} within {}s; {} answers nothing until it does",
                    port,
                    READY.as_secs(),
                    escaped(p.local_addr())
                );
            }
        }
        Ok(())
    }
}
