//! `agentbox gc`

use crate::cli::GcArgs;
use crate::sandbox::{connect_docker, gc};

pub async fn run(args: GcArgs) -> anyhow::Result<u8> {
    let docker = connect_docker().await?;
    let report = gc::collect(&docker, args.all, false).await?;
    for c in &report.containers_removed {
        println!("removed container {c}");
    }
    for v in &report.volumes_removed {
        println!("removed volume {v}");
    }
    if report.containers_removed.is_empty() && report.volumes_removed.is_empty() {
        println!("nothing to remove");
    }
    if report.in_use > 0 {
        println!(
            "kept {} in use by running agentbox processes (--all removes them too)",
            report.in_use
        );
    }
    Ok(0)
}
