//! Completion queues and completion channels.
//!
//! A [`CompletionQueue`] is polled without blocking (`ibv_poll_cq`). For event
//! mode it can be armed with [`CompletionQueue::req_notify`]
//! (`ibv_req_notify_cq`): the next completion then makes
//! [`CompletionQueue::channel_fd`] readable (the `ibv_comp_channel` fd), which
//! a reactor such as tokio's `AsyncFd` can wait on. After waking, call
//! [`CompletionQueue::ack_events`] (`ibv_get_cq_event` + `ibv_ack_cq_events`),
//! then poll, then arm again and poll once more before sleeping (arm-then-recheck).

use std::os::fd::BorrowedFd;

use crate::error::Result;
use crate::provider::shm;

/// How a work request ended (verbs: `ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Completed successfully (`IBV_WC_SUCCESS`).
    Success,
    /// Local protection or length error (`IBV_WC_LOC_PROT_ERR`, `IBV_WC_LOC_LEN_ERR`).
    LocalError,
    /// The remote side refused the access (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccessError,
    /// The work request was flushed because the queue pair failed (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// The peer never acknowledged, after every transport retry
    /// (`IBV_WC_RETRY_EXC_ERR`): it is gone, unreachable, or the fabric lost
    /// packets faster than retries could recover.
    RetryExceeded,
    /// The peer had no receive posted for a WRITE_WITH_IMM, after every RNR
    /// retry (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
    /// The peer rejected the request as invalid (`IBV_WC_REM_INV_REQ_ERR`:
    /// for example longer than it accepts, or an operation its queue pair
    /// does not allow).
    RemoteInvalidRequest,
    /// The peer could not carry out the request (`IBV_WC_REM_OP_ERR`).
    RemoteOperationError,
    /// Injected failure (tests only) or any other device error
    /// (`IBV_WC_FATAL_ERR`, `IBV_WC_GENERAL_ERR`, ...).
    Fatal,
}

impl std::fmt::Display for Status {
    /// What happened, in words an operator can act on (the verbs name in
    /// parentheses).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Success => "success",
            Status::LocalError => "local protection or length error (IBV_WC_LOC_*_ERR)",
            Status::RemoteAccessError => "the peer refused the access (IBV_WC_REM_ACCESS_ERR)",
            Status::Flushed => "flushed: the queue pair had already failed (IBV_WC_WR_FLUSH_ERR)",
            Status::RetryExceeded => {
                "the peer stopped acknowledging: every transport retry ran out \
                 (IBV_WC_RETRY_EXC_ERR; its host is down or unreachable, or the \
                 link lost packets faster than retries recovered them)"
            }
            Status::RnrRetryExceeded => {
                "the peer posted no receive in time, after every RNR retry \
                 (IBV_WC_RNR_RETRY_EXC_ERR)"
            }
            Status::RemoteInvalidRequest => {
                "the peer rejected the request as invalid (IBV_WC_REM_INV_REQ_ERR)"
            }
            Status::RemoteOperationError => {
                "the peer could not carry out the request (IBV_WC_REM_OP_ERR)"
            }
            Status::Fatal => "device error (IBV_WC_FATAL_ERR or another)",
        })
    }
}

/// What kind of work a completion reports (verbs: `ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Opcode {
    /// An RDMA WRITE we posted (`IBV_WC_RDMA_WRITE`).
    Write,
    /// An RDMA WRITE_WITH_IMM we posted (reported as `IBV_WC_RDMA_WRITE` too).
    WriteImm,
    /// An RDMA READ we posted (`IBV_WC_RDMA_READ`).
    Read,
    /// A peer's WRITE_WITH_IMM consumed one of our receives (`IBV_WC_RECV_RDMA_WITH_IMM`).
    RecvImm,
}

/// One entry of a completion queue (verbs: `ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's identifier of the work request (or of the receive, for `RecvImm`).
    pub wr_id: u64,
    /// Outcome.
    pub status: Status,
    /// Kind.
    pub opcode: Opcode,
    /// Bytes transferred.
    pub byte_len: u32,
    /// The 32-bit immediate of a `RecvImm`.
    pub imm: Option<u32>,
}

impl Completion {
    /// An all-zero placeholder, for pre-sizing poll buffers.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: Status::Success,
        opcode: Opcode::Write,
        byte_len: 0,
        imm: None,
    };
}

impl Default for Completion {
    fn default() -> Self {
        Completion::EMPTY
    }
}

#[derive(Debug)]
pub(crate) enum CqInner {
    ShmSend(shm::SendCq),
    ShmRecv(shm::RecvCq),
    #[cfg(feature = "verbs")]
    Verbs(crate::provider::verbs::VerbsCq),
    Virtual(std::sync::Arc<crate::vqp::Sharer>),
}

/// A completion queue (verbs: `ibv_cq`). Obtained from a [`crate::QueuePair`].
#[derive(Debug)]
pub struct CompletionQueue {
    pub(crate) inner: CqInner,
}

impl CompletionQueue {
    /// Moves up to `out.len()` completions into `out`; returns how many.
    /// Never blocks (`ibv_poll_cq`).
    ///
    /// # Errors
    /// [`crate::Error::PeerMisbehaved`] if the peer corrupted the shared queue
    /// (shm); the queue pair is failed then. Verbs: [`crate::Error::Io`] if
    /// `ibv_poll_cq` fails, [`crate::Error::CompletionError`] for a completion
    /// of a work request that is not outstanding.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        match &self.inner {
            CqInner::ShmSend(cq) => Ok(cq.poll(out)),
            CqInner::ShmRecv(cq) => cq.poll(out),
            #[cfg(feature = "verbs")]
            CqInner::Verbs(cq) => cq.poll(out),
            CqInner::Virtual(cq) => cq.poll(out),
        }
    }

    /// Arms the queue: the next completion added makes [`Self::channel_fd`]
    /// readable (`ibv_req_notify_cq(cq, 0)`). Completions already queued do not;
    /// poll again after arming.
    ///
    /// # Errors
    /// None on shm today; verbs returns the device's error.
    pub fn req_notify(&self) -> Result<()> {
        match &self.inner {
            CqInner::ShmSend(cq) => cq.req_notify(),
            CqInner::ShmRecv(cq) => cq.req_notify(),
            #[cfg(feature = "verbs")]
            CqInner::Verbs(cq) => return cq.req_notify(),
            CqInner::Virtual(cq) => return cq.req_notify(),
        }
        Ok(())
    }

    /// The completion channel's file descriptor (`ibv_comp_channel::fd`):
    /// readable after an armed queue received a completion. It lives as
    /// long as the queue: register it with tokio's `AsyncFd` or `poll(2)`.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when a shared queue pair's sharer
    /// cannot make its channel (an eventfd and an epoll set, made on first
    /// use: out of descriptors).
    pub fn channel_fd(&self) -> crate::Result<BorrowedFd<'_>> {
        Ok(match &self.inner {
            CqInner::ShmSend(cq) => cq.channel_fd(),
            CqInner::ShmRecv(cq) => cq.channel_fd(),
            #[cfg(feature = "verbs")]
            CqInner::Verbs(cq) => cq.channel_fd(),
            CqInner::Virtual(cq) => return cq.channel_fd(),
        })
    }

    /// Consumes pending channel events (`ibv_get_cq_event` + `ibv_ack_cq_events`);
    /// returns how many there were. Non-blocking.
    ///
    /// # Errors
    /// Only if reading the channel fd fails.
    pub fn ack_events(&self) -> Result<u64> {
        match &self.inner {
            CqInner::ShmSend(cq) => cq.ack_events(),
            CqInner::ShmRecv(cq) => cq.ack_events(),
            #[cfg(feature = "verbs")]
            CqInner::Verbs(cq) => cq.ack_events(),
            CqInner::Virtual(cq) => cq.ack_events(),
        }
    }
}
