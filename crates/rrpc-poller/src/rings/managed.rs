//! A sender whose upkeep the poller runs: completion progress and the ring's
//! sizing tick ([`AsyncConn::split_managed`]).
//!
//! A ring holds work back until send completions are polled (a tail WRITE
//! deferred by the elastic threshold, work beyond the send-queue budget),
//! and a self-sizing ring shrinks only from a tick of its policy
//! (`rrpc_ringbuf` docs, "Rings that size themselves"). A writer that goes
//! idle does neither, so somebody else must: one upkeep task per
//! connection, which polls completions after a send that left work held
//! back until nothing is, and for a self-sizing ring ticks the policy every
//! `shrink_after / 2` and, on the same tick, tells the receiving side's
//! owner when unread data sits in its ring ([`IdleReads`]): an idle reader
//! must still read its peer's resize markers, or the peer's ring never
//! shrinks.
//!
//! # One owner, no lock across an await
//!
//! The ring's sending state sits behind a `std` mutex that is only ever
//! held for a synchronous step: a reserve, fill and commit; a poll of the
//! completions; a sizing tick. Nobody holds it while waiting. A writer that
//! finds the ring full lets go of it, waits for room on its own
//! [`Registration`](crate::Registration) (or, while work is held back
//! behind completions, polls them itself between yields), and tries again;
//! meanwhile the upkeep task can always take its turn. (Before, the
//! sender sat behind an async mutex held across the wait for room: the
//! shape of a cross-host hang where the waiting writer held what the
//! progress task needed to post the tail.) A failure the upkeep task finds
//! fails the connection ([`fail_connection`]). A writer that waits for room
//! does so through [`ManagedSender::wait_room`]: one waiter at a time (it
//! takes the sender mutably), while any number of [`SendHandle`]s send.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rrpc_core::conn::Connection;
use rrpc_ringbuf::{RingTx, TxWatch};
use tokio::sync::Notify;

use super::{AsyncConn, AsyncReceiver, AsyncSender, CompletionWait, RxSource, TxSource};
use crate::config::Mode;
use crate::error::{Error, Result};
use crate::poller::{Registration, SendLog};
use crate::source::Readiness;

/// The sending half of [`AsyncConn::split_managed`]: a ring sender whose
/// completion progress and ring sizing the poller's upkeep task runs.
pub struct ManagedSender {
    core: Arc<Core>,
    /// Waits for room when the ring is full (only a writer that holds the
    /// sender mutably waits: `send_with`).
    room: Registration,
    mode: Mode,
    max: usize,
    preferred: usize,
}

/// What the writer and the upkeep task share.
struct Core {
    /// The ring's sending state: locked for synchronous steps only.
    ring: Mutex<RingTx>,
    watch: TxWatch,
    src: Arc<TxSource>,
    /// Sends and flushes, for the receiver's spin phases.
    sends: Arc<SendLog>,
    /// The upkeep task runs (started lazily for progress, at once for a
    /// self-sizing ring).
    upkeep_started: AtomicBool,
    /// Kicks the upkeep task: work is held back behind completions. Also
    /// rung when the sender goes, so that the task ends.
    kick: Arc<Notify>,
}

impl std::fmt::Debug for ManagedSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedSender")
            .field("max", &self.max)
            .field("preferred", &self.preferred)
            .finish_non_exhaustive()
    }
}

/// Tells the owner of an [`AsyncReceiver`] that nobody may be reading
/// while its ring holds data: the poller's sizing tick found unread data
/// (a peer's resize marker, say). Cloneable; each tick wakes one waiter.
#[derive(Debug, Clone)]
pub struct IdleReads(Arc<Notify>);

impl IdleReads {
    /// Waits for the next tick that found unread data (at most one is
    /// kept while nobody waits).
    ///
    /// # Cancel safety
    /// Cancel-safe: a tick that came meanwhile is kept for the next wait.
    pub async fn wait(&self) {
        self.0.notified().await;
    }
}

impl AsyncConn {
    /// As [`split`](Self::split), with the sender's upkeep run by the
    /// poller (module [`managed`](self::ManagedSender) docs): after a send
    /// that leaves work held back, a task polls completions until it is
    /// out; a self-sizing ring's policy ticks every `shrink_after / 2`, and
    /// the receiver's [`AsyncReceiver::idle_reads`] fires on a tick that
    /// finds unread data. One task per connection, on the current tokio
    /// runtime, holding the connection only weakly: it ends with the
    /// sender.
    ///
    /// # Errors
    /// As [`split`](Self::split).
    pub fn split_managed(self) -> Result<(ManagedSender, AsyncReceiver)> {
        let (tx, mut rx) = self.split()?;
        let AsyncSender {
            tx: ring,
            reg,
            src,
            mode,
            sends,
        } = tx;
        let cfg = ring.config();
        let max = cfg.max_message();
        // A fixed ring carries whole-ring messages best (the papers'
        // setting); a self-sizing one, a third of its cache cap.
        let sizing = cfg.self_sizing();
        let preferred = if sizing {
            (cfg.cache_ring_size() / 3).min(max)
        } else {
            max
        };
        let every = cfg.shrink_after() / 2;
        let sender = ManagedSender {
            core: Arc::new(Core {
                watch: ring.watch(),
                ring: Mutex::new(ring),
                src,
                sends,
                upkeep_started: AtomicBool::new(false),
                kick: Arc::new(Notify::new()),
            }),
            room: reg,
            mode,
            max,
            preferred,
        };
        if sizing {
            let idle = IdleReads(Arc::new(Notify::new()));
            let sizing = Sizing {
                every,
                rx: Arc::downgrade(&rx.src),
                idle: idle.clone(),
            };
            if sender.core.start_upkeep(Some(sizing)) {
                rx.idle = Some(idle);
            }
        }
        Ok((sender, rx))
    }
}

impl ManagedSender {
    /// Largest message the ring carries, in bytes.
    pub fn max_message(&self) -> usize {
        self.max
    }

    /// Largest message the ring carries best: the whole ring for a fixed
    /// ring, a third of the cache cap for a self-sizing one (which keeps it
    /// at a size its cores' caches hold; `rrpc_ringbuf::proto::sizing`).
    pub fn preferred_message(&self) -> usize {
        self.preferred
    }

    /// One Acquire load: `false` only while the ring is known to be full.
    pub fn has_space(&self) -> bool {
        self.core.watch.has_space()
    }

    /// The ring's current size in bytes (a self-sizing ring's changes with
    /// its policy); `None` while another thread is in a step on the ring.
    pub fn ring_bytes(&self) -> Option<usize> {
        self.handle().ring_bytes()
    }

    /// The connection under the rings.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.core.src.conn
    }

    /// A handle that sends without waiting from any thread, beside this
    /// sender (and while it waits for room: it holds no lock then).
    pub fn handle(&self) -> SendHandle {
        SendHandle {
            core: self.core.clone(),
        }
    }

    /// Reserves `len` bytes (waiting for room), lets `fill` write them,
    /// commits and flushes; then sees that what is held back gets out.
    /// While it waits for room it holds no lock: the upkeep task and
    /// [`try_send_with`](Self::try_send_with) go on meanwhile.
    ///
    /// # Errors
    /// As [`AsyncSender::send`]. The connection is not failed here: the
    /// caller decides ([`fail_connection`]).
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is reserved before the room is there, and the
    /// message is written and committed in one synchronous step.
    pub async fn send_with(
        &mut self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<()> {
        let mut wait = CompletionWait::new();
        loop {
            if self.try_send_with(len, fill)? {
                return Ok(());
            }
            self.wait_room(&mut wait).await?;
        }
    }

    /// After a send found the ring full: waits until it may have room,
    /// holding no lock while it waits (the upkeep task and
    /// [`SendHandle::try_send_with`] go on meanwhile). `wait` is the
    /// completion wait of one send (start a [`CompletionWait::new`] per
    /// send).
    ///
    /// Room comes from the reader, which frees only what it could see:
    /// while work is held back behind a completion (the tail deferred by
    /// the elastic threshold, work beyond the send-queue budget), this
    /// polls completions itself, between yields, instead of waiting for a
    /// head that will not move (the #31 hang: a full ring behind a
    /// deferred tail).
    ///
    /// # Errors
    /// As [`send_with`](Self::send_with).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only waits and polls completions.
    pub async fn wait_room(&mut self, wait: &mut CompletionWait) -> Result<()> {
        let held_back = {
            let mut ring = self.core.lock();
            if ring.state().wants_completions() {
                ring.poll_completions()?;
            }
            ring.state()
                .wants_completions()
                .then(|| ring.state().tails_in_flight())
        };
        if let Some(in_flight) = held_back {
            wait.pause(
                &self.core.src.conn,
                self.core.src.completion_limit,
                in_flight,
            )
            .await
        } else {
            wait.reset();
            self.wait_space().await
        }
    }

    /// Waits until the reader pushed a head since the ring was found full
    /// (or the peer is gone). Holds no lock.
    async fn wait_space(&mut self) -> Result<()> {
        if self.mode != Mode::Event {
            return self.room.wait_ready().await;
        }
        let mut backoff = Duration::from_micros(20);
        while !self.core.src.ready() {
            self.core.src.conn.check_alive()?;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }

    /// As [`send_with`](Self::send_with) if it needs no wait: `Ok(false)`
    /// (nothing written, `fill` not called) when the ring is full
    /// ([`SendHandle::try_send_with`]).
    ///
    /// # Errors
    /// As [`send_with`](Self::send_with).
    pub fn try_send_with(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool> {
        self.core.try_send_with(len, fill)
    }

    /// The sender's state for diagnostics (completions, room, pointers).
    pub fn state(&self) -> String {
        let ring = match self.core.ring.try_lock() {
            Ok(ring) => format!(
                "wants_completions {} tails_in_flight {} has_space {} sender {:?}",
                ring.state().wants_completions(),
                ring.state().tails_in_flight(),
                self.core.watch.has_space(),
                ring.state()
            ),
            Err(_) => "sender in a step".to_string(),
        };
        format!(
            "upkeep task {} | {ring}",
            self.core.upkeep_started.load(Ordering::Acquire),
        )
    }
}

/// A [`ManagedSender`]'s synchronous side, shared: sends that need no
/// wait, from any thread (cloneable; [`ManagedSender::handle`]).
#[derive(Clone)]
pub struct SendHandle {
    core: Arc<Core>,
}

impl std::fmt::Debug for SendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHandle").finish_non_exhaustive()
    }
}

impl SendHandle {
    /// Reserves `len` bytes if the ring has room now, lets `fill` write
    /// them, commits and flushes: one short synchronous step under the
    /// ring's lock. `Ok(false)` (nothing written, `fill` not called) when
    /// the ring is full.
    ///
    /// # Errors
    /// As [`ManagedSender::send_with`].
    pub fn try_send_with(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool> {
        self.core.try_send_with(len, fill)
    }

    /// One Acquire load: `false` only while the ring is known to be full.
    pub fn has_space(&self) -> bool {
        self.core.watch.has_space()
    }

    /// As [`ManagedSender::ring_bytes`].
    pub fn ring_bytes(&self) -> Option<usize> {
        let ring = self.core.ring.try_lock().ok()?;
        Some(ring.state().geometry().ring_bytes())
    }

    /// The connection under the rings.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.core.src.conn
    }
}

impl Drop for ManagedSender {
    fn drop(&mut self) {
        // The upkeep task holds the core weakly: wake it to see it gone.
        self.core.kick.notify_one();
    }
}

/// A self-sizing ring's tick, run by the upkeep task.
struct Sizing {
    every: Duration,
    rx: Weak<RxSource>,
    idle: IdleReads,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, RingTx> {
        // A panic in a caller's `fill` poisons the lock; the ring is still
        // whole (an uncommitted reservation is abandoned on drop).
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn try_send_with(
        self: &Arc<Self>,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool> {
        if !self.watch.has_space() {
            return Ok(false);
        }
        let mut ring = self.lock();
        let mut slot = match ring.try_reserve(len) {
            Ok(slot) => slot,
            Err(rrpc_ringbuf::Error::WouldBlock) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        fill(&mut slot[..len]);
        slot.commit()?;
        self.sends.record();
        ring.flush()?;
        self.after_send(&mut ring);
        Ok(true)
    }

    /// Called with the ring locked, after a send: if the ring holds work
    /// back until send completions arrive (a NIC completes WRITEs after the
    /// post; shm inside it), the upkeep task polls them until everything is
    /// out, so the last message of a burst always reaches the peer even
    /// when the writer goes idle (RR-Compound's polling threads watch
    /// pending writes the same way, Algorithm 2).
    fn after_send(self: &Arc<Self>, ring: &mut RingTx) {
        // The last tail's completion is polled too, so that a failed one is
        // found and fails the connection instead of leaving its calls waiting:
        // on shm it is there already, and one poll here saves a wake-up; on a
        // NIC it comes later, and the upkeep task polls for it.
        if ring.state().tails_in_flight() > 0
            && !ring.state().wants_completions()
            && let Err(e) = ring.poll_completions()
        {
            fail_connection(&self.src.conn, &e);
            return;
        }
        if busy(ring) {
            self.start_upkeep(None);
            // A permit is kept if the task is busy: it looks again.
            self.kick.notify_one();
        }
    }

    /// Starts the connection's upkeep task once; `false` outside a tokio
    /// runtime (or when it runs already).
    fn start_upkeep(self: &Arc<Self>, sizing: Option<Sizing>) -> bool {
        if self.upkeep_started.swap(true, Ordering::AcqRel) {
            return false;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.upkeep_started.store(false, Ordering::Release);
            return false;
        };
        // Weak: the task never keeps the connection (its regions, its side
        // channel) alive past the sender.
        rt.spawn(upkeep(Arc::downgrade(self), self.kick.clone(), sizing));
        true
    }
}

/// The connection's one upkeep task: completion progress when kicked, and
/// a self-sizing ring's tick. Each step takes the ring's lock briefly; a
/// failure fails the connection.
async fn upkeep(core: Weak<Core>, kick: Arc<Notify>, sizing: Option<Sizing>) {
    let mut tick = sizing.as_ref().map(|s| {
        let mut t = tokio::time::interval(s.every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let ticked = tokio::select! {
            () = kick.notified() => false,
            _ = async {
                match tick.as_mut() {
                    Some(t) => t.tick().await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        let Some(core) = core.upgrade() else { return };
        if core.src.conn.is_gone() {
            return;
        }
        if ticked {
            if let Some(s) = &sizing
                && s.rx.upgrade().is_some_and(|rx| rx.ready())
            {
                s.idle.0.notify_one();
            }
            // A tick that finds a writer mid-step skips (the next one runs).
            let r = match core.ring.try_lock() {
                Ok(mut ring) => ring.maintain(Instant::now()).map(drop),
                Err(_) => Ok(()),
            };
            if let Err(e) = r {
                fail_connection(&core.src.conn, &e);
                return;
            }
        }
        // Progress, after a kick or a tick that left work held back.
        if !progress(&core).await {
            return;
        }
    }
}

/// Polls completions until nothing is held back; `false` when the
/// connection failed, or when no completion came for the poller's
/// `completion_limit`
/// with tails in flight, which fails it ([`Error::CompletionOverdue`]: the
/// device lost the WRITEs; without this, the task gave up quietly and the
/// calls waiting on the lost tail, on both ends, waited for ever).
async fn progress(core: &Core) -> bool {
    // The limit counts from the last change of the tails in flight (a
    // completion, or a new tail), not from the start: a connection kept
    // busy longer than it is still making progress, and a task that left
    // it would strand what is held back behind the next completion.
    let mut since = Instant::now();
    let mut in_flight = usize::MAX;
    let mut polls = 0u32;
    loop {
        {
            let mut ring = core.lock();
            let r = ring.poll_completions();
            let now_in_flight = ring.state().tails_in_flight();
            if now_in_flight != in_flight {
                in_flight = now_in_flight;
                since = Instant::now();
            }
            if let Err(e) = r {
                drop(ring);
                fail_connection(&core.src.conn, &e);
                return false;
            }
            if !busy(&ring) {
                return true;
            }
            let limit = core.src.completion_limit;
            if since.elapsed() > limit {
                drop(ring);
                let e = Error::CompletionOverdue(limit);
                tracing::debug!("rrpc: {e}; failing the connection");
                // Recorded first, so that whoever finds the connection
                // failed reads why (the queue pair keeps the first reason).
                core.src
                    .conn
                    .qp()
                    .fail(&rrpc_core::Error::PeerUnresponsive(e.to_string()));
                fail_connection(&core.src.conn, &e);
                return false;
            }
        }
        // A NIC completes a WRITE in microseconds: yield first, then
        // back off to the timer (soft-RoCE under emulation is slower).
        polls += 1;
        if polls < 64 {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
}

/// Whether a sender still needs its send completions polled: work held
/// back until they arrive, or tails whose completion (and so whose
/// failure, if they failed) is not known yet.
fn busy(ring: &RingTx) -> bool {
    ring.state().wants_completions() || ring.state().tails_in_flight() > 0
}

/// Fails `conn` at once: the goodbye
/// and the side channel's shutdown tell the peer, on a blocking thread
/// when called on a tokio runtime. Without it, a failed completion found
/// by the upkeep task left calls waiting forever for replies to requests
/// that never left (seen with the tonic layer under the fault injector).
pub fn fail_connection(conn: &Arc<Connection>, e: &dyn std::fmt::Display) {
    if conn.is_gone() {
        return;
    }
    tracing::debug!("rrpc: send failed, closing the connection: {e}");
    let conn = conn.clone();
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(move || conn.close());
        }
        Err(_) => conn.close(),
    }
}
