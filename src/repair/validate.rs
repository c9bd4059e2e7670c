//! Judging a candidate: its files written into a fresh copy of the project in a sandbox of its
//! own, and every test command run there.

use std::path::{Path, PathBuf};

use crate::config::{AgentSettings, SandboxConfig};
use crate::report::{CandidateReport, CandidateVerdict};
use crate::sandbox::Sandbox;
use crate::session::Session;
use crate::tools::tally::{Tally, tally_runs};
use crate::tools::{ToolContext, ToolSettings, all_passed, render_test_runs};
use crate::workspace::{FsError, Workspace};

use super::State;
use super::localise;
use super::reply::FileWrite;

/// The end of a failed candidate's test output kept for the report and the loop.
const DETAIL_BYTES: usize = 1500;

/// A candidate as judged: its report, the files it was tested with (the round's starting
/// point with its own changes over it), and how its tests failed.
pub(super) struct Judged {
    pub(super) report: CandidateReport,
    pub(super) files: Vec<FileWrite>,
    pub(super) tally: Option<Tally>,
    pub(super) failing: String,
}

impl Judged {
    pub(super) fn discarded(report: CandidateReport) -> Judged {
        Judged {
            report,
            files: Vec::new(),
            tally: None,
            failing: String::new(),
        }
    }

    pub(super) fn passed(&self) -> bool {
        self.report.verdict == CandidateVerdict::Passed
    }

    /// Failed, but fewer failing tests than `from` and none newly failing.
    pub(super) fn progress_over(&self, from: &State) -> bool {
        self.report.verdict == CandidateVerdict::Failed
            && match (&self.tally, &from.tally) {
                (Some(now), Some(then)) => now.improves_on(then),
                _ => false,
            }
    }
}

/// Candidate sandboxes: the session's sandbox settings and image, a copy of the project each.
pub(super) struct Validator<'a> {
    cfg: SandboxConfig,
    project: PathBuf,
    /// The project's archive; removed with the validator.
    seed: tempfile::NamedTempFile,
    tool_settings: &'a ToolSettings,
    session: String,
    /// Each test command's counts before the first turn: a candidate that runs no test where
    /// tests ran then has not passed.
    before: Vec<(String, Option<crate::project::results::TestCounts>)>,
}

impl<'a> Validator<'a> {
    /// Pack the project once; every candidate's volume is seeded from the same archive.
    pub(super) async fn new(
        session: &'a Session,
        settings: &AgentSettings,
        project: &Path,
    ) -> Result<Validator<'a>, crate::sandbox::SandboxError> {
        let dir = crate::sandbox::inspect_project(project)?;
        let root = project
            .canonicalize()
            .map_err(|source| crate::hostfs::isolate::IsolateError::Read {
                path: project.display().to_string(),
                source,
            })?;
        let exclude = settings
            .isolate
            .as_ref()
            .map(|i| i.exclude.clone())
            .unwrap_or_default();
        let packed = tokio::task::spawn_blocking(move || {
            crate::hostfs::isolate::pack(&root, dir.uid, dir.gid, &|p| {
                exclude.iter().any(|e| e.as_bytes() == p.as_bytes())
            })
        })
        .await??;
        let mut cfg = settings.sandbox.clone();
        cfg.image = session.sandbox.info().image.clone();
        Ok(Validator {
            cfg,
            project: project.to_path_buf(),
            seed: packed.tar,
            tool_settings: &session.tool_settings,
            session: session.sandbox.info().session.clone(),
            before: session.before_counts(),
        })
    }

    /// Write the candidate's files (`files`: its own changes, `paths`, over the round's
    /// starting point) into a fresh copy of the project and run every test command.
    pub(super) async fn validate(
        &self,
        number: u32,
        round: u32,
        temperature: f32,
        paths: Vec<String>,
        files: Vec<FileWrite>,
        jobs: &tokio::sync::Semaphore,
    ) -> Judged {
        let report = |verdict, detail: String| {
            Judged::discarded(CandidateReport {
                files: paths.clone(),
                detail,
                ..CandidateReport::new(number, round, temperature, verdict)
            })
        };
        // What can be told without a sandbox is told first.
        for f in &files {
            if let Err(e) = crate::workspace::check_path(&f.path) {
                return report(CandidateVerdict::Outside, e.to_string());
            }
            if crate::project::is_test_file(&f.path, &self.tool_settings.test_patterns) {
                return report(
                    CandidateVerdict::ChangesTests,
                    format!("{} is a test file", f.path),
                );
            }
        }
        let Ok(_permit) = jobs.acquire().await else {
            return report(CandidateVerdict::Error, "the candidates were cancelled".into());
        };
        let mut spec = match self.cfg.volume_spec(&self.project, self.seed.path()) {
            Ok(s) => s,
            Err(e) => return report(CandidateVerdict::Error, e.to_string()),
        };
        spec.labels
            .push(("agentbox.candidate".into(), number.to_string()));
        spec.labels
            .push(("agentbox.candidate-of".into(), self.session.clone()));
        let sandbox = match crate::session::open_spec(&self.cfg, spec).await {
            Ok((_, sb)) => sb,
            Err(e) => return report(CandidateVerdict::Error, format!("its sandbox: {e}")),
        };
        let judged = self.judge(&sandbox, &files).await;
        let _ = sandbox.shutdown().await;
        let (verdict, detail, tally, failing) = judged;
        let mut j = report(verdict, detail);
        j.report.tests_passed = tally.as_ref().and_then(|t| t.passed);
        j.report.tests_failed = tally.as_ref().map(|t| t.failed);
        j.files = files;
        j.tally = tally;
        j.failing = failing;
        j
    }

    /// The verdict, its detail, the tests counted and their output as a prompt shows it.
    async fn judge(
        &self,
        sandbox: &dyn Sandbox,
        files: &[FileWrite],
    ) -> (CandidateVerdict, String, Option<Tally>, String) {
        if let Err(e) = write_files(sandbox, self.tool_settings, files).await {
            return (e.verdict(), e.to_string(), None, String::new());
        }
        let ctx = ToolContext {
            sandbox,
            settings: self.tool_settings,
            approver: None,
        };
        match ctx.run_tests().await {
            Ok(runs) if all_passed(&runs) => {
                match crate::session::before::no_tests_ran(&runs, &self.before) {
                    None => (
                        CandidateVerdict::Passed,
                        String::new(),
                        tally_runs(&runs),
                        String::new(),
                    ),
                    Some(why) => (
                        CandidateVerdict::Failed,
                        format!("its tests exited 0, but {why}"),
                        tally_runs(&runs),
                        localise::failing_output(&runs),
                    ),
                }
            }
            Ok(runs) => {
                let text = render_test_runs(&runs);
                let cut = text.len().saturating_sub(DETAIL_BYTES);
                let at = (cut..text.len())
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(cut);
                let detail = text[at..].to_string();
                (
                    CandidateVerdict::Failed,
                    detail,
                    tally_runs(&runs),
                    localise::failing_output(&runs),
                )
            }
            Err(e) => (
                CandidateVerdict::Error,
                format!("the tests could not run: {e}"),
                None,
                String::new(),
            ),
        }
    }
}

/// Why a candidate's files were not written: a test file changed, or the workspace refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    #[error("it changes {0}")]
    ChangesTests(String),
    #[error(transparent)]
    Fs(#[from] FsError),
}

impl WriteError {
    /// What ends the repair when candidate `n`'s files, already judged, cannot be written into
    /// the session's sandbox.
    pub(super) fn fatal(self, n: u32) -> crate::agent::Fatal {
        use crate::agent::Fatal;
        match self {
            WriteError::Fs(FsError::Sandbox(e)) => Fatal::Sandbox(std::sync::Arc::new(e)),
            WriteError::Fs(e) => Fatal::Keep {
                candidate: n,
                source: std::sync::Arc::new(e),
            },
            // Judged before: a kept candidate changes no test file, so this is the workspace's
            // word on the path, as FsError words it.
            WriteError::ChangesTests(path) => Fatal::Keep {
                candidate: n,
                source: std::sync::Arc::new(FsError::Failed {
                    path,
                    message: "a test file: candidates may not change it".into(),
                }),
            },
        }
    }

    /// The verdict on a candidate whose files could not be written.
    fn verdict(&self) -> CandidateVerdict {
        match self {
            WriteError::ChangesTests(_) => CandidateVerdict::ChangesTests,
            WriteError::Fs(FsError::Outside { .. } | FsError::InvalidPath { .. }) => {
                CandidateVerdict::Outside
            }
            WriteError::Fs(_) => CandidateVerdict::Error,
        }
    }
}

/// Write `files` through the sandbox (paths resolved inside it), refusing test code changes.
pub(super) async fn write_files(
    sandbox: &dyn Sandbox,
    settings: &ToolSettings,
    files: &[FileWrite],
) -> Result<(), WriteError> {
    let ws = Workspace::new(sandbox);
    for f in files {
        let old = match ws.read(&f.path, settings.max_file_bytes).await {
            Ok(b) => Some(b.data),
            Err(FsError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(what) = crate::project::test_change(&f.path, old.as_deref(), Some(f.content.as_bytes())) {
            return Err(WriteError::ChangesTests(what));
        }
        let data = f.content.clone().into_bytes();
        match old {
            Some(_) => ws.replace(&f.path, data).await?,
            None => ws.create(&f.path, data).await?,
        };
    }
    Ok(())
}
