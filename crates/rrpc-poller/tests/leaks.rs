//! Shutdown joins every polling thread and leaks no fd (its own test binary, one test, so the
//! process-wide counts are not disturbed by other tests: libtest runs tests on parallel
//! threads, and another test's threads and fds show up in these counts; the test that was
//! here beside it lives in `parked_release.rs`).

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
