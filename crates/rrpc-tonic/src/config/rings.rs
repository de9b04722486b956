//! The rings group of [`RrpcConfig`](super::RrpcConfig): the size of each
//! direction's ring, how it sizes itself, where its memory goes, and the
//! largest message.
//!
//! Every ring setting is checked by the ring itself
//! ([`RingConfigBuilder::build`]): [`RingSettings::validate`] builds the
//! ring config a connection builds (`crate::conn::rings` adds only the poller's
//! `tail_with_imm`, which no rule reads) one setting at a time, so the
//! first refusal names its setting, and `build()` and the ring cannot
//! disagree.

use std::time::Duration;

use rrpc_core::numa::NumaPlacement;
use rrpc_ringbuf::{MAX_SIZE_RATIO, RingConfig, RingConfigBuilder};

use crate::Error;

/// The longest a duration setting that is added to a clock may be
/// (`ring_shrink_after`, `peer_lease`): `Instant + Duration` panics when
/// the sum does not fit, and a year is "never" for either.
pub(super) const MAX_CLOCK_DURATION: std::time::Duration =
    std::time::Duration::from_secs(365 * 86_400);

/// The size a self-sizing ring starts at unless
/// [`min_ring_size`](super::RrpcConfigBuilder::min_ring_size) is set:
/// 64 KiB, fitted into `ring_size / 128 ..= ring_size`.
const DEFAULT_MIN_RING_SIZE: usize = 64 << 10;

/// The default of [`ring_shrink_after`](super::RrpcConfigBuilder::ring_shrink_after):
/// 500 ms. Both ends tick every half of it, so a quiet connection's rings
/// are back at their idle size within 2.5 × of it (1.25 s), inside the
/// 2 s of quiet after which docs/measured.md reads an idle connection's
/// memory (at 1 s the release was still under way there).
pub(super) const DEFAULT_RING_SHRINK_AFTER: Duration = Duration::from_millis(500);

/// The size a quiet self-sizing ring shrinks to unless
/// [`ring_idle_size`](super::RrpcConfigBuilder::ring_idle_size) is set:
/// one 4 KiB page, the least a page-granular release keeps, fitted to
/// `min_ring_size`.
const DEFAULT_RING_IDLE_SIZE: usize = 4 << 10;

/// The rule of `ring_size`: the ring's (`rrpc_ringbuf::MIN_SLOT_COUNT`
/// slots of `CACHE_LINE` bytes, `MAX_RING_SIZE`; a test checks the
/// numbers against those constants).
pub(super) const RING_SIZE_RULE: &str =
    "ring_size must be a power of two of at least 128 bytes (two 64-byte slots) and at most 1 GiB";
/// The rule of an explicit `min_ring_size`: the ring's (`MAX_SIZE_RATIO`).
pub(super) const MIN_RING_SIZE_RULE: &str = "min_ring_size must be a power of two of at least \
     128 bytes (two 64-byte slots), at most ring_size and at least ring_size / 128";
/// The rule of an explicit `ring_cache_size`: the ring's (a power of two)
/// and this crate's (within the sizes the ring takes, which the ring
/// would otherwise clamp it to without a word).
pub(super) const RING_CACHE_SIZE_RULE: &str =
    "ring_cache_size must be a power of two within min_ring_size ..= ring_size";
/// The rule of an explicit `ring_idle_size`: the ring's.
pub(super) const RING_IDLE_SIZE_RULE: &str = "ring_idle_size must be a power of two of at least \
     128 bytes (two 64-byte slots) and at most min_ring_size";
/// The rule of `ring_shrink_after`: the ring's minimum, and a maximum a
/// clock can be advanced by (the sizing task's timer adds it to `now`).
pub(super) const RING_SHRINK_AFTER_RULE: &str =
    "ring_shrink_after must be within 1 ms ..= 365 days";

/// The rings group ([`RrpcConfig`](super::RrpcConfig) docs, "Settings").
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RingSettings {
    pub(super) max_message_size: usize,
    pub(super) ring_size: usize,
    /// `None`: [`DEFAULT_MIN_RING_SIZE`], fitted to `ring_size`.
    pub(super) min_ring_size: Option<usize>,
    pub(super) ring_shrink_after: Duration,
    /// `None`: [`DEFAULT_RING_IDLE_SIZE`], fitted to `min_ring_size`.
    pub(super) ring_idle_size: Option<usize>,
    /// `None`: [`ring_cache_cap`], clamped by the ring.
    pub(super) ring_cache_size: Option<usize>,
    /// Where rings and polling threads go (RB² §IV-C).
    pub(super) numa_node: NumaPlacement,
}

impl Default for RingSettings {
    fn default() -> Self {
        RingSettings {
            max_message_size: 4 << 20,
            ring_size: 4 << 20,
            min_ring_size: None,
            ring_shrink_after: DEFAULT_RING_SHRINK_AFTER,
            ring_idle_size: None,
            ring_cache_size: None,
            numa_node: NumaPlacement::Device,
        }
    }
}

impl RingSettings {
    /// The size a ring starts at and shrinks back to: the one set (which
    /// [`validate`](Self::validate) keeps within the ring's range), else
    /// the default fitted into `ring_size / 128 ..= ring_size`.
    pub(super) fn min_ring_size(&self) -> usize {
        let ring = self.ring_size;
        self.min_ring_size
            .unwrap_or(DEFAULT_MIN_RING_SIZE)
            .min(ring)
            .max(ring / MAX_SIZE_RATIO)
    }

    /// The size a quiet ring shrinks to: the one set (which
    /// [`validate`](Self::validate) keeps within the ring's range), else
    /// the default fitted to `min_ring_size`.
    pub(super) fn ring_idle_size(&self) -> usize {
        self.ring_idle_size
            .unwrap_or_else(|| DEFAULT_RING_IDLE_SIZE.min(self.min_ring_size()))
    }

    /// The cache cap set, or the one derived from this CPU's L2 cache.
    pub(super) fn ring_cache_size(&self) -> usize {
        self.ring_cache_size.unwrap_or_else(ring_cache_cap)
    }

    /// The ring config of a connection of these settings, as
    /// `crate::conn::rings` builds it (which adds the poller's `tail_with_imm`).
    pub(super) fn ring_config(&self) -> RingConfigBuilder {
        RingConfig::builder()
            .ring_size(self.ring_size)
            .min_ring_size(self.min_ring_size())
            .cache_ring_size(self.ring_cache_size())
            .shrink_after(self.ring_shrink_after)
            .idle_ring_size(self.ring_idle_size())
            .numa_node(self.numa_node)
    }

    /// Checks every setting of the group, each by the ring's own rule
    /// (module docs).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first setting refused and its rule.
    pub(super) fn validate(&self) -> Result<(), Error> {
        let refused = |b: &RingConfigBuilder| b.clone().build().is_err();
        let bad = |rule: &'static str| Err(Error::InvalidConfig(rule));
        if self.max_message_size == 0 {
            return bad("max_message_size must be > 0");
        }
        let ring = RingConfig::builder().ring_size(self.ring_size);
        if refused(&ring) {
            return bad(RING_SIZE_RULE);
        }
        // An explicit value as set (the ring refuses what it would not
        // take); the default fitted, which the ring always takes.
        let ring = ring.min_ring_size(self.min_ring_size.unwrap_or_else(|| self.min_ring_size()));
        if refused(&ring) {
            return bad(MIN_RING_SIZE_RULE);
        }
        let ring = ring.cache_ring_size(self.ring_cache_size());
        if let Some(cap) = self.ring_cache_size
            && (refused(&ring) || !(self.min_ring_size()..=self.ring_size).contains(&cap))
        {
            return bad(RING_CACHE_SIZE_RULE);
        }
        if self.ring_idle_size.is_some()
            && refused(&ring.clone().idle_ring_size(self.ring_idle_size()))
        {
            return bad(RING_IDLE_SIZE_RULE);
        }
        // Every setting in: the ring config a connection builds.
        if refused(&self.ring_config()) || self.ring_shrink_after > MAX_CLOCK_DURATION {
            return bad(RING_SHRINK_AFTER_RULE);
        }
        Ok(())
    }
}

/// The default of [`RrpcConfig::ring_cache_size`](super::RrpcConfig::ring_cache_size),
/// the size past which a self-sizing ring stops growing for throughput
/// (`RingConfig::cache_ring_size`): an eighth of this CPU's L2 cache (from
/// sysfs; 512 KiB when it cannot be read), rounded down to a power of two.
/// A core touches up to four rings' worth of data on a busy connection
/// (both rings of the direction it sends on, the receive ring of the other,
/// and the buffers it copies to), and they should fit in half its L2. On a
/// host with 512 KiB of L2 per core that is 64 KiB: the ring size at which
/// the Fig. 12 sweep (`cargo xtask bench rpc`, `ring_size_bandwidth`)
/// peaked there for both 8 KiB and 128 KiB RPCs.
pub(super) fn ring_cache_cap() -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let l2 = l2_cache_bytes().unwrap_or(512 << 10);
        let cap = (l2 / 8).max(4096);
        1 << (usize::BITS - 1 - cap.leading_zeros())
    })
}

/// The L2 cache size of CPU 0, from `/sys/devices/system/cpu/cpu0/cache`.
fn l2_cache_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        if read("level").as_deref().map(str::trim) != Some("2") {
            continue;
        }
        let size = read("size")?;
        let size = size.trim();
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1024),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size, 1),
            },
        };
        return num.parse::<usize>().ok().map(|n| n * mul);
    }
    None
}
