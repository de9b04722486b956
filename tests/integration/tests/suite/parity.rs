//! tonic parity: what a tonic user relies on reads the same on every
//! transport (tcp, shm HTTP/2, shm fast path, and in `cargo xtask rxe` rdma
//! on both paths). This file has what the per-feature files do not:
//!
//! | behaviour | test |
//! |---|---|
//! | the four RPC kinds | `rpc_kinds.rs` |
//! | status codes from handlers, every code, trailers | `metadata.rs` |
//! | status codes from layers (bare HTTP errors) | `layers.rs` |
//! | status codes from the transport (peer gone, shutdown) | `shutdown.rs`, `cancellation.rs` |
//! | metadata, trailers, oversized headers | `metadata.rs` |
//! | binary metadata, extensions, routes | here |
//! | deadlines from the client and the server | `deadlines.rs`, `server_options.rs` |
//! | cancellation | `cancellation.rs` |
//! | compression | `compression.rs` |
//! | message-size limits on both sides | `message_sizes.rs` |
//! | interceptors and tower layers on both sides | `layers.rs` |
//! | lazy connect, reconnect, client options, user agent | `endpoint.rs` |
//! | load shedding, concurrency limits, max connection age | `server_options.rs` |
//! | panicking handlers | `panics.rs` |
//! | per-call flow control | `flow_control.rs` |

use rrpc_integration_tests::pb::{Input, Output};
use rrpc_integration_tests::{Harness, Transport, on_all_transports};
use tonic::Code;
use tonic::metadata::MetadataValue;

/// Binary metadata (`-bin` keys) arrives intact, bytes that are not text
/// included, and comes back in the response.
async fn binary_metadata_round_trips(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let bytes: Vec<u8> = (0..=255u8).collect();
    let mut req = tonic::Request::new(Input::default());
    req.metadata_mut()
        .insert_bin("x-echo-blob-bin", MetadataValue::from_bytes(&bytes));
    let r = c.unary(req).await.expect("call");
    let got = r
        .metadata()
        .get_bin("x-echo-blob-bin")
        .unwrap_or_else(|| panic!("{t:?}: no binary metadata in {:?}", r.metadata()))
        .to_bytes()
        .expect("base64");
    assert_eq!(&got[..], &bytes[..], "{t:?}");
}

/// An extension a server-side tower layer inserts reaches the handler.
async fn server_layer_extensions_reach_the_handler(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let r = c.unary(Input::default()).await.expect("call");
    assert_eq!(
        r.metadata().get("x-echo-ext").map(|v| v.to_str().unwrap()),
        Some("seen"),
        "{t:?}"
    );
}

/// A method or a service the server does not route reads `Unimplemented`,
/// and the channel goes on working.
async fn unrouted_methods_and_services_are_unimplemented(t: Transport) {
    let s = Harness::start(t).await;
    let ch = s.channel().await;
    for path in ["/test.Test/NoSuchMethod", "/no.such.Service/Unary"] {
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        grpc.ready().await.expect("ready");
        let err = grpc
            .unary::<Input, Output, _>(
                tonic::Request::new(Input::default()),
                http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .expect_err("not routed");
        assert_eq!(err.code(), Code::Unimplemented, "{t:?} {path}: {err:?}");
    }
    let mut c = rrpc_integration_tests::pb::test_client::TestClient::new(ch);
    c.unary(Input::default()).await.expect("still working");
}

on_all_transports!(
    binary_metadata_round_trips,
    server_layer_extensions_reach_the_handler,
    unrouted_methods_and_services_are_unimplemented,
);
