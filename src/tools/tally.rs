//! How many tests passed and which failed, read from a test command's output by its runner's
//! own summary: pytest, `cargo test`, `go test`, `node --test` (and `npm test` running it).
//! Repair's rounds and the loop's best state compare projects by it: fewer failing tests, none
//! of the ones that passed now failing. A run that does not even collect (a syntax error, a
//! compile error) counts as every test failing.

use std::collections::BTreeSet;

/// One test run, as counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tests that passed, when the runner says (`go test` without `-v` does not).
    pub passed: Option<u32>,
    /// Tests that failed.
    pub failed: u32,
    /// The failing tests' names, as the runner prints them.
    pub failing: BTreeSet<String>,
    /// Nothing ran to a verdict: collection or compilation failed. Every test counts as failing.
    pub broken: bool,
}

/// Read `output` of a test command that exited with `exit_code`. `None` when no runner's
/// summary is in it (the command is not one of the runners read, or its output was cut there).
pub fn tally(output: &str, exit_code: i64) -> Option<Tally> {
    if exit_code == 0 {
        // Passing is passing, whatever the summary says; the counts if they can be read.
        let mut t = pytest(output)
            .or_else(|| cargo(output))
            .or_else(|| node(output))
            .or_else(|| go(output))
            .unwrap_or_default();
        t.failed = 0;
        t.failing.clear();
        t.broken = false;
        return Some(t);
    }
    pytest(output)
        .or_else(|| cargo(output))
        .or_else(|| node(output))
        .or_else(|| go(output))
}

/// The number just before `word` in `line` ("3 failed"), if any.
fn count_before(line: &str, word: &str) -> Option<u32> {
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '=')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .find(|w| w[1].trim_end_matches(['.', ',']) == word)
        .and_then(|w| w[0].parse().ok())
}

fn pytest(output: &str) -> Option<Tally> {
    // The last line like "2 failed, 3 passed in 0.05s" or "1 error in 0.10s".
    let summary = output
        .lines()
        .rev()
        .map(|l| l.trim().trim_matches('=').trim())
        .find(|l| {
            (l.starts_with(|c: char| c.is_ascii_digit()) || l.starts_with("no tests ran"))
                && (l.contains(" passed")
                    || l.contains(" failed")
                    || l.contains(" error")
                    || l.contains("no tests ran"))
                && l.contains(" in ")
        })?;
    let failed = count_before(summary, "failed").unwrap_or(0);
    let passed = count_before(summary, "passed").unwrap_or(0);
    let errors = count_before(summary, "error")
        .or_else(|| count_before(summary, "errors"))
        .unwrap_or(0);
    let mut failing = BTreeSet::new();
    let mut collect_error = output.contains("ERROR collecting") || output.contains("Interrupted: ");
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("FAILED ") {
            failing.insert(rest.split(" - ").next().unwrap_or(rest).trim().to_string());
        } else if let Some(rest) = line.strip_prefix("ERROR ") {
            let name = rest.split(" - ").next().unwrap_or(rest).trim();
            if name.contains("::") {
                failing.insert(name.to_string()); // an error in a fixture: that test failed
            } else {
                collect_error = true; // a file that did not import
            }
        }
    }
    Some(Tally {
        passed: Some(passed),
        failed: failed + errors,
        failing,
        broken: collect_error || (failed == 0 && passed == 0 && errors > 0),
    })
}

fn cargo(output: &str) -> Option<Tally> {
    let results: Vec<&str> = output
        .lines()
        .filter(|l| l.trim_start().starts_with("test result:"))
        .collect();
    let compile_failed = output.contains("error: could not compile") || output.contains("error[E");
    if results.is_empty() {
        return compile_failed.then(|| Tally {
            broken: true,
            ..Tally::default()
        });
    }
    let mut t = Tally {
        passed: Some(0),
        broken: compile_failed,
        ..Tally::default()
    };
    for r in results {
        t.passed = t.passed.map(|p| p + count_before(r, "passed").unwrap_or(0));
        t.failed += count_before(r, "failed").unwrap_or(0);
    }
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("test ")
            && let Some(name) = rest.strip_suffix(" ... FAILED")
        {
            t.failing.insert(name.trim().to_string());
        }
    }
    Some(t)
}

fn go(output: &str) -> Option<Tally> {
    let mut t = Tally::default();
    let mut seen = false;
    for line in output.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("--- FAIL: ") {
            t.failing
                .insert(rest.split_whitespace().next().unwrap_or(rest).to_string());
            seen = true;
        } else if l.starts_with("--- PASS: ") {
            t.passed = Some(t.passed.unwrap_or(0) + 1);
        } else if (l.starts_with("FAIL\t")
            || l.starts_with("FAIL ")
            || l.starts_with("ok  \t")
            || l.starts_with("ok "))
            && (l.contains('\t') || l.contains("[build failed]") || l.contains("[setup failed]"))
        {
            seen = true;
            if l.contains("[build failed]") || l.contains("[setup failed]") {
                t.broken = true;
            }
        }
    }
    // Subtests fail under their parent: count the leaves ("TestA/case" fails TestA too).
    let leaves: BTreeSet<String> = t
        .failing
        .iter()
        .filter(|n| {
            !t.failing
                .iter()
                .any(|m| m.len() > n.len() && m.starts_with(&format!("{n}/")))
        })
        .cloned()
        .collect();
    t.failing = leaves;
    t.failed = t.failing.len() as u32;
    seen.then_some(t)
}

fn node(output: &str) -> Option<Tally> {
    // TAP (the default when the output is not a terminal): "# pass 4", "# fail 1"; the spec
    // reporter: "ℹ pass 4", "ℹ fail 1".
    let stat = |word: &str| {
        output.lines().rev().find_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("# ").or_else(|| l.strip_prefix("ℹ "))?;
            rest.strip_prefix(word)?.trim().parse::<u32>().ok()
        })
    };
    let (passed, failed) = (stat("pass")?, stat("fail")?);
    let mut failing = BTreeSet::new();
    for line in output.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("not ok ") {
            // "not ok 2 - name # comment"
            let name = rest.split_once(" - ").map_or(rest, |(_, n)| n);
            failing.insert(name.split(" # ").next().unwrap_or(name).trim().to_string());
        } else if let Some(rest) = l.strip_prefix("✖ ") {
            let name = rest.rsplit_once(" (").map_or(rest, |(n, _)| n);
            if !name.starts_with("failing tests") {
                failing.insert(name.trim().to_string());
            }
        }
    }
    // A suite that fails as a whole (a file that throws on load) has no test to count.
    let broken = failed > 0 && passed == 0 && failing.iter().all(|n| n.ends_with(".js") || n.contains('/'));
    Some(Tally {
        passed: Some(passed),
        failed,
        failing,
        broken,
    })
}

impl Tally {
    /// Whether the tests of `self` (a candidate's, or the project now) are strictly better than
    /// those of `before`: fewer failing, and none failing that did not fail before. A broken run
    /// is never better; anything is better than a broken run except another broken one.
    pub fn improves_on(&self, before: &Tally) -> bool {
        if self.broken {
            return false;
        }
        if before.broken {
            return true;
        }
        if self.failed >= before.failed {
            return false;
        }
        if !self.failing.is_empty() || !before.failing.is_empty() {
            // With names: nothing new may fail.
            return self.failing.is_subset(&before.failing) && self.failing.len() < before.failing.len()
                || self.failing.is_empty() && self.failed == 0;
        }
        // Counts only: as many passing at least.
        match (self.passed, before.passed) {
            (Some(now), Some(then)) => now >= then,
            _ => true,
        }
    }

    /// How bad it is, for "the fewest failing tests": failing tests, and a run that does not
    /// even collect worst of all.
    pub fn failing_score(&self) -> u32 {
        if self.broken { u32::MAX } else { self.failed }
    }

    /// "4 of 5 tests pass" or "2 tests fail" or "the tests do not run".
    pub fn describe(&self) -> String {
        if self.broken {
            return "the tests do not even run (collection or compilation fails)".into();
        }
        match self.passed {
            Some(p) => format!("{p} of {} tests pass", p + self.failed),
            None => format!("{} test(s) fail", self.failed),
        }
    }
}

/// Every test command's run, counted; `None` if any could not be read, or there were none.
pub fn tally_runs(runs: &[super::TestRun]) -> Option<Tally> {
    if runs.is_empty() {
        return None;
    }
    let each: Vec<Option<Tally>> = runs
        .iter()
        .map(|r| {
            if r.output.timed_out {
                return None;
            }
            let text = format!("{}{}", r.output.stdout.to_text(), r.output.stderr.to_text());
            tally(&text, r.output.exit_code)
        })
        .collect();
    combine(&each)
}

/// The tests counted from what `run_tests` showed the model ([`super::render_test_runs`] of
/// `commands`): each command's output after its `$ COMMAND` line, up to its status line.
pub fn tally_rendered(text: &str, commands: &[String]) -> Option<Tally> {
    if commands.is_empty() {
        return None;
    }
    let mut at = 0;
    let mut starts = Vec::new();
    for c in commands {
        let header = format!("$ {c}\n");
        let found = text[at..]
            .match_indices(&header)
            .map(|(i, _)| at + i)
            .find(|i| *i == 0 || text[..*i].ends_with('\n'))?;
        starts.push((found, found + header.len()));
        at = found + header.len();
    }
    let each: Vec<Option<Tally>> = starts
        .iter()
        .enumerate()
        .map(|(k, (_, body))| {
            let end = starts.get(k + 1).map_or(text.len(), |(next, _)| *next);
            let segment = text[*body..end].trim_end();
            let (output, status) = segment.rsplit_once('\n').unwrap_or(("", segment));
            // With several commands the last one's segment ends with the verdicts line.
            let (output, status) = if status.contains(" test commands, all must pass: ") {
                output.trim_end().rsplit_once('\n').unwrap_or(("", output))
            } else {
                (output, status)
            };
            let code: i64 = status
                .strip_prefix("exit ")?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?;
            tally(output, code)
        })
        .collect();
    combine(&each)
}

/// Sum several commands' tallies; `None` if any of them could not be read.
pub fn combine(tallies: &[Option<Tally>]) -> Option<Tally> {
    let mut out = Tally {
        passed: Some(0),
        ..Tally::default()
    };
    for (i, t) in tallies.iter().enumerate() {
        let t = t.as_ref()?;
        out.passed = match (out.passed, t.passed) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        out.failed += t.failed;
        out.broken |= t.broken;
        let prefix = if tallies.len() > 1 {
            format!("{}: ", i + 1)
        } else {
            String::new()
        };
        out.failing
            .extend(t.failing.iter().map(|n| format!("{prefix}{n}")));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytest_summary_and_failing_names() {
        let out = "..F.F                                                                    [100%]\n=================================== FAILURES ===================================\n____ test_three_days_late ____\ntest_library.py:17: in test_three_days_late\n    assert late_fee(DUE, date(2026, 3, 13)) == 75\nE   assert 100 == 75\n=========================== short test summary info ============================\nFAILED test_library.py::test_three_days_late - assert 100 == 75\nFAILED test_library.py::test_members_pay_half_in_whole_cents - assert 50.0 == 37\n2 failed, 3 passed in 0.04s\n";
        let t = tally(out, 1).unwrap();
        assert_eq!((t.passed, t.failed, t.broken), (Some(3), 2, false));
        assert!(t.failing.contains("test_library.py::test_three_days_late"));
        let collect = "==================================== ERRORS ====================================\n_______________________ ERROR collecting test_library.py _______________________\nE   SyntaxError: invalid syntax\n=========================== short test summary info ============================\nERROR test_library.py\n!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!\n1 error in 0.12s\n";
        let broken = tally(collect, 2).unwrap();
        assert!(broken.broken, "{broken:?}");
        assert!(t.improves_on(&broken) && !broken.improves_on(&t));
    }

    #[test]
    fn improvement_means_fewer_failing_and_nothing_newly_failing() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let before = Tally {
            passed: Some(2),
            failed: 3,
            failing: names(&["a", "b", "c"]),
            broken: false,
        };
        let fewer = Tally {
            passed: Some(4),
            failed: 1,
            failing: names(&["c"]),
            broken: false,
        };
        let traded = Tally {
            passed: Some(3),
            failed: 2,
            failing: names(&["c", "d"]),
            broken: false,
        };
        assert!(fewer.improves_on(&before));
        assert!(!traded.improves_on(&before), "d passed before and fails now");
        assert!(!before.improves_on(&before));
        let passing = tally("5 passed in 0.01s\n", 0).unwrap();
        assert!(passing.improves_on(&fewer));
    }

    #[test]
    fn what_run_tests_showed_is_counted_again() {
        let one = "$ python3 -m pytest -q\nFAILED test_a.py::test_x - assert 1 == 2\n1 failed, 2 passed in 0.01s\nexit 1";
        let t = tally_rendered(one, &["python3 -m pytest -q".into()]).unwrap();
        assert_eq!((t.passed, t.failed), (Some(2), 1));
        let two = "$ cargo test\ntest result: ok. 3 passed; 0 failed; 0 ignored\nexit 0\n\n$ go test ./...\n--- FAIL: TestA (0.00s)\nFAIL\tx\t0.1s\nexit 1\n\n2 test commands, all must pass: `cargo test` passed; `go test ./...` FAILED (exit 1)";
        let t = tally_rendered(two, &["cargo test".into(), "go test ./...".into()]).unwrap();
        assert_eq!((t.passed, t.failed), (None, 1));
        assert!(t.failing.contains("2: TestA"), "{t:?}");
        assert_eq!(
            tally_rendered("$ make test\ntimed out after 120s", &["make test".into()]),
            None
        );
    }

    #[test]
    fn cargo_go_and_node_summaries() {
        let cargo_out = "running 3 tests\ntest tests::a ... ok\ntest tests::b ... FAILED\ntest tests::c ... ok\n\nfailures:\n\nfailures:\n    tests::b\n\ntest result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\nerror: test failed, to rerun pass `--lib`\n";
        let t = tally(cargo_out, 101).unwrap();
        assert_eq!((t.passed, t.failed), (Some(2), 1));
        assert_eq!(t.failing, ["tests::b".to_string()].into_iter().collect());
        let compile = "error[E0308]: mismatched types\nerror: could not compile `word-wrap` (lib test) due to 1 previous error\n";
        assert!(tally(compile, 101).unwrap().broken);

        let go_out = "--- FAIL: TestToRoman (0.00s)\n    roman_test.go:22: ToRoman(4) = \"VI\", want \"IV\"\nFAIL\nFAIL\texample.com/roman\t0.002s\nFAIL\n";
        let t = tally(go_out, 1).unwrap();
        assert_eq!((t.passed, t.failed, t.broken), (None, 1, false));
        let build = "# example.com/roman\n./roman.go:3:1: syntax error\nFAIL\texample.com/roman [build failed]\nFAIL\n";
        assert!(tally(build, 1).unwrap().broken);

        let tap = "TAP version 13\n# Subtest: words are joined by dashes\nok 1 - words are joined by dashes\n  ---\n  duration_ms: 0.5\n  ...\n# Subtest: punctuation\nnot ok 2 - punctuation does not leave double dashes\n  ---\n  ...\n1..2\n# tests 2\n# pass 1\n# fail 1\n";
        let t = tally(tap, 1).unwrap();
        assert_eq!((t.passed, t.failed), (Some(1), 1));
        assert!(
            t.failing.contains("punctuation does not leave double dashes"),
            "{t:?}"
        );
        assert_eq!(tally("make: *** [all] Error 1\n", 2), None);
    }
}
