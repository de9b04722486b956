//! Async connections: an rrpc-ringbuf ring pair plus an rrpc-core [`Connection`], driven by
//! a [`Poller`] (what the tonic layer uses).
//!
//! [`AsyncConn::split`] gives an [`AsyncSender`] (waits for ring space when the peer's ring is
//! full) and an [`AsyncReceiver`] (waits for messages), each with its own [`Registration`]
//! (sources: `TxWatch::has_space`, `RxWatch::has_data`). The side channel's liveness fd is
//! watched by both, so a dead peer fails waiting tasks with an error for which [`Error::is_peer_gone`] holds.
//!
//! [`AsyncConn::split_managed`] gives a [`ManagedSender`] instead: the poller then owns the
//! sender's upkeep, one owner per job: completion progress (a task polls send completions
//! after a send that left work held back) and a self-sizing ring's tick (every
//! `shrink_after / 2`, which also tells the receiver's owner through [`IdleReads`] when an idle
//! reader has its peer's resize marker to read).
//!
//! Head pushes (RB²'s lazy push): a receiver pushes its head every `gamma` messages and
//! every eighth of the ring as it releases them, and a receiver that waits for data owes
//! one more push of what it read since, so that a sender that found the ring full is not
//! left waiting. On shm that push goes out only if the wait is about to sleep
//! ([`Registration::wait_ready_with`]): a spin that catches the next message needs none,
//! and in a ping-pong pushing before every wait cost a WRITE per message. On a NIC it goes
//! out before the wait, signaled, and the wait begins once it completed (a push lost to a
//! failed link must be known, not waited for).
//!
//! In [`Mode::Event`] the receive side sleeps on the queue pair's receive completion channel
//! (the peer's ring must send its tail with `WRITE_WITH_IMM`: `RingConfigBuilder::tail_with_imm`,
//! set on both sides). Head pushes carry no immediate, so in Event mode a sender waiting for
//! space rechecks with a timer backoff (20 µs doubling to 1 ms) instead; this is the only
//! place where Event mode polls.
//!
//! In [`Mode::Bpev`] with the doorbell fallback on
//! ([`PollerConfig::doorbell_park_after`](crate::PollerConfig::doorbell_park_after)), the receive
//! side offers the same completion channel as a doorbell: a dozing polling thread announces
//! the reader's sleep through the ring's sleep word (`rrpc_ringbuf::RxDoorbell`), and the
//! peer's sender rings once with a `WRITE_WITH_IMM` of its tail (`rrpc_ringbuf::proto::doorbell`).

use std::future::{Future, poll_fn};
use std::io;
use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rrpc_core::conn::{Connection, HandshakeConfig, Listener, Offer, connect};
use rrpc_core::{Fabric, FabricAddr, ProviderKind, QpConfig, QueuePair};
use rrpc_ringbuf::{ReadGuard, RxDoorbell, RxWatch, TxWatch, WriteGuard};

use crate::config::Mode;
use crate::error::{Error, Result};
use crate::poller::SendLog;
use crate::poller::{Poller, Registration};
use crate::source::{Notifier, Readiness};

mod managed;
#[cfg(test)]
mod tests;
pub use managed::{IdleReads, ManagedSender, SendHandle, fail_connection};
/// The ring types a connection is set up with (re-exported so that a user
/// of this module names no rrpc-ringbuf type of its own).
pub use rrpc_ringbuf::{LocalRing, RingConfig, RingRx, RingTx};

/// Receives posted up front in Event mode (one per tail `WRITE_WITH_IMM` in flight).
const EVENT_RECVS: u32 = 256;
/// Receives posted up front for the doorbell fallback: a writer rings at most once per
/// announced sleep, and every announce first reposts what was consumed, so a few suffice.
const DOORBELL_RECVS: u32 = 16;

/// Receive-CQ notifier for Event mode and for the doorbell fallback (`ibv_req_notify_cq` +
/// completion channel; `bell` announces the reader's sleeps to the writer).
struct RecvNotifier {
    qp: Arc<QueuePair>,
    bell: Option<RxDoorbell>,
    /// Both ends share memory (shm): an announce and the re-check miss nothing.
    exact: bool,
}

impl RecvNotifier {
    /// Retires receive completions and reposts one receive for each, so the peer's next
    /// tail `WRITE_WITH_IMM` always finds one.
    fn replenish(&self) -> Result<()> {
        RingRx::replenish_on(&self.qp)?;
        Ok(())
    }
}

impl Notifier for RecvNotifier {
    fn fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.qp.recv_cq().channel_fd().map_err(io::Error::from)
    }
    fn arm(&self) -> io::Result<()> {
        self.replenish().map_err(io::Error::other)?;
        self.qp.recv_cq().req_notify().map_err(io::Error::other)
    }
    fn ack(&self) -> io::Result<()> {
        let n = self.qp.recv_cq().ack_events().map_err(io::Error::other)?;
        self.replenish().map_err(io::Error::other)?;
        if n == 0 {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(())
        }
    }
    fn announce_sleep(&self) -> io::Result<()> {
        match &self.bell {
            Some(b) => b.announce_sleep().map_err(io::Error::other),
            None => Ok(()),
        }
    }
    fn announce_is_exact(&self) -> bool {
        self.exact
    }
}

struct RxSource {
    watch: RxWatch,
    conn: Arc<Connection>,
    /// The poller's `completion_limit`.
    completion_limit: Duration,
    notifier: Option<RecvNotifier>,
    doorbell: Option<RecvNotifier>,
}

impl Readiness for RxSource {
    fn ready(&self) -> bool {
        self.watch.has_data()
    }
    fn is_closed(&self) -> bool {
        self.conn.is_gone()
    }
    fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.conn.liveness_fd()
    }
    fn liveness(&self) -> Option<rrpc_core::conn::LivenessWatch> {
        self.conn.liveness()
    }
    fn notifier(&self) -> Option<&dyn Notifier> {
        self.notifier.as_ref().map(|n| n as &dyn Notifier)
    }
    fn doorbell(&self) -> Option<&dyn Notifier> {
        self.doorbell.as_ref().map(|n| n as &dyn Notifier)
    }
}

struct TxSource {
    watch: TxWatch,
    conn: Arc<Connection>,
    /// The poller's `completion_limit`.
    completion_limit: Duration,
}

impl Readiness for TxSource {
    fn ready(&self) -> bool {
        self.watch.has_space()
    }
    fn is_closed(&self) -> bool {
        self.conn.is_gone()
    }
    fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.conn.liveness_fd()
    }
    fn liveness(&self) -> Option<rrpc_core::conn::LivenessWatch> {
        self.conn.liveness()
    }
}

/// A wait for send completions that a NIC delivers after the post: the
/// polls so far, and when the work waiting last changed (a completion, or
/// new work). Start one per wait ([`Default`]); a wait that makes no
/// progress for the poller's
/// [`completion_limit`](crate::PollerConfig::completion_limit) fails with
/// [`Error::CompletionOverdue`]. A NIC completes a WRITE in microseconds,
/// or fails it once its retries run out; a WRITE with no completion after
/// that long is lost in the device, not slow. Soft-RoCE shows it: a packet
/// its `ip_local_out` drops while the link goes down can stall the queue
/// pair's send path for good, completing nothing and failing nothing, and
/// both ends of the connection then waited for ever with calls in flight.
#[derive(Debug, Default, Clone)]
pub struct CompletionWait {
    polls: u32,
    /// When the work in flight was last seen to change, and what it was.
    since: Option<(Instant, usize)>,
    /// A pause polled ([`Self::poll_pause`]) is under way.
    pausing: bool,
}

impl CompletionWait {
    /// A fresh wait (what [`Default`] gives).
    pub fn new() -> Self {
        Self::default()
    }

    /// The wait ended (room came without a completion poll): the next one
    /// starts afresh.
    fn reset(&mut self) {
        *self = Self::default();
    }

    /// One wait between two polls: a yield for the first 64 (microseconds on
    /// a NIC), then 200 µs sleeps (soft-RoCE under emulation is slower),
    /// each checking that the peer is still there and that the work
    /// waiting (`in_flight`, any measure that changes as completions come)
    /// moved within `limit`.
    async fn pause(&mut self, conn: &Connection, limit: Duration, in_flight: usize) -> Result<()> {
        self.polls += 1;
        if self.polls < 64 {
            tokio::task::yield_now().await;
            return Ok(());
        }
        conn.check_alive()?;
        let now = Instant::now();
        match self.since {
            Some((t, n)) if n == in_flight => {
                if now.duration_since(t) > limit {
                    return Err(Error::CompletionOverdue(limit));
                }
            }
            _ => self.since = Some((now, in_flight)),
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
        Ok(())
    }
}

impl CompletionWait {
    /// [`pause`](Self::pause) as a poll function, its timer in `sleep` (made at the first
    /// timed pause, reset after): a pause begun is resumed by the next poll, which must come
    /// before the wait's condition is looked at again.
    fn poll_pause(
        &mut self,
        cx: &mut Context<'_>,
        conn: &Connection,
        limit: Duration,
        in_flight: usize,
        sleep: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    ) -> Poll<Result<()>> {
        if !self.pausing {
            self.polls += 1;
            if self.polls < 64 {
                self.pausing = true;
                return crate::poller::yield_now(cx);
            }
            conn.check_alive()?;
            let now = Instant::now();
            match self.since {
                Some((t, n)) if n == in_flight => {
                    if now.duration_since(t) > limit {
                        return Poll::Ready(Err(Error::CompletionOverdue(limit)));
                    }
                }
                _ => self.since = Some((now, in_flight)),
            }
            let at = tokio::time::Instant::from_std(now + Duration::from_micros(200));
            match sleep {
                Some(s) => s.as_mut().reset(at),
                None => *sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
            self.pausing = true;
        }
        if self.polls >= 64
            && let Some(s) = sleep
        {
            std::task::ready!(s.as_mut().poll(cx));
        }
        // A yield's pause ends at the poll after it.
        self.pausing = false;
        Poll::Ready(Ok(()))
    }
}

/// [`AsyncReceiver::recv`]'s future, dropped: the wait goes with it.
struct Abandon<'a>(&'a mut AsyncReceiver);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.0.abandon_wait();
    }
}

/// Whether the receive side uses the doorbell fallback: the poller has it on, the peer's
/// sender rings, and tails are not already sent with immediates.
fn uses_doorbell(poller: &Poller, rx: &RingRx) -> bool {
    poller.config().doorbell_fallback() && !rx.tails_with_imm() && rx.doorbell().peer_rings()
}

/// A connected ring pair managed by a [`Poller`].
#[derive(Debug)]
pub struct AsyncConn {
    poller: Poller,
    conn: Arc<Connection>,
    tx: RingTx,
    rx: RingRx,
}

impl AsyncConn {
    /// Wraps a connection and its two ring directions (from `LocalRing::connect`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] in [`Mode::Event`] when the ring does not send tails with
    /// immediate data; [`Error::Ring`] when the initial receives cannot be posted.
    pub fn new(poller: &Poller, conn: Connection, tx: RingTx, rx: RingRx) -> Result<Self> {
        if uses_doorbell(poller, &rx) {
            rx.post_receives(DOORBELL_RECVS)?;
        }
        if poller.config().mode() == Mode::Event {
            if !tx.config().tail_with_imm() {
                return Err(Error::InvalidConfig(
                    "Event mode needs RingConfigBuilder::tail_with_imm(true) on both sides",
                ));
            }
            rx.post_receives(EVENT_RECVS)?;
        }
        Ok(Self {
            poller: poller.clone(),
            conn: Arc::new(conn),
            tx,
            rx,
        })
    }

    /// The underlying connection (peer info, liveness).
    pub fn connection(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// Takes the connection apart again (for a peer that drives its rings without a poller,
    /// like a benchmark's load generator).
    pub fn into_parts(self) -> (Arc<Connection>, RingTx, RingRx) {
        (self.conn, self.tx, self.rx)
    }

    /// Registers both directions with the poller and splits them.
    ///
    /// # Errors
    /// As [`Poller::register`] (needs a tokio runtime).
    pub fn split(self) -> Result<(AsyncSender, AsyncReceiver)> {
        let mode = self.poller.config().mode();
        let exact = self.conn.peer().provider == ProviderKind::Shm;
        let notifier = (mode == Mode::Event).then(|| RecvNotifier {
            qp: self.conn.qp().clone(),
            bell: None,
            exact,
        });
        let doorbell = uses_doorbell(&self.poller, &self.rx).then(|| RecvNotifier {
            qp: self.conn.qp().clone(),
            bell: Some(self.rx.doorbell()),
            exact,
        });
        let completion_limit = self.poller.config().completion_limit();
        let rx_src = Arc::new(RxSource {
            watch: self.rx.watch(),
            conn: self.conn.clone(),
            completion_limit,
            notifier,
            doorbell,
        });
        let tx_src = Arc::new(TxSource {
            watch: self.tx.watch(),
            conn: self.conn.clone(),
            completion_limit,
        });
        let mut rx_reg = self.poller.register(rx_src.clone())?;
        // Same polling thread for both directions (BP: one thread per connection).
        let mut tx_reg = rx_reg.register_sibling(tx_src.clone())?;
        // A peer that needs this process's only CPU: spinning would keep it from answering.
        // Looked at again while the connection lives (threads may be pinned after it).
        if self.poller.config().handoff() == crate::Handoff::Auto
            && let Some(peer) = self.conn.peer_pid()
        {
            rx_reg.follow_peer_cpus(peer);
            tx_reg.follow_peer_cpus(peer);
            if rx_reg.hands_off() {
                tracing::debug!(
                    peer,
                    "rrpc-poller: the peer shares this process's only CPU: waits are handed off"
                );
            }
        }
        // The receiver's spins are judged by what this end sent since (a reply may be coming,
        // or nothing will come until this end sends): `Registration::follow_sends`.
        let sends = Arc::new(SendLog::new());
        rx_reg.follow_sends(sends.clone());
        Ok((
            AsyncSender {
                tx: self.tx,
                reg: tx_reg,
                src: tx_src,
                mode,
                sends,
            },
            AsyncReceiver {
                rx: self.rx,
                reg: rx_reg,
                src: rx_src,
                idle: None,
                wait: DataWait::Idle,
                sleep: None,
            },
        ))
    }

    /// Connects two in-process endpoints over a fresh shm side channel (tests, benchmarks,
    /// examples). Both use `ring` and `poller`.
    ///
    /// # Errors
    /// [`Error::Core`] / [`Error::Ring`] when the handshake or allocation fails.
    pub fn loopback_pair(poller: &Poller, ring: &RingConfig) -> Result<(AsyncConn, AsyncConn)> {
        Self::loopback_pair_on(poller, ring, &Fabric::shm())
    }

    /// As [`loopback_pair`](Self::loopback_pair), on `fabric`: shm over a
    /// Unix socket, or verbs over a TCP side channel on 127.0.0.1 (port
    /// chosen by the kernel) — two queue pairs of the same device, as in the
    /// soft-RoCE VM of `cargo xtask rxe`.
    ///
    /// # Errors
    /// As [`loopback_pair`](Self::loopback_pair).
    pub fn loopback_pair_on(
        poller: &Poller,
        ring: &RingConfig,
        fabric: &Fabric,
    ) -> Result<(AsyncConn, AsyncConn)> {
        Self::loopback_pair_with(poller, ring, fabric, &QpConfig::default())
    }

    /// As [`loopback_pair_on`](Self::loopback_pair_on), both queue pairs
    /// made with `qp` (for example with a [`rrpc_core::FaultConfig`]).
    ///
    /// # Errors
    /// As [`loopback_pair`](Self::loopback_pair).
    pub fn loopback_pair_with(
        poller: &Poller,
        ring: &RingConfig,
        fabric: &Fabric,
        qp: &QpConfig,
    ) -> Result<(AsyncConn, AsyncConn)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "rrpc-poller-{}-{}.sock",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let (listener, ep) = match fabric.kind() {
            ProviderKind::Verbs => {
                let any: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
                let l = Listener::bind(&FabricAddr::Rdma(any), HandshakeConfig::default())?;
                let addr = l
                    .local_addr()
                    .ok_or(Error::InvalidConfig("rdma listener without a TCP address"))?;
                (l, FabricAddr::Rdma(addr))
            }
            _ => {
                let ep = FabricAddr::Shm(path.clone());
                (Listener::bind(&ep, HandshakeConfig::default())?, ep)
            }
        };
        let fabric = fabric.clone();
        let (f2, r2, q2) = (fabric.clone(), ring.clone(), qp.clone());
        let server = std::thread::spawn(move || -> Result<(Connection, RingTx, RingRx)> {
            let local = LocalRing::new(&f2, &r2)?;
            let offer = local.add_to_offer(Offer::new());
            let c = listener.accept()?.accept(f2.create_qp(&q2)?, offer)?;
            let (tx, rx) = local.connect(&c)?;
            Ok((c, tx, rx))
        });
        let client = (|| -> Result<(Connection, RingTx, RingRx)> {
            let local = LocalRing::new(&fabric, ring)?;
            let offer = local.add_to_offer(Offer::new());
            let qp = fabric.create_qp(qp)?;
            let c = connect(&ep, qp, offer, &HandshakeConfig::default())?;
            let (tx, rx) = local.connect(&c)?;
            Ok((c, tx, rx))
        })();
        let server = server
            .join()
            .map_err(|_| Error::InvalidConfig("accept thread panicked"))?;
        let _ = std::fs::remove_file(&path);
        let (c1, t1, r1) = client?;
        let (c2, t2, r2) = server?;
        Ok((
            AsyncConn::new(poller, c1, t1, r1)?,
            AsyncConn::new(poller, c2, t2, r2)?,
        ))
    }
}

/// Sending half: copies or reserves into the peer's ring, waiting for space when full.
#[derive(Debug)]
pub struct AsyncSender {
    tx: RingTx,
    reg: Registration,
    src: Arc<TxSource>,
    mode: Mode,
    /// Sends and flushes, for the receiver's spin phases (`Registration::follow_sends`).
    sends: Arc<SendLog>,
}

impl std::fmt::Debug for TxSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxSource").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RxSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxSource")
            .field("event", &self.notifier.is_some())
            .finish_non_exhaustive()
    }
}

impl AsyncSender {
    /// After a reserve found the ring full: waits until it may have room.
    ///
    /// Room comes from the reader, which frees only what it could see. If
    /// messages are held back behind a send completion (the tail deferred
    /// by the elastic threshold, or work beyond the send-queue budget), the
    /// reader cannot see them, and a ring full of them never frees: poll
    /// completions (the next `try_reserve` does) until they are out,
    /// instead of waiting for a head that will not move. On shm never
    /// taken (WRITEs complete in their post); on a NIC a round trip; seen
    /// on soft-RoCE across two hosts as a call stuck for good, its writer
    /// waiting for room and holding the writer lock that the progress task
    /// ([`ManagedSender`]'s) needed to post the tail.
    async fn wait_room(&mut self, wait: &mut CompletionWait) -> Result<()> {
        if self.wants_completions() {
            let in_flight = self.tx.state().tails_in_flight();
            return wait
                .pause(&self.src.conn, self.src.completion_limit, in_flight)
                .await;
        }
        wait.reset();
        self.wait_space().await
    }

    async fn wait_space(&mut self) -> Result<()> {
        if self.mode != Mode::Event {
            return self.reg.wait_ready().await;
        }
        let mut backoff = Duration::from_micros(20);
        while !self.src.ready() {
            self.src.conn.check_alive()?;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Sends one message (copied into the ring; batched per the ring's thresholds; call
    /// [`flush`](Self::flush) to push a partial batch).
    ///
    /// # Errors
    /// a peer-gone error ([`Error::is_peer_gone`]); [`Error::Ring`] for a message larger than the ring or a fabric
    /// failure.
    ///
    /// # Cancel safety
    /// Cancel-safe: the message is either fully in the ring or not at all.
    pub async fn send(&mut self, msg: &[u8]) -> Result<()> {
        let mut wait = CompletionWait::new();
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => {
                    self.sends.record();
                    return Ok(());
                }
                Err(rrpc_ringbuf::Error::WouldBlock) => self.wait_room(&mut wait).await?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reserves `len` bytes in the ring for zero-copy encoding; write through the guard and
    /// `commit()` it.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is reserved until the future completes.
    pub async fn reserve(&mut self, len: usize) -> Result<WriteGuard<'_>> {
        let mut wait = CompletionWait::new();
        loop {
            match self.tx.try_reserve(len) {
                // Probe only: an uncommitted guard is abandoned on drop, and as the single
                // producer we get the same space back below (borrowck cannot return the
                // guard from inside the loop).
                Ok(_probe) => break,
                Err(rrpc_ringbuf::Error::WouldBlock) => self.wait_room(&mut wait).await?,
                Err(e) => return Err(e.into()),
            }
        }
        self.tx.try_reserve(len).map_err(Into::into)
    }

    /// [`reserve`](Self::reserve) without waiting: `None` when the ring is
    /// full (the batch was flushed so that the receiver can drain).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub fn try_reserve(&mut self, len: usize) -> Result<Option<WriteGuard<'_>>> {
        match self.tx.try_reserve(len) {
            Ok(g) => Ok(Some(g)),
            Err(rrpc_ringbuf::Error::WouldBlock) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Pushes the batched messages and the tail to the peer now.
    ///
    /// # Errors
    /// a peer-gone error ([`Error::is_peer_gone`]) or a fabric error.
    pub fn flush(&mut self) -> Result<()> {
        self.sends.record();
        self.tx.flush().map_err(Into::into)
    }

    /// [`flush`](Self::flush), then polls send completions until nothing
    /// is held back any more (the tail deferred by the elastic threshold,
    /// work beyond the send-queue budget), yielding to the runtime between
    /// polls: when it returns, the peer can see every message sent. Use it
    /// at the end of a burst after which the writer goes idle (a NIC
    /// completes a WRITE after its post, and a poll may come just before
    /// the completion); a [`ManagedSender`] runs the same loop in a task.
    ///
    /// # Errors
    /// a peer-gone error ([`Error::is_peer_gone`]) (checked while waiting) or a fabric error.
    ///
    /// # Cancel safety
    /// Cancel-safe: what was flushed stays flushed; calling it again (or
    /// [`poll_completions`](Self::poll_completions)) resumes the wait.
    pub async fn flush_all(&mut self) -> Result<()> {
        self.flush()?;
        let mut wait = CompletionWait::new();
        while self.wants_completions() {
            let in_flight = self.tx.state().tails_in_flight();
            wait.pause(&self.src.conn, self.src.completion_limit, in_flight)
                .await?;
            self.poll_completions()?;
        }
        Ok(())
    }

    /// Whether work is held back until send completions are polled: a tail
    /// WRITE deferred by the elastic threshold, or work beyond the
    /// send-queue budget. On shm never after [`flush`](Self::flush) (a
    /// WRITE completes inside its post); on a NIC it is, until the
    /// completions arrive, and somebody must then call
    /// [`poll_completions`](Self::poll_completions), or the last message
    /// of a burst is never seen by the peer.
    pub fn wants_completions(&self) -> bool {
        self.tx.state().wants_completions()
    }

    /// Tail WRITEs posted whose completion has not been polled. Until it
    /// is, a failed one is not known: a peer that stopped acknowledging
    /// (`RETRY_EXC`), a link down. A writer that goes idle after a send
    /// should poll completions until this is 0, or a failure of its last
    /// tail leaves the call waiting for a reply to a request that never
    /// became visible ([`ManagedSender`]'s progress task does).
    pub fn tails_in_flight(&self) -> usize {
        self.tx.state().tails_in_flight()
    }

    /// Polls the send completion queue and posts whatever it unblocked
    /// (the deferred tail, held-back work). Never waits.
    ///
    /// # Errors
    /// a peer-gone error ([`Error::is_peer_gone`]) or a fabric error.
    pub fn poll_completions(&mut self) -> Result<()> {
        self.tx.poll_completions().map_err(Into::into)
    }

    /// The ring's sending half (state, config).
    pub fn ring(&self) -> &RingTx {
        &self.tx
    }
}

/// Receiving half: yields messages borrowed from the ring.
#[derive(Debug)]
pub struct AsyncReceiver {
    rx: RingRx,
    reg: Registration,
    src: Arc<RxSource>,
    /// Fed by a managed sender's sizing tick ([`AsyncConn::split_managed`]).
    idle: Option<IdleReads>,
    /// Where the wait for data is between two polls ([`Self::poll_recv`]).
    wait: DataWait,
    /// A completion wait's timer (a NIC's push held back past 64 yields), made the first
    /// time one is needed and reset after.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The steps of [`AsyncReceiver`]'s wait for data (`wait_data` in its docs).
#[derive(Debug, Default)]
enum DataWait {
    /// No wait in progress: the next poll begins one.
    #[default]
    Idle,
    /// On shm with no push owed: the registration's wait, pushing the head only if it is
    /// about to sleep.
    Lazy,
    /// The head push goes out, signaled on a NIC (`flush_confirmed`).
    Flush,
    /// A push held back by the send-queue budget: driven out by polling completions.
    Completions(CompletionWait),
    /// The last (signaled) push is confirmed by its completion.
    Confirming(CompletionWait),
    /// The registration's wait, with nothing owed.
    Last,
}

impl AsyncReceiver {
    /// Waits for the next message and borrows it from the ring until the guard drops
    /// (dropping releases its slots to the peer): [`poll_recv`](Self::poll_recv) polled to
    /// the end.
    ///
    /// # Errors
    /// a peer-gone error ([`Error::is_peer_gone`]) once the peer is gone and every message it published was read;
    /// [`Error::Ring`] for corrupt peer data; [`Error::Shutdown`] after the poller stopped.
    ///
    /// A tail that moved over a wrap-around gap only (no message behind it) is consumed
    /// here and the wait goes on; it is never reported as an error.
    ///
    /// # Cancel safety
    /// Cancel-safe: no message is consumed until the future completes (a skipped gap is
    /// not a message); the next wait starts afresh.
    pub async fn recv(&mut self) -> Result<ReadGuard<'_>> {
        {
            let wait = Abandon(&mut *self);
            poll_fn(|cx| wait.0.poll_message(cx)).await?;
        }
        self.rx.try_recv().map_err(Into::into)
    }

    /// [`recv`](Self::recv) as a poll function: `Ready` with the next message, borrowed from
    /// the ring until the guard drops, or with the error that ended the wait; `Pending` with
    /// the task's waker registered. No future and no allocation: the wait's state is kept
    /// here (and in the registration) between polls, so an owner that polls it in place
    /// (rrpc-tonic's fast path) needs none of its own. The wait is the same as
    /// [`recv`](Self::recv)'s, step for step: the head pushed before the wait sleeps (on shm
    /// only if it is about to sleep; on a NIC before it waits, signaled and confirmed), held-back
    /// pushes driven out with the poller's `completion_limit`, a tail whose message is not
    /// readable yet waited out with a yield.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    ///
    /// # Cancel safety
    /// No message is consumed before `Ready`: an owner that stops polling loses nothing. A
    /// wait not polled to its end resumes at the next poll where it left off
    /// ([`Registration::poll_ready`]); [`abandon_wait`](Self::abandon_wait) drops it.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<ReadGuard<'_>>> {
        std::task::ready!(self.poll_message(cx))?;
        Poll::Ready(self.rx.try_recv().map_err(Into::into))
    }

    /// Drops the wait in progress, if any: the next poll begins a new one (what dropping
    /// [`recv`](Self::recv)'s future does).
    pub fn abandon_wait(&mut self) {
        self.wait = DataWait::Idle;
        self.reg.abandon_wait();
    }

    /// `Ready(Ok)` once a message is readable.
    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        std::task::ready!(self.poll_data(cx))?;
        if let Some(n) = &self.src.notifier {
            n.replenish()?;
        }
        // A tail that moved over a gap only is no message: wait again.
        if self.rx.has_message()? {
            return Poll::Ready(Ok(()));
        }
        // The tail moved but its message is not readable yet (not placed, or its tail
        // record read half-written): the data is microseconds away, or a bad peer is timed
        // out by the ring. Either way let the worker run others meanwhile; the next poll
        // waits again.
        crate::poller::yield_now(cx)
    }

    /// Waits until the ring's tail moved past what we consumed (the steps of [`DataWait`]);
    /// every `Ready` leaves the wait [`DataWait::Idle`].
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let r = std::task::ready!(self.poll_data_steps(cx));
        self.wait = DataWait::Idle;
        Poll::Ready(r)
    }

    fn poll_data_steps(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        loop {
            match &mut self.wait {
                DataWait::Idle => {
                    if self.src.ready() {
                        return Poll::Ready(Ok(()));
                    }
                    // Going idle: push the head the peer has not seen (RB²'s lazy head push
                    // would otherwise leave a sender that found the ring full waiting
                    // forever).
                    //
                    // On shm (a push's outcome is known when it is posted) only if this wait
                    // is about to sleep: a spin that catches the next message needs no push,
                    // and in a ping-pong every wait ends that way, so pushing first cost a
                    // WRITE per message (~700 instructions a call on the fast path). The head
                    // still goes out every `gamma` messages and `flush_slots` (an eighth of
                    // the ring) as messages are released, and before the wait whenever the
                    // sender's view of the ring may be too full for a message like the
                    // largest read so far (`push_owed_before_wait`: messages of half the ring
                    // or more). A push held back by the send-queue budget (completions that
                    // come late) is driven out below instead, before a second wait.
                    self.wait = if self.src.conn.qp().completes_in_post()
                        && !self.rx.push_owed_before_wait()
                    {
                        DataWait::Lazy
                    } else {
                        DataWait::Flush
                    };
                }
                DataWait::Lazy => {
                    std::task::ready!(self.poll_registration(cx, true))?;
                    if self.src.ready() {
                        return Poll::Ready(Ok(()));
                    }
                    self.wait = DataWait::Flush;
                }
                DataWait::Flush => {
                    // On a NIC signaled, see below.
                    self.rx.flush_confirmed()?;
                    self.wait = DataWait::Completions(CompletionWait::new());
                }
                // On a NIC the push may be held back until earlier pushes complete (the
                // send-queue budget), which happens after their post: drive completions until
                // it is out. Bounded by the NIC's completion latency; on shm never taken
                // (WRITEs complete when posted). Bounded like every completion wait (the
                // poller's `completion_limit`, from its start: one push waits, and it goes
                // out at its first completion), checking that the peer is still there.
                DataWait::Completions(wait) => {
                    if wait.pausing || (self.rx.wants_completions() && !self.src.ready()) {
                        let limit = self.src.completion_limit;
                        std::task::ready!(wait.poll_pause(
                            cx,
                            &self.src.conn,
                            limit,
                            0,
                            &mut self.sleep
                        ))?;
                        self.rx.poll_completions()?;
                    } else {
                        self.wait = DataWait::Confirming(CompletionWait::new());
                    }
                }
                // On a NIC a failed push is known only from its completion, and unsignaled
                // pushes have none unless they fail: the last push is signaled
                // (`flush_confirmed`); poll until it completes. Otherwise a push the sender
                // was waiting for, lost to a link down, leaves both sides waiting on a
                // connection that is gone. Microseconds on a NIC; never on shm (a post's
                // outcome is known when it returns).
                DataWait::Confirming(wait) => {
                    if wait.pausing || (self.rx.confirming() && !self.src.ready()) {
                        let limit = self.src.completion_limit;
                        std::task::ready!(wait.poll_pause(
                            cx,
                            &self.src.conn,
                            limit,
                            0,
                            &mut self.sleep
                        ))?;
                        self.rx.poll_completions()?;
                    } else {
                        self.wait = DataWait::Last;
                    }
                }
                DataWait::Last => return self.poll_registration(cx, false),
            }
        }
    }

    /// The registration's wait, which runs even if data came meanwhile: its first check then
    /// counts it (a first-check hit), so that every wait is counted once, however it ended.
    /// With `push_before_sleep`, the head goes to the peer if the wait is about to sleep, and
    /// the wait returns without data if that push is held back or owes a confirmation (the
    /// caller then drives it out).
    fn poll_registration(
        &mut self,
        cx: &mut Context<'_>,
        push_before_sleep: bool,
    ) -> Poll<Result<()>> {
        loop {
            let rx = &mut self.rx;
            let reg = &mut self.reg;
            let mut held_back = false;
            let waited = if push_before_sleep {
                std::task::ready!(reg.poll_ready_with(cx, &mut || {
                    rx.flush()?;
                    held_back = rx.wants_completions() || rx.confirming();
                    Ok(!held_back)
                }))
            } else {
                std::task::ready!(reg.poll_ready(cx))
            };
            if held_back {
                return Poll::Ready(Ok(()));
            }
            match waited {
                Ok(()) => {}
                Err(Error::PeerGone) if self.src.ready() => break,
                Err(Error::PeerGone) => {
                    let _ = self.src.conn.check_alive();
                    return Poll::Ready(Err(Error::PeerGone));
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
            if self.src.ready() {
                break;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Pushes the head to the peer now (frees its view of our ring).
    ///
    /// # Errors
    /// a peer-gone error ([`Error::is_peer_gone`]) or a fabric error.
    pub fn flush(&mut self) -> Result<()> {
        self.rx.flush().map_err(Into::into)
    }

    /// Head pushes this receiver posted so far ([`RingRx::head_pushes`]).
    pub fn head_pushes(&self) -> u64 {
        self.rx.head_pushes()
    }

    /// With [`AsyncConn::split_managed`] over a self-sizing ring: wakes
    /// when the poller's sizing tick finds unread data in this ring, so
    /// that a receiver's owner that reads only on demand reads its peer's
    /// resize markers while idle (the peer's ring shrinks only once this
    /// side passed its marker; `rrpc_ringbuf` docs, "Rings that size
    /// themselves"). `None` otherwise.
    pub fn idle_reads(&self) -> Option<IdleReads> {
        self.idle.clone()
    }

    /// The registration (spin budget, RTT estimate).
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    /// [`Mode::Event`]: spin up to `budget` before each wait arms; see
    /// [`Registration::set_event_spin`].
    pub fn set_event_spin(&mut self, budget: std::time::Duration) {
        self.reg.set_event_spin(budget);
    }

    /// How often this receiver's spinning waits yield to their worker's other tasks; see
    /// [`Registration::set_spin_yield`].
    pub fn set_spin_yield(&mut self, period: std::time::Duration) {
        self.reg.set_spin_yield(period);
    }

    /// Scales the spin cap of this receiver's waits; see [`Registration::scale_spin`].
    pub fn scale_spin(&mut self, factor: u32) {
        self.reg.scale_spin(factor);
    }
}
