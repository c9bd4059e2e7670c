//! `agentbox env merge NAME --branch BRANCH` (issue 34): a branch with one commit per turn on
//! the commit the environment was made from (a first commit "state at creation" when tracked
//! files had uncommitted changes), made without running a hook of the user's repository or a
//! filter a `.gitattributes` of the sandbox's names, leaving the working tree and index as
//! they were.

use crate::env_fork::{Envs, bash_script, changed, env_cmd_with, run_env_with};
use crate::support::*;

/// The project belongs to the test user while the tests run as root: git's ownership check
/// is lifted for them, as for a user's own repository; no global or system configuration.
const GIT_VARS: &[(&str, &str)] = &[
    ("GIT_CONFIG_COUNT", "1"),
    ("GIT_CONFIG_KEY_0", "safe.directory"),
    ("GIT_CONFIG_VALUE_0", "*"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
];

/// The test's own git commands: the hooks are for agentbox's to (not) run.
fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .envs(GIT_VARS.iter().copied())
        .arg("-C")
        .arg(dir)
        .args(["--no-optional-locks", "-c", "core.hooksPath=/dev/null"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_as_a_branch_runs_no_hook_and_touches_no_checkout() {
    let project = Project::new(&[("app.py", "v = 0\n"), ("README.md", "committed\n")]);
    let p = project.path();
    let data = tempfile::tempdir().unwrap();
    let markers = data.path().join("markers");
    std::fs::create_dir(&markers).unwrap();
    git(p, &["init", "-q", "-b", "main"]);
    git(p, &["config", "user.name", "Test"]);
    git(p, &["config", "user.email", "test@example.invalid"]);
    git(p, &["add", "."]);
    git(p, &["commit", "-q", "-m", "initial"]);
    // Hooks that would leave a marker, and a filter that would: a .gitattributes the sandbox
    // writes names it.
    for hook in [
        "pre-commit",
        "post-commit",
        "reference-transaction",
        "post-checkout",
        "post-index-change",
    ] {
        let path = p.join(".git/hooks").join(hook);
        std::fs::write(
            &path,
            format!("#!/bin/sh\ntouch '{}/{hook}'\n", markers.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let filter = format!("sh -c 'touch {}/filter; cat'", markers.display());
    git(p, &["config", "filter.evil.clean", &filter]);
    git(p, &["config", "filter.evil.smudge", &filter]);
    // Dirty at creation: a tracked file changed, not committed.
    std::fs::write(p.join("README.md"), "uncommitted\n").unwrap();
    let head = git(p, &["rev-parse", "HEAD"]);

    let env = format!("it-br-{}", uuid::Uuid::new_v4().simple());
    let _envs = Envs {
        data: data.path(),
        names: vec![env.clone()],
    };
    let turns = [
        (
            "make it one",
            "sed -i s/0/1/ app.py && printf '* filter=evil\\n' > .gitattributes",
        ),
        ("add two", "echo two > two.txt && rm README.md"),
    ];
    for (i, (task, command)) in turns.iter().enumerate() {
        let s = bash_script(data.path(), &format!("{i}.json"), command);
        let out = run_env_with(data.path(), &env, &s, p, task, GIT_VARS);
        assert!(out.status.code().is_some(), "{}", changed(&out));
    }
    let status_before = git(p, &["status", "--porcelain"]);
    let index_before = std::fs::read(p.join(".git/index")).unwrap();

    let merged = env_cmd_with(data.path(), &["merge", &env, "--branch", "agent/try"], GIT_VARS);
    assert!(merged.status.success(), "{}", text(&merged.stderr));
    let subjects = git(p, &["log", "--format=%s", "agent/try"]);
    assert_eq!(
        subjects.lines().collect::<Vec<_>>(),
        ["add two", "make it one", "state at creation", "initial"]
    );
    assert_eq!(git(p, &["rev-parse", "agent/try~3"]), head);
    assert_eq!(git(p, &["show", "agent/try~2:README.md"]), "uncommitted\n");
    assert_eq!(git(p, &["show", "agent/try~1:app.py"]), "v = 1\n");
    assert_eq!(git(p, &["show", "agent/try~1:.gitattributes"]), "* filter=evil\n");
    assert_eq!(git(p, &["show", "agent/try:two.txt"]), "two\n");
    let files = git(p, &["ls-tree", "-r", "--name-only", "agent/try"]);
    assert!(!files.lines().any(|f| f == "README.md"), "{files}");

    let ran: Vec<_> = std::fs::read_dir(&markers)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(ran.is_empty(), "ran: {ran:?}");
    assert_eq!(git(p, &["status", "--porcelain"]), status_before);
    assert_eq!(std::fs::read(p.join(".git/index")).unwrap(), index_before);
    assert_eq!(git(p, &["symbolic-ref", "HEAD"]), "refs/heads/main\n");
    assert_eq!(
        std::fs::read_to_string(p.join("README.md")).unwrap(),
        "uncommitted\n"
    );
    assert!(!p.join("two.txt").exists());

    let again = env_cmd_with(data.path(), &["merge", &env, "--branch", "agent/try"], GIT_VARS);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("exists already"),
        "{}",
        text(&again.stderr)
    );
    let bad = env_cmd_with(data.path(), &["merge", &env, "--branch", "bad..name"], GIT_VARS);
    assert!(
        text(&bad.stderr).contains("bad branch name"),
        "{}",
        text(&bad.stderr)
    );
}
