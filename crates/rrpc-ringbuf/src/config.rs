//! Ring configuration: geometry and the RB² batching thresholds.
//!
//! Defaults are the paper's evaluation settings (RB² §V-A "Configurations":
//! `alpha = 32`, `beta = 16`, `gamma = 32`) with a 4 MiB receive ring of
//! 64-byte slots (§IV-C, "cache-friendly structure": slot length is a
//! multiple of the 64-byte cache line).

use std::sync::Arc;
use std::time::Duration;

use rrpc_core::numa::NumaPlacement;

use crate::error::Error;
use crate::proto::layout::OVERHEAD;

/// Cache-line length every slot is a multiple of (RB² §IV-C).
pub const CACHE_LINE: usize = 64;

/// Smallest accepted ring: 2 slots.
pub const MIN_SLOT_COUNT: u64 = 2;
/// Largest accepted ring in bytes (1 GiB); lengths travel in 32-bit header fields.
pub const MAX_RING_SIZE: usize = 1 << 30;
/// Largest accepted slot in bytes (64 KiB).
pub const MAX_SLOT_SIZE: usize = 64 << 10;
/// Largest accepted `alpha`, `beta` or `gamma`.
pub const MAX_THRESHOLD: u32 = 1 << 16;
/// How long a message the tail covers may stay unplaced before the receiver
/// gives up ([`RingConfig::placement_timeout`]).
pub const DEFAULT_PLACEMENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Send-queue depth the ring assumes the queue pair has (rrpc-core's default).
pub const DEFAULT_SQ_DEPTH: u32 = 1024;
/// Largest ratio of [`RingConfig::ring_size`] to
/// [`RingConfig::min_ring_size`] (the handshake carries its log2 in 3 bits).
pub const MAX_SIZE_RATIO: usize = 128;
/// How long a self-sizing ring's writer must be quiet before its ring
/// shrinks to [`RingConfig::min_ring_size`] ([`RingConfig::shrink_after`]).
pub const DEFAULT_SHRINK_AFTER: Duration = Duration::from_secs(1);

/// Validated configuration of one ring direction, shared as `Arc<RingConfig>`.
///
/// Build it with [`RingConfig::builder`]; [`RingConfig::default`] gives the
/// paper's settings. This is the model of every rrpc config
/// (docs/architecture.md, "Configuration convention"): setters on the
/// builder, validation in [`build`](RingConfigBuilder::build), getters named
/// after the setting, [`to_builder`](RingConfig::to_builder) to derive one.
///
/// # Examples
/// ```
/// use rrpc_ringbuf::RingConfig;
/// let cfg = RingConfig::builder()
///     .ring_size(1 << 20)
///     .slot_size(128)
///     .alpha(8)
///     .beta(4)
///     .gamma(8)
///     .build()?;
/// assert_eq!(cfg.slot_count(), 8192);
/// # Ok::<(), rrpc_ringbuf::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    ring_size: usize,
    slot_size: usize,
    alpha: u32,
    beta: u32,
    gamma: u32,
    elastic: bool,
    cache_align: bool,
    huge_pages: bool,
    tail_with_imm: bool,
    sq_depth: u32,
    placement_timeout: Duration,
    /// `None`: a fixed size (`ring_size`).
    min_ring_size: Option<usize>,
    /// `None`: no cap below `ring_size`.
    cache_ring_size: Option<usize>,
    /// `None`: `min_ring_size`.
    idle_ring_size: Option<usize>,
    shrink_after: Duration,
    numa_node: NumaPlacement,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            ring_size: 4 << 20,
            slot_size: CACHE_LINE,
            alpha: 32,
            beta: 16,
            gamma: 32,
            elastic: true,
            cache_align: true,
            huge_pages: true,
            tail_with_imm: false,
            sq_depth: DEFAULT_SQ_DEPTH,
            placement_timeout: DEFAULT_PLACEMENT_TIMEOUT,
            min_ring_size: None,
            cache_ring_size: None,
            idle_ring_size: None,
            shrink_after: DEFAULT_SHRINK_AFTER,
            numa_node: NumaPlacement::Device,
        }
    }
}

impl RingConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> RingConfigBuilder {
        RingConfigBuilder {
            cfg: RingConfig::default(),
        }
    }

    /// A builder starting from this config, to derive a modified one
    /// (its [`build`](RingConfigBuilder::build) validates again).
    pub fn to_builder(&self) -> RingConfigBuilder {
        RingConfigBuilder { cfg: self.clone() }
    }

    /// Bytes in the ring array (`slot_size * slot_count`). Default 4 MiB.
    pub fn ring_size(&self) -> usize {
        self.ring_size
    }
    /// Bytes per slot. Default 64.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    /// Number of slots `N` of the whole array (a self-sizing ring's largest size).
    pub fn slot_count(&self) -> u64 {
        (self.ring_size / self.slot_size) as u64
    }
    /// Smallest size a self-sizing ring uses, and the size it starts at;
    /// equal to [`ring_size`](Self::ring_size) for a fixed ring (the default).
    pub fn min_ring_size(&self) -> usize {
        self.min_ring_size.unwrap_or(self.ring_size)
    }
    /// Whether the ring sizes itself between
    /// [`min_ring_size`](Self::min_ring_size) and
    /// [`ring_size`](Self::ring_size) (`proto` docs, "Rings that size themselves").
    pub fn self_sizing(&self) -> bool {
        self.min_ring_size() < self.ring_size
    }
    /// Largest size a self-sizing ring grows to for throughput (its writer
    /// waiting for space, messages asking for room to pipeline); beyond it,
    /// only as far as a message needs to fit twice. Between
    /// [`min_ring_size`](Self::min_ring_size) and
    /// [`ring_size`](Self::ring_size); default `ring_size` (no cap).
    pub fn cache_ring_size(&self) -> usize {
        self.cache_ring_size
            .unwrap_or(self.ring_size)
            .clamp(self.min_ring_size(), self.ring_size)
    }
    /// The size a self-sizing ring shrinks to once its writer has been
    /// quiet for [`shrink_after`](Self::shrink_after); before the next
    /// message it grows back to at least
    /// [`min_ring_size`](Self::min_ring_size). At most `min_ring_size`;
    /// default `min_ring_size` (`proto::sizing` docs).
    pub fn idle_ring_size(&self) -> usize {
        self.idle_ring_size.unwrap_or_else(|| self.min_ring_size())
    }
    /// Slots the sender starts with: `min_ring_size / slot_size`.
    pub fn initial_slot_count(&self) -> u64 {
        (self.min_ring_size() / self.slot_size) as u64
    }
    /// How long the writer of a self-sizing ring must be quiet before the
    /// ring shrinks to its minimum. Default 1 s.
    pub fn shrink_after(&self) -> Duration {
        self.shrink_after
    }
    /// Pointer-advancement threshold `alpha` (messages per tail WRITE).
    pub fn alpha(&self) -> u32 {
        self.alpha
    }
    /// Slot-transmission threshold `beta` (messages per slot WRITE).
    pub fn beta(&self) -> u32 {
        self.beta
    }
    /// Lazy-push threshold `gamma` (consumed messages per head WRITE).
    pub fn gamma(&self) -> u32 {
        self.gamma
    }
    /// Whether the elastic threshold is on (at most one tail WRITE in flight).
    pub fn elastic(&self) -> bool {
        self.elastic
    }
    /// Whether the ring array starts on a cache line (ablation switch).
    pub fn cache_align(&self) -> bool {
        self.cache_align
    }
    /// Whether regions should use huge pages when the system has them.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }
    /// Whether the tail is written with `WRITE_WITH_IMM` (for EVENT mode).
    pub fn tail_with_imm(&self) -> bool {
        self.tail_with_imm
    }
    /// Send-queue depth of the queue pair the ring posts to.
    pub fn sq_depth(&self) -> u32 {
        self.sq_depth
    }
    /// Work requests the sender keeps outstanding at most: half of
    /// [`RingConfig::sq_depth`] (at least 2).
    pub fn sender_outstanding(&self) -> u32 {
        (self.sq_depth / 2).max(2)
    }
    /// Work requests the receiver (its head pushes) keeps outstanding at
    /// most: a quarter of [`RingConfig::sq_depth`] (at least 2).
    pub fn receiver_outstanding(&self) -> u32 {
        (self.sq_depth / 4).max(2)
    }
    /// Send-queue slots the ring needs on its queue pair: what the sender
    /// and the receiver may have outstanding together. `LocalRing::connect`
    /// refuses a queue pair whose send depth is smaller.
    pub fn send_queue_need(&self) -> u32 {
        // Plus one sleep word and one doorbell in flight (`proto::doorbell`).
        self.sender_outstanding() + self.receiver_outstanding() + 2
    }
    /// How long a message the sender's tail covers may stay unplaced (its
    /// header or end stamp not yet visible; `proto` module docs, "Placement
    /// order") before the receiver closes the ring with `Corrupt`: the
    /// bound on a peer that publishes a tail over garbage. Default 1 s.
    pub fn placement_timeout(&self) -> Duration {
        self.placement_timeout
    }
    /// Largest payload one message can carry: the whole ring minus the
    /// header and the end stamp.
    pub fn max_message(&self) -> usize {
        self.ring_size - OVERHEAD
    }
    /// Where the ring's memory goes ([`RingConfigBuilder::numa_node`]).
    /// Default [`NumaPlacement::Device`].
    pub fn numa_node(&self) -> NumaPlacement {
        self.numa_node
    }
    /// Wraps the config in an `Arc` for sharing.
    pub fn shared(self) -> Arc<RingConfig> {
        Arc::new(self)
    }
}

/// Builder for [`RingConfig`]; every setter documents its range, and
/// [`build`](RingConfigBuilder::build) rejects anything outside it.
#[derive(Debug, Clone)]
pub struct RingConfigBuilder {
    cfg: RingConfig,
}

impl RingConfigBuilder {
    /// Ring bytes: a power of two, at least two slots, at most 1 GiB. Default 4 MiB.
    pub fn ring_size(mut self, bytes: usize) -> Self {
        self.cfg.ring_size = bytes;
        self
    }
    /// Slot bytes: a power of two, a multiple of 64 (of 8 when
    /// [`cache_align`](Self::cache_align) is off), at least 16, at most 64 KiB.
    /// Default 64.
    pub fn slot_size(mut self, bytes: usize) -> Self {
        self.cfg.slot_size = bytes;
        self
    }
    /// Pointer-advancement threshold `alpha` in messages, `1..=65536`,
    /// `alpha >= beta`. Default 32 (RB² §V-A). `1` writes the tail after every message.
    pub fn alpha(mut self, n: u32) -> Self {
        self.cfg.alpha = n;
        self
    }
    /// Slot-transmission threshold `beta` in messages, `1..=alpha`. Default 16.
    /// `beta == alpha` switches synchronization-ahead transmission off.
    pub fn beta(mut self, n: u32) -> Self {
        self.cfg.beta = n;
        self
    }
    /// Lazy-push threshold `gamma` in messages, `1..=65536`. Default 32.
    /// `1` pushes the head after every consumed message (active push).
    pub fn gamma(mut self, n: u32) -> Self {
        self.cfg.gamma = n;
        self
    }
    /// Turns batching off: `alpha = beta = gamma = 1`.
    pub fn no_batching(self) -> Self {
        self.alpha(1).beta(1).gamma(1)
    }
    /// Elastic threshold (RB² §IV-B), default on: while the previous tail
    /// WRITE is in flight, pointer advancement is deferred. Off means a fixed
    /// threshold: a tail WRITE every `alpha` messages regardless (up to 8 in flight).
    pub fn elastic(mut self, on: bool) -> Self {
        self.cfg.elastic = on;
        self
    }
    /// Cache-line alignment of the ring and of every message (RB² §IV-C),
    /// default on. Off (ablation only) places the array 8 bytes past a cache
    /// line and accepts slot sizes that are multiples of 8.
    pub fn cache_align(mut self, on: bool) -> Self {
        self.cfg.cache_align = on;
        self
    }
    /// Ask for huge pages (default on; the fabric falls back to normal pages).
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.cfg.huge_pages = on;
        self
    }
    /// Write the tail with `WRITE_WITH_IMM` so the receiver's completion
    /// channel fires (EVENT mode). Default off. See [`crate::RingRx::post_receives`].
    pub fn tail_with_imm(mut self, on: bool) -> Self {
        self.cfg.tail_with_imm = on;
        self
    }
    /// How long a message the tail covers may stay unplaced before the
    /// receiver closes the ring ([`RingConfig::placement_timeout`]). Default 1 s.
    pub fn placement_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.placement_timeout = timeout;
        self
    }
    /// Makes the ring size itself (`proto` docs, "Rings that size
    /// themselves"): it starts at `bytes`, grows when messages need it up to
    /// [`ring_size`](Self::ring_size), and shrinks back after
    /// [`shrink_after`](Self::shrink_after) of quiet. A power of two of at
    /// least two slots, at most `ring_size`, and at least
    /// `ring_size / 128`. Default: equal to `ring_size`, a fixed ring (the
    /// papers' setting).
    pub fn min_ring_size(mut self, bytes: usize) -> Self {
        self.cfg.min_ring_size = Some(bytes);
        self
    }
    /// The size past which a self-sizing ring stops growing for throughput
    /// ([`RingConfig::cache_ring_size`]): the rings a core touches should
    /// stay in its cache (RR-Compound's Fig. 12: a ring that no longer fits
    /// halves the bandwidth). A power of two; clamped to
    /// `min_ring_size..=ring_size`. Default: no cap.
    pub fn cache_ring_size(mut self, bytes: usize) -> Self {
        self.cfg.cache_ring_size = Some(bytes);
        self
    }
    /// Quiet time after which a self-sizing ring shrinks to its idle size
    /// ([`idle_ring_size`](Self::idle_ring_size)), at least 1 ms. Default
    /// 1 s ([`DEFAULT_SHRINK_AFTER`]). The policy ticks every half of it,
    /// so the resize marker goes out between `shrink_after` and
    /// `1.5 × shrink_after` after the last message.
    pub fn shrink_after(mut self, quiet: Duration) -> Self {
        self.cfg.shrink_after = quiet;
        self
    }
    /// The size a quiet self-sizing ring shrinks to
    /// ([`RingConfig::idle_ring_size`]): a power of two of at least two
    /// slots, at most [`min_ring_size`](Self::min_ring_size). Below the
    /// minimum, the unused pages of both arrays go back to the system while
    /// the connection is quiet (shm; `proto` docs). The next message grows
    /// it back: one that fits the idle ring goes out at once and the resize
    /// marker follows it; a larger one waits for the marker's round trip
    /// (`proto::sizing` docs). Where the pages cannot go back (verbs,
    /// huge pages: `rrpc_core::Region::discard`), [`crate::LocalRing::new`]
    /// keeps a quiet ring at `min_ring_size`. Default: `min_ring_size`.
    pub fn idle_ring_size(mut self, bytes: usize) -> Self {
        self.cfg.idle_ring_size = Some(bytes);
        self
    }
    /// The NUMA node both regions of the ring (`RB_R` and `RB_S` with their
    /// control words) are bound to (RB² §IV-C, "NUMA-aware allocation":
    /// the buffers in the memory of the RNIC's node; [`rrpc_core::numa`]).
    /// Default [`NumaPlacement::Device`]: the verbs device's node from
    /// sysfs (`/sys/class/infiniband/<dev>/device/numa_node`, or its parent
    /// netdev's for soft-RoCE), nothing on shm or when the device reports
    /// none. [`NumaPlacement::Node`] overrides it (shm too), and
    /// [`NumaPlacement::Off`] places nothing. Local only: the peer places
    /// its own rings.
    pub fn numa_node(mut self, placement: NumaPlacement) -> Self {
        self.cfg.numa_node = placement;
        self
    }
    /// Send-queue depth of the queue pair, `16..=65536`. Default 1024.
    /// The sender keeps at most half of it outstanding, the receiver a quarter.
    pub fn sq_depth(mut self, depth: u32) -> Self {
        self.cfg.sq_depth = depth;
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the offending value and its range.
    pub fn build(self) -> Result<RingConfig, Error> {
        let c = self.cfg;
        let bad = |m: String| Err(Error::InvalidConfig(m));
        let granule = if c.cache_align { CACHE_LINE } else { 8 };
        if !c.slot_size.is_power_of_two()
            || !c.slot_size.is_multiple_of(granule)
            || c.slot_size < 16
            || c.slot_size > MAX_SLOT_SIZE
        {
            return bad(format!(
                "slot_size {} must be a power of two, a multiple of {granule}, in 16..={MAX_SLOT_SIZE}",
                c.slot_size
            ));
        }
        if !c.ring_size.is_power_of_two() || c.ring_size > MAX_RING_SIZE {
            return bad(format!(
                "ring_size {} must be a power of two of at most {MAX_RING_SIZE} bytes",
                c.ring_size
            ));
        }
        if (c.ring_size / c.slot_size) < MIN_SLOT_COUNT as usize {
            return bad(format!(
                "ring_size {} holds fewer than {MIN_SLOT_COUNT} slots of {} bytes",
                c.ring_size, c.slot_size
            ));
        }
        for (name, v) in [("alpha", c.alpha), ("beta", c.beta), ("gamma", c.gamma)] {
            if v == 0 || v > MAX_THRESHOLD {
                return bad(format!("{name} = {v} must be in 1..={MAX_THRESHOLD}"));
            }
        }
        if c.beta > c.alpha {
            return bad(format!(
                "beta = {} must not exceed alpha = {} (slot transmission happens at least at every pointer advancement)",
                c.beta, c.alpha
            ));
        }
        if let Some(min) = c.min_ring_size
            && (!min.is_power_of_two()
                || min > c.ring_size
                || min / c.slot_size < MIN_SLOT_COUNT as usize
                || c.ring_size / min > MAX_SIZE_RATIO)
        {
            return bad(format!(
                "min_ring_size {min} must be a power of two of at least {MIN_SLOT_COUNT} slots of {} bytes, \
                 at most ring_size {} and at least ring_size / {MAX_SIZE_RATIO}",
                c.slot_size, c.ring_size
            ));
        }
        if let Some(cap) = c.cache_ring_size
            && !cap.is_power_of_two()
        {
            return bad(format!("cache_ring_size {cap} must be a power of two"));
        }
        if let Some(idle) = c.idle_ring_size
            && (!idle.is_power_of_two()
                || idle / c.slot_size < MIN_SLOT_COUNT as usize
                || idle > c.min_ring_size.unwrap_or(c.ring_size))
        {
            return bad(format!(
                "idle_ring_size {idle} must be a power of two of at least {MIN_SLOT_COUNT} slots of {} bytes \
                 and at most min_ring_size {}",
                c.slot_size,
                c.min_ring_size.unwrap_or(c.ring_size)
            ));
        }
        if c.shrink_after < Duration::from_millis(1) {
            return bad(format!(
                "shrink_after {:?} must be at least 1 ms",
                c.shrink_after
            ));
        }
        if !(16..=65536).contains(&c.sq_depth) {
            return bad(format!("sq_depth {} must be in 16..=65536", c.sq_depth));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_paper_values() {
        let c = RingConfig::default();
        assert_eq!((c.alpha(), c.beta(), c.gamma()), (32, 16, 32));
        assert_eq!(c.ring_size(), 4 << 20);
        assert_eq!(c.slot_count(), 65536);
        assert_eq!(c.numa_node(), NumaPlacement::Device);
        assert_eq!(RingConfig::builder().build().unwrap(), c);
        let c = RingConfig::builder()
            .numa_node(NumaPlacement::Node(1))
            .build()
            .unwrap();
        assert_eq!(c.numa_node(), NumaPlacement::Node(1));
    }

    #[test]
    fn rejects_invalid() {
        let b = RingConfig::builder;
        assert!(b().slot_size(96).build().is_err());
        assert!(b().slot_size(32).build().is_err());
        assert!(b().slot_size(32).cache_align(false).build().is_ok());
        assert!(b().ring_size(3 << 20).build().is_err());
        assert!(b().ring_size(64).build().is_err());
        assert!(b().alpha(0).build().is_err());
        assert!(b().alpha(4).beta(8).build().is_err());
        assert!(b().gamma(1 << 20).build().is_err());
        assert!(b().sq_depth(4).build().is_err());
        let e = b().alpha(4).beta(8).build().unwrap_err().to_string();
        assert!(e.contains("beta = 8") && e.contains("alpha = 4"), "{e}");
        assert!(b().no_batching().build().is_ok());
        assert!(b().min_ring_size(64 << 10).build().unwrap().self_sizing());
        assert!(!b().min_ring_size(4 << 20).build().unwrap().self_sizing());
        assert!(b().min_ring_size(8 << 20).build().is_err());
        assert!(
            b().min_ring_size(16 << 10).build().is_err(),
            "ratio over 128"
        );
        assert!(b().min_ring_size(96 << 10).build().is_err());
        assert!(b().shrink_after(Duration::ZERO).build().is_err());
        let idle = |bytes| b().min_ring_size(64 << 10).idle_ring_size(bytes).build();
        assert_eq!(idle(4096).unwrap().idle_ring_size(), 4096);
        assert_eq!(idle(128).unwrap().idle_ring_size(), 128, "two slots");
        assert!(idle(64).is_err(), "one slot");
        assert!(idle(3 << 10).is_err(), "not a power of two");
        assert!(idle(128 << 10).is_err(), "over min_ring_size");
        assert!(idle(0).is_err());
        let e = idle(128 << 10).unwrap_err().to_string();
        assert!(e.contains("idle_ring_size 131072"), "{e}");
        assert_eq!(
            b().min_ring_size(64 << 10)
                .build()
                .unwrap()
                .idle_ring_size(),
            64 << 10,
            "default: the minimum"
        );
        let e = b().min_ring_size(1000).build().unwrap_err().to_string();
        assert!(e.contains("min_ring_size 1000"), "{e}");
    }
}
