//! `agentbox gc`

use crate::cli::GcArgs;
use crate::sandbox::{connect_docker, gc};

pub async fn run(args: GcArgs) -> anyhow::Result<u8> {
    let docker = connect_docker().await?;
    let report = gc::collect(&docker, args.all, false).await?;
    for c in &report.containers_removed {
        outln!("removed container {c}");
    }
    for v in &report.volumes_removed {
        outln!("removed volume {v}");
    }
    if report.containers_removed.is_empty() && report.volumes_removed.is_empty() {
        outln!("nothing to remove");
    }
    if report.in_use > 0 {
        outln!(
            "kept {} in use by running agentbox processes (--all removes them too)",
            report.in_use
        );
    }
    Ok(0)
}
