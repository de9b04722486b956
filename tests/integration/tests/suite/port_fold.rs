//! `rrpc://` connects after the first skip the port's negotiation: the
//! client's context remembers the ring endpoint the port named
//! (`rrpc_tonic` `context::PortMemo`) and dials it directly, the
//! negotiation folded into the ring handshake. Each test puts a TCP relay
//! in front of the port that counts the TCP connections made through it:
//! one per negotiation.
//!
//! On shm and, with feature `verbs` and `RRPC_TEST_DEVICE`, on verbs
//! through the port (tested on soft-RoCE; not run on an RDMA NIC).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, assert_closed_status, config};
use rrpc_tonic::{RrpcChannel, RrpcConfig, RrpcContext, RrpcEndpoint};
use tonic::{Code, Status};

rrpc_integration_tests::on_port_rings!(
    connects_after_the_first_skip_the_negotiation,
    a_server_gone_from_the_remembered_endpoint_is_negotiated_again,
    the_token_is_checked_on_every_folded_connect,
    the_connection_limits_hold_on_folded_connects,
    folded_connects_leave_no_descriptor_behind,
);

/// A bound on any one connect or call: a failure must come, never a hang.
const LIVENESS: Duration = Duration::from_secs(20);

/// A TCP relay in front of an `rrpc://` port, counting the connections
/// made through it (each is one negotiation).
struct Relay {
    uri: String,
    accepted: Arc<AtomicUsize>,
    /// Where it relays to (`host:port`), switched when the server moves.
    target: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn to(port_uri: &str) -> Relay {
        let target = Arc::new(Mutex::new(host_port(port_uri)));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let uri = format!("rrpc://{}", l.local_addr().expect("relay address"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (n, to) = (accepted.clone(), target.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut a, _)) = l.accept().await {
                n.fetch_add(1, Ordering::SeqCst);
                let to = to.lock().unwrap().clone();
                tokio::spawn(async move {
                    if let Ok(mut b) = tokio::net::TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                    }
                });
            }
        });
        Relay {
            uri,
            accepted,
            target,
            task,
        }
    }

    /// Negotiations so far.
    fn negotiations(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn retarget(&self, port_uri: &str) {
        *self.target.lock().unwrap() = host_port(port_uri);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn host_port(port_uri: &str) -> String {
    port_uri
        .strip_prefix("rrpc://")
        .expect("an rrpc:// URI")
        .to_string()
}

/// Connects to `uri` with `cfg` in `ctx`.
async fn connect(
    uri: &str,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<TestClient<RrpcChannel>, Status> {
    let attempt = async {
        let ch = RrpcEndpoint::new(uri)
            .map_err(|e| e.status())?
            .config(cfg.clone())
            .context(ctx.clone())
            .connect()
            .await
            .map_err(|e| e.status())?;
        Ok(TestClient::new(ch))
    };
    tokio::time::timeout(LIVENESS, attempt)
        .await
        .unwrap_or_else(|_| panic!("a connect to {uri} took longer than {LIVENESS:?}"))
}

/// One unary call of 100 bytes of `byte`, echoed whole.
async fn call(c: &mut TestClient<RrpcChannel>, byte: u8) {
    let out = tokio::time::timeout(
        LIVENESS,
        c.unary(Input {
            payload: vec![byte; 100],
            ..Default::default()
        }),
    )
    .await
    .expect("no hang")
    .unwrap_or_else(|e| panic!("call {byte}: {e:?}"));
    assert_eq!(out.into_inner().payload, vec![byte; 100]);
}

async fn connects_after_the_first_skip_the_negotiation(t: Transport) {
    let h = Harness::start(t).await;
    let relay = Relay::to(&h.uri).await;
    let cfg = config(t);
    let ctx = RrpcContext::new(&cfg);
    let mut clients = Vec::new();
    for i in 0..8u8 {
        let mut c = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
        call(&mut c, i).await;
        clients.push(c);
    }
    assert_eq!(relay.negotiations(), 1, "only the first connect negotiated");
    // Each connection is its own: those dropped take nothing from the rest.
    clients.drain(..4);
    for (i, c) in clients.iter_mut().enumerate() {
        call(c, 0x40 + i as u8).await;
    }
    // Another context has not met the port: it negotiates for itself.
    let other = RrpcContext::new(&cfg);
    let mut c = connect(&relay.uri, &cfg, &other).await.expect("connect");
    call(&mut c, 9).await;
    assert_eq!(relay.negotiations(), 2);
}

/// The server behind the port moves (restarted elsewhere): the connection
/// to it fails with a status, and the next connect dials the endpoint it
/// remembers, finds nobody and negotiates again.
async fn a_server_gone_from_the_remembered_endpoint_is_negotiated_again(t: Transport) {
    let mut h1 = Harness::start(t).await;
    let relay = Relay::to(&h1.uri).await;
    let cfg = config(t);
    let ctx = RrpcContext::new(&cfg);
    let mut c1 = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
    call(&mut c1, 1).await;
    let mut c2 = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
    call(&mut c2, 2).await;
    assert_eq!(relay.negotiations(), 1);
    h1.kill();
    // The side channels die with the server: calls fail, and never hang.
    let e = tokio::time::timeout(LIVENESS, c1.unary(Input::default()))
        .await
        .expect("no hang")
        .expect_err("the server is gone");
    assert_closed_status(t, &e);
    // Elsewhere: the OS may hand the new server the port the old one had,
    // and with it the same ring endpoint (its name holds the port and the
    // pid), which the remembered endpoint then rightly reaches with no
    // negotiation. Such a server is kept, so its port stays taken.
    let mut same_port = Vec::new();
    let h2 = loop {
        let h = Harness::start(t).await;
        if h.uri != h1.uri {
            break h;
        }
        same_port.push(h);
    };
    relay.retarget(&h2.uri);
    // (The failed call's channel may have tried the port again: counted
    // from here.)
    let n = relay.negotiations();
    let mut c3 = connect(&relay.uri, &cfg, &ctx)
        .await
        .expect("connect after the restart");
    call(&mut c3, 3).await;
    assert_eq!(
        relay.negotiations(),
        n + 1,
        "the remembered endpoint did not connect: negotiated again"
    );
    // And the new endpoint is remembered.
    let mut c4 = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
    call(&mut c4, 4).await;
    assert_eq!(relay.negotiations(), n + 1);
}

/// A client that skips the negotiation still meets the ring handshake's
/// token check: the wrong token is refused there as without the memo (not
/// negotiated again), the endpoint is forgotten, and the right token
/// connects after a new negotiation.
async fn the_token_is_checked_on_every_folded_connect(t: Transport) {
    let with = |token: &str| config(t).to_builder().token(token).build().expect("token");
    let h = Harness::start_with(t, with("sesame")).await;
    let relay = Relay::to(&h.uri).await;
    // One context for both clients: the token is a client's own setting.
    let ctx = RrpcContext::new(&with("sesame"));
    let mut c = connect(&relay.uri, &with("sesame"), &ctx)
        .await
        .expect("connect");
    call(&mut c, 1).await;
    let n = relay.negotiations();
    let Err(e) = connect(&relay.uri, &with("guess"), &ctx).await else {
        panic!("a wrong token connected");
    };
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(
        relay.negotiations(),
        n,
        "refused on the remembered endpoint, not negotiated again"
    );
    let mut c = connect(&relay.uri, &with("sesame"), &ctx)
        .await
        .expect("connect");
    call(&mut c, 2).await;
    assert_eq!(
        relay.negotiations(),
        n + 1,
        "the refused endpoint was forgotten"
    );
    let mut c = connect(&relay.uri, &with("sesame"), &ctx)
        .await
        .expect("connect");
    call(&mut c, 3).await;
    assert_eq!(relay.negotiations(), n + 1, "and remembered again");
}

/// The server's per-peer limit counts folded connects like any other, and
/// a refusal names the limit (no fallback to another fabric or endpoint).
async fn the_connection_limits_hold_on_folded_connects(t: Transport) {
    let limited = config(t)
        .to_builder()
        .max_connections_per_peer(3)
        .build()
        .expect("limit");
    let h = Harness::start_with(t, limited).await;
    let relay = Relay::to(&h.uri).await;
    let cfg = config(t);
    let ctx = RrpcContext::new(&cfg);
    let mut held = Vec::new();
    for i in 0..3u8 {
        let mut c = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
        call(&mut c, i).await;
        held.push(c);
    }
    let refused = async {
        let mut c = connect(&relay.uri, &cfg, &ctx).await?;
        c.unary(Input::default()).await?;
        Ok::<_, Status>(c)
    };
    let Err(e) = refused.await else {
        panic!("connected past max_connections_per_peer");
    };
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("connection limit"), "{e:?}");
    assert_eq!(relay.negotiations(), 1, "the refusal was not renegotiated");
    // One closes, the next connect gets its place.
    drop(held.pop());
    let deadline = std::time::Instant::now() + LIVENESS;
    loop {
        let attempt = async {
            let mut c = connect(&relay.uri, &cfg, &ctx).await?;
            c.unary(Input::default()).await?;
            Ok::<_, Status>(c)
        };
        match attempt.await {
            Ok(c) => {
                held.push(c);
                break;
            }
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no place freed: {e:?}"),
        }
    }
    for (i, c) in held.iter_mut().enumerate() {
        call(c, 0x10 + i as u8).await;
    }
}

/// The child's environment variable: the transport's name.
const CHILD: &str = "RRPC_PORT_FOLD_FDS_CHILD";

/// Runs [`count_descriptors`] in a process of its own (this test binary
/// re-run for that one test), so that no other test's sockets move the
/// count.
async fn folded_connects_leave_no_descriptor_behind(t: Transport) {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--ignored",
                "--exact",
                "port_fold::count_descriptors",
                "--nocapture",
            ])
            .env(CHILD, t.name())
            .output()
            .expect("run the child")
    })
    .await
    .expect("join");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(
        text.contains("descriptors: ok"),
        "the child did not count:\n{text}"
    );
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// In the child: 40 folded connects, each with a call, then dropped; the
/// process's descriptors return to what they were after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by folded_connects_leave_no_descriptor_behind in a process of its own"]
async fn count_descriptors() {
    let Some(t) = std::env::var(CHILD)
        .ok()
        .and_then(|n| Transport::from_name(&n))
    else {
        return;
    };
    let h = Harness::start(t).await;
    let relay = Relay::to(&h.uri).await;
    let cfg = config(t);
    let ctx = RrpcContext::new(&cfg);
    let mut c = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
    call(&mut c, 0).await;
    drop(c);
    // What the server and the client keep between connections (listeners,
    // the poller, the relay) is there now; give the first connection's
    // teardown a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = open_fds();
    for i in 0..40u8 {
        let mut c = connect(&relay.uri, &cfg, &ctx).await.expect("connect");
        call(&mut c, i).await;
    }
    assert_eq!(relay.negotiations(), 1, "the connects were folded");
    // Both ends close a dropped connection's descriptors once each sees
    // it gone: bounded wait.
    let deadline = std::time::Instant::now() + LIVENESS;
    let mut now = open_fds();
    while now > before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = open_fds();
    }
    assert!(
        now <= before,
        "{} descriptors left behind by 40 connections ({before} before, {now} after)",
        now - before
    );
    println!("descriptors: ok ({before} before, {now} after)");
}
