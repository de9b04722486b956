//! [`RrpcContext`]: the runtime state servers and channels share (polling
//! threads, the verbs device, connection pools, shared queue pairs), kept
//! apart from [`RrpcConfig`], which is settings only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use rrpc_poller::Poller;

use crate::config::default_poller_config;
use crate::conn::sharing::{Anchors, Peers};
use crate::conn::spare::{Spare, Spares};
use crate::{Error, RrpcConfig};

/// The runtime state of rrpc's `shm://` and `rdma://` connections: the
/// poller (its polling threads), the verbs device and protection domain,
/// the connection pools ([`RrpcConfig::connection_pool`]) and the shared
/// connections ([`RrpcConfig::shared_queue_pairs`]) a client caches and a
/// server holds.
///
/// Cheap to clone (an `Arc`); clones are the same context. Every resource
/// starts at its first use, never at creation: a context nobody connects
/// with costs no thread, no device and no memory beyond itself. It ends
/// (pools, cached shared connections, its own poller) when the last clone
/// goes; connections still open keep what they use.
///
/// # Which context a server or channel uses
///
/// * **Explicit**: [`Server::context`](crate::Server::context),
///   [`RrpcEndpoint::context`](crate::RrpcEndpoint::context),
///   [`RrpcIncoming::bind_with_context`](crate::RrpcIncoming::bind_with_context).
///   [`RrpcContext::new`] makes a context of its own (separate pools, device,
///   shared connections and, for a config that sets a poller, separate
///   polling threads): for example a client that should not share with the
///   server of the same process, as a client in another process would not.
/// * **Default**: [`RrpcContext::shared`] of the config, the one context of the
///   process for configs equal to it (clones included), alive while a
///   server, a channel or a handle uses it. So many channels from one
///   config share one poller, one device and one pool, as they did when
///   this state lived in the config, and a server and a client of one
///   process given equal configs share them too. Equality rather than the
///   config's identity because a config is plain settings: two equal
///   configs ask for the same resources, and a setting that differs (a
///   path, a token) makes another context.
///
/// Hold a `RrpcContext` (or pass one explicitly) to keep its pools, cached
/// shared connections and poller between channels: a default context with
/// no server, channel or handle left ends, and the next channel starts a
/// new one.
///
/// # Which settings are the context's
///
/// A context's resources follow the config it was made with
/// ([`RrpcContext::config`]): [`poller`](RrpcConfig::poller) and
/// [`numa_node`](RrpcConfig::numa_node) (the poller),
/// [`rdma_device`](RrpcConfig::rdma_device),
/// [`rdma_port`](RrpcConfig::rdma_port) and
/// [`rdma_gid_index`](RrpcConfig::rdma_gid_index) (the device),
/// [`queue_pair`](RrpcConfig::queue_pair),
/// [`connection_pool`](RrpcConfig::connection_pool) and
/// [`connection_pool_memory`](RrpcConfig::connection_pool_memory) (the
/// pools), [`peer_lease`](RrpcConfig::peer_lease) and
/// [`max_shared_peers`](RrpcConfig::max_shared_peers) (shared connections).
/// A server or channel given a context must agree with it on these (else
/// [`Error::InvalidConfig`] when it binds or connects); everything else
/// (path, rings, windows, token, ...) is the server's or channel's own.
///
/// # The poller
///
/// A context whose config sets no [`poller`](RrpcConfig::poller) and no
/// [`numa_node`](RrpcConfig::numa_node) placement uses the process-wide
/// poller built from [`default_poller_config`] (one polling thread for the
/// whole process, as before contexts); otherwise it starts a poller of its
/// own at its first connection.
#[derive(Clone)]
pub struct RrpcContext(Arc<Inner>);

struct Inner {
    config: RrpcConfig,
    /// Registered as the default context of `config` ([`RrpcContext::shared`]).
    shared: bool,
    poller: OnceLock<Poller>,
    /// The verbs device and protection domain, opened at the first
    /// `rdma://` connection.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    fabric: Mutex<Option<rrpc_core::Fabric>>,
    pools: Mutex<Pools>,
    /// The shared connections clients opened in this context.
    peers: Peers,
    /// The shared connections servers of this context accepted.
    anchors: Anchors,
    /// Connections its clients dialed ahead ([`RrpcConfig::spare_connections`]).
    spares: Spares<Spare>,
    /// The ring endpoints `rrpc://` ports named to its clients ([`PortMemo`]).
    ports: PortMemo,
}

/// The connection pools of a context, one per provider.
#[derive(Default, Debug)]
struct Pools {
    pools: Vec<(
        rrpc_core::ProviderKind,
        Arc<crate::conn::bundle::BundlePool>,
    )>,
    /// Their shared memory bound (made with the first pool).
    budget: Option<Arc<rrpc_core::pool::PoolBudget>>,
}

impl std::fmt::Debug for RrpcContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RrpcContext")
            .field("id", &Arc::as_ptr(&self.0))
            .field("shared", &self.0.shared)
            .field("poller", &self.0.poller.get())
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        tracing::debug!(
            id = ?(self as *const Inner),
            shared = self.shared,
            "rrpc: context ended"
        );
    }
}

/// The default contexts, by config ([`RrpcContext::shared`]).
type Registry = Mutex<Vec<(RrpcConfig, Weak<Inner>)>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl RrpcContext {
    fn make(config: &RrpcConfig, shared: bool) -> Arc<Inner> {
        let inner = Arc::new(Inner {
            config: config.clone(),
            shared,
            poller: OnceLock::new(),
            fabric: Mutex::new(None),
            pools: Mutex::default(),
            peers: Peers::default(),
            anchors: Anchors::default(),
            spares: Spares::default(),
            ports: PortMemo::default(),
        });
        tracing::debug!(id = ?Arc::as_ptr(&inner), shared, "rrpc: context created");
        inner
    }

    /// A new context of its own for servers and channels of `config` (and
    /// of configs that agree with it on the context's settings): shares
    /// nothing with any other context but the process-wide default poller
    /// (see the type's docs, "The poller").
    pub fn new(config: &RrpcConfig) -> Self {
        RrpcContext(Self::make(config, false))
    }

    /// The default context of `config`: the one alive for a config equal to
    /// it, or a new one. Servers and channels given no context use this.
    pub fn shared(config: &RrpcConfig) -> Self {
        let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        // Strong handles taken while looking, dropped after the lock: a
        // context whose last user left meanwhile ends (closing its
        // connections) outside it.
        let mut seen = Vec::new();
        // Ended contexts leave their entries: dropped here.
        r.retain(|(c, w)| match w.upgrade() {
            Some(inner) => {
                if found.is_none() && c == config {
                    found = Some(inner.clone());
                }
                seen.push(inner);
                true
            }
            None => false,
        });
        let ctx = match found {
            Some(inner) => RrpcContext(inner),
            None => {
                let inner = Self::make(config, true);
                r.push((config.clone(), Arc::downgrade(&inner)));
                RrpcContext(inner)
            }
        };
        drop(r);
        drop(seen);
        ctx
    }

    /// The config this context was made with: its resources follow it.
    pub fn config(&self) -> &RrpcConfig {
        &self.0.config
    }

    /// Whether `self` and `other` are the same context (clones of one).
    pub fn ptr_eq(&self, other: &RrpcContext) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Fails unless a server or channel of `config` may use this context:
    /// the settings its resources follow are equal (type docs).
    pub(crate) fn check(&self, config: &RrpcConfig) -> Result<(), Error> {
        if self.0.config.same_resources(config) {
            Ok(())
        } else {
            Err(Error::InvalidConfig(
                "the context was made for a config with other poller, NUMA, rdma device, \
                 queue-pair, connection-pool or peer settings (rrpc_tonic::RrpcContext)",
            ))
        }
    }

    /// The poller of this context's connections, started on first use
    /// (type docs, "The poller"): its counters ([`Poller::stats`]) show
    /// polls, wake-ups, spin hits and sleeps.
    ///
    /// # Errors
    /// [`Error::Io`] when its polling threads cannot be started.
    pub fn poller_handle(&self) -> Result<Poller, Error> {
        if let Some(p) = self.0.poller.get() {
            return Ok(p.clone());
        }
        let cfg = &self.0.config;
        let placement = cfg.numa_node();
        let p = match cfg.poller() {
            Some(pc) => rrpc_poller::Poller::start(pc.clone())?,
            // A placement of its own: this context's poller, not the
            // process-wide one.
            None if placement != rrpc_core::numa::NumaPlacement::Device => {
                rrpc_poller::Poller::start(
                    default_poller_config()
                        .to_builder()
                        .numa_node(placement)
                        .build()?,
                )?
            }
            None => {
                static DEFAULT: OnceLock<Poller> = OnceLock::new();
                match DEFAULT.get() {
                    Some(p) => p.clone(),
                    None => {
                        let p = rrpc_poller::Poller::start(default_poller_config())?;
                        DEFAULT.get_or_init(|| p).clone()
                    }
                }
            }
        };
        Ok(self.0.poller.get_or_init(|| p).clone())
    }

    /// The pool's counters per provider (empty until a pooled connection
    /// was made in this context).
    pub fn pool_stats(&self) -> Vec<(rrpc_core::ProviderKind, rrpc_core::pool::PoolStats)> {
        self.0
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pools
            .iter()
            .map(|(k, p)| (*k, p.stats()))
            .collect()
    }

    /// The shared connections ([`RrpcConfig::shared_queue_pairs`]) of this
    /// context now: those its clients opened (still cached), then those its
    /// servers accepted. One per client and server pair, so a client with
    /// many connections to one server shows one queue pair.
    pub fn shared_connections(&self) -> Vec<crate::SharedConnectionStats> {
        let mut v = self.0.peers.stats();
        v.extend(self.0.anchors.stats());
        v
    }

    /// The spare connections ([`RrpcConfig::spare_connections`]) of this
    /// context: how many wait now (each is a connection its server holds
    /// too), and how many were made, taken and dropped unused.
    pub fn spare_stats(&self) -> crate::SpareStats {
        self.0.spares.stats()
    }

    /// The spare connections its clients dialed ahead.
    pub(crate) fn spares(&self) -> &Spares<Spare> {
        &self.0.spares
    }

    /// The client's cache of shared connections.
    pub(crate) fn peers(&self) -> &Peers {
        &self.0.peers
    }

    /// The shared connections this context's servers hold.
    pub(crate) fn anchors(&self) -> &Anchors {
        &self.0.anchors
    }

    /// The ring endpoints `rrpc://` ports named to this context's clients.
    pub(crate) fn ports(&self) -> &PortMemo {
        &self.0.ports
    }

    /// The pool of bundles for `fabric` (created at the first call), or
    /// `None` when pooling is off.
    pub(crate) fn bundle_pool(
        &self,
        fabric: &rrpc_core::Fabric,
        make: impl FnOnce(Arc<rrpc_core::pool::PoolBudget>) -> crate::conn::bundle::BundlePool,
    ) -> Option<Arc<crate::conn::bundle::BundlePool>> {
        let kind = fabric.kind();
        if self.0.config.connection_pool_for(kind) == 0 {
            return None;
        }
        let mut cell = self.0.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cell.pools.iter().find(|(k, _)| *k == kind) {
            return Some(p.clone());
        }
        let budget = cell
            .budget
            .get_or_insert_with(|| {
                rrpc_core::pool::PoolBudget::new(self.0.config.connection_pool_memory())
            })
            .clone();
        let p = Arc::new(make(budget));
        cell.pools.push((kind, p.clone()));
        Some(p)
    }

    /// The fabric for `rdma://`: opened at the first call, then shared.
    #[cfg(feature = "verbs")]
    pub(crate) fn verbs_fabric(&self) -> Result<rrpc_core::Fabric, Error> {
        let mut cell = self.0.fabric.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cell.as_ref() {
            return Ok(f.clone());
        }
        let f = rrpc_core::Fabric::verbs_with(&self.0.config.verbs_options())?;
        // RB² §IV-C: the polling threads go to the device's node (a
        // poller placed otherwise ignores it).
        let node = self.poller_handle()?.place_for_device(f.numa_node());
        tracing::info!(
            device = ?f.device_name(),
            port_and_gid_index = ?f.verbs_port(),
            numa_node = ?f.numa_node(),
            pollers_on_node = ?node,
            "rrpc: verbs device opened"
        );
        *cell = Some(f.clone());
        Ok(f)
    }
}

/// The ring endpoints `rrpc://` ports named in their negotiations with a
/// context's clients: a client that connects to a port again within
/// [`RrpcConfig::peer_lease`] of the last connection through it dials the
/// endpoint named then, with no TCP connection and no negotiation first
/// (the negotiation folded into the ring handshake; `RrpcEndpoint::connect`
/// on `rrpc://`). Keyed by the port and the fabrics the client allows, so
/// a client that allows other fabrics negotiates its own choice. Never
/// for a port dialed with TLS: there each ring connection presents the
/// ticket of a TLS session, which only a negotiation gives. An endpoint
/// that fails to connect is forgotten and the port negotiated again (its
/// server restarted: the shm socket's name holds the pid, the verbs side
/// channel's port is the OS's pick).
#[derive(Debug, Default)]
pub(crate) struct PortMemo(Mutex<HashMap<(String, u8), (rrpc_core::FabricAddr, Instant)>>);

/// The most ports a context remembers: past it, the stalest entry goes.
const PORT_MEMO_MAX: usize = 1024;

impl PortMemo {
    /// The endpoint `port` named for `fabrics` at most `lease` ago.
    pub(crate) fn get(
        &self,
        port: &str,
        fabrics: u8,
        lease: Duration,
        now: Instant,
    ) -> Option<rrpc_core::FabricAddr> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (ep, at) = map.get(&(port.to_owned(), fabrics))?;
        (now.saturating_duration_since(*at) < lease).then(|| ep.clone())
    }

    /// Remembers that `port` named `ep` for `fabrics`, and a connection
    /// through it was made at `now`.
    pub(crate) fn put(&self, port: &str, fabrics: u8, ep: rrpc_core::FabricAddr, now: Instant) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (port.to_owned(), fabrics);
        if map.len() >= PORT_MEMO_MAX && !map.contains_key(&key) {
            let stalest = map
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = stalest {
                map.remove(&k);
            }
        }
        map.insert(key, (ep, now));
    }

    /// Forgets what `port` named for `fabrics` if it is still `ep`.
    pub(crate) fn forget(&self, port: &str, fabrics: u8, ep: &rrpc_core::FabricAddr) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (port.to_owned(), fabrics);
        if map.get(&key).is_some_and(|(e, _)| e == ep) {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rrpc_core::numa::NumaPlacement;
    use rrpc_poller::PollerConfig;

    #[test]
    fn a_port_memo_keeps_an_endpoint_for_its_lease_and_forgets_a_stale_one() {
        let m = PortMemo::default();
        let (t0, lease) = (Instant::now(), Duration::from_secs(10));
        let a = rrpc_core::FabricAddr::Shm("/run/a.sock".into());
        let b = rrpc_core::FabricAddr::Shm("/run/b.sock".into());
        assert_eq!(m.get("h:1", 1, lease, t0), None);
        m.put("h:1", 1, a.clone(), t0);
        assert_eq!(
            m.get("h:1", 1, lease, t0 + Duration::from_secs(9)),
            Some(a.clone())
        );
        assert_eq!(m.get("h:1", 1, lease, t0 + lease), None, "past its lease");
        assert_eq!(m.get("h:1", 3, lease, t0), None, "other fabrics allowed");
        assert_eq!(m.get("h:2", 1, lease, t0), None, "another port");
        // Forgetting an endpoint replaced meanwhile keeps the new one.
        m.put("h:1", 1, b.clone(), t0);
        m.forget("h:1", 1, &a);
        assert_eq!(m.get("h:1", 1, lease, t0), Some(b.clone()));
        m.forget("h:1", 1, &b);
        assert_eq!(m.get("h:1", 1, lease, t0), None);
        // Bounded: the stalest entry goes.
        for i in 0..PORT_MEMO_MAX + 5 {
            m.put(
                &format!("h:{i}"),
                1,
                a.clone(),
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(m.0.lock().unwrap().len(), PORT_MEMO_MAX);
        assert_eq!(m.get("h:0", 1, lease, t0), None);
        assert!(
            m.get(&format!("h:{}", PORT_MEMO_MAX + 4), 1, lease, t0)
                .is_some()
        );
    }

    #[test]
    fn equal_configs_share_a_context_while_it_lives() {
        let cfg = RrpcConfig::builder()
            .token("context-test-equal")
            .build()
            .expect("token");
        let a = RrpcContext::shared(&cfg);
        assert!(a.ptr_eq(&RrpcContext::shared(&cfg.clone())));
        // Built apart but equal: the same settings, the same context.
        let twin = RrpcConfig::builder()
            .token("context-test-equal")
            .build()
            .expect("token");
        assert!(a.ptr_eq(&RrpcContext::shared(&twin)));
        // Another setting, another context; an explicit one is its own.
        let other = cfg
            .to_builder()
            .path(crate::PathPreference::Http2)
            .build()
            .unwrap();
        assert!(!a.ptr_eq(&RrpcContext::shared(&other)));
        assert!(!a.ptr_eq(&RrpcContext::new(&cfg)));
        let weak = Arc::downgrade(&a.0);
        drop(a);
        assert!(weak.upgrade().is_none(), "no user left: the context ended");
    }

    #[test]
    fn a_context_checks_the_settings_it_owns() {
        let cfg = RrpcConfig::default();
        let ctx = RrpcContext::new(&cfg);
        // Per-connection settings are the server's or channel's own.
        ctx.check(
            &cfg.to_builder()
                .path(crate::PathPreference::Http2)
                .build()
                .unwrap(),
        )
        .expect("path");
        ctx.check(&cfg.to_builder().token("t").build().expect("token"))
            .expect("token");
        for other in [
            cfg.to_builder().connection_pool(3).build().unwrap(),
            cfg.to_builder().rdma_device("rxe9").build().unwrap(),
            cfg.to_builder()
                .poller(PollerConfig::default())
                .build()
                .unwrap(),
            cfg.to_builder()
                .numa_node(NumaPlacement::Off)
                .build()
                .unwrap(),
            cfg.to_builder().max_shared_peers(3).build().expect("peers"),
        ] {
            assert!(ctx.check(&other).is_err(), "{other:?}");
        }
    }

    #[test]
    fn a_numa_node_reaches_the_rings_and_a_poller_of_its_own() {
        let shared = RrpcConfig::default();
        assert_eq!(shared.numa_node(), NumaPlacement::Device);
        // Node 0 exists on every Linux host.
        let placed = RrpcConfig::builder()
            .numa_node(NumaPlacement::Node(0))
            .build()
            .unwrap();
        let ring = crate::conn::rings::ring_config_for_tests(&placed).expect("ring config");
        assert_eq!(ring.numa_node(), NumaPlacement::Node(0));
        let ctx = RrpcContext::shared(&placed);
        let p = ctx.poller_handle().expect("poller");
        assert_eq!(p.numa_node(), Some(0));
        // Its own poller, shared by the context's users: the process-wide
        // default one is not placed.
        let again = RrpcContext::shared(&placed.clone()).poller_handle();
        assert!(again.expect("poller").ptr_eq(&p));
        let default = RrpcContext::shared(&shared)
            .poller_handle()
            .expect("default");
        assert_eq!(default.numa_node(), None);
        assert!(!default.ptr_eq(&p));
        // Every context of a config without poller or placement: the
        // process-wide poller.
        let own = RrpcContext::new(&shared).poller_handle().expect("default");
        assert!(own.ptr_eq(&default));
        // Another placement, another context, another poller.
        let off = placed
            .to_builder()
            .numa_node(NumaPlacement::Off)
            .build()
            .unwrap();
        assert_eq!(
            RrpcContext::shared(&off)
                .poller_handle()
                .expect("poller")
                .numa_node(),
            None
        );
    }
}
