//! The daemon's progress streams (a pull, a build): each item within a bound of silence, its
//! errors in the daemon's own words without the request that failed.

use std::time::Duration;

use futures_util::{Stream, StreamExt};

use super::ImageError;
use crate::api::root_cause;

/// The same for a build through Docker: its first step pulls the Debian base image, so this
/// bounds a registry that does not answer (CI then goes offline); later steps print a line per
/// package.
pub(super) const BUILD_STALL: Duration = Duration::from_secs(120);

/// The next item of a daemon's progress stream, or an error once it has been silent `limit`.
pub(super) async fn next_within<S, T>(
    stream: &mut S,
    limit: Duration,
    what: &'static str,
) -> Result<Option<T>, ImageError>
where
    S: Stream<Item = Result<T, bollard::errors::Error>> + Unpin,
{
    match tokio::time::timeout(limit, stream.next()).await {
        Ok(Some(Ok(item))) => Ok(Some(item)),
        Ok(Some(Err(bollard::errors::Error::DockerResponseServerError { message, .. }))) => {
            Err(ImageError::Daemon(without_request(&message)))
        }
        Ok(Some(Err(e))) => Err(ImageError::Daemon(root_cause(&e))),
        Ok(None) => Ok(None),
        Err(_) => Err(ImageError::Stalled {
            what,
            secs: limit.as_secs(),
        }),
    }
}

/// The daemon's `Get "https://REGISTRY/v2/": dial tcp: lookup ...` without the request: what
/// went wrong is after it.
pub(super) fn without_request(message: &str) -> String {
    match message.strip_prefix("Get \"").and_then(|m| m.split_once("\": ")) {
        Some((_, rest)) => rest.to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
