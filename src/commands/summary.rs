//! The lines said when a session on a bind-mounted project ends (`shell`, `chat`): what changed
//! in the project by the host's own scan, the user's changes first and what tools wrote into
//! caches and build output counted apart, so one edited file is not lost under `.pytest_cache`.

use std::path::Path;

use crate::hostfs::hostscan::HostCheck;
use crate::output::{Escaped, escaped};

/// How many changed paths (and cache directories) are named before `...`.
const SHOWN: usize = 5;

/// One line, or two when tools wrote into caches beside the user's changes.
pub fn changes(project: &Path, read_only: bool, check: Option<&HostCheck>) -> Vec<Escaped> {
    let Some(check) = check else {
        return vec![crate::escaped!("sandbox removed")];
    };
    let (cached, own): (Vec<&Path>, Vec<&Path>) = check
        .changes
        .paths
        .iter()
        .map(|p| p.as_path())
        .partition(|p| crate::project::tool_written_dir(p).is_some());
    let more = if own.len() > SHOWN || check.changes.incomplete {
        ", ..."
    } else {
        ""
    };
    let shown: Vec<String> = own.iter().take(SHOWN).map(|p| p.display().to_string()).collect();
    let project = escaped(project.display());
    let caches = (!cached.is_empty()).then(|| {
        let mut dirs: Vec<&str> = Vec::new();
        for d in cached.iter().filter_map(|p| crate::project::tool_written_dir(p)) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        let etc = if dirs.len() > SHOWN { ", ..." } else { "" };
        dirs.truncate(SHOWN);
        crate::escaped!(
            "{} path{} in caches and build output ({}{})",
            cached.len(),
            plural(cached.len()),
            escaped(dirs.join(", ")),
            etc
        )
    });
    match (own.len(), caches) {
        (0, None) if read_only => vec![crate::escaped!(
            "sandbox removed; {} was mounted read-only",
            project
        )],
        (0, None) => vec![crate::escaped!("sandbox removed; nothing changed in {}", project)],
        (0, Some(caches)) => vec![crate::escaped!(
            "sandbox removed; nothing changed in {} but {}",
            project,
            caches
        )],
        (n, caches) => {
            let mut lines = vec![crate::escaped!(
                "sandbox removed; {} path{} changed in {}: {}{}",
                n,
                plural(n),
                project,
                escaped(shown.join(", ")),
                more
            )];
            lines.extend(caches.map(|c| crate::escaped!("and {}", c)));
            lines
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfs::hostscan::HostChanges;
    use std::path::PathBuf;

    fn check(paths: &[&str]) -> HostCheck {
        HostCheck {
            warnings: Vec::new(),
            changes: HostChanges {
                paths: paths.iter().map(PathBuf::from).collect(),
                incomplete: false,
            },
            unresolved: false,
        }
    }

    fn said(paths: &[&str]) -> Vec<String> {
        changes(Path::new("/p"), false, Some(&check(paths)))
            .iter()
            .map(|l| l.to_string())
            .collect()
    }

    #[test]
    fn the_users_change_comes_before_the_caches() {
        let lines = said(&[
            ".pytest_cache",
            ".pytest_cache/.gitignore",
            ".pytest_cache/CACHEDIR.TAG",
            ".pytest_cache/README.md",
            ".pytest_cache/v",
            ".pytest_cache/v/cache",
            ".pytest_cache/v/cache/nodeids",
            "__pycache__",
            "__pycache__/test_calc.cpython-311-pytest-8.3.5.pyc",
            "notes.txt",
        ]);
        assert_eq!(
            lines,
            [
                "sandbox removed; 1 path changed in /p: notes.txt",
                "and 9 paths in caches and build output (.pytest_cache, __pycache__)",
            ]
        );
    }

    #[test]
    fn caches_alone_are_counted_and_nested_ones_named() {
        assert_eq!(
            said(&["pkg/__pycache__", "pkg/__pycache__/m.pyc", "target/debug/x"]),
            [
                "sandbox removed; nothing changed in /p but 3 paths in caches and build output (__pycache__, target)"
            ]
        );
        assert_eq!(said(&[]), ["sandbox removed; nothing changed in /p"]);
        let six = said(&["a", "b", "c", "d", "e", "f"]);
        assert_eq!(
            six,
            ["sandbox removed; 6 paths changed in /p: a, b, c, d, e, ..."]
        );
    }
}
