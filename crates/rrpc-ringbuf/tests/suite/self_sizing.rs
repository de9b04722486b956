//! Rings that size themselves, on a real connection: a writer thread sends
//! messages whose sizes make the ring grow, then goes quiet (the ring
//! shrinks), then sends a mix while its policy runs on a virtual clock; a
//! reader thread checks every message (sequence number, length, content)
//! across every switch. On shm both sides must give the unused end of their
//! arrays back to the system after a shrink; on verbs (module `verbs`,
//! `RRPC_TEST_DEVICE`) the registration pins it, and nothing is released.

use crate::common;

use std::time::{Duration, Instant};

use common::{BOUND, Provider};
use rrpc_ringbuf::{Error, RingConfig, RingRx, RingTx};

rrpc_core::on_every_provider!(
    resizes_under_traffic_lose_nothing_and_release_memory,
    a_fixed_peer_follows_a_self_sizing_sender,
    a_quiet_ring_goes_to_its_idle_size_and_lets_its_buffers_go
);

const KIB: usize = 1024;

fn byte(seq: u32, i: usize) -> u8 {
    (seq as usize)
        .wrapping_mul(31)
        .wrapping_add(i.wrapping_mul(7)) as u8
}

/// The message with sequence number `seq` and `len` bytes (at least 8).
fn message(seq: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len).map(|i| byte(seq, i)).collect();
    m[..4].copy_from_slice(&seq.to_le_bytes());
    m[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    m
}

/// Sends `msg`, waiting (bounded) while the ring is full or a switch waits
/// for the reader.
fn send(tx: &mut RingTx, msg: &[u8]) {
    let t0 = Instant::now();
    loop {
        match tx.try_send(msg) {
            Ok(()) => return tx.flush().unwrap(),
            Err(Error::WouldBlock) => {
                assert!(t0.elapsed() < BOUND, "no room for {} bytes", msg.len());
                tx.poll_completions().unwrap();
                std::thread::yield_now();
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// Runs the policy at virtual time `now` until the switch it starts (if
/// any) has been acknowledged by the reader.
fn maintain_until_switched(tx: &mut RingTx, now: Instant) {
    tx.maintain(now).unwrap();
    let t0 = Instant::now();
    while tx.state().switch_pending().is_some() {
        assert!(t0.elapsed() < BOUND, "the reader never passed the marker");
        tx.poll_completions().unwrap();
        tx.maintain(now).unwrap();
        std::thread::yield_now();
    }
}

fn reader(mut rx: RingRx, count: u32) -> RingRx {
    let t0 = Instant::now();
    let mut next = 0u32;
    while next < count {
        let blocked = match rx.try_recv() {
            Ok(m) => {
                assert!(m.len() >= 8, "message {next}: {} bytes", m.len());
                let seq = u32::from_le_bytes(m[..4].try_into().unwrap());
                let len = u32::from_le_bytes(m[4..8].try_into().unwrap()) as usize;
                assert_eq!(seq, next, "out of order");
                assert_eq!(m.len(), len, "message {seq}: length");
                if let Some(i) = (8..len).find(|&i| m[i] != byte(seq, i)) {
                    panic!("message {seq} ({len} bytes): byte {i} is wrong");
                }
                next += 1;
                false
            }
            Err(Error::WouldBlock) => true,
            Err(e) => panic!("reader after {next} messages: {e}"),
        };
        if blocked {
            assert!(t0.elapsed() < BOUND * 2, "stuck after {next} of {count}");
            rx.poll_completions().unwrap();
            std::thread::yield_now();
        }
    }
    rx
}

fn resizes_under_traffic_lose_nothing_and_release_memory(p: &Provider) {
    let cfg = RingConfig::builder()
        .ring_size(1 << 20)
        .min_ring_size(16 * KIB)
        .huge_pages(false)
        .build()
        .unwrap();
    let ((_c1, mut tx, _rx1), (_c2, _tx2, rx)) = common::pair(p, &cfg);
    assert_eq!(tx.state().geometry().ring_bytes(), 16 * KIB, "starts small");
    let (small, large, mixed) = (
        p.scaled(300) as u32,
        p.scaled(100) as u32,
        p.scaled(300) as u32,
    );
    let total = small + large + mixed + 1;
    let reader = std::thread::spawn(move || reader(rx, total));

    let mut seq = 0u32;
    let clock = Instant::now();
    let mut ms = 0u64;
    for i in 0..small {
        send(&mut tx, &message(seq, 8 + (i as usize * 37) % 900));
        seq += 1;
    }
    assert_eq!(
        tx.state().geometry().ring_bytes(),
        16 * KIB,
        "small messages fit"
    );
    // 100 KiB messages ask for 512 KiB: the ring grows before the first.
    for _ in 0..large {
        send(&mut tx, &message(seq, 100 * KIB));
        seq += 1;
    }
    assert_eq!(tx.state().geometry().ring_bytes(), 512 * KIB);
    // Quiet for a (virtual) second and more: back to the minimum.
    // (A tick that finds the ring full cannot write its marker; the next
    // one tries again.)
    let t0 = Instant::now();
    while tx.state().geometry().ring_bytes() != 16 * KIB && t0.elapsed() < BOUND {
        ms += 600;
        maintain_until_switched(&mut tx, clock + Duration::from_millis(ms));
    }
    assert_eq!(
        tx.state().geometry().ring_bytes(),
        16 * KIB,
        "shrunk when quiet"
    );
    // A mix, the policy ticking every 10 messages: grows and shrinks by size.
    let mut x = 12345u64;
    for i in 0..mixed {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = if i % 50 < 10 {
            8 + (x as usize % (200 * KIB))
        } else {
            8 + (x as usize % 2000)
        };
        send(&mut tx, &message(seq, len));
        seq += 1;
        if i % 10 == 9 {
            ms += 500;
            tx.maintain(clock + Duration::from_millis(ms)).unwrap();
        }
    }
    send(&mut tx, &message(seq, 8));
    let rx = reader.join().expect("reader");
    let st = tx.state().stats();
    eprintln!(
        "{total} messages: {} grows, {} shrinks; released {} B of RB_S, {} B of RB_R",
        st.grows,
        st.shrinks,
        tx.released_bytes(),
        rx.released_bytes()
    );
    assert!(st.grows >= 2 && st.shrinks >= 2, "{st:?}");
    let switches = rx.state().resizes();
    assert!(
        switches == st.grows + st.shrinks || switches + 1 == st.grows + st.shrinks,
        "the reader followed {switches} of {} switches",
        st.grows + st.shrinks
    );
    if p.is_verbs() {
        assert_eq!(tx.released_bytes() + rx.released_bytes(), 0, "pinned");
    } else {
        // The quiet shrink from 512 KiB to 16 KiB alone frees 496 KiB.
        assert!(tx.released_bytes() >= 496 * KIB as u64);
        assert!(rx.released_bytes() >= 496 * KIB as u64);
    }
}

fn a_fixed_peer_follows_a_self_sizing_sender(p: &Provider) {
    // Each receiver follows its peer's sender: the start size travels in
    // the handshake, the switches in the ring.
    let sizing = RingConfig::builder()
        .ring_size(256 * KIB)
        .min_ring_size(2 * KIB)
        .build()
        .unwrap();
    let fixed = RingConfig::builder().ring_size(256 * KIB).build().unwrap();
    let (c, s) = common::pair_with(p, &sizing, &fixed, &Default::default());
    let ((_c1, mut tx, _), (_c2, _, mut rx)) = (c.unwrap(), s.unwrap());
    assert_eq!(
        rx.state().geometry().ring_bytes(),
        2 * KIB,
        "the peer's start"
    );
    // 1000 bytes ask for 4 KiB: the first try writes the marker and waits
    // for the reader to pass it.
    let msg = message(0, 1000);
    let t0 = Instant::now();
    loop {
        match tx.try_send(&msg) {
            Ok(()) => break,
            Err(Error::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(t0.elapsed() < BOUND, "the switch never completed");
        match rx.try_recv() {
            Err(Error::WouldBlock) => {}
            other => panic!("only a marker is in the ring: {:?}", other.map(|m| m.len())),
        }
        common::drive(&mut tx, &mut rx);
    }
    tx.flush().unwrap();
    assert_eq!(
        rx.state().geometry().ring_bytes(),
        4 * KIB,
        "followed the marker"
    );
    common::expect_message(p, &mut tx, &mut rx, "after the switch");
    let m = rx.try_recv().unwrap();
    assert_eq!(&*m, &msg[..]);
}

/// Sends `msg` from one thread that also reads (both ends here): while the
/// ring is full or a switch waits for the reader, the reader reads what
/// is there (markers included) and keeps it.
fn send_reading(tx: &mut RingTx, rx: &mut RingRx, msg: &[u8], got: &mut Vec<Vec<u8>>) {
    let t0 = Instant::now();
    loop {
        match tx.try_send(msg) {
            Ok(()) => return tx.flush().unwrap(),
            Err(Error::WouldBlock) => {
                assert!(t0.elapsed() < BOUND, "no room for {} bytes", msg.len());
                tx.poll_completions().unwrap();
                read_all(rx, got);
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// Reads every message there is (and the markers between them).
fn read_all(rx: &mut RingRx, got: &mut Vec<Vec<u8>>) {
    loop {
        let m = match rx.try_recv() {
            Ok(m) => m.to_vec(),
            Err(Error::WouldBlock) => break,
            Err(e) => panic!("recv: {e}"),
        };
        got.push(m);
    }
    rx.poll_completions().unwrap();
}

/// Below the minimum while quiet (`RingConfig::idle_ring_size`): after a
/// burst of large messages and a quiet `shrink_after` (a virtual clock
/// ticked every half of it), the ring is at its idle size on both ends,
/// the receiver has let its copy buffer go, and on shm both ends have
/// released everything past the idle size; the next messages grow it back
/// and arrive intact and in order.
fn a_quiet_ring_goes_to_its_idle_size_and_lets_its_buffers_go(p: &Provider) {
    let cfg = RingConfig::builder()
        .ring_size(1 << 20)
        .min_ring_size(16 * KIB)
        .idle_ring_size(4 * KIB)
        .shrink_after(Duration::from_secs(1))
        .huge_pages(false)
        .build()
        .unwrap();
    let ((_c1, mut tx, _rx1), (_c2, _tx2, mut rx)) = common::pair(p, &cfg);
    // On verbs the registration keeps the pages: a quiet ring stays at its
    // minimum there (no round trip for nothing).
    let idle = if p.is_verbs() { 16 * KIB } else { 4 * KIB };
    let mut got = Vec::new();
    let mut sent = Vec::new();
    for seq in 0..8 {
        let m = message(seq, 100 * KIB);
        send_reading(&mut tx, &mut rx, &m, &mut got);
        sent.push(m);
    }
    let t0 = Instant::now();
    while got.len() < sent.len() {
        assert!(t0.elapsed() < BOUND, "{} of {} came", got.len(), sent.len());
        tx.poll_completions().unwrap();
        read_all(&mut rx, &mut got);
    }
    assert_eq!(tx.state().geometry().ring_bytes(), 512 * KIB, "grew");
    assert!(rx.buffered_bytes() >= 100 * KIB, "the copy buffer grew");
    // Quiet, the policy ticking every half second of a virtual clock.
    let clock = Instant::now();
    let mut ms = 0;
    while tx.state().geometry().ring_bytes() != idle {
        assert!(ms <= 1500, "no shrink within 1.5 x shrink_after");
        tx.maintain(clock + Duration::from_millis(ms)).unwrap();
        ms += 500;
    }
    // The reader reads the marker; the writer's next tick sees it read.
    let t0 = Instant::now();
    while rx.state().geometry().ring_bytes() != idle {
        assert!(t0.elapsed() < BOUND, "the reader never read the marker");
        tx.poll_completions().unwrap();
        read_all(&mut rx, &mut got);
    }
    assert_eq!(
        rx.buffered_bytes(),
        0,
        "the copy buffer went with the shrink"
    );
    let t0 = Instant::now();
    while tx.state().switch_pending().is_some() {
        assert!(t0.elapsed() < BOUND, "the writer never saw the marker read");
        tx.maintain(clock + Duration::from_millis(ms)).unwrap();
        read_all(&mut rx, &mut got);
    }
    tx.maintain(clock + Duration::from_millis(ms)).unwrap();
    if p.is_verbs() {
        assert_eq!(tx.released_bytes() + rx.released_bytes(), 0, "pinned");
    } else {
        // 512 KiB down to 4 KiB at once.
        assert!(
            tx.released_bytes() >= 508 * KIB as u64,
            "{}",
            tx.released_bytes()
        );
        assert!(
            rx.released_bytes() >= 508 * KIB as u64,
            "{}",
            rx.released_bytes()
        );
    }
    // The next messages, small and large, grow it back first.
    for (seq, len) in [(8, 10), (9, 100 * KIB), (10, 3000)] {
        let m = message(seq, len.max(8));
        send_reading(&mut tx, &mut rx, &m, &mut got);
        sent.push(m);
    }
    let t0 = Instant::now();
    while got.len() < sent.len() {
        assert!(t0.elapsed() < BOUND, "{} of {} came", got.len(), sent.len());
        tx.poll_completions().unwrap();
        read_all(&mut rx, &mut got);
    }
    assert!(tx.state().geometry().ring_bytes() >= 16 * KIB);
    assert_eq!(got.len(), sent.len());
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert!(g == s, "message {i} differs");
    }
}
