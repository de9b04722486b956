//! The RF-RPC client driver over rrpc-core: [`RfClient`] and [`KvClient`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Completion, Fabric, FabricAddr, Local, QpConfig, Region, RemoteRegion, Status};

use crate::error::{Error, Result};
use crate::op::{Execute, Op, OpResult};
use crate::rfrpc::batch;
use crate::rfrpc::mode::{CallReport, Mode, ModePolicy, ModeSwitch};
use crate::rfrpc::wire::{
    self, FLAG_TOO_LARGE, Fetched, REPLY_ROLE, RESPONSE_HEADER, SERVER_ROLE, ServerInfo, TAIL,
    encode_request_as, next_seq,
};

/// Paper default of F (§5.1: "select ... F (fetching size) as 256 bytes").
pub const DEFAULT_FETCH_SIZE: usize = 256;
/// Paper default of R (§3.2 and §5.1: 5).
pub const DEFAULT_RETRY_LIMIT: u32 = 5;
/// Default bound of one call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Default size of the client's reply buffer (the server WRITEs results
/// there in server-reply mode): 64 KiB.
pub const DEFAULT_REPLY_BUFFER: usize = 64 << 10;

/// Configuration of an [`RfClient`], paper defaults.
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`RfClientConfig::builder`], infallible setters on
/// [`RfClientConfigBuilder`], [`build`](RfClientConfigBuilder::build)
/// validates; getters are named after the setting.
#[derive(Debug, Clone)]
pub struct RfClientConfig {
    fetch_size: usize,
    retry_limit: u32,
    call_timeout: Duration,
    mode: Option<ModePolicy>,
    measured_switch: bool,
    reply_buffer: usize,
    handshake: HandshakeConfig,
    qp: QpConfig,
}

impl Default for RfClientConfig {
    fn default() -> Self {
        RfClientConfig {
            fetch_size: DEFAULT_FETCH_SIZE,
            retry_limit: DEFAULT_RETRY_LIMIT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            mode: None,
            measured_switch: true,
            reply_buffer: DEFAULT_REPLY_BUFFER,
            handshake: HandshakeConfig::default(),
            qp: QpConfig::default(),
        }
    }
}

impl RfClientConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> RfClientConfigBuilder {
        RfClientConfigBuilder {
            cfg: Self::default(),
        }
    }

    /// A builder starting from this config, to derive a modified one.
    pub fn to_builder(&self) -> RfClientConfigBuilder {
        RfClientConfigBuilder { cfg: self.clone() }
    }

    /// F: bytes of the response buffer the first READ fetches, header
    /// included (default [`DEFAULT_FETCH_SIZE`]); larger results take a
    /// second READ. Clamped to the server's response buffer at connect.
    pub fn fetch_size(&self) -> usize {
        self.fetch_size
    }

    /// R: READ retries per call before the call counts as exhausted for the
    /// hybrid switch (default [`DEFAULT_RETRY_LIMIT`]).
    pub fn retry_limit(&self) -> u32 {
        self.retry_limit
    }

    /// Bound of one call (default 5 s); past it [`RfClient::call`] returns
    /// [`Error::Timeout`].
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The mode policy; `None` (the default) takes the server's.
    pub fn mode(&self) -> Option<ModePolicy> {
        self.mode
    }

    /// Whether the hybrid switch measures both modes (default `true`: the
    /// measured veto and probes of [`ModeSwitch`]); `false` keeps the
    /// paper's two rules alone (§3.2), which decide from READ counts and
    /// processing times only. See [`ModeSwitchBuilder::measured`](crate::rfrpc::ModeSwitchBuilder::measured).
    pub fn measured_switch(&self) -> bool {
        self.measured_switch
    }

    /// Size of the reply buffer granted to the server (default 64 KiB); a
    /// server-reply result larger than it is refused with
    /// [`Error::TooLarge`].
    pub fn reply_buffer(&self) -> usize {
        self.reply_buffer
    }

    /// The side-channel handshake settings (timeout, token).
    pub fn handshake(&self) -> &HandshakeConfig {
        &self.handshake
    }

    /// The settings of the connection's queue pair (default
    /// [`QpConfig::default`]); tests attach rrpc-core's fault injection
    /// here ([`rrpc_core::QpConfigBuilder::fault`]).
    pub fn qp(&self) -> &QpConfig {
        &self.qp
    }
}

/// Builder for [`RfClientConfig`]; [`build`](Self::build) checks the ranges.
#[derive(Debug, Clone)]
pub struct RfClientConfigBuilder {
    cfg: RfClientConfig,
}

impl RfClientConfigBuilder {
    /// [`RfClientConfig::fetch_size`]: at least 24 bytes (an empty
    /// response), at most 512 MiB.
    pub fn fetch_size(mut self, f: usize) -> Self {
        self.cfg.fetch_size = f;
        self
    }

    /// [`RfClientConfig::retry_limit`].
    pub fn retry_limit(mut self, r: u32) -> Self {
        self.cfg.retry_limit = r;
        self
    }

    /// [`RfClientConfig::call_timeout`], above zero.
    pub fn call_timeout(mut self, t: Duration) -> Self {
        self.cfg.call_timeout = t;
        self
    }

    /// [`RfClientConfig::mode`].
    pub fn mode(mut self, policy: Option<ModePolicy>) -> Self {
        self.cfg.mode = policy;
        self
    }

    /// [`RfClientConfig::measured_switch`].
    pub fn measured_switch(mut self, on: bool) -> Self {
        self.cfg.measured_switch = on;
        self
    }

    /// [`RfClientConfig::reply_buffer`]: at least 64 bytes, at most 512 MiB.
    pub fn reply_buffer(mut self, n: usize) -> Self {
        self.cfg.reply_buffer = n;
        self
    }

    /// [`RfClientConfig::handshake`].
    pub fn handshake(mut self, h: HandshakeConfig) -> Self {
        self.cfg.handshake = h;
        self
    }

    /// [`RfClientConfig::qp`].
    pub fn qp(mut self, qp: QpConfig) -> Self {
        self.cfg.qp = qp;
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range:
    /// `fetch_size` below 24 bytes or over 512 MiB, a zero `call_timeout`,
    /// `reply_buffer` below 64 bytes or over 512 MiB.
    pub fn build(self) -> Result<RfClientConfig> {
        let c = self.cfg;
        let min_fetch = wire::response_frame_len(0);
        if !(min_fetch..=1 << 29).contains(&c.fetch_size) {
            return Err(Error::InvalidConfig(format!(
                "fetch_size {} must be in {min_fetch}..={}",
                c.fetch_size,
                1usize << 29
            )));
        }
        if c.call_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "call_timeout 0 must be above zero".into(),
            ));
        }
        if !(64..=1 << 29).contains(&c.reply_buffer) {
            return Err(Error::InvalidConfig(format!(
                "reply_buffer {} must be in 64..={}",
                c.reply_buffer,
                1usize << 29
            )));
        }
        Ok(c)
    }
}

/// Counters of one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Calls completed.
    pub calls: u64,
    /// Calls sent in server-reply mode.
    pub server_reply_calls: u64,
    /// Fetch READs that found no result.
    pub failed_reads: u64,
    /// Second READs (results larger than F).
    pub second_reads: u64,
    /// Mode switches.
    pub switches: u64,
}

/// A client of one RF-RPC server thread (one connection, one call at a
/// time; paper §3.1). `call` blocks the calling thread, busy-polling.
#[derive(Debug)]
pub struct RfClient {
    conn: Connection,
    local: Arc<Region>,
    reply: Arc<Region>,
    remote: RemoteRegion,
    info: ServerInfo,
    fetch_size: usize,
    timeout: Duration,
    switch: ModeSwitch,
    seq: u32,
    wr: u64,
    frame: Vec<u8>,
    window: Vec<u8>,
    stats: ClientStats,
    pending: Option<InFlight>,
    /// The server may not have taken the request we wrote last: its call
    /// timed out or failed before its result came back. The next request
    /// then first invalidates the status word (see [`Self::submit_as`]).
    unsettled: bool,
    fetch_tuner: Option<crate::rfrpc::tune::FetchTuner>,
}

/// The call submitted and not yet completed.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    seq: u32,
    mode: Mode,
    start: Instant,
    deadline: Instant,
    /// Entries of a request batch (`None` for a single call).
    batch: Option<usize>,
    /// Sent in a mode chosen by the caller, not by the switch (not
    /// reported to it).
    forced: bool,
}

impl RfClient {
    /// Connects to the server at `endpoint` over `fabric`.
    ///
    /// # Errors
    /// [`Error::Fabric`] if the connection or a region fails;
    /// [`Error::Malformed`] if the server's offer is not an RF-RPC server's.
    pub fn connect(endpoint: &FabricAddr, fabric: &Fabric, cfg: RfClientConfig) -> Result<Self> {
        // This connection's regions and queue pair in a protection domain
        // of their own (`Fabric::isolated`).
        let fabric = &fabric.isolated().map_err(Error::Fabric)?;
        // Narrowest access: the server only WRITEs into the reply buffer.
        let reply = fabric
            .alloc_region_with(cfg.reply_buffer, rrpc_core::Access::REMOTE_WRITE)
            .map_err(Error::Fabric)?;
        let conn = conn::connect(
            endpoint,
            fabric.create_qp(&cfg.qp).map_err(Error::Fabric)?,
            Offer::new().grant(REPLY_ROLE, reply.clone()),
            &cfg.handshake,
        )
        .map_err(Error::Fabric)?;
        let info = ServerInfo::decode(conn.peer().section(SERVER_ROLE).unwrap_or_default())?;
        let remote = conn
            .peer()
            .region(SERVER_ROLE)
            .ok_or_else(|| Error::Malformed {
                what: "server offer",
                detail: "no request/response region".into(),
            })?;
        if remote.len < (info.request_cap + info.response_cap) as u64 {
            return Err(Error::Malformed {
                what: "server offer",
                detail: format!("region of {} bytes, buffers {info:?}", remote.len),
            });
        }
        let local = fabric
            // Local only: the request's source, the READs' destination, and
            // the zero word that invalidates a status word.
            .alloc_region_with(
                info.request_cap + info.response_cap + 8,
                rrpc_core::Access::LOCAL,
            )
            .map_err(Error::Fabric)?;
        // The zero word after the fetch landing (see `submit_as`).
        local
            .write_at(info.request_cap + info.response_cap, &[0; 8])
            .map_err(Error::Fabric)?;
        let policy = cfg.mode.unwrap_or(info.policy);
        let fetch_size = cfg.fetch_size.min(info.response_cap);
        Ok(RfClient {
            conn,
            local,
            reply,
            remote,
            info,
            fetch_size,
            timeout: cfg.call_timeout,
            switch: ModeSwitch::builder(policy, cfg.retry_limit)
                .measured(cfg.measured_switch)
                .build()?,
            seq: 0,
            wr: 0,
            frame: Vec::new(),
            window: Vec::new(),
            stats: ClientStats::default(),
            pending: None,
            unsettled: false,
            fetch_tuner: None,
        })
    }

    /// The mode the next call is sent in.
    pub fn mode(&self) -> Mode {
        self.switch.mode()
    }

    /// The hybrid switch's state (READ round-trip estimate, R).
    pub fn mode_switch(&self) -> &ModeSwitch {
        &self.switch
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            switches: self.switch.switches(),
            ..self.stats
        }
    }

    /// F, as clamped to the server's response buffer.
    pub fn fetch_size(&self) -> usize {
        self.fetch_size
    }

    /// Applies a tuner's choice ([`crate::rfrpc::tune::choose_fetch_and_retry`])
    /// from the next call on: F (clamped to the server's response buffer)
    /// and R.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an F below an empty response frame.
    pub fn set_fetch_params(&mut self, fetch_size: usize, retry_limit: u32) -> Result<()> {
        if fetch_size < wire::response_frame_len(0) {
            return Err(Error::InvalidConfig(format!("fetch_size {fetch_size}")));
        }
        self.fetch_size = fetch_size.min(self.info.response_cap);
        self.switch.set_retry_limit(retry_limit);
        Ok(())
    }

    /// Re-runs Eq. 2 periodically over this client's own result sizes and
    /// applies each new (F, R) (§3.2); replaces any earlier tuner.
    pub fn auto_fetch(&mut self, tuner: crate::rfrpc::tune::FetchTuner) {
        self.fetch_tuner = Some(tuner);
    }

    /// The periodic Eq. 2 tuner, if [`Self::auto_fetch`] set one.
    pub fn fetch_tuner(&self) -> Option<&crate::rfrpc::tune::FetchTuner> {
        self.fetch_tuner.as_ref()
    }

    /// Measures I_{R,F} (the paper's one-off benchmark, §3.2): for every R
    /// in `retry_limits` and F in `fetch_sizes`, calls `req` in remote-fetch
    /// mode for `per_point` and records calls per second. F and R are
    /// restored afterwards. Blocking: `retry_limits.len() ×
    /// fetch_sizes.len() × per_point`.
    ///
    /// # Errors
    /// A failed call, or an F below an empty response frame.
    pub fn measure_rates(
        &mut self,
        req: &[u8],
        retry_limits: &[u32],
        fetch_sizes: &[usize],
        per_point: Duration,
    ) -> Result<crate::rfrpc::tune::RateTable> {
        let (f0, r0) = (self.fetch_size, self.switch.retry_limit());
        let mut table = crate::rfrpc::tune::RateTable::new();
        let run = (|| {
            for &r in retry_limits {
                for &f in fetch_sizes {
                    self.set_fetch_params(f, r)?;
                    let start = Instant::now();
                    let mut n = 0u64;
                    while start.elapsed() < per_point {
                        self.call(req)?;
                        n += 1;
                    }
                    table.insert(r, f, n as f64 / start.elapsed().as_secs_f64());
                }
            }
            Ok::<_, Error>(())
        })();
        self.fetch_size = f0;
        self.switch.set_retry_limit(r0);
        run.map(|()| table)
    }

    /// The largest request payload the server accepts.
    pub fn max_request(&self) -> usize {
        wire::max_request_payload(self.info.request_cap)
    }

    /// The connection (fabric kind, liveness).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// One call: WRITEs `req` into the server's request buffer, then READs
    /// `fetch_size` bytes of its response buffer until the result is there
    /// (a second READ for a larger result), or, in server-reply mode, waits
    /// for the server's WRITE. Updates the hybrid switch.
    ///
    /// # Errors
    /// [`Error::TooLarge`] for a request over [`Self::max_request`] or a
    /// result over the response buffer; [`Error::Timeout`] past the call
    /// timeout (the connection stays usable: a late result is told apart by
    /// its sequence number, and the next request is never served mixed
    /// with the timed-out one, see [the module docs](crate::rfrpc));
    /// [`Error::Fabric`] when the server left ([`Error::is_peer_gone`]);
    /// [`Error::Malformed`] for a response that cannot be valid;
    /// [`Error::Fabric`] for a failed work request.
    pub fn call(&mut self, req: &[u8]) -> Result<Vec<u8>> {
        self.submit(req)?;
        self.complete()
    }

    /// One call carrying a request batch (§4.1 format): the server runs the
    /// handler on each entry in order and answers with one result batch, in
    /// the same remote-fetch or server-reply mode as a single call. Returns
    /// the results in request order.
    ///
    /// This batches within one call (one WRITE, one or two READs for all
    /// entries); the paper's client-side buffering by size, count and
    /// timeout, and its pipeline, are [`crate::rfrpc::batcher::Batcher`].
    ///
    /// Results are bound by the response buffer, not by any batch size
    /// limit: a result batch over F takes a second READ. A result batch
    /// over the response buffer (or the reply buffer in server-reply mode)
    /// fails as a whole with [`Error::TooLarge`] (`what: "result"`) after
    /// the server ran the handler on every entry; there is no automatic
    /// per-entry server-reply fallback here ([`crate::rfrpc::batcher`]
    /// resends such a batch one entry per call).
    ///
    /// # Errors
    /// As [`Self::call`]; [`Error::TooLarge`] when the batch exceeds the
    /// request buffer or the result batch the response buffer;
    /// [`Error::Malformed`] when the result batch does not parse or holds a
    /// different number of results; [`Error::InvalidConfig`] for more than
    /// 65 535 entries.
    pub fn call_batch(&mut self, reqs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        self.submit_batch(reqs)?;
        self.complete_batch()
    }

    /// The first half of [`Self::call`]: WRITEs `req` into the server's
    /// request buffer and returns without waiting for the result; finish
    /// with [`Self::complete`]. One call may be in flight per client (the
    /// server holds one buffer pair per connection): the paper's pipeline
    /// (§4.1) is several clients, each with a call in flight
    /// ([`crate::rfrpc::batcher::Batcher::with_clients`]).
    ///
    /// # Errors
    /// As [`Self::call`]'s request side; [`Error::InvalidConfig`] when a
    /// call is already in flight.
    pub fn submit(&mut self, req: &[u8]) -> Result<()> {
        self.submit_as(req, None, None)
    }

    /// One call in server-reply mode whatever the hybrid switch says (the
    /// paper's "Large Entry" fallback, §4.1: [`crate::rfrpc::Batcher`] sends
    /// requests over its batch limit this way); not reported to the switch.
    ///
    /// # Errors
    /// As [`Self::call`].
    pub fn call_server_reply(&mut self, req: &[u8]) -> Result<Vec<u8>> {
        self.submit_as(req, None, Some(Mode::ServerReply))?;
        self.complete()
    }

    /// The first half of [`Self::call_batch`]; finish with
    /// [`Self::complete_batch`].
    ///
    /// # Errors
    /// As [`Self::submit`] and [`Self::call_batch`].
    pub fn submit_batch(&mut self, reqs: &[&[u8]]) -> Result<()> {
        let n = u16::try_from(reqs.len())
            .map_err(|_| Error::InvalidConfig(format!("batch of {} entries", reqs.len())))?;
        let payload = batch::encode(next_seq(self.seq) as u16, n, reqs.iter().copied())?;
        self.submit_as(&payload, Some(reqs.len()), None)
    }

    /// Whether a submitted call awaits [`Self::complete`].
    pub fn in_flight(&self) -> bool {
        self.pending.is_some()
    }

    /// Waits for the result of the call [`Self::submit`] sent.
    ///
    /// # Errors
    /// As [`Self::call`]; [`Error::InvalidConfig`] when no single call is
    /// in flight.
    pub fn complete(&mut self) -> Result<Vec<u8>> {
        match self.pending {
            Some(InFlight { batch: None, .. }) => self.finish(),
            _ => Err(Error::InvalidConfig("no single call in flight".into())),
        }
    }

    /// Waits for the result batch of the call [`Self::submit_batch`] sent.
    ///
    /// # Errors
    /// As [`Self::call_batch`]; [`Error::InvalidConfig`] when no batch is
    /// in flight.
    pub fn complete_batch(&mut self) -> Result<Vec<Vec<u8>>> {
        let Some(InFlight { batch: Some(n), .. }) = self.pending else {
            return Err(Error::InvalidConfig("no batch in flight".into()));
        };
        let out = self.finish()?;
        match batch::parse(&out, n)? {
            batch::BatchState::Complete(b) if b.entries.len() == n => {
                Ok(b.entries.iter().map(|r| out[r.clone()].to_vec()).collect())
            }
            st => Err(Error::Malformed {
                what: "result batch",
                detail: format!("{n} requests, got {st:?}"),
            }),
        }
    }

    fn submit_as(&mut self, req: &[u8], batch: Option<usize>, force: Option<Mode>) -> Result<()> {
        if self.pending.is_some() {
            return Err(Error::InvalidConfig(
                "a call is already in flight on this client".into(),
            ));
        }
        let is_batch = batch.is_some();
        if req.len() > self.max_request() {
            return Err(Error::TooLarge {
                what: "request",
                len: req.len(),
                limit: self.max_request(),
            });
        }
        let start = Instant::now();
        let deadline = start + self.timeout;
        let seq = next_seq(self.seq);
        self.seq = seq;
        let mode = force.unwrap_or_else(|| self.switch.mode());
        encode_request_as(seq, mode, is_batch, req, &mut self.frame)?;
        self.local.write_at(0, &self.frame).map_err(Error::Fabric)?;
        let n = self.frame.len();
        // Body and tail first, then the status word: the server polls the
        // status word, and WRITEs on one queue pair land in order.
        let qp = self.conn.qp().clone();
        if self.unsettled {
            // The server may still be about to take (or be copying) the
            // request of a call that timed out: overwriting its body under
            // its valid status word could make it serve a request made of
            // two. So the status word is zeroed first, in an earlier WRITE
            // on the same queue pair (a seqlock): the server then either
            // finds no request, or sees the status word change across its
            // copy and discards the copy. A zero word torn in half still
            // reads as invalid (sequence number 0).
            let wr = self.next_wr();
            qp.post_write(
                wr,
                Local::new(
                    &self.local,
                    self.info.request_cap + self.info.response_cap,
                    8,
                ),
                self.remote.at(0),
                false,
            )
            .map_err(Error::Fabric)?;
        }
        // Until its result comes back, this request may be the one the
        // server has not taken.
        self.unsettled = true;
        let wr = self.next_wr();
        qp.post_write(
            wr,
            Local::new(&self.local, 8, n - 8),
            self.remote.at(8),
            false,
        )
        .map_err(Error::Fabric)?;
        let wr = self.next_wr();
        qp.post_write(wr, Local::new(&self.local, 0, 8), self.remote.at(0), true)
            .map_err(Error::Fabric)?;
        self.wait_send(deadline)?;
        self.pending = Some(InFlight {
            seq,
            mode,
            start,
            deadline,
            batch,
            forced: force.is_some(),
        });
        Ok(())
    }

    /// Waits for the in-flight call's result (the pending call is over,
    /// whatever the outcome).
    fn finish(&mut self) -> Result<Vec<u8>> {
        let InFlight {
            seq,
            mode,
            start,
            deadline,
            forced,
            ..
        } = self
            .pending
            .take()
            .ok_or_else(|| Error::InvalidConfig("no call in flight".into()))?;
        let (header, payload_at, failed) = match mode {
            Mode::RemoteFetch => self.fetch(seq, deadline)?,
            Mode::ServerReply => (self.await_reply(seq, deadline)?, RESPONSE_HEADER, 0),
        };
        // A result for this request: the server copied it before it ran
        // the handler, so its buffer is ours to overwrite.
        self.unsettled = false;
        let len = header.len as usize;
        let out = self.window[payload_at..payload_at + len].to_vec();
        self.stats.calls += 1;
        self.stats.failed_reads += failed as u64;
        if mode == Mode::ServerReply {
            self.stats.server_reply_calls += 1;
        }
        if !forced {
            self.switch.handle_call(CallReport {
                mode,
                failed_reads: failed,
                server_time: Duration::from_nanos(header.proc_ns as u64),
                latency: start.elapsed(),
            });
        }
        if let Some(t) = self.fetch_tuner.as_mut()
            && let Some(c) = t.handle_result(wire::response_frame_len(len))
        {
            // The tuner's F comes from its table, at least an empty frame.
            let _ = self.set_fetch_params(c.fetch_size, c.retry_limit);
        }
        if header.flags & FLAG_TOO_LARGE != 0 {
            let real = out
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            return Err(Error::TooLarge {
                what: "result",
                len: real as usize,
                limit: wire::max_response_payload(match mode {
                    Mode::RemoteFetch => self.info.response_cap,
                    Mode::ServerReply => self.reply.len().min(self.info.response_cap),
                }),
            });
        }
        Ok(out)
    }

    fn next_wr(&mut self) -> u64 {
        self.wr += 1;
        self.wr
    }

    /// Polls the send completion queue for one completion.
    fn wait_send(&self, deadline: Instant) -> Result<()> {
        let mut wc = [Completion::EMPTY; 1];
        let mut spins = 0u32;
        loop {
            let k = self
                .conn
                .qp()
                .send_cq()
                .poll(&mut wc)
                .map_err(Error::Fabric)?;
            if k == 1 {
                if wc[0].status != Status::Success {
                    if let Some(e) = self.conn.qp().failure() {
                        return Err(Error::Fabric(e));
                    }
                    return Err(Error::Fabric(rrpc_core::Error::CompletionError {
                        wr_id: wc[0].wr_id,
                        status: wc[0].status,
                    }));
                }
                return Ok(());
            }
            spins += 1;
            if spins.is_multiple_of(256) {
                self.conn.check_alive().map_err(Error::Fabric)?;
                if Instant::now() > deadline {
                    return Err(Error::Timeout(self.timeout));
                }
                std::thread::yield_now();
            }
        }
    }

    fn read_remote(
        &mut self,
        local_off: usize,
        remote_off: usize,
        len: usize,
        deadline: Instant,
    ) -> Result<()> {
        let wr = self.next_wr();
        self.conn
            .qp()
            .post_read(
                wr,
                Local::new(&self.local, local_off, len),
                self.remote.at(remote_off as u64),
                true,
            )
            .map_err(Error::Fabric)?;
        self.wait_send(deadline)
    }

    /// Remote fetching (§3.2): READ F bytes until the result is there.
    fn fetch(&mut self, seq: u32, deadline: Instant) -> Result<(wire::ResponseHeader, usize, u32)> {
        let land = self.info.request_cap;
        let resp_off = self.info.request_cap;
        let cap = self.info.response_cap;
        let f = self.fetch_size;
        let mut failed = 0u32;
        let mut last_check = Instant::now();
        loop {
            let t0 = Instant::now();
            self.read_remote(land, resp_off, f, deadline)?;
            self.switch.handle_fetch_rtt(t0.elapsed());
            self.window.resize(f, 0);
            self.local
                .read_at(land, &mut self.window)
                .map_err(Error::Fabric)?;
            let mut st = wire::parse_response(&self.window, seq, cap)?;
            if let Fetched::NeedMore { total } = st {
                self.stats.second_reads += 1;
                self.read_remote(land + f, resp_off + f, total - f, deadline)?;
                self.window.resize(total, 0);
                self.local
                    .read_at(land, &mut self.window)
                    .map_err(Error::Fabric)?;
                st = wire::parse_response(&self.window, seq, cap)?;
            }
            if let Fetched::Complete(h) = st {
                return Ok((h, RESPONSE_HEADER, failed));
            }
            failed += 1;
            let now = Instant::now();
            if now > deadline {
                return Err(Error::Timeout(self.timeout));
            }
            if now.duration_since(last_check) > Duration::from_millis(1) {
                last_check = now;
                self.conn.check_alive().map_err(Error::Fabric)?;
            }
            // Past the retry budget the call keeps fetching, more gently:
            // the switch to server-reply applies from the next call on.
            if failed > self.switch.retry_limit() {
                if failed > self.switch.retry_limit() + 1000 {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Server-reply: wait for the server's WRITE into our reply buffer.
    fn await_reply(&mut self, seq: u32, deadline: Instant) -> Result<wire::ResponseHeader> {
        let cap = self.reply.len();
        let mut spins = 0u64;
        loop {
            let w = self
                .reply
                .atomic_u64(0)
                .map_err(Error::Fabric)?
                .load(std::sync::atomic::Ordering::Acquire);
            if w >> 63 == 1 && w as u32 == seq {
                let len = ((w >> 32) as usize) & wire::MAX_LEN;
                let total = wire::response_frame_len(len).min(cap);
                self.window.resize(total.max(RESPONSE_HEADER + TAIL), 0);
                self.reply
                    .read_at(0, &mut self.window)
                    .map_err(Error::Fabric)?;
                if let Fetched::Complete(h) = wire::parse_response(&self.window, seq, cap)? {
                    return Ok(h);
                }
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                if Instant::now() > deadline {
                    return Err(Error::Timeout(self.timeout));
                }
                self.conn.check_alive().map_err(Error::Fabric)?;
                if spins > 100_000 {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// A key-value client over RF-RPC: encodes each [`Op`], calls, decodes the
/// [`OpResult`]. [`Execute::execute`] takes `&self`, so the [`RfClient`]
/// sits behind a `Mutex`: calls from several threads are serialised on the
/// one connection (RF-RPC has one outstanding call per connection); use one
/// `KvClient` per thread for parallelism.
#[derive(Debug)]
pub struct KvClient {
    inner: Mutex<RfClient>,
}

impl KvClient {
    /// Connects (see [`RfClient::connect`]).
    ///
    /// # Errors
    /// As [`RfClient::connect`].
    pub fn connect(endpoint: &FabricAddr, fabric: &Fabric, cfg: RfClientConfig) -> Result<Self> {
        Ok(KvClient {
            inner: Mutex::new(RfClient::connect(endpoint, fabric, cfg)?),
        })
    }

    /// Wraps a connected client.
    pub fn new(client: RfClient) -> Self {
        KvClient {
            inner: Mutex::new(client),
        }
    }

    /// Carries out `op` on the server.
    ///
    /// # Errors
    /// As [`RfClient::call`], [`Op::encode`] and [`OpResult::decode`].
    pub fn call(&self, op: &Op) -> Result<OpResult> {
        let req = op.to_bytes()?;
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let res = c.call(&req)?;
        OpResult::decode(&res)
    }

    /// Runs `f` on the inner client (statistics, mode).
    pub fn with_client<T>(&self, f: impl FnOnce(&mut RfClient) -> T) -> T {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }
}

impl Execute for KvClient {
    /// Transport errors become [`OpResult::Failed`] with the error's text.
    fn execute(&self, op: Op) -> OpResult {
        self.call(&op)
            .unwrap_or_else(|e| OpResult::Failed(format!("rf-rpc: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_build_checks_the_ranges() {
        let b = RfClientConfig::builder;
        let err = |b: RfClientConfigBuilder| b.build().unwrap_err().to_string();
        let min = wire::response_frame_len(0);
        assert!(b().fetch_size(min).build().is_ok());
        assert!(err(b().fetch_size(min - 1)).contains(&format!("fetch_size {}", min - 1)));
        assert!(err(b().fetch_size((1 << 29) + 1)).contains("fetch_size"));
        assert!(err(b().call_timeout(Duration::ZERO)).contains("call_timeout 0"));
        assert!(err(b().reply_buffer(63)).contains("reply_buffer 63 must be in 64..="));
        assert!(err(b().reply_buffer((1 << 29) + 1)).contains("reply_buffer"));
        let c = b().retry_limit(9).measured_switch(false).build().unwrap();
        assert_eq!((c.retry_limit(), c.measured_switch()), (9, false));
        let d = c.to_builder().fetch_size(4096).build().unwrap();
        assert_eq!((d.fetch_size(), d.retry_limit()), (4096, 9));
        assert_eq!(RfClientConfig::default().fetch_size(), DEFAULT_FETCH_SIZE);
    }
}
