//! End to end over real shm rings (rrpc-core shm provider + rrpc-ringbuf), in every mode.

mod common;

use std::time::Duration;

use common::{BOUND, poller};
use rrpc_poller::conn::AsyncConn;
use rrpc_poller::{Error, Mode};
use rrpc_ringbuf::RingConfig;

fn ring(mode: Mode, size: usize) -> RingConfig {
    RingConfig::builder()
        .ring_size(size)
        .tail_with_imm(mode == Mode::Event)
        .huge_pages(false)
        .build()
        .unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn ping_pong_every_mode() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let p = poller(mode);
            let (a, b) = AsyncConn::loopback_pair(&p, &ring(mode, 64 * 1024)).unwrap();
            let (mut atx, mut arx) = a.split().unwrap();
            let (mut btx, mut brx) = b.split().unwrap();
            let n = 500u32;
            let server = tokio::spawn(async move {
                for _ in 0..n {
                    let v = {
                        let m = brx.recv().await.unwrap();
                        u32::from_le_bytes(m[..4].try_into().unwrap())
                    };
                    btx.send(&(v + 1).to_le_bytes()).await.unwrap();
                    btx.flush().unwrap();
                }
                (btx, brx)
            });
            for i in 0..n {
                atx.send(&(i * 2).to_le_bytes()).await.unwrap();
                atx.flush().unwrap();
                let m = tokio::time::timeout(BOUND, arx.recv())
                    .await
                    .expect("lost wake-up")
                    .unwrap();
                assert_eq!(
                    u32::from_le_bytes(m[..4].try_into().unwrap()),
                    i * 2 + 1,
                    "{mode}"
                );
            }
            let _keep = server.await.unwrap();
            let s = p.stats();
            assert!(
                s.first_check_hits + s.spin_hits + s.wakeups >= u64::from(n),
                "{mode}: {s:?}"
            );
        });
    }
}

#[test]
fn full_ring_back_pressure_every_mode() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let p = poller(mode);
            let (a, b) = AsyncConn::loopback_pair(&p, &ring(mode, 4096)).unwrap();
            let (mut atx, _arx) = a.split().unwrap();
            let (_btx, mut brx) = b.split().unwrap();
            let count = 2000u32;
            let writer = tokio::spawn(async move {
                for i in 0..count {
                    let payload = [i.to_le_bytes().as_slice(), &[7u8; 100]].concat();
                    atx.send(&payload).await.unwrap();
                    if i % 8 == 0 {
                        atx.flush().unwrap();
                    }
                }
                atx.flush().unwrap();
                atx
            });
            for i in 0..count {
                let m = tokio::time::timeout(BOUND, brx.recv())
                    .await
                    .expect("stalled")
                    .unwrap();
                assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i, "{mode}");
                assert_eq!(m.len(), 104);
                if i % 97 == 0 {
                    drop(m);
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            }
            let _ = writer.await.unwrap();
        });
    }
}

#[test]
fn zero_copy_reserve() {
    rt().block_on(async {
        let p = poller(Mode::Bpev);
        let (a, b) = AsyncConn::loopback_pair(&p, &ring(Mode::Bpev, 8192)).unwrap();
        let (mut atx, _arx) = a.split().unwrap();
        let (_btx, mut brx) = b.split().unwrap();
        for i in 0..200u8 {
            let mut g = tokio::time::timeout(Duration::from_secs(5), atx.reserve(300))
                .await
                .unwrap_or_else(|_| panic!("reserve stuck at {i}"))
                .unwrap();
            g.fill(i);
            g.commit().unwrap();
            atx.flush().unwrap();
            let m = tokio::time::timeout(Duration::from_secs(5), brx.recv())
                .await
                .unwrap_or_else(|_| panic!("recv stuck at {i}"))
                .unwrap();
            assert!(m.len() == 300 && m.iter().all(|&x| x == i));
            drop(m);
            // Nobody waits in `recv` here (the test is sequential), so push the head by hand.
            brx.flush().unwrap();
        }
    });
}

#[test]
fn dead_peer_fails_waiting_receiver_every_mode() {
    for mode in Mode::ALL {
        rt().block_on(async {
            let p = poller(mode);
            let (a, b) = AsyncConn::loopback_pair(&p, &ring(mode, 8192)).unwrap();
            let (_atx, mut arx) = a.split().unwrap();
            let waiter = tokio::spawn(async move {
                let r = arx.recv().await.map(|m| m.len());
                matches!(r, Err(Error::PeerGone))
            });
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop(b);
            let gone = tokio::time::timeout(BOUND, waiter)
                .await
                .expect("not woken")
                .unwrap();
            assert!(gone, "{mode}");
        });
    }
}
