//! The state shared between the FUSE threads and the handle that reloads the tree.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use super::pci::{HostPci, LiveListing};
use super::snapshot::{Inodes, Snapshot};
use crate::pinner::Pinner;
use crate::tree::Tree;

/// The served tree, its inode numbers, the live host PCI listing and the counters.
pub(super) struct Shared {
    pub(super) snapshot: RwLock<Arc<Snapshot>>,
    pub(super) inodes: Mutex<Inodes>,
    host_pci: Option<HostPci>,
    pub(super) time: SystemTime,
    pub(super) reads: AtomicU64,
    pub(super) requests: AtomicU64,
    /// The process that holds the mounted entries in the kernel's caches.
    pub(super) pinner: Mutex<Option<Pinner>>,
}

impl Shared {
    /// The state of a file system serving `tree`. With `sysfs`, the host's entries of
    /// `sys/bus/pci/devices` are listed live from `<sysfs>/bus/pci/devices` instead of the
    /// copies rendered into `tree`.
    pub(super) fn new(tree: &Tree, sysfs: Option<&Path>) -> Shared {
        let time = SystemTime::now();
        let mut inodes = Inodes::default();
        let snapshot = Snapshot::build(tree, &mut inodes, time, sysfs.is_some());
        Shared {
            snapshot: RwLock::new(Arc::new(snapshot)),
            inodes: Mutex::new(inodes),
            host_pci: sysfs.map(HostPci::new),
            time,
            reads: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            pinner: Mutex::new(None),
        }
    }

    /// The current snapshot (not counted as a request).
    pub(super) fn current(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The current snapshot; counts the request.
    pub(super) fn snapshot(&self) -> Arc<Snapshot> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.current()
    }

    /// Whether the host's PCI devices are served live.
    pub(super) fn is_live(&self) -> bool {
        self.host_pci.is_some()
    }

    /// The host's PCI devices, when served live (see [`HostPci::listing`]).
    pub(super) fn live(&self) -> Option<Arc<LiveListing>> {
        let host = self.host_pci.as_ref()?;
        Some(host.listing(&self.inodes, self.time))
    }
}
