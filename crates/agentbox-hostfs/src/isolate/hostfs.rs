//! The host project, touched the way the host side of a run must touch it: never through a
//! link, never opening anything but a regular file (opening a FIFO blocks until a writer comes,
//! opening a device can act on it), reads bounded, and what `--apply` creates owned by the
//! project's owner rather than by whoever runs agentbox.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Why a path was not opened.
#[derive(Debug)]
pub enum OpenError {
    /// It is not a regular file (what it is, e.g. "a FIFO").
    NotRegular(&'static str),
    Io(std::io::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::NotRegular(kind) => {
                write!(f, "it is {kind}, not a regular file (agentbox never opens one)")
            }
            OpenError::Io(e) => e.fmt(f),
        }
    }
}

/// What a file type is, in words for a message.
pub fn describe(ft: std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "a regular file"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// Open `path` for reading only if it is a regular file. `lstat` first, so nothing else is
/// ever opened; then the open itself follows no link (`O_NOFOLLOW`) and cannot block
/// (`O_NONBLOCK`: a FIFO swapped in meanwhile opens at once instead of waiting for a writer),
/// and `fstat` must show the same regular file `lstat` saw.
pub(crate) fn open_regular(path: &Path) -> Result<(File, Metadata), OpenError> {
    let seen = std::fs::symlink_metadata(path).map_err(OpenError::Io)?;
    if !seen.file_type().is_file() {
        return Err(OpenError::NotRegular(describe(seen.file_type())));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                OpenError::NotRegular("a symbolic link")
            } else {
                OpenError::Io(e)
            }
        })?;
    let meta = file.metadata().map_err(OpenError::Io)?;
    if !meta.file_type().is_file() {
        return Err(OpenError::NotRegular(describe(meta.file_type())));
    }
    if (meta.dev(), meta.ino()) != (seen.dev(), seen.ino()) {
        return Err(OpenError::Io(std::io::Error::other(
            "it was replaced while being opened",
        )));
    }
    // Reads of a regular file never block; clearing the flag keeps them plain.
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory is passed.
    unsafe {
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok((file, meta))
}

/// The whole content of the regular file at `path` if it has at most `max` bytes; `Ok(None)`
/// when it has more (also if it grew while being read).
pub fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>, OpenError> {
    let (file, meta) = open_regular(path)?;
    if meta.len() > max {
        return Ok(None);
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut data).map_err(OpenError::Io)?;
    Ok((data.len() as u64 <= max).then_some(data))
}

/// sha256 of what `reader` yields, and how many bytes that was.
pub(crate) fn sha256_of(mut reader: impl Read) -> std::io::Result<([u8; 32], u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let got = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..got]);
        n += got as u64;
    }
    Ok((h.finalize().into(), n))
}

/// Whether this process may give files away (it runs as root): only then does `--apply` set
/// owners, since anyone else creates files as themselves already.
pub(crate) fn can_chown() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Who should own what `--apply` creates: the owner of the file it replaces, else the
/// project directory's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    pub fn of(meta: &Metadata) -> Owner {
        Owner {
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }

    /// Give `file` (a descriptor we hold, so no path can be swapped under us) to this owner.
    pub(crate) fn give_file(self, file: &File) -> std::io::Result<()> {
        if can_chown() {
            std::os::unix::fs::fchown(file, Some(self.uid), Some(self.gid))?;
        }
        Ok(())
    }

    /// Give the link or directory at `path` (one we just created) to this owner, never
    /// following a link.
    pub(crate) fn give_path(self, path: &Path) -> std::io::Result<()> {
        if can_chown() {
            std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    #[test]
    fn only_regular_files_are_opened_and_a_fifo_never_blocks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), "data").unwrap();
        mkfifo(&d.path().join("fifo"));
        std::os::unix::fs::symlink("f", d.path().join("link")).unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();

        let (mut f, meta) = open_regular(&d.path().join("f")).unwrap();
        assert_eq!(meta.len(), 4);
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "data");

        // Would block forever with a plain open: no writer ever comes.
        for (name, kind) in [
            ("fifo", "a FIFO"),
            ("link", "a symbolic link"),
            ("dir", "a directory"),
        ] {
            match open_regular(&d.path().join(name)) {
                Err(OpenError::NotRegular(k)) => assert_eq!(k, kind),
                other => panic!("{name}: {:?}", other.map(|_| ())),
            }
        }
        assert!(matches!(
            read_bounded(&d.path().join("fifo"), 10),
            Err(OpenError::NotRegular("a FIFO"))
        ));
        assert!(matches!(
            open_regular(Path::new("/dev/null")),
            Err(OpenError::NotRegular("a device"))
        ));
    }

    #[test]
    fn reads_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), "0123456789").unwrap();
        assert_eq!(
            read_bounded(&d.path().join("f"), 10).unwrap().unwrap(),
            b"0123456789"
        );
        assert!(read_bounded(&d.path().join("f"), 9).unwrap().is_none());
    }
}
