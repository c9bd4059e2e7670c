//! `summary.md`: the results as a Markdown table, with totals.

use super::{TaskResult, Totals};

pub fn summary(title: &str, results: &[TaskResult], t: &Totals) -> String {
    let mut s = format!("# agentbox eval: {title}\n\n");
    let rate = if t.tasks > 0 {
        100.0 * t.fixed as f64 / t.tasks as f64
    } else {
        0.0
    };
    s.push_str(&format!(
        "**{} of {} fixed ({rate:.0}%)** — fixed means agentbox's own final test run passed and no test file changed.\n\n",
        t.fixed, t.tasks
    ));
    s.push_str(&format!(
        "- tests changed (not counted as fixed): {}\n- errors: {}\n- median seconds per task: {:.1}\n",
        t.tests_changed, t.errors, t.median_secs
    ));
    if t.span_secs > 0.0 {
        s.push_str(&format!(
            "- tasks per minute (first start to last finish): {:.1}\n",
            t.tasks as f64 * 60.0 / t.span_secs
        ));
    }
    s.push_str(&format!(
        "- tokens: {} in, {} out\n",
        t.input_tokens, t.output_tokens
    ));
    if let Some(c) = t.cost_usd {
        s.push_str(&format!("- estimated cost: ${c:.4}\n"));
    }
    s.push_str(
        "\n| task | fixed | tests | tests changed | steps | tokens in/out | cost | seconds | ended by |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let tests = match r.tests_passed {
            Some(true) => "pass",
            Some(false) => "fail",
            None => "—",
        };
        let cost = r
            .cost_usd
            .map(|c| format!("${c:.4}"))
            .unwrap_or_else(|| "—".into());
        let ended = match &r.error {
            Some(e) => format!(
                "{}: {}",
                r.exit_reason,
                e.replace('|', "\\|").chars().take(80).collect::<String>()
            ),
            None => r.exit_reason.to_string(),
        };
        s.push_str(&format!(
            "| {} | {} | {tests} | {} | {} | {}/{} | {cost} | {:.1} | {ended} |\n",
            r.task,
            if r.fixed { "yes" } else { "no" },
            if r.tests_changed { "yes" } else { "no" },
            r.steps,
            r.input_tokens,
            r.output_tokens,
            r.wall_secs
        ));
    }
    s
}
