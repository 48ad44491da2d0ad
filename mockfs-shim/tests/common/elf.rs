//! Reading a shared library's ELF dynamic section (the libraries and symbol versions it needs,
//! its dynamic symbols) and the limits both of ours keep, per architecture. Shared by the shim's
//! tests and the NVML library's (`nvml/tests`, through `#[path]`).
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;

pub fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}
pub fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}
pub fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}
pub fn c_str(b: &[u8], at: usize) -> String {
    let end = b[at..].iter().position(|&c| c == 0).unwrap();
    String::from_utf8(b[at..at + end].to_vec()).unwrap()
}

pub struct Section {
    pub kind: usize,
    pub offset: usize,
    pub size: usize,
    pub link: usize,
}

/// The library's section headers (ELF64, little-endian).
pub fn sections(elf: &[u8]) -> Vec<Section> {
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
pub fn needed_versions(elf: &[u8], secs: &[Section]) -> Vec<(String, String)> {
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
pub fn dynamic_symbols(elf: &[u8], secs: &[Section]) -> Vec<(String, bool)> {
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

pub fn parse_version(v: &str) -> Vec<u32> {
    v.trim_start_matches("GLIBC_")
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// The shared libraries ours may depend on (`DT_NEEDED`, `.gnu.version_r`), each with why.
pub const LIBRARIES: &[&str] = &[
    // everything they import
    "libc.so.6",
    // linked by the libc crate (dlsym's home before glibc 2.34); nothing binds to it
    "libdl.so.2",
    // aarch64 glibc defines the stack protector's guard in the dynamic loader (see
    // `TOOLCHAIN_IMPORTS`)
    #[cfg(target_arch = "aarch64")]
    "ld-linux-aarch64.so.1",
];

/// What both libraries may import, each with why.
const COMMON_IMPORTS: &[&str] = &[
    // the system calls, errno, environment and panic of both libraries' own `sys.rs`
    "secure_getenv",
    "syscall",
    "__errno_location",
    "abort",
    // core's memory and string functions
    "strlen",
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "bcmp",
    // the C runtime's start and end files of a shared object
    "__cxa_finalize",
    "__gmon_start__",
    "_ITM_deregisterTMCloneTable",
    "_ITM_registerTMCloneTable",
];

/// What the target's precompiled `compiler_builtins` brings in, each with why.
const TOOLCHAIN_IMPORTS: &[&str] = &[
    // aarch64's outline atomics (an atomic read-modify-write calls `__aarch64_cas*`): compiler-rt's
    // constructor reads AT_HWCAP to choose LSE instructions or exclusive loads and stores
    #[cfg(target_arch = "aarch64")]
    "getauxval",
    // that C code as Debian compiles it, with -fstack-protector-strong
    #[cfg(target_arch = "aarch64")]
    "__stack_chk_fail",
    #[cfg(target_arch = "aarch64")]
    "__stack_chk_guard",
];

/// The names the library exports (defined global or weak dynamic symbols).
pub fn exported(elf: &[u8]) -> BTreeSet<String> {
    dynamic_symbols(elf, &sections(elf))
        .into_iter()
        .filter_map(|(name, defined)| defined.then_some(name))
        .collect()
}

/// Asserts that the library imports nothing but [`COMMON_IMPORTS`], [`TOOLCHAIN_IMPORTS`] and
/// `own`. A program without libgcc_s (a C program, Python) could resolve nothing else, and a
/// test binary, which has it, would not notice.
pub fn assert_imports_only(elf: &[u8], own: &[&str]) {
    let imported = dynamic_symbols(elf, &sections(elf))
        .into_iter()
        .filter_map(|(name, defined)| (!defined).then_some(name));
    for name in imported {
        assert!(
            [COMMON_IMPORTS, TOOLCHAIN_IMPORTS, own]
                .iter()
                .any(|allowed| allowed.contains(&name.as_str())),
            "unexpected import {name}"
        );
    }
}

/// The shared libraries the library names in `DT_NEEDED`.
pub fn needed_libraries(elf: &[u8], secs: &[Section]) -> Vec<String> {
    const DT_NULL: usize = 0;
    const DT_NEEDED: usize = 1;
    let dynamic = secs
        .iter()
        .find(|s| s.kind == 6)
        .expect("a .dynamic section");
    let strtab = secs[dynamic.link].offset;
    (0..dynamic.size / 16)
        .map(|i| dynamic.offset + i * 16)
        .map(|e| (u64_at(elf, e), u64_at(elf, e + 8)))
        .take_while(|&(tag, _)| tag != DT_NULL)
        .filter(|&(tag, _)| tag == DT_NEEDED)
        .map(|(_, name)| c_str(elf, strtab + name))
        .collect()
}

/// Asserts that the library depends on nothing but [`LIBRARIES`], at GLIBC_2.17 or older.
pub fn assert_needs_nothing_newer_than_glibc_2_17(elf: &[u8]) {
    let secs = sections(elf);
    for file in needed_libraries(elf, &secs) {
        assert!(
            LIBRARIES.contains(&file.as_str()),
            "unexpected dependency {file}"
        );
    }
    let needed = needed_versions(elf, &secs);
    assert!(
        needed.iter().any(|(_, v)| v.starts_with("GLIBC_")),
        "{needed:?}"
    );
    for (file, version) in &needed {
        assert!(
            LIBRARIES.contains(&file.as_str()),
            "unexpected dependency {file} ({version})"
        );
        assert!(version.starts_with("GLIBC_"), "{file}: {version}");
        assert!(
            parse_version(version) <= vec![2, 17],
            "{file} needs {version}"
        );
    }
}

/// Asserts that the library is one for the machine these tests run on (the same ELF
/// `e_machine` as this test binary): a cross test run never tests a host library.
pub fn assert_is_for_this_machine(elf: &[u8], target: &str) {
    let this = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(u16_at(elf, 0x12), u16_at(&this, 0x12), "{target}");
}
