//! The crate's error type.

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
    #[error("fabric: {0}")]
    Fabric(#[from] rrpc_core::Error),
    /// No result within the call's time bound.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The peer went away.
    #[error("peer gone")]
    PeerGone,
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whose fault this error was.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Malformed { .. } | Error::Timeout(_) => Fault::Peer,
            Error::PeerGone => Fault::PeerGone,
            Error::TooLarge { .. } | Error::InvalidConfig(_) => Fault::Local,
            Error::Fabric(e) => e.fault(),
            Error::Storage(_) | Error::Io { .. } => Fault::Device,
        }
    }
}

/// `Result<T, rrpc_kv::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
