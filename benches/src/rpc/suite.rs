//! The rpc suite itself ([`run_suite`]): Table III and Fig. 10 here, the later experiments from
//! [`figs`] and [`load`], each selected by name ([`EXPERIMENTS`]).

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};

use super::pb::bench_client::BenchClient;
use super::pb::bench_server::BenchServer;
use super::{
    AnyClient, Svc, Transport, connect, connect_many, figs, load, pingpong, runtime, start_server,
    stream_throughput,
};
use crate::cpu::{CpuTimes, rss_bytes};
use crate::{PlotSpec, Ratio, Report, SuiteArgs, Table, ThreadPlan};

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
pub(super) struct BaseByClients(Vec<(usize, f64)>);

impl BaseByClients {
    /// Records `v` as the baseline for `k` when `is_base`; returns the baseline for `k` (NaN
    /// before one was recorded).
    pub(super) fn base(&mut self, is_base: bool, k: usize, v: f64) -> f64 {
        if is_base {
            self.0.push((k, v));
        }
        self.0
            .iter()
            .find(|(c, _)| *c == k)
            .map_or(f64::NAN, |(_, b)| *b)
    }

    /// A throughput table's first columns for `name` at `k` clients: the client count,
    /// kRPC/s, its ratio to the baseline (recording it when `is_base`), p50 and p99 (µs).
    pub(super) fn throughput_row(
        &mut self,
        name: &str,
        is_base: bool,
        k: usize,
        r: &super::Throughput,
    ) -> Vec<crate::Value> {
        let krps = figs::krps(r);
        let base = self.base(is_base, k, krps);
        let s = r.latency.summary();
        vec![
            name.into(),
            k.into(),
            krps.into(),
            Ratio::of(krps, base).into(),
            s.p50_us().into(),
            s.p99_us().into(),
        ]
    }
}

/// Whether experiment `exp` is selected by `only` (empty: everything).
pub(super) fn selected(only: &[String], exp: &str) -> bool {
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

    let clients_list: Vec<usize> =
        figs::client_counts(args.pick(vec![1, 4], vec![1, 2, 4, 8, 16, 32, 64, 128, 256]));
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
                let mut row = tcp_krps.throughput_row(t.name(), t == Transport::TonicTcp, k, &r);
                row.extend([
                    cpu_pct.into(),
                    (rss as f64 / (1 << 20) as f64).into(),
                    (rss as f64 / 1024.0 / k as f64).into(),
                ]);
                thr.push(row);
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
