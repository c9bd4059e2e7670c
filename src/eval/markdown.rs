//! `summary.md`: the results as a Markdown table, with totals, then each task: why it ended
//! and, folded, its final test output.
//!
//! Task names, errors and test output come from a repository that may be hostile, and a
//! Markdown viewer renders inline HTML: such text goes in as escaped inline text or inside a
//! code fence longer than any run of backticks in it, never as markup.

use super::stamp::Stamp;
use super::{TaskResult, Totals};

/// `s` as inline Markdown text: the characters that could start markup (emphasis, links,
/// HTML, code, table cells) backslash-escaped, line breaks flattened to spaces.
pub(crate) fn inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '&' | '|' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `s` in a fenced code block that nothing in it can close.
fn fenced(s: &str) -> String {
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let body = s.strip_suffix('\n').unwrap_or(s);
    format!("{fence}text\n{body}\n{fence}\n")
}

/// `s` as an inline code span that nothing in it can close.
fn code_span(s: &str) -> String {
    let flat = s.replace(['\n', '\r'], " ");
    let longest = flat.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let ticks = "`".repeat(longest + 1);
    // A backtick at either end would join the delimiters; Markdown strips one space each side.
    let pad = if flat.starts_with('`') || flat.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{ticks}{pad}{flat}{pad}{ticks}")
}

fn task_section(r: &TaskResult) -> String {
    let mark = if r.fixed { "fixed" } else { "not fixed" };
    let mut s = format!("### {}: {mark}\n\n", inline(&r.task));
    s.push_str(&format!("- ended: {} after {} step(s)", r.ended(), r.steps));
    if r.attempts > 1 {
        s.push_str(&format!(" and {} attempts", r.attempts));
    }
    s.push('\n');
    if r.tests_changed {
        s.push_str("- a test file was changed: not counted as fixed\n");
    }
    for c in &r.candidates {
        s.push_str(&format!(
            "- {}\n",
            c.line(crate::report::LineStyle::Markdown(inline))
        ));
    }
    s.push_str(&format!("- final test run: {}", r.test_verdict()));
    if let Some(cmd) = &r.test_command {
        s.push_str(&format!(", {}", code_span(cmd)));
    }
    s.push('\n');
    if let Some(e) = &r.error {
        s.push_str(&format!("\nerror:\n\n{}", fenced(e)));
    }
    if !r.test_output.is_empty() {
        // A blank line after `<summary>` lets the fence inside be read as Markdown.
        s.push_str(&format!(
            "\n<details><summary>final test output</summary>\n\n{}\n</details>\n",
            fenced(&r.test_output)
        ));
    }
    s.push('\n');
    s
}

pub fn summary(title: &str, stamp: &Stamp, results: &[TaskResult], t: &Totals) -> String {
    let mut s = format!(
        "# agentbox eval: {}\n\n{}\n\n",
        inline(title),
        inline(&stamp.line())
    );
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
    let mut strategies: Vec<&str> = results.iter().map(|r| r.strategy.as_str()).collect();
    strategies.dedup();
    if let [one] = strategies.as_slice() {
        s.push_str(&format!("- strategy: {one}\n"));
    }
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
                inline(&e.chars().take(80).collect::<String>())
            ),
            None => r.exit_reason.to_string(),
        };
        s.push_str(&format!(
            "| {} | {} | {tests} | {} | {} | {}/{} | {cost} | {:.1} | {ended} |\n",
            inline(&r.task),
            if r.fixed { "yes" } else { "no" },
            if r.tests_changed { "yes" } else { "no" },
            r.steps,
            r.input_tokens,
            r.output_tokens,
            r.wall_secs
        ));
    }
    s.push_str("\n## Tasks\n\n");
    for r in results {
        s.push_str(&task_section(r));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Outcome;

    fn result() -> TaskResult {
        TaskResult {
            steps: 4,
            test_output: "FAILED test_a.py::test_x\n1 failed\n".into(),
            ..TaskResult::for_test("t")
        }
    }

    #[test]
    fn each_task_says_why_it_ended_with_its_test_output_folded() {
        let mut error = result();
        error.task = "e".into();
        error.exit_reason = Outcome::Error;
        error.error = Some("the model API failed\nafter 4 attempts".into());
        error.tests_passed = None;
        error.test_command = None;
        error.test_exit_code = None;
        error.test_output = String::new();
        let rs = [result(), error];
        let md = summary("x", &Stamp::for_test(), &rs, &super::super::totals(&rs));
        assert!(md.starts_with(
            "# agentbox eval: x\n\nwritten 2026-12-05 02:40 UTC by agentbox 0.1.0 · model: m (openai)\n\n**"
        ), "{md}");
        assert!(
            md.contains(
                "| e | no | — | no | 4 | 1/1 | — | 1.0 | error: the model API failed after 4 attempts |"
            ),
            "{md}"
        );
        assert!(md.contains(
            "### t: not fixed\n\n- ended: the model finished after 4 step(s)\n- final test run: failed (exit 1), `pytest -q`\n\n<details><summary>final test output</summary>\n\n```text\nFAILED test_a.py::test_x\n1 failed\n```\n\n</details>\n"
        ), "{md}");
        assert!(md.contains(
            "### e: not fixed\n\n- ended: an error stopped it after 4 step(s)\n- final test run: no test run\n\nerror:\n\n```text\nthe model API failed\nafter 4 attempts\n```\n"
        ), "{md}");
    }

    #[test]
    fn repository_text_cannot_become_markup() {
        let mut r = result();
        r.task = "<img src=x onerror=alert(1)>|x".into();
        r.error = Some("``` </details> <script>".into());
        r.test_command = Some("a ` b".into());
        r.test_output = "````\n</details><script>alert(1)</script>\n".into();
        let rs = [r];
        let stamp = Stamp {
            model: "<img src=x onerror=alert(3)>".into(),
            ..Stamp::for_test()
        };
        let md = summary("x", &stamp, &rs, &super::super::totals(&rs));
        assert!(md.contains("model: \\<img src=x onerror=alert(3)\\>\n"), "{md}");
        // Outside the fences, markup characters are escaped.
        assert!(!md.contains(" <img") && !md.contains("|<img"), "{md}");
        assert!(
            md.contains("| finished: \\`\\`\\` \\</details\\> \\<script\\> |"),
            "{md}"
        );
        assert!(
            md.contains("### \\<img src=x onerror=alert(1)\\>\\|x: not fixed"),
            "{md}"
        );
        assert!(
            md.contains("| \\<img src=x onerror=alert(1)\\>\\|x | no |"),
            "{md}"
        );
        // The fences are longer than any run of backticks inside them.
        assert!(md.contains("\n````text\n``` </details> <script>\n````\n"), "{md}");
        assert!(
            md.contains("\n`````text\n````\n</details><script>alert(1)</script>\n`````\n"),
            "{md}"
        );
        assert!(md.contains(", ``a ` b``\n"), "{md}");
        assert_eq!(md.matches("<details>").count(), 1);
    }
}
