//! Images: agentbox's own (`images/NAME/`: the sandboxes, and the test services' databases),
//! built through the Docker API from a tar context, or offline from Debian packages
//! (mmdebstrap → import through the API) where no registry is reachable; any other image is
//! pulled through the API.
//!
//! Both builds end the same way: for a sandbox image a probe container reads the toolchain
//! versions from the built image, and a one-line build on top of it records them as labels
//! (`org.agentbox.toolchain.rust=1.85.0`), so a session can compare them with what a project
//! asks for without starting anything (see `toolchain`); a service image gets the suite's
//! label only.

mod catalogue;
mod debian;
mod fetch;
mod offline;
mod stream;
mod toolchain;

use std::collections::HashMap;

use bollard::Docker;

pub use catalogue::{ImageKind, KNOWN, KnownImage, SERVICE_DATA_DIR, ServiceDef};
pub(crate) use catalogue::{MARIADB, POSTGRES, REDIS};
pub use fetch::{build_with_docker, ensure_image};
pub use offline::{Built, build_offline, which};
pub use toolchain::{Toolchain, image_toolchains};

/// The one Debian suite every agentbox image is built from, by both builds: the newest stable
/// release the archive serves. Never a testing or unstable suite: the images must build the
/// same way for months.
pub const DEBIAN_SUITE: &str = "trixie";

/// The image used when `--image` is not given.
pub const DEFAULT_IMAGE: &str = "agentbox/python:3";

/// Label naming an agentbox image (`python`, `rust`...).
pub(crate) const IMAGE_LABEL: &str = "org.agentbox.image";
/// Label naming the Debian suite an agentbox image was built from.
pub(crate) const SUITE_LABEL: &str = "org.agentbox.image.suite";

/// Why an image could not be had, built or read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image {image} is missing{detail}")]
    Missing { image: String, detail: String },
    #[error("cannot {context}: {source}")]
    Docker {
        context: String,
        #[source]
        source: bollard::errors::Error,
    },
    /// What the daemon said while building or pulling (its own words).
    #[error("{0}")]
    Daemon(String),
    #[error("no answer from the {what} in {secs}s")]
    Stalled { what: &'static str, secs: u64 },
    #[error("cannot make the build context: {0}")]
    Context(#[source] std::io::Error),
    #[error("{0} finished without producing the image")]
    NotProduced(&'static str),
    #[error("labelling the image failed: {0}")]
    Label(String),
    #[error("the toolchain probe {0}")]
    Probe(String),
    #[error("no Debian APT sources found on this host; pass --mirror URL (a Debian mirror)")]
    NoAptSources,
    #[error(
        "mmdebstrap is not installed; install the Debian package (apt-get install mmdebstrap) \
         and run this again"
    )]
    NoMmdebstrap,
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("mmdebstrap failed for {image} ({status}):\n{tail}")]
    Mmdebstrap {
        image: &'static str,
        status: std::process::ExitStatus,
        tail: String,
    },
}

pub async fn image_exists(docker: &Docker, image: &str) -> Result<bool, ImageError> {
    Ok(image_labels(docker, image).await?.is_some())
}

/// The image's labels; `None` if the image is not on the daemon.
pub async fn image_labels(
    docker: &Docker,
    image: &str,
) -> Result<Option<HashMap<String, String>>, ImageError> {
    match docker.inspect_image(image).await {
        Ok(i) => Ok(Some(i.config.and_then(|c| c.labels).unwrap_or_default())),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
        Err(e) => Err(ImageError::Docker {
            context: format!("inspect image {image}"),
            source: e,
        }),
    }
}
