//! The HTTP/2 path: a byte stream (`AsyncRead + AsyncWrite + Connected`) over a pipe.
//!
//! hyper/h2 run unchanged on top, so every tonic feature works. Writes are
//! cut into messages of at most the ring's message size and copied straight
//! into the send ring; a reader task queues received messages as chunks.
//! The client side's tonic channel over such streams ([`h2_channel`]) and
//! its status mapping ([`h2_call`]) live here too.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::Service;

use crate::call::{
    BoxError, Carrier, DeadlineBody, ResponseFuture, deadline_exceeded, is_tonic_timeout,
};
use crate::conn::Link;
use crate::conn::{BoxFut, Pipe};
use crate::transport::{Target, dial};
use crate::{Error, PathPreference, RrpcConfig, RrpcContext};

/// Information about an rrpc connection, available to tonic handlers through
/// `request.extensions().get::<RrpcConnectInfo>()` on the HTTP/2 path.
#[derive(Debug, Clone)]
pub struct RrpcConnectInfo {
    /// The URI the server listens on.
    pub local: String,
}

type SendFut = BoxFut<'static, (Link, Result<(), Error>)>;

/// Why a client's HTTP/2 connection over rings failed, when it failed for
/// a reason of rrpc's (a queue pair out of retries, a host that stopped
/// answering, a corrupt ring): hyper keeps only the words of the first
/// read error, and a call dispatched on the dying connection only hears
/// "operation was canceled". Kept typed, so that the caller's status has
/// its code ([`Error::code`]: a corrupt ring `DataLoss`, a gone peer
/// `Unavailable`). Reset for each new connection.
type Cause = Arc<Mutex<Option<Arc<Error>>>>;

/// Records `e` as the cause (the first one stays) and returns it shared,
/// for the I/O error hyper gets.
fn record(cause: Option<&Cause>, e: Error) -> Error {
    let e = Arc::new(e);
    if let Some(c) = cause {
        let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
        c.get_or_insert_with(|| e.clone());
    }
    Error::Failed(e)
}

/// An rrpc connection as a byte stream, for hyper.
///
/// `poll_write` copies the bytes straight into the send ring when it has
/// room (the common case; otherwise the write is accepted and finished by the
/// next `poll_write`/`poll_flush`): no writer task. Reads come from a small
/// reader task (see `RrpcStream::new`).
pub struct RrpcStream {
    /// The send half while no slow (ring-full) send is in flight.
    tx: Option<Link>,
    sending: Option<SendFut>,
    /// Chunks from the reader pump task, and why it stopped if the
    /// connection failed (an orderly close reads as EOF).
    rx: mpsc::Receiver<io::Result<Bytes>>,
    cur: Bytes,
    eof: bool,
    max: usize,
    info: RrpcConnectInfo,
    /// Where a client's stream records why it failed ([`Cause`]).
    cause: Option<Cause>,
}

impl std::fmt::Debug for RrpcStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RrpcStream")
            .field("info", &self.info)
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

impl RrpcStream {
    /// Wraps a negotiated pipe.
    pub(crate) fn new(pipe: Pipe, info: RrpcConnectInfo) -> Self {
        Self::reporting(pipe, info, None)
    }

    /// [`Self::new`], recording why the connection failed in `cause`.
    fn reporting(pipe: Pipe, info: RrpcConnectInfo, cause: Option<Cause>) -> Self {
        let (tx, mut prx) = pipe;
        let reader_cause = cause.clone();
        // The reader stays a task of its own: its ring wait spins (BPEV), and
        // spinning inside hyper's connection task would stall its writes.
        let (rtx, rx) = mpsc::channel::<io::Result<Bytes>>(16);
        tokio::spawn(async move {
            loop {
                let mut got = Bytes::new();
                // The one receive-side copy: ring slot -> read chunk.
                // When the stream is dropped (hyper closed the connection:
                // an error, garbage instead of the preface, or the channel
                // dropped), stop at once: dropping the pipe closes the
                // connection (`recv_with` is cancel safe).
                let mut sink = |m: &[u8]| got = Bytes::copy_from_slice(m);
                let r = tokio::select! {
                    _ = rtx.closed() => break,
                    r = prx.recv_with(&mut sink) => r,
                };
                match r {
                    Ok(true) => {
                        if !got.is_empty() && rtx.send(Ok(got)).await.is_err() {
                            break;
                        }
                    }
                    // The peer left: EOF, as a closed socket reads.
                    Ok(false) => break,
                    // The connection failed (a queue pair out of retries, a
                    // host that stopped answering, a corrupt ring): a read
                    // error that carries the cause, which `h2_call` finds
                    // under hyper's own error for the caller's status.
                    Err(e) => {
                        let e = record(reader_cause.as_ref(), e);
                        let _ = rtx
                            .send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, e)))
                            .await;
                        break;
                    }
                }
            }
        });
        RrpcStream {
            max: tx.preferred_message(),
            tx: Some(tx),
            sending: None,
            rx,
            cur: Bytes::new(),
            eof: false,
            info,
            cause,
        }
    }

    /// A send failed: record why, and tell hyper.
    fn send_error(&self, e: Error) -> io::Error {
        io::Error::new(io::ErrorKind::BrokenPipe, record(self.cause.as_ref(), e))
    }

    /// Finishes a send that had to wait for ring space.
    fn poll_sent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(f) = self.sending.as_mut() {
            let (tx, r) = ready!(f.as_mut().poll(cx));
            self.sending = None;
            self.tx = Some(tx);
            if let Err(e) = r {
                return Poll::Ready(Err(self.send_error(e)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for RrpcStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.cur.is_empty() {
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(Ok(b)) => this.cur = b,
                Some(Err(e)) => {
                    this.eof = true;
                    return Poll::Ready(Err(e));
                }
                None => {
                    this.eof = true;
                    return Poll::Ready(Ok(()));
                }
            }
        }
        let n = this.cur.len().min(buf.remaining());
        buf.put_slice(&this.cur[..n]);
        this.cur.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for RrpcStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_sent(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let Some(tx) = this.tx.as_mut() else {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        let n = buf.len().min(this.max);
        let data = &buf[..n];
        match tx.try_send_with(n, &mut |slot: &mut [u8]| slot.copy_from_slice(data)) {
            Ok(true) => Poll::Ready(Ok(n)),
            Ok(false) => {
                // Ring full: accept the bytes, finish the send in the background
                // of this stream (the next write or flush waits for it).
                let data = Bytes::copy_from_slice(data);
                let tx = this.tx.take().expect("checked above");
                this.sending = Some(Box::pin(async move {
                    let r = tx
                        .send_with(data.len(), &mut |slot: &mut [u8]| {
                            slot.copy_from_slice(&data)
                        })
                        .await;
                    (tx, r)
                }));
                // Register for its completion now (it may finish at once).
                if let Poll::Ready(Err(e)) = this.poll_sent(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(n))
            }
            Err(e) => Poll::Ready(Err(this.send_error(e))),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_sent(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_sent(cx))?;
        this.tx = None;
        Poll::Ready(Ok(()))
    }
}

impl tonic::transport::server::Connected for RrpcStream {
    type ConnectInfo = RrpcConnectInfo;
    fn connect_info(&self) -> RrpcConnectInfo {
        self.info.clone()
    }
}

/// A client's HTTP/2 connection over rings: tonic's channel, and why its
/// current connection failed ([`Cause`]).
#[derive(Debug, Clone)]
pub(crate) struct H2Conn {
    pub(crate) ch: Channel,
    cause: Cause,
}

/// tonic's channel over ring connections on the HTTP/2 path: `first` is
/// the connection already negotiated; tonic reconnects through a fresh one.
pub(crate) async fn h2_channel(
    target: Target,
    first: Pipe,
    config: RrpcConfig,
    ctx: RrpcContext,
    uri: String,
    endpoint: tonic::transport::Endpoint,
    carrier: Arc<Mutex<Option<Carrier>>>,
) -> Result<H2Conn, Error> {
    let first = Arc::new(Mutex::new(Some(first)));
    let config = config.to_builder().path(PathPreference::Http2).build()?;
    let cause: Cause = Arc::default();
    let slot = cause.clone();
    let ch = endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (first, target, config, ctx, uri, carrier, slot) = (
                first.clone(),
                target.clone(),
                config.clone(),
                ctx.clone(),
                uri.clone(),
                carrier.clone(),
                slot.clone(),
            );
            async move {
                let taken = first.lock().expect("pipe lock").take();
                let pipe = match taken {
                    Some(p) => p,
                    None => {
                        // Reconnect: a fresh connection, HTTP/2 again.
                        let (p, _http2) = dial(&target, &config, &ctx).await?;
                        p
                    }
                };
                if let Some(c) = pipe.1.carrier() {
                    *carrier.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Carrier::observed(&c));
                }
                // A new connection: the old one's failure is history.
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Ok::<_, Error>(TokioIo::new(RrpcStream::reporting(
                    pipe,
                    RrpcConnectInfo { local: uri },
                    Some(slot),
                )))
            }
        }))
        .await?;
    Ok(H2Conn { ch, cause })
}

/// A call on tonic's channel over rings, with rrpc's statuses for a lost
/// connection ([`dispatch_error`], [`lost_connection`]) and gRPC's rule for
/// deadlines: the deadline (the shorter of the call's `grpc-timeout` and
/// `limit`, the endpoint's `timeout`) covers the response body too, and an
/// expired call fails with `DeadlineExceeded` ([`crate::call::deadline_exceeded`]),
/// whether tonic's channel, tonic's server or the body's bound saw it
/// first. tonic over TCP says `Cancelled` "Timeout expired" and bounds
/// only the response headers.
pub(crate) fn h2_call(
    c: &mut H2Conn,
    req: http::Request<Body>,
    limit: Option<std::time::Duration>,
) -> ResponseFuture {
    let deadline = crate::fast::proto::call_timeout(req.headers(), limit)
        .map(|d| tokio::time::Instant::now() + d);
    let fut = c.ch.call(req);
    let cause = c.cause.clone();
    Box::pin(async move {
        let mut resp = fut
            .await
            .map_err(|e| -> BoxError { Box::new(dispatch_error(e.into(), &cause)) })?;
        expired_on_the_server(resp.headers_mut());
        Ok(resp.map(|b| {
            let b = http_body_util::BodyExt::map_err(b, move |s| lost_connection(s, &cause));
            match deadline {
                Some(d) => Body::new(DeadlineBody::new(b, d)),
                None => Body::new(b),
            }
        }))
    })
}

/// A trailers-only response in which tonic's server reported an expired
/// deadline (its `GrpcTimeout`: `Cancelled` "Timeout expired") says
/// `DeadlineExceeded` instead, as the rest of the call's deadline does.
fn expired_on_the_server(headers: &mut http::HeaderMap) {
    if headers.contains_key("grpc-status")
        && tonic::Status::from_header_map(headers).is_some_and(|st| is_tonic_timeout(&st))
    {
        let _ = deadline_exceeded().add_header(headers);
    }
}

/// hyper reports a connection that died under a streaming response as an
/// `Unknown` "h2 protocol error"; gRPC (and the fast path) say `Unavailable`,
/// or the code of rrpc's cause ([`lost`]). Body errors never carry a
/// server's status (that comes in trailers), so an `Unknown` here is always
/// the transport's.
fn lost_connection(s: tonic::Status, cause: &Cause) -> tonic::Status {
    if s.code() == tonic::Code::Unknown {
        lost(&s, cause)
    } else {
        s
    }
}

/// "connection lost: ..." with hyper's words, and rrpc's cause when the
/// connection failed for one ([`Cause`]: `IBV_WC_RETRY_EXC_ERR`, a host
/// that stopped answering, a corrupt ring), whose code it has
/// ([`Error::code`]); `Unavailable` without one.
fn lost(s: &tonic::Status, cause: &Cause) -> tonic::Status {
    match cause.lock().unwrap_or_else(|p| p.into_inner()).as_deref() {
        Some(why) => tonic::Status::new(
            why.code(),
            format!("connection lost: rrpc: {why} ({})", s.message()),
        ),
        None => tonic::Status::unavailable(format!("connection lost: {}", s.message())),
    }
}

/// HTTP/2 over rings only: a call dispatched on a connection that is
/// closing: hyper says "canceled", the fast path says the peer is
/// unavailable, so this path does too. A stream the server reset itself
/// (RST_STREAM, e.g. CANCEL after its handler panicked) keeps tonic's
/// status (`Cancelled`), exactly as over TCP. An expired deadline (tonic's
/// `Cancelled: Timeout expired`) is `DeadlineExceeded`, as on the fast path.
fn dispatch_error(e: BoxError, cause: &Cause) -> tonic::Status {
    if reset_by_server(&*e) {
        return tonic::Status::from_error(e);
    }
    let st = tonic::Status::from_error(e);
    if is_tonic_timeout(&st) {
        return deadline_exceeded();
    }
    match st.code() {
        tonic::Code::Unknown | tonic::Code::Cancelled => lost(&st, cause),
        _ => st,
    }
}

/// Whether `e` is, or wraps, an HTTP/2 stream reset sent by the server.
fn reset_by_server(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_reset() && h2.is_remote();
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that died under a call reads as rrpc's cause, through
    /// the one mapping: a ring the peer corrupted `DataLoss`, a gone peer
    /// `Unavailable`; without a cause, `Unavailable`.
    #[test]
    fn a_lost_connection_has_the_code_of_its_cause() {
        let hyper_says = || tonic::Status::unknown("h2 protocol error");
        let cause: Cause = Arc::default();
        let st = lost_connection(hyper_says(), &cause);
        assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}");
        let corrupt = Error::from(rrpc_ringbuf::Error::Corrupt(
            rrpc_ringbuf::Corruption::PlacementTimedOut,
        ));
        let _ = record(Some(&cause), corrupt);
        let _ = record(Some(&cause), Error::PeerGone);
        let st = lost_connection(hyper_says(), &cause);
        assert_eq!(
            st.code(),
            tonic::Code::DataLoss,
            "the first cause stays: {st:?}"
        );
        assert!(st.message().contains("corrupt"), "{st:?}");
        let st = dispatch_error(Box::new(tonic::Status::cancelled("canceled")), &cause);
        assert_eq!(st.code(), tonic::Code::DataLoss, "{st:?}");
        let gone: Cause = Arc::default();
        let _ = record(Some(&gone), rrpc_core::Error::PeerGone.into());
        let st = lost_connection(hyper_says(), &gone);
        assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}");
    }

    /// tonic's `Cancelled` "Timeout expired", from its channel's timer or
    /// in its server's trailers-only response, reads as `DeadlineExceeded`;
    /// any other `Cancelled` of a server stays.
    #[test]
    fn tonic_timeouts_read_as_deadline_exceeded() {
        let cause: Cause = Arc::default();
        let st = dispatch_error(Box::new(tonic::TimeoutExpired(())), &cause);
        assert_eq!(st.code(), tonic::Code::DeadlineExceeded, "{st:?}");
        let answered = |st: tonic::Status| {
            let mut h = http::HeaderMap::new();
            st.add_header(&mut h).expect("headers");
            expired_on_the_server(&mut h);
            tonic::Status::from_header_map(&h).expect("a status")
        };
        let st = answered(tonic::Status::cancelled("Timeout expired"));
        assert_eq!(st.code(), tonic::Code::DeadlineExceeded, "{st:?}");
        assert_eq!(st.message(), "Deadline Exceeded");
        let st = answered(tonic::Status::cancelled("the handler gave up"));
        assert_eq!(st.code(), tonic::Code::Cancelled, "{st:?}");
        let mut h = http::HeaderMap::new();
        expired_on_the_server(&mut h);
        assert!(h.is_empty(), "a response with no status is left alone");
    }
}
