//! One file per subcommand; each returns the process exit status.

pub mod chat;
pub mod demo;
pub mod doctor;
pub mod eval;
pub mod exec;
pub mod gc;
pub mod image;
pub mod mcp;
pub mod publish;
pub mod run;
pub mod shell;

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
