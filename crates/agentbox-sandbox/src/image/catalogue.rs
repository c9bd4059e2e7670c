//! agentbox's own images (`images/NAME/`): their Dockerfiles and Debian package lists, compiled
//! in, so both builds (through Docker, and offline from Debian packages) read one list.

use std::time::Duration;

use super::DEFAULT_IMAGE;

/// The one Dockerfile of every image (`images/Dockerfile`); its LABEL line names the image.
const DOCKERFILE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/Dockerfile"));

/// The packages in every image; each image's own list is added to them.
const COMMON_PACKAGES: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../images/common/packages"
));

/// An image whose definition ships inside the binary (`images/NAME/`).
pub struct KnownImage {
    pub name: &'static str,
    pub tag: &'static str,
    /// Its own Debian packages (`images/NAME/packages`), one per line; `#` starts a comment.
    pub packages: &'static str,
    /// Known images whose packages it has too (the polyglot image: all the others).
    pub includes: &'static [&'static str],
    /// What it is for. Everything that goes through [`KNOWN`] asks: a project is only ever
    /// given a sandbox image, and only a sandbox image gets the common packages and toolchain
    /// labels.
    pub kind: ImageKind,
    /// Its size once built, in MB (`docker images`, built offline from Debian trixie): what a
    /// first use that has to build it says to expect.
    pub approx_mb: u32,
}

/// What an agentbox image is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A sandbox: the project's commands run in it. It has the common packages
    /// (`images/common/packages`), its toolchains' versions as labels, and a project may be
    /// given it.
    Sandbox {
        /// A command's time limit in its sandboxes when `--command-timeout` is not given. Cold,
        /// on a 2-core machine at a load of 8 to 20: `cargo test` of a crate without
        /// dependencies took 8 to 14 s, `go test` of a one-file module 68 to 131 s (Go compiles
        /// its standard library into GOCACHE on first use); projects with dependencies take
        /// longer.
        command_timeout: Duration,
    },
    /// A test service (`--service`): a database in a container of its own that joins the
    /// sandbox's network namespace, so the project's tests reach it on 127.0.0.1. Only its own
    /// packages (a database image has no use for a compiler or git, and each extra package is
    /// more to trust), no toolchain labels, and never a project's image.
    Service(ServiceDef),
}

/// How a service image's server is run: read-only root, as `user`, every capability dropped,
/// no new privileges, an empty tmpfs on `data_dir`. Each one's start and probe were checked
/// exactly so (`tests/it/images.rs`); nothing else in the container is writable and nothing
/// else is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceDef {
    /// The server's argv, the container's command. It creates a fresh database under
    /// `data_dir` (the tmpfs starts empty at every start) and `exec`s the server, so the
    /// server is the container's first process and a stop's SIGTERM reaches it. It listens on
    /// 127.0.0.1 only: the network namespace is the sandbox's, and the server is for its tests
    /// alone. The database accepts its administrator with no password over TCP (the tests
    /// have no secret to be given, and only the sandbox can connect).
    pub start: &'static [&'static str],
    /// The readiness probe: an argv run in the service's container (`docker exec`, as `user`)
    /// that exits 0 once the server accepts connections on `port`, and not before (the
    /// first-start set-up before it listens on no TCP port).
    pub probe: &'static [&'static str],
    /// The TCP port it listens on, on 127.0.0.1 (the package's usual one, where a project's
    /// tests look by default).
    pub port: u16,
    /// How a client in the sandbox reaches it, as a URL: the administrator `start` lets in
    /// without a password, and the database it made, if any. Which variables carry it to the
    /// tests is the runtime's choice.
    pub url: &'static str,
    /// The user it runs as: the package's own, made by its maintainer script when the image
    /// was built. A name, not a number: the uid is whatever the build's `adduser` chose.
    pub user: &'static str,
    /// Where the runtime mounts an empty tmpfs writable by `user` (`mode=1777`: the uid is
    /// known only inside the image): the only writable path the server needs; the database,
    /// its sockets and its temporary files all go there, and are gone with the container.
    pub data_dir: &'static str,
    /// The directory of the server's programs when it is not on Debian's `PATH` (postgres:
    /// `/usr/lib/postgresql/VERSION/bin`): both builds put it first on the image's `PATH`, so
    /// `start` and `probe` name programs, not paths. Do not replace the image's `PATH`.
    pub bin_dir: Option<&'static str>,
    /// What the packages' maintainer scripts make at install that the service never uses (the
    /// default cluster or database: `start` makes its own under `data_dir`); both builds
    /// remove it, which makes the image smaller by as much. Shell globs, absolute.
    pub installed_state: &'static [&'static str],
}

/// The one writable directory of every service image (a tmpfs the runtime mounts): one path
/// for all, so the runtime mounts the same thing whatever the service.
pub const SERVICE_DATA_DIR: &str = "/var/lib/agentbox-service";

/// Debian's PATH, the one both builds give an image unless its service adds a directory.
const DEBIAN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// agentbox/postgres's server (see [`ServiceDef`]).
pub(crate) const POSTGRES: ServiceDef = ServiceDef {
    // initdb without fsync and the server with fsync off: the data is on a tmpfs and
    // thrown away with the container. The Unix socket goes to the data directory, as
    // /run/postgresql is read-only.
    start: &[
        "sh",
        "-c",
        "initdb -D /var/lib/agentbox-service/data -U postgres --auth=trust --no-sync \
         --no-instructions && exec postgres -D /var/lib/agentbox-service/data \
         -k /var/lib/agentbox-service -c listen_addresses=127.0.0.1 -c port=5432 -c fsync=off",
    ],
    probe: &[
        "pg_isready",
        "-q",
        "-h",
        "127.0.0.1",
        "-p",
        "5432",
        "-U",
        "postgres",
    ],
    port: 5432,
    url: "postgresql://postgres@127.0.0.1:5432/postgres",
    user: "postgres",
    data_dir: SERVICE_DATA_DIR,
    // Debian's /usr/bin has only the client wrappers (Perl, picking a version per
    // cluster); initdb and postgres are here. Trixie's PostgreSQL is 17, for as long as
    // the suite (`DEBIAN_SUITE`) is trixie.
    bin_dir: Some("/usr/lib/postgresql/17/bin"),
    // The `main` cluster postgresql-common's postinst creates (39 MB), and its
    // configuration: what pg_dropcluster would remove.
    installed_state: &["/var/lib/postgresql/*", "/etc/postgresql/*"],
};

/// agentbox/redis's server (see [`ServiceDef`]).
pub(crate) const REDIS: ServiceDef = ServiceDef {
    // No configuration file (Debian's would daemonize and write to /var/log), no
    // snapshot and no append-only file: nothing is written, the directory is only
    // where a snapshot would go if a test asked for one.
    start: &[
        "redis-server",
        "--bind",
        "127.0.0.1",
        "--port",
        "6379",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        "/var/lib/agentbox-service",
    ],
    // redis-cli exits 0 on an error reply too (a server still loading says LOADING):
    // ready is PONG.
    probe: &[
        "sh",
        "-c",
        "test \"$(redis-cli -h 127.0.0.1 -p 6379 ping)\" = PONG",
    ],
    port: 6379,
    url: "redis://127.0.0.1:6379",
    user: "redis",
    data_dir: SERVICE_DATA_DIR,
    bin_dir: None,
    installed_state: &[],
};

/// agentbox/mariadb's server (see [`ServiceDef`]).
pub(crate) const MARIADB: ServiceDef = ServiceDef {
    // The options both take in `o`. --auth-root-authentication-method=normal: root with
    // an empty password, also as root@127.0.0.1 (the default is root by Unix socket
    // only, which a test in the sandbox cannot reach). --skip-name-resolve: no lookup
    // of the client's address. The temporary directory is in the tmpfs (/tmp is
    // read-only). No native AIO: io_uring is refused by agentbox's seccomp profile and
    // libaio is one more thing a runtime may lack. A 16 MB redo log and the undo log in
    // the system tablespace: the default 96 MB log and three 10 MB undo files would be
    // 130 MB of the tmpfs, charged to the container's memory, for a test database.
    start: &[
        "sh",
        "-c",
        "o='--datadir=/var/lib/agentbox-service/data --tmpdir=/var/lib/agentbox-service/tmp \
         --skip-name-resolve --innodb-use-native-aio=0 --innodb-log-file-size=16M \
         --innodb-undo-tablespaces=0' && mkdir -p /var/lib/agentbox-service/tmp && \
         mariadb-install-db $o --auth-root-authentication-method=normal --skip-test-db && \
         exec mariadbd $o --socket=/var/lib/agentbox-service/mysqld.sock \
         --pid-file=/var/lib/agentbox-service/mysqld.pid --bind-address=127.0.0.1 --port=3306",
    ],
    // Exits 0 once the server answers, whatever it answers.
    probe: &[
        "mariadb-admin",
        "--host=127.0.0.1",
        "--port=3306",
        "--user=root",
        "--silent",
        "ping",
    ],
    port: 3306,
    url: "mysql://root@127.0.0.1:3306",
    user: "mysql",
    data_dir: SERVICE_DATA_DIR,
    bin_dir: None,
    // The database mariadb-server's postinst initialises (143 MB, most of the image
    // beside the programs).
    installed_state: &["/var/lib/mysql/*"],
};

pub const KNOWN: &[KnownImage] = &[
    KnownImage {
        name: "python",
        tag: DEFAULT_IMAGE,
        packages: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../images/python/packages"
        )),
        includes: &[],
        kind: ImageKind::Sandbox {
            command_timeout: Duration::from_secs(120),
        },
        approx_mb: 444,
    },
    KnownImage {
        name: "node",
        tag: "agentbox/node:1",
        packages: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/node/packages")),
        includes: &[],
        kind: ImageKind::Sandbox {
            command_timeout: Duration::from_secs(120),
        },
        approx_mb: 609,
    },
    KnownImage {
        name: "rust",
        tag: "agentbox/rust:1",
        packages: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/rust/packages")),
        includes: &[],
        kind: ImageKind::Sandbox {
            command_timeout: Duration::from_secs(600),
        },
        approx_mb: 877,
    },
    KnownImage {
        name: "go",
        tag: "agentbox/go:1",
        packages: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/go/packages")),
        includes: &[],
        kind: ImageKind::Sandbox {
            command_timeout: Duration::from_secs(600),
        },
        approx_mb: 663,
    },
    KnownImage {
        name: "polyglot",
        tag: "agentbox/polyglot:2",
        packages: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../images/polyglot/packages"
        )),
        includes: &["python", "node", "rust", "go"],
        kind: ImageKind::Sandbox {
            command_timeout: Duration::from_secs(600),
        },
        approx_mb: 1340,
    },
    KnownImage {
        name: "postgres",
        tag: "agentbox/postgres:1",
        packages: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../images/postgres/packages"
        )),
        includes: &[],
        kind: ImageKind::Service(POSTGRES),
        approx_mb: 399,
    },
    KnownImage {
        name: "redis",
        tag: "agentbox/redis:1",
        packages: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../images/redis/packages"
        )),
        includes: &[],
        kind: ImageKind::Service(REDIS),
        approx_mb: 86,
    },
    KnownImage {
        name: "mariadb",
        tag: "agentbox/mariadb:1",
        packages: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../images/mariadb/packages"
        )),
        includes: &[],
        kind: ImageKind::Service(MARIADB),
        approx_mb: 329,
    },
];

fn package_lines(text: &'static str) -> impl Iterator<Item = &'static str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

impl KnownImage {
    /// By name (`rust`) or tag (`agentbox/rust:1`), of either kind: what `agentbox image build`
    /// takes.
    pub fn by_name(name: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.name == name || k.tag == name)
    }

    /// By tag only: what `--image` names is a Docker reference, and `rust` there is someone
    /// else's image.
    pub fn by_tag(tag: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.tag == tag)
    }

    /// The sandbox image of that name (`rust`): what a project is given. A service image is
    /// not one, whatever the name.
    pub fn sandbox_named(name: &str) -> Option<&'static KnownImage> {
        Self::sandboxes().find(|k| k.name == name)
    }

    /// The service image of that name (`postgres`): what `--service` names.
    #[cfg(test)]
    fn service_named(name: &str) -> Option<&'static KnownImage> {
        Self::services().find(|k| k.name == name)
    }

    pub fn sandboxes() -> impl Iterator<Item = &'static KnownImage> {
        KNOWN.iter().filter(|k| k.is_sandbox())
    }

    pub fn services() -> impl Iterator<Item = &'static KnownImage> {
        KNOWN.iter().filter(|k| k.service().is_some())
    }

    pub fn is_sandbox(&self) -> bool {
        matches!(self.kind, ImageKind::Sandbox { .. })
    }

    /// How its server runs, for a service image.
    pub fn service(&self) -> Option<&ServiceDef> {
        match &self.kind {
            ImageKind::Service(def) => Some(def),
            ImageKind::Sandbox { .. } => None,
        }
    }

    /// A command's default time limit in its sandboxes (none for a service image: no
    /// project's command runs there).
    pub fn command_timeout(&self) -> Option<Duration> {
        match self.kind {
            ImageKind::Sandbox { command_timeout } => Some(command_timeout),
            ImageKind::Service(_) => None,
        }
    }

    /// Every Debian package of the image: for a sandbox the common ones, those of the images
    /// it includes, its own; for a service its own only.
    pub fn package_list(&self) -> Vec<&'static str> {
        let common = if self.is_sandbox() { COMMON_PACKAGES } else { "" };
        let included = self
            .includes
            .iter()
            .filter_map(|n| KNOWN.iter().find(|k| k.name == *n))
            .flat_map(|k| package_lines(k.packages));
        let mut list: Vec<&'static str> = Vec::new();
        for p in package_lines(common)
            .chain(included)
            .chain(package_lines(self.packages))
        {
            if !list.contains(&p) {
                list.push(p);
            }
        }
        list
    }

    /// The image's `PATH`: Debian's, after the service's own program directory if it has one.
    pub fn path(&self) -> String {
        match self.service().and_then(|s| s.bin_dir) {
            Some(dir) => format!("{dir}:{DEBIAN_PATH}"),
            None => DEBIAN_PATH.to_string(),
        }
    }

    /// What the packages' maintainer scripts left that the image does without (see
    /// [`ServiceDef::installed_state`]).
    pub(super) fn installed_state(&self) -> &'static [&'static str] {
        match self.kind {
            ImageKind::Service(def) => def.installed_state,
            ImageKind::Sandbox { .. } => &[],
        }
    }

    pub(super) fn revision(&self) -> &'static str {
        self.tag.rsplit(':').next().unwrap_or("1")
    }

    /// Where a build puts the image before its labels are added; overwritten by the next
    /// build, so an interrupted one leaves at most one such tag behind.
    pub(super) fn unlabelled_tag(&self) -> String {
        format!("{}-unlabelled", self.tag)
    }

    /// The Dockerfile its build sends: `images/Dockerfile` with its name, revision, `PATH`
    /// and what to remove after the install.
    pub fn dockerfile(&self) -> String {
        let removed: String = self.installed_state().iter().map(|p| format!(" {p}")).collect();
        DOCKERFILE
            .replace("@NAME@", self.name)
            .replace("@REVISION@", self.revision())
            .replace("@PATH@", &self.path())
            .replace(" @INSTALLED_STATE@", &removed)
    }

    pub(super) fn context_tar(&self) -> std::io::Result<Vec<u8>> {
        let mut packages = self.package_list().join("\n");
        packages.push('\n');
        tar_of(&[("Dockerfile", &self.dockerfile()), ("packages", &packages)])
    }
}

pub(super) fn tar_of(files: &[(&str, &str)]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, body) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, body.as_bytes())?;
    }
    builder.into_inner()
}

/// How to get an agentbox image when the daemon does not have it.
pub(super) fn build_hint(known: &KnownImage) -> String {
    format!(
        "build it with `agentbox image build {0}`, or without a container registry from Debian \
         packages with `agentbox image build {0} --offline` (`just image` builds them all)",
        known.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_builds_read_one_package_list() {
        let python = KnownImage::by_name("python").unwrap();
        let list = python.package_list();
        for p in [
            "python3",
            "python3-pytest",
            "python3-pip",
            "python3-venv",
            "git",
            "ripgrep",
            "procps",
            "make",
            "gcc",
            "libc6-dev",
            "ca-certificates",
        ] {
            assert!(list.contains(&p), "{p} missing from {list:?}");
        }
        assert!(python.dockerfile().contains("COPY packages"));
        assert!(KnownImage::by_name(DEFAULT_IMAGE).is_some());
        assert!(
            KnownImage::by_tag("python").is_none(),
            "`--image python` is Docker Hub's"
        );
    }

    #[test]
    fn every_image_has_the_common_tools_and_polyglot_has_everything() {
        let polyglot = KnownImage::by_name("polyglot").unwrap().package_list();
        for k in KnownImage::sandboxes() {
            let list = k.package_list();
            for common in [
                "git",
                "ripgrep",
                "procps",
                "make",
                "gcc",
                "libc6-dev",
                "ca-certificates",
            ] {
                assert!(list.contains(&common), "{}: no {common}", k.name);
            }
            for p in &list {
                assert!(polyglot.contains(p), "polyglot lacks {p} of {}", k.name);
            }
        }
        for k in KNOWN {
            // The Dockerfile's labels agree with the tag, and it takes the one suite.
            assert!(
                k.dockerfile().contains(&format!(
                    "LABEL org.agentbox.image=\"{}\" org.agentbox.image.revision=\"{}\"",
                    k.name,
                    k.revision()
                )),
                "{}",
                k.name
            );
            assert!(k.dockerfile().contains("FROM debian:${SUITE}-slim"), "{}", k.name);
            let dockerfile = k.dockerfile();
            assert!(
                dockerfile
                    .match_indices('@')
                    .all(|(i, _)| !dockerfile[i + 1..].starts_with(|c: char| c.is_ascii_uppercase())),
                "{}: a word left unfilled in {dockerfile}",
                k.name
            );
            assert_eq!(k.tag, format!("agentbox/{}:{}", k.name, k.revision()));
        }
        for (name, tool) in [("node", "npm"), ("rust", "cargo"), ("go", "golang-go")] {
            assert!(KnownImage::by_name(name).unwrap().package_list().contains(&tool));
        }
    }

    #[test]
    fn service_images_have_their_own_packages_only_and_are_never_a_sandbox() {
        let common: Vec<&str> = package_lines(COMMON_PACKAGES).collect();
        let names: Vec<&str> = KnownImage::services().map(|k| k.name).collect();
        assert_eq!(names, ["postgres", "redis", "mariadb"]);
        for k in KnownImage::services() {
            let list = k.package_list();
            assert_eq!(list, package_lines(k.packages).collect::<Vec<_>>(), "{}", k.name);
            for p in &common {
                assert!(!list.contains(p), "{}: {p} of images/common/packages", k.name);
            }
            assert!(!k.is_sandbox() && k.command_timeout().is_none() && k.includes.is_empty());
            assert!(KnownImage::sandbox_named(k.name).is_none(), "{}", k.name);
            assert!(KnownImage::sandboxes().all(|s| s.tag != k.tag));
            assert_eq!(KnownImage::service_named(k.name).map(|s| s.tag), Some(k.tag));
            assert!(k.approx_mb > 0, "{}", k.name);
        }
        // And no sandbox is a service, nor includes one.
        for k in KnownImage::sandboxes() {
            assert!(
                k.service().is_none() && k.command_timeout().is_some(),
                "{}",
                k.name
            );
            assert!(KnownImage::service_named(k.name).is_none());
            for n in k.includes {
                assert!(KnownImage::sandbox_named(n).is_some(), "{} includes {n}", k.name);
            }
        }
        assert_eq!(
            KnownImage::sandboxes().count() + KnownImage::services().count(),
            KNOWN.len()
        );
    }

    #[test]
    fn a_service_runs_from_its_data_directory_on_its_port() {
        for k in KnownImage::services() {
            let s = k.service().unwrap();
            let start = s.start.join(" ");
            let probe = s.probe.join(" ");
            assert_eq!(s.data_dir, SERVICE_DATA_DIR);
            assert!(start.contains(s.data_dir), "{}: {start}", k.name);
            assert!(
                s.url.contains(&format!("@127.0.0.1:{}", s.port))
                    || s.url.ends_with(&format!("//127.0.0.1:{}", s.port)),
                "{}",
                s.url
            );
            for text in [&start, &probe] {
                assert!(text.contains(&s.port.to_string()), "{}: {text}", k.name);
                assert!(text.contains("127.0.0.1"), "{}: {text}", k.name);
                assert!(
                    !text.contains("localhost"),
                    "{}: a name to resolve: {text}",
                    k.name
                );
            }
            // A shell script execs the server: it is the first process, and gets the stop's
            // signal.
            if s.start[0] == "sh" {
                assert_eq!(s.start.len(), 3, "{}", k.name);
                assert!(s.start[2].contains("&& exec "), "{}: {start}", k.name);
            }
            // The removals are globs below the root, which the offline build prefixes with
            // its root filesystem and the shell word-splits: no quote, space or `..`.
            for p in s.installed_state {
                assert!(p.starts_with('/') && p.len() > 1, "{p}");
                assert!(
                    !p.contains(['"', '\'', ' ', '$', '\\']) && !p.contains(".."),
                    "{p}"
                );
                assert!(k.dockerfile().contains(&format!(" {p}")), "{}", k.name);
            }
            match s.bin_dir {
                Some(dir) => assert!(k.path().starts_with(&format!("{dir}:"))),
                None => assert_eq!(k.path(), DEBIAN_PATH),
            }
            assert!(k.dockerfile().contains(&format!("ENV PATH={}\n", k.path())));
        }
        let python = KnownImage::by_name("python").unwrap();
        assert_eq!(python.path(), DEBIAN_PATH);
        assert!(
            python
                .dockerfile()
                .contains("rm -rf /var/lib/apt/lists/* /tmp/packages\n"),
            "{}",
            python.dockerfile()
        );
    }

    #[test]
    fn the_build_context_holds_the_dockerfile_and_the_whole_package_list() {
        let known = KnownImage::by_name("rust").unwrap();
        let tar = known.context_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut files = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut body = String::new();
            std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
            files.push((name, body));
        }
        assert_eq!(files[0].0, "Dockerfile");
        assert_eq!(files[1].0, "packages");
        let listed: Vec<&str> = files[1].1.lines().collect();
        assert_eq!(listed, known.package_list());
    }
}
