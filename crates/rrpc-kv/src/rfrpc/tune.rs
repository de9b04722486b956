//! Tuners (sans-IO): `fetch_size` F and `retry_limit` R by the enumeration
//! of paper §3.2 (Eq. 2), and the batch size by the step rule of §4.2
//! (Eq. 3). Both take measurements as arguments; neither reads a clock.
//! Users who know their numbers set F and R in
//! [`crate::rfrpc::RfClientConfig`] instead.

use std::time::Duration;

use crate::error::{Error, Result};

/// Paper's upper bound N of R (§3.2: "we choose N to be 5").
pub const DEFAULT_MAX_RETRY: u32 = 5;
/// Paper's L (§3.2: "L is 256 bytes").
pub const DEFAULT_MIN_FETCH: usize = 256;
/// Paper's H (§3.2: "H is 1024 bytes").
pub const DEFAULT_MAX_FETCH: usize = 1024;

/// The measured operation rate I_{R,F} of the fabric for each candidate
/// (R, F): "tested by running benchmarks only once" (§3.2).
#[derive(Debug, Clone, Default)]
pub struct RateTable {
    rows: Vec<(u32, usize, f64)>,
}

impl RateTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records I_{R,F} = `ops_per_sec` (later records of the same pair win).
    pub fn insert(&mut self, retry_limit: u32, fetch_size: usize, ops_per_sec: f64) -> &mut Self {
        self.rows
            .retain(|&(r, f, _)| (r, f) != (retry_limit, fetch_size));
        self.rows.push((retry_limit, fetch_size, ops_per_sec));
        self
    }

    /// A table from a function over R in `1..=max_retry` and F in
    /// `min_fetch..=max_fetch` stepping by `step` (for synthetic models and
    /// benchmarks that sweep a grid).
    pub fn from_fn(
        max_retry: u32,
        min_fetch: usize,
        max_fetch: usize,
        step: usize,
        mut rate: impl FnMut(u32, usize) -> f64,
    ) -> Self {
        let mut t = RateTable::new();
        for r in 1..=max_retry {
            let mut f = min_fetch;
            while f <= max_fetch {
                t.rows.push((r, f, rate(r, f)));
                f += step.max(1);
            }
        }
        t
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there is no candidate.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// The choice of [`choose_fetch_and_retry`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FetchChoice {
    /// R.
    pub retry_limit: u32,
    /// F, in bytes of the response frame (header included).
    pub fetch_size: usize,
    /// The score T of Eq. 2 for this pair.
    pub score: f64,
}

/// Eq. 2: T = Σ_i T_i with T_i = I_{R,F} when F ≥ S_i and I_{R,F}/2 when
/// F < S_i (two READs). Enumerates every row of `table` (the paper's
/// (H−L)·N candidates) over the sampled sizes `samples` (S_i, in bytes of
/// the response frame: use [`crate::rfrpc::wire::response_frame_len`] on
/// result lengths). Ties go to the smaller F, then the smaller R (less
/// bandwidth and client CPU for the same throughput). Cost
/// O((H−L)·N·M).
///
/// # Errors
/// [`Error::InvalidConfig`] for an empty table or no samples.
pub fn choose_fetch_and_retry(table: &RateTable, samples: &[usize]) -> Result<FetchChoice> {
    if table.is_empty() || samples.is_empty() {
        return Err(Error::InvalidConfig(
            "tuning needs a rate table and at least one sampled result size".into(),
        ));
    }
    let mut best: Option<FetchChoice> = None;
    for &(r, f, i) in &table.rows {
        let score: f64 = samples
            .iter()
            .map(|&s| if f >= s { i } else { i / 2.0 })
            .sum();
        let better = match best {
            None => true,
            Some(b) => {
                score > b.score
                    || (score == b.score
                        && (f < b.fetch_size || (f == b.fetch_size && r < b.retry_limit)))
            }
        };
        if better {
            best = Some(FetchChoice {
                retry_limit: r,
                fetch_size: f,
                score,
            });
        }
    }
    best.ok_or_else(|| Error::InvalidConfig("no candidate".into()))
}

/// Eq. 2 re-run periodically over sampled result sizes (§3.2: "sampling
/// periodically during its run"), as a sans-IO state machine. The client
/// reports each result's response-frame size; every `every` results (once
/// at least [`FetchTuner::MIN_SAMPLES`] are kept) the tuner re-runs
/// [`choose_fetch_and_retry`] over the last `window` sizes and returns the
/// choice when it differs from the last one. Drive it with
/// [`crate::rfrpc::RfClient::auto_fetch`]; measure the table once with
/// [`crate::rfrpc::RfClient::measure_rates`] (the paper: "I_{R,F} is
/// tested by running benchmarks only once").
#[derive(Debug, Clone)]
pub struct FetchTuner {
    table: RateTable,
    samples: Vec<usize>,
    next: usize,
    window: usize,
    every: u32,
    since: u32,
    current: Option<(u32, usize)>,
    retunes: u64,
}

/// Builder of a [`FetchTuner`] ([`FetchTuner::builder`]).
#[derive(Debug, Clone)]
pub struct FetchTunerBuilder {
    table: RateTable,
    every: u32,
    window: usize,
}

impl FetchTunerBuilder {
    /// Re-run every `every` results (at least 1; default 1024) over the
    /// last `window` sizes (at least [`FetchTuner::MIN_SAMPLES`]; default 256).
    pub fn period(mut self, every: u32, window: usize) -> Self {
        self.every = every;
        self.window = window;
        self
    }

    /// Validates and returns the tuner.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty table, a zero `every` or a
    /// window below [`FetchTuner::MIN_SAMPLES`].
    pub fn build(self) -> Result<FetchTuner> {
        let (every, window) = (self.every, self.window);
        if every == 0 || window < FetchTuner::MIN_SAMPLES {
            return Err(Error::InvalidConfig(format!(
                "fetch tuner period {every} / window {window}: every must be at least 1, window at least {}",
                FetchTuner::MIN_SAMPLES
            )));
        }
        let mut t = FetchTuner::new(self.table)?;
        t.every = every;
        t.window = window;
        Ok(t)
    }
}

impl FetchTuner {
    /// Results sampled before the first choice.
    pub const MIN_SAMPLES: usize = 16;

    /// A builder of a tuner over `table` (its period settable), built like
    /// every rrpc config (docs/architecture.md, "Configuration convention").
    pub fn builder(table: RateTable) -> FetchTunerBuilder {
        FetchTunerBuilder {
            table,
            every: 1024,
            window: 256,
        }
    }

    /// A tuner over `table`, re-running Eq. 2 every 1024 results over the
    /// last 256 sizes.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty table.
    pub fn new(table: RateTable) -> Result<Self> {
        if table.is_empty() {
            return Err(Error::InvalidConfig("an empty rate table".into()));
        }
        Ok(FetchTuner {
            table,
            samples: Vec::new(),
            next: 0,
            window: 256,
            every: 1024,
            since: 0,
            current: None,
            retunes: 0,
        })
    }

    /// A result of `frame_len` bytes (response frame, header included) came
    /// back; returns a new (R, F) choice when one is due and differs from
    /// the current one.
    pub fn handle_result(&mut self, frame_len: usize) -> Option<FetchChoice> {
        if self.samples.len() < self.window {
            self.samples.push(frame_len);
        } else {
            self.samples[self.next] = frame_len;
        }
        self.next = (self.next + 1) % self.window;
        self.since = self.since.saturating_add(1);
        let first = self.current.is_none() && self.samples.len() >= Self::MIN_SAMPLES;
        if !first && self.since < self.every {
            return None;
        }
        self.since = 0;
        let c = choose_fetch_and_retry(&self.table, &self.samples).ok()?;
        if self.current == Some((c.retry_limit, c.fetch_size)) {
            return None;
        }
        self.current = Some((c.retry_limit, c.fetch_size));
        self.retunes += 1;
        Some(c)
    }

    /// Choices made so far.
    pub fn retunes(&self) -> u64 {
        self.retunes
    }

    /// The current (R, F), once chosen.
    pub fn current(&self) -> Option<(u32, usize)> {
        self.current
    }
}

/// The batch-size tuner of §4.2 (Eq. 3). The client records each request's
/// latency; at the end of every window of `window` latencies, k = the share
/// above `l_limit`, and
///
/// ```text
/// s_next = s_now − 1   if k > α
///          s_now + 1   if k < 0.1·α
///          s_now       otherwise
/// ```
///
/// clamped to `min..=max` (paper: the best size lies in 1..128). The new
/// size travels to the server in the request batch's auxiliary field.
#[derive(Debug, Clone)]
pub struct BatchSizeTuner {
    l_limit: Duration,
    alpha: f64,
    size: u16,
    min: u16,
    max: u16,
    window: u32,
    seen: u32,
    over: u32,
}

/// Builder of a [`BatchSizeTuner`] ([`BatchSizeTuner::builder`]).
#[derive(Debug, Clone)]
pub struct BatchSizeTunerBuilder {
    l_limit: Duration,
    alpha: f64,
    size: u16,
    min: u16,
    max: u16,
    window: u32,
}

impl BatchSizeTunerBuilder {
    /// The bounds of the batch size, `1 <= min <= max` (default 1..=128).
    pub fn bounds(mut self, min: u16, max: u16) -> Self {
        self.min = min;
        self.max = max;
        self
    }

    /// The window (latencies per decision), at least 1 (default 1000).
    pub fn window(mut self, window: u32) -> Self {
        self.window = window;
        self
    }

    /// The starting size (default 1), clamped to the bounds.
    pub fn size(mut self, size: u16) -> Self {
        self.size = size;
        self
    }

    /// Validates and returns the tuner.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: unless
    /// `0 < alpha < 1`, `l_limit > 0`, `1 <= min <= max` and `window >= 1`.
    pub fn build(self) -> Result<BatchSizeTuner> {
        let (min, max) = (self.min, self.max);
        if min == 0 || min > max {
            return Err(Error::InvalidConfig(format!(
                "batch size bounds {min}..={max}: need 1 <= min <= max"
            )));
        }
        if self.window == 0 {
            return Err(Error::InvalidConfig(
                "batch tuner window 0: must be at least 1".into(),
            ));
        }
        let mut t = BatchSizeTuner::new(self.l_limit, self.alpha)?;
        t.min = min;
        t.max = max;
        t.window = self.window;
        t.size = self.size.clamp(min, max);
        Ok(t)
    }
}

impl BatchSizeTuner {
    /// A builder of a tuner for the latency bound `l_limit` and tolerance
    /// `alpha` (bounds, window and starting size settable), built like every
    /// rrpc config (docs/architecture.md, "Configuration convention").
    pub fn builder(l_limit: Duration, alpha: f64) -> BatchSizeTunerBuilder {
        BatchSizeTunerBuilder {
            l_limit,
            alpha,
            size: 1,
            min: 1,
            max: 128,
            window: 1000,
        }
    }

    /// A tuner for the latency bound `l_limit` and tolerance `alpha` (a
    /// fraction: the paper's evaluation uses 5 %, i.e. 0.05), starting at
    /// size 1, bounds 1..=128, windows of 1000 latencies.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless `0 < alpha < 1` and `l_limit > 0`.
    pub fn new(l_limit: Duration, alpha: f64) -> Result<Self> {
        if !(alpha > 0.0 && alpha < 1.0) || l_limit.is_zero() {
            return Err(Error::InvalidConfig(format!(
                "batch tuner bound {l_limit:?}, tolerance {alpha}"
            )));
        }
        Ok(BatchSizeTuner {
            l_limit,
            alpha,
            size: 1,
            min: 1,
            max: 128,
            window: 1000,
            seen: 0,
            over: 0,
        })
    }

    /// The latency bound.
    #[must_use]
    pub fn l_limit(&self) -> Duration {
        self.l_limit
    }

    /// The current batch size s_now.
    #[must_use]
    pub fn size(&self) -> u16 {
        self.size
    }

    /// One request completed with `latency`; returns the size to use next
    /// (changed only at the end of a window).
    pub fn handle_latency(&mut self, latency: Duration) -> u16 {
        self.seen += 1;
        if latency > self.l_limit {
            self.over += 1;
        }
        if self.seen >= self.window {
            let k = self.over as f64 / self.seen as f64;
            if k > self.alpha {
                self.size = self.size.saturating_sub(1).max(self.min);
            } else if k < 0.1 * self.alpha {
                self.size = self.size.saturating_add(1).min(self.max);
            }
            self.seen = 0;
            self.over = 0;
        }
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq2_picks_the_fetch_size_covering_most_results() {
        // IOPS falls with F above 256 B and with R (a synthetic RNIC).
        let t = RateTable::from_fn(5, 256, 1024, 64, |r, f| {
            let base = if f <= 256 {
                10e6
            } else {
                10e6 * 256.0 / f as f64
            };
            base * (1.0 - 0.01 * r as f64)
        });
        assert_eq!(t.len(), 5 * 13);
        // All results small: smallest F, R = 1.
        let c = choose_fetch_and_retry(&t, &[40; 100]).unwrap();
        assert_eq!((c.fetch_size, c.retry_limit), (256, 1));
        // Mostly 500-byte results: one READ beats two at 2× IOPS? At F=512
        // the rate is 5e6·0.99 for all; at F=256 it is 10e6/2 for the 500s.
        let mut s = vec![500; 90];
        s.extend([40; 10]);
        let c = choose_fetch_and_retry(&t, &s).unwrap();
        // 256: 90·5e6·.99 + 10·10e6·.99; 512: 100·5e6·.99 -> 256 wins.
        assert_eq!(c.fetch_size, 256);
        // With a flatter curve (IOPS barely drop with size) F covers them.
        let flat = RateTable::from_fn(5, 256, 1024, 64, |r, f| 10e6 - f as f64 * 100.0 - r as f64);
        let c = choose_fetch_and_retry(&flat, &s).unwrap();
        assert_eq!(c.fetch_size, 512);
        assert_eq!(c.retry_limit, 1);
    }

    #[test]
    fn eq2_rejects_empty_inputs() {
        assert!(choose_fetch_and_retry(&RateTable::new(), &[1]).is_err());
        let mut t = RateTable::new();
        t.insert(1, 256, 1.0);
        assert!(choose_fetch_and_retry(&t, &[]).is_err());
    }

    #[test]
    fn fetch_tuner_follows_the_result_sizes() {
        // I_{R,F} falls with F (bigger READs are slower), flat in R.
        let t = RateTable::from_fn(3, 64, 1024, 64, |_, f| 1e6 / (1.0 + f as f64 / 8192.0));
        let mut ft = FetchTuner::builder(t).period(100, 64).build().unwrap();
        // Small results: the first choice comes after MIN_SAMPLES.
        let mut got = None;
        for i in 0..FetchTuner::MIN_SAMPLES {
            got = ft.handle_result(40);
            assert_eq!(got.is_some(), i + 1 == FetchTuner::MIN_SAMPLES);
        }
        let c = got.unwrap();
        assert_eq!((c.fetch_size, c.retry_limit), (64, 1));
        // Unchanged sizes: no new choice.
        for _ in 0..300 {
            assert!(ft.handle_result(40).is_none());
        }
        // Results of 900 bytes: once they fill the window, F moves to 960
        // (one READ each beats two small ones).
        let mut changed = None;
        for _ in 0..200 {
            if let Some(c) = ft.handle_result(900) {
                changed = Some(c);
            }
        }
        assert_eq!(changed.map(|c| c.fetch_size), Some(960));
        assert_eq!(ft.retunes(), 2);
        assert!(FetchTuner::new(RateTable::new()).is_err());
        assert!(
            FetchTuner::builder(RateTable::from_fn(1, 64, 64, 1, |_, _| 1.0))
                .period(0, 64)
                .build()
                .is_err()
        );
    }

    /// A synthetic system: latency grows linearly with the batch size (§5.6
    /// Fig. 14); 10 % of requests take 1.5× the mean and 1 % take 4.5×. The
    /// tuner must climb from 1 and settle where Eq. 3 predicts.
    #[test]
    fn eq3_converges_to_the_bound() {
        let l_limit = Duration::from_micros(20);
        let mut t = BatchSizeTuner::builder(l_limit, 0.05)
            .window(200)
            .build()
            .unwrap();
        let lat = |s: u16, i: u32| {
            let mean = 2.0 + 0.5 * s as f64; // µs
            let m = if i.is_multiple_of(100) { 3.0 } else { 1.0 }
                * if i.is_multiple_of(10) { 1.5 } else { 1.0 };
            Duration::from_nanos((mean * m * 1000.0) as u64)
        };
        let mut i = 0u32;
        let mut sizes = Vec::new();
        for _ in 0..400 {
            for _ in 0..200 {
                t.handle_latency(lat(t.size(), i));
                i += 1;
            }
            sizes.push(t.size());
        }
        // Growth needs k < 0.1·α = 0.5 %, so it stops at the first size
        // where the 1 % at 4.5× the mean exceed 20 µs: 4.5·(2 + 0.5 s) > 20
        // gives s = 5. Shrinking needs k > 5 %, i.e. the 10 % at 1.5× the
        // mean over the bound: s > 22. So the tuner settles at 5, and stays.
        let last = &sizes[sizes.len() - 50..];
        assert!(last.iter().all(|&s| s == 5), "{last:?}");
        assert!(
            sizes[..3].iter().all(|&s| s < 5),
            "it starts small: {:?}",
            &sizes[..3]
        );
    }

    #[test]
    fn eq3_shrinks_when_over_and_respects_bounds() {
        let mut t = BatchSizeTuner::builder(Duration::from_micros(1), 0.05)
            .bounds(2, 10)
            .window(10)
            .size(10)
            .build()
            .unwrap();
        for _ in 0..1000 {
            t.handle_latency(Duration::from_micros(5));
        }
        assert_eq!(t.size(), 2);
        for _ in 0..1000 {
            t.handle_latency(Duration::ZERO);
        }
        assert_eq!(t.size(), 10);
        assert!(BatchSizeTuner::new(Duration::ZERO, 0.05).is_err());
        assert!(BatchSizeTuner::new(Duration::from_micros(1), 1.5).is_err());
    }

    #[test]
    fn builders_check_their_settings() {
        let table = || RateTable::from_fn(1, 64, 64, 1, |_, _| 1.0);
        let e = FetchTuner::builder(table())
            .period(0, 64)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("period 0"), "{e}");
        let e = FetchTuner::builder(table())
            .period(1, FetchTuner::MIN_SAMPLES - 1)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("window"), "{e}");
        assert!(FetchTuner::builder(RateTable::new()).build().is_err());
        assert!(
            FetchTuner::builder(table())
                .period(1, FetchTuner::MIN_SAMPLES)
                .build()
                .is_ok()
        );
        let b = || BatchSizeTuner::builder(Duration::from_micros(5), 0.05);
        assert!(
            b().bounds(0, 4)
                .build()
                .unwrap_err()
                .to_string()
                .contains("bounds 0..=4")
        );
        assert!(
            b().bounds(5, 4)
                .build()
                .unwrap_err()
                .to_string()
                .contains("bounds 5..=4")
        );
        assert!(
            b().window(0)
                .build()
                .unwrap_err()
                .to_string()
                .contains("window 0")
        );
        assert!(
            BatchSizeTuner::builder(Duration::ZERO, 0.05)
                .build()
                .is_err()
        );
        // The start size is clamped to the bounds, whichever is set first.
        assert_eq!(b().size(50).bounds(2, 10).build().unwrap().size(), 10);
        assert_eq!(b().bounds(5, 10).build().unwrap().size(), 5);
    }
}
