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

use std::fmt;
use std::future::poll_fn;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::Poll;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use futures_util::task::AtomicWaker;
use tokio::io::unix::AsyncFd;

use crate::config::{ConfigView, Mode, PollerConfig};
use crate::error::{Error, Result};
use crate::source::Readiness;
use crate::stats::{Counters, Stats};
use crate::sys::{DupFd, EventFd, register_readable};
use crate::tune::SpinTuner;

/// Readiness checks (a scan of nothing armed counts as one) between two `sched_yield`s of a
/// polling thread (~5–20 µs), so that a polling thread sharing a core with a tokio worker or
/// with other polling threads (BP with more connections than cores) lets them run. Counted in
/// checks, not scans: a scan of 128 armed connections is 128 times longer than a scan of one.
const YIELD_AFTER_CHECKS: u64 = 1024;
/// How often a spinning task yields to the tokio scheduler (other tasks on the same worker).
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

/// Shared state of one registration, seen by the task, the polling thread and doorbells.
struct Entry {
    source: Arc<dyn Readiness>,
    armed: CachePadded<AtomicBool>,
    /// Set by a polling thread that saw `source.is_closed()`.
    closed: AtomicBool,
    wake: Wake,
    /// The shard polling this entry (None in EVENT mode).
    shard: Option<Arc<Shard>>,
    counters: Arc<Counters>,
    /// The doorbell fallback covers this entry (BPEV, on, and the source has a doorbell).
    bell: bool,
    /// This arm's sleep was announced to the writer (reset by the task when it wakes).
    announced: AtomicBool,
}

impl Entry {
    /// Wakes the task. Call only after winning `armed.swap(false)`.
    fn fire(&self) {
        match &self.wake {
            Wake::EventFd(efd) => {
                efd.signal();
                Counters::add(&self.counters.eventfd_writes, 1);
            }
            Wake::Waker(w) => {
                w.wake();
                Counters::add(&self.counters.waker_wakes, 1);
            }
            Wake::Notifier => {}
        }
    }

    /// Doorbell fallback: announces this armed entry's sleep once per arm (arm the notifier,
    /// announce, then the caller rechecks). Returns whether it announced.
    fn announce(&self) -> bool {
        if !self.bell || self.announced.swap(true, Ordering::SeqCst) {
            return false;
        }
        let Some(n) = self.source.doorbell() else {
            return false;
        };
        match n.arm().and_then(|()| n.announce_sleep()) {
            Ok(()) => {
                Counters::add(&self.counters.announces, 1);
                true
            }
            Err(e) => {
                // The rescans every idle_poll_interval still cover the entry.
                tracing::debug!(error = %e, "doorbell announce failed; rescans cover it");
                false
            }
        }
    }

    /// Wakes the task unconditionally (shutdown).
    fn force_wake(&self) {
        self.armed.store(false, Ordering::SeqCst);
        match &self.wake {
            Wake::EventFd(efd) => efd.signal(),
            Wake::Waker(w) => w.wake(),
            Wake::Notifier => {}
        }
    }
}

/// A set of entries scanned by one polling thread (or, for EVENT, by nobody).
struct Shard {
    id: usize,
    entries: Mutex<Vec<Arc<Entry>>>,
    generation: AtomicU64,
    len: AtomicUsize,
    parked: CachePadded<AtomicBool>,
    stop: AtomicBool,
    thread: OnceLock<Thread>,
    /// BP: registrations sharing this shard's thread (the thread stops when it drops to 0).
    users: AtomicUsize,
    /// The thread dozes: armed connections, idle; its rescans may be done by [`IdleWatch`].
    dozing: AtomicBool,
    /// The busy fraction's clock ([`Shard::busy_fraction`]): nanoseconds since `born`.
    born: Instant,
    /// Nanoseconds spent parked (finished parks).
    parked_ns: AtomicU64,
    /// When the current park began (ns since `born`), `u64::MAX` while running.
    parked_since: AtomicU64,
    /// The load at the previous report.
    last_report: Mutex<crate::stats::ThreadLoad>,
}

impl Shard {
    fn new(id: usize) -> Arc<Self> {
        Arc::new(Self {
            id,
            entries: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            parked: CachePadded::new(AtomicBool::new(false)),
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            users: AtomicUsize::new(0),
            dozing: AtomicBool::new(false),
            born: Instant::now(),
            parked_ns: AtomicU64::new(0),
            parked_since: AtomicU64::new(u64::MAX),
            last_report: Mutex::new(crate::stats::ThreadLoad {
                thread: id,
                alive: Duration::ZERO,
                parked: Duration::ZERO,
            }),
        })
    }

    fn clock(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// (ns alive, ns parked), a park in progress counted up to now.
    fn times(&self) -> (u64, u64) {
        let now = self.clock();
        let mut parked = self.parked_ns.load(Ordering::Relaxed);
        let since = self.parked_since.load(Ordering::Relaxed);
        if since != u64::MAX {
            parked += now.saturating_sub(since);
        }
        (now, parked.min(now))
    }

    fn load(&self) -> crate::stats::ThreadLoad {
        let (alive, parked) = self.times();
        crate::stats::ThreadLoad {
            thread: self.id,
            alive: Duration::from_nanos(alive),
            parked: Duration::from_nanos(parked),
        }
    }

    /// The share of wall time this shard's thread was not parked since the
    /// previous report (spinning and scanning count as busy), 0 to 1.
    fn busy_fraction(&self) -> f64 {
        let now = self.load();
        let earlier = std::mem::replace(&mut *lock(&self.last_report), now);
        now.busy_since(&earlier)
    }

    /// Reports this thread's load, and the poller's counters, at most once
    /// per [`REPORT_EVERY`] (`force`: now).
    fn report(&self, counters: &Counters, mode: crate::Mode, next: &mut Instant, force: bool) {
        let now = Instant::now();
        if !force && now < *next {
            return;
        }
        *next = now + REPORT_EVERY;
        crate::report::counters(&counters.snapshot(0), mode);
        crate::report::busy(self.id, self.busy_fraction(), mode);
    }

    fn add(&self, e: Arc<Entry>) {
        let mut v = lock(&self.entries);
        v.push(e);
        self.len.store(v.len(), Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn remove(&self, e: &Arc<Entry>) {
        {
            let mut v = lock(&self.entries);
            v.retain(|x| !Arc::ptr_eq(x, e));
            self.len.store(v.len(), Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
        }
        // A parked thread still holds the entry in its snapshot of the list,
        // and with it the connection's rings, eventfds and side channel:
        // wake it so that it takes the new list and lets go now, not at its
        // next wake-up (which, idle, may be far away).
        self.kick();
    }

    /// Resumes a parked polling thread (one syscall for the first kicker only).
    fn kick(&self) {
        if self.parked.load(Ordering::SeqCst)
            && self.parked.swap(false, Ordering::SeqCst)
            && let Some(t) = self.thread.get()
        {
            t.unpark();
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.parked.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// Per-thread settings of the polling loop.
#[derive(Clone)]
struct LoopCfg {
    park_after: Option<Duration>,
    /// [`PollerConfig::doorbell_park_after`] (BPEV only).
    bell_park_after: Option<Duration>,
    idle_interval: Duration,
    /// Shared shards (BPTS, BPEV): the idle rescans of all dozing shards are done by one
    /// thread. `None` for BP's per-connection threads.
    watch: Option<Arc<IdleWatch>>,
    mode: crate::Mode,
}

const NO_HOLDER: usize = usize::MAX;

/// How often a running polling thread reports to the `metrics` facade.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Coalesces the idle rescans of the shared polling threads: the first thread that dozes
/// becomes the *holder* and from then on rescans every dozing shard every `idle_interval`
/// (also while it is busy itself); the other dozing threads sleep until a task of theirs arms.
/// With N polling threads an idle poller wakes N times less often.
struct IdleWatch {
    holder: AtomicUsize,
    /// Indexed by shard id.
    shards: Vec<Arc<Shard>>,
}

impl IdleWatch {
    fn shards(&self) -> &[Arc<Shard>] {
        &self.shards
    }

    fn others_dozing(&self, me: usize) -> bool {
        self.shards()
            .iter()
            .any(|s| s.id != me && s.dozing.load(Ordering::SeqCst))
    }

    /// Rescans the armed connections of every other dozing shard.
    fn rescan_others(&self, me: usize, counters: &Counters) {
        for s in self.shards() {
            if s.id == me || !s.dozing.load(Ordering::Acquire) {
                continue;
            }
            let (polls, _fired, waiting) = scan(&lock(&s.entries));
            Counters::add(&counters.polls, polls);
            Counters::add(&counters.empty_polls, waiting as u64);
        }
    }

    /// Tells the holder that one more shard dozes (it may be parked without a timeout).
    fn kick_holder(&self) {
        let h = self.holder.load(Ordering::SeqCst);
        if let Some(s) = self.shards().get(h) {
            s.kick();
        }
    }
}

/// The body of every polling thread (Algorithm 2, procedure RDMApoll; Algorithm 1's scan for
/// BPTS; a per-connection shard for BP), with idle parking.
///
/// Scheduling rules (they matter most when the polling threads share cores with the tokio
/// workers, as on a 2-core machine):
/// - After a scan that woke a task the thread calls `sched_yield` once: the woken worker may
///   be queued on this very core, and it should run now rather than after our time slice.
/// - With idle parking on, a thread with no armed connection parks at once (untimed): there
///   is nothing it could find. The next arm resumes it (`Shard::kick`, one futex wake).
/// - Armed connections with no data for `park_after`: the thread dozes. The rescans every
///   `idle_interval` of all dozing shared shards are done by one thread ([`IdleWatch`]).
fn polling_loop(shard: Arc<Shard>, counters: Arc<Counters>, cfg: LoopCfg) {
    let mut local: Vec<Arc<Entry>> = Vec::new();
    let mut seen_gen = u64::MAX;
    let mut last_activity = Instant::now();
    let mut checks: u64 = 0;
    let mut dozing = false;
    let watch = cfg.watch.as_deref();
    let mut holder = false;
    let mut next_watch = Instant::now();
    let mut check_watch = false;
    let mut next_report = Instant::now() + REPORT_EVERY;
    tracing::debug!(shard = shard.id, "polling thread started");
    loop {
        if shard.stop.load(Ordering::Acquire) {
            break;
        }
        let g = shard.generation.load(Ordering::Acquire);
        if g != seen_gen {
            local.clone_from(&lock(&shard.entries));
            seen_gen = g;
        }
        let (polls, fired, waiting) = scan(&local);
        Counters::add(&counters.polls, polls);
        Counters::add(&counters.empty_polls, waiting as u64);
        if let Some(w) = watch
            && holder
            && (check_watch || checks == 0)
        {
            let now = Instant::now();
            if now >= next_watch {
                w.rescan_others(shard.id, &counters);
                next_watch = now + cfg.idle_interval;
            }
        }
        check_watch = false;
        if fired > 0 {
            last_activity = Instant::now();
            shard.report(&counters, cfg.mode, &mut next_report, false);
            checks = 0;
            dozing = false;
            shard.dozing.store(false, Ordering::SeqCst);
            thread::yield_now();
            continue;
        }
        checks += polls.max(1);
        let due = checks >= YIELD_AFTER_CHECKS;
        if due {
            checks = 0;
            shard.report(&counters, cfg.mode, &mut next_report, false);
        }
        let Some(park_after) = cfg.park_after else {
            if due {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        };
        let timed = if waiting == 0 {
            false
        } else {
            if !dozing {
                if !due {
                    std::hint::spin_loop();
                    continue;
                }
                // Every armed connection has a doorbell: doze sooner, the ring wakes them.
                let park_after = match cfg.bell_park_after {
                    Some(b)
                        if local
                            .iter()
                            .all(|e| e.bell || !e.armed.load(Ordering::Relaxed)) =>
                    {
                        b.min(park_after)
                    }
                    _ => park_after,
                };
                if last_activity.elapsed() < park_after {
                    thread::yield_now();
                    continue;
                }
                dozing = true;
                shard.dozing.store(true, Ordering::SeqCst);
                if let Some(w) = watch {
                    holder = holder
                        || w.holder
                            .compare_exchange(
                                NO_HOLDER,
                                shard.id,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            )
                            .is_ok();
                    if !holder {
                        w.kick_holder();
                    }
                }
                Counters::add(&counters.parks, 1);
                tracing::debug!(
                    shard = shard.id,
                    armed = waiting,
                    holder,
                    "polling thread dozing (armed connections idle)"
                );
            }
            true
        };
        if timed && cfg.bell_park_after.is_some() {
            // Doorbell fallback: tell the writers of the armed connections that their readers
            // sleep, then recheck each (Dekker with the writer's tail, then sleep word).
            let mut woke = 0;
            for e in &local {
                if e.armed.load(Ordering::SeqCst)
                    && e.announce()
                    && (e.source.ready() || e.source.is_closed())
                    && e.armed.swap(false, Ordering::AcqRel)
                {
                    e.fire();
                    woke += 1;
                }
            }
            if woke > 0 {
                continue;
            }
        }
        // Park. Announce it first, then look at the armed flags (and the entry list) once more:
        // a task that armed before it could see `parked` is caught by this recheck (Dekker
        // with `Registration::arm`; and with `IdleWatch::kick_holder` for `others_dozing`).
        shard.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let changed = shard.generation.load(Ordering::SeqCst) != seen_gen;
        let any_armed = local.iter().any(|e| e.armed.load(Ordering::SeqCst));
        if shard.stop.load(Ordering::SeqCst) {
            break;
        }
        if changed || (any_armed && !timed) {
            // Something to scan right away.
            shard.parked.store(false, Ordering::SeqCst);
            continue;
        }
        let watching = holder && watch.is_some_and(|w| w.others_dozing(shard.id));
        let own_rescan = any_armed && (watch.is_none() || holder);
        // Report before a park that may last: a dashboard then sees the
        // load up to here, and a later report counts the park as idle.
        if !timed {
            shard.report(&counters, cfg.mode, &mut next_report, true);
        }
        let park_start = shard.clock();
        shard.parked_since.store(park_start, Ordering::Relaxed);
        if watching || own_rescan {
            let wait = next_watch
                .saturating_duration_since(Instant::now())
                .max(Duration::from_micros(50))
                .min(cfg.idle_interval);
            thread::park_timeout(if holder { wait } else { cfg.idle_interval });
            check_watch = true;
        } else {
            thread::park();
        }
        shard
            .parked_ns
            .fetch_add(shard.clock().saturating_sub(park_start), Ordering::Relaxed);
        shard.parked_since.store(u64::MAX, Ordering::Relaxed);
        // `kick` clears `parked` before unparking; still set means the timeout expired (or a
        // spurious wake-up), so stay dozing.
        if !shard.parked.swap(false, Ordering::SeqCst) {
            dozing = false;
            shard.dozing.store(false, Ordering::SeqCst);
            last_activity = Instant::now();
            checks = 0;
            Counters::add(&counters.resumes, 1);
        }
    }
    shard.dozing.store(false, Ordering::SeqCst);
    if let Some(w) = watch
        && holder
    {
        w.holder.store(NO_HOLDER, Ordering::SeqCst);
    }
    tracing::debug!(shard = shard.id, "polling thread stopped");
}

/// One pass over a shard's entries: checks every armed one, wakes the ready (or closed) ones.
/// Returns (checks, wakes, armed entries left waiting).
fn scan(local: &[Arc<Entry>]) -> (u64, u64, usize) {
    let (mut polls, mut fired, mut waiting) = (0u64, 0u64, 0usize);
    for e in local {
        if !e.armed.load(Ordering::Acquire) {
            continue;
        }
        polls += 1;
        let closed = e.source.is_closed();
        if closed || e.source.ready() {
            if closed {
                e.closed.store(true, Ordering::Release);
            }
            if e.armed.swap(false, Ordering::AcqRel) {
                e.fire();
                fired += 1;
            }
        } else {
            waiting += 1;
        }
    }
    (polls, fired, waiting)
}

/// Owner of the polling threads and of every registration's shared state.
struct Inner {
    cfg: ConfigView,
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
            watch: shared.then(|| self.watch.clone()),
            mode: self.cfg.mode(),
        }
    }

    fn spawn(&self, shard: &Arc<Shard>, shared: bool) -> Result<JoinHandle<()>> {
        let (s, c, cfg, alive) = (
            shard.clone(),
            self.counters.clone(),
            self.loop_cfg(shared),
            self.threads_alive.clone(),
        );
        alive.fetch_add(1, Ordering::SeqCst);
        let mode = self.cfg.mode();
        crate::report::threads(1.0, mode);
        let h = thread::Builder::new()
            .name(format!("{}-{}", self.cfg.thread_name(), shard.id))
            .spawn(move || {
                polling_loop(s, c, cfg);
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
        PollerConfig::new().build()
    }

    pub(crate) fn start(cfg: PollerConfig) -> Result<Self> {
        let cfg = ConfigView(cfg);
        let n = match cfg.mode() {
            Mode::Bpts | Mode::Bpev => cfg.polling_threads(),
            Mode::Bp | Mode::Event => 0,
        };
        let shared: Vec<Arc<Shard>> = (0..n).map(Shard::new).collect();
        let inner = Arc::new(Inner {
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
        });
        for s in &inner.shared {
            let h = inner.spawn(s, true)?;
            lock(&inner.shared_threads).push(h);
        }
        Ok(Self { inner })
    }

    /// The configuration in force.
    pub fn config(&self) -> &ConfigView {
        &self.inner.cfg
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
                let dup = DupFd::new(n.fd()).map_err(Error::io("dup doorbell fd"))?;
                Some(register_readable(dup).map_err(Error::io("register doorbell fd"))?)
            }
            _ => None,
        };
        let (wake, sleeper) = match mode {
            Mode::Bp | Mode::Bpts | Mode::Bpev => (Wake::Waker(AtomicWaker::new()), Sleeper::Waker),
            Mode::Event if source.notifier().is_some() => {
                let n = source.notifier().expect("checked");
                let dup = DupFd::new(n.fd()).map_err(Error::io("dup notifier fd"))?;
                let afd = register_readable(dup).map_err(Error::io("register notifier fd"))?;
                (Wake::Notifier, Sleeper::Notifier(afd))
            }
            Mode::Event => {
                let efd = Arc::new(EventFd::new().map_err(Error::io("eventfd"))?);
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
        let entry = Arc::new(Entry {
            source,
            armed: CachePadded::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            wake,
            shard: (mode != Mode::Event).then(|| shard.clone()),
            counters: inner.counters.clone(),
            bell: bell_fd.is_some(),
            announced: AtomicBool::new(false),
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
            entry,
            shard,
            inner: inner.clone(),
            mode,
            sleeper,
            live,
            bell_fd,
            doorbell_fd,
            removed: false,
        })
    }
}

/// Polls a notification fd (an eventfd, a completion channel) and, once it is readable,
/// consumes what is pending with `ack`: `Ready(Ok(r))` with `ack`'s result when it consumed
/// something or failed; a spurious readiness (`ack` says `WouldBlock`) is cleared and polled
/// again, which registers the task's waker.
fn poll_acked<T: AsRawFd>(
    afd: &AsyncFd<T>,
    cx: &mut std::task::Context<'_>,
    op: &'static str,
    ack: impl Fn(&T) -> std::io::Result<()>,
) -> Poll<Result<std::io::Result<()>>> {
    loop {
        match afd.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io { op, source: e })),
            Poll::Ready(Ok(mut g)) => match g.try_io(|h| ack(h.get_ref())) {
                Ok(r) => return Poll::Ready(Ok(r)),
                Err(_would_block) => continue,
            },
        }
    }
}

/// What a task sleeps on.
enum Sleeper {
    Waker,
    EventFd(AsyncFd<Arc<EventFd>>),
    Notifier(AsyncFd<DupFd>),
}

/// One connection (one direction: "data to read" or "space to write") registered with a
/// [`Poller`]. Deregisters on drop (BP: the last registration of a connection stops and joins
/// the connection's thread).
pub struct Registration {
    entry: Arc<Entry>,
    shard: Arc<Shard>,
    inner: Arc<Inner>,
    mode: Mode,
    sleeper: Sleeper,
    live: Option<AsyncFd<DupFd>>,
    /// The source's doorbell fd (BPEV with the doorbell fallback).
    bell_fd: Option<AsyncFd<DupFd>>,
    tuner: SpinTuner,
    doorbell_fd: Option<RawFd>,
    removed: bool,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("mode", &self.mode)
            .field("armed", &self.entry.armed.load(Ordering::Relaxed))
            .field("eventfd", &self.doorbell_fd)
            .field("spin_budget", &self.tuner.budget())
            .finish()
    }
}

/// Why a readiness check returned.
enum Check {
    Ready,
    NotReady,
}

impl Registration {
    /// The mode of the poller this registration belongs to.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The current spin time (tuned, at most `bp_timeout`); only BPEV spins.
    pub fn spin_budget(&self) -> Duration {
        self.tuner.budget()
    }

    /// The moving RTT estimate behind [`spin_budget`](Self::spin_budget).
    pub fn rtt_estimate(&self) -> Duration {
        self.tuner.rtt_estimate()
    }

    /// Registers another source of the same connection (typically its other direction) on the
    /// same polling thread as this registration. In [`Mode::Bp`] this is how a connection
    /// gets exactly one polling thread (the paper's BP: one thread per connection, whatever
    /// it waits for); the thread stops when the last registration sharing it is dropped. In
    /// the other modes it is [`Poller::register`] with the shard chosen by this registration.
    ///
    /// # Errors
    /// As [`Poller::register`].
    pub fn register_sibling(&self, source: Arc<dyn Readiness>) -> Result<Registration> {
        let p = Poller {
            inner: self.inner.clone(),
        };
        let sibling = (self.mode != Mode::Event).then_some(&self.shard);
        p.register_in(source, sibling)
    }

    /// A handle the writer side uses to wake this registration's task in [`Mode::Event`]
    /// (the shm analogue of a `WRITE_WITH_IMM` that fires the completion channel). It writes
    /// the eventfd only when the task is armed. It also works in the other modes (it just
    /// wakes the task sooner than the polling thread would), and does nothing for sources with
    /// their own [`Notifier`](crate::Notifier).
    pub fn doorbell(&self) -> Doorbell {
        Doorbell {
            entry: self.entry.clone(),
        }
    }

    /// Whether the peer was found gone.
    pub fn is_closed(&self) -> bool {
        self.entry.closed.load(Ordering::Acquire)
    }

    fn check(&mut self) -> Result<Check> {
        if self.entry.source.ready() {
            return Ok(Check::Ready);
        }
        self.check_alive()?;
        Ok(Check::NotReady)
    }

    fn check_alive(&mut self) -> Result<()> {
        if self.inner.shutdown.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        if self.entry.closed.load(Ordering::Acquire) || self.entry.source.is_closed() {
            self.mark_closed();
            return Err(Error::PeerGone);
        }
        Ok(())
    }

    fn mark_closed(&mut self) {
        self.entry.closed.store(true, Ordering::Release);
        if !self.removed {
            self.removed = true;
            self.shard.remove(&self.entry);
            Counters::add(&self.inner.counters.closed, 1);
            tracing::debug!(mode = %self.mode, "registration closed: peer gone");
        }
    }

    /// Arms the registration: from now on a polling thread or doorbell may wake the task.
    fn arm(&self) -> Result<()> {
        if let Sleeper::Notifier(_) = self.sleeper {
            let n = self.entry.source.notifier().ok_or(Error::InvalidConfig(
                "source stopped offering a notifier after registration",
            ))?;
            n.arm().map_err(Error::io("arm notifier"))?;
            return Ok(());
        }
        self.entry.armed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if let Some(s) = &self.entry.shard {
            s.kick();
        }
        Ok(())
    }

    /// One scan of this registration's shard by the spinning task (see the spin loop).
    fn help(&self) {
        let Ok(v) = self.shard.entries.try_lock() else {
            return;
        };
        let (polls, fired, waiting) = scan(&v);
        drop(v);
        Counters::add(&self.inner.counters.polls, polls);
        Counters::add(&self.inner.counters.empty_polls, waiting as u64);
        let _ = fired;
    }

    /// Cancels our own arm after the recheck found data.
    fn disarm(&self) {
        self.entry.armed.store(false, Ordering::Relaxed);
    }

    /// Waits until the source is ready (or the peer is gone).
    ///
    /// BP/BPTS: checks, registers the waker, arms, rechecks, sleeps until the polling thread
    /// wakes it. BPEV: the same after a spin of up to the spin budget, during which the task
    /// also wakes its shard's armed neighbours that have data and which ends early when other
    /// tasks on its worker have work. EVENT: checks, arms, rechecks and sleeps on the
    /// connection's eventfd in the tokio reactor, rung by a [`Doorbell`], or on the source's
    /// [`Notifier`](crate::Notifier).
    ///
    /// Readiness is level-triggered from the caller's point of view: `wait_ready` returns
    /// immediately as long as the source is ready, so the caller consumes what is there and
    /// calls it again.
    ///
    /// # Errors
    /// [`Error::PeerGone`] once the source reports closed or its liveness fd fires (data
    /// already there is reported first); [`Error::Shutdown`] after
    /// [`Poller::shutdown`]; [`Error::Io`] if the reactor or the notifier fails.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future loses nothing. A wake-up that was aimed at the dropped
    /// future leaves at most a stale eventfd count or a stale waker call, which makes the next
    /// wait recheck once.
    pub async fn wait_ready(&mut self) -> Result<()> {
        let r = self.wait_ready_inner().await;
        // The next sleep is announced afresh (a new epoch; the writer rings once per epoch).
        self.entry.announced.store(false, Ordering::Relaxed);
        if r.is_ok() {
            PROGRESS.set(PROGRESS.get().wrapping_add(1));
        }
        r
    }

    async fn wait_ready_inner(&mut self) -> Result<()> {
        if let Check::Ready = self.check()? {
            Counters::add(&self.inner.counters.first_check_hits, 1);
            return Ok(());
        }
        // Read the clock only once we have to wait (the hit path stays clock-free).
        let start = Instant::now();
        if self.mode == Mode::Bpev {
            let budget = self.tuner.budget();
            if !budget.is_zero() {
                // The first yield comes early: under load other tasks of this worker are
                // usually runnable, and a spin must not delay them (it stops at the first
                // yield that saw them progress).
                let mut next_yield = start + SPIN_FIRST_YIELD;
                loop {
                    for _ in 0..32 {
                        if self.entry.source.ready() {
                            Counters::add(&self.inner.counters.spin_hits, 1);
                            self.tuner.observe(start.elapsed());
                            return Ok(());
                        }
                        std::hint::spin_loop();
                    }
                    self.check_alive()?;
                    let now = Instant::now();
                    if now.duration_since(start) >= budget {
                        break;
                    }
                    if now >= next_yield {
                        // Algorithm 2's working thread busy-polls all of its connections,
                        // not one: wake the armed neighbours that have data (from the worker
                        // thread a wake is a local enqueue, no syscall), so that a polling
                        // thread sharing our core is not needed to notice them.
                        self.help();
                        let before = PROGRESS.get();
                        tokio::task::yield_now().await;
                        if PROGRESS.get() != before {
                            // Other tasks on this worker had work while we spun: the worker
                            // is busy, so stop spinning, arm, and let the polling threads
                            // watch this connection (Algorithm 2 spins only while the
                            // working thread has no event to handle).
                            break;
                        }
                        next_yield = Instant::now() + SPIN_YIELD_EVERY;
                    }
                }
            }
        }
        loop {
            if let Sleeper::Waker = self.sleeper {
                self.sleep_waker().await?;
            } else {
                self.arm()?;
                if let Check::Ready = self.check()? {
                    self.disarm();
                    self.tuner.observe(start.elapsed());
                    return Ok(());
                }
                Counters::add(&self.inner.counters.sleeps, 1);
                self.sleep_fd().await?;
            }
            if let Check::Ready = self.check()? {
                Counters::add(&self.inner.counters.wakeups, 1);
                self.tuner.observe(start.elapsed());
                return Ok(());
            }
        }
    }

    /// BP / BPTS / BPEV: register waker, arm, recheck; Pending until the polling thread fires.
    async fn sleep_waker(&mut self) -> Result<()> {
        let mut slept = false;
        let r = poll_fn(|cx| {
            if let Some(live) = &self.live
                && live.poll_read_ready(cx).is_ready()
            {
                return Poll::Ready(Err(Error::PeerGone));
            }
            if let Wake::Waker(w) = &self.entry.wake {
                w.register(cx.waker());
            }
            if let Some(bell) = &self.bell_fd {
                // The writer rang (or a stale ring of an earlier sleep): consume it and let
                // the caller check; a stale one is consumed until nothing is pending, which
                // clears the readiness, so the next poll registers our waker.
                let src = &self.entry.source;
                let ack = |_: &DupFd| match src.doorbell() {
                    Some(n) => n.ack(),
                    None => Ok(()),
                };
                loop {
                    match poll_acked(bell, cx, "doorbell readiness", ack) {
                        Poll::Pending => break,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(Ok(()))) if slept => {
                            Counters::add(&self.inner.counters.bell_wakes, 1);
                            self.entry.armed.store(false, Ordering::Relaxed);
                            return Poll::Ready(Ok(()));
                        }
                        Poll::Ready(Ok(Ok(()))) => {}
                        Poll::Ready(Ok(Err(e))) => {
                            return Poll::Ready(Err(Error::Io {
                                op: "doorbell ack",
                                source: e,
                            }));
                        }
                    }
                }
            }
            if slept && !self.entry.armed.load(Ordering::Acquire) {
                // Fired (or shut down): let the caller check.
                return Poll::Ready(Ok(()));
            }
            if self.entry.source.ready() {
                self.entry.armed.store(false, Ordering::Relaxed);
                return Poll::Ready(Ok(()));
            }
            self.entry.armed.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if let Some(s) = &self.entry.shard {
                s.kick();
            }
            if self.entry.source.ready() || self.inner.shutdown.load(Ordering::SeqCst) {
                self.entry.armed.store(false, Ordering::Relaxed);
                return Poll::Ready(Ok(()));
            }
            if !slept {
                slept = true;
                Counters::add(&self.inner.counters.sleeps, 1);
            }
            Poll::Pending
        })
        .await;
        if let Err(Error::PeerGone) = r {
            self.mark_closed();
        }
        r
    }

    /// EVENT: sleep until the eventfd (or notifier fd) is readable, then drain it.
    async fn sleep_fd(&mut self) -> Result<()> {
        let r = poll_fn(|cx| {
            if let Some(live) = &self.live
                && live.poll_read_ready(cx).is_ready()
            {
                return Poll::Ready(Err(Error::PeerGone));
            }
            // Drained (or the ack failed for a reason other than WouldBlock, which the
            // recheck will surface): the caller checks the source.
            let drained = match &self.sleeper {
                Sleeper::EventFd(afd) => {
                    poll_acked(afd, cx, "eventfd readiness", |h| h.drain().map(|_| ()))
                }
                Sleeper::Notifier(afd) => {
                    let src = &self.entry.source;
                    poll_acked(afd, cx, "notifier readiness", |_| match src.notifier() {
                        Some(n) => n.ack(),
                        None => Ok(()),
                    })
                }
                Sleeper::Waker => return Poll::Ready(Ok(())),
            };
            drained.map_ok(|_| ())
        })
        .await;
        if let Err(Error::PeerGone) = r {
            self.mark_closed();
        }
        r
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.removed {
            self.removed = true;
            self.shard.remove(&self.entry);
        }
        if self.mode == Mode::Bp && self.shard.users.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shard.stop();
            let handle = {
                let mut bp = lock(&self.inner.bp);
                bp.iter()
                    .position(|(s, _)| Arc::ptr_eq(s, &self.shard))
                    .map(|i| bp.swap_remove(i).1)
            };
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
    }
}

/// Writer-side wake-up for one [`Registration`] (see [`Registration::doorbell`]).
///
/// `Clone + Send + Sync`; ringing costs one fence and one atomic load when the reader is not
/// armed, plus one eventfd write (or waker call) when it is.
#[derive(Clone)]
pub struct Doorbell {
    entry: Arc<Entry>,
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doorbell")
            .field("armed", &self.entry.armed.load(Ordering::Relaxed))
            .finish()
    }
}

impl Doorbell {
    /// Wakes the reader if it is armed. Call after publishing the data (the data store must
    /// happen before this call, which fences).
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.entry.armed.load(Ordering::Relaxed)
            && self.entry.armed.swap(false, Ordering::AcqRel)
        {
            self.entry.fire();
        }
    }

    /// Marks the reader's connection closed (peer gone) and wakes it.
    pub fn close(&self) {
        self.entry.closed.store(true, Ordering::Release);
        self.ring();
    }
}
