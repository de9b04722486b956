//! The client side: [`RrpcChannel`], a `Channel` for any rrpc URI.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tower::Service;

use crate::fast::client::FastChannel;
use crate::h2stream::{RrpcConnectInfo, RrpcStream};
use crate::pipe::Pipe;
use crate::transport::{Negotiated, Target, dial, negotiate_client};
use crate::{Error, PathPreference, RrpcConfig};

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
    },
}

#[derive(Debug, Clone)]
enum Inner {
    Tonic(Channel, ChannelPath),
    Fast(FastChannel),
}

impl RrpcChannel {
    /// Connects to `uri` (`http://`, `unix://`, `shm://`, `rdma://`, `inproc://`).
    ///
    /// # Errors
    /// [`Error::InvalidUri`], [`Error::UnsupportedTransport`] (`rdma://`
    /// without the verbs provider), [`Error::NotListening`],
    /// [`Error::Handshake`], [`Error::Transport`].
    pub async fn connect(uri: &str, config: RrpcConfig) -> Result<Self, Error> {
        let target = Target::parse(uri)?;
        let carrier = carrier_of(&target, &config)?;
        let inner = match target {
            Target::Tcp(addr) => Inner::Tonic(
                Endpoint::from_shared(format!("http://{addr}"))?
                    .connect()
                    .await?,
                ChannelPath::Tcp,
            ),
            Target::Unix(path) => {
                let ch = Endpoint::from_static("http://localhost")
                    .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await?;
                Inner::Tonic(ch, ChannelPath::Unix)
            }
            t => {
                let mut pipe = dial(&t, &config).await?;
                match negotiate_client(&mut pipe, &config).await? {
                    Negotiated::Fast { peer_window } => {
                        Inner::Fast(FastChannel::start(pipe, &config, peer_window))
                    }
                    Negotiated::Http2 => Inner::Tonic(
                        h2_channel(t, pipe, config, uri.to_string()).await?,
                        ChannelPath::Http2,
                    ),
                }
            }
        };
        Ok(RrpcChannel { inner, carrier })
    }

    /// What carries this channel's bytes: for `rdma://`, the verbs device
    /// (the connection was made on it; there is no fallback to another
    /// provider).
    pub fn carrier(&self) -> &Carrier {
        &self.carrier
    }

    /// The path this channel uses.
    pub fn path(&self) -> ChannelPath {
        match &self.inner {
            Inner::Tonic(_, p) => *p,
            Inner::Fast(_) => ChannelPath::Fast,
        }
    }
}

fn carrier_of(target: &Target, config: &RrpcConfig) -> Result<Carrier, Error> {
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
        },
        #[cfg(not(feature = "verbs"))]
        Target::Rdma(_) => {
            let _ = config;
            return Err(crate::transport::rdma_unavailable());
        }
    })
}

async fn h2_channel(
    target: Target,
    first: Pipe,
    config: RrpcConfig,
    uri: String,
) -> Result<Channel, Error> {
    let first = Arc::new(Mutex::new(Some(first)));
    let config = config.path(PathPreference::Http2);
    let ch = Endpoint::from_static("http://rrpc.invalid")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (first, target, config, uri) =
                (first.clone(), target.clone(), config.clone(), uri.clone());
            async move {
                let taken = first.lock().expect("pipe lock").take();
                let pipe = match taken {
                    Some(p) => p,
                    None => {
                        // Reconnect: a fresh connection, HTTP/2 again.
                        let mut p = dial(&target, &config).await?;
                        negotiate_client(&mut p, &config).await?;
                        p
                    }
                };
                Ok::<_, Error>(TokioIo::new(RrpcStream::new(
                    pipe,
                    RrpcConnectInfo { local: uri },
                )))
            }
        }))
        .await?;
    Ok(ch)
}

impl Service<http::Request<Body>> for RrpcChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match &mut self.inner {
            Inner::Tonic(c, _) => c.poll_ready(cx).map_err(Into::into),
            Inner::Fast(f) => f.poll_ready(cx),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> ResponseFuture {
        match &mut self.inner {
            // Plain tonic (TCP, Unix socket): exactly what tonic's own
            // `Channel` reports, statuses untouched.
            Inner::Tonic(c, ChannelPath::Tcp | ChannelPath::Unix) => {
                let fut = c.call(req);
                Box::pin(async move { fut.await.map_err(Into::into) })
            }
            Inner::Tonic(c, _) => {
                let fut = c.call(req);
                Box::pin(async move {
                    let resp = fut
                        .await
                        .map_err(|e| -> BoxError { Box::new(dispatch_error(e.into())) })?;
                    Ok(resp
                        .map(|b| Body::new(http_body_util::BodyExt::map_err(b, lost_connection))))
                })
            }
            Inner::Fast(f) => f.call(req),
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
