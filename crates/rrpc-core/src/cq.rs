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
use crate::provider;
pub use crate::work::{Completion, Opcode, Status};

/// A completion queue (verbs: `ibv_cq`). Obtained from a [`crate::QueuePair`].
#[derive(Debug)]
pub struct CompletionQueue {
    /// The provider's completion queue (the seam, `provider::Cq`).
    pub(crate) inner: provider::Cq,
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
        self.inner.poll(out)
    }

    /// Arms the queue: the next completion added makes [`Self::channel_fd`]
    /// readable (`ibv_req_notify_cq(cq, 0)`). Completions already queued do not;
    /// poll again after arming.
    ///
    /// # Errors
    /// None on shm today; verbs returns the device's error.
    pub fn req_notify(&self) -> Result<()> {
        self.inner.req_notify()
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
        self.inner.channel_fd()
    }

    /// Consumes pending channel events (`ibv_get_cq_event` + `ibv_ack_cq_events`);
    /// returns how many there were. Non-blocking.
    ///
    /// # Errors
    /// Only if reading the channel fd fails.
    pub fn ack_events(&self) -> Result<u64> {
        self.inner.ack_events()
    }
}
