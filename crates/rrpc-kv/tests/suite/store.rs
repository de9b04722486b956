//! The in-memory store: bucket LRU, the memory bound, scans, configuration,
//! and a model check against a `BTreeMap`.

use bytes::Bytes;
use proptest::prelude::*;
use rrpc_kv::store::{Engine, MAX_PARTITIONS, PartitionStats, Store, StoreConfig};
use rrpc_kv::{Error, Execute, Op, OpResult};

use crate::store_model;
use store_model::{check_against_model, model_op};

fn b(s: impl AsRef<[u8]>) -> Bytes {
    Bytes::copy_from_slice(s.as_ref())
}

fn put(s: &Store, k: impl AsRef<[u8]>, v: impl AsRef<[u8]>) -> OpResult {
    s.execute(Op::Put {
        key: b(k),
        value: b(v),
    })
}

fn get(s: &Store, k: impl AsRef<[u8]>) -> OpResult {
    s.execute(Op::Get { key: b(k) })
}

fn scan(s: &Store, start: impl AsRef<[u8]>, count: u32) -> Vec<(Bytes, Bytes)> {
    match s.execute(Op::Scan {
        start: b(start),
        count,
    }) {
        OpResult::Entries(e) => e,
        r => panic!("scan: {r:?}"),
    }
}

fn mem(partitions: usize, bound: usize) -> Store {
    Store::open(
        StoreConfig::builder()
            .partitions(partitions)
            .memory_bound(bound)
            .build()
            .unwrap(),
    )
    .unwrap()
}

/// `n` distinct keys that share one bucket of partition 0.
fn same_bucket_keys(s: &Store, n: usize) -> Vec<Bytes> {
    s.with_partition(0, |p| {
        let target = p.bucket_of(b"probe").unwrap();
        let mut keys = Vec::new();
        for i in 0.. {
            let k = format!("key{i}");
            if p.owns(k.as_bytes()) && p.bucket_of(k.as_bytes()) == Some(target) {
                keys.push(b(k));
                if keys.len() == n {
                    break;
                }
            }
        }
        keys
    })
}

#[test]
fn full_bucket_evicts_exactly_its_least_recent_slot() {
    let s = mem(1, 64 << 10);
    assert!(s.with_partition(0, |p| p.buckets()) > 1);
    let k = same_bucket_keys(&s, 11);
    for (i, key) in k[..8].iter().enumerate() {
        assert_eq!(put(&s, key, format!("v{i}")), OpResult::Ok);
    }
    let bucket = s.with_partition(0, |p| p.bucket_of(&k[0]).unwrap());
    // Most recent first: k7 .. k0.
    let order: Vec<_> = k[..8].iter().rev().cloned().collect();
    assert_eq!(s.with_partition(0, |p| p.bucket_keys(bucket)), order);

    // A GET hit refreshes k0; the ninth key then evicts k1, not k0.
    assert_eq!(get(&s, &k[0]), OpResult::Value(b("v0")));
    assert_eq!(put(&s, &k[8], "v8"), OpResult::Ok);
    assert_eq!(get(&s, &k[1]), OpResult::NotFound);
    for (i, key) in k.iter().enumerate().take(9) {
        if i != 1 {
            assert_eq!(get(&s, key), OpResult::Value(b(format!("v{i}"))), "key {i}");
        }
    }
    assert_eq!(s.stats()[0].evictions, 1);

    // A PUT of an existing key refreshes it too (and evicts nothing).
    // Recency now (GETs above): k8 k7 .. k2 k0 → least recent is k0.
    assert_eq!(put(&s, &k[0], "v0'"), OpResult::Ok);
    assert_eq!(s.stats()[0].evictions, 1);
    // Least recent is now k2.
    assert_eq!(put(&s, &k[9], "v9"), OpResult::Ok);
    assert_eq!(get(&s, &k[2]), OpResult::NotFound);
    assert_eq!(get(&s, &k[0]), OpResult::Value(b("v0'")));
    assert_eq!(s.stats()[0].evictions, 2);

    // A miss changes nothing; the next eviction takes k3.
    assert_eq!(get(&s, &k[10]), OpResult::NotFound);
    assert_eq!(put(&s, &k[10], "v10"), OpResult::Ok);
    assert_eq!(get(&s, &k[3]), OpResult::NotFound);
    assert_eq!(s.with_partition(0, |p| p.bucket_keys(bucket)).len(), 8);
    let st = s.stats()[0];
    assert_eq!(st.evictions, 3);
    assert_eq!(st.entries, 8);
}

#[test]
fn delete_frees_a_slot() {
    let s = mem(1, 64 << 10);
    let k = same_bucket_keys(&s, 9);
    for key in &k[..8] {
        put(&s, key, "v");
    }
    assert_eq!(s.execute(Op::Delete { key: k[3].clone() }), OpResult::Ok);
    assert_eq!(
        s.execute(Op::Delete { key: k[3].clone() }),
        OpResult::NotFound
    );
    put(&s, &k[8], "v");
    assert_eq!(s.stats()[0].evictions, 0);
    assert_eq!(get(&s, &k[0]), OpResult::Value(b("v")));
}

/// xorshift64*, deterministic.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn memory_bound_holds_under_a_long_random_put_stream() {
    let bound = 96 << 10;
    let s = mem(3, bound);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..30_000u32 {
        let k = format!("user{}", rng.below(5000));
        let len = match rng.below(10) {
            0 => rng.below(8000),
            _ => rng.below(200),
        } as usize;
        let v = vec![(i % 251) as u8; len];
        assert_eq!(put(&s, &k, &v), OpResult::Ok, "put {i}");
        // The entry just written is there (it was made the most recent).
        assert_eq!(get(&s, &k), OpResult::Value(Bytes::from(v)));
        if i % 5 == 0 {
            s.execute(Op::Delete {
                key: b(format!("user{}", rng.below(5000))),
            });
        }
        let st = s.stats();
        for p in &st {
            assert!(p.bytes <= p.bound, "put {i}: {p:?}");
        }
        let total = PartitionStats::sum(&st);
        assert!(total.bound <= bound);
        assert!(total.bytes <= bound);
    }
    let total = PartitionStats::sum(&s.stats());
    assert!(total.evictions > 1000, "{total:?}");
    // The ordered index agrees with the buckets after all the evictions.
    assert_eq!(scan(&s, "", 1000).len(), total.entries.min(1000));
}

#[test]
fn oversize_value_is_refused_and_the_old_value_kept() {
    let s = mem(1, 8 << 10);
    assert_eq!(put(&s, "k", "small"), OpResult::Ok);
    let before = s.stats()[0];
    match put(&s, "k", vec![7u8; 8 << 10]) {
        OpResult::Failed(m) => assert!(m.contains("over the limit"), "{m}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(get(&s, "k"), OpResult::Value(b("small")));
    let after = s.stats()[0];
    assert_eq!((after.bytes, after.entries), (before.bytes, before.entries));
    // A value over the protocol's limit is refused too.
    assert!(matches!(
        put(&s, "k2", vec![0u8; rrpc_kv::op::MAX_VALUE_LEN + 1]),
        OpResult::Failed(_)
    ));
    // The largest entry that fits is accepted (and evicts all else).
    let fit = after.bound - 2 - rrpc_kv::store::ENTRY_OVERHEAD;
    assert_eq!(put(&s, "k2", vec![1u8; fit]), OpResult::Ok);
    assert_eq!(get(&s, "k"), OpResult::NotFound);
    assert_eq!(s.stats()[0].bytes, after.bound);
}

#[test]
fn bad_configs_are_invalid() {
    let bad = [
        StoreConfig::builder().partitions(0).build().unwrap(),
        StoreConfig::builder()
            .partitions(MAX_PARTITIONS + 1)
            .build()
            .unwrap(),
        StoreConfig::builder().memory_bound(100).build().unwrap(),
        StoreConfig::builder()
            .partitions(4)
            .memory_bound(4 * 4096 - 1)
            .build()
            .unwrap(),
    ];
    for cfg in bad {
        let r = Store::open(cfg.clone());
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{cfg:?}: {r:?}");
    }
    let s = Store::open(
        StoreConfig::builder()
            .partitions(4)
            .memory_bound(4 * 4096)
            .build()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(s.partitions(), 4);
    let d = Store::open(
        StoreConfig::builder()
            .memory_bound(64 << 20)
            .build()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        d.partitions(),
        std::thread::available_parallelism().unwrap().get()
    );
    assert_eq!(d.engine(), &Engine::Memory);
}

#[test]
fn keys_route_to_their_partition() {
    let s = mem(4, 1 << 20);
    let mut seen = [false; 4];
    for i in 0..100 {
        let k = format!("k{i}");
        let p = s.partition_of(k.as_bytes());
        seen[p] = true;
        put(&s, &k, "v");
        assert!(s.with_partition(p, |part| part.get(k.as_bytes()).unwrap().is_some()));
        let other = (p + 1) % 4;
        assert!(matches!(
            s.with_partition(other, |part| part.put(k.as_bytes(), b"v")),
            Err(Error::InvalidConfig(_))
        ));
    }
    assert_eq!(seen, [true; 4]);
    assert_eq!(PartitionStats::sum(&s.stats()).entries, 100);
}

#[test]
fn scans_merge_partitions_in_key_order() {
    let s = mem(4, 4 << 20);
    for i in 0..200 {
        put(&s, format!("k{i:03}"), format!("v{i}"));
    }
    let keys = |e: &[(Bytes, Bytes)]| -> Vec<String> {
        e.iter()
            .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
            .collect()
    };
    let e = scan(&s, "k050", 10);
    assert_eq!(
        keys(&e),
        (50..60).map(|i| format!("k{i:03}")).collect::<Vec<_>>()
    );
    assert_eq!(e[0].1, b("v50"));
    // Start between keys, count past the end.
    let e = scan(&s, "k1905", 100);
    assert_eq!(
        keys(&e),
        (191..200).map(|i| format!("k{i:03}")).collect::<Vec<_>>()
    );
    assert_eq!(scan(&s, "", 1000).len(), 200);
    assert_eq!(scan(&s, "l", 10), vec![]);
    assert_eq!(scan(&s, "", 0), vec![]);
    // Every partition holds some of the keys, so this was a real merge.
    assert!(s.stats().iter().all(|p| p.entries > 20));
    // Deleted keys are gone from scans.
    for i in (0..200).step_by(2) {
        s.execute(Op::Delete {
            key: b(format!("k{i:03}")),
        });
    }
    let e = scan(&s, "k010", 5);
    assert_eq!(keys(&e), ["k011", "k013", "k015", "k017", "k019"]);
    assert!(matches!(
        s.execute(Op::Scan {
            start: b(""),
            count: rrpc_kv::op::MAX_SCAN + 1
        }),
        OpResult::Failed(_)
    ));
}

#[test]
fn scans_after_evictions_return_exactly_the_live_keys() {
    let s = mem(2, 16 << 10);
    for i in 0..2000 {
        put(&s, format!("k{i:05}"), vec![0u8; i % 300]);
    }
    let total = PartitionStats::sum(&s.stats());
    assert!(total.evictions > 0);
    let all = scan(&s, "", 1000);
    assert_eq!(all.len(), total.entries);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
    for (k, v) in &all {
        assert_eq!(get(&s, k), OpResult::Value(v.clone()));
    }
    let from = &all[all.len() / 2].0;
    let tail = scan(&s, from, 3);
    assert_eq!(tail, all[all.len() / 2..all.len() / 2 + 3].to_vec());
    // Partition scans cover their own keys only.
    let p0 = s.with_partition(0, |p| p.scan(b"", 1000).unwrap());
    assert_eq!(p0.len(), s.stats()[0].entries);
    assert!(p0.iter().all(|(k, _)| s.partition_of(k) == 0));
}

#[test]
fn store_is_shared_across_threads() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<Store>();
    let s = mem(4, 4 << 20);
    std::thread::scope(|sc| {
        for t in 0..4 {
            let s = s.clone();
            sc.spawn(move || {
                for i in 0..500 {
                    assert_eq!(put(&s, format!("t{t}-{i}"), "v"), OpResult::Ok);
                }
            });
        }
    });
    assert_eq!(PartitionStats::sum(&s.stats()).entries, 2000);
    // Debug is a summary, not the entries.
    let d = format!("{s:?}");
    assert!(d.contains("partitions: 4") && !d.contains("t0-1"), "{d}");
}

proptest! {
    #[test]
    fn memory_engine_matches_a_btreemap(
        partitions in 1usize..5,
        ops in proptest::collection::vec(model_op(), 1..200),
    ) {
        let s = mem(partitions, 64 << 20);
        check_against_model(&s, &ops)?;
    }
}

#[test]
fn bound_eviction_takes_the_target_bucket_first_then_the_clock() {
    // One partition of 8 KiB: a few buckets, an entry budget of a few KiB.
    let s = mem(1, 8 << 10);
    let bound = s.stats()[0].bound;
    let a = same_bucket_keys(&s, 4);
    let others: Vec<Bytes> = (0..)
        .map(|i| b(format!("other{i}")))
        .filter(|k| s.with_partition(0, |p| p.bucket_of(k) != p.bucket_of(&a[0])))
        .take(6)
        .collect();
    for k in &a[..3] {
        assert_eq!(put(&s, k, [1u8; 10]), OpResult::Ok);
    }
    for k in &others {
        assert_eq!(put(&s, k, [2u8; 10]), OpResult::Ok);
    }
    let small = s.stats()[0].bytes / 9;
    // Make a[0] the most recent of its bucket: the order is a0 a2 a1.
    assert_eq!(get(&s, &a[0]), OpResult::Value(b([1u8; 10])));
    // A fourth key of the bucket that needs two small entries' room.
    let free = bound - s.stats()[0].bytes;
    let size_a1 = a[1].len() + 10 + rrpc_kv::store::ENTRY_OVERHEAD;
    let need = free + size_a1 + 1;
    let v = vec![3u8; need - a[3].len() - rrpc_kv::store::ENTRY_OVERHEAD];
    assert_eq!(put(&s, &a[3], &v), OpResult::Ok);
    assert_eq!(get(&s, &a[1]), OpResult::NotFound);
    assert_eq!(get(&s, &a[2]), OpResult::NotFound);
    assert_eq!(get(&s, &a[0]), OpResult::Value(b([1u8; 10])));
    for k in &others {
        assert_eq!(get(&s, k), OpResult::Value(b([2u8; 10])), "{k:?}");
    }
    assert_eq!(s.stats()[0].evictions, 2);
    // An entry needing more than its bucket holds: the bucket empties, then
    // the clock takes the least recent slots of other buckets.
    let v = vec![4u8; bound - 3 * small - a[1].len() - rrpc_kv::store::ENTRY_OVERHEAD];
    assert_eq!(put(&s, &a[1], &v), OpResult::Ok);
    assert_eq!(get(&s, &a[0]), OpResult::NotFound);
    assert_eq!(get(&s, &a[3]), OpResult::NotFound);
    let st = s.stats()[0];
    assert!(st.bytes <= st.bound);
    let kept = others
        .iter()
        .filter(|k| get(&s, k) != OpResult::NotFound)
        .count();
    assert!((1..6).contains(&kept), "{kept} of the other keys kept");
}

#[derive(Debug, Clone)]
enum EvictOp {
    Get(u8),
    Put(u8, usize),
    Delete(u8),
    Scan(u8, u32),
}

fn evict_op() -> impl Strategy<Value = EvictOp> {
    prop_oneof![
        any::<u8>().prop_map(EvictOp::Get),
        (any::<u8>(), 0usize..3000).prop_map(|(k, n)| EvictOp::Put(k, n)),
        any::<u8>().prop_map(EvictOp::Delete),
        (any::<u8>(), 0u32..40).prop_map(|(k, n)| EvictOp::Scan(k, n)),
    ]
}

proptest! {
    /// With evictions: a key reads back as its last value or, once evicted,
    /// as missing for good (until written again); scans agree; the bound holds.
    #[test]
    fn evicting_store_never_returns_stale_or_resurrected_values(
        partitions in 1usize..4,
        ops in proptest::collection::vec(evict_op(), 1..400),
    ) {
        let s = mem(partitions, partitions * (12 << 10));
        let key = |k: u8| b(format!("k{k:03}"));
        let mut model: std::collections::BTreeMap<Bytes, Bytes> = Default::default();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                EvictOp::Get(k) => match get(&s, key(k)) {
                    OpResult::NotFound => {
                        model.remove(&key(k));
                    }
                    OpResult::Value(v) => prop_assert_eq!(Some(&v), model.get(&key(k))),
                    r => prop_assert!(false, "{:?}", r),
                },
                EvictOp::Put(k, n) => {
                    let v = Bytes::from(vec![(i % 256) as u8; n]);
                    prop_assert_eq!(put(&s, key(k), &v), OpResult::Ok);
                    model.insert(key(k), v.clone());
                    // Just written, so present.
                    prop_assert_eq!(get(&s, key(k)), OpResult::Value(v));
                }
                EvictOp::Delete(k) => {
                    let r = s.execute(Op::Delete { key: key(k) });
                    if model.remove(&key(k)).is_none() {
                        prop_assert_eq!(r, OpResult::NotFound);
                    }
                }
                EvictOp::Scan(k, count) => {
                    let e = scan(&s, key(k), count);
                    prop_assert!(e.len() <= count as usize);
                    prop_assert!(e.windows(2).all(|w| w[0].0 < w[1].0));
                    for (sk, sv) in &e {
                        prop_assert!(sk >= &key(k));
                        prop_assert_eq!(Some(sv), model.get(sk));
                    }
                }
            }
            let st = s.stats();
            for p in &st {
                prop_assert!(p.bytes <= p.bound, "{:?}", p);
            }
            // Everything the store holds is in the model (evicted keys are
            // only dropped from the model once observed missing).
            let all = scan(&s, "", 1000);
            prop_assert_eq!(all.len(), PartitionStats::sum(&st).entries);
            for (k, v) in &all {
                prop_assert_eq!(Some(v), model.get(k));
            }
        }
    }
}
