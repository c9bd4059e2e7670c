//! agentbox's images against the real daemon: each sandbox image has its toolchain and the
//! common tools, the sandbox user exists in every one while the root stays read-only, toolchain
//! caches are on the session's volume (not HOME's tmpfs) and go with the sandbox, and a cold
//! `cargo test` fits in the rust image's default timeout. Each service image's server starts
//! from the catalogue's command with a read-only root, as its own user, with no capability,
//! and answers its probe and a client.
#![allow(
    clippy::disallowed_macros,
    reason = "a test's own report (how long a service took), not agentbox's output"
)]

use std::collections::HashMap;
use std::time::Duration;

use crate::support::*;
use agentbox::sandbox::image::{KnownImage, ServiceDef, image_labels};
use agentbox::sandbox::{DockerSandbox, ExecRequest, Sandbox};
use bollard::Docker;

async fn sandbox_of(project: &Project, image: &str) -> (Docker, DockerSandbox) {
    let docker = docker().await;
    assert!(
        agentbox::sandbox::image::image_exists(&docker, image)
            .await
            .unwrap(),
        "these tests need {image}: run `just image` (or `agentbox image build --all --offline`)"
    );
    let mut cfg = config();
    cfg.image = image.to_string();
    let sb = DockerSandbox::create(&docker, cfg.bind_spec(project.path()).unwrap())
        .await
        .expect("sandbox");
    (docker, sb)
}

async fn run(sb: &DockerSandbox, script: &str) -> (bool, String) {
    let out = sb
        .exec(ExecRequest::shell(script, Duration::from_secs(120)))
        .await
        .expect("exec");
    let text = format!("{}{}", out.stdout.to_text(), out.stderr.to_text());
    (out.success(), text)
}

/// Volumes labelled with this session.
async fn volumes_of_session(docker: &Docker, session: &str) -> usize {
    use bollard::query_parameters::ListVolumesOptionsBuilder;
    let filters = HashMap::from([("label".to_string(), vec![format!("agentbox.session={session}")])]);
    docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .unwrap()
        .volumes
        .unwrap_or_default()
        .len()
}

/// Containers labelled with this session.
async fn containers_of_session(docker: &Docker, session: &str) -> usize {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let filters = HashMap::from([("label".to_string(), vec![format!("agentbox.session={session}")])]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
        .len()
}

/// What each image must run, besides the common tools.
fn toolchain_checks(name: &str) -> &'static [&'static str] {
    match name {
        "python" => &[
            "python3 -m pytest --version",
            "python3 -m pip --version",
            "python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'import sys; print(sys.prefix)'",
        ],
        "node" => &["node --version", "npm --version"],
        "rust" => &["cargo --version", "rustc --version"],
        "go" => &["go version"],
        _ => &[
            "python3 -m pytest --version",
            "python3 -m pip --version",
            "python3 -m venv /tmp/venv",
            "node --version",
            "npm --version",
            "cargo --version",
            "go version",
        ],
    }
}

#[tokio::test]
async fn every_image_has_its_toolchain_its_user_and_caches_on_disk() {
    for known in KnownImage::sandboxes() {
        let project = Project::new(&[("hello.txt", "hi\n")]);
        let (docker, sb) = sandbox_of(&project, known.tag).await;
        let (uid, _) = project.owner();
        let session = sb.info().session.clone();

        // The common tools.
        for check in [
            "git --version",
            "rg --version",
            "make --version",
            "cc --version",
            "ps -p 1",
            "test -s /etc/ssl/certs/ca-certificates.crt",
        ] {
            let (ok, out) = run(&sb, check).await;
            assert!(ok, "{}: `{check}` failed: {out}", known.name);
        }
        for check in toolchain_checks(known.name) {
            let (ok, out) = run(&sb, check).await;
            assert!(ok, "{}: `{check}` failed: {out}", known.name);
        }

        // The sandbox user has a name and a home, in Python's eyes too; the root stays
        // read-only, /etc/passwd included.
        let (ok, out) = run(
            &sb,
            "id -un && python3 -c 'import getpass, os, pwd; print(getpass.getuser()); print(pwd.getpwuid(os.getuid()).pw_dir)'",
        )
        .await;
        assert!(ok, "{}: {out}", known.name);
        let lines: Vec<&str> = out.lines().collect();
        let expected = if uid == 0 { "root" } else { "agentbox" };
        assert_eq!(lines[0], expected, "{}: id -un", known.name);
        assert_eq!(lines[1], expected, "{}: getpass.getuser()", known.name);
        if uid != 0 {
            assert_eq!(lines[2], agentbox::sandbox::HOME, "{}", known.name);
        }
        let (ok, out) = run(&sb, "echo x > /etc/agentbox-probe").await;
        assert!(
            !ok && out.contains("Read-only file system"),
            "{}: {out}",
            known.name
        );
        for target in ["/etc/passwd", "/etc/group"] {
            let (ok, out) = run(&sb, &format!("echo x >> {target}")).await;
            assert!(!ok, "{}: writing {target} worked: {out}", known.name);
            // Mounted read-only, whoever owns the file.
            let (ok, out) = run(&sb, &format!("grep ' {target} ' /proc/self/mountinfo")).await;
            assert!(ok, "{}: {target} is not mounted", known.name);
            let options = out.split(' ').nth(5).unwrap_or("");
            assert!(
                options.split(',').any(|o| o == "ro"),
                "{}: {target}: {out}",
                known.name
            );
        }

        // Caches and build output: on the session's volume, not on HOME's tmpfs (nor /tmp).
        let (ok, out) = run(
            &sb,
            "for d in \"$CARGO_HOME\" \"$CARGO_TARGET_DIR\" \"$GOCACHE\" \"$GOPATH\" \"$npm_config_cache\" \"$PIP_CACHE_DIR\" \"$XDG_CACHE_HOME\"; do mkdir -p \"$d\" && echo \"$d $(stat -f -c %T \"$d\")\"; done; echo \"HOME $(stat -f -c %T \"$HOME\")\"",
        )
        .await;
        assert!(ok, "{}: {out}", known.name);
        let mut saw = 0;
        for line in out.lines() {
            let (dir, fs) = line.rsplit_once(' ').unwrap();
            if dir == "HOME" {
                assert_eq!(fs, "tmpfs", "HOME is the tmpfs the caches avoid");
            } else {
                saw += 1;
                assert_ne!(fs, "tmpfs", "{}: {dir} is in memory", known.name);
                assert!(dir.starts_with(agentbox::sandbox::CACHE_DIR), "{dir}");
            }
        }
        assert_eq!(saw, 7, "{out}");
        assert_eq!(
            volumes_of_session(&docker, &session).await,
            1,
            "the cache volume is the session's"
        );

        sb.shutdown().await.unwrap();
        assert!(
            eventually(Duration::from_secs(10), || async {
                volumes_of_session(&docker, &session).await == 0
            })
            .await,
            "{}: the cache volume outlived the sandbox",
            known.name
        );
        // Nor any container of the session (the sandbox, the one /etc/passwd was read from).
        assert_eq!(
            containers_of_session(&docker, &session).await,
            0,
            "{}",
            known.name
        );

        // The build recorded the toolchain versions as labels.
        let labels = image_labels(&docker, known.tag).await.unwrap().unwrap();
        assert_eq!(labels["org.agentbox.image"], known.name);
        assert_eq!(
            labels["org.agentbox.image.suite"],
            agentbox::sandbox::image::DEBIAN_SUITE
        );
        let tools = agentbox::toolchain::image_toolchains(&labels);
        assert!(
            tools
                .iter()
                .any(|(t, _)| *t == agentbox::toolchain::Toolchain::Python),
            "{labels:?}"
        );
    }
}

#[tokio::test]
async fn a_cold_cargo_test_passes_within_the_default_timeout() {
    let rust = KnownImage::by_name("rust").unwrap();
    let project = Project::new(&[
        (
            "Cargo.toml",
            "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        ),
        (
            "src/lib.rs",
            "pub fn add(a: i32, b: i32) -> i32 { a + b }\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n        assert_eq!(super::add(2, 2), 4);\n    }\n}\n",
        ),
    ]);
    let (_docker, sb) = sandbox_of(&project, rust.tag).await;
    // No --command-timeout: the rust image's own default.
    let timeout = config().command_timeout_for(rust.tag);
    let mut cfg = config();
    cfg.command_timeout_given = false;
    let timeout_default = cfg.command_timeout_for(rust.tag);
    assert!(
        timeout_default > timeout,
        "the rust image allows more than the 60s the tests give"
    );
    let out = sb
        .exec(ExecRequest::shell("cargo test 2>&1", timeout_default))
        .await
        .unwrap();
    let text = out.stdout.to_text();
    assert!(out.success(), "{}: {text}", out.status_line());
    assert!(text.contains("test result: ok. 1 passed"), "{text}");
    // The build output went to the cache volume, not into the project.
    assert!(!project.file("target").exists());
    sb.shutdown().await.unwrap();
}

#[test]
fn a_project_asking_for_a_newer_toolchain_is_warned() {
    let project = Project::new(&[
        (
            "Cargo.toml",
            "[package]\nname = \"x\"\nversion = \"0.1.0\"\nrust-version = \"1.99\"\n",
        ),
        ("go.mod", "module example.com/x\n\ngo 1.99\n"),
    ]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_CONFIG", "")
        .args(["exec", "--image", "agentbox/polyglot:2"])
        .arg(project.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("Cargo.toml (rust-version) asks for Rust 1.99 or newer, but the image agentbox/polyglot:2 has Rust 1."),
        "{err}"
    );
    assert!(
        err.contains("go.mod (go directive) asks for Go 1.99 or newer"),
        "{err}"
    );
    assert_eq!(err.matches("WARNING").count(), 2, "{err}");

    // What the image has is enough: no warning.
    std::fs::write(project.file("go.mod"), "module example.com/x\n\ngo 1.21\n").unwrap();
    std::fs::remove_file(project.file("Cargo.toml")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_CONFIG", "")
        .args(["exec", "--image", "agentbox/polyglot:2"])
        .arg(project.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!text(&out.stderr).contains("WARNING"), "{}", text(&out.stderr));
}

/// `argv` run in the container as `user`: its exit code and output.
async fn exec_as(docker: &Docker, id: &str, user: &str, argv: &[&str]) -> (i64, String) {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(argv.to_vec()),
                user: Some(user),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut text = String::new();
    if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await.unwrap() {
        while let Some(Ok(chunk)) = output.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .unwrap()
        .exit_code
        .unwrap_or(-1);
    (code, text)
}

/// A client using the service over TCP, as a project's tests in the sandbox would (the
/// administrator without a password), and what it must print.
fn client_check(name: &str) -> (&'static [&'static str], &'static str) {
    match name {
        "postgres" => (
            &[
                "psql",
                "-h",
                "127.0.0.1",
                "-p",
                "5432",
                "-U",
                "postgres",
                "-Atc",
                "create table t (x int); insert into t values (42); select x from t",
            ],
            "42",
        ),
        "redis" => (
            &[
                "sh",
                "-c",
                "redis-cli -h 127.0.0.1 -p 6379 set k 42 && redis-cli -h 127.0.0.1 -p 6379 get k",
            ],
            "42",
        ),
        "mariadb" => (
            &[
                "mariadb",
                "--host=127.0.0.1",
                "--port=3306",
                "--user=root",
                "-N",
                "-e",
                "create database app; create table app.t (x int); insert into app.t values (42); select x from app.t",
            ],
            "42",
        ),
        other => panic!("no client check for the service {other}"),
    }
}

/// One service container as the runtime runs it: the catalogue's command, read-only root, its
/// package's user, no capability, no new privileges, no network but the loopback, and an empty
/// tmpfs at its data directory (mode 1777: the user's uid is the image's own) as the only
/// writable place.
async fn start_service(docker: &Docker, known: &KnownImage, service: &ServiceDef, session: &str) -> String {
    use bollard::models::{ContainerCreateBody, HostConfig};
    use bollard::query_parameters::{CreateContainerOptionsBuilder, StartContainerOptions};
    let body = ContainerCreateBody {
        image: Some(known.tag.into()),
        cmd: Some(service.start.iter().map(|s| s.to_string()).collect()),
        user: Some(service.user.into()),
        labels: Some(HashMap::from([
            ("agentbox.session".to_string(), session.to_string()),
            ("agentbox.pid".to_string(), std::process::id().to_string()),
        ])),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            tmpfs: Some(HashMap::from([(
                service.data_dir.to_string(),
                "rw,nosuid,nodev,mode=1777,size=256m".to_string(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::default().name(session).build()),
            body,
        )
        .await
        .unwrap();
    docker
        .start_container(&created.id, None::<StartContainerOptions>)
        .await
        .unwrap();
    created.id
}

#[tokio::test]
async fn every_service_image_runs_locked_down_as_its_user_and_answers() {
    let docker = docker().await;
    for known in KnownImage::services() {
        let service = known.service().unwrap();
        assert!(
            agentbox::sandbox::image::image_exists(&docker, known.tag)
                .await
                .unwrap(),
            "this test needs {}: run `just image` (or `agentbox image build --all --offline`)",
            known.tag
        );
        let session = format!("agentbox-svc-image-test-{}-{}", known.name, std::process::id());
        let id = start_service(&docker, known, service, &session).await;
        let checked = async {
            let started = std::time::Instant::now();
            loop {
                let (code, out) = exec_as(&docker, &id, service.user, service.probe).await;
                if code == 0 {
                    break;
                }
                let running = docker
                    .inspect_container(&id, None)
                    .await
                    .ok()
                    .and_then(|c| c.state)
                    .and_then(|s| s.running)
                    .unwrap_or(false);
                if !running || started.elapsed() > Duration::from_secs(60) {
                    return Err(format!("not ready (running: {running}); the probe said: {out}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Speed is the benches' business; this is for the reader of a slow run.
            println!("{}: ready in {:.2}s", known.name, started.elapsed().as_secs_f64());
            let (code, out) = exec_as(&docker, &id, service.user, &["id", "-un"]).await;
            if code != 0 || out.trim() != service.user {
                return Err(format!("the user: {out}"));
            }
            // The server is the first process (the start script execs it), as the user, with
            // no capability.
            let (_, status) = exec_as(&docker, &id, service.user, &["cat", "/proc/1/status"]).await;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or("")
                    .to_string()
            };
            if field("CapEff:") != "0000000000000000" || field("Name:") == "sh" {
                return Err(format!("the server's process: {status}"));
            }
            let (client, expected) = client_check(known.name);
            let (code, out) = exec_as(&docker, &id, service.user, client).await;
            if code != 0 || out.lines().last().map(str::trim) != Some(expected) {
                return Err(format!("the client ({code}): {out}"));
            }
            // Nothing but the tmpfs is writable.
            let (code, out) = exec_as(&docker, &id, service.user, &["sh", "-c", "echo x > /tmp/probe"]).await;
            if code == 0 || !out.contains("Read-only file system") {
                return Err(format!("/tmp was writable ({code}): {out}"));
            }
            Ok(())
        }
        .await;
        let logs = if checked.is_err() {
            logs_of(&docker, &id).await
        } else {
            String::new()
        };
        agentbox::sandbox::remove_container(&docker, &id).await;
        assert_eq!(containers_of_session(&docker, &session).await, 0, "{session}");
        if let Err(e) = checked {
            panic!("{}: {e}\n{logs}", known.name);
        }
    }
}

async fn logs_of(docker: &Docker, id: &str) -> String {
    use bollard::query_parameters::LogsOptionsBuilder;
    use futures_util::StreamExt;
    let mut logs = docker.logs(
        id,
        Some(
            LogsOptionsBuilder::default()
                .stdout(true)
                .stderr(true)
                .tail("40")
                .build(),
        ),
    );
    let mut text = String::new();
    while let Some(Ok(chunk)) = logs.next().await {
        text.push_str(&chunk.to_string());
    }
    text
}
