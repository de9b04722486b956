//! Placement order (`proto` docs): a tail that lands before the message it
//! covers is a wait, and a tail published over garbage closes the ring
//! after the placement timeout, naming what was seen. The peer here writes
//! into our ring with raw rrpc-core WRITEs, as a misbehaving (or
//! reordering) peer would: on shm (module `shm`), and with feature `verbs`
//! on `RRPC_TEST_DEVICE` (module `verbs`). A tail record read half-written
//! (`proto` docs, "Pointer records") is a wait too, and one that stays
//! inconsistent closes the ring the same way.

use crate::common;

use std::time::{Duration, Instant};

use common::{BOUND, Provider};
use rrpc_core::{Completion, Local, Status};
use rrpc_ringbuf::proto::{Header, encode_pointer, stamp_for};
use rrpc_ringbuf::{
    Corruption, Error, LOCAL_TAIL_OFFSET, RING_OFFSET, ROLE_RING, RingConfig, RingRx, StampOf,
    Unplaced,
};

rrpc_core::on_every_provider!(
    a_tail_ahead_of_its_message_is_a_wait,
    garbage_under_a_published_tail_closes_after_the_placement_timeout,
    a_half_written_tail_record_is_a_wait,
    a_tail_record_that_stays_inconsistent_closes_the_ring,
);

fn cfg(placement_timeout: Duration) -> RingConfig {
    RingConfig::builder()
        .ring_size(1 << 16)
        .placement_timeout(placement_timeout)
        .build()
        .expect("config")
}

/// Raw WRITEs from `conn` into the peer's ring region.
struct Raw {
    conn: rrpc_core::conn::Connection,
    src: std::sync::Arc<rrpc_core::Region>,
    next: u64,
}

impl Raw {
    /// One signaled WRITE of `bytes` at `at` in the peer's ring region;
    /// returns once its completion says it was placed (on shm that is at
    /// the post already; on verbs only the completion says so).
    fn write(&mut self, at: usize, bytes: &[u8]) {
        let remote = self.conn.peer().region(ROLE_RING).expect("ring region");
        self.src.write_at(0, bytes).expect("source");
        self.next += 1;
        let qp = self.conn.qp();
        qp.post_write(
            self.next,
            Local::new(&self.src, 0, bytes.len()),
            remote.at(at as u64),
            true,
        )
        .expect("post");
        let mut wc = [Completion::EMPTY; 4];
        let t0 = Instant::now();
        loop {
            let n = qp.send_cq().poll(&mut wc).expect("poll");
            if let Some(c) = wc[..n].iter().find(|c| c.wr_id == self.next) {
                assert_eq!(c.status, Status::Success, "WRITE {}", self.next);
                return;
            }
            assert!(n == 0, "unexpected completions {:?}", &wc[..n]);
            assert!(t0.elapsed() < BOUND, "WRITE {} never completed", self.next);
            std::thread::yield_now();
        }
    }
}

fn setup(p: &Provider, cfg: RingConfig) -> (Raw, RingRx, impl Sized) {
    // The source region must be registered where the connection's queue
    // pair lives (one verbs device context and protection domain).
    let fabric = p.fabric();
    let (c, s) = common::pair_on_fabric(&fabric, &cfg, &cfg, &rrpc_core::QpConfig::default());
    let ((c, ctx, crx), (s, stx, srx)) = (c.unwrap(), s.unwrap());
    let src = fabric.alloc_region(4096).expect("region");
    (
        Raw {
            conn: c,
            src,
            next: 0,
        },
        srx,
        (ctx, crx, s, stx),
    )
}

fn a_tail_ahead_of_its_message_is_a_wait(p: &Provider) {
    // The placement timeout is not what this test is about: long enough
    // that the three WRITEs below (slow on soft-RoCE) never reach it.
    let (mut peer, mut rx, _keep) = setup(p, cfg(Duration::from_secs(30)));
    // The tail first: slot 0 is covered but nothing is there yet.
    peer.write(LOCAL_TAIL_OFFSET, &encode_pointer(1));
    assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
    // Then the message: header, payload, end stamp in the slot's last word.
    let mut slot = [0u8; 64];
    slot[..8].copy_from_slice(&Header::new(5, 0, 0).encode());
    slot[8..13].copy_from_slice(b"hello");
    slot[56..].copy_from_slice(&stamp_for(0).to_le_bytes());
    peer.write(RING_OFFSET + 8, &slot[8..]); // all but the header: still a wait
    assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
    peer.write(RING_OFFSET, &slot[..8]);
    let m = rx.try_recv().expect("placed now");
    assert_eq!(&*m, b"hello");
}

/// Polls `rx` until it fails, which must take the 200 ms placement timeout
/// (not less than 150 ms, not more than 5 s) and deliver nothing meanwhile
/// (`delivered` says what a message would have been); returns the error.
fn closed_after_the_timeout(rx: &mut RingRx, delivered: &str) -> Error {
    let start = Instant::now();
    let err = loop {
        match rx.try_recv() {
            Err(Error::WouldBlock) => {
                assert!(start.elapsed() < Duration::from_secs(5), "never closed");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => break e,
            Ok(m) => panic!("{delivered}: {:?}", &*m),
        }
    };
    assert!(start.elapsed() >= Duration::from_millis(150));
    err
}

fn garbage_under_a_published_tail_closes_after_the_placement_timeout(p: &Provider) {
    let (mut peer, mut rx, _keep) = setup(p, cfg(Duration::from_millis(200)));
    let mut slot = [0xABu8; 64];
    // A right header, so only the end stamp is wrong.
    slot[..8].copy_from_slice(&Header::new(5, 0, 0).encode());
    peer.write(RING_OFFSET, &slot);
    peer.write(LOCAL_TAIL_OFFSET, &encode_pointer(1));
    let err = closed_after_the_timeout(&mut rx, "garbage delivered");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::Corrupt(_)) && msg.contains("slot 0") && msg.contains("end stamp"),
        "{msg}"
    );
    // Typed: what was seen, where (the 5-byte message's stamp at slot 0).
    assert!(
        matches!(
            err,
            Error::Corrupt(Corruption::NeverPlaced {
                slot: 0,
                seen: Unplaced::Stamp {
                    slot: 0,
                    what: StampOf::Message(5),
                    ..
                },
            })
        ),
        "{err:?}"
    );
    assert_eq!(err.fault(), rrpc_core::Fault::Peer);
    assert!(
        matches!(rx.try_recv(), Err(Error::Corrupt(_))),
        "stays closed"
    );
}

/// One message of `payload` at slot 0, placed.
fn place_hello(peer: &mut Raw) {
    let mut slot = [0u8; 64];
    slot[..8].copy_from_slice(&Header::new(5, 0, 0).encode());
    slot[8..13].copy_from_slice(b"hello");
    slot[56..].copy_from_slice(&stamp_for(0).to_le_bytes());
    peer.write(RING_OFFSET, &slot);
}

fn a_half_written_tail_record_is_a_wait(p: &Provider) {
    // What soft-RoCE's byte-wise copy showed a receiver: the low byte of a
    // new tail with the rest of the old record. Here: the value word of
    // tail 1 without its check word, then the check.
    let (mut peer, mut rx, _keep) = setup(p, cfg(Duration::from_secs(30)));
    place_hello(&mut peer);
    let rec = encode_pointer(1);
    peer.write(LOCAL_TAIL_OFFSET, &rec[..8]);
    for _ in 0..3 {
        assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
    }
    assert_eq!(rx.state().torn_tails(), 3);
    assert_eq!(rx.state().local_tail(), 0, "a torn value is never used");
    peer.write(LOCAL_TAIL_OFFSET + 8, &rec[8..]);
    let m = rx.try_recv().expect("consistent now");
    assert_eq!(&*m, b"hello");
}

fn a_tail_record_that_stays_inconsistent_closes_the_ring(p: &Provider) {
    let (mut peer, mut rx, _keep) = setup(p, cfg(Duration::from_millis(200)));
    place_hello(&mut peer);
    // A plausible tail value with a wrong check word: never used.
    let mut rec = encode_pointer(1);
    rec[8] ^= 1;
    peer.write(LOCAL_TAIL_OFFSET, &rec);
    let err = closed_after_the_timeout(&mut rx, "message delivered under a bad tail record");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::Corrupt(_)) && msg.contains("tail record"),
        "{msg}"
    );
    assert!(
        matches!(
            err,
            Error::Corrupt(Corruption::Record {
                record: "tail",
                value: 1,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(matches!(rx.try_recv(), Err(Error::Corrupt(_))));
}
