//! Helpers for the integration tests: real Docker, real image, real projects on disk.

pub mod model_server;
pub mod pty;
pub mod scripted;
pub mod upstream;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use agentbox::config::SandboxConfig;
use agentbox::sandbox::{DockerSandbox, connect_docker};
use bollard::Docker;

/// The uid:gid test projects are given when the tests run as root, so the sandbox runs as an
/// ordinary user the way it does for people.
pub const TEST_UID: u32 = 4242;

pub async fn docker() -> Docker {
    let docker = connect_docker()
        .await
        .unwrap_or_else(|e| panic!("these tests need a Docker daemon: {e}"));
    let image = agentbox::sandbox::image::DEFAULT_IMAGE;
    let present = agentbox::sandbox::image::image_exists(&docker, image)
        .await
        .expect("inspect image");
    assert!(
        present,
        "these tests need the image {image}: run `just image` (or `agentbox image build --offline`)"
    );
    docker
}

/// Where runs of this test process would quarantine anything (never the user's own data
/// directory). Created only if something is quarantined.
pub fn test_data_dir() -> PathBuf {
    std::env::temp_dir().join(format!("agentbox-test-data-{}", std::process::id()))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A project directory on the host, removed on drop.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    /// Files given as (relative path, content). Owned by [`TEST_UID`] when we are root.
    pub fn new(files: &[(&str, &str)]) -> Project {
        let dir = tempfile::Builder::new()
            .prefix("agentbox-test-")
            .tempdir()
            .expect("tempdir");
        for (path, content) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, content).unwrap();
        }
        let p = Project { dir };
        p.chown_all();
        p
    }

    /// A copy of the directory `src` (e.g. a fixture), plus `extra` files.
    pub fn copy_of(src: &Path, extra: &[(&str, &str)]) -> Project {
        fn copy_dir(src: &Path, dst: &Path) {
            for entry in std::fs::read_dir(src).unwrap() {
                let entry = entry.unwrap();
                let to = dst.join(entry.file_name());
                if entry.file_type().unwrap().is_dir() {
                    std::fs::create_dir_all(&to).unwrap();
                    copy_dir(&entry.path(), &to);
                } else {
                    std::fs::copy(entry.path(), &to).unwrap();
                }
            }
        }
        let project = Project::new(extra);
        copy_dir(src, project.path());
        project.chown_all();
        project
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.file(rel)).unwrap()
    }

    pub fn owner(&self) -> (u32, u32) {
        let m = std::fs::metadata(self.path()).unwrap();
        (m.uid(), m.gid())
    }

    /// Give everything to the test user (after adding files, e.g. a `.git`).
    pub fn chown_all(&self) {
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", &format!("{TEST_UID}:{TEST_UID}")])
                .arg(self.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
    }

    pub fn git_init(&self) {
        let status = Command::new("git")
            .args(["init", "-q"])
            .current_dir(self.path())
            .status()
            .expect("git");
        assert!(status.success());
        self.chown_all();
    }
}

/// The Docker runtime the integration tests run their sandboxes under: `AGENTBOX_TEST_RUNTIME`
/// (e.g. `runsc` for gVisor), else the daemon's default. CI runs the hostile suites a second
/// time with it, so the boundary they assert is checked under each runtime.
pub fn test_runtime() -> Option<String> {
    std::env::var("AGENTBOX_TEST_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
}

/// Whether the sandboxes of this test run are gVisor's (its kernel reports some things
/// differently: see the hostile tests' observations).
pub fn under_gvisor() -> bool {
    test_runtime().is_some_and(|r| r.contains("runsc"))
}

pub fn config() -> SandboxConfig {
    let args = agentbox::cli::SandboxArgs {
        image: Some(agentbox::sandbox::image::DEFAULT_IMAGE.into()),
        image_source: None,
        command_timeout: Some(60),
        memory: "1g".into(),
        cpus: None,
        pids_limit: 256,
        tmp_size: "256m".into(),
        max_file_size: "1g".into(),
        runtime: test_runtime(),
        per_call_exec: false,
        allow_weak_limits: false,
        host_scan_limit: 2_000_000,
        host_scan_timeout: 30,
        service: Vec::new(),
        service_timeout: 60,
        service_definitions: Vec::new(),
    };
    SandboxConfig::from_args(&args).unwrap()
}

pub async fn sandbox_with(project: &Project, cfg: &SandboxConfig) -> DockerSandbox {
    let docker = docker().await;
    let spec = cfg.bind_spec(project.path()).expect("spec");
    DockerSandbox::create(&docker, spec).await.expect("sandbox")
}

pub async fn sandbox(project: &Project) -> DockerSandbox {
    sandbox_with(project, &config()).await
}

/// The agentbox binary under test.
pub fn agentbox() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentbox"));
    // The tests must not pick up a developer's own config file.
    cmd.env("AGENTBOX_CONFIG", "");
    cmd.env("AGENTBOX_DATA_DIR", test_data_dir());
    with_test_runtime(&mut cmd);
    cmd
}

/// Pass the tests' runtime (see [`test_runtime`]) to an agentbox process, through the
/// environment variable its `--runtime` flag reads; a developer's own setting never leaks in.
pub fn with_test_runtime(cmd: &mut Command) {
    match test_runtime() {
        Some(r) => cmd.env("AGENTBOX_RUNTIME", r),
        None => cmd.env_remove("AGENTBOX_RUNTIME"),
    };
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run agentbox")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Containers labelled by the agentbox process `pid`.
pub async fn containers_of_pid(docker: &Docker, pid: u32) -> usize {
    containers_labelled(docker, &[format!("agentbox.pid={pid}")]).await
}

/// Containers, in any state, carrying every one of `labels` (`KEY` or `KEY=VALUE`).
pub async fn containers_labelled(docker: &Docker, labels: &[String]) -> usize {
    let filters = std::collections::HashMap::from([("label".to_string(), labels.to_vec())]);
    // agentbox's own listing: it also reads Podman's answers, whose states bollard's model
    // does not know.
    agentbox::sandbox::gc::list_labelled(docker, &filters)
        .await
        .expect("list containers")
        .len()
}

/// Containers the daemon created for the agentbox process `pid` between the Unix times `since`
/// and `until` (its event log, so also those already removed).
pub async fn containers_created(docker: &Docker, pid: u32, since: i64, until: i64) -> usize {
    use bollard::query_parameters::EventsOptionsBuilder;
    use futures_util::StreamExt;
    let filters = std::collections::HashMap::from([
        ("type".to_string(), vec!["container".to_string()]),
        ("event".to_string(), vec!["create".to_string()]),
        ("label".to_string(), vec![format!("agentbox.pid={pid}")]),
    ]);
    let opts = EventsOptionsBuilder::default()
        .since(&since.to_string())
        .until(&until.to_string())
        .filters(&filters)
        .build();
    let events: Vec<_> = docker.events(Some(opts)).collect().await;
    for e in &events {
        assert!(e.is_ok(), "docker events: {e:?}");
    }
    events.len()
}

/// Now, in Unix seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Volumes labelled by the agentbox process `pid`.
pub async fn volumes_of_pid(docker: &Docker, pid: u32) -> usize {
    use bollard::query_parameters::ListVolumesOptionsBuilder;
    let filters =
        std::collections::HashMap::from([("label".to_string(), vec![format!("agentbox.pid={pid}")])]);
    docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default().filters(&filters).build(),
        ))
        .await
        .expect("list volumes")
        .volumes
        .unwrap_or_default()
        .len()
}

pub async fn container_exists(docker: &Docker, id: &str) -> bool {
    docker.inspect_container(id, None).await.is_ok()
}

/// Poll `check` until it holds or `limit` passes; returns whether it held. For waiting on
/// something to happen, not for asserting how fast it happens.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An image without python3 (built locally from the agentbox image), to exercise the
/// one-exec-per-call fallback.
pub async fn no_python_image(docker: &Docker) -> &'static str {
    use bollard::query_parameters::BuildImageOptionsBuilder;
    use futures_util::StreamExt;
    const TAG: &str = "agentbox-test/nopython:1";
    if agentbox::sandbox::image::image_exists(docker, TAG).await.unwrap() {
        return TAG;
    }
    let dockerfile = format!(
        "FROM {}\nRUN rm -f /usr/bin/python3* /usr/local/bin/python3* && ! command -v python3\n",
        agentbox::sandbox::image::DEFAULT_IMAGE
    );
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(dockerfile.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
        .unwrap();
    let body = bollard::body_full(tar.into_inner().unwrap().into());
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(TAG)
        .rm(true)
        .build();
    let mut stream = docker.build_image(opts, None, Some(body));
    while let Some(item) = stream.next().await {
        let info = item.expect("build");
        assert!(info.error_detail.is_none(), "{:?}", info.error_detail);
    }
    TAG
}
