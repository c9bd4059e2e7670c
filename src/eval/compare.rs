//! Result directories side by side (`agentbox eval compare A B...`, and the summary of an
//! eval run with several strategies): per task, fixed or not, seconds and tokens; then the
//! totals of each side: how many fixed, the median seconds, the tokens per task.

use std::collections::BTreeSet;
use std::path::Path;

use super::{TaskResult, load_results, markdown::inline, totals};

/// One side: its label (a directory's name, a strategy) and its results.
pub struct Side {
    pub label: String,
    pub results: Vec<TaskResult>,
}

/// The side of a result directory, labelled `label`; `None` when it holds no results.
pub fn load(dir: &Path, label: &str) -> Option<Side> {
    let results: Vec<TaskResult> = load_results(&dir.join("results.jsonl")).into_values().collect();
    (!results.is_empty()).then(|| Side {
        label: label.to_string(),
        results,
    })
}

/// Tokens a task used, in and out.
fn tokens(r: &TaskResult) -> u64 {
    r.input_tokens + r.output_tokens
}

/// The Markdown table: a row per task (every task of any side), a column per side, then the
/// totals. A task a side did not run is "—" there, and not in its totals.
pub fn table(sides: &[Side]) -> String {
    let tasks: BTreeSet<&str> = sides
        .iter()
        .flat_map(|s| s.results.iter().map(|r| r.task.as_str()))
        .collect();
    let mut s = String::from("| task |");
    for side in sides {
        s.push_str(&format!(" {} |", inline(&side.label)));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(sides.len()));
    s.push('\n');
    for task in &tasks {
        s.push_str(&format!("| {} |", inline(task)));
        for side in sides {
            match side.results.iter().find(|r| r.task == *task) {
                Some(r) => s.push_str(&format!(
                    " {} · {:.1} s · {} tok |",
                    if r.fixed { "fixed" } else { "no" },
                    r.wall_secs,
                    tokens(r)
                )),
                None => s.push_str(" — |"),
            }
        }
        s.push('\n');
    }
    let row = |name: &str, cell: &dyn Fn(&Side) -> String| {
        let mut line = format!("| **{name}** |");
        for side in sides {
            line.push_str(&format!(" {} |", cell(side)));
        }
        line.push('\n');
        line
    };
    s.push_str(&row("fixed", &|side| {
        let t = totals(&side.results);
        format!("{}/{}", t.fixed, t.tasks)
    }));
    s.push_str(&row("median seconds", &|side| {
        format!("{:.1}", totals(&side.results).median_secs)
    }));
    s.push_str(&row("tokens per task", &|side| {
        let n = side.results.len().max(1) as u64;
        (side.results.iter().map(tokens).sum::<u64>() / n).to_string()
    }));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(task: &str, fixed: bool, secs: f64, tokens: u64) -> TaskResult {
        let mut r = TaskResult::for_test(task);
        r.fixed = fixed;
        r.wall_secs = secs;
        r.input_tokens = tokens;
        r.output_tokens = 0;
        r
    }

    #[test]
    fn sides_go_next_to_each_other_with_their_totals() {
        let a = Side {
            label: "loop".into(),
            results: vec![result("a", false, 100.0, 9000), result("b", true, 50.0, 3000)],
        };
        let b = Side {
            label: "repair".into(),
            results: vec![result("a", true, 10.0, 2000)],
        };
        let t = table(&[a, b]);
        assert!(t.starts_with("| task | loop | repair |\n|---|---|---|\n"), "{t}");
        assert!(
            t.contains("| a | no · 100.0 s · 9000 tok | fixed · 10.0 s · 2000 tok |\n"),
            "{t}"
        );
        assert!(t.contains("| b | fixed · 50.0 s · 3000 tok | — |\n"), "{t}");
        assert!(t.contains("| **fixed** | 1/2 | 1/1 |\n"), "{t}");
        assert!(t.contains("| **median seconds** | 100.0 | 10.0 |\n"), "{t}");
        assert!(t.contains("| **tokens per task** | 6000 | 2000 |\n"), "{t}");
    }

    #[test]
    fn a_directory_is_read_from_its_results() {
        let d = tempfile::tempdir().unwrap();
        assert!(load(d.path(), "x").is_none());
        let log = super::super::ResultLog::open(&d.path().join("results.jsonl"), true).unwrap();
        log.append(&result("a", true, 1.0, 5)).unwrap();
        let side = load(d.path(), "x").unwrap();
        assert_eq!((side.label.as_str(), side.results.len()), ("x", 1));
    }
}
