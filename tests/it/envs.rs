//! Named environments (`--env`, issue 34): the volume outlives its sandbox and its process's
//! sweeps, and a second sandbox resumes it as it was left.

use std::time::Duration;

use crate::support::*;
use agentbox::sandbox::{ENV_LABEL, ExecRequest, Sandbox, WorkspaceSource};

async fn out(sb: &dyn Sandbox, cmd: &str) -> String {
    let out = sb
        .exec(ExecRequest::shell(cmd, Duration::from_secs(60)))
        .await
        .expect("exec");
    assert!(out.success(), "{cmd}: {}", out.stderr.to_text());
    out.stdout.to_text()
}

#[tokio::test]
async fn an_environment_volume_outlives_its_sandbox_and_gc() {
    let docker = docker().await;
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let env = format!("it-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
    let volume = format!("agentbox-env-{env}");
    let cfg = config();
    let dir = agentbox::sandbox::inspect_project(project.path()).unwrap();
    let packed = agentbox::hostfs::isolate::pack(project.path(), dir.uid, dir.gid, &|_| false).unwrap();
    let spec_for = |seed: Option<std::path::PathBuf>| {
        let mut spec = cfg.volume_spec(project.path(), packed.tar.path()).unwrap();
        spec.workspace = WorkspaceSource::Env {
            name: volume.clone(),
            env: env.clone(),
            seed,
        };
        spec
    };

    let first = agentbox::sandbox::DockerSandbox::create(&docker, spec_for(Some(packed.tar.path().into())))
        .await
        .expect("sandbox");
    out(&first, "echo changed > new.txt").await;
    first.shutdown().await.unwrap();

    let found = docker.inspect_volume(&volume).await.expect("the volume is kept");
    assert_eq!(found.labels.get(ENV_LABEL), Some(&env));
    assert!(!found.labels.contains_key("agentbox.pid"), "{:?}", found.labels);
    assert!(
        !found.labels.contains_key("agentbox.session"),
        "{:?}",
        found.labels
    );
    let swept = agentbox::sandbox::gc::collect(&docker, false, false)
        .await
        .unwrap();
    assert!(!swept.volumes_removed.contains(&volume));
    docker.inspect_volume(&volume).await.expect("plain gc leaves it");

    // Resumed: no copy, what the first sandbox left.
    let second = agentbox::sandbox::DockerSandbox::create(&docker, spec_for(None))
        .await
        .expect("resumed sandbox");
    assert_eq!(out(&second, "cat new.txt app.py").await, "changed\nx = 1\n");
    second.shutdown().await.unwrap();
    assert!(!project.path().join("new.txt").exists());

    // Another environment's name does not open this volume.
    let mut wrong = spec_for(None);
    if let WorkspaceSource::Env { env, .. } = &mut wrong.workspace {
        env.push_str("-other");
    }
    assert!(
        agentbox::sandbox::DockerSandbox::create(&docker, wrong)
            .await
            .is_err()
    );

    docker
        .remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>)
        .await
        .unwrap();
}

fn script(dir: &std::path::Path, file: &str, turns: serde_json::Value) -> String {
    let path = dir.join(file);
    std::fs::write(&path, turns.to_string()).unwrap();
    path.display().to_string()
}

fn run_env(
    data: &std::path::Path,
    env: &str,
    script: &str,
    project: &std::path::Path,
    task: &str,
) -> std::process::Output {
    let mut cmd = agentbox();
    cmd.env("AGENTBOX_DATA_DIR", data)
        .args(["run", "--json", "--env", env, "--script", script])
        .arg(project)
        .arg(task)
        .current_dir(data)
        .stdin(std::process::Stdio::null());
    run(&mut cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_then_resume_in_the_same_copy() {
    let docker = docker().await;
    let project = Project::new(&[("app.py", "def answer():\n    return 41\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-resume-{}", uuid::Uuid::new_v4().simple());
    let first = script(
        data.path(),
        "first.json",
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "edit_file", "arguments": {"path": "app.py", "old": "return 41", "new": "return 42"}}]},
            {"text": "done"}
        ]}),
    );
    let out = run_env(data.path(), &env, &first, project.path(), "make it 42");
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let record_path = data.path().join("envs").join(&env).join("record.json");
    assert!(record_path.exists(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(project.file("app.py")).unwrap(),
        "def answer():\n    return 41\n"
    );

    // The second run's copy is the first's: the command fails unless the edit is there.
    let second = script(
        data.path(),
        "second.json",
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "grep -q 'return 42' app.py && echo seen > second.txt"}}]},
            {"text": "done"}
        ]}),
    );
    let out = run_env(data.path(), &env, &second, project.path(), "look again");
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let changed = report["changed_files"].to_string();
    assert!(changed.contains("second.txt"), "{changed}\n{}", text(&out.stderr));
    assert!(!project.file("second.txt").exists());
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    let tasks: Vec<&str> = record["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["make it 42", "look again"]);

    // Another project may not use it.
    let other = Project::new(&[("x.py", "")]);
    let out = run_env(data.path(), &env, &second, other.path(), "no");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("is of project"),
        "{}",
        text(&out.stderr)
    );

    let env_cmd = |args: &[&str]| {
        let mut cmd = agentbox();
        cmd.env("AGENTBOX_DATA_DIR", data.path()).arg("env").args(args);
        run(&mut cmd)
    };
    let list = env_cmd(&["list"]);
    assert!(text(&list.stdout).contains(&env), "{}", text(&list.stderr));
    assert!(
        text(&list.stdout).contains("2 turns\t2 changed\t"),
        "{}",
        text(&list.stdout)
    );
    let show = text(&env_cmd(&["show", &env]).stdout);
    assert!(
        show.contains("make it 42") && show.contains("look again"),
        "{show}"
    );
    assert!(show.contains("second.txt"), "{show}");

    // Plain gc leaves it; `env rm` leaves nothing.
    let volume = format!("agentbox-env-{env}");
    assert_eq!(run(agentbox().arg("gc")).status.code(), Some(0));
    docker
        .inspect_volume(&volume)
        .await
        .expect("plain gc leaves an environment");
    let rm = env_cmd(&["rm", &env]);
    assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
    assert!(
        docker.inspect_volume(&volume).await.is_err(),
        "the volume is removed"
    );
    assert!(!data.path().join("envs").join(&env).exists());
    assert_ne!(env_cmd(&["show", &env]).status.code(), Some(0));
}

#[test]
fn a_bad_name_is_refused_before_anything_is_made() {
    let project = Project::new(&[("app.py", "")]);
    let data = tempfile::tempdir().unwrap();
    let done = script(
        data.path(),
        "done.json",
        serde_json::json!({"turns": [{"text": "done"}]}),
    );
    for bad in ["../x", "A", ""] {
        let out = run_env(data.path(), bad, &done, project.path(), "t");
        assert!(
            text(&out.stderr).contains("bad environment name"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
        assert!(!data.path().join("envs").exists());
    }
}

/// A volume with the environment's label and no record, as a first run cut short leaves.
async fn orphan_volume(docker: &bollard::Docker, volume: &str, env: &str) {
    docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(volume.to_string()),
            labels: Some(std::collections::HashMap::from([(
                ENV_LABEL.to_string(),
                env.to_string(),
            )])),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// A first run cut short after its volume was filled and before its record was written: the
/// next `--env NAME` refuses to copy on top of it, and `env rm NAME` removes it.
#[tokio::test]
async fn a_volume_without_its_record_is_refused_then_removed() {
    let docker = docker().await;
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-orphan-{}", uuid::Uuid::new_v4().simple());
    let volume = format!("agentbox-env-{env}");
    orphan_volume(&docker, &volume, &env).await;
    let s = script(
        data.path(),
        "s.json",
        serde_json::json!({"turns": [{"text": "done"}]}),
    );
    let out = run_env(data.path(), &env, &s, project.path(), "anything");
    let stderr = text(&out.stderr);
    let _ = docker
        .remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>)
        .await
        .err();
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("has no record"), "{stderr}");
    assert!(!data.path().join("envs").join(&env).join("record.json").exists());

    // Made again, then removed by `env rm` with no record to go by.
    orphan_volume(&docker, &volume, &env).await;
    let rm = run(agentbox()
        .env("AGENTBOX_DATA_DIR", data.path())
        .args(["env", "rm", &env]));
    let gone = docker.inspect_volume(&volume).await.is_err();
    if !gone {
        let _ = docker
            .remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>)
            .await;
    }
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    assert!(gone, "env rm left the volume");
}

/// `run --env` against the scripted model server, without blocking the runtime it lives on.
async fn run_env_with_server(
    data: &std::path::Path,
    env: &str,
    server: &crate::support::model_server::ModelServer,
    project: &std::path::Path,
    task: &str,
) -> std::process::Output {
    with_server(data, &["run", "--json"], env, server, project, &[task], "").await
}

/// `COMMAND --env ENV --base-url SERVER PROJECT ARGS...` with `input` on stdin.
async fn with_server(
    data: &std::path::Path,
    command: &[&str],
    env: &str,
    server: &crate::support::model_server::ModelServer,
    project: &std::path::Path,
    args: &[&str],
    input: &str,
) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("AGENTBOX_PROVIDER")
        .env_remove("AGENTBOX_MODEL")
        .env("AGENTBOX_CONFIG", "")
        .env("ANTHROPIC_API_KEY", "sk-test-env-resume")
        .env("AGENTBOX_DATA_DIR", data)
        .args(command)
        .args(["--env", env, "--base-url", &server.anthropic_url()])
        .arg(project)
        .args(args)
        .current_dir(data)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn agentbox");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    child.wait_with_output().await.expect("agentbox")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_goes_on_with_a_runs_environment_and_conversation() {
    use crate::support::model_server::{ModelServer, Reply, anthropic_turn};
    let project = Project::new(&[("app.py", "def answer():\n    return 41\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-chat-{}", uuid::Uuid::new_v4().simple());
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn(
            "",
            &[(
                "edit_file",
                serde_json::json!({"path": "app.py", "old": "return 41", "new": "return 42"}),
            )],
        )),
        Reply::ok(anthropic_turn("first turn over: it returns 42", &[])),
        Reply::ok(anthropic_turn(
            "",
            &[(
                "bash",
                serde_json::json!({"command": "grep -q 'return 42' app.py && echo seen > chat.txt"}),
            )],
        )),
        Reply::ok(anthropic_turn("the chat saw it", &[])),
    ])
    .await;
    let out = run_env_with_server(data.path(), &env, &server, project.path(), "make it 42").await;
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));

    let out = with_server(
        data.path(),
        &["chat"],
        &env,
        &server,
        project.path(),
        &[],
        "now look\n",
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        text(&out.stdout).contains("agent> the chat saw it"),
        "{}\n{stderr}",
        text(&out.stdout)
    );
    assert!(
        stderr.contains(&format!("changed in environment {env}")),
        "{stderr}"
    );
    // The chat's first request carried the run's conversation.
    let requests = server.requests();
    let sent = requests[2].body["messages"].to_string();
    for said in ["make it 42", "first turn over", "now look"] {
        assert!(sent.contains(said), "{said} not in {sent}");
    }
    assert!(!project.file("chat.txt").exists(), "the checkout is not written");

    let show = text(&env_cmd(data.path(), &["show", &env]).stdout);
    assert!(show.contains("turn 2") && show.contains("now look"), "{show}");
    assert!(
        show.contains("verdict: answered") && show.contains("chat.txt"),
        "{show}"
    );
    let kept =
        std::fs::read_to_string(data.path().join("envs").join(&env).join("conversation.json")).unwrap();
    assert!(kept.contains("the chat saw it"), "{kept}");
    let rm = env_cmd(data.path(), &["rm", &env]);
    assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_continues_the_conversation() {
    use crate::support::model_server::{ModelServer, Reply, anthropic_turn};
    let docker = docker().await;
    let project = Project::new(&[("app.py", "def answer():\n    return 41\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-conv-{}", uuid::Uuid::new_v4().simple());
    let server = ModelServer::start(vec![
        Reply::ok(anthropic_turn(
            "",
            &[(
                "edit_file",
                serde_json::json!({"path": "app.py", "old": "return 41", "new": "return 42"}),
            )],
        )),
        Reply::ok(anthropic_turn("first turn over: it returns 42", &[])),
        Reply::ok(anthropic_turn("second turn over", &[])),
        // The third turn's model fails: the turn is still kept.
        Reply::status(
            400,
            serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}),
        ),
    ])
    .await;
    let out = run_env_with_server(data.path(), &env, &server, project.path(), "make it 42").await;
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let conversation = data.path().join("envs").join(&env).join("conversation.json");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&conversation)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let out = run_env_with_server(data.path(), &env, &server, project.path(), "now explain").await;
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{}", text(&out.stderr));
    let second = requests[2].body["messages"].to_string();
    for said in [
        "make it 42",
        "return 42",
        "first turn over: it returns 42",
        "now explain",
    ] {
        assert!(second.contains(said), "{said} not in {second}");
    }
    assert!(second.find("make it 42") < second.find("now explain"), "{second}");

    let out = run_env_with_server(data.path(), &env, &server, project.path(), "third try").await;
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let kept = std::fs::read_to_string(&conversation).unwrap();
    assert!(
        kept.contains("second turn over") && kept.contains("third try"),
        "{kept}"
    );
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data.path().join("envs").join(&env).join("record.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["turns"].as_array().map(Vec::len), Some(3), "{record}");

    docker
        .remove_volume(
            &format!("agentbox-env-{env}"),
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await
        .unwrap();
}

#[test]
fn a_resumed_run_keeps_its_flags_and_widens_them_only_when_asked() {
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-flags-{}", uuid::Uuid::new_v4().simple());
    let done = script(
        data.path(),
        "done.json",
        serde_json::json!({"turns": [{"text": "done"}]}),
    );
    let run_with = |flags: &[&str]| {
        let mut cmd = agentbox();
        cmd.env("AGENTBOX_DATA_DIR", data.path())
            .args(["run", "--json", "--env", &env, "--script", &done])
            .args(flags)
            .arg(project.path())
            .arg("look")
            .current_dir(data.path())
            .stdin(std::process::Stdio::null());
        run(&mut cmd)
    };
    let out = run_with(&["--allow-host", "pypi.example"]);
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data.path().join("envs").join(&env).join("record.json")).unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    let kept = record["allow_hosts"].to_string();
    assert!(kept.contains("pypi.example"), "{record}");

    // Not given again: the kept ones, said; nothing widened.
    let out = run_with(&[]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("resumes with the flags it was made with: --allow-host pypi.example"),
        "{stderr}"
    );
    assert!(!stderr.contains("WARNING: environment"), "{stderr}");

    // Wider ones given: they are used, said once, loudly.
    let out = run_with(&["--allow-host", "other.example"]);
    let stderr = text(&out.stderr);
    assert_eq!(stderr.matches("WARNING: environment").count(), 1, "{stderr}");
    assert!(
        stderr.contains("was made without --allow-host other.example"),
        "{stderr}"
    );
    // The environment keeps what it was made with.
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data.path().join("envs").join(&env).join("record.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["allow_hosts"].to_string(), kept);
    let mut rm = agentbox();
    rm.env("AGENTBOX_DATA_DIR", data.path()).args(["env", "rm", &env]);
    assert_eq!(run(&mut rm).status.code(), Some(0));
}

#[test]
fn a_second_run_of_an_environment_is_refused_while_its_lock_is_held() {
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-lock-{}", uuid::Uuid::new_v4().simple());
    let done = script(
        data.path(),
        "done.json",
        serde_json::json!({"turns": [{"text": "done"}]}),
    );
    let run_once = || {
        let mut cmd = agentbox();
        cmd.env("AGENTBOX_DATA_DIR", data.path())
            .args(["run", "--json", "--env", &env, "--script", &done])
            .arg(project.path())
            .arg("look")
            .current_dir(data.path())
            .stdin(std::process::Stdio::null());
        run(&mut cmd)
    };
    // Held the way a running `run --env` holds it: flock on the lock file.
    let dir = data.path().join("envs").join(&env);
    std::fs::create_dir_all(&dir).unwrap();
    let held = std::fs::File::create(dir.join("lock")).unwrap();
    held.try_lock().unwrap();
    let out = run_once();
    assert_ne!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("is in use"), "{stderr}");
    assert!(
        !dir.join("record.json").exists(),
        "refused before anything is made"
    );

    // Let go (as the kernel does for a killed process): the file left behind does not block.
    drop(held);
    let out = run_once();
    assert!(dir.join("record.json").exists(), "{}", text(&out.stderr));
    let mut rm = agentbox();
    rm.env("AGENTBOX_DATA_DIR", data.path()).args(["env", "rm", &env]);
    assert_eq!(run(&mut rm).status.code(), Some(0));
}

/// `agentbox env ARGS...` with the test's data directory.
fn env_cmd(data: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = agentbox();
    cmd.env("AGENTBOX_DATA_DIR", data).arg("env").args(args);
    run(&mut cmd)
}

/// A script whose one turn writes the line `line` to `file` (then says it is done).
fn writes(dir: &std::path::Path, file: &str, line: &str) -> String {
    script(
        dir,
        &format!("writes-{file}-{}.json", line.len()),
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": format!("echo '{line}' > {file}")}}]},
            {"text": "done"}
        ]}),
    )
}

#[test]
fn two_environments_at_once_then_merge_both_and_refuse_a_conflicting_third() {
    let project = Project::new(&[("a.txt", "a\n"), ("b.txt", "b\n")]);
    let data = tempfile::tempdir().unwrap();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let [one, two, three] = ["one", "two", "three"].map(|n| format!("it-merge-{n}-{id}"));
    let (to_a, to_b, also_a) = (
        writes(data.path(), "a.txt", "from one"),
        writes(data.path(), "b.txt", "from two"),
        writes(data.path(), "a.txt", "from three, which differs"),
    );

    // Two at once, each in its own copy.
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| run_env(data.path(), &one, &to_a, project.path(), "change a"));
        let second = s.spawn(|| run_env(data.path(), &two, &to_b, project.path(), "change b"));
        (first.join().unwrap(), second.join().unwrap())
    });
    for out in [&first, &second] {
        assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    }
    let third = run_env(data.path(), &three, &also_a, project.path(), "change a too");
    assert!(third.status.code().is_some(), "{}", text(&third.stderr));
    let read = |f: &str| std::fs::read_to_string(project.file(f)).unwrap();
    assert_eq!((read("a.txt"), read("b.txt")), ("a\n".into(), "b\n".into()));

    // The diff is what a merge would bring, and the checkout is still untouched.
    let diff = env_cmd(data.path(), &["diff", &one]);
    assert_eq!(diff.status.code(), Some(0), "{}", text(&diff.stderr));
    let patch = text(&diff.stdout);
    assert!(patch.contains("-a\n+from one\n"), "{patch}");
    assert!(!patch.contains("b.txt"), "{patch}");
    assert_eq!(read("a.txt"), "a\n");

    let merged = env_cmd(data.path(), &["merge", &one]);
    assert_eq!(merged.status.code(), Some(0), "{}", text(&merged.stderr));
    let merged = env_cmd(data.path(), &["merge", &two]);
    assert_eq!(merged.status.code(), Some(0), "{}", text(&merged.stderr));
    assert_eq!(
        (read("a.txt"), read("b.txt")),
        ("from one\n".into(), "from two\n".into())
    );

    // The third changed a.txt from what it was; the project has another a.txt now.
    let refused = env_cmd(data.path(), &["merge", &three]);
    assert_ne!(refused.status.code(), Some(0));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("nothing merged") && stderr.contains("a.txt"),
        "{stderr}"
    );
    assert_eq!(read("a.txt"), "from one\n");

    // Merged once: nothing more to bring.
    let again = env_cmd(data.path(), &["merge", &one]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).contains("nothing to merge"),
        "{}",
        text(&again.stdout)
    );

    for env in [&one, &two, &three] {
        let rm = env_cmd(data.path(), &["rm", env]);
        assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
    }
}

/// `run --env` whose turn is stopped by `signal` mid-command; then the environment resumes.
async fn a_named_run_stopped_by(signal: i32) {
    let docker = docker().await;
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-killed-{signal}-{}", uuid::Uuid::new_v4().simple());
    let long = script(
        data.path(),
        "long.json",
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo one > first.txt; sleep 300"}}]},
            {"text": "done"}
        ]}),
    );
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_CONFIG", "")
        .env("AGENTBOX_DATA_DIR", data.path())
        .args(["run", "--env", &env, "--script", &long])
        .arg(project.path())
        .arg("take long")
        .current_dir(data.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let volume = format!("agentbox-env-{env}");
    // The command is running once first.txt is in the volume: look through a sandbox of the
    // test's own would need the lock; the record and a running container say enough.
    let up = eventually(Duration::from_secs(120), || async {
        containers_of_pid(&docker, pid).await >= 1
            && data.path().join("envs").join(&env).join("record.json").exists()
    })
    .await;
    assert!(up, "the named run never started");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(pid as i32, signal) };
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("agentbox did not exit after the signal")
        .unwrap();
    assert!(out.status.code() != Some(0), "{}", text(&out.stderr));
    if signal != libc::SIGKILL {
        // An interrupted run removes its own container: no `gc` needed.
        let gone = eventually(Duration::from_secs(30), || async {
            containers_of_pid(&docker, pid).await == 0
        })
        .await;
        assert!(gone, "a container of the interrupted run is left");
    }
    // What the killed process could not remove, `gc` does; the environment's volume stays.
    assert_eq!(run(agentbox().arg("gc")).status.code(), Some(0));
    let gone = eventually(Duration::from_secs(30), || async {
        containers_of_pid(&docker, pid).await == 0
    })
    .await;
    assert!(gone, "a container of the stopped run is left");
    docker
        .inspect_volume(&volume)
        .await
        .expect("the environment's volume is kept");

    // Resumed: the stopped turn's file is there.
    let check = script(
        data.path(),
        "check.json",
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "test -f first.txt && echo two > second.txt"}}]},
            {"text": "done"}
        ]}),
    );
    let out = run_env(data.path(), &env, &check, project.path(), "look");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let changed = report["changed_files"].to_string();
    assert!(changed.contains("second.txt"), "{changed}\n{}", text(&out.stderr));

    let rm = env_cmd(data.path(), &["rm", &env]);
    assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
    assert!(docker.inspect_volume(&volume).await.is_err());
    assert!(!data.path().join("envs").join(&env).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_run_killed_mid_turn_resumes_and_leaves_no_container() {
    a_named_run_stopped_by(libc::SIGKILL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_run_interrupted_mid_turn_resumes_and_leaves_no_container() {
    a_named_run_stopped_by(libc::SIGINT).await;
}

#[test]
fn exec_works_in_an_environment_and_logs_each_command_as_a_turn() {
    let project = Project::new(&[("app.py", "x = 1\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-exec-{}", uuid::Uuid::new_v4().simple());
    let exec = |cmd: &[&str]| {
        let mut c = agentbox();
        c.env("AGENTBOX_DATA_DIR", data.path())
            .args(["exec", "--env", &env])
            .arg(project.path())
            .arg("--")
            .args(cmd)
            .stdin(std::process::Stdio::null());
        run(&mut c)
    };
    // Made with an image the project would not get by itself; resumed with it.
    let mut made = agentbox();
    made.env("AGENTBOX_DATA_DIR", data.path())
        .args(["exec", "--image", "agentbox/node:1", "--env", &env])
        .arg(project.path())
        .args(["--", "sh", "-c", "echo kept > notes.txt"])
        .stdin(std::process::Stdio::null());
    let first = run(&mut made);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(
        text(&first.stderr).contains(&format!("1 file changed in environment {env}")),
        "{}",
        text(&first.stderr)
    );
    assert!(!project.file("notes.txt").exists(), "the checkout is not written");

    let second = exec(&["sh", "-c", "cat notes.txt; command -v node"]);
    assert_eq!(
        text(&second.stdout),
        "kept\n/usr/bin/node\n",
        "{}",
        text(&second.stderr)
    );
    let failed = exec(&["sh", "-c", "exit 3"]);
    assert_eq!(failed.status.code(), Some(3));

    let show = text(&env_cmd(data.path(), &["show", &env]).stdout);
    assert!(show.contains("exec: sh -c echo kept > notes.txt"), "{show}");
    assert!(
        show.contains("exec: sh -c cat notes.txt; command -v node"),
        "{show}"
    );
    assert!(show.contains("verdict: exit 3"), "{show}");
    let diff = text(&env_cmd(data.path(), &["diff", &env]).stdout);
    assert!(
        diff.contains("+++ b/notes.txt") && diff.contains("+kept"),
        "{diff}"
    );

    let rm = env_cmd(data.path(), &["rm", &env]);
    assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_reads_the_environments_manifests_once_its_turns_changed_them() {
    let docker = docker().await;
    let project = Project::new(&[("app.py", "x = 1\n"), ("requirements.txt", "as-checked-out\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-view-{}", uuid::Uuid::new_v4().simple());
    let run_with_setup = |turns: serde_json::Value, file: &str| {
        let script = script(data.path(), file, serde_json::json!({ "turns": turns }));
        let mut cmd = agentbox();
        cmd.env("AGENTBOX_DATA_DIR", data.path())
            .args(["run", "--json", "--env", &env, "--script", &script])
            .args(["--setup", "cp requirements.txt /opt/agentbox-deps/seen"])
            .arg(project.path())
            .arg("go")
            .current_dir(data.path())
            .stdin(std::process::Stdio::null());
        run(&mut cmd)
    };
    let bash = |command: &str| {
        serde_json::json!([
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": "done"}
        ])
    };
    // Turn 1: setup saw the project's requirements; the agent changes them in its copy.
    let first = run_with_setup(
        bash("cat /opt/agentbox-deps/seen && echo as-the-env-has-it > requirements.txt"),
        "one.json",
    );
    let report: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap_or_default();
    assert!(
        report.to_string().contains("as-checked-out"),
        "{}",
        text(&first.stderr)
    );

    // Turn 2: setup read the environment's requirements, not the checkout's.
    let second = run_with_setup(bash("cat /opt/agentbox-deps/seen"), "two.json");
    let stderr = text(&second.stderr);
    assert!(
        stderr.contains("the environment changed what setup reads"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap_or_default();
    let said = report.to_string();
    assert!(said.contains("as-the-env-has-it\\n"), "{said}\n{stderr}");
    assert_eq!(project.read("requirements.txt"), "as-checked-out\n");

    // `env rm` takes the view's cache with it.
    let view = data.path().join("envs").join(&env).join("view");
    let of_view = |caches: Vec<(String, String)>| {
        caches
            .into_iter()
            .filter(|(_, of)| *of == view.display().to_string())
            .count()
    };
    assert!(of_view(agentbox::sandbox::caches::list(&docker).await.unwrap()) > 0);
    let rm = env_cmd(data.path(), &["rm", &env]);
    assert_eq!(rm.status.code(), Some(0), "{}", text(&rm.stderr));
    assert_eq!(
        of_view(agentbox::sandbox::caches::list(&docker).await.unwrap()),
        0
    );
    // The project's own cache stays the project's.
    let mut gc = agentbox();
    gc.args(["gc", "--caches", "--project"]).arg(project.path());
    assert!(run(&mut gc).status.success());
}
