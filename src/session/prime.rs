//! `--prime`: the first message carries what a small model would otherwise spend its first
//! steps (and often its whole budget) collecting: the file list, the failing test output, and
//! the source files under test.

use crate::project::is_test_file;
use crate::tools::{TestRun, ToolContext, read_file::number_lines};
use crate::workspace::Workspace;

/// Source files worth showing whole; others are only listed.
const SOURCE_EXTENSIONS: &[&str] = &[
    ".py", ".js", ".ts", ".go", ".rs", ".rb", ".java", ".c", ".h", ".cpp", ".sh",
];
const MAX_FILE: usize = 8 * 1024;
const MAX_SOURCES: usize = 12 * 1024;

/// `before`: the tests as they ran before the first turn, when the session ran them (the
/// project is the same at every attempt's start), so they are not run again.
pub async fn first_message(task: &str, ctx: &ToolContext<'_>, before: Option<&[TestRun]>) -> String {
    let mut msg = format!("{task}\n\nTo start with, here is the project.\n");
    let ws = Workspace::new(ctx.sandbox);
    let files = ws.list(".", 200).await.map(|l| l.lines).unwrap_or_default();
    if !files.is_empty() {
        msg.push_str(&format!("\nIts files:\n{}\n", files.join("\n")));
    }
    let ran;
    let runs = match before {
        Some(runs) => Some(runs),
        None if ctx.settings.test_commands.is_empty() => None,
        None => {
            ran = ctx.run_tests().await.ok();
            ran.as_deref()
        }
    };
    if let Some(runs) = runs {
        let share = 2500 / runs.len().max(1);
        for r in runs {
            let state = if r.output.success() { "passes" } else { "fails" };
            msg.push_str(&format!(
                "\nThe test command `{}` {state} now ({}); the end of its output:\n{}\n",
                r.command,
                r.output.status_line(),
                r.output.stdout.shrink(0, share).to_text().trim_end()
            ));
        }
    }
    let mut budget = MAX_SOURCES;
    for path in files
        .iter()
        .filter(|p| SOURCE_EXTENSIONS.iter().any(|e| p.ends_with(e)))
    {
        if is_test_file(path, &ctx.settings.test_patterns) {
            continue;
        }
        let Ok(file) = ws.read(path, MAX_FILE).await else {
            continue;
        };
        if !file.complete() || file.data.len() > budget || file.data.contains(&0) {
            continue;
        }
        budget -= file.data.len();
        let text = String::from_utf8_lossy(&file.data);
        if let Ok(numbered) = number_lines(&text, None, None, 10_000) {
            msg.push_str(&format!(
                "\nThe file {path} (line numbers and a tab, then the line):\n{numbered}\n"
            ));
        }
    }
    msg
}
