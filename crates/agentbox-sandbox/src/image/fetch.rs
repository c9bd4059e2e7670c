//! Getting an image onto the engine: agentbox's own built through the Docker API from the
//! compiled-in context (offline from Debian packages when no registry answers), any other
//! pulled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};

use super::catalogue::{KnownImage, build_hint};
use super::offline::{build_offline, which};
use super::stream::{BUILD_STALL, next_within, without_request};
use super::toolchain::add_toolchain_labels;
use super::{DEBIAN_SUITE, ImageError, image_exists};
use crate::Cleanup;

/// How long a pull may go without a word from the daemon before it counts as failed: a
/// registry that does not answer must not hang a session.
const PULL_STALL: Duration = Duration::from_secs(30);
/// Make sure `image` exists: an agentbox image is built through the Docker API, any other is
/// pulled. If neither works, one error says how to get it. `progress` receives build and pull
/// output lines (the caller decides whether they are shown).
pub async fn ensure_image(
    docker: &Docker,
    image: &str,
    cleanup: &Cleanup,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), ImageError> {
    if image_exists(docker, image).await? {
        return Ok(());
    }
    let missing = |detail: String| ImageError::Missing {
        image: image.to_string(),
        detail,
    };
    if let Some(known) = KnownImage::by_tag(image) {
        progress(&format!(
            "image {image} is missing; building it from images/Dockerfile and images/{}/packages",
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

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// `docker pull` through the API.
async fn pull(
    docker: &Docker,
    image: &str,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), ImageError> {
    let opts = CreateImageOptionsBuilder::default().from_image(image).build();
    let mut stream = docker.create_image(Some(opts), None, None);
    while let Some(info) = next_within(&mut stream, PULL_STALL, "registry").await? {
        if let Some(e) = info.error_detail.and_then(|d| d.message) {
            return Err(ImageError::Daemon(without_request(&e)));
        }
        if let (Some(status), None) = (&info.status, &info.progress_detail) {
            progress(status);
        }
    }
    Ok(())
}

/// `docker build` through the API, from the Dockerfile and package list compiled in; then the
/// labels (a sandbox's toolchains).
pub async fn build_with_docker(
    docker: &Docker,
    known: &KnownImage,
    cleanup: &Cleanup,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<(), ImageError> {
    let unlabelled = known.unlabelled_tag();
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(&unlabelled)
        .rm(true)
        .forcerm(true)
        .buildargs(&HashMap::from([("SUITE", DEBIAN_SUITE)]))
        .build();
    let context = known.context_tar().map_err(ImageError::Context)?;
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(info) = next_within(&mut stream, BUILD_STALL, "Docker daemon").await? {
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            return Err(ImageError::Daemon(detail));
        }
        if let Some(line) = info.stream {
            let line = line.trim_end();
            if !line.is_empty() {
                progress(line);
            }
        }
    }
    if !image_exists(docker, &unlabelled).await? {
        return Err(ImageError::NotProduced("the build"));
    }
    add_toolchain_labels(docker, known, &unlabelled, cleanup).await
}
