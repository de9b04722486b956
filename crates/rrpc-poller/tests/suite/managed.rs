//! [`ManagedSender`](rrpc_poller::rings::ManagedSender): the poller owns the
//! sender's completion progress and its ring's sizing tick. Real time, no
//! timing assertions: each test waits (up to [`BOUND`]) for what the
//! poller's tasks alone must bring about, with the writer idle.

use crate::common;

use std::time::Duration;

use common::{BOUND, poller, rt_mt as rt};
use rrpc_core::{Fabric, FaultConfig, QpConfig};
use rrpc_poller::Mode;
use rrpc_poller::rings::{AsyncConn, RingConfig};

/// Completions arrive only after 50 polls (the fault injector: a NIC
/// completes a WRITE after its post), so tails are deferred behind them.
/// The writer sends a burst and goes idle without `flush_all`: only the
/// progress task's polling gets the last messages to the reader.
#[test]
fn an_idle_writer_s_held_back_messages_reach_the_reader() {
    let qp = QpConfig::builder()
        .fault(
            FaultConfig::builder()
                .completion_delay_polls(50)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    for mode in [Mode::Bpev, Mode::Bpts] {
        rt().block_on(async {
            let p = poller(mode);
            let ring = RingConfig::builder()
                .ring_size(64 * 1024)
                .huge_pages(false)
                .build()
                .unwrap();
            let (a, b) = AsyncConn::loopback_pair_with(&p, &ring, &Fabric::shm(), &qp).unwrap();
            let (mut atx, _arx) = a.split_managed().unwrap();
            let (_btx, mut brx) = b.split().unwrap();
            let count = 20u32;
            for i in 0..count {
                atx.send_with(4, &mut |b| b.copy_from_slice(&i.to_le_bytes()))
                    .await
                    .unwrap();
            }
            // The writer is idle from here on (kept alive, not polled).
            for i in 0..count {
                let m = tokio::time::timeout(BOUND, brx.recv())
                    .await
                    .unwrap_or_else(|_| panic!("{mode}: message {i} never came"))
                    .unwrap();
                assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i);
            }
            drop(atx);
        });
    }
}

/// A self-sizing ring grown by a large message shrinks back once quiet,
/// from the poller's tick alone; the reader, idle, learns from
/// `idle_reads` that it has the resize marker to read, and reading it
/// completes the shrink.
#[test]
fn a_quiet_ring_shrinks_and_its_idle_reader_is_told_to_read() {
    const MIN: usize = 16 * 1024;
    rt().block_on(async {
        let p = poller(Mode::Bpev);
        let ring = RingConfig::builder()
            .ring_size(1 << 20)
            .min_ring_size(MIN)
            .shrink_after(Duration::from_millis(5))
            .huge_pages(false)
            .build()
            .unwrap();
        let (a, b) = AsyncConn::loopback_pair(&p, &ring).unwrap();
        let (mut atx, _arx) = a.split_managed().unwrap();
        let (_btx, mut brx) = b.split_managed().unwrap();
        let idle = brx.idle_reads().expect("a self-sizing ring has idle reads");
        assert_eq!(atx.ring_bytes(), Some(MIN), "starts small");
        let big = 100 * 1024;
        // The switch to a larger ring waits for the reader to pass the
        // marker: read meanwhile.
        let reader = tokio::spawn(async move {
            let len = tokio::time::timeout(BOUND, brx.recv())
                .await
                .expect("the large message came")
                .unwrap()
                .len();
            (brx, len)
        });
        tokio::time::timeout(BOUND, atx.send_with(big, &mut |b| b.fill(7)))
            .await
            .expect("room for the large message")
            .unwrap();
        let (mut brx, len) = reader.await.unwrap();
        assert_eq!(len, big);
        assert!(atx.ring_bytes().unwrap() > MIN, "grew for the message");
        // Both idle: the writer's tick sends the shrink marker, and the
        // reader's owner is told to read it.
        tokio::time::timeout(BOUND, idle.wait())
            .await
            .expect("the sizing tick tells the idle reader to read");
        // Reading consumes the marker (no message behind it: the wait
        // goes on, and is cut short here).
        let _ = tokio::time::timeout(Duration::from_millis(50), brx.recv()).await;
        let t0 = std::time::Instant::now();
        while atx.ring_bytes() != Some(MIN) {
            assert!(t0.elapsed() < BOUND, "the quiet ring never shrank");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
}

/// A writer waiting for room holds no lock: while its `send_with` waits
/// (the ring full, the reader not reading), a synchronous send from a
/// handle answers at once that there is no room, and the ring's size can
/// be read; once the reader reads, the waiting message and the ones before
/// it arrive in order. (Before, the sender sat behind an async mutex held
/// across the wait for room: `ring_bytes` said `None` meanwhile, and the
/// progress task, which needed the same mutex, could not run: the shape of
/// a cross-host hang.)
#[test]
fn a_writer_waiting_for_room_holds_no_lock() {
    rt().block_on(async {
        let p = poller(Mode::Bpev);
        let ring = RingConfig::builder()
            .ring_size(16 * 1024)
            .huge_pages(false)
            .build()
            .unwrap();
        let (a, b) = AsyncConn::loopback_pair(&p, &ring).unwrap();
        let (mut atx, _arx) = a.split_managed().unwrap();
        let (_btx, mut brx) = b.split_managed().unwrap();
        let handle = atx.handle();
        let msg = 1024usize;
        // Fill the ring without waiting.
        let mut sent = 0u32;
        while atx
            .try_send_with(msg, &mut |b| b[..4].copy_from_slice(&sent.to_le_bytes()))
            .unwrap()
        {
            sent += 1;
        }
        assert!(sent > 0, "the empty ring took nothing");
        let last = sent;
        let writer = tokio::spawn(async move {
            atx.send_with(msg, &mut |b| b[..4].copy_from_slice(&last.to_le_bytes()))
                .await
                .unwrap();
            atx
        });
        // Let the writer reach its wait (it cannot finish: nobody reads).
        while !writer.is_finished() && handle.has_space() {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!writer.is_finished(), "the full ring took the message");
        // First a `try_lock` (a held lock fails here instead of hanging below).
        assert!(
            handle.ring_bytes().is_some(),
            "the ring is not locked while its writer waits for room"
        );
        assert!(
            !handle
                .try_send_with(msg, &mut |_| panic!("no room to fill"))
                .unwrap(),
            "a handle's send must answer 'no room', not wait or write"
        );
        for i in 0..=last {
            let m = tokio::time::timeout(BOUND, brx.recv())
                .await
                .unwrap_or_else(|_| panic!("message {i} never came"))
                .unwrap();
            assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i);
        }
        tokio::time::timeout(BOUND, writer)
            .await
            .expect("the waiting writer finished once the reader read")
            .unwrap();
    });
}

/// A device that stops completing WRITEs (the fault injector delays every
/// completion by `u32::MAX` polls; soft-RoCE did this to a queue pair whose
/// packet it dropped as the link went down), with the poller's
/// `completion_limit` at 300 ms:
///
/// * the idle writer's upkeep task, polling for its last tail's completion,
///   fails the connection once the limit passed with none (before, it gave
///   up quietly after 30 s and both ends waited for ever);
/// * a writer that found the ring full of messages held back behind the
///   lost completions fails its send with a typed error instead of polling
///   for ever.
#[test]
fn a_device_that_stops_completing_fails_the_connection() {
    const LIMIT: Duration = Duration::from_millis(300);
    let qp = QpConfig::builder()
        .fault(
            FaultConfig::builder()
                .completion_delay_polls(u32::MAX)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let ring = RingConfig::builder()
        .ring_size(16 * 1024)
        .huge_pages(false)
        .build()
        .unwrap();
    let poller = || {
        rrpc_poller::Poller::start(
            common::test_config(Mode::Bpev)
                .to_builder()
                .completion_limit(LIMIT)
                .build()
                .unwrap(),
        )
        .unwrap()
    };
    rt().block_on(async {
        // The idle writer: one message, then nothing.
        let p = poller();
        let (a, b) = AsyncConn::loopback_pair_with(&p, &ring, &Fabric::shm(), &qp).unwrap();
        let (mut atx, _arx) = a.split_managed().unwrap();
        let (_btx, _brx) = b.split().unwrap();
        let t0 = std::time::Instant::now();
        atx.send_with(4, &mut |b| b.copy_from_slice(&[1, 2, 3, 4]))
            .await
            .unwrap();
        let conn = atx.connection().clone();
        while !conn.is_gone() {
            assert!(
                t0.elapsed() < BOUND,
                "the stalled tail never failed the connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(t0.elapsed() >= LIMIT, "failed before the limit");
        let why = conn.qp().failure().expect("the queue pair says why");
        assert!(why.to_string().contains("no send completion"), "{why}");
        drop(atx);

        // A writer waiting for room behind held-back messages, with no
        // upkeep task (a plain `AsyncSender`): its own wait is bounded.
        let p = poller();
        let (a, b) = AsyncConn::loopback_pair_with(&p, &ring, &Fabric::shm(), &qp).unwrap();
        let (mut atx, _arx) = a.split().unwrap();
        let (_btx, _brx) = b.split().unwrap();
        let e = tokio::time::timeout(BOUND, async {
            loop {
                if let Err(e) = atx.send(&[9; 1024]).await {
                    return e;
                }
            }
        })
        .await
        .expect("a writer behind lost completions waited for ever");
        assert!(
            matches!(e, rrpc_poller::Error::CompletionOverdue(l) if l == LIMIT),
            "{e}"
        );
        assert_eq!(e.fault(), rrpc_core::Fault::Device, "{e}");
    });
    // The setting is checked.
    assert!(
        common::test_config(Mode::Bpev)
            .to_builder()
            .completion_limit(Duration::ZERO)
            .build()
            .is_err()
    );
}
