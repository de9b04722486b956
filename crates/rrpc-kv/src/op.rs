//! The store's operations and their binary encoding.
//!
//! An RF-RPC request carries one encoded [`Op`]; its result one encoded
//! [`OpResult`]. Both are parsed from peer-written bytes, so decoding checks
//! every length against the buffer and the limits below and returns
//! [`Error::Malformed`] rather than panicking.
//!
//! ```text
//! Op:       kind u8 | key_len u16 LE | key | (Put) value_len u32 LE | value
//!                                          | (Scan) count u32 LE
//! OpResult: tag u8 | body
//!   0 Ok            (Put, or Delete that removed a key)
//!   1 NotFound      (Get or Delete of a missing key)
//!   2 Value         value_len u32 LE | value
//!   3 Entries       n u32 LE | n × (key_len u16 LE | key | value_len u32 LE | value)
//!   4 Failed        msg_len u16 LE | UTF-8 message
//! ```

use bytes::{BufMut, Bytes};

use crate::error::{Error, Result};

/// Longest key, in bytes (memcached's limit).
pub const MAX_KEY_LEN: usize = 250;
/// Longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 1 << 20;
/// Most entries one SCAN returns.
pub const MAX_SCAN: u32 = 1000;

/// One operation on the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The value of `key`.
    Get {
        /// The key.
        key: Bytes,
    },
    /// Stores `value` under `key`, replacing any value.
    Put {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// Removes `key`.
    Delete {
        /// The key.
        key: Bytes,
    },
    /// Up to `count` entries with keys at or after `start`, in key order.
    Scan {
        /// The first key (inclusive).
        start: Bytes,
        /// How many entries at most.
        count: u32,
    },
}

/// The outcome of one [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// A PUT stored its value, or a DELETE removed its key.
    Ok,
    /// A GET or DELETE found no such key.
    NotFound,
    /// A GET's value.
    Value(Bytes),
    /// A SCAN's entries, in key order.
    Entries(Vec<(Bytes, Bytes)>),
    /// The store could not carry out the operation.
    Failed(String),
}

/// Something that carries out operations: the store, or a client of one.
///
/// The gRPC face and the RF-RPC server serve any `Execute`; the YCSB driver
/// drives any `Execute`.
pub trait Execute: Send + Sync + 'static {
    /// Carries out `op`. A failure the caller should see is
    /// [`OpResult::Failed`].
    fn execute(&self, op: Op) -> OpResult;
}

const GET: u8 = 1;
const PUT: u8 = 2;
const DELETE: u8 = 3;
const SCAN: u8 = 4;

fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::TooLarge {
            what: "key",
            len: key.len(),
            limit: MAX_KEY_LEN,
        });
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::TooLarge {
            what: "value",
            len: value.len(),
            limit: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

impl Op {
    /// The key the operation is routed by (a SCAN's start key).
    pub fn key(&self) -> &Bytes {
        match self {
            Op::Get { key } | Op::Put { key, .. } | Op::Delete { key } => key,
            Op::Scan { start, .. } => start,
        }
    }

    /// Checks the key and value against [`MAX_KEY_LEN`], [`MAX_VALUE_LEN`]
    /// and [`MAX_SCAN`].
    ///
    /// # Errors
    /// [`Error::TooLarge`].
    pub fn validate(&self) -> Result<()> {
        check_key(self.key())?;
        match self {
            Op::Put { value, .. } => check_value(value),
            Op::Scan { count, .. } if *count > MAX_SCAN => Err(Error::TooLarge {
                what: "scan count",
                len: *count as usize,
                limit: MAX_SCAN as usize,
            }),
            _ => Ok(()),
        }
    }

    /// Bytes [`Op::encode`] appends.
    pub fn encoded_len(&self) -> usize {
        1 + 2
            + self.key().len()
            + match self {
                Op::Put { value, .. } => 4 + value.len(),
                Op::Scan { .. } => 4,
                _ => 0,
            }
    }

    /// Appends the encoding to `out`.
    ///
    /// # Errors
    /// [`Error::TooLarge`] for a key or value over the limits.
    pub fn encode(&self, out: &mut impl BufMut) -> Result<()> {
        self.validate()?;
        let kind = match self {
            Op::Get { .. } => GET,
            Op::Put { .. } => PUT,
            Op::Delete { .. } => DELETE,
            Op::Scan { .. } => SCAN,
        };
        out.put_u8(kind);
        out.put_u16_le(self.key().len() as u16);
        out.put_slice(self.key());
        match self {
            Op::Put { value, .. } => {
                out.put_u32_le(value.len() as u32);
                out.put_slice(value);
            }
            Op::Scan { count, .. } => out.put_u32_le(*count),
            _ => {}
        }
        Ok(())
    }

    /// The encoding as a new buffer.
    ///
    /// # Errors
    /// As [`Op::encode`].
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode(&mut v)?;
        Ok(v)
    }

    /// Parses exactly one operation from `buf` (peer-written bytes).
    ///
    /// # Errors
    /// [`Error::Malformed`] for anything but one well-formed operation within
    /// the limits, trailing bytes included.
    pub fn decode(buf: &[u8]) -> Result<Op> {
        let mut r = Reader::new(buf, "request");
        let kind = r.u8()?;
        let key_len = r.u16()? as usize;
        if key_len > MAX_KEY_LEN {
            return Err(r.bad(format!("key of {key_len} bytes over {MAX_KEY_LEN}")));
        }
        let key = r.bytes(key_len)?;
        let op = match kind {
            GET => Op::Get { key },
            DELETE => Op::Delete { key },
            PUT => {
                let n = r.u32()? as usize;
                if n > MAX_VALUE_LEN {
                    return Err(r.bad(format!("value of {n} bytes over {MAX_VALUE_LEN}")));
                }
                Op::Put {
                    key,
                    value: r.bytes(n)?,
                }
            }
            SCAN => {
                let count = r.u32()?;
                if count > MAX_SCAN {
                    return Err(r.bad(format!("scan of {count} over {MAX_SCAN}")));
                }
                Op::Scan { start: key, count }
            }
            k => return Err(r.bad(format!("unknown operation {k}"))),
        };
        r.finish()?;
        Ok(op)
    }
}

const R_OK: u8 = 0;
const R_NOT_FOUND: u8 = 1;
const R_VALUE: u8 = 2;
const R_ENTRIES: u8 = 3;
const R_FAILED: u8 = 4;

impl OpResult {
    /// Bytes [`OpResult::encode`] appends.
    pub fn encoded_len(&self) -> usize {
        1 + match self {
            OpResult::Ok | OpResult::NotFound => 0,
            OpResult::Value(v) => 4 + v.len(),
            OpResult::Entries(e) => 4 + e.iter().map(|(k, v)| 6 + k.len() + v.len()).sum::<usize>(),
            OpResult::Failed(m) => 2 + m.len().min(u16::MAX as usize),
        }
    }

    /// Appends the encoding to `out` (a failure message is cut at 64 KiB).
    pub fn encode(&self, out: &mut impl BufMut) {
        match self {
            OpResult::Ok => out.put_u8(R_OK),
            OpResult::NotFound => out.put_u8(R_NOT_FOUND),
            OpResult::Value(v) => {
                out.put_u8(R_VALUE);
                out.put_u32_le(v.len() as u32);
                out.put_slice(v);
            }
            OpResult::Entries(e) => {
                out.put_u8(R_ENTRIES);
                out.put_u32_le(e.len() as u32);
                for (k, v) in e {
                    out.put_u16_le(k.len() as u16);
                    out.put_slice(k);
                    out.put_u32_le(v.len() as u32);
                    out.put_slice(v);
                }
            }
            OpResult::Failed(m) => {
                let mut end = m.len().min(u16::MAX as usize);
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                out.put_u8(R_FAILED);
                out.put_u16_le(end as u16);
                out.put_slice(&m.as_bytes()[..end]);
            }
        }
    }

    /// The encoding as a new buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode(&mut v);
        v
    }

    /// Parses exactly one result from `buf` (peer-written bytes).
    ///
    /// # Errors
    /// [`Error::Malformed`] for anything but one well-formed result.
    pub fn decode(buf: &[u8]) -> Result<OpResult> {
        let mut r = Reader::new(buf, "result");
        let res = match r.u8()? {
            R_OK => OpResult::Ok,
            R_NOT_FOUND => OpResult::NotFound,
            R_VALUE => {
                let n = r.u32()? as usize;
                if n > MAX_VALUE_LEN {
                    return Err(r.bad(format!("value of {n} bytes over {MAX_VALUE_LEN}")));
                }
                OpResult::Value(r.bytes(n)?)
            }
            R_ENTRIES => {
                let n = r.u32()?;
                if n > MAX_SCAN {
                    return Err(r.bad(format!("{n} entries over {MAX_SCAN}")));
                }
                let mut e = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let kl = r.u16()? as usize;
                    if kl > MAX_KEY_LEN {
                        return Err(r.bad(format!("key of {kl} bytes over {MAX_KEY_LEN}")));
                    }
                    let k = r.bytes(kl)?;
                    let vl = r.u32()? as usize;
                    if vl > MAX_VALUE_LEN {
                        return Err(r.bad(format!("value of {vl} bytes over {MAX_VALUE_LEN}")));
                    }
                    e.push((k, r.bytes(vl)?));
                }
                OpResult::Entries(e)
            }
            R_FAILED => {
                let n = r.u16()? as usize;
                let m = r.bytes(n)?;
                OpResult::Failed(
                    String::from_utf8(m.to_vec())
                        .map_err(|_| r.bad("failure message is not UTF-8".into()))?,
                )
            }
            t => return Err(r.bad(format!("unknown result tag {t}"))),
        };
        r.finish()?;
        Ok(res)
    }
}

/// A bounds-checked cursor over peer-written bytes.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, at: 0, what }
    }

    fn bad(&self, detail: String) -> Error {
        Error::Malformed {
            what: self.what,
            detail,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.bad(format!(
                    "needs {n} bytes at offset {}, has {}",
                    self.at,
                    self.buf.len()
                ))
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes> {
        Ok(Bytes::copy_from_slice(self.take(n)?))
    }

    fn finish(&self) -> Result<()> {
        if self.at != self.buf.len() {
            return Err(self.bad(format!("{} trailing bytes", self.buf.len() - self.at)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..=MAX_KEY_LEN).prop_map(Bytes::from)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            key().prop_map(|key| Op::Get { key }),
            (key(), proptest::collection::vec(any::<u8>(), 0..2000)).prop_map(|(key, v)| Op::Put {
                key,
                value: v.into()
            }),
            key().prop_map(|key| Op::Delete { key }),
            (key(), 0..=MAX_SCAN).prop_map(|(start, count)| Op::Scan { start, count }),
        ]
    }

    fn result() -> impl Strategy<Value = OpResult> {
        prop_oneof![
            Just(OpResult::Ok),
            Just(OpResult::NotFound),
            proptest::collection::vec(any::<u8>(), 0..2000).prop_map(|v| OpResult::Value(v.into())),
            proptest::collection::vec(
                (
                    key(),
                    proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
                ),
                0..20
            )
            .prop_map(OpResult::Entries),
            ".{0,40}".prop_map(OpResult::Failed),
        ]
    }

    proptest! {
        #[test]
        fn ops_round_trip(op in op()) {
            let b = op.to_bytes().unwrap();
            prop_assert_eq!(b.len(), op.encoded_len());
            prop_assert_eq!(Op::decode(&b).unwrap(), op);
        }

        #[test]
        fn results_round_trip(r in result()) {
            let b = r.to_bytes();
            prop_assert_eq!(b.len(), r.encoded_len());
            prop_assert_eq!(OpResult::decode(&b).unwrap(), r);
        }

        #[test]
        fn truncations_are_errors(op in op(), cut in any::<prop::sample::Index>()) {
            let b = op.to_bytes().unwrap();
            let n = cut.index(b.len());
            let r = Op::decode(&b[..n]);
            prop_assert!(matches!(r, Err(Error::Malformed { .. })), "{:?}", r);
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Op::decode(&b);
            let _ = OpResult::decode(&b);
        }
    }

    #[test]
    fn limits_are_enforced_both_ways() {
        let big = Op::Put {
            key: Bytes::from(vec![0; MAX_KEY_LEN + 1]),
            value: Bytes::new(),
        };
        assert!(matches!(
            big.to_bytes(),
            Err(Error::TooLarge { what: "key", .. })
        ));
        let mut raw = vec![GET];
        raw.extend_from_slice(&((MAX_KEY_LEN + 1) as u16).to_le_bytes());
        raw.extend(vec![0; MAX_KEY_LEN + 1]);
        assert!(matches!(Op::decode(&raw), Err(Error::Malformed { .. })));
        let mut trailing = Op::Get {
            key: Bytes::from_static(b"k"),
        }
        .to_bytes()
        .unwrap();
        trailing.push(0);
        assert!(matches!(
            Op::decode(&trailing),
            Err(Error::Malformed { .. })
        ));
    }
}
