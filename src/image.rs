//! Sandbox images: check, build through the Docker API from a tar context, or build offline
//! from Debian packages (mmdebstrap → import through the API) where no registry is reachable.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};
use futures_util::StreamExt;

use crate::sandbox::SandboxError;

/// The image used when `--image` is not given.
pub const DEFAULT_IMAGE: &str = "agentbox/python:1";

/// An image whose definition ships inside the binary (`images/<name>/`).
pub struct KnownImage {
    pub name: &'static str,
    pub tag: &'static str,
    pub dockerfile: &'static str,
    /// Debian packages, one per line; `#` starts a comment.
    pub packages: &'static str,
    pub suite: &'static str,
}

pub const KNOWN: &[KnownImage] = &[KnownImage {
    name: "python",
    tag: DEFAULT_IMAGE,
    dockerfile: include_str!("../images/python/Dockerfile"),
    packages: include_str!("../images/python/packages"),
    suite: "bookworm",
}];

impl KnownImage {
    pub fn by_name(name: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.name == name || k.tag == name)
    }

    pub fn package_list(&self) -> Vec<&'static str> {
        self.packages
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    fn revision(&self) -> &'static str {
        self.tag.rsplit(':').next().unwrap_or("1")
    }

    fn context_tar(&self) -> std::io::Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, body) in [("Dockerfile", self.dockerfile), ("packages", self.packages)] {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, name, body.as_bytes())?;
        }
        builder.into_inner()
    }
}

pub async fn image_exists(docker: &Docker, image: &str) -> Result<bool, SandboxError> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                &e,
                bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(SandboxError::Docker {
            context: format!("inspect image {image}"),
            source: e,
        }),
    }
}

/// Make sure `image` exists; build a known image through the API when it is missing.
/// `progress` receives build output lines (the caller decides whether they are shown).
pub async fn ensure_image(
    docker: &Docker,
    image: &str,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), SandboxError> {
    if image_exists(docker, image).await? {
        return Ok(());
    }
    let Some(known) = KnownImage::by_name(image) else {
        return Err(SandboxError::ImageMissing {
            image: image.to_string(),
            detail: " (it is not an agentbox image, so pull or build it yourself)".into(),
        });
    };
    progress(&format!(
        "image {image} is missing; building it from images/{}/Dockerfile",
        known.name
    ));
    build_with_docker(docker, known, progress)
        .await
        .map_err(|e| SandboxError::ImageMissing {
            image: image.to_string(),
            detail: format!(" and building it through Docker failed ({e})"),
        })
}

/// `docker build` through the API, from the Dockerfile and package list compiled in.
pub async fn build_with_docker(
    docker: &Docker,
    known: &KnownImage,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), SandboxError> {
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(known.tag)
        .rm(true)
        .forcerm(true)
        .build();
    let context = known
        .context_tar()
        .map_err(|e| SandboxError::Other(format!("cannot make the build context: {e}")))?;
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| SandboxError::Other(e.to_string()))?;
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            return Err(SandboxError::Other(detail));
        }
        if let Some(line) = info.stream {
            let line = line.trim_end();
            if !line.is_empty() {
                progress(line);
            }
        }
    }
    if image_exists(docker, known.tag).await? {
        Ok(())
    } else {
        Err(SandboxError::Other(
            "the build finished without producing the image".into(),
        ))
    }
}

/// Where mmdebstrap takes its packages from: `--mirror`, else this host's own APT sources.
fn apt_sources(mirror: Option<&str>) -> Result<Vec<String>, SandboxError> {
    if let Some(m) = mirror {
        return Ok(vec![m.to_string()]);
    }
    let mut found = Vec::new();
    let list = Path::new("/etc/apt/sources.list");
    if std::fs::read_to_string(list).is_ok_and(|t| t.lines().any(|l| l.trim_start().starts_with("deb "))) {
        found.push(list.display().to_string());
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut entries: Vec<PathBuf> = dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                // Only Debian's own archive: third-party repositories are for the host.
                (name.ends_with(".sources") || name.ends_with(".list")) && name.starts_with("debian")
            })
            .collect();
        entries.sort();
        found.extend(entries.into_iter().map(|p| p.display().to_string()));
    }
    if found.is_empty() {
        return Err(SandboxError::Other(
            "no Debian APT sources found on this host; pass --mirror URL (a Debian mirror)".into(),
        ));
    }
    Ok(found)
}

/// Build `known` offline: mmdebstrap a minimal Debian root filesystem with the package list,
/// then import it through the Docker API with the Dockerfile's metadata.
pub async fn build_offline(
    docker: &Docker,
    known: &KnownImage,
    mirror: Option<&str>,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), SandboxError> {
    let mmdebstrap = which("mmdebstrap").ok_or_else(|| {
        SandboxError::Other(
            "mmdebstrap is not installed; install the Debian package (apt-get install mmdebstrap) \
             and run this again"
                .into(),
        )
    })?;
    let dir = tempdir("agentbox-rootfs")?;
    let tarball = dir.join("rootfs.tar");
    let include = known.package_list().join(",");
    let mut cmd = tokio::process::Command::new(mmdebstrap);
    cmd.arg("--variant=minbase")
        .arg(format!("--include={include}"))
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
        .arg("--dpkgopt=path-exclude=/usr/share/man/*")
        .arg("--dpkgopt=path-exclude=/usr/share/locale/*")
        .arg(known.suite)
        .arg(&tarball)
        .args(apt_sources(mirror)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    progress(&format!("mmdebstrap {} with {include}", known.suite));
    let out = cmd
        .output()
        .await
        .map_err(|e| SandboxError::Other(format!("cannot run mmdebstrap: {e}")))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(SandboxError::Other(format!(
            "mmdebstrap failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    progress("importing the root filesystem into Docker");
    let result = import_rootfs(docker, known, &tarball).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn import_rootfs(docker: &Docker, known: &KnownImage, tarball: &Path) -> Result<(), SandboxError> {
    let (repo, tag) = known.tag.rsplit_once(':').unwrap_or((known.tag, "latest"));
    let changes = vec![
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "ENV LANG=C.UTF-8".to_string(),
        "WORKDIR /workspace".to_string(),
        format!(
            "LABEL org.agentbox.image=\"{}\" org.agentbox.image.revision=\"{}\"",
            known.name,
            known.revision()
        ),
        "CMD [\"bash\"]".to_string(),
    ];
    let opts = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(changes)
        .build();
    let file = tokio::fs::File::open(tarball)
        .await
        .map_err(|e| SandboxError::Other(format!("cannot open {}: {e}", tarball.display())))?;
    let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
    let mut stream = docker.create_image(Some(opts), Some(body), None);
    while let Some(item) = stream.next().await {
        item.map_err(|e| SandboxError::Other(format!("import failed: {e}")))?;
    }
    if image_exists(docker, known.tag).await? {
        Ok(())
    } else {
        Err(SandboxError::Other(
            "the import finished without producing the image".into(),
        ))
    }
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn tempdir(prefix: &str) -> Result<PathBuf, SandboxError> {
    let base = std::env::temp_dir();
    let dir = base.join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&dir)
        .map_err(|e| SandboxError::Other(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Print build progress lines to stderr.
pub fn stderr_progress(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "  {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_builds_read_one_package_list() {
        let python = KnownImage::by_name("python").unwrap();
        assert_eq!(
            python.package_list(),
            ["python3", "python3-pytest", "git", "ripgrep", "procps"]
        );
        assert!(python.dockerfile.contains("COPY packages"));
        assert!(KnownImage::by_name(DEFAULT_IMAGE).is_some());
    }

    #[test]
    fn the_build_context_holds_the_dockerfile_and_packages() {
        let tar = KnownImage::by_name("python").unwrap().context_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["Dockerfile", "packages"]);
    }
}
