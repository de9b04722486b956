//! The driver: executes the sans-IO [`Sender`]/[`Receiver`] actions on an
//! `rrpc-core` queue pair and reads the peer-written words of our regions.
//!
//! # Memory layout
//! Each side allocates two regions in [`LocalRing::new`]:
//! * the **receive region**, granted to the peer under [`ROLE_RING`]:
//!   `local_tail` record at byte 0 (written by the peer's sender),
//!   `local_head` record at byte 64 (written by the peer's receiver, for our
//!   sender), the *sleep word* at byte 128 (written by the peer's receiver:
//!   ring its doorbell, [`crate::proto::doorbell`]), the two records each a
//!   16-byte pointer record (value and check word, `proto`
//!   docs, "Pointer records") on its own cache line, and `RB_R` at byte [`RING_OFFSET`] (plus 8 bytes when
//!   cache-line alignment is switched off for the ablation);
//! * the **staging region**, never granted: `RB_S` at the same offset, then
//!   the source records of tail WRITEs, head pushes, the sleep word and the
//!   doorbell, one cache line each.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rrpc_core::conn::{Connection, Offer, PeerInfo};
use rrpc_core::{Completion, Fabric, Local, QueuePair, Region, RemoteRegion, Status};

use crate::config::RingConfig;
use crate::error::Error;
use crate::mem::{self, Staging};
use crate::proto::doorbell::{Ringer, Sleeper};
use crate::proto::params::{self, RingParams};
use crate::proto::{
    Geometry, MAX_TAIL_INFLIGHT, Message, POINTER_RECORD_LEN, Receiver, Reservation, Sender,
    Transmit, WR_KIND_BELL, WR_KIND_RX, WR_KIND_SLEEP, WR_KIND_TX, WR_SEQ_MASK, pointer_check,
};

/// Role under which the receive region (`RB_R` + pointer words) is granted.
pub const ROLE_RING: u16 = 0x5242;
/// Byte offset of the `local_tail` pointer record in the receive region.
pub const LOCAL_TAIL_OFFSET: usize = 0;
/// Byte offset of the `local_head` pointer record in the receive region.
pub const LOCAL_HEAD_OFFSET: usize = 64;
/// Byte offset of the sleep word in the receive region: written by the
/// peer's receiver before it sleeps, read by our sender after each tail
/// ([`crate::proto::doorbell`]).
pub const LOCAL_SLEEP_OFFSET: usize = 128;
/// Byte offset of the ring array in the receive and staging regions.
pub const RING_OFFSET: usize = 4096;
const UNALIGNED_PAD: usize = 8;

const HEAD_SRC: usize = MAX_TAIL_INFLIGHT;
/// Source of the sleep word's WRITE.
const SLEEP_SRC: usize = HEAD_SRC + 1;
/// Source of the doorbell (a copy of the last tail record).
const BELL_SRC: usize = HEAD_SRC + 2;
/// How long announcing a sleep waits for its WRITE to complete, and a
/// doorbell for the previous one: an RC WRITE completes within a round
/// trip. Past this (a link down, a peer not acknowledging) the caller goes
/// on without it: the poller's rescans cover the connection, and a dead
/// peer never holds a polling thread (shared by other connections) or a
/// writer for longer.
const DOORBELL_WAIT: std::time::Duration = std::time::Duration::from_micros(100);

/// This side's half of a connection before the handshake: its receive ring
/// (granted to the peer) and its send staging ring.
#[derive(Debug)]
pub struct LocalRing {
    cfg: Arc<RingConfig>,
    rx_region: Arc<Region>,
    tx_region: Arc<Region>,
    /// `RB_S` in `tx_region`, for the [`RingTx`] to come.
    staging: Staging,
    ring_off: usize,
    ctrl_off: usize,
    /// The NUMA node the regions were bound to.
    node: Option<u32>,
}

impl LocalRing {
    /// Allocates the receive region (`RB_R` + control words) and the staging
    /// region (`RB_S` + source words). Huge pages are used when the fabric
    /// has them and `cfg.huge_pages()` is on.
    ///
    /// # Errors
    /// [`Error::Core`] if allocation fails.
    pub fn new(fabric: &Fabric, cfg: &RingConfig) -> Result<LocalRing, Error> {
        let fabric = if cfg.huge_pages() {
            fabric.clone()
        } else {
            fabric.clone().without_huge_pages()
        };
        let (rx_len, tx_len) = Self::region_lens(cfg);
        // The narrowest access that works, so a peer can touch no more of our
        // memory than it needs: the peer only WRITEs into our receive ring and
        // its control words; the staging region is the local source of our
        // WRITEs.
        // RB² §IV-C: both arrays in the memory of the NIC's NUMA node (or
        // the one the config names), bound before they are first touched.
        let node = cfg.numa_node().resolve(fabric.numa_node());
        let rx_region = fabric.alloc_region_on(rx_len, rrpc_core::Access::REMOTE_WRITE, node)?;
        let tx_region = fabric.alloc_region_on(tx_len, rrpc_core::Access::LOCAL, node)?;
        Self::in_regions(fabric.kind(), cfg, rx_region, tx_region, node)
    }

    /// The lengths of the receive and the staging region a ring of `cfg`
    /// needs ([`LocalRing::in_regions`]).
    pub fn region_lens(cfg: &RingConfig) -> (usize, usize) {
        let pad = if cfg.cache_align() { 0 } else { UNALIGNED_PAD };
        let ring_off = RING_OFFSET + pad;
        let ctrl_off = (ring_off + cfg.ring_size()).next_multiple_of(4096);
        (ring_off + cfg.ring_size(), ctrl_off + (BELL_SRC + 1) * 64)
    }

    /// A ring in regions made elsewhere (slots of arenas granted ahead,
    /// rrpc-core `conn::mux`), of at least [`LocalRing::region_lens`]
    /// bytes: `rx_region` the peer may write (it is not granted here: the
    /// peer reaches it some other way), `tx_region` never granted. Their
    /// memory may hold an earlier ring's bytes: the pointer records are
    /// reset here. `kind` is the fabric's (whether released pages go back
    /// to the system), `node` their NUMA node, if bound.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for regions shorter than `cfg` needs.
    pub fn in_regions(
        kind: rrpc_core::ProviderKind,
        cfg: &RingConfig,
        rx_region: Arc<Region>,
        tx_region: Arc<Region>,
        node: Option<u32>,
    ) -> Result<LocalRing, Error> {
        Self::in_regions_with(kind, cfg, rx_region, tx_region, node, true)
    }

    /// As [`in_regions`](Self::in_regions), but the pointer records of
    /// `rx_region` are left as they are: they were reset with
    /// [`reset_records`](Self::reset_records) before the peer was told it
    /// may write (a slot granted ahead, rrpc-core `conn::mux`), and the
    /// peer may have written its first messages since.
    ///
    /// # Errors
    /// As [`in_regions`](Self::in_regions).
    pub fn in_regions_as_written(
        kind: rrpc_core::ProviderKind,
        cfg: &RingConfig,
        rx_region: Arc<Region>,
        tx_region: Arc<Region>,
        node: Option<u32>,
    ) -> Result<LocalRing, Error> {
        Self::in_regions_with(kind, cfg, rx_region, tx_region, node, false)
    }

    /// Resets the pointer records of a receive region (`rx_region` of
    /// [`in_regions`](Self::in_regions)) that an earlier ring used: a new
    /// ring starts at pointer 0, with its peer awake. Call it before
    /// telling the peer it may write into the region.
    ///
    /// # Errors
    /// A region shorter than the records.
    pub fn reset_records(rx_region: &Region) -> Result<(), Error> {
        // An earlier ring's sleep word must not read as a peer asleep.
        rx_region.write_at(LOCAL_SLEEP_OFFSET, &[0u8; 8])?;
        // Zeroed memory is no valid record: start both at pointer 0.
        for off in [LOCAL_TAIL_OFFSET, LOCAL_HEAD_OFFSET] {
            store_record(rx_region, off, 0)?;
        }
        Ok(())
    }

    fn in_regions_with(
        kind: rrpc_core::ProviderKind,
        cfg: &RingConfig,
        rx_region: Arc<Region>,
        tx_region: Arc<Region>,
        node: Option<u32>,
        reset: bool,
    ) -> Result<LocalRing, Error> {
        let (rx_len, tx_len) = Self::region_lens(cfg);
        if rx_region.len() < rx_len || tx_region.len() < tx_len {
            return Err(Error::InvalidConfig(format!(
                "ring regions of {} and {} bytes, need {rx_len} and {tx_len}",
                rx_region.len(),
                tx_region.len()
            )));
        }
        let pad = if cfg.cache_align() { 0 } else { UNALIGNED_PAD };
        let ring_off = RING_OFFSET + pad;
        let ctrl_off = (ring_off + cfg.ring_size()).next_multiple_of(4096);
        if reset {
            Self::reset_records(&rx_region)?;
        }
        let ring_len = Geometry::from_config(cfg).ring_bytes();
        #[allow(unsafe_code)]
        // SAFETY: `tx_region` is never granted (`add_to_offer_as` grants
        // `rx_region` only; `in_regions` callers grant it to nobody, per its
        // docs), and no other ring uses it while this one lives (an arena's
        // slot is one ring's until its close handshake ends). The ring's range ends
        // at or before `ctrl_off`, so the other users of the region (the
        // source records of `store_record`, `RxDoorbell`'s sleep word) never
        // touch it; the fabric reads it only as a WRITE's source, posted by
        // the `RingTx` this `Staging` moves into from methods that hold no
        // view of it. (`regions()` lends the region out for inspection; its
        // docs forbid writing into it.)
        let staging = unsafe { Staging::new(tx_region.clone(), ring_off, ring_len) };
        // Below the minimum only where the pages go back (`Region::discard`): a
        // verbs registration or huge pages keep them, and going below would cost
        // a resize round trip after every quiet spell for nothing.
        let releases =
            kind == rrpc_core::ProviderKind::Shm && !rx_region.is_huge() && !tx_region.is_huge();
        let cfg = if releases || cfg.idle_ring_size() == cfg.min_ring_size() {
            cfg.clone()
        } else {
            cfg.to_builder()
                .idle_ring_size(cfg.min_ring_size())
                .build()?
        };
        Ok(LocalRing {
            cfg: Arc::new(cfg),
            rx_region,
            tx_region,
            staging,
            ring_off,
            ctrl_off,
            node,
        })
    }

    /// The NUMA node both regions were bound to
    /// ([`RingConfig::numa_node`] resolved against the fabric's
    /// device), `None` if none. A binding the kernel refused is logged and
    /// counted ([`rrpc_core::numa::PLACEMENT_FAILURES`]), not reported here.
    pub fn numa_node(&self) -> Option<u32> {
        self.node
    }

    /// The receive region (`RB_R`, granted to the peer) and the staging
    /// region (`RB_S`), for inspection: where their pages are
    /// ([`rrpc_core::numa::numa_maps_entry`]), how large they are. Read
    /// them through the ring only: the staging region's ring belongs to the
    /// [`RingTx`] that [`connect`](Self::connect) makes, and nothing else may
    /// write it (or read it while a [`WriteGuard`] is alive).
    pub fn regions(&self) -> (&Arc<Region>, &Arc<Region>) {
        (&self.rx_region, &self.tx_region)
    }

    /// What the handshake tells the peer about this ring
    /// ([`proto::params`](crate::proto::params)).
    pub fn params(&self) -> RingParams {
        RingParams::of(&self.cfg)
    }

    /// The memory both regions hold, in bytes (what a pool counts against
    /// its bound while this ring waits for a connection).
    pub fn bytes(&self) -> u64 {
        (self.rx_region.len() + self.tx_region.len()) as u64
    }

    /// Whether the regions got huge pages.
    pub fn is_huge(&self) -> bool {
        self.rx_region.is_huge()
    }

    /// Adds our ring's parameters ([`params`](Self::params)) and the grant
    /// of the receive region to `offer`, both under [`ROLE_RING`].
    pub fn add_to_offer(&self, offer: Offer) -> Offer {
        self.add_to_offer_as(offer, ROLE_RING)
    }

    /// [`add_to_offer`](Self::add_to_offer) under `role`: several rings in
    /// one handshake, each under its own role, for
    /// [`connect_over`](Self::connect_over).
    pub fn add_to_offer_as(&self, offer: Offer, role: u16) -> Offer {
        offer
            .section(role, self.params().encode())
            .grant(role, self.rx_region.clone())
    }

    /// Validates the peer's ring parameters and grant and splits into the
    /// two directions. Both sides must use the same slot size and count and
    /// the same [`RingConfig::cache_align`] and [`RingConfig::tail_with_imm`]
    /// switches (carried in the handshake, see [`params`](Self::params)).
    ///
    /// # Errors
    /// [`Error::Incompatible`], naming the peer's and our value, if the
    /// peer sent no ring parameters or ones that differ from ours or that
    /// this build cannot read, or it granted no (or a too small) ring
    /// region; [`Error::InvalidConfig`],
    /// naming both values, if the connection's queue pair has a send queue
    /// shallower than the ring needs ([`RingConfig::send_queue_need`]).
    pub fn connect(self, conn: &Connection) -> Result<(RingTx, RingRx), Error> {
        self.connect_over(conn.qp().clone(), conn.peer(), ROLE_RING)
    }

    /// [`connect`](Self::connect) over `qp`, with the peer's ring granted
    /// under `role` in `peer`: for several rings in one handshake
    /// ([`add_to_offer_as`](Self::add_to_offer_as)), each on its own
    /// virtual queue pair of one shared hardware queue pair
    /// ([`rrpc_core::vqp`]). `qp` must reach the peer that sent `peer`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub fn connect_over(
        self,
        qp: Arc<QueuePair>,
        peer: &PeerInfo,
        role: u16,
    ) -> Result<(RingTx, RingRx), Error> {
        let (need, depth) = (self.cfg.send_queue_need(), qp.send_depth());
        if depth < need {
            return Err(Error::InvalidConfig(format!(
                "the ring needs {need} send-queue slots (sq_depth {}: half for the sender, \
                 a quarter for the receiver) but the queue pair's send depth is {depth}",
                self.cfg.sq_depth()
            )));
        }
        let theirs = peer.section(role).ok_or_else(|| {
            Error::Incompatible(format!("peer sent no ring parameters under role {role:#x}"))
        })?;
        let theirs = RingParams::decode(theirs)?;
        let peer_initial = self.params().check_peer(&theirs)?;
        let remote = peer.region(role).ok_or_else(|| {
            Error::Incompatible(format!("peer granted no region with role {role:#x}"))
        })?;
        let need = (self.ring_off + self.cfg.ring_size()) as u64;
        if remote.len < need {
            return Err(Error::Incompatible(format!(
                "peer ring region has {} bytes, need {need}",
                remote.len
            )));
        }
        let shared = Arc::new(Shared {
            qp,
            tx_done: AtomicU64::new(0),
            rx_done: AtomicU64::new(0),
            sleep_done: AtomicU64::new(0),
            bell_done: AtomicU64::new(0),
        });
        let geo = Geometry::from_config(&self.cfg);
        let mut sender = Sender::new(&self.cfg);
        // shm copies a WRITE's bytes inside its post: staging is free once
        // the receiver read it (`proto` docs, "Reusing staging").
        sender.set_source_read_in_post(shared.qp.completes_in_post());
        let tx = RingTx {
            sender,
            cfg: self.cfg.clone(),
            shared: shared.clone(),
            tx_region: self.tx_region.clone(),
            staging: self.staging,
            rx_region: self.rx_region.clone(),
            remote,
            ring_off: self.ring_off,
            ctrl_off: self.ctrl_off,
            tx_seen: 0,
            full_at: Arc::new(AtomicU64::new(NOT_FULL)),
            full: false,
            imm_fallbacks: 0,
            ringer: Ringer::new(),
            bells_posted: 0,
            bells_refused: 0,
            placement_timeout: self.cfg.placement_timeout(),
            torn_since: None,
            released: 0,
        };
        let rx = RingRx {
            receiver: Receiver::with_initial_slots(&self.cfg, peer_initial),
            ring_len: geo.ring_bytes(),
            released: 0,
            shared,
            tx_region: self.tx_region,
            rx_region: self.rx_region,
            remote,
            ring_off: self.ring_off,
            ctrl_off: self.ctrl_off,
            rx_seen: 0,
            head_mirror: Arc::new(AtomicU64::new(0)),
            deferred: None,
            imm: self.cfg.tail_with_imm(),
            peer_rings: theirs.has(params::FLAG_DOORBELL),
            sleeper: Arc::new(std::sync::Mutex::new(Sleeper::new())),
            peeked: None,
            body: Vec::new(),
            placement_timeout: self.cfg.placement_timeout(),
            unplaced_since: None,
            torn_since: None,
        };
        Ok((tx, rx))
    }
}

const NOT_FULL: u64 = u64::MAX;

/// The immediate of a tail `WRITE_WITH_IMM`: the tail's low bits, as many
/// as `qp` carries (the receiver reads the tail from its memory; the
/// immediate only wakes it).
fn imm_of(qp: &QueuePair, tail: u64) -> u32 {
    (tail as u32) & (u32::MAX >> (32 - qp.imm_bits()))
}

/// What both halves share: the queue pair and the completion routing.
#[derive(Debug)]
struct Shared {
    qp: Arc<QueuePair>,
    /// One past the highest completed sender sequence number.
    tx_done: AtomicU64,
    /// One past the highest completed receiver sequence number.
    rx_done: AtomicU64,
    /// The highest sleep epoch whose word WRITE completed.
    sleep_done: AtomicU64,
    /// Doorbells completed.
    bell_done: AtomicU64,
}

impl Shared {
    fn check(&self) -> Result<(), Error> {
        match self.qp.failure() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Polls the send completion queue and routes completions to the half
    /// that posted them (they share the queue pair).
    fn poll_cq(&self) -> Result<(), Error> {
        // A sender has a few completions outstanding at a time (a batch's
        // WRITE and its tail); the loop below takes more when there are.
        // Small, because the array is initialized on every poll, which is
        // every send.
        let mut wc = [Completion::EMPTY; 8];
        loop {
            let n = self.qp.send_cq().poll(&mut wc)?;
            for c in &wc[..n] {
                if c.status != Status::Success {
                    // Recorded on the queue pair (the first reason wins), so
                    // that whoever finds the connection gone later (the
                    // receiver, the next send, the close that follows) can
                    // say why: `IBV_WC_RETRY_EXC_ERR` is the peer's host
                    // gone silent, and a later "not connected" must not
                    // hide it.
                    let e = rrpc_core::Error::CompletionError {
                        wr_id: c.wr_id,
                        status: c.status,
                    };
                    self.qp.fail(&e);
                    let e = self.qp.failure().unwrap_or(e);
                    return Err(e.into());
                }
                let seq = (c.wr_id & WR_SEQ_MASK) + 1;
                match c.wr_id & !WR_SEQ_MASK {
                    WR_KIND_TX => self.tx_done.fetch_max(seq, Ordering::AcqRel),
                    WR_KIND_RX => self.rx_done.fetch_max(seq, Ordering::AcqRel),
                    WR_KIND_SLEEP => self.sleep_done.fetch_max(seq - 1, Ordering::AcqRel),
                    WR_KIND_BELL => self.bell_done.fetch_max(seq, Ordering::AcqRel),
                    _ => 0, // someone else's work request on a shared queue pair
                };
            }
            if n < wc.len() {
                // Another thread may have polled the completion that failed
                // the queue pair (a polling thread announcing a sleep): the
                // failure it recorded is everyone's.
                return self.check();
            }
        }
    }

    /// Polls until `done` reaches `target`, for at most [`DOORBELL_WAIT`].
    fn wait_done(&self, done: &AtomicU64, target: u64) -> Result<bool, Error> {
        let deadline = std::time::Instant::now() + DOORBELL_WAIT;
        loop {
            self.poll_cq()?;
            if done.load(Ordering::Acquire) >= target {
                return Ok(true);
            }
            if std::time::Instant::now() > deadline {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }
}

/// The sending direction: writes into the peer's `RB_R` (RB² `WRITEMSG`).
#[derive(Debug)]
pub struct RingTx {
    sender: Sender,
    cfg: Arc<RingConfig>,
    shared: Arc<Shared>,
    tx_region: Arc<Region>,
    /// `RB_S`: the ring's bytes of `tx_region`, ours alone.
    staging: Staging,
    rx_region: Arc<Region>,
    remote: RemoteRegion,
    ring_off: usize,
    ctrl_off: usize,
    tx_seen: u64,
    full_at: Arc<AtomicU64>,
    /// Local copy of `full_at != NOT_FULL` (no shared load on the fast path).
    full: bool,
    imm_fallbacks: u64,
    /// Rings the peer's doorbell once per sleep it announced.
    ringer: Ringer,
    bells_posted: u64,
    /// Doorbells the peer had no receive for (shm says so at post time).
    bells_refused: u64,
    /// [`RingConfig::placement_timeout`], which also bounds how long the
    /// head record may stay inconsistent.
    placement_timeout: std::time::Duration,
    /// Since when the head record has read inconsistent.
    torn_since: Option<TornSince>,
    /// Bytes of `RB_S` given back to the system after shrinks.
    released: u64,
}

impl RingTx {
    /// Reserves `len` payload bytes in `RB_S` for zero-copy encoding.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] when the ring is full (the batch is flushed so
    /// the receiver can drain; wait on [`TxWatch::has_space`]),
    /// [`Error::TooLarge`] when `len` exceeds the ring, a fabric error
    /// when the connection failed ([`Error::is_peer_gone`] if the peer left), [`Error::Corrupt`] after a bad head word.
    pub fn try_reserve(&mut self, len: usize) -> Result<WriteGuard<'_>, Error> {
        if self.sender.wants_completions() {
            self.poll_completions()?;
        }
        // rtrb's cached-index pattern: the peer-written head word (and the
        // queue pair's state) is read only when the ring looks full.
        if !self.sender.fits(len) {
            self.shared.check()?;
            self.reload_head()?;
        }
        let mut reserved = self.sender.reserve(len, self.staging.ring_mut());
        if matches!(reserved, Err(Error::WouldBlock)) && self.sender.wants_completions() {
            // Room may come with completions (slots the receiver read whose
            // WRITEs have not completed, or a deferred tail): on shm they
            // are in the queue already.
            self.poll_completions()?;
            reserved = self.sender.reserve(len, self.staging.ring_mut());
        }
        match reserved {
            Ok(res) => {
                if self.full {
                    self.full = false;
                    self.full_at.store(NOT_FULL, Ordering::Relaxed);
                }
                Ok(WriteGuard { tx: self, res, len })
            }
            Err(Error::WouldBlock) => {
                self.post()?;
                if self.sender.tail_deferred() {
                    self.poll_completions()?;
                }
                if self.sender.awaits_completions() {
                    // The room comes with completions, not with a head push:
                    // a waiter polls them (`wants_completions`) instead of
                    // waiting for a head that may not move again.
                    self.full = false;
                    self.full_at.store(NOT_FULL, Ordering::Release);
                } else {
                    self.full = true;
                    self.full_at
                        .store(self.sender.local_head(), Ordering::Release);
                }
                self.shared.check()?;
                Err(Error::WouldBlock)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the head record the receiver pushed and applies it; after a
    /// shrink it took effect, gives the unused end of `RB_S` back.
    fn reload_head(&mut self) -> Result<(), Error> {
        let (value, check) = load_record(&self.rx_region, LOCAL_HEAD_OFFSET)?;
        if self.sender.handle_head_record(value, check)? {
            self.torn_since = None;
        } else if torn_past(&mut self.torn_since, self.placement_timeout, &self.shared)? {
            return Err(self.sender.record_timed_out(value, check));
        }
        if let Some(keep) = self.sender.take_released() {
            // The receiver has read every slot of the larger geometry, and
            // their WRITEs completed: nothing reads that staging any more.
            self.released += self.staging.discard_from(keep)? as u64;
        }
        Ok(())
    }

    /// Runs a self-sizing ring's policy at `now` ([`crate::proto::sizing`])
    /// and starts the resize it asks for; also completes a shrink the
    /// receiver has acknowledged (giving `RB_S`'s unused end back). Call it
    /// every [`RingConfig::shrink_after`]` / 2`, busy or not: an idle ring
    /// shrinks only from here. Returns whether a resize marker went out.
    /// A fixed ring does nothing.
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]) while posting the marker,
    /// [`Error::Corrupt`] after a bad head record.
    pub fn maintain(&mut self, now: std::time::Instant) -> Result<bool, Error> {
        if !self.cfg.self_sizing() {
            return Ok(false);
        }
        self.shared.check()?;
        self.reload_head()?;
        if !self.sender.maintain(now, self.staging.ring_mut())? {
            return Ok(false);
        }
        self.post()?;
        if self.sender.tail_deferred() {
            self.poll_completions()?;
        }
        Ok(true)
    }

    /// Bytes of `RB_S` given back to the system after shrinks (0 where the
    /// provider cannot: verbs, huge pages; `rrpc_core::Region::discard`).
    pub fn released_bytes(&self) -> u64 {
        self.released
    }

    /// Copies `msg` into the ring as one message.
    ///
    /// # Errors
    /// As [`try_reserve`](Self::try_reserve).
    pub fn try_send(&mut self, msg: &[u8]) -> Result<(), Error> {
        let mut g = self.try_reserve(msg.len())?;
        g.copy_from_slice(msg);
        g.commit()
    }

    /// Pushes whatever is batched: untransmitted slots, then the tail.
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]).
    pub fn flush(&mut self) -> Result<(), Error> {
        self.sender.flush();
        self.post()?;
        if self.sender.tail_deferred() {
            // Elastic threshold: the tail goes out once the previous tail
            // WRITE has completed; on shm that is already the case.
            self.poll_completions()?;
        }
        Ok(())
    }

    /// Polls the send completion queue and posts whatever became unblocked
    /// (a deferred tail WRITE, work held back by the queue budget).
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]).
    pub fn poll_completions(&mut self) -> Result<(), Error> {
        self.shared.poll_cq()?;
        let done = self.shared.tx_done.load(Ordering::Acquire);
        if done > self.tx_seen {
            self.tx_seen = done;
            self.sender.handle_completion(WR_KIND_TX | (done - 1));
        }
        self.post()
    }

    /// A cheap, thread-safe handle to wait for space after [`Error::WouldBlock`].
    pub fn watch(&self) -> TxWatch {
        TxWatch {
            region: self.rx_region.clone(),
            full_at: self.full_at.clone(),
        }
    }

    /// The sans-IO state (pointers and counters), for tests and benchmarks.
    pub fn state(&self) -> &Sender {
        &self.sender
    }

    /// The configuration.
    pub fn config(&self) -> &RingConfig {
        &self.cfg
    }

    /// EVENT mode: tail WRITEs that found no receive posted at the peer and
    /// went out as plain WRITEs (see the crate docs, "EVENT mode"). Stays 0
    /// while the receiver follows the repost rule and keeps up.
    pub fn imm_fallbacks(&self) -> u64 {
        self.imm_fallbacks
    }

    /// Doorbells rung: tails after which the peer's sleep word showed a
    /// sleep not rung yet ([`crate::proto::doorbell`]).
    pub fn doorbells(&self) -> u64 {
        self.ringer.rings()
    }

    /// Doorbells the peer had posted no receive for (counted where the
    /// provider says so at post time: shm; a NIC retries instead).
    pub fn doorbells_refused(&self) -> u64 {
        self.bells_refused
    }

    /// After a tail went out: reads the peer's sleep word (behind a
    /// `SeqCst` fence, Dekker with the receiver's announce and re-check)
    /// and rings once for a sleep not rung yet: a `WRITE_WITH_IMM` of the
    /// same tail record, whose receive completion wakes the peer's
    /// completion channel. At most one doorbell is in flight (its source
    /// record is reused).
    fn ring_if_asleep(&mut self, value: u64) -> Result<(), Error> {
        std::sync::atomic::fence(Ordering::SeqCst);
        let word = self
            .rx_region
            .atomic_u64(LOCAL_SLEEP_OFFSET)?
            .load(Ordering::SeqCst);
        if !self.ringer.owes(word) {
            return Ok(());
        }
        if !self
            .shared
            .wait_done(&self.shared.bell_done, self.bells_posted)?
        {
            // The previous doorbell is still unacknowledged: ring after a
            // later tail (the reader's rescan covers it if none comes).
            return Ok(());
        }
        self.ringer.after_tail(word);
        let off = self.ctrl_off + BELL_SRC * 64;
        store_record(&self.tx_region, off, value)?;
        let wr_id = WR_KIND_BELL | (self.bells_posted & WR_SEQ_MASK);
        let r = self.shared.qp.post_write_imm(
            wr_id,
            Local::new(&self.tx_region, off, POINTER_RECORD_LEN),
            self.remote.at(LOCAL_TAIL_OFFSET as u64),
            imm_of(&self.shared.qp, value),
            true,
        );
        match r {
            Ok(()) => {
                self.bells_posted += 1;
                Ok(())
            }
            // The peer posted no receive: it announced a sleep it is not
            // set up to be woken from (a broken peer); the tail is out.
            Err(rrpc_core::Error::ReceiverNotReady) => {
                self.bells_refused += 1;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn post(&mut self) -> Result<(), Error> {
        loop {
            let Some(t) = self.sender.poll_transmit() else {
                if self.sender.wants_completions() && !self.sender.tail_deferred() {
                    // Send-queue budget exhausted: retire completions and go on.
                    self.shared.poll_cq()?;
                    let done = self.shared.tx_done.load(Ordering::Acquire);
                    if done > self.tx_seen {
                        self.tx_seen = done;
                        self.sender.handle_completion(WR_KIND_TX | (done - 1));
                        continue;
                    }
                }
                return Ok(());
            };
            let r = match t {
                Transmit::Slots {
                    offset,
                    len,
                    wr_id,
                    signaled,
                } => self.shared.qp.post_write(
                    wr_id,
                    Local::new(&self.tx_region, self.ring_off + offset, len),
                    self.remote.at((self.ring_off + offset) as u64),
                    signaled,
                ),
                Transmit::Tail { value, src, wr_id } => {
                    let off = self.ctrl_off + src * 64;
                    store_record(&self.tx_region, off, value)?;
                    let local = Local::new(&self.tx_region, off, POINTER_RECORD_LEN);
                    let remote = self.remote.at(LOCAL_TAIL_OFFSET as u64);
                    if self.cfg.tail_with_imm() {
                        match self.shared.qp.post_write_imm(
                            wr_id,
                            local,
                            remote,
                            imm_of(&self.shared.qp, value),
                            true,
                        ) {
                            // No receive posted: the receiver has receive
                            // completions it has not polled yet, so it is
                            // awake or about to wake and will recheck the
                            // tail (arm-then-recheck). A plain WRITE keeps
                            // the data flowing instead of failing the ring.
                            Err(rrpc_core::Error::ReceiverNotReady) => {
                                self.imm_fallbacks += 1;
                                let local = Local::new(&self.tx_region, off, POINTER_RECORD_LEN);
                                self.shared.qp.post_write(wr_id, local, remote, true)
                            }
                            r => r,
                        }
                    } else {
                        self.shared.qp.post_write(wr_id, local, remote, true)?;
                        self.ring_if_asleep(value)?;
                        continue;
                    }
                }
            };
            r?;
        }
    }
}

/// Space reserved in `RB_S`; write the payload through `DerefMut`, then
/// [`commit`](Self::commit). Dropping it without committing abandons it.
#[derive(Debug)]
pub struct WriteGuard<'a> {
    tx: &'a mut RingTx,
    res: Reservation,
    len: usize,
}

impl WriteGuard<'_> {
    /// Commits the whole reservation.
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]) while posting a threshold's WRITEs.
    pub fn commit(self) -> Result<(), Error> {
        let len = self.len;
        self.commit_len(len)
    }

    /// Commits only the first `len` bytes (the rest of the slots stay unused).
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    ///
    /// # Panics
    /// If `len` exceeds the reserved length.
    pub fn commit_len(self, len: usize) -> Result<(), Error> {
        let tx = self.tx;
        tx.sender.commit(self.res, len, tx.staging.ring_mut());
        tx.post()?;
        if tx.sender.tail_deferred() {
            // Algorithm 1 line 10: try to poll the last tail WRITE's CQE.
            tx.poll_completions()?;
        }
        Ok(())
    }
}

impl std::ops::Deref for WriteGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.tx.staging.range(self.res.offset(), self.len)
    }
}

impl std::ops::DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.tx.staging.range_mut(self.res.offset(), self.len)
    }
}

/// Thread-safe handle telling a waiting sender that the receiver pushed its head.
#[derive(Debug, Clone)]
pub struct TxWatch {
    region: Arc<Region>,
    full_at: Arc<AtomicU64>,
}

impl TxWatch {
    /// True unless the last send found the ring full and the peer has not
    /// pushed a new head since. One `Acquire` load (two when full).
    pub fn has_space(&self) -> bool {
        let full_at = self.full_at.load(Ordering::Acquire);
        full_at == NOT_FULL
            || self
                .region
                .atomic_u64(LOCAL_HEAD_OFFSET)
                .is_ok_and(|w| w.load(Ordering::Acquire) != full_at)
    }
}

/// The receiving direction: reads `RB_R` (RB² `READMSG`).
#[derive(Debug)]
pub struct RingRx {
    receiver: Receiver,
    /// Bytes of the whole array.
    ring_len: usize,
    /// Bytes of `RB_R` given back to the system after shrinks.
    released: u64,
    shared: Arc<Shared>,
    tx_region: Arc<Region>,
    rx_region: Arc<Region>,
    remote: RemoteRegion,
    ring_off: usize,
    ctrl_off: usize,
    rx_seen: u64,
    head_mirror: Arc<AtomicU64>,
    deferred: Option<Error>,
    imm: bool,
    /// The peer's sender reads our sleep word
    /// ([`params::FLAG_DOORBELL`](crate::proto::params::FLAG_DOORBELL)).
    peer_rings: bool,
    sleeper: Arc<std::sync::Mutex<Sleeper>>,
    /// The message [`RingRx::has_message`] found, returned by the next
    /// [`RingRx::try_recv`] without decoding its header again.
    peeked: Option<Message>,
    /// The message a [`ReadGuard`] lends: copied out of `RB_R`, which the
    /// peer can write at any time ([`mem::copy_received`]). Grows to the
    /// largest message received and is reused.
    body: Vec<u8>,
    /// [`RingConfig::placement_timeout`].
    placement_timeout: std::time::Duration,
    /// Since when the message at this slot pointer has been covered by the
    /// tail but not placed (`proto` docs, "Placement order").
    unplaced_since: Option<(u64, std::time::Instant)>,
    /// Since when the tail record has read inconsistent.
    torn_since: Option<TornSince>,
}

impl RingRx {
    /// The next message: copied out of `RB_R` into this receiver's buffer
    /// (one pass, the peer cannot change it afterwards), which the guard
    /// lends; its slots are released when the guard drops.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] when empty, [`Error::Corrupt`] for bad peer
    /// data (the channel is closed), a fabric error once the connection
    /// failed ([`Error::is_peer_gone`] if the peer left) and no more messages are published.
    pub fn try_recv(&mut self) -> Result<ReadGuard<'_>, Error> {
        let msg = self.next_message()?;
        let len = msg.len();
        if self.body.len() < len {
            self.body.resize(len, 0);
        }
        // After the end stamp that vouched for the bytes and the `Acquire`
        // fence (`next_message`).
        mem::copy_received(
            &self.rx_region,
            self.ring_off + msg.offset(),
            &mut self.body[..len],
        );
        Ok(ReadGuard { rx: self, msg })
    }

    /// The message at the head, validated, its payload not read yet (the
    /// one [`has_message`](Self::has_message) found, if any).
    fn next_message(&mut self) -> Result<Message, Error> {
        if self.deferred.is_some() {
            return Err(self.deferred.take().expect("checked"));
        }
        if let Some(msg) = self.peeked.take() {
            return Ok(msg);
        }
        // Cached-index pattern: reload the peer-written tail word only when
        // everything published so far has been consumed.
        if self.receiver.head() == self.receiver.local_tail() {
            let (value, check) = load_record(&self.rx_region, LOCAL_TAIL_OFFSET)?;
            let before = self.receiver.local_tail();
            if self.receiver.handle_tail_record(value, check)? {
                self.torn_since = None;
                if self.imm && self.receiver.local_tail() != before {
                    // Each tail WRITE_WITH_IMM consumed one receive: repost them.
                    self.replenish()?;
                }
            } else if torn_past(&mut self.torn_since, self.placement_timeout, &self.shared)? {
                return Err(self.receiver.record_timed_out(value, check));
            }
        }
        let (region, off) = (&self.rx_region, self.ring_off);
        let got = self.receiver.poll_recv(|o| {
            region
                .atomic_u64(off + o)
                .map(|w| w.load(Ordering::Relaxed))
                .unwrap_or(0)
        });
        if let Some(keep) = self.receiver.take_shrunk() {
            // Every slot past `keep` was read, and the sender writes there
            // again only after a marker that grows the ring.
            self.released +=
                self.rx_region
                    .discard(self.ring_off + keep, self.ring_len - keep)? as u64;
            // The copy buffer grew to the larger ring's messages: let it go
            // with them (a quiet ring shrinks; the next message allocates).
            self.body = Vec::new();
        }
        match got? {
            Some(msg) => {
                // The payload is read after the end stamp that vouched for it.
                std::sync::atomic::fence(Ordering::Acquire);
                self.unplaced_since = None;
                Ok(msg)
            }
            None => {
                if let Some(pos) = self.receiver.unplaced() {
                    // Covered by the tail, not placed yet: wait, within a bound.
                    let now = std::time::Instant::now();
                    match self.unplaced_since {
                        Some((p, since)) if p == pos => {
                            if now.duration_since(since) > self.placement_timeout {
                                return Err(self.receiver.placement_timed_out());
                            }
                        }
                        _ => self.unplaced_since = Some((pos, now)),
                    }
                }
                // Gaps may have moved the head: keep the watch exact.
                self.head_mirror
                    .store(self.receiver.head(), Ordering::Release);
                self.shared.check()?;
                self.post()?;
                Err(Error::WouldBlock)
            }
        }
    }

    /// Whether a message is ready, without reading it: skips wrap-around gap
    /// markers (a tail that moved over a gap only is "no message") and leaves
    /// the next message where it is, so the next [`try_recv`](Self::try_recv)
    /// returns it.
    ///
    /// # Errors
    /// As [`try_recv`](Self::try_recv), except that "empty" is `Ok(false)`.
    pub fn has_message(&mut self) -> Result<bool, Error> {
        if self.peeked.is_some() {
            return Ok(true);
        }
        // Only a guard's drop consumes a message: this one stays at the head.
        let found = match self.next_message() {
            Ok(msg) => Some(msg),
            Err(Error::WouldBlock) => None,
            Err(e) => return Err(e),
        };
        self.peeked = found;
        Ok(found.is_some())
    }

    /// Whether a receiver about to wait should push its head before the wait rather than
    /// only if it sleeps ([`proto::Receiver::push_owed_before_wait`](crate::proto::Receiver::push_owed_before_wait)).
    pub fn push_owed_before_wait(&self) -> bool {
        self.receiver.push_owed_before_wait()
    }

    /// Head pushes posted so far (RB²'s lazy push: every `gamma` messages, every
    /// [`proto::flush_slots`](crate::proto::flush_slots) slots, and when a receiver going idle
    /// owes one).
    pub fn head_pushes(&self) -> u64 {
        self.receiver.pushes()
    }

    /// Pushes the head now if the sender has not seen the latest one.
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]).
    pub fn flush(&mut self) -> Result<(), Error> {
        self.receiver.flush();
        self.post()
    }

    /// [`flush`](Self::flush) for a receiver about to wait for data. On a
    /// queue pair whose posts complete later (a NIC;
    /// [`QueuePair::completes_in_post`](rrpc_core::QueuePair::completes_in_post)
    /// is false) the push is signaled, and one is posted with the same head
    /// if earlier pushes went out unconfirmed, so that
    /// [`poll_completions`](Self::poll_completions) learns whether they
    /// failed (a link down, a peer that stopped acknowledging). Then poll
    /// completions while [`confirming`](Self::confirming): a failed push
    /// the sender was waiting for would otherwise leave both sides waiting,
    /// the sender for room and this side for data. On shm it is `flush`.
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]) (the queue pair already failed).
    pub fn flush_confirmed(&mut self) -> Result<(), Error> {
        self.receiver.flush();
        if !self.shared.qp.completes_in_post() {
            self.receiver.confirm_pushes();
        }
        self.post()
    }

    /// True while a signaled head push (see [`flush_confirmed`](Self::flush_confirmed))
    /// is owed or its completion has not been polled. Never on shm.
    pub fn confirming(&self) -> bool {
        !self.shared.qp.completes_in_post() && self.receiver.confirming()
    }

    /// Polls the send completion queue (head pushes share it with the sender).
    ///
    /// # Errors
    /// a fabric error (the peer gone: [`Error::is_peer_gone`]).
    pub fn poll_completions(&mut self) -> Result<(), Error> {
        self.shared.poll_cq()?;
        self.take_completions();
        self.post()
    }

    /// True if a head push is owed but held back until completions of
    /// earlier ones are polled (the send-queue budget). On a NIC those
    /// complete after the post; a receiver that goes idle must keep calling
    /// [`poll_completions`](Self::poll_completions) until this is false, or
    /// a sender waiting for that head waits forever.
    pub fn wants_completions(&self) -> bool {
        self.receiver.wants_completions()
    }

    /// EVENT mode (`tail_with_imm`): posts `n` receives, the pool the
    /// peer's tail `WRITE_WITH_IMM`s consume. Call it once after
    /// [`LocalRing::connect`]; see the crate docs ("EVENT mode") for the
    /// repost rule that keeps the pool full.
    ///
    /// # Errors
    /// [`Error::Core`] (`QueueFull`) beyond the queue pair's receive depth.
    pub fn post_receives(&self, n: u32) -> Result<(), Error> {
        for _ in 0..n {
            self.shared.qp.post_recv(0)?;
        }
        Ok(())
    }

    /// EVENT mode: retires the receive completions queued so far and posts
    /// one receive for each (the repost rule). [`try_recv`](Self::try_recv)
    /// calls this whenever it sees a new tail; call it from a poller that
    /// has no other use for the completions. Returns how many were reposted.
    ///
    /// # Errors
    /// [`Error::Core`] if polling or posting fails (a corrupt shared queue,
    /// a failed queue pair).
    pub fn replenish(&self) -> Result<usize, Error> {
        Self::replenish_on(&self.shared.qp)
    }

    /// [`replenish`](Self::replenish) for whoever holds only the ring's
    /// queue pair (a poller's completion-channel notifier, which the
    /// receiver task does not share).
    ///
    /// # Errors
    /// As [`replenish`](Self::replenish).
    pub fn replenish_on(qp: &rrpc_core::QueuePair) -> Result<usize, Error> {
        let mut wc = [Completion::EMPTY; 32];
        let mut total = 0;
        loop {
            let n = qp.recv_cq().poll(&mut wc)?;
            for c in &wc[..n] {
                match qp.post_recv(c.wr_id) {
                    // Someone else reposted already: the pool is full.
                    Ok(()) | Err(rrpc_core::Error::QueueFull { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            total += n;
            if n < wc.len() {
                return Ok(total);
            }
        }
    }

    /// A thread-safe handle that announces this receiver's sleeps to the
    /// peer's sender, so that it rings (the doorbell fallback,
    /// [`crate::proto::doorbell`]). Post receives first
    /// ([`post_receives`](Self::post_receives)): each doorbell consumes one.
    pub fn doorbell(&self) -> RxDoorbell {
        RxDoorbell {
            shared: self.shared.clone(),
            tx_region: self.tx_region.clone(),
            remote: self.remote,
            src_off: self.ctrl_off + SLEEP_SRC * 64,
            sleeper: self.sleeper.clone(),
            peer_rings: self.peer_rings,
        }
    }

    /// Whether the peer sends every tail with `WRITE_WITH_IMM`
    /// ([`RingConfig::tail_with_imm`], EVENT mode).
    pub fn tails_with_imm(&self) -> bool {
        self.imm
    }

    /// A cheap, thread-safe handle for polling threads.
    pub fn watch(&self) -> RxWatch {
        RxWatch {
            region: self.rx_region.clone(),
            head: self.head_mirror.clone(),
        }
    }

    /// Bytes of `RB_R` given back to the system after shrinks (0 where the
    /// provider cannot: verbs, huge pages; `rrpc_core::Region::discard`).
    pub fn released_bytes(&self) -> u64 {
        self.released
    }

    /// Bytes of heap the receiver keeps between messages: the buffer a
    /// [`ReadGuard`] lends, grown to the largest message since the ring
    /// last shrank (a shrink lets it go).
    pub fn buffered_bytes(&self) -> usize {
        self.body.capacity()
    }

    /// The sans-IO state, for tests and benchmarks.
    pub fn state(&self) -> &Receiver {
        &self.receiver
    }

    fn take_completions(&mut self) {
        let done = self.shared.rx_done.load(Ordering::Acquire);
        if done > self.rx_seen {
            self.rx_seen = done;
            self.receiver.handle_completion(WR_KIND_RX | (done - 1));
        }
    }

    fn post(&mut self) -> Result<(), Error> {
        if self.receiver.wants_completions() {
            self.shared.poll_cq()?;
            self.take_completions();
        }
        while let Some(p) = self.receiver.poll_transmit() {
            let off = self.ctrl_off + HEAD_SRC * 64;
            store_record(&self.tx_region, off, p.value)?;
            self.shared.qp.post_write(
                p.wr_id,
                Local::new(&self.tx_region, off, POINTER_RECORD_LEN),
                self.remote.at(LOCAL_HEAD_OFFSET as u64),
                p.signaled,
            )?;
        }
        Ok(())
    }
}

/// A received message, copied out of `RB_R` into its receiver's buffer
/// ([`RingRx::try_recv`]); dropping it releases its slots (and may push the
/// head, RB² lazy push).
#[derive(Debug)]
pub struct ReadGuard<'a> {
    rx: &'a mut RingRx,
    msg: Message,
}

impl std::ops::Deref for ReadGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.rx.body[..self.msg.len()]
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.rx.receiver.release(self.msg);
        self.rx
            .head_mirror
            .store(self.rx.receiver.head(), Ordering::Release);
        if self.rx.receiver.push_pending()
            && let Err(e) = self.rx.post()
        {
            self.rx.deferred.get_or_insert(e);
        }
    }
}

/// Announces a receiver's sleeps to the peer's sender (see
/// [`RingRx::doorbell`]). `Clone + Send + Sync`.
#[derive(Debug, Clone)]
pub struct RxDoorbell {
    shared: Arc<Shared>,
    tx_region: Arc<Region>,
    remote: RemoteRegion,
    src_off: usize,
    sleeper: Arc<std::sync::Mutex<Sleeper>>,
    peer_rings: bool,
}

impl RxDoorbell {
    /// Whether the peer's sender rings at all (it offered
    /// [`params::FLAG_DOORBELL`](crate::proto::params::FLAG_DOORBELL)).
    /// Without it, a sleeping reader is woken only by whatever else watches
    /// the ring.
    pub fn peer_rings(&self) -> bool {
        self.peer_rings
    }

    /// Tells the peer's sender that this receiver is about to sleep, and
    /// returns once it can see it: the sleep word's WRITE has completed
    /// (inline on shm; one round trip on a NIC), or 100 µs passed, after
    /// which the word lands later and the caller's rescans cover the gap.
    /// Then arm the completion channel and check the ring once more before
    /// sleeping.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] while the previous announce's WRITE is still
    /// unacknowledged (one is in flight at most: its send-queue slot is
    /// reserved once); [`Error::Core`] (the peer gone: [`Error::is_peer_gone`]) once the
    /// queue pair failed or posting fails.
    pub fn announce_sleep(&self) -> Result<(), Error> {
        let mut sleeper = self.sleeper.lock().unwrap_or_else(|e| e.into_inner());
        if !self
            .shared
            .wait_done(&self.shared.sleep_done, sleeper.epochs())?
        {
            return Err(Error::WouldBlock);
        }
        let word = sleeper.announce();
        let epoch = sleeper.epochs();
        self.tx_region
            .atomic_u64(self.src_off)?
            .store(word, Ordering::Release);
        self.shared.qp.post_write(
            WR_KIND_SLEEP | (epoch & WR_SEQ_MASK),
            Local::new(&self.tx_region, self.src_off, 8),
            self.remote.at(LOCAL_SLEEP_OFFSET as u64),
            true,
        )?;
        self.shared.wait_done(&self.shared.sleep_done, epoch)?;
        // Dekker with the sender's tail store and word load: the caller's
        // re-check of the ring comes after this.
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }

    /// Sleeps announced so far.
    pub fn announced(&self) -> u64 {
        self.sleeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .epochs()
    }
}

/// Thread-safe handle telling a polling thread that messages are published.
#[derive(Debug, Clone)]
pub struct RxWatch {
    region: Arc<Region>,
    head: Arc<AtomicU64>,
}

impl RxWatch {
    /// True if the sender published a tail beyond what we consumed: one
    /// `Acquire` load of the `local_tail` word.
    pub fn has_data(&self) -> bool {
        self.region
            .atomic_u64(LOCAL_TAIL_OFFSET)
            .is_ok_and(|w| w.load(Ordering::Acquire) != self.head.load(Ordering::Acquire))
    }
}

/// Stores the pointer record of `value` at `off` of our own `region`
/// (`Release`: a peer or NIC that reads it sees what came before).
fn store_record(region: &Region, off: usize, value: u64) -> Result<(), Error> {
    // The words of `encode_pointer(value)`, value first.
    region.atomic_u64(off)?.store(value, Ordering::Release);
    region
        .atomic_u64(off + 8)?
        .store(pointer_check(value), Ordering::Release);
    Ok(())
}

/// Loads the two words of the pointer record at `off` of a peer-written
/// region (`Acquire`: what the peer wrote before it is visible after).
fn load_record(region: &Region, off: usize) -> Result<(u64, u64), Error> {
    let value = region.atomic_u64(off)?.load(Ordering::Acquire);
    let check = region.atomic_u64(off + 8)?.load(Ordering::Acquire);
    Ok((value, check))
}

/// When a pointer record was first and last read inconsistent.
#[derive(Debug, Clone, Copy)]
struct TornSince {
    first: std::time::Instant,
    last: std::time::Instant,
}

/// A pointer record read inconsistent, now: whether it has been torn at
/// every look for longer than `bound` ([`torn_for_too_long`]), so that the
/// caller closes the ring as corrupt. A peer that died between its two
/// stores is gone, not corrupt: that is the connection's error instead.
fn torn_past(
    since: &mut Option<TornSince>,
    bound: std::time::Duration,
    shared: &Shared,
) -> Result<bool, Error> {
    if torn_for_too_long(since, bound, std::time::Instant::now()) {
        shared.check()?;
        return Ok(true);
    }
    Ok(false)
}

/// A pointer record read inconsistent: starts the clock, and says whether
/// it has read inconsistent at every look for longer than `bound`. A torn
/// read after a quiet spell (no look for `bound / 2`: nobody polled, the
/// writer may have finished long ago) starts a new clock instead of being
/// charged the old one; an honest writer's record is consistent again
/// microseconds after a torn read, so only garbage keeps the clock running.
fn torn_for_too_long(
    since: &mut Option<TornSince>,
    bound: std::time::Duration,
    now: std::time::Instant,
) -> bool {
    match since {
        Some(t) if now.duration_since(t.last) <= bound / 2 => {
            t.last = now;
            now.duration_since(t.first) > bound
        }
        _ => {
            *since = Some(TornSince {
                first: now,
                last: now,
            });
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `LocalRing::new` takes the staging ring where it allocates it: the
    /// `Staging` covers exactly the ring's bytes, at the ring's offset
    /// (cache-aligned or not), and stops short of the source records after
    /// it. Runs under miri (heap-backed regions, no queue pair).
    #[test]
    fn a_local_ring_stages_exactly_its_ring() {
        for align in [true, false] {
            let cfg = RingConfig::builder()
                .ring_size(4096)
                .huge_pages(false)
                .cache_align(align)
                .build()
                .unwrap();
            let mut local = LocalRing::new(&Fabric::shm(), &cfg).unwrap();
            assert_eq!(local.ring_off, RING_OFFSET + if align { 0 } else { 8 });
            let ring = local.staging.ring_mut();
            assert_eq!(ring.len(), 4096);
            ring.fill(0xa5);
            local.staging.range_mut(4088, 8).copy_from_slice(&[7; 8]);
            let mut end = [0u8; 9];
            local
                .tx_region
                .read_at(local.ring_off + 4087, &mut end)
                .unwrap();
            assert_eq!(end, [0xa5, 7, 7, 7, 7, 7, 7, 7, 7]);
            // The source records after the ring are untouched.
            let (ctrl, len) = (local.ctrl_off, local.tx_region.len());
            assert!(ctrl >= local.ring_off + 4096);
            let mut rest = vec![0xffu8; len - ctrl];
            local.tx_region.read_at(ctrl, &mut rest).unwrap();
            assert!(rest.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn only_a_record_torn_at_every_look_times_out() {
        use std::time::{Duration, Instant};
        let (bound, t0) = (Duration::from_millis(100), Instant::now());
        let ms = |n| t0 + Duration::from_millis(n);
        // Torn at every look, 10 ms apart: closes once past the bound.
        let mut since = None;
        assert!((0..=10).all(|i| !torn_for_too_long(&mut since, bound, ms(i * 10))));
        assert!(torn_for_too_long(&mut since, bound, ms(110)));
        // A torn read long after the last one starts a new clock: an
        // honest record read torn twice, a second apart, is no timeout.
        let mut since = None;
        assert!(!torn_for_too_long(&mut since, bound, ms(0)));
        assert!(!torn_for_too_long(&mut since, bound, ms(1000)));
        assert!(!torn_for_too_long(&mut since, bound, ms(1040)));
        assert!(!torn_for_too_long(&mut since, bound, ms(1090)));
        assert!(torn_for_too_long(&mut since, bound, ms(1101)));
    }
}
