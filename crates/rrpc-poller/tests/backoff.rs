//! The spin back-off and the wake-up latency, end to end with real polling
//! threads (the decisions themselves are unit-tested on a virtual clock in
//! `rrpc_poller::backoff` and `SpinTuner`).

#[macro_use]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{BOUND, Fake, rt};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use rrpc_poller::{Mode, Poller, PollerConfig, Stats, report};

/// A BPEV poller whose thread spins for a reader that never gets data (no
/// doorbell on the fake source, so the thread keeps spinning through its
/// back-offs), built on a thread pinned to `cpu`: the polling thread
/// inherits the pin.
fn pinned_poller(cpu: usize) -> Poller {
    std::thread::spawn(move || {
        let mut set = CpuSet::new();
        set.set(cpu).unwrap();
        sched_setaffinity(Pid::from_raw(0), &set).unwrap();
        rrpc_poller::Poller::start(
            PollerConfig::builder()
                .mode(Mode::Bpev)
                .polling_threads(1)
                .bp_timeout(Duration::ZERO)
                .idle_park_after(Some(Duration::from_secs(10)))
                .build()
                .unwrap(),
        )
        .unwrap()
    })
    .join()
    .unwrap()
}

/// Spins `poller`'s thread on one armed, never-ready registration for
/// `dur`, optionally with a busy loop pinned to the same CPU, and returns
/// the counters.
fn spin_for(poller: &Poller, cpu: usize, hog: bool, dur: Duration) -> Stats {
    let stop = Arc::new(AtomicBool::new(false));
    let hog = hog.then(|| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut set = CpuSet::new();
            set.set(cpu).unwrap();
            sched_setaffinity(Pid::from_raw(0), &set).unwrap();
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
    });
    let src = Fake::new();
    let stats = rt().block_on(async {
        let mut reg = poller.register(src.clone()).unwrap();
        let before = poller.stats();
        // Never ready: the wait arms and the thread spins on it.
        let r = tokio::time::timeout(dur, reg.wait_ready()).await;
        assert!(r.is_err(), "the source never has data");
        poller.stats().since(&before)
    });
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = hog {
        h.join().unwrap();
    }
    stats
}

/// Serialises this file's tests: each pins threads to the same CPU, and
/// the control above needs that CPU to itself.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The CPU the polling thread and the hog share: the last one this process
/// may run on.
fn shared_cpu() -> usize {
    let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
    (0..CpuSet::count())
        .rev()
        .find(|&c| set.is_set(c).unwrap_or(false))
        .unwrap()
}

#[test]
fn a_polling_thread_that_loses_its_core_backs_off_as_descheduled() {
    let _one = one_at_a_time();
    let cpu = shared_cpu();
    // With a busy loop on its CPU the thread gets about half of each 1 ms
    // window: over the 30 % it may lose. (On a machine loaded far beyond
    // its cores the first window can judge it not earning first, and the
    // back-off then outlasts the run; a few tries.)
    let mut hogged = Vec::new();
    for _ in 0..3 {
        let p = pinned_poller(cpu);
        let s = spin_for(&p, cpu, true, Duration::from_millis(300));
        eprintln!("with a hog: {s:?}");
        p.shutdown();
        let seen = s.backoffs_descheduled >= 1;
        hogged.push(s);
        if seen {
            break;
        }
    }
    assert!(
        hogged.last().is_some_and(|s| s.backoffs_descheduled >= 1),
        "a thread sharing its core with a busy loop backs off: {hogged:?}"
    );
    // The control: alone on its CPU (this binary's tests run one at a time)
    // it keeps the core, so it never backs off as descheduled, only because
    // it wakes nobody. Another process on the machine can still take the
    // CPU for a moment; a few tries find a quiet window.
    let mut tries = Vec::new();
    for _ in 0..5 {
        let p = pinned_poller(cpu);
        let s = spin_for(&p, cpu, false, Duration::from_millis(300));
        eprintln!("alone: {s:?}");
        p.shutdown();
        let quiet = s.backoffs_not_earning >= 1 && s.backoffs_descheduled == 0;
        tries.push(s);
        if quiet {
            break;
        }
    }
    assert!(
        tries
            .last()
            .is_some_and(|s| s.backoffs_not_earning >= 1 && s.backoffs_descheduled == 0),
        "a thread alone on its core backs off as not earning, never as descheduled: {tries:?}"
    );
}

#[test]
fn the_paper_configuration_never_backs_off() {
    let _one = one_at_a_time();
    let cpu = shared_cpu();
    let p = std::thread::spawn(move || {
        let mut set = CpuSet::new();
        set.set(cpu).unwrap();
        sched_setaffinity(Pid::from_raw(0), &set).unwrap();
        rrpc_poller::Poller::start(
            PollerConfig::paper(Mode::Bpev)
                .to_builder()
                .polling_threads(1)
                .build()
                .unwrap(),
        )
        .unwrap()
    })
    .join()
    .unwrap();
    let s = spin_for(&p, cpu, true, Duration::from_millis(100));
    assert_eq!(
        (s.backoffs_descheduled, s.backoffs_not_earning, s.spin_skips),
        (0, 0, 0),
        "{s:?}"
    );
    p.shutdown();
}

#[test]
fn a_task_woken_by_its_polling_thread_measures_its_wake_up_latency() {
    let _one = one_at_a_time();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let p = rrpc_poller::Poller::start(
        PollerConfig::builder()
            .mode(Mode::Bpev)
            .polling_threads(1)
            .bp_timeout(Duration::ZERO)
            .build()
            .unwrap(),
    )
    .unwrap();
    let src = Fake::new();
    let before = p.stats();
    // The task runs on this thread (current_thread runtime), where the
    // local recorder is installed.
    metrics::with_local_recorder(&recorder, || {
        rt().block_on(async {
            let mut reg = p.register(src.clone()).unwrap();
            for _ in 0..5 {
                let w = src.clone();
                let writer = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(2));
                    w.written.fetch_add(1, Ordering::Release);
                });
                let t0 = Instant::now();
                tokio::time::timeout(BOUND, reg.wait_ready())
                    .await
                    .expect("woken")
                    .unwrap();
                assert!(t0.elapsed() < BOUND);
                src.consume();
                writer.join().unwrap();
            }
        });
    });
    let s = p.stats().since(&before);
    assert!(s.timed_wakes >= 1, "{s:?}");
    let mean = s.mean_wake_latency().expect("a measured wake");
    assert!(mean < BOUND, "{mean:?}");
    let samples: usize = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == report::WAKE_LATENCY)
        .map(|(.., v)| match v {
            DebugValue::Histogram(h) => h.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(
        samples as u64, s.timed_wakes,
        "every measured wake reaches the histogram"
    );
    p.shutdown();
}
