//! What the setup phase does for a project by default, where what it installs lives, and
//! which files decide whether a cache still fits.
//!
//! Everything setup installs goes under [`DEPS_DIR`] (a cache volume, read-only in the agent
//! phase), never into the user's checkout, except `node_modules`, which Node's resolution
//! wants next to `package.json`.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::detect::{Detection, Ecosystem, read_project_file};

/// Where the cache volume is mounted.
pub const DEPS_DIR: &str = "/opt/agentbox-deps";
/// The Python virtualenv setup creates.
pub const VENV: &str = "/opt/agentbox-deps/venv";
/// What setup pre-builds for the tests (the build cache), one directory a tool: each is copied
/// into the session's own `CACHE_DIR` when a sandbox starts (see [`Prebuild`]).
pub const BUILD_DIR: &str = "/opt/agentbox-deps/build";

fn present(root: &Path, name: &str) -> bool {
    root.join(name).symlink_metadata().is_ok_and(|m| m.is_file())
}

fn text(root: &Path, name: &str) -> String {
    read_project_file(root, name)
        .map(|d| String::from_utf8_lossy(&d).into_owned())
        .unwrap_or_default()
}

fn declares_node_dependencies(root: &Path) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text(root, "package.json")) else {
        return false;
    };
    ["dependencies", "devDependencies", "optionalDependencies"]
        .iter()
        .any(|k| {
            v.get(k)
                .and_then(|d| d.as_object())
                .is_some_and(|o| !o.is_empty())
        })
}

fn declares_rust_dependencies(root: &Path) -> bool {
    let lock = text(root, "Cargo.lock");
    if lock.contains("source = \"registry+")
        || lock.contains("source = \"git+")
        || lock.contains("source = \"sparse+")
    {
        return true;
    }
    let mut in_deps = false;
    for line in text(root, "Cargo.toml").lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l.contains("dependencies");
            // `[dependencies.NAME]` is itself a dependency.
            if in_deps && l.trim_matches(['[', ']']).contains("dependencies.") {
                return true;
            }
        } else if in_deps && l.contains('=') && !l.starts_with('#') {
            return true;
        }
    }
    false
}

/// What setup does by default: the commands for the detected ecosystems that have something
/// to install, and for each ecosystem what it installs and why, or why nothing (a project with
/// nothing to install gets no container or cache for it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    pub commands: Vec<(Ecosystem, String)>,
    /// One line per ecosystem, for `agentbox: setup: ...`.
    pub notes: Vec<String>,
    /// A command runs the project's own build code (a package installed from the checkout, a
    /// local path): what it reads cannot be bounded, so the cache key digests the project.
    pub runs_project_code: bool,
}

/// The command that makes the venv every setup command then runs in. The image's own
/// packages (pytest) stay visible inside it.
pub fn venv_command() -> String {
    format!("python3 -m venv --system-site-packages {VENV}")
}

/// The default setup for the detected ecosystems (see [`Defaults`]).
pub fn defaults(root: &Path, detection: &Detection) -> Defaults {
    let mut out = Defaults::default();
    for (eco, _) in &detection.ecosystems {
        let (cmd, note) = match eco {
            Ecosystem::Python => match super::python::setup(root) {
                super::python::PythonSetup::Install {
                    command,
                    why,
                    runs_project_code,
                } => {
                    out.runs_project_code |= runs_project_code;
                    (Some(command), why)
                }
                super::python::PythonSetup::Nothing(why) => (None, why),
            },
            Ecosystem::Node if !declares_node_dependencies(root) => (
                None,
                "Node: nothing to install: package.json declares no dependencies, devDependencies or \
                 optionalDependencies"
                    .into(),
            ),
            Ecosystem::Node => {
                let lock = ["package-lock.json", "npm-shrinkwrap.json"]
                    .into_iter()
                    .find(|f| present(root, f));
                // npm runs the root package's own lifecycle scripts (`prepare`, `install`).
                out.runs_project_code = true;
                match lock {
                    Some(lock) => (
                        Some("npm ci".to_string()),
                        format!(
                            "Node: installing package.json's dependencies and devDependencies as {lock} pins them"
                        ),
                    ),
                    None => (
                        Some("npm install".to_string()),
                        "Node: installing package.json's dependencies and devDependencies (no lockfile)"
                            .into(),
                    ),
                }
            }
            Ecosystem::Rust if declares_rust_dependencies(root) => {
                // Cargo's configuration can name programs it runs (`build.rustc-wrapper`,
                // `build.rustc`, a linker): with one of the project's files there, setup may
                // run the project's code.
                if present(root, ".cargo/config.toml") || present(root, ".cargo/config") {
                    out.runs_project_code = true;
                }
                (
                    Some("cargo fetch".to_string()),
                    "Rust: fetching the crates Cargo.toml and Cargo.lock name".into(),
                )
            }
            Ecosystem::Rust => (
                None,
                "Rust: nothing to fetch: Cargo.toml declares no dependencies".into(),
            ),
            Ecosystem::Go if text(root, "go.mod").contains("require") => (
                Some("go mod download".to_string()),
                "Go: downloading the modules go.mod requires".into(),
            ),
            Ecosystem::Go => (None, "Go: nothing to download: go.mod requires no module".into()),
        };
        out.notes.push(note);
        if let Some(cmd) = cmd {
            out.commands.push((*eco, cmd));
        }
    }
    out
}

/// What setup builds for the tests after its commands, into [`BUILD_DIR`]: the build cache.
///
/// Only code the cache key already pins runs: the registry's crates as Cargo.lock names them
/// (the project's own packages are stubs, see `cargo_skeleton.py`), and Go's compiler on the
/// module (no test binary runs: `-exec /bin/true`). What it holds is then safe to share between
/// sessions while the key holds: a registry crate's artifacts are keyed by its version and
/// features, Go's cache by the hash of every input; neither holds a test result (Go's are
/// cleaned, cargo keeps none), and nothing of the project's own crates (cargo trusts a local
/// package's artifacts while its sources are older than them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prebuild {
    Rust,
    Go,
}

/// The cargo target directory and the Go build cache under [`BUILD_DIR`]; the session's copies
/// are the sandbox's `CARGO_TARGET_DIR` and `GOCACHE` (same names under `CACHE_DIR`).
pub const CARGO_TARGET: &str = "cargo-target";
pub const GO_CACHE: &str = "go-build";

/// Where the skeleton of a Rust project is made during setup (the setup container's own
/// scratch volume, gone with it).
const SKELETON: &str = "/var/tmp/agentbox-skeleton";

impl Prebuild {
    /// The pre-builds a project gets: Rust when it has dependencies to compile; Go always (the
    /// standard library is compiled into the build cache on first use: about 30 s on 2 cores).
    pub fn for_project(root: &Path, detection: &Detection) -> Vec<Prebuild> {
        detection
            .ecosystems
            .iter()
            .filter_map(|(eco, _)| match eco {
                Ecosystem::Rust if declares_rust_dependencies(root) => Some(Prebuild::Rust),
                Ecosystem::Go => Some(Prebuild::Go),
                _ => None,
            })
            .collect()
    }

    /// The toolchain it needs.
    pub fn toolchain(self) -> crate::toolchain::Toolchain {
        match self {
            Prebuild::Rust => crate::toolchain::Toolchain::Rust,
            Prebuild::Go => crate::toolchain::Toolchain::Go,
        }
    }

    /// What setup says it does.
    pub fn describe(self) -> &'static str {
        match self {
            Prebuild::Rust => {
                "Rust: pre-building the registry's crates for `cargo test` (the project's own packages as \
                 empty stubs: none of its code runs)"
            }
            Prebuild::Go => {
                "Go: pre-building the standard library and the modules for `go test` (compiled, no test run)"
            }
        }
    }

    /// The shell command, run in the setup container from the project's root.
    pub fn command(self) -> String {
        match self {
            Prebuild::Rust => format!(
                "command -v cargo >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || \
                 {{ echo 'no cargo or python3 in the image: nothing pre-built'; exit 0; }}\n\
                 python3 - {SKELETON} {BUILD_DIR}/{CARGO_TARGET} <<'AGENTBOX_SKELETON'\n{}\nAGENTBOX_SKELETON",
                include_str!("cargo_skeleton.py")
            ),
            // A package that does not compile (the bug the agent is to fix) still leaves the
            // others cached. Test results are never kept: `-exec /bin/true` runs no test binary,
            // and the test cache is expired anyway.
            Prebuild::Go => format!(
                "command -v go >/dev/null 2>&1 || {{ echo 'no go in the image: nothing pre-built'; exit 0; }}\n\
                 export GOCACHE={BUILD_DIR}/{GO_CACHE}; go test -count=1 -exec /bin/true -run '^$' ./... >/dev/null; \
                 s=$?; go clean -testcache; exit $s"
            ),
        }
    }
}

/// The default setup commands (see [`defaults`]).
pub fn default_commands(root: &Path, detection: &Detection) -> Vec<(Ecosystem, String)> {
    defaults(root, detection).commands
}

pub use super::cache_key::{cache_key, cache_key_as_found, file_state, file_states, written};

/// A short digest of the project's path: which project a cache belongs to.
pub fn project_key(root: &Path) -> String {
    let canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    hex(&Sha256::digest(canonical.to_string_lossy().as_bytes()))[..12].to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Which phase an environment is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Setup,
    Agent,
}

/// Where each tool keeps what setup installs, in both phases; in the agent phase each tool is
/// also told to stay offline (the sandbox's fixed environment already says so).
pub fn env(phase: Phase, base_path: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("VIRTUAL_ENV".to_string(), VENV.to_string()),
        ("PATH".to_string(), format!("{VENV}/bin:{base_path}")),
        ("CARGO_HOME".to_string(), format!("{DEPS_DIR}/cargo")),
        ("GOMODCACHE".to_string(), format!("{DEPS_DIR}/go-mod")),
    ];
    match phase {
        Phase::Setup => env.extend([
            ("npm_config_cache".to_string(), format!("{DEPS_DIR}/npm")),
            ("npm_config_offline".to_string(), "false".to_string()),
            ("CARGO_NET_OFFLINE".to_string(), "false".to_string()),
        ]),
        Phase::Agent => env.extend([
            ("PIP_NO_INDEX".to_string(), "1".to_string()),
            ("npm_config_offline".to_string(), "true".to_string()),
            ("CARGO_NET_OFFLINE".to_string(), "true".to_string()),
            ("GOPROXY".to_string(), "off".to_string()),
        ]),
    }
    env
}

/// A command, run in the image (not in the project: a project's own `.npmrc` or `pip.conf` is
/// the attacker's word), that prints the URLs of the registry its package manager uses by
/// default, one a line. `None`: no such question for this ecosystem.
pub fn registry_question(eco: Ecosystem) -> Option<&'static str> {
    match eco {
        Ecosystem::Python => Some(
            "python3 -m pip config get global.index-url 2>/dev/null || python3 -c \
             'from pip._internal.models.index import PyPI; print(PyPI.simple_url); \
             print(\"https://\" + PyPI.file_storage_domain + \"/\")'",
        ),
        Ecosystem::Node => Some("npm config get registry"),
        // The sandbox's own GOPROXY=off is not the image's default: ask without it.
        Ecosystem::Go => Some("env -u GOPROXY -u GOSUMDB -u GOFLAGS go env GOPROXY GOSUMDB"),
        // Cargo has no stable way to print its default registry: setup probes for it (see
        // `cargo_probe`).
        Ecosystem::Rust => None,
    }
}

/// A shell script that makes cargo ask its default registry for a package, from an empty
/// directory with an empty `CARGO_HOME` (so neither the project's nor a cache's configuration
/// counts, only the image's cargo and its environment), with the proxy allowing nothing: the
/// host it asks the proxy for is the index's. It fails; that is expected.
pub fn cargo_probe() -> &'static str {
    "d=$(mktemp -d) && mkdir -p \"$d/home\" \"$d/probe/src\" && cd \"$d/probe\" && \
     printf '[package]\\nname = \"agentbox-probe\"\\nversion = \"0.0.0\"\\nedition = \"2021\"\\n\\n[dependencies]\\nagentbox-registry-probe = \"1\"\\n' > Cargo.toml && \
     : > src/lib.rs && \
     CARGO_HOME=\"$d/home\" CARGO_NET_OFFLINE=false CARGO_NET_RETRY=0 CARGO_HTTP_TIMEOUT=30 \
     cargo generate-lockfile >/dev/null 2>&1; cd / && rm -rf \"$d\"; true"
}

/// A Python one-liner that prints the download URL (`dl`) of the sparse index at the URL given
/// as its argument (its `config.json`), through the sandbox's proxy.
pub const CARGO_INDEX_CONFIG: &str = "import json, sys, urllib.request as u; \
     print(json.load(u.urlopen(sys.argv[1].rstrip('/') + '/config.json', timeout=30)).get('dl', ''))";

/// Host rules (`HOST` or `HOST:PORT`) from what a registry question printed: URLs, Go's
/// comma- or pipe-separated proxy lists and its checksum database's name.
pub fn hosts_from_answer(answer: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in answer.split(|c: char| c.is_whitespace() || c == ',' || c == '|') {
        let item = item.trim();
        if item.is_empty() || matches!(item, "direct" | "off" | "undefined" | "null") {
            continue;
        }
        // GOSUMDB may be "NAME+KEY URL"; its first word is a host.
        let (scheme, rest) = match item.split_once("://") {
            Some((s, r)) => (Some(s), r),
            None => (None, item),
        };
        if scheme.is_some_and(|s| !matches!(s, "http" | "https")) {
            continue;
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let authority = authority.rsplit('@').next().unwrap_or_default();
        let authority = authority.split('+').next().unwrap_or_default();
        let default_port = if scheme == Some("http") { 80 } else { 443 };
        let rule = match authority.rsplit_once(':') {
            Some((h, p))
                if !h.contains(':')
                    && p.parse::<u16>()
                        .is_ok_and(|p| p != default_port && p != 443 && p != 80) =>
            {
                format!("{h}:{p}")
            }
            Some((h, _)) if !h.contains(':') => h.to_string(),
            _ => authority.to_string(),
        };
        if !rule.is_empty() && rule.parse::<crate::egress::Rule>().is_ok() && !out.contains(&rule) {
            out.push(rule);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lockfile stable cargo writes into a crate that has none (`cargo fetch`).
    const CARGO_LOCK: &str = "Cargo.lock";

    #[test]
    fn registry_answers_become_host_rules() {
        assert_eq!(
            hosts_from_answer("https://registry.example/simple\nhttps://files.example/\n"),
            ["registry.example", "files.example"]
        );
        assert_eq!(
            hosts_from_answer("https://npm.registry.example/\n"),
            ["npm.registry.example"]
        );
        assert_eq!(
            hosts_from_answer("https://proxy.example,direct\nsum.example\n"),
            ["proxy.example", "sum.example"]
        );
        assert_eq!(
            hosts_from_answer("http://mirror.example:8080/pypi/simple"),
            ["mirror.example:8080"]
        );
        assert_eq!(hosts_from_answer("off\n"), Vec::<String>::new());
        assert_eq!(hosts_from_answer("file:///srv/wheels"), Vec::<String>::new());
    }

    #[test]
    fn prebuilds_follow_the_ecosystems_and_cargo_configuration_counts_as_project_code() {
        let (_dir, root) = crate::project::detect::project(&[
            ("Cargo.toml", "[package]\nname = \"x\"\nversion = \"0.1.0\"\n"),
            ("go.mod", "module x\n\ngo 1.21\n"),
        ]);
        let d = crate::project::detect(&root);
        assert_eq!(
            Prebuild::for_project(&root, &d),
            [Prebuild::Go],
            "a crate with nothing to fetch has nothing to pre-build; a Go module always has"
        );
        std::fs::write(
            root.join("Cargo.toml"),
            "[package]\nname = \"x\"\nversion = \"0.1.0\"\n\n[dev-dependencies]\nitoa = \"1\"\n",
        )
        .unwrap();
        let d = crate::project::detect(&root);
        let mut found = Prebuild::for_project(&root, &d);
        found.sort_by_key(|p| *p == Prebuild::Go);
        assert_eq!(found, [Prebuild::Rust, Prebuild::Go]);
        assert!(!defaults(&root, &d).runs_project_code);
        std::fs::create_dir_all(root.join(".cargo")).unwrap();
        std::fs::write(
            root.join(".cargo/config.toml"),
            "[build]\nrustc-wrapper = \"tools/w\"\n",
        )
        .unwrap();
        assert!(
            defaults(&root, &d).runs_project_code,
            "cargo's configuration can name a program of the project's"
        );
        // The skeleton script goes into a quoted here-document: its terminator never occurs in it.
        let script = Prebuild::Rust.command();
        assert_eq!(script.matches("\nAGENTBOX_SKELETON").count(), 1, "{script}");
        assert!(script.contains("cargo\", \"clean\""), "{script}");
    }

    #[test]
    fn defaults_follow_the_lockfiles() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("requirements.txt"), "x==1\n").unwrap();
        std::fs::write(
            dir.path().join("package.json"),
            r#"{"dependencies": {"left-pad": "1"}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("package-lock.json"), "{}").unwrap();
        let d = crate::project::detect(dir.path());
        let cmds: Vec<String> = default_commands(dir.path(), &d)
            .into_iter()
            .map(|c| c.1)
            .collect();
        assert!(
            cmds.iter().any(|c| c == "pip install -r requirements.txt"),
            "{cmds:?}"
        );
        assert!(cmds.contains(&"npm ci".to_string()), "{cmds:?}");
        let (_only_dev, dev_root) = crate::project::detect::project(&[(
            "package.json",
            r#"{"devDependencies": {"left-pad": "1"}, "scripts": {"test": "x"}}"#,
        )]);
        let d = crate::project::detect(&dev_root);
        assert_eq!(
            default_commands(&dev_root, &d),
            [(Ecosystem::Node, "npm install".to_string())],
            "devDependencies count"
        );
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"x\"\n[dependencies]\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("go.mod"), "module x\n\ngo 1.21\n").unwrap();
        let d = crate::project::detect(dir.path());
        let cmds2: Vec<String> = default_commands(dir.path(), &d)
            .into_iter()
            .map(|c| c.1)
            .collect();
        assert_eq!(cmds2.len(), 2, "no dependencies, no setup: {cmds2:?}");
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"x\"\n[dependencies]\nserde = \"1\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("go.mod"),
            "module x\n\ngo 1.21\nrequire example.com/y v1.0.0\n",
        )
        .unwrap();
        let d = crate::project::detect(dir.path());
        let cmds3: Vec<String> = default_commands(dir.path(), &d)
            .into_iter()
            .map(|c| c.1)
            .collect();
        assert!(
            cmds3.contains(&"cargo fetch".to_string()) && cmds3.contains(&"go mod download".to_string()),
            "{cmds3:?}"
        );
        let k1 = cache_key(dir.path(), "img", 1000, &cmds, false);
        assert_eq!(k1, cache_key(dir.path(), "img", 1000, &cmds, false));
        std::fs::write(dir.path().join("requirements.txt"), "x==2\n").unwrap();
        assert_ne!(
            k1,
            cache_key(dir.path(), "img", 1000, &cmds, false),
            "a lockfile changed"
        );
        for code in [false, true] {
            let _ = std::fs::remove_file(dir.path().join(CARGO_LOCK));
            let as_found = std::collections::BTreeMap::from([(CARGO_LOCK.to_string(), None)]);
            let without = cache_key_as_found(dir.path(), "img", 1000, &cmds, code, &as_found);
            std::fs::write(dir.path().join(CARGO_LOCK), "# written by cargo\n").unwrap();
            assert_eq!(
                without,
                cache_key_as_found(dir.path(), "img", 1000, &cmds, code, &as_found),
                "a skipped file does not count (every file: {code})"
            );
            assert_ne!(without, cache_key(dir.path(), "img", 1000, &cmds, code));
            let _ = std::fs::remove_file(dir.path().join(CARGO_LOCK));
            assert_eq!(
                without,
                cache_key(dir.path(), "img", 1000, &cmds, code),
                "skipped is as if absent: the key the cache was filled under"
            );
        }
    }
}
