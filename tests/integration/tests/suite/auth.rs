//! Shared-secret tokens, so that only clients holding the server's secret
//! may connect: a client without the server's token, or with a wrong one,
//! is refused in the handshake with a typed error that reads
//! `Unauthenticated`, and the server goes on serving clients that have it.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, config};
use rrpc_tonic::RrpcChannel;

async fn token_is_checked(t: Transport) {
    let secret = config(t)
        .to_builder()
        .token(b"s3cret".to_vec())
        .build()
        .expect("token");
    let h = Harness::start_with(t, secret.clone()).await;
    // The harness's own channels carry the token.
    let mut c = h.client().await;
    c.unary(Input::default())
        .await
        .expect("call with the token");
    for cfg in [
        config(t),
        config(t)
            .to_builder()
            .token(b"wrong".to_vec())
            .build()
            .expect("token"),
    ] {
        let err = RrpcChannel::connect(&h.uri, cfg)
            .await
            .expect_err("refused without the right token");
        let st = tonic::Status::from(err);
        assert_eq!(st.code(), tonic::Code::Unauthenticated, "{st:?}");
    }
    let mut c = TestClient::new(RrpcChannel::connect(&h.uri, secret).await.expect("connect"));
    c.unary(Input::default()).await.expect("still serving");
}

rrpc_integration_tests::on_shm!(token_is_checked);

/// Without the `verbs` feature, `rdma://` fails with an error that says how
/// to enable it, on both ends.
#[cfg(not(feature = "verbs"))]
#[tokio::test]
async fn rdma_without_the_feature_says_how_to_enable_it() {
    let err = RrpcChannel::connect("rdma://127.0.0.1:1", rrpc_tonic::RrpcConfig::default())
        .await
        .expect_err("no verbs");
    assert!(err.to_string().contains("`verbs` feature"), "{err}");
    let err = rrpc_tonic::Server::builder()
        .add_routes(tonic::service::Routes::default())
        .serve_rrpc("rdma://127.0.0.1:0", rrpc_tonic::RrpcConfig::default())
        .await
        .expect_err("no verbs");
    assert!(err.to_string().contains("`verbs` feature"), "{err}");
}

/// TLS on the `rdma://` side channel (`RrpcConfig::tls_server` /
/// `tls_client`): calls work over a connection whose handshake ran inside
/// TLS; a client that trusts another certificate is `Unauthenticated`; a
/// client without TLS is refused with an error that names TLS; the server
/// goes on serving.
#[cfg(feature = "verbs")]
async fn tls_is_checked(t: Transport) {
    use rrpc_core::rustls;

    let configs = || rrpc_core::testing::self_signed_tls("rrpc.test");
    let name = || rustls::pki_types::ServerName::try_from("rrpc.test").unwrap();
    let (server_tls, client_tls) = configs();
    let (_, stranger_tls) = configs();
    let cfg = config(t)
        .to_builder()
        .tls_server(server_tls)
        .tls_client(client_tls, name())
        .build()
        .unwrap();
    let h = Harness::start_with(t, cfg.clone()).await;
    let mut c = h.client().await;
    c.unary(Input::default()).await.expect("a call over TLS");
    let err = RrpcChannel::connect(
        &h.uri,
        config(t)
            .to_builder()
            .tls_client(stranger_tls, name())
            .build()
            .unwrap(),
    )
    .await
    .expect_err("a server certificate the client does not trust");
    let st = tonic::Status::from(err);
    assert_eq!(st.code(), tonic::Code::Unauthenticated, "{st:?}");
    let err = RrpcChannel::connect(&h.uri, config(t))
        .await
        .expect_err("a client without TLS");
    let st = tonic::Status::from(err);
    assert!(
        st.code() == tonic::Code::Unauthenticated && st.message().contains("TLS"),
        "{st:?}"
    );
    let mut c = TestClient::new(RrpcChannel::connect(&h.uri, cfg).await.expect("connect"));
    c.unary(Input::default()).await.expect("still serving");
}

rrpc_integration_tests::on_rdma!(token_is_checked, tls_is_checked);
