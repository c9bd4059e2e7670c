//! One file per subcommand; each returns the process exit status.

pub mod chat;
pub mod demo;
pub mod doctor;
pub mod env;
pub(crate) mod env_turn;
pub mod eval;
pub mod exec;
pub mod gateway;
pub mod gc;
pub mod image;
pub mod mcp;
pub mod publish;
pub mod run;
pub mod shell;
pub mod summary;

/// The environment `run` gives the agent, for a face that opens its sandbox itself (`exec`,
/// `shell`, `mcp`): the setup phase (or its cache) with `setup` (the flags as given, or as an
/// `--env` environment was made with), quiet when there is nothing to install; with `copied`
/// (the project is only read, or copied in) setup works on a copy. `cfg` gains what the sandbox
/// mounts; the result lives as long as the sandbox. With `env`, setup reads that environment's
/// manifests where its turns changed them (`env_view`).
pub(crate) async fn prepare_environment(
    setup: &crate::config::SetupSettings,
    (copied, env): (bool, Option<&crate::envs::EnvName>),
    cfg: &mut crate::config::SandboxConfig,
    project: &std::path::Path,
    also: Vec<Box<dyn crate::events::EventSink>>,
) -> anyhow::Result<crate::session::setup_phase::Prepared> {
    // An environment's setup reads the environment's manifests.
    let copy = (copied || env.is_some()).then(|| crate::config::IsolateSettings {
        env: env.cloned(),
        ..Default::default()
    });
    let scope = crate::session::setup_phase::Scope {
        setup,
        isolate: copy.as_ref(),
        say_why_nothing: false,
    };
    Ok(crate::session::setup_phase::prepare(scope, cfg, project, also).await?)
}

/// A remote engine (see `sandbox::engine`) cannot bind-mount `project`: the command takes the
/// `--isolate` path instead. Says so on stderr, in one line; true when it does.
pub fn copy_for_remote_engine(project: &std::path::Path) -> bool {
    let engine = crate::sandbox::engine::current();
    if !engine.is_remote() {
        return false;
    }
    errln!(
        "agentbox: {} is a remote engine and cannot mount {}: the project is copied in instead (as with --isolate) and the changes come back as a patch",
        crate::events::for_terminal(&engine.describe()),
        crate::events::for_terminal(&project.display().to_string())
    );
    true
}
