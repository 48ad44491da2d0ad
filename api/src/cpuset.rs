//! Sets of CPU ids and their two sysfs spellings: lists (`0-3,8`) and hex masks (`ff,ffffffff`).

use std::collections::BTreeSet;
use std::fmt;

/// A set of logical CPU ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

/// A CPU list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list {0:?}")]
pub struct CpuListError(pub String);

impl CpuSet {
    /// The set of the given CPU ids.
    pub fn from_ids(ids: impl IntoIterator<Item = u32>) -> Self {
        Self(ids.into_iter().collect())
    }

    /// Parses the kernel's list format (`0-3,8,10-11`); blank input is the empty set.
    pub fn parse_list(s: &str) -> Result<Self, CpuListError> {
        let err = || CpuListError(s.to_string());
        let mut set = BTreeSet::new();
        for part in s.trim().split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: u32 = lo.trim().parse().map_err(|_| err())?;
            let hi: u32 = hi.trim().parse().map_err(|_| err())?;
            if lo > hi || hi - lo > 65_535 {
                return Err(err());
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
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
            while iter.peek() == Some(&(end + 1)) {
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
