//! Reading a shared library's ELF dynamic section: the symbol versions it needs and its dynamic
//! symbols. Shared by the shim's tests and the NVML library's (`nvml/tests`, through `#[path]`).
#![allow(dead_code)] // each test binary uses a different subset

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

/// Asserts that the library needs only libc and libdl, at GLIBC_2.17 or older.
pub fn assert_needs_nothing_newer_than_glibc_2_17(elf: &[u8]) {
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
