//! A verdict that cannot be faked, through `agentbox run` and `eval` with a scripted model: the
//! test configuration is test code (refused under `--protect-tests`, a repair candidate that
//! changes it is discarded, eval's "tests unchanged" covers it), a run that ran no test where
//! tests ran before the model's first turn is no PASS, the report shows the tests before and
//! after, and tests that cannot start for want of a declared dependency stop the run before
//! any model request (exit 2) while a wrong import that is the bug itself goes to the model.

use crate::support::scripted::*;
use crate::support::*;
use serde_json::{Value, json};

const COUNTER: &str = "def count_words(text):\n    return len(text.split(\" \"))\n";
const FIXED: &str = "def count_words(text):\n    return len(text.split())\n";
const TESTS: &str = "from counter import count_words\n\n\ndef test_simple():\n    assert count_words(\"a b c\") == 3\n\n\ndef test_extra_spaces():\n    assert count_words(\"  a   b \") == 2\n";
/// What makes pytest run nothing and exit 0.
const COLLECT_ONLY: &str = "[pytest]\naddopts = --collect-only -q\n";

fn counter(extra: &[(&str, &str)]) -> Project {
    let mut files = vec![("counter.py", COUNTER), ("test_counter.py", TESTS)];
    files.extend_from_slice(extra);
    Project::new(&files)
}

fn write(path: &str, content: &str) -> Value {
    call("write_file", json!({"path": path, "content": content}))
}

fn report(run: &Run) -> &Value {
    run.report
        .as_ref()
        .unwrap_or_else(|| panic!("no report: {}\n{}", run.stdout, run.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_shows_the_tests_before_the_first_turn_and_after_the_last() {
    let p = counter(&[]);
    let run = hostile(
        &p,
        json!([{"tool_calls": [write("counter.py", FIXED)]}, done("Fixed.")]),
        &["--edit-format", "whole"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let c = &report(&run)["tests"]["commands"][0];
    assert_eq!(c["before"]["passed"], false, "{c}");
    assert_eq!(c["before"]["counts"]["failed"], 1, "{c}");
    assert_eq!(c["before"]["counts"]["passed"], 1, "{c}");
    assert_eq!(c["counts"]["passed"], 2, "{c}");
    assert_eq!(c["counts"]["failed"], 0, "{c}");
    // The tests before are a preflight step, ahead of the first model request.
    let kinds: Vec<String> = run
        .events
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["event"].as_str().unwrap(),
                e["step"].as_str().unwrap_or("")
            )
        })
        .collect();
    let before = kinds
        .iter()
        .position(|k| k == "preflight:tests_before")
        .unwrap_or_else(|| panic!("{kinds:?}"));
    let asked = kinds.iter().position(|k| k.starts_with("model_request")).unwrap();
    assert!(before < asked, "{kinds:?}");
    assert!(
        run.stderr
            .contains("tests before the model's first turn: `python3 -m pytest"),
        "{}",
        run.stderr
    );

    // The human report says it in one line.
    let p = counter(&[]);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.json");
    std::fs::write(
        &script,
        json!({"turns": [{"tool_calls": [write("counter.py", FIXED)]}, done("Fixed.")]}).to_string(),
    )
    .unwrap();
    let out = crate::support::run(
        agentbox()
            .args(["run", "--edit-format", "whole", "--script"])
            .arg(&script)
            .arg(p.path())
            .env("AGENTBOX_DATA_DIR", dir.path().join("data")),
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("          before: 1 failed, 1 passed → after: 2 passed\n"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_ran_no_test_where_tests_ran_before_is_no_pass() {
    for (name, files) in [
        ("pytest.ini", vec![("pytest.ini", COLLECT_ONLY)]),
        (
            "pyproject.toml",
            vec![(
                "pyproject.toml",
                "[tool.pytest.ini_options]\naddopts = \"--collect-only -q\"\n",
            )],
        ),
        (
            "setup.cfg",
            vec![("setup.cfg", "[tool:pytest]\naddopts = --collect-only -q\n")],
        ),
    ] {
        let p = counter(&[]);
        let writes: Vec<Value> = files.iter().map(|(path, body)| write(path, body)).collect();
        let run = hostile(
            &p,
            json!([{"tool_calls": writes}, done("The tests pass now.")]),
            &["--edit-format", "whole"],
        )
        .await;
        let r = report(&run);
        let c = &r["tests"]["commands"][0];
        assert_eq!(c["exit_code"], 0, "{name}: pytest itself says all is well: {c}");
        assert_eq!(r["tests"]["passed"], false, "{name}: {c}");
        assert!(
            c["refused"]
                .as_str()
                .unwrap_or_default()
                .starts_with("no tests ran"),
            "{name}: {c}"
        );
        assert_eq!(run.code, Some(1), "{name}: {}", run.stderr);
    }
    // Without a count before (a given command with no summary), nothing to hold it to.
    let p = counter(&[]);
    let run = hostile(&p, json!([done("Nothing to do.")]), &["--test-cmd", "true"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protect_tests_refuses_every_kind_of_test_configuration() {
    let make = "test:\n\tpython3 -m pytest -q -p no:cacheprovider\n";
    let pkg = r#"{"name": "web", "version": "1.0.0", "scripts": {"test": "node --test"}}"#;
    let cargo = "[package]\nname = \"x\"\nversion = \"0.1.0\"\n";
    // A package pip can install (setup installs it, editable): one module, named, since
    // setuptools refuses to guess among the top-level directories the other ecosystems add.
    let pyproject = "[project]\nname = \"counter\"\nversion = \"1\"\n\n[tool.setuptools]\npy-modules = [\"counter\"]\n\n\
                     [tool.pytest.ini_options]\ntestpaths = [\".\"]\n";
    let p = counter(&[
        ("pyproject.toml", pyproject),
        ("setup.cfg", "[metadata]\nname = counter\n"),
        ("tox.ini", "[tox]\nenvlist = py3\n"),
        ("Makefile", make),
        ("web/package.json", pkg),
        ("crates/x/Cargo.toml", cargo),
    ]);
    let cheats = [
        write("pytest.ini", COLLECT_ONLY),
        write(
            "pyproject.toml",
            &format!("{pyproject}addopts = \"--collect-only\"\n"),
        ),
        write(
            "setup.cfg",
            "[metadata]\nname = counter\n[tool:pytest]\naddopts = --co\n",
        ),
        write("tox.ini", "[tox]\nenvlist = py3\n[pytest]\naddopts = --co\n"),
        write("Makefile", "test:\n\ttrue\n"),
        write("web/package.json", &pkg.replace("node --test", "exit 0")),
        write(
            "crates/x/Cargo.toml",
            &format!("{cargo}\n[lib]\nharness = false\n"),
        ),
        write(
            ".cargo/config.toml",
            "[target.x86_64-unknown-linux-gnu]\nrunner = \"true\"\n",
        ),
        write("pytest.py", "raise SystemExit(0)\n"),
    ];
    let n = cheats.len();
    let mut calls = cheats.to_vec();
    // What is not test configuration stays writable.
    calls.push(write(
        "pyproject.toml",
        &pyproject.replace("version = \"1\"", "version = \"2\""),
    ));
    calls.push(write("counter.py", FIXED));
    let run = hostile(
        &p,
        json!([{"tool_calls": calls}, done("Fixed.")]),
        &["--protect-tests", "--edit-format", "whole"],
    )
    .await;
    for i in 0..n {
        let (_, result, is_error) = run.result(i);
        assert!(
            is_error && result.contains("the tests and what decides how they run are the specification"),
            "{i}: {result}"
        );
    }
    for i in n..n + 2 {
        let (_, result, is_error) = run.result(i);
        assert!(!is_error, "{i}: {result}");
    }
    assert!(!p.file("pytest.ini").exists() && !p.file("pytest.py").exists() && !p.file(".cargo").exists());
    assert_eq!(p.read("Makefile"), make);
    assert!(p.read("pyproject.toml").contains("version = \"2\""));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_candidate_that_changes_test_configuration_is_discarded() {
    let p = counter(&[]);
    let run = hostile(
        &p,
        json!([
            {"tool_calls": [write("pytest.ini", COLLECT_ONLY), write("counter.py", COUNTER.replace("\" \"", "\"  \"").as_str())]},
            {"tool_calls": [write("counter.py", FIXED)]},
        ]),
        &["--strategy", "repair", "--candidates", "2", "--candidate-jobs", "1"],
    )
    .await;
    let r = report(&run);
    let verdicts: Vec<&str> = r["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["changes_tests", "passed"], "{r}");
    assert!(
        r["candidates"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("pytest's configuration: pytest.ini"),
        "{r}"
    );
    assert!(!p.file("pytest.ini").exists());
    assert_eq!(p.read("counter.py"), FIXED);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_candidate_that_runs_no_test_has_not_passed() {
    // A source file that ends the test run before any test (its own code, not the tests'):
    // pytest never prints a summary, the exit status is 0.
    let cheat = "import os\nos._exit(0)\n";
    let p = counter(&[]);
    let run = hostile(
        &p,
        json!([
            {"tool_calls": [write("counter.py", cheat)]},
            {"tool_calls": [write("counter.py", FIXED)]},
        ]),
        &[
            "--strategy",
            "repair",
            "--candidates",
            "2",
            "--candidate-jobs",
            "1",
        ],
    )
    .await;
    let r = report(&run);
    assert_eq!(r["candidates"][0]["verdict"], "failed", "{r}");
    assert!(
        r["candidates"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("no tests ran"),
        "{r}"
    );
    assert_eq!(r["candidates"][1]["verdict"], "passed", "{r}");
    assert_eq!(p.read("counter.py"), FIXED);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_does_not_count_a_task_whose_test_configuration_changed_as_fixed() {
    // The fix is right and the tests pass; the task also changed pytest's settings.
    let script = json!({"turns": [
        {"tool_calls": [write("counter.py", FIXED), write("pyproject.toml", "[tool.pytest.ini_options]\ntestpaths = [\".\"]\n")]},
        {"text": "done"}
    ]})
    .to_string();
    let tasks = Project::new(&[
        ("words/counter.py", COUNTER),
        ("words/test_counter.py", TESTS),
        ("words/TASK.md", "The tests fail. Fix the code.\n"),
        ("words/script.json", &script),
    ]);
    let out = tempfile::tempdir().unwrap();
    let o = crate::support::run(
        agentbox()
            .args([
                "eval",
                "--provider",
                "scripted",
                "--edit-format",
                "whole",
                "--jobs",
                "1",
                "--out",
            ])
            .arg(out.path())
            .arg(tasks.path()),
    );
    let line = std::fs::read_to_string(out.path().join("results.jsonl")).unwrap();
    let r: Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    assert_eq!(r["tests_passed"], true, "{r}\n{}", text(&o.stderr));
    assert_eq!(r["tests_changed"], true, "{r}");
    assert_eq!(r["fixed"], false, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_that_cannot_start_for_a_declared_dependency_stop_before_any_model_request() {
    let pyproject = "[project]\nname = \"clock\"\nversion = \"1\"\n\n[project.optional-dependencies]\ntest = [\"agentbox_absent_helper>=1\"]\n";
    let p = Project::new(&[
        ("pyproject.toml", pyproject),
        ("clock.py", "def now():\n    return 1\n"),
        (
            "tests/test_clock.py",
            "import agentbox_absent_helper\nfrom clock import now\n\n\ndef test_now():\n    assert now() == 1\n",
        ),
    ]);
    let run = hostile(&p, json!([done("never asked")]), &["--no-setup"]).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("the module agentbox_absent_helper")
            && run
                .stderr
                .contains("pyproject.toml [project.optional-dependencies] test")
            && run.stderr.contains("--setup \"pip install -e '.[test]'\"")
            && run.stderr.contains("No model request was made"),
        "{}",
        run.stderr
    );
    assert!(
        !run.events.iter().any(|e| e["event"] == "model_request"),
        "{:?}",
        run.events
    );
    let step = run
        .events
        .iter()
        .find(|e| e["event"] == "preflight" && e["step"] == "tests_before")
        .unwrap();
    assert_eq!(step["ok"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_import_that_is_the_bug_goes_to_the_model() {
    let p = Project::new(&[
        (
            "pyproject.toml",
            "[project]\nname = \"shapes\"\nversion = \"1\"\ndependencies = []\n",
        ),
        (
            "geometry.py",
            "import mathutil\n\n\ndef area(r):\n    return mathutils_pi() * r * r\n",
        ),
        ("mathutils.py", "def pi():\n    return 3\n"),
        (
            "tests/test_geometry.py",
            "from geometry import area\n\n\ndef test_area():\n    assert area(1) == 3\n",
        ),
    ]);
    let fixed = "from mathutils import pi\n\n\ndef area(r):\n    return pi() * r * r\n";
    let run = hostile(
        &p,
        json!([{"tool_calls": [write("geometry.py", fixed)]}, done("Fixed the import.")]),
        &["--edit-format", "whole", "--no-setup"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.steps() >= 1);
    let c = &report(&run)["tests"]["commands"][0];
    assert_eq!(c["before"]["counts"]["errors"], 1, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prime_shows_the_tests_run_before_the_first_turn_without_running_them_again() {
    // Each run of the tests leaves a line in the sandbox's /tmp.
    let p = counter(&[(
        "conftest.py",
        "with open('/tmp/runs', 'a') as f:\n    f.write('run\\n')\n",
    )]);
    let run = hostile(
        &p,
        json!([{"tool_calls": [bash("wc -l < /tmp/runs")]}, done("Looked.")]),
        &["--prime"],
    )
    .await;
    let (_, runs, _) = run.result(0);
    assert!(
        runs.trim_start_matches("$ wc -l < /tmp/runs")
            .trim()
            .starts_with('1'),
        "{runs}"
    );
    let first = run.events.iter().find(|e| e["event"] == "model_request").unwrap();
    assert!(
        first.to_string().contains("test_extra_spaces"),
        "the failing output is in the first message: {first}"
    );
}

/// What the agent phase leaves outside the project decides nothing: before agentbox's own test
/// run the scratch directories (`/tmp`, `HOME`, the build caches) are as a session starts. Two
/// ways a model could forge a PASS from there: a `usercustomize.py` in `HOME`'s user site that
/// prints a passing summary for pytest, and a cargo test binary replaced in the target
/// directory (cargo runs it as "Fresh"). Both worked before: the verdict ran in the agent's
/// leftovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_the_agent_leaves_outside_the_project_decides_the_verdict() {
    let p = counter(&[]);
    let site = "$(python3 -c 'import site; print(site.getusersitepackages())')";
    let plant = format!(
        "mkdir -p {site} && printf '%s\\n' 'import os, sys' \
         'if \"pytest\" in sys.orig_argv:' \
         '    print(\"===== 2 passed in 0.01s =====\"); sys.stdout.flush(); os._exit(0)' \
         > {site}/usercustomize.py && python3 -m pytest -q; echo status=$?"
    );
    let run = hostile(
        &p,
        json!([{"tool_calls": [bash(&plant)]}, done("All tests pass.")]),
        &[],
    )
    .await;
    let tool_output = run.result(0).1;
    assert!(
        tool_output.contains("2 passed in 0.01s") && tool_output.contains("status=0"),
        "the plant works in the agent phase: {tool_output}"
    );
    let tests = &report(&run)["tests"];
    assert_eq!(tests["passed"], false, "{tests}");
    assert_eq!(tests["commands"][0]["counts"]["failed"], 1, "{tests}");

    let crate_ = Project::new(&[
        (
            "Cargo.toml",
            "[package]\nname = \"planted\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        ),
        (
            "src/lib.rs",
            "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n        assert_eq!(super::add(2, 2), 4);\n    }\n}\n",
        ),
    ]);
    let plant = "cargo test --no-run -q 2>/dev/null; for f in \"$CARGO_TARGET_DIR\"/debug/deps/planted-*; do \
                 [ -f \"$f\" ] && [ -x \"$f\" ] && printf '#!/bin/sh\\necho \"test result: ok. 1 passed; 0 failed\"\\n' > \"$f\"; \
                 done; cargo test 2>&1 | tail -3";
    let run = hostile(
        &crate_,
        json!([{"tool_calls": [bash(plant)]}, done("All tests pass.")]),
        &["--command-timeout", "600"],
    )
    .await;
    let tool_output = run.result(0).1;
    assert!(
        tool_output.contains("test result: ok. 1 passed"),
        "cargo runs the planted binary in the agent phase: {tool_output}"
    );
    let tests = &report(&run)["tests"];
    assert_eq!(tests["passed"], false, "{tests}");
    assert!(
        tests["commands"][0]["output_tail"]
            .as_str()
            .unwrap()
            .contains("assertion `left == right` failed"),
        "{tests}"
    );
}
