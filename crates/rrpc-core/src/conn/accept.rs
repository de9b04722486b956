//! The server side: a [`Listener`] takes clients, each a [`Pending`]
//! handshake, then an [`Incoming`] hello to accept or refuse.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;

use crate::addr::FabricAddr;
use crate::error::{Error, Result};
use crate::handshake::{Hello, Message, Reject, RejectCode};
use crate::provider::side::{Side, SideListener};
use crate::qp::QueuePair;

use super::budget::{Budget, PeerKey};
use super::established::Connection;
use super::exchange::{Deadline, Offer, Passed, PeerInfo};
use super::settings::{HandshakeConfig, Want};

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// A side-channel listener (a Unix socket for `shm://`, TCP for `rdma://`).
/// Dropping it removes the socket file.
#[derive(Debug)]
pub struct Listener {
    inner: SideListener,
    cfg: HandshakeConfig,
    budget: Arc<Budget>,
}

impl Listener {
    /// Binds the side channel. A stale socket file left by a dead server is
    /// replaced; a live one is an error.
    ///
    /// # Errors
    /// [`Error::Io`] (`AddrInUse` if another server is listening there);
    /// [`Error::ProviderUnavailable`] for `rdma://` without the verbs feature.
    pub fn bind(endpoint: &FabricAddr, cfg: HandshakeConfig) -> Result<Listener> {
        let inner = SideListener::bind(endpoint)?;
        tracing::info!(%endpoint, "rrpc listener bound");
        let budget = Arc::new(Budget::new(
            cfg.max_total_grant_bytes,
            cfg.max_peer_grant_bytes,
        ));
        Ok(Listener { inner, cfg, budget })
    }

    /// Bytes of peer memory the connections of this listener have mapped
    /// now (or reserved in a handshake under way), counted against
    /// [`HandshakeConfig::max_total_grant_bytes`].
    pub fn peer_bytes_mapped(&self) -> u64 {
        self.budget.used()
    }

    /// Bytes of peer memory mapped (or reserved) now for one peer, counted
    /// against [`HandshakeConfig::max_peer_grant_bytes`].
    pub fn peer_bytes_mapped_by(&self, peer: &PeerKey) -> u64 {
        self.budget.used_by(peer)
    }

    /// The socket path (`None` for a TCP side channel).
    pub fn path(&self) -> Option<&Path> {
        self.inner.path()
    }

    /// The bound TCP address of an `rdma://` listener (`None` for shm): the
    /// port to connect to after binding port 0.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.inner.local_addr()
    }

    /// The listening socket, for readiness-based accept loops (tokio `AsyncFd`).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }

    /// Sets the listening socket non-blocking (then [`Self::accept`] may return
    /// [`Error::WouldBlock`]).
    ///
    /// # Errors
    /// [`Error::Io`] if `fcntl` fails.
    pub fn set_nonblocking(&self, nb: bool) -> Result<()> {
        self.inner.set_nonblocking(nb)
    }

    /// Accepts one client and reads its hello: [`Self::accept_pending`]
    /// followed by [`Pending::handshake`]. A bad client (malformed hello,
    /// wrong version or token) is answered with a `Reject`, disconnected, and
    /// reported as an error; keep accepting afterwards.
    ///
    /// This blocks for as long as the client takes to send its hello (up to
    /// the handshake timeout); servers that must not let one slow client
    /// delay the others call [`Self::accept_pending`] in their accept loop
    /// and run each [`Pending::handshake`] on its own thread or task.
    ///
    /// # Errors
    /// As [`Self::accept_pending`] and [`Pending::handshake`].
    pub fn accept(&self) -> Result<Incoming> {
        self.accept_pending()?.handshake()
    }

    /// Takes one connected client off the listening socket without reading
    /// from it: cheap, and never waits for the client. The handshake
    /// (reading and checking its hello) is [`Pending::handshake`].
    ///
    /// # Errors
    /// [`Error::WouldBlock`] on a non-blocking listener with no pending
    /// client; [`Error::Io`] if `accept(2)` fails.
    pub fn accept_pending(&self) -> Result<Pending> {
        let stream = self.inner.accept(&self.cfg)?;
        Ok(Pending {
            stream,
            cfg: self.cfg.clone(),
            budget: self.budget.clone(),
        })
    }
}

/// A client taken off the listening socket whose hello has not been read
/// yet ([`Listener::accept_pending`]).
#[derive(Debug)]
pub struct Pending {
    stream: Side,
    cfg: HandshakeConfig,
    budget: Arc<Budget>,
}

impl AsFd for Pending {
    /// The accepted side-channel socket, e.g. to wait (tokio `AsyncFd`) until
    /// the client's hello has arrived before calling [`Pending::handshake`].
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl Pending {
    /// The client's address, for logs: `ip:port` on TCP; on a Unix socket
    /// the peer's process and user ids (`pid=.. uid=..`) when the kernel
    /// reports them.
    pub fn peer_addr(&self) -> String {
        self.stream.peer_addr()
    }

    /// Who the client is, as its socket tells us: the key of its budget
    /// ([`HandshakeConfig::max_peer_grant_bytes`]).
    pub fn peer_key(&self) -> PeerKey {
        self.stream.peer_key()
    }

    /// Whether this client's side channel runs TLS
    /// (`HandshakeConfig::tls_server`, `verbs` feature): its hello arrives encrypted,
    /// so peeking the socket shows nothing; use [`poll_hello`](Self::poll_hello).
    pub fn uses_tls(&self) -> bool {
        self.stream.uses_tls(&self.cfg)
    }

    /// Non-blocking: runs the TLS handshake and reads TLS records until the
    /// client's hello is whole in plaintext, and says what it waits for
    /// next (`Read`, `Write`) or that [`handshake`](Self::handshake) can
    /// run without waiting for the client (`Ready`). An async accept loop
    /// calls it whenever the side channel is ready (see [`AsFd`]), so a
    /// client that stalls in the middle of TLS holds a task, never a
    /// thread. Without TLS it is `Ready` at once.
    ///
    /// # Errors
    /// [`Error::Tls`] (the client failed TLS; counted as an `auth`
    /// refusal), [`Error::PeerGone`], [`Error::Io`].
    ///
    /// # Cancel safety
    /// Not async; stopping between calls loses nothing (the TLS state and
    /// any plaintext read stay in the `Pending`).
    pub fn poll_hello(&mut self) -> Result<Want> {
        self.stream.poll_hello(&self.cfg)
    }

    /// Reads and checks the client's hello. Blocking; the whole of it is
    /// bounded by the handshake timeout (a deadline, however slowly the
    /// client sends). A bad client is answered with a `Reject` naming the
    /// problem and disconnected; every descriptor it passed is closed.
    ///
    /// Checked here, before the hello is handed on: version, token,
    /// provider, and on shm the bytes granted against
    /// [`HandshakeConfig::max_grant_bytes`] and the listener's total against
    /// [`HandshakeConfig::max_total_grant_bytes`] (those bytes are reserved
    /// until the [`Incoming`], or the queue pair it is accepted with, is
    /// dropped). The descriptors themselves are checked by
    /// [`Incoming::accept`].
    ///
    /// # Errors
    /// The client's fault ([`Error::MalformedHandshake`], [`Error::AuthFailed`],
    /// [`Error::VersionMismatch`], [`Error::Timeout`], [`Error::PeerGone`]);
    /// [`Error::LimitExceeded`] when its grants pass a limit.
    pub fn handshake(self) -> Result<Incoming> {
        let deadline = Deadline::after(self.cfg.timeout);
        let (stream, hello, peer, passed) =
            self.stream.read_hello(&self.cfg, &self.budget, deadline)?;
        Ok(Incoming {
            stream,
            hello,
            peer,
            passed,
            cfg: self.cfg,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.inner.unlink();
        tracing::debug!("rrpc listener closed");
    }
}

/// A client whose hello was read and validated; answer with [`Incoming::accept`]
/// or [`Incoming::reject`].
#[derive(Debug)]
pub struct Incoming {
    pub(crate) stream: Side,
    pub(crate) hello: Hello,
    pub(crate) peer: PeerInfo,
    /// What came with the hello: descriptors, the grants' reservation.
    pub(crate) passed: Passed,
    pub(crate) cfg: HandshakeConfig,
}

impl Incoming {
    /// What the client offered.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// Accepts: sends our grants and attaches `qp` to the client's. Blocking,
    /// bounded by the handshake timeout (counted from this call).
    ///
    /// On shm the client's descriptors are checked before anything is
    /// mapped: one per region plus its receive queue and its doorbell;
    /// regions and receive queue must be memfds sealed against shrinking
    /// and growing (not against writes) and at least as long as claimed; the
    /// doorbell must be a pipe's write end, written with
    /// `pwritev2(RWF_NOWAIT)` (we never block writing to it).
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] naming the descriptor if the client's
    /// grants cannot be mapped (a `Reject` is sent then), [`Error::PeerGone`] /
    /// [`Error::Timeout`] if it left.
    pub fn accept(self, qp: QueuePair, offer: Offer) -> Result<Connection> {
        let deadline = Deadline::after(self.cfg.timeout);
        if self.is_logical() {
            let e = Error::MalformedHandshake(
                "a logical hello (no queue-pair endpoint) where a dedicated one was expected"
                    .into(),
            );
            let _ = self.reject_with(RejectCode::Malformed, &e.to_string());
            return Err(e);
        }
        let Incoming {
            mut stream,
            hello,
            peer,
            passed,
            cfg,
        } = self;
        stream.accept(&qp, &hello, passed, cfg.max_grant_bytes, &offer, deadline)?;
        tracing::debug!("accepted");
        Connection::new(stream, qp, peer, offer.grants)
    }

    /// Refuses with a reason the client will see in [`Error::Rejected`].
    ///
    /// # Errors
    /// Only if the reject could not be sent (the client is gone anyway).
    pub fn reject(self, reason: &str) -> Result<()> {
        self.reject_with(RejectCode::Other(0), reason)
    }

    fn reject_with(self, code: RejectCode, reason: &str) -> Result<()> {
        crate::handshake::count_refusal(code);
        let m = Message::Reject(Reject {
            code,
            reason: reason.to_string(),
        });
        let deadline = Deadline::after(self.cfg.timeout);
        // Inside the TLS session, if there is one.
        let mut stream = self.stream;
        stream.send_in_session(&m, deadline)
    }
}
