//! Latency histograms per operation type, as YCSB's measurements report
//! them: count, throughput, mean, p50/p99/p99.9 and max.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::OpKind;

/// One hdrhistogram (nanoseconds, 1 ns to 60 s, 3 significant digits) and an
/// error count per [`OpKind`]. Each client keeps its own; [`Stats::merge`]
/// adds them up.
#[derive(Debug, Clone)]
pub struct Stats {
    hists: Vec<Histogram<u64>>,
    errors: [u64; OpKind::ALL.len()],
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

/// One operation type's numbers, latencies in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The operation type (`None`: all types together).
    pub kind: Option<OpKind>,
    /// Operations that succeeded.
    pub count: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Successful operations per second over the run.
    pub throughput: f64,
    /// Mean latency.
    pub mean_us: f64,
    /// Median latency.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest latency.
    pub max_us: f64,
}

impl Summary {
    /// The header of [`Summary::csv_row`].
    pub const CSV_HEADER: &'static str =
        "op,count,errors,throughput_ops_s,mean_us,p50_us,p99_us,p999_us,max_us";

    /// The type's name (`TOTAL` for all together).
    pub fn name(&self) -> &'static str {
        self.kind.map_or("TOTAL", OpKind::name)
    }

    /// One CSV line (no newline), columns as [`Summary::CSV_HEADER`].
    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{:.1},{:.2},{:.2},{:.2},{:.2},{:.2}",
            self.name(),
            self.count,
            self.errors,
            self.throughput,
            self.mean_us,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us
        )
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid hdrhistogram bounds")
}

impl Stats {
    /// Empty.
    pub fn new() -> Self {
        Stats {
            hists: OpKind::ALL.iter().map(|_| histogram()).collect(),
            errors: [0; OpKind::ALL.len()],
        }
    }

    /// A successful operation of `kind` that took `latency` (clamped to the
    /// histogram's 60 s).
    pub fn record(&mut self, kind: OpKind, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.hists[kind as usize].saturating_record(ns);
    }

    /// A failed operation of `kind`.
    pub fn record_error(&mut self, kind: OpKind) {
        self.errors[kind as usize] += 1;
    }

    /// Adds `other`'s operations to these.
    pub fn merge(&mut self, other: &Stats) {
        for (a, b) in self.hists.iter_mut().zip(&other.hists) {
            a.add(b).expect("histograms of the same bounds");
        }
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
    }

    /// Successful operations of `kind`.
    pub fn count(&self, kind: OpKind) -> u64 {
        self.hists[kind as usize].len()
    }

    /// Failed operations of `kind`.
    pub fn errors(&self, kind: OpKind) -> u64 {
        self.errors[kind as usize]
    }

    /// One row per operation type that ran, then the total, for a run that
    /// took `elapsed`.
    pub fn summary(&self, elapsed: Duration) -> Vec<Summary> {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let row = |kind, h: &Histogram<u64>, errors| Summary {
            kind,
            count: h.len(),
            errors,
            throughput: h.len() as f64 / secs,
            mean_us: if h.is_empty() { 0.0 } else { h.mean() / 1e3 },
            p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
            p999_us: h.value_at_quantile(0.999) as f64 / 1e3,
            max_us: h.max() as f64 / 1e3,
        };
        let mut total = histogram();
        let mut rows = Vec::new();
        for (i, kind) in OpKind::ALL.iter().enumerate() {
            let h = &self.hists[i];
            if h.is_empty() && self.errors[i] == 0 {
                continue;
            }
            total.add(h).expect("same bounds");
            rows.push(row(Some(*kind), h, self.errors[i]));
        }
        rows.push(row(None, &total, self.errors.iter().sum()));
        rows
    }

    /// [`Stats::summary`] as an aligned text table.
    pub fn table(&self, elapsed: Duration) -> String {
        let mut s = format!(
            "{:<8} {:>10} {:>7} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "op", "count", "errors", "ops/s", "mean µs", "p50 µs", "p99 µs", "p99.9 µs", "max µs"
        );
        for r in self.summary(elapsed) {
            let _ = writeln!(
                s,
                "{:<8} {:>10} {:>7} {:>12.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                r.name(),
                r.count,
                r.errors,
                r.throughput,
                r.mean_us,
                r.p50_us,
                r.p99_us,
                r.p999_us,
                r.max_us
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_merge() {
        let mut a = Stats::new();
        let mut b = Stats::new();
        for i in 1..=1000u64 {
            a.record(OpKind::Read, Duration::from_micros(i));
        }
        b.record(OpKind::Update, Duration::from_micros(5));
        b.record_error(OpKind::Update);
        a.merge(&b);
        let rows = a.summary(Duration::from_secs(1));
        assert_eq!(rows.len(), 3);
        let read = &rows[0];
        assert_eq!(read.kind, Some(OpKind::Read));
        assert_eq!(read.count, 1000);
        assert!((read.p50_us - 500.0).abs() < 2.0, "{read:?}");
        assert!((read.p99_us - 990.0).abs() < 2.0, "{read:?}");
        assert!((read.throughput - 1000.0).abs() < 1e-6);
        let total = rows.last().unwrap();
        assert_eq!((total.count, total.errors), (1001, 1));
        assert!(total.csv_row().starts_with("TOTAL,1001,1,"));
        assert!(a.table(Duration::from_secs(1)).contains("UPDATE"));
    }
}
