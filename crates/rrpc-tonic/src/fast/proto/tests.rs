//! The state machine stepped by hand: a scripted client and the server's
//! state machine wired back to back, frames passed in memory, time on a
//! virtual clock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::Event;
use super::client;
use super::flow::{SendWindow, Unacked};
use super::server::{self, CallKey, In, Note, Output, Server};
use crate::frame::{self, END_STREAM, FrameError, Kind};

const WINDOW: u32 = 2048;

/// A frame the client writes: kind, flags, call id, payload.
type ClientFrame = (Kind, u8, u32, Vec<u8>);

fn open_payload(timeout: Option<&str>) -> Vec<u8> {
    let mut h = http::HeaderMap::new();
    if let Some(t) = timeout {
        h.insert("grpc-timeout", t.parse().expect("value"));
    }
    frame::request_headers_payload("/x.Y/Z", "", &h)
}

/// One started call as the server's application sees it.
#[derive(Debug)]
struct AppCall {
    key: CallKey,
    /// Request chunks not read yet.
    unread: VecDeque<Bytes>,
    /// Request bytes delivered (read or not).
    delivered: usize,
    /// The request stream ended.
    ended: bool,
    unacked: Unacked,
    /// The response's send credit.
    send: SendWindow,
    deadline: Option<Instant>,
}

/// A client and a server back to back.
struct Pair {
    server: Server,
    now: Instant,
    clock_reads: usize,
    /// Messages the client wrote, not yet read by the server.
    to_server: VecDeque<Vec<u8>>,
    /// Frames the server wrote: (kind, flags, id, payload).
    to_client: Vec<(Kind, u8, u32, Bytes)>,
    /// Client: each open call's send credit.
    client_send: HashMap<u32, SendWindow>,
    app: HashMap<u32, AppCall>,
    cancelled: Vec<CallKey>,
    /// Calls whose deadline the state machine expired.
    expired: Vec<CallKey>,
    /// Calls refused because every place was taken.
    refused_full: usize,
    /// Calls the client saw end (trailers, or a trailers-only response).
    client_ended: Vec<u32>,
    /// The client's connection-level state (its waiters: labels).
    client: client::Client<(), u64>,
    /// The connection's error: the state machine's, or (a grant that
    /// overflows a started call's send credit) the driver's.
    error: Option<FrameError>,
    /// The state machine reported a violation.
    proto_failed: bool,
    inbox: Vec<In>,
}

impl Pair {
    fn new(max_calls: usize, timeout: Option<Duration>) -> Pair {
        Pair {
            server: Server::new(server::Config {
                max_calls,
                recv_window: WINDOW,
                peer_window: WINDOW,
                max_header_list: 16 << 10,
                timeout,
            }),
            now: Instant::now(),
            clock_reads: 0,
            to_server: VecDeque::new(),
            to_client: Vec::new(),
            client_send: HashMap::new(),
            app: HashMap::new(),
            cancelled: Vec::new(),
            expired: Vec::new(),
            refused_full: 0,
            client_ended: Vec::new(),
            client: client::Client::new(WINDOW, usize::MAX),
            error: None,
            proto_failed: false,
            inbox: Vec::new(),
        }
    }

    /// The client writes `frames` as one message.
    fn send(&mut self, frames: &[ClientFrame]) {
        let mut msg = Vec::new();
        for (k, f, id, p) in frames {
            if *k == Kind::RequestHeaders {
                self.client_send
                    .entry(*id)
                    .or_insert(SendWindow::new(u64::from(WINDOW)));
            }
            frame::push_frame(&mut msg, *k, *f, *id, p);
        }
        self.to_server.push_back(msg);
    }

    /// The client sends `len` bytes on call `id` if its window allows.
    fn client_data(&mut self, id: u32, len: usize, end: bool) -> bool {
        let w = self.client_send.get_mut(&id).expect("open call");
        if !w.try_send(len) {
            return false;
        }
        let flags = if end { END_STREAM } else { 0 };
        self.send(&[(Kind::Data, flags, id, vec![7; len])]);
        true
    }

    /// The server reads every message written so far.
    fn deliver(&mut self) {
        while let Some(msg) = self.to_server.pop_front() {
            server::decode(&msg, &mut self.inbox);
            let (now, reads) = (self.now, &mut self.clock_reads);
            let r = self.server.handle(self.inbox.drain(..), &mut || {
                *reads += 1;
                now
            });
            if let Err(e) = r {
                self.proto_failed = true;
                self.error.get_or_insert(e);
            }
            self.perform();
        }
    }

    fn perform(&mut self) {
        while let Some(out) = self.server.poll_output() {
            match out {
                Output::Send {
                    kind,
                    flags,
                    id,
                    payload,
                    refusal,
                } => {
                    if let Some(server::Refusal::TooManyCalls { .. }) = refusal {
                        self.refused_full += 1;
                    }
                    self.to_client.push((kind, flags, id, payload));
                }
                Output::Start {
                    key,
                    chunks,
                    end,
                    send_credit,
                    deadline,
                    ..
                } => {
                    let delivered = chunks.iter().map(Bytes::len).sum();
                    let prev = self.app.insert(
                        key.id,
                        AppCall {
                            key,
                            unread: chunks.into_deque(),
                            delivered,
                            ended: end,
                            unacked: Unacked::new(WINDOW),
                            send: SendWindow::new(u64::from(send_credit)),
                            deadline,
                        },
                    );
                    assert!(prev.is_none(), "call {key:?} started twice");
                }
                Output::Data { key, data } => {
                    let c = self.app.get_mut(&key.id).expect("data for a started call");
                    assert_eq!(c.key, key);
                    assert!(!c.ended, "data after the end of the request");
                    c.delivered += data.len();
                    c.unread.push_back(data);
                }
                Output::EndOfRequest { key } => {
                    let c = self.app.get_mut(&key.id).expect("a started call");
                    assert!(!c.ended);
                    c.ended = true;
                }
                Output::Grant { key, inc } => {
                    let c = self.app.get_mut(&key.id).expect("a started call");
                    if let Err(e) = c.send.grant(inc) {
                        self.error.get_or_insert(e);
                    }
                }
                Output::Cancel { key } => {
                    let c = self.app.remove(&key.id).expect("a started call");
                    assert_eq!(c.key, key);
                    self.cancelled.push(key);
                }
                Output::Expire { key } => {
                    // The driver: the handler is dropped, the call's task
                    // answers DEADLINE_EXCEEDED and ends.
                    let c = self.app.remove(&key.id).expect("a started call");
                    assert_eq!(c.key, key);
                    let at = c.deadline.expect("a call with a deadline");
                    assert!(
                        at <= self.now,
                        "expired at {:?}, before its deadline",
                        self.now - at
                    );
                    self.expired.push(key);
                    self.server.handle_note(Note::Released(key));
                    let (kind, flags, payload) =
                        server::trailers_only(tonic::Status::deadline_exceeded("deadline"));
                    self.to_client.push((kind, flags, key.id, payload));
                    self.server.handle_note(Note::Finished(key));
                }
            }
        }
    }

    /// Time goes to `now`: the driver's timer fires if a deadline passed.
    fn tick(&mut self, now: Instant) {
        self.now = now;
        if self.server.poll_timeout().is_some_and(|at| at <= now) {
            self.server.handle_timeout(now);
        }
        self.perform();
    }

    /// The handler of `id` reads one chunk; a due WINDOW_UPDATE goes out.
    fn consume(&mut self, id: u32) -> bool {
        let Some(c) = self.app.get_mut(&id) else {
            return false;
        };
        let Some(b) = c.unread.pop_front() else {
            return false;
        };
        if let Some(inc) = c.unacked.consumed(b.len()) {
            self.server.handle_note(Note::Returned(c.key, inc));
            self.to_client.push((
                Kind::WindowUpdate,
                0,
                id,
                Bytes::copy_from_slice(&frame::window_update_payload(inc)),
            ));
        }
        true
    }

    /// The handler of `id` answers: its place is freed, trailers go out,
    /// its task ends.
    fn finish(&mut self, id: u32) {
        let c = self.app.remove(&id).expect("a started call");
        self.server.handle_note(Note::Released(c.key));
        let ok = frame::metadata_payload(&http::HeaderMap::new());
        self.to_client
            .push((Kind::Trailers, END_STREAM, id, ok.into()));
        self.server.handle_note(Note::Finished(c.key));
    }

    /// The client reads what the server wrote, through the client's own
    /// decoding ([`client::decode`]): window updates grant credit, GOAWAY
    /// stops new calls. Returns the calls' events.
    fn client_reads(&mut self) -> Vec<(u32, Event)> {
        let got = std::mem::take(&mut self.to_client);
        let mut msg = Vec::new();
        for (k, f, id, p) in &got {
            frame::push_frame(&mut msg, *k, *f, *id, p);
        }
        let (mut events, mut goaway, mut bad) = (Vec::new(), false, None);
        client::decode(&msg, &mut events, &mut goaway, &mut bad);
        assert!(bad.is_none(), "the server broke the protocol: {bad:?}");
        if goaway {
            self.client.handle_goaway();
        }
        for (id, ev) in &events {
            if let Event::Window(inc) = ev
                && let Some(w) = self.client_send.get_mut(id)
            {
                w.grant(*inc).expect("no overflow");
            }
        }
        events
    }

    /// The handler of `id` sends `len` response bytes if its send credit
    /// allows.
    fn respond(&mut self, id: u32, len: usize) -> bool {
        let c = self.app.get_mut(&id).expect("a started call");
        if !c.send.try_send(len) {
            return false;
        }
        self.to_client
            .push((Kind::Data, 0, id, Bytes::from(vec![3; len])));
        true
    }

    /// The client's receive: the server's frames go through the client's
    /// decoding into its call table (its receive windows checked): the
    /// violation the client found, if any.
    fn client_receive(&mut self) -> Result<(), FrameError> {
        let mut msg = Vec::new();
        for (k, f, id, p) in self.to_client.drain(..) {
            frame::push_frame(&mut msg, k, f, id, &p);
        }
        let (mut events, mut goaway, mut bad) = (Vec::new(), false, None);
        client::decode(&msg, &mut events, &mut goaway, &mut bad);
        if goaway {
            self.client.handle_goaway();
        }
        for (id, ev) in events {
            if matches!(ev, Event::Trailers(_) | Event::Headers { end: true, .. }) {
                self.client_ended.push(id);
            }
            match self.client.deliver(id, ev) {
                Ok(client::Delivered::Grant((), inc)) => {
                    if let Some(w) = self.client_send.get_mut(&id) {
                        w.grant(inc).expect("no overflow");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    bad.get_or_insert(e);
                }
            }
        }
        bad.map_or(Ok(()), Err)
    }

    /// The client's application reads every response event of call `id`
    /// queued so far; the WINDOW_UPDATEs that become due go to the server.
    /// Returns the response bytes read.
    fn client_read(&mut self, id: u32) -> usize {
        let call = self.client.call_mut(id).expect("open call");
        let (mut read, mut updates) = (0, Vec::new());
        loop {
            let mut update = None;
            let Some(ev) = call.pop_event(&mut update) else {
                break;
            };
            if let Event::Data(b) = ev {
                read += b.len();
            }
            if let Some(inc) = update {
                updates.push((
                    Kind::WindowUpdate,
                    0,
                    id,
                    frame::window_update_payload(inc).to_vec(),
                ));
            }
        }
        for u in updates {
            self.send(&[u]);
        }
        read
    }

    fn refusals(&self) -> Vec<u32> {
        self.to_client
            .iter()
            .filter(|(k, f, _, _)| *k == Kind::Trailers && *f == END_STREAM)
            .map(|(_, _, id, _)| *id)
            .collect()
    }
}

fn open(id: u32, end: bool) -> ClientFrame {
    let flags = if end { END_STREAM } else { 0 };
    (Kind::RequestHeaders, flags, id, open_payload(None))
}

#[test]
fn a_unary_call_starts_with_its_data_and_frees_its_place() {
    let mut p = Pair::new(4, None);
    p.send(&[
        open(1, false),
        (Kind::Data, END_STREAM, 1, b"hello".to_vec()),
    ]);
    p.deliver();
    let c = &p.app[&1];
    assert!(c.ended);
    assert_eq!(c.unread, [Bytes::from_static(b"hello")]);
    assert_eq!(p.server.active(), 1);
    assert_eq!(p.clock_reads, 0, "no deadline: the clock is not read");
    p.finish(1);
    assert_eq!((p.server.active(), p.server.open_calls()), (0, 0));
}

#[test]
fn a_stalled_reader_stalls_only_its_call() {
    let mut p = Pair::new(4, None);
    p.send(&[open(1, false), open(2, false)]);
    p.deliver();
    // Call 1's handler never reads: its client runs out of window.
    let mut sent1 = 0;
    while p.client_data(1, 600, false) {
        sent1 += 1;
    }
    assert_eq!(sent1, 3, "3 * 612 of 2048; a fourth frame does not fit");
    // Call 2 goes on: its handler reads, and its window is handed back.
    for _ in 0..20 {
        assert!(p.client_data(2, 500, false), "call 2 is never stalled");
        p.deliver();
        while p.consume(2) {}
        p.client_reads();
    }
    assert!(p.error.is_none());
    assert_eq!(p.app[&2].delivered, 20 * 500);
    assert_eq!(p.app[&1].delivered, 3 * 600);
    assert_eq!(
        p.server.recv_window(1).expect("open").left(),
        2048 - 3 * 612
    );
    // Call 1's reader wakes up: the client may send again.
    while p.consume(1) {}
    p.client_reads();
    assert!(p.client_data(1, 500, true));
    p.deliver();
    assert!(p.app[&1].ended);
}

#[test]
fn data_beyond_the_window_is_a_sticky_connection_error() {
    let mut p = Pair::new(4, None);
    p.send(&[open(1, false)]);
    for _ in 0..4 {
        p.send(&[(Kind::Data, 0, 1, vec![0; 600])]);
    }
    p.deliver();
    let e = p
        .error
        .clone()
        .expect("the fourth frame is beyond the window");
    assert!(e.to_string().contains("flow-control window"), "{e}");
    assert_eq!(
        p.app[&1].delivered, 1800,
        "nothing beyond the window delivered"
    );
    // Sticky: a valid frame later still fails.
    p.send(&[open(3, true)]);
    p.deliver();
    assert!(!p.app.contains_key(&3));
}

#[test]
fn a_cancelled_call_frees_its_place_and_late_events_are_ignored() {
    let mut p = Pair::new(1, None);
    p.send(&[open(1, false)]);
    p.deliver();
    let key = p.app[&1].key;
    p.send(&[(Kind::Cancel, 0, 1, Vec::new())]);
    p.deliver();
    assert_eq!(p.cancelled, [key]);
    assert_eq!(p.server.active(), 0);
    // Late frames and notes of the cancelled call change nothing.
    p.send(&[(Kind::Data, 0, 1, vec![1; 100])]);
    p.deliver();
    p.server.handle_note(Note::Released(key));
    p.server.handle_note(Note::Finished(key));
    // The id is reused by a new call, which takes the free place; the old
    // call's late note does not free it.
    p.send(&[open(1, false)]);
    p.deliver();
    assert_ne!(p.app[&1].key, key);
    p.server.handle_note(Note::Released(key));
    assert_eq!(p.server.active(), 1);
    p.send(&[open(2, true)]);
    p.deliver();
    assert_eq!(p.refusals(), [2], "one place, taken");
    // A call cancelled in the message that opened it never starts.
    p.to_client.clear();
    p.finish(1);
    p.send(&[open(5, false), (Kind::Cancel, 0, 5, Vec::new())]);
    p.deliver();
    assert!(!p.app.contains_key(&5));
    assert_eq!((p.server.active(), p.server.open_calls()), (0, 0));
    assert!(p.error.is_none());
}

#[test]
fn calls_beyond_the_limit_are_refused_until_a_place_is_released() {
    let mut p = Pair::new(2, None);
    p.send(&[open(1, false), open(2, false), open(3, true)]);
    p.deliver();
    assert_eq!(p.refusals(), [3]);
    // Released (its last frame about to go out), not yet finished: the
    // next call gets the place.
    let k1 = p.app[&1].key;
    p.server.handle_note(Note::Released(k1));
    p.send(&[open(4, true), open(6, true)]);
    p.deliver();
    assert!(p.app.contains_key(&4));
    assert_eq!(p.refusals(), [3, 6]);
    assert_eq!(p.server.open_calls(), 3, "1 still sending its last frame");
    p.server.handle_note(Note::Finished(k1));
    assert_eq!(p.server.active(), 2);
}

#[test]
fn draining_refuses_new_calls_and_ends_when_the_last_call_does() {
    let mut p = Pair::new(4, None);
    p.send(&[open(1, false)]);
    p.deliver();
    p.server.start_drain();
    p.server.start_drain();
    p.perform();
    let goaways = p.to_client.iter().filter(|f| f.0 == Kind::GoAway).count();
    assert_eq!(goaways, 1, "GOAWAY once");
    p.send(&[open(3, true)]);
    p.deliver();
    assert_eq!(p.refusals(), [3]);
    assert!(!p.server.is_drained(), "call 1 is in flight");
    // The client sees GOAWAY, then call 3's refusal: new calls fail at
    // once, `Unavailable` either way.
    let events = p.client_reads();
    let st = p
        .client
        .open((), None)
        .expect_err("no new calls after GOAWAY");
    assert_eq!(st.code(), tonic::Code::Unavailable);
    match &events[..] {
        [(3, Event::Trailers(t))] => assert_eq!(t["grpc-status"], "14"),
        e => panic!("{e:?}"),
    }
    p.finish(1);
    assert!(p.server.is_drained());
    let events = p.client_reads();
    assert!(
        matches!(&events[..], [(1, Event::Trailers(_))]),
        "{events:?}"
    );
}

/// Both state machines, response direction: a client whose application
/// stops reading one call's response stalls that call's sender on the
/// server, and only that call; reading again reopens it.
#[test]
fn a_stalled_response_reader_stalls_only_its_call() {
    let mut p = Pair::new(4, None);
    let a = p.client.open((), None).expect("open");
    let b = p.client.open((), None).expect("open");
    p.send(&[open(a, true), open(b, true)]);
    p.deliver();
    let mut sent_a = 0;
    while p.respond(a, 600) {
        sent_a += 1;
    }
    assert_eq!(sent_a, 3, "3 * 612 of the client's 2048");
    for _ in 0..20 {
        assert!(p.respond(b, 600), "call b is never stalled");
        p.client_receive().expect("within the windows");
        assert_eq!(p.client_read(b), 600);
        p.deliver();
    }
    assert!(p.error.is_none());
    assert!(!p.respond(a, 600), "a is still stalled");
    assert_eq!(p.client_read(a), 1800);
    p.deliver();
    assert!(p.respond(a, 600), "reading reopened a's window");
    // A server that ignored the window would break the client's.
    let mut p2 = Pair::new(4, None);
    let c = p2.client.open((), None).expect("open");
    p2.send(&[open(c, true)]);
    p2.deliver();
    for _ in 0..4 {
        p2.to_client
            .push((Kind::Data, 0, c, Bytes::from(vec![0; 600])));
    }
    let e = p2.client_receive().expect_err("DATA beyond the window");
    assert!(e.to_string().contains("flow-control window"), "{e}");
}

#[test]
fn deadlines_are_taken_on_the_given_clock() {
    let mut p = Pair::new(4, Some(Duration::from_millis(300)));
    let t0 = p.now;
    p.send(&[(
        Kind::RequestHeaders,
        END_STREAM,
        1,
        open_payload(Some("100m")),
    )]);
    p.deliver();
    p.now += Duration::from_secs(1);
    p.send(&[(
        Kind::RequestHeaders,
        END_STREAM,
        3,
        open_payload(Some("5S")),
    )]);
    p.send(&[open(5, true)]);
    p.deliver();
    assert_eq!(p.app[&1].deadline, Some(t0 + Duration::from_millis(100)));
    assert_eq!(
        p.app[&3].deadline,
        Some(t0 + Duration::from_millis(1300)),
        "the server's timeout is shorter"
    );
    assert_eq!(p.app[&5].deadline, Some(t0 + Duration::from_millis(1300)));
    let mut p = Pair::new(4, None);
    p.send(&[open(1, true)]);
    p.deliver();
    assert_eq!((p.app[&1].deadline, p.clock_reads), (None, 0));
}

fn open_timed(id: u32, end: bool, timeout: &str) -> ClientFrame {
    let flags = if end { END_STREAM } else { 0 };
    (Kind::RequestHeaders, flags, id, open_payload(Some(timeout)))
}

#[test]
fn a_deadline_expires_at_its_instant_and_the_client_gets_deadline_exceeded() {
    let mut p = Pair::new(1, None);
    let t0 = p.now;
    p.send(&[open_timed(1, false, "100m")]);
    p.deliver();
    let key = p.app[&1].key;
    assert_eq!(
        p.server.poll_timeout(),
        Some(t0 + Duration::from_millis(100))
    );
    p.tick(t0 + Duration::from_millis(99));
    p.server.handle_timeout(p.now);
    p.perform();
    assert!(p.expired.is_empty() && p.app.contains_key(&1), "not before");
    p.tick(t0 + Duration::from_millis(100));
    assert_eq!(p.expired, [key], "at its instant: the handler is told");
    assert!(!p.app.contains_key(&1), "the handler is dropped");
    assert_eq!((p.server.active(), p.server.open_calls()), (0, 0));
    assert_eq!(p.server.poll_timeout(), None);
    let events = p.client_reads();
    let code = events.iter().find_map(|(id, ev)| match ev {
        Event::Trailers(t) if *id == 1 => Some(tonic::Status::from_header_map(t)?.code()),
        _ => None,
    });
    assert_eq!(code, Some(tonic::Code::DeadlineExceeded));
    // The place is free: the next call is admitted.
    p.send(&[open(3, true)]);
    p.deliver();
    assert!(p.app.contains_key(&3) && p.refusals().is_empty());
    // A later timeout expires nothing more.
    p.server.handle_timeout(t0 + Duration::from_secs(60));
    assert!(p.server.poll_output().is_none());
}

#[test]
fn poll_timeout_gives_the_earliest_live_deadline() {
    let mut p = Pair::new(8, Some(Duration::from_millis(500)));
    let t0 = p.now;
    let ms = |n| t0 + Duration::from_millis(n);
    p.send(&[
        open_timed(1, false, "300m"),
        open_timed(3, false, "100m"),
        open_timed(5, false, "200m"),
        open(7, false),
    ]);
    p.deliver();
    assert_eq!(p.server.poll_timeout(), Some(ms(100)));
    p.finish(3);
    assert_eq!(
        p.server.poll_timeout(),
        Some(ms(200)),
        "a finished call is ignored"
    );
    p.send(&[(Kind::Cancel, 0, 5, Vec::new())]);
    p.deliver();
    assert_eq!(
        p.server.poll_timeout(),
        Some(ms(300)),
        "a cancelled call is ignored"
    );
    p.tick(ms(300));
    assert_eq!(p.expired.len(), 1);
    assert_eq!(
        p.server.poll_timeout(),
        Some(ms(500)),
        "the server's timeout"
    );
    p.finish(7);
    assert_eq!(p.server.poll_timeout(), None);
    // Entries of calls that ended early are swept: the heap stays small.
    for i in 0..1000u32 {
        let id = 11 + 2 * i;
        p.send(&[open_timed(id, true, "10S")]);
        p.deliver();
        p.finish(id);
    }
    assert!(
        p.server.deadline_entries() <= 33,
        "{}",
        p.server.deadline_entries()
    );
    assert_eq!(p.server.poll_timeout(), None);
    assert!(p.expired.len() == 1);
}

/// The client's side of admission, as its driver does it: a call admitted
/// at once opens; a queued one opens when its waiter comes back.
fn client_call(c: &mut client::Client<(), u32>, label: u32) -> Result<u32, client::Ticket> {
    match c.admit(None, || label).expect("not closed") {
        client::Admission::Admitted => Ok(c.open((), None).expect("open")),
        client::Admission::Queued(t) => Err(t),
    }
}

#[test]
fn queued_calls_are_admitted_in_order_as_places_free() {
    // The server takes 2 calls; so does the client's admission.
    let mut p = Pair::new(2, None);
    let mut c = client::Client::<(), u32>::new(WINDOW, 2);
    let a = client_call(&mut c, 0).expect("a place");
    let b = client_call(&mut c, 1).expect("a place");
    let queued: Vec<_> = (2..5)
        .map(|l| client_call(&mut c, l).expect_err("in line"))
        .collect();
    assert_eq!((c.places(), c.queued()), (2, 3));
    p.send(&[open(a, false), open(b, false)]);
    p.deliver();
    let mut admitted = Vec::new();
    for done in [a, b] {
        // The server answers; the client sees the trailers, the call's
        // place passes to the first in line, which opens.
        p.finish(done);
        let ended = p
            .client_reads()
            .iter()
            .any(|(id, ev)| *id == done && matches!(ev, Event::Trailers(_)));
        assert!(ended);
        c.remove(done);
        let next = c.release().expect("one waits");
        let id = c.open((), None).expect("open");
        admitted.push(next);
        p.send(&[open(id, false)]);
        p.deliver();
        assert!(
            p.app.contains_key(&id) && p.refusals().is_empty(),
            "the server admits it"
        );
        // A call that arrives meanwhile queues behind those in line.
        assert!(client_call(&mut c, 10 + done).is_err());
    }
    assert_eq!(admitted, [2, 3], "first come, first served");
    assert_eq!(c.places(), 2);
    let rest: Vec<_> = std::iter::from_fn(|| c.release()).collect();
    assert_eq!(rest, [4, 10 + a, 10 + b]);
    assert_eq!(
        c.places(),
        1,
        "3 releases passed their place on, the 4th freed it"
    );
    assert_eq!((c.release(), c.places()), (None, 0));
    drop(queued);
}

#[test]
fn a_queued_call_that_is_dropped_takes_no_place() {
    let mut c = client::Client::<(), u32>::new(WINDOW, 1);
    client_call(&mut c, 0).expect("a place");
    let gone = client_call(&mut c, 1).expect_err("in line");
    let next = client_call(&mut c, 2).expect_err("in line");
    assert!(c.leave_queue(gone), "it leaves the line");
    assert!(!c.leave_queue(gone), "once");
    assert_eq!(c.release(), Some(2), "the place skips the dropped call");
    assert!(!c.leave_queue(next), "admitted: its place is to give back");
    assert_eq!((c.release(), c.places()), (None, 0));
    // Closing empties the line (the waiters are dropped) and fails new calls.
    client_call(&mut c, 3).expect("a place");
    let t = client_call(&mut c, 4).expect_err("in line");
    let _ = c.close((tonic::Code::Unavailable, "gone".into())).count();
    assert_eq!(c.queued(), 0);
    assert!(!c.leave_queue(t));
    assert!(c.admit(None, || 5).is_err());
}

#[test]
fn protocol_violations_are_connection_errors() {
    let cases: Vec<Vec<ClientFrame>> = vec![
        vec![open(1, false), open(1, false)],
        vec![(Kind::Trailers, END_STREAM, 1, Vec::new())],
        vec![(Kind::GoAway, 0, 0, Vec::new())],
        vec![(Kind::WindowUpdate, 0, 1, vec![0, 0, 0, 0])],
        vec![
            open(1, false),
            (
                Kind::WindowUpdate,
                0,
                1,
                frame::window_update_payload(frame::MAX_WINDOW).to_vec(),
            ),
        ],
    ];
    for frames in cases {
        let mut p = Pair::new(4, None);
        p.send(&frames);
        p.deliver();
        assert!(p.error.is_some(), "{frames:?}");
        assert!(p.app.is_empty(), "no call of a bad message starts");
        assert_eq!(p.server.active(), 0);
    }
    // Garbage bytes.
    let mut p = Pair::new(4, None);
    p.to_server.push_back(vec![9, 9, 9]);
    p.deliver();
    assert!(p.error.is_some());
}

/// One step of a random client, or of the server's application.
#[derive(Debug, Clone)]
enum Op {
    /// Opens a new call (ids increase, as a client's do).
    Open {
        end: bool,
        data: usize,
        timeout: bool,
    },
    /// Request data on the `n`th id opened; `over`: ignore the window.
    Data {
        n: usize,
        len: usize,
        end: bool,
        over: bool,
    },
    Cancel {
        n: usize,
    },
    /// Reopens the `n`th id (a violation if it is still open).
    Reuse {
        n: usize,
    },
    Window {
        n: usize,
        inc: u32,
    },
    Garbage(Vec<u8>),
    /// The client's next frames go in a new message.
    Flush,
    /// The `n`th call's handler sends `len` response bytes (within its
    /// send credit).
    Respond {
        n: usize,
        len: usize,
    },
    /// The client's application reads the `n`th call's response so far.
    ClientRead {
        n: usize,
    },
    Consume {
        n: usize,
    },
    Finish {
        n: usize,
    },
    Release {
        n: usize,
    },
    Drain,
    Tick(u64),
    /// The `n`th call waiting in line is dropped by its caller.
    GiveUp {
        n: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 0usize..600, any::<bool>())
            .prop_map(|(end, data, timeout)| Op::Open { end, data, timeout }),
        6 => (0usize..8, 0usize..900, prop::bool::weighted(0.2), prop::bool::weighted(0.05))
            .prop_map(|(n, len, end, over)| Op::Data { n, len, end, over }),
        1 => (0usize..8).prop_map(|n| Op::Cancel { n }),
        1 => (0usize..8).prop_map(|n| Op::Reuse { n }),
        1 => (0usize..8, prop_oneof![1u32..5000, Just(frame::MAX_WINDOW)])
            .prop_map(|(n, inc)| Op::Window { n, inc }),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Op::Garbage),
        4 => Just(Op::Flush),
        4 => (0usize..8).prop_map(|n| Op::Consume { n }),
        2 => (0usize..8).prop_map(|n| Op::Finish { n }),
        1 => (0usize..8).prop_map(|n| Op::Release { n }),
        1 => Just(Op::Drain),
        1 => (0u64..500).prop_map(Op::Tick),
        1 => (0usize..8).prop_map(|n| Op::GiveUp { n }),
        4 => (0usize..8, 0usize..900).prop_map(|(n, len)| Op::Respond { n, len }),
        3 => (0usize..8).prop_map(|n| Op::ClientRead { n }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random frame orders and interleavings: the state machine never
    /// panics; no call is started twice or lost (every REQUEST_HEADERS of a
    /// message without violation is started or refused, exactly once);
    /// places never exceed the limit; data never exceeds a window, and
    /// what a call's handler got is what the client sent it; a violation is
    /// a sticky connection error. Responses go through the client's state
    /// machine: with a client that keeps the protocol (no reused ids, no
    /// forged window updates, no data beyond a window, no garbage) nothing
    /// fails on either side and every response byte sent is read.
    #[test]
    fn random_interleavings_keep_the_invariants(ops in prop::collection::vec(op(), 1..80)) {
        const LIMIT: usize = 3;
        let mut p = Pair::new(LIMIT, Some(Duration::from_millis(700)));
        // The client admits as many calls as the server takes; the excess
        // waits in line: (ticket, label, the call's Open).
        p.client = client::Client::new(WINDOW, LIMIT);
        let mut line: VecDeque<(client::Ticket, u64, (bool, usize, bool))> = VecDeque::new();
        let mut next_label = 0u64;
        let mut last_admitted: Option<u64> = None;
        let mut ended: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut ids: Vec<u32> = Vec::new();
        let mut msg: Vec<ClientFrame> = Vec::new();
        // Per id: request bytes the client sent while the call was open.
        let mut sent: HashMap<u32, usize> = HashMap::new();
        let mut req_open: HashMap<u32, bool> = HashMap::new();
        let mut opened_in_msg: Vec<u32> = Vec::new();
        let mut cancelled_in_msg: Vec<u32> = Vec::new();
        // A client that never breaks the protocol nor reuses ids.
        let mut well_behaved = true;
        // Per id: response bytes the handler sent, and the client read.
        let mut responded: HashMap<u32, usize> = HashMap::new();
        let mut read: HashMap<u32, usize> = HashMap::new();
        let pick = |ids: &Vec<u32>, n: usize| (!ids.is_empty()).then(|| ids[n % ids.len()]);
        for op in ops {
            // The client opens `$open` (a call holding a place).
            macro_rules! open_call {
                ($open:expr) => {{
                    let (end, data, timeout): (bool, usize, bool) = $open;
                    // The client's table gives the id; after GOAWAY it
                    // opens nothing and gives its place back.
                    match p.client.open((), None) {
                        Ok(id) => Some((id, end, data, timeout)),
                        Err(_) => {
                            // Each waiter the place passes to fails too.
                            while pass_on(&mut p, &mut line, &mut last_admitted).is_some() {}
                            None
                        }
                    }
                }};
            }
            let opening = match op {
                Op::Open { end, data, timeout } => {
                    next_label += 1;
                    let label = next_label;
                    match p.client.admit(None, || label) {
                        Ok(client::Admission::Admitted) => open_call!((end, data, timeout)),
                        Ok(client::Admission::Queued(t)) => {
                            line.push_back((t, label, (end, data, timeout)));
                            None
                        }
                        Err(_) => None,
                    }
                }
                Op::GiveUp { n } => {
                    if !line.is_empty() {
                        let (t, _, _) = line.remove(n % line.len()).expect("in line");
                        prop_assert!(p.client.leave_queue(t), "still in line");
                    }
                    None
                }
                _ => None,
            };
            if let Some((id, end, data, timeout)) = opening {
                {
                    ids.push(id);
                    let t = timeout.then_some("250m");
                    let flags = if end && data == 0 { END_STREAM } else { 0 };
                    msg.push((Kind::RequestHeaders, flags, id, open_payload(t)));
                    p.client_send.insert(id, SendWindow::new(u64::from(WINDOW)));
                    sent.insert(id, 0);
                    req_open.insert(id, flags == 0);
                    opened_in_msg.push(id);
                    if data > 0 {
                        p.client_send.get_mut(&id).expect("open").try_send(data);
                        msg.push((Kind::Data, if end { END_STREAM } else { 0 }, id, vec![1; data]));
                        *sent.get_mut(&id).expect("open") += data;
                        req_open.insert(id, !end);
                    }
                }
            }
            match op {
                Op::Open { .. } | Op::GiveUp { .. } => {}
                Op::Data { n, len, end, over } => {
                    let Some(id) = pick(&ids, n) else { continue };
                    well_behaved &= !over;
                    let ok = over || p.client_send.get_mut(&id).is_some_and(|w| w.try_send(len));
                    if !ok {
                        continue;
                    }
                    msg.push((Kind::Data, if end { END_STREAM } else { 0 }, id, vec![2; len]));
                    if req_open[&id]
                        && let Some(s) = sent.get_mut(&id)
                    {
                        *s += len;
                    }
                    if end {
                        req_open.insert(id, false);
                    }
                }
                Op::Cancel { n } => {
                    let Some(id) = pick(&ids, n) else { continue };
                    msg.push((Kind::Cancel, 0, id, Vec::new()));
                    cancelled_in_msg.push(id);
                    // The CANCEL is written: the call's place is given back.
                    p.client_ended.push(id);
                }
                Op::Reuse { n } => {
                    let Some(id) = pick(&ids, n) else { continue };
                    well_behaved = false;
                    msg.push(open(id, true));
                    opened_in_msg.push(id);
                    p.client_send.insert(id, SendWindow::new(u64::from(WINDOW)));
                    req_open.insert(id, false);
                    sent.insert(id, 0);
                }
                Op::Window { n, inc } => {
                    let Some(id) = pick(&ids, n) else { continue };
                    well_behaved = false;
                    msg.push((Kind::WindowUpdate, 0, id, frame::window_update_payload(inc).to_vec()));
                }
                Op::Garbage(bytes) => {
                    well_behaved = false;
                    flush(&mut p, &mut msg, &mut opened_in_msg, &mut cancelled_in_msg);
                    p.to_server.push_back(bytes);
                    p.deliver();
                }
                Op::Flush => flush(&mut p, &mut msg, &mut opened_in_msg, &mut cancelled_in_msg),
                Op::Consume { n } => {
                    if let Some(id) = pick(&ids, n) {
                        p.consume(id);
                        if let Err(e) = p.client_receive() {
                            // Only a misbehaving client makes the server
                            // break the client's windows.
                            prop_assert!(!well_behaved, "{}", e);
                            break;
                        }
                    }
                }
                Op::Respond { n, len } => {
                    if let Some(id) = pick(&ids, n).filter(|id| p.app.contains_key(id))
                        && p.respond(id, len)
                    {
                        *responded.entry(id).or_default() += len;
                    }
                }
                Op::ClientRead { n } => {
                    if let Some(id) = pick(&ids, n).filter(|id| p.client.call_mut(*id).is_some()) {
                        *read.entry(id).or_default() += p.client_read(id);
                    }
                }
                Op::Finish { n } => {
                    if let Some(id) = pick(&ids, n).filter(|id| p.app.contains_key(id)) {
                        p.finish(id);
                    }
                }
                Op::Release { n } => {
                    if let Some(c) = pick(&ids, n).and_then(|id| p.app.get(&id)) {
                        let key = c.key;
                        p.server.handle_note(Note::Released(key));
                        // Twice: released once.
                        p.server.handle_note(Note::Released(key));
                    }
                }
                Op::Drain => {
                    p.server.start_drain();
                    p.perform();
                }
                Op::Tick(ms) => {
                    let now = p.now + Duration::from_millis(ms);
                    p.tick(now);
                }
            }
            // The timer is armed at the earliest deadline of a started
            // call not yet expired, never in the past after a tick.
            let earliest = p.app.values().filter_map(|c| c.deadline).min();
            prop_assert_eq!(p.server.poll_timeout(), earliest);
            // Calls the client saw end give their place back, to the
            // first in line, which opens.
            for id in std::mem::take(&mut p.client_ended) {
                if ended.insert(id)
                    && let Some(open) = pass_on(&mut p, &mut line, &mut last_admitted)
                    && let Some((id, end, data, _)) = open_call!(open)
                {
                    // Opened later, without a deadline (the clock is the
                    // server's to read).
                    ids.push(id);
                    let _ = data;
                    let flags = if end { END_STREAM } else { 0 };
                    msg.push((Kind::RequestHeaders, flags, id, open_payload(None)));
                    p.client_send.insert(id, SendWindow::new(u64::from(WINDOW)));
                    sent.insert(id, 0);
                    req_open.insert(id, flags == 0);
                    opened_in_msg.push(id);
                }
            }
            prop_assert!(p.client.places() <= LIMIT);
            if well_behaved {
                // The client's admission keeps to the server's limit: no
                // call is refused for want of a place.
                prop_assert_eq!(p.refused_full, 0);
            }
            prop_assert!(p.server.active() <= LIMIT);
            prop_assert!(p.server.active() <= p.server.open_calls());
            for id in &ids {
                if let Some(w) = p.server.recv_window(*id) {
                    prop_assert!(w.left() <= w.window());
                }
            }
            if p.error.is_some() {
                break;
            }
            // Every started call got exactly what was sent to it.
            for (id, c) in p.app.iter().filter(|_| msg.is_empty()) {
                prop_assert_eq!(Some(&c.delivered), sent.get(id), "call {}", id);
            }
        }
        if p.error.is_none() {
            flush(&mut p, &mut msg, &mut opened_in_msg, &mut cancelled_in_msg);
        }
        if well_behaved {
            // Nothing broke, and every response byte sent was read.
            prop_assert!(p.error.is_none(), "{:?}", p.error);
            prop_assert!(p.client_receive().is_ok());
            for id in &ids {
                *read.entry(*id).or_default() += p.client_read(*id);
            }
            for id in &ids {
                prop_assert_eq!(read.get(id).copied().unwrap_or(0), responded.get(id).copied().unwrap_or(0), "call {}", id);
            }
        }
        if p.proto_failed {
            // Sticky: the server accepts nothing more.
            let before = p.app.len();
            p.send(&[open(9999, true)]);
            p.deliver();
            prop_assert_eq!(p.app.len(), before);
            prop_assert!(p.to_client.iter().all(|f| f.2 != 9999));
        }
    }
}

/// A place is given back: it passes to the first call in line (FIFO,
/// checked), whose Open is returned, or is freed.
fn pass_on(
    p: &mut Pair,
    line: &mut VecDeque<(client::Ticket, u64, (bool, usize, bool))>,
    last: &mut Option<u64>,
) -> Option<(bool, usize, bool)> {
    let label = p.client.release()?;
    let (_, first, open) = line.pop_front().expect("a waiter is one in line");
    assert_eq!(label, first, "first in line, first admitted");
    assert!(last.is_none_or(|l| l < label), "FIFO");
    *last = Some(label);
    Some(open)
}

/// Sends the frames gathered so far as one message; checks that each call
/// it opened was started or refused exactly once (unless the message broke
/// the protocol).
fn flush(
    p: &mut Pair,
    msg: &mut Vec<ClientFrame>,
    opened: &mut Vec<u32>,
    cancelled: &mut Vec<u32>,
) {
    if msg.is_empty() {
        return;
    }
    let starts_before: Vec<CallKey> = p.app.values().map(|c| c.key).collect();
    // What the server writes for this message comes after `mark`.
    let mark = p.to_client.len();
    p.send(msg);
    msg.clear();
    p.deliver();
    let opened = std::mem::take(opened);
    let cancelled = std::mem::take(cancelled);
    if p.error.is_some() {
        return;
    }
    let mut ids = opened.clone();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let opens = opened.iter().filter(|o| **o == id).count();
        let cancels = cancelled.iter().filter(|o| **o == id).count();
        let started = p
            .app
            .get(&id)
            .is_some_and(|c| !starts_before.contains(&c.key)) as usize;
        let refused = p.to_client[mark..]
            .iter()
            .filter(|f| f.2 == id && f.1 == END_STREAM && f.0 != Kind::WindowUpdate)
            .count();
        // Each REQUEST_HEADERS is started or refused once, unless a CANCEL
        // of the same message dropped it before it started.
        assert!(
            started + refused <= opens && started + refused + cancels >= opens,
            "call {id}: opened {opens}, cancelled {cancels}, started {started}, refused {refused}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `Chunks` (the first chunk inline) is a FIFO queue: any run of pushes and pops
    /// gives what a `VecDeque` gives.
    #[test]
    fn chunks_queue_in_order(ops in proptest::collection::vec(any::<Option<u8>>(), 0..64)) {
        let mut q = super::Chunks::default();
        let mut model = VecDeque::new();
        for op in ops {
            match op {
                Some(v) => {
                    let b = Bytes::from(vec![v]);
                    q.push_back(b.clone());
                    model.push_back(b);
                }
                None => prop_assert_eq!(q.pop_front(), model.pop_front()),
            }
            prop_assert_eq!(q.len(), model.len());
            prop_assert!(q.iter().eq(model.iter()));
        }
        prop_assert_eq!(q.into_deque(), model);
    }
}

/// A unary request's data is one chunk: queued with no heap allocation.
#[test]
fn one_chunk_queues_inline() {
    let mut q = super::Chunks::default();
    q.push_back(Bytes::from_static(b"request"));
    assert_eq!(q.rest.capacity(), 0);
    assert_eq!(q.pop_front().as_deref(), Some(&b"request"[..]));
    assert!(q.pop_front().is_none());
}

/// An ended call's event queue serves the next call (no allocation on its first event),
/// while a queue a stream grew is freed, not kept.
#[test]
fn ended_calls_queues_serve_the_next_calls() {
    let mut c: client::Client<()> = client::Client::new(WINDOW, 8);
    let id = c.open((), None).expect("open");
    for ev in [
        Event::Data(Bytes::from_static(b"a")),
        Event::Trailers(http::HeaderMap::new()),
    ] {
        c.deliver(id, ev).expect("deliver");
    }
    c.remove(id);
    let next = c.open((), None).expect("open");
    assert!(
        c.call_mut(next).expect("call").events_capacity() > 0,
        "reused"
    );
    assert!(!c.call_mut(next).expect("call").has_events(), "emptied");
    // A call whose queue grew past a unary response's is not kept.
    for _ in 0..64 {
        c.deliver(next, Event::Data(Bytes::from_static(b"a")))
            .expect("deliver");
    }
    c.remove(next);
    let third = c.open((), None).expect("open");
    assert_eq!(c.call_mut(third).expect("call").events_capacity(), 0);
}

/// `grpc-timeout` is found wherever it sits among a call's headers,
/// whether the map is scanned (few names) or looked up (many), and a map
/// without it has none.
#[test]
fn grpc_timeout_is_found_among_few_headers_and_many() {
    use super::parse_grpc_timeout;
    for others in [0usize, 1, 3, super::SCANNED - 1, super::SCANNED, 20] {
        let mut h = http::HeaderMap::new();
        for i in 0..others {
            h.insert(
                http::HeaderName::try_from(format!("x-h{i}")).expect("name"),
                http::HeaderValue::from_static("v"),
            );
        }
        assert_eq!(parse_grpc_timeout(&h), None, "{others} others");
        h.insert("grpc-timeout", http::HeaderValue::from_static("25m"));
        h.insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        assert_eq!(
            parse_grpc_timeout(&h),
            Some(Duration::from_millis(25)),
            "{others} others"
        );
    }
}
