//! The ring's part of the connection handshake: what one side tells its
//! peer about its ring, so that the peer refuses a ring it would misread
//! instead of misreading it.
//!
//! The fabric carries these bytes without reading them: they travel as a
//! handshake section ([`rrpc_core::Section`]) under the tag that is also the
//! ring region's role ([`ROLE_RING`](crate::ROLE_RING), or the role given to
//! [`LocalRing::add_to_offer_as`](crate::LocalRing::add_to_offer_as)).
//! The layout, little endian, 26 bytes:
//!
//! ```text
//! version u8 (1) | flags u32 | size_shift u8 | slot_size u32 | slot_count u32 | alpha u32 | beta u32 | gamma u32
//! ```
//!
//! Both sides must agree on the slot size and count and on the switches
//! that change what a peer writes ([`FLAG_UNALIGNED`], [`FLAG_TAIL_IMM`]).
//! `alpha`, `beta` and `gamma` are informational: each side's thresholds
//! only pace its own WRITEs. The parameters are peer-written bytes:
//! [`RingParams::decode`] refuses anything it does not know, and a fuzz
//! target (`fuzz/`, `params_decode`) holds it to never
//! panicking.

use crate::config::RingConfig;
use crate::error::Error;

/// The layout version this build writes and reads.
pub const VERSION: u8 = 1;
/// Length of the encoded parameters.
pub const LEN: usize = 26;

/// The ring array is *not* cache-line aligned ([`RingConfig::cache_align`]
/// off).
pub const FLAG_UNALIGNED: u32 = 1 << 0;
/// This side's sender writes its tail with `WRITE_WITH_IMM`
/// ([`RingConfig::tail_with_imm`]).
pub const FLAG_TAIL_IMM: u32 = 1 << 1;
/// This side's tail and head are 16-byte pointer records (`proto` docs,
/// "Pointer records"). Always set; a peer without it is refused.
pub const FLAG_POINTER_RECORDS: u32 = 1 << 2;
/// This side's sender reads the sleep word after each tail and rings the
/// doorbell ([`crate::proto::doorbell`]). Always set; a receiver whose peer
/// lacks it cannot rely on a doorbell
/// ([`RxDoorbell::peer_rings`](crate::RxDoorbell::peer_rings)).
pub const FLAG_DOORBELL: u32 = 1 << 3;
/// This side's sender sizes its ring itself ([`RingConfig::min_ring_size`])
/// and writes resize markers the peer's receiver must follow (`proto` docs,
/// "Rings that size themselves"). It starts with `slot_count >> size_shift`
/// slots.
pub const FLAG_SELF_SIZING: u32 = 1 << 4;
const KNOWN_FLAGS: u32 =
    FLAG_UNALIGNED | FLAG_TAIL_IMM | FLAG_POINTER_RECORDS | FLAG_DOORBELL | FLAG_SELF_SIZING;

/// One side's ring, as its handshake section describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingParams {
    /// `FLAG_*` switches.
    pub flags: u32,
    /// log2 of `ring_size / min_ring_size` of a self-sizing sender (at most
    /// [`crate::MAX_SIZE_RATIO`]); 0 otherwise.
    pub size_shift: u8,
    /// Bytes per slot.
    pub slot_size: u32,
    /// Slots in the whole ring.
    pub slot_count: u32,
    /// Pointer-advancement batch (RB² α).
    pub alpha: u32,
    /// Slot-transmission batch (RB² β).
    pub beta: u32,
    /// Head-push threshold (RB² γ).
    pub gamma: u32,
}

impl RingParams {
    /// The parameters of a ring built from `cfg`.
    pub fn of(cfg: &RingConfig) -> RingParams {
        let mut flags = FLAG_POINTER_RECORDS | FLAG_DOORBELL;
        if !cfg.cache_align() {
            flags |= FLAG_UNALIGNED;
        }
        if cfg.tail_with_imm() {
            flags |= FLAG_TAIL_IMM;
        }
        let mut size_shift = 0;
        if cfg.self_sizing() {
            flags |= FLAG_SELF_SIZING;
            size_shift = (cfg.ring_size() / cfg.min_ring_size()).trailing_zeros() as u8;
        }
        RingParams {
            flags,
            size_shift,
            slot_size: cfg.slot_size() as u32,
            slot_count: cfg.slot_count() as u32,
            alpha: cfg.alpha(),
            beta: cfg.beta(),
            gamma: cfg.gamma(),
        }
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// The section's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(LEN);
        b.push(VERSION);
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.push(self.size_shift);
        for v in [
            self.slot_size,
            self.slot_count,
            self.alpha,
            self.beta,
            self.gamma,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Reads a peer's section.
    ///
    /// # Errors
    /// [`Error::Incompatible`], saying what was wrong, for another layout
    /// version, a wrong length or flags this build does not know.
    pub fn decode(b: &[u8]) -> Result<RingParams, Error> {
        match b.first() {
            Some(&VERSION) => {}
            Some(v) => {
                return Err(Error::Incompatible(format!(
                    "peer ring parameters are version {v}, ours {VERSION}"
                )));
            }
            None => return Err(Error::Incompatible("peer ring parameters are empty".into())),
        }
        if b.len() != LEN {
            return Err(Error::Incompatible(format!(
                "peer ring parameters are {} bytes, version {VERSION} has {LEN}",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let p = RingParams {
            flags: u32_at(1),
            size_shift: b[5],
            slot_size: u32_at(6),
            slot_count: u32_at(10),
            alpha: u32_at(14),
            beta: u32_at(18),
            gamma: u32_at(22),
        };
        let unknown = p.flags & !KNOWN_FLAGS;
        if unknown != 0 {
            return Err(Error::Incompatible(format!(
                "peer ring sets unknown flags {unknown:#x}"
            )));
        }
        Ok(p)
    }

    /// Checks a peer's parameters against ours (`self`); returns the slot
    /// count the peer's sender starts with.
    ///
    /// # Errors
    /// [`Error::Incompatible`], naming the peer's and our value, when the
    /// rings differ in a way one side would misread.
    pub fn check_peer(&self, peer: &RingParams) -> Result<u64, Error> {
        if peer.slot_size != self.slot_size || peer.slot_count != self.slot_count {
            return Err(Error::Incompatible(format!(
                "peer ring has {} slots of {} bytes, ours {} slots of {} bytes",
                peer.slot_count, peer.slot_size, self.slot_count, self.slot_size
            )));
        }
        if !peer.has(FLAG_POINTER_RECORDS) {
            return Err(Error::Incompatible(
                "peer ring writes 8-byte pointer words, ours 16-byte pointer records".into(),
            ));
        }
        let (pa, oa) = (!peer.has(FLAG_UNALIGNED), !self.has(FLAG_UNALIGNED));
        if pa != oa {
            return Err(Error::Incompatible(format!(
                "peer ring has cache_align = {pa}, ours cache_align = {oa}"
            )));
        }
        let (pi, oi) = (peer.has(FLAG_TAIL_IMM), self.has(FLAG_TAIL_IMM));
        if pi != oi {
            return Err(Error::Incompatible(format!(
                "peer ring has tail_with_imm = {pi}, ours tail_with_imm = {oi}"
            )));
        }
        let shift = u32::from(peer.size_shift);
        if shift != 0 && !peer.has(FLAG_SELF_SIZING) {
            return Err(Error::Incompatible(format!(
                "peer ring names an initial size (shift {shift}) but does not size itself"
            )));
        }
        let initial = u64::from(peer.slot_count.checked_shr(shift).unwrap_or(0));
        if initial < crate::MIN_SLOT_COUNT {
            return Err(Error::Incompatible(format!(
                "peer ring starts with {initial} slots (slot count {} >> {shift}), fewer than {}",
                peer.slot_count,
                crate::MIN_SLOT_COUNT
            )));
        }
        Ok(initial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(flags: u32, size_shift: u8) -> RingParams {
        RingParams {
            flags,
            size_shift,
            slot_size: 64,
            slot_count: 1024,
            alpha: 1,
            beta: 1,
            gamma: 1,
        }
    }

    #[test]
    fn a_peer_without_pointer_records_is_refused() {
        let ours = params(FLAG_POINTER_RECORDS, 0);
        assert!(ours.check_peer(&ours).is_ok());
        let e = ours.check_peer(&params(0, 0)).unwrap_err();
        assert!(
            matches!(&e, Error::Incompatible(m) if m.contains("8-byte pointer words")),
            "{e}"
        );
    }

    #[test]
    fn a_self_sizing_peer_tells_its_start_and_a_bad_one_is_refused() {
        let ours = params(FLAG_POINTER_RECORDS, 0);
        assert_eq!(ours.check_peer(&ours).unwrap(), 1024, "fixed");
        let sizing = params(FLAG_POINTER_RECORDS | FLAG_SELF_SIZING, 3);
        assert_eq!(ours.check_peer(&sizing).unwrap(), 128, "1024 >> 3");
        let e = ours
            .check_peer(&params(FLAG_POINTER_RECORDS, 3))
            .unwrap_err();
        assert!(
            matches!(&e, Error::Incompatible(m) if m.contains("does not size itself")),
            "{e}"
        );
        let (mut small, mut tiny) = (ours, params(FLAG_POINTER_RECORDS | FLAG_SELF_SIZING, 7));
        (small.slot_count, tiny.slot_count) = (128, 128);
        let e = small.check_peer(&tiny).unwrap_err();
        assert!(
            matches!(&e, Error::Incompatible(m) if m.contains("starts with 1 slots")),
            "{e}"
        );
        // A shift past the width of the count starts with nothing.
        let e = ours
            .check_peer(&params(FLAG_POINTER_RECORDS | FLAG_SELF_SIZING, 200))
            .unwrap_err();
        assert!(
            matches!(&e, Error::Incompatible(m) if m.contains("starts with 0 slots")),
            "{e}"
        );
    }

    #[test]
    fn what_a_peer_cannot_send_is_refused_with_its_reason() {
        let good = params(FLAG_POINTER_RECORDS, 0).encode();
        let mut version = good.clone();
        version[0] = 2;
        let mut flags = good.clone();
        flags[4] = 0x80;
        let cases: [(&[u8], &str); 5] = [
            (&[], "empty"),
            (&version, "version 2"),
            (&good[..LEN - 1], "25 bytes"),
            (&[good.as_slice(), &[0]].concat(), "27 bytes"),
            (&flags, "unknown flags 0x80000000"),
        ];
        for (bytes, why) in cases {
            match RingParams::decode(bytes) {
                Err(Error::Incompatible(m)) => assert!(m.contains(why), "{why}: {m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_config_s_parameters_describe_it() {
        let cfg = RingConfig::builder()
            .cache_align(false)
            .tail_with_imm(true)
            .build()
            .unwrap();
        let p = RingParams::of(&cfg);
        assert!(p.has(FLAG_UNALIGNED) && p.has(FLAG_TAIL_IMM) && p.has(FLAG_DOORBELL));
        assert!(!p.has(FLAG_SELF_SIZING) && p.size_shift == 0);
        assert_eq!(
            (p.slot_size as usize, u64::from(p.slot_count)),
            (cfg.slot_size(), cfg.slot_count())
        );
        assert_eq!(p.check_peer(&p).unwrap(), cfg.slot_count());
    }

    proptest! {
        #[test]
        fn known_parameters_round_trip(
            flags in 0..=KNOWN_FLAGS,
            v in any::<(u8, u32, u32, u32, u32, u32)>(),
        ) {
            let p = RingParams {
                flags,
                size_shift: v.0,
                slot_size: v.1,
                slot_count: v.2,
                alpha: v.3,
                beta: v.4,
                gamma: v.5,
            };
            let b = p.encode();
            prop_assert_eq!(b.len(), LEN);
            prop_assert_eq!(RingParams::decode(&b).unwrap(), p);
        }

        #[test]
        fn garbage_is_an_error_or_parameters(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = RingParams::decode(&data) {
                prop_assert_eq!(p.encode(), data);
            }
        }
    }
}
