//! The connection's send side ([`Link`]) under the events #56 names: a
//! full ring behind a deferred tail (#31), a peer that stops reading, a
//! corrupt pointer record, one failure seen by every waiting writer, once.
//! No timing assertion: each wait is bounded by [`BOUND`] only so that a
//! hang fails instead of stalling the suite.

use std::sync::Arc;
use std::time::Duration;

use rrpc_core::{Fabric, FaultConfig, QpConfig};
use rrpc_poller::rings::{AsyncConn, RingConfig};
use rrpc_poller::{Mode, PollerConfig};

use super::*;
use crate::conn::{MsgRx, mem_pair};
use std::future::poll_fn;

/// How long a test waits for what must happen before it calls it a hang.
const BOUND: Duration = Duration::from_secs(20);

/// A message of `len` bytes, each `tag`.
async fn send(link: &Link, len: usize, tag: u8) -> Result<(), Error> {
    link.send_with(len, &mut |s: &mut [u8]| s.fill(tag)).await
}

/// The next message's length and first byte.
async fn recv(rx: &mut Box<dyn MsgRx>) -> (usize, u8) {
    let mut got = (0, 0);
    let mut f = |m: &[u8]| got = (m.len(), m[0]);
    let more = tokio::time::timeout(BOUND, rx.recv_with(&mut f))
        .await
        .expect("a message came")
        .expect("no error");
    assert!(more, "the pipe is open");
    got
}

/// Writers that found the ring full wait in line and each gets its turn,
/// in order, as the reader frees room: the head waits for room, and each
/// one leaving the line wakes the next. A small frame may not pass them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_in_line_each_get_their_turn_in_order() {
    let ((link, _), (_, mut rx)) = mem_pair(100);
    assert!(
        link.try_send_with(90, &mut |s: &mut [u8]| s.fill(0))
            .unwrap()
    );
    let mut writers = Vec::new();
    for tag in 1..=4u8 {
        let l = link.clone();
        writers.push(tokio::spawn(async move { send(&l, 60, tag).await }));
        // Each is in line before the next starts.
        while link.shared.queued.load(Ordering::Acquire) < usize::from(tag) {
            tokio::task::yield_now().await;
        }
    }
    assert!(
        !link.try_send_with(5, &mut |_: &mut [u8]| {}).unwrap(),
        "room for 5 bytes, but writers are in line"
    );
    for tag in 0..=4u8 {
        let want = if tag == 0 { 90 } else { 60 };
        assert_eq!(recv(&mut rx).await, (want, tag));
    }
    for w in writers {
        tokio::time::timeout(BOUND, w)
            .await
            .expect("every writer finished")
            .unwrap()
            .unwrap();
    }
    assert_eq!(link.shared.queued.load(Ordering::Acquire), 0);
    assert!(link.try_send_with(5, &mut |_: &mut [u8]| {}).unwrap());
}

/// A peer that stops reading holds its writers back (nothing is dropped,
/// nothing fails), and a writer that gives up waiting leaves the line
/// clean: the next writer and the synchronous path go on once the peer
/// reads again. A peer that leaves fails the waiting writer with a
/// peer-gone error, recorded once as the connection's failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_holds_writers_back_and_one_that_leaves_fails_them() {
    let ((link, _), (_, mut rx)) = mem_pair(100);
    assert!(
        link.try_send_with(100, &mut |s: &mut [u8]| s.fill(0))
            .unwrap()
    );
    // The peer does not read: a writer waits, and is given up.
    let waited = tokio::time::timeout(Duration::from_millis(50), send(&link, 10, 1)).await;
    assert!(waited.is_err(), "no room while the peer does not read");
    assert_eq!(
        link.shared.queued.load(Ordering::Acquire),
        0,
        "it left the line"
    );
    assert!(link.failure().is_none(), "a slow peer is no failure");
    assert_eq!(recv(&mut rx).await, (100, 0));
    tokio::time::timeout(BOUND, send(&link, 10, 2))
        .await
        .expect("room once the peer read")
        .unwrap();
    assert_eq!(recv(&mut rx).await, (10, 2));
    // Full again; the peer leaves while a writer waits.
    assert!(
        link.try_send_with(100, &mut |s: &mut [u8]| s.fill(3))
            .unwrap()
    );
    let l = link.clone();
    let waiting = tokio::spawn(async move { send(&l, 50, 4).await });
    while link.shared.queued.load(Ordering::Acquire) == 0 {
        tokio::task::yield_now().await;
    }
    drop(rx);
    let e = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiting writer is told")
        .unwrap()
        .unwrap_err();
    assert!(e.is_peer_gone(), "{e}");
    assert!(link.failure().is_some_and(|f| f.is_peer_gone()));
}

/// A corrupt pointer record (the ring says so on a send) fails the
/// connection once: every writer waiting in line, and every later send,
/// gets the same failure (one `Arc`), `DataLoss` at the gRPC edge, and
/// the connection's owner is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_ring_fails_every_waiting_writer_once() {
    let ((link, _), (_, mut rx)) = mem_pair(100);
    let broken = link.breaker(false);
    assert!(link.try_send_with(100, &mut |_: &mut [u8]| {}).unwrap());
    let mut writers = Vec::new();
    for tag in 1..=3u8 {
        let l = link.clone();
        writers.push(tokio::spawn(async move { send(&l, 10, tag).await }));
    }
    while link.shared.queued.load(Ordering::Acquire) < 3 {
        tokio::task::yield_now().await;
    }
    // The ring goes bad; the reader frees room, and the head of the line
    // finds it so when it writes.
    broken.store(true, Ordering::SeqCst);
    assert_eq!(recv(&mut rx).await, (100, 0));
    tokio::time::timeout(BOUND, link.failed())
        .await
        .expect("the owner is told");
    let Some(Error::Failed(first)) = link.failure() else {
        panic!("the connection failed");
    };
    assert_eq!(first.code(), tonic::Code::DataLoss, "{first}");
    for w in writers {
        let e = tokio::time::timeout(BOUND, w)
            .await
            .expect("a waiting writer sees the failure")
            .unwrap()
            .unwrap_err();
        let Error::Failed(e) = e else {
            panic!("the connection's failure: {e}");
        };
        assert!(Arc::ptr_eq(&e, &first), "one failure, shared: {e}");
    }
    let later = link.try_send_with(1, &mut |_: &mut [u8]| {}).unwrap_err();
    assert!(matches!(later, Error::Failed(e) if Arc::ptr_eq(&e, &first)));
}

/// The #31 hang: completions come only after 50 polls (the fault
/// injector: a NIC completes a WRITE after its post), so the ring's tail
/// is deferred behind them, and a ring full of messages the reader cannot
/// see yet never frees by itself. Several writers fill a small real shm
/// ring through one link while the reader reads: every message arrives,
/// in each writer's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_behind_a_deferred_tail_makes_progress() {
    let poller = rrpc_poller::Poller::start(
        PollerConfig::builder()
            .mode(Mode::Bpev)
            .polling_threads(1)
            .build()
            .unwrap(),
    )
    .unwrap();
    let qp = QpConfig::builder()
        .fault(
            FaultConfig::builder()
                .completion_delay_polls(50)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let ring = RingConfig::builder()
        .ring_size(4096)
        .huge_pages(false)
        .build()
        .unwrap();
    let (a, b) = AsyncConn::loopback_pair_with(&poller, &ring, &Fabric::shm(), &qp).unwrap();
    let conn = a.connection().clone();
    let (tx, _arx) = a.split_managed().unwrap();
    let (_btx, mut brx) = b.split().unwrap();
    let link = Link::ring(tx, conn);
    const WRITERS: u8 = 3;
    const EACH: u32 = 40;
    let len = 1000;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let l = link.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                l.send_with(len, &mut |s: &mut [u8]| {
                    s[0] = w;
                    s[1..5].copy_from_slice(&i.to_le_bytes());
                })
                .await?;
            }
            Ok::<_, Error>(())
        }));
    }
    let mut next = [0u32; WRITERS as usize];
    for _ in 0..u32::from(WRITERS) * EACH {
        let m = tokio::time::timeout(BOUND, brx.recv())
            .await
            .unwrap_or_else(|_| panic!("stuck: {next:?} | {}", link.state()))
            .unwrap();
        let (w, i) = (
            usize::from(m[0]),
            u32::from_le_bytes(m[1..5].try_into().unwrap()),
        );
        assert_eq!(i, next[w], "writer {w}'s messages in order");
        next[w] += 1;
    }
    for w in writers {
        w.await.unwrap().unwrap();
    }
    assert!(link.failure().is_none());
}

/// A sealed link's writer that found the ring full waits for room for its
/// message and its tag: with room for the message alone it sleeps, and
/// does not retry (before, it waited for the plaintext's room and, that
/// there, retried at once, again and again).
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_writer_waits_for_room_for_its_tag_too() {
    use crate::conn::seal::{KEY_LEN, RingCipher, RingSecrets, Role};
    let secrets = RingSecrets {
        c2s: [9; KEY_LEN],
        s2c: [8; KEY_LEN],
    };
    let (a, _b) = mem_pair(100);
    let (link, _) =
        crate::conn::seal::pipe::wrap(a, &secrets, Role::Client, RingCipher::preferred());
    // 60 of the 100 bytes taken: room for 40, a message of 30 needs 46.
    assert!(
        link.try_send_with(60 - TAG_LEN, &mut |_: &mut [u8]| {})
            .unwrap()
    );
    let l = link.clone();
    let waiting = tokio::spawn(async move { send(&l, 30, 1).await });
    while link.shared.queued.load(Ordering::Acquire) == 0 {
        tokio::task::yield_now().await;
    }
    let before = link.shared.steps.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tried = link.shared.steps.load(Ordering::Relaxed) - before;
    assert!(
        tried <= 1,
        "the waiting writer retried {tried} times without room"
    );
    waiting.abort();
}

/// `inproc://`'s in-place peer ([`InPlace`]): an echo that counts its
/// messages, as the server's side of a connection, and the task of it.
fn echo_in_place(
    server: Pipe,
    host: Arc<InPlace>,
    seen: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = server;
    let conn = async move {
        loop {
            let mut got = Vec::new();
            let mut f = |m: &[u8]| got = m.to_vec();
            match rx.recv_with(&mut f).await {
                Ok(true) => {}
                _ => return,
            }
            seen.fetch_add(1, Ordering::SeqCst);
            assert_ne!(got[0], 0xEE, "the peer's future panics on 0xEE");
            tx.send_with(got.len(), &mut |s: &mut [u8]| s.copy_from_slice(&got))
                .await
                .expect("echo");
        }
    };
    let rt = host.runtime().clone();
    rt.spawn(host.drive(conn))
}

/// Polls `rx` once with a waker that counts nothing: `Some` if a message
/// was there already (its first byte).
fn try_recv(rx: &mut Box<dyn MsgRx>) -> Option<u8> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut got = None;
    let mut f = |m: &[u8]| got = Some(m[0]);
    match rx.poll_recv_with(&mut cx, &mut f) {
        Poll::Ready(Ok(true)) => got,
        other => panic!("not a message: {other:?}"),
    }
}

/// A message sent on the client's side of an in-place pair is handled by
/// the peer's connection right where it lands, on the sending thread: its
/// reply is in the client's receiver when the send returns, with no task
/// run in between (a current-thread runtime runs none while this test's
/// own future runs).
#[tokio::test(flavor = "current_thread")]
async fn in_place_peer_answers_within_the_send() {
    let (client, server, host) = mem_pair_in_place(1 << 16);
    let seen = Arc::new(AtomicUsize::new(0));
    let task = echo_in_place(server, host, seen.clone());
    // The task's first poll: the peer is driven from now on.
    tokio::task::yield_now().await;
    let (tx, mut rx) = client;
    for tag in 1..=3u8 {
        assert!(
            tx.try_send_with(8, &mut |s: &mut [u8]| s.fill(tag))
                .unwrap()
        );
        assert_eq!(
            seen.load(Ordering::SeqCst),
            usize::from(tag),
            "handled in the send"
        );
        assert_eq!(try_recv(&mut rx), Some(tag), "the reply is there already");
    }
    drop((tx, rx));
    tokio::time::timeout(BOUND, task)
        .await
        .expect("ends")
        .expect("no panic");
}

/// A peer whose future panics in a client's send: the send returns, the
/// panic ends the peer's task (as a task's own panic would), not the
/// client's thread.
#[tokio::test(flavor = "current_thread")]
async fn in_place_panic_is_resumed_in_the_peers_task() {
    let (client, server, host) = mem_pair_in_place(1 << 16);
    let seen = Arc::new(AtomicUsize::new(0));
    let task = echo_in_place(server, host, seen.clone());
    tokio::task::yield_now().await;
    let (tx, _rx) = client;
    assert!(
        tx.try_send_with(4, &mut |s: &mut [u8]| s.fill(0xEE))
            .unwrap()
    );
    assert_eq!(seen.load(Ordering::SeqCst), 1, "polled in the send");
    let r = tokio::time::timeout(BOUND, task)
        .await
        .expect("the task ends");
    assert!(r.expect_err("the task panicked").is_panic());
}

/// The peer's task dropped (its runtime shut down, the server's join set
/// aborted): the connection's future is dropped with it, although the
/// client's link still holds the cell; a later send polls nothing.
#[tokio::test(flavor = "current_thread")]
async fn in_place_peer_dropped_with_its_task() {
    let (client, server, host) = mem_pair_in_place(1 << 16);
    let seen = Arc::new(AtomicUsize::new(0));
    let task = echo_in_place(server, host, seen.clone());
    tokio::task::yield_now().await;
    task.abort();
    let _ = task.await;
    let (tx, _rx) = client;
    // The server's half of the pipe went with the future: the peer is gone.
    let r = tx.try_send_with(4, &mut |s: &mut [u8]| s.fill(1));
    assert!(matches!(r, Err(ref e) if e.is_peer_gone()), "{r:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 0);
}

/// A sender that holds the peer's future while the peer's task is woken
/// hands that turn back to the task once it lets go (`missed`): here the
/// future, polled by a sender, wakes its own task and needs that one more
/// poll to answer, and the task's poll comes while the sender still holds
/// the future (the future waits for it). Without the hand-back nobody
/// polls the future again and the answer never comes.
#[test]
fn in_place_turn_missed_by_the_task_is_handed_back() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (client, server, host) = rt.block_on(async { mem_pair_in_place(1 << 12) });
    let driver_id = Arc::new(OnceLock::new());
    let helper_hits = Arc::new(AtomicUsize::new(0));
    let (stx, mut srx) = server;
    let conn = {
        let (host, driver_id, hits) = (host.clone(), driver_id.clone(), helper_hits.clone());
        async move {
            loop {
                let mut tag = 0;
                let mut f = |m: &[u8]| tag = m[0];
                if !matches!(srx.recv_with(&mut f).await, Ok(true)) {
                    return;
                }
                // Polled by a sender (not the task): wake the task, wait
                // until its poll found the future held, then yield once.
                let mut yielded = false;
                poll_fn(|cx| {
                    if yielded {
                        return Poll::Ready(());
                    }
                    yielded = true;
                    let by_task = tokio::task::try_id() == driver_id.get().copied();
                    if !by_task {
                        hits.fetch_add(1, Ordering::SeqCst);
                        cx.waker().wake_by_ref();
                        let t0 = std::time::Instant::now();
                        while !host.missed.load(Ordering::SeqCst) {
                            assert!(t0.elapsed() < BOUND, "the task was never polled");
                            std::thread::yield_now();
                        }
                    } else {
                        cx.waker().wake_by_ref();
                    }
                    Poll::Pending
                })
                .await;
                stx.send_with(1, &mut |s: &mut [u8]| s[0] = tag)
                    .await
                    .expect("answer");
            }
        }
    };
    let task = rt.spawn(host.clone().drive(conn));
    driver_id.set(task.id()).expect("once");
    let (tx, mut rx) = client;
    let handle = rt.handle().clone();
    // Sent from a thread outside the runtime: the task woken from here is
    // taken up by a worker while this thread still holds the future.
    std::thread::spawn(move || {
        for round in 0..200u8 {
            if helper_hits.load(Ordering::SeqCst) >= 3 {
                break;
            }
            // Let the task poll first (its waker is what a sender uses).
            std::thread::sleep(Duration::from_millis(2));
            assert!(
                tx.try_send_with(1, &mut |s: &mut [u8]| s[0] = round)
                    .unwrap()
            );
            let got = handle.block_on(async {
                let mut got = 0;
                let mut f = |m: &[u8]| got = m[0];
                tokio::time::timeout(BOUND, rx.recv_with(&mut f))
                    .await
                    .expect("the answer never came: a missed turn was lost")
                    .expect("no error");
                got
            });
            assert_eq!(got, round);
        }
        assert!(
            helper_hits.load(Ordering::SeqCst) >= 3,
            "senders took the future"
        );
    })
    .join()
    .expect("sender thread");
    task.abort();
}

/// The in-memory pipe reuses a message's buffer once its reader is done
/// with it: one spare after a receive, taken by the next send; a large
/// message's buffer is not kept.
#[tokio::test(flavor = "current_thread")]
async fn mem_pipe_reuses_message_buffers() {
    let (link, rx) = one_way(1 << 20, None);
    let mut rx: Box<dyn MsgRx> = Box::new(rx);
    let spares = |link: &Link| match &link.shared.sink {
        Sink::Mem(m) => m.spare.0.lock().expect("lock").len(),
        Sink::Ring { .. } => unreachable!("a memory link"),
    };
    send(&link, 100, 1).await.expect("send");
    assert_eq!(spares(&link), 0);
    assert_eq!(recv(&mut rx).await, (100, 1));
    assert_eq!(spares(&link), 1, "the buffer came back");
    send(&link, 80, 2).await.expect("send");
    assert_eq!(spares(&link), 0, "and was taken again");
    assert_eq!(recv(&mut rx).await, (80, 2), "zeroed and refilled");
    send(&link, Spare::LARGEST + 1, 3).await.expect("send");
    assert_eq!(recv(&mut rx).await, (Spare::LARGEST + 1, 3));
    assert_eq!(spares(&link), 1, "only the small one is kept");
}
