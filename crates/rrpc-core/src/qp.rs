//! Reliable-connection queue pairs: WRITE, WRITE_WITH_IMM and READ.
//!
//! Every post is checked before anything is written: the local slice must lie in
//! its region, the remote range inside a region the peer granted with the same
//! key, and the send queue must have room. A violation returns an error and
//! nothing is transferred. Work requests on one queue pair execute in order (RC
//! ordering): a WRITE posted after another is visible after it.
//!
//! Send-queue accounting follows verbs: a work request occupies a slot until a
//! *signaled* completion posted at or after it has been polled. Post at most
//! `send_depth` work requests between signaled completions you poll.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::fault::FaultConfig;
use crate::provider::shm::ShmQp;
#[cfg(feature = "verbs")]
use crate::provider::verbs::VerbsQp;
use crate::region::{Local, Remote};
use crate::vqp::VirtualQp;

/// Queue pair configuration. Defaults follow common verbs settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpConfig {
    send_depth: u32,
    recv_depth: u32,
    max_inline: Option<u32>,
    rc_retry: RcRetry,
    fault: FaultConfig,
}

/// What carries a queue pair's traffic ([`QueuePair::carrier`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpCarrier {
    /// The provider that moves the bytes.
    pub provider: crate::ProviderKind,
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

// Queue pairs live behind an `Arc`; boxing the shm variant would add an
// indirection to every post on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum QpInner {
    Shm(ShmQp),
    #[cfg(feature = "verbs")]
    Verbs(VerbsQp),
    /// A sharer of another queue pair ([`crate::vqp`]).
    Virtual(VirtualQp),
}

/// A reliable-connection queue pair (verbs: `ibv_qp` of type `IBV_QPT_RC`).
///
/// Posts take `&self` and are internally synchronised (as libibverbs is), so a
/// queue pair can be shared through an `Arc` between the task that writes a
/// ring and the task that pushes the head of the opposite ring.
#[derive(Debug)]
pub struct QueuePair {
    pub(crate) inner: QpInner,
}

impl QueuePair {
    /// RDMA WRITE of `local` to `remote` (`ibv_post_send` with `IBV_WR_RDMA_WRITE`;
    /// `signaled` sets `IBV_SEND_SIGNALED`).
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`], [`Error::BadRemoteKey`], [`Error::RemoteOutOfBounds`],
    /// [`Error::QueueFull`], [`Error::NotConnected`]; or the error that failed the
    /// queue pair ([`Error::PeerGone`], ...). Nothing is written on error.
    #[inline]
    pub fn post_write(
        &self,
        wr_id: u64,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        self.post(wr_id, SendOp::Write, local, remote, signaled)
    }

    /// RDMA WRITE_WITH_IMM (`IBV_WR_RDMA_WRITE_WITH_IMM`): the write, then a
    /// completion carrying `imm` on the peer's receive queue, consuming one of
    /// its posted receives.
    ///
    /// # Errors
    /// As [`Self::post_write`], plus [`Error::ReceiverNotReady`] when the peer has
    /// no receive posted.
    #[inline]
    pub fn post_write_imm(
        &self,
        wr_id: u64,
        local: Local<'_>,
        remote: Remote,
        imm: u32,
        signaled: bool,
    ) -> Result<()> {
        self.post(wr_id, SendOp::WriteImm(imm), local, remote, signaled)
    }

    /// RDMA READ of `remote` into `local` (`IBV_WR_RDMA_READ`).
    ///
    /// # Errors
    /// As [`Self::post_write`].
    #[inline]
    pub fn post_read(
        &self,
        wr_id: u64,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        self.post(wr_id, SendOp::Read, local, remote, signaled)
    }

    /// The one dispatch of a send work request to the provider.
    #[inline]
    fn post(
        &self,
        wr_id: u64,
        op: SendOp,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        match &self.inner {
            QpInner::Shm(q) => q.post(wr_id, op, local, remote, signaled),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.post(wr_id, op, local, remote, signaled),
            QpInner::Virtual(q) => q.post(wr_id, op, local, remote, signaled),
        }
    }

    /// Posts a receive for one incoming WRITE_WITH_IMM (`ibv_post_recv` with no
    /// scatter entries).
    ///
    /// # Errors
    /// [`Error::QueueFull`] when `recv_depth` receives are already posted.
    pub fn post_recv(&self, wr_id: u64) -> Result<()> {
        match &self.inner {
            QpInner::Shm(q) => q.post_recv(wr_id),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.post_recv(wr_id),
            QpInner::Virtual(q) => q.post_recv(wr_id),
        }
    }

    /// Completions of our WRITE / READ work requests.
    pub fn send_cq(&self) -> &CompletionQueue {
        match &self.inner {
            QpInner::Shm(q) => &q.send_cq,
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => &q.send_cq,
            QpInner::Virtual(q) => &q.send_cq,
        }
    }

    /// Completions of incoming WRITE_WITH_IMM.
    pub fn recv_cq(&self) -> &CompletionQueue {
        match &self.inner {
            QpInner::Shm(q) => &q.recv_cq,
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => &q.recv_cq,
            QpInner::Virtual(q) => &q.recv_cq,
        }
    }

    /// Moves the queue pair to the error state (verbs: `IBV_QPS_ERR`). Every later
    /// post returns `reason` (mapped to [`Error::PeerGone`], [`Error::PeerMisbehaved`]
    /// or [`Error::NotConnected`]). Idempotent: the first reason wins.
    pub fn fail(&self, reason: &Error) {
        match &self.inner {
            QpInner::Shm(q) => q.fail(reason),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.fail(reason),
            QpInner::Virtual(q) => q.fail(reason),
        }
    }

    /// Fault injection (for tests of the layers above): the device fails
    /// this queue pair behind the connection's back, as a NIC's fatal error
    /// does. Nothing is recorded: outstanding work requests and every later
    /// one complete with [`crate::Status::Flushed`] (nothing is written),
    /// and whoever posts must find out from those completions. Verbs: the
    /// queue pair is moved to `IBV_QPS_ERR` with `ibv_modify_qp`. shm: the
    /// same, completions held back by
    /// [`crate::FaultConfig::completion_delay_polls`] included.
    ///
    /// # Errors
    /// [`Error::Io`] if the device refuses the transition.
    pub fn inject_device_error(&self) -> Result<()> {
        match &self.inner {
            QpInner::Shm(q) => {
                q.inject_device_error();
                Ok(())
            }
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.inject_device_error(),
            QpInner::Virtual(q) => q.inject_device_error(),
        }
    }

    /// The error the queue pair failed with, if it did.
    pub fn failure(&self) -> Option<Error> {
        match &self.inner {
            QpInner::Shm(q) => q.failure(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.failure(),
            QpInner::Virtual(q) => q.failure(),
        }
    }

    /// Whether the queue pair is in the error state.
    pub fn is_failed(&self) -> bool {
        self.failure().is_some()
    }

    /// The send queue's depth: at most this many work requests outstanding
    /// (posted and not retired by a polled signaled completion).
    pub fn send_depth(&self) -> u32 {
        match &self.inner {
            QpInner::Shm(q) => q.send_depth(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.send_depth(),
            QpInner::Virtual(q) => q.send_depth(),
        }
    }

    /// Receives the queue can hold ([`QpConfig::recv_depth`] as the
    /// provider rounded it).
    pub fn recv_depth(&self) -> u32 {
        match &self.inner {
            QpInner::Shm(q) => q.recv_depth(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.recv_depth(),
            QpInner::Virtual(q) => q.recv_depth(),
        }
    }

    /// Bits of immediate data a `WRITE_WITH_IMM` carries: 32, or on a
    /// virtual queue pair what its sharer tag leaves
    /// ([`crate::vqp::VqpConfig::tag_bits`]). A wider immediate is refused.
    pub fn imm_bits(&self) -> u32 {
        match &self.inner {
            QpInner::Virtual(q) => q.imm_bits(),
            _ => 32,
        }
    }

    /// Whether a post's outcome is known when it returns: it completed (or
    /// failed) inside the post, so no later completion can report a failure
    /// of it. True on shm (unless [`FaultConfig::fail_after_posts`]
    /// defers a failure to its completion, as a NIC does); false on verbs
    /// and on a virtual queue pair, where a WRITE that fails (a link down, a
    /// peer that stopped acknowledging) is known only once its completion
    /// is polled, signaled or not.
    ///
    /// [`FaultConfig::fail_after_posts`]: crate::FaultConfig::fail_after_posts
    pub fn completes_in_post(&self) -> bool {
        match &self.inner {
            QpInner::Shm(q) => q.completes_in_post(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(_) => false,
            QpInner::Virtual(_) => false,
        }
    }

    /// What carries this queue pair's traffic, read from the queue pair
    /// itself (not from the URI or the config that asked for it): the
    /// provider, and on verbs the device, the port's GID and the peer's GID
    /// the queue pair was connected to. A sharer of another queue pair
    /// ([`crate::vqp`]) reports the physical queue pair under it.
    pub fn carrier(&self) -> QpCarrier {
        match &self.inner {
            QpInner::Shm(_) => QpCarrier {
                provider: crate::ProviderKind::Shm,
                device: None,
                local_gid: None,
                remote_gid: None,
                shared: false,
            },
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.carrier(),
            QpInner::Virtual(q) => QpCarrier {
                shared: true,
                ..q.physical().carrier()
            },
        }
    }

    /// Whether this is a sharer of another queue pair ([`crate::vqp`]).
    pub fn is_virtual(&self) -> bool {
        matches!(self.inner, QpInner::Virtual(_))
    }

    /// Work requests posted and not yet retired by a polled signaled
    /// completion. On a virtual queue pair: its signaled work requests not
    /// yet returned by its send completion queue.
    pub fn outstanding(&self) -> u64 {
        match &self.inner {
            QpInner::Shm(q) => q.outstanding(),
            #[cfg(feature = "verbs")]
            QpInner::Verbs(q) => q.outstanding(),
            QpInner::Virtual(q) => q.outstanding(),
        }
    }
}

// ---------------------------------------------------------------------------
// Grants added after connect (logical connections over a shared queue pair)
// ---------------------------------------------------------------------------

/// Refuses remote keys granted twice: within `keys`, or already granted
/// (`taken`).
///
/// # Errors
/// [`Error::MalformedHandshake`] naming the first such key.
pub(crate) fn check_new_keys(keys: &[u32], taken: impl Fn(u32) -> bool) -> Result<()> {
    for (i, &k) in keys.iter().enumerate() {
        if taken(k) || keys[..i].contains(&k) {
            return Err(Error::MalformedHandshake(format!(
                "remote key {k:#x} is already granted on this queue pair"
            )));
        }
    }
    Ok(())
}

/// Where a queue pair keeps the regions granted after it connected.
#[derive(Debug)]
pub(crate) enum LaterTable {
    Shm(std::sync::Weak<crate::provider::shm::LaterRegions>),
    #[cfg(feature = "verbs")]
    Verbs(std::sync::Weak<crate::provider::verbs::LaterRegions>),
}

/// Regions a peer granted after its queue pair connected (one logical
/// connection's rings, [`crate::conn::connect_logical`]): posts may target
/// them until this drops, and then no more.
#[derive(Debug)]
pub(crate) struct LaterGrants {
    pub(crate) table: LaterTable,
    pub(crate) keys: Vec<u32>,
    pub(crate) _budget: Option<crate::conn::budget::BudgetGuard>,
}

impl Drop for LaterGrants {
    fn drop(&mut self) {
        match &self.table {
            LaterTable::Shm(t) => {
                if let Some(t) = t.upgrade() {
                    let mut t = t.write().unwrap_or_else(|p| p.into_inner());
                    for k in &self.keys {
                        t.remove(k);
                    }
                }
            }
            #[cfg(feature = "verbs")]
            LaterTable::Verbs(t) => {
                if let Some(t) = t.upgrade() {
                    let mut t = t.write().unwrap_or_else(|p| p.into_inner());
                    for k in &self.keys {
                        t.remove(k);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Failure state shared by every provider's queue pair
// ---------------------------------------------------------------------------

/// Why a queue pair entered the error state.
#[derive(Debug, Clone)]
pub(crate) enum FailReason {
    PeerGone,
    Unresponsive(String),
    Misbehaved(String),
    Closed,
    Completion {
        wr_id: u64,
        status: crate::cq::Status,
    },
}

impl FailReason {
    /// The reason a caller-supplied error stands for.
    pub(crate) fn from_error(e: &Error) -> Self {
        match e {
            Error::PeerGone | Error::Timeout => FailReason::PeerGone,
            Error::PeerUnresponsive(s) => FailReason::Unresponsive(s.clone()),
            Error::PeerMisbehaved(s) => FailReason::Misbehaved(s.clone()),
            Error::NotConnected => FailReason::Closed,
            Error::CompletionError { wr_id, status } => FailReason::Completion {
                wr_id: *wr_id,
                status: *status,
            },
            _ => FailReason::Misbehaved(e.to_string()),
        }
    }

    fn to_error(&self) -> Error {
        match self {
            FailReason::PeerGone => Error::PeerGone,
            FailReason::Unresponsive(s) => Error::PeerUnresponsive(s.clone()),
            FailReason::Misbehaved(s) => Error::PeerMisbehaved(s.clone()),
            FailReason::Closed => Error::NotConnected,
            FailReason::Completion { wr_id, status } => Error::CompletionError {
                wr_id: *wr_id,
                status: *status,
            },
        }
    }
}

/// The error state of a queue pair: the first reason wins; reading it when
/// nothing failed is one `Acquire` load.
#[derive(Debug, Default)]
pub(crate) struct FailState {
    reason: Mutex<Option<FailReason>>,
    flag: AtomicBool,
}

impl FailState {
    /// Records `r` unless a reason is already there; returns whether it was first.
    pub(crate) fn set(&self, r: FailReason) -> bool {
        let mut g = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some() {
            return false;
        }
        *g = Some(r);
        self.flag.store(true, Ordering::Release);
        true
    }

    /// The error every post returns once failed.
    #[inline]
    pub(crate) fn get(&self) -> Option<Error> {
        if !self.flag.load(Ordering::Acquire) {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(FailReason::to_error)
    }
}

/// The operation of one send work request, whatever the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendOp {
    /// `IBV_WR_RDMA_WRITE`.
    Write,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM` with this immediate (host order here,
    /// network order on the wire).
    WriteImm(u32),
    /// `IBV_WR_RDMA_READ`.
    Read,
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
