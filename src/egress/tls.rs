//! The first thing a TLS client sends, read just far enough to learn the server name it asks
//! for (SNI). The proxy compares it with the CONNECT host before it connects: a client allowed
//! to reach `registry.example` must not ask the CDN in front of it for another tenant's
//! certificate and content.
//!
//! Hostile bytes: every length is checked against what is there and against the bound; a
//! ClientHello may come in several TLS records (with post-quantum key shares it is over 1 KiB
//! larger, and may span TCP segments), so the reader is fed bytes as they arrive and says when
//! it needs more.

/// The largest ClientHello accepted (a post-quantum one is under 2 KiB; padding brings some to 512).
pub(crate) const MAX_HELLO: usize = 16 * 1024;
/// The largest TLS record (RFC 8446 §5.1: 2^14 bytes of plaintext).
const MAX_RECORD: usize = 1 << 14;
/// The most bytes read for one ClientHello, record headers included.
pub(crate) const MAX_INPUT: usize = 2 * MAX_HELLO;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HelloError {
    #[error("not TLS (the first bytes are no TLS handshake)")]
    NotTls,
    #[error("a malformed TLS ClientHello ({0})")]
    Malformed(&'static str),
    #[error("a TLS ClientHello larger than {MAX_HELLO} bytes")]
    TooLarge,
}

/// A whole ClientHello: the name it asks for, and how many bytes of the input it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientHello {
    /// The `host_name` of the server_name extension, as sent (not normalized).
    pub server_name: Option<String>,
    pub consumed: usize,
}

/// Reads the ClientHello at the start of `input`: `Ok(None)` while it is incomplete.
pub(crate) fn client_hello(input: &[u8]) -> Result<Option<ClientHello>, HelloError> {
    let mut message = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = input.get(at..at + 5) else {
            return incomplete(input, at);
        };
        if header[0] != 22 {
            return Err(if at == 0 {
                HelloError::NotTls
            } else {
                HelloError::Malformed("another record inside the ClientHello")
            });
        }
        if header[1] != 3 || header[2] > 4 {
            return Err(if at == 0 {
                HelloError::NotTls
            } else {
                HelloError::Malformed("record version")
            });
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(HelloError::Malformed("record length"));
        }
        let Some(fragment) = input.get(at + 5..at + 5 + len) else {
            return incomplete(input, at + 5 + len);
        };
        message.extend_from_slice(fragment);
        at += 5 + len;
        if message.len() >= 4 {
            if message[0] != 1 {
                return Err(HelloError::Malformed(
                    "the first handshake message is not a ClientHello",
                ));
            }
            let body_len =
                (usize::from(message[1]) << 16) | (usize::from(message[2]) << 8) | usize::from(message[3]);
            if body_len > MAX_HELLO {
                return Err(HelloError::TooLarge);
            }
            if message.len() >= 4 + body_len {
                // Nothing may follow the ClientHello in the records that carried it: the client
                // waits for the server's answer.
                if message.len() > 4 + body_len {
                    return Err(HelloError::Malformed("bytes after the ClientHello"));
                }
                let server_name = server_name(&message[4..])?;
                return Ok(Some(ClientHello {
                    server_name,
                    consumed: at,
                }));
            }
        }
        if at > MAX_INPUT {
            return Err(HelloError::TooLarge);
        }
    }
}

fn incomplete(input: &[u8], needed: usize) -> Result<Option<ClientHello>, HelloError> {
    // Bytes that are already too many for any ClientHello are refused rather than waited on.
    if input.len() > MAX_INPUT || needed > MAX_INPUT {
        return Err(HelloError::TooLarge);
    }
    Ok(None)
}

/// A cursor over bytes whose every read is checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if n > self.bytes.len() {
            return Err(HelloError::Malformed(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<usize, HelloError> {
        Ok(usize::from(self.take(1, what)?[0]))
    }

    fn u16(&mut self, what: &'static str) -> Result<usize, HelloError> {
        let b = self.take(2, what)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a 1- or 2-byte length in front.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u8(what)?;
        self.take(n, what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u16(what)?;
        self.take(n, what)
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The server name of a ClientHello's body (RFC 8446 §4.1.2, RFC 6066 §3).
fn server_name(body: &[u8]) -> Result<Option<String>, HelloError> {
    let mut r = Reader { bytes: body };
    r.take(2, "version")?;
    r.take(32, "random")?;
    if r.vec8("session id")?.len() > 32 {
        return Err(HelloError::Malformed("session id"));
    }
    let suites = r.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suites"));
    }
    if r.vec8("compression methods")?.is_empty() {
        return Err(HelloError::Malformed("compression methods"));
    }
    if r.is_empty() {
        return Ok(None);
    }
    let mut extensions = Reader {
        bytes: r.vec16("extensions")?,
    };
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut name = None;
    while !extensions.is_empty() {
        let kind = extensions.u16("extension type")?;
        let data = extensions.vec16("extension")?;
        if !seen.insert(kind) {
            return Err(HelloError::Malformed("an extension twice"));
        }
        if kind == 0 {
            name = sni(data)?;
        }
    }
    Ok(name)
}

fn sni(data: &[u8]) -> Result<Option<String>, HelloError> {
    let mut r = Reader { bytes: data };
    let mut list = Reader {
        bytes: r.vec16("server name list")?,
    };
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the server name list"));
    }
    let mut host = None;
    while !list.is_empty() {
        let kind = list.u8("server name type")?;
        let name = list.vec16("server name")?;
        if kind != 0 {
            continue;
        }
        if host.is_some() {
            return Err(HelloError::Malformed("two host names"));
        }
        let text = std::str::from_utf8(name)
            .ok()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or(HelloError::Malformed("a host name that is not ASCII"))?;
        host = Some(text.to_string());
    }
    Ok(host)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello body with `server_name` (none if `None`) and one opaque extension of
    /// `extra` bytes (a post-quantum key share is about 1.2 KB).
    pub(crate) fn hello_body(server_name: Option<&str>, extra: usize) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend([7u8; 32]);
        b.push(32);
        b.extend([1u8; 32]);
        b.extend([0, 4, 0x13, 0x01, 0x13, 0x02]);
        b.extend([1, 0]);
        let mut ext = Vec::new();
        if let Some(n) = server_name {
            let n = n.as_bytes();
            let mut list = vec![0u8];
            list.extend((n.len() as u16).to_be_bytes());
            list.extend(n);
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend(list);
            ext.extend([0, 0]);
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
        }
        // key_share (51) with one opaque share of `extra` bytes.
        ext.extend([0, 51]);
        ext.extend((extra as u16).to_be_bytes());
        ext.extend(std::iter::repeat_n(0x42, extra));
        b.extend((ext.len() as u16).to_be_bytes());
        b.extend(ext);
        b
    }

    /// The handshake message for `body`, cut into records of at most `record` bytes.
    pub(crate) fn records(body: &[u8], record: usize) -> Vec<u8> {
        let mut msg = vec![1u8];
        msg.extend(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend(body);
        let mut out = Vec::new();
        for chunk in msg.chunks(record) {
            out.extend([22, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    #[test]
    fn the_server_name_is_read_from_one_record_or_several() {
        let body = hello_body(Some("pkg.example"), 1216);
        for record in [16384, 700, 100, 1] {
            let bytes = records(&body, record);
            let got = client_hello(&bytes).unwrap().unwrap();
            assert_eq!(
                got.server_name.as_deref(),
                Some("pkg.example"),
                "records of {record}"
            );
            assert_eq!(got.consumed, bytes.len());
            // Every prefix is incomplete, never an error.
            for cut in [0, 1, 4, 5, 6, bytes.len() / 2, bytes.len() - 1] {
                assert_eq!(client_hello(&bytes[..cut]), Ok(None), "cut at {cut} of {record}");
            }
        }
        let none = records(&hello_body(None, 32), 16384);
        assert_eq!(client_hello(&none).unwrap().unwrap().server_name, None);
    }

    #[test]
    fn a_real_client_hello_is_read() {
        use std::sync::Arc;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("pkg.example").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut bytes = Vec::new();
        conn.write_tls(&mut bytes).unwrap();
        let got = client_hello(&bytes).unwrap().unwrap();
        assert_eq!(got.server_name.as_deref(), Some("pkg.example"));
        assert_eq!(got.consumed, bytes.len());
    }

    #[test]
    fn what_is_not_a_client_hello_is_refused() {
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n\r\n"), Err(HelloError::NotTls));
        assert_eq!(client_hello(b"SSH-2.0-x\r\n"), Err(HelloError::NotTls));
        let good = records(&hello_body(Some("pkg.example"), 10), 16384);
        // A ClientHello whose length claims more than the bound.
        let mut big = good.clone();
        big[6] = 0x10;
        assert_eq!(client_hello(&big), Err(HelloError::TooLarge));
        // Lengths that point past the message.
        let mut body = hello_body(Some("pkg.example"), 10);
        let last = body.len() - 1;
        body.truncate(last);
        assert!(matches!(
            client_hello(&records(&body, 16384)),
            Err(HelloError::Malformed(_))
        ));
        // Two host names; an extension twice; another record type in the middle.
        let two = {
            let mut b = hello_body(None, 0);
            let n = b"a.example";
            let mut list = Vec::new();
            for _ in 0..2 {
                list.push(0u8);
                list.extend((n.len() as u16).to_be_bytes());
                list.extend(n);
            }
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend(list);
            let mut ext = vec![0, 0];
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
            let at = b.len() - 4 - 2;
            b.truncate(at);
            let mut all = ext;
            all.extend([0, 51, 0, 0]);
            b.extend((all.len() as u16).to_be_bytes());
            b.extend(all);
            b
        };
        assert_eq!(
            client_hello(&records(&two, 16384)),
            Err(HelloError::Malformed("two host names"))
        );
        let mut split = records(&hello_body(Some("pkg.example"), 300), 100);
        split[105] = 23;
        assert!(matches!(client_hello(&split), Err(HelloError::Malformed(_))));
        // Endless garbage that looks like records never makes the reader wait forever.
        let endless: Vec<u8> = std::iter::repeat_n([22u8, 3, 1, 0x40, 0x00], 8)
            .flatten()
            .collect();
        assert!(matches!(client_hello(&endless), Ok(None) | Err(_)));
    }
}
