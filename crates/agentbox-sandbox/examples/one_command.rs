//! Another agent's use of the sandbox, whole: open a sandbox on a directory (read-only here),
//! run a command with a timeout, read a file back, tear down.
//!
//!     cargo run -p agentbox-sandbox --example one_command -- DIR [IMAGE]
//!
//! The image must exist (`agentbox image build python` makes the default). What the sandbox
//! prints is the sandbox's: it is shown `{:?}`-quoted, so no escape sequence of its reaches the
//! terminal.
#![allow(
    clippy::disallowed_macros,
    reason = "an example's own output, every sandbox string Debug-quoted"
)]

use std::path::PathBuf;
use std::time::Duration;

use agentbox_sandbox::ScanBounds;
use agentbox_sandbox::{
    Cleanup, DockerSandbox, ExecRequest, Extras, Limits, Sandbox, SandboxSpec, bind_workspace, connect_docker,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| ".".into()));
    let image = args.next().unwrap_or_else(|| "agentbox/python:3".into());
    // Whoever owns the directory runs the commands; the scan refuses a mount that would leak
    // (a hard link out of it, `/`).
    let (workspace, uid, gid) = bind_workspace(&dir, &ScanBounds::default())?;
    // One owner removes whatever is created, also when the process is interrupted.
    let cleanup = Cleanup::default();
    let spec = SandboxSpec {
        session: format!("example-{}", std::process::id()),
        image,
        workspace,
        uid,
        gid,
        limits: Limits::default(),
        runtime: None,
        per_call_exec: false,
        labels: Vec::new(),
        allow_weak_limits: false,
        read_only: true,
        cleanup: cleanup.clone(),
        extras: Extras::default(),
        services: Vec::new(),
    };
    let docker = connect_docker().await?;
    let sandbox = DockerSandbox::create(&docker, spec).await?;
    let result = async {
        let out = sandbox
            .exec(ExecRequest::argv(
                [
                    "sh",
                    "-c",
                    "ls -la /workspace; ip -brief link 2>/dev/null || cat /proc/net/dev",
                ],
                Duration::from_secs(10),
            ))
            .await?;
        println!("exit {}: {:?}", out.exit_code, out.stdout.to_text());
        let tar = sandbox.get_archive("/etc/hostname", 64 * 1024).await?;
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries()? {
            let mut entry = entry?;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text)?;
            println!("{:?}: {:?}", entry.path()?, text);
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    // The container goes whatever happened above.
    sandbox.shutdown().await?;
    cleanup.run().await;
    result
}
