//! Messages of 0 B, 1 B, 64 KiB, 4 MiB and one byte over the 4 MiB limit.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports, payload};
use tonic::Code;

/// Payload length whose encoded `Input` is exactly 4 MiB (1 tag byte + 4 length bytes).
const AT_LIMIT: usize = (4 << 20) - 5;

async fn sizes_round_trip(t: Transport) {
    let s = Harness::start(t).await;
    // The limit under test is the request direction; the echo reply is a few bytes larger.
    let mut c = s.client().await.max_decoding_message_size(8 << 20);
    for n in [0usize, 1, 64 << 10, AT_LIMIT] {
        let r = c
            .unary(Input {
                payload: payload(n),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.total, n as u64);
        assert!(r.payload == payload(n), "payload of {n} bytes corrupted");
    }
}

async fn one_byte_over_the_limit(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let err = c
        .unary(Input {
            payload: payload(AT_LIMIT + 1),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{err:?}"
    );
    assert!(err.message().contains("too large"), "{err:?}");
    // The connection is still usable.
    let r = c
        .unary(Input {
            payload: payload(7),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.total, 7);
}

on_all_transports!(sizes_round_trip, one_byte_over_the_limit);
