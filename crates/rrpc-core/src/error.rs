//! The one error type of `rrpc-core`.
//!
//! Variants are grouped by whose fault it was (rustls style): the local caller
//! misused the API, the peer misbehaved or is incompatible, the peer went away,
//! or the device / operating system failed. [`Error::fault`] returns the group.

use std::io;

/// Convenience alias used throughout `rrpc-core`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whose fault an [`Error`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The local caller used the API wrongly (bad bounds, full queue, bad
    /// config), or a local resource limit was reached
    /// ([`Error::LimitExceeded`]).
    Local,
    /// The peer sent or wrote something invalid, or speaks another protocol version.
    Peer,
    /// The peer disappeared (process died, side channel closed).
    PeerGone,
    /// The operating system or the RDMA device failed.
    Device,
}

/// What a peer wrote into memory we read that breaks the protocol
/// ([`Error::PeerMisbehaved`]): typed, since it is found on the data path
/// from peer-written words (no text is formatted until someone displays
/// it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// The peer-written producer index of our receive queue is outside
    /// the window it may be in.
    #[error("receive queue producer index {prod} outside [{cons}, {max}] (posted {posted})")]
    RecvProducer {
        /// The index the peer wrote.
        prod: u64,
        /// Our consumer index (the least it may be).
        cons: u64,
        /// The most it may be (consumer index plus the queue's capacity).
        max: u64,
        /// Receives we posted so far.
        posted: u64,
    },
    /// The peer-written consumer index of its receive queue is ahead of
    /// what we produced into it.
    #[error("peer receive queue consumer index {cons} ahead of producer {prod}")]
    ConsumerAhead {
        /// The index the peer wrote.
        cons: u64,
        /// What we produced.
        prod: u64,
    },
    /// The peer wrote with immediate to a sharer of a virtual queue pair
    /// more often than that sharer's receive depth before it posted any.
    #[error(
        "peer wrote with immediate to sharer {tag} more than its {depth} receives before any \
         was posted"
    )]
    SharerOverrun {
        /// The sharer's tag.
        tag: u32,
        /// Its receive depth.
        depth: usize,
    },
    /// A layer above failed the queue pair ([`crate::QueuePair::fail`])
    /// with an error this crate has no variant for: its text, made once
    /// when the queue pair fails.
    #[error("{0}")]
    Reported(String),
}

/// Errors returned by the fabric, the handshake and the connection pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- local misuse -------------------------------------------------------
    /// A local slice does not lie inside its local region.
    #[error("local range {offset}+{len} is outside the local region of {region_len} bytes")]
    LocalOutOfBounds {
        /// Offset of the slice inside the region.
        offset: u64,
        /// Length of the slice.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },
    /// A remote range does not lie inside any region the peer granted.
    #[error("remote range {addr:#x}+{len} is outside the granted remote region")]
    RemoteOutOfBounds {
        /// Remote virtual address of the first byte.
        addr: u64,
        /// Length of the access.
        len: u64,
    },
    /// No region granted by the peer carries this remote key.
    #[error("remote key {rkey:#x} was not granted by the peer")]
    BadRemoteKey {
        /// The key the caller used.
        rkey: u32,
    },
    /// The send queue already holds `depth` outstanding work requests.
    ///
    /// Poll the send completion queue (and signal at least one work request
    /// every `depth` posts) before posting again.
    #[error("send queue full: {depth} work requests outstanding")]
    QueueFull {
        /// The configured send queue depth.
        depth: u32,
    },
    /// The peer has no receive posted for a `WRITE_WITH_IMM` (the shm analogue
    /// of an RNR NAK) or its receive completion queue is full.
    #[error(
        "peer is not ready to receive an immediate (no receive posted or completion queue full)"
    )]
    ReceiverNotReady,
    /// The queue pair is not connected yet, or was closed locally.
    #[error("queue pair is not connected")]
    NotConnected,
    /// A configuration value is out of its documented range. A message:
    /// purely local, made once when a setting is checked, never from peer
    /// bytes nor on the data path.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The operation would block; try again later.
    #[error("operation would block")]
    WouldBlock,
    /// The URI could not be parsed or names an unknown scheme.
    #[error("invalid endpoint URI {uri:?}: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The requested provider was not compiled in.
    #[error("provider {0:?} is not available in this build (enable the cargo feature)")]
    ProviderUnavailable(&'static str),
    /// A configured resource limit would be exceeded (for example the bytes
    /// a peer may grant us, see [`crate::conn::HandshakeConfig`]). The peer
    /// asked for more than we allow; nothing was allocated or mapped.
    #[error("{what}: {requested} exceeds the limit of {limit}")]
    LimitExceeded {
        /// What is limited.
        what: &'static str,
        /// The value that was asked for (for a shared budget: what is in use
        /// plus what was asked for).
        requested: u64,
        /// The configured limit.
        limit: u64,
    },

    // ---- peer fault ---------------------------------------------------------
    /// The peer sent a malformed handshake message. Still a message (it
    /// names the field): made once per connection attempt, at setup, never
    /// on the data path; a typed kind is future work.
    #[error("malformed handshake from peer: {0}")]
    MalformedHandshake(String),
    /// The peer speaks a protocol version we do not.
    #[error("peer speaks protocol version {theirs}, we speak {ours}")]
    VersionMismatch {
        /// Our protocol version.
        ours: u16,
        /// The peer's protocol version.
        theirs: u16,
    },
    /// The peer presented the wrong shared-secret token (or none).
    #[error("authentication failed: peer presented a wrong or missing token")]
    AuthFailed,
    /// TLS on the side channel failed: a certificate the other side does
    /// not trust, or a peer that does not speak TLS (`rdma://` with
    /// `HandshakeConfig::tls_server` /
    /// `tls_client`).
    #[error("side-channel TLS failed: {0}")]
    Tls(String),
    /// The peer refused the connection.
    #[error("peer rejected the connection: {0}")]
    Rejected(String),
    /// The peer wrote an invalid value into memory we read (a pointer, a
    /// length, a completion); what it was is typed ([`Violation`]).
    #[error("peer wrote invalid data into shared memory: {0}")]
    PeerMisbehaved(Violation),

    // ---- peer gone ----------------------------------------------------------
    /// The peer closed its side channel (or its process died and its kernel
    /// closed it); the connection is failed. A peer whose *host* went silent
    /// is [`Error::PeerUnresponsive`].
    #[error("peer is gone (side channel closed)")]
    PeerGone,
    /// The peer stopped answering without closing anything (its host died,
    /// the link is cut): the side channel's keep-alive ran out. The text
    /// says after how long.
    #[error("the peer is gone: {0}")]
    PeerUnresponsive(String),
    /// The handshake did not complete within the configured timeout.
    #[error("handshake timed out")]
    Timeout,

    // ---- device / OS ---------------------------------------------------------
    /// The peer refused the connection because its own device or operating
    /// system failed while setting it up (for example its link is down): no
    /// fault of ours, and worth retrying later.
    #[error("peer could not set up the connection (its device or system failed): {0}")]
    PeerUnavailable(String),
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A completion reported an error status.
    #[error("work request {wr_id} failed: {status}")]
    CompletionError {
        /// The `wr_id` of the failed request.
        wr_id: u64,
        /// The status the device reported.
        status: crate::work::Status,
    },
}

impl Error {
    /// Whose fault this error was.
    pub fn fault(&self) -> Fault {
        use Error::*;
        match self {
            LocalOutOfBounds { .. }
            | RemoteOutOfBounds { .. }
            | BadRemoteKey { .. }
            | QueueFull { .. }
            | ReceiverNotReady
            | NotConnected
            | InvalidConfig(_)
            | WouldBlock
            | InvalidUri { .. }
            | ProviderUnavailable(_)
            | LimitExceeded { .. } => Fault::Local,
            MalformedHandshake(_)
            | VersionMismatch { .. }
            | AuthFailed
            | Tls(_)
            | Rejected(_)
            | PeerMisbehaved(_) => Fault::Peer,
            PeerGone | PeerUnresponsive(_) | Timeout => Fault::PeerGone,
            CompletionError {
                status: crate::work::Status::RetryExceeded,
                ..
            } => Fault::PeerGone,
            Io { .. } | CompletionError { .. } | PeerUnavailable(_) => Fault::Device,
        }
    }

    /// Whether the peer is gone ([`Fault::PeerGone`]): closed, silent,
    /// or unreachable (retries exhausted). The one place this is decided:
    /// the upper crates' errors ask their source.
    pub fn is_peer_gone(&self) -> bool {
        self.fault() == Fault::PeerGone
    }

    /// Wraps an [`io::Error`] with the name of the operation that failed.
    pub fn io(op: &'static str, source: io::Error) -> Self {
        Error::Io { op, source }
    }

    pub(crate) fn nix(op: &'static str, e: nix::Error) -> Self {
        Error::Io {
            op,
            source: io::Error::from_raw_os_error(e as i32),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::WouldBlock => io::ErrorKind::WouldBlock,
            Error::PeerGone => io::ErrorKind::BrokenPipe,
            Error::Timeout | Error::PeerUnresponsive(_) => io::ErrorKind::TimedOut,
            Error::Io { source, .. } => source.kind(),
            Error::MalformedHandshake(_) | Error::PeerMisbehaved(_) => io::ErrorKind::InvalidData,
            Error::InvalidConfig(_) | Error::InvalidUri { .. } => io::ErrorKind::InvalidInput,
            Error::AuthFailed => io::ErrorKind::PermissionDenied,
            Error::Rejected(_) | Error::PeerUnavailable(_) => io::ErrorKind::ConnectionRefused,
            Error::LimitExceeded { .. } => io::ErrorKind::QuotaExceeded,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}
