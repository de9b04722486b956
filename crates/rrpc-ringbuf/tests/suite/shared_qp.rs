//! Rings over shared queue pairs (`rrpc_core::vqp`): four ring pairs in one
//! handshake, each on its own virtual queue pair of one hardware queue pair
//! per side, carry checked messages both ways, polled (BP) and in EVENT mode
//! (tail `WRITE_WITH_IMM`s routed to the right ring by the sharer tag).
//! Module `verbs` runs the same on `RRPC_TEST_DEVICE` (soft-RoCE in
//! `cargo xtask rxe`; not run on an RDMA NIC).

use crate::common;

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

use common::{BOUND, Provider, expect_message, send};
use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::vqp::{PhysicalQp, VqpConfig};
use rrpc_core::{QpConfig, QueuePair};
use rrpc_ringbuf::{LocalRing, ROLE_RING, RingConfig, RingRx, RingTx};

rrpc_core::on_every_provider!(
    rings_share_one_queue_pair,
    event_mode_rings_share_one_queue_pair
);

const RINGS: u16 = 4;

struct SharedSide {
    conn: Connection,
    phys: PhysicalQp,
    rings: Vec<(Arc<QueuePair>, RingTx, RingRx)>,
}

fn offer(locals: &[LocalRing]) -> Offer {
    locals.iter().enumerate().fold(Offer::new(), |o, (k, l)| {
        l.add_to_offer_as(o, ROLE_RING + k as u16)
    })
}

fn split(conn: Connection, locals: Vec<LocalRing>) -> SharedSide {
    let phys = PhysicalQp::new(conn.qp().clone(), VqpConfig::default()).unwrap();
    let rings = locals
        .into_iter()
        .enumerate()
        .map(|(k, l)| {
            let vq = Arc::new(phys.attach(k as u32, k as u32).unwrap());
            let (tx, rx) = l
                .connect_over(vq.clone(), conn.peer(), ROLE_RING + k as u16)
                .unwrap();
            (vq, tx, rx)
        })
        .collect();
    SharedSide { conn, phys, rings }
}

fn shared_pair(p: &Provider, cfg: &RingConfig, qp: &QpConfig) -> (SharedSide, SharedSide) {
    let fabric = p.fabric();
    let (dir, listener, ep) = common::listen(&fabric);
    let (f2, c2, q2) = (fabric.clone(), cfg.clone(), qp.clone());
    let srv = std::thread::spawn(move || {
        let locals: Vec<LocalRing> = (0..RINGS)
            .map(|_| LocalRing::new(&f2, &c2).unwrap())
            .collect();
        let conn = listener
            .accept()
            .unwrap()
            .accept(f2.create_qp(&q2).unwrap(), offer(&locals))
            .unwrap();
        split(conn, locals)
    });
    let locals: Vec<LocalRing> = (0..RINGS)
        .map(|_| LocalRing::new(&fabric, cfg).unwrap())
        .collect();
    let conn = conn::connect(
        &ep,
        fabric.create_qp(qp).unwrap(),
        offer(&locals),
        &HandshakeConfig::default(),
    )
    .unwrap();
    assert_eq!(
        conn.peer().provider,
        p.kind(),
        "runs on the provider asked for"
    );
    let client = split(conn, locals);
    let server = srv.join().unwrap();
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    (client, server)
}

/// Message `seq` of ring `k`: its header, then bytes derived from both.
fn message(k: usize, seq: u32) -> Vec<u8> {
    let len = 8 + (seq as usize * 37 + k * 101) % 3000;
    let mut m: Vec<u8> = (0..len)
        .map(|i| (i * 7 + k * 13 + seq as usize) as u8)
        .collect();
    m[..4].copy_from_slice(&seq.to_le_bytes());
    m[4..8].copy_from_slice(&(k as u32).to_le_bytes());
    m
}

fn rings_share_one_queue_pair(p: &Provider) {
    let cfg = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let (mut a, mut b) = shared_pair(p, &cfg, &QpConfig::default());
    assert_eq!(a.phys.sharers(), RINGS as usize);
    let rounds = p.scaled(200) as u32;
    for seq in 0..rounds {
        // a -> b on every ring, then b echoes back.
        for k in 0..RINGS as usize {
            let (_, tx, _) = &mut a.rings[k];
            let (_, _, rx) = &mut b.rings[k];
            send(p, tx, rx, &message(k, seq), "a->b");
            tx.flush().unwrap();
        }
        for k in 0..RINGS as usize {
            let (_, tx, _) = &mut a.rings[k];
            let (_, _, rx) = &mut b.rings[k];
            expect_message(p, tx, rx, &format!("ring {k} message {seq}"));
            let m = rx.try_recv().unwrap().to_vec();
            assert_eq!(m, message(k, seq), "ring {k} message {seq} at b");
            let (_, btx, _) = &mut b.rings[k];
            let (_, _, arx) = &mut a.rings[k];
            send(p, btx, arx, &m, "b->a");
            btx.flush().unwrap();
            expect_message(p, btx, arx, &format!("ring {k} echo {seq}"));
            assert_eq!(
                &*arx.try_recv().unwrap(),
                &m[..],
                "ring {k} echo {seq} at a"
            );
        }
    }
    for s in [&a, &b] {
        assert!(!s.conn.qp().is_failed());
        assert!(s.phys.stats().posted >= u64::from(rounds) * u64::from(RINGS));
        for (vq, _, _) in &s.rings {
            assert!(vq.is_virtual() && vq.failure().is_none());
        }
    }
}

fn readable(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    poll(&mut [PollFd::new(fd, PollFlags::POLLIN)], PollTimeout::ZERO).expect("poll") == 1
}

fn event_mode_rings_share_one_queue_pair(p: &Provider) {
    let cfg = RingConfig::builder()
        .ring_size(64 << 10)
        .tail_with_imm(true)
        .build()
        .unwrap();
    let qp = QpConfig::builder().recv_depth(64).build().unwrap();
    let (mut a, mut b) = shared_pair(p, &cfg, &qp);
    for (_, _, rx) in &b.rings {
        rx.post_receives(8).unwrap();
    }
    let rounds = p.scaled(100) as u32;
    for seq in 0..rounds {
        for k in (0..RINGS as usize).rev() {
            let (vq, _, _) = &b.rings[k];
            let cq = vq.recv_cq();
            cq.req_notify().unwrap();
            assert!(
                !readable(cq.channel_fd().unwrap()),
                "ring {k} round {seq}: fired before the send"
            );
        }
        for k in 0..RINGS as usize {
            let (_, tx, _) = &mut a.rings[k];
            tx.try_send(&message(k, seq)).unwrap();
            tx.flush().unwrap();
        }
        for k in 0..RINGS as usize {
            let (vq, _, rx) = &mut b.rings[k];
            let cq = vq.recv_cq();
            let t0 = Instant::now();
            while !readable(cq.channel_fd().unwrap()) {
                assert!(
                    t0.elapsed() < BOUND,
                    "ring {k} round {seq}: channel never fired"
                );
                std::thread::yield_now();
            }
            cq.ack_events().unwrap();
            let t0 = Instant::now();
            let m = loop {
                match rx.try_recv() {
                    Ok(m) => break m.to_vec(),
                    Err(rrpc_ringbuf::Error::WouldBlock) if p.is_verbs() => {
                        assert!(t0.elapsed() < BOUND, "ring {k} round {seq}");
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("ring {k} round {seq}: channel fired, ring says {e}"),
                }
            };
            assert_eq!(m, message(k, seq), "ring {k} round {seq}");
        }
        for (_, tx, _) in &mut a.rings {
            tx.poll_completions().unwrap();
        }
    }
    for (_, tx, _) in &a.rings {
        assert_eq!(tx.imm_fallbacks(), 0, "every tail found a receive");
    }
    assert_eq!(b.phys.stats().misrouted, 0);
    assert!(!b.conn.qp().is_failed());
}
