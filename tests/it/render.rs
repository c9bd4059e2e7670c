//! What agentbox renders for people, whole: the run report (text, and `--json` as
//! `print_report` writes it), eval's `summary.md` and `report.html`. Each is built here through
//! the library from fixed inputs (no Docker, no clock, no temporary path reaches the output),
//! so a snapshot changes exactly when the rendering does. A change that is meant: run
//! `cargo insta review` (or `INSTA_UPDATE=always cargo test --test it -- render::`) and commit
//! the files under `tests/it/snapshots`.
//!
//! The narrower `contains` checks beside each renderer (`src/report.rs`, `src/eval/`) stay: they
//! say which line matters and why; these say nothing else moved.

use std::time::Duration;

use agentbox::cli::Strategy;
use agentbox::egress::Decision;
use agentbox::eval::{OutDir, TaskResult, Totals};
use agentbox::events::{Event, EventSink, Redactor, TrajectoryWriter};
use agentbox::model::{Block, StopReason, ToolArgs, ToolCall, Turn, Usage};
use agentbox::project::results::{TestCounts, Unit};
use agentbox::report::{
    CandidateReport, CandidateVerdict, ChangedFile, CommandVerdict, EgressRecord, Outcome, OutsideDiff,
    ProcessRecord, Report, RunBefore, TestVerdict,
};
use agentbox::sandbox::{Captured, ProcessState};

fn counts(passed: u64, failed: u64) -> TestCounts {
    TestCounts {
        passed,
        failed,
        unit: Unit::Tests,
        ..Default::default()
    }
}

/// A run that used every part of the report: attempts, warnings, repair candidates, two test
/// commands with their runs before the first turn, a background process, egress, changes in
/// and outside the diff, an `--isolate` patch applied, a long summary and a diff past the limit.
fn full_report() -> Report {
    let server = ProcessState {
        id: "p1".into(),
        command: "python3 -m http.server 8000\necho started".into(),
        stopped: Some("before the final test run".into()),
        elapsed: Duration::from_secs(42),
        output: Captured {
            total: 5000,
            ..Default::default()
        },
        ..Default::default()
    };
    // Past the text report's limits: 60 lines of summary, 400 characters a line, 200 diff lines.
    let summary = (1..=65)
        .map(|i| match i {
            2 => "a very long line ".repeat(30),
            i => format!("line {i} of the model's own account"),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let diff = std::iter::once("--- a/counter.py\n+++ b/counter.py\n@@ -1,105 +1,105 @@".to_string())
        .chain((1..=105).map(|i| format!("-old {i}\n+new {i}")))
        .collect::<Vec<_>>()
        .join("\n");
    let mut failed = CandidateReport::new(2, 1, 0.7, CandidateVerdict::Failed);
    failed.files = vec!["counter.py".into()];
    failed.tests_passed = Some(4);
    failed.tests_failed = Some(1);
    failed.kept = true;
    failed.focus = Some("test_counter.py::test_reset".into());
    let mut passed = CandidateReport::new(3, 2, 0.0, CandidateVerdict::Passed);
    passed.files = vec!["counter.py".into(), "util.py".into()];
    Report {
        session: "ab12cd34".into(),
        model: "claude-test".into(),
        outcome: Outcome::Finished,
        summary: Some(summary),
        summary_by_agentbox: false,
        error: None,
        steps: 7,
        attempts: 2,
        usage: Usage {
            input_tokens: 12000,
            output_tokens: 800,
            cache_read_tokens: 3000,
            cache_write_tokens: 100,
        },
        usage_estimated: false,
        cost_usd: Some(0.0123),
        image: "agentbox/python:3".into(),
        image_reason: "pyproject.toml".into(),
        tests: TestVerdict {
            passed: Some(false),
            commands: vec![
                CommandVerdict {
                    command: "python3 -m pytest -q".into(),
                    passed: Some(true),
                    exit_code: Some(0),
                    output_tail: "5 passed in 0.02s\n".into(),
                    based_on: vec!["pyproject.toml".into(), "tests/test_counter.py".into()],
                    counts: Some(counts(5, 0)),
                    before: Some(RunBefore {
                        passed: false,
                        exit_code: 1,
                        counts: Some(counts(4, 1)),
                    }),
                    refused: None,
                },
                CommandVerdict {
                    command: "make test".into(),
                    passed: Some(false),
                    exit_code: Some(2),
                    output_tail: "make: *** [test] Error 2".into(),
                    based_on: vec!["Makefile".into()],
                    counts: None,
                    before: Some(RunBefore {
                        passed: true,
                        exit_code: 0,
                        counts: None,
                    }),
                    refused: None,
                },
            ],
            given: false,
            notes: vec!["package.json's test script is npm's placeholder: not run".into()],
        },
        changed_files: vec![
            ChangedFile {
                path: "counter.py".into(),
                added: Some(12),
                removed: Some(12),
            },
            ChangedFile {
                path: "logo.png".into(),
                added: None,
                removed: None,
            },
        ],
        diff: Some(diff),
        diff_error: None,
        elapsed_secs: 93.4,
        exit_code: 1,
        warnings: vec!["a .git directory was planted in sub/: quarantined".into()],
        egress: vec![EgressRecord {
            phase: "setup".into(),
            decision: Decision {
                host: "pypi.org".into(),
                port: 443,
                allowed: true,
                method: "CONNECT".into(),
                reason: None,
                address: Some("127.0.0.1:8443".into()),
                bytes_up: 1200,
                bytes_down: 34000,
            },
        }],
        processes: vec![ProcessRecord::from(&server)],
        changed_outside_diff: Some(OutsideDiff {
            paths: (0..22).map(|i| format!(".venv/lib/site-{i}.pth")).collect(),
            total: 25,
            incomplete: true,
        }),
        patch_file: Some("agentbox-ab12cd34.patch".into()),
        applied: Some(vec!["counter.py".into(), "logo.png".into()]),
        apply_error: None,
        strategy: Some("auto".into()),
        candidates: vec![
            CandidateReport::new(1, 1, 0.0, CandidateVerdict::ChangesTests),
            failed,
            passed,
        ],
    }
}

/// A run that ended badly: an error, a diff that failed, one command that could not run,
/// estimated usage, and `--apply` refused.
fn error_report() -> Report {
    Report {
        session: "ef56ab78".into(),
        model: "scripted".into(),
        outcome: Outcome::Error,
        summary: None,
        summary_by_agentbox: false,
        error: Some("the sandbox stopped: out of memory (--memory 1g)".into()),
        steps: 3,
        attempts: 1,
        usage: Usage {
            input_tokens: 900,
            output_tokens: 90,
            ..Default::default()
        },
        usage_estimated: true,
        cost_usd: None,
        image: "agentbox/rust:1".into(),
        image_reason: "--image".into(),
        tests: TestVerdict {
            passed: None,
            commands: vec![CommandVerdict {
                command: "cargo test".into(),
                passed: None,
                exit_code: None,
                output_tail: String::new(),
                based_on: Vec::new(),
                counts: None,
                before: None,
                refused: None,
            }],
            given: true,
            notes: Vec::new(),
        },
        changed_files: Vec::new(),
        diff: None,
        diff_error: Some("git diff exited 128".into()),
        elapsed_secs: 12.0,
        exit_code: 4,
        warnings: Vec::new(),
        egress: Vec::new(),
        processes: Vec::new(),
        changed_outside_diff: Some(OutsideDiff {
            paths: vec!["src/lib.rs".into()],
            total: 1,
            incomplete: false,
        }),
        patch_file: None,
        applied: None,
        apply_error: Some("the project changed on the host meanwhile: src/lib.rs".into()),
        strategy: None,
        candidates: Vec::new(),
    }
}

/// One command that exited 0 but ran no test where tests ran before: no PASS.
fn refused_report() -> Report {
    Report {
        outcome: Outcome::Finished,
        error: None,
        tests: TestVerdict {
            passed: Some(false),
            commands: vec![CommandVerdict {
                command: "cargo test".into(),
                passed: Some(false),
                exit_code: Some(0),
                output_tail: "running 0 tests\n".into(),
                based_on: vec!["Cargo.toml".into()],
                counts: Some(counts(0, 0)),
                before: Some(RunBefore {
                    passed: false,
                    exit_code: 101,
                    counts: Some(counts(11, 1)),
                }),
                refused: Some("it ran no test, where 12 ran before the model's first turn".into()),
            }],
            given: false,
            notes: Vec::new(),
        },
        diff: Some(String::new()),
        diff_error: None,
        changed_outside_diff: None,
        apply_error: None,
        exit_code: 1,
        ..error_report()
    }
}

/// The report as `run` prints it (`render(200)`, then escaped for the terminal: nothing here
/// needs escaping).
#[test]
fn the_text_report() {
    insta::assert_snapshot!("report_full", full_report().render(200));
    insta::assert_snapshot!("report_error", error_report().render(200));
    insta::assert_snapshot!("report_refused", refused_report().render(200));
}

/// What `run --json` prints: `print_report` writes this text (with any API key redacted, and
/// none is in it).
#[test]
fn the_json_report() {
    insta::assert_snapshot!(
        "report_full_json",
        serde_json::to_string_pretty(&full_report()).unwrap()
    );
    insta::assert_snapshot!(
        "report_error_json",
        serde_json::to_string_pretty(&error_report()).unwrap()
    );
}

fn task(name: &str) -> TaskResult {
    TaskResult {
        task: name.into(),
        fixed: false,
        tests_passed: Some(false),
        tests_changed: false,
        changed_files: Vec::new(),
        steps: 5,
        attempts: 1,
        input_tokens: 1000,
        output_tokens: 100,
        cost_usd: None,
        wall_secs: 10.0,
        exit_reason: Outcome::Finished,
        error: None,
        model: "claude-test".into(),
        summary: None,
        started_at: 1_700_000_000.0,
        finished_at: 1_700_000_010.0,
        test_command: Some("python3 -m pytest -q".into()),
        test_exit_code: Some(1),
        test_output: "FAILED test_a.py::test_x\n1 failed, 2 passed in 0.03s\n".into(),
        strategy: Strategy::Repair,
        candidates: Vec::new(),
        engine: None,
        retried_from: Vec::new(),
    }
}

/// Four tasks, one of each outcome the pages tell apart: fixed (by a repair candidate), not
/// fixed at the step limit, a test file changed, an error.
fn eval_results() -> Vec<TaskResult> {
    let mut winner = CandidateReport::new(1, 1, 0.0, CandidateVerdict::Passed);
    winner.files = vec!["fee.py".into()];
    let mut loser = CandidateReport::new(2, 1, 0.7, CandidateVerdict::Failed);
    loser.files = vec!["fee.py".into()];
    loser.detail = "E   assert 3 == 4".into();
    loser.tests_passed = Some(2);
    loser.tests_failed = Some(1);
    let fixed = TaskResult {
        fixed: true,
        tests_passed: Some(true),
        changed_files: vec!["fee.py".into()],
        steps: 2,
        cost_usd: Some(0.0042),
        wall_secs: 31.5,
        started_at: 1_700_000_001.0,
        finished_at: 1_700_000_032.5,
        test_exit_code: Some(0),
        test_output: "3 passed in 0.02s\n".into(),
        summary: Some("Fixed the rounding in fee().".into()),
        candidates: vec![loser, winner],
        ..task("fee-rounding")
    };
    let step_limit = TaskResult {
        steps: 20,
        attempts: 3,
        exit_reason: Outcome::StepLimit,
        changed_files: vec!["parser.py".into()],
        wall_secs: 120.25,
        finished_at: 1_700_000_120.0,
        ..task("parser-off-by-one")
    };
    let tests_changed = TaskResult {
        tests_passed: Some(true),
        tests_changed: true,
        changed_files: vec!["test_clock.py".into(), "clock.py".into()],
        test_exit_code: Some(0),
        test_output: "2 passed in 0.01s\n".into(),
        wall_secs: 45.0,
        ..task("clock-tz")
    };
    let error = TaskResult {
        tests_passed: None,
        exit_reason: Outcome::Error,
        error: Some("the model API failed after 4 attempts: HTTP 529 overloaded\n(retried)".into()),
        steps: 1,
        test_command: None,
        test_exit_code: None,
        test_output: String::new(),
        wall_secs: 3.0,
        ..task("cache-expiry")
    };
    vec![fixed, step_limit, tests_changed, error]
}

/// A fixed stamp: the pages stay the same from one day and one version to the next.
fn stamp() -> agentbox::eval::stamp::Stamp {
    agentbox::eval::stamp::Stamp {
        written: "2026-12-05 02:40 UTC".into(),
        model: "claude-test (anthropic)".into(),
        version: "0.1.0".into(),
    }
}

fn eval_totals(results: &[TaskResult]) -> Totals {
    agentbox::eval::totals(results)
}

#[test]
fn the_eval_summary_markdown() {
    let results = eval_results();
    let md = agentbox::eval::markdown::summary("examples/tasks", &stamp(), &results, &eval_totals(&results));
    insta::assert_snapshot!("eval_summary_md", md);
}

#[test]
fn the_eval_report_html() {
    let results = eval_results();
    let dir = tempfile::tempdir().unwrap();
    let out = OutDir {
        root: dir.path().to_path_buf(),
    };
    out.create().unwrap();
    // The fixed task's diff and trajectory, as `eval` writes them (its timestamps are not shown).
    std::fs::write(
        out.diff("fee-rounding"),
        "diff --git a/fee.py b/fee.py\n--- a/fee.py\n+++ b/fee.py\n@@ -1,2 +1,2 @@\n def fee(x):\n-    return round(x * 0.1)\n+    return round(x * 0.1, 2)\n",
    )
    .unwrap();
    let writer = TrajectoryWriter::create(&out.trajectory("fee-rounding"), Redactor::default()).unwrap();
    let call = ToolCall {
        id: "call_1".into(),
        name: "bash".into(),
        arguments: ToolArgs::Json(serde_json::json!({ "command": "python3 -m pytest -q" })),
    };
    let turn = Turn {
        content: vec![
            Block::Text {
                text: "Let me run the tests first.".into(),
            },
            Block::ToolCall(call.clone()),
        ],
        stop: StopReason::ToolUse,
        usage: Usage {
            input_tokens: 500,
            output_tokens: 40,
            ..Default::default()
        },
    };
    writer.emit(&Event::ModelResponse {
        step: 1,
        turn: &turn,
        elapsed_ms: 1200,
        estimated_usage: false,
    });
    writer.emit(&Event::ToolStarted { step: 1, call: &call });
    writer.emit(&Event::ToolFinished {
        step: 1,
        call_id: "call_1",
        name: "bash",
        content: "F..\nFAILED test_fee.py::test_cents",
        is_error: false,
        elapsed_ms: 800,
    });
    writer.emit(&Event::Verifying {
        command: "python3 -m pytest -q".into(),
    });
    drop(writer);
    let page =
        agentbox::eval::html::report("examples/tasks", &stamp(), &results, &eval_totals(&results), &out);
    // The page is one line outside its `<pre>` blocks; one tag a line here, for a readable
    // diff. Its own line breaks become `⏎` first, so no change can hide behind the split.
    assert!(!page.contains('⏎'));
    let lines = page.replace('\n', "⏎\n").replace("><", ">\n<");
    insta::assert_snapshot!("eval_report_html", lines);
}
