//! Shared queue pairs: many logical connections over one hardware queue pair
//! (KRCore's virtualized QP, §4.4 and Algorithm 2).
//!
//! A [`PhysicalQp`] wraps one connected [`QueuePair`]. Each
//! [`PhysicalQp::attach`] returns a *virtual* [`QueuePair`] that the layers
//! above use exactly like a dedicated one: the same posts, the same send and
//! receive [`CompletionQueue`]s, the same errors. So
//! queue pairs are bounded by peers, not by connections.
//!
//! ## What keeps sharers apart
//! * **Malformed requests never reach the hardware queue.** Every post is
//!   checked (local slice, remote key and bounds) before anything is written,
//!   as on a dedicated queue pair; a refused post returns its error to the
//!   sharer that made it and leaves the queue pair, and everyone else on it,
//!   untouched.
//! * **No sharer can overflow the queue.** Each post is pre-checked against
//!   the hardware queue's remaining capacity. A work request occupies its slot
//!   until a *signaled* completion at or after it is polled, so the layer
//!   counts the unsignaled ones too: it signals, on its own account, one work
//!   request in every [`VqpConfig::signal_every`] (and the one that takes the
//!   last free slot), so the queue always holds a completion that will retire
//!   what lies before it. When the queue is full, a post polls the hardware
//!   completion queue and dispatches what it finds before it goes on
//!   (Algorithm 2, lines 6–7), for at most [`VqpConfig::full_wait`]; then it
//!   returns [`Error::QueueFull`].
//! * **Completions go to the sharer that asked.** The hardware `wr_id` encodes
//!   the sharer's tag and generation, and whether the sharer asked for the
//!   signal; the sharer's own `wr_id`s wait in its software queue in post
//!   order (RC completes in order) and are handed back by its send completion
//!   queue. Completions of the layer's own signals, and of sharers that have
//!   detached (an older generation), are retired and dropped.
//! * **Receives.** The layer keeps [`VqpConfig::recv_depth`] receives posted
//!   on the hardware queue pair. A `WRITE_WITH_IMM` carries the *receiving*
//!   sharer's tag in the top [`VqpConfig::tag_bits`] of its immediate; the
//!   sharer's own immediate is the rest (a wider one is refused with
//!   [`Error::InvalidConfig`]). The completion is routed to that sharer and
//!   consumes one of the receives it posted on its virtual queue pair. A
//!   write that comes before the sharer posted a receive waits for its next
//!   one, as a NIC's RNR retry holds it on a dedicated queue pair (a
//!   connection's first message can outrun its receiver's setup); a peer
//!   that writes more than the sharer's receive depth ahead fails that
//!   sharer only ([`Error::PeerMisbehaved`]). An immediate naming no sharer
//!   is counted and dropped ([`VqpStats::misrouted`]).
//!
//! What sharers cannot escape: a dead peer, or a device error, fails the
//! hardware queue pair, and with it every sharer on it (all connect to the
//! same peer). [`QueuePair::fail`] on a virtual queue pair fails that sharer
//! only.
//!
//! ## Completion events
//! A virtual completion queue's [`channel_fd`](crate::CompletionQueue::channel_fd)
//! is an epoll descriptor watching the hardware queue's channel and the
//! sharer's own eventfd. Whoever polls the hardware queue dispatches, and
//! wakes an armed sharer it dispatched to through that eventfd, so a sharer
//! never misses a completion another sharer polled for it. `ack_events`
//! acknowledges the hardware channel's events and dispatches what came.
//! These two descriptors are made on a sharer's first `req_notify` or
//! `channel_fd`, so a polled sharer holds no descriptor at all; if they
//! cannot be made, `req_notify` returns the error and `channel_fd` logs
//! it and returns -1.
//!
//! ## Tags
//! Both ends attach their halves of one logical connection under tags they
//! agree on out of band (in the connection's own handshake): `attach(local,
//! peer)` names the tag this side receives under and the tag the peer
//! receives under. A tag is unique per [`PhysicalQp`] while attached.
//!
//! ## DCT
//! KRCore virtualizes *dynamically connected* transport (DCT) queue pairs,
//! which reach any peer without a handshake. DCT exists only on mlx5 NICs
//! (`mlx5dv_create_qp`), so rrpc shares RC queue pairs, one per peer. The
//! design leaves room for DCT: a `PhysicalQp` over a DC initiator would take
//! the peer's DCT number and key per post (from a metadata cache, as KRCore's
//! `DCCache`), and the sharing rules above are unchanged. It is not built.

use crate::work::SendOp as Op;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use crate::cq::{Completion, CompletionQueue, CqInner, Status};
use crate::error::{Error, Result};
use crate::fail::{FailReason, FailState};
use crate::qp::{QpInner, QueuePair};
use crate::region::{Local, Remote};
use crate::sys::EventFd;

/// Configuration of a [`PhysicalQp`]. Defaults in the field docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VqpConfig {
    tag_bits: u32,
    signal_every: Option<u32>,
    recv_depth: Option<u32>,
    full_wait: Duration,
}

impl Default for VqpConfig {
    fn default() -> Self {
        VqpConfig {
            tag_bits: 12,
            signal_every: None,
            recv_depth: None,
            full_wait: Duration::from_secs(1),
        }
    }
}

impl VqpConfig {
    /// High bits of a `WRITE_WITH_IMM`'s immediate that name the receiving
    /// sharer. Default 12: up to 4096 sharers per hardware queue pair, and
    /// 20 bits of immediate data for each.
    pub fn get_tag_bits(&self) -> u32 {
        self.tag_bits
    }

    /// Sets [`get_tag_bits`](Self::get_tag_bits).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless `1 <= bits <= 16`.
    pub fn tag_bits(mut self, bits: u32) -> Result<Self> {
        if !(1..=16).contains(&bits) {
            return Err(Error::InvalidConfig(format!(
                "tag_bits must be in 1..=16, got {bits}"
            )));
        }
        self.tag_bits = bits;
        Ok(self)
    }

    /// The layer signals at least one work request in this many. `None`
    /// (default): a quarter of the hardware send depth.
    pub fn get_signal_every(&self) -> Option<u32> {
        self.signal_every
    }

    /// Sets [`get_signal_every`](Self::get_signal_every) (clamped to the send depth at
    /// [`PhysicalQp::new`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for 0.
    pub fn signal_every(mut self, n: u32) -> Result<Self> {
        if n == 0 {
            return Err(Error::InvalidConfig(
                "signal_every must be at least 1".into(),
            ));
        }
        self.signal_every = Some(n);
        Ok(self)
    }

    /// Receives the layer keeps posted on the hardware queue pair. `None`
    /// (default): the queue pair's receive depth.
    pub fn get_recv_depth(&self) -> Option<u32> {
        self.recv_depth
    }

    /// Sets [`get_recv_depth`](Self::get_recv_depth) (at most the queue pair's receive depth).
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = Some(n);
        self
    }

    /// How long a post waits for room on a full hardware queue, polling
    /// it, before it returns [`Error::QueueFull`]. Default 1 s.
    pub fn get_full_wait(&self) -> Duration {
        self.full_wait
    }

    /// Sets [`get_full_wait`](Self::get_full_wait).
    pub fn full_wait(mut self, d: Duration) -> Self {
        self.full_wait = d;
        self
    }
}

/// Counters of one [`PhysicalQp`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VqpStats {
    /// Work requests posted on the hardware queue pair.
    pub posted: u64,
    /// Of those, signaled by the layer where the sharer did not ask.
    pub hidden_signals: u64,
    /// Send completions dispatched to a sharer.
    pub dispatched: u64,
    /// Completions for a sharer that had detached, dropped.
    pub stale: u64,
    /// Writes with immediate routed to a sharer (completing a receive, or
    /// held for its next one).
    pub received: u64,
    /// Receive completions whose immediate named no attached sharer.
    pub misrouted: u64,
    /// Times a post found the hardware queue full and polled for room.
    pub full_waits: u64,
}

/// One hardware queue pair carrying many logical connections (module docs).
/// Cheap to clone; the hardware queue pair lives while a clone or a virtual
/// queue pair does.
#[derive(Debug, Clone)]
pub struct PhysicalQp {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    qp: Arc<QueuePair>,
    depth: u64,
    signal_every: u32,
    tag_bits: u32,
    full_wait: Duration,
    state: Mutex<State>,
    stats: Stats,
}

#[derive(Debug, Default)]
struct Stats {
    posted: AtomicU64,
    hidden_signals: AtomicU64,
    dispatched: AtomicU64,
    stale: AtomicU64,
    received: AtomicU64,
    misrouted: AtomicU64,
    full_waits: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    sharers: Sharers,
    next_gen: u32,
    /// Hardware work requests posted since the last signaled one.
    unsignaled_run: u32,
}

/// The attached sharers, indexed by tag (tags are below `2^tag_bits`, at
/// most 65536): a post or a dispatch finds its sharer without hashing.
#[derive(Debug, Default)]
struct Sharers {
    slots: Vec<Option<Slot>>,
    len: usize,
}

impl Sharers {
    fn get(&self, tag: u32) -> Option<&Slot> {
        self.slots.get(tag as usize).and_then(Option::as_ref)
    }
    fn get_mut(&mut self, tag: u32) -> Option<&mut Slot> {
        self.slots.get_mut(tag as usize).and_then(Option::as_mut)
    }
    /// The slot of `tag` if it still belongs to `generation` (not a sharer
    /// attached later under the same tag).
    fn current(&mut self, tag: u32, generation: u32) -> Option<&mut Slot> {
        self.get_mut(tag).filter(|s| s.generation == generation)
    }
    fn contains_key(&self, tag: u32) -> bool {
        self.get(tag).is_some()
    }
    fn insert(&mut self, tag: u32, slot: Slot) {
        let i = tag as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].replace(slot).is_none() {
            self.len += 1;
        }
    }
    fn remove(&mut self, tag: u32) {
        if let Some(s) = self.slots.get_mut(tag as usize)
            && s.take().is_some()
        {
            self.len -= 1;
        }
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A sharer's software queues (Algorithm 2's `comp_queue`, and its receives).
#[derive(Debug)]
struct Slot {
    generation: u32,
    /// `wr_id`s of the sharer's signaled work requests, in post order.
    pending: VecDeque<u64>,
    /// Send completions ready for the sharer.
    ready: VecDeque<Completion>,
    /// `wr_id`s of the receives the sharer posted, in post order.
    recvs: VecDeque<u64>,
    recv_depth: usize,
    /// Receive completions ready for the sharer.
    recv_ready: VecDeque<Completion>,
    /// Writes with immediate that came before the sharer posted a receive
    /// for them, oldest first: each completes the sharer's next receive.
    /// On a dedicated queue pair the NIC holds such a write (RNR retry)
    /// until a receive is posted; at most `recv_depth` wait here.
    early: VecDeque<Completion>,
    core: Arc<SharerCore>,
}

/// What a sharer's handle and its slot both hold.
#[derive(Debug)]
struct SharerCore {
    fail: FailState,
    send_ev: Channel,
    recv_ev: Channel,
}

/// One virtual completion queue's event channel, its descriptors made on
/// first use (a polled sharer holds none).
#[derive(Debug)]
struct Channel {
    armed: AtomicBool,
    fds: OnceLock<Wake>,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            armed: AtomicBool::new(false),
            fds: OnceLock::new(),
        }
    }

    /// The descriptors, made on first use with `hardware`, the hardware
    /// completion queue's channel.
    fn fds(&self, hardware: BorrowedFd<'_>) -> Result<&Wake> {
        if let Some(w) = self.fds.get() {
            return Ok(w);
        }
        // Two threads may both make one here; the loser's is dropped.
        let _ = self.fds.set(Wake::new(hardware)?);
        Ok(self.fds.get().expect("set above"))
    }

    fn wake_if_armed(&self) {
        if self.armed.load(Ordering::SeqCst)
            && self.armed.swap(false, Ordering::SeqCst)
            && let Some(w) = self.fds.get()
        {
            let _ = w.own.notify();
        }
    }
}

/// The descriptors of a [`Channel`]: an eventfd that dispatchers write,
/// and an epoll set of it and the hardware channel.
#[derive(Debug)]
struct Wake {
    own: EventFd,
    epoll: Epoll,
}

impl Wake {
    /// `hardware` is the hardware queue's channel; epoll keeps no borrow
    /// of it (it drops the registration itself when the descriptor closes).
    fn new(hardware: BorrowedFd<'_>) -> Result<Wake> {
        let own = EventFd::new()?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| Error::nix("epoll_create", e))?;
        epoll
            .add(own.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))
            .map_err(|e| Error::nix("epoll_ctl", e))?;
        epoll
            .add(hardware, EpollEvent::new(EpollFlags::EPOLLIN, 1))
            .map_err(|e| Error::nix("epoll_ctl", e))?;
        Ok(Wake { own, epoll })
    }
}

/// The hardware `wr_id` of a sharer's work request.
const WR_USER_SIGNALED: u64 = 1 << 63;

fn encode(tag: u32, generation: u32, user_signaled: bool) -> u64 {
    (u64::from(tag) << 32)
        | u64::from(generation)
        | if user_signaled { WR_USER_SIGNALED } else { 0 }
}

fn decode(wr_id: u64) -> (u32, u32, bool) {
    (
        ((wr_id >> 32) & 0xFFFF) as u32,
        wr_id as u32,
        wr_id & WR_USER_SIGNALED != 0,
    )
}

impl PhysicalQp {
    /// Shares `qp`, a connected queue pair that nothing else posts on or
    /// polls from now on, and posts the layer's receives on it.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a receive depth above the queue pair's;
    /// the error of a failed queue pair.
    pub fn new(qp: Arc<QueuePair>, cfg: VqpConfig) -> Result<PhysicalQp> {
        if matches!(qp.inner, QpInner::Virtual(_)) {
            return Err(Error::InvalidConfig(
                "a shared queue pair cannot itself be shared".into(),
            ));
        }
        let depth = qp.send_depth();
        let signal_every = cfg.signal_every.unwrap_or((depth / 4).max(1)).min(depth);
        let recv_depth = cfg.recv_depth.unwrap_or(qp.recv_depth());
        if recv_depth > qp.recv_depth() {
            return Err(Error::InvalidConfig(format!(
                "shared receive depth {recv_depth} above the queue pair's {}",
                qp.recv_depth()
            )));
        }
        for _ in 0..recv_depth {
            qp.post_recv(0)?;
        }
        tracing::debug!(depth, signal_every, recv_depth, "shared queue pair ready");
        Ok(PhysicalQp {
            shared: Arc::new(Shared {
                qp,
                depth: u64::from(depth),
                signal_every,
                tag_bits: cfg.tag_bits,
                full_wait: cfg.full_wait,
                state: Mutex::new(State::default()),
                stats: Stats::default(),
            }),
        })
    }

    /// A virtual queue pair over this one: it receives under `local_tag`,
    /// and its `WRITE_WITH_IMM`s go to the peer's sharer `peer_tag`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a tag that does not fit
    /// [`VqpConfig::tag_bits`] or is already attached.
    pub fn attach(&self, local_tag: u32, peer_tag: u32) -> Result<QueuePair> {
        let s = &self.shared;
        let max = 1u32 << s.tag_bits;
        if local_tag >= max || peer_tag >= max {
            return Err(Error::InvalidConfig(format!(
                "sharer tags must be below {max} ({} tag bits), got {local_tag} and {peer_tag}",
                s.tag_bits
            )));
        }
        let core = Arc::new(SharerCore {
            fail: FailState::default(),
            send_ev: Channel::new(),
            recv_ev: Channel::new(),
        });
        let mut st = s.lock();
        if st.sharers.contains_key(local_tag) {
            return Err(Error::InvalidConfig(format!(
                "sharer tag {local_tag} is already attached"
            )));
        }
        st.next_gen = st.next_gen.wrapping_add(1);
        let generation = st.next_gen;
        st.sharers.insert(
            local_tag,
            Slot {
                generation,
                pending: VecDeque::new(),
                ready: VecDeque::new(),
                recvs: VecDeque::new(),
                recv_depth: s.qp.recv_depth() as usize,
                recv_ready: VecDeque::new(),
                early: VecDeque::new(),
                core: core.clone(),
            },
        );
        drop(st);
        let handle = |recv| {
            Arc::new(Sharer {
                phys: s.clone(),
                tag: local_tag,
                peer_tag,
                generation,
                core: core.clone(),
                recv,
            })
        };
        let send = handle(false);
        let recv = handle(true);
        Ok(QueuePair {
            inner: QpInner::Virtual(VirtualQp {
                send_cq: CompletionQueue {
                    inner: CqInner::Virtual(send.clone()),
                },
                recv_cq: CompletionQueue {
                    inner: CqInner::Virtual(recv),
                },
                sharer: send,
            }),
        })
    }

    /// Whether a sharer is attached under `tag` now.
    pub fn is_attached(&self, tag: u32) -> bool {
        self.shared.lock().sharers.contains_key(tag)
    }

    /// The number of sharer tags ([`VqpConfig::tag_bits`]): tags run from 0
    /// to this, exclusive.
    pub fn tags(&self) -> u32 {
        1 << self.shared.tag_bits
    }

    /// Sharers attached now.
    pub fn sharers(&self) -> usize {
        self.shared.lock().sharers.len()
    }

    /// The hardware queue pair.
    pub fn hardware(&self) -> &Arc<QueuePair> {
        &self.shared.qp
    }

    /// The counters so far.
    pub fn stats(&self) -> VqpStats {
        let s = &self.shared.stats;
        VqpStats {
            posted: s.posted.load(Ordering::Relaxed),
            hidden_signals: s.hidden_signals.load(Ordering::Relaxed),
            dispatched: s.dispatched.load(Ordering::Relaxed),
            stale: s.stale.load(Ordering::Relaxed),
            received: s.received.load(Ordering::Relaxed),
            misrouted: s.misrouted.load(Ordering::Relaxed),
            full_waits: s.full_waits.load(Ordering::Relaxed),
        }
    }

    /// Polls the hardware queues and dispatches what they hold (posts and
    /// polls on virtual queue pairs do this themselves).
    ///
    /// # Errors
    /// The hardware completion queue's error.
    pub fn progress(&self) -> Result<()> {
        let mut st = self.shared.lock();
        self.shared.progress_send(&mut st)?;
        self.shared.progress_recv(&mut st)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Algorithm 2's `poll_inner`: polls the hardware send queue and
    /// dispatches every completion. Returns how many it polled.
    fn progress_send(&self, st: &mut State) -> Result<usize> {
        let mut buf = [Completion::EMPTY; 32];
        let mut total = 0;
        loop {
            let n = self.qp.send_cq().poll(&mut buf)?;
            total += n;
            for c in &buf[..n] {
                let (tag, generation, user) = decode(c.wr_id);
                if !user {
                    continue;
                }
                match st.sharers.current(tag, generation) {
                    Some(slot) => {
                        let wr_id = slot.pending.pop_front().unwrap_or(0);
                        slot.ready.push_back(Completion { wr_id, ..*c });
                        self.stats.dispatched.fetch_add(1, Ordering::Relaxed);
                        slot.core.send_ev.wake_if_armed();
                    }
                    None => {
                        self.stats.stale.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if n < buf.len() {
                return Ok(total);
            }
        }
    }

    /// Polls the hardware receive queue, reposts a receive for each
    /// completion, and routes each to the sharer its immediate names.
    fn progress_recv(&self, st: &mut State) -> Result<()> {
        let mut buf = [Completion::EMPTY; 32];
        loop {
            let n = self.qp.recv_cq().poll(&mut buf)?;
            for c in &buf[..n] {
                if c.status != Status::Success {
                    // A flushed receive (the hardware queue pair failed)
                    // carries no immediate and so names no sharer: every
                    // sharer learns the failure from the hardware queue
                    // pair itself (`failure()`); wake those that sleep.
                    for slot in st.sharers.slots.iter().flatten() {
                        slot.core.recv_ev.wake_if_armed();
                    }
                    continue;
                }
                self.qp.post_recv(0)?;
                let Some(imm) = c.imm else {
                    self.stats.misrouted.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let shift = 32 - self.tag_bits;
                let tag = imm >> shift;
                let Some(slot) = st.sharers.get_mut(tag) else {
                    self.stats.misrouted.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                self.stats.received.fetch_add(1, Ordering::Relaxed);
                let c = Completion {
                    imm: Some(imm & (u32::MAX >> self.tag_bits)),
                    ..*c
                };
                let Some(wr_id) = slot.recvs.pop_front() else {
                    // No receive posted yet (a connection's first message
                    // can outrun its receiver's setup): held for the next
                    // one, as a NIC's RNR retry holds it; a peer writing
                    // more than the sharer could ever have posted for is
                    // misbehaving.
                    if slot.early.len() >= slot.recv_depth {
                        slot.core.fail.set(FailReason::Misbehaved(format!(
                            "peer wrote with immediate to sharer {tag} more than its {} \
                             receives before any was posted",
                            slot.recv_depth
                        )));
                        slot.core.recv_ev.wake_if_armed();
                    } else {
                        slot.early.push_back(c);
                    }
                    continue;
                };
                slot.recv_ready.push_back(Completion { wr_id, ..c });
                slot.core.recv_ev.wake_if_armed();
            }
            if n < buf.len() {
                return Ok(());
            }
        }
    }
}

/// A virtual queue pair's handle on its sharer (one for posting and the send
/// queue, one for the receive queue).
#[derive(Debug)]
pub(crate) struct Sharer {
    phys: Arc<Shared>,
    tag: u32,
    peer_tag: u32,
    generation: u32,
    core: Arc<SharerCore>,
    recv: bool,
}

/// The [`QpInner`] of a virtual queue pair.
#[derive(Debug)]
pub(crate) struct VirtualQp {
    pub(crate) send_cq: CompletionQueue,
    pub(crate) recv_cq: CompletionQueue,
    sharer: Arc<Sharer>,
}

impl VirtualQp {
    /// The physical queue pair this one shares.
    pub(crate) fn physical(&self) -> &QueuePair {
        &self.sharer.phys.qp
    }
}

impl Drop for VirtualQp {
    fn drop(&mut self) {
        let s = &self.sharer;
        let mut st = s.phys.lock();
        if st.sharers.current(s.tag, s.generation).is_some() {
            st.sharers.remove(s.tag);
        }
    }
}

impl VirtualQp {
    pub(crate) fn post(
        &self,
        wr_id: u64,
        op: Op,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        let s = &self.sharer;
        let p = &s.phys;
        self.failure().map_or(Ok(()), Err)?;
        // The receiving sharer's tag goes in the immediate's top bits.
        let op = match op {
            Op::WriteImm(imm) => {
                let user_bits = 32 - p.tag_bits;
                if imm >> user_bits != 0 {
                    return Err(Error::InvalidConfig(format!(
                        "a shared queue pair carries {user_bits} bits of immediate data, got {imm:#x}"
                    )));
                }
                Op::WriteImm((s.peer_tag << user_bits) | imm)
            }
            other => other,
        };
        let mut st = p.lock();
        // Algorithm 2, lines 6-7: room for this request first.
        if p.qp.outstanding() >= p.depth {
            p.stats.full_waits.fetch_add(1, Ordering::Relaxed);
            let deadline = Instant::now() + p.full_wait;
            loop {
                p.progress_send(&mut st)?;
                if p.qp.outstanding() < p.depth {
                    break;
                }
                if let Some(e) = p.qp.failure() {
                    return Err(e);
                }
                if Instant::now() >= deadline {
                    return Err(Error::QueueFull {
                        depth: p.depth as u32,
                    });
                }
                std::hint::spin_loop();
            }
        }
        // Signal where the sharer asked, once in `signal_every`, and on the
        // request that takes the last free slot: the queue then always holds
        // a completion that retires what lies before it.
        let hw_signaled = signaled
            || st.unsignaled_run + 1 >= p.signal_every
            || p.qp.outstanding() + 1 >= p.depth;
        let Some(slot) = st.sharers.current(s.tag, s.generation) else {
            return Err(Error::NotConnected);
        };
        let hw_id = encode(s.tag, s.generation, signaled);
        match op {
            Op::Write => p.qp.post_write(hw_id, local, remote, hw_signaled)?,
            Op::WriteImm(imm) => {
                p.qp.post_write_imm(hw_id, local, remote, imm, hw_signaled)?
            }
            Op::Read => p.qp.post_read(hw_id, local, remote, hw_signaled)?,
        }
        if signaled {
            slot.pending.push_back(wr_id);
        }
        p.stats.posted.fetch_add(1, Ordering::Relaxed);
        if hw_signaled {
            if !signaled {
                p.stats.hidden_signals.fetch_add(1, Ordering::Relaxed);
            }
            st.unsignaled_run = 0;
        } else {
            st.unsignaled_run += 1;
        }
        Ok(())
    }

    pub(crate) fn post_recv(&self, wr_id: u64) -> Result<()> {
        let s = &self.sharer;
        self.failure().map_or(Ok(()), Err)?;
        let mut st = s.phys.lock();
        let Some(slot) = st.sharers.current(s.tag, s.generation) else {
            return Err(Error::NotConnected);
        };
        if slot.recvs.len() + slot.recv_ready.len() >= slot.recv_depth {
            return Err(Error::QueueFull {
                depth: slot.recv_depth as u32,
            });
        }
        if let Some(c) = slot.early.pop_front() {
            // A write that came before this receive completes it now.
            slot.recv_ready.push_back(Completion { wr_id, ..c });
            slot.core.recv_ev.wake_if_armed();
        } else {
            slot.recvs.push_back(wr_id);
        }
        Ok(())
    }

    pub(crate) fn fail(&self, reason: &Error) {
        let s = &self.sharer;
        if s.core.fail.set(FailReason::from_error(reason)) {
            s.core.send_ev.wake_if_armed();
            s.core.recv_ev.wake_if_armed();
        }
    }

    pub(crate) fn inject_device_error(&self) -> Result<()> {
        self.sharer.phys.qp.inject_device_error()
    }

    pub(crate) fn failure(&self) -> Option<Error> {
        self.sharer
            .core
            .fail
            .get()
            .or_else(|| self.sharer.phys.qp.failure())
    }

    pub(crate) fn send_depth(&self) -> u32 {
        self.sharer.phys.qp.send_depth()
    }

    pub(crate) fn recv_depth(&self) -> u32 {
        self.sharer.phys.qp.recv_depth()
    }

    pub(crate) fn imm_bits(&self) -> u32 {
        32 - self.sharer.phys.tag_bits
    }

    /// The sharer's signaled work requests not yet handed back.
    pub(crate) fn outstanding(&self) -> u64 {
        let s = &self.sharer;
        let mut st = s.phys.lock();
        st.sharers
            .current(s.tag, s.generation)
            .map_or(0, |x| (x.pending.len() + x.ready.len()) as u64)
    }
}

impl Sharer {
    fn wake(&self) -> &Channel {
        if self.recv {
            &self.core.recv_ev
        } else {
            &self.core.send_ev
        }
    }

    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let p = &self.phys;
        let mut st = p.lock();
        if self.recv {
            p.progress_recv(&mut st)?;
        } else {
            p.progress_send(&mut st)?;
        }
        let Some(slot) = st.sharers.current(self.tag, self.generation) else {
            return Ok(0);
        };
        let q = if self.recv {
            &mut slot.recv_ready
        } else {
            &mut slot.ready
        };
        let mut n = 0;
        while n < out.len() {
            let Some(c) = q.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        if n == 0 && self.recv {
            // A receive this sharer never posted was consumed for it.
            if let Some(e) = self.core.fail.get() {
                return Err(e);
            }
        }
        Ok(n)
    }

    /// The hardware completion queue this sharer's completions come from.
    fn hardware_cq(&self) -> &crate::CompletionQueue {
        if self.recv {
            self.phys.qp.recv_cq()
        } else {
            self.phys.qp.send_cq()
        }
    }

    fn fds(&self) -> Result<&Wake> {
        self.wake().fds(self.hardware_cq().channel_fd()?)
    }

    pub(crate) fn req_notify(&self) -> Result<()> {
        self.fds()?;
        self.wake().armed.store(true, Ordering::SeqCst);
        self.hardware_cq().req_notify()
    }

    pub(crate) fn channel_fd(&self) -> Result<BorrowedFd<'_>> {
        Ok(self.fds()?.epoll.0.as_fd())
    }

    pub(crate) fn ack_events(&self) -> Result<u64> {
        let wake = self.wake();
        // An event consumes the arm, as on a hardware queue.
        wake.armed.store(false, Ordering::SeqCst);
        let p = &self.phys;
        let mut n = self.hardware_cq().ack_events()?;
        // Dispatch what the hardware channel announced, so the poll that
        // follows finds it (and other armed sharers are woken); then drain
        // our own eventfd, which that dispatch may not write to any more.
        {
            let mut st = p.lock();
            if self.recv {
                p.progress_recv(&mut st)?;
            } else {
                p.progress_send(&mut st)?;
            }
        }
        if let Some(w) = wake.fds.get() {
            n += w.own.drain()?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_id_round_trips() {
        for (tag, generation, user) in [(0, 0, false), (4095, u32::MAX, true), (0xFFFF, 7, true)] {
            assert_eq!(
                decode(encode(tag, generation, user)),
                (tag, generation, user)
            );
        }
    }

    #[test]
    fn config_bounds() {
        assert!(VqpConfig::default().tag_bits(0).is_err());
        assert!(VqpConfig::default().tag_bits(17).is_err());
        assert!(VqpConfig::default().signal_every(0).is_err());
        assert_eq!(VqpConfig::default().get_tag_bits(), 12);
    }
}
