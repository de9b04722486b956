//! The virtual provider: a sharer's queue pair over a hardware queue pair
//! (KRCore's virtualized QP, Algorithm 2), behind the public face
//! [`crate::vqp`] (whose module docs say what keeps sharers apart).
//!
//! The hardware queue pair is reached through [`Hardware`], which
//! [`crate::QueuePair`] implements: the virtual queue pair *is* one of the
//! seam's variants (`provider::Qp::Virtual`) and is built on the seam at the
//! same time, so it must not name the public queue pair's type (that would
//! close an import circle through `qp`).

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use crate::error::{Error, Result};
use crate::fail::{FailReason, FailState};
use crate::region::{Local, Remote};
use crate::settings::QpCarrier;
use crate::sys::EventFd;
use crate::work::{Completion, SendOp as Op, Status};

/// What a virtual queue pair needs of the hardware queue pair under it:
/// the public queue pair's operations, its two completion queues told apart
/// by `recv`.
pub(crate) trait Hardware: std::fmt::Debug + Send + Sync {
    /// A send work request ([`crate::QueuePair::post_write`] and siblings).
    fn post(
        &self,
        wr_id: u64,
        op: Op,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()>;
    /// [`crate::QueuePair::post_recv`].
    fn post_recv(&self, wr_id: u64) -> Result<()>;
    /// [`crate::CompletionQueue::poll`] of the send (`recv == false`) or the
    /// receive completion queue.
    fn poll(&self, recv: bool, out: &mut [Completion]) -> Result<usize>;
    /// [`crate::CompletionQueue::req_notify`], as [`Self::poll`].
    fn req_notify(&self, recv: bool) -> Result<()>;
    /// [`crate::CompletionQueue::channel_fd`], as [`Self::poll`].
    fn channel_fd(&self, recv: bool) -> Result<BorrowedFd<'_>>;
    /// [`crate::CompletionQueue::ack_events`], as [`Self::poll`].
    fn ack_events(&self, recv: bool) -> Result<u64>;
    /// [`crate::QueuePair::inject_device_error`].
    fn inject_device_error(&self) -> Result<()>;
    /// [`crate::QueuePair::failure`].
    fn failure(&self) -> Option<Error>;
    /// [`crate::QueuePair::send_depth`].
    fn send_depth(&self) -> u32;
    /// [`crate::QueuePair::recv_depth`].
    fn recv_depth(&self) -> u32;
    /// [`crate::QueuePair::outstanding`].
    fn outstanding(&self) -> u64;
    /// [`crate::QueuePair::carrier`].
    fn carrier(&self) -> QpCarrier;
}

/// One hardware queue pair carrying many logical connections, as
/// [`crate::vqp::PhysicalQp`] shares it.
#[derive(Debug)]
pub(crate) struct Shared {
    qp: Arc<dyn Hardware>,
    depth: u64,
    signal_every: u32,
    tag_bits: u32,
    full_wait: Duration,
    state: Mutex<State>,
    pub(crate) stats: Stats,
    /// The event channels' descriptors of sharers gone (send, receive), at
    /// most [`SPARE_WAKES`] each: a sharer attached later takes them
    /// instead of making its own (an eventfd, an epoll set and two
    /// `epoll_ctl`s: a lane's connect and close make none).
    wakes: Mutex<[Vec<Wake>; 2]>,
}

/// Spare event channels kept per direction ([`Shared::wakes`]).
const SPARE_WAKES: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) posted: AtomicU64,
    pub(crate) hidden_signals: AtomicU64,
    pub(crate) dispatched: AtomicU64,
    pub(crate) stale: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) misrouted: AtomicU64,
    pub(crate) full_waits: AtomicU64,
    /// Event channels made (an eventfd and an epoll set each), not taken
    /// from a sharer gone ([`Shared::wakes`]).
    pub(crate) channels_made: AtomicU64,
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
    /// Where its channels' descriptors go when it drops ([`Shared::wakes`]).
    home: std::sync::Weak<Shared>,
}

impl Drop for SharerCore {
    fn drop(&mut self) {
        let Some(home) = self.home.upgrade() else {
            return;
        };
        for (i, ch) in [&mut self.send_ev, &mut self.recv_ev]
            .into_iter()
            .enumerate()
        {
            // A wake written for the sharer gone would only wake the next
            // one for nothing; drained anyway.
            if let Some(w) = ch.fds.take()
                && w.own.drain().is_ok()
            {
                let mut spare = home.wakes.lock().unwrap_or_else(|p| p.into_inner());
                if spare[i].len() < SPARE_WAKES {
                    spare[i].push(w);
                }
            }
        }
    }
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

    /// The descriptors, on first use a sharer gone's (`spare`) or made
    /// with `hardware`, the hardware completion queue's channel.
    fn fds(&self, hardware: BorrowedFd<'_>, spare: impl FnOnce() -> Option<Wake>) -> Result<&Wake> {
        if let Some(w) = self.fds.get() {
            return Ok(w);
        }
        let w = match spare() {
            Some(w) => w,
            None => Wake::new(hardware)?,
        };
        // Two threads may both make one here; the loser's is dropped.
        let _ = self.fds.set(w);
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

impl Shared {
    /// Shares `qp`, on which the caller posted the layer's receives.
    pub(crate) fn new(
        qp: Arc<dyn Hardware>,
        depth: u32,
        signal_every: u32,
        tag_bits: u32,
        full_wait: Duration,
    ) -> Shared {
        Shared {
            qp,
            depth: u64::from(depth),
            signal_every,
            tag_bits,
            full_wait,
            state: Mutex::new(State::default()),
            stats: Stats::default(),
            wakes: Mutex::new([Vec::new(), Vec::new()]),
        }
    }

    /// A sharer attached under `local_tag` whose `WRITE_WITH_IMM`s go to the
    /// peer's sharer `peer_tag`: its queue pair, and its send and receive
    /// completion queues ([`crate::vqp::PhysicalQp::attach`]).
    pub(crate) fn attach(
        self: &Arc<Self>,
        local_tag: u32,
        peer_tag: u32,
    ) -> Result<(VirtualQp, Arc<Sharer>, Arc<Sharer>)> {
        let s = self;
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
            home: Arc::downgrade(s),
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
        Ok((
            VirtualQp {
                sharer: send.clone(),
            },
            send,
            recv,
        ))
    }

    /// Whether a sharer is attached under `tag` now.
    pub(crate) fn is_attached(&self, tag: u32) -> bool {
        self.lock().sharers.contains_key(tag)
    }

    /// High bits of an immediate that name the receiving sharer.
    pub(crate) fn tag_bits(&self) -> u32 {
        self.tag_bits
    }

    /// Sharers attached now.
    pub(crate) fn sharers(&self) -> usize {
        self.lock().sharers.len()
    }

    /// Polls the hardware queues and dispatches what they hold.
    pub(crate) fn progress(&self) -> Result<()> {
        let mut st = self.lock();
        self.progress_send(&mut st)?;
        self.progress_recv(&mut st)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Algorithm 2's `poll_inner`: polls the hardware send queue and
    /// dispatches every completion. Returns how many it polled.
    fn progress_send(&self, st: &mut State) -> Result<usize> {
        let mut buf = [Completion::EMPTY; 32];
        let mut total = 0;
        loop {
            let n = self.qp.poll(false, &mut buf)?;
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
            let n = self.qp.poll(true, &mut buf)?;
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
                        slot.core.fail.set(FailReason::Misbehaved(
                            crate::error::Violation::SharerOverrun {
                                tag,
                                depth: slot.recv_depth,
                            },
                        ));
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

/// A virtual queue pair (`provider::Qp::Virtual`); its completion queues
/// are the two [`Sharer`]s [`Shared::attach`] returns with it.
#[derive(Debug)]
pub(crate) struct VirtualQp {
    sharer: Arc<Sharer>,
}

impl VirtualQp {
    /// What carries the physical queue pair this one shares.
    pub(crate) fn physical_carrier(&self) -> QpCarrier {
        self.sharer.phys.qp.carrier()
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
        // Again under the lock: `fail` takes it after setting the reason,
        // so once `fail` returns no post of this sharer is still writing
        // (a lane's close then tells the peer the truth: its slots take
        // no more of our bytes, and it may reuse them).
        if let Some(e) = s.core.fail.get() {
            return Err(e);
        }
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
        p.qp.post(hw_id, op, local, remote, hw_signaled)?;
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

    /// Fails this sharer. When it returns, no post of this sharer is in
    /// progress and none will start: a post checks the reason again under
    /// the physical queue pair's lock, and this waits for that lock once
    /// the reason is set (on shm a post copies into the peer's memory
    /// under it, so a lane's slots are free of our writes before its
    /// close goes out).
    pub(crate) fn fail(&self, reason: &Error) {
        let s = &self.sharer;
        if s.core.fail.set(FailReason::from_error(reason)) {
            drop(s.phys.lock());
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

    fn fds(&self) -> Result<&Wake> {
        self.wake().fds(self.phys.qp.channel_fd(self.recv)?, || {
            let spare = self.phys.wakes.lock().unwrap_or_else(|p| p.into_inner())
                [usize::from(self.recv)]
            .pop();
            if spare.is_none() {
                self.phys
                    .stats
                    .channels_made
                    .fetch_add(1, Ordering::Relaxed);
            }
            spare
        })
    }

    pub(crate) fn req_notify(&self) -> Result<()> {
        self.fds()?;
        self.wake().armed.store(true, Ordering::SeqCst);
        self.phys.qp.req_notify(self.recv)
    }

    pub(crate) fn channel_fd(&self) -> Result<BorrowedFd<'_>> {
        Ok(self.fds()?.epoll.0.as_fd())
    }

    pub(crate) fn ack_events(&self) -> Result<u64> {
        let wake = self.wake();
        // An event consumes the arm, as on a hardware queue.
        wake.armed.store(false, Ordering::SeqCst);
        let p = &self.phys;
        let mut n = self.phys.qp.ack_events(self.recv)?;
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

    /// A hardware queue pair that never completes anything, its channels
    /// eventfds: enough for the sharers' event channels.
    #[derive(Debug)]
    struct Idle {
        channels: [EventFd; 2],
    }

    impl Hardware for Idle {
        fn post(&self, _: u64, _: Op, _: Local<'_>, _: Remote, _: bool) -> Result<()> {
            Ok(())
        }
        fn post_recv(&self, _: u64) -> Result<()> {
            Ok(())
        }
        fn poll(&self, _: bool, _: &mut [Completion]) -> Result<usize> {
            Ok(0)
        }
        fn req_notify(&self, _: bool) -> Result<()> {
            Ok(())
        }
        fn channel_fd(&self, recv: bool) -> Result<BorrowedFd<'_>> {
            Ok(self.channels[usize::from(recv)].as_fd())
        }
        fn ack_events(&self, _: bool) -> Result<u64> {
            Ok(0)
        }
        fn inject_device_error(&self) -> Result<()> {
            Ok(())
        }
        fn failure(&self) -> Option<Error> {
            None
        }
        fn send_depth(&self) -> u32 {
            16
        }
        fn recv_depth(&self) -> u32 {
            16
        }
        fn outstanding(&self) -> u64 {
            0
        }
        fn carrier(&self) -> QpCarrier {
            unreachable!("not asked")
        }
    }

    fn readable(fd: BorrowedFd<'_>) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        poll(&mut [PollFd::new(fd, PollFlags::POLLIN)], PollTimeout::ZERO).expect("poll") == 1
    }

    fn made(s: &Shared) -> u64 {
        s.stats.channels_made.load(Ordering::Relaxed)
    }

    /// A sharer gone leaves its event channels to the next one (a lane's
    /// connect makes no eventfd nor epoll set), drained: a wake written
    /// for the sharer gone does not wake the next one.
    #[test]
    fn a_sharer_takes_the_event_channels_of_one_gone() {
        let hw = Idle {
            channels: [EventFd::new().unwrap(), EventFd::new().unwrap()],
        };
        let shared = Arc::new(Shared::new(
            Arc::new(hw),
            16,
            4,
            8,
            Duration::from_millis(10),
        ));
        let (qp, send, recv) = shared.attach(1, 1).unwrap();
        send.req_notify().unwrap();
        recv.req_notify().unwrap();
        assert_eq!(made(&shared), 2);
        // Woken, never acknowledged.
        recv.wake().wake_if_armed();
        assert!(readable(recv.channel_fd().unwrap()), "the wake fires");
        drop((qp, send, recv));
        for tag in [2, 3] {
            let (qp, send, recv) = shared.attach(tag, tag).unwrap();
            send.req_notify().unwrap();
            recv.req_notify().unwrap();
            assert_eq!(made(&shared), 2, "sharer {tag} made its own");
            assert!(!readable(recv.channel_fd().unwrap()), "a stale wake");
            assert!(!readable(send.channel_fd().unwrap()), "a stale wake");
            drop((qp, send, recv));
        }
        // Two at once: the second makes its own.
        let a = shared.attach(4, 4).unwrap();
        let b = shared.attach(5, 5).unwrap();
        a.1.req_notify().unwrap();
        b.1.req_notify().unwrap();
        assert_eq!(made(&shared), 3);
    }

    #[test]
    fn wr_id_round_trips() {
        for (tag, generation, user) in [(0, 0, false), (4095, u32::MAX, true), (0xFFFF, 7, true)] {
            assert_eq!(
                decode(encode(tag, generation, user)),
                (tag, generation, user)
            );
        }
    }
}
