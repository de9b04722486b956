//! The negotiation on an `rrpc://` port, sans-IO: the client's hello and
//! the server's reply (crate `port` docs).
//!
//! Every message is a fixed 8-byte header and a body of at most
//! [`MAX_BODY`] bytes:
//!
//! ```text
//! header: magic "RRPN" (4) | version u8 (= 1) | kind u8 | body length u16 BE
//! hello  (kind 1): fabrics u8 | host-id length u8 | host id
//! reply  (kind 2): code u8, then
//!          0 (TCP):     nothing (HTTP/2 follows on this connection)
//!          1 (shm):     host-id length u8 | host id | path length u16 BE | path (UTF-8)
//!          2 (verbs):   port u16 BE (the `rdma://` side channel's, on the
//!                       address the client dialed)
//!        255 (refused): reason (UTF-8, the rest of the body)
//! ```
//!
//! The magic's first byte (`R`) differs from the HTTP/2 preface's (`P`), so
//! one byte tells a plain gRPC client from an rrpc one. `fabrics` is a set
//! of bits ([`FABRIC_TCP`], [`FABRIC_SHM`], [`FABRIC_VERBS`]; a build
//! without the `verbs` feature never sets the last): unknown bits are carried, not refused, so a newer
//! client's offer reads as "these, and something this server does not
//! know". Every length is checked against the bytes present and against
//! its bound; nothing may follow the last field.

/// The first four bytes of every negotiation message.
pub(crate) const MAGIC: [u8; 4] = *b"RRPN";
/// The version this build speaks.
pub(crate) const VERSION: u8 = 1;
/// Bytes before the body.
pub(crate) const HEADER_LEN: usize = 8;
/// The largest body either side accepts.
pub(crate) const MAX_BODY: usize = 1024;
/// The longest host identity.
pub(crate) const MAX_HOST_ID: usize = 255;
/// The longest shm listener path a reply may name.
pub(crate) const MAX_PATH: usize = 512;

// The offer's bits: the values `Fabric::bit` gives (config.rs), named here
// for the docs and the tests.
/// Offer bit: HTTP/2 on this TCP connection.
#[allow(dead_code)]
pub(crate) const FABRIC_TCP: u8 = 1;
/// Offer bit: shared-memory rings (same host only).
#[allow(dead_code)]
pub(crate) const FABRIC_SHM: u8 = 2;
/// Offer bit: RDMA verbs through the server's `rdma://` side channel.
#[allow(dead_code)]
pub(crate) const FABRIC_VERBS: u8 = 4;

const KIND_HELLO: u8 = 1;
const KIND_REPLY: u8 = 2;
const CODE_TCP: u8 = 0;
const CODE_SHM: u8 = 1;
const CODE_VERBS: u8 = 2;
const CODE_REFUSED: u8 = 255;

/// The client's opening message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The fabrics the client allows (bits).
    pub(crate) fabrics: u8,
    /// The client's host identity (`host_id`).
    pub(crate) host_id: Vec<u8>,
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// HTTP/2 follows on this TCP connection.
    Tcp,
    /// Dial the shm listener at `path`; `host_id` is the server's.
    Shm {
        /// The server's host identity.
        host_id: Vec<u8>,
        /// Its shm listener's socket path.
        path: String,
    },
    /// Dial `rdma://` on the address the client dialed, at this port (the
    /// server's verbs side channel). Only a port: a server cannot point
    /// the client at another host.
    Verbs {
        /// The side channel's TCP port.
        port: u16,
    },
    /// No fabric both ends allow; the connection closes.
    Refused(String),
}

/// Why a negotiation message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HelloError {
    /// Fewer bytes than the header, or than a field needs.
    #[error("truncated negotiation message")]
    Truncated,
    /// Not rrpc's magic.
    #[error("not an rrpc negotiation message (bad magic)")]
    Magic,
    /// Another version.
    #[error("negotiation version {0} is not spoken here (this build speaks {VERSION})")]
    Version(u8),
    /// A hello where a reply belongs, or an unknown kind.
    #[error("unexpected negotiation message kind {0}")]
    Kind(u8),
    /// A length over its bound.
    #[error("negotiation message too large: {what} of {len} bytes (at most {max})")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Its bound.
        max: usize,
    },
    /// Bytes after the last field, or a body of another length than the header says.
    #[error("negotiation message has trailing bytes")]
    Trailing,
    /// A text field that is not UTF-8.
    #[error("negotiation message has a field that is not UTF-8")]
    Utf8,
    /// A verbs reply naming port 0.
    #[error("negotiation reply names port 0 for the verbs side channel")]
    Port,
    /// An unknown reply code.
    #[error("unknown negotiation reply code {0}")]
    Code(u8),
}

/// A parsed header: the kind and the body length that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    kind: u8,
    /// The body's length.
    pub(crate) len: usize,
}

/// Reads a header (magic, version, kind, bounded length).
pub(crate) fn parse_header(h: &[u8]) -> Result<Header, HelloError> {
    let Some(h) = h.get(..HEADER_LEN) else {
        return Err(HelloError::Truncated);
    };
    if h[..4] != MAGIC {
        return Err(HelloError::Magic);
    }
    if h[4] != VERSION {
        return Err(HelloError::Version(h[4]));
    }
    if h[5] != KIND_HELLO && h[5] != KIND_REPLY {
        return Err(HelloError::Kind(h[5]));
    }
    let len = usize::from(u16::from_be_bytes([h[6], h[7]]));
    if len > MAX_BODY {
        return Err(HelloError::TooLarge {
            what: "body",
            len,
            max: MAX_BODY,
        });
    }
    Ok(Header { kind: h[5], len })
}

impl Header {
    /// Whether a hello follows.
    pub(crate) fn is_hello(&self) -> bool {
        self.kind == KIND_HELLO
    }
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    debug_assert!(body.len() <= MAX_BODY);
    let mut m = Vec::with_capacity(HEADER_LEN + body.len());
    m.extend_from_slice(&MAGIC);
    m.push(VERSION);
    m.push(kind);
    m.extend_from_slice(&(body.len() as u16).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// A body reader that checks every length against the bytes left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if n > self.0.len() {
            return Err(HelloError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<usize, HelloError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn end(&self) -> Result<(), HelloError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(HelloError::Trailing)
        }
    }
}

fn utf8(b: &[u8]) -> Result<String, HelloError> {
    String::from_utf8(b.to_vec()).map_err(|_| HelloError::Utf8)
}

impl Hello {
    /// The whole message (header and body).
    ///
    /// # Panics
    /// If the host id is longer than [`MAX_HOST_ID`] (callers bound it).
    pub(crate) fn encode(&self) -> Vec<u8> {
        assert!(self.host_id.len() <= MAX_HOST_ID, "host id bounded");
        let mut b = vec![self.fabrics, self.host_id.len() as u8];
        b.extend_from_slice(&self.host_id);
        message(KIND_HELLO, &b)
    }

    /// A hello's body.
    pub(crate) fn decode_body(body: &[u8]) -> Result<Hello, HelloError> {
        let mut r = Reader(body);
        let fabrics = r.u8()?;
        let n = usize::from(r.u8()?);
        let host_id = r.take(n)?.to_vec();
        r.end()?;
        Ok(Hello { fabrics, host_id })
    }
}

impl Reply {
    /// The whole message (header and body); a reason or path over its
    /// bound is cut at a character boundary.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Reply::Tcp => b.push(CODE_TCP),
            Reply::Shm { host_id, path } => {
                assert!(host_id.len() <= MAX_HOST_ID, "host id bounded");
                assert!(path.len() <= MAX_PATH, "path bounded");
                b.push(CODE_SHM);
                b.push(host_id.len() as u8);
                b.extend_from_slice(host_id);
                b.extend_from_slice(&(path.len() as u16).to_be_bytes());
                b.extend_from_slice(path.as_bytes());
            }
            Reply::Verbs { port } => {
                b.push(CODE_VERBS);
                b.extend_from_slice(&port.to_be_bytes());
            }
            Reply::Refused(reason) => {
                b.push(CODE_REFUSED);
                let mut end = reason.len().min(MAX_BODY - 1);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                b.extend_from_slice(&reason.as_bytes()[..end]);
            }
        }
        message(KIND_REPLY, &b)
    }

    /// A reply's body.
    pub(crate) fn decode_body(body: &[u8]) -> Result<Reply, HelloError> {
        let mut r = Reader(body);
        match r.u8()? {
            CODE_TCP => {
                r.end()?;
                Ok(Reply::Tcp)
            }
            CODE_SHM => {
                let n = usize::from(r.u8()?);
                let host_id = r.take(n)?.to_vec();
                let len = r.u16()?;
                if len > MAX_PATH {
                    return Err(HelloError::TooLarge {
                        what: "path",
                        len,
                        max: MAX_PATH,
                    });
                }
                let path = utf8(r.take(len)?)?;
                r.end()?;
                Ok(Reply::Shm { host_id, path })
            }
            CODE_VERBS => {
                let b = r.take(2)?;
                let port = u16::from_be_bytes([b[0], b[1]]);
                r.end()?;
                if port == 0 {
                    return Err(HelloError::Port);
                }
                Ok(Reply::Verbs { port })
            }
            CODE_REFUSED => Ok(Reply::Refused(utf8(r.0)?)),
            c => Err(HelloError::Code(c)),
        }
    }
}

/// A whole message, parsed: the header, then a body of exactly the
/// length it gives (the fuzz target's and the tests' view; the server and
/// the client read the header and the body apart).
#[cfg_attr(not(any(test, fuzzing)), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// A client's hello.
    Hello(Hello),
    /// A server's reply.
    Reply(Reply),
}

/// Parses one whole message (no bytes may follow it).
#[cfg_attr(not(any(test, fuzzing)), allow(dead_code))]
pub(crate) fn decode(msg: &[u8]) -> Result<Message, HelloError> {
    let h = parse_header(msg)?;
    let body = &msg[HEADER_LEN..];
    if body.len() < h.len {
        return Err(HelloError::Truncated);
    }
    if body.len() > h.len {
        return Err(HelloError::Trailing);
    }
    if h.is_hello() {
        Hello::decode_body(body).map(Message::Hello)
    } else {
        Reply::decode_body(body).map(Message::Reply)
    }
}

#[cfg_attr(not(any(test, fuzzing)), allow(dead_code))]
impl Message {
    /// The message's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Message::Hello(h) => h.encode(),
            Message::Reply(r) => r.encode(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                fabrics: FABRIC_TCP | FABRIC_SHM,
                host_id: b"boot:machine:4026531840".to_vec(),
            }),
            Message::Hello(Hello {
                fabrics: 0xff,
                host_id: vec![7; MAX_HOST_ID],
            }),
            Message::Hello(Hello {
                fabrics: 0,
                host_id: vec![],
            }),
            Message::Reply(Reply::Tcp),
            Message::Reply(Reply::Shm {
                host_id: b"h".to_vec(),
                path: "/run/user/1/rrpc-port-50051-7.sock".into(),
            }),
            Message::Reply(Reply::Shm {
                host_id: vec![],
                path: "p".repeat(MAX_PATH),
            }),
            Message::Reply(Reply::Verbs { port: 50052 }),
            Message::Reply(Reply::Verbs { port: u16::MAX }),
            Message::Hello(Hello {
                fabrics: FABRIC_VERBS | FABRIC_TCP,
                host_id: b"h".to_vec(),
            }),
            Message::Reply(Reply::Refused("no common fabric: ö".into())),
            Message::Reply(Reply::Refused(String::new())),
        ]
    }

    #[test]
    fn round_trips() {
        for m in samples() {
            let b = m.encode();
            assert!(b.len() <= HEADER_LEN + MAX_BODY);
            assert_eq!(decode(&b).unwrap(), m, "{b:?}");
        }
        // The magic never reads as the HTTP/2 preface's first byte.
        assert_ne!(MAGIC[0], b'P');
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for m in samples() {
            let b = m.encode();
            for n in 0..b.len() {
                assert!(decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(decode(&longer), Err(HelloError::Trailing));
        }
    }

    #[test]
    fn malformed_messages_are_refused() {
        let ok = Hello {
            fabrics: 3,
            host_id: b"id".to_vec(),
        }
        .encode();
        let with = |i: usize, v: u8| {
            let mut b = ok.clone();
            b[i] = v;
            b
        };
        assert_eq!(decode(&with(0, b'P')), Err(HelloError::Magic));
        assert_eq!(
            decode(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Err(HelloError::Magic)
        );
        assert_eq!(decode(&with(4, 2)), Err(HelloError::Version(2)));
        assert_eq!(decode(&with(4, 0)), Err(HelloError::Version(0)));
        assert_eq!(decode(&with(5, 3)), Err(HelloError::Kind(3)));
        // A body length over the bound: refused from the header alone.
        let mut big = ok[..HEADER_LEN].to_vec();
        big[6..8].copy_from_slice(&((MAX_BODY + 1) as u16).to_be_bytes());
        assert!(matches!(
            parse_header(&big),
            Err(HelloError::TooLarge { what: "body", .. })
        ));
        big[6..8].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(decode(&big), Err(HelloError::TooLarge { .. })));
        // The host id's length beyond the body.
        let mut b = ok.clone();
        b[HEADER_LEN + 1] = 200;
        assert_eq!(decode(&b), Err(HelloError::Truncated));
        // The header's length shorter than the body.
        let mut b = ok.clone();
        b[7] -= 1;
        assert_eq!(decode(&b), Err(HelloError::Trailing));
        // Replies: unknown code, path over its bound, bad UTF-8, trailing.
        assert_eq!(Reply::decode_body(&[9]).unwrap_err(), HelloError::Code(9));
        let mut p = vec![CODE_SHM, 0];
        p.extend_from_slice(&((MAX_PATH + 1) as u16).to_be_bytes());
        p.extend(std::iter::repeat_n(b'a', MAX_PATH + 1));
        assert!(matches!(
            Reply::decode_body(&p),
            Err(HelloError::TooLarge { what: "path", .. })
        ));
        assert_eq!(
            Reply::decode_body(&[CODE_SHM, 0, 0, 1, 0xff]).unwrap_err(),
            HelloError::Utf8
        );
        assert_eq!(
            Reply::decode_body(&[CODE_REFUSED, 0xc3]).unwrap_err(),
            HelloError::Utf8
        );
        assert_eq!(
            Reply::decode_body(&[CODE_TCP, 0]).unwrap_err(),
            HelloError::Trailing
        );
        assert_eq!(
            Reply::decode_body(&[CODE_VERBS, 0, 1, 0]).unwrap_err(),
            HelloError::Trailing
        );
        assert_eq!(
            Reply::decode_body(&[CODE_VERBS, 1]).unwrap_err(),
            HelloError::Truncated
        );
        assert_eq!(
            Reply::decode_body(&[CODE_VERBS, 0, 0]).unwrap_err(),
            HelloError::Port
        );
        assert_eq!(Reply::decode_body(&[]).unwrap_err(), HelloError::Truncated);
        assert_eq!(Hello::decode_body(&[]).unwrap_err(), HelloError::Truncated);
        assert_eq!(Hello::decode_body(&[1]).unwrap_err(), HelloError::Truncated);
    }

    /// The fuzz target's seeds (`fuzz/corpus/port_hello`) are what they
    /// say: every one but the HTTP/2 preface a message that round-trips.
    #[test]
    fn the_fuzz_seeds_are_well_formed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/port_hello");
        let mut n = 0;
        for e in std::fs::read_dir(dir).expect("seed corpus") {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let b = std::fs::read(e.path()).expect("seed");
            match decode(&b) {
                Ok(m) => assert_eq!(m.encode(), b, "{name}"),
                Err(e) => assert_eq!((name.as_str(), e), ("h2_preface", HelloError::Magic)),
            }
            n += 1;
        }
        assert!(n >= 6, "{n} seeds");
    }

    #[test]
    fn a_long_refusal_is_cut_to_the_bound_on_a_char_boundary() {
        let r = Reply::Refused("é".repeat(MAX_BODY));
        let b = r.encode();
        assert!(b.len() <= HEADER_LEN + MAX_BODY);
        let Message::Reply(Reply::Refused(s)) = decode(&b).unwrap() else {
            panic!("a refusal")
        };
        assert!(s.len() < MAX_BODY && s.chars().all(|c| c == 'é'));
    }
}
