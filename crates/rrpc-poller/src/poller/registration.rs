//! Registration: a [`Registration`] is one connection direction registered with a
//! [`Poller`](crate::Poller), whose [`wait_ready`](Registration::wait_ready) spins, arms,
//! rechecks and sleeps (on its waker, eventfd, notifier or doorbell fd); the [`Doorbell`] is
//! the writer-side wake-up of one registration.

use std::fmt;
use std::future::poll_fn;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use futures_util::task::AtomicWaker;
use tokio::io::unix::AsyncFd;

use crate::config::Mode;
use crate::error::{Error, Result};
use crate::source::Readiness;
use crate::stats::Counters;
use crate::sys::{DupFd, EventFd, register_readable};
use crate::tune::{COSTLY_CATCH, SpinTuner, Waited};

use super::inner::Inner;
use super::shard::{Entry, HELP_SCAN, NO_SLOT, Shard, Wake, lock};
use super::thread::scan;

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

/// A handed-off wait's most turns to its worker's other tasks before it yields the CPU,
/// while they have not answered ([`Registration::yield_to_peer`]).
const HANDOFF_TICKS: usize = 4;

/// A busy-worker wait's most yields before it sleeps ([`Wait::Busy`]): each is one turn of the
/// worker's run queue, taken only while other connections' waits on this worker completed
/// during the previous one.
const BUSY_YIELDS: u32 = 16;

/// A connection's most handed-off waits in a row that give the CPU to the peer first, without
/// a turn of their worker ([`Registration::poll_yield_to_peer`]): then one wait takes its
/// worker's turn first, so that the worker's other tasks (other connections' readers, woken
/// by the reactor, which only that turn polls) wait at most this many round trips of a
/// ping-pong. Each turn costs a task yield and a reactor poll (~1 500 instructions).
pub(super) const CPU_FIRST_RUN: u32 = 8;

/// Polls a notification fd (an eventfd, a completion channel) and, once it is readable,
/// consumes what is pending with `ack`: `Ready(Ok(r))` with `ack`'s result when it consumed
/// something or failed; a spurious readiness (`ack` says `WouldBlock`) is cleared and polled
/// again, which registers the task's waker. A successful `ack` clears the readiness too: by
/// [`Notifier::ack`](crate::Notifier::ack)'s contract it consumed everything pending.
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
                Ok(Ok(())) => {
                    // `Notifier::ack` consumed every pending notification, so the fd is no
                    // longer readable: say so now, rather than pay a read that finds nothing
                    // at the next sleep. (A notification after the ack is a new edge, and
                    // tokio keeps readiness that came after this guard's.)
                    g.clear_ready();
                    return Poll::Ready(Ok(Ok(())));
                }
                Ok(r) => return Poll::Ready(Ok(r)),
                Err(_would_block) => continue,
            },
        }
    }
}

/// What one end's writer sent, for its receiver's spin judgement
/// ([`Registration::follow_sends`]): how many sends and flushes, and when the last one was.
/// The writer calls [`record`](Self::record) once per send or flush (two relaxed stores and
/// a clock read).
#[derive(Debug)]
pub struct SendLog {
    sends: AtomicU64,
    /// The last send, in ns since `epoch` plus one (0: none yet).
    last_ns: AtomicU64,
    epoch: Instant,
}

impl Default for SendLog {
    fn default() -> Self {
        Self::new()
    }
}

impl SendLog {
    /// A log with nothing sent.
    pub fn new() -> Self {
        Self {
            sends: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Records one send or flush, now.
    pub fn record(&self) {
        let ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.last_ns.store(ns + 1, Ordering::Relaxed);
        self.sends.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends and flushes recorded.
    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::Relaxed)
    }

    /// When the last send was, if any.
    pub fn last_send(&self) -> Option<Instant> {
        match self.last_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.epoch + Duration::from_nanos(ns - 1)),
        }
    }
}

/// Fault injection for benchmarks: `RRPC_POLLER_FAULT_WAKE_DELAY_US=N` blocks a task's
/// thread for N µs after every sleep it is woken from, read once per process. It models a
/// machine whose wake-ups are slow (a VM whose idle virtual CPU the hypervisor must
/// reschedule: 100 µs and more), where the wait policy's sleeping mode showed (#54), on a
/// machine whose wake-ups take a few microseconds. Unset (the default), it costs one load.
fn fault_wake_delay() {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    let d = DELAY.get_or_init(|| {
        let us: u64 = std::env::var("RRPC_POLLER_FAULT_WAKE_DELAY_US")
            .ok()?
            .parse()
            .ok()?;
        tracing::warn!(us, "rrpc-poller: fault injection: every wake-up delayed");
        Some(Duration::from_micros(us))
    });
    if let Some(d) = d {
        std::thread::sleep(*d);
    }
}

/// What tells a sleeping task that the peer is gone: the source's liveness fd (a duplicate,
/// registered with the reactor), or a lane's liveness, which needs no descriptor
/// ([`Readiness::liveness`]).
pub(super) enum Live {
    Fd(AsyncFd<DupFd>),
    Lane(rrpc_core::conn::LivenessWatch),
}

impl Live {
    /// Ready once the peer is gone (or the fd's registration failed); else the task's waker is
    /// kept, to be woken then.
    pub(super) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Live::Fd(afd) => afd.poll_read_ready(cx).map(drop),
            Live::Lane(w) => w.poll_gone(cx),
        }
    }
}

/// What a task sleeps on.
pub(super) enum Sleeper {
    Waker,
    EventFd(AsyncFd<Arc<EventFd>>),
    Notifier(AsyncFd<DupFd>),
}

/// One connection (one direction: "data to read" or "space to write") registered with a
/// [`Poller`](crate::Poller). Deregisters on drop (BP: the last registration of a connection
/// stops and joins the connection's thread).
pub struct Registration {
    pub(super) entry: Arc<Entry>,
    pub(super) shard: Arc<Shard>,
    pub(super) inner: Arc<Inner>,
    pub(super) mode: Mode,
    pub(super) sleeper: Sleeper,
    pub(super) live: Option<Live>,
    /// The source's doorbell fd (BPEV with the doorbell fallback).
    pub(super) bell_fd: Option<AsyncFd<DupFd>>,
    pub(super) tuner: SpinTuner,
    /// The wake-up latency histogram, resolved once from the recorder installed when the
    /// registration was made (not looked up again on every wake).
    pub(super) wake_latency: metrics::Histogram,
    pub(super) doorbell_fd: Option<RawFd>,
    /// EVENT: a fixed spin before arming ([`Registration::set_event_spin`]).
    pub(super) event_spin: Duration,
    /// How often a spinning wait yields to the worker's other tasks ([`Self::set_spin_yield`]).
    pub(super) spin_yield: Duration,
    /// Never spin: the peer needs this CPU ([`Self::set_handoff`]).
    pub(super) handoff: bool,
    /// [`Handoff::Auto`](crate::Handoff::Auto): the peer process whose CPUs decide
    /// `handoff`, and when to look again ([`Self::follow_peer_cpus`]).
    pub(super) auto_peer: Option<(i32, Instant)>,
    /// Messages this end sent on the connection ([`Self::follow_sends`]), and the count the
    /// previous wait saw: the tuner's phase.
    pub(super) sends: Option<Arc<SendLog>>,
    pub(super) seen_sends: u64,
    /// When the last wait that followed sends returned its data: where this end's turn
    /// starts ([`Waited::turn`]).
    pub(super) last_ready: Option<Instant>,
    /// `sends` when the last wait returned: nothing sent since means that what consumes
    /// the data it returned may still be on its way to an answer ([`Self::yield_to_peer`]).
    pub(super) sends_at_ready: u64,
    /// Handed-off waits in a row that gave the CPU to the peer first, without a turn of the
    /// worker (at most [`CPU_FIRST_RUN`]; [`Self::poll_yield_to_peer`]).
    pub(super) cpu_first: u32,
    /// The wait in progress between two polls ([`Self::poll_ready_with`]).
    pub(super) wait: Wait,
    /// BPEV: this worker was last seen busy with other connections' waits (a spin's or a
    /// busy wait's yield saw [`PROGRESS`] move): the next wait that would sleep yields to
    /// them first ([`Wait::Busy`]).
    pub(super) worker_busy: bool,
    pub(super) removed: bool,
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
    /// Registers `source` with the poller `inner` ([`Poller::register`](crate::Poller::register)),
    /// on the shard `sibling` if given ([`Self::register_sibling`]).
    pub(super) fn new(
        inner: &Arc<Inner>,
        source: Arc<dyn Readiness>,
        sibling: Option<&Arc<Shard>>,
    ) -> Result<Registration> {
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
                Some(Live::Fd(
                    register_readable(dup).map_err(Error::io("register liveness fd"))?,
                ))
            }
            // A lane: no descriptor to duplicate and register (rrpc-core `conn::liveness`).
            None => source.liveness().map(Live::Lane),
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
            slot: AtomicUsize::new(NO_SLOT),
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
            cpu_first: 0,
            wait: Wait::Idle,
            worker_busy: false,
            removed: false,
        })
    }

    /// The mode of the poller this registration belongs to.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The current spin time (tuned, at most `bp_timeout`); only BPEV spins.
    pub fn spin_budget(&self) -> Duration {
        self.tuner.budget()
    }

    /// [`Mode::Event`] only: spin up to `budget` on the source before arming (default zero:
    /// Event mode never spins). The spin is BPEV's with a fixed budget: it yields to the OS
    /// and to the worker's other tasks every few microseconds, and, unlike BPEV's, goes on
    /// while they have work (no polling thread would watch the connection meanwhile). Event plus
    /// a short spin catches replies while a connection is busy and, once it sleeps, is woken
    /// by the writer directly, with no polling thread on the wake-up path. Other modes ignore
    /// it (BPEV spins up to `bp_timeout`, tuned).
    pub fn set_event_spin(&mut self, budget: Duration) {
        self.event_spin = budget;
    }

    /// Hands every wait of this registration to the writer's doorbell instead of spinning (no
    /// spin; one yield of the worker, then of the CPU, lets the peer answer first; then, with an
    /// exact doorbell, the task announces its own sleep and leaves its polling thread alone):
    /// for a connection whose peer needs this process's only CPU, which a spin would only keep
    /// from answering. [`AsyncConn`](crate::rings::AsyncConn) sets it
    /// under [`Handoff::Auto`](crate::Handoff::Auto); [`Handoff::Always`](crate::Handoff)
    /// hands off every registration.
    pub fn set_handoff(&mut self, on: bool) {
        self.handoff = on;
        // An explicit choice: `Handoff::Auto` no longer revisits it.
        self.auto_peer = None;
    }

    /// [`Handoff::Auto`](crate::Handoff::Auto): hands this registration's waits off while
    /// the process `peer_pid` needs this process's only CPU, decided now and again at most
    /// every [`CPUS_RECHECK`](crate::sys::CPUS_RECHECK) of waiting (threads may be pinned,
    /// or moved, after the connection was made).
    pub(crate) fn follow_peer_cpus(&mut self, peer_pid: i32) {
        self.handoff = crate::sys::peer_shares_only_cpu(peer_pid);
        self.auto_peer = Some((peer_pid, Instant::now() + crate::sys::CPUS_RECHECK));
    }

    /// Whether this registration hands its waits off ([`Self::set_handoff`], or the poller's
    /// [`Handoff::Always`](crate::Handoff::Always)).
    pub fn hands_off(&self) -> bool {
        self.handoff || self.inner.always_handoff
    }

    /// How often a spinning wait yields to the other tasks of its tokio worker (default 5 µs,
    /// the first time after 1 µs; the first yield comes after `period` if that is shorter).
    /// A reader that shares its worker with the tasks that consume what it reads (rrpc-tonic's
    /// HTTP/2 path: hyper's connection task, then the call's own) should yield often: those
    /// tasks become runnable while it spins, and each waits for its next yield. Each yield
    /// polls the reactor once (one `epoll_wait` with no timeout).
    pub fn set_spin_yield(&mut self, period: Duration) {
        self.spin_yield = period;
    }

    /// Scales this registration's spin cap (`bp_timeout`) by `factor`, for a connection whose
    /// peer takes longer than most to turn a message around (rrpc-tonic's HTTP/2 path: hyper's
    /// framing and HPACK on both ends). The tuner starts afresh with the new cap; the spin
    /// back-off still stops spins that keep missing. A factor of 1 changes nothing.
    pub fn scale_spin(&mut self, factor: u32) {
        if factor > 1 {
            let auto = self.tuner.is_auto();
            self.tuner = SpinTuner::new(self.tuner.cap().saturating_mul(factor), auto);
        }
    }

    /// Judges this registration's spins per phase ([`SpinTuner::begin_wait`]) and by this
    /// end's turn ([`SpinTuner::settle`]): `sends` records what this end sends on the
    /// connection (its writer calls [`SendLog::record`] per send or flush). A wait's phase is
    /// the number of waits begun since the count last grew, so a reader whose next message
    /// comes only after this end sent something (a client between calls, a server between
    /// requests) stops spinning in the waits that nothing this end did will end, and keeps
    /// spinning in the others. The time from a wait's data to this end's next send is its
    /// turn: after a short one, a late catch is the peer's wake-up, not a useless spin.
    /// [`AsyncConn::split`](crate::rings::AsyncConn::split) sets it on the receiving side.
    pub fn follow_sends(&mut self, sends: Arc<SendLog>) {
        self.seen_sends = sends.sends();
        self.sends_at_ready = self.seen_sends;
        self.sends = Some(sends);
    }

    /// Judges a wait that had to wait: `granted` is the spin it ran out of (zero if it was
    /// granted none, or its spin was judged already), `caught` whether the spin caught the
    /// data. Without a [`SendLog`] the turn is unknown: #30's judgement (a catch later than
    /// `COSTLY_CATCH` is a miss, a spin that ran out a miss only if the data came far later).
    fn judge(&mut self, start: Instant, granted: Duration, caught: bool) {
        let now = Instant::now();
        let seen = now.saturating_duration_since(start);
        self.tuner.observe(seen);
        // The wait ends here (every caller returns its data next).
        self.wait = Wait::Done { at: now };
        let Some(log) = &self.sends else {
            if caught {
                self.tuner.spun(seen < COSTLY_CATCH);
            } else if !granted.is_zero() {
                self.tuner.ran_out(seen);
            }
            return;
        };
        let (sent, turn) = match (log.last_send(), self.last_ready) {
            (Some(s), Some(r)) if s > r => (s.saturating_duration_since(start), Some(s - r)),
            _ => (Duration::ZERO, None),
        };
        self.tuner.settle(Waited {
            granted,
            seen,
            caught,
            sent,
            turn,
        });
    }

    /// The moving RTT estimate behind [`spin_budget`](Self::spin_budget).
    pub fn rtt_estimate(&self) -> Duration {
        self.tuner.rtt_estimate()
    }

    /// Registers another source of the same connection (typically its other direction) on the
    /// same polling thread as this registration. In [`Mode::Bp`] this is how a connection
    /// gets exactly one polling thread (the paper's BP: one thread per connection, whatever
    /// it waits for); the thread stops when the last registration sharing it is dropped. In
    /// the other modes it is [`Poller::register`](crate::Poller::register) with the shard
    /// chosen by this registration.
    ///
    /// # Errors
    /// As [`Poller::register`](crate::Poller::register).
    pub fn register_sibling(&self, source: Arc<dyn Readiness>) -> Result<Registration> {
        let sibling = (self.mode != Mode::Event).then_some(&self.shard);
        Registration::new(&self.inner, source, sibling)
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
        self.entry.set_armed();
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
        let from = if v.len() > HELP_SCAN {
            self.shard
                .help_cursor
                .fetch_add(HELP_SCAN, Ordering::Relaxed)
        } else {
            0
        };
        let [a, b] = help_window(from, v.len());
        let (p1, f1, w1) = scan(&v[a]);
        let (p2, f2, w2) = scan(&v[b]);
        drop(v);
        let (polls, fired, waiting) = (p1 + p2, f1 + f2, w1 + w2);
        Counters::add(&self.inner.counters.polls, polls);
        Counters::add(&self.inner.counters.empty_polls, waiting as u64);
        let _ = fired;
    }

    /// Spin back-off: while the shard's polling thread is backed off, or this wait's own spin
    /// is (its phase's hit rate is below 1/8) and its data was far ([`SpinTuner::leaves_thread`]), an armed entry with an exact doorbell (shm: [`Notifier::announce_is_exact`](crate::Notifier::announce_is_exact))
    /// announces its own sleep (once per wait, and again after every ring it consumed: a
    /// ring spends its announce) instead of kicking the thread; the caller's
    /// recheck follows (Dekker with the writer's tail, as for the thread's announce). Returns
    /// whether the doorbell covers this sleep. A failed announce (the previous sleep word still
    /// in flight) is not cover, and neither is an inexact one (verbs: a tail crossing the
    /// announce on the wire needs the thread's rescan, and a thread that is not kicked may be
    /// parked without a timeout): the caller kicks.
    fn covered_by_doorbell(&self, shard: &Shard) -> bool {
        // A wait whose own spin is backed off because its data has been far in this phase (a
        // server between requests at low load) would only have its polling thread spin out
        // the same wait for it: leave it to the doorbell too (#54: at one call per ms the
        // polling thread was busy ~10 % of the time, kicked for waits that then lasted a
        // millisecond). A spin backed off for other reasons (a busy worker, replies a little
        // past the spin) still kicks the thread (#58; `SpinTuner::leaves_thread`).
        let skip_thread = shard.backed_off()
            || self.handoff
            || (self.inner.cfg.spin_backoff() && self.tuner.leaves_thread());
        if !self.entry.exact_bell || !skip_thread {
            return false;
        }
        if self.entry.announced.load(Ordering::SeqCst) {
            return true;
        }
        let ok = self.entry.announce();
        if ok {
            Counters::add(&self.inner.counters.self_announces, 1);
        }
        ok
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
    /// [`Poller::shutdown`](crate::Poller::shutdown); [`Error::Io`] if the reactor or the
    /// notifier fails.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future loses nothing, and the next wait starts afresh. A
    /// wake-up that was aimed at the dropped future leaves at most a stale eventfd count or a
    /// stale waker call, which makes the next wait recheck once.
    pub async fn wait_ready(&mut self) -> Result<()> {
        self.wait_ready_with(&mut || Ok(true)).await
    }

    /// [`wait_ready`](Self::wait_ready), calling `before_sleep` once if the wait is about to
    /// sleep: after its spin (and, handed off, its yield) found nothing, before it arms. A
    /// wait that its spin or first check ends does not call it. What a reader owes its peer
    /// only if it goes idle goes there (rrpc-poller's ring receiver pushes its head there on
    /// shm: in a ping-pong every wait would otherwise push, a WRITE per message).
    /// `before_sleep` returns whether to sleep: `Ok(false)` ends the wait at once, with `Ok`
    /// and maybe no data (the caller has more to do before it may sleep); an error ends it
    /// with that error.
    ///
    /// The future is [`poll_ready_with`](Self::poll_ready_with) polled to the end.
    ///
    /// # Errors
    /// As [`wait_ready`](Self::wait_ready), and `before_sleep`'s.
    ///
    /// # Cancel safety
    /// As [`wait_ready`](Self::wait_ready); `before_sleep` runs at most once per call and
    /// not at all if the future is dropped before the spin ends.
    pub async fn wait_ready_with(
        &mut self,
        before_sleep: &mut (dyn FnMut() -> Result<bool> + Send),
    ) -> Result<()> {
        let wait = Abandon(self);
        poll_fn(|cx| wait.0.poll_ready_with(cx, before_sleep)).await
    }

    /// [`wait_ready`](Self::wait_ready) as a poll function: `Ready` once the source is ready
    /// (or with the error that ended the wait), `Pending` with the task's waker registered
    /// (the polling thread, the doorbell, the reactor or a yield wakes it).
    ///
    /// The wait's state (its spin, its hand-off, its sleep) is kept in the registration
    /// between polls, so that an owner that polls its receive in place needs no future of
    /// its own: a wait not polled to its end resumes at the next poll, where it left off (a
    /// spin whose budget ran out meanwhile ends at its next check; a sleep rechecks the
    /// source first). [`abandon_wait`](Self::abandon_wait) drops it instead.
    ///
    /// # Errors
    /// As [`wait_ready`](Self::wait_ready).
    ///
    /// # Cancel safety
    /// Nothing is consumed: not polling any more loses nothing, and a wake-up aimed at the
    /// wait left behind makes at most one needless poll.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_ready_with(cx, &mut || Ok(true))
    }

    /// [`poll_ready`](Self::poll_ready) with [`wait_ready_with`](Self::wait_ready_with)'s
    /// `before_sleep` (called at most once per wait, at the poll that is about to sleep).
    ///
    /// # Errors
    /// As [`wait_ready_with`](Self::wait_ready_with).
    pub fn poll_ready_with(
        &mut self,
        cx: &mut Context<'_>,
        before_sleep: &mut dyn FnMut() -> Result<bool>,
    ) -> Poll<Result<()>> {
        if let Wait::Idle = self.wait {
            // A new wait.
            if let Some(s) = &self.sends {
                let n = s.sends();
                self.tuner.begin_wait(n != self.seen_sends);
                self.seen_sends = n;
            }
        }
        let r = std::task::ready!(self.poll_wait(cx, before_sleep));
        let seen = match std::mem::take(&mut self.wait) {
            Wait::Done { at } => Some(at),
            _ => None,
        };
        // The next sleep is announced afresh (a new epoch; the writer rings once per epoch).
        self.entry.announced.store(false, Ordering::Relaxed);
        if r.is_ok() {
            PROGRESS.set(PROGRESS.get().wrapping_add(1));
            if let Some(s) = &self.sends {
                self.sends_at_ready = s.sends();
                self.last_ready = Some(seen.unwrap_or_else(Instant::now));
            }
        }
        Poll::Ready(r)
    }

    /// Drops the wait in progress, if any: the next poll begins a new one (what dropping
    /// [`wait_ready`](Self::wait_ready)'s future does).
    pub fn abandon_wait(&mut self) {
        self.wait = Wait::Idle;
    }

    /// One step of the wait in `self.wait`: `Pending` leaves it in a state other than
    /// [`Wait::Idle`]; `Ready` ends it (the caller resets the state).
    fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        before_sleep: &mut dyn FnMut() -> Result<bool>,
    ) -> Poll<Result<()>> {
        loop {
            match self.wait {
                // A wait that ended and was not taken (the caller polls a
                // new one): begin it.
                Wait::Done { .. } => self.wait = Wait::Idle,
                Wait::Idle => {
                    if let Check::Ready = self.check()? {
                        Counters::add(&self.inner.counters.first_check_hits, 1);
                        return Poll::Ready(Ok(()));
                    }
                    self.wait = self.begin_spin();
                }
                Wait::Spin(spin) => {
                    if let Some(end) = self.poll_spin(cx, spin)? {
                        return end;
                    }
                }
                Wait::AfterSpin {
                    start,
                    ran_out,
                    spun,
                } => {
                    // Handed off (the peer needs this CPU, or `Handoff::Always`): the
                    // doorbell wakes it, after the peer had its turn.
                    self.wait = if self.hands_off() && spun {
                        Wait::Handoff {
                            start,
                            ran_out,
                            ticks: 0,
                            yielded: false,
                        }
                    } else {
                        Wait::BeforeSleep { start, ran_out }
                    };
                }
                Wait::Handoff { .. } => {
                    if let Some(end) = self.poll_yield_to_peer(cx)? {
                        return end;
                    }
                }
                Wait::BeforeSleep { start, ran_out } => {
                    // About to sleep (the arm below rechecks, so what `before_sleep` lets
                    // the peer write is not missed).
                    if !before_sleep()? {
                        return Poll::Ready(Ok(()));
                    }
                    self.wait = self.busy_or_sleep(start, ran_out, 0);
                    if let Wait::Busy { .. } = self.wait {
                        return yield_now(cx);
                    }
                }
                Wait::Busy {
                    start,
                    ran_out,
                    yields,
                    progress,
                } => {
                    if let Check::Ready = self.check()? {
                        Counters::add(&self.inner.counters.busy_yield_hits, 1);
                        self.judge(start, ran_out, false);
                        return Poll::Ready(Ok(()));
                    }
                    self.worker_busy = PROGRESS.get() != progress;
                    self.wait = self.busy_or_sleep(start, ran_out, yields);
                    if let Wait::Busy { .. } = self.wait {
                        return yield_now(cx);
                    }
                }
                Wait::Sleep { .. } => return self.poll_sleep(cx),
            }
        }
    }

    /// After `before_sleep` (and after each busy yield, `yields` so far): BPEV on a worker
    /// last seen busy with other connections' waits yields to them once more
    /// ([`Wait::Busy`], at most [`BUSY_YIELDS`] times) before it arms; else the sleep.
    fn busy_or_sleep(&self, start: Instant, ran_out: Duration, yields: u32) -> Wait {
        if self.mode == Mode::Bpev && self.worker_busy && yields < BUSY_YIELDS && !self.hands_off()
        {
            Wait::Busy {
                start,
                ran_out,
                yields: yields + 1,
                progress: PROGRESS.get(),
            }
        } else {
            Wait::Sleep {
                start,
                ran_out,
                slept: false,
                armed: false,
            }
        }
    }

    /// After the first check missed: the clock is read (the hit path stays clock-free) and
    /// the spin, if the mode spins and the registration does not hand off, begins.
    fn begin_spin(&mut self) -> Wait {
        let start = Instant::now();
        if let Some((peer, next)) = self.auto_peer
            && start >= next
        {
            self.follow_peer_cpus(peer);
        }
        let spin = match self.mode {
            Mode::Bpev => {
                let backoff = self.inner.cfg.spin_backoff();
                let budget = if backoff {
                    let b = self.tuner.next_budget();
                    if b.is_zero() && !self.tuner.budget().is_zero() {
                        Counters::add(&self.inner.counters.spin_skips, 1);
                    }
                    b
                } else {
                    self.tuner.budget()
                };
                Some((budget, backoff))
            }
            Mode::Event => Some((self.event_spin, false)),
            Mode::Bp | Mode::Bpts => None,
        };
        match spin {
            // Handed off (the peer needs this CPU, or `Handoff::Always`): no spin.
            Some((budget, backoff)) if !budget.is_zero() && !self.hands_off() => {
                // The first yield comes early: under load other tasks of this worker are
                // usually runnable, and a spin must not delay them (BPEV's stops at the
                // first yield that saw them progress; EVENT's only lets them run).
                Counters::add(&self.inner.counters.spins, 1);
                Wait::Spin(Spin {
                    start,
                    budget,
                    backoff,
                    next_yield: start + first_yield(self.tuner.rtt_estimate(), self.spin_yield),
                    last: start,
                    yielded: None,
                })
            }
            _ => Wait::AfterSpin {
                start,
                ran_out: Duration::ZERO,
                spun: spin.is_some(),
            },
        }
    }

    /// The spin: `Some` ends the poll (the data came: `Ready`; a yield: `Pending`), `None`
    /// moves on to [`Wait::AfterSpin`].
    fn poll_spin(
        &mut self,
        cx: &mut Context<'_>,
        mut spin: Spin,
    ) -> Result<Option<Poll<Result<()>>>> {
        let Spin {
            start,
            budget,
            backoff,
            ..
        } = spin;
        let after = |ran_out| Wait::AfterSpin {
            start,
            ran_out,
            spun: true,
        };
        if let Some(before) = spin.yielded.take() {
            // Back from a yield.
            self.worker_busy = PROGRESS.get() != before;
            if self.mode == Mode::Bpev && self.worker_busy {
                // Other tasks on this worker had work while we spun: the worker is busy, so
                // stop spinning, arm, and let the polling threads watch this connection
                // (Algorithm 2 spins only while the working thread has no event to handle).
                // EVENT's spin is the fixed budget its user asked for: nobody else would
                // watch. With spin back-off on, such a spin is a miss: a connection whose
                // worker is always busy (many clients on few cores) stops spinning and arms
                // at once, and its probes find out when the worker is free.
                if backoff {
                    Counters::add(&self.inner.counters.busy_worker_spins, 1);
                    self.tuner.spun(false);
                }
                self.wait = after(Duration::ZERO);
                return Ok(None);
            }
            spin.last = Instant::now();
            spin.next_yield = spin.last + self.spin_yield;
        }
        loop {
            for _ in 0..32 {
                if self.entry.source.ready() {
                    Counters::add(&self.inner.counters.spin_hits, 1);
                    // A late catch earns only after a short turn of this end's: else the
                    // peer's wake-up was this end's doing (a caller that thinks a
                    // millisecond), and spinning it out costs more CPU than the wake-up it
                    // saved (`SpinTuner::settle`).
                    self.judge(start, budget, true);
                    return Ok(Some(Poll::Ready(Ok(()))));
                }
                std::hint::spin_loop();
            }
            self.check_alive()?;
            let now = Instant::now();
            if backoff && SpinTuner::lost_core(now.duration_since(spin.last)) {
                // Descheduled mid-spin: the wait was for the scheduler, not for data.
                Counters::add(&self.inner.counters.lost_core_spins, 1);
                self.tuner.preempted();
                self.wait = after(Duration::ZERO);
                return Ok(None);
            }
            spin.last = now;
            if now.duration_since(start) >= budget {
                self.wait = after(budget);
                return Ok(None);
            }
            if now >= spin.next_yield {
                // Algorithm 2's working thread busy-polls all of its connections, not one:
                // wake the armed neighbours that have data (from the worker thread a wake
                // is a local enqueue, no syscall), so that a polling thread sharing our
                // core is not needed to notice them. (EVENT has no polling threads to
                // relieve.)
                if self.mode == Mode::Bpev {
                    self.help();
                } else {
                    // EVENT has no polling thread, so the writer's thread is often the one
                    // the scheduler stacked on this core (wake-affine placement): let it
                    // run now rather than after the whole budget.
                    std::thread::yield_now();
                }
                spin.yielded = Some(PROGRESS.get());
                self.wait = Wait::Spin(spin);
                return Ok(Some(yield_now(cx)));
            }
        }
    }

    /// Handed off: before a sleep is announced, lets what shares this CPU run and says
    /// whether the data came meanwhile (`Some(Ready)`; `Some(Pending)` for a yield; `None`
    /// moves on to the sleep). First the worker's other tasks (after this end's own send, the
    /// CPU first: below), then the thread's turn on the
    /// CPU (`sched_yield`: a peer woken for our last message, or finishing its own turn, runs
    /// now and writes while we are not yet announced, so it rings no doorbell and no wake-up
    /// is needed). With nothing else runnable both return at once.
    ///
    /// The worker's tasks get up to [`HANDOFF_TICKS`] turns while this end has sent nothing
    /// since the last wait returned data: then whatever consumes that data is still on its
    /// way to an answer. On rrpc-tonic's HTTP/2 path the reader hands a response to hyper's
    /// connection task, which completes the caller's future, whose next request goes through
    /// tonic's buffer task back to the connection task: more than one turn of the scheduler
    /// (tokio runs the `block_on` future after the yielded task). With one turn the CPU went
    /// to the peer before the request was written, and every call slept once and was woken
    /// by a doorbell (`taskset -c 1 demo`: HTTP/2 p50 37 µs, now 26 µs; tonic-UDS 37 µs).
    /// Where the wait follows a send (the fast path's call writes its request itself, its
    /// server its reply), the CPU goes to the peer first, and the worker gets one turn only if
    /// the answer was not there after it: what the wait needs is the peer's, and a turn of the
    /// worker first cost a task yield a wait (on one CPU, the fast path's calls then took no
    /// task poll at all: `demo` under callgrind 47.6 k → 43.9 k instructions a call, p50
    /// 9.1 → 8.1 µs with `taskset -c 1`).
    fn poll_yield_to_peer(&mut self, cx: &mut Context<'_>) -> Result<Option<Poll<Result<()>>>> {
        let Wait::Handoff {
            start,
            ran_out,
            mut ticks,
            yielded,
        } = self.wait
        else {
            return Ok(None);
        };
        let hit = |me: &mut Self| {
            Counters::add(&me.inner.counters.yield_hits, 1);
            let now = Instant::now();
            me.tuner.observe(now.saturating_duration_since(start));
            me.wait = Wait::Done { at: now };
            Ok(Some(Poll::Ready(Ok(()))))
        };
        let answered = |me: &Self| {
            me.sends
                .as_ref()
                .is_none_or(|s| s.sends() != me.sends_at_ready)
        };
        if !yielded
            && ticks == 0
            && self.cpu_first < CPU_FIRST_RUN
            && self.sends.is_some()
            && answered(self)
            && let Poll::Ready(coop) = tokio::task::coop::poll_proceed(cx)
        {
            // This end sent since its data came (the fast path's caller
            // wrote its request, its server its reply): what it waits for
            // is the peer's answer, so the CPU goes to the peer first. A
            // turn of the worker first cost a task yield a wait (the task
            // polled again and the runtime's reactor polled once: ~1 500
            // instructions a call under callgrind on one CPU). If the peer
            // did not answer in its turn, the worker's turn follows.
            //
            // Each such wait takes a unit of the task's budget (tokio's
            // cooperative scheduling): a task whose every wait is answered
            // in the peer's turn would otherwise never return to its
            // worker, whose other tasks (other connections, handlers,
            // timers) would wait for as long as the ping-pong lasts. Once
            // the budget is spent the wait takes the worker's turn first,
            // and so does every [`CPU_FIRST_RUN`]th wait in a row.
            coop.made_progress();
            self.cpu_first += 1;
            std::thread::yield_now();
            if self.entry.source.ready() {
                return hit(self);
            }
        }
        if yielded {
            // Back from the worker's other tasks.
            if self.entry.source.ready() {
                return hit(self);
            }
            ticks += 1;
            if answered(self) || ticks >= HANDOFF_TICKS {
                std::thread::yield_now();
                if self.entry.source.ready() {
                    return hit(self);
                }
                self.wait = Wait::BeforeSleep { start, ran_out };
                return Ok(None);
            }
        }
        self.wait = Wait::Handoff {
            start,
            ran_out,
            ticks,
            yielded: true,
        };
        self.cpu_first = 0;
        Ok(Some(yield_now(cx)))
    }

    /// The sleep, until a wake-up whose recheck finds the data (or an error).
    fn poll_sleep(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        loop {
            let Wait::Sleep {
                start,
                ran_out,
                mut slept,
                mut armed,
            } = self.wait
            else {
                return Poll::Ready(Ok(()));
            };
            if let Sleeper::Waker = self.sleeper {
                let r = self.poll_sleep_waker(cx, &mut slept);
                self.wait = Wait::Sleep {
                    start,
                    ran_out,
                    slept,
                    armed,
                };
                std::task::ready!(r)?;
                fault_wake_delay();
                // The next sleep of this wait is a new one.
                self.wait = Wait::Sleep {
                    start,
                    ran_out,
                    slept: false,
                    armed,
                };
            } else {
                if !armed {
                    self.arm()?;
                    if let Check::Ready = self.check()? {
                        self.disarm();
                        self.judge(start, ran_out, false);
                        return Poll::Ready(Ok(()));
                    }
                    Counters::add(&self.inner.counters.sleeps, 1);
                    armed = true;
                    self.wait = Wait::Sleep {
                        start,
                        ran_out,
                        slept,
                        armed,
                    };
                }
                std::task::ready!(self.poll_sleep_fd(cx))?;
                fault_wake_delay();
                self.wait = Wait::Sleep {
                    start,
                    ran_out,
                    slept,
                    armed: false,
                };
            }
            if let Check::Ready = self.check()? {
                Counters::add(&self.inner.counters.wakeups, 1);
                self.judge(start, ran_out, false);
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// BP / BPTS / BPEV: register waker, arm, recheck; Pending until the polling thread fires.
    /// `slept`: this sleep registered and armed already (a poll after that is a wake-up).
    fn poll_sleep_waker(&mut self, cx: &mut Context<'_>, slept: &mut bool) -> Poll<Result<()>> {
        let r = self.poll_sleep_waker_inner(cx, slept);
        if let Poll::Ready(Err(Error::PeerGone)) = r {
            self.mark_closed();
        }
        r
    }

    fn poll_sleep_waker_inner(
        &mut self,
        cx: &mut Context<'_>,
        slept: &mut bool,
    ) -> Poll<Result<()>> {
        if let Some(live) = &self.live
            && live.poll_read_ready(cx).is_ready()
        {
            return Poll::Ready(Err(Error::PeerGone));
        }
        if let Wake::Waker(w) = &self.entry.wake {
            w.register(cx.waker());
        }
        if let Some(bell) = &self.bell_fd {
            // The writer rang (or a stale ring of an earlier sleep): consume it and let the
            // caller check; a stale one is consumed until nothing is pending, which clears
            // the readiness, so the next poll registers our waker.
            let src = &self.entry.source;
            let ack = |_: &DupFd| match src.doorbell() {
                Some(n) => n.ack(),
                None => Ok(()),
            };
            loop {
                match poll_acked(bell, cx, "doorbell readiness", ack) {
                    Poll::Pending => break,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(Ok(()))) => {
                        // A ring spends the announced sleep, even one that found no data (a
                        // tail stored before the announce whose writer read the sleep word
                        // after it): the writer rings once per announce, so the next sleep
                        // must announce afresh or no ring will come.
                        self.entry.announced.store(false, Ordering::SeqCst);
                        if *slept {
                            Counters::add(&self.inner.counters.bell_wakes, 1);
                            self.entry.armed.store(false, Ordering::Relaxed);
                            return Poll::Ready(Ok(()));
                        }
                    }
                    Poll::Ready(Ok(Err(e))) => {
                        return Poll::Ready(Err(Error::Io {
                            op: "doorbell ack",
                            source: e,
                        }));
                    }
                }
            }
        }
        if *slept && !self.entry.armed.load(Ordering::Acquire) {
            // Fired (or shut down): let the caller check.
            if let Some(d) = self.entry.take_wake_latency() {
                Counters::add(&self.inner.counters.timed_wakes, 1);
                let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                Counters::add(&self.inner.counters.wake_latency_ns, ns);
                self.wake_latency.record(d.as_secs_f64());
            }
            return Poll::Ready(Ok(()));
        }
        if self.entry.source.ready() {
            self.entry.armed.store(false, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        self.entry.set_armed();
        fence(Ordering::SeqCst);
        if let Some(s) = &self.entry.shard
            && !self.covered_by_doorbell(s)
        {
            s.kick();
        }
        if self.entry.source.ready() || self.inner.shutdown.load(Ordering::SeqCst) {
            self.entry.armed.store(false, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        if !*slept {
            *slept = true;
            Counters::add(&self.inner.counters.sleeps, 1);
        }
        Poll::Pending
    }

    /// EVENT: sleep until the eventfd (or notifier fd) is readable, then drain it.
    fn poll_sleep_fd(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let r = self.poll_sleep_fd_inner(cx);
        if let Poll::Ready(Err(Error::PeerGone)) = r {
            self.mark_closed();
        }
        r
    }

    fn poll_sleep_fd_inner(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(live) = &self.live
            && live.poll_read_ready(cx).is_ready()
        {
            return Poll::Ready(Err(Error::PeerGone));
        }
        // Drained (or the ack failed for a reason other than WouldBlock, which the recheck
        // will surface): the caller checks the source.
        let drained = match &self.sleeper {
            Sleeper::EventFd(afd) => {
                poll_acked(afd, cx, "eventfd readiness", |h| match h.drain() {
                    Ok(0) => Err(std::io::ErrorKind::WouldBlock.into()),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.into()),
                })
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
    }
}

/// Where a [`Registration`]'s wait is between two polls ([`Registration::poll_ready_with`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) enum Wait {
    /// No wait in progress: the next poll begins one.
    #[default]
    Idle,
    /// Spinning (BPEV, EVENT with a spin).
    Spin(Spin),
    /// The spin ended (`ran_out`: the spin that ran out, judged once the data comes; zero if
    /// none did), or the mode does not spin (`spun` false).
    AfterSpin {
        start: Instant,
        ran_out: Duration,
        spun: bool,
    },
    /// Handed off: yielding to what shares this CPU ([`HANDOFF_TICKS`] at most).
    Handoff {
        start: Instant,
        ran_out: Duration,
        ticks: usize,
        yielded: bool,
    },
    /// `before_sleep` is next.
    BeforeSleep { start: Instant, ran_out: Duration },
    /// BPEV on a busy worker: `before_sleep` ran, and the wait yields to the worker's other
    /// tasks (`yields` so far, at most [`BUSY_YIELDS`]) while other connections' waits on
    /// this worker keep completing ([`PROGRESS`] as it was at the last yield), instead of
    /// arming a sleep that a doorbell (system calls at both ends) or a polling thread
    /// competing for the cores would end. Nothing is armed or announced: the task is in the
    /// run queue, and sleeps as any other wait once the worker is no longer busy.
    Busy {
        start: Instant,
        ran_out: Duration,
        yields: u32,
        progress: u64,
    },
    /// Asleep (`slept`: the waker's sleep registered and armed; `armed`: the fd sleep's arm
    /// ran).
    Sleep {
        start: Instant,
        ran_out: Duration,
        slept: bool,
        armed: bool,
    },
    /// The data came, seen at `at` (the clock read that judged the wait):
    /// [`Registration::poll_ready_with`] keeps it as the wait's end instead
    /// of reading the clock again (one read a wait less).
    Done { at: Instant },
}

/// A spin in progress.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spin {
    start: Instant,
    budget: Duration,
    backoff: bool,
    next_yield: Instant,
    last: Instant,
    /// Yielded to the worker's other tasks, with [`PROGRESS`] as it was before.
    yielded: Option<u64>,
}

/// One yield to the worker's other tasks, as `tokio::task::yield_now` (its wake-up is
/// deferred until the scheduler looked at its I/O driver): always `Pending`.
pub(crate) fn yield_now<T>(cx: &mut Context<'_>) -> Poll<T> {
    let mut y = std::pin::pin!(tokio::task::yield_now());
    // Its first poll schedules the wake-up and is pending; dropped then, it is done with.
    let _ = y.as_mut().poll(cx);
    Poll::Pending
}

/// [`Registration::wait_ready_with`]'s future, dropped: the wait goes with it.
struct Abandon<'a>(&'a mut Registration);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.0.abandon_wait();
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

/// The entries of a shard of `len` a spinning task's help looks at, for a help cursor at
/// `from`: the whole shard when it is small, else [`HELP_SCAN`] of them from `from` (modulo
/// `len`), wrapping around, as two ranges.
pub(super) fn help_window(from: usize, len: usize) -> [std::ops::Range<usize>; 2] {
    if len <= HELP_SCAN {
        return [0..len, 0..0];
    }
    let from = from % len;
    let to = from + HELP_SCAN;
    if to <= len {
        [from..to, 0..0]
    } else {
        [from..len, 0..to - len]
    }
}

/// When a spinning wait first yields, given its registration's RTT estimate and yield period:
/// [`SPIN_FIRST_YIELD`] (or the period, if shorter), except while the registration's waits end
/// sooner than its yield period (a ping-pong): then just after the catch the estimate expects
/// (1.5 times it), so that a reply on time is caught without a yield. A yield is not free:
/// tokio's scheduler looks at its I/O driver (`epoll_wait`) before it polls the task again,
/// ~1 µs in a VM, and a fast-path ping-pong's reply came during its client's yield at 1 µs
/// about every other call (demo: the reply's way from the server's post to the client's catch
/// 335 ns, the request's 86 ns). Under load waits are long and the first yield stays early.
pub(super) fn first_yield(rtt: Duration, spin_yield: Duration) -> Duration {
    let early = SPIN_FIRST_YIELD.min(spin_yield);
    if rtt >= spin_yield {
        return early;
    }
    (rtt + rtt / 2).clamp(early, spin_yield)
}
