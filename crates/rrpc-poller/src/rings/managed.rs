//! A sender whose upkeep the poller runs: completion progress and the ring's
//! sizing tick, one owner each ([`AsyncConn::split_managed`]).
//!
//! A ring holds work back until send completions are polled (a tail WRITE
//! deferred by the elastic threshold, work beyond the send-queue budget),
//! and a self-sizing ring shrinks only from a tick of its policy
//! (`rrpc_ringbuf` docs, "Rings that size themselves"). A writer that goes
//! idle does neither, so somebody else must: here, after each send that
//! leaves work held back, a progress task polls completions until nothing
//! is; and for a self-sizing ring one sizing task ticks the policy every
//! `shrink_after / 2` and, on the same tick, tells the receiving side's
//! owner when unread data sits in its ring ([`IdleReads`]): an idle reader
//! must still read its peer's resize markers, or the peer's ring never
//! shrinks.
//!
//! The sender is shared between its user and these tasks behind an async
//! mutex: the user's sends hold it (across a wait for room), the tasks take
//! it briefly. A failure the tasks find fails the connection
//! ([`ManagedSender::fail_connection`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rrpc_core::conn::Connection;
use rrpc_ringbuf::TxWatch;

use super::{AsyncConn, AsyncReceiver, AsyncSender, RxSource};
use crate::error::Result;
use crate::source::Readiness;

/// How long the progress task keeps polling with no completion coming
/// before it gives up (the connection is then broken anyway).
const PROGRESS_LIMIT: Duration = Duration::from_secs(30);

/// The sending half of [`AsyncConn::split_managed`]: an [`AsyncSender`]
/// whose completion progress and ring sizing the poller's tasks run.
pub struct ManagedSender {
    /// Shared with the progress and sizing tasks.
    tx: Arc<tokio::sync::Mutex<AsyncSender>>,
    watch: TxWatch,
    max: usize,
    preferred: usize,
    /// A progress task is running.
    progressing: Arc<AtomicBool>,
    conn: Arc<Connection>,
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
pub struct IdleReads(Arc<tokio::sync::Notify>);

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
    /// finds unread data. The tasks run on the current tokio runtime and
    /// hold the connection only weakly: they end with the sender.
    ///
    /// # Errors
    /// As [`split`](Self::split).
    pub fn split_managed(self) -> Result<(ManagedSender, AsyncReceiver)> {
        let (tx, mut rx) = self.split()?;
        let ring = tx.tx.config();
        let max = ring.max_message();
        // A fixed ring carries whole-ring messages best (the papers'
        // setting); a self-sizing one, a third of its cache cap.
        let sizing = ring.self_sizing();
        let preferred = if sizing {
            (ring.cache_ring_size() / 3).min(max)
        } else {
            max
        };
        let every = ring.shrink_after() / 2;
        let sender = ManagedSender {
            watch: tx.tx.watch(),
            conn: tx.src.conn.clone(),
            tx: Arc::new(tokio::sync::Mutex::new(tx)),
            max,
            preferred,
            progressing: Arc::new(AtomicBool::new(false)),
        };
        if sizing {
            let idle = IdleReads(Arc::new(tokio::sync::Notify::new()));
            if sender.spawn_sizing(every, Arc::downgrade(&rx.src), idle.clone()) {
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
        self.watch.has_space()
    }

    /// The ring's current size in bytes (a self-sizing ring's changes with
    /// its policy); `None` while a send or a task holds the sender.
    pub fn ring_bytes(&self) -> Option<usize> {
        let tx = self.tx.try_lock().ok()?;
        Some(tx.ring().state().geometry().ring_bytes())
    }

    /// The connection under the rings.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// Reserves `len` bytes (waiting for room), lets `fill` write them,
    /// commits and flushes; then sees that what is held back gets out.
    ///
    /// # Errors
    /// As [`AsyncSender::send`]. The connection is not failed here: the
    /// caller decides ([`fail_connection`](Self::fail_connection)).
    ///
    /// # Cancel safety
    /// Cancel-safe until the room is there: nothing is reserved before.
    pub async fn send_with(
        &mut self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<()> {
        let mut tx = self.tx.lock().await;
        // Zero-copy: the caller writes straight into the reserved slot.
        let mut slot = tx.reserve(len).await?;
        fill(&mut slot[..len]);
        slot.commit()?;
        tx.flush()?;
        self.ensure_progress(&mut tx);
        Ok(())
    }

    /// As [`send_with`](Self::send_with) if it needs no wait: `Ok(false)`
    /// (nothing written, `fill` not called) when the ring is full or a
    /// task holds the sender.
    ///
    /// # Errors
    /// As [`send_with`](Self::send_with).
    pub fn try_send_with(
        &mut self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool> {
        if !self.watch.has_space() {
            return Ok(false);
        }
        // Held only by a task, briefly: then take the slow path.
        let Ok(mut tx) = self.tx.try_lock() else {
            return Ok(false);
        };
        let Some(mut slot) = tx.try_reserve(len)? else {
            return Ok(false);
        };
        fill(&mut slot[..len]);
        slot.commit()?;
        tx.flush()?;
        self.ensure_progress(&mut tx);
        Ok(true)
    }

    /// Fails the whole connection, at once: the goodbye and the side
    /// channel's shutdown tell the peer, and the shutdown wakes our own
    /// receiver (its liveness watch sees the closed socket), so no call
    /// waits on a connection whose queue pair failed. The goodbye is a
    /// blocking send, bounded at 1 s: never on a tokio worker.
    pub fn fail_connection(&self, e: &dyn std::fmt::Display) {
        fail_connection(&self.conn, e);
    }

    /// The sender's state for diagnostics (completions, room, pointers).
    pub fn state(&self) -> String {
        let ring = match self.tx.try_lock() {
            Ok(tx) => format!(
                "wants_completions {} tails_in_flight {} has_space {} sender {:?}",
                tx.wants_completions(),
                tx.tails_in_flight(),
                self.watch.has_space(),
                tx.ring().state()
            ),
            Err(_) => "sender in use".to_string(),
        };
        format!(
            "progress task {} | {ring}",
            self.progressing.load(Ordering::Acquire),
        )
    }

    /// Runs the ring's sizing policy every `every` for as long as the
    /// sender lives (an idle ring shrinks only from here), and on each tick
    /// wakes `idle` when the receive ring holds unread data. A tick that
    /// finds the sender in use skips its policy (the next one runs); a
    /// failure fails the connection. `false` outside a tokio runtime.
    fn spawn_sizing(&self, every: Duration, rx: Weak<RxSource>, idle: IdleReads) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        // Weak all: the task never keeps the connection (its regions, its
        // side channel) alive past the sender.
        let (weak, weak_conn) = (Arc::downgrade(&self.tx), Arc::downgrade(&self.conn));
        rt.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Some(tx), Some(conn)) = (weak.upgrade(), weak_conn.upgrade()) else {
                    return;
                };
                if conn.is_gone() {
                    return;
                }
                if rx.upgrade().is_some_and(|rx| rx.ready()) {
                    idle.0.notify_one();
                }
                let Ok(mut tx) = tx.try_lock() else { continue };
                if let Err(e) = tx.maintain(Instant::now()) {
                    fail_connection(&conn, &e);
                    return;
                }
            }
        });
        true
    }

    /// Called with the sender locked, after a send: if the ring holds work
    /// back until send completions arrive (a NIC completes WRITEs after the
    /// post; shm inside it), a task polls them until everything is out, so
    /// the last message of a burst always reaches the peer even when the
    /// writer goes idle (RR-Compound's polling threads watch pending writes
    /// the same way, Algorithm 2).
    ///
    /// The flag is set and cleared with the sender locked, so a send never
    /// misses a task that is about to stop.
    fn ensure_progress(&self, tx: &mut AsyncSender) {
        // The last tail's completion is polled too, so that a failed one is
        // found and fails the connection instead of leaving its calls waiting:
        // on shm it is there already, and one poll here saves a task; on a NIC
        // it comes later, and the task polls for it.
        if tx.tails_in_flight() > 0
            && !tx.wants_completions()
            && let Err(e) = tx.poll_completions()
        {
            fail_connection(&self.conn, &e);
            return;
        }
        if !busy(tx) || self.progressing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.progressing.store(false, Ordering::Release);
            return;
        };
        let (shared, flag, conn) = (self.tx.clone(), self.progressing.clone(), self.conn.clone());
        rt.spawn(async move {
            // The limit counts from the last change of the tails in flight
            // (a completion, or a new tail), not from the start: a
            // connection kept busy longer than it is still making progress,
            // and a task that left it would strand what is held back behind
            // the next completion.
            let mut since = Instant::now();
            let mut in_flight = usize::MAX;
            let mut polls = 0u32;
            loop {
                {
                    let mut tx = shared.lock().await;
                    let r = tx.poll_completions();
                    if tx.tails_in_flight() != in_flight {
                        in_flight = tx.tails_in_flight();
                        since = Instant::now();
                    }
                    if r.is_err() || !busy(&tx) || since.elapsed() > PROGRESS_LIMIT {
                        if let Err(e) = r {
                            fail_connection(&conn, &e);
                        }
                        flag.store(false, Ordering::Release);
                        return;
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
        });
    }
}

/// Whether a sender still needs its send completions polled: work held
/// back until they arrive, or tails whose completion (and so whose
/// failure, if they failed) is not known yet.
fn busy(tx: &AsyncSender) -> bool {
    tx.wants_completions() || tx.tails_in_flight() > 0
}

/// [`ManagedSender::fail_connection`]. Without it, a failed completion
/// found by the progress task left calls waiting forever for replies to
/// requests that never left (seen with the tonic layer under the fault
/// injector).
fn fail_connection(conn: &Arc<Connection>, e: &dyn std::fmt::Display) {
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
