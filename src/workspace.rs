//! Project files, read and written through the sandbox.
//!
//! The host never opens project files while the agent runs: every path is resolved by
//! `realpath` *inside* the container, so a link in an untrusted repository
//! (`secret -> /home/you/.ssh/id_rsa`) resolves against the container's filesystem, where it
//! points outside `/workspace` and is refused. Nothing else runs between our resolve and our
//! use of a path (the executor kills every process after each command), so there is no race.

use std::time::Duration;

use crate::project::skipped_dirs;
use crate::sandbox::fsop::{self, FsStatus};
use crate::sandbox::{Captured, ExecOutput, ExecRequest, NativeOp, Sandbox, SandboxError, WORKSPACE};

/// Resolve `$1` inside the container and refuse anything outside the workspace. Leaves the
/// absolute path in `$p` and the path relative to the workspace in `$rel` (`.` for the root).
const RESOLVE: &str = r#"set -u
cd /workspace || exit $E_CANNOT_RESOLVE
# The x keeps a trailing newline of the name from being eaten by $( ).
p=$(realpath -m -- "$1" 2>/dev/null && printf x) || exit $E_CANNOT_RESOLVE
p=${p%?x}
case "$p" in
  /workspace) rel=. ;;
  /workspace/*) rel=${p#/workspace/} ;;
  *) printf '%s' "$p" >&2; exit $E_OUTSIDE ;;
esac
"#;

// Sizes and modes come from `find -printf`, not `stat -c`: coreutils 9's stat (and ls) pass
// AT_NO_AUTOMOUNT to statx, which gVisor (runsc 2022-12, Debian's) refuses with EINVAL, so
// under `--runtime runsc` they fail on every path.
const READ: &str = r#"[ -e "$p" ] || exit $E_NOT_FOUND
[ -d "$p" ] && exit $E_IS_DIRECTORY
[ -f "$p" ] || exit $E_NOT_REGULAR
[ -r "$p" ] || exit $E_PERMISSION_DENIED
find "$p" -maxdepth 0 -printf '%s\n' >&2
exec head -c "$2" -- "$p"
"#;

/// Atomic: write a temporary file next to the target, then rename over it.
const WRITE: &str = r#"case "$p" in /workspace/.git|/workspace/.git/*) echo "the project's .git is read-only in the sandbox" >&2; exit $E_FAILED ;; esac
d=${p%/*}
if [ "$2" = create ]; then
  if [ -e "$p" ] || [ -L "$p" ]; then exit $E_EXISTS; fi
  mkdir -p -- "$d" || exit $E_FAILED
  mode=$(printf '%o' $(( 0666 & ~0$(umask) )))
else
  [ -e "$p" ] || exit $E_NOT_FOUND
  [ -d "$p" ] && exit $E_IS_DIRECTORY
  [ -f "$p" ] || exit $E_NOT_REGULAR
  [ -w "$p" ] || exit $E_PERMISSION_DENIED
  mode=$(find "$p" -maxdepth 0 -printf '%m') || exit $E_FAILED
fi
t=$(mktemp -- "$d/.agentbox-XXXXXXXX") || exit $E_FAILED
if ! cat > "$t"; then rm -f -- "$t"; exit $E_FAILED; fi
chmod "$mode" -- "$t" || { rm -f -- "$t"; exit $E_FAILED; }
mv -f -- "$t" "$p" || { rm -f -- "$t"; exit $E_FAILED; }
"#;

/// rg (respects .gitignore) when present, else find. Total count on stderr as `total=N`.
const LIST: &str = r#"[ -e "$p" ] || exit $E_NOT_FOUND
[ -d "$p" ] || { printf '%s\n' "$rel"; echo "total=1" >&2; exit 0; }
if command -v rg >/dev/null 2>&1; then
  set -- "$2" "$rel"
  { if [ "$2" = . ]; then rg $RG_LIST $GLOBS
    else rg $RG_LIST $GLOBS -- "$2"; fi
  } | awk -v max="$1" 'NR <= max { print } END { print "total=" NR > "/dev/stderr" }'
else
  set -- "$2" "$rel"
  find "./$2" $PRUNE -type f -print | sed 's|^\./||; s|^\./||' | sort \
    | awk -v max="$1" 'NR <= max { print } END { print "total=" NR > "/dev/stderr" }'
fi
"#;

const SEARCH: &str = r#"[ -e "$p" ] || exit $E_NOT_FOUND
command -v rg >/dev/null 2>&1 || { echo "ripgrep (rg) is not installed in the sandbox image" >&2; exit $E_NO_RIPGREP; }
max=$3
if [ "$rel" = . ]; then set -- "$2"; else set -- "$2" -- "$rel"; fi
{ rg $RG_SEARCH $GLOBS -e "$@"; echo "rg=$?" >&2; } \
  | awk -v max="$max" 'NR <= max { print } END { print "total=" NR > "/dev/stderr" }'
"#;

/// ripgrep's flags for the list and search scripts, and for the executor, which spawns ripgrep
/// itself (`executor.py`, `rg_native`). None needs quoting.
const RG_LIST: &[&str] = &[
    "--files",
    "--hidden",
    "--no-require-git",
    "--sort",
    "path",
    "--no-messages",
];
const RG_SEARCH: &[&str] = &[
    "--line-number",
    "--no-heading",
    "--with-filename",
    "--color",
    "never",
    "--hidden",
    "--no-require-git",
    "--max-columns",
    "300",
    "--max-columns-preview",
    "--max-filesize",
    "5M",
    "--sort",
    "path",
];

/// The executor's `list` or `search`: the path, the line limit, then ripgrep's whole command
/// line (the path to search is appended in the container, once resolved).
fn rg_native(op: &'static str, path: &str, max: usize, flags: &[&str], extra: &[&str]) -> NativeOp {
    let mut args = vec![path.to_string(), max.to_string(), "rg".to_string()];
    args.extend(flags.iter().map(|f| f.to_string()));
    args.extend(skipped_dirs().flat_map(|d| ["-g".to_string(), format!("!{d}")]));
    args.extend(extra.iter().map(|a| a.to_string()));
    NativeOp { op, args }
}

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error(
        "{path}: outside the project (it resolves to {resolved}); paths are relative to the \
         project root and must stay inside it"
    )]
    Outside { path: String, resolved: String },
    #[error("{0}: no such file or directory (list_files shows what exists)")]
    NotFound(String),
    #[error("{0}: is a directory")]
    IsDirectory(String),
    #[error("{0}: not a regular file")]
    NotRegular(String),
    #[error("{0}: permission denied")]
    PermissionDenied(String),
    #[error("{0}: already exists")]
    Exists(String),
    #[error("{path}: {message}")]
    Failed { path: String, message: String },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// A file's bytes as read, up to a limit.
#[derive(Debug, Clone)]
pub struct FileBytes {
    pub data: Vec<u8>,
    /// The file's full size; more than `data.len()` when the read was capped.
    pub size: u64,
}

impl FileBytes {
    pub fn complete(&self) -> bool {
        self.data.len() as u64 >= self.size
    }
}

#[derive(Debug, Clone)]
pub struct Listing {
    pub lines: Vec<String>,
    /// How many there were before the cap.
    pub total: u64,
}

/// Checks on the host before anything goes to the container.
pub fn check_path(path: &str) -> Result<(), FsError> {
    let bad = |reason| {
        Err(FsError::InvalidPath {
            path: path.escape_debug().to_string(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("empty");
    }
    if path.contains('\0') {
        return bad("contains a NUL byte");
    }
    if path.len() > 4096 {
        return bad("longer than 4096 bytes");
    }
    if path.starts_with('-') {
        // Not dangerous (every command gets `--`), but certainly a mistake.
        return bad("starts with '-'");
    }
    Ok(())
}

/// File operations on the project, each one a command in the sandbox.
pub struct Workspace<'a> {
    sandbox: &'a dyn Sandbox,
    timeout: Duration,
}

/// The executor's in-process `read` or `write`: the script's own arguments.
fn native_op(op: &'static str, path: &str, args: &[&str]) -> NativeOp {
    NativeOp {
        op,
        args: std::iter::once(path)
            .chain(args.iter().copied())
            .map(str::to_string)
            .collect(),
    }
}

fn globs() -> String {
    skipped_dirs()
        .map(|d| format!("-g '!{d}'"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn prune() -> String {
    let names: Vec<String> = skipped_dirs().map(|d| format!("-name '{d}'")).collect();
    format!("-type d \\( {} \\) -prune -o", names.join(" -o "))
}

impl<'a> Workspace<'a> {
    pub fn new(sandbox: &'a dyn Sandbox) -> Self {
        Workspace {
            sandbox,
            timeout: Duration::from_secs(60),
        }
    }

    /// Run one of the scripts above on `path`. With `native`, the executor may do the same thing
    /// in-process (no spawn); the script is the definition, and the fallback.
    async fn script(
        &self,
        body: &str,
        native: Option<NativeOp>,
        path: &str,
        args: &[&str],
        stdin: Option<Vec<u8>>,
        head: usize,
    ) -> Result<ExecOutput, FsError> {
        check_path(path)?;
        let script = format!("{}{RESOLVE}{body}", fsop::shell_preamble())
            .replace("$GLOBS", &globs())
            .replace("$RG_LIST", &RG_LIST.join(" "))
            .replace("$RG_SEARCH", &RG_SEARCH.join(" "))
            .replace("$PRUNE", &prune());
        let mut argv = vec![
            "/bin/sh".to_string(),
            "-c".into(),
            script,
            "agentbox".into(),
            path.into(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        let mut req = ExecRequest::argv(argv, self.timeout).capture(head, 0);
        req.workdir = Some(WORKSPACE.into());
        req.native = native;
        if let Some(data) = stdin {
            req = req.stdin(data);
        }
        let out = self.sandbox.exec(req).await?;
        let stderr = out.stderr.to_text();
        let p = path.to_string();
        if out.timed_out {
            return Err(FsError::Failed {
                path: p,
                message: "the file operation timed out".into(),
            });
        }
        match FsStatus::from_code(out.exit_code) {
            Some(FsStatus::CannotResolve) => Err(FsError::InvalidPath {
                path: p,
                reason: "cannot be resolved",
            }),
            Some(FsStatus::Outside) => Err(FsError::Outside {
                path: p,
                resolved: stderr.trim().to_string(),
            }),
            Some(FsStatus::NotFound) => Err(FsError::NotFound(p)),
            Some(FsStatus::IsDirectory) => Err(FsError::IsDirectory(p)),
            Some(FsStatus::NotRegular) => Err(FsError::NotRegular(p)),
            Some(FsStatus::PermissionDenied) => Err(FsError::PermissionDenied(p)),
            Some(FsStatus::Exists) => Err(FsError::Exists(p)),
            Some(FsStatus::Failed) => Err(FsError::Failed {
                path: p,
                message: last_line(&stderr, "write failed"),
            }),
            // The search says itself what it is missing.
            Some(FsStatus::NoRipgrep) | None => Ok(out),
        }
    }

    /// Up to `limit` bytes of a regular file.
    pub async fn read(&self, path: &str, limit: usize) -> Result<FileBytes, FsError> {
        let out = self
            .script(
                READ,
                Some(native_op("read", path, &[&limit.to_string()])),
                path,
                &[&limit.to_string()],
                None,
                limit,
            )
            .await?;
        if out.exit_code != 0 {
            return Err(FsError::Failed {
                path: path.into(),
                message: last_line(&out.stderr.to_text(), "read failed"),
            });
        }
        let size = out
            .stderr
            .to_text()
            .trim()
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0);
        Ok(FileBytes {
            data: out.stdout.head,
            size,
        })
    }

    /// Replace an existing file's content, atomically, keeping its mode.
    pub async fn replace(&self, path: &str, data: Vec<u8>) -> Result<(), FsError> {
        self.write(path, data, "replace").await
    }

    /// Create a file that must not exist yet (and its parent directories).
    pub async fn create(&self, path: &str, data: Vec<u8>) -> Result<(), FsError> {
        self.write(path, data, "create").await
    }

    async fn write(&self, path: &str, data: Vec<u8>, mode: &str) -> Result<(), FsError> {
        let out = self
            .script(
                WRITE,
                Some(native_op("write", path, &[mode])),
                path,
                &[mode],
                Some(data),
                4096,
            )
            .await?;
        if out.exit_code != 0 {
            return Err(FsError::Failed {
                path: path.into(),
                message: last_line(&out.stderr.to_text(), &out.status_line()),
            });
        }
        Ok(())
    }

    /// Files under `path`, relative to the project root, sorted, at most `max`.
    pub async fn list(&self, path: &str, max: usize) -> Result<Listing, FsError> {
        let out = self
            .script(
                LIST,
                Some(rg_native("list", path, max, RG_LIST, &[])),
                path,
                &[&max.to_string()],
                None,
                4 << 20,
            )
            .await?;
        let total = find_value(&out.stderr, "total=").unwrap_or(0);
        Ok(Listing {
            lines: lines(&out.stdout),
            total,
        })
    }

    /// ripgrep for `pattern` under `path`: `file:line:text` lines, at most `max`.
    pub async fn search(&self, pattern: &str, path: &str, max: usize) -> Result<Listing, FsError> {
        let out = self
            .script(
                SEARCH,
                Some(rg_native("search", path, max, RG_SEARCH, &["-e", pattern])),
                path,
                &[pattern, &max.to_string()],
                None,
                4 << 20,
            )
            .await?;
        if FsStatus::from_code(out.exit_code) == Some(FsStatus::NoRipgrep) {
            return Err(FsError::Failed {
                path: path.into(),
                message: out.stderr.to_text().trim().to_string(),
            });
        }
        let rg = find_value(&out.stderr, "rg=").unwrap_or(2);
        if rg == 2 {
            let text = out.stderr.to_text();
            let message: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with("rg=") && !l.starts_with("total="))
                .collect();
            return Err(FsError::Failed {
                path: pattern.into(),
                message: message.join("\n"),
            });
        }
        let total = find_value(&out.stderr, "total=").unwrap_or(0);
        Ok(Listing {
            lines: lines(&out.stdout),
            total,
        })
    }
}

fn lines(c: &Captured) -> Vec<String> {
    String::from_utf8_lossy(&c.head)
        .lines()
        .map(str::to_string)
        .collect()
}

fn find_value(c: &Captured, key: &str) -> Option<u64> {
    c.to_text()
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
}

fn last_line(text: &str, default: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().trim_start_matches("mktemp: ").to_string())
        .unwrap_or_else(|| default.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_side_path_checks() {
        assert!(check_path("src/main.py").is_ok());
        assert!(
            check_path("../x").is_ok(),
            "escapes are decided in the container, after resolving"
        );
        assert!(matches!(check_path(""), Err(FsError::InvalidPath { .. })));
        assert!(matches!(
            check_path("a\0b"),
            Err(FsError::InvalidPath {
                reason: "contains a NUL byte",
                ..
            })
        ));
        assert!(matches!(check_path("-rf"), Err(FsError::InvalidPath { .. })));
        assert!(check_path(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn outside_error_tells_the_model_what_to_do() {
        let e = FsError::Outside {
            path: "../x".into(),
            resolved: "/x".into(),
        };
        assert_eq!(
            e.to_string(),
            "../x: outside the project (it resolves to /x); paths are relative to the project root and must stay inside it"
        );
    }

    #[test]
    fn scripts_carry_their_skip_lists() {
        assert!(globs().contains("-g '!.git'") && globs().contains("-g '!node_modules'"));
        assert!(prune().starts_with("-type d \\( -name '.git' -o"));
    }
}
