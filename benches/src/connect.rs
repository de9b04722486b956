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
//! - `reconnect_storm`: 1,000 clients (channels; 100 with `--quick`) calling in a loop on one
//!   server in its own process; the server is killed (SIGKILL) and started again at the same
//!   address, and every channel reconnects by itself. The time from the restarted server's
//!   listening to every client's first answer, against tonic over TCP doing the same in the
//!   same run; calls failed, and answers the restarted server served against those its
//!   clients saw (0 lost). CI's quick form is the `storm` integration test.
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
    if want("reconnect_storm") {
        let t = reconnect_storm(args, &client_rt)?;
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
        // Quiet for longer than rrpc-tonic's bound on releasing a quiet connection's rings
        // (2.5 x `ring_shrink_after`, 1.25 s by default).
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
         (rrpc-tonic's default: 64 KiB, growing to at most 4 MiB, shrinking to one 4 KiB page \
         after 500 ms of quiet) and fixed 4 MiB rings (the papers' setting), mapped in both \
         processes, pages counted on each side that touched them. #58's target: at most 1.5x \
         tonic-TCP's once quiet."
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

/// The storm server's environment: how many connections this one client process may hold
/// (rrpc's `max_connections_per_peer`; the default 256 would refuse a storm of 1,000).
pub const STORM_CLIENTS_ENV: &str = "RRPC_BENCH_STORM_CLIENTS";

/// The storm server's environment: its generation (1 before the restart, 2 after), written in
/// the first byte of every unary response, so that a client counts each answer to the server
/// that gave it (not to when the call started: a call started just before the kill may be
/// answered by the restarted server).
pub const STORM_GENERATION_ENV: &str = "RRPC_BENCH_STORM_GENERATION";

/// The reconnect storm's server role (`connect --role storm-serve --transport NAME --listen
/// ADDR`): serves the benchmark service for `t` at `listen` (`127.0.0.1:PORT` for tonic over
/// TCP, an rrpc URI otherwise) on a one-worker runtime (pinned to `cpu` if given), prints
/// `READY` once bound, and serves until its standard input closes; then prints `SERVED n`,
/// the unary calls it answered.
///
/// # Errors
/// Runtime or bind errors.
pub fn serve_storm(t: Transport, listen: &str, cpu: Option<usize>) -> Result<()> {
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The benchmark service, counting its unary calls and marking each answer with its
    /// generation ([`STORM_GENERATION_ENV`]).
    #[derive(Clone)]
    struct Counting(Arc<AtomicU64>, u8);

    #[tonic::async_trait]
    impl crate::rpc::pb::bench_server::Bench for Counting {
        async fn unary(
            &self,
            r: tonic::Request<crate::rpc::pb::Req>,
        ) -> Result<tonic::Response<crate::rpc::pb::Resp>, tonic::Status> {
            self.0.fetch_add(1, Ordering::Relaxed);
            let mut resp = crate::rpc::pb::bench_server::Bench::unary(&crate::rpc::Svc, r).await?;
            match resp.get_mut().payload.first_mut() {
                Some(b) => *b = self.1,
                None => resp.get_mut().payload.push(self.1),
            }
            Ok(resp)
        }

        type StreamStream = <crate::rpc::Svc as crate::rpc::pb::bench_server::Bench>::StreamStream;

        async fn stream(
            &self,
            r: tonic::Request<tonic::Streaming<crate::rpc::pb::Req>>,
        ) -> Result<tonic::Response<Self::StreamStream>, tonic::Status> {
            crate::rpc::pb::bench_server::Bench::stream(&crate::rpc::Svc, r).await
        }
    }

    let rt = match cpu {
        Some(c) => runtime("bench-server", c)?,
        None => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?,
    };
    let served = Arc::new(AtomicU64::new(0));
    let generation = std::env::var(STORM_GENERATION_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let svc = crate::rpc::pb::bench_server::BenchServer::new(Counting(served.clone(), generation));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    // Bound before READY, so that a client that reconnects finds the server there.
    let deadline = Instant::now() + Duration::from_secs(5);
    let server = match t {
        Transport::TonicTcp => {
            let l = loop {
                match rt.block_on(tokio::net::TcpListener::bind(listen)) {
                    Ok(l) => break l,
                    Err(e) if Instant::now() < deadline => {
                        tracing::debug!("bind {listen}: {e}; again");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
            rt.spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
                    .map_err(anyhow::Error::from)
            })
        }
        _ => {
            let clients: usize = std::env::var(STORM_CLIENTS_ENV)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            let cfg = rrpc_config(t)
                .to_builder()
                .max_connections(clients.max(4096))
                .max_connections_per_peer(clients + 1)
                .build()?;
            let incoming = loop {
                let _rt = rt.enter();
                match rrpc_tonic::RrpcIncoming::bind(listen, cfg.clone()) {
                    Ok(i) => break i,
                    Err(e) if Instant::now() < deadline => {
                        tracing::debug!("bind {listen}: {e}; again");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            rt.spawn(async move {
                rrpc_tonic::Server::builder()
                    .add_service(svc)
                    .serve_rrpc_incoming(incoming, shutdown)
                    .await
                    .map_err(anyhow::Error::from)
            })
        }
    };
    println!("READY {listen}");
    std::io::stdout().flush()?;
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n) = stdin.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    let _ = stop.send(());
    let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), server).await });
    println!("SERVED {}", served.load(Ordering::Relaxed));
    std::io::stdout().flush()?;
    drop(rt);
    Ok(())
}

/// A storm server process ([`serve_storm`]); killed on drop if still running.
struct StormServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl StormServer {
    fn spawn(t: Transport, listen: &str, clients: usize, generation: u8) -> Result<StormServer> {
        use std::io::BufRead as _;
        use std::process::{Command, Stdio};
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--role",
                "storm-serve",
                "--transport",
                t.name(),
                "--listen",
                listen,
            ])
            .args(["--cpu", &ThreadPlan::cpu(0).to_string()])
            .env(STORM_CLIENTS_ENV, clients.to_string())
            .env(STORM_GENERATION_ENV, generation.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let out = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("child stdout"))?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let s = StormServer {
            child,
            stdin,
            lines,
        };
        s.expect("READY ")?;
        Ok(s)
    }

    /// The rest of the next line starting with `prefix` (within 20 s).
    fn expect(&self, prefix: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|_| anyhow::anyhow!("the storm server said no {prefix:?} line"))?;
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok(rest.trim().to_owned());
            }
        }
    }

    fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Stops it (stdin closed): the calls it served.
    fn stop(mut self) -> Result<u64> {
        drop(self.stdin.take());
        Ok(self.expect("SERVED ")?.parse()?)
    }
}

impl Drop for StormServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one storm client saw ([`reconnect_storm`]).
#[derive(Debug, Default, Clone)]
struct StormTally {
    /// Answers from the first server.
    ok_before: u64,
    /// Answers from the restarted server (its generation in the answer).
    ok_after: u64,
    /// Of those, calls started before the kill was flagged (a call a channel held while it
    /// reconnected): counted by the flag, they would look lost.
    started_before: u64,
    failed: u64,
    /// The failures by gRPC code.
    codes: std::collections::BTreeMap<i32, u64>,
    failed_after_recovery: u64,
    recovered: Option<Instant>,
}

fn reconnect_storm(args: &SuiteArgs, client_rt: &Runtime) -> Result<Table> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let n = args.pick(100usize, 1000);
    let runs = args.pick(1usize, 3);
    // Descriptors: each rrpc connection holds a few on the client side.
    raise_nofile();
    let mut t = Table::new(
        "reconnect_storm",
        "Reconnect storm: every client answered again after its server restarts",
        &[
            "transport",
            "run",
            "clients",
            "recovery_ms",
            "x_vs_tcp",
            "answered_before",
            "failed_calls",
            "answered_after",
            "served_after",
            "lost",
            "fds_left",
        ],
    );
    let hang = Duration::from_secs(120);
    for run in 1..=runs {
        let mut tcp_ms = f64::NAN;
        for tr in [Transport::TonicTcp, Transport::RrpcFast] {
            let dir =
                std::env::temp_dir().join(format!("rrpc-bench-storm-{}-{run}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let (listen, target) = match (tr, crate::rpc::rdma_device()) {
                (Transport::TonicTcp, _) => {
                    let port = std::net::TcpListener::bind("127.0.0.1:0")?
                        .local_addr()?
                        .port();
                    (
                        format!("127.0.0.1:{port}"),
                        format!("http://127.0.0.1:{port}"),
                    )
                }
                (_, Some(_)) => {
                    let port = std::net::TcpListener::bind("127.0.0.1:0")?
                        .local_addr()?
                        .port();
                    let u = format!("rdma://127.0.0.1:{port}");
                    (u.clone(), u)
                }
                (_, None) => {
                    let u = format!("shm://{}/storm.sock", dir.display());
                    (u.clone(), u)
                }
            };
            let mut first = StormServer::spawn(tr, &listen, n, 1)?;
            let cfg = rrpc_config(tr);
            // One connection first: what the process keeps (the poller, runtime threads) is
            // not left behind by the storm.
            drop(client_rt.block_on(async {
                let mut c = connect_to(tr, &target, &cfg).await?;
                c.unary(small()).await?;
                anyhow::Ok(c)
            })?);
            std::thread::sleep(Duration::from_millis(200));
            let fds0 = open_fds();
            let killed = Arc::new(AtomicBool::new(false));
            let stop = Arc::new(AtomicBool::new(false));
            let recovered = Arc::new(AtomicU64::new(0));
            let started = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::with_capacity(n);
            for _ in 0..n {
                // Lazy channels start their tasks on the client runtime.
                let _rt = client_rt.enter();
                let mut c = match tr {
                    Transport::TonicTcp => {
                        let ch = tonic::transport::Endpoint::from_shared(target.clone())?
                            .tcp_nodelay(true)
                            .connect_lazy();
                        crate::rpc::AnyClient::Tonic(
                            crate::rpc::pb::bench_client::BenchClient::new(ch),
                        )
                    }
                    _ => {
                        let ch = rrpc_tonic::RrpcEndpoint::new(&target)?
                            .config(cfg.clone())
                            .connect_lazy()?;
                        crate::rpc::AnyClient::Rrpc(crate::rpc::pb::bench_client::BenchClient::new(
                            ch,
                        ))
                    }
                };
                let (killed, stop, recovered, started) = (
                    killed.clone(),
                    stop.clone(),
                    recovered.clone(),
                    started.clone(),
                );
                tasks.push(client_rt.spawn(async move {
                    let mut tally = StormTally::default();
                    let mut first_ok = false;
                    while !stop.load(Ordering::Acquire) {
                        let flagged = killed.load(Ordering::Acquire);
                        let r = tokio::time::timeout(hang, c.unary(small())).await;
                        let Ok(r) = r else {
                            anyhow::bail!("a call hung for {hang:?}");
                        };
                        match r {
                            Ok(resp) if resp.payload.first() == Some(&2) => {
                                tally.ok_after += 1;
                                if !flagged {
                                    tally.started_before += 1;
                                }
                                if tally.recovered.is_none() {
                                    tally.recovered = Some(Instant::now());
                                    recovered.fetch_add(1, Ordering::AcqRel);
                                }
                            }
                            Ok(_) => {
                                tally.ok_before += 1;
                                if !first_ok {
                                    first_ok = true;
                                    started.fetch_add(1, Ordering::AcqRel);
                                }
                            }
                            Err(st) => {
                                tally.failed += 1;
                                *tally.codes.entry(st.code() as i32).or_default() += 1;
                                if tally.recovered.is_some() {
                                    tally.failed_after_recovery += 1;
                                }
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                        // A call every ~20 ms per client: 1,000 clients make 50,000 calls a
                        // second together, with some in flight at the kill.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(tally)
                }));
            }
            // Every client answered by the first server.
            let t0 = Instant::now();
            while started.load(Ordering::Acquire) < n as u64 {
                anyhow::ensure!(
                    t0.elapsed() < hang,
                    "{}: {} of {n} clients connected",
                    tr.name(),
                    started.load(Ordering::Acquire)
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
            first.kill()?;
            killed.store(true, Ordering::Release);
            drop(first);
            let second = StormServer::spawn(tr, &listen, n, 2)?;
            let t_listen = Instant::now();
            while recovered.load(Ordering::Acquire) < n as u64 {
                anyhow::ensure!(
                    t_listen.elapsed() < hang,
                    "{}: {} of {n} clients answered again",
                    tr.name(),
                    recovered.load(Ordering::Acquire)
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let took = t_listen.elapsed();
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Release);
            let mut tallies = Vec::with_capacity(n);
            for task in tasks {
                tallies.push(client_rt.block_on(task)??);
            }
            let served = second.stop()?;
            // The clients' channels are dropped with their tasks: descriptors back?
            let t_fd = Instant::now();
            while open_fds() > fds0 && t_fd.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let fds_left = fds_per(fds0, open_fds(), 1);
            let _ = std::fs::remove_dir_all(&dir);
            let answered: u64 = tallies.iter().map(|c| c.ok_after).sum();
            let before: u64 = tallies.iter().map(|c| c.ok_before).sum();
            let failed: u64 = tallies.iter().map(|c| c.failed).sum();
            let after_recovery: u64 = tallies.iter().map(|c| c.failed_after_recovery).sum();
            let started_before: u64 = tallies.iter().map(|c| c.started_before).sum();
            let mut codes = std::collections::BTreeMap::<i32, u64>::new();
            for c in &tallies {
                for (k, v) in &c.codes {
                    *codes.entry(*k).or_default() += v;
                }
            }
            eprintln!(
                "reconnect_storm {} run {run}: failures by gRPC code {codes:?}; {started_before} \
                 answers from the restarted server to calls started before the kill was flagged",
                tr.name()
            );
            anyhow::ensure!(
                after_recovery == 0,
                "{}: {after_recovery} calls failed after their client was answered again",
                tr.name()
            );
            let ms = took.as_secs_f64() * 1e3;
            if tr == Transport::TonicTcp {
                tcp_ms = ms;
            }
            t.push(vec![
                if tr == Transport::TonicTcp {
                    "tonic-tcp".into()
                } else if crate::rpc::rdma_device().is_some() {
                    "rrpc-rdma-fast".into()
                } else {
                    "rrpc-shm-fast".into()
                },
                run.into(),
                n.into(),
                ms.into(),
                Ratio::of(ms, tcp_ms).into(),
                before.into(),
                failed.into(),
                answered.into(),
                served.into(),
                (served as i64 - answered as i64).into(),
                fds_left.into(),
            ]);
        }
    }
    t.note(format!(
        "Each run: {n} channels (lazy, reconnecting: tonic's Channel, RrpcChannel) on the \
         client runtime, each calling 64 B unary every ~20 ms (10 ms more after a failure); \
         the server (its own process, one worker) is killed with SIGKILL and started again at \
         the same address; recovery_ms is from the restarted server's READY (bound) to every \
         client's first answer from it. answered_before: calls the first server answered. failed_calls: calls that ended with a Status (in \
         flight at the kill, or made while the server was down). answered_after / \
         served_after: answers from the restarted server (each answer carries its server's \
         generation) that the clients saw, and the \
         restarted server's count (lost = served - answered: 0). fds_left: this process's \
         descriptors after the channels dropped, against before the storm (after one connection made and dropped: the process-wide poller and threads are not the storm's). The rrpc \
         server allows this process {} connections (max_connections_per_peer). RLIMIT_NOFILE \
         is raised to its hard limit.",
        n + 1
    ));
    Ok(t)
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (1,000 rrpc connections hold
/// several descriptors each).
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!("raising RLIMIT_NOFILE: {e}");
    }
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
    // Spare lanes: enough for a burst to find one while the refill's opens
    // are answered.
    const SPARE_LANES: usize = 8;
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
            "rrpc-shm-fast-pool4",
            Transport::RrpcFast,
            with(Transport::RrpcFast, &|b| b.connection_pool(4))?,
        ),
        (
            "rrpc-shm-fast-shared",
            Transport::RrpcFast,
            with(Transport::RrpcFast, &|b| b.shared_queue_pairs(true))?,
        ),
        (
            "rrpc-shm-fast-shared-spare8",
            Transport::RrpcFast,
            with(Transport::RrpcFast, &|b| {
                b.shared_queue_pairs(true).spare_connections(SPARE_LANES)
            })?,
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
        (
            "rrpc-port-shm-shared",
            Transport::RrpcPort,
            with(Transport::RrpcPort, &|b| {
                shm_only(b).shared_queue_pairs(true)
            })?,
        ),
        (
            "rrpc-port-shm-shared-spare8",
            Transport::RrpcPort,
            with(Transport::RrpcPort, &|b| {
                shm_only(b)
                    .shared_queue_pairs(true)
                    .spare_connections(SPARE_LANES)
            })?,
        ),
    ];
    // `RRPC_BENCH_SETUPS=a,b`: only the setups named (tonic-tcp is always
    // run, the baseline of every ratio), for a profile of one setup.
    let only: Option<Vec<String>> = std::env::var("RRPC_BENCH_SETUPS")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    for round in 1..=rounds {
        let (mut tcp_p50, mut tcp_rate) = (f64::NAN, f64::NAN);
        for (name, tr, cfg) in &setups {
            if *tr != Transport::TonicTcp
                && only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name))
            {
                continue;
            }
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
         spare_connections(2). pool4: connection_pool(4) at both ends (bundles of rings and queue pair made \
         ahead by a background thread). shared: shared_queue_pairs(true) at both ends (the warm-up \
         opens the shared connection; each timed connect is a logical connection over it). \
         shared-spare8: both, spare_connections(8): lanes opened ahead, all missing ones at \
         once, so that a connect takes an open lane and back-to-back connects run at the rate \
         the server answers pipelined opens."
    ));
    Ok(t)
}
