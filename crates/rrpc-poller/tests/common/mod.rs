//! Shared test helpers: a fake connection whose "ring" is a pair of counters.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rrpc_poller::{Mode, Poller, PollerConfig, Readiness};

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
    PollerConfig::new()
        .mode(mode)
        .polling_threads(1)
        .unwrap()
        .bp_timeout(Duration::from_micros(5))
        .idle_park_after(Some(Duration::from_micros(300)))
        .idle_poll_interval(Duration::from_micros(500))
        .unwrap()
}

pub fn poller(mode: Mode) -> Poller {
    test_config(mode).build().unwrap()
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

/// The provider a test runs on: shm always; verbs (module `verbs` of the
/// test files, feature `verbs`) on the device `RRPC_TEST_DEVICE` names.
#[derive(Debug, Clone)]
pub enum Provider {
    Shm,
    Verbs(String),
}

impl Provider {
    /// The verbs provider on `RRPC_TEST_DEVICE`, or `None` (and the test
    /// says it is skipped) when it is not set.
    pub fn verbs_from_env() -> Option<Provider> {
        let dev = std::env::var("RRPC_TEST_DEVICE")
            .ok()
            .filter(|d| !d.is_empty());
        if dev.is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
        }
        dev.map(Provider::Verbs)
    }

    /// The fabric, checked to be the provider asked for (a verbs test that
    /// silently ran on shm would prove nothing).
    pub fn fabric(&self) -> rrpc_core::Fabric {
        match self {
            Provider::Shm => rrpc_core::Fabric::shm(),
            #[cfg(feature = "verbs")]
            Provider::Verbs(dev) => {
                let f = rrpc_core::Fabric::verbs(Some(dev)).expect("open the verbs device");
                assert_eq!(f.kind(), rrpc_core::ProviderKind::Verbs);
                assert_eq!(f.device_name(), Some(dev.as_str()));
                f
            }
            #[cfg(not(feature = "verbs"))]
            Provider::Verbs(_) => unreachable!("verbs tests need feature `verbs`"),
        }
    }

    pub fn kind(&self) -> rrpc_core::ProviderKind {
        match self {
            Provider::Shm => rrpc_core::ProviderKind::Shm,
            Provider::Verbs(_) => rrpc_core::ProviderKind::Verbs,
        }
    }

    /// Scales a message count down for soft-RoCE under an emulated CPU.
    pub fn scaled(&self, n: u32) -> u32 {
        match self {
            Provider::Shm => n,
            Provider::Verbs(_) => (n / 5).max(1),
        }
    }
}

/// Runs each named `fn(&Provider)` on shm (module `shm`) and, with feature
/// `verbs`, on `RRPC_TEST_DEVICE` (module `verbs`).
#[allow(unused_macros)]
macro_rules! on_every_provider {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $( #[test] fn $name() { super::$name(&super::common::Provider::Shm); } )*
        }
        #[cfg(feature = "verbs")]
        mod verbs {
            $( #[test] fn $name() {
                if let Some(p) = super::common::Provider::verbs_from_env() { super::$name(&p); }
            } )*
        }
    };
}
