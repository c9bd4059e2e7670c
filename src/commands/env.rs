//! `agentbox env list|show|rm` (named environments, `run --env NAME`).

use crate::cli::EnvCommand;
use crate::config::UsageError;
use crate::envs::{EnvName, EnvRecord, envs_dir};
use crate::output::escaped;

fn name(n: &str) -> Result<EnvName, UsageError> {
    EnvName::parse(n).map_err(|e| UsageError(e.to_string()))
}

/// Seconds since the epoch as UTC, to the minute.
fn when(secs: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

pub async fn run(command: EnvCommand, cleanup: &crate::sandbox::Cleanup) -> anyhow::Result<u8> {
    let base = envs_dir()?;
    match command {
        EnvCommand::List => {
            let records = EnvRecord::list(&base)?;
            if records.is_empty() {
                outln!("no environments");
            }
            for r in records {
                outln!(
                    "{}\t{}\tcreated {}\tlast used {}\t{} turns",
                    escaped(r.name.as_str()),
                    escaped(r.project.display().to_string()),
                    escaped(when(r.created)),
                    escaped(when(r.last_used)),
                    r.turns.len()
                );
            }
        }
        EnvCommand::Show { name: n } => {
            let r = EnvRecord::load(&base, &name(&n)?)?;
            outln!(
                "environment {} of {}",
                escaped(r.name.as_str()),
                escaped(r.project.display().to_string())
            );
            outln!("image {}, volume {}", escaped(&r.image), escaped(&r.volume));
            if let Some(origin) = &r.forked_from {
                outln!("forked from {}", escaped(origin.as_str()));
            }
            if let Some(b) = &r.base {
                outln!(
                    "made from commit {}{}",
                    escaped(&b.head),
                    if b.dirty {
                        " (with uncommitted changes)"
                    } else {
                        ""
                    }
                );
            }
            for (i, t) in r.turns.iter().enumerate() {
                outln!("turn {} ({}): {}", i + 1, escaped(when(t.at)), escaped(&t.task));
                outln!("  verdict: {}", escaped(&t.verdict));
                outln!("  changed: {}", escaped(t.changed.join(", ")));
            }
        }
        EnvCommand::Rm { name: n } => {
            let n = name(&n)?;
            let record = match EnvRecord::load(&base, &n) {
                Ok(r) => Some(r),
                Err(crate::envs::EnvError::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let docker = crate::sandbox::connect_docker().await?;
            let volume = match &record {
                Some(r) => r.volume.clone(),
                // A first run cut short before its record: its volume, if it carries the
                // environment's label (never another volume of that name).
                None => {
                    let volume = crate::envs::volume_name(&n);
                    let ours = docker.inspect_volume(&volume).await.is_ok_and(|v| {
                        v.labels.get(crate::sandbox::ENV_LABEL).map(String::as_str) == Some(n.as_str())
                    });
                    if !ours {
                        return Err(crate::envs::EnvError::NotFound(n.to_string()).into());
                    }
                    volume
                }
            };
            // The volume first: a record without its volume could not be resumed, a volume
            // without its record would be left unnamed.
            match docker
                .remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>)
                .await
            {
                Ok(()) => {}
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if record.is_some() {
                EnvRecord::remove(&base, &n)?;
            }
            outln!("removed environment {}", escaped(n.as_str()));
        }
        EnvCommand::Rewind { name: n, turn } => {
            let n = name(&n)?;
            let docker = crate::sandbox::connect_docker().await?;
            crate::env_checkpoint::rewind(&docker, cleanup, &n, turn).await?;
            outln!("environment {} is as turn {} left it", escaped(n.as_str()), turn);
        }
        EnvCommand::Merge { name: n, branch } => {
            let n = name(&n)?;
            let Some(branch) = branch else {
                return Err(UsageError(
                    "env merge needs --branch BRANCH (merging into the checkout is not built yet)".into(),
                )
                .into());
            };
            let record = EnvRecord::load(&base, &n)?;
            let commits = crate::env_branch::merge_branch(&base, &record, &branch)?;
            outln!(
                "created branch {} with {} commits from environment {}",
                escaped(&branch),
                commits.len(),
                escaped(n.as_str())
            );
        }
        EnvCommand::Fork { name: from, new } => {
            let (from, new) = (name(&from)?, name(&new)?);
            let docker = crate::sandbox::connect_docker().await?;
            crate::env_fork::fork(&docker, cleanup, &from, &new).await?;
            outln!(
                "forked environment {} into {}",
                escaped(from.as_str()),
                escaped(new.as_str())
            );
        }
    }
    Ok(0)
}
