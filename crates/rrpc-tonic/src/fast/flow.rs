//! Per-call flow control on the fast path: HTTP/2's stream windows, on rings.
//!
//! Each call has a [`CallFlow`] on each end. Its send side is the credit the
//! peer granted (a semaphore of bytes, so a sender waiting for credit is
//! woken by the WINDOW_UPDATE that brings it); its receive side is what the
//! peer may still send before this end hands bytes back. The accounting
//! unit is [`frame::data_charge`]: a non-empty DATA frame's wire size.
//!
//! The connection's reader never waits for a call: DATA goes into the
//! call's queue at once, and the window bounds that queue, so a call whose
//! consumer stopped reading stalls only its own sender, never the
//! connection's other calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use tokio::sync::Semaphore;

use super::proto::flow::{Unacked, check_grant};
use super::proto::server::{CallKey, Note};
use super::writer::{FrameWriter, Out};
use crate::Error;
use crate::frame::{self, FrameError, HEADER_LEN, Kind};

/// One call's windows, shared by the connection's reader, the call's
/// sender and the call's consumer.
#[derive(Debug)]
pub(crate) struct CallFlow {
    /// Bytes this end may still send (granted by the peer).
    send: Semaphore,
    /// Bytes the peer may still send before our next WINDOW_UPDATE
    /// (client; the server's reader keeps its calls' receive windows in
    /// its state machine, [`super::proto::server`]).
    recv_left: AtomicI64,
}

impl CallFlow {
    /// A call's windows: `peer_window` bytes of send credit (the peer's
    /// announced receive window), `our_window` bytes the peer may send.
    pub(crate) fn new(peer_window: u32, our_window: u32) -> Arc<CallFlow> {
        Arc::new(CallFlow {
            send: Semaphore::new(peer_window as usize),
            recv_left: AtomicI64::new(i64::from(our_window)),
        })
    }

    /// Reader: a DATA frame with `payload_len` bytes arrived for this call.
    ///
    /// # Errors
    /// The peer sent beyond the window it was granted.
    pub(crate) fn received(&self, payload_len: usize) -> Result<(), FrameError> {
        let c = frame::data_charge(payload_len) as i64;
        if c == 0 {
            return Ok(());
        }
        let before = self.recv_left.fetch_sub(c, Ordering::AcqRel);
        if before < c {
            return Err(FrameError::Invalid(
                "DATA beyond the call's flow-control window",
            ));
        }
        Ok(())
    }

    /// Reader: the peer granted `inc` more bytes (a WINDOW_UPDATE).
    ///
    /// # Errors
    /// The credit would exceed [`frame::MAX_WINDOW`] (HTTP/2's
    /// FLOW_CONTROL_ERROR for an overflowing window).
    pub(crate) fn granted(&self, inc: u32) -> Result<(), FrameError> {
        check_grant(self.send.available_permits() as u64, inc)?;
        self.send.add_permits(inc as usize);
        Ok(())
    }

    /// Consumer: `inc` bytes were handed back (a WINDOW_UPDATE about to
    /// be sent; the receive side is opened first, so the peer may use the
    /// increment as soon as it arrives).
    pub(crate) fn reopen(&self, inc: u32) {
        self.recv_left.fetch_add(i64::from(inc), Ordering::AcqRel);
    }

    /// Sender: takes `n` bytes of credit if they are all there now.
    pub(crate) fn try_take(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        match u32::try_from(n)
            .ok()
            .and_then(|n| self.send.try_acquire_many(n).ok())
        {
            Some(p) => {
                p.forget();
                true
            }
            None => false,
        }
    }

    /// Sender: takes between `min` and `want` bytes of credit (`min <= want`),
    /// waiting until `min` are there.
    ///
    /// # Errors
    /// The call or its connection ended ([`CallFlow::close`]).
    ///
    /// # Cancel safety
    /// Cancel safe: credit is taken only in the poll that returns it.
    pub(crate) async fn take(&self, min: usize, want: usize) -> Result<usize, Error> {
        let min32 = u32::try_from(min).unwrap_or(u32::MAX);
        let p =
            self.send.acquire_many(min32).await.map_err(|_| {
                Error::Rings("call ended while waiting for flow-control window".into())
            })?;
        p.forget();
        let extra = self.send.available_permits().min(want - min);
        if extra > 0
            && let Ok(p) = self.send.try_acquire_many(extra as u32)
        {
            p.forget();
            return Ok(min + extra);
        }
        Ok(min)
    }

    /// The call ended: a sender waiting for credit fails.
    pub(crate) fn close(&self) {
        self.send.close();
    }
}

/// What a receiving body needs to hand consumed bytes back to the peer.
#[derive(Debug, Clone)]
pub(crate) struct Credit {
    pub(crate) flow: Arc<CallFlow>,
    pub(crate) writer: FrameWriter,
    pub(crate) id: u32,
    /// Server: where the connection's state machine, which owns the
    /// call's receive window, learns of the bytes handed back (before the
    /// WINDOW_UPDATE is written, so before the peer can use them).
    pub(crate) notes: Option<(tokio::sync::mpsc::UnboundedSender<Note>, CallKey)>,
    /// Bytes the consumer read and not handed back yet (the body is the
    /// only consumer: plain, not shared).
    pub(crate) unacked: Unacked,
}

impl Credit {
    /// The credit of call `id` whose receive window is `window` bytes.
    pub(crate) fn new(
        flow: Arc<CallFlow>,
        writer: FrameWriter,
        id: u32,
        window: u32,
        notes: Option<(tokio::sync::mpsc::UnboundedSender<Note>, CallKey)>,
    ) -> Credit {
        Credit {
            flow,
            writer,
            id,
            notes,
            unacked: Unacked::new(window),
        }
    }
}

impl Credit {
    /// The application read a DATA payload of `len` bytes: send a
    /// WINDOW_UPDATE when due. Never waits: when the ring is busy the
    /// update goes out from a small task.
    pub(crate) fn consumed(&mut self, len: usize) {
        let Some(inc) = self.unacked.consumed(len) else {
            return;
        };
        match &self.notes {
            Some((notes, key)) => {
                let _ = notes.send(Note::Returned(*key, inc));
            }
            None => self.flow.reopen(inc),
        }
        let out = Out::new(
            Kind::WindowUpdate,
            0,
            self.id,
            Bytes::copy_from_slice(&frame::window_update_payload(inc)),
        );
        match self.writer.try_send(std::slice::from_ref(&out)) {
            Ok(true) => {}
            // A failed send failed the connection; the writer logged it.
            Err(_) => {}
            Ok(false) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let w = self.writer.clone();
                    rt.spawn(async move {
                        if let Err(e) = w.send(vec![out]).await {
                            tracing::debug!("rrpc: window update not sent: {e}");
                        }
                    });
                }
            }
        }
    }
}

/// Whether `batch` can go out at once: every DATA frame fits one chunk and
/// the call has credit for all of them (taken if so).
pub(crate) fn try_take_batch(writer: &FrameWriter, flow: &CallFlow, batch: &[Out]) -> bool {
    let mut need = 0usize;
    for o in batch {
        if o.kind == Kind::Data {
            if o.payload.len() > writer.chunk {
                return false;
            }
            need += frame::data_charge(o.payload.len());
        }
    }
    flow.try_take(need)
}

/// Sends one call's `batch` within its window: at once when the credit
/// covers it, else piece by piece, each DATA piece as large as the credit
/// and the chunk size allow, waiting for WINDOW_UPDATEs in between (frames
/// before a wait are written first, so headers never wait behind data).
///
/// `on_wait` is called when the sender starts waiting for credit; what it
/// returns is dropped when the wait ends, also when the send is cancelled
/// (the client uses it to keep its connection's receive side running).
///
/// # Cancel safety
/// Not cancel safe: a cancelled send may have written part of the batch
/// (then the call is abandoned anyway, and CANCEL follows).
pub(crate) async fn send_within_window<G>(
    writer: &FrameWriter,
    flow: &CallFlow,
    batch: Vec<Out>,
    on_wait: impl Fn() -> G,
) -> Result<(), Error> {
    if try_take_batch(writer, flow, &batch) {
        return writer.send(batch).await;
    }
    let mut pending: Vec<Out> = Vec::new();
    for mut out in batch {
        if out.kind != Kind::Data || out.payload.is_empty() {
            pending.push(out);
            continue;
        }
        while !out.payload.is_empty() {
            let piece = writer.chunk.min(out.payload.len());
            let want = HEADER_LEN + piece;
            // Take what is there now (at least a header and one byte); this
            // call's sender is the only one taking its credit.
            let avail = flow.send.available_permits().min(want);
            let mut got = 0;
            if avail > HEADER_LEN && flow.try_take(avail) {
                got = avail;
            }
            if got == 0 {
                if !pending.is_empty() {
                    writer.send(std::mem::take(&mut pending)).await?;
                }
                let waiting = on_wait();
                let r = flow.take(HEADER_LEN + 1, want).await;
                drop(waiting);
                got = r?;
            }
            // `got <= want`, so the piece never exceeds the payload.
            let data = out.payload.split_to(got - HEADER_LEN);
            let flags = if out.payload.is_empty() { out.flags } else { 0 };
            pending.push(Out::new(Kind::Data, flags, out.call_id, data));
        }
    }
    writer.send(pending).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_window_is_enforced_and_reopened() {
        let f = CallFlow::new(1 << 16, 1024);
        // 1024 bytes of window: frames of 500 and 501 payload bytes do not fit.
        f.received(500).unwrap();
        assert!(f.received(501).is_err(), "512 + 513 > 1024");
        let f = CallFlow::new(1 << 16, 1024);
        f.received(500).unwrap(); // 512 charged
        f.received(0).unwrap(); // empty frames are free
        f.reopen(512);
        f.received(500).unwrap();
        f.received(499).unwrap(); // 512 + 511 = 1023 <= 1024
        assert!(f.received(1).is_err());
    }

    #[test]
    fn grants_are_capped_at_the_largest_window() {
        let f = CallFlow::new(frame::MAX_WINDOW - 10, 4096);
        f.granted(10).unwrap();
        assert!(f.granted(1).is_err());
    }

    #[tokio::test]
    async fn a_sender_waits_for_credit_and_a_grant_wakes_it() {
        let f = CallFlow::new(10, 4096);
        assert!(f.try_take(10));
        assert!(!f.try_take(1));
        let f2 = f.clone();
        let t = tokio::spawn(async move { f2.take(13, 100).await });
        tokio::task::yield_now().await;
        assert!(!t.is_finished());
        f.granted(50).unwrap();
        assert_eq!(t.await.unwrap().unwrap(), 50);
        let f2 = f.clone();
        let t = tokio::spawn(async move { f2.take(13, 100).await });
        tokio::task::yield_now().await;
        f.close();
        assert!(t.await.unwrap().is_err(), "a closed call fails the waiter");
    }
}
