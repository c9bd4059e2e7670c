//! A scripted model server on 127.0.0.1: a real socket speaking HTTP/1.1 and the providers'
//! real JSON, so agentbox's provider code runs exactly as it does against the real APIs. It
//! replays a queue of replies and records every request it was sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete response.
    Json {
        status: u16,
        headers: Vec<(String, String)>,
        body: Value,
    },
    /// Bytes written as the body with this status, for malformed payloads.
    Raw { status: u16, body: Vec<u8> },
    /// Headers promise `declared` bytes; fewer are sent before the connection closes.
    Truncated { declared: usize, body: Vec<u8> },
    /// Wait, then reply.
    Delay(Duration, Box<Reply>),
    /// Close the connection without a response.
    Hangup,
}

impl Reply {
    pub fn ok(body: Value) -> Reply {
        Reply::Json {
            status: 200,
            headers: vec![],
            body,
        }
    }

    pub fn status(status: u16, body: Value) -> Reply {
        Reply::Json {
            status,
            headers: vec![],
            body,
        }
    }

    pub fn with_header(self, name: &str, value: &str) -> Reply {
        match self {
            Reply::Json {
                status,
                mut headers,
                body,
            } => {
                headers.push((name.to_string(), value.to_string()));
                Reply::Json {
                    status,
                    headers,
                    body,
                }
            }
            other => other,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub raw: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone)]
pub struct ModelServer {
    pub addr: std::net::SocketAddr,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
}

impl ModelServer {
    pub async fn start(replies: Vec<Reply>) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = ModelServer {
            addr: listener.local_addr().unwrap(),
            replies: Arc::new(Mutex::new(replies.into())),
            recorded: Arc::new(Mutex::new(Vec::new())),
        };
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move { s.serve(stream).await });
            }
        });
        server
    }

    /// Base URL in the Anthropic convention (no /v1).
    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Base URL in the OpenAI convention (with /v1).
    pub fn openai_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap().clone()
    }

    async fn serve(&self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        let header_end = loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| {
                l.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < header_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let raw = String::from_utf8_lossy(&buf[header_end..header_end + length]).to_string();
        let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
        self.recorded.lock().unwrap().push(Recorded {
            path,
            headers,
            body,
            raw,
        });
        let reply = self.replies.lock().unwrap().pop_front();
        let reply = reply.unwrap_or_else(|| {
            Reply::status(
                500,
                json!({"error": {"message": "the test's model server has no more replies"}}),
            )
        });
        respond(&mut stream, reply).await;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn respond<'a>(
    stream: &'a mut TcpStream,
    reply: Reply,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        let (status, headers, body, declared) = match reply {
            Reply::Json {
                status,
                headers,
                body,
            } => {
                let b = body.to_string().into_bytes();
                let n = b.len();
                (status, headers, b, n)
            }
            Reply::Raw { status, body } => {
                let n = body.len();
                (status, vec![], body, n)
            }
            Reply::Truncated { declared, body } => (200, vec![], body, declared),
            Reply::Delay(d, inner) => {
                tokio::time::sleep(d).await;
                return respond(stream, *inner).await;
            }
            Reply::Hangup => return,
        };
        let mut head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\nconnection: close\r\n"
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(&body).await;
        let _ = stream.flush().await;
        let _ = stream.shutdown().await;
    })
}

/// A tool call as the tests write it: (name, arguments).
pub type Call<'a> = (&'a str, Value);

/// An Anthropic Messages response.
pub fn anthropic_turn(text: &str, calls: &[Call]) -> Value {
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for (i, (name, args)) in calls.iter().enumerate() {
        content.push(
            json!({"type": "tool_use", "id": format!("toolu_{i}_{name}"), "name": name, "input": args}),
        );
    }
    json!({
        "id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content,
        "stop_reason": if calls.is_empty() { "end_turn" } else { "tool_use" },
        "usage": {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 0}
    })
}

/// An OpenAI Chat Completions response. Arguments given as a JSON string are sent verbatim
/// (to send malformed JSON); other values are serialized.
pub fn openai_turn(text: &str, calls: &[Call]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            let arguments = match args {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            json!({"id": format!("call_{i}_{name}"), "type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    let mut message =
        json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "id": "chatcmpl-test", "object": "chat.completion", "model": "local-test",
        "choices": [{"index": 0, "message": message, "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20}
    })
}
