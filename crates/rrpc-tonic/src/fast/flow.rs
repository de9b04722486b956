//! Per-call flow control on the fast path: HTTP/2's stream windows, on rings.
//!
//! Each call has a [`CallFlow`] on each end: the credit the peer granted
//! (a semaphore of bytes, so a sender waiting for credit is woken by the
//! WINDOW_UPDATE that brings it). Its receive window, what the peer may
//! still send before this end hands bytes back, is kept by the state
//! machines of [`super::proto`], with the rules of [`super::proto::flow`];
//! a receiving body hands bytes back through its [`Credit`]. The
//! accounting unit is [`frame::data_charge`]: a non-empty DATA frame's
//! wire size.
//!
//! The connection's reader never waits for a call: DATA goes into the
//! call's queue at once, and the window bounds that queue, so a call whose
//! consumer stopped reading stalls only its own sender, never the
//! connection's other calls.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use tokio::sync::Semaphore;

use super::proto::flow::{Unacked, check_grant};
use super::proto::server::{CallKey, Note};
use super::writer::{Batch, FrameWriter, Out};
use crate::Error;
use crate::frame::{self, FrameError, HEADER_LEN, Kind};

/// One call's send credit, shared by the connection's reader (which
/// applies the peer's grants) and the call's sender (which waits for it).
/// The receive windows are the state machines' ([`super::proto`]).
#[derive(Debug)]
pub(crate) struct CallFlow {
    /// Bytes this end may still send (granted by the peer).
    send: Semaphore,
}

impl CallFlow {
    /// `credit` bytes of send credit (the peer's announced receive window).
    pub(crate) fn new(credit: u32) -> Arc<CallFlow> {
        Arc::new(CallFlow {
            send: Semaphore::new(credit as usize),
        })
    }

    /// `flow` made afresh with `credit` bytes of send credit, in place
    /// (no allocation) if nobody else holds it, else a new one. A connection keeps the flows of calls that ended for its
    /// next calls: an `Arc` and its free were ~250 instructions a call on
    /// each end under callgrind.
    pub(crate) fn renew(mut flow: Arc<CallFlow>, credit: u32) -> Arc<CallFlow> {
        let Some(f) = Arc::get_mut(&mut flow) else {
            return CallFlow::new(credit);
        };
        *f = CallFlow {
            send: Semaphore::new(credit as usize),
        };
        flow
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
        let p = self
            .send
            .acquire_many(min32)
            .await
            .map_err(|_| Error::Closed("call ended while waiting for flow-control window"))?;
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

/// The server's call tasks' [`Note`]s to their connection's driver, in
/// the order sent: a queue under a short lock, a flag the driver reads
/// without it (its look at the notes before each turn costs one load when
/// there are none), and the driver's waker. What tokio's unbounded
/// channel did here, for ~360 instructions a call less on the fast path
/// (its block list, semaphore and cooperative budget).
///
/// A note sent from inside the driver's own turn (a unary handler polled
/// inline releases its place) still wakes the driver's task, as the
/// channel did: not waking it was measured, and cost ~700 instructions a
/// call more (the task, found idle, parked with a yield instead).
pub(crate) fn notes() -> (NoteTx, NoteRx) {
    let q = Arc::new(NoteQueue::default());
    (NoteTx(q.clone()), NoteRx(q))
}

#[derive(Debug, Default)]
struct NoteQueue {
    queue: Mutex<VecDeque<Note>>,
    /// The queue holds a note (changed under `queue`'s lock; read
    /// without it by the driver's quick look).
    any: AtomicBool,
    /// The driver's waker, from its last wait.
    waker: AtomicWaker,
    /// The driver is gone: notes are dropped (no unbounded queue).
    closed: AtomicBool,
}

/// A call task's end of [`notes`] (cloneable).
#[derive(Debug, Clone)]
pub(crate) struct NoteTx(Arc<NoteQueue>);

/// The driver's end of [`notes`].
#[derive(Debug)]
pub(crate) struct NoteRx(Arc<NoteQueue>);

impl NoteTx {
    /// Queues `note` and wakes the driver if it waits. Dropped once the
    /// driver is gone.
    pub(crate) fn send(&self, note: Note) {
        let q = &self.0;
        if q.closed.load(Ordering::Acquire) {
            return;
        }
        {
            let mut queue = q.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back(note);
            q.any.store(true, Ordering::Release);
        }
        q.waker.wake();
    }
}

impl NoteRx {
    /// The next note, if one was sent.
    pub(crate) fn try_recv(&mut self) -> Option<Note> {
        let q = &self.0;
        if !q.any.load(Ordering::Acquire) {
            return None;
        }
        let mut queue = q.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let note = queue.pop_front();
        if queue.is_empty() {
            q.any.store(false, Ordering::Release);
        }
        note
    }

    /// The next note, or `Pending` with the task's waker kept until a note
    /// comes.
    ///
    /// # Cancel safety
    /// Cancel safe: a note is taken only in the poll that returns it.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Note> {
        if let Some(n) = self.try_recv() {
            return Poll::Ready(n);
        }
        self.0.waker.register(cx.waker());
        match self.try_recv() {
            Some(n) => Poll::Ready(n),
            None => Poll::Pending,
        }
    }
}

impl Drop for NoteRx {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// What a receiving body needs to hand consumed bytes back to the peer.
#[derive(Debug)]
pub(crate) struct Credit {
    writer: FrameWriter,
    id: u32,
    /// Server: the bytes the body read and did not hand back yet, and
    /// where the connection's state machine, which owns the call's receive
    /// window, learns of the bytes handed back (before the WINDOW_UPDATE
    /// is written, so before the peer can use them). Client: none, the
    /// call table counts them as the body takes them out
    /// ([`super::proto::client::Call::pop_event`]).
    server: Option<(Unacked, NoteTx, CallKey)>,
}

impl Credit {
    /// Server: the credit of call `key` whose receive window is `window`.
    pub(crate) fn server(writer: FrameWriter, key: CallKey, window: u32, notes: NoteTx) -> Credit {
        Credit {
            writer,
            id: key.id,
            server: Some((Unacked::new(window), notes, key)),
        }
    }

    /// Client: the credit of call `id`.
    pub(crate) fn client(writer: FrameWriter, id: u32) -> Credit {
        Credit {
            writer,
            id,
            server: None,
        }
    }

    /// Server: the application read a DATA payload of `len` bytes: send a
    /// WINDOW_UPDATE when due.
    pub(crate) fn consumed(&mut self, len: usize) {
        let Some((unacked, notes, key)) = &mut self.server else {
            return;
        };
        let Some(inc) = unacked.consumed(len) else {
            return;
        };
        notes.send(Note::Returned(*key, inc));
        self.send_update(inc);
    }

    /// Sends a WINDOW_UPDATE of `inc` bytes. Never waits: when the ring
    /// is busy the update goes out from a small task.
    pub(crate) fn send_update(&self, inc: u32) {
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
                        if let Err(e) = w.send(smallvec::smallvec![out]).await {
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
    batch: Batch,
    on_wait: impl Fn() -> G,
) -> Result<(), Error> {
    if try_take_batch(writer, flow, &batch) {
        return writer.send(batch).await;
    }
    let mut pending = Batch::new();
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

    #[tokio::test]
    async fn a_renewed_flow_has_its_whole_credit_and_is_open_again() {
        let mut f = CallFlow::new(100);
        assert!(f.try_take(60));
        f.close();
        let before = Arc::as_ptr(&f);
        f = CallFlow::renew(f, 100);
        // The same allocation, made afresh.
        assert_eq!(Arc::as_ptr(&f), before);
        assert!(f.try_take(100));
        assert!(!f.try_take(1));
        f.granted(5).unwrap();
        assert_eq!(f.take(5, 5).await.unwrap(), 5);
    }

    #[test]
    fn a_flow_held_elsewhere_is_not_renewed() {
        let f = CallFlow::new(100);
        assert!(f.try_take(60));
        let held = f.clone();
        let renewed = CallFlow::renew(f, 100);
        assert!(!Arc::ptr_eq(&renewed, &held));
        assert!(renewed.try_take(100));
        // The holder's credit is what it was.
        assert!(!held.try_take(41));
        assert!(held.try_take(40));
    }

    #[test]
    fn grants_are_capped_at_the_largest_window() {
        let f = CallFlow::new(frame::MAX_WINDOW - 10);
        f.granted(10).unwrap();
        assert!(f.granted(1).is_err());
    }

    struct Count(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Notes come out in the order sent; a waiting driver is woken by
    /// the first, and once the driver is gone notes are dropped.
    #[test]
    fn notes_come_in_order_and_wake_a_waiting_driver() {
        let key = CallKey::for_tests;
        let (tx, mut rx) = notes();
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        tx.send(Note::Released(key(1)));
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the waiting driver woken"
        );
        tx.clone().send(Note::Finished(key(1)));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken once");
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Note::Released(key(1))));
        assert_eq!(rx.try_recv(), Some(Note::Finished(key(1))));
        assert_eq!(rx.try_recv(), None);
        // Not waiting: a note is kept for the next look.
        tx.send(Note::Returned(key(2), 7));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "nobody waits");
        assert_eq!(rx.try_recv(), Some(Note::Returned(key(2), 7)));
        assert!(rx.poll_recv(&mut cx).is_pending());
        tx.send(Note::Finished(key(3)));
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "woken again");
        assert_eq!(rx.try_recv(), Some(Note::Finished(key(3))));
        drop(rx);
        tx.send(Note::Finished(key(2)));
        assert!(tx.0.queue.lock().unwrap().is_empty(), "dropped: no driver");
    }

    #[tokio::test]
    async fn a_sender_waits_for_credit_and_a_grant_wakes_it() {
        let f = CallFlow::new(10);
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
