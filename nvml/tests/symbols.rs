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
