//! Criterion: one 64 B / 8 B unary call, tonic over TCP (baseline) beside rrpc over shm
//! (fast path), one connection each.

use criterion::{Criterion, criterion_group, criterion_main};
use rrpc_bench::rpc::{Transport, connect, pb::Req, start_server};

fn unary(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("rpc_unary_64B");
    for t in [Transport::TonicTcp, Transport::RrpcFast] {
        let server = start_server(&rt, t).expect("server");
        let mut client = rt.block_on(connect(&server)).expect("connect");
        g.bench_function(t.name(), |b| {
            b.iter(|| {
                let req = Req {
                    payload: vec![1; 64],
                    resp_len: 8,
                };
                rt.block_on(client.unary(req)).expect("call")
            })
        });
        drop(server);
    }
    g.finish();
}

criterion_group!(benches, unary);
criterion_main!(benches);
