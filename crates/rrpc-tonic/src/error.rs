//! The crate's error type and its one mapping to [`tonic::Status`].
//!
//! Errors of the layers below keep their type ([`Error::Rings`] holds the
//! poller's error, which holds the ring's or the fabric's), and a
//! connection that failed shares its first error with every call it fails
//! ([`Error::Failed`]). [`Error::fault`] says whose fault an error was (a
//! [`rrpc_core::Fault`], asked of the error below when there is one: the
//! fabric decides once whether a peer is gone), and [`Error::code`] is the
//! one place an error becomes a gRPC code, on both paths:
//!
//! | error (at any depth) | code |
//! |---|---|
//! | a ring the peer corrupted (`rrpc_ringbuf::Error::Corrupt`), a sealed ring message that failed to open (`RingTampered`) | `DataLoss` |
//! | a refused token or TLS peer (`AuthFailed`, `Tls`), a failed TLS set-up (`Error::Tls`) | `Unauthenticated` |
//! | ring encryption asked for without TLS, or not agreed by both ends (`RingEncryption`) | `FailedPrecondition` |
//! | a message or grant over a limit (`MessageTooLarge`, `LimitExceeded`), a server's connection limit (`ConnectionLimit`) | `ResourceExhausted` |
//! | a bad URI or configuration | `InvalidArgument` |
//! | a transport this build lacks | `Unimplemented` |
//! | no common fabric on an `rrpc://` port | `FailedPrecondition` |
//! | the peer broke the protocol (`Protocol`, other [`Fault::Peer`]) | `Internal` |
//! | other local misuse below ([`Fault::Local`]) | `Internal` |
//! | a gone peer, a failed connect or handshake, a failing device ([`Fault::PeerGone`], [`Fault::Device`]) | `Unavailable` |

use std::sync::Arc;

use rrpc_core::Fault;

use crate::frame::FrameError;

/// Everything that can go wrong in rrpc-tonic.
///
/// Split by fault as house style asks ([`Error::fault`]): API misuse
/// (`InvalidUri`, `UnsupportedTransport`, `InvalidConfig`), peer fault
/// (`Protocol`, `Handshake`), peer gone (`PeerGone`), local resources
/// (`Io`, `Transport`), and the layers below (`Rings`), whose errors say
/// their own fault.
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
    /// The peer closed the connection (an in-process pipe whose other end
    /// is gone). A ring or fabric error that says so stays
    /// [`Error::Rings`]: ask [`Error::is_peer_gone`].
    #[error("peer gone")]
    PeerGone,
    /// The peer sent a malformed frame; the connection was closed.
    #[error("protocol violation by peer: {0}")]
    Protocol(#[from] FrameError),
    /// The connection handshake failed (made once per connect: the text
    /// names the step and what the peer said).
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
    /// An error from the rings, the poller or the fabric below, typed
    /// (a fabric error is [`rrpc_poller::Error::Core`], a ring's
    /// [`rrpc_poller::Error::Ring`]).
    #[error("rings: {0}")]
    Rings(#[source] Box<rrpc_poller::Error>),
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
    /// The server refused the connection: it holds as many connections as
    /// its `max_connections` allows, or as many of this client's (its
    /// process on `shm://`, its host on `rdma://` and TCP) as its
    /// `max_connections_per_peer` allows; the text names which. Another
    /// connect succeeds once connections close.
    #[error("the server refused the connection: {0}")]
    ConnectionLimit(String),
    /// The call ended, or its connection closed, while it waited (for
    /// flow-control window).
    #[error("{0}")]
    Closed(&'static str),
    /// The connection failed earlier, with this error, and everything on
    /// it fails the same way: every call it fails shares the first error
    /// (its code, [`Error::code`], is that error's, so a ring the peer
    /// corrupted reads `DataLoss` on every call, not only the first).
    #[error("connection failed: {0}")]
    Failed(#[source] Arc<Error>),
    /// TLS could not be set up: a session whose keying material could not
    /// be exported (the ring ticket, the ring keys).
    #[error("TLS: {0}")]
    Tls(String),
    /// Ring encryption ([`crate::RingEncryption`]) was asked for where it
    /// cannot be had (no TLS on the connection), or the two ends do not
    /// agree on it (the text says which end wants what).
    #[error("ring encryption: {0}")]
    RingEncryption(String),
    /// A sealed ring message failed to open: altered, replayed,
    /// reordered, truncated or after a lost one (ring encryption). No
    /// byte of it was delivered; the connection fails (`DataLoss`).
    #[cfg(feature = "tls")]
    #[error("ring message refused: {0}")]
    RingTampered(#[source] crate::conn::seal::OpenError),
}

/// The deepest typed error an [`Error`] holds: the one [`Error::code`]
/// reads.
enum Leaf<'a> {
    Tonic(&'a Error),
    Poller(&'a rrpc_poller::Error),
    Ring(&'a rrpc_ringbuf::Error),
    Core(&'a rrpc_core::Error),
}

impl Error {
    /// Whose fault this error was: misuse and limits [`Fault::Local`], a
    /// peer that broke the protocol or a failed handshake [`Fault::Peer`],
    /// a peer that left or cannot be reached [`Fault::PeerGone`], a system
    /// call or tonic's transport [`Fault::Device`]; an error from below (or
    /// the one a connection failed with) says its own.
    pub fn fault(&self) -> Fault {
        match self {
            Error::InvalidUri { .. }
            | Error::UnsupportedTransport { .. }
            | Error::InvalidConfig(_)
            | Error::MessageTooLarge { .. }
            | Error::NoFabric { .. }
            | Error::ConnectionLimit(_)
            | Error::RingEncryption(_)
            | Error::Closed(_) => Fault::Local,
            Error::Protocol(_) | Error::Handshake(_) | Error::Tls(_) => Fault::Peer,
            #[cfg(feature = "tls")]
            Error::RingTampered(_) => Fault::Peer,
            Error::PeerGone | Error::ConnectTimeout(_) | Error::NotListening(_) => Fault::PeerGone,
            Error::Io(_) | Error::Transport(_) => Fault::Device,
            Error::Rings(e) => e.fault(),
            Error::Failed(e) => e.fault(),
        }
    }

    /// Whether the peer is gone ([`Fault::PeerGone`]: decided by the
    /// fabric for its errors, [`rrpc_core::Error::is_peer_gone`]).
    pub fn is_peer_gone(&self) -> bool {
        self.fault() == Fault::PeerGone
    }

    fn leaf(&self) -> Leaf<'_> {
        match self {
            Error::Failed(e) => e.leaf(),
            Error::Rings(e) => match e.as_ref() {
                rrpc_poller::Error::Ring(rrpc_ringbuf::Error::Core(c))
                | rrpc_poller::Error::Core(c) => Leaf::Core(c),
                rrpc_poller::Error::Ring(r) => Leaf::Ring(r),
                p => Leaf::Poller(p),
            },
            e => Leaf::Tonic(e),
        }
    }

    /// The [`tonic::Code`] this error becomes: the one mapping, for both
    /// paths and every call a failed connection fails (module docs, the
    /// table). The specific kinds first (a corrupt ring `DataLoss`, a
    /// refused token or TLS peer `Unauthenticated`, a limit
    /// `ResourceExhausted`), at whatever depth they are; then this crate's
    /// own variants; then the [`Fault`] of an error from below.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self.leaf() {
            Leaf::Ring(rrpc_ringbuf::Error::Corrupt(_)) => Code::DataLoss,
            #[cfg(feature = "tls")]
            Leaf::Tonic(Error::RingTampered(_)) => Code::DataLoss,
            Leaf::Tonic(Error::Tls(_)) => Code::Unauthenticated,
            Leaf::Tonic(Error::RingEncryption(_)) => Code::FailedPrecondition,
            Leaf::Core(c) => fabric_code(c),
            Leaf::Ring(rrpc_ringbuf::Error::TooLarge { .. })
            | Leaf::Tonic(Error::MessageTooLarge { .. } | Error::ConnectionLimit(_)) => {
                Code::ResourceExhausted
            }
            Leaf::Tonic(Error::InvalidUri { .. } | Error::InvalidConfig(_)) => {
                Code::InvalidArgument
            }
            Leaf::Tonic(Error::UnsupportedTransport { .. }) => Code::Unimplemented,
            Leaf::Tonic(Error::NoFabric { .. }) => Code::FailedPrecondition,
            Leaf::Tonic(Error::Protocol(_)) => Code::Internal,
            // A connect or handshake that failed, whoever refused: worth
            // retrying (a refused token is `Unauthenticated` above).
            Leaf::Tonic(Error::Handshake(_) | Error::Closed(_)) => Code::Unavailable,
            // Our own poller shut down under the call: not misuse.
            Leaf::Poller(rrpc_poller::Error::Shutdown) => Code::Unavailable,
            _ => match self.fault() {
                Fault::Local | Fault::Peer => Code::Internal,
                _ => Code::Unavailable,
            },
        }
    }

    /// This error as a [`tonic::Status`]: [`Error::code`] and the error's
    /// text. What `From<Error> for Status` does, for an error that is
    /// shared ([`Error::Failed`]).
    pub fn status(&self) -> tonic::Status {
        tonic::Status::new(self.code(), self.to_string())
    }
}

/// The gRPC code of a fabric error, as [`Error::code`] gives it: a refused
/// token or TLS is `Unauthenticated`, a limit `ResourceExhausted`, other
/// misuse and peer faults `Internal`, a gone peer or a failing device
/// `Unavailable`. rrpc-kv's gRPC face maps its fabric errors with it.
pub fn fabric_code(e: &rrpc_core::Error) -> tonic::Code {
    use rrpc_core::Error as C;
    use tonic::Code;
    match e {
        C::AuthFailed | C::Tls(_) => Code::Unauthenticated,
        C::LimitExceeded { .. } => Code::ResourceExhausted,
        // A server's connection limit, however deep it came (a lane opened
        // ahead fails its sends with the refusal).
        C::Rejected(r) if r.starts_with(CONNECTION_LIMIT_PREFIX) => Code::ResourceExhausted,
        c => match c.fault() {
            Fault::Local | Fault::Peer => Code::Internal,
            _ => Code::Unavailable,
        },
    }
}

impl From<rrpc_poller::Error> for Error {
    fn from(e: rrpc_poller::Error) -> Self {
        match e {
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
            rrpc_core::Error::InvalidUri { uri, reason } => Error::InvalidUri { uri, reason },
            // A server's connection limit, by the reason it sends
            // (`port::limits`).
            rrpc_core::Error::Rejected(r) if r.starts_with(CONNECTION_LIMIT_PREFIX) => {
                Error::ConnectionLimit(r)
            }
            e => rrpc_poller::Error::Core(e).into(),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        e.status()
    }
}

/// How a server's refusal for a connection limit starts, on every fabric
/// (`port::limits`): the client reads it as [`Error::ConnectionLimit`].
pub(crate) const CONNECTION_LIMIT_PREFIX: &str = "connection limit: ";

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
    use rrpc_core::Error as C;
    use rrpc_ringbuf::{Corruption, Error as R};
    use tonic::Code;

    fn corrupt() -> Error {
        R::Corrupt(Corruption::PlacementTimedOut).into()
    }

    /// The one mapping, over every [`Fault`] and every specific kind, at
    /// every depth an error reaches it: as itself, under the poller
    /// (`Rings`), and shared by a failed connection (`Failed`), which must
    /// keep the code and the fault of what failed it.
    /// A sealed ring message that failed to open is the peer's fault and
    /// `DataLoss`, also when a failed connection shares it.
    #[cfg(feature = "tls")]
    #[test]
    fn a_refused_sealed_message_is_data_loss() {
        let e = Error::RingTampered(crate::conn::seal::OpenError::Forged { seq: 3 });
        assert_eq!((e.fault(), e.code()), (Fault::Peer, Code::DataLoss));
        let shared = Error::Failed(Arc::new(e));
        assert_eq!(
            (shared.fault(), shared.code()),
            (Fault::Peer, Code::DataLoss)
        );
    }

    #[test]
    fn one_mapping_over_every_fault_and_kind() {
        let cases: Vec<(Error, Fault, Code)> = vec![
            // Specific kinds.
            (corrupt(), Fault::Peer, Code::DataLoss),
            (C::AuthFailed.into(), Fault::Peer, Code::Unauthenticated),
            (
                C::Tls("x".into()).into(),
                Fault::Peer,
                Code::Unauthenticated,
            ),
            (
                C::LimitExceeded {
                    what: "bytes",
                    requested: 2,
                    limit: 1,
                }
                .into(),
                Fault::Local,
                Code::ResourceExhausted,
            ),
            (
                Error::MessageTooLarge { len: 2, max: 1 },
                Fault::Local,
                Code::ResourceExhausted,
            ),
            (
                R::TooLarge { len: 2, max: 1 }.into(),
                Fault::Local,
                Code::ResourceExhausted,
            ),
            (
                C::Rejected(format!("{CONNECTION_LIMIT_PREFIX}max_connections")).into(),
                Fault::Local,
                Code::ResourceExhausted,
            ),
            // Any other refusal keeps its fault and code.
            (C::Rejected("no".into()).into(), Fault::Peer, Code::Internal),
            // This crate's own.
            (
                Error::InvalidConfig("x"),
                Fault::Local,
                Code::InvalidArgument,
            ),
            (
                C::InvalidUri {
                    uri: "x".into(),
                    reason: "y".into(),
                }
                .into(),
                Fault::Local,
                Code::InvalidArgument,
            ),
            (rdma_unavailable(), Fault::Local, Code::Unimplemented),
            (Error::Tls("x".into()), Fault::Peer, Code::Unauthenticated),
            (
                Error::RingEncryption("x".into()),
                Fault::Local,
                Code::FailedPrecondition,
            ),
            (
                Error::NoFabric {
                    addr: "a".into(),
                    reason: "b".into(),
                },
                Fault::Local,
                Code::FailedPrecondition,
            ),
            (
                Error::Protocol(FrameError::Reserved),
                Fault::Peer,
                Code::Internal,
            ),
            (Error::Handshake("x".into()), Fault::Peer, Code::Unavailable),
            (Error::Closed("x"), Fault::Local, Code::Unavailable),
            (Error::PeerGone, Fault::PeerGone, Code::Unavailable),
            (
                Error::NotListening("x".into()),
                Fault::PeerGone,
                Code::Unavailable,
            ),
            (
                std::io::Error::other("x").into(),
                Fault::Device,
                Code::Unavailable,
            ),
            // From below, by fault: local misuse and a peer's violation
            // `Internal`, a gone peer and a failing device `Unavailable`.
            (
                C::QueueFull { depth: 1 }.into(),
                Fault::Local,
                Code::Internal,
            ),
            (
                C::PeerMisbehaved(rrpc_core::Violation::ConsumerAhead { cons: 2, prod: 1 }).into(),
                Fault::Peer,
                Code::Internal,
            ),
            (
                R::Incompatible("x".into()).into(),
                Fault::Peer,
                Code::Internal,
            ),
            (C::PeerGone.into(), Fault::PeerGone, Code::Unavailable),
            (
                R::Core(C::PeerUnresponsive("x".into())).into(),
                Fault::PeerGone,
                Code::Unavailable,
            ),
            (
                C::CompletionError {
                    wr_id: 1,
                    status: rrpc_core::Status::RetryExceeded,
                }
                .into(),
                Fault::PeerGone,
                Code::Unavailable,
            ),
            (
                rrpc_poller::Error::PeerGone.into(),
                Fault::PeerGone,
                Code::Unavailable,
            ),
            (
                C::io("x", std::io::Error::other("y")).into(),
                Fault::Device,
                Code::Unavailable,
            ),
            (
                rrpc_poller::Error::Shutdown.into(),
                Fault::Local,
                Code::Unavailable,
            ),
            (
                rrpc_poller::Error::InvalidConfig("x").into(),
                Fault::Local,
                Code::Internal,
            ),
        ];
        for (e, fault, code) in cases {
            let what = e.to_string();
            assert_eq!(e.fault(), fault, "fault of {what}");
            assert_eq!(e.code(), code, "code of {what}");
            assert_eq!(e.is_peer_gone(), fault == Fault::PeerGone, "{what}");
            let shared = Error::Failed(Arc::new(e));
            assert_eq!(
                shared.fault(),
                fault,
                "fault of a connection failed by {what}"
            );
            assert_eq!(shared.code(), code, "code of a connection failed by {what}");
            let st = tonic::Status::from(shared);
            assert_eq!(st.code(), code, "{what}");
            assert!(st.message().contains(&what), "{st:?}");
        }
    }
}
