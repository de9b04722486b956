//! Arenas: memory one end grants the other once, cut into slots, one
//! slot per ring of a logical connection. The owner hands slots out and
//! takes them back ([`Arena`]); the grantee checks that every slice the
//! owner names lies on a slot of an arena it was granted ([`PeerArenas`]).

use std::collections::{HashMap, HashSet};

use super::wire::Slice;
use crate::error::{Error, Result};

/// The most arenas one end may grant the other per shared connection.
pub const MAX_ARENAS: usize = 64;

/// An arena of ours, granted to the peer: which slots are free.
#[derive(Debug)]
pub struct Arena {
    id: u16,
    slot: u32,
    len: u64,
    /// Offsets of the free slots, the lowest taken first.
    free: Vec<u64>,
}

impl Arena {
    /// `len` bytes in slots of `slot` bytes (a whole number of them; a
    /// tail shorter than a slot is not used).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a slot of 0 bytes or an arena shorter
    /// than one slot.
    pub fn new(id: u16, len: u64, slot: u32) -> Result<Arena> {
        if slot == 0 || len < u64::from(slot) {
            return Err(Error::InvalidConfig(format!(
                "an arena of {len} bytes in slots of {slot}"
            )));
        }
        let n = len / u64::from(slot);
        let free = (0..n).rev().map(|i| i * u64::from(slot)).collect();
        Ok(Arena {
            id,
            slot,
            len,
            free,
        })
    }

    /// Its id, as its grant names it.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Its slot size.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Its length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it has no slots at all (never: [`Arena::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Free slots.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// A free slot, `len` bytes of it, if there is one and `len` fits.
    pub fn take(&mut self, len: u64) -> Option<Slice> {
        if len > u64::from(self.slot) {
            return None;
        }
        let offset = self.free.pop()?;
        Some(Slice {
            arena: self.id,
            offset,
            len,
        })
    }

    /// Takes a slot back (after the close handshake: the peer writes into
    /// it no more).
    ///
    /// # Panics
    /// In debug builds, for a slice not of this arena or given back twice
    /// (a bug here, never the peer's doing: the peer names no slice of
    /// ours that we take back).
    pub fn give_back(&mut self, s: Slice) {
        debug_assert_eq!(s.arena, self.id);
        debug_assert!(!self.free.contains(&s.offset), "{s:?} given back twice");
        self.free.push(s.offset);
    }
}

/// The arenas the peer granted us, and which of their slots its open
/// logical connections use.
#[derive(Debug, Default)]
pub struct PeerArenas {
    /// By id: (slot size, length).
    arenas: HashMap<u16, (u32, u64)>,
    in_use: HashSet<(u16, u64)>,
}

impl PeerArenas {
    /// Records the peer's grant of an arena.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for an id granted before, a slot of 0
    /// bytes or one longer than the arena; [`Error::LimitExceeded`] past
    /// [`MAX_ARENAS`] or past `max_bytes` granted in all.
    pub fn grant(&mut self, arena: u16, slot: u32, len: u64, max_bytes: u64) -> Result<()> {
        if self.arenas.contains_key(&arena) {
            return Err(Error::MalformedHandshake(format!(
                "arena {arena} granted twice"
            )));
        }
        if slot == 0 || u64::from(slot) > len {
            return Err(Error::MalformedHandshake(format!(
                "arena {arena} of {len} bytes in slots of {slot}"
            )));
        }
        if self.arenas.len() >= MAX_ARENAS {
            return Err(Error::LimitExceeded {
                what: "arenas granted per shared connection",
                requested: self.arenas.len() as u64 + 1,
                limit: MAX_ARENAS as u64,
            });
        }
        let total = self.bytes().saturating_add(len);
        if total > max_bytes {
            return Err(Error::LimitExceeded {
                what: "arena bytes granted per shared connection",
                requested: total,
                limit: max_bytes,
            });
        }
        self.arenas.insert(arena, (slot, len));
        Ok(())
    }

    /// The bytes granted in all.
    pub fn bytes(&self) -> u64 {
        self.arenas.values().map(|(_, l)| l).sum()
    }

    /// Checks that `s` lies on one slot of an arena the peer granted us,
    /// and that no open logical connection uses that slot; then marks it
    /// used.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] naming what was wrong: nothing is
    /// marked then.
    pub fn claim(&mut self, s: Slice) -> Result<()> {
        let &(slot, len) = self.arenas.get(&s.arena).ok_or_else(|| {
            Error::MalformedHandshake(format!("slice of arena {} never granted", s.arena))
        })?;
        let fits = s.offset.is_multiple_of(u64::from(slot))
            && s.len <= u64::from(slot)
            && s.offset.checked_add(s.len).is_some_and(|end| end <= len);
        if !fits {
            return Err(Error::MalformedHandshake(format!(
                "slice {}+{} is no slot of arena {} ({len} bytes in slots of {slot})",
                s.offset, s.len, s.arena
            )));
        }
        if !self.in_use.insert((s.arena, s.offset)) {
            return Err(Error::MalformedHandshake(format!(
                "slice {} of arena {} already in use",
                s.offset, s.arena
            )));
        }
        Ok(())
    }

    /// Lets the slot of `s` be named again (its connection closed).
    pub fn release(&mut self, s: Slice) {
        self.in_use.remove(&(s.arena, s.offset));
    }

    /// Slots the peer's open logical connections use.
    pub fn in_use(&self) -> usize {
        self.in_use.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arena_hands_out_each_slot_once_and_takes_it_back() {
        let mut a = Arena::new(1, 3 * 4096 + 100, 4096).unwrap();
        assert_eq!(a.free(), 3);
        let s: Vec<_> = (0..3).map(|_| a.take(4000).unwrap()).collect();
        assert_eq!(
            s.iter().map(|s| s.offset).collect::<Vec<_>>(),
            [0, 4096, 8192]
        );
        assert_eq!(a.take(1), None);
        a.give_back(s[1]);
        assert_eq!(a.take(4096).unwrap().offset, 4096);
        assert_eq!(a.take(1), None);
        a.give_back(s[0]);
        assert_eq!(a.take(4097), None, "longer than a slot");
        assert!(Arena::new(1, 100, 4096).is_err());
        assert!(Arena::new(1, 100, 0).is_err());
    }

    #[test]
    fn a_peer_names_only_whole_slots_of_arenas_it_granted() {
        let mut p = PeerArenas::default();
        p.grant(2, 4096, 4 * 4096, u64::MAX).unwrap();
        let s = |arena, offset, len| Slice { arena, offset, len };
        for (bad, says) in [
            (s(3, 0, 4096), "never granted"),
            (s(2, 100, 10), "no slot"),
            (s(2, 0, 4097), "no slot"),
            (s(2, 4 * 4096, 1), "no slot"),
            (s(2, u64::MAX - 4095, 4096), "no slot"),
        ] {
            let e = p.claim(bad).unwrap_err();
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
        assert_eq!(p.in_use(), 0);
        p.claim(s(2, 4096, 4096)).unwrap();
        assert!(
            p.claim(s(2, 4096, 10))
                .unwrap_err()
                .to_string()
                .contains("already in use")
        );
        p.release(s(2, 4096, 4096));
        p.claim(s(2, 4096, 10)).unwrap();
        // Grants: twice, degenerate, past the bounds.
        assert!(p.grant(2, 4096, 4096, u64::MAX).is_err());
        assert!(p.grant(3, 0, 4096, u64::MAX).is_err());
        assert!(p.grant(3, 8192, 4096, u64::MAX).is_err());
        assert!(matches!(
            p.grant(3, 4096, 4096, 4 * 4096),
            Err(Error::LimitExceeded { .. })
        ));
        for id in 3..(2 + MAX_ARENAS as u16) {
            p.grant(id, 1, 1, u64::MAX).unwrap();
        }
        assert!(matches!(
            p.grant(999, 1, 1, u64::MAX),
            Err(Error::LimitExceeded { .. })
        ));
    }
}
