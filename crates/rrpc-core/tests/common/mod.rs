//! Shared helpers for rrpc-core's integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Endpoint, Fabric, QpConfig, Region};

/// A unique socket path in a fresh temp dir.
pub fn sock_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-core-test-{}-{}-{}",
        std::process::id(),
        tag,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("s.sock")
}

pub fn endpoint(tag: &str) -> Endpoint {
    Endpoint::Shm(sock_path(tag))
}

/// One side of a connected pair: the connection, the region it granted to the
/// peer (role 1) and a local scratch region.
pub struct Side {
    pub conn: Connection,
    pub granted: Arc<Region>,
    pub scratch: Arc<Region>,
}

/// Connects two queue pairs in this process over the shm side channel.
pub fn pair_with(len: usize, a_cfg: QpConfig, b_cfg: QpConfig) -> (Side, Side) {
    let ep = endpoint("pair");
    let fabric = Fabric::shm();
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
    let f2 = fabric.clone();
    let server = std::thread::spawn(move || {
        let granted = f2.alloc_region(len).unwrap();
        let scratch = f2.alloc_region(len).unwrap();
        let inc = listener.accept().unwrap();
        let conn = inc
            .accept(
                f2.create_qp(&b_cfg).unwrap(),
                Offer::new().grant(1, granted.clone()),
            )
            .unwrap();
        Side {
            conn,
            granted,
            scratch,
        }
    });
    let granted = fabric.alloc_region(len).unwrap();
    let scratch = fabric.alloc_region(len).unwrap();
    let conn = conn::connect(
        &ep,
        fabric.create_qp(&a_cfg).unwrap(),
        Offer::new().grant(1, granted.clone()),
        &HandshakeConfig::default(),
    )
    .unwrap();
    let b = server.join().unwrap();
    (
        Side {
            conn,
            granted,
            scratch,
        },
        b,
    )
}

pub fn pair(len: usize) -> (Side, Side) {
    pair_with(len, QpConfig::default(), QpConfig::default())
}

/// FNV-1a, for checksummed payloads.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
