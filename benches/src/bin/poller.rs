//! `cargo xtask bench poller`: connection management modes (RR-Compound Figs. 4–6, 8, 11, 13,
//! 16) over real shm rings.
//!
//! Server: a tokio runtime with one worker thread and the poller under test (each connection
//! has a task: `recv` → echo 8 bytes → `flush`). Clients: one load-generator thread that drives
//! every connection's raw rings by busy polling (the paper's clients run on other nodes; here
//! they share the 2 cores, which the thread plan printed with every table says).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use rrpc_bench::{
    CpuTimes, Latency, PlotSpec, Report, SuiteArgs, Table, ThreadPlan, Value, pin_current_thread,
};
use rrpc_core::Completion;
use rrpc_poller::rings::AsyncConn;
use rrpc_poller::{Mode, Poller, PollerConfig};
use rrpc_ringbuf::{RingConfig, RingRx, RingTx};

/// A configuration under test: a paper mode, or adaptive BPEV (this crate's defaults).
#[derive(Clone, Copy)]
struct Variant {
    mode: Mode,
    adaptive: bool,
}

impl Variant {
    fn name(&self) -> String {
        if self.adaptive {
            format!("{}-adaptive", self.mode)
        } else {
            self.mode.to_string()
        }
    }
    fn config(&self, polling_threads: usize) -> PollerConfig {
        let base = if self.adaptive {
            PollerConfig::builder().mode(self.mode)
        } else {
            PollerConfig::paper(self.mode).to_builder()
        };
        base.polling_threads(polling_threads)
            .build()
            .expect("valid")
    }
}

const VARIANTS: [Variant; 5] = [
    Variant {
        mode: Mode::Bp,
        adaptive: false,
    },
    Variant {
        mode: Mode::Bpts,
        adaptive: false,
    },
    Variant {
        mode: Mode::Event,
        adaptive: false,
    },
    Variant {
        mode: Mode::Bpev,
        adaptive: false,
    },
    Variant {
        mode: Mode::Bpev,
        adaptive: true,
    },
];

struct Client {
    conn: Arc<rrpc_core::conn::Connection>,
    tx: RingTx,
    rx: RingRx,
    sent_at: Option<Instant>,
    next_send: Instant,
}

struct Setup {
    rt: tokio::runtime::Runtime,
    poller: Poller,
    clients: Vec<Client>,
    stop: Arc<AtomicBool>,
}

fn ring(mode: Mode) -> RingConfig {
    RingConfig::builder()
        .ring_size(64 * 1024)
        .tail_with_imm(mode == Mode::Event)
        .huge_pages(false)
        .build()
        .expect("ring config")
}

/// CPU of the server side (tokio worker and polling threads) and of the client load generator.
fn server_cpu() -> usize {
    ThreadPlan::cpu(0)
}
fn client_cpu() -> usize {
    ThreadPlan::cpu(1)
}

/// Builds `conns` connections; the server halves get echo tasks on a 1-worker runtime.
///
/// Pinning: the calling thread pins itself to the server CPU first, so every thread created
/// here (the tokio worker, the polling threads, BP's per-connection threads) inherits that
/// affinity; it then moves itself to the client CPU to run the load generator. The server
/// thus has one core, the client the other, as when the paper's clients run on other nodes.
fn setup(cfg: PollerConfig, mode: Mode, conns: usize) -> Result<Setup> {
    pin_current_thread(server_cpu())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let poller = rt.block_on(async { rrpc_poller::Poller::start(cfg) })?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..conns {
        let (client, server) = AsyncConn::loopback_pair(&poller, &ring(mode))?;
        let (conn, tx, rx) = client.into_parts();
        clients.push(Client {
            conn,
            tx,
            rx,
            sent_at: None,
            next_send: Instant::now(),
        });
        let _g = rt.enter();
        let (mut stx, mut srx) = server.split()?;
        rt.spawn(async move {
            loop {
                let mut buf = [0u8; 8];
                match srx.recv().await {
                    Ok(m) => buf.copy_from_slice(&m[..8]),
                    Err(_) => return,
                }
                if stx.send(&buf).await.is_err() || stx.flush().is_err() {
                    return;
                }
            }
        });
    }
    pin_current_thread(client_cpu())?;
    Ok(Setup {
        rt,
        poller,
        clients,
        stop,
    })
}

/// Reposts receives for tails that arrived with immediate data (Event mode clients).
fn replenish(c: &Client) {
    let qp = c.conn.qp();
    let mut wc = [Completion::EMPTY; 32];
    while let Ok(n) = qp.recv_cq().poll(&mut wc) {
        for _ in 0..n {
            let _ = qp.post_recv(0);
        }
        if n < wc.len() {
            break;
        }
    }
}

struct LoadResult {
    lat: Latency,
    msgs: u64,
    wall: Duration,
    cpu: CpuTimes,
}

/// Runs the client loop for `dur`: each connection has at most one request outstanding and
/// sends the next one `interval` after the previous reply (0 = continuous).
fn load(s: &mut Setup, interval: Duration, dur: Duration) -> LoadResult {
    let mut lat = Latency::new();
    let mut msgs = 0u64;
    // Warm-up: one round trip per connection before measuring.
    let warm_until = Instant::now() + Duration::from_millis(20);
    let mut cpu0 = CpuTimes::process().unwrap_or_default();
    let mut start = Instant::now();
    let mut warm = true;
    let mut end = Instant::now() + dur + Duration::from_millis(20);
    let mut i = 0usize;
    loop {
        let now = Instant::now();
        if warm && now >= warm_until {
            warm = false;
            lat = Latency::new();
            msgs = 0;
            cpu0 = CpuTimes::process().unwrap_or_default();
            start = now;
            end = now + dur;
        }
        if !warm && now >= end {
            break;
        }
        let nclients = s.clients.len();
        let c = &mut s.clients[i];
        i = (i + 1) % nclients;
        match c.sent_at {
            None if now >= c.next_send
                && c.tx.try_send(&[0u8; 8]).is_ok()
                && c.tx.flush().is_ok() =>
            {
                c.sent_at = Some(now);
            }
            None => {}
            Some(t0) => {
                let got = c.rx.try_recv().is_ok();
                if got {
                    let t = Instant::now();
                    lat.record(t - t0);
                    msgs += 1;
                    c.sent_at = None;
                    c.next_send = t + interval;
                    let _ = c.rx.flush();
                    replenish(c);
                }
            }
        }
    }
    let wall = start.elapsed();
    let cpu1 = CpuTimes::process().unwrap_or_default();
    // Drain outstanding replies so the next run starts clean.
    let deadline = Instant::now() + Duration::from_millis(200);
    for c in &mut s.clients {
        while c.sent_at.is_some() && Instant::now() < deadline {
            let got = c.rx.try_recv().is_ok();
            if got {
                c.sent_at = None;
                let _ = c.rx.flush();
                replenish(c);
            }
        }
    }
    let _ = &s.stop;
    LoadResult {
        lat,
        msgs,
        wall,
        cpu: CpuTimes {
            user: cpu1.user.saturating_sub(cpu0.user),
            system: cpu1.system.saturating_sub(cpu0.system),
        },
    }
}

fn teardown(s: Setup) {
    s.stop.store(true, Ordering::Relaxed);
    drop(s.clients);
    s.poller.shutdown();
    s.rt.shutdown_timeout(Duration::from_secs(2));
}

fn cores() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64
}

/// Counter per message (server side: both directions of every connection).
fn per(n: u64, msgs: u64) -> f64 {
    n as f64 / msgs.max(1) as f64
}

fn pct(d: Duration, wall: Duration) -> f64 {
    100.0 * d.as_secs_f64() / (wall.as_secs_f64() * cores())
}

fn plan(v: &Variant, conns: usize, pt: usize) -> String {
    let polling = match v.mode {
        Mode::Bp => conns,
        Mode::Bpts | Mode::Bpev => pt,
        Mode::Event => 0,
    };
    ThreadPlan::new()
        .side("client load generator", 1, Some(vec![client_cpu()]))
        .side("server tokio worker", 1, Some(vec![server_cpu()]))
        .side(
            &format!("{} polling", v.name()),
            polling,
            Some(vec![server_cpu()]),
        )
        .describe()
}

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Run only these experiments (comma-separated prefixes): latency_vs_connections (with
    /// bpev_vs_best), throughput_vs_polling_threads, throughput_vs_bp_timeout, idle_cpu.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// latency_vs_connections: only these connection counts (default: the suite's list).
    #[arg(long, value_delimiter = ',')]
    conns: Vec<usize>,
    /// latency_vs_connections: only these sending intervals, µs (default: the suite's list).
    #[arg(long, value_delimiter = ',')]
    intervals: Vec<u64>,
    /// latency_vs_connections: only these variants, by name (`BPEV`, `BPEV-adaptive`, ...;
    /// default all). Each point's best mode is then the best of these.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// latency_vs_connections: run every point this many times, the variants alternating
    /// within each repetition (default 1).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let args = cli.suite;
    let want = |e: &str| cli.only.is_empty() || cli.only.iter().any(|o| e.starts_with(o.as_str()));
    let t_start = Instant::now();
    let mut t_last = t_start;
    let mut lap = |what: &str| {
        let now = Instant::now();
        eprintln!(
            "poller: {what} took {:.1} s",
            now.duration_since(t_last).as_secs_f64()
        );
        t_last = now;
    };
    let mut report = Report::new("poller", &args)?;
    let point = args.duration(Duration::from_millis(150), Duration::from_secs(2));
    let mut conn_list: Vec<usize> =
        args.pick(vec![1, 16, 64], vec![1, 2, 4, 8, 16, 32, 64, 128, 256]);
    if !cli.conns.is_empty() {
        conn_list.clone_from(&cli.conns);
    }
    let mut intervals: Vec<u64> = args.pick(vec![0, 100], vec![0, 100, 300]);
    if !cli.intervals.is_empty() {
        intervals.clone_from(&cli.intervals);
    }
    let variants: Vec<Variant> = VARIANTS
        .into_iter()
        .filter(|v| {
            cli.variants.is_empty()
                || cli
                    .variants
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(&v.name()))
        })
        .collect();
    let repeat = cli.repeat.max(1);
    let pt = 1usize;
    println!(
        "# Poller modes (shm)\n\nmachine cores: {}; pinning: server (1 tokio worker + polling threads: {pt} for BPTS/BPEV, one per connection for BP, none for EVENT) on cpu {}, client (1 busy-polling load-generator thread) on cpu {}. quick = {}",
        cores(),
        server_cpu(),
        client_cpu(),
        args.quick
    );

    if want("latency_vs_connections") || want("bpev_vs_best") {
        // Experiment 1: latency vs connections and sending interval (Figs. 4-6, 8), CPU split.
        let mut t = Table::new(
            "latency_vs_connections",
            "Latency per message vs connections (Figs. 4-6, 8)",
            &[
                "mode",
                "interval_us",
                "connections",
                "p50_us",
                "mean_us",
                "p99_us",
                "msgs_per_s",
                "user_pct",
                "sys_pct",
                "idle_pct",
                "threads",
                "sleeps_per_msg",
                "spin_hits_per_msg",
                "poller_wakes_per_msg",
                "polls_per_msg",
            ],
        );
        // best[(interval, conns)] = (best p50, bpev-adaptive p50)
        let mut cmp: Vec<(u64, usize, String, f64)> = Vec::new();
        for &iv in &intervals {
            for &n in &conn_list {
                for v in (0..repeat).flat_map(|_| variants.iter().copied()) {
                    let mut s = setup(v.config(pt), v.mode, n)?;
                    let st0 = s.poller.stats();
                    let r = load(&mut s, Duration::from_micros(iv), point);
                    let st = s.poller.stats().since(&st0);
                    let threads = s.poller.threads();
                    teardown(s);
                    eprintln!("poller: {} {iv} us {n} conns: {st:?}", v.name());
                    let sm = r.lat.summary();
                    let user = pct(r.cpu.user, r.wall);
                    let sys = pct(r.cpu.system, r.wall);
                    let p50 = sm.p50_us();
                    cmp.push((iv, n, v.name(), p50));
                    t.push(vec![
                        Value::from(v.name()),
                        Value::from(iv),
                        Value::from(n as u64),
                        Value::from(p50),
                        Value::from(sm.mean_ns / 1000.0),
                        Value::from(sm.p99_us()),
                        Value::from(r.msgs as f64 / r.wall.as_secs_f64()),
                        Value::from(user),
                        Value::from(sys),
                        Value::from((100.0 - user - sys).max(0.0)),
                        Value::from(threads as u64),
                        Value::from(per(st.sleeps, r.msgs)),
                        Value::from(per(st.spin_hits, r.msgs)),
                        Value::from(per(st.waker_wakes + st.eventfd_writes, r.msgs)),
                        Value::from(per(st.polls, r.msgs)),
                    ]);
                }
            }
        }
        t.note(format!(
            "thread plan at 256 connections, BPEV: {}",
            plan(&VARIANTS[3], 256, pt)
        ));
        t.note(format!(
            "thread plan at 256 connections, BP: {}",
            plan(&VARIANTS[0], 256, pt)
        ));
        t.note("CPU percentages are of all cores of the machine over the measurement window (client + server in one process).");
        t.plot(
            PlotSpec::lines("connections", &["p50_us"])
                .series("mode")
                .log_x()
                .y_label("p50 latency (us)"),
        );
        report.add(t)?;

        // BPEV vs best mode at every load point.
        let mut t = Table::new(
            "bpev_vs_best",
            "BPEV (adaptive and paper) p50 latency relative to the best mode at each load point (target <= 1.20)",
            &[
                "interval_us",
                "connections",
                "best_mode",
                "best_p50_us",
                "bpev_ratio",
                "bpev_adaptive_ratio",
            ],
        );
        for &iv in &intervals {
            for &n in &conn_list {
                let pts: Vec<&(u64, usize, String, f64)> = cmp
                    .iter()
                    .filter(|c| c.0 == iv && c.1 == n && c.3 > 0.0)
                    .collect();
                let Some(best) = pts.iter().min_by(|a, b| a.3.total_cmp(&b.3)) else {
                    continue;
                };
                let get = |name: &str| pts.iter().find(|c| c.2 == name).map(|c| c.3 / best.3);
                t.push(vec![
                    Value::from(iv),
                    Value::from(n as u64),
                    Value::from(best.2.clone()),
                    Value::from(best.3),
                    get("BPEV").map(Value::from).unwrap_or(Value::Empty),
                    get("BPEV-adaptive")
                        .map(Value::from)
                        .unwrap_or(Value::Empty),
                ]);
            }
        }
        report.add(t)?;
        lap("latency_vs_connections + bpev_vs_best");
    }

    if want("throughput_vs_polling_threads") {
        // Experiment 2: throughput vs polling threads (Fig. 11 b), BPEV paper config.
        let mut t = Table::new(
            "throughput_vs_polling_threads",
            "BPEV throughput vs polling threads, continuous load (Fig. 11)",
            &[
                "polling_threads",
                "connections",
                "msgs_per_s",
                "p50_us",
                "threads",
            ],
        );
        let n = args.pick(16, 64);
        for pth in [1usize, 2, 3] {
            let v = Variant {
                mode: Mode::Bpev,
                adaptive: false,
            };
            let mut s = setup(v.config(pth), v.mode, n)?;
            let r = load(&mut s, Duration::ZERO, point);
            let threads = s.poller.threads();
            teardown(s);
            t.push(vec![
                Value::from(pth as u64),
                Value::from(n as u64),
                Value::from(r.msgs as f64 / r.wall.as_secs_f64()),
                Value::from(r.lat.summary().p50_us()),
                Value::from(threads as u64),
            ]);
        }
        t.note(format!(
            "thread plan at 3 polling threads: {}",
            plan(&VARIANTS[3], n, 3)
        ));
        t.plot(PlotSpec::lines("polling_threads", &["msgs_per_s"]));
        report.add(t)?;
        lap("throughput_vs_polling_threads");
    }

    if want("throughput_vs_bp_timeout") {
        // Experiment 3: throughput vs bp_timeout (Fig. 13), one connection.
        let mut t = Table::new(
            "throughput_vs_bp_timeout",
            "BPEV throughput vs bp_timeout, one connection (Fig. 13); auto_tune off",
            &[
                "bp_timeout_us",
                "msgs_per_s",
                "p50_us",
                "spin_hits",
                "wakeups",
            ],
        );
        for us in [0u64, 2, 5, 10, 20, 50] {
            let cfg = PollerConfig::paper(Mode::Bpev)
                .to_builder()
                .polling_threads(1)
                .bp_timeout(Duration::from_micros(us))
                .build()?;
            let mut s = setup(cfg, Mode::Bpev, 1)?;
            let st0 = s.poller.stats();
            let r = load(&mut s, Duration::ZERO, point);
            let st = s.poller.stats().since(&st0);
            teardown(s);
            t.push(vec![
                Value::from(us),
                Value::from(r.msgs as f64 / r.wall.as_secs_f64()),
                Value::from(r.lat.summary().p50_us()),
                Value::from(st.spin_hits),
                Value::from(st.wakeups),
            ]);
        }
        t.note(format!("thread plan: {}", plan(&VARIANTS[3], 1, 1)));
        t.plot(PlotSpec::lines("bp_timeout_us", &["msgs_per_s"]));
        report.add(t)?;
        lap("throughput_vs_bp_timeout");
    }

    if want("idle_cpu") {
        // Experiment 4: idle server CPU with 256 connections (Fig. 16, §V-D).
        let mut t = Table::new(
            "idle_cpu",
            "CPU of an idle server with 256 connections (target: BPEV-adaptive < 2 % of one core)",
            &[
                "mode",
                "connections",
                "cpu_pct_of_one_core",
                "polling_threads",
                "parks",
            ],
        );
        let idle = args.duration(Duration::from_millis(400), Duration::from_secs(3));
        // Quick mode skips BP and BPTS here: without parking they spin by construction (100 %),
        // and their 256-connection setups are the slowest part of a smoke run.
        let idle_variants: Vec<Variant> = args.pick(
            vec![VARIANTS[2], VARIANTS[3], VARIANTS[4]],
            VARIANTS.to_vec(),
        );
        for v in idle_variants {
            let s = setup(v.config(2), v.mode, 256)?;
            // Let every server task reach its sleep (and adaptive pollers park).
            std::thread::sleep(Duration::from_millis(50));
            let st0 = s.poller.stats();
            let c0 = CpuTimes::process().unwrap_or_default();
            let w0 = Instant::now();
            std::thread::sleep(idle);
            let c1 = CpuTimes::process().unwrap_or_default();
            let cpu = c1.percent_since(&c0, w0.elapsed());
            let st = s.poller.stats().since(&st0);
            let threads = s.poller.threads();
            teardown(s);
            t.push(vec![
                Value::from(v.name()),
                Value::from(256u64),
                Value::from(cpu),
                Value::from(threads as u64),
                Value::from(st.parks),
            ]);
        }
        t.note(format!("2 polling threads for BPTS/BPEV as in the paper's Fig. 16; BP has one per connection (BP plan: {}). The client side is idle.", plan(&VARIANTS[0], 256, 2)));
        report.add(t)?;
        lap("idle_cpu");
    }
    report.finish()?;
    Ok(())
}
