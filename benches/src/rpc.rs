//! The rpc suite (RR-Compound §V-A..C): tonic over TCP and over a Unix socket as baselines,
//! rrpc over shm on the HTTP/2 path and on the fast path, all in the same run.
//!
//! Server and clients run in one process on two single-thread tokio runtimes, each pinned to
//! its own CPU (rrpc's polling thread comes on top, see the notes in every table). The rrpc
//! rows use rrpc-tonic's default connection management (`rrpc_tonic::default_poller_config`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures_util::Stream;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

use crate::cpu::{CpuTimes, rss_bytes};
use crate::{Latency, PlotSpec, Ratio, Report, SuiteArgs, Table, ThreadPlan};

mod figs;
mod load;
pub use load::hog;

/// Generated code for `proto/bench.proto`.
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]
pub mod pb {
    tonic::include_proto!("rrpcbench");
}

use pb::bench_client::BenchClient;
use pb::bench_server::{Bench, BenchServer};
use pb::{Req, Resp};

/// The benchmark service: answers every request with `resp_len` zero bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Svc;

type RespStream = Pin<Box<dyn Stream<Item = Result<Resp, Status>> + Send>>;

#[tonic::async_trait]
impl Bench for Svc {
    async fn unary(&self, r: Request<Req>) -> Result<Response<Resp>, Status> {
        let n = r.get_ref().resp_len as usize;
        Ok(Response::new(Resp {
            payload: vec![0; n],
        }))
    }

    type StreamStream = RespStream;

    async fn stream(&self, r: Request<Streaming<Req>>) -> Result<Response<RespStream>, Status> {
        let mut inbound = r.into_inner();
        let s = async_stream::try_stream! {
            while let Some(m) = inbound.message().await? {
                yield Resp { payload: vec![0; m.resp_len as usize] };
            }
        };
        Ok(Response::new(Box::pin(s)))
    }
}

/// A transport under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// tonic over TCP loopback (the baseline every ratio is taken against).
    TonicTcp,
    /// tonic over a Unix socket.
    TonicUds,
    /// rrpc over shm, HTTP/2 path.
    RrpcH2,
    /// rrpc over shm, fast path.
    RrpcFast,
}

impl Transport {
    /// All, baseline first.
    pub const ALL: [Transport; 4] = [Self::TonicTcp, Self::TonicUds, Self::RrpcH2, Self::RrpcFast];

    /// Parses a row label back ([`Transport::name`]).
    pub fn parse(s: &str) -> Option<Transport> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Row label.
    pub fn name(self) -> &'static str {
        match self {
            Self::TonicTcp => "tonic-tcp",
            Self::TonicUds => "tonic-uds",
            Self::RrpcH2 => "rrpc-shm-h2",
            Self::RrpcFast => "rrpc-shm-fast",
        }
    }
}

/// A client of any transport.
#[derive(Debug, Clone)]
pub enum AnyClient {
    /// tonic's own channel (TCP or UDS).
    Tonic(BenchClient<tonic::transport::Channel>),
    /// rrpc's channel.
    Rrpc(BenchClient<rrpc_tonic::RrpcChannel>),
    /// No transport: the generated client calling the generated server's
    /// service directly (`tonic-inproc`, the floor for anything that keeps
    /// tonic's stubs).
    Inproc(BenchClient<BenchServer<Svc>>),
}

impl AnyClient {
    /// One unary call.
    ///
    /// # Errors
    /// The call's status.
    pub async fn unary(&mut self, req: Req) -> Result<Resp, Status> {
        match self {
            AnyClient::Tonic(c) => c.unary(req).await.map(Response::into_inner),
            AnyClient::Rrpc(c) => c.unary(req).await.map(Response::into_inner),
            AnyClient::Inproc(c) => c.unary(req).await.map(Response::into_inner),
        }
    }

    /// Opens a bidirectional stream fed by `rx`.
    ///
    /// # Errors
    /// The call's status.
    pub async fn stream(&mut self, rx: mpsc::Receiver<Req>) -> Result<Streaming<Resp>, Status> {
        let s = tokio_stream::wrappers::ReceiverStream::new(rx);
        match self {
            AnyClient::Tonic(c) => c.stream(s).await.map(Response::into_inner),
            AnyClient::Rrpc(c) => c.stream(s).await.map(Response::into_inner),
            AnyClient::Inproc(c) => c.stream(s).await.map(Response::into_inner),
        }
    }
}

/// A running server of one transport; stopped on drop.
#[derive(Debug)]
pub struct ServerHandle {
    transport: Transport,
    target: String,
    /// The rrpc configuration of the server; clients made by [`connect`] use a clone (and so
    /// share its poller, as one process's server and clients would).
    cfg: rrpc_tonic::RrpcConfig,
    stop: Option<oneshot::Sender<()>>,
    dir: PathBuf,
}

impl ServerHandle {
    /// Where clients connect (a URL, a socket path or an rrpc URI).
    pub fn target(&self) -> &str {
        &self.target
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// With this set to `1`, [`rrpc_config`] gives fixed rings (`min_ring_size =
/// ring_size`, the papers' setting) instead of rrpc-tonic's self-sizing default; a
/// [`ChildServer`] gets it through its environment.
pub const FIXED_RING_ENV: &str = "RRPC_BENCH_FIXED_RING";

/// The verbs device the rrpc rows run on instead of shm (`rdma://127.0.0.1`), from
/// [`RDMA_DEVICE_ENV`]; `None` (shm) when it is unset or empty. Needs the `verbs` feature.
pub fn rdma_device() -> Option<String> {
    std::env::var(RDMA_DEVICE_ENV)
        .ok()
        .filter(|d| !d.is_empty())
}

/// Environment variable naming a verbs device (e.g. `rxe0` in `cargo xtask rxe`): the rrpc
/// rows of the suites built on this module then run over `rdma://` on it.
pub const RDMA_DEVICE_ENV: &str = "RRPC_BENCH_RDMA_DEVICE";

/// rrpc-tonic's default configuration with the data path of `t` (HTTP/2 for
/// [`Transport::RrpcH2`], else the fast path).
///
/// A/B knob for connection management: `RRPC_BENCH_POLLER=<variant>` in the
/// environment (inherited by the suite's server process) picks one of
/// [`POLLER_VARIANTS`] for both sides (`RRPC_BENCH_PLAIN_BPEV=1` is
/// `bpev-plain`). An unknown name is ignored with a warning. Fixed rings:
/// [`FIXED_RING_ENV`]; verbs instead of shm: [`RDMA_DEVICE_ENV`].
pub fn rrpc_config(t: Transport) -> rrpc_tonic::RrpcConfig {
    let mut cfg = rrpc_tonic::RrpcConfig::default();
    if let Some(dev) = rdma_device() {
        cfg = cfg.rdma_device(dev);
    }
    if std::env::var_os(FIXED_RING_ENV).is_some_and(|v| v == "1") {
        // The papers' fixed ring instead of self-sizing rings.
        let ring = cfg.get_ring_size();
        cfg = cfg
            .min_ring_size(ring)
            .expect("the default ring size is valid");
    }
    let name = std::env::var("RRPC_BENCH_POLLER").ok().or_else(|| {
        std::env::var_os("RRPC_BENCH_PLAIN_BPEV")
            .is_some_and(|v| v == "1")
            .then(|| "bpev-plain".to_owned())
    });
    if let Some(name) = name {
        match poller_variant(&name) {
            Some(pc) => cfg = cfg.poller(pc),
            None => eprintln!("RRPC_BENCH_POLLER={name}: unknown; using the default"),
        }
    }
    with_path(cfg, t)
}

/// The connection-management variants the suite compares (`RRPC_BENCH_POLLER`), each
/// rrpc-tonic's default poller (1 polling thread, 50 us fixed spin) with one change.
pub const POLLER_VARIANTS: &[(&str, &str)] = &[
    (
        "bpev",
        "rrpc-tonic's default: BPEV with the doorbell fallback and spin back-off",
    ),
    (
        "bpev-noback",
        "BPEV with the doorbell fallback but no spin back-off",
    ),
    (
        "bpev-plain",
        "the paper's BPEV plus idle parking: no doorbell, no spin back-off",
    ),
    ("bpts", "BPTS with idle parking"),
    (
        "event",
        "EVENT: no polling thread; every message rings the reader's completion channel",
    ),
    (
        "bp",
        "BP: one polling thread per connection end, idle parking",
    ),
];

/// The poller configuration of a variant of [`POLLER_VARIANTS`].
pub fn poller_variant(name: &str) -> Option<rrpc_tonic::PollerConfig> {
    use rrpc_tonic::PollerMode;
    let d = rrpc_tonic::default_poller_config();
    Some(match name {
        "bpev" => d,
        "bpev-noback" => d.spin_backoff(false),
        "bpev-plain" => d.doorbell_park_after(None).spin_backoff(false),
        "bpts" => d.mode(PollerMode::Bpts),
        "event" => d.mode(PollerMode::Event),
        "bp" => d.mode(PollerMode::Bp),
        _ => return None,
    })
}

/// `cfg` with the data path of `t`.
pub fn with_path(cfg: rrpc_tonic::RrpcConfig, t: Transport) -> rrpc_tonic::RrpcConfig {
    let path = if t == Transport::RrpcH2 {
        rrpc_tonic::PathPreference::Http2
    } else {
        rrpc_tonic::PathPreference::Fast
    };
    cfg.path(path)
}

/// Starts a server for `t` on the server runtime, rrpc transports with their default
/// configuration.
///
/// # Errors
/// Bind errors.
pub fn start_server(rt: &Runtime, t: Transport) -> Result<ServerHandle> {
    start_server_with(rt, t, rrpc_config(t))
}

/// Starts a server for `t` on the server runtime; rrpc transports use `cfg` (ignored by the
/// tonic baselines).
///
/// # Errors
/// Bind errors.
pub fn start_server_with(
    rt: &Runtime,
    t: Transport,
    cfg: rrpc_tonic::RrpcConfig,
) -> Result<ServerHandle> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-bench-rpc-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let svc = BenchServer::new(Svc);
    let target = match t {
        Transport::TonicTcp => {
            let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
            let addr = l.local_addr()?;
            let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
            rt.spawn(
                tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, shutdown),
            );
            format!("http://{addr}")
        }
        Transport::TonicUds => {
            let path = dir.join("tonic.sock");
            let l = rt.block_on(async { tokio::net::UnixListener::bind(&path) })?;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(l);
            rt.spawn(
                tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, shutdown),
            );
            path.display().to_string()
        }
        Transport::RrpcH2 | Transport::RrpcFast => {
            let uri = match rdma_device() {
                // A port the kernel just handed out (free a moment ago).
                Some(_) => format!(
                    "rdma://127.0.0.1:{}",
                    std::net::TcpListener::bind("127.0.0.1:0")?
                        .local_addr()?
                        .port()
                ),
                None => format!("shm://{}/rrpc.sock", dir.display()),
            };
            let u = uri.clone();
            let cfg = cfg.clone();
            rt.spawn(async move {
                if let Err(e) = rrpc_tonic::Server::builder()
                    .add_service(svc)
                    .serve_rrpc_with_shutdown(&u, cfg, shutdown)
                    .await
                {
                    eprintln!("rrpc server on {u}: {e}");
                }
            });
            uri
        }
    };
    Ok(ServerHandle {
        transport: t,
        target,
        cfg,
        stop: Some(stop),
        dir,
    })
}

/// Connects a client to `server` (retrying for up to 5 s while the server binds).
///
/// # Errors
/// The last connect error.
pub async fn connect(server: &ServerHandle) -> Result<AnyClient> {
    connect_to(server.transport, &server.target, &server.cfg).await
}

/// Connects a client of transport `t` to `target` (a URL, a socket path or an rrpc URI) with
/// `cfg` for rrpc transports, retrying for up to 5 s while the server binds.
///
/// # Errors
/// The last connect error.
pub async fn connect_to(
    t: Transport,
    target: &str,
    cfg: &rrpc_tonic::RrpcConfig,
) -> Result<AnyClient> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = connect_once(t, target, cfg).await;
        match r {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// One connect attempt of a client of transport `t` to `target` (no retry).
///
/// # Errors
/// The connect error.
pub async fn connect_once(
    t: Transport,
    target: &str,
    cfg: &rrpc_tonic::RrpcConfig,
) -> Result<AnyClient> {
    let big = 64 << 20;
    Ok(match t {
        Transport::TonicTcp => {
            let ch = tonic::transport::Endpoint::from_shared(target.to_owned())?
                .tcp_nodelay(true)
                .connect()
                .await?;
            AnyClient::Tonic(BenchClient::new(ch).max_decoding_message_size(big))
        }
        Transport::TonicUds => {
            let path = PathBuf::from(target);
            let ch = tonic::transport::Endpoint::try_from("http://[::]:50051")?
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let p = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(p).await?,
                        ))
                    }
                }))
                .await?;
            AnyClient::Tonic(BenchClient::new(ch).max_decoding_message_size(big))
        }
        Transport::RrpcH2 | Transport::RrpcFast => {
            let ch = rrpc_tonic::RrpcChannel::connect(target, cfg.clone()).await?;
            AnyClient::Rrpc(BenchClient::new(ch).max_decoding_message_size(big))
        }
    })
}

/// Ping-pong: `n` sequential unary calls of `req_len` bytes answered with `resp_len` bytes.
///
/// # Errors
/// A failed call.
pub async fn pingpong(
    c: &mut AnyClient,
    req_len: usize,
    resp_len: u32,
    warmup: u64,
    n: u64,
) -> Result<Latency> {
    let mut lat = Latency::new();
    for i in 0..warmup + n {
        let req = Req {
            payload: vec![1; req_len],
            resp_len,
        };
        let t = Instant::now();
        c.unary(req).await?;
        if i >= warmup {
            lat.record(t.elapsed());
        }
    }
    Ok(lat)
}

/// Result of a throughput run.
#[derive(Debug, Clone, Default)]
pub struct Throughput {
    /// Completed RPCs in the window.
    pub ops: u64,
    /// Window length.
    pub elapsed: Duration,
    /// Per-RPC latency (send to response, with `window` in flight).
    pub latency: Latency,
}

/// The load tasks' result: completed calls and their latencies while `counting` was set.
type LoadTask = tokio::task::JoinHandle<Result<(u64, Latency)>>;

/// Lets the load tasks warm up for `dur / 5`, counts for `dur`, stops them and sums up.
async fn measure_window(
    tasks: Vec<LoadTask>,
    counting: &AtomicBool,
    stop: &AtomicBool,
    dur: Duration,
) -> Result<Throughput> {
    tokio::time::sleep(dur / 5).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(dur).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut out = Throughput {
        elapsed,
        ..Default::default()
    };
    for t in tasks {
        let (ops, lat) = t.await??;
        out.ops += ops;
        out.latency.merge(&lat);
    }
    Ok(out)
}

/// Streaming throughput: `clients` connections, each one stream with `window` requests in
/// flight, for `dur`.
///
/// # Errors
/// A failed connect or stream.
pub async fn stream_throughput(
    clients: Vec<AnyClient>,
    req_len: usize,
    resp_len: u32,
    window: usize,
    dur: Duration,
) -> Result<Throughput> {
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<LoadTask> = Vec::new();
    for mut c in clients {
        let (stop, counting) = (stop.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(window * 2);
            let mut sent: VecDeque<Instant> = VecDeque::with_capacity(window);
            let req = Req {
                payload: vec![1; req_len],
                resp_len,
            };
            for _ in 0..window {
                tx.send(req.clone())
                    .await
                    .map_err(|_| anyhow!("stream closed"))?;
                sent.push_back(Instant::now());
            }
            let mut inbound = c.stream(rx).await?;
            let (mut ops, mut lat) = (0u64, Latency::new());
            while let Some(_r) = inbound.message().await? {
                let t0 = sent.pop_front().unwrap_or_else(Instant::now);
                if counting.load(Ordering::Relaxed) {
                    ops += 1;
                    lat.record(t0.elapsed());
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                tx.send(req.clone())
                    .await
                    .map_err(|_| anyhow!("stream closed"))?;
                sent.push_back(Instant::now());
            }
            drop(tx);
            Ok::<_, anyhow::Error>((ops, lat))
        }));
    }
    measure_window(tasks, &counting, &stop, dur).await
}

/// Closed-loop unary load: every client has one call in flight; with `interval`, a client
/// starts a call at most once per `interval` (a rate limiter; it does not catch up when a call
/// took longer). Runs `dur` after a 20 % warm-up.
///
/// tokio's timer has a 1 ms resolution, so intervals below 1 ms behave as 1 ms.
///
/// # Errors
/// A failed call.
pub async fn unary_load(
    clients: Vec<AnyClient>,
    req_len: usize,
    resp_len: u32,
    interval: Option<Duration>,
    dur: Duration,
) -> Result<Throughput> {
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<LoadTask> = Vec::new();
    for mut c in clients {
        let (stop, counting) = (stop.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            let req = Req {
                payload: vec![1; req_len],
                resp_len,
            };
            let (mut ops, mut lat) = (0u64, Latency::new());
            let mut next = tokio::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                c.unary(req.clone()).await?;
                if counting.load(Ordering::Relaxed) {
                    ops += 1;
                    lat.record(t0.elapsed());
                }
                if let Some(iv) = interval {
                    next += iv;
                    let now = tokio::time::Instant::now();
                    if next < now {
                        next = now;
                    } else {
                        tokio::time::sleep_until(next).await;
                    }
                }
            }
            Ok::<_, anyhow::Error>((ops, lat))
        }));
    }
    measure_window(tasks, &counting, &stop, dur).await
}

/// Connects `k` clients to `server`.
///
/// # Errors
/// The first failed connect.
pub async fn connect_many(server: &ServerHandle, k: usize) -> Result<Vec<AnyClient>> {
    let mut v = Vec::with_capacity(k);
    for _ in 0..k {
        v.push(connect(server).await?);
    }
    Ok(v)
}

/// A one-worker tokio runtime whose worker is pinned to `cpu`.
///
/// # Errors
/// Runtime build errors.
pub fn runtime(name: &str, cpu: usize) -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .on_thread_start(move || {
            let _ = crate::pin_current_thread(cpu);
        })
        .enable_all()
        .build()
        .context("building a tokio runtime")
}

/// Appends one transport's ping-pong row (the tonic-TCP row, first, is the baseline).
fn ping_row(
    ping: &mut Table,
    name: &str,
    l: &crate::Summary,
    tcp: &mut Option<(f64, f64)>,
    floor: Option<f64>,
) {
    let (p50, p99) = (l.p50_us(), l.p99_us());
    if name == Transport::TonicTcp.name() {
        *tcp = Some((p50, p99));
    }
    let (b50, b99) = tcp.unwrap_or((f64::NAN, f64::NAN));
    ping.push(vec![
        name.into(),
        p50.into(),
        p99.into(),
        (l.mean_ns / 1e3).into(),
        Ratio::of(p50, b50).into(),
        Ratio::of(p99, b99).into(),
        Ratio::of(p50, floor.unwrap_or(f64::NAN)).into(),
        l.count.into(),
    ]);
}

/// The rpc suite's experiments, for `--only` (a table is run if its name starts with one of
/// the names given).
pub const EXPERIMENTS: &[&str] = &[
    "pingpong_latency",
    "small_rpc_throughput",
    "connmgmt_4k_continuous",
    "connmgmt_4k_interval",
    "ring_size_bandwidth",
    "zero_copy_bandwidth",
    "resources_heavy",
    "resources_low",
    "low_load",
    "contention",
    "idle_connections",
];

/// The baseline rows' value (tonic-TCP's, measured first) per client count, for the ratio of
/// every later row with the same count.
#[derive(Debug, Default)]
struct BaseByClients(Vec<(usize, f64)>);

impl BaseByClients {
    /// Records `v` as the baseline for `k` when `is_base`; returns the baseline for `k` (NaN
    /// before one was recorded).
    fn base(&mut self, is_base: bool, k: usize, v: f64) -> f64 {
        if is_base {
            self.0.push((k, v));
        }
        self.0
            .iter()
            .find(|(c, _)| *c == k)
            .map_or(f64::NAN, |(_, b)| *b)
    }
}

/// Whether experiment `exp` is selected by `only` (empty: everything).
fn selected(only: &[String], exp: &str) -> bool {
    only.is_empty() || only.iter().any(|o| exp.starts_with(o.as_str()))
}

/// Runs the rpc suite into `report`: every experiment, or those whose names start with one of
/// `only` (see [`EXPERIMENTS`]).
///
/// # Errors
/// An `only` entry that names no experiment; setup errors of the baselines; rrpc failures are
/// recorded in the tables' notes and make the suite fail at the end.
pub fn run_suite(args: &SuiteArgs, report: &mut Report, only: &[String]) -> Result<()> {
    if let Some(bad) = only
        .iter()
        .find(|o| !EXPERIMENTS.iter().any(|e| e.starts_with(o.as_str())))
    {
        return Err(anyhow!(
            "--only {bad}: no such experiment (one of {})",
            EXPERIMENTS.join(", ")
        ));
    }
    let want = |exp: &str| selected(only, exp);
    let (scpu, ccpu) = (ThreadPlan::cpu(0), ThreadPlan::cpu(1));
    let server_rt = runtime("bench-server", scpu)?;
    let client_rt = runtime("bench-client", ccpu)?;
    let plan = ThreadPlan::new()
        .side("server (tokio, 1 worker)", 1, Some(vec![scpu]))
        .side("clients (tokio, 1 worker)", 1, Some(vec![ccpu]));
    let rrpc_plan = plan.clone().side(
        "rrpc polling thread (BPEV, shared by server and clients; spins only while a \
         connection sleeps, parks after 2 ms idle)",
        1,
        None,
    );
    let plan_note = format!(
        "tonic rows: {}. rrpc rows: {}",
        plan.describe(),
        rrpc_plan.describe()
    );
    report.machine_mut().provider =
        "shm (rrpc rows); kernel TCP / Unix sockets (tonic rows)".into();
    report.machine_mut().pinning = plan.describe();

    let clients_list: Vec<usize> = args.pick(vec![1, 4], vec![1, 2, 4, 8, 16, 32, 64, 128]);
    let dur = args.duration(Duration::from_millis(400), Duration::from_secs(3));
    let (warm, n) = args.pick((200, 2_000), (2_000, 50_000));
    let bar = args.progress(
        (Transport::ALL.len() * (1 + clients_list.len())) as u64,
        "rpc",
    );

    let mut ping = Table::new(
        "pingpong_latency",
        "Ping-pong latency, 64 B request / 8 B response (Table III)",
        &[
            "transport",
            "p50_us",
            "p99_us",
            "mean_us",
            "p50_x_vs_tcp",
            "p99_x_vs_tcp",
            "p50_x_vs_inproc",
            "samples",
        ],
    );
    let mut thr = Table::new(
        "small_rpc_throughput",
        "Small-RPC throughput: 32 B requests, 8 B responses, streaming, 32 in flight per client (Fig. 10)",
        &[
            "transport",
            "clients",
            "krps",
            "x_vs_tcp",
            "p50_us",
            "p99_us",
            "cpu_pct",
            "rss_mib",
            "rss_kib_per_client",
        ],
    );
    let mut failures = Vec::new();
    let mut tcp_ping: Option<(f64, f64)> = None;
    let mut tcp_krps = BaseByClients::default();
    // The floor first, so that every row can be given its ratio to it.
    let floor = if want("pingpong_latency") {
        let mut c = AnyClient::Inproc(BenchClient::new(BenchServer::new(Svc)));
        let l = client_rt
            .block_on(async move {
                tokio::spawn(async move { pingpong(&mut c, 64, 8, warm, n).await }).await?
            })?
            .summary();
        let f = l.p50_us();
        ping_row(&mut ping, "tonic-inproc", &l, &mut None, Some(f));
        Some(f)
    } else {
        None
    };
    let first_two = want("pingpong_latency") || want("small_rpc_throughput");
    for t in Transport::ALL.into_iter().filter(|_| first_two) {
        bar.set_message(format!("{} ping-pong", t.name()));
        let server = start_server(&server_rt, t)?;
        let res: Result<()> = (|| {
            if want("pingpong_latency") {
                let mut c = client_rt.block_on(connect(&server))?;
                // Spawned, so the calls run on the pinned client worker (`block_on` runs its
                // own future on the calling thread).
                let l = client_rt
                    .block_on(async move {
                        tokio::spawn(async move { pingpong(&mut c, 64, 8, warm, n).await }).await?
                    })?
                    .summary();
                ping_row(&mut ping, t.name(), &l, &mut tcp_ping, floor);
            }
            bar.inc(1);
            if !want("small_rpc_throughput") {
                bar.inc(clients_list.len() as u64);
                return Ok(());
            }
            for &k in &clients_list {
                bar.set_message(format!("{} {k} clients", t.name()));
                let cs = client_rt.block_on(connect_many(&server, k))?;
                let cpu0 = CpuTimes::process()?;
                let w0 = Instant::now();
                let r = client_rt.block_on(stream_throughput(cs, 32, 8, 32, dur))?;
                let cpu_pct = CpuTimes::process()?.percent_since(&cpu0, w0.elapsed());
                let rss = rss_bytes(None)?;
                let krps = figs::krps(&r);
                let base = tcp_krps.base(t == Transport::TonicTcp, k, krps);
                let s = r.latency.summary();
                thr.push(vec![
                    t.name().into(),
                    k.into(),
                    krps.into(),
                    Ratio::of(krps, base).into(),
                    s.p50_us().into(),
                    s.p99_us().into(),
                    cpu_pct.into(),
                    (rss as f64 / (1 << 20) as f64).into(),
                    (rss as f64 / 1024.0 / k as f64).into(),
                ]);
                bar.inc(1);
            }
            Ok(())
        })();
        if let Err(e) = res {
            eprintln!("rpc: {} failed: {e:#}", t.name());
            failures.push(format!("{}: FAILED: {e:#}", t.name()));
        }
        drop(server);
    }
    bar.finish_and_clear();
    for tbl in [&mut ping, &mut thr] {
        tbl.note(plan_note.clone());
        for f in &failures {
            tbl.note(f.clone());
        }
    }
    ping.note(format!(
        "{n} sequential unary calls after {warm} warm-up calls, one connection; tonic-inproc: \
         no transport, the generated client calling the generated server's service on the \
         client runtime (the floor for anything that keeps tonic's stubs; its ratio moves far \
         less with this VM's wake-up costs than the TCP ratio)"
    ));
    thr.note(format!(
        "{} measured per point after a 20 % warm-up; one connection and one bidi stream per client; \
         cpu_pct and rss are of the whole process (server + clients + pollers; the per-side split is in resources_heavy / resources_low)",
        if dur.as_secs() >= 1 { format!("{} s", dur.as_secs()) } else { format!("{} ms", dur.as_millis()) }
    ));
    thr.plot(
        PlotSpec::lines("clients", &["krps"])
            .series("transport")
            .log_x()
            .x_label("clients")
            .y_label("K RPC/s"),
    );
    if want("pingpong_latency") {
        report.add(ping)?;
    }
    if want("small_rpc_throughput") {
        report.add(thr)?;
    }

    let mut ctx = figs::Ctx {
        args,
        server_rt: &server_rt,
        client_rt: &client_rt,
        server_cpu: scpu,
        only,
        failures: Vec::new(),
    };
    let fig8_note = format!(
        "{}; rrpc rows add the polling threads of their mode (below), unpinned",
        plan.describe()
    );
    for t in figs::fig8(&mut ctx, &fig8_note) {
        report.add(t)?;
    }
    if want("ring_size_bandwidth") {
        let t12 = figs::fig12(&mut ctx, &plan_note);
        report.add(t12)?;
    }
    if want("zero_copy_bandwidth") {
        let t14 = figs::fig14(&mut ctx, &plan_note);
        report.add(t14)?;
    }
    let side_plan = ThreadPlan::new()
        .side("server process (tokio, 1 worker)", 1, Some(vec![scpu]))
        .side("client process (tokio, 1 worker)", 1, Some(vec![ccpu]));
    let side_rrpc = side_plan
        .clone()
        .side("server process's BPEV polling thread", 1, None)
        .side("client process's BPEV polling thread", 1, None);
    let side_note = format!(
        "tonic rows: {}. rrpc rows: {}",
        side_plan.describe(),
        side_rrpc.describe()
    );
    if want("resources_heavy") || want("resources_low") {
        for t in figs::fig15_16(&mut ctx, &side_note) {
            if want(&t.experiment) {
                report.add(t)?;
            }
        }
    }
    if want("low_load") {
        let t = load::low_load(&mut ctx, &side_note);
        report.add(t)?;
    }
    if want("contention") {
        for t in load::contention(&mut ctx, &plan_note) {
            report.add(t)?;
        }
    }
    if want("idle_connections") {
        let t = load::idle_connections(&mut ctx, &side_note);
        report.add(t)?;
    }
    failures.extend(ctx.failures);

    drop(server_rt);
    drop(client_rt);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("rpc suite: {}", failures.join("; ")))
    }
}

/// Separate-process server role (`rpc --role serve --transport NAME [--cpu N]`, used by the
/// per-side CPU/memory experiments, Figs. 15–16): starts a server for `t` with the default
/// configuration on a one-worker runtime (pinned to `cpu` if given), prints `READY <target>`
/// and serves until its standard input closes, so it never outlives the process that
/// started it.
///
/// # Errors
/// Runtime or bind errors.
pub fn serve_child(t: Transport, cpu: Option<usize>) -> Result<()> {
    use std::io::{Read as _, Write as _};
    let rt = match cpu {
        Some(c) => runtime("bench-server", c)?,
        None => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?,
    };
    let server = start_server(&rt, t)?;
    // Wait until the server answers before saying READY.
    let probe = rt.block_on(async {
        let mut c = connect(&server).await?;
        c.unary(Req {
            payload: Vec::new(),
            resp_len: 0,
        })
        .await?;
        Ok::<_, anyhow::Error>(())
    });
    probe.context("probing the child server")?;
    println!("READY {}", server.target);
    std::io::stdout().flush()?;
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n) = stdin.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    drop(server);
    drop(rt);
    Ok(())
}

/// A server running in a child process ([`serve_child`]); stopped (stdin closed, then killed
/// after 2 s) on drop.
#[derive(Debug)]
pub struct ChildServer {
    child: std::process::Child,
    /// Transport it serves.
    pub transport: Transport,
    /// Where to connect ([`connect_to`]).
    pub target: String,
}

impl ChildServer {
    /// Starts this executable with `--role serve` and waits (up to 20 s) for its `READY` line.
    ///
    /// # Errors
    /// Spawn errors, a child that exits or stays silent.
    pub fn spawn(t: Transport, cpu: Option<usize>) -> Result<Self> {
        Self::spawn_with(t, cpu, &[])
    }

    /// [`ChildServer::spawn`] with extra environment variables for the child (e.g.
    /// `RRPC_BENCH_POLLER`).
    ///
    /// # Errors
    /// Spawn errors, a child that exits or stays silent.
    pub fn spawn_with(t: Transport, cpu: Option<usize>, env: &[(&str, &str)]) -> Result<Self> {
        use std::io::BufRead as _;
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(["--role", "serve", "--transport", t.name()]);
        cmd.envs(env.iter().copied());
        if let Some(c) = cpu {
            cmd.args(["--cpu", &c.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning the server process")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(target) = line.strip_prefix("READY ") {
                    let _ = tx.send(target.to_owned());
                    break;
                }
            }
        });
        let mut me = ChildServer {
            child,
            transport: t,
            target: String::new(),
        };
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(target) => {
                me.target = target;
                Ok(me)
            }
            Err(_) => Err(anyhow!(
                "server process for {} did not say READY within 20 s",
                t.name()
            )),
        }
    }

    /// The child's process id (for `/proc/<pid>`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cluster server role: tonic over TCP on `listen`, prints `READY`, serves until killed.
///
/// # Errors
/// Bind errors.
pub fn cluster_server(listen: SocketAddr) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(listen).await?;
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        println!("READY {listen}");
        use std::io::Write as _;
        std::io::stdout().flush()?;
        tonic::transport::Server::builder()
            .add_service(BenchServer::new(Svc))
            .serve_with_incoming(incoming)
            .await?;
        Ok(())
    })
}

/// Cluster client role: `clients` TCP connections to `connect` for `dur`; prints
/// `RESULT {"clients","ops","secs","p50_us","p99_us"}`.
///
/// # Errors
/// Connect or call errors.
pub fn cluster_client(connect_to: SocketAddr, clients: usize, dur: Duration) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let r = rt.block_on(async {
        let mut cs = Vec::new();
        for _ in 0..clients {
            cs.push(
                connect_once(
                    Transport::TonicTcp,
                    &format!("http://{connect_to}"),
                    &rrpc_config(Transport::TonicTcp),
                )
                .await?,
            );
        }
        stream_throughput(cs, 32, 8, 32, dur).await
    })?;
    let s = r.latency.summary();
    println!(
        "RESULT {}",
        serde_json::json!({
            "clients": clients, "ops": r.ops, "secs": r.elapsed.as_secs_f64(),
            "p50_us": s.p50_us(), "p99_us": s.p99_us(),
        })
    );
    Ok(())
}
