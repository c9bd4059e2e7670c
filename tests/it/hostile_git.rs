//! Hostile repositories, second round: what the host does *after* a bind-mounted run. Each
//! scenario plants something inside the sandbox (through the model's `bash`, or the
//! repository's own tests), then runs git on the host the way the user would next — as the
//! project's owner would, with the repository's own config and hooks — and checks that nothing
//! ran: the hook or command would `touch "$MARK"`, and `$MARK` is a path only the host knows.
//!
//! Every scenario has a control: the same plant made directly on a copy on the host, where
//! the same git command *does* create the marker. So each test fails if agentbox lets the plant
//! through, and cannot pass because the attack was wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::scripted::*;
use crate::support::*;
use serde_json::json;

/// git on the host after the session. `safe.directory` lets root act in a project the test
/// user owns (as its owner would); nothing from this machine's own git configs applies.
fn host_git(dir: &Path, mark: &Path, args: &[&str], global: Option<&Path>) -> Output {
    Command::new("git")
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "user.name=agentbox test",
            "-c",
            "user.email=test@agentbox.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .env("MARK", mark)
        .env("GIT_CONFIG_GLOBAL", global.unwrap_or(Path::new("/dev/null")))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .expect("git")
}

/// A set-up or control script on the host, with git able to act in the test user's project.
fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .args(["-ec", script])
        .current_dir(dir)
        .envs([
            ("GIT_CONFIG_COUNT", "3"),
            ("GIT_CONFIG_KEY_0", "safe.directory"),
            ("GIT_CONFIG_VALUE_0", "*"),
            ("GIT_CONFIG_KEY_1", "user.name"),
            ("GIT_CONFIG_VALUE_1", "agentbox test"),
            ("GIT_CONFIG_KEY_2", "user.email"),
            ("GIT_CONFIG_VALUE_2", "test@agentbox.invalid"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", text(&out.stderr));
}

/// A committed repository, owned by the test user, set up by `setup` (a shell script run in it).
fn repo(setup: &str) -> Project {
    let p = Project::new(&[("a.py", "x = 1\n")]);
    sh(
        p.path(),
        "git init -q && git add -A && \
         git commit -qm init",
    );
    if !setup.is_empty() {
        sh(p.path(), setup);
    }
    p.chown_all();
    p
}

struct Marker {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn marker() -> Marker {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("PWNED");
    Marker { _dir: dir, path }
}

/// The control: `plant` run on the host in a fresh repository set up the same way, then `git`
/// there — the marker must appear, or the scenario proves nothing.
fn control(setup: &str, plant: &str, git_dir: &str, git: &[&str], global: Option<&Path>) {
    let p = repo(setup);
    sh(p.path(), plant);
    let m = marker();
    let out = host_git(&p.path().join(git_dir), &m.path, git, global);
    assert!(
        m.path.exists(),
        "control: the plant did not run on the host, so the scenario proves nothing: {}",
        text(&out.stderr)
    );
}

/// The plant made through agentbox's sandbox by the model, then the same `git` on the host.
async fn through_agentbox(
    project: &Project,
    plant: &str,
    git_dir: &str,
    git: &[&str],
    env: &[(&str, &str)],
    global: Option<&Path>,
) -> (Run, bool) {
    let run = finish(spawn_run(
        project,
        json!([{"tool_calls": [bash(&format!("{plant}\necho planted"))]}, done("done")]),
        &[],
        env,
    ))
    .await;
    assert!(
        run.result(0).1.contains("planted") || run.result(0).2,
        "{}",
        run.stderr
    );
    let m = marker();
    let _ = host_git(&project.path().join(git_dir), &m.path, git, global);
    (run, m.path.exists())
}

const FSMONITOR_PLANT: &str = r#"mkdir -p tools/cache/objects tools/cache/refs/heads docs
ln -s refs/heads/main tools/cache/HEAD
printf '[core]\n\tbare = false\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' > tools/cache/config
ln -s ../tools/cache docs/.git"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_behind_a_git_link_with_a_dangling_head_is_moved_out() {
    control("", FSMONITOR_PLANT, "docs", &["status"], None);
    let project = repo("");
    let (run, ran) = through_agentbox(&project, FSMONITOR_PLANT, "docs", &["status"], &[], None).await;
    assert!(
        !ran,
        "git status on the host ran the planted fsmonitor: {}",
        run.warnings()
    );
    assert!(project.file("docs").is_dir(), "the project's own directory stays");
    assert!(project.file("docs/.git").symlink_metadata().is_err());
    assert!(project.file("tools/cache").symlink_metadata().is_err());
    assert!(
        run.quarantined("tools/cache/config").is_file(),
        "recoverable: {}",
        run.warnings()
    );
    assert!(run.quarantined("docs/.git").symlink_metadata().is_ok());
    let w = run.warnings();
    assert!(w.contains("docs/.git") && w.contains("tools/cache"), "{w}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_planted_by_the_tests_during_the_final_run_is_caught() {
    // The repository's own test plants it each time it runs, the final run by agentbox too.
    let plant_py = format!(
        "import subprocess\n\ndef test_plant():\n    subprocess.run(['sh', '-c', r'''{FSMONITOR_PLANT}'''], check=False)\n"
    );
    let project = repo("");
    std::fs::write(project.file("test_plant.py"), plant_py).unwrap();
    project.chown_all();
    let run = hostile(
        &project,
        json!([{"tool_calls": [call("run_tests", json!({}))]}, done("tests pass")]),
        &["--test-cmd", "python3 -m pytest -q -p no:cacheprovider"],
    )
    .await;
    let report = run.report.as_ref().expect("a report");
    assert_eq!(report["tests"]["passed"], true, "{}", run.stderr);
    let m = marker();
    host_git(&project.path().join("docs"), &m.path, &["status"], None);
    assert!(
        !m.path.exists(),
        "the plant of the final test run ran on the host"
    );
    assert!(run.warnings().contains("docs/.git"), "{}", run.warnings());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quarantine_cannot_complete_a_link_to_itself() {
    let plant = r#"mkdir -p vendor/cache/objects vendor/cache/refs docs
echo 'ref: refs/heads/main' > vendor/cache/HEAD
printf '[core]\n\tbare = false\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' > vendor/cache/config
ln -s ../vendor/cache-agentbox-quarantine docs/.git"#;
    // The control names the link's target as it is, which is what the old quarantine made.
    control(
        "",
        &plant.replace("cache-agentbox-quarantine", "cache"),
        "docs",
        &["status"],
        None,
    );
    let project = repo("");
    let (run, ran) = through_agentbox(&project, plant, "docs", &["status"], &[], None).await;
    assert!(!ran, "{}", run.warnings());
    let left: Vec<_> = std::fs::read_dir(project.file("vendor")).unwrap().collect();
    assert!(
        left.is_empty(),
        "nothing a link in the project could reach: {left:?}"
    );
}

const HOOK: &str = r#"printf '#!/bin/sh\ntouch "$MARK"\n'"#;

fn commit_after(plant: &str) -> String {
    format!("{plant}\necho change >> a.py")
}

const COMMIT: &[&str] = &["commit", "-qam", "after the session"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_path_reached_through_a_renamed_parent_is_moved_out() {
    let setup = "mkdir -p .husky/_ && printf '#!/bin/sh\\nexit 0\\n' > .husky/_/pre-commit && \
                 chmod +x .husky/_/pre-commit && git config core.hooksPath .husky/_";
    let plant = commit_after(&format!(
        "mv .husky .husky-old && mkdir -p .husky/_ && {HOOK} > .husky/_/pre-commit && chmod +x .husky/_/pre-commit"
    ));
    control(setup, &plant, ".", COMMIT, None);
    let project = repo(setup);
    let (run, ran) = through_agentbox(&project, &plant, ".", COMMIT, &[], None).await;
    assert!(!ran, "the commit ran the planted hook: {}", run.warnings());
    assert!(
        run.quarantined(".husky/_/pre-commit").is_file(),
        "{}",
        run.warnings()
    );
    assert!(
        project.file(".husky-old/_/pre-commit").is_file(),
        "the original is left where it was moved"
    );
    assert!(
        run.warnings().contains("which the session replaced or renamed"),
        "{}",
        run.warnings()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huskys_hook_scripts_one_level_up_are_read_only() {
    // husky v9: core.hooksPath = .husky/_, whose `h` runs the hook script in .husky/.
    let setup = r#"mkdir -p .husky/_
printf '#!/bin/sh\nn=$(basename "$0"); s="$(dirname "$(dirname "$0")")/$n"; [ -f "$s" ] && sh -e "$s"\n' > .husky/_/h
printf '#!/bin/sh\n. "$(dirname "$0")/h"\n' > .husky/_/pre-commit
printf 'exit 0\n' > .husky/pre-commit
chmod +x .husky/_/h .husky/_/pre-commit
git config core.hooksPath .husky/_"#;
    let plant = commit_after(r#"printf 'touch "$MARK"\n' > .husky/pre-commit"#);
    control(setup, &plant, ".", COMMIT, None);
    let project = repo(setup);
    let (run, ran) = through_agentbox(&project, &plant, ".", COMMIT, &[], None).await;
    assert!(!ran, "{}", run.result(0).1);
    assert!(
        run.result(0).1.contains("Read-only file system"),
        "{}",
        run.result(0).1
    );
    assert_eq!(project.read(".husky/pre-commit"), "exit 0\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_included_config_created_by_the_session_is_moved_out() {
    let setup = "git config include.path ../team.gitconfig";
    let plant = commit_after(&format!(
        "printf '[core]\\n\\thooksPath = .githooks\\n' > team.gitconfig && mkdir -p .githooks && \
         {HOOK} > .githooks/pre-commit && chmod +x .githooks/pre-commit"
    ));
    control(setup, &plant, ".", COMMIT, None);
    let project = repo(setup);
    let (run, ran) = through_agentbox(&project, &plant, ".", COMMIT, &[], None).await;
    assert!(!ran, "{}", run.warnings());
    assert!(run.quarantined("team.gitconfig").is_file(), "{}", run.warnings());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_worktrees_hooks_path_from_the_main_repository_is_watched() {
    // The project is a linked worktree of a repository elsewhere, whose config sets a
    // relative hooks path: relative to each worktree, so inside the project.
    let make = || {
        let main = tempfile::tempdir().unwrap();
        sh(
            main.path(),
            "git init -q && echo x > x && git add x && git \
             commit -qm init && git config core.hooksPath .githooks",
        );
        let project = Project::new(&[]);
        let out = Command::new("git")
            .args(["-C"])
            .arg(main.path())
            .args(["worktree", "add", "-q", "-f", "-b", "wt"])
            .arg(project.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        std::fs::write(project.file("a.py"), "x = 1\n").unwrap();
        sh(project.path(), "git add a.py && git commit -qm a");
        project.chown_all();
        (main, project)
    };
    let plant = commit_after(&format!(
        "mkdir -p .githooks && {HOOK} > .githooks/pre-commit && chmod +x .githooks/pre-commit"
    ));
    {
        let (_main, p) = make();
        sh(p.path(), &plant);
        let m = marker();
        host_git(p.path(), &m.path, COMMIT, None);
        assert!(m.path.exists(), "control: the worktree's hook did not run");
    }
    let (_main, project) = make();
    let (run, ran) = through_agentbox(&project, &plant, ".", COMMIT, &[], None).await;
    assert!(!ran, "{}", run.warnings());
    assert!(run.quarantined(".githooks").is_dir(), "{}", run.warnings());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_path_that_did_not_exist_must_still_not_exist() {
    let setup = "git config core.hooksPath hooks";
    let plant = commit_after(&format!(
        "mkdir -p hooks && {HOOK} > hooks/pre-commit && chmod +x hooks/pre-commit"
    ));
    control(setup, &plant, ".", COMMIT, None);
    let project = repo(setup);
    let (run, ran) = through_agentbox(&project, &plant, ".", COMMIT, &[], None).await;
    assert!(!ran, "{}", run.warnings());
    assert!(
        run.quarantined("hooks/pre-commit").is_file(),
        "{}",
        run.warnings()
    );
    assert!(
        run.warnings().contains("which did not exist before"),
        "{}",
        run.warnings()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_own_relative_hooks_path_is_watched_too() {
    // `core.hooksPath = .githooks` in the user's global config: every repository's .githooks.
    let home = tempfile::tempdir().unwrap();
    let global = home.path().join(".gitconfig");
    std::fs::write(&global, "[core]\n\thooksPath = .githooks\n").unwrap();
    let plant = commit_after(&format!(
        "mkdir -p .githooks && {HOOK} > .githooks/pre-commit && chmod +x .githooks/pre-commit"
    ));
    control("", &plant, ".", COMMIT, Some(&global));
    let project = repo("");
    let home_s = home.path().to_str().unwrap();
    let (run, ran) =
        through_agentbox(&project, &plant, ".", COMMIT, &[("HOME", home_s)], Some(&global)).await;
    assert!(!ran, "{}", run.warnings());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_the_diff_cannot_show_are_reported_from_the_hosts_own_scan() {
    let project = repo(
        "printf '.venv/\\n' > .gitignore && git add .gitignore && \
                        git commit -qm ignore && \
                        mkdir -p .venv/lib/python3.11/site-packages",
    );
    let run = hostile(
        &project,
        json!([{"tool_calls": [bash(
            "echo 'import os; os.system(\"touch /tmp/x\")' > .venv/lib/python3.11/site-packages/evil.pth && echo ok"
        )]}, done("nothing to see")]),
        &[],
    )
    .await;
    let report = run.report.as_ref().unwrap();
    assert_eq!(
        report["changed_files"],
        json!([]),
        "git ignores it: the diff is empty"
    );
    let outside = report["changed_outside_diff"]["paths"].to_string();
    assert!(
        outside.contains(".venv/lib/python3.11/site-packages/evil.pth"),
        "{}",
        report["changed_outside_diff"]
    );

    // When the in-sandbox diff fails, the report says so and the host's scan lists the change.
    let project = repo("");
    let run = hostile(
        &project,
        json!([{"tool_calls": [bash("rm -rf /run/agentbox/baseline.git; echo y = 2 >> a.py; echo ok")]}, done("x")]),
        &[],
    )
    .await;
    let report = run.report.as_ref().unwrap();
    assert!(report["diff_error"].is_string(), "{report}");
    assert!(
        report["changed_outside_diff"]["paths"]
            .to_string()
            .contains("a.py"),
        "{report}"
    );
}

/// Found in review: the sandbox renamed a linked worktree inside the project and put a link to
/// the project's root in its place; the quarantine then followed the link and moved the
/// project's own `.git` away, leaving a planted bare repository at the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_in_place_of_a_worktree_is_what_goes_never_what_it_leads_to() {
    let project = repo(
        "printf '.worktrees/\\n' > .gitignore && git add .gitignore && git commit -qm ignore && \
                        git worktree add -q .worktrees/feat -b feat",
    );
    let git_before = std::fs::symlink_metadata(project.file(".git")).unwrap();
    let plant = r#"mv .worktrees/feat .worktrees/feat.old && ln -s .. .worktrees/feat
printf 'ref: refs/heads/main\n' > HEAD && mkdir -p objects refs/heads
printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' > config"#;
    let (run, ran) = through_agentbox(&project, plant, ".", &["status"], &[], None).await;
    assert!(!ran, "{}", run.warnings());
    let git_after = std::fs::symlink_metadata(project.file(".git")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (git_before.dev(), git_before.ino()),
        (git_after.dev(), git_after.ino()),
        "the project's own .git stays: {}",
        run.warnings()
    );
    assert!(
        run.quarantined(".worktrees/feat")
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink()),
        "the link itself is quarantined: {}",
        run.warnings()
    );
    assert!(
        project.file("HEAD").symlink_metadata().is_err(),
        "the root's planted HEAD goes"
    );
}

/// A project inside a larger repository (a monorepo's subdirectory) with no `.git` of its own:
/// a bare repository planted at its root, and the enclosing repository's hooks path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_inside_a_repository_is_protected_by_that_repositorys_config() {
    let make = |hooks: &str| {
        repo(&format!(
            "mkdir -p svc tools && echo x > svc/a.py && echo y > tools/b.py && {hooks} git add -A && git commit -qm svc"
        ))
    };
    // (a) The project root made a bare repository.
    let plant = r#"printf 'ref: refs/heads/main\n' > HEAD && mkdir -p objects refs/heads
printf '[core]\n\trepositoryformatversion = 0\n\tworktree = .\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' > config"#;
    {
        let mono = make("");
        sh(&mono.path().join("svc"), plant);
        let m = marker();
        host_git(&mono.path().join("svc"), &m.path, &["status"], None);
        assert!(
            m.path.exists(),
            "control: the planted root repository did not run"
        );
    }
    let mono = make("");
    let svc = Project {
        dir: tempfile::TempDir::new_in(mono.path()).unwrap(),
    };
    // Run on a subdirectory of the repository: the temporary one inside it.
    sh(svc.path(), "echo x > a.py");
    svc.chown_all();
    let (run, ran) = through_agentbox(&svc, plant, ".", &["status"], &[], None).await;
    assert!(!ran, "{}", run.warnings());

    // (b) The enclosing repository's core.hooksPath names a directory inside the project.
    let hooks = "git config core.hooksPath tools/git-hooks &&";
    let plant = commit_after(&format!(
        "mkdir -p git-hooks && {HOOK} > git-hooks/pre-commit && chmod +x git-hooks/pre-commit"
    ))
    .replace("a.py", "b.py");
    {
        let mono = make(hooks);
        sh(&mono.path().join("tools"), &plant);
        let m = marker();
        host_git(mono.path(), &m.path, COMMIT, None);
        assert!(
            m.path.exists(),
            "control: the enclosing repository's hook did not run"
        );
    }
    let mono = make(hooks);
    let tools = Project {
        dir: tempfile::TempDir::new_in(mono.path()).unwrap(),
    };
    // The hooks path is relative to the enclosing repository's top: point it at this project.
    let rel = tools.path().file_name().unwrap().to_str().unwrap().to_string();
    sh(mono.path(), &format!("git config core.hooksPath {rel}/git-hooks"));
    sh(tools.path(), "echo y > b.py");
    tools.chown_all();
    let (run, _) = through_agentbox(&tools, &plant, ".", &["status"], &[], None).await;
    let m = marker();
    sh(mono.path(), "git add -A");
    host_git(mono.path(), &m.path, COMMIT, None);
    assert!(
        !m.path.exists(),
        "the enclosing repository's hook ran: {}",
        run.warnings()
    );
    assert!(run.quarantined("git-hooks").is_dir(), "{}", run.warnings());
}

/// `alias.st = !./scripts/st.sh`: the script a `!` command runs is protected like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_that_bang_commands_run_are_read_only() {
    let setup = "mkdir -p scripts && printf '#!/bin/sh\\nexit 0\\n' > scripts/st.sh && chmod +x scripts/st.sh && \
                 git add scripts && git commit -qm st && git config alias.st '!./scripts/st.sh'";
    let plant = r#"printf '#!/bin/sh\ntouch "$MARK"\n' > scripts/st.sh"#;
    control(setup, plant, ".", &["st"], None);
    let project = repo(setup);
    let (run, ran) = through_agentbox(&project, plant, ".", &["st"], &[], None).await;
    assert!(!ran, "{}", run.result(0).1);
    assert!(
        run.result(0).1.contains("Read-only file system"),
        "{}",
        run.result(0).1
    );
}

/// Found in review: run as the project's owner (not root, who reads everything), agentbox
/// could not read a directory the session made execute-only, and planted git metadata inside
/// it stayed. A directory the session left unreadable now goes as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_the_session_made_unreadable_goes_as_a_whole() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let project = repo("");
    let plant = r#"mkdir -p sub/hid/.git/objects sub/hid/.git/refs && echo 'ref: refs/heads/main' > sub/hid/.git/HEAD
printf '[core]\n\tfsmonitor = "touch \\"$MARK\\"; false"\n' > sub/hid/.git/config && chmod 311 sub && echo planted"#;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if is_root() {
        // The owner's own data directory is where its quarantine goes.
        std::os::unix::fs::chown(dir.path(), Some(TEST_UID), Some(TEST_UID)).unwrap();
    }
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!([{"tool_calls": [bash(plant)]}, {"text": "done"}]).to_string(),
    )
    .unwrap();
    let data = dir.path().join("data");
    // As the owner: root would read the directory whatever its mode.
    let mut cmd = if is_root() {
        let docker_gid = std::fs::metadata("/var/run/docker.sock")
            .map(|m| m.gid())
            .unwrap_or(0);
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={TEST_UID}"),
            format!("--regid={TEST_UID}"),
            format!("--groups={docker_gid}"),
        ])
        .arg(env!("CARGO_BIN_EXE_agentbox"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_agentbox"))
    };
    with_test_runtime(&mut cmd);
    let out = cmd
        .args([
            "run",
            "--json",
            "--provider",
            "scripted",
            "--test-cmd",
            "true",
            "--script",
        ])
        .arg(&script)
        .arg(project.path())
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", &data)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("left unreadable"),
        "{warnings}\n{}",
        text(&out.stderr)
    );
    assert!(project.file("sub").symlink_metadata().is_err(), "{warnings}");
    let session = report["session"].as_str().unwrap_or_default();
    assert!(data.join("quarantine").join(session).join("sub").is_dir());
}

/// A linked worktree's repository (planted hooks go in its common directory, found the way a
/// hook manager would), then `echo change >> a.py` to have something to commit.
const COMMON_DIR_HOOK: &str = r#"d=$(git rev-parse --path-format=absolute --git-common-dir) && mkdir -p "$d/hooks" && printf '#!/bin/sh\ntouch "$MARK"\n' > "$d/hooks/pre-commit" && chmod +x "$d/hooks/pre-commit""#;

/// A committed repository with a credential in its config, and the project: a linked worktree
/// of it (the layout of parallel agents), both owned by the test user.
fn main_and_worktree() -> (Project, Project) {
    let main = repo("git config http.extraheader 'Authorization: Bearer SECRET-TOKEN'");
    let project = Project::new(&[]);
    let out = Command::new("git")
        .arg("-C")
        .arg(main.path())
        .args([
            "-c",
            "safe.directory=*",
            "worktree",
            "add",
            "-q",
            "-f",
            "-b",
            "wt",
        ])
        .arg(project.path())
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    main.chown_all();
    project.chown_all();
    (main, project)
}

/// Issue 27: in a linked worktree every git command inside failed (`fatal: not a git
/// repository`), with no warning. Now git reads its repository inside — read-only, with a
/// config of agentbox's — and a hook planted in the common directory still does not land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_worktree_has_git_inside_and_its_repository_stays_read_only() {
    let plant = commit_after(COMMON_DIR_HOOK);
    {
        let (_main, p) = main_and_worktree();
        sh(p.path(), &plant);
        let m = marker();
        host_git(p.path(), &m.path, COMMIT, None);
        assert!(
            m.path.exists(),
            "control: the common directory's hook did not run"
        );
    }
    let (main, project) = main_and_worktree();
    let dot_git = project.read(".git");
    let looks = "echo y >> a.py; git status --short; echo status=$?; git diff --stat; echo diff=$?; \
                 git log --oneline | wc -l; echo log=$?; \
                 grep -rl SECRET-TOKEN /run/agentbox-git /workspace/.git; echo grep=$?";
    let (run, ran) = through_agentbox(&project, &format!("{looks}\n{plant}"), ".", COMMIT, &[], None).await;
    let out = run.result(0).1;
    for ok in ["status=0", "diff=0", "log=0", "M a.py", "a.py | 1 +"] {
        assert!(out.contains(ok), "{ok}: {out}\n{}", run.stderr);
    }
    assert!(
        out.contains("grep=1"),
        "the repository's config is not inside: {out}"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(
        !ran,
        "the hook planted in the common directory ran: {}",
        run.warnings()
    );
    assert!(!main.file(".git/hooks/pre-commit").exists());
    assert_eq!(
        project.read(".git"),
        dot_git,
        "the project's own .git file is untouched"
    );
    assert!(
        !run.warnings().contains("git will not work"),
        "{}",
        run.warnings()
    );
    // The diff's snapshot borrowed the repository's objects and index: only a.py changed.
    let report = run.report.as_ref().expect("a report");
    assert_eq!(
        report["changed_files"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(report["changed_files"][0]["path"], "a.py", "{report}");
}

/// The `.git` file is the repository's word: one naming a directory of the user's that is no
/// worktree of theirs (`~/.ssh`; here a stand-in home) mounts nothing of it, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_file_naming_what_is_no_worktree_mounts_nothing_and_warns() {
    let home = Project::new(&[(".ssh/id_ed25519", "PRIVATE-KEY-STAND-IN\n")]);
    let project = Project::new(&[("a.py", "x = 1\n")]);
    std::fs::write(
        project.file(".git"),
        format!("gitdir: {}\n", home.file(".ssh").display()),
    )
    .unwrap();
    project.chown_all();
    let home_name = home.path().file_name().unwrap().to_str().unwrap().to_string();
    let look = format!(
        "git status; echo status=$?; grep -c {home_name} /proc/self/mountinfo; ls /run/agentbox-git; \
         grep -rl PRIVATE-KEY-STAND-IN /run /workspace /home /tmp; echo done"
    );
    let run = finish(spawn_run(
        &project,
        json!([{"tool_calls": [bash(&look)]}, done("done")]),
        &[],
        &[],
    ))
    .await;
    let out = run.result(0).1;
    assert!(out.contains("done"), "{out}\n{}", run.stderr);
    assert!(out.contains("status=128"), "{out}");
    assert!(
        out.contains("\n0\n"),
        "nothing of the stand-in home is mounted: {out}"
    );
    assert!(!out.contains("id_ed25519"), "{out}");
    let w = run.warnings();
    assert!(
        w.contains("git will not work inside the sandbox") && w.contains(".ssh"),
        "{w}"
    );
}

/// A submodule's checkout as the project: its repository lives in the superproject's
/// `.git/modules/NAME`, outside the project; git reads it inside the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submodules_checkout_has_git_inside() {
    let sup = repo("");
    let project = Project {
        dir: tempfile::TempDir::new_in(sup.path()).unwrap(),
    };
    let name = project.path().file_name().unwrap().to_str().unwrap().to_string();
    std::fs::remove_dir(project.path()).unwrap();
    // Cloned from a repository of root's own when run as root: the clone's own git does not
    // get the set-up's `safe.directory`.
    let source = tempfile::tempdir().unwrap();
    sh(
        source.path(),
        "git init -q && echo 'x = 1' > a.py && git add a.py && git commit -qm a",
    );
    sh(
        sup.path(),
        &format!(
            "git -c protocol.file.allow=always submodule add -q {} {name} && git commit -qm sub",
            source.path().display()
        ),
    );
    sup.chown_all();
    let run = finish(spawn_run(
        &project,
        json!([{"tool_calls": [bash("echo y >> a.py; git status --short; echo status=$?; git log --oneline | wc -l")]}, done("done")]),
        &[],
        &[],
    ))
    .await;
    let out = run.result(0).1;
    assert!(
        out.contains("status=0") && out.contains("M a.py"),
        "{out}\n{}",
        run.stderr
    );
    assert!(
        !run.warnings().contains("git will not work"),
        "{}",
        run.warnings()
    );
}
