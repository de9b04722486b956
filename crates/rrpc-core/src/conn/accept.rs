//! The server side: a [`Listener`] takes clients, each a [`Pending`]
//! handshake, then an [`Incoming`] hello to accept or refuse.

use std::io::{self};
#[cfg(feature = "verbs")]
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::handshake::{Hello, Message, Reject, RejectCode, token_eq};
use crate::provider::shm::side::{attach, granted_bytes, make_hello, recv_msg, send_msg};
#[cfg(feature = "verbs")]
use crate::provider::verbs::side;
use crate::qp::QueuePair;
use crate::settings::ProviderKind;

use super::budget::{Budget, BudgetGuard, PeerKey};
use super::established::{Connection, Side};
#[cfg(feature = "verbs")]
use super::exchange::base_hello;
use super::exchange::{Deadline, Offer, PeerInfo, peer_info, reject_code_for};
use super::settings::{HandshakeConfig, Want};

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// A side-channel listener (a Unix socket for `shm://`, TCP for `rdma://`).
/// Dropping it removes the socket file.
#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
    cfg: HandshakeConfig,
    budget: Arc<Budget>,
}

#[derive(Debug)]
enum ListenerInner {
    Unix(UnixListener, PathBuf),
    #[cfg(feature = "verbs")]
    Tcp(TcpListener),
}

impl Listener {
    /// Binds the side channel. A stale socket file left by a dead server is
    /// replaced; a live one is an error.
    ///
    /// # Errors
    /// [`Error::Io`] (`AddrInUse` if another server is listening there);
    /// [`Error::ProviderUnavailable`] for `rdma://` without the verbs feature.
    pub fn bind(endpoint: &Endpoint, cfg: HandshakeConfig) -> Result<Listener> {
        let inner = match endpoint {
            Endpoint::Shm(p) => {
                remove_stale(p)?;
                let l = UnixListener::bind(p).map_err(|e| Error::io("bind side channel", e))?;
                ListenerInner::Unix(l, p.clone())
            }
            #[cfg(feature = "verbs")]
            Endpoint::Rdma(addr) => ListenerInner::Tcp(side::bind_tcp(*addr)?),
            #[cfg(not(feature = "verbs"))]
            Endpoint::Rdma(_) => return Err(Error::ProviderUnavailable("verbs")),
        };
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
        match &self.inner {
            ListenerInner::Unix(_, p) => Some(p),
            #[cfg(feature = "verbs")]
            ListenerInner::Tcp(_) => None,
        }
    }

    /// The bound TCP address of an `rdma://` listener (`None` for shm): the
    /// port to connect to after binding port 0.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match &self.inner {
            ListenerInner::Unix(..) => None,
            #[cfg(feature = "verbs")]
            ListenerInner::Tcp(l) => l.local_addr().ok(),
        }
    }

    /// The listening socket, for readiness-based accept loops (tokio `AsyncFd`).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.inner {
            ListenerInner::Unix(l, _) => l.as_fd(),
            #[cfg(feature = "verbs")]
            ListenerInner::Tcp(l) => l.as_fd(),
        }
    }

    /// Sets the listening socket non-blocking (then [`Self::accept`] may return
    /// [`Error::WouldBlock`]).
    ///
    /// # Errors
    /// [`Error::Io`] if `fcntl` fails.
    pub fn set_nonblocking(&self, nb: bool) -> Result<()> {
        match &self.inner {
            ListenerInner::Unix(l, _) => l.set_nonblocking(nb),
            #[cfg(feature = "verbs")]
            ListenerInner::Tcp(l) => l.set_nonblocking(nb),
        }
        .map_err(|e| Error::io("set_nonblocking", e))
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
        let stream = match &self.inner {
            ListenerInner::Unix(l, _) => {
                let (s, _) = match l.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Err(Error::WouldBlock);
                    }
                    Err(e) => return Err(Error::io("accept", e)),
                };
                Side::Unix(s)
            }
            #[cfg(feature = "verbs")]
            ListenerInner::Tcp(l) => {
                match side::accept_tcp(l, self.cfg.timeout, self.cfg.keepalive.as_ref()) {
                    Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => {
                        return Err(Error::WouldBlock);
                    }
                    r => Side::Tcp(side::Stream::plain(r?)),
                }
            }
        };
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
        match &self.stream {
            Side::Unix(s) => s.as_fd(),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().as_fd(),
        }
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
        #[cfg(feature = "verbs")]
        return matches!(self.stream, Side::Tcp(_)) && self.cfg.get_tls_server().is_some();
        #[cfg(not(feature = "verbs"))]
        false
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
        #[cfg(feature = "verbs")]
        if let (Side::Tcp(s), Some(tls)) = (&mut self.stream, self.cfg.get_tls_server()) {
            s.start_server_tls(tls)?;
            s.tcp()
                .set_nonblocking(true)
                .map_err(|e| Error::io("set_nonblocking", e))?;
            let r = s.pump();
            let _ = s.tcp().set_nonblocking(false);
            if let Err(e @ Error::Tls(_)) = &r {
                crate::handshake::count_refusal(RejectCode::Auth);
                tracing::warn!(error = %e, peer = %self.stream.peer_addr(), "rdma handshake refused: TLS");
            }
            return r;
        }
        Ok(Want::Ready)
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
        let peer_addr = self.stream.peer_addr();
        let key = self.stream.peer_key();
        #[allow(clippy::infallible_destructuring_match)] // fallible with `verbs`
        let s = match self.stream {
            Side::Unix(s) => s,
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                let mut s = side::server_stream(s, self.cfg.get_tls_server(), deadline)?;
                let hello = side::read_hello(&mut s, self.cfg.get_token(), deadline)?;
                let peer = peer_info(&hello, ProviderKind::Verbs)?;
                return Ok(Incoming {
                    stream: Side::Tcp(s),
                    hello,
                    peer,
                    fds: Vec::new(),
                    cfg: self.cfg,
                    budget: None,
                });
            }
        };
        s.set_nonblocking(false)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        let refuse = |s: &UnixStream, e: Error| refuse_unix(s, e, deadline, &peer_addr);
        let (m, fds) = match recv_msg(&s, deadline) {
            Ok(x) => x,
            Err(e @ (Error::VersionMismatch { .. } | Error::MalformedHandshake(_))) => {
                return Err(refuse(&s, e));
            }
            Err(e) => return Err(e),
        };
        let hello = match m {
            Message::Hello(h) => h,
            other => {
                let e =
                    Error::MalformedHandshake(format!("expected Hello, got {:?}", other.kind()));
                return Err(refuse(&s, e));
            }
        };
        if let Some(want) = self.cfg.get_token() {
            let ok = hello.token.as_deref().is_some_and(|t| token_eq(t, want));
            if !ok {
                return Err(refuse(&s, Error::AuthFailed));
            }
        }
        let peer = match peer_info(&hello, ProviderKind::Shm) {
            Ok(p) => p,
            Err(e) => {
                let _ = send_msg(
                    &s,
                    &Message::Reject(Reject {
                        code: RejectCode::Incompatible,
                        reason: e.to_string(),
                    }),
                    &[],
                    deadline,
                );
                crate::handshake::count_refusal(RejectCode::Incompatible);
                tracing::warn!(error = %e, peer = %peer_addr, reason = "incompatible", "handshake refused");
                return Err(e);
            }
        };
        let bytes = match granted_bytes(&hello, self.cfg.max_grant_bytes) {
            Ok(b) => b,
            Err(e) => return Err(refuse(&s, e)),
        };
        let budget = match self.budget.reserve(key, bytes) {
            Ok(g) => g,
            Err(e) => return Err(refuse(&s, e)),
        };
        Ok(Incoming {
            stream: Side::Unix(s),
            hello,
            peer,
            fds,
            cfg: self.cfg,
            budget: Some(budget),
        })
    }
}

fn remove_stale(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(Error::io(
            "bind side channel",
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(Error::io(
            "bind side channel",
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a server is listening on {}", path.display()),
            ),
        ));
    }
    std::fs::remove_file(path).map_err(|e| Error::io("remove stale socket", e))
}

impl Drop for Listener {
    fn drop(&mut self) {
        #[allow(irrefutable_let_patterns)] // refutable with the `verbs` feature
        if let ListenerInner::Unix(_, path) = &self.inner {
            let _ = std::fs::remove_file(path);
        }
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
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) cfg: HandshakeConfig,
    /// The client's grants, reserved against the listener's budget.
    pub(crate) budget: Option<BudgetGuard>,
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
    /// mapped: one per region plus its receive queue and its eventfd;
    /// regions and receive queue must be memfds sealed against shrinking
    /// and growing (not against writes) and at least as long as claimed; the
    /// eventfd must be an eventfd, and is made non-blocking (we never block
    /// writing to it).
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
        #[allow(clippy::infallible_destructuring_match)] // fallible with `verbs`
        let stream = match self.stream {
            Side::Unix(s) => s,
            #[cfg(feature = "verbs")]
            Side::Tcp(mut s) => {
                side::server_accept(&mut s, &qp, &self.hello, base_hello(&offer), deadline)?;
                tracing::debug!("accepted");
                return Connection::new(Side::Tcp(s), qp, self.peer, offer.grants);
            }
        };
        if let Err(e) = attach(
            &qp,
            &self.hello,
            self.fds,
            self.cfg.max_grant_bytes,
            self.budget,
        ) {
            return Err(refuse_unix(&stream, e, deadline, "-"));
        }
        let (hello, fds) = make_hello(&qp, &offer)?;
        send_msg(&stream, &Message::Accept(hello), &fds, deadline)?;
        tracing::debug!("accepted");
        Connection::new(Side::Unix(stream), qp, self.peer, offer.grants)
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
        match self.stream {
            // Inside the TLS session, if there is one.
            #[cfg(feature = "verbs")]
            Side::Tcp(mut s) => side::send_msg(&mut s, &m, deadline),
            other => other.send(&m, deadline),
        }
    }
}

/// Refuses a handshake on an shm side channel: sends `Reject` with the code
/// `e` maps to (best effort: the client may be gone), counts and logs the
/// refusal, and hands `e` back for the caller to return.
fn refuse_unix(s: &UnixStream, e: Error, deadline: Deadline, peer: &str) -> Error {
    let code = reject_code_for(&e);
    let reject = Message::Reject(Reject {
        code,
        reason: e.to_string(),
    });
    let _ = send_msg(s, &reject, &[], deadline);
    crate::handshake::count_refusal(code);
    tracing::warn!(error = %e, peer, reason = code.name(), "handshake refused");
    e
}
