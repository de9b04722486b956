//! The client's `shm://` connect waits for the server's answer on the
//! socket's readiness, not on a thread (rrpc-core `conn::Dialing`,
//! rrpc-tonic `rings::dial_dedicated_async`): a server that answers in
//! part and stalls costs the connect its handshake timeout and nothing
//! else (the runtime's other tasks run on, on one thread); a server that
//! answers in part and leaves fails the connect at once; a server that
//! refuses is reported as such; and connects to a live server beside a
//! stalled one are served.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rrpc_core::handshake::{Message, Reject, RejectCode};
use rrpc_integration_tests::{Harness, Transport, config};
use rrpc_tonic::{RrpcConfig, RrpcContext, RrpcEndpoint};

use super::sharing::call;

/// What the fake server does once it has read the client's hello.
#[derive(Clone, Copy)]
enum Answer {
    /// The first 12 bytes of an answer (a header announcing a body), then
    /// nothing, the socket held open.
    PartThenStall,
    /// The same 12 bytes, then the socket closed.
    PartThenClose,
    /// A whole `Reject`.
    Reject,
}

/// A fake shm server at a fresh path: reads one client's hello (its bytes,
/// the descriptors with them are dropped), answers as `what`, and holds the
/// socket until the test ends.
fn fake_server(what: Answer) -> (String, std::thread::JoinHandle<()>) {
    let uri = Harness::fresh_uri(Transport::ShmFast);
    let path = uri.strip_prefix("shm://").expect("shm uri").to_owned();
    let l = UnixListener::bind(&path).expect("bind");
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("hello header");
        let len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).expect("hello body");
        let reject = Message::Reject(Reject {
            code: RejectCode::Busy,
            reason: "fake server says no".into(),
        })
        .encode()
        .unwrap();
        match what {
            Answer::Reject => s.write_all(&reject).expect("answer"),
            Answer::PartThenStall | Answer::PartThenClose => {
                // A header that announces more than it sends.
                let mut part = reject[..12].to_vec();
                part[8..12].copy_from_slice(&100u32.to_le_bytes());
                s.write_all(&part).expect("answer");
            }
        }
        if matches!(what, Answer::PartThenClose) {
            drop(s);
            let _ = std::fs::remove_file(&path);
            return;
        }
        // Held open until the client has gone.
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let mut rest = [0u8; 64];
        while matches!(s.read(&mut rest), Ok(n) if n > 0) {}
        let _ = std::fs::remove_file(&path);
    });
    (uri, t)
}

fn short_handshake() -> RrpcConfig {
    config(Transport::ShmFast)
        .to_builder()
        .handshake_timeout(Duration::from_millis(400))
        .build()
        .unwrap()
}

async fn connect(
    uri: &str,
    cfg: &RrpcConfig,
) -> Result<rrpc_tonic::RrpcChannel, rrpc_tonic::Error> {
    RrpcEndpoint::new(uri)
        .expect("uri")
        .config(cfg.clone())
        .context(RrpcContext::new(cfg))
        .connect()
        .await
}

/// On a current-thread runtime: while the connect waits for the stalled
/// server's answer, a ticker task on the same thread keeps running; the
/// connect ends with the handshake's timeout.
#[test]
fn a_stalled_answer_holds_no_thread_and_times_out() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (uri, server) = fake_server(Answer::PartThenStall);
    let ticks = Arc::new(AtomicU64::new(0));
    let cfg = short_handshake();
    let (err, ticked) = rt.block_on(async {
        let t = ticks.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                t.fetch_add(1, Ordering::Relaxed);
            }
        });
        let r = connect(&uri, &cfg).await;
        ticker.abort();
        (
            r.expect_err("a stalled server"),
            ticks.load(Ordering::Relaxed),
        )
    });
    let msg = format!("{err}");
    assert!(
        msg.to_lowercase().contains("time"),
        "the handshake timeout, got: {msg}"
    );
    // 400 ms of 10 ms ticks; a connect that held the thread allows none.
    assert!(ticked >= 5, "the runtime's thread was held: {ticked} ticks");
    drop(rt);
    server.join().unwrap();
}

/// A server that sends part of its answer and leaves: the connect fails
/// at once with what happened, not with the timeout (a closed socket stays
/// readable; the wait must not spin until the deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_leaving_mid_answer_fails_the_connect_at_once() {
    let (uri, server) = fake_server(Answer::PartThenClose);
    let cfg = config(Transport::ShmFast)
        .to_builder()
        .handshake_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let err = connect(&uri, &cfg).await.expect_err("a server gone");
    let msg = format!("{err}");
    assert!(
        !msg.to_lowercase().contains("time"),
        "not the timeout: {msg}"
    );
    assert!(msg.contains("closed after 12"), "{msg}");
    // Far below the 20 s timeout, whatever the machine's load.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    server.join().unwrap();
}

/// A refusal is read as one (the reason the server gave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_reported_with_its_reason() {
    let (uri, server) = fake_server(Answer::Reject);
    let err = connect(&uri, &short_handshake())
        .await
        .expect_err("refused");
    assert!(format!("{err}").contains("fake server says no"), "{err}");
    server.join().unwrap();
}

/// Connects to a live server go on while another connect waits on a
/// stalled one, and each connection carries calls; the stalled one then
/// times out. One worker: a connect that held it would stop the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stalled_server_does_not_hold_up_connects_to_another() {
    let (uri, server) = fake_server(Answer::PartThenStall);
    let cfg = config(Transport::ShmFast)
        .to_builder()
        .handshake_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let stalled = tokio::spawn({
        let cfg = cfg.clone();
        async move { connect(&uri, &cfg).await.map(drop) }
    });
    let h = Harness::start(Transport::ShmFast).await;
    for i in 0..20u8 {
        let mut c = h.client().await;
        call(&mut c, i).await;
    }
    assert!(!stalled.is_finished(), "the stalled connect ended early");
    assert!(
        stalled.await.unwrap().is_err(),
        "the stalled server timed out"
    );
    server.join().unwrap();
}

/// The server answers a shm hello on its connection's task, not on a
/// blocking thread: that is safe only once the whole hello is in. Clients
/// that trickle theirs (more of them than the server has workers) must
/// not hold a worker: honest clients connect and call while every
/// trickler is still being waited for (none cut yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tricklers_hold_no_server_worker() {
    use std::sync::atomic::AtomicBool;
    let cfg = config(Transport::ShmFast)
        .to_builder()
        .handshake_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let h = Harness::start_with(Transport::ShmFast, cfg).await;
    let path = h.uri.strip_prefix("shm://").expect("shm uri").to_owned();
    let (stop, cut) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let tricklers: Vec<_> = (0..4)
        .map(|_| {
            let (path, stop, cut) = (path.clone(), stop.clone(), cut.clone());
            std::thread::spawn(move || {
                let mut s = std::os::unix::net::UnixStream::connect(&path).expect("connect");
                // A hello header announcing 1000 bytes of body, then a byte
                // at a time.
                let mut head = b"RRPC".to_vec();
                head.extend_from_slice(&2u16.to_le_bytes());
                head.extend_from_slice(&[1, 0]);
                head.extend_from_slice(&1000u32.to_le_bytes());
                let mut sent = s.write_all(&head).is_ok();
                while sent && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                    sent = s.write_all(&[0]).is_ok();
                }
                if !sent {
                    cut.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Every trickler connected and sent its first bytes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..5u8 {
        let mut c = h.client().await;
        call(&mut c, i).await;
    }
    let cut_early = cut.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in tricklers {
        t.join().unwrap();
    }
    assert_eq!(
        cut_early, 0,
        "honest clients were served only after tricklers were cut"
    );
}
