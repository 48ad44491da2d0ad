//! The driver tree served read-only over FUSE.
//!
//! Inode numbers are derived from the path (a fixed hash) and never given to another path, so a
//! reload keeps the inodes of unchanged entries, and an agent that takes over the connection
//! through the keeper (see [`crate::keeper`]) numbers every entry as its predecessor did, which
//! the kernel's cached entries rely on; every changed or removed entry is invalidated through the
//! kernel notifier.
//! Files report their exact size; opens are zero-message (the kernel keeps the page cache) and
//! TTLs are long, so warm reads are served by the kernel without a round trip to the agent.
//!
//! The host's part of `sys/bus/pci/devices` can be served live: listed from the host's sysfs
//! when asked (cached for [`LIVE_TTL`], the TTL the kernel gets for those entries too), beside
//! the mock GPUs' entries, so that a device hot-plugged after the start shows up.
//!
//! Directory offsets are cookies, not positions: children are listed in inode order and an
//! entry's cookie is derived from its inode number. `opendir` stays ENOSYS (no per-open state, no
//! request per `opendir`/`releasedir`); since inodes are never reused, a reload between two
//! `readdir` calls of one listing can neither skip nor repeat an entry present in both trees:
//! the next call resumes after the last cookie returned, wherever that entry is now.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, Notifier, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry, ReplyOpen, Request, SessionACL,
};

use crate::host::SysfsHost;
use crate::pinner::Pinner;
use crate::tree::{Entry, Kind, Tree};

/// How long the kernel may cache entries and attributes; changes are pushed by invalidation.
const TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a listing of the host's PCI devices is reused, and the kernel's TTL for them.
pub const LIVE_TTL: Duration = Duration::from_secs(1);

/// The directory whose host entries are served live from `<sysfs>/bus/pci/devices`.
const HOST_PCI_DIR: &str = "sys/bus/pci/devices";

/// Cookies 1 and 2 are `.` and `..`; a child's cookie is its inode number plus this.
const DOTS: u64 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Child {
    name: Box<str>,
    ino: u64,
    kind: FileType,
}

/// Children in inode order (the order `readdir` lists them in), with an index by name.
#[derive(Default, PartialEq, Eq)]
struct Children {
    by_ino: Vec<Child>,
    by_name: Vec<u32>,
}

impl Children {
    fn new(mut by_ino: Vec<Child>) -> Children {
        by_ino.sort_unstable_by_key(|c| c.ino);
        let mut by_name: Vec<u32> = (0..by_ino.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| by_ino[a as usize].name.cmp(&by_ino[b as usize].name));
        Children { by_ino, by_name }
    }

    fn find(&self, name: &OsStr) -> Option<&Child> {
        let name = name.as_encoded_bytes();
        self.by_name
            .binary_search_by(|&i| self.by_ino[i as usize].name.as_bytes().cmp(name))
            .ok()
            .map(|i| &self.by_ino[self.by_name[i] as usize])
    }
}

struct Node {
    name: String,
    parent: INodeNo,
    entry: Entry,
    attr: FileAttr,
    children: Children,
}

/// One version of the tree, indexed by inode.
struct Snapshot {
    nodes: HashMap<u64, Node>,
    /// The inode of [`HOST_PCI_DIR`] when its host part is served live.
    live_dir: Option<u64>,
}

/// Path to inode numbers, stable across reloads and agents.
#[derive(Default)]
struct Inodes {
    by_path: HashMap<String, u64>,
    used: std::collections::HashSet<u64>,
}

impl Inodes {
    fn get(&mut self, path: &str) -> u64 {
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

fn attr(ino: u64, kind: &Kind, mode: u16, nlink: u32, time: SystemTime) -> FileAttr {
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
    fn build(tree: &Tree, inodes: &mut Inodes, time: SystemTime, live: bool) -> Snapshot {
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

/// One of the host's PCI devices as a symlink in [`HOST_PCI_DIR`].
#[derive(Clone)]
struct LiveEntry {
    child: Child,
    attr: FileAttr,
    target: String,
}

/// The host's PCI devices as last listed, in inode order.
struct LiveListing {
    at: Instant,
    /// When the listing last changed: the directory's mtime, which tells the kernel to drop
    /// its cached listing (kept there since `opendir` is zero-message).
    changed: SystemTime,
    entries: Vec<LiveEntry>,
}

impl LiveListing {
    fn get(&self, ino: u64) -> Option<&LiveEntry> {
        self.entries
            .binary_search_by_key(&ino, |e| e.child.ino)
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// The live part of [`HOST_PCI_DIR`].
struct HostPci {
    sysfs: SysfsHost,
    listing: Mutex<Option<Arc<LiveListing>>>,
}

/// The FUSE file system over a replaceable [`Tree`].
pub struct DriverFs {
    inner: Arc<Shared>,
}

/// State shared between the FUSE threads and the handle that reloads the tree.
struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    inodes: Mutex<Inodes>,
    host_pci: Option<HostPci>,
    time: SystemTime,
    reads: AtomicU64,
    requests: AtomicU64,
    /// The process that holds the mounted entries in the kernel's caches.
    pinner: Mutex<Option<Pinner>>,
}

/// Replaces the served tree and tells the kernel what changed.
#[derive(Clone)]
pub struct TreeHandle {
    inner: Arc<Shared>,
    notifier: Arc<Mutex<Option<Notifier>>>,
    mountpoint: Option<Arc<Path>>,
}

impl DriverFs {
    /// A file system serving `tree`, and the handle that replaces it later. With `sysfs`, the
    /// host's entries of `sys/bus/pci/devices` are listed live from `<sysfs>/bus/pci/devices`
    /// instead of the copies rendered into `tree`.
    pub fn new(tree: &Tree, sysfs: Option<&Path>) -> (DriverFs, TreeHandle) {
        let time = SystemTime::now();
        let mut inodes = Inodes::default();
        let snapshot = Snapshot::build(tree, &mut inodes, time, sysfs.is_some());
        let inner = Arc::new(Shared {
            snapshot: RwLock::new(Arc::new(snapshot)),
            inodes: Mutex::new(inodes),
            host_pci: sysfs.map(|root| HostPci {
                sysfs: SysfsHost::new(root),
                listing: Mutex::new(None),
            }),
            time,
            reads: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            pinner: Mutex::new(None),
        });
        let handle = TreeHandle {
            inner: inner.clone(),
            notifier: Arc::new(Mutex::new(None)),
            mountpoint: None,
        };
        (DriverFs { inner }, handle)
    }

    /// The current snapshot; counts the request.
    fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        self.inner
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The host's PCI devices, listed again when the last listing is older than [`LIVE_TTL`].
    fn live(&self) -> Option<Arc<LiveListing>> {
        let host = self.inner.host_pci.as_ref()?;
        let mut cached = host.listing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = cached.as_ref().filter(|l| l.at.elapsed() < LIVE_TTL) {
            return Some(l.clone());
        }
        let devices = match host.sysfs.pci_devices() {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the host's PCI devices; serving the last listing");
                let last = LiveListing {
                    at: Instant::now(),
                    changed: cached.as_ref().map_or(self.inner.time, |l| l.changed),
                    entries: cached
                        .as_ref()
                        .map(|l| l.entries.clone())
                        .unwrap_or_default(),
                };
                return Some(cached.insert(Arc::new(last)).clone());
            }
        };
        let mut inodes = self.inner.inodes.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries: Vec<LiveEntry> = devices
            .into_iter()
            .map(|d| {
                let name = d.bus_id.to_string();
                let ino = inodes.get(&format!("{HOST_PCI_DIR}/{name}"));
                let link = Kind::Symlink(d.sysfs_path.clone());
                LiveEntry {
                    child: Child {
                        name: name.into(),
                        ino,
                        kind: FileType::Symlink,
                    },
                    attr: attr(ino, &link, 0o777, 1, self.inner.time),
                    target: d.sysfs_path,
                }
            })
            .collect();
        drop(inodes);
        entries.sort_unstable_by_key(|e| e.child.ino);
        let same = |l: &LiveListing| {
            l.entries.len() == entries.len()
                && l.entries
                    .iter()
                    .zip(&entries)
                    .all(|(a, b)| a.child == b.child && a.target == b.target)
        };
        let changed = match cached.as_deref() {
            Some(l) if same(l) => l.changed,
            _ => SystemTime::now(),
        };
        let listing = Arc::new(LiveListing {
            at: Instant::now(),
            changed,
            entries,
        });
        *cached = Some(listing.clone());
        Some(listing)
    }

    /// The attributes of `ino` and their TTL: from the tree (the live directory with the time
    /// of its last change as mtime), else from the live listing.
    fn attr_of(&self, snap: &Snapshot, ino: u64) -> Option<(FileAttr, Duration)> {
        if let Some(n) = snap.nodes.get(&ino) {
            if snap.live_dir != Some(ino) {
                return Some((n.attr, TTL));
            }
            let mut attr = n.attr;
            if let Some(live) = self.live() {
                (attr.mtime, attr.ctime) = (live.changed, live.changed);
            }
            return Some((attr, LIVE_TTL));
        }
        snap.live_dir?;
        let live = self.live()?;
        live.get(ino).map(|e| (e.attr, LIVE_TTL))
    }

    /// Lists `ino` from `offset` (a cookie) on, in cookie order, calling `add` with each entry's
    /// inode, cookie, name, attributes and TTL until it returns true (the reply is full).
    fn list(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(INodeNo, u64, &str, &FileAttr, &Duration) -> bool,
    ) -> Result<(), Errno> {
        let snap = self.snapshot();
        let dir = snap.nodes.get(&ino.0).ok_or(Errno::ENOENT)?;
        if !matches!(dir.entry.kind, Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        let dots = [(ino.0, 1, "."), (dir.parent.0, 2, "..")];
        for (i, cookie, name) in dots {
            if cookie > offset {
                let Some((a, ttl)) = self.attr_of(&snap, i) else {
                    continue;
                };
                if add(INodeNo(i), cookie, name, &a, &ttl) {
                    return Ok(());
                }
            }
        }
        let live = (snap.live_dir == Some(ino.0))
            .then(|| self.live())
            .flatten();
        let from_tree = dir.children.by_ino.iter().filter_map(|c| {
            self.attr_of(&snap, c.ino)
                .map(|(attr, ttl)| (&c.name, c.ino, attr, ttl))
        });
        let from_host = live.iter().flat_map(|l| {
            l.entries
                .iter()
                .filter(|e| dir.children.find(OsStr::new(&*e.child.name)).is_none())
                .map(|e| (&e.child.name, e.child.ino, e.attr, LIVE_TTL))
        });
        let mut merged: Vec<_> = from_tree.chain(from_host).collect();
        if live.is_some() {
            merged.sort_unstable_by_key(|&(_, ino, _, _)| ino);
        }
        let start = merged.partition_point(|&(_, ino, _, _)| ino + DOTS <= offset);
        for (name, ino, attr, ttl) in &merged[start..] {
            if add(INodeNo(*ino), ino + DOTS, name, attr, ttl) {
                break;
            }
        }
        Ok(())
    }
}

impl TreeHandle {
    /// Serves `tree` from now on; invalidates every entry that changed or vanished.
    /// Returns the number of invalidated entries.
    pub fn replace(&self, tree: &Tree) -> usize {
        let new = {
            let mut inodes = self.inner.inodes.lock().unwrap_or_else(|e| e.into_inner());
            let live = self.inner.host_pci.is_some();
            Arc::new(Snapshot::build(tree, &mut inodes, SystemTime::now(), live))
        };
        let old = std::mem::replace(
            &mut *self
                .inner
                .snapshot
                .write()
                .unwrap_or_else(|e| e.into_inner()),
            new.clone(),
        );
        let mut changed = 0;
        let notifier = self.notifier.lock().unwrap_or_else(|e| e.into_inner());
        for (&ino, node) in &old.nodes {
            let same = new
                .nodes
                .get(&ino)
                .is_some_and(|n| n.entry == node.entry && n.children == node.children);
            if same {
                continue;
            }
            changed += 1;
            if let Some(n) = notifier.as_ref() {
                // ENOENT only means the kernel had nothing cached for it.
                let _ = n.inval_inode(INodeNo(ino), 0, -1);
                if ino != INodeNo::ROOT.0 && !new.nodes.contains_key(&ino) {
                    let _ = n.inval_entry(node.parent, OsStr::new(&node.name));
                }
            }
        }
        changed
    }

    /// Invalidates what the kernel may cache of `paths`, the tree an earlier agent served on
    /// this connection (kept by the keeper, with the kernel's caches): every entry's attributes
    /// and pages, and the names the tree served now lacks. Returns the number of paths.
    pub fn forget(&self, paths: &[String]) -> usize {
        let notifier = self.notifier.lock().unwrap_or_else(|e| e.into_inner());
        let Some(n) = notifier.as_ref() else {
            return 0;
        };
        let snap = self
            .inner
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut inodes = self.inner.inodes.lock().unwrap_or_else(|e| e.into_inner());
        for path in paths.iter().filter(|p| !p.is_empty()) {
            let ino = inodes.get(path);
            let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
            let parent = INodeNo(inodes.get(parent));
            // ENOENT only means the kernel had nothing cached for it.
            let _ = n.inval_inode(INodeNo(ino), 0, -1);
            if !snap.nodes.contains_key(&ino) {
                let _ = n.inval_entry(parent, OsStr::new(name));
            }
        }
        let _ = n.inval_inode(INodeNo::ROOT, 0, -1);
        paths.len()
    }

    /// How many `read` requests reached the agent (kernel cache misses).
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::Relaxed)
    }

    /// How many requests of any kind (lookups, reads, listings, ...) reached the agent.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Walks the mounted `tree` once, reading every file, so that the kernel caches every
    /// entry, attribute and page, and keeps a descriptor open on every entry (replacing those of
    /// an earlier walk): the kernel does not evict dentries in use, so even after its caches
    /// were dropped a consumer's read needs no lookup, only the read of the file's data. The
    /// walk and the descriptors are a child's, `<program> pin-tree` ([`crate::pinner`]), never
    /// this process's own. Returns the number of entries visited; entries that vanish meanwhile
    /// are skipped. Does nothing before the file system is mounted.
    pub fn warm(&self, tree: &Tree, program: &Path) -> usize {
        let Some(root) = &self.mountpoint else {
            return 0;
        };
        self.unpin();
        let (pinner, walked) = match Pinner::start(program, root, tree) {
            Ok(started) => started,
            Err(e) => {
                tracing::warn!(program = %program.display(), error = %e, "cannot warm the driver tree; the kernel caches it as it is read");
                return 0;
            }
        };
        if walked.visited > walked.pinned {
            tracing::warn!(
                pinned = walked.pinned,
                entries = walked.visited,
                "descriptor limit too low to pin the whole driver tree"
            );
        }
        *self.inner.pinner.lock().unwrap_or_else(|e| e.into_inner()) = Some(pinner);
        walked.visited
    }

    /// Ends the process that holds what [`TreeHandle::warm`] pinned: the kernel may evict
    /// those entries again.
    pub fn unpin(&self) {
        let pinner = self
            .inner
            .pinner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(pinner);
    }

    /// The process id of the process that holds the warmed tree, if any.
    pub fn pinner_id(&self) -> Option<u32> {
        self.inner
            .pinner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Pinner::id)
    }

    fn set_notifier(&self, notifier: Notifier) {
        *self.notifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(notifier);
    }
}

impl Filesystem for DriverFs {
    /// Asks for `readdirplus` (listings carry attributes, so a listing needs no lookups after
    /// it), adaptively as the kernel sees fit.
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let plus = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        if config.add_capabilities(plus).is_err() {
            tracing::debug!("kernel without readdirplus");
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let snap = self.snapshot();
        let Some(dir) = snap.nodes.get(&parent.0) else {
            reply.error(Errno::ENOENT);
            return;
        };
        if let Some((attr, ttl)) = dir
            .children
            .find(name)
            .and_then(|c| self.attr_of(&snap, c.ino))
        {
            reply.entry(&ttl, &attr, Generation(0));
            return;
        }
        let live = (snap.live_dir == Some(parent.0))
            .then(|| self.live())
            .flatten();
        let found = live.as_ref().and_then(|l| {
            l.entries
                .iter()
                .find(|e| OsStr::new(&*e.child.name) == name)
        });
        match found {
            Some(e) => reply.entry(&LIVE_TTL, &e.attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let snap = self.snapshot();
        match self.attr_of(&snap, ino.0) {
            Some((attr, ttl)) => reply.attr(&ttl, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let snap = self.snapshot();
        match snap.nodes.get(&ino.0).map(|n| &n.entry.kind) {
            Some(Kind::Symlink(target)) => reply.data(target.as_bytes()),
            Some(_) => reply.error(Errno::EINVAL),
            None => {
                let live = snap.live_dir.and_then(|_| self.live());
                match live.as_ref().and_then(|l| l.get(ino.0)) {
                    Some(e) => reply.data(e.target.as_bytes()),
                    None => reply.error(Errno::ENOENT),
                }
            }
        }
    }

    /// Answered with ENOSYS so that the kernel stops sending opens and releases at all
    /// (`FUSE_NO_OPEN_SUPPORT`): a zero-message open keeps the page cache, and only regular
    /// files reach here (directories go to `opendir`, device nodes are refused by `nodev`).
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    /// ENOSYS likewise (`FUSE_NO_OPENDIR_SUPPORT`): directory handles carry no state here, and
    /// listings stay consistent across reloads through their cookies (see the module docs).
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        match self.snapshot().nodes.get(&ino.0).map(|n| &n.entry.kind) {
            Some(Kind::File(content)) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(content.len());
                let end = start.saturating_add(size as usize).min(content.len());
                reply.data(content.get(start..end).unwrap_or_default());
            }
            Some(Kind::Dir) => reply.error(Errno::EISDIR),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        // ENOSYS once makes the kernel stop sending flushes on close.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.list(ino, offset, |ino, cookie, name, attr, _| {
            reply.add(ino, cookie, attr.kind, name)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        match self.list(ino, offset, |ino, cookie, name, attr, ttl| {
            reply.add(ino, cookie, name, ttl, attr, Generation(0))
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// A mounted driver tree; unmounts when dropped or on [`Mounted::unmount`]. Served through a
/// keeper ([`serve_relayed`]), it is never unmounted: the agent only lets go of its connection.
pub struct Mounted {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// The connection to the keeper, when the keeper holds the mount.
    relay: Option<OwnedFd>,
    /// Replaces the served tree.
    pub handle: TreeHandle,
}

impl Mounted {
    /// Unmounts and waits for the FUSE thread to end. A mount still in use (an open file, a
    /// process's working directory) is detached lazily instead: it leaves the mount table at
    /// once and the FUSE thread serves its last users until they let go. Through a keeper: stops
    /// taking requests, answers those already taken and closes the connection; the keeper gives
    /// the rest to the next agent, and the mount stays.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    /// Whether a keeper holds the mount (see [`serve_relayed`]).
    pub fn is_relayed(&self) -> bool {
        self.relay.is_some()
    }

    /// Whether the FUSE threads still serve (they end when the keeper's connection closes).
    pub fn serving(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        self.handle.unpin();
        if let Some(conn) = self.relay.take() {
            // The keeper answers with one DESTROY per thread, behind what it sent before.
            let bye = [crate::keeper::BYE, &[FUSE_THREADS as u8]].concat();
            let flags = nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
            if nix::sys::socket::send(conn.as_raw_fd(), &bye, flags).is_err() {
                // The keeper is gone: the threads read an end of file, if they have not yet.
                nix::sys::socket::shutdown(conn.as_raw_fd(), nix::sys::socket::Shutdown::Read)?;
            }
            return match session.join() {
                // fuser calls an end of file an invalid request.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(()),
                other => other,
            };
        }
        match session.umount_and_join() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(mountpoint = %self.mountpoint.display(), "driver tree busy: detaching it lazily");
                nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH)
                    .map_err(io::Error::from)
            }
            other => other,
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// Mounts `tree` read-only (`nodev`, `nosuid`) at `mountpoint`: readable by every user when
/// mounted by root (`allow_other`), by the mounting user only otherwise (an unprivileged
/// `allow_other` needs `user_allow_other` in `/etc/fuse.conf`). With `sysfs`, the host's part of
/// `sys/bus/pci/devices` is served live from `<sysfs>/bus/pci/devices` (see [`DriverFs::new`]).
pub fn mount(tree: &Tree, mountpoint: &Path, sysfs: Option<&Path>) -> io::Result<Mounted> {
    let (fs, handle) = DriverFs::new(tree, sysfs);
    let config = config();
    let session = fuser::spawn_mount(fs, mountpoint, &config)?;
    Ok(mounted(session, mountpoint, handle, None))
}

/// Writes the paths of `tree` to `file`, one per line, replacing it whole: what the next agent
/// on the same connection gives [`TreeHandle::forget`].
pub fn record_paths(tree: &Tree, file: &Path) -> io::Result<()> {
    let text: String = tree
        .iter()
        .filter(|(path, _)| !path.is_empty())
        .flat_map(|(path, _)| [path, "\n"])
        .collect();
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}

/// The paths [`record_paths`] wrote to `file`; none when there is no such file.
pub fn recorded_paths(file: &Path) -> io::Result<Vec<String>> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Serves `tree` on `conn`, a connection to the keeper that holds the mount at `mountpoint`
/// (see [`crate::keeper`]): fuser runs on the socket as it would on `/dev/fuse`, since the keeper
/// relays one request or reply per message. With `sysfs` as in [`mount`].
pub fn serve_relayed(
    tree: &Tree,
    conn: OwnedFd,
    mountpoint: &Path,
    sysfs: Option<&Path>,
) -> io::Result<Mounted> {
    let (fs, handle) = DriverFs::new(tree, sysfs);
    let stop = conn.try_clone()?;
    let config = config();
    let session = fuser::Session::from_fd(fs, conn, config.acl, config)?.spawn()?;
    Ok(mounted(session, mountpoint, handle, Some(stop)))
}

fn mounted(
    session: BackgroundSession,
    mountpoint: &Path,
    mut handle: TreeHandle,
    relay: Option<OwnedFd>,
) -> Mounted {
    handle.set_notifier(session.notifier());
    handle.mountpoint = Some(mountpoint.into());
    Mounted {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        relay,
        handle,
    }
}

/// Threads reading FUSE requests.
const FUSE_THREADS: usize = 2;

/// The session settings of the driver tree's mount.
fn config() -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::DefaultPermissions,
        MountOption::FSName("mockgpu".into()),
        MountOption::Subtype("mockgpu".into()),
    ];
    config.acl = if nix::unistd::geteuid().is_root() {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(FUSE_THREADS);
    config
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
