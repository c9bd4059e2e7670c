//! The sandbox user exists: `/etc/passwd` and `/etc/group` as the image has them, plus an
//! entry for the uid:gid the sandbox runs as (home: [`HOME`]), so that `id -un`, `whoami`,
//! Python's `getpass.getuser()` and `pwd.getpwuid(os.getuid())` (which pip, pytest's `tmp_path`
//! and many tools call) work for any project owner.
//!
//! How the files get in, with the root filesystem read-only: the archive API refuses to write
//! into a container whose root is read-only, even before it starts ("container rootfs is marked
//! read-only", measured on Engine 20.10), and a tmpfs cannot hold a single file at a fixed
//! path. So the two files are written on the host, per session, and bind-mounted read-only over
//! the image's. An engine that cannot bind-mount this machine's files (a remote one) gets them
//! in a layer of their own instead: [`image_with_user`] commits a never-started container of the
//! image with the two files uploaded (its root is writable: it never runs), once per image and
//! uid:gid, as `agentbox-identity:IMAGE-UID-GID`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

use bollard::Docker;
use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
use futures_util::StreamExt;

use super::SandboxError;
use super::policy::{
    GitPiece, HOME, LINKED_GIT_EMPTY, LINKED_GIT_FILE, LINKED_GIT_ROOT, LinkedGit, SandboxSpec,
    WorkspaceSource,
};

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Name of the entry made for the sandbox user (when the image has none for its uid).
pub(crate) const USER_NAME: &str = "agentbox";

/// The two files, on the host, for as long as the container may start; and for a linked
/// worktree, the `.git` file, config and empty file agentbox writes for it (see
/// `hostscan::git::LinkedGit`).
pub(crate) struct EtcFiles {
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
pub(crate) async fn etc_files(docker: &Docker, spec: &SandboxSpec) -> Result<EtcFiles, SandboxError> {
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
    if let WorkspaceSource::Bind {
        linked_git: Some(linked),
        ..
    } = &spec.workspace
    {
        write_linked_git(dir.path(), linked, spec)
            .map_err(|e| SandboxError::Other(format!("cannot write the sandbox's git files: {e}")))?;
    }
    // The directory itself is 0700 (tempfile's default); the daemon runs as root.
    Ok(EtcFiles { dir })
}

/// The files of `hostscan::git::LinkedGit` in `dir`, the sandbox user's (run as anyone else,
/// agentbox is that user already).
fn write_linked_git(dir: &Path, linked: &LinkedGit, spec: &SandboxSpec) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let own = |path: &Path, mode: u32| -> std::io::Result<()> {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        if running_as_root() {
            std::os::unix::fs::chown(path, Some(spec.uid), Some(spec.gid))?;
        }
        Ok(())
    };
    let file = |path: &Path, text: &str| -> std::io::Result<()> {
        std::fs::write(path, text)?;
        own(path, 0o644)
    };
    file(&dir.join(LINKED_GIT_FILE), &super::policy::dot_git(linked))?;
    file(&dir.join(LINKED_GIT_EMPTY), "")?;
    let root = dir.join(LINKED_GIT_ROOT);
    std::fs::create_dir(&root)?;
    own(&root, 0o755)?;
    file(&root.join("config"), &linked.config)?;
    // Mount points, so that the engine makes none (it would make them root's).
    for (piece, _) in &linked.pieces {
        if *piece == GitPiece::WorktreeConfig {
            // Inside the worktree's own directory, where it exists.
            continue;
        }
        let mut at = root.clone();
        for part in Path::new(piece.rel()).components() {
            at.push(part);
            let last = at.ends_with(piece.rel());
            if at.symlink_metadata().is_ok() {
                continue;
            }
            if last && !piece.is_dir() {
                file(&at, "")?;
            } else {
                std::fs::create_dir(&at)?;
                own(&at, 0o755)?;
            }
        }
    }
    Ok(())
}

/// Repository of the images [`image_with_user`] makes.
pub(crate) const IDENTITY_REPO: &str = "agentbox-identity";

/// One commit at a time: parallel eval tasks on one engine would all make the same image.
static COMMITTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The spec's image with its `/etc/passwd` and `/etc/group` holding the sandbox user, for an
/// engine that cannot bind-mount them: made once per engine, image and uid:gid, then reused.
pub(crate) async fn image_with_user(docker: &Docker, spec: &SandboxSpec) -> Result<String, SandboxError> {
    let (passwd, group) = image_etc(docker, spec).await?;
    let (passwd, group) = with_user(&passwd, &group, spec.uid, spec.gid);
    let id = image_id(docker, &spec.image).await?;
    let hex = id.strip_prefix("sha256:").unwrap_or(&id);
    let tag = format!("{}-{}-{}", &hex[..hex.len().min(16)], spec.uid, spec.gid);
    let name = format!("{IDENTITY_REPO}:{tag}");
    if docker.inspect_image(&name).await.is_ok() {
        return Ok(name);
    }
    let _one = COMMITTING.lock().await;
    if docker.inspect_image(&name).await.is_ok() {
        return Ok(name);
    }
    let container = format!("{}-identity", spec.container_name());
    let (cid, registration) = super::containers::create_tracked(
        docker,
        &spec.cleanup,
        &container,
        spec.identity_body(&super::flavor::info(docker).await),
        "create a container for the sandbox user's /etc entries",
        "0:0".into(),
    )
    .await?;
    let result = async {
        let tar = etc_tar(&passwd, &group)
            .map_err(|e| SandboxError::Other(format!("cannot pack the sandbox's /etc files: {e}")))?;
        let opts = bollard::query_parameters::UploadToContainerOptionsBuilder::default()
            .path("/")
            .build();
        docker
            .upload_to_container(&cid, Some(opts), bollard::body_full(tar.into()))
            .await
            .map_err(|e| SandboxError::docker("upload the sandbox's /etc files", e))?;
        let opts = bollard::query_parameters::CommitContainerOptionsBuilder::default()
            .container(&cid)
            .repo(IDENTITY_REPO)
            .tag(&tag)
            .pause(false)
            .build();
        let config = bollard::models::ContainerConfig {
            labels: Some(HashMap::from([(
                "agentbox.identity".to_string(),
                spec.image.clone(),
            )])),
            ..Default::default()
        };
        docker
            .commit_container(opts, config)
            .await
            .map_err(|e| SandboxError::docker(format!("commit {name}"), e))
    }
    .await;
    super::api::remove_container(docker, &cid).await;
    spec.cleanup.release(registration);
    result?;
    tracing::debug!(%name, "image with the sandbox user made");
    Ok(name)
}

async fn image_id(docker: &Docker, image: &str) -> Result<String, SandboxError> {
    Ok(docker
        .inspect_image(image)
        .await
        .map_err(|e| match super::api::status_of(&e) {
            Some(404) => SandboxError::ImageMissing {
                image: image.to_string(),
                detail: String::new(),
            },
            _ => SandboxError::docker(format!("inspect image {image}"), e),
        })?
        .id
        .unwrap_or_else(|| image.to_string()))
}

/// `etc/passwd` and `etc/group`, root-owned, mode 0644, for an upload at `/`.
fn etc_tar(passwd: &str, group: &str) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, text) in [("etc/passwd", passwd), ("etc/group", group)] {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, text.as_bytes())?;
    }
    builder.into_inner()
}

async fn image_etc(docker: &Docker, spec: &SandboxSpec) -> Result<ImageEtc, SandboxError> {
    let id = docker
        .inspect_image(&spec.image)
        .await
        .map_err(|e| match super::api::status_of(&e) {
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
    let read = match disk_cache::load(&id) {
        Some(found) => found,
        None => {
            let read = read_from_image(docker, spec).await?;
            disk_cache::store(&id, &read);
            read
        }
    };
    IMAGE_ETC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(id, read.clone());
    Ok(read)
}

/// The image's files on disk, by image id, so that a session does not pay a container create
/// and removal to read them (one to three tenths of a second, measured at `agentbox -v exec`'s
/// "container created" step) each time agentbox starts. An image id is the digest of the
/// image's configuration, so an entry never goes stale; a missing or unreadable entry is read
/// from the image again. The directory is the user's own (`$AGENTBOX_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/agentbox`, else `~/.cache/agentbox`), never the project's.
pub(crate) mod disk_cache {
    use std::io::{Read, Write};
    use std::path::{Path, PathBuf};

    use super::ImageEtc;

    const LIMIT: u64 = 1 << 20;

    pub(crate) fn root() -> Option<PathBuf> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        var("AGENTBOX_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("agentbox")))
            .or_else(|| var("HOME").map(|h| h.join(".cache/agentbox")))
    }

    pub(super) fn entry(root: &Path, id: &str) -> Option<PathBuf> {
        // Only a plain digest names a directory: nothing in an id can climb out of the cache.
        let hex = id.strip_prefix("sha256:").unwrap_or(id);
        if hex.is_empty() || hex.len() > 128 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(root.join("image-etc").join(hex))
    }

    fn read(path: PathBuf) -> Option<String> {
        let mut text = String::new();
        std::fs::File::open(path)
            .ok()?
            .take(LIMIT + 1)
            .read_to_string(&mut text)
            .ok()?;
        (text.len() as u64 <= LIMIT).then_some(text)
    }

    pub fn load(id: &str) -> Option<ImageEtc> {
        load_from(&root()?, id)
    }

    pub fn store(id: &str, etc: &ImageEtc) {
        if let Some(root) = root() {
            store_in(&root, id, etc);
        }
    }

    pub(super) fn load_from(root: &Path, id: &str) -> Option<ImageEtc> {
        let dir = entry(root, id)?;
        // Written last: without it the entry is incomplete (an interrupted store).
        std::fs::metadata(dir.join("complete")).ok()?;
        Some((read(dir.join("passwd"))?, read(dir.join("group"))?))
    }

    /// Best effort: a cache that cannot be written costs the next session a read, nothing else.
    pub(super) fn store_in(root: &Path, id: &str, (passwd, group): &ImageEtc) {
        let Some(dir) = entry(root, id) else { return };
        let write = |name: &str, text: &str| -> std::io::Result<()> {
            let mut file = tempfile::NamedTempFile::new_in(&dir)?;
            file.write_all(text.as_bytes())?;
            file.persist(dir.join(name)).map_err(|e| e.error)?;
            Ok(())
        };
        let result = std::fs::create_dir_all(&dir)
            .and_then(|()| write("passwd", passwd))
            .and_then(|()| write("group", group))
            .and_then(|()| write("complete", ""));
        if let Err(e) = result {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot cache the image's /etc files");
        }
    }
}

/// Read the files through the archive API from a container of the image that is created and
/// never started (the sandbox's own container cannot be asked: its reads would see the mounts).
async fn read_from_image(docker: &Docker, spec: &SandboxSpec) -> Result<ImageEtc, SandboxError> {
    let name = format!("{}-etc", spec.container_name());
    let (id, registration) = super::containers::create_tracked(
        docker,
        &spec.cleanup,
        &name,
        spec.reader_body(&super::flavor::info(docker).await),
        "create a container to read the image's /etc/passwd",
        "0:0".into(),
    )
    .await?;
    let passwd = read_file(docker, &id, "/etc/passwd").await;
    let group = read_file(docker, &id, "/etc/group").await;
    super::api::remove_container(docker, &id).await;
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
pub(crate) fn with_user(passwd: &str, group: &str, uid: u32, gid: u32) -> (String, String) {
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
    fn the_disk_cache_keeps_an_image_by_its_digest_only() {
        let root = tempfile::tempdir().unwrap();
        let id = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(disk_cache::load_from(root.path(), &id), None);
        disk_cache::store_in(root.path(), &id, &(PASSWD.into(), GROUP.into()));
        assert_eq!(
            disk_cache::load_from(root.path(), &id),
            Some((PASSWD.to_string(), GROUP.to_string()))
        );
        // An entry cut short (no completion mark) is read from the image again.
        std::fs::remove_file(disk_cache::entry(root.path(), &id).unwrap().join("complete")).unwrap();
        assert_eq!(disk_cache::load_from(root.path(), &id), None);
        for bad in ["", "sha256:", "../../etc", "sha256:../x", "agentbox/python:3"] {
            assert_eq!(disk_cache::entry(root.path(), bad), None, "{bad:?}");
        }
    }

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
