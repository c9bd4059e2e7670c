//! Remote engines: a second Docker daemon (scripts/ci-second-dockerd) that listens with mutual
//! TLS on 127.0.0.1. `run` against it copies the project in (it cannot bind-mount), says so,
//! and the fix comes back as a patch that applies; wrong or missing TLS material is named.
//!
//! The daemon's endpoints come from the environment the script prints; without them these tests
//! skip (loudly), unless AGENTBOX_REQUIRE_ENGINES=1, when they fail.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::support::*;
use agentbox::sandbox::engine::Engine;
use serde_json::{Value, json};

/// The second daemon, as scripts/ci-second-dockerd describes it.
struct Second {
    tls_host: String,
    certs: PathBuf,
}

fn second() -> Option<Second> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (var("AGENTBOX_TEST_TLS_HOST"), var("AGENTBOX_TEST_TLS_CERTS")) {
        (Some(tls_host), Some(certs)) => Some(Second {
            tls_host,
            certs: PathBuf::from(certs),
        }),
        _ => {
            let msg = "AGENTBOX_TEST_TLS_HOST / AGENTBOX_TEST_TLS_CERTS are not set: start the second \
                       daemon with `eval $(scripts/ci-second-dockerd)` and export them";
            if std::env::var("AGENTBOX_REQUIRE_ENGINES").as_deref() == Ok("1") {
                panic!("{msg}");
            }
            eprintln!("\n!!! SKIPPED: {msg}\n");
            None
        }
    }
}

fn fixture() -> Project {
    let p = Project::new(&[
        ("app.py", "def answer():\n    return 41\n"),
        (
            "test_app.py",
            "from app import answer\n\ndef test_answer():\n    assert answer() == 42\n",
        ),
    ]);
    p.git_init();
    p
}

fn fix_script(dir: &Path) -> PathBuf {
    let turns = json!({"turns": [
        {"tool_calls": [
            {"name": "edit_file", "arguments": {"path": "app.py", "old": "return 41", "new": "return 42"}}
        ]},
        {"text": "done"}
    ]});
    let path = dir.join("script.json");
    std::fs::write(&path, turns.to_string()).unwrap();
    path
}

/// agentbox with `DOCKER_HOST` and the TLS variables set as the docker CLI reads them.
fn on_engine(host: &str, certs: Option<&Path>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", test_data_dir())
        .env("DOCKER_HOST", host)
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("DOCKER_CERT_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = certs {
        cmd.env("DOCKER_TLS_VERIFY", "1").env("DOCKER_CERT_PATH", dir);
    }
    cmd
}

async fn output(mut cmd: tokio::process::Command) -> (Option<i32>, String, String, u32) {
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let out = child.wait_with_output().await.unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr), pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_a_tls_engine_copies_the_project_in_and_the_fix_applies() {
    let Some(second) = second() else { return };
    let project = fixture();
    let work = tempfile::tempdir().unwrap();
    let script = fix_script(work.path());
    let mut cmd = on_engine(&second.tls_host, Some(&second.certs));
    // No --isolate: the remote engine implies it, and --apply goes with it.
    cmd.args(["run", "--json", "--apply", "--script"])
        .arg(&script)
        .arg(project.path())
        .current_dir(work.path());
    let (code, stdout, stderr, pid) = output(cmd).await;
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("is a remote engine"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line says the project is copied in:\n{stderr}"
    );
    assert!(
        lines[0].contains(&second.tls_host) && lines[0].contains("copied in"),
        "{}",
        lines[0]
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["tests"]["passed"], json!(true), "{report:#}");
    // The patch came out, and --apply put it into the project.
    let patch = work.path().join(report["patch_file"].as_str().unwrap());
    let diff = std::fs::read_to_string(&patch).unwrap();
    assert!(diff.contains("+    return 42"), "{diff}");
    assert_eq!(project.read("app.py"), "def answer():\n    return 42\n");
    // The same patch applies to a pristine copy with git.
    let pristine = fixture();
    let applied = std::process::Command::new("git")
        .args(["apply", "--whitespace=nowarn"])
        .arg(&patch)
        .current_dir(pristine.path())
        .output()
        .unwrap();
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    assert_eq!(pristine.read("app.py"), project.read("app.py"));
    // Everything was made, and removed, on the TLS engine.
    let engine = Engine {
        host: second.tls_host.clone(),
        tls: Some(second.certs.clone()),
    };
    let docker = engine.connect().await.unwrap();
    assert_eq!(containers_of_pid(&docker, pid).await, 0, "no container left");
    assert_eq!(volumes_of_pid(&docker, pid).await, 0, "no volume left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_a_tls_engine_runs_as_the_owner_with_a_name() {
    let Some(second) = second() else { return };
    let project = fixture();
    let work = tempfile::tempdir().unwrap();
    let mut cmd = on_engine(&second.tls_host, Some(&second.certs));
    cmd.args(["exec"])
        .arg(project.path())
        .args([
            "--",
            "sh",
            "-c",
            "id -u; id -un; cat app.py; touch /workspace/made-here",
        ])
        .current_dir(work.path());
    let (code, stdout, stderr, _) = output(cmd).await;
    assert_eq!(code, Some(0), "{stderr}");
    let (uid, _) = project.owner();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(uid.to_string().as_str()), "{stdout}");
    // The sandbox user has a passwd entry although /etc/passwd could not be bind-mounted.
    assert!(
        lines
            .next()
            .is_some_and(|n| !n.is_empty() && n != uid.to_string()),
        "{stdout}"
    );
    assert!(
        stdout.contains("return 41"),
        "the copy holds the project: {stdout}"
    );
    assert!(
        !project.file("made-here").exists(),
        "the project is a copy on a remote engine"
    );
    assert!(stderr.contains("1 file changed in the copy; patch:"), "{stderr}");
    let patches = || {
        std::fs::read_dir(work.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".patch")
            })
            .count()
    };
    assert_eq!(patches(), 1, "the patch is in the current directory");
    // A command that changes nothing leaves no (empty) patch behind.
    let mut cmd = on_engine(&second.tls_host, Some(&second.certs));
    cmd.args(["exec"])
        .arg(project.path())
        .args(["--", "true"])
        .current_dir(work.path());
    let (code, _, stderr, _) = output(cmd).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(patches(), 1, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_policy_on_a_tls_engine() {
    let Some(second) = second() else { return };
    let mut cmd = on_engine(&second.tls_host, Some(&second.certs));
    cmd.args(["doctor", "--no-network"]);
    let (code, stdout, stderr, _) = output(cmd).await;
    let all = format!("{stdout}{stderr}");
    assert_eq!(code, Some(0), "{all}");
    assert!(all.contains(&format!("at {} (TLS)", second.tls_host)), "{all}");
    assert!(all.contains("[ok  ] sandbox: ready"), "{all}");
    assert!(all.contains("[ok  ] network: interfaces: lo"), "{all}");
    assert!(all.contains("a copy (remote engine)"), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_tls_material_is_named() {
    let Some(second) = second() else { return };
    let project = fixture();
    let exec = |certs: Option<&Path>| {
        let mut cmd = on_engine(&second.tls_host, certs);
        cmd.args(["exec"]).arg(project.path()).args(["--", "true"]);
        cmd
    };

    // A directory without the files.
    let empty = tempfile::tempdir().unwrap();
    let (code, _, stderr, _) = output(exec(Some(empty.path()))).await;
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains("ca.pem") && stderr.contains("cannot read"),
        "{stderr}"
    );

    // A client certificate from another CA, and that CA: the engine is not trusted, nor is
    // this client.
    let other = tempfile::tempdir().unwrap();
    other_ca_material(other.path());
    let (code, _, stderr, _) = output(exec(Some(other.path()))).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("TLS handshake failed"), "{stderr}");

    // The right CA but a client certificate the engine did not sign: refused by the engine.
    let mixed = tempfile::tempdir().unwrap();
    other_ca_material(mixed.path());
    std::fs::copy(second.certs.join("ca.pem"), mixed.path().join("ca.pem")).unwrap();
    let (code, _, stderr, _) = output(exec(Some(mixed.path()))).await;
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains("TLS handshake failed") && stderr.contains("BadCertificate"),
        "{stderr}"
    );

    // No TLS at all against a TLS engine.
    let (code, _, stderr, _) = output(exec(None)).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("DOCKER_TLS_VERIFY"), "{stderr}");

    // ssh:// is not supported, and says what to do instead.
    let (code, _, stderr, _) = output({
        let mut cmd = on_engine("ssh://someone@127.0.0.1", None);
        cmd.args(["exec"]).arg(project.path()).args(["--", "true"]);
        cmd
    })
    .await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("ssh:// engines are not supported"), "{stderr}");
}

/// ca.pem, cert.pem and key.pem of a CA made here (trusted by nobody).
fn other_ca_material(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "not the engine's CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
}

/// `scripts/ci-second-dockerd ARGS`, its printed variables.
fn second_dockerd(args: &[&str]) -> std::collections::HashMap<String, String> {
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ci-second-dockerd"))
        .args(args)
        // Without the image: the eval copies it in from the local engine.
        .env("AGENTBOX_SECOND_LOAD", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// An eval over the main engine and a third daemon the test starts, with the third killed
/// while it runs tasks: every task has exactly one result, those it was running are run again
/// on the main engine and say so, and the summary gives each engine's throughput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_over_two_engines_survives_one_dying() {
    if !is_root() {
        let msg = "starting a Docker daemon needs root";
        if std::env::var("AGENTBOX_REQUIRE_ENGINES").as_deref() == Ok("1") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPED: {msg}\n");
        return;
    }
    let main = docker().await;
    // The local engine, as this process reaches it (DOCKER_HOST, else the default socket).
    let main_name = Engine::from_env().host;
    let third_env = second_dockerd(&["start", "third"]);
    let third_host = third_env["AGENTBOX_TEST_SECOND_HOST"].clone();
    let pidfile = third_env["AGENTBOX_TEST_SECOND_PIDFILE"].clone();
    let third = Engine::plain(&third_host).connect().await.unwrap();
    let image = agentbox::sandbox::image::DEFAULT_IMAGE;
    let _ = third
        .remove_image(
            image,
            Some(
                bollard::query_parameters::RemoveImageOptionsBuilder::default()
                    .force(true)
                    .build(),
            ),
            None,
        )
        .await;

    // Tasks long enough (a 4 s command each) that the third is busy when it dies.
    let tasks = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval/fixes-it");
    let names: Vec<String> = (1..=8).map(|i| format!("t{i}")).collect();
    for name in &names {
        let dir = tasks.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in ["TASK.md", "counter.py", "test_counter.py", "script.json"] {
            let body = std::fs::read_to_string(fixture.join(f)).unwrap();
            std::fs::write(dir.join(f), body.replace("sleep 1", "sleep 4")).unwrap();
        }
    }
    let out = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", test_data_dir())
        .args(["eval", "--provider", "scripted", "--out"])
        .arg(out.path())
        .arg("--engine")
        .arg(format!("{main_name}=2"))
        .arg("--engine")
        .arg(format!("{third_host}=2"))
        .arg(tasks.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let results = out.path().join("results.jsonl");
    // The first result: both engines are busy with the next tasks by then.
    let started = std::time::Instant::now();
    while std::fs::metadata(&results).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(started.elapsed().as_secs() < 300, "no result in 5 minutes");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let dockerd: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    // SAFETY: kill(2) on the PID of the daemon this test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(dockerd, libc::SIGKILL) }, 0);
    let output = child.wait_with_output().await.unwrap();
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));

    // The third comes back (its containers were left when it died) and is cleared and stopped.
    second_dockerd(&["start", "third"]);
    let third = Engine::plain(&third_host).connect().await.unwrap();
    let mut gc = agentbox();
    gc.env("DOCKER_HOST", &third_host).arg("gc");
    let gc_out = run(&mut gc);
    let left = containers_of_pid(&third, pid).await;
    // What was left, for the failure message: its name and state as the engine tells them.
    let left_shown = if left == 0 {
        String::new()
    } else {
        let filters =
            std::collections::HashMap::from([("label".to_string(), vec![format!("agentbox.pid={pid}")])]);
        let listed = third
            .list_containers(Some(
                bollard::query_parameters::ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await;
        match listed {
            Ok(list) => list
                .iter()
                .map(|c| {
                    format!(
                        "{} {:?} {:?} created {:?}",
                        c.id.as_deref().unwrap_or("?"),
                        c.state,
                        c.status,
                        c.created
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => format!("(cannot list: {e})"),
        }
    };
    second_dockerd(&["stop", "third"]);
    assert!(gc_out.status.success(), "{}", text(&gc_out.stderr));
    assert_eq!(
        left,
        0,
        "gc clears what the dead engine kept; left: {left_shown}\ngc said: {}{}",
        text(&gc_out.stdout),
        text(&gc_out.stderr)
    );
    assert_eq!(containers_of_pid(&main, pid).await, 0);

    assert_eq!(output.status.code(), Some(0), "{stderr}\n{stdout}");
    assert!(stderr.contains("copied from the local engine"), "{stderr}");
    assert!(stderr.contains("stopped answering"), "{stderr}");
    let lines: Vec<Value> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut seen: Vec<String> = lines
        .iter()
        .map(|r| r["task"].as_str().unwrap().to_string())
        .collect();
    seen.sort();
    assert_eq!(seen, names, "every task exactly once:\n{stderr}");
    let retried: Vec<&Value> = lines.iter().filter(|r| r.get("retried_from").is_some()).collect();
    assert!(
        !retried.is_empty(),
        "a task the third was running is run again:\n{stderr}"
    );
    for r in &retried {
        assert_eq!(r["retried_from"], json!([third_host]), "{r}");
        assert_eq!(r["engine"], json!(main_name), "{r}");
    }
    for r in &lines {
        assert_eq!(r["fixed"], json!(true), "{r}");
    }
    assert!(
        stdout.contains(&format!("engine {main_name}: ")) && stdout.contains("tasks/min"),
        "{stdout}"
    );
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(summary.contains("## Engines"), "{summary}");
}

/// `--apply` and `--patch` go with `--isolate`, which only a remote engine implies.
#[test]
fn apply_without_isolate_on_a_local_engine_is_a_usage_error() {
    let project = fixture();
    let work = tempfile::tempdir().unwrap();
    let script = fix_script(work.path());
    let out = run(agentbox()
        .env("DOCKER_HOST", "unix:///var/run/docker.sock")
        .args(["run", "--apply", "--script"])
        .arg(&script)
        .arg(project.path()));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--apply and --patch go with --isolate"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(project.read("app.py"), "def answer():\n    return 41\n");
}
