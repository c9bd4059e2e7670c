//! TLS to the registries setup would reach, from a sandbox.

use bollard::Docker;

use super::{Level, Report};
use crate::cli::DoctorArgs;
use crate::config::SandboxConfig;
use crate::project::Ecosystem;
use crate::sandbox::image::image_labels;
use crate::toolchain::{Toolchain, image_toolchains};

/// The image and ecosystems a run would set up: the project's (`detected`), else the default
/// image's own toolchains.
pub(super) async fn to_check(
    docker: &Docker,
    cfg: &SandboxConfig,
    detected: Option<(String, Vec<Ecosystem>)>,
) -> (String, Vec<Ecosystem>) {
    match detected {
        Some(d) => d,
        None => {
            let labels = image_labels(docker, &cfg.image)
                .await
                .ok()
                .flatten()
                .unwrap_or_default();
            let ecosystems = image_toolchains(&labels)
                .into_iter()
                .map(|(t, _)| ecosystem_of(t))
                .collect::<Vec<_>>();
            (cfg.image.clone(), ecosystems)
        }
    }
}

fn ecosystem_of(t: Toolchain) -> Ecosystem {
    match t {
        Toolchain::Python => Ecosystem::Python,
        Toolchain::Node => Ecosystem::Node,
        Toolchain::Rust => Ecosystem::Rust,
        Toolchain::Go => Ecosystem::Go,
    }
}

/// TLS to each registry setup would reach, verified from a sandbox of `image` through the
/// egress proxy with the trust setup passes in: a re-signing proxy the sandbox does not trust
/// is found here, before a setup fails on it.
pub(super) async fn check_registries(
    cfg: &SandboxConfig,
    args: &DoctorArgs,
    image: String,
    ecosystems: &[Ecosystem],
    r: &mut Report,
) {
    let allow = match args
        .allow_host
        .iter()
        .map(|h| h.parse::<crate::egress::Rule>())
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(a) => a,
        Err(e) => {
            r.line(Level::Fail, "registries", format!("--allow-host: {e}"), None);
            return;
        }
    };
    let setup = crate::config::SetupSettings {
        allow,
        no_default_registries: args.no_default_registries,
        trust: crate::config::TrustSettings::from_args(&args.trust),
        ..Default::default()
    };
    let mut cfg = cfg.clone();
    cfg.image = image;
    let check = match crate::session::setup_phase::check_registry_tls(&cfg, &setup, ecosystems).await {
        Ok(c) => c,
        Err(e @ crate::session::setup_phase::SetupError::Remote { .. }) => {
            r.line(Level::Warn, "registries", format!("not checked: {e}"), None);
            return;
        }
        Err(e) => {
            // Not a finding about TLS: the policy check above already fails when no sandbox
            // starts.
            r.line(Level::Warn, "registries", format!("cannot check TLS: {e}"), None);
            return;
        }
    };
    for note in &check.notes {
        r.line(Level::Ok, "registries", note.trim_start_matches("setup: "), None);
    }
    if check.results.is_empty() {
        r.line(
            Level::Ok,
            "registries",
            format!(
                "none to check in {} (no default registry for its ecosystems, no --allow-host)",
                cfg.image
            ),
            None,
        );
    }
    for (host, verdict) in &check.results {
        use crate::session::setup_phase::TlsVerdict;
        match verdict {
            TlsVerdict::Verified => r.line(
                Level::Ok,
                "registries",
                format!(
                    "TLS to {host} verifies from {} (trusting the image's CAs and {})",
                    cfg.image, check.trusted
                ),
                None,
            ),
            TlsVerdict::Untrusted(why) => r.line(
                Level::Fail,
                "registries",
                format!("TLS to {host} does not verify from {}: {why}", cfg.image),
                Some(&check.hint),
            ),
            TlsVerdict::Unreachable(why) => r.line(
                Level::Warn,
                "registries",
                format!("{host} not reached from {} through the proxy: {why}", cfg.image),
                Some("setup needs it reachable: check this network's route or proxy to it"),
            ),
        }
    }
}
