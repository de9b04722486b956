//! Connection setup under hostile and churning clients: every client's
//! setup runs on its own, bounded by `handshake_timeout`, so a silent, slow
//! or half-finished client never delays an honest one, and a connection
//! ending never cuts another's handshake short.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use rrpc_core::conn::{Connection, HandshakeConfig, Offer};
use rrpc_core::handshake::{Hello, Message};
use rrpc_core::{FabricAddr, QpConfig};
use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, RawSideChannel, Transport, config, raw_fabric};
use rrpc_ringbuf::{LocalRing, RingConfig, RingRx, RingTx};
use rrpc_tonic::{RrpcChannel, RrpcConfig};

fn server_cfg(t: Transport, handshake: Duration) -> RrpcConfig {
    config(t)
        .to_builder()
        .handshake_timeout(handshake)
        .build()
        .expect("timeout")
}

/// Waits until `closed()` says so, for at most `limit`.
fn closes_within(limit: Duration, mut closed: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if closed() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A client that does rrpc-core's handshake with the server's ring parameters
/// and then stops: what a hostile client built from the public API can do.
fn core_handshake_only(t: Transport, uri: String) -> (Connection, RingTx, RingRx) {
    // The path hello (rrpc-tonic's transport docs): HTTP/2, 64 KiB window.
    core_handshake_with(t, uri, rrpc_tonic::frame::path_hello(1, 64 << 10).to_vec())
        .expect("core handshake")
}

/// rrpc-core's handshake to an rrpc-tonic server by hand, with `app` as
/// rrpc-tonic's section (none if empty), and the rings it sets up.
fn core_handshake_with(
    t: Transport,
    uri: String,
    app: Vec<u8>,
) -> Result<(Connection, RingTx, RingRx), rrpc_core::Error> {
    let fabric = raw_fabric(t);
    let ring = RingConfig::builder()
        .ring_size(1 << 20)
        .build()
        .expect("ring config");
    let local = LocalRing::new(&fabric, &ring).expect("ring");
    let mut offer = Offer::new();
    if !app.is_empty() {
        offer = offer.section(rrpc_tonic::frame::HANDSHAKE_SECTION, app);
    }
    let offer = local.add_to_offer(offer);
    let qp = fabric.create_qp(&QpConfig::default()).expect("qp");
    let ep = FabricAddr::parse(&uri).expect("rings uri");
    let c = rrpc_core::conn::connect(&ep, qp, offer, &HandshakeConfig::default())?;
    let (tx, rx) = local.connect(&c).expect("rings");
    Ok((c, tx, rx))
}

fn is_gone(c: &Connection) -> bool {
    c.check_alive().is_err()
}

/// Under churn (connections opened, used once and dropped by two tasks as
/// fast as they can), every connect succeeds. Before: a connection task
/// ending cancelled the accept loop's in-flight handshake, and about a
/// third of connects failed with "server closed during path negotiation".
async fn churn(t: Transport) {
    let h = Harness::start(t).await;
    drop(h.channel().await);
    // Fewer rounds on verbs: each connect there creates a queue pair and
    // registers rings, about 0.2 s under soft-RoCE in an emulated VM.
    let rounds = if t.is_rdma() { 15 } else { 60 };
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (uri, cfg) = (h.uri.clone(), config(t));
        tasks.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for i in 0..rounds {
                match RrpcChannel::connect(&uri, cfg.clone()).await {
                    Ok(ch) => {
                        // Every other connection makes a call before it goes.
                        if i % 2 == 0 {
                            let mut c =
                                rrpc_integration_tests::pb::test_client::TestClient::new(ch);
                            if let Err(s) = c.unary(Input::default()).await {
                                failed.push(format!("call: {s}"));
                            }
                        }
                    }
                    Err(e) => failed.push(format!("connect: {e}")),
                }
            }
            failed
        }));
    }
    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.expect("task"));
    }
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        2 * rounds
    );
}

/// Fifty clients that connect and stay silent, and one that sends half a
/// hello, do not delay an honest client: it connects and calls while they
/// sit in their (30 s) handshake window. Before: accept was serial, and the
/// honest client waited behind each silent one.
async fn silent_clients_do_not_delay_honest_ones(t: Transport) {
    let h = Harness::start_with(t, server_cfg(t, Duration::from_secs(30))).await;
    drop(h.channel().await);
    let mut silent: Vec<RawSideChannel> =
        (0..50).map(|_| RawSideChannel::connect(&h.uri)).collect();
    let hello = Message::Hello(Hello::default()).encode().expect("encode");
    silent[0]
        .write_all(&hello[..hello.len() / 2])
        .expect("half a hello");
    let honest = async {
        let ch = RrpcChannel::connect(&h.uri, config(t))
            .await
            .expect("connect");
        let mut c = rrpc_integration_tests::pb::test_client::TestClient::new(ch);
        c.unary(Input::default()).await.expect("call");
    };
    tokio::time::timeout(Duration::from_secs(10), honest)
        .await
        .expect("an honest client is not held behind silent ones");
    drop(silent);
}

/// A client that trickles its hello one byte every 100 ms is cut off once
/// the handshake timeout (here 500 ms) has passed in total. Before: the
/// timeout applied to each read, so it held its handshake for as long as it
/// kept trickling.
async fn trickling_client_is_cut_at_the_handshake_timeout(t: Transport) {
    let h = Harness::start_with(t, server_cfg(t, Duration::from_millis(500))).await;
    drop(h.channel().await);
    let uri = h.uri.clone();
    let cut = tokio::task::spawn_blocking(move || {
        let mut s = RawSideChannel::connect(&uri);
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        // A hello with a 4 KiB section: trickled, it would take minutes.
        let hello = Message::Hello(Hello {
            sections: vec![rrpc_core::Section {
                tag: rrpc_tonic::frame::HANDSHAKE_SECTION,
                bytes: vec![7; 4000],
            }],
            ..Hello::default()
        })
        .encode()
        .expect("encode");
        let start = Instant::now();
        for b in hello.iter().cycle() {
            if start.elapsed() > Duration::from_secs(8) {
                return false;
            }
            if s.write_all(&[*b]).is_err() {
                return true;
            }
            let mut buf = [0u8; 64];
            match s.read(&mut buf) {
                // EOF: the server let go (a Reject, if any, came first).
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return true,
            }
        }
        false
    });
    assert!(
        cut.await.expect("task"),
        "the server still held the trickling client after 8 s"
    );
    // The server still serves.
    let mut c = h.client().await;
    c.unary(Input::default()).await.expect("call");
}

/// A client whose handshake carries no path hello, or a malformed one, is
/// refused in the handshake with the reason, and holds nothing on the
/// server. (The path hello rides in rrpc-core's handshake; before it did,
/// such a client was held until the handshake timeout.)
async fn client_without_a_path_hello_is_refused(t: Transport) {
    let h = Harness::start(t).await;
    drop(h.channel().await);
    for (app, says) in [
        // No section at all.
        (Vec::new(), "malformed or unsupported path hello (0 bytes"),
        (b"RRP1\0".to_vec(), "this build speaks RRP2"),
        (
            rrpc_tonic::frame::path_hello(7, 64 << 10).to_vec(),
            "unknown path 7",
        ),
        (
            rrpc_tonic::frame::path_hello(0, 10).to_vec(),
            "call window 10",
        ),
    ] {
        let uri = h.uri.clone();
        let Err(e) = tokio::task::spawn_blocking(move || core_handshake_with(t, uri, app))
            .await
            .expect("task")
        else {
            panic!("accepted a handshake without a valid path hello ({says})");
        };
        assert!(
            matches!(&e, rrpc_core::Error::Rejected(r) if r.contains(says)),
            "{e}"
        );
    }
    // The server still serves.
    let mut c = h.client().await;
    c.unary(Input::default()).await.expect("call");
}

/// A client that completes the handshake (path hello included) and then
/// stays silent holds its connection like any idle client, and costs the
/// server's accept loop nothing: others connect and call meanwhile.
async fn silent_client_after_the_handshake_delays_no_one(t: Transport) {
    let h = Harness::start(t).await;
    let uri = h.uri.clone();
    let (_conn, _tx, _rx) = tokio::task::spawn_blocking(move || core_handshake_only(t, uri))
        .await
        .expect("task");
    let mut c = h.client().await;
    c.unary(Input::default()).await.expect("call");
}

/// Garbage instead of the HTTP/2 connection preface closes the connection.
/// Before: the connection stayed open (the ring reader task outlived the
/// failed hyper connection).
async fn garbage_instead_of_the_http2_preface_closes_the_connection(t: Transport) {
    let h = Harness::start(t).await;
    drop(h.channel().await);
    let uri = h.uri.clone();
    let closed = tokio::task::spawn_blocking(move || {
        let (conn, mut tx, _rx) = core_handshake_only(t, uri);
        // The server's path reply came in its accept.
        let reply = conn.peer().section(rrpc_tonic::frame::HANDSHAKE_SECTION);
        assert_eq!(
            &reply.expect("a reply")[..5],
            b"RRP2\x01",
            "server chose HTTP/2"
        );
        let garbage = vec![0x5au8; 256];
        tx.try_send(&garbage).expect("garbage");
        tx.flush().expect("flush");
        closes_within(Duration::from_secs(8), || is_gone(&conn))
    });
    assert!(
        closed.await.expect("task"),
        "the connection stayed open after a bad preface"
    );
}

rrpc_integration_tests::on_shm!(
    churn,
    silent_clients_do_not_delay_honest_ones,
    trickling_client_is_cut_at_the_handshake_timeout,
    client_without_a_path_hello_is_refused,
    silent_client_after_the_handshake_delays_no_one,
);
rrpc_integration_tests::on_rdma!(
    churn,
    silent_clients_do_not_delay_honest_ones,
    trickling_client_is_cut_at_the_handshake_timeout,
    client_without_a_path_hello_is_refused,
    silent_client_after_the_handshake_delays_no_one,
);

/// The HTTP/2 path only: its preface.
mod h2_preface {
    use super::garbage_instead_of_the_http2_preface_closes_the_connection;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shm_h2() {
        garbage_instead_of_the_http2_preface_closes_the_connection(
            rrpc_integration_tests::Transport::ShmH2,
        )
        .await
    }

    #[cfg(feature = "verbs")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rdma_h2() {
        if rrpc_integration_tests::Transport::rdma_device().is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
            return;
        }
        eprintln!("rrpc-test-on-verbs");
        garbage_instead_of_the_http2_preface_closes_the_connection(
            rrpc_integration_tests::Transport::RdmaH2,
        )
        .await
    }
}
