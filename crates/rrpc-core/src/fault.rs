//! Fault injection for tests: delayed or failed completions, torn writes,
//! and polls that miss a completion (the arm-then-poll race), with verbs
//! semantics on the shm provider, so code above the fabric meets what a NIC
//! does in plain `cargo test`, deterministically.
//!
//! Attach a [`FaultConfig`] to a queue pair with [`crate::QpConfig::fault`].
//! The default injects nothing and costs one branch per post.

use crate::work::Status;

/// Which faults a queue pair injects into its own work requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultConfig {
    completion_delay_polls: u32,
    fail_after_posts: Option<u64>,
    torn_write_every: Option<u64>,
    fail_status: Option<Status>,
    poll_miss_every: Option<u64>,
}

impl FaultConfig {
    /// No faults (the default).
    pub fn none() -> Self {
        Self::default()
    }

    /// Every completion becomes visible only after this many extra polls of the
    /// send queue — a completion that arrives late, as on a loaded NIC.
    pub fn get_completion_delay_polls(&self) -> u32 {
        self.completion_delay_polls
    }

    /// Sets [`get_completion_delay_polls`](Self::get_completion_delay_polls).
    pub fn completion_delay_polls(mut self, polls: u32) -> Self {
        self.completion_delay_polls = polls;
        self
    }

    /// After this many successful posts, the next work request completes with
    /// [`Self::fail_status`] and the queue pair fails (a dying device, a peer
    /// that stopped acknowledging); a completion is produced for it even
    /// when it was posted unsignaled, as a NIC reports every error, and the
    /// posts after it are refused with the queue pair's failure.
    pub fn get_fail_after_posts(&self) -> Option<u64> {
        self.fail_after_posts
    }

    /// Sets [`get_fail_after_posts`](Self::get_fail_after_posts).
    pub fn fail_after_posts(mut self, n: u64) -> Self {
        self.fail_after_posts = Some(n);
        self
    }

    /// The status the injected failure completes with (default
    /// [`crate::Status::Fatal`]; [`crate::Status::RetryExceeded`] is what a
    /// NIC reports for a peer that died without closing).
    pub fn get_fail_status(&self) -> Status {
        self.fail_status.unwrap_or(Status::Fatal)
    }

    /// Sets [`get_fail_status`](Self::get_fail_status).
    pub fn fail_status(mut self, status: Status) -> Self {
        self.fail_status = Some(status);
        self
    }

    /// Every `k`-th poll of a completion queue that has completions to
    /// return returns none; they appear at the next poll, as if they had
    /// arrived just after it. This is the arm-then-poll race made
    /// deterministic: a consumer that polls (nothing), arms the channel and
    /// sleeps without polling once more never wakes, because no event fires
    /// for a completion that arrived before the arm. Both queues of the
    /// queue pair (send and receive) miss.
    pub fn get_poll_miss_every(&self) -> Option<u64> {
        self.poll_miss_every
    }

    /// Sets [`get_poll_miss_every`](Self::get_poll_miss_every). `k` must be at least 2 (1 would
    /// never return anything).
    pub fn poll_miss_every(mut self, k: u64) -> Self {
        self.poll_miss_every = Some(k.max(2));
        self
    }

    /// Every `k`-th WRITE copies only its first half (a torn write), although it
    /// completes successfully: receivers must detect the damage themselves.
    pub fn get_torn_write_every(&self) -> Option<u64> {
        self.torn_write_every
    }

    /// Sets [`get_torn_write_every`](Self::get_torn_write_every). `k` must be at least 1.
    pub fn torn_write_every(mut self, k: u64) -> Self {
        self.torn_write_every = Some(k.max(1));
        self
    }

    /// Whether nothing is injected.
    #[inline]
    pub fn is_inert(&self) -> bool {
        self.completion_delay_polls == 0
            && self.fail_after_posts.is_none()
            && self.torn_write_every.is_none()
            && self.poll_miss_every.is_none()
    }
}
