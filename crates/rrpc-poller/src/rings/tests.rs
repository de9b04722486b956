//! The receive polled in place ([`AsyncReceiver::poll_recv`]): a wait left mid-way loses no
//! message and resumes where it was at the next poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::{AsyncConn, AsyncReceiver, AsyncSender, RingConfig};
use crate::{Handoff, Mode, Poller, PollerConfig};

/// How long a test waits for what must happen before it calls it a hang.
const BOUND: Duration = Duration::from_secs(10);

/// Counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A BPEV pair on shm whose waits spin `spin` (not tuned, never backed off or handed off).
fn pair(spin: Duration) -> (Poller, AsyncSender, AsyncReceiver) {
    let cfg = PollerConfig::builder()
        .mode(Mode::Bpev)
        .bp_timeout(spin)
        .auto_tune(false)
        .spin_backoff(false)
        .handoff(Handoff::Never)
        .build()
        .unwrap();
    let poller = Poller::start(cfg).unwrap();
    let ring = RingConfig::builder()
        .ring_size(4096)
        .huge_pages(false)
        .build()
        .unwrap();
    let (a, b) = AsyncConn::loopback_pair(&poller, &ring).unwrap();
    let (atx, _) = a.split().unwrap();
    let (_, brx) = b.split().unwrap();
    (poller, atx, brx)
}

/// Polls `rx` until a message comes (yielding to the runtime between polls), and returns it.
async fn next(rx: &mut AsyncReceiver, cx: &mut Context<'_>) -> Vec<u8> {
    let start = Instant::now();
    loop {
        if let Poll::Ready(m) = rx.poll_recv(cx) {
            return m.unwrap().to_vec();
        }
        assert!(start.elapsed() < BOUND, "no message");
        tokio::task::yield_now().await;
    }
}

/// A wait begun and left (nobody polls it while the message comes) loses nothing: the next
/// poll returns the message, and the one after that the next. A wait polled again and again
/// resumes (its state stays in the receiver): its spin runs out, the head it owes goes out
/// once, just before it sleeps, and the poller's wake-up brings the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_polled_in_place_resumes_its_wait_and_loses_nothing() {
    let (poller, mut tx, mut rx) = pair(Duration::from_millis(2));
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);

    // Left mid-wait: nothing there yet.
    assert!(rx.poll_recv(&mut cx).is_pending());
    tx.send(b"one").await.unwrap();
    tx.flush_all().await.unwrap();
    tx.send(b"two").await.unwrap();
    tx.flush_all().await.unwrap();
    assert_eq!(next(&mut rx, &mut cx).await, b"one");
    assert_eq!(next(&mut rx, &mut cx).await, b"two");

    // Two messages read, their head not pushed yet (RB²'s lazy push): the wait pushes it
    // only once its spin ran out, as it goes to sleep. Polled again after every yield,
    // the wait goes on where it was; begun afresh at every poll, its spin would never
    // run out.
    let pushes = rx.head_pushes();
    let spins = poller.stats().spins;
    let start = Instant::now();
    loop {
        assert!(rx.poll_recv(&mut cx).is_pending(), "nothing was sent");
        if rx.head_pushes() > pushes {
            break;
        }
        assert!(
            start.elapsed() < BOUND,
            "the wait never went to sleep: its spin restarted at every poll"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(rx.head_pushes(), pushes + 1, "one push, before the sleep");
    assert_eq!(
        poller.stats().spins,
        spins + 1,
        "one wait, one spin, however many polls: a wait begun afresh at every poll spins anew"
    );

    // Asleep: the poller wakes the waker the sleep registered when the message comes.
    let woken = count.0.load(Ordering::SeqCst);
    tx.send(b"three").await.unwrap();
    tx.flush_all().await.unwrap();
    let start = Instant::now();
    while count.0.load(Ordering::SeqCst) == woken {
        assert!(start.elapsed() < BOUND, "the sleeping wait was never woken");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(next(&mut rx, &mut cx).await, b"three");
}

/// [`AsyncReceiver::recv`]'s future dropped mid-wait drops the wait with it (the next
/// receive begins afresh) and loses no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_future_dropped_mid_wait_loses_nothing() {
    let (_poller, mut tx, mut rx) = pair(Duration::from_micros(50));
    for _ in 0..3 {
        assert!(
            tokio::time::timeout(Duration::from_millis(5), rx.recv())
                .await
                .is_err()
        );
    }
    tx.send(b"after").await.unwrap();
    tx.flush_all().await.unwrap();
    let m = tokio::time::timeout(BOUND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*m, b"after");
}
