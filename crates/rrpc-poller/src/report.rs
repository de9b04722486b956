//! What operators watch, through the [`metrics`] facade: install any
//! recorder (a Prometheus exporter, statsd, ...) and these appear in the
//! service's own dashboards. Without a recorder each report costs a few
//! relaxed loads.
//!
//! Every name carries the label `mode` (`BP`, `BPTS`, `EVENT`, `BPEV`).
//! Counters are monotonic since the poller started ([`crate::Stats`] has
//! the same numbers); the busy fraction of a polling thread is the share of
//! wall time it was not parked (spinning and scanning count as busy: they
//! burn the core) since its previous report. Polling threads report on
//! their own about once a second while they run, and once more before they
//! park; [`crate::Poller::report_metrics`] reports everything at once (call
//! it before a scrape for exact figures).
//!
//! Wake-up latency ([`WAKE_LATENCY`], a histogram in seconds) is the time
//! from a polling thread's (or a spinning neighbour's) `Waker::wake` to the
//! woken task running, recorded by the task itself into the histogram of
//! the recorder installed when its registration was made. Wakes by a
//! writer's doorbell are not timed: the ring happens in the writer's process.

use crate::{Mode, Stats};

/// Readiness checks made by polling threads (counter).
pub const POLLS: &str = "rrpc_poller_polls_total";
/// Checks that found nothing (counter).
pub const EMPTY_POLLS: &str = "rrpc_poller_empty_polls_total";
/// Doorbells rung: eventfd writes by polling threads (BPEV) or by writers
/// (EVENT) (counter).
pub const DOORBELLS: &str = "rrpc_poller_doorbells_total";
/// `Waker::wake` calls by polling threads, BP and BPTS (counter).
pub const WAKER_WAKES: &str = "rrpc_poller_waker_wakes_total";
/// Sleeping tasks woken that found their connection ready (counter).
pub const WAKEUPS: &str = "rrpc_poller_wakeups_total";
/// Waits satisfied while spinning, without sleeping (counter).
pub const SPIN_HITS: &str = "rrpc_poller_spin_hits_total";
/// Waits satisfied by the first check (counter).
pub const FIRST_CHECK_HITS: &str = "rrpc_poller_first_check_hits_total";
/// Times a task armed and went to sleep (counter).
pub const SLEEPS: &str = "rrpc_poller_sleeps_total";
/// Times a polling thread parked, idle (counter).
pub const PARKS: &str = "rrpc_poller_parks_total";
/// Doorbell fallback: sleeps announced to writers by dozing polling
/// threads (counter).
pub const ANNOUNCES: &str = "rrpc_poller_sleeps_announced_total";
/// Doorbell fallback: tasks woken by a writer's doorbell (counter).
pub const BELL_WAKES: &str = "rrpc_poller_doorbell_wakes_total";
/// Spin back-off: polling threads backing off, label `reason`
/// (`descheduled`, `not_earning`) (counter).
pub const BACKOFFS: &str = "rrpc_poller_backoffs_total";
/// Spin back-off: waits that skipped their spin (counter).
pub const SPIN_SKIPS: &str = "rrpc_poller_spin_skips_total";
/// Spin back-off: spins cut short because the task lost its core (counter).
pub const LOST_CORE_SPINS: &str = "rrpc_poller_lost_core_spins_total";
/// Spin back-off: spins cut short because the worker's other tasks had work (counter).
pub const BUSY_WORKER_SPINS: &str = "rrpc_poller_busy_worker_spins_total";
/// Hand-off: waits satisfied by their yield, before any sleep (counter).
pub const YIELD_HITS: &str = "rrpc_poller_yield_hits_total";
/// Busy worker: waits satisfied by their yields to a busy worker, before any sleep
/// (counter).
pub const BUSY_YIELD_HITS: &str = "rrpc_poller_busy_yield_hits_total";
/// Spin back-off: sleeps a task announced itself (counter).
pub const SELF_ANNOUNCES: &str = "rrpc_poller_self_announces_total";
/// Wake-up latency of a woken task, in seconds (histogram).
pub const WAKE_LATENCY: &str = "rrpc_poller_wakeup_latency_seconds";
/// Polling threads running (gauge).
pub const POLLING_THREADS: &str = "rrpc_poller_polling_threads";
/// A polling thread's busy fraction, 0 to 1, label `thread` (gauge).
pub const THREAD_BUSY: &str = "rrpc_poller_thread_busy_ratio";

/// Records the counters of `s`.
pub(crate) fn counters(s: &Stats, mode: Mode) {
    let m = mode.name();
    for (name, v) in [
        (POLLS, s.polls),
        (EMPTY_POLLS, s.empty_polls),
        (DOORBELLS, s.eventfd_writes),
        (WAKER_WAKES, s.waker_wakes),
        (WAKEUPS, s.wakeups),
        (SPIN_HITS, s.spin_hits),
        (FIRST_CHECK_HITS, s.first_check_hits),
        (SLEEPS, s.sleeps),
        (PARKS, s.parks),
        (ANNOUNCES, s.announces),
        (BELL_WAKES, s.bell_wakes),
        (SPIN_SKIPS, s.spin_skips),
        (LOST_CORE_SPINS, s.lost_core_spins),
        (BUSY_WORKER_SPINS, s.busy_worker_spins),
        (YIELD_HITS, s.yield_hits),
        (BUSY_YIELD_HITS, s.busy_yield_hits),
        (SELF_ANNOUNCES, s.self_announces),
    ] {
        metrics::counter!(name, "mode" => m).absolute(v);
    }
    for (reason, v) in [
        ("descheduled", s.backoffs_descheduled),
        ("not_earning", s.backoffs_not_earning),
    ] {
        metrics::counter!(BACKOFFS, "mode" => m, "reason" => reason).absolute(v);
    }
}

/// The wake-up latency histogram of `mode` in the current recorder (a registration takes it
/// once and records every measured wake into it).
pub(crate) fn wake_latency(mode: Mode) -> metrics::Histogram {
    metrics::histogram!(WAKE_LATENCY, "mode" => mode.name())
}

/// Records polling thread `thread`'s busy fraction.
pub(crate) fn busy(thread: usize, fraction: f64, mode: Mode) {
    metrics::gauge!(THREAD_BUSY, "mode" => mode.name(), "thread" => thread.to_string())
        .set(fraction);
}

/// One more (`+1`) or one fewer (`-1`) polling thread.
pub(crate) fn threads(delta: f64, mode: Mode) {
    metrics::gauge!(POLLING_THREADS, "mode" => mode.name()).increment(delta);
}
