//! The connect suite (`cargo xtask bench connect`): connect time with and without the
//! connection pool, connections per second, and memory per idle connection, each against
//! tonic in the same run. With `--role serve --transport NAME` it is the separate server
//! process of `idle_memory` (started by the suite).

use anyhow::{Context, Result, bail};
use clap::Parser;
use rrpc_bench::{Report, SuiteArgs, connect, rpc};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Run only these experiments (comma-separated prefixes): connect_time, idle_memory, shared_qp,
    /// reconnect_storm, connect_rounds.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// `serve`: the server process of `idle_memory`; `storm-serve`: the server process of
    /// `reconnect_storm` (needs `--listen`).
    #[arg(long)]
    role: Option<String>,
    /// Storm-serve role: the address to serve at (`127.0.0.1:PORT` for tonic-tcp, an rrpc
    /// URI otherwise).
    #[arg(long)]
    listen: Option<String>,
    /// Serve role: transport (`tonic-tcp`, `tonic-uds`, `rrpc-shm-h2`, `rrpc-shm-fast`).
    #[arg(long)]
    transport: Option<String>,
    /// Serve role: CPU to pin the server's worker to.
    #[arg(long)]
    cpu: Option<usize>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.role.as_deref() {
        None => {
            let mut report = Report::new("connect", &cli.suite)?;
            let r = connect::run_suite(&cli.suite, &mut report, &cli.only);
            report.finish()?;
            r
        }
        Some("serve") => {
            let name = cli.transport.context("--transport is required")?;
            let t = rpc::Transport::parse(&name)
                .with_context(|| format!("unknown transport {name}"))?;
            rpc::serve_child(t, cli.cpu)
        }
        Some("storm-serve") => {
            let name = cli.transport.context("--transport is required")?;
            let t = rpc::Transport::parse(&name)
                .with_context(|| format!("unknown transport {name}"))?;
            let listen = cli.listen.context("--listen is required")?;
            connect::serve_storm(t, &listen, cli.cpu)
        }
        Some(other) => bail!("unknown role {other}"),
    }
}
