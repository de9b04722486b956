//! The RF-RPC server driver over rrpc-core: [`RfServer`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Completion, Fabric, FabricAddr, Local, QpConfig, Region, RemoteRegion, Status};

use crate::error::{Error, Result};
use crate::op::{Execute, Op, OpResult};
use crate::rfrpc::batch;
use crate::rfrpc::mode::{Mode, ModePolicy};
use crate::rfrpc::wire::{
    self, FLAG_TOO_LARGE, REPLY_ROLE, RequestHeader, ResponseHeader, SERVER_ROLE, ServerInfo,
};

/// Default request buffer per connection: 64 KiB.
pub const DEFAULT_REQUEST_BUFFER: usize = 64 << 10;
/// Default response buffer per connection: 64 KiB.
pub const DEFAULT_RESPONSE_BUFFER: usize = 64 << 10;

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
}

impl Default for RfServerBuilder {
    fn default() -> Self {
        RfServerBuilder {
            threads: 1,
            request_buffer: DEFAULT_REQUEST_BUFFER,
            response_buffer: DEFAULT_RESPONSE_BUFFER,
            policy: ModePolicy::Hybrid,
            handshake: HandshakeConfig::default(),
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
    /// bytes or over 512 MiB;
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
}

/// A running RF-RPC server: an accept thread and `threads` server threads.
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
        let (stop2, fabric) = (stop.clone(), fabric.clone());
        threads.push(spawn(
            "rfrpc-accept".into(),
            Box::new(move || acceptor(&listener, &fabric, info, senders, &stop2)),
        )?);
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

    /// Stops the threads and closes every connection.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RfServer {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn acceptor(
    listener: &conn::Listener,
    fabric: &Fabric,
    info: ServerInfo,
    senders: Vec<mpsc::Sender<ServerConn>>,
    stop: &AtomicBool,
) {
    let mut next = 0usize;
    while !stop.load(Ordering::Acquire) {
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
        match accept_one(pending, fabric, info) {
            Ok(c) => {
                let _ = senders[next % senders.len()].send(c);
                next += 1;
            }
            Err(e) => tracing::warn!(error = %e, "rf-rpc handshake failed"),
        }
    }
}

fn accept_one(pending: conn::Pending, fabric: &Fabric, info: ServerInfo) -> Result<ServerConn> {
    let incoming = pending.handshake().map_err(Error::Fabric)?;
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
        let ok = b().threads(1024).request_buffer(65).validate().unwrap();
        assert_eq!(ok.request_buffer, 72, "rounded up to a multiple of 8");
        // serve refuses before binding anything.
        let ep = FabricAddr::Shm("/nonexistent-dir/never-bound.sock".into());
        let r = b()
            .threads(0)
            .serve(&ep, &Fabric::shm(), |r: &[u8]| r.to_vec());
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    }
}
