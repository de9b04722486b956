//! The client side: [`connect`] dials a listener and runs the handshake.

use crate::addr::FabricAddr;
// Named by the docs.
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::provider::side;
use crate::qp::QueuePair;

use super::established::Connection;
use super::exchange::{Deadline, Offer};
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
    endpoint: &FabricAddr,
    qp: QueuePair,
    offer: Offer,
    cfg: &HandshakeConfig,
) -> Result<Connection> {
    let span = tracing::debug_span!("rrpc_connect", %endpoint);
    let _g = span.enter();
    let deadline = Deadline::after(cfg.timeout);
    let (side, peer) = side::dial(endpoint, &qp, &offer, cfg, deadline)?;
    let conn = Connection::new(side, qp, peer, offer.grants)?;
    tracing::debug!("connected");
    Ok(conn)
}
