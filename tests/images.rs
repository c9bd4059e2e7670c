//! agentbox's images against the real daemon: each has its toolchain and the common tools, and
//! the sandbox user exists in every one while the root stays read-only.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is the failure report

mod support;

use std::time::Duration;

use agentbox::image::{KNOWN, image_labels};
use agentbox::sandbox::{DockerSandbox, ExecRequest, Sandbox};
use bollard::Docker;
use support::*;

async fn sandbox_of(project: &Project, image: &str) -> (Docker, DockerSandbox) {
    let docker = docker().await;
    assert!(
        agentbox::image::image_exists(&docker, image).await.unwrap(),
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
async fn every_image_has_its_toolchain_and_its_user() {
    for known in KNOWN {
        let project = Project::new(&[("hello.txt", "hi\n")]);
        let (docker, sb) = sandbox_of(&project, known.tag).await;
        let (uid, _) = project.owner();

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

        sb.shutdown().await.unwrap();

        // The build recorded the toolchain versions as labels.
        let labels = image_labels(&docker, known.tag).await.unwrap().unwrap();
        assert_eq!(labels["org.agentbox.image"], known.name);
        assert_eq!(labels["org.agentbox.image.suite"], agentbox::image::DEBIAN_SUITE);
        let tools = agentbox::toolchain::image_toolchains(&labels);
        assert!(
            tools
                .iter()
                .any(|(t, _)| *t == agentbox::toolchain::Toolchain::Python),
            "{labels:?}"
        );
    }
}
