//! Reading the sandbox's project back, bounded in bytes and time, with an account of what was
//! not brought back.
//!
//! Three steps. A listing of paths, types and sizes made in the sandbox (`find`) says what not
//! to read: caches, `.git`, files too large to bring back. Those are removed from the sandbox
//! (it is thrown away next) so the Docker archive of `/workspace` does not carry them. Then that
//! archive, written by the Docker daemon from the volume and not by anything in the sandbox,
//! is read against the manifest of what was copied in, under a byte budget and a deadline.
//!
//! The listing can lie (a process left running in the sandbox can race or tamper with it). It
//! only ever decides what is *not* read: a lie can hide the sandbox's own change, which then
//! never reaches the host and is still named in the report as not brought back (and `--apply`
//! refuses), or make a cache change go unreported; it can never make the host read more than
//! the budget, nor bring back anything the archive does not hold.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use sha2::{Digest, Sha256};

use super::CACHE_DIRS;
use super::{Change, ChangeKind, Content, Entry, IsolateError, Manifest, RelPath, is_git_component};
use crate::human_bytes;

/// How much is brought back: bytes of one changed file, and of all of them together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub file: u64,
    pub total: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            file: 64 << 20,
            total: 256 << 20,
        }
    }
}
/// Most bytes of listing taken from the sandbox (some 200 000 paths).
pub const MAX_LISTING_BYTES: usize = 16 << 20;
/// The longest reading the archive may take, whatever it holds.
pub const MAX_READBACK_SECS: u64 = 600;
/// Room in the byte budget for each entry's headers and padding, and in all.
const HEADER_ALLOWANCE: u64 = 2048;
const SLACK_BYTES: u64 = 64 << 20;
/// Entries allowed for when there is no listing to count them.
const UNLISTED_ENTRIES: u64 = 100_000;

/// Left out of a changeset: anything in a `.git` (at any depth) or a cache, and `.pyc` files.
pub fn ignored(rel: &RelPath) -> bool {
    rel.components().any(is_ignored_component) || rel.as_bytes().ends_with(b".pyc")
}

fn is_ignored_component(c: &[u8]) -> bool {
    is_git_component(c) || CACHE_DIRS.iter().any(|d| d.as_bytes() == c)
}

/// The ignored directory `rel` is in (and whether it is one), or the ignored file itself.
fn ignored_root(rel: &RelPath) -> (RelPath, bool) {
    let comps: Vec<&[u8]> = rel.components().collect();
    match comps.iter().position(|c| is_ignored_component(c)) {
        Some(i) => {
            let root = comps[..=i].join(&b'/');
            let is_dir = i + 1 < comps.len();
            (RelPath::new(root).unwrap_or_else(|| rel.clone()), is_dir)
        }
        None => (rel.clone(), false),
    }
}

/// The command that lists the sandbox's project: `TYPE SIZE PATH`, NUL-terminated (a
/// path can hold a newline, never a NUL).
pub fn listing_command() -> Vec<String> {
    [
        "/bin/sh",
        "-c",
        "cd /workspace && exec find . -mindepth 1 -printf '%y %s %P\\0'",
    ]
    .map(String::from)
    .to_vec()
}

/// The command that removes what will not be read back; the paths come NUL-separated on stdin.
pub fn prune_command() -> Vec<String> {
    ["/bin/sh", "-c", "cd /workspace && exec xargs -0 -r rm -rf --"]
        .map(String::from)
        .to_vec()
}

/// One path of the listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// `find`'s `%y`: f, d, l, p, s, c, b.
    pub kind: u8,
    pub size: u64,
}

pub type Listing = BTreeMap<RelPath, Listed>;

/// The listing's records; malformed ones are left out (the archive is what counts).
pub fn parse_listing(out: &[u8]) -> Listing {
    let mut listing = Listing::new();
    for rec in out.split(|&b| b == 0) {
        let mut parts = rec.splitn(3, |&b| b == b' ');
        let (Some(kind), Some(size), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let size = std::str::from_utf8(size).ok().and_then(|s| s.parse().ok());
        if let ([kind], Some(size), Some(path)) = (kind, size, RelPath::new(path.to_vec())) {
            listing.insert(path, Listed { kind: *kind, size });
        }
    }
    listing
}

/// Why a changed path was not brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// A cache or a `.git` (or compiled Python): never brought back.
    Cache {
        entries: u64,
        bytes: u64,
    },
    TooLarge {
        bytes: u64,
        limit: u64,
    },
    OverTotal {
        bytes: u64,
        limit: u64,
    },
    /// A FIFO, socket or device, which a patch cannot hold; `replaces` a project file.
    Special {
        kind: &'static str,
        replaces: bool,
    },
    HardLink,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: RelPath,
    pub is_dir: bool,
    pub why: Skip,
}

impl Skipped {
    pub fn is_cache(&self) -> bool {
        matches!(self.why, Skip::Cache { .. })
    }

    /// As the change list shows it: quoted as git does, a directory with a trailing `/`.
    pub fn shown(&self) -> String {
        if self.is_dir {
            self.path.quoted_dir()
        } else {
            self.path.quoted()
        }
    }

    /// Whether `--apply` must refuse: the project would get part of what the sandbox did.
    /// Caches are never part of it; a socket a test left behind is not part of the project.
    pub(crate) fn blocks_apply(&self) -> bool {
        match self.why {
            Skip::Cache { .. } => false,
            Skip::Special { replaces, .. } => replaces,
            _ => true,
        }
    }

    pub fn reason(&self) -> String {
        match &self.why {
            Skip::Cache { entries, bytes } => {
                format!("{entries} entries, {}", human_bytes(*bytes))
            }
            Skip::TooLarge { bytes, limit } => format!(
                "{}, more than the {} one file may have",
                human_bytes(*bytes),
                human_bytes(*limit)
            ),
            Skip::OverTotal { bytes, limit } => format!(
                "{}, past the {} all changed files together may have",
                human_bytes(*bytes),
                human_bytes(*limit)
            ),
            Skip::Special { kind, .. } => format!("{kind}, which a patch cannot hold"),
            Skip::HardLink => "a hard link, which a patch cannot hold".into(),
        }
    }
}

/// The report's warnings about what was not brought back: each path a patch lacks, and
/// caches that grew large (a test run's usual cache is listed as changed, not warned about).
pub fn warnings(skipped: &[Skipped], limits: Limits) -> Vec<String> {
    skipped
        .iter()
        .filter(|s| match s.why {
            Skip::Cache { bytes, .. } => bytes > limits.file,
            _ => true,
        })
        .map(|s| {
            let tail = if s.is_cache() {
                "; caches and git directories are never brought back"
            } else if s.blocks_apply() {
                "; --apply refuses while part of the changes is missing"
            } else {
                ""
            };
            format!(
                "not brought back from the sandbox: {} ({}){tail}",
                s.shown(),
                s.reason()
            )
        })
        .collect()
}

/// One line on the caches and git directories that changed in the sandbox (for the progress
/// output), or `None`.
pub fn caches_note(skipped: &[Skipped]) -> Option<String> {
    const SHOWN: usize = 20;
    let caches: Vec<String> = skipped
        .iter()
        .filter(|s| s.is_cache())
        .map(|s| format!("{} ({})", s.shown(), s.reason()))
        .collect();
    if caches.is_empty() {
        return None;
    }
    let more = caches.len().saturating_sub(SHOWN);
    Some(format!(
        "changed in caches and git directories, never brought back: {}{}",
        caches[..caches.len().min(SHOWN)].join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// Ignored paths seen in the sandbox (in the listing or the archive), to tell which ignored
/// directories changed.
#[derive(Debug, Default)]
struct Ignored {
    seen: BTreeMap<RelPath, (u64, bool)>,
}

impl Ignored {
    /// `link` is the link's target when known (from the archive; the listing gives its length).
    /// By type and size only: git rewrites the times of objects it already has (in `.git`,
    /// when the baseline snapshot borrows them), and a cache is never brought back anyway.
    fn observe(&mut self, manifest: &Manifest, rel: &RelPath, kind: u8, size: u64, link: Option<&[u8]>) {
        let changed = match manifest.entries.get(rel) {
            None => true,
            Some(Entry::Dir) => kind != b'd',
            Some(Entry::File { size: s, .. }) => !(kind == b'f' && size == *s),
            Some(Entry::Symlink { target }) => {
                let t = target.as_os_str().as_encoded_bytes();
                kind != b'l' || link.map_or(size != t.len() as u64, |l| l != t)
            }
        };
        if changed {
            tracing::debug!(path = %rel, kind = %(kind as char), size, "changed in an ignored directory");
        }
        let size = if kind == b'f' { size } else { 0 };
        let e = self.seen.entry(rel.clone()).or_insert((size, false));
        e.1 |= changed;
    }

    fn changed_roots(self, manifest: &Manifest) -> Vec<Skipped> {
        let mut roots: BTreeMap<RelPath, (bool, u64, u64, bool)> = BTreeMap::new();
        for (rel, (size, changed)) in &self.seen {
            let (root, is_dir) = ignored_root(rel);
            let r = roots.entry(root).or_insert((is_dir, 0, 0, false));
            r.0 |= is_dir;
            r.1 += 1;
            r.2 += size;
            r.3 |= *changed;
        }
        for rel in manifest.entries.keys() {
            if ignored(rel) && !self.seen.contains_key(rel) {
                // Removed in the sandbox.
                let (root, is_dir) = ignored_root(rel);
                let r = roots.entry(root).or_insert((is_dir, 0, 0, false));
                r.0 |= is_dir;
                r.3 = true;
            }
        }
        roots
            .into_iter()
            .filter(|(_, r)| r.3)
            .map(|(path, (is_dir, entries, bytes, _))| Skipped {
                path,
                is_dir,
                why: Skip::Cache { entries, bytes },
            })
            .collect()
    }
}

/// What not to read, decided from the listing before reading.
#[derive(Debug, Default)]
pub struct Plan {
    /// Removed from the sandbox before the archive is read.
    pub prune: Vec<RelPath>,
    skipped: BTreeMap<RelPath, Skipped>,
    ignored: Ignored,
    limits: Limits,
    /// Most bytes the archive may take.
    pub budget: u64,
}

impl Plan {
    /// The paths to prune, NUL-separated, for [`prune_command`].
    pub fn prune_input(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for p in &self.prune {
            out.extend_from_slice(p.as_bytes());
            out.push(0);
        }
        out
    }
}

/// Decide from `listing` (if the sandbox gave one) what not to read back: every ignored
/// directory, and every file too large to bring back that certainly changed (new, or of
/// another size; a file of the size that was copied in is read, to be compared). The budget
/// is what was copied in, plus what may be brought back, plus room for the archive's headers.
pub fn plan(manifest: &Manifest, listing: Option<&Listing>, limits: Limits) -> Plan {
    let copied_in: u64 = manifest
        .entries
        .values()
        .map(|e| match e {
            Entry::File { size, .. } => *size,
            _ => 0,
        })
        .sum();
    let entries = manifest.entries.len() as u64 + listing.map_or(UNLISTED_ENTRIES, |l| l.len() as u64);
    let mut plan = Plan {
        budget: copied_in + limits.total + SLACK_BYTES + HEADER_ALLOWANCE * entries,
        limits,
        ..Plan::default()
    };
    let Some(listing) = listing else { return plan };
    let mut roots = BTreeSet::new();
    let mut projected = 0u64;
    for (rel, l) in listing {
        if ignored(rel) {
            plan.ignored.observe(manifest, rel, l.kind, l.size, None);
            roots.insert(ignored_root(rel).0);
            continue;
        }
        if l.kind != b'f' {
            continue;
        }
        let same_size =
            matches!(manifest.entries.get(rel), Some(Entry::File { size, .. }) if *size == l.size);
        if same_size {
            continue;
        }
        let why = if l.size > limits.file {
            Skip::TooLarge {
                bytes: l.size,
                limit: limits.file,
            }
        } else if projected + l.size > limits.total {
            Skip::OverTotal {
                bytes: l.size,
                limit: limits.total,
            }
        } else {
            projected += l.size;
            continue;
        };
        plan.prune.push(rel.clone());
        plan.skipped.insert(
            rel.clone(),
            Skipped {
                path: rel.clone(),
                is_dir: false,
                why,
            },
        );
    }
    plan.prune.extend(roots);
    plan.prune.sort();
    plan
}

/// What changed, what was not brought back, and what reading it cost.
#[derive(Debug, Default)]
pub struct ChangeSet {
    pub changes: Vec<(Change, Option<Content>)>,
    pub skipped: Vec<Skipped>,
    /// Bytes read from the archive, and its entries.
    pub bytes_read: u64,
    pub entries: u64,
}

impl ChangeSet {
    /// What `--apply` cannot do without.
    pub fn missing(&self) -> Vec<&Skipped> {
        self.skipped.iter().filter(|s| s.blocks_apply()).collect()
    }
}

/// Counts what the archive costs, and ends it past the budget.
struct Budgeted<R> {
    inner: R,
    read: Rc<Cell<u64>>,
    budget: u64,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.read.get() > self.budget {
            return Err(std::io::Error::other("over the read-back budget"));
        }
        let got = self.inner.read(buf)?;
        self.read.set(self.read.get() + got as u64);
        Ok(got)
    }
}

/// Ends an async read when its deadline passes (the archive stream could otherwise stall).
pub struct Deadline<R> {
    inner: R,
    sleep: Pin<Box<tokio::time::Sleep>>,
    fired: Arc<AtomicBool>,
}

impl<R> Deadline<R> {
    pub fn new(inner: R, after: std::time::Duration, fired: Arc<AtomicBool>) -> Self {
        Deadline {
            inner,
            sleep: Box::pin(tokio::time::sleep(after)),
            fired,
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Deadline<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Poll::Ready(r) = Pin::new(&mut self.inner).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.fired.store(true, Ordering::Release);
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "reading the sandbox's files back took too long",
            )));
        }
        Poll::Pending
    }
}

/// Whether a file changed: `None` when it did not, else its status against what was packed.
fn status(was: Option<&Entry>, new: &Content) -> Option<ChangeKind> {
    match (was, new) {
        (None, _) => Some(ChangeKind::Added),
        (Some(Entry::File { sha256, mode, .. }), Content::File { data, mode: m }) => {
            let same = Sha256::digest(data).as_slice() == sha256 && (mode & 0o111 != 0) == (m & 0o111 != 0);
            (!same).then_some(ChangeKind::Modified)
        }
        (Some(Entry::Symlink { target }), Content::Symlink(t)) => {
            (target != t).then_some(ChangeKind::Modified)
        }
        (Some(_), _) => Some(ChangeKind::TypeChanged),
    }
}

/// The archive entry's path under `workspace/`, if it is a clean one below it.
fn rel_of(path: &[u8]) -> Option<RelPath> {
    let rest = path.strip_prefix(b"workspace/")?;
    RelPath::new(rest.strip_suffix(b"/").unwrap_or(rest).to_vec())
}

/// What changed, computed on the host by reading the sandbox's `/workspace` as a tar stream
/// (the archive API) against the manifest of what was copied in, within `plan`'s budget.
/// Nothing the sandbox runs takes part in what is brought back.
pub fn changeset_from_archive<R: Read>(
    tar: R,
    manifest: &Manifest,
    plan: Plan,
    deadline_fired: &AtomicBool,
) -> Result<ChangeSet, IsolateError> {
    let Plan {
        skipped: mut planned,
        ignored: mut ignored_seen,
        budget,
        limits,
        ..
    } = plan;
    let read = Rc::new(Cell::new(0u64));
    let fail = |reason: String| {
        if deadline_fired.load(Ordering::Acquire) {
            IsolateError::TooSlow(MAX_READBACK_SECS)
        } else if read.get() > budget {
            IsolateError::TooMuch { budget }
        } else {
            IsolateError::Archive {
                path: "/workspace".into(),
                reason,
            }
        }
    };
    let mut archive = tar::Archive::new(Budgeted {
        inner: tar,
        read: read.clone(),
        budget,
    });
    let mut seen: BTreeSet<RelPath> = BTreeSet::new();
    let mut out: BTreeMap<RelPath, (Change, Option<Content>)> = BTreeMap::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut held = 0u64;
    let mut entries = 0u64;
    for entry in archive.entries().map_err(|e| fail(e.to_string()))? {
        let mut entry = entry.map_err(|e| fail(e.to_string()))?;
        entries += 1;
        let Some(rel) = rel_of(&entry.path_bytes()) else {
            continue;
        };
        let header = entry.header().clone();
        let size = header.size().map_err(|e| fail(e.to_string()))?;
        let kind = header.entry_type();
        if ignored(&rel) {
            let letter = match kind {
                tar::EntryType::Directory => b'd',
                tar::EntryType::Symlink => b'l',
                tar::EntryType::Regular | tar::EntryType::Continuous => b'f',
                _ => b'?',
            };
            let link = entry.link_name_bytes().map(|l| l.into_owned());
            ignored_seen.observe(manifest, &rel, letter, size, link.as_deref());
            continue;
        }
        // Still there (its removal failed, or it came back): read as anything else.
        planned.remove(&rel);
        let was = manifest.entries.get(&rel);
        let mode = header.mode().map_err(|e| fail(e.to_string()))? & 0o7777;
        let skip = |why| Skipped {
            path: rel.clone(),
            is_dir: false,
            why,
        };
        let new = match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                seen.insert(rel.clone());
                if size > limits.file {
                    // Compared only when it could be what was copied in; never held.
                    if let Some(Entry::File {
                        sha256,
                        size: s,
                        mode: m,
                        ..
                    }) = was
                        && *s == size
                    {
                        let (got, _) =
                            super::hostfs::sha256_of(&mut entry).map_err(|e| fail(e.to_string()))?;
                        if got == *sha256 && (m & 0o111 != 0) == (mode & 0o111 != 0) {
                            continue;
                        }
                    }
                    skipped.push(skip(Skip::TooLarge {
                        bytes: size,
                        limit: limits.file,
                    }));
                    continue;
                }
                let mut data = Vec::with_capacity(size as usize);
                (&mut entry)
                    .take(size)
                    .read_to_end(&mut data)
                    .map_err(|e| fail(e.to_string()))?;
                Content::File { data, mode }
            }
            tar::EntryType::Symlink => {
                seen.insert(rel.clone());
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| fail(format!("{rel}: a link without a target")))?;
                Content::Symlink(PathBuf::from(std::ffi::OsString::from_vec(target.into_owned())))
            }
            tar::EntryType::Link => {
                seen.insert(rel.clone());
                // The first of the names was brought back: this one gets the same content.
                let to = entry.link_name_bytes().and_then(|l| rel_of(&l));
                match to.and_then(|t| out.get(&t)).and_then(|(_, c)| c.clone()) {
                    Some(c @ Content::File { .. }) => c,
                    _ => {
                        skipped.push(skip(Skip::HardLink));
                        continue;
                    }
                }
            }
            tar::EntryType::Directory => continue,
            other => {
                seen.insert(rel.clone());
                let kind = match other {
                    tar::EntryType::Fifo => "a FIFO",
                    tar::EntryType::Char | tar::EntryType::Block => "a device",
                    _ => "an unusual archive entry",
                };
                skipped.push(skip(Skip::Special {
                    kind,
                    replaces: was.is_some_and(|w| !matches!(w, Entry::Dir)),
                }));
                continue;
            }
        };
        let Some(status) = status(was, &new) else { continue };
        if let Content::File { data, .. } = &new {
            if held + data.len() as u64 > limits.total {
                skipped.push(skip(Skip::OverTotal {
                    bytes: data.len() as u64,
                    limit: limits.total,
                }));
                continue;
            }
            held += data.len() as u64;
        }
        out.insert(
            rel.clone(),
            (
                Change {
                    status,
                    path: rel.clone(),
                },
                Some(new),
            ),
        );
    }
    for (path, entry) in &manifest.entries {
        if !matches!(entry, Entry::Dir)
            && !seen.contains(path)
            && !ignored(path)
            && !planned.contains_key(path)
        {
            out.insert(
                path.clone(),
                (
                    Change {
                        status: ChangeKind::Deleted,
                        path: path.clone(),
                    },
                    None,
                ),
            );
        }
    }
    // What the plan left unread is not in the sandbox any more, so it counts as planned.
    skipped.extend(planned.into_values());
    skipped.extend(ignored_seen.changed_roots(manifest));
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(ChangeSet {
        changes: out.into_values().collect(),
        skipped,
        bytes_read: read.get(),
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    const SMALL: Limits = Limits {
        file: 5000,
        total: 12000,
    };

    enum E<'a> {
        Dir,
        File(&'a [u8], u32),
        Link(&'a str),
        HardLink(&'a str),
        Fifo,
    }

    /// A tar like the archive API's: everything under `workspace/`.
    fn workspace_tar(entries: &[(&[u8], E)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, e) in entries {
            let mut name = b"workspace/".to_vec();
            name.extend_from_slice(path);
            let name = std::path::Path::new(OsStr::from_bytes(&name));
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(0);
            match e {
                E::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    b.append_data(&mut h, name, std::io::empty()).unwrap();
                }
                E::File(d, mode) => {
                    h.set_mode(*mode);
                    h.set_size(d.len() as u64);
                    h.set_entry_type(tar::EntryType::Regular);
                    b.append_data(&mut h, name, *d).unwrap();
                }
                E::Link(t) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    b.append_link(&mut h, name, t).unwrap();
                }
                E::HardLink(t) => {
                    h.set_entry_type(tar::EntryType::Link);
                    b.append_link(&mut h, name, format!("workspace/{t}")).unwrap();
                }
                E::Fifo => {
                    h.set_entry_type(tar::EntryType::Fifo);
                    b.append_data(&mut h, name, std::io::empty()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn project() -> (tempfile::TempDir, Manifest) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src/__pycache__")).unwrap();
        std::fs::write(d.path().join("src/a.py"), "a = 1\n").unwrap();
        std::fs::write(d.path().join("src/__pycache__/a.pyc"), "pyc").unwrap();
        std::fs::write(d.path().join("gone.txt"), "bye\n").unwrap();
        std::fs::write(d.path().join("big.dat"), vec![1u8; 7000]).unwrap();
        std::os::unix::fs::symlink("src/a.py", d.path().join("link")).unwrap();
        let manifest = super::super::pack(d.path(), 0, 0, &|_| false).unwrap().manifest;
        (d, manifest)
    }

    fn read(tar: &[u8], manifest: &Manifest, plan: Plan) -> Result<ChangeSet, IsolateError> {
        changeset_from_archive(tar, manifest, plan, &AtomicBool::new(false))
    }

    fn summary(set: &ChangeSet) -> Vec<(char, String)> {
        set.changes
            .iter()
            .map(|(c, _)| (c.status.letter(), c.path.quoted()))
            .collect()
    }

    #[test]
    fn the_changeset_is_read_from_the_archive_against_the_manifest() {
        let (_d, manifest) = project();
        let big = vec![1u8; 7000];
        let tar = workspace_tar(&[
            (b"src", E::Dir),
            (b"src/a.py", E::File(b"a = 2\n", 0o644)),
            (b"new.txt", E::File(b"n\n", 0o755)),
            (b"src/__pycache__", E::Dir),
            (b"src/__pycache__/a.pyc", E::File(b"pyc", 0o644)),
            (b"sub/.git/config", E::File(b"[core]\n", 0o644)),
            (b"x.pyc", E::File(b"junk", 0o644)),
            (b"big.dat", E::File(&big, 0o644)),
            (b"odd\n\xffname", E::File(b"o", 0o644)),
            (b"twin", E::HardLink("new.txt")),
            (b"twin2", E::HardLink("big.dat")),
            (b"sock", E::Fifo),
        ]);
        let set = read(&tar, &manifest, plan(&manifest, None, SMALL)).unwrap();
        // The link is absent from this archive, so it counts as deleted, like gone.txt; the
        // unchanged file over the limit is compared without being held.
        assert_eq!(
            summary(&set),
            [
                ('D', "gone.txt".into()),
                ('D', "link".into()),
                ('A', "new.txt".into()),
                ('A', r#""odd\n\377name""#.into()),
                ('M', "src/a.py".into()),
                ('A', "twin".into()),
            ]
        );
        let (_, twin) = &set.changes[5];
        assert_eq!(
            twin,
            &Some(Content::File {
                data: b"n\n".to_vec(),
                mode: 0o755
            }),
            "a hard link is the same file: same content, same mode"
        );
        let skipped: Vec<(String, bool)> = set
            .skipped
            .iter()
            .map(|s| (s.shown(), s.blocks_apply()))
            .collect();
        assert_eq!(
            skipped,
            [
                ("sock".into(), false),
                ("sub/.git/".into(), false),
                ("twin2".into(), true),
                ("x.pyc".into(), false),
            ],
            "the unchanged cache is not reported"
        );
        assert!(set.bytes_read > 7000);
    }

    #[test]
    fn the_listing_prunes_caches_and_files_too_large_and_they_are_named() {
        let (_d, manifest) = project();
        let listing = parse_listing(
            b"d 4096 src\0f 6 src/a.py\0d 4096 src/__pycache__\0f 3 src/__pycache__/a.pyc\0\
              f 1048576000 src/__pycache__/huge.pyc\0d 4096 .pytest_cache\0f 9 .pytest_cache/v\0\
              f 104857600 blob.bin\0f 7000 big.dat\0f 100 new\nname\0bad record\0",
        );
        assert_eq!(listing.len(), 10);
        let p = plan(&manifest, Some(&listing), SMALL);
        let pruned: Vec<String> = p.prune.iter().map(|r| r.quoted()).collect();
        // big.dat has the size it was copied in with: read, to be compared.
        assert_eq!(pruned, [".pytest_cache", "blob.bin", "src/__pycache__"]);
        assert_eq!(p.prune_input(), b".pytest_cache\0blob.bin\0src/__pycache__\0");
        // The sandbox pruned them: the archive has the rest.
        let tar = workspace_tar(&[
            (b"src", E::Dir),
            (b"src/a.py", E::File(b"a = 1\n", 0o644)),
            (b"gone.txt", E::File(b"bye\n", 0o644)),
            (b"link", E::Link("src/a.py")),
            (b"new\nname", E::File(b"x", 0o644)),
        ]);
        let set = read(&tar, &manifest, p).unwrap();
        // big.dat is not in this archive: deleted.
        assert_eq!(
            summary(&set),
            [('D', "big.dat".into()), ('A', r#""new\nname""#.into())]
        );
        let skipped: Vec<String> = set
            .skipped
            .iter()
            .map(|s| format!("{} {}", s.shown(), s.reason()))
            .collect();
        assert_eq!(
            skipped,
            [
                ".pytest_cache/ 2 entries, 9 bytes",
                "blob.bin 100.0 MiB, more than the 4.9 KiB one file may have",
                "src/__pycache__/ 3 entries, 1000.0 MiB",
            ]
        );
        assert_eq!(set.missing().len(), 1);
        let w = warnings(&set.skipped, SMALL);
        assert_eq!(w.len(), 2, "the small cache is not warned about: {w:?}");
        assert!(
            w[0].contains("blob.bin") && w[0].contains("--apply refuses"),
            "{w:?}"
        );
        assert!(
            w[1].contains("src/__pycache__/ (3 entries, 1000.0 MiB); caches and git directories are never"),
            "{w:?}"
        );
        let note = caches_note(&set.skipped).unwrap();
        assert!(
            note.ends_with("never brought back: .pytest_cache/ (2 entries, 9 bytes), src/__pycache__/ (3 entries, 1000.0 MiB)"),
            "{note}"
        );
    }

    #[test]
    fn reading_stops_at_the_budget() {
        let (_d, manifest) = project();
        let mut p = plan(&manifest, Some(&Listing::new()), SMALL);
        p.budget = 1 << 20;
        let tar = workspace_tar(&[(b"huge.cache.pyc", E::File(&vec![0u8; 4 << 20], 0o644))]);
        let err = read(&tar, &manifest, p).unwrap_err();
        assert!(
            matches!(err, IsolateError::TooMuch { budget } if budget == 1 << 20),
            "{err}"
        );
    }

    #[test]
    fn changed_files_past_the_total_are_skipped_not_held() {
        let manifest = Manifest::default();
        let chunk = vec![9u8; 3000];
        let entries: Vec<(Vec<u8>, E)> = (0..5)
            .map(|i| (format!("f{i}").into_bytes(), E::File(&chunk, 0o644)))
            .collect();
        let refs: Vec<(&[u8], E)> = entries
            .iter()
            .map(|(p, e)| {
                (
                    p.as_slice(),
                    match e {
                        E::File(d, m) => E::File(d, *m),
                        _ => unreachable!(),
                    },
                )
            })
            .collect();
        let set = read(&workspace_tar(&refs), &manifest, plan(&manifest, None, SMALL)).unwrap();
        assert_eq!(set.changes.len(), 4, "4 x 3000 bytes fit in 12000");
        assert!(matches!(set.skipped[0].why, Skip::OverTotal { .. }) && set.skipped[0].blocks_apply());
    }
}
