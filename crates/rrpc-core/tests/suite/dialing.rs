//! `conn::Dialing`: the client handshake in two halves around the wait for
//! the server's answer. On shm the start neither waits nor reads; the
//! answer is reported arrived only once it is whole; `finish` then reads
//! it without waiting and the connection carries WRITEs; a refusal and a
//! server that answers in part and leaves are errors, never a wait.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use rrpc_core::conn::{self, Dialing, HandshakeConfig, Offer};
use rrpc_core::{Error, Fabric, Local, QpConfig};

/// Polls `answer_arrived` until it says yes (bounded).
fn until_arrived(d: &Dialing) {
    let end = Instant::now() + Duration::from_secs(10);
    while !d.answer_arrived().unwrap() {
        assert!(Instant::now() < end, "the answer never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_answer_is_awaited_then_read_without_waiting() {
    let ep = common::endpoint("dialing");
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
    let fabric = Fabric::shm();
    let granted = fabric.alloc_region(4096).unwrap();
    let d = Dialing::start(
        &ep,
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new().grant(1, granted.clone()),
        &HandshakeConfig::default(),
    )
    .unwrap();
    assert!(d.answer_fd().is_some(), "shm starts without blocking");
    // Nobody has accepted: no answer, and asking does not wait.
    assert!(!d.answer_arrived().unwrap());
    let f2 = fabric.clone();
    let server = std::thread::spawn(move || {
        let mine = f2.alloc_region(4096).unwrap();
        let inc = listener.accept().unwrap();
        let c = inc
            .accept(
                f2.create_qp(&QpConfig::default()).unwrap(),
                Offer::new().grant(1, mine.clone()),
            )
            .unwrap();
        (c, mine)
    });
    until_arrived(&d);
    let c = d.finish().unwrap();
    let (s, mine) = server.join().unwrap();
    // The connection works: the server's region, as granted, is the
    // client's remote; a WRITE lands there.
    let remote = c.peer().region(1).expect("the server granted role 1");
    assert_eq!(remote.len, 4096);
    granted.write_at(0, b"dialed").unwrap();
    c.qp()
        .post_write(7, Local::new(&granted, 0, 6), remote.at(0), true)
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut got = [0u8; 6];
    while {
        mine.read_at(0, &mut got).unwrap();
        &got != b"dialed"
    } {
        assert!(Instant::now() < end, "the WRITE never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(s.check_alive().is_ok() && c.check_alive().is_ok());
}

#[test]
fn a_refusal_is_an_error() {
    let ep = common::endpoint("dialing-refused");
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
    let server = std::thread::spawn(move || {
        let inc = listener.accept().unwrap();
        inc.reject("not today").unwrap();
    });
    let fabric = Fabric::shm();
    let d = Dialing::start(
        &ep,
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new(),
        &HandshakeConfig::default(),
    )
    .unwrap();
    until_arrived(&d);
    let e = d.finish().unwrap_err();
    assert!(
        matches!(e, Error::Rejected(ref r) if r.contains("not today")),
        "{e}"
    );
    server.join().unwrap();
}

/// A server that sends 12 bytes of an answer announcing 100 and closes:
/// reported arrived (waiting would not help) and `finish` fails at once
/// with what happened, not the deadline.
#[test]
fn a_partial_answer_then_close_fails_at_once() {
    let path = common::sock_path("dialing-part");
    let l = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        let len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        let mut part = head;
        part[6] = 2; // Accept
        part[8..12].copy_from_slice(&100u32.to_le_bytes());
        s.write_all(&part).unwrap();
    });
    let fabric = Fabric::shm();
    let hs = HandshakeConfig::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let d = Dialing::start(
        &rrpc_core::FabricAddr::Shm(path),
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new(),
        &hs,
    )
    .unwrap();
    server.join().unwrap();
    until_arrived(&d);
    let t0 = Instant::now();
    let e = d.finish().unwrap_err();
    assert!(
        matches!(e, Error::MalformedHandshake(ref m) if m.contains("closed after 12")),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
}
