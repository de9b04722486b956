//! The fast-path client's driver: the connection's state under one short
//! synchronous lock ([`Shared::table`], as quinn's `ConnectionRef`), the
//! leader/follower receive that reads the pipe and routes each frame to its
//! call, and the connection's deadline timer. Every decision (which call an
//! event is for, windows, admission, which deadlines passed, whether a call
//! the caller let go of must be cancelled) is the state machine's
//! ([`proto::Client`]); this file moves bytes and wakes tasks. Nothing
//! awaits, and nothing is polled, while the lock is held (the receiver is
//! taken out of the table to be polled in place, and put back: no future
//! per message).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::Error;
use crate::conn::MsgRx;
use crate::fast::Event;
use crate::fast::flow::CallFlow;
use crate::fast::proto::client as proto;
use crate::frame::FrameError;
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

/// What a caller waiting in line hears ([`proto::Client::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// A place passed to it.
    Place,
    /// Its deadline passed in line.
    Expired,
}

/// The connection's state, under its one lock.
#[derive(Debug)]
pub(super) struct Table {
    /// The call table and the connection's protocol state: call ids,
    /// events, receive windows, deadlines, GOAWAY, why it closed.
    pub(super) conn: proto::Client<Slot, oneshot::Sender<Turn>>,
    /// The receive side.
    pub(super) rx: RxState,
    /// The call whose waker the receiver's wait in progress holds.
    pub(super) driver: Option<u32>,
    /// Request senders waiting for window: the WINDOW_UPDATE they need
    /// must be received even when no call waits for its response.
    pub(super) credit_waiters: usize,
    /// Waker of the fallback reader task.
    pub(super) fallback: Option<Waker>,
    /// The fallback reads once although nobody waits ([`Shared::nudge_idle_reader`]).
    pub(super) idle_read: bool,
    /// Waker of the deadline timer ([`Shared::poll_timer`]).
    pub(super) timer: Option<Waker>,
    /// The instant the timer is armed at (`None`: unarmed). A deadline
    /// earlier than it wakes the timer to re-arm; a later one is taken up
    /// when it fires.
    pub(super) armed: Option<Instant>,
    /// Send credits of calls that ended, held by nobody else, for the next
    /// calls ([`CallFlow::renew`]).
    pub(super) spare_flows: Vec<Arc<CallFlow>>,
}

/// The most ended calls' [`CallFlow`]s a connection keeps.
const SPARE_FLOWS: usize = 8;

impl Table {
    /// The table of a connection whose calls announce `recv_window` bytes,
    /// at most `max_calls` of them open at once.
    pub(super) fn new(recv_window: u32, max_calls: usize) -> Table {
        Table {
            conn: proto::Client::new(recv_window, max_calls),
            rx: RxState::default(),
            driver: None,
            credit_waiters: 0,
            fallback: None,
            idle_read: false,
            timer: None,
            armed: None,
            spare_flows: Vec::new(),
        }
    }

    /// A new call's send credit, `credit` bytes: an ended call's, renewed,
    /// or a new one.
    pub(super) fn flow(&mut self, credit: u32) -> Arc<CallFlow> {
        match self.spare_flows.pop() {
            Some(f) => CallFlow::renew(f, credit),
            None => CallFlow::new(credit),
        }
    }

    /// An ended call's send credit: kept for the next call if nobody else
    /// holds it, else closed (a request sender still waiting for window
    /// gives up).
    fn recycle(&mut self, mut flow: Arc<CallFlow>) {
        if Arc::get_mut(&mut flow).is_none() {
            flow.close();
        } else if self.spare_flows.len() < SPARE_FLOWS {
            self.spare_flows.push(flow);
        }
    }

    /// A call (or a caller in line) with a deadline at `at` came: wake the
    /// timer if it must fire earlier than it is armed for.
    pub(super) fn arm(&mut self, at: Option<Instant>) {
        if let Some(at) = at
            && self.armed.is_none_or(|a| at < a)
        {
            self.armed = Some(at);
            if let Some(w) = self.timer.take() {
                w.wake();
            }
        }
    }

    /// Whether the receive side is gone (the connection ended) and nobody
    /// is polling it.
    fn rx_gone(&self) -> bool {
        self.rx.rx.is_none() && !self.rx.polling
    }

    /// Whether a call other than `id` waits for an event.
    pub(super) fn others_wait(&self, id: u32) -> bool {
        self.conn.calls().any(|(k, s)| k != id && s.waker.is_some())
    }

    /// Call `id` stops waiting. If it was the one whose waker the
    /// receiver's wait holds (or nobody's is), make sure somebody keeps receiving
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

/// The most events whose buffer [`RxState`] keeps between receives.
const KEPT_EVENTS: usize = 64;

#[derive(Default)]
pub(super) struct RxState {
    /// The receiver (`None` while a call polls it, and once the
    /// connection ended). A wait it began stays in it between polls
    /// (`MsgRx::poll_recv_with`): whichever call polls next resumes it.
    pub(super) rx: Option<Box<dyn MsgRx>>,
    /// A call took the receiver out of the table to poll it (outside the
    /// lock); it dispatches what arrives and puts it back.
    pub(super) polling: bool,
    /// The connection ended while the receiver was out: whoever polls it
    /// drops it instead of putting it back.
    pub(super) dead: bool,
    /// The event buffer between receives (empty; kept for its allocation).
    pub(super) events: Vec<(u32, Event)>,
}

impl std::fmt::Debug for RxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxState")
            .field("idle", &self.rx.is_some())
            .field("polling", &self.polling)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    /// The connection's one lock: held for a few map operations at a
    /// time, never across an await or a poll of another future.
    pub(super) table: Mutex<Table>,
    /// The server's receive window per call: our initial send credit.
    pub(super) peer_window: u32,
    /// No new calls should start here: the connection closed, the server
    /// said GOAWAY, or the side channel saw the peer leave. Calls in
    /// flight go on (their data may still be in the ring).
    pub(super) retired: AtomicBool,
}

impl Shared {
    /// Removes call `id` (finished or abandoned): whether the server must
    /// hear a CANCEL ([`proto::Client::remove`]).
    pub(super) fn take(&self, id: u32) -> bool {
        let mut t = lock(&self.table);
        let removed = t.conn.remove(id);
        let cancel = removed.as_ref().is_some_and(|r| r.cancel);
        if let Some(r) = removed {
            t.recycle(r.io.flow);
        }
        t.handoff(id);
        cancel
    }

    /// Whether call `id`'s deadline passed; if not, its task is woken
    /// when it does (a caller writing its request races this).
    pub(super) fn poll_expired(&self, id: u32, cx: &mut Context<'_>) -> Poll<()> {
        let mut t = lock(&self.table);
        match t.conn.call_mut(id) {
            Some(c) if !c.is_expired() => {
                match &mut c.io.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    w => *w = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            // Expired, or gone (the caller then reads why).
            _ => Poll::Ready(()),
        }
    }

    /// The connection's deadline timer, polled by the fallback reader
    /// task: armed at the state machine's earliest deadline
    /// ([`proto::Client::poll_timeout`]), reset only when that changes;
    /// when it fires the state machine expires what is due and the calls
    /// and callers in line it names are woken. Never ready.
    pub(super) fn poll_timer(
        &self,
        cx: &mut Context<'_>,
        mut sleep: Pin<&mut tokio::time::Sleep>,
    ) -> Poll<std::convert::Infallible> {
        loop {
            let next = {
                let mut t = lock(&self.table);
                match &t.timer {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => t.timer = Some(cx.waker().clone()),
                }
                let next = t.conn.poll_timeout();
                t.armed = next;
                next
            };
            let Some(at) = next else {
                return Poll::Pending;
            };
            let at = tokio::time::Instant::from_std(at);
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = tokio::time::Instant::now().into_std();
            let mut t = lock(&self.table);
            t.conn.handle_timeout(now, |e| match e {
                proto::Expired::Call(s) => {
                    s.flow.close();
                    if let Some(w) = s.waker.take() {
                        w.wake();
                    }
                }
                proto::Expired::Queued(w) => {
                    let _ = w.send(Turn::Expired);
                }
            });
        }
    }

    /// Delivers one event to a call (a missing call: it was abandoned).
    ///
    /// # Errors
    /// The server broke the call's flow control (sent beyond its window,
    /// or overflowed ours).
    pub(super) fn deliver(&self, t: &mut Table, id: u32, ev: Event) -> Result<(), FrameError> {
        self.deliver_from(t, FALLBACK, id, ev)
    }

    /// [`deliver`](Self::deliver) by the receive of call `me` (or of
    /// the fallback reader): an event for `me` itself wakes nobody, since
    /// `me` pops it as soon as its receive returns. Its waker is taken all
    /// the same (it no longer waits). Waking it cost a wake-up of the
    /// caller's own task a call (a whole re-poll on tokio's current-thread
    /// runtime, whose `block_on` polls its future again once woken).
    fn deliver_from(&self, t: &mut Table, me: u32, id: u32, ev: Event) -> Result<(), FrameError> {
        match t.conn.deliver(id, ev)? {
            proto::Delivered::Grant(s, inc) => s.flow.granted(inc),
            proto::Delivered::Queued(s) => {
                if let Some(w) = s.waker.take()
                    && id != me
                {
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

    /// The connection ended: every call gets `reason`, new calls too; the
    /// receive side is dropped (returned: drop it once the lock is
    /// released), or by whoever is polling it now.
    #[must_use = "drop the receive side outside the lock"]
    pub(super) fn close(&self, t: &mut Table, reason: proto::Reason) -> RxDrop {
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
        t.rx.dead = true;
        t.rx.rx.take()
    }

    /// Next event of call `id` (`None`: the call is gone).
    ///
    /// Leader/follower: there is no reader task in the common case. A call
    /// waiting for its event first looks at its slot; if it is empty and no
    /// other call is receiving right now, it polls the connection's receiver
    /// itself, in place (spinning/sleeping per the poller's mode), dispatches
    /// whatever arrives to the calls' slots, waking their tasks, and returns
    /// as soon as its own event is there. So a unary call's response goes
    /// from the ring to the waiting caller with no task hop. When the call
    /// whose waker the receiver's wait holds stops waiting while others still
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
            let mut t = lock(&self.table);
            if id == FALLBACK {
                if t.conn.closed().is_some() && t.rx_gone() {
                    return Poll::Ready(None);
                }
                let waiting = t.credit_waiters > 0 || t.others_wait(FALLBACK);
                let idle_read = std::mem::take(&mut t.idle_read);
                t.fallback = Some(cx.waker().clone());
                if !waiting && t.driver != Some(FALLBACK) && !idle_read {
                    // Nobody waits: sleep until a handoff.
                    return Poll::Pending;
                }
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
            if t.rx.polling {
                // Another call is receiving; it dispatches to us and wakes us.
                return Poll::Pending;
            }
            let Some(mut rx) = t.rx.rx.take() else {
                // The connection ended; `close` queued a Reset for every call.
                if id != FALLBACK && t.conn.call_mut(id).is_some_and(|c| c.has_events()) {
                    continue;
                }
                t.handoff(id);
                return Poll::Ready(None);
            };
            let mut events = std::mem::take(&mut t.rx.events);
            t.rx.polling = true;
            drop(t);
            let (mut goaway, mut bad) = (false, None);
            let polled = rx.poll_recv_with(cx, &mut |msg: &[u8]| {
                proto::decode(msg, &mut events, &mut goaway, &mut bad)
            });
            let mut t = lock(&self.table);
            t.rx.polling = false;
            if t.rx.dead {
                // Closed while we polled: the receiver goes (outside the lock).
                drop(t);
                drop(rx);
                continue;
            }
            match polled {
                Poll::Pending => {
                    // Nothing was received: the buffer is still empty.
                    t.rx.events = events;
                    t.rx.rx = Some(rx);
                    t.driver = Some(id);
                    return Poll::Pending;
                }
                Poll::Ready(r) => {
                    if goaway {
                        self.retired.store(true, Ordering::Release);
                        t.conn.handle_goaway();
                    }
                    let gone = self.dispatch(&mut t, id, rx, r, events, bad);
                    drop(t);
                    drop(gone);
                }
            }
        }
    }

    /// Hands one receive's events to their calls (under the lock), and the
    /// receiver back to the table unless the connection must end (a GOAWAY
    /// in the receive was handled first, by the caller). `me`: the call
    /// whose poll received them ([`Shared::deliver_from`]).
    fn dispatch(
        &self,
        t: &mut Table,
        me: u32,
        rx: Box<dyn MsgRx>,
        r: Result<bool, Error>,
        mut events: Vec<(u32, Event)>,
        mut bad: Option<FrameError>,
    ) -> (RxDrop, Option<Box<dyn MsgRx>>) {
        t.driver = None;
        for (cid, ev) in events.drain(..) {
            if let Err(e) = self.deliver_from(t, me, cid, ev) {
                bad.get_or_insert(e);
            }
        }
        // A message of many frames does not leave a large buffer behind.
        if events.capacity() <= KEPT_EVENTS {
            t.rx.events = events;
        }
        match t.conn.handle_receive(r.as_ref().map(|b| *b), bad) {
            None => {
                t.rx.rx = Some(rx);
                (None, None)
            }
            // Dropping the receiver closes the connection.
            Some(reason) => (self.close(t, reason), Some(rx)),
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
    ///
    /// This is the client's one failure recorder: every way a connection
    /// fails on this side (a send, a receive, a protocol violation, the
    /// connection dropped) ends in [`Shared::close`] through here or
    /// [`Shared::dispatch`].
    pub(super) fn fail(&self, e: &Error) {
        let mut t = lock(&self.table);
        let gone = if t.rx.dead {
            None
        } else {
            // After a GOAWAY too: the connection is gone now.
            self.close(&mut t, (e.code(), format!("rrpc: {e}")))
        };
        drop(t);
        drop(gone);
    }
}

/// The receive side of a connection that ended, to be dropped once the
/// lock is released.
pub(super) type RxDrop = Option<Box<dyn MsgRx>>;

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
            if w.send(Turn::Place).is_ok() {
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

/// A call waiting in line for a place: resolves to the place, to its
/// deadline passing in line ([`Turn::Expired`]), or to the connection's
/// end (its waiter dropped by [`proto::Client::close`]).
///
/// Cancel safe: dropped while in line, the call leaves the line; dropped
/// after the place passed to it, the place is given back (to the next in
/// line). Either way the call takes no place.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) shared: Arc<Shared>,
    pub(super) ticket: proto::Ticket,
    pub(super) rx: oneshot::Receiver<Turn>,
    /// Resolved: nothing to undo on drop.
    pub(super) done: bool,
}

impl std::future::Future for Queued {
    type Output = Result<Place, Option<Turn>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(Pin::new(&mut self.rx).poll(cx));
        self.done = true;
        Poll::Ready(match r {
            Ok(Turn::Place) => Ok(Place(self.shared.clone())),
            Ok(Turn::Expired) => Err(Some(Turn::Expired)),
            Err(_) => Err(None),
        })
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
        if !left && self.rx.try_recv() == Ok(Turn::Place) {
            Place::release(&self.shared);
        }
    }
}
