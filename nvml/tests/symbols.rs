//! The built library loads on glibc 2.17 with only libc, is named `libnvidia-ml.so.1`, and
//! exports exactly the functions `nvml.h` declares (`nvml-h-functions.txt`, generated from the
//! header as `src/stubs.rs` says).

mod common;

use std::collections::BTreeSet;

use common::elf::{assert_needs_nothing_newer_than_glibc_2_17, dynamic_symbols, sections};

#[test]
fn needs_nothing_newer_than_glibc_2_17() {
    assert_needs_nothing_newer_than_glibc_2_17(&std::fs::read(common::library_path()).unwrap());
}

/// A whole-workspace build turns libc's `std` feature on for this crate too (feature
/// unification), and libc then leaves linking libc to `std`: the library must still link, with
/// the same limits.
#[test]
fn links_with_libc_std_as_in_a_workspace_build() {
    let target = common::cargo_build(&["-p", "mockgpu-nvml", "--features", "libc/std"]);
    let elf = std::fs::read(target.join("debug/libnvidia_ml.so")).unwrap();
    assert_needs_nothing_newer_than_glibc_2_17(&elf);
}

#[test]
fn exports_exactly_the_header_functions() {
    let elf = std::fs::read(common::library_path()).unwrap();
    let defined: BTreeSet<String> = dynamic_symbols(&elf, &sections(&elf))
        .into_iter()
        .filter(|(_, d)| *d)
        .map(|(n, _)| n)
        .collect();
    let header: BTreeSet<String> = include_str!("nvml-h-functions.txt")
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(header.len(), 347);
    assert_eq!(defined, header);
}

#[test]
fn its_soname_is_libnvidia_ml_so_1() {
    let elf = std::fs::read(common::library_path()).unwrap();
    let needle = b"\0libnvidia-ml.so.1\0";
    assert!(elf.windows(needle.len()).any(|w| w == needle));
}

/// Only libc functions are imported: a program without libgcc_s (a C program, Python) could not
/// resolve anything else, and this test binary, which has it, would not notice.
#[test]
fn imports_only_libc() {
    let elf = std::fs::read(common::library_path()).unwrap();
    let allowed = [
        "secure_getenv",
        "syscall",
        "__errno_location",
        "abort",
        "malloc",
        "free",
        "posix_memalign",
        "strlen",
        "memcpy",
        "memmove",
        "memset",
        "memcmp",
        "bcmp",
        "__cxa_finalize",
        "__gmon_start__",
        "_ITM_deregisterTMCloneTable",
        "_ITM_registerTMCloneTable",
    ];
    for (name, _) in dynamic_symbols(&elf, &sections(&elf))
        .into_iter()
        .filter(|(_, defined)| !defined)
    {
        assert!(allowed.contains(&name.as_str()), "unexpected import {name}");
    }
}
