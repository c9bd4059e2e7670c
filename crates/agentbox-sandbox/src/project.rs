//! The host-side checks of a project before it is mounted: it is a directory the sandbox may
//! run as the owner of, and nothing in it leads outside (hard links) or cannot be protected.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use agentbox_hostfs::hostscan::{self, Baseline, ScanBounds};

use crate::SandboxError;
use crate::policy::WorkspaceSource;

/// A project directory, checked: it exists, is a directory, is not `/`, and its `.git` (if
/// any) is not a symlink. `uid`/`gid` own it: the sandbox runs as them.
pub struct ProjectDir {
    pub path: std::path::PathBuf,
    pub uid: u32,
    pub gid: u32,
}

pub fn inspect_project(project: &Path) -> Result<ProjectDir, SandboxError> {
    let shown = project.display().to_string();
    let meta = match std::fs::metadata(project) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SandboxError::ProjectMissing(shown));
        }
        Err(e) => {
            return Err(SandboxError::Other(format!(
                "cannot read project path {shown}: {e}"
            )));
        }
    };
    if !meta.is_dir() {
        return Err(SandboxError::ProjectNotDirectory(shown));
    }
    let path = project
        .canonicalize()
        .map_err(|e| SandboxError::Other(format!("cannot resolve {shown}: {e}")))?;
    if path == Path::new("/") {
        return Err(SandboxError::Other("refusing to mount / as the project".into()));
    }
    let git_path = path.join(".git");
    // A link would make Docker mount whatever it points at on the host, read-only but
    // visible; and left unmounted it could be replaced from inside. Neither is safe.
    if std::fs::symlink_metadata(&git_path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(SandboxError::Other(format!(
            "refusing to run: {} is a symbolic link, which agentbox cannot protect; \
             replace it with the directory it points to",
            git_path.display()
        )));
    }
    Ok(ProjectDir {
        path,
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

/// Resolve a project directory into a bind mount, refusing what cannot be protected: files
/// hard-linked to files outside the project (a package manager's cache, say), which the sandbox
/// could change through the link. Git metadata is mounted read-only wherever it is.
pub fn bind_workspace(
    project: &Path,
    bounds: &ScanBounds,
) -> Result<(WorkspaceSource, u32, u32), SandboxError> {
    let dir = inspect_project(project)?;
    let scan = hostscan::scan(&dir.path, bounds);
    if let Some(why) = &scan.stopped {
        // What the scan did not reach is unknown: hard links to files outside (which the
        // sandbox could write through) and git metadata (which must be mounted read-only).
        // Mounting it anyway would promise what agentbox did not check.
        return Err(SandboxError::Other(format!(
            "refusing to mount {}: agentbox's scan of it for hard links to files outside and for git \
             metadata was incomplete ({why}), so it cannot be protected. Remove what a session left \
             there (millions of hard links, say), raise --host-scan-limit / --host-scan-timeout, or use \
             --isolate",
            dir.path.display()
        )));
    }
    if !scan.linked_outside.is_empty() {
        let examples: Vec<String> = scan
            .linked_outside
            .iter()
            .take(3)
            .map(|p| p.display().to_string())
            .collect();
        return Err(SandboxError::Other(format!(
            "refusing to mount {}: {} file(s) are hard links to files outside it (e.g. {}); the sandbox \
             could change those outside files through them. Use --isolate (the copy breaks the links), or \
             replace the links with copies (uv: --link-mode=copy; pnpm: package-import-method=copy)",
            dir.path.display(),
            scan.linked_outside.len(),
            examples.join(", ")
        )));
    }
    tracing::debug!(step = "host scan before", "host scan before the run done");
    let protection = hostscan::protection(&dir.path, &scan);
    let (linked_git, warnings) = match hostscan::git::linked_git(&dir.path, dir.uid) {
        None => (None, Vec::new()),
        Some(Ok(linked)) => (Some(linked), Vec::new()),
        Some(Err(why)) => (None, vec![why.to_string()]),
    };
    Ok((
        WorkspaceSource::Bind {
            project: dir.path,
            linked_git,
            warnings,
            protected: protection.mounts.clone(),
            baseline: std::sync::Arc::new(Baseline {
                scan,
                protection,
                bounds: *bounds,
            }),
        },
        dir.uid,
        dir.gid,
    ))
}
