//! Latency percentiles over an hdrhistogram.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// A latency recorder in nanoseconds (1 ns .. 100 s, 3 significant digits).
#[derive(Debug, Clone)]
pub struct Latency {
    hist: Histogram<u64>,
}

/// Percentiles of a [`Latency`], in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Minimum.
    pub min_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Maximum.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
}

impl Summary {
    /// Median in microseconds.
    pub fn p50_us(&self) -> f64 {
        self.p50_ns as f64 / 1e3
    }
    /// p99 in microseconds.
    pub fn p99_us(&self) -> f64 {
        self.p99_ns as f64 / 1e3
    }
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty recorder.
    pub fn new() -> Self {
        Latency {
            hist: Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds"),
        }
    }

    /// Records one sample (clamped into 1 ns .. 100 s).
    pub fn record(&mut self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records one sample in nanoseconds (clamped into 1 ns .. 100 s).
    pub fn record_ns(&mut self, ns: u64) {
        self.hist.saturating_record(ns.max(1));
    }

    /// Records `count` samples of `ns` each (for batched timing: total / batch).
    pub fn record_n(&mut self, ns: u64, count: u64) {
        let _ = self.hist.record_n(ns.clamp(1, 100_000_000_000), count);
    }

    /// Adds another recorder's samples (merging per-thread recorders).
    pub fn merge(&mut self, other: &Latency) {
        let _ = self.hist.add(&other.hist);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The percentiles (all zero when empty).
    pub fn summary(&self) -> Summary {
        if self.hist.is_empty() {
            return Summary::default();
        }
        let h = &self.hist;
        Summary {
            count: h.len(),
            min_ns: h.min(),
            p50_ns: h.value_at_quantile(0.5),
            p90_ns: h.value_at_quantile(0.9),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
            mean_ns: h.mean(),
        }
    }
}

/// Operations per second (`ops / elapsed`), 0 for a zero duration.
pub fn rate(ops: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 { ops as f64 / s } else { 0.0 }
}

/// Bytes per second expressed in GiB/s.
pub fn gib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    rate(bytes, elapsed) / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut l = Latency::new();
        for ns in 1..=1000 {
            l.record_ns(ns * 10);
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert_eq!(s.min_ns, 10);
        // 3 significant digits: within 0.1 %.
        assert!((5000..=5010).contains(&s.p50_ns), "{}", s.p50_ns);
        assert!((9900..=9910).contains(&s.p99_ns), "{}", s.p99_ns);
        assert!((10_000..=10_010).contains(&s.max_ns), "{}", s.max_ns);
    }

    #[test]
    fn merge_and_empty() {
        assert_eq!(Latency::new().summary(), Summary::default());
        let mut a = Latency::new();
        let mut b = Latency::new();
        a.record_n(100, 3);
        b.record(Duration::from_micros(1));
        a.merge(&b);
        assert_eq!(a.count(), 4);
        assert_eq!(a.summary().max_ns, 1000);
    }

    #[test]
    fn rates() {
        assert_eq!(rate(10, Duration::ZERO), 0.0);
        assert_eq!(rate(10, Duration::from_secs(2)), 5.0);
        assert_eq!(gib_per_s(1 << 30, Duration::from_secs(1)), 1.0);
    }
}
