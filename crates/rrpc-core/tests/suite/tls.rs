//! TLS on the `rdma://` side channel, end to end through the public API on
//! a verbs device (module `verbs`, run by `cargo xtask rxe` on soft-RoCE;
//! not run on an RDMA NIC). The TLS layer itself (the session, a peer that
//! does not speak it, an untrusted certificate, a sniffer on the path) is
//! unit-tested over loopback TCP in `provider::verbs::side`.
#![cfg(feature = "verbs")]

use crate::common;

mod verbs {
    use std::sync::Arc;

    use rrpc_core::conn::{self, HandshakeConfig, Offer};
    use rrpc_core::rustls;
    use rrpc_core::{Access, Error, Local, Opcode, ProviderKind, QpConfig, Status};

    use super::common::{Provider, listen, pair_on_with};

    /// A server config with a fresh self-signed certificate for
    /// `rrpc.test`, and a client config that trusts it.
    fn tls_configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        rrpc_core::testing::self_signed_tls("rrpc.test")
    }

    fn name() -> rustls::pki_types::ServerName<'static> {
        rustls::pki_types::ServerName::try_from("rrpc.test").unwrap()
    }

    #[test]
    fn tls_handshake_then_one_sided_write() {
        let Some(p) = Provider::verbs_from_env() else {
            return;
        };
        let (server_tls, client_tls) = tls_configs();
        // (The token a client presents travels in its `Offer`; tokens over
        // TLS are covered by the integration test `auth`.)
        let server_hs = HandshakeConfig::builder()
            .tls_server(server_tls)
            .build()
            .unwrap();
        let client_hs = HandshakeConfig::builder()
            .tls_client(client_tls, name())
            .build()
            .unwrap();
        let (a, b) = pair_on_with(
            &p,
            1 << 16,
            QpConfig::default(),
            QpConfig::default(),
            Access::ALL,
            server_hs,
            client_hs,
        );
        assert_eq!(a.conn.peer().provider, ProviderKind::Verbs);
        // The grants that crossed inside TLS work: a WRITE lands.
        let remote = a.conn.peer().region(1).unwrap();
        a.scratch.write_at(0, b"over tls").unwrap();
        a.conn
            .qp()
            .post_write(7, Local::new(&a.scratch, 0, 8), remote.at(0), true)
            .unwrap();
        let wc = a.wait_send(1);
        assert_eq!(
            (wc[0].wr_id, wc[0].opcode, wc[0].status),
            (7, Opcode::Write, Status::Success)
        );
        let mut got = [0u8; 8];
        b.granted.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"over tls");
        // The side channel still reports liveness after the session ended.
        assert!(b.conn.check_alive().is_ok());
        a.conn.close();
        let t0 = std::time::Instant::now();
        while b.conn.check_alive().is_ok() {
            assert!(t0.elapsed() < p.patience(), "goodbye never seen");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_client_without_tls_gets_no_queue_pair() {
        let Some(p) = Provider::verbs_from_env() else {
            return;
        };
        let (server_tls, _) = tls_configs();
        let (listener, ep) = listen(
            &p,
            "tls",
            HandshakeConfig::builder()
                .tls_server(server_tls)
                .build()
                .unwrap(),
        );
        let server = std::thread::spawn(move || listener.accept().map(|_| ()));
        let f = p.fabric();
        let r = conn::connect(
            &ep,
            f.create_qp(&QpConfig::default()).unwrap(),
            Offer::new().grant(1, f.alloc_region(4096).unwrap()),
            &HandshakeConfig::default(),
        );
        assert!(r.is_err(), "a plaintext client connected to a TLS server");
        let e = server.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::Tls(_)), "{e}");
    }
}
