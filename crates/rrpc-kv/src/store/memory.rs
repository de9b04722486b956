//! The in-memory engine: one partition's buckets of eight LRU slots, its
//! ordered key index and its byte accounting (see the module docs of
//! [`crate::store`]).

use std::collections::BTreeSet;
use std::ops::Bound;

use bytes::Bytes;

use super::shared::{PartitionStats, SLOTS_PER_BUCKET, key_hash, scale};
use crate::error::{Error, Result};

/// Bytes counted per entry on top of its key and value: the key's place in
/// the ordered index (a 32-byte handle plus its share of B-tree nodes, about
/// 48), the key's and the value's allocations with their headers and the
/// shared-ownership blocks `Bytes` adds once a handle is cloned (about 56
/// each). An estimate (the allocator's real cost is not observable without
/// a custom allocator); the slot itself is paid for in the bucket table.
pub const ENTRY_OVERHEAD: usize = 160;

/// The paper's pair (§5.1 "Workloads": 16-byte keys, 32-byte values), used
/// to size the bucket table.
const TYPICAL_PAIR: usize = 16 + 32;

#[derive(Debug)]
struct Slot {
    hash: u64,
    key: Bytes,
    value: Bytes,
}

impl Slot {
    fn size(&self) -> usize {
        entry_size(self.key.len(), self.value.len())
    }
}

fn entry_size(key: usize, value: usize) -> usize {
    key + value + ENTRY_OVERHEAD
}

/// A bucket: at most eight slots, most recent first.
type Bucket = Vec<Slot>;

/// What one bucket costs in the table: its header and eight slots.
const BUCKET_COST: usize =
    std::mem::size_of::<Bucket>() + SLOTS_PER_BUCKET * std::mem::size_of::<Slot>();

pub(super) struct MemoryPartition {
    buckets: Vec<Bucket>,
    /// Every live key, in order (shares the slots' key allocations).
    index: BTreeSet<Bytes>,
    /// The clock hand of bound eviction: the next bucket it visits.
    hand: usize,
    /// The most `bytes` may reach.
    budget: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
    bytes: usize,
    entries: usize,
}

impl std::fmt::Debug for MemoryPartition {
    /// A summary: the entries themselves would be far too many to print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPartition")
            .field("buckets", &self.buckets.len())
            .field("hand", &self.hand)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl MemoryPartition {
    /// A partition of `bound` bytes: the bucket table first, the rest for
    /// entries. `bound` is at least `MIN_PARTITION_BOUND` (checked by
    /// `Store::open`).
    pub(super) fn new(bound: usize) -> Self {
        let per_entry = entry_size(TYPICAL_PAIR, 0) + BUCKET_COST / SLOTS_PER_BUCKET;
        let nbuckets = (bound / (SLOTS_PER_BUCKET * per_entry)).clamp(1, u32::MAX as usize);
        let budget = bound.saturating_sub(nbuckets * BUCKET_COST);
        MemoryPartition {
            buckets: (0..nbuckets).map(|_| Vec::new()).collect(),
            index: BTreeSet::new(),
            hand: 0,
            budget,
            hits: 0,
            misses: 0,
            evictions: 0,
            bytes: 0,
            entries: 0,
        }
    }

    pub(super) fn buckets(&self) -> usize {
        self.buckets.len()
    }

    pub(super) fn bucket_of(&self, hash: u64) -> usize {
        scale(hash, self.buckets.len())
    }

    pub(super) fn bucket_keys(&self, b: usize) -> Vec<Bytes> {
        self.buckets
            .get(b)
            .map(|s| s.iter().map(|s| s.key.clone()).collect())
            .unwrap_or_default()
    }

    fn find(&self, b: usize, hash: u64, key: &[u8]) -> Option<usize> {
        self.buckets[b]
            .iter()
            .position(|s| s.hash == hash && s.key == key)
    }

    pub(super) fn get(&mut self, hash: u64, key: &[u8]) -> Option<Bytes> {
        let b = self.bucket_of(hash);
        match self.find(b, hash, key) {
            Some(pos) => {
                self.hits += 1;
                let slots = &mut self.buckets[b];
                slots[..=pos].rotate_right(1);
                Some(slots[0].value.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    pub(super) fn put(&mut self, hash: u64, key: &[u8], value: &[u8]) -> Result<()> {
        let size = entry_size(key.len(), value.len());
        if size > self.budget {
            return Err(Error::TooLarge {
                what: "entry (key + value + per-entry overhead) for a memory partition's budget",
                len: size,
                limit: self.budget,
            });
        }
        let b = self.bucket_of(hash);
        let key = match self.find(b, hash, key) {
            Some(pos) => {
                // Replace: the key stays in the index.
                let old = self.buckets[b].remove(pos);
                self.bytes -= old.size();
                self.entries -= 1;
                old.key
            }
            None => {
                if self.buckets[b].len() == SLOTS_PER_BUCKET {
                    self.evict_lru(b);
                }
                let key = Bytes::copy_from_slice(key);
                self.index.insert(key.clone());
                key
            }
        };
        while self.bytes + size > self.budget {
            if self.buckets[b].is_empty() {
                self.clock_evict();
            } else {
                self.evict_lru(b);
            }
        }
        let slots = &mut self.buckets[b];
        if slots.capacity() == 0 {
            slots.reserve_exact(SLOTS_PER_BUCKET);
        }
        slots.insert(
            0,
            Slot {
                hash,
                key,
                value: Bytes::copy_from_slice(value),
            },
        );
        self.bytes += size;
        self.entries += 1;
        Ok(())
    }

    /// Evicts bucket `b`'s least recent slot (`b` is not empty).
    fn evict_lru(&mut self, b: usize) {
        if let Some(s) = self.buckets[b].pop() {
            self.index.remove(&s.key);
            self.bytes -= s.size();
            self.entries -= 1;
            self.evictions += 1;
        }
    }

    /// Evicts the least recent slot of the next non-empty bucket the clock
    /// hand reaches (some bucket is not empty: `bytes > 0`).
    fn clock_evict(&mut self) {
        let n = self.buckets.len();
        for _ in 0..n {
            let b = self.hand;
            self.hand = (self.hand + 1) % n;
            if !self.buckets[b].is_empty() {
                self.evict_lru(b);
                return;
            }
        }
        unreachable!("over the memory budget with every bucket empty");
    }

    pub(super) fn delete(&mut self, hash: u64, key: &[u8]) -> bool {
        let b = self.bucket_of(hash);
        match self.find(b, hash, key) {
            Some(pos) => {
                let s = self.buckets[b].remove(pos);
                self.index.remove(&s.key);
                self.bytes -= s.size();
                self.entries -= 1;
                true
            }
            None => false,
        }
    }

    pub(super) fn scan(&self, start: &[u8], count: usize) -> Vec<(Bytes, Bytes)> {
        self.index
            .range::<[u8], _>((Bound::Included(start), Bound::Unbounded))
            .take(count)
            .map(|k| {
                let h = key_hash(k);
                let b = self.bucket_of(h);
                let pos = self
                    .find(b, h, k)
                    .expect("the ordered index is in step with the buckets");
                (k.clone(), self.buckets[b][pos].value.clone())
            })
            .collect()
    }

    pub(super) fn stats(&self) -> PartitionStats {
        PartitionStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            bytes: self.bytes,
            entries: self.entries,
            bound: self.budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_fits_in_the_smallest_bound() {
        let p = MemoryPartition::new(super::super::MIN_PARTITION_BOUND);
        assert!(p.budget > 0);
        assert!(p.buckets() >= 1);
        assert!(p.budget + p.buckets() * BUCKET_COST <= super::super::MIN_PARTITION_BOUND);
    }

    #[test]
    fn index_and_buckets_stay_in_step() {
        let mut p = MemoryPartition::new(64 << 10);
        for i in 0..5000u32 {
            let k = format!("k{}", i % 1500);
            let v = vec![0u8; (i % 97) as usize];
            p.put(key_hash(k.as_bytes()), k.as_bytes(), &v).unwrap();
            if i % 7 == 0 {
                let k = format!("k{}", i % 300);
                p.delete(key_hash(k.as_bytes()), k.as_bytes());
            }
            assert!(p.bytes <= p.budget);
            assert_eq!(p.index.len(), p.entries);
        }
        let n: usize = p.buckets.iter().map(Vec::len).sum();
        assert_eq!(n, p.entries);
        assert_eq!(p.scan(b"", usize::MAX).len(), p.entries);
    }
}
