//! Shared frame writer: many call tasks, one send ring.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tokio::sync::Mutex;
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

use crate::Error;
use crate::frame::{self, HEADER_LEN, Kind};
use crate::pipe::MsgTx;

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
/// Two paths: [`FrameWriter::try_send`] is synchronous (an uncontended
/// `try_lock`, the ring's own reserve/commit, no future, no task hop) and is
/// what almost every frame takes; [`FrameWriter::send`] tries it first and
/// only queues on the async lock and waits for ring space when the ring is
/// full, another task is mid-write, or the batch needs several messages.
///
/// A send that fails on the ring (the peer corrupted it, e.g. a head word
/// past our tail, or the peer is gone) fails the whole connection: the
/// error is logged at warn once, every later send fails at once, and
/// [`FrameWriter::failed`] completes so that the connection's owner closes
/// it and fails its calls. Only a frame too large for any message is a
/// per-call error.
#[derive(Clone)]
pub(crate) struct FrameWriter {
    tx: Arc<Mutex<Box<dyn MsgTx>>>,
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
        let tx = match self.tx.try_lock() {
            Ok(tx) => tx.state(),
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
            tx: Arc::new(Mutex::new(tx)),
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
        let Ok(mut tx) = self.tx.try_lock() else {
            return Ok(false);
        };
        let zc = self.zero_copy;
        let r = tx.try_send_with(total, &mut |slot: &mut [u8]| fill_slot(batch, zc, slot));
        self.check(r)
    }

    /// Sends a batch of frames as one ring message when it fits, splitting
    /// DATA payloads larger than the chunk size into several frames (and
    /// messages), so that one large message never starves other calls.
    pub(crate) async fn send(&self, batch: Vec<Out>) -> Result<(), Error> {
        if batch.is_empty() || self.try_send(&batch)? {
            return Ok(());
        }
        let max_msg = self.max_msg;
        let mut pending: Vec<Out> = Vec::new();
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
        pending: &mut Vec<Out>,
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
        let mut tx = self.tx.lock().await;
        self.refuse()?;
        let r = tx.send_with(total, &mut fill).await.map(|()| true);
        self.check(r).map(drop)
    }
}
