//! Fault injection for tests: delayed or failed completions and torn writes.
//!
//! Attach a [`FaultConfig`] to a queue pair with [`crate::QpConfig::fault`].
//! The default injects nothing and costs one branch per post.

/// Which faults a queue pair injects into its own work requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultConfig {
    completion_delay_polls: u32,
    fail_after_posts: Option<u64>,
    torn_write_every: Option<u64>,
}

impl FaultConfig {
    /// No faults (the default).
    pub fn none() -> Self {
        Self::default()
    }

    /// Every completion becomes visible only after this many extra polls of the
    /// send queue — a completion that arrives late, as on a loaded NIC.
    pub fn completion_delay_polls(&self) -> u32 {
        self.completion_delay_polls
    }

    /// Sets [`Self::completion_delay_polls`].
    pub fn with_completion_delay_polls(mut self, polls: u32) -> Self {
        self.completion_delay_polls = polls;
        self
    }

    /// After this many successful posts, every further work request completes
    /// with [`crate::Status::Fatal`] and the queue pair fails (a dying device).
    pub fn fail_after_posts(&self) -> Option<u64> {
        self.fail_after_posts
    }

    /// Sets [`Self::fail_after_posts`].
    pub fn with_fail_after_posts(mut self, n: u64) -> Self {
        self.fail_after_posts = Some(n);
        self
    }

    /// Every `k`-th WRITE copies only its first half (a torn write), although it
    /// completes successfully: receivers must detect the damage themselves.
    pub fn torn_write_every(&self) -> Option<u64> {
        self.torn_write_every
    }

    /// Sets [`Self::torn_write_every`]. `k` must be at least 1.
    pub fn with_torn_write_every(mut self, k: u64) -> Self {
        self.torn_write_every = Some(k.max(1));
        self
    }

    /// Whether nothing is injected.
    #[inline]
    pub fn is_inert(&self) -> bool {
        self.completion_delay_polls == 0
            && self.fail_after_posts.is_none()
            && self.torn_write_every.is_none()
    }
}
