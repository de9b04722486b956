//! Limits on established connections (`RrpcConfig::max_connections`,
//! `max_connections_per_peer`): one peer opening connections in a loop is
//! refused past its limit, with `ResourceExhausted` naming the limit and
//! never a hang, while another peer still connects and calls; the total
//! bounds all peers together; a connection that closes gives its place
//! back.
//!
//! A peer is a process on shm (`SO_PEERCRED`), a host on `rdma://` and TCP:
//! the second peer of the shm tests is a child process (this binary,
//! re-run as `conn_limits::child_peer`). On `rdma://` and TCP every client
//! of a test is 127.0.0.1, one peer, so those variants show the flood
//! refused and the place given back. The `rdma_*` variants run inside
//! `cargo xtask rxe` (`RRPC_TEST_DEVICE`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, config};
use rrpc_tonic::{RrpcChannel, RrpcConfig, RrpcContext, RrpcEndpoint};
use tonic::{Code, Status};

/// The child's environment variable: `<transport> <uri>`.
const CHILD: &str = "RRPC_CONN_LIMITS_CHILD";
/// How the child's answers start (libtest prints lines of its own).
const REPLY: &str = "reply: ";
/// A generous bound on any one connect and call, refused or not: a
/// refusal must come, never a hang.
const LIVENESS: Duration = Duration::from_secs(20);

fn limited(t: Transport, per_peer: usize, total: usize) -> RrpcConfig {
    config(t)
        .to_builder()
        .max_connections(total)
        .max_connections_per_peer(per_peer)
        .build()
        .expect("limits")
}

/// Connects with a context of its own (no pooled, shared or spare
/// connection from another client) and makes a call.
async fn open(uri: &str, t: Transport) -> Result<TestClient<RrpcChannel>, Status> {
    let attempt = async {
        let cfg = config(t);
        let ch = RrpcEndpoint::new(uri)
            .map_err(|e| e.status())?
            .config(cfg.clone())
            .context(RrpcContext::new(&cfg))
            .connect()
            .await
            .map_err(|e| e.status())?;
        let mut c = TestClient::new(ch);
        c.unary(Input::default()).await?;
        Ok(c)
    };
    match tokio::time::timeout(LIVENESS, attempt).await {
        Ok(r) => r,
        Err(_) => panic!("a connect to {uri} neither succeeded nor was refused in {LIVENESS:?}"),
    }
}

/// `r` is a refusal by the limit named `limit`.
fn assert_refused<T>(r: Result<T, Status>, limit: &str) {
    let Err(s) = r else {
        panic!("connected past {limit}")
    };
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("connection limit"), "{s:?}");
    assert!(
        s.message().contains(&format!("its {limit}")),
        "names {limit}: {s:?}"
    );
}

/// Another peer: this test binary re-run as [`child_peer`], a process of
/// its own, opening and closing connections when told.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn(t: Transport, uri: &str) -> Peer {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--ignored",
                "--exact",
                "conn_limits::child_peer",
                "--nocapture",
            ])
            .env(CHILD, format!("{} {uri}", t.name()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the child peer");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Peer { child, stdin, out }
    }

    /// Sends `cmd` and reads the child's answer (blocking this worker: the
    /// server runs on a runtime of its own).
    fn ask(&mut self, cmd: &str) -> String {
        tokio::task::block_in_place(|| {
            writeln!(self.stdin, "{cmd}").expect("to the child");
            let mut line = String::new();
            loop {
                line.clear();
                let n = self.out.read_line(&mut line).expect("from the child");
                assert!(n > 0, "the child peer ended before answering {cmd:?}");
                if let Some(r) = line.trim_end().strip_prefix(REPLY) {
                    return r.to_string();
                }
            }
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child peer: `open` connects and calls (answering `ok`, or the
/// status `<code> <message>`), `close` drops its oldest connection.
#[test]
#[ignore = "run by the conn_limits tests as a second peer"]
fn child_peer() {
    let Ok(arg) = std::env::var(CHILD) else {
        return;
    };
    let (name, uri) = arg.split_once(' ').expect("<transport> <uri>");
    let t = Transport::from_name(name).expect("a transport");
    let rt = rrpc_integration_tests::runtime();
    let mut held = Vec::new();
    let stdin = std::io::stdin();
    for cmd in stdin.lock().lines() {
        let answer = match cmd.expect("a command").as_str() {
            "open" => match rt.block_on(open(uri, t)) {
                Ok(c) => {
                    held.push(c);
                    "ok".to_string()
                }
                Err(s) => format!("{:?} {}", s.code(), s.message()),
            },
            "close" => {
                if !held.is_empty() {
                    drop(held.remove(0));
                }
                "closed".to_string()
            }
            other => format!("unknown command {other}"),
        };
        println!("{REPLY}{answer}");
    }
}

/// Per peer 4, total 6. This process floods: 4 connections, then every
/// further one refused (`max_connections_per_peer`), 20 times over. The
/// child, an honest peer, still connects and calls, until the total is
/// full: its third is refused by `max_connections`. A connection the
/// child closes gives its place back to it; the flooder stays refused.
async fn a_flooding_peer_cannot_starve_another(t: Transport) {
    let h = Harness::start_with(t, limited(t, 4, 6)).await;
    let mut flood = Vec::new();
    for _ in 0..4 {
        flood.push(open(&h.uri, t).await.expect("within the peer's limit"));
    }
    for _ in 0..20 {
        assert_refused(open(&h.uri, t).await, "max_connections_per_peer");
    }
    let mut honest = Peer::spawn(t, &h.uri);
    assert_eq!(
        honest.ask("open"),
        "ok",
        "an honest peer connects and calls"
    );
    assert_eq!(honest.ask("open"), "ok");
    let third = honest.ask("open");
    assert!(
        third.starts_with("ResourceExhausted ")
            && third
                .contains("connection limit: the server holds 6 connections, its max_connections"),
        "the total is full: {third}"
    );
    assert_eq!(honest.ask("close"), "closed");
    let again = tokio::time::timeout(LIVENESS, async {
        loop {
            let r = honest.ask("open");
            if r == "ok" {
                return;
            }
            // The server sees the close a moment later.
            assert!(r.starts_with("ResourceExhausted"), "{r}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    again
        .await
        .expect("the place the child gave back is the child's again");
    assert_refused(open(&h.uri, t).await, "max_connections_per_peer");
    // Everyone's calls on their open connections still run.
    for c in &mut flood {
        c.unary(Input::default()).await.expect("a held connection");
    }
}

/// Per peer 2 (= total): the third connection is refused; once one of the
/// two closes, a new one is accepted (after the server sees the close;
/// retried within the liveness bound), and the limit holds again.
async fn a_closed_connection_gives_its_place_back(t: Transport) {
    let h = Harness::start_with(t, limited(t, 2, 2)).await;
    let first = open(&h.uri, t).await.expect("first");
    let _second = open(&h.uri, t).await.expect("second");
    assert_refused(open(&h.uri, t).await, "max_connections_per_peer");
    drop(first);
    let third = tokio::time::timeout(LIVENESS, async {
        loop {
            match open(&h.uri, t).await {
                Ok(c) => return c,
                Err(s) => assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a closed connection's place is given back");
    let mut third = third;
    third.unary(Input::default()).await.expect("a call");
    assert_refused(open(&h.uri, t).await, "max_connections_per_peer");
}

/// The total: per peer 8 (= total), one peer holds all 8; everyone else
/// is refused by `max_connections`, here the child process.
async fn a_full_server_refuses_every_peer(t: Transport) {
    let h = Harness::start_with(t, limited(t, 8, 8)).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(open(&h.uri, t).await.expect("within the limits"));
    }
    let mut other = Peer::spawn(t, &h.uri);
    let r = other.ask("open");
    assert!(
        r.starts_with("ResourceExhausted ")
            && r.contains("connection limit: the server holds 8 connections, its max_connections"),
        "{r}"
    );
    drop(held);
}

/// A plain HTTP/2 client (tonic's own `Channel`) of an `rrpc://` port past
/// the limit gets `ResourceExhausted` naming it for its call, not a hang
/// or a bare reset; a second refused client likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http2_client_of_a_port_is_refused_with_the_reason() {
    let t = Transport::PortTcp;
    let h = Harness::start_with(t, limited(t, 1, 1)).await;
    let addr = h.uri.strip_prefix("rrpc://").expect("rrpc://");
    let plain = || async move {
        let attempt = async {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            let mut c = TestClient::new(ch);
            c.unary(Input::default()).await?;
            Ok::<_, Status>(c)
        };
        tokio::time::timeout(LIVENESS, attempt)
            .await
            .expect("answered or refused, not hung")
    };
    let _held = plain().await.expect("within the limit");
    assert_refused(plain().await, "max_connections_per_peer");
    assert_refused(plain().await, "max_connections_per_peer");
}

mod two_processes {
    use super::*;

    rrpc_integration_tests::on_shm!(
        a_flooding_peer_cannot_starve_another,
        a_full_server_refuses_every_peer
    );

    /// On an `rrpc://` port the shm leg identifies processes too.
    mod port_shm {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_flooding_peer_cannot_starve_another() {
            super::a_flooding_peer_cannot_starve_another(rrpc_integration_tests::Transport::PortShm)
                .await
        }
    }
}

mod release {
    use super::*;

    rrpc_integration_tests::on_shm!(a_closed_connection_gives_its_place_back);
    rrpc_integration_tests::on_rdma!(a_closed_connection_gives_its_place_back);
    rrpc_integration_tests::on_port!(a_closed_connection_gives_its_place_back);
}
