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
//!   [`Connection`] whose side channel is one end of a socket pair: the
//!   other end stays here while the lane is open, and dropping it (the
//!   peer closed the lane, or the shared side channel closed) is what the
//!   lane's liveness watchers see. Nothing else changes for them.
//! * **The reader.** One task of the layer above watches the shared side
//!   channel ([`Connection::liveness_fd`]) and calls
//!   [`SharedConnection::lane_poll`] when it is readable: it reads every
//!   whole message, runs the protocol and returns what the layer above
//!   must act on ([`LaneEvent`]). An error there is the peer's fault or
//!   the peer gone: the shared connection is failed, and with it each of
//!   its lanes, and only those.
//! * **Closing.** A lane's [`Connection`] dropped fails its queue pair
//!   (it writes no more) and sends the close; its slots come back when the
//!   peer answers (`mux` docs, "Close").
//!
//! The arenas stay mapped as long as the shared connection: no lane maps
//! or unmaps anything.

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::arenas::{LANE_WRITE_WAIT, LaneEvent, LaneSlots, LaneState, Lanes};
use super::established::Connection;
use super::exchange::PeerInfo;
use super::logical::SharedConnection;
use super::mux::{MuxEvent, MuxMessage, Parts, Slice};
use crate::error::{Error, Result};
use crate::handshake::{MAGIC, RegionDesc, Section};
use crate::provider::side::Side;
use crate::region::{Region, RemoteRegion};

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
        let slice = self.lane_state().ok()?.mux.take_slot(rx_len as u64)?;
        let i = slice.offset as usize / lanes.ours.rx_slot;
        let views = Region::view(&lanes.ours.rx, slice.offset as usize, rx_len).and_then(|rx| {
            Ok((
                rx,
                Region::view(&lanes.ours.tx, i * lanes.ours.tx_slot, tx_len)?,
            ))
        });
        match views {
            Ok((rx, tx)) => Some(LaneSlots {
                rx: Arc::new(rx),
                tx: Arc::new(tx),
                slice,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "lane slot unusable");
                self.lane_untake(slice);
                None
            }
        }
    }

    /// Gives back a slot of [`Self::lane_slots`] that nothing named.
    pub fn lane_untake(&self, slice: Slice) {
        if let Ok(mut s) = self.lane_state() {
            s.mux.untake(&[slice]);
        }
    }

    /// Sends a message on the side channel (with the state locked).
    fn lane_send(&self, frame: &[u8]) -> Result<()> {
        self.connection()
            .side
            .write_all_within(frame, LANE_WRITE_WAIT)
            .map_err(|e| {
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
        let (req, frame) = s.mux.open(tag, parts)?;
        self.lane_send(&frame)?;
        Ok(req)
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
        let conn = match self.lane_connection(&mut s, tag, theirs) {
            Ok(c) => c,
            Err(e) => {
                // No answer named our slots: they are free again.
                let slots: Vec<Slice> = ours.slices.iter().map(|(_, sl)| *sl).collect();
                s.mux.untake(&slots);
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
    /// sections and its slices as regions of its arena, and one end of a
    /// socket pair as its side channel (the other kept in `s`).
    fn lane_connection(
        self: &Arc<Self>,
        s: &mut LaneState,
        tag: u32,
        theirs: &Parts,
    ) -> Result<Connection> {
        let arena = self.lanes()?.peer_arena;
        let qp = self.physical().attach(tag, tag)?;
        let (mine, kept) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
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
        let mut conn = Connection::new(Side::Unix(mine), qp, peer, Vec::new())?;
        conn.logical = Some(Box::new(LaneHold {
            shared: self.clone(),
            tag,
        }));
        s.ends.insert(tag, (kept, conn.qp().clone()));
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
            self.connection().side.shutdown();
            // Every lane's watcher sees its socket close; nothing more
            // is written into their rings.
            for (_, (end, qp)) in s.ends.drain() {
                qp.fail(&Error::PeerGone);
                drop(end);
            }
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
        let mut chunk = [0u8; 4096];
        loop {
            match self.connection().side.read(&mut chunk) {
                Ok(0) => return Err(Error::PeerGone),
                Ok(n) => s.buf.extend_from_slice(&chunk[..n]),
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
                MuxEvent::Nothing | MuxEvent::Closed { .. } => {}
                MuxEvent::Send(frame) => self.lane_send(&frame)?,
                MuxEvent::Granted { .. } => {
                    return Err(Error::MalformedHandshake(
                        "a later lane arena grant (not supported: arenas are granted at the \
                         opening)"
                            .into(),
                    ));
                }
                MuxEvent::OpenRequested { req, tag, parts } => {
                    events.push(LaneEvent::OpenRequested { req, tag, parts });
                }
                MuxEvent::Opened { req, tag, parts } => {
                    let conn = self.lane_connection(s, tag, &parts);
                    if conn.is_err() {
                        // Nothing to hand out: closed at once.
                        let frame = s.mux.close(tag)?;
                        self.lane_send(&frame)?;
                    }
                    events.push(LaneEvent::Opened { req, conn });
                }
                MuxEvent::Refused { req, reason, .. } => {
                    events.push(LaneEvent::Refused { req, reason });
                }
                MuxEvent::PeerClosed { tag, reply } => {
                    // Stop writing into its rings, then say so.
                    if let Some((end, qp)) = s.ends.remove(&tag) {
                        qp.fail(&Error::PeerGone);
                        drop(end);
                    }
                    self.lane_send(&reply)?;
                }
            }
        }
        s.buf.drain(..at);
        Ok(())
    }

    /// Lane `tag` was dropped here (its queue pair failed: it writes no
    /// more): closes it, if it is open.
    fn lane_dropped(&self, tag: u32) {
        let Ok(mut s) = self.lane_state() else {
            return;
        };
        s.ends.remove(&tag);
        if let Ok(frame) = s.mux.close(tag)
            && let Err(e) = self.lane_send(&frame)
        {
            tracing::debug!(tag, error = %e, "lane close not sent");
        }
    }
}

/// What a lane's [`Connection`] holds: its shared connection, which it
/// tells when it drops.
#[derive(Debug)]
struct LaneHold {
    shared: Arc<SharedConnection>,
    tag: u32,
}

impl super::established::LogicalHold for LaneHold {
    /// Called when the lane's connection drops, its queue pair failed:
    /// sends the close (its grants are slots, nothing to retire).
    fn retire(&self, _grants: Vec<(u16, Arc<Region>)>) {
        self.shared.lane_dropped(self.tag);
    }
}
