//! The tests before the model's first turn, the last step of the preflight: run once per
//! session, they give the report its `before: 1 failed, 185 passed → after: 186 passed`, give
//! the verdict its baseline ("no tests ran" is no PASS where tests ran before), and tell the
//! environment from the code: tests that cannot start because a dependency the project
//! declares is missing stop the run before any model request (exit 2), naming it and the
//! setup command that installs it.
//!
//! What already runs the tests before the first turn reuses this run instead of its own:
//! `--prime`'s first message, repair's localisation (and so `auto`'s loop after it).

use std::path::Path;

use super::Session;
use super::preflight::{self, Outcome, Step};
use crate::config::UsageError;
use crate::events::{Event, EventSink};
use crate::project::declared;
use crate::project::results::{self, TestCounts};
use crate::tools::{TestRun, ToolContext};

impl Session {
    /// Run every test command once, before the model's first turn (a second call does
    /// nothing). `Err`: the tests cannot start for want of something the project declares.
    /// A sandbox that fails here is left for the run to meet and report.
    pub async fn tests_before(&self, project: &Path) -> Result<(), UsageError> {
        if self.tool_settings.test_commands.is_empty() || self.before.get().is_some() {
            return Ok(());
        }
        let ctx = ToolContext {
            sandbox: &self.sandbox,
            settings: &self.tool_settings,
            approver: None,
        };
        let runs = match ctx.run_tests().await {
            Ok(runs) => runs,
            Err(e) => {
                preflight::report(
                    self.events.as_ref(),
                    Step::TestsBefore,
                    Outcome::Failed(e.to_string()),
                );
                return Ok(());
            }
        };
        let shown: Vec<String> = runs.iter().map(describe).collect();
        self.events.emit(&Event::Note {
            message: format!("tests before the model's first turn: {}", shown.join("; ")),
        });
        let root = project.to_path_buf();
        let outputs: Vec<(String, String)> = runs
            .iter()
            .filter(|r| !r.output.success())
            .map(|r| (r.command.clone(), r.output.stdout.to_text()))
            .collect();
        let gap = tokio::task::spawn_blocking(move || {
            outputs
                .into_iter()
                .find_map(|(command, out)| declared::gap(&root, &out).map(|g| (command, g)))
        })
        .await
        .ok()
        .flatten();
        let _ = self.before.set(runs);
        if let Some((command, gap)) = gap {
            let message = format!(
                "the tests cannot start: `{command}` stops at {missing}, which the project declares ({source}) \
                 but this environment does not have. That is the environment, not the code: install it in \
                 the setup phase, e.g. --setup \"{install}\". No model request was made.",
                missing = gap.missing,
                source = gap.declared.source,
                install = gap.declared.install,
            );
            preflight::report(
                self.events.as_ref(),
                Step::TestsBefore,
                Outcome::Failed(message.clone()),
            );
            return Err(UsageError(message));
        }
        preflight::report(
            self.events.as_ref(),
            Step::TestsBefore,
            Outcome::Passed(shown.join("; ")),
        );
        Ok(())
    }

    /// The runs of [`Session::tests_before`], if they happened.
    pub fn before_runs(&self) -> Option<&[TestRun]> {
        self.before.get().map(Vec::as_slice)
    }

    /// Each test command's counts before the model's first turn, by command.
    pub fn before_counts(&self) -> Vec<(String, Option<TestCounts>)> {
        self.before_runs()
            .unwrap_or_default()
            .iter()
            .map(|r| (r.command.clone(), results::of_run(&r.command, &r.output)))
            .collect()
    }
}

/// "`cmd`: 1 failed, 185 passed", or its exit status when its runner's counts cannot be told.
fn describe(run: &TestRun) -> String {
    match results::of_run(&run.command, &run.output) {
        Some(c) => format!("`{}`: {c}", run.command),
        None => format!("`{}`: {}", run.command, run.output.status_line()),
    }
}

/// Why runs that all exited 0 are no pass: the first command that ran no test where it ran
/// some before the model's first turn (`before`, by command).
pub fn no_tests_ran(runs: &[TestRun], before: &[(String, Option<TestCounts>)]) -> Option<String> {
    runs.iter().find_map(|r| {
        let was = before.iter().find(|(c, _)| *c == r.command)?.1.as_ref();
        results::no_tests_ran(was, results::of_run(&r.command, &r.output).as_ref())
            .map(|why| format!("`{}`: {why}", r.command))
    })
}
