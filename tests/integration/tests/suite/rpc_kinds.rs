//! Unary, server-streaming, client-streaming and bidirectional calls.

use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, on_all_transports, payload};

async fn unary(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let r = c
        .unary(Input {
            payload: payload(100),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.payload, payload(100));
    assert_eq!(r.total, 100);
}

async fn server_streaming(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let mut st = c
        .server_stream(Input {
            payload: payload(10),
            count: 25,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(m) = st.message().await.unwrap() {
        assert_eq!(m.total, n);
        assert_eq!(m.payload, payload(10));
        n += 1;
    }
    assert_eq!(n, 25);
}

async fn client_streaming(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let inputs: Vec<Input> = (0..30)
        .map(|i| Input {
            payload: payload(i),
            ..Default::default()
        })
        .collect();
    let r = c
        .client_stream(tokio_stream::iter(inputs))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.total, (0..30u64).sum::<u64>());
    assert_eq!(r.payload, 30u64.to_le_bytes().to_vec());
}

async fn bidirectional(t: Transport) {
    let s = Harness::start(t).await;
    let mut c = s.client().await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Input>(4);
    let mut out = c
        .bidi(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Ping-pong: each reply arrives before the next request is sent.
    for i in 0..20usize {
        tx.send(Input {
            payload: payload(i),
            ..Default::default()
        })
        .await
        .unwrap();
        let m = out.message().await.unwrap().expect("reply");
        assert_eq!(m.payload, payload(i));
        assert_eq!(m.total, i as u64);
    }
    drop(tx);
    assert!(out.message().await.unwrap().is_none());
}

on_all_transports!(unary, server_streaming, client_streaming, bidirectional);
