//! Sans-IO tuning of the spin time (`bp_timeout`) from a moving RTT estimate.
//!
//! The paper's guideline (§V-B, Fig. 13): the spin time should be "marginally longer than the
//! typical round-trip time". A wait is an RTT sample when the data arrived within the cap
//! (found while spinning, or woken shortly after arming); longer waits are idle gaps, not round
//! trips, and are ignored. The budget is `1.25 × EWMA + 1 µs`, clamped to `[0, cap]`.

use std::time::Duration;

/// Spin-time tuner for one registration. Time comes in as an argument (no clock reads).
#[derive(Debug, Clone)]
pub struct SpinTuner {
    cap_ns: u64,
    auto: bool,
    ewma_ns: u64,
}

/// Weight of a new sample: 1/8 (TCP's SRTT gain).
const GAIN_SHIFT: u32 = 3;
const SLACK_NS: u64 = 1_000;

impl SpinTuner {
    /// A tuner with `cap` as the configured `bp_timeout`; without `auto` the budget is always
    /// `cap`. The estimate starts at `cap`, so a fresh connection spins the full time.
    pub fn new(cap: Duration, auto: bool) -> Self {
        let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Self {
            cap_ns,
            auto,
            ewma_ns: cap_ns,
        }
    }

    /// How long the next wait should spin.
    pub fn budget(&self) -> Duration {
        if !self.auto {
            return Duration::from_nanos(self.cap_ns);
        }
        let b = self
            .ewma_ns
            .saturating_add(self.ewma_ns / 4)
            .saturating_add(SLACK_NS);
        Duration::from_nanos(b.min(self.cap_ns))
    }

    /// Feeds the duration of a completed wait (from its start to the moment data was seen).
    pub fn observe(&mut self, waited: Duration) {
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        if ns > self.cap_ns {
            return;
        }
        // ewma += (ns - ewma) / 8, in integers.
        self.ewma_ns = self.ewma_ns - (self.ewma_ns >> GAIN_SHIFT) + (ns >> GAIN_SHIFT);
    }

    /// The current RTT estimate.
    pub fn rtt_estimate(&self) -> Duration {
        Duration::from_nanos(self.ewma_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn converges_to_slightly_above_rtt() {
        let mut t = SpinTuner::new(Duration::from_micros(100), true);
        assert_eq!(t.budget(), Duration::from_micros(100));
        for _ in 0..200 {
            t.observe(Duration::from_micros(8));
        }
        let b = t.budget();
        assert!(
            b > Duration::from_micros(8) && b < Duration::from_micros(13),
            "{b:?}"
        );
    }

    #[test]
    fn idle_gaps_are_not_samples_and_cap_holds() {
        let mut t = SpinTuner::new(Duration::from_micros(20), true);
        for _ in 0..100 {
            t.observe(Duration::from_micros(5));
        }
        let before = t.budget();
        for _ in 0..100 {
            t.observe(Duration::from_millis(3));
        }
        assert_eq!(t.budget(), before);
        assert!(t.budget() <= Duration::from_micros(20));
    }

    #[test]
    fn fixed_without_auto() {
        let mut t = SpinTuner::new(Duration::from_micros(7), false);
        t.observe(Duration::from_nanos(100));
        assert_eq!(t.budget(), Duration::from_micros(7));
    }

    proptest! {
        #[test]
        fn budget_never_exceeds_cap(cap_us in 0u64..1000, samples in proptest::collection::vec(0u64..2_000_000, 0..50)) {
            let mut t = SpinTuner::new(Duration::from_micros(cap_us), true);
            for s in samples {
                t.observe(Duration::from_nanos(s));
                prop_assert!(t.budget() <= Duration::from_micros(cap_us));
            }
        }
    }
}
