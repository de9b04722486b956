//! The demo: one Greeter served on TCP, a Unix socket and shm (or `rdma://`)
//! at once; a few thousand sequential calls on each path; one line per path:
//! `<path> p50 <x>us p99 <y>us`, then the ratios to `tcp`. Before each path's
//! line, what carried it: `<path>: connected to <uri> over <path>, carried by
//! <carrier>`.
//!
//! `--transport rdma` runs the ring paths (`rdma-h2`, `rdma-fast`) over
//! `rdma://` on 127.0.0.1 instead of `shm://` (feature `verbs`; rrpc's
//! default device, the first listed) and fails unless verbs carried them.
//! `--calls N` keeps a run short (e.g. under soft-RoCE, where the numbers
//! mean nothing: functional check only).
//!
//! Fair by construction: the server and the client each run on their own OS
//! thread with their own single-threaded tokio runtime, built the same way
//! for every path (tonic's TCP and Unix-socket baselines included). The
//! thread plan is printed first: the server thread is pinned to CPU 0 and the
//! client thread to CPU 1 (unless `--no-pin`); rrpc's polling threads
//! (rrpc-poller) come on top and are never pinned.
//!
//! Why pin: rrpc's readers spin while a connection is busy. Unpinned, the
//! kernel's wake-affine placement may put the server and client threads on
//! the same core; then a thread that slept waits for the other's whole spin
//! before it runs, both sides keep missing their spin, and every call costs
//! about two spin budgets (measured: ~110 µs with a 50 µs spin, ~410 µs with
//! 200 µs, in some runs and not others). Pinned, 12 of 12 runs stayed at
//! ~5.5 µs.
//!
//! `--modes` measures the ring paths under several connection-management
//! configurations (`MODE[:polling_threads][@bp_timeout_us][!]`, e.g. `bpev:1@20`, `!` turns
//! auto-tuning of the spin off,
//! `event`, `event@50` (Event plus a 50 µs receive spin), `bp`, `bpts:1`;
//! `default` is rrpc-tonic's default; `all` is a
//! preset list) and prints the poller's counters per call for each. A
//! `+shared` suffix (`default+shared`) turns `shared_queue_pairs` on at both
//! ends: on `shm://` the calls then run over a lane of a shared connection.

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rrpc_tonic::{
    Carrier, ChannelPath, PathPreference, PollerConfig, PollerMode, RrpcConfig, RrpcContext,
    RrpcEndpoint, RrpcIncoming, Server,
};
use tonic::{Request, Response, Status};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("helloworld");
}
use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// Calls per path (after a warm-up of 10%).
    #[arg(long, default_value_t = 3000)]
    calls: u64,
    /// Poller configurations for the ring paths (comma-separated, or `all`).
    #[arg(long, default_value = "default")]
    modes: String,
    /// What carries the ring paths: shm, or rdma (`rdma://127.0.0.1`,
    /// needs the `verbs` feature and an RDMA device, soft-RoCE included).
    #[arg(long, default_value = "shm")]
    transport: String,
    /// Do not pin the server thread to CPU 0 and the client thread to CPU 1.
    #[arg(long)]
    no_pin: bool,
    /// Skip the tcp and uds baselines (only meaningful with several modes).
    #[arg(long)]
    no_baselines: bool,
    /// Run only these paths (comma-separated names as printed: `tcp`, `uds`,
    /// `shm-h2`, `shm-fast`, `inproc-fast`, `tonic-inproc`, `tonic-h2-mem`), e.g. to
    /// profile one (`perf record ... demo --only shm-fast`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Print the lines above on stderr and, on stdout, one JSON object:
    /// `{"paths":[{"path":"tcp","p50_us":..,"p99_us":..},...]}`, every path
    /// measured, `tonic-inproc` and `tonic-h2-mem` included (what
    /// `cargo xtask bench check` reads).
    #[arg(long)]
    json: bool,
    /// Wait this many milliseconds between calls (default: none, a
    /// ping-pong), and print the process's CPU time per call (server and
    /// client: both run in this process): the cost of a call at low load.
    #[arg(long)]
    pace_ms: Option<u64>,
}

/// `--pace-ms`: the wait between two calls, when set.
static PACE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// This process's CPU time (user + system, every thread).
fn process_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let (a, b) = (u.user_time(), u.system_time());
        Duration::from_micros((a.tv_sec() * 1_000_000 + a.tv_usec()) as u64)
            + Duration::from_micros((b.tv_sec() * 1_000_000 + b.tv_usec()) as u64)
    })
}

/// Prints a human line: on stdout, or on stderr with `--json` (stdout then
/// carries only the JSON object).
fn say(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

#[derive(Debug, Default)]
struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("Hello {}!", req.into_inner().name),
        }))
    }
}

/// One poller variant: its label, the rrpc config and the context (shared
/// by server and client, so they share one poller; the client's HTTP/2 row
/// too, whose config differs in its path only).
#[derive(Debug, Clone)]
struct Variant {
    label: String,
    cfg: RrpcConfig,
    ctx: RrpcContext,
}

fn parse_variant(s: &str) -> anyhow::Result<Variant> {
    if let Some(base) = s.strip_suffix("+shared") {
        let v = parse_variant(base)?;
        let cfg = v.cfg.to_builder().shared_queue_pairs(true).build()?;
        return Ok(Variant {
            label: s.to_string(),
            ctx: RrpcContext::new(&cfg),
            cfg,
        });
    }
    if s == "default" {
        return Ok(Variant {
            label: "default".into(),
            cfg: RrpcConfig::default(),
            ctx: RrpcContext::new(&RrpcConfig::default()),
        });
    }
    let (s_, fixed) = match s.strip_suffix('!') {
        Some(r) => (r, true),
        None => (s, false),
    };
    let (rest, timeout) = match s_.split_once('@') {
        Some((a, t)) => (a, Some(Duration::from_micros(t.parse()?))),
        None => (s, None),
    };
    let (mode, threads) = match rest.split_once(':') {
        Some((m, n)) => (m, Some(n.parse::<usize>()?)),
        None => (rest, None),
    };
    let mode = PollerMode::parse(mode).ok_or_else(|| anyhow::anyhow!("unknown mode {mode}"))?;
    let mut pc = PollerConfig::builder().mode(mode);
    if let Some(n) = threads {
        pc = pc.polling_threads(n);
    }
    if let Some(t) = timeout {
        pc = pc.bp_timeout(t);
    }
    if fixed {
        pc = pc.auto_tune(false);
    }
    let pc = pc.build()?;
    let mut cfg = RrpcConfig::builder().poller(pc).build()?;
    if mode == PollerMode::Event
        && let Some(t) = timeout
    {
        // Event never spins: `event@N` is Event plus rrpc-tonic's receive spin.
        cfg = cfg.to_builder().receive_spin(t).build()?;
    }
    Ok(Variant {
        label: s.to_string(),
        ctx: RrpcContext::new(&cfg),
        cfg,
    })
}

fn variants(spec: &str) -> anyhow::Result<Vec<Variant>> {
    let spec = if spec == "all" {
        "default,bpev:2@20,bpev:1@20,bpev:1@0,bpev:1@50!,bpev:1@200!,bpts:1,bp,event,event@50"
    } else {
        spec
    };
    spec.split(',').map(parse_variant).collect()
}

fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
    Ok(())
}

/// A single-threaded runtime on a new OS thread (the same for both sides and every path).
fn side_thread<F, T>(name: &str, cpu: Option<usize>, f: F) -> std::thread::JoinHandle<T>
where
    F: FnOnce(&tokio::runtime::Runtime) -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(c) = cpu
                && let Err(e) = pin_current_thread(c)
            {
                eprintln!("pinning to cpu {c} failed: {e}");
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            f(&rt)
        })
        .expect("spawn thread")
}

/// What one path measured, and what carried it.
struct Measured {
    p50: f64,
    p99: f64,
    path: ChannelPath,
    carrier: Carrier,
}

async fn measure(
    uri: &str,
    cfg: RrpcConfig,
    ctx: Option<RrpcContext>,
    calls: u64,
) -> anyhow::Result<Measured> {
    let mut ep = RrpcEndpoint::new(uri)?.config(cfg);
    if let Some(ctx) = ctx {
        ep = ep.context(ctx);
    }
    let mut last = None;
    let mut channel = None;
    // The server thread starts its listeners at the same time: retry for a
    // while (long enough for a slow machine, an emulated one included).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match ep.connect().await {
            Ok(c) => {
                channel = Some(c);
                break;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let channel = channel.ok_or_else(|| anyhow::anyhow!("connect {uri}: {last:?}"))?;
    let carrier = channel.carrier();
    let (p50, p99) = time_calls(&mut GreeterClient::new(channel.clone()), calls).await?;
    Ok(Measured {
        p50,
        p99,
        path: channel.path(),
        carrier,
    })
}

/// `calls` greetings on `client` after `calls / 10` untimed ones: p50 and
/// p99 in µs.
async fn time_calls<T>(client: &mut GreeterClient<T>, calls: u64) -> anyhow::Result<(f64, f64)>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut hist = Histogram::<u64>::new(3)?;
    for i in 0..calls + calls / 10 {
        if let Some(p) = PACE.get() {
            tokio::time::sleep(*p).await;
        }
        let t = Instant::now();
        client
            .say_hello(HelloRequest {
                name: "demo".into(),
            })
            .await?;
        if i >= calls / 10 {
            hist.record(t.elapsed().as_nanos() as u64)?;
        }
    }
    Ok((
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    ))
}

/// The HTTP/2 floor: tonic's own server and channel over an in-memory byte
/// stream (`tokio::io::duplex`), both ends on this thread's runtime. No
/// transport, no wake-up crosses a thread: what hyper, h2 and tonic cost per
/// call on this machine, and so the least any HTTP/2 transport can reach.
async fn measure_h2_mem(calls: u64) -> anyhow::Result<(f64, f64)> {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(MyGreeter))
            .serve_with_incoming(tokio_stream::iter([Ok::<_, std::io::Error>(server_io)])),
    );
    let mut client_io = Some(client_io);
    let channel = tonic::transport::Endpoint::from_static("http://in-memory")
        .connect_with_connector(tower::service_fn(move |_| {
            let io = client_io.take();
            async move {
                io.map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("the in-memory stream connects once"))
            }
        }))
        .await?;
    let r = time_calls(&mut GreeterClient::new(channel), calls).await;
    server.abort();
    r
}

/// Where the demo's `inproc-fast` row is served (`inproc://`: the fast path
/// over an in-process pipe).
const INPROC_URI: &str = "inproc://rrpc-demo";

/// The floor: the generated client calling the generated server's service
/// directly, with no transport at all (`tonic-inproc`). Anything that keeps
/// tonic's stubs pays at least this.
async fn measure_inproc(calls: u64) -> anyhow::Result<(f64, f64)> {
    time_calls(
        &mut GreeterClient::new(GreeterServer::new(MyGreeter)),
        calls,
    )
    .await
}

/// The round trip of one cache line between CPUs `a` and `b` (two threads pinned there
/// bounce a counter): the median of 9 batches of 2000 round trips. The fast path moves a few
/// lines between the server's and the client's CPUs per call, so its latency follows this
/// figure, which the machine sets (where the hypervisor places the two virtual CPUs: the
/// same physical core's two hyperthreads, two cores, two sockets) and the floor
/// (`tonic-inproc`, one thread) does not see. Printed with every run (#54).
fn line_round_trip(a: usize, b: usize) -> Option<Duration> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    const BATCH: u64 = 2000;
    const BATCHES: u64 = 9;
    let line = Arc::new(AtomicU64::new(0));
    let l2 = line.clone();
    let echo = std::thread::spawn(move || {
        let _ = pin_current_thread(b);
        for i in 0..BATCH * BATCHES {
            while l2.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            l2.store(2 * i + 2, Ordering::Release);
        }
        Some(())
    });
    let ping = std::thread::spawn(move || {
        let _ = pin_current_thread(a);
        let mut batches = Vec::new();
        for k in 0..BATCHES {
            let t0 = Instant::now();
            for i in k * BATCH..(k + 1) * BATCH {
                line.store(2 * i + 1, Ordering::Release);
                while line.load(Ordering::Acquire) != 2 * i + 2 {
                    std::hint::spin_loop();
                }
            }
            batches.push(t0.elapsed() / u32::try_from(BATCH).ok()?);
        }
        batches.sort();
        Some(batches[batches.len() / 2])
    });
    let rtt = ping.join().ok()?;
    echo.join().ok()??;
    rtt
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(ms) = args.pace_ms {
        let _ = PACE.set(Duration::from_millis(ms));
    }
    let variants = variants(&args.modes)?;
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    // TCP and rdma:// listeners bind port 0; the server thread reports
    // the ports it got before the client starts.
    let tcp = "http://127.0.0.1:0".to_string();
    let uds = format!("unix://{}/rrpc-demo-{pid}.uds", dir.display());
    // One ring listener per poller variant.
    let transport = args.transport.as_str();
    let rings: Vec<String> = match transport {
        "shm" => (0..variants.len())
            .map(|i| format!("shm://{}/rrpc-demo-{pid}-{i}.sock", dir.display()))
            .collect(),
        "rdma" => (0..variants.len())
            .map(|_| "rdma://127.0.0.1:0".to_string())
            .collect(),
        t => anyhow::bail!("unknown transport {t:?} (shm, rdma)"),
    };
    let want_verbs = transport == "rdma";

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (scpu, ccpu) = if !args.no_pin && cores >= 2 {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    let pin_note =
        |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("pinned to cpu {c}"));
    let json = args.json;
    let line_rtt = match (scpu, ccpu) {
        (Some(a), Some(b)) => line_round_trip(a, b),
        _ => None,
    };
    if let Some(d) = line_rtt {
        say(
            json,
            &format!(
                "cache-line round trip between cpu {} and cpu {}: {} ns (the fast path moves a few lines between them per call)",
                scpu.unwrap_or(0),
                ccpu.unwrap_or(1),
                d.as_nanos()
            ),
        );
    }
    say(
        json,
        &format!(
            "thread plan ({cores} cores): server 1 OS thread (tokio current_thread, {}); \
         client 1 OS thread (tokio current_thread, {}); {transport} rows add the poller's threads \
         (shared by both sides, unpinned, parked when idle), printed per mode",
            pin_note(scpu),
            pin_note(ccpu)
        ),
    );

    // Server: every listener on one thread and runtime.
    let mut uris = Vec::new();
    if !args.no_baselines {
        uris.push((tcp.clone(), RrpcConfig::default(), None));
        uris.push((uds.clone(), RrpcConfig::default(), None));
    }
    for (uri, v) in rings.iter().zip(&variants) {
        uris.push((uri.clone(), v.cfg.clone(), Some(v.ctx.clone())));
    }
    // The fast path over an in-process pipe (`inproc://`, #56): the same
    // frames and call tables as on rings, the server on its thread and the
    // client on its own, no fabric.
    uris.push((INPROC_URI.to_string(), RrpcConfig::default(), None));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (bound_tx, bound_rx) = std_mpsc::channel::<anyhow::Result<Vec<String>>>();
    let server = side_thread("demo-server", scpu, move |rt| {
        rt.block_on(async move {
            let router = Server::builder().add_service(GreeterServer::new(MyGreeter));
            let bound = uris
                .into_iter()
                .map(|(uri, cfg, ctx)| match ctx {
                    Some(ctx) => RrpcIncoming::bind_with_context(&uri, cfg, ctx),
                    None => RrpcIncoming::bind(&uri, cfg),
                })
                .collect::<Result<Vec<_>, _>>();
            let incomings = match bound {
                Ok(b) => {
                    let _ = bound_tx.send(Ok(b.iter().map(|i| i.uri().to_string()).collect()));
                    b
                }
                Err(e) => {
                    let _ = bound_tx.send(Err(anyhow::anyhow!("binding: {e}")));
                    return Err(e.into());
                }
            };
            let mut servers = tokio::task::JoinSet::new();
            for incoming in incomings {
                let (r, mut stop) = (router.clone(), stop_rx.clone());
                servers.spawn(async move {
                    r.serve_rrpc_incoming(incoming, async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
                });
            }
            while let Some(r) = servers.join_next().await {
                r??;
            }
            Ok::<(), anyhow::Error>(())
        })
    });

    // The URIs as bound (ports chosen by the OS), in the order of `uris`.
    let mut bound = bound_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the server thread ended before binding"))??;
    let inproc_uri = bound
        .pop()
        .ok_or_else(|| anyhow::anyhow!("the inproc:// listener was not bound"))?;
    let (tcp, uds, rings) = if args.no_baselines {
        (tcp, uds, bound)
    } else {
        (bound[0].clone(), bound[1].clone(), bound[2..].to_vec())
    };

    // Client: every path from one thread and runtime.
    let mut paths: Vec<(String, String, RrpcConfig, Option<RrpcContext>)> = Vec::new();
    if !args.no_baselines {
        paths.push(("tcp".into(), tcp, RrpcConfig::default(), None));
        paths.push(("uds".into(), uds, RrpcConfig::default(), None));
    }
    for (i, v) in variants.iter().enumerate() {
        let suffix = if variants.len() > 1 || v.label != "default" {
            format!(" [{}]", v.label)
        } else {
            String::new()
        };
        paths.push((
            format!("{transport}-h2{suffix}"),
            rings[i].clone(),
            v.cfg.to_builder().path(PathPreference::Http2).build()?,
            Some(v.ctx.clone()),
        ));
        paths.push((
            format!("{transport}-fast{suffix}"),
            rings[i].clone(),
            v.cfg.clone(),
            Some(v.ctx.clone()),
        ));
    }
    paths.push((
        "inproc-fast".into(),
        inproc_uri,
        RrpcConfig::default(),
        None,
    ));
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    paths.retain(|p| wanted(&p.0));
    let (run_inproc, run_h2_mem) = (wanted("tonic-inproc"), wanted("tonic-h2-mem"));
    let calls = args.calls;
    let (line_tx, line_rx) = std_mpsc::channel::<String>();
    let client = side_thread("demo-client", ccpu, move |rt| {
        rt.block_on(async move {
            let mut results = Vec::new();
            for (name, uri, cfg, variant) in paths {
                let poller = match &variant {
                    Some(ctx) => Some(ctx.poller_handle()?),
                    None => None,
                };
                let before = poller.as_ref().map(|p| p.stats());
                let loads = poller.as_ref().map(|p| p.thread_loads()).unwrap_or_default();
                let is_variant = variant.is_some();
                let cpu0 = process_cpu();
                let m = measure(&uri, cfg, variant, calls).await?;
                let cpu_per_call = (process_cpu() - cpu0).as_secs_f64() * 1e6
                    / (calls + calls / 10) as f64;
                let _ = line_tx.send(format!(
                    "{name}: connected to {uri} over {:?}, carried by {:?}",
                    m.path, m.carrier
                ));
                if is_variant && want_verbs && !matches!(m.carrier, Carrier::Verbs { .. }) {
                    anyhow::bail!("{name}: {uri} was not carried by verbs but by {:?}", m.carrier);
                }
                let (p50, p99) = (m.p50, m.p99);
                let mut line = format!("{name} p50 {p50:.1}us p99 {p99:.1}us");
                if PACE.get().is_some() {
                    line += &format!(" cpu/call {cpu_per_call:.1}us");
                }
                if let (Some(p), Some(b)) = (&poller, before) {
                    let d = p.stats().since(&b);
                    let n = (calls + calls / 10) as f64;
                    // Each polling thread's busy share of the run (what
                    // `rrpc_poller_thread_busy_ratio` reports to `metrics`).
                    let busy: Vec<String> = p
                        .thread_loads()
                        .iter()
                        .filter_map(|now| {
                            let then = loads.iter().find(|l| l.thread == now.thread)?;
                            Some(format!("{:.0}%", 100.0 * now.busy_since(then)))
                        })
                        .collect();
                    line += &format!(
                        "  | {} polling thread(s) {} (busy {}){}; per call: spin hits {:.2}, first-check hits {:.2}, sleeps {:.2}, wakes {:.2} (mean wake-up {}), sleeps announced {:.2}, doorbell wakes {:.2}, yield hits {:.2}, spins skipped {:.2} (lost their core {:.2}); back-offs {} descheduled {} not earning",
                        p.config().mode(),
                        p.threads(),
                        if busy.is_empty() { "-".to_string() } else { busy.join(" ") },
                        if d.spins == 0 && d.bell_wakes + d.yield_hits > 0 { ", no spin: every wait handed to the peer (the peer shares this process's only CPU)" } else { "" },
                        d.spin_hits as f64 / n,
                        d.first_check_hits as f64 / n,
                        d.sleeps as f64 / n,
                        (d.eventfd_writes + d.waker_wakes) as f64 / n,
                        d.mean_wake_latency()
                            .map_or("-".to_string(), |l| format!("{:.1}us", l.as_secs_f64() * 1e6)),
                        (d.announces + d.self_announces) as f64 / n,
                        d.bell_wakes as f64 / n,
                        d.yield_hits as f64 / n,
                        d.spin_skips as f64 / n,
                        d.lost_core_spins as f64 / n,
                        d.backoffs_descheduled,
                        d.backoffs_not_earning,
                    );
                }
                let _ = line_tx.send(line);
                results.push((name, p50, p99));
            }
            let mut floor = None;
            if run_inproc {
                let (f50, f99) = measure_inproc(calls).await?;
                let _ = line_tx.send(format!(
                    "tonic-inproc p50 {f50:.1}us p99 {f99:.1}us  | no transport: the generated client calls the generated server's service directly"
                ));
                floor = Some((f50, f99));
            }
            let mut h2_floor = None;
            if run_h2_mem {
                let (m50, m99) = measure_h2_mem(calls).await?;
                let _ = line_tx.send(format!(
                    "tonic-h2-mem p50 {m50:.1}us p99 {m99:.1}us  | HTTP/2 with no transport: tonic's server and channel over an in-memory byte stream, both on the client thread"
                ));
                h2_floor = Some((m50, m99));
            }
            Ok::<_, anyhow::Error>((results, floor, h2_floor))
        })
    });
    for line in line_rx {
        say(json, &line);
    }
    let (results, floor, h2_floor) = client.join().expect("client thread")?;
    if let Some((_, t50, t99)) = results.iter().find(|(n, ..)| n == "tcp").cloned() {
        for (name, p50, p99) in results.iter().filter(|(n, ..)| n != "tcp") {
            say(
                json,
                &format!(
                    "{name}/tcp p50 {:.2}x ({:.1}x lower) p99 {:.2}x",
                    p50 / t50,
                    t50 / p50,
                    p99 / t99
                ),
            );
        }
        if let Some((m50, _)) = h2_floor {
            say(json, &format!("tonic-h2-mem/tcp p50 {:.2}x", m50 / t50));
        }
    }
    if let Some((f50, _)) = floor {
        for (name, p50, _) in &results {
            say(
                json,
                &format!(
                    "{name}/tonic-inproc p50 {:.2}x (the floor for anything that keeps tonic's stubs)",
                    p50 / f50
                ),
            );
        }
    }
    if let Some((m50, _)) = h2_floor {
        for (name, p50, _) in results.iter().filter(|(n, ..)| n.contains("-h2")) {
            say(
                json,
                &format!(
                    "{name}/tonic-h2-mem p50 {:.2}x (the floor for anything that keeps HTTP/2)",
                    p50 / m50
                ),
            );
        }
    }
    if json {
        // Path names are ours (no quote or backslash): no JSON library needed.
        let rows: Vec<String> = results
            .iter()
            .map(|(n, a, b)| (n.as_str(), *a, *b))
            .chain(floor.map(|(a, b)| ("tonic-inproc", a, b)))
            .chain(h2_floor.map(|(a, b)| ("tonic-h2-mem", a, b)))
            .chain(line_rtt.map(|d| {
                let us = d.as_secs_f64() * 1e6;
                ("line-rtt", us, us)
            }))
            .map(|(n, p50, p99)| format!(r#"{{"path":"{n}","p50_us":{p50},"p99_us":{p99}}}"#))
            .collect();
        println!(r#"{{"paths":[{}]}}"#, rows.join(","));
    }
    let _ = stop_tx.send(true);
    server.join().expect("server thread")?;
    Ok(())
}
