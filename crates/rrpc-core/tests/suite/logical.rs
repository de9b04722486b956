//! Logical connections over a shared connection (`conn::connect_logical`,
//! `Incoming::accept_logical`): each its own handshake and side channel,
//! all on one hardware queue pair per end.
//!
//! Every check runs on shm (module `shm`) and, with feature `verbs` and
//! `RRPC_TEST_DEVICE` set, on verbs (module `verbs`; `cargo xtask rxe` runs
//! them on soft-RoCE in a VM; not run on an RDMA NIC). Each asserts the
//! provider the connections run on.

use crate::common;

use std::sync::Arc;

use common::{Provider, listen, wait_cq};
use rrpc_core::conn::{self, Connection, HandshakeConfig, Listener, Offer, SharedConnection};
use rrpc_core::vqp::VqpConfig;
use rrpc_core::{Error, Fabric, FabricAddr, Local, QpConfig, Region};

/// The section this test's "application" names its logical connection in.
const TAG: u16 = 0x7447;

rrpc_core::on_every_provider!(
    logical_connections_share_one_queue_pair,
    a_dropped_logical_connection_takes_its_grants_along,
    bad_logical_hellos_are_refused_and_hurt_no_one,
);

/// Both ends of a shared connection.
struct Shared {
    listener: Listener,
    ep: FabricAddr,
    fabric: Fabric,
    client: Arc<SharedConnection>,
    server: Arc<SharedConnection>,
}

fn shared_on(p: &Provider) -> Shared {
    let (listener, ep) = listen(p, "logical", HandshakeConfig::default());
    let fabric = p.fabric();
    let (client, server) = std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let inc = listener.accept().unwrap();
            assert!(!inc.is_logical());
            let c = inc
                .accept(
                    fabric.create_qp(&QpConfig::default()).unwrap(),
                    Offer::new(),
                )
                .unwrap();
            SharedConnection::new(c, VqpConfig::default()).unwrap()
        });
        let c = conn::connect(
            &ep,
            fabric.create_qp(&QpConfig::default()).unwrap(),
            Offer::new(),
            &HandshakeConfig::default(),
        )
        .unwrap();
        assert_eq!(
            c.peer().provider,
            p.kind(),
            "runs on the provider asked for"
        );
        let client = SharedConnection::new(c, VqpConfig::default()).unwrap();
        (client, srv.join().unwrap())
    });
    Shared {
        listener,
        ep,
        fabric,
        client,
        server,
    }
}

/// One logical connection: each end grants a region of `len` bytes (role 1).
struct Pair {
    client: Connection,
    client_region: Arc<Region>,
    server: Connection,
    server_region: Arc<Region>,
}

fn logical(sh: &Shared, tag: u32, len: usize) -> Pair {
    let server_region = sh.fabric.alloc_region(len).unwrap();
    let client_region = sh.fabric.alloc_region(len).unwrap();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let inc = sh.listener.accept().unwrap();
            assert!(inc.is_logical());
            // The application says which tag (rrpc-tonic: in its section).
            let tag = inc.peer().section(TAG).expect("the tag's section");
            let tag = u32::from_le_bytes(tag.try_into().unwrap());
            inc.accept_logical(
                &sh.server,
                tag,
                Offer::new().grant(1, server_region.clone()),
            )
            .unwrap()
        });
        let client = conn::connect_logical(
            &sh.ep,
            &sh.client,
            tag,
            Offer::new()
                .grant(1, client_region.clone())
                .section(TAG, tag.to_le_bytes().to_vec()),
            &HandshakeConfig::default(),
        )
        .unwrap();
        Pair {
            client,
            client_region: client_region.clone(),
            server: srv.join().unwrap(),
            server_region: server_region.clone(),
        }
    })
}

/// Writes `byte` from `from`'s scratch into `to` at 0 and waits for the
/// completion.
fn write(p: &Provider, from: &Connection, scratch: &Region, to: rrpc_core::RemoteRegion, byte: u8) {
    scratch.write_at(0, &[byte; 64]).unwrap();
    from.qp()
        .post_write(u64::from(byte), Local::new(scratch, 0, 64), to.at(0), true)
        .unwrap();
    let wc = wait_cq(from.qp().send_cq(), 1, p.patience());
    assert_eq!(wc[0].status, rrpc_core::Status::Success, "{wc:?}");
    assert_eq!(wc[0].wr_id, u64::from(byte));
}

fn logical_connections_share_one_queue_pair(p: &Provider) {
    let sh = shared_on(p);
    let pairs: Vec<Pair> = (0..4).map(|t| logical(&sh, t, 4096)).collect();
    assert_eq!(sh.client.physical().sharers(), 4);
    assert_eq!(sh.server.physical().sharers(), 4);
    let scratch = sh.fabric.alloc_region(4096).unwrap();
    for (t, pair) in pairs.iter().enumerate() {
        assert!(pair.client.qp().is_virtual() && pair.server.qp().is_virtual());
        assert_eq!(pair.client.peer().provider, p.kind());
        // Each way, into this logical connection's own regions.
        let b = 0x10 + t as u8;
        write(
            p,
            &pair.client,
            &scratch,
            pair.client.peer().region(1).unwrap(),
            b,
        );
        write(
            p,
            &pair.server,
            &scratch,
            pair.server.peer().region(1).unwrap(),
            b | 0x80,
        );
    }
    for (t, pair) in pairs.iter().enumerate() {
        let mut got = [0u8; 64];
        pair.server_region.read_at(0, &mut got).unwrap();
        assert_eq!(got, [0x10 + t as u8; 64], "client {t} -> server");
        pair.client_region.read_at(0, &mut got).unwrap();
        assert_eq!(got, [(0x10 + t as u8) | 0x80; 64], "server {t} -> client");
    }
    // All of it on the one hardware queue pair at each end.
    assert!(sh.client.physical().stats().posted >= 4);
    assert!(sh.server.physical().stats().posted >= 4);
}

fn a_dropped_logical_connection_takes_its_grants_along(p: &Provider) {
    let sh = shared_on(p);
    let gone = logical(&sh, 1, 4096);
    let stays = logical(&sh, 2, 4096);
    let old_remote = gone.client.peer().region(1).unwrap();
    let to_dropped = gone.server.peer().region(1).unwrap();
    let Pair { client, server, .. } = gone;
    drop(client);
    // What the dropped end granted stays registered for its lease: a write
    // the server still makes into it completes, and fails nothing (on verbs
    // a write into a deregistered region would fail the hardware queue
    // pair, and every logical connection on it).
    assert!(sh.client.retired_regions() > 0);
    let scratch = sh.fabric.alloc_region(4096).unwrap();
    write(p, &server, &scratch, to_dropped, 0x77);
    assert!(!sh.server.physical().hardware().is_failed());
    // The server sees its end go, as for a dedicated connection.
    let deadline = std::time::Instant::now() + p.patience();
    while server.check_alive().is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "server end still alive"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(sh.client.physical().sharers(), 1);
    // The other logical connection may no longer target the dropped one's
    // regions, and still works.
    let e = stays
        .client
        .qp()
        .post_write(9, Local::new(&scratch, 0, 64), old_remote.at(0), true)
        .unwrap_err();
    assert!(matches!(e, Error::BadRemoteKey { .. }), "{e}");
    write(
        p,
        &stays.client,
        &scratch,
        stays.client.peer().region(1).unwrap(),
        0x42,
    );
    let mut got = [0u8; 64];
    stays.server_region.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0x42; 64]);
    drop(server);
    assert_eq!(sh.server.physical().sharers(), 1);
    // After the lease, the retired regions are released.
    std::thread::sleep(conn::GRANT_LEASE);
    assert_eq!(sh.client.retired_regions(), 0);
}

fn bad_logical_hellos_are_refused_and_hurt_no_one(p: &Provider) {
    let sh = shared_on(p);
    let good = logical(&sh, 1, 4096);
    let sh = &sh;
    let logical_hello = |tag| {
        move || {
            conn::connect_logical(
                &sh.ep,
                &sh.client,
                tag,
                Offer::new(),
                &HandshakeConfig::default(),
            )
        }
    };
    // A tag already attached at the server (the server is told tag 1, in
    // use by `good`, while the client attached 3).
    refused(
        sh,
        |inc| inc.accept_logical(&sh.server, 1, Offer::new()),
        logical_hello(3),
        "already attached",
    );
    // A logical hello offered to `accept` (a server that shares nothing).
    refused(
        sh,
        |inc| {
            inc.accept(
                sh.fabric.create_qp(&QpConfig::default()).unwrap(),
                Offer::new(),
            )
        },
        logical_hello(4),
        "logical hello",
    );
    // A dedicated hello offered to `accept_logical`.
    refused(
        sh,
        |inc| inc.accept_logical(&sh.server, 5, Offer::new()),
        || {
            conn::connect(
                &sh.ep,
                sh.fabric.create_qp(&QpConfig::default()).unwrap(),
                Offer::new(),
                &HandshakeConfig::default(),
            )
        },
        "dedicated hello",
    );
    // Refused attempts left nothing attached, and the good one still works.
    assert_eq!(sh.client.physical().sharers(), 1);
    assert_eq!(sh.server.physical().sharers(), 1);
    let scratch = sh.fabric.alloc_region(4096).unwrap();
    write(
        p,
        &good.client,
        &scratch,
        good.client.peer().region(1).unwrap(),
        0x33,
    );
    let mut got = [0u8; 64];
    good.server_region.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0x33; 64]);
}

/// Runs `server` on the next client of `sh`'s listener while `client`
/// connects: both must fail, the server with `MalformedHandshake` and the
/// client rejected with a reason containing `says`.
fn refused(
    sh: &Shared,
    server: impl FnOnce(conn::Incoming) -> Result<Connection, Error> + Send,
    client: impl FnOnce() -> Result<Connection, Error>,
    says: &str,
) {
    std::thread::scope(|s| {
        let srv = s.spawn(|| server(sh.listener.accept().unwrap()));
        let Err(e) = client() else {
            panic!("the client connected ({says})");
        };
        assert!(matches!(&e, Error::Rejected(r) if r.contains(says)), "{e}");
        let Err(e) = srv.join().unwrap() else {
            panic!("the server accepted ({says})");
        };
        assert!(matches!(e, Error::MalformedHandshake(_)), "{e}");
    });
}
