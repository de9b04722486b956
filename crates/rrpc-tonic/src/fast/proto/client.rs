//! The client side of a fast-path connection: what each server frame
//! means, the call table (ids, each call's queue of events, its receive
//! window), and when (and why) the connection ends.
//!
//! Each call carries the driver's own data (`io`: its task's waker, its
//! send credit), so that delivering an event is one lookup. The
//! leader/follower receive stays the driver's (`fast::client`'s
//! demultiplexer), which keeps this state under the lock its table already
//! had: no lock is added.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
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
            Kind::Data => Event::Data(Bytes::copy_from_slice(f.payload)),
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

/// One call.
#[derive(Debug)]
pub(crate) struct Call<T> {
    events: VecDeque<Event>,
    recv: RecvWindow,
    unacked: Unacked,
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
    /// tables, keyed by ids the peer chose, keep std's keyed SipHash.
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
    next_ticket: u64,
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
            next_ticket: 0,
            spare_queues: Vec::new(),
        }
    }

    /// Asks for a place among the calls open (before [`Client::open`]): a
    /// free place is taken at once unless calls wait in line (FIFO), else
    /// the call queues with the waiter `waiter` makes (called only then:
    /// a call admitted at once makes none).
    ///
    /// # Errors
    /// The connection closed or the server is draining: why.
    pub(crate) fn admit(&mut self, waiter: impl FnOnce() -> W) -> Result<Admission, Status> {
        if let Some((code, msg)) = &self.closed {
            return Err(Status::new(*code, msg.clone()));
        }
        if self.places < self.max_calls && self.queue.is_empty() {
            self.places += 1;
            return Ok(Admission::Admitted);
        }
        let t = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.queue.push_back((t, waiter()));
        Ok(Admission::Queued(t))
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

    /// Opens a call: the next id that is not 0 and not in use.
    ///
    /// # Errors
    /// The connection closed or the server is draining: why.
    pub(crate) fn open(&mut self, io: T) -> Result<u32, Status> {
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
        self.calls.insert(
            id,
            Call {
                events: self.spare_queues.pop().unwrap_or_default(),
                recv: RecvWindow::new(self.recv_window),
                unacked: Unacked::new(self.recv_window),
                io,
            },
        );
        Ok(id)
    }

    /// Removes call `id` (finished or abandoned).
    pub(crate) fn remove(&mut self, id: u32) -> Option<T> {
        let c = self.calls.remove(&id)?;
        let mut events = c.events;
        if events.capacity() <= SPARE_QUEUE_CAP && self.spare_queues.len() < SPARE_QUEUES {
            // Events never taken (an abandoned call's) go now, as they
            // would have with the call.
            events.clear();
            self.spare_queues.push(events);
        }
        Some(c.io)
    }

    /// Call `id`, if it is open.
    pub(crate) fn call_mut(&mut self, id: u32) -> Option<&mut Call<T>> {
        self.calls.get_mut(&id)
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
        let Some(c) = self.calls.get_mut(&id) else {
            return Ok(Delivered::Dropped);
        };
        match ev {
            Event::Window(inc) => return Ok(Delivered::Grant(&mut c.io, inc)),
            Event::Data(ref b) => c.recv.received(b.len())?,
            _ => {}
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
            c.events
                .push_back(Event::Reset(Status::new(reason.0, reason.1.clone())));
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
            (c.open(()).expect("open"), c.open(()).expect("open")),
            (1, 2)
        );
        c.next_id = 1;
        assert_eq!(c.open(()).expect("open"), 3, "1 and 2 are in flight");
        assert_eq!(c.remove(1), Some(()));
        c.next_id = u32::MAX;
        assert_eq!(c.open(()).expect("open"), u32::MAX);
        assert_eq!(c.open(()).expect("open"), 1, "0 is never a call's");
        c.handle_goaway();
        let st = c.open(()).expect_err("draining");
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
        let id = c.open(0u32).expect("open");
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
}
