//! The one error type of `rrpc-ringbuf`.

/// Errors of the ring buffer: local misuse, peer fault, peer gone, fabric failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ring is full (sending) or empty (receiving); try again later.
    #[error("ring buffer operation would block")]
    WouldBlock,
    /// A message is larger than the whole ring can hold.
    #[error("message of {len} bytes is larger than the ring's maximum of {max} bytes")]
    TooLarge {
        /// Requested payload length.
        len: usize,
        /// Largest payload the ring can carry (ring size minus the 8-byte header).
        max: usize,
    },
    /// A configuration value is out of its documented range.
    #[error("invalid ring configuration: {0}")]
    InvalidConfig(String),
    /// The peer's ring parameters (its handshake section) or granted
    /// regions do not match ours.
    #[error("peer ring does not match: {0}")]
    Incompatible(String),
    /// The peer wrote an invalid value (header, gap marker, pointer word);
    /// the channel is closed.
    #[error("peer wrote corrupt ring data, channel closed: {0}")]
    Corrupt(String),
    /// The peer process or its queue pair is gone; the channel is closed.
    #[error("peer is gone")]
    PeerGone,
    /// The fabric reported an error.
    #[error("fabric error: {0}")]
    Core(#[source] rrpc_core::Error),
}

impl From<rrpc_core::Error> for Error {
    fn from(e: rrpc_core::Error) -> Self {
        match e {
            rrpc_core::Error::PeerGone => Error::PeerGone,
            rrpc_core::Error::WouldBlock => Error::WouldBlock,
            e => Error::Core(e),
        }
    }
}

impl Error {
    /// True for errors after which the channel is unusable (everything but
    /// [`Error::WouldBlock`], [`Error::TooLarge`] and [`Error::InvalidConfig`]).
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            Error::WouldBlock | Error::TooLarge { .. } | Error::InvalidConfig(_)
        )
    }
}
