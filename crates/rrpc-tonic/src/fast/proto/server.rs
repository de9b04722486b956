//! The server side of a fast-path connection, as a state machine.
//!
//! Fed the frames the client sent ([`decode`], [`Server::handle`]) and
//! the [`Note`]s of its call tasks, it says which handlers to start, where
//! request data goes, which calls to cancel and what to answer at once
//! ([`Server::poll_output`]). See the [module docs](super) for the split
//! between this and the async driver.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::flow::{self, RecvWindow};
use crate::frame::{self, END_STREAM, FrameError, Kind};

/// What the connection's limits are.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Calls holding a place at once; the excess is refused.
    pub(crate) max_calls: usize,
    /// Our receive window per call (announced to the client).
    pub(crate) recv_window: u32,
    /// The client's receive window per call: a call's initial send credit.
    pub(crate) peer_window: u32,
    /// Largest request header list (HTTP/2's count, [`header_list_size`]).
    pub(crate) max_header_list: usize,
    /// Upper bound on every call's deadline (tonic's `Server::timeout`).
    pub(crate) timeout: Option<Duration>,
}

/// One call: its id and which call of that id it is. Events keyed by an
/// ended call never touch a later call that reuses the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CallKey {
    /// The call id on the wire.
    pub(crate) id: u32,
    seq: u64,
}

impl CallKey {
    /// Tests: the key of call `id` (sequence 0).
    #[cfg(test)]
    pub(crate) fn for_tests(id: u32) -> CallKey {
        CallKey { id, seq: 0 }
    }
}

/// One decoded client frame, owned.
#[derive(Debug)]
pub(crate) enum In {
    /// REQUEST_HEADERS: a call opens (`end`: the request is complete).
    Open {
        id: u32,
        head: frame::RequestHead,
        end: bool,
    },
    /// DATA (`end`: the request stream ends).
    Data { id: u32, data: Bytes, end: bool },
    /// CANCEL: the client abandons the call.
    Cancel { id: u32 },
    /// WINDOW_UPDATE: the client grants more response window.
    Window { id: u32, inc: u32 },
    /// A malformed frame or one a client must not send; nothing of the
    /// message follows it.
    Bad(FrameError),
}

/// Decodes one ring message into `inbox` (owned: the message's slot is
/// released when the receive returns). The one receive-side copy of
/// request data happens here: ring slot -> body chunk.
pub(crate) fn decode(msg: &[u8], inbox: &mut Vec<In>) {
    for f in frame::frames(msg) {
        let f = match f {
            Ok(f) => f,
            Err(e) => return inbox.push(In::Bad(e)),
        };
        let id = f.call_id;
        let end = f.end_stream();
        inbox.push(match f.kind {
            Kind::RequestHeaders => match frame::parse_request_headers(f.payload) {
                Ok(head) => In::Open { id, head, end },
                Err(e) => return inbox.push(In::Bad(e)),
            },
            Kind::Data => In::Data {
                id,
                data: frame::copy_payload(f.payload),
                end,
            },
            Kind::Cancel => In::Cancel { id },
            Kind::WindowUpdate => match frame::parse_window_update(f.payload) {
                Ok(inc) => In::Window { id, inc },
                Err(e) => return inbox.push(In::Bad(e)),
            },
            Kind::ResponseHeaders | Kind::Trailers | Kind::GoAway => {
                return inbox.push(In::Bad(FrameError::Invalid(
                    "server-only frame sent by a client",
                )));
            }
        });
    }
}

/// Why a call was refused before any handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The server is draining (after GOAWAY): `Unavailable`.
    Draining,
    /// `limit` calls hold a place: `Unavailable` (HTTP/2's REFUSED_STREAM).
    TooManyCalls { limit: usize },
    /// The header list is larger than allowed: HTTP 431.
    HeadersTooLarge { size: usize, max: usize },
}

impl Refusal {
    /// The frame that answers the call: a trailers-only response.
    pub(crate) fn frame(&self) -> (Kind, u8, Bytes) {
        let st = match self {
            Refusal::Draining => tonic::Status::unavailable("rrpc: server is shutting down"),
            Refusal::TooManyCalls { limit } => tonic::Status::unavailable(format!(
                "rrpc: too many concurrent calls on this connection (limit {limit})"
            )),
            Refusal::HeadersTooLarge { .. } => {
                let p = frame::response_headers_payload(
                    http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    &http::HeaderMap::new(),
                );
                return (Kind::ResponseHeaders, END_STREAM, p.into());
            }
        };
        trailers_only(st)
    }
}

/// A status as a TRAILERS frame that ends the call.
pub(crate) fn trailers_only(status: tonic::Status) -> (Kind, u8, Bytes) {
    let (parts, ()) = status.into_http::<()>().into_parts();
    (
        Kind::Trailers,
        END_STREAM,
        frame::metadata_payload(&parts.headers).into(),
    )
}

/// What the driver should do next.
// `Start`, the largest, is the output of every call; boxing it would add the
// allocation a call's `Chunks` saves.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Output {
    /// Write a frame now (a refusal, or GOAWAY with id 0).
    Send {
        kind: Kind,
        flags: u8,
        id: u32,
        payload: Bytes,
        /// Set for refusals: why.
        refusal: Option<Refusal>,
    },
    /// Start the handler of an admitted call. Its request data that came
    /// in the same message is in `chunks`; `end`: the request is complete.
    Start {
        key: CallKey,
        head: frame::RequestHead,
        chunks: super::Chunks,
        end: bool,
        /// The call's send credit (the client's window plus what it granted
        /// in the same message; at most [`frame::MAX_WINDOW`]).
        send_credit: u32,
        /// When the call must be over (the shorter of `grpc-timeout` and
        /// the server's timeout), on the clock given to [`Server::handle`].
        deadline: Option<Instant>,
    },
    /// More request data for a started call.
    Data { key: CallKey, data: Bytes },
    /// The request stream of a started call ended.
    EndOfRequest { key: CallKey },
    /// The client granted a started call `inc` more bytes of send credit.
    Grant { key: CallKey, inc: u32 },
    /// The client cancelled a started call: drop its handler.
    Cancel { key: CallKey },
    /// A started call's deadline passed ([`Server::handle_timeout`]): if
    /// the call has not ended yet, drop it (its handler, or the response
    /// body it returned: the deadline covers the whole call, as gRPC's
    /// rule says) and end it with `DEADLINE_EXCEEDED`. The call keeps its
    /// place until that answer is written, as any call does.
    Expire { key: CallKey },
}

/// What a call task did ([`Server::handle_note`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Note {
    /// The call's last frame is about to be written: its place is free.
    Released(CallKey),
    /// The consumer read request bytes; a WINDOW_UPDATE of `inc` is about
    /// to be written.
    Returned(CallKey, u32),
    /// The call's task ended (also after a first poll that finished it).
    Finished(CallKey),
}

#[derive(Debug)]
struct Call {
    seq: u64,
    recv: RecvWindow,
    /// The request stream is still open.
    req_open: bool,
    /// The call still holds a place.
    holds_place: bool,
    /// The call has a deadline that has not expired yet (an entry in
    /// [`Server`]'s `deadlines`).
    timed: bool,
}

/// A call whose REQUEST_HEADERS arrived in the message being handled.
#[derive(Debug)]
struct Opening {
    key: CallKey,
    head: frame::RequestHead,
    chunks: super::Chunks,
    end: bool,
    send_credit: u64,
    deadline: Option<Instant>,
}

/// The server's call table ([`Server`]'s `calls`).
type Calls = HashMap<u32, Call, foldhash::fast::RandomState>;

/// The server side of one connection.
#[derive(Debug)]
pub(crate) struct Server {
    cfg: Config,
    /// Keyed by ids the peer chose, hashed with foldhash (seeded at random
    /// per table, as the client's): std's SipHash cost ~400 instructions a
    /// call here under callgrind (four lookups). Keys the peer chose could
    /// be aimed at one bucket only by one who knows the seed, and even then
    /// the table holds only calls this server admitted (each runs a task of
    /// its own until it ends), so a chain is never longer than the calls
    /// the server is running.
    calls: Calls,
    /// Calls holding a place.
    active: usize,
    draining: bool,
    seq: u64,
    out: VecDeque<Output>,
    opening: Vec<Opening>,
    error: Option<FrameError>,
    /// The deadlines of calls that have one, earliest first: (instant,
    /// id, seq). Touched only by calls with a deadline; the entry of a
    /// call that ended is discarded lazily (its key no longer matches).
    deadlines: BinaryHeap<Reverse<(Instant, u32, u64)>>,
    /// Calls whose deadline is in `deadlines` and still live.
    timed: usize,
}

impl Server {
    pub(crate) fn new(cfg: Config) -> Self {
        Server {
            cfg,
            calls: Calls::default(),
            active: 0,
            draining: false,
            seq: 0,
            out: VecDeque::new(),
            opening: Vec::new(),
            error: None,
            deadlines: BinaryHeap::new(),
            timed: 0,
        }
    }

    /// Removes call `id` from the table, with its place and its deadline.
    fn remove_call(&mut self, id: u32) -> Option<Call> {
        let call = self.calls.remove(&id)?;
        if call.holds_place {
            self.active -= 1;
        }
        if call.timed {
            self.timed -= 1;
        }
        Some(call)
    }

    /// Whether a `deadlines` entry is the live deadline of an open call.
    fn is_live(calls: &Calls, id: u32, seq: u64) -> bool {
        calls.get(&id).is_some_and(|c| c.seq == seq && c.timed)
    }

    /// Expires every call whose deadline is at or before `now`
    /// ([`Output::Expire`]). The driver calls it when the instant
    /// [`Server::poll_timeout`] gave has come.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse((at, id, seq))) = self.deadlines.peek().copied() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            if let Some(call) = self.calls.get_mut(&id).filter(|c| c.seq == seq && c.timed) {
                call.timed = false;
                self.timed -= 1;
                self.out.push_back(Output::Expire {
                    key: CallKey { id, seq },
                });
            }
        }
    }

    /// The earliest deadline of a call still open, if any: when to call
    /// [`Server::handle_timeout`] (entries of ended calls are dropped
    /// here).
    pub(crate) fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, id, seq))) = self.deadlines.peek().copied() {
            if Self::is_live(&self.calls, id, seq) {
                return Some(at);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Records the deadline of call `key` (just opened). Entries of ended
    /// calls left behind are swept once they outnumber the live ones, so
    /// the heap stays within twice the calls with a deadline.
    fn add_deadline(&mut self, key: CallKey, at: Instant) {
        if let Some(c) = self.calls.get_mut(&key.id) {
            c.timed = true;
            self.timed += 1;
        }
        self.deadlines.push(Reverse((at, key.id, key.seq)));
        if self.deadlines.len() > 2 * self.timed + 32 {
            let calls = &self.calls;
            self.deadlines
                .retain(|Reverse((_, id, seq))| Self::is_live(calls, *id, *seq));
        }
    }

    /// Handles the frames of one ring message (calls opened by it start
    /// once the whole message was handled, with the data that came with
    /// them). `now` is read only for a call that has a deadline.
    ///
    /// # Errors
    /// The client broke the protocol: close the connection. The error is
    /// sticky (every later call returns it) and no call of the message
    /// starts.
    pub(crate) fn handle(
        &mut self,
        inputs: impl IntoIterator<Item = In>,
        now: &mut impl FnMut() -> Instant,
    ) -> Result<(), FrameError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        for input in inputs {
            if let Err(e) = self.handle_one(input, now) {
                // The calls of this message never start.
                for o in std::mem::take(&mut self.opening) {
                    self.remove_call(o.key.id);
                }
                self.error = Some(e.clone());
                return Err(e);
            }
        }
        for o in self.opening.drain(..) {
            self.out.push_back(Output::Start {
                key: o.key,
                head: o.head,
                chunks: o.chunks,
                end: o.end,
                // At most `MAX_WINDOW` ([`flow::check_grant`]).
                send_credit: u32::try_from(o.send_credit).unwrap_or(frame::MAX_WINDOW),
                deadline: o.deadline,
            });
        }
        Ok(())
    }

    fn handle_one(
        &mut self,
        input: In,
        now: &mut impl FnMut() -> Instant,
    ) -> Result<(), FrameError> {
        match input {
            In::Bad(e) => Err(e),
            In::Open { id, head, end } => {
                if self.calls.contains_key(&id) {
                    return Err(FrameError::Invalid("call id reused while open"));
                }
                let refusal = if self.draining {
                    Some(Refusal::Draining)
                } else {
                    let size = header_list_size(&head);
                    if size > self.cfg.max_header_list {
                        Some(Refusal::HeadersTooLarge {
                            size,
                            max: self.cfg.max_header_list,
                        })
                    } else if self.active >= self.cfg.max_calls {
                        Some(Refusal::TooManyCalls {
                            limit: self.cfg.max_calls,
                        })
                    } else {
                        None
                    }
                };
                if let Some(r) = refusal {
                    let (kind, flags, payload) = r.frame();
                    self.out.push_back(Output::Send {
                        kind,
                        flags,
                        id,
                        payload,
                        refusal: Some(r),
                    });
                    return Ok(());
                }
                self.seq += 1;
                let key = CallKey { id, seq: self.seq };
                self.active += 1;
                self.calls.insert(
                    id,
                    Call {
                        seq: key.seq,
                        recv: RecvWindow::new(self.cfg.recv_window),
                        req_open: !end,
                        holds_place: true,
                        timed: false,
                    },
                );
                let deadline =
                    super::call_timeout(&head.headers, self.cfg.timeout).map(|d| now() + d);
                if let Some(at) = deadline {
                    self.add_deadline(key, at);
                }
                self.opening.push(Opening {
                    key,
                    head,
                    chunks: super::Chunks::default(),
                    end,
                    send_credit: u64::from(self.cfg.peer_window),
                    deadline,
                });
                Ok(())
            }
            In::Data { id, data, end } => {
                let Some(call) = self.calls.get_mut(&id) else {
                    // The call ended (or was refused): ignored.
                    return Ok(());
                };
                call.recv.received(data.len())?;
                let key = CallKey { id, seq: call.seq };
                let was_open = call.req_open;
                call.req_open &= !end;
                if let Some(o) = self.opening.iter_mut().find(|o| o.key == key) {
                    if was_open && !data.is_empty() {
                        o.chunks.push_back(data);
                    }
                    o.end |= end;
                    return Ok(());
                }
                if was_open && !data.is_empty() {
                    self.out.push_back(Output::Data { key, data });
                }
                if was_open && end {
                    self.out.push_back(Output::EndOfRequest { key });
                }
                Ok(())
            }
            In::Window { id, inc } => {
                let Some(call) = self.calls.get(&id) else {
                    // A window for a call that already ended is ignored.
                    return Ok(());
                };
                let key = CallKey { id, seq: call.seq };
                if let Some(o) = self.opening.iter_mut().find(|o| o.key == key) {
                    flow::check_grant(o.send_credit, inc)?;
                    o.send_credit += u64::from(inc);
                    return Ok(());
                }
                self.out.push_back(Output::Grant { key, inc });
                Ok(())
            }
            In::Cancel { id } => {
                let Some(call) = self.remove_call(id) else {
                    return Ok(());
                };
                let key = CallKey { id, seq: call.seq };
                if let Some(i) = self.opening.iter().position(|o| o.key == key) {
                    self.opening.swap_remove(i);
                } else {
                    // Dropping the handler's future is how tonic sees cancellation.
                    self.out.push_back(Output::Cancel { key });
                }
                Ok(())
            }
        }
    }

    /// Applies what a call task did. Notes of calls that already ended
    /// (cancelled, or finished) are ignored.
    pub(crate) fn handle_note(&mut self, note: Note) {
        let (Note::Released(key) | Note::Returned(key, _) | Note::Finished(key)) = note;
        let Some(call) = self.calls.get_mut(&key.id).filter(|c| c.seq == key.seq) else {
            return;
        };
        match note {
            Note::Released(_) => {
                if std::mem::take(&mut call.holds_place) {
                    self.active -= 1;
                }
            }
            Note::Returned(_, inc) => call.recv.reopen(inc),
            Note::Finished(_) => {
                self.remove_call(key.id);
            }
        }
    }

    /// Starts draining (once): GOAWAY goes out, later calls are refused,
    /// calls in flight finish.
    pub(crate) fn start_drain(&mut self) {
        if std::mem::replace(&mut self.draining, true) {
            return;
        }
        self.out.push_back(Output::Send {
            kind: Kind::GoAway,
            flags: 0,
            id: 0,
            payload: Bytes::new(),
            refusal: None,
        });
    }

    /// Whether the server is draining.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining
    }

    /// Draining and every call ended: the connection can close.
    pub(crate) fn is_drained(&self) -> bool {
        self.draining && self.calls.is_empty()
    }

    /// The next thing to do.
    pub(crate) fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// Calls holding a place.
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        self.active
    }

    /// Entries in the deadline heap (live or not yet swept).
    #[cfg(test)]
    pub(crate) fn deadline_entries(&self) -> usize {
        self.deadlines.len()
    }

    /// Calls open (started and not ended).
    #[cfg(test)]
    pub(crate) fn open_calls(&self) -> usize {
        self.calls.len()
    }

    /// The receive window of open call `id`.
    #[cfg(test)]
    pub(crate) fn recv_window(&self, id: u32) -> Option<RecvWindow> {
        self.calls.get(&id).map(|c| c.recv)
    }
}

/// A request's header list size as HTTP/2 counts it (RFC 9113 §6.5.2:
/// name + value + 32 per field), pseudo-headers included as hyper's
/// client would send them.
pub(crate) fn header_list_size(head: &frame::RequestHead) -> usize {
    let authority = head.authority.as_ref().map_or(0, |a| a.as_str().len());
    let pseudo = (":method".len() + "POST".len() + 32)
        + (":scheme".len() + "http".len() + 32)
        + (":path".len() + head.path.as_str().len() + 32)
        + (":authority".len() + authority + 32);
    pseudo
        + head
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum::<usize>()
}
