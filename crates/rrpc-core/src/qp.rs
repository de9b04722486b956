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

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::provider::{self, QpParts};
use crate::region::{Local, Remote};
pub use crate::settings::{
    DEFAULT_INLINE, MAX_INLINE_REQUEST, QpCarrier, QpConfig, QpConfigBuilder, RcRetry,
    RcRetryBuilder,
};
use crate::work::SendOp;

/// A reliable-connection queue pair (verbs: `ibv_qp` of type `IBV_QPT_RC`).
///
/// Posts take `&self` and are internally synchronised (as libibverbs is), so a
/// queue pair can be shared through an `Arc` between the task that writes a
/// ring and the task that pushes the head of the opposite ring.
#[derive(Debug)]
pub struct QueuePair {
    // Field order is drop order: the queue pair goes before the completion
    // queues it completes into.
    /// The provider's queue pair (the seam, `provider::Qp`).
    pub(crate) inner: provider::Qp,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
}

impl QueuePair {
    /// Wraps what a provider made.
    pub(crate) fn from_parts(parts: QpParts) -> QueuePair {
        QueuePair {
            inner: parts.qp,
            send_cq: CompletionQueue {
                inner: parts.send_cq,
            },
            recv_cq: CompletionQueue {
                inner: parts.recv_cq,
            },
        }
    }

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
        self.inner.post(wr_id, op, local, remote, signaled)
    }

    /// Posts a receive for one incoming WRITE_WITH_IMM (`ibv_post_recv` with no
    /// scatter entries).
    ///
    /// # Errors
    /// [`Error::QueueFull`] when `recv_depth` receives are already posted.
    pub fn post_recv(&self, wr_id: u64) -> Result<()> {
        self.inner.post_recv(wr_id)
    }

    /// Completions of our WRITE / READ work requests.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.send_cq
    }

    /// Completions of incoming WRITE_WITH_IMM.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.recv_cq
    }

    /// Moves the queue pair to the error state (verbs: `IBV_QPS_ERR`). Every later
    /// post returns `reason` (mapped to [`Error::PeerGone`], [`Error::PeerMisbehaved`],
    /// [`Error::NotConnected`] or [`Error::Rejected`]). Idempotent: the first reason wins.
    pub fn fail(&self, reason: &Error) {
        self.inner.fail(reason)
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
        self.inner.inject_device_error()
    }

    /// The error the queue pair failed with, if it did.
    pub fn failure(&self) -> Option<Error> {
        self.inner.failure()
    }

    /// Whether the queue pair is in the error state.
    pub fn is_failed(&self) -> bool {
        self.failure().is_some()
    }

    /// The send queue's depth: at most this many work requests outstanding
    /// (posted and not retired by a polled signaled completion).
    pub fn send_depth(&self) -> u32 {
        self.inner.send_depth()
    }

    /// Receives the queue can hold ([`QpConfig::recv_depth`] as the
    /// provider rounded it).
    pub fn recv_depth(&self) -> u32 {
        self.inner.recv_depth()
    }

    /// Bits of immediate data a `WRITE_WITH_IMM` carries: 32, or on a
    /// virtual queue pair what its sharer tag leaves
    /// ([`crate::vqp::VqpConfig::tag_bits`]). A wider immediate is refused.
    pub fn imm_bits(&self) -> u32 {
        self.inner.imm_bits()
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
        self.inner.completes_in_post()
    }

    /// What carries this queue pair's traffic, read from the queue pair
    /// itself (not from the URI or the config that asked for it): the
    /// provider, and on verbs the device, the port's GID and the peer's GID
    /// the queue pair was connected to. A sharer of another queue pair
    /// ([`crate::vqp`]) reports the physical queue pair under it.
    pub fn carrier(&self) -> QpCarrier {
        self.inner.carrier()
    }

    /// Whether this is a sharer of another queue pair ([`crate::vqp`]).
    pub fn is_virtual(&self) -> bool {
        self.inner.is_virtual()
    }

    /// Work requests posted and not yet retired by a polled signaled
    /// completion. On a virtual queue pair: its signaled work requests not
    /// yet returned by its send completion queue.
    pub fn outstanding(&self) -> u64 {
        self.inner.outstanding()
    }
}
