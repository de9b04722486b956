//! Lanes: logical connections over a [`SharedConnection`]'s open side
//! channel, their rings in arenas granted when it opened (`mux` module
//! docs for the protocol; this is its driver's synchronous half, on shm).
//!
//! * **Opening.** Each end adds [`LaneArenas`] to the shared connection's
//!   opening handshake: its receive arena granted under [`ROLE_ARENA`]
//!   (the memfd passed and mapped once, with the handshake's budget and
//!   bounds), the arena's slots named in the section of that role. Its
//!   staging arena is never granted.
//! * **A lane** is a sharer of the shared queue pair under its tag, rings
//!   in one slot of each end's arenas ([`Region::view`]), and a
//!   [`Connection`] with no side channel of its own: its liveness is a
//!   [`Liveness`] (no descriptor) kept here too while the lane is open,
//!   and ended when the peer closes the lane or the shared side channel
//!   closes; its watchers (the poller's registrations, `peer_gone`) are
//!   woken then, and its queue pair is failed first.
//! * **The reader.** One task of the layer above watches the shared side
//!   channel ([`Connection::liveness_fd`]) and calls
//!   [`SharedConnection::lane_poll`] when it is readable: it reads every
//!   whole message, runs the protocol and returns what the layer above
//!   must act on ([`LaneEvent`]). An error there is the peer's fault or
//!   the peer gone: the shared connection is failed, and with it each of
//!   its lanes, and only those.
//! * **Closing.** A lane's [`Connection`] closed ([`Connection::close`],
//!   on the caller's thread: nothing waits) or dropped fails its queue
//!   pair (it writes no more) and sends the close, once; its slots come
//!   back when the peer answers (`mux` docs, "Close").
//! * **Memory.** A slot back whose lane's connection has dropped too (its
//!   rings touch it no more) has its pages punched out of both of this
//!   end's arenas ([`Region::discard`]), but for the [`LANE_WARM_SLOTS`]
//!   freed last, which the next lanes take first (no page faults). A slot
//!   back whose lane's connection is still here is not taken again until
//!   it drops.
//!
//! The arenas stay mapped as long as the shared connection: no lane maps
//! or unmaps anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::arenas::{
    LANE_WARM_BYTES, LANE_WARM_SLOTS, LANE_WARM_TAIL, LANE_WRITE_WAIT, LaneEvent, LaneSlots,
    LaneState, Lanes,
};
use super::established::Connection;
use super::exchange::PeerInfo;
use super::liveness::Liveness;
use super::logical::SharedConnection;
use super::mux::{MuxEvent, MuxMessage, Parts, Slice};
use crate::error::{Error, Result};
use crate::handshake::{MAGIC, RegionDesc, Section};
use crate::region::{Region, RemoteRegion};

#[cfg(test)]
mod tests;

impl SharedConnection {
    fn lanes(&self) -> Result<&Lanes> {
        self.lanes
            .as_ref()
            .ok_or_else(|| Error::InvalidConfig("this shared connection has no lanes".into()))
    }

    fn lane_state(&self) -> Result<std::sync::MutexGuard<'_, LaneState>> {
        Ok(self
            .lanes()?
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether its ends granted each other arenas (lanes run over it).
    pub fn has_lanes(&self) -> bool {
        self.lanes.is_some()
    }

    /// Lanes open (or opening, or closing) now.
    pub fn lanes_open(&self) -> usize {
        self.lane_state().map_or(0, |s| s.mux.tags().count())
    }

    /// Whether lane `tag` is open, opening or closing here (a new lane
    /// may not take it yet).
    pub fn lane_tag_taken(&self, tag: u32) -> bool {
        self.lane_state().is_ok_and(|s| s.mux.is_taken(tag))
    }

    /// Free slots of our arenas.
    pub fn lane_free_slots(&self) -> usize {
        self.lane_state().map_or(0, |s| s.mux.free_slots())
    }

    /// Slots for one lane whose rings need `rx_len` and `tx_len` bytes;
    /// `None` when the arenas are full, or have no slot that large.
    /// Give them back with [`Self::lane_untake`] if no open or answer
    /// names them.
    pub fn lane_slots(&self, rx_len: usize, tx_len: usize) -> Option<LaneSlots> {
        let lanes = self.lanes().ok()?;
        if tx_len > lanes.ours.tx_slot {
            return None;
        }
        let slice = {
            let mut s = self.lane_state().ok()?;
            // A slot whose last lane's connection is still here is not
            // taken: its rings may still touch it.
            let mut skipped = Vec::new();
            let taken = loop {
                match s.mux.take_slot(rx_len as u64) {
                    Some(sl) if s.alive.contains(&(sl.arena, sl.offset)) => skipped.push(sl),
                    other => break other,
                }
            };
            if !skipped.is_empty() {
                s.mux.untake(&skipped);
                self.release_slots(&mut s);
            }
            let slice = taken?;
            s.warm
                .retain(|w| (w.arena, w.offset) != (slice.arena, slice.offset));
            s.held
                .retain(|w| (w.arena, w.offset) != (slice.arena, slice.offset));
            slice
        };
        match self.lane_views(slice, rx_len, tx_len) {
            Ok(slots) => Some(slots),
            Err(e) => {
                tracing::warn!(error = %e, "lane slot unusable");
                self.lane_untake(slice);
                None
            }
        }
    }

    /// The receive and staging regions of our slot `slice` (taken with
    /// [`Self::lane_slots`], or granted ahead and opened), for rings that
    /// need `rx_len` and `tx_len` bytes.
    ///
    /// # Errors
    /// No lanes; a slot shorter than asked.
    pub fn lane_views(&self, slice: Slice, rx_len: usize, tx_len: usize) -> Result<LaneSlots> {
        let lanes = self.lanes()?;
        if tx_len > lanes.ours.tx_slot {
            return Err(Error::InvalidConfig(format!(
                "a staging ring of {tx_len} bytes in slots of {}",
                lanes.ours.tx_slot
            )));
        }
        let i = slice.offset as usize / lanes.ours.rx_slot;
        let rx = Region::view(&lanes.ours.rx, slice.offset as usize, rx_len)?;
        let tx = Region::view(&lanes.ours.tx, i * lanes.ours.tx_slot, tx_len)?;
        Ok(LaneSlots {
            rx: Arc::new(rx),
            tx: Arc::new(tx),
            slice,
        })
    }

    /// Gives back a slot of [`Self::lane_slots`] that nothing named.
    pub fn lane_untake(&self, slice: Slice) {
        if let Ok(mut s) = self.lane_state() {
            s.mux.untake(&[slice]);
            self.release_slots(&mut s);
        }
    }

    /// Gives the memory of the slots the protocol freed back to the system
    /// (`Region::discard`), but for the [`LANE_WARM_SLOTS`] freed last:
    /// the receive slot (nobody writes it: the close handshake is done)
    /// and the staging slot of the same index (the lane's queue pair
    /// failed: it stages nothing more). An idle shared connection holds
    /// the pages of lanes open and of those few slots.
    fn release_slots(&self, s: &mut LaneState) {
        let Ok(lanes) = self.lanes() else {
            return;
        };
        let o = &lanes.ours;
        // Gives back the pages of slot `i` but its first `head` and last
        // `tail` bytes, in both arenas.
        let discard = |i: usize, head: usize, tail: usize| {
            let r = [(&o.rx, o.rx_slot), (&o.tx, o.tx_slot)]
                .into_iter()
                .filter(|(_, slot)| *slot > head + tail)
                .try_for_each(|(region, slot)| {
                    region
                        .discard(i * slot + head, slot - head - tail)
                        .map(drop)
                });
            if let Err(e) = r {
                tracing::debug!(slot = i, error = %e, "lane slot's memory kept");
            }
        };
        for sl in s.mux.take_released() {
            if s.alive.contains(&(sl.arena, sl.offset)) {
                if !s.held.contains(&sl) {
                    s.held.push(sl);
                }
            } else {
                s.warm.push_back(sl);
                s.trim.push(sl);
            }
        }
        // What became warm keeps only its first LANE_WARM_BYTES.
        for sl in s.trim.drain(..) {
            discard(
                sl.offset as usize / o.rx_slot,
                LANE_WARM_BYTES,
                LANE_WARM_TAIL,
            );
        }
        while s.warm.len() > LANE_WARM_SLOTS {
            let Some(sl) = s.warm.pop_front() else { break };
            discard(sl.offset as usize / o.rx_slot, 0, 0);
        }
    }

    /// A lane's [`Connection`] dropped: its rings touch `slots` no more,
    /// so those given back already may give their pages back.
    fn lane_gone(&self, slots: &[Slice]) {
        let Ok(mut s) = self.lane_state() else {
            return;
        };
        for sl in slots {
            s.alive.remove(&(sl.arena, sl.offset));
        }
        let s = &mut *s;
        let (free, still): (Vec<Slice>, Vec<Slice>) = s
            .held
            .drain(..)
            .partition(|h| !s.alive.contains(&(h.arena, h.offset)));
        s.held = still;
        s.trim.extend_from_slice(&free);
        s.warm.extend(free);
        self.release_slots(s);
    }

    /// Bytes of memory our lane arenas hold now ([`Region::allocated_bytes`]):
    /// the pages of slots in use (and of slots taken, not yet given back).
    ///
    /// # Errors
    /// No lanes; the system call's.
    pub fn lane_arena_bytes(&self) -> Result<usize> {
        let o = &self.lanes()?.ours;
        Ok(o.rx.allocated_bytes()? + o.tx.allocated_bytes()?)
    }

    /// Sends a message on the side channel (with the state locked).
    fn lane_send(&self, frame: &[u8]) -> Result<()> {
        let Some(side) = &self.connection().side else {
            return Err(Error::NotConnected);
        };
        side.write_all_within(frame, LANE_WRITE_WAIT).map_err(|e| {
            // The peer is gone, or reads nothing: its lanes cannot go on.
            self.connection().mark_gone();
            Error::io("side channel write", e)
        })
    }

    /// Client: asks for lane `tag` offering `parts` (its slice from
    /// [`Self::lane_slots`]): the request id. The answer comes from
    /// [`Self::lane_poll`].
    ///
    /// # Errors
    /// As [`Mux::open`](crate::conn::mux::Mux::open); the side channel's.
    pub fn lane_open(&self, tag: u32, parts: Parts) -> Result<u32> {
        let mut s = self.lane_state()?;
        // Attached first: the server may write as soon as it answers.
        let qp = self.physical().attach(tag, tag)?;
        let (req, frame) = s.mux.open(tag, parts)?;
        s.attached.insert(tag, qp);
        self.lane_send(&frame)?;
        Ok(req)
    }

    /// Client: opens lane `tag` ahead (0-RTT, `mux` docs), offering
    /// `parts` (its slice from [`Self::lane_slots`]) and writing into a
    /// slot the server granted ahead, named under `role` in the lane's
    /// peer: `None` when no slot is in hand, or when `fits`, asked under
    /// the lanes' lock, says the answer granted ahead (its sections) is not
    /// the one this open needs (the slices of `parts` are still the
    /// caller's then: open with [`Self::lane_open`]); else the request id
    /// and the lane's connection, open now (the server's confirmation
    /// comes to [`Self::lane_poll`]; a server that will not serve it
    /// refuses it, which closes it).
    ///
    /// # Errors
    /// As [`Self::lane_open`]; the lane's connection could not be made (it
    /// is then closed once confirmed). After an error the slots of `parts`
    /// are no longer the caller's: given back, or the lane's until its
    /// close.
    pub fn lane_open_ahead(
        self: &Arc<Self>,
        tag: u32,
        parts: Parts,
        role: u16,
        fits: impl FnOnce(&[(u16, Vec<u8>)]) -> bool,
    ) -> Result<Option<(u32, Connection)>> {
        let mut s = self.lane_state()?;
        let ours: Vec<Slice> = parts.slices.iter().map(|(_, sl)| *sl).collect();
        if s.mux.ahead_left() == 0 || !fits(s.mux.ahead_sections()) {
            return Ok(None);
        }
        let (req, frame, theirs) = match s.mux.open_ahead(tag, parts, role) {
            Ok(Some(x)) => x,
            Ok(None) => return Ok(None),
            Err(e) => {
                s.mux.untake(&ours);
                self.release_slots(&mut s);
                return Err(e);
            }
        };
        let conn = self.lane_connection(&mut s, tag, &theirs, ours);
        let sent = self.lane_send(&frame);
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                // Closed once the server confirms it.
                let _ = s.mux.close(tag);
                return Err(e);
            }
        };
        // The connection is dropped (and tells us, locking) only after the
        // lock is released.
        drop(s);
        sent.map(|()| Some((req, conn)))
    }

    /// Client: slots of the server's granted ahead, in hand.
    pub fn lane_ahead_left(&self) -> usize {
        self.lane_state().map_or(0, |s| s.mux.ahead_left())
    }

    /// Server: grants the client slots of ours ahead (`mux::Mux::credit`:
    /// taken with [`Self::lane_slots`], their rings' records reset).
    ///
    /// # Errors
    /// As [`Mux::credit`](crate::conn::mux::Mux::credit) (the slots are
    /// given back then); the side channel's (they are granted: the shared
    /// connection fails). Either way they are no longer the caller's.
    pub fn lane_credit(&self, parts: Parts) -> Result<()> {
        let mut s = self.lane_state()?;
        let slots: Vec<Slice> = parts.slices.iter().map(|(_, sl)| *sl).collect();
        let frame = match s.mux.credit(parts) {
            Ok(f) => f,
            Err(e) => {
                s.mux.untake(&slots);
                self.release_slots(&mut s);
                return Err(e);
            }
        };
        self.lane_send(&frame)
    }

    /// Server: our slots granted ahead, not opened yet.
    pub fn lane_credited(&self) -> usize {
        self.lane_state().map_or(0, |s| s.mux.credited())
    }

    /// Lanes opened ahead over it, in all: sent (client) or received
    /// (server).
    pub fn lanes_opened_ahead(&self) -> u64 {
        self.lane_state().map_or(0, |s| s.mux.opened_ahead())
    }

    /// Client: the connect of request `req` gave up; the lane is closed
    /// when it opens.
    pub fn lane_abandon(&self, req: u32) {
        if let Ok(mut s) = self.lane_state() {
            s.mux.abandon(req);
        }
    }

    /// Server: accepts request `req` for lane `tag` (what the client
    /// offered in `theirs`), offering `ours` (our slice from
    /// [`Self::lane_slots`]): the lane's connection, set up before the
    /// answer goes out.
    ///
    /// # Errors
    /// As [`Self::lane_open`]; a tag still attached here (the client is
    /// refused then, saying so).
    pub fn lane_accept(
        self: &Arc<Self>,
        req: u32,
        tag: u32,
        theirs: &Parts,
        ours: Parts,
    ) -> Result<Connection> {
        let mut s = self.lane_state()?;
        // Opened ahead: our slot is the one granted ahead, and ours names none.
        let ahead = ours.slices.is_empty();
        let ours_slots: Vec<Slice> = if ahead {
            s.mux.slots_of(tag)
        } else {
            ours.slices.iter().map(|(_, sl)| *sl).collect()
        };
        let conn = match self.lane_connection(&mut s, tag, theirs, ours_slots.clone()) {
            Ok(c) => c,
            Err(e) => {
                // No answer named our slots: they are free again (a slot
                // granted ahead comes back with the close of the lane).
                if !ahead {
                    s.mux.untake(&ours_slots);
                    self.release_slots(&mut s);
                }
                let frame = s.mux.refuse(req, &e.to_string())?;
                self.lane_send(&frame)?;
                return Err(e);
            }
        };
        // The connection is dropped (and tells us, locking) only after the
        // lock is released.
        let sent = s.mux.accept(req, ours).and_then(|f| self.lane_send(&f));
        drop(s);
        sent.map(|()| conn)
    }

    /// Server: refuses request `req`, saying why.
    ///
    /// # Errors
    /// As [`Mux::refuse`](crate::conn::mux::Mux::refuse); the side channel's.
    pub fn lane_refuse(&self, req: u32, reason: &str) -> Result<()> {
        let mut s = self.lane_state()?;
        let frame = s.mux.refuse(req, reason)?;
        self.lane_send(&frame)
    }

    /// Lane `tag`'s connection: a sharer of the queue pair, the peer's
    /// sections and its slices as regions of its arena, and its liveness
    /// (kept in `s` too, to end it).
    fn lane_connection(
        self: &Arc<Self>,
        s: &mut LaneState,
        tag: u32,
        theirs: &Parts,
        ours: Vec<Slice>,
    ) -> Result<Connection> {
        let arena = self.lanes()?.peer_arena;
        let qp = match s.attached.remove(&tag) {
            Some(qp) => qp,
            None => self.physical().attach(tag, tag)?,
        };
        let live = Liveness::new();
        let peer = PeerInfo {
            sections: theirs
                .sections
                .iter()
                .map(|(role, b)| Section {
                    tag: *role,
                    bytes: b.clone(),
                })
                .collect(),
            // Slices were checked against the arena's bounds (`mux`).
            regions: theirs
                .slices
                .iter()
                .map(|(role, sl)| RegionDesc {
                    role: *role,
                    remote: RemoteRegion {
                        addr: arena.addr + sl.offset,
                        len: sl.len,
                        rkey: arena.rkey,
                    },
                })
                .collect(),
            provider: self.connection().peer().provider,
        };
        let key = self.connection().peer_key();
        let mut conn = Connection::lane(live.clone(), qp, peer, key);
        conn.logical = Some(Box::new(LaneHold {
            shared: self.clone(),
            tag,
            closed: AtomicBool::new(false),
            ours: ours.clone(),
        }));
        s.alive.extend(ours.iter().map(|sl| (sl.arena, sl.offset)));
        s.ends.insert(tag, (live, conn.qp().clone()));
        Ok(conn)
    }

    /// Reads what the peer sent on the side channel (without waiting) and
    /// runs the protocol: what the layer above must act on. Call it when
    /// [`Connection::liveness_fd`] of [`Self::connection`] is readable,
    /// from one task.
    ///
    /// # Errors
    /// The peer left ([`Error::PeerGone`]) or broke the protocol (`mux`):
    /// the shared connection is failed, and every lane over it.
    pub fn lane_poll(self: &Arc<Self>) -> Result<Vec<LaneEvent>> {
        // Declared before the lock, so dropped after it: an event's
        // connection dropped (on an error below) tells us, locking.
        let mut events = Vec::new();
        let mut s = self.lane_state()?;
        let r = self.lane_poll_locked(&mut s, &mut events);
        if let Err(e) = r {
            self.connection().mark_gone();
            // The peer sees its shared connection close: it is done.
            if let Some(side) = &self.connection().side {
                side.shutdown();
            }
            // Nothing more is written into their rings, then every lane's
            // watchers see it end.
            for (_, (live, qp)) in s.ends.drain() {
                qp.fail(&Error::PeerGone);
                live.end();
            }
            s.attached.clear();
            drop(s);
            return Err(e);
        }
        drop(s);
        Ok(events)
    }

    fn lane_poll_locked(
        self: &Arc<Self>,
        s: &mut LaneState,
        events: &mut Vec<LaneEvent>,
    ) -> Result<()> {
        let Some(side) = &self.connection().side else {
            return Err(Error::NotConnected);
        };
        loop {
            match side.read(&mut s.chunk) {
                Ok(0) => return Err(Error::PeerGone),
                Ok(n) => {
                    let LaneState { buf, chunk, .. } = s;
                    buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Error::PeerGone),
            }
        }
        let mut at = 0;
        loop {
            let rest = &s.buf[at..];
            // The side channel's own goodbye: the peer closed the shared
            // connection.
            if rest.len() >= MAGIC.len() && rest[..MAGIC.len()] == MAGIC {
                return Err(Error::PeerGone);
            }
            let Some((m, used)) = MuxMessage::decode(rest)? else {
                break;
            };
            at += used;
            match s.mux.handle(m)? {
                MuxEvent::Nothing => {}
                // An open given up on, closed when answered, or refused:
                // its sharer goes (none is left for a lane that opened).
                MuxEvent::Closed { tag } => {
                    s.attached.remove(&tag);
                }
                MuxEvent::Send(frame) => self.lane_send(&frame)?,
                MuxEvent::Granted { .. } => {
                    return Err(Error::MalformedHandshake(
                        "a later lane arena grant (not supported: arenas are granted at the \
                         opening)"
                            .into(),
                    ));
                }
                MuxEvent::OpenRequested {
                    req,
                    tag,
                    parts,
                    ahead,
                } => {
                    events.push(LaneEvent::OpenRequested {
                        req,
                        tag,
                        parts,
                        ahead,
                    });
                }
                // The lane's connection was made when it was opened; the
                // slots in hand are the mux's.
                MuxEvent::OpenedAhead { .. } | MuxEvent::Ahead => {}
                MuxEvent::Opened { req, tag, parts } => {
                    let ours = s.mux.slots_of(tag);
                    let conn = self.lane_connection(s, tag, &parts, ours);
                    if conn.is_err() {
                        // Nothing to hand out: closed at once.
                        if let Some(frame) = s.mux.close(tag)? {
                            self.lane_send(&frame)?;
                        }
                    }
                    events.push(LaneEvent::Opened { req, conn });
                }
                MuxEvent::Refused { req, tag, reason } => {
                    s.attached.remove(&tag);
                    events.push(LaneEvent::Refused { req, reason });
                }
                MuxEvent::RefusedAhead {
                    tag, reason, reply, ..
                } => {
                    // Its calls fail with the server's reason.
                    if let Some((live, qp)) = s.ends.remove(&tag) {
                        qp.fail(&Error::Rejected(reason));
                        live.end();
                    }
                    self.lane_send(&reply)?;
                }
                MuxEvent::PeerClosed { tag, reply } => {
                    // Stop writing into its rings, then say so.
                    if let Some((live, qp)) = s.ends.remove(&tag) {
                        qp.fail(&Error::PeerGone);
                        live.end();
                    }
                    self.lane_send(&reply)?;
                }
            }
        }
        s.buf.drain(..at);
        self.release_slots(s);
        Ok(())
    }

    /// Lane `tag` was dropped here (its queue pair failed: it writes no
    /// more): closes it, if it is open.
    fn lane_dropped(&self, tag: u32) {
        let Ok(mut s) = self.lane_state() else {
            return;
        };
        s.ends.remove(&tag);
        if let Ok(Some(frame)) = s.mux.close(tag)
            && let Err(e) = self.lane_send(&frame)
        {
            tracing::debug!(tag, error = %e, "lane close not sent");
        }
    }
}

/// What a lane's [`Connection`] holds: its shared connection, which it
/// tells when it closes or drops (once: the tag may be another lane's by
/// the time the connection drops).
#[derive(Debug)]
struct LaneHold {
    shared: Arc<SharedConnection>,
    tag: u32,
    closed: AtomicBool,
    /// Our slots its rings use.
    ours: Vec<Slice>,
}

impl LaneHold {
    fn close_once(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.shared.lane_dropped(self.tag);
        }
    }
}

impl super::established::LogicalHold for LaneHold {
    /// Called when the lane's connection drops, its queue pair failed:
    /// sends the close unless [`Connection::close`] did (its grants are
    /// slots, nothing to retire).
    fn retire(&self, _grants: Vec<(u16, Arc<Region>)>) {
        self.close_once();
        self.shared.lane_gone(&self.ours);
    }

    /// [`Connection::close`] of a lane: the close, on this thread (one
    /// message on the shared side channel, bounded by its write wait).
    fn close_now(&self) {
        self.close_once();
    }

    fn is_lane(&self) -> bool {
        true
    }
}
