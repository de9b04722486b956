//! A tower layer and an interceptor on both sides.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, on_all_transports};
use tonic::{Code, Request, Status};

async fn layers_and_interceptors(t: Transport) {
    let s = Harness::start(t).await;
    let ch = s.channel().await;
    // Client tower layer: adds a header the server echoes (x-echo-*).
    let layered = tower::ServiceBuilder::new()
        .map_request(|mut r: http::Request<tonic::body::Body>| {
            r.headers_mut()
                .insert("x-echo-layer", http::HeaderValue::from_static("client"));
            r
        })
        .service(ch.clone());
    let mut c = TestClient::new(layered);
    let r = c.unary(Input::default()).await.unwrap();
    assert_eq!(r.metadata().get("x-echo-layer").unwrap(), "client");
    // Server tower layer marked the response.
    assert_eq!(r.metadata().get("x-layer").unwrap(), "server");

    // Client interceptor; the server interceptor denies calls carrying x-deny.
    let mut c =
        TestClient::with_interceptor(ch, |mut r: Request<()>| -> Result<Request<()>, Status> {
            r.metadata_mut()
                .insert("x-echo-int", "yes".parse().unwrap());
            Ok(r)
        });
    let r = c.unary(Input::default()).await.unwrap();
    assert_eq!(r.metadata().get("x-echo-int").unwrap(), "yes");
    let mut denied = Request::new(Input::default());
    denied.metadata_mut().insert("x-deny", "1".parse().unwrap());
    let err = c.unary(denied).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), "denied by interceptor");
}

/// A server layer that answers with a bare HTTP error (no `grpc-status`,
/// as a proxy would): the caller gets the code the gRPC spec maps the HTTP
/// status to, the same on every transport. Before, the fast path never
/// sent the HTTP status and every such call read `Unknown` ("missing
/// grpc-status").
async fn bare_http_errors_map_to_grpc_codes(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = TestClient::new(s.channel().await);
    for (http, code) in [
        (502, Code::Unavailable),
        (503, Code::Unavailable),
        (404, Code::Unimplemented),
        (401, Code::Unauthenticated),
        (403, Code::PermissionDenied),
        (400, Code::Internal),
        (418, Code::Unknown),
    ] {
        let mut req = Request::new(Input::default());
        req.metadata_mut()
            .insert("x-http-status", http.to_string().parse().unwrap());
        let err = c.unary(req).await.expect_err("the layer fails the call");
        assert_eq!(err.code(), code, "HTTP {http} on {t:?}: {err:?}");
    }
    // The channel still works.
    c.unary(Input::default())
        .await
        .expect("call after the errors");
}

on_all_transports!(layers_and_interceptors, bare_http_errors_map_to_grpc_codes);
