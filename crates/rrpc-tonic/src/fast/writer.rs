//! Shared frame writer: many call tasks, one send ring.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, TryLockError};

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

use crate::Error;
use crate::frame::{self, HEADER_LEN, Kind};
use crate::pipe::{MsgTx, SyncTx};

/// Frames written together, as one ring message when they fit: a unary
/// call's three (headers, data, end) without an allocation.
pub(crate) type Batch = smallvec::SmallVec<[Out; 3]>;

/// One frame to write: header fields and a payload.
#[derive(Debug)]
pub(crate) struct Out {
    pub(crate) kind: Kind,
    pub(crate) flags: u8,
    pub(crate) call_id: u32,
    pub(crate) payload: Bytes,
}

impl Out {
    pub(crate) fn new(kind: Kind, flags: u8, call_id: u32, payload: impl Into<Bytes>) -> Self {
        Out {
            kind,
            flags,
            call_id,
            payload: payload.into(),
        }
    }
    fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
}

/// Writes frames into the send ring.
///
/// Zero-copy on: the frame headers and payloads are written straight into
/// the reserved ring slot (one copy of the payload: tonic's encode buffer →
/// ring). Zero-copy off: the batch is first assembled in a heap buffer, then
/// that buffer is copied into the slot (two copies), the baseline of
/// RR-Compound Fig. 14.
///
/// Two paths: [`FrameWriter::try_send`] is synchronous and is what almost
/// every frame takes: on rings, one load of the lane's `leased` flag and
/// the ring's own short step under its lock (reserve, fill, commit,
/// flush: `rrpc_poller::rings::SendHandle`), no future, no task hop; on an
/// in-memory pipe, an uncontended `try_lock` of the lane. [`FrameWriter::send`]
/// tries it first and only leases the sender (taking it out of the lane,
/// so that it can wait for ring space across awaits) when the ring is full,
/// another task is mid-write, or the batch needs several messages. The
/// lease is an owned hand-off, not a lock: the ring's state is locked
/// only inside synchronous steps, so a writer waiting for room blocks
/// nobody's step (the poller's upkeep task runs meanwhile). Writers
/// waiting for a lease queue, first come first served, and a returned
/// lease passes straight to the first of them; while any writer holds or
/// waits for the lease, the synchronous path writes nothing (so small
/// frames cannot starve a large one waiting for ring space). (A
/// `tokio::sync::Mutex` here cost ~330 instructions a frame on the
/// synchronous path: its semaphore's acquire and its release's waiter-list
/// lock.)
///
/// A send that fails on the ring (the peer corrupted it, e.g. a head word
/// past our tail, or the peer is gone) fails the whole connection: the
/// error is logged at warn once, every later send fails at once, and
/// [`FrameWriter::failed`] completes so that the connection's owner closes
/// it and fails its calls. Only a frame too large for any message is a
/// per-call error.
#[derive(Clone)]
pub(crate) struct FrameWriter {
    lane: Arc<Lane>,
    /// The pipe's synchronous side ([`MsgTx::direct`]): the common send
    /// takes no lane lock.
    direct: Option<Arc<dyn SyncTx>>,
    fail: Arc<Fail>,
    zero_copy: bool,
    /// Largest ring message.
    max_msg: usize,
    /// Frames are batched into ring messages of at most this many bytes
    /// ([`MsgTx::preferred_message`]).
    batch: usize,
    /// Largest DATA payload per frame.
    pub(crate) chunk: usize,
}

/// The ring's sender, shared by the writers of one connection.
struct Lane {
    st: Mutex<LaneState>,
    /// The sender is out on a lease, or writers wait for it: the
    /// synchronous path stays out of the way (changed under `st`).
    leased: AtomicBool,
}

struct LaneState {
    /// `None` while an async writer holds it on a [`Lease`] (across
    /// awaits); the synchronous path writes in place under the lock.
    tx: Option<Box<dyn MsgTx>>,
    /// Async writers waiting for the lease, oldest first.
    waiters: VecDeque<oneshot::Sender<Box<dyn MsgTx>>>,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        // A panic while writing poisons the lock; the sender is still whole
        // (a failed fill leaves nothing committed), as with the async lock
        // this replaced.
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives the sender to the first waiter still waiting, or back to the
    /// lane.
    fn give_back(&self, mut tx: Box<dyn MsgTx>) {
        let mut st = self.lock();
        while let Some(w) = st.waiters.pop_front() {
            match w.send(tx) {
                Ok(()) => return,
                // That writer was dropped while it waited.
                Err(back) => tx = back,
            }
        }
        st.tx = Some(tx);
        self.leased.store(false, Ordering::Release);
    }
}

/// The sender taken out of its [`Lane`] by one async writer; given to the
/// next waiter, or back, on drop (also when that writer is cancelled).
struct Lease<'a> {
    lane: &'a Lane,
    tx: Option<Box<dyn MsgTx>>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            self.lane.give_back(tx);
        }
    }
}

/// A writer in the lane's line: if it is dropped after the sender was
/// handed to it but before it took it, it hands the sender on.
struct InLine<'a> {
    lane: &'a Lane,
    rx: oneshot::Receiver<Box<dyn MsgTx>>,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(tx) = self.rx.try_recv() {
            self.lane.give_back(tx);
        }
    }
}

/// Set once a send failed: the connection is unusable.
#[derive(Debug, Default)]
struct Fail {
    token: CancellationToken,
    /// The first error, typed, shared by every call and send it fails
    /// ([`Error::Failed`]).
    first: OnceLock<Arc<Error>>,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tx = match self.lane.st.try_lock() {
            Ok(st) => st
                .tx
                .as_ref()
                .map_or_else(|| "leased by a writer".to_string(), |tx| tx.state()),
            Err(_) => "locked by a writer".to_string(),
        };
        f.debug_struct("FrameWriter")
            .field("zero_copy", &self.zero_copy)
            .field("chunk", &self.chunk)
            .field("failure", &self.fail.first.get())
            .field("tx", &tx)
            .finish()
    }
}

/// Encodes `frames` into a ring slot (`slot` is exactly as long as their
/// wire lengths together).
fn fill_slot(frames: &[Out], zero_copy: bool, slot: &mut [u8]) {
    if zero_copy {
        let mut at = 0;
        for f in frames {
            frame::put_header(
                &mut slot[at..],
                f.kind,
                f.flags,
                f.call_id,
                f.payload.len() as u32,
            );
            at += HEADER_LEN;
            slot[at..at + f.payload.len()].copy_from_slice(&f.payload);
            at += f.payload.len();
        }
    } else {
        // The Fig. 14 baseline: an intermediate buffer, then a second copy.
        let mut buf = Vec::with_capacity(slot.len());
        for f in frames {
            frame::push_frame(&mut buf, f.kind, f.flags, f.call_id, &f.payload);
        }
        slot.copy_from_slice(&buf);
    }
}

impl FrameWriter {
    pub(crate) fn new(tx: Box<dyn MsgTx>, zero_copy: bool, max_chunk: usize) -> Self {
        let max_msg = tx.max_message();
        // Batches and chunks the size the pipe carries best (a self-sizing
        // ring then stays at the size its cores' caches hold); one frame
        // that cannot be split may still go up to `max_msg`.
        let batch = tx
            .preferred_message()
            .clamp(HEADER_LEN + 1, max_msg.max(HEADER_LEN + 1));
        let chunk = max_chunk.min(batch.saturating_sub(HEADER_LEN)).max(1);
        FrameWriter {
            direct: tx.direct(),
            lane: Arc::new(Lane {
                st: Mutex::new(LaneState {
                    tx: Some(tx),
                    waiters: VecDeque::new(),
                }),
                leased: AtomicBool::new(false),
            }),
            fail: Arc::new(Fail::default()),
            zero_copy,
            max_msg,
            batch,
            chunk,
        }
    }

    /// Completes once a send failed and the connection must be closed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub(crate) fn failed(&self) -> WaitForCancellationFuture<'_> {
        self.fail.token.cancelled()
    }

    /// [`FrameWriter::failed`] as a future that owns its token: a loop
    /// that races it on every message keeps one, pinned, rather than
    /// making a new one (a waiter registered and removed) each time.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub(crate) fn failed_owned(&self) -> WaitForCancellationFutureOwned {
        self.fail.token.clone().cancelled_owned()
    }

    /// Why the connection failed, once it did: the first error, shared
    /// ([`Error::Failed`]; [`Error::is_peer_gone`] when the peer left).
    pub(crate) fn failure(&self) -> Option<Error> {
        self.fail.first.get().map(|e| Error::Failed(e.clone()))
    }

    /// Records a ring error: the connection is unusable from now on.
    fn check(&self, r: Result<bool, Error>) -> Result<bool, Error> {
        match r {
            Err(e @ Error::MessageTooLarge { .. }) => Err(e),
            Err(e) => {
                let first = Arc::new(e);
                if self.fail.first.set(first.clone()).is_ok() {
                    if first.is_peer_gone() {
                        tracing::debug!("rrpc: send failed, peer gone: closing the connection");
                    } else {
                        tracing::warn!("rrpc: send failed, closing the connection: {first}");
                    }
                }
                self.fail.token.cancel();
                Err(Error::Failed(first))
            }
            ok => ok,
        }
    }

    /// The error of every send after a failure.
    fn refuse(&self) -> Result<(), Error> {
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Wire length of `batch` if it goes out as one ring message unsplit.
    fn one_message(&self, batch: &[Out]) -> Option<usize> {
        let mut total = 0usize;
        for f in batch {
            if f.kind == Kind::Data && f.payload.len() > self.chunk {
                return None;
            }
            total += f.wire_len();
        }
        let fits = total <= self.batch || (batch.len() == 1 && total <= self.max_msg);
        (fits && !batch.is_empty()).then_some(total)
    }

    /// Writes `batch` as one ring message now, without waiting.
    ///
    /// `Ok(false)` (nothing written) when it would have to wait: another
    /// task holds the writer, the ring is full, or the batch needs several
    /// messages. Then use [`FrameWriter::send`].
    pub(crate) fn try_send(&self, batch: &[Out]) -> Result<bool, Error> {
        self.refuse()?;
        let Some(total) = self.one_message(batch) else {
            return Ok(false);
        };
        let zc = self.zero_copy;
        if let Some(direct) = &self.direct {
            // A writer holds or waits for the lease: keep its turn.
            if self.lane.leased.load(Ordering::Acquire) {
                return Ok(false);
            }
            let r = direct.try_send_with(total, &mut |slot: &mut [u8]| fill_slot(batch, zc, slot));
            return self.check(r);
        }
        let mut held = match self.lane.st.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(false),
        };
        // Leased to an async writer mid-send (whenever writers wait in line,
        // the sender is out of the lane: a returned lease passes straight to
        // the first of them).
        let Some(tx) = held.tx.as_mut() else {
            return Ok(false);
        };
        let r = tx.try_send_with(total, &mut |slot: &mut [u8]| fill_slot(batch, zc, slot));
        drop(held);
        self.check(r)
    }

    /// Sends a batch of frames as one ring message when it fits, splitting
    /// DATA payloads larger than the chunk size into several frames (and
    /// messages), so that one large message never starves other calls.
    pub(crate) async fn send(&self, batch: Batch) -> Result<(), Error> {
        if batch.is_empty() || self.try_send(&batch)? {
            return Ok(());
        }
        let max_msg = self.max_msg;
        let mut pending = Batch::new();
        let mut pending_len = 0usize;
        for out in batch {
            let mut out = out;
            loop {
                if out.kind == Kind::Data && out.payload.len() > self.chunk {
                    let head = out.payload.split_to(self.chunk);
                    let piece = Out::new(Kind::Data, 0, out.call_id, head);
                    self.push(&mut pending, &mut pending_len, piece, max_msg)
                        .await?;
                    continue;
                }
                self.push(&mut pending, &mut pending_len, out, max_msg)
                    .await?;
                break;
            }
        }
        if !pending.is_empty() {
            self.write_message(&pending, pending_len).await?;
        }
        Ok(())
    }

    async fn push(
        &self,
        pending: &mut Batch,
        len: &mut usize,
        out: Out,
        max_msg: usize,
    ) -> Result<(), Error> {
        let l = out.wire_len();
        if l > max_msg {
            return Err(Error::MessageTooLarge {
                len: l,
                max: max_msg,
            });
        }
        if *len + l > self.batch && !pending.is_empty() {
            self.write_message(pending, *len).await?;
            pending.clear();
            *len = 0;
        }
        *len += l;
        pending.push(out);
        Ok(())
    }

    async fn write_message(&self, frames: &[Out], total: usize) -> Result<(), Error> {
        let zc = self.zero_copy;
        let mut fill = |slot: &mut [u8]| fill_slot(frames, zc, slot);
        let mut lease = self.lease().await;
        self.refuse()?;
        let Some(tx) = lease.as_mut().and_then(|l| l.tx.as_mut()) else {
            return Err(Error::Closed("the frame writer lost its sender"));
        };
        let r = tx.send_with(total, &mut fill).await.map(|()| true);
        self.check(r).map(drop)
    }

    /// Takes the sender out of the lane, waiting in line (first come,
    /// first served) while another async writer holds it. `None`: the
    /// sender is gone (it cannot be: every lease gives it back).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while in line, it leaves the line, and a sender
    /// already handed to it passes on to the next writer; the lease it
    /// returns gives the sender back when dropped.
    async fn lease(&self) -> Option<Lease<'_>> {
        let lane = &*self.lane;
        let rx = {
            let mut st = lane.lock();
            lane.leased.store(true, Ordering::Release);
            if st.waiters.is_empty()
                && let Some(tx) = st.tx.take()
            {
                return Some(Lease { lane, tx: Some(tx) });
            }
            let (w, rx) = oneshot::channel();
            st.waiters.push_back(w);
            rx
        };
        let mut line = InLine { lane, rx };
        let tx = (&mut line.rx).await.ok()?;
        Some(Lease { lane, tx: Some(tx) })
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::pipe::{MsgRx, mem_pair};

    /// A 200-byte pipe, its writer and the far end's receiver.
    fn lane() -> (FrameWriter, Box<dyn MsgRx>) {
        let ((tx, _), (_, rx)) = mem_pair(200);
        (FrameWriter::new(tx, true, 1 << 20), rx)
    }

    /// One DATA frame `wire` bytes long on the wire.
    fn frame(wire: usize) -> Batch {
        smallvec::smallvec![Out::new(Kind::Data, 0, 1, vec![7u8; wire - HEADER_LEN])]
    }

    fn poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    /// The length of the next message the far end has.
    fn next_len(rx: &mut Box<dyn MsgRx>) -> usize {
        let mut len = 0;
        let mut f = |m: &[u8]| len = m.len();
        let mut recv = rx.recv_with(&mut f);
        assert!(matches!(poll(recv.as_mut()), Poll::Ready(Ok(true))));
        drop(recv);
        len
    }

    /// Writers waiting for ring space keep their order, and while one waits in
    /// line the synchronous path writes nothing, even where it would fit: small
    /// frames cannot starve a large one (as with the async mutex this replaced).
    #[test]
    fn writers_in_line_keep_their_order() {
        let (w, mut rx) = lane();
        assert!(w.try_send(&frame(150)).expect("room"));
        // Needs 150 of the 50 left: takes the sender and waits for space.
        let mut a = Box::pin(w.send(frame(150)));
        assert!(poll(a.as_mut()).is_pending());
        // In line behind it.
        let mut b = Box::pin(w.send(frame(20)));
        assert!(poll(b.as_mut()).is_pending());
        assert!(
            !w.try_send(&frame(20)).expect("no error"),
            "20 bytes fit, but a writer is in line"
        );
        assert_eq!(next_len(&mut rx), 150);
        assert!(matches!(poll(a.as_mut()), Poll::Ready(Ok(()))));
        assert!(matches!(poll(b.as_mut()), Poll::Ready(Ok(()))));
        assert_eq!(next_len(&mut rx), 150);
        assert_eq!(next_len(&mut rx), 20);
        assert!(w.try_send(&frame(20)).expect("room"), "the sender is back");
    }

    /// A writer dropped in line loses nothing: neither while it waits, nor after
    /// the sender was handed to it and before it ran to take it.
    #[test]
    fn a_writer_dropped_in_line_passes_the_sender_on() {
        for handed in [false, true] {
            let (w, mut rx) = lane();
            assert!(w.try_send(&frame(150)).expect("room"));
            let mut a = Box::pin(w.send(frame(150)));
            assert!(poll(a.as_mut()).is_pending());
            let mut b = Some(Box::pin(w.send(frame(20))));
            assert!(poll(b.as_mut().expect("b").as_mut()).is_pending());
            if !handed {
                b = None;
            }
            assert_eq!(next_len(&mut rx), 150);
            // A writes and gives the sender to B (if B is still in line).
            assert!(matches!(poll(a.as_mut()), Poll::Ready(Ok(()))));
            assert_eq!(next_len(&mut rx), 150);
            if handed {
                assert!(!w.try_send(&frame(20)).expect("no error"), "B holds it");
                b = None;
            }
            assert!(
                w.try_send(&frame(20)).expect("room"),
                "the sender came back (handed to B first: {handed})"
            );
            assert_eq!(next_len(&mut rx), 20);
            assert!(b.is_none());
        }
    }
}
