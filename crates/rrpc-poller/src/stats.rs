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
    pub(crate) first_check_hits: CachePadded<AtomicU64>,
    pub(crate) sleeps: CachePadded<AtomicU64>,
    pub(crate) parks: CachePadded<AtomicU64>,
    pub(crate) resumes: CachePadded<AtomicU64>,
    pub(crate) closed: CachePadded<AtomicU64>,
    pub(crate) announces: CachePadded<AtomicU64>,
    pub(crate) bell_wakes: CachePadded<AtomicU64>,
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
            first_check_hits: self.first_check_hits.load(Relaxed),
            sleeps: self.sleeps.load(Relaxed),
            parks: self.parks.load(Relaxed),
            resumes: self.resumes.load(Relaxed),
            closed: self.closed.load(Relaxed),
            announces: self.announces.load(Relaxed),
            bell_wakes: self.bell_wakes.load(Relaxed),
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
    /// Doorbell fallback: sleeps a dozing polling thread announced to the writer.
    pub announces: u64,
    /// Doorbell fallback: tasks woken by the writer's doorbell (through the reactor).
    pub bell_wakes: u64,
    /// Polling threads currently running.
    pub polling_threads: usize,
}

impl Stats {
    /// Counter differences `self - earlier` (for measuring an interval).
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            polls: self.polls - earlier.polls,
            empty_polls: self.empty_polls - earlier.empty_polls,
            eventfd_writes: self.eventfd_writes - earlier.eventfd_writes,
            waker_wakes: self.waker_wakes - earlier.waker_wakes,
            wakeups: self.wakeups - earlier.wakeups,
            spin_hits: self.spin_hits - earlier.spin_hits,
            first_check_hits: self.first_check_hits - earlier.first_check_hits,
            sleeps: self.sleeps - earlier.sleeps,
            parks: self.parks - earlier.parks,
            resumes: self.resumes - earlier.resumes,
            closed: self.closed - earlier.closed,
            announces: self.announces - earlier.announces,
            bell_wakes: self.bell_wakes - earlier.bell_wakes,
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
