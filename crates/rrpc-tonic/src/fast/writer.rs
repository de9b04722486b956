//! The fast path's frame writer: frames batched into ring messages and
//! written straight into the ring slot, over the connection's [`Link`].

use bytes::Bytes;
use tokio_util::sync::{WaitForCancellationFuture, WaitForCancellationFutureOwned};

use crate::Error;
use crate::conn::Link;
use crate::frame::{self, HEADER_LEN, Kind};

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
/// every frame takes: the connection's one short step under the ring's own
/// lock (reserve, fill, commit, publish: [`Link::try_send_with`]), no
/// future, no task hop. [`FrameWriter::send`] tries it first and waits in
/// the link's line (first come, first served, holding no lock) only when
/// the ring is full, another writer waits, or the batch needs several
/// messages.
///
/// A send that fails on the ring fails the whole connection, recorded
/// once by the link ([`Link`] docs, "Failure"): every later send fails at
/// once, and [`FrameWriter::failed`] completes so that the connection's
/// owner closes it and fails its calls. Only a frame too large for any
/// message is a per-call error.
#[derive(Clone)]
pub(crate) struct FrameWriter {
    link: Link,
    zero_copy: bool,
    /// Largest ring message.
    max_msg: usize,
    /// Frames are batched into ring messages of at most this many bytes
    /// ([`Link::preferred_message`]).
    batch: usize,
    /// Largest DATA payload per frame.
    pub(crate) chunk: usize,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameWriter")
            .field("zero_copy", &self.zero_copy)
            .field("chunk", &self.chunk)
            .field("link", &self.link)
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
    pub(crate) fn new(link: Link, zero_copy: bool, max_chunk: usize) -> Self {
        let max_msg = link.max_message();
        // Batches and chunks the size the link carries best (a self-sizing
        // ring then stays at the size its cores' caches hold); one frame
        // that cannot be split may still go up to `max_msg`.
        let batch = link
            .preferred_message()
            .clamp(HEADER_LEN + 1, max_msg.max(HEADER_LEN + 1));
        let chunk = max_chunk.min(batch.saturating_sub(HEADER_LEN)).max(1);
        FrameWriter {
            link,
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
        self.link.failed()
    }

    /// [`FrameWriter::failed`] as a future that owns its token: a loop
    /// that races it on every message keeps one, pinned, rather than
    /// making a new one (a waiter registered and removed) each time.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub(crate) fn failed_owned(&self) -> WaitForCancellationFutureOwned {
        self.link.failed_owned()
    }

    /// Why the connection failed, once it did: the first error, shared
    /// ([`Error::Failed`]; [`Error::is_peer_gone`] when the peer left).
    pub(crate) fn failure(&self) -> Option<Error> {
        self.link.failure()
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
    /// `Ok(false)` (nothing written) when it would have to wait: the ring
    /// is full, another writer waits for room, or the batch needs several
    /// messages. Then use [`FrameWriter::send`].
    pub(crate) fn try_send(&self, batch: &[Out]) -> Result<bool, Error> {
        let Some(total) = self.one_message(batch) else {
            if let Some(e) = self.link.failure() {
                return Err(e);
            }
            return Ok(false);
        };
        let zc = self.zero_copy;
        self.link
            .try_send_with(total, &mut |slot: &mut [u8]| fill_slot(batch, zc, slot))
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
        self.link.send_with(total, &mut fill).await
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::conn::{MsgRx, mem_pair};

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
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            rx.poll_recv_with(&mut cx, &mut f),
            Poll::Ready(Ok(true))
        ));
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
        assert!(w.try_send(&frame(20)).expect("room"), "the line is empty");
    }

    /// A writer dropped in line loses nothing: neither while it waits, nor after
    /// it came to the head of the line and before it ran to write.
    #[test]
    fn a_writer_dropped_in_line_lets_the_next_one_on() {
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
            // A writes and leaves the line: B (if still in line) is its head.
            assert!(matches!(poll(a.as_mut()), Poll::Ready(Ok(()))));
            assert_eq!(next_len(&mut rx), 150);
            if handed {
                assert!(!w.try_send(&frame(20)).expect("no error"), "B is in line");
                b = None;
            }
            assert!(
                w.try_send(&frame(20)).expect("room"),
                "the line is empty again (B at its head first: {handed})"
            );
            assert_eq!(next_len(&mut rx), 20);
            assert!(b.is_none());
        }
    }
}
