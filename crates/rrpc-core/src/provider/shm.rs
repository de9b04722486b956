//! The `shm` provider: one-sided semantics between processes on one host.
//!
//! * A region is a `memfd` mapped `MAP_SHARED`; granting it passes the fd to
//!   the peer (`SCM_RIGHTS`), which maps exactly what it was granted.
//! * A WRITE is a copy into the peer's mapping followed by a `Release` fence; an
//!   aligned WRITE of up to 64 bytes in whole words is a `Release` store per
//!   word, so pointer words are never torn and RC ordering holds (earlier
//!   writes are visible first).
//! * A READ is a copy out of the peer's mapping.
//! * A WRITE_WITH_IMM additionally appends `(imm, len)` to the peer's receive
//!   completion queue — a ring in shared memory the peer owns — and, if the
//!   peer armed it, rings the peer's doorbell (a byte into the write end of
//!   a pipe the peer passed us; `sys::BellRx`).
//!
//! Completions of our own WRITE/READ are produced at post time (the copy is
//! synchronous) and appear at the next poll of the send queue, unless
//! [`crate::FaultConfig`] delays or fails them.
//!
//! Peer-written memory (the receive queue's producer index, and anything in
//! granted regions) is read once and validated before use.
// The workspace denies `unsafe`; this module copies into and out of memory mapped from the peer,
// so it allows it, with a SAFETY argument on every block.
#![allow(unsafe_code)]

pub(crate) mod side;

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, RwLock};

use crate::error::{Error, Result, Violation};
use crate::fail::{FailReason, FailState};
use crate::fault::FaultConfig;
use crate::handshake::Hello;
use crate::region::{Local, Remote, RemoteRegion};
use crate::settings::QpConfig;
use crate::sys::{BellRx, EventFd, Mapping, PeerBell};
use crate::work::{Completion, Opcode, SendOp, Status};

// ---------------------------------------------------------------------------
// Send completion queue (process-local)
// ---------------------------------------------------------------------------

/// Completions of our own work requests, plus send-queue depth accounting.
#[derive(Debug)]
pub(crate) struct SendCq {
    queue: Mutex<SendQueue>,
    /// Work requests posted (each gets sequence number `posted` after increment).
    posted: AtomicU64,
    /// Work requests retired by a polled signaled completion.
    retired: AtomicU64,
    armed: AtomicBool,
    channel: EventFd,
    misses: PollMisses,
    /// The queue pair's error state: an error completion records its
    /// reason when it is polled, as the verbs provider does (a device
    /// reports a failure through the completion queue, not at the post).
    fail: Arc<FailState>,
}

/// [`FaultConfig::poll_miss_every`] of one completion queue.
#[derive(Debug, Default)]
struct PollMisses {
    every: Option<u64>,
    /// Polls that found something to return.
    with_data: AtomicU64,
}

impl PollMisses {
    fn new(every: Option<u64>) -> Self {
        PollMisses {
            every,
            with_data: AtomicU64::new(0),
        }
    }

    /// A poll found completions: whether it misses them this time.
    #[inline]
    fn miss(&self) -> bool {
        match self.every {
            None => false,
            Some(k) => (self.with_data.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(k),
        }
    }
}

#[derive(Debug, Default)]
struct SendQueue {
    /// (sequence number, completion, polls left before it becomes visible)
    entries: VecDeque<(u64, Completion, u32)>,
}

impl SendCq {
    fn new(miss_every: Option<u64>, fail: Arc<FailState>) -> Result<Self> {
        Ok(SendCq {
            queue: Mutex::new(SendQueue::default()),
            posted: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            channel: EventFd::new()?,
            misses: PollMisses::new(miss_every),
            fail,
        })
    }

    /// Reserves one send-queue slot; returns its sequence number.
    fn reserve(&self, depth: u32) -> Result<u64> {
        let mut p = self.posted.load(Ordering::Relaxed);
        loop {
            let r = self.retired.load(Ordering::Acquire);
            // `p` may be older than `r`: another thread posted and had its
            // completion retired since we loaded it. The exchange below then
            // fails and reloads `p`, so a stale `p` counts as an empty queue.
            if p.saturating_sub(r) >= depth as u64 {
                return Err(Error::QueueFull { depth });
            }
            match self
                .posted
                .compare_exchange_weak(p, p + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(p + 1),
                Err(now) => p = now,
            }
        }
    }

    fn push(&self, seq: u64, c: Completion, delay: u32) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .push_back((seq, c, delay));
        // Arm-then-recheck pairs with `req_notify` + poll; the plain load keeps
        // the common unarmed case free of a read-modify-write.
        if self.armed.load(Ordering::SeqCst) && self.armed.swap(false, Ordering::SeqCst) {
            let _ = self.channel.notify();
        }
    }

    pub(crate) fn poll(&self, out: &mut [Completion]) -> usize {
        if out.is_empty() {
            return 0;
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.entries.front().is_some_and(|e| e.2 == 0) && self.misses.miss() {
            return 0;
        }
        let mut n = 0;
        while n < out.len() {
            let Some(front) = q.entries.front_mut() else {
                break;
            };
            if front.2 > 0 {
                // Delayed by fault injection: becomes visible after `delay` polls.
                front.2 -= 1;
                break;
            }
            let (seq, c, _) = q.entries.pop_front().expect("front exists");
            self.retired.fetch_max(seq, Ordering::AcqRel);
            if !matches!(c.status, Status::Success | Status::Flushed) {
                self.fail.set(FailReason::Completion {
                    wr_id: c.wr_id,
                    status: c.status,
                });
            }
            out[n] = c;
            n += 1;
        }
        n
    }

    /// A failed queue pair's outstanding work requests: every completion
    /// not yet delivered becomes [`Status::Flushed`] (`IBV_WC_WR_FLUSH_ERR`).
    fn flush_pending(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        for e in &mut q.entries {
            e.1.status = Status::Flushed;
            e.1.byte_len = 0;
        }
    }

    pub(crate) fn req_notify(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
    pub(crate) fn channel_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
    pub(crate) fn ack_events(&self) -> Result<u64> {
        self.channel.drain()
    }

    /// Work requests posted but not yet retired.
    fn outstanding(&self) -> u64 {
        // `retired` first: it never passes `posted`, so a `posted` loaded
        // after it is at least as large.
        let r = self.retired.load(Ordering::Acquire);
        self.posted.load(Ordering::Acquire) - r
    }
}

// ---------------------------------------------------------------------------
// Receive completion queue (shared memory; the peer produces, we consume)
// ---------------------------------------------------------------------------

/// Byte offsets of the words in a receive queue's shared header.
mod layout {
    /// Entries produced (written by the peer).
    pub(super) const PROD: usize = 0;
    /// Entries consumed (written by the owner).
    pub(super) const CONS: usize = 64;
    /// Receives posted (written by the owner).
    pub(super) const POSTED: usize = 72;
    /// Armed flag (owner sets 1; the producer swaps it to 0 and signals).
    pub(super) const ARMED: usize = 128;
    /// First entry; each entry is `imm: u32, byte_len: u32`.
    pub(super) const ENTRIES: usize = 192;
    pub(super) const ENTRY: usize = 8;
}

fn word(map: &Mapping, off: usize) -> &AtomicU64 {
    debug_assert!(off + 8 <= map.len() && off.is_multiple_of(8));
    // SAFETY: `off` is one of the fixed, 8-aligned header offsets inside the mapping
    // (the mapping is at least `layout::ENTRIES` bytes, checked at creation/attach).
    unsafe { &*(map.ptr().add(off) as *const AtomicU64) }
}

/// Our receive completion queue: entries written by the peer's WRITE_WITH_IMM.
#[derive(Debug)]
pub(crate) struct RecvCq {
    map: Mapping,
    cap: u64,
    state: Mutex<RecvState>,
    channel: BellRx,
    misses: PollMisses,
}

#[derive(Debug, Default)]
struct RecvState {
    cons: u64,
    posted: VecDeque<u64>,
    posted_total: u64,
    failed: Option<Violation>,
}

impl RecvCq {
    fn new(depth: u32, miss_every: Option<u64>) -> Result<Self> {
        let cap = depth.next_power_of_two() as u64;
        let map = Mapping::create(layout::ENTRIES + cap as usize * layout::ENTRY, false)?;
        Ok(RecvCq {
            map,
            cap,
            state: Mutex::new(RecvState::default()),
            channel: BellRx::new()?,
            misses: PollMisses::new(miss_every),
        })
    }

    fn post_recv(&self, wr_id: u64) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.posted.len() as u64 >= self.cap {
            return Err(Error::QueueFull {
                depth: self.cap as u32,
            });
        }
        st.posted.push_back(wr_id);
        st.posted_total += 1;
        word(&self.map, layout::POSTED).store(st.posted_total, Ordering::Release);
        Ok(())
    }

    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.failed {
            return Err(Error::PeerMisbehaved(why.clone()));
        }
        // Read the peer-written producer index once, then validate it.
        let prod = word(&self.map, layout::PROD).load(Ordering::Acquire);
        if prod < st.cons || prod - st.cons > self.cap || prod > st.posted_total {
            let why = Violation::RecvProducer {
                prod,
                cons: st.cons,
                max: st.cons + self.cap,
                posted: st.posted_total,
            };
            st.failed = Some(why.clone());
            return Err(Error::PeerMisbehaved(why));
        }
        if st.cons < prod && !out.is_empty() && self.misses.miss() {
            return Ok(0);
        }
        let mut n = 0;
        while n < out.len() && st.cons < prod {
            let slot = (st.cons % self.cap) as usize;
            let e = word(&self.map, layout::ENTRIES + slot * layout::ENTRY).load(Ordering::Acquire);
            let wr_id = st.posted.pop_front().expect("prod <= posted_total checked");
            out[n] = Completion {
                wr_id,
                status: Status::Success,
                opcode: Opcode::RecvImm,
                byte_len: (e >> 32) as u32,
                imm: Some(e as u32),
            };
            st.cons += 1;
            n += 1;
        }
        if n > 0 {
            word(&self.map, layout::CONS).store(st.cons, Ordering::Release);
        }
        Ok(n)
    }

    pub(crate) fn req_notify(&self) {
        word(&self.map, layout::ARMED).store(1, Ordering::SeqCst);
    }
    pub(crate) fn channel_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
    pub(crate) fn ack_events(&self) -> Result<u64> {
        self.channel.drain()
    }
}

/// The producer side of a peer's receive queue, as mapped in our process.
#[derive(Debug)]
struct PeerCq {
    map: Mapping,
    cap: u64,
    /// Our own count of entries produced; never re-read from shared memory.
    prod: Mutex<u64>,
    bell: PeerBell,
}

impl PeerCq {
    /// Checks there is room for one entry; returns the producer index to use.
    fn check_room(&self, prod: u64) -> Result<()> {
        // Both words are written by the peer: validate before trusting.
        let cons = word(&self.map, layout::CONS).load(Ordering::Acquire);
        let posted = word(&self.map, layout::POSTED).load(Ordering::Acquire);
        if cons > prod {
            return Err(Error::PeerMisbehaved(Violation::ConsumerAhead {
                cons,
                prod,
            }));
        }
        if prod - cons >= self.cap || posted <= prod {
            return Err(Error::ReceiverNotReady);
        }
        Ok(())
    }

    fn push(&self, prod: u64, imm: u32, len: u32) -> Result<()> {
        let slot = (prod % self.cap) as usize;
        word(&self.map, layout::ENTRIES + slot * layout::ENTRY)
            .store(((len as u64) << 32) | imm as u64, Ordering::Relaxed);
        word(&self.map, layout::PROD).store(prod + 1, Ordering::SeqCst);
        let armed = word(&self.map, layout::ARMED);
        if armed.load(Ordering::SeqCst) != 0 && armed.swap(0, Ordering::SeqCst) != 0 {
            self.bell.notify()?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Queue pair
// ---------------------------------------------------------------------------

/// Each region's descriptor in `fds` (one per region, in order) is a sealed
/// memfd at least as long as the region claims.
///
/// # Errors
/// [`Error::MalformedHandshake`] naming the first wrong descriptor.
pub(crate) fn check_region_memfds(h: &Hello, fds: &[OwnedFd]) -> Result<()> {
    for (i, (d, fd)) in h.regions.iter().zip(fds).enumerate() {
        crate::sys::check_peer_memfd(fd.as_fd(), d.remote.len, &format!("region {i}"))?;
    }
    Ok(())
}

/// The bytes a peer's shm hello asks us to map: its regions and its receive
/// queue (0 for a malformed endpoint, which `side::check_shm_grants` refuses).
///
/// # Errors
/// [`Error::LimitExceeded`] above `max_bytes`.
pub(crate) fn granted_bytes(h: &Hello, max_bytes: u64) -> Result<u64> {
    let cq_len = match h.endpoint.get(0..8) {
        Some(b) => u64::from_le_bytes(b.try_into().expect("8")),
        None => 0,
    };
    let bytes = h
        .regions
        .iter()
        .fold(cq_len, |sum, d| sum.saturating_add(d.remote.len));
    if bytes > max_bytes {
        return Err(Error::LimitExceeded {
            what: "bytes granted in one handshake (regions and receive queue)",
            requested: bytes,
            limit: max_bytes,
        });
    }
    Ok(bytes)
}

/// Maps the regions a peer granted (checked descriptors), in order.
fn map_regions(regions: Vec<(RemoteRegion, OwnedFd)>) -> Result<Vec<MappedRemote>> {
    regions
        .into_iter()
        .enumerate()
        .map(|(i, (desc, fd))| {
            let len = usize::try_from(desc.len)
                .map_err(|_| Error::MalformedHandshake("region length overflows".into()))?;
            Ok(MappedRemote {
                desc,
                map: Mapping::map_peer(fd, len, &format!("region {i}"))?,
            })
        })
        .collect()
}

/// A peer region mapped into our address space.
#[derive(Debug)]
pub(crate) struct MappedRemote {
    desc: RemoteRegion,
    map: Mapping,
}

/// Regions granted after the queue pair connected, by the logical
/// connections a shared queue pair carries ([`crate::vqp`]), by remote key.
/// A post holds its region's `Arc` while it copies, so a region removed
/// meanwhile is unmapped only after the copy.
pub(crate) type LaterRegions = RwLock<HashMap<u32, Arc<MappedRemote>>>;

#[derive(Debug)]
struct Peer {
    regions: Vec<MappedRemote>,
    later: Arc<LaterRegions>,
    cq: PeerCq,
    /// The bytes mapped above, counted against the listener's budget until
    /// the mappings are dropped.
    _budget: Option<crate::conn::budget::BudgetGuard>,
}

/// What the peer must receive to become our remote: our receive queue and its doorbell.
#[derive(Debug)]
pub(crate) struct ShmEndpoint<'a> {
    pub(crate) cq_fd: std::os::fd::BorrowedFd<'a>,
    pub(crate) cq_len: u64,
    pub(crate) cq_cap: u64,
    pub(crate) bell_fd: std::os::fd::BorrowedFd<'a>,
}

/// What we received from the peer to attach to it.
#[derive(Debug)]
pub(crate) struct PeerResources {
    pub(crate) regions: Vec<(RemoteRegion, OwnedFd)>,
    pub(crate) cq_fd: OwnedFd,
    pub(crate) cq_len: u64,
    pub(crate) cq_cap: u64,
    pub(crate) bell_fd: OwnedFd,
    /// The budget reservation for the bytes mapped, released with the mappings.
    pub(crate) budget: Option<crate::conn::budget::BudgetGuard>,
}

/// A post's checked ends: the peer, the pointer into its region, the region
/// itself when it was granted later (kept mapped while this lives), and the
/// local bytes. Only [`ShmQp::check_post`] makes one, after checking both ends,
/// so its copies are safe to call.
struct Checked<'a, 'l> {
    peer: &'a Peer,
    ptr: *mut u8,
    _keep: Option<Arc<MappedRemote>>,
    local: Local<'l>,
}

impl Checked<'_, '_> {
    /// The WRITE's copy: the local bytes into the peer's memory, `torn` as
    /// [`copy_out`] says.
    fn write_to_peer(&self, damage: Damage) {
        let Local {
            region,
            offset,
            len,
        } = self.local;
        // SAFETY: the source is inside our region and the destination inside
        // the peer's mapping, both checked by `check_post` for `len` bytes; the
        // mapping stays mapped while `self` (`_keep`, or the peer's own list)
        // lives; the two mappings are distinct objects.
        unsafe {
            copy_out(
                region.as_ptr().add(offset),
                self.ptr,
                len,
                damage == Damage::Torn,
            )
        };
        if damage == Damage::Flip && len > 0 {
            // SAFETY: `len / 2 < len`: inside the destination checked above
            // (a fault injected for tests: the byte a wire would alter).
            unsafe {
                let at = self.ptr.add(len / 2);
                at.write_volatile(!at.read_volatile());
            }
        }
    }

    /// The READ's copy: the peer's bytes into our region.
    fn read_from_peer(&self) {
        let Local {
            region,
            offset,
            len,
        } = self.local;
        fence(Ordering::Acquire);
        // SAFETY: the source inside the peer's mapping and the destination
        // inside our region, both checked by `check_post` and kept mapped as
        // above; `copy` tolerates overlap should both name the same memory.
        unsafe { std::ptr::copy(self.ptr, region.as_ptr().add(offset), len) };
    }
}

/// What an injected fault does to a WRITE's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    None,
    /// Only its first half lands ([`FaultConfig::torn_write_every`]).
    Torn,
    /// Its middle byte lands inverted ([`FaultConfig::corrupt_write`]).
    Flip,
}

/// An shm queue pair.
#[derive(Debug)]
pub(crate) struct ShmQp {
    cfg: QpConfig,
    scq: Arc<SendCq>,
    rcq: Arc<RecvCq>,
    peer: std::sync::OnceLock<Peer>,
    failed: Arc<FailState>,
    fault: FaultConfig,
    posts: AtomicU64,
    /// WRITEs of at least [`crate::fault::CORRUPT_MIN_LEN`] bytes posted
    /// (counted only under [`FaultConfig::corrupt_write`]).
    big_writes: AtomicU64,
    /// Set by [`ShmQp::inject_device_error`]: every later post is flushed.
    device_error: std::sync::atomic::AtomicBool,
}

impl ShmQp {
    pub(crate) fn new(cfg: &QpConfig) -> Result<Self> {
        let failed = Arc::new(FailState::default());
        Ok(ShmQp {
            cfg: cfg.clone(),
            scq: Arc::new(SendCq::new(cfg.fault().poll_miss_every(), failed.clone())?),
            rcq: Arc::new(RecvCq::new(
                cfg.recv_depth(),
                cfg.fault().poll_miss_every(),
            )?),
            peer: std::sync::OnceLock::new(),
            failed,
            fault: cfg.fault().clone(),
            posts: AtomicU64::new(0),
            big_writes: AtomicU64::new(0),
            device_error: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The send and the receive completion queue, for the seam's
    /// `provider::Cq`s (which poll them while the queue pair posts).
    pub(crate) fn cqs(&self) -> (Arc<SendCq>, Arc<RecvCq>) {
        (self.scq.clone(), self.rcq.clone())
    }

    #[inline]
    fn scq(&self) -> &SendCq {
        &self.scq
    }

    #[inline]
    fn rcq(&self) -> &RecvCq {
        &self.rcq
    }

    /// Our endpoint description, for the handshake.
    pub(crate) fn endpoint(&self) -> ShmEndpoint<'_> {
        let r = self.rcq();
        ShmEndpoint {
            cq_fd: r.map.fd(),
            cq_len: r.map.len() as u64,
            cq_cap: r.cap,
            bell_fd: r.channel.peer_end(),
        }
    }

    /// Attaches to the peer: maps its granted regions and its receive queue.
    pub(crate) fn connect(&self, res: PeerResources) -> Result<()> {
        if !res.cq_cap.is_power_of_two()
            || res.cq_cap > (1 << 20)
            || res.cq_len < (layout::ENTRIES as u64 + res.cq_cap * layout::ENTRY as u64)
            || res.cq_len > (1 << 30)
        {
            return Err(Error::MalformedHandshake(format!(
                "peer receive queue geometry invalid: capacity {} length {}",
                res.cq_cap, res.cq_len
            )));
        }
        let bell = PeerBell::new(res.bell_fd)?;
        let cq_map = Mapping::map_peer(res.cq_fd, res.cq_len as usize, "receive queue")?;
        let regions = map_regions(res.regions)?;
        let peer = Peer {
            regions,
            later: Arc::default(),
            cq: PeerCq {
                map: cq_map,
                cap: res.cq_cap,
                prod: Mutex::new(0),
                bell,
            },
            _budget: res.budget,
        };
        self.peer
            .set(peer)
            .map_err(|_| Error::InvalidConfig("queue pair already connected".into()))?;
        tracing::debug!("shm queue pair connected");
        Ok(())
    }

    pub(crate) fn fail(&self, e: &Error) {
        if self.failed.set(FailReason::from_error(e)) {
            tracing::debug!(error = %e, "queue pair failed");
        }
    }

    #[inline]
    pub(crate) fn failure(&self) -> Option<Error> {
        self.failed.get()
    }

    /// What a device that failed the queue pair does: nothing is recorded;
    /// completions not yet delivered (held back by
    /// [`FaultConfig::completion_delay_polls`]) and every later post
    /// complete [`Status::Flushed`], nothing written.
    pub(crate) fn inject_device_error(&self) {
        self.device_error.store(true, Ordering::Release);
        self.scq().flush_pending();
    }

    #[inline]
    fn ready(&self) -> Result<&Peer> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        // Not `ok_or`: every post comes here, and an `Error` made and dropped
        // on the way costs a destructor call.
        match self.peer.get() {
            Some(p) => Ok(p),
            None => Err(Error::NotConnected),
        }
    }

    /// Maps regions the peer granted after we connected (a logical
    /// connection over this queue pair) and adds them to the grants posts
    /// are checked against. Returns the table they were added to and their
    /// keys: they stay until removed from it (the seam's `LaterGrants` does
    /// on drop).
    ///
    /// # Errors
    /// [`Error::NotConnected`] before [`Self::connect`]; the mapping's
    /// error; [`Error::MalformedHandshake`] for a remote key already
    /// granted (nothing is added then).
    pub(crate) fn add_grants(
        &self,
        regions: Vec<(RemoteRegion, OwnedFd)>,
    ) -> Result<(std::sync::Weak<LaterRegions>, Vec<u32>)> {
        let peer = self.peer.get().ok_or(Error::NotConnected)?;
        let mapped = map_regions(regions)?;
        let mut later = peer.later.write().unwrap_or_else(|p| p.into_inner());
        let keys: Vec<u32> = mapped.iter().map(|m| m.desc.rkey).collect();
        crate::region::check_new_keys(&keys, |k| {
            later.contains_key(&k) || peer.regions.iter().any(|r| r.desc.rkey == k)
        })?;
        for m in mapped {
            later.insert(m.desc.rkey, Arc::new(m));
        }
        Ok((Arc::downgrade(&peer.later), keys))
    }

    /// Finds the mapped peer region and returns a pointer to `remote.addr`,
    /// with the region's `Arc` when it is one granted later (hold it while
    /// the pointer is used).
    #[inline]
    fn translate(
        peer: &Peer,
        remote: Remote,
        len: usize,
    ) -> Result<(*mut u8, Option<Arc<MappedRemote>>)> {
        if let Some(m) = peer.regions.iter().find(|m| m.desc.rkey == remote.rkey) {
            return Ok((Self::at(m, remote, len)?, None));
        }
        let m = peer
            .later
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&remote.rkey)
            .cloned()
            .ok_or(Error::BadRemoteKey { rkey: remote.rkey })?;
        Ok((Self::at(&m, remote, len)?, Some(m)))
    }

    /// A pointer to `remote.addr` inside `m`, after the bounds check.
    #[inline]
    fn at(m: &MappedRemote, remote: Remote, len: usize) -> Result<*mut u8> {
        if !m.desc.contains(remote.addr, len as u64) {
            return Err(Error::RemoteOutOfBounds {
                addr: remote.addr,
                len: len as u64,
            });
        }
        let off = (remote.addr - m.desc.addr) as usize;
        // SAFETY: `off + len <= desc.len == map.len()` (checked by `contains` and at map time).
        Ok(unsafe { m.map.ptr().add(off) })
    }

    /// Applies fault injection for the next post of `len` bytes (`write`:
    /// a WRITE or WRITE_WITH_IMM); returns (completion delay, status, the
    /// damage to its copy).
    fn faults(&self, len: usize, write: bool) -> (u32, Status, Damage) {
        let f = &self.fault;
        if f.is_inert() {
            return (0, Status::Success, Damage::None);
        }
        let n = self.posts.fetch_add(1, Ordering::Relaxed) + 1;
        let status = match f.fail_after_posts() {
            Some(k) if n > k => f.fail_status(),
            _ => Status::Success,
        };
        let damage = if f.torn_write_every().is_some_and(|k| n.is_multiple_of(k)) {
            Damage::Torn
        } else if let Some(k) = f.corrupt_write()
            && write
            && len >= crate::fault::CORRUPT_MIN_LEN
            && self.big_writes.fetch_add(1, Ordering::Relaxed) + 1 == k
        {
            Damage::Flip
        } else {
            Damage::None
        };
        (f.completion_delay_polls(), status, damage)
    }

    #[inline]
    fn complete(
        &self,
        seq: u64,
        wr_id: u64,
        opcode: Opcode,
        len: usize,
        signaled: bool,
        delay: u32,
    ) {
        if signaled {
            self.scq().push(
                seq,
                Completion {
                    wr_id,
                    status: Status::Success,
                    opcode,
                    byte_len: len as u32,
                    imm: None,
                },
                delay,
            );
        }
    }

    /// The checks every post makes before anything is written: the queue pair
    /// is connected and not failed, the local slice lies in its region, the
    /// remote range in a granted region. Returns both ends, checked.
    #[inline]
    fn check_post<'l>(&self, local: Local<'l>, remote: Remote) -> Result<Checked<'_, 'l>> {
        let peer = self.ready()?;
        local.region.check(local.offset, local.len)?;
        let (ptr, _keep) = Self::translate(peer, remote, local.len)?;
        Ok(Checked {
            peer,
            ptr,
            _keep,
            local,
        })
    }

    /// Takes a send-queue slot and draws this post's faults. `None` when an
    /// injected failure already completed the work request (nothing to copy).
    #[inline]
    fn admit(&self, wr_id: u64, opcode: Opcode, len: usize) -> Result<Option<(u64, u32, Damage)>> {
        let seq = self.scq().reserve(self.cfg.send_depth())?;
        if self.device_error.load(Ordering::Acquire) {
            self.fail_injected(seq, wr_id, opcode, Status::Flushed, 0);
            return Ok(None);
        }
        let (delay, status, torn) = self.faults(len, opcode != Opcode::Read);
        if status != Status::Success {
            self.fail_injected(seq, wr_id, opcode, status, delay);
            return Ok(None);
        }
        Ok(Some((seq, delay, torn)))
    }

    /// One WRITE, WRITE_WITH_IMM or READ: a copy between the mappings.
    #[inline]
    pub(crate) fn post(
        &self,
        wr_id: u64,
        op: SendOp,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        let checked = self.check_post(local, remote)?;
        let opcode = match op {
            SendOp::Write => Opcode::Write,
            SendOp::WriteImm(_) => Opcode::WriteImm,
            SendOp::Read => Opcode::Read,
        };
        let admitted = match op {
            SendOp::WriteImm(imm) => self.write_imm(wr_id, &checked, imm)?,
            SendOp::Write | SendOp::Read => match self.admit(wr_id, opcode, local.len)? {
                Some((seq, delay, torn)) => {
                    if op == SendOp::Read {
                        checked.read_from_peer();
                    } else {
                        checked.write_to_peer(torn);
                    }
                    Some((seq, delay))
                }
                None => None,
            },
        };
        // `None`: an injected fault took the work request.
        if let Some((seq, delay)) = admitted {
            self.complete(seq, wr_id, opcode, local.len, signaled, delay);
        }
        Ok(())
    }

    /// WRITE_WITH_IMM's write and the entry it puts on the peer's receive
    /// completion queue, under that queue's producer lock; `None` when an
    /// injected fault took the work request.
    fn write_imm(
        &self,
        wr_id: u64,
        checked: &Checked<'_, '_>,
        imm: u32,
    ) -> Result<Option<(u64, u32)>> {
        let peer = checked.peer;
        let mut prod = peer.cq.prod.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = peer.cq.check_room(*prod) {
            if matches!(e, Error::PeerMisbehaved(_)) {
                self.fail(&e);
            }
            return Err(e);
        }
        let Some((seq, delay, torn)) = self.admit(wr_id, Opcode::WriteImm, checked.local.len)?
        else {
            return Ok(None);
        };
        checked.write_to_peer(torn);
        // The entry is published whether or not waking the peer works, so
        // count it before looking at the wake-up's result.
        let woke = peer.cq.push(*prod, imm, checked.local.len as u32);
        *prod += 1;
        drop(prod);
        if let Err(e) = woke {
            self.fail(&e);
            return Err(e);
        }
        Ok(Some((seq, delay)))
    }

    pub(crate) fn post_recv(&self, wr_id: u64) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.rcq().post_recv(wr_id)
    }

    fn fail_injected(&self, seq: u64, wr_id: u64, opcode: Opcode, status: Status, delay: u32) {
        self.scq().push(
            seq,
            Completion {
                wr_id,
                status,
                opcode,
                byte_len: 0,
                imm: None,
            },
            delay,
        );
        // Like a NIC: the queue pair is in the error state from here on
        // (later posts complete flushed, nothing is written), and the
        // failure is known once the error completion is polled.
        self.device_error.store(true, Ordering::Release);
    }

    pub(crate) fn send_depth(&self) -> u32 {
        self.cfg.send_depth()
    }

    /// A WRITE completes inside its post unless an injected failure is set
    /// to surface only in a completion.
    pub(crate) fn completes_in_post(&self) -> bool {
        self.cfg.fault().fail_after_posts().is_none()
    }

    pub(crate) fn recv_depth(&self) -> u32 {
        self.rcq().cap as u32
    }

    pub(crate) fn outstanding(&self) -> u64 {
        self.scq().outstanding()
    }
}

/// WRITEs up to this many bytes (a multiple of 8, aligned) are stored as
/// atomic words: pointer words and records (rrpc-ringbuf's 16-byte tail and
/// head) are read by a polling peer while they are written.
const SMALL_WRITE: usize = 64;

/// Copies `len` bytes to peer memory and publishes them with release ordering.
///
/// # Safety
/// `src..src+len` and `dst..dst+len` must be valid for reads / writes.
#[inline]
unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize, torn: bool) {
    if len.is_multiple_of(8)
        && len <= SMALL_WRITE
        && (src as usize).is_multiple_of(8)
        && (dst as usize).is_multiple_of(8)
        && !torn
    {
        for i in (0..len).step_by(8) {
            // SAFETY: both 8-aligned and valid for `len` bytes (caller); one
            // atomic store per word makes each word untearable, as an aligned
            // 8-byte RDMA WRITE is on a NIC, and orders the words in address
            // order (a pointer record's value before its check word).
            unsafe {
                let v = (*(src.add(i) as *const AtomicU64)).load(Ordering::Relaxed);
                (*(dst.add(i) as *const AtomicU64)).store(v, Ordering::Release);
            }
        }
        return;
    }
    let n = if torn { len / 2 } else { len };
    // SAFETY: upheld by the caller; the regions are distinct mappings.
    unsafe { std::ptr::copy(src, dst, n) };
    fence(Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small aligned WRITE is stored word by word, a larger or unaligned
    /// one copied, and a torn one only in part: exactly the bytes asked for,
    /// nothing past them. Runs under miri (no descriptors involved).
    #[test]
    fn copy_out_writes_exactly_the_bytes_asked_for() {
        let mut src: Vec<u64> = (1..=16).map(|i| i * 0x0101_0101_0101_0101).collect();
        let mut dst = vec![0u64; 16];
        let s = src.as_mut_ptr().cast::<u8>();
        let d = dst.as_mut_ptr().cast::<u8>();
        // SAFETY: both buffers hold 128 bytes, are 8-aligned and distinct.
        unsafe { copy_out(s, d, SMALL_WRITE, false) };
        assert_eq!(&dst[..8], &src[..8], "stored as words");
        assert_eq!(dst[8], 0, "nothing past the end");
        // SAFETY: as above; 64 + 64 bytes stay inside both buffers.
        unsafe { copy_out(s.add(64), d.add(64), 64, true) };
        assert_eq!(&dst[8..12], &src[8..12], "a torn write lands half");
        assert_eq!(&dst[12..], &[0; 4]);
        let mut bytes = vec![0u8; 40];
        // SAFETY: 33 bytes from offset 1 of a 128-byte buffer, to offset 3
        // of a 40-byte one.
        unsafe { copy_out(s.add(1), bytes.as_mut_ptr().add(3), 33, false) };
        let want: Vec<u8> = src.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[3..36], &want[1..34], "unaligned: copied");
        assert_eq!((&bytes[..3], &bytes[36..]), (&[0u8; 3][..], &[0u8; 4][..]));
    }

    /// Several threads post and poll one send queue, as the ring's writer,
    /// its doorbell and the poller's sleep announcement do. A reserve that
    /// loaded `posted` before another thread's completion was retired saw
    /// `retired > posted`: in a debug build, a subtraction overflow panic
    /// (CI soak, `SendCq::reserve`).
    #[test]
    fn reserve_races_with_retire_from_other_threads() {
        let cq = Arc::new(SendCq::new(None, Arc::new(FailState::default())).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let cq = cq.clone();
                std::thread::spawn(move || {
                    let mut out = [Completion::EMPTY; 4];
                    for _ in 0..50_000 {
                        match cq.reserve(4) {
                            Ok(seq) => cq.push(seq, Completion::EMPTY, 0),
                            Err(Error::QueueFull { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                        let _ = cq.outstanding();
                        cq.poll(&mut out);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut out = [Completion::EMPTY; 8];
        while cq.poll(&mut out) > 0 {}
        assert_eq!(cq.outstanding(), 0);
    }

    #[test]
    fn lying_producer_index_is_refused() {
        let cq = RecvCq::new(4, None).unwrap();
        cq.post_recv(7).unwrap();
        let mut out = [Completion::EMPTY; 8];
        // A peer claims more entries than receives were posted.
        word(&cq.map, layout::PROD).store(2, Ordering::Release);
        assert!(matches!(cq.poll(&mut out), Err(Error::PeerMisbehaved(_))));
        // And the queue stays failed.
        word(&cq.map, layout::PROD).store(0, Ordering::Release);
        assert!(matches!(cq.poll(&mut out), Err(Error::PeerMisbehaved(_))));
    }

    #[test]
    fn producer_index_behind_consumer_is_refused() {
        let cq = RecvCq::new(4, None).unwrap();
        for i in 0..2 {
            cq.post_recv(i).unwrap();
        }
        word(&cq.map, layout::ENTRIES).store(5, Ordering::Relaxed);
        word(&cq.map, layout::PROD).store(1, Ordering::Release);
        let mut out = [Completion::EMPTY; 8];
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].imm, Some(5));
        word(&cq.map, layout::PROD).store(u64::MAX, Ordering::Release);
        assert!(matches!(cq.poll(&mut out), Err(Error::PeerMisbehaved(_))));
    }

    #[test]
    fn producer_checks_consumer_words() {
        let cq = RecvCq::new(4, None).unwrap();
        let fd = cq.map.fd().try_clone_to_owned().unwrap();
        let peer = PeerCq {
            map: Mapping::map_peer(fd, cq.map.len(), "receive queue").unwrap(),
            cap: cq.cap,
            prod: Mutex::new(0),
            bell: PeerBell::new(
                BellRx::new()
                    .unwrap()
                    .peer_end()
                    .try_clone_to_owned()
                    .unwrap(),
            )
            .unwrap(),
        };
        assert!(matches!(peer.check_room(0), Err(Error::ReceiverNotReady)));
        cq.post_recv(1).unwrap();
        peer.check_room(0).unwrap();
        // A consumer index ahead of what we produced is a lie.
        word(&cq.map, layout::CONS).store(9, Ordering::Release);
        assert!(matches!(peer.check_room(0), Err(Error::PeerMisbehaved(_))));
    }
}
