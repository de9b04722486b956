//! What the store and its two engines share (the engines import it, the
//! store re-exports its public part): the bucket geometry, the partition
//! limit, the key hash and its scaling, and a partition's counters.

/// Slots per bucket (the RF-RPC paper, §5.1: "each of which contains eight slots").
pub const SLOTS_PER_BUCKET: usize = 8;

/// Most partitions a store may have.
pub const MAX_PARTITIONS: usize = 1024;

/// The stable 64-bit hash of a key: FNV-1a, then the SplitMix64 finalizer.
///
/// The same on every run, process and machine (clients route by it, and a
/// persistent store's placement depends on it). Not keyed.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// `x` (32 bits) scaled into `0..n` by multiply-shift.
pub(super) fn scale(x: u64, n: usize) -> usize {
    (((x & 0xffff_ffff) * n as u64) >> 32) as usize
}

pub(super) fn partition_index(hash: u64, partitions: usize) -> usize {
    scale(hash >> 32, partitions)
}

/// Counters of one partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionStats {
    /// GETs that found their key.
    pub hits: u64,
    /// GETs that did not.
    pub misses: u64,
    /// Entries evicted (bucket full, or memory bound); always 0 on disk.
    pub evictions: u64,
    /// Bytes of the live entries: `key + value + ENTRY_OVERHEAD` each in
    /// memory; `key + value` each on disk.
    pub bytes: usize,
    /// Live entries.
    pub entries: usize,
    /// The most `bytes` may reach: the entry budget in memory; 0 (unbounded)
    /// on disk.
    pub bound: usize,
}

impl PartitionStats {
    /// The sum of several partitions' counters.
    pub fn sum<'a>(stats: impl IntoIterator<Item = &'a PartitionStats>) -> PartitionStats {
        stats
            .into_iter()
            .fold(PartitionStats::default(), |a, s| PartitionStats {
                hits: a.hits + s.hits,
                misses: a.misses + s.misses,
                evictions: a.evictions + s.evictions,
                bytes: a.bytes + s.bytes,
                entries: a.entries + s.entries,
                bound: a.bound + s.bound,
            })
    }
}
