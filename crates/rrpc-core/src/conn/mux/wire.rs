//! The messages of logical connections over an open side channel: their
//! encoding, and their decoding from peer-written bytes (read once,
//! checked, never trusted: every malformed input is an error naming the
//! field, never a panic).
//!
//! A frame is `"RRPM" kind:u8 0:u8 body_len:u16le body`; integers are
//! little-endian; a byte string is `len:u16le bytes`. The side channel's
//! own messages start with `"RRPC"` (`crate::handshake::MAGIC`): a
//! goodbye there is told apart by its first four bytes.
//!
//! ```text
//! grant   = arena:u16 slot:u32 len:u64          (its memory rides along once)
//! open    = req:u32 tag:u32 n:u8 {role:u16 bytes} m:u8 {role:u16 slice}
//! opened  = req:u32 n:u8 {role:u16 bytes} m:u8 {role:u16 slice}
//! refused = req:u32 reason:bytes
//! close   = tag:u32
//! closed  = tag:u32
//! ahead   = n:u8 {role:u16 bytes} m:u8 {role:u16 slice}
//! open_ahead = req:u32 tag:u32 n:u8 {role:u16 bytes} m:u8 {role:u16 slice} slice
//! slice   = arena:u16 offset:u64 len:u64
//! ```

use crate::error::{Error, Result};

/// What starts every frame.
pub const MUX_MAGIC: [u8; 4] = *b"RRPM";
/// Length of a frame's header.
pub const MUX_HEADER_LEN: usize = 8;
/// The largest body a frame may carry.
pub const MUX_MAX_BODY: usize = 4096;
/// At most this many sections (and this many slices) in an open or opened.
pub const MUX_MAX_PARTS: usize = 4;
/// The longest section, and the longest refusal reason.
pub const MUX_MAX_BYTES: usize = 1024;

/// A slice of an arena its sender granted the receiver ([`MuxMessage::Grant`]):
/// where the receiver writes one ring of one logical connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    /// The arena, as its grant named it.
    pub arena: u16,
    /// Bytes from the arena's start.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// What a logical connection's open (or its answer) carries besides ids:
/// the layers' sections and the slices granted, each under a role (as a
/// handshake's `Offer` does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    /// `(role, bytes)`: the ring's parameters, the transport's section.
    pub sections: Vec<(u16, Vec<u8>)>,
    /// `(role, slice)`: where the receiver writes.
    pub slices: Vec<(u16, Slice)>,
}

impl Parts {
    /// The section under `role`.
    pub fn section(&self, role: u16) -> Option<&[u8]> {
        self.sections
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, b)| &b[..])
    }

    /// The slice under `role`.
    pub fn slice(&self, role: u16) -> Option<Slice> {
        self.slices
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, s)| *s)
    }
}

/// One message over a shared connection's side channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MuxMessage {
    /// The sender grants the receiver an arena of `len` bytes cut into
    /// slots of `slot` bytes (its memory, on shm a memfd, rides along).
    Grant {
        /// The arena's id, unique per sender and shared connection.
        arena: u16,
        /// The slot size: every slice named later starts on a slot.
        slot: u32,
        /// The arena's length.
        len: u64,
    },
    /// Client: open a logical connection under `tag`.
    Open {
        /// The client's request id, echoed in the answer.
        req: u32,
        /// The sharer tag, the connection's name at both ends from now on.
        tag: u32,
        /// What the client offers.
        parts: Parts,
    },
    /// Server: the logical connection of request `req` is open.
    Opened {
        /// The request answered.
        req: u32,
        /// What the server offers.
        parts: Parts,
    },
    /// Server: request `req` is refused (nothing was set up).
    Refused {
        /// The request answered.
        req: u32,
        /// Why, for the client's error.
        reason: String,
    },
    /// Either end: the sender has stopped writing into the receiver's
    /// slices of logical connection `tag`.
    Close {
        /// The logical connection.
        tag: u32,
    },
    /// The answer to a close: the sender has stopped writing too, and has
    /// taken its own slices back.
    Closed {
        /// The logical connection.
        tag: u32,
    },
    /// Server: slots of its arena granted ahead (`parts.slices`, one per
    /// role), each for one later [`MuxMessage::OpenAhead`], and the answer
    /// such an open gets (`parts.sections`), so that the client need not
    /// wait for it (0-RTT lanes, module docs of `mux`).
    Ahead {
        /// The answer's sections and the slots granted ahead.
        parts: Parts,
    },
    /// Client: open a logical connection under `tag` writing into `slot`,
    /// a slot the server granted ahead; the client writes before the
    /// answer comes.
    OpenAhead {
        /// The client's request id, echoed in the answer.
        req: u32,
        /// The sharer tag.
        tag: u32,
        /// What the client offers.
        parts: Parts,
        /// The server's slot, from a [`MuxMessage::Ahead`].
        slot: Slice,
    },
}

const K_GRANT: u8 = 1;
const K_OPEN: u8 = 2;
const K_OPENED: u8 = 3;
const K_REFUSED: u8 = 4;
const K_CLOSE: u8 = 5;
const K_CLOSED: u8 = 6;
const K_AHEAD: u8 = 7;
const K_OPEN_AHEAD: u8 = 8;

fn bad(what: impl Into<String>) -> Error {
    Error::MalformedHandshake(format!("side-channel message: {}", what.into()))
}

impl MuxMessage {
    /// Encodes the frame.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when a part exceeds its limit (a local
    /// mistake: we never send what the peer must refuse).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut b = Vec::with_capacity(64);
        let kind = match self {
            MuxMessage::Grant { arena, slot, len } => {
                b.extend_from_slice(&arena.to_le_bytes());
                b.extend_from_slice(&slot.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
                K_GRANT
            }
            MuxMessage::Open { req, tag, parts } => {
                b.extend_from_slice(&req.to_le_bytes());
                b.extend_from_slice(&tag.to_le_bytes());
                put_parts(&mut b, parts)?;
                K_OPEN
            }
            MuxMessage::Opened { req, parts } => {
                b.extend_from_slice(&req.to_le_bytes());
                put_parts(&mut b, parts)?;
                K_OPENED
            }
            MuxMessage::Refused { req, reason } => {
                b.extend_from_slice(&req.to_le_bytes());
                // A long reason is cut (on a character boundary), not refused.
                let mut end = reason.len().min(MUX_MAX_BYTES);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                put_bytes(&mut b, &reason.as_bytes()[..end])?;
                K_REFUSED
            }
            MuxMessage::Close { tag } => {
                b.extend_from_slice(&tag.to_le_bytes());
                K_CLOSE
            }
            MuxMessage::Closed { tag } => {
                b.extend_from_slice(&tag.to_le_bytes());
                K_CLOSED
            }
            MuxMessage::Ahead { parts } => {
                put_parts(&mut b, parts)?;
                K_AHEAD
            }
            MuxMessage::OpenAhead {
                req,
                tag,
                parts,
                slot,
            } => {
                b.extend_from_slice(&req.to_le_bytes());
                b.extend_from_slice(&tag.to_le_bytes());
                put_parts(&mut b, parts)?;
                put_slice(&mut b, slot);
                K_OPEN_AHEAD
            }
        };
        if b.len() > MUX_MAX_BODY {
            return Err(Error::InvalidConfig(format!(
                "a side-channel message of {} bytes (at most {MUX_MAX_BODY})",
                b.len()
            )));
        }
        let mut f = Vec::with_capacity(MUX_HEADER_LEN + b.len());
        f.extend_from_slice(&MUX_MAGIC);
        f.push(kind);
        f.push(0);
        f.extend_from_slice(&(b.len() as u16).to_le_bytes());
        f.extend_from_slice(&b);
        Ok(f)
    }

    /// Decodes the first frame of `buf`: `Ok(None)` while it is not whole,
    /// else the message and the bytes it took.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] naming what was wrong: another magic,
    /// an unknown kind, a body over [`MUX_MAX_BODY`], a field past the
    /// body's end or bytes left over, a part over its limit, a reason that
    /// is not UTF-8.
    pub fn decode(buf: &[u8]) -> Result<Option<(MuxMessage, usize)>> {
        if buf.len() < MUX_HEADER_LEN {
            // A wrong magic is said at once, not after more bytes.
            let n = buf.len().min(4);
            if buf[..n] != MUX_MAGIC[..n] {
                return Err(bad("not a side-channel frame (bad magic)"));
            }
            return Ok(None);
        }
        if buf[..4] != MUX_MAGIC {
            return Err(bad("not a side-channel frame (bad magic)"));
        }
        let kind = buf[4];
        if buf[5] != 0 {
            return Err(bad(format!("reserved byte is {}", buf[5])));
        }
        let len = usize::from(u16::from_le_bytes([buf[6], buf[7]]));
        if len > MUX_MAX_BODY {
            return Err(bad(format!("body of {len} bytes (at most {MUX_MAX_BODY})")));
        }
        let Some(body) = buf.get(MUX_HEADER_LEN..MUX_HEADER_LEN + len) else {
            return Ok(None);
        };
        let m = Self::decode_body(kind, body)?;
        Ok(Some((m, MUX_HEADER_LEN + len)))
    }

    /// Decodes a body of `kind`.
    ///
    /// # Errors
    /// As [`Self::decode`].
    pub fn decode_body(kind: u8, body: &[u8]) -> Result<MuxMessage> {
        let mut r = Reader { b: body, at: 0 };
        let m = match kind {
            K_GRANT => MuxMessage::Grant {
                arena: r.u16("arena")?,
                slot: r.u32("slot")?,
                len: r.u64("len")?,
            },
            K_OPEN => MuxMessage::Open {
                req: r.u32("req")?,
                tag: r.u32("tag")?,
                parts: r.parts()?,
            },
            K_OPENED => MuxMessage::Opened {
                req: r.u32("req")?,
                parts: r.parts()?,
            },
            K_REFUSED => MuxMessage::Refused {
                req: r.u32("req")?,
                reason: String::from_utf8(r.bytes("reason")?.to_vec())
                    .map_err(|_| bad("reason is not UTF-8"))?,
            },
            K_CLOSE => MuxMessage::Close { tag: r.u32("tag")? },
            K_CLOSED => MuxMessage::Closed { tag: r.u32("tag")? },
            K_AHEAD => MuxMessage::Ahead { parts: r.parts()? },
            K_OPEN_AHEAD => MuxMessage::OpenAhead {
                req: r.u32("req")?,
                tag: r.u32("tag")?,
                parts: r.parts()?,
                slot: r.slice()?,
            },
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        if r.at != body.len() {
            return Err(bad(format!(
                "{} bytes after the message",
                body.len() - r.at
            )));
        }
        Ok(m)
    }
}

fn put_bytes(b: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    if bytes.len() > MUX_MAX_BYTES {
        return Err(Error::InvalidConfig(format!(
            "a side-channel section of {} bytes (at most {MUX_MAX_BYTES})",
            bytes.len()
        )));
    }
    b.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    b.extend_from_slice(bytes);
    Ok(())
}

fn put_parts(b: &mut Vec<u8>, p: &Parts) -> Result<()> {
    if p.sections.len() > MUX_MAX_PARTS || p.slices.len() > MUX_MAX_PARTS {
        return Err(Error::InvalidConfig(format!(
            "{} sections and {} slices in one side-channel message (at most {MUX_MAX_PARTS} each)",
            p.sections.len(),
            p.slices.len()
        )));
    }
    b.push(p.sections.len() as u8);
    for (role, s) in &p.sections {
        b.extend_from_slice(&role.to_le_bytes());
        put_bytes(b, s)?;
    }
    b.push(p.slices.len() as u8);
    for (role, s) in &p.slices {
        b.extend_from_slice(&role.to_le_bytes());
        put_slice(b, s);
    }
    Ok(())
}

fn put_slice(b: &mut Vec<u8>, s: &Slice) {
    b.extend_from_slice(&s.arena.to_le_bytes());
    b.extend_from_slice(&s.offset.to_le_bytes());
    b.extend_from_slice(&s.len.to_le_bytes());
}

/// Reads fields off a body, each named in the error when it runs past.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| bad(format!("{what} runs past the body's end")))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = usize::from(self.u16(what)?);
        if n > MUX_MAX_BYTES {
            return Err(bad(format!(
                "{what} of {n} bytes (at most {MUX_MAX_BYTES})"
            )));
        }
        self.take(n, what)
    }

    fn count(&mut self, what: &str) -> Result<usize> {
        let n = usize::from(self.u8(what)?);
        if n > MUX_MAX_PARTS {
            return Err(bad(format!("{n} {what} (at most {MUX_MAX_PARTS})")));
        }
        Ok(n)
    }

    fn parts(&mut self) -> Result<Parts> {
        let mut p = Parts::default();
        for _ in 0..self.count("sections")? {
            let role = self.u16("section role")?;
            if p.section(role).is_some() {
                return Err(bad(format!("section role {role:#x} twice")));
            }
            p.sections.push((role, self.bytes("section")?.to_vec()));
        }
        for _ in 0..self.count("slices")? {
            let role = self.u16("slice role")?;
            if p.slice(role).is_some() {
                return Err(bad(format!("slice role {role:#x} twice")));
            }
            let s = self.slice()?;
            p.slices.push((role, s));
        }
        Ok(p)
    }

    fn slice(&mut self) -> Result<Slice> {
        Ok(Slice {
            arena: self.u16("slice arena")?,
            offset: self.u64("slice offset")?,
            len: self.u64("slice length")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parts() -> Parts {
        Parts {
            sections: vec![(0x5242, vec![1, 2, 3]), (0x7470, b"fast".to_vec())],
            slices: vec![(
                0x5242,
                Slice {
                    arena: 1,
                    offset: 8192,
                    len: 69632,
                },
            )],
        }
    }

    fn all() -> Vec<MuxMessage> {
        vec![
            MuxMessage::Grant {
                arena: 3,
                slot: 1 << 17,
                len: 1 << 22,
            },
            MuxMessage::Open {
                req: 7,
                tag: 9,
                parts: parts(),
            },
            MuxMessage::Opened {
                req: 7,
                parts: Parts::default(),
            },
            MuxMessage::Refused {
                req: 7,
                reason: "full".into(),
            },
            MuxMessage::Close { tag: 9 },
            MuxMessage::Closed { tag: 9 },
            MuxMessage::Ahead { parts: parts() },
            MuxMessage::OpenAhead {
                req: 8,
                tag: 10,
                parts: parts(),
                slot: Slice {
                    arena: 0,
                    offset: 1 << 17,
                    len: 69632,
                },
            },
        ]
    }

    #[test]
    fn every_message_round_trips_and_arrives_in_pieces() {
        for m in all() {
            let f = m.encode().unwrap();
            for cut in 0..f.len() {
                assert_eq!(
                    MuxMessage::decode(&f[..cut]).unwrap(),
                    None,
                    "{m:?} cut {cut}"
                );
            }
            let mut two = f.clone();
            two.extend_from_slice(&f);
            assert_eq!(
                MuxMessage::decode(&two).unwrap(),
                Some((m.clone(), f.len()))
            );
        }
    }

    #[test]
    fn bad_frames_say_what_was_wrong() {
        let ok = MuxMessage::Open {
            req: 1,
            tag: 2,
            parts: parts(),
        }
        .encode()
        .unwrap();
        let says = |f: &[u8], what: &str| {
            let e = MuxMessage::decode(f).unwrap_err();
            assert!(matches!(e, Error::MalformedHandshake(_)), "{e:?}");
            assert!(e.to_string().contains(what), "{e} lacks {what:?}");
        };
        // A goodbye of the side channel itself ("RRPC") is no frame of ours.
        says(b"RRPC", "bad magic");
        says(b"RX", "bad magic");
        assert_eq!(
            MuxMessage::decode(b"RR").unwrap(),
            None,
            "a start of a frame"
        );
        let mut f = ok.clone();
        f[4] = 99;
        says(&f, "unknown kind 99");
        let mut f = ok.clone();
        f[5] = 1;
        says(&f, "reserved");
        let mut f = ok.clone();
        f[6..8].copy_from_slice(&5000u16.to_le_bytes());
        says(&f, "body of 5000 bytes");
        // A body one byte short: the slice's length runs past the end.
        let mut f = ok.clone();
        let n = u16::from_le_bytes([f[6], f[7]]) - 1;
        f[6..8].copy_from_slice(&n.to_le_bytes());
        f.pop();
        says(&f, "slice length runs past");
        // A byte too many.
        let mut f = ok.clone();
        f.push(0);
        f[6..8].copy_from_slice(&(n + 2).to_le_bytes());
        says(&f, "1 bytes after the message");
        // Too many sections; a section that claims more than the limit.
        let body = [&1u32.to_le_bytes()[..], &2u32.to_le_bytes(), &[5u8]].concat();
        assert!(
            MuxMessage::decode_body(K_OPEN, &body)
                .unwrap_err()
                .to_string()
                .contains("5 sections")
        );
        let body = [
            &1u32.to_le_bytes()[..],
            &1u8.to_le_bytes(),
            &1u16.to_le_bytes(),
            &2000u16.to_le_bytes(),
        ]
        .concat();
        assert!(
            MuxMessage::decode_body(K_OPENED, &body)
                .unwrap_err()
                .to_string()
                .contains("section of 2000 bytes")
        );
        // The same role twice.
        let twice = Parts {
            sections: vec![(1, vec![]), (1, vec![])],
            slices: vec![],
        };
        let f = MuxMessage::Opened {
            req: 1,
            parts: twice,
        }
        .encode()
        .unwrap();
        says(&f, "section role 0x1 twice");
        let body = [&1u32.to_le_bytes()[..], &2u16.to_le_bytes(), &[0xff, 0xfe]].concat();
        assert!(
            MuxMessage::decode_body(K_REFUSED, &body)
                .unwrap_err()
                .to_string()
                .contains("UTF-8")
        );
    }

    #[test]
    fn we_never_send_what_the_peer_must_refuse() {
        let big = Parts {
            sections: vec![(1, vec![0; MUX_MAX_BYTES + 1])],
            slices: vec![],
        };
        assert!(matches!(
            MuxMessage::Opened { req: 0, parts: big }.encode(),
            Err(Error::InvalidConfig(_))
        ));
        let many = Parts {
            sections: (0..5).map(|r| (r, vec![])).collect(),
            slices: vec![],
        };
        assert!(
            MuxMessage::Opened {
                req: 0,
                parts: many
            }
            .encode()
            .is_err()
        );
        // A long reason is cut to the limit, on a character boundary.
        let f = MuxMessage::Refused {
            req: 0,
            reason: "é".repeat(MUX_MAX_BYTES),
        }
        .encode()
        .unwrap();
        let Some((MuxMessage::Refused { reason, .. }, _)) = MuxMessage::decode(&f).unwrap() else {
            panic!("a refusal");
        };
        assert_eq!(reason.len(), MUX_MAX_BYTES);
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder, and what decodes
        /// re-encodes to the same bytes.
        #[test]
        fn arbitrary_bytes_never_panic(mut b in proptest::collection::vec(any::<u8>(), 0..200),
                                       kind in 0u8..8) {
            let _ = MuxMessage::decode_body(kind, &b);
            if b.len() >= MUX_HEADER_LEN {
                b[..4].copy_from_slice(&MUX_MAGIC);
                b[5] = 0;
                b[4] %= 8;
                let n = (b.len() - MUX_HEADER_LEN) as u16;
                b[6..8].copy_from_slice(&n.to_le_bytes());
            }
            if let Ok(Some((m, used))) = MuxMessage::decode(&b) {
                prop_assert_eq!(m.encode().unwrap(), b[..used].to_vec());
            }
        }
    }
}
