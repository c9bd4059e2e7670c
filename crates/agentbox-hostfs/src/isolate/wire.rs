//! The manifest kept on the host with a named environment (`agentbox run --env`): what was
//! copied in, which the patch and `--apply` are computed against. Paths are bytes: text when
//! they are UTF-8, a list of bytes otherwise; hashes are hex. Reading one back checks every
//! path again (`RelPath::new`), so a damaged record cannot name `..` or an absolute path.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Entry, Manifest, RelPath};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Bytes {
    Text(String),
    Raw(Vec<u8>),
}

impl Bytes {
    fn of(b: &[u8]) -> Bytes {
        match std::str::from_utf8(b) {
            Ok(s) => Bytes::Text(s.to_string()),
            Err(_) => Bytes::Raw(b.to_vec()),
        }
    }
    fn into_vec(self) -> Vec<u8> {
        match self {
            Bytes::Text(s) => s.into_bytes(),
            Bytes::Raw(b) => b,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum WireEntry {
    Dir {
        path: Bytes,
    },
    File {
        path: Bytes,
        sha256: String,
        blob: String,
        size: u64,
        mode: u32,
    },
    Symlink {
        path: Bytes,
        target: Bytes,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the manifest names a path that is not a clean relative path")]
    BadPath,
    #[error("the manifest holds a bad hash")]
    BadHash,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Result<[u8; N], WireError> {
    let mut out = [0u8; N];
    if s.len() != 2 * N || !s.is_ascii() {
        return Err(WireError::BadHash);
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| WireError::BadHash)?;
    }
    Ok(out)
}

impl Serialize for Manifest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.entries.iter().map(|(path, entry)| {
            let path = Bytes::of(path.as_bytes());
            match entry {
                Entry::Dir => WireEntry::Dir { path },
                Entry::File {
                    sha256,
                    blob,
                    size,
                    mode,
                } => WireEntry::File {
                    path,
                    sha256: hex(sha256),
                    blob: hex(blob),
                    size: *size,
                    mode: *mode,
                },
                Entry::Symlink { target } => WireEntry::Symlink {
                    path,
                    target: Bytes::of(target.as_os_str().as_bytes()),
                },
            }
        }))
    }
}

impl<'de> Deserialize<'de> for Manifest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Vec::<WireEntry>::deserialize(d)?;
        let mut entries = BTreeMap::new();
        for w in wire {
            let (path, entry) = match w {
                WireEntry::Dir { path } => (path, Entry::Dir),
                WireEntry::File {
                    path,
                    sha256,
                    blob,
                    size,
                    mode,
                } => (
                    path,
                    Entry::File {
                        sha256: unhex(&sha256).map_err(serde::de::Error::custom)?,
                        blob: unhex(&blob).map_err(serde::de::Error::custom)?,
                        size,
                        mode,
                    },
                ),
                WireEntry::Symlink { path, target } => (
                    path,
                    Entry::Symlink {
                        target: PathBuf::from(OsStr::from_bytes(&target.into_vec())),
                    },
                ),
            };
            let path =
                RelPath::new(path.into_vec()).ok_or_else(|| serde::de::Error::custom(WireError::BadPath))?;
            entries.insert(path, entry);
        }
        Ok(Manifest { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut m = Manifest::default();
        let p = |b: &[u8]| RelPath::new(b.to_vec()).unwrap();
        m.entries.insert(p(b"src"), Entry::Dir);
        m.entries.insert(
            p(b"src/a.py"),
            Entry::File {
                sha256: [7; 32],
                blob: [9; 20],
                size: 3,
                mode: 0o644,
            },
        );
        m.entries.insert(
            p(b"bad\xffname"),
            Entry::Symlink {
                target: PathBuf::from(OsStr::from_bytes(b"t\xfe")),
            },
        );
        let json = serde_json::to_string(&m).unwrap();
        let back: Manifest = serde_json::from_str(&json).unwrap();
        assert_eq!(back.entries, m.entries);
    }

    #[test]
    fn unclean_paths_refused() {
        for path in [r#""../x""#, r#""/etc/passwd""#, r#""a//b""#, r#""""#] {
            let json = format!(r#"[{{"kind":"dir","path":{path}}}]"#);
            assert!(serde_json::from_str::<Manifest>(&json).is_err(), "{path}");
        }
        let json = r#"[{"kind":"file","path":"a","sha256":"zz","blob":"00","size":1,"mode":420}]"#;
        assert!(serde_json::from_str::<Manifest>(json).is_err());
    }
}
