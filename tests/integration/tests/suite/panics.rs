//! A handler that panics fails only its own call, with the status tonic's
//! own TCP transport gives; other calls on the same channel keep working and
//! graceful shutdown still returns.

use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{
    Harness, PANIC_AFTER_AWAIT, PANIC_AT_FIRST_POLL, Transport, on_all_transports, payload,
};
use tonic::Code;

/// What a caller sees when the handler panics: over TCP, hyper runs each
/// stream in its own task, the panic drops the stream, h2 resets it with
/// CANCEL and tonic's own `Channel` reports `Cancelled`
/// ([`tonic_channel_reports_cancelled`] pins it). The fast path says the same.
const PANIC_CODE: Code = Code::Cancelled;

/// What an `RrpcChannel` reports on `t`: [`PANIC_CODE`] on every
/// transport (rrpc's HTTP/2 path keeps a stream reset by the server as
/// tonic reports it; before, it said `Unavailable`).
fn expected(_t: Transport) -> Code {
    PANIC_CODE
}

async fn handler_panics_at_first_poll(t: Transport) {
    panicking_handler_fails_only_its_call(t, PANIC_AT_FIRST_POLL).await
}

async fn handler_panics_after_await(t: Transport) {
    panicking_handler_fails_only_its_call(t, PANIC_AFTER_AWAIT).await
}

async fn panicking_handler_fails_only_its_call(t: Transport, tag: &str) {
    {
        let mut s = Harness::start(t).await;
        let mut c = s.client().await;
        // An unrelated call, open on the same channel across the panic.
        let mut st = c
            .server_stream(Input {
                payload: payload(8),
                count: 3,
                delay_ms: 50,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let err = tokio::time::timeout(
            Duration::from_secs(10),
            c.unary(Input {
                tag: tag.into(),
                ..Default::default()
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("{tag}: the call hangs"))
        .unwrap_err();
        assert_eq!(err.code(), expected(t), "{tag}: {err:?}");
        // The open stream and new calls on the same channel still work.
        let mut n = 0;
        while let Some(m) = st.message().await.unwrap() {
            assert_eq!(m.payload, payload(8));
            n += 1;
        }
        assert_eq!(n, 3, "{tag}");
        let r = c
            .unary(Input {
                payload: payload(10),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{tag}: channel broken after the panic: {e:?}"));
        assert_eq!(r.into_inner().payload, payload(10));
        // The panicked call does not hold up a graceful shutdown.
        tokio::time::timeout(Duration::from_secs(10), s.shutdown())
            .await
            .unwrap_or_else(|_| panic!("{tag}: graceful shutdown hangs"))
            .expect("server drained cleanly");
    }
}

on_all_transports!(handler_panics_at_first_poll, handler_panics_after_await);

/// The reference: tonic's own `Channel` over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_channel_reports_cancelled() {
    let s = Harness::start(Transport::Tcp).await;
    drop(s.client().await); // waits until the server is up
    let ch = tonic::transport::Endpoint::from_shared(s.uri.clone())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut c = rrpc_integration_tests::pb::test_client::TestClient::new(ch);
    for tag in [PANIC_AT_FIRST_POLL, PANIC_AFTER_AWAIT] {
        let err = c
            .unary(Input {
                tag: tag.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), PANIC_CODE, "{tag}: {err:?}");
        c.unary(Input::default())
            .await
            .expect("channel still works");
    }
}
