//! The corpus: real packages that other people wrote and published, fetched by name and pinned
//! version from the registries this machine reaches (PyPI sdists through the host's pip,
//! crates.io crates through a throwaway `cargo fetch`) into a temporary directory at test time —
//! their code is never committed. For each, with **no flags**:
//!
//! 1. `agentbox run`, a scripted model that changes nothing: setup installs what the package's
//!    own CI would, the tests run before the model's first turn and after its last: PASS.
//! 2. `agentbox run` again: served from the cache (no setup container, no proxy: the report has
//!    no egress decision at all), PASS.
//! 3. A one-line bug injected into the checkout, `agentbox run`: FAIL.
//!
//! The packages were chosen by general criteria (small, widely used, ships its tests), to cover
//! the shapes real projects come in: a flat module, a src layout, a C extension, test extras,
//! dependency groups, test requirement files, runtime dependencies, every common build backend,
//! a crate with dev-dependencies and one without a lockfile. Each test prints one row of the
//! corpus table (`cargo test --test it -- corpus:: --nocapture`).
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::Project;
use crate::support::scripted::{Run, done, finish_within, spawn_run};
use serde_json::{Value, json};

/// Where a package is published.
#[derive(Clone, Copy)]
enum Registry {
    /// A source distribution from the Python package index pip is configured with.
    Pypi,
    /// A crate from cargo's default registry.
    Crates,
}

/// One package of the corpus, and the bug injected into it.
struct Case {
    registry: Registry,
    name: &'static str,
    version: &'static str,
    /// A file of the package (relative to its root), a line of it that occurs exactly once, and
    /// what the bug makes of it.
    bug: (&'static str, &'static str, &'static str),
}

/// A whole run may take this long: a cold setup builds a package and its build backend, and a
/// crate's first `cargo test` compiles its dependencies, on 2 loaded cores.
const RUN_LIMIT: Duration = Duration::from_secs(900);

/// Fetch the package's published source into a fresh directory; its root.
fn fetch(case: &Case, into: &Path) -> PathBuf {
    match case.registry {
        Registry::Pypi => {
            let out = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                ])
                .arg(format!("{}=={}", case.name, case.version))
                .arg("-d")
                .arg(into)
                .output()
                .expect("python3 -m pip");
            assert!(
                out.status.success(),
                "pip download {}: {}",
                case.name,
                crate::support::text(&out.stderr)
            );
            let sdist = std::fs::read_dir(into)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
                .expect("an sdist");
            let unpacked = into.join("src");
            std::fs::create_dir(&unpacked).unwrap();
            let status = Command::new("tar")
                .arg("xzf")
                .arg(&sdist)
                .arg("-C")
                .arg(&unpacked)
                .status()
                .unwrap();
            assert!(status.success());
            only_dir(&unpacked)
        }
        Registry::Crates => {
            let ws = into.join("fetch");
            std::fs::create_dir_all(ws.join("src")).unwrap();
            std::fs::write(ws.join("src/lib.rs"), "").unwrap();
            std::fs::write(
                ws.join("Cargo.toml"),
                format!(
                    "[package]\nname = \"corpus-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
                     [dependencies]\n{} = \"={}\"\n",
                    case.name, case.version
                ),
            )
            .unwrap();
            let home = into.join("cargo-home");
            let out = Command::new("cargo")
                .args(["fetch", "--quiet"])
                .current_dir(&ws)
                .env("CARGO_HOME", &home)
                .output()
                .expect("cargo");
            assert!(
                out.status.success(),
                "cargo fetch {}: {}",
                case.name,
                crate::support::text(&out.stderr)
            );
            let wanted = format!("{}-{}", case.name, case.version);
            let registry = only_dir(&home.join("registry/src"));
            let root = registry.join(&wanted);
            assert!(root.is_dir(), "{wanted} under {}", registry.display());
            root
        }
    }
}

/// The one directory inside `dir`.
fn only_dir(dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.into_iter().next().unwrap()
}

async fn run(project: &Project, turns: Value) -> (Run, f64) {
    let t = Instant::now();
    let run = finish_within(spawn_run(project, turns, &[], &[]), RUN_LIMIT).await;
    (run, t.elapsed().as_secs_f64())
}

/// Seconds from the first setup note to the last setup command's end (0 when none ran).
fn setup_secs(run: &Run) -> f64 {
    let ts = |e: &Value| e["ts"].as_f64().unwrap_or_default();
    let start = run
        .events
        .iter()
        .find(|e| e["event"] == "note" && e["message"].as_str().is_some_and(|m| m.starts_with("setup:")))
        .map(ts);
    let end = run.events.iter().rfind(|e| e["event"] == "setup_output").map(ts);
    match (start, end) {
        (Some(s), Some(e)) => e - s,
        _ => 0.0,
    }
}

fn notes(run: &Run) -> Vec<String> {
    run.events
        .iter()
        .filter(|e| e["event"] == "note")
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

/// `before: … → after: …` of each test command, as the text report prints it.
fn before_after(report: &Value) -> String {
    report["tests"]["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let counts = |v: &Value| {
                if v.is_null() {
                    "?".to_string()
                } else {
                    format!(
                        "{} failed, {} passed",
                        v["failed"].as_u64().unwrap_or(0),
                        v["passed"].as_u64().unwrap_or(0)
                    )
                }
            };
            format!(
                "`{}`: before: {} → after: {}",
                c["command"].as_str().unwrap_or_default(),
                counts(&c["before"]["counts"]),
                counts(&c["counts"])
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

async fn check(case: Case) {
    let download = tempfile::tempdir().unwrap();
    let root = fetch(&case, download.path());
    let project = Project::copy_of(&root, &[]);
    let (file, old, new) = case.bug;
    let source = project.read(file);
    assert_eq!(
        source.matches(old).count(),
        1,
        "the bug's line occurs once in {file} of {} {}",
        case.name,
        case.version
    );

    // 1. No flags, nothing changed: PASS, with what setup installed.
    let (cold, cold_secs) = run(&project, json!([done("Nothing to change.")])).await;
    let report = cold.report.clone().unwrap_or_default();
    assert_eq!(
        (cold.code, &report["tests"]["passed"]),
        (Some(0), &json!(true)),
        "{} {} with no flags: {}\n{}",
        case.name,
        case.version,
        cold.stdout,
        cold.stderr
    );
    let image = cold
        .events
        .iter()
        .find(|e| e["event"] == "image_chosen")
        .and_then(|e| e["image"].as_str().map(String::from))
        .unwrap_or_default();
    let cold_setup = setup_secs(&cold);
    let tests = report["tests"]["commands"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["counts"]["passed"].as_u64())
                .sum::<u64>()
        })
        .unwrap_or_default();
    let pass_line = before_after(&report);

    // 2. Again, unchanged: from the cache, no setup container, nothing asked of any registry.
    let (warm, warm_secs) = run(&project, json!([done("Nothing to change.")])).await;
    let report = warm.report.clone().unwrap_or_default();
    assert_eq!(
        (warm.code, &report["tests"]["passed"]),
        (Some(0), &json!(true)),
        "{} {} from the cache: {}\n{}",
        case.name,
        case.version,
        warm.stdout,
        warm.stderr
    );
    assert!(
        report.get("egress").is_none(),
        "the second run asked a registry: {}",
        report["egress"]
    );
    let warm_notes = notes(&warm);
    assert!(
        warm_notes
            .iter()
            .any(|n| n.contains("dependencies from the cache"))
            && !warm_notes.iter().any(|n| n.starts_with("setup: running")),
        "no setup container the second time: {warm_notes:?}"
    );

    // 3. A one-line bug in the checkout (a model that changes nothing): FAIL. The bug is put in
    // on the host, not by the scripted model: a loop attempt that ends worse than it began is
    // left at its best state, which would take the bug out again.
    std::fs::write(project.file(file), source.replacen(old, new, 1)).unwrap();
    let (buggy, _) = run(&project, json!([done("Nothing to change.")])).await;
    let report = buggy.report.clone().unwrap_or_default();
    assert_eq!(
        (buggy.code, &report["tests"]["passed"]),
        (Some(1), &json!(false)),
        "{} {} with a bug in {file}: {}\n{}",
        case.name,
        case.version,
        buggy.stdout,
        buggy.stderr
    );
    let fail_line = before_after(&report);

    remove_caches(&project).await;
    eprintln!(
        "corpus | {} {} | {image} | setup {cold_setup:.1} s (run {cold_secs:.1} s) | warm run {warm_secs:.1} s | {tests} tests | PASS | bug: FAIL\n\
         corpus |   clean: {pass_line}\n\
         corpus |   bug:   {fail_line}",
        case.name, case.version
    );
}

/// The project's caches go with the test (each key is this temporary project's).
async fn remove_caches(project: &Project) {
    let docker = crate::support::docker().await;
    let path = project.path().display().to_string();
    for (name, of) in agentbox::sandbox::caches::list(&docker).await.unwrap() {
        if of == path {
            let _ = docker
                .remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                .await;
        }
    }
}

macro_rules! corpus {
    ($($test:ident: $registry:ident $name:literal $version:literal, $file:literal, $old:literal => $new:literal;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            check(Case {
                registry: Registry::$registry,
                name: $name,
                version: $version,
                bug: ($file, $old, $new),
            })
            .await;
        }
    )*};
}

corpus! {
    // A single module beside setup.py, tests in one file at the root.
    six: Pypi "six" "1.17.0", "six.py",
        "return iter(d.keys(**kw))" => "return iter(d.values(**kw))";
    // flit, tests/ beside the package.
    idna: Pypi "idna" "3.10", "idna/core.py",
        "if len(label) > 63:" => "if len(label) > 62:";
    more_itertools: Pypi "more-itertools" "10.7.0", "more_itertools/more.py",
        "return ilen(islice(filter(predicate, iterable), n + 1)) == n" =>
        "return ilen(islice(filter(predicate, iterable), n)) == n";
    // A src layout (setuptools).
    cachetools: Pypi "cachetools" "5.5.2", "src/cachetools/__init__.py",
        "self.__maxsize = maxsize" => "self.__maxsize = maxsize + 1";
    // A src layout with a C extension, test requirements in requirements/tests.txt.
    markupsafe: Pypi "markupsafe" "3.0.2", "src/markupsafe/_native.py",
        "s.replace(\"&\", \"&amp;\")" => "s.replace(\"&\", \"&\")";
    // A C extension built by setup.py, its tests inside the package.
    simplejson: Pypi "simplejson" "3.20.1", "simplejson/__init__.py",
        "def dumps(obj, skipkeys=False, ensure_ascii=True," =>
        "def dumps(obj, skipkeys=False, ensure_ascii=False,";
    // hatchling with hatch-vcs (no git: the version from PKG-INFO), a test extra (freezegun).
    humanize: Pypi "humanize" "4.12.3", "src/humanize/number.py",
        "_(\"nine\")," => "_(\"nien\"),";
    // setuptools-scm, a src layout, the `testing` extra (pytest-benchmark).
    pluggy: Pypi "pluggy" "1.6.0", "src/pluggy/_hooks.py",
        "return self._hookexec(self.name, self._hookimpls.copy(), kwargs, firstresult)" =>
        "return self._hookexec(self.name, self._hookimpls.copy(), kwargs, False)";
    // A `test` dependency group ([dependency-groups]), a src layout.
    semver: Pypi "semver" "3.0.4", "src/semver/version.py",
        "return cls(self._major + 1)" => "return cls(self._major + 2)";
    // A runtime dependency (python-dateutil) from the index.
    freezegun: Pypi "freezegun" "1.5.2", "freezegun/api.py",
        "return self.time_to_freeze + (real_datetime.now() - self.start)" =>
        "return self.time_to_freeze";
    // hatchling, the tests inside the package.
    colorama: Pypi "colorama" "0.4.6", "colorama/ansi.py",
        "return CSI + str(code) + 'm'" => "return CSI + str(code) + 'n'";
    // A crate without dev-dependencies, its tests in tests/.
    itoa: Crates "itoa" "1.0.15", "src/lib.rs",
        "0001020304050607080910111213141516171819" => "0001020304050670080910111213141516171819";
    semver_crate: Crates "semver" "1.0.26", "src/eval.rs",
        "Op::Greater => matches_greater(cmp, ver)," => "Op::Greater => matches_less(cmp, ver),";
    // A crate with a dev-dependency from the registry (serde_json) and a lockfile.
    either: Crates "either" "1.15.0", "src/lib.rs",
        "Left(_) => true," => "Left(_) => false,";
}
