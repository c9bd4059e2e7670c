//! The INI files Python projects configure themselves with (`setup.cfg`, `tox.ini`), read
//! the way configparser reads them: `[section]` headers, `key = value` (or `key: value`),
//! values continued on indented lines, `#` and `;` comment lines.

/// The raw lines of `[name]` (every one of them when it appears more than once), without the
/// header; `None` when there is no such section.
pub fn section(text: &str, name: &str) -> Option<String> {
    let mut found: Option<String> = None;
    let mut inside = false;
    for line in text.lines() {
        if let Some(header) = header(line) {
            inside = header == name;
            if inside {
                found.get_or_insert_with(String::new);
            }
            continue;
        }
        if inside && let Some(body) = found.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    found
}

fn header(line: &str) -> Option<&str> {
    // A header starts the line; an indented `[x]` continues a value.
    if line.starts_with([' ', '\t']) {
        return None;
    }
    let line = line.trim_end();
    line.strip_prefix('[')?.strip_suffix(']').map(str::trim)
}

/// The `key = value` pairs of a section's lines, continuation lines joined with `\n`.
pub fn values(section: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in section.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = out.last_mut() {
                value.push('\n');
                value.push_str(trimmed);
            }
            continue;
        }
        let at = trimmed.find(['=', ':']);
        if let Some(at) = at {
            out.push((
                trimmed[..at].trim().to_string(),
                trimmed[at + 1..].trim().to_string(),
            ));
        }
    }
    out
}

/// The names of every section.
pub fn sections(text: &str) -> Vec<String> {
    text.lines().filter_map(header).map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_continued_values() {
        let cfg = "[metadata]\nname = x\n\n[options]\ninstall_requires =\n    requests>=2\n    # a comment\n    attrs\n\
                   python_requires = >=3.8\n[tool:pytest]\naddopts = -q\n[options.extras_require]\ntest = pytest; freezegun\n";
        let options = section(cfg, "options").unwrap();
        let v = values(&options);
        assert_eq!(v[0], ("install_requires".into(), "\nrequests>=2\nattrs".into()));
        assert_eq!(v[1], ("python_requires".into(), ">=3.8".into()));
        assert_eq!(section(cfg, "tool:pytest").unwrap(), "addopts = -q\n");
        assert!(section(cfg, "pytest").is_none());
        assert_eq!(
            sections(cfg),
            ["metadata", "options", "tool:pytest", "options.extras_require"]
        );
    }
}
