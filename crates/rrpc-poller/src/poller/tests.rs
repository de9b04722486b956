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

/// A BPEV poller with one polling thread whose waits spin a fixed `spin` (no auto-tune).
fn fixed_spin_poller(spin: Duration) -> Poller {
    Poller::start(
        PollerConfig::builder()
            .mode(Mode::Bpev)
            .polling_threads(1)
            .bp_timeout(spin)
            .auto_tune(false)
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

/// A source that becomes ready at a deadline (nanoseconds since `base`), no writer needed.
#[derive(Debug)]
struct ReadyAt {
    base: Instant,
    at_ns: AtomicU64,
}

impl ReadyAt {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            at_ns: AtomicU64::new(u64::MAX),
        })
    }
    fn ready_in(&self, d: Duration) {
        let at = (self.base.elapsed() + d).as_nanos() as u64;
        self.at_ns.store(at, Ordering::SeqCst);
    }
}

impl Readiness for ReadyAt {
    fn ready(&self) -> bool {
        self.base.elapsed().as_nanos() as u64 >= self.at_ns.load(Ordering::SeqCst)
    }
}

/// Many clients on few cores: a spin whose worker has other tasks with work stops at its
/// first yield. That is a miss of the connection's spins, so a connection whose worker is
/// always busy stops spinning (one probe in 16 waits) instead of paying a yield, a re-poll
/// and a neighbour scan on every wait (Fig. 8 (a) at 256 clients: 0.50-0.56 -> 0.89-1.00 of
/// the best mode, docs/measured.md).
#[test]
fn a_connection_whose_worker_is_always_busy_stops_spinning() {
    rt().block_on(async {
        let p = fixed_spin_poller(Duration::from_micros(200));
        // A neighbour on the same worker whose every wait finds its data: it makes progress
        // whenever it runs.
        let always = ReadyAt::new();
        always.ready_in(Duration::ZERO);
        let mut busy = p.register(always).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let neighbour = tokio::spawn(async move {
            while !stop2.load(Ordering::Relaxed) {
                busy.wait_ready().await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        let src = ReadyAt::new();
        let mut reg = p.register(src.clone()).unwrap();
        let before = p.stats();
        const WAITS: u64 = 64;
        for _ in 0..WAITS {
            src.ready_in(Duration::from_micros(300));
            reg.wait_ready().await.unwrap();
            src.at_ns.store(u64::MAX, Ordering::SeqCst);
        }
        stop.store(true, Ordering::Relaxed);
        neighbour.await.unwrap();
        let d = p.stats().since(&before);
        assert!(
            d.busy_worker_spins >= 8,
            "spins were cut short by the neighbour: {d:?}"
        );
        // Below a 1/8 hit rate the waits skip their spin (one probe in 16 still spins).
        assert!(
            d.spin_skips >= WAITS / 2,
            "most waits skipped their spin: {d:?}"
        );
        assert!(d.spins <= WAITS / 2, "most waits did not spin: {d:?}");
    });
}

/// A spinning task's help looks at a bounded, rotating window of its shard, and a full turn
/// of the cursor covers every entry exactly once.
#[test]
fn help_scans_a_rotating_window_of_the_shard() {
    use super::registration::help_window;
    use super::shard::HELP_SCAN;
    assert_eq!(help_window(123, 5), [0..5, 0..0]);
    assert_eq!(help_window(7, HELP_SCAN), [0..HELP_SCAN, 0..0]);
    for len in [HELP_SCAN + 1, 40, 512, 513] {
        let mut seen = vec![0u32; len];
        let mut cursor = 9usize;
        for _ in 0..len {
            let [a, b] = help_window(cursor, len);
            assert_eq!(a.len() + b.len(), HELP_SCAN, "len {len} cursor {cursor}");
            for i in a.chain(b) {
                seen[i] += 1;
            }
            cursor += HELP_SCAN;
        }
        // len turns of HELP_SCAN entries: every entry HELP_SCAN times.
        assert!(
            seen.iter().all(|&c| c == HELP_SCAN as u32),
            "len {len}: {seen:?}"
        );
    }
}

/// A spin yields first at 1 µs, unless its waits end sooner than its yield period: then just
/// after the catch they predict (the reply of a ping-pong is caught without a yield), never
/// later than the period. Under load (long waits) and with a short period (the HTTP/2 path's
/// 300 ns) it stays early.
#[test]
fn the_first_yield_waits_for_a_catch_a_short_rtt_predicts() {
    use super::registration::first_yield;
    let us = Duration::from_micros;
    let ns = Duration::from_nanos;
    let period = us(5);
    // (RTT estimate, yield period, first yield, why)
    let cases = [
        (us(0), period, us(1), "no estimate yet"),
        (ns(400), period, us(1), "a very short wait: still 1 µs"),
        (us(2), period, us(3), "1.5 times the estimate"),
        (ns(2_800), period, ns(4_200), "the demo's ping-pong"),
        (us(4), period, period, "never past the period"),
        (us(5), period, us(1), "waits as long as the period: load"),
        (us(200), period, us(1), "long waits"),
        (us(2), ns(300), ns(300), "the HTTP/2 path's period"),
    ];
    for (rtt, p, want, why) in cases {
        assert_eq!(first_yield(rtt, p), want, "{why}");
    }
}

/// A spin that catches its data only after more than a wake-up's worth of spinning (the
/// HTTP/2 path's client at low load: it spun out the server's whole wake-up, ~100 µs, every
/// call) is scored a miss, so the connection stops spinning; the same data a few µs away
/// keeps it spinning.
#[test]
fn a_spin_that_catches_its_data_only_late_does_not_earn() {
    rt().block_on(async {
        let p = fixed_spin_poller(Duration::from_micros(400));
        const WAITS: u64 = 64;
        let waits = |after: Duration| {
            let src = ReadyAt::new();
            let mut reg = p.register(src.clone()).unwrap();
            let p = &p;
            async move {
                let before = p.stats();
                for _ in 0..WAITS {
                    src.ready_in(after);
                    reg.wait_ready().await.unwrap();
                    src.at_ns.store(u64::MAX, Ordering::SeqCst);
                }
                p.stats().since(&before)
            }
        };
        let late = waits(Duration::from_micros(150)).await;
        assert!(
            late.spin_skips >= WAITS / 2,
            "late catches stop the spin: {late:?}"
        );
        let soon = waits(Duration::from_micros(5)).await;
        assert_eq!(soon.spin_skips, 0, "quick catches keep it: {soon:?}");
        assert!(soon.spin_hits >= WAITS / 2, "{soon:?}");
    });
}

/// A source that is ready from its `n`th look on.
#[derive(Debug)]
struct ReadyFromLook(AtomicU64);

impl Readiness for ReadyFromLook {
    fn ready(&self) -> bool {
        self.0.fetch_sub(1, Ordering::SeqCst) <= 1
    }
}

/// A handed-off wait that follows this end's own send gives the CPU to the
/// peer first: an answer there after that turn is taken in the same poll,
/// without a yield to the worker (a task poll and a reactor poll a wait;
/// the fast path's ping-pong on one CPU). A wait whose end sent nothing
/// since its data came yields to its worker first, as before.
#[test]
fn a_handed_off_wait_after_a_send_yields_the_cpu_first() {
    use crate::Handoff;
    use crate::poller::SendLog;
    let p = Poller::start(
        PollerConfig::builder()
            .mode(Mode::Bpev)
            .polling_threads(1)
            .handoff(Handoff::Always)
            .build()
            .unwrap(),
    )
    .unwrap();
    assert!(p.hands_off());
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    // Not ready at the wait's first look, ready at the next one.
    let src = Arc::new(ReadyFromLook(AtomicU64::new(2)));
    let mut reg = p.register(src.clone()).unwrap();
    let sends = Arc::new(SendLog::new());
    reg.follow_sends(sends.clone());
    sends.record();
    let r = reg.poll_ready_with(&mut cx, &mut || Ok(true));
    assert!(
        matches!(r, std::task::Poll::Ready(Ok(()))),
        "after a send: the answer taken without a yield to the worker: {r:?}"
    );
    // Nothing sent since the data came: the worker's turn comes first.
    src.0.store(2, Ordering::SeqCst);
    let r = reg.poll_ready_with(&mut cx, &mut || Ok(true));
    assert!(r.is_pending(), "no send: a yield to the worker first");
    let r = reg.poll_ready_with(&mut cx, &mut || Ok(true));
    assert!(matches!(r, std::task::Poll::Ready(Ok(()))), "{r:?}");
}

/// The instant a wait's data came (where the tuner starts this end's turn) is the
/// clock reading that judged the wait, not a read after it; a wait whose first look found
/// the data (no reading) reads the clock then.
#[test]
fn a_waits_ready_instant_is_when_its_data_was_seen() {
    use crate::Handoff;
    use crate::poller::SendLog;
    let p = Poller::start(
        PollerConfig::builder()
            .mode(Mode::Bpev)
            .polling_threads(1)
            .handoff(Handoff::Always)
            .build()
            .unwrap(),
    )
    .unwrap();
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    // Not ready at the wait's first look: handed off, then seen.
    let src = Arc::new(ReadyFromLook(AtomicU64::new(2)));
    let mut reg = p.register(src.clone()).unwrap();
    let sends = Arc::new(SendLog::new());
    reg.follow_sends(sends.clone());
    sends.record();
    let before = Instant::now();
    let r = reg.poll_ready_with(&mut cx, &mut || Ok(true));
    let after = Instant::now();
    assert!(matches!(r, std::task::Poll::Ready(Ok(()))), "{r:?}");
    let seen = reg.last_ready.expect("a ready wait after a send sets it");
    assert!(before <= seen && seen <= after);
    // Ready at the first look.
    sends.record();
    src.0.store(0, Ordering::SeqCst);
    let before = Instant::now();
    let r = reg.poll_ready_with(&mut cx, &mut || Ok(true));
    let after = Instant::now();
    assert!(matches!(r, std::task::Poll::Ready(Ok(()))), "{r:?}");
    let seen = reg.last_ready.expect("set");
    assert!(before <= seen && seen <= after, "read afresh");
}

/// The CPU-first hand-off keeps the worker fair: a task whose every wait is
/// answered in the peer's turn still returns to its worker every
/// `CPU_FIRST_RUN` waits (and once its tokio budget is spent), so a
/// neighbour task on the same worker runs meanwhile.
#[test]
fn a_task_answered_in_the_peers_turn_still_lets_its_worker_run() {
    use crate::Handoff;
    use crate::poller::SendLog;
    rt().block_on(async {
        let p = Poller::start(
            PollerConfig::builder()
                .mode(Mode::Bpev)
                .polling_threads(1)
                .handoff(Handoff::Always)
                .build()
                .unwrap(),
        )
        .unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let r = ran.clone();
        let neighbour = tokio::spawn(async move {
            loop {
                r.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        });
        let src = Arc::new(ReadyFromLook(AtomicU64::new(2)));
        let mut reg = p.register(src.clone()).unwrap();
        let sends = Arc::new(SendLog::new());
        reg.follow_sends(sends.clone());
        let ran2 = ran.clone();
        let during = tokio::spawn(async move {
            let before = ran2.load(Ordering::SeqCst);
            for _ in 0..1024 {
                sends.record();
                src.0.store(2, Ordering::SeqCst);
                std::future::poll_fn(|cx| reg.poll_ready_with(cx, &mut || Ok(true)))
                    .await
                    .unwrap();
            }
            ran2.load(Ordering::SeqCst) - before
        })
        .await
        .unwrap();
        neighbour.abort();
        // One wait in `CPU_FIRST_RUN + 1` takes the worker's turn first
        // (without the limit, only tokio's budget: 7 times in 1 024).
        let turns = 1024 / u64::from(super::registration::CPU_FIRST_RUN + 1);
        assert!(
            during >= turns / 2,
            "the neighbour ran {during} times, not about {turns}"
        );
    });
}

/// Ready once set; no doorbell and no liveness: only the polling thread wakes its sleeper.
#[derive(Debug, Default)]
struct Flag(std::sync::atomic::AtomicBool);

impl Readiness for Flag {
    fn ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The polling thread's pass looks at the armed entries only (its shard's armed set): a
/// sleeper is woken in any slot, at a word's edges, in the last slot the set tracks by bit
/// and past it (the set's overflow), and in a slot freed by a registration that left and
/// reused by a new one; a wait armed before the list changed is not lost to the stale list.
#[test]
fn the_polling_thread_wakes_a_sleeper_in_any_slot() {
    rt().block_on(async {
        let p = fixed_spin_poller(Duration::ZERO);
        let n = super::shard::ARMED_BITS + 40;
        let mut regs = Vec::with_capacity(n);
        let mut srcs = Vec::with_capacity(n);
        for _ in 0..n {
            let s = Arc::new(Flag::default());
            regs.push(Some(p.register(s.clone()).unwrap()));
            srcs.push(s);
        }
        let slot_of = |r: &crate::Registration| r.entry.slot.load(Ordering::Relaxed);
        // A registration leaves and a new one takes its slot.
        let reused = slot_of(regs[70].as_ref().unwrap());
        regs[70] = None;
        let s = Arc::new(Flag::default());
        let r = p.register(s.clone()).unwrap();
        assert_eq!(slot_of(&r), reused, "the freed slot is reused");
        regs[70] = Some(r);
        srcs[70] = s;
        for i in [
            0,
            63,
            64,
            70,
            500,
            super::shard::ARMED_BITS - 1,
            super::shard::ARMED_BITS,
            n - 1,
        ] {
            let mut reg = regs[i].take().unwrap();
            assert_eq!(slot_of(&reg), i, "slots in registration order");
            let entry = reg.entry.clone();
            // The thread took the list as it is now (the last waiter's registration left)
            // and parked: only this arm can bring it to the entry.
            let shard = reg.shard.clone();
            tokio::time::sleep(Duration::from_millis(2)).await;
            until("the thread to park", || shard.parked.load(Ordering::SeqCst)).await;
            let waiter = tokio::spawn(async move { reg.wait_ready().await });
            until("the wait to sleep", || entry.armed.load(Ordering::SeqCst)).await;
            // Let the thread take the arm and park again with the entry watched.
            tokio::time::sleep(Duration::from_millis(2)).await;
            srcs[i].0.store(true, Ordering::SeqCst);
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .unwrap_or_else(|_| panic!("the sleeper in slot {i} was never woken"))
                .unwrap()
                .unwrap();
        }
    });
}
