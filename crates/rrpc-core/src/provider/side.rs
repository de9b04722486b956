//! The providers' side channels, behind one seam: what [`crate::conn`]
//! listens, dials, runs its handshakes and watches its peers with, naming
//! no provider.
//!
//! | provider | side channel | module |
//! |---|---|---|
//! | shm | a Unix socket, descriptors passed with `SCM_RIGHTS` | `shm::side` |
//! | verbs (feature `verbs`) | TCP, TLS during the handshake if configured | `verbs::side` |
//!
//! [`SideListener`] (the listening socket) and [`Side`] (one connection's
//! side channel, during its handshake and afterwards as its liveness
//! signal) are enums with one variant per provider, like
//! [`super::Qp`]; their methods, with [`dial`] and [`dial_logical`], are
//! the whole dispatch. The handshake's steps themselves (what a hello
//! carries, what is checked, how grants are attached) are each provider's
//! side-channel module's; this module only picks the provider, by the
//! endpoint or by the socket a connection already has. An `rdma://`
//! endpoint in a build without the `verbs` feature is
//! [`Error::ProviderUnavailable`] here.
//!
//! ## Dependencies
//!
//! This module and the two side channels under it build on [`QueuePair`]
//! and on `conn`'s leaves (`conn::settings`, `conn::exchange`,
//! `conn::budget`), which import nothing back; `conn`'s listener, dial,
//! accept, established and logical connections build on this module. So
//! no circle runs through the connection layer either.

use std::io::{self, Read};
use std::net::SocketAddr;
#[cfg(feature = "verbs")]
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::shm::side as shm;
#[cfg(feature = "verbs")]
use super::verbs::side as verbs;
use crate::addr::FabricAddr;
use crate::conn::budget::{Budget, PeerKey};
use crate::conn::exchange::{Deadline, Offer, Passed, PeerInfo};
use crate::conn::settings::{HandshakeConfig, Want};
use crate::error::{Error, Result};
use crate::handshake::{Hello, Message};
use crate::qp::QueuePair;
use crate::region::Region;

// ---------------------------------------------------------------------------
// Listening
// ---------------------------------------------------------------------------

/// A listening side channel (a Unix socket for `shm://`, TCP for
/// `rdma://`): the dispatch behind [`crate::conn::Listener`].
#[derive(Debug)]
pub(crate) enum SideListener {
    Unix(UnixListener, PathBuf),
    #[cfg(feature = "verbs")]
    Tcp(TcpListener),
}

impl SideListener {
    /// Binds the side channel of `endpoint`. A stale socket file left by a
    /// dead server is replaced; a live one is an error.
    ///
    /// # Errors
    /// [`Error::Io`] (`AddrInUse` if another server is listening there);
    /// [`Error::ProviderUnavailable`] for `rdma://` without the verbs
    /// feature.
    pub(crate) fn bind(endpoint: &FabricAddr) -> Result<SideListener> {
        Ok(match endpoint {
            FabricAddr::Shm(p) => SideListener::Unix(shm::bind(p)?, p.clone()),
            #[cfg(feature = "verbs")]
            FabricAddr::Rdma(addr) => SideListener::Tcp(verbs::bind_tcp(*addr)?),
            #[cfg(not(feature = "verbs"))]
            FabricAddr::Rdma(_) => return Err(Error::ProviderUnavailable("verbs")),
        })
    }

    /// The socket path (`None` for TCP).
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            SideListener::Unix(_, p) => Some(p),
            #[cfg(feature = "verbs")]
            SideListener::Tcp(_) => None,
        }
    }

    /// The bound TCP address (`None` for a Unix socket).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            SideListener::Unix(..) => None,
            #[cfg(feature = "verbs")]
            SideListener::Tcp(l) => l.local_addr().ok(),
        }
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            SideListener::Unix(l, _) => l.as_fd(),
            #[cfg(feature = "verbs")]
            SideListener::Tcp(l) => l.as_fd(),
        }
    }

    /// # Errors
    /// [`Error::Io`] if `fcntl` fails.
    pub(crate) fn set_nonblocking(&self, nb: bool) -> Result<()> {
        match self {
            SideListener::Unix(l, _) => l.set_nonblocking(nb),
            #[cfg(feature = "verbs")]
            SideListener::Tcp(l) => l.set_nonblocking(nb),
        }
        .map_err(|e| Error::io("set_nonblocking", e))
    }

    /// Takes one client off the listening socket without reading from it
    /// (on TCP with `cfg`'s handshake timeout and keep-alive set).
    ///
    /// # Errors
    /// [`Error::WouldBlock`] on a non-blocking listener with no pending
    /// client; [`Error::Io`] if `accept(2)` fails.
    pub(crate) fn accept(&self, cfg: &HandshakeConfig) -> Result<Side> {
        Ok(match self {
            SideListener::Unix(l, _) => {
                // Its timeouts are the handshake's to set, and a Unix
                // socket needs no keep-alive.
                let _ = cfg;
                Side::Unix(shm::accept(l)?)
            }
            #[cfg(feature = "verbs")]
            SideListener::Tcp(l) => Side::Tcp(verbs::accept(l, cfg)?),
        })
    }

    /// Removes the socket file (a Unix socket; nothing on TCP).
    pub(crate) fn unlink(&self) {
        match self {
            SideListener::Unix(_, path) => {
                let _ = std::fs::remove_file(path);
            }
            #[cfg(feature = "verbs")]
            SideListener::Tcp(_) => {}
        }
    }
}

// ---------------------------------------------------------------------------
// Dialing
// ---------------------------------------------------------------------------

/// The client side of a dedicated connection on `endpoint`'s side channel:
/// connect, send our hello (`offer`'s grants, `qp`'s endpoint), read the
/// server's `Accept` and attach `qp` to the server's queue pair and grants
/// (checked against `cfg`), all by `deadline`. Returns the side channel
/// and what the server offered.
///
/// # Errors
/// As [`crate::conn::connect`].
pub(crate) fn dial(
    endpoint: &FabricAddr,
    qp: &QueuePair,
    offer: &Offer,
    cfg: &HandshakeConfig,
    deadline: Deadline,
) -> Result<(Side, PeerInfo)> {
    Ok(match endpoint {
        FabricAddr::Shm(path) => {
            let (s, peer) = shm::dial(path, qp, offer, cfg.max_grant_bytes, deadline)?;
            (Side::Unix(s), peer)
        }
        #[cfg(feature = "verbs")]
        FabricAddr::Rdma(addr) => {
            let (s, peer) = verbs::dial(*addr, qp, offer, cfg, deadline)?;
            (Side::Tcp(s), peer)
        }
        #[cfg(not(feature = "verbs"))]
        FabricAddr::Rdma(_) => return Err(Error::ProviderUnavailable("verbs")),
    })
}

/// [`dial`]'s first half, without blocking, where the provider allows it:
/// on shm, connect and send our hello; `None` when that would wait (a full
/// backlog, a full socket) and on `rdma://` (its TCP connect and TLS
/// handshake block): the caller then runs [`dial`]. [`finish_dial`] is the
/// second half.
///
/// # Errors
/// As [`crate::conn::connect`].
pub(crate) fn start_dial(
    endpoint: &FabricAddr,
    qp: &QueuePair,
    offer: &Offer,
    deadline: Deadline,
) -> Result<Option<Side>> {
    Ok(match endpoint {
        FabricAddr::Shm(path) => shm::start_dial(path, qp, offer, deadline)?.map(Side::Unix),
        FabricAddr::Rdma(_) => None,
    })
}

/// [`dial`]'s second half on a side channel from [`start_dial`]: reads the
/// server's `Accept` and attaches `qp` to its grants, by `deadline`.
///
/// # Errors
/// As [`crate::conn::connect`].
pub(crate) fn finish_dial(
    side: &Side,
    qp: &QueuePair,
    cfg: &HandshakeConfig,
    deadline: Deadline,
) -> Result<PeerInfo> {
    match side {
        Side::Unix(s) => shm::finish_dial(s, qp, cfg.max_grant_bytes, deadline),
        #[cfg(feature = "verbs")]
        Side::Tcp(_) => Err(Error::InvalidConfig(
            "a TCP side channel is dialed in one piece".into(),
        )),
    }
}

/// The client side of a logical connection on `endpoint`'s side channel
/// (`conn::logical`): a hello with `offer`'s grants and no queue-pair
/// endpoint, by `deadline`. Returns the side channel, the server's
/// `Accept` (checked to carry no endpoint either) and the descriptors that
/// came with it (shm), for the caller to add to the shared queue pair.
///
/// # Errors
/// As [`crate::conn::connect_logical`].
pub(crate) fn dial_logical(
    endpoint: &FabricAddr,
    offer: &Offer,
    cfg: &HandshakeConfig,
    deadline: Deadline,
) -> Result<(Side, Hello, Vec<OwnedFd>)> {
    Ok(match endpoint {
        FabricAddr::Shm(path) => {
            let (s, h, fds) = shm::dial_logical(path, offer, deadline)?;
            (Side::Unix(s), h, fds)
        }
        #[cfg(feature = "verbs")]
        FabricAddr::Rdma(addr) => {
            let (s, h) = verbs::dial_logical(*addr, offer, cfg, deadline)?;
            (Side::Tcp(s), h, Vec::new())
        }
        #[cfg(not(feature = "verbs"))]
        FabricAddr::Rdma(_) => {
            let _ = cfg;
            return Err(Error::ProviderUnavailable("verbs"));
        }
    })
}

// ---------------------------------------------------------------------------
// One connection's side channel
// ---------------------------------------------------------------------------

/// The side channel of one connection: the dispatch behind
/// [`crate::conn::Pending`], [`crate::conn::Incoming`] and
/// [`crate::conn::Connection`].
#[derive(Debug)]
pub(crate) enum Side {
    Unix(UnixStream),
    /// During the handshake with its TLS session, if any; a connection's
    /// has none (`verbs::side` docs, "TLS").
    #[cfg(feature = "verbs")]
    Tcp(verbs::Stream),
}

impl Side {
    /// Sends one message on the bare socket (no descriptors, no TLS
    /// session): a goodbye.
    pub(crate) fn send(&self, m: &Message, deadline: Deadline) -> Result<()> {
        match self {
            Side::Unix(s) => shm::send_msg(s, m, &[], deadline),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => verbs::send_plain(s.tcp(), m, deadline),
        }
    }

    /// Sends one message during the handshake: inside the TLS session, if
    /// there is one; without descriptors.
    pub(crate) fn send_in_session(&mut self, m: &Message, deadline: Deadline) -> Result<()> {
        match self {
            Side::Unix(s) => shm::send_msg(s, m, &[], deadline),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => verbs::send_msg(s, m, deadline),
        }
    }

    /// Answers a logical hello with `Accept(answer)`: on shm with the
    /// memfds of the regions `grants` names, on verbs inside the TLS
    /// session, if there is one.
    pub(crate) fn send_accept(
        &mut self,
        answer: Hello,
        grants: &[(u16, Arc<Region>)],
        deadline: Deadline,
    ) -> Result<()> {
        match self {
            Side::Unix(s) => {
                let fds: Vec<_> = grants.iter().map(|(_, r)| r.fd()).collect();
                shm::send_msg(s, &Message::Accept(answer), &fds, deadline)
            }
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => verbs::send_msg(s, &Message::Accept(answer), deadline),
        }
    }

    /// Who the peer is, as its socket tells: a process (Unix socket,
    /// `SO_PEERCRED`) or a host (TCP).
    pub(crate) fn peer_key(&self) -> PeerKey {
        match self {
            Side::Unix(s) => shm::peer_key(s),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.peer_key(),
        }
    }

    /// The peer, for logs: `ip:port` on TCP, `pid=.. uid=..` on a Unix
    /// socket when the kernel reports them.
    pub(crate) fn peer_addr(&self) -> String {
        match self {
            Side::Unix(s) => shm::peer_addr(s),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.peer_addr(),
        }
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Side::Unix(s) => s.as_fd(),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().as_fd(),
        }
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) -> Result<()> {
        match self {
            Side::Unix(s) => shm::set_timeouts(s, t),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s
                .tcp()
                .set_read_timeout(t)
                .and_then(|_| s.tcp().set_write_timeout(t))
                .map_err(|e| Error::io("set socket timeout", e)),
        }
    }

    pub(crate) fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Side::Unix(s) => s.set_nonblocking(nb),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().set_nonblocking(nb),
        }
    }

    /// Whether the peer's whole next message waits in the socket (or
    /// waiting would not help: closed, malformed), so that reading it does
    /// not block. Only a side channel from [`start_dial`] is asked.
    pub(crate) fn answer_arrived(&self) -> Result<bool> {
        match self {
            Side::Unix(s) => shm::answer_arrived(s),
            #[cfg(feature = "verbs")]
            Side::Tcp(_) => Ok(true),
        }
    }

    /// Reads the bare socket (the liveness check).
    pub(crate) fn read(&self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Side::Unix(s) => (&*s).read(b),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                let mut t = s.tcp();
                t.read(b)
            }
        }
    }

    /// Writes all of `b` on the bare socket (a frame of `conn::mux`),
    /// waiting at most `wait` for room when the socket is full (a peer
    /// that stops reading, polled each millisecond): then `TimedOut`.
    /// Callers serialize writes.
    pub(crate) fn write_all_within(&self, mut b: &[u8], wait: Duration) -> io::Result<()> {
        use std::io::Write;
        // Without the verbs provider a side channel is always a Unix socket.
        #[cfg_attr(not(feature = "verbs"), allow(clippy::infallible_destructuring_match))]
        let s = match self {
            Side::Unix(s) => s,
            #[cfg(feature = "verbs")]
            Side::Tcp(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "logical connections over the side channel are shm's only",
                ));
            }
        };
        let deadline = std::time::Instant::now() + wait;
        while !b.is_empty() {
            match (&*s).write(b) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => b = &b[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    // Only a peer that stopped reading fills the socket:
                    // rare, and bounded by `wait`.
                    std::thread::sleep(left.min(Duration::from_millis(1)));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Side::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().shutdown(std::net::Shutdown::Both),
        };
    }

    /// The side channel an established connection keeps: its TLS session,
    /// if any, ends with the handshake (`verbs::side` docs, "TLS").
    pub(crate) fn end_session(self) -> Side {
        match self {
            Side::Unix(s) => Side::Unix(s),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => Side::Tcp(s.without_tls()),
        }
    }

    /// The socket's `TCP_USER_TIMEOUT` in milliseconds, the bound after
    /// which an unanswering host fails it (`None` on a Unix socket).
    pub(crate) fn user_timeout_ms(&self) -> Option<u32> {
        match self {
            Side::Unix(_) => None,
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.user_timeout_ms(),
        }
    }

    /// Whether this client's hello arrives in TLS (a TCP side channel and
    /// a server TLS config in `cfg`).
    pub(crate) fn uses_tls(&self, cfg: &HandshakeConfig) -> bool {
        match self {
            Side::Unix(_) => {
                let _ = cfg;
                false
            }
            #[cfg(feature = "verbs")]
            Side::Tcp(_) => cfg.tls_server().is_some(),
        }
    }

    /// Non-blocking: drives the TLS handshake, if [`Self::uses_tls`], until
    /// the client's hello is whole in plaintext ([`crate::conn::Pending::poll_hello`]).
    /// Without TLS it is `Ready` at once.
    ///
    /// # Errors
    /// [`Error::Tls`], [`Error::PeerGone`], [`Error::Io`].
    pub(crate) fn poll_hello(&mut self, cfg: &HandshakeConfig) -> Result<Want> {
        match self {
            Side::Unix(_) => {
                let _ = cfg;
                Ok(Want::Ready)
            }
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => match cfg.tls_server() {
                Some(tls) => verbs::poll_hello(s, tls),
                None => Ok(Want::Ready),
            },
        }
    }

    /// Server side: reads and checks the client's hello by `deadline`
    /// ([`crate::conn::Pending::handshake`]): version, token, provider, and
    /// on shm the bytes granted against `cfg` and `budget` (reserved in the
    /// returned [`Passed`], with the descriptors that came along). A bad
    /// client is answered with a `Reject` and disconnected.
    ///
    /// # Errors
    /// As [`crate::conn::Pending::handshake`].
    pub(crate) fn read_hello(
        self,
        cfg: &HandshakeConfig,
        budget: &Arc<Budget>,
        deadline: Deadline,
    ) -> Result<(Side, Hello, PeerInfo, Passed)> {
        match self {
            Side::Unix(s) => {
                let (hello, peer, passed) = shm::read_client_hello(&s, cfg, budget, deadline)?;
                Ok((Side::Unix(s), hello, peer, passed))
            }
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                // Nothing is mapped on verbs: no budget is reserved.
                let (s, hello, peer) = verbs::read_client_hello(s, cfg, deadline)?;
                Ok((Side::Tcp(s), hello, peer, Passed::default()))
            }
        }
    }

    /// Server side after [`Self::read_hello`]: attaches `qp` to the
    /// client's (`client`, with what came along in `passed`, at most
    /// `max_grant_bytes`) and answers `Accept` with `offer`'s grants and
    /// `qp`'s endpoint. A client whose queue pair or grants cannot be
    /// attached gets a `Reject` instead.
    ///
    /// # Errors
    /// As [`crate::conn::Incoming::accept`].
    pub(crate) fn accept(
        &mut self,
        qp: &QueuePair,
        client: &Hello,
        passed: Passed,
        max_grant_bytes: u64,
        offer: &Offer,
        deadline: Deadline,
    ) -> Result<()> {
        match self {
            Side::Unix(s) => shm::answer(s, qp, client, passed, max_grant_bytes, offer, deadline),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                // Nothing came along on verbs (`passed` is empty), and
                // nothing is mapped.
                verbs::server_accept(
                    s,
                    qp,
                    client,
                    crate::conn::exchange::base_hello(offer),
                    deadline,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh socket path in a directory of its own.
    fn sock_path(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rrpc-core-side-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("s.sock")
    }

    #[test]
    fn a_unix_listener_has_a_path_and_unlinks_it() {
        let p = sock_path("unlink");
        let l = SideListener::bind(&FabricAddr::Shm(p.clone())).unwrap();
        assert_eq!(l.path(), Some(p.as_path()));
        assert_eq!(l.local_addr(), None);
        l.set_nonblocking(true).unwrap();
        assert!(matches!(
            l.accept(&HandshakeConfig::default()),
            Err(Error::WouldBlock)
        ));
        assert!(p.exists());
        l.unlink();
        assert!(!p.exists());
        let _ = std::fs::remove_dir(p.parent().unwrap());
    }

    #[test]
    fn a_unix_side_channel_names_its_peer_process_and_has_no_tls() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut s = Side::Unix(a);
        let pid = i32::try_from(std::process::id()).unwrap();
        assert!(matches!(s.peer_key(), PeerKey::Process { pid: p, .. } if p == pid));
        assert!(s.peer_addr().starts_with(&format!("pid={pid} ")));
        let cfg = HandshakeConfig::default();
        assert!(!s.uses_tls(&cfg));
        assert_eq!(s.poll_hello(&cfg).unwrap(), Want::Ready);
        assert_eq!(s.user_timeout_ms(), None);
        assert!(matches!(s.end_session(), Side::Unix(_)));
    }

    #[cfg(not(feature = "verbs"))]
    #[test]
    fn rdma_without_the_verbs_feature_is_unavailable() {
        let ep = FabricAddr::Rdma("127.0.0.1:1".parse().unwrap());
        assert!(matches!(
            SideListener::bind(&ep),
            Err(Error::ProviderUnavailable("verbs"))
        ));
        let qp = crate::Fabric::shm()
            .create_qp(&crate::QpConfig::default())
            .unwrap();
        let cfg = HandshakeConfig::default();
        let dl = Deadline::after(Duration::from_secs(1));
        assert!(matches!(
            dial(&ep, &qp, &Offer::new(), &cfg, dl),
            Err(Error::ProviderUnavailable("verbs"))
        ));
        assert!(matches!(
            dial_logical(&ep, &Offer::new(), &cfg, dl),
            Err(Error::ProviderUnavailable("verbs"))
        ));
    }
}
