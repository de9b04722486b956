//! Lost wake-up regressions of the doorbell fallback with the spin back-off, on a fake
//! source whose writer rings once per announced sleep (the ring's protocol), with the
//! writer's two steps (store the tail; read the sleep word and ring) separable, so a test can
//! put a reader's announce between them.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use crate::sys::EventFd;
use crate::{Mode, Notifier, Poller, PollerConfig, Readiness};

/// A ring reduced to its counters, with an exact doorbell (one memory, as on shm).
#[derive(Debug)]
struct Belled {
    written: AtomicU64,
    read: AtomicU64,
    /// Sleeps the reader announced (the sleep word's epoch).
    announced: AtomicU64,
    /// The last epoch the writer rang for.
    rung: AtomicU64,
    bell: EventFd,
}

impl Belled {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            written: AtomicU64::new(0),
            read: AtomicU64::new(0),
            announced: AtomicU64::new(0),
            rung: AtomicU64::new(0),
            bell: EventFd::new().unwrap(),
        })
    }
    /// The writer's first step: publish one message.
    fn store_tail(&self) {
        self.written.fetch_add(1, Ordering::SeqCst);
    }
    /// The writer's second step: read the sleep word, ring once per new epoch.
    fn ring_if_announced(&self) {
        fence(Ordering::SeqCst);
        let a = self.announced.load(Ordering::SeqCst);
        if a > self.rung.load(Ordering::SeqCst) {
            self.rung.store(a, Ordering::SeqCst);
            self.bell.notify().unwrap();
        }
    }
    fn consume(&self) {
        self.read
            .store(self.written.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

impl Readiness for Belled {
    fn ready(&self) -> bool {
        self.written.load(Ordering::SeqCst) > self.read.load(Ordering::SeqCst)
    }
    fn doorbell(&self) -> Option<&dyn Notifier> {
        Some(self)
    }
}

impl Notifier for Belled {
    fn fd(&self) -> std::io::Result<BorrowedFd<'_>> {
        Ok(self.bell.as_fd())
    }
    fn arm(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn ack(&self) -> std::io::Result<()> {
        match self.bell.drain()? {
            0 => Err(std::io::ErrorKind::WouldBlock.into()),
            _ => Ok(()),
        }
    }
    fn announce_sleep(&self) -> std::io::Result<()> {
        self.announced.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Ok(())
    }
    fn announce_is_exact(&self) -> bool {
        true
    }
}

fn poller() -> Poller {
    Poller::start(
        PollerConfig::builder()
            .mode(Mode::Bpev)
            .polling_threads(1)
            .bp_timeout(Duration::ZERO)
            .build()
            .unwrap(),
    )
    .unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The crossing: a message's writer reads the sleep word only after the reader consumed the
/// message and announced its next sleep, so that announce gets the message's ring, which
/// wakes the reader to an empty ring. The reader must announce again before it sleeps on:
/// the writer rings once per announce, and the next message would otherwise come unrung,
/// while the backed-off polling thread, never kicked, stays parked (the CI hang of the
/// persistent-store test, 2026-11-24).
#[test]
fn a_ring_that_finds_no_data_is_followed_by_a_fresh_announce() {
    rt().block_on(async {
        let p = poller();
        let src = Belled::new();
        let mut reg = p.register(src.clone()).unwrap();
        assert!(reg.entry.exact_bell);
        // Backed off for the whole test: the sleeping task announces for itself and does
        // not kick the thread, which parks with nobody armed.
        let shard = reg.shard.clone();
        shard
            .backoff_until
            .store(shard.clock() + 60_000_000_000, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;

        // Message 0 is stored, read and consumed before its writer reads the sleep word.
        src.store_tail();
        reg.wait_ready().await.unwrap();
        src.consume();
        let waiter = tokio::spawn(async move {
            let r = reg.wait_ready().await;
            (reg, r)
        });
        until("the first announce", || {
            src.announced.load(Ordering::SeqCst) == 1
        })
        .await;
        // Message 0's writer reads the sleep word now: it rings for the new sleep.
        src.ring_if_announced();
        // The reader wakes to nothing; it must sleep again under a fresh announce.
        until("a fresh announce after the ring that found nothing", || {
            src.announced.load(Ordering::SeqCst) == 2
        })
        .await;
        assert!(!waiter.is_finished());
        // Message 1: its ring must come, and wake the reader.
        src.store_tail();
        src.ring_if_announced();
        let (_reg, r) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("message 1 woke the reader")
            .unwrap();
        r.unwrap();
        assert_eq!(src.rung.load(Ordering::SeqCst), 2);
    });
}

/// A backed-off polling thread parks no longer than its back-off: a reader whose ring never
/// comes (what the crossing above did before it was fixed, or any doorbell that fails) is
/// found by the thread's scan once the back-off ends, not left asleep for good.
#[test]
fn a_backed_off_thread_rescans_when_its_back_off_ends() {
    rt().block_on(async {
        let p = poller();
        let src = Belled::new();
        let mut reg = p.register(src.clone()).unwrap();
        let shard = reg.shard.clone();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The back-off begins (as the thread's governor would start it) and the thread parks
        // again with nobody armed.
        shard
            .backoff_until
            .store(shard.clock() + 100_000_000, Ordering::SeqCst);
        shard.kick();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let waiter = tokio::spawn(async move {
            let r = reg.wait_ready().await;
            (reg, r)
        });
        until("the announce", || src.announced.load(Ordering::SeqCst) == 1).await;
        // The message comes without its ring.
        src.store_tail();
        let (_reg, r) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the thread's scan after the back-off woke the reader")
            .unwrap();
        r.unwrap();
        assert_eq!(src.rung.load(Ordering::SeqCst), 0, "no ring was needed");
    });
}
