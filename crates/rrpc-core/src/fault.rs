//! Fault injection for tests: delayed or failed completions, torn writes,
//! and polls that miss a completion (the arm-then-poll race), with verbs
//! semantics on the shm provider, so code above the fabric meets what a NIC
//! does in plain `cargo test`, deterministically.
//!
//! Build a [`FaultConfig`] with [`FaultConfig::builder`] (docs/architecture.md,
//! "Configuration convention") and attach it to a queue pair with
//! [`crate::QpConfigBuilder::fault`].
//! The default injects nothing and costs one branch per post.

use crate::work::Status;

/// Which faults a queue pair injects into its own work requests.
///
/// Built like every rrpc config: [`FaultConfig::builder`], setters on
/// [`FaultConfigBuilder`], [`build`](FaultConfigBuilder::build).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultConfig {
    completion_delay_polls: u32,
    fail_after_posts: Option<u64>,
    torn_write_every: Option<u64>,
    corrupt_write: Option<u64>,
    fail_status: Option<Status>,
    poll_miss_every: Option<u64>,
}

impl FaultConfig {
    /// No faults (the default).
    pub fn none() -> Self {
        Self::default()
    }

    /// A builder starting from no faults.
    pub fn builder() -> FaultConfigBuilder {
        FaultConfigBuilder {
            cfg: Self::default(),
        }
    }

    /// A builder starting from these faults.
    pub fn to_builder(&self) -> FaultConfigBuilder {
        FaultConfigBuilder { cfg: self.clone() }
    }

    /// Every completion becomes visible only after this many extra polls of the
    /// send queue — a completion that arrives late, as on a loaded NIC.
    pub fn completion_delay_polls(&self) -> u32 {
        self.completion_delay_polls
    }

    /// After this many successful posts, the next work request completes with
    /// [`Self::fail_status`] and the queue pair fails (a dying device, a peer
    /// that stopped acknowledging); a completion is produced for it even
    /// when it was posted unsignaled, as a NIC reports every error, and the
    /// posts after it are refused with the queue pair's failure.
    pub fn fail_after_posts(&self) -> Option<u64> {
        self.fail_after_posts
    }

    /// The status the injected failure completes with (default
    /// [`crate::Status::Fatal`]; [`crate::Status::RetryExceeded`] is what a
    /// NIC reports for a peer that died without closing).
    pub fn fail_status(&self) -> Status {
        self.fail_status.unwrap_or(Status::Fatal)
    }

    /// Every `k`-th poll of a completion queue that has completions to
    /// return returns none; they appear at the next poll, as if they had
    /// arrived just after it. This is the arm-then-poll race made
    /// deterministic: a consumer that polls (nothing), arms the channel and
    /// sleeps without polling once more never wakes, because no event fires
    /// for a completion that arrived before the arm. Both queues of the
    /// queue pair (send and receive) miss.
    pub fn poll_miss_every(&self) -> Option<u64> {
        self.poll_miss_every
    }

    /// Every `k`-th WRITE copies only its first half (a torn write), although it
    /// completes successfully: receivers must detect the damage themselves.
    pub fn torn_write_every(&self) -> Option<u64> {
        self.torn_write_every
    }

    /// The `n`-th WRITE (or WRITE_WITH_IMM) of at least
    /// [`CORRUPT_MIN_LEN`] bytes posted on the queue pair (counting from 1)
    /// lands with the byte in its middle flipped (every bit inverted),
    /// although it completes successfully: a wire or a peer that alters a
    /// message in flight. Once per queue pair; smaller writes (a ring's
    /// pointers, its control words) are neither counted nor touched, so
    /// the damage falls in a message. Receivers must detect it themselves
    /// (rrpc-tonic's ring encryption does; plaintext rings do not).
    pub fn corrupt_write(&self) -> Option<u64> {
        self.corrupt_write
    }

    /// Whether nothing is injected.
    #[inline]
    pub fn is_inert(&self) -> bool {
        self.completion_delay_polls == 0
            && self.fail_after_posts.is_none()
            && self.torn_write_every.is_none()
            && self.corrupt_write.is_none()
            && self.poll_miss_every.is_none()
    }
}

/// The smallest WRITE [`FaultConfig::corrupt_write`] counts and corrupts.
pub const CORRUPT_MIN_LEN: usize = 64;

/// Builder for [`FaultConfig`].
#[derive(Debug, Clone)]
pub struct FaultConfigBuilder {
    cfg: FaultConfig,
}

impl FaultConfigBuilder {
    /// [`FaultConfig::completion_delay_polls`].
    pub fn completion_delay_polls(mut self, polls: u32) -> Self {
        self.cfg.completion_delay_polls = polls;
        self
    }

    /// [`FaultConfig::fail_after_posts`].
    pub fn fail_after_posts(mut self, n: u64) -> Self {
        self.cfg.fail_after_posts = Some(n);
        self
    }

    /// [`FaultConfig::fail_status`].
    pub fn fail_status(mut self, status: Status) -> Self {
        self.cfg.fail_status = Some(status);
        self
    }

    /// [`FaultConfig::poll_miss_every`]. `k` is raised to at least 2 (1
    /// would never return anything).
    pub fn poll_miss_every(mut self, k: u64) -> Self {
        self.cfg.poll_miss_every = Some(k.max(2));
        self
    }

    /// [`FaultConfig::torn_write_every`]. `k` is raised to at least 1.
    pub fn torn_write_every(mut self, k: u64) -> Self {
        self.cfg.torn_write_every = Some(k.max(1));
        self
    }

    /// [`FaultConfig::corrupt_write`]. `n` is raised to at least 1.
    pub fn corrupt_write(mut self, n: u64) -> Self {
        self.cfg.corrupt_write = Some(n.max(1));
        self
    }

    /// The faults. Nothing is checked (out-of-range periods are raised by
    /// their setters).
    ///
    /// # Errors
    /// None today; a `Result` like every config's `build`, so that a check
    /// added later is not a breaking change.
    pub fn build(self) -> crate::error::Result<FaultConfig> {
        Ok(self.cfg)
    }
}
