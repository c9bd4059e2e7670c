//! The setup phase end to end: the real binary, a scripted model, the real images, and
//! package indexes served by the test on 127.0.0.1 (no traffic leaves the machine).
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::time::{Duration, Instant};

use crate::support::scripted::{Run, bash, done, finish, hostile, spawn_run};
use crate::support::upstream::{Upstream, simple_index, wheel};
use crate::support::*;
use serde_json::{Value, json};

const VENV: &str = "/opt/agentbox-deps/venv";

async fn caches_of(project: &Project) -> Vec<String> {
    let docker = docker().await;
    let path = project.path().display().to_string();
    agentbox::sandbox::caches::list(&docker)
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, of)| *of == path)
        .map(|(n, _)| n)
        .collect()
}

fn notes(run: &Run) -> Vec<String> {
    run.events
        .iter()
        .filter(|e| e["event"] == "note")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect()
}

fn python_project() -> Project {
    Project::new(&[
        ("requirements.txt", "agentbox-fixture-pkg==1.0\n"),
        (
            "test_fixture.py",
            "import agentbox_fixture_pkg\n\n\ndef test_value():\n    assert agentbox_fixture_pkg.VALUE == \"from the local index\"\n",
        ),
    ])
}

/// Setup installs a package that exists only on a loopback index, through the proxy; the agent
/// phase runs the tests with no network, cannot reach the proxy, cannot write the cache; a
/// second run downloads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_project_installs_from_a_local_index_once_and_tests_offline() {
    let (file, data) = wheel("agentbox_fixture_pkg", "1.0", "from the local index");
    let index = Upstream::http(simple_index("agentbox-fixture-pkg", &file, data)).await;
    let port = index.addr.port();
    let project = python_project();
    let setup = format!(
        "python3 -m venv --system-site-packages {VENV} && pip install --index-url http://127.0.0.1:{port}/simple/ -r requirements.txt"
    );
    let allow = format!("127.0.0.1:{port}");
    let args = [
        "--setup",
        setup.as_str(),
        "--allow-host",
        allow.as_str(),
        "--command-timeout",
        "300",
    ];
    // The agent phase: the package is there, the cache is read-only, and no proxy answers.
    let probe = bash(
        "python3 -c 'import agentbox_fixture_pkg as p; print(p.VALUE)'; \
         touch /opt/agentbox-deps/venv/planted && echo WROTE-CACHE; \
         python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3128), 5)' 2>&1 | tail -1; \
         ls /run/agentbox-egress.sock 2>&1 | tail -1",
    );
    let turns = json!([{"tool_calls": [probe]}, done("Checked.")]);

    let t0 = Instant::now();
    let cold = hostile(&project, turns.clone(), &args).await;
    let cold_secs = t0.elapsed().as_secs_f64();
    assert_eq!(cold.code, Some(0), "{}\n{}", cold.stdout, cold.stderr);
    let (_, out, _) = cold.result(0);
    assert!(out.contains("from the local index"), "{out}");
    assert!(
        !out.lines().any(|l| l == "WROTE-CACHE") && out.contains("Read-only file system"),
        "{out}"
    );
    assert!(
        out.contains("Connection refused"),
        "the agent phase reached a proxy: {out}"
    );
    assert!(out.contains("No such file or directory"), "{out}");
    let requests = index.count();
    assert!(
        requests >= 2,
        "the index page and the wheel: {:?}",
        index.paths.lock().unwrap()
    );
    let report = cold.report.as_ref().unwrap();
    let egress = report["egress"].as_array().unwrap();
    assert!(
        egress
            .iter()
            .all(|d| d["allowed"] == json!(true) && d["phase"] == "setup" && d["port"] == json!(port)),
        "{egress:?}"
    );
    assert!(egress.iter().any(|d| d["bytes_down"].as_u64().unwrap() > 0));
    assert!(
        cold.events.iter().any(|e| e["event"] == "egress"),
        "decisions in the trajectory"
    );
    assert!(
        cold.stderr
            .contains("  | Successfully installed agentbox-fixture-pkg-1.0"),
        "{}",
        cold.stderr
    );
    // Streamed line by line as it was written, not only at the command's end.
    let lines: Vec<&str> = cold
        .events
        .iter()
        .filter(|e| e["event"] == "setup_line")
        .filter_map(|e| e["line"].as_str())
        .collect();
    assert!(
        lines.iter().any(|l| l.starts_with("Successfully installed")),
        "{lines:?}"
    );
    assert!(project.file(".venv").symlink_metadata().is_err() && !project.file("venv").exists());
    assert_eq!(
        caches_of(&project).await.len(),
        2,
        "the cache and its commit marker"
    );

    let t1 = Instant::now();
    let warm = hostile(&project, turns.clone(), &args).await;
    let warm_secs = t1.elapsed().as_secs_f64();
    assert_eq!(warm.code, Some(0), "{}\n{}", warm.stdout, warm.stderr);
    assert_eq!(index.count(), requests, "the second run asked the index nothing");
    assert!(
        notes(&warm)
            .iter()
            .any(|n| n.contains("dependencies from the cache")),
        "{:?}",
        notes(&warm)
    );
    assert!(
        warm.report.as_ref().unwrap().get("egress").is_none(),
        "no proxy ran"
    );
    // For the figure only: the same run without setup (its tests cannot start, the declared
    // package is missing: exit 2 before any model request).
    let t2 = Instant::now();
    let bare = hostile(&project, turns, &["--no-setup", "--command-timeout", "300"]).await;
    let bare_secs = t2.elapsed().as_secs_f64();
    assert_eq!(
        bare.code,
        Some(2),
        "without the package the tests cannot start: {}",
        bare.stderr
    );
    eprintln!(
        "setup fixture: cold run {cold_secs:.1}s, warm run {warm_secs:.1}s, run without setup {bare_secs:.1}s"
    );
    // Plain gc leaves the caches; gc --caches lists and removes them.
    let gc = run(agentbox().arg("gc"));
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert_eq!(caches_of(&project).await.len(), 2, "plain gc took a cache");
    // This project's only: the other tests' caches, on the same daemon, are in use.
    let gc = run(agentbox()
        .args(["gc", "--caches", "--project"])
        .arg(project.path()));
    let listed = text(&gc.stdout);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    let path = project.path().display().to_string();
    assert_eq!(
        listed
            .lines()
            .filter(|l| l.starts_with("removed cache agentbox-cache-")
                && l.ends_with(&format!("(project {path})")))
            .count(),
        2,
        "{listed}"
    );
    assert!(caches_of(&project).await.is_empty());
}

/// A tool that retries a refused host (pip tries five times) gets the refusal said once in the
/// final error, with its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_refused_on_every_retry_is_named_once_in_the_error() {
    let project = python_project();
    let fetch =
        "python3 -c 'import urllib.request; urllib.request.urlopen(\"https://nowhere.test/\", timeout=20)'";
    let setup = format!("for i in 1 2 3 4; do {fetch} 2>/dev/null; done; exit 1");
    let run = hostile(
        &project,
        json!([done("never asked")]),
        &["--setup", setup.as_str()],
    )
    .await;
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    let error = run
        .stderr
        .lines()
        .find(|l| l.starts_with("agentbox: error: setup failed: "))
        .unwrap_or_else(|| panic!("no setup error: {}", run.stderr));
    let refusal = "blocked nowhere.test:443 — not in the allowlist; allow it with --allow-host nowhere.test";
    assert!(
        error.ends_with(&format!("; the egress proxy refused: {refusal} (4 times)")),
        "{error}"
    );
    assert_eq!(error.matches(refusal).count(), 1, "{error}");
    assert!(caches_of(&project).await.is_empty());
}

/// A failed setup stops the run with exit 4 and its output, and leaves no cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_endless_setup_stops_the_run_and_leaves_no_cache() {
    let project = python_project();
    let run = hostile(
        &project,
        json!([done("never asked")]),
        &["--setup", "echo about to fail; exit 3"],
    )
    .await;
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("setup failed: `echo about to fail; exit 3` ended with exit 3"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("about to fail"), "{}", run.stderr);
    assert_eq!(run.steps(), 0, "no model request");
    assert!(caches_of(&project).await.is_empty());

    let t0 = Instant::now();
    let run = hostile(
        &project,
        json!([done("never asked")]),
        &["--setup", "sleep 600", "--setup-timeout", "3"],
    )
    .await;
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(
        run.stderr.contains("the setup timeout (3s, --setup-timeout)"),
        "{}",
        run.stderr
    );
    assert!(t0.elapsed() < Duration::from_secs(240));
    assert!(caches_of(&project).await.is_empty());
}

/// Ctrl-C during setup: no container, no cache volume, no proxy socket is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_setup_leaves_nothing() {
    let project = python_project();
    let spawned = spawn_run(
        &project,
        json!([done("never asked")]),
        &["--setup", "sleep 600"],
        &[],
    );
    let (pid, trajectory) = (spawned.pid, spawned.trajectory.clone());
    let socket = || {
        crate::support::scripted::read_events(&trajectory)
            .iter()
            .filter_map(|e| {
                e["message"]
                    .as_str()
                    .and_then(|m| m.strip_prefix("setup: egress proxy on "))
                    .map(String::from)
            })
            .next()
    };
    let running = eventually(Duration::from_secs(180), || async {
        crate::support::scripted::read_events(&trajectory)
            .iter()
            .any(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("setup: running"))
            })
    })
    .await;
    assert!(running, "setup never started");
    let socket = socket().expect("the proxy's socket is named");
    assert!(std::path::Path::new(&socket).exists());
    // SAFETY: signalling the child we started.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let run = finish(spawned).await;
    assert_eq!(run.code, Some(130), "{}", run.stderr);
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the proxy's socket outlived the run"
    );
    assert!(
        caches_of(&project).await.is_empty(),
        "a half-filled cache was left"
    );
    let docker = docker().await;
    assert_eq!(volumes_of_pid(&docker, pid).await, 0);
}

/// Each ecosystem's default setup, with its registry not allowed, fails cleanly with the
/// blocked line (and sends nothing anywhere: the proxy refuses the name before resolving it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_setups_fail_cleanly_when_their_registry_is_not_allowed() {
    let cases: [(&str, Vec<(&str, &str)>); 4] = [
        (
            "python",
            vec![("requirements.txt", "agentbox-fixture-pkg==1.0\n")],
        ),
        (
            "node",
            vec![(
                "package.json",
                r#"{"name": "x", "version": "1.0.0", "dependencies": {"agentbox-fixture-pkg": "1.0.0"}}"#,
            )],
        ),
        (
            "go",
            vec![
                (
                    "go.mod",
                    "module example.test/x\n\ngo 1.21\n\nrequire example.test/dep v1.0.0\n",
                ),
                ("x.go", "package x\n"),
            ],
        ),
        (
            "rust",
            vec![
                (
                    "Cargo.toml",
                    "[package]\nname = \"x\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nagentbox-fixture-pkg = \"1\"\n",
                ),
                ("src/lib.rs", ""),
            ],
        ),
    ];
    for (image, files) in cases {
        let tag = agentbox::sandbox::image::KnownImage::by_name(image).unwrap().tag;
        let project = Project::new(&files);
        let run = hostile(
            &project,
            json!([done("never asked")]),
            &[
                "--no-default-registries",
                "--image",
                tag,
                "--setup-timeout",
                "300",
            ],
        )
        .await;
        assert_eq!(run.code, Some(4), "{image}: {}", run.stderr);
        let blocked: Vec<&Value> = run.report.iter().collect();
        assert!(blocked.is_empty(), "no report on a setup failure");
        assert!(
            run.stderr
                .contains("— not in the allowlist; allow it with --allow-host "),
            "{image}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("agentbox: error: setup failed: `"),
            "{image}: {}",
            run.stderr
        );
        assert!(caches_of(&project).await.is_empty());
    }
}

/// `--agent-network allowlist`: the agent's commands get the proxy and its allowlist, and
/// nothing more; their decisions are the report's, marked as the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_network_opt_in_gives_the_agent_the_allowlist_only() {
    let up = Upstream::http(std::collections::HashMap::from([(
        "/hello".to_string(),
        crate::support::upstream::Body::Bytes(b"hello agent".to_vec()),
    )]))
    .await;
    let port = up.addr.port();
    let project = Project::new(&[("README.md", "nothing to install\n")]);
    let fetch = format!(
        "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:{port}/hello\", timeout=30).read().decode())'; \
         python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:1/\", timeout=30)' 2>&1 | tail -1"
    );
    let allow = format!("127.0.0.1:{port}");
    let run = hostile(
        &project,
        json!([{"tool_calls": [bash(&fetch)]}, done("Fetched.")]),
        &["--agent-network", "allowlist", "--allow-host", allow.as_str()],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let (_, out, _) = run.result(0);
    assert!(out.contains("hello agent"), "{out}");
    assert!(
        out.contains("403") && !out.contains("Connection refused"),
        "port 1 is refused by the proxy: {out}"
    );
    assert!(
        run.stderr.contains("WARNING: --agent-network allowlist"),
        "{}",
        run.stderr
    );
    let egress = run.report.as_ref().unwrap()["egress"].as_array().unwrap().clone();
    assert_eq!(egress.len(), 2, "{egress:?}");
    assert!(egress.iter().all(|d| d["phase"] == "agent"));
    assert_eq!(egress.iter().filter(|d| d["allowed"] == json!(true)).count(), 1);
    assert_eq!(up.count(), 1);
}

/// `--isolate` promises the project is only read until `--apply`: its setup works on a copy,
/// so what installing writes into the tree succeeds there, never reaches the project, and is
/// not in the agent's own copy either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_runs_setup_works_on_a_copy_and_never_writes_the_project() {
    let project = Project::new(&[("test_a.py", "def test_a():\n    assert True\n")]);
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("test -e planted && echo AGENT-SEES-IT || echo AGENT-FRESH-COPY")]},
            done("Looked.")
        ]),
        &[
            "--isolate",
            "--setup",
            "touch /workspace/planted && test -f /workspace/planted",
        ],
    )
    .await;
    assert!(
        !run.stderr.contains("Read-only file system"),
        "setup may write its copy: {}",
        run.stderr
    );
    assert!(!project.file("planted").exists(), "the project is untouched");
    let (_, out, _) = run.result(0);
    assert!(out.contains("AGENT-FRESH-COPY"), "{out}");
    remove_caches(&project).await;
}

/// A PEP 517 backend inside the project (`backend-path`), needing nothing from an index: the
/// tests below install packages with no network at all. Editable: a `.pth` naming `src`.
const IN_TREE_BACKEND: &str = r#"import base64, hashlib, os, tomllib, zipfile

def _meta():
    with open("pyproject.toml", "rb") as f:
        p = tomllib.load(f)["project"]
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"]]
    lines += ["Requires-Dist: " + r for r in p.get("dependencies", [])]
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s ; extra == "%s"' % (r, extra) for r in reqs]
    return p["name"].replace("-", "_"), p["version"], "\n".join(lines) + "\n"

def get_requires_for_build_wheel(config_settings=None):
    return []

get_requires_for_build_editable = get_requires_for_build_wheel

def _wheel(directory, files):
    name, version, meta = _meta()
    dist = "%s-%s.dist-info" % (name, version)
    files = dict(files)
    files[dist + "/METADATA"] = meta
    files[dist + "/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data.encode())))
    files[dist + "/RECORD"] = "\n".join(record + [dist + "/RECORD,,"]) + "\n"
    wheel = "%s-%s-py3-none-any.whl" % (name, version)
    with zipfile.ZipFile(os.path.join(directory, wheel), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _meta()[0]
    return _wheel(wheel_directory, {"_%s_editable.pth" % name: os.path.abspath("src") + "\n"})

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {}
    for root, _, names in os.walk("src"):
        for n in names:
            if n.endswith((".py", ".pth")):
                with open(os.path.join(root, n)) as f:
                    files[os.path.relpath(os.path.join(root, n), "src")] = f.read()
    return _wheel(wheel_directory, files)
"#;

fn in_tree_pyproject(name: &str, extra_tables: &str) -> String {
    format!(
        "[build-system]\nrequires = []\nbuild-backend = \"agentbox_backend\"\nbackend-path = [\".\"]\n\n\
         [project]\nname = \"{name}\"\nversion = \"1.2.3\"\n{extra_tables}"
    )
}

/// A src-layout package with no dependencies of its own, whose tests read its installed
/// version and import what its test extra and its dependency group bring (local packages
/// here, so no index is needed); a docs extra and a lint group are not installed.
fn package_project() -> Project {
    let main = in_tree_pyproject(
        "clockpkg",
        "\n[project.optional-dependencies]\ntest = [\"clockhelper @ file:///workspace/vendor/clockhelper\"]\n\
         docs = [\"agentbox-absent-docs-pkg\"]\n\n\
         [dependency-groups]\ntests = [\"grouphelper @ file:///workspace/vendor/grouphelper\"]\n\
         lint = [\"agentbox-absent-lint-pkg\"]\n",
    );
    let helper = in_tree_pyproject("clockhelper", "");
    let group = in_tree_pyproject("grouphelper", "");
    Project::new(&[
        ("pyproject.toml", main.as_str()),
        ("agentbox_backend.py", IN_TREE_BACKEND),
        ("src/clockpkg/__init__.py", "def now():\n    return 1\n"),
        (
            "tests/test_clock.py",
            "import importlib.metadata\n\nimport clockhelper\nimport grouphelper\nfrom clockpkg import now\n\n\n\
             def test_version():\n    assert importlib.metadata.version(\"clockpkg\") == \"1.2.3\"\n\n\n\
             def test_helpers():\n    assert clockhelper.VALUE + grouphelper.VALUE == 3\n\n\n\
             def test_now():\n    assert now() == 1\n",
        ),
        ("vendor/clockhelper/pyproject.toml", helper.as_str()),
        ("vendor/clockhelper/agentbox_backend.py", IN_TREE_BACKEND),
        ("vendor/clockhelper/src/clockhelper/__init__.py", "VALUE = 1\n"),
        ("vendor/grouphelper/pyproject.toml", group.as_str()),
        ("vendor/grouphelper/agentbox_backend.py", IN_TREE_BACKEND),
        ("vendor/grouphelper/src/grouphelper/__init__.py", "VALUE = 2\n"),
    ])
}

/// Python like CI, with no flags: a package is installed (editable) even with no dependencies,
/// with its test extras and dependency groups, and the setup line says what and why; a
/// project with nothing to install says that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_package_is_installed_with_its_test_extras_and_groups_and_no_flags() {
    let project = package_project();
    let run = hostile(
        &project,
        json!([done("Nothing to change.")]),
        &["--command-timeout", "300"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "agentbox: setup: Python: installing the project itself, editable (it is a package: \
             pyproject.toml [project]), with its extras test (pyproject.toml \
             [project.optional-dependencies]); the dependency groups tests"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("agentbox: setup: running `pip install -e '.[test]' --group tests`"),
        "{}",
        run.stderr
    );
    let report = run.report.as_ref().unwrap();
    assert_eq!(
        report["tests"]["commands"][0]["counts"]["passed"],
        json!(3),
        "{report}"
    );

    let bare = Project::new(&[("test_bare.py", "def test_one():\n    assert 1 == 1\n")]);
    let run = hostile(&bare, json!([done("Nothing to change.")]), &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("agentbox: setup: Python: nothing to install: no requirements file"),
        "{}",
        run.stderr
    );
    assert!(caches_of(&bare).await.is_empty(), "nothing to install, no cache");
    remove_caches(&project).await;
}

/// `--setup 'pip install -e ...'` as a user writes it: the venv is already there and active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_pip_install_runs_in_the_venv() {
    let project = package_project();
    let run = hostile(
        &project,
        json!([{"tool_calls": [bash("command -v python3 pip; echo VIRTUAL_ENV=$VIRTUAL_ENV")]}, done("Checked.")]),
        &["--setup", "pip install -e '.[test]' --group tests", "--command-timeout", "300"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        !run.stderr.contains("externally-managed-environment"),
        "{}",
        run.stderr
    );
    let (_, out, _) = run.result(0);
    assert!(
        out.contains(&format!("{VENV}/bin/python3")) && out.contains(&format!("VIRTUAL_ENV={VENV}")),
        "{out}"
    );
    remove_caches(&project).await;
}

/// This project's caches only: the daemon is shared, `gc --caches` would take everyone's.
async fn remove_caches(project: &Project) {
    let docker = docker().await;
    for name in caches_of(project).await {
        agentbox::sandbox::caches::remove(&docker, &name).await;
    }
}

/// `doctor` checks, from a sandbox through the egress proxy and with the trust setup passes in,
/// that TLS to what setup would reach verifies: an index signed by a CA that only the host's
/// bundle holds verifies with that bundle, and without it is a failure naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_tls_to_what_setup_reaches_with_the_hosts_trust() {
    let (file, data) = wheel("agentbox_fixture_pkg", "1.0", "from the local index");
    let index = Upstream::https(simple_index("agentbox-fixture-pkg", &file, data), "localhost").await;
    let port = index.addr.port();
    let host = tempfile::tempdir().unwrap();
    let host_bundle = host.path().join("host-bundle.pem");
    std::fs::write(&host_bundle, index.ca_pem.clone().unwrap()).unwrap();
    let target = format!("127.0.0.1:{port}");
    let doctor = |env: Vec<(&'static str, String)>, extra: Vec<String>| {
        let target = target.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = agentbox();
            cmd.args([
                "doctor",
                "--no-default-registries",
                "--allow-host",
                target.as_str(),
            ]);
            cmd.args(&extra);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let out = run(&mut cmd);
            (out.status.code(), text(&out.stdout))
        })
    };
    let (code, out) = doctor(vec![("SSL_CERT_FILE", host_bundle.display().to_string())], vec![])
        .await
        .unwrap();
    assert!(
        out.contains(&format!("[ok  ] registries: TLS to {target} verifies from"))
            && out.contains("the host's CA bundle (SSL_CERT_FILE)"),
        "{out}"
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        index.requests.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the index was reached"
    );

    // The system bundle does not hold the test's CA: a failure, with what to do.
    let (code, out) = doctor(vec![("SSL_CERT_FILE", String::new())], vec![])
        .await
        .unwrap();
    assert!(
        out.contains(&format!(
            "[FAIL] registries: TLS to {target} does not verify from"
        )) && out.contains("certificate verify failed")
            && out.contains("give its CA certificate with --ca-cert FILE"),
        "{out}"
    );
    assert_eq!(code, Some(1), "{out}");

    // --ca-cert is what setup would trust too.
    let (code, out) = doctor(
        vec![("SSL_CERT_FILE", String::new())],
        vec![
            "--no-host-ca".into(),
            "--ca-cert".into(),
            host_bundle.display().to_string(),
        ],
    )
    .await
    .unwrap();
    assert!(
        out.contains(&format!("[ok  ] registries: TLS to {target} verifies from")),
        "{out}"
    );
    assert_eq!(code, Some(0), "{out}");

    // --no-network: nothing reached.
    let before = index.requests.load(std::sync::atomic::Ordering::SeqCst);
    let (_, out) = doctor(vec![], vec!["--no-network".into()]).await.unwrap();
    assert!(
        out.contains("[ok  ] registries: not checked (--no-network)"),
        "{out}"
    );
    assert_eq!(index.requests.load(std::sync::atomic::Ordering::SeqCst), before);
}

/// A network that re-signs TLS, on loopback: an HTTPS index whose certificate only the host's
/// bundle (`SSL_CERT_FILE`, for this run) trusts. With it, setup's pip installs through the
/// proxy and the agent's commands (`--agent-network allowlist`) verify too, the bundle mounted
/// read-only; without it, setup stops with a message naming `--ca-cert` and the doctor;
/// `--no-host-ca --ca-cert FILE` passes that file's certificates, and nothing else of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_trusts_what_the_host_trusts_and_says_what_to_do_when_it_does_not() {
    let (file, data) = wheel("agentbox_fixture_pkg", "1.0", "from the local index");
    let index = Upstream::https(simple_index("agentbox-fixture-pkg", &file, data), "localhost").await;
    let port = index.addr.port();
    let ca = index.ca_pem.clone().unwrap();
    let host = tempfile::tempdir().unwrap();
    let host_bundle = host.path().join("host-bundle.pem");
    std::fs::write(&host_bundle, &ca).unwrap();
    let allow = format!("127.0.0.1:{port}");
    // No retries: an untrusted certificate is not a flaky network.
    let install = format!(
        "python3 -m venv --system-site-packages {VENV} && pip install --retries 0 --index-url https://127.0.0.1:{port}/simple/ -r requirements.txt"
    );
    let probe = bash(&format!(
        "python3 -c 'import agentbox_fixture_pkg as p; print(p.VALUE)'; \
         python3 -c 'import urllib.request as u; print(\"agent got\", u.urlopen(\"https://127.0.0.1:{port}/simple/agentbox-fixture-pkg/\", timeout=30).status)' 2>&1 | tail -1; \
         echo \"names $SSL_CERT_FILE $PIP_CERT $CARGO_HTTP_CAINFO\"; \
         echo extra >> \"$SSL_CERT_FILE\" || echo BUNDLE-READ-ONLY"
    ));
    let host_bundle_text = host_bundle.display().to_string();
    let project = python_project();
    let spawned = spawn_run(
        &project,
        json!([{"tool_calls": [probe]}, done("Checked.")]),
        &[
            "--setup",
            install.as_str(),
            "--allow-host",
            allow.as_str(),
            "--agent-network",
            "allowlist",
            "--command-timeout",
            "300",
        ],
        &[("SSL_CERT_FILE", host_bundle_text.as_str())],
    );
    let trusted = finish(spawned).await;
    assert_eq!(trusted.code, Some(0), "{}", trusted.stderr);
    assert!(
        trusted
            .stderr
            .contains("Successfully installed agentbox-fixture-pkg-1.0"),
        "{}",
        trusted.stderr
    );
    assert!(
        notes(&trusted).iter().any(|n| n
            .starts_with("setup: TLS trusts the image's CAs and the host's CA bundle (SSL_CERT_FILE)")
            && n.ends_with("(1 certificates)")),
        "{:?}",
        notes(&trusted)
    );
    let (_, out, _) = trusted.result(0);
    assert!(out.contains("from the local index"), "{out}");
    assert!(
        out.contains("agent got 200"),
        "the agent's commands verify too: {out}"
    );
    let mounted = "/run/agentbox-ca.pem";
    assert!(
        out.contains(&format!("names {mounted} {mounted} {mounted}")),
        "{out}"
    );
    assert!(out.contains("BUNDLE-READ-ONLY"), "{out}");
    assert!(
        !std::fs::read_to_string(&host_bundle).unwrap().contains("extra"),
        "the host's file is untouched"
    );
    let docker = docker().await;
    for name in caches_of(&project).await {
        agentbox::sandbox::caches::remove(&docker, &name).await;
    }

    // Without the host's bundle holding the CA (the system bundle does not): a clear stop.
    let project = python_project();
    let spawned = spawn_run(
        &project,
        json!([done("never asked")]),
        &["--setup", install.as_str(), "--allow-host", allow.as_str()],
        &[("SSL_CERT_FILE", "")],
    );
    let untrusted = finish(spawned).await;
    assert_eq!(untrusted.code, Some(4), "{}", untrusted.stderr);
    assert!(
        untrusted.stderr.contains("CERTIFICATE_VERIFY_FAILED"),
        "{}",
        untrusted.stderr
    );
    assert!(
        untrusted
            .stderr
            .contains("hint: a TLS certificate was not trusted (setup trusted the host's CA bundle")
            && untrusted
                .stderr
                .contains("give its CA certificate with --ca-cert FILE")
            && untrusted.stderr.contains("or set SSL_CERT_FILE to the bundle"),
        "{}",
        untrusted.stderr
    );
    assert_eq!(untrusted.steps(), 0, "no model request");
    assert!(caches_of(&project).await.is_empty());

    // --no-host-ca --ca-cert: a combined PEM (certificate and private key) gives only its
    // certificate; the setup command sees no key and cannot write the bundle.
    let combined = host.path().join("combined.pem");
    std::fs::write(
        &combined,
        format!("{ca}-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let checked = format!("! grep -q 'PRIVATE KEY' \"$PIP_CERT\" && ! test -w \"$PIP_CERT\" && {install}");
    let combined_text = combined.display().to_string();
    let spawned = spawn_run(
        &project,
        json!([done("Nothing to do.")]),
        &[
            "--setup",
            checked.as_str(),
            "--allow-host",
            allow.as_str(),
            "--no-host-ca",
            "--ca-cert",
            combined_text.as_str(),
        ],
        &[("SSL_CERT_FILE", host_bundle_text.as_str())],
    );
    let given = finish(spawned).await;
    assert_eq!(given.code, Some(0), "{}", given.stderr);
    assert!(
        notes(&given)
            .iter()
            .any(|n| n.starts_with("setup: TLS trusts the image's CAs and --ca-cert ")),
        "{:?}",
        notes(&given)
    );
    for name in caches_of(&project).await {
        agentbox::sandbox::caches::remove(&docker, &name).await;
    }
    // With --no-host-ca and nothing given, no bundle at all.
    let project = python_project();
    let spawned = spawn_run(
        &project,
        json!([done("never asked")]),
        &[
            "--setup",
            "test -z \"$SSL_CERT_FILE\" && test ! -e /run/agentbox-ca.pem && exit 7",
            "--no-host-ca",
        ],
        &[("SSL_CERT_FILE", host_bundle_text.as_str())],
    );
    let none = finish(spawned).await;
    assert!(
        none.stderr.contains("ended with exit 7"),
        "no bundle and no variable: {}",
        none.stderr
    );
    assert!(caches_of(&project).await.is_empty());
}

/// An image whose cargo uses a mirror of its default registry (`/.cargo/config.toml`, the
/// image's own configuration, as a company image would have), built here on top of the rust
/// image; removed when dropped.
struct MirrorImage {
    tag: String,
}

impl MirrorImage {
    async fn build(index: &str) -> MirrorImage {
        use bollard::query_parameters::BuildImageOptionsBuilder;
        use futures_util::StreamExt;
        let docker = docker().await;
        let base = agentbox::sandbox::image::KnownImage::by_name("rust").unwrap().tag;
        let tag = format!("agentbox-test/rust-mirror:{}", std::process::id());
        let config = format!(
            "[source.crates-io]\nreplace-with = \"mirror\"\n\n[source.mirror]\nregistry = \"sparse+{index}\"\n"
        );
        let dockerfile = format!("FROM {base}\nCOPY config.toml /.cargo/config.toml\n");
        let mut tar = tar::Builder::new(Vec::new());
        for (name, data) in [("Dockerfile", &dockerfile), ("config.toml", &config)] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, data.as_bytes()).unwrap();
        }
        let body = bollard::body_full(tar.into_inner().unwrap().into());
        let opts = BuildImageOptionsBuilder::default()
            .dockerfile("Dockerfile")
            .t(&tag)
            .rm(true)
            .build();
        let mut stream = docker.build_image(opts, None, Some(body));
        while let Some(item) = stream.next().await {
            let info = item.expect("build");
            assert!(info.error_detail.is_none(), "{:?}", info.error_detail);
        }
        MirrorImage { tag }
    }
}

impl Drop for MirrorImage {
    fn drop(&mut self) {
        let tag = self.tag.clone();
        let _ = std::process::Command::new("docker")
            .args(["image", "rm", "-f", &tag])
            .output();
    }
}

/// Rust like CI: a crate with a registry dev-dependency and no Cargo.lock, and no flag naming
/// a host. Setup learns the registry from the image's cargo (a probe from an empty directory
/// with an empty CARGO_HOME: the index it asks for; the download host from the index's
/// config.json, here another server), fetches through the proxy, and the tests pass offline.
/// The Cargo.lock cargo wrote is said in the report, is not one of the run's changes, and does
/// not change the cache key: the second run is served from the cache, downloading nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_crate_gets_its_registry_from_the_images_cargo_and_keeps_its_cache() {
    let (package, index_path, line) = crate::support::upstream::crate_package(
        "agentbox-fixture",
        "1.0.0",
        "pub const VALUE: &str = \"from the loopback registry\";\n",
    );
    let files = Upstream::https(
        std::collections::HashMap::from([(
            "/dl/agentbox-fixture-1.0.0.crate".to_string(),
            crate::support::upstream::Body::Bytes(package),
        )]),
        "localhost",
    )
    .await;
    let dl = format!(
        "https://127.0.0.1:{}/dl/{{crate}}-{{version}}.crate",
        files.addr.port()
    );
    let index = Upstream::https(
        std::collections::HashMap::from([
            (
                "/config.json".to_string(),
                crate::support::upstream::Body::Bytes(json!({ "dl": dl }).to_string().into_bytes()),
            ),
            (
                index_path,
                crate::support::upstream::Body::Bytes(format!("{line}\n").into_bytes()),
            ),
        ]),
        "localhost",
    )
    .await;
    let image = MirrorImage::build(&format!("https://127.0.0.1:{}/", index.addr.port())).await;
    let cas = tempfile::tempdir().unwrap();
    let (index_ca, files_ca) = (cas.path().join("index.pem"), cas.path().join("files.pem"));
    std::fs::write(&index_ca, index.ca_pem.as_deref().unwrap()).unwrap();
    std::fs::write(&files_ca, files.ca_pem.as_deref().unwrap()).unwrap();
    let project = Project::new(&[
        (
            "Cargo.toml",
            "[package]\nname = \"uses-fixture\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dev-dependencies]\nagentbox-fixture = \"1\"\n",
        ),
        (
            "src/lib.rs",
            "#[cfg(test)]\nmod tests {\n    #[test]\n    fn value() {\n        assert_eq!(agentbox_fixture::VALUE, \"from the loopback registry\");\n    }\n}\n",
        ),
    ]);
    let (index_ca, files_ca) = (index_ca.display().to_string(), files_ca.display().to_string());
    let args = [
        "--image",
        image.tag.as_str(),
        "--ca-cert",
        index_ca.as_str(),
        "--ca-cert",
        files_ca.as_str(),
        "--command-timeout",
        "600",
    ];
    let t0 = Instant::now();
    let cold = hostile(&project, json!([done("Nothing to change.")]), &args).await;
    let cold_secs = t0.elapsed().as_secs_f64();
    assert_eq!(cold.code, Some(0), "{}", cold.stderr);
    let learned = format!(
        "setup: cargo's registry (asked of the image's cargo): 127.0.0.1:{}, 127.0.0.1:{}",
        index.addr.port(),
        files.addr.port()
    );
    assert!(notes(&cold).contains(&learned), "{:?}", notes(&cold));
    assert!(
        files.count() >= 1 && index.count() >= 2,
        "config.json, the index, the package"
    );
    let report = cold.report.as_ref().unwrap();
    let egress = report["egress"].as_array().unwrap();
    assert!(
        egress.iter().all(|d| d["allowed"] == json!(true)),
        "the probe's own refusal is not the setup's: {egress:?}"
    );
    assert!(project.file("Cargo.lock").exists(), "cargo fetch wrote it");
    let warnings = report["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap()
            .starts_with("Cargo.lock: written into the project by setup")),
        "{warnings:?}"
    );
    assert!(
        report["changed_files"].as_array().unwrap().is_empty(),
        "{:?}",
        report["changed_files"]
    );
    let requests = (index.count(), files.count());

    let t1 = Instant::now();
    let warm = hostile(&project, json!([done("Nothing to change.")]), &args).await;
    let warm_secs = t1.elapsed().as_secs_f64();
    assert_eq!(warm.code, Some(0), "{}", warm.stderr);
    assert!(
        notes(&warm)
            .iter()
            .any(|n| n.contains("dependencies from the cache")),
        "the lockfile setup wrote does not change the key: {:?}",
        notes(&warm)
    );
    assert_eq!((index.count(), files.count()), requests, "nothing downloaded");
    assert!(warm.report.as_ref().unwrap().get("egress").is_none());
    assert!(
        warm.report.as_ref().unwrap()["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w
                .as_str()
                .unwrap()
                .starts_with("Cargo.lock: written into the project by setup")),
        "said again when it comes from the cache"
    );
    eprintln!("rust fixture: cold run {cold_secs:.1}s, warm run {warm_secs:.1}s");
    assert!(
        notes(&cold)
            .iter()
            .any(|n| n.starts_with("setup: the Rust pre-build done in")),
        "{:?}",
        notes(&cold)
    );

    // The registry's crate comes pre-built from setup's cache; the project's own crate is
    // compiled in each session (cargo would trust a stale artifact of it by its mtimes).
    let exec = |script: &str| {
        let mut cmd = agentbox();
        cmd.arg("exec")
            .args(args)
            .arg(project.path())
            .args(["--", "sh", "-c", script]);
        let out = run(&mut cmd);
        (
            out.status.code(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    };
    let (code, out) = exec("cargo test 2>&1");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Compiling uses-fixture"), "{out}");
    assert!(!out.contains("Compiling agentbox-fixture"), "pre-built: {out}");
    assert!(out.contains("test tests::value ... ok"), "{out}");

    // A test binary planted in one session's target directory: cargo runs it as fresh there,
    // and the next session never sees it.
    let plant = "cargo test --no-run -q 2>/dev/null; for f in \"$CARGO_TARGET_DIR\"/debug/deps/uses_fixture-*; do \
                 [ -f \"$f\" ] && [ -x \"$f\" ] && printf '#!/bin/sh\\necho planted\\n' > \"$f\"; done; \
                 cargo test 2>&1; touch /opt/agentbox-deps/build/written 2>&1";
    let (_, out) = exec(plant);
    assert!(
        out.contains("planted"),
        "the plant works in its own session: {out}"
    );
    assert!(
        out.contains("Read-only file system"),
        "setup's cache is read-only: {out}"
    );
    let (code, out) = exec("cargo test 2>&1");
    assert_eq!(code, Some(0), "{out}");
    assert!(
        !out.contains("planted") && out.contains("test tests::value ... ok"),
        "{out}"
    );
    let docker = docker().await;
    for name in caches_of(&project).await {
        agentbox::sandbox::caches::remove(&docker, &name).await;
    }
}

/// What setup writes into the project (a build backend's version file from VCS metadata, as
/// hatch-vcs and setuptools-scm write it; cargo's lockfile) is not the user's: the next run is
/// served from the cache while the file is as setup left it, and fills a cache again once the
/// user changes it. Before, every such project ran its setup again on every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_setup_writes_into_the_project_leaves_its_cache_fitting() {
    let project = Project::new(&[(
        "test_version.py",
        "from _version import VERSION\n\n\ndef test_version():\n    assert VERSION\n",
    )]);
    let args = ["--setup", "echo 'VERSION = \"1.0\"' > _version.py"];
    let said = |run: &Run, what: &str| notes(run).iter().any(|n| n.contains(what));
    let first = hostile(&project, json!([done("Looked.")]), &args).await;
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert!(
        said(&first, "setup: _version.py: written into the project by setup"),
        "{:?}",
        notes(&first)
    );
    assert!(
        first.report.as_ref().unwrap()["changed_files"]
            .as_array()
            .is_none_or(|c| c.is_empty()),
        "not one of the run's changes: {}",
        first.stdout
    );
    let second = hostile(&project, json!([done("Looked.")]), &args).await;
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    assert!(
        said(&second, "dependencies from the cache") && !said(&second, "setup: running"),
        "{:?}",
        notes(&second)
    );
    assert!(said(&second, "_version.py: written into the project by setup"));
    // The user's own change to it: the cache no longer fits.
    std::fs::write(project.file("_version.py"), "VERSION = \"2.0\"\n").unwrap();
    let third = hostile(&project, json!([done("Looked.")]), &args).await;
    assert_eq!(third.code, Some(0), "{}", third.stderr);
    assert!(said(&third, "setup: running"), "{:?}", notes(&third));
    remove_caches(&project).await;
}

/// A setup command that leaves a daemon holding its output: the command ends when its own
/// process does (the daemon is swept, as after an agent's command), not at --setup-timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_command_whose_daemon_holds_its_output_ends_with_its_main_process() {
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let run = hostile(
        &project,
        json!([done("Nothing to do.")]),
        &[
            "--setup",
            "echo starting; (sleep 600 &); echo daemon-started",
            "--setup",
            "echo second-command; exit 5",
            "--setup-timeout",
            "150",
        ],
    )
    .await;
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(
        !run.stderr.contains("--setup-timeout"),
        "the first command waited for its daemon: {}",
        run.stderr
    );
    // The second command ran, and its own output and status are what the error says.
    assert!(
        run.stderr
            .contains("setup failed: `echo second-command; exit 5` ended with exit 5"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("second-command"), "{}", run.stderr);
    assert!(
        run.stderr.contains("daemon-started"),
        "the first command's output was shown: {}",
        run.stderr
    );
    assert!(caches_of(&project).await.is_empty());
}

/// Hostile: a `.pth` planted through an included requirements file (`-r reqs/base.txt` names a
/// local package that ships one). The user fixes the include; the next run must not reuse the
/// poisoned venv (the key once hashed only the root manifests). `--refresh-setup` fills a
/// cache that fits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_include_is_not_served_from_the_poisoned_cache() {
    let evil = in_tree_pyproject("evilpkg", "");
    let project = Project::new(&[
        ("requirements.txt", "-r reqs/base.txt\n"),
        ("reqs/base.txt", "./vendor/evil\n"),
        ("vendor/evil/pyproject.toml", evil.as_str()),
        ("vendor/evil/agentbox_backend.py", IN_TREE_BACKEND),
        ("vendor/evil/src/evilpkg/__init__.py", ""),
        (
            "vendor/evil/src/evil_planted.pth",
            "import sys; sys.stderr.write('PLANTED-CODE-RAN\\n')\n",
        ),
        ("test_ok.py", "def test_ok():\n    assert True\n"),
    ]);
    let probe = bash("python3 -c 'print(\"probe\")' 2>&1");
    let turns = json!([{"tool_calls": [probe]}, done("Checked.")]);
    let poisoned = hostile(&project, turns.clone(), &["--command-timeout", "300"]).await;
    assert_eq!(poisoned.code, Some(0), "{}", poisoned.stderr);
    assert!(
        poisoned.result(0).1.contains("PLANTED-CODE-RAN"),
        "the attack works: {:?}",
        poisoned.result(0)
    );

    std::fs::write(project.file("reqs/base.txt"), "# nothing needed\n").unwrap();
    let fixed = hostile(&project, turns.clone(), &["--command-timeout", "300"]).await;
    assert_eq!(fixed.code, Some(0), "{}", fixed.stderr);
    let (_, out, _) = fixed.result(0);
    assert!(
        out.contains("probe") && !out.contains("PLANTED-CODE-RAN"),
        "the planted code ran after the fix: {out}\n{}",
        fixed.stderr
    );
    assert!(
        !notes(&fixed)
            .iter()
            .any(|n| n.contains("dependencies from the cache")),
        "{:?}",
        notes(&fixed)
    );

    let again = hostile(&project, turns.clone(), &["--command-timeout", "300"]).await;
    assert!(
        notes(&again)
            .iter()
            .any(|n| n.contains("dependencies from the cache")),
        "{:?}",
        notes(&again)
    );
    let refreshed = hostile(&project, turns, &["--refresh-setup", "--command-timeout", "300"]).await;
    assert_eq!(refreshed.code, Some(0), "{}", refreshed.stderr);
    assert!(
        notes(&refreshed)
            .iter()
            .any(|n| n.starts_with("setup: --refresh-setup: the cache ")),
        "{:?}",
        notes(&refreshed)
    );
    assert!(
        !notes(&refreshed)
            .iter()
            .any(|n| n.contains("dependencies from the cache"))
    );
    remove_caches(&project).await;
}

/// `npm test`'s programs are devDependencies; without them (here `--no-setup`) the run stops
/// before any model request, naming each, instead of the model meeting `sh: xo: not found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_scripts_missing_programs_stop_the_run_before_the_model() {
    let project = Project::new(&[
        (
            "package.json",
            r#"{"name": "x", "version": "1.0.0", "scripts": {"test": "agentbox-absent-lint && NODE_ENV=test agentbox-absent-cov node test.js"},
               "devDependencies": {"agentbox-absent-lint": "1", "agentbox-absent-cov": "1"}}"#,
        ),
        ("test.js", "console.log('ok')\n"),
    ]);
    let tag = agentbox::sandbox::image::KnownImage::by_name("node").unwrap().tag;
    let run = hostile(
        &project,
        json!([done("never asked")]),
        &["--no-setup", "--image", tag],
    )
    .await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "`npm test` (package.json's test script) runs agentbox-absent-lint, agentbox-absent-cov, found \
             neither in node_modules/.bin nor in the sandbox image"
        ) && run.stderr.contains("No model request was made"),
        "{}",
        run.stderr
    );
    assert_eq!(run.steps(), 0, "no model request");
}

/// A run that passed with its dependencies from the cache: no setup, no proxy.
fn assert_from_the_cache(run: &Run) {
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        notes(run)
            .iter()
            .any(|n| n.contains("dependencies from the cache")),
        "{:?}",
        notes(run)
    );
    assert!(run.report.as_ref().unwrap().get("egress").is_none());
}

/// Node like CI, against a static npm registry the test serves on loopback: the project's own
/// `.npmrc` points npm there (npm reads it; the allowlist never does), the default `npm ci`
/// installs the lockfile's devDependency through the proxy, the tests import it offline, and
/// the second run downloads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_installs_with_npm_ci_from_a_loopback_registry_once() {
    use crate::support::upstream::npm_registry;
    let (name, version, value) = ("agentbox-fixture-pkg", "1.0.0", "from the loopback registry");
    let registry = Upstream::http_on_its_port(|port| npm_registry(port, name, version, value).0).await;
    let port = registry.addr.port();
    let (_, integrity) = npm_registry(port, name, version, value);
    let lock = json!({
        "name": "uses-fixture", "version": "1.0.0", "lockfileVersion": 3, "requires": true,
        "packages": {
            "": {"name": "uses-fixture", "version": "1.0.0", "devDependencies": {name: version}},
            format!("node_modules/{name}"): {
                "version": version,
                "resolved": format!("http://127.0.0.1:{port}/{name}/-/{name}-{version}.tgz"),
                "integrity": integrity,
                "dev": true
            }
        }
    });
    let package = json!({
        "name": "uses-fixture", "version": "1.0.0",
        "scripts": {"test": "node --test"},
        "devDependencies": {name: version}
    });
    let project = Project::new(&[
        ("package.json", package.to_string().as_str()),
        ("package-lock.json", lock.to_string().as_str()),
        (".npmrc", format!("registry=http://127.0.0.1:{port}/\n").as_str()),
        (
            "test/fixture.test.js",
            "const test = require('node:test');\nconst assert = require('node:assert');\n\
             test('value', () => {\n  assert.strictEqual(require('agentbox-fixture-pkg').value, 'from the loopback registry');\n});\n",
        ),
    ]);
    let allow = format!("127.0.0.1:{port}");
    let args = ["--allow-host", allow.as_str(), "--command-timeout", "300"];
    let cold = hostile(&project, json!([done("Nothing to change.")]), &args).await;
    assert_eq!(cold.code, Some(0), "{}\n{}", cold.stdout, cold.stderr);
    assert!(
        notes(&cold).iter().any(|n| n == "setup: running `npm ci`"),
        "{:?}",
        notes(&cold)
    );
    let report = cold.report.as_ref().unwrap();
    assert_eq!(report["tests"]["passed"], json!(true), "{}", cold.stdout);
    let egress = report["egress"].as_array().unwrap();
    assert!(
        egress
            .iter()
            .any(|d| d["allowed"] == json!(true) && d["port"] == json!(port)),
        "npm went through the proxy: {egress:?}"
    );
    let requests = registry.count();
    assert!(requests >= 1, "the tarball: {:?}", registry.paths.lock().unwrap());
    let warm = hostile(&project, json!([done("Nothing to change.")]), &args).await;
    assert_from_the_cache(&warm);
    assert_eq!(registry.count(), requests, "the second run downloaded nothing");
    remove_caches(&project).await;
}

/// Go's setup path: `go mod download` from a `GOPROXY` of static files the test makes (in a
/// directory of the project, as `file://`: Go never sends a loopback address through a proxy,
/// so a proxy the test served on 127.0.0.1 could not be reached from the setup container),
/// verified against the project's `go.sum`; the tests build offline from the cache's module
/// cache, and the second run is served from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_downloads_modules_into_the_cache_once() {
    use crate::support::upstream::{Body, go_proxy};
    let module = "agentbox.test/fixture";
    let (routes, sum) = go_proxy(
        module,
        "v1.0.0",
        &[(
            "fixture.go",
            "package fixture\n\nconst Value = \"from the module proxy\"\n",
        )],
    );
    let project = Project::new(&[
        (
            "go.mod",
            format!("module uses/fixture\n\ngo 1.21\n\nrequire {module} v1.0.0\n").as_str(),
        ),
        ("go.sum", sum.as_str()),
        (
            "fixture_test.go",
            format!(
                "package main\n\nimport (\n\t\"testing\"\n\n\t\"{module}\"\n)\n\n\
                 func TestValue(t *testing.T) {{\n\tif fixture.Value != \"from the module proxy\" {{\n\t\tt.Fatal(fixture.Value)\n\t}}\n}}\n"
            )
            .as_str(),
        ),
        ("main.go", "package main\n\nfunc main() {}\n"),
    ]);
    for (path, body) in routes {
        let Body::Bytes(data) = body else { unreachable!() };
        let file = project.file(&format!("goproxy{path}"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, data).unwrap();
    }
    project.chown_all();
    let args = [
        "--setup",
        "GOPROXY=file:///workspace/goproxy GOSUMDB=off go mod download",
        "--no-default-registries",
        "--command-timeout",
        "600",
    ];
    let cold = hostile(&project, json!([done("Nothing to change.")]), &args).await;
    assert_eq!(cold.code, Some(0), "{}\n{}", cold.stdout, cold.stderr);
    let report = cold.report.as_ref().unwrap();
    assert_eq!(report["tests"]["passed"], json!(true), "{}", cold.stdout);
    assert!(
        notes(&cold)
            .iter()
            .any(|n| n.starts_with("setup: running `GOPROXY=file://")),
        "{:?}",
        notes(&cold)
    );
    let warm = hostile(&project, json!([done("Nothing to change.")]), &args).await;
    assert_from_the_cache(&warm);
    assert_eq!(
        warm.report.as_ref().unwrap()["tests"]["passed"],
        json!(true),
        "offline, from the cache's module cache: {}",
        warm.stdout
    );
    remove_caches(&project).await;
}

/// `exec` and `shell` open the environment `run` gives the agent: the same setup phase (its
/// flags with the same meaning), the same cache read-only, the same offline agent phase. The
/// second `exec` is served from the cache `run` would use; `--no-setup` leaves it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_shell_get_the_setup_and_cache_run_gets() {
    let (file, data) = wheel("agentbox_fixture_pkg", "1.0", "from the local index");
    let index = Upstream::http(simple_index("agentbox-fixture-pkg", &file, data)).await;
    let port = index.addr.port();
    let project = python_project();
    let path = project.path().to_str().unwrap().to_string();
    let setup = format!("pip install --index-url http://127.0.0.1:{port}/simple/ -r requirements.txt");
    let allow = format!("127.0.0.1:{port}");
    let probe = "python3 -c 'import agentbox_fixture_pkg as p; print(p.VALUE)'";
    let exec = || {
        let mut cmd = agentbox();
        cmd.arg("exec")
            .args(["--setup", setup.as_str(), "--allow-host", allow.as_str()])
            .arg(&path)
            .args(["--", "sh", "-c", probe]);
        run(&mut cmd)
    };
    let cold = exec();
    let err = text(&cold.stderr);
    assert!(cold.status.success(), "{err}");
    assert_eq!(text(&cold.stdout), "from the local index\n", "{err}");
    assert!(err.contains("agentbox: setup: running `pip install"), "{err}");
    let requests = index.count();
    assert!(requests >= 2, "{:?}", index.paths.lock().unwrap());

    let warm = exec();
    let err = text(&warm.stderr);
    assert_eq!(text(&warm.stdout), "from the local index\n", "{err}");
    assert!(err.contains("dependencies from the cache"), "{err}");
    assert_eq!(index.count(), requests, "the second exec asked the index nothing");

    let bare = run(agentbox()
        .args(["exec", "--no-setup"])
        .arg(&path)
        .args(["--", "sh", "-c", probe]));
    assert!(
        text(&bare.stderr).contains("ModuleNotFoundError"),
        "{}",
        text(&bare.stderr)
    );

    // A shell on a terminal: the same cache, without a download.
    let mut pty = crate::support::pty::Pty::spawn(&[
        "shell",
        "--setup",
        setup.as_str(),
        "--allow-host",
        allow.as_str(),
        &path,
        "--",
        "sh",
        "-c",
        probe,
    ]);
    assert_eq!(pty.wait_exit(), 0, "{}", pty.screen());
    assert!(pty.screen().contains("from the local index"), "{}", pty.screen());
    assert!(
        pty.screen().contains("dependencies from the cache"),
        "{}",
        pty.screen()
    );
    assert_eq!(index.count(), requests);
    remove_caches(&project).await;
}

/// Go: setup pre-builds the standard library and the module into the build cache (a module
/// with no requirement too: the standard library is most of a cold `go test`), each session
/// starts from a copy of it, and agentbox's own test run never shows a cached result, even one
/// the agent's own `go test` just left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_tests_build_on_setups_cache_and_the_verdict_is_never_a_cached_result() {
    let project = Project::new(&[
        ("go.mod", "module example.com/calc\n\ngo 1.21\n"),
        (
            "calc.go",
            "package calc\n\nimport \"encoding/json\"\n\nfunc Add(a, b int) int { _, _ = json.Marshal(a); return a + b }\n",
        ),
        (
            "calc_test.go",
            "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 2) != 4 {\n\t\tt.Fatal(Add(2, 2))\n\t}\n}\n",
        ),
    ]);
    let twice = "go test ./... && go test ./...";
    let run = hostile(
        &project,
        json!([{"tool_calls": [bash(twice)]}, done("Nothing to change.")]),
        &["--command-timeout", "600"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        notes(&run)
            .iter()
            .any(|n| n.starts_with("setup: the Go pre-build done in")),
        "{:?}",
        notes(&run)
    );
    let (_, agent, _) = run.result(0);
    assert!(agent.contains("(cached)"), "the agent's second run is: {agent}");
    let tests = &run.report.as_ref().unwrap()["tests"];
    assert_eq!(tests["passed"], json!(true), "{tests}");
    let tail = tests["commands"][0]["output_tail"].as_str().unwrap();
    assert!(tail.contains("ok") && !tail.contains("(cached)"), "{tail}");
    let warm = hostile(
        &project,
        json!([done("Nothing to change.")]),
        &["--command-timeout", "600"],
    )
    .await;
    assert_from_the_cache(&warm);
    remove_caches(&project).await;
}

/// Two cold runs of one project at once (parallel environments, say) fill its cache once: the
/// second waits for the first's fill, then uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cold_runs_at_once_fill_one_cache_once() {
    let project = Project::new(&[("app.py", "x = 1\n")]);
    // Both runs are one user's: one data directory, where the cache's lock lives.
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap().to_string();
    let env = [("AGENTBOX_DATA_DIR", data_dir.as_str())];
    let args = [
        "--isolate",
        "--setup",
        "sleep 3 && echo filled >> /opt/agentbox-deps/fills",
    ];
    let turns = json!([{"tool_calls": [bash("cat /opt/agentbox-deps/fills")]}, done("Checked.")]);
    let (a, b) = tokio::join!(
        finish(spawn_run(&project, turns.clone(), &args, &env)),
        finish(spawn_run(&project, turns.clone(), &args, &env)),
    );
    for run in [&a, &b] {
        assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
        let (_, out, _) = run.result(0);
        let fills = out.lines().filter(|l| *l == "filled").count();
        assert_eq!(fills, 1, "one fill, not two: {out}\n{}", run.stderr);
    }
    assert!(
        [&a, &b]
            .iter()
            .any(|r| r.stderr.contains("is filling the cache") && r.stderr.contains("waiting for it")),
        "neither run waited:\n{}\n{}",
        a.stderr,
        b.stderr
    );
    remove_caches(&project).await;
}
