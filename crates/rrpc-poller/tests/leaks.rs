//! Shutdown joins every polling thread and leaks no fd (its own test binary, one test, so the
//! process-wide counts are not disturbed by other tests).

mod common;

use std::sync::atomic::Ordering;

use common::{Fake, poller};
use rrpc_poller::Mode;

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn threads() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn no_thread_or_fd_leak_in_any_mode() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (fd0, th0) = (fds(), threads());
    for mode in Mode::ALL {
        rt.block_on(async {
            let p = poller(mode);
            let mut regs = Vec::new();
            for _ in 0..32 {
                let f = Fake::new();
                regs.push((p.register(f.clone()).unwrap(), f));
            }
            assert!(fds() >= fd0, "{mode}");
            if mode == Mode::Event {
                assert!(
                    fds() >= fd0 + 32,
                    "{mode}: one eventfd per connection expected"
                );
            }
            for (reg, f) in &mut regs {
                f.written.fetch_add(1, Ordering::Release);
                reg.doorbell().ring();
                reg.wait_ready().await.unwrap();
                f.consume();
            }
            drop(regs);
            p.shutdown();
        });
        assert_eq!(fds(), fd0, "{mode}: fd leak");
        assert_eq!(threads(), th0, "{mode}: thread leak");
    }
}

/// A registration dropped while its polling thread is parked lets go of its
/// source (on rrpc-tonic: the connection's rings, eventfds and side channel)
/// at once. Before: the parked thread kept the source in its snapshot of the
/// entry list until its next wake-up, which for an idle process was 30 s or
/// more.
#[test]
fn dropped_registration_is_released_while_the_thread_is_parked() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for mode in [Mode::Bpev, Mode::Bpts] {
        rt.block_on(async {
            let p = poller(mode);
            let f = Fake::new();
            let mut reg = p.register(f.clone()).unwrap();
            f.written.fetch_add(1, Ordering::Release);
            reg.doorbell().ring();
            reg.wait_ready().await.unwrap();
            f.consume();
            // Let the polling thread go idle and park (nothing is armed: it
            // parks without a timeout).
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let weak = std::sync::Arc::downgrade(&f);
            drop(f);
            drop(reg);
            let start = std::time::Instant::now();
            while weak.strong_count() > 0 && start.elapsed() < std::time::Duration::from_secs(3) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert_eq!(
                weak.strong_count(),
                0,
                "{mode}: the parked thread still holds the source"
            );
            p.shutdown();
        });
    }
}
