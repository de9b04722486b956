//! A request written after a timed-out call never reaches the handler torn:
//! a WRITE cut anywhere in the client's next requests (rrpc-core's fault
//! injection: the WRITE lands half, every post after it fails) while the
//! server has not yet taken the timed-out request.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rrpc_core::{Fabric, FaultConfig, QpConfig};
use rrpc_kv::rfrpc::{KvClient, Mode, ModePolicy, RfClientConfig, RfServer};
use rrpc_kv::{Execute, Op, OpResult};

use crate::common::{MapStore, endpoint};

const GATE: &[u8] = b"gate";

/// A store that records every operation it carries out and holds a GET of
/// [`GATE`] until `open` (at most 10 s, so a failed test cannot hang).
#[derive(Debug, Default)]
struct Gated {
    store: MapStore,
    ops: Mutex<Vec<Op>>,
    /// A GET of the gate is being held.
    entered: AtomicBool,
    open: AtomicBool,
}

impl Execute for Gated {
    fn execute(&self, op: Op) -> OpResult {
        if matches!(&op, Op::Get { key } if key == GATE) {
            self.entered.store(true, Ordering::Release);
            let t0 = Instant::now();
            while !self.open.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.ops.lock().unwrap().push(op.clone());
        self.store.execute(op)
    }
}

fn put(key: u8, klen: usize, val: u8, vlen: usize) -> Op {
    Op::Put {
        key: Bytes::from(vec![key; klen]),
        value: Bytes::from(vec![val; vlen]),
    }
}

/// One client, its WRITE number `k` torn and every post after it failed:
/// a GET that the handler holds (the call times out), a long PUT the
/// server has not taken yet (it times out too), then a shorter PUT. Then
/// the handler is released. Returns what the store carried out and what
/// was sent.
fn run_with_cut_at(k: u64) -> (Vec<Op>, Vec<Op>) {
    let ep = endpoint("rfrpc-torn", &format!("k{k}"));
    let f = Fabric::shm();
    let store = std::sync::Arc::new(Gated::default());
    let server = RfServer::builder()
        .serve_execute(&ep, &f, store.clone())
        .unwrap();
    let fault = FaultConfig::builder()
        .torn_write_every(k)
        .fail_after_posts(k)
        .build()
        .unwrap();
    // Server-reply: the client posts nothing while it waits, so the WRITEs
    // are numbered the same in every run.
    let cfg = RfClientConfig::builder()
        .call_timeout(Duration::from_millis(50))
        .mode(Some(ModePolicy::Fixed(Mode::ServerReply)))
        .qp(QpConfig::builder().fault(fault).build().unwrap())
        .build()
        .unwrap();
    let c = KvClient::connect(&ep, &f, cfg).unwrap();
    let gate = Op::Get {
        key: Bytes::from_static(GATE),
    };
    // Keys of the longest length: a PUT torn after its key's first bytes
    // still parses, as a PUT of a key nobody wrote.
    let long = put(b'x', 250, b'X', 1000);
    let short = put(b'y', 250, b'Y', 8);
    let sent = vec![gate.clone(), long.clone(), short.clone()];
    // Timeouts and injected failures: what happens to the buffer is what
    // this test is about, not what the caller sees.
    let _ = c.call(&gate);
    if k > 2 {
        // The gate's two WRITEs landed whole: the server holds it before
        // the next requests are written, however loaded the machine.
        let t0 = Instant::now();
        while !store.entered.load(Ordering::Acquire) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the gate was never taken"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let _ = c.call(&long);
    let _ = c.call(&short);
    store.open.store(true, Ordering::Release);
    // Three calls of another client: the server thread has since polled
    // the first client's request buffer at least once (it polls its
    // connections in turn, and the third call is served at least one whole
    // pass after the handler was released).
    let probe = KvClient::connect(&ep, &f, RfClientConfig::default()).unwrap();
    let ask = Op::Get {
        key: Bytes::from_static(b"probe"),
    };
    for _ in 0..3 {
        assert_eq!(probe.call(&ask).unwrap(), OpResult::NotFound);
    }
    drop((c, probe));
    server.shutdown();
    let mut sent = sent;
    sent.push(ask);
    let ops = store.ops.lock().unwrap().clone();
    (ops, sent)
}

#[test]
fn a_request_cut_after_a_timeout_is_never_served_torn() {
    // Every WRITE of the three calls (two per call, three with the
    // invalidating one), and one past them.
    for k in 1..=9 {
        let (ops, sent) = run_with_cut_at(k);
        for op in &ops {
            assert!(
                sent.contains(op),
                "cut at WRITE {k}: the store carried out an operation nobody sent: {}",
                describe(op)
            );
        }
        assert!(
            ops.iter()
                .filter(|op| matches!(op, Op::Get { key } if key == GATE))
                .count()
                <= 1,
            "cut at WRITE {k}: {ops:?}"
        );
    }
}

fn describe(op: &Op) -> String {
    match op {
        Op::Put { key, value } => format!(
            "PUT of a {}-byte key starting {:?}, ending {:?}, value of {} bytes",
            key.len(),
            &key[..4.min(key.len())],
            &key[key.len().saturating_sub(4)..],
            value.len()
        ),
        other => format!("{other:?}"),
    }
}
