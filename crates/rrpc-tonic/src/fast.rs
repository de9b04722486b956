//! The h2-free fast path: tonic calls as compact [frames](crate::frame) on the rings.
//!
//! The generated client only needs a `GrpcService<Body>` and the generated
//! server is a `tower::Service<http::Request<Body>>`, so the HTTP/2 framing
//! and HPACK in between can be replaced by our own frames: the client side
//! ([`client`]) multiplexes calls by call id over one connection, the server
//! side ([`server`]) hands each call to the router: its first poll runs in
//! the connection's reader task (a unary handler usually finishes there and
//! its response is written without a task hop), and a call still pending
//! after it continues in a task of its own.
//! The gRPC body bytes (5-byte length prefix + message, compressed or not)
//! travel unchanged, so tonic's codec, compression and size limits behave
//! exactly as over HTTP/2.
//!
//! The protocol itself (the call tables, the server's admission, draining
//! and deadlines, GOAWAY, receive windows) is a sans-IO state machine per
//! side, [`proto`]; [`server`] and [`client`] drive them (module docs of
//! [`proto`]: what each side owns).
//!
//! Failure containment on one connection:
//! * a handler (or its response body) that panics fails only its own call,
//!   with `Cancelled` as tonic over TCP reports it; the panic is logged;
//! * a send that fails on the ring (peer corrupted it, or left) fails the
//!   whole connection: logged at warn, every call on it gets an error, the
//!   server's connection task returns the error ([`writer::FrameWriter`]);
//! * a call past its deadline ends there on both ends, its response body
//!   included, with `DeadlineExceeded` (gRPC's rule, [the crate docs](crate#deadlines)):
//!   the client fails it and resets it, the server drops it and frees its place;
//! * at most [`RrpcConfig::max_concurrent_calls`](crate::RrpcConfig::max_concurrent_calls)
//!   calls are open at once: a server refuses the excess with `Unavailable`,
//!   a client queues its own excess until a call finishes;
//! * every call has its own flow-control window in each direction
//!   ([`flow`], [`RrpcConfig::call_window`](crate::RrpcConfig::call_window)):
//!   a call whose consumer stops reading stalls only itself, never the
//!   connection's reader or other calls; a peer that sends beyond a window
//!   loses the connection (`Internal`, protocol violation).

use bytes::Bytes;
use http_body::Frame;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tonic::Status;

pub(crate) mod client;
pub(crate) mod flow;
pub(crate) mod proto;
pub(crate) mod server;
pub(crate) mod writer;

pub(crate) use proto::Event;

/// Where a [`RecvBody`] gets its events from after its queued ones: the
/// server connection's reader ([`Incoming`]), or the client's per-call
/// slot (`client::Response`, which also holds the call's guard). A trait
/// here, implemented by each side, so that this module names nothing of
/// either side (no import circle) and the body stays monomorphic.
pub(crate) trait EventSource: Send + Unpin + 'static {
    /// The next event, or `None` when the source ended. `update`: a window
    /// update the source asks to send for bytes it already handed out.
    fn poll_event(&mut self, cx: &mut Context<'_>, update: &mut Option<u32>)
    -> Poll<Option<Event>>;

    /// The call ended with its trailers (the client's guard says so).
    fn finished(&mut self) {}

    /// The call was reset: give its place back now (the client's guard,
    /// which resets the call on the server if its deadline passed).
    fn reset(&mut self) {}
}

/// The server's request stream after its queued chunks.
pub(crate) enum Incoming {
    /// Nothing more: the stream ended (request complete on arrival).
    Ended,
    /// A channel fed by the server connection's reader task (bounded in
    /// bytes by the call's flow-control window, not in events).
    Chan(mpsc::UnboundedReceiver<Event>),
}

impl EventSource for Incoming {
    fn poll_event(&mut self, cx: &mut Context<'_>, _: &mut Option<u32>) -> Poll<Option<Event>> {
        match self {
            Incoming::Ended => Poll::Ready(None),
            Incoming::Chan(rx) => rx.poll_recv(cx),
        }
    }
}

/// A body fed by the connection's receive side.
///
/// On the server (`eos_ok`), the source ending means end of the request
/// stream. On the client, the call must end with trailers; a source that
/// ends without them is a lost connection (`Unavailable`).
pub(crate) struct RecvBody<S = Incoming> {
    /// Request data that came with the call's headers (server).
    queued: proto::Chunks,
    src: S,
    done: bool,
    eos_ok: bool,
    /// Hands the bytes the application read back to the peer.
    ///
    /// Client: the call's deadline covers the response body too (a gRPC
    /// deadline bounds the whole call): the connection's state machine
    /// expires the call, and the body reads its `DEADLINE_EXCEEDED` as the
    /// call's next event. Without it a response whose headers came before
    /// the wire was cut waited for the connection to be declared dead (seen
    /// across hosts: 5.7 s and 9.6 s on a 3 s deadline, once 40 s).
    credit: Option<flow::Credit>,
}

impl<S> std::fmt::Debug for RecvBody<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBody")
            .field("done", &self.done)
            .finish()
    }
}

impl RecvBody<Incoming> {
    /// Server: `queued` chunks, then more from `rx` until it closes.
    pub(crate) fn new(
        queued: proto::Chunks,
        rx: mpsc::UnboundedReceiver<Event>,
        credit: flow::Credit,
    ) -> Self {
        RecvBody {
            queued,
            src: Incoming::Chan(rx),
            done: false,
            eos_ok: true,
            credit: Some(credit),
        }
    }
    /// Server: a request stream that was complete on arrival.
    pub(crate) fn ready(queued: proto::Chunks) -> Self {
        RecvBody {
            queued,
            src: Incoming::Ended,
            done: false,
            eos_ok: true,
            credit: None,
        }
    }
}

impl<S: EventSource> RecvBody<S> {
    /// Client: the response stream of one call, from `src`.
    pub(crate) fn response(src: S, credit: flow::Credit) -> Self {
        RecvBody {
            queued: proto::Chunks::default(),
            src,
            done: false,
            eos_ok: false,
            credit: Some(credit),
        }
    }
    fn finish(&mut self) {
        self.done = true;
        self.src.finished();
    }
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        if let Some(b) = self.queued.pop_front() {
            return Poll::Ready(Some(Event::Data(b)));
        }
        let mut update = None;
        let r = self.src.poll_event(cx, &mut update);
        if let (Some(inc), Some(c)) = (update, &self.credit) {
            c.send_update(inc);
        }
        r
    }
}

impl<S: EventSource> http_body::Body for RecvBody<S> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.poll_event(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Event::Data(b))) => {
                if let Some(c) = &mut self.credit {
                    c.consumed(b.len());
                }
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            // Never queued (the reader applies it); ignore if it were.
            Poll::Ready(Some(Event::Window(_))) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Event::Trailers(t))) => {
                self.finish();
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Some(Event::Headers { .. })) => {
                self.finish();
                Poll::Ready(Some(Err(Status::internal(
                    "rrpc: duplicate response headers",
                ))))
            }
            Poll::Ready(Some(Event::Reset(s))) => {
                // The guard, dropped now, gives the call's place back, and
                // resets the call on the server if the state machine says
                // so (its deadline passed: gRPC's `DEADLINE_EXCEEDED`).
                self.done = true;
                self.src.reset();
                Poll::Ready(Some(Err(s)))
            }
            Poll::Ready(None) => {
                self.done = true;
                if self.eos_ok {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(Status::unavailable(
                        "rrpc: connection lost before trailers",
                    ))))
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderMap;

    use super::proto::parse_grpc_timeout;

    #[test]
    fn grpc_timeout_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_grpc_timeout(&h), None);
        h.insert("grpc-timeout", "150m".parse().unwrap());
        assert_eq!(parse_grpc_timeout(&h), Some(Duration::from_millis(150)));
        h.insert("grpc-timeout", "3S".parse().unwrap());
        assert_eq!(parse_grpc_timeout(&h), Some(Duration::from_secs(3)));
        h.insert("grpc-timeout", "123456789m".parse().unwrap());
        assert_eq!(parse_grpc_timeout(&h), None);
        h.insert("grpc-timeout", "5x".parse().unwrap());
        assert_eq!(parse_grpc_timeout(&h), None);
    }
}

/// Test pipes that misbehave.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::client::FastChannel;
    use crate::conn::testing::corrupted;
    use crate::conn::{MsgRx, Pipe};
    use crate::{Error, RrpcConfig};

    /// A request for `path` with an empty body.
    pub(crate) fn req(path: &str) -> http::Request<tonic::body::Body> {
        http::Request::builder()
            .uri(path)
            .body(tonic::body::Body::empty())
            .expect("request")
    }

    /// Serves `svc` on `pipe` with `cfg` (the peer's window: `cfg`'s own),
    /// as a spawned task whose result is `serve_conn`'s.
    pub(crate) fn spawn_server<S>(
        pipe: Pipe,
        svc: S,
        cfg: &RrpcConfig,
    ) -> tokio::task::JoinHandle<Result<(), Error>>
    where
        S: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
                Error = std::convert::Infallible,
            > + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        tokio::spawn(crate::fast::server::serve_conn(
            pipe,
            svc,
            cfg.clone(),
            tokio_util::sync::CancellationToken::new(),
            cfg.call_window(),
            Default::default(),
        ))
    }

    /// A fast-path client on `pipe` with `cfg` (the peer's window: `cfg`'s own).
    pub(crate) fn channel(pipe: Pipe, cfg: &RrpcConfig) -> FastChannel {
        FastChannel::start(pipe, cfg, cfg.call_window(), Default::default())
    }

    /// `pipe` with its sender breakable (`conn::Link`'s test switch),
    /// broken from the start or not, and the switch that breaks it.
    pub(crate) fn breakable(pipe: Pipe, broken: bool) -> (Pipe, Arc<AtomicBool>) {
        let switch = pipe.0.breaker(broken);
        (pipe, switch)
    }

    /// `pipe` with its receiver wrapped in a [`BreakableRx`], broken from
    /// the start or not, and the switch that breaks it.
    pub(crate) fn breakable_rx(pipe: Pipe, broken: bool) -> (Pipe, Arc<AtomicBool>) {
        let (tx, inner) = pipe;
        let broken = Arc::new(AtomicBool::new(broken));
        let rx = BreakableRx {
            inner,
            broken: broken.clone(),
        };
        ((tx, Box::new(rx)), broken)
    }

    /// A receiver that works until `broken` is set, then fails every
    /// receive as a receive ring the peer corrupted does.
    pub(crate) struct BreakableRx {
        pub(crate) inner: Box<dyn MsgRx>,
        pub(crate) broken: Arc<AtomicBool>,
    }

    impl MsgRx for BreakableRx {
        fn poll_recv_with(
            &mut self,
            cx: &mut std::task::Context<'_>,
            f: &mut dyn FnMut(&[u8]),
        ) -> std::task::Poll<Result<bool, Error>> {
            if self.broken.load(Ordering::SeqCst) {
                return std::task::Poll::Ready(Err(corrupted()));
            }
            self.inner.poll_recv_with(cx, f)
        }
    }
}
