//! Where a link leads, resolved the way the kernel would: each component looked up in the tree,
//! every link on the way replaced by its target. A link's text alone says little: `sub/c -> b/..`
//! stays inside by its text, and leaves the project when `sub/b -> ..`. So links are resolved
//! against the tree as it will be after `--apply` (the host project overlaid with the changes),
//! and against the host as it is, to tell a link the changes send outside from one the user
//! already had pointing there.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::Content;
use super::names::RelPath;

/// Linux gives up after 40 links in one lookup (ELOOP); so does this.
const MAX_HOPS: usize = 40;

/// What a tree holds at a path, as far as resolving links goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    Link(Vec<u8>),
    /// A file, or anything else a path cannot go through.
    Other,
    Missing,
}

pub trait Tree {
    /// The node at `path` (components), whose parent the caller found to be a directory.
    fn node(&self, path: &[Vec<u8>]) -> Node;
    /// Whether the node at `path` is a link the user already had, unchanged, that leads
    /// outside by itself.
    fn users_link_leads_out(&self, _path: &[Vec<u8>]) -> bool {
        false
    }
}

/// The host project as it is: `lstat`, never following a link (the walk below never asks
/// about a path whose parent is not a real directory).
pub struct Host<'a> {
    pub root: &'a Path,
}

fn join(root: &Path, path: &[Vec<u8>]) -> std::path::PathBuf {
    let mut p = root.to_path_buf();
    for c in path {
        p.push(std::ffi::OsStr::from_bytes(c));
    }
    p
}

impl Tree for Host<'_> {
    fn node(&self, path: &[Vec<u8>]) -> Node {
        let full = join(self.root, path);
        match std::fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_dir() => Node::Dir,
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&full) {
                Ok(t) => Node::Link(t.as_os_str().as_bytes().to_vec()),
                // Unreadable: assume the worst a link can do.
                Err(_) => Node::Link(b"/".to_vec()),
            },
            Ok(_) => Node::Other,
            Err(_) => Node::Missing,
        }
    }
}

/// The host project with the changes applied: written paths take their new content, deleted
/// ones are gone, and the directories written paths need exist.
pub struct After<'a> {
    pub host: Host<'a>,
    changed: BTreeMap<Vec<Vec<u8>>, Option<&'a Content>>,
    dirs: BTreeSet<Vec<Vec<u8>>>,
}

fn comps(p: &RelPath) -> Vec<Vec<u8>> {
    p.components().map(|c| c.to_vec()).collect()
}

impl<'a> After<'a> {
    pub fn new(
        root: &'a Path,
        changes: impl IntoIterator<Item = (&'a RelPath, Option<&'a Content>)>,
    ) -> Self {
        let mut changed = BTreeMap::new();
        let mut dirs = BTreeSet::new();
        for (path, content) in changes {
            if content.is_some() {
                for a in path.ancestors() {
                    dirs.insert(comps(&a));
                }
            }
            changed.insert(comps(path), content);
        }
        After {
            host: Host { root },
            changed,
            dirs,
        }
    }
}

impl Tree for After<'_> {
    fn node(&self, path: &[Vec<u8>]) -> Node {
        match self.changed.get(path) {
            Some(Some(Content::Symlink(t))) => Node::Link(t.as_os_str().as_bytes().to_vec()),
            Some(Some(Content::File { .. })) => Node::Other,
            Some(None) => Node::Missing,
            None if self.dirs.contains(path) => Node::Dir,
            None => self.host.node(path),
        }
    }

    fn users_link_leads_out(&self, path: &[Vec<u8>]) -> bool {
        if self.changed.contains_key(path) {
            return false;
        }
        match self.host.node(path) {
            Node::Link(target) => walk(&self.host, path[..path.len() - 1].to_vec(), &target, true).is_err(),
            _ => false,
        }
    }
}

/// Why a link leads outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Escape {
    Absolute,
    AboveTheRoot,
    TooManyLinks,
}

fn split(target: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    target
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(|c| c.to_vec())
}

/// Follow the link at `link` (whose text is `target`) through `tree`. `Ok` when it stays
/// inside the project (or ends at a missing path inside: resolved by name from there on, as
/// it would be once created).
/// Every link on the way is followed, the user's own too: a new link that reaches outside
/// through one (`evil -> data/../secret` with the user's `data -> /elsewhere/ds`) leads outside.
pub fn resolve(tree: &dyn Tree, link: &RelPath, target: &[u8]) -> Result<(), Escape> {
    let mut dir = comps(link);
    dir.pop();
    walk(tree, dir, target, false)
}

/// [`resolve`] for a link the user already had: going through another of the user's links
/// that already leads out is the user's choice, not the sandbox's, and adds nothing.
pub(crate) fn resolve_existing(tree: &dyn Tree, link: &RelPath, target: &[u8]) -> Result<(), Escape> {
    let mut dir = comps(link);
    dir.pop();
    walk(tree, dir, target, true)
}

/// Resolve `target` from the directory `here` (components under the root).
fn walk(
    tree: &dyn Tree,
    mut here: Vec<Vec<u8>>,
    target: &[u8],
    users_outward_ok: bool,
) -> Result<(), Escape> {
    if target.starts_with(b"/") {
        return Err(Escape::Absolute);
    }
    let mut pending: VecDeque<Vec<u8>> = split(target).collect();
    let mut hops = 0;
    while let Some(c) = pending.pop_front() {
        if c == b".." {
            if here.pop().is_none() {
                return Err(Escape::AboveTheRoot);
            }
            continue;
        }
        here.push(c);
        if let Node::Link(next) = tree.node(&here) {
            if users_outward_ok && tree.users_link_leads_out(&here) {
                return Ok(());
            }
            here.pop();
            hops += 1;
            if hops > MAX_HOPS {
                return Err(Escape::TooManyLinks);
            }
            if next.starts_with(b"/") {
                return Err(Escape::Absolute);
            }
            for c in split(&next).rev() {
                pending.push_front(c);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn link(t: &str) -> Content {
        Content::Symlink(t.into())
    }

    fn file() -> Content {
        Content::File {
            data: b"x".to_vec(),
            mode: 0o644,
        }
    }

    #[test]
    fn a_chain_of_links_each_inside_by_its_text_is_followed_out() {
        let d = tempfile::tempdir().unwrap();
        let (b, c, z) = (link(".."), link("b/.."), link("c/SECRET"));
        let paths = [rel("sub/b"), rel("sub/c"), rel("sub/z")];
        let after = After::new(
            d.path(),
            [
                (&paths[0], Some(&b)),
                (&paths[1], Some(&c)),
                (&paths[2], Some(&z)),
            ],
        );
        assert_eq!(resolve(&after, &paths[0], b".."), Ok(()));
        assert_eq!(resolve(&after, &paths[1], b"b/.."), Err(Escape::AboveTheRoot));
        assert_eq!(resolve(&after, &paths[2], b"c/SECRET"), Err(Escape::AboveTheRoot));
    }

    #[test]
    fn links_already_on_the_host_are_followed_too() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("lib")).unwrap();
        symlink("..", d.path().join("lib/up")).unwrap();
        std::fs::create_dir(d.path().join("src")).unwrap();
        symlink("src", d.path().join("code")).unwrap();
        symlink("/usr/bin/python3", d.path().join("python")).unwrap();
        let none: [(&RelPath, Option<&Content>); 0] = [];
        let after = After::new(d.path(), none);
        assert_eq!(
            resolve(&after, &rel("lib/z"), b"up/../SECRET"),
            Err(Escape::AboveTheRoot)
        );
        assert_eq!(resolve(&after, &rel("lib/z"), b"up/src/a.py"), Ok(()));
        assert_eq!(resolve(&after, &rel("x"), b"code/../code/a.py"), Ok(()));
        assert_eq!(
            resolve(&after, &rel("x"), b"code/../../x"),
            Err(Escape::AboveTheRoot)
        );
        // A new link through the user's own link that leads out leads out too; the user's own
        // links keep leading where they did.
        assert_eq!(resolve(&after, &rel("py"), b"python"), Err(Escape::Absolute));
        assert_eq!(resolve_existing(&after, &rel("py"), b"python"), Ok(()));
        assert_eq!(resolve(&after, &rel("x"), b"/etc/passwd"), Err(Escape::Absolute));
    }

    #[test]
    fn a_new_link_can_make_an_existing_one_leave() {
        let d = tempfile::tempdir().unwrap();
        symlink("d/../SECRET", d.path().join("h")).unwrap();
        let host = Host { root: d.path() };
        // `d` missing: resolved by name, inside.
        assert_eq!(resolve(&host, &rel("h"), b"d/../SECRET"), Ok(()));
        let new = link("sub/..");
        let p = rel("d");
        let after = After::new(d.path(), [(&p, Some(&new))]);
        assert_eq!(resolve(&after, &p, b"sub/.."), Ok(()));
        assert_eq!(
            resolve(&after, &rel("h"), b"d/../SECRET"),
            Err(Escape::AboveTheRoot)
        );
    }

    #[test]
    fn loops_end_and_files_and_deletions_count() {
        let d = tempfile::tempdir().unwrap();
        symlink("l2", d.path().join("l1")).unwrap();
        symlink("l1", d.path().join("l2")).unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        symlink("..", d.path().join("dir/up")).unwrap();
        let host = Host { root: d.path() };
        assert_eq!(resolve(&host, &rel("x"), b"l1"), Err(Escape::TooManyLinks));
        // The sandbox replaces dir/up by a file and deletes nothing else: `dir/up/..` is then
        // resolved by name (the kernel would refuse it), inside.
        let (f, p) = (file(), rel("dir/up"));
        let after = After::new(d.path(), [(&p, Some(&f))]);
        assert_eq!(resolve(&after, &rel("x"), b"dir/up/../../y"), Ok(()));
        assert_eq!(
            resolve(&host, &rel("x"), b"dir/up/../../y"),
            Err(Escape::AboveTheRoot)
        );
        let gone = rel("dir/up");
        let after = After::new(d.path(), [(&gone, None)]);
        assert_eq!(resolve(&after, &rel("x"), b"dir/up/.."), Ok(()));
    }
}
