//! The client side: [`connect`] dials a listener and runs the handshake;
//! [`Dialing`] does the same in two halves around the wait for the answer.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::addr::FabricAddr;
// Named by the docs.
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::provider::side::{self, Side};
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

/// [`connect`] in two halves around its one wait, the server's answer, so
/// that an async caller waits on the socket's readiness instead of holding
/// a thread for the round trip: [`Dialing::start`] connects and sends the
/// hello without blocking; once [`Dialing::answer_fd`] is readable and
/// [`Dialing::answer_arrived`] says the whole answer is there,
/// [`Dialing::finish`] reads and checks it and attaches the queue pair
/// without waiting. Where the provider cannot start without blocking
/// (`rdma://`: TCP and TLS; shm with a full listen backlog)
/// [`Dialing::answer_fd`] is `None` and [`Dialing::finish`] runs the whole
/// of [`connect`], blocking. The same checks, limits and deadline as
/// [`connect`] apply either way.
///
/// # Examples
/// ```no_run
/// # fn run(ep: &rrpc_core::FabricAddr, qp: rrpc_core::QueuePair) -> rrpc_core::Result<()> {
/// use rrpc_core::conn::{Dialing, HandshakeConfig, Offer};
/// let d = Dialing::start(ep, qp, Offer::new(), &HandshakeConfig::default())?;
/// while d.answer_fd().is_some() && !d.answer_arrived()? {
///     // an async caller awaits the descriptor's readiness here
///     std::thread::yield_now();
/// }
/// let conn = d.finish()?;
/// # drop(conn); Ok(()) }
/// ```
#[derive(Debug)]
pub struct Dialing {
    endpoint: FabricAddr,
    qp: QueuePair,
    offer: Offer,
    cfg: HandshakeConfig,
    deadline: Deadline,
    /// The side channel with our hello sent; `None`: [`Dialing::finish`]
    /// dials in one piece.
    sent: Option<Side>,
}

impl Dialing {
    /// Starts the handshake: on shm connects and sends the hello, neither
    /// waiting; the deadline (`cfg.timeout()`) runs from here.
    ///
    /// # Errors
    /// As [`connect`] (a server that is not there: [`Error::Io`]).
    pub fn start(
        endpoint: &FabricAddr,
        qp: QueuePair,
        offer: Offer,
        cfg: &HandshakeConfig,
    ) -> Result<Dialing> {
        let deadline = Deadline::after(cfg.timeout);
        let sent = side::start_dial(endpoint, &qp, &offer, deadline)?;
        Ok(Dialing {
            endpoint: endpoint.clone(),
            qp,
            offer,
            cfg: cfg.clone(),
            deadline,
            sent,
        })
    }

    /// The socket the answer arrives on, to wait for readability; `None`
    /// when [`Dialing::finish`] must run where it may block.
    pub fn answer_fd(&self) -> Option<BorrowedFd<'_>> {
        self.sent.as_ref().map(Side::as_fd)
    }

    /// Whether [`Dialing::finish`] will not wait: the server's whole answer
    /// has arrived, or the socket is closed or the answer malformed (then
    /// `finish` fails at once). Always `true` without [`Dialing::answer_fd`]
    /// (nothing to wait for here). Peeks; never blocks.
    ///
    /// # Errors
    /// Transport errors.
    pub fn answer_arrived(&self) -> Result<bool> {
        match &self.sent {
            Some(s) => s.answer_arrived(),
            None => Ok(true),
        }
    }

    /// The time left of the handshake's deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.remaining().unwrap_or_default()
    }

    /// Finishes the handshake: reads the server's answer, checks it and
    /// attaches the queue pair. Blocks only until the answer is whole (not
    /// at all after [`Dialing::answer_arrived`] said `true`), or, without
    /// [`Dialing::answer_fd`], for the whole of [`connect`]; never past the
    /// deadline.
    ///
    /// # Errors
    /// As [`connect`].
    pub fn finish(self) -> Result<Connection> {
        let Some(side) = self.sent else {
            return connect(&self.endpoint, self.qp, self.offer, &self.cfg);
        };
        let span = tracing::debug_span!("rrpc_connect", endpoint = %self.endpoint);
        let _g = span.enter();
        let peer = side::finish_dial(&side, &self.qp, &self.cfg, self.deadline)?;
        let conn = Connection::new(side, self.qp, peer, self.offer.grants)?;
        tracing::debug!("connected");
        Ok(conn)
    }
}
