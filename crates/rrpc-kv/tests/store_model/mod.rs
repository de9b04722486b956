//! A `BTreeMap` model of the store, shared by the memory and persistent
//! engine tests.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use rrpc_kv::store::{PartitionStats, Store};
use rrpc_kv::{Execute, Op, OpResult};

/// One operation on a small key space.
#[derive(Debug, Clone)]
pub(crate) enum ModelOp {
    Get(u8),
    Put(u8, Vec<u8>),
    Delete(u8),
    Scan(u8, u32),
}

fn model_key(k: u8) -> Bytes {
    // Keys of different lengths and shared prefixes, the empty key included.
    if k == 0 {
        return Bytes::new();
    }
    let mut v = vec![b'a' + k % 3; (k % 4) as usize];
    v.push(k);
    Bytes::from(v)
}

pub(crate) fn model_op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        any::<u8>().prop_map(|k| ModelOp::Get(k % 40)),
        (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..48))
            .prop_map(|(k, v)| ModelOp::Put(k % 40, v)),
        any::<u8>().prop_map(|k| ModelOp::Delete(k % 40)),
        (any::<u8>(), 0u32..12).prop_map(|(k, n)| ModelOp::Scan(k % 40, n)),
    ]
}

/// Applies `ops` to `store` and to a `BTreeMap`, comparing every result.
pub(crate) fn check_against_model(store: &Store, ops: &[ModelOp]) -> Result<(), TestCaseError> {
    let mut model: BTreeMap<Bytes, Bytes> = BTreeMap::new();
    for op in ops {
        let (op, want) = match op.clone() {
            ModelOp::Get(k) => {
                let key = model_key(k);
                let want = model
                    .get(&key)
                    .map_or(OpResult::NotFound, |v| OpResult::Value(v.clone()));
                (Op::Get { key }, want)
            }
            ModelOp::Put(k, v) => {
                let key = model_key(k);
                model.insert(key.clone(), Bytes::from(v.clone()));
                (
                    Op::Put {
                        key,
                        value: v.into(),
                    },
                    OpResult::Ok,
                )
            }
            ModelOp::Delete(k) => {
                let key = model_key(k);
                let want = if model.remove(&key).is_some() {
                    OpResult::Ok
                } else {
                    OpResult::NotFound
                };
                (Op::Delete { key }, want)
            }
            ModelOp::Scan(k, count) => {
                let start = model_key(k);
                let want = model
                    .range(start.clone()..)
                    .take(count as usize)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (Op::Scan { start, count }, OpResult::Entries(want))
            }
        };
        prop_assert_eq!(store.execute(op.clone()), want, "{:?}", op);
    }
    let total = PartitionStats::sum(&store.stats());
    prop_assert_eq!(total.entries, model.len());
    prop_assert_eq!(total.evictions, 0);
    Ok(())
}
