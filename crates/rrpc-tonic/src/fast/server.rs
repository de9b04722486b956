//! Fast-path server: dispatches frames to the router's `tower::Service`.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::body::Body;
use tower::ServiceExt;

use super::flow::{self, CallFlow, Credit, NoteRx, NoteTx};
use super::proto::server::{self as proto, CallKey, In, Note, Output};
use super::writer::{Batch, FrameWriter, Out};
use super::{Event, RecvBody};
use crate::conn::Pipe;
use crate::frame::{self, END_STREAM, FrameError, Kind};
use crate::{Error, RrpcConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the driver keeps of a call whose handler went on after its first
/// poll (the protocol state is in [`proto::Server`]).
struct Call {
    key: CallKey,
    body: Option<mpsc::UnboundedSender<Event>>,
    task: AbortHandle,
    flow: Arc<CallFlow>,
    /// Tells the call's task its deadline passed (calls with one only).
    expire: Option<oneshot::Sender<()>>,
}

/// A call's place in [`RrpcConfig::max_concurrent_calls`], as its task
/// holds it: [`Place::release`] tells the state machine, just before the
/// call's last frame is written (so that a client that saw the trailers
/// and opens its next call is never refused). A cancelled call or an
/// ended task frees its place in the state machine itself.
#[derive(Debug)]
struct Place {
    key: CallKey,
    notes: NoteTx,
    released: AtomicBool,
}

impl Place {
    fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.notes.send(Note::Released(self.key));
        }
    }
}

/// Serves one fast-path connection until the peer leaves, a protocol error,
/// or `shutdown` fires and every in-flight call has finished (graceful drain:
/// GOAWAY first, new calls answered `Unavailable`).
///
/// At most [`RrpcConfig::max_concurrent_calls`] calls are open at once;
/// the excess is refused at once with `Unavailable` (the status tonic gives
/// for HTTP/2's `REFUSED_STREAM`), before any handler runs.
///
/// Each call's request data is queued for its handler without ever
/// making this reader wait, bounded by [`RrpcConfig::call_window`]; each
/// response is sent within `peer_window`, the client's announced window
/// ([`flow`]).
///
/// This is the driver of [`proto::Server`], which holds the protocol
/// state (the call table, admission, draining, receive windows,
/// deadlines): it reads the ring, feeds the frames and its call tasks'
/// [`Note`]s in, and performs the outputs (module docs of
/// [`super::proto`]). Its own state, and what it does on each event, is a
/// [`ServerConn`]; this loop only waits for the next event.
pub(crate) async fn serve_conn<S, ResBody>(
    pipe: Pipe,
    svc: S,
    cfg: RrpcConfig,
    shutdown: CancellationToken,
    peer_window: u32,
    opts: FastOptions,
) -> Result<(), Error>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (tx, mut rx) = pipe;
    let writer = FrameWriter::new(tx, cfg.zero_copy(), cfg.max_chunk());
    let svc = layered(svc, opts);
    let start_call = run_call::<_, ResBody>;
    let mut conn = ServerConn::new(svc, start_call, writer, &cfg, peer_window, &opts);
    // The connection's one deadline timer, armed at the earliest deadline
    // of a call still open (`poll_timeout`), reset only when that changes:
    // calls without a deadline never touch it.
    let timer = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(timer);
    // Made once and raced on every message: a new cancellation future per
    // message would register (and remove) a waiter each time.
    let failed = conn.writer.failed_owned();
    tokio::pin!(failed);
    let shut = shutdown.clone().cancelled_owned();
    tokio::pin!(shut);
    let result = loop {
        // Notes sent meanwhile (a call polled inline sends one): applied
        // here, not by the `select!` below, which would drop and remake the
        // ring's receive future for each.
        conn.apply_notes();
        if conn.proto.is_drained() {
            break Ok(());
        }
        conn.arm(timer.as_mut());
        // The ring comes first in the `select!` below, so a peer that never
        // lets it go idle would starve the other branches: what they watch
        // is looked at here too, without polling a future (a shutdown, a
        // deadline passed; the notes above; a failed send after the message).
        let wake = if !conn.proto.is_draining() && shutdown.is_cancelled() {
            Wake::Shutdown
        } else if conn.is_due() {
            Wake::Timer
        } else {
            let mut sink = |msg: &[u8]| proto::decode(msg, &mut conn.inbox);
            tokio::select! {
                biased;
                // First: a message that is there already is read without
                // polling the other branches (two cancellation futures and a
                // channel: ~1 000 instructions a message, under callgrind).
                // Polled in place: no future per message; a wait another
                // branch interrupts resumes in the receiver at the next
                // turn.
                r = poll_fn(|cx| rx.poll_recv_with(cx, &mut sink)) => Wake::Received(r),
                note = poll_fn(|cx| conn.notes.poll_recv(cx)) => Wake::Note(note),
                () = &mut failed => Wake::Failed,
                // Disabled once draining: the completed future is never polled again.
                () = &mut shut, if !conn.proto.is_draining() => Wake::Shutdown,
                () = &mut timer, if conn.armed.is_some() => Wake::Timer,
            }
        };
        if let ControlFlow::Break(end) = conn.on_wake(wake).await {
            break end;
        }
    };
    conn.close(result)
}

/// What woke [`serve_conn`] up.
enum Wake {
    /// The ring's receive returned (`Ok(false)`: the peer left); the
    /// message's frames are in the inbox.
    Received(Result<bool, Error>),
    /// A call task sent a note.
    Note(Note),
    /// A send failed (the writer's failure).
    Failed,
    /// Shutdown was asked for.
    Shutdown,
    /// The deadline timer fired.
    Timer,
}

/// How a connection ends after `e`: a peer that left is an orderly end.
fn closing(e: Error) -> Result<(), Error> {
    if e.is_peer_gone() { Ok(()) } else { Err(e) }
}

/// The state machine's clock: tokio's (paused in tests), read only for a
/// call with a deadline.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// tonic's `Server` options on a connection's router: load shedding over
/// a per-connection concurrency limit, as tonic stacks them.
fn layered<S, ResBody>(
    svc: S,
    opts: FastOptions,
) -> impl tower::Service<
    http::Request<Body>,
    Response = http::Response<ResBody>,
    Error = BoxError,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static
where
    S: tower::Service<http::Request<Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
{
    tower::ServiceBuilder::new()
        .option_layer(opts.load_shed.then(tower::load_shed::LoadShedLayer::new))
        .option_layer(
            opts.concurrency_limit
                .map(tower::limit::ConcurrencyLimitLayer::new),
        )
        .map_err(boxed::<S::Error>)
        .service(svc)
}

/// One fast-path connection's driver: its state, and a method for each
/// event [`serve_conn`] waits for ([`Wake`], [`ServerConn::on_wake`]: a
/// message arrived, [`ServerConn::on_turn`]; a note from a call task,
/// [`ServerConn::apply_note`]; the deadline timer; shutdown,
/// [`ServerConn::on_shutdown`]; a failed send; and the end, orderly or
/// failed, [`ServerConn::close`]), as quinn's connection drivers are
/// shaped. The protocol state is [`proto::Server`]'s.
struct ServerConn<Svc, Mk, F> {
    /// The router, with tonic's per-connection layers.
    svc: Svc,
    /// What makes a call's future: [`run_call`] (a parameter so that the
    /// type of that future can be named, for `spare`).
    start_call: Mk,
    writer: FrameWriter,
    proto: proto::Server,
    /// The calls whose handler went on after its first poll (foldhash, as
    /// [`proto::Server`]'s table: a subset of it).
    calls: HashMap<u32, Call, foldhash::fast::RandomState>,
    notes_tx: NoteTx,
    notes: NoteRx,
    /// The frames of the message being handled, decoded.
    inbox: Vec<In>,
    /// The instant the deadline timer is set to, if it is armed.
    armed: Option<std::time::Instant>,
    /// The box of the last call that finished at its first poll, empty: the
    /// next call's future is written into it (one allocation less a call).
    spare: Option<Pin<Box<Option<F>>>>,
    /// The send credit of the last call that finished at its first poll,
    /// for the next call ([`CallFlow::renew`]).
    spare_flow: Option<Arc<CallFlow>>,
    /// Our receive window per call.
    call_window: u32,
}

impl<Svc, Mk, F> ServerConn<Svc, Mk, F>
where
    Svc: Clone,
    Mk: Fn(
        Svc,
        http::Request<Body>,
        FrameWriter,
        Place,
        Arc<CallFlow>,
        Option<oneshot::Receiver<()>>,
    ) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    fn new(
        svc: Svc,
        start_call: Mk,
        writer: FrameWriter,
        cfg: &RrpcConfig,
        peer_window: u32,
        opts: &FastOptions,
    ) -> Self {
        let max_calls = match opts.max_concurrent_streams {
            Some(m) => cfg.max_concurrent_calls().min(m as usize),
            None => cfg.max_concurrent_calls(),
        };
        let (notes_tx, notes) = flow::notes();
        ServerConn {
            svc,
            start_call,
            writer,
            proto: proto::Server::new(proto::Config {
                max_calls,
                recv_window: cfg.call_window(),
                peer_window,
                max_header_list: cfg.max_header_list_size(),
                timeout: opts.timeout,
            }),
            calls: HashMap::default(),
            notes_tx,
            notes,
            inbox: Vec::new(),
            armed: None,
            spare: None,
            spare_flow: None,
            call_window: cfg.call_window(),
        }
    }

    /// The driver's entry of the live call `key`.
    fn call_mut(&mut self, key: CallKey) -> Option<&mut Call> {
        self.calls.get_mut(&key.id).filter(|c| c.key == key)
    }

    /// A note from a call task; a finished task leaves the driver's table too.
    fn apply_note(&mut self, note: Note) {
        if let Note::Finished(key) = note
            && self.call_mut(key).is_some()
        {
            self.calls.remove(&key.id);
        }
        self.proto.handle_note(note);
    }

    /// Every note sent so far.
    fn apply_notes(&mut self) {
        while let Some(note) = self.notes.try_recv() {
            self.apply_note(note);
        }
    }

    /// Sets `timer` to the earliest deadline of a call still open, if that
    /// changed.
    fn arm(&mut self, timer: Pin<&mut tokio::time::Sleep>) {
        let next = self.proto.poll_timeout();
        if next != self.armed {
            if let Some(at) = next {
                timer.reset(tokio::time::Instant::from_std(at));
            }
            self.armed = next;
        }
    }

    /// Whether the armed deadline has passed (looked at without polling
    /// the timer).
    fn is_due(&self) -> bool {
        self.armed.is_some_and(|at| now() >= at)
    }

    /// Handles what woke the driver up, and says whether the connection
    /// goes on.
    async fn on_wake(&mut self, wake: Wake) -> ControlFlow<Result<(), Error>> {
        match wake {
            Wake::Received(r) => self.on_turn(r).await,
            Wake::Note(note) => {
                self.apply_note(note);
                ControlFlow::Continue(())
            }
            Wake::Failed => ControlFlow::Break(closing(send_failed(&self.writer))),
            Wake::Shutdown => match self.on_shutdown().await {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(Err(e)),
            },
            Wake::Timer => {
                // Expired calls come out of `on_turn` as `Output::Expire`.
                self.armed = None;
                self.proto.handle_timeout(now());
                self.on_turn(Ok(true)).await
            }
        }
    }

    /// Shutdown: GOAWAY goes out (once), and the connection drains.
    async fn on_shutdown(&mut self) -> Result<(), Error> {
        self.proto.start_drain();
        while let Some(out) = self.proto.poll_output() {
            if let Output::Send {
                kind,
                flags,
                id,
                payload,
                ..
            } = out
            {
                self.writer
                    .send(smallvec::smallvec![Out::new(kind, flags, id, payload)])
                    .await?;
            }
        }
        Ok(())
    }

    /// After each wake-up (`r`: what the ring's receive said, `Ok(true)`
    /// when there was no receive): handles the frames received, performs
    /// what the state machine says, and says whether the connection goes on.
    async fn on_turn(&mut self, r: Result<bool, Error>) -> ControlFlow<Result<(), Error>> {
        // What the call tasks did before this message was written (a
        // place freed just before a last frame) counts for its frames.
        self.apply_notes();
        let bad = self.proto.handle(self.inbox.drain(..), &mut now).err();
        let (fatal, grant_bad) = self.perform().await;
        if let Some(e) = bad.or(grant_bad) {
            return ControlFlow::Break(Err(Error::Protocol(e)));
        }
        // A send above (or by a handler polled inline) failed.
        if let Some(e) = fatal.or_else(|| self.writer.failure()) {
            return ControlFlow::Break(closing(e));
        }
        match r {
            Ok(true) => ControlFlow::Continue(()),
            Ok(false) => ControlFlow::Break(Ok(())),
            Err(e) => ControlFlow::Break(closing(e)),
        }
    }

    /// Performs the state machine's outputs. A failed send, or a grant
    /// beyond the window, ends the connection once all were looked at
    /// (returned); no call starts after either.
    async fn perform(&mut self) -> (Option<Error>, Option<FrameError>) {
        let (mut fatal, mut grant_bad) = (None, None);
        while let Some(out) = self.proto.poll_output() {
            match out {
                Output::Send {
                    kind,
                    flags,
                    id,
                    payload,
                    refusal,
                } => {
                    if fatal.is_some() {
                        continue;
                    }
                    if let Some(r) = &refusal {
                        tracing::debug!(call_id = id, ?r, "rrpc: call refused");
                    }
                    let out = smallvec::smallvec![Out::new(kind, flags, id, payload)];
                    if let Err(e) = self.writer.send(out).await {
                        fatal = Some(e);
                    }
                }
                Output::Data { key, data } => {
                    if let Some(b) = self.call_mut(key).and_then(|c| c.body.as_ref()) {
                        // Never waits: the call's window bounds its queue.
                        let _ = b.send(Event::Data(data));
                    }
                }
                Output::EndOfRequest { key } => {
                    if let Some(call) = self.call_mut(key) {
                        call.body = None;
                    }
                }
                Output::Grant { key, inc } => {
                    if let Some(Err(e)) = self.call_mut(key).map(|c| c.flow.granted(inc)) {
                        grant_bad.get_or_insert(e);
                    }
                }
                Output::Cancel { key } => self.cancel(key),
                Output::Expire { key } => {
                    if let Some(expire) = self.call_mut(key).and_then(|c| c.expire.take()) {
                        // The task answers DEADLINE_EXCEEDED if the call
                        // has not ended yet.
                        let _ = expire.send(());
                    }
                }
                Output::Start {
                    key,
                    head,
                    chunks,
                    end,
                    send_credit,
                    deadline,
                } => {
                    let (mut head, mut chunks) = (Some(head), Some(chunks));
                    if fatal.is_none() && grant_bad.is_none() {
                        // Synchronous, in one poll: the request and the
                        // call's future are built on the stack, not moved
                        // through this future's state.
                        let timed = deadline.is_some();
                        poll_fn(|cx| {
                            if let (Some(head), Some(chunks)) = (head.take(), chunks.take()) {
                                let (body, body_tx) = self.request_body(key, chunks, end);
                                let req = build_request(head, body);
                                self.start(cx, key, req, body_tx, send_credit, timed);
                            }
                            Poll::Ready(())
                        })
                        .await;
                    }
                }
            }
        }
        (fatal, grant_bad)
    }

    /// The client cancelled call `key`: its handler is dropped.
    fn cancel(&mut self, key: CallKey) {
        if self.call_mut(key).is_some()
            && let Some(call) = self.calls.remove(&key.id)
        {
            // Dropping the handler's future is how tonic sees cancellation.
            call.task.abort();
            call.flow.close();
        }
    }

    /// The request body of a call that starts, and the sender that feeds
    /// it if its request stream is still open.
    fn request_body(
        &self,
        key: CallKey,
        chunks: super::proto::Chunks,
        end: bool,
    ) -> (RecvBody, Option<mpsc::UnboundedSender<Event>>) {
        if end {
            return (RecvBody::ready(chunks), None);
        }
        let (btx, brx) = mpsc::unbounded_channel();
        let credit = Credit::server(
            self.writer.clone(),
            key,
            self.call_window,
            self.notes_tx.clone(),
        );
        (RecvBody::new(chunks, brx, credit), Some(btx))
    }

    /// Starts an admitted call: its first poll runs here, in the reader
    /// task, with the reader's `cx` (a unary handler usually finishes
    /// there, and its response is written without a task hop); a call
    /// still pending after it goes on in a task of its own.
    fn start(
        &mut self,
        cx: &mut std::task::Context<'_>,
        key: CallKey,
        req: http::Request<Body>,
        body: Option<mpsc::UnboundedSender<Event>>,
        send_credit: u32,
        timed: bool,
    ) {
        let mut flow = match self.spare_flow.take() {
            Some(f) => CallFlow::renew(f, send_credit),
            None => CallFlow::new(send_credit),
        };
        let place = Place {
            key,
            notes: self.notes_tx.clone(),
            released: AtomicBool::new(false),
        };
        // The deadline's timer is the connection's (above): this call only
        // hears when it passed.
        let (expire, expired) = if timed {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        // The call's future goes into the box the last call that finished
        // inline left (`Pin::set` writes it in place), or a new one: a call
        // that goes on takes its box with it.
        let mut fut = self.spare.take().unwrap_or_else(|| Box::pin(None));
        let (svc, w) = (self.svc.clone(), self.writer.clone());
        fut.set(Some((self.start_call)(
            svc,
            req,
            w,
            place,
            flow.clone(),
            expired,
        )));
        // The reader's own waker is lent for this one poll (a wake-up aimed
        // at it only makes the reader look at its ring again).
        let first = fut.as_mut().as_pin_mut().map(|f| f.poll(cx));
        if first.is_none_or(|p| p.is_ready()) {
            fut.set(None);
            self.spare = Some(fut);
            // The call's future held the other reference.
            if Arc::get_mut(&mut flow).is_some() {
                self.spare_flow = Some(flow);
            }
            self.proto.handle_note(Note::Finished(key));
            return;
        }
        let done = self.notes_tx.clone();
        let task = tokio::spawn(async move {
            if let Some(f) = fut.as_mut().as_pin_mut() {
                f.await;
            }
            done.send(Note::Finished(key));
        });
        let task = task.abort_handle();
        let call = Call {
            key,
            body,
            task,
            flow,
            expire,
        };
        self.calls.insert(key.id, call);
    }

    /// The connection ends with `result`: every call still open is reset
    /// and its task dropped.
    fn close(mut self, result: Result<(), Error>) -> Result<(), Error> {
        if let Err(e) = &result {
            tracing::warn!("rrpc: closing fast-path connection: {e}");
        }
        for (_, c) in self.calls.drain() {
            if let Some(b) = c.body {
                let _ = b.send(Event::Reset(Status::cancelled("rrpc: connection lost")));
            }
            c.flow.close();
            c.task.abort();
        }
        result
    }
}

/// A service error as tonic's `BoxError` (so tower's optional layers agree).
fn boxed<E: Into<BoxError>>(e: E) -> BoxError {
    e.into()
}

/// The connection's error after a failed send ([`FrameWriter`] docs).
fn send_failed(writer: &FrameWriter) -> Error {
    writer.failure().unwrap_or(Error::Closed("send failed"))
}

/// The request as hyper's HTTP/2 server would hand it to the service: with
/// `http` scheme and the client's authority when it sent one.
fn build_request(head: frame::RequestHead, body: RecvBody) -> http::Request<Body> {
    let mut req = http::Request::new(Body::new(body));
    *req.method_mut() = http::Method::POST;
    *req.version_mut() = http::Version::HTTP_2;
    *req.uri_mut() = match head.authority {
        Some(authority) => {
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(http::uri::Scheme::HTTP);
            parts.authority = Some(authority);
            parts.path_and_query = Some(head.path.clone());
            http::Uri::from_parts(parts).unwrap_or_else(|_| http::Uri::from(head.path))
        }
        None => http::Uri::from(head.path),
    };
    *req.headers_mut() = head.headers;
    req
}

/// hyper's `date` response header (RFC 9110 §6.6.1), unless the service
/// set one: formatted once a second per thread. Encoded after the map's
/// entries ([`frame::Extra`]), not inserted into it.
fn date(headers: &http::HeaderMap) -> Option<http::HeaderValue> {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, Option<http::HeaderValue>)> = const { RefCell::new((0, None)) };
    }
    if headers.contains_key(http::header::DATE) {
        return None;
    }
    let now = SystemTime::now();
    let sec = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != sec || c.1.is_none() {
            *c = (
                sec,
                http::HeaderValue::from_str(&httpdate::fmt_http_date(now)).ok(),
            );
        }
        c.1.clone()
    })
}

fn trailers_only(id: u32, status: Status) -> Out {
    let (kind, flags, payload) = proto::trailers_only(status);
    Out::new(kind, flags, id, payload)
}

/// Runs one call: the router's future, then its response, with a panic in
/// either caught here so that it fails only this call, and all of it
/// bounded by the call's deadline (`expired`: `DEADLINE_EXCEEDED`).
///
/// A panicking handler ends its call with `Cancelled`, the status tonic's
/// own transport gives (hyper drops the panicked stream, h2 resets it with
/// CANCEL, tonic maps that to `Cancelled`); the panic is logged.
async fn run_call<S, ResBody>(
    svc: S,
    req: http::Request<Body>,
    writer: FrameWriter,
    place: Place,
    flow: Arc<CallFlow>,
    expired: Option<oneshot::Receiver<()>>,
) where
    S: tower::Service<http::Request<Body>, Response = http::Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let id = place.key.id;
    // For the log of a panic only: a reference count, not a copy of the
    // path (an allocation a call).
    let path = req.uri().path_and_query().cloned();
    let (w, p) = (writer.clone(), &place);
    let work = async move {
        let res = svc.oneshot(req).await.map_err(Into::into);
        send_response(res, id, &w, p, &flow).await
    };
    // The handler's state is dropped right after a panic and never observed
    // again, so unwind safety is not a concern.
    let work = AssertUnwindSafe(work).catch_unwind();
    // gRPC's rule: the deadline (the shorter of the caller's and
    // `Server::timeout`) covers the whole call, its response body
    // included; tonic's own server bounds only the handler. The state
    // machine times it; `expired` fires when it passed (a dropped sender
    // means the call ends anyway: ignored). The call is polled first, as
    // `timeout_at` does; past its deadline it is dropped (a response cut
    // short has whole frames only) and DEADLINE_EXCEEDED ends it.
    // A call with no deadline pays nothing for it: the race is boxed, so
    // this future stays the size of `work` (a race held inline grew every
    // call's future, and the copies of it, by ~800 instructions a call).
    let caught = match expired {
        Some(expired) => {
            Box::pin(async {
                tokio::select! {
                    biased;
                    r = work => r,
                    Ok(()) = expired => {
                        place.release();
                        let st = crate::call::deadline_exceeded();
                        Ok(writer.send(smallvec::smallvec![trailers_only(id, st)]).await)
                    }
                }
            })
            .await
        }
        None => work.await,
    };
    let r = match caught {
        Ok(r) => r,
        Err(panic) => {
            tracing::error!(
                call_id = id,
                path = path.as_ref().map_or("/", |p| p.path()),
                "rrpc: handler panicked: {}",
                panic_message(&*panic)
            );
            place.release();
            writer
                .send(smallvec::smallvec![trailers_only(
                    id,
                    Status::cancelled("rrpc: the handler panicked"),
                )])
                .await
        }
    };
    match r {
        Ok(()) => {}
        // One frame too large for a ring message (huge metadata): this
        // call's error, not the connection's.
        Err(Error::MessageTooLarge { len, max }) => {
            let st = Status::internal(format!(
                "rrpc: response frame of {len} bytes exceeds the ring's {max}"
            ));
            place.release();
            if let Err(e) = writer
                .send(smallvec::smallvec![trailers_only(id, st)])
                .await
            {
                tracing::debug!(call_id = id, "rrpc: connection failed: {e}");
            }
        }
        // Any other send error failed the whole connection: the writer
        // logged it and `serve_conn` closes the connection and its calls.
        Err(e) => tracing::debug!(call_id = id, "rrpc: connection failed: {e}"),
    }
}

/// Sends a response batch within the call's window (the server's reader
/// always runs, so nothing else must be told while it waits).
async fn send(writer: &FrameWriter, flow: &CallFlow, batch: Batch) -> Result<(), Error> {
    flow::send_within_window(writer, flow, batch, || ()).await
}

/// The message of a caught panic, when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

async fn send_response<ResBody>(
    res: Result<http::Response<ResBody>, BoxError>,
    id: u32,
    writer: &FrameWriter,
    permit: &Place,
    flow: &CallFlow,
) -> Result<(), Error>
where
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let resp = match res {
        Ok(r) => r,
        Err(e) => {
            permit.release();
            return writer
                .send(smallvec::smallvec![trailers_only(
                    id,
                    Status::from_error(e)
                )])
                .await;
        }
    };
    let (parts, body) = resp.into_parts();
    let date = date(&parts.headers);
    let extra = date.as_ref().map(|v| (&http::header::DATE, v));
    let mut body = std::pin::pin!(body.map_err(Into::<BoxError>::into));
    if http_body::Body::is_end_stream(&*body) {
        // Trailers-only response (what tonic returns for a handler error,
        // or a layer's bare HTTP error): headers with the status, ended.
        permit.release();
        return writer
            .send(smallvec::smallvec![Out::new(
                Kind::ResponseHeaders,
                END_STREAM,
                id,
                frame::response_headers_in(parts.status, &parts.headers, extra),
            )])
            .await;
    }
    // A unary response's three frames (headers, data, trailers) fit inline.
    let mut batch = Batch::new();
    batch.push(Out::new(
        Kind::ResponseHeaders,
        0,
        id,
        frame::response_headers_in(parts.status, &parts.headers, extra),
    ));
    // Frames the body has ready go out together, up to about one chunk of
    // data (a body that is always ready must not be drained into memory).
    let mut batched = 0usize;
    loop {
        let next = if batch.is_empty() {
            batched = 0;
            Some(body.frame().await)
        } else if batched >= writer.chunk {
            None
        } else {
            body.frame().now_or_never()
        };
        match next {
            None => send(writer, flow, std::mem::take(&mut batch)).await?,
            Some(Some(Ok(f))) => match f.into_data() {
                Ok(d) => {
                    if !d.is_empty() {
                        batched += d.len();
                        batch.push(Out::new(Kind::Data, 0, id, d));
                    }
                }
                Err(f) => {
                    let t = f.into_trailers().unwrap_or_default();
                    batch.push(Out::new(
                        Kind::Trailers,
                        END_STREAM,
                        id,
                        frame::metadata_in(&t),
                    ));
                    permit.release();
                    return send(writer, flow, batch).await;
                }
            },
            Some(None) => {
                // Body ended without trailers: send empty trailers; the client reports the missing status.
                batch.push(Out::new(
                    Kind::Trailers,
                    END_STREAM,
                    id,
                    frame::metadata_in(&http::HeaderMap::new()),
                ));
                permit.release();
                return send(writer, flow, batch).await;
            }
            Some(Some(Err(e))) => {
                batch.push(trailers_only(id, Status::from_error(e)));
                permit.release();
                return send(writer, flow, batch).await;
            }
        }
    }
}

/// The server options that apply to fast-path connections.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FastOptions {
    /// Upper bound on every call's deadline (tonic's `Server::timeout`).
    pub(crate) timeout: Option<std::time::Duration>,
    /// Handlers running at once per connection; more wait (or are shed).
    pub(crate) concurrency_limit: Option<usize>,
    /// Refuse calls beyond `concurrency_limit` at once (`ResourceExhausted`).
    pub(crate) load_shed: bool,
    /// Caps `RrpcConfig::max_concurrent_calls` on the server.
    pub(crate) max_concurrent_streams: Option<u32>,
    /// Drains a connection (GOAWAY, in-flight calls finish) at this age.
    pub(crate) max_connection_age: Option<std::time::Duration>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::conn::mem_pair;
    use crate::fast::testing::{breakable, channel, req, spawn_server};

    /// `serve_conn` returns within 5 s, with an error that says `what`.
    async fn closes_with(server: tokio::task::JoinHandle<Result<(), Error>>, what: &str) {
        let end = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve_conn returns at once")
            .expect("task");
        let e = end.expect_err("serve_conn reports why it closed");
        assert!(e.to_string().contains(what), "{e}");
    }

    /// A response the server cannot send (its send ring corrupted by the peer)
    /// fails and closes the connection: `serve_conn` returns the error and the
    /// caller gets an error instead of hanging.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_response_send_closes_the_connection() {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let (spipe, _) = breakable(spipe, true);
        let svc = tower::service_fn(|_r: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let cfg = RrpcConfig::default();
        let server = spawn_server(spipe, svc, &cfg);
        let mut ch = channel(cpipe, &cfg);
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            tower::Service::call(&mut ch, req("/x.Y/Z")),
        )
        .await
        .expect("the call fails promptly instead of hanging");
        assert!(r.is_err(), "no response could be sent");
        closes_with(server, "corrupt").await;
    }

    /// A send that fails on the client fails every call of the connection
    /// (also one already waiting for its reply), and new calls.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_request_send_fails_every_call() {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let (cpipe, broken) = breakable(cpipe, false);
        // `/never` never answers.
        let svc = tower::service_fn(|r: http::Request<Body>| async move {
            if r.uri().path() == "/never" {
                std::future::pending::<()>().await;
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let cfg = RrpcConfig::default();
        spawn_server(spipe, svc, &cfg);
        let ch = channel(cpipe, &cfg);
        let mut c1 = ch.clone();
        let waiting =
            tokio::spawn(async move { tower::Service::call(&mut c1, req("/never")).await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        broken.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut c2 = ch.clone();
        assert!(tower::Service::call(&mut c2, req("/x")).await.is_err());
        let r = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting call fails promptly")
            .expect("task");
        // The ring the peer corrupted is `DataLoss` (the ring's typed
        // error, kept through the writer and the demux), on the call that
        // waited, and on a call made afterwards. Before, every failure
        // read `Unavailable`.
        let st = tonic::Status::from_error(r.expect_err("connection failed"));
        assert_eq!(st.code(), tonic::Code::DataLoss, "{st:?}");
        assert!(st.message().contains("corrupt"), "{st:?}");
        let mut c3 = ch.clone();
        let st = tonic::Status::from_error(
            tower::Service::call(&mut c3, req("/x"))
                .await
                .expect_err("the connection failed"),
        );
        assert_eq!(st.code(), tonic::Code::DataLoss, "{st:?}");
    }

    /// A receive ring the server corrupted fails the call that was
    /// waiting on it and every later call of the connection with
    /// `DataLoss` (the ring's typed error, through the demux's one
    /// mapping), not `Unavailable`.
    #[tokio::test(flavor = "current_thread")]
    async fn a_corrupt_receive_ring_fails_every_call_with_data_loss() {
        let (cpipe, spipe) = mem_pair(1 << 16);
        let (cpipe, _broken) = crate::fast::testing::breakable_rx(cpipe, true);
        let svc = tower::service_fn(|_: http::Request<Body>| async move {
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let cfg = RrpcConfig::default();
        spawn_server(spipe, svc, &cfg);
        let ch = channel(cpipe, &cfg);
        let mut c1 = ch.clone();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            tower::Service::call(&mut c1, req("/never")),
        )
        .await
        .expect("the call fails promptly instead of hanging");
        let st = tonic::Status::from_error(r.expect_err("the receive failed"));
        assert_eq!(st.code(), tonic::Code::DataLoss, "{st:?}");
        assert!(st.message().contains("corrupt"), "{st:?}");
        let mut c2 = ch.clone();
        let st = tonic::Status::from_error(
            tower::Service::call(&mut c2, req("/x"))
                .await
                .expect_err("the connection failed"),
        );
        assert_eq!(st.code(), tonic::Code::DataLoss, "{st:?}");
    }

    /// Sends `frames` as one message on a raw pipe half.
    async fn raw_send(tx: &mut crate::conn::Link, frames: &[(Kind, u8, u32, Vec<u8>)]) {
        let mut msg = Vec::new();
        for (k, f, id, p) in frames {
            frame::push_frame(&mut msg, *k, *f, *id, p);
        }
        let mut fill = |slot: &mut [u8]| slot.copy_from_slice(&msg);
        tx.send_with(msg.len(), &mut fill).await.expect("raw send");
    }

    /// Reads TRAILERS frames until `want` arrived: (call id, status).
    async fn refusals(
        crx: &mut Box<dyn crate::conn::MsgRx>,
        want: usize,
    ) -> Vec<(u32, tonic::Code)> {
        let mut got: Vec<(u32, tonic::Code)> = Vec::new();
        while got.len() < want {
            let mut sink = |m: &[u8]| {
                for f in frame::frames(m) {
                    let f = f.expect("valid frame");
                    assert_eq!(f.kind, Kind::Trailers);
                    let t = frame::parse_metadata(f.payload).expect("trailers");
                    let code: i32 = t["grpc-status"]
                        .to_str()
                        .expect("ascii")
                        .parse()
                        .expect("a number");
                    got.push((f.call_id, tonic::Code::from(code)));
                }
            };
            assert!(crx.recv_with(&mut sink).await.expect("recv"));
        }
        got
    }

    /// The frames of call `id` the server sends, until the one that ends it.
    async fn frames_of(crx: &mut Box<dyn crate::conn::MsgRx>, id: u32) -> Vec<(Kind, Vec<u8>)> {
        let mut got = Vec::new();
        let mut ended = false;
        while !ended {
            let mut sink = |m: &[u8]| {
                for f in frame::frames(m) {
                    let f = f.expect("valid frame");
                    if f.call_id == id {
                        ended |= f.end_stream();
                        got.push((f.kind, f.payload.to_vec()));
                    }
                }
            };
            assert!(crx.recv_with(&mut sink).await.expect("recv"));
        }
        got
    }

    /// gRPC's rule on the server too: a response body still open at its
    /// call's deadline is ended there, with TRAILERS that say
    /// `DEADLINE_EXCEEDED` after the response's headers (tonic's own
    /// server bounds only the handler), and the call's place is free for
    /// the next call.
    #[tokio::test(flavor = "current_thread")]
    async fn a_response_body_past_its_deadline_ends_with_deadline_exceeded() {
        let ((mut ctx, mut crx), spipe) = mem_pair(1 << 20);
        let started = Arc::new(tokio::sync::Notify::new());
        let st = started.clone();
        // A response whose body never yields a frame.
        let svc = tower::service_fn(move |_r: http::Request<Body>| {
            st.notify_one();
            async {
                let frames = futures_util::stream::pending::<
                    Result<http_body::Frame<Bytes>, std::convert::Infallible>,
                >();
                let body = Body::new(http_body_util::StreamBody::new(frames));
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            }
        });
        let cfg = RrpcConfig::builder()
            .max_concurrent_calls(1)
            .build()
            .expect("limit");
        spawn_server(spipe, svc, &cfg);
        let open = |id: u32, timeout: Option<&str>| {
            let mut h = http::HeaderMap::new();
            if let Some(t) = timeout {
                h.insert("grpc-timeout", t.parse().expect("ascii"));
            }
            let head = frame::request_headers_payload("/x.Y/Z", "", &h);
            (Kind::RequestHeaders, END_STREAM, id, head)
        };
        raw_send(&mut ctx, &[open(1, Some("100m"))]).await;
        let got = tokio::time::timeout(Duration::from_secs(5), frames_of(&mut crx, 1))
            .await
            .expect("the server ends the call at its deadline");
        let kinds: Vec<Kind> = got.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, [Kind::ResponseHeaders, Kind::Trailers], "{got:?}");
        let t = frame::parse_metadata(&got[1].1).expect("trailers");
        let st = Status::from_header_map(&t).expect("a status");
        assert_eq!(st.code(), tonic::Code::DeadlineExceeded, "{st:?}");
        started.notified().await;
        // One place only: a call still holding it would refuse this one.
        raw_send(&mut ctx, &[open(3, None)]).await;
        tokio::time::timeout(Duration::from_secs(5), started.notified())
            .await
            .expect("the expired call's place is free: the next call starts");
    }

    /// A client that sends a call more DATA than the window the server
    /// announced breaks the protocol: the connection is closed with a
    /// protocol error, not buffered without bound.
    #[tokio::test(flavor = "current_thread")]
    async fn data_beyond_the_call_window_closes_the_connection() {
        let ((mut ctx, _crx), spipe) = mem_pair(1 << 20);
        // A handler that never reads its request.
        let svc = tower::service_fn(|_r: http::Request<Body>| async {
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let cfg = RrpcConfig::builder()
            .call_window(4096)
            .build()
            .expect("window");
        let server = tokio::spawn(serve_conn(
            spipe,
            svc,
            cfg,
            CancellationToken::new(),
            4096,
            Default::default(),
        ));
        let open = (
            Kind::RequestHeaders,
            0,
            1,
            frame::request_headers_payload("/x.Y/Z", "", &http::HeaderMap::new()),
        );
        raw_send(&mut ctx, &[open]).await;
        // 4096 bytes of window: 3 frames of 1100 + 12 fit, a fourth does not.
        for _ in 0..3 {
            raw_send(&mut ctx, &[(Kind::Data, 0, 1, vec![7u8; 1100])]).await;
        }
        tokio::task::yield_now().await;
        assert!(!server.is_finished(), "within the window");
        raw_send(&mut ctx, &[(Kind::Data, 0, 1, vec![7u8; 1100])]).await;
        closes_with(server, "flow-control window").await;
    }

    /// A peer opening calls without ever ending them cannot make the server
    /// hold unbounded memory: it gets at most `max_concurrent_calls` handlers
    /// running; the excess is refused at once with `Unavailable`, and a
    /// cancelled call frees its place.
    #[tokio::test(flavor = "current_thread")]
    async fn calls_beyond_the_limit_are_refused() {
        const LIMIT: usize = 8;
        const OPENED: u32 = 50;
        let ((mut ctx, mut crx), spipe) = mem_pair(1 << 20);
        let started = Arc::new(AtomicUsize::new(0));
        let st = started.clone();
        let svc = tower::service_fn(move |_r: http::Request<Body>| {
            st.fetch_add(1, Ordering::SeqCst);
            async {
                std::future::pending::<()>().await;
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
            }
        });
        let cfg = RrpcConfig::builder()
            .max_concurrent_calls(LIMIT)
            .build()
            .expect("limit");
        let w = cfg.call_window();
        tokio::spawn(serve_conn(
            spipe,
            svc,
            cfg,
            CancellationToken::new(),
            w,
            Default::default(),
        ));
        let open = |id: u32| {
            (
                Kind::RequestHeaders,
                0,
                id,
                frame::request_headers_payload("/x.Y/Z", "", &http::HeaderMap::new()),
            )
        };
        // Half in one message, half one call per message.
        let batch: Vec<_> = (1..=OPENED / 2).map(open).collect();
        raw_send(&mut ctx, &batch).await;
        for id in OPENED / 2 + 1..=OPENED {
            raw_send(&mut ctx, &[open(id)]).await;
        }
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            refusals(&mut crx, (OPENED as usize) - LIMIT),
        )
        .await
        .expect("the excess calls are refused at once");
        assert!(
            got.iter().all(|(_, c)| *c == tonic::Code::Unavailable),
            "{got:?}"
        );
        assert_eq!(started.load(Ordering::SeqCst), LIMIT, "handlers running");
        // Cancel an accepted call: its place goes to the next call.
        let accepted = (1..=OPENED)
            .find(|id| got.iter().all(|(r, _)| r != id))
            .expect("an accepted call");
        raw_send(&mut ctx, &[(Kind::Cancel, 0, accepted, Vec::new())]).await;
        raw_send(&mut ctx, &[open(OPENED + 1)]).await;
        raw_send(&mut ctx, &[open(OPENED + 2)]).await;
        let got = tokio::time::timeout(Duration::from_secs(5), refusals(&mut crx, 1))
            .await
            .expect("the call over the limit is refused");
        assert_eq!(got, vec![(OPENED + 2, tonic::Code::Unavailable)]);
        assert_eq!(started.load(Ordering::SeqCst), LIMIT + 1);
    }
}
