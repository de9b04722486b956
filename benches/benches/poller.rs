//! Criterion: the poller's hot paths over real shm rings.
//!
//! - `poller_scan/<n>`: what one armed connection costs a polling thread per scan (`n`
//!   connections, every receive task asleep and armed, one BPEV polling thread scanning
//!   without parking), beside the baseline `ring_check/<n>`: the bare `RxWatch::has_data`
//!   loop over the same rings, which no scan can beat.
//! - `wait_ready_hit/<mode>`: `Registration::wait_ready` when data is already there (the first
//!   check succeeds), beside the baseline `ready_check`: the source's own `ready()`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::FutureExt as _;
use rrpc_poller::rings::AsyncConn;
use rrpc_poller::{Mode, PollerConfig, Readiness};
use rrpc_ringbuf::RingConfig;

fn ring() -> RingConfig {
    RingConfig::builder()
        .ring_size(64 * 1024)
        .huge_pages(false)
        .build()
        .expect("ring config")
}

fn scan(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("poller_scan");
    g.measurement_time(Duration::from_secs(2));
    for n in [16usize, 256] {
        // The paper's BPEV polling thread: never parks, scans every armed connection.
        let poller = rt
            .block_on(async {
                rrpc_poller::Poller::start(
                    PollerConfig::paper(Mode::Bpev)
                        .to_builder()
                        .polling_threads(1)
                        .bp_timeout(Duration::ZERO)
                        .build()?,
                )
            })
            .expect("poller");
        let mut peers = Vec::new();
        for _ in 0..n {
            let (client, server) = AsyncConn::loopback_pair(&poller, &ring()).expect("pair");
            peers.push(client.into_parts());
            let _g = rt.enter();
            let (tx, mut rx) = server.split().expect("split");
            rt.spawn(async move {
                let _tx = tx;
                while rx.recv().await.is_ok() {}
            });
        }
        // Wait until every receive task is asleep (armed).
        let t0 = Instant::now();
        while poller.stats().sleeps < n as u64 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("armed_connection", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let p0 = poller.stats().polls;
                let t = Instant::now();
                while poller.stats().polls - p0 < iters {
                    std::hint::spin_loop();
                }
                t.elapsed()
            })
        });
        // Baseline: the bare readiness check of the same rings, in a loop.
        let rx_watches: Vec<_> = peers.iter().map(|(_, _, rx)| rx.watch()).collect();
        g.bench_with_input(BenchmarkId::new("ring_check", n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % rx_watches.len();
                black_box(rx_watches[i].has_data())
            })
        });
        drop(peers);
        poller.shutdown();
    }
    g.finish();
    rt.shutdown_timeout(Duration::from_secs(1));
}

/// A source that is always ready (a ring with unread data).
struct Ready(AtomicU64);

impl Readiness for Ready {
    fn ready(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}

fn wait_hit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let mut g = c.benchmark_group("wait_ready_hit");
    let src = Arc::new(Ready(AtomicU64::new(1)));
    g.bench_function("ready_check", |b| b.iter(|| black_box(src.ready())));
    for mode in Mode::ALL {
        let poller = rrpc_poller::Poller::start(
            PollerConfig::builder()
                .mode(mode)
                .polling_threads(1)
                .build()
                .expect("valid"),
        )
        .expect("poller");
        let mut reg = poller.register(src.clone()).expect("register");
        g.bench_function(mode.name(), |b| {
            b.iter(|| {
                reg.wait_ready()
                    .now_or_never()
                    .expect("ready source")
                    .expect("no error")
            })
        });
        drop(reg);
        poller.shutdown();
    }
    g.finish();
}

criterion_group!(benches, scan, wait_hit);
criterion_main!(benches);
