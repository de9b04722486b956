//! Fast-path client: a `GrpcService<Body>` multiplexing calls over one pipe.
//!
//! A call's request is written when tonic calls the channel
//! (`Service::call`), not when its future is first polled: when a place is
//! free, the body is ready and the ring has room (every unary call, as a
//! rule), the future returned only waits for the response's head (a
//! `Reply`, a few words: boxed once, moved cheaply). Dropped, even
//! unpolled, it cancels the call. A call that must wait (for a place, for
//! room in the ring, for its body) does the rest in a future of its own.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use tokio::task::AbortHandle;
use tonic::Status;
use tonic::body::Body;

use super::flow::{self, CallFlow, Credit};
use super::proto::call_timeout;
use super::proto::client as proto;
use super::writer::{Batch, FrameWriter, Out};
use super::{Event, EventSource, RecvBody};
use crate::conn::Pipe;
use crate::frame::{self, END_STREAM, Kind};
use crate::{Error, RrpcConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

mod demux;
pub(crate) use demux::SlotRef;
use demux::*;

/// What a client endpoint adds to every call ([`crate::RrpcEndpoint`]),
/// as tonic's `Channel` does with its `UserAgent`, `AddOrigin` and
/// `GrpcTimeout` layers.
#[derive(Debug, Clone)]
pub(crate) struct CallOptions {
    /// The `user-agent` value (tonic's, or the endpoint's followed by tonic's).
    pub(crate) user_agent: http::HeaderValue,
    /// The `:authority` sent when the request's URI has none.
    pub(crate) authority: Option<http::uri::Authority>,
    /// A limit on every call, besides its `grpc-timeout`.
    pub(crate) timeout: Option<Duration>,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            user_agent: crate::call::tonic_user_agent().clone(),
            authority: None,
            timeout: None,
        }
    }
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    writer: FrameWriter,
    fallback: AbortHandle,
    opts: CallOptions,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.fallback.abort();
    }
}

/// The fast-path channel: cheap to clone, every clone shares the connection.
#[derive(Debug, Clone)]
pub(crate) struct FastChannel {
    inner: Arc<Inner>,
}

impl FastChannel {
    /// Starts a client connection on a negotiated pipe; `peer_window` is
    /// the server's announced receive window per call.
    pub(crate) fn start(
        pipe: Pipe,
        cfg: &RrpcConfig,
        peer_window: u32,
        opts: CallOptions,
    ) -> FastChannel {
        let (tx, rx) = pipe;
        let peer_gone = rx.peer_gone();
        // Self-sizing rings: read while idle when the poller's sizing tick
        // finds data to read (`Shared::nudge_idle_reader`).
        let idle_reads = rx.idle_reads();
        let mut table = Table::new(cfg.call_window(), cfg.max_concurrent_calls());
        table.rx.rx = Some(rx);
        let shared = Arc::new(Shared {
            table: Mutex::new(table),
            peer_window,
            retired: AtomicBool::new(false),
        });
        let writer = FrameWriter::new(tx, cfg.zero_copy(), cfg.max_chunk());
        // The driver of last resort; asleep unless a handoff wakes it. It
        // keeps the connection's deadline timer, closes the connection when
        // a send fails, and retires it when the side channel sees the peer
        // leave while no call is receiving (so that the next call
        // reconnects instead of failing).
        let s = shared.clone();
        let w = writer.clone();
        let fallback = tokio::spawn(async move {
            let idle_reads = async {
                let Some(idle) = idle_reads else {
                    return std::future::pending::<()>().await;
                };
                loop {
                    idle.wait().await;
                    s.nudge_idle_reader();
                }
            };
            let retire = async {
                if let Some(gone) = peer_gone {
                    gone.await;
                    tracing::debug!("rrpc: fast-path connection retired: peer gone");
                    s.retired.store(true, Ordering::Release);
                }
                std::future::pending::<()>().await
            };
            let timer = async {
                let mut sleep = std::pin::pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
                let _never: std::convert::Infallible =
                    poll_fn(|cx| s.poll_timer(cx, sleep.as_mut())).await;
            };
            let failed = async {
                w.failed().await;
                w.failure().unwrap_or(Error::Closed("send failed"))
            };
            let failed = tokio::select! {
                () = async { while poll_fn(|cx| s.poll_event(FALLBACK, cx, &mut None)).await.is_some() {} } => None,
                e = failed => Some(e),
                () = retire => None,
                () = idle_reads => None,
                () = timer => None,
            };
            // However it ended, the connection is done: a failed send
            // fails every call, and the next call dials a new connection.
            // (When the receive side ended first, for instance because a
            // failed send closed the connection, `w.failed()` lost the race
            // and the channel kept choosing the dead connection, as the
            // tonic layer under the fault injector showed.)
            if let Some(e) = failed.or_else(|| w.failure()) {
                s.fail(&e);
            }
            s.retired.store(true, Ordering::Release);
        })
        .abort_handle();
        FastChannel {
            inner: Arc::new(Inner {
                shared,
                writer,
                fallback,
                opts,
            }),
        }
    }

    /// Whether `other` is a clone of this channel (the same connection).
    #[cfg(test)]
    pub(crate) fn same_connection(&self, other: &FastChannel) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether new calls should go to a new connection: this one closed,
    /// its server is draining (GOAWAY), its peer left, or a send failed
    /// (known at once, before the driver task has closed it).
    pub(crate) fn is_retired(&self) -> bool {
        self.inner.shared.retired.load(Ordering::Acquire) || self.inner.writer.failure().is_some()
    }
}

/// Cancels the call on drop unless it finished (RST_STREAM's role).
#[derive(Debug)]
pub(crate) struct CallGuard {
    id: u32,
    inner: Arc<Inner>,
    sender: Option<AbortHandle>,
    done: bool,
    /// The call's place in [`RrpcConfig::max_concurrent_calls`]; given back
    /// when the call finished or its CANCEL was written (so the server,
    /// which reads frames in order, has released it too).
    permit: Option<Place>,
}

impl CallGuard {
    /// The caller read the call's end: it leaves the table. The state
    /// machine says whether the server must still hear a CANCEL (a call
    /// whose deadline passed: [`proto::Client::remove`]).
    pub(crate) fn finished(&mut self) {
        self.done = true;
        if self.inner.shared.take(self.id) {
            self.cancel();
        }
        self.permit = None;
    }

    /// Nothing of the call reached the server, or the connection failed
    /// writing it: it leaves the table, no CANCEL.
    fn unsent(&mut self) {
        self.done = true;
        self.inner.shared.take(self.id);
        self.permit = None;
    }

    /// Writes the call's CANCEL; its place is given back once it is
    /// written.
    fn cancel(&mut self) {
        let cancel: Batch = smallvec::smallvec![Out::new(Kind::Cancel, 0, self.id, Bytes::new())];
        if matches!(self.inner.writer.try_send(&cancel), Ok(true)) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let w = self.inner.writer.clone();
            let permit = self.permit.take();
            rt.spawn(async move {
                let _permit = permit;
                if let Err(e) = w.send(cancel).await {
                    // The writer failed the connection (fallback task).
                    tracing::debug!("rrpc: cancel not sent: {e}");
                }
            });
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(s) = self.sender.take() {
            s.abort();
        }
        if self.inner.shared.take(self.id) {
            self.cancel();
        }
    }
}

impl tower::Service<http::Request<Body>> for FastChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = crate::call::ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Back-pressure comes from the ring when frames are written.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        call(self.inner.clone(), req)
    }
}

/// tonic's `UserAgent` layer: ours, or the request's followed by ours. Ours
/// alone is encoded after the map's entries (`true`: see
/// [`frame::Extra`]); the request's own is amended in the map (`false`).
fn add_user_agent(headers: &mut http::HeaderMap, ours: &http::HeaderValue) -> bool {
    use http::header::USER_AGENT;
    let Some(theirs) = headers.get(USER_AGENT) else {
        return true;
    };
    let mut v = theirs.as_bytes().to_vec();
    v.push(b' ');
    v.extend_from_slice(ours.as_bytes());
    if let Ok(v) = http::HeaderValue::from_bytes(&v) {
        headers.insert(USER_AGENT, v);
    }
    false
}

/// What the request body had ready at once.
enum Drained {
    /// The whole request stream (unary and server-streaming calls).
    Complete,
    /// More will come later (client and bidi streaming).
    More,
    /// The body failed.
    Failed(Status),
}

/// Moves the frames `body` has ready now into `batch`, up to about `limit`
/// bytes of data (a body that is always ready is not drained into memory).
fn drain_ready(body: &mut Body, id: u32, batch: &mut Batch, limit: usize) -> Drained {
    let mut taken = 0usize;
    loop {
        if taken >= limit {
            return Drained::More;
        }
        match body.frame().now_or_never() {
            None => return Drained::More,
            Some(Some(Ok(f))) => {
                if let Ok(data) = f.into_data()
                    && !data.is_empty()
                {
                    taken += data.len();
                    batch.push(Out::new(Kind::Data, 0, id, data));
                }
            }
            Some(None) => {
                match batch.last_mut() {
                    Some(last) => last.flags |= END_STREAM,
                    None => batch.push(Out::new(Kind::Data, END_STREAM, id, Bytes::new())),
                }
                return Drained::Complete;
            }
            Some(Some(Err(e))) => return Drained::Failed(e),
        }
    }
}

/// gRPC's status for a call past its deadline, boxed.
fn deadline_exceeded() -> BoxError {
    Box::new(crate::call::deadline_exceeded())
}

/// A call's place among the connection's open calls, or its turn in line.
enum Admitted {
    Now(Place),
    Queued(Queued),
}

/// Takes a place among the connection's open calls (the state machine
/// queues the call, first come first served, while all are taken, until
/// its deadline; a waiter is made only then).
fn admit(shared: &Arc<Shared>, deadline: Option<Instant>) -> Result<Admitted, BoxError> {
    let mut rx = None;
    let mut t = lock(&shared.table);
    let admitted = t.conn.admit(deadline, || {
        let (tx, r) = tokio::sync::oneshot::channel();
        rx = Some(r);
        tx
    });
    if rx.is_some() {
        t.arm(deadline);
    }
    drop(t);
    match (admitted, rx) {
        (Ok(proto::Admission::Queued(ticket)), Some(rx)) => Ok(Admitted::Queued(Queued {
            shared: shared.clone(),
            ticket,
            rx,
            done: false,
        })),
        (Ok(_), _) => Ok(Admitted::Now(Place(shared.clone()))),
        // The connection closed, or the server is draining.
        (Err(st), _) => Err(Box::new(st)),
    }
}

/// The place a call waited for in line; its deadline covers the wait (the
/// state machine takes it out of the line when it passes).
async fn wait_in_line(wait: Queued) -> Result<Place, BoxError> {
    let shared = wait.shared.clone();
    wait.await.map_err(|turn| -> BoxError {
        if turn == Some(Turn::Expired) {
            return deadline_exceeded();
        }
        // Closed with the connection.
        let t = lock(&shared.table);
        let (code, msg) = t.conn.closed().cloned().unwrap_or((
            tonic::Code::Unavailable,
            "rrpc: connection closed".to_string(),
        ));
        Box::new(Status::new(code, msg))
    })
}

/// The REQUEST_HEADERS payload of a request: its path, its authority (or
/// the endpoint's) and its headers with tonic's user agent.
fn request_headers(parts: &mut http::request::Parts, opts: &CallOptions) -> Bytes {
    let ua = &opts.user_agent;
    let extra = add_user_agent(&mut parts.headers, ua).then_some((&http::header::USER_AGENT, ua));
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let authority = parts
        .uri
        .authority()
        .or(opts.authority.as_ref())
        .map_or("", |a| a.as_str());
    frame::request_headers_in(path, authority, &parts.headers, extra)
}

/// One call: a place, the request, then the response's head (its body
/// follows in the [`RecvBody`]). The deadline (the shorter of the call's
/// `grpc-timeout` and the endpoint's timeout, as tonic's `GrpcTimeout`;
/// only the former is sent) covers all of it, the body included.
///
/// In the common case (a place free, the request ready and within the
/// ring's room) the request is written here, when tonic calls the
/// channel, and the future returned is a [`Reply`]: a few words, boxed
/// and moved cheaply. A call that must wait (for a place, for room in the
/// ring, or for its body) does the rest in a future of its own.
fn call(inner: Arc<Inner>, req: http::Request<Body>) -> crate::call::ResponseFuture {
    let timeout = call_timeout(req.headers(), inner.opts.timeout);
    let deadline = timeout.map(|d| (tokio::time::Instant::now() + d).into_std());
    let sent = match admit(&inner.shared, deadline) {
        Ok(Admitted::Now(place)) => send(inner, req, place, deadline),
        Ok(Admitted::Queued(wait)) => {
            return Box::pin(async move {
                let place = wait_in_line(wait).await?;
                finish(send(inner, req, place, deadline)?).await
            });
        }
        Err(e) => Err(e),
    };
    match sent {
        Ok(Sent::Written(reply)) => Box::pin(reply),
        Ok(sent) => Box::pin(finish(sent)),
        Err(e) => Box::pin(std::future::ready(Err(e))),
    }
}

/// Where a call's request stands once [`send`] returns.
enum Sent {
    /// Written whole: the response's head is awaited.
    Written(Reply),
    /// Ready and within the call's window, but the ring has no room now:
    /// written within the call's deadline ([`finish`]).
    Blocked {
        reply: Reply,
        batch: Batch,
        /// Dropped once the request is written.
        body: Body,
    },
    /// Streamed by a task of its own within the call's window (client and
    /// bidi streaming, a request larger than the window), started on the
    /// first poll: the caller waits for the response meanwhile (and so
    /// receives the WINDOW_UPDATEs).
    Streaming {
        reply: Reply,
        flow: Arc<CallFlow>,
        batch: Batch,
        /// The rest of the body, if more will come.
        rest: Option<Body>,
    },
}

/// Opens the call in its `place` and writes its request if it can at once:
/// when the body is ready (unary, server streaming) and the call's window
/// and the ring's room cover it, the caller writes it itself (one ring
/// message, no task hop).
fn send(
    inner: Arc<Inner>,
    req: http::Request<Body>,
    place: Place,
    deadline: Option<Instant>,
) -> Result<Sent, BoxError> {
    // Refused if the connection closed, or the server is draining.
    let (id, flow) = {
        let mut t = lock(&inner.shared.table);
        let flow = t.flow(inner.shared.peer_window);
        let id = t.conn.open(Slot::new(flow.clone()), deadline)?;
        t.arm(deadline);
        (id, flow)
    };
    let (mut parts, mut body) = req.into_parts();
    let headers = request_headers(&mut parts, &inner.opts);
    let mut guard = CallGuard {
        id,
        inner,
        sender: None,
        done: false,
        permit: Some(place),
    };
    // A unary call's three frames (headers, data, end) fit inline.
    let mut batch = Batch::new();
    batch.push(Out::new(Kind::RequestHeaders, 0, id, headers));
    let writer = &guard.inner.writer;
    Ok(match drain_ready(&mut body, id, &mut batch, writer.chunk) {
        Drained::Complete if flow::try_take_batch(writer, &flow, &batch) => {
            match writer.try_send(&batch) {
                // The body and the request's head (its header map,
                // extensions, URI) are dropped here, while the server works.
                Ok(true) => Sent::Written(Reply(Some(guard))),
                Ok(false) => Sent::Blocked {
                    reply: Reply(Some(guard)),
                    batch,
                    body,
                },
                Err(e) => return Err(write_failed(&mut guard, &e)),
            }
        }
        d @ (Drained::Complete | Drained::More) => Sent::Streaming {
            reply: Reply(Some(guard)),
            flow,
            batch,
            rest: matches!(d, Drained::More).then_some(body),
        },
        Drained::Failed(status) => {
            // Nothing of the call reached the server.
            guard.unsent();
            return Err(Box::new(status));
        }
    })
}

/// The connection failed writing the call's request: it leaves the table.
fn write_failed(guard: &mut CallGuard, e: &Error) -> BoxError {
    guard.unsent();
    Box::new(Status::new(e.code(), format!("rrpc: {e}")))
}

/// The rest of a call that could not write its request at once ([`Sent`]).
async fn finish(sent: Sent) -> Result<http::Response<Body>, BoxError> {
    let reply = match sent {
        Sent::Written(reply) => reply,
        Sent::Blocked {
            mut reply,
            batch,
            body,
        } => {
            let Some(guard) = reply.0.as_mut() else {
                return Err(Box::new(Status::internal("rrpc: call already answered")));
            };
            // The deadline covers the write too: a ring the peer stopped
            // draining (a cut wire: its head never moves) would otherwise
            // hold the call until the connection is declared dead. A write
            // cut short leaves whole frames only; the guard then resets
            // the call on the server.
            let write = guard.inner.writer.send(batch);
            let written = until_expired(&guard.inner.shared, guard.id, write).await;
            match written {
                None => return Err(deadline_exceeded()),
                Some(Err(e)) => return Err(write_failed(guard, &e)),
                Some(Ok(())) => drop(body),
            }
            reply
        }
        Sent::Streaming {
            mut reply,
            flow,
            batch,
            rest,
        } => {
            if let Some(g) = reply.0.as_mut() {
                let (writer, shared) = (g.inner.writer.clone(), g.inner.shared.clone());
                let sender = send_request(writer, shared, flow, g.id, batch, rest);
                g.sender = Some(tokio::spawn(sender).abort_handle());
            }
            reply
        }
    };
    reply.await
}

/// A call whose request is on its way: resolves to the response's head
/// ([`response`]) when its first event comes. The state machine ends the
/// wait at the call's deadline: the first event is then its
/// DEADLINE_EXCEEDED. Dropped before, its guard cancels the call.
struct Reply(Option<CallGuard>);

impl std::future::Future for Reply {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(guard) = self.0.take() else {
            return Poll::Ready(Err(Box::new(Status::internal(
                "rrpc: call polled after it was answered",
            ))));
        };
        let Poll::Ready(first) = guard.inner.shared.poll_event(guard.id, cx, &mut None) else {
            self.0 = Some(guard);
            return Poll::Pending;
        };
        let slot = SlotRef {
            id: guard.id,
            shared: guard.inner.shared.clone(),
        };
        Poll::Ready(response(first, slot, guard))
    }
}

/// `fut` unless call `id`'s deadline passes first (`None`); `fut` is
/// polled first, and the deadline only looked at while it waits.
async fn until_expired<F: std::future::Future>(
    shared: &Shared,
    id: u32,
    fut: F,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        shared.poll_expired(id, cx).map(|()| None)
    })
    .await
}

/// A call's response stream: its slot, and its guard (dropped with the
/// body, the guard sends CANCEL if the call had not finished).
pub(crate) struct Response {
    slot: SlotRef,
    guard: Option<CallGuard>,
}

impl EventSource for Response {
    fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        update: &mut Option<u32>,
    ) -> Poll<Option<Event>> {
        self.slot.poll_event(cx, update)
    }

    fn finished(&mut self) {
        if let Some(g) = self.guard.as_mut() {
            g.finished();
        }
    }

    fn reset(&mut self) {
        self.guard = None;
    }
}

/// The response tonic gets from a call's first event: the server's HTTP
/// status and headers, as hyper would hand them to tonic (which maps a
/// non-200 status without grpc-status, e.g. a layer's 502, to the gRPC
/// code the spec gives it), and a body fed by the call's slot.
fn response(
    first: Option<Event>,
    slot: SlotRef,
    mut guard: CallGuard,
) -> Result<http::Response<Body>, BoxError> {
    // Made in place, not through `http::response::Builder` (whose
    // `Result`-wrapped parts are moved at each step).
    let head = |status: http::StatusCode, headers: http::HeaderMap, body: Body| {
        let mut res = http::Response::new(body);
        *res.status_mut() = status;
        *res.version_mut() = http::Version::HTTP_2;
        *res.headers_mut() = headers;
        Ok(res)
    };
    match first {
        Some(Event::Headers {
            status,
            headers,
            end,
        }) => {
            if end {
                guard.finished();
                return head(status, headers, Body::empty());
            }
            let credit = Credit::client(guard.inner.writer.clone(), slot.id);
            let body = RecvBody::response(
                Response {
                    slot,
                    guard: Some(guard),
                },
                credit,
            );
            head(status, headers, Body::new(body))
        }
        Some(Event::Trailers(t)) => {
            // Trailers-only response made by rrpc itself (a refusal).
            guard.finished();
            head(http::StatusCode::OK, t, Body::empty())
        }
        Some(Event::Reset(s)) => {
            guard.finished();
            Err(Box::new(s))
        }
        Some(Event::Data(_) | Event::Window(_)) => Err(Box::new(Status::internal(
            "rrpc: data before response headers",
        ))),
        None => {
            guard.finished();
            Err(Box::new(Status::unavailable("rrpc: connection lost")))
        }
    }
}

/// Streams a request within the call's window: `batch`, then the rest of
/// `body` if there is one (client and bidi streaming).
async fn send_request(
    writer: FrameWriter,
    shared: Arc<Shared>,
    flow: Arc<CallFlow>,
    id: u32,
    mut batch: Batch,
    body: Option<Body>,
) {
    let failed = |e: Error| {
        // The writer also fails the whole connection unless the frame was
        // too large (then only this call).
        let mut t = lock(&shared.table);
        let _ = shared.deliver(&mut t, id, Event::Reset(Status::from(e)));
    };
    let send =
        |batch: Batch| flow::send_within_window(&writer, &flow, batch, || shared.credit_wait());
    let Some(mut body) = body else {
        if let Err(e) = send(batch).await {
            failed(e);
        }
        return;
    };
    loop {
        if !batch.is_empty()
            && let Err(e) = send(std::mem::take(&mut batch)).await
        {
            return failed(e);
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data()
                    && !data.is_empty()
                {
                    batch.push(Out::new(Kind::Data, 0, id, data));
                }
            }
            None => {
                batch.push(Out::new(Kind::Data, END_STREAM, id, Bytes::new()));
                break;
            }
            Some(Err(status)) => {
                let mut t = lock(&shared.table);
                let _ = shared.deliver(&mut t, id, Event::Reset(status));
                drop(t);
                batch.push(Out::new(Kind::Cancel, 0, id, Bytes::new()));
                break;
            }
        }
        // Greedily batch what the body has ready now.
        match drain_ready(&mut body, id, &mut batch, writer.chunk) {
            Drained::More => {}
            Drained::Complete => break,
            Drained::Failed(status) => {
                let mut t = lock(&shared.table);
                let _ = shared.deliver(&mut t, id, Event::Reset(status));
                drop(t);
                batch.push(Out::new(Kind::Cancel, 0, id, Bytes::new()));
                break;
            }
        }
    }
    if let Err(e) = send(batch).await {
        failed(e);
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;
    use std::time::Duration;

    use super::*;
    use crate::conn::mem_pair;
    use crate::fast::testing::{channel, req, spawn_server};

    struct Count(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn counting() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    /// The call whose waker the in-flight receive holds leaves while another
    /// call still waits: the fallback reader is woken to take over. Anyone
    /// else leaving wakes nobody.
    #[test]
    fn handoff_wakes_the_fallback_only_when_the_receiver_leaves() {
        let mut t = Table::new(4096, 8);
        let (fb, fb_waker) = counting();
        let (_, w2) = counting();
        t.fallback = Some(fb_waker);
        let mut s2 = Slot::new(CallFlow::new(4096));
        s2.waker = Some(w2);
        assert_eq!(
            t.conn
                .open(Slot::new(CallFlow::new(4096)), None)
                .expect("open"),
            1
        );
        assert_eq!(t.conn.open(s2, None).expect("open"), 2);
        t.driver = Some(2);
        t.handoff(1);
        assert_eq!(fb.0.load(Ordering::SeqCst), 0, "1 was not receiving");
        assert_eq!(t.driver, Some(2));
        t.driver = Some(1);
        t.handoff(1);
        assert_eq!(fb.0.load(Ordering::SeqCst), 1, "2 waits: fallback woken");
        assert_eq!(t.driver, None);
        // With nobody waiting, a leaving receiver wakes nobody.
        t.conn.call_mut(2).expect("slot").io.waker = None;
        let (fb, fb_waker) = counting();
        t.fallback = Some(fb_waker);
        t.driver = Some(1);
        t.handoff(1);
        assert_eq!(fb.0.load(Ordering::SeqCst), 0);
    }

    /// A call that ends while a request sender holds its send credit and
    /// waits for more closes that credit (the sender gives up); a credit
    /// nobody else holds is kept, and the next call gets it renewed whole.
    #[tokio::test]
    async fn an_ended_calls_credit_is_closed_if_held_and_reused_if_not() {
        let shared = Shared {
            table: Mutex::new(Table::new(4096, 8)),
            peer_window: 100,
            retired: AtomicBool::new(false),
        };
        let flow = lock(&shared.table).flow(100);
        let id = lock(&shared.table)
            .conn
            .open(Slot::new(flow.clone()), None)
            .expect("open");
        assert!(flow.try_take(100));
        let waiting = tokio::spawn(async move { flow.take(1, 1).await });
        tokio::task::yield_now().await;
        shared.take(id);
        let gave_up = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting sender gave up")
            .expect("join");
        assert!(gave_up.is_err());

        let flow = lock(&shared.table).flow(100);
        assert!(flow.try_take(60));
        let kept = Arc::as_ptr(&flow);
        let id = lock(&shared.table)
            .conn
            .open(Slot::new(flow), None)
            .expect("open");
        shared.take(id);
        assert_eq!(lock(&shared.table).spare_flows.len(), 1, "kept");
        let next = lock(&shared.table).flow(100);
        assert_eq!(
            Arc::as_ptr(&next),
            kept,
            "the ended call's credit is reused"
        );
        assert!(next.try_take(100), "renewed whole");
    }

    /// The call that receives its own reply is not woken by it: it takes
    /// the event as its receive returns (a wake-up of its own task, a
    /// whole extra poll of it on a current-thread runtime, was wasted).
    #[tokio::test(flavor = "current_thread")]
    async fn the_receiving_call_does_not_wake_itself() {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let svc = tower::service_fn(|_r: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let cfg = RrpcConfig::default();
        spawn_server(spipe, svc, &cfg);
        let ch = channel(cpipe, &cfg);
        let mut c = ch.clone();
        // The request is written now; the server answers meanwhile.
        let fut = tower::Service::call(&mut c, req("/x"));
        let mut fut = std::pin::pin!(fut);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => assert!(r.is_ok(), "{:?}", r.err()),
            Poll::Pending => panic!("the reply was in the pipe"),
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "woke itself");
    }

    /// Calls finishing out of order on one connection all get their replies
    /// (the first one waits while the second receives and leaves).
    #[tokio::test(flavor = "current_thread")]
    async fn calls_finishing_out_of_order_all_complete() {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let gate = Arc::new(tokio::sync::Notify::new());
        let g = gate.clone();
        let svc = tower::service_fn(move |r: http::Request<Body>| {
            let g = g.clone();
            async move {
                if r.uri().path() == "/slow" {
                    g.notified().await;
                }
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
            }
        });
        let cfg = RrpcConfig::default();
        spawn_server(spipe, svc, &cfg);
        let ch = channel(cpipe, &cfg);
        let mut c1 = ch.clone();
        let slow = tokio::spawn(async move { tower::Service::call(&mut c1, req("/slow")).await });
        // The slow call writes its request and starts receiving.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        // The fast call takes over the receive (its waker) and leaves with its reply.
        let mut c2 = ch.clone();
        tower::Service::call(&mut c2, req("/fast"))
            .await
            .expect("fast call");
        gate.notify_one();
        let r = tokio::time::timeout(Duration::from_secs(10), slow)
            .await
            .expect("the slow call gets its reply after the receiving call left")
            .expect("task");
        assert!(r.is_ok(), "{:?}", r.err());
    }

    /// A client queues its calls beyond `max_concurrent_calls` instead of
    /// having the server refuse them, and runs them as places free up.
    #[tokio::test(flavor = "current_thread")]
    async fn calls_beyond_the_client_limit_wait_for_a_place() {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (g, st) = (gate.clone(), started.clone());
        let svc = tower::service_fn(move |_r: http::Request<Body>| {
            let (g, st) = (g.clone(), st.clone());
            async move {
                st.fetch_add(1, Ordering::SeqCst);
                g.acquire().await.expect("gate").forget();
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
            }
        });
        // The server would refuse a third call; the client never sends it early.
        let scfg = RrpcConfig::builder()
            .max_concurrent_calls(2)
            .build()
            .expect("limit");
        spawn_server(spipe, svc, &scfg);
        let ch = channel(cpipe, &scfg);
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let mut c = ch.clone();
            calls.spawn(async move { tower::Service::call(&mut c, req("/x")).await });
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(started.load(Ordering::SeqCst), 2, "two calls in flight");
        gate.add_permits(5);
        while let Some(r) = tokio::time::timeout(Duration::from_secs(5), calls.join_next())
            .await
            .expect("every call completes")
        {
            let res = r.expect("task").expect("call succeeds, not refused");
            assert!(res.headers().get("grpc-status").is_none_or(|s| s == "0"));
        }
        assert_eq!(started.load(Ordering::SeqCst), 5);
    }

    /// A channel to a server with one place for calls, whose handler
    /// answers once `gate` gives it a permit.
    fn one_gated_place() -> (FastChannel, Arc<tokio::sync::Semaphore>) {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let g = gate.clone();
        let svc = tower::service_fn(move |_r: http::Request<Body>| {
            let g = g.clone();
            async move {
                g.acquire().await.expect("gate").forget();
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
            }
        });
        let cfg = RrpcConfig::builder()
            .max_concurrent_calls(1)
            .build()
            .expect("limit");
        spawn_server(spipe, svc, &cfg);
        let ch = channel(cpipe, &cfg);
        (ch, gate)
    }

    /// A call's deadline covers its wait in line: a call queued behind a
    /// call that holds the only place fails with `DeadlineExceeded` at its
    /// deadline, leaves the line, and the place goes on serving.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_past_its_deadline_in_line_fails_with_deadline_exceeded() {
        let (ch, gate) = one_gated_place();
        let mut c1 = ch.clone();
        let first = tokio::spawn(async move { tower::Service::call(&mut c1, req("/x")).await });
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let places = || lock(&ch.inner.shared.table).conn.places();
        assert_eq!(places(), 1, "the first call holds the only place");
        let mut timed = req("/x");
        let timeout = http::HeaderValue::from_static("50m");
        timed.headers_mut().insert("grpc-timeout", timeout);
        let mut c2 = ch.clone();
        let r = tokio::time::timeout(Duration::from_secs(5), tower::Service::call(&mut c2, timed))
            .await
            .expect("the deadline ends the wait");
        let st = tonic::Status::from_error(r.expect_err("no place came"));
        assert_eq!(st.code(), tonic::Code::DeadlineExceeded, "{st:?}");
        assert_eq!(
            lock(&ch.inner.shared.table).conn.queued(),
            0,
            "it left the line"
        );
        gate.add_permits(1);
        let r = tokio::time::timeout(Duration::from_secs(5), first)
            .await
            .expect("completes")
            .expect("task");
        assert!(r.is_ok(), "{:?}", r.err());
    }

    /// The request is written when the channel is called, before its
    /// future is polled: a call whose future is dropped unpolled is
    /// cancelled on the server (which frees its place there) and gives its
    /// place back here, so that the next call is served.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_dropped_unpolled_is_cancelled_on_the_server() {
        let (ch, gate) = one_gated_place();
        let mut c = ch.clone();
        drop(tower::Service::call(&mut c, req("/x")));
        let places = || lock(&ch.inner.shared.table).conn.places();
        assert_eq!(places(), 0, "its place given back");
        // Let the server take the request and then its CANCEL.
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        // The server allows one call: it serves this one only if the
        // first was cancelled there.
        let mut c2 = ch.clone();
        let next = tokio::spawn(async move { tower::Service::call(&mut c2, req("/x")).await });
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        let r = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("completes")
            .expect("task");
        let res = r.expect("the next call was answered");
        // Not refused (a refusal is a trailers-only response).
        let status = res.headers().get("grpc-status");
        assert!(status.is_none_or(|s| s == "0"), "refused: {status:?}");
        assert_eq!(places(), 0, "all given back");
    }

    /// A call dropped while it waits in line leaves the line and takes no
    /// place: the next one in line gets the place, and every place is
    /// given back in the end.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_dropped_in_line_takes_no_place() {
        let (ch, gate) = one_gated_place();
        let call = |ch: &FastChannel| {
            let mut c = ch.clone();
            tokio::spawn(async move { tower::Service::call(&mut c, req("/x")).await })
        };
        let first = call(&ch);
        let dropped = call(&ch);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let line = || lock(&ch.inner.shared.table).conn.queued();
        assert_eq!(line(), 1, "the second call waits in line");
        dropped.abort();
        let _ = dropped.await;
        assert_eq!(line(), 0, "the dropped call left the line");
        let next = call(&ch);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(line(), 1);
        gate.add_permits(2);
        for c in [first, next] {
            let r = tokio::time::timeout(Duration::from_secs(5), c)
                .await
                .expect("completes")
                .expect("task");
            assert!(r.is_ok(), "{:?}", r.err());
        }
        assert_eq!(
            lock(&ch.inner.shared.table).conn.places(),
            0,
            "all given back"
        );
    }
}
