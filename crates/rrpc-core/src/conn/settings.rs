//! The settings of a handshake: what may be granted, keep-alive, TLS.

#[cfg(feature = "verbs")]
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

use super::budget::DEFAULT_MAX_PEER_GRANT_BYTES;

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
/// the accepted socket ([`HandshakeConfigBuilder::keepalive`]).
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
/// readable, and [`Connection::check_alive`](super::Connection::check_alive) reports
/// [`Error::PeerUnresponsive`] (the peer's host stopped answering, after how
/// long) and fails the queue pair with it.
///
/// Not used by `shm://` (a Unix socket between processes of one host: a
/// dead peer's socket is closed by its kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    pub(crate) idle: Duration,
    pub(crate) interval: Duration,
    pub(crate) count: u32,
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
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`HandshakeConfig::builder`], setters on
/// [`HandshakeConfigBuilder`], [`build`](HandshakeConfigBuilder::build)
/// validates; getters are named after the setting.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    pub(crate) timeout: Duration,
    pub(crate) token: Option<Vec<u8>>,
    pub(crate) max_grant_bytes: u64,
    pub(crate) max_total_grant_bytes: u64,
    pub(crate) max_peer_grant_bytes: u64,
    pub(crate) keepalive: Option<TcpKeepalive>,
    /// Behind one pointer: a config is moved around with every pending
    /// handshake.
    #[cfg(feature = "verbs")]
    pub(crate) tls: Option<Arc<SideTls>>,
}

/// Side-channel TLS settings (`verbs` feature).
#[cfg(feature = "verbs")]
#[derive(Debug, Clone, Default)]
pub(crate) struct SideTls {
    pub(crate) server: Option<Arc<rustls::ServerConfig>>,
    pub(crate) client: Option<TlsClient>,
}

/// The client half of TLS on the `rdma://` side channel
/// ([`HandshakeConfigBuilder::tls_client`]).
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
    /// A builder starting from the defaults.
    pub fn builder() -> HandshakeConfigBuilder {
        HandshakeConfigBuilder {
            cfg: Self::default(),
        }
    }

    /// A builder starting from this config, to derive a modified one.
    pub fn to_builder(&self) -> HandshakeConfigBuilder {
        HandshakeConfigBuilder { cfg: self.clone() }
    }

    /// How long one handshake may take, in total, before [`Error::Timeout`]:
    /// a deadline for all its reads and writes together, not a timeout per
    /// read (a peer sending one byte at a time is cut off at the deadline).
    /// Default 5 s.
    ///
    /// The client's deadline runs from [`connect`](super::connect); the server's from
    /// [`Pending::handshake`](super::Pending::handshake) (reading the hello) and again from
    /// [`Incoming::accept`](super::Incoming::accept) (answering it).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The shared secret a server requires from clients (`None`: no check).
    /// Default `None`. Clients pass their token in
    /// [`Offer::token`](super::Offer::token).
    pub fn token(&self) -> Option<&[u8]> {
        self.token.as_deref()
    }

    /// The most bytes one peer may grant us in one handshake (shm: the sum
    /// of its regions and its receive queue, all of which we map). A larger
    /// grant is refused with [`Error::LimitExceeded`] — on the server with a
    /// `Reject`, on the client for the server's `Accept`. Default
    /// [`DEFAULT_MAX_GRANT_BYTES`] (1 GiB + 64 MiB).
    ///
    /// The number of regions is limited separately, by the codec
    /// ([`crate::handshake::MAX_REGIONS`]).
    pub fn max_grant_bytes(&self) -> u64 {
        self.max_grant_bytes
    }

    /// The most bytes of peer memory the connections of one [`Listener`](super::Listener)
    /// may have mapped at once (shm). A handshake that would pass it is
    /// refused with [`Error::LimitExceeded`] and a `Reject`; the bytes come
    /// back when a connection's queue pair (which holds the mappings) is
    /// dropped. Default [`DEFAULT_MAX_TOTAL_GRANT_BYTES`] (64 GiB). Not used
    /// by [`connect`](super::connect).
    pub fn max_total_grant_bytes(&self) -> u64 {
        self.max_total_grant_bytes
    }

    /// The most bytes of peer memory the connections of one [`Listener`](super::Listener)
    /// may have mapped at once for **one peer** (shm): one process, as the
    /// Unix socket's `SO_PEERCRED` names it ([`PeerKey`](super::PeerKey)). Default
    /// [`DEFAULT_MAX_PEER_GRANT_BYTES`] (16 GiB, a quarter of the total), so
    /// one peer cannot take the whole of
    /// [`max_total_grant_bytes`](Self::max_total_grant_bytes) and
    /// lock everyone else out. A handshake past it is refused with
    /// [`Error::LimitExceeded`] and a `Reject`; when the total nears its
    /// end (its last [`NEAR_END_DIVISOR`](super::NEAR_END_DIVISOR)th), the peer holding the most is
    /// refused before a newcomer. Not used by [`connect`](super::connect).
    pub fn max_peer_grant_bytes(&self) -> u64 {
        self.max_peer_grant_bytes
    }

    /// Dead-host detection on the TCP side channel of `rdma://`
    /// connections (see [`TcpKeepalive`]): set on the client's socket by
    /// [`connect`](super::connect) and on each accepted socket by
    /// [`Listener`](super::Listener). Default
    /// `Some(TcpKeepalive::default())`: a remote host that dies without
    /// closing is detected within **16 s** (10 s idle + 3 probes × 2 s;
    /// `TCP_USER_TIMEOUT` 16 s). `None` leaves the socket's keep-alive off
    /// (the system's defaults: a dead host on an idle side channel is never
    /// noticed). No effect on `shm://`.
    pub fn keepalive(&self) -> Option<TcpKeepalive> {
        self.keepalive
    }

    #[cfg(feature = "verbs")]
    pub(crate) fn tls_server(&self) -> Option<&Arc<rustls::ServerConfig>> {
        self.tls.as_ref()?.server.as_ref()
    }

    #[cfg(feature = "verbs")]
    pub(crate) fn tls_client(&self) -> Option<&TlsClient> {
        self.tls.as_ref()?.client.as_ref()
    }
}

/// Builder for [`HandshakeConfig`]; every setter documents its range, and
/// [`build`](Self::build) rejects anything outside it.
#[derive(Debug, Clone)]
pub struct HandshakeConfigBuilder {
    cfg: HandshakeConfig,
}

impl HandshakeConfigBuilder {
    /// [`HandshakeConfig::timeout`], more than zero.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.cfg.timeout = t;
        self
    }

    /// [`HandshakeConfig::token`], at most [`crate::handshake::MAX_TOKEN`] bytes.
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.cfg.token = Some(token.into());
        self
    }

    /// [`HandshakeConfig::max_grant_bytes`], more than 0.
    pub fn max_grant_bytes(mut self, bytes: u64) -> Self {
        self.cfg.max_grant_bytes = bytes;
        self
    }

    /// [`HandshakeConfig::max_total_grant_bytes`], more than 0.
    pub fn max_total_grant_bytes(mut self, bytes: u64) -> Self {
        self.cfg.max_total_grant_bytes = bytes;
        self
    }

    /// [`HandshakeConfig::max_peer_grant_bytes`], more than 0. A value above
    /// the total only lets one peer take the total.
    pub fn max_peer_grant_bytes(mut self, bytes: u64) -> Self {
        self.cfg.max_peer_grant_bytes = bytes;
        self
    }

    /// [`HandshakeConfig::keepalive`] (`None` turns it off).
    pub fn keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.cfg.keepalive = keepalive;
        self
    }

    /// TLS on the server's `rdma://` side channel (rustls; `verbs`
    /// feature): every client must complete a TLS handshake with `config`
    /// before its hello is read, so the token, queue-pair addresses and
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
        Arc::make_mut(self.cfg.tls.get_or_insert_with(Default::default)).server = Some(config);
        self
    }

    /// TLS on the client's `rdma://` side channel (rustls; `verbs`
    /// feature): [`connect`](super::connect) runs a TLS handshake with `config`, checking the
    /// server's certificate for `server_name`, before it sends its hello.
    /// A server whose certificate `config` does not trust, or that does not
    /// speak TLS, fails the connect with [`Error::Tls`].
    #[cfg(feature = "verbs")]
    pub fn tls_client(
        mut self,
        config: Arc<rustls::ClientConfig>,
        server_name: rustls::pki_types::ServerName<'static>,
    ) -> Self {
        Arc::make_mut(self.cfg.tls.get_or_insert_with(Default::default)).client = Some(TlsClient {
            config,
            server_name,
        });
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: a zero
    /// `timeout`, a `token` longer than [`crate::handshake::MAX_TOKEN`], a
    /// zero `max_grant_bytes`, `max_total_grant_bytes` or
    /// `max_peer_grant_bytes`.
    pub fn build(self) -> Result<HandshakeConfig> {
        let c = self.cfg;
        if c.timeout.is_zero() {
            return Err(Error::InvalidConfig("handshake timeout must be > 0".into()));
        }
        if let Some(t) = &c.token
            && t.len() > crate::handshake::MAX_TOKEN
        {
            return Err(Error::InvalidConfig(format!(
                "token too long: {} bytes, at most {}",
                t.len(),
                crate::handshake::MAX_TOKEN
            )));
        }
        for (name, bytes) in [
            ("max_grant_bytes", c.max_grant_bytes),
            ("max_total_grant_bytes", c.max_total_grant_bytes),
            ("max_peer_grant_bytes", c.max_peer_grant_bytes),
        ] {
            if bytes == 0 {
                return Err(Error::InvalidConfig(format!("{name} must be > 0")));
            }
        }
        Ok(c)
    }
}

/// What [`Pending::poll_hello`](super::Pending::poll_hello) waits for before
/// the client's hello is here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The side channel to become readable.
    Read,
    /// The side channel to become writable.
    Write,
    /// Nothing more: call [`Pending::handshake`](super::Pending::handshake)
    /// (for a plain side channel: wait for the hello's bytes yourself, or
    /// let `handshake` read them).
    Ready,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_config_build_checks_every_setting() {
        let b = HandshakeConfig::builder;
        let err = |b: HandshakeConfigBuilder| b.build().unwrap_err().to_string();
        assert!(err(b().timeout(Duration::ZERO)).contains("handshake timeout must be > 0"));
        let long = vec![0u8; crate::handshake::MAX_TOKEN + 1];
        let e = err(b().token(long));
        assert!(e.contains("token too long") && e.contains("at most"), "{e}");
        assert!(err(b().max_grant_bytes(0)).contains("max_grant_bytes must be > 0"));
        assert!(err(b().max_total_grant_bytes(0)).contains("max_total_grant_bytes must be > 0"));
        assert!(err(b().max_peer_grant_bytes(0)).contains("max_peer_grant_bytes must be > 0"));
        let c = b()
            .timeout(Duration::from_millis(1))
            .token(vec![7u8; crate::handshake::MAX_TOKEN])
            .max_grant_bytes(1)
            .max_total_grant_bytes(2)
            .max_peer_grant_bytes(3)
            .keepalive(None)
            .build()
            .unwrap();
        assert_eq!(c.timeout(), Duration::from_millis(1));
        assert_eq!(
            c.token().map(<[u8]>::len),
            Some(crate::handshake::MAX_TOKEN)
        );
        assert_eq!(
            (
                c.max_grant_bytes(),
                c.max_total_grant_bytes(),
                c.max_peer_grant_bytes()
            ),
            (1, 2, 3)
        );
        assert_eq!(c.keepalive(), None);
        let d = c.to_builder().max_grant_bytes(9).build().unwrap();
        assert_eq!((d.max_grant_bytes(), d.timeout()), (9, c.timeout()));
    }
}
