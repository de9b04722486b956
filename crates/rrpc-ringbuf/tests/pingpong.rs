//! Ping-pong over one in-process shm connection, single-threaded and
//! deterministic: every flushed message must be visible to the peer at once
//! (no tail left deferred, no head push lost) for many more rounds than the
//! ring has slots, at sizes from one slot to a quarter of the ring.

mod common;

use rrpc_ringbuf::{Error, RingConfig, RingRx, RingTx};

fn round(tx: &mut RingTx, rx: &mut RingRx, msg: &[u8], i: usize) {
    tx.try_send(msg)
        .unwrap_or_else(|e| panic!("round {i}: send: {e}"));
    tx.flush().unwrap();
    let m = rx
        .try_recv()
        .unwrap_or_else(|e| panic!("round {i}: flushed message not visible: {e}"));
    assert_eq!(&*m, msg, "round {i}");
    drop(m);
    assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
}

fn pingpong(cfg: &RingConfig, size: usize, rounds: usize) {
    let ((_c1, mut atx, mut arx), (_c2, mut btx, mut brx)) = common::pair(cfg);
    let mut msg = vec![0u8; size];
    for i in 0..rounds {
        msg[0] = i as u8;
        let l = msg.len();
        msg[l - 1] = !(i as u8);
        round(&mut atx, &mut brx, &msg, i);
        round(&mut btx, &mut arx, &msg, i);
    }
}

#[test]
fn pingpong_default_ring_all_sizes() {
    let cfg = RingConfig::builder().ring_size(256 << 10).build().unwrap();
    for (size, rounds) in [
        (1, 20_000),
        (64, 20_000),
        (512, 5_000),
        (4096, 1_000),
        (65_536, 100),
    ] {
        pingpong(&cfg, size, rounds);
    }
}

#[test]
fn pingpong_without_batching_or_elastic() {
    for cfg in [
        RingConfig::builder()
            .ring_size(64 << 10)
            .no_batching()
            .build()
            .unwrap(),
        RingConfig::builder()
            .ring_size(64 << 10)
            .elastic(false)
            .build()
            .unwrap(),
        RingConfig::builder()
            .ring_size(64 << 10)
            .gamma(1)
            .build()
            .unwrap(),
    ] {
        pingpong(&cfg, 200, 5_000);
    }
}

#[test]
fn pingpong_two_threads() {
    let cfg = RingConfig::default();
    let ((c1, mut atx, mut arx), (c2, mut btx, mut brx)) = common::pair(&cfg);
    const ROUNDS: usize = 30_000;
    let echo = std::thread::spawn(move || {
        for i in 0..ROUNDS {
            let m = loop {
                match brx.try_recv() {
                    Ok(m) => break m,
                    Err(Error::WouldBlock) => std::hint::spin_loop(),
                    Err(e) => panic!("echo recv {i}: {e}"),
                }
            };
            let mut g = btx.try_reserve(m.len()).unwrap();
            g.copy_from_slice(&m);
            g.commit().unwrap();
            drop(m);
            btx.flush().unwrap();
        }
        drop(c2);
    });
    let msg = [7u8; 64];
    for i in 0..ROUNDS {
        atx.try_send(&msg).unwrap();
        atx.flush().unwrap();
        let t0 = std::time::Instant::now();
        loop {
            match arx.try_recv() {
                Ok(m) => {
                    assert_eq!(&*m, &msg);
                    break;
                }
                Err(Error::WouldBlock) => {
                    assert!(
                        t0.elapsed() < std::time::Duration::from_secs(10),
                        "round {i}: reply lost; tx {:?}",
                        atx.state(),
                    );
                    std::hint::spin_loop();
                }
                Err(e) => panic!("recv {i}: {e}"),
            }
        }
    }
    echo.join().unwrap();
    drop(c1);
}

#[test]
fn has_message_peeks_without_consuming_across_wrap_gaps() {
    // 3000 B messages do not divide a 64 KiB ring: most wraps leave a gap
    // marker in front of the next message, which `has_message` must skip
    // while leaving the message itself unread.
    let cfg = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let ((_c1, mut tx, _rx1), (_c2, _tx2, mut rx)) = common::pair(&cfg);
    let mut msg = vec![0u8; 3000];
    assert!(!rx.has_message().unwrap());
    for i in 0..1_000usize {
        msg[0] = i as u8;
        msg[2999] = !(i as u8);
        tx.try_send(&msg).unwrap();
        tx.flush().unwrap();
        assert!(rx.has_message().unwrap(), "round {i}");
        assert!(rx.has_message().unwrap(), "round {i}: peeking twice");
        let m = rx.try_recv().unwrap_or_else(|e| panic!("round {i}: {e}"));
        assert_eq!(&*m, &msg[..], "round {i}");
        drop(m);
        assert!(!rx.has_message().unwrap(), "round {i}: consumed");
    }
}
