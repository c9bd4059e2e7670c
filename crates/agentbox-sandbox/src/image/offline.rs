//! The offline build: mmdebstrap makes a minimal Debian root filesystem with an image's
//! packages and streams it into an import through the Docker API, where no registry answers.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;
use tokio::io::AsyncBufReadExt;

use super::catalogue::KnownImage;
use super::debian::apt_sources;
use super::toolchain::add_toolchain_labels;
use super::{DEBIAN_SUITE, IMAGE_LABEL, ImageError};
use crate::Cleanup;

/// Links the shared `.deb` files into the new root filesystem's APT cache before the download,
/// so that packages an earlier build fetched are not fetched again (a copy where a link cannot
/// be made; the cache is an optimisation, so nothing here fails the build).
const DEBS_IN: &str = r#"d="$1/var/cache/apt/archives"; mkdir -p "$d"
for f in "$AGENTBOX_DEBS"/*.deb; do [ -e "$f" ] || continue; ln "$f" "$d/" 2>/dev/null || cp "$f" "$d/" 2>/dev/null; done; true"#;

/// Adds what this build downloaded to the shared cache, each file under a temporary name and
/// then renamed, so a build running in parallel never sees half a file.
const DEBS_OUT: &str = r#"for f in "$1"/var/cache/apt/archives/*.deb; do
  [ -e "$f" ] || continue; b="$AGENTBOX_DEBS/${f##*/}"; [ -e "$b" ] && continue
  t="$b.part.$$"; { ln "$f" "$t" 2>/dev/null || cp "$f" "$t" 2>/dev/null; } && mv -f "$t" "$b"
done; true"#;

/// What all offline builds of one `agentbox image build` share: the tool, a scratch directory
/// (mmdebstrap's root filesystems are made there), the `.deb` cache and the APT sources.
struct OfflineWork {
    mmdebstrap: PathBuf,
    /// `TMPDIR` for mmdebstrap.
    scratch: PathBuf,
    /// Ours: the `.deb` cache and the sources file; removed on drop. mmdebstrap's own temporary
    /// directories are not in it (they hold mounts while it runs; it removes them itself).
    dir: PathBuf,
}

impl OfflineWork {
    fn debs(&self) -> PathBuf {
        self.dir.join("debs")
    }

    fn sources(&self) -> PathBuf {
        self.dir.join("sources.list")
    }
}

impl Drop for OfflineWork {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where mmdebstrap builds: `TMPDIR` when set; else `/dev/shm` when it is a roomy tmpfs that
/// allows executables (a root filesystem in memory builds twice as fast as on a busy disk;
/// the polyglot image alone is 1.4 GB while it is made); else the system's temporary directory.
fn scratch_dir() -> PathBuf {
    if std::env::var_os("TMPDIR").is_some() {
        return std::env::temp_dir();
    }
    let shm = Path::new("/dev/shm");
    const ROOM: u64 = 6 << 30;
    if free_space_exec(shm).is_some_and(|free| free >= ROOM)
        && mem_available().is_some_and(|m| m >= ROOM + (2 << 30))
    {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

/// Free bytes on the file system of `path`, if it allows executables.
fn free_space_exec(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    if st.f_flag & libc::ST_NOEXEC != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The outcome of one image's offline build.
pub struct Built {
    pub name: &'static str,
    pub result: Result<Duration, ImageError>,
}

/// Build `images` offline: for each, mmdebstrap makes a minimal Debian root filesystem with its
/// package list and streams it into an import through the Docker API; then the labels (a
/// sandbox's toolchains). The downloaded `.deb` files are shared: the polyglot image (which has
/// every sandbox's package) is built first when it is asked for, then the others, the services
/// too, in parallel from its downloads.
pub async fn build_offline(
    docker: &Docker,
    images: &[&'static KnownImage],
    mirror: Option<&str>,
    cleanup: &Cleanup,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Vec<Built>, ImageError> {
    let mmdebstrap = which("mmdebstrap").ok_or(ImageError::NoMmdebstrap)?;
    let scratch = scratch_dir();
    let dir = scratch.join(format!("agentbox-build-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("debs")).map_err(|source| ImageError::Io {
        what: format!("create {}", dir.display()),
        source,
    })?;
    let work = OfflineWork {
        mmdebstrap,
        scratch,
        dir,
    };
    std::fs::write(work.sources(), apt_sources(mirror)?).map_err(|source| ImageError::Io {
        what: "write the APT sources".into(),
        source,
    })?;
    progress(&format!(
        "building {} from Debian {DEBIAN_SUITE} in {}",
        images.iter().map(|k| k.name).collect::<Vec<_>>().join(", "),
        work.scratch.display()
    ));
    // An image that includes others downloads the most: it goes first, alone.
    let (first, rest): (Vec<&'static KnownImage>, Vec<&'static KnownImage>) =
        images.iter().partition(|k| !k.includes.is_empty());
    let mut built = Vec::new();
    for known in first {
        let started = Instant::now();
        let result = offline_one(docker, known, &work, cleanup, progress).await;
        built.push(Built {
            name: known.name,
            result: result.map(|()| started.elapsed()),
        });
    }
    let parallel = rest.iter().map(|known| {
        let work = &work;
        async move {
            let started = Instant::now();
            let result = offline_one(docker, known, work, cleanup, progress).await;
            Built {
                name: known.name,
                result: result.map(|()| started.elapsed()),
            }
        }
    });
    built.extend(futures_util::future::join_all(parallel).await);
    Ok(built)
}

/// Sends SIGTERM to mmdebstrap if the build is dropped (Ctrl-C) while it runs: it then unmounts
/// and removes its own temporary root filesystem, which a SIGKILL would leave behind.
struct TermOnDrop(Option<u32>);

impl Drop for TermOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory effects; the pid is our own child's, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

async fn offline_one(
    docker: &Docker,
    known: &'static KnownImage,
    work: &OfflineWork,
    cleanup: &Cleanup,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<(), ImageError> {
    let include = known.package_list().join(",");
    let mut cmd = tokio::process::Command::new(&work.mmdebstrap);
    cmd.arg("--variant=minbase")
        .arg(format!("--include={include}"))
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        // No fsync per file: the result is streamed into Docker, never kept.
        .arg("--dpkgopt=force-unsafe-io")
        .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
        .arg("--dpkgopt=path-exclude=/usr/share/man/*")
        .arg("--dpkgopt=path-exclude=/usr/share/locale/*")
        .arg(format!("--setup-hook={DEBS_IN}"))
        .arg(format!("--customize-hook={DEBS_OUT}"))
        .args(remove_installed_state(known))
        .arg(DEBIAN_SUITE)
        .arg("-")
        .arg(work.sources())
        .env("TMPDIR", &work.scratch)
        .env("AGENTBOX_DEBS", work.debs())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    progress(&format!(
        "{}: mmdebstrap {DEBIAN_SUITE} with {include}",
        known.name
    ));
    let mut child = cmd.spawn().map_err(|source| ImageError::Io {
        what: "run mmdebstrap".into(),
        source,
    })?;
    let mut term = TermOnDrop(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ImageError::Daemon("mmdebstrap's output is not ours".into()));
    };
    let tail = Arc::new(Mutex::new(Vec::<String>::new()));
    let read_stderr = {
        let tail = tail.clone();
        let name = known.name;
        async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("I: ") && !line.contains("hook") {
                    progress(&format!("{name}: {}", &line[3..]));
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                t.push(line);
                let excess = t.len().saturating_sub(15);
                t.drain(..excess);
            }
        }
    };
    let unlabelled = known.unlabelled_tag();
    let import = async {
        let r = import_rootfs(docker, known, &unlabelled, stdout).await;
        if r.is_err() {
            // Nothing reads its output any more: stop it rather than wait minutes for its end.
            drop(TermOnDrop(child.id()));
        }
        r
    };
    let (imported, ()) = tokio::join!(import, read_stderr);
    let status = child.wait().await.map_err(|source| ImageError::Io {
        what: "wait for mmdebstrap".into(),
        source,
    })?;
    term.0 = None;
    if imported.is_err() || !status.success() {
        // Whatever was imported is a truncated root filesystem.
        let _ = docker
            .remove_image(
                &unlabelled,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
    imported?;
    if !status.success() {
        let tail = tail.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
        return Err(ImageError::Mmdebstrap {
            image: known.name,
            status,
            tail,
        });
    }
    if known.is_sandbox() {
        progress(&format!("{}: reading the toolchain versions", known.name));
    }
    add_toolchain_labels(docker, known, &unlabelled, cleanup).await
}

/// The hook removing what the packages' maintainer scripts made that the image does without,
/// as the Dockerfile's `rm -rf` does (none for a sandbox image). It runs outside the new root
/// filesystem, at `$1`; the globs are the catalogue's own.
fn remove_installed_state(known: &KnownImage) -> Option<String> {
    let state = known.installed_state();
    if state.is_empty() {
        return None;
    }
    let paths: Vec<String> = state.iter().map(|p| format!("\"$1\"{p}")).collect();
    Some(format!("--customize-hook=rm -rf {}", paths.join(" ")))
}

async fn import_rootfs(
    docker: &Docker,
    known: &KnownImage,
    tag: &str,
    rootfs: tokio::process::ChildStdout,
) -> Result<(), ImageError> {
    let (repo, tag) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
    // What the Dockerfile's ENV, WORKDIR, LABEL and CMD lines give the other build.
    let changes = vec![
        format!("ENV PATH={}", known.path()),
        "ENV LANG=C.UTF-8".to_string(),
        "WORKDIR /workspace".to_string(),
        format!(
            "LABEL {IMAGE_LABEL}=\"{}\" {IMAGE_LABEL}.revision=\"{}\"",
            known.name,
            known.revision()
        ),
        "CMD [\"bash\"]".to_string(),
    ];
    let opts = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(changes)
        .build();
    let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(rootfs));
    // The daemon answers once it has read the whole root filesystem, which mmdebstrap writes
    // only at its end, minutes from now: the client's default timeout (for the answer) would
    // cut the import. mmdebstrap's end bounds it.
    let docker = docker.clone().with_timeout(Duration::from_secs(4 * 3600));
    let mut stream = docker.create_image(Some(opts), Some(body), None);
    while let Some(item) = stream.next().await {
        item.map_err(|source| ImageError::Docker {
            context: "import the root filesystem".into(),
            source,
        })?;
    }
    Ok(())
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offline_build_removes_what_the_dockerfile_removes() {
        let postgres = KnownImage::by_name("postgres").unwrap();
        assert_eq!(
            remove_installed_state(postgres).as_deref(),
            Some(r#"--customize-hook=rm -rf "$1"/var/lib/postgresql/* "$1"/etc/postgresql/*"#)
        );
        assert_eq!(remove_installed_state(KnownImage::by_name("rust").unwrap()), None);
    }
}
