//! What lanes hold (`lanes` docs): each end's arenas, a lane's slots, and
//! the lanes' state of one shared connection. A leaf of `lanes` and
//! `logical` (which holds a [`Lanes`] in each `SharedConnection` with
//! lanes): it names no shared connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::established::Connection;
use super::exchange::Offer;
use super::liveness::Liveness;
use super::mux::{Mux, MuxLimits, MuxMessage, MuxRole, Parts, Slice};
use crate::error::{Error, Result};
use crate::fabric::Fabric;
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

/// Slots given back whose memory each end keeps, the most recent ones (a
/// slot is taken last-freed first, so a connect right after a close finds
/// its ring's pages there, with no page faults); the memory of any other
/// free slot goes back to the system. An idle shared connection holds at
/// most this many slots' pages beyond those of lanes open, and of each
/// only its first [`LANE_WARM_BYTES`] (per arena).
///
/// 16, not 2: with connects back to back (spare lanes keep several opens
/// and closes in flight) slots came back faster than two were reused, and
/// giving each one's pages back (a hole punched in the memfd: the pages
/// unmapped, every CPU's TLB flushed by an interrupt) and faulting them in
/// again at its next use was ~6 % of the server's time and halved the
/// back-to-back rate (journal, "Spare lanes").
pub const LANE_WARM_SLOTS: usize = 16;

/// What a warm slot keeps of each arena's slot: its first 128 KiB (the
/// default smallest ring, 64 KiB, rrpc-tonic's `min_ring_size`, with its
/// header and room to spare) and its last [`LANE_WARM_TAIL`] (where a
/// ring's control records sit, rrpc-ringbuf's layout). A ring that had
/// grown past it gives the rest back when its slot comes back (a hole
/// punched in a range never touched unmaps nothing).
pub const LANE_WARM_BYTES: usize = 128 << 10;

/// What a warm slot keeps at the end of each arena's slot: 8 KiB.
pub const LANE_WARM_TAIL: usize = 8 << 10;

/// One end's arenas for a shared connection: `slots` slots of `rx_slot`
/// bytes the peer writes (granted), and as many of `tx_slot` bytes it
/// does not (each lane's staging ring).
#[derive(Debug)]
pub struct LaneArenas {
    pub(super) rx: Arc<Region>,
    pub(super) tx: Arc<Region>,
    slots: u32,
    pub(super) rx_slot: usize,
    pub(super) tx_slot: usize,
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

/// What [`SharedConnection::lane_poll`](crate::conn::SharedConnection::lane_poll) found for the layer above.
#[derive(Debug)]
pub enum LaneEvent {
    /// Server: the client asks for a lane: answer with
    /// [`lane_accept`](crate::conn::SharedConnection::lane_accept) or [`lane_refuse`](crate::conn::SharedConnection::lane_refuse).
    OpenRequested {
        /// The request, to answer.
        req: u32,
        /// The tag the client picked.
        tag: u32,
        /// What it offers.
        parts: Parts,
        /// An open ahead: our slot it writes into, granted ahead (its
        /// records reset then). Build the lane's ring over it without
        /// resetting them (the client may have written already), and
        /// accept offering no slice.
        ahead: Option<Slice>,
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

/// The most a lane reader reads of its side channel at once.
pub(super) const LANE_READ_CHUNK: usize = 4096;

/// The lanes' state of one shared connection (one lock: the protocol and
/// the order of what goes out on the side channel agree).
#[derive(Debug)]
pub(super) struct LaneState {
    pub(super) mux: Mux,
    /// Each open lane's liveness (ended when the peer closes it, or the
    /// shared side channel closes), and its queue pair.
    pub(super) ends: HashMap<u32, (Arc<Liveness>, Arc<QueuePair>)>,
    /// Client: the sharers of lanes asked for and not answered yet,
    /// attached before the open goes out: the server may write (and ring,
    /// a WRITE with immediate data) as soon as it has answered, before our
    /// reader has read the answer, and a write to a tag not attached is
    /// dropped.
    pub(super) attached: HashMap<u32, QueuePair>,
    /// Bytes read and not yet a whole message.
    pub(super) buf: Vec<u8>,
    /// What one read of the side channel fills ([`LANE_READ_CHUNK`]
    /// bytes, zeroed once: a zeroed array on the stack each read cost
    /// ~4,000 instructions, a third of a lane reader's work a connect).
    pub(super) chunk: Box<[u8]>,
    /// Free slots whose pages are kept, oldest first (at most
    /// [`LANE_WARM_SLOTS`]).
    pub(super) warm: std::collections::VecDeque<Slice>,
    /// Slots just made warm, whose pages past [`LANE_WARM_BYTES`] are to
    /// be given back (empty between calls).
    pub(super) trim: Vec<Slice>,
    /// Our slots (arena, offset) whose lane's [`Connection`] is still here:
    /// its rings may touch their pages until it drops.
    pub(super) alive: std::collections::HashSet<(u16, u64)>,
    /// Free slots of lanes whose [`Connection`] is still here: their pages
    /// go when it drops.
    pub(super) held: Vec<Slice>,
}

/// What a [`SharedConnection`] with lanes holds.
#[derive(Debug)]
pub(super) struct Lanes {
    pub(super) state: Mutex<LaneState>,
    pub(super) ours: LaneArenas,
    pub(super) peer_arena: RemoteRegion,
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
                attached: HashMap::new(),
                buf: Vec::new(),
                chunk: vec![0; LANE_READ_CHUNK].into_boxed_slice(),
                warm: std::collections::VecDeque::new(),
                trim: Vec::new(),
                alive: std::collections::HashSet::new(),
                held: Vec::new(),
            }),
            ours,
            peer_arena: remote,
        })
    }
}
