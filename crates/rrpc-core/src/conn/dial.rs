//! The client side: [`connect`] dials a listener and runs the handshake.

use crate::endpoint::Endpoint;
// Named by the docs.
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::provider::shm::side::{attach, connect_unix, exchange_unix, make_hello};
#[cfg(feature = "verbs")]
use crate::provider::verbs::side;
use crate::qp::QueuePair;
use crate::settings::ProviderKind;

use super::established::{Connection, Side};
#[cfg(feature = "verbs")]
use super::exchange::base_hello;
use super::exchange::{Deadline, Offer, peer_info};
use super::settings::HandshakeConfig;

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// Connects to a listening server, performs the handshake and attaches `qp` to
/// the server's. Blocking; the whole handshake (connect included) is bounded
/// by `cfg.timeout()`. The server's grants are checked like a server checks
/// a client's (descriptor kinds, [`HandshakeConfig::max_grant_bytes`]).
///
/// # Errors
/// [`Error::Rejected`], [`Error::AuthFailed`] or [`Error::VersionMismatch`] when
/// the server refused; [`Error::MalformedHandshake`] when its answer was bad;
/// [`Error::LimitExceeded`] when it granted more than `cfg.max_grant_bytes()`;
/// [`Error::Timeout`]; [`Error::Io`] when the socket could not be reached;
/// [`Error::ProviderUnavailable`] for `rdma://` in a build without verbs.
pub fn connect(
    endpoint: &Endpoint,
    qp: QueuePair,
    offer: Offer,
    cfg: &HandshakeConfig,
) -> Result<Connection> {
    let span = tracing::debug_span!("rrpc_connect", %endpoint);
    let _g = span.enter();
    let deadline = Deadline::after(cfg.timeout);
    let path = match endpoint {
        Endpoint::Shm(p) => p,
        #[cfg(feature = "verbs")]
        Endpoint::Rdma(addr) => {
            let (s, accept) = side::client(
                *addr,
                &qp,
                base_hello(&offer),
                deadline,
                cfg.keepalive.as_ref(),
                cfg.get_tls_client(),
            )?;
            let peer = peer_info(&accept, ProviderKind::Verbs)?;
            let conn = Connection::new(Side::Tcp(side::Stream::plain(s)), qp, peer, offer.grants)?;
            tracing::debug!("connected");
            return Ok(conn);
        }
        #[cfg(not(feature = "verbs"))]
        Endpoint::Rdma(_) => {
            return Err(crate::error::Error::ProviderUnavailable("verbs"));
        }
    };
    let s = connect_unix(path, deadline)?;
    let (hello, fds) = make_hello(&qp, &offer)?;
    let (h, fds) = exchange_unix(&s, hello, &fds, deadline)?;
    let peer = peer_info(&h, ProviderKind::Shm)?;
    attach(&qp, &h, fds, cfg.max_grant_bytes, None)?;
    let conn = Connection::new(Side::Unix(s), qp, peer, offer.grants)?;
    tracing::debug!("connected");
    Ok(conn)
}
