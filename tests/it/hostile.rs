//! Hostile repositories and faults, each driven end to end through `agentbox run`: the tool
//! calls come from a script, the hostile behaviour from the repository's own code (fixtures in
//! tests/fixtures/hostile). Every scenario checks that it was contained, reported clearly, that
//! the loop went on, that the host and the user's files are unharmed, and that no container is
//! left.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::model_server::{ModelServer, Reply, anthropic_turn};
use crate::support::scripted::*;
use crate::support::*;
use serde_json::{Value, json};

const KEY: &str = "sk-ant-hostile-sentinel-93b1d77c04";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile")
        .join(name)
}

fn copy_dir(src: &Path, dst: &Path) {
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&to).unwrap();
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

fn project_from(name: &str) -> Project {
    let project = Project::new(&[]);
    copy_dir(&fixture(name), project.path());
    project.chown_all();
    project
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_attempts_fail_fast_and_nothing_leaves() {
    let project = project_from("network");
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [call("run_tests", json!({})), bash("ls /sys/class/net; ip -o link 2>/dev/null; cat /proc/net/route; cat /proc/net/dev")]},
            done("The network is unreachable from here.")
        ]),
        &[],
    )
    .await;
    let (_, tests, _) = run.result(0);
    assert!(
        tests.contains("4 passed"),
        "every network attempt failed fast: {tests}"
    );
    let (_, probe, _) = run.result(1);
    assert!(probe.starts_with("$ ls /sys/class/net"), "{probe}");
    // Under gVisor (runsc 2022-12) `ls` itself fails on every path (coreutils' statx with
    // AT_NO_AUTOMOUNT gets EINVAL); the kernel's interface table says the same everywhere.
    if !under_gvisor() {
        assert!(probe.contains("\nlo\n"), "{probe}");
    }
    let interfaces: Vec<&str> = probe
        .lines()
        .skip_while(|l| !l.contains("face |bytes"))
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim())
        .filter(|name| !name.is_empty() && !name.contains(' ') && !name.starts_with('$'))
        .collect();
    assert_eq!(interfaces, ["lo"], "{probe}");
    // The routing table has a header and no route at all.
    assert_eq!(
        probe.lines().filter(|l| l.starts_with("Iface")).count(),
        1,
        "{probe}"
    );
    assert!(!probe.contains("eth0"), "{probe}");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_contained_and_the_next_call_works() {
    let project = project_from("forkbomb");
    let started = Instant::now();
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("bash bomb.sh; sleep 3; echo bomb-returned")]},
            {"tool_calls": [bash("echo alive; ps -e --no-headers | wc -l")]},
            done("contained")
        ]),
        &["--pids-limit", "128", "--command-timeout", "10"],
    )
    .await;
    let took = started.elapsed();
    let (_, bomb, _) = run.result(0);
    if under_gvisor() {
        // Known gap (docs/src/engines/gvisor.md): gVisor's kernel is host processes inside the pids
        // limit; when the bomb reaches it, gVisor ends the whole sandbox. Still contained: the
        // run says so in those words and stops, no container is left (`finish`), the host
        // is fine.
        assert!(
            bomb.contains("gVisor (--runtime") && bomb.contains("ended the whole sandbox"),
            "{bomb}"
        );
        assert_eq!(run.code, Some(4), "{}", run.stderr);
        assert!(std::process::Command::new("true").status().unwrap().success());
        eprintln!("under gVisor the fork bomb ended the whole sandbox (known gap): {bomb}");
        return;
    }
    assert!(
        bomb.contains("Resource temporarily unavailable") || bomb.contains("timed out"),
        "{bomb}"
    );
    let (_, after, is_error) = run.result(1);
    assert!(!is_error && after.contains("alive"), "{after}");
    // bash, sh, wc and ps themselves; nothing from the bomb.
    let count: usize = after.lines().nth(2).unwrap().trim().parse().unwrap();
    assert!(count <= 6, "{count} processes still in the sandbox:\n{after}");
    assert_eq!(run.steps(), 3, "the loop went on");
    // The host is fine: we are still here and can start a process.
    assert!(std::process::Command::new("true").status().unwrap().success());
    eprintln!("fork bomb scenario took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_killed_and_reported_as_out_of_memory() {
    let project = project_from("memory");
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("python3 hog.py")]},
            {"tool_calls": [bash("echo next-call-works")]},
            done("it ran out of memory")
        ]),
        &["--memory", "256m"],
    )
    .await;
    let (_, hog, _) = run.result(0);
    if under_gvisor() {
        // Known gap (docs/src/engines/gvisor.md): the host's OOM killer can only take gVisor's kernel,
        // a host process, so the whole sandbox stops. The limit held, and the run says so.
        assert!(
            hog.contains("ran out of memory (--memory) and gVisor (--runtime"),
            "{hog}"
        );
        assert!(!hog.contains("the memory limit did not hold"), "{hog}");
        assert_eq!(run.code, Some(4), "{}", run.stderr);
        return;
    }
    assert!(
        hog.contains("killed by the sandbox's memory limit (out of memory)"),
        "{hog}"
    );
    assert!(!hog.contains("the memory limit did not hold"), "{hog}");
    assert!(run.result(1).1.contains("next-call-works"));
    assert_eq!(run.steps(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_and_its_stdout_holding_child_are_killed_at_the_timeout() {
    let project = project_from("runaway");
    let started = Instant::now();
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("python3 runaway.py")]},
            {"tool_calls": [bash("ps -eo user=,comm=")]},
            done("it never ended")
        ]),
        &["--command-timeout", "3"],
    )
    .await;
    let (_, spin, _) = run.result(0);
    assert!(
        spin.contains("spinning") && spin.contains("timed out after 3s"),
        "{spin}"
    );
    let elapsed = run.events.iter().find(|e| e["event"] == "tool_finished").unwrap()["elapsed_ms"]
        .as_u64()
        .unwrap();
    assert!(elapsed < 15_000, "the exec stream hung: {elapsed} ms");
    eprintln!(
        "runaway killed {} ms after it started (timeout 3 s); scenario took {:?}",
        elapsed,
        started.elapsed()
    );
    let (_, ps, _) = run.result(1);
    assert!(
        !ps.contains("python3") && !ps.contains("sleep"),
        "left running:\n{ps}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_of_output_is_cut_and_costs_the_host_little() {
    let project = project_from("flood");
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("python3 flood.py")]},
            done("that was a lot of output")
        ]),
        &[],
    )
    .await;
    let (_, flood, _) = run.result(0);
    assert!(
        flood.len() < 16_000,
        "the result is bounded: {} bytes",
        flood.len()
    );
    assert!(flood.contains("GiB cut"), "{}", &flood[..200.min(flood.len())]);
    assert!(
        flood.ends_with("flood-finished\nexit 0"),
        "the tail is kept: {}",
        &flood[flood.len() - 100..]
    );
    // Peak RSS of the largest child this test process waited for: agentbox runs, small ones.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let peak_mib = usage.ru_maxrss as f64 / 1024.0;
    eprintln!("agentbox peak RSS across this test binary's runs: {peak_mib:.1} MiB (1 GiB flooded)");
    assert!(peak_mib < 200.0, "peak RSS {peak_mib:.1} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disks_fill_inside_the_sandbox_only() {
    let project = Project::new(&[("test_placeholder.py", "def test_ok():\n    assert True\n")]);
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("dd if=/dev/zero of=/tmp/fill bs=1M count=500")]},
            {"tool_calls": [bash("echo still-writable > workspace-file.txt && cat workspace-file.txt")]},
            {"tool_calls": [bash("head -c 100000000 /dev/zero > big.bin; ls -l big.bin")]},
            done("disk is bounded")
        ]),
        &["--tmp-size", "32m", "--max-file-size", "64m"],
    )
    .await;
    let (_, fill, _) = run.result(0);
    assert!(fill.contains("No space left on device"), "{fill}");
    assert!(run.result(1).1.contains("still-writable"));
    let (_, big, _) = run.result(2);
    assert!(
        big.contains("File size limit exceeded") || big.contains("67108864"),
        "{big}"
    );
    let size = std::fs::metadata(project.file("big.bin")).unwrap().len();
    assert!(size <= 64 << 20, "big.bin is {size} bytes");
    let report = run.report.unwrap();
    assert_eq!(
        report["tests"]["passed"], true,
        "the harness still works with /tmp full"
    );
    assert!(report["diff_error"].is_null(), "{}", report["diff_error"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_never_reveal_or_change_host_files() {
    let outside = tempfile::tempdir().unwrap();
    let marker = format!("host-secret-{}", uuid_like());
    let secret = outside.path().join("marker.txt");
    std::fs::write(&secret, &marker).unwrap();
    let project = Project::new(&[("app.py", "x = 1\n")]);
    std::os::unix::fs::symlink(&secret, project.file("abs")).unwrap();
    let depth = project.path().components().count();
    let dotdot = format!(
        "{}{}",
        "../".repeat(depth + 2),
        secret.display().to_string().trim_start_matches('/')
    );
    std::os::unix::fs::symlink(&dotdot, project.file("dotdot")).unwrap();
    std::os::unix::fs::symlink(outside.path(), project.file("dirlink")).unwrap();
    project.chown_all();
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [
                call("list_files", json!({})),
                call("list_files", json!({"path": "dirlink"})),
                call("read_file", json!({"path": "abs"})),
                call("read_file", json!({"path": "dotdot"})),
                call("read_file", json!({"path": "dirlink/marker.txt"})),
                call("edit_file", json!({"path": "abs", "old": marker, "new": "pwned"})),
                call("edit_file", json!({"path": "dirlink/new.txt", "old": "", "new": "planted"})),
                call("edit_file", json!({"path": "dotdot", "old": "", "new": "planted"})),
                call("search", json!({"pattern": "host-secret-[0-9a-f]+"})),
                call("search", json!({"pattern": "host", "path": "dirlink"})),
                bash("cat abs dotdot dirlink/marker.txt; ls -la dirlink/")
            ]},
            done("nothing outside is reachable")
        ]),
        &[],
    )
    .await;
    let results = run.results();
    assert_eq!(results.len(), 11);
    for (name, content, _) in &results {
        assert!(
            !content.contains(&marker),
            "{name} revealed the host marker: {content}"
        );
    }
    for i in [1, 2, 3, 4, 5, 6, 7, 9] {
        assert!(results[i].2, "call {i} should be refused: {:?}", results[i]);
        assert!(results[i].1.contains("outside the project"), "{:?}", results[i]);
    }
    assert!(!results[0].1.contains("marker"), "{}", results[0].1);
    assert!(
        results[10].1.contains("No such file"),
        "inside the container the links point nowhere: {}",
        results[10].1
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), marker);
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing new outside"
    );
    assert!(!run.stdout.contains(&marker));
}

fn uuid_like() -> String {
    format!(
        "{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn sha(path: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_outside_fail_and_planted_git_metadata_is_quarantined() {
    let project = project_from("writes");
    project.git_init();
    let passwd = sha("/etc/passwd");
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [
                call("run_tests", json!({})),
                bash("touch /evil; echo x >> /etc/passwd; mkdir -p .git/hooks; echo '#!/bin/sh' > .git/hooks/post-checkout; mkdir -p sub/.git && printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > sub/.git/config && echo planted"),
                call("edit_file", json!({"path": ".git/config", "old": "", "new": "x"})),
            ]},
            done("tried")
        ]),
        &[],
    )
    .await;
    let (_, tests, _) = run.result(0);
    assert!(tests.contains("5 passed"), "{tests}");
    let (_, writes, _) = run.result(1);
    assert!(
        writes.contains("Read-only file system") && writes.contains("planted"),
        "{writes}"
    );
    let (_, edit, is_error) = run.result(2);
    assert!(
        is_error && (edit.contains("already exists") || edit.contains("read-only")),
        "{edit}"
    );
    assert!(!project.file(".git/hooks/post-checkout").exists());
    assert!(
        !project.file("sub/.git").exists(),
        "the planted .git must be moved away"
    );
    // Out of the project, into the run's data directory, where no link can reach it.
    assert!(run.quarantined("sub/.git/config").exists());
    let warnings = run.warnings();
    assert!(
        warnings.contains("sub/.git: git metadata the session created")
            && warnings.contains("moved out of the project to")
            && warnings.contains("quarantine"),
        "{warnings}"
    );
    assert_eq!(sha("/etc/passwd"), passwd, "the host's /etc/passwd is unchanged");
    assert!(!Path::new("/evil").exists());
    assert_owned_by_owner(&project);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_directory_planted_in_a_plain_project_is_quarantined() {
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [bash("git init -q && git config core.hooksPath /workspace/hooks && echo made")]},
            done("made a repository")
        ]),
        &[],
    )
    .await;
    assert!(run.result(0).1.contains("made"));
    assert!(!project.file(".git").exists());
    assert!(run.quarantined(".git/config").exists());
    let warnings = run.warnings();
    assert!(
        warnings.contains(".git: git metadata the session created; moved out of the project"),
        "{warnings}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_never_in_the_sandbox_the_trajectory_or_the_logs() {
    for level in ["", "debug", "trace"] {
        let project = Project::new(&[("a.py", "x = 1\n")]);
        let server = ModelServer::start(vec![
            Reply::ok(anthropic_turn(
                "",
                &[("bash", json!({"command": "env; cat /proc/1/environ /proc/self/environ 2>/dev/null | tr '\\0' '\\n'; grep -rs sk-ant- /home /tmp /run 2>/dev/null; echo searched"}))],
            )),
            Reply::ok(anthropic_turn("no key in here", &[])),
        ])
        .await;
        let spawned = spawn_run(
            &project,
            json!([]),
            &["--provider", "anthropic", "--base-url", &server.anthropic_url()],
            &[("ANTHROPIC_API_KEY", KEY), ("RUST_LOG", level)],
        );
        let run = finish(spawned).await;
        assert_eq!(run.code, Some(0), "level {level:?}: {}", run.stderr);
        let (_, env, _) = run.result(0);
        assert!(
            env.contains("HOME=/home/agentbox") && env.contains("searched"),
            "{env}"
        );
        assert!(!env.contains(KEY), "the key reached the sandbox");
        let all_events = run.events.iter().map(|e| e.to_string()).collect::<String>();
        assert!(
            !all_events.contains(KEY),
            "the key is in the trajectory at level {level:?}"
        );
        assert!(
            !run.stderr.contains(KEY),
            "the key is in the logs at level {level:?}"
        );
        assert!(!run.stdout.contains(KEY));
        assert!(
            server
                .requests()
                .iter()
                .all(|r| r.header("x-api-key") == Some(KEY))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_model_gets_clear_errors_and_the_loop_goes_on() {
    let project = project_from("misbehaviour");
    let ten_mb = "y".repeat(10 << 20);
    let many: Vec<Value> = (0..200).map(|_| call("list_files", json!({}))).collect();
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [
                call("rm_rf", json!({})),
                json!({"name": "read_file", "arguments": "{\"path\": \"notes.txt\""}),
                call("read_file", json!({})),
                call("read_file", json!({"path": 42})),
                call("read_file", json!({"path": "notes\u{0}.txt"})),
                call("edit_file", json!({"path": "huge.txt", "old": "", "new": ten_mb})),
                call("edit_file", json!({"path": "logo.png", "old": "PNG", "new": "GIF"})),
                call("read_file", json!({"path": "logo.png"})),
            ]},
            {"tool_calls": many},
            done("sorry")
        ]),
        &[],
    )
    .await;
    let results = run.results();
    let expect = [
        "unknown tool \"rm_rf\"",
        "the arguments for read_file are not valid JSON",
        "invalid arguments for read_file: missing field `path`",
        "invalid arguments for read_file: invalid type: integer `42`",
        "contains a NUL byte",
        "`new` is 10.0 MiB; one edit writes at most 1.0 MiB",
        "logo.png is a binary file; edit_file edits text files only",
        "logo.png is a binary file",
    ];
    for (i, want) in expect.iter().enumerate() {
        let (_, content, is_error) = &results[i];
        assert!(
            *is_error && content.contains(want),
            "call {i}: want {want:?}, got {content:?}"
        );
    }
    assert!(!project.file("huge.txt").exists());
    // 200 calls: 64 run, the rest answered without running; every one has a result.
    let second: Vec<&Value> = run
        .events
        .iter()
        .filter(|e| e["event"] == "model_request" && e["step"] == 3)
        .collect();
    let last_msg = second[0]["request"]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let answers = last_msg["content"].as_array().unwrap();
    assert_eq!(answers.len(), 200);
    let not_run = answers
        .iter()
        .filter(|a| {
            a["content"]
                .as_str()
                .unwrap()
                .starts_with("not run: 200 tool calls")
        })
        .count();
    assert_eq!(not_run, 136);
    assert_eq!(run.steps(), 3, "the loop went on to the final answer");
    assert_eq!(project.read("notes.txt"), "Some notes.\n");
}

/// Start a run that will sit in a long command, wait for it to get there, and return it.
async fn in_long_command(project: &Project, env: &[(&str, &str)]) -> Spawned {
    let spawned = spawn_run(
        project,
        json!([{"tool_calls": [bash("sleep 300")]}, done("never")]),
        &[],
        env,
    );
    let path = spawned.trajectory.clone();
    let started = eventually(Duration::from_secs(60), || {
        let path = path.clone();
        async move { read_events(&path).iter().any(|e| e["event"] == "tool_started") }
    })
    .await;
    assert!(started, "the long command never started");
    tokio::time::sleep(Duration::from_millis(300)).await;
    spawned
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_and_sigterm_mid_command_remove_the_sandbox() {
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let project = Project::new(&[("a.py", "x = 1\n")]);
        let spawned = in_long_command(&project, &[]).await;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(spawned.pid as i32, signal) };
        let run = finish(spawned).await;
        assert_eq!(run.code, Some(code), "{}", run.stderr);
        assert!(run.stderr.contains("removing the sandbox"), "{}", run.stderr);
        assert_eq!(project.read("a.py"), "x = 1\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_still_removes_the_sandbox() {
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let spawned = spawn_run(
        &project,
        json!([{"tool_calls": [call("edit_file", json!({"path": "a.py", "old": "x = 1", "new": "x = 2"}))]}, done("x")]),
        &[],
        &[("AGENTBOX_FAULT", "panic-after-tool")],
    );
    let run = finish(spawned).await;
    assert_eq!(run.code, Some(101), "{}", run.stderr);
    assert!(run.stderr.contains("internal error (panic)"), "{}", run.stderr);
    assert_eq!(
        project.read("a.py"),
        "x = 2\n",
        "the edit made before the panic is whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_batch_of_edits_leaves_each_file_whole() {
    // Twenty 900 KiB files written by one turn of edits; SIGINT lands part-way through the batch.
    let project = Project::new(&[("keep.txt", "untouched\n")]);
    let creates: Vec<Value> = (0..20)
        .map(|i| {
            call(
                "edit_file",
                json!({"path": format!("new{i:02}.txt"), "old": "", "new": "z".repeat(900 << 10)}),
            )
        })
        .collect();
    let spawned = spawn_run(&project, json!([{ "tool_calls": creates }, done("x")]), &[], &[]);
    let path = spawned.trajectory.clone();
    let first_done = eventually(Duration::from_secs(60), || {
        let path = path.clone();
        async move { read_events(&path).iter().any(|e| e["event"] == "tool_finished") }
    })
    .await;
    assert!(first_done);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(spawned.pid as i32, libc::SIGINT) };
    let run = finish(spawned).await;
    assert_eq!(run.code, Some(130), "{}", run.stderr);
    let mut whole = 0;
    for i in 0..20 {
        let p = project.file(&format!("new{i:02}.txt"));
        if p.exists() {
            assert_eq!(
                std::fs::metadata(&p).unwrap().len(),
                900 << 10,
                "{} is partial",
                p.display()
            );
            whole += 1;
        }
    }
    assert!(whole >= 1, "at least the first edit landed");
    let temps: Vec<String> = std::fs::read_dir(project.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".agentbox-"))
        .collect();
    assert!(temps.is_empty(), "temporary files left: {temps:?}");
    assert_eq!(project.read("keep.txt"), "untouched\n");
    eprintln!("interrupted after {whole} of 20 writes; every file whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_links_to_files_outside_the_project_are_refused() {
    // As a package manager's cache does: a file in the project shares its inode with one outside.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("cached.py"), "clean = True\n").unwrap();
    let project = Project::new(&[("a.py", "x = 1\n")]);
    std::fs::create_dir_all(project.file(".venv/lib")).unwrap();
    std::fs::hard_link(
        outside.path().join("cached.py"),
        project.file(".venv/lib/cached.py"),
    )
    .unwrap();
    project.chown_all();
    let out = run(agentbox().arg("exec").arg(project.path()).args([
        "--",
        "sh",
        "-c",
        "echo pwned >> .venv/lib/cached.py",
    ]));
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("hard links to files outside it (e.g. .venv/lib/cached.py)")
            && err.contains("--isolate"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("cached.py")).unwrap(),
        "clean = True\n"
    );
    // A copy breaks the link: --isolate runs, and the outside file stays clean.
    let run = hostile(
        &project,
        json!([{"tool_calls": [bash("echo pwned >> .venv/lib/cached.py; echo done")]}, done("x")]),
        &["--isolate"],
    )
    .await;
    assert!(run.result(0).1.contains("done"), "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("cached.py")).unwrap(),
        "clean = True\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_metadata_anywhere_is_read_only_and_new_metadata_is_quarantined() {
    let project = Project::new(&[
        ("a.py", "x = 1\n"),
        ("lib/sub/x.py", "y = 1\n"),
        (".husky/_/pre-commit", "#!/bin/sh\n"),
    ]);
    project.git_init();
    // A submodule's .git file, a hooks path inside the worktree, a bare repository.
    std::fs::write(project.file("lib/sub/.git"), "gitdir: ../../.git/modules/sub\n").unwrap();
    let config = std::fs::read_to_string(project.file(".git/config")).unwrap();
    std::fs::write(
        project.file(".git/config"),
        format!("{config}[core]\n\thooksPath = .husky/_\n"),
    )
    .unwrap();
    for d in ["bare/objects", "bare/refs"] {
        std::fs::create_dir_all(project.file(d)).unwrap();
    }
    std::fs::write(project.file("bare/HEAD"), "ref: refs/heads/main\n").unwrap();
    project.chown_all();
    let run = hostile(
        &project,
        json!([
            {"tool_calls": [
                bash("echo 'gitdir: ../evil' > lib/sub/.git; echo rc=$?"),
                bash("echo 'touch /tmp/pwned' > .husky/_/pre-commit; echo rc=$?"),
                bash("echo '[core] fsmonitor = x' > bare/config; echo rc=$?"),
                bash("mkdir -p node_modules/pkg/.git hid/sub/.git && chmod 0111 hid && echo planted")
            ]},
            done("tried")
        ]),
        &[],
    )
    .await;
    for i in 0..3 {
        let (_, r, _) = run.result(i);
        assert!(
            r.contains("Read-only file system") && r.contains("rc=1"),
            "call {i}: {r}"
        );
    }
    assert_eq!(project.read("lib/sub/.git"), "gitdir: ../../.git/modules/sub\n");
    assert_eq!(project.read(".husky/_/pre-commit"), "#!/bin/sh\n");
    assert!(run.result(3).1.contains("planted"));
    let warnings = run.report.unwrap()["warnings"].to_string();
    assert!(warnings.contains("node_modules/pkg/.git"), "{warnings}");
    assert!(
        warnings.contains("hid/sub/.git") || warnings.contains("hid cannot be read"),
        "{warnings}"
    );
    assert!(!project.file("node_modules/pkg/.git").exists());
}

/// `n` hard links to one file in `dir` of the project, made on the host (ext4 allows 65000).
fn hard_links(project: &Project, dir: &str, n: usize) {
    let d = project.file(dir);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("f"), "x").unwrap();
    for i in 0..n {
        std::fs::hard_link(d.join("f"), d.join(i.to_string())).unwrap();
    }
    project.chown_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_scan_is_bounded_and_says_so() {
    let docker = docker().await;
    // A session that makes more entries than the scan looks at: the session's result stands,
    // and the host says its check after it was incomplete.
    let project = Project::new(&[("a.txt", "a\n")]);
    let out = run(agentbox().args(["exec", "--host-scan-limit", "5000"]).arg(project.path()).args([
        "--",
        "python3",
        "-c",
        "import os\nos.mkdir('d')\nopen('d/f', 'w').write('x')\nfor i in range(8000): os.link('d/f', 'd/%d' % i)",
    ]));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the host's scan of the project after the session was incomplete (it stopped after 5000 entries (--host-scan-limit))"),
        "{stderr}"
    );
    // Before a session, a scan that stops cannot vouch for the project: the mount is refused,
    // quickly, and no container is made.
    let many = Project::new(&[("a.txt", "a\n")]);
    hard_links(&many, "d", 20_000);
    let mut cmd = agentbox();
    cmd.args(["exec", "--host-scan-limit", "5000"])
        .arg(many.path())
        .args(["--", "true"]);
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("agentbox's scan of it for hard links to files outside and for git metadata was incomplete (it stopped after 5000 entries (--host-scan-limit))"),
        "{stderr}"
    );
    assert_eq!(containers_of_pid(&docker, pid).await, 0);
    // Within the bound, the same project runs.
    let out = run(agentbox()
        .args(["exec", "--host-scan-limit", "50000"])
        .arg(many.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
