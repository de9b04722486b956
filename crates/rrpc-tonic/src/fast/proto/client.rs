//! The client side of a fast-path connection: what each server frame
//! means, the call table (ids, each call's queue of events, its receive
//! window), and when (and why) the connection ends.
//!
//! Each call carries the driver's own data (`io`: its task's waker, its
//! send credit), so that delivering an event is one lookup. The
//! leader/follower receive stays the driver's (`fast::client`'s
//! demultiplexer), which keeps this state under the one lock of its
//! connection.
//!
//! Deadlines are the state machine's too: a call (or a caller waiting in
//! line) opened with one is expired by [`Client::handle_timeout`] once the
//! driver's clock passes it ([`Client::poll_timeout`]: when), and the call
//! decides for itself whether the server must hear a CANCEL when its caller
//! lets go of it ([`Client::remove`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Instant;

use tonic::Status;

use super::Event;
use super::flow::{RecvWindow, Unacked};
use crate::Error;
use crate::frame::{self, FrameError, Kind};

/// Why the connection ended (or stopped taking calls): a gRPC code and a
/// message, what every call still open and every new call gets.
pub(crate) type Reason = (tonic::Code, String);

/// Decodes one ring message: each call's events in order, whether the
/// server said GOAWAY, and the first protocol violation (nothing after it
/// is decoded). The one receive-side copy of response data happens here:
/// ring slot -> body chunk.
pub(crate) fn decode(
    msg: &[u8],
    events: &mut Vec<(u32, Event)>,
    goaway: &mut bool,
    bad: &mut Option<FrameError>,
) {
    for f in frame::frames(msg) {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                *bad = Some(e);
                return;
            }
        };
        let ev = match f.kind {
            Kind::ResponseHeaders => match frame::parse_response_headers(f.payload) {
                Ok((status, headers)) => Event::Headers {
                    status,
                    headers,
                    end: f.end_stream(),
                },
                Err(e) => {
                    *bad = Some(e);
                    return;
                }
            },
            Kind::Data => Event::Data(frame::copy_payload(f.payload)),
            Kind::Trailers => match frame::parse_metadata(f.payload) {
                Ok(m) => Event::Trailers(m),
                Err(e) => {
                    *bad = Some(e);
                    return;
                }
            },
            Kind::Cancel => Event::Reset(Status::cancelled("rrpc: call reset by the server")),
            Kind::WindowUpdate => match frame::parse_window_update(f.payload) {
                Ok(inc) => Event::Window(inc),
                Err(e) => {
                    *bad = Some(e);
                    return;
                }
            },
            Kind::GoAway => {
                *goaway = true;
                continue;
            }
            Kind::RequestHeaders => {
                *bad = Some(FrameError::Invalid("request headers sent to a client"));
                return;
            }
        };
        events.push((f.call_id, ev));
    }
}

/// Where a call stands, as the server and the clock see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In flight: the server may still answer; a caller that lets go
    /// resets it (CANCEL).
    Open,
    /// The server ended it (trailers, a trailers-only response, a reset)
    /// or the connection did: nothing to tell the server.
    Ended,
    /// Its deadline passed: its caller reads `DEADLINE_EXCEEDED`, what the
    /// server still sends for it is dropped, and the server must hear a
    /// CANCEL.
    Expired,
}

/// One call.
#[derive(Debug)]
pub(crate) struct Call<T> {
    events: VecDeque<Event>,
    recv: RecvWindow,
    unacked: Unacked,
    state: State,
    /// Tells this call's deadline entry from a later call's with its id.
    seq: u64,
    /// The driver's data for this call.
    pub(crate) io: T,
}

impl<T> Call<T> {
    /// The call's next event. A DATA event is read by the application
    /// now: when half the window was read, the receive window is reopened
    /// and `update` set to the WINDOW_UPDATE increment to send.
    pub(crate) fn pop_event(&mut self, update: &mut Option<u32>) -> Option<Event> {
        let ev = self.events.pop_front()?;
        if let Event::Data(b) = &ev
            && let Some(inc) = self.unacked.consumed(b.len())
        {
            self.recv.reopen(inc);
            *update = Some(inc);
        }
        Some(ev)
    }

    /// Whether events are queued.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Whether the call's deadline passed (its caller reads, or read,
    /// `DEADLINE_EXCEEDED`).
    pub(crate) fn is_expired(&self) -> bool {
        self.state == State::Expired
    }

    /// Whether the server (or the connection) ended the call.
    #[cfg(test)]
    pub(crate) fn is_ended(&self) -> bool {
        self.state == State::Ended
    }

    /// How many events the call's queue holds without growing.
    #[cfg(test)]
    pub(crate) fn events_capacity(&self) -> usize {
        self.events.capacity()
    }
}

/// What delivering one event did ([`Client::deliver`]).
#[derive(Debug)]
pub(crate) enum Delivered<'a, T> {
    /// Queued for the call: wake its task.
    Queued(&'a mut T),
    /// The server granted the call `inc` more bytes of send credit.
    Grant(&'a mut T, u32),
    /// For a call that is gone (abandoned): dropped.
    Dropped,
}

/// What expiring one deadline did ([`Client::handle_timeout`]).
#[derive(Debug)]
pub(crate) enum Expired<'a, T, W> {
    /// An open call: `DEADLINE_EXCEEDED` is queued as its next event; wake
    /// its task.
    Call(&'a mut T),
    /// A caller waiting in line left it: tell it through its waiter.
    Queued(W),
}

/// A call let go of ([`Client::remove`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Removed<T> {
    /// The driver's data for it.
    pub(crate) io: T,
    /// The server may still be working on it: write a CANCEL (before the
    /// call's place is given back, so that the server, which reads in
    /// order, has freed it too).
    pub(crate) cancel: bool,
}

/// A queued call's place in line ([`Client::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

/// What asking for a place gave ([`Client::admit`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The call holds a place now.
    Admitted,
    /// Every place is taken: the call waits in line; its waiter is handed
    /// back by [`Client::release`] when a place passes to it.
    Queued(Ticket),
}

/// The client side of one connection.
#[derive(Debug)]
pub(crate) struct Client<T, W = ()> {
    /// Keyed by ids this end chose, so a fast hash serves (foldhash: SipHash
    /// cost ~500 instructions a call here, under callgrind); the server's
    /// table, keyed by ids the peer chose, uses it too (`server.rs` says
    /// why that is safe there).
    calls: HashMap<u32, Call<T>, foldhash::fast::RandomState>,
    /// Set once the connection is gone or draining: new calls fail with it.
    closed: Option<Reason>,
    /// The next call id to try (0 is never a call's: the driver's
    /// fallback reader uses it).
    next_id: u32,
    /// Our receive window per call.
    recv_window: u32,
    /// Calls that may hold a place at once (the server refuses more).
    max_calls: usize,
    /// Places held (by calls open, or admitted and about to open).
    places: usize,
    /// Calls waiting for a place, first come first served, each with the
    /// driver's waiter (what wakes the caller).
    queue: VecDeque<(Ticket, W)>,
    /// Numbers tickets in line and calls (one counter: a deadline entry
    /// names either).
    next_seq: u64,
    /// The deadlines of calls and of callers in line that have one,
    /// earliest first: (instant, seq, the call's id or `None` for a caller
    /// in line). An entry whose call or caller is gone is discarded
    /// lazily.
    deadlines: BinaryHeap<Reverse<(Instant, u64, Option<u32>)>>,
    /// Event queues of calls that ended, emptied, for the next calls (a
    /// call's queue otherwise allocates on its first event: once a call).
    /// At most [`SPARE_QUEUES`], each at most [`SPARE_QUEUE_CAP`] events.
    spare_queues: Vec<VecDeque<Event>>,
}

/// Ended calls' event queues kept for reuse per connection (about the
/// calls a connection has in flight at once in a busy moment).
const SPARE_QUEUES: usize = 8;
/// A kept queue's largest capacity: a unary response's three events fit
/// (a queue's first allocation holds four), a queue a stream grew is
/// freed.
const SPARE_QUEUE_CAP: usize = 4;

impl<T, W> Client<T, W> {
    /// A connection whose calls each announce `recv_window` bytes, with at
    /// most `max_calls` calls holding a place at once.
    pub(crate) fn new(recv_window: u32, max_calls: usize) -> Self {
        Client {
            calls: HashMap::default(),
            closed: None,
            next_id: 1,
            recv_window,
            max_calls,
            places: 0,
            queue: VecDeque::new(),
            next_seq: 0,
            deadlines: BinaryHeap::new(),
            spare_queues: Vec::new(),
        }
    }

    /// Asks for a place among the calls open (before [`Client::open`]): a
    /// free place is taken at once unless calls wait in line (FIFO), else
    /// the call queues with the waiter `waiter` makes (called only then:
    /// a call admitted at once makes none) until `deadline`, if it has one
    /// ([`Client::handle_timeout`] then hands its waiter back).
    ///
    /// # Errors
    /// The connection closed or the server is draining: why.
    pub(crate) fn admit(
        &mut self,
        deadline: Option<Instant>,
        waiter: impl FnOnce() -> W,
    ) -> Result<Admission, Status> {
        if let Some((code, msg)) = &self.closed {
            return Err(Status::new(*code, msg.clone()));
        }
        if self.places < self.max_calls && self.queue.is_empty() {
            self.places += 1;
            return Ok(Admission::Admitted);
        }
        let t = Ticket(self.next_seq);
        self.next_seq += 1;
        self.queue.push_back((t, waiter()));
        if let Some(at) = deadline {
            self.add_deadline(at, t.0, None);
        }
        Ok(Admission::Queued(t))
    }

    /// Whether a `deadlines` entry still names a call that is open or a
    /// caller still in line.
    fn is_live(&self, seq: u64, id: Option<u32>) -> bool {
        match id {
            Some(id) => self
                .calls
                .get(&id)
                .is_some_and(|c| c.seq == seq && c.state == State::Open),
            None => self.queue.iter().any(|(t, _)| t.0 == seq),
        }
    }

    /// Records a deadline. Entries left behind by calls that ended are
    /// swept once they outnumber the calls and callers that may have one,
    /// so the heap stays within about twice those.
    fn add_deadline(&mut self, at: Instant, seq: u64, id: Option<u32>) {
        self.deadlines.push(Reverse((at, seq, id)));
        if self.deadlines.len() > 2 * (self.calls.len() + self.queue.len()) + 32 {
            let mut heap = std::mem::take(&mut self.deadlines).into_vec();
            heap.retain(|Reverse((_, seq, id))| self.is_live(*seq, *id));
            self.deadlines = heap.into();
        }
    }

    /// The earliest deadline of a call still open or a caller still in
    /// line, if any: when to call [`Client::handle_timeout`] (entries of
    /// ended calls are dropped here).
    pub(crate) fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, seq, id))) = self.deadlines.peek().copied() {
            if self.is_live(seq, id) {
                return Some(at);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Expires every call and every caller in line whose deadline is at
    /// or before `now`, telling the driver of each through `expired`: an
    /// open call gets `DEADLINE_EXCEEDED` ([`crate::call::deadline_exceeded`])
    /// as its next event, and what the server sends for it from now on is
    /// dropped (its window no longer matters: the call is over); a caller
    /// in line leaves the line. The driver calls it when the instant
    /// [`Client::poll_timeout`] gave has come.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        mut expired: impl FnMut(Expired<'_, T, W>),
    ) {
        while let Some(Reverse((at, seq, id))) = self.deadlines.peek().copied() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            match id {
                Some(id) => {
                    let Some(c) = self
                        .calls
                        .get_mut(&id)
                        .filter(|c| c.seq == seq && c.state == State::Open)
                    else {
                        continue;
                    };
                    c.state = State::Expired;
                    c.events
                        .push_back(Event::Reset(crate::call::deadline_exceeded()));
                    expired(Expired::Call(&mut c.io));
                }
                None => {
                    if let Some(i) = self.queue.iter().position(|(t, _)| t.0 == seq)
                        && let Some((_, w)) = self.queue.remove(i)
                    {
                        expired(Expired::Queued(w));
                    }
                }
            }
        }
    }

    /// A place is given back (its call finished, or its CANCEL was
    /// written). It passes to the first call in line, whose waiter is
    /// returned (wake it: it holds the place now).
    pub(crate) fn release(&mut self) -> Option<W> {
        match self.queue.pop_front() {
            Some((_, w)) => Some(w),
            None => {
                self.places = self.places.saturating_sub(1);
                None
            }
        }
    }

    /// A queued caller gave up (its future was dropped): it leaves the
    /// line. Returns `false` if it was no longer in line: a place had
    /// already passed to it, which it must [`Client::release`].
    pub(crate) fn leave_queue(&mut self, ticket: Ticket) -> bool {
        match self.queue.iter().position(|(t, _)| *t == ticket) {
            Some(i) => {
                self.queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// Calls waiting in line.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Places held.
    #[cfg(test)]
    pub(crate) fn places(&self) -> usize {
        self.places
    }

    /// Opens a call: the next id that is not 0 and not in use. It expires
    /// at `deadline`, if it has one ([`Client::handle_timeout`]).
    ///
    /// # Errors
    /// The connection closed or the server is draining: why.
    pub(crate) fn open(&mut self, io: T, deadline: Option<Instant>) -> Result<u32, Status> {
        if let Some((code, msg)) = &self.closed {
            return Err(Status::new(*code, msg.clone()));
        }
        let id = loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if id != 0 && !self.calls.contains_key(&id) {
                break id;
            }
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.calls.insert(
            id,
            Call {
                events: self.spare_queues.pop().unwrap_or_default(),
                recv: RecvWindow::new(self.recv_window),
                unacked: Unacked::new(self.recv_window),
                state: State::Open,
                seq,
                io,
            },
        );
        if let Some(at) = deadline {
            self.add_deadline(at, seq, Some(id));
        }
        Ok(id)
    }

    /// Removes call `id`: its caller let go of it (read its end, or gave
    /// up). Whether the server must hear a CANCEL is the call's state: it
    /// must unless the server (or the connection) ended the call.
    pub(crate) fn remove(&mut self, id: u32) -> Option<Removed<T>> {
        let c = self.calls.remove(&id)?;
        let mut events = c.events;
        if events.capacity() <= SPARE_QUEUE_CAP && self.spare_queues.len() < SPARE_QUEUES {
            // Events never taken (an abandoned call's) go now, as they
            // would have with the call.
            events.clear();
            self.spare_queues.push(events);
        }
        Some(Removed {
            io: c.io,
            cancel: c.state != State::Ended,
        })
    }

    /// Call `id`, if it is open.
    pub(crate) fn call_mut(&mut self, id: u32) -> Option<&mut Call<T>> {
        self.calls.get_mut(&id)
    }

    /// Call `id`, if it is open.
    #[cfg(test)]
    pub(crate) fn call(&self, id: u32) -> Option<&Call<T>> {
        self.calls.get(&id)
    }

    /// The open calls' ids and driver data.
    pub(crate) fn calls(&self) -> impl Iterator<Item = (u32, &T)> {
        self.calls.iter().map(|(id, c)| (*id, &c.io))
    }

    /// Delivers one decoded event to call `id`.
    ///
    /// # Errors
    /// DATA beyond the call's receive window (the connection must close).
    pub(crate) fn deliver(&mut self, id: u32, ev: Event) -> Result<Delivered<'_, T>, FrameError> {
        let Some(c) = self.calls.get_mut(&id).filter(|c| c.state == State::Open) else {
            return Ok(Delivered::Dropped);
        };
        match ev {
            Event::Window(inc) => return Ok(Delivered::Grant(&mut c.io, inc)),
            Event::Data(ref b) => c.recv.received(b.len())?,
            Event::Trailers(_) | Event::Headers { end: true, .. } | Event::Reset(_) => {
                c.state = State::Ended;
            }
            Event::Headers { end: false, .. } => {}
        }
        c.events.push_back(ev);
        Ok(Delivered::Queued(&mut c.io))
    }

    /// The server said GOAWAY: new calls fail (`Unavailable`), calls in
    /// flight go on.
    pub(crate) fn handle_goaway(&mut self) {
        self.closed.get_or_insert((
            tonic::Code::Unavailable,
            "rrpc: server is shutting down".into(),
        ));
    }

    /// One receive ended with `r`, the first violation of its message (or
    /// of its delivery: a window broken) being `bad`: why the connection
    /// must close now, if it must.
    pub(crate) fn handle_receive(
        &self,
        r: Result<bool, &Error>,
        bad: Option<FrameError>,
    ) -> Option<Reason> {
        if let Some(e) = bad {
            return Some((
                tonic::Code::Internal,
                format!("rrpc: protocol violation by server: {e}"),
            ));
        }
        match r {
            Ok(true) => None,
            Ok(false) => Some((
                tonic::Code::Unavailable,
                "rrpc: connection closed by the server".to_string(),
            )),
            Err(e) => Some((e.code(), format!("rrpc: {e}"))),
        }
    }

    /// The connection ended: every open call gets `reason` as its next
    /// event, new calls fail with it, calls in line leave it (their
    /// waiters are dropped: a dropped waiter tells its caller to read
    /// [`Client::closed`]). Returns the open calls' driver data (to wake
    /// them).
    pub(crate) fn close(&mut self, reason: Reason) -> impl Iterator<Item = &mut T> {
        self.queue.clear();
        for c in self.calls.values_mut() {
            // An expired call's caller reads its DEADLINE_EXCEEDED first.
            if c.state == State::Open {
                c.events
                    .push_back(Event::Reset(Status::new(reason.0, reason.1.clone())));
            }
            c.state = State::Ended;
        }
        self.closed = Some(reason);
        self.calls.values_mut().map(|c| &mut c.io)
    }

    /// Why new calls fail, once they do.
    pub(crate) fn closed(&self) -> Option<&Reason> {
        self.closed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::END_STREAM;
    use bytes::Bytes;

    fn decoded(
        frames: &[(Kind, u8, u32, Vec<u8>)],
    ) -> (Vec<(u32, Event)>, bool, Option<FrameError>) {
        let mut msg = Vec::new();
        for (k, f, id, p) in frames {
            frame::push_frame(&mut msg, *k, *f, *id, p);
        }
        let (mut ev, mut goaway, mut bad) = (Vec::new(), false, None);
        decode(&msg, &mut ev, &mut goaway, &mut bad);
        (ev, goaway, bad)
    }

    #[test]
    fn server_frames_become_call_events() {
        let headers =
            frame::response_headers_payload(http::StatusCode::OK, &http::HeaderMap::new());
        let (ev, goaway, bad) = decoded(&[
            (Kind::ResponseHeaders, 0, 1, headers),
            (Kind::Data, 0, 1, b"abc".to_vec()),
            (Kind::GoAway, 0, 0, Vec::new()),
            (
                Kind::WindowUpdate,
                0,
                3,
                frame::window_update_payload(9).to_vec(),
            ),
            (Kind::Cancel, 0, 3, Vec::new()),
            (
                Kind::Trailers,
                END_STREAM,
                1,
                frame::metadata_payload(&http::HeaderMap::new()),
            ),
        ]);
        assert!(goaway && bad.is_none());
        let kinds: Vec<_> = ev
            .iter()
            .map(|(id, e)| match e {
                Event::Headers { end: false, .. } => (*id, "headers"),
                Event::Data(b) if b.as_ref() == b"abc" => (*id, "data"),
                Event::Window(9) => (*id, "window"),
                Event::Reset(s) if s.code() == tonic::Code::Cancelled => (*id, "reset"),
                Event::Trailers(_) => (*id, "trailers"),
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (1, "headers"),
                (1, "data"),
                (3, "window"),
                (3, "reset"),
                (1, "trailers")
            ]
        );
    }

    #[test]
    fn a_client_frame_from_the_server_is_a_violation() {
        let open = frame::request_headers_payload("/x.Y/Z", "", &http::HeaderMap::new());
        let (ev, _, bad) = decoded(&[
            (Kind::Data, 0, 1, b"a".to_vec()),
            (Kind::RequestHeaders, 0, 2, open),
            (Kind::Data, 0, 1, b"b".to_vec()),
        ]);
        assert_eq!(ev.len(), 1, "nothing after the violation");
        let c = Client::<()>::new(1024, 8);
        let (code, msg) = c.handle_receive(Ok(true), bad).expect("closes");
        assert_eq!(code, tonic::Code::Internal);
        assert!(msg.contains("request headers sent to a client"), "{msg}");
    }

    #[test]
    fn ids_skip_zero_and_calls_in_flight_and_goaway_stops_new_calls() {
        let mut c = Client::<_, ()>::new(1024, 8);
        assert_eq!(
            (
                c.open((), None).expect("open"),
                c.open((), None).expect("open")
            ),
            (1, 2)
        );
        c.next_id = 1;
        assert_eq!(c.open((), None).expect("open"), 3, "1 and 2 are in flight");
        assert_eq!(c.remove(1).map(|r| r.io), Some(()));
        c.next_id = u32::MAX;
        assert_eq!(c.open((), None).expect("open"), u32::MAX);
        assert_eq!(c.open((), None).expect("open"), 1, "0 is never a call's");
        c.handle_goaway();
        let st = c.open((), None).expect_err("draining");
        assert_eq!(st.code(), tonic::Code::Unavailable);
        // Draining is not closing: a receive that went well ends nothing;
        // a server that left or a failed receive does.
        assert!(c.handle_receive(Ok(true), None).is_none());
        let (code, _) = c.handle_receive(Ok(false), None).expect("peer closed");
        assert_eq!(code, tonic::Code::Unavailable);
        // A failed receive: the error's own code (the one mapping), a ring
        // the server corrupted `DataLoss`.
        let corrupt = Error::from(rrpc_ringbuf::Error::Corrupt(
            rrpc_ringbuf::Corruption::PlacementTimedOut,
        ));
        let (code, _) = c.handle_receive(Err(&corrupt), None).expect("failed");
        assert_eq!(code, tonic::Code::DataLoss);
    }

    #[test]
    fn a_call_window_is_enforced_and_reopened_as_the_application_reads() {
        let mut c = Client::<_, ()>::new(1024, 8);
        let id = c.open(0u32, None).expect("open");
        let data = |n| Event::Data(Bytes::from(vec![0; n]));
        assert!(matches!(c.deliver(id, data(500)), Ok(Delivered::Queued(_))));
        assert!(matches!(c.deliver(id, data(499)), Ok(Delivered::Queued(_))));
        assert!(c.deliver(id, data(1)).is_err(), "1023 of 1024 taken");
        assert!(matches!(c.deliver(7, data(1)), Ok(Delivered::Dropped)));
        match c.deliver(id, Event::Window(5)) {
            Ok(Delivered::Grant(io, 5)) => *io += 5,
            e => panic!("{e:?}"),
        }
        let call = c.call_mut(id).expect("open");
        let mut update = None;
        assert!(matches!(call.pop_event(&mut update), Some(Event::Data(_))));
        assert_eq!(update, Some(512), "half the window read");
        assert!(call.has_events());
        assert!(c.deliver(id, data(500)).is_ok(), "reopened");
        let ios: Vec<u32> = c
            .close((tonic::Code::Aborted, "x".into()))
            .map(|io| *io)
            .collect();
        assert_eq!(ios, [5]);
        let call = c.call_mut(id).expect("open");
        let mut update = None;
        while let Some(ev) = call.pop_event(&mut update) {
            if let Event::Reset(s) = ev {
                assert_eq!(s.code(), tonic::Code::Aborted);
                return;
            }
        }
        panic!("no reset");
    }

    /// The state machine's deadlines: a caller in line leaves it at its
    /// deadline, an open call gets DEADLINE_EXCEEDED after what came before
    /// it and nothing after, and must be cancelled; a call the server ended
    /// needs no CANCEL, and its deadline never fires (nor for a later call
    /// with its id).
    #[test]
    fn deadlines_expire_calls_and_callers_in_line_and_skip_what_ended() {
        use std::time::Duration;
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let data = |n| Event::Data(Bytes::from(vec![7; n]));
        let mut c = Client::<u32, &str>::new(1024, 1);
        assert!(matches!(
            c.admit(Some(ms(50)), || "a"),
            Ok(Admission::Admitted)
        ));
        let a = c.open(1, Some(ms(50))).expect("open");
        let Ok(Admission::Queued(_)) = c.admit(Some(ms(30)), || "in line") else {
            panic!("the one place is taken");
        };
        assert_eq!(c.poll_timeout(), Some(ms(30)));
        let mut left = Vec::new();
        c.handle_timeout(ms(29), |_| panic!("nothing is due"));
        c.handle_timeout(ms(30), |e| match e {
            Expired::Queued(w) => left.push(w),
            Expired::Call(_) => panic!("the call's deadline is later"),
        });
        assert_eq!((left, c.queued()), (vec!["in line"], 0));
        assert_eq!(c.poll_timeout(), Some(ms(50)));
        assert!(matches!(c.deliver(a, data(10)), Ok(Delivered::Queued(_))));
        c.handle_timeout(ms(50), |e| match e {
            Expired::Call(io) => *io += 1,
            Expired::Queued(_) => panic!("nobody in line"),
        });
        assert_eq!(c.poll_timeout(), None);
        assert!(matches!(c.deliver(a, data(10)), Ok(Delivered::Dropped)));
        let call = c.call_mut(a).expect("open until its caller lets go");
        assert!(call.is_expired());
        let mut update = None;
        assert!(matches!(call.pop_event(&mut update), Some(Event::Data(_))));
        match call.pop_event(&mut update) {
            Some(Event::Reset(st)) => assert_eq!(st.code(), tonic::Code::DeadlineExceeded),
            e => panic!("{e:?}"),
        }
        assert!(call.pop_event(&mut update).is_none(), "nothing after it");
        assert_eq!(
            c.remove(a),
            Some(Removed {
                io: 2,
                cancel: true
            })
        );
        assert!(c.release().is_none());
        // A call the server ended: no CANCEL, and its deadline is gone.
        let b = c.open(3, Some(ms(60))).expect("open");
        assert_eq!(c.poll_timeout(), Some(ms(60)));
        let trailers = Event::Trailers(http::HeaderMap::new());
        assert!(matches!(c.deliver(b, trailers), Ok(Delivered::Queued(_))));
        assert_eq!(c.poll_timeout(), None, "an ended call has no deadline");
        c.handle_timeout(ms(60), |_| panic!("nothing is due"));
        assert_eq!(
            c.remove(b),
            Some(Removed {
                io: 3,
                cancel: false
            })
        );
        // A later call with an ended call's id and no deadline is not
        // expired by the ended call's entry (still in the heap).
        let d = c.open(4, Some(ms(70))).expect("open");
        c.remove(d);
        c.next_id = d;
        assert_eq!(c.open(5, None).expect("open"), d);
        c.handle_timeout(ms(100), |_| panic!("nothing is due"));
        // A caller that lets go of an open call cancels it.
        assert_eq!(
            c.remove(d),
            Some(Removed {
                io: 5,
                cancel: true
            })
        );
    }
}
