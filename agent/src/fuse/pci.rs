//! The host's part of `sys/bus/pci/devices`, listed live from the host's sysfs.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuser::{FileAttr, FileType};

use super::snapshot::{Child, HOST_PCI_DIR, Inodes, attr};
use crate::host::SysfsHost;
use crate::tree::Kind;

/// How long a listing of the host's PCI devices is reused, and the kernel's TTL for them.
pub(crate) const LIVE_TTL: Duration = Duration::from_secs(1);

/// One of the host's PCI devices as a symlink in [`HOST_PCI_DIR`].
#[derive(Clone)]
pub(super) struct LiveEntry {
    pub(super) child: Child,
    pub(super) attr: FileAttr,
    pub(super) target: String,
}

/// The host's PCI devices as last listed, in inode order.
pub(super) struct LiveListing {
    at: Instant,
    /// When the listing last changed: the directory's mtime, which tells the kernel to drop
    /// its cached listing (kept there since `opendir` is zero-message).
    pub(super) changed: SystemTime,
    pub(super) entries: Vec<LiveEntry>,
}

impl LiveListing {
    pub(super) fn get(&self, ino: u64) -> Option<&LiveEntry> {
        self.entries
            .binary_search_by_key(&ino, |e| e.child.ino)
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// The live part of [`HOST_PCI_DIR`].
pub(super) struct HostPci {
    sysfs: SysfsHost,
    listing: Mutex<Option<Arc<LiveListing>>>,
}

impl HostPci {
    /// Lists `<sysfs>/bus/pci/devices`.
    pub(super) fn new(sysfs: &Path) -> HostPci {
        HostPci {
            sysfs: SysfsHost::new(sysfs),
            listing: Mutex::new(None),
        }
    }

    /// The host's PCI devices, listed again when the last listing is older than [`LIVE_TTL`];
    /// their inodes come from `inodes`, their times are `time`.
    pub(super) fn listing(&self, inodes: &Mutex<Inodes>, time: SystemTime) -> Arc<LiveListing> {
        let mut cached = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = cached.as_ref().filter(|l| l.at.elapsed() < LIVE_TTL) {
            return l.clone();
        }
        let devices = match self.sysfs.pci_devices() {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the host's PCI devices; serving the last listing");
                let last = LiveListing {
                    at: Instant::now(),
                    changed: cached.as_ref().map_or(time, |l| l.changed),
                    entries: cached
                        .as_ref()
                        .map(|l| l.entries.clone())
                        .unwrap_or_default(),
                };
                return cached.insert(Arc::new(last)).clone();
            }
        };
        let mut inodes = inodes.lock().unwrap_or_else(|e| e.into_inner());
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
                    attr: attr(ino, &link, 0o777, 1, time),
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
        listing
    }
}
