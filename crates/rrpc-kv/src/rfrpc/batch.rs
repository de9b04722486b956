//! The batch format of paper §4.1 (Fig. 6), sans-IO.
//!
//! ```text
//!   0        head word: status bit 63 | payload size bits 32..63 (31 bits)
//!                       | auxiliary bits 16..32 | batch sequence bits 0..16
//!   8        entries: size u32 LE | entry bytes, repeated
//!   8+size   zero padding to a multiple of 8
//!   8+pad    tail word: equal to the head word
//! ```
//!
//! The paper gives a request batch a status bit at head and tail and a
//! result batch one at the head only ("the client can check whether all
//! the sent requests are processed by counting the number of results"). We
//! put the tail on both: a READ is not guaranteed to observe the head word
//! last, and the tail costs 8 bytes. The tail repeats the whole head word
//! (status, size and a 16-bit batch sequence number), so a tail left over
//! from an earlier batch at the same offset is not mistaken for this one's.
//! The receiver of a request batch clears the head word after consuming it
//! (§4.1 "the server will clear its local buffer").
//!
//! The auxiliary field is the batch size the client asks the server to use
//! in a request batch (§4.2, written by [`crate::rfrpc::tune::BatchSizeTuner`];
//! [`crate::rfrpc::RfClient::call_batch`] puts the entry count there), and
//! the number of results in a result batch (the paper puts the processing
//! time there; ours already travels in the response frame's info word).
//!
//! [`parse`] takes peer-written bytes: it never panics, checks every entry
//! size against the buffer, and bounds the number of entries.

use std::ops::Range;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::rfrpc::wire::pad8;

/// Bytes of the head word.
pub const HEAD: usize = 8;
/// Bytes of the tail word.
pub const TAIL: usize = 8;
/// Largest payload (entries with their size words) a batch may carry (31 bits).
pub const MAX_PAYLOAD: usize = (1 << 31) - 1;
/// Paper default of the batch size limit L (§4.1: "typically set to 2048 bytes").
pub const DEFAULT_LIMIT: usize = 2048;
/// Paper default of the flush timeout T (§4.1: 5 ms).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5);

const STATUS: u64 = 1 << 63;

fn head_word(seq: u16, aux: u16, payload: usize) -> u64 {
    STATUS | ((payload as u64) << 32) | ((aux as u64) << 16) | seq as u64
}

/// Accumulates entries into one batch (the client's buffering of §4.1).
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    buf: Vec<u8>,
    entries: usize,
    limit: usize,
    max_entries: usize,
}

impl BatchBuilder {
    /// A builder whose payload stays within `limit` bytes (L) and
    /// `max_entries` entries (N). An entry larger than `limit` alone is
    /// refused: the paper falls back to server-reply for those (§4.1
    /// "Large Entry"); send it as a single call.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a zero or over-[`MAX_PAYLOAD`] limit or
    /// zero entries.
    pub fn new(limit: usize, max_entries: usize) -> Result<Self> {
        if limit == 0 || limit > MAX_PAYLOAD || max_entries == 0 {
            return Err(Error::InvalidConfig(format!(
                "batch limit {limit} bytes / {max_entries} entries"
            )));
        }
        let mut buf = Vec::with_capacity(HEAD + limit + TAIL + 8);
        buf.extend_from_slice(&[0; HEAD]);
        Ok(BatchBuilder {
            buf,
            entries: 0,
            limit,
            max_entries,
        })
    }

    /// Entries so far.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether no entry was pushed.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Payload bytes so far.
    pub fn payload_len(&self) -> usize {
        self.buf.len() - HEAD
    }

    /// The size limit L.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The entry limit N.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Changes the entry limit N (a tuner's choice); applies to the batch
    /// being built, which may then be full at once.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for 0.
    pub fn set_max_entries(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::InvalidConfig("batch of 0 entries".into()));
        }
        self.max_entries = n;
        Ok(())
    }

    /// Whether the batch must be sent: N entries buffered (§4.1 condition 1).
    pub fn is_full(&self) -> bool {
        self.entries >= self.max_entries
    }

    /// Appends `entry` if it fits; `Ok(false)` when the batch is full (send
    /// it and start another).
    ///
    /// # Errors
    /// [`Error::TooLarge`] for an entry that would not fit even an empty batch.
    pub fn push(&mut self, entry: &[u8]) -> Result<bool> {
        let need = 4 + entry.len();
        if need > self.limit {
            return Err(Error::TooLarge {
                what: "batch entry",
                len: entry.len(),
                limit: self.limit.saturating_sub(4),
            });
        }
        if self.is_full() || self.payload_len() + need > self.limit {
            return Ok(false);
        }
        self.buf
            .extend_from_slice(&(entry.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(entry);
        self.entries += 1;
        Ok(true)
    }

    /// The encoded batch (head, entries, padding, tail); the builder is
    /// emptied for the next batch.
    pub fn finish(&mut self, seq: u16, aux: u16) -> Vec<u8> {
        let payload = self.payload_len();
        let w = head_word(seq, aux, payload);
        let mut out = std::mem::replace(&mut self.buf, Vec::with_capacity(HEAD + self.limit + 16));
        self.buf.extend_from_slice(&[0; HEAD]);
        self.entries = 0;
        out[..HEAD].copy_from_slice(&w.to_le_bytes());
        out.resize(HEAD + pad8(payload), 0);
        out.extend_from_slice(&w.to_le_bytes());
        out
    }
}

/// Encodes `entries` as one batch (no limits but [`MAX_PAYLOAD`]).
///
/// # Errors
/// [`Error::TooLarge`] when the payload would exceed [`MAX_PAYLOAD`].
pub fn encode<'a>(
    seq: u16,
    aux: u16,
    entries: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<u8>> {
    let mut out = vec![0u8; HEAD];
    for e in entries {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
        if out.len() - HEAD > MAX_PAYLOAD {
            return Err(Error::TooLarge {
                what: "batch",
                len: out.len() - HEAD,
                limit: MAX_PAYLOAD,
            });
        }
    }
    let payload = out.len() - HEAD;
    let w = head_word(seq, aux, payload);
    out[..HEAD].copy_from_slice(&w.to_le_bytes());
    out.resize(HEAD + pad8(payload), 0);
    out.extend_from_slice(&w.to_le_bytes());
    Ok(out)
}

/// A complete batch found by [`parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The batch sequence number.
    pub seq: u16,
    /// The auxiliary field.
    pub aux: u16,
    /// Each entry's bytes as a range of the parsed buffer.
    pub entries: Vec<Range<usize>>,
    /// Bytes the whole batch occupies (head to tail inclusive).
    pub len: usize,
}

/// What a batch buffer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchState {
    /// The head status bit is clear: nothing was sent.
    Empty,
    /// The head is set but the tail is not there (yet): a write in flight.
    Incomplete,
    /// A complete batch.
    Complete(Batch),
}

/// Reads the batch at the start of `buf`, accepting at most `max_entries`
/// entries.
///
/// # Errors
/// [`Error::Malformed`] when a complete batch (head and tail agree) does
/// not parse: a size that does not fit the buffer, an entry running past
/// the payload, more than `max_entries` entries.
pub fn parse(buf: &[u8], max_entries: usize) -> Result<BatchState> {
    let bad = |detail: String| Error::Malformed {
        what: "batch",
        detail,
    };
    let Some(h) = buf.get(..HEAD) else {
        return Err(bad(format!("buffer of {} bytes", buf.len())));
    };
    let w = u64::from_le_bytes(h.try_into().unwrap_or([0; 8]));
    if w & STATUS == 0 {
        return Ok(BatchState::Empty);
    }
    let payload = ((w >> 32) & 0x7fff_ffff) as usize;
    let total = HEAD + pad8(payload) + TAIL;
    if total > buf.len() {
        return Err(bad(format!(
            "payload of {payload} bytes in a {}-byte buffer",
            buf.len()
        )));
    }
    let tail = u64::from_le_bytes(buf[total - TAIL..total].try_into().unwrap_or([0; 8]));
    if tail != w {
        return Ok(BatchState::Incomplete);
    }
    let mut entries = Vec::new();
    let mut at = HEAD;
    let end = HEAD + payload;
    while at < end {
        if entries.len() >= max_entries {
            return Err(bad(format!("more than {max_entries} entries")));
        }
        let Some(sz) = buf.get(at..at + 4).filter(|_| at + 4 <= end) else {
            return Err(bad(format!("entry size word cut at offset {at}")));
        };
        let n = u32::from_le_bytes(sz.try_into().unwrap_or([0; 4])) as usize;
        let start = at + 4;
        let stop = start.checked_add(n).filter(|&s| s <= end).ok_or_else(|| {
            bad(format!(
                "entry of {n} bytes at offset {start} runs past the payload"
            ))
        })?;
        entries.push(start..stop);
        at = stop;
    }
    Ok(BatchState::Complete(Batch {
        seq: w as u16,
        aux: (w >> 16) as u16,
        entries,
        len: total,
    }))
}

/// When to send a buffered batch (§4.1): N entries, L bytes, or T elapsed
/// since the first entry. Sans-IO: the caller passes the time.
#[derive(Debug, Clone)]
pub struct FlushPolicy {
    timeout: Duration,
    first_at: Option<Duration>,
}

impl FlushPolicy {
    /// A policy with the flush timeout `timeout` (paper default
    /// [`DEFAULT_TIMEOUT`]).
    pub fn new(timeout: Duration) -> Self {
        FlushPolicy {
            timeout,
            first_at: None,
        }
    }

    /// An entry was buffered at virtual time `now`.
    pub fn handle_push(&mut self, now: Duration) {
        self.first_at.get_or_insert(now);
    }

    /// The batch was sent.
    pub fn handle_flush(&mut self) {
        self.first_at = None;
    }

    /// Whether the buffered entries must be sent at `now` given the builder.
    #[must_use]
    pub fn poll_flush(&self, now: Duration, b: &BatchBuilder) -> bool {
        if b.is_empty() {
            return false;
        }
        b.is_full()
            || self
                .first_at
                .is_some_and(|t| now.saturating_sub(t) >= self.timeout)
    }

    /// When [`Self::poll_flush`] becomes true without further pushes.
    pub fn poll_deadline(&self) -> Option<Duration> {
        self.first_at.map(|t| t + self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entries() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20)
    }

    proptest! {
        #[test]
        fn batches_round_trip(es in entries(), seq: u16, aux: u16, slack in 0usize..32) {
            let mut b = encode(seq, aux, es.iter().map(|e| &e[..])).unwrap();
            let len = b.len();
            b.resize(len + slack, 0xab);
            match parse(&b, 1000).unwrap() {
                BatchState::Complete(got) => {
                    prop_assert_eq!(got.seq, seq);
                    prop_assert_eq!(got.aux, aux);
                    prop_assert_eq!(got.len, len);
                    let back: Vec<Vec<u8>> = got.entries.iter().map(|r| b[r.clone()].to_vec()).collect();
                    prop_assert_eq!(back, es);
                }
                s => prop_assert!(false, "{:?}", s),
            }
        }

        /// The paper's guarantee: a batch written in address order and cut
        /// anywhere before its last byte, over the previous batch or a
        /// cleared buffer, is never taken as complete unless the buffer
        /// already holds the whole batch.
        #[test]
        fn torn_write_is_never_accepted_as_complete(
            old in entries(), new in entries(), seq in 1u16.., cut in any::<prop::sample::Index>(), cleared: bool,
        ) {
            let mut buf = if cleared {
                vec![0u8; 2048]
            } else {
                let mut o = encode(seq - 1, 0, old.iter().map(|e| &e[..])).unwrap();
                o.resize(2048, 0);
                o
            };
            let f = encode(seq, 7, new.iter().map(|e| &e[..])).unwrap();
            let cut = cut.index(f.len());
            buf[..cut].copy_from_slice(&f[..cut]);
            // The old batch, already consumed, is complete under its own
            // sequence number. The new one is complete only when the buffer
            // already holds every byte of it (the unwritten rest happened
            // to equal what was there).
            if let Ok(BatchState::Complete(b)) = parse(&buf, 1000)
                && b.seq == seq
            {
                prop_assert_eq!(&buf[..f.len()], &f[..]);
            }
            // ... and the complete write is.
            buf[..f.len()].copy_from_slice(&f);
            let complete = matches!(parse(&buf, 1000), Ok(BatchState::Complete(_)));
            prop_assert!(complete);
        }

        #[test]
        fn builder_respects_limits(es in entries(), limit in 48usize..256, n in 1usize..8) {
            let mut b = BatchBuilder::new(limit, n).unwrap();
            let mut batches = Vec::new();
            let mut seq = 0u16;
            for e in &es {
                if !b.push(e).unwrap() {
                    batches.push(b.finish(seq, 0));
                    seq += 1;
                    prop_assert!(b.push(e).unwrap());
                }
            }
            if !b.is_empty() {
                batches.push(b.finish(seq, 0));
            }
            let mut back = Vec::new();
            for bt in &batches {
                prop_assert!(bt.len() <= HEAD + limit + 8 + TAIL);
                let BatchState::Complete(p) = parse(bt, n).unwrap() else { panic!() };
                prop_assert!(p.entries.len() <= n);
                back.extend(p.entries.iter().map(|r| bt[r.clone()].to_vec()));
            }
            prop_assert_eq!(back, es);
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200), n in 0usize..10) {
            let _ = parse(&b, n);
        }
    }

    #[test]
    fn bad_entry_sizes_are_malformed() {
        let mut b = encode(1, 0, [&b"abc"[..]]).unwrap();
        b[HEAD..HEAD + 4].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(parse(&b, 10), Err(Error::Malformed { .. })));
        let b = encode(1, 0, [&b"a"[..], b"b", b"c"]).unwrap();
        assert!(matches!(parse(&b, 2), Err(Error::Malformed { .. })));
    }

    #[test]
    fn flush_policy_on_virtual_clock() {
        let mut b = BatchBuilder::new(DEFAULT_LIMIT, 4).unwrap();
        let mut p = FlushPolicy::new(DEFAULT_TIMEOUT);
        let t0 = Duration::from_millis(100);
        assert!(!p.poll_flush(t0, &b));
        b.push(b"x").unwrap();
        p.handle_push(t0);
        assert!(!p.poll_flush(t0 + Duration::from_millis(4), &b));
        assert!(p.poll_flush(t0 + DEFAULT_TIMEOUT, &b));
        assert_eq!(p.poll_deadline(), Some(t0 + DEFAULT_TIMEOUT));
        for _ in 0..3 {
            b.push(b"y").unwrap();
        }
        assert!(p.poll_flush(t0, &b));
        b.finish(0, 0);
        p.handle_flush();
        assert!(!p.poll_flush(t0 + Duration::from_secs(1), &b));
    }
}
