//! The driver tree as an in-memory model: directories, files, symlinks and device nodes keyed by
//! their path relative to the mock root (`proc/driver/nvidia/version`).

use std::collections::BTreeMap;
use std::sync::Arc;

/// What a tree entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file with its exact content.
    File(Arc<[u8]>),
    /// A symbolic link with its target.
    Symlink(String),
    /// A character device node.
    CharDev {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
}

/// One entry: its kind and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// Permission bits (`0o444`).
    pub mode: u16,
    /// A copy of one of the host's own entries as they were at render time (its PCI devices),
    /// which a live server may serve from the host instead.
    pub from_host: bool,
}

/// A whole tree. The root is the empty path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    entries: BTreeMap<String, Entry>,
}

impl Default for Tree {
    fn default() -> Self {
        let mut entries = BTreeMap::new();
        entries.insert(
            String::new(),
            Entry {
                kind: Kind::Dir,
                mode: 0o555,
                from_host: false,
            },
        );
        Tree { entries }
    }
}

impl Tree {
    /// An empty tree (the root directory only).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a read-only text or binary file, creating its parent directories.
    pub fn file(&mut self, path: &str, content: impl Into<Vec<u8>>) {
        self.insert(path, Kind::File(content.into().into()), 0o444);
    }

    /// Adds a file with explicit permission bits.
    pub(crate) fn file_mode(&mut self, path: &str, content: impl Into<Vec<u8>>, mode: u16) {
        self.insert(path, Kind::File(content.into().into()), mode);
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, path: &str, target: impl Into<String>) {
        self.insert(path, Kind::Symlink(target.into()), 0o777);
    }

    /// Adds a symbolic link copied from the host's own sysfs (see [`Entry::from_host`]).
    pub(crate) fn host_symlink(&mut self, path: &str, target: impl Into<String>) {
        self.insert(path, Kind::Symlink(target.into()), 0o777);
        if let Some(e) = self.entries.get_mut(path) {
            e.from_host = true;
        }
    }

    /// Adds a character device node.
    pub(crate) fn chardev(&mut self, path: &str, major: u32, minor: u32, mode: u16) {
        self.insert(path, Kind::CharDev { major, minor }, mode);
    }

    /// Adds an (empty) directory.
    pub fn dir(&mut self, path: &str) {
        self.insert(path, Kind::Dir, 0o555);
    }

    fn insert(&mut self, path: &str, kind: Kind, mode: u16) {
        let mut parent = path;
        while let Some((p, _)) = parent.rsplit_once('/') {
            self.entries.entry(p.to_string()).or_insert(Entry {
                kind: Kind::Dir,
                mode: 0o555,
                from_host: false,
            });
            parent = p;
        }
        self.entries.insert(
            path.to_string(),
            Entry {
                kind,
                mode,
                from_host: false,
            },
        );
    }

    /// The entry at `path`.
    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Every entry, parents before children, in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    /// Number of entries, the root included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the tree holds only its root.
    pub fn is_empty(&self) -> bool {
        self.entries.len() <= 1
    }

    /// The names of a directory's direct children, in order.
    pub fn children(&self, dir: &str) -> Vec<&str> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.entries
            .range(prefix.clone()..)
            .skip_while(|(p, _)| p.is_empty())
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter_map(|(p, _)| {
                let rest = p.get(prefix.len()..)?;
                (!rest.contains('/')).then_some(rest)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_created_and_children_listed() {
        let mut t = Tree::new();
        t.file("a/b/c", "x");
        t.symlink("a/l", "b/c");
        t.file("ab", "y");
        t.host_symlink("a/h", "/sys/h");
        assert!(t.get("a/h").unwrap().from_host);
        assert!(!t.get("a/l").unwrap().from_host);
        assert_eq!(t.get("a/b").unwrap().kind, Kind::Dir);
        assert_eq!(t.children("a"), ["b", "h", "l"]);
        assert_eq!(t.children(""), ["a", "ab"]);
        assert_eq!(t.children("a/b"), ["c"]);
        assert_eq!(t.len(), 7);
    }
}
