//! `report.html`: one self-contained page (no scripts, no external resources) with the
//! totals, a chart of outcomes, a chart of time per task, and each task's diff and trajectory.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use super::{OutDir, TaskResult, Totals};

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

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
        } else if r.exit_reason == crate::report::Outcome::Error {
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

fn outcome_chart(results: &[TaskResult]) -> String {
    let total = results.len().max(1) as f64;
    let (w, h) = (640.0, 36.0);
    let mut x = 0.0;
    let mut svg = format!(
        "<svg class=chart viewBox='0 0 {w} {}' role=img aria-label='outcomes'>",
        h + 28.0
    );
    let mut legend = 0.0;
    for k in KINDS {
        let n = results.iter().filter(|r| Kind::of(r) == k).count();
        let width = w * n as f64 / total;
        if n > 0 {
            let _ = write!(
                svg,
                "<rect x='{x:.1}' y='0' width='{width:.1}' height='{h}' fill='{}'><title>{}: {n}</title></rect>",
                k.color(),
                k.label()
            );
            if width > 24.0 {
                let _ = write!(
                    svg,
                    "<text x='{:.1}' y='23' class=bar-label>{n}</text>",
                    x + width / 2.0
                );
            }
        }
        let _ = write!(
            svg,
            "<rect x='{legend:.0}' y='{}' width='12' height='12' fill='{}'/><text x='{:.0}' y='{}' class=legend>{} ({n})</text>",
            h + 10.0,
            k.color(),
            legend + 16.0,
            h + 21.0,
            k.label()
        );
        legend += 150.0;
        x += width;
    }
    svg.push_str("</svg>");
    svg
}

fn time_chart(results: &[TaskResult]) -> String {
    let max = results.iter().map(|r| r.wall_secs).fold(0.0, f64::max).max(0.001);
    let row = 22.0;
    let (label_w, bar_w) = (220.0, 380.0);
    let h = row * results.len() as f64 + 4.0;
    let mut svg = format!(
        "<svg class=chart viewBox='0 0 {} {h}' role=img aria-label='seconds per task'>",
        label_w + bar_w + 70.0
    );
    for (i, r) in results.iter().enumerate() {
        let y = i as f64 * row;
        let width = bar_w * r.wall_secs / max;
        let _ = write!(
            svg,
            "<text x='{:.0}' y='{:.0}' class=task-label text-anchor=end>{}</text><rect x='{label_w}' y='{:.0}' width='{width:.1}' height='{:.0}' fill='{}'><title>{}: {:.1}s</title></rect><text x='{:.1}' y='{:.0}' class=legend>{:.1}s</text>",
            label_w - 8.0,
            y + 15.0,
            escape(&r.task),
            y + 3.0,
            row - 6.0,
            Kind::of(r).color(),
            escape(&r.task),
            r.wall_secs,
            label_w + width + 6.0,
            y + 15.0,
            r.wall_secs
        );
    }
    svg.push_str("</svg>");
    svg
}

fn diff_html(diff: &str) -> String {
    let mut out = String::from("<pre class=diff>");
    for line in diff.lines() {
        let class = if line.starts_with("+++") || line.starts_with("---") || line.starts_with("diff ") {
            "meta"
        } else if line.starts_with('+') {
            "add"
        } else if line.starts_with('-') {
            "del"
        } else if line.starts_with("@@") {
            "hunk"
        } else {
            ""
        };
        let _ = writeln!(out, "<span class='{class}'>{}</span>", escape(line));
    }
    out.push_str("</pre>");
    out
}

fn trajectory_html(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return "<p class=muted>no trajectory</p>".into();
    };
    let mut out = String::from("<ol class=trajectory>");
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match e["event"].as_str().unwrap_or_default() {
            "model_response" => {
                let turn = &e["turn"];
                let _ = write!(
                    out,
                    "<li class=model><b>step {}</b> <span class=muted>stop_reason={} in={} out={}</span>",
                    e["step"],
                    escape(turn["stop"].as_str().unwrap_or("?")),
                    turn["usage"]["input_tokens"].as_u64().unwrap_or(0)
                        + turn["usage"]["cache_read_tokens"].as_u64().unwrap_or(0)
                        + turn["usage"]["cache_write_tokens"].as_u64().unwrap_or(0),
                    turn["usage"]["output_tokens"]
                );
                for b in turn["content"].as_array().into_iter().flatten() {
                    if b["type"] == "text" {
                        let _ = write!(
                            out,
                            "<div class=say>{}</div>",
                            escape(&clip(b["text"].as_str().unwrap_or_default(), 2000))
                        );
                    }
                }
                out.push_str("</li>");
            }
            "tool_started" => {
                let call = &e["call"];
                let _ = write!(
                    out,
                    "<li class=call><code>{}</code> <code class=args>{}</code></li>",
                    escape(call["name"].as_str().unwrap_or_default()),
                    escape(&clip(&call["arguments"].to_string(), 400))
                );
            }
            "tool_finished" => {
                let err = e["is_error"].as_bool().unwrap_or(false);
                let _ = write!(
                    out,
                    "<li class='result{}'><pre>{}</pre></li>",
                    if err { " error" } else { "" },
                    escape(&clip(e["content"].as_str().unwrap_or_default(), 1500))
                );
            }
            "verifying" => {
                let _ = write!(
                    out,
                    "<li class=muted>agentbox runs <code>{}</code></li>",
                    escape(e["command"].as_str().unwrap_or_default())
                );
            }
            _ => {}
        }
    }
    out.push_str("</ol>");
    out
}

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
details{margin:.3rem 0 .8rem}summary{cursor:pointer;color:#2b5fab}
pre{white-space:pre-wrap;word-break:break-word;margin:.2rem 0;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre.diff{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:.5rem}
.add{color:#1a7f37;background:#e6ffec;display:block}.del{color:#cf222e;background:#ffebe9;display:block}.hunk{color:#8250df;display:block}.meta{color:#57606a;font-weight:600;display:block}
ol.trajectory{padding-left:1.2rem}ol.trajectory li{margin:.25rem 0}.say{white-space:pre-wrap;margin:.2rem 0 .2rem .5rem;color:#39424c}
li.call code{background:#eef1f4;padding:0 .3rem;border-radius:4px}code.args{color:#57606a}
li.result pre{background:#f6f8fa;border-left:3px solid #9aa5b1;padding:.3rem .5rem}li.result.error pre{border-left-color:#c0392b;background:#fff5f5}
";

pub fn report(title: &str, model: &str, results: &[TaskResult], t: &Totals, out: &OutDir) -> String {
    let mut s = String::new();
    let rate = if t.tasks > 0 {
        100.0 * t.fixed as f64 / t.tasks as f64
    } else {
        0.0
    };
    let _ = write!(
        s,
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width,initial-scale=1'>\
         <title>agentbox eval: {0}</title><style>{STYLE}</style></head><body>\
         <h1>agentbox eval: {0}</h1><p class=muted>{1} · fixed means agentbox's own final test run passed and no test file changed</p>",
        escape(title),
        escape(model)
    );
    let per_min = if t.span_secs > 0.0 {
        format!("{:.1}", t.tasks as f64 * 60.0 / t.span_secs)
    } else {
        "—".into()
    };
    let cost = t
        .cost_usd
        .map(|c| format!("${c:.4}"))
        .unwrap_or_else(|| "—".into());
    s.push_str("<div class=cards>");
    for (label, value) in [
        ("fixed", format!("{}/{} ({rate:.0}%)", t.fixed, t.tasks)),
        ("tests changed", t.tests_changed.to_string()),
        ("errors", t.errors.to_string()),
        ("median s / task", format!("{:.1}", t.median_secs)),
        ("tasks / minute", per_min),
        (
            "tokens in / out",
            format!("{} / {}", t.input_tokens, t.output_tokens),
        ),
        ("est. cost", cost),
    ] {
        let _ = write!(
            s,
            "<div class=card><span class=muted>{label}</span><b>{}</b></div>",
            escape(&value)
        );
    }
    s.push_str("</div><h2>Outcomes</h2>");
    s.push_str(&outcome_chart(results));
    s.push_str("<h2>Seconds per task</h2>");
    s.push_str(&time_chart(results));
    s.push_str("<h2>Tasks</h2><table><thead><tr><th>task</th><th>outcome</th><th>tests</th><th>steps</th><th>tokens in/out</th><th>cost</th><th>seconds</th></tr></thead><tbody>");
    for r in results {
        let k = Kind::of(r);
        let tests = match r.tests_passed {
            Some(true) => "pass",
            Some(false) => "fail",
            None => "—",
        };
        let _ = write!(
            s,
            "<tr id='task-{0}'><td><b>{0}</b></td><td><span class=pill style='background:{1}'>{2}</span></td><td>{tests}</td><td class=num>{3}</td><td class=num>{4} / {5}</td><td class=num>{6}</td><td class=num>{7:.1}</td></tr>",
            escape(&r.task),
            k.color(),
            k.label(),
            r.steps,
            r.input_tokens,
            r.output_tokens,
            r.cost_usd
                .map(|c| format!("${c:.4}"))
                .unwrap_or_else(|| "—".into()),
            r.wall_secs
        );
        s.push_str("<tr><td colspan=7>");
        if let Some(e) = &r.error {
            let _ = write!(s, "<p><b>error:</b> {}</p>", escape(e));
        }
        if let Some(summary) = &r.summary {
            let _ = write!(
                s,
                "<p class=muted>model's summary: {}</p>",
                escape(&clip(summary, 600))
            );
        }
        let diff = std::fs::read_to_string(out.diff(&r.task)).unwrap_or_default();
        let changed = if r.changed_files.is_empty() {
            "no files".to_string()
        } else {
            r.changed_files.join(", ")
        };
        let _ = write!(
            s,
            "<details><summary>diff ({})</summary>{}</details>",
            escape(&changed),
            if diff.is_empty() {
                "<p class=muted>no changes</p>".into()
            } else {
                diff_html(&diff)
            }
        );
        let _ = write!(
            s,
            "<details><summary>trajectory</summary>{}</details>",
            trajectory_html(&out.trajectory(&r.task))
        );
        s.push_str("</td></tr>");
    }
    s.push_str("</tbody></table></body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_markup_out() {
        assert_eq!(
            escape("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
    }

    #[test]
    fn diffs_are_coloured_by_line() {
        let h = diff_html("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old <b>\n+new\n");
        assert!(h.contains("<span class='del'>-old &lt;b&gt;</span>"));
        assert!(h.contains("<span class='add'>+new</span>"));
    }
}
