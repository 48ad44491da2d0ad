//! The served files' formats: `Key: value` lines (the driver's `information` file and the
//! agent's `nvml/` files), sysfs numbers and CPU lists, PCI bus ids and UUIDs.

use alloc::vec::Vec;

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t' | b'\n' | b'\r'] = s {
        s = rest;
    }
    s
}

/// The `key: value` lines of a file (both trimmed of blanks), split once for many lookups.
pub struct Fields<'a>(Vec<(&'a [u8], &'a [u8])>);

impl<'a> Fields<'a> {
    pub fn new(text: &'a [u8]) -> Fields<'a> {
        Fields(
            text.split(|&b| b == b'\n')
                .filter_map(|line| {
                    let colon = line.iter().position(|&b| b == b':')?;
                    let (k, v) = (line.get(..colon)?, line.get(colon.saturating_add(1)..)?);
                    Some((trim(k), trim(v)))
                })
                .collect(),
        )
    }

    /// The value of the first line with `key`.
    pub fn get(&self, key: &str) -> Option<&'a [u8]> {
        self.0
            .iter()
            .find(|(k, _)| *k == key.as_bytes())
            .map(|&(_, v)| v)
    }
}

/// The value of the first line `key: value` of `text`.
#[cfg(test)]
pub fn value<'a>(text: &'a [u8], key: &str) -> Option<&'a [u8]> {
    Fields::new(text).get(key)
}

/// A decimal number, or hexadecimal after `0x` (sysfs ids).
pub fn number(s: &[u8]) -> Option<u64> {
    let s = trim(s);
    let (digits, radix) = match s {
        [b'0', b'x' | b'X', hex @ ..] => (hex, 16),
        _ => (s, 10),
    };
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(radix)?;
        n.checked_mul(u64::from(radix))?.checked_add(u64::from(d))
    })
}

/// A number that fits `u32`.
pub fn number_u32(s: &[u8]) -> Option<u32> {
    number(s).and_then(|n| u32::try_from(n).ok())
}

/// A sysfs `numa_node`: a number or `-1`.
pub fn numa_node(s: &[u8]) -> Option<i32> {
    match trim(s) {
        b"-1" => Some(-1),
        n => number(n).and_then(|n| i32::try_from(n).ok()),
    }
}

/// Most CPUs a list may name (the kernel's NR_CPUS limit is far below).
pub const MAX_CPUS: u32 = 1 << 16;

/// A CPU list (`0-3,8,10-11`; empty is no CPU), as the CPU ids.
pub fn cpu_list(s: &[u8]) -> Option<Vec<u32>> {
    let s = trim(s);
    let mut cpus = Vec::new();
    if s.is_empty() {
        return Some(cpus);
    }
    for part in s.split(|&b| b == b',') {
        let (lo, hi) = match part.iter().position(|&b| b == b'-') {
            Some(dash) => (part.get(..dash)?, part.get(dash.saturating_add(1)..)?),
            None => (part, part),
        };
        let (lo, hi) = (number_u32(lo)?, number_u32(hi)?);
        if lo > hi || hi >= MAX_CPUS {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// A comma-separated list of numbers.
pub fn numbers(s: &[u8]) -> Option<Vec<u32>> {
    trim(s).split(|&b| b == b',').map(number_u32).collect()
}

/// A PCI address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusId {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

fn hex(s: &[u8], max_len: usize) -> Option<u32> {
    if s.is_empty() || s.len() > max_len {
        return None;
    }
    s.iter().try_fold(0u32, |n, &b| {
        let d = char::from(b).to_digit(16)?;
        n.checked_mul(16)?.checked_add(d)
    })
}

impl BusId {
    /// `[domain:]bus:device.function` in hex, any case, a domain of up to 8 digits (the forms
    /// `nvmlDeviceGetHandleByPciBusId` accepts).
    pub fn parse(s: &[u8]) -> Option<BusId> {
        let s = trim(s);
        let dot = s.iter().rposition(|&b| b == b'.')?;
        let (head, function) = (s.get(..dot)?, s.get(dot.saturating_add(1)..)?);
        let mut parts = head.rsplit(|&b| b == b':');
        let device = hex(parts.next()?, 2)?;
        let bus = hex(parts.next()?, 2)?;
        let domain = parts.next().map_or(Some(0), |d| hex(d, 8))?;
        if parts.next().is_some() || device > 31 {
            return None;
        }
        Some(BusId {
            domain,
            bus,
            device,
            function: hex(function, 1).filter(|&f| f < 8)?,
        })
    }

    /// `dddd:bb:dd.f` (NVML's legacy form, 16 bytes with the NUL) into `out`.
    pub fn legacy(&self, out: &mut [u8; 16]) {
        self.write(out, 4);
    }

    /// `dddddddd:bb:dd.f` (NVML's form, 32 bytes with the NUL) into `out`.
    pub fn full(&self, out: &mut [u8; 32]) {
        self.write(out, 8);
    }

    fn write(&self, out: &mut [u8], domain_digits: u32) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let mut at = 0usize;
        let mut put = |b: u8| {
            if let Some(slot) = out.get_mut(at) {
                *slot = b;
            }
            at = at.saturating_add(1);
        };
        let digits = |v: u32, n: u32, put: &mut dyn FnMut(u8)| {
            for i in (0..n).rev() {
                let nibble = v.checked_shr(i.saturating_mul(4)).unwrap_or(0) & 0xf;
                put(HEX.get(nibble as usize).copied().unwrap_or(b'0'));
            }
        };
        digits(self.domain, domain_digits, &mut put);
        put(b':');
        digits(self.bus, 2, &mut put);
        put(b':');
        digits(self.device, 2, &mut put);
        put(b'.');
        digits(self.function, 1, &mut put);
        put(0);
    }
}

/// The driver version in `/proc/driver/nvidia/version`: the field after the module name
/// (`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.173.02  Release Build …`).
pub fn driver_version(text: &[u8]) -> Option<&[u8]> {
    let line = text.split(|&b| b == b'\n').next()?;
    let rest = line.strip_prefix(b"NVRM version: ")?;
    rest.split(|&b| b == b' ')
        .find(|w| w.first().is_some_and(u8::is_ascii_digit) && w.contains(&b'.'))
        .filter(|v| v.iter().all(|&b| b.is_ascii_digit() || b == b'.'))
}

/// The 16 bytes of a `8-4-4-4-12` hex UUID.
pub fn uuid_bytes(s: &[u8]) -> Option<[u8; 16]> {
    let s = trim(s);
    let lens: Vec<usize> = s.split(|&b| b == b'-').map(<[u8]>::len).collect();
    if lens != [8, 4, 4, 4, 12] {
        return None;
    }
    let digits: Vec<u8> = s.iter().copied().filter(|&b| b != b'-').collect();
    let mut out = [0u8; 16];
    for (byte, pair) in out.iter_mut().zip(digits.chunks(2)) {
        *byte = u8::try_from(hex(pair, 2)?).ok()?;
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn key_values() {
        let info = b"Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-1\nBus Location: \t 0000:18:00.0\n";
        assert_eq!(value(info, "Model"), Some(&b"NVIDIA H100"[..]));
        assert_eq!(value(info, "Bus Location"), Some(&b"0000:18:00.0"[..]));
        assert_eq!(value(info, "GPU"), None);
        assert_eq!(
            value(b"Fabric Cluster UUID: a-b\n", "Fabric Cluster UUID"),
            Some(&b"a-b"[..])
        );
    }

    #[test]
    fn numbers_and_lists() {
        assert_eq!(number(b"0x10de\n"), Some(0x10de));
        assert_eq!(number(b"81559"), Some(81559));
        assert_eq!(number(b"-1"), None);
        assert_eq!(number(b"99999999999999999999"), None);
        assert_eq!(numa_node(b"-1\n"), Some(-1));
        assert_eq!(numa_node(b"1\n"), Some(1));
        assert_eq!(cpu_list(b"0-3,8\n"), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(cpu_list(b"\n"), Some(vec![]));
        assert_eq!(cpu_list(b"3-1"), None);
        assert_eq!(cpu_list(b"0-99999999"), None);
        assert_eq!(numbers(b"1980,1965,345"), Some(vec![1980, 1965, 345]));
        assert_eq!(numbers(b"1980,x"), None);
    }

    #[test]
    fn bus_ids() {
        let b = BusId::parse(b"0008:06:00.0").unwrap();
        assert_eq!((b.domain, b.bus, b.device, b.function), (8, 6, 0, 0));
        assert_eq!(BusId::parse(b"00000008:06:00.0"), Some(b));
        assert_eq!(BusId::parse(b"0008:06:00.0\n"), Some(b));
        assert_eq!(BusId::parse(b"18:00.0").unwrap().bus, 0x18);
        assert_eq!(BusId::parse(b"0:0:0:00.0"), None);
        assert_eq!(BusId::parse(b"0000:18:20.0"), None);
        assert_eq!(BusId::parse(b"0000:18:00"), None);
        let mut legacy = [0xffu8; 16];
        BusId::parse(b"000a:1b:00.0").unwrap().legacy(&mut legacy);
        assert_eq!(&legacy[..13], b"000A:1B:00.0\0");
        let mut full = [0xffu8; 32];
        b.full(&mut full);
        assert_eq!(&full[..17], b"00000008:06:00.0\0");
    }

    #[test]
    fn driver_versions() {
        let v = b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.173.02  Release Build  (dvs-builder@U22)  Mon Sep 29\nGCC version: x\n";
        assert_eq!(driver_version(v), Some(&b"580.173.02"[..]));
        assert_eq!(driver_version(b"garbage"), None);
    }

    #[test]
    fn uuids() {
        let u = uuid_bytes(b"6f3e2b1a-8c4d-4e5f-9a0b-1c2d3e4f5a6b").unwrap();
        assert_eq!(u[0], 0x6f);
        assert_eq!(u[15], 0x6b);
        assert_eq!(uuid_bytes(b"6f3e2b1a8c4d4e5f9a0b1c2d3e4f5a6b"), None);
        assert_eq!(uuid_bytes(b"6f3e2b1a-8c4d-4e5f-9a0b-1c2d3e4f5a6g"), None);
    }
}
