//! The connect suite (`cargo xtask bench connect`, issue "connection resources"): what a
//! connection costs to make and to keep.
//!
//! - `connect_time`: connect time (p50, p99) of tonic over TCP and over a Unix socket, and of
//!   rrpc's shm fast path without and with [`rrpc_tonic::RrpcConfig::connection_pool`]
//!   (KRCore's pre-made queue pairs and ring regions, §3.1), one connection at a time; and
//!   connections established per second back to back. Each p50 is also a ratio to tonic's
//!   TCP connect in the same run.
//! - `idle_memory`: resident memory per idle connection on each side (the server in its own
//!   process), after one small call and after traffic that went once around the rings,
//!   against tonic over TCP in the same run.
//!
//! Not here yet (the other benchmarks): the same in the soft-RoCE VM, shared versus
//! dedicated queue pairs, and self-sizing rings (none of which exist yet).

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::runtime::Runtime;

use crate::rpc::{
    ChildServer, Transport, connect_once, connect_to, rrpc_config, runtime, start_server_with,
};
use crate::{Latency, Ratio, Report, SuiteArgs, Table, ThreadPlan, rss_bytes};

/// Runs the suite's experiments (all, or those whose names start with an entry of `only`).
///
/// # Errors
/// A server, connect or call failure.
pub fn run_suite(args: &SuiteArgs, report: &mut Report, only: &[String]) -> Result<()> {
    let want = |e: &str| only.is_empty() || only.iter().any(|o| e.starts_with(o.as_str()));
    let (scpu, ccpu) = (ThreadPlan::cpu(0), ThreadPlan::cpu(1));
    let server_rt = runtime("bench-server", scpu)?;
    let client_rt = runtime("bench-client", ccpu)?;
    let plan = ThreadPlan::new()
        .side("server (tokio, 1 worker)", 1, Some(vec![scpu]))
        .side("client (tokio, 1 worker)", 1, Some(vec![ccpu]))
        .side(
            "rrpc rows: one polling thread (parks while idle) and, pooled, one pool refill \
             thread (sleeps once the pool is full)",
            2,
            None,
        );
    report.machine_mut().provider =
        "shm (rrpc rows); kernel TCP / Unix sockets (tonic rows)".into();
    report.machine_mut().pinning = plan.describe();
    if want("connect_time") {
        let t = connect_time(args, &server_rt, &client_rt, &plan.describe())?;
        report.add(t)?;
    }
    if want("idle_memory") {
        let t = idle_memory(args, &client_rt)?;
        report.add(t)?;
    }
    Ok(())
}

fn connect_time(
    args: &SuiteArgs,
    server_rt: &Runtime,
    client_rt: &Runtime,
    plan: &str,
) -> Result<Table> {
    let n = args.pick(40usize, 400);
    let burst = args.pick(40usize, 400);
    let mut t = Table::new(
        "connect_time",
        "Connect time, one connection at a time, and connections per second back to back",
        &[
            "setup",
            "p50_us",
            "p99_us",
            "p50_x_vs_tcp",
            "with_first_call_p50_us",
            "conns_per_s",
            "pool_hits",
            "pool_misses",
        ],
    );
    let pooled = rrpc_config(Transport::RrpcFast).connection_pool(4);
    let setups = [
        (
            "tonic-tcp",
            Transport::TonicTcp,
            rrpc_config(Transport::TonicTcp),
        ),
        (
            "tonic-uds",
            Transport::TonicUds,
            rrpc_config(Transport::TonicUds),
        ),
        (
            "rrpc-shm-fast",
            Transport::RrpcFast,
            rrpc_config(Transport::RrpcFast),
        ),
        ("rrpc-shm-fast-pool4", Transport::RrpcFast, pooled),
    ];
    let mut tcp_p50 = f64::NAN;
    for (name, tr, cfg) in setups {
        let server = start_server_with(server_rt, tr, cfg.clone())?;
        let target = server.target().to_owned();
        // One warm-up connection (the server binds, the pool starts filling).
        drop(client_rt.block_on(connect_to(tr, &target, &cfg))?);
        let (mut lat, mut with_call) = (Latency::new(), Latency::new());
        for _ in 0..n {
            // Room for the pool's thread to refill, as between a real client's connects.
            std::thread::sleep(Duration::from_millis(2));
            let t0 = Instant::now();
            let mut c = client_rt.block_on(connect_once(tr, &target, &cfg))?;
            lat.record(t0.elapsed());
            client_rt.block_on(c.unary(small()))?;
            with_call.record(t0.elapsed());
            drop(c);
        }
        // Back to back: the pool (if any) runs dry and refills as it can.
        let t0 = Instant::now();
        for _ in 0..burst {
            drop(client_rt.block_on(connect_once(tr, &target, &cfg))?);
        }
        let rate = burst as f64 / t0.elapsed().as_secs_f64();
        let sm = lat.summary();
        if tr == Transport::TonicTcp {
            tcp_p50 = sm.p50_us();
        }
        let (hits, misses) = cfg
            .pool_stats()
            .iter()
            .fold((0, 0), |(h, m), (_, s)| (h + s.hits, m + s.misses));
        t.push(vec![
            name.into(),
            sm.p50_us().into(),
            sm.p99_us().into(),
            Ratio::of(sm.p50_us(), tcp_p50).into(),
            with_call.summary().p50_us().into(),
            rate.into(),
            hits.into(),
            misses.into(),
        ]);
        drop(server);
    }
    t.note(plan.to_string());
    t.note(format!(
        "{n} timed connects per setup, 2 ms apart (each: connect; for rrpc the side-channel \
         handshake, both rings, the queue pair and path negotiation; then one unary call of \
         64 B, with_first_call_p50_us; then drop), then {burst} \
         back to back for conns_per_s. Server and client are one process sharing one config, \
         so a pooled connection takes two bundles (client and server). Targets of the issue: \
         pooled p50 <= 50 us and >= 10x faster than unpooled."
    ));
    Ok(t)
}

fn idle_memory(args: &SuiteArgs, client_rt: &Runtime) -> Result<Table> {
    let k = args.pick(16usize, 64);
    let mut t = Table::new(
        "idle_memory",
        "Resident memory per idle connection, each side (server in its own process)",
        &[
            "transport",
            "state",
            "connections",
            "server_kib_per_conn",
            "client_kib_per_conn",
            "both_x_vs_tcp",
        ],
    );
    let mut tcp: [f64; 3] = [f64::NAN; 3];
    // rrpc twice: self-sizing rings (the default) and the papers' fixed 4 MiB rings.
    for (tr, fixed) in [
        (Transport::TonicTcp, false),
        (Transport::RrpcFast, false),
        (Transport::RrpcFast, true),
    ] {
        let env = if fixed { "1" } else { "0" };
        let server = ChildServer::spawn_with(tr, None, &[(crate::rpc::FIXED_RING_ENV, env)])?;
        let mut cfg = rrpc_config(tr);
        if fixed {
            let ring = cfg.get_ring_size();
            cfg = cfg.min_ring_size(ring)?;
        }
        let name = match (tr, fixed) {
            (Transport::RrpcFast, false) => "rrpc-fast, self-sizing rings".to_string(),
            (Transport::RrpcFast, true) => "rrpc-fast, fixed 4 MiB rings".to_string(),
            _ => tr.name().to_string(),
        };
        let settle = || std::thread::sleep(Duration::from_millis(300));
        // One connection first: the process-wide costs (runtime, poller, first mappings)
        // are not per connection.
        let mut first = client_rt.block_on(connect_to(tr, &server.target, &cfg))?;
        client_rt.block_on(first.unary(small()))?;
        settle();
        let (s0, c0) = (rss_bytes(Some(server.pid()))?, rss_bytes(None)?);
        let mut conns = Vec::with_capacity(k);
        for _ in 0..k {
            let mut c = client_rt.block_on(connect_to(tr, &server.target, &cfg))?;
            client_rt.block_on(c.unary(small()))?;
            conns.push(c);
        }
        settle();
        let (s1, c1) = (rss_bytes(Some(server.pid()))?, rss_bytes(None)?);
        // Then enough traffic on each to go once around its rings (4 MiB each way by
        // default), and idle again.
        for c in &mut conns {
            for _ in 0..5 {
                client_rt.block_on(c.unary(crate::rpc::pb::Req {
                    payload: vec![7; 1 << 20],
                    resp_len: 1 << 20,
                }))?;
            }
        }
        settle();
        let (s2, c2) = (rss_bytes(Some(server.pid()))?, rss_bytes(None)?);
        // Quiet for longer than rrpc-tonic's `ring_shrink_after` (1 s) and a tick.
        std::thread::sleep(Duration::from_millis(2000));
        let (s3, c3) = (rss_bytes(Some(server.pid()))?, rss_bytes(None)?);
        for (base, state, s, c) in [
            (0, "after one call", s1, c1),
            (1, "after 5 MiB each way", s2, c2),
            (2, "then quiet 2 s", s3, c3),
        ] {
            let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1024.0 / k as f64;
            let (sk, ck) = (per(s, s0), per(c, c0));
            let both = sk + ck;
            if tr == Transport::TonicTcp {
                tcp[base] = both;
            }
            t.push(vec![
                name.clone().into(),
                state.into(),
                k.into(),
                sk.into(),
                ck.into(),
                Ratio::of(both, tcp[base]).into(),
            ]);
        }
        drop(conns);
        drop(first);
        drop(server);
    }
    t.note(format!(
        "RSS deltas over {k} connections opened after a first one, each idle 300 ms before the \
         first two readings and 2 s more before the third; rrpc rows: self-sizing rings \
         (rrpc-tonic's default: 64 KiB, growing to at most 4 MiB, shrinking after 1 s of quiet) \
         and fixed 4 MiB rings (the papers' setting), mapped in both processes, pages counted on \
         each side that touched them. The issue's target: at most 1/16 of 12 MiB per idle \
         connection (768 KiB)."
    ));
    Ok(t)
}

fn small() -> crate::rpc::pb::Req {
    crate::rpc::pb::Req {
        payload: vec![1; 64],
        resp_len: 8,
    }
}
