//! The crate's error type.

use std::io;

use rrpc_core::Fault;

/// Errors of the poller and of the async connections built on it.
///
/// Split by whose fault it is ([`Error::fault`]): configuration misuse
/// ([`Error::InvalidConfig`]), the peer ([`Error::PeerGone`]), our own shutdown
/// ([`Error::Shutdown`]) and the operating system ([`Error::Io`]). Errors of the ring and
/// the fabric below keep their type ([`Error::Ring`], [`Error::Core`]); whether one means
/// the peer is gone is theirs to say ([`Error::is_peer_gone`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of range (local misuse); the message names the field.
    #[error("invalid poller configuration: {0}")]
    InvalidConfig(&'static str),
    /// The poller found the peer gone (its liveness source closed); the waiting task was
    /// woken with this error. A ring or fabric error that says the peer is gone stays
    /// [`Error::Ring`] / [`Error::Core`]: ask [`Error::is_peer_gone`].
    #[error("peer gone")]
    PeerGone,
    /// The poller was shut down while the task was registered or waiting.
    #[error("poller shut down")]
    Shutdown,
    /// A registration that needs the tokio reactor (an eventfd or liveness fd under `AsyncFd`)
    /// was made outside a tokio runtime (local misuse).
    #[error("registration needs a tokio runtime with IO enabled")]
    NoRuntime,
    /// The ring buffer reported an error (corrupt peer data, a fabric failure, a message
    /// larger than the ring).
    #[error("ring buffer: {0}")]
    Ring(#[source] rrpc_ringbuf::Error),
    /// The fabric reported an error (posting receives, arming a completion queue).
    #[error("fabric: {0}")]
    Core(#[source] rrpc_core::Error),
    /// Work waited on send completions for this long with none coming
    /// ([`PollerConfigBuilder::completion_limit`](crate::PollerConfigBuilder::completion_limit)): the
    /// device lost the connection's WRITEs (a link down that its driver
    /// did not report as a failed completion, a stalled driver). The
    /// connection is failed; it is the device's fault.
    #[error(
        "no send completion for {0:?} with WRITEs in flight: the device stopped completing \
         this connection's writes (a link down its driver did not report, or a stalled driver)"
    )]
    CompletionOverdue(std::time::Duration),
    /// A system call failed (eventfd creation, registration with the tokio reactor, ...).
    #[error("{op} failed: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whose fault this error was: misuse and our own shutdown are local, a
    /// closed liveness source the peer leaving, a system call the device's;
    /// a ring or fabric error says its own.
    pub fn fault(&self) -> Fault {
        match self {
            Error::InvalidConfig(_) | Error::Shutdown | Error::NoRuntime => Fault::Local,
            Error::PeerGone => Fault::PeerGone,
            Error::Ring(e) => e.fault(),
            Error::Core(e) => e.fault(),
            Error::Io { .. } | Error::CompletionOverdue(_) => Fault::Device,
        }
    }

    /// Whether the peer is gone ([`Fault::PeerGone`]).
    pub fn is_peer_gone(&self) -> bool {
        self.fault() == Fault::PeerGone
    }

    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { op, source }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<rrpc_ringbuf::Error> for Error {
    fn from(e: rrpc_ringbuf::Error) -> Self {
        Error::Ring(e)
    }
}

impl From<rrpc_core::Error> for Error {
    fn from(e: rrpc_core::Error) -> Self {
        Error::Core(e)
    }
}
