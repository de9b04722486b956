//! Device faults on `rdma://` (on verbs): the link under the RDMA device
//! taken down while calls are in flight (every call ends with a typed error
//! within a bound, a call while the link is down fails fast instead of
//! hanging, and once the link is back the same channel reconnects and calls
//! succeed again; the process's descriptors return to their baseline), and
//! the device itself removed mid-call (see `device_removed_mid_call`).
//!
//! It changes the machine (`ip link set <netdev> down`), so it runs only
//! inside the throwaway VM of `cargo xtask rxe` (`RRPC_RXE_VM=1`, as root),
//! never against a real NIC, and it is the only test of its binary. Tested
//! on soft-RoCE; not run on an RDMA NIC.

#[cfg(feature = "verbs")]
mod on_verbs {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use rrpc_integration_tests::pb::Input;
    use rrpc_integration_tests::pb::test_client::TestClient;
    use rrpc_integration_tests::{Harness, Transport, calls_in_flight, payload};
    use rrpc_tonic::RrpcChannel;
    use tonic::Code;

    /// How long a call may take to fail (soft-RoCE under TCG is slow).
    const BOUND: Duration = Duration::from_secs(60);

    /// How long the quiet connection's call waits in its handler: longer
    /// than the link stays down.
    const QUIET_MS: u32 = 20_000;

    fn count(dir: &str) -> usize {
        std::fs::read_dir(dir).map(Iterator::count).unwrap_or(0)
    }

    fn sys(dev: &str, leaf: &str) -> String {
        std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/{leaf}"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The link under `dev`, taken down; brought back up (and waited for)
    /// on drop, panics included, so the rest of the suite finds it up.
    struct LinkDown {
        dev: String,
        netdev: String,
    }

    impl LinkDown {
        fn new(dev: &str) -> LinkDown {
            let netdev = sys(dev, "gid_attrs/ndevs/0");
            assert!(!netdev.is_empty(), "no netdev under {dev}");
            ip(&netdev, "down");
            let l = LinkDown {
                dev: dev.to_string(),
                netdev,
            };
            l.wait_state("DOWN");
            l
        }

        fn wait_state(&self, want: &str) {
            let t0 = Instant::now();
            while !sys(&self.dev, "state").contains(want) {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "{} port never became {want}: {}",
                    self.dev,
                    sys(&self.dev, "state")
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    impl Drop for LinkDown {
        fn drop(&mut self) {
            ip(&self.netdev, "up");
            self.wait_state("ACTIVE");
        }
    }

    fn ip(netdev: &str, state: &str) {
        let st = Command::new("ip")
            .args(["link", "set", netdev, state])
            .status()
            .expect("run ip");
        assert!(st.success(), "ip link set {netdev} {state}: {st}");
    }

    async fn link_down_mid_call(t: Transport, dev: &str) {
        let h = Harness::start(t).await;
        // Asserts that verbs carries the channel, on the device asked for.
        let ch = h.channel().await;
        let mut c = TestClient::new(ch.clone());
        c.unary(Input::default()).await.expect("a first call");
        // A second, quiet connection: one slow call, nothing in flight on
        // the wire while the link is down.
        let quiet_ch = h.channel().await;
        let mut quiet = TestClient::new(quiet_ch.clone());
        quiet
            .unary(Input::default())
            .await
            .expect("a first quiet call");
        let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));
        let quiet_call = tokio::spawn(async move {
            quiet
                .unary(Input {
                    payload: payload(100),
                    delay_ms: QUIET_MS,
                    ..Default::default()
                })
                .await
        });
        let quiet_t0 = Instant::now();
        let mut calls = calls_in_flight(&c, 2, 1, 1);
        tokio::time::sleep(Duration::from_millis(300)).await;

        let down = LinkDown::new(dev);
        let t0 = Instant::now();
        let mut codes = Vec::new();
        while let Some(r) = tokio::time::timeout(BOUND, calls.join_next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{t:?}: a call hung {:?} after the link went down",
                    t0.elapsed()
                )
            })
        {
            let st = r
                .expect("call task")
                .expect_err("a call cannot complete with the link down");
            eprintln!("{t:?}: call ended after {:?}: {st}", t0.elapsed());
            codes.push(st.code());
        }
        // A call while the link is down fails, typed, and does not hang.
        let st = tokio::time::timeout(BOUND, c.unary(Input::default()))
            .await
            .unwrap_or_else(|_| panic!("{t:?}: a call hung while the link was down"))
            .expect_err("a call with the link down");
        eprintln!("{t:?}: call with the link down: {st}");
        codes.push(st.code());
        assert!(
            codes.iter().all(|c| *c == Code::Unavailable),
            "{t:?}: a device fault is Unavailable: {codes:?}"
        );

        drop(down);
        let link_back = quiet_t0.elapsed();
        // The same channel reconnects once the link is back.
        let t1 = Instant::now();
        loop {
            match tokio::time::timeout(BOUND, c.unary(Input::default())).await {
                Ok(Ok(_)) => break,
                Ok(Err(st)) => eprintln!("{t:?}: after the link came back: {st}"),
                Err(_) => panic!("{t:?}: a call hung after the link came back"),
            }
            assert!(
                t1.elapsed() < BOUND,
                "{t:?}: no call succeeded after the link came back"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "{t:?}: calls succeed again {:?} after the link came back",
            t1.elapsed()
        );
        // Like TCP, a connection with nothing on the wire while the link was
        // down survives the flap: the quiet call's reply, sent after the
        // link came back, arrives.
        assert!(
            link_back < Duration::from_millis(QUIET_MS.into()),
            "{t:?}: the link was down longer ({link_back:?}) than the quiet call's handler waits"
        );
        let r = tokio::time::timeout(BOUND, quiet_call)
            .await
            .unwrap_or_else(|_| panic!("{t:?}: the quiet call hung"))
            .expect("quiet call task");
        assert!(
            r.is_ok(),
            "{t:?}: the quiet connection did not survive the flap: {r:?}"
        );
        drop(quiet_ch);
        drop(c);
        drop(ch);
        // The failed connections' resources are released.
        let t2 = Instant::now();
        loop {
            let now = (count("/proc/self/fd"), count("/proc/self/task"));
            if now.0 <= fds + 8 && now.1 <= threads + 2 {
                break;
            }
            assert!(
                t2.elapsed() < BOUND,
                "{t:?}: fds {fds} -> {}, threads {threads} -> {}",
                now.0,
                now.1
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `rdma ARGS`, asserting success.
    fn rdma(args: &[&str]) {
        let st = Command::new("rdma").args(args).status().expect("run rdma");
        assert!(st.success(), "rdma {args:?}: {st}");
    }

    /// The device removed (`rdma link delete`) while a call is in flight.
    /// rdma_rxe cannot take a device away from a process that has it open
    /// (no `disassociate_ucontext`, and no event reaches the process), so
    /// the removal waits: the call in flight completes. Once the channel
    /// and the server are dropped, rrpc holds no handle on the device (no
    /// context, PD, region or queue pair left behind), so the removal
    /// completes; a connect then fails `Unavailable` naming the missing
    /// device, and after the device is added back a new server and channel
    /// work. On a NIC whose driver disassociates, the process would see
    /// the device fail instead; that is not tested here.
    async fn device_removed_mid_call(t: Transport, dev: &str) {
        let netdev = sys(dev, "gid_attrs/ndevs/0");
        assert!(!netdev.is_empty(), "no netdev under {dev}");
        let mut h = Harness::start(t).await;
        let ch = h.channel().await;
        let mut c = TestClient::new(ch.clone());
        c.unary(Input::default()).await.expect("a first call");
        let slow = tokio::spawn({
            let mut c = c.clone();
            async move {
                c.unary(Input {
                    payload: payload(100),
                    delay_ms: 3000,
                    ..Default::default()
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut delete = Command::new("rdma")
            .args(["link", "delete", dev])
            .spawn()
            .expect("rdma link delete");
        let r = tokio::time::timeout(BOUND, slow)
            .await
            .expect("the call in flight hung")
            .expect("call task");
        assert!(
            r.is_ok(),
            "{t:?}: the call in flight while the removal waits: {r:?}"
        );
        assert!(
            delete.try_wait().expect("wait").is_none(),
            "{t:?}: soft-RoCE removed a device that rrpc still had open"
        );
        drop(c);
        drop(ch);
        h.kill();
        drop(h);
        // Every handle released: the removal completes.
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = delete.try_wait().expect("wait") {
                break st;
            }
            assert!(
                t0.elapsed() < BOUND,
                "{t:?}: the device removal still waits {BOUND:?} after rrpc dropped everything: a device handle leaked"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(st.success(), "rdma link delete: {st}");
        eprintln!("{t:?}: device removed {:?} after rrpc let go", t0.elapsed());
        // No device: a typed error, Unavailable for a caller.
        let e = RrpcChannel::connect("rdma://127.0.0.1:1", rrpc_integration_tests::config(t))
            .await
            .expect_err("connect without the device");
        let st = tonic::Status::from(e);
        eprintln!("{t:?}: connect without the device: {st}");
        assert_eq!(st.code(), Code::Unavailable, "{st}");
        assert!(st.message().contains("no RDMA device"), "{st}");
        // Added back, it serves again.
        rdma(&["link", "add", dev, "type", "rxe", "netdev", &netdev]);
        let t1 = Instant::now();
        while !(sys(dev, "state").contains("ACTIVE") && sys(dev, "gids/1").ends_with("0a63:0001")) {
            assert!(t1.elapsed() < BOUND, "{dev} did not come back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let h = Harness::start(t).await;
        h.client()
            .await
            .unary(Input::default())
            .await
            .expect("a call on the device added back");
    }

    #[test]
    fn rdma_link_down_mid_call() {
        let Some(dev) = Transport::rdma_device() else {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
            return;
        };
        if std::env::var("RRPC_RXE_VM").as_deref() != Ok("1") {
            eprintln!("skipped: takes the link down, so it runs only inside `cargo xtask rxe`");
            return;
        }
        eprintln!("rrpc-test-on-verbs");
        let rt = rrpc_integration_tests::runtime();
        for t in [Transport::RdmaFast, Transport::RdmaH2] {
            rt.block_on(link_down_mid_call(t, &dev));
        }
        rt.block_on(device_removed_mid_call(Transport::RdmaFast, &dev));
    }
}
