//! Percentiles and summaries. Every bench takes the p-quantile of n samples as the sample at
//! index round(p·(n−1)) of the sorted samples.

use std::time::Duration;

/// The index of the p-quantile among `n` sorted samples: round(p·(n−1)).
pub fn rank(n: usize, p: f64) -> usize {
    ((n.max(1) - 1) as f64 * p).round() as usize
}

/// The p-quantile of `sorted`; zero when there are none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[rank(sorted.len(), p)]
}

/// p50 and p99 of `v`, in any order.
pub fn p50_p99(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Three decimals, for the JSON.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Two decimals, for the JSON.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Count, p50, p90, min and max of samples (milliseconds, KiB: the unit is the caller's).
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// `None` without samples.
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut s: Vec<f64> = samples.into_iter().collect();
        s.sort_by(f64::total_cmp);
        let at = |p: f64| s.get(rank(s.len(), p)).copied();
        Some(Self {
            n: s.len(),
            p50: at(0.5)?,
            p90: at(0.9)?,
            min: *s.first()?,
            max: *s.last()?,
        })
    }

    /// Of durations, in milliseconds.
    pub fn of_ms(samples: &[Duration]) -> Option<Self> {
        Self::of(samples.iter().map(|d| ms(*d)))
    }
}
