//! The connection: how whole messages get from one end to the other, over
//! rings or memory, and what a connection is made of and negotiates first.
//! Its files, bottom up (each imports only those before it):
//!
//! * [`seal`] (feature `tls`): ring encryption, sans-IO;
//! * this file: the connection's two halves, its send side [`Link`]
//!   ([below](#the-send-side)) and its receive side [`MsgRx`], as one
//!   [`Pipe`], the one interface both data paths use
//!   ([below](#the-message-pipe)); [`seal::pipe`] seals a pipe;
//! * [`negotiate`]: the path negotiation (fast or HTTP/2);
//!   [`bundle`]: what a connection needs, made ahead (KRCore's pool);
//!   [`sharing`]: shared queue pairs; [`spare`]: connections dialed ahead;
//! * [`rings`]: the pipe over rings (`shm://`, `rdma://`), which also
//!   uses the [`RrpcContext`](crate::RrpcContext) that holds the pools and
//!   caches above.
//!
//! # The send side
//!
//! One owner of the ring's sending state per connection, and the one place a failure is recorded (issue #56, in the
//! shape of quinn's `ConnectionRef` and rtrb's one owner per index).
//!
//! A [`Link`] is what every writer of a connection holds (the fast path's
//! frame writer and its callers, the HTTP/2 path's byte stream, the TLS
//! ticket exchange); clones share one connection. Under it, one of:
//!
//! * **rings** (`shm://`, `rdma://`): the ring's sending state behind the
//!   poller's one `std` mutex (`rrpc_poller::rings::SendHandle`), with its
//!   completion progress and sizing tick run by the poller;
//! * **memory** (`inproc://`, tests): a channel of heap buffers standing in
//!   for ring slots, with ring-sized byte credit for back-pressure. On
//!   `inproc://` the client's side polls the server's side of the
//!   connection in place after each message it sends ([`InPlace`]), so the
//!   message is handled where it lands, with no task woken for it.
//!
//! # A send
//! [`Link::try_send_with`]: one short synchronous step under the sink's
//! lock: reserve `len` bytes, let the caller's `fill` write its frames
//! straight into the slot, seal them in place (sealed rings: the sequence
//! numbers then follow the publication order), commit, publish, release.
//! No future, no task hop, no dyn call on rings. `Ok(false)` when the ring
//! is full, or when writers wait in line for room (so small frames cannot
//! starve a large one).
//!
//! [`Link::send_with`] tries that first. If the ring is full it joins the
//! line (first come, first served) and, once at its head, waits for room
//! holding no lock: the ring's room waiter (`ManagedSender::wait_room`,
//! the poller's registration) is taken out of the line while it waits, so
//! the synchronous steps, the poller's upkeep task and the reader go on
//! meanwhile. While work is held back behind a send completion (a tail
//! deferred by the elastic threshold: the #31 hang), the waiting writer
//! polls completions itself, and the poller's upkeep task does too.
//!
//! # Failure
//! A send that fails on the ring (the peer corrupted it, a completion
//! failed, the peer is gone) fails the connection here, once: the first
//! error is kept typed and shared ([`Error::Failed`]), a ring connection
//! is closed (its goodbye tells the peer, its side channel's shutdown
//! wakes our own receiver), every writer in line is woken to see it, and
//! [`Link::failed`] completes for the connection's owner. Only a message
//! too large for the ring is a per-call error.
//!
//! # The message pipe
//!
//! The one thing rrpc-tonic needs from the layers below.
//!
//! A pipe moves whole messages in order in each direction, with back-pressure
//! when the peer's ring is full (a sender waits; nothing is dropped) and a bounded message
//! size (the ring's slot limit). Both paths are built on it: the fast path puts
//! frames in the messages, the HTTP/2 path puts a byte stream in them.
//!
//! The sending half is the connection's [`Link`] (above): one owner of the
//! ring's sending state, shaped after the ring's zero-copy API (RR-Compound
//! §IV-F): [`Link::send_with`] reserves `len` bytes in the send ring, hands
//! the slot to a closure that encodes straight into it, then publishes. The
//! receiver hands the borrowed slot to a closure ([`MsgRx::poll_recv_with`])
//! and releases it when the closure returns: no intermediate buffer on either
//! side. The receive is a poll function its owner polls in place (the
//! fast path's client demux and server reader): no future per message, the
//! wait's state kept in the receiver between polls.
//!
//! Implementations: rings ([`rings`]), and [`mem_pair`] (in-process; each message is one heap
//! buffer standing in for a ring slot, with ring-sized byte credit for
//! back-pressure).

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use rrpc_core::conn::Connection;
use rrpc_poller::rings::{CompletionWait, ManagedSender, SendHandle};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

use crate::Error;
#[cfg(feature = "tls")]
use crate::conn::seal::{Sealer, TAG_LEN};

pub(crate) mod bundle;
pub(crate) mod negotiate;
pub(crate) mod rings;
#[cfg(feature = "tls")]
pub(crate) mod seal;
pub(crate) mod sharing;
pub(crate) mod spare;

/// A connection's send side, shared by its writers (module docs).
#[derive(Clone)]
pub(crate) struct Link {
    shared: Arc<Shared>,
    /// Sealed rings: every message sealed in place in its slot.
    #[cfg(feature = "tls")]
    seal: Option<Arc<Sealer>>,
}

/// What the clones of a [`Link`] share.
struct Shared {
    sink: Sink,
    /// Writers waiting for room, and the sink's room waiter.
    line: Mutex<Line>,
    /// Writers in [`Line::waiting`]: while any wait, the synchronous path
    /// writes nothing (changed under `line`).
    queued: AtomicUsize,
    fail: Fail,
    /// `inproc://`'s client side: the server's side of the connection,
    /// polled in place after each message this link sends ([`InPlace`]).
    peer: Option<Arc<InPlace>>,
    /// Largest message the sink carries, in bytes.
    max: usize,
    /// Largest message it carries best ([`Link::preferred_message`]).
    preferred: usize,
    /// Tests: every send fails as a ring the peer corrupted does.
    #[cfg(test)]
    broken: Arc<std::sync::atomic::AtomicBool>,
    /// Tests: send steps tried.
    #[cfg(test)]
    steps: AtomicUsize,
}

/// Where the messages go.
enum Sink {
    /// The ring's sending state, behind the poller's one lock.
    Ring {
        tx: SendHandle,
        conn: Arc<Connection>,
    },
    Mem(MemSink),
}

/// What a writer at the head of the line waits on for room.
enum Room {
    /// Boxed: it holds the poller's registration (~400 bytes), moved in
    /// and out of the line by each wait.
    Ring(Box<ManagedSender>),
    Mem(Arc<Semaphore>),
}

/// The writers waiting for room, first come first served.
struct Line {
    next: u64,
    /// Tickets in order, each with the waker of a writer not at the head.
    waiting: VecDeque<(u64, Option<Waker>)>,
    /// `None` while the head waits on it (outside the lock).
    room: Option<Room>,
}

/// Set once a send failed: the connection is unusable.
#[derive(Debug, Default)]
struct Fail {
    token: CancellationToken,
    /// The first error, typed, shared by every call and send it fails.
    first: OnceLock<Arc<Error>>,
}

/// The in-memory sink: one heap buffer per message, ring-sized byte
/// credit (taken by the sender, given back by the reader).
struct MemSink {
    /// Locked for the send step, so that messages go out in the order
    /// their step ran (as a ring's lock orders its slots).
    tx: Mutex<mpsc::UnboundedSender<Bytes>>,
    credit: Arc<Semaphore>,
    /// Buffers the reader is done with, for the next messages.
    spare: Arc<Spare>,
}

/// An in-memory pipe's message buffers, handed back by the reader once it
/// is done with a message and reused by the sender: no allocation per
/// message once a few are there (ring slots are reused the same way).
#[derive(Debug, Default)]
struct Spare(Mutex<Vec<BytesMut>>);

impl Spare {
    /// Buffers kept at most.
    const KEPT: usize = 8;
    /// The largest buffer kept, in bytes: a large message's buffer goes.
    const LARGEST: usize = 64 << 10;

    /// A zeroed buffer of `len` bytes, a spare one if one is large enough.
    fn take(&self, len: usize) -> BytesMut {
        let spare = {
            let mut v = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match v.last() {
                Some(b) if b.capacity() >= len => v.pop(),
                _ => None,
            }
        };
        match spare {
            Some(mut b) => {
                b.clear();
                b.resize(len, 0);
                b
            }
            None => BytesMut::zeroed(len),
        }
    }

    /// Keeps `msg`'s buffer if nobody else holds it and it is not large.
    fn give(&self, msg: Bytes) {
        if msg.len() > Self::LARGEST {
            return;
        }
        if let Ok(b) = msg.try_into_mut() {
            let mut v = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if v.len() < Self::KEPT && b.capacity() <= Self::LARGEST {
                v.push(b);
            }
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("tag", &self.tag_len())
            .field("failure", &self.shared.fail.first.get())
            .field("state", &self.state())
            .finish()
    }
}

impl Link {
    fn new(
        sink: Sink,
        room: Room,
        max: usize,
        preferred: usize,
        peer: Option<Arc<InPlace>>,
    ) -> Self {
        Link {
            shared: Arc::new(Shared {
                sink,
                line: Mutex::new(Line {
                    next: 0,
                    waiting: VecDeque::new(),
                    room: Some(room),
                }),
                queued: AtomicUsize::new(0),
                fail: Fail::default(),
                peer,
                max,
                preferred: preferred.clamp(1, max.max(1)),
                #[cfg(test)]
                broken: Arc::default(),
                #[cfg(test)]
                steps: AtomicUsize::new(0),
            }),
            #[cfg(feature = "tls")]
            seal: None,
        }
    }

    /// A ring connection's send side: `tx`, the poller's managed sender of
    /// `conn`'s ring.
    pub(crate) fn ring(tx: ManagedSender, conn: Arc<Connection>) -> Self {
        let (max, preferred) = (tx.max_message(), tx.preferred_message());
        let sink = Sink::Ring {
            tx: tx.handle(),
            conn,
        };
        Self::new(sink, Room::Ring(Box::new(tx)), max, preferred, None)
    }

    /// An in-memory send side of `ring` bytes of credit, and the channel
    /// and credit its reader takes messages from and gives credit back to.
    /// With `peer`, the receiving side's connection is polled in place
    /// after each message sent ([`InPlace`]).
    fn mem(
        ring: usize,
        peer: Option<Arc<InPlace>>,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<Bytes>,
        Arc<Semaphore>,
        Arc<Spare>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let credit = Arc::new(Semaphore::new(ring));
        let spare = Arc::new(Spare::default());
        let sink = Sink::Mem(MemSink {
            tx: Mutex::new(tx),
            credit: credit.clone(),
            spare: spare.clone(),
        });
        let link = Self::new(sink, Room::Mem(credit.clone()), ring, ring, peer);
        (link, rx, credit, spare)
    }

    /// This link with every message sealed by `sealer` (the tag counts
    /// against the ring's limit). Before any message went out.
    #[cfg(feature = "tls")]
    pub(crate) fn sealed(mut self, sealer: Sealer) -> Self {
        self.seal = Some(Arc::new(sealer));
        self
    }

    /// The bytes a seal adds to each message: 0 unless sealed.
    fn tag_len(&self) -> usize {
        #[cfg(feature = "tls")]
        if self.seal.is_some() {
            return TAG_LEN;
        }
        0
    }

    /// Largest message this link carries, in bytes (a sealed link's is the
    /// ring's less the tag).
    pub(crate) fn max_message(&self) -> usize {
        self.shared.max.saturating_sub(self.tag_len())
    }

    /// Largest message the link carries best, at most
    /// [`max_message`](Self::max_message): rings, a third of a self-sizing
    /// ring's cache cap (which keeps it at a size its cores' caches hold).
    pub(crate) fn preferred_message(&self) -> usize {
        let max = self.max_message();
        self.shared
            .preferred
            .saturating_sub(self.tag_len())
            .clamp(1, max.max(1))
    }

    /// Completes once a send failed and the connection must be closed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub(crate) fn failed(&self) -> WaitForCancellationFuture<'_> {
        self.shared.fail.token.cancelled()
    }

    /// [`failed`](Self::failed) as a future that owns its token (a loop
    /// that races it on every message keeps one, pinned).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub(crate) fn failed_owned(&self) -> WaitForCancellationFutureOwned {
        self.shared.fail.token.clone().cancelled_owned()
    }

    /// Why the connection failed, once it did: the first error, shared
    /// ([`Error::Failed`]; [`Error::is_peer_gone`] when the peer left).
    pub(crate) fn failure(&self) -> Option<Error> {
        self.shared
            .fail
            .first
            .get()
            .map(|e| Error::Failed(e.clone()))
    }

    /// Tests: the switch that makes every send fail as a ring the peer
    /// corrupted does (set from the start if `broken`).
    #[cfg(test)]
    pub(crate) fn breaker(&self, broken: bool) -> Arc<std::sync::atomic::AtomicBool> {
        self.shared.broken.store(broken, Ordering::SeqCst);
        self.shared.broken.clone()
    }

    /// Reserves `len` bytes if the ring has room now and nobody waits in
    /// line, lets `fill` write all of them, seals, commits and publishes:
    /// one short synchronous step. `Ok(false)` (nothing written, `fill` not
    /// called) otherwise.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] over [`max_message`](Self::max_message);
    /// [`Error::Failed`] once the connection failed (this send may be
    /// what failed it).
    pub(crate) fn try_send_with(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool, Error> {
        self.admit(len)?;
        if self.shared.queued.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        let sent = self.step(len, fill)?;
        if sent {
            self.peer_turn();
        }
        Ok(sent)
    }

    /// `inproc://`'s client side: the server's side of the connection
    /// takes its turn now, on this thread, where the message landed
    /// ([`InPlace::help`]); no other task is woken for it. Every lock of
    /// this link is released by now.
    fn peer_turn(&self) {
        if let Some(peer) = &self.shared.peer {
            peer.help();
        }
    }

    /// [`try_send_with`](Self::try_send_with), waiting in line for room
    /// when the ring is full (module docs). Holds no lock while it waits.
    ///
    /// # Errors
    /// As [`try_send_with`](Self::try_send_with).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is reserved before there is room, and the
    /// message is written and published in one synchronous step; a writer
    /// dropped in line leaves it (the next one moves up).
    pub(crate) async fn send_with(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<(), Error> {
        if self.try_send_with(len, fill)? {
            return Ok(());
        }
        // Boxed: the wait's state (the poller's registration wait) is
        // large, and inline it made every future that holds a send (a
        // call's, moved and boxed per call) larger: ~270 instructions of
        // `memcpy` a call under callgrind.
        Box::pin(self.wait_and_send(len, fill)).await
    }

    /// [`send_with`](Self::send_with) after the ring was found full.
    async fn wait_and_send(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<(), Error> {
        let place = InLine::join(&self.shared);
        place.turn().await;
        let mut wait = CompletionWait::new();
        loop {
            self.refuse()?;
            if self.step(len, fill)? {
                drop(place);
                self.peer_turn();
                return Ok(());
            }
            // The room a message takes: a sealed one's tag too.
            let r = self.wait_room(len + self.tag_len(), &mut wait).await;
            self.shared.check(r)?;
        }
    }

    /// The head of the line waits for room: the room waiter taken out of
    /// the line (no lock held), until room may have come.
    async fn wait_room(&self, wire: usize, wait: &mut CompletionWait) -> Result<(), Error> {
        let mut held = Held::take(&self.shared);
        let Some(room) = held.room.as_mut() else {
            // Cannot happen (only the head waits); never spin on it.
            tokio::task::yield_now().await;
            return Ok(());
        };
        // No race with the connection's failure here: while a writer waits
        // in line nobody else reaches the sink (the synchronous path stays
        // out), so a failure comes to the head through its own wait (the
        // peer gone, a failed completion) or its own next step.
        match room {
            Room::Ring(tx) => tx.wait_room(wait).await.map_err(Error::from),
            Room::Mem(credit) => {
                let n = u32::try_from(wire.max(1)).unwrap_or(u32::MAX);
                // Room is there once the credit is: give it back at once
                // (the step takes it with the message).
                drop(credit.acquire_many(n).await.map_err(|_| Error::PeerGone)?);
                Ok(())
            }
        }
    }

    fn admit(&self, len: usize) -> Result<(), Error> {
        self.refuse()?;
        let max = self.max_message();
        if len > max {
            return Err(Error::MessageTooLarge { len, max });
        }
        Ok(())
    }

    fn refuse(&self) -> Result<(), Error> {
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One synchronous send step (the caller checked the size).
    fn step(&self, len: usize, fill: &mut (dyn FnMut(&mut [u8]) + Send)) -> Result<bool, Error> {
        #[cfg(test)]
        self.shared.steps.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        if self.shared.broken.load(Ordering::SeqCst) {
            return self.shared.check(Err(testing::corrupted()));
        }
        #[cfg(feature = "tls")]
        if let Some(sealer) = &self.seal {
            // Sealed in place in the slot, inside the sink's step (its
            // lock is held): sequence numbers in publication order.
            let mut sealed = |slot: &mut [u8]| {
                fill(&mut slot[..len]);
                sealer.seal(slot);
            };
            let r = self.shared.sink.try_send(len + TAG_LEN, &mut sealed);
            return self.shared.check(r);
        }
        let r = self.shared.sink.try_send(len, fill);
        self.shared.check(r)
    }

    /// A one-line account of the send side for diagnostics (a hung call's
    /// dump). Never waits.
    pub(crate) fn state(&self) -> String {
        let s = &self.shared;
        let line = match s.line.try_lock() {
            Ok(line) => {
                let room = match &line.room {
                    None => "waited on by the head".to_string(),
                    Some(Room::Ring(tx)) => tx.state(),
                    Some(Room::Mem(c)) => format!("{} bytes of credit", c.available_permits()),
                };
                format!("{} in line | {room}", line.waiting.len())
            }
            Err(_) => "line locked".to_string(),
        };
        match &s.sink {
            Sink::Ring { conn, .. } => format!(
                "peer gone {} | qp failure {:?} | {line}",
                conn.is_gone(),
                conn.qp().failure()
            ),
            Sink::Mem(_) => format!("in memory | {line}"),
        }
    }
}

impl Sink {
    fn try_send(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool, Error> {
        match self {
            Sink::Ring { tx, .. } => tx.try_send_with(len, fill).map_err(Error::from),
            Sink::Mem(m) => m.try_send(len, fill),
        }
    }
}

impl MemSink {
    fn try_send(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool, Error> {
        let permits = u32::try_from(len.max(1)).map_err(|_| Error::MessageTooLarge {
            len,
            max: u32::MAX as usize,
        })?;
        let tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        match self.credit.try_acquire_many(permits) {
            Ok(p) => p.forget(),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::PeerGone),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Ok(false),
        }
        let mut slot = self.spare.take(len);
        fill(&mut slot);
        tx.send(slot.freeze()).map_err(|_| Error::PeerGone)?;
        Ok(true)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Line> {
        // Only short steps run under it, and none that can panic; a
        // poisoned line is still whole.
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection's one failure recorder: a send error other than a
    /// too-large message fails the connection.
    fn check<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        match r {
            Err(e @ Error::MessageTooLarge { .. }) => Err(e),
            Err(Error::Failed(first)) => Err(Error::Failed(first)),
            Err(e) => Err(self.fail(e)),
            ok => ok,
        }
    }

    /// Records `e` as the connection's failure (the first one stays),
    /// closes a ring connection, wakes every writer in line and the
    /// connection's owner; returns the failure every send now gets.
    fn fail(&self, e: Error) -> Error {
        let e = match &self.sink {
            // The cause first: the close below fails the queue pair too.
            Sink::Ring { conn, .. } if e.is_peer_gone() => gone_cause(conn).map_or(e, Error::from),
            _ => e,
        };
        let mut first = Arc::new(e);
        match self.fail.first.set(first.clone()) {
            Ok(()) => {
                if first.is_peer_gone() {
                    tracing::debug!("rrpc: send failed, peer gone: closing the connection");
                } else {
                    tracing::warn!("rrpc: send failed, closing the connection: {first}");
                }
                if let Sink::Ring { conn, .. } = &self.sink {
                    rrpc_poller::rings::fail_connection(conn, &first);
                }
                self.fail.token.cancel();
                let wakers: Vec<Waker> = self
                    .lock()
                    .waiting
                    .iter_mut()
                    .filter_map(|(_, w)| w.take())
                    .collect();
                wakers.into_iter().for_each(Waker::wake);
            }
            Err(_) => first = self.fail.first.get().expect("set").clone(),
        }
        Error::Failed(first)
    }
}

/// A writer's place in the [`Line`]; leaves it on drop (also when that
/// writer is cancelled), waking the writer behind it.
struct InLine<'a> {
    shared: &'a Shared,
    ticket: u64,
}

impl<'a> InLine<'a> {
    fn join(shared: &'a Shared) -> Self {
        let mut line = shared.lock();
        let ticket = line.next;
        line.next += 1;
        line.waiting.push_back((ticket, None));
        shared.queued.store(line.waiting.len(), Ordering::Release);
        InLine { shared, ticket }
    }

    /// Completes once this writer is at the head of the line (or the
    /// connection failed). Cancel safe.
    async fn turn(&self) {
        poll_fn(|cx| {
            if self.shared.fail.first.get().is_some() {
                return Poll::Ready(());
            }
            let mut line = self.shared.lock();
            if line.waiting.front().is_some_and(|(t, _)| *t == self.ticket) {
                return Poll::Ready(());
            }
            if let Some((_, w)) = line.waiting.iter_mut().find(|(t, _)| *t == self.ticket) {
                *w = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        let mut line = self.shared.lock();
        line.waiting.retain(|(t, _)| *t != self.ticket);
        self.shared
            .queued
            .store(line.waiting.len(), Ordering::Release);
        let next = line.waiting.front_mut().and_then(|(_, w)| w.take());
        drop(line);
        if let Some(w) = next {
            w.wake();
        }
    }
}

/// The room waiter, taken out of the line by its head while it waits;
/// put back on drop.
struct Held<'a> {
    shared: &'a Shared,
    room: Option<Room>,
}

impl<'a> Held<'a> {
    fn take(shared: &'a Shared) -> Self {
        let room = shared.lock().room.take();
        Held { shared, room }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(room) = self.room.take() {
            self.shared.lock().room = Some(room);
        }
    }
}

/// Why the peer of a connection found gone is gone, when it is not an
/// orderly close: its host went silent (the side channel's keep-alive ran
/// out) or the device gave up retransmitting to it (a failed completion,
/// recorded on the queue pair by the ring that polled it). `None` for a
/// close or a goodbye.
///
/// A wait can end as soon as the side channel's fd fires, before anyone
/// read it: it is read here (once, without blocking), so that a keep-alive
/// timeout is told from a close (whoever reads first records the verdict).
/// Its verdict first: the queue pair may have failed for a reason that
/// says less.
pub(crate) fn gone_cause(conn: &Connection) -> Option<rrpc_core::Error> {
    let _ = conn.check_alive();
    let why = match conn.gone_error() {
        e @ rrpc_core::Error::PeerUnresponsive(_) => Some(e),
        _ => conn.qp().failure(),
    };
    match why {
        // A lane opened ahead that its server refused (rrpc-core
        // `conn::mux`): its calls read the server's reason.
        Some(
            e @ (rrpc_core::Error::PeerUnresponsive(_)
            | rrpc_core::Error::CompletionError { .. }
            | rrpc_core::Error::Rejected(_)),
        ) => Some(e),
        _ if conn.was_reset() => Some(rrpc_core::Error::PeerUnresponsive(
            "it reset the side channel (ECONNRESET) without a goodbye: its process aborted, or \
             its host stopped hearing from this one (its keep-alive gave up: the link may be cut \
             in one direction)"
                .to_string(),
        )),
        _ => None,
    }
}

/// A boxed, sendable future.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The receiving half of a message pipe.
///
/// Poll-based: its owner (the fast path's client demux and server reader)
/// polls the receive in place, with no future of its own per message; the
/// wait's state stays in the receiver between polls.
pub(crate) trait MsgRx: Send + 'static {
    /// Polls for the next message and hands it, borrowed, to `f` (called
    /// once, just before `Ready(Ok(true))`); the message is released when
    /// `f` returns.
    ///
    /// `Ready(Ok(false))` when the peer closed the pipe; `Pending` with the
    /// task's waker registered.
    ///
    /// # Errors
    /// The connection failed (the peer corrupted the ring, a completion
    /// failed, the peer went away uncleanly; [`Error::is_peer_gone`]).
    ///
    /// # Cancel safety
    /// No message is consumed before `Ready`: an owner that stops polling
    /// (a `select!` that took another branch) loses nothing, and a wait
    /// left mid-way resumes at the next poll.
    fn poll_recv_with(
        &mut self,
        cx: &mut Context<'_>,
        f: &mut dyn FnMut(&[u8]),
    ) -> Poll<Result<bool, Error>>;

    /// What carries this pipe, read from its live connection (rings: the
    /// queue pair's provider, device and peer). `None`: not a ring pipe.
    fn carrier(&self) -> Option<rrpc_core::QpCarrier> {
        None
    }

    /// A future that completes when the transport sees the peer leave,
    /// without receiving (rings: the side channel closed). Messages the
    /// peer sent before leaving may still be waiting for [`poll_recv_with`].
    /// `None`: the transport cannot tell (the end shows in `poll_recv_with`).
    ///
    /// [`poll_recv_with`]: MsgRx::poll_recv_with
    fn peer_gone(&self) -> Option<BoxFut<'static, ()>> {
        None
    }

    /// Wakes an owner that reads only on demand when, idle, it has data to
    /// read all the same (rings: the poller's sizing tick found unread data
    /// in a self-sizing ring, such as the peer's resize marker, which must
    /// be read before the peer's ring can shrink). `None`: nothing to read
    /// while idle.
    fn idle_reads(&self) -> Option<rrpc_poller::rings::IdleReads> {
        None
    }
}

impl dyn MsgRx {
    /// Waits for the next message and hands it, borrowed, to `f`:
    /// [`MsgRx::poll_recv_with`] polled to the end (for the handshake and
    /// the HTTP/2 path's reader task, which await one message at a time).
    ///
    /// Returns `Ok(false)` when the peer closed the pipe.
    ///
    /// # Errors
    /// As [`MsgRx::poll_recv_with`].
    ///
    /// # Cancel safety
    /// Cancel safe: no message is consumed until it completes; a wait it
    /// left mid-way resumes at the next receive (as with
    /// [`MsgRx::poll_recv_with`]).
    pub(crate) async fn recv_with(
        &mut self,
        f: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<bool, Error> {
        poll_fn(|cx| self.poll_recv_with(cx, f)).await
    }
}

/// A connected pipe: both halves.
pub(crate) type Pipe = (Link, Box<dyn MsgRx>);

/// In-process pipe half: receiver.
#[derive(Debug)]
pub(crate) struct MemRx {
    rx: mpsc::UnboundedReceiver<Bytes>,
    credit: Arc<Semaphore>,
    spare: Arc<Spare>,
}

/// Two connected in-process pipes, each direction with `ring` bytes of credit.
#[cfg(any(test, feature = "tls"))]
pub(crate) fn mem_pair(ring: usize) -> (Pipe, Pipe) {
    let (a_tx, a_rx) = one_way(ring, None);
    let (b_tx, b_rx) = one_way(ring, None);
    ((a_tx, Box::new(b_rx)), (b_tx, Box::new(a_rx)))
}

/// [`mem_pair`] for `inproc://`: the first pipe (the client's) polls the
/// second one's connection in place after each message it sends, once
/// that connection is handed to [`InPlace::drive`] (the cell returned).
pub(crate) fn mem_pair_in_place(ring: usize) -> (Pipe, Pipe, Arc<InPlace>) {
    let peer = InPlace::new();
    let (a_tx, a_rx) = one_way(ring, Some(peer.clone()));
    let (b_tx, b_rx) = one_way(ring, None);
    ((a_tx, Box::new(b_rx)), (b_tx, Box::new(a_rx)), peer)
}

fn one_way(ring: usize, peer: Option<Arc<InPlace>>) -> (Link, MemRx) {
    let (tx, rx, credit, spare) = Link::mem(ring, peer);
    (tx, MemRx { rx, credit, spare })
}

impl MsgRx for MemRx {
    fn poll_recv_with(
        &mut self,
        cx: &mut Context<'_>,
        f: &mut dyn FnMut(&[u8]),
    ) -> Poll<Result<bool, Error>> {
        Poll::Ready(match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(m) => {
                f(&m);
                self.credit.add_permits(m.len().max(1));
                self.spare.give(m);
                Ok(true)
            }
            None => Ok(false),
        })
    }
}

impl Drop for MemRx {
    fn drop(&mut self) {
        // Wake a sender waiting for credit: the peer is gone.
        self.credit.close();
    }
}

/// The server's side of an `inproc://` connection, driven in place.
///
/// Its connection future (negotiation, decoding, the handlers' first
/// polls) lives here, not inside a task of its own: a task on the dialing
/// client's runtime drives it ([`InPlace::drive`]), and the client's
/// [`Link`] polls it once more, on the sending thread, after each message
/// it sends ([`InPlace::help`]). A unary call's request is then decoded,
/// its handler run and its reply written into the client's receiver
/// before the client's call waits at all: no task woken for the request,
/// none for the reply (tonic's #2227 asks for the server as the client's
/// service; this keeps the frames and the connection core between them).
///
/// The in-place poll uses the driving task's waker, so whatever the
/// connection waits on (the next message, a handler's note, a deadline)
/// wakes the task as before, and a turn the task could not take because a
/// helper held the future is handed back to it (`missed`). It runs inside
/// the dialing runtime's context, where the task would have run it. A
/// panic there is caught and resumed in the task, as the task's own
/// would be.
pub(crate) struct InPlace {
    /// The connection's future, `None` before it is handed over and once
    /// it ended. Locked with `try_lock` only: nobody ever waits for it.
    state: Mutex<PeerState>,
    /// The driving task's waker (its last poll's).
    waker: Mutex<Option<Waker>>,
    /// The driving task was polled while a helper held the future: the
    /// helper wakes it once it lets the future go.
    missed: std::sync::atomic::AtomicBool,
    /// The driving task was dropped while a helper held the future: the
    /// helper drops it once it lets go.
    abandoned: std::sync::atomic::AtomicBool,
    /// The dialing client's runtime: where the connection runs.
    runtime: tokio::runtime::Handle,
}

/// What [`InPlace`] keeps under its lock.
#[derive(Default)]
struct PeerState {
    fut: Option<BoxFut<'static, ()>>,
    /// A panic caught in a helper's poll, for the task to resume.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

impl std::fmt::Debug for InPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InPlace").finish_non_exhaustive()
    }
}

impl InPlace {
    /// A cell for a connection dialed from the current runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime (the dialer is async, inside one).
    fn new() -> Arc<Self> {
        Arc::new(InPlace {
            state: Mutex::default(),
            waker: Mutex::new(None),
            missed: std::sync::atomic::AtomicBool::new(false),
            abandoned: std::sync::atomic::AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// The dialing client's runtime, where [`drive`](Self::drive)'s task
    /// is spawned.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// The task that drives `conn` (the server's side of the connection),
    /// to be spawned on [`runtime`](Self::runtime); clients' sends poll
    /// `conn` in place as well. Dropping the task drops `conn`.
    pub(crate) fn drive(
        self: Arc<Self>,
        conn: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        lock_state(&self.state).fut = Some(Box::pin(conn));
        Driver { cell: self }
    }

    /// Polls the connection once on this thread, with the driving task's
    /// waker, unless its task (or another helper) is polling it right now
    /// (then that poll sees the message) or it is not driven yet (its
    /// task's first poll will). Never waits.
    pub(crate) fn help(&self) {
        let Some(waker) = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        if let Some(fut) = st
            .fut
            .as_mut()
            .filter(|_| !self.abandoned.load(Ordering::SeqCst))
        {
            let _rt = self.runtime.enter();
            let mut cx = Context::from_waker(&waker);
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fut.as_mut().poll(&mut cx)
            }));
            match polled {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) => {
                    st.fut = None;
                    waker.wake_by_ref();
                }
                Err(panic) => {
                    st.fut = None;
                    st.panic = Some(panic);
                    waker.wake_by_ref();
                }
            }
        }
        drop(st);
        // After letting go (the task's drop stores the flag, then tries
        // the lock: one of the two sees the other).
        if self.abandoned.load(Ordering::SeqCst) {
            self.drop_future();
        }
        if self.missed.swap(false, Ordering::SeqCst) {
            waker.wake();
        }
    }

    /// Drops the connection's future, unless a helper holds it (that
    /// helper then drops it as it lets go).
    fn drop_future(&self) {
        let fut = match self.state.try_lock() {
            Ok(mut st) => st.fut.take(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().fut.take(),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        drop(fut);
    }
}

fn lock_state(m: &Mutex<PeerState>) -> MutexGuard<'_, PeerState> {
    // A poll that panicked was caught (helpers) or ends the task (the
    // driver, whose drop then drops the future): the state stays whole.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The task of [`InPlace::drive`].
struct Driver {
    cell: Arc<InPlace>,
}

impl Future for Driver {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let cell = &self.cell;
        {
            let mut w = cell.waker.lock().unwrap_or_else(PoisonError::into_inner);
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        // Before the `try_lock`: a helper that holds the future sees this
        // once it lets go, and wakes us.
        cell.missed.store(true, Ordering::SeqCst);
        let Ok(mut st) = cell.state.try_lock() else {
            return Poll::Pending;
        };
        cell.missed.store(false, Ordering::SeqCst);
        if let Some(panic) = st.panic.take() {
            drop(st);
            std::panic::resume_unwind(panic);
        }
        let Some(fut) = st.fut.as_mut() else {
            return Poll::Ready(());
        };
        match fut.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let done = st.fut.take();
                drop(st);
                drop(done);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The connection ends with its task (a runtime shut down, the
        // server's join set aborted): dropped here, or by the helper that
        // holds it right now.
        self.cell.abandoned.store(true, Ordering::SeqCst);
        self.cell.drop_future();
    }
}

/// Test helpers.
#[cfg(test)]
pub(crate) mod testing {
    use crate::Error;

    /// What the ring says when the peer corrupted it (typed, as the ring
    /// reports it: `DataLoss` at the gRPC edge).
    pub(crate) fn corrupted() -> Error {
        rrpc_ringbuf::Error::Corrupt(rrpc_ringbuf::Corruption::Pointer {
            record: "head",
            value: 9,
            min: 1,
            max: 2,
        })
        .into()
    }
}

#[cfg(test)]
mod tests;
