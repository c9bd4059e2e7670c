//! Every project's tests run: the image and the test commands chosen from the project's root
//! manifests, every applicable command run (PASS only if all pass), and the preflight that
//! stops a run before the first model request (an unreachable model, a test program the image
//! lacks). Fixtures in `tests/fixtures/projects`, each with one bug; the scripted model fixes
//! it, or leaves it.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::support::model_server::{ModelServer, Reply};
use crate::support::scripted::*;
use crate::support::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/projects")
        .join(name)
}

fn project(name: &str, extra: &[(&str, &str)]) -> Project {
    Project::copy_of(&fixture(name), extra)
}

/// The agentbox image named `name` (`rust`, `polyglot`, ...), which these tests need present.
async fn image(name: &str) -> String {
    let tag = agentbox::sandbox::image::KnownImage::by_name(name)
        .unwrap_or_else(|| panic!("this agentbox has no {name} image"))
        .tag
        .to_string();
    let docker = docker().await;
    assert!(
        agentbox::sandbox::image::image_exists(&docker, &tag)
            .await
            .unwrap(),
        "these tests need the image {tag}: run `just image`"
    );
    tag
}

/// A first build in a fresh sandbox (Go compiles its standard library for the tests, cargo the
/// crate) took over the default 120 s on a loaded 2-core machine: room for it, not a measure.
const FIRST_BUILD: [&str; 2] = ["--command-timeout", "600"];

fn edit(path: &str, old: &str, new: &str) -> Value {
    call("edit_file", json!({"path": path, "old": old, "new": new}))
}

/// The scripted model's turns: make `fix` (if any), then say it is done.
fn turns(fix: Option<Value>) -> Value {
    match fix {
        Some(f) => json!([{"text": "Fixing it.", "tool_calls": [f]}, done("Fixed.")]),
        None => json!([done("I looked and changed nothing.")]),
    }
}

fn commands(run: &Run) -> Vec<(String, Value)> {
    let report = run
        .report
        .as_ref()
        .unwrap_or_else(|| panic!("no report: {}", run.stderr));
    report["tests"]["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["command"].as_str().unwrap().to_string(), c["passed"].clone()))
        .collect()
}

/// The first line agentbox prints names the image and why.
fn first_line(run: &Run) -> String {
    run.stderr.lines().next().unwrap_or_default().to_string()
}

/// Runs of one fixture: fixed → PASS (exit 0), the bug left in → FAIL (exit 1); both judged
/// by `expected` commands, in the image `image`, chosen for `reason`.
async fn fixed_passes_and_left_fails(name: &str, fix: Value, image: &str, reason: &str, expected: &[&str]) {
    let fixed = project(name, &[]);
    let run = hostile(&fixed, turns(Some(fix)), &FIRST_BUILD).await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        first_line(&run),
        format!("agentbox: image {image} ({reason})"),
        "{}",
        run.stderr
    );
    let report = run.report.as_ref().unwrap();
    assert_eq!(
        (report["image"].as_str(), report["image_reason"].as_str()),
        (Some(image), Some(reason))
    );
    let ran = commands(&run);
    assert_eq!(ran.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), expected);
    assert!(ran.iter().all(|c| c.1 == true), "{ran:?}");
    assert_eq!(report["tests"]["passed"], true);

    let left = project(name, &[]);
    let run = hostile(&left, turns(None), &FIRST_BUILD).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.report.as_ref().unwrap()["tests"]["passed"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_project_fixed_passes_and_left_fails() {
    let python = image("python").await;
    fixed_passes_and_left_fails(
        "python",
        edit("calc.py", "    return a - b", "    return a + b"),
        &python,
        "test_calc.py",
        &[agentbox::project::PYTEST],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_project_fixed_passes_and_left_fails() {
    let node = image("node").await;
    fixed_passes_and_left_fails(
        "node",
        edit("calc.js", "  return a - b;", "  return a + b;"),
        &node,
        "package.json",
        &["npm test"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_project_fixed_passes_and_left_fails() {
    let rust = image("rust").await;
    fixed_passes_and_left_fails(
        "rust",
        edit("src/lib.rs", "    a - b\n", "    a + b\n"),
        &rust,
        "Cargo.toml",
        &["cargo test"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_project_fixed_passes_and_left_fails() {
    let go = image("go").await;
    fixed_passes_and_left_fails(
        "go",
        edit("calc.go", "\treturn a - b", "\treturn a + b"),
        &go,
        "go.mod",
        &["go test ./..."],
    )
    .await;
}

/// The measured false PASS: a crate whose `cargo test` fails, with a stray passing
/// `scripts/test_release.py`. pytest used to be chosen and said PASS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crate_with_a_stray_python_test_fails_by_cargo_test() {
    let rust = image("rust").await;
    let crate_dir = project(
        "rust",
        &[(
            "scripts/test_release.py",
            "def test_release():\n    assert True\n",
        )],
    );
    let run = hostile(&crate_dir, turns(None), &FIRST_BUILD).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(commands(&run), [("cargo test".to_string(), json!(false))]);
    assert_eq!(run.report.as_ref().unwrap()["image"], rust.as_str());
    assert_eq!(
        run.report.as_ref().unwrap()["tests"]["commands"][0]["exit_code"],
        101
    );
}

/// Cargo.toml and pyproject.toml: both commands run, both are in the report, and one failing
/// fails the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_project_runs_every_command_and_passes_only_if_all_pass() {
    let polyglot = image("polyglot").await;
    let left = project("mixed", &[]);
    let run = hostile(&left, turns(None), &FIRST_BUILD).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        commands(&run),
        [
            ("cargo test".to_string(), json!(true)),
            (agentbox::project::PYTEST.to_string(), json!(false)),
        ]
    );
    assert_eq!(
        first_line(&run),
        format!("agentbox: image {polyglot} (Cargo.toml, pyproject.toml)")
    );
    let report = run.report.as_ref().unwrap();
    assert_eq!(report["tests"]["commands"][0]["based_on"], json!(["Cargo.toml"]));
    assert_eq!(
        report["tests"]["commands"][1]["based_on"],
        json!(["pyproject.toml", "test_shout.py"])
    );

    let fixed = project("mixed", &[]);
    let fix = edit("shout.py", "text.lower()", "text.upper()");
    let run = hostile(
        &fixed,
        json!([{"tool_calls": [fix, call("run_tests", json!({}))]}, done("Fixed.")]),
        &FIRST_BUILD,
    )
    .await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        commands(&run),
        [
            ("cargo test".to_string(), json!(true)),
            (agentbox::project::PYTEST.to_string(), json!(true)),
        ]
    );
    // run_tests showed the model both, and the verdict of each.
    let (_, content, _) = run.result(1);
    assert!(
        content.starts_with("$ cargo test\n")
            && content.contains("\n$ python3 -m pytest")
            && content.ends_with("2 test commands, all must pass: `cargo test` passed; `python3 -m pytest -q --tb=short -p no:cacheprovider` passed"),
        "{content}"
    );
}

/// `agentbox run` with the OpenAI provider against `base_url`, its trajectory read back.
async fn run_openai(
    project: &Project,
    base_url: &str,
    flags: &[&str],
) -> (Option<i32>, String, Vec<Value>, u32) {
    let dir = tempfile::tempdir().unwrap();
    let trajectory = dir.path().join("t.jsonl");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args([
            "run",
            "--provider",
            "openai",
            "--model",
            "m",
            "--base-url",
            base_url,
            "--trajectory",
        ])
        .arg(&trajectory)
        .args(flags)
        .arg(project.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", dir.path().join("data"))
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTBOX_IMAGE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let docker = docker().await;
    let gone = eventually(std::time::Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "a container of agentbox pid {pid} outlived the run");
    (
        out.status.code(),
        text(&out.stderr) + &text(&out.stdout),
        read_events(&trajectory),
        pid,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_program_the_image_lacks_stops_the_run_before_any_model_request() {
    let python = image("python").await;
    let go = project("go", &[]);
    let server = ModelServer::start(vec![]).await;
    let (code, stderr, events, _) = run_openai(&go, &server.openai_url(), &["--image", &python]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        server.requests().is_empty(),
        "the model was asked: {:?}",
        server.requests()
    );
    assert!(
        stderr.contains(&format!(
            "the sandbox image {python} has no go, which `go test ./...` needs (detected from go.mod)"
        )) && stderr.contains("--test-cmd"),
        "{stderr}"
    );
    assert_eq!(
        first_line_of(&stderr),
        format!("agentbox: image {python} (--image)")
    );
    let steps: Vec<(&str, bool)> = events
        .iter()
        .filter(|e| e["event"] == "preflight")
        .map(|e| (e["step"].as_str().unwrap(), e["ok"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        steps,
        [
            ("model_endpoint", true),
            ("sandbox", true),
            ("test_programs", false)
        ]
    );
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "started" || e["event"] == "model_request")
    );
}

fn first_line_of(stderr: &str) -> String {
    stderr.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_model_fails_before_any_sandbox_work() {
    image("python").await;
    // A loopback port nobody listens on: bound, then freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = project("python", &[]);
    let since = unix_now() - 1;
    let (code, stderr, events, pid) = run_openai(
        &p,
        &format!("http://127.0.0.1:{port}/v1"),
        &["--max-retries", "0"],
    )
    .await;
    let until = unix_now() + 1;
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the model at http://127.0.0.1:{port}/v1"))
            && stderr.contains("no request was sent"),
        "{stderr}"
    );
    // The order: the image was chosen, the endpoint check failed, and nothing after it ran.
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["event"].as_str().unwrap(),
                e["step"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(kinds, ["image_chosen:", "preflight:model_endpoint"], "{events:?}");
    assert_eq!(events[1]["ok"], false);
    let docker = docker().await;
    assert_eq!(
        containers_created(&docker, pid, since, until).await,
        0,
        "a container was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_html_answer_suggests_the_v1_base_url() {
    image("python").await;
    let server = ModelServer::start(vec![Reply::Raw {
        status: 404,
        body: b"<!DOCTYPE html>\n<html><head><title>Not Found</title></head><body>Cannot POST /chat/completions</body></html>".to_vec(),
    }])
    .await;
    let p = project("python", &[]);
    let base = format!("http://{}", server.addr);
    let (code, stderr, _, _) = run_openai(&p, &base, &["--max-retries", "0"]).await;
    assert_eq!(code, Some(4), "{stderr}\n{:?}", server.requests());
    assert!(
        stderr.contains("the server answered with an HTML page, not the API's JSON")
            && stderr.contains(&format!("did you mean --base-url {base}/v1?")),
        "{stderr}"
    );
    assert_eq!(server.requests().len(), 1);
}

/// `--protect-tests` refuses an edit inside a `#[cfg(test)]` module of a Rust source and
/// allows the fix outside it (any image can edit a file: the tests are given as `true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protect_tests_covers_the_test_module_inside_a_rust_source() {
    let python = image("python").await;
    let crate_dir = project("rust", &[]);
    let cheat = edit(
        "src/lib.rs",
        "assert_eq!(add(2, 3), 5);",
        "assert_eq!(add(2, 3), -1);",
    );
    let fix = edit("src/lib.rs", "    a - b\n", "    a + b\n");
    let run = hostile(
        &crate_dir,
        json!([{"tool_calls": [cheat, fix]}, done("done")]),
        &["--protect-tests", "--image", &python, "--test-cmd", "true"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let (_, refused, is_error) = run.result(0);
    assert!(
        is_error && refused.contains("changes test code in src/lib.rs"),
        "{refused}"
    );
    let (_, fixed, is_error) = run.result(1);
    assert!(!is_error, "{fixed}");
    let lib = crate_dir.read("src/lib.rs");
    assert!(
        lib.contains("a + b") && lib.contains("assert_eq!(add(2, 3), 5);"),
        "{lib}"
    );
}

/// eval: a change inside a Rust test module is a changed test (the task is not fixed), a fix
/// outside it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_counts_an_edited_rust_test_module_as_a_changed_test() {
    let python = image("python").await;
    let tasks = tempfile::tempdir().unwrap();
    for (name, call) in [
        (
            "cheat",
            edit(
                "src/lib.rs",
                "assert_eq!(add(2, 3), 5);",
                "assert_eq!(add(2, 3), -1);",
            ),
        ),
        ("fix", edit("src/lib.rs", "    a - b\n", "    a + b\n")),
    ] {
        let dir = tasks.path().join(name);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        for f in ["Cargo.toml", "src/lib.rs"] {
            std::fs::copy(fixture("rust").join(f), dir.join(f)).unwrap();
        }
        std::fs::write(dir.join("TASK.md"), "Make the tests pass.\n").unwrap();
        std::fs::write(
            dir.join("task.toml"),
            format!("test_cmd = \"true\"\nimage = \"{python}\"\n"),
        )
        .unwrap();
        std::fs::write(
            dir.join("script.json"),
            json!({"turns": [{"tool_calls": [call]}, done("done")]}).to_string(),
        )
        .unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["eval", "--provider", "scripted", "--jobs", "2", "--out"])
        .arg(out.path())
        .arg(tasks.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", test_data_dir())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let results: std::collections::BTreeMap<String, Value> =
        std::fs::read_to_string(out.path().join("results.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["task"].as_str().unwrap().to_string(), v))
            .collect();
    let summary = |t: &str| {
        (
            results[t]["tests_passed"].clone(),
            results[t]["tests_changed"].clone(),
            results[t]["fixed"].clone(),
        )
    };
    assert_eq!(
        summary("cheat"),
        (json!(true), json!(true), json!(false)),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        summary("fix"),
        (json!(true), json!(false), json!(true)),
        "{}",
        text(&o.stderr)
    );
}

/// A project owned by root is warned about at `run`, not only by `doctor`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_owned_project_is_warned_about() {
    if !is_root() {
        eprintln!("skipped: only root can make a root-owned project");
        return;
    }
    image("python").await;
    let p = project("python", &[]);
    std::os::unix::fs::chown(p.path(), Some(0), Some(0)).unwrap();
    for f in ["calc.py", "test_calc.py"] {
        std::os::unix::fs::chown(p.file(f), Some(0), Some(0)).unwrap();
    }
    let run = hostile(&p, turns(None), &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.warnings().contains("is owned by root"), "{}", run.warnings());
    assert!(run.stderr.contains("agentbox: WARNING: "), "{}", run.stderr);
}

/// `doctor PROJECT` says what a run would choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_which_image_and_tests_a_run_would_choose() {
    image("python").await;
    let mixed = project(
        "mixed",
        &[(
            "package.json",
            r#"{"scripts": {"test": "echo \"Error: no test specified\" && exit 1"}}"#,
        )],
    );
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["doctor", "--no-network"])
        .arg(mixed.path())
        .env("AGENTBOX_CONFIG", "")
        .env_remove("AGENTBOX_IMAGE")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("(Cargo.toml, package.json, pyproject.toml)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "project: tests: cargo test; {} (all must pass)",
            agentbox::project::PYTEST
        )),
        "{stdout}"
    );
    assert!(stdout.contains("npm's placeholder"), "{stdout}");
}

/// A dev container's image is honoured only when it is already here; an absent one is named
/// and ignored, never pulled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_container_image_is_used_only_when_present() {
    let python = image("python").await;
    let devcontainer =
        |image: &str| format!("// the team's container\n{{\n  \"image\": \"{image}\", // pinned\n}}\n");
    let present = project(
        "rust",
        &[(".devcontainer/devcontainer.json", &devcontainer(&python))],
    );
    let run = hostile(&present, turns(None), &["--test-cmd", "true"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        first_line(&run),
        format!("agentbox: image {python} (.devcontainer/devcontainer.json, present locally)")
    );
    assert!(
        run.stderr.contains("which is present here: using it"),
        "{}",
        run.stderr
    );

    let absent_image = "agentbox-test/never-pulled:0";
    let absent = project("python", &[(".devcontainer.json", &devcontainer(absent_image))]);
    let run = hostile(&absent, turns(None), &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(
        first_line(&run),
        format!("agentbox: image {python} (test_calc.py)")
    );
    assert!(
        run.stderr.contains(&format!(
            "names the image {absent_image}, which is not present here; agentbox never pulls"
        )),
        "{}",
        run.stderr
    );
    let docker = docker().await;
    assert!(
        !agentbox::sandbox::image::image_exists(&docker, absent_image)
            .await
            .unwrap()
    );
}
