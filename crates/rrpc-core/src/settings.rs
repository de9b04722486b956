//! Plain settings and descriptions shared by the queue pairs and every
//! provider: [`QpConfig`] and [`RcRetry`], which provider carries a queue
//! pair ([`ProviderKind`], [`QpCarrier`]), and `VerbsOptions`, each with its
//! builder.
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
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`VerbsOptions::builder`], setters on
/// [`VerbsOptionsBuilder`], [`build`](VerbsOptionsBuilder::build); read back
/// with getters named after the setting.
///
/// | option | default |
/// |---|---|
/// | [`device`](VerbsOptionsBuilder::device) | the first device libibverbs lists |
/// | [`port`](VerbsOptionsBuilder::port) | 1 |
/// | [`gid_index`](VerbsOptionsBuilder::gid_index) | RoCE: the first IPv4-mapped RoCE v2 GID, else 0; InfiniBand: 0 |
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
    /// A builder starting from the defaults (see the table above).
    pub fn builder() -> VerbsOptionsBuilder {
        VerbsOptionsBuilder {
            opts: Self::default(),
        }
    }

    /// A builder starting from these options.
    pub fn to_builder(&self) -> VerbsOptionsBuilder {
        VerbsOptionsBuilder { opts: self.clone() }
    }

    /// The device asked for ([`VerbsOptionsBuilder::device`]; `None`: the first listed).
    pub fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// The port ([`VerbsOptionsBuilder::port`]).
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID index ([`VerbsOptionsBuilder::gid_index`]; `None`: the default choice).
    pub fn gid_index(&self) -> Option<u8> {
        self.gid_index
    }
}

/// Builder for [`VerbsOptions`].
#[cfg(feature = "verbs")]
#[derive(Debug, Clone)]
pub struct VerbsOptionsBuilder {
    opts: VerbsOptions,
}

#[cfg(feature = "verbs")]
impl VerbsOptionsBuilder {
    /// The device, by name (`mlx5_0`, `rxe0`). Default: the first listed.
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.opts.device = Some(name.into());
        self
    }

    /// The physical port queue pairs use (`port_num`, numbered from 1).
    /// Default 1. Opening fails for a port the device does not have.
    pub fn port(mut self, port: u8) -> Self {
        self.opts.port = port;
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
        self.opts.gid_index = Some(index);
        self
    }

    /// The options. Nothing is checked here (the device is, when opened).
    ///
    /// # Errors
    /// None today; a `Result` like every config's `build`, so that a check
    /// added later is not a breaking change.
    pub fn build(self) -> Result<VerbsOptions> {
        Ok(self.opts)
    }
}

/// Queue pair configuration. Defaults follow common verbs settings.
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`QpConfig::builder`], setters on [`QpConfigBuilder`],
/// [`build`](QpConfigBuilder::build) validates; [`QpConfig::default`] is the
/// defaults.
///
/// # Examples
/// ```
/// use rrpc_core::QpConfig;
/// let cfg = QpConfig::builder().send_depth(64).recv_depth(64).build()?;
/// assert_eq!(cfg.send_depth(), 64);
/// # Ok::<(), rrpc_core::Error>(())
/// ```
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
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`RcRetry::builder`], setters on [`RcRetryBuilder`],
/// [`build`](RcRetryBuilder::build) validates.
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
    /// A builder starting from the defaults (see the table above).
    pub fn builder() -> RcRetryBuilder {
        RcRetryBuilder {
            retry: Self::default(),
        }
    }

    /// A builder starting from these settings.
    pub fn to_builder(&self) -> RcRetryBuilder {
        RcRetryBuilder { retry: *self }
    }

    /// The local ACK timeout exponent: a packet left unacknowledged for
    /// 4.096 µs × 2^`ack_timeout` is retransmitted.
    pub fn ack_timeout(&self) -> u8 {
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

    /// Retransmissions of one packet before the work request fails with
    /// `IBV_WC_RETRY_EXC_ERR`.
    pub fn retry_count(&self) -> u8 {
        self.retry_count
    }

    /// Retries after a receiver-not-ready NAK; 7 retries for ever.
    pub fn rnr_retry(&self) -> u8 {
        self.rnr_retry
    }

    /// The receiver-not-ready NAK timer code we ask senders to wait (IB
    /// spec table: 12 is 0.64 ms, 0 is 655.36 ms).
    pub fn min_rnr_timer(&self) -> u8 {
        self.min_rnr_timer
    }
}

/// Builder for [`RcRetry`]; [`build`](Self::build) checks the ranges.
#[derive(Debug, Clone, Copy)]
pub struct RcRetryBuilder {
    retry: RcRetry,
}

impl RcRetryBuilder {
    /// [`RcRetry::ack_timeout`]: an exponent in `1..=31` (0 would mean
    /// "wait for ever", which leaves a dead peer's work requests pending).
    pub fn ack_timeout(mut self, exponent: u8) -> Self {
        self.retry.ack_timeout = exponent;
        self
    }

    /// [`RcRetry::retry_count`], `0..=7`.
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry.retry_count = n;
        self
    }

    /// [`RcRetry::rnr_retry`], `0..=7`.
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.retry.rnr_retry = n;
        self
    }

    /// [`RcRetry::min_rnr_timer`], a code in `0..=31`.
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.retry.min_rnr_timer = code;
        self
    }

    /// Validates and returns the settings.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: unless
    /// `ack_timeout` is in `1..=31`, `retry_count` and `rnr_retry` in
    /// `0..=7`, `min_rnr_timer` in `0..=31`.
    pub fn build(self) -> Result<RcRetry> {
        let r = self.retry;
        if !(1..=31).contains(&r.ack_timeout) {
            return Err(Error::InvalidConfig(format!(
                "ack_timeout must be an exponent in 1..=31, got {}",
                r.ack_timeout
            )));
        }
        if r.retry_count > 7 {
            return Err(Error::InvalidConfig(format!(
                "retry_count must be in 0..=7, got {}",
                r.retry_count
            )));
        }
        if r.rnr_retry > 7 {
            return Err(Error::InvalidConfig(format!(
                "rnr_retry must be in 0..=7, got {}",
                r.rnr_retry
            )));
        }
        if r.min_rnr_timer > 31 {
            return Err(Error::InvalidConfig(format!(
                "min_rnr_timer must be a code in 0..=31, got {}",
                r.min_rnr_timer
            )));
        }
        Ok(r)
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
            fault: FaultConfig::default(),
        }
    }
}

impl QpConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> QpConfigBuilder {
        QpConfigBuilder {
            cfg: Self::default(),
        }
    }

    /// A builder starting from this config, to derive a modified one.
    pub fn to_builder(&self) -> QpConfigBuilder {
        QpConfigBuilder { cfg: self.clone() }
    }

    /// Maximum work requests outstanding on the send queue (`max_send_wr`). Default 1024.
    ///
    /// On verbs it must not exceed the device's `max_qp_wr` nor its
    /// `max_cqe` (the send completion queue has this many entries):
    /// [`crate::Fabric::create_qp`] refuses a larger one with
    /// [`Error::InvalidConfig`] naming both values.
    pub fn send_depth(&self) -> u32 {
        self.send_depth
    }

    /// Maximum receives posted for incoming WRITE_WITH_IMM (`max_recv_wr`),
    /// rounded up to a power of two. Default 1024.
    ///
    /// On verbs the rounded value must not exceed the device's `max_qp_wr`
    /// nor its `max_cqe`: [`crate::Fabric::create_qp`] refuses a larger one
    /// with [`Error::InvalidConfig`] naming both values.
    pub fn recv_depth(&self) -> u32 {
        self.recv_depth
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
    pub fn max_inline(&self) -> Option<u32> {
        self.max_inline
    }

    /// The reliable connection's retransmission settings ([`RcRetry`];
    /// verbs only).
    pub fn rc_retry(&self) -> RcRetry {
        self.rc_retry
    }

    /// Faults to inject (tests).
    pub fn fault(&self) -> &FaultConfig {
        &self.fault
    }
}

/// Builder for [`QpConfig`]; every setter documents its range, and
/// [`build`](Self::build) rejects anything outside it.
#[derive(Debug, Clone)]
pub struct QpConfigBuilder {
    cfg: QpConfig,
}

impl QpConfigBuilder {
    /// [`QpConfig::send_depth`], `1..=65536`. Default 1024.
    pub fn send_depth(mut self, depth: u32) -> Self {
        self.cfg.send_depth = depth;
        self
    }

    /// [`QpConfig::recv_depth`], `1..=65536`. Default 1024.
    pub fn recv_depth(mut self, depth: u32) -> Self {
        self.cfg.recv_depth = depth;
        self
    }

    /// Sets [`QpConfig::max_inline`] to `Some(bytes)`, at most
    /// [`MAX_INLINE_REQUEST`] (4096).
    pub fn max_inline(mut self, bytes: u32) -> Self {
        self.cfg.max_inline = Some(bytes);
        self
    }

    /// [`QpConfig::rc_retry`].
    pub fn rc_retry(mut self, retry: RcRetry) -> Self {
        self.cfg.rc_retry = retry;
        self
    }

    /// [`QpConfig::fault`].
    pub fn fault(mut self, fault: FaultConfig) -> Self {
        self.cfg.fault = fault;
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: unless
    /// `send_depth` and `recv_depth` are in `1..=65536` and `max_inline` is
    /// at most [`MAX_INLINE_REQUEST`].
    pub fn build(self) -> Result<QpConfig> {
        let c = self.cfg;
        for (name, depth) in [("send_depth", c.send_depth), ("recv_depth", c.recv_depth)] {
            if !(1..=65536).contains(&depth) {
                return Err(Error::InvalidConfig(format!(
                    "{name} must be in 1..=65536, got {depth}"
                )));
            }
        }
        if let Some(bytes) = c.max_inline
            && bytes > MAX_INLINE_REQUEST
        {
            return Err(Error::InvalidConfig(format!(
                "max_inline must be at most {MAX_INLINE_REQUEST} bytes, got {bytes}"
            )));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_inline_defaults_to_none_and_is_bounded() {
        let c = QpConfig::default();
        assert_eq!(c.max_inline(), None);
        let b = || c.to_builder();
        assert_eq!(b().max_inline(0).build().unwrap().max_inline(), Some(0));
        assert_eq!(
            b().max_inline(MAX_INLINE_REQUEST)
                .build()
                .unwrap()
                .max_inline(),
            Some(MAX_INLINE_REQUEST)
        );
        let e = b().max_inline(MAX_INLINE_REQUEST + 1).build().unwrap_err();
        assert!(
            e.to_string()
                .contains("max_inline must be at most 4096 bytes, got 4097"),
            "{e}"
        );
    }

    #[test]
    fn depths_are_bounded() {
        let b = QpConfig::builder;
        assert_eq!(b().build().unwrap(), QpConfig::default());
        assert_eq!(b().send_depth(1).build().unwrap().send_depth(), 1);
        assert_eq!(b().recv_depth(65536).build().unwrap().recv_depth(), 65536);
        let e = b().send_depth(0).build().unwrap_err().to_string();
        assert!(e.contains("send_depth must be in 1..=65536, got 0"), "{e}");
        let e = b().recv_depth(65537).build().unwrap_err().to_string();
        assert!(
            e.contains("recv_depth must be in 1..=65536, got 65537"),
            "{e}"
        );
    }

    #[test]
    fn rc_retry_defaults_and_bounds() {
        let r = QpConfig::default().rc_retry();
        assert_eq!(
            (
                r.ack_timeout(),
                r.retry_count(),
                r.rnr_retry(),
                r.min_rnr_timer()
            ),
            (14, 7, 7, 12)
        );
        assert_eq!(RcRetry::builder().build().unwrap(), r);
        // 4.096 us x 2^14 = 67.1 ms; 8 tries before RETRY_EXC.
        assert_eq!(r.ack_timeout_duration().as_micros(), 67_108);
        assert_eq!(r.give_up_after().as_micros(), 536_870);
        let b = || r.to_builder();
        let err = |b: RcRetryBuilder| b.build().unwrap_err().to_string();
        assert!(err(b().ack_timeout(0)).contains("ack_timeout must be an exponent in 1..=31"));
        assert!(err(b().ack_timeout(32)).contains("ack_timeout"));
        assert!(err(b().retry_count(8)).contains("retry_count must be in 0..=7, got 8"));
        assert!(err(b().rnr_retry(8)).contains("rnr_retry must be in 0..=7, got 8"));
        assert!(err(b().min_rnr_timer(32)).contains("min_rnr_timer must be a code in 0..=31"));
        assert!(b().ack_timeout(31).min_rnr_timer(31).build().is_ok());
        let c = QpConfig::builder()
            .rc_retry(b().retry_count(2).build().unwrap())
            .build()
            .unwrap();
        assert_eq!(c.rc_retry().retry_count(), 2);
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn verbs_options_round_trip() {
        let o = VerbsOptions::builder()
            .device("rxe0")
            .port(2)
            .gid_index(3)
            .build()
            .unwrap();
        assert_eq!(
            (o.device(), o.port(), o.gid_index()),
            (Some("rxe0"), 2, Some(3))
        );
        assert_eq!(o.to_builder().build().unwrap(), o);
        assert_eq!(VerbsOptions::default().port(), DEFAULT_PORT);
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
