//! The fast path end to end on one virtual clock: a client and a server
//! state machine, each with the ring's sans-IO halves for its two
//! directions, over simulated ring memory (issue #56's "Pair test").
//!
//! # What is modelled
//! * Each side: its fast-path state machine (`client::Client` or
//!   `server::Server`), the ring `Sender` of its direction and the ring
//!   `Receiver` of the other. [`Dir`] holds one direction: the writer's
//!   `Sender` and `RB_S`, the reader's `Receiver` and `RB_R`, the two
//!   pointer records, the completions, the writer's queue. The ring is
//!   fixed, 2 KiB (one call's window), elastic, `alpha = beta = 1`,
//!   `gamma = 4`.
//! * The writer (`fast::writer`'s `FrameWriter` over the connection's
//!   `conn::Link`, the poller's ring send step): each batch of frames is encoded with [`frame::push_frame`]
//!   into one ring message, queued FIFO, then reserved, filled, committed
//!   and flushed. A writer that found the ring full waits until the head it
//!   reads has moved (the driver's `has_space` wait), and does not retry
//!   before, unless only completions stood in its way (slots read whose
//!   WRITEs have not completed: `Sender::awaits_completions`), when it
//!   retries on its next turn, as the driver polls them.
//! * The fabric: a `Transmit` is placed at once when posted (slot bytes
//!   copied `RB_S` -> `RB_R`, the tail written as its 16-byte pointer
//!   record); a head push likewise. Completions are queued and handed to
//!   the ring's state machines at once, late ([`Dir::complete`]) or never
//!   ([`Dir::withhold`]). A tail WRITE or a head push can be placed torn
//!   (the first bytes of its record in address order, as a `memcpy` that
//!   stores byte by byte leaves it, the rest after the peer's next reads
//!   of it: [`Tear`]), and a test can
//!   overwrite a record with garbage. The reader re-reads an inconsistent
//!   tail record (or a message the tail covers that is not placed), the
//!   writer an inconsistent head record (keeping the head it had), and
//!   each closes the connection once it read the same inconsistent record
//!   (or found the same message not placed) more than [`TORN_LIMIT`] times
//!   in a row: the driver's placement timeout, counted in reads, not time
//!   (the driver counts time since the first inconsistent read; here a
//!   record that changes restarts the count, so that torn WRITEs back to
//!   back are not taken for garbage). A WRITE of a record lands after the
//!   rest of an earlier torn one (RC order).
//! * The reader: reads the tail record, receives every placed message,
//!   decodes it (`server::decode`, `client::decode`), hands it to its
//!   state machine, then posts the head pushes owed.
//! * The server's driver (`fast::server::serve_conn`): every `Output`
//!   applied as `ServerConn::perform` does; a scripted handler per call
//!   (read request data: `Note::Returned` and a WINDOW_UPDATE; respond
//!   within the call's send credit; finish: `Note::Released`, trailers,
//!   `Note::Finished`); an expired call answers `DEADLINE_EXCEEDED`.
//!   Notes are applied at once (the driver applies every note sent before
//!   it handles the next ring message).
//! * The client's driver (`fast::client`): admission, one call id per
//!   call, request data within the call's send credit, response events
//!   read by the caller when the test says (WINDOW_UPDATEs as
//!   `Call::pop_event` says), the connection's deadline timer (armed at
//!   `Client::poll_timeout`, firing `Client::handle_timeout` when the test
//!   advances the clock past it; a caller whose deadline passed reads what
//!   its call has queued, then `DEADLINE_EXCEEDED`), cancellation (a
//!   caller that lets go of its call writes CANCEL when `Client::remove`
//!   says one is due), GOAWAY, and a receive that failed (the connection
//!   closes, every call is reset). A deadline may be the call's
//!   `grpc-timeout` (the server runs it too) or the endpoint's own (sent to
//!   nobody: only the client's timer ends the call). A call's place is given back when it ended for
//!   its caller; after a CANCEL, as soon as the CANCEL is queued (the
//!   driver: once it is written). The queue is FIFO, so the server reads
//!   the CANCEL before any later call's REQUEST_HEADERS either way.
//! * A connection that fails on one side is gone for the other at once
//!   (its reader sees the peer closed).
//!
//! # What is not
//! Tasks, wakers and the leader/follower receive; the poller's wait
//! policies, doorbells and sleep words; self-sizing rings; placement out
//! of order across WRITEs (the ring's own pair harness covers it);
//! failed WRITEs and their error completions; batches larger than one
//! ring message (every batch here fits); frames too large for the ring;
//! handler panics; the server's concurrency limit, load shedding and
//! connection age; the client's line of callers waiting for a place (a
//! caller that finds every place taken gives up at once here). A write cut
//! short by its call's deadline is modelled as written later and followed
//! by the CANCEL (the driver writes whole frames only, then the CANCEL), so
//! the server may start a call the client already gave up on and cancel it
//! next. Time is only the virtual clock: deadlines are looked at when a
//! test advances it ([`Pair::tick`]). The proptest tears records (each
//! whole again within the limit) but writes no garbage (the torn-record
//! test does).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use rrpc_ringbuf::proto::{self as ring, POINTER_RECORD_LEN, Transmit};
use rrpc_ringbuf::{Error as RingError, RingConfig};
use tonic::Code;

use super::Event;
use super::client::{self, Client};
use super::flow::{SendWindow, Unacked};
use super::server::{self, CallKey, In, Note, Output, Server};
use crate::frame::{self, END_STREAM, Kind};

/// Each call's receive window, both ways.
const WINDOW: u32 = 2048;
/// The ring: 32 slots of 64 bytes (2 KiB, one call's window), so that it
/// fills quickly.
const SLOT: usize = 64;
const SLOTS: usize = 32;
/// Reads of an inconsistent pointer record (or of a message the tail
/// covers but that is not placed) before the reader gives up: the
/// driver's placement timeout, in reads.
const TORN_LIMIT: u32 = 8;
/// Pumps after which a pair that still moves is declared livelocked.
const STEP_BOUND: usize = 2_000;

fn ring_cfg() -> RingConfig {
    RingConfig::builder()
        .slot_size(SLOT)
        .ring_size(SLOT * SLOTS)
        .alpha(1)
        .beta(1)
        .gamma(4)
        .elastic(true)
        .sq_depth(16)
        .build()
        .expect("ring config")
}

/// Counts a read of a pointer record: whether the same inconsistent
/// record was read more than [`TORN_LIMIT`] times in a row (garbage; a
/// record that changes is still being written).
fn torn_too_long(
    seen: &mut (u32, Option<[u8; POINTER_RECORD_LEN]>),
    consistent: bool,
    rec: [u8; POINTER_RECORD_LEN],
) -> bool {
    if consistent {
        *seen = (0, None);
        return false;
    }
    if seen.1 != Some(rec) {
        *seen = (0, Some(rec));
    }
    seen.0 += 1;
    seen.0 > TORN_LIMIT
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A pointer record WRITE placed torn: its first `bytes` bytes land at
/// once, the rest after `reads` reads of the record (`u32::MAX`: at
/// [`Dir::finish_tear`]).
#[derive(Debug, Clone, Copy)]
struct Tear {
    bytes: usize,
    reads: u32,
}

/// One direction of the connection: the writer's ring `Sender` and
/// `RB_S`, the reader's `Receiver` and `RB_R`, the pointer records, the
/// completions and the writer's queue.
struct Dir {
    tx: ring::Sender,
    rb_s: Vec<u8>,
    rx: ring::Receiver,
    rb_r: Vec<u8>,
    /// The tail record, in the reader's memory.
    tail_rec: [u8; POINTER_RECORD_LEN],
    /// The head record, in the writer's memory.
    head_rec: [u8; POINTER_RECORD_LEN],
    /// Completions of the writer's WRITEs not handed to its `Sender`.
    tx_cq: Vec<u64>,
    /// Completions of the reader's head pushes not handed to its `Receiver`.
    rx_cq: Vec<u64>,
    /// Completions stay queued until [`Dir::complete`].
    withhold: bool,
    /// Encoded messages the writer has not committed yet (FIFO).
    outbox: VecDeque<Vec<u8>>,
    /// The head the writer saw when it found the ring full: it waits
    /// until the head moves.
    blocked_at: Option<u64>,
    /// The next tail WRITE is placed torn.
    tear_tail: Option<Tear>,
    /// The rest of a torn tail record, and the reads before it lands.
    torn_rest: Option<([u8; POINTER_RECORD_LEN], u32)>,
    /// As `tear_tail`, for the next head push.
    tear_head: Option<Tear>,
    /// As `torn_rest`, for the head record.
    head_rest: Option<([u8; POINTER_RECORD_LEN], u32)>,
    /// As `torn_reads`, for the head record.
    torn_head_reads: (u32, Option<[u8; POINTER_RECORD_LEN]>),
    /// Consecutive reads of the same inconsistent tail record, and it.
    torn_reads: (u32, Option<[u8; POINTER_RECORD_LEN]>),
    /// Consecutive reads that found a covered message not placed.
    unplaced_reads: u32,
    /// The reader reads (a peer that stops reading: false).
    reading: bool,
    /// Anything done: committed, placed, received, pushed, completed.
    work: u64,
    committed: u64,
    received: u64,
}

impl Dir {
    fn new() -> Dir {
        let cfg = ring_cfg();
        let bytes = cfg.ring_size();
        Dir {
            tx: ring::Sender::new(&cfg),
            rb_s: vec![0; bytes],
            rx: ring::Receiver::new(&cfg),
            rb_r: vec![0; bytes],
            tail_rec: ring::encode_pointer(0),
            head_rec: ring::encode_pointer(0),
            tx_cq: Vec::new(),
            rx_cq: Vec::new(),
            withhold: false,
            outbox: VecDeque::new(),
            blocked_at: None,
            tear_tail: None,
            torn_rest: None,
            tear_head: None,
            head_rest: None,
            torn_head_reads: (0, None),
            torn_reads: (0, None),
            unplaced_reads: 0,
            reading: true,
            work: 0,
            committed: 0,
            received: 0,
        }
    }

    /// Queues `frames` as one message.
    fn queue(&mut self, frames: &[(Kind, u8, u32, &[u8])]) {
        let mut msg = Vec::new();
        for (k, f, id, p) in frames {
            frame::push_frame(&mut msg, *k, *f, *id, p);
        }
        assert!(msg.len() <= self.tx.max_geometry().max_payload());
        self.outbox.push_back(msg);
    }

    /// Posts the writer's work requests: each placed at once; completions
    /// handled at once unless withheld.
    fn post(&mut self) {
        loop {
            while let Some(t) = self.tx.poll_transmit() {
                self.work += 1;
                match t {
                    Transmit::Slots {
                        offset,
                        len,
                        wr_id,
                        signaled,
                    } => {
                        self.rb_r[offset..offset + len]
                            .copy_from_slice(&self.rb_s[offset..offset + len]);
                        if signaled {
                            self.tx_cq.push(wr_id);
                        }
                    }
                    Transmit::Tail { value, wr_id, .. } => {
                        let rec = ring::encode_pointer(value);
                        // RC order: an earlier torn WRITE landed whole first.
                        self.finish_tail_tear();
                        if let Some(Tear { bytes, reads }) = self.tear_tail.take() {
                            self.tail_rec[..bytes].copy_from_slice(&rec[..bytes]);
                            self.torn_rest = Some((rec, reads));
                        } else {
                            self.tail_rec = rec;
                            self.torn_rest = None;
                        }
                        self.tx_cq.push(wr_id);
                    }
                }
            }
            if self.withhold || self.tx_cq.is_empty() {
                return;
            }
            for wr in std::mem::take(&mut self.tx_cq) {
                self.work += 1;
                self.tx.handle_completion(wr);
            }
        }
    }

    /// Posts the head pushes the reader owes.
    fn push_heads(&mut self) {
        loop {
            while let Some(p) = self.rx.poll_transmit() {
                self.work += 1;
                let rec = ring::encode_pointer(p.value);
                if let Some((rest, _)) = self.head_rest.take() {
                    self.head_rec = rest;
                }
                if let Some(Tear { bytes, reads }) = self.tear_head.take() {
                    self.head_rec[..bytes].copy_from_slice(&rec[..bytes]);
                    self.head_rest = Some((rec, reads));
                } else {
                    self.head_rec = rec;
                    self.head_rest = None;
                }
                if p.signaled {
                    self.rx_cq.push(p.wr_id);
                }
            }
            if self.withhold || self.rx_cq.is_empty() {
                return;
            }
            for wr in std::mem::take(&mut self.rx_cq) {
                self.rx.handle_completion(wr);
            }
        }
    }

    /// Late completions: both halves handle every completion queued.
    fn complete(&mut self) {
        for wr in std::mem::take(&mut self.tx_cq) {
            self.work += 1;
            self.tx.handle_completion(wr);
        }
        self.post();
        for wr in std::mem::take(&mut self.rx_cq) {
            self.rx.handle_completion(wr);
        }
        self.push_heads();
    }

    fn finish_tail_tear(&mut self) {
        if let Some((rec, _)) = self.torn_rest.take() {
            self.tail_rec = rec;
        }
    }

    /// The rest of each torn record is placed.
    fn finish_tear(&mut self) {
        self.finish_tail_tear();
        if let Some((rec, _)) = self.head_rest.take() {
            self.head_rec = rec;
        }
    }

    /// The writer: reads the head record, then commits queued messages
    /// while they fit (after a full ring, only once the head moved).
    fn write(&mut self) -> Result<(), RingError> {
        match self.head_rest.take() {
            Some((rec, 0)) => self.head_rec = rec,
            Some((rec, n)) => self.head_rest = Some((rec, n - 1)),
            None => {}
        }
        let (v, c) = (word(&self.head_rec, 0), word(&self.head_rec, 8));
        // Inconsistent: being written, read again on the next turn.
        let consistent = self.tx.handle_head_record(v, c)?;
        if torn_too_long(&mut self.torn_head_reads, consistent, self.head_rec) {
            return Err(self.tx.record_timed_out(v, c));
        }
        if self.blocked_at == Some(self.tx.local_head()) {
            return Ok(());
        }
        self.blocked_at = None;
        while let Some(msg) = self.outbox.front() {
            match self.tx.reserve(msg.len(), &mut self.rb_s) {
                Ok(res) => {
                    let off = res.offset();
                    self.rb_s[off..off + msg.len()].copy_from_slice(msg);
                    let len = msg.len();
                    self.tx.commit(res, len, &mut self.rb_s);
                    self.tx.flush();
                    self.outbox.pop_front();
                    self.committed += 1;
                    self.work += 1;
                }
                Err(RingError::WouldBlock) => {
                    // Room that waits on completions, not on the head
                    // (slots read but their WRITEs not completed): the
                    // driver polls them and tries again (`RingTx::try_reserve`).
                    if !self.tx.awaits_completions() {
                        self.blocked_at = Some(self.tx.local_head());
                    }
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        self.post();
        Ok(())
    }

    /// The reader: reads the tail record, takes every placed message
    /// (into `out`), pushes its head as owed.
    fn read(&mut self, out: &mut Vec<Vec<u8>>) -> Result<(), RingError> {
        match self.torn_rest.take() {
            Some((rec, 0)) => self.tail_rec = rec,
            Some((rec, n)) => self.torn_rest = Some((rec, n - 1)),
            None => {}
        }
        let (v, c) = (word(&self.tail_rec, 0), word(&self.tail_rec, 8));
        let consistent = self.rx.handle_tail_record(v, c)?;
        if torn_too_long(&mut self.torn_reads, consistent, self.tail_rec) {
            return Err(self.rx.record_timed_out(v, c));
        }
        loop {
            let rb_r = &self.rb_r;
            let Some(m) = self.rx.poll_recv(|off| word(rb_r, off))? else {
                break;
            };
            out.push(self.rb_r[m.offset()..m.offset() + m.len()].to_vec());
            self.rx.release(m);
            self.received += 1;
            self.work += 1;
        }
        if self.rx.unplaced().is_some() {
            self.unplaced_reads += 1;
            if self.unplaced_reads > TORN_LIMIT {
                return Err(self.rx.placement_timed_out());
            }
        } else {
            self.unplaced_reads = 0;
        }
        self.push_heads();
        Ok(())
    }

    /// The ring's pointer invariants (RB² Fig. 2) across both halves.
    fn check(&self) {
        let (t, r) = (&self.tx, &self.rx);
        let n = t.geometry().slot_count();
        assert!(t.local_head() <= t.synced_tail());
        assert!(t.synced_tail() <= t.esc_tail() && t.esc_tail() <= t.tail());
        assert!(
            t.tail() - t.local_head() <= n,
            "the writer overran the ring"
        );
        assert!(r.synced_head() <= r.head() && r.head() <= r.local_tail());
        assert!(r.local_tail() <= t.synced_tail(), "a tail never sent");
        assert!(t.local_head() <= r.head(), "a head never pushed");
    }

    /// Nothing committed is left unread, nothing is owed.
    fn is_idle(&self) -> bool {
        self.outbox.is_empty()
            && self.tx.is_flushed()
            && self.rx.head() == self.tx.tail()
            && self.tx.local_head() == self.tx.tail()
    }
}

/// How a call ended on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SEnd {
    /// Its handler answered.
    Finished,
    /// Its deadline passed (`DEADLINE_EXCEEDED` sent).
    Expired,
    /// The client cancelled it.
    Cancelled,
    /// The connection ended.
    Lost,
}

/// A call as the client's caller sees it.
#[derive(Debug)]
struct CRec {
    send: SendWindow,
    /// Request bytes sent.
    sent: Vec<u8>,
    chunks: usize,
    /// Response bytes read.
    got: Vec<u8>,
    headers: bool,
    req_ended: bool,
    deadline: Option<Instant>,
    outcome: Option<Code>,
}

/// A started call's handler.
#[derive(Debug)]
struct SCall {
    key: CallKey,
    unread: VecDeque<Bytes>,
    unacked: Unacked,
    send: SendWindow,
    headers_sent: bool,
}

/// A call as the server saw it.
#[derive(Debug, Default)]
struct SRec {
    /// Request bytes delivered to the handler (read or not).
    got: Vec<u8>,
    /// The end of the request was delivered.
    req_end: bool,
    /// Response bytes sent.
    sent: Vec<u8>,
    chunks: usize,
    deadline: Option<Instant>,
    end: Option<SEnd>,
}

/// Payload bytes of chunk `chunk` of call `id`: a reordered, lost or
/// duplicated chunk changes the bytes a call's side sees.
fn pattern(id: u32, chunk: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id as usize * 31 + chunk * 7 + i) as u8)
        .collect()
}

fn is_prefix(a: &[u8], b: &[u8]) -> bool {
    a.len() <= b.len() && b[..a.len()] == *a
}

/// A client and a server over two simulated rings.
struct Pair {
    now: Instant,
    c2s: Dir,
    s2c: Dir,
    /// Each call's driver data is its id.
    client: Client<u32, ()>,
    server: Server,
    app: HashMap<u32, SCall>,
    crec: BTreeMap<u32, CRec>,
    srec: BTreeMap<u32, SRec>,
    /// Why the client's connection ended.
    client_err: Option<client::Reason>,
    /// Why the server's connection ended.
    server_err: Option<String>,
    /// Calls refused for want of a place.
    refused_full: usize,
    /// Calls refused while draining.
    refused_draining: usize,
    inbox: Vec<In>,
}

impl Pair {
    fn new(limit: usize, server_timeout: Option<Duration>) -> Pair {
        Pair {
            now: Instant::now(),
            c2s: Dir::new(),
            s2c: Dir::new(),
            client: Client::new(WINDOW, limit),
            server: Server::new(server::Config {
                max_calls: limit,
                recv_window: WINDOW,
                peer_window: WINDOW,
                max_header_list: 16 << 10,
                timeout: server_timeout,
            }),
            app: HashMap::new(),
            crec: BTreeMap::new(),
            srec: BTreeMap::new(),
            client_err: None,
            server_err: None,
            refused_full: 0,
            refused_draining: 0,
            inbox: Vec::new(),
        }
    }

    // ---- the client's caller and driver ----

    /// Opens a call (`timeout`: its `grpc-timeout`, which is also its own
    /// deadline); `end`: the request has no body.
    fn open(&mut self, timeout: Option<Duration>, end: bool) -> Result<u32, tonic::Status> {
        self.open_with(timeout, None, end)
    }

    /// Opens a call with a `grpc-timeout` (`sent`) and the endpoint's own
    /// timeout (`local`, sent to nobody); its deadline is the shorter.
    fn open_with(
        &mut self,
        sent: Option<Duration>,
        local: Option<Duration>,
        end: bool,
    ) -> Result<u32, tonic::Status> {
        let timeout = match (sent, local) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = timeout.map(|t| self.now + t);
        match self.client.admit(deadline, || ())? {
            client::Admission::Admitted => {}
            client::Admission::Queued(t) => {
                // This caller does not wait in line: it gives up.
                assert!(self.client.leave_queue(t));
                return Err(tonic::Status::resource_exhausted("every place taken"));
            }
        }
        let id = match self.client.open(0, deadline) {
            Ok(id) => id,
            Err(st) => {
                assert!(self.client.release().is_none(), "nobody waits in line");
                return Err(st);
            }
        };
        let mut h = http::HeaderMap::new();
        if let Some(t) = sent {
            let v = format!("{}m", t.as_millis());
            h.insert("grpc-timeout", v.parse().expect("header value"));
        }
        let head = frame::request_headers_payload("/x.Y/Z", "", &h);
        let flags = if end { END_STREAM } else { 0 };
        self.c2s
            .queue(&[(Kind::RequestHeaders, flags, id, head.as_slice())]);
        let prev = self.crec.insert(
            id,
            CRec {
                send: SendWindow::new(u64::from(WINDOW)),
                sent: Vec::new(),
                chunks: 0,
                got: Vec::new(),
                headers: false,
                req_ended: end,
                deadline,
                outcome: None,
            },
        );
        assert!(prev.is_none(), "call id {id} given twice");
        *self.client.call_mut(id).map(|c| &mut c.io).expect("open") = id;
        Ok(id)
    }

    /// The client sends `len` request bytes on `id` (`end`: the last),
    /// if the call is open and its send credit allows.
    fn send(&mut self, id: u32, len: usize, end: bool) -> bool {
        let Some(r) = self.crec.get_mut(&id) else {
            return false;
        };
        if r.outcome.is_some() || r.req_ended || self.client_err.is_some() {
            return false;
        }
        if !r.send.try_send(len) {
            return false;
        }
        let data = pattern(id, r.chunks, len);
        r.chunks += 1;
        r.sent.extend_from_slice(&data);
        r.req_ended = end;
        let flags = if end { END_STREAM } else { 0 };
        self.c2s.queue(&[(Kind::Data, flags, id, data.as_slice())]);
        true
    }

    /// The client's caller reads every event queued for `id`; returns the
    /// response bytes read. Due WINDOW_UPDATEs are written.
    fn client_read(&mut self, id: u32) -> usize {
        let mut n = 0;
        loop {
            let Some(call) = self.client.call_mut(id) else {
                return n;
            };
            let mut update = None;
            let Some(ev) = call.pop_event(&mut update) else {
                return n;
            };
            if let Some(inc) = update
                && self.client_err.is_none()
            {
                let p = frame::window_update_payload(inc);
                self.c2s.queue(&[(Kind::WindowUpdate, 0, id, p.as_slice())]);
            }
            let r = self.crec.get_mut(&id).expect("a call the client opened");
            let end = match ev {
                Event::Headers {
                    status,
                    headers,
                    end,
                } => {
                    assert!(!r.headers, "call {id}: response headers twice");
                    r.headers = true;
                    assert_eq!(status, http::StatusCode::OK);
                    end.then(|| code_of(&headers))
                }
                Event::Data(b) => {
                    assert!(r.headers, "call {id}: data before response headers");
                    r.got.extend_from_slice(&b);
                    n += b.len();
                    None
                }
                Event::Trailers(t) => Some(code_of(&t)),
                Event::Reset(st) => {
                    if st.code() == Code::DeadlineExceeded {
                        assert!(
                            r.deadline.is_some_and(|at| at <= self.now),
                            "call {id}: expired before its deadline"
                        );
                    }
                    Some(st.code())
                }
                Event::Window(_) => panic!("a grant is never queued"),
            };
            if let Some(code) = end {
                self.end_client(id, code);
                return n;
            }
        }
    }

    /// Call `id` ended for its caller with `code`: it leaves the table,
    /// its guard writes CANCEL if the state machine says one is due, and
    /// its place is given back (after the CANCEL is queued).
    fn end_client(&mut self, id: u32, code: Code) {
        let r = self.crec.get_mut(&id).expect("a call the client opened");
        assert!(r.outcome.is_none(), "call {id} ended twice on the client");
        r.outcome = Some(code);
        let removed = self.client.remove(id).expect("an open call");
        assert_eq!(removed.io, id);
        if removed.cancel && self.client_err.is_none() {
            self.c2s.queue(&[(Kind::Cancel, 0, id, &[])]);
        }
        assert!(self.client.release().is_none(), "nobody waits in line");
    }

    /// The caller drops call `id` before it read its end.
    fn cancel(&mut self, id: u32, code: Code) -> bool {
        if self.client.call_mut(id).is_none() {
            return false;
        }
        self.end_client(id, code);
        true
    }

    /// One ring message from the server, as the client's reader handles it.
    fn client_message(&mut self, msg: &[u8]) {
        let (mut events, mut goaway, mut bad) = (Vec::new(), false, None);
        client::decode(msg, &mut events, &mut goaway, &mut bad);
        if goaway {
            self.client.handle_goaway();
        }
        for (id, ev) in events {
            match self.client.deliver(id, ev) {
                Ok(client::Delivered::Grant(_, inc)) => {
                    let r = self.crec.get_mut(&id).expect("a call the client opened");
                    if let Err(e) = r.send.grant(inc) {
                        bad.get_or_insert(e);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    bad.get_or_insert(e);
                }
            }
        }
        if let Some(reason) = self.client.handle_receive(Ok(true), bad) {
            self.client_close(reason);
        }
    }

    /// The client's connection ends: every open call is reset (its caller
    /// reads that), and the server sees the connection gone.
    fn client_close(&mut self, reason: client::Reason) {
        if self.client_err.is_some() {
            return;
        }
        let _ = self.client.close(reason.clone()).count();
        self.client_err = Some(reason);
        self.server_close("the client's connection ended".into());
    }

    // ---- the server's driver and handlers ----

    /// One ring message from the client, as `ServerConn::on_turn` handles it.
    fn server_message(&mut self, msg: &[u8]) {
        if self.server_err.is_some() {
            return;
        }
        server::decode(msg, &mut self.inbox);
        let now = self.now;
        let bad = self.server.handle(self.inbox.drain(..), &mut || now).err();
        self.perform();
        if let Some(e) = bad {
            self.server_close(format!("protocol violation: {e}"));
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
                    match refusal {
                        Some(server::Refusal::TooManyCalls { .. }) => self.refused_full += 1,
                        Some(server::Refusal::Draining) => self.refused_draining += 1,
                        _ => {}
                    }
                    self.s2c.queue(&[(kind, flags, id, &payload)]);
                }
                Output::Start {
                    key,
                    chunks,
                    end,
                    send_credit,
                    deadline,
                    ..
                } => {
                    let mut rec = SRec {
                        req_end: end,
                        deadline,
                        ..SRec::default()
                    };
                    let unread = chunks.into_deque();
                    for c in &unread {
                        rec.got.extend_from_slice(c);
                    }
                    let prev = self.srec.insert(key.id, rec);
                    assert!(prev.is_none(), "call {} started twice", key.id);
                    self.app.insert(
                        key.id,
                        SCall {
                            key,
                            unread,
                            unacked: Unacked::new(WINDOW),
                            send: SendWindow::new(u64::from(send_credit)),
                            headers_sent: false,
                        },
                    );
                }
                Output::Data { key, data } => {
                    let c = self.app.get_mut(&key.id).expect("a started call");
                    assert_eq!(c.key, key);
                    let r = self.srec.get_mut(&key.id).expect("a started call");
                    assert!(!r.req_end, "data after the end of the request");
                    r.got.extend_from_slice(&data);
                    c.unread.push_back(data);
                }
                Output::EndOfRequest { key } => {
                    let r = self.srec.get_mut(&key.id).expect("a started call");
                    assert!(!r.req_end, "the request ended twice");
                    r.req_end = true;
                }
                Output::Grant { key, inc } => {
                    let c = self.app.get_mut(&key.id).expect("a started call");
                    if let Err(e) = c.send.grant(inc) {
                        self.server_close(format!("grant: {e}"));
                        return;
                    }
                }
                Output::Cancel { key } => {
                    let c = self.app.remove(&key.id).expect("a started call");
                    assert_eq!(c.key, key);
                    self.end_server(key.id, SEnd::Cancelled);
                }
                Output::Expire { key } => {
                    let c = self.app.remove(&key.id).expect("a started call");
                    assert_eq!(c.key, key);
                    let at = self.srec[&key.id].deadline.expect("a call with a deadline");
                    assert!(at <= self.now, "expired before its deadline");
                    self.server.handle_note(Note::Released(key));
                    let (kind, flags, payload) =
                        server::trailers_only(tonic::Status::deadline_exceeded("deadline"));
                    self.s2c.queue(&[(kind, flags, key.id, &payload)]);
                    self.server.handle_note(Note::Finished(key));
                    self.end_server(key.id, SEnd::Expired);
                }
            }
        }
    }

    fn end_server(&mut self, id: u32, how: SEnd) {
        let r = self.srec.get_mut(&id).expect("a started call");
        assert!(r.end.is_none(), "call {id} ended twice on the server");
        r.end = Some(how);
    }

    /// The server's connection ends: its calls are dropped, and the client
    /// sees the server gone.
    fn server_close(&mut self, why: String) {
        if self.server_err.is_some() {
            return;
        }
        self.server_err = Some(why);
        let ids: Vec<u32> = self.app.drain().map(|(id, _)| id).collect();
        for id in ids {
            self.end_server(id, SEnd::Lost);
        }
        if let Some(reason) = self.client.handle_receive(Ok(false), None) {
            self.client_close(reason);
        }
    }

    /// The handler of `id` reads one request chunk; a due WINDOW_UPDATE
    /// goes out.
    fn server_read(&mut self, id: u32) -> bool {
        let Some(c) = self.app.get_mut(&id) else {
            return false;
        };
        let Some(b) = c.unread.pop_front() else {
            return false;
        };
        if let Some(inc) = c.unacked.consumed(b.len()) {
            self.server.handle_note(Note::Returned(c.key, inc));
            let p = frame::window_update_payload(inc);
            self.s2c.queue(&[(Kind::WindowUpdate, 0, id, p.as_slice())]);
        }
        true
    }

    /// The handler of `id` sends `len` response bytes if its credit allows
    /// (its response headers first).
    fn respond(&mut self, id: u32, len: usize) -> bool {
        let Some(c) = self.app.get_mut(&id) else {
            return false;
        };
        if !c.send.try_send(len) {
            return false;
        }
        let r = self.srec.get_mut(&id).expect("a started call");
        let data = pattern(id, r.chunks, len);
        r.chunks += 1;
        r.sent.extend_from_slice(&data);
        let head = frame::response_headers_payload(http::StatusCode::OK, &http::HeaderMap::new());
        if std::mem::replace(&mut c.headers_sent, true) {
            self.s2c.queue(&[(Kind::Data, 0, id, data.as_slice())]);
        } else {
            self.s2c.queue(&[
                (Kind::ResponseHeaders, 0, id, head.as_slice()),
                (Kind::Data, 0, id, data.as_slice()),
            ]);
        }
        true
    }

    /// The handler of `id` answers OK: its place is freed, trailers go out,
    /// its task ends.
    fn finish(&mut self, id: u32) -> bool {
        let Some(c) = self.app.remove(&id) else {
            return false;
        };
        self.server.handle_note(Note::Released(c.key));
        let (kind, flags, payload) = server::trailers_only(tonic::Status::ok(""));
        let head = frame::response_headers_payload(http::StatusCode::OK, &http::HeaderMap::new());
        if c.headers_sent {
            self.s2c.queue(&[(kind, flags, id, &payload)]);
        } else {
            self.s2c.queue(&[
                (Kind::ResponseHeaders, 0, id, head.as_slice()),
                (kind, flags, id, &payload),
            ]);
        }
        self.server.handle_note(Note::Finished(c.key));
        self.end_server(id, SEnd::Finished);
        true
    }

    /// Shutdown: GOAWAY, new calls refused, calls in flight go on.
    fn drain(&mut self) {
        if self.server_err.is_none() {
            self.server.start_drain();
            self.perform();
        }
    }

    // ---- time and the fabric ----

    /// The clock moves by `d`: the client's timer fires (its calls past
    /// their deadline get `DEADLINE_EXCEEDED`; each woken caller reads its
    /// call to the end, and its guard writes CANCEL); the server's timer
    /// fires.
    fn tick(&mut self, d: Duration) {
        self.now += d;
        if self.client.poll_timeout().is_some_and(|at| at <= self.now) {
            let mut woken = Vec::new();
            self.client.handle_timeout(self.now, |e| match e {
                client::Expired::Call(id) => woken.push(*id),
                client::Expired::Queued(()) => panic!("nobody waits in line here"),
            });
            for id in woken {
                let n = self.crec[&id].got.len();
                self.client_read(id);
                let r = &self.crec[&id];
                assert!(r.outcome.is_some(), "call {id}: woken, not ended");
                // The caller read what came before the deadline, then its end.
                assert!(r.got.len() >= n);
            }
        }
        if self.server_err.is_none() && self.server.poll_timeout().is_some_and(|at| at <= self.now)
        {
            self.server.handle_timeout(self.now);
            self.perform();
        }
    }

    /// One turn of both drivers: each writer commits what it can, each
    /// reader receives what is placed. Whether anything moved.
    fn pump(&mut self) -> bool {
        let before = self.c2s.work + self.s2c.work;
        if self.client_err.is_none()
            && let Err(e) = self.c2s.write()
        {
            let e = crate::Error::from(e);
            let reason = self.client.handle_receive(Err(&e), None).expect("fails");
            self.client_close(reason);
        }
        if self.server_err.is_none()
            && let Err(e) = self.s2c.write()
        {
            self.server_close(format!("send: {e}"));
        }
        if self.server_err.is_none() && self.c2s.reading {
            let mut msgs = Vec::new();
            let r = self.c2s.read(&mut msgs);
            for m in msgs {
                self.server_message(&m);
            }
            if let Err(e) = r {
                self.server_close(format!("receive: {e}"));
            }
        }
        if self.client_err.is_none() && self.s2c.reading {
            let mut msgs = Vec::new();
            let r = self.s2c.read(&mut msgs);
            for m in msgs {
                self.client_message(&m);
            }
            if let Err(e) = r {
                let e = crate::Error::from(e);
                let reason = self.client.handle_receive(Err(&e), None).expect("fails");
                self.client_close(reason);
            }
        }
        if self.client_err.is_none() && self.server_err.is_none() {
            self.c2s.check();
            self.s2c.check();
        }
        self.c2s.work + self.s2c.work != before
    }

    /// Pumps until nothing moves; the pumps that moved something.
    fn run(&mut self) -> usize {
        for i in 0..STEP_BOUND {
            if !self.pump() {
                return i;
            }
        }
        panic!("livelock: still moving after {STEP_BOUND} pumps");
    }

    /// Checks what must hold at every step.
    fn check(&self, limit: usize) {
        assert!(self.client.places() <= limit);
        assert!(self.server.active() <= limit);
        assert!(self.server.active() <= self.server.open_calls());
        assert_eq!(
            self.refused_full, 0,
            "the client keeps to the server's limit"
        );
        for (id, r) in &self.crec {
            assert_eq!(
                r.outcome.is_none(),
                self.client.calls().any(|(i, _)| i == *id),
                "call {id}: open in the table iff not ended"
            );
            if let Some(s) = self.srec.get(id) {
                assert!(is_prefix(&s.got, &r.sent), "call {id}: request bytes");
                assert!(is_prefix(&r.got, &s.sent), "call {id}: response bytes");
            }
            if let Some(w) = self.server.recv_window(*id) {
                assert!(w.left() <= w.window());
            }
        }
        for (id, s) in &self.srec {
            assert!(
                self.crec.contains_key(id),
                "call {id} started, never opened"
            );
            // The timer fired when the clock passed a deadline.
            assert!(
                s.end.is_some() || s.deadline.is_none_or(|at| at > self.now),
                "call {id} outlived its deadline on the server"
            );
        }
        for (id, r) in &self.crec {
            // A call the server ended is over for its caller as soon as it
            // reads it (woken by the end, not by the timer).
            let ended = self.client.call(*id).is_some_and(|c| c.is_ended());
            assert!(
                r.outcome.is_some() || ended || r.deadline.is_none_or(|at| at > self.now),
                "call {id} outlived its deadline on the client"
            );
        }
    }

    /// Lets every call finish and the rings go idle: completions flow,
    /// readers read, handlers read everything and answer, callers read
    /// everything. Panics if that does not settle within a bound.
    fn settle(&mut self) {
        for d in [&mut self.c2s, &mut self.s2c] {
            d.withhold = false;
            d.reading = true;
            (d.tear_tail, d.tear_head) = (None, None);
            d.finish_tear();
            d.complete();
        }
        self.run();
        self.flow_goes_on();
        for _ in 0..50 {
            self.run();
            let ids: Vec<u32> = self.app.keys().copied().collect();
            for id in ids {
                while self.server_read(id) {}
                self.finish(id);
            }
            let ids: Vec<u32> = self.crec.keys().copied().collect();
            for id in ids {
                self.client_read(id);
            }
            let moved = self.run() > 0;
            let quiet = self.crec.values().all(|r| r.outcome.is_some())
                && self.app.is_empty()
                && (self.server_err.is_some() || self.server.open_calls() == 0);
            if quiet && !moved {
                return;
            }
        }
        panic!("the pair did not quiesce");
    }

    /// Liveness of flow control: every call still open on both sides
    /// moves two windows more each way (the handler and the caller reading
    /// as they go). A window that is never reopened stalls it for good.
    fn flow_goes_on(&mut self) {
        let open = |p: &Pair, id: u32| {
            p.app.contains_key(&id)
                && p.crec[&id].outcome.is_none()
                && p.client_err.is_none()
                && p.server_err.is_none()
        };
        let ids: Vec<u32> = self.app.keys().copied().collect();
        for id in ids {
            let mut resp = 2 * WINDOW as usize;
            let mut req = if self.crec[&id].req_ended { 0 } else { resp };
            for _ in 0..100 {
                if !open(self, id) || resp + req == 0 {
                    break;
                }
                if resp > 0 && self.respond(id, 500) {
                    resp = resp.saturating_sub(500);
                }
                if req > 0 && self.send(id, 500, false) {
                    req = req.saturating_sub(500);
                }
                self.run();
                while self.server_read(id) {}
                self.client_read(id);
                self.run();
            }
            assert!(
                !open(self, id) || resp + req == 0,
                "call {id}: stalled with {resp} response and {req} request bytes owed"
            );
        }
    }

    /// After [`Pair::settle`]: every call ended exactly once on each side,
    /// nothing was lost, no place is held, the rings are idle.
    fn check_settled(&mut self) {
        for (id, r) in &self.crec {
            assert!(r.outcome.is_some(), "call {id} never ended on the client");
            if let Some(s) = self.srec.get(id) {
                assert!(s.end.is_some(), "call {id} never ended on the server");
                if s.req_end {
                    assert_eq!(s.got, r.sent, "call {id}: request bytes");
                }
                if r.outcome == Some(Code::Ok) {
                    assert_eq!(s.end, Some(SEnd::Finished));
                    assert_eq!(r.got, s.sent, "call {id}: response bytes");
                }
            }
        }
        assert_eq!(self.client.places(), 0, "a place leaked on the client");
        assert_eq!(self.client.calls().count(), 0);
        if self.server_err.is_none() && self.client_err.is_none() {
            assert_eq!(self.server.active(), 0, "a place leaked on the server");
            assert_eq!(self.server.open_calls(), 0);
            assert_eq!(self.server.poll_timeout(), None);
            assert!(self.c2s.is_idle() && self.s2c.is_idle(), "rings not idle");
        }
    }
}

/// The gRPC code of a trailer (or trailers-only) map.
fn code_of(t: &http::HeaderMap) -> Code {
    tonic::Status::from_header_map(t).map_or(Code::Unknown, |s| s.code())
}

#[test]
fn unary_and_streaming_calls_end_to_end_through_ring_messages() {
    let mut p = Pair::new(4, None);
    // Unary: headers, one chunk, end; the answer: headers, data, trailers.
    let a = p.open(None, false).expect("open");
    assert!(p.send(a, 100, true));
    // Streaming both ways, interleaved with the unary call.
    let b = p.open(None, false).expect("open");
    p.run();
    assert!(p.srec[&a].req_end && p.srec[&a].got.len() == 100);
    assert!(p.respond(a, 50));
    assert!(p.finish(a));
    for i in 0..10 {
        assert!(p.send(b, 300, i == 9));
        p.run();
        while p.server_read(b) {}
        assert!(p.respond(b, 200));
        p.run();
        assert_eq!(p.client_read(b), 200);
    }
    assert!(p.finish(b));
    p.run();
    assert_eq!(p.client_read(a), 50);
    p.client_read(b);
    assert_eq!(p.crec[&a].outcome, Some(Code::Ok));
    assert_eq!(p.crec[&b].outcome, Some(Code::Ok));
    assert_eq!(p.srec[&b].got.len(), 3000);
    assert_eq!(p.crec[&b].got.len(), 2000);
    // Every message went through the rings, both ways.
    assert!(p.c2s.received >= 12 && p.s2c.received >= 12);
    p.settle();
    p.check_settled();
}

#[test]
fn a_stalled_reader_stalls_only_its_call_and_reading_reopens_the_window() {
    let mut p = Pair::new(4, None);
    let slow = p.open(None, false).expect("open");
    let fast = p.open(None, false).expect("open");
    p.run();
    // Response direction: the client's caller never reads `slow`.
    let mut sent = 0;
    while p.respond(slow, 600) {
        sent += 1;
    }
    assert_eq!(sent, 3, "3 * 612 of the client's 2048");
    for _ in 0..20 {
        assert!(p.respond(fast, 600), "the other call is never stalled");
        p.run();
        assert_eq!(p.client_read(fast), 600);
        p.run();
    }
    p.run();
    assert!(!p.respond(slow, 600), "still stalled: nothing read");
    // Request direction: the handler of `slow` never reads.
    let mut sent = 0;
    while p.send(slow, 600, false) {
        sent += 1;
    }
    assert_eq!(sent, 3);
    for _ in 0..20 {
        assert!(p.send(fast, 600, false), "the other call is never stalled");
        p.run();
        while p.server_read(fast) {}
        p.run();
    }
    assert!(!p.send(slow, 600, false));
    // Reading reopens both windows, through WINDOW_UPDATEs on the rings.
    assert_eq!(p.client_read(slow), 1800);
    while p.server_read(slow) {}
    p.run();
    assert!(
        p.respond(slow, 600),
        "the client's read reopened the window"
    );
    assert!(p.send(slow, 600, true), "the handler's read reopened it");
    assert!(p.client_err.is_none() && p.server_err.is_none());
    p.settle();
    p.check_settled();
}

#[test]
fn an_expired_call_ends_with_deadline_exceeded_on_both_sides_and_frees_its_place() {
    // The server's own timeout (the client sets none): only the server's
    // timer can end the call.
    let mut p = Pair::new(1, Some(Duration::from_millis(100)));
    let a = p.open(None, false).expect("open");
    p.run();
    assert!(p.srec.contains_key(&a));
    p.tick(Duration::from_millis(99));
    p.run();
    assert_eq!(p.srec[&a].end, None, "not before its deadline");
    assert!(p.open(None, true).is_err(), "the one place is taken");
    p.tick(Duration::from_millis(1));
    p.run();
    assert_eq!(p.srec[&a].end, Some(SEnd::Expired));
    p.client_read(a);
    assert_eq!(p.crec[&a].outcome, Some(Code::DeadlineExceeded));
    assert_eq!((p.server.active(), p.client.places()), (0, 0));
    // The place is free on both sides: the next call is admitted.
    let b = p.open(None, true).expect("a free place");
    p.run();
    assert!(p.srec.contains_key(&b) && p.refused_full == 0);
    assert!(p.finish(b));
    p.run();
    p.client_read(b);
    // With `grpc-timeout`, both deadlines run: the client's ends its call
    // (and cancels it on the server) at the same instant.
    let mut p = Pair::new(1, None);
    let c = p
        .open(Some(Duration::from_millis(50)), false)
        .expect("open");
    p.run();
    p.tick(Duration::from_millis(50));
    p.run();
    assert_eq!(p.crec[&c].outcome, Some(Code::DeadlineExceeded));
    assert_eq!(p.srec[&c].end, Some(SEnd::Expired));
    assert_eq!((p.server.active(), p.client.places()), (0, 0));
    p.settle();
    p.check_settled();
}

/// The endpoint's own timeout is sent to nobody: only the client's timer
/// ends the call. Its caller reads what came before the deadline, then
/// `DEADLINE_EXCEEDED`; the CANCEL the state machine says is due reaches
/// the server before the freed place is taken again; what the server
/// still sends for the call is dropped, and its window no longer matters.
#[test]
fn the_clients_own_deadline_ends_its_call_and_cancels_it_on_the_server() {
    let mut p = Pair::new(1, None);
    let a = p
        .open_with(None, Some(Duration::from_millis(30)), false)
        .expect("open");
    p.run();
    assert!(p.srec.contains_key(&a));
    assert_eq!(p.srec[&a].deadline, None, "the server knows no deadline");
    assert_eq!(p.client.poll_timeout(), p.crec[&a].deadline);
    p.tick(Duration::from_millis(29));
    p.run();
    assert_eq!(p.crec[&a].outcome, None, "not before its deadline");
    assert!(p.respond(a, 100));
    p.run();
    p.tick(Duration::from_millis(1));
    assert_eq!(p.crec[&a].outcome, Some(Code::DeadlineExceeded));
    assert_eq!(p.crec[&a].got.len(), 100, "what came before is read first");
    assert_eq!((p.client.places(), p.client.poll_timeout()), (0, None));
    // The next call takes the freed place; the server reads the CANCEL
    // first, so it is not refused.
    let b = p.open(None, true).expect("a free place");
    p.run();
    assert_eq!(p.srec[&a].end, Some(SEnd::Cancelled));
    assert!(p.srec.contains_key(&b) && p.refused_full == 0);
    assert!(p.finish(b));
    p.run();
    p.client_read(b);
    assert_eq!(p.crec[&b].outcome, Some(Code::Ok));
    p.settle();
    p.check_settled();
}

#[test]
fn cancellation_and_draining_let_calls_in_flight_finish() {
    let mut p = Pair::new(4, None);
    let a = p.open(None, false).expect("open");
    let b = p.open(None, false).expect("open");
    p.run();
    assert!(p.send(a, 100, false));
    assert!(p.cancel(a, Code::Cancelled));
    p.run();
    assert_eq!(p.srec[&a].end, Some(SEnd::Cancelled));
    assert_eq!(p.srec[&a].got.len(), 100, "data before the CANCEL arrived");
    assert_eq!(p.server.active(), 1);
    // A call cancelled before the server read anything of it: its
    // REQUEST_HEADERS start a handler, the CANCEL that follows drops it.
    let c = p.open(None, false).expect("open");
    assert!(p.cancel(c, Code::Cancelled));
    p.run();
    assert_eq!(
        p.srec[&c].end,
        Some(SEnd::Cancelled),
        "started, then cancelled"
    );
    // Drain: GOAWAY, new calls refused, `b` goes on.
    p.drain();
    let d = p
        .open(None, true)
        .expect("the client has not seen GOAWAY yet");
    p.run();
    let e = p.open(None, true).expect_err("GOAWAY seen");
    assert_eq!(e.code(), Code::Unavailable);
    p.client_read(d);
    assert_eq!(p.crec[&d].outcome, Some(Code::Unavailable));
    assert_eq!(p.refused_draining, 1);
    assert!(!p.server.is_drained(), "b is in flight");
    assert!(p.send(b, 10, true));
    p.run();
    assert!(p.respond(b, 10) && p.finish(b));
    p.run();
    p.client_read(b);
    assert_eq!(p.crec[&b].outcome, Some(Code::Ok));
    assert_eq!(p.crec[&b].got.len(), 10);
    assert!(p.server.is_drained());
    p.settle();
    p.check_settled();
}

/// Issue #31: completions withheld, so the tail is deferred (the elastic
/// threshold: one tail WRITE in flight) and the writer fills the ring
/// behind it; the reader sees only what the first tail covered. Once
/// completions are polled the deferred tail goes out and everything
/// arrives, within [`STEP_BOUND`] pumps (a hang is a failed assertion).
#[test]
fn a_full_ring_behind_a_deferred_tail_resumes_once_completions_are_polled() {
    let mut p = Pair::new(4, None);
    let calls: Vec<u32> = (0..4).map(|_| p.open(None, false).expect("open")).collect();
    p.run();
    // The client's completions are withheld: its first tail WRITE stays in
    // flight, every later tail is deferred behind it.
    p.c2s.withhold = true;
    for id in &calls {
        while p.send(*id, 400, false) {}
    }
    let queued = p.c2s.outbox.len() as u64;
    assert_eq!(queued, 16, "4 calls, a window of 4 frames each");
    for _ in 0..100 {
        p.pump();
        for id in &calls {
            while p.server_read(*id) {}
        }
    }
    // The writer filled the ring and waits for a head that cannot move:
    // the reader never saw the tail that covers what it wrote.
    assert!(!p.c2s.outbox.is_empty(), "the ring is full");
    assert!(p.c2s.tx.tail_deferred(), "behind a deferred tail");
    assert!(p.c2s.tx.tail() > p.c2s.rx.local_tail());
    let stuck = p.c2s.received;
    assert!(stuck < p.c2s.committed, "messages the reader cannot see");
    p.pump();
    assert_eq!(p.c2s.received, stuck, "no progress without completions");
    // Completions are polled (late): the deferred tail goes out, the
    // reader pushes its head, the writer goes on, all within the bound.
    p.c2s.complete();
    p.c2s.withhold = false;
    let steps = p.run();
    assert!(steps > 0 && p.c2s.received > stuck, "progress resumed");
    for id in &calls {
        while p.server_read(*id) {}
    }
    p.run();
    assert!(p.c2s.outbox.is_empty(), "every message written");
    for id in &calls {
        assert_eq!(p.srec[id].got, p.crec[id].sent, "call {id}");
    }
    p.settle();
    p.check_settled();
}

#[test]
fn a_torn_pointer_record_is_a_wait_and_garbage_that_stays_a_connection_error() {
    let mut p = Pair::new(4, None);
    let a = p.open(None, false).expect("open");
    p.run();
    // The server's tail goes to 0xff, then to 0x106 with a WRITE of which
    // only the first byte lands: the client reads 0x06 (a tail moving
    // backwards, were it taken) with the old check, and waits.
    while p.s2c.tx.tail() < 0xff {
        assert!(p.respond(a, 10));
        p.run();
        p.client_read(a);
    }
    let before = p.crec[&a].got.len();
    p.s2c.tear_tail = Some(Tear {
        bytes: 1,
        reads: u32::MAX,
    });
    assert!(p.respond(a, 300));
    p.pump();
    assert_eq!(p.s2c.tx.synced_tail(), 0x106);
    assert_eq!(word(&p.s2c.tail_rec, 0), 0x06, "torn");
    for _ in 1..TORN_LIMIT {
        p.pump();
    }
    assert!(p.client_err.is_none(), "a wait, not an error");
    assert_eq!(p.client_read(a), 0, "no message before the record is whole");
    assert!(p.s2c.rx.torn_tails() > 0, "the torn record was read");
    p.s2c.finish_tear();
    p.run();
    assert_eq!(p.client_read(a), 300);
    assert_eq!(p.crec[&a].got.len(), before + 300);
    assert_eq!(p.crec[&a].got, p.srec[&a].sent, "the right message");
    // A head push placed torn, whole after 3 reads: the writer keeps the
    // head it had meanwhile, and goes on.
    p.c2s.tear_head = Some(Tear { bytes: 4, reads: 3 });
    assert!(p.send(a, 100, false));
    for _ in 0..6 {
        p.pump();
    }
    assert!(p.c2s.tx.stats().torn_heads >= 3, "the torn record was read");
    assert_eq!(p.c2s.tx.local_head(), p.c2s.tx.tail(), "then the whole one");
    assert_eq!(p.srec[&a].got.len(), 100);
    assert!(p.client_err.is_none() && p.server_err.is_none());
    // Garbage that stays in the tail record: the client's connection
    // closes (`DATA_LOSS`), every call is reset, nothing panics.
    assert!(p.respond(a, 10));
    p.s2c.tear_tail = Some(Tear {
        bytes: 1,
        reads: u32::MAX,
    });
    p.pump();
    p.s2c.torn_rest = None;
    p.s2c.tail_rec = [0x5a; POINTER_RECORD_LEN];
    for _ in 0..=TORN_LIMIT {
        p.pump();
    }
    let (code, _) = p.client_err.clone().expect("the connection closed");
    assert_eq!(code, Code::DataLoss);
    p.client_read(a);
    assert_eq!(p.crec[&a].outcome, Some(Code::DataLoss));
    assert_eq!(p.srec[&a].end, Some(SEnd::Lost));
    assert!(is_prefix(&p.crec[&a].got, &p.srec[&a].sent));
    p.settle();
    p.check_settled();
}

#[test]
fn a_peer_that_stops_reading_stalls_its_writer_and_corrupts_nothing() {
    let mut p = Pair::new(4, None);
    let a = p.open(None, false).expect("open");
    p.run();
    // The server stops reading the client's ring.
    p.c2s.reading = false;
    let timed: Vec<u32> = (0..3)
        .map(|_| {
            p.open(Some(Duration::from_millis(100)), false)
                .expect("open")
        })
        .collect();
    for id in &timed {
        while p.send(*id, 600, false) {}
    }
    p.run();
    assert!(!p.c2s.outbox.is_empty(), "the client's ring is full");
    // The other direction still works: `a` gets its answer.
    assert!(p.respond(a, 500) && p.finish(a));
    p.run();
    assert_eq!(p.client_read(a), 500);
    assert_eq!(p.crec[&a].outcome, Some(Code::Ok));
    // The stalled calls fail by their deadline, on the client.
    p.tick(Duration::from_millis(100));
    p.run();
    for id in &timed {
        assert_eq!(p.crec[id].outcome, Some(Code::DeadlineExceeded));
    }
    assert_eq!(p.client.places(), 0);
    // The server reads again: what was queued arrives in order; the
    // cancelled calls end, nothing breaks.
    p.c2s.reading = true;
    p.run();
    assert!(p.client_err.is_none() && p.server_err.is_none());
    for id in &timed {
        if let Some(s) = p.srec.get(id) {
            assert_eq!(s.end, Some(SEnd::Cancelled), "call {id}");
        }
    }
    p.settle();
    p.check_settled();
}

/// One event of either side.
#[derive(Debug, Clone)]
enum Op {
    /// A call with a `grpc-timeout` (`timeout`) and the endpoint's own
    /// timeout (`local`: only the client's timer knows it), in ms.
    Open {
        end: bool,
        timeout: Option<u64>,
        local: Option<u64>,
    },
    Send {
        n: usize,
        len: usize,
        end: bool,
    },
    ClientRead {
        n: usize,
    },
    ServerRead {
        n: usize,
    },
    Respond {
        n: usize,
        len: usize,
    },
    Finish {
        n: usize,
    },
    Cancel {
        n: usize,
    },
    /// Completions of a direction are withheld, or flow again.
    Withhold {
        s2c: bool,
        on: bool,
    },
    /// Late completions of a direction are polled.
    Complete {
        s2c: bool,
    },
    /// A reader stops reading, or reads again.
    Stall {
        s2c: bool,
        on: bool,
    },
    /// The next tail WRITE (`head`: head push) of a direction is placed
    /// torn, whole after `reads` reads of the record.
    Tear {
        s2c: bool,
        head: bool,
        tear: Tear,
    },
    Tick(u64),
    Drain,
    Pump(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (
            any::<bool>(),
            prop::option::weighted(0.3, 1u64..300),
            prop::option::weighted(0.2, 1u64..300),
        )
            .prop_map(|(end, timeout, local)| Op::Open { end, timeout, local }),
        24 => (0usize..8, 0usize..700, prop::bool::weighted(0.15))
            .prop_map(|(n, len, end)| Op::Send { n, len, end }),
        12 => (0usize..8).prop_map(|n| Op::ClientRead { n }),
        12 => (0usize..8).prop_map(|n| Op::ServerRead { n }),
        16 => (0usize..8, 0usize..700).prop_map(|(n, len)| Op::Respond { n, len }),
        8 => (0usize..8).prop_map(|n| Op::Finish { n }),
        3 => (0usize..8).prop_map(|n| Op::Cancel { n }),
        3 => (any::<bool>(), any::<bool>()).prop_map(|(s2c, on)| Op::Withhold { s2c, on }),
        4 => any::<bool>().prop_map(|s2c| Op::Complete { s2c }),
        3 => (any::<bool>(), any::<bool>()).prop_map(|(s2c, on)| Op::Stall { s2c, on }),
        3 => (any::<bool>(), any::<bool>(), 1..POINTER_RECORD_LEN, 1..TORN_LIMIT)
            .prop_map(|(s2c, head, bytes, reads)| Op::Tear { s2c, head, tear: Tear { bytes, reads } }),
        4 => (0u64..200).prop_map(Op::Tick),
        1 => Just(Op::Drain),
        20 => (1u8..4).prop_map(Op::Pump),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Random interleavings of both sides' events: every call ends exactly
    /// once on each side; no byte of a call is lost, duplicated or
    /// reordered; windows and places stay within bounds and no place
    /// leaks; the rings' pointers keep their invariants; nothing breaks the
    /// protocol; and once events stop, the pair quiesces.
    #[test]
    fn random_interleavings_of_both_sides_keep_the_invariants(
        ops in prop::collection::vec(op(), 1..200)
    ) {
        const LIMIT: usize = 3;
        let mut p = Pair::new(LIMIT, Some(Duration::from_millis(400)));
        for op in ops {
            let ids: Vec<u32> = p.crec.keys().copied().collect();
            let pick = |n: usize| (!ids.is_empty()).then(|| ids[n % ids.len()]);
            match op {
                Op::Open { end, timeout, local } => {
                    let ms = |t: Option<u64>| t.map(Duration::from_millis);
                    let _ = p.open_with(ms(timeout), ms(local), end);
                }
                Op::Send { n, len, end } => {
                    if let Some(id) = pick(n) {
                        p.send(id, len, end);
                    }
                }
                Op::ClientRead { n } => {
                    if let Some(id) = pick(n) {
                        p.client_read(id);
                    }
                }
                Op::ServerRead { n } => {
                    if let Some(id) = pick(n) {
                        p.server_read(id);
                    }
                }
                Op::Respond { n, len } => {
                    if let Some(id) = pick(n) {
                        p.respond(id, len);
                    }
                }
                Op::Finish { n } => {
                    if let Some(id) = pick(n) {
                        p.finish(id);
                    }
                }
                Op::Cancel { n } => {
                    if let Some(id) = pick(n) {
                        p.cancel(id, Code::Cancelled);
                    }
                }
                Op::Withhold { s2c, on } => {
                    if s2c { p.s2c.withhold = on } else { p.c2s.withhold = on }
                }
                Op::Complete { s2c } => {
                    if s2c { p.s2c.complete() } else { p.c2s.complete() }
                }
                Op::Stall { s2c, on } => {
                    if s2c { p.s2c.reading = !on } else { p.c2s.reading = !on }
                }
                Op::Tear { s2c, head, tear } => {
                    let d = if s2c { &mut p.s2c } else { &mut p.c2s };
                    if head {
                        d.tear_head = Some(tear);
                    } else {
                        d.tear_tail = Some(tear);
                    }
                }
                Op::Tick(ms) => p.tick(Duration::from_millis(ms)),
                Op::Drain => p.drain(),
                Op::Pump(k) => {
                    for _ in 0..k {
                        p.pump();
                    }
                }
            }
            p.check(LIMIT);
        }
        p.settle();
        p.check(LIMIT);
        p.check_settled();
        prop_assert!(p.client_err.is_none(), "{:?}", p.client_err);
        prop_assert!(p.server_err.is_none(), "{:?}", p.server_err);
    }
}
