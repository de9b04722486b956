//! `rrpc-kv-server`: the Jakiro-like store behind its gRPC face, served over
//! TCP and over rrpc from one process.
//!
//! ```text
//! rrpc-kv-server --listen http://127.0.0.1:50051 --listen shm:///tmp/rrpc-kv.sock \
//!     --partitions 2 --memory-mib 1024 --engine memory
//! rrpc-kv-server --listen shm:///tmp/rrpc-kv.sock --engine persistent --data-dir /var/lib/rrpc-kv
//! ```
//!
//! Every `--listen` URI serves the same `rrpc.kv.v1.Kv` service over the same
//! store: `http://IP:PORT` is plain tonic over TCP (the baseline),
//! `unix:///PATH` tonic over a Unix socket, `shm:///PATH` and `rdma://IP:PORT`
//! rrpc-tonic's rings (`rdma://` needs the `verbs` feature), and
//! `rrpc://IP:PORT` one port for everyone: plain gRPC clients (tonic,
//! grpc-go, grpcio) as on `http://`, rrpc clients on the best fabric both
//! ends share (shm on one host, verbs with the `verbs` feature and a
//! device, else TCP; rrpc-tonic's `port` docs). RF-RPC keeps its own
//! listener (`--rfrpc`). The process
//! prints one `listening on URI` line per URI after a 200 ms grace in which a
//! listener that cannot bind (address in use, bad URI) fails the process with
//! its error, and runs until SIGINT or SIGTERM, then drains (calls in flight
//! finish).
//!
//! `--rfrpc shm:///PATH` (or `rdma://IP:PORT`) also serves the store over
//! RF-RPC, the remote-fetching RPC of Jakiro: `--rfrpc-threads` server
//! threads, each busy-polling its connections' request buffers (they take a
//! core each while clients are connected), in `--rfrpc-mode` (`hybrid`, the
//! default, `remote-fetch` or `server-reply`), holding at most
//! `--rfrpc-max-connections` connections (1024) and
//! `--rfrpc-max-connections-per-peer` per client process or host (256).
//!
//! With `--engine persistent`, an acknowledged PUT or DELETE is on disk
//! (one redb file per partition under `--data-dir`, committed with immediate
//! durability), so it survives a kill -9 of this process; operations then
//! run on tokio's blocking pool.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use std::sync::Arc;

use rrpc_core::FabricAddr;
use rrpc_kv::grpc::KvService;
use rrpc_kv::rfrpc::{self, Mode, ModePolicy, RfServer};
use rrpc_kv::store::{Engine, Store, StoreConfig};
use rrpc_tonic::{RrpcConfig, Server};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "rrpc-kv-server",
    about = "The rrpc-kv store behind its gRPC face, over TCP and rrpc"
)]
struct Args {
    /// Where to serve `rrpc.kv.v1.Kv` (repeatable): http://IP:PORT,
    /// unix:///PATH, shm:///PATH, rdma://IP:PORT or rrpc://IP:PORT (one
    /// port for plain gRPC and rrpc clients).
    #[arg(long = "listen", required = true)]
    listen: Vec<String>,
    /// Store partitions, one per server thread (EREW); default: the cores.
    #[arg(long)]
    partitions: Option<usize>,
    /// The store's memory bound, in MiB, over all partitions.
    #[arg(long, default_value_t = 1024)]
    memory_mib: usize,
    /// `memory` (Jakiro's LRU store) or `persistent` (redb on disk).
    #[arg(long, value_enum, default_value_t = EngineArg::Memory)]
    engine: EngineArg,
    /// The directory of the persistent engine.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Also serve the store over RF-RPC at this rrpc-core endpoint
    /// (shm:///PATH or rdma://IP:PORT).
    #[arg(long)]
    rfrpc: Option<String>,
    /// RF-RPC server threads.
    #[arg(long, default_value_t = 1)]
    rfrpc_threads: usize,
    /// RF-RPC mode policy: hybrid, remote-fetch or server-reply.
    #[arg(long, value_enum, default_value_t = ModeArg::Hybrid)]
    rfrpc_mode: ModeArg,
    /// RF-RPC connections the server holds at most (handshakes in
    /// progress included); more are refused with the limit named.
    #[arg(long, default_value_t = rfrpc::server::DEFAULT_MAX_CONNECTIONS)]
    rfrpc_max_connections: usize,
    /// RF-RPC connections one peer holds at most (a process on shm://, a
    /// host on rdma://).
    #[arg(long, default_value_t = rfrpc::server::DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    rfrpc_max_connections_per_peer: usize,
    /// The verbs device for `rdma://` URIs (default: the first).
    #[arg(long)]
    rdma_device: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Hybrid,
    RemoteFetch,
    ServerReply,
}

impl ModeArg {
    fn policy(self) -> ModePolicy {
        match self {
            ModeArg::Hybrid => ModePolicy::Hybrid,
            ModeArg::RemoteFetch => ModePolicy::Fixed(Mode::RemoteFetch),
            ModeArg::ServerReply => ModePolicy::Fixed(Mode::ServerReply),
        }
    }
}

/// Starts the RF-RPC server of `--rfrpc`, if any.
fn start_rfrpc(args: &Args, store: &Store) -> anyhow::Result<Option<RfServer>> {
    let Some(uri) = &args.rfrpc else {
        return Ok(None);
    };
    let ep = FabricAddr::parse(uri).with_context(|| format!("bad --rfrpc endpoint {uri}"))?;
    let fabric = rfrpc::fabric_for(&ep, args.rdma_device.as_deref())?;
    let server = RfServer::builder()
        .threads(args.rfrpc_threads)
        .mode(args.rfrpc_mode.policy())
        .max_connections(args.rfrpc_max_connections)
        .max_connections_per_peer(args.rfrpc_max_connections_per_peer)
        .serve_execute(&ep, &fabric, Arc::new(store.clone()))
        .with_context(|| format!("serving RF-RPC at {uri}"))?;
    Ok(Some(server))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EngineArg {
    Memory,
    Persistent,
}

fn store_config(args: &Args) -> anyhow::Result<StoreConfig> {
    let bytes = args
        .memory_mib
        .checked_mul(1 << 20)
        .context("--memory-mib is too large")?;
    let mut cfg = StoreConfig::builder().memory_bound(bytes);
    if let Some(n) = args.partitions {
        cfg = cfg.partitions(n);
    }
    let engine = match (args.engine, &args.data_dir) {
        (EngineArg::Memory, None) => Engine::Memory,
        (EngineArg::Memory, Some(_)) => bail!("--data-dir needs --engine persistent"),
        (EngineArg::Persistent, Some(dir)) => Engine::Persistent(dir.clone()),
        (EngineArg::Persistent, None) => bail!("--engine persistent needs --data-dir"),
    };
    Ok(cfg.engine(engine).build()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let store = Store::open(store_config(&args)?).context("opening the store")?;
    let persistent = matches!(store.engine(), Engine::Persistent(_));
    let service = KvService::new(store.clone()).blocking(persistent);
    let mut rrpc = RrpcConfig::default();
    if let Some(d) = &args.rdma_device {
        rrpc = rrpc.to_builder().rdma_device(d.clone()).build()?;
    }

    let rf = start_rfrpc(&args, &store)?;

    let stop = CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    for uri in &args.listen {
        let router = Server::builder().add_service(service.clone().into_server());
        let (uri, rrpc, stop) = (uri.clone(), rrpc.clone(), stop.clone());
        servers.spawn(async move {
            let r = router
                .serve_rrpc_with_shutdown(&uri, rrpc, async move { stop.cancelled().await })
                .await;
            (uri, r)
        });
    }
    // tonic binds inside `serve`; give each listener a moment to fail fast
    // (address in use, bad URI) before announcing it.
    let announce = tokio::time::sleep(std::time::Duration::from_millis(200));
    tokio::pin!(announce);
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut announced = false;
    let mut failed = None;
    loop {
        tokio::select! {
            () = &mut announce, if !announced => {
                announced = true;
                eprintln!(
                    "rrpc-kv-server: {} partition(s), engine {:?}, memory bound {} MiB",
                    store.partitions(),
                    store.engine(),
                    args.memory_mib
                );
                for uri in &args.listen {
                    println!("listening on {uri}");
                }
                if let Some(rf) = &rf {
                    println!("listening on rfrpc {}", rf.endpoint());
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            done = servers.join_next() => match done {
                Some(Ok((uri, Err(e)))) => {
                    failed = Some(anyhow::anyhow!("serving {uri}: {e}"));
                    break;
                }
                Some(Ok((_, Ok(())))) => {}
                Some(Err(e)) => {
                    failed = Some(anyhow::anyhow!("a listener task failed: {e}"));
                    break;
                }
                None => break,
            },
        }
    }
    stop.cancel();
    while servers.join_next().await.is_some() {}
    if let Some(rf) = rf {
        tokio::task::spawn_blocking(move || rf.shutdown()).await?;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
