//! Per-call flow-control arithmetic, without storage policy: the rules
//! HTTP/2 gives a stream window, on plain numbers.
//!
//! The accounting unit is [`frame::data_charge`]: a non-empty DATA frame's
//! wire size (an empty one is free). The server's state machine keeps its
//! calls' [`RecvWindow`]s; a receiving body keeps its [`Unacked`] bytes.
//! A call's send credit is shared by tasks (the sender waits on it), so
//! the async side keeps it in a semaphore
//! ([`crate::fast::flow::CallFlow`]) and applies [`check_grant`] to it; the
//! client's receive window is still an atomic there too.

use crate::frame::{self, FrameError};

/// What the peer may still send on one call before we hand bytes back.
///
/// Invariant: `0 <= left <= window` (`left` never goes negative: DATA
/// beyond it is refused, not counted; reopening never exceeds what was
/// charged, so never the window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvWindow {
    left: u32,
    window: u32,
}

impl RecvWindow {
    /// A fresh window of `window` bytes (what we announced).
    pub(crate) fn new(window: u32) -> Self {
        RecvWindow {
            left: window,
            window,
        }
    }

    /// A DATA frame with `payload_len` bytes arrived.
    ///
    /// # Errors
    /// The peer sent beyond the window (the connection must be closed).
    pub(crate) fn received(&mut self, payload_len: usize) -> Result<(), FrameError> {
        let c = frame::data_charge(payload_len);
        match u32::try_from(c).ok().filter(|&c| c <= self.left) {
            Some(c) => {
                self.left -= c;
                Ok(())
            }
            None => Err(FrameError::Invalid(
                "DATA beyond the call's flow-control window",
            )),
        }
    }

    /// The consumer handed `inc` bytes back (a WINDOW_UPDATE we send).
    /// Saturates at the window: a consumer never hands back more than was
    /// charged, so saturation only guards against a driver bug.
    pub(crate) fn reopen(&mut self, inc: u32) {
        self.left = self.left.saturating_add(inc).min(self.window);
    }

    /// Bytes the peer may still send.
    #[cfg(test)]
    pub(crate) fn left(&self) -> u32 {
        self.left
    }

    /// The announced window.
    #[cfg(test)]
    pub(crate) fn window(&self) -> u32 {
        self.window
    }
}

/// Whether a grant of `inc` bytes on top of `have` bytes of send credit
/// is allowed (HTTP/2's FLOW_CONTROL_ERROR for an overflowing window).
///
/// # Errors
/// The credit would exceed [`frame::MAX_WINDOW`].
pub(crate) fn check_grant(have: u64, inc: u32) -> Result<(), FrameError> {
    if have + u64::from(inc) > u64::from(frame::MAX_WINDOW) {
        return Err(FrameError::Invalid("window update overflows the window"));
    }
    Ok(())
}

/// Whether `unacked` consumed bytes are worth a WINDOW_UPDATE for a
/// `window`-byte receive window: once half the window was consumed.
pub(crate) fn update_due(unacked: usize, window: u32) -> bool {
    unacked > 0 && unacked >= (window as usize).div_ceil(2)
}

/// One call's send credit, as plain numbers: the sender of the tests'
/// back-to-back harness (the driver's senders share a semaphore instead,
/// [`crate::fast::flow::CallFlow`], with the same [`check_grant`] rule).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendWindow {
    credit: u64,
}

#[cfg(test)]
impl SendWindow {
    /// `initial` bytes of credit (the peer's announced window).
    pub(crate) fn new(initial: u64) -> Self {
        SendWindow { credit: initial }
    }

    /// The peer granted `inc` more bytes.
    ///
    /// # Errors
    /// The credit would overflow ([`check_grant`]).
    pub(crate) fn grant(&mut self, inc: u32) -> Result<(), FrameError> {
        check_grant(self.credit, inc)?;
        self.credit += u64::from(inc);
        Ok(())
    }

    /// Takes the credit a DATA frame of `payload_len` bytes needs, if it
    /// is all there.
    pub(crate) fn try_send(&mut self, payload_len: usize) -> bool {
        let c = frame::data_charge(payload_len) as u64;
        if c > self.credit {
            return false;
        }
        self.credit -= c;
        true
    }

    /// Credit left.
    pub(crate) fn credit(&self) -> u64 {
        self.credit
    }
}

/// A consumer's bytes read and not handed back yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unacked {
    bytes: usize,
    window: u32,
}

impl Unacked {
    /// For a receive window of `window` bytes.
    pub(crate) fn new(window: u32) -> Self {
        Unacked { bytes: 0, window }
    }

    /// The consumer read a DATA payload of `payload_len` bytes: the
    /// increment to hand back now, if one is due ([`update_due`]).
    pub(crate) fn consumed(&mut self, payload_len: usize) -> Option<u32> {
        self.bytes += frame::data_charge(payload_len);
        if !update_due(self.bytes, self.window) {
            return None;
        }
        Some(std::mem::take(&mut self.bytes) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;

    #[test]
    fn the_receive_window_is_enforced_and_reopened() {
        let mut w = RecvWindow::new(1024);
        let mut u = Unacked::new(1024);
        w.received(500).unwrap(); // 512 charged
        assert!(w.clone().received(501).is_err(), "512 + 513 > 1024");
        w.received(0).unwrap(); // empty frames are free
        assert_eq!(u.consumed(0), None);
        let inc = u.consumed(500).expect("half the window: due");
        assert_eq!(inc, 512);
        w.reopen(inc);
        w.received(500).unwrap();
        w.received(499).unwrap(); // 512 + 511 = 1023 <= 1024
        assert!(w.received(1).is_err());
        assert_eq!(w.left(), 1, "a refused frame is not counted");
    }

    #[test]
    fn updates_below_half_a_window_are_held_back() {
        let mut u = Unacked::new(4096);
        assert_eq!(u.consumed(100), None);
        assert_eq!(u.consumed(100), None);
        assert_eq!(u.consumed(2000), Some((3 * HEADER_LEN + 2200) as u32));
        assert_eq!(u.consumed(0), None);
    }

    #[test]
    fn grants_are_capped_at_the_largest_window() {
        let mut s = SendWindow::new(u64::from(frame::MAX_WINDOW) - 10);
        s.grant(10).unwrap();
        assert!(s.grant(1).is_err());
        assert!(s.try_send(100));
        assert_eq!(s.credit(), u64::from(frame::MAX_WINDOW) - 112);
    }
}
