//! The first protocol violation one half of the ring saw.

use crate::Error;

/// Why a [`Sender`](super::Sender) or [`Receiver`](super::Receiver)
/// closed, if it did: the first violation it saw. Once set, every call that
/// checks it fails with that same [`Error::Corrupt`].
#[derive(Debug, Default)]
pub(super) struct Closed(Option<String>);

impl Closed {
    /// The message of the violation that closed the half, if any.
    pub(super) fn reason(&self) -> Option<&str> {
        self.0.as_deref()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.0.is_some()
    }

    /// `Err` with the closing violation once closed.
    pub(super) fn check(&self) -> Result<(), Error> {
        match &self.0 {
            Some(m) => Err(Error::Corrupt(m.clone())),
            None => Ok(()),
        }
    }

    /// Closes with `msg` (an earlier violation stays the reason) and
    /// returns the error for this one.
    pub(super) fn close(&mut self, msg: String) -> Error {
        self.0.get_or_insert(msg.clone());
        Error::Corrupt(msg)
    }

    /// The peer's `record` ("head" or "tail") stayed inconsistent (`value`,
    /// `check`) past the driver's bound: it wrote garbage there.
    pub(super) fn record_timed_out(&mut self, record: &str, value: u64, check: u64) -> Error {
        self.close(format!(
            "{record} record {value:#x} with check {check:#x} never became consistent"
        ))
    }
}
