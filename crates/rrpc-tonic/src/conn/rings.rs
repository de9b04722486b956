//! The message pipe over real rings: rrpc-core connection + rrpc-ringbuf ring
//! pair + rrpc-poller async wake-ups (one `AsyncConn` per connection,
//! RR-Compound §IV-F: a pre-allocated ring buffer per connection).
//!
//! One code path for both fabrics: `shm://` (side channel: a Unix socket,
//! regions passed as memfds) and `rdma://` (side channel: TCP, regions
//! registered with the verbs device; feature `verbs`).

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rrpc_core::conn::{Connection, HandshakeConfig, Listener, Offer, Pending, connect};
use rrpc_core::{Fabric, FabricAddr};
use rrpc_poller::rings::{AsyncConn, AsyncReceiver, IdleReads, RingConfig, RingRx, RingTx};
use rrpc_poller::{Mode, WatchedFd};

use crate::conn::bundle::{Bundle, BundlePool, make_bundle};
use crate::conn::negotiate::{
    Established, Negotiated, choose_path, client_hello, path_of_reply, section_of,
};
use crate::conn::sharing::{self, Anchors, LaneAsk, LaneAsks, PeerKey, Request};
use crate::conn::spare::Spare;
use crate::conn::{BoxFut, Link, MsgRx, Pipe, gone_cause};
use crate::frame::HANDSHAKE_SECTION;
use crate::{Error, RrpcConfig, RrpcContext};

fn ring_config(cfg: &RrpcConfig) -> Result<RingConfig, Error> {
    // Event mode sleeps on the receive completion channel, which only a tail
    // sent with immediate data fires (rrpc-poller `conn` docs).
    let event = cfg.poller().is_some_and(|p| p.mode() == Mode::Event);
    // The same builder `RrpcConfig::build` checked: the two cannot drift.
    Ok(cfg.ring_builder().tail_with_imm(event).build()?)
}

/// [`ring_config`], for the config's tests.
#[cfg(test)]
pub(crate) fn ring_config_for_tests(cfg: &RrpcConfig) -> Result<RingConfig, Error> {
    ring_config(cfg)
}

struct RingsRx {
    rx: AsyncReceiver,
    // Keeps the connection (side channel, regions) alive as long as the pipe.
    _conn: Arc<Connection>,
}

impl Drop for RingsRx {
    fn drop(&mut self) {
        // Nobody reads any more: say goodbye so the peer fails its calls now
        // (the poller may hold the connection a while longer). The goodbye
        // is a blocking send (bounded at 1 s): never on a tokio worker. A
        // lane's close is one message on its shared side channel, sent
        // here: no blocking thread.
        if self._conn.closes_without_waiting() {
            self._conn.close();
            return;
        }
        let conn = self._conn.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || conn.close());
            }
            Err(_) => conn.close(),
        }
    }
}

impl MsgRx for RingsRx {
    fn carrier(&self) -> Option<rrpc_core::QpCarrier> {
        Some(self._conn.qp().carrier())
    }

    fn idle_reads(&self) -> Option<IdleReads> {
        self.rx.idle_reads()
    }

    fn peer_gone(&self) -> Option<BoxFut<'static, ()>> {
        let conn = self._conn.clone();
        Some(Box::pin(async move {
            // A lane: its liveness, no descriptor (rrpc-core `conn::liveness`).
            let fd = match (conn.liveness(), conn.liveness_fd()) {
                (Some(live), _) => return live.gone().await,
                (None, Some(fd)) => fd,
                (None, None) => return std::future::pending().await,
            };
            let afd = match WatchedFd::new(fd, tokio::io::Interest::READABLE) {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!("rrpc: cannot watch the side channel: {e}");
                    return std::future::pending().await;
                }
            };
            loop {
                let Ok(mut guard) = afd.readable().await else {
                    return std::future::pending().await;
                };
                if conn.check_alive().is_err() {
                    return;
                }
                guard.clear_ready();
            }
        }))
    }

    fn poll_recv_with(
        &mut self,
        cx: &mut Context<'_>,
        f: &mut dyn FnMut(&[u8]),
    ) -> Poll<Result<bool, Error>> {
        let got = match std::task::ready!(self.rx.poll_recv(cx)) {
            Ok(msg) => {
                f(&msg);
                true
            }
            Err(e) if e.is_peer_gone() => match gone_cause(&self._conn) {
                Some(e) => return Poll::Ready(Err(e.into())),
                None => {
                    tracing::debug!(
                        failure = ?self._conn.qp().failure(),
                        "rrpc: ring connection ended"
                    );
                    false
                }
            },
            Err(e) => return Poll::Ready(Err(e.into())),
        };
        // No head push here: RB²'s lazy push (every `gamma` messages, or
        // once `flush_slots` slots were read, as the message is released)
        // and the push of a receiver going idle (`AsyncReceiver::poll_recv`,
        // before it sleeps) keep a sender that found the ring full going.
        // A push after every message cost a WRITE per message on the
        // reply's critical path (~700 instructions on shm, and a cache
        // line the peer's sender then reads).
        Poll::Ready(Ok(got))
    }
}

/// How many times the poller's spin (`bp_timeout`) a receiver on the HTTP/2
/// path spins before it sleeps. A wait there lasts the peer's whole HTTP/2
/// turnaround (hyper's framing, HPACK and flow control on both ends), 4 to 6
/// times the fast path's: with the fast path's 50 µs both ends of a
/// ping-pong ran out of spin on every wait, slept, and each wake-up pushed
/// the other's data past its spin too (`cargo run --release -p examples
/// --bin demo --modes 'default,bpev:1@200'`: 2.00 sleeps per call and p50
/// 0.90x tonic-TCP at 50 µs; 0.5 sleeps and 0.62x at 200 µs auto-tuned).
/// The spin back-off still stops spins that keep missing (a server waiting
/// a millisecond for its next request).
pub(crate) const HTTP2_SPIN_FACTOR: u32 = 4;

/// How often an HTTP/2 path receiver's spin yields to its worker's other
/// tasks. Its reader task shares the worker with hyper's connection task
/// and the call's task, which become runnable while it spins (it has just
/// handed them a message) and wait for its next yield: at rrpc-poller's
/// default (first yield after 1 µs, then every 5 µs) that wait was on the
/// critical path of every turn. Demo A/B, 3 alternating runs each, p50:
/// 26.1–28.8 µs at 5 µs, 22.5–24.1 µs at 1 µs, 21.0–21.2 µs at 300 ns
/// (the fast path, whose server polls handlers inside its reader, did not
/// move: 6.0–6.3 µs).
pub(crate) const HTTP2_SPIN_YIELD: std::time::Duration = std::time::Duration::from_nanos(300);

fn into_pipe(
    conn: Connection,
    tx: RingTx,
    rx: RingRx,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
    path: &Negotiated,
) -> Result<Pipe, Error> {
    Ok(into_pipe_and_conn(conn, tx, rx, cfg, ctx, path)?.0)
}

/// [`into_pipe`], and the connection under the pipe.
fn into_pipe_and_conn(
    conn: Connection,
    tx: RingTx,
    rx: RingRx,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
    path: &Negotiated,
) -> Result<(Pipe, Arc<Connection>), Error> {
    let ac = AsyncConn::new(&ctx.poller_handle()?, conn, tx, rx)?;
    let conn = ac.connection().clone();
    // The poller runs the sender's completion progress and its ring's
    // sizing tick (rrpc-poller `rings` docs).
    let (tx, mut rx) = ac.split_managed()?;
    rx.set_event_spin(cfg.receive_spin());
    if matches!(path, Negotiated::Http2) {
        rx.scale_spin(HTTP2_SPIN_FACTOR);
        rx.set_spin_yield(HTTP2_SPIN_YIELD);
    }
    Ok((
        (
            // The connection's one owner of the ring's sending state.
            Link::ring(tx, conn.clone()),
            Box::new(RingsRx {
                rx,
                _conn: conn.clone(),
            }),
        ),
        conn,
    ))
}

/// The context's pool of bundles on `fabric` (started at the first call),
/// or `None` when pooling is off.
fn bundle_pool(
    fabric: &Fabric,
    ring: &RingConfig,
    ctx: &RrpcContext,
) -> Option<std::sync::Arc<BundlePool>> {
    let cfg = ctx.config();
    ctx.bundle_pool(fabric, |budget| {
        let (f, r, q) = (fabric.clone(), ring.clone(), cfg.queue_pair().clone());
        let pool = rrpc_core::pool::PoolConfig::builder(cfg.connection_pool_for(f.kind()))
            .budget(budget)
            .class(format!("{:?}/{}", f.kind(), r.ring_size()))
            .build()
            .unwrap();
        BundlePool::with_config(
            pool,
            move || make_bundle(&f, &r, &q),
            |(ring, _)| ring.bytes(),
        )
    })
}

/// A bundle for one connection on `fabric`: from the context's pool when
/// it has one (building inline on a miss), else made now. Blocking.
fn take_bundle(fabric: &Fabric, ring: &RingConfig, ctx: &RrpcContext) -> Result<Bundle, Error> {
    match bundle_pool(fabric, ring, ctx) {
        Some(p) => Ok(p.take()?),
        None => Ok(make_bundle(fabric, ring, ctx.config().queue_pair())?),
    }
}

/// The fabric serving `ep`: shm, or the context's verbs device (opened once).
pub(crate) fn fabric_for(ep: &FabricAddr, ctx: &RrpcContext) -> Result<Fabric, Error> {
    match ep {
        FabricAddr::Shm(_) => Ok(Fabric::shm()),
        #[cfg(feature = "verbs")]
        FabricAddr::Rdma(_) => ctx.verbs_fabric(),
        #[cfg(not(feature = "verbs"))]
        FabricAddr::Rdma(_) => {
            let _ = ctx;
            Err(crate::error::rdma_unavailable())
        }
        _ => Err(Error::InvalidConfig("unsupported rrpc-core endpoint")),
    }
}

fn handshake_config(cfg: &RrpcConfig) -> Result<HandshakeConfig, Error> {
    let mut hs = HandshakeConfig::builder().timeout(cfg.handshake_timeout());
    if let Some(t) = cfg.token() {
        hs = hs.token(t.to_vec());
    }
    #[cfg(feature = "verbs")]
    {
        let (server, client) = cfg.tls();
        if let Some(s) = server {
            hs = hs.tls_server(s.clone());
        }
        if let Some((c, name)) = client {
            hs = hs.tls_client(c.clone(), name.clone());
        }
    }
    Ok(hs.build()?)
}

/// Dials `shm:///path` or `rdma://host:port` with `ctx`'s resources;
/// `port` is the `rrpc://` port (`host:port`) whose negotiation named `ep`,
/// if one did (what a shared connection is cached by: [`PeerKey`]).
pub(crate) async fn dial(
    ep: FabricAddr,
    port: Option<&str>,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<(Pipe, Negotiated), Error> {
    // Spares: dedicated connections, or on `shm://` with shared queue
    // pairs lanes opened ahead (`spare` docs).
    let spares = cfg.spare_connections() > 0
        && (!cfg.shared_queue_pairs() || matches!(ep, FabricAddr::Shm(_)));
    let key = PeerKey::new(&ep, port);
    if spares {
        // A spare dialed ahead, if one waits whose side channel is still
        // open (`spare` docs); dead ones are dropped here. Lanes: while a
        // refill has opens in flight, the next to land is as near as an
        // open of our own, and waiting for it keeps the opens in flight at
        // the refill's bound instead of adding one per connect.
        let server = spare_key(&ep);
        let until = tokio::time::Instant::now() + cfg.handshake_timeout();
        loop {
            let landed = ctx.spares().landed();
            tokio::pin!(landed);
            landed.as_mut().enable();
            let taken = ctx
                .spares()
                .take(&server, cfg, Instant::now(), |(_, _, conn): &Spare| {
                    conn.check_alive().is_ok()
                });
            if !taken.dropped.is_empty() {
                tracing::debug!(endpoint = %ep, dropped = taken.dropped.len(), "rrpc: spare connections gone");
            }
            drop(taken.dropped);
            if let Some((pipe, path, _)) = taken.spare {
                refill_spares(key, ep, cfg, ctx);
                return Ok((pipe, path));
            }
            if !cfg.shared_queue_pairs()
                || !ctx.spares().filling(&server, cfg)
                || tokio::time::timeout_at(until, landed).await.is_err()
            {
                break;
            }
        }
    }
    let ring = ring_config(cfg)?;
    let hs = handshake_config(cfg)?;
    let lane = if cfg.shared_queue_pairs() && matches!(ep, FabricAddr::Shm(_)) {
        dial_lane(&key, &ep, &ring, &hs, cfg, ctx).await?
    } else {
        None
    };
    let (conn, tx, rx, path) = if let Some(d) = lane {
        d
    } else if !cfg.shared_queue_pairs() && matches!(ep, FabricAddr::Shm(_)) {
        // On shm nothing but the server's answer waits: awaited here, on
        // no thread of its own (`dial_dedicated_async`).
        dial_dedicated_async(&ep, &ring, &hs, cfg, ctx).await?
    } else {
        dial_blocking(key.clone(), ep.clone(), ring, hs, cfg, ctx).await?
    };
    let pipe = into_pipe(conn, tx, rx, cfg, ctx, &path)?;
    if spares {
        refill_spares(key, ep, cfg, ctx);
    }
    Ok((pipe, path))
}

/// A dedicated or logical connection to `ep` dialed on a blocking thread
/// (the handshake waits: TCP and TLS on `rdma://`, the verbs device, a
/// shared connection's opening).
async fn dial_blocking(
    key: PeerKey,
    ep: FabricAddr,
    ring: RingConfig,
    hs: HandshakeConfig,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<Dialed, Error> {
    let (cfg2, ctx2, ep2) = (cfg.clone(), ctx.clone(), ep);
    tokio::task::spawn_blocking(move || -> Result<_, Error> {
        let fabric = fabric_for(&ep2, &ctx2)?;
        if cfg2.shared_queue_pairs() {
            return dial_logical(&key, &ep2, &fabric, &ring, &hs, &cfg2, &ctx2);
        }
        dial_dedicated(&ep2, &fabric, &ring, &hs, &cfg2, &ctx2)
    })
    .await
    .map_err(|e| Error::Io(std::io::Error::other(e)))?
}

/// [`dial_dedicated`] on the connect's own task, for shm: the bundle is
/// made (or taken from the pool) and the hello sent without waiting
/// ([`rrpc_core::conn::Dialing`]); the server's answer is awaited on the
/// socket's readiness, then read and checked without waiting. Two thread
/// hand-offs fewer per connect than a blocking thread (there and back).
/// Where the start would wait (a full listen backlog) the rest runs on a
/// blocking thread. Bounded by the handshake timeout.
///
/// # Cancel safety
/// Dropping the future closes the side channel and releases the bundle;
/// nothing is left behind.
async fn dial_dedicated_async(
    ep: &FabricAddr,
    ring: &RingConfig,
    hs: &HandshakeConfig,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<Dialed, Error> {
    let fabric = fabric_for(ep, ctx)?;
    let (local, qp) = take_bundle(&fabric, ring, ctx)?;
    let offer = Offer::new()
        .token(cfg.token().map(<[u8]>::to_vec))
        .section(HANDSHAKE_SECTION, client_hello(cfg).to_vec());
    let offer = local.add_to_offer(offer);
    let dialing = rrpc_core::conn::Dialing::start(ep, qp, offer, hs)?;
    let c = match dialing.answer_fd() {
        Some(fd) => {
            let left = dialing.remaining();
            let afd = WatchedFd::new(fd, tokio::io::Interest::READABLE)?;
            let arrived = async {
                loop {
                    let mut guard = afd.readable().await?;
                    // Also when the server left mid-answer (`finish` then
                    // fails at once): a closed socket stays readable, and
                    // waiting again would spin.
                    if dialing.answer_arrived()? {
                        return Ok::<_, Error>(());
                    }
                    guard.clear_ready();
                }
            };
            match tokio::time::timeout(left, arrived).await {
                Ok(r) => r?,
                Err(_) => return Err(rrpc_core::Error::Timeout.into()),
            }
            drop(afd);
            dialing.finish()?
        }
        None => tokio::task::spawn_blocking(move || dialing.finish())
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))??,
    };
    let path = path_of_reply(section_of(c.peer()))?;
    let (tx, rx) = local.connect(&c)?;
    Ok((c, tx, rx, path))
}

/// A lane to `ep` (`sharing` docs, rrpc-core `conn::lanes`): one message
/// on the shared connection's side channel, rings in slots of the arenas
/// granted when it opened; on the connect's task, holding no thread once
/// the shared connection is open (its opening runs on a blocking thread).
/// `None` when there is no lane to be had: the shared connection has no
/// lanes (the server grants no arena), or our arenas or the server's are
/// full (the server refuses then, saying so: `sharing::ARENA_FULL`); the
/// connect then runs a logical connection's own handshake. A server that still
/// holds the tag picked is asked again with another, twice at most.
/// Bounded by the handshake timeout.
///
/// # Cancel safety
/// Dropping the future gives the request up: the lane is closed when its
/// answer comes, and its slots come back with the close.
async fn dial_lane(
    key: &PeerKey,
    ep: &FabricAddr,
    ring: &RingConfig,
    hs: &HandshakeConfig,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<Option<Dialed>, Error> {
    let peer = match ctx.peers().cached(key, ep) {
        Some(p) => p,
        None => {
            let (key, ep, ring, hs, cfg, ctx) = (
                key.clone(),
                ep.clone(),
                ring.clone(),
                hs.clone(),
                cfg.clone(),
                ctx.clone(),
            );
            tokio::task::spawn_blocking(move || {
                let fabric = fabric_for(&ep, &ctx)?;
                ctx.peers()
                    .get_or_open(&key, &ep, &fabric, &ring, &cfg, &hs)
            })
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))??
        }
    };
    if !peer.shared.has_lanes() {
        return Ok(None);
    }
    let deadline = tokio::time::Instant::now() + cfg.handshake_timeout();
    let mut tries = 0;
    loop {
        tries += 1;
        let (rx_len, tx_len) = rrpc_poller::rings::LocalRing::region_lens(ring);
        let Some(slots) = peer.shared.lane_slots(rx_len, tx_len) else {
            tracing::debug!(endpoint = %ep, "rrpc: lane arenas full; a logical handshake instead");
            return Ok(None);
        };
        let slice = slots.slice;
        let hello = client_hello(cfg);
        let set_up = (|| -> Result<_, Error> {
            let local = rrpc_poller::rings::LocalRing::in_regions(
                rrpc_core::ProviderKind::Shm,
                ring,
                slots.rx,
                slots.tx,
                None,
            )?;
            let tag = peer.free_tag()?;
            let parts = rrpc_core::conn::mux::Parts {
                sections: vec![
                    (HANDSHAKE_SECTION, hello.to_vec()),
                    (rrpc_ringbuf::ROLE_RING, local.params().encode()),
                    // This client takes slots granted ahead.
                    (sharing::AHEAD_HELLO, Vec::new()),
                ],
                slices: vec![(rrpc_ringbuf::ROLE_RING, slice)],
            };
            // A slot granted ahead for this hello: open into it, and do
            // not wait for the answer (`sharing` docs, "Lanes opened ahead").
            // Not with a tail sent with immediate data (the poller's Event
            // mode): one sent before the server attached the lane's tag
            // would be dropped, and with it the wake-up.
            if !ring.tail_with_imm() {
                let fits = |sections: &[(u16, Vec<u8>)]| {
                    sections
                        .iter()
                        .any(|(role, b)| *role == sharing::AHEAD_HELLO && b[..] == hello[..])
                };
                // An error here leaves the slot with the lane (it comes back
                // with its close), not with us.
                match peer
                    .shared
                    .lane_open_ahead(tag, parts.clone(), rrpc_ringbuf::ROLE_RING, fits)
                {
                    Ok(Some((_, conn))) => return Ok(Err(Ok((local, conn)))),
                    Ok(None) => {}
                    Err(e) => return Ok(Err(Err(e))),
                }
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            // Registered before the reader can see the answer.
            let mut w = peer.waiters.lock().unwrap_or_else(|p| p.into_inner());
            let req = peer.shared.lane_open(tag, parts)?;
            w.insert(req, tx);
            Ok(Ok((local, req, rx)))
        })();
        let (local, req, answer) = match set_up {
            Ok(Ok(x)) => x,
            Ok(Err(Err(e))) => return Err(e.into()),
            Ok(Err(Ok((local, conn)))) => {
                let path = path_of_reply(section_of(conn.peer()))?;
                let (tx, rx) = local.connect(&conn)?;
                return Ok(Some((conn, tx, rx, path)));
            }
            Err(e) => {
                peer.shared.lane_untake(slice);
                return Err(e);
            }
        };
        let mut given_up = GiveUp {
            peer: &peer,
            req,
            armed: true,
        };
        let answered = tokio::time::timeout_at(deadline, answer).await;
        given_up.armed = false;
        let conn = match answered {
            Err(_) => {
                given_up.armed = true;
                // A server that hangs with its end open: the next connect
                // opens a new shared connection.
                ctx.peers().invalidate(key, &peer);
                return Err(rrpc_core::Error::Timeout.into());
            }
            Ok(Err(_)) => {
                ctx.peers().invalidate(key, &peer);
                return Err(rrpc_core::Error::PeerGone.into());
            }
            Ok(Ok(Err(rrpc_core::Error::Rejected(r)))) if r.contains(sharing::ARENA_FULL) => {
                tracing::debug!(endpoint = %ep, "rrpc: the server's lane arena is full; a logical handshake instead");
                return Ok(None);
            }
            Ok(Ok(Err(rrpc_core::Error::Rejected(r)))) if tries < 3 && sharing::is_stale(&r) => {
                tracing::debug!(endpoint = %ep, reason = %r, "rrpc: lane refused; retrying");
                continue;
            }
            Ok(Ok(r)) => r?,
        };
        let path = path_of_reply(section_of(conn.peer()))?;
        let (tx, rx) = local.connect(&conn)?;
        return Ok(Some((conn, tx, rx, path)));
    }
}

/// A lane request whose connect gave up (timed out, or its future was
/// dropped): the lane is closed when it opens.
struct GiveUp<'a> {
    peer: &'a sharing::SharedPeer,
    req: u32,
    armed: bool,
}

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.peer
                .waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.req);
            self.peer.shared.lane_abandon(self.req);
        }
    }
}

/// What a connect sets up before its pipe: the connection, both ring ends
/// and the path agreed.
type Dialed = (Connection, RingTx, RingRx, Negotiated);

/// A dedicated connection to `ep`: a bundle (pooled or made now), the
/// handshake with the path hello in it, both rings connected. Blocking.
fn dial_dedicated(
    ep: &FabricAddr,
    fabric: &Fabric,
    ring: &RingConfig,
    hs: &HandshakeConfig,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<Dialed, Error> {
    let (local, qp) = take_bundle(fabric, ring, ctx)?;
    // The path hello rides in the handshake (module docs of `transport`).
    let offer = Offer::new()
        .token(cfg.token().map(<[u8]>::to_vec))
        .section(HANDSHAKE_SECTION, client_hello(cfg).to_vec());
    let offer = local.add_to_offer(offer);
    let c = connect(ep, qp, offer, hs)?;
    let path = path_of_reply(section_of(c.peer()))?;
    let (tx, rx) = local.connect(&c)?;
    Ok((c, tx, rx, path))
}

/// A spare connection to `ep`: dialed as [`dial_dedicated`], then
/// registered with the poller (on the blocking thread, which has the
/// runtime's context), so that taking it costs nothing more. Blocking.
fn dial_spare(
    ep: &FabricAddr,
    fabric: &Fabric,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<Spare, Error> {
    let (ring, hs) = (ring_config(cfg)?, handshake_config(cfg)?);
    let (conn, tx, rx, path) = dial_dedicated(ep, fabric, &ring, &hs, cfg, ctx)?;
    let (pipe, conn) = into_pipe_and_conn(conn, tx, rx, cfg, ctx, &path)?;
    Ok((pipe, path, conn))
}

/// How long after a connect the refill of spare connections starts. At
/// once, its blocking thread woke while the connect was still returning
/// and took the CPU from it (on 2 shared cores a taken spare's connect p50
/// was 116–132 µs in three runs, the refill started at once, against 27 µs
/// with the machine quiet); a millisecond later the connect and, usually,
/// its first call are done. tokio's timer wheel rounds to 1 ms anyway.
const SPARE_REFILL_DELAY: Duration = Duration::from_millis(1);

/// Tops up `ctx`'s spare connections to `ep` for `cfg`, unless a refill
/// already runs or they are full (`spare` docs): dedicated connections on
/// a blocking task started [`SPARE_REFILL_DELAY`] from now; with shared
/// queue pairs on `shm://`, lanes on a task of the runtime, every one
/// missing opened at once. A dial that fails ends the refill quietly: the
/// next connect dials as usual (and starts another refill), so a server
/// that is gone costs nothing here.
fn refill_spares(key: PeerKey, ep: FabricAddr, cfg: &RrpcConfig, ctx: &RrpcContext) {
    let server = spare_key(&ep);
    if !ctx.spares().begin_fill(&server, cfg) {
        return;
    }
    let fill = Refill {
        server,
        cfg: cfg.clone(),
        ctx: ctx.clone(),
        running: true,
    };
    if cfg.shared_queue_pairs() {
        tokio::spawn(fill.run_lanes(key, ep));
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(SPARE_REFILL_DELAY).await;
        tokio::task::spawn_blocking(move || fill.run(ep));
    });
}

/// Starts, unless one runs, a task that drops `ctx`'s spares past their
/// lease every quarter lease of `cfg` (at least 100 ms) until none is
/// left ([`Spares::expire`](crate::conn::spare::Spares::expire)). Without
/// it a spare nobody took stayed until the next connect looked, holding
/// its connection at both ends (and a spare lane its shared connection,
/// which the sharing sweeper leaves alone while it carries one).
fn sweep_spares(cfg: &RrpcConfig, ctx: &RrpcContext) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if !ctx.spares().begin_sweep() {
        return;
    }
    /// Ends the sweep in the store if its runtime drops the task first
    /// (the next push starts another).
    struct Sweeping(Option<RrpcContext>);
    impl Drop for Sweeping {
        fn drop(&mut self) {
            if let Some(ctx) = self.0.take() {
                ctx.spares().end_sweep();
            }
        }
    }
    let period = (cfg.peer_lease() / 4).max(Duration::from_millis(100));
    let mut sweeping = Sweeping(Some(ctx.clone()));
    rt.spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let Some(ctx) = &sweeping.0 else { return };
            let (gone, none_left) = ctx.spares().expire(Instant::now());
            if !gone.is_empty() {
                tracing::debug!(
                    dropped = gone.len(),
                    "rrpc: spare connections past their lease dropped"
                );
            }
            drop(gone);
            if none_left {
                // Ended in `expire`, under the store's lock.
                let _ = sweeping.0.take();
                return;
            }
        }
    });
}

/// Whom spares are kept for: the server dialed, and the runtime the
/// connect ran on. A spare is registered with that runtime's reactor when
/// it is made, so only a connect on that runtime, which is then alive,
/// takes it (a context outlives runtimes: `RrpcContext::shared`).
fn spare_key(ep: &FabricAddr) -> String {
    let rt = tokio::runtime::Handle::try_current().map(|h| h.id().to_string());
    format!("{ep} on runtime {}", rt.unwrap_or_default())
}

/// A refill started: ends it in the store however it ends (the runtime
/// may drop the task before it runs, shutting down), so that the next
/// connect can start another.
struct Refill {
    server: String,
    cfg: RrpcConfig,
    ctx: RrpcContext,
    /// Still to be ended in the store ([`Spares::next`](crate::conn::spare::Spares::next)
    /// ends a refill that is done).
    running: bool,
}

impl Refill {
    /// Dials spares until there are enough. Blocking.
    fn run(mut self, ep: FabricAddr) {
        let (server, cfg, ctx) = (&self.server, &self.cfg, &self.ctx);
        let made = fabric_for(&ep, ctx).and_then(|fabric| {
            while ctx.spares().next(server, cfg) {
                let spare = dial_spare(&ep, &fabric, cfg, ctx)?;
                drop(ctx.spares().push(server, cfg, Instant::now(), spare));
                sweep_spares(cfg, ctx);
            }
            Ok(())
        });
        self.ended(&ep, made);
    }

    /// Opens lanes until there are enough spares, every one missing at
    /// once: their opens cross the side channel together and the server
    /// answers them as they come, so a refill of `n` costs about one round
    /// trip, not `n`; each is a spare as soon as it is open, and one taken
    /// meanwhile is replaced by a new open at once (`spare` docs). On the
    /// runtime: nothing here blocks. A shared connection with no lanes (or
    /// full arenas) ends the refill.
    ///
    /// # Cancel safety
    /// Dropped (the runtime shutting down), the lanes still opening are
    /// given up (closed when their answers come) and the refill is ended
    /// in the store.
    async fn run_lanes(mut self, key: PeerKey, ep: FabricAddr) {
        let (server, cfg, ctx) = (&self.server, &self.cfg, &self.ctx);
        let made = async {
            let (ring, hs) = (ring_config(cfg)?, handshake_config(cfg)?);
            let open = || async {
                let (conn, tx, rx, path) = dial_lane(&key, &ep, &ring, &hs, cfg, ctx)
                    .await?
                    .ok_or(Error::InvalidConfig("no lane to be had for a spare"))?;
                let (pipe, conn) = into_pipe_and_conn(conn, tx, rx, cfg, ctx, &path)?;
                Ok::<Spare, Error>((pipe, path, conn))
            };
            let mut opening = futures_util::stream::FuturesUnordered::new();
            loop {
                for _ in 0..ctx.spares().shortfall(server, cfg, opening.len()) {
                    opening.push(open());
                }
                // None: none missing and none in flight (the refill ended
                // in `shortfall`).
                let Some(spare) = futures_util::StreamExt::next(&mut opening).await else {
                    return Ok(());
                };
                drop(ctx.spares().push(server, cfg, Instant::now(), spare?));
                sweep_spares(cfg, ctx);
            }
        }
        .await;
        self.ended(&ep, made);
    }

    fn ended(&mut self, ep: &FabricAddr, made: Result<(), Error>) {
        match made {
            Ok(()) => {
                self.running = false;
                tracing::trace!(endpoint = %ep, "rrpc: spare connections ready");
            }
            Err(e) => {
                tracing::debug!(endpoint = %ep, error = %e, "rrpc: spare connection refill ended");
            }
        }
    }
}

impl Drop for Refill {
    fn drop(&mut self) {
        if self.running {
            self.ctx.spares().stop_fill(&self.server, &self.cfg);
        }
    }
}

/// A logical connection to `ep` over the context's shared connection to
/// the server `key` names (opened first if there is none; `sharing` docs).
/// A server that no longer knows the shared connection (it restarted), or
/// that still holds the tag picked, is tried again with a fresh one, twice
/// at most. Blocking.
fn dial_logical(
    key: &PeerKey,
    ep: &FabricAddr,
    fabric: &Fabric,
    ring: &RingConfig,
    hs: &HandshakeConfig,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<Dialed, Error> {
    let mut tries = 0;
    loop {
        tries += 1;
        let peer = ctx.peers().get_or_open(key, ep, fabric, ring, cfg, hs)?;
        let tag = peer.free_tag()?;
        let local = peer.domain.take_rings(ring)?;
        let app = sharing::logical_request(&client_hello(cfg), &peer.id, tag);
        let offer = Offer::new()
            .token(cfg.token().map(<[u8]>::to_vec))
            .section(HANDSHAKE_SECTION, app);
        let offer = local.add_to_offer(offer);
        match rrpc_core::conn::connect_logical(ep, &peer.shared, tag, offer, hs) {
            Ok(c) => {
                let path = path_of_reply(section_of(c.peer()))?;
                let (tx, rx) = local.connect(&c)?;
                peer.domain.refill(ring, cfg);
                return Ok((c, tx, rx, path));
            }
            Err(rrpc_core::Error::Rejected(r)) if tries < 3 && sharing::is_stale(&r) => {
                tracing::debug!(endpoint = %ep, reason = %r, "rrpc: shared connection refused; retrying");
                if r.contains(sharing::UNKNOWN) {
                    ctx.peers().invalidate(key, &peer);
                }
            }
            Err(e) => {
                if peer.shared.connection().check_alive().is_err() {
                    ctx.peers().invalidate(key, &peer);
                }
                return Err(e.into());
            }
        }
    }
}

/// A listening `shm://` or `rdma://` side channel.
pub(crate) struct RingsListener {
    /// The listener's readiness (declared first: dropped, so deregistered,
    /// before the listener closes).
    watch: WatchedFd,
    listener: Listener,
    ring: RingConfig,
    cfg: RrpcConfig,
    ctx: RrpcContext,
    fabric: Fabric,
    /// Where this listener's shared connections' lane readers send what
    /// their clients ask for, and where `accept` takes it from.
    asks: LaneAsks,
    asked: tokio::sync::mpsc::UnboundedReceiver<LaneAsk>,
}

impl std::fmt::Debug for RingsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingsListener")
            .field("path", &self.listener.path())
            .finish()
    }
}

/// How long the accept loop pauses when `accept(2)` fails for a local
/// reason (`EMFILE`, `ENFILE`, `ENOMEM`): the socket stays readable, so
/// retrying at once would spin (hyper and tokio's listeners pause too).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

impl RingsListener {
    pub(crate) fn bind(ep: FabricAddr, cfg: &RrpcConfig, ctx: &RrpcContext) -> Result<Self, Error> {
        // Open the device before accepting anyone (and fail here if there is none).
        let fabric = fabric_for(&ep, ctx)?;
        if let FabricAddr::Rdma(addr) = &ep
            && !addr.ip().is_loopback()
            && cfg.token().is_none()
        {
            tracing::warn!(
                %addr,
                "rrpc: rdma:// server on a non-loopback address without a token: \
                 anyone who can reach this port can connect (set RrpcConfig::token)"
            );
        }
        let l = Listener::bind(&ep, handshake_config(cfg)?)?;
        l.set_nonblocking(true)?;
        // A pooled server starts filling its pool before the first client.
        let _ = bundle_pool(&fabric, &ring_config(cfg)?, ctx);
        let watch = WatchedFd::new(l.as_fd(), tokio::io::Interest::READABLE)?;
        let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
        Ok(RingsListener {
            watch,
            listener: l,
            ring: ring_config(cfg)?,
            cfg: cfg.clone(),
            ctx: ctx.clone(),
            fabric,
            asks,
            asked,
        })
    }

    /// The side channel's TCP address (`rdma://`); `None` on `shm://`.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Takes the next client off the listening socket, without reading
    /// from it, or the next lane a client of a shared connection asks for
    /// ([`LaneAsk`]); [`RingsPending::establish`] does the handshake (or
    /// answers the lane).
    ///
    /// # Cancel safety
    /// Cancel safe: the awaits are the socket's readiness and a channel's
    /// `recv` (cancel safe); a client is taken off the socket and returned
    /// in the same poll.
    pub(crate) async fn accept(&mut self) -> Option<RingsPending> {
        loop {
            let guard = tokio::select! {
                ask = self.asked.recv() => {
                    // Never `None`: `self.asks` is a sender.
                    let ask = ask?;
                    return Some(self.pending(Came::Lane(ask)));
                }
                ready = self.watch.readable() => ready,
            };
            let mut guard = guard.ok()?;
            match self.listener.accept_pending() {
                Ok(pending) => return Some(self.pending(Came::Side(pending))),
                Err(rrpc_core::Error::WouldBlock) => guard.clear_ready(),
                Err(e) => {
                    tracing::warn!(error = %e, "rrpc shm accept failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }

    fn pending(&self, from: Came) -> RingsPending {
        RingsPending {
            from,
            ring: self.ring.clone(),
            cfg: self.cfg.clone(),
            ctx: self.ctx.clone(),
            fabric: self.fabric.clone(),
            asks: self.asks.clone(),
        }
    }
}

/// Where a [`RingsPending`] came from.
enum Came {
    /// A client on the listening socket, its hello not read yet.
    Side(Pending),
    /// A lane a client asked for over its shared connection.
    Lane(LaneAsk),
}

/// A client accepted on an `shm://` listener whose handshake has not run.
pub(crate) struct RingsPending {
    from: Came,
    ring: RingConfig,
    cfg: RrpcConfig,
    ctx: RrpcContext,
    fabric: Fabric,
    asks: LaneAsks,
}

impl RingsPending {
    /// The client's identity for logs (pid and uid).
    pub(crate) fn peer_addr(&self) -> String {
        match &self.from {
            Came::Side(p) => p.peer_addr(),
            Came::Lane(a) => format!(
                "{:?}, lane {} of a shared connection",
                a.shared.connection().peer_key(),
                a.tag
            ),
        }
    }

    /// Who the client is, as its socket says (`SO_PEERCRED` on shm, the
    /// source address on `rdma://`; a lane's, its shared connection's):
    /// the key of the server's per-peer connection limit.
    pub(crate) fn peer_key(&self) -> rrpc_core::conn::PeerKey {
        match &self.from {
            Came::Side(p) => p.peer_key(),
            Came::Lane(a) => a.shared.connection().peer_key(),
        }
    }

    /// Refuses the client with `reason` in rrpc-core's `Reject`, once its
    /// hello has arrived (a `Reject` answers a hello), so that it reads
    /// why instead of a closed socket. Takes nothing from the pool.
    /// Bounded by the handshake timeout.
    pub(crate) async fn refuse(self, reason: String) -> Result<(), Error> {
        let mut pending = match self.from {
            Came::Side(p) => p,
            Came::Lane(mut a) => {
                a.open = false;
                return Ok(a.shared.lane_refuse(a.req, &reason)?);
            }
        };
        whole_hello_within(&mut pending, self.cfg.handshake_timeout()).await?;
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            pending.handshake()?.reject(&reason)?;
            Ok(())
        })
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
    }

    /// Runs the handshake: waits (asynchronously, holding no thread) until
    /// the client's whole hello has arrived, then reads and checks it, maps
    /// the client's rings and answers, on a blocking thread (it does not
    /// wait for the client there). Bounded by the handshake timeout.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes drops the client (its side
    /// channel closes, so the client sees the server leave).
    pub(crate) async fn establish(self) -> Result<Established, Error> {
        let timeout = self.cfg.handshake_timeout();
        let RingsPending {
            from,
            ring,
            cfg,
            ctx,
            fabric,
            asks,
        } = self;
        let mut pending = match from {
            Came::Side(p) => p,
            Came::Lane(a) => {
                // Nothing here waits: the ask is in hand, the rings are
                // slots of the arenas.
                let (c, tx, rx, path) = answer_lane(a, &ring, &cfg)?;
                return Ok(Established::Pipe(
                    into_pipe(c, tx, rx, &cfg, &ctx, &path)?,
                    path,
                ));
            }
        };
        whole_hello_within(&mut pending, timeout).await?;
        // On shm without TLS nothing here waits any more (the hello is in
        // the socket, the answer fits its buffer, the rings are memfds):
        // no blocking thread, two hand-offs fewer per connect.
        let set_up = if fabric.kind() == rrpc_core::ProviderKind::Shm && !pending.uses_tls() {
            answer(pending.handshake()?, &fabric, &ring, &cfg, &ctx, &asks)?
        } else {
            let (cfg2, ctx2) = (cfg.clone(), ctx.clone());
            tokio::task::spawn_blocking(move || -> Result<Option<Dialed>, Error> {
                let incoming = pending.handshake()?;
                answer(incoming, &fabric, &ring, &cfg2, &ctx2, &asks)
            })
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))??
        };
        Ok(match set_up {
            Some((c, tx, rx, path)) => {
                Established::Pipe(into_pipe(c, tx, rx, &cfg, &ctx, &path)?, path)
            }
            None => Established::Shared,
        })
    }
}

/// The server's answer to a client whose hello was read: a connection of
/// its own, a shared connection opened (`None`: no pipe), or a logical
/// connection over one. The client's path hello rode in its hello; a bad
/// one is refused before anything is taken from the pool. Blocking.
fn answer(
    incoming: rrpc_core::conn::Incoming,
    fabric: &Fabric,
    ring: &RingConfig,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
    asks: &LaneAsks,
) -> Result<Option<Dialed>, Error> {
    let anchors: &Anchors = ctx.anchors();
    let refuse = |incoming: rrpc_core::conn::Incoming, reason: String| -> Error {
        let _ = incoming.reject(&reason);
        Error::Handshake(format!("client's {reason}"))
    };
    let app = section_of(incoming.peer()).to_vec();
    let request = match sharing::parse_request(&app) {
        Ok(r) => r,
        Err(e) => return Err(refuse(incoming, format!("handshake section: {e}"))),
    };
    let path_hello = match &request {
        Request::Open => {
            anchors.open(incoming, fabric, ring, cfg, Some(asks))?;
            return Ok(None);
        }
        Request::Dedicated(path) | Request::Logical { path, .. } => path,
    };
    let (path, reply) = match choose_path(path_hello, cfg) {
        Ok(chosen) => chosen,
        Err(e) => return Err(refuse(incoming, format!("path hello: {e}"))),
    };
    if let Request::Logical { id, tag, .. } = request {
        if !cfg.shared_queue_pairs() {
            return Err(refuse(incoming, sharing::OFF.into()));
        }
        let Some(anchor) = anchors.find(&id) else {
            return Err(refuse(incoming, sharing::UNKNOWN.into()));
        };
        let local = anchor.domain.take_rings(ring)?;
        let offer = local.add_to_offer(Offer::new().section(HANDSHAKE_SECTION, reply.to_vec()));
        let c = incoming.accept_logical(&anchor.shared, tag, offer)?;
        let (tx, rx) = local.connect(&c)?;
        anchor.domain.refill(ring, cfg);
        return Ok(Some((c, tx, rx, path)));
    }
    let (local, qp) = take_bundle(fabric, ring, ctx)?;
    let offer = local.add_to_offer(Offer::new().section(HANDSHAKE_SECTION, reply.to_vec()));
    let c = incoming.accept(qp, offer)?;
    let (tx, rx) = local.connect(&c)?;
    Ok(Some((c, tx, rx, path)))
}

/// The server's answer to a lane a client asked for (`sharing` docs): the
/// path agreed from the client's path hello, our rings in slots of our
/// arena, the lane's connection set up before the answer goes out. A bad
/// path hello, full arenas or a tag still held here are refusals (the
/// client reads why). Does not wait.
fn answer_lane(mut ask: LaneAsk, ring: &RingConfig, cfg: &RrpcConfig) -> Result<Dialed, Error> {
    ask.open = false;
    let shared = ask.shared.clone();
    let refuse = |reason: String| -> Error {
        let _ = shared.lane_refuse(ask.req, &reason);
        Error::Handshake(format!("client's lane: {reason}"))
    };
    let hello = ask.parts.section(HANDSHAKE_SECTION).unwrap_or(&[]);
    let (path, reply) = match choose_path(hello, cfg) {
        Ok(chosen) => chosen,
        Err(e) => return Err(refuse(format!("path hello: {e}"))),
    };
    let (rx_len, tx_len) = rrpc_poller::rings::LocalRing::region_lens(ring);
    if let Some(slot) = ask.ahead {
        // Opened ahead: the client writes into the slot granted ahead
        // already (its records were reset then), and expects the answer
        // granted with it.
        let local = shared
            .lane_views(slot, rx_len, tx_len)
            .map_err(Error::from)
            .and_then(|v| {
                Ok(rrpc_poller::rings::LocalRing::in_regions_as_written(
                    rrpc_core::ProviderKind::Shm,
                    ring,
                    v.rx,
                    v.tx,
                    None,
                )?)
            });
        let local = match local {
            Ok(l) => l,
            Err(e) => return Err(refuse(format!("rings: {e}"))),
        };
        let c = shared.lane_accept(
            ask.req,
            ask.tag,
            &ask.parts,
            rrpc_core::conn::mux::Parts::default(),
        )?;
        let (tx, rx) = local.connect(&c)?;
        if ask.parts.section(sharing::AHEAD_HELLO).is_some() {
            grant_ahead(&shared, ring, hello, &reply);
        }
        return Ok((c, tx, rx, path));
    }
    let Some(slots) = shared.lane_slots(rx_len, tx_len) else {
        return Err(refuse(sharing::ARENA_FULL.into()));
    };
    let slice = slots.slice;
    let local = match rrpc_poller::rings::LocalRing::in_regions(
        rrpc_core::ProviderKind::Shm,
        ring,
        slots.rx,
        slots.tx,
        None,
    ) {
        Ok(l) => l,
        Err(e) => {
            shared.lane_untake(slice);
            return Err(refuse(format!("rings: {e}")));
        }
    };
    let ours = rrpc_core::conn::mux::Parts {
        sections: vec![
            (HANDSHAKE_SECTION, reply.to_vec()),
            (rrpc_ringbuf::ROLE_RING, local.params().encode()),
        ],
        slices: vec![(rrpc_ringbuf::ROLE_RING, slice)],
    };
    let c = shared.lane_accept(ask.req, ask.tag, &ask.parts, ours)?;
    let (tx, rx) = local.connect(&c)?;
    if ask.parts.section(sharing::AHEAD_HELLO).is_some() {
        grant_ahead(&shared, ring, hello, &reply);
    }
    Ok((c, tx, rx, path))
}

/// Slots a server keeps granted ahead to each client with lanes (rrpc-core
/// `conn::mux`, "Open ahead"): a client's connects back to back each take
/// one, and each accept grants one back.
pub(crate) const LANES_AHEAD: usize = 4;

/// Tops up the slots granted ahead to the client of `shared` to
/// [`LANES_AHEAD`] (0-RTT lanes: `sharing` docs): free slots of our arena,
/// their rings' records reset, with the answer an open ahead with this
/// `hello` gets (`reply`, our ring's parameters, and `hello` itself, for
/// the client to check its own against). Full arenas or limits grant
/// fewer; nothing here fails a lane.
fn grant_ahead(
    shared: &Arc<rrpc_core::conn::SharedConnection>,
    ring: &RingConfig,
    hello: &[u8],
    reply: &[u8],
) {
    // Not for a ring whose tail comes with immediate data (see `dial_lane`).
    if ring.tail_with_imm() {
        return;
    }
    let want = LANES_AHEAD.saturating_sub(shared.lane_credited());
    if want == 0 {
        return;
    }
    let (rx_len, tx_len) = rrpc_poller::rings::LocalRing::region_lens(ring);
    let mut slices = Vec::with_capacity(want);
    let mut params = None;
    for i in 0..want {
        let Some(slots) = shared.lane_slots(rx_len, tx_len) else {
            break;
        };
        let reset = rrpc_poller::rings::LocalRing::reset_records(&slots.rx);
        if params.is_none() {
            params = rrpc_poller::rings::LocalRing::in_regions(
                rrpc_core::ProviderKind::Shm,
                ring,
                slots.rx.clone(),
                slots.tx.clone(),
                None,
            )
            .ok()
            .map(|l| l.params().encode());
        }
        if reset.is_err() {
            shared.lane_untake(slots.slice);
            break;
        }
        slices.push((i as u16, slots.slice));
    }
    let Some(params) = params.filter(|_| !slices.is_empty()) else {
        for (_, sl) in slices {
            shared.lane_untake(sl);
        }
        return;
    };
    let parts = rrpc_core::conn::mux::Parts {
        sections: vec![
            (HANDSHAKE_SECTION, reply.to_vec()),
            (rrpc_ringbuf::ROLE_RING, params),
            (sharing::AHEAD_HELLO, hello.to_vec()),
        ],
        slices,
    };
    // On an error the slots are given back, or the shared connection failed.
    if let Err(e) = shared.lane_credit(parts) {
        tracing::debug!(error = %e, "rrpc: no lane slots granted ahead");
    }
}

/// Waits until the client's whole hello has arrived ([`tls_hello_arrived`] with TLS,
/// [`hello_arrived`] without), at most `timeout`.
async fn whole_hello_within(pending: &mut Pending, timeout: Duration) -> Result<(), Error> {
    let arrived = async {
        if pending.uses_tls() {
            tls_hello_arrived(pending).await
        } else {
            hello_arrived(pending).await
        }
    };
    match tokio::time::timeout(timeout, arrived).await {
        Ok(r) => r,
        Err(_) => Err(Error::Handshake(format!(
            "client sent no complete hello within {timeout:?}"
        ))),
    }
}

/// With TLS on the side channel: drives the TLS handshake without blocking
/// ([`Pending::poll_hello`]) on the socket's readiness until the client's
/// hello is whole in plaintext. A client that stalls anywhere in TLS holds
/// only this task, never a thread.
async fn tls_hello_arrived(pending: &mut Pending) -> Result<(), Error> {
    use rrpc_core::conn::Want;
    let afd = WatchedFd::new(
        pending.as_fd(),
        tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
    )?;
    loop {
        match pending.poll_hello()? {
            Want::Ready => return Ok(()),
            Want::Read => afd.readable().await?.clear_ready(),
            Want::Write => afd.writable().await?.clear_ready(),
        }
    }
}

/// Waits until the client's first handshake message is in the socket's
/// receive queue (header and whole body), peeking without consuming. A
/// header that does not decode ends the wait at once: the handshake then
/// refuses it. A client that trickles its hello byte by byte holds only
/// this task, never a thread.
async fn hello_arrived(pending: &Pending) -> Result<(), Error> {
    use nix::sys::socket::{MsgFlags, recv};
    use rrpc_core::handshake::{HEADER_LEN, Header, MAX_BODY};
    let raw = pending.as_fd().as_raw_fd();
    let mut buf = vec![0u8; HEADER_LEN + MAX_BODY];
    // Usually the whole hello is there already (sent with the connect):
    // then no registration with the reactor (a dup and two epoll_ctl).
    if let Ok(n) = recv(raw, &mut buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT)
        && n >= HEADER_LEN
        && let Ok(h) = Header::decode(buf[..HEADER_LEN].try_into().expect("12 bytes"))
        && n >= HEADER_LEN + h.body_len
    {
        return Ok(());
    }
    let afd = WatchedFd::new(pending.as_fd(), tokio::io::Interest::READABLE)?;
    loop {
        let mut guard = afd.readable().await?;
        let n = match recv(raw, &mut buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => {
                guard.clear_ready();
                continue;
            }
            Err(e) => return Err(Error::Io(std::io::Error::from(e))),
        };
        if n == 0 {
            return Err(Error::Handshake("client closed before its hello".into()));
        }
        if n >= HEADER_LEN {
            let head: &[u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("12 bytes");
            match Header::decode(head) {
                Ok(h) if n < HEADER_LEN + h.body_len => {}
                // Complete, or malformed (the handshake refuses it).
                _ => return Ok(()),
            }
        }
        // Part of a hello. If the client has shut its side (exited, killed)
        // the rest will never come: the handshake reads what there is, fails
        // (`MalformedHandshake`, "peer closed after n of m bytes") and closes
        // the socket and every descriptor that came with it. This must end
        // the loop: "read closed" is a readiness tokio never clears, so
        // waiting again returns at once, and the task would spin on a core,
        // starving the runtime's timers (the handshake timeout included).
        if guard.is_read_closed() {
            return Ok(());
        }
        guard.clear_ready();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rrpc_poller::{Mode, PollerConfig};
    use tokio_util::sync::CancellationToken;
    use tonic::body::Body;

    use crate::RrpcConfig;
    use crate::fast::client::FastChannel;
    use crate::transport::{RrpcListener, Target, dial};

    /// A fast-path call over real shm rings in Event mode with a receive
    /// spin: the ring geometry gets `tail_with_imm` on both ends (else the
    /// handshake or `AsyncConn::new` refuses), replies arrive, no polling
    /// thread runs, and the server ends cleanly when the client leaves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn event_mode_with_receive_spin_serves_calls() {
        let path = std::env::temp_dir().join(format!("rrpc-tonic-ev-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let cfg = RrpcConfig::builder()
            .poller(PollerConfig::builder().mode(Mode::Event).build().unwrap())
            .receive_spin(Duration::from_micros(20))
            .build()
            .unwrap();
        let target = Target::Shm(path.clone());
        let ctx = crate::RrpcContext::new(&cfg);
        let mut listener = RrpcListener::bind(&target, &cfg, &ctx).expect("bind");
        let scfg = cfg.clone();
        let server = tokio::spawn(async move {
            let crate::conn::negotiate::Established::Pipe(pipe, negotiated) = listener
                .accept()
                .await
                .expect("accept")
                .establish(&scfg)
                .await
                .expect("establish")
            else {
                panic!("a connection, not a shared one");
            };
            let crate::conn::negotiate::Negotiated::Fast { peer_window } = negotiated else {
                panic!("fast path expected");
            };
            let svc = tower::service_fn(|_r: http::Request<Body>| async {
                let mut res = http::Response::new(Body::empty());
                res.headers_mut()
                    .insert("grpc-status", "0".parse().expect("value"));
                Ok::<_, std::convert::Infallible>(res)
            });
            crate::fast::server::serve_conn(
                pipe,
                svc,
                scfg,
                CancellationToken::new(),
                peer_window,
                Default::default(),
            )
            .await
        });
        let (pipe, negotiated) = dial(&target, &cfg, &ctx).await.expect("dial");
        let crate::conn::negotiate::Negotiated::Fast { peer_window } = negotiated else {
            panic!("fast path expected");
        };
        let mut ch = FastChannel::start(pipe, &cfg, peer_window, Default::default());
        for _ in 0..20 {
            let req = http::Request::builder()
                .uri("/x.Y/Z")
                .body(Body::empty())
                .expect("request");
            let res = tower::Service::call(&mut ch, req).await.expect("call");
            assert_eq!(res.headers()["grpc-status"], "0");
        }
        // Event mode ran: no polling thread ever checked a connection.
        let st = ctx.poller_handle().expect("poller").stats();
        assert_eq!((st.polling_threads, st.polls), (0, 0), "{st:?}");
        drop(ch);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server's connection ends once the client is gone")
            .expect("server task")
            .expect("a client that left is a clean end");
        let _ = std::fs::remove_file(&path);
    }

    /// A shm server for [`a_port_whose_server_restarted_gets_one_new_shared_connection`]:
    /// its own context, serving every connection until the task is aborted,
    /// and the count of side channels it accepted.
    fn shared_server(
        path: &std::path::Path,
        cfg: &RrpcConfig,
    ) -> (
        crate::RrpcContext,
        tokio::task::JoinHandle<()>,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        let _ = std::fs::remove_file(path);
        let ctx = crate::RrpcContext::new(cfg);
        let mut l = RrpcListener::bind(&Target::Shm(path.into()), cfg, &ctx).expect("bind");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (cfg, counted) = (cfg.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            let mut pipes = Vec::new();
            while let Some(a) = l.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Ok(crate::conn::negotiate::Established::Pipe(p, _)) = a.establish(&cfg).await
                {
                    pipes.push(p);
                }
            }
        });
        (ctx, task, accepted)
    }

    /// Behind an `rrpc://` port a restarted server's side listener is at
    /// another endpoint (the verbs side channel's port is the OS's pick).
    /// The client's shared connections are cached by the port, so the new
    /// server's replaces the old server's, which a hung process still
    /// holds open (so it looks alive), instead of being kept beside it;
    /// and at once: the old one is not tried on the new server first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_port_whose_server_restarted_gets_one_new_shared_connection() {
        use rrpc_core::FabricAddr;
        let cfg = RrpcConfig::builder()
            .shared_queue_pairs(true)
            .build()
            .unwrap();
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let (a, b) = (
            dir.join(format!("rrpc-tonic-moved-a-{pid}.sock")),
            dir.join(format!("rrpc-tonic-moved-b-{pid}.sock")),
        );
        let port = Some("127.0.0.1:50999");
        let client = crate::RrpcContext::new(&cfg);
        let opened = |ctx: &crate::RrpcContext| {
            ctx.shared_connections()
                .into_iter()
                .filter(|s| s.opened_here)
                .collect::<Vec<_>>()
        };
        let (first, first_task, _) = shared_server(&a, &cfg);
        let one = crate::conn::rings::dial(FabricAddr::Shm(a.clone()), port, &cfg, &client)
            .await
            .expect("dial the first server");
        assert_eq!(opened(&client).len(), 1);
        // The first server hangs: its context still holds its end.
        first_task.abort();
        let (second, second_task, side_channels) = shared_server(&b, &cfg);
        let two = crate::conn::rings::dial(FabricAddr::Shm(b.clone()), port, &cfg, &client)
            .await
            .expect("dial the restarted server");
        let o = opened(&client);
        assert_eq!(o.len(), 1, "the stale one was replaced: {o:?}");
        assert_eq!(o[0].logical_connections, 1, "{o:?}");
        assert!(o[0].alive, "{o:?}");
        let held = second.shared_connections();
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].logical_connections, 1, "{held:?}");
        // The opening and the logical connection; no logical hello naming
        // the old server's shared connection, refused first.
        assert_eq!(side_channels.load(std::sync::atomic::Ordering::Relaxed), 2);
        drop((one, two));
        second_task.abort();
        drop((first, second));
        let _ = std::fs::remove_file(&a);
        let _ = std::fs::remove_file(&b);
    }
}
