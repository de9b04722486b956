//! `RrpcConfig::shared_queue_pairs`: every connection from one client to
//! one server runs over one queue pair (KRCore's virtualized QP), and the
//! client caches that shared connection (`rrpc_core::meta::PeerCache`)
//! until its lease ends or its peer is seen down.
//!
//! On shm and, with feature `verbs` and `RRPC_TEST_DEVICE`, on verbs (the
//! harness asserts verbs carried the calls; tested on soft-RoCE, not run on
//! an RDMA NIC).

use std::time::{Duration, Instant};

use rrpc_core::conn::{self, HandshakeConfig, Offer, SharedConnection};
use rrpc_core::vqp::VqpConfig;
use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, config, on_rings};
use rrpc_tonic::{RrpcChannel, RrpcConfig, RrpcContext, RrpcEndpoint, SharedConnectionStats};

// On the rings transports only: tonic's TCP has no queue pairs to share.
on_rings!(
    connections_share_one_queue_pair,
    an_idle_shared_connection_closes_when_its_lease_ends,
    rings_are_made_ahead_for_the_next_connection,
    a_server_that_does_not_share_says_so,
    a_restarted_server_gets_a_new_shared_connection,
);
rrpc_integration_tests::on_port_rings!(
    connections_share_one_queue_pair,
    an_idle_shared_connection_closes_when_its_lease_ends,
    rings_are_made_ahead_for_the_next_connection,
    a_server_that_does_not_share_says_so,
    a_restarted_server_gets_a_new_shared_connection,
);

fn shared(t: Transport) -> RrpcConfig {
    config(t)
        .to_builder()
        .shared_queue_pairs(true)
        .build()
        .unwrap()
}

/// One unary call of 3000 bytes of `byte`, echoed whole (also `spare`'s).
pub(super) async fn call(c: &mut TestClient<RrpcChannel>, byte: u8) {
    let out = c
        .unary(Input {
            payload: vec![byte; 3000],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("call {byte}: {e:?}"));
    assert_eq!(out.into_inner().payload, vec![byte; 3000]);
}

fn opened(ctx: &RrpcContext) -> Vec<SharedConnectionStats> {
    ctx.shared_connections()
        .into_iter()
        .filter(|s| s.opened_here)
        .collect()
}

fn accepted(ctx: &RrpcContext) -> Vec<SharedConnectionStats> {
    ctx.shared_connections()
        .into_iter()
        .filter(|s| !s.opened_here)
        .collect()
}

/// Waits (bounded) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn connections_share_one_queue_pair(t: Transport) {
    let mut h = Harness::start_with(t, shared(t)).await;
    h.set_client_config(shared(t));
    let (scfg, ccfg) = (h.server_context().clone(), h.client_context().clone());
    let mut clients = Vec::new();
    for i in 0..4u8 {
        let mut c = h.client().await;
        call(&mut c, i).await;
        clients.push(c);
    }
    // Calls on every connection, concurrently, after all are up.
    let calls = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, mut c)| async move {
            call(&mut c, 0x40 + i as u8).await;
        });
    futures_util::future::join_all(calls).await;
    let (o, a) = (opened(&ccfg), accepted(&scfg));
    assert_eq!(o.len(), 1, "one shared connection from the client: {o:?}");
    assert_eq!(a.len(), 1, "one at the server: {a:?}");
    assert_eq!(o[0].logical_connections, 4, "{o:?}");
    assert_eq!(a[0].logical_connections, 4, "{a:?}");
    assert!(o[0].alive && a[0].alive);
    let provider = if t.is_rdma() {
        rrpc_core::ProviderKind::Verbs
    } else {
        rrpc_core::ProviderKind::Shm
    };
    assert_eq!((o[0].provider, a[0].provider), (provider, provider));
    assert!(o[0].queue_pair.posted > 0 && a[0].queue_pair.posted > 0);
    // Connections go, the shared connection stays (its lease runs), and the
    // next connection runs over it.
    drop(clients);
    until("the server's logical connections closed", || {
        accepted(&scfg)[0].logical_connections == 0
    })
    .await;
    let mut c = h.client().await;
    call(&mut c, 9).await;
    let o = opened(&ccfg);
    assert_eq!(o.len(), 1, "{o:?}");
    assert_eq!(o[0].logical_connections, 1, "{o:?}");
    assert_eq!(accepted(&scfg).len(), 1);
}

/// A shared connection with no connection over it is closed once its lease
/// ends, with no later connect to look at the cache: its socket, queue
/// pair and rings are not held until the process dials again (the soak's
/// descriptor count caught them). The server's end goes with it.
async fn an_idle_shared_connection_closes_when_its_lease_ends(t: Transport) {
    let lease = Duration::from_millis(400);
    let cfg = shared(t).to_builder().peer_lease(lease).build().unwrap();
    let mut h = Harness::start_with(t, cfg.clone()).await;
    h.set_client_config(cfg);
    let (scfg, ccfg) = (h.server_context().clone(), h.client_context().clone());
    let mut c = h.client().await;
    call(&mut c, 1).await;
    assert_eq!(opened(&ccfg).len(), 1);
    // In use: kept past its lease.
    tokio::time::sleep(lease * 3).await;
    assert_eq!(
        opened(&ccfg).len(),
        1,
        "closed while a connection ran over it"
    );
    call(&mut c, 2).await;
    drop(c);
    until("the idle shared connection closed at the client", || {
        opened(&ccfg).is_empty()
    })
    .await;
    until("and at the server", || accepted(&scfg).is_empty()).await;
    // The next connect opens a new one.
    let mut c = h.client().await;
    call(&mut c, 3).await;
    assert_eq!(opened(&ccfg).len(), 1);
}

/// With a pool, each end keeps ring pairs made ahead in the shared
/// connection's protection domain; a connection takes one and a
/// replacement is made after it is up. (On shm the pool is off by default,
/// so the test asks for it.)
async fn rings_are_made_ahead_for_the_next_connection(t: Transport) {
    let mut h = Harness::start_with(
        t,
        shared(t).to_builder().connection_pool(2).build().unwrap(),
    )
    .await;
    h.set_client_config(shared(t).to_builder().connection_pool(2).build().unwrap());
    let (scfg, ccfg) = (h.server_context().clone(), h.client_context().clone());
    // On shm the connections are lanes, whose rings are slots of the arenas
    // granted when the shared connection opened: no spare is made.
    let lanes = !t.is_rdma();
    let spares_are = |n: usize| {
        let n = if lanes { 0 } else { n };
        let (o, a) = (opened(&ccfg), accepted(&scfg));
        o.len() == 1
            && a.len() == 1
            && o[0].spare_rings == n
            && a[0].spare_rings == n
            && (o[0].lanes, a[0].lanes) == (lanes, lanes)
    };
    let mut first = h.client().await;
    call(&mut first, 1).await;
    until("two spare ring pairs at each end", || spares_are(2)).await;
    let mut clients = Vec::new();
    for i in 0..3u8 {
        let mut c = h.client().await;
        call(&mut c, 2 + i).await;
        clients.push(c);
    }
    until("the spares made again", || spares_are(2)).await;
    assert_eq!(opened(&ccfg)[0].logical_connections, 4);
    for (i, c) in clients.iter_mut().enumerate() {
        call(c, 0x20 + i as u8).await;
    }
}

async fn a_server_that_does_not_share_says_so(t: Transport) {
    let h = Harness::start_with(t, config(t)).await;
    let e = RrpcChannel::connect(&h.uri, shared(t))
        .await
        .expect_err("a server that does not share refuses a shared connection");
    assert!(e.to_string().contains("does not share queue pairs"), "{e}");
    // Its own clients are served as ever.
    let mut c = h.client().await;
    call(&mut c, 1).await;
}

async fn a_restarted_server_gets_a_new_shared_connection(t: Transport) {
    // One client context across both servers: its cache of shared connections.
    let ccfg = shared(t);
    let cctx = RrpcContext::new(&ccfg);
    let mut h1 = Harness::start_with(t, shared(t)).await;
    h1.set_client(ccfg.clone(), cctx.clone());
    let mut c = h1.client().await;
    call(&mut c, 1).await;
    drop(c);
    let uri = h1.uri.clone();
    // The server dies; its shared connection is still held (by `h1`'s
    // context, as a process that hangs would), so the client's cached one
    // looks alive.
    h1.kill();
    let mut h2 = Harness::start_at(t, &uri, shared(t), |s| s).await;
    h2.set_client(ccfg.clone(), cctx.clone());
    let (scfg2, ccfg) = (h2.server_context().clone(), cctx);
    // The new server does not know the cached id: the client opens a new
    // shared connection and the call works.
    let mut c = h2.client().await;
    call(&mut c, 2).await;
    let a = accepted(&scfg2);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].logical_connections, 1);
    let o = opened(&ccfg);
    assert_eq!(o.len(), 1, "the stale one was dropped: {o:?}");
    assert_eq!(o[0].logical_connections, 1);
    // The first server's end goes with its context: the client's old shared
    // connection was already forgotten, and nothing else is affected.
    drop(h1);
    call(&mut c, 3).await;
}

/// A client that names a shared connection it did not open (a guessed id)
/// is refused, and the owner's connections go on.
async fn a_guessed_shared_connection_id_is_refused(t: Transport) {
    let mut h = Harness::start_with(t, shared(t)).await;
    h.set_client_config(shared(t));
    let scfg = h.server_context().clone();
    let mut owner = h.client().await;
    call(&mut owner, 1).await;
    let uri = h.uri.clone();
    let refused = tokio::task::spawn_blocking(move || {
        let ep = rrpc_core::FabricAddr::parse(&uri).expect("rings uri");
        let fabric = rrpc_integration_tests::raw_fabric(t);
        let hs = HandshakeConfig::default();
        // A shared connection of its own, opened by hand ("RRPA").
        let c = conn::connect(
            &ep,
            fabric
                .create_qp(&rrpc_core::QpConfig::default())
                .expect("qp"),
            Offer::new().section(rrpc_tonic::frame::HANDSHAKE_SECTION, b"RRPA".to_vec()),
            &hs,
        )
        .expect("open");
        let mine = SharedConnection::new(c, VqpConfig::default()).expect("share");
        // A logical hello naming an id it guessed.
        let mut app = rrpc_tonic::frame::path_hello(0, 64 << 10).to_vec();
        app.extend_from_slice(b"RRPL");
        app.extend_from_slice(&[0x5a; 16]);
        app.extend_from_slice(&0u32.to_le_bytes());
        let offer = Offer::new().section(rrpc_tonic::frame::HANDSHAKE_SECTION, app);
        let refused =
            conn::connect_logical(&ep, &mine, 0, offer, &hs).expect_err("a guessed id is refused");
        (refused, mine)
    })
    .await
    .expect("task");
    let (refused, mine) = refused;
    assert!(
        matches!(&refused, rrpc_core::Error::Rejected(r) if r.contains("no shared connection with that id")),
        "{refused}"
    );
    call(&mut owner, 2).await;
    assert_eq!(
        accepted(&scfg).len(),
        2,
        "the owner's and the guesser's own"
    );
    // The guesser's own goes once its side channel closes; the owner's stays.
    drop(mine);
    until(
        "the guesser's shared connection dropped at the server",
        || accepted(&scfg).len() == 1,
    )
    .await;
    call(&mut owner, 3).await;
}

/// The guessed id on every rings transport.
mod guessed_id {
    use super::a_guessed_shared_connection_id_is_refused;

    rrpc_integration_tests::on_rings!(a_guessed_shared_connection_id_is_refused);
}

mod lanes {
    use super::{
        a_lane_peer_that_breaks_the_protocol_loses_only_its_own,
        lanes_dropped_as_soon_as_answered_leave_nothing,
        lanes_many_at_once_and_a_dropped_connect_leave_nothing,
    };

    rrpc_integration_tests::on_shm!(
        lanes_dropped_as_soon_as_answered_leave_nothing,
        lanes_many_at_once_and_a_dropped_connect_leave_nothing,
        a_lane_peer_that_breaks_the_protocol_loses_only_its_own,
    );
}

mod ahead {
    use super::{
        a_lane_opened_ahead_past_the_servers_limit_fails_its_calls_with_the_reason,
        lanes_after_the_first_are_opened_ahead_and_carry_their_first_call,
    };

    rrpc_integration_tests::on_shm!(
        lanes_after_the_first_are_opened_ahead_and_carry_their_first_call,
        a_lane_opened_ahead_past_the_servers_limit_fails_its_calls_with_the_reason,
    );
}

/// After the first lane, the server grants the client slots ahead, and a
/// connect opens its lane into one without waiting for the answer (0-RTT,
/// `rrpc-tonic` `sharing` docs): each of these connects is opened ahead
/// while slots are in hand, its first call carried at once; the server
/// accepted as many ahead; every lane closes at both ends afterwards.
///
/// Each first call must be answered within a bound far below the rings'
/// sizing tick (made long here): a request whose ring records the server
/// reset after the client wrote them would be seen only when the client's
/// next tick writes its tail again.
async fn lanes_after_the_first_are_opened_ahead_and_carry_their_first_call(t: Transport) {
    let slow_tick = |c: RrpcConfig| {
        c.to_builder()
            .ring_shrink_after(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let mut h = Harness::start_with(t, slow_tick(shared(t))).await;
    h.set_client_config(slow_tick(shared(t)));
    let (scfg, ccfg) = (h.server_context().clone(), h.client_context().clone());
    let mut first = h.client().await;
    call(&mut first, 1).await;
    assert_eq!(
        opened(&ccfg)[0].lanes_opened_ahead,
        0,
        "the first one waits"
    );
    let ahead = rrpc_core::conn::mux::MAX_AHEAD;
    let mut clients = Vec::new();
    for i in 0..12u8 {
        until("slots granted ahead in the client's hand", || {
            opened(&ccfg)[0].lanes_ahead == ahead
        })
        .await;
        let mut c = h.client().await;
        assert_eq!(
            opened(&ccfg)[0].lanes_opened_ahead,
            u64::from(i) + 1,
            "connect {i} opened ahead"
        );
        tokio::time::timeout(Duration::from_secs(10), call(&mut c, 0x20 + i))
            .await
            .unwrap_or_else(|_| panic!("the first call of connect {i} was not answered"));
        clients.push(c);
    }
    assert_eq!(accepted(&scfg)[0].lanes_opened_ahead, 12);
    // Connects back to back take the slots in hand, then wait for answers.
    let burst: Vec<_> = futures_util::future::join_all((0..8u8).map(|i| {
        let hh = &h;
        async move {
            let mut c = hh.client().await;
            call(&mut c, 0x40 + i).await;
            c
        }
    }))
    .await;
    assert!(
        opened(&ccfg)[0].lanes_opened_ahead > 12,
        "the burst took slots in hand"
    );
    assert_eq!(opened(&ccfg)[0].logical_connections, 1 + 12 + 8);
    drop((clients, burst, first));
    until("every lane closed at both ends", || {
        opened(&ccfg)[0].logical_connections == 0 && accepted(&scfg)[0].logical_connections == 0
    })
    .await;
    assert_eq!(
        opened(&ccfg)[0].lanes_opened_ahead,
        accepted(&scfg)[0].lanes_opened_ahead
    );
}

/// A lane opened ahead past the server's connection limit per peer: the
/// connect returned (it waits for nothing), and its first call fails
/// `ResourceExhausted` with the server's reason, as a connect refused
/// does; the lanes within the limit go on serving.
async fn a_lane_opened_ahead_past_the_servers_limit_fails_its_calls_with_the_reason(t: Transport) {
    let server = shared(t)
        .to_builder()
        .max_connections_per_peer(2)
        .build()
        .unwrap();
    let mut h = Harness::start_with(t, server).await;
    h.set_client_config(shared(t));
    let ccfg = h.client_context().clone();
    let mut first = h.client().await;
    call(&mut first, 1).await;
    let ahead = rrpc_core::conn::mux::MAX_AHEAD;
    until("slots granted ahead in the client's hand", || {
        opened(&ccfg)[0].lanes_ahead == ahead
    })
    .await;
    let mut second = h.client().await;
    call(&mut second, 2).await;
    // Refused after the connect returned: its first call fails. On HTTP/2
    // the connect's own handshake may see the refusal first.
    let third = RrpcEndpoint::new(&h.uri)
        .unwrap()
        .config(shared(t))
        .context(ccfg.clone())
        .connect()
        .await;
    assert!(opened(&ccfg)[0].lanes_opened_ahead >= 2);
    match third {
        Ok(ch) => {
            let e = TestClient::new(ch)
                .unary(Input {
                    payload: vec![3; 100],
                    ..Default::default()
                })
                .await
                .expect_err("past the limit");
            // On HTTP/2 a call can find the connection lost first
            // (`Unavailable`), its message still naming the refusal.
            assert!(
                e.code() == tonic::Code::ResourceExhausted
                    || (t == Transport::ShmH2 && e.code() == tonic::Code::Unavailable),
                "{e:?}"
            );
            assert!(
                e.message().contains("max_connections_per_peer"),
                "names the limit: {e:?}"
            );
        }
        // A known gap: hyper's handshake fails first and says only
        // "transport error" (journal, "A review of the change").
        Err(e) => {
            assert_eq!(t, Transport::ShmH2, "{e}");
            let st = e.status();
            assert!(
                (st.code() == tonic::Code::ResourceExhausted
                    && st.message().contains("max_connections_per_peer"))
                    || st.code() == tonic::Code::Unavailable,
                "{st:?}"
            );
        }
    }
    call(&mut first, 4).await;
    call(&mut second, 5).await;
    // The refused channel does not open lane after lane meanwhile.
    let n = opened(&ccfg)[0].lanes_opened_ahead;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(opened(&ccfg)[0].lanes_opened_ahead <= n + 1);
}

/// On shm, connections over a shared connection are lanes (one message on
/// its side channel each, rings in arena slots): forty connect at once
/// and call, a connect given up half-way leaves nothing behind, and once
/// all are dropped every lane is closed at both ends (the close handshake
/// ran), the arenas hold little memory (each slot's pages were given
/// back, but for the `LANE_WARM_SLOTS` kept warm)
/// and the next connect is a lane again.
async fn lanes_many_at_once_and_a_dropped_connect_leave_nothing(t: Transport) {
    let mut h = Harness::start_with(t, shared(t)).await;
    h.set_client_config(shared(t));
    let (scfg, ccfg) = (h.server_context().clone(), h.client_context().clone());
    let mut first = h.client().await;
    call(&mut first, 1).await;
    let o = opened(&ccfg);
    assert!(o[0].lanes && accepted(&scfg)[0].lanes, "{o:?}");
    let hh = &h;
    const N: usize = 40;
    let clients = futures_util::future::join_all((0..N as u8).map(|i| async move {
        let mut c = hh.client().await;
        call(&mut c, 0x10 + i).await;
        c
    }))
    .await;
    assert_eq!(opened(&ccfg)[0].logical_connections, N + 1);
    // Each end's arenas hold the pages of the slots in use (the rings
    // written by the calls); once every lane is closed, none.
    let busy = (
        opened(&ccfg)[0].lane_arena_bytes,
        accepted(&scfg)[0].lane_arena_bytes,
    );
    assert!(busy.0 > 0 && busy.1 > 0, "{busy:?}");
    // Connects given up before their answer (dropped at their first wait).
    for _ in 0..4 {
        let _ = tokio::time::timeout(Duration::from_micros(1), h.client()).await;
    }
    drop(clients);
    drop(first);
    until("every lane closed at both ends", || {
        opened(&ccfg)[0].logical_connections == 0 && accepted(&scfg)[0].logical_connections == 0
    })
    .await;
    // At most `LANE_WARM_SLOTS` (16) of the 45 slots used keep their
    // pages once the close handshakes are done (a lane's sharer goes
    // before); every lane wrote as much (one call each). The server also
    // keeps the slots it granted the client ahead (`MAX_AHEAD` at most).
    let warm = rrpc_core::conn::LANE_WARM_SLOTS + 1;
    let ahead = rrpc_core::conn::mux::MAX_AHEAD;
    until("the arenas' memory given back", || {
        opened(&ccfg)[0].lane_arena_bytes * (N + 1) <= busy.0 * warm
            && accepted(&scfg)[0].lane_arena_bytes * (N + 1) <= busy.1 * (warm + ahead)
    })
    .await;
    let mut c = h.client().await;
    call(&mut c, 2).await;
    let (o, a) = (opened(&ccfg), accepted(&scfg));
    assert_eq!((o.len(), a.len()), (1, 1), "{o:?} {a:?}");
    assert!(o[0].alive && o[0].lanes);
    assert_eq!(o[0].logical_connections, 1);
}

/// Lanes connected and dropped one after another, each as soon as its
/// connect returns (the connect bench's loop), more of them than an arena
/// has slots: every connect succeeds (a lane or, past a full arena at
/// either end, a logical handshake), and every one is closed at both ends
/// afterwards (each end's connection of a lane closed before the other's
/// was set up still ends, and gives its slots back).
async fn lanes_dropped_as_soon_as_answered_leave_nothing(t: Transport) {
    let mut h = Harness::start_with(t, shared(t)).await;
    h.set_client_config(shared(t));
    let (scfg, ccfg) = (h.server_context().clone(), h.client_context().clone());
    let mut first = h.client().await;
    call(&mut first, 1).await;
    // Three times the 64 slots of an arena (`LANE_SLOTS`).
    for i in 0..192 {
        let c = h.client().await;
        drop(c);
        if i % 16 == 15 {
            tokio::task::yield_now().await;
        }
    }
    let (o, a) = (opened(&ccfg), accepted(&scfg));
    assert!(o[0].lanes && a[0].lanes, "{o:?} {a:?}");
    drop(first);
    until("every lane closed at both ends", || {
        opened(&ccfg)[0].logical_connections == 0 && accepted(&scfg)[0].logical_connections == 0
    })
    .await;
}

/// Two clients of one server; one opens a shared connection with lanes by
/// hand and breaks the protocol: a lane naming memory outside the arena it
/// granted, then (a second time) bytes that are no message. Each time the
/// server closes that shared connection, and only it: the honest client's
/// calls go on, on its own shared connection.
async fn a_lane_peer_that_breaks_the_protocol_loses_only_its_own(t: Transport) {
    use rrpc_core::conn::mux::{MuxLimits, MuxRole, Parts, Slice};
    use rrpc_core::conn::{LaneArenas, ROLE_ARENA};
    let mut h = Harness::start_with(t, shared(t)).await;
    h.set_client_config(shared(t));
    let scfg = h.server_context().clone();
    let mut honest = h.client().await;
    call(&mut honest, 1).await;
    for garbage in [false, true] {
        let uri = h.uri.clone();
        let bad = tokio::task::spawn_blocking(move || {
            let ep = rrpc_core::FabricAddr::parse(&uri).expect("rings uri");
            let fabric = rrpc_integration_tests::raw_fabric(t).without_huge_pages();
            let arenas = LaneArenas::new(&fabric, 2, 8192, 8192).expect("arenas");
            let offer = arenas
                .add_to_offer(
                    Offer::new().section(rrpc_tonic::frame::HANDSHAKE_SECTION, b"RRPA".to_vec()),
                )
                .expect("offer");
            let c = conn::connect(
                &ep,
                fabric
                    .create_qp(&rrpc_core::QpConfig::default())
                    .expect("qp"),
                offer,
                &HandshakeConfig::default(),
            )
            .expect("open");
            assert!(
                c.peer().region(ROLE_ARENA).is_some(),
                "the server grants its arena"
            );
            let s = SharedConnection::with_lanes(
                c,
                VqpConfig::default(),
                MuxRole::Client,
                arenas,
                MuxLimits::default(),
            )
            .expect("lanes");
            if garbage {
                use std::io::Write;
                let fd = s
                    .connection()
                    .liveness_fd()
                    .expect("a shared connection has a side channel")
                    .try_clone_to_owned()
                    .expect("dup");
                std::fs::File::from(fd)
                    .write_all(b"RRPM\x09\x00\x00\x00 not a message")
                    .expect("write");
            } else {
                let far = Slice {
                    arena: 0,
                    offset: 1 << 40,
                    len: 8192,
                };
                let parts = Parts {
                    sections: vec![],
                    slices: vec![(0x5242, far)],
                };
                s.lane_open(0, parts).expect("sent");
            }
            s
        })
        .await
        .expect("task");
        // The server closes it: the client reads its side channel's end.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match bad.lane_poll() {
                Err(e) => {
                    assert!(matches!(e, rrpc_core::Error::PeerGone), "{e}");
                    break;
                }
                Ok(ev) => assert!(ev.is_empty(), "{ev:?}"),
            }
            assert!(Instant::now() < deadline, "the server never closed it");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let live = accepted(&scfg).iter().filter(|a| a.alive).count();
        assert_eq!(live, 1, "only the honest client's is left");
        call(&mut honest, 2).await;
        let mut again = h.client().await;
        call(&mut again, 3).await;
    }
}
