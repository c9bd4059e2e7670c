//! What the setup phase trusts: the host's CA bundle (`SSL_CERT_FILE` if set, else the system
//! bundle) and the `--ca-cert` files, copied into one file of certificates that the sandbox
//! mounts read-only and every tool in it is pointed at.
//!
//! Why: networks that re-sign TLS (corporate proxies, the machines this project is built on)
//! are trusted by the host, whose store holds the re-signing CA, and not by the images. The fix
//! is the host's trust passed in; verification itself is never turned off.
//!
//! Only certificates leave the host: a file given with `--ca-cert` that also holds a private
//! key (a combined PEM) has its key left behind.

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::config::TrustSettings;
use crate::sandbox::CA_BUNDLE;

/// Where Linux distributions keep the system bundle (the list OpenSSL's own probes use).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The largest CA file read (the system bundles are a few hundred KiB).
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// The variables that name the bundle, one for each tool that reads its own (Go and OpenSSL
/// read `SSL_CERT_FILE`; pip's requests `REQUESTS_CA_BUNDLE` and `PIP_CERT`; curl, Node, cargo
/// and git their own).
pub const CA_VARIABLES: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "CARGO_HTTP_CAINFO",
    "GIT_SSL_CAINFO",
];

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read {what} {path}: {source} (give another with --ca-cert FILE, or --no-host-ca)")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{what} {path} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)")]
    NoCertificate { what: &'static str, path: String },
    #[error("{what} {path} is not PEM: {reason}")]
    Malformed {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("cannot write the CA bundle for the sandbox: {0}")]
    Write(std::io::Error),
}

/// The bundle a sandbox mounts: a file in a directory of its own, removed when dropped (keep it
/// as long as a container that mounts it).
#[derive(Debug)]
pub struct Bundle {
    dir: tempfile::TempDir,
    /// Where each certificate came from, in words for the user.
    pub sources: Vec<String>,
    pub certificates: usize,
}

impl Bundle {
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The variables naming the mounted bundle.
    pub fn env(&self) -> Vec<(String, String)> {
        CA_VARIABLES
            .iter()
            .map(|v| (v.to_string(), CA_BUNDLE.to_string()))
            .collect()
    }

    /// `SOURCES (N certificates)`, for notes and errors.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} certificates)",
            self.sources.join(" + "),
            self.certificates
        )
    }
}

/// The host's bundle: `SSL_CERT_FILE` when set (an error if it cannot be read: the user said
/// so), else the first system bundle that exists. `None`: the host has none agentbox knows.
pub fn host_bundle() -> Option<(PathBuf, &'static str)> {
    if let Some(file) = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()) {
        return Some((PathBuf::from(file), "the host's CA bundle (SSL_CERT_FILE)"));
    }
    SYSTEM_BUNDLES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(|p| (p.to_path_buf(), "the host's CA bundle"))
}

fn read_certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let shown = path.display().to_string();
    let read_err = |source| TrustError::Read {
        what,
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(read_err(std::io::Error::other("not a regular file")));
    }
    let mut data = Vec::new();
    file.take(MAX_FILE + 1).read_to_end(&mut data).map_err(read_err)?;
    if data.len() as u64 > MAX_FILE {
        return Err(read_err(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_FILE >> 20
        ))));
    }
    let certs = CertificateDer::pem_slice_iter(&data)
        .map(|c| c.map(|c| c.into_owned()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TrustError::Malformed {
            what,
            path: shown.clone(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TrustError::NoCertificate { what, path: shown });
    }
    Ok(certs)
}

/// The bundle for `settings`: `None` when there is nothing to pass (`--no-host-ca` and no
/// `--ca-cert`, or a host without a bundle).
pub fn bundle(settings: &TrustSettings) -> Result<Option<Bundle>, TrustError> {
    let mut certs: Vec<CertificateDer<'static>> = Vec::new();
    let mut sources = Vec::new();
    let mut add = |found: Vec<CertificateDer<'static>>, source: String| {
        let before = certs.len();
        for c in found {
            if !certs.contains(&c) {
                certs.push(c);
            }
        }
        if certs.len() > before {
            sources.push(source);
        }
    };
    if settings.host_ca
        && let Some((path, what)) = host_bundle()
    {
        add(
            read_certificates(&path, what)?,
            format!("{what} {}", path.display()),
        );
    }
    for path in &settings.ca_certs {
        add(
            read_certificates(path, "--ca-cert")?,
            format!("--ca-cert {}", path.display()),
        );
    }
    if certs.is_empty() {
        return Ok(None);
    }
    let mut pem = String::new();
    for c in &certs {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    let dir = tempfile::Builder::new()
        .prefix("agentbox-ca-")
        .tempdir()
        .map_err(TrustError::Write)?;
    let bundle = Bundle {
        dir,
        sources,
        certificates: certs.len(),
    };
    write_readable(&bundle.path(), pem.as_bytes()).map_err(TrustError::Write)?;
    Ok(Some(bundle))
}

/// Written whole before it is named (the directory is new and ours), readable by the sandbox's
/// user, whoever that is.
fn write_readable(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all()?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(path).map_err(|e| e.error)?;
    // The directory is 0700 (tempfile's); the daemon mounts the file, and a rootless engine
    // runs as this user, so it may stay so.
    Ok(())
}

/// What to tell the user when a certificate was not trusted, given what was passed.
pub fn certificate_hint(bundle: Option<&Bundle>, settings: &TrustSettings) -> String {
    let passed = match bundle {
        Some(b) => format!("setup trusted {}", b.describe()),
        None if !settings.host_ca => "the host's CA bundle was not passed (--no-host-ca)".to_string(),
        None => "the host has no CA bundle agentbox knows (set SSL_CERT_FILE)".to_string(),
    };
    format!(
        "a TLS certificate was not trusted ({passed}; verification stays on). If a proxy on this \
         network re-signs TLS, give its CA certificate with --ca-cert FILE (or [network] ca_certs \
         in the config file), or set SSL_CERT_FILE to the bundle this host's tools use; `agentbox doctor` \
         checks TLS to the registries this way"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn only_certificates_leave_the_host_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_key) = ca("a");
        let (b, _) = ca("b");
        let combined = dir.path().join("combined.pem");
        std::fs::write(&combined, format!("comment\n{a}{a_key}{b}")).unwrap();
        let again = dir.path().join("a.pem");
        std::fs::write(&again, &a).unwrap();
        let settings = TrustSettings {
            host_ca: false,
            ca_certs: vec![combined, again],
        };
        let bundle = bundle(&settings).unwrap().unwrap();
        let text = std::fs::read_to_string(bundle.path()).unwrap();
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        assert_eq!(text.matches("BEGIN CERTIFICATE").count(), 2);
        assert_eq!(bundle.certificates, 2);
        assert_eq!(bundle.sources.len(), 1, "the second file added nothing");
        let parsed: Vec<_> = CertificateDer::pem_slice_iter(text.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(parsed.len(), 2);
        let path = bundle.path();
        drop(bundle);
        assert!(!path.exists(), "removed with the bundle");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let err = bundle(&TrustSettings {
            host_ca: false,
            ca_certs: vec![empty],
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--ca-cert") && err.contains("holds no PEM certificate"),
            "{err}"
        );
        let err = bundle(&TrustSettings {
            host_ca: false,
            ca_certs: vec![dir.path().join("missing.pem")],
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot read --ca-cert"), "{err}");
        assert!(
            bundle(&TrustSettings {
                host_ca: false,
                ca_certs: vec![]
            })
            .unwrap()
            .is_none()
        );
    }
}
