//! The RF-RPC server's accept path: handshakes run concurrently and
//! bounded, so silent clients cannot hold up an honest one; connections are
//! limited in total and per peer, and a refused client is told which limit.

use std::io::Read as _;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rrpc_core::{Fabric, FabricAddr};
use rrpc_kv::rfrpc::{KvClient, RfClient, RfClientConfig, RfServer};
use rrpc_kv::{Error, Op, OpResult};

use crate::common::{MapStore, endpoint};

const BENCH: &str = env!("CARGO_BIN_EXE_rrpc-kv-bench");

fn socket_path(ep: &FabricAddr) -> &std::path::Path {
    match ep {
        FabricAddr::Shm(p) => p,
        other => panic!("not an shm endpoint: {other:?}"),
    }
}

/// Connections to the side channel that never send a hello: each holds a
/// server handshake until its timeout (5 s by default).
fn silent_clients(ep: &FabricAddr, n: usize) -> Vec<UnixStream> {
    (0..n)
        .map(|_| UnixStream::connect(socket_path(ep)).unwrap())
        .collect()
}

#[test]
fn silent_clients_do_not_hold_up_an_honest_one() {
    let ep = endpoint("rfrpc-accept", "silent");
    let f = Fabric::shm();
    let server = RfServer::builder()
        .serve(&ep, &f, |r: &[u8]| r.to_vec())
        .unwrap();
    let _silent = silent_clients(&ep, 8);
    // Let the accept thread take them all before the honest client comes.
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let mut c = RfClient::connect(&ep, &f, RfClientConfig::default())
        .expect("an honest client connects while silent ones hold 5 s handshakes");
    // Generous (a loaded machine), and well under the 5 s handshake
    // timeout that one silent client held the old accept thread for.
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "connected after {:?}",
        t0.elapsed()
    );
    assert_eq!(c.call(b"served").unwrap(), b"served");
    drop(server);
}

#[test]
fn handshakes_past_the_bound_are_closed_at_once_and_counted() {
    let ep = endpoint("rfrpc-accept", "cap");
    let f = Fabric::shm();
    let server = RfServer::builder()
        .max_pending_handshakes(2)
        .serve(&ep, &f, |r: &[u8]| r.to_vec())
        .unwrap();
    // Taken off the listening socket in order: these two hold both places.
    let silent = silent_clients(&ep, 2);
    let mut third = UnixStream::connect(socket_path(&ep)).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(4)))
        .unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 1];
    // Closed without a word, not held until the 5 s handshake timeout.
    let r = third.read(&mut b);
    assert!(matches!(r, Ok(0)), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(server.refused(), 1);
    // Once the silent clients leave, their places are free again.
    drop(silent);
    let t0 = Instant::now();
    let mut c = loop {
        match RfClient::connect(&ep, &f, RfClientConfig::default()) {
            Ok(c) => break c,
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(2), "{e}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(c.call(b"in").unwrap(), b"in");
}

/// The reason of a rejected handshake.
fn rejected(r: Result<RfClient, Error>) -> String {
    match r {
        Err(Error::Fabric(rrpc_core::Error::Rejected(why))) => why,
        other => panic!(
            "expected a rejection, got {:?}",
            other.map(|_| "a connection")
        ),
    }
}

#[test]
fn one_peer_is_refused_past_its_limit_while_another_is_served() {
    let ep = endpoint("rfrpc-accept", "per-peer");
    let f = Fabric::shm();
    let store = Arc::new(MapStore::default());
    let server = RfServer::builder()
        .max_connections_per_peer(4)
        .serve_execute(&ep, &f, store.clone())
        .unwrap();
    // This process opens connections in a loop: four, then refused.
    let mut held = Vec::new();
    let refusal = loop {
        match RfClient::connect(&ep, &f, RfClientConfig::default()) {
            Ok(c) => held.push(c),
            Err(e) => break rejected(Err(e)),
        }
        assert!(
            held.len() <= 4,
            "a fifth connection of one peer was accepted"
        );
    };
    assert_eq!(held.len(), 4);
    assert!(
        refusal.contains("max_connections_per_peer 4")
            && refusal.contains(&format!("pid={}", std::process::id())),
        "{refusal}"
    );
    assert_eq!(server.refused(), 1);
    // Another process (a peer of its own) connects and is served.
    let out = std::process::Command::new(BENCH)
        .args([
            "--workload",
            "c",
            "--records",
            "20",
            "--ops",
            "50",
            "--clients",
            "1",
        ])
        .args(["--no-progress", "--target"])
        .arg(format!("rfrpc+shm://{}", socket_path(&ep).display()))
        .output()
        .expect("run rrpc-kv-bench");
    assert!(
        out.status.success(),
        "the other peer: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        store.0.lock().unwrap().len(),
        20,
        "the other peer's records"
    );
    // A connection closed is a place given back (once the server thread
    // has seen it go).
    drop(held.pop());
    let t0 = Instant::now();
    let again = loop {
        match KvClient::connect(&ep, &f, RfClientConfig::default()) {
            Ok(c) => break c,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(2), "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let nope = Op::Get {
        key: Bytes::from_static(b"nope"),
    };
    assert_eq!(again.call(&nope).unwrap(), OpResult::NotFound);
}

#[test]
fn the_server_total_is_bounded() {
    let ep = endpoint("rfrpc-accept", "total");
    let f = Fabric::shm();
    let server = RfServer::builder()
        .max_connections(3)
        .serve(&ep, &f, |r: &[u8]| r.to_vec())
        .unwrap();
    let _held: Vec<RfClient> = (0..3)
        .map(|_| RfClient::connect(&ep, &f, RfClientConfig::default()).unwrap())
        .collect();
    let why = rejected(RfClient::connect(&ep, &f, RfClientConfig::default()));
    assert!(why.contains("max_connections 3"), "{why}");
    assert_eq!(server.refused(), 1);
}

#[test]
fn shutdown_ends_the_handshakes_in_progress() {
    let ep = endpoint("rfrpc-accept", "shutdown");
    let f = Fabric::shm();
    let server = RfServer::builder()
        .serve(&ep, &f, |r: &[u8]| r.to_vec())
        .unwrap();
    let mut silent = silent_clients(&ep, 3);
    // Until the server holds all three (a fourth client is served, and the
    // accept thread takes clients in order).
    let mut c = RfClient::connect(&ep, &f, RfClientConfig::default()).unwrap();
    assert_eq!(c.call(b"up").unwrap(), b"up");
    let t0 = Instant::now();
    server.shutdown();
    // Not held until the silent clients' 5 s handshake timeout.
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
        let r = s.read(&mut [0u8; 1]);
        assert!(matches!(r, Ok(0)), "a silent client's socket: {r:?}");
    }
}
