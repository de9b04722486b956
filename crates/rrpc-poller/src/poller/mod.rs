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

mod placement;
mod registration;
mod shard;
#[cfg(test)]
mod tests;
mod thread;

pub use registration::{Doorbell, Registration, SendLog};

use std::fmt;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use futures_util::task::AtomicWaker;

use crate::config::{Handoff, Mode, PollerConfig};
use crate::error::{Error, Result};
use crate::source::Readiness;
use crate::stats::{Counters, Stats};
use crate::sys::{DupFd, EventFd, register_readable};
use crate::tune::SpinTuner;

use placement::Placement;
use registration::Sleeper;
use shard::{Entry, Shard};
use thread::{IdleWatch, LoopCfg, NO_HOLDER, polling_loop};

/// Readiness checks (a scan of nothing armed counts as one) between two `sched_yield`s of a
/// polling thread (~5–20 µs), so that a polling thread sharing a core with a tokio worker or
/// with other polling threads (BP with more connections than cores) lets them run. Counted in
/// checks, not scans: a scan of 128 armed connections is 128 times longer than a scan of one.
const YIELD_AFTER_CHECKS: u64 = 1024;
/// How often a spinning task yields to the tokio scheduler (other tasks on the same worker),
/// unless its registration says otherwise ([`Registration::set_spin_yield`]).
const SPIN_YIELD_EVERY: Duration = Duration::from_micros(5);
/// When a spinning task yields (and helps) for the first time.
const SPIN_FIRST_YIELD: Duration = Duration::from_micros(1);

thread_local! {
    /// Completed waits on this (worker) thread. A spinning task that sees it move across a
    /// `yield_now` knows other tasks on its worker have work, and stops spinning.
    static PROGRESS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned list is still a valid list: the panicking thread did not leave it half-updated
    // (every critical section is a single Vec operation).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a task is woken.
enum Wake {
    /// EVENT: the connection's own eventfd, watched by the tokio reactor.
    EventFd(Arc<EventFd>),
    /// BP, BPTS, BPEV: the task's waker, called by a polling thread (or a spinning neighbour).
    Waker(AtomicWaker),
    /// EVENT with a source-supplied notifier: the source's channel fires by itself.
    Notifier,
}

/// Owner of the polling threads and of every registration's shared state.
struct Inner {
    cfg: PollerConfig,
    counters: Arc<Counters>,
    shared: Vec<Arc<Shard>>,
    /// Idle rescans of the shared shards.
    watch: Arc<IdleWatch>,
    shared_threads: Mutex<Vec<JoinHandle<()>>>,
    /// EVENT registrations (never polled; kept for shutdown).
    event_shard: Arc<Shard>,
    /// BP: one shard and thread per registration.
    bp: Mutex<Vec<(Arc<Shard>, JoinHandle<()>)>>,
    bp_next_id: AtomicUsize,
    shutdown: AtomicBool,
    threads_alive: Arc<AtomicUsize>,
    /// [`Handoff::Always`] in force: nothing spins.
    always_handoff: bool,
    /// Where the polling threads run (RB² §IV-C).
    placement: Arc<Placement>,
}

impl Inner {
    fn loop_cfg(&self, shared: bool) -> LoopCfg {
        LoopCfg {
            park_after: self.cfg.idle_park_after(),
            bell_park_after: self
                .cfg
                .doorbell_fallback()
                .then(|| self.cfg.doorbell_park_after())
                .flatten(),
            idle_interval: self.cfg.idle_poll_interval(),
            backoff: self.cfg.doorbell_fallback() && self.cfg.spin_backoff(),
            watch: shared.then(|| self.watch.clone()),
            mode: self.cfg.mode(),
        }
    }

    fn spawn(&self, shard: &Arc<Shard>, shared: bool) -> Result<JoinHandle<()>> {
        let (s, c, cfg, alive, place) = (
            shard.clone(),
            self.counters.clone(),
            self.loop_cfg(shared),
            self.threads_alive.clone(),
            self.placement.clone(),
        );
        alive.fetch_add(1, Ordering::SeqCst);
        let mode = self.cfg.mode();
        crate::report::threads(1.0, mode);
        let h = std::thread::Builder::new()
            .name(format!("{}-{}", self.cfg.thread_name(), shard.id))
            .spawn(move || {
                place.enter();
                polling_loop(s, c, cfg);
                place.leave();
                alive.fetch_sub(1, Ordering::SeqCst);
                crate::report::threads(-1.0, mode);
            })
            .map_err(|e| {
                self.threads_alive.fetch_sub(1, Ordering::SeqCst);
                crate::report::threads(-1.0, mode);
                Error::Io {
                    op: "spawn polling thread",
                    source: e,
                }
            })?;
        let _ = shard.thread.set(h.thread().clone());
        Ok(h)
    }

    /// The shards that have a polling thread: the shared ones and BP's.
    fn threaded_shards(&self) -> Vec<Arc<Shard>> {
        let mut v: Vec<Arc<Shard>> = self.shared.clone();
        v.extend(lock(&self.bp).iter().map(|(s, _)| s.clone()));
        v
    }

    fn all_shards(&self) -> Vec<Arc<Shard>> {
        let mut v = self.threaded_shards();
        v.push(self.event_shard.clone());
        v
    }

    fn shutdown(&self) {
        if self.shutdown.swap(true, Ordering::SeqCst) {
            return;
        }
        let shards = self.all_shards();
        for s in &shards {
            s.stop();
        }
        for h in lock(&self.shared_threads).drain(..) {
            let _ = h.join();
        }
        for (_, h) in lock(&self.bp).drain(..) {
            let _ = h.join();
        }
        // Wake every waiting task; it sees the shutdown flag and returns `Error::Shutdown`.
        for s in &shards {
            for e in lock(&s.entries).iter() {
                e.force_wake();
            }
        }
        tracing::debug!("poller shut down");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

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
    /// [`Error::Io`] when a thread cannot be spawned.
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
    /// [`Error::Io`] when a thread cannot be spawned.
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
    /// [`Error::Shutdown`]. Idempotent.
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
    /// [`Error::Shutdown`] after [`shutdown`](Self::shutdown); [`Error::NoRuntime`] outside a
    /// runtime when one is needed; [`Error::Io`] when an eventfd, a reactor registration or a
    /// thread cannot be created.
    pub fn register(&self, source: Arc<dyn Readiness>) -> Result<Registration> {
        self.register_in(source, None)
    }

    fn register_in(
        &self,
        source: Arc<dyn Readiness>,
        sibling: Option<&Arc<Shard>>,
    ) -> Result<Registration> {
        let inner = &self.inner;
        if inner.shutdown.load(Ordering::SeqCst) {
            return Err(Error::Shutdown);
        }
        let mode = inner.cfg.mode();
        let needs_reactor = mode.uses_eventfd() || source.liveness_fd().is_some();
        if needs_reactor && tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let live = match source.liveness_fd() {
            Some(fd) => {
                let dup = DupFd::new(fd).map_err(Error::io("dup liveness fd"))?;
                Some(register_readable(dup).map_err(Error::io("register liveness fd"))?)
            }
            None => None,
        };
        let mut doorbell_fd = None;
        // Doorbell fallback: the reactor watches the source's doorbell beside the waker.
        let bell_fd = match source.doorbell() {
            Some(n) if inner.cfg.doorbell_fallback() => {
                if tokio::runtime::Handle::try_current().is_err() {
                    return Err(Error::NoRuntime);
                }
                let dup = n
                    .fd()
                    .and_then(DupFd::new)
                    .map_err(Error::io("dup doorbell fd"))?;
                Some(register_readable(dup).map_err(Error::io("register doorbell fd"))?)
            }
            _ => None,
        };
        let (wake, sleeper) = match mode {
            Mode::Bp | Mode::Bpts | Mode::Bpev => (Wake::Waker(AtomicWaker::new()), Sleeper::Waker),
            Mode::Event if source.notifier().is_some() => {
                let n = source.notifier().expect("checked");
                let dup = n
                    .fd()
                    .and_then(DupFd::new)
                    .map_err(Error::io("dup notifier fd"))?;
                let afd = register_readable(dup).map_err(Error::io("register notifier fd"))?;
                (Wake::Notifier, Sleeper::Notifier(afd))
            }
            Mode::Event => {
                let efd = Arc::new(
                    EventFd::new()
                        .map_err(std::io::Error::from)
                        .map_err(Error::io("poller doorbell"))?,
                );
                doorbell_fd = Some(efd.as_raw_fd());
                let afd = register_readable(efd.clone()).map_err(Error::io("register eventfd"))?;
                (Wake::EventFd(efd), Sleeper::EventFd(afd))
            }
        };
        let (shard, bp_thread) = match (mode, sibling) {
            (Mode::Event, _) => (inner.event_shard.clone(), false),
            (_, Some(s)) => (s.clone(), false),
            (Mode::Bpts | Mode::Bpev, None) => {
                let s = inner
                    .shared
                    .iter()
                    .min_by_key(|s| s.len.load(Ordering::Relaxed))
                    .expect("at least one polling thread")
                    .clone();
                (s, false)
            }
            (Mode::Bp, None) => (
                Shard::new(inner.bp_next_id.fetch_add(1, Ordering::Relaxed)),
                true,
            ),
        };
        if mode == Mode::Bp {
            shard.users.fetch_add(1, Ordering::SeqCst);
        }
        let exact_bell =
            bell_fd.is_some() && source.doorbell().is_some_and(|n| n.announce_is_exact());
        let entry = Arc::new(Entry {
            source,
            armed: CachePadded::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            wake,
            shard: (mode != Mode::Event).then(|| shard.clone()),
            counters: inner.counters.clone(),
            bell: bell_fd.is_some(),
            exact_bell,
            announced: AtomicBool::new(false),
            epoch: Instant::now(),
            fired_at: AtomicU64::new(0),
        });
        shard.add(entry.clone());
        if bp_thread {
            let h = inner.spawn(&shard, false)?;
            let mut bp = lock(&inner.bp);
            if inner.shutdown.load(Ordering::SeqCst) {
                // Lost a race with shutdown: do not leave the thread behind.
                drop(bp);
                shard.stop();
                let _ = h.join();
                return Err(Error::Shutdown);
            }
            bp.push((shard.clone(), h));
        }
        Ok(Registration {
            tuner: SpinTuner::new(inner.cfg.bp_timeout(), inner.cfg.auto_tune()),
            wake_latency: crate::report::wake_latency(mode),
            entry,
            shard,
            inner: inner.clone(),
            mode,
            sleeper,
            live,
            bell_fd,
            doorbell_fd,
            event_spin: Duration::ZERO,
            spin_yield: SPIN_YIELD_EVERY,
            handoff: false,
            auto_peer: None,
            sends: None,
            seen_sends: 0,
            last_ready: None,
            sends_at_ready: 0,
            removed: false,
        })
    }
}
