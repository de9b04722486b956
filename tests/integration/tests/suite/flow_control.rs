//! Per-call flow control: a call whose consumer stops reading stalls only
//! itself. Other calls on the same channel go on, and once the consumer
//! reads again every message arrives (nothing lost). Over TCP and rrpc's
//! HTTP/2 path this is HTTP/2's stream windows; on the fast path, rrpc's
//! own (`RrpcConfig::call_window`). The harness uses 1 MiB rings, so each
//! stalled call below holds more than a ring's worth of messages.

use std::time::Duration;

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports, payload};

const MSG: usize = 16 << 10;
const COUNT: u32 = 256; // 4 MiB per stalled call, 256 frames

async fn unary_works(
    c: &mut rrpc_integration_tests::pb::test_client::TestClient<rrpc_tonic::RrpcChannel>,
    what: &str,
) {
    for n in [0usize, 10, 100 << 10] {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            c.unary(Input {
                payload: payload(n),
                ..Default::default()
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: a unary call hangs behind the stalled stream"))
        .expect("unary call");
        assert_eq!(r.into_inner().payload, payload(n));
    }
}

/// Waits until the server's stream production stops growing (unchanged
/// for 300 ms; at most 20 s): a stream nobody reads must stall, on every
/// transport, and what it produced until then is what the window let
/// through. A producer that never stalls fails here.
async fn until_production_stalls(s: &Harness, what: &str) -> u64 {
    let read = || s.obs.produced.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (mut last, mut since) = (read(), std::time::Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = read();
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        } else if last > 0 && since.elapsed() >= Duration::from_millis(300) {
            return last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the server's production never stalled ({last} messages)"
        );
    }
}

/// A server stream the client does not read (a client that waits for a
/// unary call before reading its stream must not deadlock).
async fn unread_server_stream_stalls_only_itself(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut st = c
        .server_stream(Input {
            payload: payload(MSG),
            count: COUNT,
            ..Default::default()
        })
        .await
        .expect("stream opens")
        .into_inner();
    // The server fills whatever window it has, then stalls.
    until_production_stalls(&s, "server stream").await;
    unary_works(&mut c, "server stream").await;
    // A second channel is unaffected too.
    let mut c2 = s.client().await;
    unary_works(&mut c2, "second channel").await;
    let mut n = 0;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(20), st.message())
        .await
        .expect("the stream resumes once read")
        .expect("message")
    {
        assert_eq!(m.payload.len(), MSG);
        assert_eq!(m.total, u64::from(n), "in order, none lost");
        n += 1;
    }
    assert_eq!(n, COUNT);
}

/// Bidi messages: 800 KiB in all, below the 1 MiB connection window of
/// hyper's HTTP/2 server. (With more, HTTP/2 itself stalls every call on
/// the connection, over TCP too: one unread stream can take the whole
/// connection window. The fast path has no connection window to exhaust.)
const BIDI_MSG: usize = 4 << 10;
const BIDI_COUNT: u32 = 200;

/// A bidi call whose responses the client does not read: the server's
/// handler blocks on its send window and stops reading requests, so the
/// client's request stream stalls on its own window as well. Other calls
/// go on; reading the responses releases both directions.
async fn unread_bidi_stalls_only_itself(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let reqs = futures_util::stream::iter((0..BIDI_COUNT).map(|_| Input {
        payload: payload(BIDI_MSG),
        ..Default::default()
    }));
    let mut st = c.bidi(reqs).await.expect("bidi opens").into_inner();
    tokio::time::sleep(Duration::from_millis(200)).await;
    unary_works(&mut c, "bidi").await;
    let mut n = 0;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(20), st.message())
        .await
        .expect("the bidi call resumes once read")
        .expect("message")
    {
        assert_eq!(m.payload, payload(BIDI_MSG));
        assert_eq!(m.total, u64::from(n));
        n += 1;
    }
    assert_eq!(n, BIDI_COUNT);
}

/// What a server produces for a stream nobody reads is bounded by the
/// call's window, not by the stream's length, so a client that never reads
/// cannot make the server hold unbounded memory (10,000 unread 64 KiB
/// replies once cost it +393 MiB). The fast path holds at
/// most a window plus one batch (a chunk) per call: asserted ≤ 4 × 256 KiB.
/// (Before: a body that was always ready was drained whole into one batch,
/// all 10,000 messages.) The HTTP/2 path is bounded by tonic's client
/// stream window (2 MiB) plus the ring: asserted ≤ 4 MiB. Over TCP,
/// tonic's own buffers apply: only the stall is asserted. Production is
/// read once it has stopped growing, not after a fixed sleep, so a slow
/// host cannot hide an unbounded producer.
async fn unread_stream_production_is_bounded(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let _st = c
        .server_stream(Input {
            payload: payload(MSG),
            count: 10_000,
            ..Default::default()
        })
        .await
        .expect("stream opens")
        .into_inner();
    // Other calls keep the connection's reader busy meanwhile, so the ring
    // is drained into the unread call's buffer: what bounds production is
    // then the call's window, not the ring.
    unary_works(&mut c, "beside the unread stream").await;
    let produced = until_production_stalls(&s, "unread stream").await;
    let bound = match t {
        // tonic's stream and connection windows and the socket buffers:
        // stalled (above), not sized here.
        Transport::Tcp | Transport::PortTcp => usize::MAX,
        Transport::ShmH2 | Transport::RdmaH2 => 4 << 20,
        Transport::ShmFast | Transport::RdmaFast | Transport::PortShm | Transport::PortVerbs => {
            4 * (256 << 10)
        }
    };
    assert!(
        produced as usize * MSG <= bound,
        "{t:?}: {produced} messages of {MSG} B produced for a stream nobody reads"
    );
    unary_works(&mut c, "bounded").await;
}

on_all_transports!(
    unread_server_stream_stalls_only_itself,
    unread_bidi_stalls_only_itself,
    unread_stream_production_is_bounded
);
