//! Git metadata planted from the sandbox. The project's own `.git` is mounted read-only, but a
//! project without one (or a subdirectory) could get a new `.git` whose hooks or config
//! (`core.fsmonitor`, `core.hooksPath`) would run on the host the next time someone runs git
//! there. A `.git` that appeared during the session is renamed out of the way and reported.

use std::time::Duration;

use crate::sandbox::{ExecRequest, Sandbox};

const FIND: &str = r#"find /workspace -xdev \( -name node_modules -o -name .venv -o -name venv -o -name target \) -prune -o -name .git -print 2>/dev/null | sort"#;

const QUARANTINE: &str = r#"for p in "$@"; do
  q="$p-agentbox-quarantine"; n=1
  while [ -e "$q" ]; do q="$p-agentbox-quarantine-$n"; n=$((n+1)); done
  mv -- "$p" "$q" && printf '%s\n' "$q"
done"#;

/// Every `.git` (directory or file) in the project, as absolute paths in the sandbox.
pub async fn git_dirs(sandbox: &dyn Sandbox) -> Result<Vec<String>, String> {
    let req = ExecRequest::argv(["/bin/sh", "-c", FIND], Duration::from_secs(60)).capture(1 << 20, 0);
    let out = sandbox.exec(req).await.map_err(|e| e.to_string())?;
    Ok(out.stdout.to_text().lines().map(str::to_string).collect())
}

/// Rename each `.git` that was not there at the start; one warning per rename (or failure).
pub async fn quarantine_new(sandbox: &dyn Sandbox, before: &[String]) -> Vec<String> {
    let now = match git_dirs(sandbox).await {
        Ok(n) => n,
        Err(e) => return vec![format!("could not check for planted .git directories: {e}")],
    };
    let new: Vec<String> = now.into_iter().filter(|p| !before.contains(p)).collect();
    if new.is_empty() {
        return Vec::new();
    }
    let mut argv = vec!["/bin/sh".to_string(), "-c".into(), QUARANTINE.into(), "sh".into()];
    argv.extend(new.iter().cloned());
    let moved = match sandbox
        .exec(ExecRequest::argv(argv, Duration::from_secs(60)))
        .await
    {
        Ok(out) => out
            .stdout
            .to_text()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>(),
        Err(e) => return vec![format!("could not move planted .git directories away: {e}")],
    };
    let rel = |p: &str| p.strip_prefix("/workspace/").unwrap_or(p).to_string();
    new.iter()
        .map(|p| match moved.iter().find(|m| m.starts_with(&format!("{p}-agentbox-quarantine"))) {
            Some(m) => format!(
                "the session created {} — renamed to {} so that no git hook or config in it runs on your \
                 machine; inspect it, then delete it",
                rel(p),
                rel(m)
            ),
            None => format!("the session created {} and it could not be renamed: do not run git there before inspecting it", rel(p)),
        })
        .collect()
}
