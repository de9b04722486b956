//! The poller's counters and each polling thread's busy fraction reach the
//! `metrics` facade, so that operators can see what the self-tuning poller
//! does.

use crate::common;

use common::{BOUND, poller, rt_mt};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use rrpc_poller::rings::AsyncConn;
use rrpc_poller::{Mode, Poller, report};
use rrpc_ringbuf::RingConfig;

/// One reported metric: (name, labels, value).
type Metric = (String, Vec<(String, String)>, DebugValue);

/// Every metric reported by `p.report_metrics()`.
fn reported(p: &Poller) -> Vec<Metric> {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || p.report_metrics());
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let labels = k
                .key()
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            (k.key().name().to_string(), labels, v)
        })
        .collect()
}

fn counter(m: &[Metric], name: &str) -> u64 {
    m.iter()
        .find_map(|(n, l, v)| match v {
            DebugValue::Counter(c) if n == name => {
                assert!(l.contains(&("mode".into(), "BPEV".into())), "{n}: {l:?}");
                Some(*c)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name} not reported"))
}

fn busy(m: &[Metric]) -> f64 {
    m.iter()
        .find_map(|(n, l, v)| match v {
            DebugValue::Gauge(g) if n == report::THREAD_BUSY => {
                assert!(l.contains(&("thread".into(), "0".into())), "{l:?}");
                Some(g.into_inner())
            }
            _ => None,
        })
        .expect("the polling thread's busy fraction")
}

#[test]
fn counters_and_busy_fractions_are_reported() {
    let rt = rt_mt();
    let p = poller(Mode::Bpev);
    let before = reported(&p);
    assert_eq!(counter(&before, report::SLEEPS), 0);
    rt.block_on(async {
        let ring = RingConfig::builder()
            .ring_size(8192)
            .huge_pages(false)
            .build()
            .unwrap();
        let (a, b) = AsyncConn::loopback_pair(&p, &ring).unwrap();
        let (mut atx, _arx) = a.split().unwrap();
        let (_btx, mut brx) = b.split().unwrap();
        // The receiver waits before each message arrives, so every
        // receive goes through the poller (a spin hit, or a sleep and a
        // wake-up), not only a first look at a ring that has data.
        let reader = tokio::spawn(async move {
            for i in 0..50u32 {
                let m = tokio::time::timeout(BOUND, brx.recv())
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(&m[..], &i.to_le_bytes());
            }
        });
        for i in 0..50u32 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            atx.send(&i.to_le_bytes()).await.unwrap();
            atx.flush_all().await.unwrap();
        }
        reader.await.unwrap();
    });
    let after = reported(&p);
    let waits = counter(&after, report::SPIN_HITS)
        + counter(&after, report::FIRST_CHECK_HITS)
        + counter(&after, report::WAKEUPS);
    assert!(waits > 0, "50 receives, none counted: {after:?}");
    let polls = counter(&after, report::POLLS);
    assert!(
        polls <= p.stats().polls,
        "the facade carries the poller's own counters: {polls} against {:?}",
        p.stats()
    );
    // The spin back-off's counters are reported too (one per reason).
    let _ = counter(&after, report::SPIN_SKIPS) + counter(&after, report::SELF_ANNOUNCES);
    let reasons: Vec<String> = after
        .iter()
        .filter(|(n, ..)| n == report::BACKOFFS)
        .filter_map(|(_, l, _)| {
            l.iter()
                .find(|(k, _)| k == "reason")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    let b = busy(&after);
    assert!((0.0..=1.0).contains(&b), "{b}");
    // Idle: the thread parks (aggressive idle parking in the test config),
    // and the next interval is mostly parked, in the facade and in the
    // cumulative loads alike.
    let l0 = p.thread_loads();
    assert_eq!(l0.len(), 1, "one polling thread: {l0:?}");
    assert!(l0[0].parked <= l0[0].alive, "{l0:?}");
    // Until the thread has been parked for 250 ms since `l0` (its parked
    // time grows: the event the checks below need), not a fixed sleep that
    // a slow machine may not fill.
    let deadline = std::time::Instant::now() + BOUND;
    while p.thread_loads()[0].parked.saturating_sub(l0[0].parked)
        < std::time::Duration::from_millis(250)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle polling thread never parked 250 ms: {:?} from {l0:?}",
            p.thread_loads()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let idle = busy(&reported(&p));
    assert!(
        idle < 0.5,
        "an idle, parked polling thread reported busy {idle}"
    );
    let l1 = p.thread_loads();
    let b = l1[0].busy_since(&l0[0]);
    assert!(
        b < 0.5,
        "thread_loads: an idle, parked polling thread was busy {b}"
    );
}
