//! Dropping the last clone of a channel releases its connection promptly,
//! on both paths (before, on the HTTP/2 path its sockets, eventfds and
//! memfd rings stayed open for 30 s or more while the process was idle,
//! because the ring reader task outlived the hyper connection; sometimes on
//! the fast path too). The tests of this binary count the process's open
//! file descriptors, so they hold one lock and run one after the other.

use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc").count()
}

/// Held by each test while it counts descriptors.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_channel_releases_its_connection_promptly() {
    let _alone = ALONE.lock().await;
    for t in [Transport::ShmH2, Transport::ShmFast] {
        dropped_channel_releases(t).await;
    }
}

/// The same over `rdma://` (the side channel's socket, the completion
/// channels' descriptors).
#[cfg(feature = "verbs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_dropped_channel_releases_its_connection_promptly() {
    if Transport::rdma_device().is_none() {
        eprintln!("skipped: RRPC_TEST_DEVICE not set");
        return;
    }
    eprintln!("rrpc-test-on-verbs");
    let _alone = ALONE.lock().await;
    for t in [Transport::RdmaH2, Transport::RdmaFast] {
        dropped_channel_releases(t).await;
    }
}

/// How long a dropped channel's descriptors may take to go: 5 s, or 20 s
/// inside `cargo xtask rxe`'s VM (`RRPC_RXE_VM`). In the VM they go in
/// 20-90 ms (printed below; rehearsals of 2026-12-07), but one run in about
/// ten, on a loaded host, saw `RdmaH2` still holding a connection at 5 s,
/// for a reason not yet found (journal, "The release test in the VM"). The
/// bug this test was written for held connections 30 s and more; 20 s
/// keeps catching that while the finding is open. Not a speed allowance.
fn release_bound() -> Duration {
    if std::env::var_os("RRPC_RXE_VM").is_some() {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(5)
    }
}

async fn dropped_channel_releases(t: Transport) {
    let h = Harness::start(t).await;
    // Warm up: the poller thread, the runtime's own fds.
    {
        let mut c = TestClient::new(h.channel().await);
        c.unary(Input::default()).await.expect("call");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = open_fds();
    for _ in 0..3 {
        let ch = h.channel().await;
        let mut c = TestClient::new(ch.clone());
        c.unary(Input::default()).await.expect("call");
        // A stream dropped half read, and one still open when the channel goes.
        let mut st = c
            .server_stream(Input {
                count: 100,
                payload: vec![1; 1000],
                ..Default::default()
            })
            .await
            .expect("stream")
            .into_inner();
        st.message().await.expect("message");
        drop(st);
        let mut open = c
            .server_stream(Input {
                count: 1000,
                delay_ms: 1,
                ..Default::default()
            })
            .await
            .expect("stream")
            .into_inner();
        open.message().await.expect("message");
        assert!(open_fds() > base, "{t:?}: a connection holds descriptors");
        drop((c, ch, open));
        let bound = release_bound();
        let start = Instant::now();
        while open_fds() > base && start.elapsed() < bound {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "{t:?}: descriptors back to the baseline {:?} after the channel was dropped (bound {bound:?})",
            start.elapsed()
        );
        if open_fds() > base {
            for e in std::fs::read_dir("/proc/self/fd").unwrap() {
                let e = e.unwrap();
                eprintln!(
                    "{:?} -> {:?}",
                    e.file_name(),
                    std::fs::read_link(e.path()).ok()
                );
            }
        }
        assert!(
            open_fds() <= base,
            "{t:?}: {} descriptors still open {bound:?} after the channel was dropped (baseline {base})",
            open_fds()
        );
    }
}

/// Many `shm://` connects back to back (each dialed without a blocking
/// thread on either side: rrpc-core `conn::Dialing`, the server's inline
/// handshake), each carrying a call and dropped at once: once they are
/// gone, the process holds no more descriptors than before, whether the
/// connections ran their calls or were dropped before their first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_connects_leave_no_descriptor() {
    let _alone = ALONE.lock().await;
    let t = Transport::ShmFast;
    let h = Harness::start(t).await;
    {
        let mut c = TestClient::new(h.channel().await);
        c.unary(Input::default()).await.expect("call");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = open_fds();
    let mut peak = base;
    for i in 0..200 {
        let ch = h.channel().await;
        if i % 2 == 0 {
            let mut c = TestClient::new(ch.clone());
            c.unary(Input::default()).await.expect("call");
        }
        peak = peak.max(open_fds());
        drop(ch);
    }
    assert!(peak > base, "a connection holds descriptors");
    let start = Instant::now();
    while open_fds() > base && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        open_fds() <= base,
        "{} descriptors open 5 s after 200 connections were dropped (baseline {base}, peak {peak})",
        open_fds()
    );
}
