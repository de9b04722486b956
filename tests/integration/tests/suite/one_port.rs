//! `rrpc://`: one TCP port for every client (issue #33). An rrpc client on
//! the same host gets shm, one that forbids shm gets verbs when both ends
//! have a device (module `rdma_verbs`: feature `verbs` and
//! `RRPC_TEST_DEVICE`, i.e. inside `cargo xtask rxe`), else HTTP/2 on the
//! TCP connection it negotiated on; plain tonic `Channel`s on `http://`,
//! grpcio and grpc-go are served as by `http://` itself, all at once;
//! garbage and malformed hellos are refused and closed while the server
//! keeps serving, and disturb no client calling on the port meanwhile.

use std::time::{Duration, Instant};

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::pb::test_client::TestClient;
use rrpc_integration_tests::{Harness, Transport, config, payload};
use rrpc_tonic::{Carrier, ChannelPath, Error, Fabric, RrpcConfig, RrpcEndpoint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The harness's config (fast path), with a short handshake timeout.
fn cfg() -> RrpcConfig {
    config(Transport::ShmFast)
        .to_builder()
        .handshake_timeout(Duration::from_millis(500))
        .build()
        .expect("timeout")
}

async fn start(server: RrpcConfig) -> Harness {
    let h = Harness::start_at(Transport::Tcp, "rrpc://127.0.0.1:0", server, |s| s).await;
    assert!(h.uri.starts_with("rrpc://127.0.0.1:"), "{}", h.uri);
    assert!(!h.uri.ends_with(":0"), "the port the OS chose: {}", h.uri);
    h
}

fn addr(h: &Harness) -> String {
    h.uri.trim_start_matches("rrpc://").to_string()
}

/// An rrpc endpoint on the harness's port with `cfg`, connected.
async fn dial(h: &Harness, cfg: RrpcConfig) -> Result<rrpc_tonic::RrpcChannel, Error> {
    RrpcEndpoint::new(&h.uri)
        .expect("uri")
        .config(cfg)
        .connect()
        .await
}

/// A plain tonic channel on `http://` to the port.
async fn plain(h: &Harness) -> TestClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", addr(h)))
        .expect("uri")
        .connect()
        .await
        .expect("tonic connects to the rrpc:// port");
    TestClient::new(ch)
}

/// A unary echo of `n` bytes on any generated client.
macro_rules! unary {
    ($c:expr, $n:expr) => {{
        let n: usize = $n;
        let r = $c
            .unary(Input {
                payload: payload(n),
                ..Default::default()
            })
            .await
            .expect("unary")
            .into_inner();
        assert_eq!(r.payload, payload(n));
    }};
}

/// All four RPC kinds, checked, on `c`.
async fn every_rpc_kind(c: &mut TestClient<rrpc_tonic::RrpcChannel>) {
    unary!(c, 100);

    let mut st = c
        .server_stream(Input {
            payload: payload(10),
            count: 25,
            ..Default::default()
        })
        .await
        .expect("server stream")
        .into_inner();
    let mut n = 0;
    while let Some(m) = st.message().await.expect("message") {
        assert_eq!(m.total, n);
        n += 1;
    }
    assert_eq!(n, 25);

    let inputs: Vec<Input> = (0..30)
        .map(|i| Input {
            payload: payload(i),
            ..Default::default()
        })
        .collect();
    let r = c
        .client_stream(tokio_stream::iter(inputs))
        .await
        .expect("client stream")
        .into_inner();
    assert_eq!(r.total, (0..30u64).sum::<u64>());

    let (tx, rx) = tokio::sync::mpsc::channel::<Input>(4);
    let mut out = c
        .bidi(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("bidi")
        .into_inner();
    for i in 0..10usize {
        tx.send(Input {
            payload: payload(i),
            ..Default::default()
        })
        .await
        .expect("send");
        let m = out.message().await.expect("reply").expect("a reply");
        assert_eq!(m.payload, payload(i));
    }
    drop(tx);
    assert!(out.message().await.expect("end").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rrpc_client_gets_shm_while_plain_grpc_shares_the_port() {
    let h = start(cfg()).await;
    let ch = dial(&h, cfg()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Shm, "same host: shm");
    assert_eq!(ch.path(), ChannelPath::Fast);
    let mut rrpc = TestClient::new(ch.clone());
    let mut grpc = plain(&h).await;
    // At the same time, on both.
    for round in 0..20 {
        tokio::join!(async { unary!(rrpc, 10 + round) }, async {
            unary!(grpc, 20 + round)
        });
    }
    assert_eq!(ch.carrier(), Carrier::Shm);
    assert_eq!(
        h.obs.unary_calls.load(std::sync::atomic::Ordering::Relaxed),
        40
    );
}

/// Every RPC kind on shm through the port, on both call paths (the
/// server's path preference left to the client's), the carrier read from
/// the live connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_kind_on_shm_through_the_port_on_both_paths() {
    let h = start(cfg()).await;
    for (path, want) in [
        (rrpc_tonic::PathPreference::Fast, ChannelPath::Fast),
        (rrpc_tonic::PathPreference::Http2, ChannelPath::Http2),
    ] {
        let ch = dial(&h, cfg().to_builder().path(path).build().unwrap())
            .await
            .expect("connect");
        assert_eq!(ch.carrier(), Carrier::Shm);
        assert_eq!(ch.path(), want);
        every_rpc_kind(&mut TestClient::new(ch.clone())).await;
        assert_eq!(ch.carrier(), Carrier::Shm);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_forbids_shm_gets_tcp_for_every_rpc_kind() {
    let h = start(cfg()).await;
    let tcp_only = cfg()
        .to_builder()
        .fabrics([Fabric::Tcp])
        .build()
        .expect("fabrics");
    let ch = dial(&h, tcp_only.clone()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Tcp);
    assert_eq!(ch.path(), ChannelPath::Tcp);
    let mut c = TestClient::new(ch);
    every_rpc_kind(&mut c).await;

    // A lazy channel that allows TCP takes it too.
    let lazy = RrpcEndpoint::new(&h.uri)
        .expect("uri")
        .config(cfg())
        .connect_lazy()
        .expect("lazy");
    assert_eq!(lazy.carrier(), Carrier::Tcp);
    unary!(TestClient::new(lazy), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_fabric_the_server_forbids_is_a_clear_error() {
    let h = start(
        cfg()
            .to_builder()
            .fabrics([Fabric::Tcp])
            .build()
            .expect("fabrics"),
    )
    .await;
    // A default client gets TCP from a server without shm.
    let ch = dial(&h, cfg()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Tcp);
    unary!(TestClient::new(ch), 3);
    // One that requires shm is told why not.
    let e = dial(
        &h,
        cfg()
            .to_builder()
            .fabrics([Fabric::Shm])
            .build()
            .expect("fabrics"),
    )
    .await
    .expect_err("shm required, server has none");
    let Error::NoFabric { reason, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        reason.contains("the client allows [shm], the server allows [tcp]"),
        "{reason}"
    );
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::FailedPrecondition
    );
    assert!(
        RrpcConfig::builder().fabrics([]).build().is_err(),
        "an empty set"
    );
    // A server that requires shm closes plain HTTP/2 clients.
    let h = start(
        cfg()
            .to_builder()
            .fabrics([Fabric::Shm])
            .build()
            .expect("fabrics"),
    )
    .await;
    let ch = dial(&h, cfg()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Shm);
    let r = tonic::transport::Endpoint::from_shared(format!("http://{}", addr(&h)))
        .expect("uri")
        .connect()
        .await;
    if let Ok(ch) = r {
        let call = TestClient::new(ch).unary(Input::default()).await;
        assert!(call.is_err(), "served plain HTTP/2 on a shm-only port");
    }
}

/// Reads until the server closes; what it sent first.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("not closed within {limit:?} (sent {got:?})"),
        }
    }
}

fn header(version: u8, kind: u8, len: u16) -> Vec<u8> {
    let mut h = b"RRPN".to_vec();
    h.extend_from_slice(&[version, kind]);
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// A refusal reply (kind 2, code 255) carrying `says`.
fn assert_refusal(reply: &[u8], says: &str) {
    assert!(reply.len() > 9, "{reply:?}");
    assert_eq!(&reply[..6], b"RRPN\x01\x02", "{reply:?}");
    assert_eq!(reply[8], 255, "{reply:?}");
    let why = String::from_utf8_lossy(&reply[9..]);
    assert!(why.contains(says), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_bad_hellos_are_refused_and_the_port_keeps_serving() {
    let h = start(cfg()).await;
    let a = addr(&h);
    let limit = Duration::from_secs(3);
    let mut held = Vec::new();

    // Neither HTTP/2 nor rrpc: closed without a word.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert!(closed_within(&mut s, limit).await.is_empty());
    // A preface cut short and never finished: closed at the timeout.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    assert!(closed_within(&mut s, limit).await.is_empty());
    // Slowloris: nothing at all.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    assert!(closed_within(&mut s, limit).await.is_empty());

    // An oversized hello: refused from its header.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(&header(1, 1, 60_000)).await.expect("write");
    assert_refusal(&closed_within(&mut s, limit).await, "too large");
    // Another version.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(&header(9, 1, 2)).await.expect("write");
    s.write_all(&[1, 0]).await.expect("write");
    assert_refusal(&closed_within(&mut s, limit).await, "version 9");
    // A reply where a hello belongs.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(&header(1, 2, 1)).await.expect("write");
    s.write_all(&[0]).await.expect("write");
    assert_refusal(&closed_within(&mut s, limit).await, "kind");
    // A host id longer than the body.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(&header(1, 1, 3)).await.expect("write");
    s.write_all(&[3, 200, b'x']).await.expect("write");
    assert_refusal(&closed_within(&mut s, limit).await, "truncated");
    // A truncated hello: the header promises more than ever comes.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    s.write_all(&header(1, 1, 100)).await.expect("write");
    s.write_all(&[3, 10]).await.expect("write");
    let start = Instant::now();
    assert!(closed_within(&mut s, limit).await.is_empty());
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "at the timeout"
    );
    // A well-formed hello from "another host" that requires shm.
    let mut s = TcpStream::connect(&a).await.expect("connect");
    let mut hello = header(1, 1, 2 + 9);
    hello.extend_from_slice(&[2, 9]);
    hello.extend_from_slice(b"elsewhere");
    s.write_all(&hello).await.expect("write");
    assert_refusal(&closed_within(&mut s, limit).await, "another host");
    // Connections left open in the middle of a hello do not block others.
    for _ in 0..5 {
        let mut s = TcpStream::connect(&a).await.expect("connect");
        s.write_all(b"RRPN").await.expect("write");
        held.push(s);
    }

    // Still serving, plain and rrpc.
    let mut p = plain(&h).await;
    unary!(p, 5);
    let ch = dial(&h, cfg()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Shm);
    unary!(TestClient::new(ch), 6);
    drop(held);
}

/// Unary calls on `c` in a loop until `stop`, each checked; how many
/// completed so far in `done`.
async fn calls_until<C>(
    mut c: TestClient<C>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) where
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<tonic::codegen::StdError>,
    C::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <C::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    use std::sync::atomic::Ordering::Relaxed;
    let mut n = 0usize;
    while !stop.load(Relaxed) {
        unary!(c, 1 + n % 2000);
        n += 1;
        done.store(n, Relaxed);
    }
}

/// Hostile first bytes on the port (not the HTTP/2 preface, not `RRPN`)
/// and malformed rrpc hellos, all at once and in rounds, while `ring` (an
/// rrpc client on a ring fabric), an rrpc client on TCP and a plain tonic
/// client call in a loop on the same port: each hostile connection is
/// closed (a malformed hello with a refusal), and every call of the others
/// succeeds, during the attack as before and after it.
async fn hostile_hellos_beside(h: &Harness, ring: rrpc_tonic::RrpcChannel) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let a = addr(h);
    let tcp = dial(
        h,
        cfg()
            .to_builder()
            .fabrics([Fabric::Tcp])
            .build()
            .expect("fabrics"),
    )
    .await
    .expect("connect on tcp");
    assert_eq!(tcp.carrier(), Carrier::Tcp);
    let grpc = plain(h).await;
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let loops = [
        tokio::spawn(calls_until(
            TestClient::new(ring.clone()),
            stop.clone(),
            counts[0].clone(),
        )),
        tokio::spawn(calls_until(
            TestClient::new(tcp),
            stop.clone(),
            counts[1].clone(),
        )),
        tokio::spawn(calls_until(grpc, stop.clone(), counts[2].clone())),
    ];
    let now = || counts.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>();
    // Every client calls before the attack starts.
    let deadline = Instant::now() + Duration::from_secs(20);
    while now().contains(&0) {
        assert!(
            Instant::now() < deadline,
            "no calls before the attack: {:?}",
            now()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = now();
    let limit = Duration::from_secs(3);
    // (what it sends, the refusal it gets: `None` for closed without a word)
    let mut truncated = header(1, 1, 3);
    truncated.extend_from_slice(&[3, 200, b'x']);
    let mut bad_version = header(9, 1, 2);
    bad_version.extend_from_slice(&[1, 0]);
    let hostile: Vec<(Vec<u8>, Option<&str>)> = vec![
        // A TLS ClientHello's first bytes.
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
            None,
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), None),
        ((0u8..=255).rev().cycle().take(4096).collect(), None),
        // Half the magic, then nothing: closed at the handshake timeout.
        (b"RR".to_vec(), None),
        (truncated, Some("truncated")),
        (bad_version, Some("version 9")),
        (header(1, 1, 60_000), Some("too large")),
        (header(1, 2, 0), Some("kind")),
    ];
    for _round in 0..3 {
        let attacks = hostile.iter().map(|(bytes, says)| {
            let a = a.clone();
            async move {
                let mut s = TcpStream::connect(&a).await.expect("connect");
                s.write_all(bytes).await.expect("write");
                let reply = closed_within(&mut s, limit).await;
                match says {
                    None => assert!(reply.is_empty(), "{bytes:02x?}: {reply:?}"),
                    Some(says) => assert_refusal(&reply, says),
                }
            }
        });
        futures_util::future::join_all(attacks).await;
    }
    let during = now();
    assert!(
        before.iter().zip(&during).all(|(b, d)| d > b),
        "every client called during the attack: {before:?} then {during:?}"
    );
    stop.store(true, Relaxed);
    for l in loops {
        l.await
            .expect("every call of the well-behaved clients succeeded");
    }
    // And after it, on new connections too.
    let ch = dial(h, cfg()).await.expect("connect");
    unary!(TestClient::new(ch), 3);
    let mut p = plain(h).await;
    unary!(p, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_hellos_do_not_disturb_a_shm_client_and_plain_grpc_on_the_port() {
    let h = start(cfg()).await;
    let ch = dial(&h, cfg()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Shm);
    hostile_hellos_beside(&h, ch.clone()).await;
    assert_eq!(ch.carrier(), Carrier::Shm);
}

/// Whether a foreign gRPC client this machine lacks fails the test instead
/// of skipping it: `cargo xtask ci` sets `RRPC_REQUIRE_INTEROP=1` (unless
/// `--allow-skips`), as `.ci/setup` installs grpcio and Go, so a CI run
/// that could not call the port with them fails rather than passing having
/// run nothing.
pub(super) fn interop_required() -> bool {
    std::env::var_os("RRPC_REQUIRE_INTEROP").is_some_and(|v| v == "1")
}

/// A foreign client cannot run here: skipped, or a failure when
/// [`interop_required`].
pub(super) fn cannot_run(client: &str, why: &str) {
    assert!(
        !interop_required(),
        "{client} cannot run and RRPC_REQUIRE_INTEROP=1 (`cargo xtask ci`): {why} \
         (`.ci/setup` installs it)"
    );
    eprintln!("skipped: {client} cannot run: {why}");
}

/// The request of the foreign clients' unary call, `Input { payload:
/// payload(5) }` encoded by hand, and the echo they must get back,
/// `Output { payload, total: 5 }`.
fn hand_encoded_unary() -> (Vec<u8>, Vec<u8>) {
    let mut request = vec![0x0a, 5];
    request.extend(payload(5));
    let mut want = request.clone();
    want.extend([0x10, 5]);
    (request, want)
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs a foreign client (a blocking process) off the runtime; asserts it
/// printed `want` in hex and that the server counted its call.
async fn foreign_unary(h: &Harness, client: &str, mut cmd: std::process::Command, want: &[u8]) {
    use std::sync::atomic::Ordering::Relaxed;
    let before = h.obs.unary_calls.load(Relaxed);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{client}: {e}"));
    assert!(
        out.status.success(),
        "{client} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), hex(want));
    assert_eq!(h.obs.unary_calls.load(Relaxed), before + 1, "served once");
}

/// grpcio (Python's gRPC, C core) on the port, unchanged: a unary call with
/// the messages encoded by hand (no generated Python code). The Python is
/// `$RRPC_GRPCIO_PYTHON` (`cargo xtask ci` points it at the venv
/// `.ci/setup` makes), else `python3`; skipped when it cannot `import grpc`
/// (`python3 -m pip install grpcio`), failed then under
/// `RRPC_REQUIRE_INTEROP=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_calls_the_port_unchanged() {
    let python = std::env::var_os("RRPC_GRPCIO_PYTHON").unwrap_or_else(|| "python3".into());
    let shown = python.to_string_lossy().into_owned();
    match std::process::Command::new(&python)
        .args(["-c", "import grpc"])
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or_default();
            return cannot_run("grpcio", &format!("`{shown} -c 'import grpc'`: {last}"));
        }
        Err(e) => return cannot_run("grpcio", &format!("{shown}: {e}")),
    }
    let h = start(cfg()).await;
    let (request, want) = hand_encoded_unary();
    let script = r#"
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1], options=[("grpc.enable_http_proxy", 0)])
call = ch.unary_unary("/test.Test/Unary")
print(call(bytes.fromhex(sys.argv[2]), timeout=20).hex())
"#;
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-c", script, &addr(&h), &hex(&request)]);
    foreign_unary(&h, "grpcio", cmd, &want).await;
}

/// `tests/grpc-go` (grpc-go's `ClientConn.Invoke` and `NewStream`, a codec
/// that passes hand-encoded bytes through; TLS credentials with `-ca`),
/// built with `go build` into the tests' scratch directory (`.ci/setup`
/// fetched its modules and warmed Go's build cache, so that is a link).
/// `None` when `go` is not on `PATH` or the build fails: [`cannot_run`]
/// has then skipped, or failed under `RRPC_REQUIRE_INTEROP=1`.
pub(super) async fn grpc_go_binary() -> Option<std::path::PathBuf> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../grpc-go");
    // One output per process: two tests building at once do not write the
    // same file.
    let bin = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "grpc-go-unary-{}-{}",
        std::process::id(),
        GO_BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let built = tokio::task::spawn_blocking({
        let bin = bin.clone();
        move || {
            std::process::Command::new("go")
                .arg("build")
                .arg("-o")
                .arg(&bin)
                .arg(".")
                .current_dir(&src)
                // Go's own toolchain, never one fetched for go.mod's `go` line.
                .env("GOTOOLCHAIN", "local")
                .output()
        }
    })
    .await
    .expect("join");
    match built {
        Ok(o) if o.status.success() => Some(bin),
        Ok(o) => {
            let why = format!(
                "`go build` in tests/grpc-go failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            cannot_run("grpc-go", &why);
            None
        }
        Err(e) => {
            cannot_run("grpc-go", &format!("go: {e}"));
            None
        }
    }
}

/// How many grpc-go binaries this process built ([`grpc_go_binary`]).
static GO_BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// grpc-go on the port, unchanged (plaintext; [`grpc_go_binary`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_go_calls_the_port_unchanged() {
    let Some(bin) = grpc_go_binary().await else {
        return;
    };
    let h = start(cfg()).await;
    let (request, want) = hand_encoded_unary();
    let mut cmd = std::process::Command::new(&bin);
    cmd.args([addr(&h).as_str(), "/test.Test/Unary", &hex(&request)]);
    foreign_unary(&h, "grpc-go", cmd, &want).await;
    let _ = std::fs::remove_file(&bin);
}

/// The shm listener's socket, where the port's docs say it is:
/// `$XDG_RUNTIME_DIR` (else the temp dir), `rrpc-port-<port>-<pid>.sock`.
fn shm_socket(h: &Harness) -> std::path::PathBuf {
    let port = addr(h).rsplit_once(':').expect("host:port").1.to_string();
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("rrpc-port-{port}-{}.sock", std::process::id()))
}

/// Equal host identities only let the server offer shm: a client that
/// cannot open the listener's socket (here: its file is gone, as for a
/// client in another mount namespace) falls back to TCP when it may, and
/// fails when it requires shm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_cannot_reach_the_shm_listener_falls_back_to_tcp() {
    let h = start(cfg()).await;
    let sock = shm_socket(&h);
    assert!(sock.exists(), "{} bound beside the port", sock.display());
    std::fs::remove_file(&sock).expect("remove the socket file");
    let ch = dial(&h, cfg()).await.expect("connect");
    assert_eq!(ch.carrier(), Carrier::Tcp, "fell back");
    unary!(TestClient::new(ch), 9);
    let e = dial(
        &h,
        cfg()
            .to_builder()
            .fabrics([Fabric::Shm])
            .build()
            .expect("fabrics"),
    )
    .await
    .expect_err("shm required and unreachable");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
}

/// Verbs required ("RDMA or fail") where the port cannot give it: a build
/// without the `verbs` feature never offers it, and a server without a
/// device has no side channel; either way a `NoFabric` naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_verbs_without_a_device_or_the_feature_is_a_clear_error() {
    if Transport::rdma_device().is_some() {
        eprintln!("skipped: a device is configured (module rdma_verbs covers it)");
        return;
    }
    let h = start(cfg()).await;
    let e = dial(
        &h,
        cfg()
            .to_builder()
            .fabrics([Fabric::Verbs])
            .build()
            .expect("fabrics"),
    )
    .await
    .expect_err("no verbs here");
    let Error::NoFabric { reason, .. } = &e else {
        panic!("{e}")
    };
    let why = if cfg!(feature = "verbs") {
        "verbs: the server has no active RDMA device"
    } else {
        "verbs needs the `verbs` feature"
    };
    assert!(reason.contains(why), "{reason}");
    assert_eq!(
        tonic::Status::from(e).code(),
        tonic::Code::FailedPrecondition
    );
    // A client that also allows TCP gets it.
    let ch = dial(
        &h,
        cfg()
            .to_builder()
            .fabrics([Fabric::Verbs, Fabric::Tcp])
            .build()
            .expect("f"),
    )
    .await
    .expect("connect");
    assert_eq!(ch.carrier(), Carrier::Tcp);
    unary!(TestClient::new(ch), 5);
}

/// On a host with an RDMA device (`cargo xtask rxe`: soft-RoCE `rxe0`).
#[cfg(feature = "verbs")]
mod rdma_verbs {
    use super::*;

    /// The harness's config on the test device.
    fn on_device(path: rrpc_tonic::PathPreference) -> RrpcConfig {
        let d = Transport::rdma_device().expect("RRPC_TEST_DEVICE");
        cfg()
            .to_builder()
            .rdma_device(d)
            .path(path)
            .build()
            .unwrap()
    }

    fn assert_verbs(ch: &rrpc_tonic::RrpcChannel) {
        let want = Transport::rdma_device().expect("RRPC_TEST_DEVICE");
        match ch.carrier() {
            Carrier::Verbs { device, peer } => {
                assert_eq!(device, want, "the queue pair's device");
                assert!(peer.is_some(), "a connected queue pair names its peer");
            }
            other => panic!("not verbs: {other:?}"),
        }
    }

    /// A "never shm" client lands on verbs, on both call paths, every RPC
    /// kind; at the same time a client with verbs forbidden gets TCP and a
    /// plain tonic channel is served on the same port.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_never_shm_client_lands_on_verbs_beside_tcp_and_plain_grpc() {
        if Transport::rdma_device().is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
            return;
        }
        eprintln!("rrpc-test-on-verbs");
        let server = cfg()
            .to_builder()
            .rdma_device(Transport::rdma_device().expect("device"))
            .build()
            .unwrap();
        let h = start(server).await;
        let never_shm = [Fabric::Verbs, Fabric::Tcp];
        let fast = dial(
            &h,
            on_device(rrpc_tonic::PathPreference::Fast)
                .to_builder()
                .fabrics(never_shm)
                .build()
                .expect("fabrics"),
        )
        .await
        .expect("connect on the fast path");
        assert_verbs(&fast);
        assert_eq!(fast.path(), ChannelPath::Fast);
        let h2 = dial(
            &h,
            on_device(rrpc_tonic::PathPreference::Http2)
                .to_builder()
                .fabrics(never_shm)
                .build()
                .expect("fabrics"),
        )
        .await
        .expect("connect on the HTTP/2 path");
        assert_verbs(&h2);
        assert_eq!(h2.path(), ChannelPath::Http2);
        let tcp = dial(
            &h,
            on_device(rrpc_tonic::PathPreference::Fast)
                .to_builder()
                .fabrics([Fabric::Tcp])
                .build()
                .expect("fabrics"),
        )
        .await
        .expect("connect, verbs forbidden");
        assert_eq!(tcp.carrier(), Carrier::Tcp);
        let mut grpc = plain(&h).await;
        let (mut a, mut b, mut c) = (
            TestClient::new(fast.clone()),
            TestClient::new(h2.clone()),
            TestClient::new(tcp),
        );
        tokio::join!(
            every_rpc_kind(&mut a),
            every_rpc_kind(&mut b),
            every_rpc_kind(&mut c),
            async {
                for n in 0..20 {
                    unary!(grpc, n);
                }
            }
        );
        assert_verbs(&fast);
        assert_verbs(&h2);
        // "RDMA or fail" gets it too, connected now or lazily.
        let only = on_device(rrpc_tonic::PathPreference::Fast)
            .to_builder()
            .fabrics([Fabric::Verbs])
            .build()
            .expect("fabrics");
        let ch = dial(&h, only.clone()).await.expect("verbs required");
        assert_verbs(&ch);
        unary!(TestClient::new(ch), 11);
        let lazy = RrpcEndpoint::new(&h.uri)
            .expect("uri")
            .config(only)
            .connect_lazy()
            .expect("lazy");
        unary!(TestClient::new(lazy.clone()), 12);
        assert_verbs(&lazy);
    }

    /// The hostile hellos of `hostile_hellos_beside` while a client on
    /// verbs calls through the port.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_hellos_do_not_disturb_a_verbs_client_and_plain_grpc_on_the_port() {
        if Transport::rdma_device().is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
            return;
        }
        eprintln!("rrpc-test-on-verbs");
        let h = start(
            cfg()
                .to_builder()
                .rdma_device(Transport::rdma_device().expect("device"))
                .build()
                .unwrap(),
        )
        .await;
        let verbs = on_device(rrpc_tonic::PathPreference::Fast)
            .to_builder()
            .fabrics([Fabric::Verbs])
            .build()
            .expect("fabrics");
        let ch = dial(&h, verbs).await.expect("connect on verbs");
        assert_verbs(&ch);
        hostile_hellos_beside(&h, ch.clone()).await;
        assert_verbs(&ch);
    }

    /// A client whose device cannot be opened falls back to TCP when it
    /// may, and fails naming the side channel when verbs is required.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_whose_queue_pair_cannot_connect_falls_back_to_tcp() {
        if Transport::rdma_device().is_none() {
            eprintln!("skipped: RRPC_TEST_DEVICE not set");
            return;
        }
        eprintln!("rrpc-test-on-verbs");
        let h = start(
            cfg()
                .to_builder()
                .rdma_device(Transport::rdma_device().expect("device"))
                .build()
                .unwrap(),
        )
        .await;
        let broken = cfg()
            .to_builder()
            .rdma_device("no-such-device-rrpc")
            .build()
            .unwrap();
        let ch = dial(
            &h,
            broken
                .clone()
                .to_builder()
                .fabrics([Fabric::Verbs, Fabric::Tcp])
                .build()
                .expect("fabrics"),
        )
        .await
        .expect("fell back");
        assert_eq!(ch.carrier(), Carrier::Tcp);
        unary!(TestClient::new(ch), 13);
        let e = dial(
            &h,
            broken
                .to_builder()
                .fabrics([Fabric::Verbs])
                .build()
                .expect("fabrics"),
        )
        .await
        .expect_err("verbs required, no device");
        let Error::NoFabric { reason, .. } = &e else {
            panic!("{e}")
        };
        assert!(
            reason.contains("the server offered verbs at rdma://"),
            "{reason}"
        );
    }
}
