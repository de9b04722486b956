//! The client builder: [`RrpcEndpoint`], tonic's `Endpoint` for every rrpc
//! URI, and the constructors of [`RrpcChannel`] that take one.
//!
//! On `http://` and `unix://` every option goes to tonic's own `Endpoint`,
//! so those channels are exactly tonic's. On the rings (`shm://`,
//! `rdma://`, `inproc://`) a channel owns one connection at a time and
//! replaces it when it fails ([`crate::client::managed`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use tower::Service;

use crate::call::{BoxError, Carrier, ChannelPath, tonic_user_agent};
use crate::client::channel::RrpcChannel;
use crate::client::managed::{Conn, Dialer, Managed};
use crate::fast::client::CallOptions;
use crate::transport::Target;
use crate::{Error, RrpcConfig, RrpcContext};

/// A client endpoint: the URI, the [`RrpcConfig`] and the options of
/// `tonic::transport::Endpoint`, for every path.
///
/// ```no_run
/// # async fn run() -> Result<(), rrpc_tonic::Error> {
/// use std::time::Duration;
/// use rrpc_tonic::{RrpcConfig, RrpcEndpoint};
/// let channel = RrpcEndpoint::new("shm:///run/greeter.sock")?
///     .config(RrpcConfig::default())
///     .timeout(Duration::from_secs(1))
///     .connect_timeout(Duration::from_millis(500))
///     .user_agent("my-app/1.0")?
///     .connect_lazy()?;             // connects at the first call, reconnects after a failure
/// // let mut client = GreeterClient::new(channel);
/// # let _ = channel; Ok(()) }
/// ```
///
/// | option | fast path | HTTP/2 path over rings | `http://`, `unix://` |
/// |---|---|---|---|
/// | [`connect_lazy`](Self::connect_lazy) | connects at the first call | same | tonic's |
/// | reconnect after a failure | the next call dials again | tonic's, over a new ring connection | tonic's |
/// | [`timeout`](Self::timeout) | shorter of it and `grpc-timeout`, covers the whole call, `DeadlineExceeded` | same (rrpc bounds the response body and maps tonic's status) | tonic's: `Cancelled` "Timeout expired", response headers only |
/// | [`connect_timeout`](Self::connect_timeout) | bounds the side-channel connect, handshake and path negotiation | same | tonic's |
/// | [`user_agent`](Self::user_agent) | `"<yours> tonic/<version>"`, as tonic | tonic's | tonic's |
/// | [`origin`](Self::origin) | sent as the request's authority | tonic's | tonic's |
/// | [`concurrency_limit`](Self::concurrency_limit), [`rate_limit`](Self::rate_limit) | tower's layers behind a buffer, as tonic stacks them | same | tonic's |
/// | keep-alive, windows, `tcp_*` | not needed: the side channel reports a dead peer; [`RrpcConfig::call_window`] | passed to hyper | tonic's |
/// | `tls_config` (feature `tls`, [`crate::tls`]) | `rrpc://`: the negotiation inside TLS, the ring connection bound to it by a ticket; `rdma://`: the side channel's handshake | same | tonic's (`https://`) |
///
/// Calls made while the connection is down fail with `Unavailable` (the
/// connect error), and the next call tries again, as with tonic.
///
/// On `rrpc://host:port` ([`crate::port`]) `connect` negotiates the fabric
/// with the server first: shm on the same host (a ring channel that
/// reconnects through the port), else HTTP/2 on the negotiated TCP
/// connection (tonic's channel, each new connection negotiated by its
/// connector); [`RrpcConfig::fabrics`] restricts the choice and
/// [`RrpcChannel::carrier`] reports it. A context that connected through
/// the port on rings within [`RrpcConfig::peer_lease`] dials the ring
/// endpoint the port named then, with no negotiation (and negotiates
/// again if it does not connect); with TLS every connect negotiates.
///
/// **`connect_lazy` on `rrpc://` does not negotiate: with TCP allowed (the
/// default) it is always TCP**, even on one host where shm is available
/// and `connect` would choose it; calls then cost what HTTP/2 over TCP
/// costs (about 20x a shm call's time on one host), and nothing fails or
/// warns. Only a config that forbids TCP ([`RrpcConfig::fabrics`]) makes
/// a lazy `rrpc://` channel use rings: shm when allowed, else verbs. Use
/// `connect` on `rrpc://` to get the best shared fabric, or connect lazily
/// on `shm://` / `rdma://` when the fabric is known.
#[derive(Debug, Clone)]
pub struct RrpcEndpoint {
    uri: String,
    target: Target,
    config: RrpcConfig,
    context: Option<RrpcContext>,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    user_agent: Option<HeaderValue>,
    origin: Option<http::Uri>,
    concurrency_limit: Option<usize>,
    rate_limit: Option<(u64, Duration)>,
    buffer_size: Option<usize>,
    tcp_nodelay: bool,
    tcp_keepalive: Option<Duration>,
    http2_keep_alive_interval: Option<Duration>,
    keep_alive_timeout: Option<Duration>,
    keep_alive_while_idle: Option<bool>,
    initial_stream_window_size: Option<u32>,
    initial_connection_window_size: Option<u32>,
    /// TLS ([`RrpcEndpoint::tls_config`]).
    tls: Option<Arc<crate::tls::ClientTls>>,
}

/// Requests a buffered channel holds when its own size is not set (tonic's).
const DEFAULT_BUFFER_SIZE: usize = 1024;

impl RrpcEndpoint {
    /// An endpoint for `uri` (`http://`, `unix://`, `shm://`, `rdma://`,
    /// `inproc://`, `rrpc://`) with [`RrpcConfig::default`] and tonic's defaults.
    ///
    /// # Errors
    /// [`Error::InvalidUri`]; [`Error::UnsupportedTransport`] for `rdma://`
    /// in a build without the `verbs` feature.
    pub fn new(uri: impl Into<String>) -> Result<Self, Error> {
        let uri = uri.into();
        let target = Target::parse(&uri)?;
        #[cfg(not(feature = "verbs"))]
        if matches!(target, Target::Rdma(_)) {
            return Err(crate::error::rdma_unavailable());
        }
        Ok(RrpcEndpoint {
            uri,
            target,
            config: RrpcConfig::default(),
            context: None,
            timeout: None,
            connect_timeout: None,
            user_agent: None,
            origin: None,
            concurrency_limit: None,
            rate_limit: None,
            buffer_size: None,
            tcp_nodelay: true,
            tcp_keepalive: None,
            http2_keep_alive_interval: None,
            keep_alive_timeout: None,
            keep_alive_while_idle: None,
            initial_stream_window_size: None,
            initial_connection_window_size: None,
            tls: None,
        })
    }

    /// The URI as given.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// TLS, as tonic's `Endpoint::tls_config`, from
    /// [`crate::tls::ClientTlsConfig`] (tonic's twin: change the import).
    /// `http://` and `unix://` connect with tonic's own TLS (as `https://`);
    /// on `rrpc://` the negotiation runs inside TLS, and so does HTTP/2 when
    /// the fabric is TCP; `rdma://` (and verbs through the port) runs its
    /// side channel's handshake under it (feature `verbs`; a config that
    /// sets `RrpcConfigBuilder::tls_client` itself keeps its own).
    /// `shm://` and `inproc://` have no TLS. [`crate::tls`] has the details.
    /// Build the endpoint once and clone it: with `verbs`, the side channel's
    /// TLS client is part of the connection's config, compared by identity,
    /// so an endpoint built again with its own `tls_config` shares no
    /// spare connections with the first.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a CA or identity that does not parse, or
    /// no CA at all (rrpc loads no system roots).
    #[cfg(feature = "tls")]
    pub fn tls_config(self, tls: crate::tls::ClientTlsConfig) -> Result<Self, Error> {
        let tls = Some(Arc::new(crate::tls::ClientTls::new(&tls)?));
        let target = match &self.target {
            Target::Port(p) => Target::Port(p.with_tls(tls.clone())),
            t => t.clone(),
        };
        Ok(RrpcEndpoint {
            tls,
            target,
            ..self
        })
    }

    /// The rings' configuration (ignored by `http://` and `unix://`).
    pub fn config(self, config: RrpcConfig) -> Self {
        RrpcEndpoint { config, ..self }
    }

    /// The runtime state (poller, verbs device, pools, shared connections)
    /// this endpoint's channels use on the rings. Without it they use the
    /// config's shared context ([`RrpcContext::shared`], made when a channel
    /// connects): every channel of an equal config shares it. The context
    /// must have been made for a config with the same resource settings
    /// ([`RrpcContext`], "Which settings are the context's"), checked when a
    /// channel is made. Ignored by `http://` and `unix://`.
    pub fn context(self, context: RrpcContext) -> Self {
        RrpcEndpoint {
            context: Some(context),
            ..self
        }
    }

    /// The context the rings use: the one given, else the config's shared one.
    fn resolve_context(&self) -> Result<RrpcContext, Error> {
        match &self.context {
            Some(c) => {
                c.check(&self.config)?;
                Ok(c.clone())
            }
            None => Ok(RrpcContext::shared(&self.config)),
        }
    }

    /// A timeout on every call, as tonic's `Endpoint::timeout`: the shorter
    /// of it and the call's own deadline applies, and it is not sent to
    /// the server. An expired call fails with `DeadlineExceeded` on rings
    /// (gRPC's rule: the deadline covers the whole call), with tonic's
    /// `Cancelled` "Timeout expired" on `http://` and `unix://`.
    pub fn timeout(self, dur: Duration) -> Self {
        RrpcEndpoint {
            timeout: Some(dur),
            ..self
        }
    }

    /// A bound on each connection attempt: on rings the side-channel
    /// connect, the fabric handshake and the path negotiation together.
    /// A connect that takes longer fails with [`Error::ConnectTimeout`].
    pub fn connect_timeout(self, dur: Duration) -> Self {
        RrpcEndpoint {
            connect_timeout: Some(dur),
            ..self
        }
    }

    /// Sets the `user-agent` sent with every call; tonic's own
    /// (`tonic/<version>`) follows it, as with tonic.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if it is not a valid header value.
    pub fn user_agent<T>(self, user_agent: T) -> Result<Self, Error>
    where
        T: TryInto<HeaderValue>,
    {
        let ua = user_agent
            .try_into()
            .map_err(|_| Error::InvalidConfig("user agent is not a valid header value"))?;
        Ok(RrpcEndpoint {
            user_agent: Some(ua),
            ..self
        })
    }

    /// The origin (scheme and authority) set on every request, as tonic's
    /// `Endpoint::origin`; the server's `req.uri()` carries its authority
    /// on every path.
    pub fn origin(self, origin: http::Uri) -> Self {
        RrpcEndpoint {
            origin: Some(origin),
            ..self
        }
    }

    /// At most `limit` calls in flight on this channel; more wait (tower's
    /// `ConcurrencyLimit`, as tonic).
    pub fn concurrency_limit(self, limit: usize) -> Self {
        RrpcEndpoint {
            concurrency_limit: Some(limit),
            ..self
        }
    }

    /// At most `limit` calls per `duration`; more wait (tower's
    /// `RateLimit`, as tonic).
    pub fn rate_limit(self, limit: u64, duration: Duration) -> Self {
        RrpcEndpoint {
            rate_limit: Some((limit, duration)),
            ..self
        }
    }

    /// Requests a limited channel buffers (tonic's `buffer_size`; 1024).
    pub fn buffer_size(self, size: impl Into<Option<usize>>) -> Self {
        RrpcEndpoint {
            buffer_size: size.into(),
            ..self
        }
    }

    /// TCP_NODELAY on `http://` (tonic's default: on). No effect on rings.
    pub fn tcp_nodelay(self, enabled: bool) -> Self {
        RrpcEndpoint {
            tcp_nodelay: enabled,
            ..self
        }
    }

    /// TCP keep-alive on `http://`. No effect on rings (their side channel
    /// reports a peer that leaves).
    pub fn tcp_keepalive(self, keepalive: Option<Duration>) -> Self {
        RrpcEndpoint {
            tcp_keepalive: keepalive,
            ..self
        }
    }

    /// HTTP/2 PING interval (`http://`, `unix://`, HTTP/2 over rings).
    pub fn http2_keep_alive_interval(self, interval: Duration) -> Self {
        RrpcEndpoint {
            http2_keep_alive_interval: Some(interval),
            ..self
        }
    }

    /// How long to wait for an HTTP/2 PING's answer.
    pub fn keep_alive_timeout(self, duration: Duration) -> Self {
        RrpcEndpoint {
            keep_alive_timeout: Some(duration),
            ..self
        }
    }

    /// Whether HTTP/2 PINGs go out while no call is open.
    pub fn keep_alive_while_idle(self, enabled: bool) -> Self {
        RrpcEndpoint {
            keep_alive_while_idle: Some(enabled),
            ..self
        }
    }

    /// HTTP/2's initial stream window; the fast path's is
    /// [`RrpcConfig::call_window`].
    pub fn initial_stream_window_size(self, size: impl Into<Option<u32>>) -> Self {
        RrpcEndpoint {
            initial_stream_window_size: size.into(),
            ..self
        }
    }

    /// HTTP/2's initial connection window (the fast path has none: the
    /// ring bounds a connection).
    pub fn initial_connection_window_size(self, size: impl Into<Option<u32>>) -> Self {
        RrpcEndpoint {
            initial_connection_window_size: size.into(),
            ..self
        }
    }

    /// Connects now, and reconnects later when the connection fails.
    ///
    /// # Errors
    /// [`Error::NotListening`], [`Error::Handshake`], [`Error::ConnectTimeout`],
    /// [`Error::Transport`], and configuration errors.
    pub async fn connect(&self) -> Result<RrpcChannel, Error> {
        match &self.target {
            Target::Tcp(addr) => {
                let ep = self.tcp_endpoint(addr)?;
                Ok(RrpcChannel::tonic(
                    ep.connect().await?,
                    ChannelPath::Tcp,
                    Carrier::Tcp,
                ))
            }
            Target::Unix(path) => {
                let ep = self.tcp_endpoint("localhost")?;
                let ch = ep.connect_with_connector(unix_connector(path)).await?;
                Ok(RrpcChannel::tonic(ch, ChannelPath::Unix, Carrier::Unix))
            }
            Target::Port(p) => self.connect_port(p).await,
            _ => {
                let ctx = self.resolve_context()?;
                let carrier = carrier_of(&self.target, &ctx)?;
                let dialer = self.dialer(ctx)?;
                let conn = dialer.clone().connection().await?;
                Ok(self.rings(dialer, Some(conn), carrier))
            }
        }
    }

    /// A channel that connects at its first call, and reconnects later when
    /// the connection fails (tonic's `connect_lazy`). Needs a tokio runtime.
    ///
    /// **On `rrpc://` with TCP allowed (the default config) the channel is
    /// always HTTP/2 over TCP**: it does not negotiate the fabric at its
    /// first call, so a client on the server's own host does not get shm
    /// (about 20x slower calls, silently; [`RrpcChannel::carrier`] says
    /// [`Carrier::Tcp`]). With TCP forbidden ([`RrpcConfig::fabrics`]) it
    /// takes rings: shm if allowed, else verbs. [`connect`](Self::connect)
    /// negotiates and picks the best fabric both ends share.
    ///
    /// # Errors
    /// Only configuration errors (an `rdma://` device that cannot be
    /// opened); it never connects here.
    pub fn connect_lazy(&self) -> Result<RrpcChannel, Error> {
        match &self.target {
            Target::Tcp(addr) => {
                let ep = self.tcp_endpoint(addr)?;
                Ok(RrpcChannel::tonic(
                    ep.connect_lazy(),
                    ChannelPath::Tcp,
                    Carrier::Tcp,
                ))
            }
            Target::Unix(path) => {
                let ep = self.tcp_endpoint("localhost")?;
                let ch = ep.connect_with_connector_lazy(unix_connector(path));
                Ok(RrpcChannel::tonic(ch, ChannelPath::Unix, Carrier::Unix))
            }
            // Lazily, the choice cannot wait for the first call: TCP
            // (negotiated per connection) unless the config forbids it;
            // then rings (shm or verbs), whose carrier the live connection
            // reports once it has connected.
            Target::Port(p) if !self.config.allows(crate::Fabric::Tcp) => {
                let ctx = self.resolve_context()?;
                let dialer = self.port_dialer(p.clone(), ctx)?;
                let carrier = if self.config.allows(crate::Fabric::Shm) {
                    Carrier::Shm
                } else {
                    Carrier::Verbs {
                        device: String::new(),
                        peer: None,
                    }
                };
                Ok(self.rings(dialer, None, carrier))
            }
            Target::Port(p) => {
                let ep = self.tonic_endpoint(format!("http://{}", p.addr()), true)?;
                let ch = ep.connect_with_connector_lazy(self.port_tcp_connector(p, None));
                Ok(RrpcChannel::tonic(ch, ChannelPath::Tcp, Carrier::Tcp))
            }
            _ => {
                let ctx = self.resolve_context()?;
                let carrier = carrier_of(&self.target, &ctx)?;
                Ok(self.rings(self.dialer(ctx)?, None, carrier))
            }
        }
    }

    /// `rrpc://`: negotiates on the port, then connects on the fabric
    /// chosen: shm or verbs through the side listener the server named
    /// (falling back to TCP, when allowed, if it cannot be reached: the
    /// shm socket from another host, or the verbs side channel without a
    /// device or a route to the server's GID), or tonic on the TCP
    /// connection the negotiation ran on.
    async fn connect_port(&self, p: &crate::port::PortTarget) -> Result<RrpcChannel, Error> {
        use crate::port::{Chosen, negotiate};
        let limit = self
            .connect_timeout
            .unwrap_or(self.config.handshake_timeout());
        // The port named a ring endpoint to this context lately: dialed
        // straight away, the negotiation folded into the ring handshake
        // (`context::PortMemo`); a failure to connect there (the server
        // restarted) negotiates again below.
        let bits = self.config.fabric_bits();
        let memo = match (p.tls(), self.resolve_context()) {
            (None, Ok(ctx)) => ctx
                .ports()
                .get(p.addr(), bits, self.config.peer_lease(), Instant::now())
                .map(|ep| (ctx, ep)),
            _ => None,
        };
        if let Some((ctx, ep)) = memo {
            let carrier = match &ep {
                rrpc_core::FabricAddr::Shm(_) => Carrier::Shm,
                _ => Carrier::Verbs {
                    device: String::new(),
                    peer: None,
                },
            };
            let dialer = self.port_dialer(p.with_hint(ep.clone(), None), ctx.clone())?;
            match dialer.clone().connection().await {
                Ok(conn) => {
                    ctx.ports().put(p.addr(), bits, ep, Instant::now());
                    return Ok(self.rings(dialer, Some(conn), carrier));
                }
                // A server answered there and said no: a negotiation would
                // lead to the same answer. A limit is the live server's; a
                // refused token is forgotten too (on `rdma://` another
                // server may have taken the side channel's port since), so
                // the next connect negotiates.
                Err(e) if e.code() == tonic::Code::ResourceExhausted => return Err(e),
                Err(e) if e.code() == tonic::Code::Unauthenticated => {
                    ctx.ports().forget(p.addr(), bits, &ep);
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!(
                        addr = %p.addr(), endpoint = %ep, error = %e,
                        "rrpc: the ring endpoint the port named before did not connect; negotiating"
                    );
                    ctx.ports().forget(p.addr(), bits, &ep);
                }
            }
        }
        let (ep, ticket, carrier, fabric, shown) = match negotiate(
            p.addr(),
            self.config.fabric_bits(),
            limit,
            p.tls().map(|t| &**t),
        )
        .await?
        {
            Chosen::Tcp(s) => return self.port_tcp(p, s).await,
            Chosen::Shm(path, ticket) => (
                rrpc_core::FabricAddr::Shm(path.clone()),
                ticket,
                Carrier::Shm,
                crate::Fabric::Shm,
                format!("shm://{}", path.display()),
            ),
            Chosen::Verbs(at, ticket) => (
                rrpc_core::FabricAddr::Rdma(at),
                ticket,
                Carrier::Verbs {
                    device: String::new(),
                    peer: None,
                },
                crate::Fabric::Verbs,
                format!("rdma://{at}"),
            ),
        };
        let remember = (ticket.is_none() && p.tls().is_none()).then(|| ep.clone());
        let connected = match self.resolve_context() {
            Ok(ctx) => match self.port_dialer(p.with_hint(ep, ticket), ctx.clone()) {
                Ok(dialer) => dialer.clone().connection().await.map(|c| (dialer, c, ctx)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match connected {
            Ok((dialer, conn, ctx)) => {
                if let Some(ep) = remember {
                    ctx.ports().put(p.addr(), bits, ep, Instant::now());
                }
                Ok(self.rings(dialer, Some(conn), carrier))
            }
            // The server refused it for a connection limit: no other fabric
            // of the same server is the answer (its TCP leg counts against
            // the same limits), and the caller must learn which limit; nor
            // for ring encryption the two ends disagree on (a misconfiguration).
            Err(e @ (Error::ConnectionLimit(_) | Error::RingEncryption(_))) => Err(e),
            Err(e) if self.config.allows(crate::Fabric::Tcp) => {
                tracing::warn!(
                    addr = %p.addr(), side = %shown, %fabric, error = %e,
                    "rrpc: the server's {fabric} side listener could not be reached; negotiating tcp"
                );
                match negotiate(
                    p.addr(),
                    crate::Fabric::Tcp.bit(),
                    limit,
                    p.tls().map(|t| &**t),
                )
                .await?
                {
                    Chosen::Tcp(s) => self.port_tcp(p, s).await,
                    other => Err(Error::Handshake(format!(
                        "the server chose {}",
                        other.fabric()
                    ))),
                }
            }
            Err(e) if fabric == crate::Fabric::Verbs => Err(Error::NoFabric {
                addr: p.addr().to_string(),
                reason: format!(
                    "the server offered verbs at {shown}, and this client's queue pair \
                     could not connect there (no active device, or the server's GID is \
                     unreachable from it): {e}"
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// tonic on the TCP connection a negotiation left open.
    async fn port_tcp(
        &self,
        p: &crate::port::PortTarget,
        first: crate::port::PortIo,
    ) -> Result<RrpcChannel, Error> {
        let ep = self.tonic_endpoint(format!("http://{}", p.addr()), true)?;
        let ch = ep
            .connect_with_connector(self.port_tcp_connector(p, Some(first)))
            .await?;
        Ok(RrpcChannel::tonic(ch, ChannelPath::Tcp, Carrier::Tcp))
    }

    /// tonic's connector for `rrpc://` on TCP ([`crate::port::tcp_connector`]).
    fn port_tcp_connector(
        &self,
        p: &crate::port::PortTarget,
        first: Option<crate::port::PortIo>,
    ) -> impl Service<
        http::Uri,
        Response = hyper_util::rt::TokioIo<crate::port::PortIo>,
        Error = Error,
        Future = impl Send + 'static,
    > + Send
    + 'static {
        let limit = self
            .connect_timeout
            .unwrap_or(self.config.handshake_timeout());
        crate::port::tcp_connector(
            p.addr().to_string(),
            first,
            limit,
            self.tcp_nodelay,
            p.tls().cloned(),
        )
    }

    /// A ring dialer for `rrpc://`'s shm fabric.
    fn port_dialer(
        &self,
        p: crate::port::PortTarget,
        ctx: RrpcContext,
    ) -> Result<Arc<Dialer>, Error> {
        RrpcEndpoint {
            target: Target::Port(p),
            ..self.clone()
        }
        .dialer(ctx)
    }

    fn dialer(&self, ctx: RrpcContext) -> Result<Arc<Dialer>, Error> {
        Ok(Dialer::new(
            self.target.clone(),
            self.ring_config()?,
            ctx,
            self.uri.clone(),
            self.connect_timeout,
            self.call_options(),
            self.tonic_endpoint("http://rrpc.invalid".into(), false)?,
        ))
    }

    /// A ring channel: reconnecting, behind tower's limits when set.
    fn rings(&self, dialer: Arc<Dialer>, conn: Option<Conn>, carrier: Carrier) -> RrpcChannel {
        let managed = Managed::new(dialer.clone(), conn);
        if self.concurrency_limit.is_none() && self.rate_limit.is_none() {
            return RrpcChannel::managed(managed, carrier);
        }
        // As tonic stacks them: the limits behind a buffer, so that every
        // clone of the channel shares them.
        let svc = tower::ServiceBuilder::new()
            .option_layer(
                self.concurrency_limit
                    .map(tower::limit::ConcurrencyLimitLayer::new),
            )
            .option_layer(
                self.rate_limit
                    .map(|(n, per)| tower::limit::RateLimitLayer::new(n, per)),
            )
            .service(managed);
        let svc = tower::util::BoxService::new(svc);
        let size = self.buffer_size.unwrap_or(DEFAULT_BUFFER_SIZE);
        RrpcChannel::buffered(tower::buffer::Buffer::new(svc, size), dialer, carrier)
    }

    /// The config the rings dial with: with TLS and the `verbs` feature,
    /// the endpoint's TLS on the verbs side channel (unless the config
    /// sets its own), for the server name the URI's host (or
    /// `domain_name`) gives.
    fn ring_config(&self) -> Result<RrpcConfig, Error> {
        #[cfg(all(feature = "verbs", feature = "tls"))]
        if let Some(t) = &self.tls
            && self.config.tls().1.is_none()
        {
            let host = match &self.target {
                Target::Rdma(rrpc_core::FabricUri::Rdma { host, port }) => {
                    format!("{host}:{port}")
                }
                Target::Port(p) => p.addr().to_string(),
                _ => return Ok(self.config.clone()),
            };
            let name = t.server_name(&host)?;
            return self
                .config
                .to_builder()
                .tls_client(t.rustls().clone(), name)
                .build();
        }
        Ok(self.config.clone())
    }

    /// tonic's `Endpoint` for `http://` and `unix://` (`authority`):
    /// `https://` with tonic's TLS when TLS is set.
    fn tcp_endpoint(&self, authority: &str) -> Result<tonic::transport::Endpoint, Error> {
        match &self.tls {
            #[cfg(feature = "tls")]
            Some(t) => Ok(self
                .tonic_endpoint(format!("https://{authority}"), true)?
                .tls_config(t.tonic())?),
            _ => self.tonic_endpoint(format!("http://{authority}"), true),
        }
    }

    /// What the fast path adds to each call.
    fn call_options(&self) -> CallOptions {
        let mut opts = CallOptions {
            timeout: self.timeout,
            authority: self.origin.as_ref().and_then(|o| o.authority().cloned()),
            ..CallOptions::default()
        };
        if let Some(ua) = &self.user_agent {
            let mut v = ua.as_bytes().to_vec();
            v.push(b' ');
            v.extend_from_slice(tonic_user_agent().as_bytes());
            opts.user_agent = HeaderValue::from_bytes(&v).expect("a header value and a space");
        }
        opts
    }

    /// tonic's `Endpoint` with this endpoint's options; `all` adds the ones
    /// rrpc applies itself on rings (connect timeout and limits).
    fn tonic_endpoint(&self, uri: String, all: bool) -> Result<tonic::transport::Endpoint, Error> {
        let mut ep = tonic::transport::Endpoint::from_shared(uri)?
            .tcp_nodelay(self.tcp_nodelay)
            .tcp_keepalive(self.tcp_keepalive)
            .initial_stream_window_size(self.initial_stream_window_size)
            .initial_connection_window_size(self.initial_connection_window_size)
            .buffer_size(self.buffer_size);
        if let Some(t) = self.timeout {
            ep = ep.timeout(t);
        }
        if let Some(ua) = &self.user_agent {
            ep = ep.user_agent(ua.clone())?;
        }
        if let Some(o) = &self.origin {
            ep = ep.origin(o.clone());
        }
        if let Some(i) = self.http2_keep_alive_interval {
            ep = ep.http2_keep_alive_interval(i);
        }
        if let Some(t) = self.keep_alive_timeout {
            ep = ep.keep_alive_timeout(t);
        }
        if let Some(w) = self.keep_alive_while_idle {
            ep = ep.keep_alive_while_idle(w);
        }
        if all {
            if let Some(t) = self.connect_timeout {
                ep = ep.connect_timeout(t);
            }
            if let Some(n) = self.concurrency_limit {
                ep = ep.concurrency_limit(n);
            }
            if let Some((n, per)) = self.rate_limit {
                ep = ep.rate_limit(n, per);
            }
        }
        Ok(ep)
    }
}

fn unix_connector(
    path: &std::path::Path,
) -> impl Service<
    http::Uri,
    Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl Send + 'static,
> + Send
+ 'static {
    let path = path.to_path_buf();
    tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(path).await?,
            ))
        }
    })
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
            carriers.push(ch.carrier());
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
        Ok(RrpcChannel::balanced(
            tower::buffer::Buffer::new(svc, 1024),
            carriers,
        ))
    }
}

/// What `target` asks for; `rdma://` opens `ctx`'s device to name it.
fn carrier_of(target: &Target, ctx: &RrpcContext) -> Result<Carrier, Error> {
    Ok(match target {
        Target::Tcp(_) => Carrier::Tcp,
        Target::Unix(_) => Carrier::Unix,
        Target::Inproc(_) => Carrier::Inproc,
        Target::Shm(_) => Carrier::Shm,
        // The negotiation decides; the live connection tells.
        Target::Port(_) => Carrier::Shm,
        #[cfg(feature = "verbs")]
        Target::Rdma(_) => Carrier::Verbs {
            device: ctx
                .verbs_fabric()?
                .device_name()
                .unwrap_or_default()
                .to_string(),
            peer: None,
        },
        #[cfg(not(feature = "verbs"))]
        Target::Rdma(_) => {
            let _ = ctx;
            return Err(crate::error::rdma_unavailable());
        }
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tonic::body::Body;
    use tonic::server::NamedService;
    use tower::ServiceExt;

    use super::*;
    use crate::fast::client::FastChannel;

    /// A service that answers every call with `grpc-status: 0`.
    #[derive(Debug, Clone)]
    struct Ok0;

    impl NamedService for Ok0 {
        const NAME: &'static str = "x.Y";
    }

    impl Service<http::Request<Body>> for Ok0 {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<http::Response<Body>, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            let mut res = http::Response::new(Body::empty());
            res.headers_mut()
                .insert("grpc-status", HeaderValue::from_static("0"));
            std::future::ready(Ok(res))
        }
    }

    fn current_fast(ch: &RrpcChannel) -> FastChannel {
        match ch.rings().and_then(|m| m.dialer.current()) {
            Some(Conn::Fast(f)) => f,
            other => panic!("no fast-path connection: {other:?}"),
        }
    }

    async fn call(ch: &RrpcChannel) {
        let req = http::Request::builder()
            .uri("/x.Y/Z")
            .body(Body::empty())
            .expect("request");
        let res = ch.clone().oneshot(req).await.expect("call");
        assert_eq!(res.headers()["grpc-status"], "0");
    }

    /// Channels from clones of one config share one context, so one poller
    /// (and the server of that config in this process shares it too); a
    /// channel given a context of its own gets its own poller; a context
    /// made for other resource settings is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clones_share_a_context_and_an_explicit_one_does_not() {
        let path = std::env::temp_dir().join(format!("rrpc-ctx-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let uri = format!("shm://{}", path.display());
        // A poller of the config's own (Event mode: no polling thread), and
        // a setting no other test of this binary uses.
        let cfg = RrpcConfig::builder()
            .poller(
                crate::PollerConfig::builder()
                    .mode(crate::PollerMode::Event)
                    .build()
                    .unwrap(),
            )
            .max_concurrent_calls(197)
            .build()
            .expect("calls");
        let (u, scfg) = (uri.clone(), cfg.clone());
        let server = tokio::spawn(async move {
            crate::Server::builder()
                .add_service(Ok0)
                .serve_rrpc(&u, scfg)
                .await
        });
        let ep = RrpcEndpoint::new(&uri).expect("uri").config(cfg.clone());
        let mut first = None;
        for _ in 0..200 {
            if let Ok(c) = ep.connect().await {
                first = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let a = first.expect("server up");
        let b = RrpcChannel::connect(&uri, cfg.clone()).await.expect("b");
        call(&a).await;
        call(&b).await;
        let (ca, cb) = (a.context().expect("rings"), b.context().expect("rings"));
        assert!(ca.ptr_eq(&cb), "clones of one config share a context");
        assert!(
            ca.ptr_eq(&crate::RrpcContext::shared(&cfg)),
            "the server's too"
        );
        let poller = ca.poller_handle().expect("poller");
        assert!(poller.ptr_eq(&cb.poller_handle().expect("poller")));
        assert_eq!(poller.config().mode(), crate::PollerMode::Event);

        let own = crate::RrpcContext::new(&cfg);
        let c = ep.clone().context(own.clone()).connect().await.expect("c");
        call(&c).await;
        let cc = c.context().expect("rings");
        assert!(cc.ptr_eq(&own) && !cc.ptr_eq(&ca));
        assert!(!cc.poller_handle().expect("poller").ptr_eq(&poller));
        // Other per-connection settings may differ from the context's config.
        let h2 = ep
            .clone()
            .config(
                cfg.to_builder()
                    .path(crate::PathPreference::Http2)
                    .build()
                    .unwrap(),
            )
            .context(own.clone())
            .connect()
            .await
            .expect("h2");
        call(&h2).await;
        assert!(h2.context().expect("rings").ptr_eq(&own));
        // Not the resource settings.
        let e = ep
            .clone()
            .context(crate::RrpcContext::new(&RrpcConfig::default()))
            .connect_lazy()
            .expect_err("a context for another poller");
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        server.abort();
        let _ = std::fs::remove_file(&path);
    }

    /// `Server::max_connection_age` on the fast path: the server drains the
    /// connection at its age, the channel sees it (GOAWAY or the side
    /// channel closing) and its next call goes over a new connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_aged_fast_path_connection_is_replaced() {
        let path = std::env::temp_dir().join(format!("rrpc-age-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let uri = format!("shm://{}", path.display());
        let u = uri.clone();
        let server = tokio::spawn(async move {
            crate::Server::builder()
                .max_connection_age(Duration::from_millis(200))
                .add_service(Ok0)
                .serve_rrpc(&u, RrpcConfig::default())
                .await
        });
        let ep = RrpcEndpoint::new(&uri).expect("uri");
        let mut ch = None;
        for _ in 0..200 {
            if let Ok(c) = ep.connect().await {
                ch = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let ch = ch.expect("server up");
        call(&ch).await;
        let first = current_fast(&ch);
        assert!(!first.is_retired());
        let start = std::time::Instant::now();
        while !first.is_retired() {
            assert!(start.elapsed() < Duration::from_secs(5), "never aged out");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(start.elapsed() >= Duration::from_millis(100));
        call(&ch).await;
        let second = current_fast(&ch);
        assert!(!second.same_connection(&first), "a new connection");
        server.abort();
        let _ = std::fs::remove_file(&path);
    }
}
