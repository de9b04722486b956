//! The `verbs` provider (cargo feature `verbs`): rrpc-core's calls mapped one
//! to one onto libibverbs through the `rdma-sys` bindings.
//!
//! **Tested on soft-RoCE (rdma_rxe) in a VM; not run on an RDMA NIC.** The
//! development machines have no RDMA hardware and no kernel RDMA support, so
//! `cargo xtask rxe` boots a throwaway qemu VM with soft-RoCE (`rxe0`) and
//! runs the conformance suite, the two-process tests and the ring, poller and
//! tonic tests on it. On the host, what is tested is everything short of the
//! device: the work requests, completions and queue-pair attribute sets built
//! by [`wr`], the endpoint codec, the send-queue accounting and pre-checks,
//! the TCP side channel, the ABI of the hand-written `rdma-sys` structures
//! against the C headers, and that opening a fabric without a device is an
//! error, not a panic.
//!
//! | rrpc-core | libibverbs |
//! |---|---|
//! | `Fabric::verbs` | `ibv_get_device_list`, `ibv_open_device`, `ibv_alloc_pd`, `ibv_query_port`, `ibv_query_gid` |
//! | `Fabric::alloc_region` | `mmap` (memfd, huge pages when possible) + `ibv_reg_mr` (LOCAL_WRITE \| REMOTE_WRITE \| REMOTE_READ) |
//! | `Fabric::create_qp` | per side `ibv_create_comp_channel` + `ibv_create_cq`; `ibv_create_qp` (RC); `ibv_modify_qp` → INIT |
//! | handshake attach | `ibv_modify_qp` → RTR (peer LID/QPN/PSN/GID) → RTS |
//! | `post_write` / `post_write_imm` / `post_read` | `ibv_post_send` (`IBV_WR_RDMA_WRITE` / `_WITH_IMM` / `IBV_WR_RDMA_READ`) |
//! | `post_recv` | `ibv_post_recv`, no SGEs |
//! | `poll` | `ibv_poll_cq` |
//! | `req_notify` / `channel_fd` / `ack_events` | `ibv_req_notify_cq` / `ibv_comp_channel::fd` / `ibv_get_cq_event` + `ibv_ack_cq_events` |
//! | `fail` | `ibv_modify_qp` → ERR |
//!
//! Each completion queue has its own completion channel, so the send and the
//! receive queue can be waited on separately, as with shm.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are
//! `static inline` in `verbs.h` (calls through `context->ops`); `rdma-sys`
//! re-implements them in Rust the same way, which is what we call.

mod caps;
mod device;
pub(crate) mod endpoint;
mod qp;
pub(crate) mod side;
pub(crate) mod wr;

#[cfg(test)]
mod abi;

pub(crate) use caps::DEFAULT_PORT;
pub(crate) use device::{Device, Mr};
pub(crate) use qp::{VerbsCq, VerbsQp};

#[cfg(test)]
mod tests {
    use crate::{Endpoint, Error, Fabric, ProviderKind, QpConfig};

    /// Whether the kernel lists any RDMA device (what libibverbs enumerates).
    fn host_has_rdma_device() -> bool {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
    }

    #[test]
    fn opening_the_fabric_matches_the_host() {
        let r = Fabric::verbs(None);
        if host_has_rdma_device() {
            // On an RDMA machine: the whole setup path, short of a peer.
            let f = r.expect("device listed by the kernel opens");
            assert_eq!(f.kind(), ProviderKind::Verbs);
            assert!(f.device_name().is_some());
            let region = f.alloc_region(4096).expect("ibv_reg_mr");
            assert!(region.verbs_mr().is_some());
            let qp = f.create_qp(&QpConfig::default()).expect("ibv_create_qp");
            assert!(matches!(qp.post_recv(1), Ok(()) | Err(Error::Io { .. })));
        } else {
            // Here: a typed error naming the cause, not a panic.
            let e = r.expect_err("no device here");
            assert!(
                matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
            );
            assert!(e.to_string().contains("no RDMA device found"), "{e}");
            let ep = Endpoint::parse("rdma://127.0.0.1:7").unwrap();
            assert!(Fabric::for_endpoint(&ep).is_err());
        }
        let e = Fabric::verbs(Some("no-such-device-rrpc")).expect_err("unknown name");
        assert!(e.to_string().contains("no RDMA device found"), "{e}");
    }
}
