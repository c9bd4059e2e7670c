//! What git on the host would make of a directory: which entries are repositories, which
//! config files it reads for them (includes, worktree common directories, the user's own), and
//! which paths those configs name — the things that decide what git *runs*.
//!
//! Recognition is a superset of git's own (`setup.c`: `is_git_directory`, `read_gitfile`): a
//! false positive costs a read-only mount or a quarantine, a false negative costs the user's
//! machine. Every read is of a regular file, bounded, without following the file itself if it
//! is a link (see [`read_small`]).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// What the sandbox's git reads of a linked worktree's repository. The host side decides which
/// exist and may be mounted (`hostscan::git::linked_git`); the sandbox's policy decides where,
/// always read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitPiece {
    /// The common directory's: `HEAD`, `objects/`, `refs/`, `packed-refs`, `shallow`,
    /// `reftable/`.
    Head,
    Objects,
    Refs,
    PackedRefs,
    Shallow,
    Reftable,
    /// A linked worktree's own git directory (`C/worktrees/NAME`: its HEAD, index, logs).
    Worktree,
    /// Its `config.worktree`: hidden under an empty file, never mounted.
    WorktreeConfig,
    /// A submodule's index (its git directory is the common one).
    Index,
}

/// The worktree's own directory inside, under the common one as git lays it out, so that its
/// `commondir` (`../..`) leads there.
const GIT_WORKTREE: &str = "worktrees/workspace";

impl GitPiece {
    /// Where it is in the git directory seen inside (as git lays a worktree's out).
    pub fn rel(self) -> &'static str {
        match self {
            GitPiece::Head => "HEAD",
            GitPiece::Objects => "objects",
            GitPiece::Refs => "refs",
            GitPiece::PackedRefs => "packed-refs",
            GitPiece::Shallow => "shallow",
            GitPiece::Reftable => "reftable",
            GitPiece::Worktree => GIT_WORKTREE,
            GitPiece::WorktreeConfig => "worktrees/workspace/config.worktree",
            GitPiece::Index => "index",
        }
    }

    pub fn is_dir(self) -> bool {
        matches!(
            self,
            GitPiece::Objects | GitPiece::Refs | GitPiece::Reftable | GitPiece::Worktree
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkedGitKind {
    /// `gitdir: C/worktrees/NAME`.
    Worktree,
    /// `gitdir: S/modules/NAME`: a repository of its own, kept in its superproject's.
    Submodule,
}

/// A linked worktree's (or submodule's) repository as the sandbox gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkedGit {
    pub kind: LinkedGitKind,
    /// Host paths, each mounted read-only (where: the sandbox's policy).
    pub pieces: Vec<(GitPiece, PathBuf)>,
    /// The config git reads inside, at `GIT_ROOT/config`: written by agentbox, never the
    /// repository's.
    pub config: String,
}

/// Largest config (or `.git` file, `commondir`) read; git's own are a few KiB.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// git stops following includes at depth 10.
const MAX_INCLUDE_DEPTH: usize = 10;

/// The hooks git runs (githooks(5)), plus the names hook managers install.
pub(crate) const HOOK_NAMES: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
];

/// Config files of hook managers that decide what their installed hooks run. While a
/// repository has active hooks, these are kept read-only in the sandbox.
pub(crate) const HOOK_MANAGER_CONFIGS: &[&str] = &[
    ".pre-commit-config.yaml",
    ".pre-commit-config.yml",
    "lefthook.yml",
    "lefthook.yaml",
    ".lefthook.yml",
    ".lefthook.yaml",
    "lefthook-local.yml",
    ".lefthook-local.yml",
    ".overcommit.yml",
    ".simple-git-hooks.json",
    ".simple-git-hooks.cjs",
    ".simple-git-hooks.js",
    "simple-git-hooks.json",
];

pub(crate) fn is_git_name(name: &OsStr) -> bool {
    // Case-insensitively: on a case-insensitive file system `.GIT` is `.git`.
    name.to_str().is_some_and(|n| n.eq_ignore_ascii_case(".git"))
}

/// Would git take a directory with these entry names for a git directory? git checks `HEAD`
/// (a file, or a link into `refs/`, even a dangling one), then `objects/` and `refs/` — found
/// through `commondir` when there is one, and through links. Names only, seen one at a time as
/// a directory is listed; a link counts whatever it points at. Case-insensitively, as a
/// case-insensitive file system would serve them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct GitDirShape {
    head: bool,
    objects: bool,
    refs: bool,
    commondir: bool,
}

impl GitDirShape {
    pub fn see(&mut self, name: &OsStr) {
        let Some(n) = name.to_str() else { return };
        match n.to_ascii_lowercase().as_str() {
            "head" => self.head = true,
            "objects" => self.objects = true,
            "refs" => self.refs = true,
            "commondir" => self.commondir = true,
            _ => {}
        }
    }

    pub(crate) fn is_git_dir(&self) -> bool {
        self.head && ((self.objects && self.refs) || self.commondir)
    }
}

pub fn names_look_like_git_dir<'a>(names: impl IntoIterator<Item = &'a OsStr>) -> bool {
    let mut shape = GitDirShape::default();
    for n in names {
        shape.see(n);
    }
    shape.is_git_dir()
}

/// Up to `MAX_CONFIG_BYTES` of `path` if it is a regular file. Nothing else is ever opened
/// (a FIFO, a device: opening one can block, or act): the type is checked with `lstat` first,
/// the final component is not followed (`O_NOFOLLOW`), nothing can block or become a
/// controlling terminal (`O_NONBLOCK`, `O_NOCTTY`), and the open descriptor must be the very
/// file that was checked.
pub fn read_small(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let checked = path.symlink_metadata().ok()?;
    if !checked.is_file() {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let opened = file.metadata().ok()?;
    if !opened.is_file() || (opened.dev(), opened.ino()) != (checked.dev(), checked.ino()) {
        return None;
    }
    let mut data = Vec::new();
    file.take(MAX_CONFIG_BYTES).read_to_end(&mut data).ok()?;
    Some(data)
}

/// [`read_small`], but following links: for files git itself reads through links (a `.git`
/// link, a config reached through one). Still regular files only.
fn read_small_following(path: &Path) -> Option<Vec<u8>> {
    let real = path.canonicalize().ok()?;
    read_small(&real)
}

/// `gitdir: PATH` of a `.git` file, resolved against the file's directory as git does.
pub(crate) fn gitdir_of_file(dot_git: &Path, data: &[u8]) -> Option<PathBuf> {
    let text = std::str::from_utf8(data).ok()?;
    let target = text.strip_prefix("gitdir:")?.trim();
    if target.is_empty() {
        return None;
    }
    Some(resolve(&dot_git.parent()?.join(target)))
}

/// Why a project's `.git` file is not followed into the sandbox: told to the user, for git will
/// not work inside.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{git_file}: git will not work inside the sandbox (`fatal: not a git repository`): {why}")]
pub struct NotFollowed {
    /// The `.git` file, quoted for a terminal.
    pub git_file: String,
    pub why: String,
}

/// The reason one step of following a `.git` file failed, in the words [`NotFollowed`] shows.
struct Why(String);

impl From<&str> for Why {
    fn from(s: &str) -> Self {
        Why(s.to_owned())
    }
}

impl From<String> for Why {
    fn from(s: String) -> Self {
        Why(s)
    }
}

/// What the sandbox is given of the repository a project's `.git` file names, outside the
/// project: [`LinkedGit`] when the rule below holds, else why not (told to the user: git will
/// not work inside). `None` when the project's `.git` is no file (a directory, or none).
///
/// The `.git` file is the repository's word, and the sandbox's to have planted in an earlier
/// session: it is followed only to a repository that points back at this project —
/// - a linked worktree: `gitdir:` names `C/worktrees/NAME`, whose `commondir` resolves to
///   `C`, a git directory, and whose `gitdir` back-pointer names this project's `.git`;
/// - a submodule's checkout: `gitdir:` names `S/modules/NAME` (a git directory of its own, no
///   `commondir`), whose config's `core.worktree` names this project;
///
/// every directory and file on the way a real one (no symbolic link anywhere: the path as
/// written must be the path the kernel reaches), and everything mounted owned by `uid`, the
/// project's owner, whom the sandbox runs as. A `.git` file naming a directory of the project
/// needs nothing: the project, with its git metadata read-only, is mounted already.
pub fn linked_git(project: &Path, uid: u32) -> Option<Result<LinkedGit, NotFollowed>> {
    let dot_git = project.join(".git");
    if !dot_git.symlink_metadata().ok()?.is_file() {
        return None;
    }
    let shown = || crate::hostscan::quote(&dot_git);
    let refuse = |why: String| {
        Some(Err(NotFollowed {
            git_file: shown(),
            why,
        }))
    };
    let Some(data) = read_small(&dot_git) else {
        return refuse("it cannot be read".into());
    };
    let Some(written) = gitdir_written(&data) else {
        return refuse("it has no `gitdir:` line".into());
    };
    let joined = project.join(&written);
    let target = lexical(&joined);
    let q = |p: &Path| crate::hostscan::quote(p);
    if let Some(rel) = lexical_rel(project, &target) {
        // Inside the project: mounted with it, and found there if the path is relative.
        return if Path::new(&written).is_absolute() {
            refuse(format!(
                "its `gitdir:` names {} by an absolute path, which does not exist inside the sandbox \
                 (the project is at /workspace); write it relative: `gitdir: {}`",
                q(&target),
                q(&rel)
            ))
        } else {
            None
        };
    }
    match follow_linked(project, &joined, &target, uid) {
        Ok(linked) => Some(Ok(linked)),
        Err(Why(why)) => refuse(format!("its `gitdir:` names {}, {why}", q(&target))),
    }
}

fn follow_linked(project: &Path, joined: &Path, target: &Path, uid: u32) -> Result<LinkedGit, Why> {
    no_link_on_the_way(joined, target)?;
    owned_dir(target, uid)?;
    let parent = target.parent().unwrap_or(target);
    let container = parent.file_name().and_then(OsStr::to_str);
    let commondir = target.join("commondir");
    let (kind, common) = if commondir.symlink_metadata().is_ok() {
        if container != Some("worktrees") {
            return Err(
                "which has a `commondir` but is not a `worktrees/NAME` directory of a repository".into(),
            );
        }
        let common = parent.parent().unwrap_or(parent).to_path_buf();
        let text = read_text(&commondir).ok_or("whose `commondir` is not a small regular file")?;
        let named = lexical(&target.join(text.trim()));
        if named != common || no_link_on_the_way(&target.join(text.trim()), &named).is_err() {
            return Err("whose `commondir` does not name the repository it is in".into());
        }
        let back = read_text(&target.join("gitdir"))
            .ok_or("which has no `gitdir` file naming its worktree: not a linked worktree")?;
        if lexical(&target.join(back.trim())) != project.join(".git") {
            return Err(format!(
                "a worktree of another checkout: its `gitdir` file names {}, not this project",
                crate::hostscan::quote(Path::new(back.trim()))
            )
            .into());
        }
        (LinkedGitKind::Worktree, common)
    } else {
        // A submodule's git directory: `S/modules/NAME`, NAME possibly with slashes.
        if !target
            .ancestors()
            .skip(1)
            .any(|a| a.file_name() == Some(OsStr::new("modules")))
        {
            return Err(
                "which is neither a linked worktree (`C/worktrees/NAME`) nor a submodule's repository \
                 (`S/modules/NAME`)"
                    .into(),
            );
        }
        let config = read_text(&target.join("config")).unwrap_or_default();
        let worktree = parse_config(&config)
            .into_iter()
            .filter(|e| e.is("core", "worktree"))
            .filter_map(|e| e.value)
            .next_back()
            .ok_or("a repository with no `core.worktree`: not this project's submodule")?;
        if lexical(&target.join(&worktree)) != project {
            return Err("a repository whose `core.worktree` is not this project".into());
        }
        (LinkedGitKind::Submodule, target.to_path_buf())
    };
    owned_dir(&common, uid)?;
    let mut pieces = Vec::new();
    let mut wanted = vec![
        (Some(GitPiece::Head), common.join("HEAD"), false, true),
        (Some(GitPiece::Objects), common.join("objects"), true, true),
        (Some(GitPiece::Refs), common.join("refs"), true, true),
        (
            Some(GitPiece::PackedRefs),
            common.join("packed-refs"),
            false,
            false,
        ),
        (Some(GitPiece::Shallow), common.join("shallow"), false, false),
        (Some(GitPiece::Reftable), common.join("reftable"), true, false),
    ];
    match kind {
        LinkedGitKind::Worktree => wanted.extend([
            // Checked, not mounted by itself: it comes with the worktree's directory.
            (None, target.join("HEAD"), false, true),
            (Some(GitPiece::Worktree), target.to_path_buf(), true, true),
            // Seen inside as an empty file: it is config, the repository's to hold secrets in.
            (
                Some(GitPiece::WorktreeConfig),
                target.join("config.worktree"),
                false,
                false,
            ),
        ]),
        LinkedGitKind::Submodule => wanted.push((Some(GitPiece::Index), target.join("index"), false, false)),
    }
    for (piece, path, dir, required) in wanted {
        use std::os::unix::fs::MetadataExt;
        let q = crate::hostscan::quote(&path);
        let Ok(m) = path.symlink_metadata() else {
            if required {
                return Err(format!("which lacks {q}").into());
            }
            continue;
        };
        let right_type = if dir { m.is_dir() } else { m.is_file() };
        if !right_type || m.uid() != uid {
            return Err(format!(
                "whose {q} is not a {} of the project's owner",
                if dir { "directory" } else { "regular file" }
            )
            .into());
        }
        if let Some(p) = piece {
            pieces.push((p, path));
        }
    }
    let config = read_text(&common.join("config")).unwrap_or_default();
    Ok(LinkedGit {
        kind,
        pieces,
        config: synthesised_config(&parse_config(&config)),
    })
}

/// The config git reads inside: only what says how to read the repository (its format, the
/// object and ref formats, how the checkout's files compare), each value a plain word. Never
/// the repository's own: it can hold credentials (`http.extraheader`), commands (aliases,
/// `core.fsmonitor`), and paths of the host.
fn synthesised_config(entries: &[ConfigEntry]) -> String {
    const CORE: &[&str] = &[
        "repositoryformatversion",
        "filemode",
        "ignorecase",
        "symlinks",
        "precomposeunicode",
        "autocrlf",
        "eol",
        "checkstat",
        "trustctime",
    ];
    const EXTENSIONS: &[&str] = &["objectformat", "refstorage", "compatobjectformat"];
    let plain = |v: &str| {
        !v.is_empty()
            && v.len() <= 32
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let mut out = String::from("# Written by agentbox: not the repository's own config.\n");
    for (section, keys) in [("core", CORE), ("extensions", EXTENSIONS)] {
        let mut lines = Vec::new();
        for key in keys {
            let last = entries
                .iter()
                .filter(|e| e.section == section && e.subsection.is_none() && e.key == *key)
                .filter_map(|e| e.value.as_deref())
                .next_back();
            if let Some(v) = last.filter(|v| plain(v)) {
                lines.push(format!("\t{key} = {v}\n"));
            }
        }
        if !lines.is_empty() {
            out.push_str(&format!("[{section}]\n"));
            out.extend(lines);
        }
    }
    out
}

/// The path a `.git` file names, as written.
fn gitdir_written(data: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(data).ok()?;
    let target = text.strip_prefix("gitdir:")?.trim();
    (!target.is_empty()).then(|| target.to_string())
}

fn read_text(path: &Path) -> Option<String> {
    read_small(path).and_then(|d| String::from_utf8(d).ok())
}

/// `path` with `.` and `..` taken away by name, no file system access.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `Ok` when `joined` (a path as written, `..` and all) reaches `lexical` (its lexical form)
/// through real directories only: no component is a link, and the kernel, resolving `..` its
/// own way, arrives at the same place.
fn no_link_on_the_way(joined: &Path, lexical: &Path) -> Result<(), Why> {
    let mut cur = PathBuf::new();
    for c in lexical.components() {
        cur.push(c);
        if cur.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "reached through the symbolic link {}",
                crate::hostscan::quote(&cur)
            )
            .into());
        }
    }
    match joined.canonicalize() {
        Ok(real) if real == lexical => Ok(()),
        Ok(_) => Err("reached through a symbolic link".into()),
        Err(_) => Err("which does not exist".into()),
    }
}

fn owned_dir(dir: &Path, uid: u32) -> Result<(), Why> {
    use std::os::unix::fs::MetadataExt;
    match dir.symlink_metadata() {
        Ok(m) if m.is_dir() && m.uid() == uid => Ok(()),
        Ok(m) if m.is_dir() => Err(format!(
            "a directory of another user (uid {}; the project's owner is {uid})",
            m.uid()
        )
        .into()),
        Ok(_) => Err("which is not a directory".into()),
        Err(_) => Err("which does not exist".into()),
    }
}

/// One `section.subsection.key = value` of a config file. Section and key are lower-cased (git
/// compares them case-insensitively); the subsection is kept as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigEntry {
    pub section: String,
    pub subsection: Option<String>,
    pub key: String,
    /// `None` for a bare `key` (boolean true).
    pub value: Option<String>,
}

impl ConfigEntry {
    fn is(&self, section: &str, key: &str) -> bool {
        self.section == section && self.key == key
    }
}

/// git's config syntax (git-config(1), "Syntax"): sections `[s]`, `[s "sub"]` and the old
/// `[s.sub]`; `#` and `;` comments outside quotes; values with `"` quoting, `\` escapes and
/// `\`-newline continuations. Lines git would reject are skipped, not fatal: a hostile file
/// must not hide the rest of itself from us by one bad line.
pub(crate) fn parse_config(text: &str) -> Vec<ConfigEntry> {
    let mut out = Vec::new();
    let (mut section, mut subsection) = (String::new(), None::<String>);
    let mut chars = text.chars().peekable();
    loop {
        // Skip blank space at the start of a line.
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&c) = chars.peek() else { break };
        if c == '#' || c == ';' {
            skip_line(&mut chars);
            continue;
        }
        if c == '[' {
            chars.next();
            let mut header = String::new();
            let mut sub = None;
            while let Some(c) = chars.next() {
                match c {
                    ']' => break,
                    '"' => {
                        let mut s = String::new();
                        while let Some(c) = chars.next() {
                            match c {
                                '"' => break,
                                '\\' => {
                                    if let Some(e) = chars.next() {
                                        s.push(e);
                                    }
                                }
                                '\n' => break,
                                c => s.push(c),
                            }
                        }
                        sub = Some(s);
                    }
                    '\n' => break,
                    c => header.push(c),
                }
            }
            let header = header.trim();
            match (sub, header.split_once('.')) {
                (Some(s), _) => {
                    section = header.to_ascii_lowercase();
                    subsection = Some(s);
                }
                (None, Some((s, rest))) => {
                    section = s.to_ascii_lowercase();
                    subsection = Some(rest.to_string());
                }
                (None, None) => {
                    section = header.to_ascii_lowercase();
                    subsection = None;
                }
            }
            continue;
        }
        // key [= value]
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '-' {
                key.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if key.is_empty() {
            skip_line(&mut chars);
            continue;
        }
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        let value = match chars.peek() {
            Some('=') => {
                chars.next();
                Some(parse_value(&mut chars))
            }
            _ => {
                skip_line(&mut chars);
                None
            }
        };
        out.push(ConfigEntry {
            section: section.clone(),
            subsection: subsection.clone(),
            key: key.to_ascii_lowercase(),
            value,
        });
    }
    out
}

fn skip_line(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    for c in chars.by_ref() {
        if c == '\n' {
            break;
        }
    }
}

fn parse_value(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut value = String::new();
    let mut quoted = false;
    // Whitespace outside quotes is kept only between words: trailing blanks are dropped.
    let mut pending_space = String::new();
    while let Some(c) = chars.next() {
        match c {
            '\n' => break,
            '"' => {
                quoted = !quoted;
                value.push_str(&std::mem::take(&mut pending_space));
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some('n') => value.push('\n'),
                Some('t') => value.push('\t'),
                Some('b') => {
                    value.pop();
                }
                Some(e) => {
                    value.push_str(&std::mem::take(&mut pending_space));
                    value.push(e);
                }
                None => break,
            },
            '#' | ';' if !quoted => {
                skip_line(chars);
                break;
            }
            c if c.is_whitespace() && !quoted => {
                if !value.is_empty() {
                    pending_space.push(c);
                }
            }
            c => {
                value.push_str(&std::mem::take(&mut pending_space));
                value.push(c);
            }
        }
    }
    value
}

/// One config file git reads for a repository, parsed, with where it came from.
#[derive(Debug)]
pub(crate) struct ConfigFile {
    pub path: PathBuf,
    pub entries: Vec<ConfigEntry>,
}

/// Read `path` and, recursively, every file its `include.path` / `includeIf.*.path` names
/// (every condition taken as true: a superset). Include paths are relative to the including
/// file's directory; `~/` is the user's home. Missing files are recorded in `absent` (the
/// sandbox could create one inside the project).
pub(crate) fn read_with_includes(path: &Path, out: &mut Vec<ConfigFile>, absent: &mut BTreeSet<PathBuf>) {
    read_with_includes_at(path, 0, out, absent)
}

fn read_with_includes_at(
    path: &Path,
    depth: usize,
    out: &mut Vec<ConfigFile>,
    absent: &mut BTreeSet<PathBuf>,
) {
    if depth > MAX_INCLUDE_DEPTH || out.iter().any(|f| f.path == path) {
        return;
    }
    let Some(data) = read_small_following(path) else {
        if path.symlink_metadata().is_err() {
            absent.insert(path.to_path_buf());
        }
        return;
    };
    let entries = parse_config(&String::from_utf8_lossy(&data));
    let includes: Vec<PathBuf> = entries
        .iter()
        .filter(|e| (e.section == "include" || e.section == "includeif") && e.key == "path")
        .filter_map(|e| e.value.as_deref())
        .filter_map(|v| expand_path(v, path.parent()))
        .collect();
    out.push(ConfigFile {
        path: path.to_path_buf(),
        entries,
    });
    for inc in includes {
        read_with_includes_at(&inc, depth + 1, out, absent);
    }
}

/// A config path value as git resolves it: `~/` from the home directory, relative ones from
/// `base`; then [`resolve`]d.
fn expand_path(value: &str, base: Option<&Path>) -> Option<PathBuf> {
    if value.is_empty() {
        return None;
    }
    if let Some(rest) = value.strip_prefix("~/") {
        return std::env::var_os("HOME").map(|h| resolve(&PathBuf::from(h).join(rest)));
    }
    let p = Path::new(value);
    if p.is_absolute() {
        Some(resolve(p))
    } else {
        base.map(|b| resolve(&b.join(p)))
    }
}

/// Where `path` is on the file system, the way git's own lookups would reach it: the real
/// path of its directory (links followed, as the kernel follows them for git) and its last
/// component as written, so a missing file still gets a comparable name. Lexical when even
/// the directory does not exist.
pub fn resolve(path: &Path) -> PathBuf {
    if path.file_name().is_none()
        && let Ok(real) = path.canonicalize()
    {
        // It ends in `..` or `.`: a directory, reached the kernel's way.
        return real;
    }
    if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
        && let Ok(real) = parent.canonicalize()
    {
        return real.join(name);
    }
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The config files git reads for every repository, besides the repository's own: the system
/// file and the user's (`~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`). A relative
/// `core.hooksPath` there names a directory inside every worktree.
pub(crate) fn user_config_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if std::env::var_os("GIT_CONFIG_NOSYSTEM").is_none() {
        paths.push(
            std::env::var_os("GIT_CONFIG_SYSTEM")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/etc/gitconfig")),
        );
    }
    if let Some(g) = std::env::var_os("GIT_CONFIG_GLOBAL") {
        paths.push(PathBuf::from(g));
    } else {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let xdg = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".config")));
        if let Some(x) = xdg {
            paths.push(x.join("git/config"));
        }
        if let Some(h) = home {
            paths.push(h.join(".gitconfig"));
        }
    }
    paths
}

/// A repository found in the project, as git would use it.
#[derive(Debug, Default)]
pub(crate) struct Repo {
    /// The git directory (may lie outside the project, e.g. a linked worktree's).
    pub git_dir: Option<PathBuf>,
    /// The directory holding `objects/`, `refs/`, shared config and the default hooks.
    pub common_dir: Option<PathBuf>,
    /// Where hooks and relative paths of commands are run from: the worktree's top for a
    /// `.git` entry, the git directory for a bare repository.
    pub run_dir: PathBuf,
    /// Every config git reads for it, includes followed.
    pub configs: Vec<ConfigFile>,
    /// Config files named (by includes) that do not exist.
    pub absent_configs: BTreeSet<PathBuf>,
}

impl Repo {
    /// `entry` is a `.git` of any type, or a directory shaped like a git directory.
    pub fn open(entry: &Path, user_configs: &[PathBuf]) -> Repo {
        let named_git = entry.file_name().is_some_and(is_git_name);
        let git_dir = if !named_git {
            Some(entry.to_path_buf())
        } else {
            match entry.symlink_metadata() {
                Ok(m) if m.is_dir() => Some(entry.to_path_buf()),
                Ok(m) if m.is_file() => read_small(entry).and_then(|d| gitdir_of_file(entry, &d)),
                // A link: git follows it to a directory, or to a `gitdir:` file.
                Ok(m) if m.file_type().is_symlink() => match entry.canonicalize() {
                    Ok(real) if real.is_dir() => Some(real),
                    Ok(real) => read_small(&real).and_then(|d| gitdir_of_file(&real, &d)),
                    Err(_) => None,
                },
                _ => None,
            }
        };
        let run_dir = if named_git {
            entry.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            entry.to_path_buf()
        };
        let common_dir = git_dir.as_ref().map(|g| {
            read_small_following(&g.join("commondir"))
                .and_then(|d| {
                    let t = String::from_utf8_lossy(&d).trim().to_string();
                    (!t.is_empty()).then(|| resolve(&g.join(t)))
                })
                .unwrap_or_else(|| g.clone())
        });
        let mut repo = Repo {
            git_dir: git_dir.clone(),
            common_dir: common_dir.clone(),
            run_dir,
            ..Default::default()
        };
        let mut files: Vec<PathBuf> = user_configs.to_vec();
        if let Some(c) = &common_dir {
            files.push(c.join("config"));
        }
        if let Some(g) = &git_dir {
            files.push(g.join("config.worktree"));
            if common_dir.as_ref() != Some(g) {
                files.push(g.join("config"));
            }
        }
        for f in files {
            read_with_includes(&f, &mut repo.configs, &mut repo.absent_configs);
        }
        repo
    }

    fn entries(&self) -> impl Iterator<Item = (&ConfigFile, &ConfigEntry)> {
        self.configs
            .iter()
            .flat_map(|f| f.entries.iter().map(move |e| (f, e)))
    }

    /// The directory git runs hooks from: `core.hooksPath` (the last one set wins, as in git;
    /// relative to where hooks run), else `hooks/` of the common directory.
    pub(crate) fn hooks_dir(&self) -> Option<PathBuf> {
        let set = self
            .entries()
            .filter(|(_, e)| e.is("core", "hookspath"))
            .filter_map(|(_, e)| e.value.as_deref())
            .last();
        match set {
            Some(v) => expand_path(v, Some(&self.run_dir)),
            None => self.common_dir.as_ref().map(|c| c.join("hooks")),
        }
    }

    /// Every path a config value could name: each word of each value, tried from where git or
    /// the command it runs would resolve it (the worktree's top, the git directory, the
    /// config file's own directory). A superset: most values name no file at all, and only
    /// those that exist, or look like a path, are kept by the caller.
    pub(crate) fn named_paths(&self) -> Vec<(PathBuf, bool)> {
        let mut out = Vec::new();
        for (file, e) in self.entries() {
            let Some(value) = e.value.as_deref() else { continue };
            let is_path_key = e.is("core", "hookspath")
                || ((e.section == "include" || e.section == "includeif") && e.key == "path");
            let mut bases: Vec<&Path> = vec![&self.run_dir];
            if let Some(g) = &self.git_dir {
                bases.push(g);
            }
            if let Some(d) = file.path.parent() {
                bases.push(d);
            }
            let words: Vec<&str> = if is_path_key {
                vec![value]
            } else {
                value
                    // `!` starts a shell command (`alias.x = !./run.sh`, `credential.helper`).
                    .split(|c: char| c.is_whitespace() || "'\"`;|&()<>$=!".contains(c))
                    .filter(|w| !w.is_empty() && !w.starts_with('-') && !w.contains("://"))
                    .collect()
            };
            for w in words {
                let looks_like_path = is_path_key || w.contains('/');
                for b in &bases {
                    if let Some(p) = expand_path(w, Some(b)) {
                        out.push((p, looks_like_path));
                    }
                }
            }
        }
        out
    }
}

/// The repository a project sits in, when it is not one itself (a monorepo's subdirectory): git
/// run there finds it by walking up, as [`enclosing_repo`] does, and runs its hooks and its
/// config's commands from its top — which may name paths inside the project.
pub(crate) fn enclosing_repo(project: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = project.metadata().ok()?.dev();
    let mut dir = project.parent();
    while let Some(d) = dir {
        // git stops at a file system boundary unless told otherwise.
        if d.metadata().ok()?.dev() != dev {
            return None;
        }
        let dot_git = d.join(".git");
        if dot_git.symlink_metadata().is_ok() {
            return Some(dot_git);
        }
        let names: Vec<std::ffi::OsString> = ["HEAD", "objects", "refs", "commondir"]
            .iter()
            .filter(|n| d.join(n).symlink_metadata().is_ok())
            .map(std::ffi::OsString::from)
            .collect();
        if names_look_like_git_dir(names.iter().map(|n| n.as_os_str())) {
            return Some(d.to_path_buf());
        }
        dir = d.parent();
    }
    None
}

/// `path` made relative to `project` lexically (no file system access): `None` when it leaves
/// the project or is the project itself.
pub(crate) fn lexical_rel(project: &Path, path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let rest = path.strip_prefix(project).ok()?;
    for c in rest.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(section: &str, sub: Option<&str>, key: &str, value: Option<&str>) -> ConfigEntry {
        ConfigEntry {
            section: section.into(),
            subsection: sub.map(String::from),
            key: key.into(),
            value: value.map(String::from),
        }
    }

    #[test]
    fn config_syntax_as_git_reads_it() {
        let text = "# comment\n[core]\n\tbare = false\n\tfsmonitor = \"touch PWNED; false\" ; trailing\n\
                    [Core]HooksPath=.husky/_\n[includeIf \"gitdir:~/x/\"]\n  path = ../extra # c\n\
                    [remote.origin]\n url = a\\\n b\n[alias]\n\tfilebare\n\tx = \"a\\\"b\\\\c\"\n";
        let got = parse_config(text);
        assert_eq!(
            got,
            [
                entry("core", None, "bare", Some("false")),
                entry("core", None, "fsmonitor", Some("touch PWNED; false")),
                entry("core", None, "hookspath", Some(".husky/_")),
                entry("includeif", Some("gitdir:~/x/"), "path", Some("../extra")),
                entry("remote", Some("origin"), "url", Some("a b")),
                entry("alias", None, "filebare", None),
                entry("alias", None, "x", Some("a\"b\\c")),
            ]
        );
    }

    #[test]
    fn a_directory_is_a_git_directory_when_git_would_take_it() {
        let n = |names: &[&str]| names_look_like_git_dir(names.iter().map(OsStr::new));
        assert!(n(&["HEAD", "objects", "refs", "config"]));
        assert!(n(&["HEAD", "commondir"]), "a linked worktree's git dir");
        assert!(!n(&["HEAD", "objects"]));
        assert!(!n(&["objects", "refs"]));
    }

    #[test]
    fn includes_worktree_common_dirs_and_gitdir_files_are_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        // A linked worktree: `wt/.git` is a gitdir file; its git dir has a commondir whose
        // config includes a file that sets the hooks path.
        std::fs::create_dir_all(root.join("main/.git/worktrees/wt")).unwrap();
        std::fs::create_dir_all(root.join("wt")).unwrap();
        std::fs::write(root.join("wt/.git"), "gitdir: ../main/.git/worktrees/wt\n").unwrap();
        std::fs::write(root.join("main/.git/worktrees/wt/commondir"), "../..\n").unwrap();
        std::fs::write(
            root.join("main/.git/config"),
            "[include]\n\tpath = ../../inc.cfg\n",
        )
        .unwrap();
        std::fs::write(
            root.join("inc.cfg"),
            "[core]\n\thooksPath = hooks-here\n[include]\npath=nope.cfg",
        )
        .unwrap();
        let repo = Repo::open(&root.join("wt/.git"), &[]);
        assert_eq!(repo.common_dir, Some(root.join("main/.git")));
        assert_eq!(repo.hooks_dir(), Some(root.join("wt/hooks-here")));
        assert!(
            repo.absent_configs.contains(&root.join("nope.cfg")),
            "{:?}",
            repo.absent_configs
        );
    }

    #[test]
    fn small_reads_refuse_links_and_fifos() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(
            read_small(&fifo).is_none(),
            "a FIFO is not read (and does not block)"
        );
        std::fs::write(d.path().join("f"), "x").unwrap();
        std::os::unix::fs::symlink("f", d.path().join("l")).unwrap();
        assert!(read_small(&d.path().join("l")).is_none());
        assert_eq!(read_small(&d.path().join("f")).unwrap(), b"x");
    }

    fn git(dir: &Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t.invalid",
                "-c",
                "protocol.file.allow=always",
            ])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn owner(p: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        p.metadata().unwrap().uid()
    }

    /// `root/main` (a repository whose config holds a credential) and its linked worktree
    /// `root/wt`.
    fn worktree() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("main")).unwrap();
        git(&root.join("main"), &["init", "-q"]);
        std::fs::write(root.join("main/x"), "x").unwrap();
        git(&root.join("main"), &["add", "x"]);
        git(&root.join("main"), &["commit", "-qm", "x"]);
        git(
            &root.join("main"),
            &["config", "http.extraheader", "Authorization: Bearer SECRET"],
        );
        git(&root.join("main"), &["worktree", "add", "-q", "../wt"]);
        (d, root)
    }

    #[test]
    fn a_linked_worktree_gets_what_git_reads_and_never_the_repositorys_config() {
        let (_d, root) = worktree();
        let wt = root.join("wt");
        let linked = linked_git(&wt, owner(&wt)).unwrap().unwrap();
        assert_eq!(linked.kind, LinkedGitKind::Worktree);
        let git = root.join("main/.git");
        let want = [
            (GitPiece::Head, git.join("HEAD")),
            (GitPiece::Objects, git.join("objects")),
            (GitPiece::Refs, git.join("refs")),
            (GitPiece::Worktree, git.join("worktrees/wt")),
        ];
        assert_eq!(linked.pieces, want);
        assert!(!linked.config.contains("SECRET"), "{}", linked.config);
        assert!(
            linked.config.contains("repositoryformatversion = 0"),
            "{}",
            linked.config
        );
        // A project elsewhere whose `.git` names that worktree: not its own.
        let other = root.join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::copy(wt.join(".git"), other.join(".git")).unwrap();
        let why = linked_git(&other, owner(&other))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(why.contains("another checkout"), "{why}");
        // Another user's repository.
        let why = linked_git(&wt, owner(&wt) + 1).unwrap().unwrap_err().to_string();
        assert!(why.contains("another user"), "{why}");
    }

    #[test]
    fn a_git_file_naming_anything_else_is_not_followed() {
        let (_d, root) = worktree();
        // `~/.ssh`, in a stand-in home.
        let home = root.join("home");
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), "KEY").unwrap();
        let p = root.join("p");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(
            p.join(".git"),
            format!("gitdir: {}\n", home.join(".ssh").display()),
        )
        .unwrap();
        let why = linked_git(&p, owner(&p)).unwrap().unwrap_err().to_string();
        assert!(
            why.contains("git will not work inside") && why.contains("neither"),
            "{why}"
        );
        // The worktree itself, reached through a link on the way.
        std::os::unix::fs::symlink(root.join("main"), root.join("alias")).unwrap();
        let wt = root.join("wt");
        std::fs::write(
            wt.join(".git"),
            format!("gitdir: {}\n", root.join("alias/.git/worktrees/wt").display()),
        )
        .unwrap();
        let why = linked_git(&wt, owner(&wt)).unwrap().unwrap_err().to_string();
        assert!(why.contains("symbolic link"), "{why}");
        // Inside the project: mounted with it when relative, unreachable when absolute.
        std::fs::create_dir_all(p.join("real/objects")).unwrap();
        std::fs::write(p.join(".git"), "gitdir: real\n").unwrap();
        assert!(linked_git(&p, owner(&p)).is_none());
        std::fs::write(p.join(".git"), format!("gitdir: {}\n", p.join("real").display())).unwrap();
        let why = linked_git(&p, owner(&p)).unwrap().unwrap_err().to_string();
        assert!(why.contains("gitdir: real"), "{why}");
        // A directory: nothing to follow.
        assert!(linked_git(&root.join("main"), owner(&p)).is_none());
    }

    #[test]
    fn a_submodules_checkout_gets_its_repository() {
        let (_d, root) = worktree();
        git(&root.join("main"), &["submodule", "add", "-q", "./", "sub"]);
        let sub = root.join("main/sub");
        let linked = linked_git(&sub, owner(&sub)).unwrap().unwrap();
        assert_eq!(linked.kind, LinkedGitKind::Submodule);
        assert!(
            linked
                .pieces
                .contains(&(GitPiece::Index, root.join("main/.git/modules/sub/index"))),
            "{:?}",
            linked.pieces
        );
        assert!(!linked.config.contains("worktree"), "{}", linked.config);
        // Another directory with the same `.git` file: the repository's worktree is elsewhere.
        let other = root.join("main/other");
        std::fs::create_dir(&other).unwrap();
        std::fs::copy(sub.join(".git"), other.join(".git")).unwrap();
        let why = linked_git(&other, owner(&other))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(why.contains("core.worktree"), "{why}");
    }

    #[test]
    fn lexical_paths_stay_inside() {
        let p = Path::new("/p");
        assert_eq!(lexical_rel(p, Path::new("/p/a/../b")), Some(PathBuf::from("b")));
        assert_eq!(lexical_rel(p, Path::new("/p/a/../../x")), None);
        assert_eq!(lexical_rel(p, Path::new("/p/.")), None);
        assert_eq!(lexical_rel(p, Path::new("/q/a")), None);
    }
}
