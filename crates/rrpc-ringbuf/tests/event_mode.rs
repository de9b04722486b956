//! EVENT mode: the sender writes its tail with `WRITE_WITH_IMM`, which
//! consumes a posted receive on the receiver's queue pair and makes its
//! armed receive completion channel readable. The receiver reposts one
//! receive per receive completion (the repost rule), so a stream far longer
//! than the receive depth never runs out of receives.

mod common;

use std::os::fd::RawFd;

use common::pair_with;
use rrpc_core::QpConfig;
use rrpc_ringbuf::{Error, RingConfig};

const RECV_DEPTH: u32 = 16;

fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd for the duration of the call; timeout 0.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && p.revents & libc::POLLIN != 0
}

fn event_pair() -> (common::Side, common::Side) {
    let cfg = RingConfig::builder()
        .ring_size(64 << 10)
        .tail_with_imm(true)
        .build()
        .unwrap();
    let qp = QpConfig::default().with_recv_depth(RECV_DEPTH).unwrap();
    let (c, s) = pair_with(&cfg, &cfg, &qp);
    (c.unwrap(), s.unwrap())
}

#[test]
fn channel_fires_on_flush_and_receives_are_reposted_over_a_long_stream() {
    let ((_c1, mut tx, _r1), (c2, _t2, mut rx)) = event_pair();
    rx.post_receives(RECV_DEPTH).unwrap();
    let cq = c2.qp().recv_cq();
    let fd = cq.channel_fd();
    // Ten times the receive depth, one tail WRITE_WITH_IMM per message.
    let rounds = 10 * RECV_DEPTH as usize;
    for i in 0..rounds {
        cq.req_notify().unwrap();
        assert!(!readable(fd), "round {i}: channel readable before any send");
        let msg = (i as u32).to_le_bytes();
        tx.try_send(&msg).unwrap();
        assert!(!readable(fd), "round {i}: batched message must not notify");
        tx.flush().unwrap();
        assert!(readable(fd), "round {i}: flush did not fire the channel");
        assert!(cq.ack_events().unwrap() >= 1);
        assert!(!readable(fd), "round {i}: ack_events drained the channel");
        let m = rx.try_recv().unwrap();
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

#[test]
fn batched_stream_keeps_receives_posted() {
    // Bursts of 40 messages (alpha = 32: one tail WRITE inside the burst,
    // one at the flush), drained after each burst.
    let ((_c1, mut tx, _r1), (_c2, _t2, mut rx)) = event_pair();
    rx.post_receives(RECV_DEPTH).unwrap();
    let mut next = 0u32;
    for _ in 0..(5 * RECV_DEPTH) {
        for k in 0..40 {
            tx.try_send(&(next + k).to_le_bytes()).unwrap();
        }
        tx.flush().unwrap();
        for k in 0..40 {
            let m = rx.try_recv().unwrap();
            assert_eq!(&*m, &(next + k).to_le_bytes());
        }
        next += 40;
    }
    assert_eq!(tx.imm_fallbacks(), 0);
    assert!(tx.state().stats().tail_writes > u64::from(2 * RECV_DEPTH));
}

#[test]
fn burst_beyond_posted_receives_falls_back_to_plain_writes() {
    // The receiver does not run while the sender writes 3x the posted
    // receives' worth of tails: the extra tails go out as plain WRITEs
    // (never `ReceiverNotReady` to the caller) and nothing is lost.
    let ((_c1, mut tx, _r1), (c2, _t2, mut rx)) = event_pair();
    const POSTED: u32 = 4;
    rx.post_receives(POSTED).unwrap();
    let cq = c2.qp().recv_cq();
    cq.req_notify().unwrap();
    for i in 0..3 * POSTED {
        tx.try_send(&i.to_le_bytes()).unwrap();
        tx.flush().unwrap();
    }
    assert!(
        readable(cq.channel_fd()),
        "the first tail fired the channel"
    );
    assert_eq!(tx.imm_fallbacks(), u64::from(2 * POSTED));
    for i in 0..3 * POSTED {
        assert_eq!(&*rx.try_recv().unwrap(), &i.to_le_bytes());
    }
    // try_recv reposted the consumed receives: the next tail carries an
    // immediate again.
    tx.try_send(b"again").unwrap();
    tx.flush().unwrap();
    assert_eq!(tx.imm_fallbacks(), u64::from(2 * POSTED));
}
