//! The fast-path group of [`RrpcConfig`](super::RrpcConfig): which data
//! path a connection asks for, and the fast path's framing, flow control
//! and admission of calls.

use crate::Error;
use crate::frame::{MAX_WINDOW, MIN_CALL_WINDOW};

/// Which data path a connection uses (negotiated in the handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathPreference {
    /// The h2-free fast path when both ends allow it, else HTTP/2 (default).
    #[default]
    Fast,
    /// Always HTTP/2 over the rings (full tonic feature set, see the crate docs).
    Http2,
}

/// The fast-path group ([`RrpcConfig`](super::RrpcConfig) docs, "Settings").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FastPathSettings {
    pub(super) path: PathPreference,
    pub(super) zero_copy: bool,
    pub(super) max_chunk: usize,
    pub(super) call_window: u32,
    pub(super) max_header_list_size: usize,
    pub(super) max_concurrent_calls: usize,
}

impl Default for FastPathSettings {
    fn default() -> Self {
        FastPathSettings {
            path: PathPreference::Fast,
            zero_copy: true,
            max_chunk: 256 << 10,
            call_window: 256 << 10,
            max_header_list_size: 16 << 10,
            max_concurrent_calls: 200,
        }
    }
}

impl FastPathSettings {
    /// Checks every setting of the group.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first setting refused and its rule.
    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |rule: &'static str| Err(Error::InvalidConfig(rule));
        if self.max_chunk == 0 {
            return bad("max_chunk must be > 0");
        }
        // Both ends announce it in the path negotiation, whose reader
        // refuses a window outside this range (`frame::MIN_CALL_WINDOW`).
        if !(MIN_CALL_WINDOW..=MAX_WINDOW).contains(&self.call_window) {
            return bad("call_window must be between 1 KiB and 2^31 - 1 bytes");
        }
        if self.max_header_list_size == 0 {
            return bad("max_header_list_size must be > 0");
        }
        if self.max_concurrent_calls == 0 {
            return bad("max_concurrent_calls must be > 0");
        }
        Ok(())
    }
}
