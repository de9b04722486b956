//! The crate's error type and its mapping to [`tonic::Status`].

use crate::frame::FrameError;

/// Everything that can go wrong in rrpc-tonic.
///
/// Split by fault as house style asks: API misuse (`InvalidUri`,
/// `UnsupportedTransport`, `InvalidConfig`), peer fault (`Protocol`,
/// `Handshake`), peer gone (`PeerGone`), local resources (`Io`, `Transport`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URI could not be parsed or names no known scheme.
    #[error("invalid rrpc uri {uri:?}: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The scheme is known but this build or this machine cannot serve it.
    #[error("transport {scheme}:// unavailable: {reason}")]
    UnsupportedTransport {
        /// The scheme.
        scheme: &'static str,
        /// Why (e.g. "verbs provider not compiled in").
        reason: &'static str,
    },
    /// A configuration value is out of range.
    #[error("invalid config: {0}")]
    InvalidConfig(&'static str),
    /// A message is larger than the ring can carry.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge {
        /// Size of the message.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer closed the connection or died.
    #[error("peer gone")]
    PeerGone,
    /// The peer sent a malformed frame; the connection was closed.
    #[error("protocol violation by peer: {0}")]
    Protocol(#[from] FrameError),
    /// The connection handshake failed.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// A connection attempt took longer than the endpoint's
    /// `connect_timeout`.
    #[error("connect timed out after {0:?}")]
    ConnectTimeout(std::time::Duration),
    /// No server is listening at the address.
    #[error("nothing listening at {0}")]
    NotListening(String),
    /// An I/O error from the side channel or a socket.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// An error from the rings, the poller or the fabric below.
    #[error("rings: {0}")]
    Rings(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// An error from tonic's own transport (TCP and Unix-socket paths).
    #[error("tonic transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// An `rrpc://` port's negotiation found no fabric both ends allow and
    /// can use (`reason` says what was missing on which side, e.g. "the
    /// client requires shm but the server is on another host").
    #[error("no common fabric with {addr}: {reason}")]
    NoFabric {
        /// The `host:port` dialed.
        addr: String,
        /// What was missing, on which side.
        reason: String,
    },
    /// The connection failed earlier (a fast-path send failed, for
    /// `reason`), and everything on it fails the same way: `code` is the
    /// [`tonic::Code`] of the error that failed it ([`Error::code`]), so a
    /// ring the peer corrupted still reads `DataLoss` on every call it
    /// fails, not only the first.
    #[error("{reason}")]
    Failed {
        /// Whose fault the first error was, as a gRPC code.
        code: tonic::Code,
        /// The first error, as text.
        reason: String,
    },
}

impl Error {
    /// The [`tonic::Code`] this error becomes, saying whose fault it was:
    /// misuse `InvalidArgument` (or `Unimplemented` for a transport this
    /// build lacks), a message over the limit `ResourceExhausted`, a peer
    /// that broke the protocol `Internal`, a ring it corrupted `DataLoss`,
    /// a refused token or TLS peer `Unauthenticated`, no common fabric on an
    /// `rrpc://` port `FailedPrecondition`, and a gone peer, a
    /// failed connect or a failing device `Unavailable`.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::InvalidUri { .. } | Error::InvalidConfig(_) => Code::InvalidArgument,
            Error::UnsupportedTransport { .. } => Code::Unimplemented,
            Error::NoFabric { .. } => Code::FailedPrecondition,
            Error::MessageTooLarge { .. } => Code::ResourceExhausted,
            Error::Protocol(_) => Code::Internal,
            Error::Rings(inner) => rings_code(inner.as_ref()),
            Error::Failed { code, .. } => *code,
            Error::PeerGone
            | Error::Handshake(_)
            | Error::NotListening(_)
            | Error::ConnectTimeout(_)
            | Error::Io(_)
            | Error::Transport(_) => Code::Unavailable,
        }
    }
}

impl From<rrpc_poller::Error> for Error {
    fn from(e: rrpc_poller::Error) -> Self {
        match e {
            rrpc_poller::Error::PeerGone
            | rrpc_poller::Error::Ring(rrpc_ringbuf::Error::PeerGone) => Error::PeerGone,
            rrpc_poller::Error::Ring(rrpc_ringbuf::Error::TooLarge { len, max }) => {
                Error::MessageTooLarge { len, max }
            }
            e => Error::Rings(Box::new(e)),
        }
    }
}

impl From<rrpc_ringbuf::Error> for Error {
    fn from(e: rrpc_ringbuf::Error) -> Self {
        rrpc_poller::Error::Ring(e).into()
    }
}

impl From<rrpc_core::Error> for Error {
    fn from(e: rrpc_core::Error) -> Self {
        match e {
            rrpc_core::Error::PeerGone => Error::PeerGone,
            rrpc_core::Error::InvalidUri { uri, reason } => Error::InvalidUri { uri, reason },
            e => Error::Rings(Box::new(e)),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// Whose fault an error from the layers below was, as a gRPC code: a
/// refused token is `Unauthenticated`, a peer that broke the protocol
/// `Internal` (corrupt ring data: `DataLoss`), a local limit
/// `ResourceExhausted`, a gone peer or a failing device `Unavailable`.
fn rings_code(e: &(dyn std::error::Error + 'static)) -> tonic::Code {
    use tonic::Code;
    let core = |c: &rrpc_core::Error| match c {
        rrpc_core::Error::AuthFailed | rrpc_core::Error::Tls(_) => Code::Unauthenticated,
        rrpc_core::Error::LimitExceeded { .. } => Code::ResourceExhausted,
        c => match c.fault() {
            rrpc_core::Fault::Peer => Code::Internal,
            rrpc_core::Fault::Local => Code::Internal,
            _ => Code::Unavailable,
        },
    };
    let ring = |r: &rrpc_ringbuf::Error| match r {
        rrpc_ringbuf::Error::Corrupt(_) => Code::DataLoss,
        rrpc_ringbuf::Error::Incompatible(_) => Code::Internal,
        rrpc_ringbuf::Error::Core(c) => core(c),
        _ => Code::Unavailable,
    };
    if let Some(c) = e.downcast_ref::<rrpc_core::Error>() {
        return core(c);
    }
    if let Some(r) = e.downcast_ref::<rrpc_ringbuf::Error>() {
        return ring(r);
    }
    if let Some(rrpc_poller::Error::Ring(r)) = e.downcast_ref::<rrpc_poller::Error>() {
        return ring(r);
    }
    Code::Unavailable
}

/// What `rdma://` says in a build without the verbs provider.
pub(crate) fn rdma_unavailable() -> Error {
    Error::UnsupportedTransport {
        scheme: "rdma",
        reason: "the verbs provider is not compiled in: enable rrpc-tonic's `verbs` feature \
                 (cargo add rrpc-tonic -F verbs; needs libibverbs)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn maps_to_status_codes() {
        assert_eq!(
            tonic::Status::from(Error::PeerGone).code(),
            Code::Unavailable
        );
        assert_eq!(
            tonic::Status::from(Error::MessageTooLarge { len: 2, max: 1 }).code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            tonic::Status::from(Error::Protocol(FrameError::Reserved)).code(),
            Code::Internal
        );
        assert_eq!(
            tonic::Status::from(Error::from(rrpc_core::Error::AuthFailed)).code(),
            Code::Unauthenticated
        );
        assert_eq!(
            tonic::Status::from(Error::from(rrpc_core::Error::LimitExceeded {
                what: "bytes",
                requested: 2,
                limit: 1
            }))
            .code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            tonic::Status::from(Error::from(rrpc_ringbuf::Error::Corrupt("x".into()))).code(),
            Code::DataLoss
        );
        let corrupt = Error::from(rrpc_ringbuf::Error::Corrupt("x".into()));
        let failed = Error::Failed {
            code: corrupt.code(),
            reason: corrupt.to_string(),
        };
        assert_eq!(tonic::Status::from(failed).code(), Code::DataLoss);
        assert_eq!(
            tonic::Status::from(Error::UnsupportedTransport {
                scheme: "rdma",
                reason: "x"
            })
            .code(),
            Code::Unimplemented
        );
    }
}
