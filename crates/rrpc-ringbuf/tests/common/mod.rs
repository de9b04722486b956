//! In-process shm pair: both ends in one process, a real shm connection
//! (memfd regions, Unix-socket handshake) between them.
#![allow(dead_code)] // each test file uses a subset

use std::sync::atomic::{AtomicU64, Ordering};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Endpoint, Fabric, QpConfig};
use rrpc_ringbuf::{Error, LocalRing, RingConfig, RingRx, RingTx};

/// One side of a connection: the connection and its two ring halves.
pub(crate) type Side = (Connection, RingTx, RingRx);

fn endpoint() -> (std::path::PathBuf, Endpoint) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-rb-it-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ep = Endpoint::parse(&format!("shm://{}/s.sock", dir.display())).unwrap();
    (dir, ep)
}

/// Connects a client ring configured by `client` to a server ring
/// configured by `server`; returns each side's `LocalRing::connect` result.
pub(crate) fn pair_with(
    client: &RingConfig,
    server: &RingConfig,
    qp: &QpConfig,
) -> (Result<Side, Error>, Result<Side, Error>) {
    let (dir, ep) = endpoint();
    let fabric = Fabric::shm();
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
    let (f2, s2, q2) = (fabric.clone(), server.clone(), qp.clone());
    let srv = std::thread::spawn(move || {
        let local = LocalRing::new(&f2, &s2).unwrap();
        let c = listener
            .accept()
            .unwrap()
            .accept(f2.create_qp(&q2).unwrap(), local.add_to_offer(Offer::new()))
            .unwrap();
        local.connect(&c).map(|(tx, rx)| (c, tx, rx))
    });
    let local = LocalRing::new(&fabric, client).unwrap();
    let c = conn::connect(
        &ep,
        fabric.create_qp(qp).unwrap(),
        local.add_to_offer(Offer::new()),
        &HandshakeConfig::default(),
    )
    .unwrap();
    let cli = local.connect(&c).map(|(tx, rx)| (c, tx, rx));
    let srv = srv.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
    (cli, srv)
}

/// Both sides with the same config and the default queue pair.
pub(crate) fn pair(cfg: &RingConfig) -> (Side, Side) {
    let (c, s) = pair_with(cfg, cfg, &QpConfig::default());
    (c.unwrap(), s.unwrap())
}
