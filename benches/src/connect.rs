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
//! - `shared_qp`: 1 to 1024 logical connections on dedicated queue pairs (one handshake and
//!   one queue pair each) against the same on one shared queue pair ([`rrpc_core::vqp`],
//!   KRCore's Algorithm 2): queue pairs, file descriptors and resident memory per logical
//!   connection, and 64 B WRITE throughput round-robin over all of them, as a ratio.
//!
//! Not here yet: the same in the soft-RoCE VM (where only a ratio would mean anything).

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::runtime::Runtime;

use crate::rpc::{
    ChildServer, Transport, connect_once, connect_to, rrpc_config, runtime, start_server_with,
};
use crate::{Latency, PlotSpec, Ratio, Report, SuiteArgs, Table, ThreadPlan, rss_bytes};

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
    report.machine_mut().provider = match crate::rpc::rdma_device() {
        Some(dev) => format!(
            "verbs on {dev} (rrpc rows of connect_time and idle_memory, rdma://127.0.0.1); shm              (shared_qp); kernel TCP / Unix sockets (tonic rows)"
        ),
        None => "shm (rrpc rows); kernel TCP / Unix sockets (tonic rows)".into(),
    };
    report.machine_mut().pinning = plan.describe();
    if want("connect_time") {
        let t = connect_time(args, &server_rt, &client_rt, &plan.describe())?;
        report.add(t)?;
    }
    if want("idle_memory") {
        let t = idle_memory(args, &client_rt)?;
        report.add(t)?;
    }
    if want("shared_qp") {
        let t = shared_qp(args)?;
        report.add(t)?;
    }
    if want("connect_rounds") {
        let t = connect_rounds(args, &server_rt, &client_rt)?;
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
    let pooled = rrpc_config(Transport::RrpcFast)
        .to_builder()
        .connection_pool(4)
        .build()?;
    // Connections dialed ahead: after the warm-up connection, each timed
    // connect takes a spare (its side channel checked) and a blocking task
    // dials its replacement.
    let spare = rrpc_config(Transport::RrpcFast)
        .to_builder()
        .spare_connections(2)
        .build()?;
    // Over one shared queue pair: the warm-up connection opens it, and each
    // timed connect is a logical connection (no queue pair made).
    let shared = rrpc_config(Transport::RrpcFast)
        .to_builder()
        .shared_queue_pairs(true)
        .build()?;
    let verbs = crate::rpc::rdma_device().is_some();
    // The pause between timed connects (`RRPC_BENCH_CONNECT_GAP_MS`, default 2 ms): on
    // soft-RoCE under an emulated CPU, refilling a pool takes hundreds of milliseconds of
    // the same two CPUs the connect needs, so a fair pooled row needs a longer pause.
    let gap = Duration::from_millis(
        std::env::var("RRPC_BENCH_CONNECT_GAP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
    );
    // `rrpc://`: one TCP port; each row's config allows one fabric, so the
    // client lands on it (checked on the warm-up connection below).
    let port_to = |f: rrpc_tonic::Fabric| {
        rrpc_config(Transport::RrpcPort)
            .to_builder()
            .fabrics([f])
            .build()
    };
    let port_shm = port_to(rrpc_tonic::Fabric::Shm)?;
    let port_tcp = port_to(rrpc_tonic::Fabric::Tcp)?;
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
            if verbs {
                "rrpc-rdma-fast"
            } else {
                "rrpc-shm-fast"
            },
            Transport::RrpcFast,
            rrpc_config(Transport::RrpcFast),
        ),
        (
            if verbs {
                "rrpc-rdma-fast-pool4"
            } else {
                "rrpc-shm-fast-pool4"
            },
            Transport::RrpcFast,
            pooled,
        ),
        (
            if verbs {
                "rrpc-rdma-fast-spare2"
            } else {
                "rrpc-shm-fast-spare2"
            },
            Transport::RrpcFast,
            spare,
        ),
        (
            if verbs {
                "rrpc-rdma-fast-shared"
            } else {
                "rrpc-shm-fast-shared"
            },
            Transport::RrpcFast,
            shared,
        ),
        ("rrpc-port-shm", Transport::RrpcPort, port_shm),
        ("rrpc-port-tcp", Transport::RrpcPort, port_tcp),
    ];
    let mut tcp_p50 = f64::NAN;
    for (name, tr, cfg) in setups {
        let server = start_server_with(server_rt, tr, cfg.clone())?;
        let target = server.target().to_owned();
        // One warm-up connection (the server binds, the pool starts filling).
        drop(client_rt.block_on(connect_to(tr, &target, &cfg))?);
        if tr == Transport::RrpcPort {
            // The row is named after the fabric that carried it, read from the live connection.
            let ch = client_rt.block_on(rrpc_tonic::RrpcChannel::connect(&target, cfg.clone()))?;
            let want = if cfg.allows(rrpc_tonic::Fabric::Shm) {
                rrpc_tonic::Carrier::Shm
            } else {
                rrpc_tonic::Carrier::Tcp
            };
            anyhow::ensure!(
                ch.carrier() == want,
                "{name}: carried by {:?}, not {want:?}",
                ch.carrier()
            );
        }
        let (mut lat, mut with_call) = (Latency::new(), Latency::new());
        for _ in 0..n {
            // Room for the pool's thread to refill, as between a real client's connects.
            std::thread::sleep(gap);
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
        // The server's context (an equal config's, shared while it runs).
        let (hits, misses) = rrpc_tonic::RrpcContext::shared(&cfg)
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
        "{n} timed connects per setup, {gap:?} apart (each: connect; for rrpc the side-channel \
         handshake, both rings, the queue pair and path negotiation; then one unary call of \
         64 B, with_first_call_p50_us; then drop), then {burst} \
         back to back for conns_per_s. Server and client are one process sharing one config, \
         so a pooled connection takes two bundles (client and server). The shared row sets \
         shared_queue_pairs: after the warm-up connection opened the shared connection, \
         each connect is a logical one over its queue pair (own side channel and rings, no \
         queue pair). The spare2 row sets spare_connections(2): after the warm-up, \
         each connect takes a connection dialed ahead and a background task dials its \
         replacement (conns_per_s shows what back-to-back connects cost once the spares run \
         out). Targets of the issue: pooled p50 <= 50 us and >= 10x faster than \
         unpooled."
    ));
    t.note(
        "rrpc-port-*: the server on rrpc://127.0.0.1 (one TCP port), the client's fabrics \
         allowing one fabric (the carrier is checked on the warm-up connection); each connect \
         is the TCP connect, the fabric negotiation on it, then for shm the shm handshake \
         and rings, for tcp tonic's HTTP/2 on that TCP connection. rrpc:// landing on verbs \
         is exercised only functionally, in the VM (cargo xtask rxe: \
         integration/suite's rdma_port tests and one_port::rdma_verbs): soft-RoCE under an \
         emulated CPU gives no meaningful connect time, so no row here.",
    );
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
            let ring = cfg.ring_size();
            cfg = cfg.to_builder().min_ring_size(ring).build()?;
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

/// Descriptors opened per connection between two counts: signed, since a
/// descriptor of an earlier experiment's teardown (a connection's task
/// finishing late) can close between the two and make the second count lower.
fn fds_per(before: usize, after: usize, n: usize) -> f64 {
    (after as f64 - before as f64) / n as f64
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// `n` connected shm queue pairs in this process (client and server ends), each side
/// granting a 4 KiB region under role 1.
fn core_pairs(n: usize) -> Result<Vec<(rrpc_core::conn::Connection, rrpc_core::conn::Connection)>> {
    use rrpc_core::conn::{self, HandshakeConfig, Offer};
    use rrpc_core::{Fabric, FabricAddr, QpConfig};
    let dir = std::env::temp_dir().join(format!("rrpc-bench-vqp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ep = FabricAddr::parse(&format!("shm://{}/s.sock", dir.display()))?;
    let hs = HandshakeConfig::default();
    let listener = conn::Listener::bind(&ep, hs.clone())?;
    let fabric = Fabric::shm();
    let f2 = fabric.clone();
    let server = std::thread::spawn(move || -> Result<Vec<conn::Connection>> {
        (0..n)
            .map(|_| {
                let region = f2.alloc_region(4096)?;
                let c = listener.accept()?.accept(
                    f2.create_qp(&QpConfig::default())?,
                    Offer::new().grant(1, region),
                )?;
                Ok(c)
            })
            .collect()
    });
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let region = fabric.alloc_region(4096)?;
        clients.push(conn::connect(
            &ep,
            fabric.create_qp(&QpConfig::default())?,
            Offer::new().grant(1, region),
            &hs,
        )?);
    }
    let servers = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(clients.into_iter().zip(servers).collect())
}

/// Round-robin 64 B WRITEs over `qps` (each to its own 64 B slot of `remotes`), one in
/// 16 signaled per logical connection and its completion polled: WRITEs per second.
fn write_rate(
    qps: &[std::sync::Arc<rrpc_core::QueuePair>],
    remotes: &[rrpc_core::Remote],
    src: &rrpc_core::Region,
    total: usize,
) -> Result<f64> {
    use rrpc_core::{Completion, Local};
    let mut buf = [Completion::EMPTY; 8];
    let mut count = vec![0u64; qps.len()];
    let t0 = Instant::now();
    for i in 0..total {
        let k = i % qps.len();
        count[k] += 1;
        let signaled = count[k].is_multiple_of(16);
        qps[k].post_write(count[k], Local::new(src, 0, 64), remotes[k], signaled)?;
        if signaled {
            while qps[k].send_cq().poll(&mut buf)? == 0 {}
        }
    }
    Ok(total as f64 / t0.elapsed().as_secs_f64())
}

fn shared_qp(args: &SuiteArgs) -> Result<Table> {
    use rrpc_core::vqp::{PhysicalQp, VqpConfig};
    use std::sync::Arc;
    let counts: Vec<usize> = args.pick(vec![1, 16, 256], vec![1, 4, 16, 64, 256, 1024]);
    let total = args.pick(200_000usize, 2_000_000);
    let mut t = Table::new(
        "shared_qp",
        "Dedicated versus shared queue pairs, 1 to 1024 logical connections (shm, one thread)",
        &[
            "logical_conns",
            "setup",
            "queue_pairs",
            "fds_per_conn",
            "rss_kib_per_conn",
            "mwrites_per_s",
            "x_vs_dedicated",
        ],
    );
    let fabric = rrpc_core::Fabric::shm();
    let src = fabric.alloc_region(4096)?;
    for &n in &counts {
        // Dedicated: one handshake and one queue pair pair per logical connection.
        let (f0, r0) = (open_fds(), rss_bytes(None)?);
        let pairs = core_pairs(n)?;
        let (f1, r1) = (open_fds(), rss_bytes(None)?);
        let qps: Vec<_> = pairs.iter().map(|(c, _)| c.qp().clone()).collect();
        let remotes: Vec<_> = pairs
            .iter()
            .map(|(c, _)| c.peer().region(1).map(|r| r.at(0)))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow::anyhow!("no region granted"))?;
        let dedicated = write_rate(&qps, &remotes, &src, total)?;
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1024.0 / n as f64;
        t.push(vec![
            n.into(),
            "dedicated".into(),
            (2 * n).into(),
            fds_per(f0, f1, n).into(),
            per(r1, r0).into(),
            (dedicated / 1e6).into(),
            Ratio::of(dedicated, dedicated).into(),
        ]);
        drop((qps, pairs));
        // Shared: one handshake and one queue pair pair; n sharers on each side.
        let (f0, r0) = (open_fds(), rss_bytes(None)?);
        let mut one = core_pairs(1)?;
        let (c, s) = one.pop().ok_or_else(|| anyhow::anyhow!("no pair"))?;
        let pc = PhysicalQp::new(c.qp().clone(), VqpConfig::default())?;
        let ps = PhysicalQp::new(s.qp().clone(), VqpConfig::default())?;
        let mut qps = Vec::with_capacity(n);
        let mut peers = Vec::with_capacity(n);
        for k in 0..n as u32 {
            qps.push(Arc::new(pc.attach(k, k)?));
            peers.push(ps.attach(k, k)?);
        }
        let (f1, r1) = (open_fds(), rss_bytes(None)?);
        let base = c
            .peer()
            .region(1)
            .ok_or_else(|| anyhow::anyhow!("no region"))?;
        let remotes: Vec<_> = (0..n).map(|k| base.at((k % 64) as u64 * 64)).collect();
        let shared = write_rate(&qps, &remotes, &src, total)?;
        t.push(vec![
            n.into(),
            "shared".into(),
            2usize.into(),
            fds_per(f0, f1, n).into(),
            per(r1, r0).into(),
            (shared / 1e6).into(),
            Ratio::of(shared, dedicated).into(),
        ]);
        let st = pc.stats();
        tracing::info!(n, ?st, "shared queue pair");
        drop((qps, peers, pc, ps, c, s));
    }
    t.plot(
        PlotSpec::lines("logical_conns", &["mwrites_per_s"])
            .series("setup")
            .log_x()
            .x_label("logical connections")
            .y_label("M WRITEs/s"),
    );
    t.also_plot(
        PlotSpec::lines("logical_conns", &["fds_per_conn"])
            .series("setup")
            .log_x()
            .x_label("logical connections")
            .y_label("file descriptors per logical connection"),
    );
    t.note(format!(
        "Both ends in this process, so queue pairs, descriptors and memory count both sides \
         of every logical connection. Dedicated: a side-channel handshake, a queue pair and a \
         4 KiB region per side per logical connection (the side channel stays open for \
         liveness). Shared: one such connection, and each logical connection a virtual queue \
         pair on each side (two epoll and two event descriptors each, for its completion \
         channels). Throughput: {total} 64 B WRITEs round-robin over the logical connections \
         on one unpinned thread, each connection signaling one in 16 and polling for it. shm \
         only: on a NIC the dedicated rows would also pay the NIC's queue-pair cache misses \
         past a few hundred queue pairs (KRCore §2.3), which shm cannot show."
    ));
    Ok(t)
}

/// Issue 58's connect rows, in rounds: each round runs every setup once (a server of its own,
/// a warm-up connection, `n` timed connects, `burst` back to back), so that a noisy machine
/// shows in every setup of a round alike; every round is a row, each with its ratios to
/// tonic-TCP's in the same round.
fn connect_rounds(args: &SuiteArgs, server_rt: &Runtime, client_rt: &Runtime) -> Result<Table> {
    let (rounds, n, burst) = (
        args.pick(2usize, 3),
        args.pick(40usize, 300),
        args.pick(40usize, 300),
    );
    let mut t = Table::new(
        "connect_rounds",
        "Connect p50 and connections per second back to back, setups alternated in rounds",
        &[
            "round",
            "setup",
            "p50_us",
            "p50_x_vs_tcp",
            "conns_per_s",
            "rate_x_vs_tcp",
        ],
    );
    let with =
        |tr: Transport,
         f: &dyn Fn(rrpc_tonic::RrpcConfigBuilder) -> rrpc_tonic::RrpcConfigBuilder| {
            f(rrpc_config(tr).to_builder()).build()
        };
    let shm_only = |b: rrpc_tonic::RrpcConfigBuilder| b.fabrics([rrpc_tonic::Fabric::Shm]);
    let setups = [
        (
            "tonic-tcp",
            Transport::TonicTcp,
            rrpc_config(Transport::TonicTcp),
        ),
        (
            "rrpc-shm-fast",
            Transport::RrpcFast,
            rrpc_config(Transport::RrpcFast),
        ),
        (
            "rrpc-shm-fast-spare2",
            Transport::RrpcFast,
            with(Transport::RrpcFast, &|b| b.spare_connections(2))?,
        ),
        (
            "rrpc-port-shm",
            Transport::RrpcPort,
            with(Transport::RrpcPort, &shm_only)?,
        ),
        (
            "rrpc-port-shm-spare2",
            Transport::RrpcPort,
            with(Transport::RrpcPort, &|b| shm_only(b).spare_connections(2))?,
        ),
    ];
    for round in 1..=rounds {
        let (mut tcp_p50, mut tcp_rate) = (f64::NAN, f64::NAN);
        for (name, tr, cfg) in &setups {
            let server = start_server_with(server_rt, *tr, cfg.clone())?;
            let target = server.target().to_owned();
            drop(client_rt.block_on(connect_to(*tr, &target, cfg))?);
            let mut lat = Latency::new();
            for _ in 0..n {
                std::thread::sleep(Duration::from_millis(2));
                let t0 = Instant::now();
                let c = client_rt.block_on(connect_once(*tr, &target, cfg))?;
                lat.record(t0.elapsed());
                drop(c);
            }
            let t0 = Instant::now();
            for _ in 0..burst {
                drop(client_rt.block_on(connect_once(*tr, &target, cfg))?);
            }
            let rate = burst as f64 / t0.elapsed().as_secs_f64();
            let p50 = lat.summary().p50_us();
            if *tr == Transport::TonicTcp {
                (tcp_p50, tcp_rate) = (p50, rate);
            }
            t.push(vec![
                round.into(),
                (*name).into(),
                p50.into(),
                Ratio::of(p50, tcp_p50).into(),
                rate.into(),
                Ratio::of(rate, tcp_rate).into(),
            ]);
            drop(server);
        }
    }
    t.note(format!(
        "{rounds} rounds; per setup and round: a new server, one warm-up connection, {n} timed \
         connects 2 ms apart (connect only, then drop), then {burst} back to back. rrpc-port-*: \
         rrpc://127.0.0.1 with the client allowing shm only; after the warm-up the client's \
         context remembers the shm endpoint the port named, so a connect dials it with no TCP \
         connection and no negotiation (rrpc_tonic's context::PortMemo). spare2: \
         spare_connections(2)."
    ));
    Ok(t)
}
