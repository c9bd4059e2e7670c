//! `agentbox env rewind` (issue 34): after three turns, the environment's files go back to
//! what turn 1 left (a file edited, added, deleted, a directory the sandbox replaced by a link)
//! and then to what was created; the log and the checkpoints are cut; what is kept on the host
//! is private.

use crate::env_fork::{Envs, bash_script, changed, env_cmd, record, run_env};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_to_turn_one_after_three_turns_then_to_the_start() {
    use std::os::unix::fs::PermissionsExt;
    let project = Project::new(&[("app.py", "v = 0\n"), ("lib/keep.py", "k\n")]);
    let data = tempfile::tempdir().unwrap();
    let env = format!("it-rw-{}", uuid::Uuid::new_v4().simple());
    let _envs = Envs {
        data: data.path(),
        names: vec![env.clone()],
    };
    let turns = [
        "sed -i s/0/1/ app.py && echo one > one.txt",
        "sed -i s/1/2/ app.py && rm lib/keep.py && mkdir new && echo n > new/x.txt && rm one.txt",
        "sed -i s/2/3/ app.py && rm -rf lib && ln -s /etc lib && echo three > three.txt",
    ];
    for (i, command) in turns.iter().enumerate() {
        let s = bash_script(data.path(), &format!("{i}.json"), command);
        let out = run_env(data.path(), &env, &s, project.path(), &format!("turn {}", i + 1));
        assert!(changed(&out).contains("app.py"), "{}", changed(&out));
    }
    let dir = data.path().join("envs").join(&env);
    for t in 1..=3 {
        let cp = dir.join("checkpoints").join(format!("{t}.json"));
        assert_eq!(
            std::fs::metadata(&cp).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    assert_eq!(
        std::fs::metadata(dir.join("checkpoints"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );

    let too_far = env_cmd(data.path(), &["rewind", &env, "4"]);
    assert!(!too_far.status.success());
    assert!(
        text(&too_far.stderr).contains("no turn 4"),
        "{}",
        text(&too_far.stderr)
    );

    let rw = env_cmd(data.path(), &["rewind", &env, "1"]);
    assert!(rw.status.success(), "{}", text(&rw.stderr));
    let tasks = record(data.path(), &env)["turns"].as_array().unwrap().len();
    assert_eq!(tasks, 1);
    assert!(!dir.join("checkpoints").join("2.json").exists());
    assert!(!dir.join("checkpoints").join("3.json").exists());

    // The files are as turn 1 left them: the command succeeds only then.
    let check = bash_script(
        data.path(),
        "check1.json",
        "grep -qx 'v = 1' app.py && test \"$(cat one.txt)\" = one && test \"$(cat lib/keep.py)\" = k \
         && ! test -L lib && ! test -e new && ! test -e three.txt && echo ok > ok1.txt",
    );
    let out = run_env(data.path(), &env, &check, project.path(), "check turn 1");
    assert!(changed(&out).contains("ok1.txt"), "{}", changed(&out));

    // Back to the start: the checks' file and turn 1's changes gone.
    let rw = env_cmd(data.path(), &["rewind", &env, "0"]);
    assert!(rw.status.success(), "{}", text(&rw.stderr));
    assert_eq!(record(data.path(), &env)["turns"].as_array().unwrap().len(), 0);
    let check = bash_script(
        data.path(),
        "check0.json",
        "grep -qx 'v = 0' app.py && ! test -e one.txt && ! test -e ok1.txt && test -f lib/keep.py \
         && echo ok > ok0.txt",
    );
    let out = run_env(data.path(), &env, &check, project.path(), "check start");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let paths: Vec<&str> = report["changed_files"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["path"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(paths, ["ok0.txt"], "{}", changed(&out));
    assert_eq!(
        std::fs::read_to_string(project.file("app.py")).unwrap(),
        "v = 0\n"
    );
}
