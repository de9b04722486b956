//! What rrpc-kv's integration tests share: a toy store, shm endpoints, and
//! the sized-reply handler the RF-RPC tests serve.
#![allow(dead_code)] // each test file uses a subset

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use rrpc_core::FabricAddr;
use rrpc_kv::{Execute, Op, OpResult};

/// The simplest store: a map under a lock, the oracle the real store is
/// checked against.
#[derive(Debug, Default)]
pub(crate) struct MapStore(pub(crate) Mutex<BTreeMap<Bytes, Bytes>>);

impl Execute for MapStore {
    fn execute(&self, op: Op) -> OpResult {
        let mut m = self.0.lock().unwrap();
        match op {
            Op::Get { key } => m
                .get(&key)
                .cloned()
                .map_or(OpResult::NotFound, OpResult::Value),
            Op::Put { key, value } => {
                m.insert(key, value);
                OpResult::Ok
            }
            Op::Delete { key } => m.remove(&key).map_or(OpResult::NotFound, |_| OpResult::Ok),
            Op::Scan { start, count } => OpResult::Entries(
                m.range(start..)
                    .take(count as usize)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
        }
    }
}

/// A fresh shm endpoint in its own temporary directory, named after the
/// test binary's `prefix` and the test's `tag`.
pub(crate) fn endpoint(prefix: &str, tag: &str) -> FabricAddr {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-kv-{prefix}-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    FabricAddr::Shm(dir.join("s.sock"))
}

/// A handler that returns `n` patterned bytes where the request asks for `n`
/// (its first 4 bytes, little endian; 0 when shorter).
pub(crate) fn sized(req: &[u8]) -> Vec<u8> {
    let n = req
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
        .unwrap_or(0);
    (0..n).map(|i| (i * 31 + req.len()) as u8).collect()
}

/// A request that asks [`sized`] for `n` bytes, padded with `pad` bytes.
pub(crate) fn ask(n: usize, pad: usize) -> Vec<u8> {
    let mut v = (n as u32).to_le_bytes().to_vec();
    v.resize(4 + pad, 7);
    v
}

/// Calls `c` (its handler now slow) until its settled mode is server-reply,
/// at most 20 calls. `current()`, not `mode()`: a probe of the other mode
/// changes `mode()` for five calls.
pub(crate) fn calls_until_server_reply(c: &mut rrpc_kv::rfrpc::RfClient) {
    use rrpc_kv::rfrpc::Mode;
    let mut slow_calls = 0;
    while c.mode_switch().current() != Mode::ServerReply {
        c.call(b"a").unwrap();
        slow_calls += 1;
        assert!(
            slow_calls <= 20,
            "slow calls did not switch: {:?}",
            c.mode_switch()
        );
    }
}
