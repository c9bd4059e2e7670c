//! The end-of-run report: what the model said, what actually changed, and whether the tests
//! pass when the harness runs them itself.

use serde::{Deserialize, Serialize};

use crate::hostfs::hostscan::{self, HostCheck};
use crate::model::Usage;
use crate::project::results::TestCounts;

/// Exit statuses of `agentbox run` (documented in the README).
pub use crate::exit;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The model gave its final answer.
    Finished,
    /// `--max-steps` was reached first.
    StepLimit,
    /// The attempt ended early: the model repeated the same call with nothing changed, turn
    /// after turn (see the repeat guard, `--no-repeat`).
    Repeating,
    /// A fatal error: the model API, or the sandbox.
    Error,
}

/// agentbox's own final test run: every test command, all of which must pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TestVerdict {
    /// `Some(true)` when every command passed, `Some(false)` when one failed; `None` when no
    /// test command is known or one could not be run to its end.
    pub passed: Option<bool>,
    /// Each command with its result, in the order they ran.
    pub commands: Vec<CommandVerdict>,
    /// The commands were given (`--test-cmd`, a task's `test_cmd`), not detected.
    pub given: bool,
    /// What detection looked at and left out (e.g. npm's placeholder test script).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CommandVerdict {
    pub command: String,
    /// `None` when it could not be run (or the run stopped before the tests).
    pub passed: Option<bool>,
    pub exit_code: Option<i64>,
    /// The end of the output, for the report.
    pub output_tail: String,
    /// The files detection chose it from (empty when it was given).
    pub based_on: Vec<String>,
    /// The counts its runner printed (`project::results`); `None` when they cannot be told
    /// (make, an unknown command, no summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts: Option<TestCounts>,
    /// The same command before the model's first turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<RunBefore>,
    /// Why it is no PASS although it exited 0: it ran no test, where tests ran before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A test command's run before the model's first turn.
#[derive(Debug, Clone, Serialize)]
pub struct RunBefore {
    pub passed: bool,
    pub exit_code: i64,
    pub counts: Option<TestCounts>,
}

impl RunBefore {
    /// Its counts, or its exit status when they cannot be told.
    fn shown(&self) -> String {
        match &self.counts {
            Some(c) => c.to_string(),
            None if self.passed => "PASS".into(),
            None => format!("FAIL (exit {})", self.exit_code),
        }
    }
}

impl TestVerdict {
    /// "`a`", or "`a`; `b`": for one-line summaries.
    pub fn command_line(&self) -> Option<String> {
        (!self.commands.is_empty()).then(|| {
            self.commands
                .iter()
                .map(|c| c.command.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// The exit code of the first command that failed, else of the last one.
    pub fn exit_code(&self) -> Option<i64> {
        self.commands
            .iter()
            .find(|c| c.passed == Some(false))
            .or(self.commands.last())
            .and_then(|c| c.exit_code)
    }

    /// [`TestVerdict::failure_output`], or when every command passed, the last one's output
    /// (a record of what passed).
    pub fn failure_output_or_last(&self) -> String {
        let failing = self.failure_output();
        if failing.is_empty() {
            self.commands
                .last()
                .map(|c| c.output_tail.clone())
                .unwrap_or_default()
        } else {
            failing
        }
    }

    /// The end of the output of each command that did not pass, one after another.
    pub fn failure_output(&self) -> String {
        let failing: Vec<&CommandVerdict> = self
            .commands
            .iter()
            .filter(|c| c.passed != Some(true) && !c.output_tail.is_empty())
            .collect();
        match failing.as_slice() {
            [one] if self.commands.len() == 1 => one.output_tail.clone(),
            many => many
                .iter()
                .map(|c| format!("$ {}\n{}", c.command, c.output_tail.trim_end()))
                .collect::<Vec<_>>()
                .join("\n\n"),
        }
    }
}

impl CommandVerdict {
    /// `before: 1 failed, 185 passed → after: 186 passed`, when it ran before the first turn.
    fn before_after(&self) -> Option<String> {
        let before = self.before.as_ref()?;
        let after = match (&self.counts, self.passed) {
            (Some(c), _) => c.to_string(),
            (None, Some(true)) => "PASS".into(),
            (None, Some(false)) => format!("FAIL (exit {})", self.exit_code.unwrap_or(-1)),
            (None, None) => "not run to the end".into(),
        };
        Some(format!("before: {} → after: {after}", before.shown()))
    }

    /// Where it came from, for the report: "Cargo.toml", or "--test-cmd".
    fn origin(&self, given: bool) -> String {
        if given || self.based_on.is_empty() {
            "given".into()
        } else {
            let mut files: Vec<&str> = self.based_on.iter().map(String::as_str).take(3).collect();
            if self.based_on.len() > 3 {
                files.push("...");
            }
            format!("detected from {}", files.join(", "))
        }
    }
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
pub struct EgressRecord {
    pub phase: String,
    #[serde(flatten)]
    pub decision: crate::egress::Decision,
}

/// One background process the session ran (`bash` with `"background": true`).
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRecord {
    pub id: String,
    pub command: String,
    /// The command on one line, clipped, for the text report.
    #[serde(skip)]
    pub label: String,
    /// How it ended: its status, or why agentbox stopped it.
    pub status: String,
    pub exit_code: Option<i64>,
    pub stopped: Option<String>,
    pub seconds: f64,
    pub output_bytes: u64,
}

impl From<&crate::sandbox::ProcessState> for ProcessRecord {
    fn from(p: &crate::sandbox::ProcessState) -> Self {
        ProcessRecord {
            id: p.id.clone(),
            command: p.command.clone(),
            label: p.label(120),
            status: p.status_line(),
            exit_code: p.exit_code,
            stopped: p.stopped.clone(),
            seconds: p.elapsed.as_secs_f64(),
            output_bytes: p.output.total,
        }
    }
}

/// How much of the model's summary the text report shows (the JSON report has all of it).
const MAX_SUMMARY_LINES: usize = 60;
const MAX_SUMMARY_LINE_CHARS: usize = 400;
const MAX_SUMMARY_BYTES: usize = 8 << 10;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub session: String,
    pub model: String,
    pub outcome: Outcome,
    pub summary: Option<String>,
    /// The summary is repair's account (agentbox's words), not the model's.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub summary_by_agentbox: bool,
    pub error: Option<String>,
    pub steps: u32,
    /// Fresh starts (`--attempts`); 1 normally.
    pub attempts: u32,
    pub usage: Usage,
    pub usage_estimated: bool,
    pub cost_usd: Option<f64>,
    /// The sandbox's image, and why it was chosen (e.g. "Cargo.toml", "--image").
    pub image: String,
    pub image_reason: String,
    pub tests: TestVerdict,
    pub changed_files: Vec<ChangedFile>,
    /// Unified diff of the project against its state at the start, computed in the sandbox.
    pub diff: Option<String>,
    pub diff_error: Option<String>,
    pub elapsed_secs: f64,
    pub exit_code: u8,
    /// Things the user must know about, e.g. a `.git` planted in the project.
    pub warnings: Vec<String>,
    /// Every decision of the egress proxy: the setup phase's, and the agent's with
    /// `--agent-network allowlist`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressRecord>,
    /// The background processes the agent started, each as it ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessRecord>,
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
    /// `--strategy` when it is not the loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// `--strategy repair`/`auto`: every candidate and its verdict (the patch is the winner's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<CandidateReport>,
}

/// One repair candidate: what it wrote and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CandidateReport {
    /// 1 for the first (temperature 0); the winner is the lowest-numbered that passed.
    pub number: u32,
    /// The round it belongs to (`--repair-rounds`): round 2 starts from round 1's best.
    #[serde(default = "first_round")]
    pub round: u32,
    pub temperature: f32,
    pub verdict: CandidateVerdict,
    pub files: Vec<String>,
    /// Why it was discarded, or the end of its failing test output.
    pub detail: String,
    /// Its tests, as counted from the runner's summary (when it could be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests_passed: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests_failed: Option<u32>,
    /// The best of its round without passing: fewer failing tests than the round started with
    /// and none newly failing. The next round starts from it; with no winner, the project is
    /// left with it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
    /// The failing test its prompt was about, when it was asked about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focus: Option<String>,
    /// The one small change it is, when it came from `--repair-mutants` and not the model
    /// ("`+ 1` dropped, library.py:11").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutation: Option<String>,
}

fn first_round() -> u32 {
    1
}

impl CandidateReport {
    /// A candidate with a verdict and nothing counted.
    pub fn new(number: u32, round: u32, temperature: f32, verdict: CandidateVerdict) -> Self {
        CandidateReport {
            number,
            round,
            temperature,
            verdict,
            files: Vec::new(),
            detail: String::new(),
            tests_passed: None,
            tests_failed: None,
            kept: false,
            focus: None,
            mutation: None,
        }
    }

    /// "candidate 3 (round 2, temperature 0.7): failed, 4 of 5 tests pass, kept", without its
    /// files: each report adds them its own way.
    pub fn headline(&self) -> String {
        let round = if self.round > 1 {
            format!("round {}, ", self.round)
        } else {
            String::new()
        };
        let about = self
            .focus
            .as_ref()
            .map(|t| format!(", about {t}"))
            .unwrap_or_default();
        let mut s = match &self.mutation {
            Some(m) => format!(
                "candidate {} ({round}no model: {m}): {}",
                self.number,
                self.verdict.as_str()
            ),
            None => format!(
                "candidate {} ({round}temperature {}{about}): {}",
                self.number,
                self.temperature,
                self.verdict.as_str()
            ),
        };
        if self.verdict == CandidateVerdict::Failed {
            match (self.tests_passed, self.tests_failed) {
                (Some(p), Some(f)) => s.push_str(&format!(", {p} of {} tests pass", p + f)),
                (None, Some(f)) => s.push_str(&format!(", {f} test(s) fail")),
                _ => {}
            }
        }
        if self.kept {
            s.push_str(", kept (the best of its round)");
        }
        s
    }

    /// The [`headline`](Self::headline) with its files, as `style` writes them.
    pub fn line(&self, style: LineStyle) -> String {
        let (quote, before, after): (fn(&str) -> String, &str, &str) = match style {
            LineStyle::Plain => (str::to_string, " [", "]"),
            LineStyle::Markdown(quote) => (quote, ", ", ""),
        };
        let files = if self.files.is_empty() {
            String::new()
        } else {
            format!("{before}{}{after}", quote(&self.files.join(", ")))
        };
        format!("{}{files}", quote(&self.headline()))
    }
}

/// How a candidate's [`line`](CandidateReport::line) is written.
#[derive(Clone, Copy)]
pub enum LineStyle {
    /// `headline [a.py, b.py]`: the terminal and the text report.
    Plain,
    /// `headline, a.py, b.py`, the headline and the files each through the function (the
    /// eval summary's inline code, which brackets would not read well beside).
    Markdown(fn(&str) -> String),
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CandidateVerdict {
    /// Every test command passed in its own sandbox, no test changed.
    Passed,
    /// Its tests failed.
    Failed,
    /// Discarded: it wrote a test file or test code.
    ChangesTests,
    /// Discarded: no file could be read from the reply.
    Unparsable,
    /// Discarded: every file it wrote is the file as it was (a small model often echoes the
    /// source back); known without running anything.
    Unchanged,
    /// Discarded: it wrote a path outside the project (or an invalid one).
    Outside,
    /// Discarded: none of its search/replace blocks matched the files (`--repair-reply blocks`).
    Unmatched,
    /// Its sandbox or the model failed.
    Error,
}

impl CandidateVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateVerdict::Passed => "passed",
            CandidateVerdict::Failed => "failed",
            CandidateVerdict::ChangesTests => "discarded: changes the tests",
            CandidateVerdict::Unparsable => "discarded: no usable file",
            CandidateVerdict::Unchanged => "discarded: changes nothing",
            CandidateVerdict::Outside => "discarded: a path outside the project",
            CandidateVerdict::Unmatched => "discarded: no block matched the files",
            CandidateVerdict::Error => "error",
        }
    }

    pub fn discarded(self) -> bool {
        matches!(
            self,
            CandidateVerdict::ChangesTests
                | CandidateVerdict::Unparsable
                | CandidateVerdict::Unchanged
                | CandidateVerdict::Outside
                | CandidateVerdict::Unmatched
        )
    }
}

impl Outcome {
    /// The name in JSON and in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::StepLimit => "step_limit",
            Outcome::Repeating => "repeating",
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
            Outcome::StepLimit | Outcome::Repeating => exit::STEP_LIMIT,
            Outcome::Finished => match tests.passed {
                Some(false) => exit::TESTS_FAIL,
                // No test command: finishing is all there is to judge.
                _ if tests.commands.is_empty() => exit::PASSED,
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
            Outcome::Repeating => "stopped early: the model only repeated itself",
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
        s.push_str(&format!("image:    {} ({})\n", self.image, self.image_reason));
        if let Some(strategy) = &self.strategy {
            s.push_str(&format!("strategy: {strategy}\n"));
        }
        for c in &self.candidates {
            s.push_str(&format!("  {}\n", c.line(LineStyle::Plain)));
        }
        s.push_str(&self.render_tests());
        if !self.processes.is_empty() {
            s.push_str("background processes:\n");
            for p in &self.processes {
                s.push_str(&format!(
                    "  {} `{}`: {} ({} of output)\n",
                    p.id,
                    p.label,
                    p.status,
                    crate::sandbox::human_bytes(p.output_bytes)
                ));
            }
        }
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
                    "  (incomplete: the host's scan keeps account of {} entries at most, and --host-scan-limit / --host-scan-timeout bound it; changes past that are unknown)\n",
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
            s.push_str(if self.summary_by_agentbox {
                "\nrepair's summary (agentbox's account of the candidates):\n"
            } else {
                "\nmodel's summary (its own words; the test result above is agentbox's):\n"
            });
            // The model's words are the model's size: a reply of megabytes would bury the
            // verdict. The JSON report keeps all of it.
            let summary = summary.trim();
            let mut shown = 0usize;
            let mut cut = false;
            for (i, line) in summary.lines().enumerate() {
                if i == MAX_SUMMARY_LINES || shown >= MAX_SUMMARY_BYTES {
                    cut = true;
                    break;
                }
                let clipped: String = line.chars().take(MAX_SUMMARY_LINE_CHARS).collect();
                let more = if clipped.len() < line.len() {
                    cut = true;
                    " [...]"
                } else {
                    ""
                };
                shown += clipped.len();
                s.push_str(&format!("  {clipped}{more}\n"));
            }
            if cut {
                s.push_str(&format!(
                    "  [... clipped: the summary is {} bytes; --json has all of it]\n",
                    summary.len()
                ));
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
        let failure = self.tests.failure_output();
        if self.tests.passed == Some(false) && !failure.is_empty() {
            s.push_str("\nend of the test output:\n");
            s.push_str(&failure);
            if !failure.ends_with('\n') {
                s.push('\n');
            }
        }
        s
    }

    /// The `tests:` lines: one command on one line; several as a verdict and a line each.
    fn render_tests(&self) -> String {
        let t = &self.tests;
        let given = t.given;
        let mut s = match t.commands.as_slice() {
            [] => "tests:    not run (no test command; pass --test-cmd)\n".to_string(),
            [c] => {
                let how = format!("run by agentbox after the model finished; {}", c.origin(given));
                let mut line = match (c.passed, &c.refused) {
                    (Some(true), _) => format!("tests:    PASS  (`{}`, {how})\n", c.command),
                    (Some(false), Some(why)) => {
                        format!("tests:    FAIL  (`{}` exited 0, but {why}; {how})\n", c.command)
                    }
                    (Some(false), None) => format!(
                        "tests:    FAIL  (`{}` exited {}, {how})\n",
                        c.command,
                        c.exit_code.unwrap_or(-1)
                    ),
                    (None, _) => format!(
                        "tests:    unknown (`{}` could not be run; {})\n",
                        c.command,
                        c.origin(given)
                    ),
                };
                if let Some(ba) = c.before_after() {
                    line.push_str(&format!("          {ba}\n"));
                }
                line
            }
            many => {
                let verdict = match t.passed {
                    Some(true) => "PASS ",
                    Some(false) => "FAIL ",
                    None => "unknown",
                };
                let mut s = format!(
                    "tests:    {verdict} ({} commands, run by agentbox after the model finished; all must pass)\n",
                    many.len()
                );
                for c in many {
                    let result = match (c.passed, c.exit_code, &c.refused) {
                        (Some(true), _, _) => "PASS ".to_string(),
                        (Some(false), _, Some(_)) => "FAIL  (no tests ran)".to_string(),
                        (Some(false), code, None) => format!("FAIL  (exit {})", code.unwrap_or(-1)),
                        (None, _, _) => "not run to the end".to_string(),
                    };
                    s.push_str(&format!("  {result}  `{}`  ({})\n", c.command, c.origin(given)));
                    if let Some(why) = &c.refused {
                        s.push_str(&format!("          exited 0, but {why}\n"));
                    }
                    if let Some(ba) = c.before_after() {
                        s.push_str(&format!("          {ba}\n"));
                    }
                }
                s
            }
        };
        for n in &t.notes {
            s.push_str(&format!("  note: {n}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(command: Option<&str>, passed: Option<bool>) -> TestVerdict {
        TestVerdict {
            passed,
            commands: command
                .map(|c| CommandVerdict {
                    command: c.into(),
                    passed,
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn report() -> Report {
        Report {
            session: "s".into(),
            model: "m".into(),
            outcome: Outcome::Finished,
            summary: None,
            summary_by_agentbox: false,
            error: None,
            steps: 1,
            attempts: 1,
            usage: Usage::default(),
            usage_estimated: true,
            cost_usd: None,
            image: "agentbox/python:1".into(),
            image_reason: "test_a.py".into(),
            tests: verdict(None, None),
            changed_files: Vec::new(),
            diff: Some(String::new()),
            diff_error: None,
            elapsed_secs: 1.0,
            exit_code: 0,
            warnings: Vec::new(),
            egress: Vec::new(),
            processes: Vec::new(),
            changed_outside_diff: None,
            patch_file: None,
            applied: None,
            apply_error: None,
            strategy: None,
            candidates: Vec::new(),
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
    fn repairs_summary_is_never_labelled_the_models_words() {
        let mut r = report();
        r.summary = Some("repair: candidate 6 passed".into());
        let model = r.render(10);
        assert!(model.contains("model's summary (its own words"), "{model}");
        r.summary_by_agentbox = true;
        let agentbox = r.render(10);
        assert!(
            agentbox
                .contains("repair's summary (agentbox's account of the candidates):\n  repair: candidate 6")
                && !agentbox.contains("model's summary"),
            "{agentbox}"
        );
    }

    #[test]
    fn background_processes_are_listed_one_line_each() {
        let mut r = report();
        let p = crate::sandbox::ProcessState {
            id: "p1".into(),
            command: "npm run dev\necho tests:   PASS".into(),
            stopped: Some("before the final test run".into()),
            elapsed: std::time::Duration::from_secs(12),
            output: crate::sandbox::Captured {
                total: 4096,
                ..Default::default()
            },
            ..Default::default()
        };
        r.processes = vec![(&p).into()];
        let text = r.render(10);
        assert!(
            text.contains(
                "background processes:\n  p1 `npm run dev echo tests:   PASS`: stopped by agentbox after 12s: \
                 before the final test run (4.0 KiB of output)\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["processes"][0]["command"], "npm run dev\necho tests:   PASS");
        assert_eq!(json["processes"][0]["stopped"], "before the final test run");
        assert!(json["processes"][0].get("label").is_none());
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
    fn every_test_command_is_listed_with_its_result_and_origin() {
        let mut r = report();
        r.tests = TestVerdict {
            passed: Some(false),
            commands: vec![
                CommandVerdict {
                    command: "cargo test".into(),
                    passed: Some(false),
                    exit_code: Some(101),
                    output_tail: "test t ... FAILED\n".into(),
                    based_on: vec!["Cargo.toml".into()],
                    ..Default::default()
                },
                CommandVerdict {
                    command: "python3 -m pytest".into(),
                    passed: Some(true),
                    exit_code: Some(0),
                    output_tail: "1 passed\n".into(),
                    based_on: vec!["pyproject.toml".into(), "tests/test_a.py".into()],
                    ..Default::default()
                },
            ],
            given: false,
            notes: vec!["Makefile has no `test` target: make test not run".into()],
        };
        r.exit_code = Report::exit_code_for(&r.outcome, &r.tests);
        assert_eq!(r.exit_code, exit::TESTS_FAIL);
        let text = r.render(10);
        assert!(
            text.contains("image:    agentbox/python:1 (test_a.py)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "tests:    FAIL  (2 commands, run by agentbox after the model finished; all must pass)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  FAIL  (exit 101)  `cargo test`  (detected from Cargo.toml)\n"),
            "{text}"
        );
        assert!(
            text.contains("  PASS   `python3 -m pytest`  (detected from pyproject.toml, tests/test_a.py)\n"),
            "{text}"
        );
        assert!(text.contains("  note: Makefile has no `test` target"), "{text}");
        assert!(
            text.contains("end of the test output:\n$ cargo test\ntest t ... FAILED\n"),
            "{text}"
        );
        assert!(
            !text.contains("1 passed"),
            "only the failing command's output: {text}"
        );
        assert_eq!(r.tests.exit_code(), Some(101));
        assert_eq!(
            r.tests.command_line().as_deref(),
            Some("cargo test; python3 -m pytest")
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["tests"]["commands"][1]["based_on"][0], "pyproject.toml");
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
