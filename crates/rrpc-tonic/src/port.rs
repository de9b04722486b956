//! `rrpc://host:port`: one TCP port for every client, and the best fabric
//! both ends share (issue #33: shm, verbs, TCP).
//!
//! # Why a scheme of its own
//!
//! `rdma://` means "RDMA or fail" and `shm://` "these rings or fail": a
//! test or an operator that asks for them must never be carried by
//! something else in silence. `rrpc://` is the one that may choose.
//!
//! # The server
//!
//! A server on `rrpc://0.0.0.0:50051` listens on TCP and reads the first
//! bytes of each connection (within [`RrpcConfig::handshake_timeout`], at
//! most [`RrpcConfig::max_pending_handshakes`] connections at a time):
//!
//! * the HTTP/2 client preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`): the
//!   connection goes to tonic's own server with the same router, services,
//!   layers and options as `http://`, so tonic `Channel`s, grpc-go and
//!   grpcio work unchanged;
//! * rrpc's hello (`hello`: magic `RRPN`, version, length-bounded body):
//!   the negotiation below;
//! * a TLS record (first byte 0x16, a ClientHello), when the server has
//!   TLS (`Server::tls_config`, feature `tls`): rrpc terminates the TLS
//!   session (within the same timeout) and reads the first bytes again
//!   inside it, where the HTTP/2 preface and rrpc's hello are served as
//!   above; a negotiation that stays on TCP carries HTTP/2 inside that
//!   session. With TLS the port refuses plaintext (HTTP/2 calls answered
//!   `Unavailable`, a hello refused, both saying TLS is required); without
//!   it a ClientHello is garbage. A ring connection a TLS negotiation sends
//!   a client to presents a ticket of that session first ([`crate::tls`]);
//! * anything else, a malformed hello, or nothing within the timeout: the
//!   connection is closed (a refusal reply first, when the hello's header
//!   was rrpc's) and a warning logged.
//!
//! Beside the TCP port it runs a `shm://` rings listener, bound at startup
//! in `$XDG_RUNTIME_DIR` (else the temp dir) as
//! `rrpc-port-<port>-<pid>.sock`, unless its config
//! leaves [`Fabric::Shm`] out; and, in a build with the `verbs` feature
//! whose config allows [`Fabric::Verbs`], an `rdma://` side channel on the
//! port's IP address at a port the OS picks, if the verbs device opens
//! (without one the port serves the other fabrics, and fails to bind only
//! when verbs is all its config allows).
//!
//! # The negotiation
//!
//! On the wire (all integers big-endian), every message is an 8-byte
//! header and a body of at most 1024 bytes:
//!
//! ```text
//! header: magic "RRPN" (4) | version u8 (= 1) | kind u8 | body length u16
//! hello  (kind 1): fabrics u8 (bits: 1 tcp, 2 shm, 4 verbs)
//!                  | host-id length u8 | host id (at most 255 bytes)
//! reply  (kind 2): code u8, then
//!          0 (tcp):     nothing; HTTP/2 follows on this connection
//!          1 (shm):     host-id length u8 | host id | path length u16 | path
//!                       (UTF-8, at most 512 bytes)
//!          2 (verbs):   port u16 (not 0) of the rdma:// side channel
//!        255 (refused): the reason (UTF-8, the rest of the body)
//! ```
//!
//! The client's hello carries the fabrics it allows and its host identity
//! (the kernel's boot id, `/etc/machine-id` and the inode of
//! its network namespace). The server takes the best fabric both allow:
//!
//! 1. **shm**, if the identities are equal and non-empty and its shm
//!    listener runs: the reply names the listener's path (and the server's
//!    identity, which the client checks too). The client must then reach
//!    that Unix socket, which is the proof that both are on one host (a
//!    remote peer cannot open it); the token rules of [`RrpcConfig`]
//!    apply there as on any `shm://` connection. If the client cannot
//!    reach it and allows TCP, it negotiates again on a new connection,
//!    offering TCP only.
//! 2. **verbs**, if both allow it (a client offers it only when built with
//!    the `verbs` feature) and the server's `rdma://` side channel runs:
//!    the reply names that channel's port, and the client dials `rdma://`
//!    at the IP address its TCP connection reached and that port (a
//!    server can name a port, never another host). The proof that verbs
//!    works between the two is the client's queue pair connecting: it
//!    needs an active device on the client and the server's GID reachable
//!    from it. If it fails and the client allows TCP, it negotiates again
//!    on a new connection, offering TCP only (as for shm); if verbs was
//!    all it allowed, its error is [`Error::NoFabric`] naming the side
//!    channel and the cause. The token (and the rest of the `rdma://`
//!    handshake) applies there as on any `rdma://` connection.
//! 3. **TCP**: the reply says so and HTTP/2 follows on this same
//!    connection (the client hands the open stream to tonic through a
//!    connector).
//! 4. Otherwise a refusal naming what was missing on which side (the
//!    allowed sets, "another host" for shm, "no active RDMA device" for
//!    verbs); the client's error is [`Error::NoFabric`].
//!
//! The hello carries no GID: the server cannot know whether the client's
//! device reaches its own, so it offers verbs and lets the queue pair
//! decide (one extra round trip on a failure, then TCP).
//!
//! # What was chosen
//!
//! [`crate::RrpcChannel::carrier`] reports [`crate::Carrier::Shm`],
//! [`crate::Carrier::Verbs`] (device and peer GID read from the live queue
//! pair) or [`crate::Carrier::Tcp`]; each side logs one `info` line per negotiated
//! connection naming the fabric, and counts it in the `metrics` counter
//! `rrpc_connections_total{fabric, side}` (`side`: `client` or `server`;
//! plain HTTP/2 clients of the port count as `fabric="tcp"`).

pub(crate) mod hello;
pub(crate) mod limits;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::config::Fabric;
use crate::tls::{ClientTls, ServerTls, Ticket};
use crate::{Error, RrpcConfig};
use hello::{HEADER_LEN, Hello, HelloError, Reply};
use limits::{Counted, Limits, PeerId};

/// The HTTP/2 client preface (RFC 9113 §3.4).
pub(crate) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The prefix of the shm listener's socket file name.
const SOCKET_PREFIX: &str = "rrpc-port-";

/// This host's identity as the negotiation compares it: the kernel's boot
/// id, the machine id and the inode of this process's network namespace,
/// `:`-separated. Empty when the boot id cannot be read (then the server
/// never offers shm on identity).
pub(crate) fn host_id() -> &'static [u8] {
    static ID: OnceLock<Vec<u8>> = OnceLock::new();
    ID.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let boot = read("/proc/sys/kernel/random/boot_id");
        if boot.is_empty() {
            return Vec::new();
        }
        let machine = read("/etc/machine-id");
        let netns = std::fs::metadata("/proc/self/ns/net")
            .map(|m| m.ino())
            .unwrap_or(0);
        let mut id = format!("{boot}:{machine}:{netns}").into_bytes();
        id.truncate(hello::MAX_HOST_ID);
        id
    })
}

/// Where a port's shm listener binds: `$XDG_RUNTIME_DIR` (else the temp
/// dir), `rrpc-port-<port>-<pid>.sock`.
pub(crate) fn shm_socket_path(port: u16) -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("{SOCKET_PREFIX}{port}-{}.sock", std::process::id()))
}

/// Whether a path a server named may be dialed: absolute, and a port's
/// socket by its name (a hostile server cannot point the client at any
/// other Unix socket of its host).
fn acceptable_path(p: &Path) -> bool {
    p.is_absolute()
        && p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(SOCKET_PREFIX) && n.ends_with(".sock"))
}

fn names(bits: u8) -> String {
    let v: Vec<&str> = [Fabric::Shm, Fabric::Verbs, Fabric::Tcp]
        .into_iter()
        .filter(|f| bits & f.bit() != 0)
        .map(Fabric::name)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Counts a connection in `rrpc_connections_total{fabric, side}`.
pub(crate) fn count(fabric: Fabric, side: &'static str) {
    metrics::counter!("rrpc_connections_total", "fabric" => fabric.name(), "side" => side)
        .increment(1);
}

/// The server's choice for a hello: shm on the same host, else verbs,
/// else TCP, among the fabrics both allow. `shm` is the shm listener's
/// path and `verbs` the `rdma://` side channel's port, if they run.
pub(crate) fn choose(
    h: &Hello,
    server_bits: u8,
    shm: Option<&Path>,
    verbs: Option<u16>,
) -> (Option<Fabric>, Reply) {
    let both = h.fabrics & server_bits;
    let same_host = !h.host_id.is_empty() && h.host_id == host_id();
    if both & Fabric::Shm.bit() != 0
        && same_host
        && let Some(path) = shm.and_then(|p| p.to_str())
        && path.len() <= hello::MAX_PATH
    {
        return (
            Some(Fabric::Shm),
            Reply::Shm {
                host_id: host_id().to_vec(),
                path: path.to_string(),
            },
        );
    }
    if both & Fabric::Verbs.bit() != 0
        && let Some(port) = verbs
    {
        return (Some(Fabric::Verbs), Reply::Verbs { port });
    }
    if both & Fabric::Tcp.bit() != 0 {
        return (Some(Fabric::Tcp), Reply::Tcp);
    }
    let mut why = format!(
        "the client allows [{}], the server allows [{}]",
        names(h.fabrics),
        names(server_bits)
    );
    if both & Fabric::Shm.bit() != 0 {
        why.push_str(if same_host {
            "; shm: the server has no shm listener"
        } else {
            "; shm: the client is on another host (host identities differ)"
        });
    }
    if both & Fabric::Verbs.bit() != 0 {
        why.push_str(
            "; verbs: the server has no active RDMA device (no rdma:// side channel runs)",
        );
    }
    (None, Reply::Refused(why))
}

/// What a client's negotiation ended with.
#[derive(Debug)]
pub(crate) enum Chosen {
    /// Dial the shm listener at this path (the TCP connection is closed);
    /// inside TLS, present the session's ticket there.
    Shm(PathBuf, Option<Ticket>),
    /// Dial `rdma://` at this side channel (the server's address, the port
    /// its reply named; the TCP connection is closed); inside TLS, present
    /// the session's ticket there.
    Verbs(std::net::SocketAddr, Option<Ticket>),
    /// HTTP/2 on this connection (inside TLS when the negotiation was).
    Tcp(PortIo),
}

/// The TCP connection a negotiation left for HTTP/2: plain, or the TLS
/// session the negotiation ran in.
#[derive(Debug)]
pub(crate) enum PortIo {
    /// Plaintext.
    Plain(TcpStream),
    /// Inside TLS ([`crate::tls`]).
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl PortIo {
    fn tcp(&self) -> &TcpStream {
        match self {
            PortIo::Plain(s) => s,
            #[cfg(feature = "tls")]
            PortIo::Tls(s) => s.get_ref().0,
        }
    }
}

macro_rules! port_io {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            PortIo::Plain($s) => $e,
            #[cfg(feature = "tls")]
            PortIo::Tls($s) => $e,
        }
    };
}

impl AsyncRead for PortIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        port_io!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for PortIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        port_io!(self, s => Pin::new(s).poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        port_io!(self, s => Pin::new(s).poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        port_io!(self, s => Pin::new(s).poll_shutdown(cx))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        port_io!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            PortIo::Plain(s) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            PortIo::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Connects to `addr` and negotiates, offering `bits`, within `limit`;
/// inside TLS when `tls` is set ([`crate::tls`]).
pub(crate) async fn negotiate(
    addr: &str,
    bits: u8,
    limit: Duration,
    tls: Option<&ClientTls>,
) -> Result<Chosen, Error> {
    match tokio::time::timeout(limit, negotiate_inner(addr, bits, tls)).await {
        Ok(r) => r,
        Err(_) => Err(Error::ConnectTimeout(limit)),
    }
}

/// The fabric a reply chose, before the connection is handed on.
enum Choice {
    Shm(PathBuf),
    Verbs(std::net::SocketAddr),
    Tcp,
}

async fn negotiate_inner(addr: &str, bits: u8, tls: Option<&ClientTls>) -> Result<Chosen, Error> {
    if bits == 0 {
        return Err(Error::NoFabric {
            addr: addr.to_string(),
            reason: "the client allows no fabric this build can use \
                     (verbs needs the `verbs` feature)"
                .into(),
        });
    }
    let s = TcpStream::connect(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            Error::NotListening(format!("rrpc://{addr}"))
        } else {
            Error::Io(e)
        }
    })?;
    s.set_nodelay(true)?;
    // The address this connection reached: a server names only a port for
    // verbs, never another host.
    let peer = s.peer_addr()?;
    let (mut io, ticket) = match tls {
        None => (PortIo::Plain(s), None),
        #[cfg(feature = "tls")]
        Some(t) => {
            let s = t.connect(addr, s).await?;
            let ticket = crate::tls::ticket_of(s.get_ref().1)?;
            (PortIo::Tls(Box::new(s)), Some(ticket))
        }
        #[cfg(not(feature = "tls"))]
        Some(t) => match *t {},
    };
    let chosen = match exchange(&mut io, addr, bits, peer).await? {
        Choice::Shm(p) => Chosen::Shm(p, ticket),
        Choice::Verbs(a) => Chosen::Verbs(a, ticket),
        Choice::Tcp => Chosen::Tcp(io),
    };
    let fabric = chosen.fabric();
    tracing::info!(%addr, %fabric, tls = tls.is_some(), "rrpc: negotiated the {fabric} fabric");
    count(fabric, "client");
    Ok(chosen)
}

/// The hello and the reply, on `s` (TCP, or TLS over it).
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    addr: &str,
    bits: u8,
    peer: std::net::SocketAddr,
) -> Result<Choice, Error> {
    let hello = Hello {
        fabrics: bits,
        host_id: host_id().to_vec(),
    };
    s.write_all(&hello.encode()).await?;
    s.flush().await?;
    let bad = |e: HelloError| Error::Handshake(format!("rrpc://{addr}: the server's reply: {e}"));
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).await.map_err(|e| {
        Error::Handshake(format!(
            "rrpc://{addr}: no negotiation reply ({e}); is it an rrpc:// port?"
        ))
    })?;
    let h = hello::parse_header(&head).map_err(bad)?;
    if h.is_hello() {
        return Err(bad(HelloError::Kind(1)));
    }
    let mut body = vec![0u8; h.len];
    s.read_exact(&mut body).await?;
    Ok(match Reply::decode_body(&body).map_err(bad)? {
        Reply::Tcp if bits & Fabric::Tcp.bit() != 0 => Choice::Tcp,
        Reply::Shm { host_id: id, path } if bits & Fabric::Shm.bit() != 0 => {
            let path = PathBuf::from(path);
            if id != host_id() {
                return Err(Error::Handshake(format!(
                    "rrpc://{addr}: the server offered shm but its host identity differs"
                )));
            }
            if !acceptable_path(&path) {
                return Err(Error::Handshake(format!(
                    "rrpc://{addr}: the server named {} as its shm listener, \
                     not an rrpc port's socket",
                    path.display()
                )));
            }
            Choice::Shm(path)
        }
        Reply::Verbs { port } if bits & Fabric::Verbs.bit() != 0 => {
            let mut at = peer;
            at.set_port(port);
            Choice::Verbs(at)
        }
        Reply::Refused(reason) if reason.starts_with(limits::REFUSAL_PREFIX) => {
            return Err(Error::ConnectionLimit(reason));
        }
        Reply::Refused(reason) if reason.starts_with(crate::tls::TLS_REQUIRED) => {
            return Err(Error::Handshake(format!(
                "rrpc://{addr}: {reason} (set RrpcEndpoint::tls_config; feature `tls`)"
            )));
        }
        Reply::Refused(reason) => {
            return Err(Error::NoFabric {
                addr: addr.to_string(),
                reason: format!("the server refused: {reason}"),
            });
        }
        other => {
            return Err(Error::Handshake(format!(
                "rrpc://{addr}: the server chose {other:?}, which the client did not offer"
            )));
        }
    })
}

impl Chosen {
    /// The fabric chosen.
    pub(crate) fn fabric(&self) -> Fabric {
        match self {
            Chosen::Shm(..) => Fabric::Shm,
            Chosen::Verbs(..) => Fabric::Verbs,
            Chosen::Tcp(_) => Fabric::Tcp,
        }
    }
}

/// A ring endpoint a negotiation gave, and the ticket to present there.
type Hint = (rrpc_core::FabricAddr, Option<Ticket>);

/// An `rrpc://` target: the address and, right after the first
/// negotiation, the ring endpoint it gave (taken by the first dial).
#[derive(Debug, Clone)]
pub(crate) struct PortTarget {
    addr: String,
    hint: Arc<Mutex<Option<Hint>>>,
    /// Negotiate inside TLS ([`crate::RrpcEndpoint::tls_config`]).
    tls: Option<Arc<ClientTls>>,
}

impl PartialEq for PortTarget {
    fn eq(&self, o: &Self) -> bool {
        self.addr == o.addr
    }
}
impl Eq for PortTarget {}

impl PortTarget {
    /// A target for `host:port`.
    pub(crate) fn new(addr: &str) -> Self {
        PortTarget {
            addr: addr.to_string(),
            hint: Arc::default(),
            tls: None,
        }
    }

    /// The same target, negotiating inside TLS with `tls`.
    #[cfg(feature = "tls")]
    pub(crate) fn with_tls(&self, tls: Option<Arc<ClientTls>>) -> Self {
        PortTarget {
            tls,
            ..self.clone()
        }
    }

    /// The TLS its negotiations run in, if any.
    pub(crate) fn tls(&self) -> Option<&Arc<ClientTls>> {
        self.tls.as_ref()
    }

    /// The `host:port`.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The same target, whose next dial goes straight to `ep` (presenting
    /// `ticket` there, if its negotiation ran inside TLS).
    pub(crate) fn with_hint(&self, ep: rrpc_core::FabricAddr, ticket: Option<Ticket>) -> Self {
        PortTarget {
            addr: self.addr.clone(),
            hint: Arc::new(Mutex::new(Some((ep, ticket)))),
            tls: self.tls.clone(),
        }
    }

    /// The ring endpoint to dial and the ticket to present there: the hint
    /// if one is left, else a new negotiation offering the ring fabrics
    /// `cfg` allows (shm, verbs; a ring channel's reconnect).
    pub(crate) async fn ring_endpoint(
        &self,
        cfg: &RrpcConfig,
    ) -> Result<(rrpc_core::FabricAddr, Option<Ticket>), Error> {
        let hint = self.hint.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(ep) = hint {
            return Ok(ep);
        }
        let rings = cfg.fabric_bits() & (Fabric::Shm.bit() | Fabric::Verbs.bit());
        let tls = self.tls.as_deref();
        match negotiate(&self.addr, rings, cfg.handshake_timeout(), tls).await? {
            Chosen::Shm(p, t) => Ok((rrpc_core::FabricAddr::Shm(p), t)),
            Chosen::Verbs(a, t) => Ok((rrpc_core::FabricAddr::Rdma(a), t)),
            Chosen::Tcp(_) => Err(Error::Handshake("the server chose tcp".into())),
        }
    }
}

/// tonic's connector for the TCP fabric: the stream the first negotiation
/// left open, then a new negotiation (TCP only, inside TLS when `tls` is
/// set) per connection tonic makes.
pub(crate) fn tcp_connector(
    addr: String,
    first: Option<PortIo>,
    limit: Duration,
    nodelay: bool,
    tls: Option<Arc<ClientTls>>,
) -> impl tower::Service<
    http::Uri,
    Response = hyper_util::rt::TokioIo<PortIo>,
    Error = Error,
    Future = impl Send + 'static,
> + Send
+ 'static {
    let first = Arc::new(Mutex::new(first));
    tower::service_fn(move |_: http::Uri| {
        let (addr, first, tls) = (addr.clone(), first.clone(), tls.clone());
        async move {
            let open = first.lock().unwrap_or_else(|e| e.into_inner()).take();
            let s = match open {
                Some(s) => s,
                None => match negotiate(&addr, Fabric::Tcp.bit(), limit, tls.as_deref()).await? {
                    Chosen::Tcp(s) => s,
                    other => {
                        return Err(Error::Handshake(format!(
                            "the server chose {}",
                            other.fabric()
                        )));
                    }
                },
            };
            s.tcp().set_nodelay(nodelay)?;
            Ok(hyper_util::rt::TokioIo::new(s))
        }
    })
}

/// A TCP connection for tonic's server, with the bytes read while
/// sniffing it given back first.
#[derive(Debug)]
pub(crate) struct PortStream<S = TcpStream> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

/// A TLS connection of the port for tonic's server: the TLS session over
/// the TCP connection (whose first bytes, the ClientHello's, were read
/// while sniffing), and inside it the HTTP/2 preface given back first.
/// tonic's `Connected` for the TLS stream gives its requests
/// `TlsConnectInfo<TcpConnectInfo>`: `Request::peer_certs()` works.
#[cfg(feature = "tls")]
pub(crate) type TlsPortStream = PortStream<tokio_rustls::server::TlsStream<PortStream>>;

impl<S: AsyncRead + Unpin> AsyncRead for PortStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = &mut *self;
        if me.at < me.prefix.len() {
            let n = (me.prefix.len() - me.at).min(buf.remaining());
            buf.put_slice(&me.prefix[me.at..me.at + n]);
            me.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut me.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PortStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: Connected> Connected for PortStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The side listeners and what the sniffer needs.
#[derive(Debug, Clone)]
pub(crate) struct Sniffer {
    /// The server's config (fabrics, timeouts, limits).
    pub(crate) config: RrpcConfig,
    /// The shm listener's socket, if one runs.
    pub(crate) shm: Option<PathBuf>,
    /// The `rdma://` side channel's port, if one runs.
    pub(crate) verbs: Option<u16>,
    /// The server's connection limits, shared with its ring listeners: a
    /// connection that stays on TCP holds a slot until it closes.
    pub(crate) limits: Arc<Limits>,
    /// The server's TLS ([`crate::Server::tls_config`]): with it, every
    /// connection must open with a ClientHello.
    pub(crate) tls: Option<Arc<ServerTls>>,
}

/// Where the sniffer hands HTTP/2 connections to tonic: plaintext ones,
/// and (with TLS) those inside TLS, to a tonic server of their own so that
/// their requests carry `TlsConnectInfo` (`Request::peer_certs()`).
#[derive(Debug, Clone)]
pub(crate) struct ToTonic {
    /// Plaintext connections (`TcpConnectInfo`).
    pub(crate) plain: mpsc::Sender<Result<Counted<PortStream>, std::io::Error>>,
    /// Connections inside TLS (`TlsConnectInfo<TcpConnectInfo>`).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<mpsc::Sender<Result<Counted<TlsPortStream>, std::io::Error>>>,
}

impl From<mpsc::Sender<Result<Counted<PortStream>, std::io::Error>>> for ToTonic {
    fn from(plain: mpsc::Sender<Result<Counted<PortStream>, std::io::Error>>) -> Self {
        ToTonic {
            plain,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// A connection for tonic, plain or inside TLS.
enum Sniffed {
    Plain(Counted<PortStream>),
    #[cfg(feature = "tls")]
    Tls(Box<Counted<TlsPortStream>>),
}

impl ToTonic {
    async fn send(&self, s: Sniffed) {
        match s {
            Sniffed::Plain(s) => {
                let _ = self.plain.send(Ok(s)).await;
            }
            #[cfg(feature = "tls")]
            Sniffed::Tls(s) => {
                if let Some(tx) = &self.tls {
                    let _ = tx.send(Ok(*s)).await;
                }
            }
        }
    }
}

/// Accepts TCP connections until `token` is cancelled, sending HTTP/2
/// ones (plain or negotiated, in clear or inside TLS) to tonic through
/// `to_tonic`.
pub(crate) async fn sniff_loop(
    mut incoming: tonic::transport::server::TcpIncoming,
    to_tonic: ToTonic,
    sniffer: Sniffer,
    token: CancellationToken,
) {
    let setups = Arc::new(Semaphore::new(sniffer.config.max_pending_handshakes()));
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            s = incoming.next() => {
                let s = match s {
                    None => break,
                    Some(Ok(s)) => s,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "rrpc port: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let peer = s.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
                let Ok(permit) = setups.clone().try_acquire_owned() else {
                    tracing::warn!(
                        %peer,
                        limit = sniffer.config.max_pending_handshakes(),
                        "rrpc port: too many connections in setup; closing the new one",
                    );
                    continue;
                };
                let (sniffer, tx) = (sniffer.clone(), to_tonic.clone());
                conns.spawn(async move {
                    let limit = sniffer.config.handshake_timeout();
                    let r = tokio::time::timeout(limit, sniff(s, &sniffer, &peer)).await;
                    drop(permit);
                    match r {
                        Ok(Ok(Some(stream))) => tx.send(stream).await,
                        Ok(Ok(None)) => {}
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, error = %e, "rrpc port: connection refused and closed");
                        }
                        Err(_) => tracing::warn!(
                            %peer, ?limit,
                            "rrpc port: no HTTP/2 preface or rrpc hello within the handshake timeout; closed"
                        ),
                    }
                });
            }
        }
    }
}

/// Answers a bad hello with a refusal and closes.
async fn refuse<S, T>(s: &mut S, e: HelloError) -> Result<Option<T>, Error>
where
    S: AsyncWrite + Unpin,
{
    let _ = s.write_all(&Reply::Refused(e.to_string()).encode()).await;
    let _ = s.shutdown().await;
    Err(Error::Handshake(format!("a bad rrpc hello: {e}")))
}

/// Answers every call of a plain HTTP/2 client refused (by a connection
/// limit, or for want of TLS) with `code` and `reason` (trailers only),
/// then closes; bounded by the caller's handshake timeout.
async fn refuse_http2<S>(s: S, code: tonic::Code, reason: &str) -> Result<(), Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let h2err = |e: h2::Error| Error::Handshake(format!("refusing an HTTP/2 client: {e}"));
    let mut conn = h2::server::handshake(s).await.map_err(h2err)?;
    let mut answered = false;
    while let Some(req) = conn.accept().await {
        let (_req, mut respond) = req.map_err(h2err)?;
        let res = http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", (code as i32).to_string())
            .header("grpc-message", reason)
            .body(())
            .map_err(|e| Error::Handshake(format!("refusing an HTTP/2 client: {e}")))?;
        let _ = respond.send_response(res, true);
        if !answered {
            // No new streams; those open are answered, then it closes.
            conn.graceful_shutdown();
            answered = true;
        }
    }
    Ok(())
}

/// Reads the first bytes of `s`: a ClientHello (the rest runs inside
/// TLS), HTTP/2 for tonic, a hello negotiated (`None` when the client goes
/// to a ring listener), else an error. With TLS configured, plaintext is
/// refused with the reason. A connection that stays on TCP takes a slot of
/// the server's limits first; refused, the client reads why
/// ([`Error::ConnectionLimit`]).
async fn sniff(mut s: TcpStream, sniffer: &Sniffer, peer: &str) -> Result<Option<Sniffed>, Error> {
    let who = s
        .peer_addr()
        .map_or(PeerId::Socket(rrpc_core::conn::PeerKey::Unknown), |a| {
            PeerId::host(a.ip())
        });
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).await?;
    if head[0] == crate::tls::TLS_HANDSHAKE_RECORD {
        let Some(tls) = &sniffer.tls else {
            // Closed without a word, as any other garbage (`one_port`'s
            // hostile-hello test pins it); the client's TLS stack reports
            // the closed connection in its handshake.
            return Err(Error::Handshake(
                "a TLS ClientHello, and this server has no TLS (Server::tls_config, \
                 feature `tls`); closed"
                    .into(),
            ));
        };
        #[cfg(feature = "tls")]
        {
            let replay = PortStream {
                prefix: head.to_vec(),
                at: 0,
                inner: s,
            };
            let mut t = tls.accept(replay).await?;
            // A negotiation that sends the client to a ring issues the
            // session's ticket first, for the ring connection to present.
            let ticket = crate::tls::ticket_of(t.get_ref().1)?;
            let info = t.connect_info();
            let ttl = crate::tls::ticket_lifetime(sniffer.config.handshake_timeout());
            let issue = move || tls.issue(ticket, info, ttl);
            let mut head = [0u8; HEADER_LEN];
            t.read_exact(&mut head).await?;
            return Ok(first_bytes(t, head, sniffer, who, peer, true, issue)
                .await?
                .map(|s| Sniffed::Tls(Box::new(s))));
        }
        #[cfg(not(feature = "tls"))]
        match **tls {}
    }
    if sniffer.tls.is_some() {
        return refuse_plaintext(s, head).await;
    }
    Ok(first_bytes(s, head, sniffer, who, peer, false, || {})
        .await?
        .map(Sniffed::Plain))
}

/// A plaintext client of a port that requires TLS: a plain HTTP/2 client
/// gets `Unavailable` on its calls, an rrpc hello a refusal, both saying
/// so; anything else is closed.
async fn refuse_plaintext(
    mut s: TcpStream,
    head: [u8; HEADER_LEN],
) -> Result<Option<Sniffed>, Error> {
    let why = format!(
        "{}: connect with TLS (a ClientTlsConfig; https:// for tonic), not plaintext",
        crate::tls::TLS_REQUIRED
    );
    if head[..] == H2_PREFACE[..HEADER_LEN] {
        let mut rest = [0u8; H2_PREFACE.len() - HEADER_LEN];
        s.read_exact(&mut rest).await?;
        if rest[..] == H2_PREFACE[HEADER_LEN..] {
            let stream = PortStream {
                prefix: H2_PREFACE.to_vec(),
                at: 0,
                inner: s,
            };
            refuse_http2(stream, tonic::Code::Unavailable, &why).await?;
        }
    } else if hello::parse_header(&head).is_ok() {
        let _ = s.write_all(&Reply::Refused(why.clone()).encode()).await;
        let _ = s.shutdown().await;
    }
    Err(Error::Handshake(format!(
        "a plaintext client refused: {why}"
    )))
}

/// After the first bytes (`head`) of `s`, in clear or inside TLS: the
/// HTTP/2 preface for tonic, or rrpc's hello negotiated (`to_ring` runs
/// before a reply that sends the client to a ring fabric).
async fn first_bytes<S>(
    mut s: S,
    head: [u8; HEADER_LEN],
    sniffer: &Sniffer,
    who: PeerId,
    peer: &str,
    tls: bool,
    to_ring: impl FnOnce(),
) -> Result<Option<Counted<PortStream<S>>>, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let bits = sniffer.config.fabric_bits();
    if head[..] == H2_PREFACE[..HEADER_LEN] {
        let mut rest = [0u8; H2_PREFACE.len() - HEADER_LEN];
        s.read_exact(&mut rest).await?;
        if rest[..] != H2_PREFACE[HEADER_LEN..] {
            return Err(Error::Handshake("a malformed HTTP/2 preface".into()));
        }
        if bits & Fabric::Tcp.bit() == 0 {
            return Err(Error::Handshake(
                "a plain HTTP/2 client, and this server's fabrics leave out tcp".into(),
            ));
        }
        let stream = PortStream {
            prefix: H2_PREFACE.to_vec(),
            at: 0,
            inner: s,
        };
        let slot = match sniffer.limits.admit(who) {
            Ok(slot) => slot,
            Err(r) => {
                let reason = r.message();
                refuse_http2(stream, tonic::Code::ResourceExhausted, &reason).await?;
                return Err(Error::ConnectionLimit(reason));
            }
        };
        tracing::info!(%peer, fabric = "tcp", tls, "rrpc port: a plain HTTP/2 client");
        count(Fabric::Tcp, "server");
        return Ok(Some(Counted::new(stream, slot)));
    }
    let h = match hello::parse_header(&head) {
        Ok(h) => h,
        Err(HelloError::Magic) => {
            return Err(Error::Handshake(format!(
                "neither a TLS ClientHello, the HTTP/2 preface nor an rrpc hello \
                 (first bytes {head:02x?})"
            )));
        }
        Err(e) => return refuse(&mut s, e).await,
    };
    if !h.is_hello() {
        return refuse(&mut s, HelloError::Kind(2)).await;
    }
    let mut body = vec![0u8; h.len];
    s.read_exact(&mut body).await?;
    let hello = match Hello::decode_body(&body) {
        Ok(h) => h,
        Err(e) => return refuse(&mut s, e).await,
    };
    let (mut fabric, mut reply) = choose(&hello, bits, sniffer.shm.as_deref(), sniffer.verbs);
    // Staying on TCP takes a place here; shm and verbs take theirs on the
    // ring listener they go to.
    let mut slot = None;
    if fabric == Some(Fabric::Tcp) {
        match sniffer.limits.admit(who) {
            Ok(s) => slot = Some(s),
            Err(r) => (fabric, reply) = (None, Reply::Refused(r.message())),
        }
    }
    if matches!(fabric, Some(Fabric::Shm | Fabric::Verbs)) {
        to_ring();
    }
    s.write_all(&reply.encode()).await?;
    s.flush().await?;
    match fabric {
        Some(f) => {
            tracing::info!(%peer, fabric = %f, tls, "rrpc port: negotiated the {f} fabric");
            count(f, "server");
        }
        None => {
            let _ = s.shutdown().await;
            let Reply::Refused(why) = reply else {
                unreachable!("no fabric is a refusal")
            };
            if why.starts_with(limits::REFUSAL_PREFIX) {
                return Err(Error::ConnectionLimit(why));
            }
            return Err(Error::NoFabric {
                addr: peer.to_string(),
                reason: why,
            });
        }
    }
    Ok(match (fabric, slot) {
        (Some(Fabric::Tcp), Some(slot)) => Some(Counted::new(
            PortStream {
                prefix: Vec::new(),
                at: 0,
                inner: s,
            },
            slot,
        )),
        // shm, verbs: the client dials the side listener; this connection
        // is done (inside TLS, `s` drops without a close_notify: the
        // client closes its end after reading the reply).
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_takes_the_best_fabric_both_allow() {
        let (shm, tcp) = (Fabric::Shm.bit(), Fabric::Tcp.bit());
        let path = shm_socket_path(1);
        let local = |fabrics| Hello {
            fabrics,
            host_id: host_id().to_vec(),
        };
        let remote = |fabrics| Hello {
            fabrics,
            host_id: b"elsewhere".to_vec(),
        };
        assert!(!host_id().is_empty(), "a Linux host has a boot id");
        let (f, r) = choose(&local(shm | tcp), shm | tcp, Some(&path), None);
        assert_eq!(f, Some(Fabric::Shm));
        assert!(matches!(r, Reply::Shm { path: p, .. } if p == path.to_str().unwrap()));
        assert_eq!(
            choose(&remote(shm | tcp), shm | tcp, Some(&path), None).0,
            Some(Fabric::Tcp)
        );
        assert_eq!(
            choose(&local(tcp), shm | tcp, Some(&path), None).0,
            Some(Fabric::Tcp)
        );
        assert_eq!(
            choose(&local(shm | tcp), tcp, Some(&path), None).0,
            Some(Fabric::Tcp)
        );
        assert_eq!(
            choose(&local(shm | tcp), shm | tcp, None, None).0,
            Some(Fabric::Tcp)
        );
        // Unknown bits (a newer client's) are ignored.
        assert_eq!(
            choose(&remote(0x80 | tcp), shm | tcp, None, None).0,
            Some(Fabric::Tcp)
        );
        let Reply::Refused(why) = choose(&remote(shm), shm | tcp, Some(&path), None).1 else {
            panic!("refused")
        };
        assert!(why.contains("another host"), "{why}");
        let Reply::Refused(why) = choose(&local(tcp), shm, Some(&path), None).1 else {
            panic!("refused")
        };
        assert!(
            why.contains("client allows [tcp], the server allows [shm]"),
            "{why}"
        );
        let Reply::Refused(why) = choose(&local(shm), shm, None, None).1 else {
            panic!("refused")
        };
        assert!(why.contains("no shm listener"), "{why}");
        // An empty identity never matches.
        let anon = Hello {
            fabrics: shm,
            host_id: Vec::new(),
        };
        assert_eq!(choose(&anon, shm, Some(&path), None).0, None);
    }

    /// A negotiation on each fabric, against the real sniffer: the client
    /// gets what the server chose, a TCP connection reaches tonic's queue,
    /// and each side counts it in `rrpc_connections_total{fabric, side}`.
    #[test]
    fn negotiations_are_chosen_handed_on_and_counted() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // One thread (a current-thread runtime) so that the local recorder
        // sees both sides.
        metrics::with_local_recorder(&recorder, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let addr = l.local_addr().expect("addr").to_string();
                let (tx, mut rx) = mpsc::channel(4);
                let token = CancellationToken::new();
                let shm = shm_socket_path(1);
                let sniffer = Sniffer {
                    config: RrpcConfig::default(),
                    shm: Some(shm.clone()),
                    verbs: None,
                    limits: Limits::new(&RrpcConfig::default()),
                    tls: None,
                };
                let incoming = tonic::transport::server::TcpIncoming::from(l);
                let sniffing =
                    tokio::spawn(sniff_loop(incoming, tx.into(), sniffer, token.clone()));
                let limit = Duration::from_secs(5);
                let both = Fabric::Shm.bit() | Fabric::Tcp.bit();
                assert!(matches!(
                    negotiate(&addr, both, limit, None).await.expect("shm"),
                    Chosen::Shm(p, None) if p == shm
                ));
                let Chosen::Tcp(mut c) = negotiate(&addr, Fabric::Tcp.bit(), limit, None)
                    .await
                    .expect("tcp")
                else {
                    panic!("tcp")
                };
                // The server's end of that connection reaches tonic's queue,
                // with nothing replayed.
                let mut s = rx.recv().await.expect("queued").expect("a stream");
                assert!(s.get_ref().prefix.is_empty());
                c.write_all(b"ping").await.expect("write");
                let mut got = [0u8; 4];
                s.read_exact(&mut got).await.expect("read");
                assert_eq!(&got, b"ping");
                token.cancel();
                sniffing.await.expect("sniffer ends");
            });
        });
        let mut counted: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "rrpc_connections_total")
            .map(|(k, _, _, v)| {
                let labels: Vec<_> = k
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (labels.join(","), v)
            })
            .collect();
        counted.sort_by(|a, b| a.0.cmp(&b.0));
        let one = |l: &str| (l.to_string(), DebugValue::Counter(1));
        assert_eq!(
            counted,
            vec![
                one("fabric=shm,side=client"),
                one("fabric=shm,side=server"),
                one("fabric=tcp,side=client"),
                one("fabric=tcp,side=server"),
            ]
        );
    }

    /// A connection that stays on TCP holds a place under the server's
    /// limits until tonic drops it: past the per-peer limit a negotiation
    /// is refused with [`Error::ConnectionLimit`] naming it, and once the
    /// first connection is gone a new one is taken.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tcp_connections_hold_a_place_under_the_limits() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let (tx, mut rx) = mpsc::channel(4);
        let token = CancellationToken::new();
        let config = RrpcConfig::builder()
            .max_connections(2)
            .max_connections_per_peer(1)
            .build()
            .unwrap();
        let limits = Limits::new(&config);
        let sniffer = Sniffer {
            config,
            shm: None,
            verbs: None,
            limits: limits.clone(),
            tls: None,
        };
        let incoming = tonic::transport::server::TcpIncoming::from(l);
        let sniffing = tokio::spawn(sniff_loop(incoming, tx.into(), sniffer, token.clone()));
        let (limit, tcp) = (Duration::from_secs(5), Fabric::Tcp.bit());
        let Chosen::Tcp(first) = negotiate(&addr, tcp, limit, None).await.expect("tcp") else {
            panic!("tcp")
        };
        let held = rx.recv().await.expect("queued").expect("a stream");
        assert_eq!(limits.held(), 1);
        let e = negotiate(&addr, tcp, limit, None)
            .await
            .expect_err("past the limit");
        assert!(
            matches!(&e, Error::ConnectionLimit(m) if m.contains("max_connections_per_peer")),
            "{e}"
        );
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        drop((held, first));
        assert_eq!(limits.held(), 0);
        let Chosen::Tcp(_again) = negotiate(&addr, tcp, limit, None).await.expect("tcp again")
        else {
            panic!("tcp")
        };
        let _held = rx.recv().await.expect("queued").expect("a stream");
        token.cancel();
        sniffing.await.expect("sniffer ends");
    }

    /// Every combination of what the client allows, what the server
    /// allows, which side listeners run and whether both are on one host:
    /// shm on one host, else verbs, else TCP, else a refusal that names
    /// what was missing.
    #[test]
    fn the_choice_table() {
        let path = shm_socket_path(1);
        let all = [Fabric::Shm, Fabric::Verbs, Fabric::Tcp];
        let mut seen = std::collections::HashSet::new();
        for client in 1u8..8 {
            for server in 1u8..8 {
                for (has_shm, has_verbs, same) in
                    (0..8).map(|i| (i & 1 != 0, i & 2 != 0, i & 4 != 0))
                {
                    let h = Hello {
                        fabrics: client,
                        host_id: if same {
                            host_id().to_vec()
                        } else {
                            b"elsewhere".to_vec()
                        },
                    };
                    let (f, reply) = choose(
                        &h,
                        server,
                        has_shm.then_some(path.as_path()),
                        has_verbs.then_some(7000),
                    );
                    let both = |x: Fabric| client & server & x.bit() != 0;
                    let want = if both(Fabric::Shm) && same && has_shm {
                        Some(Fabric::Shm)
                    } else if both(Fabric::Verbs) && has_verbs {
                        Some(Fabric::Verbs)
                    } else if both(Fabric::Tcp) {
                        Some(Fabric::Tcp)
                    } else {
                        None
                    };
                    let case = format!(
                        "client {client:03b} server {server:03b} shm {has_shm} verbs {has_verbs} same {same}"
                    );
                    assert_eq!(f, want, "{case}");
                    seen.insert(f);
                    match (f, &reply) {
                        (
                            Some(Fabric::Shm),
                            Reply::Shm {
                                path: p,
                                host_id: id,
                            },
                        ) => {
                            assert_eq!(p, path.to_str().unwrap());
                            assert_eq!(id, host_id());
                        }
                        (Some(Fabric::Verbs), Reply::Verbs { port: 7000 })
                        | (Some(Fabric::Tcp), Reply::Tcp) => {}
                        (None, Reply::Refused(why)) => {
                            let side = |bits: u8| {
                                let v: Vec<_> = all
                                    .iter()
                                    .filter(|f| bits & f.bit() != 0)
                                    .map(|f| f.name())
                                    .collect();
                                v.join(", ")
                            };
                            assert!(
                                why.contains(&format!(
                                    "the client allows [{}], the server allows [{}]",
                                    side(client),
                                    side(server)
                                )),
                                "{case}: {why}"
                            );
                            if both(Fabric::Verbs) {
                                assert!(
                                    why.contains("verbs: the server has no active RDMA device"),
                                    "{case}: {why}"
                                );
                            }
                            if both(Fabric::Shm) {
                                assert!(
                                    why.contains(if same {
                                        "no shm listener"
                                    } else {
                                        "another host"
                                    }),
                                    "{case}: {why}"
                                );
                            }
                        }
                        _ => panic!("{case}: {f:?} with {reply:?}"),
                    }
                }
            }
        }
        assert_eq!(seen.len(), 4, "every outcome occurs");
    }

    #[test]
    fn only_a_port_socket_is_dialed() {
        assert!(acceptable_path(&shm_socket_path(50051)));
        for p in [
            "/var/run/docker.sock",
            "rrpc-port-1-2.sock",
            "/tmp/rrpc-port-1",
        ] {
            assert!(!acceptable_path(Path::new(p)), "{p}");
        }
    }
}
