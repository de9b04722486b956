//! The whole gRPC stack under rrpc-core's fault injector (verbs semantics
//! in plain `cargo test`, without a device), through
//! [`RrpcConfig::queue_pair`], on both `shm://` paths:
//!
//! * completions delayed and polls that miss them (the arm-then-poll race)
//!   on both ends lose no call and no wake-up;
//! * a client whose queue pairs fail after a number of posts, the way a
//!   NIC reports a peer that stopped acknowledging (`RETRY_EXC`), gets
//!   `Unavailable` naming the cause (`IBV_WC_RETRY_EXC_ERR`) for the calls
//!   caught by it, never a hang, and the
//!   channel reconnects; the server keeps serving its other clients.

use std::time::Duration;

use rrpc_core::{FaultConfig, QpConfig, Status};
use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, config, on_shm, payload};
use rrpc_tonic::RrpcChannel;
use tonic::Code;

const BOUND: Duration = Duration::from_secs(20);

fn with_faults(t: Transport, f: FaultConfig) -> rrpc_tonic::RrpcConfig {
    config(t)
        .to_builder()
        .queue_pair(QpConfig::builder().fault(f).build().unwrap())
        .build()
        .unwrap()
}

/// A unary call of `payload` on `c` that must end within [`BOUND`]: a
/// hang panics with `hung()`.
async fn echo_within_bound(
    c: &mut TestClient<RrpcChannel>,
    payload: &[u8],
    hung: impl FnOnce() -> String,
) -> Result<rrpc_integration_tests::pb::Output, tonic::Status> {
    let call = c.unary(Input {
        payload: payload.to_vec(),
        ..Default::default()
    });
    match tokio::time::timeout(BOUND, call).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => panic!("{}", hung()),
    }
}

/// A client of `h` whose queue pair fails (`RetryExceeded`, as a peer that
/// stopped acknowledging) after `posts` posts.
async fn client_failing_after(h: &Harness, t: Transport, posts: u64) -> TestClient<RrpcChannel> {
    // The failed completion comes a few polls late, as a NIC's does (it
    // retransmits first): found by whoever polls next, often the progress
    // task after the send returned, not the send itself.
    let faults = FaultConfig::builder()
        .fail_after_posts(posts)
        .fail_status(Status::RetryExceeded)
        .completion_delay_polls(2)
        .build()
        .unwrap();
    TestClient::new(
        RrpcChannel::connect(&h.uri, with_faults(t, faults))
            .await
            .expect("connect"),
    )
}

async fn delayed_and_missed_completions_lose_nothing(t: Transport) {
    let faults = FaultConfig::builder()
        .completion_delay_polls(2)
        .poll_miss_every(3)
        .build()
        .unwrap();
    let cfg = with_faults(t, faults);
    let h = Harness::start_with(t, cfg.clone()).await;
    let mut c = TestClient::new(RrpcChannel::connect(&h.uri, cfg).await.expect("connect"));
    for i in 0..200usize {
        let p = payload(1 + (i * 37) % 5000);
        let r = echo_within_bound(&mut c, &p, || format!("{t:?}: call {i} lost"))
            .await
            .expect("unary");
        assert_eq!(r.payload, p, "{t:?}: call {i}");
    }
    let mut s = c
        .server_stream(Input {
            payload: payload(700),
            count: 300,
            ..Default::default()
        })
        .await
        .expect("stream")
        .into_inner();
    let mut n = 0;
    while let Some(m) = tokio::time::timeout(BOUND, s.message())
        .await
        .unwrap_or_else(|_| panic!("{t:?}: stream message {n} lost"))
        .expect("message")
    {
        assert_eq!(m.total, n, "{t:?}: in order");
        n += 1;
    }
    assert_eq!(n, 300, "{t:?}");
}

async fn failing_queue_pairs_are_unavailable_then_reconnect(t: Transport) {
    let h = Harness::start(t).await;
    let mut c = client_failing_after(&h, t, 150).await;
    let (mut ok, mut failed, mut ok_after_failure) = (0, 0, 0);
    for i in 0..300usize {
        let p = payload(1 + i % 3000);
        let r = echo_within_bound(&mut c, &p, || {
            format!("{t:?}: call {i} hung on a failing queue pair")
        })
        .await;
        match r {
            Ok(r) => {
                assert_eq!(r.payload, p, "{t:?}: call {i}");
                ok += 1;
                if failed > 0 {
                    ok_after_failure += 1;
                }
            }
            Err(st) => {
                assert_eq!(st.code(), Code::Unavailable, "{t:?}: call {i}: {st}");
                // Callers are told why: the retries ran out.
                assert!(
                    st.message().contains("IBV_WC_RETRY_EXC_ERR"),
                    "{t:?}: call {i}: the cause is not named: {st}"
                );
                if failed < 3 || i == 299 {
                    eprintln!("{t:?}: call {i}: {}", st.message());
                }
                failed += 1;
            }
        }
    }
    eprintln!("{t:?}: {ok} ok, {failed} Unavailable, {ok_after_failure} ok after a failure");
    assert!(failed > 0, "{t:?}: the injected failure was never seen");
    // A failed connection costs the calls in flight on it, not the calls
    // after it: those go to a new connection (before the fix, the fast
    // path kept choosing the dead one: 50 to 250 of 300 calls failed).
    assert!(failed * 10 <= 300, "{t:?}: {failed} of 300 calls failed");
    assert!(
        ok_after_failure > 0,
        "{t:?}: the channel never reconnected after a failed connection"
    );
    // The server is unharmed: a clean client is served.
    let mut clean = h.client().await;
    clean.unary(Input::default()).await.expect("a clean client");
}

/// A client that only reads (a long server stream, so all it posts are
/// head pushes giving the server room) and whose queue pair fails: its
/// stream ends `Unavailable`, it does not wait forever for messages the
/// server cannot send for want of room.
async fn a_reader_whose_queue_pair_fails_is_told(t: Transport) {
    let h = Harness::start(t).await;
    let mut c = client_failing_after(&h, t, 40).await;
    let mut s = c
        .server_stream(Input {
            payload: payload(16 << 10),
            count: 100_000,
            ..Default::default()
        })
        .await
        .expect("stream")
        .into_inner();
    let mut n = 0u64;
    let end = loop {
        match tokio::time::timeout(BOUND, s.message())
            .await
            .unwrap_or_else(|_| panic!("{t:?}: stream stalled after {n} messages"))
        {
            Ok(Some(_)) => n += 1,
            Ok(None) => panic!("{t:?}: the stream ended cleanly after {n} messages"),
            Err(st) => break st,
        }
    };
    eprintln!("{t:?}: stream failed after {n} messages: {end}");
    assert_eq!(end.code(), Code::Unavailable, "{t:?}: {end}");
    assert!(
        end.message().contains("IBV_WC_RETRY_EXC_ERR"),
        "{t:?}: the cause is not named: {end}"
    );
    let mut clean = h.client().await;
    clean.unary(Input::default()).await.expect("a clean client");
}

on_shm!(
    delayed_and_missed_completions_lose_nothing,
    failing_queue_pairs_are_unavailable_then_reconnect,
    a_reader_whose_queue_pair_fails_is_told,
);
