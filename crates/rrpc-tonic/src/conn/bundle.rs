//! What a connection needs before its handshake, made ahead of time
//! (KRCore's pre-initialised connection pool, §3.1): both rings' regions
//! and a queue pair. A leaf: the context owns the pools, the rings
//! transport takes bundles from them.

use rrpc_core::{Fabric, QpConfig};
use rrpc_poller::rings::{LocalRing, RingConfig};

/// What one connection needs before its handshake: both rings' regions
/// and a queue pair (KRCore's pre-initialised bundle).
pub(crate) type Bundle = (LocalRing, rrpc_core::QueuePair);

/// A pool of [`Bundle`]s ([`RrpcConfig::connection_pool`](crate::RrpcConfig::connection_pool)).
pub(crate) type BundlePool = rrpc_core::pool::ResourcePool<Bundle>;

/// Makes one [`Bundle`] on `fabric`, in a protection domain of its own
/// (`Fabric::isolated`): a peer that learned another connection's region
/// key, or guessed one, is refused by the NIC.
pub(crate) fn make_bundle(
    fabric: &Fabric,
    ring: &RingConfig,
    qp: &QpConfig,
) -> Result<Bundle, rrpc_core::Error> {
    let fabric = &fabric.isolated()?;
    let local = LocalRing::new(fabric, ring).map_err(|e| match e {
        rrpc_ringbuf::Error::Core(c) => c,
        other => rrpc_core::Error::InvalidConfig(other.to_string()),
    })?;
    let qp = fabric.create_qp(qp)?;
    Ok((local, qp))
}
