//! Latency summaries.

use std::time::Duration;

/// Median, 90th percentile, min and max of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median_ms: f64,
    pub p90_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

/// Nearest-rank percentile of a sorted, non-empty slice (`p` in 0..=100).
fn percentile(sorted: &[f64], p: usize) -> f64 {
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Summarises a sample; `None` when it is empty.
pub fn summarize(sample: &[Duration]) -> Option<Summary> {
    let mut ms: Vec<f64> = sample.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let (first, last) = (*ms.first()?, *ms.last()?);
    let median = if ms.len() % 2 == 1 {
        ms[ms.len() / 2]
    } else {
        (ms[ms.len() / 2 - 1] + ms[ms.len() / 2]) / 2.0
    };
    Some(Summary {
        n: ms.len(),
        median_ms: median,
        p90_ms: percentile(&ms, 90),
        min_ms: first,
        max_ms: last,
    })
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} median_ms={:.2} p90_ms={:.2} min_ms={:.2} max_ms={:.2}",
            self.n, self.median_ms, self.p90_ms, self.min_ms, self.max_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn odd_and_even() {
        let s = summarize(&ms(&[5, 1, 3])).unwrap();
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (3.0, 1.0, 5.0));
        let s = summarize(&ms(&[4, 1, 3, 2])).unwrap();
        assert_eq!(s.median_ms, 2.5);
    }

    #[test]
    fn p90_nearest_rank() {
        let s = summarize(&ms(&(1..=20).collect::<Vec<_>>())).unwrap();
        assert_eq!(s.p90_ms, 18.0);
        assert_eq!(summarize(&ms(&[7])).unwrap().p90_ms, 7.0);
    }

    #[test]
    fn empty() {
        assert!(summarize(&[]).is_none());
    }
}
