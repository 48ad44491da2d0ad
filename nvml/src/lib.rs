//! `libnvidia-ml.so.1`: a mock NVML (NVIDIA Management Library) with NVML's C ABI.
//!
//! The library reads what the agent serves in the mock root (`$MOCKFS_ROOT`, unset or empty:
//! `/run/mockgpu/fs`): the driver files (`proc/driver/nvidia`, the GPUs' PCI sysfs) for identity
//! and placement, and `nvml/` for what only NVML knows (see `mockgpu_api::nvml` and
//! `docs/nvml.md`). It is `no_std` over libc's allocator and raw system calls, so that it needs
//! nothing newer than glibc 2.17; nothing in it can panic (the lints below), and every function
//! `nvml.h` declares is exported (those not implemented return `NVML_ERROR_NOT_SUPPORTED`).
//!
//! Modules: `ffi` (ABI types and codes), `sys` (system calls, lock, allocator), `parse` (the file
//! formats), `state` (loading the tree, the handles), then the exports by area.
#![cfg_attr(not(test), no_std)]
#![deny(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

extern crate alloc;

mod clocks;
mod device;
mod events;
mod ffi;
mod nvlink;
mod out;
mod parse;
mod state;
mod stubs;
mod sys;
mod system;
mod telemetry;

#[cfg(not(test))]
#[global_allocator]
static ALLOC: sys::Malloc = sys::Malloc;

mockgpu_cdylib_rt::runtime!();
