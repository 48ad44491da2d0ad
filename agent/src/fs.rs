//! The driver tree served read-only over FUSE.
//!
//! Inode numbers are assigned per path and never reused, so a reload keeps the inodes of
//! unchanged entries; every changed or removed entry is invalidated through the kernel notifier.
//! Files report their exact size; opens are zero-message (the kernel keeps the page cache) and
//! TTLs are long, so warm reads are served by the kernel without a round trip to the agent.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, Generation,
    INodeNo, LockOwner, MountOption, Notifier, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEntry, ReplyOpen, Request, SessionACL,
};

use crate::tree::{Entry, Kind, Tree};

/// How long the kernel may cache entries and attributes; changes are pushed by invalidation.
const TTL: Duration = Duration::from_secs(24 * 3600);

struct Node {
    name: String,
    parent: INodeNo,
    entry: Entry,
    attr: FileAttr,
    children: Vec<(String, INodeNo)>,
}

/// One version of the tree, indexed by inode.
struct Snapshot {
    nodes: HashMap<u64, Node>,
}

/// Path to inode numbers, stable across reloads.
#[derive(Default)]
struct Inodes {
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Inodes {
    fn get(&mut self, path: &str) -> u64 {
        if path.is_empty() {
            return INodeNo::ROOT.0;
        }
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        self.next = self.next.max(INodeNo::ROOT.0) + 1;
        self.by_path.insert(path.to_string(), self.next);
        self.next
    }
}

fn attr(ino: u64, entry: &Entry, nlink: u32, time: SystemTime) -> FileAttr {
    let (kind, size, rdev) = match &entry.kind {
        Kind::Dir => (FileType::Directory, 0, 0),
        Kind::File(c) => (FileType::RegularFile, c.len() as u64, 0),
        Kind::Symlink(t) => (FileType::Symlink, t.len() as u64, 0),
        Kind::CharDev { major, minor } => (
            FileType::CharDevice,
            0,
            libc::makedev(*major, *minor) as u32,
        ),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind,
        perm: entry.mode,
        nlink,
        uid: 0,
        gid: 0,
        rdev,
        flags: 0,
        blksize: 4096,
    }
}

impl Snapshot {
    fn build(tree: &Tree, inodes: &mut Inodes, time: SystemTime) -> Snapshot {
        let mut nodes = HashMap::with_capacity(tree.len());
        for (path, entry) in tree.iter() {
            let ino = inodes.get(path);
            let (parent_path, name) = path.rsplit_once('/').unwrap_or(("", path));
            let parent = INodeNo(inodes.get(parent_path));
            let mut subdirs = 0;
            let children: Vec<(String, INodeNo)> = match entry.kind {
                Kind::Dir => tree
                    .children(path)
                    .into_iter()
                    .map(|c| {
                        let child = if path.is_empty() {
                            c.to_string()
                        } else {
                            format!("{path}/{c}")
                        };
                        if matches!(tree.get(&child).map(|e| &e.kind), Some(Kind::Dir)) {
                            subdirs += 1;
                        }
                        (c.to_string(), INodeNo(inodes.get(&child)))
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
                    attr: attr(ino, entry, nlink, time),
                    entry: entry.clone(),
                    children,
                },
            );
        }
        Snapshot { nodes }
    }
}

/// The FUSE file system over a replaceable [`Tree`].
pub struct DriverFs {
    inner: Arc<Shared>,
}

/// State shared between the FUSE threads and the handle that reloads the tree.
struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    inodes: Mutex<Inodes>,
    reads: AtomicU64,
}

/// Replaces the served tree and tells the kernel what changed.
#[derive(Clone)]
pub struct TreeHandle {
    inner: Arc<Shared>,
    notifier: Arc<Mutex<Option<Notifier>>>,
}

impl DriverFs {
    /// A file system serving `tree`, and the handle that replaces it later.
    pub fn new(tree: &Tree) -> (DriverFs, TreeHandle) {
        let mut inodes = Inodes::default();
        let snapshot = Snapshot::build(tree, &mut inodes, SystemTime::now());
        let inner = Arc::new(Shared {
            snapshot: RwLock::new(Arc::new(snapshot)),
            inodes: Mutex::new(inodes),
            reads: AtomicU64::new(0),
        });
        let handle = TreeHandle {
            inner: inner.clone(),
            notifier: Arc::new(Mutex::new(None)),
        };
        (DriverFs { inner }, handle)
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.inner
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl TreeHandle {
    /// Serves `tree` from now on; invalidates every entry that changed or vanished.
    /// Returns the number of invalidated entries.
    pub fn replace(&self, tree: &Tree) -> usize {
        let new = {
            let mut inodes = self.inner.inodes.lock().unwrap_or_else(|e| e.into_inner());
            Arc::new(Snapshot::build(tree, &mut inodes, SystemTime::now()))
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

    /// How many `read` requests reached the agent (kernel cache misses).
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::Relaxed)
    }

    fn set_notifier(&self, notifier: Notifier) {
        *self.notifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(notifier);
    }
}

impl Filesystem for DriverFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let snap = self.snapshot();
        let child = snap
            .nodes
            .get(&parent.0)
            .and_then(|p| p.children.iter().find(|(n, _)| OsStr::new(n) == name))
            .and_then(|(_, ino)| snap.nodes.get(&ino.0));
        match child {
            Some(node) => reply.entry(&TTL, &node.attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.snapshot().nodes.get(&ino.0) {
            Some(node) => reply.attr(&TTL, &node.attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.snapshot().nodes.get(&ino.0).map(|n| &n.entry.kind) {
            Some(Kind::Symlink(target)) => reply.data(target.as_bytes()),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Answered with ENOSYS so that the kernel stops sending opens and releases at all
    /// (`FUSE_NO_OPEN_SUPPORT`): a zero-message open keeps the page cache, and only regular
    /// files reach here (directories go to `opendir`, device nodes are refused by `nodev`).
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    /// ENOSYS likewise (`FUSE_NO_OPENDIR_SUPPORT`): directory handles carry no state here.
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
        let snap = self.snapshot();
        let Some(dir) = snap.nodes.get(&ino.0) else {
            reply.error(Errno::ENOENT);
            return;
        };
        if !matches!(dir.entry.kind, Kind::Dir) {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let dots = [
            (ino, FileType::Directory, "."),
            (dir.parent, FileType::Directory, ".."),
        ];
        let children = dir.children.iter().filter_map(|(name, ino)| {
            snap.nodes
                .get(&ino.0)
                .map(|n| (*ino, n.attr.kind, name.as_str()))
        });
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in dots.into_iter().chain(children).enumerate().skip(skip) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// A mounted driver tree; unmounts when dropped or on [`Mounted::unmount`].
pub struct Mounted {
    session: Option<BackgroundSession>,
    mountpoint: std::path::PathBuf,
    /// Replaces the served tree.
    pub handle: TreeHandle,
}

impl Mounted {
    /// Unmounts and waits for the FUSE thread to end. A mount still in use (an open file, a
    /// process's working directory) is detached lazily instead: it leaves the mount table at
    /// once and the FUSE thread serves its last users until they let go.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
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

/// Walks the mounted `tree` once, reading every file, so that the kernel caches every entry,
/// attribute and page: a consumer's first read after this is served by the kernel alone.
/// Returns the number of entries visited; entries that vanish meanwhile are skipped.
pub fn warm(mountpoint: &Path, tree: &Tree) -> usize {
    let mut buf = Vec::with_capacity(8192);
    tree.iter()
        .filter(|(path, entry)| {
            let path = mountpoint.join(path);
            match entry.kind {
                Kind::File(_) => {
                    buf.clear();
                    std::fs::File::open(&path)
                        .and_then(|mut f| io::Read::read_to_end(&mut f, &mut buf))
                        .is_ok()
                }
                _ => std::fs::symlink_metadata(&path).is_ok(),
            }
        })
        .count()
}

/// Mounts `tree` read-only at `mountpoint`: readable by every user when mounted by root
/// (`allow_other`), by the mounting user only otherwise (an unprivileged `allow_other` needs
/// `user_allow_other` in `/etc/fuse.conf`).
pub fn mount(tree: &Tree, mountpoint: &Path) -> io::Result<Mounted> {
    let (fs, handle) = DriverFs::new(tree);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
        MountOption::FSName("mockgpu".into()),
        MountOption::Subtype("mockgpu".into()),
    ];
    config.acl = if nix::unistd::geteuid().is_root() {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(2);
    let session = fuser::spawn_mount(fs, mountpoint, &config)?;
    handle.set_notifier(session.notifier());
    Ok(Mounted {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        handle,
    })
}
