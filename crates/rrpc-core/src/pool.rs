//! A KRCore-style pool of pre-initialised connection resources (KRCore §3.1, §4.2).
//!
//! Creating a queue pair and registering its rings costs system calls (and,
//! on a NIC, milliseconds of driver work). KRCore keeps such resources ready
//! so that connecting costs one handshake round trip. [`ResourcePool`] keeps
//! up to `capacity` items made by a factory; [`ResourcePool::take`] returns
//! one at once (or builds one inline on a miss: an exhausted pool is slower,
//! never an error) and a background thread refills the pool once it falls
//! below its low-water mark, so connection setup stays off the slow path.
//!
//! Memory is bounded: each item reports its size in bytes, and the items
//! waiting in a pool (or in every pool sharing one [`PoolBudget`], as the
//! size classes of one configuration do) never hold more than the budget.
//!
//! The decisions (refill or not, keep or drop a made item) live in a
//! sans-IO ledger, property-tested without threads; the refill thread only
//! carries them out. Operators see the counters ([`PoolStats`]) and the
//! same numbers through the `metrics` facade, labelled by the pool's class:
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `rrpc_pool_takes_total{class, result="hit"\|"miss"}` | counter | takes served ready / built inline |
//! | `rrpc_pool_refills_total{class}` | counter | items made ahead by the refill thread |
//! | `rrpc_pool_refill_failures_total{class}` | counter | factory errors (retried after `retry_after`) |
//! | `rrpc_pool_over_budget_total{class}` | counter | made items dropped because the memory bound was reached |
//! | `rrpc_pool_ready{class}` | gauge | items ready |
//! | `rrpc_pool_bytes_held{class}` | gauge | bytes the ready items hold |

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Result;

type Factory<T> = dyn Fn() -> Result<T> + Send + Sync;
type Sizer<T> = dyn Fn(&T) -> u64 + Send + Sync;

/// A memory bound shared by several pools (the size classes of one
/// configuration): the bytes their ready items hold together.
#[derive(Debug)]
pub struct PoolBudget {
    max: u64,
    held: AtomicU64,
}

impl PoolBudget {
    /// A budget of `max_bytes`.
    pub fn new(max_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            max: max_bytes,
            held: AtomicU64::new(0),
        })
    }

    /// No bound.
    pub fn unbounded() -> Arc<Self> {
        Self::new(u64::MAX)
    }

    /// The bound, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max
    }

    /// Bytes held now by the ready items of every pool sharing this budget.
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Reserves `n` bytes if they fit under the bound.
    fn try_reserve(&self, n: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok()
    }

    /// Whether `n` more bytes would fit now.
    fn fits(&self, n: u64) -> bool {
        self.held_bytes()
            .checked_add(n)
            .is_some_and(|t| t <= self.max)
    }

    fn release(&self, n: u64) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Pool settings: `PoolConfig::new(capacity)` gives the defaults,
/// [`PoolConfig::builder`]`(capacity)` changes them (docs/architecture.md,
/// "Configuration convention").
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `capacity` | (required) | high-water mark: the refill thread fills up to this many ready items; 0 disables pooling (every take builds) |
/// | `low_water` | `capacity` | the refill thread starts when fewer than this many are ready (KRCore refills its pool in the background once it runs low); the default refills after every take, a lower mark refills in batches |
/// | `budget` | unbounded | the memory bound, shared with other pools given the same [`PoolBudget`] |
/// | `retry_after` | 100 ms | wait after a failed make before trying again |
/// | `class` | `"default"` | the `class` label of the pool's metrics |
#[derive(Debug, Clone)]
pub struct PoolConfig {
    capacity: usize,
    low_water: usize,
    budget: Arc<PoolBudget>,
    retry_after: Duration,
    class: String,
}

impl PoolConfig {
    /// Defaults for a pool of up to `capacity` ready items.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            low_water: capacity,
            budget: PoolBudget::unbounded(),
            retry_after: Duration::from_millis(100),
            class: "default".into(),
        }
    }

    /// A builder starting from [`PoolConfig::new`]'s defaults for
    /// `capacity` (docs/architecture.md, "Configuration convention").
    pub fn builder(capacity: usize) -> PoolConfigBuilder {
        PoolConfigBuilder {
            cfg: Self::new(capacity),
        }
    }

    /// A builder starting from this config.
    pub fn to_builder(&self) -> PoolConfigBuilder {
        PoolConfigBuilder { cfg: self.clone() }
    }

    /// The high-water mark.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The low-water mark ([`PoolConfigBuilder::low_water`]).
    pub fn low_water(&self) -> usize {
        self.low_water
    }

    /// The memory bound ([`PoolConfigBuilder::budget`]).
    pub fn budget(&self) -> &Arc<PoolBudget> {
        &self.budget
    }

    /// The wait after a failed make ([`PoolConfigBuilder::retry_after`]).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// The `class` label ([`PoolConfigBuilder::class`]).
    pub fn class(&self) -> &str {
        &self.class
    }
}

/// Builder for [`PoolConfig`].
#[derive(Debug, Clone)]
pub struct PoolConfigBuilder {
    cfg: PoolConfig,
}

impl PoolConfigBuilder {
    /// Starts refilling when fewer than `n` items are ready (clamped to
    /// `1..=capacity`).
    #[must_use]
    pub fn low_water(mut self, n: usize) -> Self {
        let cap = self.cfg.capacity;
        self.cfg.low_water = n.clamp(1, cap.max(1)).min(cap);
        self
    }

    /// The memory bound of the ready items (shared by every pool given the
    /// same budget).
    #[must_use]
    pub fn budget(mut self, b: Arc<PoolBudget>) -> Self {
        self.cfg.budget = b;
        self
    }

    /// How long the refill thread waits after a failed make.
    #[must_use]
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.cfg.retry_after = d;
        self
    }

    /// The `class` label of the pool's metrics (a size class: `"shm/4194304"`).
    #[must_use]
    pub fn class(mut self, c: impl Into<String>) -> Self {
        self.cfg.class = c.into();
        self
    }

    /// The config (every setting is clamped to its range).
    ///
    /// # Errors
    /// None today; a `Result` like every config's `build`, so that a check
    /// added later is not a breaking change.
    pub fn build(self) -> crate::Result<PoolConfig> {
        Ok(self.cfg)
    }
}

/// Pool statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Items ready now.
    pub ready: usize,
    /// Bytes the ready items hold now.
    pub bytes_held: u64,
    /// `take` calls served from the pool.
    pub hits: u64,
    /// `take` calls that had to build inline (the pool was empty: the
    /// fallback, never an error).
    pub misses: u64,
    /// Items made ahead by the refill thread.
    pub refills: u64,
    /// Factory errors of the refill thread.
    pub refill_failures: u64,
    /// Made items dropped because the memory bound was reached.
    pub over_budget: u64,
}

/// The pool's decisions, without threads: what is ready, whether to make
/// more, and whether a made item may be kept under the memory bound.
struct Ledger<T> {
    items: VecDeque<(T, u64)>,
    capacity: usize,
    low_water: usize,
    /// Between falling below the low-water mark and reaching capacity.
    refilling: bool,
    /// The size of the last item made (the estimate for the next one).
    last_bytes: u64,
    stats: PoolStats,
}

impl<T> Ledger<T> {
    fn new(capacity: usize, low_water: usize) -> Self {
        Self {
            items: VecDeque::with_capacity(capacity),
            capacity,
            low_water,
            refilling: capacity > 0,
            last_bytes: 0,
            stats: PoolStats::default(),
        }
    }

    /// A ready item, or `None` (a miss: the caller builds inline).
    fn take(&mut self, budget: &PoolBudget) -> Option<T> {
        match self.items.pop_front() {
            Some((x, bytes)) => {
                budget.release(bytes);
                self.stats.hits += 1;
                self.stats.ready = self.items.len();
                self.stats.bytes_held -= bytes;
                Some(x)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Whether the refill thread should make one more item now.
    fn should_make(&mut self, budget: &PoolBudget) -> bool {
        let ready = self.items.len();
        if ready >= self.capacity {
            self.refilling = false;
        } else if ready < self.low_water {
            self.refilling = true;
        }
        self.refilling && budget.fits(self.last_bytes)
    }

    /// Whether the refill thread will make more without another take: below
    /// capacity, refilling (or below the low-water mark), and the next item
    /// fits the budget.
    fn will_fill(&self, budget: &PoolBudget) -> bool {
        let ready = self.items.len();
        ready < self.capacity
            && (self.refilling || ready < self.low_water)
            && budget.fits(self.last_bytes)
    }

    /// Keeps a made item if the bound allows; otherwise hands it back (to
    /// be dropped) and stops refilling until a take.
    fn put(&mut self, x: T, bytes: u64, budget: &PoolBudget) -> std::result::Result<(), T> {
        self.last_bytes = bytes;
        if self.items.len() >= self.capacity || !budget.try_reserve(bytes) {
            self.stats.over_budget += 1;
            self.refilling = false;
            return Err(x);
        }
        self.items.push_back((x, bytes));
        self.stats.refills += 1;
        self.stats.ready = self.items.len();
        self.stats.bytes_held += bytes;
        Ok(())
    }

    /// Empties the ledger, returning every item's bytes to the budget.
    fn drain(&mut self, budget: &PoolBudget) -> Vec<T> {
        let out: Vec<T> = self
            .items
            .drain(..)
            .map(|(x, b)| {
                budget.release(b);
                x
            })
            .collect();
        self.stats.ready = 0;
        self.stats.bytes_held = 0;
        out
    }
}

struct Metrics {
    hits: metrics::Counter,
    misses: metrics::Counter,
    refills: metrics::Counter,
    refill_failures: metrics::Counter,
    over_budget: metrics::Counter,
    ready: metrics::Gauge,
    bytes_held: metrics::Gauge,
}

impl Metrics {
    fn new(class: &str) -> Self {
        let c = class.to_owned();
        Self {
            hits: metrics::counter!("rrpc_pool_takes_total", "class" => c.clone(), "result" => "hit"),
            misses: metrics::counter!("rrpc_pool_takes_total", "class" => c.clone(), "result" => "miss"),
            refills: metrics::counter!("rrpc_pool_refills_total", "class" => c.clone()),
            refill_failures: metrics::counter!("rrpc_pool_refill_failures_total", "class" => c.clone()),
            over_budget: metrics::counter!("rrpc_pool_over_budget_total", "class" => c.clone()),
            ready: metrics::gauge!("rrpc_pool_ready", "class" => c.clone()),
            bytes_held: metrics::gauge!("rrpc_pool_bytes_held", "class" => c),
        }
    }

    fn levels(&self, s: &PoolStats) {
        self.ready.set(s.ready as f64);
        self.bytes_held.set(s.bytes_held as f64);
    }
}

struct State<T> {
    ledger: Ledger<T>,
    shutdown: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    wake: Condvar,
    factory: Box<Factory<T>>,
    sizer: Box<Sizer<T>>,
    budget: Arc<PoolBudget>,
    retry_after: Duration,
    metrics: Metrics,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Pre-made resources (a queue pair and its regions, typically).
pub struct ResourcePool<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    capacity: usize,
    refill: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> std::fmt::Debug for ResourcePool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourcePool")
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<T: Send + 'static> ResourcePool<T> {
    /// Creates a pool of up to `capacity` items made by `factory`, filled by a
    /// background thread, with the other settings at their defaults and no
    /// memory bound (items count as 0 bytes). `capacity == 0` disables
    /// pooling (every take builds).
    pub fn new<F>(capacity: usize, factory: F) -> Self
    where
        F: Fn() -> Result<T> + Send + Sync + 'static,
    {
        Self::with_config(PoolConfig::new(capacity), factory, |_| 0)
    }

    /// Creates a pool with `cfg`; `bytes` says how much memory an item
    /// holds (counted against the budget while it waits in the pool).
    pub fn with_config<F, S>(cfg: PoolConfig, factory: F, bytes: S) -> Self
    where
        F: Fn() -> Result<T> + Send + Sync + 'static,
        S: Fn(&T) -> u64 + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ledger: Ledger::new(cfg.capacity, cfg.low_water),
                shutdown: false,
            }),
            wake: Condvar::new(),
            factory: Box::new(factory),
            sizer: Box::new(bytes),
            budget: cfg.budget.clone(),
            retry_after: cfg.retry_after,
            metrics: Metrics::new(&cfg.class),
        });
        let refill = (cfg.capacity > 0).then(|| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("rrpc-pool".into())
                .spawn(move || refill_loop(&s))
                .expect("spawn pool thread")
        });
        tracing::debug!(
            class = %cfg.class,
            capacity = cfg.capacity,
            low_water = cfg.low_water,
            max_bytes = cfg.budget.max_bytes(),
            "connection resource pool started"
        );
        ResourcePool {
            shared,
            capacity: cfg.capacity,
            refill,
        }
    }

    /// Takes a ready item, or builds one now if the pool is empty (counted
    /// as a miss).
    ///
    /// # Errors
    /// The factory's error on a miss.
    pub fn take(&self) -> Result<T> {
        let s = &self.shared;
        {
            let mut st = s.lock();
            let got = st.ledger.take(&s.budget);
            s.metrics.levels(&st.ledger.stats);
            s.wake.notify_all();
            drop(st);
            match got {
                Some(x) => {
                    s.metrics.hits.increment(1);
                    return Ok(x);
                }
                None => s.metrics.misses.increment(1),
            }
        }
        (s.factory)()
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        self.shared.lock().ledger.stats
    }

    /// Blocks until the pool holds `capacity` items, or the memory bound
    /// stops it, or `timeout` passes (tests and warm-up). Returns whether
    /// it is full.
    pub fn wait_full(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            let full = st.ledger.items.len() >= self.capacity;
            let now = std::time::Instant::now();
            if full || st.shutdown || !st.ledger.will_fill(&self.shared.budget) || now >= deadline {
                return full;
            }
            st = self
                .shared
                .wake
                .wait_timeout(st, (deadline - now).min(Duration::from_millis(10)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn refill_loop<T>(s: &Shared<T>) {
    loop {
        {
            let mut st = s.lock();
            while !st.shutdown && !st.ledger.should_make(&s.budget) {
                st = s.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.shutdown {
                return;
            }
        }
        match (s.factory)() {
            Ok(x) => {
                let bytes = (s.sizer)(&x);
                let mut st = s.lock();
                let dropped = match st.ledger.put(x, bytes, &s.budget) {
                    Ok(()) => {
                        s.metrics.refills.increment(1);
                        None
                    }
                    Err(x) => {
                        s.metrics.over_budget.increment(1);
                        Some(x)
                    }
                };
                s.metrics.levels(&st.ledger.stats);
                s.wake.notify_all();
                drop(st);
                drop(dropped);
            }
            Err(e) => {
                s.lock().ledger.stats.refill_failures += 1;
                s.metrics.refill_failures.increment(1);
                tracing::warn!(
                    error = %e,
                    retry_in = ?s.retry_after,
                    "connection pool refill failed"
                );
                let st = s.lock();
                if !st.shutdown {
                    let _ = s.wake.wait_timeout(st, s.retry_after);
                }
            }
        }
    }
}

impl<T: Send + 'static> Drop for ResourcePool<T> {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.refill.take() {
            let _ = h.join();
        }
        let items = {
            let mut st = self.shared.lock();
            let items = st.ledger.drain(&self.shared.budget);
            self.shared.metrics.levels(&st.ledger.stats);
            items
        };
        drop(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn serves_prebuilt_items_then_refills() {
        let made = Arc::new(AtomicU32::new(0));
        let m = made.clone();
        let pool = ResourcePool::new(3, move || Ok(m.fetch_add(1, Ordering::SeqCst)));
        assert!(pool.wait_full(Duration::from_secs(10)));
        assert_eq!(pool.stats().ready, 3);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pool.stats().hits, 2);
        assert!(pool.wait_full(Duration::from_secs(10)));
        assert!(made.load(Ordering::SeqCst) >= 5);
        assert_eq!(pool.stats().refills, 5);
    }

    #[test]
    fn zero_capacity_builds_inline() {
        let pool = ResourcePool::new(0, || Ok(7u8));
        assert_eq!(pool.take().unwrap(), 7);
        assert_eq!(pool.stats().misses, 1);
        assert_eq!(pool.stats().refills, 0);
    }

    /// Exhaustion falls back to building inline (a counted miss, never an
    /// error), and the pool refills afterwards.
    #[test]
    fn an_exhausted_pool_builds_inline_then_refills() {
        let gate = Arc::new(std::sync::Mutex::new(()));
        let g = gate.clone();
        let made = Arc::new(AtomicU32::new(0));
        let m = made.clone();
        let pool = ResourcePool::new(2, move || {
            let _held = g.lock().unwrap();
            Ok(m.fetch_add(1, Ordering::SeqCst))
        });
        assert!(pool.wait_full(Duration::from_secs(10)));
        // Hold the factory's gate: the refill thread cannot make more.
        let closed = gate.lock().unwrap();
        pool.take().unwrap();
        pool.take().unwrap();
        let s = pool.stats();
        assert_eq!((s.ready, s.hits, s.misses), (0, 2, 0));
        drop(closed);
        // Empty now (or refilling): a take still succeeds.
        pool.take().unwrap();
        assert!(pool.wait_full(Duration::from_secs(10)));
        let s = pool.stats();
        assert_eq!(s.hits + s.misses, 3);
        assert_eq!(s.ready, 2);
    }

    #[test]
    fn a_failing_factory_is_counted_and_retried() {
        let n = Arc::new(AtomicU32::new(0));
        let m = n.clone();
        let pool = ResourcePool::with_config(
            PoolConfig::builder(1)
                .retry_after(Duration::from_millis(1))
                .build()
                .unwrap(),
            move || {
                if m.fetch_add(1, Ordering::SeqCst) < 3 {
                    Err(crate::Error::InvalidConfig("not yet".into()))
                } else {
                    Ok(())
                }
            },
            |_| 0,
        );
        assert!(pool.wait_full(Duration::from_secs(10)));
        let s = pool.stats();
        assert_eq!((s.refill_failures, s.refills), (3, 1));
    }

    /// Two pools (size classes) sharing one budget never hold more than it,
    /// and a dropped pool returns its bytes.
    #[test]
    fn size_classes_share_one_memory_bound() {
        let budget = PoolBudget::new(10 * 1024);
        let small = ResourcePool::with_config(
            PoolConfig::builder(8)
                .budget(budget.clone())
                .class("small")
                .build()
                .unwrap(),
            || Ok(1024u64),
            |b| *b,
        );
        small.wait_full(Duration::from_secs(10));
        let big = ResourcePool::with_config(
            PoolConfig::builder(8)
                .budget(budget.clone())
                .class("big")
                .build()
                .unwrap(),
            || Ok(4096u64),
            |b| *b,
        );
        big.wait_full(Duration::from_secs(10));
        let (s, b) = (small.stats(), big.stats());
        assert_eq!(s.ready, 8, "{s:?}");
        assert_eq!(b.ready, 0, "only 2 KiB were left: {b:?}");
        assert!(b.over_budget >= 1, "{b:?}");
        assert!(budget.held_bytes() <= budget.max_bytes());
        assert_eq!(budget.held_bytes(), s.bytes_held + b.bytes_held);
        // Takes from the small class make room; the big class may then fill it.
        for _ in 0..8 {
            small.take().unwrap();
        }
        assert!(budget.held_bytes() <= budget.max_bytes());
        drop(small);
        drop(big);
        assert_eq!(budget.held_bytes(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Take,
        Make(u64),
    }

    proptest! {
        /// The ledger under any sequence of takes and makes: the budget is
        /// never exceeded, ready stays within capacity, the counters add up,
        /// and refilling starts below the low-water mark.
        #[test]
        fn the_ledger_keeps_its_bounds(
            capacity in 1usize..8,
            low in 1usize..8,
            max in 0u64..64,
            ops in proptest::collection::vec(
                prop_oneof![Just(Op::Take), (0u64..16).prop_map(Op::Make)], 0..200),
        ) {
            let low = low.min(capacity);
            let budget = PoolBudget::new(max);
            let mut l: Ledger<u64> = Ledger::new(capacity, low);
            let (mut takes, mut kept, mut dropped) = (0u64, 0u64, 0u64);
            for op in ops {
                match op {
                    Op::Take => {
                        takes += 1;
                        let _ = l.take(&budget);
                    }
                    Op::Make(b) => {
                        if l.should_make(&budget) {
                            match l.put(b, b, &budget) {
                                Ok(()) => kept += 1,
                                Err(_) => dropped += 1,
                            }
                        }
                    }
                }
                let s = l.stats;
                prop_assert!(budget.held_bytes() <= max);
                prop_assert_eq!(budget.held_bytes(), s.bytes_held);
                prop_assert!(s.ready <= capacity);
                prop_assert_eq!(s.ready, l.items.len());
                prop_assert_eq!(s.hits + s.misses, takes);
                prop_assert_eq!(s.refills, kept);
                prop_assert_eq!(s.over_budget, dropped);
                prop_assert_eq!(s.hits, kept - s.ready as u64);
                if l.items.len() < low && budget.fits(l.last_bytes) {
                    prop_assert!(l.should_make(&budget));
                }
            }
        }
    }
}
