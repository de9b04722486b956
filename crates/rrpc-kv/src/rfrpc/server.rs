//! The RF-RPC server driver over rrpc-core: [`RfServer`].

use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Completion, Fabric, FabricAddr, Local, QpConfig, Region, RemoteRegion, Status};

use crate::error::{Error, Result};
use crate::op::{Execute, Op, OpResult};
use crate::rfrpc::admit::{ConnSlot, Handshakes, Limits, Refusal};
use crate::rfrpc::batch;
use crate::rfrpc::mode::{Mode, ModePolicy};
use crate::rfrpc::wire::{
    self, FLAG_TOO_LARGE, REPLY_ROLE, RequestHeader, ResponseHeader, SERVER_ROLE, ServerInfo,
};

/// Default request buffer per connection: 64 KiB.
pub const DEFAULT_REQUEST_BUFFER: usize = 64 << 10;
/// Default response buffer per connection: 64 KiB.
pub const DEFAULT_RESPONSE_BUFFER: usize = 64 << 10;
/// Default bound of handshakes in progress (each on a thread of its own,
/// until the client's hello or the handshake timeout).
pub const DEFAULT_MAX_PENDING_HANDSHAKES: usize = 64;
/// Default bound of the connections a server holds: 1024, 128 MiB of
/// request and response buffers at their defaults.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default bound of the connections one peer holds: a quarter of
/// [`DEFAULT_MAX_CONNECTIONS`], so that no one peer can take them all
/// (as rrpc-core's per-peer grant budget is a quarter of its total).
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;

/// The `metrics` counter of connections the server refused, labelled
/// `reason`: `max_pending_handshakes` (closed at once, before any
/// handshake), `max_connections` or `max_connections_per_peer` (rejected
/// after the hello, with the limit named in the client's
/// [`rrpc_core::Error::Rejected`]).
pub const REFUSED_METRIC: &str = "rrpc_kv_rfrpc_refused_total";

/// Most entries a request batch may carry (the 16-bit count of the
/// batch's auxiliary field).
const MAX_BATCH_ENTRIES: usize = u16::MAX as usize;

/// A request handler: request bytes in, result bytes out. Runs on a server
/// thread; it may block (the client then switches to server-reply).
pub type Handler = Arc<dyn Fn(&[u8]) -> Vec<u8> + Send + Sync>;

/// Builder of an [`RfServer`]: paper-shaped defaults, infallible setters
/// named after the setting (docs/architecture.md, "Configuration
/// convention"); [`serve`](Self::serve) validates them before it binds or
/// starts anything.
#[derive(Debug, Clone)]
pub struct RfServerBuilder {
    threads: usize,
    request_buffer: usize,
    response_buffer: usize,
    policy: ModePolicy,
    handshake: HandshakeConfig,
    max_pending_handshakes: usize,
    max_connections: usize,
    max_connections_per_peer: usize,
}

impl Default for RfServerBuilder {
    fn default() -> Self {
        RfServerBuilder {
            threads: 1,
            request_buffer: DEFAULT_REQUEST_BUFFER,
            response_buffer: DEFAULT_RESPONSE_BUFFER,
            policy: ModePolicy::Hybrid,
            handshake: HandshakeConfig::default(),
            max_pending_handshakes: DEFAULT_MAX_PENDING_HANDSHAKES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
        }
    }
}

impl RfServerBuilder {
    /// Server threads (default 1). Connections are assigned round robin;
    /// each thread polls its connections' request buffers in turn (§5.5:
    /// one thread per core, several queue pairs per thread).
    ///
    /// `1..=1024`.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }

    /// Bytes of each connection's request buffer (default 64 KiB; rounded up
    /// to a multiple of 8), at least 64 bytes, at most 512 MiB.
    pub fn request_buffer(mut self, n: usize) -> Self {
        self.request_buffer = n;
        self
    }

    /// Bytes of each connection's response buffer (default 64 KiB; rounded
    /// up to a multiple of 8). A larger result is answered with a
    /// "too large" response. At least 64 bytes, at most 512 MiB.
    pub fn response_buffer(mut self, n: usize) -> Self {
        self.response_buffer = n;
        self
    }

    /// The mode policy offered to clients (default hybrid); a client may
    /// override it. The server itself never changes a mode: it answers each
    /// request in the mode its status word names (§3.2).
    pub fn mode(mut self, policy: ModePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The side-channel handshake settings.
    pub fn handshake(mut self, h: HandshakeConfig) -> Self {
        self.handshake = h;
        self
    }

    /// Handshakes in progress at most (default
    /// [`DEFAULT_MAX_PENDING_HANDSHAKES`]), each on a thread of its own, so
    /// that a client slow to send its hello holds up no other. A client
    /// accepted past the bound is closed at once, logged and counted
    /// ([`REFUSED_METRIC`], reason `max_pending_handshakes`). At least 1.
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.max_pending_handshakes = n;
        self
    }

    /// Connections the server holds at most, handshakes in progress
    /// included (default [`DEFAULT_MAX_CONNECTIONS`]). One more is rejected
    /// after its hello with a reason naming the limit, logged and counted
    /// ([`REFUSED_METRIC`], reason `max_connections`). At least 1.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Connections one peer holds at most, handshakes in progress included
    /// (default [`DEFAULT_MAX_CONNECTIONS_PER_PEER`]). A peer is a process
    /// on `shm://` (its Unix socket's `SO_PEERCRED` pid and uid) and a host
    /// on `rdma://` (the side channel's source address):
    /// [`rrpc_core::conn::PeerKey`]. Past it the peer is rejected as for
    /// [`Self::max_connections`] (reason `max_connections_per_peer`). At
    /// least 1.
    pub fn max_connections_per_peer(mut self, n: usize) -> Self {
        self.max_connections_per_peer = n;
        self
    }

    /// Checks every setting (what [`serve`](Self::serve) does first) and
    /// rounds the buffers up to a multiple of 8.
    fn validate(mut self) -> Result<Self> {
        if !(1..=1024).contains(&self.threads) {
            return Err(Error::InvalidConfig(format!(
                "threads {} must be in 1..=1024",
                self.threads
            )));
        }
        for (name, n) in [
            ("request_buffer", self.request_buffer),
            ("response_buffer", self.response_buffer),
        ] {
            if !(64..=1 << 29).contains(&n) {
                return Err(Error::InvalidConfig(format!(
                    "{name} {n} must be in 64..={}",
                    1usize << 29
                )));
            }
        }
        for (name, n) in [
            ("max_pending_handshakes", self.max_pending_handshakes),
            ("max_connections", self.max_connections),
            ("max_connections_per_peer", self.max_connections_per_peer),
        ] {
            if n == 0 {
                return Err(Error::InvalidConfig(format!("{name} 0 must be at least 1")));
            }
        }
        self.request_buffer = wire::pad8(self.request_buffer);
        self.response_buffer = wire::pad8(self.response_buffer);
        Ok(self)
    }

    /// Validates the settings, binds `endpoint` and serves `handler` on the
    /// builder's threads.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range, before
    /// anything is bound: `threads` outside `1..=1024`, a buffer below 64
    /// bytes or over 512 MiB, a zero `max_pending_handshakes`,
    /// `max_connections` or `max_connections_per_peer`;
    /// [`Error::Fabric`] if the listener cannot bind; [`Error::Io`] if a
    /// thread cannot be spawned.
    pub fn serve(
        self,
        endpoint: &FabricAddr,
        fabric: &Fabric,
        handler: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Result<RfServer> {
        RfServer::start(self.validate()?, endpoint, fabric, Arc::new(handler))
    }

    /// Serves a key-value [`Execute`]: each request is one encoded [`Op`],
    /// each result one encoded [`OpResult`]; a request that does not decode
    /// is answered with [`OpResult::Failed`].
    ///
    /// # Errors
    /// As [`Self::serve`].
    pub fn serve_execute<E: Execute>(
        self,
        endpoint: &FabricAddr,
        fabric: &Fabric,
        exec: Arc<E>,
    ) -> Result<RfServer> {
        self.serve(endpoint, fabric, move |req: &[u8]| match Op::decode(req) {
            Ok(op) => exec.execute(op).to_bytes(),
            Err(e) => OpResult::Failed(e.to_string()).to_bytes(),
        })
    }
}

/// Counters of a server.
#[derive(Debug, Default)]
struct Counters {
    served: AtomicU64,
    server_reply: AtomicU64,
    dropped: AtomicU64,
    refused: AtomicU64,
}

impl Counters {
    /// Counts a refused connection, here and in [`REFUSED_METRIC`].
    fn refuse(&self, reason: &'static str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(REFUSED_METRIC, "reason" => reason).increment(1);
    }
}

/// A running RF-RPC server: an accept thread, a thread per handshake in
/// progress (at most `max_pending_handshakes`), and `threads` server
/// threads.
/// Dropping it (or [`RfServer::shutdown`]) stops the threads and closes
/// every connection; clients then see an error for which [`Error::is_peer_gone`] holds.
#[derive(Debug)]
pub struct RfServer {
    endpoint: FabricAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl RfServer {
    /// A builder with the defaults.
    pub fn builder() -> RfServerBuilder {
        RfServerBuilder::default()
    }

    fn start(
        b: RfServerBuilder,
        endpoint: &FabricAddr,
        fabric: &Fabric,
        handler: Handler,
    ) -> Result<RfServer> {
        let listener =
            conn::Listener::bind(endpoint, b.handshake.clone()).map_err(Error::Fabric)?;
        listener.set_nonblocking(true).map_err(Error::Fabric)?;
        let endpoint = match (endpoint, listener.local_addr()) {
            (FabricAddr::Rdma(_), Some(a)) => FabricAddr::Rdma(a),
            _ => endpoint.clone(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let info = ServerInfo {
            request_cap: b.request_buffer,
            response_cap: b.response_buffer,
            policy: b.policy,
        };
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|source| Error::Io {
                    op: "spawn server thread",
                    source,
                })
        };
        let mut threads = Vec::new();
        let mut senders = Vec::new();
        for i in 0..b.threads {
            let (tx, rx) = mpsc::channel::<ServerConn>();
            senders.push(tx);
            let (stop, handler, counters) = (stop.clone(), handler.clone(), counters.clone());
            threads.push(spawn(
                format!("rfrpc-server-{i}"),
                Box::new(move || worker(rx, &stop, &*handler, &counters)),
            )?);
        }
        let accept = Arc::new(Accept {
            fabric: fabric.clone(),
            info,
            workers: senders,
            next: AtomicUsize::new(0),
            stop: stop.clone(),
            counters: counters.clone(),
        });
        let limits = Limits::new(b.max_connections, b.max_connections_per_peer);
        let handshakes = Handshakes::new(b.max_pending_handshakes);
        threads.push(spawn(
            "rfrpc-accept".into(),
            Box::new(move || acceptor(&listener, &accept, &limits, &handshakes)),
        )?);
        tracing::info!(%endpoint, threads = b.threads, "rf-rpc server started");
        Ok(RfServer {
            endpoint,
            stop,
            threads,
            counters,
        })
    }

    /// The endpoint clients connect to (with the kernel-chosen port for
    /// `rdma://host:0`).
    pub fn endpoint(&self) -> &FabricAddr {
        &self.endpoint
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.counters.served.load(Ordering::Acquire)
    }

    /// Requests answered in server-reply mode so far.
    pub fn served_server_reply(&self) -> u64 {
        self.counters.server_reply.load(Ordering::Acquire)
    }

    /// Connections closed because the client broke the protocol or left.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Connections refused: past `max_pending_handshakes`,
    /// `max_connections` or `max_connections_per_peer` (also counted in
    /// [`REFUSED_METRIC`], by reason).
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::Relaxed)
    }

    /// Stops the threads and closes every connection.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        tracing::info!(endpoint = %self.endpoint, "rf-rpc server stopped");
    }
}

impl Drop for RfServer {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// What the accept thread shares with its handshake threads.
#[derive(Debug)]
struct Accept {
    fabric: Fabric,
    info: ServerInfo,
    /// One per server thread; connections are handed out round robin.
    workers: Vec<mpsc::Sender<ServerConn>>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

/// A handshake thread, and a second handle on its client's socket to cut
/// the handshake short at shutdown.
#[derive(Debug)]
struct Running {
    thread: JoinHandle<()>,
    socket: Option<UnixStream>,
}

/// Takes clients off the listening socket (never waiting for one) and runs
/// each handshake on a thread of its own, at most `max_pending_handshakes`
/// at a time; a connection slot is reserved for the client before its
/// handshake starts.
fn acceptor(
    listener: &conn::Listener,
    accept: &Arc<Accept>,
    limits: &Arc<Limits>,
    handshakes: &Arc<Handshakes>,
) {
    let mut running: Vec<Running> = Vec::new();
    while !accept.stop.load(Ordering::Acquire) {
        let mut i = 0;
        while i < running.len() {
            if running[i].thread.is_finished() {
                let _ = running.swap_remove(i).thread.join();
            } else {
                i += 1;
            }
        }
        let pending = match listener.accept_pending() {
            Ok(p) => p,
            Err(rrpc_core::Error::WouldBlock) => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "rf-rpc accept failed");
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        let peer = pending.peer_addr();
        let Some(place) = handshakes.start() else {
            accept.counters.refuse("max_pending_handshakes");
            tracing::warn!(
                %peer,
                limit = handshakes.limit(),
                "rf-rpc: too many handshakes in progress (max_pending_handshakes); closing the new connection"
            );
            continue;
        };
        let slot = limits.admit(pending.peer_key());
        // A duplicate of the client's socket: shutting it down at stop ends
        // a handshake that waits for a silent client at once. (Any socket:
        // `shutdown(2)` is the same call for a Unix and a TCP socket.)
        let socket = pending
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(UnixStream::from);
        let a = accept.clone();
        let spawned = std::thread::Builder::new()
            .name("rfrpc-handshake".into())
            .spawn(move || {
                let _place = place;
                handshake(pending, slot, &a);
            });
        match spawned {
            Ok(thread) => running.push(Running { thread, socket }),
            // The closure is dropped: the client is closed, its places given back.
            Err(e) => {
                tracing::warn!(%peer, error = %e, "rf-rpc: cannot spawn a handshake thread; closing the connection")
            }
        }
    }
    tracing::debug!(in_progress = running.len(), "rf-rpc accept thread stopping");
    for r in &running {
        if let Some(s) = &r.socket {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
    for r in running {
        let _ = r.thread.join();
    }
}

/// One client's handshake, on its own thread: reads the hello (bounded by
/// the handshake timeout), refuses a client over a connection limit with
/// the limit named, or sets the connection up and hands it to a server
/// thread.
fn handshake(pending: conn::Pending, slot: std::result::Result<ConnSlot, Refusal>, a: &Accept) {
    let peer = pending.peer_addr();
    let incoming = match pending.handshake() {
        Ok(i) => i,
        // Cut short by the server's shutdown (its socket shut down).
        Err(e) if a.stop.load(Ordering::Acquire) => {
            tracing::debug!(%peer, error = %e, "rf-rpc handshake ended by shutdown");
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "rf-rpc handshake failed");
            return;
        }
    };
    let slot = match slot {
        Ok(s) => s,
        Err(refusal) => {
            a.counters.refuse(refusal.reason());
            tracing::warn!(%peer, reason = refusal.reason(), "rf-rpc connection refused: {refusal}");
            let _ = incoming.reject(&refusal.to_string());
            return;
        }
    };
    let c = match accept_one(incoming, &a.fabric, a.info, slot) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "rf-rpc handshake failed");
            return;
        }
    };
    if a.stop.load(Ordering::Acquire) {
        c.conn.close();
        return;
    }
    let i = a.next.fetch_add(1, Ordering::Relaxed) % a.workers.len();
    match a.workers[i].send(c) {
        Ok(()) => tracing::debug!(%peer, thread = i, "rf-rpc connection accepted"),
        // The server thread has stopped (shutdown): close.
        Err(mpsc::SendError(c)) => c.conn.close(),
    }
}

fn accept_one(
    incoming: conn::Incoming,
    fabric: &Fabric,
    info: ServerInfo,
    slot: ConnSlot,
) -> Result<ServerConn> {
    let Some(reply) = incoming.peer().region(REPLY_ROLE) else {
        let _ = incoming.reject("rf-rpc: no reply buffer granted");
        return Err(Error::Malformed {
            what: "client offer",
            detail: "no reply buffer".into(),
        });
    };
    // A protection domain per connection: another client that learned or
    // guessed this region's key is refused by the NIC.
    let fabric = &fabric.isolated().map_err(Error::Fabric)?;
    let region = fabric
        // The client WRITEs requests and READs responses (remote fetching).
        .alloc_region_with(info.request_cap + info.response_cap, rrpc_core::Access::ALL)
        .map_err(Error::Fabric)?;
    let qp = fabric
        .create_qp(&QpConfig::default())
        .map_err(Error::Fabric)?;
    let conn = incoming
        .accept(
            qp,
            Offer::new()
                .grant(SERVER_ROLE, region.clone())
                .section(SERVER_ROLE, info.encode()),
        )
        .map_err(Error::Fabric)?;
    Ok(ServerConn {
        conn,
        region,
        info,
        reply,
        last_seq: 0,
        req: Vec::new(),
        frame: Vec::new(),
        wr: 0,
        _slot: slot,
    })
}

/// One client's connection on a server thread.
#[derive(Debug)]
struct ServerConn {
    conn: Connection,
    /// `[request buffer | response buffer]`, granted to the client.
    region: Arc<Region>,
    info: ServerInfo,
    /// The client's reply buffer (server-reply mode).
    reply: RemoteRegion,
    last_seq: u32,
    req: Vec<u8>,
    frame: Vec<u8>,
    wr: u64,
    /// This connection's place under the connection limits.
    _slot: ConnSlot,
}

fn worker(
    rx: mpsc::Receiver<ServerConn>,
    stop: &AtomicBool,
    handler: &(dyn Fn(&[u8]) -> Vec<u8> + Send + Sync),
    counters: &Counters,
) {
    let mut conns: Vec<ServerConn> = Vec::new();
    let mut idle = 0u32;
    let mut last_check = Instant::now();
    while !stop.load(Ordering::Acquire) {
        while let Ok(c) = rx.try_recv() {
            conns.push(c);
        }
        let mut busy = false;
        let mut i = 0;
        while i < conns.len() {
            match conns[i].poll(handler, counters) {
                Ok(served) => {
                    busy |= served;
                    i += 1;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "rf-rpc connection closed");
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                    conns.swap_remove(i).conn.close();
                }
            }
        }
        let now = Instant::now();
        if now.duration_since(last_check) > Duration::from_millis(5) {
            last_check = now;
            conns.retain(|c| {
                let alive = c.conn.check_alive().is_ok();
                if !alive {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                alive
            });
        }
        if busy {
            idle = 0;
        } else {
            // Busy-poll (§3.2: "the server will repeatedly check its request
            // buffer"), yielding the core; after a while idle, nap briefly so
            // an idle server does not burn a shared machine.
            idle = idle.saturating_add(1);
            if idle > 20_000 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        }
    }
    for c in conns {
        c.conn.close();
    }
}

impl ServerConn {
    /// Serves the request in the request buffer, if a new complete one is
    /// there. `Ok(true)` when one was served; an error closes the connection.
    fn poll(
        &mut self,
        handler: &(dyn Fn(&[u8]) -> Vec<u8> + Send + Sync),
        counters: &Counters,
    ) -> Result<bool> {
        let w = self
            .region
            .atomic_u64(0)
            .map_err(Error::Fabric)?
            .load(Ordering::Acquire);
        let Some(h) = RequestHeader::from_word(w) else {
            return Ok(false);
        };
        if h.seq == self.last_seq {
            return Ok(false);
        }
        let frame = wire::request_frame_len(h.len as usize);
        if frame > self.info.request_cap {
            return Err(Error::Malformed {
                what: "request",
                detail: format!(
                    "{} payload bytes in a {}-byte request buffer",
                    h.len, self.info.request_cap
                ),
            });
        }
        let tail = self
            .region
            .atomic_u64(frame - wire::TAIL)
            .map_err(Error::Fabric)?
            .load(Ordering::Acquire);
        if tail != w {
            // The body WRITE has not landed (or the peer wrote garbage):
            // not a request yet.
            return Ok(false);
        }
        self.req.resize(h.len as usize, 0);
        self.region
            .read_at(wire::REQUEST_HEADER, &mut self.req)
            .map_err(Error::Fabric)?;
        // The seqlock's read side: a client that timed out may be
        // overwriting the buffer with its next request. It zeroes the status
        // word in a WRITE before it touches the body (`RfClient::submit_as`),
        // so a copy that saw any new byte sees the status word changed here
        // and is discarded (the new request is served on a later poll).
        std::sync::atomic::fence(Ordering::Acquire);
        let again = self
            .region
            .atomic_u64(0)
            .map_err(Error::Fabric)?
            .load(Ordering::Acquire);
        let tail_again = self
            .region
            .atomic_u64(frame - wire::TAIL)
            .map_err(Error::Fabric)?
            .load(Ordering::Acquire);
        if again != w || tail_again != w {
            return Ok(false);
        }
        self.last_seq = h.seq;
        let t0 = Instant::now();
        let out = if h.batch {
            // A request batch: each entry through the handler, in order; the
            // results as one batch (aux: the number of results). A batch
            // that does not parse breaks the protocol: close.
            let b = match batch::parse(&self.req, MAX_BATCH_ENTRIES)? {
                batch::BatchState::Complete(b) => b,
                st => {
                    return Err(Error::Malformed {
                        what: "request batch",
                        detail: format!("{st:?}"),
                    });
                }
            };
            let results: Vec<Vec<u8>> = b
                .entries
                .iter()
                .map(|r| handler(&self.req[r.clone()]))
                .collect();
            batch::encode(b.seq, results.len() as u16, results.iter().map(|v| &v[..]))?
        } else {
            handler(&self.req)
        };
        let proc_ns = t0.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        // Counted before the response is visible: a client that has its
        // result then always finds its call counted (the counters are what
        // tests and operators read to tell the modes apart).
        counters.served.fetch_add(1, Ordering::Release);
        if h.mode == Mode::ServerReply {
            counters.server_reply.fetch_add(1, Ordering::Release);
        }
        self.respond(h, &out, proc_ns)?;
        Ok(true)
    }

    fn respond(&mut self, h: RequestHeader, out: &[u8], proc_ns: u32) -> Result<()> {
        let cap = match h.mode {
            Mode::RemoteFetch => self.info.response_cap,
            Mode::ServerReply => (self.reply.len as usize).min(self.info.response_cap),
        };
        let too_large = (out.len() as u64).to_le_bytes();
        let (payload, flags) = if out.len() > wire::max_response_payload(cap) {
            (&too_large[..], FLAG_TOO_LARGE)
        } else {
            (out, 0)
        };
        let rh = ResponseHeader {
            seq: h.seq,
            len: payload.len() as u32,
            proc_ns,
            flags,
        };
        wire::encode_response(&rh, payload, &mut self.frame)?;
        let at = self.info.request_cap;
        let n = self.frame.len();
        let status = rh.to_word();
        // Info word and payload, then the status word, then the tail (each
        // an ordered store): a client READ that sees the tail of this
        // response also sees the rest (paper §4.1: status last).
        self.region
            .write_at(at + 8, &self.frame[8..n - wire::TAIL])
            .map_err(Error::Fabric)?;
        self.region
            .atomic_u64(at)
            .map_err(Error::Fabric)?
            .store(status, Ordering::Release);
        self.region
            .atomic_u64(at + n - wire::TAIL)
            .map_err(Error::Fabric)?
            .store(status, Ordering::Release);
        if h.mode == Mode::ServerReply {
            // WRITE body and tail, then the status word the client polls.
            let qp = self.conn.qp().clone();
            self.wr += 1;
            qp.post_write(
                self.wr,
                Local::new(&self.region, at + 8, n - 8),
                self.reply.at(8),
                false,
            )
            .map_err(Error::Fabric)?;
            self.wr += 1;
            qp.post_write(
                self.wr,
                Local::new(&self.region, at, 8),
                self.reply.at(0),
                true,
            )
            .map_err(Error::Fabric)?;
            self.wait_send()?;
        }
        Ok(())
    }

    fn wait_send(&self) -> Result<()> {
        let mut wc = [Completion::EMPTY; 1];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self
                .conn
                .qp()
                .send_cq()
                .poll(&mut wc)
                .map_err(Error::Fabric)?
                == 1
            {
                if wc[0].status != Status::Success {
                    return Err(Error::Fabric(rrpc_core::Error::CompletionError {
                        wr_id: wc[0].wr_id,
                        status: wc[0].status,
                    }));
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(Duration::from_secs(30)));
            }
            self.conn.check_alive()?;
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_validates_the_settings_first() {
        let b = RfServer::builder;
        let err = |b: RfServerBuilder| b.validate().unwrap_err().to_string();
        assert!(err(b().threads(0)).contains("threads 0 must be in 1..=1024"));
        assert!(err(b().threads(1025)).contains("threads 1025"));
        assert!(err(b().request_buffer(63)).contains("request_buffer 63"));
        assert!(err(b().response_buffer((1 << 29) + 1)).contains("response_buffer"));
        assert!(err(b().max_pending_handshakes(0)).contains("max_pending_handshakes 0"));
        assert!(err(b().max_connections(0)).contains("max_connections 0"));
        assert!(err(b().max_connections_per_peer(0)).contains("max_connections_per_peer 0"));
        let ok = b().threads(1024).request_buffer(65).validate().unwrap();
        assert_eq!(ok.request_buffer, 72, "rounded up to a multiple of 8");
        // serve refuses before binding anything.
        let ep = FabricAddr::Shm("/nonexistent-dir/never-bound.sock".into());
        let r = b()
            .threads(0)
            .serve(&ep, &Fabric::shm(), |r: &[u8]| r.to_vec());
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    }

    /// A refusal is counted in the server's counter and in the `metrics`
    /// facade by reason, on the thread that refused.
    #[test]
    fn refusals_are_counted_by_reason() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let counters = Counters::default();
        metrics::with_local_recorder(&recorder, || {
            counters.refuse("max_connections_per_peer");
            counters.refuse("max_connections_per_peer");
            counters.refuse("max_pending_handshakes");
        });
        assert_eq!(counters.refused.load(Ordering::Relaxed), 3);
        let mut counted: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == REFUSED_METRIC)
            .map(|(k, _, _, v)| {
                let labels: Vec<_> = k
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (labels, v)
            })
            .collect();
        counted.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            counted,
            vec![
                (
                    vec!["reason=max_connections_per_peer".to_string()],
                    DebugValue::Counter(2)
                ),
                (
                    vec!["reason=max_pending_handshakes".to_string()],
                    DebugValue::Counter(1)
                ),
            ]
        );
    }
}
