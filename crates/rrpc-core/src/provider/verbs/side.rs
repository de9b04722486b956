//! The TCP side channel of `rdma://` addresses: the same handshake messages
//! as shm ([`crate::handshake::Message`]) over a TCP stream, without fd
//! passing — a verbs peer needs only the `Hello` bytes: its queue-pair
//! address (LID, QPN, PSN, GID, MTU; see [`super::qp_address`]) and its
//! region descriptors (address, length, rkey).
//!
//! Function-level API (for `provider::side`, the connection layer's seam
//! over both side channels, and for the tests):
//!
//! * [`connect_tcp`] / [`bind_tcp`] / [`accept_tcp`]: the stream;
//! * [`fill_hello`]: puts the verbs provider code and our queue-pair address into a `Hello`;
//! * [`exchange`]: client side — send `Hello`, read `Accept` or `Reject`;
//! * [`read_hello`]: server side — read the client's `Hello`, check token and
//!   provider, answer `Reject` on error;
//! * [`attach`]: connect our queue pair to the peer's `Hello`
//!   (INIT → RTR → RTS, remember its grants for the pre-checks);
//! * [`client`] and [`server_accept`]: the above composed, one call per side;
//! * [`send_msg`] / [`recv_msg`]: one framed message.
//! * [`accept`], [`poll_hello`], [`read_client_hello`], [`dial`] and
//!   [`dial_logical`]: the steps of `conn`'s listener, pending handshake
//!   and connects, composed from the above.
//!
//! Every read and write is bounded by one [`Deadline`] for the whole
//! handshake: the socket timeout is set to the time left before each call,
//! so a peer that trickles bytes is cut off when the deadline passes.
//!
//! ## TLS
//! With [`crate::conn::HandshakeConfig::tls_server`] /
//! [`tls_client`](crate::conn::HandshakeConfig::tls_client) the
//! handshake messages travel inside a TLS session (rustls) over the TCP
//! stream: [`Stream::tls`] runs the TLS handshake first, by the same
//! deadline, and `Hello`, `Accept` and `Reject` are then application data.
//! That protects the token, the queue-pair address and the region keys
//! from anyone on the path, and authenticates the server (and, with a
//! client-certificate verifier in the server's config, the client). After
//! `Accept` the session is dropped: the side channel carries no data from
//! then on, only its liveness (any byte or EOF means the peer is gone, and a
//! goodbye is plain bytes), so nothing after the handshake needs it.
//!
//! Builds; not run on an RDMA NIC here (the transport and codec are tested
//! over loopback TCP).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};

use crate::conn::budget::PeerKey;
use crate::conn::exchange::{Deadline, Offer, PeerInfo, base_hello, map_io, peer_info};
use crate::conn::settings::{HandshakeConfig, TcpKeepalive};

use super::qp_address::QpAddress;
use crate::error::{Error, Result};
use crate::handshake::{HEADER_LEN, Header, Hello, Message, Reject, RejectCode, token_eq};
use crate::provider::Qp;
use crate::qp::QueuePair;
use crate::settings::ProviderKind;

pub(crate) fn verbs_qp(qp: &QueuePair) -> Result<&super::VerbsQp> {
    match &qp.inner {
        Qp::Verbs(v) => Ok(v),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidConfig(
            "an rdma:// connection needs a queue pair of a verbs fabric".into(),
        )),
    }
}

/// The side channel while the handshake runs: the TCP stream, and the TLS
/// session over it when one is configured.
pub(crate) struct Stream {
    tcp: TcpStream,
    tls: Option<Box<rustls::Connection>>,
    /// Plaintext taken out of the TLS session by [`Stream::pump`] and not
    /// read yet (read first by every later read).
    plain: Vec<u8>,
}

pub(crate) use crate::conn::settings::Want;

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("tcp", &self.tcp)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

fn tls_error(during: &str, e: &rustls::Error) -> Error {
    Error::Tls(format!("{during}: {e}"))
}

impl Stream {
    /// A plain (no TLS) side channel.
    pub(crate) fn plain(tcp: TcpStream) -> Self {
        Stream {
            tcp,
            tls: None,
            plain: Vec::new(),
        }
    }

    /// Starts a server TLS session on this (plain) stream without doing
    /// any I/O; [`pump`](Self::pump) or a blocking read drives it.
    ///
    /// # Errors
    /// [`Error::Tls`] if rustls refuses the config.
    pub(crate) fn start_server_tls(
        &mut self,
        cfg: &std::sync::Arc<rustls::ServerConfig>,
    ) -> Result<()> {
        if self.tls.is_none() {
            let conn = rustls::ServerConnection::new(cfg.clone())
                .map_err(|e| tls_error("TLS server session", &e))?;
            self.tls = Some(Box::new(conn.into()));
        }
        Ok(())
    }

    /// Non-blocking (the socket must be non-blocking): drives the TLS
    /// handshake and reads TLS records until the peer's first handshake
    /// message is whole in plaintext, and says what it waits for. An async
    /// accept loop calls it on readiness, so a client that stalls anywhere
    /// before its hello holds a task, never a thread. A plain stream is
    /// `Ready` at once (peek the socket instead).
    ///
    /// # Errors
    /// [`Error::Tls`], [`Error::PeerGone`], [`Error::Io`].
    pub(crate) fn pump(&mut self) -> Result<Want> {
        let Stream { tcp, tls, plain } = self;
        let Some(conn) = tls.as_mut() else {
            return Ok(Want::Ready);
        };
        let mut buf = [0u8; 4096];
        loop {
            while conn.wants_write() {
                match conn.write_tls(tcp) {
                    Ok(0) => return Err(Error::PeerGone),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Want::Write),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(map_io("handshake write", e)),
                }
            }
            if !conn.is_handshaking() {
                loop {
                    match conn.reader().read(&mut buf) {
                        Ok(0) => return Ok(Want::Ready), // closed: reading says so
                        Ok(n) => plain.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => return Ok(Want::Ready),
                    }
                }
                if message_is_whole(plain) {
                    return Ok(Want::Ready);
                }
            }
            match conn.read_tls(tcp) {
                Ok(0) => return Err(Error::PeerGone),
                Ok(_) => {
                    if let Err(e) = conn.process_new_packets() {
                        let _ = conn.write_tls(tcp);
                        return Err(tls_error("TLS handshake on the side channel", &e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Want::Read),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map_io("handshake read", e)),
            }
        }
    }

    /// Runs the TLS handshake of `conn` (a client or server session) over
    /// `tcp` by `deadline` and returns the protected side channel.
    ///
    /// # Errors
    /// [`Error::Tls`] naming what failed (a certificate the peer's config
    /// does not trust, a peer that does not speak TLS); [`Error::Timeout`];
    /// [`Error::PeerGone`] when the peer closed during the TLS handshake.
    pub(crate) fn tls(
        tcp: TcpStream,
        conn: rustls::Connection,
        deadline: Deadline,
    ) -> Result<Self> {
        let mut s = Stream {
            tcp,
            tls: Some(Box::new(conn)),
            plain: Vec::new(),
        };
        s.finish_tls(deadline)?;
        Ok(s)
    }

    /// Completes the TLS handshake (blocking, by `deadline`), wherever a
    /// [`pump`](Self::pump) left it.
    fn finish_tls(&mut self, deadline: Deadline) -> Result<()> {
        let s = self;
        while s.session().is_handshaking() {
            s.flush_tls(deadline)?;
            if !s.session().is_handshaking() {
                break;
            }
            if s.session().wants_read() && s.fill_tls(deadline)? == 0 {
                return Err(Error::PeerGone);
            }
        }
        // What the handshake's last flight left to send (a client's Finished).
        s.flush_tls(deadline)
    }

    fn session(&mut self) -> &mut rustls::Connection {
        self.tls.as_mut().expect("a TLS stream")
    }

    /// Whether a TLS session protects this channel.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TCP stream.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Drops the TLS session (after `Accept`; module docs, "TLS").
    pub(crate) fn into_tcp(self) -> TcpStream {
        self.tcp
    }

    /// This side channel without its TLS session, if it had one (module
    /// docs, "TLS"): what a connection keeps after the handshake.
    pub(crate) fn without_tls(self) -> Stream {
        if self.is_tls() {
            Stream::plain(self.into_tcp())
        } else {
            self
        }
    }

    /// Who the peer is: its host, by address.
    pub(crate) fn peer_key(&self) -> PeerKey {
        self.tcp()
            .peer_addr()
            .map_or(PeerKey::Unknown, |a| PeerKey::Host(a.ip()))
    }

    /// The peer's `ip:port`, for logs.
    pub(crate) fn peer_addr(&self) -> String {
        self.tcp()
            .peer_addr()
            .map_or_else(|_| "tcp peer".to_string(), |a| a.to_string())
    }

    /// The socket's `TCP_USER_TIMEOUT` in milliseconds (what
    /// [`set_keepalive`] set), if the kernel reports it.
    pub(crate) fn user_timeout_ms(&self) -> Option<u32> {
        nix::sys::socket::getsockopt(&self.tcp(), nix::sys::socket::sockopt::TcpUserTimeout).ok()
    }

    /// Writes what the TLS session has queued, by `deadline`.
    fn flush_tls(&mut self, deadline: Deadline) -> Result<()> {
        let Stream { tcp, tls, .. } = self;
        let Some(conn) = tls else { return Ok(()) };
        while conn.wants_write() {
            tcp.set_write_timeout(Some(deadline.remaining()?))
                .map_err(|e| Error::io("set socket timeout", e))?;
            match conn.write_tls(tcp) {
                Ok(0) => return Err(Error::PeerGone),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map_io("handshake write", e)),
            }
        }
        Ok(())
    }

    /// Reads TLS records from the socket once (by `deadline`) and processes
    /// them; returns the bytes read (0: the peer closed).
    fn fill_tls(&mut self, deadline: Deadline) -> Result<usize> {
        let Stream { tcp, tls, .. } = self;
        let conn = tls.as_mut().expect("a TLS stream");
        loop {
            tcp.set_read_timeout(Some(deadline.remaining()?))
                .map_err(|e| Error::io("set socket timeout", e))?;
            match conn.read_tls(tcp) {
                Ok(n) => {
                    if let Err(e) = conn.process_new_packets() {
                        // Tell the peer why (an alert), best effort.
                        let _ = conn.write_tls(tcp);
                        let during = if conn.is_handshaking() {
                            "TLS handshake on the side channel"
                        } else {
                            "TLS record on the side channel"
                        };
                        return Err(tls_error(during, &e));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map_io("handshake read", e)),
            }
        }
    }

    /// Writes all of `bytes` by `deadline`.
    fn write_all_by(&mut self, bytes: &[u8], deadline: Deadline) -> Result<()> {
        if let Some(conn) = self.tls.as_mut() {
            conn.writer()
                .write_all(bytes)
                .map_err(|e| Error::io("TLS write", e))?;
            return self.flush_tls(deadline);
        }
        write_plain(&self.tcp, bytes, deadline)
    }

    /// Reads some bytes into `buf` by `deadline` (0: the peer closed).
    fn read_some_by(&mut self, buf: &mut [u8], deadline: Deadline) -> Result<usize> {
        if !self.plain.is_empty() {
            let n = buf.len().min(self.plain.len());
            buf[..n].copy_from_slice(&self.plain[..n]);
            self.plain.drain(..n);
            return Ok(n);
        }
        if self.tls.is_none() {
            let mut s = &self.tcp;
            loop {
                s.set_read_timeout(Some(deadline.remaining()?))
                    .map_err(|e| Error::io("set socket timeout", e))?;
                match s.read(buf) {
                    Ok(k) => return Ok(k),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(map_io("handshake read", e)),
                }
            }
        }
        loop {
            match self.session().reader().read(buf) {
                Ok(k) => return Ok(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.fill_tls(deadline)? == 0 {
                        return Ok(0);
                    }
                    // A key update or a session ticket may want an answer.
                    self.flush_tls(deadline)?;
                }
                // Closed without close_notify: the peer is gone.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(map_io("TLS read", e)),
            }
        }
    }
}

/// Connects the side channel to `addr` by `deadline`, with `keepalive` set
/// (see [`set_keepalive`]).
///
/// # Errors
/// [`Error::Io`] if the server cannot be reached or a socket option cannot
/// be set; [`Error::Timeout`].
pub(crate) fn connect_tcp(
    addr: SocketAddr,
    deadline: Deadline,
    keepalive: Option<&TcpKeepalive>,
) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, deadline.remaining()?)
        .map_err(|e| map_io("connect side channel", e))?;
    prepare(&s, deadline.remaining()?, keepalive)?;
    Ok(s)
}

/// Binds the server's side channel.
///
/// # Errors
/// [`Error::Io`] (`AddrInUse`, permission).
pub(crate) fn bind_tcp(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::io("bind side channel", e))
}

/// Accepts one client connection, blocking, with `timeout` on its reads and
/// writes and `keepalive` set (see [`set_keepalive`]).
///
/// # Errors
/// [`Error::WouldBlock`] on a non-blocking listener without a client; [`Error::Io`].
pub(crate) fn accept_tcp(
    l: &TcpListener,
    timeout: Duration,
    keepalive: Option<&TcpKeepalive>,
) -> Result<TcpStream> {
    let (s, _) = match l.accept() {
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Error::WouldBlock),
        Err(e) => return Err(Error::io("accept", e)),
    };
    s.set_nonblocking(false)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    prepare(&s, timeout, keepalive)?;
    Ok(s)
}

fn prepare(s: &TcpStream, timeout: Duration, keepalive: Option<&TcpKeepalive>) -> Result<()> {
    s.set_nodelay(true)
        .and_then(|_| s.set_read_timeout(Some(timeout)))
        .and_then(|_| s.set_write_timeout(Some(timeout)))
        .map_err(|e| Error::io("configure side channel", e))?;
    match keepalive {
        Some(k) => set_keepalive(s, k),
        None => Ok(()),
    }
}

/// Whole seconds of a keep-alive timer (validated to fit by [`TcpKeepalive::new`]).
fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

/// Turns on TCP keep-alive with `k`'s timers and sets `TCP_USER_TIMEOUT` to
/// [`TcpKeepalive::bound`], so a dead remote host fails the socket with
/// `ETIMEDOUT` within that bound whether the side channel is idle or has
/// data in flight.
///
/// # Errors
/// [`Error::Io`] naming the option the kernel refused.
pub(crate) fn set_keepalive(s: &TcpStream, k: &TcpKeepalive) -> Result<()> {
    let user_timeout = u32::try_from(k.bound().as_millis()).unwrap_or(u32::MAX);
    setsockopt(s, sockopt::TcpKeepIdle, &secs(k.idle()))
        .map_err(|e| Error::nix("setsockopt(TCP_KEEPIDLE)", e))?;
    setsockopt(s, sockopt::TcpKeepInterval, &secs(k.interval()))
        .map_err(|e| Error::nix("setsockopt(TCP_KEEPINTVL)", e))?;
    setsockopt(s, sockopt::TcpKeepCount, &k.count())
        .map_err(|e| Error::nix("setsockopt(TCP_KEEPCNT)", e))?;
    setsockopt(s, sockopt::TcpUserTimeout, &user_timeout)
        .map_err(|e| Error::nix("setsockopt(TCP_USER_TIMEOUT)", e))?;
    setsockopt(s, sockopt::KeepAlive, &true).map_err(|e| Error::nix("setsockopt(SO_KEEPALIVE)", e))
}

/// Takes one client off the listening socket ([`accept_tcp`] with `cfg`'s
/// handshake timeout and keep-alive): a plain side channel, TLS not started.
///
/// # Errors
/// [`Error::WouldBlock`] on a non-blocking listener without a client
/// (or one whose socket is not ready yet); [`Error::Io`].
pub(crate) fn accept(l: &TcpListener, cfg: &HandshakeConfig) -> Result<Stream> {
    match accept_tcp(l, cfg.timeout, cfg.keepalive.as_ref()) {
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => {
            Err(Error::WouldBlock)
        }
        r => Ok(Stream::plain(r?)),
    }
}

/// Non-blocking: starts the server TLS session with `tls` (if not started)
/// and [`pump`](Stream::pump)s it until the client's hello is whole in
/// plaintext; says what it waits for. A client that fails TLS is counted
/// as an `auth` refusal.
///
/// # Errors
/// [`Error::Tls`], [`Error::PeerGone`], [`Error::Io`].
pub(crate) fn poll_hello(
    s: &mut Stream,
    tls: &std::sync::Arc<rustls::ServerConfig>,
) -> Result<Want> {
    s.start_server_tls(tls)?;
    s.tcp()
        .set_nonblocking(true)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    let r = s.pump();
    let _ = s.tcp().set_nonblocking(false);
    if let Err(e @ Error::Tls(_)) = &r {
        crate::handshake::count_refusal(RejectCode::Auth);
        tracing::warn!(error = %e, peer = %s.peer_addr(), "rdma handshake refused: TLS");
    }
    r
}

/// The whole server side up to the client's hello: TLS first when `cfg`
/// has a server config ([`server_stream`]), then [`read_hello`] with
/// `cfg`'s token, by `deadline`.
///
/// # Errors
/// As [`server_stream`] and [`read_hello`]; [`Error::MalformedHandshake`]
/// for a hello of another provider.
pub(crate) fn read_client_hello(
    s: Stream,
    cfg: &HandshakeConfig,
    deadline: Deadline,
) -> Result<(Stream, Hello, PeerInfo)> {
    let mut s = server_stream(s, cfg.tls_server(), deadline)?;
    let hello = read_hello(&mut s, cfg.token(), deadline)?;
    let peer = peer_info(&hello, ProviderKind::Verbs)?;
    Ok((s, hello, peer))
}

/// The whole client side of a dedicated connection: [`client`] with
/// `offer`'s hello and `cfg`'s keep-alive and TLS, by `deadline`. Returns
/// the side channel (TLS session dropped) and what the server offered.
///
/// # Errors
/// As [`client`]; [`Error::MalformedHandshake`] for an `Accept` of another
/// provider.
pub(crate) fn dial(
    addr: SocketAddr,
    qp: &QueuePair,
    offer: &Offer,
    cfg: &HandshakeConfig,
    deadline: Deadline,
) -> Result<(Stream, PeerInfo)> {
    let (s, accept) = client(
        addr,
        qp,
        base_hello(offer),
        deadline,
        cfg.keepalive.as_ref(),
        cfg.tls_client(),
    )?;
    let peer = peer_info(&accept, ProviderKind::Verbs)?;
    Ok((Stream::plain(s), peer))
}

/// The client side of a logical connection: [`client_logical`] with
/// `offer`'s hello and `cfg`'s keep-alive and TLS, by `deadline`. Returns
/// the side channel (TLS session dropped) and the server's `Accept`.
///
/// # Errors
/// As [`client_logical`].
pub(crate) fn dial_logical(
    addr: SocketAddr,
    offer: &Offer,
    cfg: &HandshakeConfig,
    deadline: Deadline,
) -> Result<(Stream, Hello)> {
    let (s, h) = client_logical(
        addr,
        base_hello(offer),
        deadline,
        cfg.keepalive.as_ref(),
        cfg.tls_client(),
    )?;
    Ok((Stream::plain(s), h))
}

/// Writes one message by `deadline`.
///
/// # Errors
/// [`Error::PeerGone`], [`Error::Timeout`], [`Error::Io`]; [`Error::InvalidConfig`]
/// if the message exceeds the codec's limits.
pub(crate) fn send_msg(s: &mut Stream, m: &Message, deadline: Deadline) -> Result<()> {
    s.write_all_by(&m.encode()?, deadline)
}

/// Writes one message on the bare TCP stream: a goodbye after the
/// handshake, when no TLS session is left (module docs, "TLS").
///
/// # Errors
/// As [`send_msg`].
pub(crate) fn send_plain(s: &TcpStream, m: &Message, deadline: Deadline) -> Result<()> {
    write_plain(s, &m.encode()?, deadline)
}

fn write_plain(mut s: &TcpStream, bytes: &[u8], deadline: Deadline) -> Result<()> {
    let mut n = 0;
    while n < bytes.len() {
        s.set_write_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        match s.write(&bytes[n..]) {
            Ok(0) => return Err(Error::PeerGone),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io("handshake write", e)),
        }
    }
    Ok(())
}

/// Whether `b` starts with a whole handshake message (or with a header
/// that cannot start one: the read will refuse it).
fn message_is_whole(b: &[u8]) -> bool {
    if b.len() < HEADER_LEN {
        return false;
    }
    let head: &[u8; HEADER_LEN] = b[..HEADER_LEN].try_into().expect("HEADER_LEN bytes");
    match Header::decode(head) {
        Ok(h) => b.len() >= HEADER_LEN + h.body_len,
        Err(_) => true,
    }
}

/// The server's side channel for one accepted client: TLS first when
/// `tls` is set (by `deadline`), else the bare stream. A session a
/// [`Stream::pump`] started is completed, not started again.
///
/// # Errors
/// As [`Stream::tls`].
pub(crate) fn server_stream(
    mut s: Stream,
    tls: Option<&std::sync::Arc<rustls::ServerConfig>>,
    deadline: Deadline,
) -> Result<Stream> {
    match tls {
        Some(cfg) => {
            let peer = s.tcp.peer_addr().ok();
            s.start_server_tls(cfg)?;
            s.finish_tls(deadline).map(|()| s).inspect_err(|e| {
                // A failed TLS handshake is an authentication refusal; a
                // client that left or timed out (a port scan, a health
                // check) is not counted as one.
                if matches!(e, Error::Tls(_)) {
                    crate::handshake::count_refusal(RejectCode::Auth);
                    tracing::warn!(error = %e, ?peer, "rdma handshake refused: TLS");
                } else {
                    tracing::debug!(error = %e, ?peer, "rdma handshake: client left during TLS");
                }
            })
        }
        None => Ok(s),
    }
}

/// Fills `buf` by `deadline`. `Ok(false)` if the peer closed before the
/// first byte, an error if it closed after it.
fn read_exact_by(s: &mut Stream, buf: &mut [u8], deadline: Deadline) -> Result<bool> {
    let mut have = 0;
    while have < buf.len() {
        match s.read_some_by(&mut buf[have..], deadline)? {
            0 if have == 0 => return Ok(false),
            0 => {
                return Err(Error::MalformedHandshake(format!(
                    "peer closed after {have} of {} bytes",
                    buf.len()
                )));
            }
            k => have += k,
        }
    }
    Ok(true)
}

/// Reads one message by `deadline`: the 12-byte header first (a bad magic,
/// version or length is refused before the body is read), then exactly the
/// body.
///
/// # Errors
/// [`Error::MalformedHandshake`], [`Error::VersionMismatch`],
/// [`Error::PeerGone`] (closed before a header), [`Error::Timeout`].
pub(crate) fn recv_msg(s: &mut Stream, deadline: Deadline) -> Result<Message> {
    let mut head = [0u8; HEADER_LEN];
    // The first two bytes alone first: a TLS record (handshake 0x16 or
    // alert 0x15, version 3.x; an alert is 7 bytes in all) where our header
    // belongs means the two ends disagree about TLS. Say so.
    if !read_exact_by(s, &mut head[..2], deadline)? {
        return Err(Error::PeerGone);
    }
    if !s.is_tls() && matches!(head, [0x15 | 0x16, 0x03, ..]) {
        return Err(Error::Tls(
            "the peer speaks TLS on the side channel and this end is not configured for it \
             (HandshakeConfig::tls_client / tls_server)"
                .into(),
        ));
    }
    if !read_exact_by(s, &mut head[2..], deadline)? {
        return Err(Error::MalformedHandshake(
            "peer closed after 2 header bytes".into(),
        ));
    }
    let header = Header::decode(&head)?;
    let mut body = vec![0u8; header.body_len];
    if !read_exact_by(s, &mut body, deadline)? {
        return Err(Error::MalformedHandshake(format!(
            "peer closed inside a {}-byte body",
            header.body_len
        )));
    }
    Message::decode_body(header.kind, &body)
}

/// Sets `hello.provider` to verbs and `hello.endpoint` to our queue pair's
/// LID, QPN, PSN, GID and port MTU.
///
/// # Errors
/// [`Error::InvalidConfig`] if `qp` is not a verbs queue pair.
pub(crate) fn fill_hello(qp: &QueuePair, hello: &mut Hello) -> Result<()> {
    let v = verbs_qp(qp)?;
    hello.provider = ProviderKind::Verbs.code();
    hello.endpoint = v.endpoint().encode();
    Ok(())
}

/// Client side: sends `hello` and returns the server's `Accept`.
///
/// # Errors
/// [`Error::AuthFailed`] / [`Error::Rejected`] when the server refused,
/// [`Error::MalformedHandshake`] for any other answer, transport errors.
pub(crate) fn exchange(s: &mut Stream, hello: Hello, deadline: Deadline) -> Result<Hello> {
    send_msg(s, &Message::Hello(hello), deadline)?;
    match recv_msg(s, deadline)? {
        Message::Accept(h) => {
            check_provider(&h)?;
            Ok(h)
        }
        Message::Reject(r) => Err(crate::conn::exchange::reject_error(r)),
        other => Err(Error::MalformedHandshake(format!(
            "expected Accept, got {:?}",
            other.kind()
        ))),
    }
}

/// The provider is verbs, and the endpoint decodes or is empty (a logical
/// connection over a queue pair already connected).
fn check_provider(h: &Hello) -> Result<()> {
    if h.provider != ProviderKind::Verbs.code() {
        return Err(Error::MalformedHandshake(format!(
            "peer offers provider code {} on an rdma:// side channel",
            h.provider
        )));
    }
    if !h.endpoint.is_empty() {
        QpAddress::decode(&h.endpoint)?;
    }
    Ok(())
}

/// Server side: reads the client's `Hello`, checks the token (when `token` is
/// set) and that it offers a valid verbs queue-pair address. A bad client is answered
/// with a `Reject` and the error is returned.
///
/// # Errors
/// [`Error::MalformedHandshake`], [`Error::VersionMismatch`],
/// [`Error::AuthFailed`], transport errors.
pub(crate) fn read_hello(
    s: &mut Stream,
    token: Option<&[u8]>,
    deadline: Deadline,
) -> Result<Hello> {
    let hello = match recv_msg(s, deadline) {
        Ok(Message::Hello(h)) => h,
        Ok(other) => {
            let e = Error::MalformedHandshake(format!("expected Hello, got {:?}", other.kind()));
            return Err(refuse(s, RejectCode::Malformed, e, deadline));
        }
        Err(e @ Error::VersionMismatch { .. }) => {
            return Err(refuse(s, RejectCode::Version, e, deadline));
        }
        Err(e @ (Error::MalformedHandshake(_) | Error::Tls(_))) => {
            return Err(refuse(s, RejectCode::Malformed, e, deadline));
        }
        Err(e) => return Err(e),
    };
    if let Some(want) = token
        && !hello.token.as_deref().is_some_and(|t| token_eq(t, want))
    {
        return Err(refuse(s, RejectCode::Auth, Error::AuthFailed, deadline));
    }
    if let Err(e) = check_provider(&hello) {
        return Err(refuse(s, RejectCode::Incompatible, e, deadline));
    }
    Ok(hello)
}

/// Connects `qp` to the peer described by `peer`: INIT → RTR → RTS towards its
/// endpoint, and its region descriptors become the grants every post is
/// checked against.
///
/// # Errors
/// [`Error::MalformedHandshake`] for a bad endpoint; [`Error::Io`] if the
/// device refuses a transition; [`Error::InvalidConfig`] for a non-verbs or
/// already-connected queue pair.
pub(crate) fn attach(qp: &QueuePair, peer: &Hello) -> Result<()> {
    let v = verbs_qp(qp)?;
    let ep = QpAddress::decode(&peer.endpoint)?;
    v.connect(&ep, peer.regions.iter().map(|d| d.remote).collect())
}

/// The whole client side: connect to `addr` (with `keepalive`), send `hello` (its provider and
/// endpoint filled in from `qp`), read the server's `Accept`, and connect `qp`
/// to the server's queue pair, all by `deadline`. Returns the side channel
/// (timeouts still set) and the server's `Accept` body.
///
/// # Errors
/// As [`connect_tcp`], [`exchange`] and [`attach`].
pub(crate) fn client(
    addr: SocketAddr,
    qp: &QueuePair,
    mut hello: Hello,
    deadline: Deadline,
    keepalive: Option<&TcpKeepalive>,
    tls: Option<&crate::conn::settings::TlsClient>,
) -> Result<(TcpStream, Hello)> {
    fill_hello(qp, &mut hello)?;
    let mut s = open(addr, deadline, keepalive, tls)?;
    let accept = exchange(&mut s, hello, deadline)?;
    attach(qp, &accept)?;
    Ok((s.into_tcp(), accept))
}

/// The client side of a logical connection over a queue pair that is
/// already connected ([`crate::conn::connect_logical`]): as [`client`], but
/// the hello carries no endpoint, and neither may the server's `Accept`.
///
/// # Errors
/// As [`client`]; [`Error::MalformedHandshake`] if the server answers with
/// an endpoint.
pub(crate) fn client_logical(
    addr: SocketAddr,
    mut hello: Hello,
    deadline: Deadline,
    keepalive: Option<&TcpKeepalive>,
    tls: Option<&crate::conn::settings::TlsClient>,
) -> Result<(TcpStream, Hello)> {
    hello.provider = ProviderKind::Verbs.code();
    hello.endpoint.clear();
    let mut s = open(addr, deadline, keepalive, tls)?;
    let accept = exchange(&mut s, hello, deadline)?;
    if !accept.endpoint.is_empty() {
        return Err(Error::MalformedHandshake(
            "the server answered a logical connection with a queue-pair endpoint".into(),
        ));
    }
    Ok((s.into_tcp(), accept))
}

/// The side channel to `addr`, in TLS when `tls` is set.
fn open(
    addr: SocketAddr,
    deadline: Deadline,
    keepalive: Option<&TcpKeepalive>,
    tls: Option<&crate::conn::settings::TlsClient>,
) -> Result<Stream> {
    let tcp = connect_tcp(addr, deadline, keepalive)?;
    Ok(match tls {
        Some(t) => {
            let conn = rustls::ClientConnection::new(t.config.clone(), t.server_name.clone())
                .map_err(|e| tls_error("TLS client session", &e))?;
            Stream::tls(tcp, conn.into(), deadline)?
        }
        None => Stream::plain(tcp),
    })
}

/// The server side after [`read_hello`]: connect `qp` to the client's queue
/// pair, then answer `Accept` with `hello` (provider and endpoint filled in).
/// If the client's endpoint cannot be reached a `Reject` is sent instead.
///
/// # Errors
/// As [`attach`]; transport errors while answering.
pub(crate) fn server_accept(
    s: &mut Stream,
    qp: &QueuePair,
    client: &Hello,
    mut hello: Hello,
    deadline: Deadline,
) -> Result<()> {
    if let Err(e) = fill_hello(qp, &mut hello).and_then(|_| attach(qp, client)) {
        // A device that cannot reach the client (link down, a transition
        // refused) is this server's trouble, not a malformed client.
        return Err(refuse(
            s,
            crate::conn::exchange::reject_code_for(&e),
            e,
            deadline,
        ));
    }
    send_msg(s, &Message::Accept(hello), deadline)
}

/// Refuses the client on `s` with `code` and `e`'s text (best effort: the
/// client may be gone), counts and logs the refusal, and returns `e`.
fn refuse(s: &mut Stream, code: RejectCode, e: Error, deadline: Deadline) -> Error {
    let _ = send_msg(
        s,
        &Message::Reject(Reject {
            code,
            reason: e.to_string(),
        }),
        deadline,
    );
    crate::handshake::count_refusal(code);
    tracing::warn!(
        error = %e,
        peer = ?s.tcp().peer_addr().ok(),
        reason = code.name(),
        "rdma handshake refused"
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{RegionDesc, Section};
    use crate::region::RemoteRegion;

    fn dl() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_tcp(addr, dl(), None).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
        (c, s)
    }

    fn pair() -> (Stream, Stream) {
        let (c, s) = tcp_pair();
        (Stream::plain(c), Stream::plain(s))
    }

    fn verbs_hello(token: Option<&[u8]>) -> Hello {
        Hello {
            token: token.map(<[u8]>::to_vec),
            provider: ProviderKind::Verbs.code(),
            endpoint: QpAddress {
                lid: 3,
                qpn: 0x77,
                psn: 0x1234,
                gid: [0; 16],
                mtu: rdma_sys::ibv_mtu::IBV_MTU_1024,
            }
            .encode(),
            regions: vec![RegionDesc {
                role: 1,
                remote: RemoteRegion {
                    addr: 0x10_0000,
                    len: 4096,
                    rkey: 0xabc,
                },
            }],
            sections: vec![Section {
                tag: 9,
                bytes: b"app".to_vec(),
            }],
        }
    }

    #[test]
    fn accept_round_trip_over_tcp() {
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || {
            let h = read_hello(&mut s, Some(b"secret"), dl()).unwrap();
            let mut answer = verbs_hello(None);
            answer.sections[0].bytes = h.sections[0].bytes.iter().rev().copied().collect();
            send_msg(&mut s, &Message::Accept(answer), dl()).unwrap();
            h
        });
        let sent = verbs_hello(Some(b"secret"));
        let got = exchange(&mut c, sent.clone(), dl()).unwrap();
        assert_eq!(got.sections[0].bytes, b"ppa");
        assert_eq!(server.join().unwrap(), sent);
    }

    #[test]
    fn wrong_token_is_rejected_on_both_sides() {
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || read_hello(&mut s, Some(b"secret"), dl()));
        assert!(matches!(
            exchange(&mut c, verbs_hello(Some(b"guess")), dl()),
            Err(Error::AuthFailed)
        ));
        assert!(matches!(server.join().unwrap(), Err(Error::AuthFailed)));
    }

    #[test]
    fn shm_hello_on_rdma_channel_is_incompatible() {
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || read_hello(&mut s, None, dl()));
        let mut h = verbs_hello(None);
        h.provider = ProviderKind::Shm.code();
        assert!(matches!(exchange(&mut c, h, dl()), Err(Error::Rejected(_))));
        assert!(matches!(
            server.join().unwrap(),
            Err(Error::MalformedHandshake(_))
        ));
        // A verbs hello with a truncated endpoint is refused the same way.
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || read_hello(&mut s, None, dl()));
        let mut h = verbs_hello(None);
        h.endpoint.truncate(10);
        assert!(matches!(exchange(&mut c, h, dl()), Err(Error::Rejected(_))));
        assert!(server.join().unwrap().is_err());
    }

    /// A server whose own device failed while setting the connection up
    /// (seen with the link down: `ibv_modify_qp(RTR)` is `ENETUNREACH`)
    /// refuses with `Unavailable`, and the client reports the server's
    /// device trouble, not a protocol fault of its own.
    #[test]
    fn a_server_device_failure_is_peer_unavailable() {
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || {
            let e = Error::io(
                "ibv_modify_qp(RTR)",
                io::Error::from_raw_os_error(libc::ENETUNREACH),
            );
            assert_eq!(e.fault(), crate::Fault::Device);
            recv_msg(&mut s, dl()).unwrap();
            send_msg(
                &mut s,
                &Message::Reject(Reject {
                    code: crate::conn::exchange::reject_code_for(&e),
                    reason: e.to_string(),
                }),
                dl(),
            )
            .unwrap();
        });
        let e = exchange(&mut c, verbs_hello(None), dl()).unwrap_err();
        server.join().unwrap();
        assert!(
            matches!(e, Error::PeerUnavailable(ref m) if m.contains("RTR")),
            "{e}"
        );
        assert_eq!(e.fault(), crate::Fault::Device);
    }

    #[test]
    fn garbage_and_early_close_are_typed_errors() {
        let (mut c, s) = tcp_pair();
        c.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(matches!(
            read_hello(&mut Stream::plain(s), None, dl()),
            Err(Error::MalformedHandshake(_))
        ));
        let (c, mut s) = pair();
        drop(c);
        assert!(matches!(recv_msg(&mut s, dl()), Err(Error::PeerGone)));
        // A header promising a body that never comes.
        let (mut c, s) = tcp_pair();
        let mut bytes = Message::Hello(verbs_hello(None)).encode().unwrap();
        bytes.truncate(HEADER_LEN + 3);
        c.write_all(&bytes).unwrap();
        drop(c);
        assert!(matches!(
            recv_msg(&mut Stream::plain(s), dl()),
            Err(Error::MalformedHandshake(_))
        ));
    }

    #[test]
    fn reads_time_out_instead_of_hanging() {
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_tcp(addr, dl(), None).unwrap();
        let _s = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
        let deadline = Deadline::after(Duration::from_millis(50));
        assert!(matches!(
            recv_msg(&mut Stream::plain(c), deadline),
            Err(Error::Timeout)
        ));
    }

    /// One byte every 100 ms never times out a single read, but the
    /// deadline for the whole handshake still cuts the peer off.
    #[test]
    fn trickling_peer_is_cut_off_at_the_deadline() {
        let (c, s) = tcp_pair();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let bytes = Message::Hello(verbs_hello(None)).encode().unwrap();
                let mut c = c;
                for b in bytes.iter().take(60) {
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        break;
                    }
                    let _ = c.write_all(std::slice::from_ref(b));
                    std::thread::sleep(Duration::from_millis(100));
                }
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let t = std::time::Instant::now();
        let r = read_hello(
            &mut Stream::plain(s),
            None,
            Deadline::after(Duration::from_millis(300)),
        );
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Release);
        trickler.join().unwrap();
        assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
        // Generous: a timeout per read would let it run for the whole 6 s.
        assert!(took < Duration::from_secs(3), "held for {took:?}");
    }

    /// What `getsockopt` reads back: (SO_KEEPALIVE, idle s, interval s, count, user timeout ms).
    fn keepalive_of(s: &impl std::os::fd::AsFd) -> (bool, u32, u32, u32, u32) {
        use nix::sys::socket::getsockopt;
        (
            getsockopt(s, sockopt::KeepAlive).unwrap(),
            getsockopt(s, sockopt::TcpKeepIdle).unwrap(),
            getsockopt(s, sockopt::TcpKeepInterval).unwrap(),
            getsockopt(s, sockopt::TcpKeepCount).unwrap(),
            getsockopt(s, sockopt::TcpUserTimeout).unwrap(),
        )
    }

    #[test]
    fn keepalive_is_set_on_both_ends() {
        let k = TcpKeepalive::default();
        assert_eq!(k.bound(), Duration::from_secs(16));
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_tcp(addr, dl(), Some(&k)).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), Some(&k)).unwrap();
        assert_eq!(
            keepalive_of(&c),
            (true, 10, 2, 3, 16_000),
            "connecting socket"
        );
        assert_eq!(
            keepalive_of(&s),
            (true, 10, 2, 3, 16_000),
            "accepted socket"
        );
        // Other timers are carried through as given.
        let k = TcpKeepalive::new(Duration::from_secs(30), Duration::from_secs(5), 4).unwrap();
        let c = connect_tcp(addr, dl(), Some(&k)).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), Some(&k)).unwrap();
        assert_eq!(keepalive_of(&c), (true, 30, 5, 4, 50_000));
        assert_eq!(keepalive_of(&s), (true, 30, 5, 4, 50_000));
        // None leaves keep-alive off.
        let c = connect_tcp(addr, dl(), None).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
        assert!(!keepalive_of(&c).0 && !keepalive_of(&s).0);
    }

    /// The listener of `conn` passes `HandshakeConfig::keepalive` to the
    /// accepted socket (the client side is [`client`], tested on a device).
    #[test]
    fn listener_sets_the_configured_keepalive() {
        use crate::conn::{HandshakeConfig, Listener};
        let ep = crate::FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
        for (cfg, want) in [
            (HandshakeConfig::default(), (true, 10, 2, 3, 16_000)),
            (
                HandshakeConfig::builder()
                    .keepalive(Some(
                        TcpKeepalive::new(Duration::from_secs(7), Duration::from_secs(1), 2)
                            .unwrap(),
                    ))
                    .build()
                    .unwrap(),
                (true, 7, 1, 2, 9_000),
            ),
        ] {
            let l = Listener::bind(&ep, cfg).unwrap();
            let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let p = l.accept_pending().unwrap();
            assert_eq!(keepalive_of(&p), want);
        }
        let l = Listener::bind(
            &ep,
            HandshakeConfig::builder().keepalive(None).build().unwrap(),
        )
        .unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(!keepalive_of(&l.accept_pending().unwrap()).0);
    }

    // ---- TLS ----------------------------------------------------------------

    use std::sync::{Arc, Mutex};

    /// A server config with a fresh self-signed certificate for `rrpc.test`,
    /// and a client config that trusts it.
    fn tls_configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        crate::testing::self_signed_tls("rrpc.test")
    }

    /// A TLS server (`cfg`) on `s`, in a thread, for the tests that expect
    /// its handshake to fail ([`server_failed_tls`]).
    fn spawn_tls_server(
        s: TcpStream,
        cfg: Arc<rustls::ServerConfig>,
    ) -> std::thread::JoinHandle<Result<Stream>> {
        std::thread::spawn(move || server_stream(Stream::plain(s), Some(&cfg), dl()))
    }

    /// The server thread of [`spawn_tls_server`] ended with a TLS error.
    fn server_failed_tls(server: std::thread::JoinHandle<Result<Stream>>) {
        let e = server.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::Tls(_)), "server: {e}");
    }

    fn tls_client(c: TcpStream, cfg: &Arc<rustls::ClientConfig>) -> Result<Stream> {
        let name = rustls::pki_types::ServerName::try_from("rrpc.test").unwrap();
        let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
        Stream::tls(c, conn.into(), dl())
    }

    /// A TCP relay between a client and `to` that records every byte it
    /// carries (what someone on the path sees).
    fn sniffing_relay(to: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            let (a, _) = l.accept().unwrap();
            let b = TcpStream::connect(to).unwrap();
            let pipe = |mut from: TcpStream, mut into: TcpStream, seen: Arc<Mutex<Vec<u8>>>| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        seen.lock().unwrap().extend_from_slice(&buf[..n]);
                        if into.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = into.shutdown(std::net::Shutdown::Write);
                })
            };
            let up = pipe(
                a.try_clone().unwrap(),
                b.try_clone().unwrap(),
                seen2.clone(),
            );
            let down = pipe(b, a, seen2);
            let _ = (up.join(), down.join());
        });
        (addr, seen)
    }

    #[test]
    fn tls_carries_the_handshake_encrypted() {
        let (server_cfg, client_cfg) = tls_configs();
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let (relay, seen) = sniffing_relay(l.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let tcp = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
            let mut s = server_stream(Stream::plain(tcp), Some(&server_cfg), dl()).unwrap();
            assert!(s.is_tls());
            let h = read_hello(&mut s, Some(b"token-in-the-clear?"), dl()).unwrap();
            send_msg(&mut s, &Message::Accept(verbs_hello(None)), dl()).unwrap();
            h
        });
        let c = connect_tcp(relay, dl(), None).unwrap();
        let mut c = tls_client(c, &client_cfg).unwrap();
        let sent = verbs_hello(Some(b"token-in-the-clear?"));
        let got = exchange(&mut c, sent.clone(), dl()).unwrap();
        assert_eq!(got, verbs_hello(None));
        assert_eq!(server.join().unwrap(), sent);
        // After Accept the session is dropped: the bare stream remains.
        let _tcp: TcpStream = c.into_tcp();
        let seen = seen.lock().unwrap().clone();
        assert!(seen.len() > 200, "{} bytes relayed", seen.len());
        let has = |needle: &[u8]| seen.windows(needle.len()).any(|w| w == needle);
        assert!(
            !has(b"token-in-the-clear?"),
            "the token crossed in plaintext"
        );
        assert!(
            !has(&crate::handshake::MAGIC),
            "a handshake header crossed in plaintext"
        );
    }

    #[test]
    fn an_untrusted_server_certificate_fails_both_sides() {
        let (server_cfg, _) = tls_configs();
        let (_, other_client_cfg) = tls_configs(); // trusts another certificate
        let (c, s) = tcp_pair();
        let server = spawn_tls_server(s, server_cfg);
        let e = tls_client(c, &other_client_cfg).unwrap_err();
        assert!(
            matches!(&e, Error::Tls(m) if m.contains("certificate")),
            "client: {e}"
        );
        server_failed_tls(server);
    }

    #[test]
    fn a_plaintext_client_is_refused_by_a_tls_server() {
        let (server_cfg, _) = tls_configs();
        let (c, s) = tcp_pair();
        let server = spawn_tls_server(s, server_cfg);
        let r = exchange(&mut Stream::plain(c), verbs_hello(Some(b"secret")), dl());
        // The server's alert, read where an Accept belongs.
        assert!(
            matches!(&r, Err(Error::Tls(m)) if m.contains("peer speaks TLS")),
            "{r:?}"
        );
        server_failed_tls(server);
    }

    #[test]
    fn a_tls_client_of_a_plaintext_server_fails_clearly() {
        let (_, client_cfg) = tls_configs();
        let (c, s) = tcp_pair();
        let server = std::thread::spawn(move || read_hello(&mut Stream::plain(s), None, dl()));
        let e = tls_client(c, &client_cfg).unwrap_err();
        assert!(matches!(e, Error::Tls(_) | Error::PeerGone), "client: {e}");
        let e = server.join().unwrap().unwrap_err();
        assert!(
            matches!(&e, Error::Tls(m) if m.contains("peer speaks TLS")),
            "server: {e}"
        );
    }

    /// A client that connects and never starts TLS holds the server's
    /// handshake thread only until the deadline.
    #[test]
    fn a_silent_client_is_cut_off_during_tls_at_the_deadline() {
        let (server_cfg, _) = tls_configs();
        let (_c, s) = tcp_pair();
        let t = std::time::Instant::now();
        let r = server_stream(
            Stream::plain(s),
            Some(&server_cfg),
            Deadline::after(Duration::from_millis(200)),
        );
        assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    /// Waits up to 20 ms for `s` to be readable or writable as `w` asks.
    fn wait_for(s: &TcpStream, w: Want) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let flags = if w == Want::Write {
            PollFlags::POLLOUT
        } else {
            PollFlags::POLLIN
        };
        let mut fds = [PollFd::new(s.as_fd(), flags)];
        let _ = poll(&mut fds, PollTimeout::from(20u16));
    }

    /// The non-blocking TLS step of an async accept loop: a client that
    /// sends its ClientHello and stalls costs the server no wait (it is
    /// told to wait for readability), and an honest client's hello ends up
    /// whole in plaintext, so the blocking part that follows never waits
    /// for the client.
    #[test]
    fn pump_never_blocks_and_delivers_the_hello() {
        let (server_cfg, client_cfg) = tls_configs();
        // A client that sends its ClientHello, then nothing.
        let (mut c, s) = tcp_pair();
        let name = rustls::pki_types::ServerName::try_from("rrpc.test").unwrap();
        let mut hello_only = rustls::ClientConnection::new(client_cfg.clone(), name).unwrap();
        hello_only.write_tls(&mut c).unwrap();
        let mut st = Stream::plain(s);
        st.start_server_tls(&server_cfg).unwrap();
        st.tcp().set_nonblocking(true).unwrap();
        let t = std::time::Instant::now();
        let mut wants = Vec::new();
        for _ in 0..5 {
            let w = st.pump().unwrap();
            wants.push(w);
            wait_for(st.tcp(), w);
        }
        assert!(wants.iter().all(|w| *w == Want::Read), "{wants:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        drop((c, st));

        // An honest client: TLS, then its hello, on its own thread.
        let (c, s) = tcp_pair();
        let client = std::thread::spawn(move || {
            let mut c = tls_client(c, &client_cfg)?;
            exchange(&mut c, verbs_hello(Some(b"tok")), dl())
        });
        let mut st = Stream::plain(s);
        st.start_server_tls(&server_cfg).unwrap();
        st.tcp().set_nonblocking(true).unwrap();
        let t = std::time::Instant::now();
        loop {
            match st.pump().unwrap() {
                Want::Ready => break,
                w => wait_for(st.tcp(), w),
            }
            assert!(t.elapsed() < Duration::from_secs(5), "hello never whole");
        }
        st.tcp().set_nonblocking(false).unwrap();
        // The session the pump started is completed, not started again,
        // and the hello is read from what the pump took out of it.
        let mut st = server_stream(st, Some(&server_cfg), dl()).unwrap();
        let h = read_hello(&mut st, Some(b"tok"), dl()).unwrap();
        assert_eq!(h, verbs_hello(Some(b"tok")));
        send_msg(&mut st, &Message::Accept(verbs_hello(None)), dl()).unwrap();
        assert_eq!(client.join().unwrap().unwrap(), verbs_hello(None));
    }
}
