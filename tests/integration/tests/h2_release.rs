//! Dropping the last clone of an HTTP/2-path channel releases its
//! connection promptly (issue 15: its sockets, eventfds and memfd rings
//! stayed open for 30 s or more while the process was idle, because the
//! ring reader task outlived the hyper connection). One test in this binary:
//! it counts the process's open file descriptors.

use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_http2_channel_releases_its_connection_promptly() {
    let h = Harness::start(Transport::ShmH2).await;
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
        assert!(open_fds() > base, "a connection holds descriptors");
        drop((c, ch));
        let start = Instant::now();
        while open_fds() > base && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
            "{} descriptors still open 5 s after the channel was dropped (baseline {base})",
            open_fds()
        );
    }
}
