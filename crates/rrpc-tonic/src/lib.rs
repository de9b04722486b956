//! tonic over rrpc: one builder option moves a tonic service onto RDMA-style
//! rings (RR-Compound, Fig. 3: the gRPC stack on top, rings underneath).
//!
//! # Server
//!
//! ```no_run
//! # async fn run<S>(greeter: S) -> Result<(), rrpc_tonic::Error>
//! # where S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>, Error = std::convert::Infallible>
//! #   + tonic::server::NamedService + Clone + Send + Sync + 'static, S::Future: Send + 'static {
//! use rrpc_tonic::{RrpcConfig, Server};
//! Server::builder()                      // was: tonic::transport::Server::builder()
//!     .add_service(greeter)              // e.g. GreeterServer::new(MyGreeter)
//!     .serve_rrpc("shm:///run/greeter.sock", RrpcConfig::default())
//!     .await
//! # }
//! ```
//!
//! `serve_rrpc` takes `http://ip:port` (plain tonic over TCP), `unix:///path`
//! (plain tonic over a Unix socket), `shm:///path`, `rdma://ip:port`,
//! `inproc://name` and `rrpc://ip:port`. [`Router::serve_dual`] serves TCP
//! and rrpc from the same services at once, on two addresses.
//!
//! # One port, the best fabric
//!
//! `rrpc://ip:port` serves everyone on one TCP port: plain gRPC clients
//! (tonic `Channel`s on `http://`, grpc-go, grpcio) exactly as `http://`
//! does, and rrpc clients on the best fabric both ends share, negotiated
//! per connection: shared memory on the same host, else RDMA verbs (with
//! the `verbs` feature and a device on both ends), else HTTP/2 on that TCP
//! connection ([`RrpcConfig::fabrics`] allows or forbids each;
//! [`RrpcChannel::carrier`] says which was chosen). [`port`] has the
//! protocol; `rdma://` keeps meaning "RDMA or fail".
//!
//! # Client
//!
//! ```no_run
//! # async fn run() -> Result<(), rrpc_tonic::Error> {
//! use rrpc_tonic::{RrpcChannel, RrpcConfig};
//! let channel = RrpcChannel::connect("shm:///run/greeter.sock", RrpcConfig::default()).await?;
//! // let mut client = GreeterClient::new(channel);   // the generated client, unchanged
//! # let _ = channel; Ok(()) }
//! ```
//!
//! # Two paths, negotiated per connection
//!
//! The client offers a path and the server picks one, inside the
//! transport's own handshake on `shm://` and `rdma://` (so a connect is one
//! round trip; [`frame::path_hello`] is the offer's encoding).
//!
//! * **Fast path** (default between two rrpc endpoints): calls travel as our
//!   own [frames](frame) — call id, method path, metadata, message chunks,
//!   end of stream, trailers (`grpc-status`, `grpc-message`, trailing
//!   metadata), cancellation, GOAWAY — with no HTTP/2 or HPACK. All four RPC
//!   kinds, many concurrent calls per connection, `grpc-timeout` honoured
//!   over the whole call (`DeadlineExceeded`, gRPC's rule: [Deadlines](#deadlines)),
//!   cancellation on drop of the call, messages larger than a ring message
//!   split into chunks.
//! * **HTTP/2 path** ([`PathPreference::Http2`]): a byte stream over the
//!   rings under hyper/h2, so everything tonic does works unchanged.
//!
//! ## What a unary call costs on the fast path
//!
//! No task hop in the common case (RR-Compound §IV-B: wake-ups, not bytes,
//! dominate small RPCs):
//!
//! 1. The caller's task encodes the request (tonic), and because a unary
//!    body is ready at once it writes REQUEST_HEADERS + DATA(END_STREAM) as
//!    one ring message itself: one short step under the ring's own lock
//!    (reserve, fill, commit, publish; the connection's `Link`), no writer
//!    task, no boxed future.
//! 2. The caller then waits on its call's slot and, as no other call is
//!    receiving, drives the connection's receive itself (leader/follower: it
//!    dispatches frames for other calls to their slots and wakes them; a
//!    fallback reader task takes over only when the receiving call leaves
//!    while others still wait).
//! 3. The server's connection task decodes the message and polls the
//!    service's future inline (with no server-wide layer, the service the
//!    path names, found by name: tonic's axum router, which the floor
//!    does not pay, cost ~0.5 µs a call; with a layer, the layered
//!    router, as tonic calls it); a handler that completes at its first poll
//!    (unary handlers usually do) has its response written into the ring
//!    right there, so RESPONSE_HEADERS + DATA + TRAILERS is one message.
//!    Handlers that do not complete at once are spawned as tasks.
//! 4. The caller's receive sees the reply (spinning, per the poller's mode)
//!    and returns it to tonic.
//!
//! So a call costs two ring messages and, when both sides' spins cover the
//! wait, no sleep, eventfd or thread wake-up at all (`examples/src/demo.rs`
//! prints the poller's spin hits and sleeps per call).
//!
//! ## Choosing a path
//!
//! Use the fast path (the default) unless you need one of the features
//! below; the HTTP/2 path costs hyper/h2's framing, HPACK and several task
//! hops per call (several times the fast path's latency; `docs/measured.md`).
//!
//! Both paths have per-call flow control: on the fast path each call has
//! its own window in each direction ([`RrpcConfig::call_window`], 256 KiB
//! by default, WINDOW_UPDATE frames as in HTTP/2), so a call whose receiver
//! stops reading stalls only itself. Unlike HTTP/2 there is no
//! connection-wide window for a few unread calls to use up (with hyper's
//! default 1 MiB connection window, a stalled stream can block every call
//! on an HTTP/2 connection; `tests/integration/tests/suite/flow_control.rs`).
//!
//! ## tonic options on rrpc
//!
//! | tonic option | fast path | HTTP/2 path (and TCP) |
//! |---|---|---|
//! | `Server::timeout` | [`Server::timeout`]: the shorter of it and `grpc-timeout` bounds the whole call, `DeadlineExceeded` ([Deadlines](#deadlines)) | passed to tonic: it bounds the handler, `Cancelled` "Timeout expired" (an rrpc client on rings reads `DeadlineExceeded`) |
//! | `concurrency_limit_per_connection` | [`Server::concurrency_limit_per_connection`]: tower's limit per connection, as tonic | passed to tonic |
//! | `load_shed` | [`Server::load_shed`]: `ResourceExhausted`, as tonic | passed to tonic |
//! | `max_concurrent_streams` | [`Server::max_concurrent_streams`] caps [`RrpcConfig::max_concurrent_calls`] (default 200): excess refused with `Unavailable` | passed to tonic |
//! | `http2_keepalive_interval` / `_timeout` | not needed: a dead peer is seen on the side channel | passed to tonic |
//! | `initial_stream_window_size` | [`RrpcConfig::call_window`] | passed to tonic |
//! | `initial_connection_window_size` | none (the ring bounds a connection) | passed to tonic |
//! | `tcp_nodelay`, `tcp_keepalive` | n/a (no TCP data path) | TCP leg of `serve_dual` / `http://` |
//! | `max_connection_age` | [`Server::max_connection_age`]: GOAWAY at the age, calls in flight finish; `RrpcChannel` reconnects | passed to tonic |
//! | max header list size (hyper: 16 KiB) | [`RrpcConfig::max_header_list_size`]: HTTP 431 → `Unknown`, as over TCP | hyper's default |
//! | `max_{de,en}coding_message_size` | tonic's codec, unchanged | tonic's codec, unchanged |
//!
//! Client side: [`RrpcEndpoint`] mirrors `tonic::transport::Endpoint`
//! (its docs have the table): `connect_lazy`, reconnect after a failure or
//! a server restart, `timeout`, `connect_timeout`, `user_agent`, `origin`,
//! `concurrency_limit`, `rate_limit`, and [`RrpcChannel::balance_list`].
//! HTTP/2 keep-alive and window options go to hyper on the HTTP/2 path and
//! are not needed on the fast path (the side channel reports a peer that
//! leaves; [`RrpcConfig::call_window`] is the per-call window).
//! `tests/integration/tests/suite/endpoint.rs` runs each on every transport.
//!
//! On the fast path requests carry tonic's `user-agent` and responses a
//! `date`, as over HTTP/2. Known difference: a request over the client's own
//! `max_encoding_message_size` fails with tonic's `OutOfRange`, where over
//! HTTP/2 hyper turns the failed body into a reset that tonic reports as
//! `Internal` (deliberate, pinned in `tests/integration/tests/suite/message_sizes.rs`).
//!
//! ## Deadlines
//!
//! A call's deadline is the shorter of its `grpc-timeout` and the
//! endpoint's [`timeout`](RrpcEndpoint::timeout) (on the server, of
//! `grpc-timeout` and [`Server::timeout`]). On every rrpc path it follows
//! gRPC's rule: the deadline covers the whole call (the wait for a place,
//! the request stream, the response headers and the response stream), and
//! an expired call fails with `DeadlineExceeded` ("Deadline Exceeded"), as
//! grpc-go and grpc-core report it.
//!
//! * Fast path: the client's connection core keeps every call's deadline
//!   (one timer per connection, `poll_timeout` / `handle_timeout`): an
//!   expired call fails in whatever step it is, its response body
//!   included, and is reset on the server (CANCEL); the server ends
//!   the call at its deadline too, handler or response body, answers
//!   `DEADLINE_EXCEEDED` and frees its place.
//! * HTTP/2 path over rings: the rrpc client bounds the response body by
//!   the deadline (dropping it resets the stream on the server), and
//!   reads tonic's `Cancelled` "Timeout expired" (its channel's, or its
//!   server's in a trailers-only response) as `DeadlineExceeded`. The
//!   server there is tonic's: it bounds the handler only, and a stream
//!   whose client went away is reset by that client.
//! * `http://`, `unix://`, and `rrpc://` landing on TCP: tonic's own
//!   `Channel`, untouched. A deliberate difference: tonic reports an
//!   expired call as `Cancelled` "Timeout expired", and its deadline
//!   bounds only the response headers, so a server stream (or a
//!   bidirectional one) whose headers came stays open past its deadline.
//!
//! `tests/integration/tests/suite/deadlines.rs` pins both: each call kind
//! on every transport, tonic over TCP included.
//!
//! Features that need the HTTP/2 path (choose `PathPreference::Http2`):
//! HTTP/1 and gRPC-Web, and tonic's `ConnectInfo` extensions. Interceptors,
//! compression, metadata, deadlines, tower layers passed to
//! [`Server::layer`] and client-side tower layers work on both paths.
//!
//! # TLS (feature `tls`)
//!
//! `Server::tls_config` and `RrpcEndpoint::tls_config` take the
//! `tls` module's twins of tonic's TLS types (`ServerTlsConfig`,
//! `ClientTlsConfig`, `Identity`, `Certificate`, with tonic's method names:
//! change the import line; tonic keeps its key private, so rrpc could not
//! run TLS itself from tonic's own types). One identity serves tonic's TLS
//! on `http://` and `unix://`, `serve_dual`'s TCP leg, the `rrpc://` port
//! (a ClientHello is a third kind of first byte; rrpc's negotiation runs
//! inside TLS; a TLS port refuses plaintext) and the verbs side channel.
//! Ring connections negotiated on a TLS port are bound to its session by a
//! one-time ticket exported from it, so `Request::peer_certs()` works on
//! their requests, on both paths. Not built yet: encryption of ring
//! messages (#57); `docs/security.md` says what each setting protects.
//!
//! # Connection resources (KRCore)
//!
//! * **Pool** ([`RrpcConfig::connection_pool`]): queue pairs and ring
//!   regions made ahead of time; on by default for `rdma://`.
//! * **Shared queue pairs** ([`RrpcConfig::shared_queue_pairs`], off by
//!   default, both ends): every connection from one client to one server
//!   runs over one queue pair, so queue pairs are bounded by peers, not
//!   connections. The client caches that shared connection under a lease
//!   ([`RrpcConfig::peer_lease`]), by the address it dialed (an `rrpc://`
//!   port, not the side listener it names), and drops it when its peer is
//!   seen down;
//!   [`RrpcContext::shared_connections`] reports them.
//! * **Spare connections** ([`RrpcConfig::spare_connections`], off by
//!   default, client only): connections dialed ahead to a server the client
//!   already connected to, registered with the poller, so that the next
//!   connect takes one (after a look at its side channel) instead of a
//!   round trip through the server; [`RrpcContext::spare_stats`] counts
//!   them. Faster than tonic's own connect over a Unix socket (docs/measured.md,
//!   "Where a connect's time goes"), at the price of idle connections the
//!   server holds.
//! * **Rings that size themselves** ([`RrpcConfig::min_ring_size`]).
//!
//! # Copies per direction (RR-Compound §IV-F)
//!
//! Counting memcpys of message bytes after tonic encoded the message and
//! before tonic's decoder sees it; "ring" is the sender's registered send
//! buffer, from which the fabric WRITE (a DMA on RDMA, a memcpy on `shm`)
//! moves the bytes into the peer's ring:
//!
//! | path | sender | receiver | total |
//! |---|---|---|---|
//! | fast, zero-copy on (default) | 1 (encode buffer → ring slot, frame written in place) | 1 (ring slot → body chunk) | 2 |
//! | fast, zero-copy off | 2 (encode buffer → frame buffer → ring slot) | 1 | 3 |
//! | HTTP/2 | 1 (hyper write buffer → ring slot) | 2 (ring slot → chunk → hyper read buffer) | 3 |
//!
//! The fabric WRITE adds one more on `shm` (none on RDMA hardware); tonic's
//! decoder adds its own copy into its buffer on every path. [`RrpcConfig::zero_copy`]
//! switches the fast path between the first two rows, to reproduce Fig. 14.
//!
//! # Connection management (which poller, and why)
//!
//! Every `shm://`/`rdma://` connection registers both directions with an
//! [`rrpc_poller::Poller`]. By default the process shares one built from
//! [`default_poller_config`]: BPEV with one polling thread and a fixed
//! 50 µs spin, chosen by measuring every mode on a 2-core host (the
//! reasoning and numbers are in its docs). [`RrpcConfig::poller`] gives a
//! config's [`RrpcContext`] its own poller (any [`PollerMode`], thread count,
//! `bp_timeout`); [`RrpcContext::poller_handle`] exposes its counters.
//!
//! Thread budget: each side's tokio worker(s), plus one polling thread per
//! poller (parked while every task's spin catches its data). On a 2-core
//! machine run the server and the client on separate single-threaded
//! runtimes pinned to different cores (as the demo and the rpc bench do):
//! unpinned, the kernel may stack both spinning threads on one core, and a
//! woken thread then waits for its peer's whole spin (the demo's docs have
//! the numbers).
//!
//! [`RrpcConfig::receive_spin`] gives [`PollerMode::Event`] a spin before
//! each wait (spin, then sleep on the writer's `WRITE_WITH_IMM`, with no
//! polling thread at all); it is the poller's own spin, with a fixed budget.
//!
//! **Low, steady load: the doorbell fallback and the spin back-off.** A
//! polling thread whose sleeping connections all have a doorbell dozes after
//! 100 µs without data (rrpc-poller's `doorbell_park_after`), and announces
//! each sleeping reader to its writer through the ring's sleep word; the
//! writer then rings once (a `WRITE_WITH_IMM` of its tail) and the reader
//! wakes through its completion channel in the tokio reactor. Spinning backs
//! off when it stops paying (rrpc-poller's `spin_backoff`): a reader whose
//! spins rarely catch data (a server waiting a millisecond for its next
//! request) stops spinning, and a polling thread whose spin episodes wake
//! nobody, or that loses its core, backs off for 4–128 ms, leaving its
//! readers to their doorbells (on shm they announce their own sleeps
//! meanwhile; on verbs the thread, kicked, announces for them).
//!
//! What this costs and saves at low load, with idle connections and under
//! CPU contention, measured against tonic over TCP and a Unix socket, is in
//! `docs/measured.md` ("Low load, idle connections, contention"): numbers
//! go stale, so the crate docs hold none.
//!
//! Where the doorbell does not reach, the old cost stands: a connection
//! waiting for ring *space* (head pushes carry no doorbell) keeps its
//! thread polling for up to 2 ms, and [`PollerConfig::paper`] modes spin as
//! the paper does.
//!
//! # Modules
//!
//! * [`frame`]: the fast-path wire format (sans-IO).
//! * [`RrpcConfig`], [`PathPreference`]: knobs and their defaults (settings
//!   only); [`RrpcContext`]: the runtime state (poller, verbs device, pools,
//!   shared connections) servers and channels own or share;
//!   [`PollerConfig`], [`PollerMode`], [`Poller`] re-exported from rrpc-poller.
//! * [`Server`], [`Router`], [`RrpcIncoming`]: serving.
//! * [`RrpcEndpoint`], [`RrpcChannel`], [`ChannelPath`], [`Carrier`]: connecting.
//! * [`Error`]: one error type, mapped to [`tonic::Status`].
#![forbid(unsafe_code)]

// The modules, bottom up. The exact layer order, module by module, is
// `TONIC` in xtask/src/layers.rs (`cargo xtask layers` checks it;
// docs/architecture.md, "Inside each crate", says it in words): there
// `conn::seal` sits with the leaves, `fast::proto` below `conn`, and
// `conn::rings` above `context`; otherwise a module imports only those
// of its own paragraph and of the paragraphs before it.

// Plain data and codecs: what every call path shares (the deadline
// status, the response future, `Carrier`); the error type and its one
// mapping to a gRPC status; the fast path's frames (sans-IO, fuzzed).
mod call;
mod error;
pub mod frame;
// `RrpcConfig` and its groups: settings only.
mod config;
// The connection, from a sealed ring message up to the rings: its send side
// (`conn::Link`), the message pipe both paths use, ring encryption, the path
// negotiation, KRCore's pools, shared queue pairs and spares, the rings.
mod conn;
// `RrpcContext`: the runtime state servers and channels share.
mod context;
// TLS as tonic users have it (feature `tls`).
pub mod tls;
// `rrpc://`: one TCP port, the best fabric both ends share.
pub mod port;
// URIs: which transport each scheme dials and listens on.
mod transport;
// The h2-free fast path: its sans-IO core, frame writer, client and server.
mod fast;
// The HTTP/2 path: hyper/h2 over a pipe, both sides.
mod h2stream;
// The client side: `RrpcEndpoint`, `RrpcChannel` and its connection.
mod client;
// The server side: `Server`, `Router`, and the fast path's dispatch.
mod server;
// Entry points for `cargo fuzz`.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;

pub use call::{Carrier, ChannelPath, ResponseFuture};
pub use client::{RrpcChannel, RrpcEndpoint};
pub use config::{
    DEFAULT_MAX_SHARED_PEERS, DEFAULT_PEER_LEASE, DEFAULT_RDMA_CONNECTION_POOL, Fabric,
    MAX_SPARE_CONNECTIONS, PathPreference, RingEncryption, RrpcConfig, RrpcConfigBuilder,
    default_poller_config,
};
pub use conn::sharing::SharedConnectionStats;
pub use conn::spare::SpareStats;
pub use context::RrpcContext;
pub use error::{Error, fabric_code};
pub use h2stream::{RrpcConnectInfo, RrpcStream};
pub use rrpc_poller::{Handoff, Mode as PollerMode, Poller, PollerConfig, PollerConfigBuilder};
pub use server::{Router, RrpcIncoming, Server};
