//! Two real processes: 100k checksummed writes (5k on verbs), then death
//! detection; on shm always, on verbs when built with feature `verbs` and
//! `RRPC_TEST_DEVICE` names a device (module `verbs`).
//!
//! The test binary re-executes itself as the child (`RRPC_CHILD_ROLE` selects
//! the role, `RRPC_CHILD_EP` the endpoint, `RRPC_CHILD_DEVICE` the verbs
//! device), so no extra binary is needed.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Provider, fnv, listen};
use rrpc_core::conn::{self, HandshakeConfig, Offer};
use rrpc_core::{Completion, Error, Fabric, FabricAddr, Local, QpConfig};

const SLOTS: u64 = 64;
const SLOT: usize = 1024;
/// Messages on shm; soft-RoCE under an emulated CPU gets fewer.
fn msgs(p: &Provider) -> u64 {
    match p {
        Provider::Shm => 100_000,
        Provider::Verbs(_) => 5_000,
    }
}
/// Region layout: word 0 = messages published by the writer, word 8 = messages
/// acknowledged by the reader, slots from 4096.
const PUB: usize = 0;
const ACK: usize = 8;
const BASE: usize = 4096;

fn spawn_child(role: &str, ep: &FabricAddr, p: &Provider) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if let Provider::Verbs(dev) = p {
        cmd.env("RRPC_CHILD_DEVICE", dev);
    }
    cmd.args([
        "--exact",
        "two_process::child_entry",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("RRPC_CHILD_ROLE", role)
    .env("RRPC_CHILD_EP", ep.to_string())
    .env("RRPC_CHILD_MSGS", msgs(p).to_string())
    .stdout(Stdio::inherit())
    .stderr(Stdio::inherit())
    .spawn()
    .unwrap()
}

/// Entry point of the child process (a no-op when run as a normal test).
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_entry() {
    let Ok(role) = std::env::var("RRPC_CHILD_ROLE") else {
        return;
    };
    let ep = FabricAddr::parse(&std::env::var("RRPC_CHILD_EP").unwrap()).unwrap();
    let provider = match std::env::var("RRPC_CHILD_DEVICE") {
        Ok(dev) => Provider::Verbs(dev),
        Err(_) => Provider::Shm,
    };
    let total: u64 = std::env::var("RRPC_CHILD_MSGS").unwrap().parse().unwrap();
    let fabric = provider.fabric();
    let inbox = fabric.alloc_region(BASE + SLOTS as usize * SLOT).unwrap();
    let scratch = fabric.alloc_region(4096).unwrap();
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new().grant(1, inbox.clone()),
        &HandshakeConfig::default(),
    )
    .unwrap();
    assert_eq!(c.peer().provider, provider.kind());
    match role.as_str() {
        "reader" => {
            let remote = c.peer().region(1).unwrap();
            let published = inbox.atomic_u64(PUB).unwrap();
            let mut consumed = 0u64;
            let mut wc = [Completion::EMPTY; 4];
            while consumed < total {
                let p = published.load(Ordering::Acquire);
                if p > total || p < consumed {
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
                post_retrying(&c, &mut wc, || {
                    c.qp().post_write(
                        consumed,
                        Local::new(&scratch, 0, 8),
                        remote.at(ACK as u64),
                        true,
                    )
                });
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

/// Posts, polling the send queue while it is full (a NIC completes later
/// than shm, so a fast poster can run ahead of its completions).
fn post_retrying(
    c: &conn::Connection,
    wc: &mut [Completion],
    mut post: impl FnMut() -> rrpc_core::Result<()>,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match post() {
            Err(Error::QueueFull { .. }) => {
                assert!(Instant::now() < deadline, "send queue stayed full");
                c.qp().send_cq().poll(wc).unwrap();
            }
            r => return r.unwrap(),
        }
    }
}

fn accept_child(
    role: &str,
    p: &Provider,
) -> (
    Child,
    conn::Connection,
    std::sync::Arc<rrpc_core::Region>,
    Fabric,
) {
    let (listener, ep) = listen(p, role, HandshakeConfig::default());
    let child = spawn_child(role, &ep, p);
    let fabric = p.fabric();
    let inbox = fabric.alloc_region(BASE + SLOTS as usize * SLOT).unwrap();
    let incoming = listener.accept().unwrap();
    let c = incoming
        .accept(
            fabric.create_qp(&QpConfig::default()).unwrap(),
            Offer::new().grant(1, inbox.clone()),
        )
        .unwrap();
    assert_eq!(c.peer().provider, p.kind());
    (child, c, inbox, fabric)
}

/// Runs each named test on shm (module `shm`) and on verbs (module `verbs`).
macro_rules! on_every_provider {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $( #[test] fn $name() {
                if std::env::var("RRPC_CHILD_ROLE").is_ok() { return; }
                super::$name(&super::Provider::Shm);
            } )*
        }
        #[cfg(feature = "verbs")]
        mod verbs {
            $( #[test] fn $name() {
                if std::env::var("RRPC_CHILD_ROLE").is_ok() { return; }
                if let Some(p) = super::Provider::verbs_from_env() { super::$name(&p); }
            } )*
        }
    };
}

on_every_provider!(
    hundred_thousand_checksummed_writes,
    killed_peer_is_detected_within_one_second
);

/// Source words of the published count, one per slot: the device may read a
/// posted WRITE's source after the post, so a word is reused only once the
/// reader acknowledged the message it published.
const PUB_SRC: usize = BASE - SLOTS as usize * 8;

fn hundred_thousand_checksummed_writes(p: &Provider) {
    let total = msgs(p);
    let (mut child, c, inbox, fabric) = accept_child("reader", p);
    let src = fabric.alloc_region(BASE + SLOTS as usize * SLOT).unwrap();
    let remote = c.peer().region(1).unwrap();
    let acked = inbox.atomic_u64(ACK).unwrap();
    let mut wc = [Completion::EMPTY; 16];
    let mut rng = 0x1234_5678_9abc_def0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..total {
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
        post_retrying(&c, &mut wc, || {
            c.qp().post_write(
                i,
                Local::new(&src, off, msg.len()),
                remote.at(off as u64),
                signaled,
            )
        });
        let pub_src = PUB_SRC + (i % SLOTS) as usize * 8;
        src.atomic_u64(pub_src)
            .unwrap()
            .store(i + 1, Ordering::Relaxed);
        post_retrying(&c, &mut wc, || {
            c.qp().post_write(
                i,
                Local::new(&src, pub_src, 8),
                remote.at(PUB as u64),
                signaled,
            )
        });
        while c.qp().send_cq().poll(&mut wc).unwrap() > 0 {}
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "child verified every message: {status}");
    assert_eq!(acked.load(Ordering::Acquire), total);
}

fn killed_peer_is_detected_within_one_second(p: &Provider) {
    let (mut child, c, _inbox, fabric) = accept_child("sleeper", p);
    c.check_alive().unwrap();
    let scratch = fabric.alloc_region(4096).unwrap();
    let remote = c.peer().region(1).unwrap();
    c.qp()
        .post_write(1, Local::new(&scratch, 0, 8), remote.at(0), false)
        .unwrap();

    child.kill().unwrap();
    let killed = Instant::now();
    let fd = c
        .liveness_fd()
        .expect("a dedicated connection has a side channel");
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
