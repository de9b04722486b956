//! `inproc://`: the fast path between a server and its clients in one
//! process. The server's side of each connection runs on the runtime of
//! the client that dialed it (`Accepted::runtime`), as a direct call to
//! the service would: a call and its handler take turns on the caller's
//! threads, with no wake-up of another runtime's thread per message.
//!
//! * every kind of call completes while the server's own runtime is
//!   frozen after accepting (so the connection does not run there);
//! * the server's shutdown returns although a client's current-thread
//!   runtime is idle (not driven by its thread), within the handshake
//!   timeout's grace, and that connection ends when its runtime runs again;
//! * a client whose runtime is dropped does not hurt the next client.

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::test_service;
use rrpc_tonic::{RrpcChannel, RrpcConfig, RrpcEndpoint, RrpcIncoming, Server};
use tokio_stream::StreamExt;

/// How long anything here may take before the test calls it a hang.
const BOUND: Duration = Duration::from_secs(20);

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A server on `inproc://{name}` on a thread and runtime of its own; it
/// stops when `stop` is sent (or dropped) and its thread returns how long
/// `serve` took to return after that.
fn server(
    name: &str,
    cfg: RrpcConfig,
    hold: Option<std_mpsc::Receiver<()>>,
) -> (std_mpsc::Sender<()>, std::thread::JoinHandle<Duration>) {
    let uri = format!("inproc://{name}");
    let (bound_tx, bound_rx) = std_mpsc::channel();
    let (stop_tx, stop_rx) = std_mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        current_thread().block_on(async move {
            let incoming = RrpcIncoming::bind(&uri, cfg).expect("bind");
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let serve = tokio::spawn(
                Server::builder()
                    .add_service(test_service())
                    .serve_rrpc_incoming(incoming, async move {
                        let _ = rx.await;
                    }),
            );
            bound_tx.send(()).expect("bound");
            if let Some(hold) = hold {
                // Accept what comes first, then freeze this runtime: its
                // thread blocks without driving it.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = hold.recv();
            }
            // Wait for the stop, driving the runtime.
            let stop = tokio::task::spawn_blocking(move || {
                let _ = stop_rx.recv();
            });
            stop.await.expect("stop waiter");
            let t0 = Instant::now();
            let _ = tx.send(());
            tokio::time::timeout(BOUND, serve)
                .await
                .expect("serve hung on shutdown")
                .expect("serve task")
                .expect("serve");
            t0.elapsed()
        })
    });
    bound_rx.recv_timeout(BOUND).expect("server bound");
    (stop_tx, t)
}

async fn connect(name: &str) -> TestClient<RrpcChannel> {
    let ch = RrpcEndpoint::new(format!("inproc://{name}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    TestClient::new(ch)
}

async fn every_kind(c: &mut TestClient<RrpcChannel>) {
    let r = c
        .unary(Input {
            payload: b"ping".to_vec(),
            ..Default::default()
        })
        .await
        .expect("unary");
    assert_eq!(r.into_inner().payload, b"ping");
    let mut s = c
        .server_stream(Input {
            count: 5,
            ..Default::default()
        })
        .await
        .expect("server stream")
        .into_inner();
    let mut n = 0;
    while let Some(m) = s.next().await {
        m.expect("stream message");
        n += 1;
    }
    assert_eq!(n, 5);
    let inputs = (0..3).map(|i| Input {
        payload: vec![i; 10],
        ..Default::default()
    });
    let r = c
        .bidi(tokio_stream::iter(inputs))
        .await
        .expect("bidi")
        .into_inner();
    assert_eq!(r.collect::<Vec<_>>().await.len(), 3);
}

/// Calls complete while the server's runtime is frozen: the connection
/// runs on the client's runtime.
#[test]
fn calls_run_on_the_dialing_runtime() {
    let (hold_tx, hold_rx) = std_mpsc::channel();
    let (stop, t) = server("suite-inproc-frozen", RrpcConfig::default(), Some(hold_rx));
    current_thread().block_on(async {
        let mut c = connect("suite-inproc-frozen").await;
        // The server's runtime freezes 200 ms after binding; wait past that.
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::time::timeout(BOUND, async {
            for _ in 0..20 {
                every_kind(&mut c).await;
            }
        })
        .await
        .expect("calls hung: the connection waits for the server's frozen runtime");
    });
    drop(hold_tx);
    drop(stop);
    t.join().expect("server thread");
}

/// The server's shutdown does not wait for a client runtime that its
/// thread no longer drives, past the handshake timeout.
#[test]
fn shutdown_does_not_wait_for_an_idle_client_runtime() {
    let grace = Duration::from_millis(300);
    let cfg = RrpcConfig::builder()
        .handshake_timeout(grace)
        .build()
        .expect("config");
    let (stop, t) = server("suite-inproc-idle", cfg, None);
    let rt = current_thread();
    let mut c = rt.block_on(async {
        let mut c = connect("suite-inproc-idle").await;
        every_kind(&mut c).await;
        c
    });
    // The client's runtime is idle now: nothing drives it.
    drop(stop);
    let took = t.join().expect("server thread");
    assert!(took < BOUND, "shutdown took {took:?}");
    // Driven again, the connection drains on the shutdown it now sees: a
    // call sent before it read that may still be served (graceful drain,
    // as on every transport), the next fails typed, and none hangs.
    rt.block_on(async {
        let first = tokio::time::timeout(BOUND, c.unary(Input::default()))
            .await
            .expect("the call hung after the server stopped");
        if let Err(status) = &first {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        }
        let next = tokio::time::timeout(BOUND, c.unary(Input::default()))
            .await
            .expect("the call hung after the server stopped");
        let status = next.expect_err("served after the server stopped and drained");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    });
}

/// A client whose runtime is dropped, its connection with it, leaves the
/// server serving the next client.
#[test]
fn a_dropped_client_runtime_does_not_hurt_the_next_client() {
    let (stop, t) = server("suite-inproc-dropped", RrpcConfig::default(), None);
    {
        let rt = current_thread();
        rt.block_on(async {
            let mut c = connect("suite-inproc-dropped").await;
            every_kind(&mut c).await;
            // A call in flight when the runtime goes.
            let mut c2 = c.clone();
            tokio::spawn(async move {
                let _ = c2
                    .unary(Input {
                        delay_ms: 5_000,
                        ..Default::default()
                    })
                    .await;
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        drop(rt);
    }
    current_thread().block_on(async {
        tokio::time::timeout(BOUND, async {
            let mut c = connect("suite-inproc-dropped").await;
            every_kind(&mut c).await;
        })
        .await
        .expect("the next client hung");
    });
    drop(stop);
    let took = t.join().expect("server thread");
    assert!(took < BOUND, "shutdown took {took:?}");
}

/// Where each call reached the server's service in
/// [`handlers_run_in_the_callers_poll`]: the tokio task it ran in (`None`:
/// no task, the client's own `block_on`).
static SERVED_IN: std::sync::Mutex<Vec<Option<tokio::task::Id>>> =
    std::sync::Mutex::new(Vec::new());

fn record_task(req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    SERVED_IN.lock().expect("lock").push(tokio::task::try_id());
    Ok(req)
}

/// The server's side of an `inproc://` connection runs in place: a unary
/// call's request is decoded and its handler called inside the client's
/// own send, with no task woken for it (the client here calls from its
/// runtime's `block_on`, not from a task, and the service sees no task).
/// A call that the handler does not finish at once still runs its handler
/// as a task, and a dropped call frees its place at once (cancelled).
#[test]
fn handlers_run_in_the_callers_poll() {
    let name = "suite-inproc-in-place";
    let (bound_tx, bound_rx) = std_mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let t = std::thread::spawn(move || {
        current_thread().block_on(async move {
            // One call at a time: a cancelled call must free its place.
            let cfg = RrpcConfig::builder()
                .max_concurrent_calls(1)
                .build()
                .expect("config");
            let incoming = RrpcIncoming::bind(&format!("inproc://{name}"), cfg).expect("bind");
            let svc = tonic::service::interceptor::InterceptedService::new(
                test_service(),
                record_task as fn(_) -> _,
            );
            let serve =
                Server::builder()
                    .add_service(svc)
                    .serve_rrpc_incoming(incoming, async move {
                        let _ = stop_rx.await;
                    });
            bound_tx.send(()).expect("bound");
            serve.await.expect("serve");
        });
    });
    bound_rx.recv_timeout(BOUND).expect("server bound");
    current_thread().block_on(async {
        tokio::time::timeout(BOUND, async {
            let mut c = connect(name).await;
            SERVED_IN.lock().expect("lock").clear();
            for i in 0..3u8 {
                let r = c
                    .unary(Input {
                        payload: vec![i; 4],
                        ..Default::default()
                    })
                    .await
                    .expect("unary");
                assert_eq!(r.into_inner().payload, vec![i; 4]);
            }
            let seen = SERVED_IN.lock().expect("lock").clone();
            assert_eq!(seen, vec![None; 3], "each handler ran in the caller's poll");
            // A handler that sleeps is left mid-way; the call is dropped.
            let slow = c.unary(Input {
                delay_ms: 60_000,
                ..Default::default()
            });
            assert!(
                tokio::time::timeout(Duration::from_millis(100), slow)
                    .await
                    .is_err()
            );
            // Its place is free: the cancellation reached the server.
            c.unary(Input::default())
                .await
                .expect("the dropped call's place was not freed");
        })
        .await
        .expect("hung");
    });
    let _ = stop_tx.send(());
    t.join().expect("server thread");
}
