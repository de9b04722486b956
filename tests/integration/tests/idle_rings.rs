//! A quiet connection's rings go below their minimum to their idle size
//! (`RrpcConfig::ring_idle_size`, one page by default): after a burst of
//! large calls and `ring_shrink_after` of quiet, the process's shared
//! memory (every ring page rrpc maps is a memfd page, both ends of the
//! connection in this process) falls back to what one small call left,
//! and calls made across the shrinks and the grows after them return
//! their data intact. Its own binary: it reads the process's memory, so
//! nothing else may run meanwhile.

use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, config, rss_shmem_kib};

/// The tests of this binary measure the process's memory: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (at most 10 s, a bound for a failure, not a measured time) until
/// `RssShmem` is at most `limit` KiB; the last reading otherwise.
async fn shmem_falls_to(limit: u64) -> Result<u64, u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = rss_shmem_kib();
        if now <= limit {
            return Ok(now);
        }
        if Instant::now() > deadline {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Rounds of large calls, each followed by quiet: every round grows the
/// rings (a 256 KiB echo asks for the cache cap's ring each way), the
/// quiet shrinks them to one page, and the next round grows them back.
///
/// What stays after the quiet is what one small call and the same quiet
/// left (the rings at their idle size already), give or take 32 KiB of
/// control pages; with the rings kept at their 64 KiB minimum instead (the
/// behaviour before `ring_idle_size`) it is up to 6 × 64 KiB more: per
/// direction the sender's staging ring and the receive ring, mapped by
/// both ends.
async fn a_quiet_connection_keeps_one_page_per_ring(t: Transport) {
    let _one = ONE_AT_A_TIME.lock().await;
    let cfg = config(t)
        .to_builder()
        .ring_shrink_after(Duration::from_millis(50))
        .build()
        .unwrap();
    assert_eq!(cfg.ring_idle_size(), 4096, "the default idle size");
    let s = Harness::start_with(t, cfg).await;
    let mut c = s.client().await;
    c.unary(Input::default()).await.unwrap();
    // Quiet once first (six times `ring_shrink_after`; were it not
    // enough, the base would only be higher and the test more lenient).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = rss_shmem_kib();
    let big = Input {
        payload: (0..256 << 10).map(|i| (i % 251) as u8).collect(),
        ..Default::default()
    };
    for round in 0..3 {
        for i in 0..4 {
            let mut input = big.clone();
            input.payload[0] = (round * 4 + i) as u8;
            let out = c
                .unary(input.clone())
                .await
                .unwrap_or_else(|e| panic!("{t:?}: round {round} call {i}: {e:?}"));
            assert_eq!(
                out.into_inner().payload,
                input.payload,
                "{t:?}: round {round} call {i}"
            );
        }
        let grown = rss_shmem_kib();
        assert!(
            grown >= base + 256,
            "{t:?}: round {round}: the rings did not grow ({base} -> {grown} KiB)"
        );
        match shmem_falls_to(base + 32).await {
            Ok(now) => eprintln!("{t:?}: round {round}: {base} -> {grown} -> {now} KiB"),
            Err(now) => panic!(
                "{t:?}: round {round}: RssShmem still {now} KiB after the quiet, \
                 {base} KiB after one small call"
            ),
        }
    }
    // And a small call after the last quiet.
    let out = c
        .unary(Input {
            payload: vec![9; 100],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.into_inner().payload, vec![9; 100]);
}

rrpc_integration_tests::on_shm!(a_quiet_connection_keeps_one_page_per_ring);
