//! The fast-path client's demultiplexer: the table of calls and their
//! receive slots, and the leader/follower receive that reads the pipe and
//! routes each frame to its call (the call itself is in `client`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::Error;
use crate::fast::Event;
use crate::fast::flow::CallFlow;
use crate::fast::proto::client as proto;
use crate::frame::FrameError;
use crate::pipe::{BoxFut, MsgRx};
use tokio::sync::oneshot;

/// The pseudo call id of the connection's fallback reader task (never a
/// call's: [`proto::Client::open`] skips it).
pub(super) const FALLBACK: u32 = 0;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent (single map/queue
    // operations), so a poisoned lock still guards valid data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the driver keeps of one call (its events and receive window are
/// in the call table, [`proto::Call`]).
#[derive(Debug)]
pub(super) struct Slot {
    /// The waiting task, if any.
    pub(super) waker: Option<Waker>,
    /// The call's send credit.
    pub(super) flow: Arc<CallFlow>,
}

impl Slot {
    pub(super) fn new(flow: Arc<CallFlow>) -> Slot {
        Slot { waker: None, flow }
    }
}

#[derive(Debug)]
pub(super) struct Table {
    /// The call table and the connection's protocol state: call ids,
    /// events, receive windows, GOAWAY, why it closed.
    pub(super) conn: proto::Client<Slot, oneshot::Sender<()>>,
    /// The call whose waker the pending receive future holds.
    pub(super) driver: Option<u32>,
    /// Request senders waiting for window: the WINDOW_UPDATE they need
    /// must be received even when no call waits for its response.
    pub(super) credit_waiters: usize,
    /// Waker of the fallback reader task.
    pub(super) fallback: Option<Waker>,
    /// The fallback reads once although nobody waits ([`Shared::nudge_idle_reader`]).
    pub(super) idle_read: bool,
}

impl Table {
    /// The table of a connection whose calls announce `recv_window` bytes,
    /// at most `max_calls` of them open at once.
    pub(super) fn new(recv_window: u32, max_calls: usize) -> Table {
        Table {
            conn: proto::Client::new(recv_window, max_calls),
            driver: None,
            credit_waiters: 0,
            fallback: None,
            idle_read: false,
        }
    }

    /// Whether a call other than `id` waits for an event.
    pub(super) fn others_wait(&self, id: u32) -> bool {
        self.conn.calls().any(|(k, s)| k != id && s.waker.is_some())
    }

    /// Call `id` stops waiting. If it was the one whose waker the pending
    /// receive holds (or nobody's is), make sure somebody keeps receiving
    /// while other calls wait: the fallback reader takes over.
    pub(super) fn handoff(&mut self, id: u32) {
        if self.driver.is_some() && self.driver != Some(id) {
            return;
        }
        self.driver = None;
        let waiting = self.credit_waiters > 0 || self.others_wait(id);
        if waiting
            && id != FALLBACK
            && let Some(w) = self.fallback.take()
        {
            w.wake();
        }
    }
}

/// What one receive produced: the receiver back, its result, the decoded
/// events, a GOAWAY seen, a protocol violation.
pub(super) type RecvOut = (
    Box<dyn MsgRx>,
    Result<bool, Error>,
    Vec<(u32, Event)>,
    bool,
    Option<FrameError>,
);

/// The most events whose buffer [`RxState`] keeps between receives.
const KEPT_EVENTS: usize = 64;

#[derive(Default)]
pub(super) struct RxState {
    /// The receiver while no receive is in flight (`None` once the connection ended).
    pub(super) rx: Option<Box<dyn MsgRx>>,
    /// The receive in flight, polled by whichever call drives.
    pub(super) fut: Option<BoxFut<'static, RecvOut>>,
    /// The event buffer between receives (empty; kept for its allocation).
    pub(super) events: Vec<(u32, Event)>,
}

pub(super) struct Shared {
    pub(super) table: Mutex<Table>,
    pub(super) rx: Mutex<RxState>,
    /// The server's receive window per call: our initial send credit.
    pub(super) peer_window: u32,
    /// No new calls should start here: the connection closed, the server
    /// said GOAWAY, or the side channel saw the peer leave. Calls in
    /// flight go on (their data may still be in the ring).
    pub(super) retired: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rx = match self.rx.try_lock() {
            Ok(r) => format!(
                "receiver idle {}, receive in flight {}",
                r.rx.is_some(),
                r.fut.is_some()
            ),
            Err(_) => "being polled".to_string(),
        };
        f.debug_struct("Shared")
            .field("table", &self.table)
            .field("rx", &rx)
            .field("retired", &self.retired.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// One receive: the message's events go to `events` (empty; reused from
/// receive to receive, so that a message costs no allocation of its own).
pub(super) fn receive(
    mut rx: Box<dyn MsgRx>,
    mut events: Vec<(u32, Event)>,
) -> BoxFut<'static, RecvOut> {
    Box::pin(async move {
        let mut goaway = false;
        let mut bad = None;
        let r = rx
            .recv_with(&mut |msg: &[u8]| proto::decode(msg, &mut events, &mut goaway, &mut bad))
            .await;
        (rx, r, events, goaway, bad)
    })
}

impl Shared {
    /// Removes call `id` (finished or abandoned).
    pub(super) fn take(&self, id: u32) -> bool {
        let mut t = lock(&self.table);
        let slot = t.conn.remove(id);
        if let Some(s) = &slot {
            // A request sender still waiting for window gives up.
            s.flow.close();
        }
        t.handoff(id);
        slot.is_some()
    }

    /// Delivers one event to a call (a missing call: it was abandoned).
    ///
    /// # Errors
    /// The server broke the call's flow control (sent beyond its window,
    /// or overflowed ours).
    pub(super) fn deliver(&self, t: &mut Table, id: u32, ev: Event) -> Result<(), FrameError> {
        match t.conn.deliver(id, ev)? {
            proto::Delivered::Grant(s, inc) => s.flow.granted(inc),
            proto::Delivered::Queued(s) => {
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
                Ok(())
            }
            proto::Delivered::Dropped => Ok(()),
        }
    }

    /// A request sender starts waiting for window: make sure somebody
    /// receives (the fallback reader, unless a call is receiving already).
    pub(super) fn credit_wait(self: &Arc<Self>) -> CreditWait {
        let mut t = lock(&self.table);
        t.credit_waiters += 1;
        if t.driver.is_none()
            && let Some(w) = t.fallback.take()
        {
            w.wake();
        }
        CreditWait(self.clone())
    }

    /// The connection ended: every call gets `reason`, new calls too.
    pub(super) fn close(&self, t: &mut Table, reason: proto::Reason) {
        for s in t.conn.close(reason) {
            s.flow.close();
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
        self.retired.store(true, Ordering::Release);
        if let Some(w) = t.fallback.take() {
            w.wake();
        }
    }

    /// Next event of call `id` (`None`: the call is gone).
    ///
    /// Leader/follower: there is no reader task in the common case. A call
    /// waiting for its event first looks at its slot; if it is empty and no
    /// other call is receiving right now, it polls the connection's receive
    /// future itself (spinning/sleeping per the poller's mode), dispatches
    /// whatever arrives to the calls' slots, waking their tasks, and returns
    /// as soon as its own event is there. So a unary call's response goes
    /// from the ring to the waiting caller with no task hop. When the call
    /// whose waker the receive holds stops waiting while others still
    /// wait, the fallback reader task takes over ([`Table::handoff`]).
    ///
    /// A DATA event taken out is read by the application: `update` is set
    /// when a WINDOW_UPDATE is due ([`proto::Call::pop_event`]).
    pub(super) fn poll_event(
        &self,
        id: u32,
        cx: &mut Context<'_>,
        update: &mut Option<u32>,
    ) -> Poll<Option<Event>> {
        loop {
            {
                let mut t = lock(&self.table);
                if id == FALLBACK {
                    if t.conn.closed().is_some() && self.rx_gone() {
                        return Poll::Ready(None);
                    }
                    let waiting = t.credit_waiters > 0 || t.others_wait(FALLBACK);
                    if !waiting && t.driver != Some(FALLBACK) && !std::mem::take(&mut t.idle_read) {
                        // Nobody waits: sleep until a handoff.
                        t.fallback = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                    t.fallback = Some(cx.waker().clone());
                } else {
                    let Some(call) = t.conn.call_mut(id) else {
                        t.handoff(id);
                        return Poll::Ready(None);
                    };
                    if let Some(ev) = call.pop_event(update) {
                        t.handoff(id);
                        return Poll::Ready(Some(ev));
                    }
                    match &mut call.io.waker {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        w => *w = Some(cx.waker().clone()),
                    }
                }
            }
            let Ok(mut rxs) = self.rx.try_lock() else {
                // Another call is receiving; it dispatches to us and wakes us.
                return Poll::Pending;
            };
            let fut = match rxs.fut.take() {
                Some(f) => Some(f),
                None => {
                    let events = std::mem::take(&mut rxs.events);
                    rxs.rx.take().map(|rx| receive(rx, events))
                }
            };
            let Some(mut fut) = fut else {
                // The connection ended; `close` queued a Reset for every call.
                drop(rxs);
                let mut t = lock(&self.table);
                if id != FALLBACK && t.conn.call_mut(id).is_some_and(|c| c.has_events()) {
                    continue;
                }
                t.handoff(id);
                return Poll::Ready(None);
            };
            match fut.as_mut().poll(cx) {
                Poll::Pending => {
                    rxs.fut = Some(fut);
                    lock(&self.table).driver = Some(id);
                    return Poll::Pending;
                }
                Poll::Ready((rx, r, mut events, goaway, bad)) => {
                    let mut t = lock(&self.table);
                    t.driver = None;
                    if goaway {
                        self.retired.store(true, Ordering::Release);
                        t.conn.handle_goaway();
                    }
                    let mut bad = bad;
                    for (cid, ev) in events.drain(..) {
                        if let Err(e) = self.deliver(&mut t, cid, ev) {
                            bad.get_or_insert(e);
                        }
                    }
                    // A message of many frames does not leave a large buffer behind.
                    if events.capacity() <= KEPT_EVENTS {
                        rxs.events = events;
                    }
                    let end = t.conn.handle_receive(r.as_ref().map(|b| *b), bad);
                    match end {
                        None => rxs.rx = Some(rx),
                        // Dropping the receiver closes the connection.
                        Some(reason) => self.close(&mut t, reason),
                    }
                    drop(t);
                    drop(rxs);
                }
            }
        }
    }

    /// With nobody receiving, makes the fallback reader read: it consumes
    /// what arrived meanwhile and stays the receiver until a call takes
    /// over. Called when the poller's sizing tick finds unread data in the
    /// ring (`MsgRx::idle_reads`). What an idle client must read is the server's ring-resize
    /// markers: the server's ring shrinks (and gives its memory back) only
    /// once this side has passed its marker (`rrpc_ringbuf` docs, "Rings
    /// that size themselves").
    pub(super) fn nudge_idle_reader(&self) {
        let mut t = lock(&self.table);
        let waiting = t.credit_waiters > 0 || t.others_wait(FALLBACK);
        if t.driver.is_none() && !waiting && t.conn.closed().is_none() {
            t.idle_read = true;
            if let Some(w) = t.fallback.take() {
                w.wake();
            }
        }
    }

    /// A send failed ([`FrameWriter`] docs): close the connection now.
    /// Every call gets the error's code ([`Error::code`]: `Unavailable`
    /// for a gone peer, `DataLoss` for a ring it corrupted) with the
    /// reason, new calls too, and the receiver is dropped (which closes the
    /// connection).
    pub(super) fn fail(&self, e: &Error) {
        {
            let mut t = lock(&self.table);
            if t.conn.closed().is_none() {
                self.close(&mut t, (e.code(), format!("rrpc: {e}")));
            }
        }
        // Not nested in the table lock (`poll_event` takes rx, then table).
        let mut rxs = lock(&self.rx);
        rxs.fut = None;
        rxs.rx = None;
    }

    pub(super) fn rx_gone(&self) -> bool {
        self.rx
            .try_lock()
            .map(|r| r.rx.is_none() && r.fut.is_none())
            .unwrap_or(false)
    }
}

/// Registered while a request sender waits for window ([`Shared::credit_wait`]).
pub(super) struct CreditWait(Arc<Shared>);

impl Drop for CreditWait {
    fn drop(&mut self) {
        lock(&self.0.table).credit_waiters -= 1;
    }
}

/// A call's handle on its receive slot (the response body's source).
#[derive(Debug)]
pub(crate) struct SlotRef {
    pub(super) id: u32,
    pub(super) shared: Arc<Shared>,
}

impl SlotRef {
    /// The call's next event (`update`: [`Shared::poll_event`]).
    pub(crate) fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        update: &mut Option<u32>,
    ) -> Poll<Option<Event>> {
        self.shared.poll_event(self.id, cx, update)
    }
}

/// A call's place among the connection's open calls
/// ([`crate::RrpcConfig::max_concurrent_calls`], admission in
/// [`proto::Client::admit`]): given back on drop, to the first call in
/// line if one waits.
#[derive(Debug)]
pub(super) struct Place(pub(super) Arc<Shared>);

impl Place {
    /// Gives a place back (the table's lock must not be held).
    fn release(shared: &Shared) {
        let mut t = lock(&shared.table);
        // A waiter's send fails only if its caller is gone without having
        // left the line; the place then passes on.
        while let Some(w) = t.conn.release() {
            if w.send(()).is_ok() {
                break;
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        Self::release(&self.0);
    }
}

/// A call waiting in line for a place: resolves to the place, or to the
/// connection's end (its waiter dropped by [`proto::Client::close`]).
///
/// Cancel safe: dropped while in line, the call leaves the line; dropped
/// after the place passed to it, the place is given back (to the next in
/// line). Either way the call takes no place.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) shared: Arc<Shared>,
    pub(super) ticket: proto::Ticket,
    pub(super) rx: oneshot::Receiver<()>,
    /// Resolved: nothing to undo on drop.
    pub(super) done: bool,
}

impl std::future::Future for Queued {
    type Output = Result<Place, ()>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(std::pin::Pin::new(&mut self.rx).poll(cx));
        self.done = true;
        Poll::Ready(r.map(|()| Place(self.shared.clone())).map_err(|_| ()))
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let left = lock(&self.shared.table).conn.leave_queue(self.ticket);
        // Not in line: the place was passed to us (sent under the lock, so
        // it is here now) or the connection closed (the waiter dropped).
        if !left && self.rx.try_recv().is_ok() {
            Place::release(&self.shared);
        }
    }
}
