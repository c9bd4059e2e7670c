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
    /// A command's time limit in its sandboxes when `--command-timeout` is not given. Cold, on
    /// a 2-core machine at a load of 8 to 20: `cargo test` of a crate without dependencies took
    /// 8 to 14 s, `go test` of a one-file module 68 to 131 s (Go compiles its standard library
    /// into GOCACHE on first use); projects with dependencies take longer.
    pub command_timeout: Duration,
    /// Its size once built, in MB (`docker images`, built offline from Debian trixie): what a
    /// first use that has to build it says to expect.
    pub approx_mb: u32,
}

pub const KNOWN: &[KnownImage] = &[
    KnownImage {
        name: "python",
        tag: DEFAULT_IMAGE,
        packages: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../images/python/packages"
        )),
        includes: &[],
        command_timeout: Duration::from_secs(120),
        approx_mb: 444,
    },
    KnownImage {
        name: "node",
        tag: "agentbox/node:1",
        packages: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/node/packages")),
        includes: &[],
        command_timeout: Duration::from_secs(120),
        approx_mb: 609,
    },
    KnownImage {
        name: "rust",
        tag: "agentbox/rust:1",
        packages: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/rust/packages")),
        includes: &[],
        command_timeout: Duration::from_secs(600),
        approx_mb: 877,
    },
    KnownImage {
        name: "go",
        tag: "agentbox/go:1",
        packages: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/go/packages")),
        includes: &[],
        command_timeout: Duration::from_secs(600),
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
        command_timeout: Duration::from_secs(600),
        approx_mb: 1340,
    },
];

fn package_lines(text: &'static str) -> impl Iterator<Item = &'static str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

impl KnownImage {
    /// By name (`rust`) or tag (`agentbox/rust:1`).
    pub fn by_name(name: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.name == name || k.tag == name)
    }

    /// By tag only: what `--image` names is a Docker reference, and `rust` there is someone
    /// else's image.
    pub fn by_tag(tag: &str) -> Option<&'static KnownImage> {
        KNOWN.iter().find(|k| k.tag == tag)
    }

    /// Every Debian package of the image: the common ones, those of the images it includes,
    /// its own.
    pub fn package_list(&self) -> Vec<&'static str> {
        let included = self
            .includes
            .iter()
            .filter_map(|n| KNOWN.iter().find(|k| k.name == *n))
            .flat_map(|k| package_lines(k.packages));
        let mut list: Vec<&'static str> = Vec::new();
        for p in package_lines(COMMON_PACKAGES)
            .chain(included)
            .chain(package_lines(self.packages))
        {
            if !list.contains(&p) {
                list.push(p);
            }
        }
        list
    }

    pub(super) fn revision(&self) -> &'static str {
        self.tag.rsplit(':').next().unwrap_or("1")
    }

    /// Where a build puts the image before its toolchain labels are added; overwritten by the
    /// next build, so an interrupted one leaves at most one such tag behind.
    pub(super) fn unlabelled_tag(&self) -> String {
        format!("{}-unlabelled", self.tag)
    }

    /// The Dockerfile its build sends: `images/Dockerfile` with its name and revision.
    pub fn dockerfile(&self) -> String {
        DOCKERFILE
            .replace("@NAME@", self.name)
            .replace("@REVISION@", self.revision())
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
        for k in KNOWN {
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
            assert_eq!(k.tag, format!("agentbox/{}:{}", k.name, k.revision()));
        }
        for (name, tool) in [("node", "npm"), ("rust", "cargo"), ("go", "golang-go")] {
            assert!(KnownImage::by_name(name).unwrap().package_list().contains(&tool));
        }
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
