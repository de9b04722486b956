//! The only `unsafe` of the crate: byte views of registered regions.
//!
//! `RB_S` lives in a region that is never granted to the peer and is owned by
//! one [`crate::RingTx`], so a `&mut [u8]` over it is exclusive. `RB_R` is
//! peer-writable; the receiver only hands out views of slots below the
//! validated `local_tail`, which an honest sender does not touch until the
//! head is pushed past them. A misbehaving peer can change those bytes under
//! the view; the bytes are then garbage but every length and offset derived
//! from them was validated first, so nothing is read out of bounds.

use rrpc_core::Region;

/// Exclusive byte view of `RB_S`.
///
/// The caller must hold the only handle that writes this range (the
/// `RingTx` that owns the unshared staging region) for the lifetime of the
/// returned slice.
#[allow(clippy::mut_from_ref)] // exclusive by construction, see above
pub(crate) fn staging_mut(region: &Region, offset: usize, len: usize) -> &mut [u8] {
    assert!(
        offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len())
    );
    // SAFETY: the range is inside the mapping (asserted above); the staging
    // region is never granted to a peer and only the owning RingTx calls this
    // (through `&mut self`), so no other reference to these bytes is alive.
    unsafe { region.slice_mut(offset, len) }
}

/// Shared byte view of a validated message in `RB_R`.
pub(crate) fn received(region: &Region, offset: usize, len: usize) -> &[u8] {
    assert!(
        offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len())
    );
    // SAFETY: the range is inside the mapping (asserted above) and below the
    // validated local_tail: the honest peer does not write it until we push
    // a head past it, which happens only after this view is dropped. A
    // dishonest peer can only change the bytes' values (no UB for `u8`).
    unsafe { region.slice(offset, len) }
}

/// Shared byte view of part of `RB_S` (for `WriteGuard`'s `Deref`).
pub(crate) fn staging(region: &Region, offset: usize, len: usize) -> &[u8] {
    assert!(
        offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len())
    );
    // SAFETY: in bounds (asserted); the staging region is written only by the
    // owning RingTx, which is borrowed by the guard calling this.
    unsafe { region.slice(offset, len) }
}
