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
