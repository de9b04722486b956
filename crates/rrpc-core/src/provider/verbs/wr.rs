//! Pure translation between rrpc-core's words and libibverbs structures:
//! send work requests (`ibv_send_wr` + `ibv_sge`), receive work requests
//! (`ibv_recv_wr`), work completions (`ibv_wc` → [`Completion`]) and the queue
//! pair attribute sets of the INIT → RTR → RTS transitions (`ibv_qp_attr` +
//! mask).
//!
//! Nothing here touches a device, so every function is unit-tested on machines
//! without RDMA hardware. Pointers inside the produced structures (`sg_list`,
//! `next`) are left null; the caller links them at the FFI edge, immediately
//! before `ibv_post_send` / `ibv_post_recv`.
// The workspace denies `unsafe`; this module builds work requests that libibverbs reads, so it
// allows it, with a SAFETY argument on every block.
#![allow(unsafe_code)]

use rdma_sys::{
    ibv_access_flags, ibv_ah_attr, ibv_gid, ibv_global_route, ibv_mtu, ibv_qp_attr,
    ibv_qp_attr_mask, ibv_qp_state, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc,
    ibv_wc_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode, imm_data_invalidated_rkey_union_t,
    rdma_t, wr_t,
};

use crate::settings::RcRetry;
use crate::work::{Completion, Opcode, Status};

use super::qp_address::QpAddress;

/// Outstanding RDMA READs we accept as responder and issue as requester.
pub(crate) const RD_ATOMIC: u8 = 16;
/// Largest message an RC work request may carry (2^31 bytes, the IB limit).
pub(crate) const MAX_MESSAGE: u64 = 1 << 31;

/// The operation of one send work request.
pub(crate) use crate::work::SendOp as Op;

impl Op {
    /// The completion opcode reported for this operation.
    pub(crate) fn opcode(self) -> Opcode {
        match self {
            Op::Write => Opcode::Write,
            Op::WriteImm(_) => Opcode::WriteImm,
            Op::Read => Opcode::Read,
        }
    }
}

/// One checked send work request, in rrpc-core's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkRequest {
    /// The identifier the device reports back in `ibv_wc::wr_id`.
    pub(crate) wr_id: u64,
    /// What to do.
    pub(crate) op: Op,
    /// Virtual address of the local bytes (inside a registered region).
    pub(crate) local_addr: u64,
    /// Number of bytes.
    pub(crate) len: u32,
    /// `lkey` of the local region's memory registration.
    pub(crate) lkey: u32,
    /// Peer virtual address.
    pub(crate) remote_addr: u64,
    /// Peer's remote key.
    pub(crate) rkey: u32,
    /// Whether to request a completion (`IBV_SEND_SIGNALED`).
    pub(crate) signaled: bool,
}

/// Builds the `ibv_send_wr` and its single `ibv_sge` for `req`.
///
/// * opcode: `IBV_WR_RDMA_WRITE`, `IBV_WR_RDMA_WRITE_WITH_IMM` or `IBV_WR_RDMA_READ`;
/// * `send_flags`: `IBV_SEND_SIGNALED` when signaled, `IBV_SEND_INLINE` for a
///   non-empty WRITE of at most `max_inline` bytes (never for READ);
/// * `imm_data` in network byte order;
/// * `num_sge` is 1, or 0 for a zero-length request (a zero `sge.length`
///   means 2 GiB to some HCAs);
/// * `sg_list` and `next` are null: the caller points `sg_list` at the
///   returned `ibv_sge` right before posting.
pub(crate) fn build_send_wr(req: &WorkRequest, max_inline: u32) -> (ibv_send_wr, ibv_sge) {
    let sge = ibv_sge {
        addr: req.local_addr,
        length: req.len,
        lkey: req.lkey,
    };
    let (opcode, imm_be) = match req.op {
        Op::Write => (ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0),
        Op::WriteImm(imm) => (ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, imm.to_be()),
        Op::Read => (ibv_wr_opcode::IBV_WR_RDMA_READ, 0),
    };
    let mut flags = 0;
    if req.signaled {
        flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if req.op != Op::Read && req.len > 0 && req.len <= max_inline {
        flags |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    // SAFETY: `ibv_send_wr` is a C struct of integers, raw pointers and unions
    // of those; the all-zero bit pattern is a valid value of every field (null
    // pointers, zero integers), exactly what `memset(&wr, 0, sizeof wr)` gives in C.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = req.wr_id;
    wr.next = std::ptr::null_mut();
    wr.sg_list = std::ptr::null_mut();
    wr.num_sge = i32::from(req.len > 0);
    wr.opcode = opcode;
    wr.send_flags = flags;
    wr.imm_data_invalidated_rkey_union = imm_data_invalidated_rkey_union_t { imm_data: imm_be };
    wr.wr = wr_t {
        rdma: rdma_t {
            remote_addr: req.remote_addr,
            rkey: req.rkey,
        },
    };
    (wr, sge)
}

/// Builds the `ibv_recv_wr` of [`crate::QueuePair::post_recv`]: no scatter
/// entries (a WRITE_WITH_IMM consumes a receive but places its data by RDMA),
/// `sg_list` and `next` null.
pub(crate) fn build_recv_wr(wr_id: u64) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
    }
}

/// The fields of an `ibv_wc` rrpc-core uses, copied out of the C struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wc {
    /// `wr_id`.
    pub(crate) wr_id: u64,
    /// `status` (`ibv_wc_status`).
    pub(crate) status: u32,
    /// `opcode` (`ibv_wc_opcode`); valid only on success.
    pub(crate) opcode: u32,
    /// `byte_len`.
    pub(crate) byte_len: u32,
    /// `imm_data`, network byte order, valid when `wc_flags & IBV_WC_WITH_IMM`.
    pub(crate) imm_be: u32,
    /// `wc_flags`.
    pub(crate) wc_flags: u32,
}

impl Wc {
    /// Copies the fields out of a completion the device wrote.
    pub(crate) fn from_ffi(wc: &ibv_wc) -> Wc {
        Wc {
            wr_id: wc.wr_id,
            status: wc.status,
            opcode: wc.opcode,
            byte_len: wc.byte_len,
            // SAFETY: both members of the union are `u32`; every bit pattern is
            // a valid value of either, so reading `imm_data` is always defined.
            imm_be: unsafe { wc.imm_data_invalidated_rkey_union.imm_data },
            wc_flags: wc.wc_flags,
        }
    }
}

/// Maps an `ibv_wc_status` to [`Status`].
pub(crate) fn map_status(status: u32) -> Status {
    match status {
        ibv_wc_status::IBV_WC_SUCCESS => Status::Success,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR
        | ibv_wc_status::IBV_WC_LOC_QP_OP_ERR
        | ibv_wc_status::IBV_WC_LOC_PROT_ERR
        | ibv_wc_status::IBV_WC_LOC_ACCESS_ERR => Status::LocalError,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR => Status::RemoteAccessError,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => Status::Flushed,
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR => Status::RetryExceeded,
        ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => Status::RnrRetryExceeded,
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => Status::RemoteInvalidRequest,
        ibv_wc_status::IBV_WC_REM_OP_ERR => Status::RemoteOperationError,
        _ => Status::Fatal,
    }
}

/// Maps a send-queue completion to a [`Completion`].
///
/// `posted` is what the queue pair recorded for the work request
/// (`(caller's wr_id, operation)`), found from `wc.wr_id`: the device's opcode
/// is undefined for failed completions and does not tell WRITE from
/// WRITE_WITH_IMM, so the recorded operation wins.
pub(crate) fn send_completion(wc: &Wc, posted: (u64, Op)) -> Completion {
    Completion {
        wr_id: posted.0,
        status: map_status(wc.status),
        opcode: posted.1.opcode(),
        byte_len: wc.byte_len,
        imm: None,
    }
}

/// Maps a receive-queue completion (a peer's WRITE_WITH_IMM consumed one of
/// our receives, or a receive was flushed) to a [`Completion`]. The immediate
/// is converted from network byte order.
pub(crate) fn recv_completion(wc: &Wc) -> Completion {
    let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    Completion {
        wr_id: wc.wr_id,
        status: map_status(wc.status),
        opcode: Opcode::RecvImm,
        byte_len: wc.byte_len,
        imm: with_imm.then(|| u32::from_be(wc.imm_be)),
    }
}

/// Whether a send-side wc reports the opcode we expect (a consistency check
/// for successful completions; failed ones carry no valid opcode).
pub(crate) fn wc_opcode_matches(wc: &Wc, op: Op) -> bool {
    if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
        return true;
    }
    match op {
        Op::Write | Op::WriteImm(_) => wc.opcode == ibv_wc_opcode::IBV_WC_RDMA_WRITE,
        Op::Read => wc.opcode == ibv_wc_opcode::IBV_WC_RDMA_READ,
    }
}

/// One `ibv_modify_qp` call: the attributes and the mask naming the ones set.
pub(crate) struct Transition {
    /// The attributes.
    pub(crate) attr: ibv_qp_attr,
    /// `ibv_qp_attr_mask` bits.
    pub(crate) mask: u32,
}

impl std::fmt::Debug for Transition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transition")
            .field("qp_state", &self.attr.qp_state)
            .field("mask", &format_args!("{:#x}", self.mask))
            .finish_non_exhaustive()
    }
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` holds integers and `ibv_ah_attr` (integers and the
    // `ibv_gid` byte union); all-zero is a valid value of each, as `memset` in C.
    unsafe { std::mem::zeroed() }
}

/// Access rights granted to the peer on this queue pair.
pub(crate) const ACCESS: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;

/// The `ibv_reg_mr` flags of a region: local write always (READ
/// destinations, receive buffers), remote write and read as `access` says.
pub(crate) fn mr_access(access: crate::region::Access) -> u32 {
    let mut f = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if access.remote_write {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.remote_read {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f
}

/// RESET → INIT: `port`, partition key 0, remote WRITE and READ allowed.
pub(crate) fn init_transition(port: u8) -> Transition {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port;
    attr.qp_access_flags = ACCESS;
    Transition {
        attr,
        mask: ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ibv_qp_attr_mask::IBV_QP_PORT.0
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0,
    }
}

/// INIT → RTR: the path to the peer (`dlid`, and a GRH with `dgid` when the
/// peer has a GID — always on RoCE), its QPN and starting PSN.
///
/// `path_mtu` is the smaller of the two ports' active MTUs (an `ibv_mtu`
/// code, checked by [`super::qp_address::path_mtu`]); `port` and `sgid_index`
/// are ours (the port the queue pair was initialised on, the GID our
/// endpoint carries).
pub(crate) fn rtr_transition(
    peer: &QpAddress,
    path_mtu: u32,
    port: u8,
    sgid_index: u8,
    retry: RcRetry,
) -> Transition {
    debug_assert!(
        (ibv_mtu::IBV_MTU_256..=ibv_mtu::IBV_MTU_4096).contains(&path_mtu),
        "path MTU code {path_mtu}"
    );
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
    attr.path_mtu = path_mtu;
    attr.dest_qp_num = peer.qpn;
    attr.rq_psn = peer.psn;
    attr.max_dest_rd_atomic = RD_ATOMIC;
    attr.min_rnr_timer = retry.min_rnr_timer();
    let global = peer.gid != [0; 16];
    attr.ah_attr = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: peer.gid },
            flow_label: 0,
            sgid_index,
            hop_limit: if global { 1 } else { 0 },
            traffic_class: 0,
        },
        dlid: peer.lid,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(global),
        port_num: port,
    };
    Transition {
        attr,
        mask: ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_AV.0
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0,
    }
}

/// RTR → RTS: our starting PSN, ACK timeout and retry counts.
pub(crate) fn rts_transition(our_psn: u32, retry: RcRetry) -> Transition {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
    attr.sq_psn = our_psn & 0x00ff_ffff;
    attr.timeout = retry.ack_timeout();
    attr.retry_cnt = retry.retry_count();
    attr.rnr_retry = retry.rnr_retry();
    attr.max_rd_atomic = RD_ATOMIC;
    Transition {
        attr,
        mask: ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0,
    }
}

/// Any state → ERR (flushes outstanding work requests), for [`crate::QueuePair::fail`].
pub(crate) fn err_transition() -> Transition {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
    Transition {
        attr,
        mask: ibv_qp_attr_mask::IBV_QP_STATE.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: Op, len: u32, signaled: bool) -> WorkRequest {
        WorkRequest {
            wr_id: 0xdead_beef_0000_0042,
            op,
            local_addr: 0x7f00_1234_5000,
            len,
            lkey: 0x1111,
            remote_addr: 0x5555_0000_0040,
            rkey: 0x2222,
            signaled,
        }
    }

    fn remote(wr: &ibv_send_wr) -> (u64, u32) {
        // SAFETY: test helper; `build_send_wr` always writes the `rdma` member.
        let r = unsafe { wr.wr.rdma };
        (r.remote_addr, r.rkey)
    }

    fn imm(wr: &ibv_send_wr) -> u32 {
        // SAFETY: both union members are u32.
        unsafe { wr.imm_data_invalidated_rkey_union.imm_data }
    }

    #[test]
    fn write_wr_has_opcode_sge_remote_and_no_links() {
        let (wr, sge) = build_send_wr(&req(Op::Write, 4096, true), 64);
        assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!(wr.wr_id, 0xdead_beef_0000_0042);
        assert!(wr.next.is_null());
        assert!(wr.sg_list.is_null());
        assert_eq!(wr.num_sge, 1);
        assert_eq!(wr.send_flags, ibv_send_flags::IBV_SEND_SIGNALED.0);
        assert_eq!(remote(&wr), (0x5555_0000_0040, 0x2222));
        assert_eq!(imm(&wr), 0);
        assert_eq!(
            (sge.addr, sge.length, sge.lkey),
            (0x7f00_1234_5000, 4096, 0x1111)
        );
    }

    #[test]
    fn write_imm_carries_the_immediate_in_network_order() {
        let (wr, _) = build_send_wr(&req(Op::WriteImm(0x0102_0304), 128, false), 64);
        assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(imm(&wr).to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(u32::from_be(imm(&wr)), 0x0102_0304);
        assert_eq!(wr.send_flags, 0, "unsignaled and above max_inline");
    }

    #[test]
    fn read_is_never_inline() {
        let (wr, sge) = build_send_wr(&req(Op::Read, 8, true), 64);
        assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_READ);
        assert_eq!(wr.send_flags, ibv_send_flags::IBV_SEND_SIGNALED.0);
        assert_eq!(sge.length, 8);
        assert_eq!(remote(&wr), (0x5555_0000_0040, 0x2222));
    }

    #[test]
    fn inline_exactly_up_to_max_inline() {
        let inline = ibv_send_flags::IBV_SEND_INLINE.0;
        let signaled = ibv_send_flags::IBV_SEND_SIGNALED.0;
        for (op, len, max, want) in [
            (Op::Write, 64, 64, inline),
            (Op::Write, 65, 64, 0),
            (Op::Write, 1, 64, inline),
            (Op::Write, 8, 0, 0),
            (Op::WriteImm(7), 64, 64, inline),
            (Op::WriteImm(7), 65, 64, 0),
            (Op::Read, 1, 64, 0),
        ] {
            let (wr, _) = build_send_wr(&req(op, len, false), max);
            assert_eq!(wr.send_flags, want, "{op:?} len {len} max {max}");
            let (wr, _) = build_send_wr(&req(op, len, true), max);
            assert_eq!(wr.send_flags, want | signaled, "{op:?} len {len} signaled");
        }
    }

    #[test]
    fn zero_length_request_has_no_sge() {
        let (wr, _) = build_send_wr(&req(Op::WriteImm(9), 0, true), 64);
        assert_eq!(wr.num_sge, 0);
        assert_eq!(
            wr.send_flags,
            ibv_send_flags::IBV_SEND_SIGNALED.0,
            "an empty write is not inline"
        );
    }

    #[test]
    fn recv_wr_has_no_sges() {
        let wr = build_recv_wr(77);
        assert_eq!(wr.wr_id, 77);
        assert_eq!(wr.num_sge, 0);
        assert!(wr.sg_list.is_null());
        assert!(wr.next.is_null());
    }

    fn wc(status: u32, opcode: u32, flags: u32, imm_be: u32) -> ibv_wc {
        ibv_wc {
            wr_id: 5,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 100,
            imm_data_invalidated_rkey_union: imm_data_invalidated_rkey_union_t { imm_data: imm_be },
            qp_num: 1,
            src_qp: 2,
            wc_flags: flags,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    #[test]
    fn status_codes_map() {
        use ibv_wc_status::*;
        let cases = [
            (IBV_WC_SUCCESS, Status::Success),
            (IBV_WC_LOC_LEN_ERR, Status::LocalError),
            (IBV_WC_LOC_QP_OP_ERR, Status::LocalError),
            (IBV_WC_LOC_PROT_ERR, Status::LocalError),
            (IBV_WC_LOC_ACCESS_ERR, Status::LocalError),
            (IBV_WC_REM_ACCESS_ERR, Status::RemoteAccessError),
            (IBV_WC_WR_FLUSH_ERR, Status::Flushed),
            (IBV_WC_RETRY_EXC_ERR, Status::RetryExceeded),
            (IBV_WC_RNR_RETRY_EXC_ERR, Status::RnrRetryExceeded),
            (IBV_WC_REM_INV_REQ_ERR, Status::RemoteInvalidRequest),
            (IBV_WC_REM_OP_ERR, Status::RemoteOperationError),
            (IBV_WC_FATAL_ERR, Status::Fatal),
            (IBV_WC_GENERAL_ERR, Status::Fatal),
            (9999, Status::Fatal),
        ];
        for (code, want) in cases {
            assert_eq!(map_status(code), want, "status {code}");
        }
    }

    #[test]
    fn send_completion_uses_recorded_wr_id_and_op() {
        let w = Wc::from_ffi(&wc(
            ibv_wc_status::IBV_WC_SUCCESS,
            ibv_wc_opcode::IBV_WC_RDMA_WRITE,
            0,
            0,
        ));
        let c = send_completion(&w, (1234, Op::WriteImm(1)));
        assert_eq!(
            c,
            Completion {
                wr_id: 1234,
                status: Status::Success,
                opcode: Opcode::WriteImm,
                byte_len: 100,
                imm: None
            }
        );
        assert!(wc_opcode_matches(&w, Op::Write));
        assert!(!wc_opcode_matches(&w, Op::Read));
        let r = Wc::from_ffi(&wc(
            ibv_wc_status::IBV_WC_SUCCESS,
            ibv_wc_opcode::IBV_WC_RDMA_READ,
            0,
            0,
        ));
        assert_eq!(send_completion(&r, (9, Op::Read)).opcode, Opcode::Read);
        assert!(wc_opcode_matches(&r, Op::Read));
        // A flushed completion carries garbage in `opcode`; the record wins.
        let f = Wc::from_ffi(&wc(ibv_wc_status::IBV_WC_WR_FLUSH_ERR, 0xff, 0, 0));
        let c = send_completion(&f, (3, Op::Read));
        assert_eq!((c.status, c.opcode), (Status::Flushed, Opcode::Read));
        assert!(wc_opcode_matches(&f, Op::Read));
    }

    #[test]
    fn recv_completion_decodes_immediate_from_network_order() {
        let w = Wc::from_ffi(&wc(
            ibv_wc_status::IBV_WC_SUCCESS,
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
            ibv_wc_flags::IBV_WC_WITH_IMM.0,
            0xa1b2_c3d4u32.to_be(),
        ));
        let c = recv_completion(&w);
        assert_eq!(c.wr_id, 5);
        assert_eq!(c.opcode, Opcode::RecvImm);
        assert_eq!(c.imm, Some(0xa1b2_c3d4));
        assert_eq!(c.byte_len, 100);
        let flushed = Wc::from_ffi(&wc(ibv_wc_status::IBV_WC_WR_FLUSH_ERR, 0, 0, 0x55));
        let c = recv_completion(&flushed);
        assert_eq!((c.status, c.imm), (Status::Flushed, None));
    }

    #[test]
    fn init_attributes() {
        let t = init_transition(2);
        assert_eq!(t.attr.qp_state, ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(t.attr.port_num, 2);
        assert_eq!(t.attr.pkey_index, 0);
        assert_eq!(t.attr.qp_access_flags, 1 | 2 | 4);
        use crate::region::Access;
        assert_eq!(mr_access(Access::ALL), 1 | 2 | 4);
        assert_eq!(mr_access(Access::REMOTE_WRITE), 1 | 2);
        assert_eq!(mr_access(Access::LOCAL), 1);
        assert_eq!(
            t.mask,
            1 | 8 | 16 | 32,
            "STATE|ACCESS_FLAGS|PKEY_INDEX|PORT"
        );
    }

    #[test]
    fn rtr_attributes_follow_the_peer() {
        let peer = QpAddress {
            lid: 0x0017,
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            gid: [0; 16],
            mtu: ibv_mtu::IBV_MTU_4096,
        };
        let t = rtr_transition(&peer, ibv_mtu::IBV_MTU_4096, 1, 0, RcRetry::default());
        let a = t.attr;
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(a.path_mtu, ibv_mtu::IBV_MTU_4096);
        assert_eq!(a.dest_qp_num, 0x00ab_cdef);
        assert_eq!(a.rq_psn, 0x0012_3456);
        assert_eq!(a.max_dest_rd_atomic, RD_ATOMIC);
        assert_eq!(a.min_rnr_timer, 12);
        assert_eq!(a.ah_attr.dlid, 0x0017);
        assert_eq!(a.ah_attr.port_num, 1);
        assert_eq!(
            a.ah_attr.is_global, 0,
            "InfiniBand LID routing without a GID"
        );
        use ibv_qp_attr_mask as m;
        let want = m::IBV_QP_STATE.0
            | m::IBV_QP_AV.0
            | m::IBV_QP_PATH_MTU.0
            | m::IBV_QP_DEST_QPN.0
            | m::IBV_QP_RQ_PSN.0
            | m::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | m::IBV_QP_MIN_RNR_TIMER.0;
        assert_eq!(t.mask, want);
        assert_eq!(want, 1 | 128 | 256 | 0x100000 | 0x1000 | 0x20000 | 0x8000);
    }

    #[test]
    fn rtr_with_gid_uses_a_global_route() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 7]);
        let peer = QpAddress {
            lid: 0,
            qpn: 9,
            psn: 1,
            gid,
            mtu: ibv_mtu::IBV_MTU_1024,
        };
        let a = rtr_transition(&peer, ibv_mtu::IBV_MTU_1024, 2, 3, RcRetry::default()).attr;
        assert_eq!(a.path_mtu, ibv_mtu::IBV_MTU_1024);
        assert_eq!(a.ah_attr.is_global, 1);
        // SAFETY: test; `raw` is the member written.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, gid);
        assert_eq!(a.ah_attr.grh.sgid_index, 3);
        assert_eq!(a.ah_attr.port_num, 2);
        assert_eq!(a.ah_attr.grh.hop_limit, 1);
        assert_eq!(
            rtr_transition(&peer, ibv_mtu::IBV_MTU_256, 1, 0, RcRetry::default())
                .attr
                .path_mtu,
            ibv_mtu::IBV_MTU_256
        );
    }

    #[test]
    fn rts_attributes() {
        let t = rts_transition(0xff12_3456, RcRetry::default());
        let a = t.attr;
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTS);
        assert_eq!(a.sq_psn, 0x0012_3456, "PSN is 24 bits");
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 7, 7));
        let custom = RcRetry::builder()
            .ack_timeout(18)
            .retry_count(3)
            .rnr_retry(5)
            .min_rnr_timer(1)
            .build()
            .unwrap();
        let c = rts_transition(1, custom).attr;
        assert_eq!((c.timeout, c.retry_cnt, c.rnr_retry), (18, 3, 5));
        let peer = QpAddress {
            lid: 1,
            qpn: 2,
            psn: 3,
            gid: [0; 16],
            mtu: ibv_mtu::IBV_MTU_1024,
        };
        let r = rtr_transition(&peer, ibv_mtu::IBV_MTU_1024, 1, 0, custom).attr;
        assert_eq!(r.min_rnr_timer, 1);
        assert_eq!(a.max_rd_atomic, RD_ATOMIC);
        assert_eq!(t.mask, 1 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x2000);
        let e = err_transition();
        assert_eq!(e.attr.qp_state, ibv_qp_state::IBV_QPS_ERR);
        assert_eq!(e.mask, 1);
    }
}
