//! The error state of a queue pair, shared by every provider: why it
//! failed ([`FailReason`]) and the first-reason-wins record ([`FailState`]).
//!
//! A leaf: it imports only the error type and the completion statuses.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Violation};
use crate::work::Status;

/// Why a queue pair entered the error state.
#[derive(Debug, Clone)]
pub(crate) enum FailReason {
    PeerGone,
    Unresponsive(String),
    Misbehaved(Violation),
    Closed,
    Completion {
        wr_id: u64,
        status: Status,
    },
    /// The peer refused the connection after it was in use (a lane opened
    /// ahead, `conn::mux`): its reason.
    Rejected(String),
}

impl FailReason {
    /// The reason a caller-supplied error stands for.
    pub(crate) fn from_error(e: &Error) -> Self {
        match e {
            Error::PeerGone | Error::Timeout => FailReason::PeerGone,
            Error::PeerUnresponsive(s) => FailReason::Unresponsive(s.clone()),
            Error::PeerMisbehaved(s) => FailReason::Misbehaved(s.clone()),
            Error::NotConnected => FailReason::Closed,
            Error::Rejected(s) => FailReason::Rejected(s.clone()),
            Error::CompletionError { wr_id, status } => FailReason::Completion {
                wr_id: *wr_id,
                status: *status,
            },
            _ => FailReason::Misbehaved(Violation::Reported(e.to_string())),
        }
    }

    fn to_error(&self) -> Error {
        match self {
            FailReason::PeerGone => Error::PeerGone,
            FailReason::Unresponsive(s) => Error::PeerUnresponsive(s.clone()),
            FailReason::Misbehaved(s) => Error::PeerMisbehaved(s.clone()),
            FailReason::Closed => Error::NotConnected,
            FailReason::Rejected(s) => Error::Rejected(s.clone()),
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
