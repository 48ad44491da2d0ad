//! The built library must load on glibc 2.17: no symbol version newer than GLIBC_2.17, no
//! dependency or import beyond those `common/elf.rs` allows on this architecture, and exactly
//! the hooks exported.

mod common;

use common::elf::{
    assert_imports_only, assert_is_for_this_machine, assert_needs_nothing_newer_than_glibc_2_17,
    exported, needed_libraries, needed_versions, parse_version, sections,
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
fn exports_exactly_the_hooks() {
    let hooks = "__fxstatat __fxstatat64 __lxstat __lxstat64 __open64_2 __open_2 __openat64_2 __openat_2 \
        __realpath_chk __xstat __xstat64 access canonicalize_file_name chdir creat creat64 eaccess euidaccess \
        faccessat fopen fopen64 freopen freopen64 fstatat fstatat64 ftw ftw64 get_current_dir_name getcwd \
        getxattr glob glob64 lgetxattr listxattr llistxattr lstat lstat64 nftw nftw64 open open64 openat \
        openat64 opendir readlink readlinkat realpath scandir scandir64 scandirat scandirat64 stat stat64 \
        statfs statfs64 statvfs statvfs64 statx";
    // Exactly the hooks: nothing else (such as Rust runtime symbols) leaks into the global scope.
    assert_eq!(
        exported(&std::fs::read(common::shim()).unwrap()),
        hooks.split_whitespace().map(String::from).collect()
    );
}

/// Only libc functions are imported: besides what both libraries import, the next definitions of
/// the hooked functions.
#[test]
fn imports_only_libc() {
    assert_imports_only(&std::fs::read(common::shim()).unwrap(), &["dlsym"]);
}

/// The dependency and version checks can fail: this test binary (Rust `std`) needs libgcc_s and
/// a newer glibc, and the parser sees both.
#[test]
fn the_checks_see_what_a_std_program_needs() {
    let elf = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let secs = sections(&elf);
    let libraries = needed_libraries(&elf, &secs);
    assert!(
        libraries.iter().any(|l| l == "libgcc_s.so.1"),
        "{libraries:?}"
    );
    let newest = needed_versions(&elf, &secs)
        .into_iter()
        .filter(|(_, v)| v.starts_with("GLIBC_") && !v.starts_with("GLIBC_PRIVATE"))
        .map(|(_, v)| parse_version(&v))
        .max()
        .unwrap();
    assert!(newest > vec![2, 17], "{newest:?}");
}

#[test]
fn is_built_for_the_target_under_test() {
    assert_is_for_this_machine(&std::fs::read(common::shim()).unwrap(), common::TARGET);
}
