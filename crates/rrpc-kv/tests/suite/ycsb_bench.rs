//! `rrpc-kv-bench` end to end: every workload against the gRPC face over
//! TCP and `shm://` (a map-backed `Execute` served in this process), against
//! Redis when `redis-server` is installed, and bad input refused with a
//! clear message and no panic.

use std::process::Output;
use std::time::Duration;

use rrpc_kv::grpc::KvService;
use rrpc_tonic::RrpcConfig;

use crate::common;
use common::MapStore;

const BENCH: &str = env!("CARGO_BIN_EXE_rrpc-kv-bench");

async fn bench(args: &[&str]) -> Output {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(BENCH)
            .args(args)
            .arg("--no-progress")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the bench ends")
    .expect("the bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Serves a fresh map at `uri` (rrpc-tonic: `http://`, `shm://`) on this
/// runtime; the task is aborted by the caller.
fn serve(uri: &str) -> tokio::task::JoinHandle<()> {
    let uri = uri.to_string();
    tokio::spawn(async move {
        let _ = rrpc_tonic::Server::builder()
            .add_service(KvService::new(MapStore::default()).into_server())
            .serve_rrpc(&uri, RrpcConfig::default())
            .await;
    })
}

async fn every_workload(target: &str, csv: &std::path::Path) {
    for w in ["a", "b", "c", "d", "e", "f"] {
        let o = bench(&[
            "--workload",
            w,
            "--records",
            "300",
            "--ops",
            "600",
            "--value-size",
            "64",
            "--clients",
            "3",
            "--target",
            target,
            "--csv",
            csv.to_str().unwrap(),
        ])
        .await;
        let t = text(&o);
        assert!(o.status.success(), "workload {w}: {t}");
        assert!(t.contains("run phase"), "{t}");
        let want = match w {
            "e" => "SCAN",
            "f" => "RMW",
            _ => "READ",
        };
        assert!(t.contains(want), "workload {w}: {t}");
        assert!(!t.contains("operations failed"), "workload {w}: {t}");
    }
    let csv = std::fs::read_to_string(csv).unwrap();
    assert!(csv.starts_with("workload,target,clients"));
    // Per workload: load INSERT + TOTAL, run rows + TOTAL.
    assert!(
        csv.lines()
            .filter(|l| l.contains(",run,TOTAL,600,0,"))
            .count()
            == 6,
        "{csv}"
    );
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tcp_every_workload() {
    let port = free_port();
    let server = serve(&format!("http://127.0.0.1:{port}"));
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    every_workload(
        &format!("grpc+tcp://127.0.0.1:{port}"),
        &dir.path().join("r.csv"),
    )
    .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_shm_every_workload() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kv.sock");
    let server = serve(&format!("shm://{}", sock.display()));
    for _ in 0..200 {
        if sock.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    every_workload(
        &format!("grpc+shm://{}", sock.display()),
        &dir.path().join("r.csv"),
    )
    .await;
    server.abort();
}

/// Redis, when `redis-server` is installed (skipped, saying so, otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_every_workload() {
    let port = free_port();
    let Ok(mut redis) = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
    else {
        eprintln!("skipped: redis-server not installed");
        return;
    };
    let mut up = false;
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(up, "redis-server did not come up");
    let dir = tempfile::tempdir().unwrap();
    every_workload(
        &format!("redis://127.0.0.1:{port}"),
        &dir.path().join("r.csv"),
    )
    .await;
    let _ = redis.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error() {
    let port = free_port();
    for (args, code, needle) in [
        (
            vec!["--workload", "g", "--target", "redis://x"],
            2,
            "unknown workload",
        ),
        (
            vec!["--distribution", "pareto", "--target", "redis://x"],
            2,
            "unknown distribution",
        ),
        (
            vec!["--clients", "0", "--target", "redis://x"],
            2,
            "clients",
        ),
        (vec!["--target", "foo://x"], 1, "unknown target scheme"),
        (vec!["--target", "nothing"], 1, "no scheme"),
        (
            vec!["--target", "redis://127.0.0.1:1"],
            1,
            "cannot connect to Redis",
        ),
        (
            vec!["--value-size", "2000000", "--target", "redis://127.0.0.1:1"],
            1,
            "value size",
        ),
    ] {
        let o = bench(&args).await;
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
    let tcp = format!("grpc+tcp://127.0.0.1:{port}");
    let o = bench(&["--target", &tcp, "--connect-timeout", "5"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("cannot connect"), "{}", text(&o));
    let o = bench(&["--target", "grpc+shm:///nonexistent/kv.sock"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("cannot connect"), "{}", text(&o));
}

/// RF-RPC straight to the store: every workload with batching and a
/// pipeline of two buffer pairs per client in server-reply mode, and
/// unbatched in remote-fetch mode (the counters show each mode was used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfrpc_batched_pipelined_and_plain_every_workload() {
    let dir = tempfile::tempdir().unwrap();
    let ep = rrpc_core::FabricAddr::Shm(dir.path().join("rf.sock"));
    let server = rrpc_kv::rfrpc::RfServer::builder()
        .serve_execute(
            &ep,
            &rrpc_core::Fabric::shm(),
            std::sync::Arc::new(MapStore::default()),
        )
        .unwrap();
    let target = format!("rfrpc+shm://{}", dir.path().join("rf.sock").display());
    for (extra, csv) in [
        (
            &[
                "--batch",
                "8",
                "--pipeline",
                "2",
                "--rf-mode",
                "server-reply",
            ][..],
            "b.csv",
        ),
        (&["--rf-mode", "remote-fetch"][..], "p.csv"),
    ] {
        let before = (server.served(), server.served_server_reply());
        for w in ["a", "e", "f"] {
            let mut args = vec![
                "--workload",
                w,
                "--records",
                "300",
                "--ops",
                "600",
                "--value-size",
                "64",
                "--clients",
                "2",
                "--target",
                &target,
            ];
            let csv = dir.path().join(csv);
            let csv = csv.to_str().unwrap().to_string();
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--csv", &csv]);
            let o = bench(&args).await;
            let t = text(&o);
            assert!(o.status.success(), "{extra:?} workload {w}: {t}");
            assert!(
                !t.contains("operations failed"),
                "{extra:?} workload {w}: {t}"
            );
        }
        let calls = server.served() - before.0;
        let sr = server.served_server_reply() - before.1;
        if extra.contains(&"--batch") {
            // 2 x (300 loads + 600 ops) x 3 workloads in batches of up to 8.
            assert!(calls < 1_500, "{calls} calls: not batched");
            assert_eq!(sr, calls, "server-reply mode");
        } else {
            assert!(calls >= 3 * 900, "{calls} calls");
            assert_eq!(sr, 0, "remote-fetch mode");
        }
    }
    let o = bench(&["--target", "grpc+tcp://127.0.0.1:1", "--batch", "4"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("rfrpc+ targets only"), "{}", text(&o));
}
