//! Sans-IO tuning of the spin time (`bp_timeout`) from a moving RTT estimate.
//!
//! The paper's guideline (§V-B, Fig. 13): the spin time should be "marginally longer than the
//! typical round-trip time". A wait is an RTT sample when the data arrived within the cap
//! (found while spinning, or woken shortly after arming); longer waits are idle gaps, not round
//! trips, and are ignored. The budget is `1.25 × EWMA + 1 µs`, clamped to `[0, cap]`.
//!
//! **Backing off** (beyond the paper). A spin is worth its CPU only while it catches data. The
//! tuner keeps a moving hit rate of the spins it granted (gain 1/8): a spin that ran out, or
//! that lost its core (the caller saw a gap of [`PREEMPT_GAP`] between two of its clock reads:
//! the thread was descheduled and waited for the scheduler, not for data), is a miss. Below a
//! 1/8 hit rate, [`next_budget`](SpinTuner::next_budget) grants no spin, except one probe in
//! every 16 waits, which lets the rate recover when the traffic changes. A server connection
//! whose next request comes a millisecond later stops burning 50 µs per call this way, while a
//! client waiting for its reply keeps spinning. Both directions work in fixed mode too: only
//! the RTT-following length needs `auto`.
//!
//! **Phases** (beyond the paper). One reader's waits are not all alike. A reader task that
//! always waits (rrpc-tonic's HTTP/2 path) waits, after a call's response, for its trailers (a
//! few microseconds away: a hit), then for the next response (the caller's think time and a
//! round trip away: at low load a far miss). One hit rate over both stayed near 1/2, so it
//! never backed off, and the idle wait spun its whole budget after every call. So the
//! judgement is kept per *phase*, the waits begun since this end last sent a message
//! ([`begin_wait`](SpinTuner::begin_wait): 0, 1, 2, and 3 or more): the trailers' wait (phase
//! 0: the request went out during the wait before) keeps spinning, the idle one (phase 1)
//! backs off on its own. A ping-pong or a stream keeps spinning in the phases it hits in.

use std::time::Duration;

/// Spin-time tuner for one registration. Time comes in as an argument (no clock reads).
#[derive(Debug, Clone)]
pub struct SpinTuner {
    cap_ns: u64,
    auto: bool,
    ewma_ns: u64,
    /// Moving hit rate of granted spins per phase, in 1/256ths.
    hit_rate: [u32; PHASES],
    /// Waits since the last granted spin (for the probe), per phase.
    skipped: [u32; PHASES],
    /// The current wait's phase ([`SpinTuner::begin_wait`]).
    phase: usize,
}

/// [`SpinTuner::PHASES`].
const PHASES: usize = SpinTuner::PHASES;

/// A gap this long between two clock reads of one spin means the spinner lost its core.
pub(crate) const PREEMPT_GAP: Duration = Duration::from_micros(20);
/// A spin that ran out is a miss only if the data came at least this late (and 4 budgets).
const FAR_MISS_MIN: Duration = Duration::from_micros(500);
/// Below this hit rate (in 1/256ths: 1/8) a wait does not spin.
const MIN_HIT_RATE: u32 = 32;
/// While backed off, one wait in this many spins anyway, to measure again.
const PROBE_EVERY: u32 = 16;
/// A spin that caught its data only after this long is scored a miss (the caller's
/// judgement, `Registration::wait_ready`): the same 50 µs after which a polling thread's spin
/// episode that woke nobody is a miss ([`crate::backoff::GovernorConfig::min_fruitless_spin`]).
/// It also bounds a probe ([`SpinTuner::next_budget`]).
pub(crate) const COSTLY_CATCH: Duration = Duration::from_micros(50);

/// Weight of a new sample: 1/8 (TCP's SRTT gain).
const GAIN_SHIFT: u32 = 3;
const SLACK_NS: u64 = 1_000;

impl SpinTuner {
    /// How many phases the waits are judged in ([`Self::begin_wait`]): waits begun since this
    /// end last sent, 0, 1, 2, and 3 or more.
    pub const PHASES: usize = 4;

    /// A tuner with `cap` as the configured `bp_timeout`; without `auto` the budget is always
    /// `cap`. The estimate starts at `cap`, so a fresh connection spins the full time.
    pub fn new(cap: Duration, auto: bool) -> Self {
        let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Self {
            cap_ns,
            auto,
            ewma_ns: cap_ns,
            hit_rate: [256; PHASES],
            skipped: [0; PHASES],
            phase: 0,
        }
    }

    /// Starts a wait: `sent` says whether this end sent a message since the previous wait
    /// began. The wait's phase is then 0, else one more than the previous wait's (at most
    /// [`Self::PHASES`]` - 1`). Every wait should begin, those that find their data at once
    /// included. A tuner whose waits never begin judges them all in phase 0 (one hit rate).
    pub fn begin_wait(&mut self, sent: bool) {
        self.phase = if sent {
            0
        } else {
            (self.phase + 1).min(PHASES - 1)
        };
    }

    /// The current wait's phase ([`Self::begin_wait`]).
    pub fn phase(&self) -> usize {
        self.phase
    }

    /// Whether the budget follows the RTT estimate (`auto`).
    pub fn is_auto(&self) -> bool {
        self.auto
    }

    /// The configured cap (`bp_timeout`).
    pub fn cap(&self) -> Duration {
        Duration::from_nanos(self.cap_ns)
    }

    /// The spin to grant the wait that starts now: [`budget`](Self::budget), or zero while
    /// the current phase's hit rate is below 1/8 (one probe spin every 16 of its waits).
    ///
    /// A probe spins at most `COSTLY_CATCH` (50 µs): only a catch sooner than that scores a
    /// hit, so a longer probe cannot bring spinning back; it only burns CPU. rrpc-tonic's
    /// HTTP/2 receivers spin up to 200 µs, and at one call per ms their probes spun the whole
    /// 200 µs for a request a millisecond away, or caught a response a wake-up (~100 µs) away
    /// and scored it a miss: up to 200 µs every 16th wait, for nothing the judgement could use.
    pub fn next_budget(&mut self) -> Duration {
        let p = self.phase;
        let probe = self.hit_rate[p] < MIN_HIT_RATE;
        if probe {
            self.skipped[p] += 1;
            if self.skipped[p] < PROBE_EVERY {
                return Duration::ZERO;
            }
        }
        self.skipped[p] = 0;
        if probe {
            self.budget().min(COSTLY_CATCH)
        } else {
            self.budget()
        }
    }

    /// Whether spinning is backed off in the current phase (its hit rate is below 1/8).
    pub fn backed_off(&self) -> bool {
        self.hit_rate[self.phase] < MIN_HIT_RATE
    }

    /// The moving hit rate of the current phase's granted spins, 0 to 1.
    pub fn hit_rate(&self) -> f64 {
        f64::from(self.hit_rate[self.phase]) / 256.0
    }

    /// Feeds the outcome of the current phase's granted spin: `true` if it caught the data
    /// soon enough to earn, `false` if it ran out, lost its core, caught the data only late, or
    /// was cut short because the worker's other tasks had work (the caller judges which).
    pub fn spun(&mut self, hit: bool) {
        let sample = if hit { 256 } else { 0 };
        let r = &mut self.hit_rate[self.phase];
        *r = *r - (*r >> GAIN_SHIFT) + (sample >> GAIN_SHIFT);
    }

    /// Feeds a granted spin that ran out, once the data came after `waited` in all: a miss
    /// only when the data came far later than the spin could have reached (at least
    /// `max(4 × budget, 500 µs)`: a server waiting a millisecond for its next request). A
    /// near miss says nothing: the data was a wake-up away, and counting it would keep both
    /// ends of a ping-pong sleeping (each end's wake-up delays the other's data past its spin).
    pub fn ran_out(&mut self, waited: Duration) {
        let far = (self.budget() * 4).max(FAR_MISS_MIN);
        if waited >= far {
            self.spun(false);
        }
    }

    /// Whether a gap between two clock reads of a spin means the spinner was descheduled.
    pub fn lost_core(gap: Duration) -> bool {
        gap >= PREEMPT_GAP
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

    #[test]
    fn spins_that_miss_back_off_to_a_probe_and_hits_bring_them_back() {
        let mut t = SpinTuner::new(Duration::from_micros(50), false);
        assert_eq!(t.next_budget(), Duration::from_micros(50));
        let mut granted = 0;
        for _ in 0..40 {
            if !t.next_budget().is_zero() {
                granted += 1;
                t.spun(false);
            }
        }
        assert!(t.backed_off(), "rate {}", t.hit_rate());
        // Once backed off, one wait in 16 still spins.
        let probes = (0..160).filter(|_| !t.next_budget().is_zero()).count();
        assert_eq!(probes, 10);
        assert!(granted < 40);
        // Probes that hit bring spinning back.
        while t.backed_off() {
            if !t.next_budget().is_zero() {
                t.spun(true);
            }
        }
        assert_eq!(t.next_budget(), Duration::from_micros(50));
    }

    #[test]
    fn a_probe_spins_no_longer_than_a_catch_that_can_score() {
        let mut t = SpinTuner::new(Duration::from_micros(200), false);
        assert_eq!(t.next_budget(), Duration::from_micros(200));
        while !t.backed_off() {
            if !t.next_budget().is_zero() {
                t.spun(false);
            }
        }
        let probes: Vec<Duration> = (0..64)
            .map(|_| t.next_budget())
            .filter(|b| !b.is_zero())
            .collect();
        assert_eq!(probes, vec![COSTLY_CATCH; 4]);
        // Hits bring back the whole budget.
        while t.backed_off() {
            if !t.next_budget().is_zero() {
                t.spun(true);
            }
        }
        assert_eq!(t.next_budget(), Duration::from_micros(200));
        // A budget under the bound probes at its own length.
        let mut t = SpinTuner::new(Duration::from_micros(20), false);
        while !t.backed_off() {
            if !t.next_budget().is_zero() {
                t.spun(false);
            }
        }
        let probe = (0..16).map(|_| t.next_budget()).find(|b| !b.is_zero());
        assert_eq!(probe, Some(Duration::from_micros(20)));
    }

    #[test]
    fn near_misses_never_back_off_far_misses_do() {
        let mut t = SpinTuner::new(Duration::from_micros(50), false);
        // A ping-pong whose peer answers 120 us later: a wake-up away, not idle.
        for _ in 0..100 {
            assert!(!t.next_budget().is_zero());
            t.ran_out(Duration::from_micros(120));
        }
        assert!(!t.backed_off());
        // A server whose next request comes 1 ms later.
        for _ in 0..20 {
            if !t.next_budget().is_zero() {
                t.ran_out(Duration::from_millis(1));
            }
        }
        assert!(t.backed_off());
    }

    /// A reader task that always waits, one call per millisecond: each call's wait for the
    /// trailers hits (phase 0: the request went out during the wait before), the wait for
    /// the next response runs out a millisecond short (phase 1). One hit rate over both
    /// never backs off; per phase the idle wait stops spinning and the trailers' keeps.
    #[test]
    fn the_idle_phase_backs_off_and_the_reply_phase_keeps_spinning() {
        let run = |phases: bool| {
            let mut t = SpinTuner::new(Duration::from_micros(200), false);
            let mut idle_spins = 0;
            for call in 0..200 {
                // The wait for the next response: the request is sent during it. (Without
                // phases the waits never begin: all in phase 0.)
                if phases {
                    t.begin_wait(false);
                }
                if !t.next_budget().is_zero() {
                    t.ran_out(Duration::from_millis(1));
                    if call >= 100 {
                        idle_spins += 1;
                    }
                }
                // The wait for the trailers: a request went out since the last wait began.
                if phases {
                    t.begin_wait(true);
                }
                assert!(!t.next_budget().is_zero(), "the trailers' wait spins");
                t.spun(true);
            }
            idle_spins
        };
        // Backed off: one probe in 16 of the last 100 idle waits.
        assert!(run(true) <= 7, "{}", run(true));
        assert_eq!(run(false), 100, "one hit rate never backs off");
    }

    #[test]
    fn a_mostly_hitting_spin_never_backs_off() {
        let mut t = SpinTuner::new(Duration::from_micros(50), true);
        for i in 0..1000 {
            assert!(!t.next_budget().is_zero());
            // Three hits in four.
            t.spun(i % 4 != 0);
        }
        assert!(!t.backed_off());
    }

    #[test]
    fn a_gap_of_preempt_gap_means_the_core_was_lost() {
        assert!(!SpinTuner::lost_core(Duration::from_micros(2)));
        assert!(SpinTuner::lost_core(PREEMPT_GAP));
    }

    proptest! {
        /// The hit rate stays in [0, 1] and a backed-off tuner grants exactly one spin per
        /// 16 waits until a hit.
        #[test]
        fn hit_rate_is_bounded(outcomes in proptest::collection::vec(any::<bool>(), 0..200)) {
            let mut t = SpinTuner::new(Duration::from_micros(50), false);
            for hit in outcomes {
                if !t.next_budget().is_zero() {
                    t.spun(hit);
                }
                prop_assert!((0.0..=1.0).contains(&t.hit_rate()));
            }
        }

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
