//! The rpc suite's experiments after Table III and Fig. 10: connection management with 4 KiB
//! RPCs (Fig. 8), bandwidth against ring size (Fig. 12), zero-copy on and off (Fig. 14) and CPU
//! and memory per side under heavy and low load (Figs. 15–16).
//!
//! Figs. 8, 12 and 14 run server and clients in this process on the suite's two pinned
//! runtimes; Figs. 15–16 start the server in a child process ([`ChildServer`]) so each side's
//! CPU time and memory are read from its own `/proc/<pid>`.

use std::time::{Duration, Instant};

use anyhow::Result;
use rrpc_tonic::{PollerConfig, PollerMode, RrpcConfig};
use tokio::runtime::Runtime;

use super::{
    ChildServer, Throughput, Transport, connect_many, connect_to, rrpc_config, start_server_with,
    stream_throughput, unary_load, with_path,
};
use crate::cpu::{CpuTimes, rss_bytes, thread_count};
use crate::{PlotSpec, Ratio, SuiteArgs, Table, Value};

/// What every experiment needs from the suite.
pub(super) struct Ctx<'a> {
    pub(super) args: &'a SuiteArgs,
    pub(super) server_rt: &'a Runtime,
    pub(super) client_rt: &'a Runtime,
    /// CPU the server side is pinned to (the child server of Figs. 15–16 too).
    pub(super) server_cpu: usize,
    /// `--only` (empty: every experiment).
    pub(super) only: &'a [String],
    /// Failures so far (`"experiment: what"`); the suite fails at the end if any.
    pub(super) failures: Vec<String>,
}

impl Ctx<'_> {
    fn want(&self, exp: &str) -> bool {
        super::selected(self.only, exp)
    }

    pub(super) fn fail(&mut self, what: String, e: &anyhow::Error) {
        eprintln!("rpc: {what} failed: {e:#}");
        self.failures.push(format!("{what}: FAILED: {e:#}"));
    }
}

pub(super) fn secs(d: Duration) -> String {
    if d.as_secs() >= 1 {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn gbps(t: &Throughput, bytes_per_op: usize) -> f64 {
    let s = t.elapsed.as_secs_f64();
    if s > 0.0 {
        (t.ops as f64 * bytes_per_op as f64 * 8.0) / s / 1e9
    } else {
        f64::NAN
    }
}

pub(super) fn krps(t: &Throughput) -> f64 {
    let s = t.elapsed.as_secs_f64();
    if s > 0.0 { t.ops as f64 / s / 1e3 } else { 0.0 }
}

// ---------------------------------------------------------------------------------------------
// Fig. 8: 4 KiB request/response throughput per connection-management mode.
// ---------------------------------------------------------------------------------------------

/// One row label of Fig. 8 and how to build it (`None`: the tonic-TCP baseline).
struct ModeVariant {
    name: &'static str,
    cfg: Option<RrpcConfig>,
    what: &'static str,
}

fn mode_variants() -> Vec<ModeVariant> {
    let fast = |pc: PollerConfig| {
        with_path(
            RrpcConfig::builder()
                .poller(pc)
                .build()
                .expect("a valid config"),
            Transport::RrpcFast,
        )
    };
    let one = |pc: PollerConfig| {
        pc.to_builder()
            .polling_threads(1)
            .build()
            .expect("1 is a valid thread count")
    };
    vec![
        ModeVariant {
            name: "tonic-tcp",
            cfg: None,
            what: "tonic over TCP loopback (the paper's gRPC over IPoIB stands here)",
        },
        ModeVariant {
            name: "bp",
            cfg: Some(fast(PollerConfig::paper(PollerMode::Bp))),
            what: "BP: one spinning polling thread per connection end, never parks",
        },
        ModeVariant {
            name: "bpts",
            cfg: Some(fast(one(PollerConfig::paper(PollerMode::Bpts)))),
            what: "BPTS: 1 polling thread scanning every connection end, never parks",
        },
        ModeVariant {
            name: "event",
            cfg: Some(fast(PollerConfig::paper(PollerMode::Event))),
            what: "EVENT: no polling thread; WRITE_WITH_IMM wakes the reader through its \
                   completion channel",
        },
        ModeVariant {
            name: "bpev",
            cfg: Some(rrpc_config(Transport::RrpcFast)),
            what: "BPEV: rrpc-tonic's default (1 polling thread, 50 us fixed spin, idle parking)",
        },
    ]
}

/// The client counts of Figs. 8 and 10: `default`, or the list in
/// `RRPC_BENCH_CLIENTS` (comma-separated, e.g. `128,256`: one load point
/// looked at alone).
pub(super) fn client_counts(default: Vec<usize>) -> Vec<usize> {
    let Ok(list) = std::env::var("RRPC_BENCH_CLIENTS") else {
        return default;
    };
    let parsed: Option<Vec<usize>> = list
        .split(',')
        .map(|c| c.trim().parse().ok().filter(|&n| n > 0))
        .collect();
    match parsed {
        Some(v) if !v.is_empty() => v,
        _ => panic!("RRPC_BENCH_CLIENTS={list:?}: expected client counts like 128,256"),
    }
}

/// The largest client count BP runs with: BP starts one spinning thread per connection end
/// (two per client in this one-process setup), so beyond this the host's cores are shared by
/// dozens of spinning threads and the runtime threads barely run (the paper's own BP collapse,
/// Fig. 8 (a) at 64+ clients on 40 cores).
fn bp_max_clients() -> usize {
    8 * crate::process_cpus().len()
}

/// Fig. 8 (a)/(b) and (c)/(d): closed-loop unary 4 KiB / 4 KiB calls, one in flight per
/// client, continuously and rate-limited, with the process's user and system CPU time.
pub(super) fn fig8(ctx: &mut Ctx<'_>, plan_note: &str) -> Vec<Table> {
    let args = ctx.args;
    let clients: Vec<usize> =
        client_counts(args.pick(vec![1, 4], vec![1, 4, 16, 32, 64, 128, 256]));
    let dur = args.duration(Duration::from_millis(300), Duration::from_secs(2));
    let interval = Duration::from_millis(1);
    let variants = mode_variants();
    let bar = args.progress((variants.len() * clients.len() * 2) as u64, "rpc fig8");
    let cols = [
        "mode", "clients", "krps", "x_vs_tcp", "p50_us", "p99_us", "p999_us", "mean_us",
        "user_pct", "sys_pct", "threads",
    ];
    let mut tables = Vec::new();
    for (load, iv) in [("continuous", None), ("interval_1ms", Some(interval))] {
        let exp = if iv.is_none() {
            "connmgmt_4k_continuous"
        } else {
            "connmgmt_4k_interval"
        };
        if !ctx.want(exp) {
            bar.inc((variants.len() * clients.len()) as u64);
            continue;
        }
        let (exp, title) = match iv {
            None => (
                "connmgmt_4k_continuous",
                "4 KiB request / 4 KiB response, one call in flight per client, \
                 per connection-management mode (Fig. 8 (a)/(b))",
            ),
            Some(_) => (
                "connmgmt_4k_interval",
                "4 KiB request / 4 KiB response, one call per client per 1 ms, \
                 per connection-management mode (Fig. 8 (c)/(d))",
            ),
        };
        let mut t = Table::new(exp, title, &cols);
        let mut tcp: Vec<(usize, f64)> = Vec::new();
        let mut skipped_bp = Vec::new();
        for v in &variants {
            for &k in &clients {
                bar.set_message(format!("{load} {} {k} clients", v.name));
                if v.name == "bp" && k > bp_max_clients() {
                    skipped_bp.push(k);
                    bar.inc(1);
                    continue;
                }
                let res = fig8_point(ctx, v, k, iv, dur);
                match res {
                    Ok((r, user, sys, threads)) => {
                        let rate = krps(&r);
                        if v.cfg.is_none() {
                            tcp.push((k, rate));
                        }
                        let base = tcp
                            .iter()
                            .find(|(c, _)| *c == k)
                            .map_or(f64::NAN, |(_, b)| *b);
                        let s = r.latency.summary();
                        t.push(vec![
                            v.name.into(),
                            k.into(),
                            rate.into(),
                            Ratio::of(rate, base).into(),
                            s.p50_us().into(),
                            s.p99_us().into(),
                            (s.p999_ns as f64 / 1e3).into(),
                            (s.mean_ns / 1e3).into(),
                            user.into(),
                            sys.into(),
                            threads.into(),
                        ]);
                    }
                    Err(e) => ctx.fail(format!("{exp} {} {k} clients", v.name), &e),
                }
                bar.inc(1);
            }
        }
        t.note(plan_note.to_owned());
        for v in &variants {
            t.note(format!("{}: {}", v.name, v.what));
        }
        t.note(format!(
            "busy threads, the 2 pinned workers included: bp 2 + 2 x clients, bpts 3, \
             event 2, bpev 2 + 1 while a connection sleeps, on {n} cpus (more busy threads \
             than cpus time-share cores)",
            n = crate::process_cpus().len()
        ));
        t.note(format!(
            "{} measured per point after a 20 % warm-up; user_pct/sys_pct: CPU time of the whole \
             process (server + clients + polling threads) over the point's wall time, 100 = one \
             core; threads: the process's largest thread count during the point (50 ms \
             samples)",
            secs(dur)
        ));
        if iv.is_some() {
            t.note(
                "rate limit: each client starts at most one call per 1 ms (the paper uses \
                 400 us; tokio's timer resolution is 1 ms)",
            );
        }
        if !skipped_bp.is_empty() {
            t.note(format!(
                "bp skipped at {skipped_bp:?} clients: more than {} spinning threads on {} cpus",
                2 * bp_max_clients(),
                crate::process_cpus().len()
            ));
        }
        t.plot(
            PlotSpec::lines("clients", &["krps"])
                .series("mode")
                .log_x()
                .x_label("clients")
                .y_label("K RPC/s"),
        );
        let panel = if iv.is_none() { "(b)" } else { "(d)" };
        t.also_plot(
            PlotSpec::lines("clients", &["user_pct", "sys_pct"])
                .series("mode")
                .log_x()
                .x_label("clients")
                .y_label("CPU, whole process (% of one core)")
                .caption(&format!(
                    "4 KiB RPCs ({load}): user and system CPU per mode (Fig. 8 {panel})"
                )),
        );
        tables.push(t);
    }
    bar.finish_and_clear();
    tables
}

fn fig8_point(
    ctx: &Ctx<'_>,
    v: &ModeVariant,
    k: usize,
    interval: Option<Duration>,
    dur: Duration,
) -> Result<(Throughput, f64, f64, u64)> {
    let (transport, cfg) = match &v.cfg {
        None => (Transport::TonicTcp, rrpc_config(Transport::TonicTcp)),
        Some(c) => (Transport::RrpcFast, c.clone()),
    };
    // Only the default row: the paper-mode rows' configs do not name the poller they run on.
    let poller = match (&v.cfg, std::env::var_os("RRPC_BENCH_POLLER_STATS")) {
        (Some(c), Some(_)) if v.name == "bpev" => {
            Some(rrpc_tonic::RrpcContext::shared(c).poller_handle()?)
        }
        _ => None,
    };
    let server = start_server_with(ctx.server_rt, transport, cfg)?;
    let cs = ctx.client_rt.block_on(connect_many(&server, k))?;
    let before = poller.as_ref().map(|p| p.stats());
    let sampler = ProcSampler::start(None);
    let c0 = CpuTimes::process()?;
    let w0 = Instant::now();
    let r = ctx
        .client_rt
        .block_on(unary_load(cs, 4096, 4096, interval, dur))?;
    let c1 = CpuTimes::process()?;
    let threads = sampler.finish().threads.into_iter().max().unwrap_or(0);
    let wall = w0.elapsed().as_secs_f64();
    let pct = |a: Duration, b: Duration| 100.0 * b.saturating_sub(a).as_secs_f64() / wall;
    if let (Some(p), Some(b)) = (&poller, before) {
        // RRPC_BENCH_POLLER_STATS: the poller's counters over the point, on stderr.
        eprintln!(
            "{} {k} clients: {} calls, poller {:?}",
            v.name,
            r.ops,
            p.stats().since(&b)
        );
    }
    let out = (r, pct(c0.user, c1.user), pct(c0.system, c1.system), threads);
    drop(server);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Fig. 12: bandwidth against ring size.
// ---------------------------------------------------------------------------------------------

/// Requests in flight on the bandwidth experiments' single stream.
const BW_WINDOW: usize = 16;

fn bw_point(
    ctx: &Ctx<'_>,
    transport: Transport,
    cfg: RrpcConfig,
    req_len: usize,
    dur: Duration,
) -> Result<f64> {
    let server = start_server_with(ctx.server_rt, transport, cfg)?;
    let cs = ctx.client_rt.block_on(connect_many(&server, 1))?;
    let r = ctx
        .client_rt
        .block_on(stream_throughput(cs, req_len, 8, BW_WINDOW, dur))?;
    drop(server);
    Ok(gbps(&r, req_len))
}

/// The tonic-over-TCP baseline of a bandwidth experiment (NaN, and a recorded failure, if it
/// fails).
fn tcp_gbps(ctx: &mut Ctx<'_>, experiment: &str, req_len: usize, dur: Duration) -> f64 {
    match bw_point(
        ctx,
        Transport::TonicTcp,
        rrpc_config(Transport::TonicTcp),
        req_len,
        dur,
    ) {
        Ok(g) => g,
        Err(e) => {
            ctx.fail(format!("{experiment} {} KiB tonic-tcp", req_len >> 10), &e);
            f64::NAN
        }
    }
}

/// Fig. 12: one client streaming 8 KiB and 128 KiB requests (8 B responses) through rrpc's fast
/// path with fixed ring sizes from 32 KiB to 4 MiB, and with self-sizing rings (64 KiB to
/// 4 MiB, rrpc-tonic's default) beside them, against tonic over TCP with the same RPCs.
pub(super) fn fig12(ctx: &mut Ctx<'_>, plan_note: &str) -> Table {
    let args = ctx.args;
    let rings_kib: Vec<usize> = args.pick(vec![32, 4096], vec![32, 64, 128, 256, 512, 1024, 4096]);
    let sizes_kib = [8usize, 128];
    let dur = args.duration(Duration::from_millis(300), Duration::from_secs(2));
    let bar = args.progress(
        (sizes_kib.len() * (rings_kib.len() + 1)) as u64,
        "rpc fig12",
    );
    let mut t = Table::new(
        "ring_size_bandwidth",
        "Bandwidth against ring size, one client streaming 8 KiB and 128 KiB requests \
         (Fig. 12)",
        &[
            "rpc",
            "ring_kib",
            "gbps",
            "tcp_gbps",
            "x_vs_tcp",
            "x_vs_best_fixed",
        ],
    );
    for &size in &sizes_kib {
        let req = size << 10;
        bar.set_message(format!("{size} KiB tonic-tcp"));
        let tcp = tcp_gbps(ctx, "ring_size_bandwidth", req, dur);
        bar.inc(1);
        let mut best = f64::NAN;
        for ring in rings_kib.iter().map(|&r| Some(r)).chain([None]) {
            // `None`: self-sizing, from rrpc-tonic's 64 KiB up to 4 MiB.
            let (label, max) = match ring {
                Some(r) => (format!("{size} KiB"), r),
                None => (format!("{size} KiB self-sizing"), 4096),
            };
            bar.set_message(format!("{label} ring {max} KiB"));
            let mut b = RrpcConfig::builder().ring_size(max << 10);
            if let Some(r) = ring {
                b = b.min_ring_size(r << 10);
            }
            let point = b.build().map_err(anyhow::Error::from).and_then(|cfg| {
                bw_point(
                    ctx,
                    Transport::RrpcFast,
                    with_path(cfg, Transport::RrpcFast),
                    req,
                    dur,
                )
            });
            match point {
                Ok(g) => {
                    let vs_best = match ring {
                        Some(_) => {
                            best = if best.is_nan() { g } else { best.max(g) };
                            Value::Empty
                        }
                        None => Ratio::of(g, best).into(),
                    };
                    t.push(vec![
                        label.into(),
                        max.into(),
                        g.into(),
                        tcp.into(),
                        Ratio::of(g, tcp).into(),
                        vs_best,
                    ])
                }
                Err(e) => ctx.fail(format!("ring_size_bandwidth {label} ring {max} KiB"), &e),
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    t.note(plan_note.to_owned());
    t.note(format!(
        "one connection, one bidi stream with {BW_WINDOW} requests in flight, 8 B responses; \
         gbps counts request payload bits; {} per point after a 20 % warm-up; rrpc fast path \
         with every other knob at its default (messages larger than the ring are split into \
         ring-sized chunks); fixed rings set min_ring_size = ring_size; the self-sizing rows \
         (ring_kib: their largest size) grow from 64 KiB as the messages ask, and \
         x_vs_best_fixed compares them with the best fixed ring of this run; tcp_gbps: tonic \
         over TCP loopback with the same RPCs in this run",
        secs(dur)
    ));
    t.plot(
        PlotSpec::lines("ring_kib", &["gbps"])
            .series("rpc")
            .log_x()
            .x_label("ring size (KiB)")
            .y_label("Gb/s"),
    );
    t
}

// ---------------------------------------------------------------------------------------------
// Fig. 14: zero-copy on and off.
// ---------------------------------------------------------------------------------------------

/// Fig. 14: one client streaming 64–256 KiB requests with rrpc's zero-copy send on and off.
pub(super) fn fig14(ctx: &mut Ctx<'_>, plan_note: &str) -> Table {
    let args = ctx.args;
    let sizes_kib: Vec<usize> = args.pick(vec![64], vec![64, 128, 256]);
    let dur = args.duration(Duration::from_millis(300), Duration::from_secs(2));
    let bar = args.progress((sizes_kib.len() * 3) as u64, "rpc fig14");
    let mut t = Table::new(
        "zero_copy_bandwidth",
        "Bandwidth with zero-copy off and on, one client (Fig. 14)",
        &[
            "payload_kib",
            "zero_copy",
            "gbps",
            "x_vs_copy",
            "tcp_gbps",
            "x_vs_tcp",
        ],
    );
    for &size in &sizes_kib {
        let req = size << 10;
        bar.set_message(format!("{size} KiB tonic-tcp"));
        let tcp = tcp_gbps(ctx, "zero_copy_bandwidth", req, dur);
        bar.inc(1);
        let mut off = f64::NAN;
        for zc in [false, true] {
            let name = if zc { "on" } else { "off" };
            bar.set_message(format!("{size} KiB zero-copy {name}"));
            let cfg = with_path(
                RrpcConfig::builder()
                    .zero_copy(zc)
                    .build()
                    .expect("a valid config"),
                Transport::RrpcFast,
            );
            match bw_point(ctx, Transport::RrpcFast, cfg, req, dur) {
                Ok(g) => {
                    if !zc {
                        off = g;
                    }
                    t.push(vec![
                        size.into(),
                        name.into(),
                        g.into(),
                        Ratio::of(g, off).into(),
                        tcp.into(),
                        Ratio::of(g, tcp).into(),
                    ]);
                }
                Err(e) => ctx.fail(format!("zero_copy_bandwidth {size} KiB {name}"), &e),
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    t.note(plan_note.to_owned());
    t.note(format!(
        "one connection, one bidi stream with {BW_WINDOW} requests in flight, 8 B responses, \
         rrpc fast path, 4 MiB rings; zero_copy off encodes each frame into an intermediate \
         buffer and copies it into the ring (`RrpcConfig::zero_copy(false)`); {} per point \
         after a 20 % warm-up; x_vs_copy: this row / the zero-copy-off row",
        secs(dur)
    ));
    t.plot(
        PlotSpec::lines("payload_kib", &["gbps"])
            .series("zero_copy")
            .log_x()
            .x_label("payload (KiB)")
            .y_label("Gb/s"),
    );
    t
}

// ---------------------------------------------------------------------------------------------
// Figs. 15–16: CPU and memory per side.
// ---------------------------------------------------------------------------------------------

/// Samples, every 50 ms until stopped: this process's RSS and thread count, and the RSS of
/// another process (the child server), if any.
struct ProcSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Samples>,
}

#[derive(Debug, Default)]
struct Samples {
    rss: Vec<u64>,
    other_rss: Vec<u64>,
    threads: Vec<u64>,
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

impl ProcSampler {
    fn start(other: Option<u32>) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut out = Samples::default();
            loop {
                if let Ok(r) = rss_bytes(None) {
                    out.rss.push(r);
                }
                if let Some(Ok(r)) = other.map(|p| rss_bytes(Some(p))) {
                    out.other_rss.push(r);
                }
                if let Ok(t) = thread_count(None) {
                    // Not counting the sampler itself.
                    out.threads.push(t.saturating_sub(1));
                }
                if s.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            out
        });
        ProcSampler { stop, handle }
    }

    fn finish(self) -> Samples {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// One point of Figs. 15–16.
struct SidePoint {
    krps: f64,
    server_cpu: f64,
    client_cpu: f64,
    server_rss: u64,
    client_rss: u64,
    server_delta: u64,
    client_delta: u64,
}

fn side_point(
    ctx: &Ctx<'_>,
    server: &ChildServer,
    k: usize,
    heavy: bool,
    dur: Duration,
) -> Result<SidePoint> {
    let pid = server.pid();
    let (client0, server0) = (rss_bytes(None)?, rss_bytes(Some(pid))?);
    let cfg = rrpc_config(server.transport);
    let cs = ctx.client_rt.block_on(async {
        let mut v = Vec::with_capacity(k);
        for _ in 0..k {
            v.push(connect_to(server.transport, &server.target, &cfg).await?);
        }
        Ok::<_, anyhow::Error>(v)
    })?;
    let sampler = ProcSampler::start(Some(pid));
    let (cc0, sc0) = (CpuTimes::process()?, CpuTimes::of_pid(pid)?);
    let w0 = Instant::now();
    let r = if heavy {
        ctx.client_rt
            .block_on(stream_throughput(cs, 32, 8, 32, dur))?
    } else {
        ctx.client_rt
            .block_on(unary_load(cs, 32, 8, Some(Duration::from_millis(1)), dur))?
    };
    let wall = w0.elapsed();
    let (cc1, sc1) = (CpuTimes::process()?, CpuTimes::of_pid(pid)?);
    let mut samples = sampler.finish();
    let (client_rss, server_rss) = (median(&mut samples.rss), median(&mut samples.other_rss));
    Ok(SidePoint {
        krps: krps(&r),
        server_cpu: sc1.percent_since(&sc0, wall),
        client_cpu: cc1.percent_since(&cc0, wall),
        server_rss,
        client_rss,
        server_delta: server_rss.saturating_sub(server0),
        client_delta: client_rss.saturating_sub(client0),
    })
}

/// Figs. 15 (heavy load) and 16 (low load): the server in its own process, CPU and memory of
/// each side read from `/proc`.
pub(super) fn fig15_16(ctx: &mut Ctx<'_>, pinning: &str) -> Vec<Table> {
    let args = ctx.args;
    let clients: Vec<usize> = args.pick(vec![1, 4], vec![1, 2, 4, 8, 16, 32, 64, 128]);
    let dur = args.duration(Duration::from_millis(300), Duration::from_secs(2));
    let bar = args.progress(
        (Transport::ALL.len() * clients.len() * 2) as u64,
        "rpc fig15-16",
    );
    let cols = [
        "transport",
        "clients",
        "krps",
        "server_cpu_pct",
        "client_cpu_pct",
        "total_cpu_pct",
        "cpu_x_vs_tcp",
        "server_rss_mib",
        "client_rss_mib",
        "server_mib_per_client",
        "client_mib_per_client",
    ];
    let mut heavy_t = Table::new(
        "resources_heavy",
        "CPU and memory per side under heavy load: 32 B / 8 B streaming, 32 in flight per \
         client (Fig. 15)",
        &cols,
    );
    let mut low_t = Table::new(
        "resources_low",
        "CPU and memory per side under low load: one 32 B / 8 B call per client per 1 ms \
         (Fig. 16)",
        &cols,
    );
    let mut tcp_cpu: Vec<(bool, usize, f64)> = Vec::new();
    for t in Transport::ALL {
        bar.set_message(format!("{} server process", t.name()));
        let server = match ChildServer::spawn(t, Some(ctx.server_cpu)) {
            Ok(s) => s,
            Err(e) => {
                ctx.fail(format!("resources {} server process", t.name()), &e);
                bar.inc((clients.len() * 2) as u64);
                continue;
            }
        };
        for heavy in [true, false] {
            if !ctx.want(if heavy {
                "resources_heavy"
            } else {
                "resources_low"
            }) {
                bar.inc(clients.len() as u64);
                continue;
            }
            for &k in &clients {
                bar.set_message(format!(
                    "{} {} {k} clients",
                    t.name(),
                    if heavy { "heavy" } else { "low" }
                ));
                match side_point(ctx, &server, k, heavy, dur) {
                    Ok(p) => {
                        let total = p.server_cpu + p.client_cpu;
                        if t == Transport::TonicTcp {
                            tcp_cpu.push((heavy, k, total));
                        }
                        let base = tcp_cpu
                            .iter()
                            .find(|(h, c, _)| *h == heavy && *c == k)
                            .map_or(f64::NAN, |(_, _, v)| *v);
                        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
                        let row: Vec<Value> = vec![
                            t.name().into(),
                            k.into(),
                            p.krps.into(),
                            p.server_cpu.into(),
                            p.client_cpu.into(),
                            total.into(),
                            Ratio::of(total, base).into(),
                            mib(p.server_rss).into(),
                            mib(p.client_rss).into(),
                            (mib(p.server_delta) / k as f64).into(),
                            (mib(p.client_delta) / k as f64).into(),
                        ];
                        if heavy {
                            heavy_t.push(row);
                        } else {
                            low_t.push(row);
                        }
                    }
                    Err(e) => ctx.fail(
                        format!(
                            "resources_{} {} {k} clients",
                            if heavy { "heavy" } else { "low" },
                            t.name()
                        ),
                        &e,
                    ),
                }
                bar.inc(1);
            }
        }
        drop(server);
    }
    bar.finish_and_clear();
    for (tbl, heavy) in [(&mut heavy_t, true), (&mut low_t, false)] {
        tbl.note(pinning.to_owned());
        tbl.note(format!(
            "server in its own process (this binary with `--role serve`), clients in the suite's \
             process; each side's CPU from /proc/<pid>/stat (utime+stime over the point's wall \
             time incl. a 20 % warm-up, 100 = one core) and RSS from /proc/<pid>/status \
             (median of 50 ms samples); *_mib_per_client: (median RSS during the point - RSS \
             before the clients connected) / clients; {} per point",
            secs(dur)
        ));
        tbl.note(
            "rrpc rows use rrpc-tonic's defaults on both sides: 4 MiB rings each way, BPEV \
             with 1 polling thread per process and a 50 us fixed spin before a reader sleeps",
        );
        if !heavy {
            tbl.note(
                "rate limit: each client starts at most one call per 1 ms (tokio's timer \
                 resolution)",
            );
        }
        tbl.plot(
            PlotSpec::lines("clients", &["total_cpu_pct"])
                .series("transport")
                .log_x()
                .x_label("clients")
                .y_label("CPU, both sides (% of one core)"),
        );
        let fig = if heavy { "Fig. 15 (b)" } else { "Fig. 16 (b)" };
        tbl.also_plot(
            PlotSpec::lines("clients", &["server_rss_mib", "client_rss_mib"])
                .series("transport")
                .log_x()
                .x_label("clients")
                .y_label("RSS (MiB, median)")
                .caption(&format!(
                    "Memory per side, {} load ({fig})",
                    if heavy { "heavy" } else { "low" }
                )),
        );
    }
    vec![heavy_t, low_t]
}
