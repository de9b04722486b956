//! Work requests and their completions: the plain data every provider
//! speaks (verbs: the opcode of an `ibv_send_wr`, and `ibv_wc`).
//!
//! A leaf: it imports nothing from the rest of the crate, so the error type,
//! the providers and the public queue types can all build on it. The public
//! types are re-exported from [`crate::cq`].

/// The operation of one send work request, whatever the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendOp {
    /// `IBV_WR_RDMA_WRITE`.
    Write,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM` with this immediate (host order here,
    /// network order on the wire).
    WriteImm(u32),
    /// `IBV_WR_RDMA_READ`.
    Read,
}

/// How a work request ended (verbs: `ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Completed successfully (`IBV_WC_SUCCESS`).
    Success,
    /// Local protection or length error (`IBV_WC_LOC_PROT_ERR`, `IBV_WC_LOC_LEN_ERR`).
    LocalError,
    /// The remote side refused the access (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccessError,
    /// The work request was flushed because the queue pair failed (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// The peer never acknowledged, after every transport retry
    /// (`IBV_WC_RETRY_EXC_ERR`): it is gone, unreachable, or the fabric lost
    /// packets faster than retries could recover.
    RetryExceeded,
    /// The peer had no receive posted for a WRITE_WITH_IMM, after every RNR
    /// retry (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
    /// The peer rejected the request as invalid (`IBV_WC_REM_INV_REQ_ERR`:
    /// for example longer than it accepts, or an operation its queue pair
    /// does not allow).
    RemoteInvalidRequest,
    /// The peer could not carry out the request (`IBV_WC_REM_OP_ERR`).
    RemoteOperationError,
    /// Injected failure (tests only) or any other device error
    /// (`IBV_WC_FATAL_ERR`, `IBV_WC_GENERAL_ERR`, ...).
    Fatal,
}

impl std::fmt::Display for Status {
    /// What happened, in words an operator can act on (the verbs name in
    /// parentheses).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Success => "success",
            Status::LocalError => "local protection or length error (IBV_WC_LOC_*_ERR)",
            Status::RemoteAccessError => "the peer refused the access (IBV_WC_REM_ACCESS_ERR)",
            Status::Flushed => "flushed: the queue pair had already failed (IBV_WC_WR_FLUSH_ERR)",
            Status::RetryExceeded => {
                "the peer stopped acknowledging: every transport retry ran out \
                 (IBV_WC_RETRY_EXC_ERR; its host is down or unreachable, or the \
                 link lost packets faster than retries recovered them)"
            }
            Status::RnrRetryExceeded => {
                "the peer posted no receive in time, after every RNR retry \
                 (IBV_WC_RNR_RETRY_EXC_ERR)"
            }
            Status::RemoteInvalidRequest => {
                "the peer rejected the request as invalid (IBV_WC_REM_INV_REQ_ERR)"
            }
            Status::RemoteOperationError => {
                "the peer could not carry out the request (IBV_WC_REM_OP_ERR)"
            }
            Status::Fatal => "device error (IBV_WC_FATAL_ERR or another)",
        })
    }
}

/// What kind of work a completion reports (verbs: `ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Opcode {
    /// An RDMA WRITE we posted (`IBV_WC_RDMA_WRITE`).
    Write,
    /// An RDMA WRITE_WITH_IMM we posted (reported as `IBV_WC_RDMA_WRITE` too).
    WriteImm,
    /// An RDMA READ we posted (`IBV_WC_RDMA_READ`).
    Read,
    /// A peer's WRITE_WITH_IMM consumed one of our receives (`IBV_WC_RECV_RDMA_WITH_IMM`).
    RecvImm,
}

/// One entry of a completion queue (verbs: `ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's identifier of the work request (or of the receive, for `RecvImm`).
    pub wr_id: u64,
    /// Outcome.
    pub status: Status,
    /// Kind.
    pub opcode: Opcode,
    /// Bytes transferred.
    pub byte_len: u32,
    /// The 32-bit immediate of a `RecvImm`.
    pub imm: Option<u32>,
}

impl Completion {
    /// An all-zero placeholder, for pre-sizing poll buffers.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: Status::Success,
        opcode: Opcode::Write,
        byte_len: 0,
        imm: None,
    };
}

impl Default for Completion {
    fn default() -> Self {
        Completion::EMPTY
    }
}
