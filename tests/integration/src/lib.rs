//! Shared harness for the integration tests: one test service, a server
//! started on any transport in its own runtime (so a test can kill it), and a
//! macro that runs a test body on every transport (tcp, shm HTTP/2, shm fast
//! path, rdma, and `rrpc://` landing on tcp, shm and verbs) with the same
//! assertions.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::Stream;
use rrpc_tonic::{PathPreference, RrpcChannel, RrpcConfig, RrpcContext, RrpcEndpoint, Server};
use tokio::sync::{Notify, mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

/// Generated code for `proto/test.proto`.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("test");
}

use pb::test_server::{Test, TestServer};
use pb::{Input, Output};

/// `Input::tag` that makes the unary handler panic before its first `.await`.
pub const PANIC_AT_FIRST_POLL: &str = "panic-at-first-poll";
/// `Input::tag` that makes the unary handler panic after an `.await`.
pub const PANIC_AFTER_AWAIT: &str = "panic-after-await";

/// The transports every test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// tonic over TCP (the reference behaviour).
    Tcp,
    /// HTTP/2 over shm rings.
    ShmH2,
    /// The fast path over shm rings.
    ShmFast,
    /// HTTP/2 over RDMA rings (`rdma://`, feature `verbs`, device from
    /// `RRPC_TEST_DEVICE`).
    RdmaH2,
    /// The fast path over RDMA rings.
    RdmaFast,
    /// The server on `rrpc://` (one TCP port); the client allows only
    /// `Fabric::Tcp`: tonic's HTTP/2 on the TCP connection it negotiated on.
    PortTcp,
    /// The server on `rrpc://`; the client allows only `Fabric::Shm` and
    /// lands on shm rings, fast path.
    PortShm,
    /// The server on `rrpc://` with the verbs device; the client allows
    /// only `Fabric::Verbs` and lands on RDMA rings, fast path (feature
    /// `verbs`, device from `RRPC_TEST_DEVICE`).
    PortVerbs,
}

impl Transport {
    /// The RDMA device the `rdma` transports run on (`RRPC_TEST_DEVICE`,
    /// e.g. `rxe0` inside `cargo xtask rxe`); `None`: they are skipped.
    pub fn rdma_device() -> Option<String> {
        std::env::var("RRPC_TEST_DEVICE")
            .ok()
            .filter(|d| !d.is_empty())
    }

    /// Whether this transport carries HTTP/2 (tonic over TCP, or rrpc's HTTP/2 path).
    pub fn is_http2(self) -> bool {
        matches!(
            self,
            Transport::Tcp | Transport::PortTcp | Transport::ShmH2 | Transport::RdmaH2
        )
    }

    /// Whether this transport is tonic's own HTTP/2 over TCP (`http://`, or
    /// `rrpc://` negotiated down to TCP): tonic's behaviour, no rings.
    pub fn is_tcp(self) -> bool {
        matches!(self, Transport::Tcp | Transport::PortTcp)
    }

    /// Whether this transport runs on RDMA.
    pub fn is_rdma(self) -> bool {
        matches!(
            self,
            Transport::RdmaH2 | Transport::RdmaFast | Transport::PortVerbs
        )
    }

    /// Whether the transport is shm rings.
    pub fn is_shm(self) -> bool {
        matches!(
            self,
            Transport::ShmH2 | Transport::ShmFast | Transport::PortShm
        )
    }

    /// Whether the server listens on `rrpc://` (one TCP port) and the
    /// client negotiates its fabric there.
    pub fn is_port(self) -> bool {
        matches!(
            self,
            Transport::PortTcp | Transport::PortShm | Transport::PortVerbs
        )
    }

    /// The fabric the client of this transport must land on: the only one
    /// its config allows on `rrpc://`, or the one its URI names.
    pub fn fabric(self) -> rrpc_tonic::Fabric {
        if self.is_tcp() {
            rrpc_tonic::Fabric::Tcp
        } else if self.is_rdma() {
            rrpc_tonic::Fabric::Verbs
        } else {
            rrpc_tonic::Fabric::Shm
        }
    }

    /// The name the test modules use (`shm_fast`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::ShmH2 => "shm_h2",
            Transport::ShmFast => "shm_fast",
            Transport::RdmaH2 => "rdma_h2",
            Transport::RdmaFast => "rdma_fast",
            Transport::PortTcp => "port_tcp",
            Transport::PortShm => "port_shm",
            Transport::PortVerbs => "rdma_port",
        }
    }

    /// The transport of [`Transport::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Transport::Tcp,
            Transport::ShmH2,
            Transport::ShmFast,
            Transport::RdmaH2,
            Transport::RdmaFast,
            Transport::PortTcp,
            Transport::PortShm,
            Transport::PortVerbs,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }
}

/// What the server saw, for assertions about server-side effects.
#[derive(Debug, Default)]
pub struct Observed {
    /// Tags of streaming handlers whose stream was dropped before finishing.
    pub cancelled: std::sync::Mutex<Vec<String>>,
    /// Signalled when a handler starts (for shutdown/kill tests).
    pub started: Notify,
    /// Signalled when a handler's stream is dropped early.
    pub cancel_seen: Notify,
    /// Messages the server-streaming handler has produced (taken by the
    /// transport), all calls together.
    pub produced: AtomicU64,
    /// Unary calls that reached the handler.
    pub unary_calls: AtomicU64,
    /// The client addresses unary calls came from, over TCP (tonic's
    /// `remote_addr`): one per connection.
    pub tcp_peers: std::sync::Mutex<std::collections::HashSet<std::net::SocketAddr>>,
    /// `"<tag> start"` and `"<tag> end"` of each unary call with a tag, in
    /// the order the handlers saw them (for ordering assertions).
    pub events: std::sync::Mutex<Vec<String>>,
}

impl Observed {
    fn event(&self, tag: &str, what: &str) {
        if !tag.is_empty() {
            self.events
                .lock()
                .expect("lock")
                .push(format!("{tag} {what}"));
        }
    }
}

#[derive(Debug, Clone)]
struct Svc {
    obs: Arc<Observed>,
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<Output, Status>> + Send>>;

/// A request extension that the server-side [`HttpStatusLayer`] inserts;
/// handlers answer `x-echo-ext: seen` when they find it.
#[derive(Debug, Clone)]
pub struct LayerMark;

fn echo_metadata<T>(req: &Request<T>, resp: &mut tonic::metadata::MetadataMap) {
    for kv in req.metadata().iter() {
        match kv {
            tonic::metadata::KeyAndValueRef::Ascii(k, v) if k.as_str().starts_with("x-echo") => {
                resp.insert(k.clone(), v.clone());
            }
            tonic::metadata::KeyAndValueRef::Binary(k, v) if k.as_str().starts_with("x-echo") => {
                resp.insert_bin(k.clone(), v.clone());
            }
            _ => {}
        }
    }
    if req.extensions().get::<LayerMark>().is_some() {
        resp.insert("x-echo-ext", "seen".parse().expect("ascii"));
    }
}

fn fail(code: i32) -> Status {
    let mut st = Status::new(tonic::Code::from(code), format!("failed with {code}"));
    st.metadata_mut()
        .insert("x-err-meta", "trailing".parse().expect("ascii"));
    st
}

/// Records the stream tag as cancelled when dropped unfinished.
struct DropWatch {
    tag: String,
    done: bool,
    obs: Arc<Observed>,
}

impl Drop for DropWatch {
    fn drop(&mut self) {
        if !self.done {
            self.obs
                .cancelled
                .lock()
                .expect("lock")
                .push(self.tag.clone());
            self.obs.cancel_seen.notify_one();
        }
    }
}

#[tonic::async_trait]
impl Test for Svc {
    async fn unary(&self, req: Request<Input>) -> Result<Response<Output>, Status> {
        self.obs.unary_calls.fetch_add(1, Ordering::Relaxed);
        if let Some(peer) = req.remote_addr() {
            self.obs.tcp_peers.lock().expect("lock").insert(peer);
        }
        let input = req.get_ref().clone();
        self.obs.event(&input.tag, "start");
        self.obs.started.notify_one();
        match input.tag.as_str() {
            PANIC_AT_FIRST_POLL => panic!("test handler panics at its first poll"),
            PANIC_AFTER_AWAIT => {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                panic!("test handler panics after an await");
            }
            _ => {}
        }
        if input.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(input.delay_ms as u64)).await;
        }
        self.obs.event(&input.tag, "end");
        if input.fail_code != 0 {
            return Err(fail(input.fail_code));
        }
        let total = input.payload.len() as u64;
        let mut resp = Response::new(Output {
            payload: input.payload,
            total,
        });
        echo_metadata(&req, resp.metadata_mut());
        Ok(resp)
    }

    type ServerStreamStream = BoxStream;

    async fn server_stream(&self, req: Request<Input>) -> Result<Response<BoxStream>, Status> {
        self.obs.started.notify_one();
        let input = req.get_ref().clone();
        let obs = self.obs.clone();
        let s = async_stream::stream! {
            let mut watch = DropWatch { tag: input.tag.clone(), done: false, obs };
            for i in 0..input.count {
                if input.delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(input.delay_ms as u64)).await;
                }
                watch.obs.produced.fetch_add(1, Ordering::Relaxed);
                yield Ok(Output { payload: input.payload.clone(), total: i as u64 });
            }
            watch.done = true;
            if input.fail_code != 0 {
                yield Err(fail(input.fail_code));
            }
        };
        let mut resp = Response::new(Box::pin(s) as BoxStream);
        echo_metadata(&req, resp.metadata_mut());
        Ok(resp)
    }

    async fn client_stream(
        &self,
        req: Request<Streaming<Input>>,
    ) -> Result<Response<Output>, Status> {
        let mut s = req.into_inner();
        let (mut total, mut n) = (0u64, 0u64);
        while let Some(m) = s.message().await? {
            total += m.payload.len() as u64;
            n += 1;
        }
        Ok(Response::new(Output {
            payload: n.to_le_bytes().to_vec(),
            total,
        }))
    }

    type BidiStream = BoxStream;

    async fn bidi(&self, req: Request<Streaming<Input>>) -> Result<Response<BoxStream>, Status> {
        let mut s = req.into_inner();
        let out = async_stream::stream! {
            let mut i = 0u64;
            loop {
                match s.message().await {
                    Ok(Some(m)) => {
                        yield Ok(Output { payload: m.payload, total: i });
                        i += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        yield Err(e);
                        break;
                    }
                }
            }
        };
        Ok(Response::new(Box::pin(out) as BoxStream))
    }
}

/// Server-side interceptor: `x-deny` metadata is rejected with `PermissionDenied`.
fn server_interceptor(req: Request<()>) -> Result<Request<()>, Status> {
    if req.metadata().contains_key("x-deny") {
        return Err(Status::permission_denied("denied by interceptor"));
    }
    Ok(req)
}

/// Server-side tower layer: marks every response with `x-layer: server`.
fn mark_response(mut res: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    res.headers_mut()
        .insert("x-layer", http::HeaderValue::from_static("server"));
    res
}

/// Server-side tower layer that answers a request carrying
/// `x-http-status: N` itself, with HTTP status N, no body and no
/// `grpc-status` (a proxy-style failure; the caller's code comes from the
/// HTTP status, as the gRPC spec maps it).
///
/// It also notes what only the HTTP request shows, for the handler to echo
/// back: `x-echo-authority` (the request URI's authority, or `none`) and
/// `x-echo-user-agent` (the `user-agent` header, or `none`).
#[derive(Debug, Clone)]
pub struct HttpStatusLayer;

impl<S> tower::Layer<S> for HttpStatusLayer {
    type Service = HttpStatus<S>;
    fn layer(&self, inner: S) -> HttpStatus<S> {
        HttpStatus(inner)
    }
}

/// The service of [`HttpStatusLayer`].
#[derive(Debug, Clone)]
pub struct HttpStatus<S>(S);

impl<S, B> tower::Service<http::Request<B>> for HttpStatus<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let authority = req
            .uri()
            .authority()
            .map_or_else(|| "none".to_string(), |a| a.to_string());
        let ua = req
            .headers()
            .get(http::header::USER_AGENT)
            .cloned()
            .unwrap_or(http::HeaderValue::from_static("none"));
        if let Ok(a) = http::HeaderValue::from_str(&authority) {
            req.headers_mut().insert("x-echo-authority", a);
        }
        req.headers_mut().insert("x-echo-user-agent", ua);
        req.extensions_mut().insert(LayerMark);
        let code = req
            .headers()
            .get("x-http-status")
            .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
            .and_then(|c| http::StatusCode::from_u16(c).ok());
        match code {
            Some(status) => Box::pin(async move {
                let mut res = http::Response::new(tonic::body::Body::empty());
                *res.status_mut() = status;
                res.headers_mut()
                    .insert("content-type", http::HeaderValue::from_static("text/plain"));
                Ok(res)
            }),
            None => Box::pin(self.0.call(req)),
        }
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A running test server, in its own thread and runtime.
#[derive(Debug)]
pub struct Harness {
    /// The URI clients connect to.
    pub uri: String,
    /// The transport.
    pub transport: Transport,
    /// What handlers observed.
    pub obs: Arc<Observed>,
    shutdown: Option<oneshot::Sender<()>>,
    done: Option<mpsc::Receiver<Result<(), String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    kill: Option<oneshot::Sender<()>>,
    config: RrpcConfig,
    /// The server's runtime state: a context of its own, so that no other
    /// test's server or channel shares its pools or shared connections.
    server_context: RrpcContext,
    /// The channels' runtime state: the server's unless set otherwise.
    client_context: RrpcContext,
}

/// The fabric a client built by hand from rrpc-core (a hostile or odd
/// client) uses on the rings transport `t`: shm, or the verbs device
/// `RRPC_TEST_DEVICE` names.
///
/// # Panics
/// On `Transport::Tcp`, or an rdma transport without a device.
pub fn raw_fabric(t: Transport) -> rrpc_core::Fabric {
    match t {
        Transport::ShmH2 | Transport::ShmFast | Transport::PortShm => rrpc_core::Fabric::shm(),
        #[cfg(feature = "verbs")]
        Transport::RdmaH2 | Transport::RdmaFast | Transport::PortVerbs => {
            rrpc_core::Fabric::verbs(Transport::rdma_device().as_deref()).expect("verbs device")
        }
        other => panic!("no rings on {other:?}"),
    }
}

/// The side channel of a rings server at `uri`, opened by hand and left
/// there: a Unix socket for `shm://`, TCP for `rdma://`.
#[derive(Debug)]
pub enum RawSideChannel {
    /// `shm://`.
    Unix(std::os::unix::net::UnixStream),
    /// `rdma://`.
    Tcp(std::net::TcpStream),
}

impl RawSideChannel {
    /// Connects to the side channel of the server at `uri`.
    ///
    /// # Panics
    /// If `uri` is not a rings URI or the connect fails.
    pub fn connect(uri: &str) -> Self {
        match rrpc_core::FabricAddr::parse(uri).expect("a rings uri") {
            rrpc_core::FabricAddr::Shm(p) => {
                Self::Unix(std::os::unix::net::UnixStream::connect(p).expect("connect"))
            }
            rrpc_core::FabricAddr::Rdma(a) => {
                Self::Tcp(std::net::TcpStream::connect(a).expect("connect"))
            }
            other => panic!("not a rings endpoint: {other:?}"),
        }
    }

    /// `set_read_timeout` of the socket.
    pub fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Self::Unix(s) => s.set_read_timeout(d),
            Self::Tcp(s) => s.set_read_timeout(d),
        }
    }
}

impl std::io::Read for RawSideChannel {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Unix(s) => s.read(buf),
            Self::Tcp(s) => s.read(buf),
        }
    }
}

impl std::io::Write for RawSideChannel {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Unix(s) => s.write(buf),
            Self::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Unix(s) => s.flush(),
            Self::Tcp(s) => s.flush(),
        }
    }
}

/// The config the harness uses on `t` (server and clients) unless told otherwise.
pub fn config(t: Transport) -> RrpcConfig {
    let c = RrpcConfig::builder()
        .ring_size(1 << 20)
        .build()
        .expect("valid ring size");
    let c = match t {
        Transport::ShmH2 | Transport::RdmaH2 => {
            c.to_builder().path(PathPreference::Http2).build().unwrap()
        }
        // Server and client both: the client lands on the one fabric it
        // allows (a server restricted alike grants nothing else).
        t if t.is_port() => c.to_builder().fabrics([t.fabric()]).build().unwrap(),
        _ => c,
    };
    match Transport::rdma_device() {
        Some(d) if t.is_rdma() => c.to_builder().rdma_device(d).build().unwrap(),
        _ => c,
    }
}

impl Harness {
    /// Starts the test service on `transport`.
    pub async fn start(transport: Transport) -> Self {
        Self::start_with(transport, config(transport)).await
    }

    /// Starts the test service on `transport` with `cfg` for the server and
    /// for the channels of [`Harness::channel`].
    pub async fn start_with(transport: Transport, cfg: RrpcConfig) -> Self {
        Self::start_with_options(transport, cfg, |s| s).await
    }

    /// Like [`Harness::start_with`], with tonic `Server` options set on
    /// the server builder (`|s| s.timeout(..)`).
    pub async fn start_with_options(
        transport: Transport,
        cfg: RrpcConfig,
        options: fn(Server) -> Server,
    ) -> Self {
        trace_from_env();
        let uri = match transport {
            // Port 0: the server binds first and the harness reads the
            // port back, so no other socket can take it in between.
            Transport::Tcp => "http://127.0.0.1:0".to_string(),
            Transport::RdmaH2 | Transport::RdmaFast => "rdma://127.0.0.1:0".to_string(),
            t if t.is_port() => "rrpc://127.0.0.1:0".to_string(),
            _ => Self::fresh_uri(transport),
        };
        Self::start_at(transport, &uri, cfg, options).await
    }

    /// A URI no server of this process uses yet, on `transport`, known
    /// before any server binds it (for tests that dial first). TCP ports
    /// come from below the kernel's ephemeral range, so that no outgoing
    /// connection of this process can hold the port when the server binds.
    pub fn fresh_uri(transport: Transport) -> String {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        match transport {
            t if t == Transport::Tcp || t.is_rdma() || t.is_port() => {
                let scheme = if t.is_port() {
                    "rrpc"
                } else if t.is_rdma() {
                    "rdma"
                } else {
                    "http"
                };
                let base = 20_000 + (std::process::id() as usize * 97 + n as usize * 13) % 12_000;
                let port = (0..12_000)
                    .map(|i| 20_000 + (base - 20_000 + i) % 12_000)
                    .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p as u16)).is_ok())
                    .expect("a free port in 20000..32000");
                format!("{scheme}://127.0.0.1:{port}")
            }
            _ => format!(
                "shm://{}/rrpc-it-{}-{n}.sock",
                std::env::temp_dir().display(),
                std::process::id()
            ),
        }
    }

    /// Starts the test service at `uri` (a server restarted at the same
    /// address, for reconnect tests; the address may be taken for a moment
    /// by the server killed there, see [`Harness::kill`]).
    pub async fn start_at(
        transport: Transport,
        uri: &str,
        cfg: RrpcConfig,
        options: fn(Server) -> Server,
    ) -> Self {
        let obs = Arc::new(Observed::default());
        let (sd_tx, sd_rx) = oneshot::channel::<()>();
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel(1);
        let (bound_tx, bound_rx) = oneshot::channel::<String>();
        let context = RrpcContext::new(&cfg);
        let (u, o, c, ctx) = (uri.to_string(), obs.clone(), cfg.clone(), context.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let inner = TestServer::new(Svc { obs: o })
                    .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                    .send_compressed(tonic::codec::CompressionEncoding::Gzip)
                    .max_decoding_message_size(4 << 20);
                let svc = tonic::service::interceptor::InterceptedService::new(
                    inner,
                    server_interceptor as fn(Request<()>) -> Result<Request<()>, Status>,
                );
                let serve = options(Server::builder())
                    .layer(HttpStatusLayer)
                    .layer(tower::util::MapResponseLayer::new(
                        mark_response
                            as fn(
                                http::Response<tonic::body::Body>,
                            ) -> http::Response<tonic::body::Body>,
                    ))
                    .add_service(svc);
                // A server restarted at the address of one just killed: the killed
                // one's runtime (`shutdown_background`) closes its listener on its
                // own threads, a moment later, where a killed process's socket
                // closes with the process. Wait for the address, up to 5 s.
                let t0 = std::time::Instant::now();
                let incoming = loop {
                    match rrpc_tonic::RrpcIncoming::bind_with_context(&u, c.clone(), ctx.clone()) {
                        Ok(i) => break i,
                        Err(e) if addr_in_use(&e) && t0.elapsed() < Duration::from_secs(5) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("bind {u}: {e}"),
                    }
                };
                let _ = bound_tx.send(incoming.uri().to_string());
                let serve = serve.serve_rrpc_incoming(incoming, async move {
                    let _ = sd_rx.await;
                });
                tokio::select! {
                    r = serve => { let _ = done_tx.send(r.map_err(|e| e.to_string())).await; }
                    _ = kill_rx => {}
                }
            });
            // Dropping the runtime here ends every task at once, like a killed process.
            rt.shutdown_background();
        });
        let uri = bound_rx.await.expect("the server thread bound its URI");
        Harness {
            uri,
            transport,
            obs,
            shutdown: Some(sd_tx),
            done: Some(done_rx),
            thread: Some(thread),
            kill: Some(kill_tx),
            config: cfg,
            server_context: context.clone(),
            client_context: context,
        }
    }

    /// Makes [`Harness::channel`] use `cfg` instead of the server's
    /// config, with a context of its own (a client with state of its own,
    /// as in another process).
    pub fn set_client_config(&mut self, cfg: RrpcConfig) {
        self.client_context = RrpcContext::new(&cfg);
        self.config = cfg;
    }

    /// Makes [`Harness::channel`] use `cfg` in `context` (a client whose
    /// state outlives this harness, e.g. across a server restart).
    pub fn set_client(&mut self, cfg: RrpcConfig, context: RrpcContext) {
        self.config = cfg;
        self.client_context = context;
    }

    /// The server's runtime state (its pools, the shared connections it
    /// holds); the channels' too unless a client config was set.
    pub fn server_context(&self) -> &RrpcContext {
        &self.server_context
    }

    /// The runtime state of [`Harness::channel`]'s channels.
    pub fn client_context(&self) -> &RrpcContext {
        &self.client_context
    }

    /// Connects a channel, retrying while the server comes up.
    pub async fn channel(&self) -> RrpcChannel {
        let mut last = None;
        for _ in 0..200 {
            let ep = RrpcEndpoint::new(&self.uri)
                .expect("the harness's URI")
                .config(self.config.clone())
                .context(self.client_context.clone());
            match ep.connect().await {
                Ok(c) => {
                    let want = match self.transport {
                        Transport::Tcp | Transport::PortTcp => rrpc_tonic::ChannelPath::Tcp,
                        Transport::ShmH2 | Transport::RdmaH2 => rrpc_tonic::ChannelPath::Http2,
                        Transport::ShmFast
                        | Transport::RdmaFast
                        | Transport::PortShm
                        | Transport::PortVerbs => rrpc_tonic::ChannelPath::Fast,
                    };
                    assert_eq!(c.path(), want, "negotiated path");
                    // Read from the live connection's queue pair, not from the URI.
                    match c.carrier() {
                        rrpc_tonic::Carrier::Verbs {
                            device,
                            peer: Some(_),
                        } if self.transport.is_rdma() => {
                            // Verbs carried it, on the device asked for: no fallback.
                            let want = Transport::rdma_device().expect("RRPC_TEST_DEVICE");
                            assert_eq!(device, want, "rdma:// runs on the verbs device");
                        }
                        rrpc_tonic::Carrier::Shm if self.transport.is_shm() => {}
                        rrpc_tonic::Carrier::Tcp if self.transport.is_tcp() => {}
                        other => panic!(
                            "{:?} was carried by {other:?}, observed on the connection",
                            self.transport
                        ),
                    }
                    return c;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("could not connect to {}: {last:?}", self.uri);
    }

    /// A generated client on a fresh channel.
    pub async fn client(&self) -> pb::test_client::TestClient<RrpcChannel> {
        pb::test_client::TestClient::new(self.channel().await)
    }

    /// Graceful shutdown: returns when the server has drained.
    pub async fn shutdown(&mut self) -> Result<(), String> {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        match self.done.as_mut() {
            Some(d) => d.recv().await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }

    /// Kills the server abruptly (its runtime is dropped mid-flight).
    pub fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
    }
}

/// `err` is what a call past its deadline reads on `t`, whoever's timer
/// fired (the client's or the server's): gRPC's `DeadlineExceeded` on
/// every rrpc path; `Cancelled` "Timeout expired" over TCP, where
/// `RrpcChannel` is tonic's own `Channel` and the server tonic's own
/// (tonic's behaviour, asserted so that an upgrade that changes it is
/// noticed).
pub fn assert_expired(t: Transport, err: &Status) {
    if t.is_tcp() {
        assert_eq!(err.code(), tonic::Code::Cancelled, "{t:?}: {err:?}");
        assert_eq!(err.message(), "Timeout expired", "{t:?}: {err:?}");
    } else {
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{t:?}: {err:?}");
        assert_eq!(err.message(), "Deadline Exceeded", "{t:?}: {err:?}");
    }
}

/// A unary call that sleeps `delay_ms` in the handler must end as an
/// expired call does on `t` ([`assert_expired`]), and a quick call on the
/// same client must then work.
pub async fn expect_timeout_then_ok(
    c: &mut pb::test_client::TestClient<RrpcChannel>,
    t: Transport,
    delay_ms: u32,
) {
    let err = c
        .unary(Input {
            delay_ms,
            ..Default::default()
        })
        .await
        .expect_err("the timeout fires");
    assert_expired(t, &err);
    c.unary(Input::default()).await.expect("a quick call");
}

/// Calls left in flight on `c`, for tests that break what carries them:
/// `slow` unary calls of 100 bytes that wait ten minutes for their reply
/// (their connection is quiet meanwhile), and `streams` endless server
/// streams of 512-byte messages, `stream_delay_ms` apart (busy). Each task
/// returns how its call ended.
pub fn calls_in_flight(
    c: &pb::test_client::TestClient<RrpcChannel>,
    slow: usize,
    streams: usize,
    stream_delay_ms: u32,
) -> tokio::task::JoinSet<Result<(), Status>> {
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..slow {
        let mut c = c.clone();
        calls.spawn(async move {
            c.unary(Input {
                payload: payload(100),
                delay_ms: 600_000,
                ..Default::default()
            })
            .await
            .map(|_| ())
        });
    }
    for _ in 0..streams {
        let mut c = c.clone();
        calls.spawn(async move {
            let mut s = c
                .server_stream(Input {
                    payload: payload(512),
                    count: u32::MAX,
                    delay_ms: stream_delay_ms,
                    ..Default::default()
                })
                .await?
                .into_inner();
            while s.message().await?.is_some() {}
            Ok(())
        });
    }
    calls
}

/// Shared memory resident in this process (`RssShmem`), in KiB: what the
/// rings of the connections in it hold (the tests that read it run one at
/// a time).
pub fn rss_shmem_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssShmem in /proc/self/status")
}

/// With `RRPC_TEST_LOG` set to an `EnvFilter` directive (for example
/// `rrpc_tonic=debug,rrpc_poller=debug,rrpc_core=debug`), prints rrpc's
/// `tracing` events to stderr, with thread ids and times: what each end saw
/// when a test fails where it cannot be debugged (the soft-RoCE VM of `cargo
/// xtask rxe`). Unset, nothing is installed. Every [`Harness`] calls it.
pub fn trace_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(filter) = std::env::var("RRPC_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .with_thread_ids(true)
                .try_init();
        }
    });
}

/// A multi-threaded runtime of two workers, for tests that drive several
/// transports from one plain `#[test]`.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(Duration::from_millis(100))
        .enable_all()
        .build()
        .expect("runtime")
}

/// The connection behind `c` still carries calls: a 7-byte request is
/// answered with its length.
pub async fn assert_still_usable(c: &mut pb::test_client::TestClient<RrpcChannel>) {
    let r = c
        .unary(Input {
            payload: payload(7),
            ..Default::default()
        })
        .await
        .expect("the connection is still usable")
        .into_inner();
    assert_eq!(r.total, 7);
}

/// A call made on `t` after its server closed fails `Unavailable`. Over TCP
/// `RrpcChannel` is tonic's own `Channel`, which may dispatch the call on the
/// connection hyper is closing and report "connection closed" as
/// `Cancelled`: tonic's behaviour, kept.
pub fn assert_closed_status(t: Transport, err: &Status) {
    if t.is_tcp() {
        assert!(
            matches!(
                err.code(),
                tonic::Code::Unavailable | tonic::Code::Cancelled
            ),
            "{err:?}"
        );
    } else {
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    }
}

/// A request payload of `n` bytes with a recognisable pattern.
pub fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Runs `async fn $name(t: Transport)` once per transport as separate tests.
#[macro_export]
macro_rules! on_all_transports {
    ($($name:ident),* $(,)?) => {
        mod tcp {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Transport::Tcp).await } )*
        }
        $crate::on_shm!($($name),*);
        $crate::on_rdma!($($name),*);
        $crate::on_port!($($name),*);
    };
}

/// The `rrpc://` variants of [`on_all_transports!`]: the server on one TCP
/// port, the client landing on each fabric it negotiates (modules
/// `port_tcp`, `port_shm` and, with `verbs`, `rdma_port`, skipped unless
/// `RRPC_TEST_DEVICE` names a device). The harness checks the carrier.
#[macro_export]
macro_rules! on_port {
    ($($name:ident),* $(,)?) => {
        mod port_tcp {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Transport::PortTcp).await } )*
        }
        mod port_shm {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Transport::PortShm).await } )*
        }
        $crate::on_port_verbs!($($name),*);
    };
}

/// The rings variants of [`on_port!`] (`port_shm` and, with `verbs`,
/// `rdma_port`), for tests of rings, pools and shared queue pairs that
/// reach the server through `rrpc://`.
#[macro_export]
macro_rules! on_port_rings {
    ($($name:ident),* $(,)?) => {
        mod port_shm {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Transport::PortShm).await } )*
        }
        $crate::on_port_verbs!($($name),*);
    };
}

/// The `rdma_port` module of [`on_port!`] (feature `verbs`), named so that
/// the verbs suite's filter (`rdma_`, `cargo xtask rxe`) selects it.
#[cfg(feature = "verbs")]
#[macro_export]
macro_rules! on_port_verbs {
    ($($name:ident),* $(,)?) => {
        mod rdma_port {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() {
                if $crate::Transport::rdma_device().is_none() { eprintln!("skipped: RRPC_TEST_DEVICE not set"); return; }
                eprintln!("rrpc-test-on-verbs");
                super::$name($crate::Transport::PortVerbs).await
            } )*
        }
    };
}

/// Without the `verbs` feature there is no `rdma_port` module.
#[cfg(not(feature = "verbs"))]
#[macro_export]
macro_rules! on_port_verbs {
    ($($name:ident),* $(,)?) => {};
}

/// The rings transports only (`shm_h2`, `shm_fast` and, with `verbs`,
/// `rdma_h2`, `rdma_fast`), for tests of what TCP does not have (rings,
/// pools, shared queue pairs): no `tcp` variant that could only pass.
#[macro_export]
macro_rules! on_rings {
    ($($name:ident),* $(,)?) => {
        $crate::on_shm!($($name),*);
        $crate::on_rdma!($($name),*);
    };
}

/// The shm variants only (modules `shm_h2` and `shm_fast`), for tests of
/// what only the shm provider can do, such as injecting faults.
#[macro_export]
macro_rules! on_shm {
    ($($name:ident),* $(,)?) => {
        mod shm_h2 {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Transport::ShmH2).await } )*
        }
        mod shm_fast {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::Transport::ShmFast).await } )*
        }
    };
}

/// The `rdma` variants of [`on_all_transports!`]: with the `verbs` feature,
/// modules `rdma_h2` and `rdma_fast`, each test skipped (it says so) unless
/// `RRPC_TEST_DEVICE` names a device.
#[cfg(feature = "verbs")]
#[macro_export]
macro_rules! on_rdma {
    ($($name:ident),* $(,)?) => {
        mod rdma_h2 {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() {
                if $crate::Transport::rdma_device().is_none() { eprintln!("skipped: RRPC_TEST_DEVICE not set"); return; }
                eprintln!("rrpc-test-on-verbs");
                super::$name($crate::Transport::RdmaH2).await
            } )*
        }
        mod rdma_fast {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() {
                if $crate::Transport::rdma_device().is_none() { eprintln!("skipped: RRPC_TEST_DEVICE not set"); return; }
                eprintln!("rrpc-test-on-verbs");
                super::$name($crate::Transport::RdmaFast).await
            } )*
        }
    };
}

/// Without the `verbs` feature the `rdma` variants do not exist.
#[cfg(not(feature = "verbs"))]
#[macro_export]
macro_rules! on_rdma {
    ($($name:ident),* $(,)?) => {};
}

/// Whether `e`, or an error it wraps, is `EADDRINUSE`.
fn addr_in_use(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The suite's test service on its own, for tests that build their
/// server by hand (`suite::inproc`).
pub fn test_service() -> pb::test_server::TestServer<impl pb::test_server::Test> {
    pb::test_server::TestServer::new(Svc {
        obs: Arc::default(),
    })
}
