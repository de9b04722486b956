//! Fault injection: delayed completions, failing devices and torn writes.

use crate::common;

use rrpc_core::{Completion, Error, FaultConfig, Local, QpConfig, Status};

#[test]
fn delayed_completions_arrive_late_but_in_order() {
    let cfg = QpConfig::builder()
        .fault(
            FaultConfig::builder()
                .completion_delay_polls(3)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let (a, _b) = common::pair_with(4096, cfg, QpConfig::default());
    let r = a.conn.peer().region(1).unwrap();
    for i in 0..4 {
        a.conn
            .qp()
            .post_write(i, Local::new(&a.scratch, 0, 8), r.at(0), true)
            .unwrap();
    }
    let mut wc = [Completion::EMPTY; 8];
    let mut seen = Vec::new();
    let mut polls = 0;
    while seen.len() < 4 {
        polls += 1;
        assert!(polls < 100, "completions never arrived");
        let n = a.conn.qp().send_cq().poll(&mut wc).unwrap();
        seen.extend(wc[..n].iter().map(|c| c.wr_id));
    }
    assert!(polls > 3, "the first completion was held back");
    assert_eq!(seen, vec![0, 1, 2, 3]);
}

#[test]
fn failing_device_reports_error_completions_and_fails_the_qp() {
    let cfg = QpConfig::builder()
        .fault(FaultConfig::builder().fail_after_posts(2).build().unwrap())
        .build()
        .unwrap();
    let (a, _b) = common::pair_with(4096, cfg, QpConfig::default());
    let r = a.conn.peer().region(1).unwrap();
    let l = Local::new(&a.scratch, 0, 8);
    a.conn.qp().post_write(1, l, r.at(0), true).unwrap();
    a.conn.qp().post_write(2, l, r.at(0), true).unwrap();
    a.conn.qp().post_write(3, l, r.at(0), false).unwrap();
    let mut wc = [Completion::EMPTY; 8];
    let n = a.conn.qp().send_cq().poll(&mut wc).unwrap();
    let statuses: Vec<_> = wc[..n].iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (1, Status::Success),
            (2, Status::Success),
            (3, Status::Fatal)
        ]
    );
    let e = a.conn.qp().post_write(4, l, r.at(0), true).unwrap_err();
    assert!(matches!(e, Error::CompletionError { .. }), "{e}");
}

/// A device failing the queue pair behind the connection's back
/// (`QueuePair::inject_device_error`): work requests outstanding at that
/// moment complete `Flushed` (`IBV_WC_WR_FLUSH_ERR`), so does every later
/// post, and nothing is written, as on verbs.
#[test]
fn outstanding_work_requests_are_flushed_when_the_device_fails_the_qp() {
    let cfg = QpConfig::builder()
        .fault(
            FaultConfig::builder()
                .completion_delay_polls(50)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let (a, b) = common::pair_with(4096, cfg, QpConfig::default());
    let qp = a.conn.qp();
    let r = a.conn.peer().region(1).unwrap();
    let l = Local::new(&a.scratch, 0, 8);
    for i in 1..=3 {
        qp.post_write(i, l, r.at(0), true).unwrap();
    }
    qp.inject_device_error().unwrap();
    assert!(qp.failure().is_none(), "nothing is recorded");
    a.scratch.write_at(0, b"flushed!").unwrap();
    qp.post_write(4, l, r.at(0), true).unwrap();
    qp.post_write(5, l, r.at(0), true).unwrap();
    let mut wc = [Completion::EMPTY; 8];
    let mut seen = Vec::new();
    for _ in 0..200 {
        let n = qp.send_cq().poll(&mut wc).unwrap();
        seen.extend(wc[..n].iter().map(|c| (c.wr_id, c.status)));
        if seen.len() == 5 {
            break;
        }
    }
    assert_eq!(
        seen,
        (1..=5).map(|i| (i, Status::Flushed)).collect::<Vec<_>>(),
        "in order, all flushed"
    );
    let mut peer = [0u8; 8];
    b.granted.read_at(0, &mut peer).unwrap();
    assert_ne!(&peer, b"flushed!", "a flushed work request writes nothing");
}

#[test]
fn torn_write_copies_only_a_prefix() {
    let cfg = QpConfig::builder()
        .fault(FaultConfig::builder().torn_write_every(2).build().unwrap())
        .build()
        .unwrap();
    let (a, b) = common::pair_with(4096, cfg, QpConfig::default());
    let r = a.conn.peer().region(1).unwrap();
    a.scratch.write_at(0, &[7u8; 64]).unwrap();
    a.conn
        .qp()
        .post_write(1, Local::new(&a.scratch, 0, 64), r.at(0), false)
        .unwrap();
    a.scratch.write_at(0, &[9u8; 64]).unwrap();
    a.conn
        .qp()
        .post_write(2, Local::new(&a.scratch, 0, 64), r.at(0), false)
        .unwrap();
    let mut got = [0u8; 64];
    b.granted.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..32], &[9u8; 32]);
    assert_eq!(
        &got[32..],
        &[7u8; 32],
        "second half of the torn write never arrived"
    );
}

/// `corrupt_write(2)`: the second WRITE of at least `CORRUPT_MIN_LEN`
/// bytes lands with its middle byte inverted; smaller writes are neither
/// counted nor touched, and no other write is.
#[test]
fn corrupt_write_flips_one_byte_of_the_nth_large_write() {
    let cfg = QpConfig::builder()
        .fault(FaultConfig::builder().corrupt_write(2).build().unwrap())
        .build()
        .unwrap();
    let (a, b) = common::pair_with(4096, cfg, QpConfig::default());
    let r = a.conn.peer().region(1).unwrap();
    let n = rrpc_core::CORRUPT_MIN_LEN;
    let write = |id: u64, at: u64, len: usize, byte: u8| {
        a.scratch.write_at(0, &vec![byte; len]).unwrap();
        a.conn
            .qp()
            .post_write(id, Local::new(&a.scratch, 0, len), r.at(at), false)
            .unwrap();
    };
    write(1, 0, n, 1); // large #1: intact
    write(2, 512, 8, 2); // small: not counted
    write(3, 1024, 2 * n, 3); // large #2: corrupted
    write(4, 2048, n, 4); // large #3: intact
    let read = |at: usize, len: usize| {
        let mut got = vec![0u8; len];
        b.granted.read_at(at, &mut got).unwrap();
        got
    };
    assert_eq!(read(0, n), vec![1u8; n]);
    assert_eq!(read(512, 8), vec![2u8; 8]);
    let mut want = vec![3u8; 2 * n];
    want[n] = !3;
    assert_eq!(read(1024, 2 * n), want, "the middle byte inverted");
    assert_eq!(read(2048, n), vec![4u8; n]);
}

#[test]
fn write_imm_beyond_posted_receives_is_refused() {
    let (a, b) = common::pair(4096);
    b.conn.qp().post_recv(1).unwrap();
    let r = a.conn.peer().region(1).unwrap();
    a.conn
        .qp()
        .post_write_imm(1, Local::new(&a.scratch, 0, 8), r.at(0), 42, false)
        .unwrap();
    let mut wc = [Completion::EMPTY; 4];
    assert_eq!(b.conn.qp().recv_cq().poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].imm, Some(42));
    assert!(matches!(
        a.conn
            .qp()
            .post_write_imm(2, Local::new(&a.scratch, 0, 8), r.at(0), 43, false),
        Err(Error::ReceiverNotReady)
    ));
}

#[test]
fn a_peer_that_stopped_acknowledging_is_retry_exceeded_like_on_a_nic() {
    let cfg = QpConfig::builder()
        .fault(
            FaultConfig::builder()
                .fail_after_posts(1)
                .fail_status(Status::RetryExceeded)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let (a, _b) = common::pair_with(4096, cfg, QpConfig::default());
    let r = a.conn.peer().region(1).unwrap();
    let l = Local::new(&a.scratch, 0, 8);
    a.conn.qp().post_write(1, l, r.at(0), false).unwrap();
    // Unsignaled, yet its error is reported: a NIC reports every error.
    a.conn.qp().post_write(2, l, r.at(0), false).unwrap();
    let mut wc = [Completion::EMPTY; 8];
    let n = a.conn.qp().send_cq().poll(&mut wc).unwrap();
    let got: Vec<_> = wc[..n].iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, vec![(2, Status::RetryExceeded)]);
    let e = a.conn.qp().post_write(3, l, r.at(0), true).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CompletionError {
                wr_id: 2,
                status: Status::RetryExceeded
            }
        ),
        "{e}"
    );
}

/// Waits up to `ms` for the channel fd of `cq` to become readable.
fn fires_within(cq: &rrpc_core::CompletionQueue, ms: u16) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let fd = cq.channel_fd().unwrap();
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::from(ms)).unwrap() > 0
}

/// The arm-then-poll race, made deterministic: the poll before the arm
/// misses a completion that is already there, so no event fires for it. A
/// consumer that sleeps on the channel right after arming sleeps for ever;
/// one that polls once more after arming (the rule every consumer in rrpc
/// follows) finds it.
#[test]
fn a_missed_poll_is_the_arm_then_poll_race() {
    let cfg = QpConfig::builder()
        .fault(FaultConfig::builder().poll_miss_every(2).build().unwrap())
        .build()
        .unwrap();
    let (a, b) = common::pair_with(4096, QpConfig::default(), cfg);
    let r = a.conn.peer().region(1).unwrap();
    let l = Local::new(&a.scratch, 0, 8);
    let rcq = b.conn.qp().recv_cq();
    let mut wc = [Completion::EMPTY; 4];
    for imm in [1u32, 2] {
        b.conn.qp().post_recv(u64::from(imm)).unwrap();
        a.conn
            .qp()
            .post_write_imm(0, l, r.at(0), imm, false)
            .unwrap();
    }
    // The first poll with something to find finds it; the second misses.
    assert_eq!(rcq.poll(&mut wc).unwrap(), 2);
    b.conn.qp().post_recv(3).unwrap();
    a.conn.qp().post_write_imm(0, l, r.at(0), 3, false).unwrap();
    assert_eq!(rcq.poll(&mut wc).unwrap(), 0, "the injected miss");
    rcq.req_notify().unwrap();
    assert!(
        !fires_within(rcq, 100),
        "no event for a completion that arrived before the arm"
    );
    assert_eq!(
        rcq.poll(&mut wc).unwrap(),
        1,
        "the poll after the arm finds it"
    );
    assert_eq!(wc[0].imm, Some(3));
}
