//! Client cancellation reaches the server handler.

use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports};

async fn dropping_the_call_cancels_the_handler(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let tag = format!("cancel-{t:?}");
    let mut st = c
        .server_stream(Input {
            count: 1_000_000,
            delay_ms: 2,
            tag: tag.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(st.message().await.unwrap().is_some());
    drop(st);
    tokio::time::timeout(Duration::from_secs(5), s.obs.cancel_seen.notified())
        .await
        .expect("handler saw the cancellation");
    assert_eq!(*s.obs.cancelled.lock().unwrap(), vec![tag]);
    // The connection survives the cancellation.
    c.unary(Input::default()).await.unwrap();
}

on_all_transports!(dropping_the_call_cancels_the_handler);
