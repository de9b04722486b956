//! The only `unsafe` of the crate: access to the bytes of registered regions.
//!
//! Two kinds of memory, two kinds of access:
//!
//! * `RB_S`, the staging ring, lives in a region that is never granted to the
//!   peer. [`Staging`] is the right to view it: made once, where the region is
//!   allocated ([`crate::LocalRing::new`]), and moved into the one
//!   [`crate::RingTx`]; its views borrow it, so the borrow checker keeps a
//!   `&mut [u8]` over the ring exclusive.
//! * `RB_R` and the pointer words are peer-writable: a dishonest peer can
//!   change any byte at any moment, so no `&[u8]` or `&u64` over them is ever
//!   formed (a concurrent write under a live shared reference is a data race,
//!   and the compiler may re-read through it a length that was already
//!   validated). Words (headers, end stamps, pointer records, the sleep word)
//!   are read once with atomic loads into locals (rrpc-core's
//!   `Region::atomic_u64`: a reference to an atomic is fine), validated, and
//!   only the locals are used; a message body is copied out with
//!   [`copy_received`], atomic loads again, into the receiver's own buffer
//!   before any decoder sees it.
//!
//! Everything here runs under miri (`mem::tests`), on the heap-backed regions
//! rrpc-core makes there. The workspace denies `unsafe_code` everywhere else.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rrpc_core::Region;

/// The exclusive right to `RB_S`: `len` bytes at `offset` of a staging
/// region. Views borrow it (`&self` shared, `&mut self` exclusive); offsets
/// are relative to the ring's start.
#[derive(Debug)]
pub(crate) struct Staging {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

impl Staging {
    /// Takes the right to view `offset..offset + len` of `region`.
    ///
    /// # Safety
    /// `region` is never granted to a peer, and while the `Staging` lives
    /// nothing reads or writes the range except through it: no other
    /// `Staging` overlaps it, and no `Region` accessor (`slice`, `write_at`,
    /// `read_at`, `atomic_u64`) touches it while one of its views lives. (The
    /// fabric reading a WRITE's source from it is such an accessor: the
    /// driver posts only from methods that hold no view. On verbs the NIC
    /// may still be reading slots whose WRITEs are in flight, a DMA read
    /// outside Rust's memory model; the sender's protocol never rewrites such
    /// slots before their completion.)
    ///
    /// # Panics
    /// If the range is not inside `region`.
    pub(crate) unsafe fn new(region: Arc<Region>, offset: usize, len: usize) -> Staging {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= region.len()),
            "staging range {offset}+{len} outside a region of {} bytes",
            region.len()
        );
        Staging {
            region,
            offset,
            len,
        }
    }

    /// The whole ring, exclusively.
    pub(crate) fn ring_mut(&mut self) -> &mut [u8] {
        self.range_mut(0, self.len)
    }

    /// `len` bytes at `offset` of the ring.
    ///
    /// # Panics
    /// If the range is not inside the ring.
    pub(crate) fn range(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: inside the region (checked here and in `new`); `new`'s
        // contract leaves this `Staging` the only way to the bytes, and
        // `&self` rules out a mutable view of them while this one lives.
        unsafe { self.region.slice(self.offset + offset, len) }
    }

    /// `len` bytes at `offset` of the ring, exclusively.
    ///
    /// # Panics
    /// If the range is not inside the ring.
    pub(crate) fn range_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: inside the region (checked here and in `new`); `new`'s
        // contract leaves this `Staging` the only way to the bytes, and
        // `&mut self` makes this the only view of them while it lives. The
        // peer never reads `RB_S` itself (it is never granted), only what our
        // WRITEs copy out of it, posted while no view lives.
        unsafe { self.region.slice_mut(self.offset + offset, len) }
    }

    /// Gives the ring's bytes from `keep` on back to the system
    /// (`Region::discard`; they read as zero afterwards). Returns the bytes
    /// released.
    ///
    /// # Errors
    /// As `Region::discard`.
    ///
    /// # Panics
    /// If `keep` is past the ring's end.
    pub(crate) fn discard_from(&mut self, keep: usize) -> rrpc_core::Result<usize> {
        assert!(keep <= self.len, "keep {keep} past a ring of {}", self.len);
        // `&mut self`: no view of the bytes lives while they are zeroed.
        self.region.discard(self.offset + keep, self.len - keep)
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "view {offset}+{len} outside a ring of {} bytes",
            self.len
        );
    }
}

/// Copies `dst.len()` bytes of peer-writable `region` at `offset` into
/// `dst`: one pass of relaxed atomic 8-byte loads of the aligned words that
/// cover the range (a region starts on a page and is a whole number of
/// pages long, so they stay inside it). A peer writing meanwhile can only
/// leave garbage in `dst`, never a data race, and nothing it writes
/// afterwards changes what the caller validates and decodes. Read the end stamp that vouches for the
/// bytes first, then fence with `Acquire`, then copy.
///
/// Word loads, not byte loads: the shm provider stores small WRITEs as
/// atomic words, and an access of another size racing with them would be a
/// mixed-size race.
///
/// # Panics
/// If the words covering the range are not inside `region` (that is, the
/// range is not), or the region does not start 8-aligned (it starts on a
/// page).
pub(crate) fn copy_received(region: &Region, offset: usize, dst: &mut [u8]) {
    let len = dst.len();
    assert!(
        offset
            .checked_add(len)
            .and_then(|end| end.checked_next_multiple_of(8))
            .is_some_and(|end| end <= region.len()),
        "copy of {offset}+{len} outside a region of {} bytes",
        region.len()
    );
    let base = region.as_ptr();
    assert!(base.cast::<u64>().is_aligned(), "region start {base:?}");
    if len == 0 {
        return;
    }
    let word = |at: usize| -> [u8; 8] {
        debug_assert!(at.is_multiple_of(8) && at + 8 <= region.len());
        // SAFETY: `at` is a multiple of 8 at or after `offset` rounded down
        // to 8, and `at + 8` at most `offset + len` rounded up to 8, which
        // is inside the region (asserted above); the region's start is
        // 8-aligned (asserted above). So the pointer is valid and aligned
        // for an `AtomicU64` while `region` is borrowed. Every access to a
        // peer-writable region is atomic (8-byte words: ours, and the shm
        // provider's small WRITEs) or a plain copy ordered before ours by
        // the tail's release/acquire (an honest peer's large WRITE); a
        // dishonest peer's write from another process is outside Rust's
        // memory model and can only change the values loaded.
        let w = unsafe { AtomicU64::from_ptr(base.add(at).cast::<u64>()) };
        w.load(Ordering::Relaxed).to_ne_bytes()
    };
    // A partial first word, then whole words, then a partial last word.
    let skip = offset % 8;
    let lead = if skip == 0 { 0 } else { (8 - skip).min(len) };
    if lead > 0 {
        dst[..lead].copy_from_slice(&word(offset - skip)[skip..skip + lead]);
    }
    let mut at = offset + lead;
    let mut words = dst[lead..].chunks_exact_mut(8);
    for chunk in &mut words {
        chunk.copy_from_slice(&word(at));
        at += 8;
    }
    let rest = words.into_remainder();
    if !rest.is_empty() {
        let n = rest.len();
        rest.copy_from_slice(&word(at)[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> Arc<Region> {
        rrpc_core::Fabric::shm()
            .without_huge_pages()
            .alloc_region_with(8192, rrpc_core::Access::LOCAL)
            .unwrap()
    }

    fn staging(r: &Arc<Region>) -> Staging {
        // SAFETY: the region is the test's own, never granted; this is the
        // only `Staging` over the range, and the tests touch the range
        // through other accessors only while no view of it lives.
        unsafe { Staging::new(r.clone(), 4096, 4096) }
    }

    /// Each view covers exactly its range and sees what the others wrote.
    #[test]
    fn staging_views_cover_exactly_their_range() {
        let r = region();
        let mut s = staging(&r);
        s.range_mut(0, 16).copy_from_slice(b"0123456789abcdef");
        assert_eq!(s.range(4, 4), b"4567");
        s.ring_mut()[4095] = 0xee;
        assert_eq!(s.range(4094, 2), [0, 0xee]);
        // Offsets are the ring's: byte 0 is byte 4096 of the region.
        let mut out = [0u8; 16];
        r.read_at(4096, &mut out).unwrap();
        assert_eq!(&out, b"0123456789abcdef");
        assert_eq!(s.ring_mut().len(), 4096);
    }

    #[test]
    #[should_panic(expected = "outside a ring")]
    fn a_staging_view_past_the_end_panics() {
        let r = region();
        let s = staging(&r);
        let _ = s.range(4094, 4);
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn a_staging_range_past_the_region_panics() {
        let r = region();
        // SAFETY: never constructed: the range is out of bounds on purpose.
        let _ = unsafe { Staging::new(r, 4096, 4097) };
    }

    /// Discarding keeps the first `keep` bytes and zeroes the whole pages
    /// after them (heap memory under miri, a punched hole natively).
    #[test]
    fn discard_zeroes_the_end_of_the_ring() {
        let r = rrpc_core::Fabric::shm()
            .without_huge_pages()
            .alloc_region_with(4 * 4096, rrpc_core::Access::LOCAL)
            .unwrap();
        // SAFETY: as `staging`.
        let mut s = unsafe { Staging::new(r.clone(), 4096, 3 * 4096) };
        s.ring_mut().fill(7);
        assert_eq!(s.discard_from(4096).unwrap(), 2 * 4096);
        assert!(s.range(0, 4096).iter().all(|&b| b == 7));
        assert!(s.range(4096, 2 * 4096).iter().all(|&b| b == 0));
    }

    /// Every alignment and length around word boundaries copies exactly
    /// the bytes asked for, up to the region's last byte.
    #[test]
    fn copy_received_copies_exactly_the_range() {
        let r = region();
        let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        r.write_at(4096, &pattern).unwrap();
        r.write_at(8192 - 64, &pattern).unwrap();
        for start in 0..10 {
            for len in 0..=(64 - start).min(27) {
                let mut dst = vec![0xffu8; len + 2];
                copy_received(&r, 4096 + start, &mut dst[1..=len]);
                assert_eq!(&dst[1..=len], &pattern[start..start + len], "{start}+{len}");
                assert_eq!((dst[0], dst[len + 1]), (0xff, 0xff), "{start}+{len}");
            }
        }
        let mut dst = [0u8; 13];
        copy_received(&r, 8192 - 13, &mut dst);
        assert_eq!(&dst[..], &pattern[64 - 13..]);
        copy_received(&r, 8192, &mut []);
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn a_copy_past_the_end_panics() {
        let r = region();
        copy_received(&r, 8190, &mut [0u8; 4]);
    }

    /// A peer that rewrites a message while it is being read (a dishonest
    /// one: an honest peer does not write below the published tail until
    /// the head passes it). With the old `&[u8]` view of `RB_R` this was a
    /// data race, and miri reported it: a non-atomic read through the view
    /// against the other thread's atomic store. The copy reads with atomic
    /// loads, so the bytes it returns are garbage at worst, and the copy
    /// does not change after it was taken.
    #[test]
    fn a_peer_rewriting_a_message_during_the_copy_is_no_data_race() {
        let r = region();
        r.write_at(4096, &[1u8; 64]).unwrap();
        let peer = {
            let r = r.clone();
            std::thread::spawn(move || {
                for round in 0..8u64 {
                    for w in 0..8 {
                        // A WRITE of a small message on shm: atomic words.
                        r.atomic_u64(4096 + w * 8)
                            .unwrap()
                            .store(round * 0x0101_0101_0101_0101, Ordering::Relaxed);
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut copy = [0u8; 61];
        for _ in 0..8 {
            copy_received(&r, 4096 + 3, &mut copy);
            // Each word is one round's value (words never tear), and the
            // copy is ours: validating it twice gives the same answer.
            let first = copy;
            std::thread::yield_now();
            assert_eq!(copy, first);
            assert!(copy.iter().all(|&b| b < 8));
        }
        peer.join().unwrap();
    }
}
