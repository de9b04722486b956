//! A server process killed with SIGKILL while unary calls and server
//! streams are in flight: every call ends with an error within a bound,
//! none hangs, a later call on the same channel fails fast too, and the
//! client process's descriptors and threads return to
//! their baseline, counted from `/proc/self`. The kill point is drawn per
//! round (a fixed seed, printed). The counts are process-wide, so this
//! binary's tests run one at a time, each running every transport in turn on its own
//! runtime (blocking threads kept alive 100 ms, not tokio's 10 s); with a
//! device (`cargo xtask rxe`) that includes `rdma_h2` and `rdma_fast`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, calls_in_flight, config};
use rrpc_tonic::RrpcChannel;
use tonic::Code;

/// Set in the child: this test binary, run again with `--ignored --exact
/// child_server`, serves `TRANSPORT URI` instead of testing. The server is
/// this binary rather than a `[[bin]]` target: a bin's path is shared by
/// builds with and without the `verbs` feature, and whichever built last
/// replaced it (the verbs suite once ran a server without verbs).
const CHILD: &str = "RRPC_SIGKILL_CHILD";

/// The server half, in the child process: serves until its stdin closes
/// (the parent died) or it is killed. Ignored, so it never runs (or counts)
/// as a test; a no-op without [`CHILD`].
#[test]
#[ignore = "the server process of the other test, run by it"]
fn child_server() {
    use std::io::Read;
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (t, uri) = spec.split_once(' ').expect("TRANSPORT URI");
    let t = Transport::from_name(t).expect("a transport name");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let h = rt.block_on(Harness::start_at(t, uri, config(t), |s| s));
    println!("listening {}", h.uri);
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(h);
}

/// A server process; killed on drop if still running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(t: Transport) -> (Running, String) {
    let uri = match t {
        Transport::Tcp => "http://127.0.0.1:0".to_string(),
        Transport::RdmaH2 | Transport::RdmaFast => "rdma://127.0.0.1:0".to_string(),
        _ => Harness::fresh_uri(t),
    };
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--ignored", "--exact", "child_server", "--nocapture"])
        .env(CHILD, format!("{} {uri}", t.name()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child server");
    let out = child.stdout.take().expect("stdout");
    let mut out = BufReader::new(out);
    // libtest's own lines ("running 1 test") come first.
    let mut line = String::new();
    let uri = loop {
        line.clear();
        if out.read_line(&mut line).expect("read") == 0 {
            panic!("{t:?}: the child server exited before listening (see its stderr above)");
        }
        if let Some(u) = line.strip_prefix("listening ") {
            break u.trim().to_string();
        }
    };
    (Running(child), uri)
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(Iterator::count).unwrap_or(0)
}

/// A small deterministic generator (xorshift), so a failing round can be
/// replayed from the printed seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// How long a call may take to fail once its server is dead (the side
/// channel's close is seen at once; soft-RoCE is slow).
fn bound(t: Transport) -> Duration {
    if t.is_rdma() {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(10)
    }
}

/// One server, one channel, calls in flight, SIGKILL after `kill_ms`.
async fn round(t: Transport, kill_ms: u64) -> Vec<Code> {
    let (mut server, uri) = spawn(t);
    let ch = RrpcChannel::connect(&uri, config(t))
        .await
        .expect("connect");
    let mut c = TestClient::new(ch.clone());
    c.unary(Input::default()).await.expect("a first call");
    let mut calls = calls_in_flight(&c, 4, 2, 0);
    tokio::time::sleep(Duration::from_millis(kill_ms)).await;
    server.0.kill().expect("SIGKILL");
    let status = server.0.wait().expect("wait");
    assert!(!status.success());
    let t0 = Instant::now();
    let mut codes = Vec::new();
    while let Some(r) = tokio::time::timeout(bound(t), calls.join_next())
        .await
        .unwrap_or_else(|_| panic!("{t:?}: a call hung {:?} after SIGKILL", t0.elapsed()))
    {
        let st = r
            .expect("call task")
            .expect_err("a call to a killed server cannot complete");
        codes.push(st.code());
    }
    // The channel knows: the next call fails, and fast.
    let st = tokio::time::timeout(bound(t), c.unary(Input::default()))
        .await
        .unwrap_or_else(|_| panic!("{t:?}: a new call hung after SIGKILL"))
        .expect_err("a call to a killed server");
    codes.push(st.code());
    codes
}

async fn server_killed_mid_call(t: Transport) {
    // A first round opens what the process keeps (the poller, runtime
    // threads): the baseline is taken after it.
    round(t, 5).await;
    let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));
    let mut seed = 0x5EED_u64 ^ ((t as u64 + 1) * 0x9E37_79B9);
    eprintln!("{t:?}: seed {seed:#x}, baseline {fds} fds, {threads} threads");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let kill_ms = next(&mut seed) % 40;
        let codes = round(t, kill_ms).await;
        eprintln!("{t:?}: killed after {kill_ms} ms: {codes:?}");
        seen.extend(codes);
    }
    // A dead peer is Unavailable on rrpc; tonic over TCP (the reference)
    // reports calls cut mid-flight as Unknown ("h2 protocol error") or
    // Cancelled.
    for c in &seen {
        let ok = match t {
            Transport::Tcp => matches!(c, Code::Unavailable | Code::Unknown | Code::Cancelled),
            _ => *c == Code::Unavailable,
        };
        assert!(ok, "{t:?}: {seen:?}");
    }
    // Everything of those connections is released (asynchronously: wait).
    let t0 = Instant::now();
    loop {
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        if now.0 <= fds && now.1 <= threads {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{t:?}: fds {fds} -> {}, threads {threads} -> {}",
            now.0,
            now.1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every transport this run can use: the rdma ones too inside the VM
/// (with a device), which the tests' names (`rdma_`) select there.
fn transports() -> Vec<Transport> {
    let mut transports = vec![Transport::Tcp, Transport::ShmH2, Transport::ShmFast];
    if cfg!(feature = "verbs") && Transport::rdma_device().is_some() {
        eprintln!("rrpc-test-on-verbs");
        transports.extend([Transport::RdmaH2, Transport::RdmaFast]);
    }
    transports
}

/// Named for the verbs suite's filter (`rdma_`): inside the VM it runs the
/// rdma transports too.
#[test]
fn rdma_and_local_transports_survive_a_killed_server() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = rrpc_integration_tests::runtime();
    for t in transports() {
        rt.block_on(server_killed_mid_call(t));
    }
}

/// The two tests of this binary count or spawn processes: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A server that stops (SIGSTOP: its rings are never drained again, its
/// sockets stay open) under calls with a deadline: each call fails at its
/// deadline, as tonic's channel fails it, instead of waiting for ring space
/// the stopped server will never free; after SIGCONT the channel works.
async fn server_stopped_mid_call(t: Transport) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let (server, uri) = spawn(t);
    let pid = Pid::from_raw(server.0.id() as i32);
    let ch = RrpcChannel::connect(&uri, config(t))
        .await
        .expect("connect");
    let c = TestClient::new(ch.clone());
    c.clone()
        .unary(Input::default())
        .await
        .unwrap_or_else(|e| panic!("{t:?}: a first call: {e:?}"));
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    // The stop reaches each thread on its own: wait until all are stopped.
    let stopped = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|st| {
                        st.rsplit_once(") ")
                            .is_some_and(|(_, rest)| rest.starts_with('T'))
                    })
                })
            })
            .unwrap_or(false)
    };
    let t_stop = Instant::now();
    while !stopped(server.0.id()) {
        assert!(
            t_stop.elapsed() < Duration::from_secs(10),
            "{t:?}: the server did not stop"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // More than the largest ring (4 MiB) in calls that each fit their
    // flow-control window (256 KiB), so some wait for ring space; fewer
    // than 20, hyper's limit of streams reset before its server accepted
    // them (more get the connection closed with GOAWAY `too_many_resets`,
    // over TCP as over the rings).
    let deadline = Duration::from_secs(1);
    let t0 = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    // On the fast path each task calls again after its call expired (the
    // expired calls' bytes stay in the ring), so later calls surely wait
    // for ring space; HTTP/2 would count those as resets (see above).
    let rounds = if t.is_http2() { 1 } else { 3 };
    for i in 0..18u8 {
        let mut c = c.clone();
        calls.spawn(async move {
            let mut last = None;
            for _ in 0..rounds {
                let mut req = tonic::Request::new(Input {
                    payload: vec![i; 16 << 10],
                    ..Input::default()
                });
                req.set_timeout(deadline);
                let t0 = Instant::now();
                let r = c.unary(req).await;
                last = Some((r, t0.elapsed()));
                if last.as_ref().is_some_and(|(r, _)| r.is_ok()) {
                    break;
                }
            }
            last.expect("at least one round")
        });
    }
    let bound = deadline
        + if t.is_rdma() {
            Duration::from_secs(20)
        } else {
            Duration::from_secs(5)
        };
    while let Some(r) = tokio::time::timeout(bound, calls.join_next())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{t:?}: a call with a 1 s deadline hung {:?} on a stopped server",
                t0.elapsed()
            )
        })
    {
        let (r, took) = r.expect("call task");
        let Err(st) = r else {
            panic!("{t:?}: a call was answered by a stopped server (after {took:?})")
        };
        assert!(
            took < bound,
            "{t:?}: a call with a 1 s deadline took {took:?} on a stopped server"
        );
        // Past its deadline: `DeadlineExceeded` on rings, tonic's `Cancelled` "Timeout
        // expired" over TCP; either is accepted here.
        assert!(
            matches!(st.code(), Code::Cancelled | Code::DeadlineExceeded),
            "{t:?}: {st:?}"
        );
    }
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let mut c = c;
    let after = tokio::time::timeout(bound, c.unary(Input::default()))
        .await
        .unwrap_or_else(|_| panic!("{t:?}: a call after SIGCONT hung"));
    after.unwrap_or_else(|e| panic!("{t:?}: a call after SIGCONT: {e:?}"));
    drop(server);
}

/// Named for the verbs suite's filter (`rdma_`).
#[test]
fn rdma_and_local_transports_bound_calls_to_a_stopped_server() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = rrpc_integration_tests::runtime();
    for t in transports() {
        rt.block_on(server_stopped_mid_call(t));
    }
}
