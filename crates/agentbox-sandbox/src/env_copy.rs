//! `agentbox env fork`: a named environment's volume copied into a new one, volume to volume,
//! by a helper container that runs `cp` and nothing of the project's.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, Mount, MountType, MountVolumeOptions};
use futures_util::StreamExt;

use super::cleanup::{Cleanup, Resource};
use super::containers::create_tracked;
use super::flavor::EngineInfo;
use super::policy::{Helper, Limits, locked_down};
use super::{ENV_LABEL, HOST_LABEL, PID_LABEL, SESSION_LABEL, SandboxError};

const FROM: &str = "/from";
const TO: &str = "/to";

/// What one fork copies: `from` (an environment's volume) into the fresh volume `to`, which
/// becomes environment `env`'s; `image` holds `cp` (the environment's own image).
pub struct VolumeFork<'a> {
    pub image: &'a str,
    pub from: &'a str,
    pub from_env: &'a str,
    pub to: &'a str,
    pub env: &'a str,
    /// The session the copying container is labelled with, so `gc` finds it after a kill.
    pub session: &'a str,
    pub runtime: Option<String>,
}

/// The copier: [`locked_down`] (no network, seccomp, read-only root, bounded), root with only
/// what `cp -a` needs to reproduce owners and modes it did not make (CHOWN, FOWNER) and to read
/// files the sandbox made unreadable (DAC_OVERRIDE); the source mounted read-only. `cp -a`
/// copies links as links and never opens a special file's contents: the sandbox's files are
/// data here, never followed.
fn copier_body(f: &VolumeFork<'_>, engine: &EngineInfo) -> ContainerCreateBody {
    let labels = HashMap::from([
        (SESSION_LABEL.to_string(), f.session.to_string()),
        (PID_LABEL.to_string(), std::process::id().to_string()),
        (HOST_LABEL.to_string(), super::gc::hostname()),
    ]);
    let mut body = locked_down(Helper {
        image: f.image,
        user: "0:0",
        cmd: vec!["cp".into(), "-a".into(), format!("{FROM}/."), format!("{TO}/")],
        labels,
        engine,
        runtime: f.runtime.clone(),
        max_file_bytes: Limits::default().max_file_bytes,
    });
    let mount = |source: &str, target: &str, read_only: bool| Mount {
        target: Some(target.to_string()),
        source: Some(source.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(hc) = body.host_config.as_mut() {
        hc.cap_add = Some(vec!["CHOWN".into(), "FOWNER".into(), "DAC_OVERRIDE".into()]);
        hc.mounts = Some(vec![mount(f.from, FROM, true), mount(f.to, TO, false)]);
        hc.userns_mode = engine.userns_mode().map(String::from);
    }
    body
}

/// Copy environment `from_env`'s volume into a new volume for `env`, labelled as environment
/// volumes are ([`ENV_LABEL`] and the host). The new volume and the copier are registered with
/// `cleanup` while the copy runs, so an interrupted or failed fork leaves neither; once copied,
/// the volume is released to outlive the process. Refuses a source volume that is not
/// `from_env`'s and a destination that exists already.
pub async fn fork_env_volume(
    docker: &Docker,
    cleanup: &Cleanup,
    f: VolumeFork<'_>,
) -> Result<(), SandboxError> {
    let source = docker
        .inspect_volume(f.from)
        .await
        .map_err(|e| SandboxError::docker("inspect volume", e))?;
    if source.labels.get(ENV_LABEL).map(String::as_str) != Some(f.from_env) {
        return Err(SandboxError::Other(format!(
            "volume {} is not environment {}'s (its label does not say so)",
            f.from, f.from_env
        )));
    }
    if docker.inspect_volume(f.to).await.is_ok() {
        return Err(SandboxError::Other(format!("volume {} exists already", f.to)));
    }
    let registration = cleanup.register_creating(Resource::Creating {
        docker: docker.clone(),
        name: f.to.to_string(),
        volume: true,
    })?;
    let copied = async {
        docker
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(f.to.to_string()),
                labels: Some(HashMap::from([
                    (ENV_LABEL.to_string(), f.env.to_string()),
                    (HOST_LABEL.to_string(), super::gc::hostname()),
                ])),
                ..Default::default()
            })
            .await
            .map_err(|e| SandboxError::docker("create volume", e))?;
        cleanup.replace(
            &registration,
            Resource::Volume {
                docker: docker.clone(),
                name: f.to.to_string(),
            },
        );
        let engine = super::flavor::info(docker).await;
        let name = format!("agentbox-{}-fork", f.session);
        let (id, copier) = create_tracked(
            docker,
            cleanup,
            &name,
            copier_body(&f, &engine),
            "create the copying container",
            "0:0".into(),
        )
        .await?;
        let result = async {
            run_to_end(
                docker,
                &id,
                "copying",
                "copying the environment failed (cp ended with status",
            )
            .await
        }
        .await;
        super::api::remove_container(docker, &id).await;
        cleanup.release(copier);
        result
    }
    .await;
    if copied.is_err() {
        super::api::remove_volume(docker, f.to).await;
    }
    cleanup.release(registration);
    copied
}

/// Where a rewind's archive is unpacked in the restoring container (a scratch volume).
const RESTORE: &str = "/restore";

/// What the restoring container runs, as root with the copier's capabilities, in the
/// environment's volume at `/workspace`; it reads three NUL-separated lists of agentbox's and a
/// tree of agentbox's from `/restore` (see [`restore_env_volume`]):
/// `dirs` (every directory to be, and every ancestor of a path to be touched, shallowest first:
/// each made a real directory, whatever link or file the sandbox left in its place, so nothing
/// removed or written next goes through a link), `remove` (removed whole, unless a link is on
/// the way), `prune` (removed if empty), then `tree`'s files
/// and links copied in and given to the owner of `/workspace`.
const RESTORE_SCRIPT: &str = r#"set -eu
cd /workspace
owner=$(stat -c %u:%g /workspace)
while IFS= read -r -d '' d; do
  if [ -L "./$d" ] || { [ -e "./$d" ] && [ ! -d "./$d" ]; }; then rm -f -- "./$d"; fi
  if [ ! -d "./$d" ]; then mkdir -- "./$d"; chown -h "$owner" -- "./$d"; fi
done < /restore/dirs
while IFS= read -r -d '' p; do
  d=$(dirname -- "$p")
  # Never through a link: only when the parent resolves to itself.
  if [ "$(cd -P -- "./$d" 2>/dev/null && pwd)" = "$(cd -- "./$d" 2>/dev/null && pwd -L)" ]; then rm -rf -- "./$p"; fi
done < /restore/remove
while IFS= read -r -d '' d; do
  if [ -d "./$d" ] && [ ! -L "./$d" ]; then rmdir -- "./$d" 2>/dev/null || true; fi
done < /restore/prune
cp -a --no-preserve=ownership /restore/tree/. /workspace/
cd /restore/tree
find . -mindepth 1 -print0 | (cd /workspace && xargs -0 -r chown -h "$owner" --)
"#;

/// What one rewind writes: into environment `env`'s volume `volume`, with `image`'s tools.
pub struct VolumeRestore<'a> {
    pub image: &'a str,
    pub volume: &'a str,
    pub env: &'a str,
    pub session: &'a str,
    pub runtime: Option<String>,
}

fn restorer_body(r: &VolumeRestore<'_>, scratch: &str, engine: &EngineInfo) -> ContainerCreateBody {
    let labels = HashMap::from([
        (SESSION_LABEL.to_string(), r.session.to_string()),
        (PID_LABEL.to_string(), std::process::id().to_string()),
        (HOST_LABEL.to_string(), super::gc::hostname()),
    ]);
    let mut body = locked_down(Helper {
        image: r.image,
        user: "0:0",
        cmd: vec!["bash".into(), "-c".into(), RESTORE_SCRIPT.into()],
        labels,
        engine,
        runtime: r.runtime.clone(),
        max_file_bytes: Limits::default().max_file_bytes,
    });
    if let Some(hc) = body.host_config.as_mut() {
        hc.cap_add = Some(vec!["CHOWN".into(), "FOWNER".into(), "DAC_OVERRIDE".into()]);
        hc.mounts = Some(vec![
            volume_mount(r.volume, super::WORKSPACE, false),
            volume_mount(scratch, RESTORE, false),
        ]);
        hc.userns_mode = engine.userns_mode().map(String::from);
    }
    body
}

fn volume_mount(source: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Put `archive` (a tar of agentbox's making: `remove`, `dirs`, `tree/...`) into environment
/// `env`'s volume: unpacked into a scratch volume through the archive API, then applied by a
/// locked-down container running [`RESTORE_SCRIPT`]. The scratch volume and the container are
/// registered with `cleanup` and removed whatever happens.
pub async fn restore_env_volume(
    docker: &Docker,
    cleanup: &Cleanup,
    r: VolumeRestore<'_>,
    archive: &std::path::Path,
) -> Result<(), SandboxError> {
    let found = docker
        .inspect_volume(r.volume)
        .await
        .map_err(|e| SandboxError::docker("inspect volume", e))?;
    if found.labels.get(ENV_LABEL).map(String::as_str) != Some(r.env) {
        return Err(SandboxError::Other(format!(
            "volume {} is not environment {}'s (its label does not say so)",
            r.volume, r.env
        )));
    }
    let scratch = format!("agentbox-{}-restore", r.session);
    let labels = HashMap::from([
        (SESSION_LABEL.to_string(), r.session.to_string()),
        (PID_LABEL.to_string(), std::process::id().to_string()),
        (HOST_LABEL.to_string(), super::gc::hostname()),
    ]);
    let registration = cleanup.register_creating(Resource::Creating {
        docker: docker.clone(),
        name: scratch.clone(),
        volume: true,
    })?;
    let done = async {
        docker
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(scratch.clone()),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map_err(|e| SandboxError::docker("create volume", e))?;
        cleanup.replace(
            &registration,
            Resource::Volume {
                docker: docker.clone(),
                name: scratch.clone(),
            },
        );
        let engine = super::flavor::info(docker).await;
        let (id, restorer) = create_tracked(
            docker,
            cleanup,
            &format!("agentbox-{}-rewind", r.session),
            restorer_body(&r, &scratch, &engine),
            "create the restoring container",
            "0:0".into(),
        )
        .await?;
        let result = async {
            let file = tokio::fs::File::open(archive)
                .await
                .map_err(|e| SandboxError::Other(format!("cannot read the rewind's archive: {e}")))?;
            let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
            let opts = bollard::query_parameters::UploadToContainerOptionsBuilder::default()
                .path(RESTORE)
                .build();
            docker
                .upload_to_container(&id, Some(opts), body)
                .await
                .map_err(|e| SandboxError::docker("copy the rewind's files in", e))?;
            run_to_end(
                docker,
                &id,
                "restoring",
                "rewinding the environment failed (status",
            )
            .await
        }
        .await;
        super::api::remove_container(docker, &id).await;
        cleanup.release(restorer);
        result
    }
    .await;
    super::api::remove_volume(docker, &scratch).await;
    cleanup.release(registration);
    done
}

/// Start the helper container `id` (the `role` one: copying, restoring) and wait for it to end;
/// a status other than 0 is `failed` with the status after it.
async fn run_to_end(docker: &Docker, id: &str, role: &str, failed: &str) -> Result<(), SandboxError> {
    docker
        .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
        .await
        .map_err(|e| SandboxError::docker(format!("start the {role} container"), e))?;
    let mut wait = docker.wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
    match wait.next().await {
        Some(Ok(r)) if r.status_code == 0 => Ok(()),
        Some(Ok(r)) => Err(SandboxError::Other(format!("{failed} {})", r.status_code))),
        // A non-zero exit may come back as an error from the wait endpoint.
        Some(Err(e)) => Err(SandboxError::docker(format!("wait for the {role} container"), e)),
        None => Err(SandboxError::Other(format!("the {role} container vanished"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copier_is_locked_down_and_reads_the_source_only() {
        let f = VolumeFork {
            image: "img",
            from: "agentbox-env-a",
            from_env: "a",
            to: "agentbox-env-b",
            env: "b",
            session: "s",
            runtime: None,
        };
        let body = copier_body(&f, &EngineInfo::docker());
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            hc.cap_add,
            Some(vec!["CHOWN".into(), "FOWNER".into(), "DAC_OVERRIDE".into()])
        );
        let mounts = hc.mounts.unwrap();
        assert_eq!(mounts[0].source.as_deref(), Some("agentbox-env-a"));
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(mounts[1].read_only, Some(false));
        assert_eq!(body.labels.unwrap()[SESSION_LABEL], "s");
    }
}
