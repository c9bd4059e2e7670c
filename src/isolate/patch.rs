//! A git-style patch computed on the host from a [`ChangeSet`] and the untouched originals: the
//! sandbox has no say in it. Text changes as unified diffs, binary ones as `GIT binary patch`
//! literals (with the full blob ids `git apply` needs), new and deleted files, mode changes and
//! symlinks as git writes them, so `git apply` reproduces the sandbox's state.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use sha1::{Digest, Sha1};

use super::{Change, Content};

const BASE85: &[u8; 85] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// git's blob id: sha1 of "blob <len>\0" and the bytes.
pub fn blob_id(data: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

const NULL_ID: &str = "0000000000000000000000000000000000000000";

/// git's base85 lines: a length character, then 5 characters per 4 bytes.
fn base85_lines(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(52) {
        let len = chunk.len();
        out.push(if len <= 26 {
            (b'A' + len as u8 - 1) as char
        } else {
            (b'a' + len as u8 - 27) as char
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
            out.push_str(std::str::from_utf8(&digits).expect("ascii"));
        }
        out.push('\n');
    }
    out
}

fn literal(data: &[u8]) -> String {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(data).expect("in memory");
    let deflated = z.finish().expect("in memory");
    format!("literal {}\n{}\n", data.len(), base85_lines(&deflated))
}

fn is_text(data: &[u8]) -> bool {
    !data.contains(&0) && std::str::from_utf8(data).is_ok()
}

/// (mode, bytes) of one side: 100644/100755 for files, 120000 (bytes = target) for links.
fn side(content: &Content) -> (u32, Vec<u8>) {
    match content {
        Content::File { data, mode } => (if mode & 0o111 != 0 { 0o100755 } else { 0o100644 }, data.clone()),
        Content::Symlink(target) => (0o120000, target.as_os_str().as_encoded_bytes().to_vec()),
    }
}

/// What the path was on the host before the session: read from the untouched project.
pub fn original(project: &Path, path: &str) -> Option<Content> {
    let full = project.join(path);
    let meta = full.symlink_metadata().ok()?;
    if meta.file_type().is_symlink() {
        return std::fs::read_link(&full).ok().map(Content::Symlink);
    }
    use std::os::unix::fs::MetadataExt;
    std::fs::read(&full).ok().map(|data| Content::File {
        data,
        mode: meta.mode() & 0o7777,
    })
}

/// One file's section of the patch.
pub fn file_patch(path: &str, old: Option<&Content>, new: Option<&Content>) -> String {
    let (old_mode, old_bytes) = old.map(side).unwrap_or((0, Vec::new()));
    let (new_mode, new_bytes) = new.map(side).unwrap_or((0, Vec::new()));
    // A type change (file <-> link) is a deletion and an addition, as git writes it.
    if old.is_some() && new.is_some() && (old_mode == 0o120000) != (new_mode == 0o120000) {
        return file_patch(path, old, None) + &file_patch(path, None, new);
    }
    let mut s = format!("diff --git a/{path} b/{path}\n");
    match (old.is_some(), new.is_some()) {
        (false, true) => {
            let _ = writeln!(s, "new file mode {new_mode:o}");
        }
        (true, false) => {
            let _ = writeln!(s, "deleted file mode {old_mode:o}");
        }
        _ if old_mode != new_mode => {
            let _ = write!(s, "old mode {old_mode:o}\nnew mode {new_mode:o}\n");
        }
        _ => {}
    }
    if old_bytes == new_bytes && old.is_some() && new.is_some() {
        return s;
    }
    let old_id = if old.is_some() {
        blob_id(&old_bytes)
    } else {
        NULL_ID.to_string()
    };
    let new_id = if new.is_some() {
        blob_id(&new_bytes)
    } else {
        NULL_ID.to_string()
    };
    let same_mode = old.is_some() && new.is_some() && old_mode == new_mode;
    let _ = writeln!(
        s,
        "index {old_id}..{new_id}{}",
        if same_mode {
            format!(" {new_mode:o}")
        } else {
            String::new()
        }
    );
    let a = if old.is_some() {
        format!("a/{path}")
    } else {
        "/dev/null".into()
    };
    let b = if new.is_some() {
        format!("b/{path}")
    } else {
        "/dev/null".into()
    };
    if is_text(&old_bytes) && is_text(&new_bytes) {
        let (o, n) = (
            String::from_utf8_lossy(&old_bytes),
            String::from_utf8_lossy(&new_bytes),
        );
        let diff = similar::TextDiff::from_lines(o.as_ref(), n.as_ref());
        let mut unified = diff.unified_diff();
        unified.context_radius(3).header(&a, &b);
        s.push_str(&unified.to_string());
    } else {
        s.push_str("GIT binary patch\n");
        s.push_str(&literal(&new_bytes));
        s.push_str(&literal(&old_bytes));
    }
    s
}

/// The whole patch for `changes`, reading each original from the (untouched) project.
pub fn patch(project: &Path, changes: &[(Change, Option<Content>)]) -> String {
    let mut out = String::new();
    for (ch, new) in changes {
        let old = if ch.status == 'A' {
            None
        } else {
            original(project, &ch.path)
        };
        out.push_str(&file_patch(&ch.path, old.as_ref(), new.as_ref()));
    }
    out
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
        // git encodes the four bytes "\0\0\0\0" as "00000", one byte 0xff as "h#" + padding digits.
        assert_eq!(base85_lines(&[0, 0, 0, 0]), "D00000\n");
        assert!(
            base85_lines(&[1u8; 60]).starts_with('z'),
            "52 bytes on a full line"
        );
    }

    #[test]
    fn text_changes_are_unified_diffs_with_git_headers() {
        let old = Content::File {
            data: b"a\nb\n".to_vec(),
            mode: 0o644,
        };
        let new = Content::File {
            data: b"a\nc\n".to_vec(),
            mode: 0o755,
        };
        let p = file_patch("x.txt", Some(&old), Some(&new));
        assert!(
            p.starts_with("diff --git a/x.txt b/x.txt\nold mode 100644\nnew mode 100755\nindex "),
            "{p}"
        );
        assert!(
            p.contains("--- a/x.txt\n+++ b/x.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"),
            "{p}"
        );
        let added = file_patch("n.txt", None, Some(&new));
        assert!(
            added.contains("new file mode 100755\nindex 0000000000000000000000000000000000000000.."),
            "{added}"
        );
        assert!(added.contains("--- /dev/null\n+++ b/n.txt\n"), "{added}");
    }
}
