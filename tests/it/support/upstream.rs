//! Destinations for the egress proxy, on 127.0.0.1 only: a counting HTTP server with fixed
//! paths (a PyPI-style simple index, a large file, an endless stream) and the same behind TLS
//! with a certificate made here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Clone)]
pub enum Body {
    Bytes(Vec<u8>),
    /// Zeros until the reader goes away.
    Endless,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    /// Paths requested, in order.
    pub paths: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
    /// PEM of the CA that signed the server's certificate (TLS only).
    pub ca_pem: Option<String>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub fn count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub async fn http(routes: HashMap<String, Body>) -> Upstream {
        Self::start(|_| routes, None).await
    }

    /// [`Upstream::http`], for routes that name the server's own port (an npm packument's
    /// tarball URL).
    pub async fn http_on_its_port(routes: impl FnOnce(u16) -> HashMap<String, Body>) -> Upstream {
        Self::start(routes, None).await
    }

    /// The same over TLS, for `name` (and 127.0.0.1), signed by a CA made here.
    pub async fn https(routes: HashMap<String, Body>, name: &str) -> Upstream {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // What a strict verifier (Python 3.13's default) asks of a CA and its leaf.
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "agentbox test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string(), "127.0.0.1".to_string()]).unwrap();
        params.use_authority_key_identifier_extension = true;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let mut up = Self::start(|_| routes, Some(acceptor)).await;
        up.ca_pem = Some(ca.pem());
        up
    }

    async fn start(
        routes: impl FnOnce(u16) -> HashMap<String, Body>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes = routes(addr.port());
        let requests = Arc::new(AtomicUsize::new(0));
        let paths = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let (r, p) = (requests.clone(), paths.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (routes, r, p, tls) = (routes.clone(), r.clone(), p.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(stream).await {
                                serve(s, &routes, &r, &p).await;
                            }
                        }
                        None => serve(stream, &routes, &r, &p).await,
                    }
                });
            }
        });
        Upstream {
            addr,
            requests,
            paths,
            task,
            ca_pem: None,
        }
    }
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    routes: &HashMap<String, Body>,
    requests: &AtomicUsize,
    paths: &Mutex<Vec<String>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 65536 {
            return;
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let head = String::from_utf8_lossy(&buf).to_string();
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    paths.lock().unwrap().push(path.clone());
    let Some(body) = routes.get(&path).cloned() else {
        let _ = s
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
        return;
    };
    let zeros = vec![0u8; 64 * 1024];
    match body {
        Body::Bytes(b) => {
            let ctype = if path.ends_with('/') {
                "text/html"
            } else {
                "application/octet-stream"
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&b).await;
        }
        Body::Endless => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n").await;
            // Bounded all the same: a test that forgot to stop reading still ends.
            for _ in 0..(1 << 16) {
                if s.write_all(&zeros).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = s.shutdown().await;
}

/// A pure-Python wheel `NAME-VERSION-py3-none-any.whl` whose module defines `VALUE = value`,
/// built here (a stored zip: no compressor needed).
pub fn wheel(name: &str, version: &str, value: &str) -> (String, Vec<u8>) {
    let dist = format!("{name}-{version}.dist-info");
    let files: Vec<(String, Vec<u8>)> = vec![
        (
            format!("{name}/__init__.py"),
            format!("VALUE = {value:?}\n").into_bytes(),
        ),
        (
            format!("{dist}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").into_bytes(),
        ),
        (
            format!("{dist}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: agentbox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
    ];
    let mut record = String::new();
    for (path, data) in &files {
        use base64::Engine;
        use sha2::Digest;
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(data));
        record.push_str(&format!("{path},sha256={digest},{}\n", data.len()));
    }
    record.push_str(&format!("{dist}/RECORD,,\n"));
    let mut all = files;
    all.push((format!("{dist}/RECORD"), record.into_bytes()));
    (format!("{name}-{version}-py3-none-any.whl"), stored_zip(&all))
}

fn stored_zip(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in files {
        let mut crc = flate2::Crc::new();
        crc.update(data);
        let crc = crc.sum();
        let offset = out.len() as u32;
        let mut local = Vec::new();
        local.extend_from_slice(&0x04034b50u32.to_le_bytes());
        local.extend_from_slice(&20u16.to_le_bytes()); // version needed
        local.extend_from_slice(&0u16.to_le_bytes()); // flags
        local.extend_from_slice(&0u16.to_le_bytes()); // stored
        local.extend_from_slice(&0u32.to_le_bytes()); // time, date
        local.extend_from_slice(&crc.to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(name.len() as u16).to_le_bytes());
        local.extend_from_slice(&0u16.to_le_bytes());
        local.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&local);
        out.extend_from_slice(data);
        central.extend_from_slice(&0x02014b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // made by
        central.extend_from_slice(&20u16.to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes());
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0u8; 8]); // extra len, comment len, disk, internal attrs
        central.extend_from_slice(&0u32.to_le_bytes()); // external attrs
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x06054b50u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A PEP 503 simple index holding one wheel: `/simple/NAME/` lists it, the file is at `/files/`.
pub fn simple_index(name: &str, wheel_name: &str, wheel: Vec<u8>) -> HashMap<String, Body> {
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(&wheel)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let page = format!(
        "<!DOCTYPE html><html><body><a href=\"/files/{wheel_name}#sha256={digest}\">{wheel_name}</a></body></html>\n"
    );
    HashMap::from([
        (format!("/simple/{name}/"), Body::Bytes(page.into_bytes())),
        (format!("/files/{wheel_name}"), Body::Bytes(wheel)),
    ])
}

/// A crate package (`NAME-VERSION.crate`, a gzipped tar) whose library is `lib_rs`, and the
/// line a sparse index lists it with (its path in the index, and the JSON).
pub fn crate_package(name: &str, version: &str, lib_rs: &str) -> (Vec<u8>, String, String) {
    use sha2::Digest;
    let root = format!("{name}-{version}");
    let manifest = format!("[package]\nname = \"{name}\"\nversion = \"{version}\"\nedition = \"2021\"\n");
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, data) in [
        (format!("{root}/Cargo.toml"), manifest.as_bytes()),
        (format!("{root}/src/lib.rs"), lib_rs.as_bytes()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, data).unwrap();
    }
    let package = tar.into_inner().unwrap().finish().unwrap();
    let cksum: String = sha2::Sha256::digest(&package)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // The sparse index's layout: names of four or more characters under their first two pairs.
    let path = format!("/{}/{}/{name}", &name[..2], &name[2..4]);
    let line = serde_json::json!({
        "name": name, "vers": version, "deps": [], "cksum": cksum,
        "features": {}, "yanked": false
    })
    .to_string();
    (package, path, line)
}

/// A static npm registry holding one package: its packument at `/NAME`, its tarball at
/// `/NAME/-/NAME-VERSION.tgz` (a gzipped tar of `package/package.json` and
/// `package/index.js`, which exports `value`), at `http://127.0.0.1:PORT`. Also the tarball's
/// `integrity` (`sha512-...`), for a lockfile.
pub fn npm_registry(port: u16, name: &str, version: &str, value: &str) -> (HashMap<String, Body>, String) {
    use base64::Engine;
    use sha2::Digest;
    let manifest = serde_json::json!({"name": name, "version": version, "main": "index.js"}).to_string();
    let index = format!("module.exports = {{ value: {value:?} }};\n");
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, data) in [
        ("package/package.json", manifest.as_bytes()),
        ("package/index.js", index.as_bytes()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, data).unwrap();
    }
    let tgz = tar.into_inner().unwrap().finish().unwrap();
    let integrity = format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(&tgz))
    );
    let shasum: String = sha1::Sha1::digest(&tgz)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tarball = format!("/{name}/-/{name}-{version}.tgz");
    let packument = serde_json::json!({
        "name": name,
        "dist-tags": {"latest": version},
        "versions": {version: {
            "name": name, "version": version, "main": "index.js",
            "dist": {"tarball": format!("http://127.0.0.1:{port}{tarball}"), "integrity": integrity, "shasum": shasum}
        }}
    })
    .to_string();
    let routes = HashMap::from([
        (format!("/{name}"), Body::Bytes(packument.into_bytes())),
        (tarball, Body::Bytes(tgz)),
    ]);
    (routes, integrity)
}

/// A `GOPROXY` of static files holding one module version (`go.mod` and `files`), and the two
/// `go.sum` lines that pin it (Go's `h1:` digests, computed here as `dirhash.Hash1` does).
pub fn go_proxy(module: &str, version: &str, files: &[(&str, &str)]) -> (HashMap<String, Body>, String) {
    use base64::Engine;
    use sha2::Digest;
    let go_mod = format!("module {module}\n\ngo 1.21\n");
    let h1 = |entries: &[(String, &[u8])]| {
        let mut sorted: Vec<&(String, &[u8])> = entries.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let summary: String = sorted
            .iter()
            .map(|(name, data)| {
                let digest: String = sha2::Sha256::digest(data)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                format!("{digest}  {name}\n")
            })
            .collect();
        format!(
            "h1:{}",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(summary.as_bytes()))
        )
    };
    let prefix = format!("{module}@{version}");
    let mut zipped: Vec<(String, Vec<u8>)> = vec![(format!("{prefix}/go.mod"), go_mod.clone().into_bytes())];
    zipped.extend(
        files
            .iter()
            .map(|(p, c)| (format!("{prefix}/{p}"), c.as_bytes().to_vec())),
    );
    let tree: Vec<(String, &[u8])> = zipped.iter().map(|(p, d)| (p.clone(), d.as_slice())).collect();
    let sum = format!(
        "{module} {version} {}\n{module} {version}/go.mod {}\n",
        h1(&tree),
        h1(&[("go.mod".to_string(), go_mod.as_bytes())])
    );
    let base = format!("/{module}/@v");
    let routes = HashMap::from([
        (
            format!("{base}/list"),
            Body::Bytes(format!("{version}\n").into_bytes()),
        ),
        (
            format!("{base}/{version}.info"),
            Body::Bytes(
                format!("{{\"Version\":\"{version}\",\"Time\":\"2026-01-01T00:00:00Z\"}}").into_bytes(),
            ),
        ),
        (format!("{base}/{version}.mod"), Body::Bytes(go_mod.into_bytes())),
        (format!("{base}/{version}.zip"), Body::Bytes(stored_zip(&zipped))),
    ]);
    (routes, sum)
}
