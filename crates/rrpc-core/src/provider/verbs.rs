//! The `verbs` provider (cargo feature `verbs`): rrpc-core's calls mapped one
//! to one onto libibverbs through the `rdma-sys` bindings.
//!
//! **Tested on soft-RoCE (rdma_rxe) in a VM; not run on an RDMA NIC.** The
//! development machines have no RDMA hardware and no kernel RDMA support, so
//! `cargo xtask rxe` boots a throwaway qemu VM with soft-RoCE (`rxe0`) and
//! runs the conformance suite, the two-process tests and the ring, poller and
//! tonic tests on it. On the host, what is tested is everything short of the
//! device: the work requests, completions and queue-pair attribute sets built
//! by [`wr`], the queue-pair address codec ([`qp_address`]), the send-queue accounting and pre-checks,
//! the choices and checks of [`caps`] (GID index, depths, inline size), the
//! TCP side channel and its keep-alive options, the ABI of the hand-written
//! `rdma-sys` structures against the C headers, and that opening a fabric
//! without a device is an error, not a panic.
//!
//! | rrpc-core | libibverbs |
//! |---|---|
//! | `Fabric::verbs` / `Fabric::verbs_with` | `ibv_get_device_list`, `ibv_open_device`, `ibv_alloc_pd`, `ibv_query_device`, `ibv_query_port`, `ibv_query_gid` (+ sysfs GID types) |
//! | `Fabric::alloc_region` | `mmap` (memfd, huge pages when possible) + `ibv_reg_mr` (LOCAL_WRITE \| REMOTE_WRITE \| REMOTE_READ) |
//! | `Fabric::create_qp` | per side `ibv_create_comp_channel` + `ibv_create_cq`; `ibv_create_qp` (RC); `ibv_modify_qp` → INIT |
//! | handshake attach | `ibv_modify_qp` → RTR (peer LID/QPN/PSN/GID, path MTU) → RTS |
//! | `post_write` / `post_write_imm` / `post_read` | `ibv_post_send` (`IBV_WR_RDMA_WRITE` / `_WITH_IMM` / `IBV_WR_RDMA_READ`) |
//! | `post_recv` | `ibv_post_recv`, no SGEs |
//! | `poll` | `ibv_poll_cq` |
//! | `req_notify` / `channel_fd` / `ack_events` | `ibv_req_notify_cq` / `ibv_comp_channel::fd` / `ibv_get_cq_event` + `ibv_ack_cq_events` |
//! | `fail` | `ibv_modify_qp` → ERR |
//!
//! Each completion queue has its own completion channel, so the send and the
//! receive queue can be waited on separately, as with shm.
//!
//! ## Negotiated and checked
//!
//! Negotiated in the handshake (each side's `Hello.endpoint`, see
//! [`qp_address`]):
//!
//! * **Path MTU.** Each queue-pair address carries its port's active MTU
//!   (`ibv_query_port`); both sides move to RTR with the smaller of the two.
//!   An address of the 26-byte layout of earlier versions (no MTU) or with
//!   an MTU code outside 1..=5 is refused as a malformed handshake naming
//!   the length or the code.
//!
//! Chosen when the fabric is opened (`Fabric::verbs_with`, `VerbsOptions`),
//! each bad value an `Error::InvalidConfig` naming what was asked for and
//! what exists:
//!
//! * **Device** by name (default: the first listed; an unknown name lists
//!   the devices there are), **port** (default 1; checked against the
//!   device's `phys_port_cnt`), **GID index** (checked against the port's
//!   `gid_tbl_len` and refused for an empty entry; default on RoCE: the
//!   first IPv4-mapped GID, `::ffff:a.b.c.d`, whose sysfs type is `RoCE v2`,
//!   else 0; on InfiniBand 0). The port's active MTU must be an `ibv_mtu`
//!   code.
//!
//! Checked when a queue pair is created (`Fabric::create_qp`), naming the
//! configured value and the device's:
//!
//! * **Send depth** against `max_qp_wr` and `max_cqe` (its completion queue);
//! * **receive depth** (rounded up to a power of two) against `max_qp_wr`
//!   and `max_cqe`;
//! * **inline size** (`QpConfig::max_inline`): libibverbs reports no
//!   maximum, so when `ibv_create_qp` refuses the size asked for but takes
//!   a queue pair without inline data, the largest accepted size is found by
//!   bisection; an explicit size is then an error naming both, the default
//!   (64 bytes) falls back to that largest size.
//!
//! Not negotiated: the RDMA READ depth (`max_rd_atomic` /
//! `max_dest_rd_atomic`, fixed at 16 on both sides), the partition key
//! (index 0) and the service level (0).
//!
//! ## Dead remote hosts
//!
//! The TCP side channel stays open as the connection's liveness signal. A
//! peer process that exits is seen at once (its kernel closes the socket);
//! a peer *host* that dies or drops off the network sends nothing, so both
//! ends set TCP keep-alive and `TCP_USER_TIMEOUT` on it
//! (`HandshakeConfig::keepalive`): by default the socket fails within
//! **16 s** of the peer's last segment (10 s idle, then 3 probes 2 s apart;
//! the same bound for data left unacknowledged), and the connection reports
//! `Error::PeerGone` and fails its queue pair.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are
//! `static inline` in `verbs.h` (calls through `context->ops`); `rdma-sys`
//! re-implements them in Rust the same way, which is what we call.

mod caps;
mod device;
mod qp;
pub(crate) mod qp_address;
pub(crate) mod side;
pub(crate) mod wr;

#[cfg(test)]
mod abi;

pub(crate) use device::{Device, alloc_region};
pub(crate) use qp::{LaterRegions, VerbsCq, VerbsQp};

#[cfg(test)]
mod tests {
    use crate::{Error, Fabric, FabricAddr, ProviderKind, QpConfig};

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
            assert!(super::device::mr_of(&region).is_some());
            let qp = f.create_qp(&QpConfig::default()).expect("ibv_create_qp");
            assert!(matches!(qp.post_recv(1), Ok(()) | Err(Error::Io { .. })));
        } else {
            // Here: a typed error naming the cause, not a panic.
            let e = r.expect_err("no device here");
            assert!(
                matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
            );
            assert!(e.to_string().contains("no RDMA device found"), "{e}");
            let ep = FabricAddr::parse("rdma://127.0.0.1:7").unwrap();
            assert!(Fabric::for_endpoint(&ep).is_err());
        }
        let e = Fabric::verbs(Some("no-such-device-rrpc")).expect_err("unknown name");
        assert!(e.to_string().contains("no RDMA device found"), "{e}");
    }

    /// `RRPC_TEST_DEVICE` (set by `cargo xtask rxe`), or `None` after saying
    /// the test is skipped.
    fn test_device() -> Option<String> {
        let d = std::env::var("RRPC_TEST_DEVICE")
            .ok()
            .filter(|d| !d.is_empty());
        if d.is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
        }
        d
    }

    /// The first IPv4-mapped RoCE v2 GID of `dev`'s `port` as sysfs lists
    /// it — the default's rule, written independently of `caps`.
    fn sysfs_preferred_gid(dev: &str, port: u8) -> Option<u8> {
        let base = format!("/sys/class/infiniband/{dev}/ports/{port}");
        (0u8..=255).find(|i| {
            let gid = std::fs::read_to_string(format!("{base}/gids/{i}")).unwrap_or_default();
            let ty =
                std::fs::read_to_string(format!("{base}/gid_attrs/types/{i}")).unwrap_or_default();
            gid.trim().starts_with("0000:0000:0000:0000:0000:ffff:") && ty.trim() == "RoCE v2"
        })
    }

    fn config_error(r: crate::Result<Fabric>) -> String {
        match r {
            Err(e @ Error::InvalidConfig(_)) => e.to_string(),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn device_port_and_gid_index_are_chosen_and_checked() {
        let Some(dev) = test_device() else { return };
        let opts = crate::VerbsOptions::builder()
            .device(dev.clone())
            .build()
            .unwrap();
        let f = Fabric::verbs_with(&opts).expect("open the test device");
        let (port, gid_index) = f.verbs_port().unwrap();
        assert_eq!(port, 1);
        let want = sysfs_preferred_gid(&dev, 1).unwrap_or(0);
        assert_eq!(gid_index, want, "default GID index on {dev}");
        if std::env::var_os("RRPC_RXE_VM").is_some() {
            // The VM gives rxe0 10.99.0.1: GID 1 is ::ffff:10.99.0.1, RoCE v2.
            assert_eq!(gid_index, 1, "the IPv4-mapped GID of the VM's rxe0");
        }
        let d = f.domain().verbs_device().unwrap();
        assert_eq!(d.port().gid_index, gid_index);
        assert_eq!(
            super::caps::is_ipv4_mapped(&d.port().gid),
            sysfs_preferred_gid(&dev, 1).is_some()
        );
        // An explicit index is used as given.
        let f0 = Fabric::verbs_with(&opts.to_builder().gid_index(0).build().unwrap()).unwrap();
        assert_eq!(f0.verbs_port(), Some((1, 0)));
        // Bad values name what was asked and what exists.
        let ports = d.caps().phys_port_cnt;
        for bad in [0, ports + 1] {
            let e = config_error(Fabric::verbs_with(
                &opts.to_builder().port(bad).build().unwrap(),
            ));
            assert!(
                e.contains(&format!(
                    "port {bad} out of device {dev}'s ports 1..={ports}"
                )),
                "{e}"
            );
        }
        let e = config_error(Fabric::verbs_with(
            &opts.to_builder().gid_index(255).build().unwrap(),
        ));
        assert!(e.contains("gid index 255"), "{e}");
        assert!(
            e.contains("out of the port's table of") || e.contains("is an empty entry"),
            "{e}"
        );
    }

    #[test]
    fn queue_pair_sizes_are_checked_against_the_device() {
        let Some(dev) = test_device() else { return };
        let f = Fabric::verbs(Some(&dev)).unwrap();
        let caps = f.domain().verbs_device().unwrap().caps();
        if caps.max_qp_wr < 65536 {
            let cfg = QpConfig::builder().send_depth(65536).build().unwrap();
            let e = f.create_qp(&cfg).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
            assert!(
                e.to_string().contains(&format!(
                    "send_depth 65536 exceeds device {dev}'s max_qp_wr of {}",
                    caps.max_qp_wr
                )),
                "{e}"
            );
            let cfg = QpConfig::builder().recv_depth(65536).build().unwrap();
            let e = f.create_qp(&cfg).unwrap_err().to_string();
            assert!(e.contains("recv_depth"), "{e}");
            assert!(
                e.contains(&format!("max_qp_wr of {}", caps.max_qp_wr)),
                "{e}"
            );
        }
        // Exactly at the limit (depths are at most 65536 in QpConfig).
        let at = caps.max_qp_wr.min(caps.max_cqe).min(65536);
        let cfg = QpConfig::builder()
            .send_depth(at)
            .recv_depth(at)
            .build()
            .unwrap();
        if at.is_power_of_two() {
            f.create_qp(&cfg).expect("depths at the device's limit");
        }
    }

    #[test]
    fn inline_size_is_checked_and_the_maximum_named() {
        let Some(dev) = test_device() else { return };
        let f = Fabric::verbs(Some(&dev)).unwrap();
        let inline = |qp: &crate::QueuePair| match &qp.inner {
            crate::provider::Qp::Verbs(v) => v.max_inline(),
            _ => unreachable!(),
        };
        // The default asks for 64 and gets at least that on rxe and NICs.
        let qp = f.create_qp(&QpConfig::default()).unwrap();
        assert!(inline(&qp) >= crate::qp::DEFAULT_INLINE, "{}", inline(&qp));
        let big = crate::qp::MAX_INLINE_REQUEST;
        match f.create_qp(&QpConfig::builder().max_inline(big).build().unwrap()) {
            Ok(qp) => assert!(inline(&qp) >= big),
            Err(e) => {
                let m = e.to_string();
                assert!(matches!(e, Error::InvalidConfig(_)), "{m}");
                let prefix =
                    format!("max_inline {big} bytes exceeds what device {dev} accepts: at most ");
                let most: u32 = m
                    .split_once(&prefix)
                    .and_then(|(_, rest)| rest.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("no maximum named in {m:?}"));
                eprintln!("{dev}: at most {most} inline bytes");
                // The maximum named is right: it works, one more does not.
                let qp = f
                    .create_qp(&QpConfig::builder().max_inline(most).build().unwrap())
                    .expect("the maximum the error named");
                assert!(inline(&qp) >= most);
                assert!(
                    f.create_qp(&QpConfig::builder().max_inline(most + 1).build().unwrap())
                        .is_err()
                );
            }
        }
    }

    /// A loopback connection on the device: the keep-alive options are set
    /// on both ends' side channels (the client's through `conn::connect`),
    /// and the negotiated path carries a WRITE.
    #[test]
    fn loopback_connection_has_keepalive_on_both_side_channels() {
        use nix::sys::socket::{getsockopt, sockopt};
        let Some(dev) = test_device() else { return };
        let f = Fabric::verbs(Some(&dev)).unwrap();
        let (c, s, inbox) = connect_on(&f, f.clone());
        let src = f.alloc_region(4096).unwrap();
        src.write_at(0, b"mtu").unwrap();
        for (who, conn) in [("client", &c), ("server", &s)] {
            let fd = conn
                .liveness_fd()
                .expect("a connection of its own has a side channel");
            let got = (
                getsockopt(&fd, sockopt::KeepAlive).unwrap(),
                getsockopt(&fd, sockopt::TcpKeepIdle).unwrap(),
                getsockopt(&fd, sockopt::TcpKeepInterval).unwrap(),
                getsockopt(&fd, sockopt::TcpKeepCount).unwrap(),
                getsockopt(&fd, sockopt::TcpUserTimeout).unwrap(),
            );
            assert_eq!(got, (true, 10, 2, 3, 16_000), "{who}");
        }
        let remote = c.peer().region(1).unwrap();
        c.qp()
            .post_write(1, crate::Local::new(&src, 0, 3), remote.at(0), true)
            .unwrap();
        assert_eq!(wait_one(&c).status, crate::Status::Success);
        let mut got = [0u8; 3];
        inbox.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"mtu");
    }

    /// One loopback connection whose server side (inbox region and queue
    /// pair) comes from `server`; returns (client connection, server
    /// connection, the server's inbox).
    fn connect_on(
        client: &Fabric,
        server: Fabric,
    ) -> (
        crate::conn::Connection,
        crate::conn::Connection,
        std::sync::Arc<crate::Region>,
    ) {
        use crate::conn::{self, HandshakeConfig, Offer};
        let any = FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
        let l = conn::Listener::bind(&any, HandshakeConfig::default()).unwrap();
        let ep = FabricAddr::Rdma(l.local_addr().unwrap());
        let t = std::thread::spawn(move || {
            let inbox = server
                .alloc_region_with(4096, crate::Access::REMOTE_WRITE)
                .unwrap();
            let c = l
                .accept()
                .unwrap()
                .accept(
                    server.create_qp(&QpConfig::default()).unwrap(),
                    Offer::new().grant(1, inbox.clone()),
                )
                .unwrap();
            (c, inbox)
        });
        let c = conn::connect(
            &ep,
            client.create_qp(&QpConfig::default()).unwrap(),
            Offer::new(),
            &HandshakeConfig::default(),
        )
        .unwrap();
        let (s, inbox) = t.join().unwrap();
        (c, s, inbox)
    }

    fn wait_one(c: &crate::conn::Connection) -> crate::Completion {
        let mut wc = [crate::Completion::EMPTY; 1];
        let t = std::time::Instant::now();
        while c.qp().send_cq().poll(&mut wc).unwrap() == 0 {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(60),
                "no completion"
            );
            std::thread::yield_now();
        }
        wc[0]
    }

    /// Each peer reaches only the memory granted to it: a peer holding two
    /// connections to one server writes, on its second connection's queue pair,
    /// with the address and key the server granted its first (what a peer that
    /// kept an old key, or guessed one, does; the post skips our library's own
    /// grant check, as a hostile peer's code would). With each connection's
    /// resources in a protection domain of its own (`Fabric::isolated`), the
    /// NIC refuses it (`RemoteAccessError`) and the first connection's inbox is
    /// untouched and still works. The control: with one protection domain for
    /// both, the same write lands, so the test can tell the two apart.
    #[test]
    fn another_connections_key_touches_nothing_with_isolated_domains() {
        let Some(dev) = test_device() else { return };
        let f = Fabric::verbs(Some(&dev)).unwrap();
        let src = f.alloc_region(4096).unwrap();
        src.write_at(0, b"evil").unwrap();
        for isolated in [true, false] {
            let server = |f: &Fabric| {
                if isolated {
                    f.isolated().unwrap()
                } else {
                    f.clone()
                }
            };
            let (c1, _s1, inbox1) = connect_on(&f, server(&f));
            let (c2, _s2, _inbox2) = connect_on(&f, server(&f));
            let key1 = c1.peer().region(1).unwrap();
            let qp2 = super::side::verbs_qp(c2.qp()).unwrap();
            qp2.post_write_ungranted(7, crate::Local::new(&src, 0, 4), key1.at(0))
                .unwrap();
            let wc = wait_one(&c2);
            let mut got = [0u8; 4];
            inbox1.read_at(0, &mut got).unwrap();
            if isolated {
                assert_eq!(wc.status, crate::Status::RemoteAccessError, "isolated");
                assert_eq!(got, [0; 4], "the other connection's inbox is untouched");
                // The first connection is unharmed.
                c1.qp()
                    .post_write(1, crate::Local::new(&src, 0, 4), key1.at(8), true)
                    .unwrap();
                assert_eq!(wait_one(&c1).status, crate::Status::Success);
                let mut ok = [0u8; 4];
                inbox1.read_at(8, &mut ok).unwrap();
                assert_eq!(&ok, b"evil", "connection 1 still works");
            } else {
                assert_eq!(wc.status, crate::Status::Success, "one shared domain");
                assert_eq!(&got, b"evil", "the shared domain lets the key through");
            }
        }
    }
}
