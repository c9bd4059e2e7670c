//! The proxy's reading of a request: its head, and where its body ends.
//!
//! What goes upstream is written by the proxy from what it checked, never the client's bytes as
//! they came: the `Host` header is the absolute URI's authority (the client's is dropped: it could
//! name another tenant of the CDN that serves an allowed registry), exactly the declared body is
//! forwarded (`Content-Length` or chunked), and nothing after it (a second, pipelined request on
//! the same connection could name another host). Anything a server could read another way than
//! the proxy does — both `Content-Length` and `Transfer-Encoding`, two lengths, a folded header,
//! a bare CR — is refused.

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    pub host: String,
    pub port: u16,
    /// For plain HTTP: the head to send upstream (origin-form, the URI's `Host`, hop-by-hop
    /// headers dropped, `Connection: close`) and how its body is framed.
    pub forward: Option<Forward>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Forward {
    pub head: Vec<u8>,
    pub body: BodyLength,
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLength {
    Length(u64),
    Chunked,
}

/// Headers that concern only this hop, or that the proxy writes itself.
const DROPPED: [&str; 7] = [
    "host",
    "proxy-connection",
    "proxy-authorization",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
];

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Why a request (its head, or its body's framing) is refused: the reason the client is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadRequest(pub String);

impl From<&str> for BadRequest {
    fn from(reason: &str) -> Self {
        BadRequest(reason.to_string())
    }
}

impl From<String> for BadRequest {
    fn from(reason: String) -> Self {
        BadRequest(reason)
    }
}

/// Parse a request head (without the final blank line).
pub(crate) fn parse_head(head: &str) -> Result<Request, BadRequest> {
    if head
        .bytes()
        .any(|b| (b < 0x20 && b != b'\t' && b != b'\r' && b != b'\n') || b == 0x7f)
    {
        return Err("a control character in the request head".into());
    }
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    // A CR or LF anywhere but in a CRLF would be read as a line end by some servers.
    if head.split("\r\n").any(|l| l.contains(['\r', '\n'])) {
        return Err("a bare CR or LF in the request head".into());
    }
    // A server may split the request line on any whitespace (RFC 9112 §3), so a tab inside the
    // URI would make it read another target than the one checked here.
    if first.contains('\t') {
        return Err("a tab in the request line".into());
    }
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed request line".into());
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err("only HTTP/1.0 and HTTP/1.1".into());
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = super::matcher::split_host_port(target)?;
        let port = port.ok_or("CONNECT needs host:port")?;
        return Ok(Request {
            method: "CONNECT".into(),
            host: host.to_string(),
            port,
            forward: None,
        });
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("bad method".into());
    }
    let Some(rest) = target
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])
    else {
        return Err("a proxy request needs an absolute http:// URI (use CONNECT for https)".into());
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.starts_with('#') || path.contains('#') {
        return Err("a fragment is not sent to a server".into());
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    if authority.contains('@') {
        return Err("credentials in the URI are not forwarded".into());
    }
    let (host, port) = super::matcher::split_host_port(authority)?;
    if host.is_empty() {
        return Err("no host in the URI".into());
    }
    let port = port.unwrap_or(80);
    let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err("malformed header".into());
        };
        // `Name : value` and folded lines are read differently by different servers.
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(format!("malformed header name {name:?}").into());
        }
        let n = name.to_ascii_lowercase();
        let v = value.trim_matches([' ', '\t']);
        match n.as_str() {
            "content-length" => {
                if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("a Content-Length that is not one number".into());
                }
                let len: u64 = v
                    .parse()
                    .map_err(|_| "a Content-Length out of range".to_string())?;
                if length.is_some_and(|l| l != len) {
                    return Err("two different Content-Length headers".into());
                }
                length = Some(len);
            }
            "transfer-encoding" => {
                if chunked || !v.eq_ignore_ascii_case("chunked") {
                    return Err("only `Transfer-Encoding: chunked` is forwarded".into());
                }
                if version == "HTTP/1.0" {
                    return Err("Transfer-Encoding in an HTTP/1.0 request".into());
                }
                chunked = true;
            }
            _ => {}
        }
        if DROPPED.contains(&n.as_str()) {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    let body = match (length, chunked) {
        (Some(_), true) => return Err("both Content-Length and Transfer-Encoding".into()),
        (_, true) => BodyLength::Chunked,
        (l, false) => BodyLength::Length(l.unwrap_or(0)),
    };
    // One request per connection: a second request on it could name another host.
    out.push_str("Connection: close\r\n\r\n");
    Ok(Request {
        method: method.to_string(),
        host: host.to_string(),
        port,
        forward: Some(Forward {
            head: out.into_bytes(),
            body,
        }),
    })
}

/// The longest chunk-size line (with extensions) and trailer section accepted.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

/// Where a request body ends, fed the client's bytes as they come.
#[derive(Debug)]
pub(crate) struct BodyEnd {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Bytes of a fixed-length body still to come.
    Fixed(u64),
    /// In a chunk-size line: the size so far, digits seen, bytes of the line, in an extension.
    Size {
        size: u64,
        digits: u32,
        line: usize,
        ext: bool,
    },
    SizeLf {
        size: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// In the trailer section: bytes of it so far, at the start of a line or not, after CR.
    Trailer {
        bytes: usize,
        at_start: bool,
        cr: bool,
    },
    Done,
}

impl BodyEnd {
    pub(crate) fn new(body: BodyLength) -> BodyEnd {
        let state = match body {
            BodyLength::Length(0) => State::Done,
            BodyLength::Length(n) => State::Fixed(n),
            BodyLength::Chunked => State::Size {
                size: 0,
                digits: 0,
                line: 0,
                ext: false,
            },
        };
        BodyEnd { state }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// How many bytes at the start of `input` belong to the body; once [`is_done`](Self::is_done),
    /// the rest is not the body's.
    pub(crate) fn feed(&mut self, input: &[u8]) -> Result<usize, BadRequest> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            self.state = match self.state {
                State::Done => return Ok(i),
                State::Fixed(n) => {
                    let take = (input.len() - i).min(usize::try_from(n).unwrap_or(usize::MAX));
                    i += take;
                    let left = n - take as u64;
                    self.state = if left == 0 {
                        State::Done
                    } else {
                        State::Fixed(left)
                    };
                    continue;
                }
                State::Data(n) => {
                    let take = (input.len() - i).min(usize::try_from(n).unwrap_or(usize::MAX));
                    i += take;
                    let left = n - take as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data(left)
                    };
                    continue;
                }
                State::Size {
                    size,
                    digits,
                    line,
                    ext,
                } => {
                    if line >= MAX_CHUNK_LINE {
                        return Err("a chunk-size line too long".into());
                    }
                    match b {
                        b'\r' if digits > 0 => State::SizeLf { size },
                        _ if ext => {
                            if b == b'\n' {
                                return Err("a bare LF in a chunk-size line".into());
                            }
                            State::Size {
                                size,
                                digits,
                                line: line + 1,
                                ext,
                            }
                        }
                        b';' if digits > 0 => State::Size {
                            size,
                            digits,
                            line: line + 1,
                            ext: true,
                        },
                        _ => {
                            let d = (b as char)
                                .to_digit(16)
                                .ok_or_else(|| "a chunk size that is not hexadecimal".to_string())?;
                            if digits >= 15 {
                                return Err("a chunk size out of range".into());
                            }
                            State::Size {
                                size: size * 16 + u64::from(d),
                                digits: digits + 1,
                                line: line + 1,
                                ext,
                            }
                        }
                    }
                }
                State::SizeLf { size } => match b {
                    b'\n' if size == 0 => State::Trailer {
                        bytes: 0,
                        at_start: true,
                        cr: false,
                    },
                    b'\n' => State::Data(size),
                    _ => return Err("a CR without LF in a chunk-size line".into()),
                },
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    _ => return Err("a chunk longer than its size".into()),
                },
                State::DataLf => match b {
                    b'\n' => State::Size {
                        size: 0,
                        digits: 0,
                        line: 0,
                        ext: false,
                    },
                    _ => return Err("a CR without LF after a chunk".into()),
                },
                State::Trailer { bytes, at_start, cr } => {
                    if bytes >= MAX_TRAILERS {
                        return Err("a trailer section too long".into());
                    }
                    match (b, cr) {
                        (b'\n', true) if at_start => State::Done,
                        (b'\n', true) => State::Trailer {
                            bytes: bytes + 1,
                            at_start: true,
                            cr: false,
                        },
                        (_, true) | (b'\n', false) => return Err("a bare CR or LF in a trailer".into()),
                        (b'\r', false) => State::Trailer {
                            bytes: bytes + 1,
                            at_start,
                            cr: true,
                        },
                        _ => State::Trailer {
                            bytes: bytes + 1,
                            at_start: false,
                            cr: false,
                        },
                    }
                }
            };
            i += 1;
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward(head: &str) -> (String, BodyLength) {
        let f = parse_head(head).unwrap().forward.unwrap();
        (String::from_utf8(f.head).unwrap(), f.body)
    }

    /// Found by the `http_head` fuzz target (fuzz/regressions/http_head): a tab in the URI went
    /// upstream inside the request line, where a server splitting on whitespace reads another
    /// target.
    #[test]
    fn a_tab_in_the_request_line_is_refused() {
        assert_eq!(
            parse_head("GET http://p.example/a/\t?1 HTTP/1.1\r\nHost: p.example"),
            Err("a tab in the request line".into())
        );
        assert!(parse_head("CONNECT p.example:443\tHTTP/1.1 HTTP/1.1").is_err());
        // In a header value a tab is whitespace, as everywhere.
        assert!(parse_head("GET http://p.example/ HTTP/1.1\r\nAccept:\t*/*").is_ok());
    }

    #[test]
    fn connect_heads_parse() {
        let r = parse_head("CONNECT pkg.example:443 HTTP/1.1\r\nHost: pkg.example:443").unwrap();
        assert_eq!(
            (r.method.as_str(), r.host.as_str(), r.port, r.forward),
            ("CONNECT", "pkg.example", 443, None)
        );
        let r = parse_head("CONNECT [::1]:8443 HTTP/1.1").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 8443));
    }

    #[test]
    fn the_host_header_is_the_uris_authority_never_the_clients() {
        let r = parse_head(
            "GET http://pkg.example:8080/simple/a/?x=1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\nhOsT: evil2.example",
        )
        .unwrap();
        assert_eq!((r.host.as_str(), r.port), ("pkg.example", 8080));
        assert_eq!(
            forward("GET http://pkg.example:8080/simple/a/?x=1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\nhOsT: evil2.example").0,
            "GET /simple/a/?x=1 HTTP/1.1\r\nHost: pkg.example:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let (head, body) = forward("GET http://pkg.example HTTP/1.0");
        assert_eq!(
            head,
            "GET / HTTP/1.0\r\nHost: pkg.example\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(body, BodyLength::Length(0));
        assert!(
            forward("GET HTTP://pkg.example?q HTTP/1.1")
                .0
                .starts_with("GET /?q HTTP/1.1\r\n")
        );
    }

    #[test]
    fn the_body_is_framed_one_way_only() {
        assert_eq!(
            forward("POST http://p.example/ HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5").1,
            BodyLength::Length(5)
        );
        assert_eq!(
            forward("POST http://p.example/ HTTP/1.1\r\nTransfer-Encoding: Chunked").1,
            BodyLength::Chunked
        );
        // The upgrade and transfer headers a server would act on are not passed on either.
        let (head, _) = forward(
            "GET http://p.example/ HTTP/1.1\r\nUpgrade: h2c\r\nTE: trailers\r\nConnection: Upgrade, TE",
        );
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\nHost: p.example\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn heads_a_server_could_read_another_way_are_refused() {
        for bad in [
            "GET /local HTTP/1.1",
            "GET https://pkg.example/ HTTP/1.1",
            "CONNECT pkg.example HTTP/1.1",
            "GET http://u:p@pkg.example/ HTTP/1.1",
            "garbage",
            "GET http://pkg.example/ HTTP/2",
            "GET http://pkg.example/ HTTP/1.2",
            "GET http:///x HTTP/1.1",
            "POST http://p.example/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",
            "POST http://p.example/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6",
            "POST http://p.example/ HTTP/1.1\r\nContent-Length: 5, 5",
            "POST http://p.example/ HTTP/1.1\r\nContent-Length: +5",
            "POST http://p.example/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked",
            "POST http://p.example/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
            "POST http://p.example/ HTTP/1.0\r\nTransfer-Encoding: chunked",
            "GET http://p.example/ HTTP/1.1\r\nContent-Length : 5",
            "GET http://p.example/ HTTP/1.1\r\nX: a\r\n folded",
            "GET http://p.example/ HTTP/1.1\r\nX: a\rContent-Length: 5",
            "GET http://p.example/ HTTP/1.1\r\nX: a\nContent-Length: 5",
            "GET http://p.example/ HTTP/1.1\r\nX: a\0b",
            "GET http://p.example/#frag HTTP/1.1",
            "GET http://p.example/ HTTP/1.1\r\nno colon",
        ] {
            assert!(parse_head(bad).is_err(), "{bad:?}");
        }
    }

    fn body_of(framing: BodyLength, input: &[u8]) -> Result<(usize, bool), BadRequest> {
        let mut end = BodyEnd::new(framing);
        let n = end.feed(input)?;
        Ok((n, end.is_done()))
    }

    #[test]
    fn a_body_ends_where_it_says_and_nothing_after_it_is_taken() {
        assert_eq!(body_of(BodyLength::Length(5), b"helloGET /next"), Ok((5, true)));
        assert_eq!(body_of(BodyLength::Length(5), b"hel"), Ok((3, false)));
        assert_eq!(body_of(BodyLength::Length(0), b"GET /next"), Ok((0, true)));
        let chunked = b"5;name=v\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET /next HTTP/1.1\r\n\r\n";
        assert_eq!(body_of(BodyLength::Chunked, chunked), Ok((30, true)));
        assert_eq!(
            body_of(BodyLength::Chunked, b"A\r\n0123456789\r\n0\r\n\r\n"),
            Ok((20, true))
        );
        // Fed a byte at a time, the end is found at the same place.
        let mut end = BodyEnd::new(BodyLength::Chunked);
        let mut taken = 0;
        for b in chunked {
            taken += end.feed(std::slice::from_ref(b)).unwrap();
            if end.is_done() {
                break;
            }
        }
        assert_eq!(taken, 30);
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello!\r\n0\r\n\r\n",
            b"x\r\n",
            b"\r\n",
            b"fffffffffffffffff\r\n",
            b"0\r\nX\rY\r\n\r\n",
            b"0\r\n\n",
        ] {
            assert!(body_of(BodyLength::Chunked, bad).is_err(), "{bad:?}");
        }
    }
}
