//! The "ours / baseline" ratio column.

use std::fmt;

/// A ratio `ours / baseline`, printed as `1.23x` (or `n/a` when the baseline is zero or missing).
///
/// For throughput a ratio above 1 means rrpc is faster; for latency, below 1. Tables say which
/// in their column name (`x_vs_tcp` for throughput, `lat_x_vs_tcp` for latency).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio(pub Option<f64>);

impl Ratio {
    /// `ours / baseline`; `n/a` if `baseline` is not a positive finite number.
    pub fn of(ours: f64, baseline: f64) -> Self {
        if baseline.is_finite() && baseline > 0.0 && ours.is_finite() {
            Ratio(Some(ours / baseline))
        } else {
            Ratio(None)
        }
    }

    /// The ratio, if defined.
    pub fn get(self) -> Option<f64> {
        self.0
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "{r:.2}x"),
            None => f.write_str("n/a"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_formats_and_guards_zero() {
        assert_eq!(Ratio::of(3.0, 2.0).to_string(), "1.50x");
        assert_eq!(Ratio::of(3.0, 0.0).to_string(), "n/a");
        assert_eq!(Ratio::of(f64::NAN, 1.0).get(), None);
    }
}
