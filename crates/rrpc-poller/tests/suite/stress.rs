//! No lost wake-up: thousands of connections, random idle gaps (long enough for polling
//! threads to park and resume), every message read within a generous bound, in every mode.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{BOUND, Fake, Rng, poller, rt_mt};
use proptest::prelude::*;
use rrpc_poller::{Doorbell, Mode};

struct Plan {
    conns: usize,
    messages: u64,
    max_gap_us: u64,
    seed: u64,
}

fn run(mode: Mode, plan: &Plan) {
    let rt = rt_mt();
    rt.block_on(async {
        let p = poller(mode);
        let mut fakes = Vec::new();
        let mut bells: Vec<Doorbell> = Vec::new();
        let mut readers = Vec::new();
        let total_read = Arc::new(AtomicU64::new(0));
        for _ in 0..plan.conns {
            let f = Fake::new();
            let mut reg = p.register(f.clone()).unwrap();
            bells.push(reg.doorbell());
            fakes.push(f.clone());
            let total = total_read.clone();
            readers.push(tokio::spawn(async move {
                loop {
                    if reg.wait_ready().await.is_err() {
                        // Closed at the end of the test, after everything was written.
                        let n = f.consume();
                        total.fetch_add(n, Ordering::Relaxed);
                        return;
                    }
                    let n = f.consume();
                    total.fetch_add(n, Ordering::Relaxed);
                }
            }));
        }
        // The writer is a plain thread, like a remote peer: it publishes messages on random
        // connections with random gaps, some longer than the pollers' idle threshold.
        let fakes2 = fakes.clone();
        let bells2 = bells.clone();
        let (messages, max_gap, seed) = (plan.messages, plan.max_gap_us, plan.seed);
        let writer = std::thread::spawn(move || {
            let mut rng = Rng(seed);
            for _ in 0..messages {
                let c = rng.below(fakes2.len() as u64) as usize;
                fakes2[c].written.fetch_add(1, Ordering::Release);
                if mode == Mode::Event {
                    bells2[c].ring();
                }
                match rng.below(16) {
                    0 => std::thread::sleep(Duration::from_micros(rng.below(max_gap + 1))),
                    1 => std::thread::yield_now(),
                    _ => {}
                }
            }
        });
        writer.join().unwrap();
        // Every message must be read within the bound: a lost wake-up leaves a task asleep
        // with unread data forever.
        let t0 = tokio::time::Instant::now();
        while total_read.load(Ordering::Relaxed) < plan.messages {
            assert!(
                t0.elapsed() < BOUND,
                "{mode}: {} of {} messages read; stats {:?}",
                total_read.load(Ordering::Relaxed),
                plan.messages,
                p.stats()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for (f, b) in fakes.iter().zip(&bells) {
            f.closed.store(true, Ordering::Release);
            b.close();
        }
        for r in readers {
            tokio::time::timeout(BOUND, r)
                .await
                .expect("reader not woken by close")
                .unwrap();
        }
        assert_eq!(total_read.load(Ordering::Relaxed), plan.messages);
        let s = p.stats();
        assert_eq!(s.closed, plan.conns as u64, "{mode}");
        p.shutdown();
        assert_eq!(p.threads(), 0);
    });
}

/// Connections per mode: BP has one thread per connection, so it gets fewer on 2 cores.
fn conns(mode: Mode, many: usize) -> usize {
    if mode == Mode::Bp { many.min(48) } else { many }
}

#[test]
fn thousands_of_connections_every_mode() {
    for mode in Mode::ALL {
        run(
            mode,
            &Plan {
                conns: conns(mode, 2000),
                messages: 20_000,
                max_gap_us: 3000,
                seed: 7,
            },
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_gaps_no_lost_wakeup(mode_i in 0usize..4, n in 1usize..300, msgs in 1u64..3000, gap in 0u64..2000, seed in any::<u64>()) {
        let mode = Mode::ALL[mode_i];
        run(mode, &Plan { conns: conns(mode, n), messages: msgs, max_gap_us: gap, seed });
    }
}
