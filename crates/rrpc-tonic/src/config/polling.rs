//! The polling group of [`RrpcConfig`](super::RrpcConfig): how a
//! connection waits for its rings (rrpc-poller).

use std::time::Duration;

use rrpc_poller::PollerConfig;

use crate::Error;

/// The polling group ([`RrpcConfig`](super::RrpcConfig) docs, "Settings").
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct PollingSettings {
    /// `None`: the process-wide poller of
    /// [`default_poller_config`](super::default_poller_config).
    pub(super) poller: Option<PollerConfig>,
    pub(super) receive_spin: Duration,
}

impl PollingSettings {
    /// Checks every setting of the group: nothing to check, the poller
    /// config was validated by its own builder and any spin is a valid
    /// one (a long one only costs CPU).
    ///
    /// # Errors
    /// None today.
    pub(super) fn validate(&self) -> Result<(), Error> {
        Ok(())
    }
}
