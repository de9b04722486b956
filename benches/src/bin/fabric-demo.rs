//! `cargo run --release -p rrpc-bench --bin fabric-demo`: a short run of the fabric suite that
//! prints shm WRITE latency and bandwidth next to memcpy's (writes its tables to
//! `target/bench-results/<time>-fabric-demo/`).

use anyhow::Result;
use clap::Parser;
use rrpc_bench::{Report, SuiteArgs, fabric};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    #[arg(long, hide = true)]
    role: Option<String>,
    #[arg(long, hide = true)]
    endpoint: Option<String>,
}

fn main() -> Result<()> {
    let mut cli = Cli::parse();
    if cli.role.as_deref() == Some("target") {
        return fabric::run_target(cli.endpoint.as_deref().unwrap_or_default());
    }
    cli.suite.quick = true;
    let mut report = Report::new("fabric-demo", &cli.suite)?;
    fabric::run_suite(&cli.suite, &mut report)?;
    report.finish()
}
