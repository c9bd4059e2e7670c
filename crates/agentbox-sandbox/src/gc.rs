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
    sweep(
        docker,
        vec![SESSION_LABEL.to_string()],
        &|labels| !all && owner_alive(labels),
        dry_run,
    )
    .await
}

/// Remove the containers labelled `label` whose agentbox process is gone: services
/// (`--service`), which, unlike a sandbox, do not end with their process (see
/// `DockerSandbox::start_services`).
pub(crate) async fn remove_orphaned(docker: &Docker, label: &str) {
    match sweep(docker, vec![label.to_string()], &owner_alive, false).await {
        Ok(report) => tracing::debug!(?report, "orphaned services swept"),
        Err(e) => tracing::debug!(error = %e, "orphaned services not swept"),
    }
}

/// Remove every container and volume labelled with this process's pid and host.
pub(crate) async fn remove_owned_by_this_process(docker: &Docker) -> Result<GcReport, SandboxError> {
    let mine = vec![
        format!("{PID_LABEL}={}", std::process::id()),
        format!("{HOST_LABEL}={}", hostname()),
    ];
    sweep(docker, mine, &|_| false, false).await
}

/// Ids and labels of the containers (in any state) matching `filters`.
///
/// Podman reports states Docker's API does not define (`stopped`, while it removes an
/// auto-removed container), which bollard's model refuses to read ("unknown variant"): the
/// list is then read raw from the socket, ids and labels only.
pub async fn list_labelled(
    docker: &Docker,
    filters: &HashMap<String, Vec<String>>,
) -> Result<Vec<(String, HashMap<String, String>)>, SandboxError> {
    let listed = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(filters)
                .build(),
        ))
        .await;
    match listed {
        Ok(list) => Ok(list
            .into_iter()
            .filter_map(|c| Some((c.id?, c.labels.unwrap_or_default())))
            .collect()),
        Err(e @ bollard::errors::Error::JsonDataError { .. }) => {
            let query = serde_json::to_string(filters).unwrap_or_default();
            let path = format!(
                "/v1.41/containers/json?all=1&filters={}",
                super::flavor::query_escape(&query)
            );
            let Some(serde_json::Value::Array(list)) = super::flavor::raw_get(&path).await else {
                return Err(SandboxError::docker("list containers", e));
            };
            Ok(list
                .iter()
                .filter_map(|c| {
                    let id = c.get("Id")?.as_str()?.to_string();
                    let labels = c
                        .get("Labels")
                        .and_then(|l| serde_json::from_value(l.clone()).ok())
                        .unwrap_or_default();
                    Some((id, labels))
                })
                .collect())
        }
        Err(e) => Err(SandboxError::docker("list containers", e)),
    }
}

/// What was removed is gone when gc returns: a container the engine was removing itself (a
/// daemon that came back finishing its auto-removes) can end "dead" when that removal fails
/// (a mount still busy), and a second removal then succeeds. So list again, for up to 10 s,
/// and remove what is still there; what never goes is an error naming it.
async fn confirm_gone(
    docker: &Docker,
    filters: &HashMap<String, Vec<String>>,
    keep: &(dyn Fn(&HashMap<String, String>) -> bool + Sync),
) -> Result<(), SandboxError> {
    let opts = || {
        RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build()
    };
    let mut last = Vec::new();
    for _ in 0..20 {
        last = list_labelled(docker, filters)
            .await?
            .into_iter()
            .filter(|(_, labels)| !keep(labels))
            .map(|(id, _)| id)
            .collect();
        if last.is_empty() {
            return Ok(());
        }
        for id in &last {
            // 404 and 409 (gone, or being removed): the next listing tells.
            let _ = docker.remove_container(id, Some(opts())).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    Err(SandboxError::Other(format!(
        "the engine keeps {} container(s) gc removed: {} (see `docker ps -a`)",
        last.len(),
        last.iter()
            .map(|id| super::api::short(id))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Containers, then volumes, carrying every label of `labels` (`key` or `key=value`), except
/// those `keep` spares.
async fn sweep(
    docker: &Docker,
    labels: Vec<String>,
    keep: &(dyn Fn(&HashMap<String, String>) -> bool + Sync),
    dry_run: bool,
) -> Result<GcReport, SandboxError> {
    let mut report = GcReport::default();
    let filters = HashMap::from([("label".to_string(), labels)]);
    let docker_err = |context: String| move |source| SandboxError::Docker { context, source };
    let containers = list_labelled(docker, &filters).await?;
    for (id, labels) in containers {
        if keep(&labels) {
            report.in_use += 1;
            continue;
        }
        let short = id[..12.min(id.len())].to_string();
        if !dry_run {
            let opts = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            match docker.remove_container(&id, Some(opts)).await {
                Ok(()) => {}
                // Gone, or being removed already (auto-remove, or a daemon that came back
                // finishing what it did): `confirm_gone` waits for it, and removes it again if
                // that removal fails.
                Err(e) if matches!(super::api::status_of(&e), Some(404 | 409)) => continue,
                Err(e) => return Err(docker_err(format!("remove container {id}"))(e)),
            }
        }
        report.containers_removed.push(short);
    }
    if !dry_run {
        confirm_gone(docker, &filters, keep).await?;
    }
    let volumes = docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .map_err(docker_err("list volumes".into()))?;
    for v in volumes.volumes.unwrap_or_default() {
        if keep(&v.labels) {
            report.in_use += 1;
            continue;
        }
        if !dry_run {
            let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
            match docker.remove_volume(&v.name, Some(opts)).await {
                Ok(()) => {}
                Err(e) if matches!(super::api::status_of(&e), Some(404 | 409)) => continue,
                Err(e) => return Err(docker_err(format!("remove volume {}", v.name))(e)),
            }
        }
        report.volumes_removed.push(v.name);
    }
    Ok(report)
}
