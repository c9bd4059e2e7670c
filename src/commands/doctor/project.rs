//! The project given with `--project`: who owns it, and what a run would choose for it.

use std::path::Path;

use bollard::Docker;

use super::{Level, Report};
use crate::config::SandboxConfig;
use crate::project::Ecosystem;
use crate::sandbox::image::{KnownImage, image_exists};

pub(super) fn check_project(project: &Path, r: &mut Report) {
    match crate::sandbox::bind_workspace(project, &Default::default()) {
        Ok((_, uid, gid)) => {
            if uid == 0 {
                r.line(
                    Level::Warn,
                    "project",
                    format!(
                        "{} is owned by root: commands will run as uid 0 (with no capabilities)",
                        project.display()
                    ),
                    Some("chown the project to an ordinary user so the sandbox runs as that user"),
                );
            } else {
                r.line(
                    Level::Ok,
                    "project",
                    format!(
                        "{} is owned by {uid}:{gid}: the sandbox's commands run as {uid}:{gid} on it",
                        project.display()
                    ),
                    None,
                );
            }
            if let Ok(home) = std::env::var("HOME")
                && Path::new(&home).canonicalize().ok() == project.canonicalize().ok()
            {
                r.line(
                    Level::Warn,
                    "project",
                    "this is your home directory: the model could read your keys and dotfiles",
                    Some("point agentbox at a project directory, not $HOME"),
                );
            }
        }
        Err(e) => r.line(Level::Fail, "project", e.to_string(), None),
    }
}

/// What `run` would choose for the project: its image (and whether it is here) and its test
/// commands, with what detection left out.
/// The image a run would use and the project's ecosystems, when that image is here.
pub(super) async fn check_detection(
    docker: &Docker,
    cfg: &SandboxConfig,
    project: &Path,
    r: &mut Report,
) -> Option<(String, Vec<Ecosystem>)> {
    if !project.is_dir() {
        return None;
    }
    let root = project.to_path_buf();
    let Ok(detection) = tokio::task::spawn_blocking(move || crate::project::detect(&root)).await else {
        return None;
    };
    let mut usable = None;
    let choice = crate::session::choose_image(cfg, project, &detection).await;
    for note in &choice.notes {
        r.line(Level::Warn, "project", note, None);
    }
    match image_exists(docker, &choice.image).await {
        Ok(true) => {
            r.line(
                Level::Ok,
                "project",
                format!("runs in {} ({})", choice.image, choice.reason),
                None,
            );
            usable = Some((
                choice.image.clone(),
                detection.ecosystems.iter().map(|(e, _)| *e).collect(),
            ));
        }
        _ => r.line(
            Level::Fail,
            "project",
            format!("runs in {} ({}), which is missing", choice.image, choice.reason),
            Some(if KnownImage::by_name(&choice.image).is_some() {
                "`agentbox image list` names it; `agentbox image build NAME --offline` builds it"
            } else {
                "pull or build it, or pass --image"
            }),
        ),
    }
    let commands = detection.command_lines();
    if commands.is_empty() {
        r.line(
            Level::Warn,
            "project",
            "no test command detected: agentbox cannot judge a run",
            Some("pass --test-cmd"),
        );
    } else {
        r.line(
            Level::Ok,
            "project",
            format!("tests: {} (all must pass)", commands.join("; ")),
            None,
        );
    }
    for note in &detection.notes {
        r.line(Level::Ok, "project", note, None);
    }
    usable
}
