//! Graceful shutdown with a call in flight, and a peer killed mid-stream.

use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, assert_closed_status, on_all_transports};
use tonic::Code;

async fn graceful_drain_then_unavailable(t: Transport) {
    let mut s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut c2 = c.clone();
    let inflight = tokio::spawn(async move {
        c2.unary(Input {
            delay_ms: 300,
            ..Default::default()
        })
        .await
    });
    s.obs.started.notified().await;
    s.shutdown().await.expect("server drained cleanly");
    // The call in flight completed during the drain.
    inflight.await.unwrap().expect("in-flight call completes");
    // Afterwards, calls fail with Unavailable (over TCP, tonic's `Channel`
    // reads `Cancelled` about 1 run in 6 here).
    let err = c.unary(Input::default()).await.unwrap_err();
    assert_closed_status(t, &err);
}

async fn peer_killed_mid_stream(t: Transport) {
    let mut s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut st = c
        .server_stream(Input {
            count: 1_000_000,
            delay_ms: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(st.message().await.unwrap().is_some());
    s.kill();
    let err = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match st.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("stream ended cleanly after the server died"),
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("caller notified promptly");
    if t.is_tcp() {
        // tonic's own HTTP/2 server, torn down inside this process, sometimes resets the
        // stream (RST_STREAM CANCEL) before its socket closes; tonic reports that as
        // Cancelled (seen under load in about 1 run in 10). A killed process cannot send a
        // reset. A connection that breaks under a streaming body reads as tonic's
        // `Unknown` "h2 protocol error" (RrpcChannel passes plain tonic's statuses through
        // unchanged). The rrpc transports must say Unavailable.
        assert!(
            matches!(
                err.code(),
                Code::Unavailable | Code::Cancelled | Code::Unknown
            ),
            "{err:?}"
        );
    } else if t.is_http2() && reset_by_server(&err) {
        // The same race on rrpc's HTTP/2 path, which carries hyper's frames: the dropped
        // runtime's stream task queued RST_STREAM CANCEL and the connection task wrote it
        // into the ring before its own drop (seen once on soft-RoCE in CI; 0 of 12 runs since). Only a
        // reset the server sent is excused; a real kill is `sigkill.rs`, which must read
        // Unavailable on every rrpc transport.
        eprintln!("the server's runtime reset the stream before its transport closed: {err:?}");
        assert_eq!(err.code(), Code::Cancelled, "{err:?}");
    } else {
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    }
    let err = c.unary(Input::default()).await.unwrap_err();
    assert_closed_status(t, &err);
}

/// Whether `s` comes from an HTTP/2 stream reset that the server sent.
fn reset_by_server(s: &tonic::Status) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = cur {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_reset() && h2.is_remote();
        }
        cur = e.source();
    }
    false
}

on_all_transports!(graceful_drain_then_unavailable, peer_killed_mid_stream);
