//! `agentbox env fork` (issue 34): the new environment has the files and the log, changing it
//! leaves the original as it was; a fork onto an existing name, from a missing one, or to a
//! bad name is refused.

use crate::support::*;
use agentbox::sandbox::ENV_LABEL;

/// A scripted model's turns, written beside the data directory.
pub(crate) fn script(dir: &std::path::Path, file: &str, turns: serde_json::Value) -> String {
    let path = dir.join(file);
    std::fs::write(&path, turns.to_string()).unwrap();
    path.display().to_string()
}

/// A scripted model that runs `command` with bash, then stops.
pub(crate) fn bash_script(dir: &std::path::Path, file: &str, command: &str) -> String {
    script(
        dir,
        file,
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": "done"}
        ]}),
    )
}

/// `agentbox run --json --env ENV --script SCRIPT PROJECT TASK` with its own data directory.
pub(crate) fn run_env(
    data: &std::path::Path,
    env: &str,
    script: &str,
    project: &std::path::Path,
    task: &str,
) -> std::process::Output {
    run_env_with(data, env, script, project, task, &[])
}

/// [`run_env`] with variables of its own (a git configuration).
pub(crate) fn run_env_with(
    data: &std::path::Path,
    env: &str,
    script: &str,
    project: &std::path::Path,
    task: &str,
    vars: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = agentbox();
    cmd.envs(vars.iter().copied())
        .env("AGENTBOX_DATA_DIR", data)
        .args(["run", "--json", "--env", env, "--script", script])
        .arg(project)
        .arg(task)
        .current_dir(data)
        .stdin(std::process::Stdio::null());
    run(&mut cmd)
}

/// `agentbox env ARGS...` with its own data directory.
pub(crate) fn env_cmd(data: &std::path::Path, args: &[&str]) -> std::process::Output {
    env_cmd_with(data, args, &[])
}

/// [`env_cmd`] with variables of its own.
pub(crate) fn env_cmd_with(
    data: &std::path::Path,
    args: &[&str],
    vars: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = agentbox();
    cmd.envs(vars.iter().copied())
        .env("AGENTBOX_DATA_DIR", data)
        .arg("env")
        .args(args)
        .stdin(std::process::Stdio::null());
    run(&mut cmd)
}

/// The files a `run --json`'s report says changed.
pub(crate) fn changed(out: &std::process::Output) -> String {
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    format!("{}\n{}", report["changed_files"], text(&out.stderr))
}

pub(crate) fn record(data: &std::path::Path, env: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data.join("envs").join(env).join("record.json")).unwrap()).unwrap()
}

/// Removes the environments at the end of a test, passed or not.
pub(crate) struct Envs<'a> {
    pub data: &'a std::path::Path,
    pub names: Vec<String>,
}

impl Drop for Envs<'_> {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = env_cmd(self.data, &["rm", n]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_then_change_the_fork_and_the_original_is_untouched() {
    let docker = docker().await;
    let project = Project::new(&[("app.py", "def answer():\n    return 41\n")]);
    let data = tempfile::tempdir().unwrap();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (a, b) = (format!("it-fa-{id}"), format!("it-fb-{id}"));
    let _envs = Envs {
        data: data.path(),
        names: vec![a.clone(), b.clone()],
    };

    let first = bash_script(
        data.path(),
        "1.json",
        "sed -i s/41/42/ app.py && chmod 600 app.py",
    );
    let out = run_env(data.path(), &a, &first, project.path(), "make it 42");
    assert!(changed(&out).contains("app.py"), "{}", changed(&out));

    let fork = env_cmd(data.path(), &["fork", &a, &b]);
    assert!(fork.status.success(), "{}", text(&fork.stderr));
    let volume = docker
        .inspect_volume(&format!("agentbox-env-{b}"))
        .await
        .expect("the fork's volume");
    assert_eq!(volume.labels.get(ENV_LABEL), Some(&b));
    assert!(!volume.labels.contains_key("agentbox.session"));
    let forked = record(data.path(), &b);
    assert_eq!(forked["forked_from"], a.as_str());
    assert_eq!(forked["name"], b.as_str());
    assert_eq!(forked["turns"][0]["task"], "make it 42");
    let show = text(&env_cmd(data.path(), &["show", &b]).stdout);
    assert!(show.contains(&format!("forked from {a}")), "{show}");
    assert!(data.path().join("envs").join(&b).join("manifest.json").exists());
    assert!(
        data.path()
            .join("envs")
            .join(&b)
            .join("checkpoints/1.json")
            .exists()
    );

    // The fork has the first turn's edit (the sandbox user still owns it: it writes there).
    let second = bash_script(
        data.path(),
        "2.json",
        "grep -q 'return 42' app.py && sed -i s/42/43/ app.py && echo fork > fork.txt",
    );
    let out = run_env(data.path(), &b, &second, project.path(), "make it 43");
    assert!(changed(&out).contains("fork.txt"), "{}", changed(&out));

    // The original is as the first turn left it.
    let check = bash_script(
        data.path(),
        "3.json",
        "grep -q 'return 42' app.py && ! test -e fork.txt && echo original > seen.txt",
    );
    let out = run_env(data.path(), &a, &check, project.path(), "look");
    assert!(changed(&out).contains("seen.txt"), "{}", changed(&out));
    assert_eq!(record(data.path(), &a)["turns"].as_array().unwrap().len(), 2);
    assert_eq!(record(data.path(), &b)["turns"].as_array().unwrap().len(), 2);
    assert_eq!(
        std::fs::read_to_string(project.file("app.py")).unwrap(),
        "def answer():\n    return 41\n"
    );

    // Refused: onto an existing name, from a missing one, to a bad name.
    let again = env_cmd(data.path(), &["fork", &a, &b]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("exists already"),
        "{}",
        text(&again.stderr)
    );
    let missing = env_cmd(
        data.path(),
        &["fork", &format!("it-none-{id}"), &format!("it-nx-{id}")],
    );
    assert!(
        text(&missing.stderr).contains("does not exist"),
        "{}",
        text(&missing.stderr)
    );
    let bad = env_cmd(data.path(), &["fork", &a, "../x"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(
        docker
            .inspect_volume(&format!("agentbox-env-it-nx-{id}"))
            .await
            .is_err()
    );
}
