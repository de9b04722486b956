//! Shared queue pairs (`rrpc_core::vqp`, KRCore Algorithm 2): many sharers
//! over one hardware queue pair, each seeing what a dedicated queue pair
//! would show it.
//!
//! Every check runs on shm (module `shm`) and, with feature `verbs` and
//! `RRPC_TEST_DEVICE` set, on verbs (module `verbs`; `cargo xtask rxe` runs
//! them on soft-RoCE in a VM; not run on an RDMA NIC). `common::pair_on`
//! asserts both sides run on the provider asked for.

use crate::common;

use std::time::Instant;

use common::{Provider, Side, pair_on, wait_cq};
use proptest::prelude::*;
use rrpc_core::vqp::{PhysicalQp, VqpConfig};
use rrpc_core::{Completion, Error, Local, QpConfig, QueuePair, Status};

rrpc_core::on_every_provider!(
    sharers_get_their_own_completions_and_data,
    a_malformed_post_hurts_no_other_sharer,
    unsignaled_sharers_never_overflow_a_small_queue,
    immediates_are_routed_to_the_tagged_sharer,
    a_write_before_a_receive_waits_and_a_flood_fails_only_that_sharer,
    completions_of_a_detached_sharer_are_dropped,
    an_armed_sharer_is_woken_when_another_polls_for_it,
    threads_on_one_queue_pair,
    a_failed_hardware_queue_pair_is_no_sharer_s_misbehaviour,
);

/// Shares both ends of a pair with `cfg`.
fn share(a: &Side, b: &Side, cfg: VqpConfig) -> (PhysicalQp, PhysicalQp) {
    (
        PhysicalQp::new(a.conn.qp().clone(), cfg.clone()).unwrap(),
        PhysicalQp::new(b.conn.qp().clone(), cfg).unwrap(),
    )
}

fn poll_all(qp: &QueuePair, recv: bool) -> Vec<Completion> {
    let cq = if recv { qp.recv_cq() } else { qp.send_cq() };
    let mut out = Vec::new();
    let mut buf = [Completion::EMPTY; 16];
    loop {
        let n = cq.poll(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Polls `qp`'s send queue until `n` completions came.
fn wait_send(p: &Provider, qp: &QueuePair, n: usize) -> Vec<Completion> {
    wait_cq(qp.send_cq(), n, p.patience())
}

fn sharers_get_their_own_completions_and_data(p: &Provider) {
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), QpConfig::default());
    let (pa, _pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let sharers: Vec<QueuePair> = (0..8).map(|t| pa.attach(t, t).unwrap()).collect();
    assert_eq!(pa.sharers(), 8);
    // Each sharer writes 32 messages of its own bytes into its own 1 KiB
    // slice of the peer's region; every third one signaled.
    let mut expect: Vec<Vec<u64>> = vec![Vec::new(); 8];
    for i in 0..32u64 {
        for (t, qp) in sharers.iter().enumerate() {
            let off = t * 1024 + (i as usize % 16) * 64;
            a.scratch
                .write_at(off, &[(t as u8) << 4 | (i as u8 & 0xF); 64])
                .unwrap();
            let signaled = i % 3 == 2 || i == 31;
            let wr_id = (t as u64) << 32 | i;
            qp.post_write(
                wr_id,
                Local::new(&a.scratch, off, 64),
                remote.at(off as u64),
                signaled,
            )
            .unwrap();
            if signaled {
                expect[t].push(wr_id);
            }
        }
    }
    for (t, qp) in sharers.iter().enumerate() {
        let got: Vec<u64> = wait_send(p, qp, expect[t].len())
            .iter()
            .map(|c| c.wr_id)
            .collect();
        assert_eq!(
            got, expect[t],
            "sharer {t} gets its own signaled wr_ids in order"
        );
        assert!(poll_all(qp, false).is_empty(), "and nothing else");
        assert_eq!(qp.outstanding(), 0);
    }
    // Every sharer's slice holds its own last bytes.
    for t in 0..8usize {
        let mut got = vec![0u8; 1024];
        b.granted.read_at(t * 1024, &mut got).unwrap();
        for (k, chunk) in got.chunks(64).enumerate() {
            let i = 16 + k; // the last write to this offset
            assert_eq!(
                chunk,
                &[(t as u8) << 4 | (i as u8 & 0xF); 64][..],
                "sharer {t} chunk {k}"
            );
        }
    }
    let st = pa.stats();
    assert_eq!(st.posted, 8 * 32);
    assert_eq!(
        st.dispatched,
        expect.iter().map(Vec::len).sum::<usize>() as u64
    );
    assert!(!a.conn.qp().is_failed());
}

fn a_malformed_post_hurts_no_other_sharer(p: &Provider) {
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), QpConfig::default());
    let (pa, _pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let bad = pa.attach(1, 1).unwrap();
    let good = pa.attach(2, 2).unwrap();
    let local = Local::new(&a.scratch, 0, 64);
    let len = b.granted.len() as u64;
    // Past the end, a wrong key, an immediate wider than a sharer's share.
    assert!(matches!(
        bad.post_write(1, local, remote.at(len - 8), true),
        Err(Error::RemoteOutOfBounds { .. })
    ));
    let wrong_key = rrpc_core::Remote {
        addr: remote.addr,
        rkey: remote.rkey ^ 0x5a5a,
    };
    assert!(matches!(
        bad.post_write(2, local, wrong_key, true),
        Err(Error::BadRemoteKey { .. })
    ));
    assert!(matches!(
        bad.post_write_imm(3, local, remote.at(0), 1 << 20, true),
        Err(Error::InvalidConfig(_))
    ));
    assert!(bad.failure().is_none() && !a.conn.qp().is_failed());
    a.scratch.write_at(0, &[7; 64]).unwrap();
    good.post_write(9, local, remote.at(0), true).unwrap();
    assert_eq!(wait_send(p, &good, 1)[0].wr_id, 9);
    let mut got = [0u8; 64];
    b.granted.read_at(0, &mut got).unwrap();
    assert_eq!(got, [7; 64]);
    assert!(
        poll_all(&bad, false).is_empty(),
        "refused posts complete nothing"
    );
}

fn unsignaled_sharers_never_overflow_a_small_queue(p: &Provider) {
    let depth = 8;
    let cfg = QpConfig::builder().send_depth(depth).build().unwrap();
    let (a, b) = pair_on(p, 1 << 16, cfg.clone(), cfg);
    let (pa, _pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let sharers: Vec<QueuePair> = (0..4).map(|t| pa.attach(t, t).unwrap()).collect();
    // 4 sharers × 100 unsignaled WRITEs each on an 8-deep queue: on a
    // dedicated queue pair each would hit QueueFull after 8 and never recover.
    for i in 0..100u64 {
        for (t, qp) in sharers.iter().enumerate() {
            qp.post_write(
                i,
                Local::new(&a.scratch, t * 64, 64),
                remote.at(t as u64 * 64),
                false,
            )
            .unwrap_or_else(|e| panic!("sharer {t} post {i}: {e}"));
            assert!(a.conn.qp().outstanding() <= u64::from(depth));
        }
    }
    let st = pa.stats();
    assert_eq!(st.posted, 400);
    assert!(st.hidden_signals >= 400 / u64::from(depth), "{st:?}");
    for qp in &sharers {
        assert!(
            poll_all(qp, false).is_empty(),
            "no sharer asked for a completion"
        );
    }
    assert!(!a.conn.qp().is_failed());
}

fn immediates_are_routed_to_the_tagged_sharer(p: &Provider) {
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), QpConfig::default());
    let (pa, pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    // a's sharer t talks to b's sharer 100 + t.
    let senders: Vec<QueuePair> = (0..4).map(|t| pa.attach(t, 100 + t).unwrap()).collect();
    let receivers: Vec<QueuePair> = (0..4).map(|t| pb.attach(100 + t, t).unwrap()).collect();
    for (t, r) in receivers.iter().enumerate() {
        for k in 0..3 {
            r.post_recv((t * 10 + k) as u64).unwrap();
        }
    }
    for k in 0..3u32 {
        for (t, s) in senders.iter().enumerate() {
            s.post_write_imm(
                0,
                Local::new(&a.scratch, 0, 8),
                remote.at(0),
                (t as u32) << 8 | k,
                true,
            )
            .unwrap();
        }
    }
    for (t, r) in receivers.iter().enumerate() {
        let got = wait_cq(r.recv_cq(), 3, p.patience());
        let seen: Vec<(u64, Option<u32>)> = got.iter().map(|c| (c.wr_id, c.imm)).collect();
        let want: Vec<(u64, Option<u32>)> = (0..3)
            .map(|k| ((t * 10 + k) as u64, Some((t as u32) << 8 | k as u32)))
            .collect();
        assert_eq!(seen, want, "receiver {t}");
        assert!(got.iter().all(|c| c.status == Status::Success));
    }
    for s in &senders {
        wait_send(p, s, 3);
    }
    // An immediate naming no sharer at b is counted and dropped.
    let stray = pa.attach(50, 999).unwrap();
    stray
        .post_write_imm(0, Local::new(&a.scratch, 0, 8), remote.at(0), 1, true)
        .unwrap();
    wait_send(p, &stray, 1);
    let deadline = Instant::now() + p.patience();
    while pb.stats().misrouted == 0 {
        pb.progress().unwrap();
        assert!(Instant::now() < deadline, "the stray immediate arrives");
        std::thread::yield_now();
    }
    for r in &receivers {
        assert!(r.failure().is_none());
    }
}

fn a_write_before_a_receive_waits_and_a_flood_fails_only_that_sharer(p: &Provider) {
    // Receive depth 4 at the receiving end: each sharer may be written at
    // most 4 times ahead of its receives.
    let deep4 = QpConfig::builder().recv_depth(4).build().unwrap();
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), deep4);
    let (pa, pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let s1 = pa.attach(1, 1).unwrap();
    let s2 = pa.attach(2, 2).unwrap();
    let r1 = pb.attach(1, 1).unwrap();
    let r2 = pb.attach(2, 2).unwrap();
    let poll = |qp: &QueuePair| {
        let mut wc = [Completion::EMPTY; 8];
        let n = qp.recv_cq().poll(&mut wc)?;
        Ok::<_, Error>(wc[..n].iter().map(|c| (c.wr_id, c.imm)).collect::<Vec<_>>())
    };
    // r1 posted nothing yet: the write waits for r1's first receive (as a
    // NIC's RNR retry holds it on a dedicated queue pair).
    s1.post_write_imm(1, Local::new(&a.scratch, 0, 8), remote.at(0), 5, true)
        .unwrap();
    wait_send(p, &s1, 1);
    let deadline = Instant::now() + p.patience();
    while pb.stats().received == 0 {
        assert!(
            Instant::now() < deadline,
            "the write never reached the layer"
        );
        // Someone polls the hardware queue: r2, which has nothing.
        assert_eq!(poll(&r2).unwrap(), vec![]);
        std::thread::yield_now();
    }
    assert_eq!(poll(&r1).unwrap(), vec![], "held, not failed");
    assert!(!r1.is_failed());
    r1.post_recv(11).unwrap();
    assert_eq!(poll(&r1).unwrap(), vec![(11, Some(5))]);
    // Five writes ahead of r1's receives (depth 4), polled as they come so
    // the hardware queue always has room: r1 fails, r2 and the hardware
    // queue pair do not.
    r2.post_recv(22).unwrap();
    for i in 0..5u32 {
        s1.post_write_imm(
            10 + u64::from(i),
            Local::new(&a.scratch, 0, 8),
            remote.at(0),
            i,
            true,
        )
        .unwrap();
        wait_send(p, &s1, 1);
        let deadline = Instant::now() + p.patience();
        loop {
            let _ = poll(&r2);
            if pb.stats().received >= u64::from(i) + 2 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "write {i} never reached the layer"
            );
            std::thread::yield_now();
        }
    }
    let err = poll(&r1).unwrap_err();
    assert!(matches!(err, Error::PeerMisbehaved(_)), "{err}");
    assert!(r1.is_failed());
    s2.post_write_imm(2, Local::new(&a.scratch, 0, 8), remote.at(8), 6, true)
        .unwrap();
    let got = wait_cq(r2.recv_cq(), 1, p.patience());
    assert_eq!((got[0].wr_id, got[0].imm), (22, Some(6)));
    assert!(!r2.is_failed() && !b.conn.qp().is_failed());
    assert!(matches!(
        r1.post_write(
            0,
            Local::new(&b.scratch, 0, 8),
            b.conn.peer().region(1).unwrap().at(0),
            true
        ),
        Err(Error::PeerMisbehaved(_))
    ));
    wait_send(p, &s2, 1);
}

fn completions_of_a_detached_sharer_are_dropped(p: &Provider) {
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), QpConfig::default());
    let (pa, _pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let gone = pa.attach(3, 3).unwrap();
    gone.post_write(1, Local::new(&a.scratch, 0, 8), remote.at(0), true)
        .unwrap();
    drop(gone);
    assert_eq!(pa.sharers(), 0);
    // The same tag again: a new sharer, who must not see the old completion.
    let again = pa.attach(3, 3).unwrap();
    assert!(
        matches!(pa.attach(3, 3), Err(Error::InvalidConfig(_))),
        "tags are unique"
    );
    again
        .post_write(2, Local::new(&a.scratch, 0, 8), remote.at(0), true)
        .unwrap();
    let got = wait_send(p, &again, 1);
    assert_eq!(got[0].wr_id, 2);
    assert!(poll_all(&again, false).is_empty());
    assert_eq!(pa.stats().stale, 1);
}

fn an_armed_sharer_is_woken_when_another_polls_for_it(p: &Provider) {
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), QpConfig::default());
    let (pa, _pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let sleeper = pa.attach(1, 1).unwrap();
    let other = pa.attach(2, 2).unwrap();
    let cq = sleeper.send_cq();
    cq.req_notify().unwrap();
    assert!(!readable(cq.channel_fd().unwrap(), 0), "nothing yet");
    sleeper
        .post_write(7, Local::new(&a.scratch, 0, 8), remote.at(0), true)
        .unwrap();
    // The other sharer polls (and so dispatches the sleeper's completion)
    // until the hardware queue has delivered it.
    let deadline = Instant::now() + p.patience();
    while pa.stats().dispatched == 0 {
        assert!(poll_all(&other, false).is_empty());
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    assert!(
        readable(cq.channel_fd().unwrap(), 1000),
        "the sleeper's channel fires"
    );
    cq.ack_events().unwrap();
    assert_eq!(poll_all(&sleeper, false)[0].wr_id, 7);
}

fn readable(fd: std::os::fd::BorrowedFd<'_>, ms: u16) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    poll(
        &mut [PollFd::new(fd, PollFlags::POLLIN)],
        PollTimeout::from(ms),
    )
    .expect("poll")
        == 1
}

fn threads_on_one_queue_pair(p: &Provider) {
    let cfg = QpConfig::builder().send_depth(16).build().unwrap();
    let (a, b) = pair_on(p, 1 << 16, cfg.clone(), cfg);
    let (pa, _pb) = share(&a, &b, VqpConfig::default());
    let remote = a.conn.peer().region(1).unwrap();
    let per = if matches!(p, Provider::Shm) {
        20_000
    } else {
        500
    };
    let scratch = a.scratch.clone();
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let qp = pa.attach(t, t).unwrap();
            let scratch = scratch.clone();
            let patience = p.patience();
            std::thread::spawn(move || {
                let mut want = std::collections::VecDeque::new();
                let mut buf = [Completion::EMPTY; 8];
                let mut x = 0x9e3779b9u32 ^ t;
                for i in 0..per {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let signaled = x.is_multiple_of(4);
                    let off = t as usize * 4096;
                    qp.post_write(
                        i,
                        Local::new(&scratch, off, 64),
                        remote.at(off as u64),
                        signaled,
                    )
                    .unwrap();
                    if signaled {
                        want.push_back(i);
                    }
                    if x.is_multiple_of(7) {
                        let n = qp.send_cq().poll(&mut buf).unwrap();
                        for c in &buf[..n] {
                            assert_eq!(Some(c.wr_id), want.pop_front(), "sharer {t}");
                        }
                    }
                }
                let deadline = Instant::now() + patience;
                while let Some(w) = want.front().copied() {
                    let n = qp.send_cq().poll(&mut buf[..1]).unwrap();
                    if n == 1 {
                        assert_eq!(buf[0].wr_id, w, "sharer {t}");
                        want.pop_front();
                    }
                    assert!(Instant::now() < deadline, "sharer {t} waits for {w}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!a.conn.qp().is_failed());
    assert_eq!(pa.stats().posted, 4 * per);
}

/// The device fails the hardware queue pair: on verbs every posted
/// receive completes flushed, with no immediate. Those must not be routed
/// (a flushed receive read as immediate 0 once failed sharer 0 as if its
/// peer had written to it without a receive). On shm a failed queue pair
/// flushes no receives, so there this only checks nothing is misrouted.
fn a_failed_hardware_queue_pair_is_no_sharer_s_misbehaviour(p: &Provider) {
    let (a, b) = pair_on(p, 1 << 16, QpConfig::default(), QpConfig::default());
    let (_pa, pb) = share(&a, &b, VqpConfig::builder().recv_depth(8).build().unwrap());
    let r0 = pb.attach(0, 0).unwrap();
    let r1 = pb.attach(1, 1).unwrap();
    r1.post_recv(11).unwrap();
    b.conn.qp().inject_device_error().unwrap();
    // Give the device time to flush (soft-RoCE under TCG is slow).
    let until = Instant::now() + p.patience() / 20;
    while Instant::now() < until {
        let _ = pb.progress();
        let _ = r0.recv_cq().poll(&mut [Completion::EMPTY; 4]);
        let _ = r1.recv_cq().poll(&mut [Completion::EMPTY; 4]);
        std::thread::yield_now();
    }
    for (t, r) in [(0, &r0), (1, &r1)] {
        assert!(
            !matches!(r.failure(), Some(Error::PeerMisbehaved(_))),
            "sharer {t}: {:?}",
            r.failure()
        );
    }
    assert_eq!(pb.stats().misrouted, 0);
}

// ---------------------------------------------------------------------------
// Random interleavings (shm): a model of each sharer's completions
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Post {
        sharer: usize,
        signaled: bool,
        imm: bool,
    },
    Poll {
        sharer: usize,
    },
    PollRecv {
        sharer: usize,
    },
    Reattach {
        sharer: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..6usize, any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(sharer, signaled, imm)| Step::Post { sharer, signaled, imm }),
        3 => (0..6usize).prop_map(|sharer| Step::Poll { sharer }),
        1 => (0..6usize).prop_map(|sharer| Step::PollRecv { sharer }),
        1 => (0..6usize).prop_map(|sharer| Step::Reattach { sharer }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any interleaving of posts, polls and re-attaches by six sharers on a
    /// 4-deep queue: each sharer's completions are exactly its signaled
    /// `wr_id`s in post order, its immediates reach its peer sharer in
    /// order, and the hardware queue never holds more than its depth.
    #[test]
    fn random_interleavings(steps in prop::collection::vec(step(), 1..300), every in 1u32..5) {
        let cfg = QpConfig::builder().send_depth(4).build().unwrap();
        let (a, b) = pair_on(&Provider::Shm, 1 << 16, cfg.clone(), cfg);
        let vcfg = VqpConfig::builder().signal_every(every).build().unwrap();
        let (pa, pb) = share(&a, &b, vcfg);
        let remote = a.conn.peer().region(1).unwrap();
        let mut tx: Vec<Option<QueuePair>> = (0..6).map(|t| Some(pa.attach(t, t).unwrap())).collect();
        let rx: Vec<QueuePair> = (0..6).map(|t| pb.attach(t, t).unwrap()).collect();
        let mut want: Vec<std::collections::VecDeque<u64>> = vec![Default::default(); 6];
        let mut want_imm: Vec<std::collections::VecDeque<u32>> = vec![Default::default(); 6];
        let mut next = 0u64;
        let mut buf = [Completion::EMPTY; 4];
        for s in steps {
            match s {
                Step::Post { sharer, signaled, imm } => {
                    next += 1;
                    let local = Local::new(&a.scratch, sharer * 64, 8);
                    if imm {
                        rx[sharer].post_recv(next).unwrap();
                        tx[sharer].as_ref().unwrap().post_write_imm(next, local, remote.at(0), next as u32 & 0xFFFFF, signaled).unwrap();
                        want_imm[sharer].push_back(next as u32 & 0xFFFFF);
                    } else {
                        tx[sharer].as_ref().unwrap().post_write(next, local, remote.at(sharer as u64 * 64), signaled).unwrap();
                    }
                    if signaled {
                        want[sharer].push_back(next);
                    }
                }
                Step::Poll { sharer } => {
                    let n = tx[sharer].as_ref().unwrap().send_cq().poll(&mut buf).unwrap();
                    for c in &buf[..n] {
                        prop_assert_eq!(Some(c.wr_id), want[sharer].pop_front());
                    }
                }
                Step::PollRecv { sharer } => {
                    let n = rx[sharer].recv_cq().poll(&mut buf).unwrap();
                    for c in &buf[..n] {
                        prop_assert_eq!(c.imm, want_imm[sharer].pop_front());
                    }
                }
                Step::Reattach { sharer } => {
                    // Detach with completions outstanding, then a new
                    // sharer under the same tag, who must not see them.
                    tx[sharer] = None;
                    tx[sharer] = Some(pa.attach(sharer as u32, sharer as u32).unwrap());
                    want[sharer].clear();
                }
            }
            prop_assert!(a.conn.qp().outstanding() <= 4);
        }
        for t in 0..6 {
            let got: Vec<u64> = poll_all(tx[t].as_ref().unwrap(), false).iter().map(|c| c.wr_id).collect();
            prop_assert_eq!(&got, &Vec::from(want[t].clone()));
            let imms: Vec<Option<u32>> = poll_all(&rx[t], true).iter().map(|c| c.imm).collect();
            let w: Vec<Option<u32>> = want_imm[t].iter().map(|&i| Some(i)).collect();
            prop_assert_eq!(imms, w);
        }
        prop_assert!(!a.conn.qp().is_failed() && !b.conn.qp().is_failed());
    }
}
