//! The connection-sharing group of [`RrpcConfig`](super::RrpcConfig):
//! connections kept ready ahead (spares) and connections sharing a queue
//! pair per peer.

use std::time::Duration;

use super::rings::MAX_CLOCK_DURATION;
use crate::Error;

/// The default of [`RrpcConfig::peer_lease`](super::RrpcConfig::peer_lease).
pub const DEFAULT_PEER_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// The most [`RrpcConfig::spare_connections`](super::RrpcConfig::spare_connections) a config may ask for: each
/// is a whole connection a server holds for a client that may never use it.
pub const MAX_SPARE_CONNECTIONS: usize = 16;

/// The default of [`RrpcConfig::max_shared_peers`](super::RrpcConfig::max_shared_peers).
pub const DEFAULT_MAX_SHARED_PEERS: usize = 1024;

/// The connection-sharing group ([`RrpcConfig`](super::RrpcConfig) docs,
/// "Settings").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SharingSettings {
    /// Connections handshaken ahead per server a client connected to.
    pub(super) spare_connections: usize,
    /// Logical connections over one queue pair per peer.
    pub(super) shared_queue_pairs: bool,
    /// How long a shared connection nobody uses stays cached.
    pub(super) peer_lease: Duration,
    /// Shared connections cached (client) or accepted (server) at once.
    pub(super) max_shared_peers: usize,
}

impl Default for SharingSettings {
    fn default() -> Self {
        SharingSettings {
            spare_connections: 0,
            shared_queue_pairs: false,
            peer_lease: DEFAULT_PEER_LEASE,
            max_shared_peers: DEFAULT_MAX_SHARED_PEERS,
        }
    }
}

impl SharingSettings {
    /// Checks every setting of the group.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first setting refused and its rule.
    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |rule: &'static str| Err(Error::InvalidConfig(rule));
        if self.spare_connections > MAX_SPARE_CONNECTIONS {
            return bad("spare_connections must be at most 16");
        }
        // The peer cache adds the lease to `Instant::now()`.
        if self.peer_lease.is_zero() || self.peer_lease > MAX_CLOCK_DURATION {
            return bad("peer_lease must be above zero and at most 365 days");
        }
        if self.max_shared_peers == 0 {
            return bad("max_shared_peers must be at least 1");
        }
        Ok(())
    }
}
