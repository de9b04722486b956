//! `rrpc-kv-bench`: the YCSB core workloads (RR-Compound §V-E, Table IV)
//! against a key-value server, over gRPC (TCP, `shm://`, `rdma://`) or Redis.
//!
//! ```text
//! rrpc-kv-bench --workload a --records 20000 --ops 20000 --clients 8 \
//!     --target grpc+shm:///tmp/rrpc-kv.sock --csv out.csv
//! ```
//!
//! The load phase inserts `--records` records (spread over the clients),
//! then the run phase issues `--ops` transactions of the workload's mix from
//! `--clients` tokio tasks, each with its own connection and one operation
//! in flight (closed loop, as YCSB's client threads). Latencies go into an
//! hdrhistogram per operation type; the table (and `--csv`) gives count,
//! errors, throughput, mean, p50, p99, p99.9 and max per type.
//!
//! Targets (`--target`):
//!
//! | target | backend |
//! |---|---|
//! | `grpc+tcp://HOST:PORT` | `rrpc.kv.v1.Kv` over tonic's TCP (through rrpc-tonic's channel) |
//! | `grpc+shm:///PATH` | the same over rrpc-tonic's shared-memory rings |
//! | `grpc+rdma://IP:PORT` | the same over RDMA rings (build with `--features verbs`) |
//! | `grpc+rrpc://HOST:PORT` | the same on an `rrpc://` port: the best fabric both ends share (shm on one host, verbs, else TCP) |
//! | `redis://HOST:PORT` | Redis, one connection per client, unpipelined `GET`/`SET`/`DEL` |
//! | `rfrpc+shm:///PATH`, `rfrpc+rdma://IP:PORT` | RF-RPC (remote fetching) straight to the store |
//!
//! RF-RPC targets take `--rf-mode` (`hybrid`, `remote-fetch`,
//! `server-reply`), `--batch N` (each client sends its operations in
//! request batches of up to N, §4.1; every operation of a batch records the
//! batch's latency) and `--pipeline D` (D batches in flight per client, one
//! connection each).
//!
//! On Redis, workload E's scans are emulated as YCSB's Redis binding does
//! (see [`rrpc_kv::ycsb::redis`], shared with the `kv` benchmark suite).
//!
//! Another backend plugs in as a [`Backend`] variant: a connector in
//! [`Backend::connect`] and an arm in [`Backend::execute_inner`]; the
//! driver loop is [`rrpc_kv::ycsb::driver`]'s. Anything that is
//! an [`Execute`] (an in-process store, an RF-RPC client) can use
//! [`Backend::Execute`] as it is.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use rrpc_core::FabricAddr;
use rrpc_kv::grpc::GrpcKv;
use rrpc_kv::rfrpc::{
    self, Batcher, BatcherConfig, KvBatcher, KvClient, Mode, ModePolicy, RfClient, RfClientConfig,
};
use rrpc_kv::ycsb::driver::{self, Client, Errors};
use rrpc_kv::ycsb::{Core, Distribution, Summary, Workload, WorkloadConfig};
use rrpc_kv::{Execute, Op, OpResult};
use rrpc_tonic::{RrpcChannel, RrpcConfig};

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "rrpc-kv-bench",
    about = "YCSB core workloads against an rrpc-kv (or Redis) server"
)]
struct Args {
    /// The YCSB core workload: a, b, c, d, e or f.
    #[arg(long, default_value = "a", value_parser = parse_core)]
    workload: Core,
    /// Records inserted by the load phase (the paper: 20 000).
    #[arg(long, default_value_t = 20_000)]
    records: u64,
    /// Transactions of the run phase (the paper: 20 000).
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Bytes per value (YCSB: 10 fields of 100 bytes).
    #[arg(long, default_value_t = 1000)]
    value_size: usize,
    /// Key choice: zipfian, uniform or latest (default: the workload's own,
    /// latest for d, zipfian for the others).
    #[arg(long, value_parser = parse_distribution)]
    distribution: Option<Distribution>,
    /// Concurrent clients (tokio tasks, one connection each).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    clients: u32,
    /// grpc+tcp://HOST:PORT, grpc+shm:///PATH, grpc+rdma://IP:PORT,
    /// grpc+rrpc://HOST:PORT or redis://HOST:PORT.
    #[arg(long)]
    target: String,
    /// Append the results to this CSV file (a header is written to a new file).
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Seed of the workload's PRNG.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the load phase (the server already holds the records).
    #[arg(long)]
    skip_load: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// The verbs device for grpc+rdma:// (default: the first one listed).
    #[arg(long)]
    rdma_device: Option<String>,
    /// Seconds to wait for each connection.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    /// RF-RPC targets: who delivers the results: `hybrid` (the switch),
    /// `remote-fetch` or `server-reply` (default: the server's policy).
    #[arg(long, value_parser = parse_rf_mode)]
    rf_mode: Option<ModePolicy>,
    /// RF-RPC targets: each client sends its operations in request batches
    /// of up to N (§4.1; 1 = no batching). A batch's operations all record
    /// the batch's latency.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    batch: u32,
    /// RF-RPC targets with `--batch`: batches in flight per client (the
    /// §4.1 pipeline; one connection per batch in flight).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pipeline: u32,
}

fn parse_rf_mode(s: &str) -> Result<ModePolicy, String> {
    match s {
        "hybrid" => Ok(ModePolicy::Hybrid),
        "remote-fetch" | "rf-rpc" => Ok(ModePolicy::Fixed(Mode::RemoteFetch)),
        "server-reply" => Ok(ModePolicy::Fixed(Mode::ServerReply)),
        _ => Err(format!(
            "unknown RF-RPC mode {s:?} (hybrid, remote-fetch, server-reply)"
        )),
    }
}

fn parse_core(s: &str) -> Result<Core, String> {
    s.parse().map_err(|e: rrpc_kv::Error| e.to_string())
}

fn parse_distribution(s: &str) -> Result<Distribution, String> {
    s.parse().map_err(|e: rrpc_kv::Error| e.to_string())
}

/// Where the operations go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// The gRPC face at this rrpc-tonic URI (`http://`, `shm://`, `rdma://`).
    Grpc(String),
    /// Redis at this URL.
    Redis(String),
    /// RF-RPC (remote fetching) at this rrpc-core endpoint (`shm://`,
    /// `rdma://`), straight to the store without gRPC.
    Rfrpc(String),
}

impl Target {
    fn parse(s: &str) -> anyhow::Result<Target> {
        let forms = "grpc+tcp://HOST:PORT, grpc+shm:///PATH, grpc+rdma://IP:PORT, \
                     grpc+rrpc://HOST:PORT, \
                     rfrpc+shm:///PATH, rfrpc+rdma://IP:PORT or redis://HOST:PORT";
        let Some((scheme, rest)) = s.split_once("://") else {
            bail!("target {s:?} has no scheme; expected {forms}");
        };
        if rest.is_empty() {
            bail!("target {s:?} has no address; expected {forms}");
        }
        Ok(match scheme {
            "grpc+tcp" => Target::Grpc(format!("http://{rest}")),
            "grpc+shm" => Target::Grpc(format!("shm://{rest}")),
            "grpc+rdma" => Target::Grpc(format!("rdma://{rest}")),
            "grpc+rrpc" => Target::Grpc(format!("rrpc://{rest}")),
            "redis" => Target::Redis(s.to_string()),
            "rfrpc+shm" => Target::Rfrpc(format!("shm://{rest}")),
            "rfrpc+rdma" => Target::Rfrpc(format!("rdma://{rest}")),
            _ => bail!("unknown target scheme {scheme:?} in {s:?}; expected {forms}"),
        })
    }
}

/// One client's connection to the system under test.
enum Backend {
    /// The gRPC face, one RPC per operation.
    Grpc(GrpcKv<RrpcChannel>),
    /// Redis; `index` keeps the sorted set that scans need.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        index: bool,
    },
    /// RF-RPC's blocking client, called on tokio's blocking pool (one
    /// blocking call per operation: a thread hop the gRPC backends do not
    /// pay; the `kv` benchmark suite drives RF-RPC from plain threads).
    Rfrpc(Arc<KvClient>),
    /// RF-RPC with client-side batching (and a pipeline of several
    /// connections), driven on tokio's blocking pool one chunk of
    /// operations at a time.
    RfBatch(Arc<Mutex<KvBatcher>>),
    /// Any [`Execute`], called on tokio's blocking pool (for an in-process
    /// store).
    #[allow(dead_code)]
    Execute(Arc<dyn Execute>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Grpc(_) => "Grpc",
            Backend::Redis { .. } => "Redis",
            Backend::Rfrpc(_) => "Rfrpc",
            Backend::RfBatch(_) => "RfBatch",
            Backend::Execute(_) => "Execute",
        })
    }
}

impl Backend {
    /// A new connection to `target`; `scans`: the workload scans.
    async fn connect(
        target: &Target,
        scans: bool,
        timeout: Duration,
        rrpc: &RrpcConfig,
        args: &Args,
    ) -> anyhow::Result<Backend> {
        let rdma_device = args.rdma_device.as_deref();
        let connect = async {
            Ok(match target {
                Target::Grpc(uri) => Backend::Grpc(
                    GrpcKv::connect(uri, rrpc.clone())
                        .await
                        .with_context(|| format!("cannot connect to {uri}"))?,
                ),
                Target::Redis(url) => {
                    let client = redis::Client::open(url.as_str())
                        .with_context(|| format!("bad Redis URL {url}"))?;
                    let conn = client
                        .get_multiplexed_async_connection()
                        .await
                        .with_context(|| format!("cannot connect to Redis at {url}"))?;
                    Backend::Redis { conn, index: scans }
                }
                Target::Rfrpc(uri) => {
                    let ep = FabricAddr::parse(uri)
                        .with_context(|| format!("bad RF-RPC endpoint {uri}"))?;
                    let fabric = rfrpc::fabric_for(&ep, rdma_device)?;
                    let cfg = RfClientConfig::builder()
                        .call_timeout(timeout)
                        .mode(args.rf_mode)
                        .build()?;
                    if args.batch > 1 {
                        let (n, depth) = (args.batch as usize, args.pipeline as usize);
                        let b = tokio::task::spawn_blocking(move || {
                            let clients = (0..depth)
                                .map(|_| RfClient::connect(&ep, &fabric, cfg.clone()))
                                .collect::<rrpc_kv::Result<Vec<_>>>()?;
                            let bc = BatcherConfig::builder()
                                .max_entries(n)
                                .timeout(Duration::from_secs(3600))
                                .build()?;
                            Batcher::with_clients(clients, bc)
                        })
                        .await?
                        .with_context(|| format!("cannot connect to RF-RPC at {uri}"))?;
                        Backend::RfBatch(Arc::new(Mutex::new(KvBatcher::new(b))))
                    } else {
                        let client = tokio::task::spawn_blocking(move || {
                            KvClient::connect(&ep, &fabric, cfg)
                        })
                        .await?
                        .with_context(|| format!("cannot connect to RF-RPC at {uri}"))?;
                        Backend::Rfrpc(Arc::new(client))
                    }
                }
            })
        };
        tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| anyhow::anyhow!("no connection to {target:?} within {timeout:?}"))?
    }
}

impl Client for Backend {
    type Error = DisplayAlternate;

    /// Carries out `op`. An `Err` is a transport failure; the store's own
    /// failure is `Ok(OpResult::Failed)`.
    async fn execute(&mut self, op: Op) -> Result<OpResult, DisplayAlternate> {
        self.execute_inner(op).await.map_err(DisplayAlternate)
    }

    /// Request batches for [`Backend::RfBatch`]; one at a time elsewhere.
    async fn execute_batch(
        &mut self,
        ops: Vec<Op>,
    ) -> Result<Vec<Result<OpResult, DisplayAlternate>>, DisplayAlternate> {
        match self {
            Backend::RfBatch(b) => {
                let b = b.clone();
                let out = tokio::task::spawn_blocking(move || rf_batch_blocking(&b, ops))
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|r| r)
                    .map_err(DisplayAlternate)?;
                Ok(out
                    .into_iter()
                    .map(|r| r.map_err(DisplayAlternate))
                    .collect())
            }
            _ => {
                let mut out = Vec::with_capacity(ops.len());
                for op in ops {
                    out.push(self.execute(op).await);
                }
                Ok(out)
            }
        }
    }
}

/// An [`anyhow::Error`] shown with its causes (`{:#}`), as the driver
/// reports it.
#[derive(Debug)]
struct DisplayAlternate(anyhow::Error);

impl std::fmt::Display for DisplayAlternate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl Backend {
    /// [`Client::execute`] with an [`anyhow::Error`].
    async fn execute_inner(&mut self, op: Op) -> anyhow::Result<OpResult> {
        match self {
            Backend::Grpc(kv) => Ok(kv.execute(op).await?),
            Backend::Redis { conn, index } => {
                Ok(rrpc_kv::ycsb::redis::execute(conn, *index, op).await?)
            }
            Backend::Rfrpc(c) => {
                let c = c.clone();
                Ok(tokio::task::spawn_blocking(move || c.call(&op)).await??)
            }
            Backend::RfBatch(b) => {
                let b = b.clone();
                let mut out =
                    tokio::task::spawn_blocking(move || rf_batch_blocking(&b, vec![op])).await??;
                out.pop().context("no result")?
            }
            Backend::Execute(e) => {
                let e = e.clone();
                Ok(tokio::task::spawn_blocking(move || e.execute(op)).await?)
            }
        }
    }
}

/// Pushes `ops` into the batcher, flushes, and takes their results in order.
fn rf_batch_blocking(
    b: &Mutex<KvBatcher>,
    ops: Vec<Op>,
) -> anyhow::Result<Vec<anyhow::Result<OpResult>>> {
    let mut b = b.lock().expect("batcher lock");
    for op in &ops {
        // An op over the limits fails the chunk (as a driver error).
        b.push(op)?;
    }
    b.batcher().flush();
    let mut out = Vec::with_capacity(ops.len());
    while let Some((_, r)) = b.pop() {
        out.push(r.map_err(|e| anyhow::anyhow!("{e}")));
    }
    Ok(out)
}

fn progress(len: u64, msg: &'static str, show: bool) -> ProgressBar {
    if !show || len < 10_000 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:5} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(msg);
    pb
}

fn write_csv(
    path: &std::path::Path,
    args: &Args,
    phase: &str,
    rows: &[Summary],
) -> anyhow::Result<()> {
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if new {
        writeln!(
            f,
            "workload,target,clients,records,ops,value_size,phase,{}",
            Summary::CSV_HEADER
        )?;
    }
    for r in rows {
        writeln!(
            f,
            "{},{},{},{},{},{},{phase},{}",
            args.workload,
            args.target,
            args.clients,
            args.records,
            args.ops,
            args.value_size,
            r.csv_row()
        )?;
    }
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let target = Target::parse(&args.target)?;
    if !matches!(target, Target::Rfrpc(_))
        && (args.batch > 1 || args.pipeline > 1 || args.rf_mode.is_some())
    {
        bail!("--batch, --pipeline and --rf-mode apply to rfrpc+ targets only");
    }
    if args.pipeline > 1 && args.batch == 1 {
        bail!("--pipeline needs --batch N with N > 1");
    }
    let mut cfg = WorkloadConfig::builder(args.workload)
        .records(args.records)
        .operations(args.ops)
        .value_size(args.value_size)
        .seed(args.seed);
    if let Some(d) = args.distribution {
        cfg = cfg.distribution(d);
    }
    let cfg = cfg.build().context("bad workload")?;
    let workload = Workload::new(cfg).context("bad workload")?;
    let scans = args.workload.mix().scan > 0.0;
    let timeout = Duration::from_secs(args.connect_timeout);

    let mut rrpc = RrpcConfig::default();
    if let Some(d) = &args.rdma_device {
        rrpc = rrpc.to_builder().rdma_device(d.clone()).build()?;
    }
    let mut clients = Vec::with_capacity(args.clients as usize);
    for _ in 0..args.clients {
        clients.push(Backend::connect(&target, scans, timeout, &rrpc, &args).await?);
    }
    println!(
        "workload {} ({:?} keys), {} records, {} operations, {} B values, {} clients, target {}",
        args.workload,
        workload.config().distribution(),
        args.records,
        args.ops,
        args.value_size,
        args.clients,
        args.target
    );
    let show = !args.no_progress;
    let chunk = args.batch as usize;

    if !args.skip_load {
        let pb = progress(args.records, "load", show);
        let errors = Arc::new(Errors::new());
        let tick = pb.clone();
        let (stats, elapsed) = driver::run_phase(
            &mut clients,
            driver::load_txns(&workload),
            chunk,
            &errors,
            move |n| tick.inc(n),
        )
        .await;
        pb.finish_and_clear();
        println!("\nload phase: {:.3} s", elapsed.as_secs_f64());
        print!("{}", stats.table(elapsed));
        if let Some(p) = &args.csv {
            write_csv(p, &args, "load", &stats.summary(elapsed))?;
        }
        check_errors(&errors, args.records)?;
    }

    let pb = progress(args.ops, "run", show);
    let errors = Arc::new(Errors::new());
    let tick = pb.clone();
    let (stats, elapsed) = driver::run_phase(
        &mut clients,
        driver::run_txns(workload, args.ops),
        chunk,
        &errors,
        move |n| tick.inc(n),
    )
    .await;
    pb.finish_and_clear();
    println!("\nrun phase: {:.3} s", elapsed.as_secs_f64());
    print!("{}", stats.table(elapsed));
    if let Some(p) = &args.csv {
        write_csv(p, &args, "run", &stats.summary(elapsed))?;
        println!("results appended to {}", p.display());
    }
    check_errors(&errors, args.ops)
}

/// Prints the first error; fails the phase when every operation failed.
fn check_errors(errors: &Errors, attempted: u64) -> anyhow::Result<()> {
    let n = errors.count();
    if n > 0 {
        let first = errors.first().unwrap_or_default();
        eprintln!("{n} operations failed; first: {first}");
    }
    Ok(errors.check(attempted)?)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rrpc-kv-bench: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rrpc-kv-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(
            Target::parse("grpc+tcp://10.0.0.1:5000").unwrap(),
            Target::Grpc("http://10.0.0.1:5000".into())
        );
        assert_eq!(
            Target::parse("grpc+shm:///tmp/kv.sock").unwrap(),
            Target::Grpc("shm:///tmp/kv.sock".into())
        );
        assert_eq!(
            Target::parse("grpc+rdma://10.0.0.1:5000").unwrap(),
            Target::Grpc("rdma://10.0.0.1:5000".into())
        );
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379").unwrap(),
            Target::Redis("redis://127.0.0.1:6379".into())
        );
        for bad in ["", "tcp", "grpc+tcp://", "grpc+udp://x:1", "http://x:1"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags() {
        let a = Args::try_parse_from(["b", "--target", "redis://x", "--workload", "E"]).unwrap();
        assert_eq!(a.workload, Core::E);
        assert_eq!(
            (a.records, a.ops, a.value_size, a.clients),
            (20_000, 20_000, 1000, 1)
        );
        assert!(
            Args::try_parse_from(["b", "--workload", "a"]).is_err(),
            "--target is required"
        );
        assert!(Args::try_parse_from(["b", "--target", "redis://x", "--records", "-1"]).is_err());
        let a = Args::try_parse_from([
            "b",
            "--target",
            "rfrpc+shm:///x",
            "--batch",
            "16",
            "--pipeline",
            "2",
            "--rf-mode",
            "server-reply",
        ])
        .unwrap();
        assert_eq!((a.batch, a.pipeline), (16, 2));
        assert_eq!(a.rf_mode, Some(ModePolicy::Fixed(Mode::ServerReply)));
        assert!(Args::try_parse_from(["b", "--target", "x", "--rf-mode", "fast"]).is_err());
        assert!(Args::try_parse_from(["b", "--target", "x", "--batch", "0"]).is_err());
    }
}
