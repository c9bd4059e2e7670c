//! What toolchains an image has: a probe container of the built image prints their versions,
//! and a one-line build on top of it records them as labels (`org.agentbox.toolchain.rust=
//! 1.85.0`), so a session compares them with what a project asks for without starting anything.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::BuildImageOptionsBuilder;
use futures_util::StreamExt;

use super::catalogue::{KnownImage, tar_of};
use super::stream::{BUILD_STALL, next_within};
use super::{DEBIAN_SUITE, ImageError, SUITE_LABEL, image_exists};
use crate::Cleanup;

/// A toolchain agentbox's images carry, with its version recorded as an image label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Toolchain {
    Python,
    Node,
    Rust,
    Go,
}

impl Toolchain {
    pub const ALL: [Toolchain; 4] = [Toolchain::Python, Toolchain::Node, Toolchain::Rust, Toolchain::Go];

    /// The image label holding its version, e.g. `org.agentbox.toolchain.rust=1.85.0`.
    pub fn label(self) -> &'static str {
        match self {
            Toolchain::Python => "org.agentbox.toolchain.python",
            Toolchain::Node => "org.agentbox.toolchain.node",
            Toolchain::Rust => "org.agentbox.toolchain.rust",
            Toolchain::Go => "org.agentbox.toolchain.go",
        }
    }

    pub fn display(self) -> &'static str {
        match self {
            Toolchain::Python => "Python",
            Toolchain::Node => "Node.js",
            Toolchain::Rust => "Rust",
            Toolchain::Go => "Go",
        }
    }

    /// The command that prints its version (the build's probe runs it).
    pub(crate) fn version_command(self) -> &'static str {
        match self {
            Toolchain::Python => "python3 --version",
            Toolchain::Node => "node --version",
            Toolchain::Rust => "rustc --version",
            Toolchain::Go => "go version",
        }
    }

    fn by_key(key: &str) -> Option<Toolchain> {
        Toolchain::ALL.into_iter().find(|t| t.key() == key)
    }

    /// The short name in labels and the probe's output.
    pub fn key(self) -> &'static str {
        self.label().rsplit('.').next().unwrap_or("")
    }
}

/// A shell script printing `KEY=OUTPUT` for each toolchain present (`rust=rustc 1.85.0 (...)`).
pub(crate) fn probe_script() -> String {
    let mut script = String::from(
        "v() { command -v \"$2\" >/dev/null 2>&1 || return 0; printf '%s=%s\\n' \"$1\" \"$(\"$2\" \"$3\" 2>&1 | head -n 1)\"; }\n",
    );
    for t in Toolchain::ALL {
        let mut words = t.version_command().split(' ');
        let program = words.next().unwrap_or("");
        let arg = words.next().unwrap_or("");
        script.push_str(&format!("v {} {program} {arg}\n", t.key()));
    }
    script
}

/// The versions found in the probe's output.
pub(crate) fn parse_probe(output: &str) -> Vec<(Toolchain, String)> {
    output
        .lines()
        .filter_map(|line| {
            let (key, text) = line.split_once('=')?;
            let version = extract_version(text)?;
            Some((Toolchain::by_key(key.trim())?, version))
        })
        .collect()
}

/// The first dotted number in `text`: `rustc 1.85.0 (...)` → `1.85.0`, `go version go1.24.4
/// linux/amd64` → `1.24.4`, `v20.19.2` → `20.19.2`.
pub(crate) fn extract_version(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(u8::is_ascii_digit)?;
    let end = bytes[start..]
        .iter()
        .position(|b| !(b.is_ascii_digit() || *b == b'.'))
        .map_or(bytes.len(), |n| start + n);
    let v = text[start..end].trim_end_matches('.');
    v.contains('.').then(|| v.to_string())
}

/// The toolchain versions an image's labels record (none for images agentbox did not build).
pub fn image_toolchains(labels: &HashMap<String, String>) -> Vec<(Toolchain, String)> {
    Toolchain::ALL
        .into_iter()
        .filter_map(|t| labels.get(t.label()).map(|v| (t, v.clone())))
        .collect()
}

/// Read the toolchain versions from the built image and tag it, with them and the suite as
/// labels, as `known.tag`; the unlabelled tag goes. A service image has no toolchain to read
/// (and no shell command of a project ever runs in it): it gets the suite's label only.
pub(super) async fn add_toolchain_labels(
    docker: &Docker,
    known: &KnownImage,
    unlabelled: &str,
    cleanup: &Cleanup,
) -> Result<(), ImageError> {
    let versions = if known.is_sandbox() {
        probe_toolchains(docker, unlabelled, cleanup).await?
    } else {
        Vec::new()
    };
    let mut labels = vec![format!("{SUITE_LABEL}=\"{DEBIAN_SUITE}\"")];
    labels.extend(versions.iter().map(|(t, v)| format!("{}=\"{v}\"", t.label())));
    let dockerfile = format!("FROM {unlabelled}\nLABEL {}\n", labels.join(" "));
    let context = tar_of(&[("Dockerfile", &dockerfile)]).map_err(ImageError::Context)?;
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(known.tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(info) = next_within(&mut stream, BUILD_STALL, "Docker daemon").await? {
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            return Err(ImageError::Label(detail));
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
        Err(ImageError::NotProduced("labelling the image"))
    }
}

/// Run the toolchain probe in a locked-down container of `image` (the helpers' lockdown, as
/// nobody, with a small writable `/tmp`) and parse what it prints.
async fn probe_toolchains(
    docker: &Docker,
    image: &str,
    cleanup: &Cleanup,
) -> Result<Vec<(Toolchain, String)>, ImageError> {
    use bollard::query_parameters::AttachContainerOptionsBuilder;
    const NOBODY: &str = "65534:65534";
    let session = format!("image-probe-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let name = format!("agentbox-{session}");
    let labels = HashMap::from([
        (crate::SESSION_LABEL.to_string(), session),
        (crate::PID_LABEL.to_string(), std::process::id().to_string()),
        (crate::HOST_LABEL.to_string(), crate::gc::hostname()),
    ]);
    let engine = crate::flavor::info(docker).await;
    let mut body = crate::policy::locked_down(crate::policy::Helper {
        image,
        user: NOBODY,
        cmd: vec!["/bin/sh".into(), "-c".into(), probe_script()],
        labels,
        engine: &engine,
        runtime: None,
        max_file_bytes: 64 << 20,
    });
    body.env = Some(vec![
        "HOME=/tmp".into(),
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    ]);
    body.attach_stdout = Some(true);
    body.attach_stderr = Some(true);
    if let Some(hc) = body.host_config.as_mut() {
        hc.tmpfs = Some(HashMap::from([(
            "/tmp".to_string(),
            "rw,nosuid,size=64m".to_string(),
        )]));
    }
    let (id, registration) = crate::containers::create_tracked(
        docker,
        cleanup,
        &name,
        body,
        "create the toolchain probe",
        NOBODY.into(),
    )
    .await
    .map_err(|e| ImageError::Probe(format!("could not be created: {e}")))?;
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
    crate::api::remove_container(docker, &id).await;
    cleanup.release(registration);
    match result {
        Ok(Ok(text)) => Ok(parse_probe(&text)),
        Ok(Err(e)) => Err(ImageError::Probe(format!("failed: {e}"))),
        Err(_) => Err(ImageError::Probe("did not finish in 120s".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_out_of_what_the_tools_print() {
        assert_eq!(
            extract_version("rustc 1.85.0 (4d91de4e4 2025-02-17) (built from a source tarball)").as_deref(),
            Some("1.85.0")
        );
        assert_eq!(
            extract_version("go version go1.24.4 linux/amd64").as_deref(),
            Some("1.24.4")
        );
        assert_eq!(extract_version("v20.19.2").as_deref(), Some("20.19.2"));
        assert_eq!(extract_version("Python 3.13.5").as_deref(), Some("3.13.5"));
        assert_eq!(extract_version("sh: 1: node: not found"), None);
        let probe = "python=Python 3.13.5\nrust=rustc 1.85.0 (x)\nbogus=1.2\ngo=\n";
        assert_eq!(
            parse_probe(probe),
            [
                (Toolchain::Python, "3.13.5".to_string()),
                (Toolchain::Rust, "1.85.0".to_string())
            ]
        );
        assert!(probe_script().contains("v go go version\n"));
    }
}
