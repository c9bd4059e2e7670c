//! `cargo bench` / `just bench`: agentbox's speed and memory, side by side with the obvious
//! alternatives, measured in one run so the ratios hold on a noisy machine.
//!
//! Each figure is the median and p90 of many runs. Needs the Docker daemon and the image (and
//! the `docker` CLI for the CLI column; without it that column is skipped).
//!
//! Usage: cargo bench --bench bench [-- quick [loop|egress|publish|gateway|startup|round-trips|eval]]
//! ("quick" runs fewer iterations, "loop" only the tools-through-the-loop rows, "egress" only
//! the proxy's, "publish" only a published port's, "round-trips" only the tool-call round trips). AGENTBOX_RUNTIME=runsc runs agentbox's
//! sandboxes under that runtime (gVisor), to compare it with the daemon's default.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is the failure report

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox::agent::{Agent, AgentConfig};
use agentbox::cli::SandboxArgs;
use agentbox::config::SandboxConfig;
use agentbox::events::{Event, EventSink};
use agentbox::model::scripted::Scripted;
use agentbox::model::{Message, ToolArgs, ToolCall};
use agentbox::sandbox::{DockerSandbox, ExecRequest, Sandbox, connect_docker};
use agentbox::tools::{ToolContext, ToolRegistry, ToolSettings};
use serde_json::json;

struct Stats {
    median: f64,
    p90: f64,
}

fn stats(mut xs: Vec<f64>) -> Stats {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    Stats {
        median: at(0.5),
        p90: at(0.9),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn row(name: &str, s: &Stats, unit: &str, note: &str) {
    println!(
        "| {name:<58} | {:>9.2} | {:>9.2} | {unit:<5} | {note} |",
        s.median, s.p90
    );
}

fn config(per_call: bool) -> SandboxConfig {
    let mut cfg = SandboxConfig::from_args(&SandboxArgs {
        image: Some(agentbox::sandbox::image::DEFAULT_IMAGE.into()),
        image_source: None,
        command_timeout: Some(120),
        memory: "2g".into(),
        cpus: None,
        pids_limit: 512,
        tmp_size: "512m".into(),
        max_file_size: "2g".into(),
        runtime: bench_runtime(),
        per_call_exec: per_call,
        allow_weak_limits: false,
        host_scan_limit: 2_000_000,
        host_scan_timeout: 30,
        service: Vec::new(),
        service_timeout: 60,
        service_definitions: Vec::new(),
    })
    .expect("config");
    cfg.per_call_exec = per_call;
    cfg
}

/// The runtime agentbox's sandboxes run under here: AGENTBOX_RUNTIME, as for the CLI.
fn bench_runtime() -> Option<String> {
    std::env::var("AGENTBOX_RUNTIME").ok().filter(|r| !r.is_empty())
}

fn project_with(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("agentbox-bench-")
        .tempdir()
        .unwrap();
    for (name, data) in files {
        let p = dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    dir
}

fn hundred_kb() -> Vec<u8> {
    (0..2000)
        .map(|i| format!("line {i:05} of a file that is about one hundred kilobytes long\n"))
        .collect::<String>()
        .into_bytes()
}

async fn sandbox(dir: &Path, per_call: bool) -> DockerSandbox {
    let docker = connect_docker().await.expect("docker");
    DockerSandbox::create(&docker, config(per_call).bind_spec(dir).unwrap())
        .await
        .expect("sandbox")
}

fn call(name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall {
        id: "b".into(),
        name: name.into(),
        arguments: ToolArgs::Json(args),
    }
}

fn cli_available() -> bool {
    Command::new("docker")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn time_cmd(n: usize, mut make: impl FnMut() -> Command, input: Option<&[u8]>) -> Stats {
    let mut xs = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = make();
        c.stdout(Stdio::null()).stderr(Stdio::null());
        if input.is_some() {
            c.stdin(Stdio::piped());
        }
        let t = Instant::now();
        let mut child = c.spawn().expect("spawn");
        if let Some(data) = input {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(data).unwrap();
        }
        let st = child.wait().unwrap();
        xs.push(ms(t.elapsed()));
        assert!(st.success());
    }
    stats(xs)
}

/// Tool-call round trips: agentbox (executor, and one exec per call) vs the docker CLI vs a
/// process on the host.
async fn round_trips(n: usize) {
    let big = hundred_kb();
    let dir = project_with(&[("data.txt", big.clone()), ("edit.txt", b"alpha\n".to_vec())]);
    let settings = ToolSettings::default();
    let tools = ToolRegistry::standard(true, false);
    for per_call in [false, true] {
        let sb = sandbox(dir.path(), per_call).await;
        let label = if per_call {
            "agentbox, one docker exec per call"
        } else {
            "agentbox (persistent executor)"
        };
        let ctx = ToolContext {
            sandbox: &sb,
            settings: &settings,
            approver: None,
        };
        let mut t_true = Vec::new();
        let mut t_read = Vec::new();
        let mut t_edit = Vec::new();
        for i in 0..n {
            let t = Instant::now();
            let out = sb
                .exec(ExecRequest::argv(["true"], Duration::from_secs(30)))
                .await
                .unwrap();
            t_true.push(ms(t.elapsed()));
            assert!(out.success());
            let t = Instant::now();
            let r = tools
                .dispatch(
                    &call("read_file", json!({"path": "data.txt", "limit": 5000})),
                    &ctx,
                )
                .await;
            t_read.push(ms(t.elapsed()));
            assert!(!r.is_error(), "{}", r.content());
            let (old, new) = if i % 2 == 0 {
                ("alpha", "beta")
            } else {
                ("beta", "alpha")
            };
            let t = Instant::now();
            let r = tools
                .dispatch(
                    &call("edit_file", json!({"path": "edit.txt", "old": old, "new": new})),
                    &ctx,
                )
                .await;
            t_edit.push(ms(t.elapsed()));
            assert!(!r.is_error(), "{}", r.content());
        }
        row(&format!("`true` round trip: {label}"), &stats(t_true), "ms", "");
        row(
            &format!("read_file 100 KB: {label}"),
            &stats(t_read),
            "ms",
            "read + number lines",
        );
        row(
            &format!("edit_file: {label}"),
            &stats(t_edit),
            "ms",
            "read, replace, atomic write",
        );
        if !per_call && cli_available() {
            let cid = sb.info().container_id.clone();
            let uid = format!("{}:{}", sb.info().uid, sb.info().gid);
            let s = time_cmd(
                n,
                || {
                    let mut c = Command::new("docker");
                    c.args(["exec", "-u", &uid, &cid, "true"]);
                    c
                },
                None,
            );
            row(
                "`true` round trip: `docker exec` through the CLI",
                &s,
                "ms",
                "same container",
            );
            let s = time_cmd(
                n,
                || {
                    let mut c = Command::new("docker");
                    c.args(["exec", "-u", &uid, "-w", "/workspace", &cid, "cat", "data.txt"]);
                    c
                },
                None,
            );
            row(
                "read 100 KB: `docker exec cat` through the CLI",
                &s,
                "ms",
                "bytes only, no numbering",
            );
            let s = time_cmd(
                n,
                || {
                    let mut c = Command::new("docker");
                    c.args([
                        "exec",
                        "-i",
                        "-u",
                        &uid,
                        "-w",
                        "/workspace",
                        &cid,
                        "sh",
                        "-c",
                        "cat > .e.tmp && mv .e.tmp edit.txt",
                    ]);
                    c
                },
                Some(b"alpha\n"),
            );
            row(
                "write: `docker exec -i sh -c 'cat > tmp && mv'` (CLI)",
                &s,
                "ms",
                "no read or match",
            );
        }
        sb.shutdown().await.unwrap();
    }
    let s = time_cmd(n, || Command::new("true"), None);
    row("`true`: a process spawned on the host", &s, "ms", "the floor");
    let path = dir.path().join("data.txt");
    let s = time_cmd(
        n,
        || {
            let mut c = Command::new("cat");
            c.arg(&path);
            c
        },
        None,
    );
    row("read 100 KB: `cat` on the host", &s, "ms", "");
    let edit = dir.path().join("edit.txt");
    let script = format!("cat > {0}.tmp && mv {0}.tmp {0}", edit.display());
    let s = time_cmd(
        n,
        || {
            let mut c = Command::new("sh");
            c.args(["-c", &script]);
            c
        },
        Some(b"alpha\n"),
    );
    row("write: `sh -c 'cat > tmp && mv'` on the host", &s, "ms", "");
}

/// The steps of `agentbox exec P -- true`, in the order they end; each row is the time from
/// the end of the step before (the first: from the spawn) to the `step=...` debug event that
/// ends it, and "exit" is the last event to the process's exit as `wait` sees it.
const STEPS: &[(&str, &str)] = &[
    ("config", "spawn, runtime, CLI parsing, configuration read"),
    ("image choice", "project detection, image chosen"),
    ("host scan before", "the project's scan before the mount"),
    ("image present", "daemon connection, image inspect"),
    ("engine checks", "engine facts, limits"),
    ("image facts", "the image's users for /etc"),
    ("create", "create (daemon)"),
    ("start", "attach + start (daemon)"),
    (
        "executor ready",
        "the supervisor's hello (one-shot; else the executor's handshake)",
    ),
    ("command", "`true`, its exit status and the `die` event"),
    ("result written", "status lines written and flushed"),
    ("kill", "the supervisor's connection closed"),
    (
        "remove",
        "the auto-removal with its /var/tmp volume, waited for (daemon)",
    ),
    ("volume removal", "workspace volume (--isolate only)"),
    ("host scan after", "the project's scan after the run"),
    ("exit", "last event to the process's exit"),
];

/// Seconds since midnight (UTC) of a tracing-subscriber line's timestamp
/// (`2026-12-04T20:01:02.123456Z ...`).
fn log_time(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let clock = stamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = clock.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

fn day_seconds(t: std::time::SystemTime) -> f64 {
    (t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()) % 86400.0
}

/// Process start to exit of `agentbox exec P -- true`, step by step, beside `docker run --rm
/// --network none IMAGE true`, the two alternated so that a noisy moment hits both.
///
/// How it measures: the real binary runs with `-v`; every step ends with a debug event carrying
/// `step="..."`, whose timestamp (the subscriber's wall clock, microseconds) is compared with
/// the wall clock taken just before the spawn and just after `wait` returns. The events cost a
/// formatted line on stderr each (a few microseconds); nothing else is added to the path.
fn start_to_exit(n: usize) {
    let dir = project_with(&[("a.py", b"x = 1\n".to_vec())]);
    let mut steps: Vec<Vec<f64>> = vec![Vec::new(); STEPS.len()];
    let (mut total, mut to_result, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    let cli = cli_available();
    for _ in 0..n {
        let mut c = Command::new(env!("CARGO_BIN_EXE_agentbox"));
        c.args(["-v", "exec"]).arg(dir.path()).args(["--", "true"]);
        c.env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let spawned = std::time::SystemTime::now();
        let out = c.output().expect("spawn agentbox");
        let exited = std::time::SystemTime::now();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (t0, t_end) = (day_seconds(spawned), day_seconds(exited));
        let mut marks: Vec<(f64, usize)> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(|l| {
                let field = l.split("step=").nth(1)?;
                let step = match field.strip_prefix('"') {
                    Some(quoted) => quoted.split('"').next()?,
                    None => field.split_whitespace().next()?,
                };
                let i = STEPS.iter().position(|(s, _)| *s == step)?;
                Some((log_time(l)?, i))
            })
            .collect();
        marks.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        marks.push((t_end, STEPS.len() - 1));
        let mut before = t0;
        for (t, i) in marks {
            steps[i].push((t - before) * 1000.0);
            before = t;
            if STEPS[i].0 == "result written" {
                to_result.push((t - t0) * 1000.0);
            }
        }
        total.push((t_end - t0) * 1000.0);
        if cli {
            let mut d = Command::new("docker");
            d.args(["run", "--rm", "--network", "none"]);
            if let Some(r) = bench_runtime() {
                d.args(["--runtime", &r]);
            }
            d.args([agentbox::sandbox::image::DEFAULT_IMAGE, "true"]);
            d.stdout(Stdio::null()).stderr(Stdio::null());
            let t = Instant::now();
            assert!(d.status().unwrap().success());
            plain.push(ms(t.elapsed()));
        }
    }
    for ((name, what), xs) in STEPS.iter().zip(steps) {
        if !xs.is_empty() {
            row(&format!("exec step: {name}"), &stats(xs), "ms", what);
        }
    }
    if !to_result.is_empty() {
        row(
            "`agentbox exec P -- true`: spawn → result written",
            &stats(to_result),
            "ms",
            "",
        );
    }
    let total = stats(total);
    row("`agentbox exec P -- true`: spawn → exit", &total, "ms", "");
    if cli {
        let plain = stats(plain);
        row(
            "`docker run --rm --network none IMAGE true` (alternated)",
            &plain,
            "ms",
            "the engine's floor",
        );
        println!(
            "| {:<58} | {:>9.2} | {:>9} | ratio | median over median, same run |",
            "exec / docker run --rm",
            total.median / plain.median,
            ""
        );
    }
}

/// Create → first command → removal, and where the time goes.
async fn startup(n: usize) {
    start_to_exit(n);
    let dir = project_with(&[("a.py", b"x = 1\n".to_vec())]);
    let docker = connect_docker().await.unwrap();
    let (mut create, mut first, mut remove, mut total) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t0 = Instant::now();
        let sb = DockerSandbox::create(&docker, config(false).bind_spec(dir.path()).unwrap())
            .await
            .unwrap();
        let t1 = Instant::now();
        sb.exec(ExecRequest::argv(["true"], Duration::from_secs(30)))
            .await
            .unwrap();
        let t2 = Instant::now();
        sb.shutdown().await.unwrap();
        let t3 = Instant::now();
        create.push(ms(t1 - t0));
        first.push(ms(t2 - t1));
        remove.push(ms(t3 - t2));
        total.push(ms(t2 - t0));
    }
    row(
        "sandbox ready: create + start + executor",
        &stats(create),
        "ms",
        "full policy",
    );
    row("first command after ready", &stats(first), "ms", "");
    // The daemon's own share of "ready": the same image created and started through the API
    // with no policy, no mounts and no executor, then removed. What "ready" adds on top is
    // agentbox's (the policy's mounts and options, the executor's start and handshake).
    let mut raw = Vec::new();
    for i in 0..n {
        let name = format!("agentbox-bench-raw-{}-{i}", std::process::id());
        let t0 = Instant::now();
        bare_container(&docker, &name, None).await;
        raw.push(ms(t0.elapsed()));
        docker
            .remove_container(
                &name,
                Some(
                    bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .build(),
                ),
            )
            .await
            .unwrap();
    }
    row(
        "create + start through the API, no policy, no executor",
        &stats(raw),
        "ms",
        "the daemon's share",
    );
    row("create → first command done", &stats(total), "ms", "target < 500");
    from_the_pool(n, &docker, dir.path()).await;
    // What the session's anonymous `/var/tmp` volume (policy::CACHE_DIR) costs the daemon: the
    // same bare container's forced removal with and without one, alternated.
    let (mut bare, mut with_volume) = (Vec::new(), Vec::new());
    for i in 0..n {
        for volume in [false, true] {
            let name = format!("agentbox-bench-vol-{}-{i}-{volume}", std::process::id());
            // As the policy mounts it: a volume mount with no source.
            let mount = volume.then(|| bollard::models::Mount {
                target: Some(agentbox::sandbox::CACHE_DIR.into()),
                typ: Some(bollard::models::MountType::VOLUME),
                ..Default::default()
            });
            bare_container(&docker, &name, mount).await;
            let t = Instant::now();
            agentbox::sandbox::remove_container(&docker, &name).await;
            if volume { &mut with_volume } else { &mut bare }.push(ms(t.elapsed()));
        }
    }
    row(
        "forced removal of a bare running container",
        &stats(bare),
        "ms",
        "the daemon's share",
    );
    row(
        "the same with an anonymous volume at /var/tmp",
        &stats(with_volume),
        "ms",
        "what the volume adds",
    );
    row("removal", &stats(remove), "ms", "");
    if cli_available() {
        let s = time_cmd(
            n,
            || {
                let mut c = Command::new("docker");
                c.args(["run", "--rm", "--network", "none"]);
                if let Some(r) = bench_runtime() {
                    c.args(["--runtime", &r]);
                }
                c.args([agentbox::sandbox::image::DEFAULT_IMAGE, "true"]);
                c
            },
            None,
        );
        row(
            "`docker run --rm IMAGE true` through the CLI (no policy)",
            &s,
            "ms",
            "for scale",
        );
    }
}

/// A task's first command: in a sandbox handed out by a warm pool (the project copied in after
/// the hand-out) against one started for it (the project copied into its volume first, as
/// `--isolate` and eval do without a pool). Each is timed from the moment the task asks.
async fn from_the_pool(n: usize, docker: &bollard::Docker, dir: &Path) {
    let dir = dir.to_path_buf();
    let owner = agentbox::sandbox::inspect_project(&dir).unwrap();
    let packed = agentbox::hostfs::isolate::pack(&dir, owner.uid, owner.gid, &|_| false).unwrap();
    let cfg = config(false);
    let first = ExecRequest::argv(["true"], Duration::from_secs(30));
    let (mut cold, mut warm, mut copy, mut take) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let spec = cfg.volume_spec(&dir, packed.tar.path()).unwrap();
        let sb = DockerSandbox::create(docker, spec).await.unwrap();
        sb.exec(first.clone()).await.unwrap();
        cold.push(ms(t.elapsed()));
        sb.shutdown().await.unwrap();
    }
    let pool = agentbox::sandbox::Pool::new(docker, 1).await.unwrap();
    let spec = cfg.volume_spec(&dir, packed.tar.path()).unwrap();
    // The first of its kind starts the filling.
    assert!(pool.take(&spec).await.is_none());
    for _ in 0..n {
        // A warm pool: the refill after the last hand-out is done by now.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t = Instant::now();
        let sb = pool.take(&spec).await.expect("a pooled sandbox");
        let t1 = Instant::now();
        sb.copy_in(packed.tar.path()).await.unwrap();
        let t2 = Instant::now();
        sb.exec(first.clone()).await.unwrap();
        warm.push(ms(t.elapsed()));
        take.push(ms(t1 - t));
        copy.push(ms(t2 - t1));
        sb.shutdown().await.unwrap();
    }
    pool.close().await;
    row(
        "cold: copy-in sandbox started → first command done",
        &stats(cold),
        "ms",
        "volume seeded, then create + start",
    );
    row(
        "warm pool: hand-out → project copied in → first command",
        &stats(warm),
        "ms",
        "target ≤ 100",
    );
    row("  of which the hand-out", &stats(take), "ms", "");
    row(
        "  of which the copy-in",
        &stats(copy),
        "ms",
        "tar in the sandbox, through the executor",
    );
}

/// A running container of the default image with no policy, no executor (`sleep 60`), in no
/// network, under the bench's runtime, labelled for gc; `mount` if given.
async fn bare_container(docker: &bollard::Docker, name: &str, mount: Option<bollard::models::Mount>) {
    docker
        .create_container(
            Some(
                bollard::query_parameters::CreateContainerOptionsBuilder::default()
                    .name(name)
                    .build(),
            ),
            bollard::models::ContainerCreateBody {
                image: Some(agentbox::sandbox::image::DEFAULT_IMAGE.into()),
                cmd: Some(vec!["sleep".into(), "60".into()]),
                labels: Some([("agentbox.session".to_string(), name.to_string())].into()),
                host_config: Some(bollard::models::HostConfig {
                    network_mode: Some("none".into()),
                    // The same runtime as the sandboxes, so the share compares.
                    runtime: bench_runtime(),
                    mounts: mount.map(|m| vec![m]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    docker
        .start_container(name, None::<bollard::query_parameters::StartContainerOptions>)
        .await
        .unwrap();
}

struct Quiet;
impl EventSink for Quiet {
    fn emit(&self, _: &Event<'_>) {}
}

/// 50 tool calls per session: 10 turns of five calls, then an answer.
fn load_script() -> String {
    let mut turns = Vec::new();
    for t in 0..10 {
        turns.push(json!({"tool_calls": [
            {"name": "list_files", "arguments": {}},
            {"name": "read_file", "arguments": {"path": "data.txt", "limit": 50}},
            {"name": "search", "arguments": {"pattern": "line 0001"}},
            {"name": "bash", "arguments": {"command": "true"}},
            {"name": "edit_file", "arguments": {"path": format!("out{t}.txt"), "old": "", "new": "x\n"}}
        ]}));
    }
    turns.push(json!({"text": "done"}));
    json!({ "turns": turns }).to_string()
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .unwrap_or(0.0)
        / 1024.0
}

/// In a child process (for its own peak RSS): N sessions at once, 50 tool calls each.
async fn load_child(n: usize) {
    let dirs: Vec<tempfile::TempDir> = (0..n)
        .map(|_| project_with(&[("data.txt", hundred_kb())]))
        .collect();
    let script = load_script();
    let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::new();
    for d in &dirs {
        let path = d.path().to_path_buf();
        let script = script.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let sb = sandbox(&path, false).await;
            barrier.wait().await;
            let model = Scripted::from_json(&script, "load").unwrap();
            let tools = ToolRegistry::standard(true, false);
            let settings = ToolSettings {
                test_commands: vec!["true".into()],
                ..Default::default()
            };
            let agent = Agent {
                model: &model,
                tools: &tools,
                ctx: ToolContext {
                    sandbox: &sb,
                    settings: &settings,
                    approver: None,
                },
                events: &Quiet,
                config: AgentConfig {
                    max_steps: 20,
                    ..Default::default()
                },
                system: String::new(),
                watch: None,
            };
            let mut messages = vec![Message::user_text("go")];
            let r = agent.run(&mut messages).await;
            assert_eq!(r.steps, 11, "{:?}", r.stop);
            let done = Instant::now();
            sb.shutdown().await.unwrap();
            done
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut last = started;
    for t in tasks {
        last = last.max(t.await.unwrap());
    }
    let secs = (last - started).as_secs_f64();
    println!(
        "{}",
        json!({"calls_per_sec": (n * 50) as f64 / secs, "secs": secs, "peak_rss_mib": peak_rss_mib()})
    );
}

/// In a child process: 1 GiB on stdout, through each exec mode.
async fn flood_child(per_call: bool) {
    let dir = project_with(&[]);
    let sb = sandbox(dir.path(), per_call).await;
    let t = Instant::now();
    let out = sb
        .exec(
            ExecRequest::shell("head -c 1073741824 /dev/zero", Duration::from_secs(300)).capture(4000, 8000),
        )
        .await
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(out.stdout.total, 1 << 30);
    sb.shutdown().await.unwrap();
    println!("{}", json!({"secs": secs, "peak_rss_mib": peak_rss_mib()}));
}

fn child(args: &[&str]) -> serde_json::Value {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

fn load_and_flood(repeats: usize) {
    for n in [1usize, 4, 16, 32] {
        let runs: Vec<serde_json::Value> = (0..repeats)
            .map(|_| child(&["child-load", &n.to_string()]))
            .collect();
        let cps = stats(
            runs.iter()
                .map(|r| r["calls_per_sec"].as_f64().unwrap())
                .collect(),
        );
        let rss = stats(runs.iter().map(|r| r["peak_rss_mib"].as_f64().unwrap()).collect());
        row(
            &format!("{n} concurrent sessions × 50 calls: tool calls/s"),
            &cps,
            "/s",
            "scripted model",
        );
        row(
            &format!("{n} concurrent sessions: host peak RSS"),
            &rss,
            "MiB",
            "whole process",
        );
    }
    for (mode, arg) in [
        ("persistent executor", "persistent"),
        ("one exec per call", "per-call"),
    ] {
        let runs: Vec<serde_json::Value> = (0..repeats).map(|_| child(&["child-flood", arg])).collect();
        row(
            &format!("1 GiB flood ({mode}): seconds"),
            &stats(runs.iter().map(|r| r["secs"].as_f64().unwrap()).collect()),
            "s",
            "",
        );
        row(
            &format!("1 GiB flood ({mode}): host peak RSS"),
            &stats(runs.iter().map(|r| r["peak_rss_mib"].as_f64().unwrap()).collect()),
            "MiB",
            "",
        );
    }
}

/// list_files and search on a generated 50 000-file repository.
async fn big_repo(n: usize) {
    let dir = tempfile::Builder::new()
        .prefix("agentbox-bench-repo-")
        .tempdir()
        .unwrap();
    for d in 0..500 {
        let sub = dir.path().join(format!("pkg{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..100 {
            let body = if d == 250 && f == 50 {
                "needle = 1\n".to_string()
            } else {
                format!("value_{d}_{f} = {f}\n")
            };
            std::fs::write(sub.join(format!("mod{f:03}.py")), body).unwrap();
        }
    }
    let sb = sandbox(dir.path(), false).await;
    let settings = ToolSettings::default();
    let tools = ToolRegistry::standard(true, false);
    let ctx = ToolContext {
        sandbox: &sb,
        settings: &settings,
        approver: None,
    };
    for (label, c) in [
        (
            "list_files on 50 000 files (shows 500)",
            call("list_files", json!({})),
        ),
        (
            "search on 50 000 files (one match)",
            call("search", json!({"pattern": "needle"})),
        ),
        (
            "search on 50 000 files (every file matches)",
            call("search", json!({"pattern": "= "})),
        ),
    ] {
        let mut xs = Vec::new();
        let mut size = 0;
        for _ in 0..n {
            let t = Instant::now();
            let r = tools.dispatch(&c, &ctx).await;
            xs.push(t.elapsed().as_secs_f64());
            assert!(!r.is_error(), "{}", r.content());
            size = r.content().len();
        }
        row(label, &stats(xs), "s", &format!("result {size} bytes"));
    }
    sb.shutdown().await.unwrap();
}

/// 500 directories of 100 small Python files each under `dir`.
fn fifty_thousand_files(dir: &Path) {
    for d in 0..500 {
        let sub = dir.join(format!("pkg{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..100 {
            std::fs::write(
                sub.join(format!("mod{f:03}.py")),
                format!("value_{d}_{f} = {f}\n"),
            )
            .unwrap();
        }
    }
}

/// Named environments of a 50 000-file project (`-- envs`), `n` rounds, each on environments of
/// its own: the first `exec --env` (the copy in), a resumed one (`true`), a turn changing 100
/// files, `env diff`, `env fork`, `env rewind 0`, `env merge` into the project, `env rm`; then
/// the disk one environment takes (its volume, its directory of record, manifest, checkpoints).
fn envs(n: usize) {
    let project = tempfile::Builder::new()
        .prefix("agentbox-bench-envs-")
        .tempdir()
        .unwrap();
    fifty_thousand_files(project.path());
    let data = tempfile::tempdir().unwrap();
    let agentbox = |args: &[&str]| {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .env("AGENTBOX_CONFIG", "")
            .env("AGENTBOX_DATA_DIR", data.path())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (t.elapsed().as_secs_f64(), out.stdout)
    };
    let p = project.path().to_str().unwrap().to_string();
    let change = "for d in $(seq 0 99); do echo changed > $(printf pkg%03d/mod000.py $d); done";
    let mut rows: Vec<(&str, Vec<f64>)> = [
        "env: first exec --env (copy 50 000 files in) -- true",
        "env: resumed exec --env -- true",
        "env: a turn changing 100 files (exec --env)",
        "env diff (100 files)",
        "env fork",
        "env rewind NAME 0 (100 files)",
        "env merge into the project (100 files)",
    ]
    .into_iter()
    .map(|r| (r, Vec::new()))
    .collect();
    let (mut volume_kb, mut dir_kb) = (0.0, 0.0);
    for i in 0..n {
        let (env, fork) = (format!("bench-{i}"), format!("bench-{i}-fork"));
        let exec = |cmd: &str| agentbox(&["exec", "--env", &env, &p, "--", "sh", "-c", cmd]).0;
        rows[0].1.push(exec("true"));
        rows[1].1.push(exec("true"));
        rows[2].1.push(exec(change));
        rows[3].1.push(agentbox(&["env", "diff", &env]).0);
        rows[4].1.push(agentbox(&["env", "fork", &env, &fork]).0);
        rows[5].1.push(agentbox(&["env", "rewind", &fork, "0"]).0);
        let (_, du) = agentbox(&["exec", "--env", &env, &p, "--", "du", "-sk", "."]);
        volume_kb = String::from_utf8_lossy(&du)
            .split_whitespace()
            .next()
            .and_then(|k| k.parse().ok())
            .unwrap_or(0.0);
        let du = Command::new("du")
            .args(["-sk"])
            .arg(data.path().join("envs").join(&env))
            .output()
            .unwrap();
        dir_kb = String::from_utf8_lossy(&du.stdout)
            .split_whitespace()
            .next()
            .and_then(|k| k.parse().ok())
            .unwrap_or(0.0);
        rows[6].1.push(agentbox(&["env", "merge", &env]).0);
        // The project back as it was, for the next round.
        let back = Command::new("sh")
            .args([
                "-c",
                "for d in $(seq 0 99); do printf 'value_%d_0 = 0\\n' $d > $(printf pkg%03d/mod000.py $d); done",
            ])
            .current_dir(project.path())
            .status()
            .unwrap();
        assert!(back.success());
        for e in [&env, &fork] {
            agentbox(&["env", "rm", e]);
        }
    }
    for (label, xs) in rows {
        row(label, &stats(xs), "s", "50 000 files of 17 bytes");
    }
    row(
        "env: its volume (the project's copy, after the turn)",
        &stats(vec![volume_kb / 1024.0]),
        "MB",
        "du -sk in the sandbox",
    );
    row(
        "env: its directory (record, manifest, 1 checkpoint, blobs)",
        &stats(vec![dir_kb / 1024.0]),
        "MB",
        "du -sk of envs/NAME",
    );
}

/// `agentbox eval` with the scripted provider over the example Python tasks (twice over, so 16
/// jobs have work): tasks per minute at 1, 4 and 16 jobs.
fn eval_throughput() {
    let tasks = tempfile::Builder::new()
        .prefix("agentbox-bench-tasks-")
        .tempdir()
        .unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tasks");
    let mut n = 0;
    for copy in 0..2 {
        for entry in std::fs::read_dir(&examples).unwrap() {
            let entry = entry.unwrap();
            // The Python tasks only (flat directories): the figures stay comparable with
            // earlier runs, and the Rust, Go and Node tasks would mostly time their compilers.
            if ["Cargo.toml", "go.mod", "package.json"]
                .iter()
                .any(|m| entry.path().join(m).exists())
            {
                continue;
            }
            let to = tasks
                .path()
                .join(format!("{}-{copy}", entry.file_name().to_string_lossy()));
            std::fs::create_dir_all(&to).unwrap();
            for f in std::fs::read_dir(entry.path()).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
            }
            n += 1;
        }
    }
    // Each job count with sandboxes made when their task starts (`--prepare-ahead 0`, as
    // before), made ahead (the default), and with a warm pool of as many (`--pool`, within half
    // the engine's memory), one after the other in this run.
    for (jobs, ahead, pool) in [1, 4, 16]
        .into_iter()
        .flat_map(|j| [(j, 0, 0), (j, j, 0), (j, j, j)])
    {
        let out = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let status = Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .args([
                "eval",
                "--provider",
                "scripted",
                "--jobs",
                &jobs.to_string(),
                "--prepare-ahead",
                &ahead.to_string(),
                "--pool",
                &pool.to_string(),
                "--out",
            ])
            .arg(out.path())
            .arg(tasks.path())
            .env("AGENTBOX_CONFIG", "")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(status.code() == Some(0), "eval failed: {status}");
        let per_min = n as f64 * 60.0 / secs;
        row(
            &format!(
                "eval, scripted, {n} tasks, --jobs {jobs} --prepare-ahead {ahead} --pool {pool}: tasks/min"
            ),
            &Stats {
                median: per_min,
                p90: per_min,
            },
            "/min",
            &format!("one run, {secs:.0} s"),
        );
    }
}

const PIPELINE: &str = "printf 'b\\na\\nc\\n' | sort | head -n 2";
const TEST_COMMAND: &str = "python3 -m pytest -q -p no:cacheprovider";

/// Writes the trajectory, as `agentbox run` does, and times every tool call from `ToolStarted`
/// to `ToolFinished`: the tool itself, with the loop's own work (the model turn, the message
/// list, the events) left outside.
struct ToolTimer {
    trajectory: agentbox::events::TrajectoryWriter,
    started: std::sync::Mutex<Option<Instant>>,
    inside: std::sync::Mutex<Vec<f64>>,
}

impl EventSink for ToolTimer {
    fn emit(&self, e: &Event<'_>) {
        self.trajectory.emit(e);
        match e {
            Event::ToolStarted { .. } => *self.started.lock().unwrap() = Some(Instant::now()),
            Event::ToolFinished { .. } => {
                if let Some(t) = self.started.lock().unwrap().take() {
                    self.inside.lock().unwrap().push(ms(t.elapsed()));
                }
            }
            _ => {}
        }
    }
}

/// One agent run in-process: one turn of `calls`, then an answer. Wall time, and the time
/// inside the tool calls (from the events).
async fn agent_run(sb: &DockerSandbox, settings: &ToolSettings, calls: &[serde_json::Value]) -> (f64, f64) {
    let script = json!({"turns": [{"tool_calls": calls}, {"text": "done"}]}).to_string();
    let model = Scripted::from_json(&script, "bench").unwrap();
    let tools = ToolRegistry::standard(true, false);
    let file = tempfile::NamedTempFile::new().unwrap();
    let timer = ToolTimer {
        trajectory: agentbox::events::TrajectoryWriter::create(
            file.path(),
            agentbox::events::Redactor::new(Vec::new()),
        )
        .unwrap(),
        started: Default::default(),
        inside: Default::default(),
    };
    let agent = Agent {
        model: &model,
        tools: &tools,
        ctx: ToolContext {
            sandbox: sb,
            settings,
            approver: None,
        },
        events: &timer,
        config: AgentConfig {
            max_steps: 5,
            max_calls_per_turn: calls.len().max(64),
            ..Default::default()
        },
        system: String::new(),
        watch: None,
    };
    let mut messages = vec![Message::user_text("go")];
    let t = Instant::now();
    let r = agent.run(&mut messages).await;
    let wall = ms(t.elapsed());
    assert_eq!(r.steps, 2, "{:?}", r.stop);
    // Every call must have run: none answered with an error (a refused or "not run" call costs
    // nothing and would look fast).
    for m in &messages {
        for b in &m.content {
            if let agentbox::model::Block::ToolResult(res) = b {
                assert!(!res.is_error, "{}", res.content);
            }
        }
    }
    let inside: f64 = timer.inside.lock().unwrap().iter().sum();
    (wall, inside)
}

/// Each tool through the whole loop with the scripted provider: a turn of N identical calls
/// minus a turn of one, divided by N-1 (the model turns and the session cancel out), median of
/// `repeats`; next to the same requests straight to the sandbox (no loop), the executor round
/// trip of `true`, and the nearest `docker exec` through the CLI, all in this run.
async fn through_the_loop(n: usize, repeats: usize) {
    let dir = project_with(&[
        ("app.py", b"def add(a, b):\n    return a + b\n".to_vec()),
        ("data.txt", b"alpha\nbeta\ngamma\n".to_vec()),
        ("edit.txt", b"alpha\n".to_vec()),
        (
            "test_app.py",
            b"from app import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n".to_vec(),
        ),
    ]);
    let sb = sandbox(dir.path(), false).await;
    let settings = ToolSettings {
        test_commands: vec![TEST_COMMAND.into()],
        ..Default::default()
    };
    let ctx = ToolContext {
        sandbox: &sb,
        settings: &settings,
        approver: None,
    };
    let ws = agentbox::workspace::Workspace::new(&sb);
    let cid = sb.info().container_id.clone();
    let uid = format!("{}:{}", sb.info().uid, sb.info().gid);
    let cli = cli_available();
    let docker_exec = |argv: &[&str]| {
        let mut c = Command::new("docker");
        c.args(["exec", "-u", &uid, "-w", "/workspace", &cid]).args(argv);
        c
    };
    let few = (n / 4).max(5);

    // The floor every row is compared with: the executor round trip of `true`.
    let (mut xs, mut inner) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let out = sb
            .exec(ExecRequest::argv(["true"], Duration::from_secs(30)))
            .await
            .unwrap();
        xs.push(ms(t.elapsed()));
        inner.push(ms(out.elapsed));
    }
    let floor = stats(xs);
    row(
        "loop: `true` round trip, executor only (the floor)",
        &floor,
        "ms",
        "",
    );
    row(
        "      of which in the container: spawn → exit → sweep",
        &stats(inner),
        "ms",
        "the executor's own timer",
    );
    // What the after-command sweep costs, timed in the container by a process of the sandbox
    // user doing the same work (signal 0 instead of SIGKILL, and no waitpid).
    let probe = "import os,time\nme=os.getpid();uid=os.getuid()\ndef sweep():\n    try: os.kill(-1,0)\n    except OSError: pass\n    n=0\n    for p in os.listdir('/proc'):\n        if not p.isdigit() or int(p) in (1,me): continue\n        try:\n            if os.stat('/proc/'+p).st_uid!=uid: continue\n            open('/proc/'+p+'/stat','rb').read()\n        except OSError: pass\n    return n\nsweep()\nt=time.perf_counter()\nfor _ in range(200): sweep()\nprint((time.perf_counter()-t)/200*1000)\n";
    let out = sb
        .exec(ExecRequest::argv(
            ["python3", "-c", probe],
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    let sweep_ms: f64 = out.stdout.to_text().trim().parse().unwrap_or(f64::NAN);
    row(
        "      of which the sweep (one round, idle sandbox)",
        &Stats {
            median: sweep_ms,
            p90: sweep_ms,
        },
        "ms",
        "timed in the container",
    );

    type Direct<'a> = Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = f64> + 'a>> + 'a>;
    let shell_direct = |cmd: &'static str| -> Direct<'_> {
        let ctx = &ctx;
        Box::new(move || {
            Box::pin(async move {
                let t = Instant::now();
                let out = ctx.shell(cmd).await.unwrap();
                assert!(out.success());
                ms(t.elapsed())
            })
        })
    };
    let ws_ref = &ws;
    // (label, the calls of one round, the same requests without the loop, the nearest
    // `docker exec`, how many calls)
    type Case<'a> = (
        &'static str,
        Vec<serde_json::Value>,
        Direct<'a>,
        Option<Command>,
        usize,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "bash `true`",
            vec![json!({"name": "bash", "arguments": {"command": "true"}})],
            shell_direct("true"),
            Some(docker_exec(&["bash", "-c", "true"])),
            n,
        ),
        (
            "bash, a small pipeline",
            vec![json!({"name": "bash", "arguments": {"command": PIPELINE}})],
            shell_direct(PIPELINE),
            Some(docker_exec(&["bash", "-c", PIPELINE])),
            n,
        ),
        (
            "list_files (4 files)",
            vec![json!({"name": "list_files", "arguments": {}})],
            Box::new(move || {
                Box::pin(async move {
                    let t = Instant::now();
                    ws_ref.list(".", 500).await.unwrap();
                    ms(t.elapsed())
                })
            }),
            Some(docker_exec(&["rg", "--files", "--sort", "path"])),
            n,
        ),
        (
            "search (one match)",
            vec![json!({"name": "search", "arguments": {"pattern": "gamma"}})],
            Box::new(move || {
                Box::pin(async move {
                    let t = Instant::now();
                    ws_ref.search("gamma", ".", 200).await.unwrap();
                    ms(t.elapsed())
                })
            }),
            Some(docker_exec(&["rg", "-n", "--sort", "path", "gamma"])),
            n,
        ),
        (
            "read_file (3 lines)",
            vec![json!({"name": "read_file", "arguments": {"path": "data.txt"}})],
            Box::new(move || {
                Box::pin(async move {
                    let t = Instant::now();
                    ws_ref.read("data.txt", 1 << 20).await.unwrap();
                    ms(t.elapsed())
                })
            }),
            Some(docker_exec(&["cat", "data.txt"])),
            n,
        ),
        (
            "edit_file (read, replace, write)",
            // Identical in cost, alternating so that each one succeeds.
            vec![
                json!({"name": "edit_file", "arguments": {"path": "edit.txt", "old": "alpha", "new": "beta"}}),
                json!({"name": "edit_file", "arguments": {"path": "edit.txt", "old": "beta", "new": "alpha"}}),
            ],
            Box::new(move || {
                Box::pin(async move {
                    let t = Instant::now();
                    let f = ws_ref.read("edit.txt", 1 << 20).await.unwrap();
                    ws_ref.replace("edit.txt", f.data).await.unwrap();
                    ms(t.elapsed())
                })
            }),
            Some(docker_exec(&[
                "sh",
                "-c",
                "cat edit.txt > .e.tmp && mv .e.tmp edit.txt",
            ])),
            n,
        ),
        (
            "run_tests (one passing pytest test)",
            vec![json!({"name": "run_tests", "arguments": {}})],
            shell_direct(TEST_COMMAND),
            Some(docker_exec(&["bash", "-c", TEST_COMMAND])),
            few,
        ),
    ];
    for (label, pattern, direct, cmd, calls) in cases {
        let calls = calls.max(3);
        let many: Vec<serde_json::Value> = (0..calls).map(|i| pattern[i % pattern.len()].clone()).collect();
        let one = &many[..pattern.len()];
        let mut per_call = Vec::new();
        let mut inside = Vec::new();
        for _ in 0..repeats {
            let (w1, i1) = agent_run(&sb, &settings, one).await;
            let (wn, i_n) = agent_run(&sb, &settings, &many).await;
            let extra = (many.len() - one.len()) as f64;
            per_call.push((wn - w1) / extra);
            inside.push((i_n - i1) / extra);
        }
        let mut xs = Vec::new();
        for _ in 0..calls {
            xs.push(direct().await);
        }
        let looped = stats(per_call);
        let direct = stats(xs);
        let note = format!(
            "{:.1}× the floor; in the tool (started→finished) {:.2}; its requests alone {:.2}",
            looped.median / floor.median,
            stats(inside).median,
            direct.median
        );
        row(&format!("loop: {label}"), &looped, "ms", &note);
        if cli && let Some(cmd) = cmd {
            let s = time_cmd(
                calls.min(n / 2).max(3),
                || {
                    let mut c = Command::new(cmd.get_program());
                    c.args(cmd.get_args());
                    c
                },
                None,
            );
            row(
                "      `docker exec` through the CLI, the nearest command",
                &s,
                "ms",
                "",
            );
        }
    }
    sb.shutdown().await.unwrap();
}

#[tokio::main]
async fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<String> = raw.iter().filter(|a| *a != "--bench").cloned().collect();
    match args.first().map(String::as_str) {
        Some("child-load") => return load_child(args[1].parse().unwrap()).await,
        Some("child-flood") => return flood_child(args[1] == "per-call").await,
        _ => {}
    }
    // `cargo test --all-targets` runs bench binaries without `--bench`: do not start a
    // many-minute benchmark from a test run.
    if !raw.iter().any(|a| a == "--bench") {
        println!("benchmarks run with `cargo bench --bench bench` (or `just bench`)");
        return;
    }
    let quick = args.iter().any(|a| a == "quick");
    let (n, starts, repeats, repo) = if quick { (20, 5, 1, 2) } else { (200, 20, 3, 5) };
    println!(
        "agentbox benchmarks ({} mode, runtime {}): median and p90 of repeated runs, all measured in this run\n",
        if quick { "quick" } else { "full" },
        bench_runtime().as_deref().unwrap_or("the daemon's default")
    );
    println!(
        "| {:<58} | {:>9} | {:>9} | unit  | note |",
        "what", "median", "p90"
    );
    println!(
        "|{}|{}|{}|-------|------|",
        "-".repeat(60),
        "-".repeat(11),
        "-".repeat(11)
    );
    // `-- eval` and `-- startup`: only those rows (run the second one with DOCKER_HOST set to
    // compare engines or storage drivers).
    if args.iter().any(|a| a == "eval") {
        return eval_throughput();
    }
    if args.iter().any(|a| a == "startup") {
        return startup(starts).await;
    }
    // `-- round-trips`: only the per-call rows (with DOCKER_HOST set, to compare engines).
    if args.iter().any(|a| a == "round-trips") {
        return round_trips(n).await;
    }
    // `-- egress`: the egress proxy's added latency and its throughput, on loopback.
    if args.iter().any(|a| a == "egress") {
        return egress(if quick { 50 } else { 300 }, if quick { 2 } else { 5 }).await;
    }
    // `-- caches`: setup's build cache, a cold and a warm `cargo test` and `go test`, and what
    // a session's copy of a 500 MB build cache costs at its start.
    if args.iter().any(|a| a == "caches") {
        return build_caches(if quick { 2 } else { 5 }).await;
    }
    // `-- publish`: a published port's added latency and its throughput, against loopback.
    if args.iter().any(|a| a == "publish") {
        return publish(if quick { 50 } else { 300 }, if quick { 2 } else { 5 }).await;
    }
    // `-- envs`: named environments of a 50 000-file project: made, resumed, forked, diffed,
    // merged, rewound, and what one costs on disk.
    if args.iter().any(|a| a == "envs") {
        return envs(if quick { 2 } else { 5 });
    }
    // `-- gateway`: the model gateway's added latency per request, on loopback.
    if args.iter().any(|a| a == "gateway") {
        return gateway(if quick { 50 } else { 300 }).await;
    }
    through_the_loop(if quick { 40 } else { 100 }, if quick { 3 } else { 5 }).await;
    // `-- quick loop`: only the rows above, for working on them.
    if args.iter().any(|a| a == "loop") {
        return;
    }
    round_trips(n).await;
    startup(starts).await;
    load_and_flood(repeats);
    big_repo(repo).await;
    eval_throughput();
    publish(300, 5).await;
    gateway(300).await;
    build_caches(repeats).await;
}

/// Milliseconds the test command took in one `agentbox exec` session of `project` (measured
/// inside the sandbox: the session's start, and setup, are not in it). `cold`: the session's
/// copy of the build cache is emptied first, as every session was before setup pre-built.
fn test_in_session(project: &Path, command: &str, cold: bool) -> f64 {
    let clear = if cold {
        "rm -rf \"$CARGO_TARGET_DIR\" \"$GOCACHE\"; "
    } else {
        ""
    };
    let script = format!(
        "{clear}s=$(date +%s%N); {command} >/tmp/out 2>&1 || {{ tail -20 /tmp/out >&2; exit 1; }}; \
         e=$(date +%s%N); echo $(((e - s) / 1000000))"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_CONFIG", "")
        .args(["exec", "--command-timeout", "900"])
        .arg(project)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Setup's build cache: `cargo test` of a crate with registry dependencies, and `go test` of a
/// module using the standard library, cold (an empty target directory and Go cache, as every
/// session had before) and warm (the session's copy of what setup pre-built); and the cost of
/// that copy at a session's start for a 500 MB build cache.
async fn build_caches(repeats: usize) {
    let rust = project_with(&[
        (
            "Cargo.toml",
            b"[package]\nname = \"bench-warm\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
              [dependencies]\nregex = \"1\"\n"
                .to_vec(),
        ),
        (
            "src/lib.rs",
            b"pub fn digits(s: &str) -> usize { regex::Regex::new(r\"[0-9]\").unwrap().find_iter(s).count() }\n\
              #[cfg(test)]\nmod tests { #[test] fn two() { assert_eq!(super::digits(\"a1b2\"), 2); } }\n"
                .to_vec(),
        ),
    ]);
    let go = project_with(&[
        ("go.mod", b"module bench.example/warm\n\ngo 1.21\n".to_vec()),
        (
            "warm.go",
            b"package warm\n\nimport (\n\t\"encoding/json\"\n\t\"net/http\"\n)\n\n\
              func Status() string { b, _ := json.Marshal(http.StatusOK); return string(b) }\n"
                .to_vec(),
        ),
        (
            "warm_test.go",
            b"package warm\n\nimport \"testing\"\n\nfunc TestStatus(t *testing.T) { if Status() != \"200\" { t.Fatal(Status()) } }\n"
                .to_vec(),
        ),
    ]);
    for (label, dir, command) in [
        ("Rust (regex)", rust.path(), "cargo test"),
        ("Go (stdlib)", go.path(), "go test ./..."),
    ] {
        // The first session fills setup's cache; it is not measured.
        test_in_session(dir, "true", false);
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            cold.push(test_in_session(dir, command, true) / 1000.0);
            warm.push(test_in_session(dir, command, false) / 1000.0);
        }
        let (cold, warm) = (stats(cold), stats(warm));
        row(
            &format!("`{command}`, {label}: cold"),
            &cold,
            "s",
            "empty target / GOCACHE",
        );
        row(
            &format!("`{command}`, {label}: warm"),
            &warm,
            "s",
            &format!(
                "setup's pre-built cache; {:.1}x faster",
                cold.median / warm.median.max(1e-9)
            ),
        );
    }
    // This run's caches only: the markers first, so none is ever trusted half-removed.
    let docker = connect_docker().await.expect("docker");
    let ours: Vec<String> = [rust.path(), go.path()]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut caches = agentbox::sandbox::caches::list(&docker).await.unwrap();
    caches.sort_by_key(|(name, _)| !name.ends_with(agentbox::sandbox::caches::COMMITTED));
    for (name, project) in caches {
        if ours.contains(&project) {
            agentbox::sandbox::caches::remove(&docker, &name).await;
        }
    }
    session_copy_cost(repeats).await;
}

/// A session's start with a 500 MB build cache to copy in, against the same start without it.
async fn session_copy_cost(repeats: usize) {
    use agentbox::project::setup::{BUILD_DIR, DEPS_DIR};
    use agentbox::sandbox::VolumeMount;
    let docker = connect_docker().await.expect("docker");
    let dir = project_with(&[("README", b"bench\n".to_vec())]);
    let name = format!("agentbox-bench-cache-{}", std::process::id());
    let base = config(false);
    let spec = base.bind_spec(dir.path()).unwrap();
    let labels = std::collections::HashMap::from([(
        agentbox::sandbox::caches::CACHE_LABEL.to_string(),
        "bench".to_string(),
    )]);
    let registration = agentbox::sandbox::caches::create(&docker, &spec, &name, labels)
        .await
        .expect("cache volume");
    let with = |read_only: bool, seed: bool| {
        let mut cfg = base.clone();
        cfg.extras.volumes = vec![VolumeMount {
            name: name.clone(),
            target: DEPS_DIR.to_string(),
            read_only,
        }];
        cfg.extras.seed = seed.then(|| BUILD_DIR.to_string());
        cfg.bind_spec(dir.path()).unwrap()
    };
    // 500 MB as a target directory holds it: 2,000 files of 256 KB in 20 directories.
    let filler = DockerSandbox::create(&docker, with(false, false)).await.unwrap();
    let fill = format!(
        "for d in $(seq 1 20); do mkdir -p {BUILD_DIR}/cargo-target/debug/d$d; for f in $(seq 1 100); do \
         head -c 262144 /dev/urandom > {BUILD_DIR}/cargo-target/debug/d$d/f$f; done; done; du -sm {BUILD_DIR}"
    );
    let out = filler
        .exec(ExecRequest::argv(["sh", "-c", &fill], Duration::from_secs(600)))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr.to_text());
    let size = out.stdout.to_text();
    filler.shutdown().await.unwrap();
    let (mut plain, mut seeded) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        for (seed, into) in [(false, &mut plain), (true, &mut seeded)] {
            let t = Instant::now();
            let sb = DockerSandbox::create(&docker, with(true, seed)).await.unwrap();
            into.push(ms(t.elapsed()));
            sb.shutdown().await.unwrap();
        }
    }
    let (plain, seeded) = (stats(plain), stats(seeded));
    row("session start, build cache mounted, not copied", &plain, "ms", "");
    row(
        "session start, copying a 500 MB build cache",
        &seeded,
        "ms",
        &format!(
            "{} MB; the copy: {:.0} ms",
            size.split_whitespace().next().unwrap_or("?"),
            seeded.median - plain.median
        ),
    );
    agentbox::sandbox::caches::discard(&docker, &spec, &name, registration).await;
}

/// The same HTTP server on both sides of the comparison (python3's sockets, one thread per
/// connection): `/small` is 100 bytes, `/big` 100 MB. It prints its port once it listens.
const PUBLISH_SERVER: &str = r#"
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(128)
print(srv.getsockname()[1], flush=True)
zeros = bytes(256 * 1024)
def serve(c):
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = c.recv(4096)
        if not b:
            c.close()
            return
        buf += b
    n = 100_000_000 if b" /big " in buf else 100
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n)
    while n > 0:
        k = min(n, len(zeros))
        c.sendall(zeros[:k])
        n -= k
    c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// `--publish`: a request from the host through a published port to a server in the
/// sandbox, against the same server on the host's loopback, same client, same run.
async fn publish(n: usize, repeats: usize) {
    use agentbox::sandbox::publish::{PublishSpec, Publisher};
    // Direct: the server on this machine's loopback.
    let mut host_server = Command::new("python3")
        .args(["-c", PUBLISH_SERVER, "0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 on the host");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(host_server.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let direct_addr: std::net::SocketAddr = format!("127.0.0.1:{}", line.trim()).parse().unwrap();
    // Published: the same server in a sandbox, its port 8000 published on any free host port.
    let publisher = Publisher::start(PublishSpec::parse("0:8000").unwrap()).unwrap();
    let published_addr = publisher.local_addr();
    let project = project_with(&[("server.py", PUBLISH_SERVER.as_bytes().to_vec())]);
    let mut cfg = config(false);
    cfg.extras.forwards = vec![publisher.forward()];
    let docker = connect_docker().await.unwrap();
    let sb = DockerSandbox::create(&docker, cfg.bind_spec(project.path()).unwrap())
        .await
        .unwrap();
    let cmd = "python3 /workspace/server.py 8000";
    sb.start_process(
        ExecRequest::shell(cmd, Duration::from_secs(3600)),
        cmd.into(),
        Duration::from_millis(500),
    )
    .await
    .unwrap()
    .unwrap();
    publisher.ready().await;
    let request = |addr: std::net::SocketAddr, path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", addr.port())
    };
    // Until the server inside answers.
    let start = Instant::now();
    while read_all(
        tokio::net::TcpStream::connect(published_addr).await.unwrap(),
        &request(published_addr, "/small"),
    )
    .await
        == 0
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the sandbox's server never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let got = read_all(
            tokio::net::TcpStream::connect(direct_addr).await.unwrap(),
            &request(direct_addr, "/small"),
        )
        .await;
        assert!(got > 100);
        direct.push(ms(t.elapsed()));
        let t = Instant::now();
        let got = read_all(
            tokio::net::TcpStream::connect(published_addr).await.unwrap(),
            &request(published_addr, "/small"),
        )
        .await;
        assert!(got > 100);
        via.push(ms(t.elapsed()));
    }
    let (d, v) = (stats(direct), stats(via));
    row(
        "publish: 100-byte GET, a connection each, direct on loopback",
        &d,
        "ms",
        &format!("n={n}; the same python3 server on the host"),
    );
    row(
        "publish: 100-byte GET, a connection each, published port",
        &v,
        "ms",
        &format!(
            "n={n}; added {:.2} ms, {:.1}x",
            v.median - d.median,
            v.median / d.median
        ),
    );
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = Instant::now();
        let got = read_all(
            tokio::net::TcpStream::connect(direct_addr).await.unwrap(),
            &request(direct_addr, "/big"),
        )
        .await;
        assert!(got > 100_000_000);
        direct.push(100.0 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let got = read_all(
            tokio::net::TcpStream::connect(published_addr).await.unwrap(),
            &request(published_addr, "/big"),
        )
        .await;
        assert!(got > 100_000_000);
        via.push(100.0 / t.elapsed().as_secs_f64());
    }
    let (d, v) = (stats(direct), stats(via));
    row(
        "publish: 100 MB download, direct on loopback",
        &d,
        "MB/s",
        &format!("n={repeats}"),
    );
    row(
        "publish: 100 MB download, published port",
        &v,
        "MB/s",
        &format!("n={repeats}; {:.2}x direct", v.median / d.median),
    );
    drop(publisher);
    sb.shutdown().await.unwrap();
    let _ = host_server.kill();
    let _ = host_server.wait();
}

/// A loopback HTTP server: `/small` (100 bytes) and `/big` (100 MB), one request per
/// connection.
async fn bench_upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let big = String::from_utf8_lossy(&buf).contains(" /big ");
                let len: u64 = if big { 100_000_000 } else { 100 };
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
                let _ = s.write_all(head.as_bytes()).await;
                let zeros = vec![0u8; 256 * 1024];
                let mut left = len;
                while left > 0 {
                    let k = left.min(zeros.len() as u64) as usize;
                    if s.write_all(&zeros[..k]).await.is_err() {
                        return;
                    }
                    left -= k as u64;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

async fn read_all<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, request: &str) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut n = 0;
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return n,
            Ok(k) => n += k,
        }
    }
}

async fn egress(n: usize, repeats: usize) {
    use agentbox::egress::{Allowlist, Limits, Policy, Proxy, StaticResolver};
    let addr = bench_upstream().await;
    let port = addr.port();
    let policy = Policy {
        allowlist: Allowlist::parse(&[format!("127.0.0.1:{port}")]).unwrap(),
        resolver: Arc::new(StaticResolver::default()),
        own: Default::default(),
    };
    let proxy = Proxy::start(policy, Limits::default(), None).unwrap();
    let sock = proxy.socket_path().to_path_buf();
    let origin = "GET /small HTTP/1.1\r\nHost: x\r\n\r\n".to_string();
    let absolute = format!("GET http://127.0.0.1:{port}/small HTTP/1.1\r\nHost: x\r\n\r\n");
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        read_all(tokio::net::TcpStream::connect(addr).await.unwrap(), &origin).await;
        direct.push(ms(t.elapsed()));
        let t = Instant::now();
        read_all(tokio::net::UnixStream::connect(&sock).await.unwrap(), &absolute).await;
        via.push(ms(t.elapsed()));
    }
    let (d, v) = (stats(direct), stats(via));
    row(
        "egress: 100-byte GET, direct to the loopback server",
        &d,
        "ms",
        &format!("n={n}"),
    );
    row(
        "egress: 100-byte GET through the proxy (host side)",
        &v,
        "ms",
        &format!("n={n}; added {:.2} ms", v.median - d.median),
    );
    let big_origin = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n".to_string();
    let big_absolute = format!("GET http://127.0.0.1:{port}/big HTTP/1.1\r\nHost: x\r\n\r\n");
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = Instant::now();
        let got = read_all(tokio::net::TcpStream::connect(addr).await.unwrap(), &big_origin).await;
        assert!(got > 100_000_000);
        direct.push(100.0 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let got = read_all(
            tokio::net::UnixStream::connect(&sock).await.unwrap(),
            &big_absolute,
        )
        .await;
        assert!(got > 100_000_000);
        via.push(100.0 / t.elapsed().as_secs_f64());
    }
    row(
        "egress: 100 MB download, direct",
        &stats(direct),
        "MB/s",
        &format!("n={repeats}"),
    );
    row(
        "egress: 100 MB download through the proxy (host side)",
        &stats(via),
        "MB/s",
        &format!("n={repeats}"),
    );
    // From inside a sandbox: the executor's loopback forwarder, then the proxy.
    let project = project_with(&[]);
    let mut cfg = config(false);
    cfg.extras.forwards = vec![agentbox::sandbox::Forward::egress(sock.clone())];
    let docker = connect_docker().await.unwrap();
    let sb = DockerSandbox::create(&docker, cfg.bind_spec(project.path()).unwrap())
        .await
        .unwrap();
    let script = format!(
        r#"
import socket, time
def get(path):
    t = time.monotonic()
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"GET http://127.0.0.1:{port}" + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    n = 0
    while True:
        b = s.recv(262144)
        if not b:
            break
        n += len(b)
    s.close()
    return time.monotonic() - t, n
small = sorted(get(b"/small")[0] * 1000 for _ in range({n}))
big = sorted(100 / get(b"/big")[0] for _ in range({repeats}))
print(small[len(small) // 2], small[int((len(small) - 1) * 0.9)], big[len(big) // 2], big[int((len(big) - 1) * 0.9)])
"#
    );
    let out = sb
        .exec(ExecRequest::argv(
            ["python3", "-c", script.as_str()],
            Duration::from_secs(600),
        ))
        .await
        .unwrap();
    let nums: Vec<f64> = out
        .stdout
        .to_text()
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    if nums.len() == 4 {
        row(
            "egress: 100-byte GET from the sandbox (forwarder + proxy)",
            &Stats {
                median: nums[0],
                p90: nums[1],
            },
            "ms",
            &format!("n={n}; python3 client in the sandbox"),
        );
        row(
            "egress: 100 MB download from the sandbox (forwarder + proxy)",
            &Stats {
                median: nums[2],
                p90: nums[3],
            },
            "MB/s",
            &format!("n={repeats}"),
        );
    } else {
        println!(
            "sandbox egress rows failed: {} {}",
            out.stdout.to_text(),
            out.stderr.to_text()
        );
    }
    sb.shutdown().await.unwrap();
}

/// An OpenAI-compatible upstream on the host's loopback: every POST gets one small chat
/// completion (with its usage), a connection each.
const CHAT_SERVER: &str = r#"
import http.server, json, sys
BODY = json.dumps({"id": "c", "object": "chat.completion", "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2}}).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// The client on both sides: N chat completions, a connection each, each timed (ms, JSON).
const CHAT_CLIENT: &str = r#"
import json, sys, time, urllib.request
base, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode()
out = []
for i in range(n + 5):
    req = urllib.request.Request(base + "/chat/completions", data=body, method="POST")
    req.add_header("content-type", "application/json")
    req.add_header("authorization", "Bearer " + key)
    t = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        r.read()
    if i >= 5:
        out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"#;

/// `--model-gateway`: one chat completion from inside a sandbox through its loopback endpoint
/// (the executor's forwarder, the host's gateway, its checks, reqwest to the upstream), against
/// the same client on the host calling the same upstream directly; same run.
async fn gateway(n: usize) {
    use agentbox::gateway::{Gateway, Provider, Settings, Upstream};
    let mut upstream = Command::new("python3")
        .args(["-c", CHAT_SERVER])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 on the host");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(upstream.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{}/v1", line.trim());
    let direct = Command::new("python3")
        .args(["-c", CHAT_CLIENT, &base, "host-key", &n.to_string()])
        .output()
        .unwrap();
    let direct: Vec<f64> = serde_json::from_slice(&direct.stdout).unwrap();
    let gw = Gateway::start(
        Settings {
            upstreams: vec![Upstream {
                provider: Provider::Openai,
                base_url: base.parse().unwrap(),
                key: Some("host-key".into()),
            }],
            models: vec!["gpt-4o-mini".into()],
            allow_tools: vec![],
            budget_tokens: None,
            budget_usd: None,
            max_body: agentbox::gateway::MAX_BODY,
            max_concurrent: agentbox::gateway::MAX_CONCURRENT,
            request_timeout: Duration::from_secs(60),
        },
        Arc::new(|_: &agentbox::gateway::Record| {}),
    )
    .unwrap();
    let project = project_with(&[("client.py", CHAT_CLIENT.as_bytes().to_vec())]);
    let mut cfg = config(false);
    cfg.extras.forwards = gw.forwards();
    cfg.extras.env = gw.sandbox_env();
    let docker = connect_docker().await.unwrap();
    let sb = DockerSandbox::create(&docker, cfg.bind_spec(project.path()).unwrap())
        .await
        .unwrap();
    let cmd = format!("python3 /workspace/client.py \"$OPENAI_BASE_URL\" \"$OPENAI_API_KEY\" {n}");
    let out = sb
        .exec(ExecRequest::shell(&cmd, Duration::from_secs(600)))
        .await
        .unwrap();
    let via: Vec<f64> = serde_json::from_slice(&out.stdout.bytes().unwrap()).unwrap_or_else(|_| {
        panic!(
            "the client inside: {}",
            String::from_utf8_lossy(&out.stderr.bytes().unwrap_or_default())
        )
    });
    let (d, v) = (stats(direct), stats(via));
    row(
        "gateway: a chat completion, a connection each, direct on loopback",
        &d,
        "ms",
        &format!("n={n}; python3 urllib on the host, a python3 upstream"),
    );
    row(
        "gateway: the same from inside the sandbox, through the gateway",
        &v,
        "ms",
        &format!(
            "n={n}; added {:.2} ms, {:.1}x (forwarder + gateway + checks)",
            v.median - d.median,
            v.median / d.median
        ),
    );
    sb.shutdown().await.unwrap();
    drop(gw);
    let _ = upstream.kill();
    let _ = upstream.wait();
}
