//! `libmockfs.so`: an `LD_PRELOAD` library that redirects NVIDIA driver paths to a mock tree.
//!
//! Configuration (read once, when the library is loaded):
//! - `MOCKFS_ROOT`: the mock root, an absolute path (read with `secure_getenv`). Unset or empty
//!   means `/run/mockgpu/fs`. A relative path, a missing directory or an empty one (a FUSE mount
//!   point with nothing mounted) makes the library pass everything through.
//! - `MOCKFS_PREFIXES`: colon-separated absolute prefixes that replace the defaults. Entries that
//!   are empty, relative, contain `..`, are `/`, end in `/*` or are longer than 255 bytes are
//!   ignored; a trailing `*` makes the last component a name prefix (`/dev/nvidia*`).
//! - Defaults: `/proc/devices` (the merged list that publishes the driver's majors),
//!   `/proc/driver/nvidia`, `/sys/bus/pci/drivers/nvidia`, `/sys/bus/pci/devices`,
//!   `/sys/module/nvidia`, one prefix per line of `<root>/prefixes` (the mock GPUs' sysfs device
//!   directories), and `/dev/nvidia*` when `MOCKFS_DEV=1`.
//! - `MOCKFS_DEBUG=1`: notes on stderr (configuration, ignored entries, each redirect).
//!
//! One more rule: an `open` of an absolute `/dev/nvidia…` path that the device cgroup lets through
//! but no driver backs (`ENXIO`) gets a descriptor of `/dev/null` instead (`hooks::stand_in`).
//!
//! The matching rules are in `path.rs`; the hooks in `hooks.rs`.
#![cfg_attr(not(test), no_std)]
#![deny(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

#[cfg(not(test))]
mod hooks;
mod path;
#[cfg(not(test))]
mod sys;

mockgpu_cdylib_rt::runtime!();
