//! agentbox's images, and the one the policy check runs.

use bollard::Docker;

use super::{Level, Report};
use crate::config::SandboxConfig;
use crate::sandbox::image::{KNOWN, KnownImage, image_exists, image_labels, which};
use crate::toolchain::image_toolchains;

pub(super) async fn check_image(docker: &Docker, cfg: &SandboxConfig, r: &mut Report) -> bool {
    // agentbox's images: which are here. A session picks a sandbox by project, so any may be
    // needed; a service image only by a session asking for that service.
    let mut missing = Vec::new();
    let mut present = Vec::new();
    let mut services_missing = Vec::new();
    let mut services_present = Vec::new();
    for known in KNOWN {
        match image_labels(docker, known.tag).await {
            Ok(Some(_)) if known.service().is_some() => services_present.push(known.tag.to_string()),
            Ok(Some(labels)) => {
                let tools: Vec<String> = image_toolchains(&labels)
                    .into_iter()
                    .map(|(t, v)| format!("{} {v}", t.display()))
                    .collect();
                present.push(format!("{} ({})", known.tag, tools.join(", ")));
            }
            Ok(None) if known.service().is_some() => services_missing.push(known),
            Ok(None) => missing.push(known),
            Err(e) => {
                r.line(Level::Fail, "images", e.to_string(), None);
                return false;
            }
        }
    }
    if !present.is_empty() {
        r.line(
            Level::Ok,
            "images",
            format!("present: {}", present.join("; ")),
            None,
        );
    }
    if !missing.is_empty() {
        let tags: Vec<&str> = missing.iter().map(|k| k.tag).collect();
        r.line(
            Level::Warn,
            "images",
            format!(
                "missing: {} (a session whose project needs one builds it, which needs a registry)",
                tags.join(", ")
            ),
            Some(&build_fix(&missing)),
        );
    }
    if !services_present.is_empty() {
        r.line(
            Level::Ok,
            "services",
            format!("present: {}", services_present.join("; ")),
            None,
        );
    }
    if !services_missing.is_empty() {
        let tags: Vec<&str> = services_missing.iter().map(|k| k.tag).collect();
        r.line(
            Level::Warn,
            "services",
            format!(
                "missing: {} (needed only by a session with --service)",
                tags.join(", ")
            ),
            Some(&build_fix(&services_missing)),
        );
    }
    // The image this check runs (`--image`, or the default).
    if KnownImage::by_tag(&cfg.image).is_some() {
        let here = !missing
            .iter()
            .chain(&services_missing)
            .any(|k| k.tag == cfg.image);
        if !here {
            r.line(
                Level::Fail,
                "image",
                format!("{}, which the policy check below runs, is missing", cfg.image),
                None,
            );
        }
        return here;
    }
    match image_exists(docker, &cfg.image).await {
        Ok(true) => {
            r.line(Level::Ok, "image", format!("{} present", cfg.image), None);
            true
        }
        Ok(false) => {
            r.line(
                Level::Fail,
                "image",
                format!("{} is missing", cfg.image),
                Some("pull or load that image (docker pull, docker load), or drop --image to use agentbox's own"),
            );
            false
        }
        Err(e) => {
            r.line(Level::Fail, "image", e.to_string(), None);
            false
        }
    }
}

/// How to build the missing images.
fn build_fix(missing: &[&KnownImage]) -> String {
    let names: Vec<&str> = missing.iter().map(|k| k.name).collect();
    if which("mmdebstrap").is_some() {
        format!(
            "agentbox image build {0}   (needs a registry), or offline: agentbox image build {0} --offline   (just image builds them all)",
            names.join(" ")
        )
    } else {
        format!(
            "agentbox image build {0}   (needs a registry), or offline: apt-get install mmdebstrap && agentbox image build {0} --offline",
            names.join(" ")
        )
    }
}
