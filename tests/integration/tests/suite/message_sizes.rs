//! Messages of 0 B, 1 B, 64 KiB, 4 MiB and one byte over the 4 MiB limit.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, assert_still_usable, on_all_transports, payload};
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
    assert_still_usable(&mut c).await;
}

/// A request over the client's own send limit (`max_encoding_message_size`)
/// never leaves the client. tonic's encoder fails the request body with
/// `OutOfRange`; over HTTP/2 (TCP and rrpc's HTTP/2 path) hyper turns a
/// failed request body into a stream reset, which tonic reports as
/// `Internal`. The fast path hands tonic's own `OutOfRange` to the caller:
/// a deliberate, pinned difference (the more precise status; rrpc cannot
/// change what tonic's `Channel` reports over TCP). The channel keeps
/// working on every transport.
async fn over_the_client_send_limit(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await.max_encoding_message_size(1024);
    let err = c
        .unary(Input {
            payload: payload(2048),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let want = match t {
        Transport::ShmFast | Transport::RdmaFast | Transport::PortShm | Transport::PortVerbs => {
            Code::OutOfRange
        }
        Transport::Tcp | Transport::PortTcp | Transport::ShmH2 | Transport::RdmaH2 => {
            Code::Internal
        }
    };
    assert_eq!(err.code(), want, "{t:?}: {err:?}");
    assert_still_usable(&mut c).await;
}

on_all_transports!(
    sizes_round_trip,
    one_byte_over_the_limit,
    over_the_client_send_limit
);
