//! Request and response frames of one RF-RPC call (sans-IO).
//!
//! Every frame is a 64-bit *status word* at the head, the payload, and a
//! 64-bit *tail word* at the next 8-byte boundary (paper §3.1 Fig. 3 puts a
//! status and size in each buffer's header; the tail is ours, the §4.1
//! batch-format idea applied to single calls so that a torn transfer is
//! detected). All integers are little-endian.
//!
//! ```text
//! request  (client WRITEs it into the server's request buffer)
//!   0        status word: valid bit 63 | mode bit 62 | batch bit 61
//!                       | len bits 32..61 | seq bits 0..32
//!   8        payload (len bytes), zero padding to a multiple of 8
//!   8+pad    tail word: equal to the status word
//!
//! response (server stores it in its response buffer, or WRITEs it into
//!           the client's reply buffer in server-reply mode)
//!   0        status word: valid bit 63 | len bits 32..61 | seq bits 0..32
//!   8        info word: server processing time in ns (u32, saturating) bits 0..32
//!                       | flags bits 32..40 (bit 32: result too large, payload empty)
//!   16       payload (len bytes), zero padding to a multiple of 8
//!   16+pad   tail word: equal to the status word
//! ```
//!
//! Sequence numbers start at 1 and skip 0 when they wrap, so a zeroed
//! buffer never holds a valid frame. A frame is *complete* only when its
//! status word is valid, carries the expected sequence number, and its tail
//! word equals the status word.
//!
//! Parsers take peer-written bytes: they never panic, never allocate more
//! than the buffer they are given, and return [`Error::Malformed`] for a
//! frame that can never become valid (a length over the buffer).

use crate::error::{Error, Result};
use crate::rfrpc::mode::{Mode, ModePolicy};

/// Bytes of the request status word.
pub const REQUEST_HEADER: usize = 8;
/// Bytes of the response status and info words.
pub const RESPONSE_HEADER: usize = 16;
/// Bytes of the tail word.
pub const TAIL: usize = 8;
/// Largest payload length a status word can carry (29 bits).
pub const MAX_LEN: usize = (1 << 29) - 1;

const VALID: u64 = 1 << 63;
const MODE_BIT: u64 = 1 << 62;
const BATCH_BIT: u64 = 1 << 61;
const LEN_MASK: u64 = (1 << 29) - 1;
/// Response flag: the handler's result was larger than the response buffer.
pub const FLAG_TOO_LARGE: u8 = 1;

/// `n` rounded up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Bytes a request frame with `len` payload bytes occupies.
pub fn request_frame_len(len: usize) -> usize {
    REQUEST_HEADER + pad8(len) + TAIL
}

/// Bytes a response frame with `len` payload bytes occupies.
pub fn response_frame_len(len: usize) -> usize {
    RESPONSE_HEADER + pad8(len) + TAIL
}

/// The largest request payload a request buffer of `cap` bytes holds.
pub fn max_request_payload(cap: usize) -> usize {
    cap.saturating_sub(REQUEST_HEADER + TAIL) & !7
}

/// The largest result payload a response buffer of `cap` bytes holds.
pub fn max_response_payload(cap: usize) -> usize {
    cap.saturating_sub(RESPONSE_HEADER + TAIL) & !7
}

/// The sequence number after `seq` (wrapping, never 0).
pub fn next_seq(seq: u32) -> u32 {
    match seq.wrapping_add(1) {
        0 => 1,
        s => s,
    }
}

/// The status word at the head of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Call sequence number (never 0).
    pub seq: u32,
    /// Payload length.
    pub len: u32,
    /// The mode the client chose for this call (§3.2 "Discussion": only the
    /// client changes it).
    pub mode: Mode,
    /// The payload is a request batch ([`crate::rfrpc::batch`]) whose
    /// entries the server handles one by one, answering with a result batch.
    pub batch: bool,
}

impl RequestHeader {
    /// The status word (valid bit set).
    pub fn to_word(&self) -> u64 {
        let mode = match self.mode {
            Mode::RemoteFetch => 0,
            Mode::ServerReply => MODE_BIT,
        };
        let batch = if self.batch { BATCH_BIT } else { 0 };
        VALID | mode | batch | ((self.len as u64 & LEN_MASK) << 32) | self.seq as u64
    }

    /// Decodes a status word; `None` when the valid bit is clear or the
    /// sequence number is 0 (nothing written yet).
    pub fn from_word(w: u64) -> Option<RequestHeader> {
        if w & VALID == 0 || w as u32 == 0 {
            return None;
        }
        Some(RequestHeader {
            seq: w as u32,
            len: ((w >> 32) & LEN_MASK) as u32,
            mode: if w & MODE_BIT != 0 {
                Mode::ServerReply
            } else {
                Mode::RemoteFetch
            },
            batch: w & BATCH_BIT != 0,
        })
    }
}

/// The status and info words at the head of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    /// Sequence number of the request answered.
    pub seq: u32,
    /// Payload length.
    pub len: u32,
    /// Server processing time in nanoseconds, saturating (§3.1: the
    /// response header "keeps the response time of server").
    pub proc_ns: u32,
    /// Flags ([`FLAG_TOO_LARGE`]).
    pub flags: u8,
}

impl ResponseHeader {
    /// The status word (valid bit set).
    pub fn to_word(&self) -> u64 {
        VALID | ((self.len as u64 & LEN_MASK) << 32) | self.seq as u64
    }

    /// The info word.
    pub fn info_word(&self) -> u64 {
        self.proc_ns as u64 | ((self.flags as u64) << 32)
    }
}

/// Encodes a request frame into `out` (cleared first).
///
/// # Errors
/// [`Error::TooLarge`] for a payload over [`MAX_LEN`].
pub fn encode_request(seq: u32, mode: Mode, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
    encode_request_as(seq, mode, false, payload, out)
}

/// Encodes a request frame with the batch bit as given into `out`.
///
/// # Errors
/// [`Error::TooLarge`] for a payload over [`MAX_LEN`].
pub fn encode_request_as(
    seq: u32,
    mode: Mode,
    batch: bool,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<()> {
    if payload.len() > MAX_LEN {
        return Err(Error::TooLarge {
            what: "request",
            len: payload.len(),
            limit: MAX_LEN,
        });
    }
    let h = RequestHeader {
        seq,
        len: payload.len() as u32,
        mode,
        batch,
    };
    out.clear();
    out.extend_from_slice(&h.to_word().to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(REQUEST_HEADER + pad8(payload.len()), 0);
    out.extend_from_slice(&h.to_word().to_le_bytes());
    Ok(())
}

/// Encodes a response frame into `out` (cleared first).
///
/// # Errors
/// [`Error::TooLarge`] for a payload over [`MAX_LEN`].
pub fn encode_response(h: &ResponseHeader, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
    if payload.len() > MAX_LEN || payload.len() != h.len as usize {
        return Err(Error::TooLarge {
            what: "result",
            len: payload.len(),
            limit: MAX_LEN,
        });
    }
    out.clear();
    out.extend_from_slice(&h.to_word().to_le_bytes());
    out.extend_from_slice(&h.info_word().to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(RESPONSE_HEADER + pad8(payload.len()), 0);
    out.extend_from_slice(&h.to_word().to_le_bytes());
    Ok(())
}

fn word(buf: &[u8], at: usize) -> Option<u64> {
    let b = buf.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

fn malformed(what: &'static str, detail: String) -> Error {
    Error::Malformed { what, detail }
}

/// What a request buffer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestState {
    /// No valid status word, or the status word of the request served last.
    Idle,
    /// A new status word, but the tail is not there yet (a WRITE in flight).
    Incomplete(RequestHeader),
    /// A complete request; its payload is `buf[REQUEST_HEADER..][..len]`.
    Complete(RequestHeader),
}

/// Reads the request in `buf` (a snapshot of the whole request buffer).
/// `last_seq` is the sequence number served last (0 for none).
///
/// # Errors
/// [`Error::Malformed`] when the status word claims a payload that cannot fit
/// in `buf` (the peer is not following the protocol).
pub fn parse_request(buf: &[u8], last_seq: u32) -> Result<RequestState> {
    let Some(w) = word(buf, 0) else {
        return Err(malformed(
            "request",
            format!("buffer of {} bytes", buf.len()),
        ));
    };
    let Some(h) = RequestHeader::from_word(w) else {
        return Ok(RequestState::Idle);
    };
    if h.seq == last_seq {
        return Ok(RequestState::Idle);
    }
    let frame = request_frame_len(h.len as usize);
    if frame > buf.len() {
        return Err(malformed(
            "request",
            format!(
                "{} payload bytes do not fit a {}-byte buffer",
                h.len,
                buf.len()
            ),
        ));
    }
    match word(buf, frame - TAIL) {
        Some(t) if t == w => Ok(RequestState::Complete(h)),
        _ => Ok(RequestState::Incomplete(h)),
    }
}

/// What a fetched response window holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// No response to the expected call yet (or a torn one): fetch again.
    NotReady,
    /// The status word of the expected response says the frame is `total`
    /// bytes, more than the window: fetch the rest (the second READ of §3.2).
    NeedMore {
        /// The frame's total length.
        total: usize,
    },
    /// The complete response; its payload is `window[RESPONSE_HEADER..][..len]`.
    Complete(ResponseHeader),
}

/// Reads the response in `window` (the first bytes of a response buffer of
/// `capacity` bytes) for the call numbered `seq`.
///
/// # Errors
/// [`Error::Malformed`] when the expected response claims more bytes than
/// the response buffer has, or a flag we do not know.
pub fn parse_response(window: &[u8], seq: u32, capacity: usize) -> Result<Fetched> {
    let (Some(w), Some(info)) = (word(window, 0), word(window, 8)) else {
        return Err(malformed(
            "response",
            format!("window of {} bytes", window.len()),
        ));
    };
    if w & VALID == 0 || w as u32 != seq {
        return Ok(Fetched::NotReady);
    }
    let len = ((w >> 32) & LEN_MASK) as usize;
    let total = response_frame_len(len);
    if total > capacity {
        return Err(malformed(
            "response",
            format!("{len} payload bytes do not fit a {capacity}-byte buffer"),
        ));
    }
    if total > window.len() {
        return Ok(Fetched::NeedMore { total });
    }
    match word(window, total - TAIL) {
        Some(t) if t == w => {}
        _ => return Ok(Fetched::NotReady),
    }
    let flags = (info >> 32) as u8;
    if flags & !FLAG_TOO_LARGE != 0 || info >> 40 != 0 {
        return Err(malformed("response", format!("info word {info:#x}")));
    }
    Ok(Fetched::Complete(ResponseHeader {
        seq,
        len: len as u32,
        proc_ns: info as u32,
        flags,
    }))
}

// The handshake: what each side grants under which role, and the section
// the server sends with its grant.

/// Role under which the server grants its request + response region.
pub(crate) const SERVER_ROLE: u16 = 1;
/// Role under which the client grants its reply buffer.
pub(crate) const REPLY_ROLE: u16 = 2;

const APP_MAGIC: &[u8; 4] = b"RFR1";

/// What the server tells each client in its handshake section (under
/// `SERVER_ROLE`, the role of the region it grants):
/// `"RFR1" | request_cap u32 LE | response_cap u32 LE | policy u8`
/// (0 hybrid, 1 remote fetch, 2 server reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerInfo {
    /// Bytes of the server's request buffer.
    pub request_cap: usize,
    /// Bytes of the server's response buffer.
    pub response_cap: usize,
    /// Which ways of answering the server allows.
    pub policy: ModePolicy,
}

impl ServerInfo {
    /// The section's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = APP_MAGIC.to_vec();
        v.extend_from_slice(&(self.request_cap as u32).to_le_bytes());
        v.extend_from_slice(&(self.response_cap as u32).to_le_bytes());
        v.push(match self.policy {
            ModePolicy::Hybrid => 0,
            ModePolicy::Fixed(Mode::RemoteFetch) => 1,
            ModePolicy::Fixed(Mode::ServerReply) => 2,
        });
        v
    }

    /// Parses a section a server sent (peer-written bytes: never panics).
    ///
    /// # Errors
    /// [`Error::Malformed`] unless it is exactly the layout above, with
    /// capacities of at least 64 bytes and multiples of 8.
    pub fn decode(b: &[u8]) -> Result<ServerInfo> {
        let bad = || Error::Malformed {
            what: "server offer",
            detail: format!("handshake section {b:02x?}"),
        };
        if b.len() != 13 || &b[..4] != APP_MAGIC {
            return Err(bad());
        }
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
        let policy = match b[12] {
            0 => ModePolicy::Hybrid,
            1 => ModePolicy::Fixed(Mode::RemoteFetch),
            2 => ModePolicy::Fixed(Mode::ServerReply),
            _ => return Err(bad()),
        };
        let (request_cap, response_cap) = (u(4), u(8));
        if request_cap < 64 || response_cap < 64 || request_cap % 8 != 0 || response_cap % 8 != 0 {
            return Err(bad());
        }
        Ok(ServerInfo {
            request_cap,
            response_cap,
            policy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::RemoteFetch), Just(Mode::ServerReply)]
    }

    proptest! {
        #[test]
        fn requests_round_trip(seq in 1u32.., m in mode(), p in proptest::collection::vec(any::<u8>(), 0..300), extra in 0usize..64) {
            let mut f = Vec::new();
            encode_request(seq, m, &p, &mut f).unwrap();
            prop_assert_eq!(f.len(), request_frame_len(p.len()));
            f.resize(f.len() + extra, 0xee);
            let h = RequestHeader { seq, len: p.len() as u32, mode: m, batch: false };
            prop_assert_eq!(parse_request(&f, seq.wrapping_sub(1)).unwrap(), RequestState::Complete(h));
            prop_assert_eq!(&f[REQUEST_HEADER..][..p.len()], &p[..]);
            // The request served last is idle.
            prop_assert_eq!(parse_request(&f, seq).unwrap(), RequestState::Idle);
        }

        #[test]
        fn torn_requests_are_never_complete(seq in 2u32.., p in proptest::collection::vec(any::<u8>(), 0..300), cut in any::<prop::sample::Index>(), old in proptest::collection::vec(any::<u8>(), 0..300)) {
            // The buffer held the previous request; the new one was written
            // in address order (§4.1) and cut anywhere before its last byte.
            let mut buf = Vec::new();
            encode_request(seq - 1, Mode::RemoteFetch, &old, &mut buf).unwrap();
            let mut f = Vec::new();
            encode_request(seq, Mode::RemoteFetch, &p, &mut f).unwrap();
            let n = buf.len().max(f.len()) + 16;
            buf.resize(n, 0);
            let cut = cut.index(f.len());
            buf[..cut].copy_from_slice(&f[..cut]);
            // A torn status word may also read as malformed. Complete only
            // when the buffer already holds every byte of the new frame.
            if let Ok(RequestState::Complete(_)) = parse_request(&buf, seq - 1) {
                prop_assert_eq!(&buf[..f.len()], &f[..]);
            }
        }

        #[test]
        fn responses_round_trip(seq in 1u32.., p in proptest::collection::vec(any::<u8>(), 0..300), proc_ns: u32, window in 16usize..400) {
            let h = ResponseHeader { seq, len: p.len() as u32, proc_ns, flags: 0 };
            let mut f = Vec::new();
            encode_response(&h, &p, &mut f).unwrap();
            let cap = f.len() + 64;
            let mut buf = f.clone();
            buf.resize(cap, 0);
            let w = window.min(cap);
            match parse_response(&buf[..w], seq, cap).unwrap() {
                Fetched::Complete(got) => {
                    prop_assert!(w >= f.len());
                    prop_assert_eq!(got, h);
                }
                Fetched::NeedMore { total } => {
                    prop_assert!(w < f.len());
                    prop_assert_eq!(total, f.len());
                    prop_assert_eq!(parse_response(&buf[..total], seq, cap).unwrap(), Fetched::Complete(h));
                }
                Fetched::NotReady => prop_assert!(false, "not ready"),
            }
            prop_assert_eq!(parse_response(&buf, seq.wrapping_add(1), cap).unwrap(), Fetched::NotReady);
        }

        #[test]
        fn torn_responses_are_never_complete(seq in 2u32.., p in proptest::collection::vec(any::<u8>(), 0..300), cut in any::<prop::sample::Index>(), old in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut buf = Vec::new();
            let oh = ResponseHeader { seq: seq - 1, len: old.len() as u32, proc_ns: 1, flags: 0 };
            encode_response(&oh, &old, &mut buf).unwrap();
            let h = ResponseHeader { seq, len: p.len() as u32, proc_ns: 2, flags: 0 };
            let mut f = Vec::new();
            encode_response(&h, &p, &mut f).unwrap();
            let cap = buf.len().max(f.len()) + 16;
            buf.resize(cap, 0);
            let cut = cut.index(f.len());
            buf[..cut].copy_from_slice(&f[..cut]);
            if let Ok(Fetched::Complete(_)) = parse_response(&buf, seq, cap) {
                prop_assert_eq!(&buf[..f.len()], &f[..]);
            }
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..128), last: u32, seq: u32, cap in 0usize..256) {
            let _ = parse_request(&b, last);
            let _ = parse_response(&b, seq, cap);
        }
    }

    #[test]
    fn oversized_lengths_are_malformed() {
        let h = RequestHeader {
            seq: 7,
            len: 1000,
            mode: Mode::RemoteFetch,
            batch: true,
        };
        let mut buf = vec![0u8; 64];
        buf[..8].copy_from_slice(&h.to_word().to_le_bytes());
        assert!(matches!(
            parse_request(&buf, 0),
            Err(Error::Malformed { .. })
        ));
        let r = ResponseHeader {
            seq: 7,
            len: 1000,
            proc_ns: 0,
            flags: 0,
        };
        buf[..8].copy_from_slice(&r.to_word().to_le_bytes());
        assert!(matches!(
            parse_response(&buf, 7, 64),
            Err(Error::Malformed { .. })
        ));
    }

    #[test]
    fn sequence_numbers_skip_zero() {
        assert_eq!(next_seq(u32::MAX), 1);
        assert_eq!(next_seq(1), 2);
    }

    #[test]
    fn server_sections_round_trip_and_bad_ones_are_refused() {
        let info = ServerInfo {
            request_cap: 64 << 10,
            response_cap: 4096,
            policy: ModePolicy::Fixed(Mode::ServerReply),
        };
        let bytes = info.encode();
        assert_eq!(ServerInfo::decode(&bytes).unwrap(), info);
        let mut short = bytes.clone();
        short.pop();
        let mut bad_policy = bytes.clone();
        bad_policy[12] = 3;
        let mut tiny = bytes.clone();
        tiny[4..8].copy_from_slice(&8u32.to_le_bytes());
        let mut odd = bytes.clone();
        odd[8..12].copy_from_slice(&4100u32.to_le_bytes());
        let mut magic = bytes;
        magic[0] = b'X';
        for b in [short, bad_policy, tiny, odd, magic] {
            assert!(
                matches!(ServerInfo::decode(&b), Err(Error::Malformed { .. })),
                "{b:02x?}"
            );
        }
    }
}
