//! The fast path's sans-IO protocol core, in the style of quinn-proto.
//!
//! Plain state machines: `handle_*` methods take decoded frames and the
//! events of the calls (with the time where time matters, as a clock the
//! caller supplies), `poll_*` methods say what to do next. Nothing here
//! touches a ring, a task, a timer or a lock, so every rule can be stepped
//! in a test on a virtual clock (`tests`: a client and a server wired back
//! to back, frames passed in memory).
//!
//! # What the state machine owns (server side, [`server::Server`])
//! * the call table: which call ids are open, each with a sequence number
//!   ([`server::CallKey`]) so that a late event of an ended call never
//!   touches a later call that reuses its id;
//! * admission: at most `max_calls` calls hold a place; the excess, calls
//!   opened while draining and calls with oversized headers are refused at
//!   once ([`server::Output::Send`] of a trailers-only response);
//! * GOAWAY and draining ([`server::Server::start_drain`],
//!   [`server::Server::is_drained`]);
//! * each call's receive window ([`flow::RecvWindow`]): DATA beyond it,
//!   a window update that overflows an opening call's send credit, a
//!   reused call id, a client sending server frames are connection errors
//!   (returned, never a panic), and the error is sticky;
//! * cancellation: a CANCEL frees the call's place and tells the driver
//!   to drop the handler ([`server::Output::Cancel`]);
//! * deadlines: the call's deadline (the shorter of `grpc-timeout` and the
//!   server's timeout) on the caller's clock ([`server::Output::Start`]),
//!   and its expiry: [`server::Server::poll_timeout`] gives the earliest
//!   deadline of a call still open, [`server::Server::handle_timeout`]
//!   expires every call whose deadline passed ([`server::Output::Expire`]:
//!   the driver drops a call that has not ended, its handler or its
//!   response body, and ends it with `DEADLINE_EXCEEDED`). Only calls with
//!   a deadline touch the heap that keeps them; entries of calls that
//!   ended are discarded lazily.
//!
//! # What the driver owns (`fast::server::serve_conn`)
//! The ring, the handler tasks and their futures (the first poll of each
//! runs inline in the reader task), the per-call body channels, the
//! writer, and each call's *send* credit ([`crate::fast::flow::CallFlow`]:
//! a semaphore of bytes, because the response is sent by the call's own
//! task, which waits on it; its overflow rule is [`flow::check_grant`]).
//! The driver tells the state machine what the call tasks did through
//! [`server::Note`]s: a call's place freed (just before its last frame is
//! written), bytes its handler consumed (just before the WINDOW_UPDATE is
//! written), the task ended. It applies every note that was sent before it
//! handles the next ring message, so a client that saw a call's trailers
//! and opens the next call is never refused.
//!
//! The driver keeps one deadline timer per connection, armed at
//! [`server::Server::poll_timeout`] (reset only when that changes) and
//! raced in its `select!` (a `Sleep`: cancel safe); when it fires it calls
//! [`server::Server::handle_timeout`]. An expired call's task hears it on a
//! oneshot raced against the whole call (the call first, as `timeout_at`
//! polls): the deadline bounds the handler and the response body it
//! returned (gRPC's rule; tonic's own server bounds only the handler), and
//! the client reads `DEADLINE_EXCEEDED`, as its own deadline says it
//! ([`crate::call::deadline_exceeded`]).
//!
//! # Cancel safety of the async drivers
//! Every future the server raced in its `select!` is cancel safe: the note
//! channel's `recv`, the writer's `failed`, the shutdown token's
//! `cancelled`, the deadline timer (a `Sleep`, polled by reference) and
//! the ring's `recv_with` (a message is consumed only in
//! the poll that returns it; its frames are decoded into an owned inbox
//! inside that poll). The sends that follow are awaited outside the
//! `select!`. Notes are also drained with `try_recv` at the top of each
//! turn and right after a message was received, before its frames are
//! handled. A call's task races its deadline's oneshot (cancel safe)
//! against the whole call, its response writes included: a write cut
//! short leaves whole frames only (as the client's, below), and the
//! call's TRAILERS with `DEADLINE_EXCEEDED` follow.
//!
//! The client's fallback reader races its receive loop (the receive in
//! flight lives in the connection's shared state, not in the future, so
//! dropping the future loses nothing), the writer's `failed`, the side
//! channel's peer-gone future, the poller's idle-read signal
//! (`IdleReads::wait`) and the connection's deadline timer
//! (`Shared::poll_timer`: a `Sleep` and the state machine's
//! `handle_timeout`, which is synchronous): all cancel safe. A call waits
//! for a place (`demux::Queued`: cancel safe, dropped in line it leaves the
//! line, dropped once the place passed to it it gives the place back, so
//! it never takes one; its deadline passing in line is the timer's
//! message, not a race) and for its first event (cancel safe, as above).
//! The one race a call runs is its request's write against its deadline
//! (`client::until_expired`: the write first): the write is not cancel
//! safe, but a write cut short leaves whole frames only, and the call's
//! guard then sends the CANCEL the state machine says is due.

//! # What the state machine owns (client side, [`client::Client`])
//! * what each server frame means ([`client::decode`]: call events,
//!   GOAWAY, violations);
//! * the call table: which id a new call gets, each call's queue of
//!   events ([`client::Client::deliver`], [`client::Call::pop_event`]);
//! * each call's receive window: DATA beyond it is a connection error; the
//!   window reopens as the response body takes data out, and says when a
//!   WINDOW_UPDATE is due;
//! * admission: at most `max_concurrent_calls` calls hold a place; the
//!   excess waits in line, first come first served
//!   ([`client::Client::admit`]), and each place given back passes to the
//!   first in line ([`client::Client::release`] returns its waiter); a
//!   caller that gives up leaves the line ([`client::Client::leave_queue`]);
//! * GOAWAY (new calls fail `Unavailable`, calls in flight go on) and when
//!   and why the connection ends ([`client::Client::handle_receive`],
//!   [`client::Client::close`]);
//! * deadlines: each call's (the shorter of its `grpc-timeout` and the
//!   endpoint's timeout) and each waiting caller's, on the caller's clock:
//!   [`client::Client::poll_timeout`] gives the earliest still live,
//!   [`client::Client::handle_timeout`] expires what is due (an open call
//!   gets `DEADLINE_EXCEEDED` as its next event, after what came before
//!   it, and nothing after; a caller in line leaves the line);
//! * cancellation: whether a call its caller lets go of must be reset on
//!   the server ([`client::Client::remove`]: unless the server or the
//!   connection ended it; an expired call must be).
//!
//! # What the client's driver owns (`fast::client`)
//! The leader/follower receive (whichever call waits polls the ring and
//! dispatches to the others, the fallback reader task takes over when it
//! leaves), each call's waker and send credit (carried in the table as the
//! call's `io`), the writer, the parking of a call waiting in line (a
//! oneshot per queued call, made only when it queues; its place is given
//! back by a guard when the call finished or its CANCEL was written), and
//! one deadline timer per connection, kept by the fallback reader task
//! (armed at `poll_timeout`; a call whose deadline is earlier than the
//! armed instant wakes it to re-arm, a later one is taken up when it
//! fires). All of it, the receiver included, is under one short
//! synchronous lock (`demux::Shared::table`); the receive future is taken
//! out of it to be polled and put back, so no lock is held across a poll
//! or an await.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tonic::Status;

pub(crate) mod client;
pub(crate) mod flow;
pub(crate) mod server;

/// What the connection's reader task delivers to one call.
#[derive(Debug)]
pub(crate) enum Event {
    /// Response headers with the HTTP status; `end`: a trailers-only
    /// response, nothing follows (client side only).
    Headers {
        status: http::StatusCode,
        headers: HeaderMap,
        end: bool,
    },
    /// A chunk of the body.
    Data(Bytes),
    /// Trailers: the call is over (client side only).
    Trailers(HeaderMap),
    /// The call was aborted (peer cancel, connection lost, protocol error).
    Reset(Status),
    /// The peer granted this call more send window (client side; applied
    /// by the reader, never queued).
    Window(u32),
}

/// A call's request data queued before its handler reads it (server
/// side): the first chunk inline, more in a deque. A unary request's data
/// is one chunk, so it queues with no allocation (a `VecDeque` allocated on
/// its first push, once a call).
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    /// Older than everything in `rest` when set: filled only while `rest`
    /// is empty.
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
}

impl Chunks {
    /// Queues `b` last.
    pub(crate) fn push_back(&mut self, b: Bytes) {
        if self.first.is_none() && self.rest.is_empty() {
            self.first = Some(b);
        } else {
            self.rest.push_back(b);
        }
    }

    /// Takes the oldest chunk.
    pub(crate) fn pop_front(&mut self) -> Option<Bytes> {
        self.first.take().or_else(|| self.rest.pop_front())
    }

    /// Chunks queued.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// The chunks, oldest first.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Bytes> {
        self.first.iter().chain(self.rest.iter())
    }

    /// The chunks, oldest first, as a deque.
    #[cfg(test)]
    pub(crate) fn into_deque(self) -> VecDeque<Bytes> {
        self.first.into_iter().chain(self.rest).collect()
    }
}

#[cfg(test)]
mod pair;
#[cfg(test)]
mod tests;

/// Header maps with at most this many names are scanned for
/// `grpc-timeout` before it is looked up ([`parse_grpc_timeout`]).
const SCANNED: usize = 8;

/// Parses `grpc-timeout` as tonic does (at most 8 digits and a unit).
pub(crate) fn parse_grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    // A `HeaderName`, not a `&str`: `http` would parse the string into a
    // name on every lookup (~250 instructions, twice a call).
    static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
    // A call's few headers are scanned for less than the lookup costs (it
    // hashes the name, ~150 instructions, on both ends of every call,
    // which mostly have no timeout).
    if headers.keys_len() <= SCANNED && !headers.keys().any(|k| *k == GRPC_TIMEOUT) {
        return None;
    }
    let s = headers.get(&GRPC_TIMEOUT)?.to_str().ok()?;
    if s.len() < 2 || s.len() > 9 {
        return None;
    }
    let (v, unit) = s.split_at(s.len() - 1);
    let v: u64 = v.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(v * 3600),
        "M" => Duration::from_secs(v * 60),
        "S" => Duration::from_secs(v),
        "m" => Duration::from_millis(v),
        "u" => Duration::from_micros(v),
        "n" => Duration::from_nanos(v),
        _ => return None,
    })
}

/// The shorter of a call's `grpc-timeout` and a configured limit (tonic's
/// `GrpcTimeout` on either end).
pub(crate) fn call_timeout(headers: &HeaderMap, limit: Option<Duration>) -> Option<Duration> {
    match (parse_grpc_timeout(headers), limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
