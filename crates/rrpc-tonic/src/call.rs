//! What every call path shares: the future a call returns, the user agent
//! tonic sends, and what a channel reports about the path and the fabric
//! that carry it.

use tonic::body::Body;

use crate::transport::Target;
use crate::{Error, RrpcContext};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// tonic's own `user-agent` (its `UserAgent` layer is private): the fast
/// path sends the same, so handlers read the same value on every path.
/// `tests/integration/tests/suite/parity.rs` compares it with what tonic sends
/// over TCP, so a tonic upgrade that changes it fails there.
pub(crate) const TONIC_USER_AGENT: &str = "tonic/0.14.9";

/// The future returned by [`RrpcChannel`](crate::RrpcChannel)'s `call`.
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

/// What carries a channel's bytes ([`RrpcChannel::carrier`](crate::RrpcChannel::carrier)): tests and
/// operators can check that `rdma://` really runs on the RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Carrier {
    /// TCP (`http://`, or `rrpc://` when the negotiation chose TCP).
    Tcp,
    /// A Unix socket (`unix://`).
    Unix,
    /// An in-process pipe (`inproc://`).
    Inproc,
    /// Shared-memory rings (`shm://`, or `rrpc://` when the negotiation
    /// chose shm; rrpc-core's shm provider).
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
    /// A balance over several endpoints ([`RrpcChannel::balance_list`](crate::RrpcChannel::balance_list)),
    /// in the order given.
    Balanced(Vec<Carrier>),
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

/// What `target` asks for; `rdma://` opens `ctx`'s device to name it.
pub(crate) fn carrier_of(target: &Target, ctx: &RrpcContext) -> Result<Carrier, Error> {
    Ok(match target {
        Target::Tcp(_) => Carrier::Tcp,
        Target::Unix(_) => Carrier::Unix,
        Target::Inproc(_) => Carrier::Inproc,
        Target::Shm(_) => Carrier::Shm,
        // The negotiation decides; a ring channel on a port is shm.
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
