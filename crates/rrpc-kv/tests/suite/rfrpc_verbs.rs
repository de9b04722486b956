//! RF-RPC over the verbs provider (soft-RoCE in `cargo xtask rxe`).
//! Skipped, with a printed "skipped", when `RRPC_TEST_DEVICE` is unset.
#![cfg(feature = "verbs")]

use std::time::Duration;

use rrpc_core::{Fabric, FabricAddr, ProviderKind};
use rrpc_kv::rfrpc::{Mode, ModePolicy, RfClient, RfClientConfig, RfServer};

use crate::common;
use common::{ask, calls_until_server_reply, sized};

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

fn cfg() -> RfClientConfig {
    RfClientConfig::builder()
        .call_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[test]
fn verbs_round_trips_second_reads_and_server_reply() {
    let Some(dev) = device() else { return };
    let f = fabric(&dev);
    let any = FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
    let server = RfServer::builder().serve(&any, &f, sized).unwrap();
    let ep = server.endpoint().clone();
    assert!(matches!(ep, FabricAddr::Rdma(a) if a.port() != 0));
    // Remote fetch only, so every result larger than F takes a second READ
    // (the hybrid switch may move a slow VM to server-reply).
    let mut c = RfClient::connect(
        &ep,
        &f,
        cfg()
            .to_builder()
            .mode(Some(ModePolicy::Fixed(Mode::RemoteFetch)))
            .build()
            .unwrap(),
    )
    .unwrap();
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
        cfg()
            .to_builder()
            .mode(Some(ModePolicy::Fixed(Mode::ServerReply)))
            .build()
            .unwrap(),
    )
    .unwrap();
    for &n in &sizes[..8] {
        let req = ask(n, 3);
        assert_eq!(sr.call(&req).unwrap(), sized(&req), "server-reply size {n}");
    }
    assert_eq!(server.served_server_reply(), 8);
    assert_eq!(server.served(), sizes.len() as u64 + 8);
    // One batched call per mode.
    let reqs: Vec<Vec<u8>> = (0..20).map(|i| ask(i * 50, i)).collect();
    let refs: Vec<&[u8]> = reqs.iter().map(|r| &r[..]).collect();
    for client in [&mut c, &mut sr] {
        let got = client.call_batch(&refs).unwrap();
        for (r, g) in reqs.iter().zip(&got) {
            assert_eq!(g, &sized(r));
        }
    }
    drop(server);
    let r = c.call(&ask(1, 0));
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn verbs_hybrid_switch_under_a_slow_handler() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let Some(dev) = device() else { return };
    let f = fabric(&dev);
    let any = FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
    let slow = Arc::new(AtomicU64::new(0));
    let s2 = slow.clone();
    let server = RfServer::builder()
        .serve(&any, &f, move |req: &[u8]| {
            let ms = s2.load(Ordering::Relaxed);
            if ms > 0 {
                std::thread::sleep(Duration::from_millis(ms));
            }
            req.to_vec()
        })
        .unwrap();
    // The paper's rules alone: what they decide does not depend on how
    // fast the emulated NIC measures either mode.
    let mut c = RfClient::connect(
        server.endpoint(),
        &f,
        cfg().to_builder().measured_switch(false).build().unwrap(),
    )
    .unwrap();
    for i in 0..10u32 {
        assert_eq!(c.call(&i.to_le_bytes()).unwrap(), i.to_le_bytes());
    }
    slow.store(50, Ordering::Relaxed);
    calls_until_server_reply(&mut c);
    c.call(b"c").unwrap();
    assert!(server.served_server_reply() >= 1);
    slow.store(0, Ordering::Relaxed);
    let mut n = 0;
    while c.mode_switch().current() == Mode::ServerReply {
        c.call(b"d").unwrap();
        n += 1;
        assert!(n < 50, "never switched back: {:?}", c.mode_switch());
    }
    eprintln!("verbs hybrid: {:?} {:?}", c.stats(), c.mode_switch());
}

#[test]
fn verbs_garbage_request_closes_that_connection() {
    use rrpc_core::conn::{self, HandshakeConfig, Offer};
    use rrpc_core::{Completion, Local, QpConfig};
    let Some(dev) = device() else { return };
    let f = fabric(&dev);
    let any = FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
    let server = RfServer::builder()
        .serve(&any, &f, |r: &[u8]| r.to_vec())
        .unwrap();
    let reply = f.alloc_region(4096).unwrap();
    let raw = conn::connect(
        server.endpoint(),
        f.create_qp(&QpConfig::default()).unwrap(),
        Offer::new().grant(2, reply),
        &HandshakeConfig::default(),
    )
    .unwrap();
    let src = f.alloc_region(4096).unwrap();
    let w: u64 = (1 << 63) | (((1u64 << 30) - 1) << 32) | 5;
    src.write_at(0, &w.to_le_bytes()).unwrap();
    raw.qp()
        .post_write(
            1,
            Local::new(&src, 0, 8),
            raw.peer().region(1).unwrap().at(0),
            true,
        )
        .unwrap();
    let mut wc = [Completion::EMPTY; 1];
    let t0 = std::time::Instant::now();
    while raw.qp().send_cq().poll(&mut wc).unwrap() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60));
    }
    while raw.check_alive().is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "server did not close"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut good = RfClient::connect(server.endpoint(), &f, cfg()).unwrap();
    assert_eq!(good.call(b"still here").unwrap(), b"still here");
}
