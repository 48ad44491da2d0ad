//! The driver tree served read-only over FUSE.
//!
//! Inode numbers are derived from the path (a fixed hash) and never given to another path, so a
//! reload keeps the inodes of unchanged entries, and an agent that takes over the connection
//! through the keeper (`mockgpu-agent keeper`) numbers every entry as its predecessor did, which
//! the kernel's cached entries rely on; every changed or removed entry is invalidated through the
//! kernel notifier.
//! Files report their exact size; opens are zero-message (the kernel keeps the page cache) and
//! TTLs are long, so warm reads are served by the kernel without a round trip to the agent.
//!
//! The host's part of `sys/bus/pci/devices` can be served live: listed from the host's sysfs
//! when asked (cached for `LIVE_TTL`, the TTL the kernel gets for those entries too), beside
//! the mock GPUs' entries, so that a device hot-plugged after the start shows up.
//!
//! Directory offsets are cookies, not positions: children are listed in inode order and an
//! entry's cookie is derived from its inode number. `opendir` stays ENOSYS (no per-open state, no
//! request per `opendir`/`releasedir`); since inodes are never reused, a reload between two
//! `readdir` calls of one listing can neither skip nor repeat an entry present in both trees:
//! the next call resumes after the last cookie returned, wherever that entry is now.
//!
//! The parts: `snapshot` (one version of the tree, indexed by inode), `pci` (the live host PCI
//! listing), `state` (what the FUSE threads and the handle share), `filesystem` (the requests),
//! `handle` (reloads, invalidation, warming), `mount` (the mount's lifecycle), `direct` (serving
//! the device a keeper passed) and `record` (the served-paths log).

mod direct;
mod filesystem;
mod handle;
mod mount;
mod pci;
mod record;
mod snapshot;
mod state;

pub use handle::TreeHandle;
pub(crate) use mount::serve_through_keeper;
pub use mount::{Mounted, mount};
pub(crate) use record::{record_paths, recorded_paths};
