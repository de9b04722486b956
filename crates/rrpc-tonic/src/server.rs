//! The server side: tonic's builder shape, one call to pick the transport.
//!
//! This file is the builder ([`Server`], [`Router`]) and the serving loops;
//! [`dispatch`] is the fast path's own dispatch of a call to its service,
//! beside tonic's router.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::Routes;
use tower::layer::util::{Identity, Stack};
use tower::{Layer, Service};

use crate::conn::negotiate::{Established, Negotiated};
use crate::fast::server::{FastOptions, serve_conn};
use crate::h2stream::{RrpcConnectInfo, RrpcStream};
use crate::port::limits::{Counted, Limits};
use crate::server::dispatch::Services;
use crate::tls::WithPeer;
use crate::transport::{RrpcListener, Target};
use crate::{Error, RrpcConfig, RrpcContext};

mod dispatch;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A server builder with the shape of `tonic::transport::Server`.
///
/// Swap `tonic::transport::Server` for `rrpc_tonic::Server`, keep
/// `.layer(..)` and `.add_service(..)`, and finish with
/// [`Router::serve_rrpc`] (any URI: `http://`, `unix://`, `shm://`,
/// `rdma://`, `inproc://`) or [`Router::serve_dual`] (TCP and rrpc at once,
/// as RR-Compound keeps TCP beside RDMA).
///
/// With the `tls` feature, `tls_config` takes [`crate::tls`]'s twin of
/// tonic's `ServerTlsConfig` (one identity for every leg that has TLS).
///
/// Unlike tonic's `Router`, this one keeps its routes and layers visible,
/// which the fast path needs: it calls the layered router directly, without
/// hyper, and with no server-wide layer each service by the name its path
/// carries, without the router (a path no service added here names still
/// gets the router's answer).
#[derive(Debug, Clone)]
pub struct Server<L = Identity> {
    layer: L,
    opts: Options,
}

/// tonic `Server`'s options, applied to tonic's own server (TCP, Unix
/// sockets, rrpc's HTTP/2 path) and, where they mean something on rings,
/// to the fast path (crate docs: "tonic options on rrpc").
#[derive(Debug, Clone, Default)]
struct Options {
    timeout: Option<Duration>,
    concurrency_limit: Option<usize>,
    load_shed: bool,
    max_concurrent_streams: Option<u32>,
    http2_keepalive_interval: Option<Duration>,
    http2_keepalive_timeout: Option<Duration>,
    initial_stream_window_size: Option<u32>,
    initial_connection_window_size: Option<u32>,
    tcp_nodelay: Option<bool>,
    tcp_keepalive: Option<Duration>,
    max_connection_age: Option<Duration>,
    /// The rings' runtime state ([`Server::context`]).
    context: Option<RrpcContext>,
    /// TLS on every leg that has it ([`crate::tls`]).
    tls: Option<Arc<crate::tls::ServerTls>>,
}

impl Options {
    /// tonic's server builder with these options, with the server's TLS
    /// when `tls` (the legs tonic terminates itself: `http://`, `unix://`;
    /// the port hands tonic connections whose TLS it terminated).
    fn tonic(&self, tls: bool) -> Result<tonic::transport::Server, Error> {
        let mut b = tonic::transport::Server::builder()
            .load_shed(self.load_shed)
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_keepalive_interval(self.http2_keepalive_interval)
            .http2_keepalive_timeout(self.http2_keepalive_timeout)
            .initial_stream_window_size(self.initial_stream_window_size)
            .initial_connection_window_size(self.initial_connection_window_size)
            .tcp_keepalive(self.tcp_keepalive);
        if let Some(t) = self.timeout {
            b = b.timeout(t);
        }
        if let Some(n) = self.concurrency_limit {
            b = b.concurrency_limit_per_connection(n);
        }
        if let Some(on) = self.tcp_nodelay {
            b = b.tcp_nodelay(on);
        }
        if let Some(age) = self.max_connection_age {
            b = b.max_connection_age(age);
        }
        match &self.tls {
            #[cfg(feature = "tls")]
            Some(t) if tls => Ok(b.tls_config(t.tonic())?),
            _ => {
                let _ = tls;
                Ok(b)
            }
        }
    }

    /// `config` with the server's TLS on the verbs side channel (`verbs`
    /// and `tls` features), unless the config sets its own.
    fn with_side_channel_tls(&self, config: RrpcConfig) -> Result<RrpcConfig, Error> {
        #[cfg(all(feature = "verbs", feature = "tls"))]
        if let Some(t) = &self.tls
            && config.tls().0.is_none()
        {
            return config.to_builder().tls_server(t.rustls().clone()).build();
        }
        Ok(config)
    }

    /// What the fast path takes of them.
    fn fast(&self) -> FastOptions {
        FastOptions {
            timeout: self.timeout,
            concurrency_limit: self.concurrency_limit,
            load_shed: self.load_shed,
            max_concurrent_streams: self.max_concurrent_streams,
            max_connection_age: self.max_connection_age,
        }
    }
}

impl Server<Identity> {
    /// A builder with no layers.
    pub fn builder() -> Self {
        Server {
            layer: Identity::new(),
            opts: Options::default(),
        }
    }
}

impl Default for Server<Identity> {
    fn default() -> Self {
        Self::builder()
    }
}

impl<L> Server<L> {
    /// Wraps every service in a tower layer (applied on every transport and path).
    pub fn layer<N>(self, layer: N) -> Server<Stack<N, L>> {
        Server {
            layer: Stack::new(layer, self.layer),
            opts: self.opts,
        }
    }

    /// A deadline for every call, as tonic's `Server::timeout`: a call's
    /// `grpc-timeout` shortens it, never lengthens it. On the fast path it
    /// bounds the whole call (its response body too) and an expired call
    /// ends with `DeadlineExceeded`; on the HTTP/2 path tonic applies it to
    /// the handler and answers `Cancelled` "Timeout expired", which an rrpc
    /// client on rings reads as `DeadlineExceeded`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.opts.timeout = Some(timeout);
        self
    }

    /// At most `limit` handlers run at once per connection; further calls
    /// wait for a place (tonic's `concurrency_limit_per_connection`). Both
    /// paths.
    #[must_use]
    pub fn concurrency_limit_per_connection(mut self, limit: usize) -> Self {
        self.opts.concurrency_limit = Some(limit);
        self
    }

    /// With a concurrency limit: refuse calls beyond it at once with
    /// `ResourceExhausted` instead of queueing them (tonic's `load_shed`).
    /// Both paths.
    #[must_use]
    pub fn load_shed(mut self, on: bool) -> Self {
        self.opts.load_shed = on;
        self
    }

    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` on the HTTP/2 path and TCP;
    /// on the fast path it caps [`RrpcConfig::max_concurrent_calls`] for
    /// this server (calls beyond it are refused with `Unavailable`; an
    /// rrpc client queues within its own `max_concurrent_calls`).
    #[must_use]
    pub fn max_concurrent_streams(mut self, max: impl Into<Option<u32>>) -> Self {
        self.opts.max_concurrent_streams = max.into();
        self
    }

    /// HTTP/2 keep-alive pings (HTTP/2 path and TCP). The fast path needs
    /// none: a dead peer is seen on the connection's side channel
    /// (rrpc-core liveness).
    #[must_use]
    pub fn http2_keepalive_interval(mut self, interval: Option<Duration>) -> Self {
        self.opts.http2_keepalive_interval = interval;
        self
    }

    /// How long an HTTP/2 keep-alive ping may go unanswered (HTTP/2 path
    /// and TCP).
    #[must_use]
    pub fn http2_keepalive_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.opts.http2_keepalive_timeout = timeout;
        self
    }

    /// HTTP/2 stream window (HTTP/2 path and TCP). The fast path's per-call
    /// window is [`RrpcConfig::call_window`].
    #[must_use]
    pub fn initial_stream_window_size(mut self, size: impl Into<Option<u32>>) -> Self {
        self.opts.initial_stream_window_size = size.into();
        self
    }

    /// HTTP/2 connection window (HTTP/2 path and TCP). The fast path has no
    /// connection window: the ring itself bounds a connection.
    #[must_use]
    pub fn initial_connection_window_size(mut self, size: impl Into<Option<u32>>) -> Self {
        self.opts.initial_connection_window_size = size.into();
        self
    }

    /// `TCP_NODELAY` on accepted TCP connections (the TCP leg of
    /// [`Router::serve_dual`] and `http://`; tonic's default: on).
    #[must_use]
    pub fn tcp_nodelay(mut self, on: bool) -> Self {
        self.opts.tcp_nodelay = Some(on);
        self
    }

    /// TCP keep-alive on accepted TCP connections (TCP leg only).
    #[must_use]
    pub fn tcp_keepalive(mut self, keepalive: Option<Duration>) -> Self {
        self.opts.tcp_keepalive = keepalive;
        self
    }

    /// Closes connections gracefully after this age, on every path: TCP
    /// and the HTTP/2 path by tonic, the fast path by rrpc (GOAWAY, calls
    /// in flight finish, then the connection closes). An [`crate::RrpcChannel`]
    /// then makes its next call on a new connection, as tonic's `Channel`.
    #[must_use]
    pub fn max_connection_age(mut self, age: Duration) -> Self {
        self.opts.max_connection_age = Some(age);
        self
    }

    /// The runtime state (poller, verbs device, pools, shared connections)
    /// the rings of [`Router::serve_rrpc`], [`Router::serve_rrpc_with_shutdown`]
    /// and [`Router::serve_dual`] use. Without it they use the config's
    /// shared context ([`RrpcContext::shared`]): every server and channel of an
    /// equal config in the process shares it. The context must have been
    /// made for a config with the same resource settings ([`RrpcContext`],
    /// "Which settings are the context's"), checked when the server binds.
    /// A listener bound beforehand ([`Router::serve_rrpc_incoming`]) keeps
    /// the context it was bound with ([`RrpcIncoming::bind_with_context`]).
    #[must_use]
    pub fn context(mut self, context: RrpcContext) -> Self {
        self.opts.context = Some(context);
        self
    }

    /// TLS on every leg that has it, as tonic's `Server::tls_config`, from
    /// [`crate::tls::ServerTlsConfig`] (tonic's twin: change the import).
    /// `http://`, `unix://` and the TCP leg of [`Router::serve_dual`] are
    /// tonic's own TLS; the `rrpc://` port then requires TLS of every
    /// client (HTTP/2 and rrpc's negotiation run inside it); the verbs side
    /// channel's handshake runs under the same identity. `shm://` and
    /// `inproc://` have no TLS. [`crate::tls`] has the details, including
    /// where `Request::peer_certs()` is not yet filled.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an identity or CA that does not parse,
    /// or a key that does not match its certificate.
    #[cfg(feature = "tls")]
    pub fn tls_config(mut self, tls: crate::tls::ServerTlsConfig) -> Result<Self, Error> {
        self.opts.tls = Some(Arc::new(crate::tls::ServerTls::new(&tls)?));
        Ok(self)
    }

    /// Adds a generated service (same bounds as tonic's).
    pub fn add_service<S>(self, svc: S) -> Router<L>
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        Router {
            layer: self.layer,
            services: Services::default().add(svc),
            opts: self.opts,
        }
    }

    /// Starts from ready-made tonic [`Routes`].
    pub fn add_routes(self, routes: Routes) -> Router<L> {
        Router {
            layer: self.layer,
            services: Services::foreign(routes),
            opts: self.opts,
        }
    }
}

/// Services plus layers, ready to serve on any transport.
#[derive(Debug, Clone)]
pub struct Router<L = Identity> {
    layer: L,
    /// tonic's router, and the same services by name for the fast path.
    services: Services,
    opts: Options,
}

impl<L> Router<L> {
    /// Adds another generated service.
    pub fn add_service<S>(mut self, svc: S) -> Self
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.services = self.services.add(svc);
        self
    }

    /// Adds a service if `Some` (as tonic's `add_optional_service`).
    pub fn add_optional_service<S>(self, svc: Option<S>) -> Self
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        match svc {
            Some(s) => self.add_service(s),
            None => self,
        }
    }
}

impl<L, ResBody> Router<L>
where
    L: Layer<Routes> + Clone + Send + Sync + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Error: Into<BoxError> + Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    /// Serves until an error; see [`Router::serve_rrpc_with_shutdown`].
    ///
    /// # Errors
    /// As [`Router::serve_rrpc_with_shutdown`].
    pub async fn serve_rrpc(self, uri: &str, config: RrpcConfig) -> Result<(), Error> {
        self.serve_rrpc_with_shutdown(uri, config, std::future::pending())
            .await
    }

    /// Serves on `uri` until `signal` completes, then drains gracefully:
    /// no new connections, new calls on open connections get `Unavailable`,
    /// calls in flight run to completion.
    ///
    /// `http://ip:port` and `unix:///path` serve plain tonic (the baselines);
    /// `shm://`, `rdma://` and `inproc://` serve rrpc, each connection on the
    /// fast path or HTTP/2 as negotiated.
    /// `rrpc://ip:port` serves both on one TCP port: plain HTTP/2 clients
    /// as `http://` does, rrpc clients on the fabric their negotiation
    /// picks (shm through a listener beside the port, or HTTP/2 on the same
    /// TCP connection; [`crate::port`]).
    ///
    /// # Errors
    /// [`Error::InvalidUri`], [`Error::UnsupportedTransport`] (e.g. `rdma://`
    /// without the verbs provider), [`Error::Io`] if the address is taken,
    /// [`Error::Transport`] from tonic.
    pub async fn serve_rrpc_with_shutdown<F>(
        self,
        uri: &str,
        config: RrpcConfig,
        signal: F,
    ) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let incoming = self.bind(uri, config)?;
        self.serve_rrpc_incoming(incoming, signal).await
    }

    /// Binds `uri` for [`Router::serve_rrpc_incoming`] with this server's
    /// settings: its TLS on an `rdma://` side channel
    /// (`Server::tls_config`, feature `tls`) and its [`Server::context`], if set. Use it
    /// rather than [`RrpcIncoming::bind`] when the server has TLS (for
    /// example to bind port 0 and learn the port before serving).
    ///
    /// # Errors
    /// As [`RrpcIncoming::bind`] and [`RrpcIncoming::bind_with_context`].
    pub fn bind(&self, uri: &str, config: RrpcConfig) -> Result<RrpcIncoming, Error> {
        let config = self.opts.with_side_channel_tls(config)?;
        match self.opts.context.clone() {
            Some(ctx) => RrpcIncoming::bind_with_context(uri, config, ctx),
            None => RrpcIncoming::bind(uri, config),
        }
    }

    /// Serves on a listener bound beforehand with [`Router::bind`] or [`RrpcIncoming::bind`]
    /// (for example at port 0, to learn the port the OS chose from
    /// [`RrpcIncoming::local_addr`] before serving), until `signal`
    /// completes, then drains as [`Router::serve_rrpc_with_shutdown`].
    ///
    /// # Errors
    /// [`Error::Transport`] from tonic, [`Error::Io`] from the listener;
    /// [`Error::InvalidConfig`] if this server has TLS
    /// (`Server::tls_config`, feature `tls`) and `incoming` has an `rdma://` side
    /// channel bound without it ([`Router::bind`] binds with it).
    pub async fn serve_rrpc_incoming<F>(
        self,
        incoming: RrpcIncoming,
        signal: F,
    ) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let Router {
            layer,
            services,
            opts,
        } = self;
        let RrpcIncoming {
            inner,
            uri,
            config,
            context,
        } = incoming;
        if opts.context.as_ref().is_some_and(|c| !c.ptr_eq(&context)) {
            tracing::warn!(
                %uri,
                "rrpc: the listener was bound with another context than Server::context; \
                 serving with the listener's"
            );
        }
        // The context lives until every connection of this server is done.
        let _context = context;
        let side_channel = match &inner {
            IncomingInner::Port(_, _, verbs) => verbs.is_some(),
            IncomingInner::Rings(l) => l.local_addr().is_some(),
            _ => false,
        };
        // A server with TLS never serves a side channel without it.
        if side_channel
            && opts.tls.is_some()
            && let Ok(c) = opts.with_side_channel_tls(config.clone())
            && c != config
        {
            tracing::error!(%uri, "rrpc: refusing to serve a plaintext rdma:// side channel");
            return Err(Error::InvalidConfig(
                "Server::tls_config is set and the listener was bound without it: its rdma:// \
                 side channel would run without TLS (bind it with Router::bind, or serve with \
                 serve_rrpc)",
            ));
        }
        // tonic's own TLS where tonic terminates the connections.
        let tonic_router = opts
            .tonic(matches!(
                inner,
                IncomingInner::Tcp(_) | IncomingInner::Unix(..)
            ))?
            .layer(layer.clone())
            .add_routes(services.routes().clone());
        match inner {
            IncomingInner::Tcp(listener) => {
                // The options tonic applies when it binds the address itself.
                let incoming = tonic::transport::server::TcpIncoming::from(listener)
                    .with_nodelay(Some(opts.tcp_nodelay.unwrap_or(true)))
                    .with_keepalive(opts.tcp_keepalive);
                Ok(tonic_router
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await?)
            }
            IncomingInner::Unix(listener, path) => {
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let r = tonic_router
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await;
                let _ = std::fs::remove_file(&path);
                Ok(r?)
            }
            IncomingInner::Rings(listener) => {
                let limits = Limits::new(&config);
                serve_rings(
                    listener, uri, limits, None, layer, services, opts, config, signal,
                )
                .await
            }
            IncomingInner::Port(listener, shm, verbs) => {
                // The TCP leg: every HTTP/2 connection the sniffer passes on
                // (plain clients and negotiated TCP) goes to tonic, with the
                // options tonic applies on `http://`.
                let incoming = tonic::transport::server::TcpIncoming::from(listener)
                    .with_nodelay(Some(opts.tcp_nodelay.unwrap_or(true)))
                    .with_keepalive(opts.tcp_keepalive);
                let token = CancellationToken::new();
                let (tx, rx) = mpsc::channel(16);
                // Connections inside TLS go to a tonic server of their own,
                // whose requests carry `TlsConnectInfo` (`peer_certs()`).
                #[cfg(feature = "tls")]
                let (tls_tx, tls_rx) = mpsc::channel(16);
                #[cfg(feature = "tls")]
                let tls_router = opts
                    .tonic(false)?
                    .layer(layer.clone())
                    .add_routes(services.routes().clone());
                let t = token.clone();
                let tls_leg = async move {
                    #[cfg(feature = "tls")]
                    tls_router
                        .serve_with_incoming_shutdown(ReceiverStream::new(tls_rx), t.cancelled())
                        .await?;
                    #[cfg(not(feature = "tls"))]
                    let _ = t;
                    Ok::<(), Error>(())
                };
                let to_tonic = crate::port::ToTonic {
                    plain: tx,
                    #[cfg(feature = "tls")]
                    tls: opts.tls.is_some().then_some(tls_tx),
                };
                // One set of limits for the port's TCP connections and both
                // ring legs: a peer is bounded over all of them.
                let limits = Limits::new(&config);
                let sniffer = crate::port::Sniffer {
                    tls: opts.tls.clone(),
                    limits: limits.clone(),
                    config: config.clone(),
                    shm: shm.as_ref().map(|(_, p)| p.clone()),
                    verbs: verbs
                        .as_ref()
                        .and_then(|l| l.local_addr())
                        .map(|a| a.port()),
                };
                let sniff = tokio::spawn(crate::port::sniff_loop(
                    incoming,
                    to_tonic,
                    sniffer,
                    token.clone(),
                ));
                let t = token.clone();
                let tcp = async move {
                    tonic_router
                        .serve_with_incoming_shutdown(ReceiverStream::new(rx), t.cancelled())
                        .await
                        .map_err(Error::from)
                };
                let (tls_rings, tls_rdma) = (opts.tls.clone(), opts.tls.clone());
                let t = token.clone();
                let (layer2, services2, opts2, config2, limits2) = (
                    layer.clone(),
                    services.clone(),
                    opts.clone(),
                    config.clone(),
                    limits.clone(),
                );
                let rings = async move {
                    match shm {
                        Some((l, path)) => {
                            let local = format!("shm://{}", path.display());
                            serve_rings(
                                l,
                                local,
                                limits,
                                tls_rings,
                                layer,
                                services,
                                opts,
                                config,
                                t.cancelled(),
                            )
                            .await
                        }
                        None => Ok(()),
                    }
                };
                let t = token.clone();
                let rdma = async move {
                    match verbs {
                        Some(l) => {
                            let local = l
                                .local_addr()
                                .map_or_else(|| "rdma://?".into(), |a| format!("rdma://{a}"));
                            serve_rings(
                                l,
                                local,
                                limits2,
                                tls_rdma,
                                layer2,
                                services2,
                                opts2,
                                config2,
                                t.cancelled(),
                            )
                            .await
                        }
                        None => Ok(()),
                    }
                };
                let sig = async move {
                    signal.await;
                    token.cancel();
                    Ok::<(), Error>(())
                };
                let r = tokio::try_join!(tcp, tls_leg, rings, rdma, sig).map(|_| ());
                sniff.abort();
                r
            }
        }
    }

    /// Serves TCP on `tcp` and rrpc on `uri` from the same services at once
    /// (RR-Compound keeps TCP available beside RDMA), until `signal`.
    ///
    /// # Errors
    /// The first error of either listener.
    pub async fn serve_dual<F>(
        self,
        tcp: SocketAddr,
        uri: &str,
        config: RrpcConfig,
        signal: F,
    ) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let token = CancellationToken::new();
        let (t1, t2) = (token.clone(), token.clone());
        let tcp_uri = format!("http://{tcp}");
        let a = self
            .clone()
            .serve_rrpc_with_shutdown(
                &tcp_uri,
                config.clone(),
                async move { t1.cancelled().await },
            );
        let b = self.serve_rrpc_with_shutdown(uri, config, async move { t2.cancelled().await });
        let sig = async move {
            signal.await;
            token.cancel();
            Ok::<(), Error>(())
        };
        tokio::try_join!(a, b, sig).map(|_| ())
    }
}

/// A listener bound to an rrpc URI, not yet serving: tonic's
/// `TcpIncoming`, for every transport. Bind at port 0 (`rdma://host:0`,
/// `http://host:0`), read the chosen address, hand the URI to clients,
/// then serve with [`Router::serve_rrpc_incoming`]; no other process can
/// take the port in between.
#[derive(Debug)]
pub struct RrpcIncoming {
    inner: IncomingInner,
    uri: String,
    config: RrpcConfig,
    context: RrpcContext,
}

#[derive(Debug)]
enum IncomingInner {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, std::path::PathBuf),
    Rings(RrpcListener),
    /// `rrpc://`: the TCP port and, unless its config leaves shm out, the
    /// shm listener beside it with its socket path, and the `rdma://` side
    /// channel when verbs is allowed and the device opened ([`crate::port`]).
    Port(
        tokio::net::TcpListener,
        Option<(RrpcListener, std::path::PathBuf)>,
        Option<RrpcListener>,
    ),
}

/// The `rdma://` side channel of an `rrpc://` port, on the port's address
/// (the OS picks its port): when the config allows verbs and this build
/// and host have an active device. Without a device the port serves the
/// other fabrics, unless verbs is all the config allows.
fn port_verbs_listener(
    ip: std::net::IpAddr,
    config: &RrpcConfig,
    context: &RrpcContext,
) -> Result<Option<RrpcListener>, Error> {
    if !config.allows(crate::Fabric::Verbs) || !cfg!(feature = "verbs") {
        return Ok(None);
    }
    let uri = rrpc_core::FabricUri::Rdma {
        host: ip.to_string(),
        port: 0,
    };
    match RrpcListener::bind(&Target::Rdma(uri), config, context) {
        Ok(l) => {
            tracing::info!(
                side_channel = ?l.local_addr(),
                "rrpc port: verbs offered through an rdma:// side channel"
            );
            Ok(Some(l))
        }
        Err(e) if config.fabrics() == [crate::Fabric::Verbs] => Err(e),
        Err(e) => {
            tracing::info!(
                error = %e,
                "rrpc port: no verbs (the device did not open); serving the other fabrics"
            );
            Ok(None)
        }
    }
}

impl RrpcIncoming {
    /// Binds `uri` (any scheme [`Router::serve_rrpc`] takes) with `config`
    /// for the connections it will accept, in the config's shared
    /// [`RrpcContext`] ([`RrpcContext::shared`]). Must be called inside a tokio
    /// runtime. For `rdma://` this opens the device, so a missing device
    /// fails here.
    ///
    /// # Errors
    /// [`Error::InvalidUri`], [`Error::UnsupportedTransport`], [`Error::Io`]
    /// if the address is taken, or the provider's error.
    pub fn bind(uri: &str, config: RrpcConfig) -> Result<Self, Error> {
        let context = RrpcContext::shared(&config);
        Self::bind_in(uri, config, context)
    }

    /// [`RrpcIncoming::bind`] with `context`'s runtime state (poller, verbs
    /// device, pools, shared connections) instead of the config's shared
    /// one.
    ///
    /// # Errors
    /// As [`RrpcIncoming::bind`]; [`Error::InvalidConfig`] if `context` was
    /// made for a config with other resource settings ([`RrpcContext`]).
    pub fn bind_with_context(
        uri: &str,
        config: RrpcConfig,
        context: RrpcContext,
    ) -> Result<Self, Error> {
        context.check(&config)?;
        Self::bind_in(uri, config, context)
    }

    fn bind_in(uri: &str, config: RrpcConfig, context: RrpcContext) -> Result<Self, Error> {
        let target = Target::parse(uri)?;
        let inner = match &target {
            Target::Tcp(addr) => {
                let l = std::net::TcpListener::bind(Target::tcp_addr(addr)?)?;
                l.set_nonblocking(true)?;
                IncomingInner::Tcp(tokio::net::TcpListener::from_std(l)?)
            }
            Target::Unix(path) => {
                IncomingInner::Unix(tokio::net::UnixListener::bind(path)?, path.clone())
            }
            Target::Port(p) => {
                let l = std::net::TcpListener::bind(Target::tcp_addr(p.addr())?)?;
                l.set_nonblocking(true)?;
                let port = l.local_addr()?.port();
                let shm = if config.allows(crate::Fabric::Shm) {
                    let path = crate::port::shm_socket_path(port);
                    let shm = RrpcListener::bind(&Target::Shm(path.clone()), &config, &context)?;
                    Some((shm, path))
                } else {
                    None
                };
                let verbs = port_verbs_listener(l.local_addr()?.ip(), &config, &context)?;
                IncomingInner::Port(tokio::net::TcpListener::from_std(l)?, shm, verbs)
            }
            t => IncomingInner::Rings(RrpcListener::bind(t, &config, &context)?),
        };
        let mut incoming = RrpcIncoming {
            inner,
            uri: uri.to_string(),
            config,
            context,
        };
        if let (Some(addr), Some(scheme)) = (incoming.local_addr(), uri.split("://").next()) {
            incoming.uri = format!("{scheme}://{addr}");
        }
        Ok(incoming)
    }

    /// The bound socket address, for `http://`, `rrpc://` and `rdma://`
    /// (whose side channel is TCP); `None` for `unix://`, `shm://` and `inproc://`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.inner {
            IncomingInner::Tcp(l) => l.local_addr().ok(),
            IncomingInner::Unix(..) => None,
            IncomingInner::Rings(l) => l.local_addr(),
            IncomingInner::Port(l, ..) => l.local_addr().ok(),
        }
    }

    /// The URI clients dial: the one bound, with the port the OS chose.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The [`RrpcContext`] this listener's connections use (its pools, the
    /// shared connections it accepts, its poller).
    pub fn context(&self) -> &RrpcContext {
        &self.context
    }
}

/// Serves one ring listener until `signal`: every connection holds a slot
/// of `limits` (shared by every listener of the server) from its accept to
/// its end; a client past a limit is refused with the reason instead of
/// served (`port::limits`).
///
/// `tls`: the listener is a ring leg of an `rrpc://` port with TLS; every
/// connection must first present the ticket of the TLS session its
/// negotiation ran in ([`crate::tls::Ticket`]), or is closed, and its calls
/// carry that session's peer (`Request::peer_certs()`; fast path only).
#[allow(clippy::too_many_arguments)]
async fn serve_rings<L, ResBody, F>(
    mut listener: RrpcListener,
    local: String,
    limits: std::sync::Arc<Limits>,
    tls: Option<Arc<crate::tls::ServerTls>>,
    layer: L,
    services: Services,
    opts: Options,
    config: RrpcConfig,
    signal: F,
) -> Result<(), Error>
where
    L: Layer<Routes> + Clone + Send + Sync + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Error: Into<BoxError> + Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    F: Future<Output = ()> + Send,
{
    if tls.is_none() && config.ring_encryption() == crate::RingEncryption::Required {
        return Err(Error::RingEncryption(
            "RrpcConfig::ring_encryption is Required and this server's rings have no TLS to \
             key it: serve an rrpc:// port with Server::tls_config (feature `tls`)"
                .into(),
        ));
    }
    let token = CancellationToken::new();
    // HTTP/2 connections go to tonic's own server, fed through this queue.
    // Each carries the TLS peer its ticket named (a TLS port's rings), which
    // the outermost layer moves into its requests.
    let (h2_tx, h2_rx) = mpsc::channel::<Result<WithPeer<Counted<RrpcStream>>, std::io::Error>>(16);
    let h2_token = token.clone();
    let tonic_router = opts
        .tonic(false)?
        .layer(tower::util::MapRequestLayer::new(
            crate::tls::split_peer::<RrpcConnectInfo>
                as fn(http::Request<Body>) -> http::Request<Body>,
        ))
        .layer(layer.clone())
        .add_routes(services.routes().clone());
    let fast_opts = opts.fast();
    let h2_task = tokio::spawn(async move {
        tonic_router
            .serve_with_incoming_shutdown(ReceiverStream::new(h2_rx), async move {
                h2_token.cancelled().await
            })
            .await
    });
    // With no server-wide layer, the fast path calls each service directly
    // (`dispatch`); a layer wraps the router as a whole, as in tonic.
    let direct = if std::any::TypeId::of::<L>() == std::any::TypeId::of::<Identity>() {
        services.direct()
    } else {
        None
    };
    let svc = layer.layer(services.routes().clone().prepare());
    let mut conns = JoinSet::new();
    // `inproc://` connections, on their clients' runtimes (`Accepted::in_place`).
    let mut inproc = JoinSet::new();
    let mut signal = std::pin::pin!(signal);
    let setups = Arc::new(Semaphore::new(config.max_pending_handshakes()));
    // Every branch is cancel safe: `accept` only takes a client off the
    // socket (its handshake runs in the connection's own task, bounded by
    // `handshake_timeout`), so a connection ending, or a shutdown, never
    // cuts a handshake short.
    loop {
        tokio::select! {
            biased;
            _ = &mut signal => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            Some(_) = inproc.join_next(), if !inproc.is_empty() => {}
            a = listener.accept() => {
                let Some(accepted) = a else { break };
                let Ok(permit) = setups.clone().try_acquire_owned() else {
                    tracing::warn!(
                        peer = %accepted.peer(),
                        limit = config.max_pending_handshakes(),
                        "rrpc: too many connections in setup; closing the new one",
                    );
                    continue;
                };
                // The connection's place under the limits, from now until
                // it ends (its handshake included); refused, the client
                // reads why, within the handshake timeout.
                let slot = match limits.admit(accepted.peer_id()) {
                    Ok(slot) => slot,
                    Err(refusal) => {
                        let limit = config.handshake_timeout();
                        conns.spawn(async move {
                            let peer = accepted.peer();
                            match tokio::time::timeout(limit, accepted.refuse(refusal.message())).await {
                                Ok(Ok(())) => {}
                                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "rrpc: refusing a connection failed"),
                                Err(_) => tracing::debug!(%peer, "rrpc: a refused client sent no hello in time"),
                            }
                            drop(permit);
                        });
                        continue;
                    }
                };
                let (svc, direct, config, token, h2_tx, tls) = (svc.clone(), direct.clone(), config.clone(), token.child_token(), h2_tx.clone(), tls.clone());
                let info = RrpcConnectInfo { local: local.clone() };
                let in_place = accepted.in_place();
                let conn = async move {
                    let peer = accepted.peer();
                    let limit = config.handshake_timeout();
                    let setup = accepted.establish(&config);
                    let r = match tokio::time::timeout(limit, setup).await {
                        Ok(r) => r,
                        Err(_) => Err(Error::Handshake(format!(
                            "connection setup took longer than {limit:?}"
                        ))),
                    };
                    drop(permit);
                    // On a TLS port: the ticket first, redeemed for the
                    // TLS session's peer.
                    let r = match (r, &tls) {
                        (Ok(Established::Pipe(mut pipe, path)), Some(tls)) => {
                            // Cancel safe: cancelled, the connection is
                            // dropped unserved (a shutdown must not wait
                            // for a client that never presents a ticket).
                            let redeemed = tokio::select! {
                                r = redeem(&mut pipe, tls, &config) => r,
                                () = token.cancelled() => Err(Error::Closed(
                                    "the server shut down before the ring connection presented its TLS ticket",
                                )),
                            };
                            match redeemed {
                                Ok(peer_info) => Ok((Established::Pipe(pipe, path), peer_info)),
                                Err(e) => Err(e),
                            }
                        }
                        // Without TLS, no keys: a connection this
                        // server would seal is refused.
                        (Ok(Established::Pipe(pipe, _)), None) if crate::tls::seals(&config, &pipe) => {
                            Err(crate::tls::needs_tls())
                        }
                        (r, _) => r.map(|e| (e, None)),
                    };
                    match r {
                        Ok((Established::Pipe(pipe, Negotiated::Fast { peer_window }), peer_info)) => {
                            tracing::debug!(%peer, "rrpc connection on the fast path");
                            // At its age the connection drains as on shutdown.
                            let (aging, aged) = (token.clone(), peer.clone());
                            let age = async move {
                                if let Some(age) = fast_opts.max_connection_age {
                                    tokio::time::sleep(age).await;
                                    tracing::debug!(peer = %aged, ?age, "rrpc: connection reached its max age; draining");
                                    aging.cancel();
                                }
                                std::future::pending::<()>().await
                            };
                            let serve = async move {
                                #[cfg(feature = "tls")]
                                if let Some(i) = peer_info {
                                    return match direct {
                                        Some(d) => serve_conn(pipe, with_peer(d, i), config, token, peer_window, fast_opts).await,
                                        None => serve_conn(pipe, with_peer(svc, i), config, token, peer_window, fast_opts).await,
                                    };
                                }
                                #[cfg(not(feature = "tls"))]
                                let _ = peer_info;
                                match direct {
                                    Some(d) => serve_conn(pipe, d, config, token, peer_window, fast_opts).await,
                                    None => serve_conn(pipe, svc, config, token, peer_window, fast_opts).await,
                                }
                            };
                            let served = tokio::select! {
                                r = serve => r,
                                () = age => unreachable!("pending"),
                            };
                            drop(slot);
                            if let Err(e) = served
                            {
                                tracing::warn!(%peer, error = %e, "rrpc connection failed");
                            }
                        }
                        Ok((Established::Pipe(pipe, Negotiated::Http2), peer_info)) => {
                            tracing::debug!(%peer, "rrpc connection on the HTTP/2 path");
                            let stream = Counted::new(RrpcStream::new(pipe, info), slot);
                            let stream = WithPeer { inner: stream, peer: peer_info };
                            let _ = h2_tx.send(Ok(stream)).await;
                        }
                        Ok((Established::Shared, _)) => {
                            // Nothing to serve on it: each logical
                            // connection over it takes a slot of its own.
                            drop(slot);
                            tracing::debug!(%peer, "rrpc shared connection opened");
                        }
                        Err(e) => tracing::warn!(%peer, error = %e, "rrpc connection setup failed"),
                    }
                };
                match in_place {
                    // `inproc://`: on the dialing client's runtime, and in
                    // place on its sends.
                    Some(host) => {
                        let rt = host.runtime().clone();
                        inproc.spawn_on(host.drive(conn), &rt);
                    }
                    None => {
                        conns.spawn(conn);
                    }
                }
            }
        }
    }
    drop(listener);
    token.cancel();
    while conns.join_next().await.is_some() {}
    // An `inproc://` connection runs only while its client's runtime runs:
    // a current-thread runtime that its thread is not driving holds it
    // still. Its drain is awaited for as long as a client's handshake may
    // take, then left to end, on its token, when that runtime runs again.
    let grace = config.handshake_timeout();
    let drained =
        tokio::time::timeout(grace, async { while inproc.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::debug!(
            left = inproc.len(),
            ?grace,
            "rrpc: in-process connections whose client runtime is idle are left to end there"
        );
        inproc.detach_all();
    }
    drop(h2_tx);
    match h2_task.await {
        Ok(r) => Ok(r?),
        Err(e) => Err(Error::Io(std::io::Error::other(e))),
    }
}

/// Reads a ring connection's ticket and redeems it for its TLS session's
/// peer ([`crate::tls::Ticket`]), agreeing on ring encryption and sealing
/// the pipe when agreed ([`crate::tls::accept_ticket`]); a connection
/// without a valid ticket, or that disagrees, is refused (told why, then
/// closed). Waits as long as the connection lives: a spare connection
/// presents its ticket when a channel takes it.
async fn redeem(
    pipe: &mut crate::conn::Pipe,
    tls: &crate::tls::ServerTls,
    config: &RrpcConfig,
) -> Result<Option<crate::tls::PeerInfo>, Error> {
    #[cfg(feature = "tls")]
    {
        crate::tls::accept_ticket(pipe, tls, config).await.map(Some)
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = (pipe, config);
        match *tls {}
    }
}

/// `svc` with `peer` in every request's extensions (tonic's
/// `TlsConnectInfo`, which `Request::peer_certs()` reads).
#[cfg(feature = "tls")]
fn with_peer<S>(
    svc: S,
    peer: crate::tls::PeerInfo,
) -> tower::util::MapRequest<S, impl FnMut(http::Request<Body>) -> http::Request<Body> + Clone> {
    tower::util::MapRequest::new(svc, move |mut req: http::Request<Body>| {
        req.extensions_mut().insert(peer.clone());
        req
    })
}
