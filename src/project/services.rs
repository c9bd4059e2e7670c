//! Hints, never starts: a project whose CI workflow or compose file names a database gets one
//! line saying which `--service` its tests may need. Nothing starts on the repository's word.

use std::path::Path;

use crate::sandbox::services::{ServiceKind, ServiceSpec};

/// Where projects name the services their tests run beside.
const FILES: &[&str] = &[
    "docker-compose.yml",
    "docker-compose.yaml",
    "compose.yml",
    "compose.yaml",
    "docker-compose.test.yml",
    ".gitlab-ci.yml",
    ".circleci/config.yml",
];
const WORKFLOWS: &str = ".github/workflows";
/// A CI file bigger than this is not read for hints.
const MAX_BYTES: u64 = 256 * 1024;

/// One line per known server a CI or compose file of `project` names as an image, unless a
/// service of that kind is already `given`.
pub fn service_hints(project: &Path, given: &[ServiceSpec]) -> Vec<String> {
    let mut files: Vec<String> = FILES.iter().map(|f| f.to_string()).collect();
    let workflows = real_dirs(project, WORKFLOWS)
        .then(|| std::fs::read_dir(project.join(WORKFLOWS)).ok())
        .flatten();
    if let Some(entries) = workflows {
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
            .collect();
        names.sort();
        files.extend(names.into_iter().take(50).map(|n| format!("{WORKFLOWS}/{n}")));
    }
    let mut hints = Vec::new();
    let mut found: Vec<ServiceKind> = Vec::new();
    for file in files {
        let path = project.join(&file);
        // Never follow a link out of the project (the file's or a directory's on the way), nor
        // read a huge file.
        let parent = Path::new(&file).parent().and_then(|p| p.to_str()).unwrap_or("");
        if !parent.is_empty() && !real_dirs(project, parent) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > MAX_BYTES {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for kind in named_images(&text) {
            let covered = given
                .iter()
                .any(|g| g.kind == Some(kind) || g.port == Some(kind.port()));
            if found.contains(&kind) || covered {
                continue;
            }
            found.push(kind);
            hints.push(format!(
                "tests may need {} ({file} names it): --service {}",
                kind.name(),
                kind.name()
            ));
        }
    }
    hints
}

/// Whether every directory of the relative path `rel` under `project` is a directory, not a
/// link (which could lead anywhere on this machine).
fn real_dirs(project: &Path, rel: &str) -> bool {
    let mut at = project.to_path_buf();
    for part in rel.split('/') {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            _ => return false,
        }
    }
    true
}

/// The known servers `text` (YAML) names as images: `image: postgres:16`, a list item
/// `- redis`, `- name: mysql:8` (GitLab), with or without a registry path.
fn named_images(text: &str) -> Vec<ServiceKind> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let value = line
            .strip_prefix("image:")
            .or_else(|| line.strip_prefix("- name:"))
            .or_else(|| line.strip_prefix("- "))
            .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''));
        let Some(value) = value else { continue };
        if value.contains(char::is_whitespace) {
            continue;
        }
        // `docker.io/library/postgres:16-alpine` → `postgres`.
        let repo = value.split(['@', ':']).next().unwrap_or("");
        let last = repo.rsplit('/').next().unwrap_or("");
        let last = if repo.contains('/') && value.split('/').next().is_some_and(|h| h.contains(':')) {
            // A registry with a port: the name is after the last '/', its tag after ':'.
            value
                .rsplit('/')
                .next()
                .and_then(|n| n.split(':').next())
                .unwrap_or("")
        } else {
            last
        };
        if let Some(kind) = ServiceKind::by_name(last)
            && !out.contains(&kind)
        {
            out.push(kind);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_and_compose_files_give_one_hint_per_server_and_none_for_what_is_given() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(WORKFLOWS)).unwrap();
        std::fs::write(
            dir.path().join(WORKFLOWS).join("ci.yml"),
            "jobs:\n  test:\n    services:\n      db:\n        image: \"postgres:16\"\n      \
             cache:\n        image: docker.io/library/redis:7-alpine\n    steps:\n      - run: pytest\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("compose.yaml"),
            "services:\n  db:\n    image: postgres\n  other:\n    image: mongo:7\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".gitlab-ci.yml"), "services:\n  - mysql:8.0\n").unwrap();
        let hints = service_hints(dir.path(), &[]);
        assert_eq!(hints.len(), 3, "{hints:?}");
        assert!(hints[0].contains("postgres") && hints[0].contains("--service postgres"));
        assert!(hints.iter().any(|h| h.contains("--service redis")));
        assert!(
            hints
                .iter()
                .any(|h| h.contains("--service mariadb") && h.contains(".gitlab-ci.yml"))
        );
        let given = [ServiceSpec::known(ServiceKind::Postgres, "postgres")];
        let hints = service_hints(dir.path(), &given);
        assert!(hints.iter().all(|h| !h.contains("postgres")), "{hints:?}");
        // A step that only mentions a name is not an image.
        assert!(named_images("- run: pip install redis\n- name: Start postgres\n").is_empty());
        assert!(service_hints(tempfile::tempdir().unwrap().path(), &[]).is_empty());

        // A workflows directory that is a link is not followed (it could lead anywhere).
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("ci.yml"), "services:\n  - redis\n").unwrap();
        let linked = tempfile::tempdir().unwrap();
        std::fs::create_dir(linked.path().join(".github")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), linked.path().join(WORKFLOWS)).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), linked.path().join(".circleci")).unwrap();
        std::fs::rename(
            elsewhere.path().join("ci.yml"),
            elsewhere.path().join("config.yml"),
        )
        .unwrap();
        std::fs::copy(
            elsewhere.path().join("config.yml"),
            elsewhere.path().join("ci.yml"),
        )
        .unwrap();
        assert!(service_hints(linked.path(), &[]).is_empty());
    }
}
