//! Sets of CPU ids and their two sysfs spellings: lists (`0-3,8`) and hex masks (`ff,ffffffff`).

use std::collections::BTreeSet;
use std::fmt;

/// CPU ids are below this bound: far above what any Linux build allows (`NR_CPUS` is at most
/// 8192 on x86-64), low enough that masks of every possible CPU stay small.
pub const MAX_CPUS: u32 = 1 << 16;

/// A set of logical CPU ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

/// A CPU list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list {list:?}: {reason}")]
pub struct CpuListError {
    /// The list as given.
    pub list: String,
    /// What is wrong with it.
    pub reason: String,
}

impl CpuSet {
    /// The set of the given CPU ids.
    pub fn from_ids(ids: impl IntoIterator<Item = u32>) -> Self {
        Self(ids.into_iter().collect())
    }

    /// Parses the kernel's list format (`0-3,8,10-11`); blank input is the empty set. CPU ids
    /// must be below [`MAX_CPUS`].
    pub fn parse_list(s: &str) -> Result<Self, CpuListError> {
        let err = |reason: String| CpuListError {
            list: s.to_string(),
            reason,
        };
        let id = |part: &str| -> Result<u32, CpuListError> {
            let id: u32 = part
                .trim()
                .parse()
                .map_err(|_| err(format!("{part:?} is not a cpu id")))?;
            if id >= MAX_CPUS {
                return Err(err(format!(
                    "cpu id {id} is out of range (at most {})",
                    MAX_CPUS - 1
                )));
            }
            Ok(id)
        };
        let mut set = BTreeSet::new();
        for part in s.trim().split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let (lo, hi) = (id(lo)?, id(hi)?);
            if lo > hi {
                return Err(err(format!("range {part:?} runs backwards")));
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }

    /// The highest CPU id, if any.
    pub fn last(&self) -> Option<u32> {
        self.0.last().copied()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The CPU ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The union of two sets.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    /// The kernel's list format, as in `local_cpulist` (no newline).
    pub fn to_list(&self) -> String {
        let mut out = String::new();
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while end
                .checked_add(1)
                .is_some_and(|next| iter.peek() == Some(&next))
            {
                end += 1;
                iter.next();
            }
            if !out.is_empty() {
                out.push(',');
            }
            if start == end {
                out.push_str(&start.to_string());
            } else {
                out.push_str(&format!("{start}-{end}"));
            }
        }
        out
    }

    /// The kernel's mask format, as in `local_cpus`: 32-bit hex groups separated by commas, for
    /// `nr_cpus` possible CPUs; the leading group is only as wide as the CPU count needs.
    pub fn to_mask(&self, nr_cpus: u32) -> String {
        let nr = nr_cpus.max(1);
        let groups = nr.div_ceil(32);
        let mut out = String::new();
        for g in (0..groups).rev() {
            let mut word: u32 = 0;
            for bit in 0..32 {
                if self.0.contains(&(g * 32 + bit)) {
                    word |= 1 << bit;
                }
            }
            if g == groups - 1 {
                let width = ((nr - g * 32).div_ceil(4)) as usize;
                out.push_str(&format!("{word:0width$x}"));
            } else {
                out.push_str(&format!(",{word:08x}"));
            }
        }
        out
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trip() {
        let s = CpuSet::parse_list("0-3,8,10-11\n").unwrap();
        assert_eq!(s.len(), 7);
        assert_eq!(s.to_list(), "0-3,8,10-11");
        assert!(CpuSet::parse_list("").unwrap().is_empty());
        assert!(CpuSet::parse_list("3-1").is_err());
        assert!(CpuSet::parse_list("a").is_err());
    }

    #[test]
    fn huge_cpu_ids_are_named_errors() {
        let e = CpuSet::parse_list("0-1,4294967295\n").unwrap_err();
        assert!(
            e.to_string().contains("cpu id 4294967295 is out of range"),
            "{e}"
        );
        let e = CpuSet::parse_list("0-4294967296").unwrap_err();
        assert!(
            e.to_string().contains("\"4294967296\" is not a cpu id"),
            "{e}"
        );
        assert!(CpuSet::parse_list("65535").is_ok());
        assert!(CpuSet::parse_list("65536").is_err());
    }

    #[test]
    fn lists_and_masks_reach_the_largest_ids() {
        let top = CpuSet::from_ids([0, u32::MAX - 1, u32::MAX]);
        assert_eq!(top.to_list(), "0,4294967294-4294967295");
        assert_eq!(top.last(), Some(u32::MAX));
        let s = CpuSet::from_ids([MAX_CPUS - 1]);
        let mask = s.to_mask(MAX_CPUS);
        assert!(mask.starts_with("80000000,00000000,"), "{mask}");
        assert_eq!(mask.split(',').count(), (MAX_CPUS / 32) as usize);
    }

    #[test]
    fn masks_match_the_kernel() {
        assert_eq!(CpuSet::from_ids([0, 1]).to_mask(2), "3");
        assert_eq!(CpuSet::from_ids(0..64).to_mask(64), "ffffffff,ffffffff");
        assert_eq!(
            CpuSet::from_ids(0..72).to_mask(144),
            "0000,00000000,000000ff,ffffffff,ffffffff"
        );
        assert_eq!(CpuSet::from_ids(4..8).to_mask(8), "f0");
    }
}
