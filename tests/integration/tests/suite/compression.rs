//! gzip compression both ways.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports};
use tonic::codec::CompressionEncoding;

async fn gzip_both_ways(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s
        .client()
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let body = vec![b'z'; 256 << 10];
    let r = c
        .unary(Input {
            payload: body.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        r.metadata()
            .get("grpc-encoding")
            .map(|v| v.to_str().unwrap()),
        Some("gzip")
    );
    assert_eq!(r.into_inner().payload, body);
}

on_all_transports!(gzip_both_ways);
