//! `report.html`: one self-contained page (no scripts, no external resources) with the
//! totals, a chart of outcomes, a chart of time per task, and each task's diff, final test run
//! and trajectory.
//!
//! Task names, diffs, file names, test output and everything the model said come from a
//! repository that may be hostile. The page is written with `maud`, whose `html!` escapes every
//! interpolation: text reaches the page unescaped only through `PreEscaped`, used here for two
//! constants of this file and nothing else.

use std::path::Path;

use maud::{Markup, PreEscaped, html};

use super::stamp::Stamp;
use super::{OutDir, TaskResult, Totals};
use crate::events::{Recorded, Trajectory};
use crate::model::Block;
use crate::report::Outcome;

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!(
            "{}\n… [{} more characters]",
            s.chars().take(max).collect::<String>(),
            s.chars().count() - max
        )
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Fixed,
    Failed,
    TestsChanged,
    Error,
}

impl Kind {
    fn of(r: &TaskResult) -> Kind {
        if r.fixed {
            Kind::Fixed
        } else if r.exit_reason == Outcome::Error {
            Kind::Error
        } else if r.tests_changed {
            Kind::TestsChanged
        } else {
            Kind::Failed
        }
    }
    fn label(self) -> &'static str {
        match self {
            Kind::Fixed => "fixed",
            Kind::Failed => "not fixed",
            Kind::TestsChanged => "tests changed",
            Kind::Error => "error",
        }
    }
    fn color(self) -> &'static str {
        match self {
            Kind::Fixed => "#2e8b57",
            Kind::Failed => "#d98c1f",
            Kind::TestsChanged => "#c0392b",
            Kind::Error => "#7f8c8d",
        }
    }
}

const KINDS: [Kind; 4] = [Kind::Fixed, Kind::Failed, Kind::TestsChanged, Kind::Error];

/// SVG elements are always written with a body (`{}`): an HTML parser reads `<rect>` without
/// `</rect>` as an open element that swallows its siblings.
fn outcome_chart(results: &[TaskResult]) -> Markup {
    let total = results.len().max(1) as f64;
    let (w, h) = (640.0, 36.0);
    let mut x = 0.0;
    let mut bars = Vec::new();
    for (i, k) in KINDS.into_iter().enumerate() {
        let n = results.iter().filter(|r| Kind::of(r) == k).count();
        let width = w * n as f64 / total;
        bars.push((k, n, x, width, 150.0 * i as f64));
        x += width;
    }
    html! {
        svg class="chart" viewBox=(format!("0 0 {w} {}", h + 28.0)) role="img" aria-label="outcomes" {
            @for (k, n, x, width, legend) in bars {
                @if n > 0 {
                    rect x=(format!("{x:.1}")) y="0" width=(format!("{width:.1}")) height=(format!("{h}")) fill=(k.color()) {
                        title { (k.label()) ": " (n) }
                    }
                    @if width > 24.0 {
                        text x=(format!("{:.1}", x + width / 2.0)) y="23" class="bar-label" { (n) }
                    }
                }
                rect x=(format!("{legend:.0}")) y=(format!("{}", h + 10.0)) width="12" height="12" fill=(k.color()) {}
                text x=(format!("{:.0}", legend + 16.0)) y=(format!("{}", h + 21.0)) class="legend" { (k.label()) " (" (n) ")" }
            }
        }
    }
}

fn time_chart(results: &[TaskResult]) -> Markup {
    let max = results.iter().map(|r| r.wall_secs).fold(0.0, f64::max).max(0.001);
    let row = 22.0;
    let (label_w, bar_w) = (220.0, 380.0);
    let h = row * results.len() as f64 + 4.0;
    html! {
        svg class="chart" viewBox=(format!("0 0 {} {h}", label_w + bar_w + 70.0)) role="img" aria-label="seconds per task" {
            @for (i, r) in results.iter().enumerate() {
                @let y = i as f64 * row;
                @let width = bar_w * r.wall_secs / max;
                text x=(format!("{:.0}", label_w - 8.0)) y=(format!("{:.0}", y + 15.0)) class="task-label" text-anchor="end" { (r.task) }
                rect x=(format!("{label_w}")) y=(format!("{:.0}", y + 3.0)) width=(format!("{width:.1}")) height=(format!("{:.0}", row - 6.0)) fill=(Kind::of(r).color()) {
                    title { (r.task) ": " (format!("{:.1}", r.wall_secs)) "s" }
                }
                text x=(format!("{:.1}", label_w + width + 6.0)) y=(format!("{:.0}", y + 15.0)) class="legend" { (format!("{:.1}", r.wall_secs)) "s" }
            }
        }
    }
}

fn diff_line_class(line: &str) -> Option<&'static str> {
    if line.starts_with("+++") || line.starts_with("---") || line.starts_with("diff ") {
        Some("meta")
    } else if line.starts_with('+') {
        Some("add")
    } else if line.starts_with('-') {
        Some("del")
    } else if line.starts_with("@@") {
        Some("hunk")
    } else {
        None
    }
}

/// One line per span, each ended by its newline (so the text copies as a diff); the coloured
/// lines are full-width inline blocks, as a block would add a blank line before that newline.
fn diff_html(diff: &str) -> Markup {
    html! {
        pre.diff {
            @for line in diff.lines() {
                span class=[diff_line_class(line)] { (line) } "\n"
            }
        }
    }
}

fn trajectory_html(path: &Path) -> Markup {
    let Ok(t) = Trajectory::read(path) else {
        return html! { p.muted { "no trajectory" } };
    };
    html! {
        ol.trajectory {
            @for e in &t.events {
                @match e {
                    Recorded::ModelResponse { step, turn, .. } => {
                        li.model {
                            b { "step " (step) } " "
                            span.muted {
                                "stop_reason=" (turn.stop) " in=" (turn.usage.total_input())
                                " out=" (turn.usage.output_tokens)
                            }
                            @for b in &turn.content {
                                @if let Block::Text { text } = b {
                                    div.say { (clip(text, 2000)) }
                                }
                            }
                        }
                    }
                    Recorded::ToolStarted { call, .. } => {
                        li.call {
                            code { (call.name) } " "
                            code.args { (clip(&call.arguments.to_json_text(), 400)) }
                        }
                    }
                    Recorded::ToolFinished { content, is_error, .. } => {
                        li.result.error[*is_error] { pre { (clip(content, 1500)) } }
                    }
                    Recorded::Verifying { command } => {
                        li.muted { "agentbox runs " code { (command) } }
                    }
                    Recorded::Other => {}
                }
            }
        }
        @if t.unreadable > 0 {
            p.muted { (t.unreadable) " line(s) of the trajectory could not be read" }
        }
    }
}

/// The task's second row: why it ended, its diff, its final test run and its trajectory.
fn task_details(r: &TaskResult, out: &OutDir) -> Markup {
    let diff = std::fs::read_to_string(out.diff(&r.task)).unwrap_or_default();
    let changed = if r.changed_files.is_empty() {
        "no files".to_string()
    } else {
        r.changed_files.join(", ")
    };
    html! {
        p.ended {
            b { "ended: " } (r.ended()) " after " (r.steps) " step(s)"
            @if r.attempts > 1 { " and " (r.attempts) " attempts" }
        }
        @if let Some(e) = &r.error {
            p { b { "error:" } " " (e) }
        }
        @if let Some(summary) = &r.summary {
            p.muted { "model's summary: " (clip(summary, 600)) }
        }
        @if !r.candidates.is_empty() {
            details {
                summary { "strategy " (r.strategy.as_str()) ": " (r.candidates.len()) " candidate(s)" }
                ul {
                    @for c in &r.candidates {
                        li {
                            (c.headline())
                            @if !c.files.is_empty() { " · " code { (c.files.join(", ")) } }
                            @if !c.detail.is_empty() { pre.tests { (clip(&c.detail, 1500)) } }
                        }
                    }
                }
            }
        }
        details {
            summary { "diff (" (changed) ")" }
            @if diff.is_empty() {
                p.muted { "no changes" }
            } @else {
                (diff_html(&diff))
            }
        }
        details {
            summary {
                "final test run: " (r.test_verdict())
                @if let Some(cmd) = &r.test_command { " · " code { (cmd) } }
            }
            @if r.test_output.is_empty() {
                p.muted { "no output" }
            } @else {
                pre.tests { (r.test_output) }
            }
        }
        details {
            summary { "trajectory" }
            (trajectory_html(&out.trajectory(&r.task)))
        }
    }
}

/// Written into the page as it is: a constant of this file, never data.
const STYLE: &str = "
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#1d2329;background:#fbfbfa}
h1{font-size:1.6rem;margin:.2rem 0}h2{font-size:1.15rem;margin-top:2rem}
.muted{color:#6b7480}.cards{display:flex;flex-wrap:wrap;gap:.8rem;margin:1rem 0}
.card{background:#fff;border:1px solid #e3e6ea;border-radius:8px;padding:.7rem 1rem;min-width:130px}
.card b{display:block;font-size:1.35rem}.chart{width:100%;height:auto;background:#fff;border:1px solid #e3e6ea;border-radius:8px;padding:8px}
.bar-label{fill:#fff;font-size:13px;font-weight:600;text-anchor:middle}.legend,.task-label{font-size:12px;fill:#1d2329}
table{border-collapse:collapse;width:100%;background:#fff}th,td{border-bottom:1px solid #e3e6ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#f1f3f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pill{display:inline-block;padding:0 .5rem;border-radius:999px;color:#fff;font-size:12px}
p.ended{margin:.2rem 0}details{margin:.3rem 0 .8rem}summary{cursor:pointer;color:#2b5fab}
pre{white-space:pre-wrap;word-break:break-word;margin:.2rem 0;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre.diff,pre.tests{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:.5rem}
.add,.del,.hunk,.meta{display:inline-block;width:100%}.add{color:#1a7f37;background:#e6ffec}.del{color:#cf222e;background:#ffebe9}.hunk{color:#8250df}.meta{color:#57606a;font-weight:600}
ol.trajectory{padding-left:1.2rem}ol.trajectory li{margin:.25rem 0}.say{white-space:pre-wrap;margin:.2rem 0 .2rem .5rem;color:#39424c}
li.call code{background:#eef1f4;padding:0 .3rem;border-radius:4px}code.args{color:#57606a}
li.result pre{background:#f6f8fa;border-left:3px solid #9aa5b1;padding:.3rem .5rem}li.result.error pre{border-left-color:#c0392b;background:#fff5f5}
";

/// `maud::DOCTYPE` is upper case; pages and tests here have always started with this one.
const DOCTYPE: &str = "<!doctype html>";

pub fn report(title: &str, stamp: &Stamp, results: &[TaskResult], t: &Totals, out: &OutDir) -> String {
    let rate = if t.tasks > 0 {
        100.0 * t.fixed as f64 / t.tasks as f64
    } else {
        0.0
    };
    let per_min = if t.span_secs > 0.0 {
        format!("{:.1}", t.tasks as f64 * 60.0 / t.span_secs)
    } else {
        "—".into()
    };
    let cost = |c: Option<f64>| c.map(|c| format!("${c:.4}")).unwrap_or_else(|| "—".into());
    let cards = [
        ("fixed", format!("{}/{} ({rate:.0}%)", t.fixed, t.tasks)),
        ("tests changed", t.tests_changed.to_string()),
        ("errors", t.errors.to_string()),
        ("median s / task", format!("{:.1}", t.median_secs)),
        ("tasks / minute", per_min),
        (
            "tokens in / out",
            format!("{} / {}", t.input_tokens, t.output_tokens),
        ),
        ("est. cost", cost(t.cost_usd)),
    ];
    let page = html! {
        (PreEscaped(DOCTYPE))
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                title { "agentbox eval: " (title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "agentbox eval: " (title) }
                p.muted { (stamp.line()) " · fixed means agentbox's own final test run passed and no test file changed" }
                div.cards {
                    @for (label, value) in &cards {
                        div.card { span.muted { (label) } b { (value) } }
                    }
                }
                h2 { "Outcomes" }
                (outcome_chart(results))
                h2 { "Seconds per task" }
                (time_chart(results))
                h2 { "Tasks" }
                table {
                    thead {
                        tr {
                            th { "task" } th { "outcome" } th { "ended" } th { "tests" } th { "steps" }
                            th { "tokens in/out" } th { "cost" } th { "seconds" }
                        }
                    }
                    tbody {
                        @for r in results {
                            @let k = Kind::of(r);
                            tr id=(format!("task-{}", r.task)) {
                                td { b { (r.task) } }
                                td { span.pill style=(format!("background:{}", k.color())) { (k.label()) } }
                                td { (r.exit_reason) }
                                td {
                                    @match r.tests_passed {
                                        Some(true) => "pass",
                                        Some(false) => "fail",
                                        None => "—",
                                    }
                                }
                                td.num { (r.steps) }
                                td.num { (r.input_tokens) " / " (r.output_tokens) }
                                td.num { (cost(r.cost_usd)) }
                                td.num { (format!("{:.1}", r.wall_secs)) }
                            }
                            tr { td colspan="8" { (task_details(r, out)) } }
                        }
                    }
                }
            }
        }
    };
    let mut html = page.into_string();
    html.push('\n');
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, EventSink, Redactor, TrajectoryWriter};
    use crate::model::{StopReason, ToolArgs, ToolCall, Turn, Usage};

    #[test]
    fn diffs_are_coloured_by_line() {
        let h = diff_html("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old <b>\n+new\n same\n").into_string();
        assert!(h.contains("<span class=\"del\">-old &lt;b&gt;</span>"), "{h}");
        assert!(h.contains("<span class=\"add\">+new</span>"), "{h}");
        assert!(h.contains("<span> same</span>"), "{h}");
    }

    /// Markup a hostile repository could put in any text the page shows. Each use gets its own
    /// tag, so the test can tell that every field reached the page, escaped.
    fn hostile(field: &str) -> String {
        format!(
            "<script>alert('{field}')</script>\"'><img src=x onerror=alert('{field}')></details></pre></code>"
        )
    }

    #[test]
    fn text_from_the_repository_and_the_model_reaches_the_page_only_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutDir {
            root: dir.path().to_path_buf(),
        };
        out.create().unwrap();
        // A task name is a directory name: no slash.
        let task = "<b onmouseover=alert(1)>task\"'><img src=x onerror=alert(2)>".to_string();
        std::fs::write(
            out.diff(&task),
            format!(
                "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-{}\n+{}\n {}\n",
                hostile("diff-del"),
                hostile("diff-add"),
                hostile("diff-context")
            ),
        )
        .unwrap();
        let w = TrajectoryWriter::create(&out.trajectory(&task), Redactor::default()).unwrap();
        let call = ToolCall {
            id: hostile("call-id"),
            name: hostile("tool-name"),
            arguments: ToolArgs::Json(serde_json::json!({ "path": hostile("tool-args") })),
        };
        let turn = Turn {
            content: vec![
                Block::Text {
                    text: hostile("model-text"),
                },
                Block::ToolCall(call.clone()),
            ],
            stop: StopReason::Other(hostile("stop-reason")),
            usage: Usage::default(),
        };
        w.emit(&Event::ModelResponse {
            step: 1,
            turn: &turn,
            elapsed_ms: 1,
            estimated_usage: false,
        });
        w.emit(&Event::ToolStarted { step: 1, call: &call });
        let output = hostile("tool-output");
        w.emit(&Event::ToolFinished {
            step: 1,
            call_id: "c",
            name: "bash",
            content: &output,
            is_error: true,
            elapsed_ms: 1,
        });
        w.emit(&Event::Verifying {
            command: hostile("verify-command"),
        });
        drop(w);
        let result = TaskResult {
            tests_changed: true,
            changed_files: vec![hostile("changed-file"), "ok.py".into()],
            exit_reason: Outcome::Error,
            error: Some(hostile("error")),
            model: hostile("model"),
            summary: Some(hostile("summary")),
            test_command: Some(hostile("test-command")),
            test_output: hostile("test-output"),
            candidates: vec![crate::report::CandidateReport {
                files: vec![hostile("candidate-file")],
                detail: hostile("candidate-detail"),
                ..crate::report::CandidateReport::new(1, 1, 0.0, crate::report::CandidateVerdict::Failed)
            }],
            ..TaskResult::for_test(&task)
        };
        let results = [result];
        let page = report(
            &hostile("title"),
            &Stamp {
                written: "2026-12-05 02:40 UTC".into(),
                model: hostile("model-name"),
                version: "0.1.0".into(),
            },
            &results,
            &super::super::totals(&results),
            &out,
        );

        let fields = [
            "title",
            "model-name",
            "error",
            "summary",
            "changed-file",
            "diff-del",
            "diff-add",
            "diff-context",
            "model-text",
            "stop-reason",
            "tool-name",
            "tool-output",
            "verify-command",
            "test-command",
            "candidate-file",
            "candidate-detail",
            "test-output",
        ];
        for field in fields {
            let raw = hostile(field);
            assert!(!page.contains(&raw), "{field} reached the page unescaped");
            let escaped = format!("&lt;script&gt;alert('{field}')&lt;/script&gt;&quot;'&gt;&lt;img");
            assert!(page.contains(&escaped), "{field} is not on the page");
        }
        // Tool arguments are shown as JSON text, the markup inside escaped as well.
        assert!(page.contains("&lt;script&gt;alert('tool-args')&lt;/script&gt;"));
        // The task name, in the table, the chart and the row's id.
        assert!(!page.contains(&task));
        assert!(
            page.contains("&lt;b onmouseover=alert(1)&gt;task&quot;'&gt;&lt;img src=x onerror=alert(2)&gt;")
        );
        assert!(page.contains("id=\"task-&lt;b onmouseover=alert(1)&gt;task&quot;'&gt;"));
        // Nothing hostile became an element, and every fold closes where the page closes it.
        for tag in ["<script", "<img", "<b onmouseover"] {
            assert!(!page.contains(tag), "{tag}");
        }
        // Diff, test run, trajectory, and the candidates.
        assert_eq!(page.matches("<details>").count(), 4);
        assert_eq!(page.matches("</details>").count(), 4);
        assert_eq!(page.matches("<pre").count(), page.matches("</pre>").count());
        assert_eq!(page.matches("<code").count(), page.matches("</code>").count());
    }

    #[test]
    fn each_task_shows_why_it_ended_and_its_final_test_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutDir {
            root: dir.path().to_path_buf(),
        };
        out.create().unwrap();
        let result = TaskResult {
            steps: 20,
            exit_reason: Outcome::StepLimit,
            test_output: "FAILED test_a.py::test_x\n1 failed in 0.01s\n".into(),
            ..TaskResult::for_test("t")
        };
        let results = [result];
        let page = report(
            "x",
            &Stamp::for_test(),
            &results,
            &super::super::totals(&results),
            &out,
        );
        assert!(page.contains("<td>step_limit</td>"), "{page}");
        assert!(page.contains("the step limit was reached after 20 step(s)"));
        assert!(page.contains("<summary>final test run: failed (exit 1) · <code>pytest -q</code></summary>"));
        assert!(page.contains("<pre class=\"tests\">FAILED test_a.py::test_x\n1 failed in 0.01s\n</pre>"));
        assert!(page.contains("<p class=\"muted\">no trajectory</p>"));
    }
}
