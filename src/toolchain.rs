//! Toolchain versions: what an image has (labels written when agentbox builds it) against what
//! a project asks for (`rust-version` in Cargo.toml, the `go` directive of go.mod,
//! `engines.node` in package.json, `requires-python` in pyproject.toml).
//!
//! A mismatch is a warning, not an error: the build tools decide (cargo and go refuse to build,
//! npm and pip only warn), and the task may be the very change that lowers the requirement.

use std::io::Read;
use std::path::Path;

pub use crate::sandbox::image::Toolchain;
use crate::sandbox::image::image_labels;
pub use crate::sandbox::image::image_toolchains;

/// Warnings for the user where `image`'s toolchains (its labels) do not meet what the project
/// at `project` asks for in its root manifests. Warnings, not errors: the build tools have the
/// last word, and the task may be to change the requirement. Nothing when Docker or the
/// manifests cannot say.
pub async fn toolchain_warnings(image: &str, project: &Path) -> Vec<String> {
    let root = project.to_path_buf();
    let Ok(needs) = tokio::task::spawn_blocking(move || project_requirements(&root)).await else {
        return Vec::new();
    };
    if needs.is_empty() {
        return Vec::new();
    }
    let Ok(docker) = crate::sandbox::connect_docker().await else {
        return Vec::new();
    };
    let Ok(Some(labels)) = image_labels(&docker, image).await else {
        return Vec::new();
    };
    let have = image_toolchains(&labels);
    needs
        .iter()
        .filter_map(|need| toolchain_mismatch(image, &have, need))
        .collect()
}

/// What a project asks of one toolchain, as written, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub toolchain: Toolchain,
    /// E.g. `1.86` (Rust, Go: the least version), `>=18 <23` (Node), `>=3.11` (Python).
    pub spec: String,
    /// E.g. `Cargo.toml (rust-version)`.
    pub source: String,
}

/// A sentence for the user when `image` (whose toolchain versions are `have`) does not meet
/// `need`; `None` when it does, or when either side cannot be read (no label, a requirement
/// in a syntax this does not know): no message is better than a wrong one.
pub fn toolchain_mismatch(image: &str, have: &[(Toolchain, String)], need: &Requirement) -> Option<String> {
    let (_, version) = have.iter().find(|(t, _)| *t == need.toolchain)?;
    let v = Version::parse(version)?;
    let satisfied = match need.toolchain {
        // Least versions: cargo and go refuse to build with an older toolchain.
        Toolchain::Rust | Toolchain::Go => v >= Version::parse(need.spec.trim().trim_start_matches("go"))?,
        Toolchain::Node => satisfies(&v, &need.spec, Flavour::Semver)?,
        Toolchain::Python => satisfies(&v, &need.spec, Flavour::Pep440)?,
    };
    if satisfied {
        return None;
    }
    let consequence = match need.toolchain {
        Toolchain::Rust => "cargo will refuse to build it",
        Toolchain::Go => "go will refuse to build it (GOTOOLCHAIN=local: no other toolchain is fetched)",
        Toolchain::Node => "npm may warn or refuse, and the code may use what this version lacks",
        Toolchain::Python => "pip will refuse to install it, and the code may use what this version lacks",
    };
    let asks = match need.toolchain {
        Toolchain::Rust | Toolchain::Go => {
            format!("{} {} or newer", need.toolchain.display(), need.spec.trim())
        }
        _ => format!("{} {}", need.toolchain.display(), need.spec.trim()),
    };
    Some(format!(
        "{} asks for {asks}, but the image {image} has {} {version}: {consequence}. Use an image \
         with a matching toolchain (--image), or change the requirement",
        need.source,
        need.toolchain.display()
    ))
}

/// The toolchain requirements written in the project's root manifests, read on the host: only
/// regular files (no link is followed) of at most 1 MiB; what cannot be read or parsed is
/// skipped.
pub fn project_requirements(root: &Path) -> Vec<Requirement> {
    let mut found = Vec::new();
    let mut push = |toolchain, spec: Option<String>, source: &str| {
        if let Some(spec) = spec.filter(|s| !s.trim().is_empty()) {
            found.push(Requirement {
                toolchain,
                spec,
                source: source.to_string(),
            });
        }
    };
    if let Some(text) = read_manifest(root, "Cargo.toml") {
        push(
            Toolchain::Rust,
            cargo_rust_version(&text),
            "Cargo.toml (rust-version)",
        );
    }
    if let Some(text) = read_manifest(root, "go.mod") {
        push(Toolchain::Go, go_directive(&text), "go.mod (go directive)");
    }
    if let Some(text) = read_manifest(root, "package.json") {
        push(
            Toolchain::Node,
            node_engines(&text),
            "package.json (engines.node)",
        );
    }
    if let Some(text) = read_manifest(root, "pyproject.toml") {
        push(
            Toolchain::Python,
            requires_python(&text),
            "pyproject.toml (requires-python)",
        );
    }
    found
}

fn read_manifest(root: &Path, name: &str) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    const LIMIT: u64 = 1 << 20;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(root.join(name))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > LIMIT {
        return None;
    }
    let mut text = String::new();
    file.take(LIMIT).read_to_string(&mut text).ok()?;
    Some(text)
}

fn cargo_rust_version(text: &str) -> Option<String> {
    let doc: toml::Table = text.parse().ok()?;
    let in_table = |t: &toml::Table| t.get("rust-version").and_then(|v| v.as_str()).map(str::to_string);
    let package = doc.get("package").and_then(|p| p.as_table());
    package.and_then(in_table).or_else(|| {
        doc.get("workspace")
            .and_then(|w| w.get("package"))
            .and_then(|p| p.as_table())
            .and_then(in_table)
    })
}

fn go_directive(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split("//").next().unwrap_or("").trim();
        let rest = line.strip_prefix("go")?;
        rest.starts_with([' ', '\t']).then(|| rest.trim().to_string())
    })
}

fn node_engines(text: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_str(text).ok()?;
    doc.get("engines")?.get("node")?.as_str().map(str::to_string)
}

fn requires_python(text: &str) -> Option<String> {
    let doc: toml::Table = text.parse().ok()?;
    doc.get("project")?
        .get("requires-python")?
        .as_str()
        .map(str::to_string)
}

/// A release version, `major.minor.patch` (missing parts are 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Version([u64; 3]);

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let (parts, _) = partial(text)?;
        (!parts.is_empty()).then(|| Version::padded(&parts))
    }

    fn padded(parts: &[u64]) -> Version {
        let mut v = [0; 3];
        for (slot, p) in v.iter_mut().zip(parts) {
            *slot = *p;
        }
        Version(v)
    }

    /// The next version after everything that starts with `parts` (`1.2` → `1.3.0`).
    fn after_prefix(parts: &[u64]) -> Version {
        match parts.len() {
            0 => Version([u64::MAX; 3]),
            n => {
                let mut bumped: Vec<u64> = parts[..n.min(3)].to_vec();
                if let Some(last) = bumped.last_mut() {
                    *last = last.saturating_add(1);
                }
                Version::padded(&bumped)
            }
        }
    }

    fn starts_with(&self, parts: &[u64]) -> bool {
        parts.iter().zip(self.0).all(|(p, v)| *p == v)
    }
}

/// `1.2.x`, `v1.2`, `3.12.*`, `20` → the numbers given (`[1, 2]`) and whether the text ended in
/// a wildcard. A pre-release or build suffix (`1.21rc1`, `1.2.3-beta`) is ignored.
fn partial(text: &str) -> Option<(Vec<u64>, bool)> {
    let text = text.trim().trim_start_matches(['v', 'V', '=']);
    if matches!(text, "" | "*" | "x" | "X") {
        return Some((Vec::new(), true));
    }
    let mut parts = Vec::new();
    let mut wildcard = false;
    for piece in text.split('.') {
        if matches!(piece, "*" | "x" | "X") {
            wildcard = true;
            break;
        }
        let digits: String = piece.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            return None;
        }
        parts.push(digits.parse().ok()?);
        if digits.len() != piece.len() || parts.len() == 3 {
            break;
        }
    }
    (!parts.is_empty() || wildcard).then_some((parts, wildcard))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// npm's ranges: `^18`, `~1.2`, `>=18 <23`, `18.x`, `1.2 - 2`, `a || b`.
    Semver,
    /// PEP 440 specifiers: `>=3.9,<4`, `~=3.10`, `==3.12.*`, `!=3.9.*`.
    Pep440,
}

/// Whether `v` is in the range; `None` if the range cannot be read.
fn satisfies(v: &Version, range: &str, flavour: Flavour) -> Option<bool> {
    let alternatives: Vec<&str> = match flavour {
        Flavour::Semver => range.split("||").collect(),
        Flavour::Pep440 => vec![range],
    };
    let mut any = false;
    for alt in alternatives {
        let mut all = true;
        for comparator in comparators(alt, flavour)? {
            all &= comparator.holds(v, flavour)?;
        }
        any |= all;
    }
    Some(any)
}

struct Comparator {
    op: String,
    parts: Vec<u64>,
    wildcard: bool,
}

fn comparators(text: &str, flavour: Flavour) -> Option<Vec<Comparator>> {
    let text = text.trim();
    // `1.2 - 2.3`: an inclusive range.
    if flavour == Flavour::Semver
        && let Some((low, high)) = text.split_once(" - ")
    {
        let (lp, lw) = partial(low)?;
        let (hp, hw) = partial(high)?;
        return Some(vec![
            Comparator {
                op: ">=".into(),
                parts: lp,
                wildcard: lw,
            },
            Comparator {
                op: "<=".into(),
                parts: hp,
                wildcard: hw,
            },
        ]);
    }
    // Operators may be followed by spaces (`>= 18`): glue them to their version first.
    let mut glued = String::new();
    let mut pending_op = false;
    for token in text.split([' ', ',', '\t']).filter(|t| !t.is_empty()) {
        if !glued.is_empty() && !pending_op {
            glued.push(' ');
        }
        glued.push_str(token);
        pending_op = token.chars().all(|c| "<>=!~^".contains(c));
    }
    glued
        .split(' ')
        .filter(|t| !t.is_empty())
        .map(|token| {
            let op_len = token.find(|c: char| !"<>=!~^".contains(c)).unwrap_or(token.len());
            let (op, version) = token.split_at(op_len);
            let (parts, wildcard) = partial(version)?;
            Some(Comparator {
                op: op.to_string(),
                parts,
                wildcard,
            })
        })
        .collect()
}

impl Comparator {
    fn holds(&self, v: &Version, flavour: Flavour) -> Option<bool> {
        let p = &self.parts;
        let exact = Version::padded(p);
        // In npm a partial version is a range (`1.2` = `1.2.x`); in PEP 440 only `.*` is.
        let is_range = self.wildcard || (flavour == Flavour::Semver && p.len() < 3);
        let in_prefix = v.starts_with(p);
        Some(match self.op.as_str() {
            "" | "=" | "==" | "===" => {
                if is_range {
                    in_prefix
                } else {
                    *v == exact
                }
            }
            "!=" => {
                if is_range {
                    !in_prefix
                } else {
                    *v != exact
                }
            }
            ">=" => *v >= exact,
            ">" => {
                if is_range {
                    *v >= Version::after_prefix(p)
                } else {
                    *v > exact
                }
            }
            "<" => *v < exact,
            "<=" => {
                if is_range {
                    *v < Version::after_prefix(p)
                } else {
                    *v <= exact
                }
            }
            // PEP 440 compatible release: `~=3.10` is `>=3.10, ==3.*`.
            "~=" if p.len() >= 2 => *v >= exact && v.starts_with(&p[..p.len() - 1]),
            // npm: `~1.2.3` is `>=1.2.3 <1.3.0`; `~1` is `1.x`.
            "~" if flavour == Flavour::Semver => {
                let upto = if p.len() >= 2 { &p[..2] } else { &p[..] };
                *v >= exact && *v < Version::after_prefix(upto)
            }
            // npm: `^1.2.3` is `>=1.2.3 <2.0.0`, `^0.2.3` is `<0.3.0`, `^0.0.3` is `<0.0.4`.
            "^" if flavour == Flavour::Semver => {
                let first_nonzero = p
                    .iter()
                    .position(|n| *n != 0)
                    .unwrap_or(p.len().saturating_sub(1));
                let upto = &p[..(first_nonzero + 1).min(p.len())];
                *v >= exact && *v < Version::after_prefix(upto)
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sat(v: &str, range: &str, flavour: Flavour) -> Option<bool> {
        satisfies(&Version::parse(v).unwrap(), range, flavour)
    }

    #[test]
    fn npm_ranges() {
        use Flavour::Semver as S;
        assert_eq!(sat("20.19.2", ">=18", S), Some(true));
        assert_eq!(sat("20.19.2", ">= 22", S), Some(false));
        assert_eq!(sat("20.19.2", "^20.10.0", S), Some(true));
        assert_eq!(sat("20.19.2", "^18", S), Some(false));
        assert_eq!(sat("20.19.2", "18 || 20", S), Some(true));
        assert_eq!(sat("20.19.2", "18.x", S), Some(false));
        assert_eq!(sat("20.19.2", "20.x", S), Some(true));
        assert_eq!(sat("20.19.2", ">=18 <20", S), Some(false));
        assert_eq!(sat("20.19.2", ">=18.0.0 <21.0.0", S), Some(true));
        assert_eq!(sat("20.19.2", "~20.19.0", S), Some(true));
        assert_eq!(sat("20.19.2", "~20.18", S), Some(false));
        assert_eq!(sat("20.19.2", "16 - 20", S), Some(true));
        assert_eq!(sat("20.19.2", "16 - 19", S), Some(false));
        assert_eq!(sat("20.19.2", ">19", S), Some(true));
        assert_eq!(sat("20.19.2", ">20", S), Some(false));
        assert_eq!(sat("20.19.2", "<=20", S), Some(true));
        assert_eq!(sat("20.19.2", "*", S), Some(true));
        assert_eq!(sat("0.2.5", "^0.2.3", S), Some(true));
        assert_eq!(sat("0.3.0", "^0.2.3", S), Some(false));
        assert_eq!(sat("20.19.2", "latest", S), None);
    }

    #[test]
    fn python_specifiers() {
        use Flavour::Pep440 as P;
        assert_eq!(sat("3.13.5", ">=3.9", P), Some(true));
        assert_eq!(sat("3.13.5", ">=3.9,<3.13", P), Some(false));
        assert_eq!(sat("3.13.5", ">=3.9, <4", P), Some(true));
        assert_eq!(sat("3.13.5", "~=3.10", P), Some(true));
        assert_eq!(sat("3.13.5", "~=3.14", P), Some(false));
        assert_eq!(sat("3.13.5", "==3.12.*", P), Some(false));
        assert_eq!(sat("3.13.5", "!=3.13.*", P), Some(false));
        assert_eq!(sat("3.13.5", ">3.13", P), Some(true));
        assert_eq!(sat("3.13.5", "^3", P), None);
    }

    fn need(toolchain: Toolchain, spec: &str) -> Requirement {
        Requirement {
            toolchain,
            spec: spec.into(),
            source: "the manifest".into(),
        }
    }

    #[test]
    fn a_mismatch_says_what_is_asked_and_what_there_is() {
        let have = vec![
            (Toolchain::Rust, "1.85.0".to_string()),
            (Toolchain::Go, "1.24.4".to_string()),
            (Toolchain::Node, "20.19.2".to_string()),
        ];
        let msg = toolchain_mismatch("agentbox/rust:1", &have, &need(Toolchain::Rust, "1.86")).unwrap();
        assert!(msg.contains("Rust 1.86 or newer"), "{msg}");
        assert!(msg.contains("agentbox/rust:1 has Rust 1.85.0"), "{msg}");
        assert!(msg.contains("--image"), "{msg}");
        assert_eq!(
            toolchain_mismatch("i", &have, &need(Toolchain::Rust, "1.85")),
            None
        );
        assert_eq!(
            toolchain_mismatch("i", &have, &need(Toolchain::Rust, "1.70.0")),
            None
        );
        assert!(toolchain_mismatch("i", &have, &need(Toolchain::Go, "1.25")).is_some());
        assert_eq!(
            toolchain_mismatch("i", &have, &need(Toolchain::Go, "1.24.4")),
            None
        );
        assert!(toolchain_mismatch("i", &have, &need(Toolchain::Go, "1.24.5")).is_some());
        assert!(toolchain_mismatch("i", &have, &need(Toolchain::Node, ">=22")).is_some());
        // Unknown on either side: no message.
        assert_eq!(
            toolchain_mismatch("i", &have, &need(Toolchain::Python, ">=3.99")),
            None
        );
        assert_eq!(
            toolchain_mismatch("i", &have, &need(Toolchain::Node, "lts/*")),
            None
        );
    }

    #[test]
    fn requirements_are_read_from_the_root_manifests() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("Cargo.toml", "[package]\nname = \"x\"\nrust-version = \"1.86\"\n");
        write(
            "go.mod",
            "module example.com/x // a module\n\ngo 1.25.1\n\ntoolchain go1.25.2\n",
        );
        write("package.json", r#"{"name": "x", "engines": {"node": ">=22"}}"#);
        write(
            "pyproject.toml",
            "[project]\nname = \"x\"\nrequires-python = \">=3.11\"\n",
        );
        let found = project_requirements(dir.path());
        let specs: Vec<(Toolchain, &str)> = found.iter().map(|r| (r.toolchain, r.spec.as_str())).collect();
        assert_eq!(
            specs,
            [
                (Toolchain::Rust, "1.86"),
                (Toolchain::Go, "1.25.1"),
                (Toolchain::Node, ">=22"),
                (Toolchain::Python, ">=3.11")
            ]
        );
        // A workspace's shared rust-version counts; a link is not followed.
        write("Cargo.toml", "[workspace.package]\nrust-version = \"1.80\"\n");
        std::fs::remove_file(dir.path().join("go.mod")).unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), "go 1.99\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("go.mod")).unwrap();
        let found = project_requirements(dir.path());
        assert_eq!(found[0].spec, "1.80");
        assert!(found.iter().all(|r| r.toolchain != Toolchain::Go));
    }
}
