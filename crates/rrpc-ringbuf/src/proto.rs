//! Sans-IO pointer logic of RB² (Algorithm 1): no memory mapping, no queue
//! pairs, no clocks. [`Sender`] and [`Receiver`] take events (`handle_*`) and
//! hand out work requests to post (`poll_transmit`); the crate's driver
//! (`LocalRing`, `RingTx`, `RingRx`) executes them on an `rrpc-core` queue
//! pair.
//!
//! Pointers are absolute slot counters (`u64`, never wrapping in practice);
//! the slot index is `pointer % N`. Using absolute counters lets the whole
//! array be used (`tail - head == N` is full, `tail == head` empty) and makes
//! every peer-written pointer checkable against the ones we hold.
//!
//! # Message format (slot-to-slot layout, RB² §III-A C5)
//! A message occupies `ceil((8 + len + 8) / slot_size)` contiguous slots. It
//! starts with an 8-byte little-endian header
//! `len: u32 | flags: u16 | tag: u16`, where `tag` is [`tag_for`]`(pos)` and
//! `pos` the absolute slot pointer of the message, and it ends with an
//! 8-byte *end stamp*, [`stamp_for`]`(pos)`, in the last 8 bytes of its last
//! slot. A message that would cross the end of the array is placed at index
//! 0; the slots up to the end get a *gap* header (flag bit 0, `len = 0`)
//! and the gap's end stamp in the last 8 bytes of the array.
//!
//! # Gaps
//! A gap ends with a stamp, like a message, because consuming it frees its
//! slots for reuse: the sender then writes new messages into the same
//! bytes of `RB_S`. Without the stamp, a receiver could pass a gap whose
//! header was placed while the rest of its WRITE was still being read from
//! `RB_S`; that WRITE could then carry bytes of the next message, and
//! place its end stamp before its payload (found by the pair harness with a
//! responder that shows a tail before the slots it covers).
//!
//! # Placement order: what the ring relies on
//! The sender publishes a message with two WRITEs on one RC queue pair: the
//! slots, then the tail word that covers them (§IV-A "write twice"). The
//! receiver polls the tail word in its own memory and then reads the slots.
//! That is correct only if the slots' bytes are visible to the receiver's
//! CPU no later than the tail's. What guarantees what:
//!
//! * **RC** executes the two WRITEs in order and completes them in order.
//!   The InfiniBand specification says nothing of the order in which a
//!   responder's memory writes become visible to a CPU polling that memory,
//!   across WRITEs or within one; only a completion (a CQE for a
//!   `WRITE_WITH_IMM` or a SEND) orders placement before it.
//! * **In practice** responders place each WRITE's data in address order and
//!   a WRITE before the next one (PCIe posted writes are ordered unless the
//!   relaxed-ordering attribute is set, and rrpc never registers memory with
//!   `IBV_ACCESS_RELAXED_ORDERING`); soft-RoCE applies packets in order in
//!   the kernel. RB², FaRM and HERD rely on the same.
//! * **shm** copies the slots, then stores the tail with `Release`; the
//!   receiver loads it with `Acquire`: ordered by the memory model.
//!
//! So that a responder that does reorder across WRITEs (the tail visible
//! before the slots it covers) costs a wait, never a wrong message or a
//! closed connection, the receiver checks both ends of every message: a
//! header whose tag is not the one for `pos` (a stale header of an earlier
//! lap, or none yet) or an end stamp that is not `stamp_for(pos)` means
//! "covered by the tail but not placed yet". [`Receiver::poll_recv`] then
//! returns `None` and reports it through [`Receiver::unplaced`]; the driver
//! polls again and, if the message is still not placed after its
//! placement timeout (a peer that wrote garbage), closes the ring with
//! [`Error::Corrupt`](crate::Error::Corrupt). The end stamp is 64 bits of
//! the absolute pointer, so no stale stamp of an earlier lap ever matches.
//! What stays assumed: that a responder places the bytes of one WRITE in
//! address order (the end stamp last). A device that does not (none known)
//! would need the tail carried by `WRITE_WITH_IMM` and its completion polled
//! before reading; that is not implemented.
//!
//! # Reusing staging: the head and the completions
//! A slot of `RB_S` is rewritten only once the receiver has read it (its
//! head pushed past it) **and** the WRITE that carried it completed
//! ([`Sender::reusable_before`]). The head alone is not enough: a WRITE's
//! source must not change before its completion, because an RC requester
//! whose ACK was lost retransmits the WRITE, reading the source again, and
//! the responder executes the duplicate again; new bytes in `RB_S` could
//! then land over a message the receiver has not read yet. (Found by the
//! pair harness, whose responder may show a tail before the WRITE it
//! follows has finished reading its source.) When only completions stand
//! between a writer and room, the sender says so
//! ([`Sender::awaits_completions`], part of
//! [`Sender::wants_completions`]) so that a waiting driver polls them
//! instead of waiting for a head that may not move again. On shm a WRITE's
//! bytes are copied inside its post, so the driver tells the sender
//! ([`Sender::set_source_read_in_post`]) and the bound is the head, with
//! nothing tracked (the ring's cost per message is what it was). A resize takes
//! effect on the same condition, so the staging a shrink gives back is
//! read by no WRITE.
//!
//! # Pointer records: the tail and the head are 16 bytes
//! The tail (sender → receiver) and the head (receiver → sender) travel as
//! a 16-byte *pointer record*: the value, then [`pointer_check`]`(value)`,
//! written by one WRITE ([`encode_pointer`]); the reader loads both words
//! and takes the value only when the check matches ([`decode_pointer`]).
//! An aligned 8-byte WRITE is seen whole on a NIC, but nothing requires a
//! responder to store it in one piece: soft-RoCE copies the payload with
//! the kernel's `memcpy`, which may store byte by byte (seen in the CI's
//! VM: a receiver read tail `0x2A00` while the tail went from `0x2AFE` to
//! `0x2B00`, and closed the ring as corrupt). A torn value can be too low
//! (refused as a pointer moving backwards) or too high (covering slots
//! never written), so it must not be used at all. The check is a full
//! 64-bit mix of the value, so a record mixed from two writes passes with
//! probability about 2^-64; a mismatch is "being written, read again"
//! ([`Receiver::handle_tail_record`], [`Sender::handle_head_record`]),
//! and the driver closes the ring if the record stays inconsistent past
//! its placement timeout (a peer that wrote garbage there).
//!
//! The check costs 8 bytes per message (a message that filled its last
//! slot to within 8 bytes takes one more slot) and one more load, from
//! the same cache line for messages of one slot.
//!
//! # Rings that size themselves
//! A ring's array is registered at its largest size ([`crate::RingConfig::ring_size`]),
//! but a self-sizing sender ([`crate::RingConfig::min_ring_size`]) uses only its first
//! `n` slots, `n` a power of two between the two sizes, chosen by the
//! [`sizing`] policy from what the sender observes. Pointers stay absolute;
//! only the slot index (`pos % n`) changes. The switch is in-band:
//!
//! 1. The sender writes a *resize marker* at `tail`: one slot whose header
//!    has [`FLAG_RESIZE`] and the new slot count in `len`, with the end stamp
//!    of its slot, in the old geometry. It flushes it at once and takes the
//!    new geometry from the next slot on.
//! 2. It writes nothing more until the receiver's head has passed the marker
//!    and the WRITEs before it completed ([`Sender::switch_pending`]): only
//!    then is every slot of the old geometry read, so the new indexing can
//!    reuse them. A waiting writer
//!    sees a full ring and waits for the head like any other.
//! 3. The receiver reads the marker in order, like a gap: it validates it
//!    (a power of two within the array, the stamp of its slot), takes the new
//!    geometry for everything after it, and pushes its head at once.
//!
//! So the switch point is one slot both sides see in the same order: no
//! message is lost, duplicated or reordered across it, and it costs one
//! round trip (the head push) per resize. After a shrink both sides may give
//! the unused end of their arrays back to the system (the driver does on
//! shm: `rrpc_core::Region::discard`). The initial size travels in the
//! handshake; a fixed ring never writes a marker.
//!
//! # Poll order
//! After any call that can create work (`commit`, `flush`, `reserve` on a full
//! ring, `handle_completion`), the driver drains `poll_transmit` and posts the
//! work requests in the order returned (slots before the tail that covers
//! them).
#![forbid(unsafe_code)]

mod budget;
mod closed;
pub mod doorbell;
pub(crate) mod layout;
pub mod params;
mod receiver;
mod sender;
pub mod sizing;

pub use layout::{HEADER_LEN, OVERHEAD, TRAILER_LEN};
pub use receiver::{HeadPush, Message, Receiver};
pub use sender::{Reservation, Sender, SenderStats, Transmit};

/// Header flag: the slots from here to the end of the array are a gap.
pub const FLAG_GAP: u16 = 1;
/// Header flag: a one-slot resize marker; `len` is the slot count of
/// everything after it (module docs, "Rings that size themselves").
pub const FLAG_RESIZE: u16 = 2;
const TAG_MAGIC: u16 = 0xB2B2;

/// Bits of a work-request id that carry the sequence number.
pub const WR_SEQ_MASK: u64 = (1 << 56) - 1;
/// `wr_id` kind tag of a sender work request (slots or tail).
pub const WR_KIND_TX: u64 = 1 << 56;
/// `wr_id` kind tag of a receiver work request (head push).
pub const WR_KIND_RX: u64 = 2 << 56;
/// `wr_id` kind tag of a sleep word's WRITE (its sequence is the epoch).
pub const WR_KIND_SLEEP: u64 = 3 << 56;
/// `wr_id` kind tag of a doorbell `WRITE_WITH_IMM`.
pub const WR_KIND_BELL: u64 = 4 << 56;

/// Upper bound on tail WRITEs in flight when the elastic threshold is off
/// (one source word each, see [`Transmit::Tail`]).
pub const MAX_TAIL_INFLIGHT: usize = 8;

/// Volume threshold in slots, on top of RB²'s message-counted `alpha` and
/// `gamma`: the sender advances its tail and the receiver pushes its head
/// once `max(N / 8, 8)` slots (capped at `N`) are pending, however few
/// messages that is. The paper's thresholds count messages, which is right
/// for small ones; a 4 MiB ring holds only three 1 MiB messages, so without
/// this the tail would move only when the ring is full and the head only
/// when it is empty, and sender and receiver would take turns instead of
/// overlapping (Exp#1's large messages reach line rate only pipelined).
/// Small messages never reach it before `alpha` / `gamma` (at 64 B and the
/// defaults, `N / 8` is 8192 slots, 4096 messages).
pub fn flush_slots(slot_count: u64) -> u64 {
    (slot_count / 8).max(8).min(slot_count)
}

/// Ring geometry: slot size and count, both powers of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    slot_size: usize,
    slot_count: u64,
}

impl Geometry {
    /// A geometry of `slot_count` slots of `slot_size` bytes.
    ///
    /// # Panics
    /// If either is not a power of two, `slot_size < 16` or `slot_count < 2`
    /// (the config builder validates these for callers).
    pub fn new(slot_size: usize, slot_count: u64) -> Self {
        assert!(slot_size.is_power_of_two() && slot_size >= 16);
        assert!(slot_count.is_power_of_two() && slot_count >= 2);
        Geometry {
            slot_size,
            slot_count,
        }
    }
    /// From a validated config.
    pub fn from_config(cfg: &crate::RingConfig) -> Self {
        Geometry::new(cfg.slot_size(), cfg.slot_count())
    }
    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    /// Number of slots `N`.
    pub fn slot_count(&self) -> u64 {
        self.slot_count
    }
    /// Bytes in the array.
    pub fn ring_bytes(&self) -> usize {
        self.slot_size * self.slot_count as usize
    }
    /// Largest payload of one message.
    pub fn max_payload(&self) -> usize {
        self.ring_bytes() - OVERHEAD
    }
    /// Slots a payload of `len` bytes occupies (header and end stamp included).
    pub fn slots_for(&self, len: usize) -> u64 {
        (OVERHEAD + len).div_ceil(self.slot_size) as u64
    }
    /// Byte offset in the array of the end stamp of a message of `slots`
    /// slots at absolute pointer `pos`.
    pub fn stamp_offset(&self, pos: u64, slots: u64) -> usize {
        self.offset(pos) + slots as usize * self.slot_size - TRAILER_LEN
    }
    /// Slot index of an absolute pointer.
    pub fn index(&self, pos: u64) -> u64 {
        pos & (self.slot_count - 1)
    }
    /// Byte offset in the array of an absolute pointer.
    pub fn offset(&self, pos: u64) -> usize {
        self.index(pos) as usize * self.slot_size
    }
}

/// A decoded message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload length.
    pub len: u32,
    /// Flags ([`FLAG_GAP`]).
    pub flags: u16,
    /// Check tag derived from the slot pointer.
    pub tag: u16,
}

impl Header {
    /// The header of a message (or gap) at absolute slot `pos`.
    pub fn new(len: u32, flags: u16, pos: u64) -> Self {
        Header {
            len,
            flags,
            tag: tag_for(pos),
        }
    }
    /// Encodes to the 8-byte wire form (also its value as a little-endian `u64`).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..6].copy_from_slice(&self.flags.to_le_bytes());
        b[6..8].copy_from_slice(&self.tag.to_le_bytes());
        b
    }
    /// Decodes the header from the little-endian `u64` read at a slot start.
    pub fn decode(word: u64) -> Self {
        let b = word.to_le_bytes();
        Header {
            len: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            flags: u16::from_le_bytes([b[4], b[5]]),
            tag: u16::from_le_bytes([b[6], b[7]]),
        }
    }
}

/// Multiplier of the pointer hashes (2^64 / golden ratio, odd: a bijection).
const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
const STAMP_MAGIC: u64 = 0xB2B2_5EA1_ED0F_F1CE;

/// The header tag of a message at absolute slot `pos`: 16 bits of a hash
/// of the whole pointer, so a header left by an earlier lap of the same
/// slot (pointer `pos - k * N`) almost never carries the right tag.
pub fn tag_for(pos: u64) -> u16 {
    ((pos.wrapping_mul(HASH_MUL) >> 48) as u16) ^ TAG_MAGIC
}

/// Bytes of a pointer record: the value and its check word.
pub const POINTER_RECORD_LEN: usize = 16;
const CHECK_MAGIC: u64 = 0x52_42_32_50_54_52_43_4B;

/// The check word of a pointer record carrying `value` (module docs,
/// "Pointer records"): the SplitMix64 finalizer of `value ^ magic`, so
/// every bit of the check depends on every bit of the value.
pub fn pointer_check(value: u64) -> u64 {
    let mut z = value ^ CHECK_MAGIC;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 16 bytes of a pointer record (value, check; little-endian).
pub fn encode_pointer(value: u64) -> [u8; POINTER_RECORD_LEN] {
    let mut b = [0u8; POINTER_RECORD_LEN];
    b[..8].copy_from_slice(&value.to_le_bytes());
    b[8..].copy_from_slice(&pointer_check(value).to_le_bytes());
    b
}

/// The value of a pointer record read as its two words, or `None` if the
/// check does not match (being written, or garbage).
pub fn decode_pointer(value: u64, check: u64) -> Option<u64> {
    (pointer_check(value) == check).then_some(value)
}

/// The end stamp of a message at absolute slot `pos` (an injective
/// function of `pos`: an earlier lap's stamp never matches).
pub fn stamp_for(pos: u64) -> u64 {
    pos.wrapping_mul(HASH_MUL) ^ STAMP_MAGIC
}

#[cfg(test)]
mod tests;
