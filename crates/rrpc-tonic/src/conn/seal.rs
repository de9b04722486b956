//! Ring encryption: every ring message sealed with an AEAD, when asked
//! ([`crate::RingEncryption::Required`]).
//!
//! Sans-IO: this module seals and opens bytes; [`pipe`] puts it under a
//! message pipe, so both data paths (the fast path's frames and the HTTP/2
//! path's byte stream) are covered in one place.
//!
//! - **Keys**: one per direction, 32 bytes each, exported from the TLS
//!   session the connection's negotiation ran in (RFC 8446 §7.5, labels
//!   [`KEY_LABEL_C2S`] and [`KEY_LABEL_S2C`]); they never cross the wire.
//! - **Cipher**: AES-256-GCM, or ChaCha20-Poly1305 on a CPU without AES
//!   instructions ([`RingCipher::preferred`]); the client proposes, the
//!   server takes the proposal (both ends always have both). `ring`'s AEAD,
//!   the provider rustls already uses here: no cipher written by hand.
//! - **Nonce**: the message's sequence number in its direction (4 zero
//!   bytes, then the number big-endian), counted by both ends. A replayed,
//!   reordered, altered or truncated message, or one after a message that
//!   was dropped, fails to open, and so does every message after it: the
//!   opener is spent at the first failure.
//! - **Layout**: the ciphertext, then the 16-byte tag ([`TAG_LEN`]), which
//!   counts against the ring's message limit.

use std::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{
    AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey,
};

pub(crate) mod pipe;

/// The tag's length: what sealing adds to each message.
pub const TAG_LEN: usize = 16;
/// A direction key's length.
pub(crate) const KEY_LEN: usize = 32;
/// The exporter label of the client-to-server key.
pub(crate) const KEY_LABEL_C2S: &[u8] = b"EXPORTER-rrpc-ring-key c2s";
/// The exporter label of the server-to-client key.
pub(crate) const KEY_LABEL_S2C: &[u8] = b"EXPORTER-rrpc-ring-key s2c";

/// The AEAD ring messages are sealed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingCipher {
    /// AES-256-GCM (when the CPU has AES instructions).
    Aes256Gcm,
    /// ChaCha20-Poly1305 (without them: faster in software).
    ChaCha20Poly1305,
}

impl RingCipher {
    /// AES-256-GCM when this CPU has AES and carry-less multiply
    /// instructions, else ChaCha20-Poly1305.
    pub fn preferred() -> Self {
        if cpu_has_aes() {
            RingCipher::Aes256Gcm
        } else {
            RingCipher::ChaCha20Poly1305
        }
    }

    /// Its wire id (in the ticket exchange).
    pub(crate) fn id(self) -> u8 {
        match self {
            RingCipher::Aes256Gcm => 1,
            RingCipher::ChaCha20Poly1305 => 2,
        }
    }

    /// The cipher of a wire id.
    pub(crate) fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(RingCipher::Aes256Gcm),
            2 => Some(RingCipher::ChaCha20Poly1305),
            _ => None,
        }
    }

    fn algorithm(self) -> &'static ring::aead::Algorithm {
        match self {
            RingCipher::Aes256Gcm => &AES_256_GCM,
            RingCipher::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        }
    }
}

impl std::fmt::Display for RingCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingCipher::Aes256Gcm => "AES-256-GCM",
            RingCipher::ChaCha20Poly1305 => "ChaCha20-Poly1305",
        })
    }
}

/// Whether this CPU has AES instructions (and, on x86, the carry-less
/// multiply GCM needs).
pub fn cpu_has_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Both direction keys of one connection, as exported from its TLS
/// session. Never printed.
#[derive(Clone)]
pub(crate) struct RingSecrets {
    pub(crate) c2s: [u8; KEY_LEN],
    pub(crate) s2c: [u8; KEY_LEN],
}

impl std::fmt::Debug for RingSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingSecrets(..)")
    }
}

/// Which end of the connection this is (which key seals, which opens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

impl RingSecrets {
    /// The sealer and the opener of `role`'s end.
    pub(crate) fn split(&self, role: Role, cipher: RingCipher) -> (Sealer, Opener) {
        let (out, inn) = match role {
            Role::Client => (&self.c2s, &self.s2c),
            Role::Server => (&self.s2c, &self.c2s),
        };
        (Sealer::new(cipher, out), Opener::new(cipher, inn))
    }
}

/// Why a sealed message was refused. The connection is failed with it
/// (`tonic::Code::DataLoss` for its calls), and no byte of the message is
/// delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Shorter than a tag: truncated.
    #[error("sealed ring message #{seq} of {len} bytes is shorter than its tag")]
    Truncated {
        /// The sequence number it should have had.
        seq: u64,
        /// Its length.
        len: usize,
    },
    /// The tag did not verify under the expected sequence number: the
    /// message was altered, replayed, reordered or truncated, a message
    /// before it was lost, or it was sealed with another key.
    #[error(
        "sealed ring message #{seq} failed authentication (altered, replayed, reordered, \
         truncated, or a message before it lost)"
    )]
    Forged {
        /// The sequence number it should have had.
        seq: u64,
    },
    /// A message after one that failed: the opener opens nothing more.
    #[error("the ring's opener is spent: an earlier message failed authentication")]
    Spent,
}

fn key(cipher: RingCipher, k: &[u8; KEY_LEN]) -> LessSafeKey {
    // Both algorithms take 32-byte keys: cannot fail.
    LessSafeKey::new(UnboundKey::new(cipher.algorithm(), k).expect("a 32-byte key"))
}

fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[NONCE_LEN - 8..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Seals one direction's messages. Shared (`&self`): the sequence number
/// is taken inside the ring's send step, under the ring's lock, so the
/// numbers follow the order the messages are published in.
pub(crate) struct Sealer {
    key: LessSafeKey,
    next: AtomicU64,
    cipher: RingCipher,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("cipher", &self.cipher)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    pub(crate) fn new(cipher: RingCipher, k: &[u8; KEY_LEN]) -> Self {
        Sealer {
            key: key(cipher, k),
            next: AtomicU64::new(0),
            cipher,
        }
    }

    /// Seals `msg` in place: its first `msg.len() - TAG_LEN` bytes are the
    /// plaintext, its last [`TAG_LEN`] get the tag. Takes the next
    /// sequence number.
    ///
    /// # Panics
    /// If `msg` is shorter than a tag (the pipe reserves room for it).
    pub(crate) fn seal(&self, msg: &mut [u8]) {
        let n = msg.len() - TAG_LEN;
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (body, tag) = msg.split_at_mut(n);
        // Fails only past the algorithm's length limit (64 GiB for
        // AES-GCM), far above any ring message.
        let t: Tag = self
            .key
            .seal_in_place_separate_tag(nonce(seq), Aad::empty(), body)
            .expect("a ring message is within the AEAD's limit");
        tag.copy_from_slice(t.as_ref());
    }
}

/// Opens one direction's messages, in order.
pub(crate) struct Opener {
    key: LessSafeKey,
    next: u64,
    spent: bool,
    cipher: RingCipher,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("cipher", &self.cipher)
            .field("next", &self.next)
            .field("spent", &self.spent)
            .finish_non_exhaustive()
    }
}

impl Opener {
    pub(crate) fn new(cipher: RingCipher, k: &[u8; KEY_LEN]) -> Self {
        Opener {
            key: key(cipher, k),
            next: 0,
            spent: false,
            cipher,
        }
    }

    /// Opens `msg` (ciphertext and tag) in place: its plaintext, the first
    /// `msg.len() - TAG_LEN` bytes. `msg` must be a private copy, never
    /// memory the peer can still write (a peer racing the buffer must not
    /// change bytes after they were authenticated). On failure `msg` holds
    /// no plaintext worth reading, and every later call fails
    /// ([`OpenError::Spent`]).
    pub(crate) fn open<'m>(&mut self, msg: &'m mut [u8]) -> Result<&'m [u8], OpenError> {
        if self.spent {
            return Err(OpenError::Spent);
        }
        let seq = self.next;
        if msg.len() < TAG_LEN {
            self.spent = true;
            return Err(OpenError::Truncated {
                seq,
                len: msg.len(),
            });
        }
        let opened = self
            .key
            .open_in_place(nonce(seq), Aad::empty(), &mut *msg)
            .map(|plain| plain.len());
        match opened {
            Ok(n) => {
                self.next += 1;
                Ok(&msg[..n])
            }
            Err(_) => {
                self.spent = true;
                // `ring` leaves unspecified bytes behind: none of them leave.
                msg.fill(0);
                Err(OpenError::Forged { seq })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secrets() -> RingSecrets {
        RingSecrets {
            c2s: [1; KEY_LEN],
            s2c: [2; KEY_LEN],
        }
    }

    fn sealed(s: &Sealer, plain: &[u8]) -> Vec<u8> {
        let mut m = plain.to_vec();
        m.extend([0u8; TAG_LEN]);
        s.seal(&mut m);
        m
    }

    const BOTH: [RingCipher; 2] = [RingCipher::Aes256Gcm, RingCipher::ChaCha20Poly1305];

    #[test]
    fn in_order_messages_open_both_ways() {
        for c in BOTH {
            let (ctx, mut crx) = secrets().split(Role::Client, c);
            let (stx, mut srx) = secrets().split(Role::Server, c);
            for i in 0..5u8 {
                let mut m = sealed(&ctx, &[i; 40]);
                assert_ne!(&m[..40], &[i; 40][..], "{c}: the ring sees ciphertext");
                assert_eq!(srx.open(&mut m).unwrap(), &[i; 40][..]);
                let mut r = sealed(&stx, &[i + 100; 3]);
                assert_eq!(crx.open(&mut r).unwrap(), &[i + 100; 3][..]);
            }
            // The empty message too (a tag alone).
            let mut e = sealed(&ctx, &[]);
            assert_eq!(srx.open(&mut e).unwrap(), &[] as &[u8]);
        }
    }

    #[test]
    fn replay_is_refused() {
        let (tx, mut rx) = (secrets().split(Role::Client, RingCipher::Aes256Gcm).0, {
            secrets().split(Role::Server, RingCipher::Aes256Gcm).1
        });
        let m = sealed(&tx, b"pay 10");
        assert!(rx.open(&mut m.clone()).is_ok());
        assert_eq!(rx.open(&mut m.clone()), Err(OpenError::Forged { seq: 1 }));
        // Spent: even a good next message is refused.
        let mut next = sealed(&tx, b"x");
        assert_eq!(rx.open(&mut next), Err(OpenError::Spent));
    }

    #[test]
    fn reorder_and_a_dropped_message_are_refused() {
        let tx = secrets().split(Role::Client, RingCipher::Aes256Gcm).0;
        let (a, b) = (sealed(&tx, b"first"), sealed(&tx, b"second"));
        let mut rx = secrets().split(Role::Server, RingCipher::Aes256Gcm).1;
        assert_eq!(
            rx.open(&mut b.clone()),
            Err(OpenError::Forged { seq: 0 }),
            "second before first"
        );
        // Dropped: the first never arrives, the second is refused.
        let mut rx = secrets().split(Role::Server, RingCipher::Aes256Gcm).1;
        let _ = a;
        assert!(rx.open(&mut b.clone()).is_err());
    }

    #[test]
    fn truncation_is_refused() {
        for c in BOTH {
            let tx = secrets().split(Role::Client, c).0;
            let m = sealed(&tx, b"a whole message");
            for cut in [1, TAG_LEN, m.len() - 1] {
                let mut rx = secrets().split(Role::Server, c).1;
                let mut short = m[..m.len() - cut].to_vec();
                assert!(rx.open(&mut short).is_err(), "{c}: cut {cut}");
            }
            let mut rx = secrets().split(Role::Server, c).1;
            assert_eq!(
                rx.open(&mut [0u8; 3]),
                Err(OpenError::Truncated { seq: 0, len: 3 })
            );
        }
    }

    #[test]
    fn the_wrong_direction_key_is_refused() {
        for c in BOTH {
            // A client's own message reflected back to it.
            let (tx, mut rx) = secrets().split(Role::Client, c);
            let mut m = sealed(&tx, b"reflected");
            assert_eq!(rx.open(&mut m), Err(OpenError::Forged { seq: 0 }));
            // The other cipher under the right key.
            let other = if c == RingCipher::Aes256Gcm {
                RingCipher::ChaCha20Poly1305
            } else {
                RingCipher::Aes256Gcm
            };
            let tx = secrets().split(Role::Client, other).0;
            let mut rx = secrets().split(Role::Server, c).1;
            assert!(rx.open(&mut sealed(&tx, b"x")).is_err());
        }
    }

    #[test]
    fn a_failed_open_leaves_no_plaintext() {
        let tx = secrets().split(Role::Client, RingCipher::Aes256Gcm).0;
        let mut m = sealed(&tx, &[0x55; 64]);
        m[3] ^= 1;
        let mut rx = secrets().split(Role::Server, RingCipher::Aes256Gcm).1;
        assert!(rx.open(&mut m).is_err());
        assert!(m.iter().all(|&b| b == 0));
    }

    #[test]
    fn cipher_ids_round_trip() {
        for c in BOTH {
            assert_eq!(RingCipher::from_id(c.id()), Some(c));
        }
        assert_eq!(RingCipher::from_id(0), None);
        assert_eq!(RingCipher::from_id(3), None);
    }

    proptest! {
        /// Any single bit flipped anywhere (ciphertext or tag) is refused,
        /// at any position in the stream.
        #[test]
        fn any_bit_flip_is_refused(
            plain in proptest::collection::vec(any::<u8>(), 0..300),
            before in 0usize..4,
            bit in any::<usize>(),
            chacha in any::<bool>(),
        ) {
            let c = if chacha { RingCipher::ChaCha20Poly1305 } else { RingCipher::Aes256Gcm };
            let tx = secrets().split(Role::Client, c).0;
            let mut rx = secrets().split(Role::Server, c).1;
            for _ in 0..before {
                let mut ok = sealed(&tx, b"earlier");
                prop_assert!(rx.open(&mut ok).is_ok());
            }
            let mut m = sealed(&tx, &plain);
            let bit = bit % (m.len() * 8);
            m[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(rx.open(&mut m), Err(OpenError::Forged { seq: before as u64 }));
        }
    }
}
