//! The built library loads on glibc 2.17 with only libc (and what `common/elf.rs` allows on this
//! architecture), is named `libnvidia-ml.so.1`, is built for the machine under test, and exports
//! exactly the functions `nvml.h` declares (`nvml-h-functions.txt`, generated from the header as
//! `src/stubs.rs` says).

mod common;

use std::collections::BTreeSet;

use common::elf::{
    assert_imports_only, assert_is_for_this_machine, assert_needs_nothing_newer_than_glibc_2_17,
    exported,
};

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
    let header: BTreeSet<String> = include_str!("nvml-h-functions.txt")
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(header.len(), 347);
    assert_eq!(
        exported(&std::fs::read(common::library_path()).unwrap()),
        header
    );
}

#[test]
fn its_soname_is_libnvidia_ml_so_1() {
    let elf = std::fs::read(common::library_path()).unwrap();
    let needle = b"\0libnvidia-ml.so.1\0";
    assert!(elf.windows(needle.len()).any(|w| w == needle));
}

/// Only libc functions are imported: besides what both libraries import, the allocator's.
#[test]
fn imports_only_libc() {
    assert_imports_only(
        &std::fs::read(common::library_path()).unwrap(),
        &["malloc", "free", "posix_memalign"],
    );
}

#[test]
fn is_built_for_the_target_under_test() {
    assert_is_for_this_machine(
        &std::fs::read(common::library_path()).unwrap(),
        common::TARGET,
    );
}
