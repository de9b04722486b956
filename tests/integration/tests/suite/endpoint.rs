//! `RrpcEndpoint`: tonic's `Endpoint` options on every transport, with the
//! same observable result as on tonic's own transport: the user agent and
//! `date`, the origin, lazy connect and reconnect after a server restart,
//! the call timeout, the connect timeout, client-side concurrency and rate
//! limits, and a balance over several servers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{
    Harness, Transport, config, expect_timeout_then_ok, on_all_transports,
};
use rrpc_tonic::{RrpcChannel, RrpcEndpoint};
use tonic::Code;

/// The user agent tonic itself sends, read from a call over TCP (tonic's
/// own transport) in the same test: rrpc must send the same, whatever
/// tonic version was built.
async fn tonic_ua() -> String {
    let s = Harness::start(Transport::Tcp).await;
    s.channel().await;
    let mut c = TestClient::new(endpoint(&s).connect().await.expect("connect"));
    let r = echoed(&mut c).await;
    let ua = header(&r, "x-echo-user-agent").to_owned();
    assert!(ua.starts_with("tonic/"), "{ua}");
    ua
}

fn endpoint(s: &Harness) -> RrpcEndpoint {
    RrpcEndpoint::new(&s.uri)
        .expect("uri")
        .config(config(s.transport))
}

async fn echoed(
    c: &mut TestClient<RrpcChannel>,
) -> tonic::Response<rrpc_integration_tests::pb::Output> {
    c.unary(Input::default()).await.expect("call")
}

fn header<'a>(r: &'a tonic::Response<rrpc_integration_tests::pb::Output>, k: &str) -> &'a str {
    r.metadata()
        .get(k)
        .unwrap_or_else(|| panic!("no {k} in {:?}", r.metadata()))
        .to_str()
        .expect("ascii")
}

/// Handlers see tonic's `user-agent`, or the endpoint's followed by
/// tonic's; responses carry a `date` header (hyper's), on every path.
async fn user_agent_and_date_as_tonic(t: Transport) {
    let s = Harness::start(t).await;
    s.channel().await; // up
    let mut c = TestClient::new(endpoint(&s).connect().await.expect("connect"));
    let r = echoed(&mut c).await;
    let tonic_ua = tonic_ua().await;
    assert_eq!(header(&r, "x-echo-user-agent"), tonic_ua, "{t:?}");
    let date = header(&r, "date");
    httpdate::parse_http_date(date).unwrap_or_else(|e| panic!("{t:?}: date {date:?}: {e}"));

    let ch = endpoint(&s)
        .user_agent("my-app/1.0")
        .expect("valid")
        .connect()
        .await
        .expect("connect");
    let r = echoed(&mut TestClient::new(ch)).await;
    assert_eq!(
        header(&r, "x-echo-user-agent"),
        format!("my-app/1.0 {tonic_ua}"),
        "{t:?}"
    );
}

/// `origin` sets the authority the server's HTTP request carries.
async fn origin_sets_the_authority(t: Transport) {
    let s = Harness::start(t).await;
    s.channel().await;
    let ch = endpoint(&s)
        .origin("http://example.test:8080".parse().expect("uri"))
        .connect()
        .await
        .expect("connect");
    let r = echoed(&mut TestClient::new(ch)).await;
    assert_eq!(header(&r, "x-echo-authority"), "example.test:8080", "{t:?}");
}

/// Calls until one succeeds (the server coming up), at most `limit`.
async fn until_served(c: &mut TestClient<RrpcChannel>, limit: Duration) -> usize {
    let start = Instant::now();
    let mut failures = 0;
    loop {
        match c.unary(Input::default()).await {
            Ok(_) => return failures,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "while down: {e:?}");
                failures += 1;
                assert!(
                    start.elapsed() < limit,
                    "not served within {limit:?}: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A lazy channel made before its server exists fails its calls with
/// `Unavailable`, then works once the server is up; after the server is
/// killed and restarted at the same address, the same channel carries
/// calls again without being rebuilt, and the first call after the
/// restart (made once the new server answers others) succeeds.
async fn lazy_connect_and_reconnect_after_restart(t: Transport) {
    let uri = Harness::fresh_uri(t);
    let ep = RrpcEndpoint::new(&uri).expect("uri").config(config(t));
    let mut c = TestClient::new(ep.connect_lazy().expect("lazy"));
    let err = c
        .unary(Input::default())
        .await
        .expect_err("nothing listening yet");
    assert_eq!(err.code(), Code::Unavailable, "{t:?}: {err:?}");

    let mut s = Harness::start_at(t, &uri, config(t), |s| s).await;
    until_served(&mut c, Duration::from_secs(10)).await;
    assert_eq!(s.obs.unary_calls.load(Ordering::Relaxed), 1);

    s.kill();
    let s2 = Harness::start_at(t, &uri, config(t), |s| s).await;
    s2.channel().await; // the new server answers
    // The old connection's end is seen on its own (side channel, or
    // hyper's connection task): the next call goes to the new server.
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.unary(Input::default())
        .await
        .unwrap_or_else(|e| panic!("{t:?}: first call after the restart: {e:?}"));
    assert_eq!(s2.obs.unary_calls.load(Ordering::Relaxed), 1);
}

/// `timeout` bounds every call (`DeadlineExceeded` on rings, tonic's
/// `Cancelled` "Timeout expired" over TCP: `assert_expired`), and the
/// channel stays usable.
async fn endpoint_timeout_bounds_calls(t: Transport) {
    let s = Harness::start(t).await;
    s.channel().await;
    let ch = endpoint(&s)
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    expect_timeout_then_ok(&mut TestClient::new(ch), t, 3000).await;
}

/// `concurrency_limit(1)`: a second call waits until the first is done.
/// The order is read from the handlers (as `server_options` does): a
/// client-side timestamp taken after the slow call returns could come after
/// the queued call's own (the spawned task may run late, as it once did in
/// the soft-RoCE VM under load), so it would not prove an overlap.
async fn channel_concurrency_limit_queues_calls(t: Transport) {
    let s = Harness::start(t).await;
    s.channel().await;
    let ch = endpoint(&s)
        .concurrency_limit(1)
        .connect()
        .await
        .expect("connect");
    let mut c = TestClient::new(ch);
    let mut c2 = c.clone();
    let slow = tokio::spawn(async move {
        c2.unary(Input {
            delay_ms: 300,
            tag: "slow".into(),
            ..Default::default()
        })
        .await
    });
    s.obs.started.notified().await;
    c.unary(Input {
        tag: "queued".into(),
        ..Default::default()
    })
    .await
    .expect("queued call");
    slow.await.expect("task").expect("slow call");
    assert_eq!(
        *s.obs.events.lock().unwrap(),
        ["slow start", "slow end", "queued start", "queued end"],
        "{t:?}: the second call ran beside the first"
    );
}

/// `rate_limit(2, 300 ms)`: six calls take at least two more periods.
async fn channel_rate_limit_spaces_calls(t: Transport) {
    let s = Harness::start(t).await;
    s.channel().await;
    let ch = endpoint(&s)
        .rate_limit(2, Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let mut c = TestClient::new(ch);
    let start = Instant::now();
    for _ in 0..6 {
        c.unary(Input::default()).await.expect("call");
    }
    assert!(
        start.elapsed() >= Duration::from_millis(550),
        "{t:?}: 6 calls in {:?}",
        start.elapsed()
    );
}

/// `balance_list` over two servers sends calls to both.
async fn balance_list_spreads_calls(t: Transport) {
    let a = Harness::start(t).await;
    let b = Harness::start(t).await;
    a.channel().await;
    b.channel().await;
    let ch = RrpcChannel::balance_list([endpoint(&a), endpoint(&b)]).expect("balance");
    let mut c = TestClient::new(ch);
    // The balancer sends only to endpoints whose connection is ready, and
    // each connects lazily: on a loaded machine the first 40 calls can all
    // finish before the second connection is up. Call until both served
    // some, within a bound.
    let start = Instant::now();
    let mut calls = 0u64;
    let counts = || {
        (
            a.obs.unary_calls.load(Ordering::Relaxed),
            b.obs.unary_calls.load(Ordering::Relaxed),
        )
    };
    while calls < 40 || counts().0 == 0 || counts().1 == 0 {
        c.unary(Input::default()).await.expect("call");
        calls += 1;
        let (na, nb) = counts();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{t:?}: {na} / {nb} after {calls} calls"
        );
    }
    let (na, nb) = counts();
    assert_eq!(na + nb, calls, "{t:?}");
    assert!(na > 0 && nb > 0, "{t:?}: {na} / {nb}");
}

on_all_transports!(
    user_agent_and_date_as_tonic,
    origin_sets_the_authority,
    lazy_connect_and_reconnect_after_restart,
    endpoint_timeout_bounds_calls,
    channel_concurrency_limit_queues_calls,
    channel_rate_limit_spaces_calls,
    balance_list_spreads_calls,
);

/// `connect_timeout` on rings bounds the whole connect: a server that
/// accepts the side channel but never answers the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_bounds_a_silent_server() {
    let path = std::env::temp_dir().join(format!("rrpc-it-silent-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let _silent = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let ep = RrpcEndpoint::new(format!("shm://{}", path.display()))
        .expect("uri")
        .connect_timeout(Duration::from_millis(300));
    let start = Instant::now();
    let err = ep.connect().await.expect_err("nobody answers");
    assert!(
        matches!(err, rrpc_tonic::Error::ConnectTimeout(_)),
        "{err:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(tonic::Status::from(err).code(), Code::Unavailable);
    // A lazy channel's call fails the same way, and does not hang.
    let mut c = TestClient::new(ep.connect_lazy().expect("lazy"));
    let err = c.unary(Input::default()).await.expect_err("nobody answers");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("connect timed out"), "{err:?}");
    let _ = std::fs::remove_file(&path);
}
