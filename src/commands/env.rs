//! `agentbox env ...` (named environments, `run --env NAME`).

use crate::cli::EnvCommand;
use crate::config::UsageError;
use crate::envs::{EnvName, EnvRecord, envs_dir};
use crate::output::escaped;

fn name(n: &str) -> Result<EnvName, UsageError> {
    EnvName::parse(n).map_err(|e| UsageError(e.to_string()))
}

/// Bytes of the files under `dir` (not following links); what cannot be read counts nothing.
fn disk_use(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_use(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// `n` when it has a record (taking its lock would otherwise make its directory).
fn existing(base: &std::path::Path, n: &EnvName) -> Result<EnvName, crate::envs::EnvError> {
    EnvRecord::load(base, n).map(|r| r.name)
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
                // What its last checkpoint holds; unreadable, it is said as unknown.
                let changes = crate::env_checkpoint::latest(&base, &r.name)
                    .map(|(_, cp)| (cp.changed.entries.len() + cp.deleted.entries.len()).to_string())
                    .unwrap_or_else(|_| "?".into());
                outln!(
                    "{}\t{}\tcreated {}\tlast used {}\t{} turn{}\t{} changed\t{} on the host",
                    escaped(r.name.as_str()),
                    escaped(r.project.display().to_string()),
                    escaped(when(r.created)),
                    escaped(when(r.last_used)),
                    r.turns.len(),
                    if r.turns.len() == 1 { "" } else { "s" },
                    escaped(changes),
                    escaped(crate::hostfs::human_bytes(disk_use(&base.join(r.name.as_str())))),
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
        EnvCommand::Diff { name: n } => {
            let n = name(&n)?;
            let pending = crate::env_merge::pending(&base, &n)?;
            if let Some(line) = pending.stale() {
                errln!("{}", escaped(line));
            }
            if pending.changes.is_empty() {
                errln!(
                    "no changes: {} is as it was made, or as last merged",
                    escaped(n.as_str())
                );
                return Ok(0);
            }
            // Sandbox-written text: escaped on a terminal, the bytes as they are to a pipe
            // (`agentbox env diff NAME | git apply` works).
            let mut out = crate::output::CommandStream::stdout();
            crate::hostfs::isolate::patch::write_patch(
                &mut out,
                &pending.record.project,
                &pending.base,
                &pending.changes,
                0,
            )?;
            out.finish()?;
        }
        EnvCommand::Rm { name: n } => {
            let n = name(&n)?;
            let record = match EnvRecord::load(&base, &n) {
                Ok(r) => Some(r),
                Err(crate::envs::EnvError::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            };
            // Not while a run works in it: its sandbox would lose the volume under it.
            let _lock = match &record {
                Some(_) => Some(crate::envs::lock(&base, &n)?),
                None => None,
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
            // The caches of its view (setup on its own manifests), each with its commit marker.
            let view = crate::env_view::view_dir(&base, &n).display().to_string();
            for (cache, of) in crate::sandbox::caches::list(&docker).await? {
                if of == view && !crate::sandbox::caches::remove(&docker, &cache).await {
                    errln!(
                        "agentbox: WARNING: the cache {} is in use and was left; `agentbox gc --caches` removes it later",
                        escaped(&cache)
                    );
                }
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
                // Not while a run changes it (nor another merge).
                let _lock = crate::envs::lock(&base, &existing(&base, &n)?)?;
                let (pending, applied) = crate::env_merge::merge(&base, &n, cleanup).await?;
                if let Some(line) = pending.stale() {
                    errln!("{}", escaped(line));
                }
                if applied.written.is_empty() && applied.deleted.is_empty() {
                    outln!(
                        "nothing to merge: {} has no changes since it was made or last merged",
                        escaped(n.as_str())
                    );
                    return Ok(0);
                }
                outln!(
                    "merged environment {} into {}: {} written, {} deleted",
                    escaped(n.as_str()),
                    escaped(pending.record.project.display().to_string()),
                    applied.written.len(),
                    applied.deleted.len()
                );
                for p in &applied.written {
                    outln!("  written {}", escaped(p));
                }
                for p in &applied.deleted {
                    outln!("  deleted {}", escaped(p));
                }
                return Ok(0);
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
