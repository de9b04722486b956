//! The YCSB driver: runs a phase's transactions on one or more clients,
//! times each, and counts the failures (one driver for `rrpc-kv-bench` and
//! the `kv` benchmark suite).
//!
//! The driver is async and generic over [`Client`], one connection to the
//! system under test. Async, because most backends are (tonic, Redis) and
//! `rrpc-kv-bench` runs many clients as tokio tasks; a blocking backend
//! (RF-RPC's client, an in-process [`Execute`], see [`Inline`]) is a
//! `Client` whose future does its work when first polled, which suits a
//! single closed-loop client on a current-thread runtime (the benchmark
//! suite) or tokio's blocking pool (the binary). A generic trait rather than
//! a boxed one: each caller's backend enum is its own `Client`.
//!
//! A transaction's latency covers all its calls (a read-modify-write is its
//! read, then, if that succeeded, its write); it fails when a call fails or
//! the store answers [`OpResult::Failed`], and a failure is counted (in
//! [`Stats::errors`] and [`Errors`], which keeps the first message) instead
//! of timed. [`Errors::check`] turns "every operation failed" into
//! [`Error::AllFailed`].
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use rrpc_kv::store::{Store, StoreConfig};
//! use rrpc_kv::ycsb::driver::{self, Errors, Inline};
//! use rrpc_kv::ycsb::{Core, OpKind, Workload, WorkloadConfig};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let cfg = WorkloadConfig::builder(Core::A).records(50).operations(200).build()?;
//! let mut w = Workload::new(cfg)?;
//! let mut clients = vec![Inline(Arc::new(Store::open(StoreConfig::default())?))];
//! let errors = Arc::new(Errors::new());
//! let (stats, _) = driver::run_phase(&mut clients, driver::load_txns(&w), 1, &errors, |_| {}).await;
//! assert_eq!(stats.count(OpKind::Insert), 50);
//! let (stats, _) = driver::run_phase(&mut clients, driver::run_txns(w, 200), 1, &errors, |_| {}).await;
//! assert_eq!(stats.count(OpKind::Read) + stats.count(OpKind::Update), 200);
//! errors.check(400)?;
//! # Ok::<(), rrpc_kv::Error>(()) }).unwrap();
//! ```

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{OpKind, Stats, Txn, Workload};
use crate::error::{Error, Result};
use crate::op::{Execute, Op, OpResult};

/// One connection to the system under test, as the driver uses it.
pub trait Client: Send + 'static {
    /// A failure to carry out an operation (transport, protocol); the
    /// store's own failure is `Ok(OpResult::Failed)`.
    type Error: fmt::Display + Send;

    /// Carries out `op`.
    fn execute(&mut self, op: Op) -> impl Future<Output = Result<OpResult, Self::Error>> + Send;

    /// Carries out `ops` in order, as one request batch where the backend
    /// batches (the default: one at a time). The outer `Err` fails the
    /// whole batch; otherwise one result per op.
    fn execute_batch(
        &mut self,
        ops: Vec<Op>,
    ) -> impl Future<Output = Result<Vec<Result<OpResult, Self::Error>>, Self::Error>> + Send {
        async move {
            let mut out = Vec::with_capacity(ops.len());
            for op in ops {
                out.push(self.execute(op).await);
            }
            Ok(out)
        }
    }
}

/// A shared [`Execute`] (an in-process store) as a [`Client`], called
/// inline: the future blocks while it runs the operation.
#[derive(Debug)]
pub struct Inline<E: ?Sized>(pub Arc<E>);

impl<E: ?Sized> Clone for Inline<E> {
    fn clone(&self) -> Self {
        Inline(self.0.clone())
    }
}

impl<E: Execute + ?Sized> Client for Inline<E> {
    type Error = std::convert::Infallible;

    async fn execute(&mut self, op: Op) -> Result<OpResult, Self::Error> {
        Ok(self.0.execute(op))
    }
}

/// The failures of a run, shared by its clients: how many, and the first
/// one's message (`KIND: message`).
#[derive(Debug, Default)]
pub struct Errors {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Errors {
    /// None yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A failed transaction of `kind`.
    pub fn record(&self, kind: OpKind, e: impl fmt::Display) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(format!("{}: {e}", kind.name()));
        }
    }

    /// Failed transactions so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The first failure's message.
    pub fn first(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// [`Error::AllFailed`] when every one of `attempted` transactions (at
    /// least one) failed.
    pub fn check(&self, attempted: u64) -> Result<()> {
        let count = self.count();
        if count > 0 && count >= attempted {
            return Err(Error::AllFailed {
                count,
                attempted,
                first: self.first().unwrap_or_default(),
            });
        }
        Ok(())
    }
}

/// The load phase's transactions: one insert per record of `w`.
pub fn load_txns(w: &Workload) -> impl Iterator<Item = Txn> + Send + use<> {
    w.load().map(|op| Txn {
        kind: OpKind::Insert,
        op,
        then: None,
    })
}

/// The run phase's first `n` transactions of `w`, drawn lazily (a long run
/// is never held in memory).
pub fn run_txns(mut w: Workload, n: u64) -> impl Iterator<Item = Txn> + Send {
    (0..n).map(move |_| w.next_txn())
}

/// Runs one transaction on `c`, recording it in `stats` (and a failure in
/// `errors`).
pub async fn run_txn<C: Client>(c: &mut C, txn: Txn, stats: &mut Stats, errors: &Errors) {
    let t0 = Instant::now();
    let kind = txn.kind;
    let mut outcome = c.execute(txn.op).await;
    let read_ok = matches!(&outcome, Ok(r) if !matches!(r, OpResult::Failed(_)));
    if let (true, Some(then)) = (read_ok, txn.then) {
        outcome = c.execute(then).await;
    }
    match outcome {
        Ok(OpResult::Failed(m)) => {
            stats.record_error(kind);
            errors.record(kind, format_args!("store failed: {m}"));
        }
        Ok(_) => stats.record(kind, t0.elapsed()),
        Err(e) => {
            stats.record_error(kind);
            errors.record(kind, e);
        }
    }
}

/// Runs `txns` on `c` as one [`Client::execute_batch`] (a read-modify-write
/// is its read and its write, in order, in the batch), recording each with
/// the batch's latency. A read-modify-write's write runs even when its read
/// failed (it is already in the batch); the transaction fails either way.
pub async fn run_chunk<C: Client>(c: &mut C, txns: Vec<Txn>, stats: &mut Stats, errors: &Errors) {
    let t0 = Instant::now();
    let mut ops = Vec::with_capacity(txns.len() * 2);
    let mut owners = Vec::with_capacity(txns.len() * 2);
    for (i, t) in txns.iter().enumerate() {
        ops.push(t.op.clone());
        owners.push(i);
        if let Some(then) = &t.then {
            ops.push(then.clone());
            owners.push(i);
        }
    }
    let results = c.execute_batch(ops).await;
    let elapsed = t0.elapsed();
    let mut failed: Vec<Option<String>> = vec![None; txns.len()];
    match results {
        Ok(rs) if rs.len() == owners.len() => {
            for (r, &i) in rs.into_iter().zip(&owners) {
                let m = match r {
                    Ok(OpResult::Failed(m)) => Some(format!("store failed: {m}")),
                    Ok(_) => None,
                    Err(e) => Some(e.to_string()),
                };
                if failed[i].is_none() {
                    failed[i] = m;
                }
            }
        }
        Ok(rs) => failed.fill(Some(format!(
            "{} results for {} operations",
            rs.len(),
            owners.len()
        ))),
        Err(e) => failed.fill(Some(e.to_string())),
    }
    for (t, f) in txns.iter().zip(failed) {
        match f {
            None => stats.record(t.kind, elapsed),
            Some(m) => {
                stats.record_error(t.kind);
                errors.record(t.kind, m);
            }
        }
    }
}

/// Runs `txns` to exhaustion on every client, each a tokio task with one
/// transaction (or, with `chunk > 1`, one [`run_chunk`] of up to `chunk`
/// transactions) in flight: YCSB's closed loop. `progress` is told how many
/// transactions each step finished. The clients are handed back (in any
/// order) for the next phase. Returns the merged stats and the elapsed
/// time.
///
/// Must run inside a tokio runtime. A panic in a client task is resumed
/// here.
pub async fn run_phase<C, I, P>(
    clients: &mut Vec<C>,
    txns: I,
    chunk: usize,
    errors: &Arc<Errors>,
    progress: P,
) -> (Stats, Duration)
where
    C: Client,
    I: Iterator<Item = Txn> + Send + 'static,
    P: Fn(u64) + Clone + Send + 'static,
{
    let next = Arc::new(Mutex::new(txns));
    let take = move |n: usize| -> Vec<Txn> {
        let mut it = next.lock().unwrap_or_else(|p| p.into_inner());
        (&mut *it).take(n).collect()
    };
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut client in clients.drain(..) {
        let take = take.clone();
        let progress = progress.clone();
        let errors = errors.clone();
        tasks.spawn(async move {
            let mut stats = Stats::new();
            loop {
                let mut txns = take(chunk.max(1));
                let n = txns.len() as u64;
                if chunk > 1 && n > 0 {
                    run_chunk(&mut client, txns, &mut stats, &errors).await;
                } else if let Some(txn) = txns.pop() {
                    run_txn(&mut client, txn, &mut stats, &errors).await;
                } else {
                    break;
                }
                progress(n);
            }
            (client, stats)
        });
    }
    let mut total = Stats::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((client, stats)) => {
                total.merge(&stats);
                clients.push(client);
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Not cancelled by anyone: the set is ours.
            Err(_) => {}
        }
    }
    (total, start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreConfig};
    use crate::ycsb::{Core, WorkloadConfig};

    fn workload(core: Core, records: u64, ops: u64) -> Workload {
        let cfg = WorkloadConfig::builder(core)
            .records(records)
            .operations(ops)
            .value_size(64)
            .seed(3)
            .build()
            .unwrap();
        Workload::new(cfg).unwrap()
    }

    fn store() -> Store {
        Store::open(StoreConfig::default()).unwrap()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// Loads then runs `ops` transactions of `core` on `clients`.
    fn load_and_run<C: Client>(
        clients: &mut Vec<C>,
        core: Core,
        ops: u64,
        chunk: usize,
    ) -> (Stats, Stats, Arc<Errors>, Arc<Errors>) {
        let w = workload(core, 100, ops);
        let rt = rt();
        let (le, re) = (Arc::new(Errors::new()), Arc::new(Errors::new()));
        let (load, _) = rt.block_on(run_phase(clients, load_txns(&w), chunk, &le, |_| {}));
        let (run, _) = rt.block_on(run_phase(clients, run_txns(w, ops), chunk, &re, |_| {}));
        (load, run, le, re)
    }

    /// The reads and writes a store saw.
    #[derive(Clone)]
    struct Counting {
        store: Arc<Store>,
        gets: Arc<AtomicU64>,
        puts: Arc<AtomicU64>,
    }

    impl Client for Counting {
        type Error = std::convert::Infallible;
        async fn execute(&mut self, op: Op) -> Result<OpResult, Self::Error> {
            match &op {
                Op::Get { .. } => &self.gets,
                Op::Put { .. } => &self.puts,
                _ => &self.gets,
            }
            .fetch_add(1, Ordering::Relaxed);
            Ok(self.store.execute(op))
        }
    }

    #[test]
    fn counts_per_op_type_over_several_clients() {
        let s = Inline(Arc::new(store()));
        let mut clients = vec![s.clone(), s.clone(), s];
        let (load, run, le, re) = load_and_run(&mut clients, Core::B, 500, 1);
        assert_eq!(clients.len(), 3, "clients handed back");
        assert_eq!(load.count(OpKind::Insert), 100);
        assert_eq!((le.count(), re.count()), (0, 0), "{:?}", re.first());
        let (r, u) = (run.count(OpKind::Read), run.count(OpKind::Update));
        assert_eq!(r + u, 500);
        assert!(r > u && u > 0, "B is 95 % reads: {r} reads, {u} updates");
        // The same mix as the workload itself draws.
        let mut w = workload(Core::B, 100, 500);
        let updates = (0..500)
            .filter(|_| w.next_txn().kind == OpKind::Update)
            .count() as u64;
        assert_eq!(u, updates);
    }

    #[test]
    fn read_modify_write_is_a_read_then_a_write() {
        for chunk in [1, 8] {
            let c = Counting {
                store: Arc::new(store()),
                gets: Arc::default(),
                puts: Arc::default(),
            };
            let mut clients = vec![c.clone()];
            let (_, run, _, re) = load_and_run(&mut clients, Core::F, 400, chunk);
            assert_eq!(re.count(), 0, "{:?}", re.first());
            let rmw = run.count(OpKind::ReadModifyWrite);
            let reads = run.count(OpKind::Read);
            assert!(rmw > 0, "F has read-modify-writes");
            assert_eq!(rmw + reads, 400);
            assert_eq!(c.gets.load(Ordering::Relaxed), reads + rmw, "chunk {chunk}");
            assert_eq!(c.puts.load(Ordering::Relaxed), 100 + rmw, "chunk {chunk}");
        }
    }

    /// Fails every `nth` call (transport error), otherwise the store.
    struct Flaky {
        store: Store,
        nth: u64,
        calls: u64,
    }

    impl Client for Flaky {
        type Error = String;
        async fn execute(&mut self, op: Op) -> Result<OpResult, String> {
            self.calls += 1;
            if self.calls.is_multiple_of(self.nth) {
                return Err(format!("call {} lost", self.calls));
            }
            Ok(self.store.execute(op))
        }
    }

    #[test]
    fn failures_are_counted_not_timed() {
        for chunk in [1, 4] {
            let mut clients = vec![Flaky {
                store: store(),
                nth: 10,
                calls: 0,
            }];
            // Workload C: reads only, one call per transaction.
            let (load, run, le, re) = load_and_run(&mut clients, Core::C, 300, chunk);
            assert_eq!(le.count(), 10, "chunk {chunk}");
            assert_eq!(load.errors(OpKind::Insert), 10);
            assert_eq!(load.count(OpKind::Insert), 90);
            // Calls 101..=400: every 10th is lost (a read of a record
            // that was never loaded is NotFound, a success).
            assert_eq!(re.count(), 30, "chunk {chunk}");
            assert_eq!(run.errors(OpKind::Read), 30);
            assert_eq!(run.count(OpKind::Read), 270);
            assert_eq!(le.first().as_deref(), Some("INSERT: call 10 lost"));
            re.check(300).unwrap();
            le.check(100).unwrap();
        }
    }

    #[test]
    fn every_operation_failed_is_an_error() {
        let mut clients = vec![Flaky {
            store: store(),
            nth: 1,
            calls: 0,
        }];
        let (_, run, le, re) = load_and_run(&mut clients, Core::A, 50, 1);
        assert_eq!(run.errors(OpKind::Read) + run.errors(OpKind::Update), 50);
        match re.check(50) {
            Err(Error::AllFailed {
                count: 50,
                attempted: 50,
                first,
            }) => assert!(first.ends_with("call 101 lost"), "{first}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(le.check(100), Err(Error::AllFailed { .. })));
        // One success is enough; nothing attempted is no failure.
        let e = Errors::new();
        e.record(OpKind::Read, "x");
        assert!(e.check(2).is_ok() && e.check(1).is_err());
        assert!(Errors::new().check(0).is_ok());
    }
}
