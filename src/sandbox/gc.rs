//! `agentbox gc`: remove what a killed agentbox process left behind.
//!
//! Normally nothing is left: containers are removed on every exit path, and a container whose
//! agentbox process died stops and is auto-removed when its keep-alive sees EOF. This is for
//! what remains when the daemon itself was interrupted, or for volumes of `--isolate` runs.

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveVolumeOptionsBuilder,
};

use super::{HOST_LABEL, PID_LABEL, SESSION_LABEL, SandboxError};

#[derive(Debug, Default)]
pub struct GcReport {
    pub containers_removed: Vec<String>,
    pub volumes_removed: Vec<String>,
    /// Still owned by a running agentbox process (kept unless `all`).
    pub in_use: usize,
}

/// Is the agentbox process that labelled a resource still alive? A resource from another host
/// (a shared remote daemon) counts as alive: we cannot know, and it is not ours to remove.
fn owner_alive(labels: &HashMap<String, String>) -> bool {
    if labels.get(HOST_LABEL).is_some_and(|h| *h != hostname()) {
        return true;
    }
    match labels.get(PID_LABEL).and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => std::path::Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

/// This machine's name, for the host label.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Remove (or with `dry_run`, only list) labelled resources whose agentbox process is gone.
pub async fn collect(docker: &Docker, all: bool, dry_run: bool) -> Result<GcReport, SandboxError> {
    let mut report = GcReport::default();
    let filters = HashMap::from([("label".to_string(), vec![SESSION_LABEL.to_string()])]);
    let containers = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| SandboxError::Docker {
            context: "list containers".into(),
            source: e,
        })?;
    for c in containers {
        let labels = c.labels.unwrap_or_default();
        if !all && owner_alive(&labels) {
            report.in_use += 1;
            continue;
        }
        let Some(id) = c.id else { continue };
        if dry_run {
            report.containers_removed.push(id);
            continue;
        }
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match docker.remove_container(&id, Some(opts)).await {
            Ok(()) => report.containers_removed.push(id[..12.min(id.len())].to_string()),
            Err(e) if matches!(super::docker::status_of(&e), Some(404 | 409)) => {}
            Err(e) => {
                return Err(SandboxError::Docker {
                    context: format!("remove container {id}"),
                    source: e,
                });
            }
        }
    }
    let volumes = docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .map_err(|e| SandboxError::Docker {
            context: "list volumes".into(),
            source: e,
        })?;
    for v in volumes.volumes.unwrap_or_default() {
        if !all && owner_alive(&v.labels) {
            report.in_use += 1;
            continue;
        }
        if dry_run {
            report.volumes_removed.push(v.name);
            continue;
        }
        match docker
            .remove_volume(
                &v.name,
                Some(RemoveVolumeOptionsBuilder::default().force(true).build()),
            )
            .await
        {
            Ok(()) => report.volumes_removed.push(v.name),
            Err(e) if matches!(super::docker::status_of(&e), Some(404 | 409)) => {}
            Err(e) => {
                return Err(SandboxError::Docker {
                    context: format!("remove volume {}", v.name),
                    source: e,
                });
            }
        }
    }
    Ok(report)
}

/// Remove every container and volume labelled with this process's pid and host.
pub async fn remove_owned_by_this_process(docker: &Docker) -> Result<(), SandboxError> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            format!("{PID_LABEL}={}", std::process::id()),
            format!("{HOST_LABEL}={}", hostname()),
        ],
    )]);
    let containers = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| SandboxError::Docker {
            context: "list containers".into(),
            source: e,
        })?;
    for c in containers {
        if let Some(id) = c.id {
            let opts = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            let _ = docker.remove_container(&id, Some(opts)).await;
        }
    }
    let volumes = docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .map_err(|e| SandboxError::Docker {
            context: "list volumes".into(),
            source: e,
        })?;
    for v in volumes.volumes.unwrap_or_default() {
        let _ = docker
            .remove_volume(
                &v.name,
                Some(RemoveVolumeOptionsBuilder::default().force(true).build()),
            )
            .await;
    }
    Ok(())
}
