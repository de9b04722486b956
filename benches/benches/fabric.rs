//! Criterion: the fabric's hot path (shm post_write + poll), in one process, next to memcpy.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rrpc_bench::fabric::FabricPair;
use rrpc_core::Completion;

fn post_poll(c: &mut Criterion) {
    let pair = FabricPair::in_process().expect("in-process shm pair");
    let mut wc = [Completion::EMPTY; 4];
    let mut g = c.benchmark_group("fabric");
    for len in [64usize, 4096, 1 << 20] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("write+poll", len), &len, |b, &len| {
            b.iter(|| {
                pair.write(1, 0, len, true).expect("post");
                pair.reap(1, &mut wc).expect("poll");
            })
        });
        let src = vec![1u8; len];
        let mut dst = vec![0u8; len];
        g.bench_with_input(BenchmarkId::new("memcpy", len), &len, |b, _| {
            b.iter(|| {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, post_poll);
criterion_main!(benches);
