//! The end-of-run report: what the model said, what actually changed, and whether the tests
//! pass when the harness runs them itself.

use serde::Serialize;

use crate::model::Usage;

/// Exit statuses of `agentbox run` (documented in the README).
pub mod exit {
    pub const PASSED: u8 = 0;
    pub const TESTS_FAIL: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const STEP_LIMIT: u8 = 3;
    pub const ERROR: u8 = 4;
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
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
    /// `--isolate`: where the patch was written.
    pub patch_file: Option<String>,
    /// `--apply`: the paths written and deleted on the host, or why nothing was.
    pub applied: Option<Vec<String>>,
    pub apply_error: Option<String>,
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
        if self.changed_files.is_empty() {
            s.push_str("changes:  none\n");
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
        if let Some(p) = &self.patch_file {
            s.push_str(&format!(
                "patch:    {p} (the project itself was not touched; `git apply` it, or rerun with --apply)\n"
            ));
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
