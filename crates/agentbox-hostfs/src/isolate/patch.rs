//! A git-style patch computed on the host from a change set and the manifest of what was copied
//! in: the sandbox has no say in it. Text changes as unified diffs, binary and large ones as
//! `GIT binary patch` literals (with the full blob ids `git apply` needs), deletions by blob id
//! alone, mode changes and symlinks as git writes them, names quoted as git quotes them, so
//! `git apply` reproduces the sandbox's state and no name or content can add a line of its own.
//!
//! The patch is written section by section to its file; only the start of it is kept in memory
//! for the report.

use std::io::Write;
use std::path::Path;

use sha1::{Digest, Sha1};

use super::names::RelPath;
use super::{Change, Content, Entry, Manifest, hostfs};

const BASE85: &[u8; 85] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// Largest side shown as a unified diff, and the longest the diff may take (then it is coarser,
/// still correct). Anything larger goes as a binary literal, which `git apply` takes for text
/// too.
const MAX_TEXT_DIFF_BYTES: usize = 1 << 20;
const DIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Largest original read back from the host to write a deleted file's lines or a binary
/// patch's reverse half; past it a deletion is named by blob id alone.
const MAX_ORIGINAL_BYTES: u64 = 1 << 20;

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// git's blob id as bytes (see [`blob_id`]).
pub fn blob_id_bytes(data: &[u8]) -> [u8; 20] {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    h.finalize().into()
}

/// git's blob id: sha1 of "blob <len>\0" and the bytes.
pub(crate) fn blob_id(data: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    hex(&h.finalize())
}

const NULL_ID: &str = "0000000000000000000000000000000000000000";

/// git's base85 lines: a length character, then 5 characters per 4 bytes.
fn base85_lines(data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(52) {
        let len = chunk.len();
        out.push(if len <= 26 {
            b'A' + len as u8 - 1
        } else {
            b'a' + len as u8 - 27
        });
        for group in chunk.chunks(4) {
            let mut b = [0u8; 4];
            b[..group.len()].copy_from_slice(group);
            let mut v = u32::from_be_bytes(b);
            let mut digits = [0u8; 5];
            for d in digits.iter_mut().rev() {
                *d = BASE85[(v % 85) as usize];
                v /= 85;
            }
            out.extend_from_slice(&digits);
        }
        out.push(b'\n');
    }
}

fn literal(data: &[u8], out: &mut Vec<u8>) {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail; an error here would be an allocation failure, which
    // aborts anyway.
    let deflated = z.write_all(data).and_then(|()| z.finish()).unwrap_or_default();
    let _ = writeln!(out, "literal {}", data.len());
    base85_lines(&deflated, out);
    out.push(b'\n');
}

/// Shown as lines: no NUL (git's own test, on the first 8000 bytes; here on all of them) and
/// small enough to diff.
fn is_text(data: &[u8]) -> bool {
    data.len() <= MAX_TEXT_DIFF_BYTES && !data.contains(&0)
}

/// One side of a file's change.
#[derive(Debug, Clone)]
pub enum Side<'a> {
    /// A file: its git mode, blob id, and bytes when they are at hand.
    File {
        mode: u32,
        blob: String,
        data: Option<std::borrow::Cow<'a, [u8]>>,
    },
    Link(Vec<u8>),
}

impl Side<'_> {
    fn mode(&self) -> u32 {
        match self {
            Side::File { mode, .. } => *mode,
            Side::Link(_) => 0o120000,
        }
    }

    fn blob(&self) -> String {
        match self {
            Side::File { blob, .. } => blob.clone(),
            Side::Link(t) => blob_id(t),
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Side::File { data, .. } => data.as_deref(),
            Side::Link(t) => Some(t),
        }
    }
}

fn git_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 { 0o100755 } else { 0o100644 }
}

/// The new side, from the sandbox.
pub(crate) fn new_side(content: &Content) -> Side<'_> {
    match content {
        Content::File { data, mode } => Side::File {
            mode: git_mode(*mode),
            blob: blob_id(data),
            data: Some(data.as_slice().into()),
        },
        Content::Symlink(t) => Side::Link(t.as_os_str().as_encoded_bytes().to_vec()),
    }
}

/// The old side, from the manifest; the bytes of a file are read from the host only when
/// small, only if it is still a regular file reached through real directories, and only if
/// they are still what was packed.
pub(crate) fn old_side(project: &Path, manifest: &Manifest, path: &RelPath) -> Option<Side<'static>> {
    match manifest.entries.get(path)? {
        Entry::Dir => None,
        Entry::Symlink { target } => Some(Side::Link(target.as_os_str().as_encoded_bytes().to_vec())),
        Entry::File {
            sha256,
            blob,
            size,
            mode,
            ..
        } => {
            let data = (*size <= MAX_ORIGINAL_BYTES && super::check_ancestors(project, path).is_ok())
                .then(|| hostfs::read_bounded(&project.join(path.as_path()), MAX_ORIGINAL_BYTES).ok())
                .flatten()
                .flatten()
                .filter(|d| sha2::Sha256::digest(d).as_slice() == sha256);
            Some(Side::File {
                mode: git_mode(*mode),
                blob: hex(blob),
                data: data.map(Into::into),
            })
        }
    }
}

/// `data` split into lines, each with its `\n` (the last may lack one). git splits on `\n`
/// only: a lone `\r` is part of a line.
fn lines(data: &[u8]) -> Vec<&[u8]> {
    data.split_inclusive(|&b| b == b'\n').collect()
}

/// Unified hunks (three lines of context) of `old` to `new`, and the lines added and removed.
fn hunks(old: &[u8], new: &[u8], out: &mut Vec<u8>) -> (u64, u64) {
    use similar::DiffTag;
    let (o, n) = (lines(old), lines(new));
    let deadline = std::time::Instant::now() + DIFF_TIMEOUT;
    let ops = similar::capture_diff_slices_deadline(similar::Algorithm::Myers, &o, &n, Some(deadline));
    let (mut added, mut removed) = (0, 0);
    let line = |out: &mut Vec<u8>, tag: u8, l: &[u8]| {
        out.push(tag);
        out.extend_from_slice(l);
        if !l.ends_with(b"\n") {
            out.extend_from_slice(b"\n\\ No newline at end of file\n");
        }
    };
    for group in similar::group_diff_ops(ops, 3) {
        if group.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{}", similar::udiff::UnifiedHunkHeader::new(&group));
        for op in &group {
            let (tag, or, nr) = op.as_tag_tuple();
            if matches!(tag, DiffTag::Equal) {
                for l in &o[or] {
                    line(out, b' ', l);
                }
                continue;
            }
            if matches!(tag, DiffTag::Delete | DiffTag::Replace) {
                for l in &o[or] {
                    line(out, b'-', l);
                    removed += 1;
                }
            }
            if matches!(tag, DiffTag::Insert | DiffTag::Replace) {
                for l in &n[nr] {
                    line(out, b'+', l);
                    added += 1;
                }
            }
        }
    }
    (added, removed)
}

/// One file's section of the patch, and (added, removed) lines when it is a text diff.
pub(crate) fn file_patch(
    path: &RelPath,
    old: Option<&Side>,
    new: Option<&Content>,
) -> (Vec<u8>, Option<(u64, u64)>) {
    let new_sd = new.map(new_side);
    let (old_mode, new_mode) = (old.map(Side::mode), new_sd.as_ref().map(Side::mode));
    // A type change (file <-> link) is a deletion and an addition, as git writes it.
    if let (Some(o), Some(n)) = (old_mode, new_mode)
        && (o == 0o120000) != (n == 0o120000)
    {
        let (mut s, _) = file_patch(path, old, None);
        s.extend(file_patch(path, None, new).0);
        return (s, None);
    }
    let (a, b) = (path.quoted_with("a/"), path.quoted_with("b/"));
    let mut s = Vec::new();
    let _ = writeln!(s, "diff --git {a} {b}");
    match (old_mode, new_mode) {
        (None, Some(n)) => {
            let _ = writeln!(s, "new file mode {n:o}");
        }
        (Some(o), None) => {
            let _ = writeln!(s, "deleted file mode {o:o}");
        }
        (Some(o), Some(n)) if o != n => {
            let _ = write!(s, "old mode {o:o}\nnew mode {n:o}\n");
        }
        _ => {}
    }
    let old_id = old.map_or(NULL_ID.to_string(), Side::blob);
    let new_id = new_sd.as_ref().map_or(NULL_ID.to_string(), Side::blob);
    if old.is_some() && new.is_some() && old_id == new_id {
        return (s, Some((0, 0)));
    }
    let _ = write!(s, "index {old_id}..{new_id}");
    match (old_mode, new_mode) {
        (Some(o), Some(n)) if o == n => {
            let _ = writeln!(s, " {n:o}");
        }
        _ => s.push(b'\n'),
    }
    // git ends a name holding a space with a tab on the ---/+++ lines, so its end is clear.
    let tab = if path.as_bytes().contains(&b' ') { "\t" } else { "" };
    let old_label = if old.is_some() {
        format!("{a}{tab}")
    } else {
        "/dev/null".into()
    };
    let new_label = if new.is_some() {
        format!("{b}{tab}")
    } else {
        "/dev/null".into()
    };
    let old_bytes: Option<&[u8]> = match old {
        None => Some(b""),
        Some(o) => o.bytes(),
    };
    let new_bytes: &[u8] = match &new_sd {
        None => b"",
        Some(Side::Link(t)) => t,
        Some(Side::File { .. }) => match new {
            Some(Content::File { data, .. }) => data,
            _ => b"",
        },
    };
    if let Some(o) = old_bytes
        && is_text(o)
        && is_text(new_bytes)
    {
        let mut body = Vec::new();
        let counts = hunks(o, new_bytes, &mut body);
        if !body.is_empty() {
            let _ = writeln!(s, "--- {old_label}\n+++ {new_label}");
            s.extend(body);
        }
        return (s, Some(counts));
    }
    if new.is_none() {
        // A deletion without its content: `git apply` checks the original's blob id against
        // the index line and removes it; this is what `git diff` writes without `--binary`.
        let _ = writeln!(s, "Binary files {old_label} and /dev/null differ");
    } else {
        s.extend_from_slice(b"GIT binary patch\n");
        literal(new_bytes, &mut s);
        // The reverse half is optional for `git apply`; written when the original is at hand,
        // so `git apply -R` works too.
        if let Some(o) = old_bytes {
            literal(o, &mut s);
        }
    }
    (s, None)
}

/// What writing the patch gave.
#[derive(Debug, Default)]
pub struct Written {
    /// The start of the patch, up to the report's limit, and a note if it goes on.
    pub report: String,
    pub bytes: u64,
    /// Per change, (added, removed) lines for text diffs.
    pub counts: Vec<Option<(u64, u64)>>,
}

/// Write the patch for `changes` to `out`, one file's section at a time, keeping the first
/// `keep` bytes (whole lines) for the report.
pub fn write_patch(
    out: &mut dyn Write,
    project: &Path,
    manifest: &Manifest,
    changes: &[(Change, Option<Content>)],
    keep: usize,
) -> std::io::Result<Written> {
    let mut written = Written::default();
    let mut report: Vec<u8> = Vec::new();
    let mut cut = false;
    for (ch, new) in changes {
        let old = if ch.status == super::ChangeKind::Added {
            None
        } else {
            old_side(project, manifest, &ch.path)
        };
        let (section, counts) = file_patch(&ch.path, old.as_ref(), new.as_ref());
        out.write_all(&section)?;
        written.bytes += section.len() as u64;
        written.counts.push(counts);
        if !cut {
            if report.len() + section.len() <= keep {
                report.extend_from_slice(&section);
            } else {
                let room = &section[..keep - report.len()];
                let upto = room.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                report.extend_from_slice(&room[..upto]);
                cut = true;
            }
        }
    }
    written.report = String::from_utf8_lossy(&report).into_owned();
    if cut {
        written.report.push_str(&format!(
            "[... the patch goes on: {} bytes in all]\n",
            written.bytes
        ));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_ids_match_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(blob_id(b"hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
        assert_eq!(blob_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    }

    #[test]
    fn base85_is_gits() {
        let mut out = Vec::new();
        base85_lines(&[0, 0, 0, 0], &mut out);
        assert_eq!(out, b"D00000\n");
        out.clear();
        base85_lines(&[1u8; 60], &mut out);
        assert!(out.starts_with(b"z"), "52 bytes on a full line");
    }

    fn file(data: &[u8], mode: u32) -> Content {
        Content::File {
            data: data.to_vec(),
            mode,
        }
    }

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn text_changes_are_unified_diffs_with_git_headers() {
        let (old, new) = (file(b"a\nb\n", 0o644), file(b"a\nc\n", 0o755));
        let (p, counts) = file_patch(&rel("x.txt"), Some(&new_side(&old)), Some(&new));
        let p = String::from_utf8(p).unwrap();
        assert!(
            p.starts_with("diff --git a/x.txt b/x.txt\nold mode 100644\nnew mode 100755\nindex "),
            "{p}"
        );
        assert!(
            p.contains("--- a/x.txt\n+++ b/x.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"),
            "{p}"
        );
        assert_eq!(counts, Some((1, 1)));
        let (added, _) = file_patch(&rel("n t.txt"), None, Some(&new));
        let added = String::from_utf8(added).unwrap();
        assert!(
            added.contains("new file mode 100755\nindex 0000000000000000000000000000000000000000.."),
            "{added}"
        );
        assert!(added.contains("--- /dev/null\n+++ b/n t.txt\t\n"), "{added}");
    }

    /// `git apply` in a fresh directory holding `files`; what it leaves.
    fn git_apply(files: &[(&str, &[u8])], patch: &[u8]) -> Result<tempfile::TempDir, String> {
        let d = tempfile::tempdir().unwrap();
        for (p, data) in files {
            std::fs::write(d.path().join(p), data).unwrap();
        }
        std::fs::write(d.path().join(".patch"), patch).unwrap();
        let out = std::process::Command::new("git")
            .args(["apply", ".patch"])
            .current_dir(d.path())
            .output()
            .unwrap();
        if out.status.success() {
            Ok(d)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn old_file(data: &[u8], with_bytes: bool) -> Side<'static> {
        Side::File {
            mode: 0o100644,
            blob: blob_id(data),
            data: with_bytes.then(|| data.to_vec().into()),
        }
    }

    #[test]
    fn a_deletion_carries_no_content_and_git_apply_takes_it() {
        let big = vec![7u8; 3 << 20];
        let (p, _) = file_patch(&rel("big.bin"), Some(&old_file(&big, false)), None);
        assert!(p.len() < 300, "{}", String::from_utf8_lossy(&p));
        assert!(String::from_utf8_lossy(&p).ends_with("Binary files a/big.bin and /dev/null differ\n"));
        let d = git_apply(&[("big.bin", &big)], &p).unwrap();
        assert!(!d.path().join("big.bin").exists());
        // ... and refuses it when the file is not the one the patch names.
        let err = git_apply(&[("big.bin", b"other")], &p).unwrap_err();
        assert!(err.contains("does not match"), "{err}");
        // A small text file's deletion shows its lines.
        let (p, counts) = file_patch(&rel("t.txt"), Some(&old_file(b"x\ny\n", true)), None);
        assert!(String::from_utf8_lossy(&p).contains("-x\n-y\n"));
        assert_eq!(counts, Some((0, 2)));
        assert!(
            !git_apply(&[("t.txt", b"x\ny\n")], &p)
                .unwrap()
                .path()
                .join("t.txt")
                .exists()
        );
    }

    #[test]
    fn binary_and_large_changes_apply_without_the_original_at_hand() {
        let old: Vec<u8> = (0..5000u32).flat_map(|i| i.to_le_bytes()).collect();
        let mut new = old.clone();
        new[100] ^= 0xff;
        let (p, _) = file_patch(
            &rel("data.bin"),
            Some(&old_file(&old, false)),
            Some(&file(&new, 0o644)),
        );
        let d = git_apply(&[("data.bin", &old)], &p).unwrap();
        assert_eq!(std::fs::read(d.path().join("data.bin")).unwrap(), new);
        // Text over the diff limit goes as a literal too.
        let text = "line\n".repeat(300_000).into_bytes();
        let mut changed = text.clone();
        changed.extend_from_slice(b"more\n");
        let (p, counts) = file_patch(
            &rel("log.txt"),
            Some(&old_file(&text, true)),
            Some(&file(&changed, 0o644)),
        );
        assert_eq!(counts, None);
        let d = git_apply(&[("log.txt", &text)], &p).unwrap();
        assert_eq!(std::fs::read(d.path().join("log.txt")).unwrap(), changed);
    }

    #[test]
    fn lone_carriage_returns_and_missing_newlines_survive() {
        let old = b"a\rb\nc".to_vec();
        let new = b"a\rB\nc\r\nd".to_vec();
        let (p, _) = file_patch(
            &rel("cr.txt"),
            Some(&old_file(&old, true)),
            Some(&file(&new, 0o644)),
        );
        let d = git_apply(&[("cr.txt", &old)], &p).unwrap();
        assert_eq!(std::fs::read(d.path().join("cr.txt")).unwrap(), new);
    }

    #[test]
    fn the_report_keeps_the_start_of_a_long_patch() {
        let d = tempfile::tempdir().unwrap();
        let changes: Vec<(Change, Option<Content>)> = (0..50)
            .map(|i| {
                (
                    Change {
                        status: super::super::ChangeKind::Added,
                        path: rel(&format!("f{i}.txt")),
                    },
                    Some(file(&b"0123456789\n".repeat(20), 0o644)),
                )
            })
            .collect();
        let mut out = Vec::new();
        let w = write_patch(&mut out, d.path(), &Manifest::default(), &changes, 1000).unwrap();
        assert_eq!(w.bytes, out.len() as u64);
        assert!(
            w.report.len() < 1100 && w.report.contains("the patch goes on"),
            "{}",
            w.report
        );
        assert_eq!(w.counts.len(), 50);
        assert!(git_apply(&[], &out).is_ok());
    }
}
