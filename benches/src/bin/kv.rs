//! The kv suite (`cargo xtask bench kv`): the rrpc-kv store over RF-RPC (remote fetch, server
//! reply, hybrid; batching and its tuner) and YCSB A-F over gRPC/TCP, gRPC/rrpc-tonic, Redis
//! and RF-RPC. Also re-executed as the server process (`--role kv-server`).

use anyhow::{Result, bail};
use clap::Parser;
use rrpc_bench::{Report, SuiteArgs, kv};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Internal: `kv-server` runs a server process (see `rrpc_bench::kv::run_server`).
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Run only these experiments (comma-separated prefixes): rfrpc, batch, ycsb.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The YCSB workloads of `ycsb` (comma-separated, e.g. `c`; default all six).
    #[arg(long, value_delimiter = ',')]
    ycsb_workloads: Vec<rrpc_kv::ycsb::Core>,
    #[command(flatten)]
    server: kv::ServerArgs,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.role.as_deref() {
        Some("kv-server") => return kv::run_server(&cli.server),
        Some(r) => bail!("unknown role {r:?}"),
        None => {}
    }
    let mut report = Report::new("kv", &cli.suite)?;
    kv::run_suite(&cli.suite, &mut report, &cli.only, &cli.ycsb_workloads)?;
    report.finish()
}
