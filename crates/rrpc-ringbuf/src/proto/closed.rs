//! The first protocol violation one half of the ring saw.

use crate::Error;
use crate::error::Corruption;

/// Why a [`Sender`](super::Sender) or [`Receiver`](super::Receiver)
/// closed, if it did: the first violation it saw. Once set, every call that
/// checks it fails with that same [`Error::Corrupt`].
#[derive(Debug, Default)]
pub(super) struct Closed(Option<Corruption>);

impl Closed {
    /// The violation that closed the half, if any.
    pub(super) fn reason(&self) -> Option<&Corruption> {
        self.0.as_ref()
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

    /// Closes with `why` (an earlier violation stays the reason) and
    /// returns the error for this one.
    pub(super) fn close(&mut self, why: Corruption) -> Error {
        self.0.get_or_insert(why.clone());
        Error::Corrupt(why)
    }

    /// The peer's `record` ("head" or "tail") stayed inconsistent (`value`,
    /// `check`) past the driver's bound: it wrote garbage there.
    pub(super) fn record_timed_out(
        &mut self,
        record: &'static str,
        value: u64,
        check: u64,
    ) -> Error {
        self.close(Corruption::Record {
            record,
            value,
            check,
        })
    }
}
