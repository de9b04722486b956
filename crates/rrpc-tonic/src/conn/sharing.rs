//! Shared queue pairs ([`RrpcConfig::shared_queue_pairs`]): one queue pair
//! per client and server pair, many connections over it.
//!
//! The first connection a client makes to a server *opens* a shared
//! connection: an rrpc-core connection with a queue pair and no rings,
//! which the server names with a random 128-bit id. Every connection after
//! it is a *logical* connection over that queue pair
//! (`rrpc_core::conn::connect_logical`): its own side channel, handshake
//! and rings, and a sharer tag the client picks. The server finds the
//! shared connection by its id, which only the two ends know, so no client
//! can attach to another client's queue pair.
//!
//! In rrpc-tonic's section of rrpc-core's handshake:
//!
//! ```text
//! open           (client -> server) = "RRPA"
//! opened         (server -> client) = "RRPA" id[16]
//! logical hello  (client -> server) = path hello (9 bytes) "RRPL" id[16] tag:u32
//! logical reply  (server -> client) = path reply (9 bytes)
//! ```
//!
//! On `shm://` a shared connection carries **lanes** (#58): its opening
//! grants each end's lane arena (rrpc-core `conn::lanes`, [`LANE_SLOTS`]
//! rings), and a connect over it is one `open` message on its side
//! channel, answered there (rrpc-core `conn::mux`), its rings slots of
//! the arenas: no socket, no handshake, no descriptor passed, nothing
//! mapped. One reader task per shared connection at each end reads that
//! side channel: the client's hands answers to the connects waiting on
//! them, the server's hands asks to its listener's accept loop
//! ([`LaneAsk`]), which answers them like clients (its limits included).
//! When a shared connection has no lanes (`rdma://`, a server that grants
//! no arena) or its arenas are full, a connect runs a logical
//! connection's handshake as above.
//!
//! **Lanes opened ahead (0-RTT).** After each lane it accepts, the server
//! keeps [`LANES_AHEAD`](super::rings::LANES_AHEAD) slots of its arena
//! granted ahead to that client, their ring records reset, with the answer
//! a lane opened with the same path hello gets (the path reply, its ring's
//! parameters, and the hello, under [`AHEAD_HELLO`]). A connect whose hello
//! is that one opens its lane into one of those slots and returns at once:
//! its first call's request is in the server's ring before the server has
//! read the open, as a TCP connect returns once the kernel has answered
//! the SYN. The server's answer only confirms; a server that will not
//! serve the lane (its limits, its listener gone) refuses it, which closes
//! it, and its calls fail with the server's reason (`ResourceExhausted`
//! for a connection limit), as over a TCP connection reset right after it
//! was accepted. A client marks its opens with an empty [`AHEAD_HELLO`]
//! section to say it takes grants ahead (a server grants none to a client
//! without it). The first lane over a shared connection, a connect with
//! another hello, one that finds no slot in hand (connects faster than the
//! server answers), and any with the poller's Event mode at either end (a
//! tail sent with immediate data before the server attached the lane would
//! be dropped, and its wake-up with it) wait for the answer as above.
//!
//! The client caches its shared connections by server
//! (`rrpc_core::meta::PeerCache`), keyed by the address it dialed
//! ([`PeerKey`]): the ring endpoint for `shm://` and `rdma://`, the port's
//! address (and the fabric chosen) for `rrpc://`. An entry lives
//! [`RrpcConfig::peer_lease`] past its last use, longer while connections
//! run over it, and goes at once when its side channel closes or the
//! server no longer knows its id. A sweeper task (one per context while
//! the cache holds anything) closes an idle entry within a quarter lease
//! of its end, so it holds no socket, queue pair or ring past that even
//! if the process never dials again. Behind an `rrpc://` port the ring
//! endpoint changes when the server restarts (the verbs side channel's
//! port is the OS's pick, the shm socket's name holds the pid), so an entry
//! whose endpoint is not the one the port names now is from the server's
//! earlier life: it is replaced, not kept beside the new one.
//! The server holds at most [`RrpcConfig::max_shared_peers`], and drops one
//! within half a second of its client's side channel closing (a sweeper
//! task, as the client's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rrpc_core::conn::mux::{MuxLimits, MuxRole, Parts};
use rrpc_core::conn::{
    Connection, HandshakeConfig, Incoming, LaneArenas, LaneEvent, Offer, ROLE_ARENA,
    SharedConnection,
};
use rrpc_core::meta::PeerCache;
use rrpc_core::vqp::VqpConfig;
use rrpc_core::{Fabric, FabricAddr};
use rrpc_poller::WatchedFd;
use rrpc_poller::rings::{LocalRing, RingConfig};

use crate::conn::negotiate::section_of;
use crate::frame::{HANDSHAKE_SECTION, PATH_HELLO_LEN};
use crate::{Error, RrpcConfig};

/// What opens a shared connection, and starts the server's answer.
const OPEN: &[u8; 4] = b"RRPA";
/// What follows the path hello of a logical connection.
const LOGICAL: &[u8; 4] = b"RRPL";
/// Length of a shared connection's id.
const ID_LEN: usize = 16;

/// The server's reason for a logical connection whose shared connection it
/// does not hold (it restarted, or dropped it when its side channel
/// closed): the client then opens a new one.
pub(crate) const UNKNOWN: &str = "no shared connection with that id";

/// The server's reason for refusing shared connections.
pub(crate) const OFF: &str =
    "this server does not share queue pairs (RrpcConfig::shared_queue_pairs)";

/// The server's reason for a lane it has no slot for: every slot of its
/// arena is a lane's still open, or one whose connection has not dropped
/// yet (a client that connects and drops faster than the server's
/// connections end). The client then runs a logical connection's own
/// handshake, as when its own arena is full.
pub(crate) const ARENA_FULL: &str = "the server's lane arena is full";

/// The section of a grant of lanes ahead that holds the path hello its
/// answer is for (module docs, "Lanes opened ahead").
pub(crate) const AHEAD_HELLO: u16 = 0x4148;

/// Whether a server's refusal of a logical connection is worth one more
/// try: it forgot the shared connection, or still holds the tag picked
/// (its end of a logical connection the client just dropped).
pub(crate) fn is_stale(reason: &str) -> bool {
    reason.contains(UNKNOWN) || reason.contains("is already attached")
}

/// Lanes (logical connections over the shared side channel, rings in
/// arenas granted at the opening: rrpc-core `conn::lanes`) one shared
/// connection's arenas hold at once, at each end. Past them a connect
/// runs a logical connection's own handshake, as without lanes. Virtual
/// memory: `2 × LANE_SLOTS × (ring_size + 8 KiB)` per end; pages are
/// taken as rings touch them.
pub(crate) const LANE_SLOTS: u32 = 64;

/// Both lane arenas of one end for rings of `ring`, on `fabric`
/// (huge pages only if the rings would have them).
fn lane_arenas(fabric: &Fabric, ring: &RingConfig) -> Result<LaneArenas, Error> {
    let fabric = if ring.huge_pages() {
        fabric.clone()
    } else {
        fabric.clone().without_huge_pages()
    };
    let (rx, tx) = LocalRing::region_lens(ring);
    Ok(LaneArenas::new(&fabric, LANE_SLOTS, rx, tx)?)
}

/// A lane's answer, for the connect waiting on it.
pub(crate) type LaneAnswer = Result<Connection, rrpc_core::Error>;

/// A client's connects waiting for their lane's answer, by request id.
pub(crate) type Waiters = Mutex<HashMap<u32, tokio::sync::oneshot::Sender<LaneAnswer>>>;

/// A client asks for a lane: what the server's listener hands its accept
/// loop (`rings::RingsPending`).
#[derive(Debug)]
pub(crate) struct LaneAsk {
    pub(crate) shared: Arc<SharedConnection>,
    pub(crate) req: u32,
    pub(crate) tag: u32,
    pub(crate) parts: Parts,
    /// Opened ahead: our slot it writes into (rrpc-core `conn::mux`).
    pub(crate) ahead: Option<rrpc_core::conn::mux::Slice>,
    /// Still to be answered: refused when dropped unanswered.
    pub(crate) open: bool,
}

impl Drop for LaneAsk {
    fn drop(&mut self) {
        if self.open {
            let _ = self.shared.lane_refuse(
                self.req,
                "the server dropped the connection before answering",
            );
        }
    }
}

/// Where a server's lane readers send what clients ask for.
pub(crate) type LaneAsks = tokio::sync::mpsc::UnboundedSender<LaneAsk>;

/// Reads the side channel of `shared` (a lane reader: rrpc-core
/// `conn::lanes`) until it closes or the peer breaks the protocol, on a
/// task of the current runtime: answers go to `waiters` (client), asks to
/// `asks` (server). Holds the shared connection weakly: it ends when the
/// last owner drops it (its side channel then closes). Without a runtime,
/// does nothing (and the shared connection has no reader: its lanes are
/// never answered, and connects fall back after their timeout).
fn spawn_reader(
    shared: &Arc<SharedConnection>,
    waiters: Option<Arc<Waiters>>,
    asks: Option<LaneAsks>,
) -> Result<(), Error> {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return Ok(());
    };
    let Some(fd) = shared.connection().liveness_fd() else {
        return Err(Error::Handshake(
            "a shared connection without a side channel".into(),
        ));
    };
    let afd = WatchedFd::new(fd, tokio::io::Interest::READABLE)?;
    let weak = Arc::downgrade(shared);
    rt.spawn(async move {
        let why = loop {
            let Ok(mut guard) = afd.readable().await else {
                break "reactor gone".to_string();
            };
            let Some(shared) = weak.upgrade() else {
                break "dropped".to_string();
            };
            let events = match shared.lane_poll() {
                Ok(ev) => ev,
                Err(e) => break e.to_string(),
            };
            guard.clear_ready();
            dispatch(&shared, events, waiters.as_deref(), asks.as_ref());
        };
        tracing::debug!(reason = %why, "rrpc: lane reader ended");
        // Connects still waiting fail now (their senders drop).
        if let Some(w) = waiters {
            w.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    });
    Ok(())
}

/// Hands what [`SharedConnection::lane_poll`] returned to whom waits on
/// it: answers to the connects in `waiters` (client), asks to `asks`
/// (server).
fn dispatch(
    shared: &Arc<SharedConnection>,
    events: Vec<LaneEvent>,
    waiters: Option<&Waiters>,
    asks: Option<&LaneAsks>,
) {
    let waiter =
        |req: u32| waiters.and_then(|w| w.lock().unwrap_or_else(|p| p.into_inner()).remove(&req));
    for ev in events {
        match ev {
            LaneEvent::Opened { req, conn } => {
                // A connect gone meanwhile: its lane drops, closed.
                if let Some(w) = waiter(req) {
                    let _ = w.send(conn);
                }
            }
            LaneEvent::Refused { req, reason } => {
                if let Some(w) = waiter(req) {
                    let _ = w.send(Err(rrpc_core::Error::Rejected(reason)));
                }
            }
            LaneEvent::OpenRequested {
                req,
                tag,
                parts,
                ahead,
            } => {
                let ask = LaneAsk {
                    shared: shared.clone(),
                    req,
                    tag,
                    parts,
                    ahead,
                    open: true,
                };
                // A listener gone: dropped, so refused.
                if let Some(a) = asks {
                    let _ = a.send(ask);
                }
            }
        }
    }
}

/// A shared connection's name at its server: random, known to both ends only.
pub(crate) type Id = [u8; ID_LEN];

/// What a client's handshake section asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    /// A connection of its own; the blob is the path hello.
    Dedicated(&'a [u8]),
    /// Open a shared connection.
    Open,
    /// A logical connection over shared connection `id`, under `tag`.
    Logical { path: &'a [u8], id: Id, tag: u32 },
}

/// Reads a client's handshake section (peer-written: every malformed input
/// is an error saying what was wrong; a bad path hello is left to the path
/// negotiation, which says it better).
pub(crate) fn parse_request(app: &[u8]) -> Result<Request<'_>, String> {
    if app == OPEN {
        return Ok(Request::Open);
    }
    if app.len() <= PATH_HELLO_LEN {
        return Ok(Request::Dedicated(app));
    }
    let (path, ext) = app.split_at(PATH_HELLO_LEN);
    if ext.len() != 4 + ID_LEN + 4 || &ext[..4] != LOGICAL {
        return Err(format!(
            "unknown extension after the path hello ({} bytes)",
            ext.len()
        ));
    }
    let id: Id = ext[4..4 + ID_LEN].try_into().expect("16 bytes");
    let tag = u32::from_le_bytes(ext[4 + ID_LEN..].try_into().expect("4 bytes"));
    Ok(Request::Logical { path, id, tag })
}

/// [`parse_request`], then the section that request is sent as: equal to
/// `app` whenever it parses (the fuzz target `sharing_request` holds it).
#[cfg(fuzzing)]
pub(crate) fn fuzz_round_trip(app: &[u8]) -> Result<Vec<u8>, String> {
    Ok(match parse_request(app)? {
        Request::Open => OPEN.to_vec(),
        Request::Dedicated(path) => path.to_vec(),
        Request::Logical { path, id, tag } => {
            let path: &[u8; PATH_HELLO_LEN] = path
                .try_into()
                .map_err(|_| format!("a logical path hello of {} bytes", path.len()))?;
            logical_request(path, &id, tag)
        }
    })
}

/// A logical connection's handshake section.
pub(crate) fn logical_request(path: &[u8; PATH_HELLO_LEN], id: &Id, tag: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(PATH_HELLO_LEN + 4 + ID_LEN + 4);
    m.extend_from_slice(path);
    m.extend_from_slice(LOGICAL);
    m.extend_from_slice(id);
    m.extend_from_slice(&tag.to_le_bytes());
    m
}

fn opened_reply(id: &Id) -> Vec<u8> {
    let mut m = OPEN.to_vec();
    m.extend_from_slice(id);
    m
}

fn parse_opened(app: &[u8]) -> Result<Id, Error> {
    match app.strip_prefix(OPEN) {
        Some(id) if id.len() == ID_LEN => Ok(id.try_into().expect("16 bytes")),
        _ => Err(Error::Handshake(format!(
            "the server answered a shared connection's opening with {} bytes, not \"RRPA\" and an id",
            app.len()
        ))),
    }
}

/// A fresh id from the kernel's random source.
fn new_id() -> Result<Id, Error> {
    use std::io::Read;
    let mut id = [0u8; ID_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .map_err(Error::Io)?;
    Ok(id)
}

/// One shared connection, as [`RrpcContext::shared_connections`](crate::RrpcContext::shared_connections) reports it.
#[derive(Debug, Clone)]
pub struct SharedConnectionStats {
    /// Whether this end opened it (a client) or accepted it (a server).
    pub opened_here: bool,
    /// The provider its queue pair runs on (both ends run the same).
    pub provider: rrpc_core::ProviderKind,
    /// Logical connections over it now.
    pub logical_connections: usize,
    /// Whether its side channel still says the peer is there.
    pub alive: bool,
    /// Ring pairs made ahead for its next logical connections (up to
    /// `RrpcConfig::connection_pool_for` its provider). Lanes take none:
    /// their rings are slots of the arenas.
    pub spare_rings: usize,
    /// Whether its logical connections are lanes (`shm://`: one message on
    /// its side channel each, rings in arenas granted when it opened).
    pub lanes: bool,
    /// Bytes of memory this end's lane arenas hold now: the pages of the
    /// slots of lanes open (a slot given back gives its pages back). 0
    /// without lanes.
    pub lane_arena_bytes: usize,
    /// Slots of the server's lane arena granted ahead (module docs, "Lanes
    /// opened ahead"): in the client's hand, or (at the server) granted
    /// and not opened yet.
    pub lanes_ahead: usize,
    /// Lanes opened ahead over it, in all: without waiting for the answer
    /// (client), or into a slot granted ahead (server).
    pub lanes_opened_ahead: u64,
    /// Its queue pair's counters (`rrpc_core::vqp`).
    pub queue_pair: rrpc_core::vqp::VqpStats,
}

impl SharedConnectionStats {
    fn of(s: &SharedConnection, spares: &Spares, opened_here: bool) -> Self {
        SharedConnectionStats {
            opened_here,
            provider: s.connection().peer().provider,
            logical_connections: s.physical().sharers(),
            alive: s.connection().check_alive().is_ok(),
            spare_rings: spares.rings.lock().unwrap_or_else(|p| p.into_inner()).len(),
            lanes: s.has_lanes(),
            lane_arena_bytes: s.lane_arena_bytes().unwrap_or(0),
            lanes_ahead: if opened_here {
                s.lane_ahead_left()
            } else {
                s.lane_credited()
            },
            lanes_opened_ahead: s.lanes_opened_ahead(),
            queue_pair: s.physical().stats(),
        }
    }
}

/// Ring pairs made ahead in a shared connection's protection domain (the
/// pool's bundles each live in a domain of their own, which a shared queue
/// pair cannot reach). A logical connection takes one, and a blocking task
/// makes its replacement after the connection is set up, off its path.
/// At most [`RrpcConfig::connection_pool_for`] per shared connection (so
/// none on shm by default), and together at most
/// [`RrpcConfig::connection_pool_memory`] per context and side.
#[derive(Debug)]
pub(crate) struct Spares {
    rings: Mutex<Vec<LocalRing>>,
    /// The bytes every shared connection's spares of this side hold.
    held: Arc<AtomicU64>,
}

impl Spares {
    fn new(held: &Arc<AtomicU64>) -> Self {
        Spares {
            rings: Mutex::default(),
            held: held.clone(),
        }
    }

    /// A ring pair in `fabric`'s domain: a spare, or one made now.
    fn take(&self, fabric: &Fabric, ring: &RingConfig) -> Result<LocalRing, Error> {
        let spare = self.rings.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match spare {
            Some(r) => {
                self.held.fetch_sub(r.bytes(), Ordering::Relaxed);
                Ok(r)
            }
            None => Ok(LocalRing::new(fabric, ring)?),
        }
    }

    /// Makes spares on a blocking task until `want` wait or the memory
    /// bound is reached. Without a tokio runtime, does nothing.
    fn refill(this: &Arc<Self>, fabric: &Fabric, ring: &RingConfig, want: usize, max_bytes: u64) {
        let short = want.saturating_sub(this.rings.lock().unwrap_or_else(|p| p.into_inner()).len());
        if short == 0 {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (this, fabric, ring) = (this.clone(), fabric.clone(), ring.clone());
        drop(rt.spawn_blocking(move || {
            for _ in 0..short {
                let Ok(r) = LocalRing::new(&fabric, &ring) else {
                    return;
                };
                let bytes = r.bytes();
                if this.held.fetch_add(bytes, Ordering::Relaxed) + bytes > max_bytes {
                    this.held.fetch_sub(bytes, Ordering::Relaxed);
                    return;
                }
                let mut rings = this.rings.lock().unwrap_or_else(|p| p.into_inner());
                // Another refill (of an earlier take) may have got there first.
                if rings.len() >= want {
                    this.held.fetch_sub(bytes, Ordering::Relaxed);
                    return;
                }
                rings.push(r);
            }
        }));
    }
}

/// A shared connection's protection domain at one end, where each of its
/// logical connections' rings must be registered, with its spare rings.
#[derive(Debug)]
pub(crate) struct Domain {
    fabric: Fabric,
    spares: Arc<Spares>,
}

impl Domain {
    fn new(fabric: Fabric, held: &Arc<AtomicU64>) -> Self {
        Domain {
            fabric,
            spares: Arc::new(Spares::new(held)),
        }
    }

    /// Rings for one logical connection: a spare, or made now.
    pub(crate) fn take_rings(&self, ring: &RingConfig) -> Result<LocalRing, Error> {
        self.spares.take(&self.fabric, ring)
    }

    /// Makes spare rings for the next logical connections, off the caller's
    /// path ([`Spares`]).
    pub(crate) fn refill(&self, ring: &RingConfig, cfg: &RrpcConfig) {
        Spares::refill(
            &self.spares,
            &self.fabric,
            ring,
            cfg.connection_pool_for(self.fabric.kind()),
            cfg.connection_pool_memory(),
        );
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        let rings = self.rings.get_mut().unwrap_or_else(|p| p.into_inner());
        let bytes: u64 = rings.iter().map(LocalRing::bytes).sum();
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// What a client caches its shared connection to a server by: the address
/// the user dialed, so that a server met again at that address replaces
/// its own stale entry (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey(String);

impl PeerKey {
    /// The server dialed at `ep` (`shm://`, `rdma://`), or, with `port`,
    /// the `rrpc://` port at `port` (`host:port`) whose negotiation named
    /// `ep`: keyed by the port and `ep`'s fabric, never by `ep` itself,
    /// which changes when the server behind the port restarts.
    pub(crate) fn new(ep: &FabricAddr, port: Option<&str>) -> Self {
        let uri = ep.to_string();
        PeerKey(match port {
            None => uri,
            // The fabric is the endpoint's scheme (`shm`, `rdma`).
            Some(port) => {
                let fabric = uri.split_once("://").map_or("", |(scheme, _)| scheme);
                format!("rrpc://{port} ({fabric})")
            }
        })
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client's shared connection to one server.
#[derive(Debug)]
pub(crate) struct SharedPeer {
    pub(crate) shared: Arc<SharedConnection>,
    /// The ring endpoint it was opened to.
    ep: FabricAddr,
    /// The protection domain of its queue pair.
    pub(crate) domain: Domain,
    pub(crate) id: Id,
    next_tag: AtomicU32,
    /// Connects waiting for their lane's answer (with lanes).
    pub(crate) waiters: Arc<Waiters>,
    /// The listening socket it was opened through (`shm://`: its device
    /// and inode), to tell a server restarted at the same path.
    listener: Option<(u64, u64)>,
}

/// The identity of the socket file of `ep` (`shm://`): device and inode.
fn listener_id(ep: &FabricAddr) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    match ep {
        FabricAddr::Shm(path) => std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino())),
        _ => None,
    }
}

impl SharedPeer {
    /// A tag no logical connection over this one uses now (nor a lane
    /// still closing).
    pub(crate) fn free_tag(&self) -> Result<u32, Error> {
        let phys = self.shared.physical();
        for _ in 0..phys.tags() {
            let t = self.next_tag.fetch_add(1, Ordering::Relaxed) % phys.tags();
            if !phys.is_attached(t) && !self.shared.lane_tag_taken(t) {
                return Ok(t);
            }
        }
        Err(Error::Handshake(format!(
            "all {} sharer tags of the shared connection are in use",
            phys.tags()
        )))
    }

    fn alive(&self) -> bool {
        self.shared.connection().check_alive().is_ok()
    }

    /// Whether its server still listens where it did (`shm://`: the same
    /// socket file; a server restarted at the path made a new one). A lane
    /// asks over the shared connection, never through the listener, so a
    /// server that hangs with its end open would otherwise never say it
    /// does not know the shared connection.
    fn same_listener(&self) -> bool {
        self.listener.is_none() || listener_id(&self.ep) == self.listener
    }
}

/// A client's shared connections, by server.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    cache: Arc<Mutex<Cache>>,
    /// The bytes their spare rings hold.
    spare_bytes: Arc<AtomicU64>,
}

/// A table of shared connections, and whether a sweeper task runs for it
/// ([`sweep_later`]).
#[derive(Debug, Default)]
struct Swept<T> {
    table: T,
    /// Set and cleared under the table's lock, so an entry inserted never
    /// lacks a sweeper.
    sweeping: bool,
}

impl<T> std::ops::Deref for Swept<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.table
    }
}

impl<T> std::ops::DerefMut for Swept<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.table
    }
}

type Cache = Swept<Option<PeerCache<PeerKey, Arc<SharedPeer>>>>;
type AnchorMap = Swept<HashMap<Id, Arc<Anchor>>>;

/// Starts, unless one runs, a task on the current tokio runtime that calls
/// `sweep` on `table` every `period`: `sweep` takes out what is to be
/// closed (dropped on a blocking thread: closing says goodbye on a socket)
/// and says whether the table is left empty, which ends the task (the next
/// insert starts another). The task also ends with its runtime and when
/// the table is dropped. Without a runtime here there is none, and the
/// table is swept only where it is used, as before.
fn sweep_later<T, G>(
    table: &Arc<Mutex<Swept<T>>>,
    period: std::time::Duration,
    sweep: impl Fn(&mut T) -> (Vec<G>, bool) + Send + 'static,
) where
    T: Send + 'static,
    G: Send + 'static,
{
    /// Clears `sweeping` when the task ends, also when its runtime drops
    /// it.
    struct Running<T>(std::sync::Weak<Mutex<Swept<T>>>);
    impl<T> Drop for Running<T> {
        fn drop(&mut self) {
            if let Some(t) = self.0.upgrade() {
                t.lock().unwrap_or_else(|p| p.into_inner()).sweeping = false;
            }
        }
    }
    {
        let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::replace(&mut t.sweeping, true) {
            return;
        }
    }
    let weak = Arc::downgrade(table);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        drop(Running(weak));
        return;
    };
    rt.spawn(async move {
        let mut running = Running(weak.clone());
        loop {
            tokio::time::sleep(period).await;
            let Some(table) = weak.upgrade() else { return };
            let (gone, empty) = {
                let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
                let (gone, empty) = sweep(&mut t.table);
                if empty {
                    // Cleared under the lock: an insert after this starts
                    // a new sweeper, which this one's end must not undo.
                    t.sweeping = false;
                    running.0 = std::sync::Weak::new();
                }
                (gone, empty)
            };
            drop(table);
            if !gone.is_empty() {
                tracing::debug!(
                    closed = gone.len(),
                    "rrpc: shared connections closed by the sweeper"
                );
                let _ = tokio::task::spawn_blocking(move || drop(gone)).await;
            }
            if empty {
                return;
            }
        }
    });
}

/// How often a sweeper looks at the cache: a fraction of the lease, so an
/// idle shared connection is closed within 1.25 leases of its last use,
/// and not more often than every 100 ms.
fn sweep_period(lease: std::time::Duration) -> std::time::Duration {
    (lease / 4).max(std::time::Duration::from_millis(100))
}

impl Peers {
    /// The shared connection to the server `key` names, at `ep`: cached,
    /// or opened now (blocking, bounded by the handshake timeout). Expired
    /// and dead entries are dropped first, and so is the entry for `key` if
    /// it was opened to another endpoint (the server behind an `rrpc://`
    /// port restarted: module docs).
    pub(crate) fn get_or_open(
        &self,
        key: &PeerKey,
        ep: &FabricAddr,
        fabric: &Fabric,
        ring: &RingConfig,
        cfg: &RrpcConfig,
        hs: &HandshakeConfig,
    ) -> Result<Arc<SharedPeer>, Error> {
        let mut dropped = Vec::new();
        {
            let mut cell = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            let cache = cell
                .get_or_insert_with(|| PeerCache::new(cfg.peer_lease(), cfg.max_shared_peers()));
            let now = Instant::now();
            dropped.extend(cache.invalidate_where(|p| !p.alive()));
            dropped.extend(cache.expire(now, |p| p.shared.physical().sharers() > 0));
            let hit = match cache.get(key, now) {
                Ok(hit) => hit.cloned(),
                Err(p) => {
                    dropped.push(p);
                    None
                }
            };
            match hit {
                Some(p) if p.ep == *ep && p.same_listener() => return Ok(p),
                Some(_) => {
                    tracing::debug!(
                        server = %key, endpoint = %ep,
                        "rrpc: the server moved its side listener (it restarted); \
                         its old shared connection is dropped"
                    );
                    dropped.extend(cache.invalidate(key));
                }
                None => {}
            }
        }
        // Closed outside the lock (closing says goodbye on the socket).
        drop(dropped);
        // Opened outside the lock, so a slow server delays no connect to
        // another; two racing opens to one server keep the first cached.
        let opened = Arc::new(open(ep, fabric, ring, cfg, hs, &self.spare_bytes)?);
        let mut cell = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let cache = cell.as_mut().expect("made above");
        let now = Instant::now();
        if let Ok(Some(p)) = cache.get(key, now)
            && p.ep == *ep
            && p.same_listener()
        {
            return Ok(p.clone());
        }
        let evicted = cache.insert(key.clone(), opened.clone(), now);
        drop(cell);
        drop(evicted);
        self.sweep_later(cfg.peer_lease());
        Ok(opened)
    }

    /// Closes cached shared connections whose lease ended and that carry
    /// no connection, and dead ones, without waiting for a connect to look
    /// at the cache: an idle one does not hold its socket, queue pair and
    /// rings until the process dials again.
    fn sweep_later(&self, lease: std::time::Duration) {
        sweep_later(&self.cache, sweep_period(lease), |cache| {
            let Some(c) = cache.as_mut() else {
                return (Vec::new(), true);
            };
            let mut gone = c.invalidate_where(|p| !p.alive());
            gone.extend(c.expire(Instant::now(), |p| p.shared.physical().sharers() > 0));
            (gone, c.is_empty())
        });
    }

    /// The live shared connection to the server `key` names at `ep`, if
    /// one is cached (no system call, never blocks).
    pub(crate) fn cached(&self, key: &PeerKey, ep: &FabricAddr) -> Option<Arc<SharedPeer>> {
        let mut cell = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let p = cell
            .as_mut()?
            .get(key, Instant::now())
            .ok()
            .flatten()?
            .clone();
        (p.ep == *ep && !p.shared.connection().is_gone() && p.same_listener()).then_some(p)
    }

    /// Forgets `peer` as the shared connection to the server `key` names
    /// (the server no longer knows it, or its side channel closed).
    pub(crate) fn invalidate(&self, key: &PeerKey, peer: &Arc<SharedPeer>) {
        let mut cell = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let Some(cache) = cell.as_mut() else { return };
        let same = matches!(cache.get(key, Instant::now()), Ok(Some(p)) if Arc::ptr_eq(p, peer));
        if same {
            let gone = cache.invalidate(key);
            drop(cell);
            tracing::debug!(server = %key, endpoint = %peer.ep, "rrpc: shared connection invalidated");
            drop(gone);
        }
    }

    /// The shared connections cached now.
    pub(crate) fn stats(&self) -> Vec<SharedConnectionStats> {
        let peers: Vec<Arc<SharedPeer>> = {
            let cell = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cell.as_ref()
                .map(|c| c.values().cloned().collect())
                .unwrap_or_default()
        };
        peers
            .iter()
            .map(|p| SharedConnectionStats::of(&p.shared, &p.domain.spares, true))
            .collect()
    }
}

/// Opens a shared connection to `ep`: a queue pair in a protection domain
/// of its own, connected with no rings.
/// On shm its opening grants lane arenas ([`LANE_SLOTS`]); a server that
/// grants its own back gets lanes (and a reader task), else logical
/// connections with handshakes of their own.
fn open(
    ep: &FabricAddr,
    fabric: &Fabric,
    ring: &RingConfig,
    cfg: &RrpcConfig,
    hs: &HandshakeConfig,
    spare_bytes: &Arc<AtomicU64>,
) -> Result<SharedPeer, Error> {
    let fabric = fabric.isolated()?;
    let qp = fabric.create_qp(cfg.queue_pair())?;
    let listener = listener_id(ep);
    let mut offer = Offer::new()
        .token(cfg.token().map(<[u8]>::to_vec))
        .section(HANDSHAKE_SECTION, OPEN.to_vec());
    let arenas = match ep {
        FabricAddr::Shm(_) => Some(lane_arenas(&fabric, ring)?),
        _ => None,
    };
    if let Some(a) = &arenas {
        offer = a.add_to_offer(offer)?;
    }
    let c = rrpc_core::conn::connect(ep, qp, offer, hs)?;
    let id = parse_opened(section_of(c.peer()))?;
    let waiters = Arc::new(Waiters::default());
    let shared = match arenas {
        Some(a) if c.peer().region(ROLE_ARENA).is_some() => {
            let s = SharedConnection::with_lanes(
                c,
                VqpConfig::default(),
                MuxRole::Client,
                a,
                MuxLimits::default(),
            )?;
            spawn_reader(&s, Some(waiters.clone()), None)?;
            s
        }
        _ => SharedConnection::new(c, VqpConfig::default())?,
    };
    tracing::debug!(endpoint = %ep, lanes = shared.has_lanes(), "rrpc: shared connection opened");
    Ok(SharedPeer {
        shared,
        ep: ep.clone(),
        domain: Domain::new(fabric, spare_bytes),
        id,
        next_tag: AtomicU32::new(0),
        waiters,
        listener,
    })
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// How often a server looks for shared connections whose client is gone.
const ANCHOR_SWEEP: std::time::Duration = std::time::Duration::from_millis(500);

/// A server's shared connections, by id.
#[derive(Debug, Default)]
pub(crate) struct Anchors {
    map: Arc<Mutex<AnchorMap>>,
    /// The bytes their spare rings hold.
    spare_bytes: Arc<AtomicU64>,
}

/// One shared connection a client opened with this server.
#[derive(Debug)]
pub(crate) struct Anchor {
    pub(crate) shared: Arc<SharedConnection>,
    /// Its protection domain.
    pub(crate) domain: Domain,
}

impl Anchors {
    /// Answers a client's opening: a queue pair in a protection domain of
    /// its own, and an id. Refused (the client is told why) when sharing is
    /// off here or [`RrpcConfig::max_shared_peers`] are held. Blocking.
    pub(crate) fn open(
        &self,
        incoming: Incoming,
        fabric: &Fabric,
        ring: &RingConfig,
        cfg: &RrpcConfig,
        asks: Option<&LaneAsks>,
    ) -> Result<(), Error> {
        if !cfg.shared_queue_pairs() {
            let _ = incoming.reject(OFF);
            return Err(Error::Handshake(OFF.into()));
        }
        // The table stays locked until the new entry is in it: the client
        // sends its first logical hello as soon as our answer arrives, and
        // that hello's lookup must find the entry. (The answer is small and
        // sent without waiting for the client.)
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, a| a.shared.connection().check_alive().is_ok());
        if map.len() >= cfg.max_shared_peers() {
            drop(map);
            let reason = format!(
                "this server holds its maximum of {} shared connections",
                cfg.max_shared_peers()
            );
            let _ = incoming.reject(&reason);
            return Err(Error::Handshake(reason));
        }
        let fabric = fabric.isolated()?;
        let qp = fabric.create_qp(cfg.queue_pair())?;
        let id = new_id()?;
        // Lanes when the client granted an arena (shm), we are on shm and
        // a listener takes their asks.
        let lanes = match asks {
            Some(asks)
                if incoming.peer().region(ROLE_ARENA).is_some()
                    && fabric.kind() == rrpc_core::ProviderKind::Shm =>
            {
                Some((lane_arenas(&fabric, ring)?, asks))
            }
            _ => None,
        };
        let mut offer = Offer::new().section(HANDSHAKE_SECTION, opened_reply(&id));
        if let Some((a, _)) = &lanes {
            offer = a.add_to_offer(offer)?;
        }
        let c = incoming.accept(qp, offer)?;
        let shared = match lanes {
            Some((a, asks)) => {
                let s = SharedConnection::with_lanes(
                    c,
                    VqpConfig::default(),
                    MuxRole::Server,
                    a,
                    MuxLimits::default(),
                )?;
                spawn_reader(&s, None, Some(asks.clone()))?;
                s
            }
            None => SharedConnection::new(c, VqpConfig::default())?,
        };
        let domain = Domain::new(fabric, &self.spare_bytes);
        map.insert(id, Arc::new(Anchor { shared, domain }));
        drop(map);
        // A client's side channel closed drops its entry within
        // ANCHOR_SWEEP, not at the next opening or lookup.
        sweep_later(&self.map, ANCHOR_SWEEP, |map| {
            let mut gone = Vec::new();
            map.retain(|_, a| {
                let alive = a.shared.connection().check_alive().is_ok();
                if !alive {
                    gone.push(a.clone());
                }
                alive
            });
            (gone, map.is_empty())
        });
        tracing::debug!("rrpc: shared connection accepted");
        Ok(())
    }

    /// The live shared connection named `id`.
    pub(crate) fn find(&self, id: &Id) -> Option<Arc<Anchor>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let a = map.get(id)?.clone();
        if a.shared.connection().check_alive().is_err() {
            map.remove(id);
            return None;
        }
        Some(a)
    }

    /// The shared connections held now.
    pub(crate) fn stats(&self) -> Vec<SharedConnectionStats> {
        let anchors: Vec<Arc<Anchor>> = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        anchors
            .iter()
            .map(|a| SharedConnectionStats::of(&a.shared, &a.domain.spares, false))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::path_hello;

    #[test]
    fn requests_round_trip_and_bad_ones_say_why() {
        let path = path_hello(0, 4096);
        let id = [7u8; ID_LEN];
        let m = logical_request(&path, &id, 42);
        assert_eq!(
            parse_request(&m).unwrap(),
            Request::Logical {
                path: &path[..],
                id,
                tag: 42
            }
        );
        assert_eq!(parse_request(b"RRPA").unwrap(), Request::Open);
        assert_eq!(parse_request(&path).unwrap(), Request::Dedicated(&path[..]));
        assert_eq!(parse_request(b"").unwrap(), Request::Dedicated(&[][..]));
        let mut bad = m.clone();
        bad[PATH_HELLO_LEN] = b'X';
        assert!(
            parse_request(&bad)
                .unwrap_err()
                .contains("unknown extension")
        );
        assert!(parse_request(&m[..m.len() - 1]).is_err());
        assert_eq!(parse_opened(&opened_reply(&id)).unwrap(), id);
        assert!(parse_opened(b"RRPA").is_err());
        assert!(parse_opened(&path).is_err());
    }

    /// A port's key names the port and the fabric, not the endpoint (which
    /// moves when the port's server restarts); a ring URI's is the URI.
    #[test]
    fn a_port_is_keyed_by_its_address_and_fabric() {
        let shm = |p: &str| FabricAddr::Shm(p.into());
        let rdma = |p: u16| FabricAddr::Rdma(std::net::SocketAddr::from(([10, 0, 0, 1], p)));
        let port = Some("h:50051");
        assert_eq!(
            PeerKey::new(&rdma(40001), port),
            PeerKey::new(&rdma(40002), port)
        );
        assert_eq!(
            PeerKey::new(&shm("/run/a.sock"), port),
            PeerKey::new(&shm("/run/b.sock"), port)
        );
        assert_ne!(
            PeerKey::new(&shm("/run/a.sock"), port),
            PeerKey::new(&rdma(40001), port)
        );
        assert_ne!(
            PeerKey::new(&rdma(40001), port),
            PeerKey::new(&rdma(40001), Some("h:50052"))
        );
        assert_ne!(
            PeerKey::new(&rdma(40001), None),
            PeerKey::new(&rdma(40002), None)
        );
        assert_eq!(
            PeerKey::new(&rdma(40001), None).to_string(),
            "rdma://10.0.0.1:40001"
        );
        assert_eq!(
            PeerKey::new(&rdma(40001), port).to_string(),
            "rrpc://h:50051 (rdma)"
        );
    }

    #[test]
    fn ids_differ() {
        assert_ne!(new_id().unwrap(), new_id().unwrap());
    }
}
