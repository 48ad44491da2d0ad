//! The built library must load on glibc 2.17: no symbol version newer than GLIBC_2.17, no
//! dependency beyond libc and libdl, and exactly the hooks exported.

mod common;

use std::collections::BTreeSet;

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}
fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}
fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}
fn c_str(b: &[u8], at: usize) -> String {
    let end = b[at..].iter().position(|&c| c == 0).unwrap();
    String::from_utf8(b[at..at + end].to_vec()).unwrap()
}

struct Section {
    kind: usize,
    offset: usize,
    size: usize,
    link: usize,
}

/// The library's section headers (ELF64, little-endian).
fn sections(elf: &[u8]) -> Vec<Section> {
    assert_eq!(&elf[..6], b"\x7fELF\x02\x01", "64-bit little-endian ELF");
    let (shoff, shentsize, shnum) = (u64_at(elf, 0x28), u16_at(elf, 0x3a), u16_at(elf, 0x3c));
    (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            Section {
                kind: u32_at(elf, h + 4),
                offset: u64_at(elf, h + 0x18),
                size: u64_at(elf, h + 0x20),
                link: u32_at(elf, h + 0x28),
            }
        })
        .collect()
}

/// `(library, version)` for every version the library needs (`.gnu.version_r`).
fn needed_versions(elf: &[u8], secs: &[Section]) -> Vec<(String, String)> {
    let verneed = secs
        .iter()
        .find(|s| s.kind == 0x6fff_fffe)
        .expect("a .gnu.version_r section");
    let strtab = secs[verneed.link].offset;
    let mut out = Vec::new();
    let mut at = verneed.offset;
    loop {
        let (cnt, file, aux, next) = (
            u16_at(elf, at + 2),
            u32_at(elf, at + 4),
            u32_at(elf, at + 8),
            u32_at(elf, at + 12),
        );
        let mut a = at + aux;
        for _ in 0..cnt {
            out.push((
                c_str(elf, strtab + file),
                c_str(elf, strtab + u32_at(elf, a + 8)),
            ));
            a += u32_at(elf, a + 12);
        }
        if next == 0 {
            break out;
        }
        at += next;
    }
}

/// `(name, defined)` for every global or weak dynamic symbol. Local entries are skipped: they
/// are neither exported nor imported, and GNU ld for aarch64 puts some into `.dynsym`.
fn dynamic_symbols(elf: &[u8], secs: &[Section]) -> Vec<(String, bool)> {
    const STB_LOCAL: u8 = 0;
    let dynsym = secs
        .iter()
        .find(|s| s.kind == 11)
        .expect("a .dynsym section");
    let strtab = secs[dynsym.link].offset;
    (1..dynsym.size / 24)
        .map(|i| dynsym.offset + i * 24)
        .filter(|&s| elf[s + 4] >> 4 != STB_LOCAL)
        .map(|s| (c_str(elf, strtab + u32_at(elf, s)), u16_at(elf, s + 6) != 0))
        .collect()
}

fn parse_version(v: &str) -> Vec<u32> {
    v.trim_start_matches("GLIBC_")
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect()
}

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

fn assert_needs_nothing_newer_than_glibc_2_17(elf: &[u8]) {
    let secs = sections(elf);
    let needed = needed_versions(elf, &secs);
    assert!(
        needed.iter().any(|(_, v)| v.starts_with("GLIBC_")),
        "{needed:?}"
    );
    for (file, version) in &needed {
        assert!(
            ["libc.so.6", "libdl.so.2"].contains(&file.as_str()),
            "unexpected dependency {file} ({version})"
        );
        assert!(version.starts_with("GLIBC_"), "{file}: {version}");
        assert!(
            parse_version(version) <= vec![2, 17],
            "{file} needs {version}"
        );
    }
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
