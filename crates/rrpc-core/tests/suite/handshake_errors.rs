//! Bad handshakes get a clear error and a closed socket; the listener survives.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rrpc_core::conn::{self, HandshakeConfig, Offer};
use rrpc_core::handshake::{HEADER_LEN, MAGIC, MAX_BODY, Message, VERSION};
use rrpc_core::{Error, Fabric, FabricAddr, Fault, QpConfig};

fn listener(cfg: HandshakeConfig) -> (conn::Listener, FabricAddr, std::path::PathBuf) {
    let path = common::sock_path("hs");
    let ep = FabricAddr::Shm(path.clone());
    (conn::Listener::bind(&ep, cfg).unwrap(), ep, path)
}

/// Sends raw bytes, returns the server's error and what the client read back.
fn raw_client(bytes: Vec<u8>, cfg: HandshakeConfig) -> (Error, Vec<u8>) {
    let (l, _ep, path) = listener(cfg);
    let client = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut back = Vec::new();
        let _ = s.read_to_end(&mut back); // returns when the server closes
        back
    });
    let err = l.accept().expect_err("bad handshake must be refused");
    (err, client.join().unwrap())
}

fn header(version: u16, kind: u8, len: u32) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.push(kind);
    h.push(0);
    h.extend_from_slice(&len.to_le_bytes());
    h
}

fn decoded_reject(back: &[u8]) -> String {
    match Message::decode(back) {
        Ok(Some((Message::Reject(r), _))) => r.reason,
        other => panic!("expected a Reject, got {other:?}"),
    }
}

#[test]
fn garbage_is_refused_with_a_reject() {
    let (e, back) = raw_client(
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        HandshakeConfig::default(),
    );
    assert!(matches!(e, Error::MalformedHandshake(_)), "{e}");
    assert_eq!(e.fault(), Fault::Peer);
    assert!(decoded_reject(&back).contains("magic"));
}

#[test]
fn other_version_is_refused() {
    let (e, back) = raw_client(header(VERSION + 1, 1, 0), HandshakeConfig::default());
    assert!(
        matches!(e, Error::VersionMismatch { theirs, .. } if theirs == VERSION + 1),
        "{e}"
    );
    assert!(decoded_reject(&back).contains("version"));
}

#[test]
fn oversized_body_is_refused_before_reading_it() {
    let (e, back) = raw_client(header(VERSION, 1, u32::MAX), HandshakeConfig::default());
    assert!(
        matches!(e, Error::MalformedHandshake(ref m) if m.contains("exceeds")),
        "{e}"
    );
    assert!(!back.is_empty());
    let (e, _) = raw_client(
        header(VERSION, 1, MAX_BODY as u32 + 1),
        HandshakeConfig::default(),
    );
    assert!(matches!(e, Error::MalformedHandshake(_)), "{e}");
}

#[test]
fn truncated_body_then_close_is_refused() {
    let mut b = header(VERSION, 1, 100);
    b.extend_from_slice(&[0u8; 10]);
    let (e, _) = raw_client(b, HandshakeConfig::default());
    assert!(
        matches!(e, Error::MalformedHandshake(ref m) if m.contains("closed")),
        "{e}"
    );
}

#[test]
fn silent_client_times_out() {
    let cfg = HandshakeConfig::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let (l, _ep, path) = listener(cfg);
    let _s = UnixStream::connect(&path).unwrap();
    let e = l.accept().unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e}");
}

#[test]
fn hello_without_descriptors_is_refused() {
    // A well-formed hello that claims a region but passes no fds.
    let hello = rrpc_core::handshake::Hello {
        provider: 1,
        endpoint: vec![0; 16],
        regions: vec![rrpc_core::RegionDesc {
            role: 1,
            remote: rrpc_core::RemoteRegion {
                addr: 4096,
                len: 4096,
                rkey: 1,
            },
        }],
        ..Default::default()
    };
    let bytes = Message::Hello(hello).encode().unwrap();
    let (l, _ep, path) = listener(HandshakeConfig::default());
    let client = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(&bytes).unwrap();
        let mut back = Vec::new();
        let _ = s.read_to_end(&mut back);
        back
    });
    let inc = l.accept().unwrap();
    let f = Fabric::shm();
    let e = inc
        .accept(f.create_qp(&QpConfig::default()).unwrap(), Offer::new())
        .unwrap_err();
    assert!(
        matches!(e, Error::MalformedHandshake(ref m) if m.contains("descriptors")),
        "{e}"
    );
    assert!(decoded_reject(&client.join().unwrap()).contains("descriptors"));
}

/// A client connecting to `ep` on shm with `offer`, on its own thread (the
/// test accepts, or refuses, on this one).
fn connect_in_thread(
    ep: &FabricAddr,
    offer: Offer,
) -> std::thread::JoinHandle<rrpc_core::Result<conn::Connection>> {
    let ep = ep.clone();
    std::thread::spawn(move || {
        let qp = Fabric::shm().create_qp(&QpConfig::default()).unwrap();
        conn::connect(&ep, qp, offer, &HandshakeConfig::default())
    })
}

#[test]
fn wrong_token_is_refused_and_listener_keeps_serving() {
    let cfg = HandshakeConfig::builder()
        .token(b"s3cret".to_vec())
        .build()
        .unwrap();
    let (l, ep, _) = listener(cfg);
    let bad = connect_in_thread(&ep, Offer::new().token(Some(b"nope".to_vec())));
    assert!(matches!(l.accept(), Err(Error::AuthFailed)));
    assert!(matches!(bad.join().unwrap(), Err(Error::AuthFailed)));

    let none = connect_in_thread(&ep, Offer::new());
    assert!(matches!(l.accept(), Err(Error::AuthFailed)));
    assert!(matches!(none.join().unwrap(), Err(Error::AuthFailed)));

    let good = connect_in_thread(&ep, Offer::new().token(Some(b"s3cret".to_vec())));
    let inc = l.accept().unwrap();
    let server = inc
        .accept(
            Fabric::shm().create_qp(&QpConfig::default()).unwrap(),
            Offer::new(),
        )
        .unwrap();
    let client = good.join().unwrap().unwrap();
    server.check_alive().unwrap();
    client.check_alive().unwrap();
}

#[test]
fn explicit_reject_reaches_the_client() {
    let (l, ep, _) = listener(HandshakeConfig::default());
    let c = connect_in_thread(&ep, Offer::new());
    l.accept().unwrap().reject("server is draining").unwrap();
    let e = c.join().unwrap().unwrap_err();
    assert!(
        matches!(e, Error::Rejected(ref r) if r == "server is draining"),
        "{e}"
    );
}

#[test]
fn server_that_never_answers_times_out_the_client() {
    let (l, ep, _) = listener(HandshakeConfig::default());
    let cfg = HandshakeConfig::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    // Hold the accepted socket without answering.
    let holder = std::thread::spawn(move || {
        let inc = l.accept();
        std::thread::sleep(Duration::from_millis(500));
        drop(inc);
    });
    let e = conn::connect(
        &ep,
        Fabric::shm().create_qp(&QpConfig::default()).unwrap(),
        Offer::new(),
        &cfg,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e}");
    holder.join().unwrap();
}

#[test]
fn closing_connection_fails_the_peer() {
    let (a, b) = common::pair(4096);
    a.conn.close();
    // The peer sees the goodbye/EOF; poll for it without sleeping blindly.
    let fd = b
        .conn
        .liveness_fd()
        .expect("a dedicated connection has a side channel");
    let mut pfd = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
    assert_eq!(
        nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(1000u16)).unwrap(),
        1
    );
    assert!(matches!(b.conn.check_alive(), Err(Error::PeerGone)));
    assert!(b.conn.qp().is_failed());
    let l = rrpc_core::Local::new(&b.scratch, 0, 8);
    let r = b.conn.peer().region(1).unwrap();
    assert!(matches!(
        b.conn.qp().post_write(1, l, r.at(0), true),
        Err(Error::PeerGone)
    ));
    assert!(matches!(
        a.conn.qp().post_write(
            1,
            rrpc_core::Local::new(&a.scratch, 0, 8),
            a.conn.peer().region(1).unwrap().at(0),
            true
        ),
        Err(Error::NotConnected)
    ));
}

#[test]
fn header_len_constant_matches() {
    assert_eq!(header(VERSION, 4, 0).len(), HEADER_LEN);
}

/// Every refusal is counted in the `metrics` facade by reason
/// (`rrpc_handshake_refused_total{reason}`), on the thread that refused.
#[test]
fn refusals_are_counted_by_reason() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let cfg = HandshakeConfig::builder()
            .token(b"s3cret".to_vec())
            .build()
            .unwrap();
        let (l, ep, _) = listener(cfg);
        for _ in 0..2 {
            let bad = connect_in_thread(&ep, Offer::new().token(Some(b"nope".to_vec())));
            assert!(matches!(l.accept(), Err(Error::AuthFailed)));
            assert!(matches!(bad.join().unwrap(), Err(Error::AuthFailed)));
        }
    });
    let counted: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == rrpc_core::handshake::REFUSED_METRIC)
        .map(|(k, _, _, v)| {
            let labels: Vec<_> = k
                .key()
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            (labels, v)
        })
        .collect();
    assert_eq!(
        counted,
        vec![(
            vec![("reason".to_string(), "auth".to_string())],
            DebugValue::Counter(2)
        )],
    );
}
