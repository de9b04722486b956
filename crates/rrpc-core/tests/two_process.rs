//! Two real processes over shm: 100k checksummed writes, then death detection.
//!
//! The test binary re-executes itself as the child (`RRPC_CHILD_ROLE` selects
//! the role), so no extra binary is needed.

mod common;

use std::os::fd::BorrowedFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fnv;
use rrpc_core::conn::{self, HandshakeConfig, Offer};
use rrpc_core::{Completion, Endpoint, Error, Fabric, Local, QpConfig};

const SLOTS: u64 = 64;
const SLOT: usize = 1024;
const MSGS: u64 = 100_000;
/// Region layout: word 0 = messages published by the writer, word 8 = messages
/// acknowledged by the reader, slots from 4096.
const PUB: usize = 0;
const ACK: usize = 8;
const BASE: usize = 4096;

fn spawn_child(role: &str, path: &std::path::Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("RRPC_CHILD_ROLE", role)
        .env("RRPC_CHILD_SOCK", path)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Entry point of the child process (a no-op when run as a normal test).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("RRPC_CHILD_ROLE") else {
        return;
    };
    let path = std::env::var("RRPC_CHILD_SOCK").unwrap();
    let ep = Endpoint::Shm(path.into());
    let fabric = Fabric::shm();
    let inbox = fabric.alloc_region(BASE + SLOTS as usize * SLOT).unwrap();
    let scratch = fabric.alloc_region(4096).unwrap();
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new().grant(1, inbox.clone()),
        &HandshakeConfig::default(),
    )
    .unwrap();
    match role.as_str() {
        "reader" => {
            let remote = c.peer().region(1).unwrap();
            let published = inbox.atomic_u64(PUB).unwrap();
            let mut consumed = 0u64;
            let mut wc = [Completion::EMPTY; 4];
            while consumed < MSGS {
                let p = published.load(Ordering::Acquire);
                if p > MSGS || p < consumed {
                    panic!("writer published an impossible count {p}");
                }
                if p == consumed {
                    c.check_alive().unwrap();
                    std::thread::yield_now();
                    continue;
                }
                while consumed < p {
                    let off = BASE + (consumed % SLOTS) as usize * SLOT;
                    let mut hdr = [0u8; 24];
                    inbox.read_at(off, &mut hdr).unwrap();
                    let seq = u64::from_le_bytes(hdr[0..8].try_into().unwrap());
                    let len = u64::from_le_bytes(hdr[8..16].try_into().unwrap()) as usize;
                    let sum = u64::from_le_bytes(hdr[16..24].try_into().unwrap());
                    assert_eq!(
                        seq, consumed,
                        "messages arrive in order, none lost or duplicated"
                    );
                    assert!(len <= SLOT - 24, "length {len} in bounds");
                    let mut body = vec![0u8; len];
                    inbox.read_at(off + 24, &mut body).unwrap();
                    assert_eq!(fnv(&body), sum, "checksum of message {seq}");
                    consumed += 1;
                }
                scratch
                    .atomic_u64(0)
                    .unwrap()
                    .store(consumed, Ordering::Relaxed);
                c.qp()
                    .post_write(
                        consumed,
                        Local::new(&scratch, 0, 8),
                        remote.at(ACK as u64),
                        true,
                    )
                    .unwrap();
                while c.qp().send_cq().poll(&mut wc).unwrap() > 0 {}
            }
            println!("child consumed {consumed} messages");
        }
        "sleeper" => {
            // Stay connected until killed.
            loop {
                std::thread::sleep(Duration::from_millis(50));
                if c.check_alive().is_err() {
                    return;
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn accept_child(role: &str) -> (Child, conn::Connection, std::sync::Arc<rrpc_core::Region>) {
    let path = common::sock_path(role);
    let ep = Endpoint::Shm(path.clone());
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default()).unwrap();
    let child = spawn_child(role, &path);
    let fabric = Fabric::shm();
    let inbox = fabric.alloc_region(BASE + SLOTS as usize * SLOT).unwrap();
    let incoming = listener.accept().unwrap();
    let c = incoming
        .accept(
            fabric.create_qp(&QpConfig::default()).unwrap(),
            Offer::new().grant(1, inbox.clone()),
        )
        .unwrap();
    (child, c, inbox)
}

#[test]
fn hundred_thousand_checksummed_writes() {
    if std::env::var("RRPC_CHILD_ROLE").is_ok() {
        return;
    }
    let (mut child, c, inbox) = accept_child("reader");
    let fabric = Fabric::shm();
    let src = fabric.alloc_region(BASE + SLOTS as usize * SLOT).unwrap();
    let remote = c.peer().region(1).unwrap();
    let acked = inbox.atomic_u64(ACK).unwrap();
    let mut wc = [Completion::EMPTY; 16];
    let mut rng = 0x1234_5678_9abc_def0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..MSGS {
        while i - acked.load(Ordering::Acquire) >= SLOTS {
            assert!(
                Instant::now() < deadline,
                "reader stalled at {}",
                acked.load(Ordering::Acquire)
            );
            std::thread::yield_now();
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let len = (rng % (SLOT as u64 - 24)) as usize;
        let off = BASE + (i % SLOTS) as usize * SLOT;
        let body: Vec<u8> = (0..len).map(|k| (k as u64 ^ rng) as u8).collect();
        let mut msg = Vec::with_capacity(24 + len);
        msg.extend_from_slice(&i.to_le_bytes());
        msg.extend_from_slice(&(len as u64).to_le_bytes());
        msg.extend_from_slice(&fnv(&body).to_le_bytes());
        msg.extend_from_slice(&body);
        src.write_at(off, &msg).unwrap();
        let signaled = i % 32 == 31;
        c.qp()
            .post_write(
                i,
                Local::new(&src, off, msg.len()),
                remote.at(off as u64),
                signaled,
            )
            .unwrap();
        src.atomic_u64(PUB).unwrap().store(i + 1, Ordering::Relaxed);
        c.qp()
            .post_write(i, Local::new(&src, PUB, 8), remote.at(PUB as u64), signaled)
            .unwrap();
        while c.qp().send_cq().poll(&mut wc).unwrap() > 0 {}
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "child verified every message: {status}");
    assert_eq!(acked.load(Ordering::Acquire), MSGS);
}

#[test]
fn killed_peer_is_detected_within_one_second() {
    if std::env::var("RRPC_CHILD_ROLE").is_ok() {
        return;
    }
    let (mut child, c, _inbox) = accept_child("sleeper");
    c.check_alive().unwrap();
    let scratch = Fabric::shm().alloc_region(4096).unwrap();
    let remote = c.peer().region(1).unwrap();
    c.qp()
        .post_write(1, Local::new(&scratch, 0, 8), remote.at(0), false)
        .unwrap();

    child.kill().unwrap();
    let killed = Instant::now();
    // SAFETY: the connection (and so the fd) outlives this borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(c.liveness_fd()) };
    let mut pfd = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
    let n = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(1000u16)).unwrap();
    assert_eq!(
        n, 1,
        "side channel became readable within one second of the kill"
    );
    assert!(matches!(c.check_alive(), Err(Error::PeerGone)));
    assert!(killed.elapsed() < Duration::from_secs(1));
    // The queue pair is failed: posts return PeerGone and write nothing.
    let e = c
        .qp()
        .post_write(2, Local::new(&scratch, 0, 8), remote.at(0), true)
        .unwrap_err();
    assert!(matches!(e, Error::PeerGone), "{e}");
    assert_eq!(e.fault(), rrpc_core::Fault::PeerGone);
    child.wait().unwrap();
}
