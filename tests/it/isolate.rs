//! `run --isolate`: copy in, patch out. The host project is not written until `--apply`, the
//! patch reproduces the sandbox's final state (binary files, new files, deletions and mode
//! changes included), and `--apply` refuses when the host changed meanwhile.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use serde_json::{Value, json};

/// Every path under `dir` with (mode, size, mtime, content).
fn snapshot(dir: &Path) -> BTreeMap<String, (u32, u64, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if m.is_dir() {
                stack.push(p.clone());
                out.insert(rel, (m.mode(), 0, m.mtime(), Vec::new()));
            } else if m.file_type().is_symlink() {
                out.insert(
                    rel,
                    (
                        m.mode(),
                        0,
                        0,
                        std::fs::read_link(&p)
                            .unwrap()
                            .into_os_string()
                            .into_encoded_bytes(),
                    ),
                );
            } else {
                out.insert(rel, (m.mode(), m.len(), m.mtime(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// (path, mode & 0o777, content): what must match between two trees, whatever the mtimes.
fn contents(dir: &Path) -> Vec<(String, u32, Vec<u8>)> {
    snapshot(dir)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(".git"))
        .map(|(p, (mode, _, _, data))| (p, mode & 0o777, data))
        .collect()
}

fn fixture() -> Project {
    let p = Project::new(&[
        ("app.py", "def answer():\n    return 41\n"),
        (
            "test_app.py",
            "from app import answer\n\ndef test_answer():\n    assert answer() == 42\n",
        ),
        ("old.txt", "to be deleted\n"),
        ("run.sh", "#!/bin/sh\necho run\n"),
        ("docs/guide.md", "# Guide\n"),
    ]);
    std::fs::write(p.file("logo.bin"), [0u8, 159, 146, 150, 255, 0, 1, 2]).unwrap();
    std::os::unix::fs::symlink("docs/guide.md", p.file("GUIDE")).unwrap();
    p.git_init();
    p
}

fn changes_script(dir: &Path) -> String {
    let turns = json!({"turns": [
        {"tool_calls": [
            {"name": "edit_file", "arguments": {"path": "app.py", "old": "return 41", "new": "return 42"}},
            {"name": "bash", "arguments": {"command": "rm old.txt && chmod +x run.sh && printf '\\x00\\x01\\xfe\\xff' > new.bin && printf 'x' >> logo.bin && mkdir -p pkg/sub && echo 'VALUE = 1' > pkg/sub/new.py && ln -s app.py ALIAS"}}
        ]},
        {"text": "done"}
    ]});
    let path = dir.join("script.json");
    std::fs::write(&path, turns.to_string()).unwrap();
    path.display().to_string()
}

async fn run_isolated(
    project: &Project,
    script: &str,
    extra: &[&str],
    cwd: &Path,
) -> (Option<i32>, Value, String, u32) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    cmd.args(["run", "--json", "--isolate", "--script", script])
        .args(extra)
        .arg(project.path())
        .current_dir(cwd)
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", crate::support::test_data_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), report, text(&out.stderr), pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_is_untouched_and_the_patch_reproduces_the_sandbox() {
    let project = fixture();
    let before = snapshot(project.path());
    let work = tempfile::tempdir().unwrap();
    let script = changes_script(work.path());
    let (code, report, stderr, pid) = run_isolated(&project, &script, &[], work.path()).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        snapshot(project.path()),
        before,
        "the host project must be byte-identical, mtimes included"
    );
    assert_eq!(
        volumes_of_pid(&docker().await, pid).await,
        0,
        "the volume is removed"
    );
    let patch = work.path().join(report["patch_file"].as_str().unwrap());
    assert!(patch.exists());

    // The same run with --apply changes the host; `git apply` of the patch on a pristine
    // copy must give exactly the same tree.
    let applied = fixture();
    let (code, report, stderr, _) = run_isolated(&applied, &script, &["--apply"], work.path()).await;
    assert_eq!(code, Some(0), "{stderr}");
    let mut written: Vec<String> = report["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    written.sort();
    assert_eq!(
        written,
        [
            "ALIAS",
            "app.py",
            "logo.bin",
            "new.bin",
            "old.txt",
            "pkg/sub/new.py",
            "run.sh"
        ]
    );
    assert_eq!(applied.read("app.py"), "def answer():\n    return 42\n");
    assert!(!applied.file("old.txt").exists());
    assert_eq!(
        std::fs::read(applied.file("new.bin")).unwrap(),
        [0, 1, 0xfe, 0xff]
    );
    assert_eq!(
        std::fs::read(applied.file("logo.bin")).unwrap(),
        [0u8, 159, 146, 150, 255, 0, 1, 2, b'x']
    );
    assert_eq!(
        std::fs::metadata(applied.file("run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(applied.file("ALIAS")).unwrap(),
        Path::new("app.py")
    );

    let pristine = fixture();
    let status = std::process::Command::new("git")
        .args(["apply", "--whitespace=nowarn"])
        .arg(&patch)
        .current_dir(pristine.path())
        .status()
        .unwrap();
    assert!(status.success(), "the patch applies cleanly");
    assert_eq!(
        contents(pristine.path()),
        contents(applied.path()),
        "patch and --apply agree"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_when_the_host_changed_meanwhile() {
    let project = fixture();
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("s.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [
                {"name": "edit_file", "arguments": {"path": "app.py", "old": "return 41", "new": "return 42"}},
                {"name": "edit_file", "arguments": {"path": "docs/guide.md", "old": "# Guide", "new": "# The guide"}},
                {"name": "bash", "arguments": {"command": "sleep 3"}}
            ]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let path = project.file("app.py");
    let edit_meanwhile = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        std::fs::write(&path, "def answer():\n    return 'mine'\n").unwrap();
    });
    let (code, report, stderr, _) =
        run_isolated(&project, script.to_str().unwrap(), &["--apply"], work.path()).await;
    edit_meanwhile.await.unwrap();
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        report["apply_error"]
            .as_str()
            .unwrap()
            .contains("app.py changed on the host meanwhile"),
        "{report}"
    );
    assert_eq!(
        project.read("app.py"),
        "def answer():\n    return 'mine'\n",
        "the user's edit stands"
    );
    assert_eq!(project.read("docs/guide.md"), "# Guide\n", "all or nothing");
}
