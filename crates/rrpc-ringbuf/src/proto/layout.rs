//! The per-message overhead, a leaf that the ring's settings
//! ([`RingConfig::max_message`](crate::RingConfig::max_message)) read without
//! depending on the protocol that uses them.

/// Bytes of the per-message header.
pub const HEADER_LEN: usize = 8;
/// Bytes of the per-message end stamp.
pub const TRAILER_LEN: usize = 8;
/// Bytes a message needs besides its payload.
pub const OVERHEAD: usize = HEADER_LEN + TRAILER_LEN;
