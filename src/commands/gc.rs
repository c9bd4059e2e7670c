//! `agentbox gc`

use crate::cli::GcArgs;
use crate::sandbox::{connect_docker, gc};

pub async fn run(args: GcArgs) -> anyhow::Result<u8> {
    let docker = connect_docker().await?;
    if args.caches {
        // A project's caches are named for its canonical path (see `project::setup::project_key`).
        let prefix = args
            .project
            .as_deref()
            .map(|p| format!("agentbox-cache-{}-", crate::project::setup::project_key(p)));
        return caches(&docker, prefix.as_deref()).await;
    }
    let report = gc::collect(&docker, args.all, false).await?;
    for c in &report.containers_removed {
        outln!("removed container {}", crate::output::escaped(c));
    }
    for v in &report.volumes_removed {
        outln!("removed volume {}", crate::output::escaped(v));
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

/// `gc --caches`: list the dependency caches (those whose names start with `prefix`, if given)
/// and remove each that no run is using.
async fn caches(docker: &bollard::Docker, prefix: Option<&str>) -> anyhow::Result<u8> {
    let mut all = crate::sandbox::caches::list(docker).await?;
    all.retain(|(name, _)| prefix.is_none_or(|p| name.starts_with(p)));
    if all.is_empty() {
        outln!("no dependency caches");
    }
    for (name, project) in all {
        if crate::sandbox::caches::remove(docker, &name).await {
            outln!(
                "removed cache {} (project {})",
                crate::output::escaped(&name),
                crate::output::escaped(&project)
            );
        } else {
            outln!(
                "kept cache {} (project {}): in use",
                crate::output::escaped(&name),
                crate::output::escaped(&project)
            );
        }
    }
    Ok(0)
}
