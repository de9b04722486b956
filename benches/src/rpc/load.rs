//! Connection management off the quiet, busy path: low steady load, CPU contention, and idle
//! connections. Each compares tonic over TCP and over a Unix socket with rrpc in each poller
//! variant ([`POLLER_VARIANTS`]) in one run.
//!
//! - `low_load`: 1, 8 and 64 clients each making one 32 B call per 1 ms and per 10 ms; CPU of
//!   both processes (the server in its own), calls delivered, p50 and p99. The environment
//!   variable `RRPC_BENCH_LOW_LOAD_ROWS` (row names, comma-separated, e.g.
//!   `rrpc-shm-h2/bpev,rrpc-shm-fast/bpev`) keeps only those rows and tonic-tcp's, the
//!   baseline: a quicker A/B of one path.
//! - `contention` (and `contention_pingpong`): ping-pong and 1- to 32-client streaming
//!   throughput while a busy loop runs on every core (one `--role hog` process per core,
//!   normal priority, started and stopped here).
//! - `idle_connections`: CPU of both processes with 16, 64 and 256 connected, idle clients.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::figs::Ctx;
use super::{
    AnyClient, BaseByClients, ChildServer, POLLER_VARIANTS, Transport, connect_to, pingpong,
    poller_variant, start_server_with, stream_throughput, unary_load, with_path,
};
use crate::cpu::CpuTimes;
use crate::{PlotSpec, Ratio, Table, Value};

/// One row label: a transport and, for rrpc, a poller variant.
#[derive(Debug, Clone, Copy)]
struct Variant {
    transport: Transport,
    poller: Option<&'static str>,
}

impl Variant {
    fn name(self) -> String {
        match self.poller {
            Some(p) => format!("{}/{p}", self.transport.name()),
            None => self.transport.name().to_owned(),
        }
    }

    fn config(self) -> rrpc_tonic::RrpcConfig {
        let mut cfg = rrpc_tonic::RrpcConfig::default();
        if let Some(pc) = self.poller.and_then(poller_variant) {
            cfg = cfg.to_builder().poller(pc).build().expect("a valid config");
        }
        with_path(cfg, self.transport)
    }

    fn env(self) -> Vec<(&'static str, &'static str)> {
        self.poller
            .map(|p| vec![("RRPC_BENCH_POLLER", p)])
            .unwrap_or_default()
    }
}

/// tonic-TCP, tonic-UDS, the poller variants `with` on the fast path, and `h2` on HTTP/2.
fn variants(with: &[&str], h2: &[&'static str]) -> Vec<Variant> {
    let mut v = vec![
        Variant {
            transport: Transport::TonicTcp,
            poller: None,
        },
        Variant {
            transport: Transport::TonicUds,
            poller: None,
        },
    ];
    for (p, _) in POLLER_VARIANTS.iter().filter(|(p, _)| with.contains(p)) {
        v.push(Variant {
            transport: Transport::RrpcFast,
            poller: Some(p),
        });
    }
    for p in h2 {
        v.push(Variant {
            transport: Transport::RrpcH2,
            poller: Some(p),
        });
    }
    v
}

fn variants_note(v: &[Variant]) -> String {
    let described: Vec<String> = POLLER_VARIANTS
        .iter()
        .filter(|(p, _)| v.iter().any(|x| x.poller == Some(p)))
        .map(|(p, what)| format!("{p}: {what}"))
        .collect();
    format!(
        "rrpc rows are `<transport>/<poller variant>`, both processes configured alike \
         (rrpc-tonic's defaults otherwise: 1 polling thread per process, 50 us fixed spin): {}",
        described.join("; ")
    )
}

/// BP starts one polling thread per connection end; beyond this many clients a 2-core host is
/// all spinning threads (the paper's own BP collapse).
fn bp_ok(v: Variant, clients: usize) -> bool {
    v.poller != Some("bp") || clients <= 8 * crate::process_cpus().len()
}

/// Connects `k` clients of `v` to `server` on the client runtime.
fn connect_k(ctx: &Ctx<'_>, v: Variant, server: &ChildServer, k: usize) -> Result<Vec<AnyClient>> {
    let cfg = v.config();
    ctx.client_rt.block_on(async {
        let mut out = Vec::with_capacity(k);
        for _ in 0..k {
            out.push(connect_to(v.transport, &server.target, &cfg).await?);
        }
        Ok(out)
    })
}

/// One `low_load` point: (calls/s, server CPU %, client CPU %, p50 us, p99 us).
fn low_point(
    ctx: &Ctx<'_>,
    v: Variant,
    server: &ChildServer,
    k: usize,
    period: Duration,
    dur: Duration,
) -> Result<(f64, f64, f64, f64, f64)> {
    let cs = connect_k(ctx, v, server, k)?;
    // RRPC_BENCH_POLLER_STATS: the client process's poller counters over the point, on stderr.
    let poller = match (v.poller, std::env::var_os("RRPC_BENCH_POLLER_STATS")) {
        (Some(_), Some(_)) => Some(rrpc_tonic::RrpcContext::shared(&v.config()).poller_handle()?),
        _ => None,
    };
    let before = poller.as_ref().map(|p| p.stats());
    let pid = server.pid();
    let (c0, s0) = (CpuTimes::process()?, CpuTimes::of_pid(pid)?);
    let w0 = Instant::now();
    let r = ctx
        .client_rt
        .block_on(unary_load(cs, 32, 8, Some(period), dur))?;
    let wall = w0.elapsed();
    let (c1, s1) = (CpuTimes::process()?, CpuTimes::of_pid(pid)?);
    if let (Some(p), Some(b)) = (&poller, before) {
        eprintln!(
            "low_load {} {k} clients, period {period:?}: {} calls, client poller {:?}",
            v.name(),
            r.ops,
            p.stats().since(&b)
        );
    }
    let s = r.latency.summary();
    Ok((
        r.ops as f64 / r.elapsed.as_secs_f64(),
        s1.percent_since(&s0, wall),
        c1.percent_since(&c0, wall),
        s.p50_us(),
        s.p99_us(),
    ))
}

/// `low_load`.
pub(super) fn low_load(ctx: &mut Ctx<'_>, pinning: &str) -> Table {
    let args = ctx.args;
    let clients: Vec<usize> = args.pick(vec![1, 8], vec![1, 8, 64]);
    let periods: Vec<Duration> = args.pick(
        vec![Duration::from_millis(1)],
        vec![Duration::from_millis(1), Duration::from_millis(10)],
    );
    let dur = args.duration(Duration::from_millis(400), Duration::from_secs(3));
    let mut vs = variants(&["bpev", "bpev-plain", "bpts", "event", "bp"], &["bpev"]);
    if let Ok(rows) = std::env::var("RRPC_BENCH_LOW_LOAD_ROWS") {
        let keep: Vec<&str> = rows.split(',').map(str::trim).collect();
        vs.retain(|v| v.transport == Transport::TonicTcp || keep.contains(&v.name().as_str()));
    }
    let mut t = Table::new(
        "low_load",
        "Low, steady load: each client makes one 32 B / 8 B unary call per period; CPU of both \
         processes, calls delivered, latency",
        &[
            "transport",
            "clients",
            "period_ms",
            "calls_per_s",
            "calls_x_vs_tcp",
            "server_cpu_pct",
            "client_cpu_pct",
            "total_cpu_pct",
            "cpu_x_vs_tcp",
            "p50_us",
            "p99_us",
            "p50_x_vs_uds",
        ],
    );
    let bar = args.progress(
        (vs.len() * clients.len() * periods.len()) as u64,
        "low_load",
    );
    // (clients, period) -> (tcp calls, tcp cpu, uds p50)
    let mut base: Vec<(usize, Duration, f64, f64, f64)> = Vec::new();
    for v in &vs {
        bar.set_message(format!("{} server process", v.name()));
        let server = match ChildServer::spawn_with(v.transport, Some(ctx.server_cpu), &v.env()) {
            Ok(s) => s,
            Err(e) => {
                ctx.fail(format!("low_load {} server process", v.name()), &e);
                bar.inc((clients.len() * periods.len()) as u64);
                continue;
            }
        };
        for &period in &periods {
            for &k in &clients {
                bar.inc(1);
                if !bp_ok(*v, k) {
                    continue;
                }
                bar.set_message(format!("{} {k} clients", v.name()));
                match low_point(ctx, *v, &server, k, period, dur) {
                    Ok((calls, scpu, ccpu, p50, p99)) => {
                        let total = scpu + ccpu;
                        let b = base.iter_mut().find(|b| b.0 == k && b.1 == period);
                        let b = match b {
                            Some(b) => b,
                            None => {
                                base.push((k, period, f64::NAN, f64::NAN, f64::NAN));
                                base.last_mut().expect("just pushed")
                            }
                        };
                        match v.transport {
                            Transport::TonicTcp => (b.2, b.3) = (calls, total),
                            Transport::TonicUds => b.4 = p50,
                            _ => {}
                        }
                        t.push(vec![
                            Value::from(v.name()),
                            k.into(),
                            (period.as_secs_f64() * 1e3).into(),
                            calls.into(),
                            Ratio::of(calls, b.2).into(),
                            scpu.into(),
                            ccpu.into(),
                            total.into(),
                            Ratio::of(total, b.3).into(),
                            p50.into(),
                            p99.into(),
                            Ratio::of(p50, b.4).into(),
                        ]);
                    }
                    Err(e) => ctx.fail(format!("low_load {} {k} clients", v.name()), &e),
                }
            }
        }
        drop(server);
    }
    bar.finish_and_clear();
    t.note(pinning.to_owned());
    t.note(variants_note(&vs));
    t.note(format!(
        "server in its own process, clients in the suite's; CPU from /proc/<pid>/stat over the \
         point's wall time incl. a 20 % warm-up (100 = one core); {} measured per point; the \
         period is a floor (tokio's 1 ms timer); bp rows stop at {} clients",
        super::figs::secs(dur),
        8 * crate::process_cpus().len()
    ));
    t.note(
        "targets (connection-management issue): total_cpu_pct at most tonic-tcp's \
         (cpu_x_vs_tcp <= 1), calls_x_vs_tcp >= 1, p50_x_vs_uds <= 1",
    );
    t.plot(
        PlotSpec::lines("clients", &["total_cpu_pct"])
            .series("transport")
            .log_x()
            .x_label("clients (1 call per period each)")
            .y_label("CPU, both processes (% of one core)"),
    );
    t
}

/// The busy loops of the contention experiment: one child process per CPU this process may
/// run on, each pinned there, at normal priority; stopped on drop.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start() -> Result<Self> {
        let exe = std::env::current_exe()?;
        let mut v = Vec::new();
        for cpu in crate::process_cpus() {
            let child = std::process::Command::new(&exe)
                .args(["--role", "hog", "--cpu", &cpu.to_string()])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .context("spawning a CPU hog")?;
            v.push(child);
        }
        // Let them reach their cores.
        std::thread::sleep(Duration::from_millis(100));
        Ok(Hogs(v))
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `--role hog` process: spins on `cpu` (if given) until its standard input closes or it
/// is killed.
///
/// # Errors
/// None in practice (pinning failures are ignored).
pub fn hog(cpu: Option<usize>) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    if let Some(c) = cpu {
        let _ = crate::pin_current_thread(c);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut buf = [0u8; 16];
        while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
        s.store(true, Ordering::Relaxed);
    });
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
    Ok(())
}

/// `contention`: (ping-pong table, throughput table).
pub(super) fn contention(ctx: &mut Ctx<'_>, pinning: &str) -> Vec<Table> {
    let args = ctx.args;
    let dur = args.duration(Duration::from_millis(400), Duration::from_secs(3));
    let (warm, n) = args.pick((100u64, 1_000u64), (1_000, 20_000));
    let clients: Vec<usize> = args.pick(vec![1, 8], vec![1, 2, 8, 32]);
    let vs = variants(&["bpev", "bpev-plain", "event"], &["bpev", "bpev-plain"]);
    let mut ping = Table::new(
        "contention_pingpong",
        "Under CPU contention (a busy loop on every core): ping-pong latency, 64 B / 8 B",
        &["transport", "p50_us", "p99_us", "p50_x_vs_tcp"],
    );
    let mut thr = Table::new(
        "contention",
        "Under CPU contention (a busy loop on every core): 32 B / 8 B streaming throughput",
        &[
            "transport",
            "clients",
            "krps",
            "x_vs_tcp",
            "p50_us",
            "p99_us",
        ],
    );
    let bar = args.progress(vs.len() as u64, "contention");
    let mut tcp_p50 = f64::NAN;
    let mut tcp_krps = BaseByClients::default();
    let hogs = match Hogs::start() {
        Ok(h) => h,
        Err(e) => {
            ctx.fail("contention: starting the hogs".into(), &e);
            return vec![ping, thr];
        }
    };
    for v in &vs {
        bar.set_message(v.name());
        let res = (|| -> Result<()> {
            let server = start_server_with(ctx.server_rt, v.transport, v.config())?;
            let mut c = ctx.client_rt.block_on(super::connect(&server))?;
            let l = ctx
                .client_rt
                .block_on(async move {
                    tokio::spawn(async move { pingpong(&mut c, 64, 8, warm, n).await }).await?
                })?
                .summary();
            if v.transport == Transport::TonicTcp {
                tcp_p50 = l.p50_us();
            }
            ping.push(vec![
                v.name().into(),
                l.p50_us().into(),
                l.p99_us().into(),
                Ratio::of(l.p50_us(), tcp_p50).into(),
            ]);
            for &k in &clients {
                let cs = ctx.client_rt.block_on(super::connect_many(&server, k))?;
                let r = ctx
                    .client_rt
                    .block_on(stream_throughput(cs, 32, 8, 32, dur))?;
                thr.push(tcp_krps.throughput_row(
                    &v.name(),
                    v.transport == Transport::TonicTcp,
                    k,
                    &r,
                ));
            }
            Ok(())
        })();
        if let Err(e) = res {
            ctx.fail(format!("contention {}", v.name()), &e);
        }
        bar.inc(1);
    }
    drop(hogs);
    bar.finish_and_clear();
    for t in [&mut ping, &mut thr] {
        t.note(pinning.to_owned());
        t.note(format!(
            "{} hog processes (one busy loop pinned to each CPU of this process, normal \
             priority) run through every row; server and clients in this process; ping-pong: \
             {n} calls after {warm}; throughput: one stream per client, 32 in flight, {} per \
             point",
            crate::process_cpus().len(),
            super::figs::secs(dur)
        ));
        t.note(variants_note(&vs));
        t.note(
            "target (connection-management issue): rrpc keeps at least tonic-tcp's throughput \
             and p50 (x_vs_tcp >= 1 for throughput, <= 1 for p50). The hogs make this noisy: \
             compare rows of one run only",
        );
    }
    thr.plot(
        PlotSpec::lines("clients", &["krps"])
            .series("transport")
            .log_x()
            .x_label("clients (a busy loop on every core)")
            .y_label("K RPC/s"),
    );
    vec![ping, thr]
}

/// `idle_connections`.
pub(super) fn idle_connections(ctx: &mut Ctx<'_>, pinning: &str) -> Table {
    let args = ctx.args;
    let counts: Vec<usize> = args.pick(vec![256], vec![16, 64, 256]);
    let dur = args.duration(Duration::from_secs(1), Duration::from_secs(5));
    let vs = variants(&["bpev", "bpev-plain", "event"], &["bpev", "event"]);
    let mut t = Table::new(
        "idle_connections",
        "Connected, idle clients (up to 256): CPU of both processes",
        &[
            "transport",
            "connections",
            "server_cpu_pct",
            "client_cpu_pct",
            "total_cpu_pct",
        ],
    );
    let bar = args.progress((vs.len() * counts.len()) as u64, "idle_connections");
    for v in &vs {
        for &k in &counts {
            bar.set_message(format!("{} {k}", v.name()));
            let res = (|| -> Result<(f64, f64)> {
                let server = ChildServer::spawn_with(v.transport, Some(ctx.server_cpu), &v.env())?;
                let mut cs = connect_k(ctx, *v, &server, k)?;
                // One call each, so every connection is set up end to end, then let them idle.
                ctx.client_rt.block_on(async {
                    for c in &mut cs {
                        c.unary(super::pb::Req {
                            payload: vec![1; 32],
                            resp_len: 8,
                        })
                        .await?;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, anyhow::Error>(())
                })?;
                let pid = server.pid();
                let (c0, s0) = (CpuTimes::process()?, CpuTimes::of_pid(pid)?);
                let w0 = Instant::now();
                ctx.client_rt
                    .block_on(async { tokio::time::sleep(dur).await });
                let wall = w0.elapsed();
                let (c1, s1) = (CpuTimes::process()?, CpuTimes::of_pid(pid)?);
                drop(cs);
                Ok((s1.percent_since(&s0, wall), c1.percent_since(&c0, wall)))
            })();
            match res {
                Ok((s, c)) => t.push(vec![
                    v.name().into(),
                    k.into(),
                    s.into(),
                    c.into(),
                    (s + c).into(),
                ]),
                Err(e) => ctx.fail(format!("idle_connections {} {k}", v.name()), &e),
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    t.note(pinning.to_owned());
    t.note(variants_note(&vs));
    t.plot(
        PlotSpec::lines("connections", &["total_cpu_pct"])
            .series("transport")
            .log_x()
            .x_label("idle connections")
            .y_label("CPU, both processes (% of one core)"),
    );
    t.note(format!(
        "server in its own process; one call per connection, 200 ms to settle, then CPU over \
         {} of idleness (the client process's figure includes the suite's own idle runtime; /proc CPU times tick at 10 ms, so one tick is 1 % of a 1 s window); \
         target: under 1 % of a core",
        super::figs::secs(dur)
    ));
    t
}
