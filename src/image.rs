//! Sandbox images: agentbox's own (`images/NAME/`), built through the Docker API from a tar
//! context, or offline from Debian packages (mmdebstrap → import through the API) where no
//! registry is reachable; any other image is pulled through the API.
//!
//! Both builds end the same way: a probe container reads the toolchain versions from the
//! built image, and a one-line build on top of it records them as labels
//! (`org.agentbox.toolchain.rust=1.85.0`), so a session can compare them with what a project
//! asks for without starting anything (see `toolchain`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncBufReadExt;

use crate::sandbox::cleanup::{Cleanup, Resource};
use crate::sandbox::{SandboxError, root_cause};
use crate::toolchain::{Toolchain, parse_probe, probe_script};

/// The one Debian suite every agentbox image is built from, by both builds: the newest stable
/// release the archive serves. Never a testing or unstable suite: the images must build the
/// same way for months.
pub const DEBIAN_SUITE: &str = "trixie";

/// The image used when `--image` is not given.
pub const DEFAULT_IMAGE: &str = "agentbox/python:3";

/// Label naming an agentbox image (`python`, `rust`...).
pub const IMAGE_LABEL: &str = "org.agentbox.image";
/// Label naming the Debian suite an agentbox image was built from.
pub const SUITE_LABEL: &str = "org.agentbox.image.suite";

/// The packages in every image; each image's own list is added to them.
const COMMON_PACKAGES: &str = include_str!("../images/common/packages");

/// An image whose definition ships inside the binary (`images/NAME/`).
pub struct KnownImage {
    pub name: &'static str,
    pub tag: &'static str,
    pub dockerfile: &'static str,
    /// Its own Debian packages (`images/NAME/packages`), one per line; `#` starts a comment.
    pub packages: &'static str,
    /// Known images whose packages it has too (the polyglot image: all the others).
    pub includes: &'static [&'static str],
    /// A command's time limit in its sandboxes when `--command-timeout` is not given. Cold, on
    /// a 2-core machine at a load of 8 to 20: `cargo test` of a crate without dependencies took
    /// 8 to 14 s, `go test` of a one-file module 68 to 131 s (Go compiles its standard library
    /// into GOCACHE on first use); projects with dependencies take longer.
    pub command_timeout: Duration,
    /// Its size once built, in MB (`docker images`, built offline from Debian trixie): what a
    /// first use that has to build it says to expect.
    pub approx_mb: u32,
}

pub const KNOWN: &[KnownImage] = &[
    KnownImage {
        name: "python",
        tag: DEFAULT_IMAGE,
        dockerfile: include_str!("../images/python/Dockerfile"),
        packages: include_str!("../images/python/packages"),
        includes: &[],
        command_timeout: Duration::from_secs(120),
        approx_mb: 444,
    },
    KnownImage {
        name: "node",
        tag: "agentbox/node:1",
        dockerfile: include_str!("../images/node/Dockerfile"),
        packages: include_str!("../images/node/packages"),
        includes: &[],
        command_timeout: Duration::from_secs(120),
        approx_mb: 609,
    },
    KnownImage {
        name: "rust",
        tag: "agentbox/rust:1",
        dockerfile: include_str!("../images/rust/Dockerfile"),
        packages: include_str!("../images/rust/packages"),
        includes: &[],
        command_timeout: Duration::from_secs(600),
        approx_mb: 877,
    },
    KnownImage {
        name: "go",
        tag: "agentbox/go:1",
        dockerfile: include_str!("../images/go/Dockerfile"),
        packages: include_str!("../images/go/packages"),
        includes: &[],
        command_timeout: Duration::from_secs(600),
        approx_mb: 663,
    },
    KnownImage {
        name: "polyglot",
        tag: "agentbox/polyglot:2",
        dockerfile: include_str!("../images/polyglot/Dockerfile"),
        packages: include_str!("../images/polyglot/packages"),
        includes: &["python", "node", "rust", "go"],
        command_timeout: Duration::from_secs(600),
        approx_mb: 1340,
    },
];

fn package_lines(text: &'static str) -> impl Iterator<Item = &'static str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

impl KnownImage {
    /// By name (`rust`) or tag (`agentbox/rust:1`).
    pub fn by_name(name: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.name == name || k.tag == name)
    }

    /// By tag only: what `--image` names is a Docker reference, and `rust` there is someone
    /// else's image.
    pub fn by_tag(tag: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.tag == tag)
    }

    /// Every Debian package of the image: the common ones, those of the images it includes,
    /// its own.
    pub fn package_list(&self) -> Vec<&'static str> {
        let included = self
            .includes
            .iter()
            .filter_map(|n| KNOWN.iter().find(|k| k.name == *n))
            .flat_map(|k| package_lines(k.packages));
        let mut list: Vec<&'static str> = Vec::new();
        for p in package_lines(COMMON_PACKAGES)
            .chain(included)
            .chain(package_lines(self.packages))
        {
            if !list.contains(&p) {
                list.push(p);
            }
        }
        list
    }

    fn revision(&self) -> &'static str {
        self.tag.rsplit(':').next().unwrap_or("1")
    }

    /// Where a build puts the image before its toolchain labels are added; overwritten by the
    /// next build, so an interrupted one leaves at most one such tag behind.
    fn unlabelled_tag(&self) -> String {
        format!("{}-unlabelled", self.tag)
    }

    fn context_tar(&self) -> std::io::Result<Vec<u8>> {
        let mut packages = self.package_list().join("\n");
        packages.push('\n');
        tar_of(&[("Dockerfile", self.dockerfile), ("packages", &packages)])
    }
}

fn tar_of(files: &[(&str, &str)]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, body) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, body.as_bytes())?;
    }
    builder.into_inner()
}

pub async fn image_exists(docker: &Docker, image: &str) -> Result<bool, SandboxError> {
    Ok(image_labels(docker, image).await?.is_some())
}

/// The image's labels; `None` if the image is not on the daemon.
pub async fn image_labels(
    docker: &Docker,
    image: &str,
) -> Result<Option<HashMap<String, String>>, SandboxError> {
    match docker.inspect_image(image).await {
        Ok(i) => Ok(Some(i.config.and_then(|c| c.labels).unwrap_or_default())),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
        Err(e) => Err(SandboxError::Docker {
            context: format!("inspect image {image}"),
            source: e,
        }),
    }
}

/// Warnings for the user where `image`'s toolchains (its labels) do not meet what the project
/// at `project` asks for in its root manifests (see `toolchain`). Warnings, not errors: the
/// build tools have the last word, and the task may be to change the requirement. Nothing when
/// Docker or the manifests cannot say.
pub async fn toolchain_warnings(image: &str, project: &Path) -> Vec<String> {
    let root = project.to_path_buf();
    let Ok(needs) = tokio::task::spawn_blocking(move || crate::toolchain::project_requirements(&root)).await
    else {
        return Vec::new();
    };
    if needs.is_empty() {
        return Vec::new();
    }
    let Ok(docker) = crate::sandbox::connect_docker().await else {
        return Vec::new();
    };
    let Ok(Some(labels)) = image_labels(&docker, image).await else {
        return Vec::new();
    };
    let have = crate::toolchain::image_toolchains(&labels);
    needs
        .iter()
        .filter_map(|need| crate::toolchain::toolchain_mismatch(image, &have, need))
        .collect()
}

/// How to get an agentbox image when the daemon does not have it.
fn build_hint(known: &KnownImage) -> String {
    format!(
        "build it with `agentbox image build {0}`, or without a container registry from Debian \
         packages with `agentbox image build {0} --offline` (`just image` builds them all)",
        known.name
    )
}

/// How long a pull may go without a word from the daemon before it counts as failed: a
/// registry that does not answer must not hang a session.
const PULL_STALL: Duration = Duration::from_secs(30);
/// The same for a build through Docker: its first step pulls the Debian base image, so this
/// bounds a registry that does not answer (CI then goes offline); later steps print a line per
/// package.
const BUILD_STALL: Duration = Duration::from_secs(120);

/// Make sure `image` exists: an agentbox image is built through the Docker API, any other is
/// pulled. If neither works, one error says how to get it. `progress` receives build and pull
/// output lines (the caller decides whether they are shown).
pub async fn ensure_image(
    docker: &Docker,
    image: &str,
    cleanup: &Cleanup,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), SandboxError> {
    if image_exists(docker, image).await? {
        return Ok(());
    }
    let missing = |detail: String| SandboxError::ImageMissing {
        image: image.to_string(),
        detail,
    };
    if let Some(known) = KnownImage::by_tag(image) {
        progress(&format!(
            "image {image} is missing; building it from images/{}/Dockerfile",
            known.name
        ));
        let progress = Mutex::new(progress);
        let shared = |line: &str| {
            if let Ok(mut p) = progress.lock() {
                p(line)
            }
        };
        let through_docker = match build_with_docker(docker, known, cleanup, &shared).await {
            Ok(()) => return Ok(()),
            Err(e) => first_line(&e.to_string()).to_string(),
        };
        // No registry (the base image cannot be pulled): build it from Debian packages, as
        // `agentbox image build NAME --offline` would, when mmdebstrap is there to do it.
        if which("mmdebstrap").is_none() {
            return Err(missing(format!(
                " and building it through Docker failed ({through_docker}); {}",
                build_hint(known)
            )));
        }
        shared(&format!(
            "building it through Docker failed ({through_docker}): building {image} from Debian \
             packages instead (about {} MB; on 2 cores a few minutes; `agentbox image build {} --offline` \
             builds it ahead of time)",
            known.approx_mb, known.name
        ));
        let built = build_offline(docker, &[known], None, cleanup, &shared).await;
        return match built.map(|b| b.into_iter().next().map(|b| b.result)) {
            Ok(Some(Ok(took))) => {
                shared(&format!("built {image} in {:.0}s", took.as_secs_f64()));
                Ok(())
            }
            Ok(Some(Err(e))) | Err(e) => Err(missing(format!(
                " and building it failed, through Docker ({through_docker}) and from Debian packages ({}); {}",
                first_line(&e.to_string()),
                build_hint(known)
            ))),
            Ok(None) => Err(missing(format!(" and building it failed ({through_docker})"))),
        };
    }
    progress(&format!("image {image} is missing; pulling it"));
    match pull(docker, image, progress).await {
        Ok(()) => Ok(()),
        Err(why) => {
            // An older revision of an agentbox image: say which one this agentbox uses.
            let newer = image
                .strip_prefix("agentbox/")
                .and_then(|rest| rest.split(':').next())
                .and_then(KnownImage::by_name)
                .map(|k| format!("; this agentbox uses {} instead ({})", k.tag, build_hint(k)))
                .unwrap_or_else(|| {
                    "; pull it where a registry answers (`docker pull`), build it \
                     (`docker build`), or load a saved copy (`docker load`)"
                        .to_string()
                });
            Err(missing(format!(" and pulling it failed ({why}){newer}")))
        }
    }
}

/// The daemon's `Get "https://REGISTRY/v2/": dial tcp: lookup ...` without the request: what
/// went wrong is after it.
fn without_request(message: &str) -> String {
    match message.strip_prefix("Get \"").and_then(|m| m.split_once("\": ")) {
        Some((_, rest)) => rest.to_string(),
        None => message.to_string(),
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// The next item of a daemon's progress stream, or an error once it has been silent `limit`.
async fn next_within<S, T>(stream: &mut S, limit: Duration, what: &str) -> Result<Option<T>, String>
where
    S: Stream<Item = Result<T, bollard::errors::Error>> + Unpin,
{
    match tokio::time::timeout(limit, stream.next()).await {
        Ok(Some(Ok(item))) => Ok(Some(item)),
        Ok(Some(Err(bollard::errors::Error::DockerResponseServerError { message, .. }))) => {
            Err(without_request(&message))
        }
        Ok(Some(Err(e))) => Err(root_cause(&e)),
        Ok(None) => Ok(None),
        Err(_) => Err(format!("no answer from the {what} in {}s", limit.as_secs())),
    }
}

/// `docker pull` through the API.
async fn pull(docker: &Docker, image: &str, progress: &mut (dyn FnMut(&str) + Send)) -> Result<(), String> {
    let opts = CreateImageOptionsBuilder::default().from_image(image).build();
    let mut stream = docker.create_image(Some(opts), None, None);
    while let Some(info) = next_within(&mut stream, PULL_STALL, "registry").await? {
        if let Some(e) = info.error_detail.and_then(|d| d.message) {
            return Err(without_request(&e));
        }
        if let (Some(status), None) = (&info.status, &info.progress_detail) {
            progress(status);
        }
    }
    Ok(())
}

/// `docker build` through the API, from the Dockerfile and package list compiled in; then the
/// toolchain labels.
pub async fn build_with_docker(
    docker: &Docker,
    known: &KnownImage,
    cleanup: &Cleanup,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<(), SandboxError> {
    let unlabelled = known.unlabelled_tag();
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(&unlabelled)
        .rm(true)
        .forcerm(true)
        .buildargs(&HashMap::from([("SUITE", DEBIAN_SUITE)]))
        .build();
    let context = known
        .context_tar()
        .map_err(|e| SandboxError::Other(format!("cannot make the build context: {e}")))?;
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(info) = next_within(&mut stream, BUILD_STALL, "Docker daemon")
        .await
        .map_err(SandboxError::Other)?
    {
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
    if !image_exists(docker, &unlabelled).await? {
        return Err(SandboxError::Other(
            "the build finished without producing the image".into(),
        ));
    }
    add_toolchain_labels(docker, known, &unlabelled, cleanup).await
}

/// Read the toolchain versions from the built image and tag it, with them as labels, as
/// `known.tag`; the unlabelled tag goes.
async fn add_toolchain_labels(
    docker: &Docker,
    known: &KnownImage,
    unlabelled: &str,
    cleanup: &Cleanup,
) -> Result<(), SandboxError> {
    let versions = probe_toolchains(docker, unlabelled, cleanup).await?;
    let mut labels = vec![format!("{SUITE_LABEL}=\"{DEBIAN_SUITE}\"")];
    labels.extend(versions.iter().map(|(t, v)| format!("{}=\"{v}\"", t.label())));
    let dockerfile = format!("FROM {unlabelled}\nLABEL {}\n", labels.join(" "));
    let context = tar_of(&[("Dockerfile", &dockerfile)])
        .map_err(|e| SandboxError::Other(format!("cannot make the build context: {e}")))?;
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(known.tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(info) = next_within(&mut stream, BUILD_STALL, "Docker daemon")
        .await
        .map_err(SandboxError::Other)?
    {
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            return Err(SandboxError::Other(format!(
                "labelling the image failed: {detail}"
            )));
        }
    }
    // The labelled image is built on the unlabelled one: removing the tag only untags it.
    let _ = docker
        .remove_image(
            unlabelled,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        )
        .await;
    if image_exists(docker, known.tag).await? {
        Ok(())
    } else {
        Err(SandboxError::Other(
            "labelling the image finished without producing it".into(),
        ))
    }
}

/// Run the toolchain probe in a locked-down container of `image` (no network, read-only, no
/// capabilities, as nobody) and parse what it prints.
async fn probe_toolchains(
    docker: &Docker,
    image: &str,
    cleanup: &Cleanup,
) -> Result<Vec<(Toolchain, String)>, SandboxError> {
    use bollard::models::{ContainerCreateBody, HostConfig};
    use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};
    let session = format!("image-probe-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let name = format!("agentbox-{session}");
    let labels = HashMap::from([
        (crate::sandbox::SESSION_LABEL.to_string(), session),
        (
            crate::sandbox::PID_LABEL.to_string(),
            std::process::id().to_string(),
        ),
        (
            crate::sandbox::HOST_LABEL.to_string(),
            crate::sandbox::gc::hostname(),
        ),
    ]);
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(vec!["/bin/sh".into(), "-c".into(), probe_script()]),
        entrypoint: Some(vec![]),
        user: Some("65534:65534".into()),
        env: Some(vec![
            "HOME=/tmp".into(),
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ]),
        labels: Some(labels),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                "rw,nosuid,size=64m".to_string(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let registration = cleanup.register(Resource::Creating {
        docker: docker.clone(),
        name: name.clone(),
        volume: false,
    });
    let made = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::default().name(&name).build()),
            body,
        )
        .await;
    let id = match made {
        Ok(m) => {
            cleanup.replace(
                &registration,
                Resource::Container {
                    docker: docker.clone(),
                    id: m.id.clone(),
                    user: "65534:65534".into(),
                },
            );
            m.id
        }
        Err(e) => {
            cleanup.release(registration);
            return Err(SandboxError::Other(format!(
                "cannot create the toolchain probe: {e}"
            )));
        }
    };
    let run = async {
        let mut attach = docker
            .attach_container(
                &id,
                Some(
                    AttachContainerOptionsBuilder::default()
                        .stdout(true)
                        .stderr(true)
                        .stream(true)
                        .build(),
                ),
            )
            .await
            .map_err(|e| format!("attach: {e}"))?;
        docker
            .start_container(&id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| format!("start: {e}"))?;
        let mut text = Vec::new();
        while let Some(Ok(item)) = attach.output.next().await {
            if text.len() < 64 * 1024 {
                text.extend_from_slice(item.as_ref());
            }
        }
        Ok::<_, String>(String::from_utf8_lossy(&text).into_owned())
    };
    let result = tokio::time::timeout(Duration::from_secs(120), run).await;
    crate::sandbox::remove_container(docker, &id).await;
    cleanup.release(registration);
    match result {
        Ok(Ok(text)) => Ok(parse_probe(&text)),
        Ok(Err(e)) => Err(SandboxError::Other(format!("the toolchain probe failed: {e}"))),
        Err(_) => Err(SandboxError::Other(
            "the toolchain probe did not finish in 120s".into(),
        )),
    }
}

/// The APT sources for the offline build: `deb URI SUITE main` lines for [`DEBIAN_SUITE`], from
/// `--mirror`, else from this host's own Debian sources (their URIs, with our suite: the host
/// may run an older release).
fn apt_sources(mirror: Option<&str>) -> Result<String, SandboxError> {
    let uris: Vec<(String, bool)> = match mirror {
        Some(m) => vec![(m.to_string(), false)],
        None => {
            let mut texts = Vec::new();
            if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
                texts.push((t, false));
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
                for p in entries {
                    if let Ok(t) = std::fs::read_to_string(&p) {
                        texts.push((t, p.extension().is_some_and(|e| e == "sources")));
                    }
                }
            }
            let mut uris = Vec::new();
            for (text, deb822) in texts {
                for entry in debian_entries(&text, deb822) {
                    if !uris.contains(&entry) {
                        uris.push(entry);
                    }
                }
            }
            uris
        }
    };
    if uris.is_empty() {
        return Err(SandboxError::Other(
            "no Debian APT sources found on this host; pass --mirror URL (a Debian mirror)".into(),
        ));
    }
    let mut lines = String::new();
    for (uri, security) in uris {
        if security {
            lines.push_str(&format!("deb {uri} {DEBIAN_SUITE}-security main\n"));
        } else {
            lines.push_str(&format!("deb {uri} {DEBIAN_SUITE} main\n"));
            lines.push_str(&format!("deb {uri} {DEBIAN_SUITE}-updates main\n"));
        }
    }
    Ok(lines)
}

/// `(URI, is the security archive)` of each binary-package source with the `main` component,
/// from a one-line-style (`deb [opts] URI SUITE COMPONENT...`) or a deb822 (`.sources`) file.
fn debian_entries(text: &str, deb822: bool) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut add = |uri: &str, suite: &str| {
        let entry = (
            uri.trim_end_matches('/').to_string(),
            suite.ends_with("-security"),
        );
        if !found.contains(&entry) {
            found.push(entry);
        }
    };
    if deb822 {
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
            };
            let (Some(types), Some(uris), Some(suites), Some(components)) = (
                field("Types"),
                field("URIs"),
                field("Suites"),
                field("Components"),
            ) else {
                continue;
            };
            if !types.split_whitespace().any(|t| t == "deb")
                || !components.split_whitespace().any(|c| c == "main")
                || field("Enabled").is_some_and(|e| e.eq_ignore_ascii_case("no"))
            {
                continue;
            }
            for uri in uris.split_whitespace() {
                for suite in suites.split_whitespace() {
                    add(uri, suite);
                }
            }
        }
    } else {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some(rest) = line.strip_prefix("deb ") else {
                continue;
            };
            let rest = rest.trim_start();
            // Options in brackets (`[signed-by=...]`) are the host's business.
            let rest = match rest.strip_prefix('[') {
                Some(r) => r.split_once(']').map_or("", |(_, after)| after),
                None => rest,
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [uri, suite, components @ ..] = words.as_slice()
                && components.contains(&"main")
            {
                add(uri, suite);
            }
        }
    }
    found
}

/// Links the shared `.deb` files into the new root filesystem's APT cache before the download,
/// so that packages an earlier build fetched are not fetched again (a copy where a link cannot
/// be made; the cache is an optimisation, so nothing here fails the build).
const DEBS_IN: &str = r#"d="$1/var/cache/apt/archives"; mkdir -p "$d"
for f in "$AGENTBOX_DEBS"/*.deb; do [ -e "$f" ] || continue; ln "$f" "$d/" 2>/dev/null || cp "$f" "$d/" 2>/dev/null; done; true"#;

/// Adds what this build downloaded to the shared cache, each file under a temporary name and
/// then renamed, so a build running in parallel never sees half a file.
const DEBS_OUT: &str = r#"for f in "$1"/var/cache/apt/archives/*.deb; do
  [ -e "$f" ] || continue; b="$AGENTBOX_DEBS/${f##*/}"; [ -e "$b" ] && continue
  t="$b.part.$$"; { ln "$f" "$t" 2>/dev/null || cp "$f" "$t" 2>/dev/null; } && mv -f "$t" "$b"
done; true"#;

/// What all offline builds of one `agentbox image build` share: the tool, a scratch directory
/// (mmdebstrap's root filesystems are made there), the `.deb` cache and the APT sources.
struct OfflineWork {
    mmdebstrap: PathBuf,
    /// `TMPDIR` for mmdebstrap.
    scratch: PathBuf,
    /// Ours: the `.deb` cache and the sources file; removed on drop. mmdebstrap's own temporary
    /// directories are not in it (they hold mounts while it runs; it removes them itself).
    dir: PathBuf,
}

impl OfflineWork {
    fn debs(&self) -> PathBuf {
        self.dir.join("debs")
    }

    fn sources(&self) -> PathBuf {
        self.dir.join("sources.list")
    }
}

impl Drop for OfflineWork {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where mmdebstrap builds: `TMPDIR` when set; else `/dev/shm` when it is a roomy tmpfs that
/// allows executables (a root filesystem in memory builds twice as fast as on a busy disk;
/// the polyglot image alone is 1.4 GB while it is made); else the system's temporary directory.
fn scratch_dir() -> PathBuf {
    if std::env::var_os("TMPDIR").is_some() {
        return std::env::temp_dir();
    }
    let shm = Path::new("/dev/shm");
    const ROOM: u64 = 6 << 30;
    if free_space_exec(shm).is_some_and(|free| free >= ROOM)
        && mem_available().is_some_and(|m| m >= ROOM + (2 << 30))
    {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

/// Free bytes on the file system of `path`, if it allows executables.
fn free_space_exec(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    if st.f_flag & libc::ST_NOEXEC != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The outcome of one image's offline build.
pub struct Built {
    pub name: &'static str,
    pub result: Result<Duration, SandboxError>,
}

/// Build `images` offline: for each, mmdebstrap makes a minimal Debian root filesystem with its
/// package list and streams it into an import through the Docker API; then the toolchain labels.
/// The downloaded `.deb` files are shared: the polyglot image (which has every package) is built
/// first when it is asked for, then the others in parallel from its downloads.
pub async fn build_offline(
    docker: &Docker,
    images: &[&'static KnownImage],
    mirror: Option<&str>,
    cleanup: &Cleanup,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Vec<Built>, SandboxError> {
    let mmdebstrap = which("mmdebstrap").ok_or_else(|| {
        SandboxError::Other(
            "mmdebstrap is not installed; install the Debian package (apt-get install mmdebstrap) \
             and run this again"
                .into(),
        )
    })?;
    let scratch = scratch_dir();
    let dir = scratch.join(format!("agentbox-build-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("debs"))
        .map_err(|e| SandboxError::Other(format!("cannot create {}: {e}", dir.display())))?;
    let work = OfflineWork {
        mmdebstrap,
        scratch,
        dir,
    };
    std::fs::write(work.sources(), apt_sources(mirror)?)
        .map_err(|e| SandboxError::Other(format!("cannot write the APT sources: {e}")))?;
    progress(&format!(
        "building {} from Debian {DEBIAN_SUITE} in {}",
        images.iter().map(|k| k.name).collect::<Vec<_>>().join(", "),
        work.scratch.display()
    ));
    // An image that includes others downloads the most: it goes first, alone.
    let (first, rest): (Vec<&'static KnownImage>, Vec<&'static KnownImage>) =
        images.iter().partition(|k| !k.includes.is_empty());
    let mut built = Vec::new();
    for known in first {
        let started = Instant::now();
        let result = offline_one(docker, known, &work, cleanup, progress).await;
        built.push(Built {
            name: known.name,
            result: result.map(|()| started.elapsed()),
        });
    }
    let parallel = rest.iter().map(|known| {
        let work = &work;
        async move {
            let started = Instant::now();
            let result = offline_one(docker, known, work, cleanup, progress).await;
            Built {
                name: known.name,
                result: result.map(|()| started.elapsed()),
            }
        }
    });
    built.extend(futures_util::future::join_all(parallel).await);
    Ok(built)
}

/// Sends SIGTERM to mmdebstrap if the build is dropped (Ctrl-C) while it runs: it then unmounts
/// and removes its own temporary root filesystem, which a SIGKILL would leave behind.
struct TermOnDrop(Option<u32>);

impl Drop for TermOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory effects; the pid is our own child's, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

async fn offline_one(
    docker: &Docker,
    known: &'static KnownImage,
    work: &OfflineWork,
    cleanup: &Cleanup,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<(), SandboxError> {
    let include = known.package_list().join(",");
    let mut cmd = tokio::process::Command::new(&work.mmdebstrap);
    cmd.arg("--variant=minbase")
        .arg(format!("--include={include}"))
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        // No fsync per file: the result is streamed into Docker, never kept.
        .arg("--dpkgopt=force-unsafe-io")
        .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
        .arg("--dpkgopt=path-exclude=/usr/share/man/*")
        .arg("--dpkgopt=path-exclude=/usr/share/locale/*")
        .arg(format!("--setup-hook={DEBS_IN}"))
        .arg(format!("--customize-hook={DEBS_OUT}"))
        .arg(DEBIAN_SUITE)
        .arg("-")
        .arg(work.sources())
        .env("TMPDIR", &work.scratch)
        .env("AGENTBOX_DEBS", work.debs())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    progress(&format!(
        "{}: mmdebstrap {DEBIAN_SUITE} with {include}",
        known.name
    ));
    let mut child = cmd
        .spawn()
        .map_err(|e| SandboxError::Other(format!("cannot run mmdebstrap: {e}")))?;
    let mut term = TermOnDrop(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(SandboxError::Other("mmdebstrap's output is not ours".into()));
    };
    let tail = Arc::new(Mutex::new(Vec::<String>::new()));
    let read_stderr = {
        let tail = tail.clone();
        let name = known.name;
        async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("I: ") && !line.contains("hook") {
                    progress(&format!("{name}: {}", &line[3..]));
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                t.push(line);
                let excess = t.len().saturating_sub(15);
                t.drain(..excess);
            }
        }
    };
    let unlabelled = known.unlabelled_tag();
    let import = async {
        let r = import_rootfs(docker, known, &unlabelled, stdout).await;
        if r.is_err() {
            // Nothing reads its output any more: stop it rather than wait minutes for its end.
            drop(TermOnDrop(child.id()));
        }
        r
    };
    let (imported, ()) = tokio::join!(import, read_stderr);
    let status = child
        .wait()
        .await
        .map_err(|e| SandboxError::Other(format!("mmdebstrap: {e}")))?;
    term.0 = None;
    if imported.is_err() || !status.success() {
        // Whatever was imported is a truncated root filesystem.
        let _ = docker
            .remove_image(
                &unlabelled,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
    imported?;
    if !status.success() {
        let tail = tail.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
        return Err(SandboxError::Other(format!(
            "mmdebstrap failed for {} ({status}):\n{tail}",
            known.name
        )));
    }
    progress(&format!("{}: reading the toolchain versions", known.name));
    add_toolchain_labels(docker, known, &unlabelled, cleanup).await
}

async fn import_rootfs(
    docker: &Docker,
    known: &KnownImage,
    tag: &str,
    rootfs: tokio::process::ChildStdout,
) -> Result<(), SandboxError> {
    let (repo, tag) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
    // What the Dockerfile's ENV, WORKDIR, LABEL and CMD lines give the other build.
    let changes = vec![
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "ENV LANG=C.UTF-8".to_string(),
        "WORKDIR /workspace".to_string(),
        format!(
            "LABEL {IMAGE_LABEL}=\"{}\" {IMAGE_LABEL}.revision=\"{}\"",
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
    let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(rootfs));
    // The daemon answers once it has read the whole root filesystem, which mmdebstrap writes
    // only at its end, minutes from now: the client's default timeout (for the answer) would
    // cut the import. mmdebstrap's end bounds it.
    let docker = docker.clone().with_timeout(Duration::from_secs(4 * 3600));
    let mut stream = docker.create_image(Some(opts), Some(body), None);
    while let Some(item) = stream.next().await {
        item.map_err(|e| SandboxError::Other(format!("import failed: {e}")))?;
    }
    Ok(())
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Print build progress lines to stderr.
pub fn stderr_progress(line: &str) {
    errln!("  {}", crate::output::escaped(line));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_builds_read_one_package_list() {
        let python = KnownImage::by_name("python").unwrap();
        let list = python.package_list();
        for p in [
            "python3",
            "python3-pytest",
            "python3-pip",
            "python3-venv",
            "git",
            "ripgrep",
            "procps",
            "make",
            "gcc",
            "libc6-dev",
            "ca-certificates",
        ] {
            assert!(list.contains(&p), "{p} missing from {list:?}");
        }
        assert!(python.dockerfile.contains("COPY packages"));
        assert!(KnownImage::by_name(DEFAULT_IMAGE).is_some());
        assert!(
            KnownImage::by_tag("python").is_none(),
            "`--image python` is Docker Hub's"
        );
    }

    #[test]
    fn every_image_has_the_common_tools_and_polyglot_has_everything() {
        let polyglot = KnownImage::by_name("polyglot").unwrap().package_list();
        for k in KNOWN {
            let list = k.package_list();
            for common in [
                "git",
                "ripgrep",
                "procps",
                "make",
                "gcc",
                "libc6-dev",
                "ca-certificates",
            ] {
                assert!(list.contains(&common), "{}: no {common}", k.name);
            }
            for p in &list {
                assert!(polyglot.contains(p), "polyglot lacks {p} of {}", k.name);
            }
            // The Dockerfile's labels agree with the tag, and it takes the one suite.
            assert!(
                k.dockerfile.contains(&format!(
                    "LABEL org.agentbox.image=\"{}\" org.agentbox.image.revision=\"{}\"",
                    k.name,
                    k.revision()
                )),
                "{}",
                k.name
            );
            assert!(k.dockerfile.contains("FROM debian:${SUITE}-slim"), "{}", k.name);
            assert_eq!(k.tag, format!("agentbox/{}:{}", k.name, k.revision()));
        }
        for (name, tool) in [("node", "npm"), ("rust", "cargo"), ("go", "golang-go")] {
            assert!(KnownImage::by_name(name).unwrap().package_list().contains(&tool));
        }
    }

    #[test]
    fn the_build_context_holds_the_dockerfile_and_the_whole_package_list() {
        let known = KnownImage::by_name("rust").unwrap();
        let tar = known.context_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut files = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut body = String::new();
            std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
            files.push((name, body));
        }
        assert_eq!(files[0].0, "Dockerfile");
        assert_eq!(files[1].0, "packages");
        let listed: Vec<&str> = files[1].1.lines().collect();
        assert_eq!(listed, known.package_list());
    }

    #[test]
    fn a_failed_pull_says_why_without_the_request() {
        assert_eq!(
            without_request(
                "Get \"https://registry.example/v2/\": dial tcp: lookup registry.example: no such host"
            ),
            "dial tcp: lookup registry.example: no such host"
        );
        assert_eq!(without_request("manifest unknown"), "manifest unknown");
    }

    #[test]
    fn the_offline_sources_name_our_suite_whatever_the_host_runs() {
        let deb822 = "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n";
        assert_eq!(
            debian_entries(deb822, true),
            [
                ("http://mirror.example/debian".to_string(), false),
                ("http://mirror.example/debian-security".to_string(), true)
            ]
        );
        let one_line = "deb [signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib\n# deb http://old.example/debian bookworm main\ndeb http://third.example/repo bookworm stable\n";
        assert_eq!(
            debian_entries(one_line, false),
            [("http://mirror.example/debian".to_string(), false)]
        );
        let lines = apt_sources(Some("http://mirror.example/debian")).unwrap();
        assert_eq!(
            lines,
            format!(
                "deb http://mirror.example/debian {DEBIAN_SUITE} main\ndeb http://mirror.example/debian {DEBIAN_SUITE}-updates main\n"
            )
        );
        assert!(!lines.contains("sid") && !lines.contains("testing") && !lines.contains("unstable"));
    }
}
