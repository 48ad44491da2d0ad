//! The handle that replaces the served tree, invalidates what changed and warms the kernel's
//! caches.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::{INodeNo, Notifier};

use super::snapshot::Snapshot;
use super::state::Shared;
use crate::pinner::Pinner;
use crate::tree::Tree;

/// Replaces the served tree and tells the kernel what changed.
#[derive(Clone)]
pub struct TreeHandle {
    inner: Arc<Shared>,
    notifier: Arc<Mutex<Notifier>>,
    mountpoint: Arc<Path>,
}

impl TreeHandle {
    /// The handle of the tree `inner` holds, mounted at `mountpoint` and served by the session
    /// whose notifier is `notifier`.
    pub(super) fn new(inner: Arc<Shared>, notifier: Notifier, mountpoint: &Path) -> TreeHandle {
        TreeHandle {
            inner,
            notifier: Arc::new(Mutex::new(notifier)),
            mountpoint: mountpoint.into(),
        }
    }

    /// Serves `tree` from now on; invalidates every entry that changed or vanished.
    /// Returns the number of invalidated entries.
    pub fn replace(&self, tree: &Tree) -> usize {
        let new = {
            let mut inodes = self.inner.inodes.lock().unwrap_or_else(|e| e.into_inner());
            let live = self.inner.is_live();
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
            // ENOENT only means the kernel had nothing cached for it.
            let _ = notifier.inval_inode(INodeNo(ino), 0, -1);
            if ino != INodeNo::ROOT.0 && !new.nodes.contains_key(&ino) {
                let _ = notifier.inval_entry(node.parent, OsStr::new(&node.name));
            }
        }
        changed
    }

    /// Invalidates what the kernel may cache of `paths`, the tree an earlier agent served on
    /// this connection (kept by the keeper, with the kernel's caches): every entry's attributes
    /// and pages, and the names the tree served now lacks. Returns the number of paths.
    pub(crate) fn forget(&self, paths: &[String]) -> usize {
        let snap = self.inner.current();
        // Numbered first, notified after: a notification can wait on a directory that a
        // request holds, and serving that request can need the inode numbers (the live PCI
        // listing).
        let numbered: Vec<(u64, INodeNo, &str)> = {
            let mut inodes = self.inner.inodes.lock().unwrap_or_else(|e| e.into_inner());
            paths
                .iter()
                .filter(|p| !p.is_empty())
                .map(|path| {
                    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
                    (inodes.get(path), INodeNo(inodes.get(parent)), name)
                })
                .collect()
        };
        let n = self.notifier.lock().unwrap_or_else(|e| e.into_inner());
        for (ino, parent, name) in numbered {
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
    /// entry, attribute and page, keeps a descriptor open on every entry and every file's pages
    /// mapped and locked (replacing those of an earlier walk): the kernel evicts neither dentries
    /// in use nor mapped pages, so even after its caches were dropped a consumer's read sends
    /// no request. The walk, the descriptors and the mappings are a child's, `<program>
    /// pin-tree` ([`crate::pinner`]), never this process's own. Returns the number of entries
    /// visited; entries that vanish meanwhile are skipped.
    pub fn warm(&self, tree: &Tree, program: &Path) -> usize {
        let root = &self.mountpoint;
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
        if walked.mapped > walked.locked {
            tracing::warn!(
                locked = walked.locked,
                files = walked.mapped,
                "memory lock limit too low to lock every file's pages: memory pressure may evict the rest"
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
}
