//! The polling threads' loop: [`polling_loop`] (the body of every polling thread, with idle
//! parking, dozing and the doorbell fallback's announces; each pass looks at the shard's armed
//! entries only, through its armed set), [`scan`] (one pass over a list of entries, used by
//! spinning tasks and the idle rescans), their settings ([`LoopCfg`]) and the
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
    let mut t = PollingThread::new(shard, counters, cfg);
    tracing::debug!(shard = t.shard.id, "polling thread started");
    loop {
        if t.shard.stop.load(Ordering::Acquire) {
            break;
        }
        t.take_entries();
        let (polls, fired, waiting) = t.scan_own();
        t.rescan_dozing_shards();
        if fired > 0 {
            t.woke(fired);
            continue;
        }
        let due = t.count_checks(polls);
        let Some(park_after) = t.cfg.park_after else {
            // No idle parking (the paper's configuration): spin for good.
            if due {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        };
        // Armed connections left waiting: the park below is timed (a doze), once they idled.
        let timed = waiting > 0;
        if timed && !t.doze(due, park_after, waiting) {
            continue;
        }
        if timed && t.announce_sleeps() > 0 {
            continue;
        }
        match t.recheck_before_park(timed) {
            Recheck::Stop => break,
            Recheck::Scan => continue,
            Recheck::Park { any_armed } => t.park(timed, any_armed),
        }
    }
    t.stopped();
}

/// One polling thread's state across the turns of [`polling_loop`]; each method is one step of
/// a turn, in the loop's order.
struct PollingThread {
    shard: Arc<Shard>,
    counters: Arc<Counters>,
    cfg: LoopCfg,
    /// The shard's entries by slot as of generation `seen_gen` (taken again when it moves).
    by_slot: Vec<Option<Arc<Entry>>>,
    /// The slots of the entries this thread watches: each armed entry is here or has its
    /// arm recorded in the shard's [`ArmedSet`](super::shard::ArmedSet) (taken at the next
    /// pass). An entry leaves when it fires or is found disarmed.
    watching: Vec<usize>,
    /// `in_watch[slot]`: the slot is in `watching`.
    in_watch: Vec<bool>,
    seen_gen: u64,
    /// The last wake-up this thread made, or its last resume: where the idle time that
    /// `park_after` measures starts.
    last_activity: Instant,
    /// Readiness checks since the last `sched_yield` (up to [`YIELD_AFTER_CHECKS`]).
    checks: u64,
    /// Armed connections, idle: the thread dozes (published in [`Shard::dozing`]).
    dozing: bool,
    /// This thread does the idle rescans of every dozing shard ([`IdleWatch::holder`]).
    holder: bool,
    /// When the holder's next rescan of the other dozing shards is due.
    next_watch: Instant,
    /// Back from a timed park: the holder looks at `next_watch` in this turn.
    check_watch: bool,
    /// When the next report to the `metrics` facade is due ([`Shard::report`]).
    next_report: Instant,
    /// Spin back-off ([`crate::backoff`]): judges the windows and episodes of spinning.
    gov: Governor,
    /// The thread's CPU clock, with spin back-off on.
    clock: Option<ThreadClock>,
    /// Readers woken since the thread last resumed (one spin episode).
    episode_woke: u64,
    /// The backstop rescan period of a thread whose armed sleeps are all announced.
    rescan_every: Duration,
}

/// What the recheck before a park found ([`PollingThread::recheck_before_park`]).
enum Recheck {
    /// The shard stops.
    Stop,
    /// Something to scan right away.
    Scan,
    /// Nothing new: park (`any_armed`: armed connections wait).
    Park { any_armed: bool },
}

/// The [`Governor`]'s clock: [`Shard::clock`].
fn gov_now(shard: &Shard) -> Duration {
    Duration::from_nanos(shard.clock())
}

impl PollingThread {
    fn new(shard: Arc<Shard>, counters: Arc<Counters>, cfg: LoopCfg) -> Self {
        let last_activity = Instant::now();
        let next_watch = Instant::now();
        let next_report = Instant::now() + REPORT_EVERY;
        let mut gov = Governor::new(GovernorConfig::default());
        let clock = cfg.backoff.then(ThreadClock::for_current_thread);
        if let Some(c) = &clock {
            gov.begin(gov_now(&shard), c.sample());
        }
        Self {
            by_slot: Vec::new(),
            watching: Vec::new(),
            in_watch: Vec::new(),
            seen_gen: u64::MAX,
            last_activity,
            checks: 0,
            dozing: false,
            holder: false,
            next_watch,
            check_watch: false,
            next_report,
            gov,
            clock,
            episode_woke: 0,
            rescan_every: cfg.idle_interval,
            shard,
            counters,
            cfg,
        }
    }

    /// Takes the shard's entry list again if it changed (a registration came or went), and
    /// watches every entry armed in it (an arm taken from the set while the list was stale
    /// may have been looked up in the old list).
    fn take_entries(&mut self) {
        let g = self.shard.generation.load(Ordering::Acquire);
        if g != self.seen_gen {
            self.by_slot.clone_from(&lock(&self.shard.slots).by_slot);
            self.seen_gen = g;
            self.watching.clear();
            self.in_watch.clear();
            self.in_watch.resize(self.by_slot.len(), false);
            for (slot, e) in self.by_slot.iter().enumerate() {
                if e.as_ref().is_some_and(|e| e.armed.load(Ordering::SeqCst)) {
                    self.watching.push(slot);
                    self.in_watch[slot] = true;
                }
            }
        }
    }

    /// The entries this thread watches.
    fn watched(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.watching
            .iter()
            .filter_map(|&slot| self.by_slot.get(slot)?.as_ref())
    }

    /// One pass over the shard's armed entries, counted: takes the new arms from the shard's
    /// [`ArmedSet`](super::shard::ArmedSet), then checks every watched entry as [`scan`] does
    /// (wakes the ready or closed ones; drops those found disarmed). Returns (checks, wakes,
    /// armed entries left waiting). O(armed), not O(registrations).
    fn scan_own(&mut self) -> (u64, u64, usize) {
        let (watching, in_watch) = (&mut self.watching, &mut self.in_watch);
        let mut watch = |slot: usize| {
            // A slot past the list: registered after it was taken; the next turn takes the
            // list again (its generation moved) and watches it then.
            if let Some(w) = in_watch.get_mut(slot)
                && !*w
            {
                *w = true;
                watching.push(slot);
            }
        };
        let overflow = self.shard.armed_set.take(self.by_slot.len(), &mut watch);
        if overflow {
            for slot in super::shard::ARMED_BITS..self.by_slot.len() {
                if self.by_slot[slot]
                    .as_ref()
                    .is_some_and(|e| e.armed.load(Ordering::Acquire))
                {
                    watch(slot);
                }
            }
        }
        let (mut polls, mut fired, mut waiting) = (0u64, 0u64, 0usize);
        let mut i = 0;
        while i < self.watching.len() {
            let slot = self.watching[i];
            let keep = match self.by_slot.get(slot).and_then(Option::as_ref) {
                Some(e) if e.armed.load(Ordering::Acquire) => {
                    polls += 1;
                    let (woke, left) = check(e);
                    fired += u64::from(woke);
                    waiting += usize::from(left);
                    left
                }
                _ => false,
            };
            if keep {
                i += 1;
            } else {
                self.watching.swap_remove(i);
                self.in_watch[slot] = false;
            }
        }
        Counters::add(&self.counters.polls, polls);
        Counters::add(&self.counters.empty_polls, waiting as u64);
        (polls, fired, waiting)
    }

    /// The [`IdleWatch`]'s holder rescans the other dozing shards, when due (looked at after a
    /// timed park, and after each `sched_yield`).
    fn rescan_dozing_shards(&mut self) {
        if let Some(w) = self.cfg.watch.as_deref()
            && self.holder
            && (self.check_watch || self.checks == 0)
        {
            let now = Instant::now();
            if now >= self.next_watch {
                w.rescan_others(self.shard.id, &self.counters);
                self.next_watch = now + self.cfg.idle_interval;
            }
        }
        self.check_watch = false;
    }

    /// The scan woke `fired` readers: the thread is busy (it stops dozing), and yields once.
    fn woke(&mut self, fired: u64) {
        self.gov.hit(fired);
        self.episode_woke += fired;
        self.rescan_every = self.cfg.idle_interval;
        self.last_activity = Instant::now();
        self.shard
            .report(&self.counters, self.cfg.mode, &mut self.next_report, false);
        self.checks = 0;
        self.dozing = false;
        self.shard.dozing.store(false, Ordering::SeqCst);
        self.yield_now();
    }

    /// `sched_yield`, its wall time told to the [`Governor`] (given away on purpose, not a
    /// lost core: [`Governor::yielded`]).
    fn yield_now(&mut self) {
        if self.clock.is_none() {
            thread::yield_now();
            return;
        }
        let t0 = Instant::now();
        thread::yield_now();
        self.gov.yielded(t0.elapsed());
    }

    /// Counts a turn's checks; whether a `sched_yield` is due ([`YIELD_AFTER_CHECKS`]), when
    /// the thread also reports and may close the [`Governor`]'s window.
    fn count_checks(&mut self, polls: u64) -> bool {
        self.checks += polls.max(1);
        let due = self.checks >= YIELD_AFTER_CHECKS;
        if due {
            self.checks = 0;
            self.shard
                .report(&self.counters, self.cfg.mode, &mut self.next_report, false);
            self.end_window();
        }
        due
    }

    /// Spin back-off: judges a 1 ms window of spinning when one is due, and backs off if it
    /// says so.
    fn end_window(&mut self) {
        if let Some(c) = &self.clock
            && self.gov.window_due(gov_now(&self.shard))
            && let Verdict::BackOff { until, reason } =
                self.gov.end_window(gov_now(&self.shard), c.sample())
        {
            back_off(&self.shard, &self.counters, until, reason);
        }
    }

    /// Armed connections wait and nothing came: whether the thread dozes now (`true`: it
    /// dozed already, or they idled long enough), or spins on (`false`: a spin-loop hint, or a
    /// `sched_yield` when one is `due`).
    fn doze(&mut self, due: bool, park_after: Duration, waiting: usize) -> bool {
        if self.dozing {
            return true;
        }
        if !due {
            std::hint::spin_loop();
            return false;
        }
        let park_after = self.doze_after(park_after);
        if self.last_activity.elapsed() < park_after {
            self.yield_now();
            return false;
        }
        self.start_dozing(waiting);
        true
    }

    /// How long armed connections idle before the thread dozes: `park_after`, sooner when
    /// every armed connection has a doorbell (the ring wakes them), at once when backed off
    /// (the rings wake them).
    fn doze_after(&self, park_after: Duration) -> Duration {
        match self.cfg.bell_park_after {
            Some(b)
                if self
                    .watched()
                    .all(|e| e.bell || !e.armed.load(Ordering::Relaxed)) =>
            {
                if self.shard.backed_off() {
                    Duration::ZERO
                } else {
                    b.min(park_after)
                }
            }
            _ => park_after,
        }
    }

    /// The thread dozes: the spin episode ends, and the [`IdleWatch`] learns of it (the first
    /// dozing thread becomes its holder; the others kick the holder).
    fn start_dozing(&mut self, waiting: usize) {
        self.dozing = true;
        self.shard.dozing.store(true, Ordering::SeqCst);
        if self.clock.is_some() {
            end_episode(
                &self.shard,
                &self.counters,
                &mut self.gov,
                &mut self.episode_woke,
            );
        }
        if let Some(w) = self.cfg.watch.as_deref() {
            self.holder = self.holder
                || w.holder
                    .compare_exchange(NO_HOLDER, self.shard.id, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
            if !self.holder {
                w.kick_holder();
            }
        }
        Counters::add(&self.counters.parks, 1);
        tracing::debug!(
            shard = self.shard.id,
            armed = waiting,
            holder = self.holder,
            "polling thread dozing (armed connections idle)"
        );
    }

    /// Doorbell fallback, dozing: tells the writers of the armed connections that their
    /// readers sleep, then rechecks each (Dekker with the writer's tail, then sleep word).
    /// Returns the readers woken because their data came meanwhile (0 without the fallback).
    fn announce_sleeps(&self) -> u64 {
        if self.cfg.bell_park_after.is_none() {
            return 0;
        }
        let mut woke = 0;
        for e in self.watched() {
            if e.armed.load(Ordering::SeqCst)
                && e.announce()
                && (e.source.ready() || e.source.is_closed())
                && e.armed.swap(false, Ordering::AcqRel)
            {
                e.fire();
                woke += 1;
            }
        }
        woke
    }

    /// Announces the park, then looks at the armed set, the watched entries' armed flags
    /// (and the entry list) once more: a task that armed before it could see `parked` is
    /// caught by this recheck (Dekker with `Registration::arm`, whose arm is recorded in the
    /// armed set before its fence; and with `IdleWatch::kick_holder` for `others_dozing`). An
    /// arm not taken yet is scanned at once, timed park or not.
    fn recheck_before_park(&self, timed: bool) -> Recheck {
        self.shard.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let changed = self.shard.generation.load(Ordering::SeqCst) != self.seen_gen;
        let new_arms = self.shard.armed_set.any();
        let any_armed = new_arms || self.watched().any(|e| e.armed.load(Ordering::SeqCst));
        if self.shard.stop.load(Ordering::SeqCst) {
            return Recheck::Stop;
        }
        if changed || new_arms || (any_armed && !timed) {
            self.shard.parked.store(false, Ordering::SeqCst);
            return Recheck::Scan;
        }
        Recheck::Park { any_armed }
    }

    /// Parks (after [`Self::recheck_before_park`]): timed for the rescans, until the back-off
    /// ends while backed off, else until kicked. Counts the time parked, and resumes unless
    /// the park only timed out.
    fn park(&mut self, timed: bool, any_armed: bool) {
        let watch = self.cfg.watch.as_deref();
        let watching = self.holder && watch.is_some_and(|w| w.others_dozing(self.shard.id));
        let own_rescan = any_armed && (watch.is_none() || self.holder);
        if !timed {
            self.before_untimed_park();
        }
        let park_start = self.shard.clock();
        self.shard.parked_since.store(park_start, Ordering::Relaxed);
        if watching || own_rescan {
            self.park_for_rescans(watching, own_rescan);
        } else if let Some(left) = self.shard.backoff_left() {
            // Backed off, a task with an exact doorbell arms without kicking us: look again
            // when the back-off ends, so a sleep whose ring never comes waits no longer than
            // that (after it, an arm kicks).
            thread::park_timeout(left);
        } else {
            thread::park();
        }
        self.shard.parked_ns.fetch_add(
            self.shard.clock().saturating_sub(park_start),
            Ordering::Relaxed,
        );
        self.shard.parked_since.store(u64::MAX, Ordering::Relaxed);
        // `kick` clears `parked` before unparking; still set means the timeout expired (or a
        // spurious wake-up), so stay dozing.
        if !self.shard.parked.swap(false, Ordering::SeqCst) {
            self.resume();
        }
    }

    /// Before a park that may last (nobody armed): report, so that a dashboard sees the load
    /// up to here and a later report counts the park as idle; and a spin episode that ends
    /// with nobody armed is judged.
    fn before_untimed_park(&mut self) {
        self.shard
            .report(&self.counters, self.cfg.mode, &mut self.next_report, true);
        if self.clock.is_some() && !self.dozing {
            end_episode(
                &self.shard,
                &self.counters,
                &mut self.gov,
                &mut self.episode_woke,
            );
        }
    }

    /// A timed park for the rescans: the holder's of the dozing shards (`watching`), this
    /// shard's own (`own_rescan`), stretched while every armed sleep is announced.
    fn park_for_rescans(&mut self, watching: bool, own_rescan: bool) {
        let wait = self
            .next_watch
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(50))
            .min(self.cfg.idle_interval);
        // Every armed sleep announced, not backed off: the rings cover them, and the
        // rescans only back them up (see the stretch in `polling_loop`'s docs).
        // (Backed off, tasks may announce themselves, which only exact doorbells allow; an
        // inexact one was announced by this thread, after a resume that reset the period.)
        let backed_off = self.shard.backed_off();
        let stretch = own_rescan
            && !watching
            && self.cfg.bell_park_after.is_some()
            && self.watched().all(|e| {
                !e.armed.load(Ordering::Relaxed)
                    || (e.announced.load(Ordering::Relaxed) && (e.exact_bell || !backed_off))
            });
        let timeout = if stretch {
            self.rescan_every
        } else if self.holder {
            wait
        } else {
            self.cfg.idle_interval
        };
        thread::park_timeout(timeout);
        self.rescan_every = if stretch {
            (self.rescan_every * 2).min(self.cfg.idle_interval * MAX_RESCAN_STRETCH)
        } else {
            self.cfg.idle_interval
        };
        self.check_watch = true;
    }

    /// Kicked out of a park (a task armed, the entry list changed): the thread runs again,
    /// and a new spin episode begins.
    fn resume(&mut self) {
        self.dozing = false;
        self.shard.dozing.store(false, Ordering::SeqCst);
        self.last_activity = Instant::now();
        self.checks = 0;
        self.rescan_every = self.cfg.idle_interval;
        Counters::add(&self.counters.resumes, 1);
        if let Some(c) = &self.clock {
            self.gov.begin(gov_now(&self.shard), c.sample());
        }
    }

    /// The shard stopped: the thread leaves the [`IdleWatch`].
    fn stopped(&self) {
        self.shard.dozing.store(false, Ordering::SeqCst);
        if let Some(w) = self.cfg.watch.as_deref()
            && self.holder
        {
            w.holder.store(NO_HOLDER, Ordering::SeqCst);
        }
        tracing::debug!(shard = self.shard.id, "polling thread stopped");
    }
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

/// One pass over a list of entries (a spinning task's help, the idle rescans of other
/// shards): checks every armed one, wakes the ready (or closed) ones. Returns (checks, wakes,
/// armed entries left waiting).
pub(super) fn scan(local: &[Arc<Entry>]) -> (u64, u64, usize) {
    let (mut polls, mut fired, mut waiting) = (0u64, 0u64, 0usize);
    for e in local {
        if !e.armed.load(Ordering::Acquire) {
            continue;
        }
        polls += 1;
        let (woke, left) = check(e);
        fired += u64::from(woke);
        waiting += usize::from(left);
    }
    (polls, fired, waiting)
}

/// Checks one armed entry: wakes it if its source is ready or closed. Returns (woke it,
/// left waiting).
fn check(e: &Entry) -> (bool, bool) {
    let closed = e.source.is_closed();
    if closed || e.source.ready() {
        if closed {
            e.closed.store(true, Ordering::Release);
        }
        // Another waker (a spinning task's help, a doorbell) may have won it.
        let won = e.armed.swap(false, Ordering::AcqRel);
        if won {
            e.fire();
        }
        (won, false)
    } else {
        (false, true)
    }
}
