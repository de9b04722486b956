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
//!
//! `--role stream --transport NAME --clients K --duration-ms D` (NAME also `tonic-inproc`, the
//! floor: no transport) runs one point of
//! `small_rpc_throughput` (32 B / 8 B, 32 in flight per client, same pinning) in one process and
//! prints every message it counted: a profiler's view of one point. With `--wait-stdin` it
//! connects, prints `ready` on stderr, and starts the load when a line arrives on stdin (so a
//! script can switch callgrind's instrumentation on first: `callgrind_control -i on`); then it
//! counts every response from the first; at the end each client stops sending and
//! drains its stream, so that every request sent is answered and counted. `--messages N`
//! stops after N calls in all instead of after `--duration-ms`. It also prints each worker's
//! parks per message and, for rrpc, the poller's counters over the load.

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
    /// Stream role: connect, print `ready` on stderr, wait for a line on stdin, then load.
    #[arg(long)]
    wait_stdin: bool,
    /// Stream role: stop after this many calls in all (split evenly among the clients)
    /// instead of after `--duration-ms` (a profile's work is then the same however slowly
    /// the machine runs it).
    #[arg(long)]
    messages: Option<u64>,
    /// Stream role: the rrpc rings' `min_ring_size` in bytes (where a self-sizing ring
    /// starts; its idle size is clamped to it, its largest size to 128 times it), to see what
    /// the rings' memory footprint costs.
    #[arg(long)]
    min_ring_size: Option<usize>,
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
        Some("stream") => {
            let name = cli.transport.context("--transport is required")?;
            // `tonic-inproc`: no transport (the floor), the tonic rows' server in the
            // clients' process and runtime.
            let inproc = name == "tonic-inproc";
            let t = if inproc {
                rpc::Transport::TonicTcp
            } else {
                rpc::Transport::parse(&name).with_context(|| format!("unknown transport {name}"))?
            };
            let stop = match cli.messages {
                Some(n) => Stop::After(n.div_ceil(cli.clients.max(1) as u64)),
                None => Stop::At(Duration::from_millis(cli.duration_ms)),
            };
            let mut cfg = rpc::rrpc_config(t);
            if let Some(n) = cli.min_ring_size {
                let idle = cfg.ring_idle_size().min(n);
                // A ring grows to at most 128 times where it starts.
                let most = cfg.ring_size().min(n.saturating_mul(128));
                cfg = cfg
                    .to_builder()
                    .ring_size(most)
                    .min_ring_size(n)
                    .ring_idle_size(idle)
                    .build()?;
            }
            stream_point(t, inproc, cfg, cli.clients, stop, cli.wait_stdin)
        }
        Some(other) => bail!("unknown role {other}"),
    }
}

/// When `--role stream` stops.
#[derive(Clone, Copy)]
enum Stop {
    /// After this long.
    At(Duration),
    /// After this many calls per client.
    After(u64),
}

/// `--role stream`: one point of `small_rpc_throughput`, every response counted (no warm-up
/// window), for a profiler.
fn stream_point(
    t: rpc::Transport,
    inproc: bool,
    cfg: rrpc_tonic::RrpcConfig,
    k: usize,
    stop_at: Stop,
    wait: bool,
) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use rrpc_bench::rpc::pb::Req;
    use rrpc_bench::rpc::pb::bench_client::BenchClient;
    use rrpc_bench::rpc::pb::bench_server::BenchServer;

    let server_rt = rpc::runtime("bench-server", rrpc_bench::ThreadPlan::cpu(0))?;
    let client_rt = rpc::runtime("bench-client", rrpc_bench::ThreadPlan::cpu(1))?;
    // The poller the rrpc rows run on (shared by server and clients), for its counters.
    let poller = match t {
        rpc::Transport::RrpcH2 | rpc::Transport::RrpcFast => {
            Some(rrpc_tonic::RrpcContext::shared(&cfg).poller_handle()?)
        }
        _ => None,
    };
    let server = rpc::start_server_with(&server_rt, t, cfg)?;
    let clients = if inproc {
        (0..k)
            .map(|_| rpc::AnyClient::Inproc(BenchClient::new(BenchServer::new(rpc::Svc))))
            .collect()
    } else {
        client_rt.block_on(rpc::connect_many(&server, k))?
    };
    if wait {
        eprintln!("ready");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
    }
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let per_client = match stop_at {
        Stop::After(n) => n,
        Stop::At(_) => u64::MAX,
    };
    // Worker parks (each a sleep and a wake-up of the runtime's one worker).
    let parks = |rt: &tokio::runtime::Runtime| rt.metrics().worker_park_count(0);
    let (sp0, cp0) = (parks(&server_rt), parks(&client_rt));
    let before = poller.as_ref().map(|p| p.stats());
    let t0 = std::time::Instant::now();
    client_rt.block_on(async {
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|mut c| {
                let (count, stop) = (count.clone(), stop.clone());
                tokio::spawn(async move {
                    let (tx, rx) = tokio::sync::mpsc::channel(64);
                    let req = Req {
                        payload: vec![1; 32],
                        resp_len: 8,
                    };
                    let mut sent = 0u64;
                    while sent < per_client.min(32) {
                        tx.send(req.clone()).await?;
                        sent += 1;
                    }
                    let mut inbound = c.stream(rx).await?;
                    let mut got = 0u64;
                    while got < sent && inbound.message().await?.is_some() {
                        got += 1;
                        count.fetch_add(1, Ordering::Relaxed);
                        if !stop.load(Ordering::Relaxed) && sent < per_client {
                            tx.send(req.clone()).await?;
                            sent += 1;
                        }
                    }
                    // Every request sent is answered and counted (drained, not cancelled),
                    // so that a profile's instructions divide by every message it handled.
                    drop(tx);
                    while inbound.message().await?.is_some() {}
                    anyhow::Ok(())
                })
            })
            .collect();
        if let Stop::At(dur) = stop_at {
            tokio::time::sleep(dur).await;
            stop.store(true, Ordering::Relaxed);
        }
        for task in tasks {
            task.await??;
        }
        anyhow::Ok(())
    })?;
    let n = count.load(Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "transport={} clients={k} messages={n} secs={secs:.3} krps={:.1}",
        if inproc { "tonic-inproc" } else { t.name() },
        n as f64 / secs / 1e3
    );
    let per = |x: u64| x as f64 / n.max(1) as f64;
    println!(
        "worker parks per message: server {:.4} client {:.4}",
        per(parks(&server_rt) - sp0),
        per(parks(&client_rt) - cp0)
    );
    if let (Some(p), Some(b)) = (&poller, before) {
        println!("poller over the load: {:?}", p.stats().since(&b));
    }
    drop(server);
    Ok(())
}
