//! The fast-path wire format: compact frames that replace HTTP/2 and HPACK.
//!
//! This module is sans-IO: it turns frames into bytes and bytes into frames,
//! nothing else. One ring message carries one or more frames back to back, so
//! a unary call (headers + one message + end of stream) costs one ring WRITE.
//!
//! ```text
//! frame  = kind:u8 flags:u8 reserved:u16(=0) call_id:u32 len:u32 payload[len]    (little endian)
//! REQUEST_HEADERS  payload = path_len:u16 path  authority_len:u16 authority  metadata
//!                  (authority_len 0: none; as `:authority`, e.g. from tonic's `origin`)
//! RESPONSE_HEADERS payload = http_status:u16 metadata   (END_STREAM: a trailers-only response)
//! DATA             payload = raw bytes of the gRPC body (length-prefixed messages, any split)
//! TRAILERS         payload = metadata (carries grpc-status, grpc-message, trailing metadata)
//! CANCEL           payload = empty (either side abandons the call)
//! GOAWAY           payload = empty (server drains: no new calls on this connection)
//! WINDOW_UPDATE    payload = increment:u32 (1 ..= 2^31-1), call_id != 0
//! metadata = count:u16 { name_len:u16 name value_len:u32 value }*
//! ```
//!
//! # Per-call flow control
//!
//! Every call has a window in each direction, as an HTTP/2 stream does. The
//! receiver's initial window is announced once per connection in the path
//! negotiation (`RrpcConfig::call_window`); a sender may have at most that
//! many DATA bytes of a call unacknowledged, where a DATA frame with a
//! payload of `n > 0` bytes counts [`data_charge`]`(n) = HEADER_LEN + n`
//! (so that a peer cannot queue unbounded per-frame overhead with 1-byte
//! frames) and an empty one counts nothing. The receiver hands bytes back
//! with WINDOW_UPDATE once the application has consumed them. A peer that
//! sends beyond its window breaks the protocol and loses the connection.
//!
//! Flag [`END_STREAM`] on REQUEST_HEADERS or DATA closes the sender's half of
//! the call. Every length is checked against the bytes actually present; names
//! and values are validated as HTTP header names and values; a violation is a
//! [`FrameError`] and the connection is closed (memory the peer writes is
//! untrusted input: read once, validated, then used).

use bytes::{Bytes, BytesMut};
use http::HeaderMap;

/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 12;
/// Flag: the sender will send nothing more on this call.
pub const END_STREAM: u8 = 0x1;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client opens a call: method path and request metadata.
    RequestHeaders = 1,
    /// Server's response metadata (sent before the first response message).
    ResponseHeaders = 2,
    /// A chunk of the gRPC body.
    Data = 3,
    /// Server ends the call: `grpc-status`, `grpc-message`, trailing metadata.
    Trailers = 4,
    /// Either side abandons the call (client cancellation, server abort).
    Cancel = 5,
    /// The server stops accepting new calls on this connection.
    GoAway = 6,
    /// The receiver of a call's DATA grants the sender more window.
    WindowUpdate = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::RequestHeaders,
            2 => Kind::ResponseHeaders,
            3 => Kind::Data,
            4 => Kind::Trailers,
            5 => Kind::Cancel,
            6 => Kind::GoAway,
            7 => Kind::WindowUpdate,
            _ => return None,
        })
    }
}

/// A malformed frame from the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer bytes than a header or a declared length needs.
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Reserved bits set or unknown flags.
    #[error("reserved bits or unknown flags set")]
    Reserved,
    /// A metadata name or value, or the method path, is not valid HTTP.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// A frame body had bytes left over after its fields.
    #[error("trailing bytes inside a frame")]
    Trailing,
}

/// One decoded frame, borrowing its payload from the received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRef<'a> {
    /// Frame kind.
    pub kind: Kind,
    /// Flags ([`END_STREAM`]).
    pub flags: u8,
    /// The call this frame belongs to (0 for connection frames).
    pub call_id: u32,
    /// The raw payload.
    pub payload: &'a [u8],
}

impl FrameRef<'_> {
    /// Whether [`END_STREAM`] is set.
    pub fn end_stream(&self) -> bool {
        self.flags & END_STREAM != 0
    }
}

/// Writes a frame header into `out[..HEADER_LEN]`.
///
/// # Panics
/// If `out` is shorter than [`HEADER_LEN`] (a caller bug, not peer input).
pub fn put_header(out: &mut [u8], kind: Kind, flags: u8, call_id: u32, len: u32) {
    out[0] = kind as u8;
    out[1] = flags;
    out[2..4].copy_from_slice(&0u16.to_le_bytes());
    out[4..8].copy_from_slice(&call_id.to_le_bytes());
    out[8..12].copy_from_slice(&len.to_le_bytes());
}

/// Iterates over the frames of one received message.
///
/// Yields `Err` at the first malformed frame and then stops.
pub fn frames(msg: &[u8]) -> Frames<'_> {
    Frames {
        rest: msg,
        failed: false,
    }
}

/// Iterator returned by [`frames`].
#[derive(Debug)]
pub struct Frames<'a> {
    rest: &'a [u8],
    failed: bool,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<FrameRef<'a>, FrameError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let r = decode_one(self.rest);
        match r {
            Ok((f, used)) => {
                self.rest = &self.rest[used..];
                Some(Ok(f))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

fn decode_one(buf: &[u8]) -> Result<(FrameRef<'_>, usize), FrameError> {
    if buf.len() < HEADER_LEN {
        return Err(FrameError::Truncated {
            need: HEADER_LEN,
            have: buf.len(),
        });
    }
    let kind = Kind::from_u8(buf[0]).ok_or(FrameError::UnknownKind(buf[0]))?;
    let flags = buf[1];
    if flags & !END_STREAM != 0 || buf[2] != 0 || buf[3] != 0 {
        return Err(FrameError::Reserved);
    }
    let call_id = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    let len = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")) as usize;
    let need = HEADER_LEN
        .checked_add(len)
        .ok_or(FrameError::Invalid("length"))?;
    if buf.len() < need {
        return Err(FrameError::Truncated {
            need,
            have: buf.len(),
        });
    }
    Ok((
        FrameRef {
            kind,
            flags,
            call_id,
            payload: &buf[HEADER_LEN..need],
        },
        need,
    ))
}

/// Encoded length of a metadata block.
pub fn metadata_len(map: &HeaderMap) -> usize {
    2 + map
        .iter()
        .map(|(k, v)| 2 + k.as_str().len() + 4 + v.len())
        .sum::<usize>()
}

/// One entry a payload adds after its map's: a header the transport adds (as
/// hyper adds `date` to a response, and tonic's channel `user-agent` to a
/// request), encoded without inserting it into the map (an insert costs a
/// hash, and often a reallocation of a map tonic sized for what it put in).
pub type Extra<'a> = Option<(&'a http::HeaderName, &'a http::HeaderValue)>;

/// Appends a metadata block. Entries beyond `u16::MAX` are dropped (far above
/// any header-list limit a gRPC peer accepts).
pub fn put_metadata(out: &mut Vec<u8>, map: &HeaderMap) {
    put_metadata_with(out, map, None);
}

/// [`put_metadata`], then `extra` (within the same `u16::MAX` entries).
pub fn put_metadata_with(out: &mut Vec<u8>, map: &HeaderMap, extra: Extra<'_>) {
    put_metadata_into(out, map, extra);
}

/// Where an encoder writes: a growing `Vec`, or a slice sized beforehand
/// (the fast path's arena: [`in_arena`]).
trait Put {
    fn put(&mut self, bytes: &[u8]);
}

impl Put for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A slice written front to back; its length was computed beforehand, so
/// writing past it is a bug (a panic, never memory outside it).
struct Cursor<'a>(&'a mut [u8]);

impl Put for Cursor<'_> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        let (head, rest) = std::mem::take(&mut self.0).split_at_mut(bytes.len());
        head.copy_from_slice(bytes);
        self.0 = rest;
    }
}

fn put_metadata_into(out: &mut impl Put, map: &HeaderMap, extra: Extra<'_>) {
    let max = u16::MAX as usize;
    let n = map.len().min(max);
    let extra = extra.filter(|_| n < max);
    out.put(&((n + usize::from(extra.is_some())) as u16).to_le_bytes());
    for (k, v) in map.iter().take(n).chain(extra) {
        let name = k.as_str().as_bytes();
        out.put(&(name.len() as u16).to_le_bytes());
        out.put(name);
        out.put(&(v.len() as u32).to_le_bytes());
        out.put(v.as_bytes());
    }
}

/// Header blocks ([`request_headers_in`] and the like) are encoded into an
/// arena each thread keeps and split off it, instead of into a `Vec` each: a
/// block is a few dozen bytes that live until written into the ring, and an
/// allocation and its free cost ~200 instructions, three times a call. The
/// arena takes this much more room at a time (a block holds a 4 KiB chunk
/// alive until it is dropped; a chunk all of whose blocks are gone is reused).
const ARENA_CHUNK: usize = 4096;

/// `len` bytes encoded by `put` into this thread's arena, split off it.
/// The bytes are zeroed, then written in place through a [`Cursor`]
/// (writing through `BytesMut`'s `BufMut` made a `memcpy` call of every
/// field, ~40 a call).
fn in_arena(len: usize, put: impl FnOnce(&mut Cursor<'_>)) -> Bytes {
    ARENA.with_borrow_mut(|arena| {
        if arena.capacity() < len {
            arena.reserve(len.max(ARENA_CHUNK));
        }
        // Empty: every block before was split off.
        arena.resize(len, 0);
        let mut c = Cursor(&mut arena[..]);
        put(&mut c);
        // `len` counts at most what is written: all of a map's entries, where
        // a block holds the first `u16::MAX` (and `extra` only below that).
        let unwritten = c.0.len();
        arena.truncate(len - unwritten);
        arena.split().freeze()
    })
}

thread_local! {
    /// This thread's arena ([`ARENA_CHUNK`]).
    static ARENA: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// Payloads up to this long are copied out of the ring into the arena
/// ([`copy_payload`]); longer ones get an allocation of their own, so that
/// a big message never shares, and a small one never holds, much of a chunk.
pub(crate) const ARENA_PAYLOAD_MAX: usize = 1024;

/// A received payload (a data frame's message, read from its ring slot) as
/// owned bytes: split off this thread's arena when it is short, as the
/// header blocks are, instead of an allocation and a free each (two a call,
/// ~190 instructions each). A payload kept holds at most its chunk alive
/// (4 KiB).
pub(crate) fn copy_payload(payload: &[u8]) -> Bytes {
    if payload.len() > ARENA_PAYLOAD_MAX {
        return Bytes::copy_from_slice(payload);
    }
    ARENA.with_borrow_mut(|arena| {
        if arena.capacity() < payload.len() {
            arena.reserve(ARENA_CHUNK);
        }
        arena.extend_from_slice(payload);
        arena.split().freeze()
    })
}

/// Encoded length of `extra` in a metadata block.
fn extra_len(extra: Extra<'_>) -> usize {
    extra.map_or(0, |(k, v)| 2 + k.as_str().len() + 4 + v.len())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::Truncated {
                need: n,
                have: self.0.len(),
            });
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
}

/// Room a decoded map keeps for entries added later: a response's headers
/// get its trailers merged in (tonic's `MetadataMap::merge`), which would
/// otherwise rehash the map into a bigger table on every call.
const SPARE: usize = 3;

/// What a decoded map is for: a response's headers get its trailers merged
/// in, so a copy of a remembered one needs room for them ([`SPARE`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Headers,
    MergedInto,
}

fn read_metadata(r: &mut Reader<'_>, used: Use) -> Result<HeaderMap, FrameError> {
    let block = r.0;
    let n = r.u16()? as usize;
    if n == 0 {
        // No allocation for an empty block (`HeaderMap::new` allocates lazily).
        return Ok(HeaderMap::new());
    }
    // The same block as one of the last decoded on this thread: a copy of
    // the map it made (`decode::recent_block`).
    if let Some((map, len)) = decode::recent_block(block, used == Use::MergedInto) {
        r.0 = &block[len..];
        return Ok(map);
    }
    // Each entry needs at least 6 bytes: bound the allocation by the input.
    // Room for `SPARE` more (copies of a remembered map keep its table's
    // size).
    let mut map = HeaderMap::with_capacity(n.min(r.0.len() / 6) + SPARE);
    for _ in 0..n {
        let nl = r.u16()? as usize;
        let name = decode::name(r.take(nl)?)?;
        let vl = r.u32()? as usize;
        let value = decode::value(r.take(vl)?)?;
        map.append(name, value);
    }
    // The block's bytes, its count included.
    let len = block.len() - r.0.len();
    decode::remember_block(&block[..len], &map);
    Ok(map)
}

/// Header names and values without an allocation when they are the ones
/// every call carries.
///
/// A gRPC call repeats the same few metadata entries (`content-type:
/// application/grpc`, `te: trailers`, `grpc-status: 0`, the server's `date`,
/// the client's `user-agent`), and `http` copies each name it does not
/// know and each value into a heap buffer of its own: 7–10 allocations per
/// unary call. Known ones come from static tables; the others from a small
/// cache per thread of the last names and values decoded (a cached value is
/// a reference count, not a copy). Validation is unchanged: a cached entry
/// was validated when first decoded, and is used only for the same bytes.
mod decode {
    use crate::frame::FrameError;
    use http::uri::PathAndQuery;
    use http::{HeaderName, HeaderValue};
    use std::cell::RefCell;

    /// gRPC's names that `http` does not know as standard headers.
    const NAMES: [&str; 6] = [
        "grpc-status",
        "grpc-message",
        "grpc-encoding",
        "grpc-accept-encoding",
        "grpc-timeout",
        "grpc-status-details-bin",
    ];

    /// Values nearly every gRPC call carries.
    const VALUES: [&str; 6] = [
        "application/grpc",
        "trailers",
        "0",
        "identity",
        "gzip",
        "application/grpc+proto",
    ];

    /// Entries per cache (direct-mapped by a cheap hash of the bytes).
    const SLOTS: usize = 16;
    /// Longer entries are not cached (memory per thread stays bounded:
    /// `SLOTS` times this, for names, values and paths).
    const MAX_CACHED: usize = 128;

    struct Recent {
        names: [Option<HeaderName>; SLOTS],
        values: [Option<HeaderValue>; SLOTS],
        paths: [Option<PathAndQuery>; SLOTS],
    }

    thread_local! {
        static RECENT: RefCell<Recent> = const {
            RefCell::new(Recent {
                names: [const { None }; SLOTS],
                values: [const { None }; SLOTS],
                paths: [const { None }; SLOTS],
            })
        };
    }

    /// A method path (the caller checked the leading `/`), from the cache
    /// when it is one of the last seen.
    pub(super) fn path(raw: &[u8]) -> Result<PathAndQuery, FrameError> {
        cached(
            raw,
            |r| &mut r.paths,
            |p| p.as_str().as_bytes(),
            |raw| PathAndQuery::try_from(raw).map_err(|_| FrameError::Invalid("method path")),
        )
    }

    /// Whole metadata blocks remembered per thread. A call's blocks repeat
    /// from call to call (the request's `content-type`, `te` and
    /// `user-agent`; the response's `content-type` and `date`, which changes
    /// once a second; the trailers' `grpc-status: 0`), and building a
    /// `HeaderMap` entry by entry costs ~1 000 instructions a block where a
    /// copy of a map made from the same bytes costs a third of that.
    const BLOCKS: usize = 4;
    /// Longer blocks are not remembered.
    const MAX_BLOCK: usize = 256;

    struct Blocks {
        /// Each block's bytes (its entry count first) and the map it made.
        held: [Option<(Vec<u8>, http::HeaderMap)>; BLOCKS],
        /// A cheap hash of each of the last blocks that missed: a block is
        /// remembered when it misses a second time, so that blocks that never
        /// repeat (per-call metadata) cost no copies.
        missed: [u64; BLOCKS],
        /// The next entry of `held` and of `missed` to replace.
        next_held: usize,
        next_missed: usize,
    }

    thread_local! {
        static BLOCK_CACHE: RefCell<Blocks> = const {
            RefCell::new(Blocks {
                held: [const { None }; BLOCKS],
                missed: [0; BLOCKS],
                next_held: 0,
                next_missed: 0,
            })
        };
    }

    /// The map of a remembered block that `input` starts with, and that
    /// block's length. A block is self-delimiting (a count, then entries
    /// with their lengths), so input that starts with a remembered block's
    /// bytes holds exactly that block, which decodes to the same map: the
    /// one decoded (and validated) when it was remembered.
    ///
    /// `room`: the copy has room for [`crate::frame::SPARE`] more entries.
    /// `HeaderMap::clone` copies the vector of entries at its length, so
    /// the first entry added to a clone (a response's trailers, merged into
    /// its headers) reallocates it; a map built entry by entry from the
    /// remembered one is sized beforehand (two allocations either way).
    pub(super) fn recent_block(input: &[u8], room: bool) -> Option<(http::HeaderMap, usize)> {
        BLOCK_CACHE.with(|c| {
            let c = c.borrow();
            let (raw, map) = c
                .held
                .iter()
                .flatten()
                .find(|(raw, _)| input.starts_with(raw))?;
            if !room {
                return Some((map.clone(), raw.len()));
            }
            let mut copy = http::HeaderMap::with_capacity(map.len() + crate::frame::SPARE);
            for (k, v) in map {
                copy.append(k.clone(), v.clone());
            }
            Some((copy, raw.len()))
        })
    }

    /// Remembers a block just decoded from `raw` as `map`, if it is short
    /// and missed before.
    pub(super) fn remember_block(raw: &[u8], map: &http::HeaderMap) {
        if raw.len() > MAX_BLOCK {
            return;
        }
        // A collision only remembers a block one miss early.
        let h = std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::default(), raw);
        BLOCK_CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if !c.missed.contains(&h) {
                let i = c.next_missed;
                c.missed[i] = h;
                c.next_missed = (i + 1) % BLOCKS;
                return;
            }
            let i = c.next_held;
            c.held[i] = Some((raw.to_vec(), map.clone()));
            c.next_held = (i + 1) % BLOCKS;
        })
    }

    pub(super) fn name(raw: &[u8]) -> Result<HeaderName, FrameError> {
        if let Some(s) = NAMES.iter().find(|s| s.as_bytes() == raw) {
            return Ok(HeaderName::from_static(s));
        }
        cached(
            raw,
            |r| &mut r.names,
            |n| n.as_str().as_bytes(),
            |raw| HeaderName::from_bytes(raw).map_err(|_| FrameError::Invalid("metadata name")),
        )
    }

    pub(super) fn value(raw: &[u8]) -> Result<HeaderValue, FrameError> {
        if let Some(s) = VALUES.iter().find(|s| s.as_bytes() == raw) {
            return Ok(HeaderValue::from_static(s));
        }
        cached(
            raw,
            |r| &mut r.values,
            HeaderValue::as_bytes,
            |raw| HeaderValue::from_bytes(raw).map_err(|_| FrameError::Invalid("metadata value")),
        )
    }

    /// `raw` decoded by `make`, or the cached entry in `table` whose bytes
    /// (`bytes`) are exactly `raw`. A new entry is cached when it is short
    /// and its bytes are `raw` (`http` lower-cases names: an upper-case
    /// name would never be found again).
    fn cached<T: Clone>(
        raw: &[u8],
        table: fn(&mut Recent) -> &mut [Option<T>; SLOTS],
        bytes: fn(&T) -> &[u8],
        make: fn(&[u8]) -> Result<T, FrameError>,
    ) -> Result<T, FrameError> {
        let i = slot(raw);
        RECENT.with(|c| {
            let mut c = c.borrow_mut();
            let entry = &mut table(&mut c)[i];
            if let Some(hit) = entry.as_ref().filter(|e| bytes(e) == raw) {
                return Ok(hit.clone());
            }
            let v = make(raw)?;
            if raw.len() <= MAX_CACHED && bytes(&v) == raw {
                *entry = Some(v.clone());
            }
            Ok(v)
        })
    }

    fn slot(raw: &[u8]) -> usize {
        let (first, last) = (raw.first().copied(), raw.last().copied());
        let h = raw.len() as u32
            ^ (u32::from(first.unwrap_or(0)) << 3)
            ^ (u32::from(last.unwrap_or(0)) << 7)
            ^ raw.get(raw.len() / 2).map_or(0, |&b| u32::from(b) << 11);
        (h.wrapping_mul(0x9E37_79B9) >> 28) as usize % SLOTS
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn known_and_repeated_entries_decode_to_what_http_makes() {
            for raw in [
                &b"grpc-status"[..],
                b"content-type",
                b"x-custom",
                b"x-custom",
                b"X-Upper",
                b"X-Upper",
            ] {
                let want = HeaderName::from_bytes(raw).unwrap();
                assert_eq!(name(raw).unwrap(), want);
            }
            for raw in [
                &b"application/grpc"[..],
                b"0",
                b"Sun, 29 Nov 2026 13:30:00 GMT",
                b"Sun, 29 Nov 2026 13:30:00 GMT",
                b"Sun, 29 Nov 2026 13:30:01 GMT",
                b"",
                b"",
            ] {
                assert_eq!(value(raw).unwrap(), HeaderValue::from_bytes(raw).unwrap());
            }
        }

        #[test]
        fn a_cached_entry_is_used_only_for_the_same_bytes() {
            // Same length, first, middle and last byte: the same slot.
            let a = value(b"a1b2c").unwrap();
            let b = value(b"a9b8c").unwrap();
            assert_eq!(a.as_bytes(), b"a1b2c");
            assert_eq!(b.as_bytes(), b"a9b8c");
            assert_eq!(value(b"a1b2c").unwrap().as_bytes(), b"a1b2c");
            assert_eq!(name(b"x-ab-c").unwrap().as_str(), "x-ab-c");
            assert_eq!(name(b"x-zz-c").unwrap().as_str(), "x-zz-c");
            assert_eq!(path(b"/p.S/ab").unwrap().as_str(), "/p.S/ab");
            assert_eq!(path(b"/p.S/zb").unwrap().as_str(), "/p.S/zb");
            assert_eq!(path(b"/p.S/ab").unwrap().as_str(), "/p.S/ab");
        }

        #[test]
        fn invalid_bytes_are_refused_cached_or_not() {
            for _ in 0..2 {
                assert!(name(b"bad name").is_err());
                assert!(value(b"bad\nvalue").is_err());
                assert!(value(b"\x7f").is_err());
                assert!(path(b"/a b").is_err());
            }
        }

        /// A block is remembered once it repeats, and then served only for
        /// the same bytes: another value, the block with bytes after it, or a
        /// longer block that starts like it all decode as they would fresh.
        #[test]
        fn a_remembered_block_is_used_only_for_the_same_bytes() {
            use super::super::{metadata_payload, parse_metadata};
            let map = |pairs: &[(&'static str, &'static str)]| {
                let mut m = http::HeaderMap::new();
                for (k, v) in pairs {
                    m.append(*k, HeaderValue::from_static(v));
                }
                m
            };
            let a = map(&[("content-type", "application/grpc"), ("x-k", "v1")]);
            let b = map(&[("content-type", "application/grpc"), ("x-k", "v2")]);
            let raw_a = metadata_payload(&a);
            assert!(recent_block(&raw_a, false).is_none(), "not remembered yet");
            for _ in 0..3 {
                assert_eq!(parse_metadata(&raw_a).unwrap(), a);
            }
            let (got, len) = recent_block(&raw_a, false).expect("remembered after it repeated");
            assert_eq!((got, len), (a.clone(), raw_a.len()));
            let (got, len) = recent_block(&raw_a, true).expect("remembered, copied with room");
            assert_eq!((got, len), (a.clone(), raw_a.len()));
            assert_eq!(parse_metadata(&metadata_payload(&b)).unwrap(), b);
            let mut trailing = raw_a.clone();
            trailing.push(0);
            assert!(parse_metadata(&trailing).is_err(), "bytes after the block");
            // One more entry: the count differs, so the block is not a match.
            let longer = map(&[
                ("content-type", "application/grpc"),
                ("x-k", "v1"),
                ("x-m", "1"),
            ]);
            assert_eq!(parse_metadata(&metadata_payload(&longer)).unwrap(), longer);
            assert_eq!(parse_metadata(&raw_a).unwrap(), a);
        }

        /// A response's headers, fresh or copied from a remembered block,
        /// take its trailers in without their entries being moved to a
        /// bigger vector (a `HeaderMap::clone` has no room: the merge
        /// reallocated them on every call). A value's address is where its
        /// entry is; a blocker allocated after each map keeps the allocator
        /// from growing the vector where it is.
        #[test]
        fn response_headers_take_the_trailers_without_moving() {
            use super::super::{parse_response_headers, response_headers_payload};
            let mut headers = http::HeaderMap::new();
            headers.append("content-type", HeaderValue::from_static("application/grpc"));
            headers.append("x-date", HeaderValue::from_static("now"));
            let raw = response_headers_payload(http::StatusCode::OK, &headers);
            let mut trailers = http::HeaderMap::new();
            trailers.append("grpc-status", HeaderValue::from_static("0"));
            // Fresh, fresh and remembered, then remembered copies.
            for i in 0..5 {
                let (_, mut got) = parse_response_headers(&raw).unwrap();
                let blocker = vec![0u8; 256];
                let before: *const HeaderValue = &got["content-type"];
                got.extend(trailers.clone());
                let after: *const HeaderValue = &got["content-type"];
                assert_eq!(before, after, "parse {i}: the entries moved");
                assert_eq!(got.len(), 3);
                drop(blocker);
            }
        }

        /// A decoded map, fresh or a copy of a remembered one, has room for
        /// a unary call's trailers: tonic merges them into the response's
        /// headers, and a full table would be rehashed into a bigger one.
        #[test]
        fn a_decoded_map_has_room_for_the_trailers() {
            use super::super::{metadata_payload, parse_metadata};
            let mut headers = http::HeaderMap::new();
            headers.append("content-type", HeaderValue::from_static("application/grpc"));
            headers.append("x-room", HeaderValue::from_static("1"));
            let raw = metadata_payload(&headers);
            // Fresh, fresh and remembered, then the remembered copy.
            for _ in 0..4 {
                let got = parse_metadata(&raw).unwrap();
                assert!(
                    got.capacity() >= got.len() + 3,
                    "room for {} entries holding {}",
                    got.capacity(),
                    got.len()
                );
            }
        }
    }
}

/// A decoded REQUEST_HEADERS payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method path (`/package.Service/Method`).
    pub path: http::uri::PathAndQuery,
    /// The request's `:authority`, if the client sent one.
    pub authority: Option<http::uri::Authority>,
    /// Request metadata.
    pub headers: HeaderMap,
}

/// Encodes the payload of a REQUEST_HEADERS frame (`authority` empty: none).
pub fn request_headers_payload(path: &str, authority: &str, map: &HeaderMap) -> Vec<u8> {
    request_headers_payload_with(path, authority, map, None)
}

/// [`request_headers_payload`] with one more entry after the map's ([`Extra`]).
pub fn request_headers_payload_with(
    path: &str,
    authority: &str,
    map: &HeaderMap,
    extra: Extra<'_>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(request_headers_len(path, authority, map, extra));
    put_request_headers(&mut out, path, authority, map, extra);
    out
}

/// [`request_headers_payload_with`] as `Bytes` split off this thread's
/// arena: no allocation of its own (what the fast path sends).
pub(crate) fn request_headers_in(
    path: &str,
    authority: &str,
    map: &HeaderMap,
    extra: Extra<'_>,
) -> Bytes {
    let len = request_headers_len(path, authority, map, extra);
    in_arena(len, |out| {
        put_request_headers(out, path, authority, map, extra)
    })
}

fn request_headers_len(path: &str, authority: &str, map: &HeaderMap, extra: Extra<'_>) -> usize {
    let field = |f: &str| 2 + f.len().min(u16::MAX as usize);
    field(path) + field(authority) + metadata_len(map) + extra_len(extra)
}

fn put_request_headers(
    out: &mut impl Put,
    path: &str,
    authority: &str,
    map: &HeaderMap,
    extra: Extra<'_>,
) {
    for field in [path, authority] {
        let f = &field.as_bytes()[..field.len().min(u16::MAX as usize)];
        out.put(&(f.len() as u16).to_le_bytes());
        out.put(f);
    }
    put_metadata_into(out, map, extra);
}

/// Decodes the payload of a REQUEST_HEADERS frame.
pub fn parse_request_headers(payload: &[u8]) -> Result<RequestHead, FrameError> {
    let mut r = Reader(payload);
    let pl = r.u16()? as usize;
    let raw = r.take(pl)?;
    // Check the bytes the peer sent, not the parsed form: `http` turns an
    // empty path into "/", which would not round-trip (found by the fuzzer).
    if raw.first() != Some(&b'/') {
        return Err(FrameError::Invalid("method path"));
    }
    let path = decode::path(raw)?;
    let al = r.u16()? as usize;
    let authority = match r.take(al)? {
        [] => None,
        raw => {
            let a = http::uri::Authority::try_from(raw)
                .map_err(|_| FrameError::Invalid("authority"))?;
            // Only what re-encodes to the same bytes (`http` accepts forms
            // it then prints differently).
            if a.as_str().as_bytes() != raw {
                return Err(FrameError::Invalid("authority"));
            }
            Some(a)
        }
    };
    let headers = read_metadata(&mut r, Use::Headers)?;
    if !r.0.is_empty() {
        return Err(FrameError::Trailing);
    }
    Ok(RequestHead {
        path,
        authority,
        headers,
    })
}

/// Encodes the payload of a RESPONSE_HEADERS frame: the response's HTTP
/// status (as hyper would send `:status`) and its headers.
pub fn response_headers_payload(status: http::StatusCode, map: &HeaderMap) -> Vec<u8> {
    response_headers_payload_with(status, map, None)
}

/// [`response_headers_payload`] with one more entry after the map's ([`Extra`]).
pub fn response_headers_payload_with(
    status: http::StatusCode,
    map: &HeaderMap,
    extra: Extra<'_>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + metadata_len(map) + extra_len(extra));
    out.extend_from_slice(&status.as_u16().to_le_bytes());
    put_metadata_with(&mut out, map, extra);
    out
}

/// [`response_headers_payload_with`] as `Bytes` split off this thread's
/// arena: no allocation of its own (what the fast path sends).
pub(crate) fn response_headers_in(
    status: http::StatusCode,
    map: &HeaderMap,
    extra: Extra<'_>,
) -> Bytes {
    in_arena(2 + metadata_len(map) + extra_len(extra), |out| {
        out.put(&status.as_u16().to_le_bytes());
        put_metadata_into(out, map, extra);
    })
}

/// Decodes the payload of a RESPONSE_HEADERS frame into (status, metadata).
pub fn parse_response_headers(payload: &[u8]) -> Result<(http::StatusCode, HeaderMap), FrameError> {
    let mut r = Reader(payload);
    let status =
        http::StatusCode::from_u16(r.u16()?).map_err(|_| FrameError::Invalid("HTTP status"))?;
    let map = read_metadata(&mut r, Use::MergedInto)?;
    if !r.0.is_empty() {
        return Err(FrameError::Trailing);
    }
    Ok((status, map))
}

/// Encodes a metadata-only payload (TRAILERS).
pub fn metadata_payload(map: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(metadata_len(map));
    put_metadata(&mut out, map);
    out
}

/// [`metadata_payload`] as `Bytes` split off this thread's arena: no
/// allocation of its own (what the fast path sends).
pub(crate) fn metadata_in(map: &HeaderMap) -> Bytes {
    in_arena(metadata_len(map), |out| put_metadata_into(out, map, None))
}

/// Decodes a metadata-only payload.
pub fn parse_metadata(payload: &[u8]) -> Result<HeaderMap, FrameError> {
    let mut r = Reader(payload);
    let map = read_metadata(&mut r, Use::Headers)?;
    if !r.0.is_empty() {
        return Err(FrameError::Trailing);
    }
    Ok(map)
}

/// Largest window and window increment (HTTP/2's limit, 2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Smallest call window ([`RrpcConfig::call_window`](crate::RrpcConfig::call_window))
/// either end accepts.
pub(crate) const MIN_CALL_WINDOW: u32 = 1024;

/// What a DATA frame with `payload_len` bytes counts against a call's
/// window: its wire size, or nothing for an empty frame.
pub fn data_charge(payload_len: usize) -> usize {
    if payload_len == 0 {
        0
    } else {
        HEADER_LEN + payload_len
    }
}

/// Encodes the payload of a WINDOW_UPDATE frame.
pub fn window_update_payload(increment: u32) -> [u8; 4] {
    increment.to_le_bytes()
}

/// Decodes the payload of a WINDOW_UPDATE frame: an increment of
/// 1 ..= [`MAX_WINDOW`].
pub fn parse_window_update(payload: &[u8]) -> Result<u32, FrameError> {
    let mut r = Reader(payload);
    let inc = r.u32()?;
    if !r.0.is_empty() {
        return Err(FrameError::Trailing);
    }
    if inc == 0 || inc > MAX_WINDOW {
        return Err(FrameError::Invalid("window increment"));
    }
    Ok(inc)
}

/// Appends a whole frame (header + payload) to `out`.
pub fn push_frame(out: &mut Vec<u8>, kind: Kind, flags: u8, call_id: u32, payload: &[u8]) {
    let start = out.len();
    out.resize(start + HEADER_LEN, 0);
    put_header(
        &mut out[start..],
        kind,
        flags,
        call_id,
        payload.len() as u32,
    );
    out.extend_from_slice(payload);
}

/// The tag of rrpc-tonic's section in rrpc-core's handshake
/// ([`rrpc_core::conn::Offer::section`]) on `shm` and `rdma`: the path hello
/// or reply, and a shared connection's opening or logical request. The
/// ring's parameters travel beside it, under the ring's role.
pub const HANDSHAKE_SECTION: u16 = 0x5452;

/// Length of the path negotiation's hello and reply (in rrpc-core's
/// handshake on `shm`/`rdma`, the first pipe message each way on
/// `inproc`): `RRP2`, the path byte (0 fast, 1 HTTP/2), the
/// sender's per-call receive window (little-endian `u32`).
pub const PATH_HELLO_LEN: usize = 9;

const PATH_MAGIC: &[u8; 4] = b"RRP2";

/// Encodes a path hello or reply.
pub fn path_hello(path: u8, window: u32) -> [u8; PATH_HELLO_LEN] {
    let mut m = [0u8; PATH_HELLO_LEN];
    m[..4].copy_from_slice(PATH_MAGIC);
    m[4] = path;
    m[5..].copy_from_slice(&window.to_le_bytes());
    m
}

/// Parses a peer's path hello or reply: (path byte, the peer's call
/// window). Peer-written bytes: every malformed input is an error naming
/// what was wrong (fuzz target `frame_decode`).
///
/// # Errors
/// A message of another length or magic, an unknown path, or a window
/// outside `1024 ..= MAX_WINDOW`.
pub fn parse_path_hello(m: &[u8]) -> Result<(u8, u32), String> {
    if m.len() != PATH_HELLO_LEN || &m[..4] != PATH_MAGIC {
        let seen = String::from_utf8_lossy(&m[..m.len().min(4)]).into_owned();
        return Err(format!(
            "malformed or unsupported path hello ({} bytes starting {seen:?}; this build speaks RRP2)",
            m.len()
        ));
    }
    let path = m[4];
    if path > 1 {
        return Err(format!("unknown path {path}"));
    }
    let window = u32::from_le_bytes(m[5..].try_into().expect("4 bytes"));
    if !(MIN_CALL_WINDOW..=MAX_WINDOW).contains(&window) {
        return Err(format!(
            "peer's call window {window} is outside {} ..= {MAX_WINDOW}",
            MIN_CALL_WINDOW,
        ));
    }
    Ok((path, window))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_map() -> impl Strategy<Value = HeaderMap> {
        proptest::collection::vec(("[a-z][a-z0-9-]{0,12}", "[ -~]{0,40}"), 0..8).prop_map(|kv| {
            let mut m = HeaderMap::new();
            for (k, v) in kv {
                m.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(&v).unwrap(),
                );
            }
            m
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn request_headers_round_trip(path in "/[a-zA-Z0-9._]{1,30}/[A-Za-z]{1,20}", authority in "([a-z0-9.]{1,20}(:[0-9]{1,5})?)?", map in arb_map(), id: u32, end: bool) {
            let mut msg = Vec::new();
            let payload = request_headers_payload(&path, &authority, &map);
            push_frame(&mut msg, Kind::RequestHeaders, if end { END_STREAM } else { 0 }, id, &payload);
            push_frame(&mut msg, Kind::Data, END_STREAM, id, b"xyz");
            let fs: Vec<_> = frames(&msg).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(fs.len(), 2);
            prop_assert_eq!(fs[0].call_id, id);
            prop_assert_eq!(fs[0].end_stream(), end);
            let head = parse_request_headers(fs[0].payload).unwrap();
            prop_assert_eq!(head.path.as_str(), path.as_str());
            prop_assert_eq!(head.authority.as_ref().map_or("", |a| a.as_str()), authority.as_str());
            prop_assert_eq!(head.headers, map);
            prop_assert_eq!(fs[1].payload, b"xyz");
        }

        #[test]
        fn response_headers_round_trip(code in 100u16..1000, map in arb_map()) {
            let status = http::StatusCode::from_u16(code).unwrap();
            prop_assert_eq!(parse_response_headers(&response_headers_payload(status, &map)).unwrap(), (status, map));
        }

        #[test]
        fn metadata_round_trip(map in arb_map()) {
            prop_assert_eq!(parse_metadata(&metadata_payload(&map)).unwrap(), map);
        }

        /// An entry encoded after the map's decodes as if it had been
        /// appended to the map, in requests and responses alike.
        #[test]
        fn an_extra_entry_decodes_as_appended(map in arb_map(), value in "[ -~]{0,40}") {
            let name = http::header::USER_AGENT;
            let value = http::HeaderValue::from_str(&value).unwrap();
            let mut want = map.clone();
            want.append(name.clone(), value.clone());
            let req = request_headers_payload_with("/a.B/C", "", &map, Some((&name, &value)));
            prop_assert_eq!(parse_request_headers(&req).unwrap().headers, want.clone());
            let status = http::StatusCode::OK;
            let resp = response_headers_payload_with(status, &map, Some((&name, &value)));
            prop_assert_eq!(parse_response_headers(&resp).unwrap(), (status, want));
            prop_assert_eq!(response_headers_payload_with(status, &map, None), response_headers_payload(status, &map));
        }

        /// The blocks the fast path splits off its arena are the bytes the
        /// `Vec` encoders make, also while earlier blocks are still alive
        /// and across the arena's chunks.
        #[test]
        fn arena_blocks_are_the_vec_encoders_bytes(
            maps in proptest::collection::vec(arb_map(), 1..40),
            value in "[ -~]{0,40}",
        ) {
            let name = http::header::DATE;
            let value = http::HeaderValue::from_str(&value).unwrap();
            let extra = Some((&name, &value));
            let mut alive = Vec::new();
            for (i, map) in maps.iter().enumerate() {
                let extra = extra.filter(|_| i % 2 == 0);
                let req = request_headers_in("/a.B/C", "host:1", map, extra);
                prop_assert_eq!(&req[..], &request_headers_payload_with("/a.B/C", "host:1", map, extra)[..]);
                let resp = response_headers_in(http::StatusCode::OK, map, extra);
                prop_assert_eq!(&resp[..], &response_headers_payload_with(http::StatusCode::OK, map, extra)[..]);
                let trailers = metadata_in(map);
                prop_assert_eq!(&trailers[..], &metadata_payload(map)[..]);
                // Half of them stay alive to the end: the arena must not
                // write over a block that is still held.
                if i % 2 == 1 {
                    alive.push((req, resp, trailers, map));
                }
            }
            for (req, resp, trailers, map) in alive {
                prop_assert_eq!(parse_request_headers(&req).unwrap().headers, map.clone());
                prop_assert_eq!(parse_response_headers(&resp).unwrap().1, map.clone());
                prop_assert_eq!(&parse_metadata(&trailers).unwrap(), map);
            }
        }

        /// Payloads copied out of the ring ([`copy_payload`]), short ones
        /// (arena) and long ones (their own allocation), keep their bytes,
        /// also while earlier ones are held, with header blocks split off
        /// the same arena between them, across its chunks.
        #[test]
        fn payloads_copied_into_the_arena_keep_their_bytes(
            payloads in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..(ARENA_PAYLOAD_MAX + 64)),
                1..60,
            ),
        ) {
            let map = HeaderMap::new();
            let mut alive = Vec::new();
            for (i, p) in payloads.iter().enumerate() {
                let b = copy_payload(p);
                prop_assert_eq!(&b[..], &p[..]);
                // Blocks and payloads take turns on the arena.
                let block = metadata_in(&map);
                prop_assert_eq!(&block[..], &metadata_payload(&map)[..]);
                if i % 3 != 0 {
                    alive.push((b, p));
                }
            }
            for (b, p) in alive {
                prop_assert_eq!(&b[..], &p[..]);
            }
        }

        /// Arbitrary bytes never panic the decoder and never yield a frame
        /// whose payload reaches outside the message.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut covered = 0;
            for f in frames(&bytes).flatten() {
                covered += HEADER_LEN + f.payload.len();
                let _ = parse_request_headers(f.payload);
                let _ = parse_response_headers(f.payload);
                let _ = parse_metadata(f.payload);
            }
            prop_assert!(covered <= bytes.len());
        }
    }

    #[test]
    fn truncation_and_reserved_bits_are_errors() {
        let mut msg = Vec::new();
        push_frame(&mut msg, Kind::Data, 0, 7, b"hello");
        for cut in 0..msg.len() {
            if cut == 0 {
                assert!(frames(&msg[..0]).next().is_none());
                continue;
            }
            assert!(matches!(
                frames(&msg[..cut]).next(),
                Some(Err(FrameError::Truncated { .. }))
            ));
        }
        let mut bad = msg.clone();
        bad[1] = 0x80;
        assert_eq!(frames(&bad).next(), Some(Err(FrameError::Reserved)));
        bad = msg.clone();
        bad[0] = 99;
        assert_eq!(frames(&bad).next(), Some(Err(FrameError::UnknownKind(99))));
        assert_eq!(
            parse_request_headers(&[3, 0, b'a', b'b', b'c', 0, 0]),
            Err(FrameError::Invalid("method path"))
        );
    }

    #[test]
    fn window_updates_round_trip_and_bad_ones_are_refused() {
        for inc in [1, 4096, MAX_WINDOW] {
            assert_eq!(parse_window_update(&window_update_payload(inc)), Ok(inc));
        }
        assert_eq!(
            parse_window_update(&0u32.to_le_bytes()),
            Err(FrameError::Invalid("window increment"))
        );
        assert_eq!(
            parse_window_update(&(MAX_WINDOW + 1).to_le_bytes()),
            Err(FrameError::Invalid("window increment"))
        );
        assert!(matches!(
            parse_window_update(&[1, 0]),
            Err(FrameError::Truncated { .. })
        ));
        assert_eq!(
            parse_window_update(&[1, 0, 0, 0, 0]),
            Err(FrameError::Trailing)
        );
        assert_eq!(data_charge(0), 0);
        assert_eq!(data_charge(1), HEADER_LEN + 1);
    }

    #[test]
    fn empty_method_path_is_refused() {
        // Regression (fuzzer): an empty path parsed as "/" and did not round-trip.
        let mut p = Vec::new();
        p.extend_from_slice(&0u16.to_le_bytes());
        p.extend_from_slice(&0u16.to_le_bytes());
        p.extend_from_slice(&metadata_payload(&HeaderMap::new()));
        assert!(matches!(
            parse_request_headers(&p),
            Err(FrameError::Invalid("method path"))
        ));
    }

    #[test]
    fn bad_authorities_are_refused() {
        for bad in ["a b", "x/y", "@@", "h:p:q"] {
            let p = request_headers_payload("/a/B", bad, &HeaderMap::new());
            assert_eq!(
                parse_request_headers(&p),
                Err(FrameError::Invalid("authority")),
                "{bad:?}"
            );
        }
        let p = request_headers_payload("/a/B", "example.test:8080", &HeaderMap::new());
        assert_eq!(
            parse_request_headers(&p)
                .unwrap()
                .authority
                .unwrap()
                .as_str(),
            "example.test:8080"
        );
    }
}
