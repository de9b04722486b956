//! Criterion: the RB² ring's hot path in one process over an shm pair —
//! write (zero-copy reserve + fill + commit) and read (borrow + release) of
//! 64 B and 4 KiB messages in bursts of 32 with a flush per burst, next to
//! an rtrb push/pop of the same bytes. Single-threaded, so it measures the
//! instruction path, not cross-core cache traffic (the `ringbuf` suite does
//! that between two processes).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Fabric, FabricAddr, QpConfig};
use rrpc_ringbuf::{LocalRing, RingConfig, RingRx, RingTx};

const BURST: u64 = 32;

struct Pair {
    tx: RingTx,
    rx: RingRx,
    _conns: (Connection, Connection),
    _keep: (RingRx, RingTx),
}

fn pair() -> Pair {
    let dir = std::env::temp_dir().join(format!("rrpc-crit-rb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ep = FabricAddr::parse(&format!("shm://{}/s.sock", dir.display())).expect("uri");
    let cfg = RingConfig::default();
    let fabric = Fabric::shm();
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default()).expect("bind");
    let (f2, c2) = (fabric.clone(), cfg.clone());
    let server = std::thread::spawn(move || {
        let local = LocalRing::new(&f2, &c2).expect("ring");
        let c = listener
            .accept()
            .expect("accept")
            .accept(
                f2.create_qp(&QpConfig::default()).expect("qp"),
                local.add_to_offer(Offer::new()),
            )
            .expect("handshake");
        let (tx, rx) = local.connect(&c).expect("connect");
        (c, tx, rx)
    });
    let local = LocalRing::new(&fabric, &cfg).expect("ring");
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default()).expect("qp"),
        local.add_to_offer(Offer::new()),
        &HandshakeConfig::default(),
    )
    .expect("connect");
    let (tx, rx1) = local.connect(&c).expect("connect");
    let (c2, tx2, rx) = server.join().expect("server thread");
    let _ = std::fs::remove_dir_all(&dir);
    Pair {
        tx,
        rx,
        _conns: (c, c2),
        _keep: (rx1, tx2),
    }
}

/// `iters` messages of `len` bytes through the ring, in bursts of `BURST`.
fn ring_burst(p: &mut Pair, len: usize, iters: u64) -> Duration {
    let payload = vec![0x5au8; len];
    let t = Instant::now();
    let mut done = 0;
    while done < iters {
        let n = BURST.min(iters - done);
        for _ in 0..n {
            let mut g = p.tx.try_reserve(len).expect("ring has room");
            g.copy_from_slice(std::hint::black_box(&payload));
            g.commit().expect("commit");
        }
        p.tx.flush().expect("flush");
        for _ in 0..n {
            let m = p.rx.try_recv().expect("flushed message");
            std::hint::black_box(m[len - 1]);
        }
        done += n;
    }
    t.elapsed()
}

fn rtrb_burst(len: usize, iters: u64) -> Duration {
    let (mut tx, mut rx) = rtrb::RingBuffer::<u8>::new(4 << 20);
    let payload = vec![0x5au8; len];
    let mut out = vec![0u8; len];
    let t = Instant::now();
    let mut done = 0;
    while done < iters {
        let n = BURST.min(iters - done);
        for _ in 0..n {
            let chunk = tx.write_chunk_uninit(len).expect("room");
            let written = chunk.fill_from_iter(std::hint::black_box(&payload).iter().copied());
            debug_assert_eq!(written, len);
        }
        for _ in 0..n {
            let chunk = rx.read_chunk(len).expect("data");
            let (a, b) = chunk.as_slices();
            out[..a.len()].copy_from_slice(a);
            out[a.len()..].copy_from_slice(b);
            chunk.commit_all();
            std::hint::black_box(out[len - 1]);
        }
        done += n;
    }
    t.elapsed()
}

fn ring(c: &mut Criterion) {
    let mut p = pair();
    let mut g = c.benchmark_group("ringbuf");
    for len in [64usize, 4096] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("rb2 write+read", len), &len, |b, &len| {
            b.iter_custom(|iters| ring_burst(&mut p, len, iters))
        });
        g.bench_with_input(BenchmarkId::new("rtrb write+read", len), &len, |b, &len| {
            b.iter_custom(|iters| rtrb_burst(len, iters))
        });
    }
    g.finish();
}

criterion_group!(benches, ring);
criterion_main!(benches);
