//! `RrpcConfig::connection_pool`: connections take a queue pair and ring
//! regions made ahead of time (KRCore's pre-initialised bundles), and calls
//! work on them exactly as on fresh ones.

use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, config, on_rings};

/// Waits (bounded) until every pool of `cfg` holds `n` ready bundles.
async fn until_ready(cfg: &rrpc_tonic::RrpcContext, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cfg.pool_stats().iter().all(|(_, s)| s.ready >= n) {
        assert!(
            Instant::now() < deadline,
            "pool never refilled: {:?}",
            cfg.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn connections_take_pooled_resources(t: Transport) {
    // Server and client share the harness's context (one process), hence one pool.
    let s = Harness::start_with(
        t,
        config(t).to_builder().connection_pool(2).build().unwrap(),
    )
    .await;
    let cfg = s.server_context();
    assert_eq!(
        cfg.pool_stats().len(),
        1,
        "the server's bind started the pool"
    );
    until_ready(cfg, 2).await;
    for i in 0..5u32 {
        let mut c = TestClient::new(s.channel().await);
        let out = c
            .unary(Input {
                payload: vec![i as u8; 100],
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{t:?}: call {i}: {e:?}"));
        assert_eq!(out.into_inner().payload, vec![i as u8; 100]);
        drop(c);
        until_ready(cfg, 2).await;
    }
    let (_, st) = cfg.pool_stats()[0];
    // Each connection takes two bundles (client and server); all from the pool.
    assert!(st.hits >= 10, "{t:?}: {st:?}");
    assert_eq!(st.misses, 0, "{t:?}: {st:?}");
    // Two ready bundles, each both ring regions (at least 2 x ring_size), under the bound.
    let ring = cfg.config().ring_size() as u64;
    assert!(st.bytes_held >= 2 * 2 * ring, "{t:?}: {st:?}");
    assert!(
        st.bytes_held <= cfg.config().connection_pool_memory(),
        "{t:?}: {st:?}"
    );
}

/// A memory bound smaller than one bundle: the pool holds nothing (the made bundle is
/// dropped and counted), and every connect builds its own, never refused.
async fn a_pool_at_its_memory_bound_builds_inline(t: Transport) {
    let cfg = config(t)
        .to_builder()
        .connection_pool(4)
        .connection_pool_memory(1 << 20)
        .build()
        .unwrap();
    let s = Harness::start_with(t, cfg).await;
    let cfg = s.server_context();
    let deadline = Instant::now() + Duration::from_secs(20);
    while cfg.pool_stats().iter().all(|(_, s)| s.over_budget == 0) {
        assert!(Instant::now() < deadline, "{:?}", cfg.pool_stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for i in 0..3u32 {
        let mut c = TestClient::new(s.channel().await);
        c.unary(Input {
            payload: vec![i as u8; 10],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{t:?}: call {i}: {e:?}"));
    }
    let (_, st) = cfg.pool_stats()[0];
    assert_eq!(
        (st.ready, st.bytes_held, st.hits),
        (0, 0, 0),
        "{t:?}: {st:?}"
    );
    assert!(st.misses >= 6, "{t:?}: {st:?}");
    assert!(st.over_budget >= 1, "{t:?}: {st:?}");
}

/// The default: pooled on `rdma://` (where a connection's registrations
/// and queue pair are most of a connect), off on `shm://` and TCP.
async fn pool_by_default_on_rdma_only(t: Transport) {
    let cfg = config(t);
    assert_eq!(cfg.connection_pool(), None);
    let s = Harness::start_with(t, cfg).await;
    let mut c = s.client().await;
    c.unary(Input::default()).await.unwrap();
    let stats = s.server_context().pool_stats();
    match t {
        Transport::Tcp
        | Transport::PortTcp
        | Transport::ShmH2
        | Transport::ShmFast
        | Transport::PortShm => {
            assert!(stats.is_empty(), "{t:?}: {stats:?}");
        }
        Transport::RdmaH2 | Transport::RdmaFast | Transport::PortVerbs => {
            assert_eq!(stats.len(), 1, "{t:?}: {stats:?}");
            assert_eq!(stats[0].0, rrpc_core::ProviderKind::Verbs);
            let st = &stats[0].1;
            assert!(st.hits + st.misses >= 2, "{t:?}: {st:?}");
        }
    }
    let off = config(t).to_builder().connection_pool(0).build().unwrap();
    assert_eq!(off.connection_pool_for(rrpc_core::ProviderKind::Verbs), 0);
    assert_eq!(
        config(t).connection_pool_for(rrpc_core::ProviderKind::Verbs),
        rrpc_tonic::DEFAULT_RDMA_CONNECTION_POOL
    );
}

// On the rings transports only: tonic's TCP has nothing to pool.
on_rings!(
    connections_take_pooled_resources,
    a_pool_at_its_memory_bound_builds_inline,
);
rrpc_integration_tests::on_port_rings!(
    connections_take_pooled_resources,
    a_pool_at_its_memory_bound_builds_inline,
);

/// The default on every transport, TCP included (which pools nothing).
mod defaults {
    use super::pool_by_default_on_rdma_only;

    rrpc_integration_tests::on_all_transports!(pool_by_default_on_rdma_only);
}
