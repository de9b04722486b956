//! Behaviour of every mode: wake-ups, doorbells, peer death, shutdown, add/remove under load.

use crate::common;

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{BOUND, Fake, poller, registered, rt, rt_mt, test_config};
use futures_util::poll;
use rrpc_poller::{Error, Mode, Readiness};

/// Publishes one message on `f` the way the writer of each mode would.
fn publish(mode: Mode, f: &Fake, bell: &rrpc_poller::Doorbell) {
    f.written.fetch_add(1, Ordering::Release);
    if mode == Mode::Event {
        bell.ring();
    }
}

/// Polls `fut` (a `wait_ready` with nothing to read) until the poller has
/// put it to sleep: it must stay pending all the while.
async fn poll_until_asleep<F: std::future::Future>(
    p: &rrpc_poller::Poller,
    mut fut: std::pin::Pin<&mut F>,
    mode: Mode,
) {
    let mut polls = 0;
    while p.stats().sleeps == 0 {
        assert!(
            poll!(fut.as_mut()).is_pending(),
            "{mode}: ready without data"
        );
        polls += 1;
        assert!(polls < 1_000_000, "{mode}: never armed");
    }
}

#[test]
fn ready_source_returns_without_sleeping() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let (p, f, mut reg) = registered(mode);
            f.written.store(1, Ordering::Release);
            reg.wait_ready().await.unwrap();
            let s = p.stats();
            assert_eq!(s.first_check_hits, 1, "{mode}");
            assert_eq!(s.sleeps, 0, "{mode}");
        });
    }
}

#[test]
fn sleeping_task_is_woken_in_every_mode() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let (p, f, mut reg) = registered(mode);
            let bell = reg.doorbell();
            {
                let mut fut = Box::pin(reg.wait_ready());
                // Nothing written: the wait must not complete (BPEV spins its 5 µs budget
                // within this first poll or yields; poll until it has armed and slept).
                poll_until_asleep(&p, fut.as_mut(), mode).await;
                publish(mode, &f, &bell);
                // Wait (without polling the task) until the mode's waker side has fired.
                let t0 = std::time::Instant::now();
                loop {
                    let s = p.stats();
                    if s.waker_wakes + s.eventfd_writes == 1 {
                        break;
                    }
                    assert!(t0.elapsed() < BOUND, "{mode}: data never detected");
                    std::thread::yield_now();
                }
                tokio::time::timeout(BOUND, fut)
                    .await
                    .expect("lost wake-up")
                    .unwrap();
            }
            assert_eq!(f.consume(), 1);
            let s = p.stats();
            assert_eq!(s.wakeups, 1, "{mode}: {s:?}");
            match mode {
                Mode::Bp | Mode::Bpts | Mode::Bpev => {
                    assert_eq!((s.waker_wakes, s.eventfd_writes), (1, 0), "{mode}")
                }
                Mode::Event => assert_eq!((s.eventfd_writes, s.waker_wakes), (1, 0), "{mode}"),
            }
        });
    }
}

#[test]
fn doorbell_writes_eventfd_only_when_armed() {
    rt().block_on(async {
        let p = poller(Mode::Event);
        let f = Fake::new();
        let mut reg = p.register(f.clone()).unwrap();
        let bell = reg.doorbell();
        bell.ring();
        bell.ring();
        assert_eq!(p.stats().eventfd_writes, 0, "rang an unarmed registration");
        let mut fut = Box::pin(reg.wait_ready());
        assert!(poll!(fut.as_mut()).is_pending());
        assert_eq!(p.stats().sleeps, 1);
        f.written.store(1, Ordering::Release);
        bell.ring();
        bell.ring(); // already disarmed by the first ring
        assert_eq!(p.stats().eventfd_writes, 1);
        tokio::time::timeout(BOUND, fut).await.unwrap().unwrap();
    });
}

#[test]
fn peer_death_wakes_with_error_and_removes() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let (p, f, mut reg) = registered(mode);
            let bell = reg.doorbell();
            let mut fut = Box::pin(reg.wait_ready());
            poll_until_asleep(&p, fut.as_mut(), mode).await;
            let f2 = f.clone();
            std::thread::spawn(move || {
                f2.closed.store(true, Ordering::Release);
                if mode == Mode::Event {
                    bell.close();
                }
            });
            let r = tokio::time::timeout(BOUND, fut).await.expect("not woken");
            assert!(matches!(r, Err(Error::PeerGone)), "{mode}: {r:?}");
            assert!(reg.is_closed());
            assert!(matches!(reg.wait_ready().await, Err(Error::PeerGone)));
            assert_eq!(p.stats().closed, 1, "{mode}");
        });
    }
}

/// A source whose liveness is a Unix socket, like rrpc-core's side channel.
struct Live {
    fake: Arc<Fake>,
    sock: std::os::unix::net::UnixStream,
}

impl Readiness for Live {
    fn ready(&self) -> bool {
        self.fake.ready()
    }
    fn liveness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }
}

#[test]
fn liveness_fd_closing_fails_the_waiter() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let p = poller(mode);
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let src = Arc::new(Live {
                fake: Fake::new(),
                sock: a,
            });
            let mut reg = p.register(src).unwrap();
            let mut fut = Box::pin(reg.wait_ready());
            poll_until_asleep(&p, fut.as_mut(), mode).await;
            drop(b);
            let r = tokio::time::timeout(BOUND, fut).await.expect("not woken");
            assert!(matches!(r, Err(Error::PeerGone)), "{mode}: {r:?}");
        });
    }
}

/// A source whose liveness is an rrpc-core lane's (no descriptor).
struct LaneLive {
    fake: Arc<Fake>,
    live: Arc<rrpc_core::conn::Liveness>,
}

impl Readiness for LaneLive {
    fn ready(&self) -> bool {
        self.fake.ready()
    }
    fn liveness(&self) -> Option<rrpc_core::conn::LivenessWatch> {
        Some(self.live.watch())
    }
}

/// A lane's liveness ending wakes a sleeping waiter with `PeerGone`, in
/// every mode, as its side channel's fd closing would.
#[test]
fn a_lane_liveness_ending_fails_the_waiter() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let p = poller(mode);
            let live = rrpc_core::conn::Liveness::new();
            let src = Arc::new(LaneLive {
                fake: Fake::new(),
                live: live.clone(),
            });
            let mut reg = p.register(src).unwrap();
            let mut fut = Box::pin(reg.wait_ready());
            poll_until_asleep(&p, fut.as_mut(), mode).await;
            live.end();
            let r = tokio::time::timeout(BOUND, fut).await.expect("not woken");
            assert!(matches!(r, Err(Error::PeerGone)), "{mode}: {r:?}");
        });
    }
}

#[test]
fn shutdown_wakes_waiters_and_joins_threads() {
    for mode in [Mode::Bp, Mode::Bpts, Mode::Bpev, Mode::Event] {
        rt().block_on(async {
            let (p, _f, mut reg) = registered(mode);
            let expect_threads = match mode {
                Mode::Event => 0,
                _ => 1,
            };
            assert_eq!(p.threads(), expect_threads, "{mode}");
            let mut fut = Box::pin(reg.wait_ready());
            poll_until_asleep(&p, fut.as_mut(), mode).await;
            p.shutdown();
            assert_eq!(p.threads(), 0, "{mode}");
            let r = tokio::time::timeout(BOUND, fut).await.expect("not woken");
            assert!(matches!(r, Err(Error::Shutdown)), "{mode}: {r:?}");
            assert!(matches!(p.register(Fake::new()), Err(Error::Shutdown)));
        });
    }
}

#[test]
fn bp_spawns_and_joins_one_thread_per_connection() {
    rt().block_on(async {
        let p = poller(Mode::Bp);
        let regs: Vec<_> = (0..5).map(|_| p.register(Fake::new()).unwrap()).collect();
        assert_eq!(p.threads(), 5);
        drop(regs);
        assert_eq!(p.threads(), 0);
    });
}

#[test]
fn bp_siblings_share_their_connection_thread() {
    rt().block_on(async {
        let p = poller(Mode::Bp);
        let rx: Vec<_> = (0..3).map(|_| p.register(Fake::new()).unwrap()).collect();
        let tx: Vec<_> = rx
            .iter()
            .map(|r| r.register_sibling(Fake::new()).unwrap())
            .collect();
        assert_eq!(
            p.threads(),
            3,
            "one thread per connection, not per direction"
        );
        let mut rx = rx.into_iter();
        let mut tx = tx.into_iter();
        drop(rx.next());
        assert_eq!(p.threads(), 3, "the sibling still needs the thread");
        drop(tx.next());
        assert_eq!(p.threads(), 2);
        // The sibling alone is still served: a write wakes it through the shared thread.
        let f = Fake::new();
        let r = rx.next().unwrap();
        let mut s = r.register_sibling(f.clone()).unwrap();
        drop(r);
        let sleeps = p.stats().sleeps;
        {
            let mut fut = Box::pin(s.wait_ready());
            while p.stats().sleeps == sleeps {
                assert!(poll!(fut.as_mut()).is_pending());
            }
            f.written.store(1, Ordering::Release);
            // The connection's thread (not our own recheck) must notice it.
            let t0 = std::time::Instant::now();
            while p.stats().waker_wakes == 0 {
                assert!(t0.elapsed() < BOUND, "data never detected");
                std::thread::yield_now();
            }
            tokio::time::timeout(BOUND, fut)
                .await
                .expect("sibling not woken")
                .unwrap();
        }
        drop(s);
        drop(rx);
        drop(tx);
        assert_eq!(p.threads(), 0);
    });
}

#[test]
fn registration_outside_runtime_is_an_error() {
    let p = poller(Mode::Event);
    assert!(matches!(p.register(Fake::new()), Err(Error::NoRuntime)));
    // Waker modes (BP, BPTS, BPEV) need no reactor for a source without a liveness fd.
    for mode in [Mode::Bp, Mode::Bpts, Mode::Bpev] {
        let p = poller(mode);
        assert!(p.register(Fake::new()).is_ok(), "{mode}");
    }
}

#[test]
fn invalid_config_is_rejected() {
    assert!(matches!(
        test_config(Mode::Bpev)
            .to_builder()
            .polling_threads(0)
            .build(),
        Err(Error::InvalidConfig(_))
    ));
    assert!(
        test_config(Mode::Bpev)
            .to_builder()
            .idle_poll_interval(Duration::ZERO)
            .build()
            .is_err()
    );
    assert_eq!(Mode::parse("bpev"), Some(Mode::Bpev));
    assert_eq!(Mode::default(), Mode::Bpev);
}

/// Connections come and go while the polling threads run; each new one gets one message.
#[test]
fn connections_added_and_removed_while_polling() {
    for mode in Mode::ALL {
        let rt = rt_mt();
        rt.block_on(async {
            let p = poller(mode);
            let keep: Vec<_> = (0..16).map(|_| p.register(Fake::new()).unwrap()).collect();
            let mut tasks = Vec::new();
            for i in 0..200u64 {
                let p = p.clone();
                tasks.push(tokio::spawn(async move {
                    let f = Fake::new();
                    let mut reg = p.register(f.clone()).unwrap();
                    let bell = reg.doorbell();
                    let w = f.clone();
                    std::thread::spawn(move || {
                        if i % 3 == 0 {
                            std::thread::sleep(Duration::from_micros(i * 7));
                        }
                        publish(mode, &w, &bell);
                    });
                    tokio::time::timeout(BOUND, reg.wait_ready())
                        .await
                        .expect("lost")
                        .unwrap();
                    assert_eq!(f.consume(), 1);
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            drop(keep);
            p.shutdown();
            assert_eq!(p.threads(), 0);
        });
    }
}

/// Two shared polling threads, both dozing with armed idle connections: data on either shard
/// still wakes its task. (Which thread rescans is not observable from here.)
#[test]
fn data_on_any_dozing_shard_wakes_its_task() {
    for mode in [Mode::Bpts, Mode::Bpev] {
        rt().block_on(async {
            let p = rrpc_poller::Poller::start(
                test_config(mode)
                    .to_builder()
                    .polling_threads(2)
                    .build()
                    .unwrap(),
            )
            .unwrap();
            let fakes: Vec<_> = (0..4).map(|_| Fake::new()).collect();
            let mut regs: Vec<_> = fakes
                .iter()
                .map(|f| p.register(f.clone()).unwrap())
                .collect();
            let mut futs: Vec<_> = regs.iter_mut().map(|r| Box::pin(r.wait_ready())).collect();
            while p.stats().sleeps < 4 {
                for f in &mut futs {
                    let _ = poll!(f.as_mut());
                }
            }
            // Both threads doze (each shard has armed, idle connections).
            let t0 = std::time::Instant::now();
            while p.stats().parks < 2 {
                assert!(t0.elapsed() < BOUND, "{mode}: threads never dozed");
                std::thread::yield_now();
            }
            for (f, fut) in fakes.iter().zip(futs) {
                f.written.store(1, Ordering::Release);
                tokio::time::timeout(BOUND, fut)
                    .await
                    .expect("dozing shard never rescanned")
                    .unwrap();
            }
        });
    }
}
