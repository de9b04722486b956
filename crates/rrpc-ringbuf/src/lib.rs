//! # rrpc-ringbuf — the RB² distributed ring buffer
//!
//! A one-directional channel (RB² §III-B): the sender keeps `RB_S`, a local
//! registered copy of the ring, and WRITEs slots into the receiver's `RB_R`.
//! Both are big circular arrays of `N` equal slots, a multiple of 64 bytes
//! (slot-to-slot layout, §III-A C5); a message spans contiguous slots and is
//! never split across the array end (a gap marker fills the rest).
//!
//! ## Pointers (§III-B, Fig. 2)
//! * sender: `tail` (next slot to write), `esc_tail` (slots before it have
//!   been transmitted), `synced_tail` (last tail sent to the receiver),
//!   `local_head` (the receiver's head as last pushed);
//! * receiver: `head` (next slot to read), `synced_head` (last head pushed),
//!   `local_tail` (the sender's tail as last written to us).
//!
//! ## Synchronization and thresholds (§IV-A, §IV-B, Algorithm 1)
//! * **write twice**: slots first, then the tail into `local_tail`. What
//!   that relies on, and the end stamp that makes a late placement a wait
//!   instead of a wrong message: [`proto`] docs, "Placement order".
//! * **slot transmission** every `beta` messages (synchronization-ahead),
//!   **pointer advancement** every `alpha` messages, and the **elastic
//!   threshold**: while the previous tail WRITE has not completed, pointer
//!   advancement is deferred and slot transmission goes on.
//! * **lazy push**: the receiver WRITEs its head into `local_head` every
//!   `gamma` messages, and whenever it finds the ring empty with an unpushed
//!   head, so a sender never waits on a held-back push.
//! * [`RingTx::flush`] pushes whatever is batched; a full ring flushes too.
//!
//! The pointer logic is the sans-IO [`proto`] module; [`LocalRing`],
//! [`RingTx`] and [`RingRx`] drive it on an `rrpc-core` queue pair. Every
//! peer-written value (headers, end stamps, gap markers, pointer records) is
//! validated: a bad pointer closes the channel with [`Error::Corrupt`] at
//! once, a message or pointer record that stays inconsistent for
//! [`RingConfig::placement_timeout`] (1 s) closes it then (a pointer read
//! half-written is a wait: [`proto`] docs, "Pointer records").
//!
//! ## Handshake
//! [`LocalRing::add_to_offer`] puts the slot size and count and the
//! switches both sides must share ([`RingConfig::cache_align`],
//! [`RingConfig::tail_with_imm`]) into the rrpc-core handshake, as the
//! ring's own section ([`RingParams`], [`proto::params`]) under the ring
//! region's role; [`LocalRing::connect`] refuses a peer that differs, or whose
//! section it cannot read, with [`Error::Incompatible`] naming both values.
//!
//! ## EVENT mode and the receive-repost rule
//! With [`RingConfig::tail_with_imm`] every tail WRITE is a
//! `WRITE_WITH_IMM`: it consumes one receive posted on the receiver's queue
//! pair and adds a completion to its receive CQ, which makes the CQ's
//! channel fd readable if it was armed with `req_notify()`. The receiver
//! posts the pool once ([`RingRx::post_receives`], at most the queue pair's
//! `recv_depth`) and then follows one rule: **every receive completion that
//! is polled is answered by exactly one new receive**, whoever polls it.
//! [`RingRx::try_recv`] does this itself ([`RingRx::replenish`]) whenever it
//! sees a new tail, so a receiver that keeps reading never runs dry however
//! long the stream; a poller that polls the receive CQ itself (to clear it
//! before re-arming) must repost one receive per completion too. Arm, then
//! recheck the ring before sleeping.
//!
//! If a burst still outruns the pool (the receiver was not scheduled), the
//! shm fabric refuses the `WRITE_WITH_IMM` with `ReceiverNotReady`; the
//! sender then writes that tail with a plain WRITE ([`RingTx::imm_fallbacks`]
//! counts them) instead of failing: the receiver has unpolled receive
//! completions, so it is awake or about to wake and will see the tail. On
//! verbs the NIC's RNR retry plays that role; the repost rule is what keeps
//! it from being needed.
//!
//! ## Rings that size themselves
//! With [`RingConfig::min_ring_size`] below [`RingConfig::ring_size`] the
//! sender starts small, grows its ring before a message that needs it, and
//! shrinks it when messages get smaller or the connection goes quiet
//! ([`RingTx::maintain`]), switching in-band with a resize marker ([`proto`]
//! docs, "Rings that size themselves"; the policy is [`proto::sizing`]).
//! RR-Compound §V-B leaves this to future work. A quiet ring goes below its
//! minimum, to [`RingConfig::idle_ring_size`] (one page, say), and grows
//! back with the next message. On shm the unused end of both arrays goes
//! back to the system after a shrink, and the receiver lets go of its copy
//! buffer ([`RingRx::buffered_bytes`]); a verbs registration pins its
//! memory, so there a ring keeps its footprint (only the part in use stays
//! warm in the cache).
//!
//! Memory (§IV-C): zero-copy reserve/commit on the sender; on the receiver
//! one copy of each message out of `RB_R` (which the peer can write at any
//! time) into a reused buffer that a [`ReadGuard`] lends; huge pages
//! through rrpc-core's regions; cache-line aligned slots; NUMA-aware
//! allocation: both regions of a ring are bound to the NUMA node of the
//! verbs device, or to the one [`RingConfig::numa_node`] names
//! ([`rrpc_core::numa`]).
//!
//! ## Example
//! ```
//! use rrpc_core::conn::{self, HandshakeConfig, Offer};
//! use rrpc_core::{FabricAddr, Fabric, QpConfig};
//! use rrpc_ringbuf::{Error, LocalRing, RingConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("rrpc-rb-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let ep = FabricAddr::parse(&format!("shm://{}/s.sock", dir.display()))?;
//! let cfg = RingConfig::builder().ring_size(1 << 20).build()?;
//! let fabric = Fabric::shm();
//! let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
//! let (f2, c2) = (fabric.clone(), cfg.clone());
//! let server = std::thread::spawn(move || {
//!     let local = LocalRing::new(&f2, &c2).unwrap();
//!     let inc = listener.accept().unwrap();
//!     let c = inc.accept(f2.create_qp(&QpConfig::default()).unwrap(),
//!                        local.add_to_offer(Offer::new())).unwrap();
//!     let (_tx, mut rx) = local.connect(&c).unwrap();
//!     loop {
//!         match rx.try_recv() {
//!             Ok(m) => return m.to_vec(),
//!             Err(Error::WouldBlock) => std::hint::spin_loop(),
//!             Err(e) => panic!("{e}"),
//!         }
//!     }
//! });
//! let local = LocalRing::new(&fabric, &cfg)?;
//! let c = conn::connect(&ep, fabric.create_qp(&QpConfig::default())?,
//!                       local.add_to_offer(Offer::new()), &HandshakeConfig::default())?;
//! let (mut tx, _rx) = local.connect(&c)?;
//! let mut g = tx.try_reserve(5)?;   // zero-copy: encode straight into RB_S
//! g.copy_from_slice(b"hello");
//! g.commit()?;
//! tx.flush()?;                      // end of burst: make it visible now
//! assert_eq!(server.join().unwrap(), b"hello");
//! # Ok(()) }
//! ```

// `unsafe` (denied by the workspace) lives in `mem` (the staging ring's views, the copy out of
// the receive ring) and at its one audited caller (`LocalRing::new` takes the staging ring).

mod config;
mod driver;
mod error;
mod mem;
pub mod proto;

pub use config::{
    CACHE_LINE, DEFAULT_PLACEMENT_TIMEOUT, DEFAULT_SHRINK_AFTER, DEFAULT_SQ_DEPTH, MAX_RING_SIZE,
    MAX_SIZE_RATIO, MAX_SLOT_SIZE, MAX_THRESHOLD, MIN_SLOT_COUNT, RingConfig, RingConfigBuilder,
};
pub use driver::{
    LOCAL_HEAD_OFFSET, LOCAL_SLEEP_OFFSET, LOCAL_TAIL_OFFSET, LocalRing, RING_OFFSET, ROLE_RING,
    ReadGuard, RingRx, RingTx, RxDoorbell, RxWatch, TxWatch, WriteGuard,
};
pub use error::{Corruption, Error, StampOf, Unplaced};
pub use proto::params::RingParams;
