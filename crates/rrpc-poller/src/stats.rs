//! Counters: polls, empty polls, eventfd writes, wake-ups, spins that found data, parks.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

/// Live counters shared by the polling threads and the tasks (relaxed atomics; polling threads
/// add their poll counts once per scan, not once per connection).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) polls: CachePadded<AtomicU64>,
    pub(crate) empty_polls: CachePadded<AtomicU64>,
    pub(crate) eventfd_writes: CachePadded<AtomicU64>,
    pub(crate) waker_wakes: CachePadded<AtomicU64>,
    pub(crate) wakeups: CachePadded<AtomicU64>,
    pub(crate) spin_hits: CachePadded<AtomicU64>,
    pub(crate) spins: CachePadded<AtomicU64>,
    pub(crate) first_check_hits: CachePadded<AtomicU64>,
    pub(crate) sleeps: CachePadded<AtomicU64>,
    pub(crate) parks: CachePadded<AtomicU64>,
    pub(crate) resumes: CachePadded<AtomicU64>,
    pub(crate) closed: CachePadded<AtomicU64>,
    pub(crate) announces: CachePadded<AtomicU64>,
    pub(crate) bell_wakes: CachePadded<AtomicU64>,
    pub(crate) backoffs_descheduled: CachePadded<AtomicU64>,
    pub(crate) backoffs_not_earning: CachePadded<AtomicU64>,
    pub(crate) spin_skips: CachePadded<AtomicU64>,
    pub(crate) lost_core_spins: CachePadded<AtomicU64>,
    pub(crate) busy_worker_spins: CachePadded<AtomicU64>,
    pub(crate) yield_hits: CachePadded<AtomicU64>,
    pub(crate) busy_yield_hits: CachePadded<AtomicU64>,
    pub(crate) self_announces: CachePadded<AtomicU64>,
    pub(crate) timed_wakes: CachePadded<AtomicU64>,
    pub(crate) wake_latency_ns: CachePadded<AtomicU64>,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        if n != 0 {
            c.fetch_add(n, Relaxed);
        }
    }

    pub(crate) fn snapshot(&self, threads: usize) -> Stats {
        Stats {
            polls: self.polls.load(Relaxed),
            empty_polls: self.empty_polls.load(Relaxed),
            eventfd_writes: self.eventfd_writes.load(Relaxed),
            waker_wakes: self.waker_wakes.load(Relaxed),
            wakeups: self.wakeups.load(Relaxed),
            spin_hits: self.spin_hits.load(Relaxed),
            spins: self.spins.load(Relaxed),
            first_check_hits: self.first_check_hits.load(Relaxed),
            sleeps: self.sleeps.load(Relaxed),
            parks: self.parks.load(Relaxed),
            resumes: self.resumes.load(Relaxed),
            closed: self.closed.load(Relaxed),
            announces: self.announces.load(Relaxed),
            bell_wakes: self.bell_wakes.load(Relaxed),
            backoffs_descheduled: self.backoffs_descheduled.load(Relaxed),
            backoffs_not_earning: self.backoffs_not_earning.load(Relaxed),
            spin_skips: self.spin_skips.load(Relaxed),
            lost_core_spins: self.lost_core_spins.load(Relaxed),
            busy_worker_spins: self.busy_worker_spins.load(Relaxed),
            yield_hits: self.yield_hits.load(Relaxed),
            busy_yield_hits: self.busy_yield_hits.load(Relaxed),
            self_announces: self.self_announces.load(Relaxed),
            timed_wakes: self.timed_wakes.load(Relaxed),
            wake_latency_ns: self.wake_latency_ns.load(Relaxed),
            polling_threads: threads,
        }
    }
}

/// A snapshot of a [`Poller`](crate::Poller)'s counters (monotonic since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Readiness checks made by polling threads (only armed connections are checked).
    pub polls: u64,
    /// Of those, checks that found nothing.
    pub empty_polls: u64,
    /// eventfd writes (by polling threads in BPEV, by doorbells in EVENT).
    pub eventfd_writes: u64,
    /// `Waker::wake` calls by polling threads (BP, BPTS).
    pub waker_wakes: u64,
    /// Times a sleeping task was woken and found its connection ready.
    pub wakeups: u64,
    /// Waits satisfied while the task was spinning (BPEV), without sleeping.
    pub spin_hits: u64,
    /// Waits that spun (BPEV, or EVENT with a receive spin), whatever the spin found: none while
    /// [`Poller::hands_off`](crate::Poller::hands_off).
    pub spins: u64,
    /// Waits satisfied by the very first check (no spin, no sleep).
    pub first_check_hits: u64,
    /// Times a task armed its connection and went to sleep.
    pub sleeps: u64,
    /// Times a polling thread parked (every watched connection idle).
    pub parks: u64,
    /// Times a parked polling thread resumed because a task armed.
    pub resumes: u64,
    /// Registrations found closed (peer gone) and removed.
    pub closed: u64,
    /// Doorbell fallback: sleeps announced to the writer (by a dozing polling thread, or by
    /// the task itself while its thread is backed off: [`Stats::self_announces`]).
    pub announces: u64,
    /// Doorbell fallback: tasks woken by the writer's doorbell (through the reactor).
    pub bell_wakes: u64,
    /// Spin back-off: times a polling thread backed off because it lost its core (run-queue
    /// delay over 30 % of a window).
    pub backoffs_descheduled: u64,
    /// Spin back-off: times a polling thread backed off because its spinning woke too few
    /// readers.
    pub backoffs_not_earning: u64,
    /// Spin back-off: waits that skipped their spin because the connection's spins rarely
    /// catch data.
    pub spin_skips: u64,
    /// Spin back-off: spins cut short because the spinning task lost its core.
    pub lost_core_spins: u64,
    /// Spin back-off: BPEV spins cut short because other tasks of the worker had work (each
    /// counts as a miss of the connection's spins, so a connection whose worker is always
    /// busy stops spinning).
    pub busy_worker_spins: u64,
    /// Hand-off: waits satisfied by their yield (the worker's other tasks, then the CPU, ran
    /// once; after this end's send, the CPU first) before any sleep was announced: no
    /// doorbell rung, no wake-up.
    pub yield_hits: u64,
    /// Busy worker: BPEV waits satisfied while they yielded to a worker whose other
    /// connections' waits kept completing, before any sleep was armed or announced: no
    /// doorbell rung, no wake-up.
    pub busy_yield_hits: u64,
    /// Spin back-off: sleeps a task announced itself, its polling thread being backed off.
    pub self_announces: u64,
    /// Wakes by a polling thread or a spinning neighbour whose latency was measured (from the
    /// `Waker::wake` call to the woken task running).
    pub timed_wakes: u64,
    /// The sum of those latencies, in nanoseconds ([`Stats::mean_wake_latency`]).
    pub wake_latency_ns: u64,
    /// Polling threads currently running.
    pub polling_threads: usize,
}

impl Stats {
    /// The mean latency of the measured wakes ([`Stats::timed_wakes`]), if any.
    pub fn mean_wake_latency(&self) -> Option<std::time::Duration> {
        self.wake_latency_ns
            .checked_div(self.timed_wakes)
            .map(std::time::Duration::from_nanos)
    }

    /// Counter differences `self - earlier` (for measuring an interval).
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            polls: self.polls - earlier.polls,
            empty_polls: self.empty_polls - earlier.empty_polls,
            eventfd_writes: self.eventfd_writes - earlier.eventfd_writes,
            waker_wakes: self.waker_wakes - earlier.waker_wakes,
            wakeups: self.wakeups - earlier.wakeups,
            spin_hits: self.spin_hits - earlier.spin_hits,
            spins: self.spins - earlier.spins,
            first_check_hits: self.first_check_hits - earlier.first_check_hits,
            sleeps: self.sleeps - earlier.sleeps,
            parks: self.parks - earlier.parks,
            resumes: self.resumes - earlier.resumes,
            closed: self.closed - earlier.closed,
            announces: self.announces - earlier.announces,
            bell_wakes: self.bell_wakes - earlier.bell_wakes,
            backoffs_descheduled: self.backoffs_descheduled - earlier.backoffs_descheduled,
            backoffs_not_earning: self.backoffs_not_earning - earlier.backoffs_not_earning,
            spin_skips: self.spin_skips - earlier.spin_skips,
            lost_core_spins: self.lost_core_spins - earlier.lost_core_spins,
            busy_worker_spins: self.busy_worker_spins - earlier.busy_worker_spins,
            yield_hits: self.yield_hits - earlier.yield_hits,
            busy_yield_hits: self.busy_yield_hits - earlier.busy_yield_hits,
            self_announces: self.self_announces - earlier.self_announces,
            timed_wakes: self.timed_wakes - earlier.timed_wakes,
            wake_latency_ns: self.wake_latency_ns - earlier.wake_latency_ns,
            polling_threads: self.polling_threads,
        }
    }
}

/// One polling thread's time, cumulative since it started
/// ([`Poller::thread_loads`](crate::Poller::thread_loads)): how long it has
/// lived and how much of that it spent parked. Spinning and scanning count
/// as busy: they hold the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadLoad {
    /// The polling thread's index (its shard).
    pub thread: usize,
    /// Time since the thread started.
    pub alive: std::time::Duration,
    /// Of that, time parked (a park in progress counts up to now).
    pub parked: std::time::Duration,
}

impl ThreadLoad {
    /// The busy fraction (0 to 1) between `earlier` and `self` (the same
    /// thread, read twice); 0 when no time passed.
    pub fn busy_since(&self, earlier: &ThreadLoad) -> f64 {
        let dt = self.alive.saturating_sub(earlier.alive).as_secs_f64();
        if dt <= 0.0 {
            return 0.0;
        }
        let dp = self.parked.saturating_sub(earlier.parked).as_secs_f64();
        (1.0 - dp / dt).clamp(0.0, 1.0)
    }
}
