//! The rpc suite (`cargo xtask bench rpc`): tonic-TCP, tonic-UDS, rrpc shm HTTP/2 and rrpc shm
//! fast path, in one run. With `--role server|client` it is one process of cluster mode
//! (`cargo xtask bench rpc --hosts hosts.toml`); with `--role serve --transport NAME` it is the
//! separate server process of the per-side CPU/memory experiments, and with `--role hog` one
//! busy loop of the contention experiment (both started by the suite).
//!
//! `RRPC_BENCH_CLIENTS=128,256` replaces the client counts of Figs. 8 and 10
//! (`connmgmt_4k_*`, `small_rpc_throughput`): one load point looked at alone.
//! `RRPC_BENCH_POLLER_STATS=1` prints poller counters on stderr (spins, sleeps, announces,
//! doorbell wakes, back-offs): over each rrpc-tonic default row of Fig. 8, the client
//! process's over each rrpc row of `low_load`, and every second a separate rrpc server
//! process's own (`--role serve`: `low_load`, `resources_*`, `contention`, `idle_connections`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use rrpc_bench::{Report, SuiteArgs, rpc};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Run only these experiments (comma-separated; a prefix selects every experiment it
    /// starts, e.g. `resources`): pingpong_latency, small_rpc_throughput,
    /// connmgmt_4k_continuous, connmgmt_4k_interval, ring_size_bandwidth,
    /// zero_copy_bandwidth, resources_heavy, resources_low, low_load,
    /// contention, idle_connections.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Cluster mode role: `server` or `client` (default: the single-host suite).
    #[arg(long)]
    role: Option<String>,
    /// Server role: address to listen on.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Client role: server address.
    #[arg(long)]
    connect: Option<SocketAddr>,
    /// Client role: concurrent client connections.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Serve role: transport (`tonic-tcp`, `tonic-uds`, `rrpc-shm-h2`, `rrpc-shm-fast`).
    #[arg(long)]
    transport: Option<String>,
    /// Serve role: CPU to pin the server's worker to (hog role: the CPU to spin on).
    #[arg(long)]
    cpu: Option<usize>,
    /// Client role: measured milliseconds.
    #[arg(long, default_value_t = 10_000)]
    duration_ms: u64,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.role.as_deref() {
        None => {
            let mut report = Report::new("rpc", &cli.suite)?;
            let r = rpc::run_suite(&cli.suite, &mut report, &cli.only);
            report.finish()?;
            r
        }
        Some("server") => rpc::cluster_server(cli.listen.context("--listen is required")?),
        Some("client") => rpc::cluster_client(
            cli.connect.context("--connect is required")?,
            cli.clients,
            Duration::from_millis(cli.duration_ms),
        ),
        Some("serve") => {
            let name = cli.transport.context("--transport is required")?;
            let t = rpc::Transport::parse(&name)
                .with_context(|| format!("unknown transport {name}"))?;
            rpc::serve_child(t, cli.cpu)
        }
        Some("hog") => rpc::hog(cli.cpu),
        Some(other) => bail!("unknown role {other}"),
    }
}
