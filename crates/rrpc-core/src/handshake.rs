//! The connection handshake codec: sans-IO, versioned, length-checked.
//!
//! Every message is a 12-byte header followed by a body of at most
//! [`MAX_BODY`] bytes:
//!
//! ```text
//! magic "RRPC" (4) | version u16 | kind u8 | flags u8 (0) | body_len u32      (little endian)
//! ```
//!
//! Bodies:
//!
//! * `Hello` (client → server) and `Accept` (server → client) carry a [`Hello`]:
//!   token, provider, queue-pair endpoint, region descriptors and the layers'
//!   [`Section`]s. The fabric reads none of a section: the ring's parameters
//!   and the transport's path negotiation travel there, each under the tag
//!   of the layer that wrote it, as a granted region travels under its role.
//! * `Reject` carries a code and a human-readable reason.
//! * `Goodbye` is empty: an orderly close.
//!
//! Decoding never panics, never reads past its input and never allocates more
//! than [`MAX_BODY`] bytes: every length is checked against its limit *before*
//! anything is allocated. A `cargo fuzz` target (`fuzz/`, `handshake_decode`)
//! and property tests hold it to that.

use crate::error::{Error, Result};
use crate::region::RemoteRegion;

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"RRPC";
/// The protocol version this build speaks. Version 2 carries the layers'
/// parts as tagged [`Section`]s; version 1 had a fixed ring-geometry field
/// and one application blob.
pub const VERSION: u16 = 2;
/// Length of the fixed header.
pub const HEADER_LEN: usize = 12;
/// Largest body accepted.
pub const MAX_BODY: usize = 8192;
/// Largest token accepted.
pub const MAX_TOKEN: usize = 256;
/// Largest number of region descriptors in one hello.
pub const MAX_REGIONS: usize = 16;
/// Largest number of [`Section`]s in one hello.
pub const MAX_SECTIONS: usize = 8;
/// Largest [`Section`] (its bytes).
pub const MAX_SECTION: usize = 4096;
/// Largest provider endpoint blob.
pub const MAX_ENDPOINT: usize = 64;
/// Largest reject reason.
pub const MAX_REASON: usize = 512;

/// Message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client's offer.
    Hello = 1,
    /// Server's answer.
    Accept = 2,
    /// Refusal.
    Reject = 3,
    /// Orderly close.
    Goodbye = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Accept,
            3 => Kind::Reject,
            4 => Kind::Goodbye,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind.
    pub kind: Kind,
    /// Body length, at most [`MAX_BODY`].
    pub body_len: usize,
}

impl Header {
    /// Validates a header.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for a wrong magic, unknown kind, non-zero
    /// flags or an oversized body; [`Error::VersionMismatch`] for another version.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header> {
        if b[0..4] != MAGIC {
            return Err(Error::MalformedHandshake(
                "bad magic: peer is not an rrpc endpoint".into(),
            ));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(Error::VersionMismatch {
                ours: VERSION,
                theirs: version,
            });
        }
        let kind = Kind::from_u8(b[6])
            .ok_or_else(|| Error::MalformedHandshake(format!("unknown message kind {}", b[6])))?;
        if b[7] != 0 {
            return Err(Error::MalformedHandshake(format!(
                "unknown flags {:#x}",
                b[7]
            )));
        }
        let body_len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
        if body_len > MAX_BODY {
            return Err(Error::MalformedHandshake(format!(
                "message body of {body_len} bytes exceeds the {MAX_BODY}-byte limit"
            )));
        }
        Ok(Header { kind, body_len })
    }
}

/// One layer's part of a hello: bytes the fabric carries and never reads,
/// under a tag the layer picks (as it picks the role of a region it
/// grants). `rrpc-ringbuf` puts each ring's parameters here under the
/// ring's region role; `rrpc-tonic` its path negotiation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    /// Whose part this is (defined by the layer that writes it).
    pub tag: u16,
    /// The layer's bytes, at most [`MAX_SECTION`].
    pub bytes: Vec<u8>,
}

/// One region granted to the peer, tagged with its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDesc {
    /// What the region is for (defined by the layer that grants it).
    pub role: u16,
    /// Address, length and key.
    pub remote: RemoteRegion,
}

/// The body of `Hello` and `Accept`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hello {
    /// Shared-secret token, if the side has one.
    pub token: Option<Vec<u8>>,
    /// Provider wire code ([`crate::ProviderKind::code`]).
    pub provider: u8,
    /// Provider-specific queue-pair endpoint (verbs: LID, QPN, PSN, GID, MTU;
    /// shm: receive-queue geometry).
    pub endpoint: Vec<u8>,
    /// Regions granted to the peer.
    pub regions: Vec<RegionDesc>,
    /// The layers' parts, at most [`MAX_SECTIONS`], each tag at most once.
    pub sections: Vec<Section>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Machine-readable reason.
    pub code: RejectCode,
    /// Human-readable reason.
    pub reason: String,
}

/// Reject codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectCode {
    /// The hello was malformed.
    Malformed,
    /// Another protocol version.
    Version,
    /// Wrong or missing token.
    Auth,
    /// Unsupported provider or geometry.
    Incompatible,
    /// The server has no resources left.
    Busy,
    /// The server's device or operating system failed while setting the
    /// connection up (a link down, a queue pair the device refused): not the
    /// client's fault, worth retrying later.
    Unavailable,
    /// Anything else.
    Other(u16),
}

/// The `metrics` counter of handshakes a server refused, labelled
/// `reason` (`malformed`, `version`, `auth`, `incompatible`, `busy`,
/// `unavailable`, `other`): what an operator watches for misconfigured or hostile peers.
pub const REFUSED_METRIC: &str = "rrpc_handshake_refused_total";

/// Counts one refused handshake in the `metrics` facade ([`REFUSED_METRIC`]).
pub(crate) fn count_refusal(code: RejectCode) {
    metrics::counter!(REFUSED_METRIC, "reason" => code.name()).increment(1);
}

impl RejectCode {
    /// The code's label in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            RejectCode::Malformed => "malformed",
            RejectCode::Version => "version",
            RejectCode::Auth => "auth",
            RejectCode::Incompatible => "incompatible",
            RejectCode::Busy => "busy",
            RejectCode::Unavailable => "unavailable",
            RejectCode::Other(_) => "other",
        }
    }

    fn to_u16(self) -> u16 {
        match self {
            RejectCode::Malformed => 1,
            RejectCode::Version => 2,
            RejectCode::Auth => 3,
            RejectCode::Incompatible => 4,
            RejectCode::Busy => 5,
            RejectCode::Unavailable => 6,
            RejectCode::Other(c) => c,
        }
    }
    fn from_u16(c: u16) -> Self {
        match c {
            1 => RejectCode::Malformed,
            2 => RejectCode::Version,
            3 => RejectCode::Auth,
            4 => RejectCode::Incompatible,
            5 => RejectCode::Busy,
            6 => RejectCode::Unavailable,
            c => RejectCode::Other(c),
        }
    }
}

/// A handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client's offer.
    Hello(Hello),
    /// Server's answer.
    Accept(Hello),
    /// Refusal.
    Reject(Reject),
    /// Orderly close.
    Goodbye,
}

impl Message {
    /// The kind of this message.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Accept(_) => Kind::Accept,
            Message::Reject(_) => Kind::Reject,
            Message::Goodbye => Kind::Goodbye,
        }
    }

    /// Encodes header and body.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if a field exceeds its limit (a local mistake:
    /// we never send what a peer would have to refuse).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut body = Vec::with_capacity(256);
        match self {
            Message::Hello(h) | Message::Accept(h) => encode_hello(h, &mut body)?,
            Message::Reject(r) => {
                let reason = truncate_utf8(&r.reason, MAX_REASON);
                body.extend_from_slice(&r.code.to_u16().to_le_bytes());
                body.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                body.extend_from_slice(reason.as_bytes());
            }
            Message::Goodbye => {}
        }
        if body.len() > MAX_BODY {
            return Err(Error::InvalidConfig(format!(
                "handshake body of {} bytes exceeds {MAX_BODY}",
                body.len()
            )));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.kind() as u8);
        out.push(0);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decodes a body of the given kind. `body` must be exactly the body.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] naming the first field that is wrong.
    pub fn decode_body(kind: Kind, body: &[u8]) -> Result<Message> {
        if body.len() > MAX_BODY {
            return Err(Error::MalformedHandshake("body too long".into()));
        }
        let mut r = Reader { b: body };
        let m = match kind {
            Kind::Hello => Message::Hello(decode_hello(&mut r)?),
            Kind::Accept => Message::Accept(decode_hello(&mut r)?),
            Kind::Reject => {
                let code = RejectCode::from_u16(r.u16("reject code")?);
                let n = r.u16("reason length")? as usize;
                if n > MAX_REASON {
                    return Err(Error::MalformedHandshake("reject reason too long".into()));
                }
                let reason = String::from_utf8_lossy(r.bytes(n, "reason")?).into_owned();
                Message::Reject(Reject { code, reason })
            }
            Kind::Goodbye => Message::Goodbye,
        };
        if !r.b.is_empty() {
            return Err(Error::MalformedHandshake(format!(
                "{} trailing bytes after the message",
                r.b.len()
            )));
        }
        Ok(m)
    }

    /// Decodes one complete message (header and body) from `buf`.
    /// Returns `Ok(None)` if `buf` is shorter than the message, else the message
    /// and the number of bytes it occupied.
    ///
    /// # Errors
    /// As [`Header::decode`] and [`Message::decode_body`].
    pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>> {
        let Some(h) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let h = Header::decode(h)?;
        let total = HEADER_LEN + h.body_len;
        if buf.len() < total {
            return Ok(None);
        }
        Ok(Some((
            Message::decode_body(h.kind, &buf[HEADER_LEN..total])?,
            total,
        )))
    }
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn encode_hello(h: &Hello, out: &mut Vec<u8>) -> Result<()> {
    let too_long = |what: &str, n: usize, max: usize| {
        Err(Error::InvalidConfig(format!(
            "{what} of {n} exceeds the limit of {max}"
        )))
    };
    let token = h.token.as_deref();
    if let Some(t) = token.filter(|t| t.len() > MAX_TOKEN) {
        return too_long("token length", t.len(), MAX_TOKEN);
    }
    if h.endpoint.len() > MAX_ENDPOINT {
        return too_long("endpoint length", h.endpoint.len(), MAX_ENDPOINT);
    }
    if h.regions.len() > MAX_REGIONS {
        return too_long("region count", h.regions.len(), MAX_REGIONS);
    }
    if h.sections.len() > MAX_SECTIONS {
        return too_long("section count", h.sections.len(), MAX_SECTIONS);
    }
    for (i, sec) in h.sections.iter().enumerate() {
        if sec.bytes.len() > MAX_SECTION {
            return too_long("section length", sec.bytes.len(), MAX_SECTION);
        }
        if h.sections[..i].iter().any(|o| o.tag == sec.tag) {
            return Err(Error::InvalidConfig(format!(
                "section tag {:#x} appears twice",
                sec.tag
            )));
        }
    }
    match token {
        Some(t) => {
            out.push(1);
            out.extend_from_slice(&(t.len() as u16).to_le_bytes());
            out.extend_from_slice(t);
        }
        None => out.push(0),
    }
    out.push(h.provider);
    out.push(h.endpoint.len() as u8);
    out.extend_from_slice(&h.endpoint);
    out.push(h.regions.len() as u8);
    for d in &h.regions {
        out.extend_from_slice(&d.role.to_le_bytes());
        out.extend_from_slice(&d.remote.addr.to_le_bytes());
        out.extend_from_slice(&d.remote.len.to_le_bytes());
        out.extend_from_slice(&d.remote.rkey.to_le_bytes());
    }
    out.push(h.sections.len() as u8);
    for sec in &h.sections {
        out.extend_from_slice(&sec.tag.to_le_bytes());
        out.extend_from_slice(&(sec.bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(&sec.bytes);
    }
    Ok(())
}

fn decode_hello(r: &mut Reader<'_>) -> Result<Hello> {
    let token = match r.u8("token flag")? {
        0 => None,
        1 => {
            let n = r.u16("token length")? as usize;
            if n > MAX_TOKEN {
                return Err(Error::MalformedHandshake(format!(
                    "token of {n} bytes exceeds {MAX_TOKEN}"
                )));
            }
            Some(r.bytes(n, "token")?.to_vec())
        }
        f => return Err(Error::MalformedHandshake(format!("bad token flag {f}"))),
    };
    let provider = r.u8("provider")?;
    let n = r.u8("endpoint length")? as usize;
    if n > MAX_ENDPOINT {
        return Err(Error::MalformedHandshake("endpoint too long".into()));
    }
    let endpoint = r.bytes(n, "endpoint")?.to_vec();
    let count = r.u8("region count")? as usize;
    if count > MAX_REGIONS {
        return Err(Error::MalformedHandshake(format!(
            "{count} regions exceed the limit of {MAX_REGIONS}"
        )));
    }
    let mut regions = Vec::with_capacity(count);
    for _ in 0..count {
        let role = r.u16("region role")?;
        let addr = r.u64("region addr")?;
        let len = r.u64("region len")?;
        let rkey = r.u32("region rkey")?;
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(Error::MalformedHandshake(format!(
                "region {addr:#x}+{len} is empty or wraps the address space"
            )));
        }
        regions.push(RegionDesc {
            role,
            remote: RemoteRegion { addr, len, rkey },
        });
    }
    let count = r.u8("section count")? as usize;
    if count > MAX_SECTIONS {
        return Err(Error::MalformedHandshake(format!(
            "{count} sections exceed the limit of {MAX_SECTIONS}"
        )));
    }
    let mut sections: Vec<Section> = Vec::with_capacity(count);
    for _ in 0..count {
        let tag = r.u16("section tag")?;
        let n = r.u16("section length")? as usize;
        if n > MAX_SECTION {
            return Err(Error::MalformedHandshake(format!(
                "section {tag:#x} of {n} bytes exceeds {MAX_SECTION}"
            )));
        }
        if sections.iter().any(|s| s.tag == tag) {
            return Err(Error::MalformedHandshake(format!(
                "section tag {tag:#x} appears twice"
            )));
        }
        let bytes = r.bytes(n, "section")?.to_vec();
        sections.push(Section { tag, bytes });
    }
    Ok(Hello {
        token,
        provider,
        endpoint,
        regions,
        sections,
    })
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(Error::MalformedHandshake(format!("truncated at {what}")));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.bytes(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// Compares tokens in time independent of where they differ.
pub(crate) fn token_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_hello() -> impl Strategy<Value = Hello> {
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=MAX_TOKEN)),
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..=MAX_ENDPOINT),
            proptest::collection::vec(
                (any::<u16>(), 0u64..1 << 47, 1u64..1 << 40, any::<u32>()),
                0..=MAX_REGIONS,
            ),
            // Distinct tags; the sizes keep the body within MAX_BODY.
            proptest::collection::btree_map(
                any::<u16>(),
                proptest::collection::vec(any::<u8>(), 0..=MAX_SECTION / 4),
                0..=MAX_SECTIONS / 2,
            ),
        )
            .prop_map(|(token, provider, endpoint, regions, sections)| Hello {
                token,
                provider,
                endpoint,
                regions: regions
                    .into_iter()
                    .map(|(role, addr, len, rkey)| RegionDesc {
                        role,
                        remote: RemoteRegion { addr, len, rkey },
                    })
                    .collect(),
                sections: sections
                    .into_iter()
                    .map(|(tag, bytes)| Section { tag, bytes })
                    .collect(),
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

        #[test]
        fn hello_round_trips(h in arb_hello(), accept in any::<bool>()) {
            let m = if accept { Message::Accept(h) } else { Message::Hello(h) };
            let bytes = m.encode().unwrap();
            let (d, used) = Message::decode(&bytes).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(d, m);
        }

        #[test]
        fn every_prefix_is_incomplete_or_error(h in arb_hello(), cut in any::<prop::sample::Index>()) {
            let bytes = Message::Hello(h).encode().unwrap();
            let cut = cut.index(bytes.len());
            // A strict prefix is never a complete message.
            prop_assert!(matches!(Message::decode(&bytes[..cut]), Ok(None)));
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Message::decode(&data);
            for k in [Kind::Hello, Kind::Accept, Kind::Reject, Kind::Goodbye] {
                let _ = Message::decode_body(k, &data);
            }
        }

        #[test]
        fn corrupted_byte_is_refused_or_differs(h in arb_hello(), pos in any::<prop::sample::Index>(), x in 1u8..) {
            let m = Message::Hello(h);
            let mut bytes = m.encode().unwrap();
            let i = pos.index(bytes.len());
            bytes[i] ^= x;
            if let Ok(Some((d, _))) = Message::decode(&bytes) {
                prop_assert_ne!(d, m);
            }
        }
    }

    #[test]
    fn header_errors_are_specific() {
        let mut b = Message::Goodbye.encode().unwrap();
        b[0] = b'X';
        assert!(matches!(
            Message::decode(&b),
            Err(Error::MalformedHandshake(_))
        ));
        let mut b = Message::Goodbye.encode().unwrap();
        b[4] = 9;
        assert!(matches!(
            Message::decode(&b),
            Err(Error::VersionMismatch {
                ours: VERSION,
                theirs: 9
            })
        ));
        let mut b = Message::Goodbye.encode().unwrap();
        b[8..12].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert!(matches!(
            Message::decode(&b),
            Err(Error::MalformedHandshake(_))
        ));
        let mut b = Message::Goodbye.encode().unwrap();
        b.push(0);
        b[8] = 1;
        assert!(matches!(
            Message::decode(&b),
            Err(Error::MalformedHandshake(_))
        ));
    }

    #[test]
    fn oversized_fields_are_refused_on_encode() {
        let sec = |tag, n| Section {
            tag,
            bytes: vec![0; n],
        };
        for sections in [
            vec![sec(1, MAX_SECTION + 1)],
            (0..=MAX_SECTIONS as u16).map(|t| sec(t, 1)).collect(),
            vec![sec(7, 1), sec(7, 2)],
        ] {
            let h = Hello {
                sections,
                ..Hello::default()
            };
            assert!(matches!(
                Message::Hello(h).encode(),
                Err(Error::InvalidConfig(_))
            ));
        }
    }

    #[test]
    fn sections_a_peer_cannot_send_are_refused_on_decode() {
        let one = |tag: u16, n: u16| {
            let mut b = tag.to_le_bytes().to_vec();
            b.extend_from_slice(&n.to_le_bytes());
            b.extend(std::iter::repeat_n(0u8, n as usize));
            b
        };
        // An empty hello up to its section count: no token, provider 0,
        // no endpoint, no regions.
        let head = [0u8, 0, 0, 0];
        let cases: [(u8, Vec<u8>, &str); 3] = [
            (MAX_SECTIONS as u8 + 1, Vec::new(), "exceed the limit"),
            (1, one(9, MAX_SECTION as u16 + 1), "exceeds"),
            (2, [one(9, 1), one(9, 1)].concat(), "twice"),
        ];
        for (count, rest, why) in cases {
            let mut body = head.to_vec();
            body.push(count);
            body.extend_from_slice(&rest);
            match Message::decode_body(Kind::Hello, &body) {
                Err(Error::MalformedHandshake(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }

    #[test]
    fn tokens_compare() {
        assert!(token_eq(b"abc", b"abc"));
        assert!(!token_eq(b"abc", b"abd"));
        assert!(!token_eq(b"abc", b"ab"));
    }
}

#[cfg(test)]
mod corpus {
    /// Regenerates the fuzz seed corpus:
    /// `RRPC_WRITE_CORPUS=1 cargo test -p rrpc-core --lib corpus -- --ignored`.
    #[test]
    #[ignore = "writes the fuzz seed corpus, not a test: RRPC_WRITE_CORPUS=1 ... -- --ignored"]
    fn write_seed_corpus() {
        if std::env::var("RRPC_WRITE_CORPUS").is_err() {
            return;
        }
        use super::*;
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/handshake_decode"
        );
        let hello = Hello {
            token: Some(b"tok".to_vec()),
            provider: 1,
            endpoint: vec![0; 16],
            regions: vec![RegionDesc {
                role: 1,
                remote: RemoteRegion {
                    addr: 0x7f00_0000_0000,
                    len: 4 << 20,
                    rkey: 0xdead,
                },
            }],
            sections: vec![
                Section {
                    tag: 0x5242,
                    bytes: vec![1; 26],
                },
                Section {
                    tag: 0x5450,
                    bytes: b"RRP1".to_vec(),
                },
            ],
        };
        let msgs = [
            Message::Hello(hello.clone()),
            Message::Accept(hello),
            Message::Reject(Reject {
                code: RejectCode::Auth,
                reason: "no".into(),
            }),
            Message::Goodbye,
        ];
        for (i, m) in msgs.iter().enumerate() {
            std::fs::write(format!("{dir}/seed{i}"), m.encode().unwrap()).unwrap();
        }
    }
}
