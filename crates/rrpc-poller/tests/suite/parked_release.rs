//! A registration dropped while its polling thread is parked is released at
//! once. (Not in `leaks.rs`: that binary counts the process's descriptors
//! and threads, which a second test running beside it disturbs.)

use crate::common;

use std::sync::atomic::Ordering;

use common::{Fake, poller};
use rrpc_poller::Mode;

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
