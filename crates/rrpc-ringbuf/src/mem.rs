//! The only `unsafe` of the crate: byte views of registered regions.
//!
//! `RB_S` lives in a region that is never granted to the peer and is owned by
//! one [`crate::RingTx`], so a `&mut [u8]` over it is exclusive. `RB_R` is
//! peer-writable; the receiver only hands out views of slots below the
//! validated `local_tail`, which an honest sender does not touch until the
//! head is pushed past them. A misbehaving peer can change those bytes under
//! the view; the bytes are then garbage but every length and offset derived
//! from them was validated first, so nothing is read out of bounds.
//!
//! The workspace denies `unsafe_code` everywhere else; each caller of these
//! `unsafe fn`s allows it for that one call and says why its precondition
//! holds.
#![allow(unsafe_code)]

use rrpc_core::Region;

/// Exclusive byte view of `RB_S`.
///
/// # Safety
/// `region` is a staging region never granted to a peer, and the caller
/// holds the only handle that reads or writes this range (the `RingTx` that
/// owns it, borrowed mutably) for the lifetime of the returned slice.
/// (On verbs the NIC may still be reading slots whose WRITEs are in
/// flight: a DMA read outside Rust's memory model. The sender's protocol
/// never rewrites such slots before their completion.)
///
/// # Panics
/// If the range is not inside `region`.
#[allow(clippy::mut_from_ref)] // exclusive by the contract above
pub(crate) unsafe fn staging_mut(region: &Region, offset: usize, len: usize) -> &mut [u8] {
    assert!(
        offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len())
    );
    // SAFETY: the range is inside the mapping (asserted above); the caller
    // guarantees no other reference to these bytes is alive.
    unsafe { region.slice_mut(offset, len) }
}

/// Shared byte view of a validated message in `RB_R`.
///
/// # Safety
/// The range is below the receiver's validated `local_tail` and the caller
/// keeps the ring's head from being pushed past it while the view lives
/// (the `ReadGuard` borrows the `RingRx`), so an honest peer does not write
/// it. A dishonest one can only change byte values, which is no UB for `u8`.
///
/// # Panics
/// If the range is not inside `region`.
pub(crate) unsafe fn received(region: &Region, offset: usize, len: usize) -> &[u8] {
    assert!(
        offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len())
    );
    // SAFETY: the range is inside the mapping (asserted above); the caller
    // guarantees the honest peer does not write it while the view lives.
    unsafe { region.slice(offset, len) }
}

/// Shared byte view of part of `RB_S` (for `WriteGuard`'s `Deref`).
///
/// # Safety
/// As [`staging_mut`], except that the caller may hold other shared views:
/// no mutable view of the range lives as long as this one.
///
/// # Panics
/// If the range is not inside `region`.
pub(crate) unsafe fn staging(region: &Region, offset: usize, len: usize) -> &[u8] {
    assert!(
        offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len())
    );
    // SAFETY: in bounds (asserted); the caller guarantees no mutable view.
    unsafe { region.slice(offset, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> std::sync::Arc<Region> {
        rrpc_core::Fabric::shm()
            .without_huge_pages()
            .alloc_region_with(8192, rrpc_core::Access::LOCAL)
            .unwrap()
    }

    /// Each view covers exactly its range and sees what the others wrote.
    /// Runs under miri too, on heap memory.
    #[test]
    fn views_cover_exactly_their_range() {
        let r = region();
        // SAFETY: the region is ours and never granted; no other view lives.
        unsafe { staging_mut(&r, 4096, 16) }.copy_from_slice(b"0123456789abcdef");
        // SAFETY: the mutable view above is gone; nothing writes meanwhile.
        assert_eq!(unsafe { staging(&r, 4100, 4) }, b"4567");
        // SAFETY: as above.
        assert_eq!(unsafe { received(&r, 4096, 16) }, b"0123456789abcdef");
        // SAFETY: as above; the last bytes of the region.
        assert_eq!(unsafe { received(&r, 8190, 2) }, [0, 0]);
    }

    #[test]
    #[should_panic]
    fn a_view_past_the_end_panics() {
        let r = region();
        // SAFETY: no other view lives; the range is out of bounds on purpose.
        let _ = unsafe { staging(&r, 8190, 4) };
    }
}
