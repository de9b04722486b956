//! 1,000 concurrent calls on one connection.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports, payload};

async fn thousand_concurrent_calls(t: Transport) {
    let s = Harness::start(t).await;
    let c = s.client().await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..1000usize {
        let mut c = c.clone();
        set.spawn(async move {
            let r = c
                .unary(Input {
                    payload: payload(i % 300),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.payload, payload(i % 300));
        });
    }
    let mut n = 0;
    while let Some(r) = set.join_next().await {
        r.unwrap();
        n += 1;
    }
    assert_eq!(n, 1000);
}

on_all_transports!(thousand_concurrent_calls);
