//! Hostile sandboxes against `run --isolate` and `--apply`: what the sandbox leaves behind is read
//! back, turned into a patch and written into the project on the host, so every scenario plants
//! something in the sandbox (through the scripted model's `bash`) and checks the host-side
//! effect: a link not written, the process exiting, the patch applied by real `git apply`, who
//! owns what `--apply` wrote, how many bytes were read back. No container or volume is left.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "a test's own report, not agentbox's output"
)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::scripted::{Spawned, spawn_run};
use crate::support::*;
use serde_json::{Value, json};

struct Run {
    code: Option<i32>,
    report: Value,
    stderr: String,
    events: Vec<Value>,
    /// The run's own working directory: the patch lands here.
    dir: tempfile::TempDir,
}

impl Run {
    fn patch(&self) -> PathBuf {
        let name = self.report["patch_file"]
            .as_str()
            .unwrap_or_else(|| panic!("no patch file: {}\n{}", self.report, self.stderr));
        self.dir.path().join(name)
    }

    fn changed(&self) -> Vec<String> {
        self.report["changed_files"]
            .as_array()
            .unwrap_or_else(|| panic!("no report: {}", self.stderr))
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect()
    }

    fn warnings(&self) -> String {
        self.report["warnings"]
            .as_array()
            .map(|w| {
                w.iter()
                    .map(|s| s.as_str().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }

    fn apply_error(&self) -> String {
        self.report["apply_error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Bytes agentbox read back from the sandbox, from its note in the trajectory.
    fn bytes_read_back(&self) -> u64 {
        let note = self
            .events
            .iter()
            .filter(|e| e["event"] == "note")
            .filter_map(|e| e["message"].as_str())
            .find(|m| m.starts_with("read back "))
            .unwrap_or_else(|| panic!("no read-back note in the trajectory: {}", self.stderr));
        note["read back ".len()..]
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unreadable note {note:?}"))
    }
}

fn bash(command: &str) -> Value {
    json!({"name": "bash", "arguments": {"command": command}})
}

/// Start `agentbox run --json --isolate` with `turns` as the model, from a directory of its own.
fn spawn_isolated(project: &Project, turns: Value, args: &[&str]) -> Spawned {
    let args: Vec<&str> = std::iter::once("--isolate").chain(args.iter().copied()).collect();
    spawn_run(project, turns, &args, &[])
}

/// Wait for the run (it must end: a hang is a failure), then check that it left no container
/// and no volume.
async fn finish(spawned: Spawned) -> Run {
    let Spawned {
        child,
        pid,
        trajectory,
        dir,
    } = spawned;
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("agentbox (pid {pid}) did not finish: it hung"))
        .unwrap();
    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0 && volumes_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(
        gone,
        "a container or volume of agentbox pid {pid} outlived the run"
    );
    let events = std::fs::read_to_string(trajectory)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Run {
        code: out.status.code(),
        report: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: text(&out.stderr),
        events,
        dir,
    }
}

async fn isolated(project: &Project, turns: Value, args: &[&str]) -> Run {
    finish(spawn_isolated(project, turns, args)).await
}

/// Every path under `dir` but `.git`, by its raw bytes: (mode & 0o777 or 0 for links, content
/// or link target).
fn tree(dir: &Path) -> BTreeMap<Vec<u8>, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().as_os_str().as_bytes().to_vec();
            if rel == b".git" {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
                out.insert(rel, (m.mode() & 0o777, Vec::new()));
            } else if m.file_type().is_symlink() {
                let target = std::fs::read_link(&p).unwrap().into_os_string().into_vec();
                out.insert(rel, (0, target));
            } else {
                out.insert(rel, (m.mode() & 0o777, std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// git on the host in the test user's project, with a committer identity.
fn git_command(dir: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("git");
    cmd.args([
        "-c",
        "safe.directory=*",
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
    ])
    .args(args)
    .current_dir(dir);
    cmd
}

fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = git_command(dir, args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    out
}

fn git_apply(dir: &Path, patch: &Path) {
    let out = std::process::Command::new("git")
        .args(["-c", "safe.directory=*", "apply", "--whitespace=nowarn"])
        .arg(patch)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git apply rejected the patch: {}\n{}",
        text(&out.stderr),
        String::from_utf8_lossy(&std::fs::read(patch).unwrap_or_default())
    );
}

fn is_fifo(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

// ---- item 3: links that resolve outside through other links ---------------------------------

/// A project inside a directory of its own, next to a SECRET a link could reach.
fn project_beside_a_secret(files: &[(&str, &str)]) -> (tempfile::TempDir, Project) {
    let outer = tempfile::tempdir().unwrap();
    std::fs::write(outer.path().join("SECRET"), "host secret\n").unwrap();
    let dir = tempfile::Builder::new()
        .prefix("agentbox-test-")
        .tempdir_in(outer.path())
        .unwrap();
    for (path, content) in files {
        let full = dir.path().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, content).unwrap();
    }
    let project = Project { dir };
    project.chown_all();
    (outer, project)
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// The sandbox's command, links on the host first (path, target), paths that must not be
/// written.
type LinkCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_never_writes_a_link_that_leaves_the_project_through_other_links() {
    let cases: [LinkCase; 3] = [
        // Each link alone points inside; followed through each other they reach the parent.
        (
            "mkdir sub && ln -s .. sub/b && ln -s b/.. sub/c && ln -s c/SECRET sub/z",
            &[],
            &["sub", "sub/b", "sub/c", "sub/z"],
        ),
        // Through a link that is already in the project (`lib/up -> ..`, inside).
        ("ln -s up/../SECRET lib/z", &[("lib/up", "..")], &["lib/z"]),
        // A new link that is inside by itself makes a link already in the project escape:
        // `h -> d/../SECRET` is inside while `d` does not exist, outside once `d -> sub/..`.
        ("mkdir -p sub && ln -s sub/.. d", &[("h", "d/../SECRET")], &["d"]),
    ];
    for (command, host_links, not_written) in cases {
        let (_outer, project) = project_beside_a_secret(&[("app.py", "x = 1\n"), ("lib/keep.txt", "k\n")]);
        for (link, target) in host_links {
            std::os::unix::fs::symlink(target, project.file(link)).unwrap();
        }
        project.chown_all();
        let run = isolated(
            &project,
            json!([
                {"tool_calls": [bash(&format!("{command} && echo x = 2 > app.py"))]},
                {"text": "done"}
            ]),
            &["--apply"],
        )
        .await;
        assert_eq!(run.code, Some(4), "{command}: {}\n{}", run.report, run.stderr);
        assert!(
            run.apply_error().contains("outside the project"),
            "{command}: {}",
            run.apply_error()
        );
        for path in not_written {
            assert!(
                !exists(&project.file(path)),
                "{command}: {path} was written on the host"
            );
        }
        assert_eq!(project.read("app.py"), "x = 1\n", "{command}: all or nothing");
    }
}

// ---- item 4: never open a FIFO --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_treats_a_fifo_on_the_host_as_a_conflict_and_exits() {
    let project = Project::new(&[("app.py", "x = 1\n"), ("notes.txt", "notes\n")]);
    // A FIFO where the sandbox will create a file (not copied in: it is not a regular file).
    mkfifo(&project.file("queue"));
    project.chown_all();
    let spawned = spawn_isolated(
        &project,
        json!([
            {"tool_calls": [bash("echo data > queue && echo more >> notes.txt && echo x = 2 > app.py && sleep 6")]},
            {"text": "done"}
        ]),
        &["--apply"],
    );
    // While the sandbox works, the user's notes.txt becomes a FIFO too: the patch reads the
    // original of a modified file, `--apply` checks it.
    let trajectory = spawned.trajectory.clone();
    let started = eventually(Duration::from_secs(120), || {
        let trajectory = trajectory.clone();
        async move { std::fs::read_to_string(&trajectory).is_ok_and(|t| t.contains("\"tool_started\"")) }
    })
    .await;
    assert!(started, "the bash call never started");
    std::fs::remove_file(project.file("notes.txt")).unwrap();
    mkfifo(&project.file("notes.txt"));
    let run = finish(spawned).await;
    assert_eq!(run.code, Some(4), "{}\n{}", run.report, run.stderr);
    let err = run.apply_error();
    assert!(
        err.contains("FIFO") && (err.contains("queue") || err.contains("notes.txt")),
        "{err}"
    );
    assert!(is_fifo(&project.file("queue")), "the FIFO is left alone");
    assert!(is_fifo(&project.file("notes.txt")));
    assert_eq!(project.read("app.py"), "x = 1\n", "all or nothing");
}

// ---- item 5: what is read back is bounded, and what is not brought back is named ------------

fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_big_file_and_huge_caches_cost_little_and_are_reported() {
    let make = || {
        let p = Project::new(&[("app.py", "x = 1\n")]);
        sparse(&p.file("big.bin"), 200 << 20);
        p.chown_all();
        p
    };
    let project = make();
    let run = isolated(
        &project,
        json!([
            {"tool_calls": [bash(
                "rm big.bin && echo x = 2 > app.py && mkdir -p .pytest_cache pkg/__pycache__ \
                 && truncate -s 1000M .pytest_cache/huge pkg/__pycache__/m.cpython-311.pyc"
            )]},
            {"text": "done"}
        ]),
        &["--max-file-size", "2g"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.report, run.stderr);
    let patch = run.patch();
    let size = std::fs::metadata(&patch).unwrap().len();
    assert!(
        size < 16 << 10,
        "a deletion carries no content: the patch is {size} bytes"
    );
    let read = run.bytes_read_back();
    assert!(read < 16 << 20, "{read} bytes read back for 2000 MB of caches");
    // Not "changes: none": the patch's files, and apart, the caches that were left behind,
    // with a warning saying how large and why.
    assert_eq!(run.changed(), ["app.py", "big.bin"]);
    let outside = &run.report["changed_outside_diff"]["paths"];
    assert_eq!(
        outside,
        &json!([".pytest_cache/", "pkg/__pycache__/"]),
        "{}",
        run.report
    );
    let warnings = run.warnings();
    assert!(
        warnings.contains(".pytest_cache/ (2 entries, 1000.0 MiB)")
            && warnings.contains("pkg/__pycache__/")
            && warnings.contains("never brought back"),
        "{warnings}"
    );
    // The host is untouched; real `git apply` accepts the patch on a copy and deletes big.bin.
    assert_eq!(
        std::fs::metadata(project.file("big.bin")).unwrap().len(),
        200 << 20
    );
    let pristine = make();
    git_apply(pristine.path(), &patch);
    assert!(!exists(&pristine.file("big.bin")));
    assert_eq!(pristine.read("app.py"), "x = 2\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_too_large_to_bring_back_is_named_and_apply_refuses() {
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let run = isolated(
        &project,
        json!([
            {"tool_calls": [bash("echo x = 2 > app.py && truncate -s 100M blob.bin")]},
            {"text": "done"}
        ]),
        &["--apply"],
    )
    .await;
    assert_eq!(run.code, Some(4), "{}\n{}", run.report, run.stderr);
    let changed = run.changed();
    assert!(
        changed.contains(&"app.py".to_string()) && changed.contains(&"blob.bin".to_string()),
        "{changed:?}"
    );
    assert!(run.warnings().contains("blob.bin"), "{}", run.warnings());
    assert!(run.apply_error().contains("blob.bin"), "{}", run.apply_error());
    assert!(run.bytes_read_back() < 16 << 20);
    assert_eq!(project.read("app.py"), "x = 1\n", "all or nothing");
    assert!(!exists(&project.file("blob.bin")));
    let patch = std::fs::read_to_string(run.patch()).unwrap();
    assert!(patch.contains("+x = 2"), "{patch}");
    assert!(!patch.contains("blob.bin"), "{patch}");
}

// ---- item 9: --apply as root writes as the project's owner ----------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_as_root_writes_as_the_owner_and_allows_links_that_stay_inside() {
    const OTHER: u32 = 4343;
    let project = Project::new(&[
        ("app.py", "x = 1\n"),
        ("src/a.py", "a = 1\n"),
        ("shared.txt", "s\n"),
        ("run.sh", "#!/bin/sh\n"),
    ]);
    if is_root() {
        std::os::unix::fs::lchown(project.file("shared.txt"), Some(OTHER), Some(OTHER)).unwrap();
    }
    let run = isolated(
        &project,
        json!([
            {"tool_calls": [bash(
                "mkdir -p new/deep && echo f > new/deep/f.txt && echo x = 2 > app.py \
                 && echo more >> shared.txt && chmod +x run.sh && ln -s src lib \
                 && ln -s lib/a.py alias && mkdir sub && ln -s ../src/a.py sub/l"
            )]},
            {"text": "done"}
        ]),
        &["--apply"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.report, run.stderr);
    assert_eq!(project.read("new/deep/f.txt"), "f\n");
    assert_eq!(
        project.read("alias"),
        "a = 1\n",
        "links through links that stay inside are fine"
    );
    assert_eq!(project.read("sub/l"), "a = 1\n");
    if !is_root() {
        eprintln!("not root: ownership is not exercised");
        return;
    }
    let (uid, gid) = project.owner();
    for (rel, _) in tree(project.path()) {
        let path = project.file(std::str::from_utf8(&rel).unwrap());
        let m = std::fs::symlink_metadata(&path).unwrap();
        let want = if rel == b"shared.txt" { OTHER } else { uid };
        assert_eq!(
            (m.uid(), m.gid()),
            (want, if rel == b"shared.txt" { OTHER } else { gid }),
            "{}",
            path.display()
        );
    }
}

// ---- item 10: names git must quote ----------------------------------------------------------

/// The names a hostile sandbox might pick: control characters, quotes, backslashes, bytes that
/// are not UTF-8, and a directory whose name tries to start a second file's section.
const WEIRD: &str = r#"printf 1 > $'new\nline.txt' && printf 2 > $'tab\there.txt' \
 && printf 3 > 'quote"d.txt' && printf 4 > 'back\slash.txt' && printf 5 > $'bad\xffbyte.txt' \
 && printf 6 > 'sp ace.txt' && printf 7 > $'caf\xc3\xa9.txt' \
 && mkdir -p $'inj\ndiff --git a' && printf pwned > $'inj\ndiff --git a/INJECTED b' \
 && printf changed >> $'old\tname.txt' && rm 'del"me.txt'"#;

/// A name as git's `unquote_c_style` reads it back.
fn unquote(shown: &str) -> Vec<u8> {
    let b = shown.as_bytes();
    if b.len() < 2 || b[0] != b'"' || b[b.len() - 1] != b'"' {
        return b.to_vec();
    }
    let (mut out, mut i) = (Vec::new(), 1);
    while i < b.len() - 1 {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        out.push(match c {
            b'a' => 7,
            b'b' => 8,
            b't' => b'\t',
            b'n' => b'\n',
            b'v' => 11,
            b'f' => 12,
            b'r' => b'\r',
            b'0'..=b'3' => {
                let v = (c - b'0') * 64 + (b[i] - b'0') * 8 + (b[i + 1] - b'0');
                i += 2;
                v
            }
            other => other,
        });
    }
    out
}

fn weird_project() -> Project {
    let p = Project::new(&[
        ("app.py", "x = 1\n"),
        ("old\tname.txt", "old\n"),
        ("del\"me.txt", "bye\n"),
    ]);
    git(p.path(), &["init", "-q"]);
    git(p.path(), &["add", "-A"]);
    git(p.path(), &["commit", "-qm", "start"]);
    p.chown_all();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_quoted_as_git_does_in_the_patch_and_the_changes() {
    let project = weird_project();
    let run = isolated(
        &project,
        json!([{"tool_calls": [bash(WEIRD)]}, {"text": "done"}]),
        &["--apply"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.report, run.stderr);
    let bad = OsString::from_vec(b"bad\xffbyte.txt".to_vec());
    assert_eq!(
        std::fs::read(project.path().join(&bad)).unwrap(),
        b"5",
        "a non-UTF-8 name is kept byte for byte"
    );
    assert_eq!(
        std::fs::read(project.file("inj\ndiff --git a/INJECTED b")).unwrap(),
        b"pwned"
    );

    // The change list names exactly the files git sees changed, each on one line, quoted so
    // that git's unquoting gives the name back byte for byte.
    git(project.path(), &["add", "-A"]);
    let names = git(
        project.path(),
        &["diff", "--cached", "--name-only", "-z", "--no-renames", "HEAD"],
    );
    let mut expected: Vec<Vec<u8>> = names
        .stdout
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let changed = run.changed();
    assert!(
        changed.iter().all(|c| !c.chars().any(char::is_control)),
        "{changed:?}"
    );
    let mut unquoted: Vec<Vec<u8>> = changed.iter().map(|c| unquote(c)).collect();
    expected.sort();
    unquoted.sort();
    assert_eq!(unquoted, expected, "{changed:?}");
    for shown in [r#""new\nline.txt""#, r#""bad\377byte.txt""#, "café.txt"] {
        assert!(changed.contains(&shown.to_string()), "{shown} in {changed:?}");
    }

    // Real `git apply` takes the patch, and gives exactly what --apply wrote.
    let pristine = weird_project();
    git_apply(pristine.path(), &run.patch());
    assert_eq!(tree(pristine.path()), tree(project.path()));
    for dir in [project.path(), pristine.path()] {
        assert!(!exists(&dir.join("INJECTED")) && !exists(&dir.join("inj")));
    }
}

/// Found in review: `--apply` used to write what git on the host runs or reads — a hook in the
/// configured hooks directory, a config the repository includes, a directory made into a bare
/// repository. Each is refused now, nothing is applied, and git on the host runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_what_git_on_the_host_would_run() {
    let marker_dir = tempfile::tempdir().unwrap();
    let mark = marker_dir.path().join("PWNED");
    let hook = r#"printf '#!/bin/sh\ntouch "$MARK"\n'"#;
    let cases = [
        (
            "mkdir -p .husky/_ && git config core.hooksPath .husky/_",
            format!("{hook} > .husky/_/pre-commit && chmod +x .husky/_/pre-commit && echo y >> app.py"),
            vec!["commit", "-qam", "x"],
        ),
        (
            "touch .gitconfig && git config include.path ../.gitconfig",
            r#"printf '[core]\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' >> .gitconfig && echo y >> app.py"#.to_string(),
            vec!["status"],
        ),
        (
            "mkdir -p src && echo a > src/a.py",
            r#"cd src && printf 'ref: refs/heads/main\n' > HEAD && mkdir -p objects refs/heads && touch objects/.keep refs/heads/main && printf '[core]\n\tworktree = ..\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' > config"#.to_string(),
            vec!["status"],
        ),
    ];
    for (setup, plant, host_git_args) in cases {
        let project = Project::new(&[("app.py", "x = 1\n")]);
        let out = std::process::Command::new("sh")
            .args(["-ec", &format!("git init -q && {setup} && git add -A && git -c user.name=t -c user.email=t@t commit -qm init")])
            .current_dir(project.path())
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "safe.directory")
            .env("GIT_CONFIG_VALUE_0", "*")
            .output()
            .unwrap();
        assert!(out.status.success(), "{setup}: {}", text(&out.stderr));
        project.chown_all();
        let before = tree(project.path());
        let run = isolated(
            &project,
            json!([{"tool_calls": [bash(&plant)]}, {"text": "done"}]),
            &["--apply"],
        )
        .await;
        assert_eq!(run.code, Some(4), "{setup}: {}\n{}", run.report, run.stderr);
        assert!(
            run.report["apply_error"].to_string().contains("git"),
            "{setup}: {}",
            run.report["apply_error"]
        );
        assert_eq!(tree(project.path()), before, "{setup}: nothing was applied");
        let sub = if setup.contains("src/a.py") {
            project.file("src")
        } else {
            project.path().to_path_buf()
        };
        let _ = git_command(&sub, &host_git_args)
            .env("MARK", &mark)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(
            !mark.exists(),
            "{setup}: git on the host ran what the sandbox wrote"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_leading_out_of_the_project_is_left_out_of_the_copy_and_said() {
    // The engine's archive API refuses a link that climbs above the extraction directory
    // ("invalid symlink"): one such link in the project must not block the isolated run.
    let project = Project::new(&[("app.py", "x = 1\n"), ("sub/keep.txt", "k\n")]);
    std::os::unix::fs::symlink("../../", project.file("sub/up")).unwrap();
    std::os::unix::fs::symlink("../app.py", project.file("sub/inside")).unwrap();
    project.chown_all();
    let run = isolated(
        &project,
        json!([
            {"tool_calls": [bash("test ! -e sub/up && readlink sub/inside && echo x = 2 > app.py")]},
            {"text": "done"}
        ]),
        &["--apply"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.report, run.stderr);
    assert!(
        run.warnings().contains(
            "sub/up is a symbolic link leading out of the project (to ../../); it is left out of the copy"
        ),
        "{}",
        run.warnings()
    );
    assert_eq!(project.read("app.py"), "x = 2\n");
    assert_eq!(
        run.changed(),
        vec!["app.py".to_string()],
        "the link is not taken for deleted"
    );
    assert_eq!(
        std::fs::read_link(project.file("sub/up")).unwrap(),
        PathBuf::from("../../"),
        "the project keeps its link"
    );
}

// ---- environments: `env merge` takes a checkpoint through the same checks ------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_merge_refuses_links_out_and_files_not_brought_back_and_never_makes_a_fifo() {
    // Under gVisor a FIFO made in the sandbox lives in gVisor's own kernel only: the volume on
    // the host, which the engine's archive is read from, holds no file at that path at all
    // (measured with runsc 20221219: `rm notes.txt && mkfifo notes.txt` inside, an empty
    // directory on the host). So there the host sees the whole change as a deletion, and
    // merging it is merging all of it; what must hold everywhere is that no FIFO is made.
    let fifo_in_a_files_place = if under_gvisor() { None } else { Some("notes.txt") };
    // (command, why the merge is refused or None when it merges, paths never made on the host)
    let cases: [(&str, Option<&str>, &[&str]); 5] = [
        // A directory that became a file: refused, never half merged.
        ("rm -r lib && echo x > lib", Some("lib"), &[]),
        // Inside each by itself, outside followed through each other.
        (
            "mkdir sub && ln -s .. sub/b && ln -s b/.. sub/c && ln -s c/SECRET sub/z",
            Some("outside the project"),
            &["sub", "sub/z"],
        ),
        // Never brought back, so never merged: a file over the read-back limit, a FIFO where a
        // project file was (the project would get part of the change).
        ("truncate -s 100M blob.bin", Some("blob.bin"), &["blob.bin"]),
        ("rm notes.txt && mkfifo notes.txt", fifo_in_a_files_place, &[]),
        // A new FIFO is no part of the project (as with --apply): the rest is merged.
        ("mkfifo pipe", None, &["pipe"]),
    ];
    for (command, refused, not_written) in cases {
        let (_outer, project) = project_beside_a_secret(&[
            ("app.py", "x = 1\n"),
            ("notes.txt", "n\n"),
            ("lib/keep.txt", "k\n"),
        ]);
        project.chown_all();
        let env = format!("it-hostile-{}", uuid::Uuid::new_v4().simple());
        let run = finish(spawn_run(
            &project,
            json!([
                {"tool_calls": [bash(&format!("{command} && echo x = 2 > app.py"))]},
                {"text": "done"}
            ]),
            &["--env", &env],
            &[],
        ))
        .await;
        let data = run.dir.path().join("data");
        let env_cmd = |args: &[&str]| {
            let mut cmd = agentbox();
            cmd.env("AGENTBOX_DATA_DIR", &data).arg("env").args(args);
            crate::support::run(&mut cmd)
        };
        let merged = env_cmd(&["merge", &env]);
        let stderr = text(&merged.stderr);
        match refused {
            Some(said) => {
                assert_ne!(merged.status.code(), Some(0), "{command}: merged\n{}", run.stderr);
                assert!(
                    stderr.contains("nothing merged") && stderr.contains(said),
                    "{command}: {stderr}"
                );
                assert_eq!(project.read("app.py"), "x = 1\n", "{command}: all or nothing");
                assert_eq!(project.read("notes.txt"), "n\n", "{command}");
                assert_eq!(project.read("lib/keep.txt"), "k\n", "{command}");
            }
            None => {
                assert_eq!(merged.status.code(), Some(0), "{command}: {stderr}");
                assert_eq!(project.read("app.py"), "x = 2\n", "{command}");
                if command.starts_with("rm notes.txt") {
                    assert!(
                        !exists(&project.file("notes.txt")),
                        "{command}: the deletion merged"
                    );
                }
            }
        }
        let notes = std::fs::symlink_metadata(project.file("notes.txt"));
        assert!(
            !notes.is_ok_and(|m| m.file_type().is_fifo()),
            "{command}: a FIFO was made on the host"
        );
        for path in not_written {
            assert!(
                !exists(&project.file(path)),
                "{command}: {path} was written on the host"
            );
        }
        let rm = env_cmd(&["rm", &env]);
        assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
    }
}
