//! The end-of-run report: what the model said, what actually changed, and whether the tests
//! pass when the harness runs them itself.

use serde::{Deserialize, Serialize};

use crate::model::Usage;
use crate::sandbox::hostscan::{self, HostCheck};

/// Exit statuses of `agentbox run` (documented in the README).
pub mod exit {
    pub const PASSED: u8 = 0;
    pub const TESTS_FAIL: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const STEP_LIMIT: u8 = 3;
    pub const ERROR: u8 = 4;
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The model gave its final answer.
    Finished,
    /// `--max-steps` was reached first.
    StepLimit,
    /// A fatal error: the model API, or the sandbox.
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct TestVerdict {
    pub command: Option<String>,
    /// `None` when no test command is known or the check itself failed.
    pub passed: Option<bool>,
    pub exit_code: Option<i64>,
    /// The end of the output, for the report.
    pub output_tail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChangedFile {
    pub path: String,
    pub added: Option<u64>,
    pub removed: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct OutsideDiff {
    /// Paths (git-quoted), at most [`hostscan::MAX_LISTED_CHANGES`].
    pub paths: Vec<String>,
    /// How many there were.
    pub total: usize,
    /// The project has more entries than the scan records: there may be more.
    pub incomplete: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub session: String,
    pub model: String,
    pub outcome: Outcome,
    pub summary: Option<String>,
    pub error: Option<String>,
    pub steps: u32,
    /// Fresh starts (`--attempts`); 1 normally.
    pub attempts: u32,
    pub usage: Usage,
    pub usage_estimated: bool,
    pub cost_usd: Option<f64>,
    pub tests: TestVerdict,
    pub changed_files: Vec<ChangedFile>,
    /// Unified diff of the project against its state at the start, computed in the sandbox.
    pub diff: Option<String>,
    pub diff_error: Option<String>,
    pub elapsed_secs: f64,
    pub exit_code: u8,
    /// Things the user must know about, e.g. a `.git` planted in the project.
    pub warnings: Vec<String>,
    /// What changed that the diff does not show. Bind-mounted runs: the host's own scan of
    /// the project (files git ignores or the diff leaves out: a `.pth` file in an ignored
    /// virtualenv, a cache). `--isolate`: caches and `.git` changed in the sandbox, never
    /// brought back. `None` when nothing was looked at.
    pub changed_outside_diff: Option<OutsideDiff>,
    /// `--isolate`: where the patch was written.
    pub patch_file: Option<String>,
    /// `--apply`: the paths written and deleted on the host, or why nothing was.
    pub applied: Option<Vec<String>>,
    pub apply_error: Option<String>,
}

impl Outcome {
    /// The name in JSON and in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::StepLimit => "step_limit",
            Outcome::Error => "error",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Report {
    pub fn exit_code_for(outcome: &Outcome, tests: &TestVerdict) -> u8 {
        match outcome {
            Outcome::Error => exit::ERROR,
            Outcome::StepLimit => exit::STEP_LIMIT,
            Outcome::Finished => match tests.passed {
                Some(false) => exit::TESTS_FAIL,
                // No test command: finishing is all there is to judge.
                _ if tests.command.is_none() => exit::PASSED,
                Some(true) => exit::PASSED,
                None => exit::ERROR,
            },
        }
    }

    /// The host's check of a bind-mounted project: its warnings, and the changes the diff does
    /// not account for (all of them when the diff itself failed).
    pub fn add_host_check(&mut self, check: HostCheck) {
        self.warnings.extend(check.warnings);
        if check.unresolved {
            // Something git would run is still in the project: not a run to call a success.
            self.exit_code = exit::ERROR;
        }
        let in_diff: std::collections::HashSet<&str> =
            self.changed_files.iter().map(|f| f.path.as_str()).collect();
        let outside: Vec<String> = check
            .changes
            .paths
            .iter()
            .map(|p| hostscan::quote(p))
            // A new directory is accounted for by the files in it that the diff shows; any
            // other file in it is listed on its own.
            .filter(|p| {
                !in_diff.contains(p.as_str()) && !in_diff.iter().any(|d| d.starts_with(&format!("{p}/")))
            })
            .collect();
        self.changed_outside_diff = Some(OutsideDiff {
            total: outside.len(),
            paths: outside.into_iter().take(hostscan::MAX_LISTED_CHANGES).collect(),
            incomplete: check.changes.incomplete,
        });
    }

    /// The human-readable report, for stdout.
    pub fn render(&self, max_diff_lines: usize) -> String {
        let mut s = String::new();
        s.push_str("\n=== agentbox report ===\n");
        let outcome = match self.outcome {
            Outcome::Finished => "finished",
            Outcome::StepLimit => "stopped at the step limit",
            Outcome::Error => "stopped by an error",
        };
        let attempts = if self.attempts > 1 {
            format!(" over {} attempts", self.attempts)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "outcome:  {outcome} after {} steps{attempts} in {:.0}s\n",
            self.steps, self.elapsed_secs
        ));
        if let Some(e) = &self.error {
            s.push_str(&format!("error:    {e}\n"));
        }
        for w in &self.warnings {
            s.push_str(&format!("WARNING:  {w}\n"));
        }
        let tests = match (&self.tests.command, self.tests.passed) {
            (None, _) => "not run (no test command; pass --test-cmd)".to_string(),
            (Some(cmd), Some(true)) => format!("PASS  (`{cmd}`, run by agentbox after the model finished)"),
            (Some(cmd), Some(false)) => format!(
                "FAIL  (`{cmd}` exited {}, run by agentbox after the model finished)",
                self.tests.exit_code.unwrap_or(-1)
            ),
            (Some(cmd), None) => format!("unknown (`{cmd}` could not be run)"),
        };
        s.push_str(&format!("tests:    {tests}\n"));
        let tokens = format!(
            "in {} ({} cached), out {}",
            self.usage.total_input(),
            self.usage.cache_read_tokens,
            self.usage.output_tokens
        );
        let line = match (self.usage_estimated, self.cost_usd) {
            (true, _) => format!("{tokens}; estimates from a scripted replay, no cost"),
            (false, Some(c)) => format!("{tokens}; cost ≈ ${c:.4}"),
            (false, None) => format!("{tokens}; cost unknown for this model"),
        };
        s.push_str(&format!("tokens:   {line}\n"));
        let outside = self
            .changed_outside_diff
            .as_ref()
            .filter(|o| o.total > 0 || o.incomplete);
        let diff_failed = self.diff.is_none() && self.diff_error.is_some();
        if self.changed_files.is_empty() {
            s.push_str(match (diff_failed, outside) {
                (true, _) => "changes:  unknown (the diff failed: see below)\n",
                (false, Some(_)) => "changes:  none in the diff\n",
                (false, None) => "changes:  none\n",
            });
        } else {
            s.push_str("changes:\n");
            for f in &self.changed_files {
                let counts = match (f.added, f.removed) {
                    (Some(a), Some(r)) => format!("+{a} -{r}"),
                    _ => "binary".into(),
                };
                s.push_str(&format!("  {:<40} {counts}\n", f.path));
            }
        }
        if let Some(o) = outside {
            s.push_str(if diff_failed {
                "changed on the host (agentbox's own scan of the project):\n"
            } else {
                "also changed, not in the diff (git ignores it, or the sandbox kept it out of the diff):\n"
            });
            const SHOWN: usize = 20;
            for p in o.paths.iter().take(SHOWN) {
                s.push_str(&format!("  {p}\n"));
            }
            if o.total > SHOWN {
                s.push_str(&format!(
                    "  ... and {} more (--json lists them)\n",
                    o.total - SHOWN
                ));
            }
            if o.incomplete {
                s.push_str(&format!(
                    "  (the project has more than {} entries; the scan stopped there: changes past them are unknown)\n",
                    hostscan::MAX_ENTRIES
                ));
            }
        }
        if let Some(p) = &self.patch_file {
            s.push_str(&if self.applied.is_some() {
                format!("patch:    {p} (applied to the project: see below)\n")
            } else {
                format!("patch:    {p} (the project itself was not touched; `git apply` it, or rerun with --apply)\n")
            });
        }
        match (&self.applied, &self.apply_error) {
            (Some(paths), _) => s.push_str(&format!(
                "applied:  {} path(s) changed in the project\n",
                paths.len()
            )),
            (None, Some(e)) => s.push_str(&format!("applied:  NOTHING: {e}\n")),
            _ => {}
        }
        if let Some(summary) = &self.summary {
            s.push_str("\nmodel's summary (its own words; the test result above is agentbox's):\n");
            for line in summary.trim().lines() {
                s.push_str(&format!("  {line}\n"));
            }
        }
        if let Some(diff) = &self.diff
            && !diff.is_empty()
        {
            s.push_str("\ndiff:\n");
            let lines: Vec<&str> = diff.lines().collect();
            for line in lines.iter().take(max_diff_lines) {
                s.push_str(line);
                s.push('\n');
            }
            if lines.len() > max_diff_lines {
                s.push_str(&format!(
                    "[... {} more diff lines; --json has all of it]\n",
                    lines.len() - max_diff_lines
                ));
            }
        }
        if let Some(e) = &self.diff_error {
            s.push_str(&format!("\ndiff unavailable: {e}\n"));
        }
        if self.tests.passed == Some(false) && !self.tests.output_tail.is_empty() {
            s.push_str("\nend of the test output:\n");
            s.push_str(&self.tests.output_tail);
            if !self.tests.output_tail.ends_with('\n') {
                s.push('\n');
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(command: Option<&str>, passed: Option<bool>) -> TestVerdict {
        TestVerdict {
            command: command.map(String::from),
            passed,
            exit_code: None,
            output_tail: String::new(),
        }
    }

    fn report() -> Report {
        Report {
            session: "s".into(),
            model: "m".into(),
            outcome: Outcome::Finished,
            summary: None,
            error: None,
            steps: 1,
            attempts: 1,
            usage: Usage::default(),
            usage_estimated: true,
            cost_usd: None,
            tests: verdict(None, None),
            changed_files: Vec::new(),
            diff: Some(String::new()),
            diff_error: None,
            elapsed_secs: 1.0,
            exit_code: 0,
            warnings: Vec::new(),
            changed_outside_diff: None,
            patch_file: None,
            applied: None,
            apply_error: None,
        }
    }

    fn host_check(paths: &[&str]) -> HostCheck {
        HostCheck {
            warnings: vec!["w".into()],
            changes: hostscan::HostChanges {
                paths: paths.iter().map(std::path::PathBuf::from).collect(),
                incomplete: false,
            },
            unresolved: false,
        }
    }

    #[test]
    fn changes_are_never_none_when_the_host_saw_some_or_the_diff_failed() {
        let mut r = report();
        r.add_host_check(host_check(&[]));
        assert!(r.render(10).contains("changes:  none\n"));

        let mut r = report();
        r.changed_files = vec![ChangedFile {
            path: "src/a.py".into(),
            added: Some(1),
            removed: Some(0),
        }];
        r.add_host_check(host_check(&[
            "src",
            "src/a.py",
            ".venv/x.pth",
            "a\nchanges:  none",
        ]));
        let text = r.render(10);
        assert!(text.contains("also changed, not in the diff"), "{text}");
        assert!(text.contains("  .venv/x.pth\n"), "{text}");
        assert!(
            !text.contains("  src\n"),
            "a directory the diff accounts for: {text}"
        );
        assert!(
            text.contains("  \"a\\nchanges:  none\"\n"),
            "names cannot forge lines: {text}"
        );
        assert_eq!(r.warnings, ["w"]);

        let mut r = report();
        r.diff = None;
        r.diff_error = Some("git diff failed".into());
        r.add_host_check(host_check(&["a.py"]));
        let text = r.render(10);
        assert!(text.contains("changes:  unknown (the diff failed"), "{text}");
        assert!(
            text.contains("changed on the host (agentbox's own scan"),
            "{text}"
        );
    }

    #[test]
    fn exit_codes_follow_the_contract() {
        let f = Outcome::Finished;
        assert_eq!(Report::exit_code_for(&f, &verdict(Some("t"), Some(true))), 0);
        assert_eq!(Report::exit_code_for(&f, &verdict(Some("t"), Some(false))), 1);
        assert_eq!(Report::exit_code_for(&f, &verdict(None, None)), 0);
        assert_eq!(Report::exit_code_for(&f, &verdict(Some("t"), None)), 4);
        assert_eq!(
            Report::exit_code_for(&Outcome::StepLimit, &verdict(Some("t"), Some(true))),
            3
        );
        assert_eq!(
            Report::exit_code_for(&Outcome::Error, &verdict(Some("t"), Some(true))),
            4
        );
    }
}
