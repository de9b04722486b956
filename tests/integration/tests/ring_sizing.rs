//! Rings that size themselves (`RrpcConfig::min_ring_size`, on by default):
//! calls with large messages grow the rings and keep working across every
//! switch; a quiet connection's rings shrink, and on shm their memory goes
//! back to the system: the process's shared-memory RSS (every ring page
//! rrpc maps is a memfd page) falls back to the minimum rings' footprint.

use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, config, on_rings, rss_shmem_kib};

/// The tests of this binary measure the process's memory: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (at most 10 s) until the shared memory of the tests before this
/// one has gone back: `RssShmem` unchanged over 300 ms. A connection's rings
/// are unmapped by tasks that end after its harness is dropped, so without
/// this a test's baseline could include memory freed while it measures.
async fn settled_rss_shmem_kib() -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = rss_shmem_kib();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = rss_shmem_kib();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(300) {
            break;
        }
    }
    last
}

async fn rings_grow_for_large_messages_and_give_memory_back_when_quiet(t: Transport) {
    let _one = ONE_AT_A_TIME.lock().await;
    settled_rss_shmem_kib().await;
    // A 1 MiB cache cap: the fast path sends 128 KiB frames whole, and
    // the rings grow to 512 KiB for them.
    let cfg = config(t)
        .to_builder()
        .ring_shrink_after(Duration::from_millis(100))
        .ring_cache_size(1 << 20)
        .build()
        .unwrap();
    assert_eq!(cfg.min_ring_size(), 64 << 10, "self-sizing by default");
    let s = Harness::start_with(t, cfg).await;
    let mut c = s.client().await;
    c.unary(Input::default()).await.unwrap();
    let base = rss_shmem_kib();
    let big = Input {
        payload: (0..128 << 10).map(|i| (i % 251) as u8).collect(),
        ..Default::default()
    };
    for i in 0..20 {
        let out = c
            .unary(big.clone())
            .await
            .unwrap_or_else(|e| panic!("{t:?}: call {i}: {e:?}"));
        assert_eq!(out.into_inner().payload, big.payload, "{t:?}: call {i}");
    }
    let grown = rss_shmem_kib();
    eprintln!("{t:?}: RssShmem {base} KiB after one small call, {grown} KiB after 128 KiB calls");
    if t == Transport::ShmFast {
        // A 128 KiB frame asks for a 512 KiB ring in each direction; each
        // ring is mapped twice in this process (client and server).
        assert!(grown >= base + 1024, "{t:?}: rings did not grow");
    }
    if !t.is_rdma() {
        // Quiet: the rings shrink to their idle size (`ring_idle_size`, a
        // page by default; `idle_rings` checks that) and the rest goes
        // back. The bound here is looser, the 64 KiB minimum touched: per
        // direction the sender's staging and the receive ring, mapped by
        // both ends (all in this process): 6 x 64 KiB, plus control pages.
        let floor = 6 * 64 + 64;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = rss_shmem_kib();
            if now <= base + floor {
                eprintln!("{t:?}: RssShmem back to {now} KiB");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{t:?}: RssShmem still {now} KiB, was {base} KiB before the large calls"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Shrunk rings grow again for the next large call.
    let out = c.unary(big.clone()).await.unwrap();
    assert_eq!(out.into_inner().payload, big.payload);
}

/// The paper's fixed ring stays selectable: with `min_ring_size` at
/// `ring_size` nothing shrinks, though the connection is quiet for 15
/// times `ring_shrink_after` (a self-sizing ring would have given its
/// memory back by then, as the test above shows). On shm only: the
/// memory is read from this process's shared RSS.
async fn a_fixed_ring_never_shrinks(t: Transport) {
    let _one = ONE_AT_A_TIME.lock().await;
    let cfg = config(t)
        .to_builder()
        .ring_shrink_after(Duration::from_millis(100))
        .build()
        .unwrap();
    let cfg = cfg
        .to_builder()
        .min_ring_size(cfg.ring_size())
        .build()
        .unwrap();
    let s = Harness::start_with(t, cfg).await;
    let mut c = s.client().await;
    let big = Input {
        payload: vec![7; 128 << 10],
        ..Default::default()
    };
    for _ in 0..20 {
        c.unary(big.clone()).await.unwrap();
    }
    let grown = rss_shmem_kib();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = rss_shmem_kib();
    assert!(
        later + 256 >= grown,
        "{t:?}: {grown} KiB fell to {later} KiB"
    );
}

on_rings!(rings_grow_for_large_messages_and_give_memory_back_when_quiet);

mod fixed {
    use super::a_fixed_ring_never_shrinks;

    rrpc_integration_tests::on_shm!(a_fixed_ring_never_shrinks);
}
