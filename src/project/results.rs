//! What a test run's output says: how many tests passed, failed, errored and were skipped. One
//! parser per runner — pytest, cargo (libtest, and nextest's summary), go, node (node's own
//! test runner and TAP, jest, vitest, mocha) — chosen from the command's words; make, and any
//! command not recognised, fall back to the exit status alone (`None`: the counts cannot be
//! told).
//!
//! The counts are what agentbox's verdict reads beside the exit status: a run that passes
//! having run no test, where tests ran before the model's first turn, is no PASS ("no tests
//! ran"); and the report shows the counts before and after. The output is the sandbox's, so
//! hostile: every line is looked at once, nothing is allocated per line beyond the line
//! itself, and a number too large to be a count is no count.

use std::collections::BTreeSet;

use serde::Serialize;

/// Which runner's output a test command prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    Pytest,
    Cargo,
    Go,
    Node,
    /// `make test`: whatever its recipe runs; the exit status decides.
    Make,
    /// Not recognised: the exit status decides.
    Other,
}

/// What the counts count: tests, or (plain `go test`, which names no passing test) packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    #[default]
    Tests,
    Packages,
}

/// A run's counts, as its runner printed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    /// Errors outside a test's assertions: pytest's collection and fixture errors, a Go
    /// package that did not build, node's cancelled tests.
    pub errors: u64,
    /// Skipped, ignored, pending, todo, expected failures.
    pub skipped: u64,
    pub unit: Unit,
    /// The output was cut where this runner prints its counts (cargo prints one line per test
    /// binary, go one per package): the counts are of what was kept, a lower bound.
    pub partial: bool,
}

impl TestCounts {
    /// Tests that ran (passed, failed or errored); skipped ones did not.
    pub fn ran(&self) -> u64 {
        self.passed + self.failed + self.errors
    }
}

impl std::fmt::Display for TestCounts {
    /// "1 failed, 185 passed", "no tests ran", "at least 40 passed (packages)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = [
            (self.failed, "failed"),
            (self.errors, if self.errors == 1 { "error" } else { "errors" }),
            (self.passed, "passed"),
            (self.skipped, "skipped"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        let unit = match self.unit {
            Unit::Tests => "",
            Unit::Packages => " (packages)",
        };
        if parts.is_empty() {
            return match self.unit {
                Unit::Tests => f.write_str("no tests ran"),
                Unit::Packages => f.write_str("no package ran tests"),
            };
        }
        let at_least = if self.partial { "at least " } else { "" };
        write!(f, "{at_least}{}{unit}", parts.join(", "))
    }
}

impl Runner {
    /// The runner of a test command, from its first words (environment assignments skipped).
    pub fn of(command: &str) -> Runner {
        let words: Vec<&str> = command
            .split_whitespace()
            .skip_while(|w| is_assignment(w))
            .take(4)
            .collect();
        let program = words.first().map(|w| w.rsplit('/').next().unwrap_or(w));
        let second = words.get(1).copied();
        match program {
            Some("pytest" | "py.test") => Runner::Pytest,
            Some(p) if p.starts_with("python") && second == Some("-m") => match words.get(2) {
                Some(&"pytest") => Runner::Pytest,
                _ => Runner::Other,
            },
            Some("cargo") => {
                // `cargo test`, `cargo +nightly test`, `cargo nextest run`.
                let sub = words.iter().skip(1).find(|w| !w.starts_with('+'));
                match sub {
                    Some(&"test" | &"t" | &"nextest") => Runner::Cargo,
                    _ => Runner::Other,
                }
            }
            Some("go") if second == Some("test") => Runner::Go,
            Some("npm" | "yarn" | "pnpm") => match second {
                Some("test" | "t" | "tst") => Runner::Node,
                Some("run" | "run-script") if words.get(2).is_some_and(|s| s.starts_with("test")) => {
                    Runner::Node
                }
                _ => Runner::Other,
            },
            Some("node") if words.contains(&"--test") => Runner::Node,
            Some("npx")
                if words
                    .get(1)
                    .is_some_and(|w| matches!(*w, "jest" | "vitest" | "mocha")) =>
            {
                Runner::Node
            }
            Some("jest" | "vitest" | "mocha") => Runner::Node,
            Some("make" | "gmake") => Runner::Make,
            _ => Runner::Other,
        }
    }

    /// Whether its counts are spread over the output (one line per binary or package), so
    /// that a cut output loses some of them.
    fn spread(self) -> bool {
        matches!(self, Runner::Cargo | Runner::Go)
    }
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Why a run that exited 0 is no pass: it ran no test, where the same command ran some
/// before the model's first turn (`before`). With no count before, or none ran then, there is
/// nothing to hold it to (`None`).
pub fn no_tests_ran(before: Option<&TestCounts>, after: Option<&TestCounts>) -> Option<String> {
    let before = before.filter(|b| b.ran() > 0)?;
    match after {
        Some(a) if a.ran() > 0 => None,
        Some(a) if !a.partial => Some(format!(
            "no tests ran ({a}), where {before} before the model's first turn"
        )),
        _ => Some(format!(
            "no tests ran that agentbox could count (the output has no summary of them), where {before} \
             before the model's first turn"
        )),
    }
}

/// The counts of one run of `command`: its runner's parser over the output as captured (the
/// start and the end), `partial` when the output was cut and the runner spreads its counts.
pub fn of_run(command: &str, output: &crate::sandbox::ExecOutput) -> Option<TestCounts> {
    let runner = Runner::of(command);
    let mut counts = parse(runner, &output.stdout.to_text(), output.exit_code)?;
    counts.partial = output.stdout.truncated() && runner.spread();
    Some(counts)
}

/// The counts `runner` printed in `output`, given the command's exit status; `None` when they
/// cannot be told (make, an unknown command, or no summary in the output).
pub fn parse(runner: Runner, output: &str, exit_code: i64) -> Option<TestCounts> {
    let text = strip_ansi(output);
    let counts = match runner {
        Runner::Pytest => pytest(&text, exit_code),
        Runner::Cargo => cargo(&text),
        Runner::Go => go(&text),
        Runner::Node => node(&text),
        Runner::Make | Runner::Other => None,
    };
    counts.map(|c| TestCounts { partial: false, ..c })
}

/// A count as printed: digits only, and no larger than any real suite.
fn number(word: &str) -> Option<u64> {
    if word.is_empty() || word.len() > 9 || !word.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    word.parse().ok()
}

/// Colour codes out (`PY_COLORS`, `FORCE_COLOR`): CSI sequences and lone escapes.
fn strip_ansi(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\u{1b}') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte.
            while let Some(&n) = chars.peek() {
                chars.next();
                if ('@'..='~').contains(&n) {
                    break;
                }
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// pytest's last summary line: `1 failed, 185 passed, 2 skipped in 0.52s`, with or without
/// the `=` rule around it; `no tests ran in 0.01s`; `3 tests collected in 0.01s` (nothing
/// ran). Exit status 5 is pytest's "no tests collected".
fn pytest(text: &str, exit_code: i64) -> Option<TestCounts> {
    let summary = text.lines().rev().find_map(pytest_summary);
    match summary {
        Some(c) => Some(c),
        None if exit_code == 5 => Some(TestCounts::default()),
        None => None,
    }
}

fn pytest_summary(line: &str) -> Option<TestCounts> {
    let line = line.trim().trim_matches('=').trim();
    let (counts, time) = line.rsplit_once(" in ")?;
    // `0.52s`, `61.20s (0:01:01)`.
    let seconds = time.split_whitespace().next()?.strip_suffix('s')?;
    if seconds.is_empty() || !seconds.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    if counts == "no tests ran" {
        return Some(TestCounts::default());
    }
    let mut c = TestCounts::default();
    for part in counts.split(", ") {
        let mut words = part.split(' ');
        let n = number(words.next()?)?;
        let what = words.collect::<Vec<_>>().join(" ");
        match what.as_str() {
            "passed" | "xpassed" => c.passed += n,
            "failed" => c.failed += n,
            "error" | "errors" => c.errors += n,
            "skipped" | "xfailed" => c.skipped += n,
            "deselected" | "warning" | "warnings" | "rerun" | "reruns" | "test collected"
            | "tests collected" => {}
            _ => return None,
        }
    }
    Some(c)
}

/// libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out`,
/// one per test binary and doc-test run, summed; or nextest's `Summary [...] 5 tests run: 4
/// passed, 1 failed, 2 skipped`.
fn cargo(text: &str) -> Option<TestCounts> {
    let mut total: Option<TestCounts> = None;
    let mut nextest = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("test result: ") {
            let Some((_, counts)) = rest.split_once(". ") else {
                continue;
            };
            let mut c = TestCounts::default();
            let mut ok = false;
            for part in counts.split("; ") {
                let Some((n, what)) = part.split_once(' ') else {
                    continue;
                };
                let Some(n) = number(n) else { continue };
                match what {
                    "passed" => (c.passed, ok) = (n, true),
                    "failed" => c.failed = n,
                    "ignored" => c.skipped = n,
                    _ => {}
                }
            }
            if ok {
                let t = total.get_or_insert_with(TestCounts::default);
                t.passed += c.passed;
                t.failed += c.failed;
                t.skipped += c.skipped;
            }
        } else if let Some(rest) = line.strip_prefix("Summary [")
            && let Some((_, after)) = rest.split_once(']')
            && let Some((_, counts)) = after.split_once(" run: ")
        {
            let mut c = TestCounts::default();
            for part in counts.split(", ") {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next().and_then(number), words.next()) else {
                    continue;
                };
                match what {
                    "passed" => c.passed += n,
                    "failed" | "timed" => c.failed += n,
                    "skipped" => c.skipped += n,
                    _ => {}
                }
            }
            nextest = Some(c);
        }
    }
    nextest.or(total)
}

/// `go test`: with `-v`, the top-level `--- PASS/FAIL/SKIP:` lines (tests); without, which
/// names no passing test, the packages: `ok`, `FAIL`, `[build failed]` (an error), and
/// `[no tests to run]` (nothing ran). `[no test files]` counts for nothing.
fn go(text: &str) -> Option<TestCounts> {
    let verbose = text.lines().any(|l| l.starts_with("=== RUN"));
    let mut c = TestCounts {
        unit: if verbose { Unit::Tests } else { Unit::Packages },
        ..Default::default()
    };
    let mut seen = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        if verbose {
            match (first, rest.first()) {
                ("---", Some(&"PASS:")) if line.starts_with("---") => c.passed += 1,
                ("---", Some(&"FAIL:")) if line.starts_with("---") => c.failed += 1,
                ("---", Some(&"SKIP:")) if line.starts_with("---") => c.skipped += 1,
                _ => {}
            }
        }
        match first {
            "ok" if !rest.is_empty() => {
                seen = true;
                if !verbose && !line.ends_with("[no tests to run]") {
                    c.passed += 1;
                }
            }
            "FAIL" if !rest.is_empty() => {
                seen = true;
                if line.ends_with("[build failed]") || line.ends_with("[setup failed]") {
                    c.errors += 1;
                } else if !verbose {
                    c.failed += 1;
                }
            }
            "?" if line.ends_with("[no test files]") => seen = true,
            _ => {}
        }
    }
    seen.then_some(c)
}

/// Node: its own runner's TAP (`# tests 4`, `# pass 1`, ...) or spec summary (`ℹ pass 1`),
/// tape's TAP, jest's `Tests: 1 failed, 2 passed, 3 total`, vitest's `Tests  1 failed | 2
/// passed (3)`, mocha's `2 passing`, `1 failing`, `1 pending`. The last summary printed wins.
fn node(text: &str) -> Option<TestCounts> {
    let mut found: Option<TestCounts> = None;
    // node's and TAP's keys come one a line; a block is what follows its first key.
    let mut tap: Option<TestCounts> = None;
    let mut mocha: Option<TestCounts> = None;
    for raw in text.lines() {
        let line = raw.trim();
        let tap_line = line
            .strip_prefix("# ")
            .or_else(|| line.strip_prefix("ℹ "))
            .map(str::split_whitespace);
        if let Some(mut words) = tap_line
            && let (Some(key), Some(n), None) = (words.next(), words.next().and_then(number), words.next())
        {
            let block = tap.get_or_insert_with(TestCounts::default);
            match key {
                "pass" => block.passed = n,
                "fail" => block.failed = n,
                "cancelled" => block.errors = n,
                "skipped" | "skip" => block.skipped += n,
                "todo" => block.skipped += n,
                "tests" | "suites" | "duration_ms" => {}
                _ => {}
            }
            found = tap;
            continue;
        }
        if let Some(rest) = line.strip_prefix("Tests:") {
            // jest
            let mut c = TestCounts::default();
            let mut any = false;
            for part in rest.split(',') {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next().and_then(number), words.next()) else {
                    continue;
                };
                any = true;
                match what {
                    "passed" => c.passed += n,
                    "failed" => c.failed += n,
                    "skipped" | "todo" | "pending" => c.skipped += n,
                    _ => {}
                }
            }
            if any {
                found = Some(c);
                tap = None;
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("Tests ")
            && let Some((counts, _)) = rest.rsplit_once('(')
        {
            // vitest
            let mut c = TestCounts::default();
            let mut any = false;
            for part in counts.split('|') {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next().and_then(number), words.next()) else {
                    continue;
                };
                any = true;
                match what {
                    "passed" => c.passed += n,
                    "failed" => c.failed += n,
                    "skipped" | "todo" => c.skipped += n,
                    _ => {}
                }
            }
            if any {
                found = Some(c);
                tap = None;
            }
            continue;
        }
        let mut words = line.split_whitespace();
        if let (Some(n), Some(what)) = (words.next().and_then(number), words.next())
            && matches!(what, "passing" | "failing" | "pending")
            && (what != "passing" || words.next().is_some_and(|w| w.starts_with('(')))
        {
            let m = mocha.get_or_insert_with(TestCounts::default);
            match what {
                "passing" => {
                    *m = TestCounts {
                        passed: n,
                        ..Default::default()
                    }
                }
                "failing" => m.failed = n,
                _ => m.skipped = n,
            }
            found = mocha;
            tap = None;
        } else if tap.is_some() && !line.starts_with('#') && !line.starts_with('ℹ') && !line.is_empty() {
            // A TAP block ends at its first other line; a later one starts afresh.
            tap = None;
        }
    }
    found
}

/// What a failing run says beyond its counts: the failing tests by name, and whether it broke
/// before any test could reach a verdict (collection or compilation failed) — what repair's
/// rounds and the loop's best state compare projects by. Read by the same runner's rules as
/// the counts, from the same (colour-stripped) text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failures {
    /// The failing tests' names, as the runner prints them (Go: the leaves of subtests).
    pub names: BTreeSet<String>,
    /// Nothing ran to a verdict: a file that did not import, a crate that did not compile.
    pub broken: bool,
}

/// The failures `runner` printed in `output`, given the counts [`parse`] read from it.
pub fn failures(runner: Runner, output: &str, counts: Option<&TestCounts>) -> Failures {
    let text = strip_ansi(output);
    match runner {
        Runner::Pytest => pytest_failures(&text, counts),
        Runner::Cargo => cargo_failures(&text),
        Runner::Go => go_failures(&text),
        Runner::Node => node_failures(&text, counts),
        Runner::Make | Runner::Other => Failures::default(),
    }
}

/// `FAILED path::test - msg` and `ERROR path::test - msg` (an error in a fixture: that test
/// failed); an `ERROR path` with no test, `ERROR collecting` or `Interrupted:` is a file that
/// did not import.
fn pytest_failures(text: &str, counts: Option<&TestCounts>) -> Failures {
    let mut f = Failures {
        broken: text.contains("ERROR collecting") || text.contains("Interrupted: "),
        ..Failures::default()
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("FAILED ") {
            f.names
                .insert(rest.split(" - ").next().unwrap_or(rest).trim().to_string());
        } else if let Some(rest) = line.strip_prefix("ERROR ") {
            let name = rest.split(" - ").next().unwrap_or(rest).trim();
            if name.contains("::") {
                f.names.insert(name.to_string());
            } else {
                f.broken = true;
            }
        }
    }
    if let Some(c) = counts
        && c.failed == 0
        && c.passed == 0
        && c.errors > 0
    {
        f.broken = true;
    }
    f
}

/// libtest's `test NAME ... FAILED`; a compile error (`error[E...]`, `could not compile`) breaks
/// the run.
fn cargo_failures(text: &str) -> Failures {
    let mut f = Failures {
        broken: text.contains("error: could not compile") || text.contains("error[E"),
        ..Failures::default()
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("test ")
            && let Some(name) = rest.strip_suffix(" ... FAILED")
        {
            f.names.insert(name.trim().to_string());
        }
    }
    f
}

/// `--- FAIL: Name`, counted by leaves (a failing subtest `TestA/case` fails `TestA` too); a
/// package that did not build breaks the run.
fn go_failures(text: &str) -> Failures {
    let mut f = Failures::default();
    for line in text.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("--- FAIL: ") {
            f.names
                .insert(rest.split_whitespace().next().unwrap_or(rest).to_string());
        } else if l.starts_with("FAIL") && (l.ends_with("[build failed]") || l.ends_with("[setup failed]")) {
            f.broken = true;
        }
    }
    let parents: Vec<String> = f
        .names
        .iter()
        .filter(|n| {
            f.names.iter().any(|m| {
                m.strip_prefix(n.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
            })
        })
        .cloned()
        .collect();
    for p in parents {
        f.names.remove(&p);
    }
    f
}

/// TAP's `not ok N - name`, the spec reporter's `✖ name (1ms)`; a suite that fails as a whole
/// (a file that throws on load) names only files and passes nothing: broken.
fn node_failures(text: &str, counts: Option<&TestCounts>) -> Failures {
    let mut f = Failures::default();
    for line in text.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("not ok ") {
            let name = rest.split_once(" - ").map_or(rest, |(_, n)| n);
            f.names
                .insert(name.split(" # ").next().unwrap_or(name).trim().to_string());
        } else if let Some(rest) = l.strip_prefix("✖ ") {
            let name = rest.rsplit_once(" (").map_or(rest, |(n, _)| n);
            if !name.starts_with("failing tests") {
                f.names.insert(name.trim().to_string());
            }
        }
    }
    f.broken = counts.is_some_and(|c| c.failed > 0 && c.passed == 0)
        && f.names.iter().all(|n| n.ends_with(".js") || n.contains('/'));
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(passed: u64, failed: u64, errors: u64, skipped: u64) -> TestCounts {
        TestCounts {
            passed,
            failed,
            errors,
            skipped,
            ..Default::default()
        }
    }

    #[test]
    fn runners_from_commands() {
        for (cmd, runner) in [
            (crate::project::PYTEST, Runner::Pytest),
            ("pytest -x tests/", Runner::Pytest),
            ("PYTHONPATH=src python -m pytest", Runner::Pytest),
            ("python3 -m unittest", Runner::Other),
            ("cargo test", Runner::Cargo),
            ("cargo +nightly test --all", Runner::Cargo),
            ("cargo nextest run", Runner::Cargo),
            ("cargo build", Runner::Other),
            ("go test ./...", Runner::Go),
            ("go vet", Runner::Other),
            ("npm test", Runner::Node),
            ("npm run test:unit", Runner::Node),
            ("npm run lint", Runner::Other),
            ("node --test", Runner::Node),
            ("npx jest", Runner::Node),
            ("make test", Runner::Make),
            ("./run-tests.sh", Runner::Other),
        ] {
            assert_eq!(Runner::of(cmd), runner, "{cmd}");
        }
    }

    /// Captured from `agentbox/python:2` (pytest 8.3).
    #[test]
    fn pytest_summaries() {
        let failed = ".Fs                                                                      [100%]\n\
            =================================== FAILURES ===================================\n\
            FAILED test_a.py::test_bad - assert 1 == 2\n1 failed, 1 passed, 1 skipped in 0.04s\n";
        assert_eq!(parse(Runner::Pytest, failed, 1), Some(counts(1, 1, 0, 1)));
        let ruled = "==================== 1 failed, 1 passed, 1 skipped in 0.02s ====================\n";
        assert_eq!(parse(Runner::Pytest, ruled, 1), Some(counts(1, 1, 0, 1)));
        let collection = "E   ModuleNotFoundError: No module named 'nosuchmod'\n\
            !!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!\n1 error in 0.26s\n";
        assert_eq!(parse(Runner::Pytest, collection, 2), Some(counts(0, 0, 1, 0)));
        // `--collect-only -q`: nothing ran.
        let collected = "test_a.py::test_ok\ntest_a.py::test_bad\n\n3 tests collected in 0.01s\n";
        let c = parse(Runner::Pytest, collected, 0).unwrap();
        assert_eq!((c.ran(), c.to_string()), (0, "no tests ran".to_string()));
        assert_eq!(
            parse(Runner::Pytest, "\n3 deselected in 0.01s\n", 5)
                .unwrap()
                .ran(),
            0
        );
        assert_eq!(
            parse(Runner::Pytest, "no tests ran in 0.00s\n", 5),
            Some(TestCounts::default())
        );
        assert_eq!(
            parse(
                Runner::Pytest,
                "2 passed, 1 xfailed, 3 warnings, 1 error in 61.20s (0:01:01)\n",
                1
            ),
            Some(counts(2, 0, 1, 1))
        );
        // `-qq` prints no summary; nor does a runner that is not pytest.
        assert_eq!(parse(Runner::Pytest, ".F\nFAILED test_a.py::test_bad\n", 1), None);
        assert_eq!(parse(Runner::Pytest, "", 0), None);
        // A line that only looks like one is not taken for it.
        assert_eq!(parse(Runner::Pytest, "we waited 3 days in 2s\n", 0), None);
        assert_eq!(
            parse(
                Runner::Pytest,
                "\u{1b}[31m1 failed\u{1b}[0m, \u{1b}[32m2 passed\u{1b}[0m in 0.1s\n",
                1
            ),
            Some(counts(2, 1, 0, 0))
        );
        assert_eq!(
            parse(Runner::Pytest, "99999999999999999999 passed in 1s\n", 0),
            None,
            "no count that large"
        );
    }

    /// Captured from `agentbox/rust:1` (cargo 1.85).
    #[test]
    fn cargo_summaries() {
        let out = "     Running unittests src/lib.rs (/tmp/t/debug/deps/probe-e90f9b63dc23db55)\n\
            test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
            \x20    Running tests/it.rs (/tmp/t/debug/deps/it-a9171177763a4325)\n\
            test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
            \x20  Doc-tests probe\n\
            test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.81s\n";
        assert_eq!(parse(Runner::Cargo, out, 101), Some(counts(3, 1, 0, 1)));
        assert_eq!(
            parse(
                Runner::Cargo,
                "error[E0425]: cannot find value `x`\nerror: could not compile `probe`\n",
                101
            ),
            None
        );
        let none =
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n";
        assert_eq!(parse(Runner::Cargo, none, 0).unwrap().ran(), 0);
        let nextest = "     Summary [   0.008s] 5 tests run: 4 passed, 1 failed, 2 skipped\n";
        assert_eq!(parse(Runner::Cargo, nextest, 100), Some(counts(4, 1, 0, 2)));
    }

    /// Captured from `agentbox/go:1` (go 1.24).
    #[test]
    fn go_summaries() {
        let plain = "--- FAIL: TestBad (0.00s)\n    a_test.go:4: no\nFAIL\nFAIL\tprobe/a\t0.011s\n\
            ok  \tprobe/b\t0.008s\n?   \tprobe/c\t[no test files]\nFAIL\n";
        let c = parse(Runner::Go, plain, 1).unwrap();
        assert_eq!((c.passed, c.failed, c.unit), (1, 1, Unit::Packages));
        assert_eq!(c.to_string(), "1 failed, 1 passed (packages)");
        let verbose = "=== RUN   TestOk\n--- PASS: TestOk (0.00s)\n=== RUN   TestSub\n=== RUN   TestSub/x\n\
            --- PASS: TestSub (0.00s)\n    --- PASS: TestSub/x (0.00s)\n=== RUN   TestSkip\n\
            --- SKIP: TestSkip (0.00s)\nPASS\nok  \tprobe/b\t0.007s\n";
        let c = parse(Runner::Go, verbose, 0).unwrap();
        assert_eq!((c.passed, c.skipped, c.unit), (2, 1, Unit::Tests));
        assert_eq!(
            parse(Runner::Go, "ok  \tprobe/b\t0.003s [no tests to run]\n", 0)
                .unwrap()
                .ran(),
            0
        );
        let broken = "# probe/b [probe/b.test]\nb/bad.go:2:9: syntax error\nFAIL\tprobe/b [build failed]\n\
            ?   \tprobe/c\t[no test files]\nFAIL\n";
        assert_eq!(parse(Runner::Go, broken, 1).unwrap().errors, 1);
        assert_eq!(
            parse(Runner::Go, "?   \tprobe/c\t[no test files]\n", 0)
                .unwrap()
                .ran(),
            0
        );
        assert_eq!(parse(Runner::Go, "go: cannot find main module\n", 1), None);
    }

    #[test]
    fn node_summaries() {
        // `node --test` (node 20, not a terminal: TAP), from `agentbox/node:1`.
        let tap = "> probe@1.0.0 test\n> node --test\n\nTAP version 13\n# Subtest: ok\nok 1 - ok\n\
            not ok 2 - bad\n1..4\n# tests 4\n# suites 0\n# pass 1\n# fail 1\n# cancelled 0\n\
            # skipped 1\n# todo 1\n# duration_ms 564.464526\n";
        assert_eq!(parse(Runner::Node, tap, 1), Some(counts(1, 1, 0, 2)));
        let spec = "✔ ok (1.2ms)\nℹ tests 2\nℹ suites 0\nℹ pass 2\nℹ fail 0\nℹ cancelled 0\nℹ skipped 0\n\
            ℹ todo 0\nℹ duration_ms 40.1\n";
        assert_eq!(parse(Runner::Node, spec, 0), Some(counts(2, 0, 0, 0)));
        let jest = "Test Suites: 1 failed, 1 total\nTests:       1 failed, 1 skipped, 4 passed, 6 total\n\
            Snapshots:   0 total\nTime:        0.5 s\n";
        assert_eq!(parse(Runner::Node, jest, 1), Some(counts(4, 1, 0, 1)));
        let vitest = " Test Files  1 failed (1)\n      Tests  1 failed | 2 passed (3)\n";
        assert_eq!(parse(Runner::Node, vitest, 1), Some(counts(2, 1, 0, 0)));
        let mocha = "  3 passing (12ms)\n  1 pending\n  2 failing\n\n  1) adds:\n     AssertionError\n";
        assert_eq!(parse(Runner::Node, mocha, 2), Some(counts(3, 2, 0, 1)));
        let tape = "TAP version 13\n# adds\nok 1 should be equal\n\n1..1\n# tests 1\n# pass  1\n\n# ok\n";
        assert_eq!(parse(Runner::Node, tape, 0), Some(counts(1, 0, 0, 0)));
        assert_eq!(parse(Runner::Node, "> x@1 test\n> true\n", 0), None);
    }

    #[test]
    fn a_pass_with_no_test_run_is_refused_only_where_tests_ran_before() {
        let before = counts(185, 1, 0, 0);
        let none = TestCounts::default();
        assert_eq!(no_tests_ran(Some(&before), Some(&counts(186, 0, 0, 0))), None);
        let why = no_tests_ran(Some(&before), Some(&none)).unwrap();
        assert_eq!(
            why,
            "no tests ran (no tests ran), where 1 failed, 185 passed before the model's first turn"
        );
        assert!(no_tests_ran(Some(&before), None).unwrap().contains("could count"));
        assert_eq!(no_tests_ran(None, Some(&none)), None, "nothing to hold it to");
        assert_eq!(
            no_tests_ran(Some(&none), Some(&none)),
            None,
            "none ran before either"
        );
        assert!(
            no_tests_ran(Some(&before), Some(&TestCounts { skipped: 186, ..none })).is_some(),
            "all skipped is none run"
        );
    }

    #[test]
    fn make_and_unknown_commands_have_no_counts() {
        assert_eq!(parse(Runner::Make, "1 passed in 0.1s\n", 0), None);
        assert_eq!(parse(Runner::Other, "test result: ok. 1 passed;", 0), None);
    }

    #[test]
    fn counts_read_as_the_report_prints_them() {
        assert_eq!(counts(185, 1, 0, 0).to_string(), "1 failed, 185 passed");
        assert_eq!(counts(3, 0, 2, 1).to_string(), "2 errors, 3 passed, 1 skipped");
        assert_eq!(counts(0, 0, 1, 0).to_string(), "1 error");
        let partial = TestCounts {
            partial: true,
            ..counts(40, 0, 0, 0)
        };
        assert_eq!(partial.to_string(), "at least 40 passed");
    }

    #[test]
    fn failures_are_named_by_the_runner_go_by_its_leaves() {
        let go = "--- FAIL: TestA (0.00s)\n    --- FAIL: TestA/case_1 (0.00s)\n--- FAIL: TestB (0.00s)\nFAIL\tx\t0.1s\n";
        let f = failures(Runner::Go, go, None);
        let names: Vec<&str> = f.names.iter().map(String::as_str).collect();
        assert_eq!(names, ["TestA/case_1", "TestB"]);
        assert!(!f.broken);
        let build = "FAIL\texample.com/x [build failed]\n";
        assert!(failures(Runner::Go, build, None).broken);
        let coloured = "\u{1b}[31mFAILED t.py::test_a - x\u{1b}[0m\n";
        let f = failures(Runner::Pytest, coloured, None);
        assert!(f.names.contains("t.py::test_a"), "{f:?}");
        assert_eq!(
            failures(Runner::Make, "FAILED t.py::x\n", None),
            Failures::default()
        );
    }
}
