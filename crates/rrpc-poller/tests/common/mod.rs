//! Shared test helpers: a fake connection whose "ring" is a pair of counters.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rrpc_poller::{Mode, Poller, PollerConfig, Readiness};

/// The provider a test runs on (shared by the crates' tests).
#[allow(unused_imports)] // not every test file runs on both providers
pub use rrpc_core::testing::Provider;

/// A fake receive ring: the writer bumps `written`, the reader sets `read`.
#[derive(Debug, Default)]
pub struct Fake {
    pub written: AtomicU64,
    pub read: AtomicU64,
    pub closed: AtomicBool,
}

impl Readiness for Fake {
    fn ready(&self) -> bool {
        self.written.load(Ordering::Acquire) > self.read.load(Ordering::Relaxed)
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl Fake {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    /// Consumes everything written so far; returns how many.
    pub fn consume(&self) -> u64 {
        let w = self.written.load(Ordering::Acquire);
        let r = self.read.swap(w, Ordering::Relaxed);
        w - r
    }
}

/// A small-footprint config for tests on a 2-core machine: one polling thread, short spin,
/// aggressive idle parking.
pub fn test_config(mode: Mode) -> PollerConfig {
    PollerConfig::builder()
        .mode(mode)
        .polling_threads(1)
        .bp_timeout(Duration::from_micros(5))
        .idle_park_after(Some(Duration::from_micros(300)))
        .idle_poll_interval(Duration::from_micros(500))
        .build()
        .unwrap()
}

pub fn poller(mode: Mode) -> Poller {
    rrpc_poller::Poller::start(test_config(mode)).unwrap()
}

/// A poller in `mode` with one fake connection registered on it.
pub fn registered(mode: Mode) -> (Poller, Arc<Fake>, rrpc_poller::Registration) {
    let p = poller(mode);
    let f = Fake::new();
    let reg = p.register(f.clone()).unwrap();
    (p, f, reg)
}

/// A current-thread runtime.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime of two worker threads.
pub fn rt_mt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Generous bound for "every message is read": a lost wake-up hangs forever.
pub const BOUND: Duration = Duration::from_secs(60);

/// Tiny deterministic PRNG (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
