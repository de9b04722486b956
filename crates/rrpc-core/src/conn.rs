//! Connection establishment over a side channel, and liveness afterwards.
//!
//! The server [`Listener::bind`]s a side channel (a Unix socket for shm); the
//! client [`connect`]s and sends a `Hello` (see [`crate::handshake`]) carrying
//! its token, queue-pair endpoint, the regions it grants and the layers'
//! sections (the ring's parameters among them) —
//! on shm the regions' memfds, its receive queue and its eventfd travel along
//! as `SCM_RIGHTS`. The server checks version and token, answers `Accept` with
//! its own grants (or `Reject` with a reason) and both sides attach their queue
//! pairs to each other. One round trip; resources can come pre-made from a
//! [`crate::pool::ResourcePool`] (KRCore §3.1).
//!
//! ## A peer is not trusted
//!
//! Both sides check what the other sends; a bad peer gets a `Reject` naming
//! the problem (where the protocol allows one), a typed error, a closed
//! socket, and nothing of ours:
//!
//! * **Time.** [`HandshakeConfig::timeout`] (5 s) is a deadline for the whole
//!   handshake, not for each read: a peer that trickles bytes is cut off
//!   when it passes ([`Error::Timeout`]). Servers run
//!   [`Listener::accept_pending`] in their accept loop and each
//!   [`Pending::handshake`] on its own thread, so one slow client delays
//!   nobody else.
//! * **Descriptors.** Every descriptor received with `SCM_RIGHTS` is owned
//!   (and closed on every path) from the moment it arrives, truncated control
//!   data included; a hello carries at most `MAX_REGIONS + 2` (18).
//! * **Kinds.** Regions and the receive queue must be memfds sealed against
//!   shrinking and growing, at least as long as claimed; the eventfd must be
//!   an eventfd, and is written without blocking.
//! * **Memory.** At most [`crate::handshake::MAX_REGIONS`] (16) regions per
//!   hello; at most [`HandshakeConfig::max_grant_bytes`] (default 1 GiB +
//!   64 MiB) granted in one handshake, on both sides; at most
//!   [`HandshakeConfig::max_total_grant_bytes`] (default 64 GiB) mapped for
//!   the peers of one [`Listener`] at once, and at most
//!   [`HandshakeConfig::max_peer_grant_bytes`] (default 16 GiB) of that for
//!   one peer ([`PeerKey`]: a process, by `SO_PEERCRED`), so that no peer can
//!   lock the others out; near the end of the total the peer holding the
//!   most is refused first. Bytes return when a connection's queue pair is
//!   dropped. Refusals are [`Error::LimitExceeded`].
//!
//! The side channel then stays open as the liveness signal: when it closes —
//! the peer exited, crashed or called [`Connection::close`] — the connection is
//! failed with [`Error::PeerGone`] and so is its queue pair, so every later post
//! returns that error instead of writing into memory nobody reads. On
//! `rdma://` the side channel is TCP, and a remote *host* that dies without
//! closing it (power loss, hang, network cut) sends no FIN: TCP keep-alive
//! and `TCP_USER_TIMEOUT` ([`HandshakeConfig::keepalive`], [`TcpKeepalive`])
//! fail the socket within 16 s by default (10 s idle + 3 probes 2 s apart),
//! and the connection then reports [`Error::PeerUnresponsive`], naming the
//! bound, and fails its queue pair with it.

use std::io::{self, Read};
#[cfg(feature = "verbs")]
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::fabric::ProviderKind;
use crate::handshake::{Hello, Message, RegionDesc, Reject, RejectCode, Section, token_eq};
use crate::provider::shm::side::{
    attach, connect_unix, exchange_unix, granted_bytes, make_hello, recv_msg, send_msg,
    set_timeouts,
};
#[cfg(feature = "verbs")]
use crate::provider::verbs::side;

mod budget;
mod logical;
use crate::qp::{QpInner, QueuePair};
use crate::region::{Region, RemoteRegion};
use budget::Budget;
pub(crate) use budget::BudgetGuard;
pub use budget::{DEFAULT_MAX_PEER_GRANT_BYTES, NEAR_END_DIVISOR, PeerKey};
pub use logical::{GRANT_LEASE, SharedConnection, connect_logical};

/// Default of [`HandshakeConfig::max_grant_bytes`]: 1 GiB + 64 MiB, room for
/// the largest receive ring `rrpc-ringbuf` accepts (`MAX_RING_SIZE`, 1 GiB,
/// plus its header rounded up to a 2 MiB huge page), the largest shm
/// completion queue (65536 entries, 512 KiB) and a few small extra regions.
pub const DEFAULT_MAX_GRANT_BYTES: u64 = (1 << 30) + (64 << 20);

/// Default of [`HandshakeConfig::max_total_grant_bytes`]: 64 GiB of address
/// space — 60 connections with the largest rings, or thousands with the
/// default 4 MiB ring.
pub const DEFAULT_MAX_TOTAL_GRANT_BYTES: u64 = 64 << 30;

/// Dead-host detection on the TCP side channel of `rdma://` connections:
/// TCP keep-alive (`SO_KEEPALIVE`, `TCP_KEEPIDLE`, `TCP_KEEPINTVL`,
/// `TCP_KEEPCNT`) plus `TCP_USER_TIMEOUT`, set on both the connecting and
/// the accepted socket ([`HandshakeConfig::keepalive`]).
///
/// A peer *process* that exits closes its socket and is seen at once (FIN or
/// RST). A peer *host* that dies, hangs or drops off the network sends
/// nothing; without these options Linux notices only after about 2 h 11 min
/// (keep-alive defaults) or never (an idle side channel). With them the
/// socket fails with `ETIMEDOUT` at most [`TcpKeepalive::bound`] after the
/// last segment the peer sent — **16 s with the defaults** (10 s idle, then
/// 3 probes 2 s apart) — whether the side channel was idle (keep-alive
/// probes go unanswered) or had data in flight (`TCP_USER_TIMEOUT`, set to
/// the same bound, ends the retransmissions). The socket then polls
/// readable, and [`Connection::check_alive`] reports
/// [`Error::PeerUnresponsive`] (the peer's host stopped answering, after how
/// long) and fails the queue pair with it.
///
/// Not used by `shm://` (a Unix socket between processes of one host: a
/// dead peer's socket is closed by its kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    idle: Duration,
    interval: Duration,
    count: u32,
}

/// Largest `TCP_KEEPIDLE` / `TCP_KEEPINTVL` Linux accepts, in seconds.
const MAX_KEEPALIVE_SECS: u64 = 32767;
/// Largest `TCP_KEEPCNT` Linux accepts.
const MAX_KEEPALIVE_COUNT: u32 = 127;

impl Default for TcpKeepalive {
    /// 10 s idle, 3 probes 2 s apart: a dead host is detected within 16 s.
    fn default() -> Self {
        TcpKeepalive {
            idle: Duration::from_secs(10),
            interval: Duration::from_secs(2),
            count: 3,
        }
    }
}

impl TcpKeepalive {
    /// Probes after `idle` without traffic, then every `interval`; the
    /// connection fails after `count` unanswered probes.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless `idle` and `interval` are whole
    /// seconds in `1..=32767` and `count` is in `1..=127` (the ranges Linux
    /// accepts).
    pub fn new(idle: Duration, interval: Duration, count: u32) -> Result<Self> {
        for (what, d) in [("idle", idle), ("interval", interval)] {
            if d.subsec_nanos() != 0 || !(1..=MAX_KEEPALIVE_SECS).contains(&d.as_secs()) {
                return Err(Error::InvalidConfig(format!(
                    "keep-alive {what} must be whole seconds in 1..={MAX_KEEPALIVE_SECS} s, got {d:?}"
                )));
            }
        }
        if !(1..=MAX_KEEPALIVE_COUNT).contains(&count) {
            return Err(Error::InvalidConfig(format!(
                "keep-alive count must be in 1..={MAX_KEEPALIVE_COUNT}, got {count}"
            )));
        }
        Ok(TcpKeepalive {
            idle,
            interval,
            count,
        })
    }

    /// Time without traffic before the first probe (`TCP_KEEPIDLE`). Default 10 s.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// Time between probes (`TCP_KEEPINTVL`). Default 2 s.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Unanswered probes before the connection fails (`TCP_KEEPCNT`). Default 3.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The detection bound, `idle + interval × count` (16 s by default): a
    /// dead remote host is detected at most this long after the last
    /// segment it sent. Also the `TCP_USER_TIMEOUT` set, so data left
    /// unacknowledged is given up after the same time.
    pub fn bound(&self) -> Duration {
        self.idle + self.interval * self.count
    }
}

/// Side-channel and handshake settings.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    timeout: Duration,
    token: Option<Vec<u8>>,
    max_grant_bytes: u64,
    max_total_grant_bytes: u64,
    max_peer_grant_bytes: u64,
    keepalive: Option<TcpKeepalive>,
    /// Behind one pointer: a config is moved around with every pending
    /// handshake.
    #[cfg(feature = "verbs")]
    tls: Option<Arc<SideTls>>,
}

/// Side-channel TLS settings (`verbs` feature).
#[cfg(feature = "verbs")]
#[derive(Debug, Clone, Default)]
struct SideTls {
    server: Option<Arc<rustls::ServerConfig>>,
    client: Option<TlsClient>,
}

/// The client half of TLS on the `rdma://` side channel
/// ([`HandshakeConfig::tls_client`]).
#[cfg(feature = "verbs")]
#[derive(Debug, Clone)]
pub struct TlsClient {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) server_name: rustls::pki_types::ServerName<'static>,
}

impl Default for HandshakeConfig {
    fn default() -> Self {
        HandshakeConfig {
            timeout: Duration::from_secs(5),
            token: None,
            max_grant_bytes: DEFAULT_MAX_GRANT_BYTES,
            max_total_grant_bytes: DEFAULT_MAX_TOTAL_GRANT_BYTES,
            max_peer_grant_bytes: DEFAULT_MAX_PEER_GRANT_BYTES,
            keepalive: Some(TcpKeepalive::default()),
            #[cfg(feature = "verbs")]
            tls: None,
        }
    }
}

impl HandshakeConfig {
    /// How long one handshake may take, in total, before [`Error::Timeout`]:
    /// a deadline for all its reads and writes together, not a timeout per
    /// read (a peer sending one byte at a time is cut off at the deadline).
    /// Default 5 s.
    ///
    /// The client's deadline runs from [`connect`]; the server's from
    /// [`Pending::handshake`] (reading the hello) and again from
    /// [`Incoming::accept`] (answering it).
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets [`get_timeout`](Self::get_timeout).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a zero duration.
    pub fn timeout(mut self, t: Duration) -> Result<Self> {
        if t.is_zero() {
            return Err(Error::InvalidConfig("handshake timeout must be > 0".into()));
        }
        self.timeout = t;
        Ok(self)
    }

    /// The shared secret a server requires from clients (`None`: no check). Default `None`.
    pub fn get_token(&self) -> Option<&[u8]> {
        self.token.as_deref()
    }

    /// Sets [`get_token`](Self::get_token). Clients pass their token in [`Offer::token`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if longer than [`crate::handshake::MAX_TOKEN`].
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Result<Self> {
        let t = token.into();
        if t.len() > crate::handshake::MAX_TOKEN {
            return Err(Error::InvalidConfig("token too long".into()));
        }
        self.token = Some(t);
        Ok(self)
    }

    /// The most bytes one peer may grant us in one handshake (shm: the sum
    /// of its regions and its receive queue, all of which we map). A larger
    /// grant is refused with [`Error::LimitExceeded`] — on the server with a
    /// `Reject`, on the client for the server's `Accept`. Default
    /// [`DEFAULT_MAX_GRANT_BYTES`] (1 GiB + 64 MiB).
    ///
    /// The number of regions is limited separately, by the codec
    /// ([`crate::handshake::MAX_REGIONS`]).
    pub fn get_max_grant_bytes(&self) -> u64 {
        self.max_grant_bytes
    }

    /// Sets [`get_max_grant_bytes`](Self::get_max_grant_bytes).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for 0.
    pub fn max_grant_bytes(mut self, bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::InvalidConfig("max_grant_bytes must be > 0".into()));
        }
        self.max_grant_bytes = bytes;
        Ok(self)
    }

    /// The most bytes of peer memory the connections of one [`Listener`]
    /// may have mapped at once (shm). A handshake that would pass it is
    /// refused with [`Error::LimitExceeded`] and a `Reject`; the bytes come
    /// back when a connection's queue pair (which holds the mappings) is
    /// dropped. Default [`DEFAULT_MAX_TOTAL_GRANT_BYTES`] (64 GiB). Not used
    /// by [`connect`].
    pub fn get_max_total_grant_bytes(&self) -> u64 {
        self.max_total_grant_bytes
    }

    /// Dead-host detection on the TCP side channel of `rdma://`
    /// connections (see [`TcpKeepalive`]): set on the client's socket by
    /// [`connect`] and on each accepted socket by [`Listener`]. Default
    /// `Some(TcpKeepalive::default())`: a remote host that dies without
    /// closing is detected within **16 s** (10 s idle + 3 probes × 2 s;
    /// `TCP_USER_TIMEOUT` 16 s). `None` leaves the socket's keep-alive off
    /// (the system's defaults: a dead host on an idle side channel is never
    /// noticed). No effect on `shm://`.
    pub fn get_keepalive(&self) -> Option<TcpKeepalive> {
        self.keepalive
    }

    /// Sets [`get_keepalive`](Self::get_keepalive) (`None` turns it off).
    pub fn keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.keepalive = keepalive;
        self
    }

    /// TLS on the server's `rdma://` side channel (rustls; `verbs`
    /// feature): every client must complete a TLS handshake with `config`
    /// before its hello is read, so the token, queue-pair endpoints and
    /// region keys travel encrypted, and a client certificate verifier in
    /// `config` ([`rustls::server::WebPkiClientVerifier`]) admits only
    /// clients holding a certificate it trusts. A client that does not
    /// speak TLS, or fails it, is refused with [`Error::Tls`] (counted as an
    /// `auth` refusal) and never gets a region, a key or a queue pair.
    ///
    /// Only the handshake is protected: after `Accept` the side channel
    /// carries nothing but its liveness (the verbs provider's side
    /// channel docs), and the data path is the NIC's. `shm://` ignores this
    /// (its Unix socket never leaves the host; the kernel reports the
    /// peer's uid).
    #[cfg(feature = "verbs")]
    pub fn tls_server(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        Arc::make_mut(self.tls.get_or_insert_with(Default::default)).server = Some(config);
        self
    }

    /// TLS on the client's `rdma://` side channel (rustls; `verbs`
    /// feature): [`connect`] runs a TLS handshake with `config`, checking the
    /// server's certificate for `server_name`, before it sends its hello.
    /// A server whose certificate `config` does not trust, or that does not
    /// speak TLS, fails the connect with [`Error::Tls`].
    #[cfg(feature = "verbs")]
    pub fn tls_client(
        mut self,
        config: Arc<rustls::ClientConfig>,
        server_name: rustls::pki_types::ServerName<'static>,
    ) -> Self {
        Arc::make_mut(self.tls.get_or_insert_with(Default::default)).client = Some(TlsClient {
            config,
            server_name,
        });
        self
    }

    #[cfg(feature = "verbs")]
    pub(crate) fn get_tls_server(&self) -> Option<&Arc<rustls::ServerConfig>> {
        self.tls.as_ref()?.server.as_ref()
    }

    #[cfg(feature = "verbs")]
    pub(crate) fn get_tls_client(&self) -> Option<&TlsClient> {
        self.tls.as_ref()?.client.as_ref()
    }

    /// Sets [`get_max_total_grant_bytes`](Self::get_max_total_grant_bytes).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for 0.
    pub fn max_total_grant_bytes(mut self, bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::InvalidConfig(
                "max_total_grant_bytes must be > 0".into(),
            ));
        }
        self.max_total_grant_bytes = bytes;
        Ok(self)
    }

    /// The most bytes of peer memory the connections of one [`Listener`]
    /// may have mapped at once for **one peer** (shm): one process, as the
    /// Unix socket's `SO_PEERCRED` names it ([`PeerKey`]). Default
    /// [`DEFAULT_MAX_PEER_GRANT_BYTES`] (16 GiB, a quarter of the total), so
    /// one peer cannot take the whole of
    /// [`get_max_total_grant_bytes`](Self::get_max_total_grant_bytes) and
    /// lock everyone else out. A handshake past it is refused with
    /// [`Error::LimitExceeded`] and a `Reject`; when the total nears its
    /// end (its last [`NEAR_END_DIVISOR`]th), the peer holding the most is
    /// refused before a newcomer. Not used by [`connect`].
    pub fn get_max_peer_grant_bytes(&self) -> u64 {
        self.max_peer_grant_bytes
    }

    /// Sets [`get_max_peer_grant_bytes`](Self::get_max_peer_grant_bytes).
    /// A value above the total only lets one peer take the total.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for 0.
    pub fn max_peer_grant_bytes(mut self, bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::InvalidConfig(
                "max_peer_grant_bytes must be > 0".into(),
            ));
        }
        self.max_peer_grant_bytes = bytes;
        Ok(self)
    }
}

// ---------------------------------------------------------------------------
// Deadline and budget
// ---------------------------------------------------------------------------

/// The instant a whole handshake must be done by. Every read and write sets
/// the socket timeout to the time left, so the total never exceeds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Instant);

impl Deadline {
    pub(crate) fn after(d: Duration) -> Deadline {
        let now = Instant::now();
        // A timeout too large to add is as good as a year.
        Deadline(
            now.checked_add(d)
                .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400)),
        )
    }

    /// The time left.
    ///
    /// # Errors
    /// [`Error::Timeout`] once the deadline has passed.
    pub(crate) fn remaining(&self) -> Result<Duration> {
        let left = self.0.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        Ok(left)
    }
}

/// What one side offers in the handshake.
#[derive(Debug, Clone, Default)]
pub struct Offer {
    token: Option<Vec<u8>>,
    sections: Vec<Section>,
    pub(crate) grants: Vec<(u16, Arc<Region>)>,
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
    /// Adds a layer's part of the hello under `tag`, replacing an earlier
    /// one with the same tag. The fabric carries it and reads none of it;
    /// the peer finds it with [`PeerInfo::section`]. At most
    /// [`MAX_SECTIONS`](crate::handshake::MAX_SECTIONS) sections of
    /// [`MAX_SECTION`](crate::handshake::MAX_SECTION) bytes: a connect with
    /// more fails with [`Error::InvalidConfig`] before anything is sent.
    pub fn section(mut self, tag: u16, bytes: Vec<u8>) -> Self {
        match self.sections.iter_mut().find(|s| s.tag == tag) {
            Some(s) => s.bytes = bytes,
            None => self.sections.push(Section { tag, bytes }),
        }
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
    /// The layers' parts of the peer's hello (each tag at most once).
    pub sections: Vec<Section>,
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

    /// The bytes of the section the peer sent under `tag`.
    pub fn section(&self, tag: u16) -> Option<&[u8]> {
        self.sections
            .iter()
            .find(|s| s.tag == tag)
            .map(|s| s.bytes.as_slice())
    }
}

pub(crate) fn map_io(op: &'static str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout,
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => Error::PeerGone,
        _ => Error::io(op, e),
    }
}

// ---------------------------------------------------------------------------
// Hello construction and attachment (provider specific)
// ---------------------------------------------------------------------------

/// The provider-neutral part of our hello: token, grants, sections.
pub(crate) fn base_hello(offer: &Offer) -> Hello {
    Hello {
        token: offer.token.clone(),
        provider: 0,
        endpoint: Vec::new(),
        regions: offer
            .grants
            .iter()
            .map(|(role, r)| RegionDesc {
                role: *role,
                remote: r.remote(),
            })
            .collect(),
        sections: offer.sections.clone(),
    }
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
        sections: h.sections.clone(),
        regions: h.regions.clone(),
        provider,
    })
}

/// The reject code for an error found while checking a peer's hello or
/// setting its connection up.
pub(crate) fn reject_code_for(e: &Error) -> RejectCode {
    match e {
        Error::LimitExceeded { .. } => RejectCode::Busy,
        Error::VersionMismatch { .. } => RejectCode::Version,
        Error::AuthFailed => RejectCode::Auth,
        e if e.fault() == crate::Fault::Device => RejectCode::Unavailable,
        _ => RejectCode::Malformed,
    }
}

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
        Endpoint::Rdma(_) => return Err(Error::ProviderUnavailable("verbs")),
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

/// The client's error for the server's `Reject`.
pub(crate) fn reject_error(r: Reject) -> Error {
    match r.code {
        RejectCode::Auth => Error::AuthFailed,
        RejectCode::Unavailable => Error::PeerUnavailable(r.reason),
        _ => Error::Rejected(r.reason),
    }
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

/// What [`Pending::poll_hello`] waits for before the client's hello is here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The side channel to become readable.
    Read,
    /// The side channel to become writable.
    Write,
    /// Nothing more: call [`Pending::handshake`] (for a plain side channel:
    /// wait for the hello's bytes yourself, or let `handshake` read them).
    Ready,
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
    stream: Side,
    hello: Hello,
    peer: PeerInfo,
    fds: Vec<OwnedFd>,
    cfg: HandshakeConfig,
    /// The client's grants, reserved against the listener's budget.
    budget: Option<BudgetGuard>,
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

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// The side channel of one connection.
#[derive(Debug)]
enum Side {
    Unix(UnixStream),
    /// During the handshake with its TLS session, if any; a connection's
    /// has none (`side` docs, "TLS").
    #[cfg(feature = "verbs")]
    Tcp(side::Stream),
}

impl Side {
    fn send(&self, m: &Message, deadline: Deadline) -> Result<()> {
        match self {
            Side::Unix(s) => send_msg(s, m, &[], deadline),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => side::send_plain(s.tcp(), m, deadline),
        }
    }
    fn peer_key(&self) -> PeerKey {
        match self {
            Side::Unix(s) => {
                match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials) {
                    Ok(c) => PeerKey::Process {
                        uid: c.uid(),
                        pid: c.pid(),
                    },
                    Err(_) => PeerKey::Unknown,
                }
            }
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s
                .tcp()
                .peer_addr()
                .map_or(PeerKey::Unknown, |a| PeerKey::Host(a.ip())),
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
                .tcp()
                .peer_addr()
                .map_or_else(|_| "tcp peer".to_string(), |a| a.to_string()),
        }
    }
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Side::Unix(s) => s.as_fd(),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().as_fd(),
        }
    }
    fn set_timeouts(&self, t: Option<Duration>) -> Result<()> {
        match self {
            Side::Unix(s) => set_timeouts(s, t),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s
                .tcp()
                .set_read_timeout(t)
                .and_then(|_| s.tcp().set_write_timeout(t))
                .map_err(|e| Error::io("set socket timeout", e)),
        }
    }
    fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Side::Unix(s) => s.set_nonblocking(nb),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().set_nonblocking(nb),
        }
    }
    fn read(&self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Side::Unix(s) => (&*s).read(b),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                let mut t = s.tcp();
                t.read(b)
            }
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Side::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => s.tcp().shutdown(std::net::Shutdown::Both),
        };
    }
}

/// [`Connection::gone_why`]: the side channel closed (or the peer said goodbye).
const GONE_CLOSED: u8 = 0;
/// [`Connection::gone_why`]: the side channel timed out (the peer's host went silent).
const GONE_SILENT: u8 = 1;

/// An established connection: a connected queue pair, what the peer granted,
/// and the side channel that tells whether the peer is still there.
#[derive(Debug)]
pub struct Connection {
    qp: Arc<QueuePair>,
    peer: PeerInfo,
    side: Side,
    _grants: Vec<(u16, Arc<Region>)>,
    gone: AtomicBool,
    /// Why the peer is gone, once it is: [`GONE_CLOSED`] or [`GONE_SILENT`].
    gone_why: std::sync::atomic::AtomicU8,
    /// For a logical connection: the peer's grants on the shared queue pair
    /// and the shared connection, both released after `qp` (field order).
    logical: Option<logical::Logical>,
}

impl Connection {
    fn new(
        side: Side,
        qp: QueuePair,
        peer: PeerInfo,
        grants: Vec<(u16, Arc<Region>)>,
    ) -> Result<Self> {
        // The TLS session ends with the handshake (`side` docs, "TLS").
        #[cfg(feature = "verbs")]
        let side = match side {
            Side::Tcp(s) if s.is_tls() => Side::Tcp(side::Stream::plain(s.into_tcp())),
            other => other,
        };
        side.set_timeouts(None)?;
        side.set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Connection {
            qp: Arc::new(qp),
            peer,
            side,
            _grants: grants,
            gone: AtomicBool::new(false),
            gone_why: std::sync::atomic::AtomicU8::new(GONE_CLOSED),
            logical: None,
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
    pub fn liveness_fd(&self) -> BorrowedFd<'_> {
        self.side.as_fd()
    }

    /// Non-blocking liveness check.
    ///
    /// # Errors
    /// Once the peer is gone (the queue pair is failed with the same error):
    /// [`Error::PeerGone`] when the side channel closed or the peer said
    /// goodbye; [`Error::PeerUnresponsive`] when the peer's host stopped
    /// answering (the side channel's keep-alive or `TCP_USER_TIMEOUT` ran
    /// out: no FIN, no RST, the way a host dies or a link is cut).
    pub fn check_alive(&self) -> Result<()> {
        if self.gone.load(Ordering::Acquire) {
            return Err(self.gone_error());
        }
        let mut b = [0u8; 1];
        match self.side.read(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                self.gone_why.store(GONE_SILENT, Ordering::Release);
                self.mark_gone();
                Err(self.gone_error())
            }
            // EOF, goodbye bytes, or another socket error: the peer is gone.
            _ => {
                self.mark_gone();
                Err(self.gone_error())
            }
        }
    }

    /// The error that says why the peer is gone ([`Self::check_alive`]);
    /// [`Error::PeerGone`] while it is not known to be.
    pub fn gone_error(&self) -> Error {
        if self.gone_why.load(Ordering::Acquire) != GONE_SILENT {
            return Error::PeerGone;
        }
        let after: Option<u32> = match &self.side {
            Side::Unix(_) => None,
            #[cfg(feature = "verbs")]
            Side::Tcp(s) => {
                nix::sys::socket::getsockopt(&s.tcp(), nix::sys::socket::sockopt::TcpUserTimeout)
                    .ok()
            }
        };
        Error::PeerUnresponsive(match after {
            Some(ms) if ms > 0 => format!(
                "its host stopped answering: the side channel's keep-alive gave up after {:.1} s \
                 without an answer (no close was seen: the host is down or the link is cut)",
                f64::from(ms) / 1000.0
            ),
            _ => "its host stopped answering: the side channel timed out \
                  (no close was seen: the host is down or the link is cut)"
                .to_string(),
        })
    }

    fn mark_gone(&self) {
        if !self.gone.swap(true, Ordering::AcqRel) {
            let e = self.gone_error();
            tracing::debug!(error = %e, "peer gone");
            self.qp.fail(&e);
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
        // Best effort, never long: 12 bytes into a socket nothing else writes.
        let _ = self
            .side
            .send(&Message::Goodbye, Deadline::after(Duration::from_secs(1)));
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
        if let Some(l) = &self.logical {
            // The peer may still write into what we granted (module docs of
            // `logical`, "Retired grants").
            l.retire(std::mem::take(&mut self._grants));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_timers_are_validated() {
        let s = Duration::from_secs;
        assert!(TcpKeepalive::new(s(1), s(1), 1).is_ok());
        assert!(TcpKeepalive::new(s(32767), s(32767), 127).is_ok());
        for (idle, interval, count, says) in [
            (
                s(0),
                s(1),
                1,
                "idle must be whole seconds in 1..=32767 s, got 0ns",
            ),
            (s(32768), s(1), 1, "idle"),
            (Duration::from_millis(1500), s(1), 1, "got 1.5s"),
            (s(1), s(0), 1, "interval"),
            (s(1), s(1), 0, "count must be in 1..=127, got 0"),
            (s(1), s(1), 128, "got 128"),
        ] {
            let e = TcpKeepalive::new(idle, interval, count).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)));
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn keepalive_is_on_by_default_with_a_16_s_bound() {
        let k = HandshakeConfig::default()
            .get_keepalive()
            .expect("on by default");
        assert_eq!(
            (k.idle(), k.interval(), k.count()),
            (Duration::from_secs(10), Duration::from_secs(2), 3)
        );
        assert_eq!(k.bound(), Duration::from_secs(16));
        assert_eq!(
            HandshakeConfig::default().keepalive(None).get_keepalive(),
            None
        );
    }
}
