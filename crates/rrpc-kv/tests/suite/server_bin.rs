//! `rrpc-kv-server` as a separate process: the YCSB driver against it over
//! gRPC on TCP and `shm://` and over RF-RPC at once (one store behind all),
//! tonic and rrpc clients on one `rrpc://` port, acknowledged writes of
//! the persistent engine surviving a kill -9 of the server, and bad flags
//! refused with a clear message.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rrpc_kv::grpc::GrpcKv;
use rrpc_kv::{Op, OpResult};
use rrpc_tonic::{RrpcChannel, RrpcConfig};

const SERVER: &str = env!("CARGO_BIN_EXE_rrpc-kv-server");
const BENCH: &str = env!("CARGO_BIN_EXE_rrpc-kv-bench");

/// A running server; killed (SIGKILL) on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the server and waits for its `listening on` lines.
fn start(args: &[&str], listens: usize) -> Running {
    let mut child = Command::new(SERVER)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start rrpc-kv-server");
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    for _ in 0..listens {
        let l = lines
            .next()
            .expect("the server prints where it listens")
            .unwrap();
        assert!(l.starts_with("listening on "), "{l}");
    }
    Running(child)
}

fn dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("rrpc-kv-server-{tag}-"))
        .tempdir()
        .unwrap()
}

fn bench(target: &str, workload: &str) -> String {
    let out = Command::new(BENCH)
        .args([
            "--workload",
            workload,
            "--records",
            "500",
            "--ops",
            "2000",
            "--clients",
            "2",
            "--no-progress",
            "--target",
            target,
        ])
        .output()
        .expect("run the bench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{target} workload {workload}: {text}");
    text
}

#[test]
fn ycsb_over_grpc_and_rfrpc_against_one_server_process() {
    let d = dir("ycsb");
    let port = free_port();
    let tcp = format!("http://127.0.0.1:{port}");
    let shm = format!("shm://{}/kv.sock", d.path().display());
    let _server = start(
        &[
            "--listen",
            &tcp,
            "--listen",
            &shm,
            "--partitions",
            "2",
            "--memory-mib",
            "64",
        ],
        2,
    );
    for w in ["a", "e"] {
        let t = bench(&format!("grpc+tcp://127.0.0.1:{port}"), w);
        assert!(t.contains("READ") || t.contains("SCAN"), "{t}");
        bench(&format!("grpc+shm://{}/kv.sock", d.path().display()), w);
    }
}

async fn client(uri: &str) -> GrpcKv<RrpcChannel> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match GrpcKv::<RrpcChannel>::connect(uri, RrpcConfig::default()).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("connect {uri}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_engine_keeps_acknowledged_puts_across_kill9() {
    let d = dir("persist");
    let data = d.path().join("data");
    let shm = format!("shm://{}/kv.sock", d.path().display());
    let args = [
        "--listen",
        shm.as_str(),
        "--engine",
        "persistent",
        "--data-dir",
        data.to_str().unwrap(),
        "--partitions",
        "2",
    ];
    let mut server = start(&args, 1);
    let kv = client(&shm).await;
    let n = 200u32;
    for i in 0..n {
        let r = kv
            .execute(Op::Put {
                key: Bytes::from(format!("k{i:04}")),
                value: Bytes::from(format!("v{i}")),
            })
            .await
            .unwrap();
        assert_eq!(r, OpResult::Ok);
    }
    // SIGKILL: no drain, no destructor, no flush.
    server.0.kill().unwrap();
    let status = server.0.wait().unwrap();
    assert!(!status.success());
    drop(kv);
    let _ = std::fs::remove_file(d.path().join("kv.sock"));

    let _server = start(&args, 1);
    let kv = client(&shm).await;
    for i in 0..n {
        let r = kv
            .execute(Op::Get {
                key: Bytes::from(format!("k{i:04}")),
            })
            .await
            .unwrap();
        assert_eq!(r, OpResult::Value(Bytes::from(format!("v{i}"))), "key {i}");
    }
    let r = kv
        .execute(Op::Scan {
            start: Bytes::from_static(b"k0100"),
            count: 3,
        })
        .await
        .unwrap();
    let OpResult::Entries(e) = r else {
        panic!("scan: {r:?}")
    };
    let keys: Vec<&[u8]> = e.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(keys, [&b"k0100"[..], b"k0101", b"k0102"]);
}

/// One port (`rrpc://`): the kv gRPC face serves a plain tonic client and
/// an rrpc client (on shm, the same host) on the same address, over one
/// store, with RF-RPC on its own listener beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_face_serves_tonic_and_rrpc_clients_on_one_port() {
    let d = dir("port");
    let port = free_port();
    let uri = format!("rrpc://127.0.0.1:{port}");
    let rf = format!("shm://{}/rf.sock", d.path().display());
    let _server = start(&["--listen", &uri, "--rfrpc", &rf, "--memory-mib", "64"], 2);
    let ch = RrpcChannel::connect(&uri, RrpcConfig::default())
        .await
        .expect("rrpc connects to the port");
    assert_eq!(ch.carrier(), rrpc_tonic::Carrier::Shm, "the same host: shm");
    let rrpc = GrpcKv::new(ch);
    let plain = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("tonic connects to the port");
    let tonic = GrpcKv::new(plain);
    let put = |k: &str, v: &str| Op::Put {
        key: Bytes::from(k.to_string()),
        value: Bytes::from(v.to_string()),
    };
    let get = |k: &str| Op::Get {
        key: Bytes::from(k.to_string()),
    };
    assert_eq!(
        rrpc.execute(put("a", "from rrpc")).await.unwrap(),
        OpResult::Ok
    );
    assert_eq!(
        tonic.execute(put("b", "from tonic")).await.unwrap(),
        OpResult::Ok
    );
    // One store behind both.
    assert_eq!(
        tonic.execute(get("a")).await.unwrap(),
        OpResult::Value(Bytes::from_static(b"from rrpc"))
    );
    assert_eq!(
        rrpc.execute(get("b")).await.unwrap(),
        OpResult::Value(Bytes::from_static(b"from tonic"))
    );
}

#[test]
fn bad_flags_get_a_clear_error() {
    for (args, want) in [
        (
            vec!["--listen", "shm:///tmp/x.sock", "--engine", "persistent"],
            "needs --data-dir",
        ),
        (
            vec!["--listen", "shm:///tmp/x.sock", "--engine", "disk"],
            "invalid value",
        ),
        (
            vec!["--listen", "shm:///tmp/x.sock", "--partitions", "0"],
            "partition",
        ),
        (vec!["--listen", "bogus://x"], "bogus"),
        (
            vec!["--listen", "shm:///tmp/x.sock", "--rfrpc", "tcp://x"],
            "bad --rfrpc endpoint",
        ),
    ] {
        let out = Command::new(SERVER)
            .args(&args)
            .output()
            .expect("run the server");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
