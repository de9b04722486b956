//! Deadlines (`grpc-timeout`) expire on every transport with the same status.

use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports};
use tonic::{Code, Request};

async fn deadline_expires(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut req = Request::new(Input {
        delay_ms: 5_000,
        ..Default::default()
    });
    req.set_timeout(Duration::from_millis(100));
    let err = tokio::time::timeout(Duration::from_secs(4), c.unary(req))
        .await
        .expect("deadline honoured")
        .unwrap_err();
    // tonic reports an expired deadline as `Cancelled: Timeout expired`; every transport must agree.
    assert_eq!(err.code(), Code::Cancelled, "{err:?}");
    assert!(err.message().contains("Timeout expired"), "{err:?}");
    // The connection is still usable.
    let mut ok = Request::new(Input::default());
    ok.set_timeout(Duration::from_secs(5));
    c.unary(ok).await.unwrap();
}

on_all_transports!(deadline_expires);
