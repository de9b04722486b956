//! Metadata both ways, trailers, and every status code.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports, payload};
use tonic::{Code, Request};

async fn metadata_both_ways(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut req = Request::new(Input {
        payload: payload(3),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-echo-a", "alpha".parse().unwrap());
    req.metadata_mut()
        .insert("x-echo-b", "beta".parse().unwrap());
    let r = c.unary(req).await.unwrap();
    assert_eq!(r.metadata().get("x-echo-a").unwrap(), "alpha");
    assert_eq!(r.metadata().get("x-echo-b").unwrap(), "beta");
}

async fn trailers_carry_status_and_metadata(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    // A streaming call that ends with an error after its messages: status in real trailers.
    let mut st = c
        .server_stream(Input {
            count: 3,
            fail_code: Code::Aborted as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..3 {
        assert!(st.message().await.unwrap().is_some());
    }
    let err = st.message().await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(err.message(), "failed with 10");
    assert_eq!(err.metadata().get("x-err-meta").unwrap(), "trailing");
}

async fn every_code_reaches_the_caller(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    for code in 1..=16 {
        let err = c
            .unary(Input {
                fail_code: code,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::from(code), "code {code}");
        assert_eq!(err.message(), format!("failed with {code}"));
        assert_eq!(err.metadata().get("x-err-meta").unwrap(), "trailing");
    }
}

/// Request metadata beyond 16 KiB (hyper's HTTP/2 server limit) is
/// refused with HTTP 431, which tonic reports as `Unknown`, on every
/// transport; the channel keeps working. Before, the fast path had no
/// limit and 20 KiB passed.
async fn oversized_request_headers_are_refused(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut req = tonic::Request::new(Input::default());
    req.metadata_mut()
        .insert("x-big", "a".repeat(20 << 10).parse().unwrap());
    let err = c.unary(req).await.expect_err("20 KiB of metadata");
    assert_eq!(err.code(), Code::Unknown, "{t:?}: {err:?}");
    // Below the limit passes.
    let mut req = tonic::Request::new(Input::default());
    req.metadata_mut()
        .insert("x-big", "a".repeat(8 << 10).parse().unwrap());
    c.unary(req).await.expect("8 KiB of metadata");
}

on_all_transports!(
    oversized_request_headers_are_refused,
    metadata_both_ways,
    trailers_carry_status_and_metadata,
    every_code_reaches_the_caller
);
