//! Rings that keep secrets, when asked (issue #57 part 4; feature `tls`):
//! `RrpcConfig::ring_encryption` seals every ring message with an AEAD
//! keyed from the TLS session of the `rrpc://` negotiation.
//!
//! * sealed rings carry calls on the fast path and the HTTP/2 path;
//! * a byte flipped in flight (rrpc-core's `FaultConfig::corrupt_write`
//!   on the server's queue pair) fails the call `DataLoss` and never
//!   returns altered data; the server's other connections keep working;
//!   the same fault on plaintext rings is not detected (the altered reply
//!   reaches the caller): what ring encryption is for;
//! * the ends must agree: a mismatch is `Error::RingEncryption` at the
//!   client (the server refuses the ticket and says why), and sealing
//!   without TLS is refused at connect and at serve.

#![cfg(feature = "tls")]

use std::time::Duration;

use rrpc_core::{FaultConfig, QpConfig};
use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_tonic::tls::{ClientTlsConfig, ServerTlsConfig};
use rrpc_tonic::{
    Carrier, Error, PathPreference, RingEncryption, RrpcChannel, RrpcConfig, RrpcEndpoint, Server,
};
use tokio::sync::oneshot;

use super::tls::{Running, make_pki};
use tonic::{Code, Status};

/// A bound on anything that could hang: a hang fails, not a slow run.
const BOUND: Duration = Duration::from_secs(30);

/// The suite's service (a unary call echoes its payload) on an `rrpc://`
/// port at 127.0.0.1 (port 0), with `tls` if given (the server asks for
/// no client certificate: `Pki::server(true)`).
fn serve(tls: Option<ServerTlsConfig>, config: RrpcConfig) -> Running {
    let mut server = Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).expect("tls config");
    }
    let router = server.add_service(rrpc_integration_tests::test_service());
    let incoming = router.bind("rrpc://127.0.0.1:0", config).expect("bind");
    let uri = incoming.uri().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(router.serve_rrpc_incoming(incoming, async move {
        let _ = stopped.await;
    }));
    Running {
        uri,
        stop: Some(stop),
        task: Some(task),
    }
}

fn cfg(mode: RingEncryption) -> RrpcConfig {
    RrpcConfig::builder()
        .ring_encryption(mode)
        .build()
        .expect("config")
}

/// `cfg(mode)` whose queue pairs flip a byte of their `n`-th large write.
fn corrupting(mode: RingEncryption, n: u64) -> RrpcConfig {
    cfg(mode)
        .to_builder()
        .queue_pair(
            QpConfig::builder()
                .fault(FaultConfig::builder().corrupt_write(n).build().unwrap())
                .build()
                .unwrap(),
        )
        .build()
        .expect("config")
}

async fn client(uri: &str, cfg: RrpcConfig, tls: ClientTlsConfig) -> Result<RrpcChannel, Error> {
    tokio::time::timeout(
        BOUND,
        RrpcEndpoint::new(uri)?
            .config(cfg)
            .tls_config(tls)?
            .connect(),
    )
    .await
    .expect("connect hung")
}

/// A unary echo of `payload`, bounded.
async fn echo(c: &mut TestClient<RrpcChannel>, payload: &[u8]) -> Result<Vec<u8>, Status> {
    let call = c.unary(Input {
        payload: payload.to_vec(),
        ..Default::default()
    });
    match tokio::time::timeout(BOUND, call).await {
        Ok(r) => r.map(|r| r.into_inner().payload),
        Err(_) => panic!("a call hung"),
    }
}

fn payload(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Sealed rings carry calls, small and large (many ring messages each),
/// on the fast path and on the HTTP/2 path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_rings_carry_calls_on_both_paths() {
    let pki = make_pki();
    let s = serve(Some(pki.server(true)), cfg(RingEncryption::Required));
    for path in [PathPreference::Fast, PathPreference::Http2] {
        let c = cfg(RingEncryption::Required)
            .to_builder()
            .path(path)
            .build()
            .unwrap();
        let ch = client(&s.uri, c, pki.anonymous()).await.expect("connect");
        assert_eq!(ch.carrier(), Carrier::Shm);
        let mut c = TestClient::new(ch);
        for (i, n) in [0usize, 64, 4096, 700 << 10].into_iter().enumerate() {
            let p = payload(n, i as u8);
            assert_eq!(echo(&mut c, &p).await.expect("echo"), p, "{path:?}, {n} B");
        }
    }
}

/// The calls on one connection to a server whose queue pairs flip a byte
/// of one large write (`corrupt_write(n)`): each call's outcome,
/// in order, until one fails: `Ok(true)` the payload came back intact,
/// `Ok(false)` it came back altered, `Err` the call failed.
async fn calls_until_failure(
    c: &mut TestClient<RrpcChannel>,
    calls: usize,
) -> Vec<Result<bool, Status>> {
    let mut seen = Vec::new();
    for i in 0..calls {
        let p = payload(1024, i as u8);
        match echo(c, &p).await {
            Ok(got) => seen.push(Ok(got == p)),
            Err(e) => {
                seen.push(Err(e));
                break;
            }
        }
    }
    seen
}

/// A byte flipped in a reply in flight (the server's third large write on
/// each connection) fails that call `DataLoss`; no call returns altered
/// data; the channel reconnects; another connection to the same server
/// (opened before, used after the failure, for one call) keeps working;
/// and a new connection works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_fails_the_call_with_data_loss_and_nothing_else() {
    let pki = make_pki();
    let s = serve(
        Some(pki.server(true)),
        corrupting(RingEncryption::Required, 3),
    );
    let sealed = || client(&s.uri, cfg(RingEncryption::Required), pki.anonymous());
    let mut a = TestClient::new(sealed().await.expect("connect a"));
    let mut b = TestClient::new(sealed().await.expect("connect b"));
    let seen = calls_until_failure(&mut a, 5).await;
    // The server's large writes on a connection: the ticket's answer (its
    // ring write counts: with `corrupt_write(2)` the first reply was hit),
    // then one reply per call: the third is the second call's reply.
    let (last, intact) = seen.split_last().expect("a call");
    assert!(
        !intact.is_empty() && intact.iter().all(|r| matches!(r, Ok(true))),
        "every call before the failure came back intact: {seen:?}"
    );
    let e = last
        .as_ref()
        .expect_err("the corrupted reply fails its call");
    assert_eq!(e.code(), Code::DataLoss, "{e}");
    // The connection is failed; the channel reconnects, and its next call,
    // on a new connection, comes back intact.
    let p = payload(1024, 55);
    assert_eq!(echo(&mut a, &p).await.expect("after a reconnect"), p);
    // The server's other connection, and a new one, still serve.
    let p = payload(1024, 77);
    assert_eq!(echo(&mut b, &p).await.expect("the other connection"), p);
    let mut c = TestClient::new(sealed().await.expect("connect c"));
    assert_eq!(echo(&mut c, &p).await.expect("a new connection"), p);
}

/// The same flip on the HTTP/2 path over sealed rings (hyper's frames in
/// the ring messages): the connection fails `DataLoss` for the call in
/// flight, and no call returns altered data. (The fault flips the third
/// large write of every server queue pair, and hyper's handshake makes
/// several: a reconnected channel's connection is hit again, so this test
/// stops at the first failure.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_on_the_http2_path_fails_with_data_loss() {
    let pki = make_pki();
    let s = serve(
        Some(pki.server(true)),
        corrupting(RingEncryption::Required, 3),
    );
    let http2 = cfg(RingEncryption::Required)
        .to_builder()
        .path(PathPreference::Http2)
        .build()
        .expect("config");
    let ch = client(&s.uri, http2, pki.anonymous())
        .await
        .expect("connect");
    let mut a = TestClient::new(ch);
    let seen = calls_until_failure(&mut a, 8).await;
    assert!(
        seen.iter().all(|r| !matches!(r, Ok(false))),
        "no call came back altered: {seen:?}"
    );
    let e = seen
        .last()
        .and_then(|r| r.as_ref().err())
        .unwrap_or_else(|| panic!("the flipped byte failed no call: {seen:?}"));
    assert_eq!(e.code(), Code::DataLoss, "{e}");
}

/// The same fault on plaintext rings (TLS on, ring encryption off): the
/// flip is not detected, and the altered reply reaches the caller as if
/// it were what the server sent (what ring encryption is for: the ring's
/// own checks cover its framing, not the bytes of a message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_flip_on_plaintext_rings_goes_undetected() {
    let pki = make_pki();
    let s = serve(Some(pki.server(true)), corrupting(RingEncryption::Off, 2));
    let ch = client(&s.uri, cfg(RingEncryption::Off), pki.anonymous())
        .await
        .expect("connect");
    let seen = calls_until_failure(&mut TestClient::new(ch), 5).await;
    assert!(
        seen.iter().any(|r| matches!(r, Ok(false))),
        "an altered reply was delivered as a good one: {seen:?}"
    );
}

/// Both ends must agree: a client that asks for sealing from a server
/// that has it off, and a client that does not from a server that
/// requires it, each get `Error::RingEncryption` saying which end wants
/// what; sealing without TLS is refused at connect and at serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ends_must_agree_and_sealing_needs_tls() {
    let pki = make_pki();
    let off = serve(Some(pki.server(true)), cfg(RingEncryption::Off));
    let e = client(&off.uri, cfg(RingEncryption::Required), pki.anonymous())
        .await
        .map(|_| ())
        .expect_err("the server has it off");
    assert!(
        matches!(&e, Error::RingEncryption(m) if m.contains("asked for sealed rings")),
        "{e}"
    );
    assert_eq!(tonic::Status::from(e).code(), Code::FailedPrecondition);

    let required = serve(Some(pki.server(true)), cfg(RingEncryption::Required));
    let e = client(&required.uri, cfg(RingEncryption::Off), pki.anonymous())
        .await
        .map(|_| ())
        .expect_err("the server requires it");
    assert!(
        matches!(&e, Error::RingEncryption(m) if m.contains("requires sealed rings")),
        "{e}"
    );
    // `Remote` seals only rdma://: on shm it agrees with `Off`.
    let ch = client(&off.uri, cfg(RingEncryption::Remote), pki.anonymous())
        .await
        .expect("Remote is plaintext on shm");
    assert_eq!(
        echo(&mut TestClient::new(ch), b"x").await.expect("echo"),
        b"x"
    );

    // Without TLS: refused at connect (a bare shm:// address, or the port
    // dialed without tls_config) and at serve.
    let e = RrpcEndpoint::new("shm:///nonexistent/rrpc-ring-encryption.sock")
        .expect("uri")
        .config(cfg(RingEncryption::Required))
        .connect()
        .await
        .map(|_| ())
        .expect_err("no TLS, no keys");
    assert!(
        matches!(&e, Error::RingEncryption(m) if m.contains("tls_config")),
        "{e}"
    );
    let mut bare = serve(None, cfg(RingEncryption::Required));
    let served = tokio::time::timeout(BOUND, bare.task.take().expect("task"))
        .await
        .expect("serve ends at once")
        .expect("join");
    assert!(
        matches!(&served, Err(Error::RingEncryption(m)) if m.contains("tls_config")),
        "{served:?}"
    );
}
