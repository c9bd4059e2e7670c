//! Entry points for the fuzz targets in `fuzz/`: one function per parser of hostile bytes, each
//! taking the fuzzer's bytes, calling the parser the way agentbox does, and checking what must
//! hold of any answer (a panic is a finding). Compiled with the `fuzzing` feature (for the fuzz
//! crate) and in this crate's unit tests, which run every saved input under
//! `fuzz/corpus/TARGET/` and `fuzz/regressions/TARGET/` through its target: what the fuzzer
//! once found stays found by `cargo test`.
//!
//! The parsers stay private to their modules; this is the one door, and only these builds have
//! it.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a check that fails is a panic: that is how a fuzz target reports a finding"
)]

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;

use crate::egress::http::{BodyEnd, BodyLength, parse_head};
use crate::egress::matcher::{self, Rule};
use crate::egress::tls;
use crate::hostfs::gitquote;
use crate::hostfs::isolate::readback;
use crate::hostfs::isolate::{Content, Entry, Manifest, RelPath};
use crate::model;

/// A target: the fuzzer's bytes in, a panic out if a check fails. The names in [`TARGETS`] are
/// the file names under `fuzz/fuzz_targets/`, for the corpus tests.
pub type Target = fn(&[u8]);

/// The targets, by name.
pub const TARGETS: [(&str, Target); 8] = [
    ("http_head", http_head),
    ("tls_client_hello", tls_client_hello),
    ("readback_listing", readback_listing),
    ("readback_archive", readback_archive),
    ("gitquote", gitquote),
    ("text_protocol", text_protocol),
    ("model_reply", model_reply),
    ("allowlist", allowlist),
];

/// The proxy's request head (as the proxy hands it over: UTF-8, without the blank line), and
/// the body framing it declares, fed the rest of the input whole and in pieces.
pub fn http_head(data: &[u8]) {
    let (head, rest) = match data.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => (&data[..i], &data[i + 4..]),
        None => (data, &[][..]),
    };
    let Ok(head) = std::str::from_utf8(head) else {
        return;
    };
    let body = match parse_head(head) {
        Ok(req) => {
            assert!(req.port != 0, "port 0 accepted: {head:?}");
            let Some(fwd) = req.forward else {
                assert_eq!(req.method, "CONNECT");
                return;
            };
            check_forwarded_head(&fwd.head, &req.host);
            fwd.body
        }
        Err(_) => {
            // The body framing alone, either way.
            if rest.first().is_some_and(|b| b & 1 == 0) {
                BodyLength::Chunked
            } else {
                BodyLength::Length(rest.len().saturating_sub(1) as u64 / 2)
            }
        }
    };
    let whole = feed_all(body, &[rest]);
    // The same bytes in pieces (TCP cuts anywhere): the same answer.
    let cut = rest.first().map_or(0, |&b| usize::from(b) % (rest.len() + 1));
    let (a, b) = rest.split_at(cut);
    assert_eq!(whole, feed_all(body, &[a, b]), "cut at {cut}");
    let bytes: Vec<&[u8]> = rest.chunks(1).collect();
    assert_eq!(whole, feed_all(body, &bytes), "byte by byte");
}

/// Where the body ended (bytes taken, done) or the error, over `pieces` fed in turn.
fn feed_all(body: BodyLength, pieces: &[&[u8]]) -> Result<(usize, bool), crate::egress::http::BadRequest> {
    let mut end = BodyEnd::new(body);
    let mut taken = 0;
    for p in pieces {
        if end.is_done() {
            break;
        }
        let n = end.feed(p)?;
        assert!(n <= p.len());
        taken += n;
        if n < p.len() {
            assert!(end.is_done(), "stopped short of the piece without being done");
        }
    }
    Ok((taken, end.is_done()))
}

/// What goes upstream is one origin-form head with the URI's Host and no way to be read two ways.
fn check_forwarded_head(head: &[u8], host: &str) {
    let text = std::str::from_utf8(head).expect("the forwarded head is UTF-8");
    let body = text
        .strip_suffix("\r\n\r\n")
        .unwrap_or_else(|| panic!("the forwarded head ends in a blank line: {text:?}"));
    assert!(!body.contains("\r\n\r\n"), "a blank line inside: {text:?}");
    let mut lines = body.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let parts: Vec<&str> = first.split(' ').collect();
    assert_eq!(parts.len(), 3, "request line {first:?}");
    assert!(parts[1].starts_with('/'), "origin-form {first:?}");
    for part in &parts {
        assert!(
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_graphic() || b >= 0x80),
            "whitespace or a control in the request line {first:?}"
        );
    }
    let mut hosts = 0;
    let mut closes = 0;
    for line in lines {
        assert!(!line.contains(['\r', '\n']), "bare CR/LF in {line:?}");
        let (name, value) = line.split_once(':').expect("a header");
        match name.to_ascii_lowercase().as_str() {
            "host" => {
                hosts += 1;
                let (h, _) = matcher::split_host_port(value.trim()).expect("the Host is host[:port]");
                assert_eq!(h, host, "the Host header names the host connected to");
            }
            "connection" => {
                closes += 1;
                assert_eq!(value, " close");
            }
            "transfer-encoding" | "content-length" | "upgrade" | "te" => {}
            _ => {}
        }
    }
    assert_eq!(
        (hosts, closes),
        (1, 1),
        "one Host and one Connection: close in {text:?}"
    );
}

/// The ClientHello reader, fed all the input and then the same bytes as they would arrive: a
/// prefix of a ClientHello is never refused, and what the whole says is what its bytes say.
pub fn tls_client_hello(data: &[u8]) {
    let whole = tls::client_hello(data);
    match &whole {
        Ok(Some(hello)) => {
            assert!(hello.consumed <= data.len() && hello.consumed > 0);
            assert_eq!(tls::client_hello(&data[..hello.consumed]), whole);
            if let Some(name) = &hello.server_name {
                assert!(!name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()));
            }
            // Every shorter prefix is waited on (the bytes could come one segment at a time).
            let step = (hello.consumed / 64).max(1);
            for n in (0..hello.consumed).step_by(step) {
                assert_eq!(tls::client_hello(&data[..n]), Ok(None), "prefix {n}");
            }
        }
        Ok(None) => {
            assert!(data.len() <= tls::MAX_INPUT);
        }
        Err(_) => {}
    }
    // Waiting never turns into an answer the whole would not give.
    let cut = data.first().map_or(0, |&b| usize::from(b) % (data.len() + 1));
    match tls::client_hello(&data[..cut]) {
        Ok(None) => {}
        Ok(Some(h)) => assert_eq!(whole, Ok(Some(h)), "prefix {cut} answered, the whole differs"),
        Err(e) => assert_eq!(whole, Err(e), "prefix {cut} refused, the whole differs"),
    }
}

/// The sandbox's listing (`find -printf '%y %s %P\0'`) and the plan made from it.
pub fn readback_listing(data: &[u8]) {
    let listing = readback::parse_listing(data);
    for path in listing.keys() {
        assert!(RelPath::new(path.as_bytes().to_vec()).is_some());
    }
    let manifest = manifest_for(data);
    let limits = small_limits();
    let plan = readback::plan(&manifest, Some(&listing), limits);
    for p in &plan.prune {
        assert!(
            listing
                .keys()
                .any(|l| l == p || l.as_bytes().starts_with(p.as_bytes())),
            "prunes {p:?}, which the listing did not name"
        );
    }
    assert!(plan.budget >= limits.total);
}

/// Limits small enough that the fuzzer reaches them.
fn small_limits() -> readback::Limits {
    readback::Limits {
        file: 4096,
        total: 16 * 1024,
    }
}

/// A manifest of a few names, some of which the input may reuse.
fn manifest_for(data: &[u8]) -> Manifest {
    let mut manifest = Manifest::default();
    let file = |data: &[u8], mode| Entry::File {
        sha256: sha256(data),
        blob: [0; 20],
        size: data.len() as u64,
        mode,
    };
    let names: [(&[u8], Entry); 5] = [
        (b"src", Entry::Dir),
        (b"src/a.py", file(b"print(1)\n", 0o644)),
        (b"run.sh", file(b"#!/bin/sh\n", 0o755)),
        (
            b"link",
            Entry::Symlink {
                target: "src/a.py".into(),
            },
        ),
        (b"big", file(&data[..data.len().min(8192)], 0o644)),
    ];
    for (name, entry) in names {
        if let Some(rel) = RelPath::new(name.to_vec()) {
            manifest.entries.insert(rel, entry);
        }
    }
    manifest
}

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// The archive the sandbox returns for `/workspace`, read back against a manifest and a plan.
pub fn readback_archive(data: &[u8]) {
    let manifest = manifest_for(data);
    let limits = small_limits();
    let plan = readback::plan(&manifest, None, limits);
    let fired = AtomicBool::new(false);
    let Ok(set) = readback::changeset_from_archive(data, &manifest, plan, &fired) else {
        return;
    };
    assert!(set.bytes_read <= data.len() as u64);
    let mut held = 0u64;
    for (change, content) in &set.changes {
        assert!(RelPath::new(change.path.as_bytes().to_vec()).is_some());
        assert!(!readback::ignored(&change.path), "an ignored path brought back");
        if let Some(Content::File { data, .. }) = content {
            let len = data.len() as u64;
            assert!(len <= limits.file, "a file over the limit brought back");
            held += len;
        }
    }
    assert!(held <= limits.total, "more than the total brought back");
}

/// git's quoting: nothing that moves a terminal or a patch's lines gets out, and the quoted
/// name reads back (C unquoting) as the bytes it was.
pub fn gitquote(data: &[u8]) {
    let out = gitquote::quote_path(data);
    assert!(
        !out.bytes().any(|b| b < 0x20 || b == 0x7f),
        "a control character in {out:?}"
    );
    match out.strip_prefix('"').and_then(|o| o.strip_suffix('"')) {
        Some(inner) if out.len() >= 2 => {
            assert_eq!(
                unquote_c(inner).as_deref(),
                Some(data),
                "{out:?} does not read back"
            );
        }
        _ => assert_eq!(out.as_bytes(), data, "unquoted but changed"),
    }
}

/// git's `unquote_c_style`, the oracle for [`gitquote`].
fn unquote_c(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c == b'"' {
            return None;
        }
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *b.get(i)?;
        i += 1;
        out.push(match e {
            b'a' => 7,
            b'b' => 8,
            b't' => b'\t',
            b'n' => b'\n',
            b'v' => 0x0b,
            b'f' => 0x0c,
            b'r' => b'\r',
            b'"' => b'"',
            b'\\' => b'\\',
            b'0'..=b'3' => {
                let d = b.get(i..i + 2)?;
                i += 2;
                let oct = |x: u8| (b'0'..=b'7').contains(&x).then(|| x - b'0');
                ((e - b'0') << 6) | (oct(d[0])? << 3) | oct(d[1])?
            }
            _ => return None,
        });
    }
    Some(out)
}

/// The text tool-call protocol (`tool: NAME({...})` lines in a model's reply).
pub fn text_protocol(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let calls = model::text_protocol::parse_calls(&text, "t");
    let mut ids = std::collections::HashSet::new();
    for call in &calls {
        assert!(ids.insert(call.id.clone()), "id {} twice", call.id);
        assert!(
            call.name == model::text_protocol::MALFORMED
                || (!call.name.is_empty()
                    && call.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')),
            "name {:?}",
            call.name
        );
        if let model::ToolArgs::Json(v) = &call.arguments {
            assert!(v.is_object());
        }
    }
    assert!(calls.len() <= text.matches("tool:").count());
}

/// The model servers' replies: both providers' JSON, an error body, an HTML page, and the
/// `retry-after` headers (the first line of the input is the header's value).
pub fn model_reply(data: &[u8]) {
    for turn in [
        model::openai::parse_response(data),
        model::anthropic::parse_response(data),
    ]
    .into_iter()
    .flatten()
    {
        let _ = (turn.text(), turn.tool_calls());
    }
    let message = model::retry::error_message(data);
    assert!(!message.is_empty());
    if model::looks_like_html(data) {
        assert!(model::html_message(data).starts_with(model::HTML_PAGE));
    }
    let first = data.split(|&b| b == b'\n').next().unwrap_or_default();
    if let Ok(value) = reqwest::header::HeaderValue::from_bytes(first) {
        for name in ["retry-after", "retry-after-ms"] {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(name, value.clone());
            let _ = model::retry::retry_after(&headers);
        }
    }
}

/// The allowlist: a rule (the input's first line) reads back from how it is shown, and what it
/// allows (the second line, `HOST PORT`) is consistent with what it says.
pub fn allowlist(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.lines();
    let rule_text = lines.next().unwrap_or_default();
    let target = lines.next().unwrap_or_default();
    if let Some(name) = matcher::normalize_name(target) {
        assert_eq!(matcher::normalize_name(&name).as_deref(), Some(name.as_str()));
    }
    let Ok(rule) = rule_text.parse::<Rule>() else {
        return;
    };
    let shown = rule.to_string();
    assert_eq!(
        shown.parse::<Rule>().as_ref(),
        Ok(&rule),
        "{rule_text:?} shown as {shown:?}"
    );
    let (host, port) = target.rsplit_once(' ').unwrap_or((target, "443"));
    let port: u16 = port.parse().unwrap_or(443);
    match matcher::Target::parse(host) {
        Some(matcher::Target::Name(name)) if rule.names_host(&name, port) => match &rule.host {
            matcher::HostPattern::Exact(n) => assert_eq!(n, &name),
            matcher::HostPattern::Suffix(s) => assert!(name.ends_with(&format!(".{s}"))),
            other => panic!("{other:?} named a host"),
        },
        Some(matcher::Target::Ip(ip)) => {
            if rule.names_ip(ip, port) {
                assert!(!matches!(
                    rule.host,
                    matcher::HostPattern::Exact(_) | matcher::HostPattern::Suffix(_)
                ));
            }
            let mapped: Option<IpAddr> = match ip {
                IpAddr::V4(v4) => Some(IpAddr::V6(v4.to_ipv6_mapped())),
                IpAddr::V6(_) => None,
            };
            if let Some(m) = mapped {
                assert_eq!(rule.names_ip(m, port), rule.names_ip(ip, port), "{m} vs {ip}");
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every saved input of every target: the corpus the fuzzer built and the regressions it
    /// found (each named for its finding).
    #[test]
    fn saved_fuzz_inputs_still_pass() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut ran = 0;
        for (name, target) in TARGETS {
            for dir in ["corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                    continue;
                };
                for entry in entries {
                    let path = entry.unwrap().path();
                    let data = std::fs::read(&path).unwrap();
                    let outcome = std::panic::catch_unwind(|| target(&data));
                    assert!(outcome.is_ok(), "{name}: {} fails", path.display());
                    ran += 1;
                }
            }
        }
        assert!(
            ran >= TARGETS.len(),
            "only {ran} saved inputs found under {}",
            root.display()
        );
    }
}
