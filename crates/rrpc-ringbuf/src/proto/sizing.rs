//! Rings that size themselves: the policy that picks a ring's size from
//! what its writer observes. Sans-IO: it takes observations and a clock
//! reading, and answers with a slot count; [`super::Sender`] carries the
//! switch out (module docs, "Rings that size themselves").
//!
//! # The rule
//! * **A message needs room for pipelining**: the size a payload of `len`
//!   bytes asks for, [`Sizer::target_for`], is the power of two of at least
//!   `3 × len` bytes and at least twice the slots the message takes, within
//!   `[min, max]`: room for three to six such messages in flight, but no
//!   more than the *cache cap* ([`crate::RingConfig::cache_ring_size`])
//!   unless the message itself needs it (then just room for two). Past the
//!   cap the rings a core touches no longer fit in its cache, and
//!   RR-Compound's Fig. 12 shows what that costs: half the bandwidth. So a
//!   writer that wants the best ring sends messages of at most a third of
//!   the cap (rrpc-tonic does). The ring grows at once, before the message
//!   that needs it.
//! * **A writer that keeps waiting for space** (over half of its messages
//!   in a window found the ring full) doubles the ring, up to twice what its
//!   largest message asks for and never past the cache cap.
//! * **A ring larger than needed shrinks**: once four times what the
//!   window's largest message asks for fits in it, it shrinks to that.
//! * **A quiet ring shrinks to its idle size**: no message for
//!   `shrink_after` ([`crate::RingConfig::idle_ring_size`]; the minimum
//!   unless set lower). A ring below its minimum grows back to it (or to
//!   what the message asks for) with the next message: a message that
//!   fits the idle ring with a slot to spare goes out at once and the
//!   marker follows it ([`super::Sender`]); a larger one waits for the
//!   marker's round trip, as any growth does.
//!
//! Windows are the periods between [`Sizer::tick`] calls (the driver ticks
//! every `shrink_after / 2`), so the hot path only counts. The quiet time
//! counts from the end of the last window that saw a message, so a quiet
//! ring shrinks at a tick between `shrink_after` and `1.5 × shrink_after`
//! after its last message.

use std::time::{Duration, Instant};

/// The sizing policy of one sender. See the module docs.
#[derive(Debug, Clone)]
pub struct Sizer {
    slot_size: usize,
    min: u64,
    max: u64,
    /// The size a quiet ring shrinks to (slots, at most `min`).
    idle: u64,
    shrink_after: Duration,
    /// Growth for throughput stops here (slots).
    cache: u64,
    largest: usize,
    messages: u64,
    full: u64,
    quiet_since: Option<Instant>,
}

impl Sizer {
    /// A policy for rings of `slot_size`-byte slots between `min` and `max`
    /// slots (powers of two), shrinking after `shrink_after` of quiet.
    pub fn new(slot_size: usize, min: u64, max: u64, shrink_after: Duration) -> Sizer {
        debug_assert!(min.is_power_of_two() && max.is_power_of_two() && min <= max);
        Sizer {
            slot_size,
            min,
            max,
            idle: min,
            shrink_after,
            cache: max,
            largest: 0,
            messages: 0,
            full: 0,
            quiet_since: None,
        }
    }

    /// Caps growth for throughput at `slots` (clamped to `[min, max]`;
    /// module docs). Without it the cap is `max`.
    pub fn with_cache_slots(mut self, slots: u64) -> Sizer {
        self.cache = slots.clamp(self.min, self.max);
        self
    }

    /// Makes a quiet ring shrink to `slots` (clamped to `[2, min]`; module
    /// docs) instead of the minimum.
    pub fn with_idle_slots(mut self, slots: u64) -> Sizer {
        self.idle = slots.clamp(crate::MIN_SLOT_COUNT, self.min);
        self
    }

    /// Slot count a quiet ring shrinks to.
    pub fn idle_slots(&self) -> u64 {
        self.idle
    }
    /// Smallest slot count a message asks for.
    pub fn min_slots(&self) -> u64 {
        self.min
    }
    /// Largest slot count.
    pub fn max_slots(&self) -> u64 {
        self.max
    }

    /// The slot count a payload of `len` bytes asks for (module docs).
    pub fn target_for(&self, len: usize) -> u64 {
        let slots = (super::OVERHEAD + len).div_ceil(self.slot_size) as u64;
        let by_bytes = (3 * len as u64).div_ceil(self.slot_size as u64);
        let pow2 = |n: u64| n.checked_next_power_of_two().unwrap_or(self.max);
        let mut t = pow2(by_bytes.max(2 * slots));
        if t > self.cache {
            // Out of the cache: only what the message needs.
            t = self.cache.max(pow2(2 * slots));
        }
        t.clamp(self.min, self.max)
    }

    /// The size to grow to before a message of `len` bytes, if the ring of
    /// `current` slots is too small for it.
    #[inline]
    pub fn grow_for(&self, len: usize, current: u64) -> Option<u64> {
        if current >= self.max {
            return None;
        }
        // The common case, a message small next to its ring, without the
        // divisions of `target_for`: `current` is a power of two, so when
        // both of the target's bounds (`3 × len` bytes, twice the message's
        // slots) fit in it, so do their power of two, the cap's choice (no
        // larger than either) and the clamp (`min <= current`).
        let (len64, bytes) = (len as u64, current.saturating_mul(self.slot_size as u64));
        if current >= self.min
            && len64.saturating_mul(3) <= bytes
            && (super::OVERHEAD as u64).saturating_add(len64) <= bytes / 2
        {
            return None;
        }
        let t = self.target_for(len);
        (t > current).then_some(t)
    }

    /// A message of `len` payload bytes was committed.
    #[inline]
    pub fn on_message(&mut self, len: usize) {
        self.messages += 1;
        self.largest = self.largest.max(len);
    }

    /// The writer found the ring full.
    #[inline]
    pub fn on_full(&mut self) {
        self.full += 1;
    }

    /// Ends a window at `now` with the ring at `current` slots: the size to
    /// switch to, if any.
    pub fn tick(&mut self, now: Instant, current: u64) -> Option<u64> {
        let (messages, largest, full) = (self.messages, self.largest, self.full);
        (self.messages, self.largest, self.full) = (0, 0, 0);
        if messages == 0 {
            let since = *self.quiet_since.get_or_insert(now);
            return (now.duration_since(since) >= self.shrink_after && current > self.idle)
                .then_some(self.idle);
        }
        self.quiet_since = Some(now);
        let want = self.target_for(largest);
        if full * 2 > messages && current < self.cache && current < 2 * want {
            return Some((current * 2).min(self.cache));
        }
        (want * 4 <= current).then_some(want)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// `grow_for`'s shortcut answers as `target_for` does, for every
        /// slot size, bounds, cache cap, message and current size.
        #[test]
        fn grow_for_agrees_with_target_for(
            slot_log in 6u32..13,
            min_log in 1u32..12,
            span in 0u32..10,
            cache_log in 0u32..24,
            cur_log in 1u32..24,
            len in prop_oneof![0usize..256, 0usize..(1 << 22)],
        ) {
            let (min, max) = (1u64 << min_log, 1u64 << (min_log + span));
            let s = Sizer::new(1 << slot_log, min, max, Duration::from_secs(1))
                .with_cache_slots(1 << cache_log);
            let current = 1u64 << cur_log.min(min_log + span);
            let want = if current >= max {
                None
            } else {
                let t = s.target_for(len);
                (t > current).then_some(t)
            };
            prop_assert_eq!(s.grow_for(len, current), want);
        }
    }
    use super::*;

    const KIB: usize = 1024;

    /// 64-byte slots from 64 KiB to 4 MiB, rrpc-tonic's defaults.
    fn sizer() -> Sizer {
        Sizer::new(64, 1024, 65536, Duration::from_secs(1))
    }

    fn bytes(slots: u64) -> usize {
        slots as usize * 64
    }

    #[test]
    fn messages_ask_for_three_times_their_size_within_the_bounds() {
        let s = sizer();
        assert_eq!(bytes(s.target_for(128 * KIB)), 512 * KIB, "Fig. 12's best");
        assert_eq!(
            bytes(s.target_for(128 * KIB + 40)),
            512 * KIB,
            "a 128 KiB frame with its header"
        );
        assert_eq!(bytes(s.target_for(171 * KIB)), 1024 * KIB);
        assert_eq!(bytes(s.target_for(8 * KIB)), 64 * KIB, "the minimum");
        assert_eq!(bytes(s.target_for(0)), 64 * KIB);
        assert_eq!(bytes(s.target_for(100 * KIB)), 512 * KIB);
        assert_eq!(
            bytes(s.target_for(3 * 1024 * KIB)),
            4096 * KIB,
            "the maximum"
        );
        // Room for two messages even where 4x len rounds below that.
        let one_slot = Sizer::new(4096, 2, 1024, Duration::from_secs(1));
        assert!(one_slot.target_for(4096) >= 2 * 2);
        assert_eq!(s.grow_for(8 * KIB, 1024), None);
        assert_eq!(s.grow_for(128 * KIB, 1024), Some(8192));
        assert_eq!(s.grow_for(128 * KIB, 65536), None);
    }

    #[test]
    fn past_the_cache_cap_a_ring_grows_only_as_far_as_a_message_needs() {
        // A 128 KiB cap (2048 slots).
        let s = sizer().with_cache_slots(2048);
        assert_eq!(
            bytes(s.target_for(40 * KIB)),
            128 * KIB,
            "3 x 40 KiB: the cap"
        );
        assert_eq!(bytes(s.target_for(50 * KIB)), 128 * KIB, "capped, 2 fit");
        assert_eq!(bytes(s.target_for(128 * KIB)), 512 * KIB, "room for two");
        assert_eq!(bytes(s.target_for(8 * KIB)), 64 * KIB);
        // Waiting for space doubles up to the cap only.
        let mut s = s;
        let t0 = Instant::now();
        for _ in 0..10 {
            s.on_message(30 * KIB);
            s.on_full();
        }
        assert_eq!(s.tick(t0, 2048), None, "at the cap");
        for _ in 0..10 {
            s.on_message(30 * KIB);
            s.on_full();
        }
        assert_eq!(s.tick(t0, 1024), Some(2048));
    }

    #[test]
    fn a_quiet_ring_shrinks_to_its_minimum_after_shrink_after() {
        let mut s = sizer();
        let t0 = Instant::now();
        s.on_message(128 * KIB);
        assert_eq!(s.tick(t0, 8192), None, "busy at the right size");
        let ms = Duration::from_millis;
        assert_eq!(s.tick(t0 + ms(500), 8192), None, "quiet for 500 ms");
        assert_eq!(s.tick(t0 + ms(999), 8192), None);
        assert_eq!(s.tick(t0 + ms(1000), 8192), Some(1024));
        assert_eq!(s.tick(t0 + ms(1500), 1024), None, "already at the minimum");
        // One message restarts the quiet time.
        s.on_message(10);
        assert_eq!(s.tick(t0 + ms(2000), 2048), None);
        assert_eq!(s.tick(t0 + ms(2500), 2048), None);
        assert_eq!(s.tick(t0 + ms(3000), 2048), Some(1024));
    }

    /// Below the minimum only when quiet: the idle size, and back to at
    /// least the minimum before the next message.
    #[test]
    fn a_quiet_ring_shrinks_to_its_idle_size_and_grows_back_for_a_message() {
        let mut s = sizer().with_idle_slots(64);
        assert_eq!(s.idle_slots(), 64);
        let t0 = Instant::now();
        s.on_message(100);
        assert_eq!(s.tick(t0, 1024), None, "busy at the minimum");
        let ms = Duration::from_millis;
        assert_eq!(s.tick(t0 + ms(500), 1024), None);
        assert_eq!(s.tick(t0 + ms(1000), 1024), Some(64), "quiet: one page");
        assert_eq!(s.tick(t0 + ms(1500), 64), None, "already idle");
        assert_eq!(s.grow_for(100, 64), Some(1024), "a message: the minimum");
        assert_eq!(s.grow_for(128 * KIB, 64), Some(8192));
        // Clamped into [2, min].
        assert_eq!(sizer().with_idle_slots(1).idle_slots(), 2);
        assert_eq!(sizer().with_idle_slots(1 << 20).idle_slots(), 1024);
    }

    #[test]
    fn a_ring_four_times_too_large_shrinks_to_what_messages_ask_for() {
        let mut s = sizer();
        let t0 = Instant::now();
        for _ in 0..100 {
            s.on_message(16 * KIB);
        }
        // 16 KiB asks for 64 KiB (1024 slots); 4 MiB is 64x that.
        assert_eq!(s.tick(t0, 65536), Some(1024));
        for _ in 0..100 {
            s.on_message(128 * KIB);
        }
        // 128 KiB asks for 8192 slots: 16384 is not four times that.
        assert_eq!(s.tick(t0, 16384), None);
        s.on_message(128 * KIB);
        assert_eq!(s.tick(t0, 32768), Some(8192));
    }

    #[test]
    fn a_writer_that_waits_for_space_doubles_the_ring_up_to_twice_its_target() {
        let mut s = sizer();
        let t0 = Instant::now();
        let window = |s: &mut Sizer, full: u64| {
            for i in 0..10 {
                s.on_message(8 * KIB);
                if i < full {
                    s.on_full();
                }
            }
        };
        window(&mut s, 6);
        assert_eq!(s.tick(t0, 1024), Some(2048), "waited on 6 of 10");
        window(&mut s, 6);
        assert_eq!(s.tick(t0, 2048), None, "twice the 64 KiB target: enough");
        window(&mut s, 5);
        assert_eq!(s.tick(t0, 1024), None, "waited on only half");
    }
}
