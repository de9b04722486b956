//! Logical connections over a shared queue pair (KRCore §4.4 in a
//! connection's words).
//!
//! A [`SharedConnection`] is an ordinary [`Connection`] whose queue pair is
//! wrapped in a [`PhysicalQp`]. Each logical connection over it runs its own
//! side-channel handshake, like any connection, but creates no queue pair:
//!
//! * the hello carries **no queue-pair endpoint** (that is what marks it
//!   logical) and its ring grants as usual (on shm their memfds);
//! * each side attaches a sharer of its physical queue pair under the tag
//!   the client chose ([`PhysicalQp::attach`] with the same tag at both
//!   ends: the physical pair is the client's and the server's alone), and
//!   adds the peer's grants to what posts on that queue pair may target,
//!   until the logical connection drops;
//! * its own side channel stays open as its liveness signal, exactly as
//!   for a dedicated connection.
//!
//! So a logical connection costs a socket round trip and its rings: no
//! queue pair, no `INIT → RTR → RTS`. Which shared connection a logical
//! hello belongs to is the layers above's business (rrpc-tonic names it in
//! its handshake section, with a secret only the two ends know).
//!
//! ## Retired grants
//!
//! On a dedicated connection the regions we granted go with the queue pair:
//! a write the peer had in flight meets a queue pair that is gone, which
//! fails only that connection. Over a shared queue pair the hardware queue
//! pair stays, and a write into a region already deregistered is a remote
//! access error that fails the *hardware* queue pair, and with it every
//! logical connection on it. So when a logical connection drops, the
//! regions it granted are kept registered for [`GRANT_LEASE`] (KRCore keeps
//! a deregistered memory region for its MR lease for the same reason,
//! §4.3), long enough for the peer to see the connection's side channel
//! close and stop writing, and then released.
//!
//! What a peer can do wrong here is refused like any bad hello: a logical
//! hello to [`Incoming::accept`] (or a dedicated one to
//! [`Incoming::accept_logical`]), a tag already attached, a remote key
//! granted twice. Nothing it does reaches another peer's queue pair: a
//! shared connection connects exactly two ends.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::accept::Incoming;
use super::arenas::LaneArenas;
use super::established::{Connection, LogicalHold};
use super::exchange::{Deadline, Offer, Passed, base_hello, peer_info, reject_code_for};
use super::mux::{MuxLimits, MuxRole};
use super::settings::HandshakeConfig;
use crate::addr::FabricAddr;
use crate::error::{Error, Result};
use crate::handshake::{Hello, Message, Reject};
use crate::provider::LaterGrants;
use crate::provider::side;
use crate::qp::QueuePair;
use crate::region::Region;
use crate::vqp::{PhysicalQp, VqpConfig};

/// A connection whose queue pair carries logical connections
/// ([`connect_logical`], [`Incoming::accept_logical`]). The hardware queue
/// pair lives while this or any logical connection over it does.
#[derive(Debug)]
pub struct SharedConnection {
    phys: PhysicalQp,
    conn: Connection,
    /// Regions granted by logical connections that dropped, kept until
    /// their lease ends (module docs, "Retired grants").
    retired: Mutex<Retired>,
    /// Logical connections over its side channel, rings in arenas
    /// (`lanes`), when both ends granted arenas at the opening.
    pub(super) lanes: Option<super::arenas::Lanes>,
}

/// Grants of dropped logical connections, with when each dropped, oldest
/// first.
type Retired = VecDeque<(Instant, Vec<(u16, Arc<Region>)>)>;

/// How long the regions a dropped logical connection granted stay
/// registered (module docs, "Retired grants"): KRCore's MR lease.
pub const GRANT_LEASE: Duration = Duration::from_secs(1);

impl SharedConnection {
    /// Shares `conn`'s queue pair. Nothing may post on or poll that queue
    /// pair directly from now on.
    ///
    /// # Errors
    /// As [`PhysicalQp::new`].
    pub fn new(conn: Connection, cfg: VqpConfig) -> Result<Arc<SharedConnection>> {
        let phys = PhysicalQp::new(conn.qp().clone(), cfg)?;
        tracing::debug!("connection shared");
        Ok(Arc::new(SharedConnection {
            phys,
            conn,
            retired: Mutex::default(),
            lanes: None,
        }))
    }

    /// Shares `conn`'s queue pair, as [`SharedConnection::new`], with lanes
    /// over its side channel (`lanes` docs): `conn` opened with `ours`
    /// added to its offer ([`LaneArenas::add_to_offer`]), and the peer's
    /// hello carries its arena. From now on one reader reads its side
    /// channel ([`SharedConnection::lane_poll`]).
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] when the peer granted no arena, or one
    /// its section does not describe; as [`PhysicalQp::new`].
    pub fn with_lanes(
        conn: Connection,
        cfg: VqpConfig,
        role: MuxRole,
        ours: LaneArenas,
        limits: MuxLimits,
    ) -> Result<Arc<SharedConnection>> {
        let lanes = super::arenas::Lanes::new(&conn, role, ours, limits)?;
        conn.muxed.store(true, std::sync::atomic::Ordering::Release);
        let phys = PhysicalQp::new(conn.qp().clone(), cfg)?;
        tracing::debug!(?role, "connection shared, with lanes");
        Ok(Arc::new(SharedConnection {
            phys,
            conn,
            retired: Mutex::default(),
            lanes: Some(lanes),
        }))
    }

    /// The connection whose queue pair is shared: its side channel tells
    /// whether the peer is there ([`Connection::check_alive`]).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The shared queue pair: sharers attached now, counters.
    pub fn physical(&self) -> &PhysicalQp {
        &self.phys
    }

    /// Regions of dropped logical connections still held for their lease.
    pub fn retired_regions(&self) -> usize {
        let mut r = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        Self::expire(&mut r, Instant::now());
        r.iter().map(|(_, g)| g.len()).sum()
    }

    fn expire(r: &mut Retired, now: Instant) {
        while r
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= GRANT_LEASE)
        {
            r.pop_front();
        }
    }
}

/// What a logical [`Connection`] holds beyond a dedicated one.
#[derive(Debug)]
pub(super) struct Logical {
    _grants: LaterGrants,
    shared: Arc<SharedConnection>,
}

impl LogicalHold for Logical {
    /// Keeps `grants` (what this logical connection granted the peer)
    /// registered for [`GRANT_LEASE`]; releases older ones.
    fn retire(&self, grants: Vec<(u16, Arc<Region>)>) {
        let now = Instant::now();
        let mut r = self
            .shared
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        SharedConnection::expire(&mut r, now);
        if !grants.is_empty() {
            r.push_back((now, grants));
        }
    }
}

/// Adds the peer's grants in `h` to the hardware queue pair under `shared`.
fn add_grants(
    shared: &SharedConnection,
    h: &Hello,
    fds: Vec<OwnedFd>,
    max_bytes: u64,
    budget: Option<super::BudgetGuard>,
) -> Result<LaterGrants> {
    shared
        .phys
        .hardware()
        .inner
        .add_grants(h, fds, max_bytes, budget)
}

/// Connects a logical connection over `shared` (module docs): a handshake
/// on a new side channel to `endpoint`, offering `offer`'s grants, with a
/// sharer attached under `tag` at both ends. Blocking, bounded by
/// `cfg.timeout()` like [`super::connect`].
///
/// # Errors
/// [`Error::InvalidConfig`] for a tag in use or out of range (nothing is
/// sent); otherwise as [`super::connect`].
pub fn connect_logical(
    endpoint: &FabricAddr,
    shared: &Arc<SharedConnection>,
    tag: u32,
    offer: Offer,
    cfg: &HandshakeConfig,
) -> Result<Connection> {
    let span = tracing::debug_span!("rrpc_connect_logical", %endpoint, tag);
    let _g = span.enter();
    let deadline = Deadline::after(cfg.timeout);
    let qp = shared.phys.attach(tag, tag)?;
    let (side, accept, fds) = side::dial_logical(endpoint, &offer, cfg, deadline)?;
    let peer = peer_info(&accept, shared.conn.peer().provider)?;
    let grants = add_grants(shared, &accept, fds, cfg.max_grant_bytes, None)?;
    let mut conn = Connection::new(side, qp, peer, offer.grants)?;
    conn.logical = Some(Box::new(Logical {
        _grants: grants,
        shared: shared.clone(),
    }));
    tracing::debug!("logical connection connected");
    Ok(conn)
}

impl Incoming {
    /// Whether the client asks for a logical connection over a shared
    /// connection it already has with us (its hello carries no queue-pair
    /// endpoint): answer it with [`Incoming::accept_logical`].
    pub fn is_logical(&self) -> bool {
        self.hello.endpoint.is_empty()
    }

    /// Accepts a logical connection over `shared` (module docs): attaches a
    /// sharer under `tag` (the client's), adds the client's grants to the
    /// shared queue pair, and answers with `offer`'s grants. Blocking,
    /// bounded by the handshake timeout.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for a dedicated hello, a tag in use or
    /// out of range, or grants that cannot be mapped: the client gets a
    /// `Reject` saying so. Transport errors while answering.
    pub fn accept_logical(
        self,
        shared: &Arc<SharedConnection>,
        tag: u32,
        offer: Offer,
    ) -> Result<Connection> {
        let deadline = Deadline::after(self.cfg.timeout);
        let Incoming {
            mut stream,
            hello,
            peer,
            passed: Passed { fds, budget },
            cfg,
        } = self;
        let set_up = || -> Result<(QueuePair, LaterGrants)> {
            if !hello.endpoint.is_empty() {
                return Err(Error::MalformedHandshake(
                    "a dedicated hello where a logical one was expected".into(),
                ));
            }
            if peer.provider != shared.conn.peer().provider {
                return Err(Error::MalformedHandshake(format!(
                    "a {:?} hello for a {:?} shared connection",
                    peer.provider,
                    shared.conn.peer().provider
                )));
            }
            let qp = shared
                .phys
                .attach(tag, tag)
                .map_err(|e| Error::MalformedHandshake(e.to_string()))?;
            let grants = add_grants(shared, &hello, fds, cfg.max_grant_bytes, budget)?;
            Ok((qp, grants))
        };
        let (qp, grants) = match set_up() {
            Ok(x) => x,
            Err(e) => {
                let code = reject_code_for(&e);
                let reject = Message::Reject(Reject {
                    code,
                    reason: e.to_string(),
                });
                let _ = stream.send_in_session(&reject, deadline);
                crate::handshake::count_refusal(code);
                tracing::warn!(error = %e, reason = code.name(), "logical handshake refused");
                return Err(e);
            }
        };
        let answer = Hello {
            provider: peer.provider.code(),
            ..base_hello(&offer)
        };
        stream.send_accept(answer, &offer.grants, deadline)?;
        let mut conn = Connection::new(stream, qp, peer, offer.grants)?;
        conn.logical = Some(Box::new(Logical {
            _grants: grants,
            shared: shared.clone(),
        }));
        tracing::debug!(tag, "logical connection accepted");
        Ok(conn)
    }
}
