//! The RF-RPC batching driver ([`Batcher`]) over rrpc-core's shm provider:
//! results in order, flushes by count, size and timeout (virtual clock),
//! large entries and large results, the Eq. 3 tuner on a server with a
//! fixed per-entry cost, a vanished server.

use std::time::{Duration, Instant};

use rrpc_core::{Fabric, FabricAddr};
use rrpc_kv::rfrpc::tune::BatchSizeTuner;
use rrpc_kv::rfrpc::{
    Batcher, BatcherConfig, KvBatcher, RfClient, RfClientConfig, RfServer, Ticket, VirtualClock,
};
use rrpc_kv::{Error, Op, OpResult};

use crate::common;
use common::{MapStore, ask, endpoint, sized};

fn client(ep: &FabricAddr, f: &Fabric) -> RfClient {
    RfClient::connect(
        ep,
        f,
        RfClientConfig::builder()
            .call_timeout(Duration::from_secs(20))
            .build()
            .unwrap(),
    )
    .unwrap()
}

fn err(r: &rrpc_kv::rfrpc::BatchResult) -> Option<&Error> {
    r.as_ref().err().map(|e| &**e)
}

fn take_all<C: rrpc_kv::rfrpc::Clock>(b: &mut Batcher<C>) -> Vec<(Ticket, Vec<u8>)> {
    b.drain().map(|(t, r)| (t, r.unwrap())).collect()
}

#[test]
fn many_pushes_come_back_in_order() {
    let ep = endpoint("rfbatch", "order");
    let f = Fabric::shm();
    let _server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let cfg = BatcherConfig::builder()
        .max_entries(16)
        .timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let mut b = Batcher::new(client(&ep, &f), cfg).unwrap();
    let reqs: Vec<Vec<u8>> = (0..2000).map(|i| ask(i % 300, i % 37)).collect();
    let mut got = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(b.push(r), Ticket(i as u64));
        got.extend(take_all(&mut b));
    }
    b.flush();
    got.extend(take_all(&mut b));
    assert_eq!(got.len(), reqs.len());
    for (i, (t, v)) in got.iter().enumerate() {
        assert_eq!(*t, Ticket(i as u64));
        assert_eq!(*v, sized(&reqs[i]), "request {i}");
    }
    let s = b.stats();
    assert_eq!(s.batched, 2000);
    // Mostly full batches of 16 (some cut by L = 2048 bytes).
    assert!(s.by_count >= 100, "{s:?}");
    assert_eq!(s.failed_batches, 0);
    assert_eq!(b.client().stats().calls, s.batches);
}

#[test]
fn flush_by_count_size_and_timeout_on_a_virtual_clock() {
    let ep = endpoint("rfbatch", "flush");
    let f = Fabric::shm();
    let _server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let clock = VirtualClock::new();
    let cfg = BatcherConfig::builder()
        .max_entries(4)
        .limit(512)
        .timeout(Duration::from_millis(5))
        .build()
        .unwrap();
    let mut b = Batcher::with_clock(client(&ep, &f), cfg, clock.clone()).unwrap();

    // Count: the fourth push sends.
    for _ in 0..3 {
        b.push(&ask(3, 0));
    }
    assert_eq!((b.queued(), b.stats().batches), (3, 0));
    assert!(b.pop().is_none());
    b.push(&ask(3, 0));
    assert_eq!((b.queued(), b.stats().by_count), (0, 1));
    assert_eq!(take_all(&mut b).len(), 4);

    // Size: 100-byte requests, 104 bytes each with the size word: four fit
    // L = 512, the fifth sends the four and starts the next batch (N = 100).
    let cfg = BatcherConfig::builder()
        .max_entries(100)
        .limit(512)
        .timeout(Duration::from_millis(5))
        .build()
        .unwrap();
    let (c, rest) = b.into_inner();
    assert!(rest.is_empty());
    let mut b = Batcher::with_clock(c, cfg, clock.clone()).unwrap();
    for _ in 0..4 {
        b.push(&ask(5, 96));
    }
    assert_eq!((b.queued(), b.stats().batches), (4, 0));
    b.push(&ask(5, 96));
    assert_eq!((b.queued(), b.stats().by_size), (1, 1));
    assert_eq!(take_all(&mut b).len(), 4);

    // Timeout: T = 5 ms from the first queued request (the one left over
    // above was queued at virtual time 0).
    assert_eq!(b.next_deadline(), Some(Duration::from_millis(5)));
    clock.advance(Duration::from_millis(4));
    assert!(!b.poll());
    b.push(&ask(1, 0));
    assert_eq!(b.queued(), 2);
    clock.advance(Duration::from_millis(1));
    assert!(b.poll());
    assert_eq!((b.queued(), b.stats().by_timeout), (0, 1));
    assert_eq!(take_all(&mut b).len(), 2);
    assert_eq!(b.next_deadline(), None);
    // ... and a push past the deadline sends with it.
    b.push(&ask(1, 0));
    clock.advance(Duration::from_millis(10));
    assert!(b.pop().is_none());
    b.push(&ask(2, 0));
    assert_eq!((b.queued(), b.stats().by_timeout), (0, 2));
    let got = take_all(&mut b);
    assert_eq!(got.iter().map(|(_, v)| v.len()).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn large_entries_and_large_results_come_back() {
    let ep = endpoint("rfbatch", "large");
    let f = Fabric::shm();
    // Response buffer 64 KiB (the default).
    let server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let cfg = BatcherConfig::builder()
        .max_entries(8)
        .limit(256)
        .timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    // Remote fetch only, so every server-reply call is a Large Entry fallback.
    let rf_only = RfClient::connect(
        &ep,
        &f,
        RfClientConfig::builder()
            .call_timeout(Duration::from_secs(20))
            .mode(Some(rrpc_kv::rfrpc::ModePolicy::Fixed(
                rrpc_kv::rfrpc::Mode::RemoteFetch,
            )))
            .build()
            .unwrap(),
    )
    .unwrap();
    let mut b = Batcher::new(rf_only, cfg).unwrap();
    // A request over L goes alone, after the queued ones: order kept.
    b.push(&ask(1, 0));
    b.push(&ask(1000, 1000));
    b.push(&ask(2, 0));
    assert_eq!(b.stats().large_entries, 1);
    assert_eq!(b.stats().explicit, 1);
    // §4.1 "Large Entry": the entry over L went by server-reply.
    assert_eq!(server.served_server_reply(), 1);
    // Results far over L (and over F: second READs) in one result batch.
    b.push(&ask(10_000, 0));
    b.push(&ask(20_000, 0));
    b.flush();
    let got = take_all(&mut b);
    let lens: Vec<usize> = got.iter().map(|(_, v)| v.len()).collect();
    assert_eq!(lens, [1, 1000, 2, 10_000, 20_000]);
    assert_eq!(got[1].1, sized(&ask(1000, 1000)));
    assert_eq!(b.stats().oversized_resends, 0);
    // A result batch over the response buffer: resent one per call.
    let served = server.served();
    for n in [30_000, 30_000, 30_000, 5] {
        b.push(&ask(n, 0));
    }
    b.flush();
    let got = take_all(&mut b);
    let lens: Vec<usize> = got.iter().map(|(_, v)| v.len()).collect();
    assert_eq!(lens, [30_000, 30_000, 30_000, 5]);
    assert_eq!(got[0].1, sized(&ask(30_000, 0)));
    assert_eq!(b.stats().oversized_resends, 1);
    // One batch call, then four single calls (the handler ran twice), the
    // four by server-reply.
    assert_eq!(server.served() - served, 5);
    assert_eq!(server.served_server_reply(), 1 + 4);
    // A single result over the buffer fails alone, the others succeed.
    b.push(&ask(70_000, 0));
    b.push(&ask(3, 0));
    b.flush();
    let (_, r) = b.pop().unwrap();
    assert!(
        matches!(err(&r), Some(Error::TooLarge { what: "result", .. })),
        "{r:?}"
    );
    assert_eq!(b.pop().unwrap().1.unwrap().len(), 3);

    // Without the resend, the whole batch fails with TooLarge.
    let (c, _) = b.into_inner();
    let cfg = BatcherConfig::builder()
        .max_entries(8)
        .resend_oversized(false)
        .build()
        .unwrap();
    let mut b = Batcher::new(c, cfg).unwrap();
    b.push(&ask(40_000, 0));
    b.push(&ask(40_000, 0));
    b.flush();
    for (_, r) in b.drain() {
        assert!(matches!(err(&r), Some(Error::TooLarge { .. })), "{r:?}");
    }
    assert_eq!(b.stats().failed_batches, 1);
}

/// A server that spins ~20 µs per entry; bound 1 ms. The tuner must settle
/// near bound / cost (≈ 50, less the call's own overhead).
///
/// Ignored in `cargo test`: it rests on real elapsed time, and on a loaded
/// 2-core machine scheduling stalls over 1 ms held N at 6-7 for thousands of
/// batches before it climbed (0.3-11 s to settle in ten runs). The same
/// convergence is tested deterministically on a virtual clock in
/// `rfrpc::batcher`'s unit tests; run this one on a quiet host with
/// `cargo test -p rrpc-kv --test suite -- --ignored rfrpc_batch::tuner`.
/// CI runs it that way, alone after the suite (`cargo xtask ci`, test step).
#[test]
#[ignore = "real-time tuner convergence; the virtual-clock unit tests cover it in cargo test"]
fn tuner_converges_to_the_latency_bound() {
    let ep = endpoint("rfbatch", "tune");
    let f = Fabric::shm();
    let cost = Duration::from_micros(20);
    let _server = RfServer::builder()
        .serve(&ep, &f, move |req: &[u8]| {
            let t = Instant::now();
            while t.elapsed() < cost {
                std::hint::spin_loop();
            }
            req.to_vec()
        })
        .unwrap();
    let bound = Duration::from_millis(1);
    let tuner = BatchSizeTuner::builder(bound, 0.1)
        .window(10)
        .build()
        .unwrap();
    let cfg = BatcherConfig::builder()
        .auto_tune(tuner)
        .timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let mut b = Batcher::new(client(&ep, &f), cfg).unwrap();
    assert_eq!(b.max_entries(), 1);
    let t0 = Instant::now();
    let mut sizes: Vec<usize> = Vec::new();
    let mut lat = Vec::new();
    let mut i = 0u64;
    // Settled: the last 300 batches all had N in 20..=80, within 12 of
    // each other (bound / cost is
    // 50; the call's own overhead and a loaded machine's stalls push the
    // equilibrium down). On a loaded 2-core machine, preemption stalls of
    // the spinning client or server thread (over 1 ms whatever N is) can
    // hold N at 5-20 for thousands of batches: Eq. 3 grows only after a
    // window with no batch over the bound and shrinks after 2 of 10. Hence
    // the long limit; it has settled in 1.4-4 s here.
    let settled = |s: &[usize]| {
        let Some(last) = s
            .get(s.len().saturating_sub(300)..)
            .filter(|l| l.len() == 300)
        else {
            return false;
        };
        let (lo, hi) = (last.iter().min().unwrap(), last.iter().max().unwrap());
        // In range and no longer climbing (climbing is +1 per window of
        // 10 batches, +30 over 300).
        (20..=80).contains(lo) && (20..=80).contains(hi) && hi - lo <= 12
    };
    while !settled(&sizes) && t0.elapsed() < Duration::from_secs(60) {
        let before = b.stats().batches;
        b.push(&i.to_le_bytes());
        i += 1;
        if b.stats().batches > before {
            sizes.push(b.max_entries());
            lat.push(b.last_latency().unwrap());
        }
        for (t, r) in b.drain() {
            assert_eq!(r.unwrap(), t.0.to_le_bytes());
        }
    }
    let mut lat_tail = lat[lat.len().saturating_sub(300)..].to_vec();
    lat_tail.sort();
    let median = lat_tail[lat_tail.len() / 2];
    eprintln!(
        "tuned N = {} after {} batches in {:?}; median latency of the last 300 {median:?}, \
         p90 {:?}; N every 100 batches: {:?}",
        b.max_entries(),
        sizes.len(),
        t0.elapsed(),
        lat_tail[lat_tail.len() * 9 / 10],
        sizes.iter().step_by(100).collect::<Vec<_>>()
    );
    assert!(
        settled(&sizes),
        "not settled in 20..=80: {:?}",
        &sizes[sizes.len().saturating_sub(300)..]
    );
    // The tuner works at the edge (about α of the batches over the
    // bound), so the median sits just under it; allow for a loaded machine.
    assert!(median <= bound * 3 / 2, "median {median:?}");
}

#[test]
fn a_vanished_server_is_an_error_not_a_hang() {
    let ep = endpoint("rfbatch", "gone");
    let f = Fabric::shm();
    let server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let cfg = BatcherConfig::builder().max_entries(4).build().unwrap();
    let mut b = Batcher::new(client(&ep, &f), cfg).unwrap();
    b.push(&ask(1, 0));
    b.flush();
    assert_eq!(b.pop().unwrap().1.unwrap().len(), 1);
    drop(server);
    let t0 = Instant::now();
    for _ in 0..4 {
        b.push(&ask(1, 0));
    }
    let got: Vec<_> = b.drain().collect();
    assert_eq!(got.len(), 4);
    for (_, r) in got {
        assert!(
            err(&r).is_some_and(|e| e.is_peer_gone() || matches!(e, Error::Fabric(_))),
            "{r:?}"
        );
    }
    assert_eq!(b.stats().failed_batches, 1);
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn kv_ops_batch_through_the_store() {
    let ep = endpoint("rfbatch", "kv");
    let f = Fabric::shm();
    let _server = RfServer::builder()
        .serve_execute(&ep, &f, std::sync::Arc::new(MapStore::default()))
        .unwrap();
    let cfg = BatcherConfig::builder().max_entries(8).build().unwrap();
    let mut b = KvBatcher::new(Batcher::new(client(&ep, &f), cfg).unwrap());
    for i in 0..50u32 {
        b.push(&Op::Put {
            key: format!("k{i}").into_bytes().into(),
            value: i.to_le_bytes().to_vec().into(),
        })
        .unwrap();
        b.push(&Op::Get {
            key: format!("k{i}").into_bytes().into(),
        })
        .unwrap();
    }
    b.batcher().flush();
    let mut n = 0;
    while let Some((t, r)) = b.pop() {
        let r = r.unwrap();
        if t.0 % 2 == 1 {
            let i = (t.0 / 2) as u32;
            assert_eq!(r, OpResult::Value(i.to_le_bytes().to_vec().into()));
        } else {
            assert_eq!(r, OpResult::Ok);
        }
        n += 1;
    }
    assert_eq!(n, 100);
}

/// The pipeline (§4.1): with three clients, three batches are in flight
/// at once, results still come back in push order, and `flush` collects
/// them all.
#[test]
fn pipeline_keeps_batches_in_flight_and_results_in_order() {
    let ep = endpoint("rfbatch", "pipe");
    let f = Fabric::shm();
    let _server = RfServer::builder()
        .threads(2)
        .serve(&ep, &f, |req: &[u8]| req.to_vec())
        .unwrap();
    let clients = (0..3).map(|_| client(&ep, &f)).collect();
    let cfg = BatcherConfig::builder().max_entries(8).build().unwrap();
    let mut b = Batcher::with_clients(clients, cfg).unwrap();
    let mut got = Vec::new();
    for i in 0..1_000u64 {
        b.push(&i.to_le_bytes());
        assert!(b.in_flight() <= 3);
        got.extend(b.drain());
    }
    assert_eq!(b.stats().max_in_flight, 3, "{:?}", b.stats());
    b.flush();
    assert_eq!(b.in_flight(), 0);
    got.extend(b.drain());
    assert_eq!(got.len(), 1_000);
    for (i, (t, r)) in got.into_iter().enumerate() {
        assert_eq!(t.0, i as u64);
        assert_eq!(r.unwrap(), (i as u64).to_le_bytes());
    }
    let calls: u64 = b.clients().iter().map(|c| c.stats().calls).sum();
    assert_eq!(calls, b.stats().batches);
    assert!(b.clients().iter().all(|c| c.stats().calls > 0));
}

/// The threshold of outstanding requests bounds the pipeline below the
/// number of clients: 16 requests at 8 per batch is two batches.
#[test]
fn pipeline_threshold_bounds_outstanding_requests() {
    let ep = endpoint("rfbatch", "pipe-max");
    let f = Fabric::shm();
    let _server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let clients = (0..4).map(|_| client(&ep, &f)).collect();
    let cfg = BatcherConfig::builder()
        .max_entries(8)
        .max_outstanding(16)
        .build()
        .unwrap();
    let mut b = Batcher::with_clients(clients, cfg).unwrap();
    for _ in 0..400 {
        b.push(&ask(2, 0));
    }
    b.flush();
    assert_eq!(b.stats().max_in_flight, 2, "{:?}", b.stats());
    assert_eq!(b.drain().filter(|(_, r)| r.is_ok()).count(), 400);
    assert!(BatcherConfig::builder().max_outstanding(0).build().is_err());
}

/// A large entry and a too-large result batch in the middle of a pipeline
/// keep push order: every batch in flight is collected first.
#[test]
fn pipeline_keeps_order_around_large_entries_and_results() {
    let ep = endpoint("rfbatch", "pipe-large");
    let f = Fabric::shm();
    let _server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let clients = (0..2).map(|_| client(&ep, &f)).collect();
    let cfg = BatcherConfig::builder()
        .max_entries(4)
        .limit(512)
        .build()
        .unwrap();
    let mut b = Batcher::with_clients(clients, cfg).unwrap();
    let mut want = Vec::new();
    for i in 0..60usize {
        let (n, pad) = match i % 20 {
            // Over L: a single call.
            7 => (3, 600),
            // Two results that overflow their batch's 64 KiB response buffer.
            13 | 14 => (40_000, 0),
            _ => (i % 5, 0),
        };
        b.push(&ask(n, pad));
        want.push(n);
    }
    b.flush();
    let got: Vec<_> = b.drain().collect();
    assert_eq!(got.len(), want.len());
    for (i, ((t, r), n)) in got.into_iter().zip(want).enumerate() {
        assert_eq!(t.0, i as u64);
        assert_eq!(r.unwrap().len(), n, "request {i}");
    }
    assert!(b.stats().large_entries >= 3 && b.stats().oversized_resends >= 1);
}

/// A server that goes away with batches in flight: every request of every
/// batch fails, none hangs.
#[test]
fn pipeline_to_a_vanished_server_fails_every_request() {
    let ep = endpoint("rfbatch", "pipe-gone");
    let f = Fabric::shm();
    let server = RfServer::builder().serve(&ep, &f, sized).unwrap();
    let clients = (0..3).map(|_| client(&ep, &f)).collect();
    let cfg = BatcherConfig::builder().max_entries(4).build().unwrap();
    let mut b = Batcher::with_clients(clients, cfg).unwrap();
    b.push(&ask(1, 0));
    b.flush();
    assert_eq!(b.pop().unwrap().1.unwrap().len(), 1);
    drop(server);
    let t0 = Instant::now();
    for _ in 0..40 {
        b.push(&ask(1, 0));
    }
    b.flush();
    let got: Vec<_> = b.drain().collect();
    assert_eq!(got.len(), 40);
    for (_, r) in got {
        assert!(
            err(&r).is_some_and(|e| e.is_peer_gone() || matches!(e, Error::Fabric(_))),
            "{r:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
}
