//! RF-RPC over the verbs provider (soft-RoCE in `cargo xtask rxe`).
//! Skipped, with a printed "skipped", when `RRPC_TEST_DEVICE` is unset.
#![cfg(feature = "verbs")]

use std::time::Duration;

use rrpc_core::{Endpoint, Fabric, ProviderKind};
use rrpc_kv::rfrpc::{Mode, ModePolicy, RfClient, RfClientConfig, RfServer};

fn device() -> Option<String> {
    let d = std::env::var("RRPC_TEST_DEVICE")
        .ok()
        .filter(|d| !d.is_empty());
    if d.is_none() {
        eprintln!("skipped: RRPC_TEST_DEVICE not set");
    }
    d
}

fn fabric(dev: &str) -> Fabric {
    let f = Fabric::verbs(Some(dev)).expect("open the verbs device");
    assert_eq!(f.kind(), ProviderKind::Verbs);
    assert_eq!(f.device_name(), Some(dev), "verbs on the named device");
    f
}

fn sized(req: &[u8]) -> Vec<u8> {
    let n = u32::from_le_bytes(req[..4].try_into().unwrap()) as usize;
    (0..n).map(|i| (i * 31 + req.len()) as u8).collect()
}

fn ask(n: usize, pad: usize) -> Vec<u8> {
    let mut v = (n as u32).to_le_bytes().to_vec();
    v.resize(4 + pad, 7);
    v
}

fn cfg() -> RfClientConfig {
    RfClientConfig::new()
        .call_timeout(Duration::from_secs(60))
        .unwrap()
}

#[test]
fn verbs_round_trips_second_reads_and_server_reply() {
    let Some(dev) = device() else { return };
    let f = fabric(&dev);
    let any = Endpoint::parse("rdma://127.0.0.1:0").unwrap();
    let server = RfServer::builder().serve(&any, &f, sized).unwrap();
    let ep = server.endpoint().clone();
    assert!(matches!(ep, Endpoint::Rdma(a) if a.port() != 0));
    let mut c = RfClient::connect(&ep, &f, cfg()).unwrap();
    assert_eq!(c.connection().peer().provider, ProviderKind::Verbs);
    let sizes = [0usize, 1, 7, 100, 232, 233, 1000, 4096, 30_000, 65_000];
    for (i, &n) in sizes.iter().enumerate() {
        let req = ask(n, i * 37);
        assert_eq!(c.call(&req).unwrap(), sized(&req), "size {n}");
    }
    assert!(c.stats().second_reads >= 5, "{:?}", c.stats());
    // Forced server-reply on a second connection.
    let mut sr = RfClient::connect(
        &ep,
        &f,
        cfg().mode(Some(ModePolicy::Fixed(Mode::ServerReply))),
    )
    .unwrap();
    for &n in &sizes[..8] {
        let req = ask(n, 3);
        assert_eq!(sr.call(&req).unwrap(), sized(&req), "server-reply size {n}");
    }
    assert_eq!(server.served_server_reply(), 8);
    assert_eq!(server.served(), sizes.len() as u64 + 8);
    drop(server);
    let r = c.call(&ask(1, 0));
    assert!(r.is_err(), "{r:?}");
}
