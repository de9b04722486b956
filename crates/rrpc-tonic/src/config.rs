//! [`RrpcConfig`]: the knobs of an rrpc connection.

use std::sync::Arc;

use rrpc_poller::PollerConfig;

/// Which data path a connection uses (negotiated in the handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathPreference {
    /// The h2-free fast path when both ends allow it, else HTTP/2 (default).
    #[default]
    Fast,
    /// Always HTTP/2 over the rings (full tonic feature set, see the crate docs).
    Http2,
}

/// A fabric an `rrpc://` connection may run on ([`RrpcConfig::fabrics`]).
///
/// The negotiation on an `rrpc://` port takes the best fabric both ends
/// allow and can use, in this order: [`Fabric::Shm`] (same host only),
/// then [`Fabric::Verbs`] (both ends built with the `verbs` feature and
/// with an active device, the client's queue pair reaching the server's),
/// then [`Fabric::Tcp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fabric {
    /// HTTP/2 (tonic) on the TCP connection the negotiation ran on.
    Tcp,
    /// Shared-memory rings through the server's shm listener, when both
    /// ends are on the same host (`rrpc://` docs in [`crate::RrpcEndpoint`]).
    Shm,
    /// RDMA rings through the server's `rdma://` side channel. Offered only
    /// by a build with the `verbs` feature; a server grants it only when
    /// its device opened.
    Verbs,
}

impl Fabric {
    /// The fabric's bit in the negotiation's offer.
    pub(crate) fn bit(self) -> u8 {
        match self {
            Fabric::Tcp => 1,
            Fabric::Shm => 2,
            Fabric::Verbs => 4,
        }
    }

    /// Its name in logs, metrics and errors.
    pub fn name(self) -> &'static str {
        match self {
            Fabric::Tcp => "tcp",
            Fabric::Shm => "shm",
            Fabric::Verbs => "verbs",
        }
    }
}

impl std::fmt::Display for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bundles pooled for `rdma://` connections unless
/// [`RrpcConfig::connection_pool`] says otherwise.
pub const DEFAULT_RDMA_CONNECTION_POOL: usize = 2;

/// Configuration shared by rrpc clients and servers.
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`RrpcConfig::builder`], infallible setters on
/// [`RrpcConfigBuilder`] named after the setting, and
/// [`build`](RrpcConfigBuilder::build), which validates them all; read a
/// setting back with the getter of its name (`cfg.ring_size()`), derive a
/// changed config with [`to_builder`](RrpcConfig::to_builder).
/// [`RrpcConfig::default`] is the defaults below. Cheap to clone (an `Arc`
/// inside).
///
/// ```
/// use rrpc_tonic::{PathPreference, RrpcConfig};
/// let cfg = RrpcConfig::builder()
///     .ring_size(1 << 20)
///     .path(PathPreference::Http2)
///     .build()?;
/// assert_eq!(cfg.ring_size(), 1 << 20);
/// let bigger = cfg.to_builder().ring_size(8 << 20).build()?;
/// assert_ne!(bigger, cfg);
/// # Ok::<(), rrpc_tonic::Error>(())
/// ```
///
/// Settings only: a config starts nothing and holds no runtime state. The
/// poller, the verbs device, the connection pools and the shared
/// connections live in a [`RrpcContext`](crate::RrpcContext), which servers and
/// channels own or share (by default, one per distinct config: see
/// [`RrpcContext::shared`](crate::RrpcContext::shared)). Two configs are equal when
/// every setting is (the TLS configs by identity, `Arc::ptr_eq`).
///
/// | knob | default | source |
/// |---|---|---|
/// | `max_message_size` | 4 MiB | gRPC's default maximum message; RR-Compound §V-B picks the 4 MB ring to match |
/// | `ring_size` | 4 MiB | RR-Compound §V-B ("we opt to set the ring buffer size at 4 MB"); with self-sizing rings, the largest a ring grows to |
/// | `min_ring_size` | 64 KiB | rings that size themselves (RR-Compound §V-B leaves auto-tuning to future work): a ring starts here, grows before messages that need it, shrinks when quiet; equal to `ring_size` for the paper's fixed ring |
/// | `ring_shrink_after` | 1 s | quiet time after which a ring shrinks back to `min_ring_size` |
/// | `ring_cache_size` | an eighth of the CPU's L2 (sysfs; 64 KiB with 512 KiB of L2) | a self-sizing ring grows past it only as far as one message needs; writers send messages of a third of it (Fig. 12: rings out of cache halve the bandwidth) |
/// | `path` | [`PathPreference::Fast`] | fast path by default between two rrpc endpoints: no HTTP/2 or HPACK per call |
/// | `zero_copy` | on | RR-Compound §IV-F; off reproduces Fig. 14's baseline |
/// | `max_chunk` | 256 KiB | fast-path DATA frames larger than this are split so calls interleave |
/// | `call_window` | 256 KiB | fast path: per-call flow-control window in each direction (an HTTP/2 stream window) |
/// | `max_header_list_size` | 16 KiB | fast-path server: larger request headers get HTTP 431, as hyper's HTTP/2 server answers |
/// | `max_concurrent_calls` | 200 | fast path, per connection: hyper's own HTTP/2 server default for `max_concurrent_streams` (tonic's `Server` leaves it unlimited); bounds the server memory a peer can hold with calls it never ends |
/// | `poller` | process-wide [`default_poller_config`] | see [`RrpcConfig::poller`] |
/// | `handshake_timeout` | 5 s | bounds a connection's whole setup (rrpc-core handshake + path negotiation) |
/// | `max_pending_handshakes` | 1024 | connections still in setup per listener; more are closed at once |
/// | `max_connections` | 4096 | established connections a server holds at once, over all its fabrics and peers; more are refused with `ResourceExhausted` |
/// | `max_connections_per_peer` | 256 | established connections one peer (a process on `shm://`, a host on `rdma://` and TCP) holds at once at a server; more are refused with `ResourceExhausted` |
/// | `fabrics` | every one ([`Fabric::Shm`], [`Fabric::Verbs`], [`Fabric::Tcp`]) | what an `rrpc://` connection may run on; the best both ends allow and can use wins |
/// | `token` | none | shared secret checked in the handshake (constant time) |
/// | `queue_pair` | [`rrpc_core::QpConfig::default`] | each connection's queue pair (depths; fault injection for tests) |
/// | `rc_retry` | [`rrpc_core::RcRetry::default`] (ACK timeout 67 ms, 7 retries) | `rdma://` retransmission on a lossy wire; a silent peer fails calls `Unavailable` |
/// | `connection_pool` | 0 (off) | KRCore §3.1: queue pairs and ring regions made ahead of time by a background thread; on shm it measured no faster (`cargo xtask bench connect`: p50 0.88–1.04× unpooled over three runs, both ≈ 3× tonic-TCP's connect), meant for verbs, where registration costs milliseconds on a NIC |
/// | `connection_pool_memory` | 64 MiB | the bound on what the ready bundles of a context's pools hold together (a bundle holds both ring regions, ≈ 2 × `ring_size`) |
/// | `spare_connections` | 0 (off) | connections a client keeps handshaken ahead to each `shm://`/`rdma://` server it connected to (see the setter: a connect that finds one costs no round trip; each spare holds a connection at the server) |
/// | `shared_queue_pairs` | off | KRCore §4.4: connections to one server share one queue pair (see the setter for the measured cost on shm) |
/// | `peer_lease` | 10 s | how long an unused shared connection stays cached (`rrpc_core::meta`) |
/// | `max_shared_peers` | 1024 | shared connections cached (client) or held (server) at once |
/// | `rdma_device` | first device listed | the verbs device for `rdma://` (feature `verbs`) |
/// | `rdma_port` | 1 | its physical port |
/// | `rdma_gid_index` | RoCE: first IPv4-mapped RoCE v2 GID, else 0; InfiniBand: 0 | its source GID index (see `rrpc_core::VerbsOptions::gid_index`) |
#[derive(Debug, Clone, PartialEq)]
pub struct RrpcConfig(Arc<Inner>);

/// The default of [`RrpcConfig::peer_lease`].
pub const DEFAULT_PEER_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// The most [`RrpcConfig::spare_connections`] a config may ask for: each
/// is a whole connection a server holds for a client that may never use it.
pub const MAX_SPARE_CONNECTIONS: usize = 16;

/// The default of [`RrpcConfig::max_connections`]: with the default 4 MiB
/// rings grown to their largest, 4096 connections pin 32 GiB of ring
/// memory, half of rrpc-core's default global grant budget (64 GiB).
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// The default of [`RrpcConfig::max_connections_per_peer`]: a sixteenth of
/// `DEFAULT_MAX_CONNECTIONS`, so that at least sixteen peers fit at their
/// limit, and far above what one client needs (a channel holds one
/// connection; a balanced pool a few).
pub(crate) const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;

/// The default of [`RrpcConfig::max_shared_peers`].
pub const DEFAULT_MAX_SHARED_PEERS: usize = 1024;

/// What a client checks the server's side-channel certificate with.
#[cfg(feature = "verbs")]
type TlsClient = (
    Arc<rrpc_core::rustls::ClientConfig>,
    rrpc_core::rustls::pki_types::ServerName<'static>,
);

#[derive(Debug, Clone)]
struct Inner {
    max_message_size: usize,
    ring_size: usize,
    min_ring_size: usize,
    ring_shrink_after: std::time::Duration,
    /// Where rings and polling threads go (RB² §IV-C).
    numa_node: rrpc_core::numa::NumaPlacement,
    ring_cache_size: Option<usize>,
    path: PathPreference,
    zero_copy: bool,
    max_chunk: usize,
    call_window: u32,
    max_header_list_size: usize,
    max_concurrent_calls: usize,
    poller: Option<PollerConfig>,
    receive_spin: std::time::Duration,
    handshake_timeout: std::time::Duration,
    max_pending_handshakes: usize,
    /// Established connections a server holds at once, all peers.
    max_connections: usize,
    /// Established connections one peer holds at once at a server.
    max_connections_per_peer: usize,
    token: Option<Arc<[u8]>>,
    #[cfg(feature = "verbs")]
    tls_server: Option<Arc<rrpc_core::rustls::ServerConfig>>,
    #[cfg(feature = "verbs")]
    tls_client: Option<TlsClient>,
    rdma_device: Option<String>,
    rdma_port: Option<u8>,
    rdma_gid_index: Option<u8>,
    /// Every connection's queue-pair settings.
    queue_pair: rrpc_core::QpConfig,
    /// Connections' resources made ahead of time (0: off; `None`: the
    /// provider's default, [`DEFAULT_RDMA_CONNECTION_POOL`] on verbs).
    pool: Option<usize>,
    /// The memory bound of the ready bundles of every pool of a context.
    pool_memory: u64,
    /// Connections handshaken ahead per server a client connected to.
    spare_connections: usize,
    /// Logical connections over one queue pair per peer.
    shared_queue_pairs: bool,
    /// How long a shared connection nobody uses stays cached.
    peer_lease: std::time::Duration,
    /// Shared connections cached (client) or accepted (server) at once.
    max_shared_peers: usize,
    /// The fabrics an `rrpc://` connection may use ([`Fabric::bit`]s).
    fabrics: u8,
}

impl PartialEq for Inner {
    fn eq(&self, o: &Self) -> bool {
        // Every field named (no `..`): a new setting must be compared too.
        let Inner {
            max_message_size,
            ring_size,
            min_ring_size,
            ring_shrink_after,
            numa_node,
            ring_cache_size,
            path,
            zero_copy,
            max_chunk,
            call_window,
            max_header_list_size,
            max_concurrent_calls,
            poller,
            receive_spin,
            handshake_timeout,
            max_pending_handshakes,
            max_connections,
            max_connections_per_peer,
            token,
            #[cfg(feature = "verbs")]
            tls_server,
            #[cfg(feature = "verbs")]
            tls_client,
            rdma_device,
            rdma_port,
            rdma_gid_index,
            queue_pair,
            pool,
            pool_memory,
            spare_connections,
            shared_queue_pairs,
            peer_lease,
            max_shared_peers,
            fabrics,
        } = self;
        #[cfg(feature = "verbs")]
        {
            // rustls configs have no equality: the same config, or none.
            let same_server = match (tls_server, &o.tls_server) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            };
            let same_client = match (tls_client, &o.tls_client) {
                (Some((a, na)), Some((b, nb))) => Arc::ptr_eq(a, b) && na == nb,
                (a, b) => a.is_none() && b.is_none(),
            };
            if !(same_server && same_client) {
                return false;
            }
        }
        *max_message_size == o.max_message_size
            && *ring_size == o.ring_size
            && *min_ring_size == o.min_ring_size
            && *ring_shrink_after == o.ring_shrink_after
            && *numa_node == o.numa_node
            && *ring_cache_size == o.ring_cache_size
            && *path == o.path
            && *zero_copy == o.zero_copy
            && *max_chunk == o.max_chunk
            && *call_window == o.call_window
            && *max_header_list_size == o.max_header_list_size
            && *max_concurrent_calls == o.max_concurrent_calls
            && *poller == o.poller
            && *receive_spin == o.receive_spin
            && *handshake_timeout == o.handshake_timeout
            && *max_pending_handshakes == o.max_pending_handshakes
            && *max_connections == o.max_connections
            && *max_connections_per_peer == o.max_connections_per_peer
            && *token == o.token
            && *rdma_device == o.rdma_device
            && *rdma_port == o.rdma_port
            && *rdma_gid_index == o.rdma_gid_index
            && *queue_pair == o.queue_pair
            && *pool == o.pool
            && *pool_memory == o.pool_memory
            && *spare_connections == o.spare_connections
            && *shared_queue_pairs == o.shared_queue_pairs
            && *peer_lease == o.peer_lease
            && *max_shared_peers == o.max_shared_peers
            && *fabrics == o.fabrics
    }
}

impl Default for RrpcConfig {
    fn default() -> Self {
        RrpcConfig(Arc::new(Inner {
            max_message_size: 4 << 20,
            ring_size: 4 << 20,
            min_ring_size: 64 << 10,
            ring_shrink_after: std::time::Duration::from_secs(1),
            numa_node: rrpc_core::numa::NumaPlacement::Device,
            ring_cache_size: None,
            path: PathPreference::Fast,
            zero_copy: true,
            max_chunk: 256 << 10,
            call_window: 256 << 10,
            max_header_list_size: 16 << 10,
            max_concurrent_calls: 200,
            poller: None,
            receive_spin: std::time::Duration::ZERO,
            handshake_timeout: std::time::Duration::from_secs(5),
            max_pending_handshakes: 1024,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            token: None,
            #[cfg(feature = "verbs")]
            tls_server: None,
            #[cfg(feature = "verbs")]
            tls_client: None,
            rdma_device: None,
            rdma_port: None,
            rdma_gid_index: None,
            queue_pair: rrpc_core::QpConfig::default(),
            spare_connections: 0,
            shared_queue_pairs: false,
            peer_lease: DEFAULT_PEER_LEASE,
            max_shared_peers: DEFAULT_MAX_SHARED_PEERS,
            pool: None,
            pool_memory: 64 << 20,
            fabrics: Fabric::Tcp.bit() | Fabric::Shm.bit() | Fabric::Verbs.bit(),
        }))
    }
}

impl RrpcConfig {
    /// A builder starting from the defaults (see the table above).
    pub fn builder() -> RrpcConfigBuilder {
        RrpcConfigBuilder {
            inner: RrpcConfig::default().0.as_ref().clone(),
        }
    }

    /// A builder starting from this config, to derive a modified one
    /// (its [`build`](RrpcConfigBuilder::build) validates again).
    pub fn to_builder(&self) -> RrpcConfigBuilder {
        RrpcConfigBuilder {
            inner: self.0.as_ref().clone(),
        }
    }

    /// See [`RrpcConfigBuilder::fabrics`]: the allowed ones, best first.
    pub fn fabrics(&self) -> Vec<Fabric> {
        [Fabric::Shm, Fabric::Verbs, Fabric::Tcp]
            .into_iter()
            .filter(|f| self.allows(*f))
            .collect()
    }

    /// Whether [`RrpcConfigBuilder::fabrics`] allows `fabric`.
    pub fn allows(&self, fabric: Fabric) -> bool {
        self.0.fabrics & fabric.bit() != 0
    }

    /// The allowed fabrics as the negotiation's offer bits: those this
    /// build can use (no verbs without the `verbs` feature).
    pub(crate) fn fabric_bits(&self) -> u8 {
        if cfg!(feature = "verbs") {
            self.0.fabrics
        } else {
            self.0.fabrics & !Fabric::Verbs.bit()
        }
    }

    /// See [`RrpcConfigBuilder::max_header_list_size`].
    pub fn max_header_list_size(&self) -> usize {
        self.0.max_header_list_size
    }

    /// See [`RrpcConfigBuilder::max_concurrent_calls`].
    pub fn max_concurrent_calls(&self) -> usize {
        self.0.max_concurrent_calls
    }

    /// See [`RrpcConfigBuilder::receive_spin`].
    pub fn receive_spin(&self) -> std::time::Duration {
        self.0.receive_spin
    }

    /// See [`RrpcConfigBuilder::handshake_timeout`].
    pub fn handshake_timeout(&self) -> std::time::Duration {
        self.0.handshake_timeout
    }

    /// See [`RrpcConfigBuilder::max_pending_handshakes`].
    pub fn max_pending_handshakes(&self) -> usize {
        self.0.max_pending_handshakes
    }

    /// See [`RrpcConfigBuilder::max_connections`].
    pub fn max_connections(&self) -> usize {
        self.0.max_connections
    }

    /// See [`RrpcConfigBuilder::max_connections_per_peer`].
    pub fn max_connections_per_peer(&self) -> usize {
        self.0.max_connections_per_peer
    }

    /// See [`RrpcConfigBuilder::poller`] (`None`: the process-wide default).
    pub fn poller(&self) -> Option<&PollerConfig> {
        self.0.poller.as_ref()
    }

    /// See [`RrpcConfigBuilder::max_message_size`].
    pub fn max_message_size(&self) -> usize {
        self.0.max_message_size
    }

    /// See [`RrpcConfigBuilder::ring_size`].
    pub fn ring_size(&self) -> usize {
        self.0.ring_size
    }

    /// The size a ring starts at and shrinks back to (see
    /// [`RrpcConfig::min_ring_size`]): `ring_size` for a fixed ring.
    pub fn min_ring_size(&self) -> usize {
        let ring = self.0.ring_size;
        self.0.min_ring_size.min(ring).max(ring / 128)
    }

    /// See [`RrpcConfigBuilder::ring_cache_size`] (the value set, or the one
    /// derived from this CPU's L2 cache).
    pub fn ring_cache_size(&self) -> usize {
        self.0.ring_cache_size.unwrap_or_else(ring_cache_cap)
    }

    /// See [`RrpcConfigBuilder::numa_node`].
    pub fn numa_node(&self) -> rrpc_core::numa::NumaPlacement {
        self.0.numa_node
    }

    /// See [`RrpcConfigBuilder::ring_shrink_after`].
    pub fn ring_shrink_after(&self) -> std::time::Duration {
        self.0.ring_shrink_after
    }

    /// See [`RrpcConfigBuilder::path`].
    pub fn path(&self) -> PathPreference {
        self.0.path
    }

    /// See [`RrpcConfigBuilder::zero_copy`].
    pub fn zero_copy(&self) -> bool {
        self.0.zero_copy
    }

    /// See [`RrpcConfigBuilder::max_chunk`].
    pub fn max_chunk(&self) -> usize {
        self.0.max_chunk
    }

    /// See [`RrpcConfigBuilder::call_window`].
    pub fn call_window(&self) -> u32 {
        self.0.call_window
    }

    /// See [`RrpcConfigBuilder::token`].
    pub fn token(&self) -> Option<&[u8]> {
        self.0.token.as_deref()
    }

    /// The side-channel TLS settings: server config, client config and name.
    #[cfg(feature = "verbs")]
    pub(crate) fn tls(
        &self,
    ) -> (
        Option<&Arc<rrpc_core::rustls::ServerConfig>>,
        Option<&TlsClient>,
    ) {
        (self.0.tls_server.as_ref(), self.0.tls_client.as_ref())
    }

    /// See [`RrpcConfigBuilder::rdma_device`].
    pub fn rdma_device(&self) -> Option<&str> {
        self.0.rdma_device.as_deref()
    }

    /// See [`RrpcConfigBuilder::rdma_port`] (`None`: the default, 1).
    pub fn rdma_port(&self) -> Option<u8> {
        self.0.rdma_port
    }

    /// See [`RrpcConfigBuilder::rdma_gid_index`] (`None`: the default choice).
    pub fn rdma_gid_index(&self) -> Option<u8> {
        self.0.rdma_gid_index
    }

    /// The [`rrpc_core::VerbsOptions`] of `rdma_device`, `rdma_port` and
    /// `rdma_gid_index`.
    #[cfg(feature = "verbs")]
    pub(crate) fn verbs_options(&self) -> rrpc_core::VerbsOptions {
        let mut o = rrpc_core::VerbsOptions::builder();
        if let Some(d) = &self.0.rdma_device {
            o = o.device(d.clone());
        }
        if let Some(p) = self.0.rdma_port {
            o = o.port(p);
        }
        if let Some(g) = self.0.rdma_gid_index {
            o = o.gid_index(g);
        }
        o.build().expect("VerbsOptions checks nothing at build")
    }

    /// See [`RrpcConfigBuilder::queue_pair`].
    pub fn queue_pair(&self) -> &rrpc_core::QpConfig {
        &self.0.queue_pair
    }

    /// See [`RrpcConfigBuilder::rc_retry`].
    pub fn rc_retry(&self) -> rrpc_core::RcRetry {
        self.0.queue_pair.rc_retry()
    }

    /// See [`RrpcConfigBuilder::spare_connections`].
    pub fn spare_connections(&self) -> usize {
        self.0.spare_connections
    }

    /// See [`RrpcConfigBuilder::shared_queue_pairs`].
    pub fn shared_queue_pairs(&self) -> bool {
        self.0.shared_queue_pairs
    }

    /// See [`RrpcConfigBuilder::peer_lease`].
    pub fn peer_lease(&self) -> std::time::Duration {
        self.0.peer_lease
    }

    /// See [`RrpcConfigBuilder::max_shared_peers`].
    pub fn max_shared_peers(&self) -> usize {
        self.0.max_shared_peers
    }

    /// See [`RrpcConfigBuilder::connection_pool`]: the size set, or `None` for
    /// the default of each provider ([`Self::connection_pool_for`]).
    pub fn connection_pool(&self) -> Option<usize> {
        self.0.pool
    }

    /// The pool size connections on `kind` get: the size set, else
    /// [`DEFAULT_RDMA_CONNECTION_POOL`] on verbs and 0 on shm.
    pub fn connection_pool_for(&self, kind: rrpc_core::ProviderKind) -> usize {
        self.0.pool.unwrap_or(match kind {
            rrpc_core::ProviderKind::Verbs => DEFAULT_RDMA_CONNECTION_POOL,
            _ => 0,
        })
    }

    /// See [`RrpcConfigBuilder::connection_pool_memory`].
    pub fn connection_pool_memory(&self) -> u64 {
        self.0.pool_memory
    }

    /// Whether `other` asks for the same runtime resources: the settings
    /// a [`RrpcContext`](crate::RrpcContext)'s poller, device, pools and shared
    /// connections follow.
    pub(crate) fn same_resources(&self, other: &RrpcConfig) -> bool {
        let (a, b) = (&*self.0, &*other.0);
        a.poller == b.poller
            && a.numa_node == b.numa_node
            && a.rdma_device == b.rdma_device
            && a.rdma_port == b.rdma_port
            && a.rdma_gid_index == b.rdma_gid_index
            && a.queue_pair == b.queue_pair
            && a.pool == b.pool
            && a.pool_memory == b.pool_memory
            && a.peer_lease == b.peer_lease
            && a.max_shared_peers == b.max_shared_peers
    }
}

/// Builder for [`RrpcConfig`]: every setter is infallible and documents its
/// range; [`build`](Self::build) checks them all. Start from
/// [`RrpcConfig::builder`] (the defaults) or [`RrpcConfig::to_builder`].
#[derive(Debug, Clone)]
pub struct RrpcConfigBuilder {
    inner: Inner,
}

impl RrpcConfigBuilder {
    /// Largest gRPC message (after encoding) a call may carry; larger
    /// messages are split into chunks on the wire and rejected whole by the
    /// receiving tonic codec beyond its own limit (4 MiB unless changed).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.inner.max_message_size = bytes;
        self
    }

    /// Size of each direction's ring in bytes: its fixed size, or with
    /// self-sizing rings ([`min_ring_size`](Self::min_ring_size), on by
    /// default) the largest it grows to. A power of two.
    ///
    /// Each connection maps both rings in both processes on `shm`; under load
    /// the rpc bench measured 12 MiB of RSS per connection on each side with
    /// fixed 4 MiB rings (both rings once touched, plus buffers; the ring
    /// pages are shared, not copied); self-sizing rings give what they do
    /// not use back when they shrink. The 4 MiB default follows the paper. Measured on
    /// `shm` (rpc bench `ring_size_bandwidth`, 2-core host with 2 MiB of L2
    /// per core): 128 KiB messages streamed at ~31–32 Gb/s through 512 KiB–
    /// 1 MiB rings but ~16 Gb/s through 4 MiB rings, which no longer fit in
    /// cache; 8 KiB messages moved at 11–19 Gb/s with no clear trend from
    /// 32 KiB up. Smaller rings are worth trying for bandwidth-bound services
    /// on one host.
    pub fn ring_size(mut self, bytes: usize) -> Self {
        self.inner.ring_size = bytes;
        self
    }

    /// Rings that size themselves: each direction's ring starts at `bytes`,
    /// grows (up to [`ring_size`](Self::ring_size)) before a message that
    /// needs it (to the power of two above three times the message: 512 KiB for 128 KiB
    /// messages, the size RR-Compound's Fig. 12 sweep peaks at on this host
    /// class), and shrinks back when messages get smaller or the connection
    /// is quiet for [`ring_shrink_after`](Self::ring_shrink_after). Each
    /// switch is agreed in-band and costs one round trip (`rrpc_ringbuf`
    /// docs, "Rings that size themselves"). On `shm` a shrink gives the
    /// memory back to the system; on verbs the registration pins it.
    ///
    /// Default 64 KiB. Set it to `ring_size` for a fixed ring (the papers'
    /// setting). Used as the larger of `bytes` and `ring_size / 128`, at most
    /// `ring_size`.
    pub fn min_ring_size(mut self, bytes: usize) -> Self {
        self.inner.min_ring_size = bytes;
        self
    }

    /// Where connections' rings and the polling threads are placed (RB²
    /// §IV-C): by default ([`NumaPlacement::Device`]) on the NUMA node of
    /// the verbs device, read from sysfs when `rdma://` first opens it
    /// (`/sys/class/infiniband/<dev>/device/numa_node`; nothing when the
    /// device reports none, and nothing on `shm://`). `Node(n)` places
    /// every ring of this config on node `n` and gives its
    /// [`RrpcContext`](crate::RrpcContext) a poller of its own whose threads run on
    /// that node's CPUs; `Off` places
    /// nothing. Ring memory is bound with `mbind` before it is first
    /// touched; threads are pinned within the process's own affinity (a
    /// `taskset` is never widened). A placement the kernel refuses is
    /// logged and counted (`rrpc_numa_placement_failures_total`), never
    /// an error. A poller given with [`poller`](Self::poller) follows its
    /// own `PollerConfig::numa_node`.
    ///
    /// [`NumaPlacement::Device`]: rrpc_core::numa::NumaPlacement::Device
    pub fn numa_node(mut self, placement: rrpc_core::numa::NumaPlacement) -> Self {
        self.inner.numa_node = placement;
        self
    }

    /// Quiet time after which a self-sizing ring shrinks back to
    /// [`min_ring_size`](Self::min_ring_size). Default 1 s.
    pub fn ring_shrink_after(mut self, quiet: std::time::Duration) -> Self {
        self.inner.ring_shrink_after = quiet;
        self
    }

    /// The size past which a self-sizing ring stops growing for
    /// throughput: it grows beyond it only as far as one message needs, and
    /// the writers split their data into messages of a third of it, so
    /// that the rings a core touches stay in its cache (RR-Compound's
    /// Fig. 12: a ring out of cache halves the bandwidth).
    ///
    /// Default: an eighth of the CPU's L2 cache as sysfs gives it, rounded
    /// down to a power of two (64 KiB with 512 KiB of L2, where the Fig. 12
    /// sweep on shm peaked at 64–128 KiB rings for 8 KiB and 128 KiB RPCs).
    /// Ignored by fixed rings.
    pub fn ring_cache_size(mut self, bytes: usize) -> Self {
        self.inner.ring_cache_size = Some(bytes);
        self
    }

    /// Preferred data path.
    pub fn path(mut self, path: PathPreference) -> Self {
        self.inner.path = path;
        self
    }

    /// The fabrics an `rrpc://` connection may run on (default: all of
    /// them). The port's negotiation picks the best one both ends allow
    /// and can use (shm on the same host, else verbs, else TCP); to require
    /// one, allow only it (`fabrics([Fabric::Verbs])`: "RDMA or fail"), to
    /// forbid one leave it out (`fabrics([Fabric::Verbs, Fabric::Tcp])`:
    /// "never shm"). A build without the `verbs` feature never offers
    /// verbs. A client whose allowed fabrics the server cannot
    /// give fails with [`crate::Error::NoFabric`], naming what was missing
    /// on which side. On a server, leaving out [`Fabric::Tcp`] also closes
    /// plain HTTP/2 clients of the port, and leaving out [`Fabric::Shm`]
    /// binds no shm listener, and leaving out [`Fabric::Verbs`] binds no
    /// `rdma://` side channel. Other schemes ignore it. An empty set is
    /// refused by [`build`](Self::build).
    pub fn fabrics(mut self, fabrics: impl IntoIterator<Item = Fabric>) -> Self {
        self.inner.fabrics = fabrics.into_iter().fold(0, |b, f| b | f.bit());
        self
    }

    /// Encode frames straight into the send ring (on) or through an
    /// intermediate buffer (off, for RR-Compound Fig. 14).
    pub fn zero_copy(mut self, on: bool) -> Self {
        self.inner.zero_copy = on;
        self
    }

    /// Largest DATA chunk on the fast path.
    pub fn max_chunk(mut self, bytes: usize) -> Self {
        self.inner.max_chunk = bytes;
        self
    }

    /// The fast path's per-call flow-control window, in bytes (default
    /// 256 KiB; at least 1 KiB, at most 2^31 - 1).
    ///
    /// The role of an HTTP/2 stream window: a peer may send at most this
    /// many bytes of one call's DATA (each non-empty frame counts its
    /// 12-byte header too, [`crate::frame::data_charge`]) before this end's
    /// application has read them; reading hands them back with a
    /// WINDOW_UPDATE frame once half the window is consumed. So a call
    /// whose receiver stops reading stalls only itself: the connection's reader
    /// never waits for it, and other calls on the connection go on. Each end
    /// announces its own window in the path negotiation; it bounds what the
    /// connection holds for one call, and with
    /// [`RrpcConfig::max_concurrent_calls`] what one peer can make a connection
    /// buffer: at most `max_concurrent_calls × call_window` (50 MiB with the
    /// defaults).
    ///
    /// Larger windows let one call stream faster over a long round trip
    /// (bandwidth ≤ window / round-trip time). Round trips on shm and RDMA
    /// are microseconds, so 256 KiB should not limit a single stream; that
    /// is not yet measured (the rpc bench's ring-size and zero-copy runs
    /// predate flow control).
    pub fn call_window(mut self, bytes: u32) -> Self {
        self.inner.call_window = bytes;
        self
    }

    /// Largest request header list a fast-path server accepts, in bytes
    /// (default 16 KiB, hyper's HTTP/2 server default; HTTP/2's
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`).
    ///
    /// Counted as HTTP/2 counts it: each header's name and value plus 32,
    /// the `:path`, `:method`, `:scheme` and `:authority` pseudo-headers
    /// included. A larger request is answered with HTTP 431 and no handler
    /// runs; tonic reports it as `Unknown`, as over TCP.
    pub fn max_header_list_size(mut self, bytes: usize) -> Self {
        self.inner.max_header_list_size = bytes;
        self
    }

    /// Most calls open at once on one fast-path connection (default 200),
    /// the fast path's `max_concurrent_streams`.
    ///
    /// A server refuses a call beyond it at once with `Unavailable`, as
    /// tonic reports an HTTP/2 `REFUSED_STREAM` (the call was not
    /// processed, so it is safe to retry); the call's handler never runs.
    /// A client queues its own calls beyond it until one finishes (an
    /// HTTP/2 client does the same with the server's setting), within the
    /// call's deadline; so with equal limits on both ends, as by default,
    /// an honest client is never refused. A call counts from its request
    /// headers until its trailers (server: written; client: read) or its
    /// cancellation.
    ///
    /// Together with [`RrpcConfig::call_window`] this bounds what one peer can
    /// make a connection hold, so a peer opening calls without ever ending them
    /// cannot make the server hold unbounded memory. 200 is hyper's default for
    /// its HTTP/2 server (tonic's `Server` overrides it to unlimited).
    pub fn max_concurrent_calls(mut self, calls: usize) -> Self {
        self.inner.max_concurrent_calls = calls;
        self
    }

    /// Connection management for the `shm://`/`rdma://` connections made
    /// with this config: an [`rrpc_poller`] configuration.
    ///
    /// Without this call every connection of the process shares one poller
    /// built from [`default_poller_config`]. With it, each
    /// [`RrpcContext`](crate::RrpcContext) of this config gets its own poller,
    /// started at its first connection and shared by everything using the
    /// context: by default every server and channel of an equal config
    /// (clones included), so a server and a client of one process given
    /// one config share it ([`RrpcContext::shared`](crate::RrpcContext::shared)).
    /// [`rrpc_poller::Mode::Event`] turns on `tail_with_imm` in the ring
    /// geometry, so both ends must choose Event (the handshake refuses a
    /// mismatch).
    pub fn poller(mut self, poller: PollerConfig) -> Self {
        self.inner.poller = Some(poller);
        self
    }

    /// [`rrpc_poller::Mode::Event`] only: how long a connection's receiver
    /// spins on its ring before it sleeps (default 0: Event never spins).
    /// Event plus a receive spin catches replies while a connection is busy
    /// and, once it sleeps, is woken by the writer's `WRITE_WITH_IMM`
    /// directly, with no polling thread on the wake-up path. BPEV's spin is
    /// the poller's `bp_timeout` instead; BP and BPTS do not spin. See
    /// [`rrpc_poller::Registration::set_event_spin`].
    pub fn receive_spin(mut self, spin: std::time::Duration) -> Self {
        self.inner.receive_spin = spin;
        self
    }

    /// How long a new connection's whole setup may take: rrpc-core's
    /// handshake (hello, grants, accept) plus the path negotiation that
    /// follows. Default 5 s. A server drops a client that has not finished
    /// within it (each client's setup runs on its own, so a slow or silent
    /// client never delays another); a client gives up with
    /// [`crate::Error::Handshake`] or a timeout error.
    pub fn handshake_timeout(mut self, t: std::time::Duration) -> Self {
        self.inner.handshake_timeout = t;
        self
    }

    /// How many connections a server lets be in setup at once (accepted,
    /// handshake or path negotiation not finished). Default 1024. A client
    /// arriving while the limit is reached is closed at once and the
    /// refusal logged, so silent clients cost the server at most this many
    /// sockets and small tasks (never a thread each) for at most
    /// [`RrpcConfig::handshake_timeout`].
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.inner.max_pending_handshakes = n;
        self
    }

    /// How many established connections a server holds at once, over every
    /// fabric it serves and every peer (default 4096: with the default 4 MiB
    /// rings grown to their largest, 32 GiB of ring memory, half of
    /// rrpc-core's default global grant budget). Each pins its rings (on `rdma://`, registered memory that no
    /// per-peer grant budget bounds), a task and a poller registration.
    /// A server on `rrpc://` counts its TCP port's HTTP/2 connections and
    /// its shm and `rdma://` legs together; `http://` and `unix://` are
    /// tonic's own servers and not counted.
    ///
    /// A connection past the limit is refused with a reason naming it: an
    /// rrpc client's connect fails with [`crate::Error::ConnectionLimit`]
    /// (`ResourceExhausted`), a plain HTTP/2 client of an `rrpc://` port
    /// gets `ResourceExhausted` for its calls on that connection, which the
    /// server then closes. Refusals are counted in the `metrics` counter
    /// `rrpc_tonic_connections_refused_total{reason="total"}`. A connection
    /// that closes gives its place back.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.inner.max_connections = n;
        self
    }

    /// How many established connections one peer holds at once at a server
    /// (default 256, a sixteenth of the total: sixteen peers fit at their
    /// limit, far above what one client needs), so that one peer
    /// opening connections in a loop cannot take
    /// [`max_connections`](Self::max_connections) from the others. A peer
    /// is who its socket says it is: on `shm://` a process
    /// (`SO_PEERCRED`'s pid and uid, rrpc-core's `PeerKey`), on `rdma://`
    /// and on an `rrpc://` port's TCP connections the source IP address
    /// (every client behind one NAT address is one peer), on `inproc://`
    /// the process itself. Refused as [`max_connections`](Self::max_connections),
    /// counted with `reason="per_peer"`.
    pub fn max_connections_per_peer(mut self, n: usize) -> Self {
        self.inner.max_connections_per_peer = n;
        self
    }

    /// A shared secret the server requires from every client, and that a
    /// client presents (default: none). Checked in rrpc-core's handshake
    /// in constant time; a client without the right token is refused with
    /// `Unauthenticated` before it is granted any region or queue pair. At
    /// most 256 bytes. A server bound to a non-loopback `rdma://` address
    /// without a token logs a warning: anyone who can reach the port may
    /// connect.
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Self {
        let t: Vec<u8> = token.into();
        self.inner.token = Some(t.into());
        self
    }

    /// TLS (rustls) on a server's `rdma://` side channel (`verbs`
    /// feature): a client must complete a TLS handshake with `config` before
    /// its hello is read, so the token, the queue-pair addresses and the
    /// region keys cross encrypted; a client certificate verifier in
    /// `config` admits only clients with a certificate it trusts. A client
    /// that fails TLS is refused (`Unauthenticated` on its side) before it
    /// gets a region, a key or a queue pair. Only the connection handshake
    /// is protected: RPC payloads travel by RDMA WRITE, which TLS does not
    /// cover (README, "Security model"). `shm://` ignores it.
    #[cfg(feature = "verbs")]
    pub fn tls_server(mut self, config: Arc<rrpc_core::rustls::ServerConfig>) -> Self {
        self.inner.tls_server = Some(config);
        self
    }

    /// TLS (rustls) on a client's `rdma://` side channel (`verbs` feature):
    /// the server's certificate must be trusted by `config` for
    /// `server_name`, or the connect fails with `Unauthenticated`. See
    /// [`RrpcConfigBuilder::tls_server`].
    #[cfg(feature = "verbs")]
    pub fn tls_client(
        mut self,
        config: Arc<rrpc_core::rustls::ClientConfig>,
        server_name: rrpc_core::rustls::pki_types::ServerName<'static>,
    ) -> Self {
        self.inner.tls_client = Some((config, server_name));
        self
    }

    /// The verbs device `rdma://` uses, by name (e.g. `mlx5_0`, `rxe0`);
    /// default: the first device libibverbs lists. The device and its
    /// protection domain are opened once per [`RrpcContext`](crate::RrpcContext),
    /// at its first `rdma://` connection.
    pub fn rdma_device(mut self, name: impl Into<String>) -> Self {
        self.inner.rdma_device = Some(name.into());
        self
    }

    /// The physical port of [`RrpcConfig::rdma_device`] that `rdma://`
    /// uses (numbered from 1); default 1. A port the device does not have
    /// fails the first `rdma://` connection with an error naming the ports
    /// there are.
    pub fn rdma_port(mut self, port: u8) -> Self {
        self.inner.rdma_port = Some(port);
        self
    }

    /// The source GID index `rdma://` uses on that port. Default: on RoCE
    /// the first IPv4-mapped RoCE v2 GID of the port's table, else 0; on
    /// InfiniBand 0 (`rrpc_core::VerbsOptions::gid_index` with the
    /// `verbs` feature). An index outside the port's table, or naming an
    /// empty entry, fails the first `rdma://` connection with an error
    /// naming the index and the table's length.
    pub fn rdma_gid_index(mut self, index: u8) -> Self {
        self.inner.rdma_gid_index = Some(index);
        self
    }

    /// The queue-pair settings of every connection made or accepted with
    /// this config (default [`rrpc_core::QpConfig::default`]). Besides the
    /// queue depths it carries rrpc-core's fault injector
    /// ([`rrpc_core::QpConfig::fault`], shm only): delayed and missed
    /// completions, failing work requests, torn writes, so that a service's
    /// own tests can run the whole gRPC stack under verbs-like faults.
    pub fn queue_pair(mut self, qp: rrpc_core::QpConfig) -> Self {
        self.inner.queue_pair = qp;
        self
    }

    /// The reliable connection's retransmission settings on `rdma://`
    /// ([`rrpc_core::RcRetry`]: ACK timeout, retry counts, RNR timer; the
    /// defaults suit lossy RoCE without PFC and are documented there). A
    /// peer that stops acknowledging fails the connection's calls with
    /// `Unavailable` once the retries run out, naming the cause. Shorthand
    /// for [`RrpcConfig::queue_pair`] with [`rrpc_core::QpConfig::rc_retry`].
    pub fn rc_retry(mut self, retry: rrpc_core::RcRetry) -> Self {
        // Cannot fail: the queue-pair settings here were built (validated)
        // and `retry` was validated by its own builder; nothing else changes.
        self.inner.queue_pair = self
            .inner
            .queue_pair
            .to_builder()
            .rc_retry(retry)
            .build()
            .expect("a valid QpConfig stays valid with another RcRetry");
        self
    }

    /// Keeps the resources of `n` connections (a queue pair and both ring
    /// regions, KRCore's pre-initialised bundle, §3.1) made ahead of time
    /// by a background thread, for the `shm://` and `rdma://` connections
    /// made or accepted with this config, one pool per provider and
    /// [`RrpcContext`](crate::RrpcContext); connect and accept take a bundle
    /// instead of creating one, and the thread refills the pool. An empty
    /// pool builds inline, never fails for that
    /// ([`RrpcContext::pool_stats`](crate::RrpcContext::pool_stats) counts hits
    /// and misses). `0` turns it off.
    ///
    /// Default: [`DEFAULT_RDMA_CONNECTION_POOL`] (2) on `rdma://`, where
    /// registering both rings and creating the queue pair is most of a
    /// connect (on soft-RoCE a connect took 239 ms unpooled and 18 ms
    /// pooled, 13× faster; README, "The connect suite"); off on `shm://`,
    /// where it measured no faster. Each pooled bundle holds two rings
    /// (`2 × ring_size`) of memory, and on verbs their registrations (pinned
    /// pages), while it waits.
    pub fn connection_pool(mut self, n: usize) -> Self {
        self.inner.pool = Some(n);
        self
    }

    /// How many connections a client keeps ready, handshaken ahead, to each
    /// `shm://` or `rdma://` server (and `rrpc://` server on shm or verbs)
    /// it has connected to: after a channel's first connect to a server,
    /// a blocking task of the context dials up to `n` more dedicated
    /// connections (the same handshake, rings and path negotiation as any
    /// connect), and the next connect with an equal config takes one
    /// (checking its side channel first: one the server closed, or that
    /// waited longer than [`RrpcConfig::peer_lease`], is dropped) and
    /// starts the refill. A connect that finds one costs no round trip to
    /// the server; one that finds none dials as before. Not with
    /// [`Self::shared_queue_pairs`] (logical connections are dialed as
    /// before). At most [`MAX_SPARE_CONNECTIONS`].
    ///
    /// Default: 0 (off). A spare is a whole connection the server holds
    /// (its rings, a connection task) while nobody uses it, and each taken
    /// one costs a full connect on a background thread: worth it for a
    /// client that connects often to the same servers, not for one that
    /// keeps one channel (docs/measured.md, "Where a connect's time goes").
    pub fn spare_connections(mut self, n: usize) -> Self {
        self.inner.spare_connections = n;
        self
    }

    /// Carries every `shm://` or `rdma://` connection (and `rrpc://` one on
    /// shm or verbs) to one server over one queue pair (KRCore's virtualized QP, §4.4): the first connection to
    /// a server opens a *shared connection* (a queue pair, no rings), and
    /// each connection after it is a logical connection over that queue
    /// pair, with its own rings and side channel but no queue pair of its
    /// own (`rrpc_core::conn::connect_logical`). Queue pairs are then
    /// bounded by peers, not connections, and a connect skips creating and
    /// connecting one. Both ends must set it: a server without it refuses
    /// shared connections, saying so.
    ///
    /// Default: off. On `shm://` a shared queue pair measured 0.4–0.7× the
    /// WRITE throughput of dedicated ones below 1024 connections
    /// (`cargo xtask bench connect`, `shared_qp`), since every post takes
    /// the sharing layer's lock; it pays off on a NIC with many
    /// connections, where queue-pair state overflows the NIC's cache
    /// (KRCore §2.3). The shared connection stays cached for
    /// [`RrpcConfig::peer_lease`] after its last use.
    pub fn shared_queue_pairs(mut self, on: bool) -> Self {
        self.inner.shared_queue_pairs = on;
        self
    }

    /// How long a client keeps a shared connection to a server cached after
    /// the last connect that used it, once no connection runs over it (the
    /// lease of `rrpc_core::meta::PeerCache`). A cached shared connection is
    /// also dropped as soon as its peer is seen down: its side channel
    /// closed, or the server no longer knows it, or (`rrpc://`) the port
    /// names another side listener, its server having restarted. Default 10 s
    /// ([`DEFAULT_PEER_LEASE`]).
    pub fn peer_lease(mut self, lease: std::time::Duration) -> Self {
        self.inner.peer_lease = lease;
        self
    }

    /// The most shared connections a client caches, and a server holds, at
    /// once. A client past it closes the one whose lease ends first; a
    /// server past it refuses new shared connections (their clients then
    /// fail to connect, with the reason). Default 1024
    /// ([`DEFAULT_MAX_SHARED_PEERS`]).
    pub fn max_shared_peers(mut self, n: usize) -> Self {
        self.inner.max_shared_peers = n;
        self
    }

    /// Bounds the memory the ready bundles of a context's pools hold
    /// together (every provider and ring size: KRCore's size classes share
    /// one bound). A pool at its bound stops refilling, and connects beyond
    /// it build inline (counted as misses, never refused). Default 64 MiB.
    pub fn connection_pool_memory(mut self, max_bytes: u64) -> Self {
        self.inner.pool_memory = max_bytes;
        self
    }

    /// Validates every setting and returns the config.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] naming the setting and its range:
    /// `max_message_size`, `max_chunk`, `max_header_list_size`,
    /// `max_concurrent_calls`, `max_pending_handshakes` and
    /// `max_connections` must be above 0; `max_connections_per_peer` within
    /// 1 ..= `max_connections`;
    /// `ring_size` at least 4 KiB; `min_ring_size` and `ring_cache_size` (if
    /// set) powers of two of at least 4 KiB; `ring_shrink_after` at least
    /// 1 ms; `call_window` within 1 KiB ..= 2^31 - 1; `handshake_timeout` and
    /// `peer_lease` above zero; `token` (if set) 1..=256 bytes;
    /// `max_shared_peers` at least 1; `fabrics` not empty;
    /// `spare_connections` at most [`MAX_SPARE_CONNECTIONS`].
    pub fn build(self) -> Result<RrpcConfig, crate::Error> {
        let c = self.inner;
        let bad = |what: &'static str| Err(crate::Error::InvalidConfig(what));
        if c.max_message_size == 0 {
            return bad("max_message_size must be > 0");
        }
        if c.ring_size < 4096 {
            return bad("ring_size must be >= 4096");
        }
        if c.min_ring_size < 4096 || !c.min_ring_size.is_power_of_two() {
            return bad("min_ring_size must be a power of two >= 4096");
        }
        if c.ring_shrink_after < std::time::Duration::from_millis(1) {
            return bad("ring_shrink_after must be at least 1 ms");
        }
        if let Some(bytes) = c.ring_cache_size
            && (bytes < 4096 || !bytes.is_power_of_two())
        {
            return bad("ring_cache_size must be a power of two >= 4096");
        }
        if c.fabrics == 0 {
            return bad("fabrics must allow at least one fabric");
        }
        if c.max_chunk == 0 {
            return bad("max_chunk must be > 0");
        }
        if !(crate::frame::MIN_CALL_WINDOW..=crate::frame::MAX_WINDOW).contains(&c.call_window) {
            return bad("call_window must be between 1 KiB and 2^31 - 1 bytes");
        }
        if c.max_header_list_size == 0 {
            return bad("max_header_list_size must be > 0");
        }
        if c.max_concurrent_calls == 0 {
            return bad("max_concurrent_calls must be > 0");
        }
        if c.handshake_timeout.is_zero() {
            return bad("handshake_timeout must be > 0");
        }
        if c.max_pending_handshakes == 0 {
            return bad("max_pending_handshakes must be > 0");
        }
        if c.max_connections == 0 {
            return bad("max_connections must be > 0");
        }
        if c.max_connections_per_peer == 0 || c.max_connections_per_peer > c.max_connections {
            return bad("max_connections_per_peer must be within 1..=max_connections");
        }
        if let Some(t) = &c.token
            && (t.is_empty() || t.len() > rrpc_core::handshake::MAX_TOKEN)
        {
            return bad("token must be 1..=256 bytes");
        }
        if c.peer_lease.is_zero() {
            return bad("peer_lease must be above zero");
        }
        if c.max_shared_peers == 0 {
            return bad("max_shared_peers must be at least 1");
        }
        if c.spare_connections > MAX_SPARE_CONNECTIONS {
            return bad("spare_connections must be at most 16");
        }
        Ok(RrpcConfig(Arc::new(c)))
    }
}

/// The poller configuration rrpc-tonic uses unless [`RrpcConfig::poller`]
/// says otherwise: BPEV (RR-Compound §IV-D, Algorithm 2) with **one**
/// polling thread, `bp_timeout` **50 µs, fixed** (auto-tuning off), idle
/// parking on (rrpc-poller's default is two threads, 20 µs auto-tuned).
///
/// Why, measured with `examples/src/demo.rs --modes all` on a 2-core host:
///
/// * A reader task waits for two different things. The client waits for a
///   reply (one RTT, ~5 µs on the fast path), but the server waits for the
///   *next request*, i.e. the client's whole turnaround. If either side's
///   spin is shorter than what it waits for, it sleeps; the peer's next wait
///   then includes a wake-up through the polling thread, eventfd and epoll
///   (20–40 µs here), so it sleeps too: with 20 µs (auto-tuned or not) both
///   sides slept on ~1.5 of 2 waits per call and the fast path's p50 was
///   ~45 µs; with 50–200 µs fixed, 0 sleeps per call and p50 ~5.3 µs.
///   Auto-tuning from the moving wait time flips between the two regimes
///   (p99 ~50 µs instead of ~20 µs), hence fixed.
/// * Polling threads only serve connections that went to sleep; with spins
///   that catch the reply they stay parked, so a second one buys nothing on
///   2 cores and competes with the tokio workers when it does run.
/// * The price: a connection that goes idle spins 100 µs of one core per
///   direction before it sleeps; idle connections cost nothing. rrpc-poller's
///   spin back-off (on) then stops the spins that keep missing: at one call
///   per ms the server's reader skips its spin and the polling thread backs
///   off to the doorbells (crate docs, "Low, steady load").
/// * Receivers on the **HTTP/2 path** spin 4 × `bp_timeout` (200 µs with
///   this default): a wait there lasts the peer's whole HTTP/2 turnaround,
///   4–6 × the fast path's, and with 50 µs both ends of a ping-pong slept on
///   every wait (demo: 2.00 sleeps per call, p50 0.73–0.87 × tonic-TCP;
///   with 200 µs 0.08 sleeps, 0.51–0.56 ×).
/// * On **one CPU** (`taskset -c 1`, a one-CPU container) nothing spins:
///   rrpc-poller's hand-off ([`PollerConfig::handoff`], default `Auto`)
///   hands every wait to the writer's doorbell. Demo: fast path p50 17 µs,
///   0.46 × tonic over a Unix socket (72–126 µs while it spun).
/// * Mode numbers (fast path p50): BPEV 1 thread 100 µs 5.2 µs; BP 11 µs
///   (a wake-up per wait, one thread per registration); BPEV 20 µs 45 µs;
///   BPTS 1 thread 64 µs; EVENT 84 µs.
pub fn default_poller_config() -> PollerConfig {
    PollerConfig::builder()
        .polling_threads(1)
        .bp_timeout(std::time::Duration::from_micros(50))
        .auto_tune(false)
        .build()
        .expect("1 is a valid thread count")
}

/// The default of [`RrpcConfig::ring_cache_size`], the size past which a
/// self-sizing ring stops growing for throughput
/// (`RingConfig::cache_ring_size`): an eighth of this CPU's L2 cache (from
/// sysfs; 512 KiB when it cannot be read), rounded down to a power of two.
/// A core touches up to four rings' worth of data on a busy connection
/// (both rings of the direction it sends on, the receive ring of the other,
/// and the buffers it copies to), and they should fit in half its L2. On a
/// host with 512 KiB of L2 per core that is 64 KiB: the ring size at which
/// the Fig. 12 sweep (`cargo xtask bench rpc`, `ring_size_bandwidth`)
/// peaked there for both 8 KiB and 128 KiB RPCs.
pub(crate) fn ring_cache_cap() -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let l2 = l2_cache_bytes().unwrap_or(512 << 10);
        let cap = (l2 / 8).max(4096);
        1 << (usize::BITS - 1 - cap.leading_zeros())
    })
}

/// The L2 cache size of CPU 0, from `/sys/devices/system/cpu/cpu0/cache`.
fn l2_cache_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        if read("level").as_deref().map(str::trim) != Some("2") {
            continue;
        }
        let size = read("size")?;
        let size = size.trim();
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1024),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size, 1),
            },
        };
        return num.parse::<usize>().ok().map(|n| n * mul);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `build` refuses every value the old validated setters refused, with
    /// the message naming the setting, and accepts the edge of each range.
    #[test]
    fn build_checks_every_validated_setting() {
        use std::time::Duration;
        let b = RrpcConfig::builder;
        let err = |b: RrpcConfigBuilder| match b.build() {
            Err(crate::Error::InvalidConfig(m)) => m,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        let ms = Duration::from_millis;
        let refused: Vec<(&str, RrpcConfigBuilder)> = vec![
            ("max_message_size must be > 0", b().max_message_size(0)),
            ("ring_size must be >= 4096", b().ring_size(4095)),
            (
                "min_ring_size must be a power of two",
                b().min_ring_size(4096 + 1),
            ),
            (
                "min_ring_size must be a power of two",
                b().min_ring_size(2048),
            ),
            (
                "ring_shrink_after must be at least 1 ms",
                b().ring_shrink_after(Duration::from_micros(999)),
            ),
            (
                "ring_cache_size must be a power of two",
                b().ring_cache_size(3 << 12),
            ),
            (
                "ring_cache_size must be a power of two",
                b().ring_cache_size(2048),
            ),
            ("fabrics must allow at least one fabric", b().fabrics([])),
            ("max_chunk must be > 0", b().max_chunk(0)),
            (
                "call_window must be between",
                b().call_window(crate::frame::MIN_CALL_WINDOW - 1),
            ),
            (
                "call_window must be between",
                b().call_window(crate::frame::MAX_WINDOW + 1),
            ),
            (
                "max_header_list_size must be > 0",
                b().max_header_list_size(0),
            ),
            (
                "max_concurrent_calls must be > 0",
                b().max_concurrent_calls(0),
            ),
            (
                "handshake_timeout must be > 0",
                b().handshake_timeout(Duration::ZERO),
            ),
            (
                "max_pending_handshakes must be > 0",
                b().max_pending_handshakes(0),
            ),
            ("max_connections must be > 0", b().max_connections(0)),
            (
                "max_connections_per_peer must be within 1..=max_connections",
                b().max_connections_per_peer(0),
            ),
            (
                "max_connections_per_peer must be within 1..=max_connections",
                b().max_connections(4).max_connections_per_peer(5),
            ),
            ("token must be 1..=256 bytes", b().token(Vec::new())),
            ("token must be 1..=256 bytes", b().token(vec![1u8; 257])),
            (
                "peer_lease must be above zero",
                b().peer_lease(Duration::ZERO),
            ),
            (
                "max_shared_peers must be at least 1",
                b().max_shared_peers(0),
            ),
            (
                "spare_connections must be at most 16",
                b().spare_connections(MAX_SPARE_CONNECTIONS + 1),
            ),
        ];
        for (want, builder) in refused {
            let m = err(builder);
            assert!(m.contains(want), "{m:?} does not say {want:?}");
        }
        let edge = b()
            .max_message_size(1)
            .ring_size(4096)
            .min_ring_size(4096)
            .ring_shrink_after(ms(1))
            .ring_cache_size(4096)
            .fabrics([Fabric::Tcp])
            .max_chunk(1)
            .call_window(crate::frame::MIN_CALL_WINDOW)
            .max_header_list_size(1)
            .max_concurrent_calls(1)
            .handshake_timeout(Duration::from_nanos(1))
            .max_pending_handshakes(1)
            .max_connections(1)
            .max_connections_per_peer(1)
            .token(vec![1u8; 256])
            .peer_lease(Duration::from_nanos(1))
            .max_shared_peers(1)
            .build()
            .expect("the edges of every range are allowed");
        assert_eq!(edge.fabrics(), vec![Fabric::Tcp]);
        assert_eq!(edge.to_builder().build().unwrap(), edge);
        assert_eq!(b().build().unwrap(), RrpcConfig::default());
    }

    #[test]
    fn rdma_port_and_gid_index_are_kept() {
        let c = RrpcConfig::default();
        assert_eq!((c.rdma_port(), c.rdma_gid_index()), (None, None));
        let c = c
            .to_builder()
            .rdma_device("rxe0")
            .rdma_port(2)
            .rdma_gid_index(3)
            .build()
            .unwrap();
        assert_eq!(c.rdma_device(), Some("rxe0"));
        assert_eq!((c.rdma_port(), c.rdma_gid_index()), (Some(2), Some(3)));
    }

    /// Equality sees every setting: each setter makes a config unequal to
    /// the defaults and to every other one-setting change, and a clone (or
    /// the same settings built again) is equal.
    #[test]
    fn equality_sees_every_setting() {
        use std::time::Duration;
        let d = RrpcConfig::default();
        assert_eq!(d, d.clone());
        assert_eq!(d, RrpcConfig::default());
        let qp = rrpc_core::QpConfig::default();
        let changed: Vec<(&str, RrpcConfig)> = vec![
            (
                "max_message_size",
                d.to_builder().max_message_size(1 << 10).build().unwrap(),
            ),
            (
                "ring_size",
                d.to_builder().ring_size(1 << 16).build().unwrap(),
            ),
            (
                "min_ring_size",
                d.to_builder().min_ring_size(1 << 13).build().unwrap(),
            ),
            (
                "ring_shrink_after",
                d.to_builder()
                    .ring_shrink_after(Duration::from_secs(2))
                    .build()
                    .unwrap(),
            ),
            (
                "numa_node",
                d.to_builder()
                    .numa_node(rrpc_core::numa::NumaPlacement::Off)
                    .build()
                    .unwrap(),
            ),
            (
                "ring_cache_size",
                d.to_builder().ring_cache_size(1 << 13).build().unwrap(),
            ),
            (
                "path",
                d.to_builder().path(PathPreference::Http2).build().unwrap(),
            ),
            (
                "zero_copy",
                d.to_builder().zero_copy(false).build().unwrap(),
            ),
            (
                "max_chunk",
                d.to_builder().max_chunk(1 << 10).build().unwrap(),
            ),
            (
                "call_window",
                d.to_builder().call_window(1 << 12).build().unwrap(),
            ),
            (
                "max_header_list_size",
                d.to_builder()
                    .max_header_list_size(1 << 10)
                    .build()
                    .unwrap(),
            ),
            (
                "max_concurrent_calls",
                d.to_builder().max_concurrent_calls(7).build().unwrap(),
            ),
            (
                "poller",
                d.to_builder()
                    .poller(default_poller_config())
                    .build()
                    .unwrap(),
            ),
            (
                "receive_spin",
                d.to_builder()
                    .receive_spin(Duration::from_micros(3))
                    .build()
                    .unwrap(),
            ),
            (
                "handshake_timeout",
                d.to_builder()
                    .handshake_timeout(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ),
            (
                "max_pending_handshakes",
                d.to_builder().max_pending_handshakes(3).build().unwrap(),
            ),
            (
                "max_connections",
                d.to_builder().max_connections(300).build().unwrap(),
            ),
            (
                "max_connections_per_peer",
                d.to_builder().max_connections_per_peer(9).build().unwrap(),
            ),
            ("token", d.to_builder().token("secret").build().unwrap()),
            (
                "rdma_device",
                d.to_builder().rdma_device("rxe0").build().unwrap(),
            ),
            ("rdma_port", d.to_builder().rdma_port(2).build().unwrap()),
            (
                "rdma_gid_index",
                d.to_builder().rdma_gid_index(1).build().unwrap(),
            ),
            (
                "queue_pair",
                d.clone()
                    .to_builder()
                    .queue_pair(qp.to_builder().send_depth(3).build().unwrap())
                    .build()
                    .unwrap(),
            ),
            (
                "rc_retry",
                d.to_builder()
                    .rc_retry(
                        rrpc_core::RcRetry::builder()
                            .retry_count(1)
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
            ),
            (
                "connection_pool",
                d.to_builder().connection_pool(3).build().unwrap(),
            ),
            (
                "connection_pool_memory",
                d.to_builder()
                    .connection_pool_memory(1 << 20)
                    .build()
                    .unwrap(),
            ),
            (
                "shared_queue_pairs",
                d.to_builder().shared_queue_pairs(true).build().unwrap(),
            ),
            (
                "peer_lease",
                d.to_builder()
                    .peer_lease(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ),
            (
                "max_shared_peers",
                d.to_builder().max_shared_peers(3).build().unwrap(),
            ),
            (
                "spare_connections",
                d.to_builder().spare_connections(2).build().unwrap(),
            ),
        ];
        for (i, (name, c)) in changed.iter().enumerate() {
            assert_ne!(*c, d, "{name} is not compared");
            assert_eq!(*c, c.clone(), "{name}");
            for (other, o) in &changed[i + 1..] {
                assert_ne!(c, o, "{name} and {other} compare equal");
            }
        }
        // A poller setting equal to the default poller is still a setting.
        assert_ne!(
            d.to_builder()
                .poller(default_poller_config())
                .build()
                .unwrap(),
            d
        );
        // The same token built twice is the same setting.
        assert_eq!(
            d.to_builder().token("secret").build().unwrap(),
            RrpcConfig::builder().token("secret").build().unwrap()
        );
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn tls_configs_compare_by_identity() {
        let _ = rrpc_core::rustls::crypto::ring::default_provider().install_default();
        let roots = Arc::new(rrpc_core::rustls::RootCertStore::empty());
        let client = Arc::new(
            rrpc_core::rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let name = rrpc_core::rustls::pki_types::ServerName::try_from("a.test").unwrap();
        let a = RrpcConfig::builder()
            .tls_client(client.clone(), name.clone())
            .build()
            .unwrap();
        assert_eq!(
            a,
            RrpcConfig::builder()
                .tls_client(client.clone(), name.clone())
                .build()
                .unwrap()
        );
        assert_ne!(a, RrpcConfig::default());
        let other = Arc::new((*client).clone());
        assert_ne!(
            a,
            RrpcConfig::builder()
                .tls_client(other, name)
                .build()
                .unwrap()
        );
        let b = rrpc_core::rustls::pki_types::ServerName::try_from("b.test").unwrap();
        assert_ne!(
            a,
            RrpcConfig::builder().tls_client(client, b).build().unwrap()
        );
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn verbs_options_follow_the_config() {
        let o = RrpcConfig::default().verbs_options();
        assert_eq!(o, rrpc_core::VerbsOptions::default());
        let o = RrpcConfig::builder()
            .rdma_device("mlx5_1")
            .rdma_port(2)
            .rdma_gid_index(3)
            .build()
            .unwrap()
            .verbs_options();
        assert_eq!(o.device(), Some("mlx5_1"));
        assert_eq!(o.port(), 2);
        assert_eq!(o.gid_index(), Some(3));
    }
}
