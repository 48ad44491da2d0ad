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

#[cfg(not(test))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Unreachable by construction (no indexing, no unchecked arithmetic); never unwind into C.
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

// `rust_eh_personality` and `_Unwind_Resume` are referenced by the unwind tables and landing
// pads of the precompiled `core` and `alloc` (built to unwind), never called: nothing here
// unwinds (`panic = "abort"`). Defined hidden, so that they are neither exported nor imported
// (no libgcc_s, whose `_Unwind_Resume` a program without it lacks); each traps if ever reached.
#[cfg(all(not(test), target_arch = "x86_64"))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    "rust_eh_personality:",
    "ud2",
    ".globl _Unwind_Resume",
    ".hidden _Unwind_Resume",
    "_Unwind_Resume:",
    "ud2"
);
#[cfg(all(not(test), target_arch = "aarch64"))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    "rust_eh_personality:",
    "brk #1",
    ".globl _Unwind_Resume",
    ".hidden _Unwind_Resume",
    "_Unwind_Resume:",
    "brk #1"
);
