//! One version of the served tree, indexed by inode, and the inode numbers of paths.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, INodeNo};

use crate::tree::{Entry, Kind, Tree};

/// How long the kernel may cache entries and attributes; changes are pushed by invalidation.
pub(super) const TTL: Duration = Duration::from_secs(24 * 3600);

/// The directory whose host entries are served live from `<sysfs>/bus/pci/devices`.
pub(super) const HOST_PCI_DIR: &str = "sys/bus/pci/devices";

/// Cookies 1 and 2 are `.` and `..`; a child's cookie is its inode number plus this.
pub(super) const DOTS: u64 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Child {
    pub(super) name: Box<str>,
    pub(super) ino: u64,
    pub(super) kind: FileType,
}

/// Children in inode order (the order `readdir` lists them in), with an index by name.
#[derive(Default, PartialEq, Eq)]
pub(super) struct Children {
    pub(super) by_ino: Vec<Child>,
    by_name: Vec<u32>,
}

impl Children {
    fn new(mut by_ino: Vec<Child>) -> Children {
        by_ino.sort_unstable_by_key(|c| c.ino);
        let mut by_name: Vec<u32> = (0..by_ino.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| by_ino[a as usize].name.cmp(&by_ino[b as usize].name));
        Children { by_ino, by_name }
    }

    pub(super) fn find(&self, name: &OsStr) -> Option<&Child> {
        let name = name.as_encoded_bytes();
        self.by_name
            .binary_search_by(|&i| self.by_ino[i as usize].name.as_bytes().cmp(name))
            .ok()
            .map(|i| &self.by_ino[self.by_name[i] as usize])
    }
}

pub(super) struct Node {
    pub(super) name: String,
    pub(super) parent: INodeNo,
    pub(super) entry: Entry,
    pub(super) attr: FileAttr,
    pub(super) children: Children,
}

/// One version of the tree, indexed by inode.
pub(super) struct Snapshot {
    pub(super) nodes: HashMap<u64, Node>,
    /// The inode of [`HOST_PCI_DIR`] when its host part is served live.
    pub(super) live_dir: Option<u64>,
}

/// Path to inode numbers, stable across reloads and agents.
#[derive(Default)]
pub(super) struct Inodes {
    by_path: HashMap<String, u64>,
    used: HashSet<u64>,
}

impl Inodes {
    pub(super) fn get(&mut self, path: &str) -> u64 {
        if path.is_empty() {
            return INodeNo::ROOT.0;
        }
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let mut ino = path_ino(path);
        while !self.used.insert(ino) {
            // Two paths on one number (about once in 10^11 trees): the later one takes the next.
            tracing::warn!(path, ino, "inode number taken by another path");
            ino = ((ino + 1) & INO_MASK).max(INodeNo::ROOT.0 + 1);
        }
        self.by_path.insert(path.to_string(), ino);
        ino
    }
}

/// Inode numbers keep below 2^62, so that a cookie (number + [`DOTS`]) never overflows.
const INO_MASK: u64 = (1 << 62) - 1;

/// The inode number of `path`: its FNV-1a hash in 62 bits, above the root's. A fixed function,
/// so that every agent version numbers a path alike.
fn path_ino(path: &str) -> u64 {
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash & INO_MASK).max(INodeNo::ROOT.0 + 1)
}

fn file_type(kind: &Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::File(_) => FileType::RegularFile,
        Kind::Symlink(_) => FileType::Symlink,
        Kind::CharDev { .. } => FileType::CharDevice,
    }
}

pub(super) fn attr(ino: u64, kind: &Kind, mode: u16, nlink: u32, time: SystemTime) -> FileAttr {
    let (size, rdev) = match kind {
        Kind::Dir => (0, 0),
        Kind::File(c) => (c.len() as u64, 0),
        Kind::Symlink(t) => (t.len() as u64, 0),
        Kind::CharDev { major, minor } => (0, libc::makedev(*major, *minor) as u32),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: file_type(kind),
        perm: mode,
        nlink,
        uid: 0,
        gid: 0,
        rdev,
        flags: 0,
        blksize: 4096,
    }
}

impl Snapshot {
    /// Indexes `tree`; with `live`, its host entries are left out (served live instead).
    pub(super) fn build(
        tree: &Tree,
        inodes: &mut Inodes,
        time: SystemTime,
        live: bool,
    ) -> Snapshot {
        let served = |e: &Entry| !(live && e.from_host);
        let mut nodes = HashMap::with_capacity(tree.len());
        for (path, entry) in tree.iter().filter(|(_, e)| served(e)) {
            let ino = inodes.get(path);
            let (parent_path, name) = path.rsplit_once('/').unwrap_or(("", path));
            let parent = INodeNo(inodes.get(parent_path));
            let mut subdirs = 0;
            let children = match entry.kind {
                Kind::Dir => tree
                    .children(path)
                    .into_iter()
                    .filter_map(|c| {
                        let child = if path.is_empty() {
                            c.to_string()
                        } else {
                            format!("{path}/{c}")
                        };
                        let e = tree.get(&child).filter(|e| served(e))?;
                        if matches!(e.kind, Kind::Dir) {
                            subdirs += 1;
                        }
                        Some(Child {
                            name: c.into(),
                            ino: inodes.get(&child),
                            kind: file_type(&e.kind),
                        })
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let nlink = if matches!(entry.kind, Kind::Dir) {
                2 + subdirs
            } else {
                1
            };
            nodes.insert(
                ino,
                Node {
                    name: name.to_string(),
                    parent,
                    attr: attr(ino, &entry.kind, entry.mode, nlink, time),
                    entry: entry.clone(),
                    children: Children::new(children),
                },
            );
        }
        let live_dir = if live {
            tree.get(HOST_PCI_DIR)
                .filter(|e| matches!(e.kind, Kind::Dir))
                .map(|_| inodes.get(HOST_PCI_DIR))
        } else {
            None
        };
        Snapshot { nodes, live_dir }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_depend_on_the_path_alone() {
        let paths = ["proc", "proc/driver", "sys/bus/pci/devices/0000:00:00.0"];
        let (mut a, mut b) = (Inodes::default(), Inodes::default());
        let forward: Vec<u64> = paths.iter().map(|p| a.get(p)).collect();
        let mut backward: Vec<u64> = paths.iter().rev().map(|p| b.get(p)).collect();
        backward.reverse();
        assert_eq!(forward, backward);
        assert!(
            forward
                .iter()
                .all(|&i| i > INodeNo::ROOT.0 && i <= INO_MASK),
            "{forward:?}"
        );
        assert_eq!(a.get(""), INodeNo::ROOT.0);
        assert_eq!(a.get("proc"), forward[0], "a path keeps its number");
    }

    #[test]
    fn a_taken_number_goes_to_the_next_free_one() {
        let mut inodes = Inodes::default();
        let ino = path_ino("x");
        inodes.used.insert(ino);
        assert_eq!(inodes.get("x"), ino + 1);
    }
}
