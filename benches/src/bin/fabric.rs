//! The fabric suite (`cargo xtask bench fabric`): shm WRITE throughput and latency between two
//! processes next to memcpy. Also re-executed as the target process (`--role target`).

fn main() -> anyhow::Result<()> {
    rrpc_bench::fabric::main("fabric", false)
}
