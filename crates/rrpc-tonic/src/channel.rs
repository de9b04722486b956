//! The client side: [`RrpcChannel`], a `Channel` for any rrpc URI.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::Service;

use tower::buffer::Buffer;

use crate::endpoint::{Dialer, Managed};
use crate::h2stream::{RrpcConnectInfo, RrpcStream};
use crate::pipe::Pipe;
use crate::transport::{Target, dial};
use crate::{Error, PathPreference, RrpcConfig, RrpcEndpoint};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future returned by [`RrpcChannel`]'s `call`.
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

/// A client channel for any URI that the unchanged generated client takes:
/// `GreeterClient::new(RrpcChannel::connect("shm:///run/g.sock", cfg).await?)`.
///
/// Cheap to clone; clones share the connection and multiplex their calls.
///
/// Dropping the last clone (and the calls and response streams made on
/// it) closes the connection: its sockets, eventfds and ring regions are
/// released promptly on both paths, whether the process is busy or idle
/// (`tests/integration/tests/release.rs` counts the process's descriptors
/// and allows 5 s; here three connections per path were released within
/// that test's 0.8 s run).
#[derive(Debug, Clone)]
pub struct RrpcChannel {
    inner: Inner,
    carrier: Carrier,
}

/// What carries a channel's bytes ([`RrpcChannel::carrier`]): tests and
/// operators can check that `rdma://` really runs on the RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Carrier {
    /// TCP (`http://`).
    Tcp,
    /// A Unix socket (`unix://`).
    Unix,
    /// An in-process pipe (`inproc://`).
    Inproc,
    /// Shared-memory rings (`shm://`, rrpc-core's shm provider).
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
    /// A balance over several endpoints ([`RrpcChannel::balance_list`]),
    /// in the order given.
    Balanced(Vec<Carrier>),
}

#[derive(Clone)]
enum Inner {
    /// tonic's own channel (`http://`, `unix://`).
    Tonic(Channel, ChannelPath),
    /// A ring connection that reconnects ([`crate::RrpcEndpoint`]).
    Rings(Managed),
    /// Behind a buffer: limits ([`crate::RrpcEndpoint::concurrency_limit`],
    /// `rate_limit`) or a balance; the dialer (if one) tells the path.
    Buffered(
        Buffer<http::Request<Body>, ResponseFuture>,
        Option<Arc<Dialer>>,
    ),
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

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Inner::Tonic(c, p) => f.debug_tuple("Tonic").field(c).field(p).finish(),
            Inner::Rings(m) => f.debug_tuple("Rings").field(m).finish(),
            Inner::Buffered(..) => f.write_str("Buffered"),
        }
    }
}

impl RrpcChannel {
    /// Connects to `uri` (`http://`, `unix://`, `shm://`, `rdma://`,
    /// `inproc://`): [`RrpcEndpoint::connect`] with tonic's defaults. The
    /// channel reconnects when its connection fails (the next call dials).
    ///
    /// # Errors
    /// [`Error::InvalidUri`], [`Error::UnsupportedTransport`] (`rdma://`
    /// without the verbs provider), [`Error::NotListening`],
    /// [`Error::Handshake`], [`Error::Transport`].
    pub async fn connect(uri: &str, config: RrpcConfig) -> Result<Self, Error> {
        RrpcEndpoint::new(uri)?.config(config).connect().await
    }

    /// One channel over several endpoints: each call goes to the less
    /// loaded of two endpoints picked at random (tower's power-of-two-choices
    /// balance over pending requests, as tonic's `Channel::balance_list`).
    /// Every endpoint connects lazily and reconnects on its own; an endpoint
    /// that is down fails the calls sent to it with `Unavailable` until it
    /// is back (as with tonic).
    ///
    /// # Errors
    /// No endpoints, or an endpoint's configuration error
    /// ([`RrpcEndpoint::connect_lazy`]).
    pub fn balance_list(endpoints: impl IntoIterator<Item = RrpcEndpoint>) -> Result<Self, Error> {
        let mut carriers = Vec::new();
        let mut services = Vec::new();
        for ep in endpoints {
            let ch = ep.connect_lazy()?;
            carriers.push(ch.carrier.clone());
            services.push(tower::load::PendingRequests::new(
                ch,
                tower::load::CompleteOnResponse::default(),
            ));
        }
        if services.is_empty() {
            return Err(Error::InvalidConfig(
                "balance_list needs at least one endpoint",
            ));
        }
        let balance =
            tower::balance::p2c::Balance::new(tower::discover::ServiceList::new(services));
        let svc = tower::util::BoxService::new(tower::util::MapErr::new(balance, |e: BoxError| e));
        Ok(RrpcChannel {
            inner: Inner::Buffered(Buffer::new(svc, 1024), None),
            carrier: Carrier::Balanced(carriers),
        })
    }

    pub(crate) fn tonic(ch: Channel, path: ChannelPath, carrier: Carrier) -> Self {
        RrpcChannel {
            inner: Inner::Tonic(ch, path),
            carrier,
        }
    }

    pub(crate) fn managed(m: Managed, carrier: Carrier) -> Self {
        RrpcChannel {
            inner: Inner::Rings(m),
            carrier,
        }
    }

    pub(crate) fn buffered(
        b: Buffer<http::Request<Body>, ResponseFuture>,
        dialer: Arc<Dialer>,
        carrier: Carrier,
    ) -> Self {
        RrpcChannel {
            inner: Inner::Buffered(b, Some(dialer)),
            carrier,
        }
    }

    /// The reconnecting ring connection, if this is one (tests).
    #[cfg(test)]
    pub(crate) fn rings(&self) -> Option<&Managed> {
        match &self.inner {
            Inner::Rings(m) => Some(m),
            _ => None,
        }
    }

    /// What carries this channel's bytes.
    ///
    /// On rings (`shm://`, `rdma://`) it is read from the live connection:
    /// the provider of the queue pair that carries the calls, and on verbs
    /// its device and the peer's address from the GID it is connected to
    /// ([`rrpc_core::QueuePair::carrier`]). Until the channel first
    /// connects (a lazy channel), and on tonic's own paths (`http://`,
    /// `unix://`), it is what the URI asks for; a balanced channel lists
    /// its endpoints' carriers.
    pub fn carrier(&self) -> Carrier {
        let observed = match &self.inner {
            Inner::Rings(m) => m.dialer.current_carrier(),
            Inner::Buffered(_, Some(d)) => d.current_carrier(),
            _ => None,
        };
        observed.unwrap_or_else(|| self.carrier.clone())
    }

    /// The path this channel uses: on rings, the path of its current
    /// connection ([`ChannelPath::Fast`] for a lazy channel that has not
    /// connected yet, unless its config asks for HTTP/2; a balanced
    /// channel says [`ChannelPath::Fast`] too).
    pub fn path(&self) -> ChannelPath {
        match &self.inner {
            Inner::Tonic(_, p) => *p,
            Inner::Rings(m) => m.path().unwrap_or_else(|| m.dialer.preferred_path()),
            Inner::Buffered(_, Some(d)) => d.current_path().unwrap_or_else(|| d.preferred_path()),
            Inner::Buffered(_, None) => ChannelPath::Fast,
        }
    }
}

pub(crate) fn carrier_of(target: &Target, config: &RrpcConfig) -> Result<Carrier, Error> {
    Ok(match target {
        Target::Tcp(_) => Carrier::Tcp,
        Target::Unix(_) => Carrier::Unix,
        Target::Inproc(_) => Carrier::Inproc,
        Target::Shm(_) => Carrier::Shm,
        #[cfg(feature = "verbs")]
        Target::Rdma(_) => Carrier::Verbs {
            device: config
                .verbs_fabric()?
                .device_name()
                .unwrap_or_default()
                .to_string(),
            peer: None,
        },
        #[cfg(not(feature = "verbs"))]
        Target::Rdma(_) => {
            let _ = config;
            return Err(crate::transport::rdma_unavailable());
        }
    })
}

/// tonic's channel over ring connections on the HTTP/2 path: `first` is
/// the connection already negotiated; tonic reconnects through a fresh one.
pub(crate) async fn h2_channel(
    target: Target,
    first: Pipe,
    config: RrpcConfig,
    uri: String,
    endpoint: tonic::transport::Endpoint,
    carrier: Arc<Mutex<Option<Carrier>>>,
) -> Result<Channel, Error> {
    let first = Arc::new(Mutex::new(Some(first)));
    let config = config.path(PathPreference::Http2);
    let ch = endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (first, target, config, uri, carrier) = (
                first.clone(),
                target.clone(),
                config.clone(),
                uri.clone(),
                carrier.clone(),
            );
            async move {
                let taken = first.lock().expect("pipe lock").take();
                let pipe = match taken {
                    Some(p) => p,
                    None => {
                        // Reconnect: a fresh connection, HTTP/2 again.
                        let (p, _http2) = dial(&target, &config).await?;
                        p
                    }
                };
                if let Some(c) = pipe.1.carrier() {
                    *carrier.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Carrier::observed(&c));
                }
                Ok::<_, Error>(TokioIo::new(RrpcStream::new(
                    pipe,
                    RrpcConnectInfo { local: uri },
                )))
            }
        }))
        .await?;
    Ok(ch)
}

/// A call on tonic's channel over rings, with rrpc's statuses for a lost
/// connection ([`dispatch_error`], [`lost_connection`]).
pub(crate) fn h2_call(c: &mut Channel, req: http::Request<Body>) -> ResponseFuture {
    let fut = c.call(req);
    Box::pin(async move {
        let resp = fut
            .await
            .map_err(|e| -> BoxError { Box::new(dispatch_error(e.into())) })?;
        Ok(resp.map(|b| Body::new(http_body_util::BodyExt::map_err(b, lost_connection))))
    })
}

impl Service<http::Request<Body>> for RrpcChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match &mut self.inner {
            Inner::Tonic(c, _) => c.poll_ready(cx).map_err(Into::into),
            Inner::Rings(m) => m.poll_ready(cx),
            Inner::Buffered(b, _) => b.poll_ready(cx),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> ResponseFuture {
        match &mut self.inner {
            // Plain tonic (TCP, Unix socket): exactly what tonic's own
            // `Channel` reports, statuses untouched.
            Inner::Tonic(c, _) => {
                let fut = c.call(req);
                Box::pin(async move { fut.await.map_err(Into::into) })
            }
            Inner::Rings(m) => m.call(req),
            Inner::Buffered(b, _) => Box::pin(b.call(req)),
        }
    }
}

/// hyper reports a connection that died under a streaming response as an
/// `Unknown` "h2 protocol error"; gRPC (and the fast path) say `Unavailable`.
/// Body errors never carry a server's status (that comes in trailers), so an
/// `Unknown` here is always the transport's.
fn lost_connection(s: tonic::Status) -> tonic::Status {
    if s.code() == tonic::Code::Unknown {
        tonic::Status::unavailable(format!("connection lost: {}", s.message()))
    } else {
        s
    }
}

/// HTTP/2 over rings only: a call dispatched on a connection that is
/// closing: hyper says "canceled", the fast path says the peer is
/// unavailable, so this path does too. A stream the server reset itself
/// (RST_STREAM, e.g. CANCEL after its handler panicked) keeps tonic's
/// status (`Cancelled`), exactly as over TCP. An expired deadline keeps
/// tonic's own status (`Cancelled: Timeout expired`).
fn dispatch_error(e: BoxError) -> tonic::Status {
    if reset_by_server(&*e) {
        return tonic::Status::from_error(e);
    }
    let st = tonic::Status::from_error(e);
    let timeout = st.code() == tonic::Code::Cancelled && st.message().contains("Timeout expired");
    match st.code() {
        tonic::Code::Unknown | tonic::Code::Cancelled if !timeout => {
            tonic::Status::unavailable(format!("connection lost: {}", st.message()))
        }
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
