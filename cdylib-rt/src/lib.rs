//! The runtime items of the `no_std` libraries that C programs load (`libmockfs.so`,
//! `libnvidia-ml.so.1`): one macro, [`runtime!`], that a library expands once at its root.
//!
//! It defines, outside `cfg(test)` (tests run on `std`):
//! - the panic handler: it aborts. Nothing in these libraries can panic (their lints forbid
//!   indexing, unchecked arithmetic and unwraps), and a panic must never unwind into C.
//! - `rust_eh_personality` and `_Unwind_Resume`: the unwind tables and landing pads of the
//!   precompiled `core` and `alloc` (built to unwind) refer to them, and nothing calls them
//!   (`panic = "abort"`). They are defined hidden, so that they are neither exported (they could
//!   capture another Rust library's unwinding) nor imported (no `libgcc_s`, whose
//!   `_Unwind_Resume` a program without it lacks); each traps if ever reached.
//!
//! A macro rather than items in this crate: the linker takes an archive member only for a
//! symbol still undefined when it reaches it, and `core`, which refers to these, comes after
//! every dependency on the link line; items expanded into the library itself are always there.
#![no_std]

/// Ends the process: what the panic handler of [`runtime!`] calls.
pub fn abort() -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// Expands, at a `no_std` library's root, to its panic handler and unwinding stubs (see the
/// crate's documentation).
#[macro_export]
macro_rules! runtime {
    () => {
        #[cfg(not(test))]
        #[panic_handler]
        fn panic(_: &core::panic::PanicInfo) -> ! {
            $crate::abort()
        }

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
    };
}
