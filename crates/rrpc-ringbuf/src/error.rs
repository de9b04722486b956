//! The one error type of `rrpc-ringbuf`, and the typed detail of a ring
//! the peer corrupted ([`Corruption`], [`Unplaced`]).
//!
//! [`Error::fault`] says whose fault an error was ([`rrpc_core::Fault`]),
//! asking the fabric's error for [`Error::Core`]: whether a peer is gone is
//! decided once, by [`rrpc_core::Error::fault`].

use rrpc_core::Fault;

/// Errors of the ring buffer: local misuse, peer fault, peer gone, fabric failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ring is full (sending) or empty (receiving); try again later.
    #[error("ring buffer operation would block")]
    WouldBlock,
    /// A message is larger than the whole ring can hold.
    #[error("message of {len} bytes is larger than the ring's maximum of {max} bytes")]
    TooLarge {
        /// Requested payload length.
        len: usize,
        /// Largest payload the ring can carry (ring size minus the 8-byte header).
        max: usize,
    },
    /// A configuration value is out of its documented range (local, made
    /// once when a ring is configured).
    #[error("invalid ring configuration: {0}")]
    InvalidConfig(String),
    /// The peer's ring parameters (its handshake section) or granted
    /// regions do not match ours. Found once, at setup: the text names
    /// the field.
    #[error("peer ring does not match: {0}")]
    Incompatible(String),
    /// The peer wrote an invalid value (header, gap marker, pointer word);
    /// the channel is closed.
    #[error("peer wrote corrupt ring data, channel closed: {0}")]
    Corrupt(Corruption),
    /// The fabric reported an error. The peer process or its queue pair
    /// being gone is one of these: ask [`Error::is_peer_gone`] (the
    /// channel is closed).
    #[error("fabric error: {0}")]
    Core(#[source] rrpc_core::Error),
}

/// What the peer wrote into a ring that broke it ([`Error::Corrupt`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// A message the tail covers was not placed within the driver's bound:
    /// the peer wrote something else there.
    #[error("message at slot {slot} never completed: {seen}")]
    NeverPlaced {
        /// The slot pointer of the message.
        slot: u64,
        /// What was there instead.
        seen: Unplaced,
    },
    /// The placement bound ran out with nothing recorded as unplaced.
    #[error("placement timed out")]
    PlacementTimedOut,
    /// A pointer record ("head" or "tail") stayed inconsistent past the
    /// driver's bound.
    #[error("{record} record {value:#x} with check {check:#x} never became consistent")]
    Record {
        /// "head" or "tail".
        record: &'static str,
        /// The value word read.
        value: u64,
        /// The check word read.
        check: u64,
    },
    /// A consistent pointer record ("head" or "tail") out of its range.
    #[error("{record} pointer {value} outside [{min}, {max}]")]
    Pointer {
        /// "head" or "tail".
        record: &'static str,
        /// The pointer read.
        value: u64,
        /// The least it may be.
        min: u64,
        /// The most it may be.
        max: u64,
    },
}

/// What a receiver found at a slot the tail covers, instead of a whole
/// message: not placed yet, or garbage (told apart by time only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unplaced {
    /// The header's tag is not the slot's.
    #[error("header tag {tag:#06x} at slot {slot}, expected {expected:#06x}")]
    Tag {
        /// The slot pointer.
        slot: u64,
        /// The tag read.
        tag: u16,
        /// The slot's tag.
        expected: u16,
    },
    /// A resize marker with an impossible slot count.
    #[error("bad resize marker at slot {slot} (slot count {count}, array of {max})")]
    ResizeMarker {
        /// The slot pointer.
        slot: u64,
        /// The slot count it names.
        count: u64,
        /// The array's slots.
        max: u64,
    },
    /// Header flags no sender writes.
    #[error("unknown header flags {flags:#x} at slot {slot}")]
    Flags {
        /// The slot pointer.
        slot: u64,
        /// The flags read.
        flags: u16,
    },
    /// A gap marker at the array start, with a length, or past the tail.
    #[error("bad gap marker at slot {slot} (len {len}, {avail} slots available)")]
    GapMarker {
        /// The slot pointer.
        slot: u64,
        /// Its length field.
        len: u32,
        /// Slots the tail covers.
        avail: u64,
    },
    /// A message longer than the published slots or the array end.
    #[error(
        "message length {len} at slot {slot} exceeds the {avail} published slots or the array end"
    )]
    Length {
        /// The slot pointer.
        slot: u64,
        /// Its length field.
        len: usize,
        /// Slots the tail covers.
        avail: u64,
    },
    /// An end stamp that is not the slot's (`what`: "the resize marker",
    /// "the gap", or a message of `len` bytes).
    #[error("end stamp {stamp:#018x} of {what} at slot {slot}, expected {expected:#018x}")]
    Stamp {
        /// The slot pointer.
        slot: u64,
        /// What the stamp ends.
        what: StampOf,
        /// The stamp read.
        stamp: u64,
        /// The slot's stamp.
        expected: u64,
    },
    /// More markers in a row than a sender writes.
    #[error("more than three gap or resize markers in a row before slot {slot}")]
    Markers {
        /// The slot pointer.
        slot: u64,
    },
}

/// What an end stamp ends ([`Unplaced::Stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StampOf {
    /// A resize marker.
    Resize,
    /// A gap marker.
    Gap,
    /// A message of this many bytes.
    Message(usize),
}

impl std::fmt::Display for StampOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StampOf::Resize => f.write_str("the resize marker"),
            StampOf::Gap => f.write_str("the gap"),
            StampOf::Message(len) => write!(f, "the {len}-byte message"),
        }
    }
}

impl From<rrpc_core::Error> for Error {
    fn from(e: rrpc_core::Error) -> Self {
        match e {
            rrpc_core::Error::WouldBlock => Error::WouldBlock,
            e => Error::Core(e),
        }
    }
}

impl Error {
    /// Whose fault this error was: misuse and limits are local, a corrupt
    /// or incompatible ring the peer's; [`Error::Core`] asks the fabric.
    pub fn fault(&self) -> Fault {
        match self {
            Error::WouldBlock | Error::TooLarge { .. } | Error::InvalidConfig(_) => Fault::Local,
            Error::Incompatible(_) | Error::Corrupt(_) => Fault::Peer,
            Error::Core(e) => e.fault(),
        }
    }

    /// Whether the peer is gone ([`Fault::PeerGone`], decided by
    /// [`rrpc_core::Error::is_peer_gone`] for a fabric error).
    pub fn is_peer_gone(&self) -> bool {
        self.fault() == Fault::PeerGone
    }

    /// True for errors after which the channel is unusable (everything but
    /// [`Error::WouldBlock`], [`Error::TooLarge`] and [`Error::InvalidConfig`]).
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            Error::WouldBlock | Error::TooLarge { .. } | Error::InvalidConfig(_)
        )
    }
}
