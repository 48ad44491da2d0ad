//! The FUSE requests: lookups, attributes, reads and listings of the current snapshot.

use std::ffi::OsStr;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry,
    ReplyOpen, Request,
};

use super::pci::LIVE_TTL;
use super::snapshot::{DOTS, Snapshot, TTL};
use super::state::Shared;
use crate::tree::Kind;

/// The FUSE file system over a replaceable [`crate::tree::Tree`].
pub(super) struct DriverFs {
    inner: Arc<Shared>,
}

impl DriverFs {
    /// Serves what `inner` holds.
    pub(super) fn new(inner: Arc<Shared>) -> DriverFs {
        DriverFs { inner }
    }

    /// The attributes of `ino` and their TTL: from the tree (the live directory with the time
    /// of its last change as mtime), else from the live listing.
    fn attr_of(&self, snap: &Snapshot, ino: u64) -> Option<(FileAttr, Duration)> {
        if let Some(n) = snap.nodes.get(&ino) {
            if snap.live_dir != Some(ino) {
                return Some((n.attr, TTL));
            }
            let mut attr = n.attr;
            if let Some(live) = self.inner.live() {
                (attr.mtime, attr.ctime) = (live.changed, live.changed);
            }
            return Some((attr, LIVE_TTL));
        }
        snap.live_dir?;
        let live = self.inner.live()?;
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
        let snap = self.inner.snapshot();
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
            .then(|| self.inner.live())
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
        let snap = self.inner.snapshot();
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
            .then(|| self.inner.live())
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
        let snap = self.inner.snapshot();
        match self.attr_of(&snap, ino.0) {
            Some((attr, ttl)) => reply.attr(&ttl, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let snap = self.inner.snapshot();
        match snap.nodes.get(&ino.0).map(|n| &n.entry.kind) {
            Some(Kind::Symlink(target)) => reply.data(target.as_bytes()),
            Some(_) => reply.error(Errno::EINVAL),
            None => {
                let live = snap.live_dir.and_then(|_| self.inner.live());
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
        match self
            .inner
            .snapshot()
            .nodes
            .get(&ino.0)
            .map(|n| &n.entry.kind)
        {
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
