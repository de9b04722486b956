//! Sans-IO pointer logic of RB² (Algorithm 1): no memory mapping, no queue
//! pairs, no clocks. [`Sender`] and [`Receiver`] take events (`handle_*`) and
//! hand out work requests to post (`poll_transmit`); the driver in
//! [`crate::driver`] executes them on an `rrpc-core` queue pair.
//!
//! Pointers are absolute slot counters (`u64`, never wrapping in practice);
//! the slot index is `pointer % N`. Using absolute counters lets the whole
//! array be used (`tail - head == N` is full, `tail == head` empty) and makes
//! every peer-written pointer checkable against the ones we hold.
//!
//! # Message format (slot-to-slot layout, RB² §III-A C5)
//! A message occupies `ceil((8 + len) / slot_size)` contiguous slots and
//! starts with an 8-byte little-endian header:
//! `len: u32 | flags: u16 | tag: u16`, where `tag = (pos as u16) ^ 0xB2B2`
//! and `pos` is the absolute slot pointer of the message. A message that would
//! cross the end of the array is placed at index 0; the slots up to the end
//! get a *gap* header (flag bit 0, `len = 0`). The tag lets the receiver
//! detect a stale, torn or garbage header.
//!
//! # Poll order
//! After any call that can create work (`commit`, `flush`, `reserve` on a full
//! ring, `handle_completion`), the driver drains `poll_transmit` and posts the
//! work requests in the order returned (RC ordering then makes slot data
//! visible before the tail that covers it).
#![forbid(unsafe_code)]

mod receiver;
mod sender;

pub use receiver::{Message, Receiver};
pub use sender::{Reservation, Sender, Transmit};

/// Bytes of the per-message header.
pub const HEADER_LEN: usize = 8;
/// Header flag: the slots from here to the end of the array are a gap.
pub const FLAG_GAP: u16 = 1;
const TAG_MAGIC: u16 = 0xB2B2;

/// Bits of a work-request id that carry the sequence number.
pub const WR_SEQ_MASK: u64 = (1 << 56) - 1;
/// `wr_id` kind tag of a sender work request (slots or tail).
pub const WR_KIND_TX: u64 = 1 << 56;
/// `wr_id` kind tag of a receiver work request (head push).
pub const WR_KIND_RX: u64 = 2 << 56;

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
        self.ring_bytes() - HEADER_LEN
    }
    /// Slots a payload of `len` bytes occupies (header included).
    pub fn slots_for(&self, len: usize) -> u64 {
        (HEADER_LEN + len).div_ceil(self.slot_size) as u64
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

fn tag_for(pos: u64) -> u16 {
    (pos as u16) ^ TAG_MAGIC
}

#[cfg(test)]
mod tests;
