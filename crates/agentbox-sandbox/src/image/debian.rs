//! The Debian archive the offline build reads: APT sources for agentbox's suite, from
//! `--mirror` or from the host's own Debian sources.

use std::path::PathBuf;

use super::{DEBIAN_SUITE, ImageError};

/// The APT sources for the offline build: `deb URI SUITE main` lines for [`DEBIAN_SUITE`], from
/// `--mirror`, else from this host's own Debian sources (their URIs, with our suite: the host
/// may run an older release).
pub(super) fn apt_sources(mirror: Option<&str>) -> Result<String, ImageError> {
    let uris: Vec<(String, bool)> = match mirror {
        Some(m) => vec![(m.to_string(), false)],
        None => {
            let mut texts = Vec::new();
            if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
                texts.push((t, false));
            }
            if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
                let mut entries: Vec<PathBuf> = dir
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                        // Only Debian's own archive: third-party repositories are for the host.
                        (name.ends_with(".sources") || name.ends_with(".list")) && name.starts_with("debian")
                    })
                    .collect();
                entries.sort();
                for p in entries {
                    if let Ok(t) = std::fs::read_to_string(&p) {
                        texts.push((t, p.extension().is_some_and(|e| e == "sources")));
                    }
                }
            }
            let mut uris = Vec::new();
            for (text, deb822) in texts {
                for entry in debian_entries(&text, deb822) {
                    if !uris.contains(&entry) {
                        uris.push(entry);
                    }
                }
            }
            uris
        }
    };
    if uris.is_empty() {
        return Err(ImageError::NoAptSources);
    }
    let mut lines = String::new();
    for (uri, security) in uris {
        if security {
            lines.push_str(&format!("deb {uri} {DEBIAN_SUITE}-security main\n"));
        } else {
            lines.push_str(&format!("deb {uri} {DEBIAN_SUITE} main\n"));
            lines.push_str(&format!("deb {uri} {DEBIAN_SUITE}-updates main\n"));
        }
    }
    Ok(lines)
}

/// `(URI, is the security archive)` of each binary-package source with the `main` component,
/// from a one-line-style (`deb [opts] URI SUITE COMPONENT...`) or a deb822 (`.sources`) file.
fn debian_entries(text: &str, deb822: bool) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut add = |uri: &str, suite: &str| {
        let entry = (
            uri.trim_end_matches('/').to_string(),
            suite.ends_with("-security"),
        );
        if !found.contains(&entry) {
            found.push(entry);
        }
    };
    if deb822 {
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
            };
            let (Some(types), Some(uris), Some(suites), Some(components)) = (
                field("Types"),
                field("URIs"),
                field("Suites"),
                field("Components"),
            ) else {
                continue;
            };
            if !types.split_whitespace().any(|t| t == "deb")
                || !components.split_whitespace().any(|c| c == "main")
                || field("Enabled").is_some_and(|e| e.eq_ignore_ascii_case("no"))
            {
                continue;
            }
            for uri in uris.split_whitespace() {
                for suite in suites.split_whitespace() {
                    add(uri, suite);
                }
            }
        }
    } else {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some(rest) = line.strip_prefix("deb ") else {
                continue;
            };
            let rest = rest.trim_start();
            // Options in brackets (`[signed-by=...]`) are the host's business.
            let rest = match rest.strip_prefix('[') {
                Some(r) => r.split_once(']').map_or("", |(_, after)| after),
                None => rest,
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [uri, suite, components @ ..] = words.as_slice()
                && components.contains(&"main")
            {
                add(uri, suite);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offline_sources_name_our_suite_whatever_the_host_runs() {
        let deb822 = "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n";
        assert_eq!(
            debian_entries(deb822, true),
            [
                ("http://mirror.example/debian".to_string(), false),
                ("http://mirror.example/debian-security".to_string(), true)
            ]
        );
        let one_line = "deb [signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib\n# deb http://old.example/debian bookworm main\ndeb http://third.example/repo bookworm stable\n";
        assert_eq!(
            debian_entries(one_line, false),
            [("http://mirror.example/debian".to_string(), false)]
        );
        let lines = apt_sources(Some("http://mirror.example/debian")).unwrap();
        assert_eq!(
            lines,
            format!(
                "deb http://mirror.example/debian {DEBIAN_SUITE} main\ndeb http://mirror.example/debian {DEBIAN_SUITE}-updates main\n"
            )
        );
        assert!(!lines.contains("sid") && !lines.contains("testing") && !lines.contains("unstable"));
    }
}
