//! `cargo run --release -p rrpc-bench --bin fabric-demo`: a short run of the fabric suite that
//! prints shm WRITE latency and bandwidth next to memcpy's (writes its tables to
//! `target/bench-results/<time>-fabric-demo/`).

fn main() -> anyhow::Result<()> {
    rrpc_bench::fabric::main("fabric-demo", true)
}
