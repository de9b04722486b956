//! Connection establishment over a side channel, and liveness afterwards.
//!
//! The server [`Listener::bind`]s a side channel (a Unix socket for shm); the
//! client [`connect`]s and sends a `Hello` (see [`crate::handshake`]) carrying
//! its token, queue-pair endpoint, ring geometry and the regions it grants —
//! on shm the regions' memfds, its receive queue and its eventfd travel along
//! as `SCM_RIGHTS`. The server checks version and token, answers `Accept` with
//! its own grants (or `Reject` with a reason) and both sides attach their queue
//! pairs to each other. One round trip; resources can come pre-made from a
//! [`crate::pool::ResourcePool`] (KRCore §3.1).
//!
//! The side channel then stays open as the liveness signal: when it closes —
//! the peer exited, crashed or called [`Connection::close`] — the connection is
//! failed with [`Error::PeerGone`] and so is its queue pair, so every later post
//! returns that error instead of writing into memory nobody reads.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
#[cfg(feature = "verbs")]
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::fabric::ProviderKind;
use crate::handshake::{
    HEADER_LEN, Header, Hello, MAX_BODY, MAX_REGIONS, Message, RegionDesc, Reject, RejectCode,
    RingGeometry, token_eq,
};
use crate::provider::shm::PeerResources;
#[cfg(feature = "verbs")]
use crate::provider::verbs::side;
use crate::qp::{QpInner, QueuePair};
use crate::region::{Region, RemoteRegion};

/// Side-channel and handshake settings.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    timeout: Duration,
    token: Option<Vec<u8>>,
}

impl Default for HandshakeConfig {
    fn default() -> Self {
        HandshakeConfig {
            timeout: Duration::from_secs(5),
            token: None,
        }
    }
}

impl HandshakeConfig {
    /// How long one handshake may take before [`Error::Timeout`]. Default 5 s.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets [`Self::timeout`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a zero duration.
    pub fn with_timeout(mut self, t: Duration) -> Result<Self> {
        if t.is_zero() {
            return Err(Error::InvalidConfig("handshake timeout must be > 0".into()));
        }
        self.timeout = t;
        Ok(self)
    }

    /// The shared secret a server requires from clients (`None`: no check). Default `None`.
    pub fn token(&self) -> Option<&[u8]> {
        self.token.as_deref()
    }

    /// Sets [`Self::token`]. Clients pass their token in [`Offer::token`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if longer than [`crate::handshake::MAX_TOKEN`].
    pub fn with_token(mut self, token: impl Into<Vec<u8>>) -> Result<Self> {
        let t = token.into();
        if t.len() > crate::handshake::MAX_TOKEN {
            return Err(Error::InvalidConfig("token too long".into()));
        }
        self.token = Some(t);
        Ok(self)
    }
}

/// What one side offers in the handshake.
#[derive(Debug, Clone, Default)]
pub struct Offer {
    token: Option<Vec<u8>>,
    geometry: RingGeometry,
    app: Vec<u8>,
    grants: Vec<(u16, Arc<Region>)>,
}

impl Offer {
    /// An empty offer.
    pub fn new() -> Self {
        Self::default()
    }
    /// The token to present to the server.
    pub fn token(mut self, token: Option<Vec<u8>>) -> Self {
        self.token = token;
        self
    }
    /// Ring geometry and mode.
    pub fn geometry(mut self, g: RingGeometry) -> Self {
        self.geometry = g;
        self
    }
    /// Opaque bytes for the layers above (at most [`crate::handshake::MAX_APP`]).
    pub fn app(mut self, app: Vec<u8>) -> Self {
        self.app = app;
        self
    }
    /// Grants `region` to the peer under `role`.
    pub fn grant(mut self, role: u16, region: Arc<Region>) -> Self {
        self.grants.push((role, region));
        self
    }
    /// The regions granted so far.
    pub fn grants(&self) -> &[(u16, Arc<Region>)] {
        &self.grants
    }
}

/// What the peer offered.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's ring geometry and mode.
    pub geometry: RingGeometry,
    /// The peer's application blob.
    pub app: Vec<u8>,
    /// The regions the peer granted us.
    pub regions: Vec<RegionDesc>,
    /// The peer's provider.
    pub provider: ProviderKind,
}

impl PeerInfo {
    /// The first region granted under `role`.
    pub fn region(&self, role: u16) -> Option<RemoteRegion> {
        self.regions
            .iter()
            .find(|d| d.role == role)
            .map(|d| d.remote)
    }
}

// ---------------------------------------------------------------------------
// Message transport with fd passing
// ---------------------------------------------------------------------------

const MAX_FDS: usize = MAX_REGIONS + 2;

fn send_msg(s: &UnixStream, m: &Message, fds: &[BorrowedFd<'_>]) -> Result<()> {
    let bytes = m.encode()?;
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| map_io("sendmsg", io::Error::from_raw_os_error(e as i32)))?;
    (&*s)
        .write_all(&bytes[n..])
        .map_err(|e| map_io("handshake write", e))
}

fn map_io(op: &'static str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout,
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => Error::PeerGone,
        _ => Error::io(op, e),
    }
}

/// Receives one message and the fds that came with it. Never allocates more
/// than `HEADER_LEN + MAX_BODY` bytes; extra or unexpected fds are closed.
fn recv_msg(s: &UnixStream) -> Result<(Message, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; HEADER_LEN + MAX_BODY];
    let mut fds = Vec::new();
    // First read: take at most the header so that a malicious length is refused
    // before we read on; fds arrive with the first byte.
    let mut have = 0usize;
    while have < HEADER_LEN {
        let n = recv_with_fds(s, &mut buf[have..HEADER_LEN], &mut fds)?;
        if n == 0 {
            return Err(Error::PeerGone);
        }
        have += n;
    }
    let header = Header::decode(buf[..HEADER_LEN].try_into().expect("12 bytes"))?;
    let total = HEADER_LEN + header.body_len;
    while have < total {
        let n = recv_with_fds(s, &mut buf[have..total], &mut fds)?;
        if n == 0 {
            return Err(Error::MalformedHandshake(format!(
                "peer closed after {have} of {total} bytes"
            )));
        }
        have += n;
    }
    let m = Message::decode_body(header.kind, &buf[HEADER_LEN..total])?;
    Ok((m, fds))
}

fn recv_with_fds(s: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        s.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| map_io("recvmsg", io::Error::from_raw_os_error(e as i32)))?;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    let n = msg.bytes;
    for c in msg.cmsgs().map_err(|e| Error::nix("cmsgs", e))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel just installed `fd` in our table for us; we own it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if truncated || fds.len() > MAX_FDS {
        return Err(Error::MalformedHandshake(format!(
            "peer sent more than {MAX_FDS} file descriptors"
        )));
    }
    Ok(n)
}

// ---------------------------------------------------------------------------
// Hello construction and attachment (provider specific)
// ---------------------------------------------------------------------------

/// The provider-neutral part of our hello: token, geometry, grants, app blob.
fn base_hello(offer: &Offer) -> Hello {
    Hello {
        token: offer.token.clone(),
        provider: 0,
        endpoint: Vec::new(),
        geometry: offer.geometry,
        regions: offer
            .grants
            .iter()
            .map(|(role, r)| RegionDesc {
                role: *role,
                remote: r.remote(),
            })
            .collect(),
        app: offer.app.clone(),
    }
}

fn shm_qp(qp: &QueuePair) -> Result<&crate::provider::shm::ShmQp> {
    match &qp.inner {
        QpInner::Shm(shm) => Ok(shm),
        #[cfg(feature = "verbs")]
        QpInner::Verbs(_) => Err(Error::InvalidConfig(
            "a verbs queue pair needs an rdma:// endpoint".into(),
        )),
    }
}

fn make_hello<'a>(qp: &'a QueuePair, offer: &'a Offer) -> Result<(Hello, Vec<BorrowedFd<'a>>)> {
    let shm = shm_qp(qp)?;
    let ep = shm.endpoint();
    let mut endpoint = Vec::with_capacity(16);
    endpoint.extend_from_slice(&ep.cq_len.to_le_bytes());
    endpoint.extend_from_slice(&ep.cq_cap.to_le_bytes());
    let mut fds: Vec<BorrowedFd<'a>> = offer.grants.iter().map(|(_, r)| r.fd()).collect();
    fds.push(ep.cq_fd);
    fds.push(ep.event_fd);
    let hello = Hello {
        provider: ProviderKind::Shm.code(),
        endpoint,
        ..base_hello(offer)
    };
    Ok((hello, fds))
}

fn peer_info(h: &Hello, expected: ProviderKind) -> Result<PeerInfo> {
    let provider = ProviderKind::from_code(h.provider).ok_or_else(|| {
        Error::MalformedHandshake(format!("unknown provider code {}", h.provider))
    })?;
    if provider != expected {
        return Err(Error::MalformedHandshake(format!(
            "peer offers provider {provider:?} where {expected:?} was expected"
        )));
    }
    Ok(PeerInfo {
        geometry: h.geometry,
        app: h.app.clone(),
        regions: h.regions.clone(),
        provider,
    })
}

fn attach(qp: &QueuePair, h: &Hello, fds: Vec<OwnedFd>) -> Result<()> {
    if h.endpoint.len() != 16 {
        return Err(Error::MalformedHandshake(format!(
            "shm endpoint must be 16 bytes, got {}",
            h.endpoint.len()
        )));
    }
    if fds.len() != h.regions.len() + 2 {
        return Err(Error::MalformedHandshake(format!(
            "peer granted {} regions but passed {} descriptors (expected {})",
            h.regions.len(),
            fds.len(),
            h.regions.len() + 2
        )));
    }
    let cq_len = u64::from_le_bytes(h.endpoint[0..8].try_into().expect("8"));
    let cq_cap = u64::from_le_bytes(h.endpoint[8..16].try_into().expect("8"));
    let mut it = fds.into_iter();
    let regions = h
        .regions
        .iter()
        .map(|d| (d.remote, it.next().expect("counted")))
        .collect();
    let cq_fd = it.next().expect("counted");
    let event_fd = it.next().expect("counted");
    let shm = shm_qp(qp)?;
    shm.connect(PeerResources {
        regions,
        cq_fd,
        cq_len,
        cq_cap,
        event_fd,
    })
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// Connects to a listening server, performs the handshake and attaches `qp` to
/// the server's. Blocking; bounded by `cfg.timeout()`.
///
/// # Errors
/// [`Error::Rejected`], [`Error::AuthFailed`] or [`Error::VersionMismatch`] when
/// the server refused; [`Error::MalformedHandshake`] when its answer was bad;
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
    let path = match endpoint {
        Endpoint::Shm(p) => p,
        #[cfg(feature = "verbs")]
        Endpoint::Rdma(addr) => {
            let (s, accept) = side::client(*addr, &qp, base_hello(&offer), cfg.timeout)?;
            let peer = peer_info(&accept, ProviderKind::Verbs)?;
            let conn = Connection::new(Side::Tcp(s), qp, peer, offer.grants)?;
            tracing::debug!("connected");
            return Ok(conn);
        }
        #[cfg(not(feature = "verbs"))]
        Endpoint::Rdma(_) => return Err(Error::ProviderUnavailable("verbs")),
    };
    let s = UnixStream::connect(path).map_err(|e| Error::io("connect side channel", e))?;
    set_timeouts(&s, Some(cfg.timeout))?;
    let (hello, fds) = make_hello(&qp, &offer)?;
    send_msg(&s, &Message::Hello(hello), &fds)?;
    let (answer, fds) = recv_msg(&s)?;
    let h = match answer {
        Message::Accept(h) => h,
        Message::Reject(r) => return Err(reject_error(r)),
        other => {
            return Err(Error::MalformedHandshake(format!(
                "expected Accept, got {:?}",
                other.kind()
            )));
        }
    };
    let peer = peer_info(&h, ProviderKind::Shm)?;
    attach(&qp, &h, fds)?;
    let conn = Connection::new(Side::Unix(s), qp, peer, offer.grants)?;
    tracing::debug!("connected");
    Ok(conn)
}

fn reject_error(r: Reject) -> Error {
    match r.code {
        RejectCode::Auth => Error::AuthFailed,
        _ => Error::Rejected(r.reason),
    }
}

fn set_timeouts(s: &UnixStream, t: Option<Duration>) -> Result<()> {
    s.set_read_timeout(t)
        .and_then(|_| s.set_write_timeout(t))
        .map_err(|e| Error::io("set socket timeout", e))
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// A side-channel listener (a Unix socket for `shm://`, TCP for `rdma://`).
/// Dropping it removes the socket file.
#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
    cfg: HandshakeConfig,
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
        Ok(Listener { inner, cfg })
    }

    /// The socket path (`None` for a TCP side channel).
    pub fn path(&self) -> Option<&Path> {
        match &self.inner {
            ListenerInner::Unix(_, p) => Some(p),
            #[cfg(feature = "verbs")]
            ListenerInner::Tcp(_) => None,
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
            ListenerInner::Tcp(l) => match side::accept_tcp(l, self.cfg.timeout) {
                Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => {
                    return Err(Error::WouldBlock);
                }
                r => Side::Tcp(r?),
            },
        };
        Ok(Pending {
            stream,
            cfg: self.cfg.clone(),
        })
    }
}

/// A client taken off the listening socket whose hello has not been read
/// yet ([`Listener::accept_pending`]).
#[derive(Debug)]
pub struct Pending {
    stream: Side,
    cfg: HandshakeConfig,
}

impl AsFd for Pending {
    /// The accepted side-channel socket, e.g. to wait (tokio `AsyncFd`) until
    /// the client's hello has arrived before calling [`Pending::handshake`].
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.stream {
            Side::Unix(s) => s.as_fd(),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.as_fd(),
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

    /// Reads and checks the client's hello. Blocking, bounded by the
    /// handshake timeout. A bad client (malformed hello, wrong version or
    /// token) is answered with a `Reject` and disconnected.
    ///
    /// # Errors
    /// The client's fault ([`Error::MalformedHandshake`], [`Error::AuthFailed`],
    /// [`Error::VersionMismatch`], [`Error::Timeout`], [`Error::PeerGone`]).
    pub fn handshake(self) -> Result<Incoming> {
        #[allow(clippy::infallible_destructuring_match)] // fallible with `verbs`
        let s = match self.stream {
            Side::Unix(s) => s,
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                let hello = side::read_hello(&s, self.cfg.token())?;
                let peer = peer_info(&hello, ProviderKind::Verbs)?;
                return Ok(Incoming {
                    stream: Side::Tcp(s),
                    hello,
                    peer,
                    fds: Vec::new(),
                });
            }
        };
        s.set_nonblocking(false)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        set_timeouts(&s, Some(self.cfg.timeout))?;
        let refuse = |s: &UnixStream, code: RejectCode, e: Error| -> Error {
            let _ = send_msg(
                s,
                &Message::Reject(Reject {
                    code,
                    reason: e.to_string(),
                }),
                &[],
            );
            tracing::warn!(error = %e, "handshake refused");
            e
        };
        let (m, fds) = match recv_msg(&s) {
            Ok(x) => x,
            Err(e @ Error::VersionMismatch { .. }) => {
                return Err(refuse(&s, RejectCode::Version, e));
            }
            Err(e @ Error::MalformedHandshake(_)) => {
                return Err(refuse(&s, RejectCode::Malformed, e));
            }
            Err(e) => return Err(e),
        };
        let hello = match m {
            Message::Hello(h) => h,
            other => {
                let e =
                    Error::MalformedHandshake(format!("expected Hello, got {:?}", other.kind()));
                return Err(refuse(&s, RejectCode::Malformed, e));
            }
        };
        if let Some(want) = self.cfg.token() {
            let ok = hello.token.as_deref().is_some_and(|t| token_eq(t, want));
            if !ok {
                return Err(refuse(&s, RejectCode::Auth, Error::AuthFailed));
            }
        }
        let peer = match peer_info(&hello, ProviderKind::Shm) {
            Ok(p) => p,
            Err(e) => return Err(refuse(&s, RejectCode::Incompatible, e)),
        };
        Ok(Incoming {
            stream: Side::Unix(s),
            hello,
            peer,
            fds,
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
    stream: Side,
    hello: Hello,
    peer: PeerInfo,
    fds: Vec<OwnedFd>,
}

impl Incoming {
    /// What the client offered.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// Accepts: sends our grants and attaches `qp` to the client's.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] if the client's grants cannot be mapped (a
    /// `Reject` is sent then), [`Error::PeerGone`] / [`Error::Timeout`] if it left.
    pub fn accept(self, qp: QueuePair, offer: Offer) -> Result<Connection> {
        #[allow(clippy::infallible_destructuring_match)] // fallible with `verbs`
        let stream = match self.stream {
            Side::Unix(s) => s,
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                side::server_accept(&s, &qp, &self.hello, base_hello(&offer))?;
                tracing::debug!("accepted");
                return Connection::new(Side::Tcp(s), qp, self.peer, offer.grants);
            }
        };
        if let Err(e) = attach(&qp, &self.hello, self.fds) {
            let _ = send_msg(
                &stream,
                &Message::Reject(Reject {
                    code: RejectCode::Malformed,
                    reason: e.to_string(),
                }),
                &[],
            );
            return Err(e);
        }
        let (hello, fds) = make_hello(&qp, &offer)?;
        send_msg(&stream, &Message::Accept(hello), &fds)?;
        tracing::debug!("accepted");
        Connection::new(Side::Unix(stream), qp, self.peer, offer.grants)
    }

    /// Refuses with a reason the client will see in [`Error::Rejected`].
    ///
    /// # Errors
    /// Only if the reject could not be sent (the client is gone anyway).
    pub fn reject(self, reason: &str) -> Result<()> {
        let m = Message::Reject(Reject {
            code: RejectCode::Other(0),
            reason: reason.to_string(),
        });
        self.stream.send(&m)
    }
}

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// The side channel of one connection.
#[derive(Debug)]
enum Side {
    Unix(UnixStream),
    #[cfg(feature = "verbs")]
    Tcp(TcpStream),
}

impl Side {
    fn send(&self, m: &Message) -> Result<()> {
        match self {
            Side::Unix(s) => send_msg(s, m, &[]),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => side::send_msg(s, m),
        }
    }
    fn peer_addr(&self) -> String {
        match self {
            Side::Unix(s) => {
                match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials) {
                    Ok(c) => format!("pid={} uid={}", c.pid(), c.uid()),
                    Err(_) => "unix peer".to_string(),
                }
            }
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp peer".to_string(), |a| a.to_string()),
        }
    }
    fn raw_fd(&self) -> RawFd {
        match self {
            Side::Unix(s) => s.as_raw_fd(),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.as_raw_fd(),
        }
    }
    fn set_timeouts(&self, t: Option<Duration>) -> Result<()> {
        match self {
            Side::Unix(s) => set_timeouts(s, t),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s
                .set_read_timeout(t)
                .and_then(|_| s.set_write_timeout(t))
                .map_err(|e| Error::io("set socket timeout", e)),
        }
    }
    fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Side::Unix(s) => s.set_nonblocking(nb),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.set_nonblocking(nb),
        }
    }
    fn read(&self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Side::Unix(s) => (&*s).read(b),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => (&*s).read(b),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Side::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// An established connection: a connected queue pair, what the peer granted,
/// and the side channel that tells whether the peer is still there.
#[derive(Debug)]
pub struct Connection {
    qp: Arc<QueuePair>,
    peer: PeerInfo,
    side: Side,
    _grants: Vec<(u16, Arc<Region>)>,
    gone: AtomicBool,
}

impl Connection {
    fn new(
        side: Side,
        qp: QueuePair,
        peer: PeerInfo,
        grants: Vec<(u16, Arc<Region>)>,
    ) -> Result<Self> {
        side.set_timeouts(None)?;
        side.set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Connection {
            qp: Arc::new(qp),
            peer,
            side,
            _grants: grants,
            gone: AtomicBool::new(false),
        })
    }

    /// The connected queue pair.
    pub fn qp(&self) -> &Arc<QueuePair> {
        &self.qp
    }

    /// What the peer offered.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The side channel's fd: becomes readable when the peer closes or says
    /// goodbye. Watch it (tokio `AsyncFd`, `poll(2)`) and call
    /// [`Self::check_alive`] when it fires.
    pub fn liveness_fd(&self) -> RawFd {
        self.side.raw_fd()
    }

    /// Non-blocking liveness check.
    ///
    /// # Errors
    /// [`Error::PeerGone`] once the side channel closed or the peer said
    /// goodbye; the queue pair is failed with the same error.
    pub fn check_alive(&self) -> Result<()> {
        if self.gone.load(Ordering::Acquire) {
            return Err(Error::PeerGone);
        }
        let mut b = [0u8; 1];
        match self.side.read(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            // EOF, goodbye bytes, or a socket error: the peer is gone.
            _ => {
                self.mark_gone();
                Err(Error::PeerGone)
            }
        }
    }

    fn mark_gone(&self) {
        if !self.gone.swap(true, Ordering::AcqRel) {
            tracing::debug!("peer gone");
            self.qp.fail(&Error::PeerGone);
        }
    }

    /// Whether the peer is known to be gone (no system call).
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Orderly close: tells the peer goodbye and fails our queue pair with
    /// [`Error::NotConnected`].
    pub fn close(&self) {
        let _ = self.side.set_nonblocking(false);
        let _ = self.side.send(&Message::Goodbye);
        self.side.shutdown();
        self.qp.fail(&Error::NotConnected);
        self.gone.store(true, Ordering::Release);
        tracing::debug!("connection closed");
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.side.shutdown();
        self.qp.fail(&Error::NotConnected);
    }
}
