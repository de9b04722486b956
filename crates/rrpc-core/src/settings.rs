//! Plain settings and descriptions shared by the queue pairs and every
//! provider: [`QpConfig`] and [`RcRetry`], which provider carries a queue
//! pair ([`ProviderKind`], [`QpCarrier`]), and `VerbsOptions`.
//!
//! A leaf below the providers: it imports only the error type and the fault
//! settings, so that `qp`, `fabric` and `provider/` all build on it without
//! a circle. The public types are re-exported from [`crate::qp`] and
//! [`crate::fabric`].

use crate::error::{Error, Result};
use crate::fault::FaultConfig;

#[cfg(feature = "verbs")]
/// The verbs port used when none is asked for (single-port NICs, soft-RoCE).
pub(crate) const DEFAULT_PORT: u8 = 1;

/// Which provider implements the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderKind {
    /// Same-host shared memory (always built; the default).
    Shm,
    /// libibverbs (cargo feature `verbs`).
    Verbs,
}

impl ProviderKind {
    /// The provider's wire code in the handshake.
    pub fn code(self) -> u8 {
        match self {
            ProviderKind::Shm => 1,
            ProviderKind::Verbs => 2,
        }
    }

    /// The provider for a wire code.
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(ProviderKind::Shm),
            2 => Some(ProviderKind::Verbs),
            _ => None,
        }
    }
}

/// Which verbs device, port and GID index a fabric uses
/// ([`crate::Fabric::verbs_with`]). Values are checked when the device is opened,
/// against what it has.
///
/// | option | default |
/// |---|---|
/// | [`device`](Self::device) | the first device libibverbs lists |
/// | [`port`](Self::port) | 1 |
/// | [`gid_index`](Self::gid_index) | RoCE: the first IPv4-mapped RoCE v2 GID, else 0; InfiniBand: 0 |
#[cfg(feature = "verbs")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsOptions {
    device: Option<String>,
    port: u8,
    gid_index: Option<u8>,
}

#[cfg(feature = "verbs")]
impl Default for VerbsOptions {
    fn default() -> Self {
        VerbsOptions {
            device: None,
            port: DEFAULT_PORT,
            gid_index: None,
        }
    }
}

#[cfg(feature = "verbs")]
impl VerbsOptions {
    /// The defaults (see the table above).
    pub fn new() -> Self {
        Self::default()
    }

    /// The device, by name (`mlx5_0`, `rxe0`). Default: the first listed.
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self
    }

    /// The physical port queue pairs use (`port_num`, numbered from 1).
    /// Default 1. Opening fails for a port the device does not have.
    pub fn port(mut self, port: u8) -> Self {
        self.port = port;
        self
    }

    /// The source GID index (`sgid_index`): which of the port's GIDs the
    /// handshake carries and the queue pairs send from.
    ///
    /// Default: on a RoCE port, the first entry of the GID table that is an
    /// IPv4-mapped address (`::ffff:a.b.c.d`) of type RoCE v2 (the type as
    /// sysfs names it in
    /// `/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>`;
    /// an entry whose type cannot be read is not chosen), found by reading
    /// the table with `ibv_query_gid`; if there is none, index 0 (InfiniBand,
    /// RoCE without an IPv4 address). On an InfiniBand port, 0.
    ///
    /// Both ends must be able to route to each other's GID: set the index
    /// explicitly when the default picks an address the peer cannot reach
    /// (several IPv4 addresses on one port, RoCE v1 networks).
    pub fn gid_index(mut self, index: u8) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// See [`Self::device`].
    pub fn get_device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// See [`Self::port`].
    pub fn get_port(&self) -> u8 {
        self.port
    }

    /// See [`Self::gid_index`] (`None`: the default choice).
    pub fn get_gid_index(&self) -> Option<u8> {
        self.gid_index
    }
}

/// Queue pair configuration. Defaults follow common verbs settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpConfig {
    send_depth: u32,
    recv_depth: u32,
    max_inline: Option<u32>,
    rc_retry: RcRetry,
    fault: FaultConfig,
}

/// What carries a queue pair's traffic ([`QueuePair::carrier`](crate::QueuePair::carrier)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpCarrier {
    /// The provider that moves the bytes.
    pub provider: ProviderKind,
    /// The verbs device (`mlx5_0`, `rxe0`); `None` on shm.
    pub device: Option<String>,
    /// Our port's GID (verbs).
    pub local_gid: Option<[u8; 16]>,
    /// The GID of the peer the queue pair is connected to (verbs; `None`
    /// before it connected).
    pub remote_gid: Option<[u8; 16]>,
    /// Whether this is a sharer of another queue pair ([`crate::vqp`]).
    pub shared: bool,
}

impl QpCarrier {
    /// A GID as an address: the IPv4 of an IPv4-mapped RoCE v2 GID
    /// (`::ffff:a.b.c.d`), else the IPv6 address of the 16 bytes.
    pub fn gid_addr(gid: &[u8; 16]) -> std::net::IpAddr {
        let v6 = std::net::Ipv6Addr::from(*gid);
        match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(v6),
        }
    }
}

/// A reliable connection's retransmission settings (verbs; no effect on shm,
/// where nothing is lost): what the queue pair does when the wire drops,
/// reorders or delays packets, and when it gives up on the peer.
///
/// | setting | default | verbs attribute |
/// |---|---|---|
/// | [`ack_timeout`](Self::ack_timeout) | 14 (4.096 µs × 2^14 ≈ 67 ms) | `ibv_qp_attr::timeout` |
/// | [`retry_count`](Self::retry_count) | 7 (the most) | `retry_cnt` |
/// | [`rnr_retry`](Self::rnr_retry) | 7 (retry for ever) | `rnr_retry` |
/// | [`min_rnr_timer`](Self::min_rnr_timer) | 12 (0.64 ms) | `min_rnr_timer` |
///
/// **Why these defaults.** They are chosen for lossy RoCE without PFC, a
/// common deployment, where the transport itself repairs loss: a packet
/// that arrives out of sequence draws an immediate NAK and a go-back-N
/// retransmission, and only a lost *last* packet (or its ACK) waits for the
/// ACK timeout. The timeout is long enough that a congested switch queue or
/// a busy soft-RoCE host is not taken for loss, and short enough that a
/// lost tail costs tens of milliseconds, not seconds. With the most
/// retries, a work request fails (`IBV_WC_RETRY_EXC_ERR`, reported as
/// [`crate::Status::RetryExceeded`] and to gRPC callers as `Unavailable`)
/// only after 8 consecutive losses of one packet: at 5 % loss that is a
/// chance of 4 × 10⁻¹¹, while a peer that stopped acknowledging (its host
/// died, the link is cut) is detected after about 8 × 67 ms ≈ 0.5 s of data
/// left unacknowledged (devices may round the timeout up). An idle
/// connection has nothing to retransmit: its dead peer is found by the side
/// channel's keep-alive ([`crate::conn::TcpKeepalive`]). The receive side
/// posts its receives late, so receiver-not-ready NAKs are retried for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcRetry {
    ack_timeout: u8,
    retry_count: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
}

impl Default for RcRetry {
    fn default() -> Self {
        RcRetry {
            ack_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

impl RcRetry {
    /// The local ACK timeout exponent: a packet left unacknowledged for
    /// 4.096 µs × 2^`ack_timeout` is retransmitted.
    pub fn get_ack_timeout(&self) -> u8 {
        self.ack_timeout
    }

    /// The local ACK timeout as a duration (4.096 µs × 2^`ack_timeout`).
    pub fn ack_timeout_duration(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(4096u64 << self.ack_timeout)
    }

    /// How long a peer that stopped acknowledging takes to fail a work
    /// request: `(retry_count + 1) ×` [`ack_timeout_duration`](Self::ack_timeout_duration)
    /// (a device may round the timeout up).
    pub fn give_up_after(&self) -> std::time::Duration {
        self.ack_timeout_duration() * (u32::from(self.retry_count) + 1)
    }

    /// Sets [`get_ack_timeout`](Self::get_ack_timeout).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless `1 <= exponent <= 31` (0 would mean
    /// "wait for ever", which leaves a dead peer's work requests pending).
    pub fn ack_timeout(mut self, exponent: u8) -> Result<Self> {
        if !(1..=31).contains(&exponent) {
            return Err(Error::InvalidConfig(format!(
                "ack_timeout must be an exponent in 1..=31, got {exponent}"
            )));
        }
        self.ack_timeout = exponent;
        Ok(self)
    }

    /// Retransmissions of one packet before the work request fails with
    /// `IBV_WC_RETRY_EXC_ERR`.
    pub fn get_retry_count(&self) -> u8 {
        self.retry_count
    }

    /// Sets [`get_retry_count`](Self::get_retry_count).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] above 7.
    pub fn retry_count(mut self, n: u8) -> Result<Self> {
        if n > 7 {
            return Err(Error::InvalidConfig(format!(
                "retry_count must be in 0..=7, got {n}"
            )));
        }
        self.retry_count = n;
        Ok(self)
    }

    /// Retries after a receiver-not-ready NAK; 7 retries for ever.
    pub fn get_rnr_retry(&self) -> u8 {
        self.rnr_retry
    }

    /// Sets [`get_rnr_retry`](Self::get_rnr_retry).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] above 7.
    pub fn rnr_retry(mut self, n: u8) -> Result<Self> {
        if n > 7 {
            return Err(Error::InvalidConfig(format!(
                "rnr_retry must be in 0..=7, got {n}"
            )));
        }
        self.rnr_retry = n;
        Ok(self)
    }

    /// The receiver-not-ready NAK timer code we ask senders to wait (IB
    /// spec table: 12 is 0.64 ms, 0 is 655.36 ms).
    pub fn get_min_rnr_timer(&self) -> u8 {
        self.min_rnr_timer
    }

    /// Sets [`get_min_rnr_timer`](Self::get_min_rnr_timer).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] above 31.
    pub fn min_rnr_timer(mut self, code: u8) -> Result<Self> {
        if code > 31 {
            return Err(Error::InvalidConfig(format!(
                "min_rnr_timer must be a code in 0..=31, got {code}"
            )));
        }
        self.min_rnr_timer = code;
        Ok(self)
    }
}

/// Largest [`QpConfig::max_inline`] accepted (no device we know of
/// takes more inline data per work request).
pub const MAX_INLINE_REQUEST: u32 = 4096;

/// Inline bytes a verbs queue pair asks for when [`QpConfig::max_inline`] is
/// `None`: one cache line (ring pointer words, small messages).
pub const DEFAULT_INLINE: u32 = 64;

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            send_depth: 1024,
            recv_depth: 1024,
            max_inline: None,
            rc_retry: RcRetry::default(),
            fault: FaultConfig::none(),
        }
    }
}

impl QpConfig {
    /// Maximum work requests outstanding on the send queue (`max_send_wr`). Default 1024.
    ///
    /// On verbs it must not exceed the device's `max_qp_wr` nor its
    /// `max_cqe` (the send completion queue has this many entries):
    /// [`crate::Fabric::create_qp`] refuses a larger one with
    /// [`Error::InvalidConfig`] naming both values.
    pub fn get_send_depth(&self) -> u32 {
        self.send_depth
    }

    /// Sets [`get_send_depth`](Self::get_send_depth).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless `1 <= depth <= 65536`.
    pub fn send_depth(mut self, depth: u32) -> Result<Self> {
        if !(1..=65536).contains(&depth) {
            return Err(Error::InvalidConfig(format!(
                "send_depth must be in 1..=65536, got {depth}"
            )));
        }
        self.send_depth = depth;
        Ok(self)
    }

    /// Maximum receives posted for incoming WRITE_WITH_IMM (`max_recv_wr`),
    /// rounded up to a power of two. Default 1024.
    ///
    /// On verbs the rounded value must not exceed the device's `max_qp_wr`
    /// nor its `max_cqe`: [`crate::Fabric::create_qp`] refuses a larger one
    /// with [`Error::InvalidConfig`] naming both values.
    pub fn get_recv_depth(&self) -> u32 {
        self.recv_depth
    }

    /// Sets [`get_recv_depth`](Self::get_recv_depth).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless `1 <= depth <= 65536`.
    pub fn recv_depth(mut self, depth: u32) -> Result<Self> {
        if !(1..=65536).contains(&depth) {
            return Err(Error::InvalidConfig(format!(
                "recv_depth must be in 1..=65536, got {depth}"
            )));
        }
        self.recv_depth = depth;
        Ok(self)
    }

    /// Inline data the verbs send queue must take (`max_inline_data`):
    /// WRITEs of at most this many bytes are copied into the work request
    /// (`IBV_SEND_INLINE`) instead of being read from the region by DMA.
    ///
    /// * `None` (default): [`DEFAULT_INLINE`] (64) bytes, or less if the
    ///   device refuses 64 — then the most it accepts, found by asking
    ///   `ibv_create_qp` (libibverbs reports no such limit) and remembered
    ///   for the fabric; logged at info level.
    /// * `Some(n)`: checked — if the device refuses `n`,
    ///   [`crate::Fabric::create_qp`] fails with [`Error::InvalidConfig`]
    ///   naming `n` and the most the device accepts.
    ///
    /// A device may grant more than asked; every WRITE up to what it granted
    /// goes inline. No effect on shm (every WRITE is a copy there).
    pub fn get_max_inline(&self) -> Option<u32> {
        self.max_inline
    }

    /// Sets [`get_max_inline`](Self::get_max_inline) to `Some(bytes)`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] above [`MAX_INLINE_REQUEST`] (4096).
    pub fn max_inline(mut self, bytes: u32) -> Result<Self> {
        if bytes > MAX_INLINE_REQUEST {
            return Err(Error::InvalidConfig(format!(
                "max_inline must be at most {MAX_INLINE_REQUEST} bytes, got {bytes}"
            )));
        }
        self.max_inline = Some(bytes);
        Ok(self)
    }

    /// The reliable connection's retransmission settings ([`RcRetry`];
    /// verbs only).
    pub fn get_rc_retry(&self) -> RcRetry {
        self.rc_retry
    }

    /// Sets [`get_rc_retry`](Self::get_rc_retry).
    pub fn rc_retry(mut self, retry: RcRetry) -> Self {
        self.rc_retry = retry;
        self
    }

    /// Faults to inject (tests).
    pub fn get_fault(&self) -> &FaultConfig {
        &self.fault
    }

    /// Sets [`get_fault`](Self::get_fault).
    pub fn fault(mut self, fault: FaultConfig) -> Self {
        self.fault = fault;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_inline_defaults_to_none_and_is_bounded() {
        let c = QpConfig::default();
        assert_eq!(c.get_max_inline(), None);
        assert_eq!(c.clone().max_inline(0).unwrap().get_max_inline(), Some(0));
        assert_eq!(
            c.clone()
                .max_inline(MAX_INLINE_REQUEST)
                .unwrap()
                .get_max_inline(),
            Some(MAX_INLINE_REQUEST)
        );
        let e = c.max_inline(MAX_INLINE_REQUEST + 1).unwrap_err();
        assert!(
            e.to_string().contains("at most 4096 bytes, got 4097"),
            "{e}"
        );
    }

    #[test]
    fn rc_retry_defaults_and_bounds() {
        let r = QpConfig::default().get_rc_retry();
        assert_eq!(
            (
                r.get_ack_timeout(),
                r.get_retry_count(),
                r.get_rnr_retry(),
                r.get_min_rnr_timer()
            ),
            (14, 7, 7, 12)
        );
        // 4.096 us x 2^14 = 67.1 ms; 8 tries before RETRY_EXC.
        assert_eq!(r.ack_timeout_duration().as_micros(), 67_108);
        assert_eq!(r.give_up_after().as_micros(), 536_870);
        assert!(r.ack_timeout(0).unwrap_err().to_string().contains("1..=31"));
        assert!(r.ack_timeout(32).is_err());
        assert!(r.retry_count(8).is_err());
        assert!(r.rnr_retry(8).is_err());
        assert!(r.min_rnr_timer(32).is_err());
        let c = QpConfig::default().rc_retry(r.retry_count(2).unwrap());
        assert_eq!(c.get_rc_retry().get_retry_count(), 2);
    }

    #[test]
    fn gids_read_as_addresses() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 99, 1, 2]);
        assert_eq!(QpCarrier::gid_addr(&g).to_string(), "10.99.1.2");
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(QpCarrier::gid_addr(&link_local).to_string(), "fe80::1");
    }
}
