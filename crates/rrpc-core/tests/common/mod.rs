//! Shared helpers for rrpc-core's integration tests.
#![allow(dead_code, unreachable_pub, missing_docs, unused_macros)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use std::time::{Duration, Instant};

use rrpc_core::{Completion, CompletionQueue, FabricAddr, QpConfig, Region};

/// The provider a test runs on (shared by the crates' tests).
pub use rrpc_core::testing::Provider;

/// A listener on a fresh side channel (a Unix socket for shm, TCP on
/// 127.0.0.1, port chosen by the kernel, for verbs) and the endpoint a
/// client connects to.
pub fn listen(p: &Provider, tag: &str, cfg: HandshakeConfig) -> (conn::Listener, FabricAddr) {
    match p {
        Provider::Shm => {
            let ep = endpoint(tag);
            (conn::Listener::bind(&ep, cfg).unwrap(), ep)
        }
        Provider::Verbs(_) => {
            let any = FabricAddr::parse("rdma://127.0.0.1:0").unwrap();
            let l = conn::Listener::bind(&any, cfg).unwrap();
            let addr = l.local_addr().expect("a TCP side channel");
            (l, FabricAddr::Rdma(addr))
        }
    }
}

/// A unique socket path in a fresh temp dir.
pub fn sock_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-core-test-{}-{}-{}",
        std::process::id(),
        tag,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("s.sock")
}

pub fn endpoint(tag: &str) -> FabricAddr {
    FabricAddr::Shm(sock_path(tag))
}

/// One side of a connected pair: the connection, the region it granted to the
/// peer (role 1), a local scratch region and the provider it runs on.
pub struct Side {
    pub conn: Connection,
    pub granted: Arc<Region>,
    pub scratch: Arc<Region>,
    pub provider: Provider,
}

impl Side {
    /// Polls the send completion queue until `n` completions arrived (panics
    /// after the provider's patience).
    pub fn wait_send(&self, n: usize) -> Vec<Completion> {
        wait_cq(self.conn.qp().send_cq(), n, self.provider.patience())
    }

    /// Polls the receive completion queue until `n` completions arrived.
    pub fn wait_recv(&self, n: usize) -> Vec<Completion> {
        wait_cq(self.conn.qp().recv_cq(), n, self.provider.patience())
    }
}

/// Polls `cq` until `n` completions arrived; panics after `patience`.
pub fn wait_cq(cq: &CompletionQueue, n: usize, patience: Duration) -> Vec<Completion> {
    let deadline = Instant::now() + patience;
    let mut out = Vec::new();
    let mut buf = [Completion::EMPTY; 16];
    while out.len() < n {
        let k = cq.poll(&mut buf[..(n - out.len()).min(16)]).unwrap();
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions after {patience:?}: {out:?}",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Connects two queue pairs in this process over `provider`'s side channel.
pub fn pair_on(provider: &Provider, len: usize, a_cfg: QpConfig, b_cfg: QpConfig) -> (Side, Side) {
    pair_on_with_access(provider, len, a_cfg, b_cfg, rrpc_core::Access::ALL)
}

/// [`pair_on`], each side granting a region registered with `access`.
pub fn pair_on_with_access(
    provider: &Provider,
    len: usize,
    a_cfg: QpConfig,
    b_cfg: QpConfig,
    access: rrpc_core::Access,
) -> (Side, Side) {
    let hs = HandshakeConfig::default();
    pair_on_with(provider, len, a_cfg, b_cfg, access, hs.clone(), hs)
}

/// [`pair_on_with_access`] with the server's (`b`) and the client's (`a`)
/// handshake settings.
pub fn pair_on_with(
    provider: &Provider,
    len: usize,
    a_cfg: QpConfig,
    b_cfg: QpConfig,
    access: rrpc_core::Access,
    server_hs: HandshakeConfig,
    client_hs: HandshakeConfig,
) -> (Side, Side) {
    let (listener, ep) = listen(provider, "pair", server_hs);
    let fabric = provider.fabric();
    let f2 = fabric.clone();
    let p2 = provider.clone();
    let server = std::thread::spawn(move || {
        let granted = f2.alloc_region_with(len, access).unwrap();
        let scratch = f2.alloc_region(len).unwrap();
        let inc = listener.accept().unwrap();
        let conn = inc
            .accept(
                f2.create_qp(&b_cfg).unwrap(),
                Offer::new().grant(1, granted.clone()),
            )
            .unwrap();
        Side {
            conn,
            granted,
            scratch,
            provider: p2,
        }
    });
    let granted = fabric.alloc_region_with(len, access).unwrap();
    let scratch = fabric.alloc_region(len).unwrap();
    let conn = conn::connect(
        &ep,
        fabric.create_qp(&a_cfg).unwrap(),
        Offer::new().grant(1, granted.clone()),
        &client_hs,
    )
    .unwrap();
    let b = server.join().unwrap();
    assert_eq!(
        conn.peer().provider,
        provider.kind(),
        "the peer runs on the same provider"
    );
    assert_eq!(b.conn.peer().provider, provider.kind());
    (
        Side {
            conn,
            granted,
            scratch,
            provider: provider.clone(),
        },
        b,
    )
}

/// Connects two shm queue pairs in this process.
pub fn pair_with(len: usize, a_cfg: QpConfig, b_cfg: QpConfig) -> (Side, Side) {
    pair_on(&Provider::Shm, len, a_cfg, b_cfg)
}

pub fn pair(len: usize) -> (Side, Side) {
    pair_with(len, QpConfig::default(), QpConfig::default())
}

/// FNV-1a, for checksummed payloads.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
