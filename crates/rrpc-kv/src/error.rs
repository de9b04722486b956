//! The crate's error type, whose fault it was ([`Error::fault`], asking
//! the fabric for [`Error::Fabric`]: the fabric decides once whether a
//! peer is gone), and its one mapping to a gRPC status
//! ([`Error::code`], used by the gRPC face).

use rrpc_core::Fault;

/// Everything rrpc-kv can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes a peer wrote (a request, a result, a batch) do not parse.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was being parsed.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A key or value over the store's limits.
    #[error("{what} of {len} bytes is over the limit of {limit}")]
    TooLarge {
        /// "key", "value", "request", "result", ...
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A configuration value out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The persistent engine failed.
    #[error("storage: {0}")]
    Storage(String),
    /// The fabric (rrpc-core) failed: connection, region, work request.
    /// The peer going away is one of these: ask [`Error::is_peer_gone`].
    #[error("fabric: {0}")]
    Fabric(#[from] rrpc_core::Error),
    /// No result within the call's time bound.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Every operation of a YCSB phase failed (the driver's verdict,
    /// [`crate::ycsb::driver::Errors::check`]).
    #[error("every operation failed ({count} of {attempted}; first: {first})")]
    AllFailed {
        /// Operations that failed.
        count: u64,
        /// Operations attempted.
        attempted: u64,
        /// The first failure, as the driver recorded it.
        first: String,
    },
}

impl Error {
    /// Whose fault this error was.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Malformed { .. } | Error::Timeout(_) => Fault::Peer,
            Error::TooLarge { .. } | Error::InvalidConfig(_) => Fault::Local,
            Error::Fabric(e) => e.fault(),
            Error::Storage(_) | Error::Io { .. } => Fault::Device,
            // The system under test failed every operation.
            Error::AllFailed { .. } => Fault::Peer,
        }
    }

    /// Whether the peer is gone ([`Fault::PeerGone`], decided by
    /// [`rrpc_core::Error::is_peer_gone`]).
    pub fn is_peer_gone(&self) -> bool {
        self.fault() == Fault::PeerGone
    }

    /// The gRPC code this error becomes (the gRPC face's one mapping): a
    /// request over the limits `InvalidArgument` (as the face documents),
    /// a malformed message `InvalidArgument`, no result in time
    /// `DeadlineExceeded`, a refused token or TLS peer `Unauthenticated`,
    /// a fabric limit `ResourceExhausted`; otherwise by fault: local
    /// misuse, a peer's violation and a failing store `Internal`, a gone
    /// peer or a failing device `Unavailable`.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::TooLarge { .. } | Error::Malformed { .. } => Code::InvalidArgument,
            Error::Timeout(_) => Code::DeadlineExceeded,
            Error::Storage(_) => Code::Internal,
            Error::Fabric(c) => rrpc_tonic::fabric_code(c),
            e => match e.fault() {
                Fault::Local | Fault::Peer => Code::Internal,
                Fault::PeerGone | Fault::Device => Code::Unavailable,
                _ => Code::Unknown,
            },
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// `Result<T, rrpc_kv::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    /// The gRPC face's one mapping, over every kind and every fault a
    /// fabric error can have: its code, and whether the peer is gone
    /// (decided by the fabric, not re-mapped here).
    #[test]
    fn one_mapping_over_every_kind_and_fault() {
        use rrpc_core::Error as C;
        let cases: Vec<(Error, Fault, Code)> = vec![
            (
                Error::TooLarge {
                    what: "key",
                    len: 2,
                    limit: 1,
                },
                Fault::Local,
                Code::InvalidArgument,
            ),
            (
                Error::Malformed {
                    what: "request",
                    detail: "x".into(),
                },
                Fault::Peer,
                Code::InvalidArgument,
            ),
            (
                Error::Timeout(std::time::Duration::from_secs(1)),
                Fault::Peer,
                Code::DeadlineExceeded,
            ),
            (Error::Storage("x".into()), Fault::Device, Code::Internal),
            (C::AuthFailed.into(), Fault::Peer, Code::Unauthenticated),
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
                C::QueueFull { depth: 1 }.into(),
                Fault::Local,
                Code::Internal,
            ),
            (
                C::VersionMismatch { ours: 1, theirs: 2 }.into(),
                Fault::Peer,
                Code::Internal,
            ),
            (C::PeerGone.into(), Fault::PeerGone, Code::Unavailable),
            (
                C::PeerUnresponsive("x".into()).into(),
                Fault::PeerGone,
                Code::Unavailable,
            ),
            (
                C::io("x", std::io::Error::other("y")).into(),
                Fault::Device,
                Code::Unavailable,
            ),
        ];
        for (e, fault, code) in cases {
            assert_eq!(e.fault(), fault, "{e}");
            assert_eq!(e.is_peer_gone(), fault == Fault::PeerGone, "{e}");
            let what = e.to_string();
            let st = tonic::Status::from(e);
            assert_eq!(st.code(), code, "{what}");
            assert_eq!(st.message(), what);
        }
    }
}
