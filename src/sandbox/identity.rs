//! The sandbox user exists: `/etc/passwd` and `/etc/group` as the image has them, plus an
//! entry for the uid:gid the sandbox runs as (home: [`HOME`]), so that `id -un`, `whoami`,
//! Python's `getpass.getuser()` and `pwd.getpwuid(os.getuid())` (which pip, pytest's `tmp_path`
//! and many tools call) work for any project owner.
//!
//! How the files get in, with the root filesystem read-only: the archive API refuses to write
//! into a container whose root is read-only, even before it starts ("container rootfs is marked
//! read-only", measured on Engine 20.10), and a tmpfs cannot hold a single file at a fixed
//! path. So the two files are written on the host, per session, and bind-mounted read-only over
//! the image's. (An engine that cannot bind-mount host files, such as a remote one, would need
//! another way: e.g. a one-line image built on top with the two files.)

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

use bollard::Docker;
use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
use futures_util::StreamExt;

use super::SandboxError;
use super::policy::{HOME, SandboxSpec};

/// Name of the entry made for the sandbox user (when the image has none for its uid).
pub const USER_NAME: &str = "agentbox";

/// The two files, on the host, for as long as the container may start.
pub struct EtcFiles {
    dir: tempfile::TempDir,
}

impl EtcFiles {
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The image's own `/etc/passwd` and `/etc/group`, by image id: read once per process (an eval
/// starts many sandboxes of one image).
type ImageEtc = (String, String);
static IMAGE_ETC: Mutex<Option<HashMap<String, ImageEtc>>> = Mutex::new(None);

/// Write the sandbox's `/etc/passwd` and `/etc/group` into a fresh host directory.
pub async fn etc_files(docker: &Docker, spec: &SandboxSpec) -> Result<EtcFiles, SandboxError> {
    let (passwd, group) = image_etc(docker, spec).await?;
    let (passwd, group) = with_user(&passwd, &group, spec.uid, spec.gid);
    let dir = tempfile::Builder::new()
        .prefix("agentbox-etc-")
        .tempdir()
        .map_err(|e| SandboxError::Other(format!("cannot create the sandbox's /etc files: {e}")))?;
    for (name, text) in [("passwd", passwd), ("group", group)] {
        let path = dir.path().join(name);
        std::fs::write(&path, text)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            })
            .map_err(|e| SandboxError::Other(format!("cannot write {}: {e}", path.display())))?;
    }
    // The directory itself is 0700 (tempfile's default); the daemon runs as root.
    Ok(EtcFiles { dir })
}

async fn image_etc(docker: &Docker, spec: &SandboxSpec) -> Result<ImageEtc, SandboxError> {
    let id = docker
        .inspect_image(&spec.image)
        .await
        .map_err(|e| match super::docker::status_of(&e) {
            Some(404) => SandboxError::ImageMissing {
                image: spec.image.clone(),
                detail: String::new(),
            },
            _ => SandboxError::docker(format!("inspect image {}", spec.image), e),
        })?
        .id
        .unwrap_or_else(|| spec.image.clone());
    if let Some(found) = IMAGE_ETC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&id).cloned())
    {
        return Ok(found);
    }
    let read = read_from_image(docker, spec).await?;
    IMAGE_ETC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(id, read.clone());
    Ok(read)
}

/// Read the files through the archive API from a container of the image that is created and
/// never started (the sandbox's own container cannot be asked: its reads would see the mounts).
async fn read_from_image(docker: &Docker, spec: &SandboxSpec) -> Result<ImageEtc, SandboxError> {
    let name = format!("{}-etc", spec.container_name());
    let (id, registration) = super::docker::create_tracked(
        docker,
        spec,
        &name,
        spec.reader_body(),
        "create a container to read the image's /etc/passwd",
        "0:0".into(),
    )
    .await?;
    let passwd = read_file(docker, &id, "/etc/passwd").await;
    let group = read_file(docker, &id, "/etc/group").await;
    super::docker::remove_container(docker, &id).await;
    spec.cleanup.release(registration);
    // An image without the files (a scratch image) simply has no entries.
    Ok((passwd.unwrap_or_default(), group.unwrap_or_default()))
}

/// One small text file out of a container (at most 1 MiB).
async fn read_file(docker: &Docker, id: &str, path: &str) -> Option<String> {
    const LIMIT: usize = 1 << 20;
    let opts = DownloadFromContainerOptionsBuilder::default().path(path).build();
    let mut stream = docker.download_from_container(id, Some(opts));
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        tar.extend_from_slice(&chunk.ok()?);
        if tar.len() > LIMIT + 4096 {
            return None;
        }
    }
    let mut archive = tar::Archive::new(tar.as_slice());
    let mut entry = archive.entries().ok()?.next()?.ok()?;
    if !entry.header().entry_type().is_file() {
        return None;
    }
    let mut text = String::new();
    entry.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The image's `passwd` and `group` with an entry for `uid` and `gid` added where the image has
/// none (an existing entry for them stays as the image made it).
pub fn with_user(passwd: &str, group: &str, uid: u32, gid: u32) -> (String, String) {
    let mut passwd = terminated(passwd);
    let mut group = terminated(group);
    if !has_id(&passwd, uid) {
        let name = free_name(&passwd, uid);
        passwd.push_str(&format!(
            "{name}:x:{uid}:{gid}:agentbox sandbox user:{HOME}:/bin/sh\n"
        ));
    }
    if !has_id(&group, gid) {
        let name = free_name(&group, gid);
        group.push_str(&format!("{name}:x:{gid}:\n"));
    }
    (passwd, group)
}

fn terminated(text: &str) -> String {
    let mut t = text.to_string();
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
    t
}

/// Whether an entry (`name:x:ID:...`) has this id in its third field.
fn has_id(text: &str, id: u32) -> bool {
    text.lines()
        .any(|l| l.split(':').nth(2).and_then(|f| f.parse::<u32>().ok()) == Some(id))
}

/// `agentbox`, or `agentbox-ID` if the image already uses that name for another id.
fn free_name(text: &str, id: u32) -> String {
    let taken = |name: &str| text.lines().any(|l| l.split(':').next() == Some(name));
    if taken(USER_NAME) {
        format!("{USER_NAME}-{id}")
    } else {
        USER_NAME.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin";
    const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

    #[test]
    fn the_sandbox_user_is_added_once() {
        let (p, g) = with_user(PASSWD, GROUP, 1000, 1000);
        assert!(
            p.starts_with(PASSWD),
            "the image's entries stay first and unchanged"
        );
        assert!(p.ends_with(&format!(
            "\nagentbox:x:1000:1000:agentbox sandbox user:{HOME}:/bin/sh\n"
        )));
        assert!(g.ends_with("nogroup:x:65534:\nagentbox:x:1000:\n"));
        // Root, or an owner the image already knows: nothing added.
        assert_eq!(
            with_user(PASSWD, GROUP, 0, 0),
            (format!("{PASSWD}\n"), GROUP.to_string())
        );
        let (p, g) = with_user(PASSWD, GROUP, 4242, 65534);
        assert!(p.contains(":4242:65534:"));
        assert_eq!(g, GROUP);
    }

    #[test]
    fn a_name_the_image_uses_is_not_taken_twice() {
        let passwd = "agentbox:x:1000:1000::/home/agentbox:/bin/sh\n";
        let (p, _) = with_user(passwd, "", 1001, 1001);
        assert!(p.contains("\nagentbox-1001:x:1001:1001:"), "{p}");
        let (p, g) = with_user("", "", 5, 6);
        assert!(p.starts_with("agentbox:x:5:6:"));
        assert_eq!(g, "agentbox:x:6:\n");
    }
}
