//! The fabric suite (`cargo xtask bench fabric`): shm WRITE throughput and latency between two
//! processes next to memcpy. Also re-executed as the target process (`--role target`).

use anyhow::Result;
use clap::Parser;
use rrpc_bench::{Report, SuiteArgs, fabric};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Internal: `target` runs the idle peer that grants the written region.
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Internal: the target's side-channel endpoint.
    #[arg(long, hide = true)]
    endpoint: Option<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.role.as_deref() == Some("target") {
        return fabric::run_target(cli.endpoint.as_deref().unwrap_or_default());
    }
    let mut report = Report::new("fabric", &cli.suite)?;
    fabric::run_suite(&cli.suite, &mut report)?;
    report.finish()
}
