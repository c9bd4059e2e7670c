//! The sandbox against the real Docker daemon: the policy as seen from inside, timeouts that
//! end whole process trees, bounded output, files through the container, and cleanup.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use crate::support::*;
use agentbox::sandbox::{ExecMode, ExecRequest, Sandbox};
use agentbox::workspace::{FsError, Workspace};

fn shell(cmd: &str) -> ExecRequest {
    ExecRequest::shell(cmd, Duration::from_secs(60))
}

async fn stdout_of(sb: &dyn Sandbox, cmd: &str) -> String {
    let out = sb.exec(shell(cmd)).await.expect("exec");
    assert!(
        out.success(),
        "{cmd}: {} {}",
        out.status_line(),
        out.stderr.to_text()
    );
    out.stdout.to_text()
}

async fn lines_of(sb: &dyn Sandbox, cmd: &str) -> Vec<String> {
    stdout_of(sb, cmd).await.lines().map(str::to_string).collect()
}

#[tokio::test]
async fn the_policy_holds_inside_the_container() {
    let project = Project::new(&[("hello.txt", "hi\n")]);
    project.git_init();
    let sb = sandbox(&project).await;
    let (uid, gid) = project.owner();
    policy_holds_inside(&sb, uid, gid).await;

    for target in ["/workspace/.git/hooks/pre-commit", "/workspace/.git/config"] {
        let out = sb.exec(shell(&format!("echo x > {target}"))).await.unwrap();
        assert_ne!(out.exit_code, 0, "writing {target} must fail");
        assert!(
            out.stderr.to_text().contains("Read-only file system"),
            "{target}: {}",
            out.stderr.to_text()
        );
    }
    assert!(!project.file(".git/hooks/pre-commit").exists());

    // Files written in the project belong to the project's owner on the host.
    stdout_of(&sb, "mkdir -p made/here && echo x > made/here/file.txt").await;
    let meta = std::fs::metadata(project.file("made/here/file.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    assert_eq!(std::fs::metadata(project.file("made")).unwrap().uid(), uid);
    sb.shutdown().await.unwrap();
}

/// The policy as seen from inside any sandbox (bind-mounted, copied in, pooled): only
/// loopback, no capability, no new privileges, the project owner's ids, a read-only root, no
/// Docker socket, no route out, HOME and /tmp in memory.
pub(crate) async fn policy_holds_inside(sb: &dyn Sandbox, uid: u32, gid: u32) {
    assert_eq!(sb.info().exec_mode, ExecMode::Persistent);

    assert_eq!(
        stdout_of(sb, "ls /sys/class/net").await.trim(),
        "lo",
        "only loopback"
    );
    let status = lines_of(sb, "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").await;
    assert!(
        status.contains(&"CapEff:\t0000000000000000".to_string()),
        "{status:?}"
    );
    assert!(status.contains(&"NoNewPrivs:\t1".to_string()), "{status:?}");

    assert_eq!(
        stdout_of(sb, "echo $(id -u):$(id -g)").await.trim(),
        format!("{uid}:{gid}")
    );

    for target in ["/evil", "/etc/evil"] {
        let out = sb.exec(shell(&format!("echo x > {target}"))).await.unwrap();
        assert_ne!(out.exit_code, 0, "writing {target} must fail");
        assert!(
            out.stderr.to_text().contains("Read-only file system"),
            "{target}: {}",
            out.stderr.to_text()
        );
    }

    let out = sb
        .exec(shell("ls -la /var/run/docker.sock /run/docker.sock"))
        .await
        .unwrap();
    assert_ne!(out.exit_code, 0, "no Docker socket inside");

    // Resolving a name and connecting both fail fast: there is no route out.
    let out = sb
        .exec(shell("getent hosts example.com; python3 -c 'import socket; socket.create_connection((\"10.0.0.1\", 80), timeout=5)'"))
        .await
        .unwrap();
    assert_ne!(out.exit_code, 0);
    assert!(
        out.stderr.to_text().contains("Network is unreachable"),
        "{}",
        out.stderr.to_text()
    );

    // HOME is a private tmpfs; /tmp is a size-limited tmpfs.
    let mounts = lines_of(sb, "grep -E ' (/tmp|/home/agentbox) ' /proc/mounts").await;
    assert!(
        mounts
            .iter()
            .any(|m| m.starts_with("tmpfs /tmp ") && m.contains("size=262144k")),
        "{mounts:?}"
    );
    assert!(
        mounts.iter().any(|m| m.starts_with("tmpfs /home/agentbox ")),
        "{mounts:?}"
    );
}

#[tokio::test]
async fn host_environment_never_reaches_the_sandbox() {
    let project = Project::new(&[]);
    let sentinel = "sentinel-7f3a9c1e55d04b2a";
    let out = run(agentbox()
        .env("AGENTBOX_TEST_SECRET", sentinel)
        .env("ANTHROPIC_API_KEY", sentinel)
        .args(["exec"])
        .arg(project.path())
        .args([
            "--",
            "sh",
            "-c",
            "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'",
        ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let inside = text(&out.stdout);
    assert!(inside.contains("HOME=/home/agentbox"), "{inside}");
    assert!(!inside.contains(sentinel), "host environment leaked: {inside}");
}

async fn timeout_ends_the_tree(per_call: bool) {
    let project = Project::new(&[]);
    let mut cfg = config();
    cfg.per_call_exec = per_call;
    let sb = sandbox_with(&project, &cfg).await;
    assert_eq!(sb.info().exec_mode == ExecMode::PerCall, per_call);
    let started = Instant::now();
    // The background sleep holds stdout open: the stream only ends if it dies too.
    let out = sb
        .exec(ExecRequest::shell(
            "sleep 1000 & sleep 1000",
            Duration::from_secs(2),
        ))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(out.timed_out, "{}", out.status_line());
    assert!(took < Duration::from_secs(20), "returned after {took:?}");
    let left = stdout_of(&sb, "ps -eo comm= | grep -c '^sleep$' || true").await;
    assert_eq!(left.trim(), "0", "sleep processes survived the timeout");
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn timeout_ends_the_command_and_its_background_children() {
    timeout_ends_the_tree(false).await;
}

#[tokio::test]
async fn timeout_ends_the_tree_with_one_exec_per_call() {
    timeout_ends_the_tree(true).await;
}

#[tokio::test]
async fn background_processes_do_not_outlive_a_command() {
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let out = sb.exec(shell("sleep 1000 & echo started")).await.unwrap();
    assert!(out.success());
    assert_eq!(out.stdout.to_text(), "started\n");
    let ps = stdout_of(&sb, "ps -eo user=,comm=").await;
    assert!(!ps.contains("sleep"), "{ps}");
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_flood_of_output_is_cut_to_the_bound() {
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let req = ExecRequest::shell(
        "head -c 200000000 /dev/zero | tr '\\0' x; echo; echo the-end",
        Duration::from_secs(120),
    )
    .capture(4096, 4096);
    let out = sb.exec(req).await.unwrap();
    assert!(out.success(), "{}", out.status_line());
    assert_eq!(out.stdout.total, 200_000_000 + 1 + 8);
    assert_eq!(out.stdout.head.len() + out.stdout.tail.len(), 8192);
    assert!(out.stdout.to_text().ends_with("x\nthe-end\n"));
    assert!(out.stdout.to_text().contains("cut"));
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn exit_codes_stdin_and_missing_programs() {
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let out = sb.exec(shell("echo out; echo err >&2; exit 3")).await.unwrap();
    assert_eq!(
        (
            out.exit_code,
            out.stdout.to_text().as_str(),
            out.stderr.to_text().as_str()
        ),
        (3, "out\n", "err\n")
    );
    let out = sb
        .exec(ExecRequest::argv(["cat"], Duration::from_secs(10)).stdin(b"piped in".to_vec()))
        .await
        .unwrap();
    assert_eq!(out.stdout.to_text(), "piped in");
    // Without stdin a reader gets EOF at once instead of waiting for the timeout.
    let out = sb
        .exec(ExecRequest::argv(["cat"], Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(out.success() && out.stdout.is_empty());
    let out = sb
        .exec(ExecRequest::argv(["no-such-program"], Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 127);
    let out = sb.exec(shell("kill -SEGV $$")).await.unwrap();
    assert_eq!((out.exit_code, out.signal), (139, Some(11)));
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn no_signal_from_inside_ends_the_session() {
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    // Every process of the sandbox user, then init itself: the executor is PID 1 and survives.
    let out = sb
        .exec(shell(
            "kill -9 -1; kill -9 1; kill -TERM 1; sleep 0.2; echo survived",
        ))
        .await
        .unwrap();
    assert_eq!(out.stdout.to_text(), "survived\n", "{}", out.stderr.to_text());
    assert_eq!(stdout_of(&sb, "echo still here").await, "still here\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn files_go_through_the_container() {
    let project = Project::new(&[("src/app.py", "print('hi')\n"), ("notes.md", "one\ntwo\n")]);
    std::fs::set_permissions(project.file("src/app.py"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "host-secret-marker").unwrap();
    std::os::unix::fs::symlink(&secret, project.file("link-to-secret")).unwrap();
    std::os::unix::fs::symlink(outside.path(), project.file("link-to-dir")).unwrap();
    std::os::unix::fs::symlink("notes.md", project.file("link-inside")).unwrap();
    project.chown_all();
    let sb = sandbox(&project).await;
    let ws = Workspace::new(&sb);

    let f = ws.read("notes.md", 1 << 20).await.unwrap();
    assert_eq!((f.data.as_slice(), f.size), (&b"one\ntwo\n"[..], 8));
    let f = ws.read("notes.md", 3).await.unwrap();
    assert_eq!((f.data.as_slice(), f.size, f.complete()), (&b"one"[..], 8, false));
    assert_eq!(ws.read("link-inside", 100).await.unwrap().data, b"one\ntwo\n");

    for escape in [
        "../etc/passwd",
        "/etc/passwd",
        "link-to-secret",
        "link-to-dir/secret.txt",
        "src/../../x",
    ] {
        match ws.read(escape, 100).await {
            Err(FsError::Outside { .. }) => {}
            other => panic!("{escape}: expected Outside, got {other:?}"),
        }
        assert!(
            matches!(
                ws.replace(escape, b"pwned".to_vec()).await,
                Err(FsError::Outside { .. })
            ),
            "{escape}"
        );
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host-secret-marker");
    assert!(matches!(
        ws.read("missing.txt", 10).await,
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(ws.read("src", 10).await, Err(FsError::IsDirectory(_))));

    ws.replace("src/app.py", b"print('bye')\n".to_vec())
        .await
        .unwrap();
    assert_eq!(project.read("src/app.py"), "print('bye')\n");
    let meta = std::fs::metadata(project.file("src/app.py")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o750, "mode kept");
    assert_eq!(meta.uid(), project.owner().0);

    ws.create("new/dir/file.py", b"x = 1\n".to_vec()).await.unwrap();
    assert_eq!(project.read("new/dir/file.py"), "x = 1\n");
    assert!(matches!(
        ws.create("notes.md", b"".to_vec()).await,
        Err(FsError::Exists(_))
    ));
    assert!(matches!(
        ws.replace("nope.py", b"".to_vec()).await,
        Err(FsError::NotFound(_))
    ));
    // No temporary files are left behind.
    let leftovers: Vec<_> = walk(project.path())
        .into_iter()
        .filter(|p| p.contains(".agentbox-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let listing = ws.list(".", 100).await.unwrap();
    assert!(
        listing.lines.contains(&"src/app.py".to_string()),
        "{:?}",
        listing.lines
    );
    assert!(
        !listing.lines.iter().any(|l| l.contains("secret")),
        "{:?}",
        listing.lines
    );
    let cut = ws.list(".", 2).await.unwrap();
    assert_eq!(cut.lines.len(), 2);
    assert!(cut.total > 2);

    let hits = ws.search("bye", ".", 10).await.unwrap();
    assert_eq!(hits.lines, vec!["src/app.py:1:print('bye')".to_string()]);
    let hits = ws.search("host-secret", ".", 10).await.unwrap();
    assert!(hits.lines.is_empty(), "{:?}", hits.lines);
    assert!(matches!(
        ws.search("(", ".", 10).await,
        Err(FsError::Failed { .. })
    ));
    sb.shutdown().await.unwrap();
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        out.push(path.display().to_string());
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        }
    }
    out
}

#[tokio::test]
async fn shutdown_removes_the_container() {
    let docker = docker().await;
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let id = sb.info().container_id.clone();
    assert!(container_exists(&docker, &id).await);
    sb.shutdown().await.unwrap();
    assert!(!container_exists(&docker, &id).await);
    assert!(
        sb.exec(shell("true")).await.is_err(),
        "a shut-down sandbox refuses work"
    );
}

#[tokio::test]
async fn dropping_a_sandbox_removes_its_container() {
    let docker = docker().await;
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let id = sb.info().container_id.clone();
    drop(sb);
    let gone = eventually(Duration::from_secs(30), || async {
        !container_exists(&docker, &id).await
    })
    .await;
    assert!(gone, "container {id} outlived its sandbox");
}

#[tokio::test]
async fn a_container_killed_from_outside_is_reported() {
    let docker = docker().await;
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let id = sb.info().container_id.clone();
    let killer = {
        let docker = docker.clone();
        let id = id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            docker
                .kill_container(&id, None::<bollard::query_parameters::KillContainerOptions>)
                .await
        })
    };
    let result = sb.exec(shell("sleep 30")).await;
    killer.await.unwrap().unwrap();
    let err = result.expect_err("the container died under the command");
    assert!(
        matches!(err, agentbox::sandbox::SandboxError::ContainerGone(_)),
        "{err:?}"
    );
    assert!(matches!(
        sb.exec(shell("true")).await,
        Err(agentbox::sandbox::SandboxError::ContainerGone(_))
    ));
    sb.shutdown().await.unwrap();
    assert!(!container_exists(&docker, &id).await);
}

#[tokio::test]
async fn images_without_python_get_one_exec_per_call_with_the_same_guarantees() {
    let docker = docker().await;
    let image = no_python_image(&docker).await;
    let project = Project::new(&[("notes.txt", "one\n")]);
    let mut cfg = config();
    cfg.image = image.to_string();
    let sb = sandbox_with(&project, &cfg).await;
    assert_eq!(sb.info().exec_mode, ExecMode::PerCall);
    assert_eq!(
        stdout_of(&sb, "echo $(id -u)").await.trim(),
        project.owner().0.to_string()
    );
    let ws = Workspace::new(&sb);
    assert_eq!(ws.read("notes.txt", 100).await.unwrap().data, b"one\n");
    ws.replace("notes.txt", b"two\n".to_vec()).await.unwrap();
    assert_eq!(project.read("notes.txt"), "two\n");
    assert!(matches!(
        ws.read("../etc/passwd", 10).await,
        Err(FsError::Outside { .. })
    ));
    let out = sb
        .exec(ExecRequest::shell(
            "sleep 1000 & sleep 1000",
            Duration::from_secs(2),
        ))
        .await
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(
        stdout_of(&sb, "ps -eo comm= | grep -c '^sleep$' || true")
            .await
            .trim(),
        "0"
    );
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn hostile_inputs_get_an_answer_and_the_session_goes_on() {
    let project = Project::new(&[]);
    let sb = sandbox(&project).await;
    let out = sb
        .exec(ExecRequest::argv(
            ["bash", "-c", "echo a\0b"],
            Duration::from_secs(10),
        ))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 126, "{}", out.stderr.to_text());
    // A chain of a thousand links: deep enough to exhaust a resolver.
    stdout_of(
        &sb,
        "touch l0; i=0; while [ $i -lt 1000 ]; do ln -s l$i l$((i+1)); i=$((i+1)); done",
    )
    .await;
    let ws = Workspace::new(&sb);
    // Python before 3.13 runs out of recursion on it (an error for the model); 3.13 resolves
    // the chain to l0, inside the project (l0's content). Either way, nothing else.
    match ws.read("l1000", 100).await {
        Err(_) => {}
        Ok(file) => assert!(file.data.is_empty() && file.size == 0, "{:?}", file.data),
    }
    assert_eq!(stdout_of(&sb, "echo still here").await, "still here\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test]
async fn per_call_mode_sweeps_even_when_a_command_kills_its_wrapper() {
    let project = Project::new(&[]);
    let mut cfg = config();
    cfg.per_call_exec = true;
    let sb = sandbox_with(&project, &cfg).await;
    let _ = sb
        .exec(shell("setsid sh -c 'while :; do date > /tmp/daemon; sleep 0.2; done' >/dev/null 2>&1 & sleep 0.3; kill -9 $PPID"))
        .await
        .unwrap();
    let ps = stdout_of(&sb, "sleep 1; ps -eo args=").await;
    assert!(
        !ps.contains("/tmp/daemon"),
        "a daemon outlived its command:\n{ps}"
    );
    sb.shutdown().await.unwrap();
}

/// One file operation's outcome, comparable across the executor and the shell scripts: the
/// error (by kind) or what was read, and afterwards what the file holds and its mode.
#[derive(Debug, PartialEq)]
enum Seen {
    Read(Vec<u8>, u64),
    Listed(Vec<String>, u64),
    Done,
    Error(String),
}

fn seen<T>(r: Result<T, FsError>, ok: impl FnOnce(T) -> Seen) -> Seen {
    match r {
        Ok(v) => ok(v),
        // The variant, not the message: the shell's wording of a failure may differ.
        Err(e) => Seen::Error(
            format!("{e:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or_default()
                .to_string(),
        ),
    }
}

/// Every file operation, done by the executor natively and by the shell scripts (one exec per
/// call), gives the same result and leaves the same file with the same mode.
#[tokio::test]
async fn the_executor_and_the_shell_scripts_agree_on_every_file_operation() {
    let files = [("tool.sh", "#!/bin/sh\n"), ("a.txt", "hello\n"), ("dir/x", "x")];
    let mut results = Vec::new();
    for per_call in [false, true] {
        let project = Project::new(&files);
        std::fs::set_permissions(project.file("tool.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        project.git_init();
        let mut cfg = config();
        cfg.per_call_exec = per_call;
        let sb = sandbox_with(&project, &cfg).await;
        assert_eq!(sb.info().exec_mode == ExecMode::PerCall, per_call);
        stdout_of(
            &sb,
            "mkfifo pipe; ln -s /etc/passwd out; ln -s a.txt in; ln -s loop loop",
        )
        .await;
        let ws = Workspace::new(&sb);
        let mut r = Vec::new();
        for path in ["a.txt", "in", "missing", "dir", "pipe", "out", "../x", "loop"] {
            r.push((
                format!("read {path}"),
                seen(ws.read(path, 3).await, |b| Seen::Read(b.data, b.size)),
            ));
        }
        for path in [
            ".", "dir", "a.txt", "in", "missing", "pipe", "out", "../x", "loop",
        ] {
            for max in [0, 2, 500] {
                r.push((
                    format!("list {path} {max}"),
                    seen(ws.list(path, max).await, |l| Seen::Listed(l.lines, l.total)),
                ));
            }
        }
        for (pattern, path) in [
            ("h", "."),
            ("x", "dir"),
            ("e", "a.txt"),
            ("nowhere", "."),
            ("(", "."),
            ("-v", "."),
            ("h", "missing"),
            ("h", "out"),
        ] {
            for max in [1, 500] {
                r.push((
                    format!("search {pattern} in {path} {max}"),
                    seen(ws.search(pattern, path, max).await, |l| {
                        Seen::Listed(l.lines, l.total)
                    }),
                ));
            }
        }
        for (path, data) in [
            ("tool.sh", "#!/bin/sh\necho new\n"),
            ("missing", "x"),
            ("dir", "x"),
            (".git/config", "x"),
            ("out", "x"),
        ] {
            r.push((
                format!("replace {path}"),
                seen(ws.replace(path, data.into()).await, |_| Seen::Done),
            ));
        }
        for (path, data) in [
            ("a.txt", "x"),
            ("new/deep/file.txt", "made\n"),
            ("in", "x"),
            (".git/hooks/x", "x"),
        ] {
            r.push((
                format!("create {path}"),
                seen(ws.create(path, data.into()).await, |_| Seen::Done),
            ));
        }
        sb.shutdown().await.unwrap();
        let _ = sb.check_host();
        for path in ["tool.sh", "new/deep/file.txt", "a.txt"] {
            let meta = std::fs::metadata(project.file(path)).unwrap();
            r.push((
                format!("after: {path}"),
                Seen::Read(
                    std::fs::read(project.file(path)).unwrap(),
                    (meta.mode() & 0o7777) as u64,
                ),
            ));
        }
        results.push(r);
    }
    let (native, shell) = (&results[0], &results[1]);
    for (n, s) in native.iter().zip(shell) {
        assert_eq!(n, s, "the executor and the shell scripts disagree");
    }
    // And the outcomes are the ones the contract names.
    let by_name: std::collections::HashMap<&str, &Seen> =
        native.iter().map(|(k, v)| (k.as_str(), v)).collect();
    assert_eq!(by_name["read a.txt"], &Seen::Read(b"hel".to_vec(), 6));
    assert_eq!(by_name["list dir 500"], &Seen::Listed(vec!["dir/x".into()], 1));
    assert_eq!(by_name["list missing 2"], &Seen::Error("NotFound".into()));
    assert_eq!(by_name["list out 2"], &Seen::Error("Outside".into()));
    assert_eq!(
        by_name["search x in dir 500"],
        &Seen::Listed(vec!["dir/x:1:x".into()], 1)
    );
    assert_eq!(by_name["search ( in . 1"], &Seen::Error("Failed".into()));
    assert_eq!(by_name["read missing"], &Seen::Error("NotFound".into()));
    assert_eq!(by_name["read dir"], &Seen::Error("IsDirectory".into()));
    assert_eq!(by_name["read pipe"], &Seen::Error("NotRegular".into()));
    assert_eq!(by_name["read out"], &Seen::Error("Outside".into()));
    assert_eq!(by_name["create a.txt"], &Seen::Error("Exists".into()));
    assert_eq!(by_name["create new/deep/file.txt"], &Seen::Done);
    assert_eq!(
        by_name["after: tool.sh"],
        &Seen::Read(b"#!/bin/sh\necho new\n".to_vec(), 0o755),
        "mode kept"
    );
}
