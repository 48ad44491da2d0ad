//! The built library must load on glibc 2.17: no symbol version newer than GLIBC_2.17, no
//! dependency beyond libc and libdl, and exactly the hooks exported.

mod common;

use std::collections::BTreeSet;

use common::elf::{
    assert_needs_nothing_newer_than_glibc_2_17, dynamic_symbols, needed_versions, parse_version,
    sections, u16_at,
};

#[test]
fn needs_nothing_newer_than_glibc_2_17() {
    assert_needs_nothing_newer_than_glibc_2_17(&std::fs::read(common::shim()).unwrap());
}

/// A whole-workspace `cargo build` turns libc's `std` feature on for the shim too (feature
/// unification: the agent, nix and tokio ask for it), and libc then leaves linking libc to `std`.
/// The shim must still link, and with the same limits.
#[test]
fn links_with_libc_std_as_in_a_workspace_build() {
    let target = common::cargo_build(&["-p", "mockfs-shim", "--features", "libc/std"]);
    let elf = std::fs::read(target.join("debug/libmockfs.so")).unwrap();
    assert_needs_nothing_newer_than_glibc_2_17(&elf);
}

#[test]
fn exports_exactly_the_hooks_and_imports_only_libc() {
    let elf = std::fs::read(common::shim()).unwrap();
    let syms = dynamic_symbols(&elf, &sections(&elf));
    let defined: BTreeSet<_> = syms
        .iter()
        .filter(|(_, d)| *d)
        .map(|(n, _)| n.as_str())
        .collect();
    let hooks = "__fxstatat __fxstatat64 __lxstat __lxstat64 __open64_2 __open_2 __openat64_2 __openat_2 \
        __realpath_chk __xstat __xstat64 access canonicalize_file_name chdir creat creat64 eaccess euidaccess \
        faccessat fopen fopen64 freopen freopen64 fstatat fstatat64 ftw ftw64 get_current_dir_name getcwd \
        getxattr glob glob64 lgetxattr listxattr llistxattr lstat lstat64 nftw nftw64 open open64 openat \
        openat64 opendir readlink readlinkat realpath scandir scandir64 scandirat scandirat64 stat stat64 \
        statfs statfs64 statvfs statvfs64 statx";
    // Exactly the hooks: nothing else (such as Rust runtime symbols) leaks into the global scope.
    assert_eq!(defined, hooks.split_whitespace().collect::<BTreeSet<_>>());
    let undefined: BTreeSet<_> = syms
        .iter()
        .filter(|(_, d)| !*d)
        .map(|(n, _)| n.as_str())
        .collect();
    let allowed = [
        "dlsym",
        "secure_getenv",
        "syscall",
        "__errno_location",
        "abort",
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
    for name in undefined {
        assert!(allowed.contains(&name), "unexpected import {name}");
    }
}

/// The check above can fail: this test binary (Rust `std`) needs a newer glibc, and the parser
/// sees it.
#[test]
fn the_version_check_sees_newer_versions() {
    let elf = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let newest = needed_versions(&elf, &sections(&elf))
        .into_iter()
        .filter(|(_, v)| v.starts_with("GLIBC_") && !v.starts_with("GLIBC_PRIVATE"))
        .map(|(_, v)| parse_version(&v))
        .max()
        .unwrap();
    assert!(newest > vec![2, 17], "{newest:?}");
}

/// The library is one for the machine these tests run on (the same ELF `e_machine` as this test
/// binary): a cross test run never tests a host library.
#[test]
fn is_built_for_the_target_under_test() {
    let machine = |elf: &[u8]| u16_at(elf, 0x12);
    let shim = std::fs::read(common::shim()).unwrap();
    let this = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(machine(&shim), machine(&this), "{}", common::TARGET);
}
