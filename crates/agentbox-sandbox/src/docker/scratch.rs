//! The session's scratch (`/tmp`, HOME, the cache directory, `/dev/shm`): the build cache
//! copied in at the start, and everything emptied before the verdict.

use super::*;

/// The sandbox's scratch directories: what a command may leave behind outside the project.
pub(crate) const SCRATCH: &[&str] = &["/tmp", crate::policy::HOME, crate::policy::CACHE_DIR, "/dev/shm"];

impl DockerSandbox {
    /// Copy setup's build cache (see `Extras::seed`) into `CACHE_DIR`, replacing what is there
    /// of the same name. A copy that fails is removed whole: a half-copied artifact with its
    /// fingerprint would be taken for a good one.
    pub(crate) async fn seed_caches(&self) -> Result<(), SandboxError> {
        let Some(seed) = &self.seed else {
            return Ok(());
        };
        let script = format!(
            "for d in \"$1\"/*; do [ -d \"$d\" ] || continue; t={cache}/${{d##*/}}; rm -rf \"$t\"; \
             cp -a \"$d\" \"$t\" || {{ rm -rf \"$t\"; exit 1; }}; done",
            cache = crate::policy::CACHE_DIR,
        );
        let out = self
            .exec(ExecRequest::argv(
                ["sh", "-c", script.as_str(), "sh", seed.as_str()],
                Duration::from_secs(600),
            ))
            .await?;
        if out.success() {
            Ok(())
        } else {
            Err(SandboxError::Other(format!(
                "copying the build cache: {}: {}",
                out.status_line(),
                out.stderr.to_text().trim()
            )))
        }
    }

    /// Empty the scratch directories (`/tmp`, `HOME`, `CACHE_DIR`, `/dev/shm`) and copy the
    /// build cache in again: the state a session starts from, with only the project as the
    /// commands left it. For agentbox's own test run, once nothing runs any more: what the agent
    /// phase left there (a planted test binary with a fresh fingerprint, a Go test result, a
    /// `usercustomize.py`, a tool's configuration in `HOME`) could otherwise decide the verdict.
    /// The services (`--service`) start again too, with no data.
    pub async fn fresh_scratch(&self) -> Result<(), SandboxError> {
        let dirs = SCRATCH.join(" ");
        // The sandbox user owns everything it wrote there; what it made unreadable is made
        // readable first so that `rm` can go through it.
        let script = format!(
            "for d in {dirs}; do chmod -R u+rwX \"$d\" 2>/dev/null; \
             find \"$d\" -mindepth 1 -maxdepth 1 -exec rm -rf {{}} + 2>/dev/null; done; \
             for d in {dirs}; do [ -z \"$(ls -A \"$d\")\" ] || {{ echo \"$d could not be emptied\" >&2; exit 1; }}; done"
        );
        let out = self
            .exec(ExecRequest::argv(["sh", "-c", &script], Duration::from_secs(300)))
            .await?;
        if !out.success() {
            return Err(SandboxError::Other(format!(
                "resetting the scratch directories: {}: {}",
                out.status_line(),
                out.stderr.to_text().trim()
            )));
        }
        self.seed_caches().await?;
        self.restart_services().await
    }
}
