//! The harness every rpc experiment is built on: the benchmark service ([`pb`], [`Svc`]), the
//! [`Transport`]s under test, servers ([`start_server`]), clients ([`connect`], [`AnyClient`]),
//! rrpc's configuration ([`rrpc_config`]) and the pinned runtimes ([`runtime`]).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::Stream;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

#[cfg(doc)]
use super::ChildServer;

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
    /// rrpc's one-port scheme (`rrpc://127.0.0.1:<port>`): the client lands
    /// on the fabric its config's `fabrics` allows (shm, verbs, or HTTP/2 on
    /// the TCP connection), fast path. Not in [`Transport::ALL`]: the
    /// connect suite's rows only.
    RrpcPort,
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
            Self::RrpcPort => "rrpc-port",
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
    pub(super) target: String,
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
        cfg = cfg
            .to_builder()
            .rdma_device(dev)
            .build()
            .expect("a valid config");
    }
    if std::env::var_os(FIXED_RING_ENV).is_some_and(|v| v == "1") {
        // The papers' fixed ring instead of self-sizing rings.
        let ring = cfg.ring_size();
        cfg = cfg
            .to_builder()
            .min_ring_size(ring)
            .build()
            .expect("the default ring size is valid");
    }
    let name = std::env::var("RRPC_BENCH_POLLER").ok().or_else(|| {
        std::env::var_os("RRPC_BENCH_PLAIN_BPEV")
            .is_some_and(|v| v == "1")
            .then(|| "bpev-plain".to_owned())
    });
    if let Some(name) = name {
        match poller_variant(&name) {
            Some(pc) => cfg = cfg.to_builder().poller(pc).build().expect("a valid config"),
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
    (
        "bpev-handoff",
        "BPEV that never spins in the workers: every wait handed to the doorbell (Handoff::Always)",
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
    let d = rrpc_tonic::default_poller_config().to_builder();
    let b = match name {
        "bpev" => d,
        "bpev-noback" => d.spin_backoff(false),
        "bpev-plain" => d.doorbell_park_after(None).spin_backoff(false),
        "bpev-handoff" => d.handoff(rrpc_tonic::Handoff::Always),
        "bpts" => d.mode(PollerMode::Bpts),
        "event" => d.mode(PollerMode::Event),
        "bp" => d.mode(PollerMode::Bp),
        _ => return None,
    };
    Some(b.build().expect("the variants change no validated setting"))
}

/// `cfg` with the data path of `t`.
pub fn with_path(cfg: rrpc_tonic::RrpcConfig, t: Transport) -> rrpc_tonic::RrpcConfig {
    let path = if t == Transport::RrpcH2 {
        rrpc_tonic::PathPreference::Http2
    } else {
        rrpc_tonic::PathPreference::Fast
    };
    cfg.to_builder().path(path).build().expect("a valid config")
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
        Transport::RrpcPort => {
            // Bound before the server task runs, so `target` names the real port.
            let incoming = {
                let _rt = rt.enter();
                rrpc_tonic::RrpcIncoming::bind("rrpc://127.0.0.1:0", cfg.clone())?
            };
            let uri = incoming.uri().to_string();
            rt.spawn(async move {
                if let Err(e) = rrpc_tonic::Server::builder()
                    .add_service(svc)
                    .serve_rrpc_incoming(incoming, shutdown)
                    .await
                {
                    eprintln!("rrpc server on rrpc://: {e}");
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
        Transport::RrpcH2 | Transport::RrpcFast | Transport::RrpcPort => {
            let ch = rrpc_tonic::RrpcChannel::connect(target, cfg.clone()).await?;
            AnyClient::Rrpc(BenchClient::new(ch).max_decoding_message_size(big))
        }
    })
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
