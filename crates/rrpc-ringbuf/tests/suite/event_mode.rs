//! EVENT mode: the sender writes its tail with `WRITE_WITH_IMM`, which
//! consumes a posted receive on the receiver's queue pair and makes its
//! armed receive completion channel readable. The receiver reposts one
//! receive per receive completion (the repost rule), so a stream far longer
//! than the receive depth never runs out of receives.
//!
//! On shm (module `shm`) the channel is readable as soon as `flush` returns;
//! with feature `verbs` on `RRPC_TEST_DEVICE` (module `verbs`) it becomes
//! readable once the `WRITE_WITH_IMM` has landed, so the tests wait for it
//! (bounded), and a readable channel then means the message is there.

use crate::common;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use common::{BOUND, Provider, expect_message, pair_with, send};
use rrpc_core::QpConfig;
use rrpc_ringbuf::{Error, RingConfig, RingTx};

rrpc_core::on_every_provider!(
    channel_fires_on_flush_and_receives_are_reposted_over_a_long_stream,
    batched_stream_keeps_receives_posted,
    burst_beyond_posted_receives_falls_back_to_plain_writes,
    doorbell_rings_once_per_announced_sleep_and_never_for_an_awake_reader,
);

const RECV_DEPTH: u32 = 16;

fn readable(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut p = [PollFd::new(fd, PollFlags::POLLIN)];
    let n = poll(&mut p, PollTimeout::ZERO).expect("poll");
    n == 1
        && p[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN))
}

/// Whether the channel `fd` becomes readable: at once on shm; on verbs
/// within [`BOUND`], driving the sender `tx` meanwhile (a tail deferred
/// behind an in-flight one goes out on a completion).
fn fires(p: &Provider, fd: BorrowedFd<'_>, tx: &mut RingTx) -> bool {
    let t0 = Instant::now();
    loop {
        if readable(fd) {
            return true;
        }
        if !p.is_verbs() || t0.elapsed() > BOUND {
            return false;
        }
        tx.poll_completions().expect("sender completions");
        std::thread::yield_now();
    }
}

fn event_pair(p: &Provider) -> (common::Side, common::Side) {
    let cfg = RingConfig::builder()
        .ring_size(64 << 10)
        .tail_with_imm(true)
        .build()
        .unwrap();
    let qp = QpConfig::builder().recv_depth(RECV_DEPTH).build().unwrap();
    let (c, s) = pair_with(p, &cfg, &cfg, &qp);
    (c.unwrap(), s.unwrap())
}

fn channel_fires_on_flush_and_receives_are_reposted_over_a_long_stream(p: &Provider) {
    let ((_c1, mut tx, _r1), (c2, _t2, mut rx)) = event_pair(p);
    rx.post_receives(RECV_DEPTH).unwrap();
    let qp = c2.qp().clone();
    let cq = qp.recv_cq();
    let fd = cq.channel_fd().unwrap();
    // Ten times the receive depth, one tail WRITE_WITH_IMM per message.
    let rounds = 10 * RECV_DEPTH as usize;
    for i in 0..rounds {
        cq.req_notify().unwrap();
        assert!(!readable(fd), "round {i}: channel readable before any send");
        let msg = (i as u32).to_le_bytes();
        tx.try_send(&msg).unwrap();
        assert!(!readable(fd), "round {i}: batched message must not notify");
        tx.flush().unwrap();
        assert!(
            fires(p, fd, &mut tx),
            "round {i}: flush did not fire the channel"
        );
        assert!(cq.ack_events().unwrap() >= 1);
        assert!(!readable(fd), "round {i}: ack_events drained the channel");
        // The receive completion comes after the WRITE_WITH_IMM's data, and
        // that after the message's WRITE: the message is there (verbs too).
        let m = rx
            .try_recv()
            .unwrap_or_else(|e| panic!("round {i}: channel fired, ring says {e}"));
        assert_eq!(&*m, &msg, "round {i}");
        drop(m);
        assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
    }
    assert_eq!(
        tx.imm_fallbacks(),
        0,
        "a tail found no receive posted: receives were not reposted"
    );
    assert!(tx.state().stats().tail_writes >= rounds as u64);
}

fn batched_stream_keeps_receives_posted(p: &Provider) {
    // Bursts of 40 messages (alpha = 32: one tail WRITE inside the burst,
    // one at the flush), drained after each burst.
    let ((_c1, mut tx, _r1), (_c2, _t2, mut rx)) = event_pair(p);
    rx.post_receives(RECV_DEPTH).unwrap();
    let mut next = 0u32;
    let bursts = 5 * RECV_DEPTH;
    for b in 0..bursts {
        for k in 0..40 {
            let what = format!("burst {b} message {k}");
            send(p, &mut tx, &mut rx, &(next + k).to_le_bytes(), &what);
        }
        tx.flush().unwrap();
        for k in 0..40 {
            expect_message(p, &mut tx, &mut rx, &format!("burst {b} message {k}"));
            let m = rx.try_recv().unwrap();
            assert_eq!(&*m, &(next + k).to_le_bytes());
        }
        next += 40;
    }
    assert_eq!(tx.imm_fallbacks(), 0);
    // At least one tail per burst, two (inside and at the flush) unless a
    // flush's tail waited for the completion of the one inside (verbs).
    let tails = tx.state().stats().tail_writes;
    assert!(tails >= u64::from(bursts), "{tails} tail WRITEs");
    if !p.is_verbs() {
        assert!(tails > u64::from(2 * RECV_DEPTH), "{tails} tail WRITEs");
    }
}

fn burst_beyond_posted_receives_falls_back_to_plain_writes(p: &Provider) {
    // The receiver does not run while the sender writes 3x the posted
    // receives' worth of tails. On shm the extra tails go out as plain
    // WRITEs (never `ReceiverNotReady` to the caller). On verbs the
    // responder answers a WRITE_WITH_IMM that finds no receive with an RNR
    // NAK and the NIC retries it until the receiver reposts (RNR retry 7:
    // for ever), so none falls back; the tails behind it wait (elastic
    // threshold: one tail WRITE in flight). Either way nothing is lost.
    let ((_c1, mut tx, _r1), (c2, _t2, mut rx)) = event_pair(p);
    const POSTED: u32 = 4;
    rx.post_receives(POSTED).unwrap();
    let qp = c2.qp().clone();
    let cq = qp.recv_cq();
    cq.req_notify().unwrap();
    let mut first_unsent = 0;
    if p.is_verbs() {
        // One tail WRITE_WITH_IMM per message, each posted once the one
        // before completed: the posted receives' worth, and one more.
        for i in 0..=POSTED {
            tx.try_send(&i.to_le_bytes()).unwrap();
            tx.flush().unwrap();
            let t0 = Instant::now();
            while tx.state().tail_deferred() {
                assert!(t0.elapsed() < BOUND, "tail {i} never posted");
                tx.poll_completions().unwrap();
                std::thread::yield_now();
            }
        }
        assert_eq!(tx.state().stats().tail_writes, u64::from(POSTED + 1));
        // That one found no receive: it cannot complete while the receiver
        // does not run (however long we poll; this is no timing claim).
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            tx.poll_completions().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            tx.state().tails_in_flight(),
            1,
            "a WRITE_WITH_IMM completed with no receive posted"
        );
        first_unsent = POSTED + 1;
    }
    for i in first_unsent..3 * POSTED {
        tx.try_send(&i.to_le_bytes()).unwrap();
        tx.flush().unwrap();
    }
    if p.is_verbs() {
        assert!(tx.state().tail_deferred(), "the later tails wait");
        assert_eq!(tx.state().stats().tail_writes, u64::from(POSTED + 1));
    }
    let fallbacks = if p.is_verbs() { 0 } else { 2 * POSTED };
    assert_eq!(tx.imm_fallbacks(), u64::from(fallbacks));
    assert!(
        fires(p, cq.channel_fd().unwrap(), &mut tx),
        "the first tail fired the channel"
    );
    for i in 0..3 * POSTED {
        expect_message(p, &mut tx, &mut rx, &format!("message {i}"));
        assert_eq!(&*rx.try_recv().unwrap(), &i.to_le_bytes());
    }
    // try_recv reposted the consumed receives: the next tail carries an
    // immediate again.
    tx.try_send(b"again").unwrap();
    tx.flush().unwrap();
    expect_message(p, &mut tx, &mut rx, "again");
    assert_eq!(&*rx.try_recv().unwrap(), b"again");
    assert_eq!(tx.imm_fallbacks(), u64::from(fallbacks));
}

/// The doorbell fallback (`proto::doorbell`), with tails sent by plain
/// WRITEs: a sender rings (a `WRITE_WITH_IMM` that fires the receiver's
/// armed channel) only after the receiver announced a sleep, and only once
/// per announced sleep; an awake receiver costs it nothing.
fn doorbell_rings_once_per_announced_sleep_and_never_for_an_awake_reader(p: &Provider) {
    let cfg = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let qp = QpConfig::builder().recv_depth(RECV_DEPTH).build().unwrap();
    let (c, s) = pair_with(p, &cfg, &cfg, &qp);
    let ((_c1, mut tx, _r1), (c2, _t2, mut rx)) = (c.unwrap(), s.unwrap());
    assert!(!rx.tails_with_imm());
    let bell = rx.doorbell();
    assert!(bell.peer_rings(), "this rrpc-ringbuf's sender rings");
    rx.post_receives(RECV_DEPTH).unwrap();
    let cq = c2.qp().recv_cq();
    let fd = cq.channel_fd().unwrap();
    cq.req_notify().unwrap();
    // Awake: messages flow, no doorbell.
    for i in 0..20u32 {
        send(p, &mut tx, &mut rx, &i.to_le_bytes(), "awake");
        tx.flush().unwrap();
        expect_message(p, &mut tx, &mut rx, "awake");
        drop(rx.try_recv().unwrap());
    }
    assert_eq!(tx.doorbells(), 0, "rang for a reader that never slept");
    assert!(!readable(fd));
    for round in 0..3 * RECV_DEPTH {
        // Arm, announce, re-check (empty), "sleep".
        rx.replenish().unwrap();
        cq.req_notify().unwrap();
        bell.announce_sleep().unwrap();
        assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
        // Two messages while asleep: one doorbell.
        for k in 0..2u32 {
            tx.try_send(&(round * 2 + k).to_le_bytes()).unwrap();
            tx.flush().unwrap();
        }
        assert!(fires(p, fd, &mut tx), "round {round}: no doorbell");
        assert!(cq.ack_events().unwrap() >= 1);
        assert_eq!(tx.doorbells(), u64::from(round) + 1, "one ring per sleep");
        for k in 0..2u32 {
            expect_message(p, &mut tx, &mut rx, "after the doorbell");
            let m = rx.try_recv().unwrap();
            assert_eq!(&*m, &(round * 2 + k).to_le_bytes());
        }
    }
    assert_eq!(bell.announced(), u64::from(3 * RECV_DEPTH));
    assert_eq!(tx.doorbells_refused(), 0, "receives were reposted");
}
