//! The [`Poller`]: polling threads, registrations and the arm-then-recheck protocol.
//!
//! # The protocol (no lost wake-up)
//!
//! Every registration has an `armed` flag. A task that found nothing sets `armed` (SeqCst),
//! issues a SeqCst fence, and checks the source once more before it sleeps. Whoever wakes it
//! (a polling thread, a spinning task helping its shard, or a writer's [`Doorbell`]) first
//! observes data, then clears `armed` with a `swap`, and only the one that changed it from
//! `true` to `false` writes the eventfd or calls the waker. So: a task never sleeps with data
//! it has not seen unless `armed` is visible to the waker side (Dekker's pattern, both sides
//! fenced), and no eventfd is written (no waker called) for a task that is not armed. Polling
//! threads only look at armed registrations.
//!
//! Parking uses the same pattern: a polling thread announces `parked`, fences, and rechecks
//! the armed flags and the entry list before it sleeps; an arming task fences and kicks a
//! thread it sees parked.
//!
//! # The doorbell fallback
//! A polling thread about to doze (BPEV, [`PollerConfig::doorbell_park_after`]) announces the
//! sleep of each armed entry whose source has a doorbell ([`Readiness::doorbell`]): it arms
//! the doorbell's notifier, announces (the writer can see it when this returns, or after a
//! bounded wait on verbs, past which the rescans cover the gap), then checks
//! the source once more, and wakes the task if data came. The writer rings after every tail it
//! publishes while an announced sleep is not rung yet. The task watches the notifier's fd
//! beside its waker, so the ring wakes it through the reactor while the thread dozes.
//!
//! # The modules
//! From the bottom up, each importing only those before it (`cargo xtask layers` checks it):
//! `shard` (the entries, their wake-up, the shards), `thread` (the polling threads' loop and
//! scan), `placement` (NUMA), `inner` (the shared state that owns shards and threads),
//! `registration` (a task's side: [`Registration`], [`Doorbell`]), and this module, the
//! [`Poller`] facade.

mod inner;
mod placement;
mod registration;
mod shard;
#[cfg(test)]
mod tests;
mod thread;

pub(crate) use registration::yield_now;
pub use registration::{Doorbell, Registration, SendLog};

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{Handoff, Mode, PollerConfig};
use crate::error::Result;
use crate::source::Readiness;
use crate::stats::{Counters, Stats};

use inner::Inner;
use placement::Placement;
use shard::{Shard, lock};
use thread::{IdleWatch, NO_HOLDER};

/// Connection manager: owns the polling threads and hands out [`Registration`]s.
///
/// Cheap to clone (an `Arc`). The threads stop when [`Poller::shutdown`] is called or when the
/// last `Poller` clone and the last [`Registration`] are dropped; either way they are joined.
#[derive(Clone)]
pub struct Poller {
    inner: Arc<Inner>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller")
            .field("config", &self.inner.cfg)
            .field("threads", &self.threads())
            .finish()
    }
}

impl Poller {
    /// A poller with the default configuration ([`Mode::Bpev`], two polling threads).
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when a thread cannot be spawned.
    pub fn new() -> Result<Self> {
        Poller::start(PollerConfig::default())
    }

    /// Whether `self` and `other` are handles of one poller (the same threads).
    pub fn ptr_eq(&self, other: &Poller) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Starts a poller with `cfg`: its polling threads (none in
    /// [`Mode::Bp`] and [`Mode::Event`], whose threads start per
    /// registration). A [`PollerConfig`] is plain settings; only this
    /// starts anything.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when a thread cannot be spawned.
    pub fn start(cfg: PollerConfig) -> Result<Self> {
        let n = match cfg.mode() {
            Mode::Bpts | Mode::Bpev => cfg.polling_threads(),
            Mode::Bp | Mode::Event => 0,
        };
        let shared: Vec<Arc<Shard>> = (0..n).map(Shard::new).collect();
        // Always: nothing spins (config docs). Auto decides per connection
        // (`rings::AsyncConn`), Never never hands off.
        let able = cfg.doorbell_fallback() || cfg.mode() == Mode::Event;
        let always_handoff = able && cfg.handoff() == Handoff::Always;
        for s in &shared {
            s.alone.store(always_handoff, Ordering::Relaxed);
        }
        if always_handoff {
            tracing::info!(
                handoff = ?cfg.handoff(),
                "rrpc-poller: waits are handed to the writers' doorbells, nothing spins"
            );
        }
        let placement = Arc::new(Placement::new(cfg.numa_node()));
        let inner = Arc::new(Inner {
            placement,
            watch: Arc::new(IdleWatch {
                holder: AtomicUsize::new(NO_HOLDER),
                shards: shared.clone(),
            }),
            shared,
            cfg,
            counters: Arc::new(Counters::default()),
            shared_threads: Mutex::new(Vec::new()),
            event_shard: Shard::new(usize::MAX),
            bp: Mutex::new(Vec::new()),
            bp_next_id: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            threads_alive: Arc::new(AtomicUsize::new(0)),
            always_handoff,
        });
        for s in &inner.shared {
            let h = inner.spawn(s, true)?;
            lock(&inner.shared_threads).push(h);
        }
        Ok(Self { inner })
    }

    /// The configuration in force.
    pub fn config(&self) -> &PollerConfig {
        &self.inner.cfg
    }

    /// Whether [`Handoff::Always`] is in force: no task spins and every wait is handed to the
    /// writer's doorbell. (With [`Handoff::Auto`] each connection decides:
    /// [`Registration::hands_off`].)
    pub fn hands_off(&self) -> bool {
        self.inner.always_handoff
    }

    /// Places the polling threads on the NUMA node of the device the
    /// connections use (RB² §IV-C), when the poller's
    /// [`numa_node`](PollerConfig::numa_node) is
    /// [`NumaPlacement::Device`](rrpc_core::numa::NumaPlacement::Device) (the
    /// default) and no device placed them yet: every polling thread, running
    /// or started later, is pinned to the node's CPUs (those the process may
    /// run on). `device_node` is `rrpc_core::Fabric::numa_node` of the
    /// connection's fabric; `None` (shm, a device without a node) does
    /// nothing. The first device's node stays. Returns the node in force.
    ///
    /// A pinning that fails is logged and counted
    /// ([`rrpc_core::numa::PLACEMENT_FAILURES`]), not returned.
    pub fn place_for_device(&self, device_node: Option<u32>) -> Option<u32> {
        self.inner.placement.for_device(device_node)
    }

    /// The NUMA node the polling threads are placed on (`None`: none).
    pub fn numa_node(&self) -> Option<u32> {
        self.inner.placement.node()
    }

    /// Polling threads currently running (shared ones plus BP's per-connection ones).
    pub fn threads(&self) -> usize {
        self.inner.threads_alive.load(Ordering::SeqCst)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot(self.threads())
    }

    /// Every polling thread's time alive and parked, cumulative (diff two
    /// reads with [`ThreadLoad::busy_since`](crate::ThreadLoad::busy_since)).
    pub fn thread_loads(&self) -> Vec<crate::ThreadLoad> {
        self.inner
            .threaded_shards()
            .iter()
            .map(|s| s.load())
            .collect()
    }

    /// Records the counters and every polling thread's busy fraction (since
    /// its previous report) in the `metrics` facade; [`crate::report`] lists
    /// the names. Polling threads also report on their own about once a
    /// second while they run; call this before a scrape for exact figures.
    pub fn report_metrics(&self) {
        let mode = self.inner.cfg.mode();
        crate::report::counters(&self.stats(), mode);
        for s in self.inner.threaded_shards() {
            crate::report::busy(s.id, s.busy_fraction(), mode);
        }
    }

    /// Stops and joins every polling thread and wakes every waiting task, which then gets
    /// [`Error::Shutdown`](crate::Error::Shutdown). Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Registers a connection's readiness source.
    ///
    /// In [`Mode::Event`], and when the source has a liveness fd, this
    /// creates an eventfd / registers fds with the tokio reactor, so it must run inside a
    /// tokio runtime with IO enabled. In [`Mode::Bp`] it spawns the connection's polling
    /// thread.
    ///
    /// # Errors
    /// [`Error::Shutdown`](crate::Error::Shutdown) after [`shutdown`](Self::shutdown);
    /// [`Error::NoRuntime`](crate::Error::NoRuntime) outside a runtime when one is needed;
    /// [`Error::Io`](crate::Error::Io) when an eventfd, a reactor registration or a thread
    /// cannot be created.
    pub fn register(&self, source: Arc<dyn Readiness>) -> Result<Registration> {
        Registration::new(&self.inner, source, None)
    }
}
