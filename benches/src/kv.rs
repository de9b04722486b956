//! The kv suite: the rrpc-kv store over RF-RPC and behind its gRPC face (Jakiro, paper 001
//! Figs. 7, 9, 13, 14; RR-Compound §V-E Table V).
//!
//! Experiments, every comparison measured in the same run:
//! - `rfrpc_clients`: remote fetch, server reply and the hybrid (the server's mode policy) as
//!   client threads grow; 16 B keys, 32 B values, 95 % GET / 5 % PUT.
//! - `rfrpc_processing`: the same three modes at one client as the server's processing time
//!   grows (busy work added by a wrapping [`Execute`]).
//! - `batch_sweep`: `call_batch` throughput and latency for batch sizes 1..64, and the Eq. 3
//!   tuner ([`BatchSizeTuner`]) choosing a size at a latency bound.
//! - `ycsb`: YCSB A-F against gRPC over tonic TCP, gRPC over rrpc-tonic (`shm://`, fast path),
//!   Redis (`redis-server`, unpipelined) and RF-RPC directly ([`KvClient`]).
//!
//! Every server (RF-RPC, gRPC, Redis) runs in a separate process spawned from a thread pinned
//! to the last allowed CPU, so all its threads inherit that CPU; the suite's own threads
//! (clients) are pinned to the other CPUs. A server child of this binary (`--role kv-server`)
//! exits when its standard input closes, and is killed on drop, so it never outlives the
//! suite.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use rrpc_core::{Fabric, FabricAddr};
use rrpc_kv::grpc::{GrpcKv, KvService};
use rrpc_kv::rfrpc::tune::BatchSizeTuner;
use rrpc_kv::rfrpc::{
    Batcher, BatcherConfig, ClientStats, KvClient, Mode, ModePolicy, RfClient, RfClientConfig,
    RfServer,
};
use rrpc_kv::store::{Store, StoreConfig};
use rrpc_kv::ycsb::driver::{self, Errors};
use rrpc_kv::ycsb::{Core, Stats, Workload, WorkloadConfig};
use rrpc_kv::{Execute, Op, OpResult};
use rrpc_tonic::{PathPreference, RrpcChannel, RrpcConfig};

use crate::stats::rate;
use crate::{Latency, PlotSpec, Ratio, Report, SuiteArgs, Table, ThreadPlan, Value};

/// Key length of the RF-RPC experiments (Jakiro §5: 16 B keys).
pub const KEY_LEN: usize = 16;
/// Value length of the RF-RPC experiments (Jakiro §5: 32 B values).
pub const VALUE_LEN: usize = 32;
/// Fraction of GETs in the RF-RPC experiments.
pub const GET_FRACTION: f64 = 0.95;
/// Buffers of the RF-RPC server and client in the YCSB runs (a workload E scan of 100 records
/// of 1000 B does not fit the 64 KiB default).
const YCSB_BUFFER: usize = 1 << 20;

/// The three RF-RPC modes compared: (name, server policy).
pub const MODES: [(&str, ModePolicy); 3] = [
    ("remote-fetch", ModePolicy::Fixed(Mode::RemoteFetch)),
    ("server-reply", ModePolicy::Fixed(Mode::ServerReply)),
    ("hybrid", ModePolicy::Hybrid),
];

/// The series of the RF-RPC tables: (name, server policy, client retry limit R). The paper's
/// R = 5 is sized for InfiniBand READs of about 2 us; on shm a READ is a memcpy of a few
/// hundred ns, so the `-r32` series show remote fetch and the hybrid with a retry budget of
/// similar length (a remote-fetch call past R READs goes on with a yielding back-off).
pub const SERIES: [(&str, ModePolicy, u32); 5] = [
    ("remote-fetch", ModePolicy::Fixed(Mode::RemoteFetch), 5),
    ("server-reply", ModePolicy::Fixed(Mode::ServerReply), 5),
    ("hybrid", ModePolicy::Hybrid, 5),
    ("remote-fetch-r32", ModePolicy::Fixed(Mode::RemoteFetch), 32),
    ("hybrid-r32", ModePolicy::Hybrid, 32),
];

fn policy_name(p: ModePolicy) -> &'static str {
    match p {
        ModePolicy::Fixed(Mode::RemoteFetch) => "remote-fetch",
        ModePolicy::Fixed(Mode::ServerReply) => "server-reply",
        ModePolicy::Hybrid => "hybrid",
    }
}

fn parse_policy(s: &str) -> Result<ModePolicy> {
    MODES
        .iter()
        .find(|(n, _)| *n == s)
        .map(|(_, p)| *p)
        .with_context(|| format!("unknown RF-RPC mode {s:?} (remote-fetch, server-reply, hybrid)"))
}

/// The server CPU (the last allowed one) and the client CPUs (the others, or the same one on a
/// one-CPU machine).
fn cpus() -> (usize, Vec<usize>) {
    let all = crate::process_cpus();
    let server = all[all.len() - 1];
    let clients = if all.len() > 1 {
        all[..all.len() - 1].to_vec()
    } else {
        all.clone()
    };
    (server, clients)
}

// ---------------------------------------------------------------------------------------------
// Server side (the `--role kv-server` child)

/// What the `kv-server` child serves.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerArgs {
    /// Internal: serve RF-RPC (one server thread) at this `shm://` endpoint.
    #[arg(long, hide = true)]
    pub rf: Option<String>,
    /// Internal: the RF-RPC server's mode policy (remote-fetch, server-reply, hybrid).
    #[arg(long, hide = true, default_value = "hybrid")]
    pub rf_mode: String,
    /// Internal: RF-RPC request/response buffer bytes.
    #[arg(long, hide = true, default_value_t = 64 << 10)]
    pub rf_buffer: usize,
    /// Internal: busy work added to every operation, in nanoseconds.
    #[arg(long, hide = true, default_value_t = 0)]
    pub busy_ns: u64,
    /// Internal: serve the gRPC face at this URI (`http://127.0.0.1:PORT` or `shm:///PATH`).
    #[arg(long, hide = true)]
    pub grpc: Option<String>,
}

/// The store with `busy` of spinning added to every operation (Jakiro Fig. 9's processing
/// time).
#[derive(Debug)]
struct Busy {
    store: Store,
    busy: Duration,
}

impl Execute for Busy {
    fn execute(&self, op: Op) -> OpResult {
        if !self.busy.is_zero() {
            let t = Instant::now();
            while t.elapsed() < self.busy {
                std::hint::spin_loop();
            }
        }
        self.store.execute(op)
    }
}

fn open_store() -> Result<Store> {
    Store::open(
        StoreConfig::builder()
            .partitions(1)
            .memory_bound(256 << 20)
            .build()?,
    )
    .context("opening the store")
}

fn wait_for_stdin_eof() {
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n) = stdin.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

/// The `--role kv-server` child: serves one store over RF-RPC and/or gRPC, prints `READY`, and
/// runs until its standard input closes.
///
/// # Errors
/// Store, bind or runtime errors.
pub fn run_server(a: &ServerArgs) -> Result<()> {
    let store = open_store()?;
    let mut rf = None;
    if let Some(uri) = &a.rf {
        let ep = FabricAddr::parse(uri).with_context(|| format!("bad RF-RPC endpoint {uri}"))?;
        let exec = Arc::new(Busy {
            store: store.clone(),
            busy: Duration::from_nanos(a.busy_ns),
        });
        let server = RfServer::builder()
            .threads(1)
            .request_buffer(a.rf_buffer)
            .response_buffer(a.rf_buffer)
            .mode(parse_policy(&a.rf_mode)?)
            .serve_execute(&ep, &Fabric::shm(), exec)
            .with_context(|| format!("serving RF-RPC at {uri}"))?;
        rf = Some(server);
    }
    let mut grpc = None;
    if let Some(uri) = &a.grpc {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("building the server runtime")?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = KvService::new(store.clone()).into_server();
        let (u, cfg) = (uri.clone(), grpc_config());
        let task = rt.spawn(async move {
            rrpc_tonic::Server::builder()
                .tcp_nodelay(true)
                .add_service(service)
                .serve_rrpc_with_shutdown(&u, cfg, async move {
                    let _ = rx.await;
                })
                .await
        });
        // Probe until the server answers (tonic binds inside `serve`).
        let probe = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if task.is_finished() {
                    bail!("the gRPC server at {uri} stopped at start");
                }
                if let Ok(kv) = GrpcKv::connect(uri, grpc_config()).await
                    && kv
                        .execute(Op::Get {
                            key: Bytes::from_static(b"probe"),
                        })
                        .await
                        .is_ok()
                {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    bail!("the gRPC server at {uri} did not answer within 10 s");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        if let Err(e) = probe {
            if task.is_finished()
                && let Ok(Ok(Err(se))) =
                    rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), task).await })
            {
                return Err(e.context(format!("{se}")));
            }
            return Err(e);
        }
        grpc = Some((rt, tx));
    }
    println!("READY");
    std::io::stdout().flush()?;
    wait_for_stdin_eof();
    if let Some((rt, tx)) = grpc {
        let _ = tx.send(());
        rt.shutdown_timeout(Duration::from_secs(1));
    }
    if let Some(s) = rf {
        s.shutdown();
    }
    Ok(())
}

/// rrpc-tonic's configuration for both sides: the fast path.
fn grpc_config() -> RrpcConfig {
    RrpcConfig::builder()
        .path(PathPreference::Fast)
        .build()
        .expect("a valid config")
}

/// Spawns `cmd` from a thread pinned to `cpu`, so the child and all its threads start with that
/// affinity.
fn spawn_pinned(mut cmd: Command, cpu: usize) -> Result<Child> {
    std::thread::spawn(move || -> Result<Child> {
        crate::pin_current_thread(cpu).context("pinning the spawning thread")?;
        Ok(cmd.spawn()?)
    })
    .join()
    .map_err(|_| anyhow!("the spawning thread panicked"))?
}

/// A `--role kv-server` child: stdin closed, then killed after 2 s, on drop.
#[derive(Debug)]
pub struct ServerProc {
    child: Child,
    dir: PathBuf,
    /// The RF-RPC endpoint, if it serves one.
    pub rf: Option<FabricAddr>,
    /// The gRPC URI, if it serves one.
    pub grpc: Option<String>,
}

/// How to start a [`ServerProc`].
#[derive(Debug, Clone)]
pub enum Serve {
    /// RF-RPC with this policy, buffer size and busy time.
    Rf(ModePolicy, usize, Duration),
    /// The gRPC face over tonic TCP on this loopback port.
    GrpcTcp(u16),
    /// The gRPC face over rrpc-tonic `shm://`.
    GrpcShm,
}

fn temp_dir(tag: &str) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-bench-kv-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

impl ServerProc {
    /// Re-executes this binary as `--role kv-server`, pinned to `cpu`, and waits (up to 20 s)
    /// for its `READY`.
    ///
    /// # Errors
    /// Spawn errors, or a child that exits or stays silent.
    pub fn spawn(what: &Serve, cpu: usize) -> Result<Self> {
        let dir = temp_dir("srv")?;
        let mut cmd = Command::new(std::env::current_exe().context("finding this executable")?);
        cmd.args(["--role", "kv-server"]);
        let (mut rf, mut grpc) = (None, None);
        match what {
            Serve::Rf(policy, buf, busy) => {
                let uri = format!("shm://{}/rf.sock", dir.display());
                cmd.args(["--rf", &uri, "--rf-mode", policy_name(*policy)]);
                cmd.args(["--rf-buffer", &buf.to_string()]);
                cmd.args(["--busy-ns", &busy.as_nanos().to_string()]);
                rf = Some(FabricAddr::parse(&uri)?);
            }
            Serve::GrpcTcp(port) => grpc = Some(format!("http://127.0.0.1:{port}")),
            Serve::GrpcShm => grpc = Some(format!("shm://{}/grpc.sock", dir.display())),
        }
        if let Some(g) = &grpc {
            cmd.args(["--grpc", g]);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let child = spawn_pinned(cmd, cpu).context("starting the kv-server process")?;
        let mut me = ServerProc {
            child,
            dir,
            rf,
            grpc,
        };
        let stdout = me.child.stdout.take().context("child stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.starts_with("READY") => Ok(me),
            Ok(l) => bail!(
                "kv-server process ({what:?}) failed to start (said {l:?}; see its stderr above)"
            ),
            Err(_) => bail!("kv-server process ({what:?}) did not say READY within 20 s"),
        }
    }
}

fn stop_child(child: &mut Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        stop_child(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback TCP port (bound, then released: a small race with other processes).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

// ---------------------------------------------------------------------------------------------
// RF-RPC load (Figs. 7, 9, 13)

/// A small xorshift PRNG (no allocation, deterministic per client).
#[derive(Debug, Clone)]
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn rf_key(i: u64) -> Bytes {
    let k = format!("k{i:0w$}", w = KEY_LEN - 1);
    Bytes::from(k.into_bytes())
}

/// Encoded requests of the 95/5 mix over `keys` keys, cycled by the clients (encoding is not
/// what is measured).
fn mixed_requests(keys: u64, n: usize, seed: u64) -> Result<Vec<Vec<u8>>> {
    let mut rng = XorShift(seed | 1);
    let value = Bytes::from(vec![0x5a; VALUE_LEN]);
    (0..n)
        .map(|_| {
            let key = rf_key(rng.next() % keys);
            let op = if (rng.next() % 10_000) as f64 / 10_000.0 < GET_FRACTION {
                Op::Get { key }
            } else {
                Op::Put {
                    key,
                    value: value.clone(),
                }
            };
            op.to_bytes().context("encoding a request")
        })
        .collect()
}

fn rf_connect(ep: &FabricAddr, buf: usize, retry: u32) -> Result<RfClient> {
    let cfg = RfClientConfig::builder()
        .reply_buffer(buf)
        .retry_limit(retry)
        .build()?;
    RfClient::connect(ep, &Fabric::shm(), cfg)
        .with_context(|| format!("connecting an RF-RPC client to {ep:?}"))
}

/// Loads `keys` keys of [`VALUE_LEN`] bytes through one batching client.
fn rf_preload(ep: &FabricAddr, keys: u64) -> Result<()> {
    let mut c = rf_connect(ep, 64 << 10, 5)?;
    let value = Bytes::from(vec![0x5a; VALUE_LEN]);
    let reqs: Vec<Vec<u8>> = (0..keys)
        .map(|i| {
            Op::Put {
                key: rf_key(i),
                value: value.clone(),
            }
            .to_bytes()
        })
        .collect::<rrpc_kv::Result<_>>()?;
    for chunk in reqs.chunks(64) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        c.call_batch(&refs).context("preloading the store")?;
    }
    Ok(())
}

/// What a closed-loop RF-RPC run measured.
#[derive(Debug, Default)]
pub struct RfRun {
    /// Requests completed.
    pub ops: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Per-call latency.
    pub lat: Latency,
    /// Client counters (summed).
    pub stats: ClientStats,
}

impl RfRun {
    fn kops(&self) -> f64 {
        rate(self.ops, self.elapsed) / 1e3
    }
    fn failed_reads_per_call(&self) -> f64 {
        self.stats.failed_reads as f64 / self.stats.calls.max(1) as f64
    }
    fn sr_pct(&self) -> f64 {
        if self.stats.calls == 0 {
            0.0
        } else {
            100.0 * self.stats.server_reply_calls as f64 / self.stats.calls as f64
        }
    }
}

/// `clients` threads (pinned round-robin to `cpus`), each with its own connection, call the
/// 95/5 mix in a closed loop for `dur` (after a short warm-up).
fn rf_closed_loop(
    ep: &FabricAddr,
    retry: u32,
    clients: usize,
    cpus: &[usize],
    keys: u64,
    dur: Duration,
) -> Result<RfRun> {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut handles = Vec::new();
    for i in 0..clients {
        let (ep, barrier, cpu) = (ep.clone(), barrier.clone(), cpus[i % cpus.len()]);
        handles.push(std::thread::spawn(move || -> Result<RfRun> {
            let r = (|| {
                crate::pin_current_thread(cpu).context("pinning a client")?;
                let mut c = rf_connect(&ep, 64 << 10, retry)?;
                let reqs = mixed_requests(keys, 4096, 0x9e37_79b9 + i as u64)?;
                let warm = Instant::now() + dur / 5;
                let mut j = 0;
                while Instant::now() < warm {
                    c.call(&reqs[j % reqs.len()])?;
                    j += 1;
                }
                Ok::<_, anyhow::Error>((c, reqs))
            })();
            barrier.wait();
            let (mut c, reqs) = r?;
            let before = c.stats();
            let mut lat = Latency::new();
            let start = Instant::now();
            let mut ops = 0u64;
            while start.elapsed() < dur {
                let t = Instant::now();
                c.call(&reqs[ops as usize % reqs.len()])
                    .context("an RF-RPC call")?;
                lat.record(t.elapsed());
                ops += 1;
            }
            let elapsed = start.elapsed();
            let after = c.stats();
            Ok(RfRun {
                ops,
                elapsed,
                lat,
                stats: ClientStats {
                    calls: after.calls - before.calls,
                    server_reply_calls: after.server_reply_calls - before.server_reply_calls,
                    failed_reads: after.failed_reads - before.failed_reads,
                    second_reads: after.second_reads - before.second_reads,
                    switches: after.switches - before.switches,
                },
            })
        }));
    }
    barrier.wait();
    let mut total = RfRun::default();
    let mut first_err = None;
    for h in handles {
        match h.join().map_err(|_| anyhow!("a client thread panicked"))? {
            Ok(r) => {
                total.ops += r.ops;
                total.elapsed = total.elapsed.max(r.elapsed);
                total.lat.merge(&r.lat);
                total.stats.calls += r.stats.calls;
                total.stats.server_reply_calls += r.stats.server_reply_calls;
                total.stats.failed_reads += r.stats.failed_reads;
                total.stats.second_reads += r.stats.second_reads;
                total.stats.switches += r.stats.switches;
            }
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// One row per (x, mode) RF-RPC run: throughput, latency, how often the
/// hybrid fell back to server-reply, and the ratio against the best fixed mode
/// at the same x.
fn rf_table(name: &str, title: &str, x: &str, rows: &[(usize, &str, RfRun)]) -> Table {
    let mut t = Table::new(
        name,
        title,
        &[
            "mode",
            x,
            "kops",
            "p50_us",
            "p99_us",
            "sr_calls_pct",
            "failed_reads_per_call",
            "ratio_vs_best_fixed",
        ],
    );
    for (x, name, r) in rows {
        let s = r.lat.summary();
        let ratio = Ratio::of(r.kops(), best_fixed(rows, *x));
        t.push(vec![
            Value::from(*name),
            Value::from(*x),
            Value::from(r.kops()),
            Value::from(s.p50_us()),
            Value::from(s.p99_us()),
            Value::from(r.sr_pct()),
            Value::from(r.failed_reads_per_call()),
            Value::from(ratio),
        ]);
    }
    t
}

fn best_fixed(rows: &[(usize, &str, RfRun)], x: usize) -> f64 {
    rows.iter()
        .filter(|(k, m, _)| *k == x && !m.starts_with("hybrid"))
        .map(|(_, _, r)| r.kops())
        .fold(0.0, f64::max)
}

/// The better of a hybrid series' own two modes at `x`: remote fetch with
/// the same R (`hybrid` -> `remote-fetch`, `hybrid-r32` ->
/// `remote-fetch-r32`) and server-reply.
fn best_own(rows: &[(usize, &str, RfRun)], hybrid: &str, x: usize) -> f64 {
    let rf = hybrid.replacen("hybrid", "remote-fetch", 1);
    rows.iter()
        .filter(|(k, m, _)| *k == x && (*m == rf || *m == "server-reply"))
        .map(|(_, _, r)| r.kops())
        .fold(0.0, f64::max)
}

/// "met (worst 0.93 at 2 clients)" / "NOT met (...)" for the hybrid series
/// `name`: >= 0.9 x the better of its own two modes at every point (the
/// issue's target), with the worst ratio to every fixed series (any R)
/// beside it.
fn hybrid_verdict(rows: &[(usize, &str, RfRun)], name: &str, unit: &str) -> String {
    let worst = |best: &dyn Fn(usize) -> f64| {
        rows.iter()
            .filter(|(_, m, _)| *m == name)
            .filter_map(|(x, _, r)| Some((Ratio::of(r.kops(), best(*x)).get()?, *x)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    };
    let own = worst(&|x| best_own(rows, name, x));
    let any = worst(&|x| best_fixed(rows, x));
    let any = any.map_or(String::new(), |(w, x)| {
        format!("; against every fixed series, any R: worst {w:.2} at {x} {unit}")
    });
    match own {
        Some((w, x)) if w >= 0.9 => format!("{name}: met (worst {w:.2} at {x} {unit}{any})"),
        Some((w, x)) => format!("{name}: NOT met (worst {w:.2} at {x} {unit}{any})"),
        None => format!("{name}: not measured"),
    }
}

/// `rfrpc_clients` and `rfrpc_processing`.
fn rfrpc_tables(args: &SuiteArgs, report: &mut Report) -> Result<()> {
    let (scpu, ccpus) = cpus();
    let keys: u64 = args.pick(10_000, 100_000);
    let dur = args.duration(Duration::from_millis(300), Duration::from_secs(2));
    let client_counts: Vec<usize> = args.pick(vec![1, 2], vec![1, 2, 4]);
    let procs: Vec<u64> = vec![0, 2, 10, 50];
    let bar = args.progress(
        (SERIES.len() * (client_counts.len() + procs.len())) as u64,
        "kv rfrpc",
    );

    // Fig. 7: throughput vs client threads.
    let mut rows: Vec<(usize, &str, RfRun)> = Vec::new();
    for (name, policy, retry) in SERIES {
        let srv = ServerProc::spawn(&Serve::Rf(policy, 64 << 10, Duration::ZERO), scpu)?;
        let ep = srv.rf.clone().context("no RF endpoint")?;
        rf_preload(&ep, keys)?;
        for &n in &client_counts {
            bar.set_message(format!("{name} x{n}"));
            let r = rf_closed_loop(&ep, retry, n, &ccpus, keys, dur)
                .with_context(|| format!("{name} with {n} clients"))?;
            rows.push((n, name, r));
            bar.inc(1);
        }
    }
    let mut t = rf_table(
        "rfrpc_clients",
        "RF-RPC modes vs client threads (16 B keys, 32 B values, 95 % GET; Jakiro Fig. 7)",
        "clients",
        &rows,
    );
    let max_clients = client_counts.iter().copied().max().unwrap_or(1);
    let plan = ThreadPlan::new()
        .side(
            "RF-RPC server process (1 polling thread)",
            1,
            Some(vec![scpu]),
        )
        .side(
            &format!("clients (up to {max_clients}, busy-polling)"),
            max_clients,
            Some(ccpus.clone()),
        );
    t.note(plan.describe());
    t.note(format!(
        "server: separate process, 1 thread, 1 store partition, shm fabric, {keys} keys preloaded; clients pinned round-robin to cpu {:?}: with more clients than those cpus they time-share (scheduler slices show in p99)",
        ccpus
    ));
    t.note(format!(
        "{} ms per point after a {} ms warm-up; ratio_vs_best_fixed = kops / max(remote-fetch, server-reply, remote-fetch-r32) at the same clients; target: each hybrid >= 0.9 x the better of its own two modes (remote fetch with its R, server-reply) everywhere: {}; {} (paper defaults F = 256 B, R = 5; -r32: R = 32; failed_reads_per_call: remote-fetch READs that found no result, above R the hybrid leaves remote fetch)",
        dur.as_millis(),
        (dur / 5).as_millis(),
        hybrid_verdict(&rows, "hybrid", "clients"),
        hybrid_verdict(&rows, "hybrid-r32", "clients"),
    ));
    t.plot(
        PlotSpec::lines("clients", &["kops"])
            .series("mode")
            .x_label("client threads")
            .y_label("throughput (kops/s)"),
    );
    report.add(t)?;

    // Fig. 9: latency vs server processing time, 1 client.
    let mut rows: Vec<(usize, &str, RfRun)> = Vec::new();
    for &us in &procs {
        for (name, policy, retry) in SERIES {
            bar.set_message(format!("{name} +{us} us"));
            let srv = ServerProc::spawn(
                &Serve::Rf(policy, 64 << 10, Duration::from_micros(us)),
                scpu,
            )?;
            let ep = srv.rf.clone().context("no RF endpoint")?;
            rf_preload(&ep, keys.min(10_000))?;
            let r = rf_closed_loop(&ep, retry, 1, &ccpus, keys.min(10_000), dur)
                .with_context(|| format!("{name} with {us} us of processing"))?;
            rows.push((us as usize, name, r));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let mut t = rf_table(
        "rfrpc_processing",
        "RF-RPC modes vs server processing time, 1 client (Jakiro Fig. 9)",
        "proc_us",
        &rows,
    );
    let plan = ThreadPlan::new()
        .side(
            "RF-RPC server process (1 polling thread)",
            1,
            Some(vec![scpu]),
        )
        .side("client", 1, Some(vec![ccpus[0]]));
    t.note(plan.describe());
    t.note(format!(
        "proc_us: busy-spin added to every operation by an Execute wrapping the store; a fresh server process per point; {} ms per point; sr_calls_pct: calls the client sent in server-reply mode",
        dur.as_millis()
    ));
    t.note(format!(
        "target: each hybrid >= 0.9 x the better of its own two modes (remote fetch with its R, server-reply) at every processing time: {}; {} (the table's ratio column is vs max(remote-fetch, server-reply, remote-fetch-r32); R = 5 unless -r32)",
        hybrid_verdict(&rows, "hybrid", "us"),
        hybrid_verdict(&rows, "hybrid-r32", "us"),
    ));
    t.plot(
        PlotSpec::lines("proc_us", &["p50_us"])
            .series("mode")
            .x_label("server processing time (us)")
            .y_label("median latency (us)"),
    );
    t.also_plot(
        PlotSpec::lines("proc_us", &["kops"])
            .series("mode")
            .x_label("server processing time (us)")
            .y_label("throughput (kops/s)"),
    );
    report.add(t)
}

/// `batch_sweep`: `call_batch` for sizes 1..64, then the tuner at a bound.
fn batch_table(args: &SuiteArgs, report: &mut Report) -> Result<()> {
    let (scpu, ccpus) = cpus();
    crate::pin_current_thread(ccpus[0]).context("pinning the client")?;
    let keys: u64 = args.pick(10_000, 100_000);
    let dur = args.duration(Duration::from_millis(200), Duration::from_secs(2));
    let sizes = [1usize, 2, 4, 8, 16, 32, 64];
    let srv = ServerProc::spawn(
        &Serve::Rf(ModePolicy::Hybrid, 64 << 10, Duration::ZERO),
        scpu,
    )?;
    let ep = srv.rf.clone().context("no RF endpoint")?;
    rf_preload(&ep, keys)?;
    let mut c = rf_connect(&ep, 64 << 10, 5)?;
    let reqs = mixed_requests(keys, 4096, 7)?;
    let bar = args.progress(sizes.len() as u64 + 1, "kv batch");

    let run = |c: &mut RfClient,
               size: usize,
               dur: Duration,
               mut tuner: Option<&mut BatchSizeTuner>|
     -> Result<(u64, Duration, Latency, Vec<u16>)> {
        let mut lat = Latency::new();
        let mut sizes_seen = Vec::new();
        let mut size = size;
        let mut j = 0usize;
        let mut ops = 0u64;
        let start = Instant::now();
        while start.elapsed() < dur {
            let refs: Vec<&[u8]> = (0..size)
                .map(|k| reqs[(j + k) % reqs.len()].as_slice())
                .collect();
            j += size;
            let t = Instant::now();
            let out = c.call_batch(&refs).context("call_batch")?;
            let l = t.elapsed();
            if out.len() != size {
                bail!("a batch of {size} returned {} results", out.len());
            }
            lat.record(l);
            ops += size as u64;
            if let Some(tn) = tuner.as_deref_mut() {
                for _ in 0..size {
                    tn.handle_latency(l);
                }
                size = usize::from(tn.size());
                sizes_seen.push(tn.size());
            }
        }
        Ok((ops, start.elapsed(), lat, sizes_seen))
    };

    let mut t = Table::new(
        "batch_sweep",
        "RF-RPC call_batch: throughput and latency vs batch size (Jakiro Figs. 13-14)",
        &["batch", "kops", "p50_us", "p99_us", "ratio_vs_batch1"],
    );
    let mut base = None;
    let mut sweep = Vec::new();
    for &s in &sizes {
        bar.set_message(format!("batch {s}"));
        run(&mut c, s, dur / 5, None)?; // warm-up
        let (ops, el, lat, _) = run(&mut c, s, dur, None)?;
        let kops = rate(ops, el) / 1e3;
        let base_kops = *base.get_or_insert(kops);
        let sm = lat.summary();
        t.push(vec![
            Value::from(s),
            Value::from(kops),
            Value::from(sm.p50_us()),
            Value::from(sm.p99_us()),
            Value::from(Ratio::of(kops, base_kops)),
        ]);
        sweep.push((s, kops, sm));
        bar.inc(1);
    }

    // The tuner: bound = the sweep's p90 at batch 16, tolerance 5 % (the paper's).
    bar.set_message("tuner");
    let (_, _, at16) = sweep
        .iter()
        .find(|(s, _, _)| *s == 16)
        .copied()
        .context("no batch-16 point")?;
    let bound = Duration::from_nanos(at16.p90_ns.max(1000));
    let alpha = 0.05;
    let mut tuner = BatchSizeTuner::builder(bound, alpha)
        .bounds(1, 64)
        .window(200)
        .build()?;
    let tdur = args.duration(Duration::from_millis(800), Duration::from_secs(4));
    // First half: converge; second half: measure at the tuner's sizes.
    let (_, _, _, conv) = run(&mut c, 1, tdur / 2, Some(&mut tuner))?;
    let start_size = usize::from(tuner.size());
    let (ops, el, lat, seen) = run(&mut c, start_size, tdur / 2, Some(&mut tuner))?;
    bar.inc(1);
    bar.finish_and_clear();
    let sm = lat.summary();
    let mean_size = seen.iter().map(|&s| f64::from(s)).sum::<f64>() / seen.len().max(1) as f64;
    // Largest swept size whose p90 stays within the bound (what an oracle would pick).
    let oracle = sweep
        .iter()
        .filter(|(_, _, s)| s.p90_ns <= bound.as_nanos() as u64)
        .map(|(s, _, _)| *s)
        .max();
    t.note(
        ThreadPlan::new()
            .side(
                "RF-RPC server process (1 polling thread, hybrid)",
                1,
                Some(vec![scpu]),
            )
            .side("client", 1, Some(vec![ccpus[0]]))
            .describe(),
    );
    t.note(format!(
        "95 % GET / 5 % PUT, 16 B keys, 32 B values; {} ms per size; latency is per call_batch (the whole batch); kops counts requests",
        dur.as_millis()
    ));
    t.note(format!(
        "Eq. 3 tuner (alpha {alpha}, window 200 requests, bounds 1..=64, start 1) at bound L = {:.1} us (the sweep's p90 at batch 16): after {} calls of convergence it chose {start_size}, then ran {} ms at a mean size of {mean_size:.1} (last {}): {:.1} kops/s, p50 {:.1} us, p90 {:.1} us, p99 {:.1} us; largest swept size with p90 <= L: {}",
        bound.as_nanos() as f64 / 1e3,
        conv.len(),
        (tdur / 2).as_millis(),
        tuner.size(),
        rate(ops, el) / 1e3,
        sm.p50_us(),
        sm.p90_ns as f64 / 1e3,
        sm.p99_us(),
        oracle.map_or("none".into(), |s| s.to_string()),
    ));
    t.plot(
        PlotSpec::lines("batch", &["kops"])
            .log_x()
            .x_label("batch size")
            .y_label("throughput (kops/s)"),
    );
    t.also_plot(
        PlotSpec::lines("batch", &["p50_us", "p99_us"])
            .log_x()
            .x_label("batch size")
            .y_label("latency per batch (us)"),
    );
    report.add(t)?;

    // The pipeline (§4.1): the Batcher at N = 16 with D buffer pairs (one
    // RfClient each) in flight.
    let mut p = Table::new(
        "batch_pipeline",
        "RF-RPC Batcher pipeline: batches in flight vs throughput (Jakiro §4.1 Pipeline)",
        &["depth", "kops", "max_in_flight", "ratio_vs_depth1"],
    );
    let mut base = None;
    for depth in [1usize, 2, 4] {
        let clients = (0..depth)
            .map(|_| rf_connect(&ep, 64 << 10, 5))
            .collect::<Result<Vec<_>>>()?;
        let cfg = BatcherConfig::builder()
            .max_entries(16)
            .timeout(Duration::from_secs(3600))
            .build()?;
        let mut b = Batcher::with_clients(clients, cfg)?;
        let pipe_run = |b: &mut Batcher, d: Duration| -> Result<(u64, Duration)> {
            let (mut ops, mut j) = (0u64, 0usize);
            let start = Instant::now();
            while start.elapsed() < d {
                b.push(&reqs[j % reqs.len()]);
                j += 1;
                for (_, r) in b.drain() {
                    r.map_err(|e| anyhow!("pipelined request: {e}"))?;
                    ops += 1;
                }
            }
            b.flush();
            for (_, r) in b.drain() {
                r.map_err(|e| anyhow!("pipelined request: {e}"))?;
                ops += 1;
            }
            Ok((ops, start.elapsed()))
        };
        pipe_run(&mut b, dur / 5)?; // warm-up
        let (ops, el) = pipe_run(&mut b, dur)?;
        let kops = rate(ops, el) / 1e3;
        let base_kops = *base.get_or_insert(kops);
        p.push(vec![
            Value::from(depth),
            Value::from(kops),
            Value::from(b.stats().max_in_flight),
            Value::from(Ratio::of(kops, base_kops)),
        ]);
    }
    p.note(
        "same server and mix as batch_sweep; N = 16 entries per batch; depth D = RfClient connections, \
         one batch in flight on each (the server keeps one buffer pair per connection); \
         one client thread pushes and collects"
            .to_string(),
    );
    p.plot(
        PlotSpec::lines("depth", &["kops"])
            .x_label("batches in flight")
            .y_label("throughput (kops/s)"),
    );
    drop(c);
    drop(srv);
    report.add(p)
}

// ---------------------------------------------------------------------------------------------
// YCSB (RR-Compound Table V)

/// One YCSB client's connection, run by rrpc-kv's YCSB driver on the suite's current-thread
/// client runtime (RF-RPC's blocking calls block that runtime, one op in flight anyway).
enum Driver {
    Grpc(GrpcKv<RrpcChannel>),
    Tonic(GrpcKv<tonic::transport::Channel>),
    Rf(Box<KvClient>),
    /// Redis through rrpc-kv's shared backend; `index`: keep the scan index.
    Redis(redis::aio::MultiplexedConnection, bool),
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Driver::Grpc(..) => "Grpc",
            Driver::Tonic(..) => "Tonic",
            Driver::Rf(_) => "Rf",
            Driver::Redis(..) => "Redis",
        })
    }
}

impl driver::Client for Driver {
    type Error = String;

    async fn execute(&mut self, op: Op) -> std::result::Result<OpResult, String> {
        let r: Result<OpResult> = match self {
            Driver::Grpc(kv) => kv.execute(op).await.map_err(Into::into),
            Driver::Tonic(kv) => kv.execute(op).await.map_err(Into::into),
            Driver::Rf(c) => c.call(&op).map_err(Into::into),
            Driver::Redis(conn, index) => rrpc_kv::ycsb::redis::execute(conn, *index, op)
                .await
                .map_err(Into::into),
        };
        r.map_err(|e| format!("{e:#}"))
    }
}

/// A `redis-server` child on a loopback port, no persistence; killed on drop.
#[derive(Debug)]
struct RedisProc {
    child: Child,
    port: u16,
}

impl RedisProc {
    /// `Ok(None)` when `redis-server` is not installed.
    ///
    /// redis-server runs under a small `sh` watchdog that stops it when the watchdog's standard
    /// input (a pipe from this process) closes, so it does not outlive the suite even if the
    /// suite is killed.
    fn spawn(cpu: usize) -> Result<Option<Self>> {
        let found = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|d| d.join("redis-server").is_file())
        });
        if !found {
            return Ok(None);
        }
        let port = free_port()?;
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "redis-server \"$@\" </dev/null >/dev/null & r=$!; cat >/dev/null; kill $r; wait $r",
            "sh",
        ])
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        let child = spawn_pinned(cmd, cpu).context("starting redis-server")?;
        let mut me = RedisProc { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // A blocking PING: is it up yet?
            if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", me.port))
                && let Ok(mut c) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return Ok(Some(me));
            }
            if let Ok(Some(st)) = me.child.try_wait() {
                bail!("redis-server exited at start ({st}; see its stderr above)");
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on port {} did not answer within 10 s",
                    me.port
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    async fn connect(&self) -> Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to redis on port {}", self.port))
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        // Closing the watchdog's stdin stops redis-server; the watchdog is killed after 2 s.
        stop_child(&mut self.child);
    }
}

/// The YCSB backends, in table order (the first is the baseline).
const BACKENDS: [&str; 4] = ["grpc-tcp", "grpc-rrpc-shm", "redis", "rf-rpc"];

/// What one (workload, backend) run measured.
#[derive(Debug)]
struct YcsbRun {
    ops: u64,
    elapsed: Duration,
    stats: Stats,
    errors: u64,
}

/// Loads `core`'s records through `clients`, then times its run phase (rrpc-kv's YCSB driver,
/// one client). A failed load fails the run; so does a run phase whose every operation failed.
fn ycsb_run(
    rt: &tokio::runtime::Runtime,
    clients: &mut Vec<Driver>,
    core: Core,
    records: u64,
    ops: u64,
    redis_flush: bool,
) -> Result<YcsbRun> {
    if let Some(Driver::Redis(c, index)) = clients.first_mut() {
        *index = core.mix().scan > 0.0;
        if redis_flush {
            let () = rt.block_on(redis::cmd("FLUSHALL").query_async(c))?;
        }
    }
    let w = Workload::new(
        WorkloadConfig::builder(core)
            .records(records)
            .operations(ops)
            .seed(42)
            .build()?,
    )
    .context("bad workload")?;
    let load_errors = Arc::new(Errors::new());
    let load = driver::load_txns(&w);
    rt.block_on(driver::run_phase(clients, load, 1, &load_errors, |_| {}));
    let errors = Arc::new(Errors::new());
    let (stats, elapsed) = rt.block_on(driver::run_phase(
        clients,
        driver::run_txns(w, ops),
        1,
        &errors,
        |_| {},
    ));
    if let Some(e) = load_errors.first() {
        bail!("YCSB {core} load: {e}");
    }
    errors.check(ops).with_context(|| format!("YCSB {core}"))?;
    if let Some(e) = errors.first() {
        eprintln!(
            "kv ycsb {core}: {} operations failed; first: {e}",
            errors.count()
        );
    }
    Ok(YcsbRun {
        ops,
        elapsed,
        stats,
        errors: errors.count(),
    })
}

fn client_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the client runtime")
}

fn ycsb_table(args: &SuiteArgs, report: &mut Report, workloads: &[Core]) -> Result<()> {
    let workloads: &[Core] = if workloads.is_empty() {
        &Core::ALL
    } else {
        workloads
    };
    let (scpu, ccpus) = cpus();
    crate::pin_current_thread(ccpus[0]).context("pinning the client")?;
    let (records, ops): (u64, u64) = args.pick((1000, 2000), (20_000, 50_000));
    let bar = args.progress((BACKENDS.len() * workloads.len()) as u64, "kv ycsb");
    let mut results: Vec<(Core, &str, YcsbRun)> = Vec::new();
    let mut redis_missing = false;
    let rt = client_runtime()?;
    for backend in BACKENDS {
        // One server process per backend (only one alive at a time), all six workloads on it.
        let (driver, _srv, _redis): (Driver, Option<ServerProc>, Option<RedisProc>) = match backend
        {
            "grpc-tcp" | "grpc-rrpc-shm" => {
                let what = if backend == "grpc-tcp" {
                    Serve::GrpcTcp(free_port()?)
                } else {
                    Serve::GrpcShm
                };
                let srv = ServerProc::spawn(&what, scpu)?;
                let uri = srv.grpc.clone().context("no gRPC URI")?;
                let driver = if backend == "grpc-tcp" {
                    // Plain tonic over TCP (no rrpc in the path), as the rpc suite's baseline.
                    let ch = rt
                        .block_on(
                            tonic::transport::Endpoint::from_shared(uri.clone())?
                                .tcp_nodelay(true)
                                .connect(),
                        )
                        .with_context(|| format!("connecting to {uri}"))?;
                    Driver::Tonic(GrpcKv::new(ch))
                } else {
                    let kv = rt
                        .block_on(GrpcKv::connect(&uri, grpc_config()))
                        .with_context(|| format!("connecting to {uri}"))?;
                    Driver::Grpc(kv)
                };
                (driver, Some(srv), None)
            }
            "redis" => match RedisProc::spawn(scpu)? {
                Some(r) => {
                    let c = rt.block_on(r.connect())?;
                    (Driver::Redis(c, false), None, Some(r))
                }
                None => {
                    redis_missing = true;
                    bar.inc(workloads.len() as u64);
                    continue;
                }
            },
            _ => {
                let srv = ServerProc::spawn(
                    &Serve::Rf(ModePolicy::Hybrid, YCSB_BUFFER, Duration::ZERO),
                    scpu,
                )?;
                let ep = srv.rf.clone().context("no RF endpoint")?;
                let c = KvClient::new(rf_connect(&ep, YCSB_BUFFER, 5)?);
                (Driver::Rf(Box::new(c)), Some(srv), None)
            }
        };
        let mut clients = vec![driver];
        for &core in workloads {
            bar.set_message(format!("{core} {backend}"));
            let r = ycsb_run(&rt, &mut clients, core, records, ops, true)
                .with_context(|| format!("YCSB {core} on {backend}"))?;
            results.push((core, backend, r));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();

    let mut t = Table::new(
        "ycsb",
        "YCSB A-F: gRPC over TCP vs gRPC over rrpc-tonic vs Redis vs RF-RPC (RR-Compound Table V)",
        &[
            "workload",
            "backend",
            "kops",
            "p50_us",
            "p99_us",
            "errors",
            "ratio_vs_grpc_tcp",
        ],
    );
    let kops_of = |core: Core, b: &str| {
        results
            .iter()
            .find(|(c, bb, _)| *c == core && *bb == b)
            .map(|(_, _, r)| rate(r.ops, r.elapsed) / 1e3)
    };
    for (core, backend, r) in &results {
        let kops = rate(r.ops, r.elapsed) / 1e3;
        // The last row is the total over every operation type.
        let rows = r.stats.summary(r.elapsed);
        let (p50, p99) = rows.last().map_or((0.0, 0.0), |t| (t.p50_us, t.p99_us));
        t.push(vec![
            Value::from(core.to_string()),
            Value::from(*backend),
            Value::from(kops),
            Value::from(p50),
            Value::from(p99),
            Value::from(r.errors),
            Value::from(Ratio::of(
                kops,
                kops_of(*core, "grpc-tcp").unwrap_or(f64::NAN),
            )),
        ]);
    }
    let plan = ThreadPlan::new()
        .side(
            "server process (gRPC: 1 tokio worker + rrpc-tonic's poller thread; RF-RPC: 1 polling thread; Redis: its main thread)",
            1,
            Some(vec![scpu]),
        )
        .side("client (1 closed-loop client, one op in flight; over rrpc-tonic plus its poller thread on the same cpu)", 1, Some(vec![ccpus[0]]));
    t.note(plan.describe());
    t.note(format!(
        "{records} records of 1000 B loaded per workload, {ops} operations per run, one client, one server process (one store) per backend, shared by the six workloads in order A-F (each loads its records again; D's and E's inserts stay); latency per transaction (F's read-modify-write is two calls); grpc-tcp: a plain tonic client over TCP (TCP_NODELAY both sides) to the same gRPC server binary; grpc-rrpc-shm: rrpc-tonic's fast path over shm://; RF-RPC: hybrid mode (R = 5), 1 MiB buffers; Redis: unpipelined GET/SET, E's scans through a sorted-set index (ZADD on insert, ZRANGE BYLEX + MGET), keyspace flushed per workload"
    ));
    let mut ratios = Vec::new();
    let mut all_met = true;
    for &core in workloads {
        if let (Some(r), Some(b)) = (kops_of(core, "grpc-rrpc-shm"), kops_of(core, "grpc-tcp")) {
            let x = r / b;
            all_met &= x >= 2.35;
            ratios.push(format!("{core} {x:.2}x"));
        }
    }
    t.note(format!(
        "rrpc-tonic / tonic-TCP per workload: {}; paper target >= 2.35x on every workload: {}",
        ratios.join(", "),
        if ratios.is_empty() {
            "not measured"
        } else if all_met {
            "met"
        } else {
            "NOT met"
        }
    ));
    if redis_missing {
        t.note("redis: skipped, `redis-server` is not installed (apt-get install redis-server)");
    } else if let (Some(rf), Some(rd)) = (kops_of(Core::C, "rf-rpc"), kops_of(Core::C, "redis")) {
        let x = rf / rd;
        t.note(format!(
            "RF-RPC GET throughput / Redis GET throughput (workload C, 100 % GET, 1 client each): {rf:.1} / {rd:.1} kops/s = {x:.2}x; target >= 3x: {}",
            if x >= 3.0 { "met" } else { "NOT met" }
        ));
    }
    report.add(t)
}

/// Runs the kv suite into `report`: every experiment, or those whose names start with an entry
/// of `only` (`rfrpc`, `batch`, `ycsb`); `ycsb` runs the YCSB `workloads` (empty: A-F).
///
/// # Errors
/// Server start, connection or call errors.
pub fn run_suite(
    args: &SuiteArgs,
    report: &mut Report,
    only: &[String],
    workloads: &[Core],
) -> Result<()> {
    let want = |e: &str| only.is_empty() || only.iter().any(|o| e.starts_with(o.as_str()));
    let (scpu, ccpus) = cpus();
    report.machine_mut().provider = "shm".into();
    report.machine_mut().pinning = format!(
        "servers (separate processes) pinned to cpu {scpu}; clients pinned to cpu {ccpus:?}"
    );
    crate::pin_current_thread(ccpus[0]).context("pinning the main thread")?;
    if want("rfrpc") {
        rfrpc_tables(args, report)?;
    }
    if want("batch") {
        batch_table(args, report)?;
    }
    if want("ycsb") {
        ycsb_table(args, report, workloads)?;
    }
    Ok(())
}
