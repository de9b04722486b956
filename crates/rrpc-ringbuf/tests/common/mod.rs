//! In-process pairs: both ends in one process, a real connection between
//! them, on the provider a test names: shm (memfd regions, Unix-socket
//! handshake), or with feature `verbs` the device `RRPC_TEST_DEVICE` names
//! (RC queue pairs on that device, handshake over TCP on 127.0.0.1).
//!
//! On shm a WRITE is placed when `post_write` returns; on verbs it is placed
//! some time later and known placed only once its completion (or the
//! receiver) says so. The helpers here wait for the receiver on verbs and
//! insist on immediate visibility on shm ([`expect_message`]).
#![allow(dead_code, unused_macros)] // each test file uses a subset

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Fabric, FabricAddr, ProviderKind, QpConfig};
use rrpc_ringbuf::{Error, LocalRing, RingConfig, RingRx, RingTx};

/// The provider a test runs on (shared by the crates' tests).
pub(crate) use rrpc_core::testing::Provider;

/// One side of a connection: the connection and its two ring halves.
pub(crate) type Side = (Connection, RingTx, RingRx);

/// Bound for anything a test waits for on verbs (soft-RoCE under an
/// emulated CPU is 20-50x slower than the host; a lost message waits forever).
pub(crate) const BOUND: Duration = Duration::from_secs(60);

/// The listener and the endpoint to dial: a Unix socket in a fresh
/// directory for shm (returned, to remove), TCP on 127.0.0.1 with a
/// kernel-chosen port for verbs.
pub(crate) fn listen(fabric: &Fabric) -> (Option<std::path::PathBuf>, conn::Listener, FabricAddr) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    match fabric.kind() {
        ProviderKind::Shm => {
            let dir = std::env::temp_dir().join(format!(
                "rrpc-rb-it-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let ep = FabricAddr::parse(&format!("shm://{}/s.sock", dir.display())).unwrap();
            let l = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
            (Some(dir), l, ep)
        }
        kind => {
            assert_eq!(kind, ProviderKind::Verbs);
            let ep = FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
            let l = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
            let addr = l.local_addr().expect("rdma listener has a TCP address");
            let ep = FabricAddr::parse(&format!("rdma://{addr}")).unwrap();
            (None, l, ep)
        }
    }
}

/// Connects a client ring configured by `client` to a server ring
/// configured by `server`, both on `fabric`; returns each side's
/// `LocalRing::connect` result. Each connection is checked to run on the
/// fabric's provider.
pub(crate) fn pair_on_fabric(
    fabric: &Fabric,
    client: &RingConfig,
    server: &RingConfig,
    qp: &QpConfig,
) -> (Result<Side, Error>, Result<Side, Error>) {
    let (dir, listener, ep) = listen(fabric);
    let kind = fabric.kind();
    let srv = serve_one(listener, fabric, server, qp);
    let local = LocalRing::new(fabric, client).unwrap();
    let c = conn::connect(
        &ep,
        fabric.create_qp(qp).unwrap(),
        local.add_to_offer(Offer::new()),
        &HandshakeConfig::default(),
    )
    .unwrap();
    assert_eq!(c.peer().provider, kind, "client side");
    let cli = local.connect(&c).map(|(tx, rx)| (c, tx, rx));
    let srv = srv.join().unwrap();
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    (cli, srv)
}

/// A server thread that accepts one client on `listener` with a ring
/// configured by `cfg` and returns its `LocalRing::connect` result. The
/// connection is checked to run on the fabric's provider.
pub(crate) fn serve_one(
    listener: conn::Listener,
    fabric: &Fabric,
    cfg: &RingConfig,
    qp: &QpConfig,
) -> std::thread::JoinHandle<Result<Side, Error>> {
    let (f2, s2, q2) = (fabric.clone(), cfg.clone(), qp.clone());
    std::thread::spawn(move || {
        let local = LocalRing::new(&f2, &s2).unwrap();
        let c = listener
            .accept()
            .unwrap()
            .accept(f2.create_qp(&q2).unwrap(), local.add_to_offer(Offer::new()))
            .unwrap();
        assert_eq!(c.peer().provider, f2.kind(), "server side");
        local.connect(&c).map(|(tx, rx)| (c, tx, rx))
    })
}

/// [`pair_on_fabric`] on `p`'s fabric.
pub(crate) fn pair_with(
    p: &Provider,
    client: &RingConfig,
    server: &RingConfig,
    qp: &QpConfig,
) -> (Result<Side, Error>, Result<Side, Error>) {
    pair_on_fabric(&p.fabric(), client, server, qp)
}

/// Both sides on `p` with the same config and the default queue pair.
pub(crate) fn pair(p: &Provider, cfg: &RingConfig) -> (Side, Side) {
    let (c, s) = pair_with(p, cfg, cfg, &QpConfig::default());
    (c.unwrap(), s.unwrap())
}

/// Makes progress on the connection of `tx` -> `rx` without the ring's
/// users: `tx` posts what waits for a completion (a tail deferred behind an
/// in-flight tail WRITE, work held back by the send-queue budget), `rx`
/// posts a head push held back the same way.
pub(crate) fn drive(tx: &mut RingTx, rx: &mut RingRx) {
    tx.poll_completions().expect("sender completions");
    rx.poll_completions().expect("receiver completions");
}

/// Sends `msg` on `tx`. On shm the ring must have room at once (the
/// receiver's head pushes are placed when posted); on verbs a full ring
/// waits (bounded) for the head push of `rx`, the ring's receiver, to land.
pub(crate) fn send(p: &Provider, tx: &mut RingTx, rx: &mut RingRx, msg: &[u8], what: &str) {
    let t0 = Instant::now();
    loop {
        match tx.try_send(msg) {
            Ok(()) => return,
            Err(Error::WouldBlock) if p.is_verbs() => {
                assert!(
                    t0.elapsed() < BOUND,
                    "{what}: ring full for {BOUND:?}; tx {:?}",
                    tx.state()
                );
                drive(tx, rx);
                std::thread::yield_now();
            }
            Err(e) => panic!("{what}: send: {e}"),
        }
    }
}

/// Returns once `rx` has a message (left unread for the next `try_recv`).
/// On shm a flushed message must be visible at once; on verbs this waits
/// for it (bounded), driving `tx`, the ring's sender, meanwhile.
pub(crate) fn expect_message(p: &Provider, tx: &mut RingTx, rx: &mut RingRx, what: &str) {
    let t0 = Instant::now();
    loop {
        match rx.has_message() {
            Ok(true) => return,
            Ok(false) if p.is_verbs() => {
                assert!(
                    t0.elapsed() < BOUND,
                    "{what}: no message within {BOUND:?}; tx {:?}",
                    tx.state()
                );
                drive(tx, rx);
                std::thread::yield_now();
            }
            Ok(false) => panic!("{what}: flushed message not visible"),
            Err(e) => panic!("{what}: {e}"),
        }
    }
}
