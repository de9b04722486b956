//! [`RrpcConfig`]: the knobs of an rrpc connection.

use std::sync::Arc;

use rrpc_poller::PollerConfig;

mod admission;
mod device;
mod fabrics;
mod fast_path;
mod polling;
mod rings;
mod security;
mod sharing;
#[cfg(test)]
mod tests;

use admission::AdmissionSettings;
#[cfg(feature = "verbs")]
use admission::TlsClient;
use device::DeviceSettings;
use fabrics::FabricSet;
use fast_path::FastPathSettings;
use polling::PollingSettings;
use rings::RingSettings;
use security::SecuritySettings;
use sharing::SharingSettings;

pub use fabrics::Fabric;
pub use fast_path::PathPreference;
pub use security::RingEncryption;
pub use sharing::{DEFAULT_MAX_SHARED_PEERS, DEFAULT_PEER_LEASE, MAX_SPARE_CONNECTIONS};

/// Bundles pooled for `rdma://` connections unless
/// [`RrpcConfig::connection_pool`] says otherwise.
pub const DEFAULT_RDMA_CONNECTION_POOL: usize = 2;

/// Configuration shared by rrpc clients and servers.
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`RrpcConfig::builder`], infallible setters on
/// [`RrpcConfigBuilder`] named after the setting, and
/// [`build`](RrpcConfigBuilder::build), which validates them all (each
/// setting by one rule, checked in one place: its group's, table below);
/// read a setting back with the getter of its name (`cfg.ring_size()`),
/// derive a changed config with [`to_builder`](RrpcConfig::to_builder).
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
/// // A ring size the ring would refuse is refused here, naming the rule.
/// assert!(cfg.to_builder().ring_size(5000).build().is_err());
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
/// # Settings
///
/// Grouped by concern, as quinn splits its configs; each group checks its
/// own settings, and [`build`](RrpcConfigBuilder::build) runs every
/// group's check and then the one rule across groups (the queue pair's
/// send depth against what the ring needs). The rules are listed under
/// [`build`](RrpcConfigBuilder::build).
///
/// | group | setting | default | source |
/// |---|---|---|---|
/// | rings | `max_message_size` | 4 MiB | gRPC's default maximum message; RR-Compound §V-B picks the 4 MB ring to match (not read by the transports yet: see the setter) |
/// | rings | `ring_size` | 4 MiB | RR-Compound §V-B ("we opt to set the ring buffer size at 4 MB"); with self-sizing rings, the largest a ring grows to |
/// | rings | `min_ring_size` | 64 KiB (fitted into `ring_size / 128 ..= ring_size`) | rings that size themselves (RR-Compound §V-B leaves auto-tuning to future work): a ring starts here, grows before messages that need it, shrinks when quiet; equal to `ring_size` for the paper's fixed ring |
/// | rings | `ring_shrink_after` | 500 ms | quiet time after which a ring shrinks to `ring_idle_size`; both ends tick every half of it, so a quiet connection's rings are released within 2.5 × of it (docs/measured.md, "Memory and queue pairs per connection": at 1 s the release was still under way 2.3 s after a burst) |
/// | rings | `ring_idle_size` | 4 KiB (one page; at most `min_ring_size`) | the size a quiet ring shrinks to: on shm every page of both rings past it goes back to the system; the first message after the quiet grows the ring back to at least `min_ring_size` (a message that fits the idle ring goes out at once, the resize marker after it; a larger one waits for the marker's round trip) |
/// | rings | `ring_cache_size` | an eighth of the CPU's L2 (sysfs; 64 KiB with 512 KiB of L2) | a self-sizing ring grows past it only as far as one message needs; writers send messages of a third of it (Fig. 12: rings out of cache halve the bandwidth) |
/// | rings | `numa_node` | [`NumaPlacement::Device`](rrpc_core::numa::NumaPlacement::Device) | RB² §IV-C: rings and polling threads on the device's NUMA node |
/// | fast path | `path` | [`PathPreference::Fast`] | fast path by default between two rrpc endpoints: no HTTP/2 or HPACK per call |
/// | fast path | `zero_copy` | on | RR-Compound §IV-F; off reproduces Fig. 14's baseline |
/// | fast path | `max_chunk` | 256 KiB | fast-path DATA frames larger than this are split so calls interleave |
/// | fast path | `call_window` | 256 KiB | fast path: per-call flow-control window in each direction (an HTTP/2 stream window) |
/// | fast path | `max_header_list_size` | 16 KiB | fast-path server: larger request headers get HTTP 431, as hyper's HTTP/2 server answers |
/// | fast path | `max_concurrent_calls` | 200 | fast path, per connection: hyper's own HTTP/2 server default for `max_concurrent_streams` (tonic's `Server` leaves it unlimited); bounds the server memory a peer can hold with calls it never ends |
/// | polling | `poller` | process-wide [`default_poller_config`] | see [`RrpcConfig::poller`] |
/// | polling | `receive_spin` | 0 | Event mode only: how long a receiver spins before it sleeps |
/// | handshake and admission | `handshake_timeout` | 5 s | bounds a connection's whole setup (rrpc-core handshake + path negotiation) |
/// | handshake and admission | `max_pending_handshakes` | 1024 | connections still in setup per listener; more are closed at once |
/// | handshake and admission | `max_connections` | 4096 | established connections a server holds at once, over all its fabrics and peers; more are refused with `ResourceExhausted` |
/// | handshake and admission | `max_connections_per_peer` | 256 | established connections one peer (a process on `shm://`, a host on `rdma://` and TCP) holds at once at a server; more are refused with `ResourceExhausted` |
/// | handshake and admission | `token` | none | shared secret checked in the handshake (constant time) |
/// | handshake and admission | `tls_server`, `tls_client` | none | `verbs` feature: TLS on the `rdma://` side channel |
/// | device | `rdma_device` | first device listed | the verbs device for `rdma://` (feature `verbs`) |
/// | device | `rdma_port` | 1 | its physical port |
/// | device | `rdma_gid_index` | RoCE: first IPv4-mapped RoCE v2 GID, else 0; InfiniBand: 0 | its source GID index (see `rrpc_core::VerbsOptions::gid_index`) |
/// | device | `queue_pair` | [`rrpc_core::QpConfig::default`] | each connection's queue pair (depths; fault injection for tests) |
/// | device | `rc_retry` | [`rrpc_core::RcRetry::default`] (ACK timeout 67 ms, 7 retries) | part of `queue_pair`: `rdma://` retransmission on a lossy wire; a silent peer fails calls `Unavailable` |
/// | device | `connection_pool` | 0 (off) on shm, [`DEFAULT_RDMA_CONNECTION_POOL`] on verbs | KRCore §3.1: queue pairs and ring regions made ahead of time by a background thread; on shm it measured no faster (`cargo xtask bench connect`: p50 0.88–1.04× unpooled over three runs, both ≈ 3× tonic-TCP's connect), meant for verbs, where registration costs milliseconds on a NIC |
/// | device | `connection_pool_memory` | 64 MiB | the bound on what the ready bundles of a context's pools hold together (a bundle holds both ring regions, ≈ 2 × `ring_size`) |
/// | connection sharing | `spare_connections` | 0 (off) | connections a client keeps handshaken ahead to each `shm://`/`rdma://` server it connected to (see the setter: a connect that finds one costs no round trip; each spare holds a connection at the server) |
/// | connection sharing | `shared_queue_pairs` | off | KRCore §4.4: connections to one server share one queue pair (see the setter for the measured cost on shm) |
/// | connection sharing | `peer_lease` | 10 s | how long an unused shared connection stays cached (`rrpc_core::meta`) |
/// | connection sharing | `max_shared_peers` | 1024 | shared connections cached (client) or held (server) at once |
/// | security | `ring_encryption` | [`RingEncryption::Off`] | opt-in: every ring message sealed (AEAD keyed from the TLS session, docs/security.md); needs TLS on the connection and the same setting at both ends |
/// | fabrics | `fabrics` | every one ([`Fabric::Shm`], [`Fabric::Verbs`], [`Fabric::Tcp`]) | what an `rrpc://` connection may run on; the best both ends allow and can use wins |
#[derive(Debug, Clone, PartialEq)]
pub struct RrpcConfig(Arc<Inner>);

/// The settings, one field per group (the type's docs, "Settings").
#[derive(Debug, Clone, PartialEq)]
struct Inner {
    rings: RingSettings,
    fast_path: FastPathSettings,
    polling: PollingSettings,
    admission: AdmissionSettings,
    device: DeviceSettings,
    sharing: SharingSettings,
    security: SecuritySettings,
    fabrics: FabricSet,
}

impl Inner {
    /// Every group's check, then the rule across groups: one check per
    /// setting.
    fn validate(&self) -> Result<(), crate::Error> {
        self.rings.validate()?;
        self.fast_path.validate()?;
        self.polling.validate()?;
        self.admission.validate()?;
        self.device.validate()?;
        self.sharing.validate()?;
        self.security.validate()?;
        self.fabrics.validate()?;
        // The ring posts to the connection's queue pair, and refuses one
        // whose send queue is shallower than it needs (`LocalRing::connect`).
        // (It builds: the rings group's check built it.)
        let ring = self.rings.ring_config().build();
        let need = ring.map_or(0, |r| r.send_queue_need());
        if self.device.queue_pair.send_depth() < need {
            return Err(crate::Error::InvalidConfig(QUEUE_PAIR_RULE));
        }
        Ok(())
    }
}

/// The rule across groups (a test checks the number against the ring's
/// `send_queue_need`).
const QUEUE_PAIR_RULE: &str = "queue_pair's send_depth must be at least 770, the send-queue \
     slots a ring needs (rrpc_ringbuf::RingConfig::send_queue_need)";

impl Default for RrpcConfig {
    fn default() -> Self {
        RrpcConfig(Arc::new(Inner {
            rings: RingSettings::default(),
            fast_path: FastPathSettings::default(),
            polling: PollingSettings::default(),
            admission: AdmissionSettings::default(),
            device: DeviceSettings::default(),
            sharing: SharingSettings::default(),
            security: SecuritySettings::default(),
            fabrics: FabricSet::default(),
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
        self.0.fabrics.allows(fabric)
    }

    /// The ring config of this config's connections, as `build()`
    /// checked it (the rings group's one rule): `crate::conn::rings` adds only
    /// the poller's `tail_with_imm`.
    pub(crate) fn ring_builder(&self) -> rrpc_ringbuf::RingConfigBuilder {
        self.0.rings.ring_config()
    }

    /// The allowed fabrics as the negotiation's offer bits: those this
    /// build can use (no verbs without the `verbs` feature).
    pub(crate) fn fabric_bits(&self) -> u8 {
        if cfg!(feature = "verbs") {
            self.0.fabrics.0
        } else {
            self.0.fabrics.0 & !Fabric::Verbs.bit()
        }
    }

    /// See [`RrpcConfigBuilder::max_header_list_size`].
    pub fn max_header_list_size(&self) -> usize {
        self.0.fast_path.max_header_list_size
    }

    /// See [`RrpcConfigBuilder::max_concurrent_calls`].
    pub fn max_concurrent_calls(&self) -> usize {
        self.0.fast_path.max_concurrent_calls
    }

    /// See [`RrpcConfigBuilder::receive_spin`].
    pub fn receive_spin(&self) -> std::time::Duration {
        self.0.polling.receive_spin
    }

    /// See [`RrpcConfigBuilder::handshake_timeout`].
    pub fn handshake_timeout(&self) -> std::time::Duration {
        self.0.admission.handshake_timeout
    }

    /// See [`RrpcConfigBuilder::max_pending_handshakes`].
    pub fn max_pending_handshakes(&self) -> usize {
        self.0.admission.max_pending_handshakes
    }

    /// See [`RrpcConfigBuilder::max_connections`].
    pub fn max_connections(&self) -> usize {
        self.0.admission.max_connections
    }

    /// See [`RrpcConfigBuilder::max_connections_per_peer`].
    pub fn max_connections_per_peer(&self) -> usize {
        self.0.admission.max_connections_per_peer
    }

    /// See [`RrpcConfigBuilder::poller`] (`None`: the process-wide default).
    pub fn poller(&self) -> Option<&PollerConfig> {
        self.0.polling.poller.as_ref()
    }

    /// See [`RrpcConfigBuilder::max_message_size`].
    pub fn max_message_size(&self) -> usize {
        self.0.rings.max_message_size
    }

    /// See [`RrpcConfigBuilder::ring_size`].
    pub fn ring_size(&self) -> usize {
        self.0.rings.ring_size
    }

    /// The size a ring starts at and shrinks back to (see
    /// [`RrpcConfigBuilder::min_ring_size`]): the size set, else the default
    /// fitted into `ring_size / 128 ..= ring_size`; `ring_size` for a fixed
    /// ring.
    pub fn min_ring_size(&self) -> usize {
        self.0.rings.min_ring_size()
    }

    /// See [`RrpcConfigBuilder::ring_cache_size`] (the value set, or the one
    /// derived from this CPU's L2 cache).
    pub fn ring_cache_size(&self) -> usize {
        self.0.rings.ring_cache_size()
    }

    /// See [`RrpcConfigBuilder::numa_node`].
    pub fn numa_node(&self) -> rrpc_core::numa::NumaPlacement {
        self.0.rings.numa_node
    }

    /// See [`RrpcConfigBuilder::ring_shrink_after`].
    pub fn ring_shrink_after(&self) -> std::time::Duration {
        self.0.rings.ring_shrink_after
    }

    /// The size a quiet self-sizing ring shrinks to (see
    /// [`RrpcConfigBuilder::ring_idle_size`]): the size set, else 4 KiB
    /// fitted to [`min_ring_size`](Self::min_ring_size).
    pub fn ring_idle_size(&self) -> usize {
        self.0.rings.ring_idle_size()
    }

    /// See [`RrpcConfigBuilder::path`].
    pub fn path(&self) -> PathPreference {
        self.0.fast_path.path
    }

    /// See [`RrpcConfigBuilder::zero_copy`].
    pub fn zero_copy(&self) -> bool {
        self.0.fast_path.zero_copy
    }

    /// See [`RrpcConfigBuilder::max_chunk`].
    pub fn max_chunk(&self) -> usize {
        self.0.fast_path.max_chunk
    }

    /// See [`RrpcConfigBuilder::call_window`].
    pub fn call_window(&self) -> u32 {
        self.0.fast_path.call_window
    }

    /// See [`RrpcConfigBuilder::token`].
    pub fn token(&self) -> Option<&[u8]> {
        self.0.admission.token.as_deref()
    }

    /// The side-channel TLS settings: server config, client config and name.
    #[cfg(feature = "verbs")]
    pub(crate) fn tls(
        &self,
    ) -> (
        Option<&Arc<rrpc_core::rustls::ServerConfig>>,
        Option<&TlsClient>,
    ) {
        (
            self.0.admission.tls.server.as_ref(),
            self.0.admission.tls.client.as_ref(),
        )
    }

    /// See [`RrpcConfigBuilder::ring_encryption`].
    pub fn ring_encryption(&self) -> RingEncryption {
        self.0.security.ring_encryption
    }

    /// See [`RrpcConfigBuilder::rdma_device`].
    pub fn rdma_device(&self) -> Option<&str> {
        self.0.device.rdma_device.as_deref()
    }

    /// See [`RrpcConfigBuilder::rdma_port`] (`None`: the default, 1).
    pub fn rdma_port(&self) -> Option<u8> {
        self.0.device.rdma_port
    }

    /// See [`RrpcConfigBuilder::rdma_gid_index`] (`None`: the default choice).
    pub fn rdma_gid_index(&self) -> Option<u8> {
        self.0.device.rdma_gid_index
    }

    /// The [`rrpc_core::VerbsOptions`] of `rdma_device`, `rdma_port` and
    /// `rdma_gid_index`.
    #[cfg(feature = "verbs")]
    pub(crate) fn verbs_options(&self) -> rrpc_core::VerbsOptions {
        let mut o = rrpc_core::VerbsOptions::builder();
        if let Some(d) = &self.0.device.rdma_device {
            o = o.device(d.clone());
        }
        if let Some(p) = self.0.device.rdma_port {
            o = o.port(p);
        }
        if let Some(g) = self.0.device.rdma_gid_index {
            o = o.gid_index(g);
        }
        o.build().expect("VerbsOptions checks nothing at build")
    }

    /// See [`RrpcConfigBuilder::queue_pair`].
    pub fn queue_pair(&self) -> &rrpc_core::QpConfig {
        &self.0.device.queue_pair
    }

    /// See [`RrpcConfigBuilder::rc_retry`].
    pub fn rc_retry(&self) -> rrpc_core::RcRetry {
        self.0.device.queue_pair.rc_retry()
    }

    /// See [`RrpcConfigBuilder::spare_connections`].
    pub fn spare_connections(&self) -> usize {
        self.0.sharing.spare_connections
    }

    /// See [`RrpcConfigBuilder::shared_queue_pairs`].
    pub fn shared_queue_pairs(&self) -> bool {
        self.0.sharing.shared_queue_pairs
    }

    /// See [`RrpcConfigBuilder::peer_lease`].
    pub fn peer_lease(&self) -> std::time::Duration {
        self.0.sharing.peer_lease
    }

    /// See [`RrpcConfigBuilder::max_shared_peers`].
    pub fn max_shared_peers(&self) -> usize {
        self.0.sharing.max_shared_peers
    }

    /// See [`RrpcConfigBuilder::connection_pool`]: the size set, or `None` for
    /// the default of each provider ([`Self::connection_pool_for`]).
    pub fn connection_pool(&self) -> Option<usize> {
        self.0.device.connection_pool
    }

    /// The pool size connections on `kind` get: the size set, else
    /// [`DEFAULT_RDMA_CONNECTION_POOL`] on verbs and 0 on shm.
    pub fn connection_pool_for(&self, kind: rrpc_core::ProviderKind) -> usize {
        self.0.device.connection_pool.unwrap_or(match kind {
            rrpc_core::ProviderKind::Verbs => DEFAULT_RDMA_CONNECTION_POOL,
            _ => 0,
        })
    }

    /// See [`RrpcConfigBuilder::connection_pool_memory`].
    pub fn connection_pool_memory(&self) -> u64 {
        self.0.device.connection_pool_memory
    }

    /// Whether `other` asks for the same runtime resources: the settings
    /// a [`RrpcContext`](crate::RrpcContext)'s poller, device, pools and shared
    /// connections follow.
    pub(crate) fn same_resources(&self, other: &RrpcConfig) -> bool {
        let (a, b) = (&*self.0, &*other.0);
        // The whole device group: the device, queue pairs and pools.
        a.polling.poller == b.polling.poller
            && a.rings.numa_node == b.rings.numa_node
            && a.device == b.device
            && a.sharing.peer_lease == b.sharing.peer_lease
            && a.sharing.max_shared_peers == b.sharing.max_shared_peers
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
    /// Largest gRPC message (after encoding) a call may carry; above 0.
    ///
    /// **Not enforced yet**: no transport reads it. What applies today is
    /// tonic's own codec limit on the receiving side (4 MiB unless changed);
    /// larger messages are split into chunks on the wire either way.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.inner.rings.max_message_size = bytes;
        self
    }

    /// Size of each direction's ring in bytes: its fixed size, or with
    /// self-sizing rings ([`min_ring_size`](Self::min_ring_size), on by
    /// default) the largest it grows to. A power of two of at least 128
    /// bytes (two 64-byte slots) and at most 1 GiB: the ring's own rule
    /// (`rrpc_ringbuf::RingConfig`), checked by [`build`](Self::build).
    /// A frame that cannot be split (a call's headers) must fit in one
    /// ring message: a ring smaller than that fails those calls, not the
    /// connection.
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
        self.inner.rings.ring_size = bytes;
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
    /// Default 64 KiB, fitted into `ring_size / 128 ..= ring_size` (so
    /// that any `ring_size` alone builds). Set it to `ring_size` for a
    /// fixed ring (the papers' setting). A value set is used as set: a
    /// power of two of at least 128 bytes, within `ring_size / 128 ..=
    /// ring_size` (the ring's rule, its handshake carries the ratio in
    /// 3 bits), or [`build`](Self::build) refuses it.
    pub fn min_ring_size(mut self, bytes: usize) -> Self {
        self.inner.rings.min_ring_size = Some(bytes);
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
        self.inner.rings.numa_node = placement;
        self
    }

    /// Quiet time after which a self-sizing ring shrinks to
    /// [`ring_idle_size`](Self::ring_idle_size). Default 500 ms; within
    /// 1 ms ..= 365 days (the ring's minimum; a timer adds it to a clock).
    ///
    /// Both ends tick their rings' policy every half of it: the resize
    /// marker goes out between 1 and 1.5 × `quiet` after the last message,
    /// the peer reads it at once or on its own next tick, and the writer
    /// releases its staging ring on its next tick, so a quiet connection's
    /// rings are back at their idle size within 2.5 × `quiet`. Shorter
    /// releases memory sooner; a shrink costs the next message one resize
    /// round trip if it does not fit the idle ring
    /// ([`ring_idle_size`](Self::ring_idle_size)).
    pub fn ring_shrink_after(mut self, quiet: std::time::Duration) -> Self {
        self.inner.rings.ring_shrink_after = quiet;
        self
    }

    /// The size a self-sizing ring shrinks to once its connection has been
    /// quiet for [`ring_shrink_after`](Self::ring_shrink_after). On `shm`
    /// the pages of both ends' rings past it go back to the system; the
    /// first message after the quiet grows the ring back to at least
    /// [`min_ring_size`](Self::min_ring_size): one that fits the idle ring
    /// goes out at once, with the resize marker after it; a larger one
    /// waits for the marker's round trip (`rrpc_ringbuf` docs, "Rings that
    /// size themselves").
    ///
    /// Default 4 KiB (one page, the least a page-granular release keeps),
    /// fitted to `min_ring_size`; set it to `min_ring_size` to keep the
    /// minimum while quiet. A value set must be a power of two of at least
    /// 128 bytes (two 64-byte slots) and at most `min_ring_size`, or
    /// [`build`](Self::build) refuses it. Ignored by fixed rings.
    pub fn ring_idle_size(mut self, bytes: usize) -> Self {
        self.inner.rings.ring_idle_size = Some(bytes);
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
    /// sweep on shm peaked at 64–128 KiB rings for 8 KiB and 128 KiB RPCs),
    /// which the ring clamps into `min_ring_size ..= ring_size`. A value set
    /// must be a power of two within `min_ring_size ..= ring_size`, or
    /// [`build`](Self::build) refuses it. Ignored by fixed rings.
    pub fn ring_cache_size(mut self, bytes: usize) -> Self {
        self.inner.rings.ring_cache_size = Some(bytes);
        self
    }

    /// Preferred data path.
    pub fn path(mut self, path: PathPreference) -> Self {
        self.inner.fast_path.path = path;
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
        self.inner.fabrics = FabricSet::of(fabrics);
        self
    }

    /// Encode frames straight into the send ring (on) or through an
    /// intermediate buffer (off, for RR-Compound Fig. 14).
    pub fn zero_copy(mut self, on: bool) -> Self {
        self.inner.fast_path.zero_copy = on;
        self
    }

    /// Largest DATA chunk on the fast path.
    pub fn max_chunk(mut self, bytes: usize) -> Self {
        self.inner.fast_path.max_chunk = bytes;
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
        self.inner.fast_path.call_window = bytes;
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
        self.inner.fast_path.max_header_list_size = bytes;
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
        self.inner.fast_path.max_concurrent_calls = calls;
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
        self.inner.polling.poller = Some(poller);
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
        self.inner.polling.receive_spin = spin;
        self
    }

    /// How long a new connection's whole setup may take: rrpc-core's
    /// handshake (hello, grants, accept) plus the path negotiation that
    /// follows. Default 5 s. A server drops a client that has not finished
    /// within it (each client's setup runs on its own, so a slow or silent
    /// client never delays another); a client gives up with
    /// [`crate::Error::Handshake`] or a timeout error. Above zero.
    pub fn handshake_timeout(mut self, t: std::time::Duration) -> Self {
        self.inner.admission.handshake_timeout = t;
        self
    }

    /// How many connections a server lets be in setup at once (accepted,
    /// handshake or path negotiation not finished). Default 1024. A client
    /// arriving while the limit is reached is closed at once and the
    /// refusal logged, so silent clients cost the server at most this many
    /// sockets and small tasks (never a thread each) for at most
    /// [`RrpcConfig::handshake_timeout`]. Within 1 ..= `usize::MAX >> 3`
    /// (the permits a tokio semaphore can count).
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.inner.admission.max_pending_handshakes = n;
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
        self.inner.admission.max_connections = n;
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
        self.inner.admission.max_connections_per_peer = n;
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
        self.inner.admission.token = Some(t.into());
        self
    }

    /// Whether every ring message is encrypted and authenticated
    /// (default [`RingEncryption::Off`]; feature `tls`): an AEAD
    /// (AES-256-GCM, or ChaCha20-Poly1305 on a CPU without AES
    /// instructions) with a key per direction exported from the TLS
    /// session of the connection's `rrpc://` negotiation, and a nonce per
    /// message from its sequence number, so an altered, replayed,
    /// reordered or dropped message fails the connection with `DataLoss`
    /// and delivers nothing. Each message grows by a 16-byte tag, which
    /// counts against the ring's message limit. [`RingEncryption::Remote`]
    /// seals `rdma://` only; [`RingEncryption::Required`] `shm://` too.
    /// Needs TLS on the `rrpc://` port (`Server::tls_config`,
    /// `RrpcEndpoint::tls_config`) and the same setting on both ends.
    pub fn ring_encryption(mut self, mode: RingEncryption) -> Self {
        self.inner.security.ring_encryption = mode;
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
        self.inner.admission.tls.server = Some(config);
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
        self.inner.admission.tls.client = Some((config, server_name));
        self
    }

    /// The verbs device `rdma://` uses, by name (e.g. `mlx5_0`, `rxe0`);
    /// default: the first device libibverbs lists. The device and its
    /// protection domain are opened once per [`RrpcContext`](crate::RrpcContext),
    /// at its first `rdma://` connection. Not empty.
    pub fn rdma_device(mut self, name: impl Into<String>) -> Self {
        self.inner.device.rdma_device = Some(name.into());
        self
    }

    /// The physical port of [`RrpcConfig::rdma_device`] that `rdma://`
    /// uses (numbered from 1, so 0 is refused by [`build`](Self::build));
    /// default 1. A port the device does not have
    /// fails the first `rdma://` connection with an error naming the ports
    /// there are.
    pub fn rdma_port(mut self, port: u8) -> Self {
        self.inner.device.rdma_port = Some(port);
        self
    }

    /// The source GID index `rdma://` uses on that port. Default: on RoCE
    /// the first IPv4-mapped RoCE v2 GID of the port's table, else 0; on
    /// InfiniBand 0 (`rrpc_core::VerbsOptions::gid_index` with the
    /// `verbs` feature). An index outside the port's table, or naming an
    /// empty entry, fails the first `rdma://` connection with an error
    /// naming the index and the table's length.
    pub fn rdma_gid_index(mut self, index: u8) -> Self {
        self.inner.device.rdma_gid_index = Some(index);
        self
    }

    /// The queue-pair settings of every connection made or accepted with
    /// this config (default [`rrpc_core::QpConfig::default`]). Besides the
    /// queue depths it carries rrpc-core's fault injector
    /// ([`rrpc_core::QpConfig::fault`], shm only): delayed and missed
    /// completions, failing work requests, torn writes, so that a service's
    /// own tests can run the whole gRPC stack under verbs-like faults.
    ///
    /// Its send depth must hold what a ring keeps outstanding (770 slots
    /// with the ring's default `sq_depth`, `rrpc_ringbuf::RingConfig::send_queue_need`;
    /// the default is 1024), or [`build`](Self::build) refuses it.
    pub fn queue_pair(mut self, qp: rrpc_core::QpConfig) -> Self {
        self.inner.device.queue_pair = qp;
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
        self.inner.device.queue_pair = self
            .inner
            .device
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
    /// pages), while it waits. At most 1024 (a pool reserves a place for
    /// each bundle when it starts).
    pub fn connection_pool(mut self, n: usize) -> Self {
        self.inner.device.connection_pool = Some(n);
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
    /// the server; one that finds none dials as before. Spares nobody
    /// takes are dropped when their lease ends (a task of the context
    /// looks every quarter lease). At most [`MAX_SPARE_CONNECTIONS`].
    ///
    /// With [`Self::shared_queue_pairs`] on `shm://` the spares are
    /// *lanes* over the shared connection (one message each on its side
    /// channel, rings in the arenas it granted), opened together on a task
    /// of the runtime, no thread of their own: a refill of `n` costs about
    /// one round trip, and back-to-back connects run at the rate the
    /// server answers opens, not one round trip each. With shared queue
    /// pairs elsewhere (`rdma://`) logical connections are dialed as
    /// before, with no spares.
    ///
    /// Default: 0 (off). A spare is a whole connection the server holds
    /// (its rings, a connection task) while nobody uses it, and each taken
    /// one costs a full connect on a background thread (a lane: one open):
    /// worth it for a client that connects often to the same servers, not
    /// for one that keeps one channel (docs/measured.md, "Where a
    /// connect's time goes").
    pub fn spare_connections(mut self, n: usize) -> Self {
        self.inner.sharing.spare_connections = n;
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
        self.inner.sharing.shared_queue_pairs = on;
        self
    }

    /// How long a client keeps a shared connection to a server cached after
    /// the last connect that used it, once no connection runs over it (the
    /// lease of `rrpc_core::meta::PeerCache`). A cached shared connection is
    /// also dropped as soon as its peer is seen down: its side channel
    /// closed, or the server no longer knows it, or (`rrpc://`) the port
    /// names another side listener, its server having restarted. Once the
    /// lease ends it is closed within a quarter lease (a task on the
    /// connecting runtime sweeps the cache), whether or not the process
    /// connects again. Default 10 s
    /// ([`DEFAULT_PEER_LEASE`]); above zero and at most 365 days (the
    /// cache adds it to a clock).
    pub fn peer_lease(mut self, lease: std::time::Duration) -> Self {
        self.inner.sharing.peer_lease = lease;
        self
    }

    /// The most shared connections a client caches, and a server holds, at
    /// once. A client past it closes the one whose lease ends first; a
    /// server past it refuses new shared connections (their clients then
    /// fail to connect, with the reason). Default 1024
    /// ([`DEFAULT_MAX_SHARED_PEERS`]).
    pub fn max_shared_peers(mut self, n: usize) -> Self {
        self.inner.sharing.max_shared_peers = n;
        self
    }

    /// Bounds the memory the ready bundles of a context's pools hold
    /// together (every provider and ring size: KRCore's size classes share
    /// one bound). A pool at its bound stops refilling, and connects beyond
    /// it build inline (counted as misses, never refused). Default 64 MiB.
    pub fn connection_pool_memory(mut self, max_bytes: u64) -> Self {
        self.inner.device.connection_pool_memory = max_bytes;
        self
    }

    /// Validates every setting and returns the config: each group checks
    /// its own settings ([`RrpcConfig`] docs, "Settings"), then the rule
    /// across groups. A config that builds is one a server can serve and a
    /// client can connect with (what the peer or the device says is
    /// checked when they say it).
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] naming the first setting refused and
    /// its rule:
    ///
    /// * rings, each by the ring's own rule (`rrpc_ringbuf::RingConfig`):
    ///   `ring_size` a power of two of at least 128 bytes (two 64-byte
    ///   slots) and at most 1 GiB; `min_ring_size`, if set, a power of two
    ///   of at least 128 bytes within `ring_size / 128 ..= ring_size`;
    ///   `ring_cache_size`, if set, a power of two within
    ///   `min_ring_size ..= ring_size`; `ring_shrink_after` within
    ///   1 ms ..= 365 days; `max_message_size` above 0;
    /// * fast path: `max_chunk`, `max_header_list_size` and
    ///   `max_concurrent_calls` above 0; `call_window` within
    ///   1 KiB ..= 2^31 - 1;
    /// * handshake and admission: `handshake_timeout` above zero; `token`,
    ///   if set, 1..=256 bytes; `max_pending_handshakes` within
    ///   1 ..= `usize::MAX >> 3` (a tokio semaphore's permits);
    ///   `max_connections` above 0; `max_connections_per_peer` within
    ///   1 ..= `max_connections`;
    /// * device: `rdma_device`, if set, not empty; `rdma_port`, if set, at
    ///   least 1; `connection_pool` at most 1024;
    /// * connection sharing: `spare_connections` at most
    ///   [`MAX_SPARE_CONNECTIONS`]; `peer_lease` above zero and at most
    ///   365 days; `max_shared_peers` at least 1;
    /// * security: `ring_encryption` other than `Off` only with the `tls`
    ///   feature;
    /// * fabrics: `fabrics` not empty;
    /// * across groups: `queue_pair`'s send depth at least the send-queue
    ///   slots a ring needs (770 with the ring's default `sq_depth` of 1024).
    pub fn build(self) -> Result<RrpcConfig, crate::Error> {
        self.inner.validate()?;
        Ok(RrpcConfig(Arc::new(self.inner)))
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
