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

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::exchange::{Offer, PeerInfo};
use super::mux::{Mux, MuxEvent, MuxLimits, MuxMessage, MuxRole, Parts, Slice};
use super::{Connection, SharedConnection};
use crate::error::{Error, Result};
use crate::fabric::Fabric;
use crate::handshake::{MAGIC, RegionDesc, Section};
use crate::provider::side::Side;
use crate::qp::QueuePair;
use crate::region::{Access, Region, RemoteRegion};

/// The role under which an end grants its receive arena in the opening
/// handshake, and names its slots in the section of that role (a
/// [`MuxMessage::Grant`]).
pub const ROLE_ARENA: u16 = 0x4152;

/// How long a message on the shared side channel may wait for room in
/// the socket: only a peer that stopped reading fills it, and its shared
/// connection then fails.
pub const LANE_WRITE_WAIT: Duration = Duration::from_millis(100);

/// One end's arenas for a shared connection: `slots` slots of `rx_slot`
/// bytes the peer writes (granted), and as many of `tx_slot` bytes it
/// does not (each lane's staging ring).
#[derive(Debug)]
pub struct LaneArenas {
    rx: Arc<Region>,
    tx: Arc<Region>,
    slots: u32,
    rx_slot: usize,
    tx_slot: usize,
}

impl LaneArenas {
    /// Allocates both arenas on `fabric` (slot sizes rounded up to pages).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for no slots or a slot over 4 GiB; the
    /// allocation's error.
    pub fn new(fabric: &Fabric, slots: u32, rx_slot: usize, tx_slot: usize) -> Result<Self> {
        let (rx_slot, tx_slot) = (
            rx_slot.next_multiple_of(4096),
            tx_slot.next_multiple_of(4096),
        );
        if slots == 0 || u32::try_from(rx_slot).is_err() {
            return Err(Error::InvalidConfig(format!(
                "lane arenas of {slots} slots of {rx_slot} bytes"
            )));
        }
        let n = slots as usize;
        Ok(LaneArenas {
            rx: fabric.alloc_region_on(n * rx_slot, Access::REMOTE_WRITE, None)?,
            tx: fabric.alloc_region_on(n * tx_slot, Access::LOCAL, None)?,
            slots,
            rx_slot,
            tx_slot,
        })
    }

    /// The grant the peer reads its arena from: `offer` with our receive
    /// arena granted under [`ROLE_ARENA`] and its slots named.
    ///
    /// # Errors
    /// As [`MuxMessage::encode`] (never, for a grant).
    pub fn add_to_offer(&self, offer: Offer) -> Result<Offer> {
        Ok(offer
            .section(ROLE_ARENA, self.grant().encode()?)
            .grant(ROLE_ARENA, self.rx.clone()))
    }

    fn grant(&self) -> MuxMessage {
        MuxMessage::Grant {
            arena: 0,
            slot: self.rx_slot as u32,
            len: self.rx.len() as u64,
        }
    }

    /// Slots in each arena.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The bytes both arenas map.
    pub fn bytes(&self) -> u64 {
        (self.rx.len() + self.tx.len()) as u64
    }
}

/// One lane's slots at this end: its receive ring's (the peer writes it)
/// and its staging ring's, as regions of their own.
#[derive(Debug)]
pub struct LaneSlots {
    /// The receive ring's region, a view of the receive arena.
    pub rx: Arc<Region>,
    /// The staging ring's region, a view of the staging arena.
    pub tx: Arc<Region>,
    /// The receive slot, as the open names it.
    pub slice: Slice,
}

/// What [`SharedConnection::lane_poll`] found for the layer above.
#[derive(Debug)]
pub enum LaneEvent {
    /// Server: the client asks for a lane: answer with
    /// [`SharedConnection::lane_accept`] or [`SharedConnection::lane_refuse`].
    OpenRequested {
        /// The request, to answer.
        req: u32,
        /// The tag the client picked.
        tag: u32,
        /// What it offers.
        parts: Parts,
    },
    /// Client: request `req` is open: its connection (or why none could
    /// be set up; the lane was closed then).
    Opened {
        /// The request.
        req: u32,
        /// The lane.
        conn: Result<Connection>,
    },
    /// Client: request `req` was refused.
    Refused {
        /// The request.
        req: u32,
        /// The server's reason.
        reason: String,
    },
}

/// The lanes' state of one shared connection (one lock: the protocol and
/// the order of what goes out on the side channel agree).
#[derive(Debug)]
struct LaneState {
    mux: Mux,
    /// Our end of each open lane's socket pair, and its queue pair.
    ends: HashMap<u32, (UnixStream, Arc<QueuePair>)>,
    /// Bytes read and not yet a whole message.
    buf: Vec<u8>,
}

/// What a [`SharedConnection`] with lanes holds.
#[derive(Debug)]
pub(super) struct Lanes {
    state: Mutex<LaneState>,
    ours: LaneArenas,
    peer_arena: RemoteRegion,
}

impl Lanes {
    /// The lanes of `conn`, which opened with `ours` offered: reads the
    /// peer's arena from its hello.
    pub(super) fn new(
        conn: &Connection,
        role: MuxRole,
        ours: LaneArenas,
        limits: MuxLimits,
    ) -> Result<Lanes> {
        let mut mux = Mux::new(role, limits);
        let peer = conn.peer();
        let (Some(grant), Some(remote)) = (peer.section(ROLE_ARENA), peer.region(ROLE_ARENA))
        else {
            return Err(Error::MalformedHandshake(
                "the peer granted no lane arena".into(),
            ));
        };
        let grant = match MuxMessage::decode(grant)? {
            Some((m @ MuxMessage::Grant { arena: 0, len, .. }, used))
                if used == grant.len() && len <= remote.len =>
            {
                m
            }
            _ => {
                return Err(Error::MalformedHandshake(
                    "the lane arena's section is no grant of arena 0 within the region granted"
                        .into(),
                ));
            }
        };
        let _ = mux.handle(grant)?;
        let MuxMessage::Grant { slot, len, .. } = ours.grant() else {
            unreachable!("a grant")
        };
        let (_, _) = mux.grant(len, slot)?;
        Ok(Lanes {
            state: Mutex::new(LaneState {
                mux,
                ends: HashMap::new(),
                buf: Vec::new(),
            }),
            ours,
            peer_arena: remote,
        })
    }
}

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
    /// As [`Mux::open`]; the side channel's.
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
    /// As [`Mux::refuse`]; the side channel's.
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
        let mut s = self.lane_state()?;
        let r = self.lane_poll_locked(&mut s);
        if r.is_err() {
            self.connection().mark_gone();
            // The peer sees its shared connection close: it is done.
            self.connection().side.shutdown();
            // Every lane's watcher sees its socket close; nothing more
            // is written into their rings.
            for (_, (end, qp)) in s.ends.drain() {
                qp.fail(&Error::PeerGone);
                drop(end);
            }
        }
        r
    }

    fn lane_poll_locked(self: &Arc<Self>, s: &mut LaneState) -> Result<Vec<LaneEvent>> {
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
        let mut events = Vec::new();
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
        Ok(events)
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
