//! # rrpc-core — the fabric
//!
//! The words of ibverbs with Rust ownership and typed errors. Everything above
//! this crate (rings, pollers, tonic transport) is written against this API only.
//!
//! | item | verbs equivalent | |
//! |---|---|---|
//! | [`Fabric`] | `ibv_context` + `ibv_pd` | picks the provider (shm or verbs) |
//! | [`Region`], [`RemoteRegion`] | `ibv_mr`, `(addr, len, rkey)` | registered memory, and a peer's grant |
//! | [`QueuePair`] | `ibv_qp` (RC) | [`QueuePair::post_write`], [`QueuePair::post_write_imm`], [`QueuePair::post_read`], [`QueuePair::post_recv`] |
//! | [`CompletionQueue`], [`Completion`] | `ibv_cq`, `ibv_wc`, `ibv_comp_channel` | non-blocking `poll`, `req_notify` + a channel fd |
//! | [`conn`] | rdma_cm / out-of-band exchange | side channel, versioned handshake ([`handshake`]), liveness; hostile-peer checks and limits |
//! | [`pool`] | KRCore's pre-initialised pool | connect in one round trip |
//! | [`vqp`] | KRCore's virtualized QP (Algorithm 2) | many logical connections over one hardware queue pair |
//! | [`conn::SharedConnection`], [`conn::connect_logical`] | KRCore's `qconnect` over a cached QP | a connection per logical connection, with no queue pair of its own |
//! | [`meta`] | KRCore's DCCache / MRStore leases | what a reconnect to a known peer reuses, and when it must not |
//! | [`FaultConfig`] | — | delayed / failed completions, torn and corrupted writes for tests |
//! | `testing` (feature `test-util`) | — | the provider a test runs on, `on_every_provider!`, a throwaway TLS pair |
//!
//! ## Providers
//! * **shm** (always built, the default): same-host processes. Regions are
//!   memfd mappings passed with `SCM_RIGHTS`; a WRITE is a copy into the peer's
//!   mapping, published with release ordering. A real transport for co-located
//!   services and the vehicle for every test on machines without RDMA NICs.
//! * **verbs** (cargo feature `verbs`): libibverbs through `rdma-sys`, each call
//!   mapped one to one (`Fabric::verbs`, `Fabric::verbs_with` with a
//!   `VerbsOptions` naming device, port and GID index, `ibv_reg_mr`, RC queue
//!   pairs, `ibv_post_send`, `ibv_poll_cq`, completion channels). The
//!   handshake negotiates the path MTU; queue-pair sizes are checked against
//!   the device; the TCP side channel detects a dead remote host within 16 s
//!   by default ([`conn::TcpKeepalive`]). **Tested on soft-RoCE (rdma_rxe) in
//!   a VM (`cargo xtask rxe`); not run on an RDMA NIC.** Without the
//!   feature, `rdma://` addresses return [`Error::ProviderUnavailable`].
//!
//! ## Example: two queue pairs over a shm side channel
//! ```
//! use rrpc_core::{conn, FabricAddr, Fabric, Local, QpConfig, Completion};
//! # fn main() -> Result<(), rrpc_core::Error> {
//! let dir = std::env::temp_dir().join(format!("rrpc-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let ep = FabricAddr::parse(&format!("shm://{}/core.sock", dir.display()))?;
//! let fabric = Fabric::shm();
//! let listener = conn::Listener::bind(&ep, conn::HandshakeConfig::default())?;
//!
//! // Server: grant one 4 KiB region.
//! let f2 = fabric.clone();
//! let server = std::thread::spawn(move || -> Result<_, rrpc_core::Error> {
//!     let inbox = f2.alloc_region(4096)?;
//!     let incoming = listener.accept()?;
//!     let conn = incoming.accept(f2.create_qp(&QpConfig::default())?,
//!                                conn::Offer::new().grant(1, inbox.clone()))?;
//!     Ok((conn, inbox))
//! });
//!
//! // Client: WRITE into the server's region.
//! let src = fabric.alloc_region(4096)?;
//! src.write_at(0, b"hello")?;
//! let c = conn::connect(&ep, fabric.create_qp(&QpConfig::default())?,
//!                       conn::Offer::new(), &conn::HandshakeConfig::default())?;
//! let remote = c.peer().region(1).expect("granted");
//! c.qp().post_write(7, Local::new(&src, 0, 5), remote.at(0), true)?;
//! let mut wc = [Completion::EMPTY; 4];
//! assert_eq!(c.qp().send_cq().poll(&mut wc)?, 1);
//! assert_eq!(wc[0].wr_id, 7);
//!
//! let (_server_conn, inbox) = server.join().unwrap()?;
//! let mut got = [0u8; 5];
//! inbox.read_at(0, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok(()) }
//! ```

// The modules, bottom up. The module graph has no circle: the leaves
// import only other leaves; the providers build on the leaves (and on
// `conn::budget`, whose guards their mappings hold); the public queue
// types build on the providers' seam; connections build on those. The
// providers' side channels (`provider::shm::side`, `provider::verbs::side`)
// sit behind a seam of their own, `provider::side`, which `conn` uses;
// they use `qp` and `conn`'s leaves (`settings`, `exchange`, `budget`).

// Leaves: plain data, errors and the operating system. `work`, `settings`
// and `fail` hold the types shared by the queue pairs and every provider
// (re-exported from `cq`, `qp` and `fabric`).
pub mod addr;
/// The old name of [`addr`].
#[deprecated(note = "renamed to `rrpc_core::addr`")]
pub mod endpoint {
    #[allow(deprecated)]
    pub use crate::addr::{Endpoint, EndpointUri};
}
pub mod error;
mod fail;
pub mod fault;
pub mod handshake;
pub mod numa;
pub mod region;
mod settings;
mod sys;
mod work;

// The providers (shm, verbs, virtual) behind one seam: `provider::{Qp, Cq,
// Domain}`, whose `match`es are the only place that tells them apart.
mod provider;

// The fabric's public face, over the seam.
pub mod cq;
pub mod fabric;
pub mod qp;
pub mod vqp;

// Connections, and what is built on them.
pub mod conn;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
pub mod meta;
pub mod pool;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

#[allow(deprecated)]
pub use addr::{Endpoint, EndpointUri};
pub use addr::{FabricAddr, FabricUri};
pub use cq::{Completion, CompletionQueue, Opcode, Status};
pub use error::{Error, Fault, Result, Violation};
pub use fabric::{Fabric, ProviderKind};
#[cfg(feature = "verbs")]
pub use fabric::{VerbsOptions, VerbsOptionsBuilder};
pub use fault::{CORRUPT_MIN_LEN, FaultConfig, FaultConfigBuilder};
pub use handshake::{RegionDesc, Section};
pub use qp::{QpCarrier, QpConfig, QpConfigBuilder, QueuePair, RcRetry, RcRetryBuilder};
pub use region::{Access, CACHE_LINE, Local, Region, Remote, RemoteRegion};
/// The rustls this crate's side-channel TLS takes configs of
/// ([`conn::HandshakeConfigBuilder::tls_server`]).
#[cfg(feature = "verbs")]
pub use rustls;
pub use sys::EventFd;
