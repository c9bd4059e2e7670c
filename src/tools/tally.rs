//! How many tests passed and which failed, as [`crate::project::results`] reads a test
//! command's output (the one parser per runner, shared with the verdict and the report).
//! Repair's rounds and the loop's best state compare projects by it: fewer failing tests, none
//! of the ones that passed now failing. A run that does not even collect (a syntax error, a
//! compile error) counts as every test failing.

use std::collections::BTreeSet;

use crate::project::results::{self, Runner, TestCounts, Unit};

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

/// Read `output` of test command `command` that exited with `exit_code`, by the command's
/// runner (the one parser per runner, [`crate::project::results`]); a command whose runner is
/// not known (`make test`, a script) is read by whichever runner's summary its output holds.
/// `None` when no runner's summary is in it (or its output was cut there).
pub fn tally(command: &str, output: &str, exit_code: i64) -> Option<Tally> {
    let runner = Runner::of(command);
    let only = [runner];
    let any = [Runner::Pytest, Runner::Cargo, Runner::Node, Runner::Go];
    let candidates: &[Runner] = if matches!(runner, Runner::Make | Runner::Other) {
        &any
    } else {
        &only
    };
    let read = candidates.iter().find_map(|r| {
        let counts = results::parse(*r, output, exit_code);
        let failures = results::failures(*r, output, counts.as_ref());
        (counts.is_some() || failures.broken).then_some((*r, counts, failures))
    });
    if exit_code == 0 {
        // Passing is passing, whatever the summary says; the counts if they can be read.
        let passed = read.as_ref().and_then(|(_, c, _)| passed_of(c.as_ref()));
        return Some(Tally {
            passed,
            ..Tally::default()
        });
    }
    let (runner, counts, failures) = read?;
    let failed = match (runner, &counts) {
        // Plain `go test` counts packages; the failing tests are the ones it names.
        (Runner::Go, _) if !failures.names.is_empty() => failures.names.len() as u64,
        (Runner::Go, Some(c)) if c.unit == Unit::Packages => 0,
        (_, Some(c)) => c.failed + c.errors,
        (_, None) => 0,
    };
    Some(Tally {
        passed: passed_of(counts.as_ref()),
        failed: u32::try_from(failed).unwrap_or(u32::MAX),
        failing: failures.names,
        broken: failures.broken,
    })
}

/// Tests that passed, where the runner counts tests (plain `go test` counts packages).
fn passed_of(counts: Option<&TestCounts>) -> Option<u32> {
    let c = counts.filter(|c| c.unit == Unit::Tests)?;
    Some(u32::try_from(c.passed).unwrap_or(u32::MAX))
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

    /// Whether `self` is at least as good as `best`: it runs, no more tests fail, and none fails
    /// that passed in `best`. A state that trades one passing test for another is not: it
    /// broke something that worked, which the count alone does not show.
    pub fn as_good_as(&self, best: &Tally) -> bool {
        if self.broken {
            return false;
        }
        if best.broken {
            return true;
        }
        if self.failed > best.failed {
            return false;
        }
        if !self.failing.is_empty() || !best.failing.is_empty() {
            return self.failing.is_subset(&best.failing);
        }
        match (self.passed, best.passed) {
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
            tally(&r.command, &text, r.output.exit_code)
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
            tally(commands.get(k)?, output, code)
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
        let t = tally("python3 -m pytest -q", out, 1).unwrap();
        assert_eq!((t.passed, t.failed, t.broken), (Some(3), 2, false));
        assert!(t.failing.contains("test_library.py::test_three_days_late"));
        let collect = "==================================== ERRORS ====================================\n_______________________ ERROR collecting test_library.py _______________________\nE   SyntaxError: invalid syntax\n=========================== short test summary info ============================\nERROR test_library.py\n!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!\n1 error in 0.12s\n";
        let broken = tally("pytest", collect, 2).unwrap();
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
        let passing = tally("pytest", "5 passed in 0.01s\n", 0).unwrap();
        assert!(passing.improves_on(&fewer));
        // As good as: what the loop keeps at its end over the best state it saw.
        let swapped = Tally {
            failing: names(&["a", "b", "d"]),
            ..before.clone()
        };
        assert!(before.as_good_as(&before), "the same failures: as good");
        assert!(!swapped.as_good_as(&before), "as many fail, but d passed before");
        assert!(fewer.as_good_as(&before));
        let broken = Tally {
            broken: true,
            ..Tally::default()
        };
        assert!(!broken.as_good_as(&broken) && before.as_good_as(&broken));
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
        let t = tally("cargo test", cargo_out, 101).unwrap();
        assert_eq!((t.passed, t.failed), (Some(2), 1));
        assert_eq!(t.failing, ["tests::b".to_string()].into_iter().collect());
        let compile = "error[E0308]: mismatched types\nerror: could not compile `word-wrap` (lib test) due to 1 previous error\n";
        assert!(tally("cargo test", compile, 101).unwrap().broken);

        let go_out = "--- FAIL: TestToRoman (0.00s)\n    roman_test.go:22: ToRoman(4) = \"VI\", want \"IV\"\nFAIL\nFAIL\texample.com/roman\t0.002s\nFAIL\n";
        let t = tally("go test ./...", go_out, 1).unwrap();
        assert_eq!((t.passed, t.failed, t.broken), (None, 1, false));
        let build = "# example.com/roman\n./roman.go:3:1: syntax error\nFAIL\texample.com/roman [build failed]\nFAIL\n";
        assert!(tally("go test ./...", build, 1).unwrap().broken);

        let tap = "TAP version 13\n# Subtest: words are joined by dashes\nok 1 - words are joined by dashes\n  ---\n  duration_ms: 0.5\n  ...\n# Subtest: punctuation\nnot ok 2 - punctuation does not leave double dashes\n  ---\n  ...\n1..2\n# tests 2\n# pass 1\n# fail 1\n";
        let t = tally("node --test", tap, 1).unwrap();
        assert_eq!((t.passed, t.failed), (Some(1), 1));
        assert!(
            t.failing.contains("punctuation does not leave double dashes"),
            "{t:?}"
        );
        assert_eq!(tally("make test", "make: *** [all] Error 1\n", 2), None);
        // A command agentbox does not know is read by the summary its output holds.
        let t = tally(
            "./run-tests.sh",
            "FAILED t.py::test_a - x\n1 failed, 1 passed in 0.01s\n",
            1,
        )
        .unwrap();
        assert_eq!((t.passed, t.failed), (Some(1), 1));
    }
}
