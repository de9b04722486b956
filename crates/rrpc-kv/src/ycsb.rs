//! The YCSB core workloads A-F (RR-Compound §V-E, Table IV), sans-IO.
//!
//! A [`Workload`] yields the [`Op`]s of YCSB's load phase (one insert per
//! record) and then the transactions of its run phase, drawn from a seeded
//! PRNG: the same [`WorkloadConfig`] gives the same operations, whoever
//! executes them. Timing and I/O belong to the [`driver`] (which
//! `rrpc-kv-bench` and the `kv` benchmark suite run); [`Stats`] collects
//! its latencies.
//!
//! | workload | mix (Table IV) | key choice |
//! |---|---|---|
//! | A | 50 % read, 50 % update | zipfian |
//! | B | 95 % read, 5 % update | zipfian |
//! | C | 100 % read | zipfian |
//! | D | 95 % read, 5 % insert | latest |
//! | E | 95 % scan (length uniform 1..=100), 5 % insert | zipfian |
//! | F | 50 % read, 50 % read-modify-write | zipfian |
//!
//! As YCSB's `CoreWorkload` with its defaults: keys are `user` followed by
//! the FNV hash of the record number (`insertorder=hashed`); the zipfian is
//! YCSB's scrambled zipfian with constant 0.99 over the records plus twice
//! the expected inserts, redrawn while it names a record not yet inserted;
//! the uniform choice is over the loaded records; "latest" is YCSB's skewed
//! latest over the inserted records. The paper ran 20 000 records and 20 000
//! operations ([`WorkloadConfig::new`]'s defaults).
//!
//! Where this differs from YCSB: a record is one value of
//! [`WorkloadConfig::value_size`] bytes (YCSB: 10 fields of 100 bytes, the
//! same 1000 bytes by default), so an update writes the whole value; an
//! insert counts as acknowledged as soon as it is generated (YCSB waits for
//! its completion before reads may choose it).
//!
//! # Examples
//!
//! ```
//! use rrpc_kv::ycsb::{Core, OpKind, Stats, Workload, WorkloadConfig};
//! use std::time::Duration;
//!
//! let mut w = Workload::new(WorkloadConfig::builder(Core::B).records(100).operations(1000).seed(7).build()?)?;
//! let load: Vec<_> = w.load().collect(); // 100 PUTs
//! assert_eq!(load.len(), 100);
//! let mut stats = Stats::new();
//! for txn in w.run() {
//!     // ... execute txn.op (then txn.then, for a read-modify-write) and time it ...
//!     stats.record(txn.kind, Duration::from_micros(10));
//! }
//! assert_eq!(stats.count(OpKind::Read) + stats.count(OpKind::Update), 1000);
//! # Ok::<(), rrpc_kv::Error>(())
//! ```

pub mod driver;
mod generator;
#[cfg(feature = "redis")]
pub mod redis;
mod stats;

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

pub use generator::{Latest, Rng, ScrambledZipfian, ZIPFIAN_CONSTANT, Zipfian, fnv_hash64};
pub use stats::{Stats, Summary};

use crate::error::{Error, Result};
use crate::op::{MAX_KEY_LEN, MAX_VALUE_LEN, Op};

/// One of YCSB's core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Core {
    /// Update heavy: 50 % read, 50 % update.
    A,
    /// Read mostly: 95 % read, 5 % update.
    B,
    /// Read only.
    C,
    /// Read latest inserts: 95 % read, 5 % insert, "latest" keys.
    D,
    /// Short range scans: 95 % scan, 5 % insert.
    E,
    /// Read-modify-write: 50 % read, 50 % read-modify-write.
    F,
}

impl Core {
    /// All six.
    pub const ALL: [Core; 6] = [Core::A, Core::B, Core::C, Core::D, Core::E, Core::F];

    /// The mix of Table IV.
    pub fn mix(self) -> Mix {
        let m = |read, update, insert, scan, read_modify_write| Mix {
            read,
            update,
            insert,
            scan,
            read_modify_write,
        };
        match self {
            Core::A => m(0.5, 0.5, 0.0, 0.0, 0.0),
            Core::B => m(0.95, 0.05, 0.0, 0.0, 0.0),
            Core::C => m(1.0, 0.0, 0.0, 0.0, 0.0),
            Core::D => m(0.95, 0.0, 0.05, 0.0, 0.0),
            Core::E => m(0.0, 0.0, 0.05, 0.95, 0.0),
            Core::F => m(0.5, 0.0, 0.0, 0.0, 0.5),
        }
    }

    /// YCSB's request distribution for the workload.
    pub fn distribution(self) -> Distribution {
        match self {
            Core::D => Distribution::Latest,
            _ => Distribution::Zipfian,
        }
    }
}

impl fmt::Display for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = match self {
            Core::A => 'a',
            Core::B => 'b',
            Core::C => 'c',
            Core::D => 'd',
            Core::E => 'e',
            Core::F => 'f',
        };
        write!(f, "{c}")
    }
}

impl FromStr for Core {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("workload").unwrap_or(&s);
        Ok(match s {
            "a" => Core::A,
            "b" => Core::B,
            "c" => Core::C,
            "d" => Core::D,
            "e" => Core::E,
            "f" => Core::F,
            _ => {
                return Err(Error::InvalidConfig(format!(
                    "unknown workload {s:?} (a, b, c, d, e or f)"
                )));
            }
        })
    }
}

/// Proportions of the operation types (they add up to 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    /// Reads.
    pub read: f64,
    /// Updates of an existing record.
    pub update: f64,
    /// Inserts of a new record.
    pub insert: f64,
    /// Short scans.
    pub scan: f64,
    /// Read-modify-writes.
    pub read_modify_write: f64,
}

/// How keys are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// YCSB's scrambled zipfian, constant 0.99.
    Zipfian,
    /// Uniform over the loaded records.
    Uniform,
    /// YCSB's skewed latest: recent inserts are the most popular.
    Latest,
}

impl FromStr for Distribution {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "zipfian" => Ok(Distribution::Zipfian),
            "uniform" => Ok(Distribution::Uniform),
            "latest" => Ok(Distribution::Latest),
            other => Err(Error::InvalidConfig(format!(
                "unknown distribution {other:?} (zipfian, uniform or latest)"
            ))),
        }
    }
}

/// The operation types YCSB reports separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// A GET of one record.
    Read = 0,
    /// A PUT over an existing record.
    Update = 1,
    /// A PUT of a new record (and every PUT of the load phase).
    Insert = 2,
    /// A SCAN.
    Scan = 3,
    /// A GET then a PUT of the same record, timed together.
    ReadModifyWrite = 4,
}

impl OpKind {
    /// All of them, in report order.
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::Scan,
        OpKind::ReadModifyWrite,
    ];

    /// YCSB's name for it.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Insert => "INSERT",
            OpKind::Scan => "SCAN",
            OpKind::ReadModifyWrite => "RMW",
        }
    }
}

/// One run-phase transaction: one operation, or for a read-modify-write the
/// read and then the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    /// Its type.
    pub kind: OpKind,
    /// The operation (the read of a read-modify-write).
    pub op: Op,
    /// A read-modify-write's write, to be issued after `op` completes.
    pub then: Option<Op>,
}

/// What to run. Built like every rrpc config (docs/architecture.md,
/// "Configuration convention"): [`WorkloadConfig::builder`], setters on
/// [`WorkloadConfigBuilder`], [`build`](WorkloadConfigBuilder::build)
/// validates (and [`Workload::new`] again).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadConfig {
    core: Core,
    records: u64,
    operations: u64,
    value_size: usize,
    distribution: Distribution,
    max_scan_len: u32,
    seed: u64,
}

impl WorkloadConfig {
    /// Workload `core` with the paper's 20 000 records and 20 000 operations
    /// (RR-Compound §V-E), 1000-byte values (YCSB's 10 × 100 bytes), the
    /// workload's own distribution, scans of at most 100 entries (YCSB's
    /// `maxscanlength`) and seed 0.
    pub fn new(core: Core) -> Self {
        WorkloadConfig {
            core,
            records: 20_000,
            operations: 20_000,
            value_size: 1000,
            distribution: core.distribution(),
            max_scan_len: 100,
            seed: 0,
        }
    }

    /// A builder starting from [`WorkloadConfig::new`]'s defaults for `core`
    /// (docs/architecture.md, "Configuration convention").
    pub fn builder(core: Core) -> WorkloadConfigBuilder {
        WorkloadConfigBuilder {
            cfg: WorkloadConfig::new(core),
        }
    }

    /// A builder starting from this config.
    pub fn to_builder(&self) -> WorkloadConfigBuilder {
        WorkloadConfigBuilder { cfg: self.clone() }
    }

    /// The workload.
    pub fn core(&self) -> Core {
        self.core
    }

    /// Records of the load phase.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Transactions of the run phase.
    pub fn operations(&self) -> u64 {
        self.operations
    }

    /// The key choice.
    pub fn distribution(&self) -> Distribution {
        self.distribution
    }

    /// Bytes per value.
    pub fn value_size(&self) -> usize {
        self.value_size
    }

    /// Longest scan.
    pub fn max_scan_len(&self) -> u32 {
        self.max_scan_len
    }

    /// The PRNG seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn validate(&self) -> Result<()> {
        if self.records == 0 {
            return Err(Error::InvalidConfig("records must be at least 1".into()));
        }
        if self.value_size > MAX_VALUE_LEN {
            return Err(Error::InvalidConfig(format!(
                "value size {} is over the store's limit of {MAX_VALUE_LEN}",
                self.value_size
            )));
        }
        if self.max_scan_len == 0 || self.max_scan_len > crate::op::MAX_SCAN {
            return Err(Error::InvalidConfig(format!(
                "max scan length {} is not in 1..={}",
                self.max_scan_len,
                crate::op::MAX_SCAN
            )));
        }
        Ok(())
    }
}

/// Builder for [`WorkloadConfig`]; [`build`](Self::build) validates.
#[derive(Debug, Clone)]
pub struct WorkloadConfigBuilder {
    cfg: WorkloadConfig,
}

impl WorkloadConfigBuilder {
    /// Records inserted by the load phase.
    pub fn records(mut self, n: u64) -> Self {
        self.cfg.records = n;
        self
    }

    /// Transactions of the run phase.
    pub fn operations(mut self, n: u64) -> Self {
        self.cfg.operations = n;
        self
    }

    /// Bytes per value.
    pub fn value_size(mut self, n: usize) -> Self {
        self.cfg.value_size = n;
        self
    }

    /// Key choice for reads, updates and scans (inserts always take the next
    /// record). `Zipfian` or `Uniform` on workload D replaces "latest".
    pub fn distribution(mut self, d: Distribution) -> Self {
        self.cfg.distribution = d;
        self
    }

    /// Longest scan (lengths are uniform in `1..=n`).
    pub fn max_scan_len(mut self, n: u32) -> Self {
        self.cfg.max_scan_len = n;
        self
    }

    /// The PRNG seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.cfg.seed = seed;
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: no
    /// records, a value over the store's limit, a scan length outside
    /// `1..=MAX_SCAN`.
    pub fn build(self) -> Result<WorkloadConfig> {
        self.cfg.validate()?;
        Ok(self.cfg)
    }
}

/// YCSB's key for record `n`: `user` and the FNV hash of `n`.
pub fn key(n: u64) -> Bytes {
    let k = format!("user{}", fnv_hash64(n));
    debug_assert!(k.len() <= MAX_KEY_LEN);
    Bytes::from(k)
}

/// A record's value: `len` printable bytes drawn from `rng`.
fn value(rng: &mut Rng, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let mut r = rng.next_u64();
        for _ in 0..8 {
            if v.len() == len {
                break;
            }
            // 64 printable ASCII characters, '0'..='o'.
            v.push(b'0' + (r & 63) as u8);
            r >>= 6;
        }
    }
    Bytes::from(v)
}

enum Chooser {
    Zipfian(ScrambledZipfian),
    Uniform,
    Latest(Latest),
}

impl fmt::Debug for Chooser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Chooser::Zipfian(_) => "Zipfian",
            Chooser::Uniform => "Uniform",
            Chooser::Latest(_) => "Latest",
        })
    }
}

/// The operations of one workload: [`Workload::load`] for the load phase,
/// then [`Workload::next_txn`] (or [`Workload::run`]) for the run phase.
#[derive(Debug)]
pub struct Workload {
    cfg: WorkloadConfig,
    rng: Rng,
    chooser: Chooser,
    /// Records inserted so far (load phase and run-phase inserts).
    inserted: u64,
    /// Cumulative thresholds of read, update, insert, scan (RMW the rest).
    thresholds: [f64; 4],
}

impl Workload {
    /// The workload of `cfg`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`]: no records, a value over the store's limit,
    /// a scan length out of `1..=MAX_SCAN`.
    pub fn new(cfg: WorkloadConfig) -> Result<Self> {
        cfg.validate()?;
        let mix = cfg.core.mix();
        let expected_inserts = (cfg.operations as f64 * mix.insert * 2.0) as u64;
        let chooser = match cfg.distribution {
            Distribution::Zipfian => {
                Chooser::Zipfian(ScrambledZipfian::new(cfg.records + expected_inserts))
            }
            Distribution::Uniform => Chooser::Uniform,
            Distribution::Latest => Chooser::Latest(Latest::new(cfg.records - 1)),
        };
        let t0 = mix.read;
        let t1 = t0 + mix.update;
        let t2 = t1 + mix.insert;
        let t3 = t2 + mix.scan;
        Ok(Workload {
            rng: Rng::new(cfg.seed),
            chooser,
            inserted: cfg.records,
            thresholds: [t0, t1, t2, t3],
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &WorkloadConfig {
        &self.cfg
    }

    /// The load phase: one PUT per record, records `0..records` in order,
    /// values drawn from a PRNG of their own (seeded from the workload's
    /// seed), so loading does not change the run phase.
    pub fn load(&self) -> impl Iterator<Item = Op> + use<> {
        let mut rng = Rng::new(self.cfg.seed ^ 0x4C4F_4144); // "LOAD"
        let len = self.cfg.value_size;
        (0..self.cfg.records).map(move |n| Op::Put {
            key: key(n),
            value: value(&mut rng, len),
        })
    }

    /// The run phase: [`WorkloadConfig::operations`] transactions.
    pub fn run(&mut self) -> impl Iterator<Item = Txn> + '_ {
        let n = self.cfg.operations;
        (0..n).map(move |_| self.next_txn())
    }

    /// Records inserted so far, the load phase's included.
    pub fn inserted(&self) -> u64 {
        self.inserted
    }

    /// A record that exists, by the workload's key choice.
    fn choose(&mut self) -> u64 {
        let latest = self.inserted - 1;
        match &mut self.chooser {
            Chooser::Uniform => self.rng.below(self.cfg.records),
            Chooser::Latest(l) => l.next(&mut self.rng, latest),
            Chooser::Zipfian(z) => loop {
                // YCSB redraws a record that was not inserted yet.
                let n = z.next(&mut self.rng);
                if n <= latest {
                    break n;
                }
            },
        }
    }

    /// The next run-phase transaction.
    pub fn next_txn(&mut self) -> Txn {
        let u = self.rng.next_f64();
        let [t0, t1, t2, t3] = self.thresholds;
        let len = self.cfg.value_size;
        let single = |kind, op| Txn {
            kind,
            op,
            then: None,
        };
        if u < t0 {
            let key = key(self.choose());
            single(OpKind::Read, Op::Get { key })
        } else if u < t1 {
            let key = key(self.choose());
            let value = value(&mut self.rng, len);
            single(OpKind::Update, Op::Put { key, value })
        } else if u < t2 {
            let key = key(self.inserted);
            self.inserted += 1;
            let value = value(&mut self.rng, len);
            single(OpKind::Insert, Op::Put { key, value })
        } else if u < t3 {
            let start = key(self.choose());
            let count = 1 + self.rng.below(u64::from(self.cfg.max_scan_len)) as u32;
            single(OpKind::Scan, Op::Scan { start, count })
        } else {
            let key = key(self.choose());
            let value = value(&mut self.rng, len);
            Txn {
                kind: OpKind::ReadModifyWrite,
                op: Op::Get { key: key.clone() },
                then: Some(Op::Put { key, value }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn counts(core: Core, n: u64) -> HashMap<OpKind, u64> {
        let mut w = Workload::new(
            WorkloadConfig::builder(core)
                .operations(n)
                .value_size(8)
                .build()
                .unwrap(),
        )
        .unwrap();
        let mut c = HashMap::new();
        for t in w.run() {
            *c.entry(t.kind).or_default() += 1;
        }
        c
    }

    #[test]
    fn mixes_match_table_iv() {
        let n = 100_000;
        for core in Core::ALL {
            let mix = core.mix();
            let c = counts(core, n);
            for (kind, want) in [
                (OpKind::Read, mix.read),
                (OpKind::Update, mix.update),
                (OpKind::Insert, mix.insert),
                (OpKind::Scan, mix.scan),
                (OpKind::ReadModifyWrite, mix.read_modify_write),
            ] {
                let got = *c.get(&kind).unwrap_or(&0) as f64 / n as f64;
                assert!(
                    (got - want).abs() < 0.01,
                    "workload {core}: {kind:?} {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn ops_are_well_formed() {
        for core in Core::ALL {
            let mut w = Workload::new(
                WorkloadConfig::builder(core)
                    .records(100)
                    .operations(2000)
                    .value_size(32)
                    .build()
                    .unwrap(),
            )
            .unwrap();
            for op in w.load() {
                op.validate().unwrap();
                assert!(op.key().starts_with(b"user"));
            }
            for t in w.run() {
                t.op.validate().unwrap();
                match (&t.kind, &t.op, &t.then) {
                    (OpKind::Read, Op::Get { .. }, None) => {}
                    (OpKind::Update | OpKind::Insert, Op::Put { value, .. }, None) => {
                        assert_eq!(value.len(), 32)
                    }
                    (OpKind::Scan, Op::Scan { count, .. }, None) => {
                        assert!((1..=100).contains(count))
                    }
                    (OpKind::ReadModifyWrite, Op::Get { key }, Some(Op::Put { key: k2, .. })) => {
                        assert_eq!(key, k2)
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn inserts_take_new_records_and_reads_only_existing_ones() {
        let records = 50;
        let mut w = Workload::new(
            WorkloadConfig::builder(Core::D)
                .records(records)
                .operations(5000)
                .build()
                .unwrap(),
        )
        .unwrap();
        let mut existing: std::collections::HashSet<Bytes> = (0..records).map(key).collect();
        for t in w.run() {
            match t.kind {
                OpKind::Insert => assert!(existing.insert(t.op.key().clone()), "a new key"),
                _ => assert!(existing.contains(t.op.key()), "an existing key"),
            }
        }
        assert!(existing.len() > records as usize + 150);
    }

    #[test]
    fn deterministic_per_seed() {
        let cfg = WorkloadConfig::builder(Core::A)
            .operations(1000)
            .seed(42)
            .build()
            .unwrap();
        let a: Vec<Txn> = Workload::new(cfg.clone()).unwrap().run().collect();
        let b: Vec<Txn> = Workload::new(cfg.clone()).unwrap().run().collect();
        let c: Vec<Txn> = Workload::new(cfg.to_builder().seed(43).build().unwrap())
            .unwrap()
            .run()
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let w = Workload::new(
            WorkloadConfig::builder(Core::E)
                .records(10)
                .build()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(w.load().collect::<Vec<_>>(), w.load().collect::<Vec<_>>());
    }

    fn hottest_share(d: Distribution) -> f64 {
        let n = 100_000;
        let mut w = Workload::new(
            WorkloadConfig::builder(Core::C)
                .records(1000)
                .operations(n)
                .distribution(d)
                .build()
                .unwrap(),
        )
        .unwrap();
        let mut c: HashMap<Bytes, u64> = HashMap::new();
        for t in w.run() {
            *c.entry(t.op.key().clone()).or_default() += 1;
        }
        *c.values().max().unwrap() as f64 / n as f64
    }

    #[test]
    fn zipfian_is_skewed_uniform_is_not() {
        // Scrambled zipfian over 10^10 items: the hottest gets 1/ζ ≈ 3.8 %,
        // plus its even share of the hashed tail.
        let z = hottest_share(Distribution::Zipfian);
        assert!((0.03..0.05).contains(&z), "zipfian hottest {z}");
        let u = hottest_share(Distribution::Uniform);
        assert!(u < 0.003, "uniform hottest {u}");
    }

    #[test]
    fn latest_favours_recent_inserts() {
        let records = 10_000;
        let mut w = Workload::new(
            WorkloadConfig::builder(Core::D)
                .records(records)
                .operations(100_000)
                .build()
                .unwrap(),
        )
        .unwrap();
        let (mut reads, mut recent) = (0u64, 0u64);
        let mut newest: Vec<Bytes> = Vec::new();
        for t in w.run() {
            match t.kind {
                OpKind::Insert => {
                    newest.push(t.op.key().clone());
                    if newest.len() > 10 {
                        newest.remove(0);
                    }
                }
                _ => {
                    reads += 1;
                    // The ten newest records, the initial ones counting
                    // until inserts replace them.
                    let latest = w_latest_keys(&newest, records);
                    if latest.contains(t.op.key()) {
                        recent += 1;
                    }
                }
            }
        }
        let share = recent as f64 / reads as f64;
        // Zipfian ranks 0..10 of ~10^4 items carry ζ(10)/ζ(10^4) ≈ 0.3.
        assert!(share > 0.25, "share of reads on the 10 newest: {share}");
    }

    fn w_latest_keys(newest: &[Bytes], records: u64) -> Vec<Bytes> {
        let mut v: Vec<Bytes> = newest.to_vec();
        let missing = 10 - v.len() as u64;
        v.extend((records - missing..records).map(key));
        v
    }

    #[test]
    fn bad_configs_are_refused() {
        let err = |b: WorkloadConfigBuilder| b.build().unwrap_err().to_string();
        assert!(
            err(WorkloadConfig::builder(Core::A).records(0)).contains("records must be at least 1")
        );
        let e = err(WorkloadConfig::builder(Core::A).value_size(MAX_VALUE_LEN + 1));
        assert!(e.contains("value size") && e.contains("limit"), "{e}");
        let e = err(WorkloadConfig::builder(Core::E).max_scan_len(0));
        assert!(e.contains("max scan length 0"), "{e}");
        // Workload::new checks a config again (one made by to_builder too).
        let ok = WorkloadConfig::builder(Core::A).records(5).build().unwrap();
        assert!(Workload::new(ok.clone()).is_ok());
        assert_eq!(ok.to_builder().seed(3).build().unwrap().records(), 5);
        assert!("g".parse::<Core>().is_err());
        assert_eq!("WorkloadB".parse::<Core>().unwrap(), Core::B);
        assert!("pareto".parse::<Distribution>().is_err());
    }
}
