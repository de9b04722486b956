//! The gRPC face end to end: every RPC over tonic's TCP transport and over
//! rrpc-tonic's `shm://` rings (fast path and HTTP/2 path), bad input mapped
//! to the right status, and a server that goes away failing calls rather
//! than hanging them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rrpc_kv::grpc::{GrpcKv, KvChannel, KvService, MAX_BATCH};
use rrpc_kv::op::{MAX_KEY_LEN, MAX_SCAN, MAX_VALUE_LEN};
use rrpc_kv::{Execute, Op, OpResult};
use rrpc_tonic::{PathPreference, RrpcChannel, RrpcConfig};
use tonic::Code;

use crate::common;
use common::MapStore;

/// A key the test store fails on.
const FAIL_KEY: &[u8] = b"!fail";
/// A key the test store answers with a result of the wrong kind.
const ODD_KEY: &[u8] = b"!odd";

/// The toy store, failing on [`FAIL_KEY`] and answering [`ODD_KEY`] with a
/// result of the wrong kind.
#[derive(Debug, Default)]
struct TestStore(MapStore);

impl Execute for TestStore {
    fn execute(&self, op: Op) -> OpResult {
        if op.key() == FAIL_KEY {
            return OpResult::Failed("disk on fire".into());
        }
        if op.key() == ODD_KEY {
            return OpResult::Entries(vec![]);
        }
        self.0.execute(op)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    ShmFast,
    ShmH2,
}

fn config(t: Transport) -> RrpcConfig {
    let c = RrpcConfig::builder()
        .ring_size(1 << 20)
        .build()
        .expect("valid ring size");
    match t {
        Transport::ShmH2 => c.to_builder().path(PathPreference::Http2).build().unwrap(),
        _ => c,
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A KV server in its own thread and runtime, so a test can kill it the way
/// a process dies (every task dropped at once).
struct Server {
    uri: String,
    transport: Transport,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(transport: Transport) -> Server {
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let (uri, tcp) = match transport {
            Transport::Tcp => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                l.set_nonblocking(true).expect("nonblocking");
                (format!("http://{}", l.local_addr().expect("addr")), Some(l))
            }
            _ => (
                format!(
                    "shm://{}/rrpc-kv-grpc-{}-{}.sock",
                    std::env::temp_dir().display(),
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ),
                None,
            ),
        };
        let u = uri.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let svc = KvService::new(TestStore::default()).into_server();
                let serve = async move {
                    match tcp {
                        Some(l) => {
                            let l = tokio::net::TcpListener::from_std(l).expect("listener");
                            tonic::transport::Server::builder()
                                .add_service(svc)
                                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l))
                                .await
                                .map_err(|e| e.to_string())
                        }
                        None => rrpc_tonic::Server::builder()
                            .add_service(svc)
                            .serve_rrpc(&u, config(transport))
                            .await
                            .map_err(|e| e.to_string()),
                    }
                };
                tokio::select! {
                    r = serve => panic!("server ended: {r:?}"),
                    _ = kill_rx => {}
                }
            });
            rt.shutdown_background();
        });
        Server {
            uri,
            transport,
            kill: Some(kill_tx),
            thread: Some(thread),
        }
    }

    /// A client over rrpc-tonic's channel, retrying while the server comes up.
    async fn client(&self) -> GrpcKv<RrpcChannel> {
        let mut last = None;
        for _ in 0..300 {
            match GrpcKv::connect(&self.uri, config(self.transport)).await {
                Ok(c) => return c,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("could not connect to {}: {last:?}", self.uri);
    }

    fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Every RPC, with the answers a map gives.
async fn every_rpc<C: KvChannel>(kv: &GrpcKv<C>) {
    assert_eq!(kv.get(b("a")).await.unwrap(), None);
    kv.put(b("a"), b("1")).await.unwrap();
    kv.put(b("c"), b("3")).await.unwrap();
    kv.put(b("b"), b("2")).await.unwrap();
    assert_eq!(kv.get(b("a")).await.unwrap(), Some(b("1")));
    kv.put(b("a"), b("one")).await.unwrap();
    assert_eq!(kv.get(b("a")).await.unwrap(), Some(b("one")));
    // An empty value is a value, not an absence.
    kv.put(b("e"), Bytes::new()).await.unwrap();
    assert_eq!(kv.get(b("e")).await.unwrap(), Some(Bytes::new()));
    assert!(kv.delete(b("e")).await.unwrap());
    assert!(!kv.delete(b("e")).await.unwrap());

    assert_eq!(
        kv.scan(b("b"), 10).await.unwrap(),
        vec![(b("b"), b("2")), (b("c"), b("3"))]
    );
    assert_eq!(
        kv.scan(Bytes::new(), 2).await.unwrap(),
        vec![(b("a"), b("one")), (b("b"), b("2"))]
    );
    assert_eq!(kv.scan(b("z"), 10).await.unwrap(), vec![]);
    assert_eq!(kv.scan(b("a"), 0).await.unwrap(), vec![]);

    // A large value (over one ring message) round-trips.
    let big = Bytes::from(vec![7u8; MAX_VALUE_LEN]);
    kv.put(b("big"), big.clone()).await.unwrap();
    assert_eq!(kv.get(b("big")).await.unwrap(), Some(big));
    assert!(kv.delete(b("big")).await.unwrap());

    let results = kv
        .batch(vec![
            Op::Put {
                key: b("d"),
                value: b("4"),
            },
            Op::Get { key: b("d") },
            Op::Get { key: b("nope") },
            Op::Delete { key: b("b") },
            Op::Delete { key: b("b") },
            Op::Scan {
                start: b("c"),
                count: 5,
            },
            Op::Get {
                key: Bytes::from_static(FAIL_KEY),
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            OpResult::Ok,
            OpResult::Value(b("4")),
            OpResult::NotFound,
            OpResult::Ok,
            OpResult::NotFound,
            OpResult::Entries(vec![(b("c"), b("3")), (b("d"), b("4"))]),
            OpResult::Failed("disk on fire".into()),
        ]
    );

    assert_eq!(
        kv.execute(Op::Get { key: b("d") }).await.unwrap(),
        OpResult::Value(b("4"))
    );
    assert_eq!(
        kv.execute(Op::Delete { key: b("nope") }).await.unwrap(),
        OpResult::NotFound
    );
}

/// Bad input and store failures, with their codes.
async fn bad_input<C: KvChannel>(kv: &GrpcKv<C>) {
    let long_key = Bytes::from(vec![b'k'; MAX_KEY_LEN + 1]);
    let ok_key = Bytes::from(vec![b'k'; MAX_KEY_LEN]);
    let expect = |r: Result<_, tonic::Status>, code: Code, needle: &str| {
        let s = r.expect_err("an error status");
        assert_eq!(s.code(), code, "{s:?}");
        assert!(s.message().contains(needle), "{needle:?} in {s:?}");
    };
    expect(
        kv.get(long_key.clone()).await.map(|_| ()),
        Code::InvalidArgument,
        "key",
    );
    expect(
        kv.put(long_key.clone(), b("v")).await,
        Code::InvalidArgument,
        "key",
    );
    expect(
        kv.delete(long_key.clone()).await.map(|_| ()),
        Code::InvalidArgument,
        "key",
    );
    expect(
        kv.scan(long_key.clone(), 1).await.map(|_| ()),
        Code::InvalidArgument,
        "key",
    );
    // The limit itself is fine.
    kv.put(ok_key.clone(), b("v")).await.unwrap();
    assert_eq!(kv.get(ok_key).await.unwrap(), Some(b("v")));

    expect(
        kv.put(b("k"), Bytes::from(vec![0u8; MAX_VALUE_LEN + 1]))
            .await,
        Code::InvalidArgument,
        "value",
    );
    expect(
        kv.scan(b("a"), MAX_SCAN + 1).await.map(|_| ()),
        Code::InvalidArgument,
        "scan count",
    );
    kv.scan(b("a"), MAX_SCAN).await.unwrap();

    expect(
        kv.batch(vec![]).await.map(|_| ()),
        Code::InvalidArgument,
        "empty batch",
    );
    expect(
        kv.batch(vec![Op::Get { key: b("a") }; MAX_BATCH + 1])
            .await
            .map(|_| ()),
        Code::ResourceExhausted,
        "batch",
    );
    assert_eq!(
        kv.batch(vec![Op::Get { key: b("a") }; MAX_BATCH])
            .await
            .unwrap()
            .len(),
        MAX_BATCH
    );
    // One bad operation rejects the batch whole, before any runs.
    expect(
        kv.batch(vec![
            Op::Put {
                key: b("batch-first"),
                value: b("x"),
            },
            Op::Get {
                key: long_key.clone(),
            },
        ])
        .await
        .map(|_| ()),
        Code::InvalidArgument,
        "operation 1",
    );
    assert_eq!(kv.get(b("batch-first")).await.unwrap(), None);
    // An operation with nothing set (only a raw client can send one).
    let s = kv
        .client()
        .batch(rrpc_kv::grpc::pb::BatchRequest {
            ops: vec![rrpc_kv::grpc::pb::Operation { op: None }],
        })
        .await
        .expect_err("no operation set");
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");

    // The store's failure, and a store answering with the wrong kind.
    expect(
        kv.get(Bytes::from_static(FAIL_KEY)).await.map(|_| ()),
        Code::Internal,
        "disk on fire",
    );
    expect(
        kv.put(Bytes::from_static(FAIL_KEY), b("v")).await,
        Code::Internal,
        "disk on fire",
    );
    expect(
        kv.get(Bytes::from_static(ODD_KEY)).await.map(|_| ()),
        Code::Internal,
        "GET",
    );

    // The connection is still good.
    kv.put(b("after"), b("ok")).await.unwrap();
}

async fn all(t: Transport) {
    let server = Server::start(t);
    let kv = server.client().await;
    every_rpc(&kv).await;
    bad_input(&kv).await;
    // Many concurrent callers on one client.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let kv = kv.clone();
            tokio::spawn(async move {
                for j in 0..20 {
                    let k = format!("c{i}-{j}");
                    kv.put(b(&k), b(&k)).await.unwrap();
                    assert_eq!(kv.get(b(&k)).await.unwrap(), Some(b(&k)));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let written = kv
        .scan(b("c0"), 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|(k, v)| k.starts_with(b"c") && k[1].is_ascii_digit() && k == v)
        .count();
    assert_eq!(written, 16 * 20);
}

/// After the server dies a call fails (in bounded time) instead of hanging.
async fn server_goes_away(t: Transport) {
    let mut server = Server::start(t);
    let kv = server.client().await;
    kv.put(b("k"), b("v")).await.unwrap();
    server.kill();
    let r = tokio::time::timeout(Duration::from_secs(20), async {
        // The first call may race the teardown; one of a few must fail.
        for _ in 0..50 {
            if let Err(s) = kv.get(b("k")).await {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("calls keep succeeding after the server died");
    })
    .await
    .expect("a call to a dead server ends with an error, not a hang");
    assert!(
        matches!(
            r.code(),
            Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
        ),
        "{r:?}"
    );
}

/// A test per transport, each named, running `$check(Transport::$t)`.
macro_rules! per_transport {
    ($check:ident: $($name:ident => $t:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $check(Transport::$t).await;
            }
        )*
    };
}

per_transport!(all:
    tcp_every_rpc_and_bad_input => Tcp,
    shm_fast_every_rpc_and_bad_input => ShmFast,
    shm_http2_every_rpc_and_bad_input => ShmH2,
);

/// `GrpcKv` over tonic's own `Channel`, not only rrpc-tonic's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_channel_client() {
    let server = Server::start(Transport::Tcp);
    let channel = {
        let mut last = None;
        let mut ch = None;
        for _ in 0..300 {
            match tonic::transport::Endpoint::from_shared(server.uri.clone())
                .unwrap()
                .connect()
                .await
            {
                Ok(c) => {
                    ch = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ch.unwrap_or_else(|| panic!("connect: {last:?}"))
    };
    let kv = GrpcKv::new(channel);
    every_rpc(&kv).await;
}

per_transport!(server_goes_away:
    tcp_server_goes_away => Tcp,
    shm_server_goes_away => ShmFast,
);

/// Connecting to nothing fails, and fails quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_is_an_error() {
    let path = format!(
        "shm://{}/rrpc-kv-grpc-nobody-{}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    );
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        GrpcKv::connect(&path, RrpcConfig::default()),
    )
    .await
    .expect("no hang");
    assert!(r.is_err());
}

/// The blocking mode serves the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_mode() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", l.local_addr().unwrap());
    let svc = KvService::new(TestStore::default()).blocking(true);
    assert!(format!("{svc:?}").contains("blocking: true"));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    let kv = GrpcKv::connect(&uri, RrpcConfig::default()).await.unwrap();
    every_rpc(&kv).await;
    server.abort();
}
