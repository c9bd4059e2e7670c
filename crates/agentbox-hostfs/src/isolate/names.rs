//! Paths inside the project as the bytes they are, and the way git prints them.
//!
//! A name the sandbox made can hold any byte but `/` and NUL: newlines, tabs, quotes, escape
//! sequences, bytes that are not UTF-8. Kept as bytes, it is written back exactly; printed, it
//! is always quoted the way git quotes it ([`crate::gitquote`], as the rest of agentbox prints
//! names), so it can neither break a patch nor add a line to a report.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A path relative to the project: `/`-separated components, none empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    /// `None` unless `bytes` is a clean relative path.
    pub fn new(bytes: Vec<u8>) -> Option<RelPath> {
        let ok = !bytes.is_empty()
            && !bytes.contains(&0)
            && bytes
                .split(|&b| b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b"..");
        ok.then_some(RelPath(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&b| b == b'/')
    }

    pub fn parent(&self) -> Option<RelPath> {
        let cut = self.0.iter().rposition(|&b| b == b'/')?;
        Some(RelPath(self.0[..cut].to_vec()))
    }

    /// Every proper ancestor, outermost first.
    pub(crate) fn ancestors(&self) -> Vec<RelPath> {
        let mut out = Vec::new();
        for (i, &b) in self.0.iter().enumerate() {
            if b == b'/' {
                out.push(RelPath(self.0[..i].to_vec()));
            }
        }
        out
    }

    /// Whether `self` is `other` or inside it.
    pub fn starts_with(&self, other: &RelPath) -> bool {
        self.0.starts_with(&other.0) && (self.0.len() == other.0.len() || self.0[other.0.len()] == b'/')
    }

    /// The path as git prints it: as is, or in double quotes with C escapes.
    pub fn quoted(&self) -> String {
        crate::gitquote::quote_path(&self.0)
    }

    /// The path as git prints it with a prefix (`a/`, `b/`) inside the quotes.
    pub(crate) fn quoted_with(&self, prefix: &str) -> String {
        let mut full = prefix.as_bytes().to_vec();
        full.extend_from_slice(&self.0);
        crate::gitquote::quote_path(&full)
    }

    /// A directory path as the change list shows it: with a trailing `/`.
    pub(crate) fn quoted_dir(&self) -> String {
        let mut full = self.0.clone();
        full.push(b'/');
        crate::gitquote::quote_path(&full)
    }
}

/// Printed as git prints it: never a raw control character.
impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.quoted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_is_gits() {
        // As `git -c core.quotePath=false ls-files` prints the same names (bytes that are not
        // UTF-8 octal-escaped, where git would print them raw).
        let cases: &[(&[u8], &str)] = &[
            (b"plain/name.txt", "plain/name.txt"),
            (b"sp ace", "sp ace"),
            (b"new\nline", r#""new\nline""#),
            (b"tab\there", r#""tab\there""#),
            (b"quote\"d", r#""quote\"d""#),
            (b"back\\slash", r#""back\\slash""#),
            (b"bad\xffbyte", r#""bad\377byte""#),
            (b"caf\xc3\xa9", "café"),
            (b"bell\x07\x08\x0b\x0c\r\x01\x7f", r#""bell\a\b\v\f\r\001\177""#),
        ];
        for (raw, want) in cases {
            assert_eq!(RelPath::new(raw.to_vec()).unwrap().quoted(), *want, "{raw:?}");
        }
        assert_eq!(
            RelPath::new(b"x\ny".to_vec()).unwrap().quoted_with("a/"),
            r#""a/x\ny""#
        );
    }

    #[test]
    fn git_reads_the_quoted_names_back() {
        // git's own reading of our quoting: `git apply` of a patch with the names quoted, one
        // holding UTF-8 (kept as is inside the quotes), one a byte that is not UTF-8.
        for name in [
            "n\nl\t\"q\\b\u{e9} z".as_bytes().to_vec(),
            b"bad\xff\x1b[31m".to_vec(),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = RelPath::new(name.clone()).unwrap();
            let patch = format!(
                "diff --git {a} {b}\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..{id}\n--- /dev/null\n+++ {b}\t\n@@ -0,0 +1 @@\n+x\n",
                a = path.quoted_with("a/"),
                b = path.quoted_with("b/"),
                id = super::super::patch::blob_id(b"x\n"),
            );
            assert!(!patch.contains('\x1b') && patch.lines().count() == 7, "{patch}");
            std::fs::write(dir.path().join("p.patch"), patch).unwrap();
            let out = std::process::Command::new("git")
                .args(["apply", "p.patch"])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(
                std::fs::read(dir.path().join(OsStr::from_bytes(&name))).unwrap(),
                b"x\n"
            );
        }
    }

    #[test]
    fn rel_paths_are_clean() {
        for bad in [&b""[..], b"/a", b"a/", b"a//b", b"./a", b"a/../b", b"..", b"a\0b"] {
            assert!(RelPath::new(bad.to_vec()).is_none(), "{bad:?}");
        }
        let p = RelPath::new(b"a/b/c".to_vec()).unwrap();
        assert_eq!(p.parent().unwrap().as_bytes(), b"a/b");
        assert_eq!(
            p.ancestors().iter().map(|a| a.as_bytes()).collect::<Vec<_>>(),
            [&b"a"[..], b"a/b"]
        );
        assert!(p.starts_with(&RelPath::new(b"a/b".to_vec()).unwrap()));
        assert!(!p.starts_with(&RelPath::new(b"a/b/c2".to_vec()).unwrap()));
        assert!(
            !RelPath::new(b"a/bc".to_vec())
                .unwrap()
                .starts_with(&RelPath::new(b"a/b".to_vec()).unwrap())
        );
    }
}
