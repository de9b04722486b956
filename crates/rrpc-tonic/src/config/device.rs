//! The device group of [`RrpcConfig`](super::RrpcConfig): the verbs device
//! `rdma://` opens, and the queue pairs and connection pools of every
//! rings fabric (shm too).

use crate::Error;

/// The most bundles a connection pool may keep
/// ([`RrpcConfigBuilder::connection_pool`](super::RrpcConfigBuilder::connection_pool)):
/// a pool reserves a place for each bundle when it starts (a capacity near
/// `usize::MAX` panics there), and its memory bound stops it far sooner
/// with the defaults (the default 64 MiB holds eight bundles of two 4 MiB
/// rings).
pub(super) const MAX_CONNECTION_POOL: usize = 1024;

/// The device group ([`RrpcConfig`](super::RrpcConfig) docs, "Settings").
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DeviceSettings {
    pub(super) rdma_device: Option<String>,
    pub(super) rdma_port: Option<u8>,
    pub(super) rdma_gid_index: Option<u8>,
    /// Every connection's queue-pair settings (its `rc_retry` included).
    pub(super) queue_pair: rrpc_core::QpConfig,
    /// Connections' resources made ahead of time (0: off; `None`: the
    /// provider's default, `DEFAULT_RDMA_CONNECTION_POOL` on verbs).
    pub(super) connection_pool: Option<usize>,
    /// The memory bound of the ready bundles of every pool of a context.
    pub(super) connection_pool_memory: u64,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        DeviceSettings {
            rdma_device: None,
            rdma_port: None,
            rdma_gid_index: None,
            queue_pair: rrpc_core::QpConfig::default(),
            connection_pool: None,
            connection_pool_memory: 64 << 20,
        }
    }
}

impl DeviceSettings {
    /// Checks every setting of the group (the queue-pair settings were
    /// checked by their own builder; their send depth against the ring in
    /// [`RrpcConfigBuilder::build`](super::RrpcConfigBuilder::build)).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first setting refused and its rule.
    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |rule: &'static str| Err(Error::InvalidConfig(rule));
        if self.rdma_device.as_deref() == Some("") {
            return bad("rdma_device must not be empty");
        }
        if self.rdma_port == Some(0) {
            return bad("rdma_port must be at least 1 (ports are numbered from 1)");
        }
        if self
            .connection_pool
            .is_some_and(|n| n > MAX_CONNECTION_POOL)
        {
            return bad("connection_pool must be at most 1024");
        }
        Ok(())
    }
}
