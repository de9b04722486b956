//! The shards: an [`Entry`] is one registration's shared state (its source, its `armed` flag,
//! how its task is woken: [`Wake`]), and a [`Shard`] is the set of entries one polling thread
//! scans, with what that thread publishes (parked, dozing, stop) and its load for the reports.
//!
//! The bottom of the poller's modules: the polling threads ([`super::thread`]), the poller's
//! shared state ([`super::inner`]) and the registrations ([`super::registration`]) build on
//! it, and it names none of them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use futures_util::task::AtomicWaker;

use crate::source::Readiness;
use crate::stats::Counters;
use crate::sys::EventFd;

/// Locks one of the poller's lists (a shard's entries, the poller's threads).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned list is still a valid list: the panicking thread did not leave it half-updated
    // (every critical section is a single Vec operation).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a task is woken.
pub(super) enum Wake {
    /// EVENT: the connection's own eventfd, watched by the tokio reactor.
    EventFd(Arc<EventFd>),
    /// BP, BPTS, BPEV: the task's waker, called by a polling thread (or a spinning neighbour).
    Waker(AtomicWaker),
    /// EVENT with a source-supplied notifier: the source's channel fires by itself.
    Notifier,
}

/// How often a running polling thread reports to the `metrics` facade.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Shared state of one registration, seen by the task, the polling thread and doorbells.
pub(super) struct Entry {
    pub(super) source: Arc<dyn Readiness>,
    pub(super) armed: CachePadded<AtomicBool>,
    /// Set by a polling thread that saw `source.is_closed()`.
    pub(super) closed: AtomicBool,
    pub(super) wake: Wake,
    /// The shard polling this entry (None in EVENT mode).
    pub(super) shard: Option<Arc<Shard>>,
    pub(super) counters: Arc<Counters>,
    /// The doorbell fallback covers this entry (BPEV, on, and the source has a doorbell).
    pub(super) bell: bool,
    /// This arm's sleep was announced to the writer (reset by the task when it wakes).
    pub(super) announced: AtomicBool,
    /// The doorbell's announce misses nothing ([`Notifier::announce_is_exact`](crate::Notifier::announce_is_exact)).
    pub(super) exact_bell: bool,
    /// The clock of `fired_at`: the registration's creation.
    pub(super) epoch: Instant,
    /// When the last `Waker::wake` was called, in ns since `epoch` plus 1 (0: none pending);
    /// the woken task takes it to measure its wake-up latency.
    pub(super) fired_at: AtomicU64,
    /// The entry's slot in its shard ([`Shard::add`]; [`NO_SLOT`] before), its bit in the
    /// shard's [`ArmedSet`].
    pub(super) slot: AtomicUsize,
}

/// An entry not in a shard's slots yet.
pub(super) const NO_SLOT: usize = usize::MAX;

/// Slots whose arms the [`ArmedSet`] tracks by bit. An entry in a higher slot (a shard of
/// more than 1024 registrations) arms through the set's overflow flag, which makes the
/// polling thread look at every slot above this once.
pub(super) const ARMED_BITS: usize = 1024;

/// The arms a shard's polling thread has not taken yet: a task that arms sets its entry's
/// bit (after its `armed` flag, before its fence and kick), and the thread, at each pass,
/// takes the bits and adds those entries to the ones it watches, so that a pass looks at
/// the armed entries only, not at every registration (#58: at 64 clients a pass over 128
/// registrations read 128 lines other CPUs wrote, ~96 D1 misses a message).
pub(super) struct ArmedSet {
    words: [AtomicU64; ARMED_BITS / 64],
    overflow: AtomicBool,
}

impl ArmedSet {
    fn new() -> Self {
        Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: AtomicBool::new(false),
        }
    }

    /// Records that the entry in `slot` armed (`SeqCst`: ordered with the arm's `armed`
    /// store before it and its `parked` load after its fence: the Dekker with
    /// [`Shard::parked`]).
    pub(super) fn note(&self, slot: usize) {
        match self.words.get(slot / 64) {
            Some(w) => {
                w.fetch_or(1 << (slot % 64), Ordering::SeqCst);
            }
            None => self.overflow.store(true, Ordering::SeqCst),
        }
    }

    /// Takes the arms recorded in the first `slots` slots (the rest stay for a later take),
    /// calling `f` with each slot; returns whether the overflow flag was set (taken too).
    pub(super) fn take(&self, slots: usize, f: &mut impl FnMut(usize)) -> bool {
        for (i, w) in self.words.iter().take(slots.div_ceil(64)).enumerate() {
            if w.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = w.swap(0, Ordering::AcqRel);
            while bits != 0 {
                f(i * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        self.overflow.load(Ordering::Relaxed) && self.overflow.swap(false, Ordering::AcqRel)
    }

    /// Whether any arm is recorded and not taken (`SeqCst`: the polling thread's side of
    /// the Dekker, after its `parked` store and fence).
    pub(super) fn any(&self) -> bool {
        self.overflow.load(Ordering::SeqCst)
            || self.words.iter().any(|w| w.load(Ordering::SeqCst) != 0)
    }
}

/// A shard's entries by slot: a slot stays an entry's while it is registered and is reused
/// after.
#[derive(Default)]
pub(super) struct Slots {
    pub(super) by_slot: Vec<Option<Arc<Entry>>>,
    free: Vec<usize>,
}

/// Adds 1 to a sleeping task's eventfd. A write that fails is logged: the task's rescan (or
/// its peer's next message) then wakes it instead.
fn ring(efd: &EventFd) {
    if let Err(e) = efd.notify() {
        tracing::warn!(error = %e, "eventfd write failed");
    }
}

impl Entry {
    /// Sets `armed` and records the arm in the shard's [`ArmedSet`]; the caller fences and
    /// kicks next, as before.
    pub(super) fn set_armed(&self) {
        self.armed.store(true, Ordering::SeqCst);
        if let Some(s) = &self.shard {
            s.armed_set.note(self.slot.load(Ordering::Relaxed));
        }
    }

    /// Wakes the task. Call only after winning `armed.swap(false)`.
    pub(super) fn fire(&self) {
        match &self.wake {
            Wake::EventFd(efd) => {
                ring(efd);
                Counters::add(&self.counters.eventfd_writes, 1);
            }
            Wake::Waker(w) => {
                let t = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.fired_at.store(t.saturating_add(1), Ordering::Relaxed);
                w.wake();
                Counters::add(&self.counters.waker_wakes, 1);
            }
            Wake::Notifier => {}
        }
    }

    /// The wake-up latency of the last `Waker::wake`, if one is pending (taken once).
    pub(super) fn take_wake_latency(&self) -> Option<Duration> {
        let t = self.fired_at.swap(0, Ordering::Relaxed);
        if t == 0 {
            return None;
        }
        Some(
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_nanos(t - 1)),
        )
    }

    /// Doorbell fallback: announces this armed entry's sleep once per arm (arm the notifier,
    /// announce, then the caller rechecks). Returns whether it announced.
    pub(super) fn announce(&self) -> bool {
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
                // Not announced after all (the next doze tries again); the rescans every
                // idle_poll_interval still cover the entry.
                self.announced.store(false, Ordering::SeqCst);
                tracing::debug!(error = %e, "doorbell announce failed; rescans cover it");
                false
            }
        }
    }

    /// Wakes the task unconditionally (shutdown).
    pub(super) fn force_wake(&self) {
        self.armed.store(false, Ordering::SeqCst);
        match &self.wake {
            Wake::EventFd(efd) => ring(efd),
            Wake::Waker(w) => w.wake(),
            Wake::Notifier => {}
        }
    }
}

/// A set of entries scanned by one polling thread (or, for EVENT, by nobody).
pub(super) struct Shard {
    pub(super) id: usize,
    pub(super) entries: Mutex<Vec<Arc<Entry>>>,
    /// The same entries by slot (taken under `entries`' lock, after it).
    pub(super) slots: Mutex<Slots>,
    /// The arms the polling thread has not taken yet.
    pub(super) armed_set: CachePadded<ArmedSet>,
    pub(super) generation: AtomicU64,
    pub(super) len: AtomicUsize,
    pub(super) parked: CachePadded<AtomicBool>,
    pub(super) stop: AtomicBool,
    pub(super) thread: OnceLock<Thread>,
    /// BP: registrations sharing this shard's thread (the thread stops when it drops to 0).
    pub(super) users: AtomicUsize,
    /// The thread dozes: armed connections, idle; its rescans may be done by
    /// [`IdleWatch`](super::thread::IdleWatch).
    pub(super) dozing: AtomicBool,
    /// The busy fraction's clock ([`Shard::busy_fraction`]): nanoseconds since `born`.
    born: Instant,
    /// Nanoseconds spent parked (finished parks).
    pub(super) parked_ns: AtomicU64,
    /// When the current park began (ns since `born`), `u64::MAX` while running.
    pub(super) parked_since: AtomicU64,
    /// The load at the previous report.
    last_report: Mutex<crate::stats::ThreadLoad>,
    /// Spin back-off: the thread is backed off until this [`Shard::clock`] time (0: not
    /// backed off). Meanwhile a task whose entry has a doorbell announces its own sleep
    /// instead of kicking the thread ([`Shard::backed_off`]).
    pub(super) backoff_until: AtomicU64,
    /// [`Handoff::Always`](crate::Handoff::Always) in force: the thread stays backed off
    /// (tasks with exact doorbells announce their own sleeps).
    pub(super) alone: AtomicBool,
    /// Where the next spinning task's [`help`](super::registration::Registration) scan
    /// starts: each looks at [`HELP_SCAN`] entries from here, so helping costs the same at 4
    /// connections and at 512.
    pub(super) help_cursor: AtomicUsize,
}

/// Entries a spinning task looks at per help (a rotating window of its shard).
pub(super) const HELP_SCAN: usize = 16;

impl Shard {
    pub(super) fn new(id: usize) -> Arc<Self> {
        Arc::new(Self {
            id,
            entries: Mutex::new(Vec::new()),
            slots: Mutex::new(Slots::default()),
            armed_set: CachePadded::new(ArmedSet::new()),
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
            backoff_until: AtomicU64::new(0),
            alone: AtomicBool::new(false),
            help_cursor: AtomicUsize::new(0),
            last_report: Mutex::new(crate::stats::ThreadLoad {
                thread: id,
                alive: Duration::ZERO,
                parked: Duration::ZERO,
            }),
        })
    }

    /// Whether the thread is backed off now (its readers with doorbells are left to them); for
    /// good under [`Handoff::Always`](crate::Handoff::Always).
    pub(super) fn backed_off(&self) -> bool {
        if self.alone.load(Ordering::Relaxed) {
            return true;
        }
        let until = self.backoff_until.load(Ordering::Relaxed);
        until != 0 && self.clock() < until
    }

    /// What is left of the thread's back-off, if it is backed off.
    pub(super) fn backoff_left(&self) -> Option<Duration> {
        let until = self.backoff_until.load(Ordering::Relaxed);
        let now = self.clock();
        (until != 0 && now < until).then(|| Duration::from_nanos(until - now))
    }

    pub(super) fn clock(&self) -> u64 {
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

    pub(super) fn load(&self) -> crate::stats::ThreadLoad {
        let (alive, parked) = self.times();
        crate::stats::ThreadLoad {
            thread: self.id,
            alive: Duration::from_nanos(alive),
            parked: Duration::from_nanos(parked),
        }
    }

    /// The share of wall time this shard's thread was not parked since the
    /// previous report (spinning and scanning count as busy), 0 to 1.
    pub(super) fn busy_fraction(&self) -> f64 {
        let now = self.load();
        let earlier = std::mem::replace(&mut *lock(&self.last_report), now);
        now.busy_since(&earlier)
    }

    /// Reports this thread's load, and the poller's counters, at most once
    /// per [`REPORT_EVERY`] (`force`: now).
    pub(super) fn report(
        &self,
        counters: &Counters,
        mode: crate::Mode,
        next: &mut Instant,
        force: bool,
    ) {
        let now = Instant::now();
        if !force && now < *next {
            return;
        }
        *next = now + REPORT_EVERY;
        crate::report::counters(&counters.snapshot(0), mode);
        crate::report::busy(self.id, self.busy_fraction(), mode);
    }

    pub(super) fn add(&self, e: Arc<Entry>) {
        let mut v = lock(&self.entries);
        {
            let mut s = lock(&self.slots);
            let slot = match s.free.pop() {
                Some(i) => i,
                None => {
                    s.by_slot.push(None);
                    s.by_slot.len() - 1
                }
            };
            e.slot.store(slot, Ordering::Relaxed);
            s.by_slot[slot] = Some(e.clone());
        }
        v.push(e);
        self.len.store(v.len(), Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(super) fn remove(&self, e: &Arc<Entry>) {
        {
            let mut v = lock(&self.entries);
            v.retain(|x| !Arc::ptr_eq(x, e));
            let mut s = lock(&self.slots);
            let slot = e.slot.load(Ordering::Relaxed);
            if s.by_slot
                .get(slot)
                .is_some_and(|x| x.as_ref().is_some_and(|x| Arc::ptr_eq(x, e)))
            {
                s.by_slot[slot] = None;
                s.free.push(slot);
            }
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
    pub(super) fn kick(&self) {
        if self.parked.load(Ordering::SeqCst)
            && self.parked.swap(false, Ordering::SeqCst)
            && let Some(t) = self.thread.get()
        {
            t.unpark();
        }
    }

    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.parked.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}
