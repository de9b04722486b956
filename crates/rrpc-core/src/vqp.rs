//! Shared queue pairs: many logical connections over one hardware queue pair
//! (KRCore's virtualized QP, §4.4 and Algorithm 2).
//!
//! A [`PhysicalQp`] wraps one connected [`QueuePair`]. Each
//! [`PhysicalQp::attach`] returns a *virtual* [`QueuePair`] that the layers
//! above use exactly like a dedicated one: the same posts, the same send and
//! receive [`CompletionQueue`](crate::CompletionQueue)s, the same errors. So
//! queue pairs are bounded by peers, not by connections.
//!
//! ## What keeps sharers apart
//! * **Malformed requests never reach the hardware queue.** Every post is
//!   checked (local slice, remote key and bounds) before anything is written,
//!   as on a dedicated queue pair; a refused post returns its error to the
//!   sharer that made it and leaves the queue pair, and everyone else on it,
//!   untouched.
//! * **No sharer can overflow the queue.** Each post is pre-checked against
//!   the hardware queue's remaining capacity. A work request occupies its slot
//!   until a *signaled* completion at or after it is polled, so the layer
//!   counts the unsignaled ones too: it signals, on its own account, one work
//!   request in every [`VqpConfig::signal_every`] (and the one that takes the
//!   last free slot), so the queue always holds a completion that will retire
//!   what lies before it. When the queue is full, a post polls the hardware
//!   completion queue and dispatches what it finds before it goes on
//!   (Algorithm 2, lines 6–7), for at most [`VqpConfig::full_wait`]; then it
//!   returns [`Error::QueueFull`].
//! * **Completions go to the sharer that asked.** The hardware `wr_id` encodes
//!   the sharer's tag and generation, and whether the sharer asked for the
//!   signal; the sharer's own `wr_id`s wait in its software queue in post
//!   order (RC completes in order) and are handed back by its send completion
//!   queue. Completions of the layer's own signals, and of sharers that have
//!   detached (an older generation), are retired and dropped.
//! * **Receives.** The layer keeps [`VqpConfig::recv_depth`] receives posted
//!   on the hardware queue pair. A `WRITE_WITH_IMM` carries the *receiving*
//!   sharer's tag in the top [`VqpConfig::tag_bits`] of its immediate; the
//!   sharer's own immediate is the rest (a wider one is refused with
//!   [`Error::InvalidConfig`]). The completion is routed to that sharer and
//!   consumes one of the receives it posted on its virtual queue pair. A
//!   write that comes before the sharer posted a receive waits for its next
//!   one, as a NIC's RNR retry holds it on a dedicated queue pair (a
//!   connection's first message can outrun its receiver's setup); a peer
//!   that writes more than the sharer's receive depth ahead fails that
//!   sharer only ([`Error::PeerMisbehaved`]). An immediate naming no sharer
//!   is counted and dropped ([`VqpStats::misrouted`]).
//!
//! What sharers cannot escape: a dead peer, or a device error, fails the
//! hardware queue pair, and with it every sharer on it (all connect to the
//! same peer). [`QueuePair::fail`] on a virtual queue pair fails that sharer
//! only.
//!
//! ## Completion events
//! A virtual completion queue's [`channel_fd`](crate::CompletionQueue::channel_fd)
//! is an epoll descriptor watching the hardware queue's channel and the
//! sharer's own eventfd. Whoever polls the hardware queue dispatches, and
//! wakes an armed sharer it dispatched to through that eventfd, so a sharer
//! never misses a completion another sharer polled for it. `ack_events`
//! acknowledges the hardware channel's events and dispatches what came.
//! These two descriptors are made on a sharer's first `req_notify` or
//! `channel_fd`, so a polled sharer holds no descriptor at all; if they
//! cannot be made, `req_notify` returns the error and `channel_fd` logs
//! it and returns -1.
//!
//! ## Tags
//! Both ends attach their halves of one logical connection under tags they
//! agree on out of band (in the connection's own handshake): `attach(local,
//! peer)` names the tag this side receives under and the tag the peer
//! receives under. A tag is unique per [`PhysicalQp`] while attached.
//!
//! ## DCT
//! KRCore virtualizes *dynamically connected* transport (DCT) queue pairs,
//! which reach any peer without a handshake. DCT exists only on mlx5 NICs
//! (`mlx5dv_create_qp`), so rrpc shares RC queue pairs, one per peer. The
//! design leaves room for DCT: a `PhysicalQp` over a DC initiator would take
//! the peer's DCT number and key per post (from a metadata cache, as KRCore's
//! `DCCache`), and the sharing rules above are unchanged. It is not built.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::provider::{self, Hardware, SharedHardware};
use crate::qp::QueuePair;
use crate::region::{Local, Remote};
use crate::settings::QpCarrier;
use crate::work::{Completion, SendOp};

/// Configuration of a [`PhysicalQp`]. Defaults in the getters' docs.
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`VqpConfig::builder`], setters on [`VqpConfigBuilder`],
/// [`build`](VqpConfigBuilder::build) validates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VqpConfig {
    tag_bits: u32,
    signal_every: Option<u32>,
    recv_depth: Option<u32>,
    full_wait: Duration,
}

impl Default for VqpConfig {
    fn default() -> Self {
        VqpConfig {
            tag_bits: 12,
            signal_every: None,
            recv_depth: None,
            full_wait: Duration::from_secs(1),
        }
    }
}

impl VqpConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> VqpConfigBuilder {
        VqpConfigBuilder {
            cfg: Self::default(),
        }
    }

    /// A builder starting from this config.
    pub fn to_builder(&self) -> VqpConfigBuilder {
        VqpConfigBuilder { cfg: self.clone() }
    }

    /// High bits of a `WRITE_WITH_IMM`'s immediate that name the receiving
    /// sharer. Default 12: up to 4096 sharers per hardware queue pair, and
    /// 20 bits of immediate data for each.
    pub fn tag_bits(&self) -> u32 {
        self.tag_bits
    }

    /// The layer signals at least one work request in this many. `None`
    /// (default): a quarter of the hardware send depth.
    pub fn signal_every(&self) -> Option<u32> {
        self.signal_every
    }

    /// Receives the layer keeps posted on the hardware queue pair. `None`
    /// (default): the queue pair's receive depth.
    pub fn recv_depth(&self) -> Option<u32> {
        self.recv_depth
    }

    /// How long a post waits for room on a full hardware queue, polling
    /// it, before it returns [`Error::QueueFull`]. Default 1 s.
    pub fn full_wait(&self) -> Duration {
        self.full_wait
    }
}

/// Builder for [`VqpConfig`]; [`build`](Self::build) checks the ranges.
#[derive(Debug, Clone)]
pub struct VqpConfigBuilder {
    cfg: VqpConfig,
}

impl VqpConfigBuilder {
    /// [`VqpConfig::tag_bits`], `1..=16`.
    pub fn tag_bits(mut self, bits: u32) -> Self {
        self.cfg.tag_bits = bits;
        self
    }

    /// [`VqpConfig::signal_every`], at least 1 (clamped to the send depth at
    /// [`PhysicalQp::new`]).
    pub fn signal_every(mut self, n: u32) -> Self {
        self.cfg.signal_every = Some(n);
        self
    }

    /// [`VqpConfig::recv_depth`] (at most the queue pair's receive depth).
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.cfg.recv_depth = Some(n);
        self
    }

    /// [`VqpConfig::full_wait`].
    pub fn full_wait(mut self, d: Duration) -> Self {
        self.cfg.full_wait = d;
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: unless
    /// `tag_bits` is in `1..=16` and `signal_every` is at least 1.
    pub fn build(self) -> Result<VqpConfig> {
        let c = self.cfg;
        if !(1..=16).contains(&c.tag_bits) {
            return Err(Error::InvalidConfig(format!(
                "tag_bits must be in 1..=16, got {}",
                c.tag_bits
            )));
        }
        if c.signal_every == Some(0) {
            return Err(Error::InvalidConfig(
                "signal_every must be at least 1, got 0".into(),
            ));
        }
        Ok(c)
    }
}

/// Counters of one [`PhysicalQp`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VqpStats {
    /// Work requests posted on the hardware queue pair.
    pub posted: u64,
    /// Of those, signaled by the layer where the sharer did not ask.
    pub hidden_signals: u64,
    /// Send completions dispatched to a sharer.
    pub dispatched: u64,
    /// Completions for a sharer that had detached, dropped.
    pub stale: u64,
    /// Writes with immediate routed to a sharer (completing a receive, or
    /// held for its next one).
    pub received: u64,
    /// Receive completions whose immediate named no attached sharer.
    pub misrouted: u64,
    /// Times a post found the hardware queue full and polled for room.
    pub full_waits: u64,
}

/// One hardware queue pair carrying many logical connections (module docs).
/// Cheap to clone; the hardware queue pair lives while a clone or a virtual
/// queue pair does.
#[derive(Debug, Clone)]
pub struct PhysicalQp {
    hardware: Arc<QueuePair>,
    shared: Arc<SharedHardware>,
}

impl PhysicalQp {
    /// Shares `qp`, a connected queue pair that nothing else posts on or
    /// polls from now on, and posts the layer's receives on it.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a receive depth above the queue pair's;
    /// the error of a failed queue pair.
    pub fn new(qp: Arc<QueuePair>, cfg: VqpConfig) -> Result<PhysicalQp> {
        if qp.is_virtual() {
            return Err(Error::InvalidConfig(
                "a shared queue pair cannot itself be shared".into(),
            ));
        }
        let depth = qp.send_depth();
        let signal_every = cfg.signal_every.unwrap_or((depth / 4).max(1)).min(depth);
        let recv_depth = cfg.recv_depth.unwrap_or(qp.recv_depth());
        if recv_depth > qp.recv_depth() {
            return Err(Error::InvalidConfig(format!(
                "shared receive depth {recv_depth} above the queue pair's {}",
                qp.recv_depth()
            )));
        }
        for _ in 0..recv_depth {
            qp.post_recv(0)?;
        }
        tracing::debug!(depth, signal_every, recv_depth, "shared queue pair ready");
        let shared =
            SharedHardware::new(qp.clone(), depth, signal_every, cfg.tag_bits, cfg.full_wait);
        Ok(PhysicalQp {
            hardware: qp,
            shared: Arc::new(shared),
        })
    }

    /// A virtual queue pair over this one: it receives under `local_tag`,
    /// and its `WRITE_WITH_IMM`s go to the peer's sharer `peer_tag`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a tag that does not fit
    /// [`VqpConfig::tag_bits`] or is already attached.
    pub fn attach(&self, local_tag: u32, peer_tag: u32) -> Result<QueuePair> {
        let parts = provider::attach_virtual(&self.shared, local_tag, peer_tag)?;
        Ok(QueuePair::from_parts(parts))
    }

    /// Whether a sharer is attached under `tag` now.
    pub fn is_attached(&self, tag: u32) -> bool {
        self.shared.is_attached(tag)
    }

    /// The number of sharer tags ([`VqpConfig::tag_bits`]): tags run from 0
    /// to this, exclusive.
    pub fn tags(&self) -> u32 {
        1 << self.shared.tag_bits()
    }

    /// Sharers attached now.
    pub fn sharers(&self) -> usize {
        self.shared.sharers()
    }

    /// The hardware queue pair.
    pub fn hardware(&self) -> &Arc<QueuePair> {
        &self.hardware
    }

    /// The counters so far.
    pub fn stats(&self) -> VqpStats {
        let s = &self.shared.stats;
        VqpStats {
            posted: s.posted.load(Ordering::Relaxed),
            hidden_signals: s.hidden_signals.load(Ordering::Relaxed),
            dispatched: s.dispatched.load(Ordering::Relaxed),
            stale: s.stale.load(Ordering::Relaxed),
            received: s.received.load(Ordering::Relaxed),
            misrouted: s.misrouted.load(Ordering::Relaxed),
            full_waits: s.full_waits.load(Ordering::Relaxed),
        }
    }

    /// Polls the hardware queues and dispatches what they hold (posts and
    /// polls on virtual queue pairs do this themselves).
    ///
    /// # Errors
    /// The hardware completion queue's error.
    pub fn progress(&self) -> Result<()> {
        self.shared.progress()
    }
}

/// The hardware queue pair as the virtual provider reaches it
/// (`provider::virt`): the public queue pair's operations.
impl Hardware for QueuePair {
    fn post(
        &self,
        wr_id: u64,
        op: SendOp,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        match op {
            SendOp::Write => self.post_write(wr_id, local, remote, signaled),
            SendOp::WriteImm(imm) => self.post_write_imm(wr_id, local, remote, imm, signaled),
            SendOp::Read => self.post_read(wr_id, local, remote, signaled),
        }
    }
    fn post_recv(&self, wr_id: u64) -> Result<()> {
        QueuePair::post_recv(self, wr_id)
    }
    fn poll(&self, recv: bool, out: &mut [Completion]) -> Result<usize> {
        self.cq(recv).poll(out)
    }
    fn req_notify(&self, recv: bool) -> Result<()> {
        self.cq(recv).req_notify()
    }
    fn channel_fd(&self, recv: bool) -> Result<BorrowedFd<'_>> {
        self.cq(recv).channel_fd()
    }
    fn ack_events(&self, recv: bool) -> Result<u64> {
        self.cq(recv).ack_events()
    }
    fn inject_device_error(&self) -> Result<()> {
        QueuePair::inject_device_error(self)
    }
    fn failure(&self) -> Option<Error> {
        QueuePair::failure(self)
    }
    fn send_depth(&self) -> u32 {
        QueuePair::send_depth(self)
    }
    fn recv_depth(&self) -> u32 {
        QueuePair::recv_depth(self)
    }
    fn outstanding(&self) -> u64 {
        QueuePair::outstanding(self)
    }
    fn carrier(&self) -> QpCarrier {
        QueuePair::carrier(self)
    }
}

impl QueuePair {
    /// The receive (`recv`) or the send completion queue.
    fn cq(&self, recv: bool) -> &crate::CompletionQueue {
        if recv { self.recv_cq() } else { self.send_cq() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_bounds() {
        let b = VqpConfig::builder;
        let err = |b: VqpConfigBuilder| b.build().unwrap_err().to_string();
        assert!(err(b().tag_bits(0)).contains("tag_bits must be in 1..=16, got 0"));
        assert!(err(b().tag_bits(17)).contains("tag_bits must be in 1..=16, got 17"));
        assert!(err(b().signal_every(0)).contains("signal_every must be at least 1"));
        assert_eq!(
            b().tag_bits(16).signal_every(1).build().unwrap().tag_bits(),
            16
        );
        assert_eq!(VqpConfig::default().tag_bits(), 12);
        assert_eq!(b().build().unwrap(), VqpConfig::default());
    }
}
