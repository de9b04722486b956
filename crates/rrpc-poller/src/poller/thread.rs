//! The polling threads' loop: [`polling_loop`] (the body of every polling thread, with idle
//! parking, dozing and the doorbell fallback's announces), [`scan`] (one pass over a shard's
//! armed entries, also used by spinning tasks), their settings ([`LoopCfg`]) and the
//! [`IdleWatch`] that coalesces the idle rescans of the shared polling threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::thread;
use std::time::{Duration, Instant};

use crate::backoff::{Governor, GovernorConfig, Reason, Verdict};
use crate::stats::Counters;
use crate::sys::ThreadClock;

use super::shard::{Entry, REPORT_EVERY, Shard, lock};

/// Readiness checks (a scan of nothing armed counts as one) between two `sched_yield`s of a
/// polling thread (~5–20 µs), so that a polling thread sharing a core with a tokio worker or
/// with other polling threads (BP with more connections than cores) lets them run. Counted in
/// checks, not scans: a scan of 128 armed connections is 128 times longer than a scan of one.
const YIELD_AFTER_CHECKS: u64 = 1024;

/// Per-thread settings of the polling loop.
#[derive(Clone)]
pub(super) struct LoopCfg {
    pub(super) park_after: Option<Duration>,
    /// [`PollerConfig::doorbell_park_after`](crate::PollerConfig::doorbell_park_after) (BPEV only).
    pub(super) bell_park_after: Option<Duration>,
    pub(super) idle_interval: Duration,
    /// Spin back-off ([`crate::backoff`]): needs the doorbell fallback, which is what a
    /// backed-off thread leaves its readers to.
    pub(super) backoff: bool,
    /// Shared shards (BPTS, BPEV): the idle rescans of all dozing shards are done by one
    /// thread. `None` for BP's per-connection threads.
    pub(super) watch: Option<Arc<IdleWatch>>,
    pub(super) mode: crate::Mode,
}

pub(super) const NO_HOLDER: usize = usize::MAX;

/// Coalesces the idle rescans of the shared polling threads: the first thread that dozes
/// becomes the *holder* and from then on rescans every dozing shard every `idle_interval`
/// (also while it is busy itself); the other dozing threads sleep until a task of theirs arms.
/// With N polling threads an idle poller wakes N times less often.
pub(super) struct IdleWatch {
    pub(super) holder: AtomicUsize,
    /// Indexed by shard id.
    pub(super) shards: Vec<Arc<Shard>>,
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
/// - Spin back-off ([`crate::backoff`]): a [`Governor`] judges each 1 ms window of spinning
///   (did the thread keep its core, did it wake readers) and each spin episode (resume to
///   doze). When it backs off, the thread dozes at once for the back-off's length whenever
///   every armed connection has a doorbell, and tasks with doorbells announce their own sleeps
///   rather than kick it ([`Shard::backed_off`]).
/// - Announced and idle: while every armed connection's sleep is announced to its writer, the
///   backstop rescans stretch, doubling from `idle_interval` up to [`MAX_RESCAN_STRETCH`]
///   times it. On shm an announce misses nothing ([`crate::Notifier::announce_is_exact`]).
///   On verbs the first rescan after an announce the thread made still comes after
///   `idle_interval`, which covers a tail that crossed the announce on the wire; after that
///   every tail sees the sleep word and rings. (Tasks announce their own sleeps, backed off,
///   only where announces are exact.)
pub(super) fn polling_loop(shard: Arc<Shard>, counters: Arc<Counters>, cfg: LoopCfg) {
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
    let mut gov = Governor::new(GovernorConfig::default());
    let clock = cfg.backoff.then(ThreadClock::for_current_thread);
    let gov_now = |s: &Shard| Duration::from_nanos(s.clock());
    if let Some(c) = &clock {
        gov.begin(gov_now(&shard), c.sample());
    }
    // Readers woken since the thread last resumed (one spin episode).
    let mut episode_woke = 0u64;
    let mut rescan_every = cfg.idle_interval;
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
            gov.hit(fired);
            episode_woke += fired;
            rescan_every = cfg.idle_interval;
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
            if let Some(c) = &clock
                && gov.window_due(gov_now(&shard))
                && let Verdict::BackOff { until, reason } =
                    gov.end_window(gov_now(&shard), c.sample())
            {
                back_off(&shard, &counters, until, reason);
            }
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
                // Backed off: doze at once, the rings wake them.
                let park_after = match cfg.bell_park_after {
                    Some(b)
                        if local
                            .iter()
                            .all(|e| e.bell || !e.armed.load(Ordering::Relaxed)) =>
                    {
                        if shard.backed_off() {
                            Duration::ZERO
                        } else {
                            b.min(park_after)
                        }
                    }
                    _ => park_after,
                };
                if last_activity.elapsed() < park_after {
                    thread::yield_now();
                    continue;
                }
                dozing = true;
                shard.dozing.store(true, Ordering::SeqCst);
                if clock.is_some() {
                    end_episode(&shard, &counters, &mut gov, &mut episode_woke);
                }
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
            if clock.is_some() && !dozing {
                // A spin episode that ends with nobody armed.
                end_episode(&shard, &counters, &mut gov, &mut episode_woke);
            }
        }
        let park_start = shard.clock();
        shard.parked_since.store(park_start, Ordering::Relaxed);
        if watching || own_rescan {
            let wait = next_watch
                .saturating_duration_since(Instant::now())
                .max(Duration::from_micros(50))
                .min(cfg.idle_interval);
            // Every armed sleep announced, not backed off: the rings cover them, and the
            // rescans only back them up (see the stretch above).
            // (Backed off, tasks may announce themselves, which only exact doorbells allow; an
            // inexact one was announced by this thread, after a resume that reset the period.)
            let backed_off = shard.backed_off();
            let stretch = own_rescan
                && !watching
                && cfg.bell_park_after.is_some()
                && local.iter().all(|e| {
                    !e.armed.load(Ordering::Relaxed)
                        || (e.announced.load(Ordering::Relaxed) && (e.exact_bell || !backed_off))
                });
            let timeout = if stretch {
                rescan_every
            } else if holder {
                wait
            } else {
                cfg.idle_interval
            };
            thread::park_timeout(timeout);
            rescan_every = if stretch {
                (rescan_every * 2).min(cfg.idle_interval * MAX_RESCAN_STRETCH)
            } else {
                cfg.idle_interval
            };
            check_watch = true;
        } else if let Some(left) = shard.backoff_left() {
            // Backed off, a task with an exact doorbell arms without kicking us: look again
            // when the back-off ends, so a sleep whose ring never comes waits no longer than
            // that (after it, an arm kicks).
            thread::park_timeout(left);
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
            rescan_every = cfg.idle_interval;
            Counters::add(&counters.resumes, 1);
            if let Some(c) = &clock {
                gov.begin(gov_now(&shard), c.sample());
            }
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

/// The longest backstop rescan period of an announced, idle thread, in `idle_interval`s
/// (3 ms × 64 ≈ 0.2 s with the defaults).
pub(super) const MAX_RESCAN_STRETCH: u32 = 64;

/// One spin episode ends (the thread dozes, or parks with nobody armed): did it earn its keep?
fn end_episode(shard: &Shard, counters: &Counters, gov: &mut Governor, woke: &mut u64) {
    if !shard.backed_off()
        && let Verdict::BackOff { until, reason } =
            gov.episode(Duration::from_nanos(shard.clock()), *woke)
    {
        back_off(shard, counters, until, reason);
    }
    gov.interrupt();
    *woke = 0;
}

/// Enters a back-off until `until` ([`Shard::clock`] time).
fn back_off(shard: &Shard, counters: &Counters, until: Duration, reason: Reason) {
    let until_ns = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX).max(1);
    shard.backoff_until.store(until_ns, Ordering::SeqCst);
    Counters::add(
        match reason {
            Reason::Descheduled => &counters.backoffs_descheduled,
            Reason::NotEarning => &counters.backoffs_not_earning,
        },
        1,
    );
    tracing::trace!(
        shard = shard.id,
        reason = reason.label(),
        for_us = until
            .saturating_sub(Duration::from_nanos(shard.clock()))
            .as_micros() as u64,
        "polling thread backs off; doorbells cover its readers"
    );
}

/// One pass over a shard's entries: checks every armed one, wakes the ready (or closed) ones.
/// Returns (checks, wakes, armed entries left waiting).
pub(super) fn scan(local: &[Arc<Entry>]) -> (u64, u64, usize) {
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
