//! Faults from outside the repository: the model provider misbehaving on the wire, and Docker
//! failing under a run. Each ends in a retry or a clear error, never a panic, never a
//! duplicated tool call, never a container left behind.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::model_server::{ModelServer, Reply, anthropic_turn, openai_turn};
use crate::support::*;
use serde_json::{Value, json};

const KEY: &str = "sk-ant-faults-sentinel-5e0a";

/// Something to do while agentbox runs, given its pid and trajectory path.
type During = Box<dyn FnOnce(u32, PathBuf) -> tokio::task::JoinHandle<()> + Send>;

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    events: Vec<Value>,
}

async fn run_agentbox(project: &Project, args: &[&str], env: &[(&str, &str)], during: Option<During>) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let trajectory = dir.path().join("t.jsonl");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.arg("run")
        .arg("--trajectory")
        .arg(&trajectory)
        .args(args)
        .arg(project.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let side = during.map(|f| f(pid, trajectory.clone()));
    let out = tokio::time::timeout(Duration::from_secs(240), child.wait_with_output())
        .await
        .expect("agentbox hung")
        .unwrap();
    if let Some(s) = side {
        s.await.unwrap();
    }
    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "a container outlived the run");
    let events = std::fs::read_to_string(&trajectory)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Out {
        code: out.status.code(),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        events,
    }
}

fn counter_turn() -> Value {
    anthropic_turn(
        "",
        &[(
            "bash",
            json!({"command": "echo ran >> count.txt; wc -l < count.txt"}),
        )],
    )
}

async fn with_server(replies: Vec<Reply>, extra: &[&str]) -> (Out, ModelServer, Project) {
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let server = ModelServer::start(replies).await;
    let url = server.anthropic_url();
    let mut args = vec!["--provider", "anthropic", "--base-url", url.as_str()];
    args.extend_from_slice(extra);
    let out = run_agentbox(&project, &args, &[("ANTHROPIC_API_KEY", KEY)], None).await;
    (out, server, project)
}

fn retries(out: &Out) -> Vec<Value> {
    out.events
        .iter()
        .filter(|e| e["event"] == "retry")
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_retried_after_the_time_the_server_asks() {
    let (out, server, project) = with_server(
        vec![
            Reply::status(
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
            )
            .with_header("retry-after", "1"),
            Reply::ok(counter_turn()),
            Reply::ok(anthropic_turn("done", &[])),
        ],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let r = retries(&out);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["wait_ms"], 1000, "retry-after honoured");
    assert!(r[0]["reason"].as_str().unwrap().contains("429: slow down"));
    assert_eq!(server.requests().len(), 3);
    assert_eq!(
        server.requests()[0].raw,
        server.requests()[1].raw,
        "the same request again"
    );
    assert_eq!(project.read("count.txt"), "ran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_and_server_errors_back_off_then_succeed() {
    let (out, server, project) = with_server(
        vec![
            Reply::status(
                529,
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
            Reply::status(
                500,
                json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}),
            ),
            Reply::ok(counter_turn()),
            Reply::ok(anthropic_turn("done", &[])),
        ],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let r = retries(&out);
    assert_eq!(r.len(), 2);
    let waits: Vec<u64> = r.iter().map(|e| e["wait_ms"].as_u64().unwrap()).collect();
    assert!(waits[1] > waits[0], "exponential backoff: {waits:?}");
    assert!(out.stderr.contains("retry 1 in"), "{}", out.stderr);
    assert_eq!(server.requests().len(), 4);
    assert_eq!(project.read("count.txt"), "ran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_the_server_cannot_parse_goes_back_to_the_model_without_retries() {
    // llama.cpp's server answers 500 when the model's own tool call is not valid JSON (a reply
    // cut off at max_tokens, or looping): the same request would only produce it again.
    let llama_500 = json!({"error": {"code": 500, "type": "server_error",
        "message": "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error at line 1, column 4940: syntax error while parsing value - invalid string: missing closing quote"}});
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let server = ModelServer::start(vec![
        Reply::status(500, llama_500),
        Reply::ok(openai_turn(
            "",
            &[("bash", json!({"command": "echo ran >> count.txt"}))],
        )),
        Reply::ok(openai_turn("done", &[])),
    ])
    .await;
    let url = server.openai_url();
    let out = run_agentbox(
        &project,
        &[
            "--provider",
            "openai",
            "--base-url",
            url.as_str(),
            "--model",
            "local",
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(retries(&out).is_empty(), "not retried: {:?}", retries(&out));
    assert!(
        out.stderr
            .contains("could not read the model's reply as a tool call"),
        "{}",
        out.stderr
    );
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    let told = reqs[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(told["role"], "user");
    assert!(
        told["content"]
            .to_string()
            .contains("could not be read as a tool call"),
        "{told}"
    );
    assert_eq!(project.read("count.txt"), "ran\n", "the loop went on");
    let steps = out
        .events
        .iter()
        .filter(|e| e["event"] == "model_request")
        .count();
    assert_eq!(steps, 3, "the unreadable reply cost one step");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_slower_than_the_timeout_is_retried_and_its_tools_run_once() {
    let (out, server, project) = with_server(
        vec![
            Reply::Delay(Duration::from_secs(5), Box::new(Reply::ok(counter_turn()))),
            Reply::ok(counter_turn()),
            Reply::ok(anthropic_turn("done", &[])),
        ],
        &["--request-timeout", "2"],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        retries(&out)[0]["reason"]
            .as_str()
            .unwrap()
            .contains("request timeout"),
        "{:?}",
        retries(&out)
    );
    assert_eq!(server.requests().len(), 3);
    assert_eq!(
        project.read("count.txt"),
        "ran\n",
        "the tool call ran exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_body_is_retried() {
    let body = counter_turn().to_string();
    let (out, server, project) = with_server(
        vec![
            Reply::Truncated {
                declared: body.len(),
                body: body.as_bytes()[..body.len() / 2].to_vec(),
            },
            Reply::ok(counter_turn()),
            Reply::ok(anthropic_turn("done", &[])),
        ],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(retries(&out).len(), 1);
    assert_eq!(server.requests().len(), 3);
    assert_eq!(project.read("count.txt"), "ran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_body_or_a_bad_request_is_a_clear_error_at_once() {
    let (out, server, _) = with_server(
        vec![Reply::Raw {
            status: 200,
            body: b"{\"content\": [".to_vec(),
        }],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(
        out.stdout
            .contains("anthropic sent a response agentbox cannot read: invalid JSON"),
        "{}",
        out.stdout
    );
    assert_eq!(server.requests().len(), 1);

    let (out, server, _) = with_server(
        vec![Reply::status(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}}))],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(4));
    assert!(
        out.stdout
            .contains("anthropic rejected the request (400): max_tokens: too large"),
        "{}",
        out.stdout
    );
    assert_eq!(server.requests().len(), 1);
    assert!(!out.stderr.contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_endpoint_is_caught_first_and_dropped_connections_are_retried() {
    // Nobody listens: the endpoint check before the sandbox says so, with no retries.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let url = format!("http://127.0.0.1:{port}");
    let args =
        |url: &str| ["--provider", "anthropic", "--base-url", url, "--max-retries", "1"].map(String::from);
    let refused = args(&url);
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let out = run_agentbox(&project, &refused, &[("ANTHROPIC_API_KEY", KEY)], None).await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("cannot reach the model at {url}: Connection refused"))
            && out.stderr.contains("no request was sent"),
        "{}",
        out.stderr
    );
    assert!(
        !out.events.iter().any(|e| e["event"] == "started"),
        "{:?}",
        out.events
    );

    // A server that accepts and hangs up: each request fails on the wire and is retried.
    let server = ModelServer::start(vec![Reply::Hangup, Reply::Hangup]).await;
    let url = server.anthropic_url();
    let dropped = args(&url);
    let dropped: Vec<&str> = dropped.iter().map(String::as_str).collect();
    let out = run_agentbox(&project, &dropped, &[("ANTHROPIC_API_KEY", KEY)], None).await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(
        out.stdout.contains(&format!(
            "cannot reach anthropic at {url}/v1/messages after 2 attempts"
        )),
        "{}",
        out.stdout
    );
    assert_eq!(server.requests().len(), 2);
}

fn scripted(dir: &tempfile::TempDir, turns: Value) -> String {
    let path = dir.path().join("script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_trouble_at_the_start_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let script = scripted(&dir, json!([{"text": "hi"}]));
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let out = run_agentbox(
        &project,
        &["--script", &script],
        &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
        None,
    )
    .await;
    assert_eq!(out.code, Some(4));
    assert!(
        out.stderr
            .contains("cannot reach Docker at unix:///nonexistent/docker.sock: is the daemon running?"),
        "{}",
        out.stderr
    );

    let out = run_agentbox(
        &project,
        &["--script", &script, "--image", "agentbox/none:0"],
        &[],
        None,
    )
    .await;
    assert_eq!(out.code, Some(4));
    assert!(
        out.stderr.contains("image agentbox/none:0 is missing"),
        "{}",
        out.stderr
    );

    let out = run_agentbox(
        &project,
        &["--script", &script, "--runtime", "no-such-runtime"],
        &[],
        None,
    )
    .await;
    assert_eq!(out.code, Some(4));
    assert!(out.stderr.contains("runtime"), "{}", out.stderr);
    assert_eq!(project.read("a.py"), "x = 1\n");
}

/// Wait until the trajectory shows a tool call in progress.
async fn tool_started(trajectory: &std::path::Path) -> bool {
    eventually(Duration::from_secs(60), || async {
        std::fs::read_to_string(trajectory)
            .unwrap_or_default()
            .contains("\"event\":\"tool_started\"")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_from_outside_mid_run_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let script = scripted(
        &dir,
        json!([{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, {"text": "never"}]),
    );
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let killer: During = Box::new(|pid, trajectory| {
        tokio::spawn(async move {
            assert!(tool_started(&trajectory).await);
            let docker = docker().await;
            let filters =
                std::collections::HashMap::from([("label".to_string(), vec![format!("agentbox.pid={pid}")])]);
            let list = docker
                .list_containers(Some(
                    bollard::query_parameters::ListContainersOptionsBuilder::default()
                        .filters(&filters)
                        .build(),
                ))
                .await
                .unwrap();
            let id = list[0].id.clone().unwrap();
            docker
                .kill_container(&id, None::<bollard::query_parameters::KillContainerOptions>)
                .await
                .unwrap();
        })
    });
    let out = run_agentbox(&project, &["--script", &script], &[], Some(killer)).await;
    assert_eq!(out.code, Some(4), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("error:    the sandbox container is gone"),
        "{}",
        out.stdout
    );
    assert_eq!(project.read("a.py"), "x = 1\n");
}

/// A Unix-socket proxy in front of the Docker daemon that can drop every connection and refuse
/// new ones for a while: from agentbox's side, the daemon went away and came back.
struct DaemonProxy {
    path: PathBuf,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    _dir: tempfile::TempDir,
}

impl DaemonProxy {
    fn start() -> DaemonProxy {
        let upstream = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
            .unwrap_or_else(|| "/var/run/docker.sock".into());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (u, c) = (up.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !u.load(Ordering::SeqCst) {
                    continue;
                }
                let upstream = upstream.clone();
                c.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::UnixStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }));
            }
        });
        DaemonProxy {
            path,
            up,
            conns,
            _dir: dir,
        }
    }

    /// Every open connection dropped, new ones refused for `down`, then accepted again.
    async fn restart(&self, down: Duration) {
        self.up.store(false, Ordering::SeqCst);
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
        tokio::time::sleep(down).await;
        self.up.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_going_away_mid_run_is_a_clear_error_and_loses_nothing() {
    let proxy = Arc::new(DaemonProxy::start());
    let host = format!("unix://{}", proxy.path.display());
    let dir = tempfile::tempdir().unwrap();
    let script = scripted(
        &dir,
        json!([
            {"tool_calls": [{"name": "edit_file", "arguments": {"path": "a.py", "old": "x = 1", "new": "x = 2"}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]},
            {"text": "never"}
        ]),
    );
    let project = Project::new(&[("a.py", "x = 1\n")]);
    let p = proxy.clone();
    let restarter: During = Box::new(move |_pid, trajectory| {
        tokio::spawn(async move {
            let sleeping = eventually(Duration::from_secs(60), || async {
                std::fs::read_to_string(&trajectory)
                    .unwrap_or_default()
                    .contains("sleep 60")
            })
            .await;
            assert!(sleeping);
            tokio::time::sleep(Duration::from_millis(500)).await;
            p.restart(Duration::from_secs(3)).await;
        })
    });
    let out = run_agentbox(
        &project,
        &["--script", &script],
        &[("DOCKER_HOST", &host)],
        Some(restarter),
    )
    .await;
    assert_eq!(out.code, Some(4), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("error:    the sandbox container is gone"),
        "{}",
        out.stdout
    );
    assert_eq!(
        project.read("a.py"),
        "x = 2\n",
        "the edit made before the outage is whole"
    );
    assert!(!out.stderr.contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_reply_is_refused_while_reading_and_the_report_clips_the_models_words() {
    // 24 MiB of final answer: over the most agentbox reads of one reply.
    let huge = anthropic_turn(&"y".repeat(24 << 20), &[]);
    let (out, server, _) = with_server(vec![Reply::ok(huge)], &[]).await;
    assert_eq!(out.code, Some(4), "{}", &out.stderr[..out.stderr.len().min(2000)]);
    assert!(
        out.stdout
            .contains("anthropic sent a response larger than 16 MiB, the most agentbox reads of one reply"),
        "{}",
        &out.stdout[..out.stdout.len().min(2000)]
    );
    assert_eq!(
        server.requests().len(),
        1,
        "no retry: the same request gets the same reply"
    );

    // Under the limit, the answer is kept (the JSON report has it) but the text report shows
    // only its start.
    let long: String = (0..20_000)
        .map(|i| format!("line {i} of the model's summary\n"))
        .collect();
    let (out, _, _) = with_server(vec![Reply::ok(anthropic_turn(&long, &[]))], &[]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("line 0 of the model's summary"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("line 19999 of"),
        "the whole summary was printed"
    );
    assert!(out.stdout.len() < 64 << 10, "{} bytes printed", out.stdout.len());
    assert!(
        out.stdout.contains("[... clipped: the summary is "),
        "{}",
        &out.stdout[out.stdout.len().saturating_sub(2000)..]
    );
}
