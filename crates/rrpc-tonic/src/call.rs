//! What every call path shares: the future a call returns, the user agent
//! tonic sends, and what a channel reports about the path and the fabric
//! that carry it.

use tonic::body::Body;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// tonic's own `user-agent` (`tonic/<version>`), as the tonic this crate
/// was built with sends it: the fast path sends the same, so handlers read
/// the same value on every path. tonic's `UserAgent` layer and its constant
/// are private, so it is read once per process from what a tonic `Channel`
/// writes: a lazy channel over an in-memory pipe sends one request to an h2
/// server that keeps its headers (on a thread of its own with its own
/// runtime, so any caller, async or not, can ask; about a millisecond,
/// once). Should that fail, `tonic` alone.
pub(crate) fn tonic_user_agent() -> &'static http::HeaderValue {
    static UA: std::sync::OnceLock<http::HeaderValue> = std::sync::OnceLock::new();
    UA.get_or_init(|| {
        let read = std::thread::Builder::new()
            .name("rrpc-user-agent".into())
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async {
                    tokio::time::timeout(std::time::Duration::from_secs(2), read_user_agent())
                        .await
                        .ok()
                        .flatten()
                })
            })
            .ok()
            .and_then(|t| t.join().ok().flatten());
        read.unwrap_or_else(|| {
            tracing::warn!("rrpc: could not read tonic's user-agent; sending `tonic`");
            http::HeaderValue::from_static("tonic")
        })
    })
}

/// What a tonic `Channel` sends as its `user-agent` (see
/// [`tonic_user_agent`]).
async fn read_user_agent() -> Option<http::HeaderValue> {
    use tower::Service as _;
    let (client_io, server_io) = tokio::io::duplex(64 << 10);
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(client_io)));
    let connector = tower::service_fn(move |_: http::Uri| {
        let io = slot.lock().ok().and_then(|mut s| s.take());
        async move {
            io.map(hyper_util::rt::TokioIo::new)
                .ok_or_else(|| std::io::Error::other("one connection only"))
        }
    });
    let mut channel = tonic::transport::Endpoint::from_static("http://user-agent.invalid")
        .connect_with_connector_lazy(connector);
    let server = async move {
        let mut conn = h2::server::handshake(server_io).await.ok()?;
        let (req, _respond) = conn.accept().await?.ok()?;
        req.headers().get(http::header::USER_AGENT).cloned()
    };
    let client = async move {
        let req = http::Request::builder()
            .uri("http://user-agent.invalid/rrpc.UserAgent/Read")
            .body(Body::empty())
            .ok()?;
        std::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .ok()?;
        // No answer comes: the server side ends the race with the headers.
        let _ = channel.call(req).await;
        None
    };
    tokio::select! {
        ua = server => ua,
        none = client => none,
    }
}

/// The status of a call whose deadline passed, on every rrpc path: gRPC's
/// `DEADLINE_EXCEEDED` (grpc-go and grpc-core report it so), where tonic's
/// own channel and server say `Cancelled` "Timeout expired". The deadline
/// is the shorter of the call's `grpc-timeout` and the endpoint's (or
/// server's) `timeout`, and it covers the whole call: the wait for a
/// place, the request, the response headers and the response body.
pub(crate) fn deadline_exceeded() -> tonic::Status {
    tonic::Status::deadline_exceeded("Deadline Exceeded")
}

/// Whether `st` is tonic's status for an expired deadline: `Cancelled`
/// "Timeout expired", as its `GrpcTimeout` reports one (a channel's, or a
/// server's in a trailers-only response).
pub(crate) fn is_tonic_timeout(st: &tonic::Status) -> bool {
    st.code() == tonic::Code::Cancelled && st.message() == "Timeout expired"
}

/// A response body bounded by its call's deadline (the HTTP/2 path over
/// rings; the fast path's body has its own, [`crate::fast`]): once the
/// deadline passed while the body waits, it fails with
/// [`deadline_exceeded`] and ends; dropping it then resets the stream on
/// the server. The timer is made at the first wait only.
pub(crate) struct DeadlineBody<B> {
    inner: B,
    deadline: tokio::time::Instant,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    expired: bool,
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(inner: B, deadline: tokio::time::Instant) -> Self {
        DeadlineBody {
            inner,
            deadline,
            timer: None,
            expired: false,
        }
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Error = tonic::Status> + Unpin,
{
    type Data = B::Data;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, tonic::Status>>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(None);
        }
        if let r @ Poll::Ready(_) = std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            return r;
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.expired = true;
        Poll::Ready(Some(Err(deadline_exceeded())))
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The future returned by [`RrpcChannel`](crate::RrpcChannel)'s `call`.
pub type ResponseFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<http::Response<Body>, BoxError>> + Send>,
>;

/// Which data path a channel ended up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelPath {
    /// tonic over TCP (`http://`).
    Tcp,
    /// tonic over a Unix socket (`unix://`).
    Unix,
    /// HTTP/2 over rrpc rings.
    Http2,
    /// The h2-free fast path over rrpc rings.
    Fast,
}

/// What carries a channel's bytes ([`RrpcChannel::carrier`](crate::RrpcChannel::carrier)): tests and
/// operators can check that `rdma://` really runs on the RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Carrier {
    /// TCP (`http://`, or `rrpc://` when the negotiation chose TCP).
    Tcp,
    /// A Unix socket (`unix://`).
    Unix,
    /// An in-process pipe (`inproc://`).
    Inproc,
    /// Shared-memory rings (`shm://`, or `rrpc://` when the negotiation
    /// chose shm; rrpc-core's shm provider).
    Shm,
    /// RDMA rings through libibverbs (`rdma://`), on this device.
    Verbs {
        /// The device's name (e.g. `mlx5_0`, `rxe0`).
        device: String,
        /// The peer the queue pair is connected to: the address in its GID
        /// (the IPv4 address of a RoCE v2 GID). `None` until the channel
        /// has connected.
        peer: Option<std::net::IpAddr>,
    },
    /// A balance over several endpoints ([`RrpcChannel::balance_list`](crate::RrpcChannel::balance_list)),
    /// in the order given.
    Balanced(Vec<Carrier>),
}

impl Carrier {
    /// The carrier a live ring connection reports ([`rrpc_core::QueuePair::carrier`]).
    pub(crate) fn observed(c: &rrpc_core::QpCarrier) -> Carrier {
        match c.provider {
            rrpc_core::ProviderKind::Verbs => Carrier::Verbs {
                device: c.device.clone().unwrap_or_default(),
                peer: c.remote_gid.as_ref().map(rrpc_core::QpCarrier::gid_addr),
            },
            _ => Carrier::Shm,
        }
    }
}

#[cfg(test)]
mod tests {
    /// A body still waiting at its deadline fails with `DeadlineExceeded`,
    /// then ends; one that has its frames gives them, deadline or not.
    #[tokio::test(flavor = "current_thread")]
    async fn a_body_past_its_deadline_fails_with_deadline_exceeded() {
        use http_body_util::BodyExt;
        let never = futures_util::stream::pending::<
            Result<http_body::Frame<bytes::Bytes>, tonic::Status>,
        >();
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(10);
        let mut body = super::DeadlineBody::new(http_body_util::StreamBody::new(never), soon);
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("the deadline ends the wait");
        let st = first.expect("a frame").expect_err("an error");
        assert_eq!(st.code(), tonic::Code::DeadlineExceeded, "{st:?}");
        assert!(body.frame().await.is_none(), "then the body ends");
        assert!(http_body::Body::is_end_stream(&body));
        let full = http_body_util::Full::new(bytes::Bytes::from_static(b"x"))
            .map_err(|e: std::convert::Infallible| -> tonic::Status { match e {} });
        let past = tokio::time::Instant::now();
        let mut body = super::DeadlineBody::new(full, past);
        let data = body.frame().await.expect("a frame").expect("data");
        assert_eq!(data.into_data().expect("data"), "x");
    }

    #[test]
    fn tonic_user_agent_is_read_from_tonic() {
        let ua = super::tonic_user_agent().to_str().unwrap();
        let version = ua.strip_prefix("tonic/").expect(ua);
        assert_eq!(version.split('.').count(), 3, "{ua}");
        assert!(version.split('.').all(|n| n.parse::<u32>().is_ok()), "{ua}");
    }
}
