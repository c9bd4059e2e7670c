//! `--isolate` at the end of a session: what changed, read back from the sandbox and computed
//! on the host; the patch; `--apply`.

use std::sync::Arc;
use std::time::Duration;

use super::{MAX_DIFF_BYTES, Session};
use std::path::Path;

use crate::config::{IsolateSettings, SandboxConfig};
use crate::sandbox::DockerSandbox;
use std::io::Write;

use super::SessionError;
use crate::events::{Event, EventSink};
use crate::hostfs::hostscan;
use crate::hostfs::isolate::{self, Manifest};
use crate::report::Report;
use crate::sandbox::Sandbox;

/// `./agentbox-SESSION.patch`, unless the current directory is inside the project (which
/// `--isolate` promises not to write): then the system's temporary directory.
fn default_patch_path(project: &std::path::Path, session: &str) -> std::path::PathBuf {
    let name = format!("agentbox-{session}.patch");
    let cwd = std::env::current_dir().and_then(|d| d.canonicalize()).ok();
    match cwd {
        Some(d) if !d.starts_with(project) => d.join(name),
        _ => std::env::temp_dir().join(name),
    }
}

/// An `--isolate` session: what was copied in, to check the host against before `--apply`.
pub(super) struct Isolation {
    pub(super) project: std::path::PathBuf,
    pub(super) manifest: Arc<Manifest>,
    pub(super) settings: IsolateSettings,
    /// What the copy left out, and why (`isolate::Packed::left_out`).
    pub(super) left_out: Vec<String>,
    /// The sandbox came from the warm pool (`--pool`), the project copied in after.
    pub(super) from_pool: bool,
}

impl Session {
    /// `--isolate`: what changed, computed on the host from the sandbox's files and what was
    /// copied in (see `isolate::readback`): listed, pruned of what is never brought back, then
    /// read from the archive API within a byte budget and a deadline.
    pub async fn changeset(&self) -> Result<isolate::ChangeSet, SessionError> {
        let Some(iso) = &self.isolation else {
            return Err(SessionError::NotIsolated);
        };
        changeset(&self.sandbox, iso, self.tool_settings.command_timeout).await
    }

    /// `chat --env`: after a request, what changed since the environment was made, kept as the
    /// turn's checkpoint, and the turn in its log. Returns the changed paths and what was not
    /// brought back.
    pub async fn keep_env_turn(
        &self,
        task: &str,
        verdict: String,
    ) -> Result<(Vec<String>, Vec<String>), SessionError> {
        let Some(iso) = &self.isolation else {
            return Err(SessionError::NotIsolated);
        };
        let Some(name) = &iso.settings.env else {
            return Err(SessionError::NotIsolated);
        };
        let set = self.changeset().await?;
        let mut warnings = isolate::readback::warnings(&set.skipped, isolate::readback::Limits::default());
        if let Err(e) = crate::env_checkpoint::save_turn(name, &iso.manifest, &set, &iso.project) {
            warnings.push(format!("no checkpoint kept for this turn: {e}"));
        }
        let changed: Vec<String> = set.changes.iter().map(|(c, _)| c.path.quoted()).collect();
        crate::envs::record_turn_as(name, task, verdict, changed.clone())?;
        Ok((changed, warnings))
    }

    /// `--isolate`: the changes, the patch (from the manifest and the host's originals), and
    /// with `--apply` the changes in the project. The report's diff and file list become the
    /// host's account, including what was not brought back and why.
    /// Returns the changed files whose test code or test configuration changed
    /// (`project::test_change`: a `#[cfg(test)]` module edited, pytest's `addopts` in
    /// `pyproject.toml`), from the host's originals and what was read back.
    /// `Err` when what changed cannot be told (then nothing is written or applied).
    pub async fn finish_isolated(&self, report: &mut Report) -> Result<Vec<String>, SessionError> {
        let Some(iso) = &self.isolation else {
            return Ok(Vec::new());
        };
        let set = match self.changeset().await {
            Ok(c) => c,
            Err(e) => {
                report.warnings.push(format!("cannot tell what changed: {e}"));
                // Never "changes: none" when what changed is not known.
                report.diff_error = Some(format!("cannot tell what changed: {e}"));
                if iso.settings.apply {
                    report.apply_error = Some(e.to_string());
                    report.exit_code = crate::report::exit::ERROR;
                }
                return Err(e);
            }
        };
        self.events.emit(&Event::Note {
            message: format!(
                "read back {} bytes from the sandbox ({} entries); {} changed, {} not brought back",
                set.bytes_read,
                set.entries,
                set.changes.len(),
                set.skipped.len()
            ),
        });
        if let Some(message) = isolate::readback::caches_note(&set.skipped) {
            self.events.emit(&Event::Note { message });
        }
        report.warnings.extend(iso.left_out.iter().cloned());
        report.warnings.extend(isolate::readback::warnings(
            &set.skipped,
            isolate::readback::Limits::default(),
        ));
        if let Some(name) = &iso.settings.env {
            // What `env rewind` and `env merge --branch` need; without it the turn still counts.
            if let Err(e) = crate::env_checkpoint::save_turn(name, &iso.manifest, &set, &iso.project) {
                report
                    .warnings
                    .push(format!("no checkpoint kept for this turn: {e}"));
            }
        }
        let test_code = test_code_changes(iso, &set).await;
        let (set, counts) = write_patch(iso, set, report).await?;
        account(&set, &counts, report);
        if iso.settings.apply {
            let mut warnings = Vec::new();
            let applied = self.apply(iso, set, &mut warnings).await;
            report.warnings.extend(warnings);
            match applied {
                Ok(a) => report.applied = Some(a.written.into_iter().chain(a.deleted).collect()),
                Err(e) => {
                    report.apply_error = Some(e.to_string());
                    report.exit_code = crate::report::exit::ERROR;
                }
            }
        }
        Ok(test_code)
    }

    /// `--apply`, unless something could not be brought back; inside the run's critical
    /// section, so an interruption waits for it: the project gets all of the changes or none.
    async fn apply(
        &self,
        iso: &Isolation,
        set: isolate::ChangeSet,
        warnings: &mut Vec<String>,
    ) -> Result<isolate::Applied, SessionError> {
        let missing: Vec<String> = set.missing().iter().map(|s| s.shown()).collect();
        if !missing.is_empty() {
            return Err(SessionError::Refused(format!(
                "nothing applied: {} could not be brought back from the sandbox (see the warnings)",
                missing.join(", ")
            )));
        }
        let (project, manifest) = (iso.project.clone(), iso.manifest.clone());
        let cleanup = self.cleanup.clone();
        let session = self.sandbox.info().session.clone();
        let (applied, check) = tokio::task::spawn_blocking(move || {
            let _held = cleanup.critical();
            // What git on this machine would run or read, as the project is now: a change may
            // not touch it, nor make a directory a repository.
            let baseline = hostscan::Baseline::take(&project, &Default::default());
            if let Err(e) = refuse_git_changes(&project, &baseline.protection, &set.changes) {
                return (Err(e), None);
            }
            let applied = isolate::apply(&project, &manifest, &set.changes).map_err(SessionError::from);
            // And the same check as after a bind-mounted run, should anything have slipped by.
            let check = applied
                .is_ok()
                .then(|| hostscan::check(&project, &baseline, &session));
            (applied, check)
        })
        .await?;
        if let Some(check) = check {
            *warnings = check.warnings;
            if check.unresolved {
                return Err(SessionError::Refused(
                    "something git would run could not be moved out of the project (see the warnings)".into(),
                ));
            }
        }
        applied
    }
}

/// The changed files whose test code changed, comparing the host's original (what was copied
/// in) with what the sandbox left. The originals are read as any project file is: regular
/// files only, bounded; one that cannot be read counts as changed (the verdict must not trust
/// what it could not check).
async fn test_code_changes(iso: &Isolation, set: &isolate::ChangeSet) -> Vec<String> {
    const MAX_SOURCE: u64 = 16 << 20;
    let candidates: Vec<(String, String, std::path::PathBuf, Option<Vec<u8>>)> = set
        .changes
        .iter()
        .filter(|(c, _)| crate::project::may_hold_tests(&c.path.as_path().to_string_lossy()))
        .map(|(c, content)| {
            let new = match content {
                Some(isolate::Content::File { data, .. }) => Some(data.clone()),
                _ => None,
            };
            let rel = c.path.as_path().to_string_lossy().into_owned();
            (c.path.quoted(), rel, iso.project.join(c.path.as_path()), new)
        })
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    tokio::task::spawn_blocking(move || {
        candidates
            .into_iter()
            .filter(|(_, rel, original, new)| {
                match isolate::hostfs::read_bounded(original, MAX_SOURCE) {
                    Ok(Some(old)) => crate::project::test_code_changed(rel, Some(&old), new.as_deref()),
                    // Not there before: a new file.
                    Err(isolate::hostfs::OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                        crate::project::test_code_changed(rel, None, new.as_deref())
                    }
                    _ => true,
                }
            })
            .map(|(shown, _, _, _)| shown)
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// Refuse a change set that would touch what git on this machine runs or reads (the hooks
/// directory, an included config, a script a config names, and the directories above them),
/// or make a directory look like a git repository (HEAD with objects and refs, or commondir).
fn refuse_git_changes(
    project: &std::path::Path,
    protection: &hostscan::Protection,
    changes: &[(isolate::Change, Option<isolate::Content>)],
) -> Result<(), SessionError> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut names_after: BTreeMap<std::path::PathBuf, (BTreeSet<std::ffi::OsString>, bool)> = BTreeMap::new();
    for (ch, content) in changes {
        let path = ch.path.as_path();
        if let Some(named) = protection
            .named
            .iter()
            .find(|n| path.starts_with(n) || n.starts_with(path))
        {
            return Err(SessionError::Refused(format!(
                "nothing applied: {} is {} a path git on this machine runs or reads ({}); make that change yourself if you trust it",
                ch.path,
                if path.starts_with(named) { "in" } else { "above" },
                hostscan::quote(named)
            )));
        }
        // Every directory on the way gets the name below it (a new `objects/` comes with the
        // file inside it); the changed path itself is added, or removed when deleted.
        let mut child = path;
        while let Some(dir) = child.parent() {
            let entry = names_after.entry(dir.to_path_buf()).or_insert_with(|| {
                let names: BTreeSet<std::ffi::OsString> = std::fs::read_dir(project.join(dir))
                    .map(|r| r.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                let before = hostscan::git::names_look_like_git_dir(names.iter().map(|n| n.as_os_str()));
                (names, before)
            });
            if let Some(name) = child.file_name() {
                if child != path || content.is_some() {
                    entry.0.insert(name.to_os_string());
                } else {
                    entry.0.remove(name);
                }
            }
            child = dir;
        }
    }
    for (dir, (names, before)) in &names_after {
        if !before && hostscan::git::names_look_like_git_dir(names.iter().map(|n| n.as_os_str())) {
            return Err(SessionError::Refused(format!(
                "nothing applied: the changes would make {} look like a git repository to git on this machine",
                if dir.as_os_str().is_empty() {
                    "the project".to_string()
                } else {
                    hostscan::quote(dir)
                }
            )));
        }
    }
    Ok(())
}

/// The patch, written section by section to its file (the report keeps only its start), and
/// the line counts of each change.
async fn write_patch(
    iso: &Isolation,
    set: isolate::ChangeSet,
    report: &mut Report,
) -> Result<(isolate::ChangeSet, Vec<Option<(u64, u64)>>), SessionError> {
    let patch_path = iso.settings.write_patch.then(|| {
        iso.settings
            .patch
            .clone()
            .unwrap_or_else(|| default_patch_path(&iso.project, &report.session))
    });
    let (project, manifest) = (iso.project.clone(), iso.manifest.clone());
    let target = patch_path.clone();
    let (set, written) = tokio::task::spawn_blocking(move || {
        let write = |out: &mut dyn Write| -> std::io::Result<isolate::patch::Written> {
            let w = isolate::patch::write_patch(out, &project, &manifest, &set.changes, MAX_DIFF_BYTES)?;
            out.flush()?;
            Ok(w)
        };
        let written = match &target {
            Some(path) => std::fs::File::create(path).and_then(|f| write(&mut std::io::BufWriter::new(f))),
            None => write(&mut std::io::sink()),
        };
        (set, written)
    })
    .await?;
    report.diff_error = None;
    let counts = match written {
        Ok(w) => {
            report.diff = Some(w.report);
            report.patch_file = patch_path.map(|p| p.display().to_string());
            w.counts
        }
        Err(e) => {
            report.warnings.push(format!(
                "cannot write the patch {}: {e}",
                patch_path.map(|p| p.display().to_string()).unwrap_or_default()
            ));
            Vec::new()
        }
    };
    Ok((set, counts))
}

/// The report's account of an isolated run: every changed project file, with its line counts
/// where the patch has them, and caches and `.git` apart, as changed but not in the diff.
fn account(set: &isolate::ChangeSet, counts: &[Option<(u64, u64)>], report: &mut Report) {
    report.changed_files = set
        .changes
        .iter()
        .enumerate()
        .map(|(i, (c, _))| {
            let counts = counts.get(i).copied().flatten();
            crate::report::ChangedFile {
                path: c.path.quoted(),
                added: counts.map(|c| c.0),
                removed: counts.map(|c| c.1),
            }
        })
        // Project files the patch lacks are changes all the same (an eval must see a test
        // file among them).
        .chain(
            set.skipped
                .iter()
                .filter(|s| !s.is_cache())
                .map(|s| crate::report::ChangedFile {
                    path: s.shown(),
                    added: None,
                    removed: None,
                }),
        )
        .collect();
    let caches: Vec<String> = set
        .skipped
        .iter()
        .filter(|s| s.is_cache())
        .map(|s| s.shown())
        .collect();
    report.changed_outside_diff = Some(crate::report::OutsideDiff {
        total: caches.len(),
        paths: caches
            .into_iter()
            .take(crate::hostfs::hostscan::MAX_LISTED_CHANGES)
            .collect(),
        incomplete: false,
    });
}

/// What changed in an isolated sandbox: see [`Session::changeset`].
async fn changeset(
    sandbox: &dyn Sandbox,
    iso: &Isolation,
    command_timeout: Duration,
) -> Result<isolate::ChangeSet, SessionError> {
    use isolate::readback;
    // Nothing the model left running may write while the changes are read back.
    if let Ok(Err(e)) = sandbox
        .stop_processes(None, "before the changes were read back")
        .await
    {
        return Err(SessionError::StopProcesses(e.to_string()));
    }
    let timeout = command_timeout.max(Duration::from_secs(60));
    let listed = sandbox
        .exec(
            crate::sandbox::ExecRequest::argv(readback::listing_command(), timeout)
                .capture(readback::MAX_LISTING_BYTES, 0),
        )
        .await?;
    // A partial listing (an unreadable directory) still helps; a cut one does not.
    let listing = (!listed.timed_out)
        .then(|| listed.stdout.bytes())
        .flatten()
        .map(|out| readback::parse_listing(&out));
    let manifest = iso.manifest.clone();
    let plan = readback::plan(&manifest, listing.as_ref(), readback::Limits::default());
    if !plan.prune.is_empty() {
        let prune = crate::sandbox::ExecRequest::argv(readback::prune_command(), timeout)
            .stdin(plan.prune_input())
            .capture(4096, 4096);
        // What is not removed is read and left out as it comes: only slower.
        if let Ok(out) = sandbox.exec(prune).await
            && !out.success()
        {
            tracing::debug!(status = %out.status_line(), "pruning before the read-back failed");
        }
    }
    let reader = sandbox.archive_reader(crate::sandbox::WORKSPACE).await?;
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = readback::Deadline::new(
        reader,
        Duration::from_secs(readback::MAX_READBACK_SECS),
        fired.clone(),
    );
    let bridge = tokio_util::io::SyncIoBridge::new(reader);
    Ok(
        tokio::task::spawn_blocking(move || {
            readback::changeset_from_archive(bridge, &manifest, plan, &fired)
        })
        .await??,
    )
}

/// `--isolate` for the faces without a model (`shell`, `mcp`): what was copied in, and at the
/// end the patch, computed on the host as for `run`.
pub struct IsolatedCopy(Isolation);

/// What [`IsolatedCopy::finish`] wrote.
pub struct PatchWritten {
    pub path: std::path::PathBuf,
    /// Files in the patch.
    pub changed: usize,
    /// What was not brought back, and why.
    pub warnings: Vec<String>,
}

impl IsolatedCopy {
    /// Copy `project` into a fresh volume and start a sandbox on it.
    pub async fn open(
        cfg: &crate::config::SandboxConfig,
        project: &std::path::Path,
        patch: Option<std::path::PathBuf>,
    ) -> Result<(crate::sandbox::DockerSandbox, IsolatedCopy), SessionError> {
        let settings = IsolateSettings {
            exclude: Vec::new(),
            patch,
            write_patch: true,
            apply: false,
            env: None,
        };
        let (sandbox, iso) = open_isolated(cfg, project, &settings).await?;
        Ok((sandbox, IsolatedCopy(iso)))
    }

    /// Open environment `name` (made from `project` the first time, else resumed as it was
    /// left); the caller holds its lock.
    pub async fn open_env(
        cfg: &crate::config::SandboxConfig,
        project: &std::path::Path,
        name: crate::envs::EnvName,
    ) -> Result<(crate::sandbox::DockerSandbox, IsolatedCopy), SessionError> {
        let settings = IsolateSettings {
            exclude: Vec::new(),
            patch: None,
            write_patch: false,
            apply: false,
            env: Some(name),
        };
        let (sandbox, iso) = open_isolated(cfg, project, &settings).await?;
        Ok((sandbox, IsolatedCopy(iso)))
    }

    /// An environment's turn is over: what changed since it was made, read back and kept as
    /// the turn's checkpoint (no patch: the changes stay in the environment). Call as
    /// [`IsolatedCopy::finish`]; returns the changed paths and what was not brought back.
    pub async fn finish_env(
        &self,
        sandbox: &dyn Sandbox,
        timeout: Duration,
    ) -> Result<(Vec<String>, Vec<String>), SessionError> {
        let Some(name) = &self.0.settings.env else {
            return Err(SessionError::NotIsolated);
        };
        let set = changeset(sandbox, &self.0, timeout).await?;
        let mut warnings = isolate::readback::warnings(&set.skipped, isolate::readback::Limits::default());
        if let Err(e) = crate::env_checkpoint::save_turn(name, &self.0.manifest, &set, &self.0.project) {
            warnings.push(format!("no checkpoint kept for this turn: {e}"));
        }
        let changed = set.changes.iter().map(|(c, _)| c.path.quoted()).collect();
        Ok((changed, warnings))
    }

    /// Read back what changed and write the patch. Call while the sandbox is still there, and
    /// after its processes are stopped.
    pub async fn finish(
        &self,
        sandbox: &dyn Sandbox,
        timeout: Duration,
        session: &str,
    ) -> Result<PatchWritten, SessionError> {
        let set = changeset(sandbox, &self.0, timeout).await?;
        let mut warnings = self.0.left_out.clone();
        warnings.extend(isolate::readback::warnings(
            &set.skipped,
            isolate::readback::Limits::default(),
        ));
        let path = self
            .0
            .settings
            .patch
            .clone()
            .unwrap_or_else(|| default_patch_path(&self.0.project, session));
        let (project, manifest, target) = (self.0.project.clone(), self.0.manifest.clone(), path.clone());
        let changed = set.changes.len();
        tokio::task::spawn_blocking(move || {
            std::fs::File::create(&target).and_then(|f| {
                let mut out = std::io::BufWriter::new(f);
                isolate::patch::write_patch(&mut out, &project, &manifest, &set.changes, MAX_DIFF_BYTES)?;
                out.flush()
            })
        })
        .await?
        .map_err(|source| SessionError::Io {
            what: "write the patch",
            path: path.display().to_string(),
            source,
        })?;
        Ok(PatchWritten {
            path,
            changed,
            warnings,
        })
    }
}

/// The project copied into a fresh volume (`--isolate`), and a sandbox on it.
pub(super) async fn open_isolated(
    cfg: &SandboxConfig,
    project: &Path,
    iso: &crate::config::IsolateSettings,
) -> Result<(DockerSandbox, Isolation), SessionError> {
    let crate::sandbox::ProjectDir { uid, gid, .. } = crate::sandbox::inspect_project(project)?;
    let root = project.canonicalize().map_err(|source| SessionError::Io {
        what: "resolve",
        path: project.display().to_string(),
        source,
    })?;
    let kept = match &iso.env {
        Some(name) => {
            let base = crate::envs::envs_dir()?;
            match crate::envs::EnvRecord::load(&base, name) {
                Ok(record) => return resume_env(cfg, project, root, iso, record, &base).await,
                Err(crate::envs::EnvError::NotFound(_)) => Some((name.clone(), base)),
                Err(e) => return Err(e.into()),
            }
        }
        None => None,
    };
    let exclude = iso.exclude.clone();
    let dir = root.clone();
    let packed = tokio::task::spawn_blocking(move || {
        isolate::pack(&dir, uid, gid, &|p| {
            exclude.iter().any(|e| e.as_bytes() == p.as_bytes())
        })
    })
    .await??;
    let mut spec = cfg.volume_spec(project, packed.tar.path())?;
    if let Some((name, _)) = &kept {
        spec.workspace = crate::sandbox::WorkspaceSource::Env {
            name: crate::envs::volume_name(name),
            env: name.to_string(),
            seed: Some(packed.tar.path().to_path_buf()),
        };
    }
    // An environment's volume is its own (never the pool's).
    let pooled = match (&cfg.pool, &kept) {
        (Some(pool), None) => from_pool(cfg, pool, &spec, packed.tar.path()).await?,
        _ => None,
    };
    let from_pool = pooled.is_some();
    let sb = match pooled {
        Some(sb) => sb,
        None => super::open::open_spec(cfg, spec).await?.1,
    };
    if let Some((name, base)) = &kept {
        // The manifest first: a record names an environment whose patch can be computed.
        let saved = crate::envs::save_manifest(base, name, &packed.manifest).and_then(|()| {
            let now = crate::envs::now();
            crate::envs::EnvRecord {
                name: name.clone(),
                project: root.clone(),
                volume: crate::envs::volume_name(name),
                created: now,
                last_used: now,
                image: cfg.image.clone(),
                network: false,
                allow_hosts: Vec::new(),
                setup: Vec::new(),
                conversation: serde_json::Value::Null,
                turns: Vec::new(),
                forked_from: None,
                base: crate::env_branch::base_of(&root),
            }
            .save(base)
        });
        saved_or_shut(&sb, saved).await?;
    }
    Ok((
        sb,
        Isolation {
            project: root,
            manifest: Arc::new(packed.manifest),
            settings: iso.clone(),
            left_out: packed.left_out,
            from_pool,
        },
    ))
}

/// What an environment had to write, else the sandbox goes too: no session starts on an
/// environment whose record or manifest is not on disk.
async fn saved_or_shut<T>(
    sb: &DockerSandbox,
    saved: Result<T, crate::envs::EnvError>,
) -> Result<(), SessionError> {
    if let Err(e) = saved {
        let _ = sb.shutdown().await;
        return Err(e.into());
    }
    Ok(())
}

/// `--env NAME` again: the environment's volume as it was left, the manifest of what was first
/// copied in (what its patch is computed against); refused for another project.
async fn resume_env(
    cfg: &SandboxConfig,
    project: &Path,
    root: std::path::PathBuf,
    iso: &crate::config::IsolateSettings,
    mut record: crate::envs::EnvRecord,
    base: &Path,
) -> Result<(DockerSandbox, Isolation), SessionError> {
    if record.project != root {
        return Err(SessionError::Refused(format!(
            "environment {} is of project {}, not {}",
            record.name,
            record.project.display(),
            root.display()
        )));
    }
    let manifest = crate::envs::load_manifest(base, &record.name)?;
    // No copy: the seed is never read for an existing environment's volume.
    let mut spec = cfg.volume_spec(project, Path::new("/dev/null"))?;
    spec.workspace = crate::sandbox::WorkspaceSource::Env {
        name: record.volume.clone(),
        env: record.name.to_string(),
        seed: None,
    };
    let (_, sb) = super::open::open_spec(cfg, spec).await?;
    record.last_used = crate::envs::now();
    saved_or_shut(&sb, record.save(base)).await?;
    Ok((
        sb,
        Isolation {
            project: root,
            manifest: Arc::new(manifest),
            settings: iso.clone(),
            left_out: Vec::new(),
            from_pool: false,
        },
    ))
}

/// A sandbox of `spec`'s kind from the warm pool, the project copied in; `None` when the pool
/// has none of its kind (then it starts its own).
async fn from_pool(
    cfg: &SandboxConfig,
    pool: &crate::sandbox::Pool,
    spec: &crate::sandbox::SandboxSpec,
    archive: &Path,
) -> Result<Option<DockerSandbox>, SessionError> {
    // The images first, as for a sandbox of its own: a missing one is built (or named) here,
    // not taken for a pool that cannot start.
    super::open::ensure_images(cfg).await?;
    let Some(sb) = pool.take(spec).await else {
        return Ok(None);
    };
    if let Err(e) = sb.copy_in(archive).await {
        // A pooled sandbox that died while it waited, say: the session starts its own, which
        // reports a failure that is not the pool's.
        tracing::debug!(error = %e, "the project could not be copied into a pooled sandbox");
        let _ = sb.shutdown().await;
        return Ok(None);
    }
    Ok(Some(sb))
}
