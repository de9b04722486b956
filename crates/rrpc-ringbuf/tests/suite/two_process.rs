//! Two processes: the test binary re-executes itself as the peer
//! (`RRPC_RB_CHILD` selects the role), so each test is one real connection
//! between two address spaces. Each test runs on shm (module `shm`) and, with
//! feature `verbs`, on the device `RRPC_TEST_DEVICE` names (module `verbs`;
//! both processes then check that they run on verbs on that device).

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rrpc_core::conn::{self, HandshakeConfig, Offer};
use rrpc_core::{Fabric, FabricAddr, ProviderKind, QpConfig};
use rrpc_ringbuf::{Error, LocalRing, RingConfig, RingRx, RingTx};

const CHILD: &str = "RRPC_RB_CHILD";
const SOCK: &str = "RRPC_RB_SOCK";
/// The verbs device of the child (unset: shm).
const DEVICE: &str = "RRPC_RB_DEVICE";

/// Runs each named `fn(&Target)` on shm (module `shm`) and, with feature
/// `verbs`, on `RRPC_TEST_DEVICE` (module `verbs`).
macro_rules! on_every_provider {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $( #[test] fn $name() {
                super::$name(&super::Target::new(concat!("two_process::shm::", stringify!($name)), None));
            } )*
        }
        #[cfg(feature = "verbs")]
        mod verbs {
            $( #[test] fn $name() {
                let name = concat!("two_process::verbs::", stringify!($name));
                if std::env::var(super::CHILD).is_ok() {
                    // The child: its device comes from the parent.
                    return super::$name(&super::Target::new(name, None));
                }
                match std::env::var("RRPC_TEST_DEVICE").ok().filter(|d| !d.is_empty()) {
                    Some(dev) => super::$name(&super::Target::new(name, Some(dev))),
                    None => eprintln!("skipped: RRPC_TEST_DEVICE not set"),
                }
            } )*
        }
    };
}

on_every_provider!(
    checksummed_1b_to_1mib_with_wraparound,
    slow_receiver_small_ring_no_batching,
    receiver_dies_sender_sees_backpressure_then_peer_gone,
);

/// Where a test runs: its full name (for the child's `--exact`) and the
/// verbs device (`None`: shm; in a child, read from [`DEVICE`]).
#[derive(Debug)]
struct Target {
    test: &'static str,
    device: Option<String>,
}

impl Target {
    fn new(test: &'static str, device: Option<String>) -> Self {
        let device = device.or_else(|| std::env::var(DEVICE).ok());
        Target { test, device }
    }

    fn fabric(&self) -> Fabric {
        match &self.device {
            None => Fabric::shm(),
            #[cfg(feature = "verbs")]
            Some(dev) => {
                let f = Fabric::verbs(Some(dev)).expect("open the verbs device");
                assert_eq!(f.kind(), ProviderKind::Verbs);
                assert_eq!(f.device_name(), Some(dev.as_str()));
                f
            }
            #[cfg(not(feature = "verbs"))]
            Some(_) => unreachable!("verbs tests need feature `verbs`"),
        }
    }

    fn kind(&self) -> ProviderKind {
        if self.device.is_some() {
            ProviderKind::Verbs
        } else {
            ProviderKind::Shm
        }
    }

    /// Scales a message count down for soft-RoCE under an emulated CPU.
    fn scaled(&self, n: u64) -> u64 {
        if self.device.is_some() {
            (n / 4).max(1)
        } else {
            n
        }
    }

    /// Binds the side channel (a Unix socket, or TCP on 127.0.0.1 with a
    /// kernel-chosen port for verbs) and returns it with its endpoint.
    fn listen(&self, tag: &str) -> (conn::Listener, String) {
        let ep = match &self.device {
            None => {
                // One directory per test: libtest runs the tests of this
                // binary in parallel threads of one process, so the pid alone
                // would give two tests one socket path (AddrInUse).
                let test = self.test.replace("::", "-");
                let dir = std::env::temp_dir()
                    .join(format!("rrpc-rb-{}-{test}-{tag}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                format!("shm://{}/s.sock", dir.display())
            }
            Some(_) => "rdma://127.0.0.1:0".to_owned(),
        };
        let l = conn::Listener::bind(&FabricAddr::parse(&ep).unwrap(), HandshakeConfig::default())
            .unwrap();
        let ep = match l.local_addr() {
            Some(addr) => format!("rdma://{addr}"),
            None => ep,
        };
        (l, ep)
    }

    fn spawn_child(&self, role: &str, sock: &str) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        if let Some(dev) = &self.device {
            cmd.env(DEVICE, dev);
        }
        cmd.args(["--exact", self.test, "--nocapture", "--test-threads=1"])
            .env(CHILD, role)
            .env(SOCK, sock)
            .spawn()
            .expect("spawn child")
    }
}

/// Server side (parent): accept one connection, split the ring.
fn serve(
    t: &Target,
    listener: conn::Listener,
    cfg: &RingConfig,
) -> (conn::Connection, RingTx, RingRx) {
    let fabric = t.fabric();
    let local = LocalRing::new(&fabric, cfg).unwrap();
    let offer = local.add_to_offer(Offer::new());
    let incoming = listener.accept().unwrap();
    let c = incoming
        .accept(fabric.create_qp(&QpConfig::default()).unwrap(), offer)
        .unwrap();
    assert_eq!(c.peer().provider, t.kind());
    let (tx, rx) = local.connect(&c).unwrap();
    (c, tx, rx)
}

/// Client side (child): connect, retrying until the parent listens.
fn dial(t: &Target, ep: &str, cfg: &RingConfig) -> (conn::Connection, RingTx, RingRx) {
    let fabric = t.fabric();
    let ep = FabricAddr::parse(ep).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let local = LocalRing::new(&fabric, cfg).unwrap();
        let offer = local.add_to_offer(Offer::new());
        let qp = fabric.create_qp(&QpConfig::default()).unwrap();
        match conn::connect(&ep, qp, offer, &HandshakeConfig::default()) {
            Ok(c) => {
                assert_eq!(c.peer().provider, t.kind());
                let (tx, rx) = local.connect(&c).unwrap();
                return (c, tx, rx);
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("connect: {e}"),
        }
    }
}

/// Deterministic message sizes 1 B ..= 1 MiB.
fn size_of_msg(i: u64) -> usize {
    const SIZES: [usize; 12] = [
        1,
        7,
        55,
        56,
        57,
        64,
        200,
        1000,
        4096,
        65_536,
        300_000,
        1 << 20,
    ];
    let base = SIZES[(i % SIZES.len() as u64) as usize];
    // Perturb deterministically so lengths are not all slot-aligned.
    (base - (i as usize * 13) % base.min(61)).max(1)
}

fn fill(i: u64, buf: &mut [u8]) {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn checksum(buf: &[u8]) -> u64 {
    buf.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn send_all(tx: &mut RingTx, c: &conn::Connection, n: u64) {
    let mut blocked = 0u64;
    for i in 0..n {
        let len = size_of_msg(i);
        loop {
            match tx.try_reserve(len) {
                Ok(mut g) => {
                    fill(i, &mut g);
                    g.commit().unwrap();
                    break;
                }
                Err(Error::WouldBlock) => {
                    blocked += 1;
                    c.check_alive().expect("receiver alive");
                    std::hint::spin_loop();
                }
                Err(e) => panic!("send {i}: {e}"),
            }
        }
        if i % 7 == 0 {
            tx.flush().unwrap();
        }
    }
    tx.flush().unwrap();
    eprintln!(
        "sender: {n} messages, {blocked} WouldBlock retries, {:?}",
        tx.state().stats()
    );
}

fn recv_all(rx: &mut RingRx, c: &conn::Connection, n: u64, slow: bool) {
    for i in 0..n {
        let want_len = size_of_msg(i);
        let mut want = vec![0u8; want_len];
        fill(i, &mut want);
        loop {
            match rx.try_recv() {
                Ok(m) => {
                    assert_eq!(m.len(), want_len, "message {i} length");
                    assert_eq!(checksum(&m), checksum(&want), "message {i} checksum");
                    break;
                }
                Err(Error::WouldBlock) => {
                    c.check_alive().expect("sender alive");
                    std::hint::spin_loop();
                }
                Err(e) => panic!("recv {i}: {e}"),
            }
        }
        if slow && i % 16 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn run_pair(t: &Target, cfg: RingConfig, n: u64, slow: bool) {
    let n = t.scaled(n);
    if let Ok(sock) = std::env::var(SOCK) {
        if std::env::var(CHILD).as_deref() == Ok("sender") {
            let (c, mut tx, _rx) = dial(t, &sock, &cfg);
            send_all(&mut tx, &c, n);
            // Stay until the receiver has everything (it closes first),
            // polling completions: on a NIC the last tail WRITE may be
            // deferred behind one still in flight (RingTx::poll_completions).
            while c.check_alive().is_ok() {
                let _ = tx.poll_completions();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        return;
    }
    let (listener, sock) = t.listen("pair");
    let mut child = t.spawn_child("sender", &sock);
    let (c, _tx, mut rx) = serve(t, listener, &cfg);
    recv_all(&mut rx, &c, n, slow);
    assert!(
        matches!(rx.try_recv(), Err(Error::WouldBlock)),
        "nothing extra"
    );
    c.close();
    assert!(child.wait().unwrap().success());
}

fn checksummed_1b_to_1mib_with_wraparound(t: &Target) {
    // 2 MiB ring, ~20 MiB of traffic: the array wraps about ten times and
    // 1 MiB messages force gap markers.
    let cfg = RingConfig::builder().ring_size(2 << 20).build().unwrap();
    run_pair(t, cfg, 240, false);
}

fn slow_receiver_small_ring_no_batching(t: &Target) {
    let cfg = RingConfig::builder()
        .ring_size(2 << 20)
        .slot_size(128)
        .no_batching()
        .build()
        .unwrap();
    run_pair(t, cfg, 120, true);
}

fn receiver_dies_sender_sees_backpressure_then_peer_gone(t: &Target) {
    let cfg = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    if let Ok(sock) = std::env::var(SOCK) {
        // Child: receive ten messages, then die without a goodbye.
        let (_c, _tx, mut rx) = dial(t, &sock, &cfg);
        let mut got = 0;
        while got < 10 {
            if rx.try_recv().is_ok() {
                got += 1;
            }
        }
        std::process::abort();
    }
    let (listener, sock) = t.listen("dies");
    let mut child = t.spawn_child("receiver", &sock);
    let (c, mut tx, _rx) = serve(t, listener, &cfg);
    let msg = [7u8; 1000];
    let mut sent = 0u64;
    let mut blocked = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = loop {
        assert!(Instant::now() < deadline, "sender never saw PeerGone");
        match tx.try_send(&msg) {
            Ok(()) => sent += 1,
            Err(Error::WouldBlock) => {
                blocked = true;
                // The liveness check fails the queue pair once the child is gone.
                let _ = c.check_alive();
            }
            Err(e) => break e,
        }
    };
    let _ = child.wait();
    assert!(
        blocked,
        "a full ring must push back before the peer is detected gone"
    );
    assert!(err.is_peer_gone(), "got {err:?}");
    assert!((10..=64 + 10).contains(&sent), "sent {sent}");
    assert!(tx.try_send(&msg).is_err_and(|e| e.is_peer_gone()));
}
