//! `--model-gateway`: an LLM CLI installed by the setup phase (the `openai` package from PyPI)
//! calls a scripted model server on 127.0.0.1 from inside a sandbox that has no network. The
//! server sees the host's real key; the sandbox holds only the sentinel (its environment,
//! `/proc`, every file it can read); what the gateway must refuse is refused and the upstream
//! sees none of it.

use serde_json::{Value, json};

use crate::support::model_server::{ModelServer, Reply};
use crate::support::*;

/// The `openai` package's version the test installs (its CLI: `openai api chat.completions.create`).
const OPENAI_PACKAGE: &str = "openai==1.109.1";

/// Run inside: the requests the gateway must refuse, the one past the budget, and the search
/// for the real key (given reversed, so that no argv, file or environment inside holds it).
const PROBE: &str = r#"
import json, os, sys, urllib.request, urllib.error

ROOT = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
KEY = os.environ["OPENAI_API_KEY"]

def call(path, body, key=KEY, method="POST"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ROOT + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    if key is not None:
        req.add_header("authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def chat(model="gpt-4o-mini", content="hi"):
    return {"model": model, "messages": [{"role": "user", "content": content}]}

what = sys.argv[1]
if what == "refusals":
    out = {
        "made_up_key": call("/v1/chat/completions", chat(), key="sk-made-up"),
        "no_key": call("/v1/chat/completions", chat(), key=None),
        "files": call("/v1/files", {"purpose": "batch"}),
        "web_search": call("/v1/responses", {"model": "gpt-4o-mini", "input": "news?", "tools": [{"type": "web_search"}]}),
        "url_image": call("/v1/chat/completions", chat(content=[{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}])),
        "model": call("/v1/chat/completions", chat(model="gpt-5")),
    }
    print("PROBE " + json.dumps(out))
elif what == "budget":
    print("PROBE " + json.dumps({"budget": call("/v1/chat/completions", chat())}))
elif what == "search":
    secret = sys.argv[2][::-1].encode()
    sentinel = KEY.encode()
    found, with_sentinel, read = [], 0, 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for f in ("environ", "cmdline"):
                try:
                    data = open(f"/proc/{pid}/{f}", "rb").read()
                except OSError:
                    continue
                if secret in data:
                    found.append(f"/proc/{pid}/{f}")
                if sentinel in data:
                    with_sentinel += 1
    for top in os.listdir("/"):
        if top in ("proc", "sys", "dev"):
            continue
        for dirpath, dirs, files in os.walk("/" + top, followlinks=False):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 64 << 20:
                        continue
                    data = open(path, "rb").read()
                except OSError:
                    continue
                read += 1
                if secret in data:
                    found.append(path)
    print("PROBE " + json.dumps({"found": found, "with_sentinel": with_sentinel, "files_read": read}))
"#;

fn chat_reply(text: &str, prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-gw", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    })
}

/// A streamed chat completion (SSE), its usage in the last event.
fn chat_stream(words: &[&str], prompt: u64, completion: u64) -> Vec<u8> {
    let mut out = String::new();
    let chunk = |delta: Value, usage: Value| {
        json!({"id": "chatcmpl-gw", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
               "choices": if delta.is_null() { json!([]) } else { json!([{"index": 0, "delta": delta, "finish_reason": null}]) },
               "usage": usage})
    };
    for w in words {
        out.push_str(&format!(
            "data: {}\n\n",
            chunk(json!({"content": w}), Value::Null)
        ));
    }
    out.push_str(&format!(
        "data: {}\n\n",
        chunk(
            Value::Null,
            json!({"prompt_tokens": prompt, "completion_tokens": completion})
        )
    ));
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

fn probe_line(stdout: &str, key: &str) -> Value {
    let mut merged = serde_json::Map::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("PROBE ") {
            let v: Value = serde_json::from_str(rest).unwrap();
            merged.extend(v.as_object().unwrap().clone());
        }
    }
    assert!(!merged.is_empty(), "no PROBE line ({key}) in: {stdout}");
    Value::Object(merged)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_llm_cli_inside_reaches_its_model_and_never_the_key() {
    let server = ModelServer::start(vec![
        Reply::ok(chat_reply("hello from the scripted model", 100, 20)),
        Reply::Raw {
            status: 200,
            body: chat_stream(&["streamed ", "through ", "the gateway"], 50, 40),
        },
    ])
    .await;
    let real_key = format!("sk-real-{}", uuid::Uuid::new_v4().simple());
    let reversed: String = real_key.chars().rev().collect();
    let project = Project::new(&[
        ("requirements.txt", &format!("{OPENAI_PACKAGE}\n")),
        ("probe.py", PROBE),
    ]);
    let log = tempfile::NamedTempFile::new().unwrap();
    let script = format!(
        "set -e; python3 probe.py refusals; \
         openai api chat.completions.create -m gpt-4o-mini -g user hello; echo; \
         openai api chat.completions.create -m gpt-4o-mini -g user again --stream; echo; \
         python3 probe.py budget; python3 probe.py search {reversed}; \
         echo \"ENV $(env | grep -c =agentbox-gateway-)\""
    );
    let upstream = format!("{}/v1", server.anthropic_url());
    let out = run(agentbox()
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env("AGENTBOX_TEST_GATEWAY_KEY", &real_key)
        .args(["exec", "--command-timeout", "600", "--model-gateway=openai"])
        .args(["--gateway-upstream", &upstream])
        .args(["--gateway-key-env", "AGENTBOX_TEST_GATEWAY_KEY"])
        .args(["--gateway-model", "gpt-4o-mini", "--gateway-budget", "200"])
        .arg("--gateway-log")
        .arg(log.path())
        .arg(project.path())
        .args(["--", "bash", "-c", &script]));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains("agentbox: setup: running `pip install"),
        "{stderr}"
    );

    // The CLI got its answers, plain and streamed.
    assert!(stdout.contains("hello from the scripted model"), "{stdout}");
    assert!(stdout.contains("streamed through the gateway"), "{stdout}");

    // Each refusal, by its own reason.
    let probe = probe_line(&stdout, "refusals");
    let status = |k: &str| probe[k][0].as_u64().unwrap_or_else(|| panic!("{k}: {probe}"));
    let body = |k: &str| probe[k][1].as_str().unwrap().to_string();
    assert_eq!(status("made_up_key"), 401, "{probe}");
    assert_eq!(status("no_key"), 401, "{probe}");
    assert_eq!(status("files"), 404, "{probe}");
    assert_eq!(status("web_search"), 403, "{probe}");
    assert!(
        body("web_search").contains("--gateway-allow-tool web_search"),
        "{probe}"
    );
    assert_eq!(status("url_image"), 403, "{probe}");
    assert_eq!(status("model"), 403, "{probe}");
    assert!(body("model").contains("gpt-5"), "{probe}");
    assert_eq!(status("budget"), 429, "{probe}");
    assert!(body("budget").contains("budget"), "{probe}");

    // The key: nowhere inside; the sentinel in the environment of the sandbox's processes.
    assert!(
        probe["found"].as_array().unwrap().is_empty(),
        "the real key inside: {probe}"
    );
    assert!(probe["with_sentinel"].as_u64().unwrap() > 0, "{probe}");
    assert!(probe["files_read"].as_u64().unwrap() > 1000, "{probe}");
    assert!(stdout.contains("ENV 1\n"), "{stdout}");

    // The upstream saw the two CLI requests only, each with the real key and no sentinel.
    let seen = server.requests();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for r in &seen {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {real_key}").as_str())
        );
        assert!(!r.raw.contains("agentbox-gateway-"), "{}", r.raw);
        assert!(
            !r.headers.iter().any(|(_, v)| v.contains("agentbox-gateway-")),
            "{:?}",
            r.headers
        );
        assert_eq!(r.body["model"], "gpt-4o-mini");
    }
    // A streamed chat completion is made to report its usage.
    assert_eq!(seen[1].body["stream"], true);
    assert_eq!(seen[1].body["stream_options"]["include_usage"], true);

    // Every request is logged and summed up.
    let records: Vec<Value> = std::fs::read_to_string(log.path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 9, "{records:#?}");
    let forwarded: Vec<&Value> = records.iter().filter(|r| r["refused"].is_null()).collect();
    assert_eq!(forwarded.len(), 2, "{records:#?}");
    assert_eq!(
        (
            forwarded[0]["input_tokens"].as_u64(),
            forwarded[0]["output_tokens"].as_u64()
        ),
        (Some(100), Some(20))
    );
    assert_eq!(
        (
            forwarded[1]["input_tokens"].as_u64(),
            forwarded[1]["output_tokens"].as_u64()
        ),
        (Some(50), Some(40))
    );
    assert_eq!(forwarded[1]["stream"], true);
    assert!(forwarded[0]["cost_usd"].as_f64().unwrap() > 0.0, "{records:#?}");
    assert!(!std::fs::read_to_string(log.path()).unwrap().contains(&real_key));
    assert!(
        stderr.contains("model gateway: 2 requests forwarded, 7 refused; 150 in / 60 out tokens"),
        "{stderr}"
    );
    assert!(!stderr.contains(&real_key) && !stdout.contains(&real_key));
}

/// A loopback upstream only over plain http; the key variable must hold a key.
#[test]
fn bad_gateway_flags_are_usage_errors() {
    let project = Project::new(&[("a.txt", "x")]);
    let out = run(agentbox()
        .env_remove("OPENAI_API_KEY")
        .args([
            "exec",
            "--model-gateway=openai",
            "--gateway-upstream",
            "http://api.example.com/v1",
        ])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("https only"), "{}", text(&out.stderr));
    let out = run(agentbox()
        .env_remove("OPENAI_API_KEY")
        .args([
            "exec",
            "--model-gateway=openai",
            "--gateway-upstream",
            "https://api.example.com/v1",
        ])
        .arg(project.path())
        .args(["--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no key in OPENAI_API_KEY"),
        "{}",
        text(&out.stderr)
    );
    for bad in ["0", "-1", "lots"] {
        let out = run(agentbox()
            .args(["exec", "--model-gateway=openai"])
            .arg(format!("--gateway-budget-usd={bad}"))
            .arg(project.path())
            .args(["--", "true"]));
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("dollars"), "{}", text(&out.stderr));
    }
}

const ANTHROPIC_PROBE: &str = r#"
import json, os, urllib.request, urllib.error

ROOT = os.environ["ANTHROPIC_BASE_URL"]
KEY = os.environ["ANTHROPIC_API_KEY"]

def call(path, body, headers=None, method="POST"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ROOT + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    req.add_header("anthropic-version", "2023-06-01")
    for k, v in (headers or {"x-api-key": KEY}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

msg = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
out = {
    "plain": call("/v1/messages", msg),
    "stream": call("/v1/messages", dict(msg, stream=True)),
    "bearer": call("/v1/messages", msg, headers={"authorization": "Bearer " + KEY}),
    "models": call("/v1/models", None, method="GET"),
    "web_fetch": call("/v1/messages", dict(msg, tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}])),
    "url_document": call("/v1/messages", dict(msg, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}])),
    "batches": call("/v1/messages/batches", {"requests": []}),
    "openai_path": call("/v1/chat/completions", msg),
}
print("PROBE " + json.dumps(out))
"#;

fn anthropic_stream() -> Vec<u8> {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "usage": {"input_tokens": 30, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "streamed anthropic"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    events
        .iter()
        .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
        .collect::<String>()
        .into_bytes()
}

/// The Anthropic side: `x-api-key` and bearer clients, a streamed reply passed through and
/// counted, `GET /v1/models`; a fetching tool, a URL document, batches and another
/// provider's path refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_endpoint_passes_streams_and_refuses_fetches() {
    let server = ModelServer::start(vec![
        Reply::ok(crate::support::model_server::anthropic_turn("plain answer", &[])),
        Reply::Raw {
            status: 200,
            body: anthropic_stream(),
        },
        Reply::ok(crate::support::model_server::anthropic_turn("bearer answer", &[])),
        Reply::ok(json!({"data": [{"type": "model", "id": "claude-sonnet-4-5"}], "has_more": false})),
    ])
    .await;
    let real_key = format!("sk-ant-real-{}", uuid::Uuid::new_v4().simple());
    let project = Project::new(&[("probe.py", ANTHROPIC_PROBE)]);
    let out = run(agentbox()
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env("ANTHROPIC_API_KEY", &real_key)
        .args(["exec", "--no-setup", "--model-gateway"])
        .args(["--gateway-upstream", &server.anthropic_url()])
        .arg(project.path())
        .args(["--", "python3", "probe.py"]));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let probe = probe_line(&stdout, "anthropic");
    let status = |k: &str| probe[k][0].as_u64().unwrap_or_else(|| panic!("{k}: {probe}"));
    assert_eq!(status("plain"), 200, "{probe}");
    assert!(probe["plain"][1].as_str().unwrap().contains("plain answer"));
    assert_eq!(status("stream"), 200, "{probe}");
    let streamed = probe["stream"][1].as_str().unwrap();
    assert!(streamed.contains("event: message_delta") && streamed.contains("streamed anthropic"));
    assert_eq!(status("bearer"), 200, "{probe}");
    assert_eq!(status("models"), 200, "{probe}");
    assert_eq!(status("web_fetch"), 403, "{probe}");
    assert_eq!(status("url_document"), 403, "{probe}");
    assert_eq!(status("batches"), 404, "{probe}");
    assert_eq!(status("openai_path"), 404, "{probe}");

    let seen = server.requests();
    let paths: Vec<&str> = seen.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/v1/messages", "/v1/messages", "/v1/messages", "/v1/models"]
    );
    assert_eq!(seen[0].header("x-api-key"), Some(real_key.as_str()));
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        seen[2].header("authorization"),
        Some(format!("Bearer {real_key}").as_str())
    );
    assert_eq!(seen[2].header("x-api-key"), None);
    for r in &seen {
        assert!(
            !r.headers.iter().any(|(_, v)| v.contains("agentbox-gateway-")),
            "{:?}",
            r.headers
        );
    }
    // 150 + 100 + 30 in (cached included), 20 + 20 + 7 out; a cost from the list price.
    assert!(
        stderr.contains("model gateway: 4 requests forwarded, 4 refused; 330 in / 47 out tokens, ~$"),
        "{stderr}"
    );
    assert!(
        stderr.contains("refused: the request asks for the server-side tool \"web_fetch\""),
        "{stderr}"
    );
}

const SECRET_PROBE: &str = r#"
import json, os, sys, urllib.request

def send(url, headers, body):
    req = urllib.request.Request(url, data=body.encode(), method="POST")
    for k, v in headers.items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status

token, other = os.environ["TOKEN"], os.environ["OTHER"]
a = send(os.environ["AGENTBOX_SECRET_TOKEN_URL"] + "/repos/x?page=2",
         {"authorization": "Bearer " + token, "x-echo": token, "content-type": "application/json"},
         json.dumps({"leak": token}))
b = send(os.environ["AGENTBOX_SECRET_OTHER_URL"] + "/v1/p",
         {"x-api-key": other, "authorization": "Bearer " + token, "content-type": "application/json"},
         "{}")
environ = b""
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            environ += open(f"/proc/{p}/environ", "rb").read()
        except OSError:
            pass
# The real values, given reversed so that no argv inside holds them.
real = [s[::-1] for s in sys.argv[1:]]
print("PROBE " + json.dumps({"a": a, "b": b, "token": token, "other": other,
      "sentinels_in_environ": token.encode() in environ and other.encode() in environ,
      "real_in_environ": [r for r in real if r.encode() in environ]}))
"#;

/// `--secret`: each endpoint puts its own value in its own header for its own upstream, and
/// nowhere else: not in another header, not in the body, not for another secret's upstream.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_goes_in_its_header_to_its_host_only() {
    let a = ModelServer::start(vec![Reply::ok(json!({"ok": true}))]).await;
    let b = ModelServer::start(vec![Reply::ok(json!({"ok": true}))]).await;
    let token = format!("ghp_real_{}", uuid::Uuid::new_v4().simple());
    let other = format!("other_real_{}", uuid::Uuid::new_v4().simple());
    let project = Project::new(&[("probe.py", SECRET_PROBE)]);
    // OTHER's value comes from a file (outside the project), as a token kept on disk would.
    let kept = tempfile::tempdir().unwrap();
    let other_file = kept.path().join("other-token");
    std::fs::write(&other_file, format!("{other}\n")).unwrap();
    let out = run(agentbox()
        .env("TOKEN", &token)
        .env_remove("OTHER")
        .args(["exec", "--no-setup"])
        .args(["--secret", &format!("TOKEN@{}:Authorization", a.anthropic_url())])
        .args(["--secret", &format!("OTHER@{}:x-api-key", b.anthropic_url())])
        .arg(format!("--secret-file=OTHER={}", other_file.display()))
        .arg(project.path())
        .args(["--", "python3", "probe.py"])
        .arg(token.chars().rev().collect::<String>())
        .arg(other.chars().rev().collect::<String>()));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let probe = probe_line(&stdout, "secret");
    assert_eq!(probe["sentinels_in_environ"], true, "{probe}");
    assert_eq!(probe["real_in_environ"], json!([]), "{probe}");
    assert_eq!(
        (probe["a"].as_u64(), probe["b"].as_u64()),
        (Some(200), Some(200)),
        "{probe}"
    );
    let sentinel = probe["token"].as_str().unwrap();
    assert!(sentinel.starts_with("agentbox-secret-"), "{probe}");
    assert!(
        probe["other"].as_str().unwrap().starts_with("agentbox-secret-"),
        "{probe}"
    );
    assert!(!stdout.contains(&token) && !stdout.contains(&other), "{stdout}");

    let seen = a.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/repos/x?page=2");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {token}").as_str())
    );
    assert_eq!(
        seen[0].header("x-echo"),
        Some(sentinel),
        "another header keeps the sentinel"
    );
    assert_eq!(seen[0].body["leak"], sentinel, "the body keeps the sentinel");
    let seen = b.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-api-key"), Some(other.as_str()));
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {sentinel}").as_str()),
        "TOKEN's value never goes to OTHER's host"
    );
    assert!(
        stderr.contains("agentbox: secrets: 2 requests (2 with the value put in, 0 failed)"),
        "{stderr}"
    );
    assert!(!stderr.contains(&token) && !stderr.contains(&other), "{stderr}");
}

/// One chat completion through `OPENAI_BASE_URL` with `OPENAI_API_KEY`, its answer printed.
const CHAT_CALL: &str = r#"import json, os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"])
"#;

/// `mcp --model-gateway`: a command the client runs through the `bash` tool reaches the model
/// through the gateway; each request is a line on the server's stderr as it ends, and the
/// summary follows when the client goes. (JSON-RPC over stdio, written here: the request is the
/// point, not the client.)
#[tokio::test(flavor = "multi_thread")]
async fn mcp_sessions_get_the_gateway_and_log_each_request() {
    use std::io::{BufRead, BufReader, Write};
    let server = ModelServer::start(vec![Reply::ok(chat_reply("mcp answer", 11, 4))]).await;
    let real_key = format!("sk-real-{}", uuid::Uuid::new_v4().simple());
    let project = Project::new(&[("call.py", CHAT_CALL)]);
    let mut child = agentbox()
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env("OPENAI_API_KEY", &real_key)
        .args(["mcp", "--no-setup", "--model-gateway=openai"])
        .args(["--gateway-upstream", &format!("{}/v1", server.anthropic_url())])
        .arg(project.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let send = |stdin: &mut std::process::ChildStdin, v: Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    let mut reply_to = |id: u64| -> Value {
        loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "the server closed stdout"
            );
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}),
    );
    reply_to(1);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "bash", "arguments": {"command": "python3 call.py; env | grep -c =agentbox-gateway-"}}}),
    );
    let result = reply_to(2).to_string();
    assert!(result.contains("mcp answer"), "{result}");
    assert!(!result.contains(&real_key), "{result}");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("agentbox: model gateway: openai POST /v1/chat/completions model gpt-4o-mini -> 200, 11 in / 4 out tokens"),
        "{stderr}"
    );
    assert!(
        stderr.contains("model gateway: 1 request forwarded, 0 refused; 11 in / 4 out tokens"),
        "{stderr}"
    );
    assert!(!stderr.contains(&real_key));
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {real_key}").as_str())
    );
}

/// `shell --model-gateway -- CMD` (a terminal): the command reaches the model through the
/// gateway; the summary is said after the terminal is given back.
#[tokio::test(flavor = "multi_thread")]
async fn a_shell_gets_the_gateway_too() {
    let server = ModelServer::start(vec![Reply::ok(chat_reply("shell answer", 7, 3))]).await;
    let real_key = format!("sk-real-{}", uuid::Uuid::new_v4().simple());
    let project = Project::new(&[("call.py", CHAT_CALL)]);
    let upstream = format!("{}/v1", server.anthropic_url());
    let path = project.path().display().to_string();
    let mut pty = crate::support::pty::Pty::spawn_with(
        &[
            "shell",
            "--no-setup",
            "--model-gateway=openai",
            "--gateway-upstream",
            &upstream,
            &path,
            "--",
            "python3",
            "call.py",
        ],
        &[("OPENAI_API_KEY", &real_key)],
    );
    let code = tokio::task::block_in_place(|| {
        let at = pty.wait_for("shell answer", 0);
        pty.wait_for(
            "model gateway: 1 request forwarded, 0 refused; 7 in / 3 out tokens",
            at,
        );
        pty.wait_exit()
    });
    assert_eq!(code, 0, "{}", pty.screen());
    assert!(!pty.screen().contains(&real_key));
    assert_eq!(server.requests().len(), 1);
}

/// The gateway's host side, spoken to on its socket as the sandbox would (no container): a
/// request line naming another host and a `Host` header of the sandbox's choosing still go to
/// the one upstream; a body over the bound is refused before anything is read upstream.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_sends_only_to_its_upstream_whatever_the_request_names() {
    use agentbox::gateway::{Gateway, Provider, Settings, Upstream};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = ModelServer::start(vec![
        Reply::ok(chat_reply("ok", 1, 1)),
        Reply::status(
            401,
            json!({"error": {"message": "Incorrect API key provided: host-key."}}),
        ),
        Reply::ok(chat_reply("ok", 1, 1)),
    ])
    .await;
    let records = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = records.clone();
    let gateway = Gateway::start(
        Settings {
            upstreams: vec![Upstream {
                provider: Provider::Openai,
                base_url: format!("{}/v1", server.anthropic_url()).parse().unwrap(),
                key: Some("host-key".into()),
            }],
            models: vec![],
            allow_tools: vec![],
            budget_tokens: None,
            budget_usd: None,
            max_body: 1024,
            max_concurrent: 8,
            request_timeout: std::time::Duration::from_secs(30),
        },
        std::sync::Arc::new(move |r: &agentbox::gateway::Record| kept.lock().unwrap().push(r.clone())),
    )
    .unwrap();
    let socket = gateway.socket(Provider::Openai).unwrap().to_path_buf();
    let ask = |head: String, body: String| {
        let socket = socket.clone();
        async move {
            let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            s.write_all(
                format!(
                    "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).await.unwrap();
            reply
        }
    };
    let sentinel = gateway.sentinel().to_string();
    let body = json!({"model": "m", "messages": []}).to_string();
    let reply = ask(
        format!(
            "POST http://evil.example:9/v1/chat/completions HTTP/1.1\r\nHost: evil.example:9\r\nAuthorization: Bearer {sentinel}\r\nX-Forwarded-Host: evil.example\r\n"
        ),
        body.clone(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("host"), Some(server.addr.to_string().as_str()));
    assert_eq!(seen[0].header("x-forwarded-host"), None);
    assert_eq!(seen[0].header("authorization"), Some("Bearer host-key"));

    let reply = ask(
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sentinel}\r\n"),
        "x".repeat(2000),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    // An upstream that quotes the key back: the sandbox reads the sentinel there.
    let reply = ask(
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sentinel}\r\n"),
        body.clone(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    assert!(
        !reply.contains("host-key") && reply.contains(&sentinel),
        "{reply}"
    );
    // A path spelled another way is not the endpoint.
    for path in [
        "/v1/chat/completions/",
        "/v1//chat/completions",
        "/v1/chat/%63ompletions",
        "/v1/x/../chat/completions",
    ] {
        let reply = ask(
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sentinel}\r\n"),
            body.clone(),
        )
        .await;
        assert!(reply.starts_with("HTTP/1.1 404"), "{path}: {reply}");
    }
    assert_eq!(server.requests().len(), 2, "nothing more reached the upstream");
    // A key given twice: the checks read the last `tools`, and the upstream gets exactly the
    // document they read, never the raw bytes another parser could read as the first.
    let twice = r#"{"model": "m", "tools": [{"type": "web_search"}], "tools": [], "messages": []}"#;
    let reply = ask(
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sentinel}\r\n"),
        twice.to_string(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let seen = server.requests();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].body, json!({"model": "m", "tools": [], "messages": []}));
    assert!(!seen[2].raw.contains("web_search"), "{}", seen[2].raw);
    let records = records.lock().unwrap();
    assert_eq!(records.len(), 8);
    assert_eq!(records.iter().filter(|r| r.refused.is_some()).count(), 5);
}

/// `--gateway-budget-usd`: a model without a known price is refused (its cost could not be
/// counted), a priced one passes until the responses' estimated cost reaches the budget.
#[tokio::test]
async fn a_dollar_budget_counts_priced_models_and_refuses_the_rest() {
    use agentbox::gateway::{Gateway, Provider, Settings, Upstream};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // 1 M input tokens of gpt-4o-mini: $0.15 at its list price, past the $0.10 budget.
    let server = ModelServer::start(vec![Reply::ok(chat_reply("ok", 1_000_000, 0))]).await;
    let gateway = Gateway::start(
        Settings {
            upstreams: vec![Upstream {
                provider: Provider::Openai,
                base_url: format!("{}/v1", server.anthropic_url()).parse().unwrap(),
                key: Some("host-key".into()),
            }],
            models: vec![],
            allow_tools: vec![],
            budget_tokens: None,
            budget_usd: Some(0.10),
            max_body: 4096,
            max_concurrent: 8,
            request_timeout: std::time::Duration::from_secs(30),
        },
        std::sync::Arc::new(|_: &agentbox::gateway::Record| {}),
    )
    .unwrap();
    let socket = gateway.socket(Provider::Openai).unwrap().to_path_buf();
    let sentinel = gateway.sentinel().to_string();
    let ask = |model: &str| {
        let socket = socket.clone();
        let sentinel = sentinel.clone();
        let body = json!({"model": model, "messages": []}).to_string();
        async move {
            let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sentinel}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).await.unwrap();
            reply
        }
    };
    let reply = ask("a-local-model").await;
    assert!(
        reply.starts_with("HTTP/1.1 403") && reply.contains("no price"),
        "{reply}"
    );
    assert_eq!(server.requests().len(), 0, "an unpriced model reaches nothing");
    let reply = ask("gpt-4o-mini").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        (gateway.spent_usd() - 0.15).abs() < 1e-6,
        "{}",
        gateway.spent_usd()
    );
    let reply = ask("gpt-4o-mini").await;
    assert!(
        reply.starts_with("HTTP/1.1 429") && reply.contains("--gateway-budget-usd"),
        "{reply}"
    );
    assert_eq!(server.requests().len(), 1, "the spent budget reaches nothing");
}
