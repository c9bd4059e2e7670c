//! `agentbox doctor`: check everything a run depends on and say how to fix what is wrong.
//! Each thing checked is a step of its own, in the file of what it is about; they all report
//! through one [`Report`].

mod engine;
mod images;
mod kernel;
mod policy;
mod project;
mod registries;

use bollard::Docker;

use crate::cli::DoctorArgs;
use crate::config::SandboxConfig;
use crate::sandbox::Cleanup;
use crate::sandbox::{connect_docker, docker_endpoint, gc};

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Report {
    problems: usize,
}

impl Report {
    fn line(&mut self, level: Level, what: &str, detail: impl AsRef<str>, fix: Option<&str>) {
        let mark = match level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        outln!(
            "[{}] {}: {}",
            mark,
            crate::output::escaped(what),
            crate::output::escaped(detail.as_ref())
        );
        if let Some(fix) = fix {
            outln!("       fix: {}", crate::output::escaped(fix));
        }
        if level == Level::Fail {
            self.problems += 1;
        }
    }
}

pub async fn run(args: DoctorArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    let mut cfg = SandboxConfig::from_args(&args.sandbox)?;
    cfg.cleanup = cleanup;
    // The policy probes check the sandbox; services (a config file's) would only slow them and
    // need their images. doctor says which service images are missing instead.
    cfg.services.clear();
    let mut r = Report { problems: 0 };

    let endpoint = docker_endpoint();
    let docker = match connect_docker().await {
        Ok(d) => d,
        Err(e) => {
            r.line(
                Level::Fail,
                "docker",
                e.to_string(),
                Some(
                    "start the daemon (e.g. `sudo systemctl start docker`, or `sudo dockerd &`), \
                      or point DOCKER_HOST at one; check you may use its socket (the docker group)",
                ),
            );
            return Ok(1);
        }
    };
    let engine = match crate::sandbox::EngineInfo::detect(&docker).await {
        Ok(engine) => engine,
        Err(e) => {
            r.line(Level::Fail, "docker", format!("version query failed: {e}"), None);
            return Ok(1);
        }
    };
    engine::check_engine(&engine, &endpoint, &cfg, &mut r);
    engine::check_runtimes(&docker, &cfg, engine.is_podman(), &mut r).await;
    let image_ok = images::check_image(&docker, &cfg, &mut r).await;
    let mut detected = None;
    if let Some(project) = &args.project {
        project::check_project(project, &mut r);
        detected = project::check_detection(&docker, &cfg, project, &mut r).await;
    }
    if image_ok {
        policy::check_policy(&docker, &cfg, engine.enforces_limits(), &mut r).await;
    }
    if args.no_network {
        r.line(Level::Ok, "registries", "not checked (--no-network)", None);
    } else if image_ok || detected.is_some() {
        let (image, ecosystems) = registries::to_check(&docker, &cfg, detected).await;
        registries::check_registries(&cfg, &args, image, &ecosystems, &mut r).await;
    }
    check_leftovers(&docker, &mut r).await;

    if r.problems == 0 {
        outln!("\nall checks passed");
        Ok(0)
    } else {
        outln!("\n{} problem(s) found", r.problems);
        Ok(1)
    }
}

/// Containers and volumes left by agentbox processes that are gone.
async fn check_leftovers(docker: &Docker, r: &mut Report) {
    match gc::collect(docker, false, true)
        .await
        .map(|g| g.containers_removed.len() + g.volumes_removed.len())
    {
        Ok(0) => r.line(
            Level::Ok,
            "leftovers",
            "no containers or volumes left by killed runs",
            None,
        ),
        Ok(n) => r.line(
            Level::Warn,
            "leftovers",
            format!("{n} left by agentbox processes that are gone"),
            Some("agentbox gc"),
        ),
        Err(e) => r.line(Level::Warn, "leftovers", format!("cannot list: {e}"), None),
    }
}
