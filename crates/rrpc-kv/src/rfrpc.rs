//! RF-RPC, the remote-fetching RPC of Jakiro (the RF-RPC paper, §3-§4), over
//! rrpc-core.
//!
//! # The protocol
//!
//! A client connects to one server thread (one RC queue pair). The server
//! grants one region per connection, `[request buffer | response buffer]`;
//! the client grants a *reply buffer*. One call (paper Table 2,
//! `client_send` / `server_recv` / `server_send` / `client_recv`):
//!
//! 1. The client WRITEs the request frame ([`wire`]) into the server's
//!    request buffer: first the payload and tail word (unsignaled), then the
//!    8-byte status word (signaled), which carries the valid bit, the
//!    *mode*, the length and the call's sequence number.
//! 2. A server thread polls the status words of its connections' request
//!    buffers. A new sequence number whose tail word matches is a complete
//!    request: the thread copies it out and runs the handler.
//! 3. *Remote fetch* (the default): the server stores the response frame
//!    (status word, info word with its processing time, payload, tail) in
//!    its **own** response buffer, status and tail last. The client READs
//!    `fetch_size` (F) bytes of it until the status word carries its
//!    sequence number and the tail matches; a result larger than F takes a
//!    second READ of the rest (§3.2).
//! 4. *Server reply*: the server WRITEs the same frame into the client's
//!    reply buffer (body first, status word last) and the client polls its
//!    local memory.
//!
//! The hybrid switch ([`mode`]) runs in the client: after two consecutive
//! calls whose READs exhausted `retry_limit` (R) retries, the next requests
//! carry the server-reply mode; when the server's recorded processing time
//! is short again (at most R × the measured READ round trip, for two calls)
//! the client returns to remote fetching. Each rule's switch is vetoed when
//! the target mode was measured no faster, and a short probe of the other
//! mode every 512 calls keeps that measurement fresh (ours; see [`mode`]).
//! The server only obeys the mode bit of each request.
//!
//! F and R come from [`RfClientConfig`] (paper defaults 256 bytes and 5) or
//! from Eq. 2 ([`tune::choose_fetch_and_retry`]): measure I_{R,F} once with
//! [`RfClient::measure_rates`], then [`RfClient::auto_fetch`] re-runs Eq. 2
//! every 1024 results over the client's last 256 result sizes
//! ([`tune::FetchTuner`]) and applies each new choice; or apply one by hand
//! with [`RfClient::set_fetch_params`].
//!
//! # Buffer layout
//!
//! ```text
//! server region (granted, role 1):  [ request buffer: request_cap | response buffer: response_cap ]
//! client reply buffer (role 2):     [ response frame (server-reply mode) ]
//! client local region (not granted): [ request staging: request_cap | fetch landing: response_cap ]
//! ```
//!
//! The buffer sizes travel in the server's handshake section
//! (`"RFR1" | request_cap u32 | response_cap u32 | mode policy u8`).
//!
//! # Choices the paper leaves open
//!
//! * **Completion detection.** The paper polls a status bit and relies on
//!   RDMA writing "in a sequential order" (§4.1). We write the status word
//!   in a separate, later WRITE on the same queue pair and repeat it in a
//!   tail word after the payload; a frame is accepted only when both carry
//!   the expected sequence number. On shm this is exact (each WRITE is a
//!   copy published with release ordering, an aligned 8-byte WRITE is one
//!   atomic store); on verbs it relies on WRITEs of one RC queue pair being
//!   placed in order, as the paper and FaRM-style systems do. The cost is a
//!   second (inlinable, 8-byte) WRITE per request.
//! * **Sequence numbers** (32 bits, never 0) instead of clearing buffers:
//!   a stale response, or a late one after a [`Error::Timeout`], is never
//!   taken for the current call; the server serves any new sequence number,
//!   so a client may go on after a timeout.
//! * **A request written over one the server has not taken** (ours; the
//!   paper's client never gives up on a call). After a timeout, or a call
//!   that failed before its result came back, the server may not have
//!   copied that request yet, or may be copying it, when the next one is
//!   written into the same buffer. A seqlock keeps the two apart. The
//!   server copies a request out, then re-reads its status and tail words
//!   and discards the copy if either changed. That alone misses a body
//!   overwrite that touches neither (a shorter request leaves the old tail
//!   in place, and the server may look between the body WRITE and the
//!   status WRITE), so the client, when its previous call ended without a
//!   result, first zeroes the status word in a WRITE of its own, before the
//!   body, on the same queue pair: the server then finds no request, or
//!   sees the status word change across its copy (this relies on the WRITEs
//!   of one queue pair becoming visible in order, as completion detection
//!   above does). So a request made of two
//!   is never served (`tests/suite/rfrpc_torn.rs` cuts each WRITE of such a
//!   sequence in half with rrpc-core's fault injection); the timed-out
//!   request itself may or may not have run. The extra 8-byte WRITE is
//!   paid only after a call that ended without a result.
//! * **Switching mid-call.** The paper's client flips the server's flag
//!   with an extra WRITE while a call is pending; ours changes the mode
//!   only between calls (the mode bit of the next request), so no result
//!   can be delivered twice or lost in a race. A call that exhausted its
//!   retries keeps fetching with a yielding back-off until it completes or
//!   times out.
//! * **"Short" processing time** for switching back: `P <= R × rtt`; and a
//!   measured veto with periodic probes of the other mode, because the
//!   server's pick-up delay, which `P` does not show, can exhaust the
//!   retries whichever mode is faster (documented in [`mode`]).
//! * **Time field**: 32 bits of nanoseconds (saturating) instead of the
//!   paper's two bytes, in the response's info word.
//! * **Results over the buffer**: the response carries a "too large" flag
//!   and the real length; the client returns [`Error::TooLarge`].
//! * **Garbage in a request buffer.** A status word whose length does not
//!   fit the buffer closes the connection (the client broke the protocol);
//!   a status word without a matching tail is ignored (it may be a WRITE in
//!   flight). The server never panics on peer-written bytes.
//! * **Liveness.** Pollers check the side channel about every millisecond,
//!   so a vanished peer gives a peer-gone error ([`Error::is_peer_gone`]), never a hang.
//! * **Accept and connection limits.** The accept thread only takes clients
//!   off the listening socket; each handshake runs on a thread of its own,
//!   at most [`RfServerBuilder::max_pending_handshakes`] at once (one more
//!   client is closed at once), so a client that connects and says nothing
//!   holds up no other. The server holds at most
//!   [`RfServerBuilder::max_connections`] connections, and
//!   [`RfServerBuilder::max_connections_per_peer`] per peer (a process on
//!   `shm://`, by `SO_PEERCRED`; a host on `rdma://`), handshakes in
//!   progress included; past a limit the client's handshake is rejected
//!   with the limit named. Refusals are logged and counted
//!   ([`server::REFUSED_METRIC`], [`RfServer::refused`]).
//! * **Handler**: any `Fn(&[u8]) -> Vec<u8>` ([`server::Handler`]), or any
//!   [`crate::Execute`] through [`RfServerBuilder::serve_execute`]; the
//!   client side of the latter is [`KvClient`].
//! * **Inline / unsignaled** (§3.2 "Optimization"): the request body WRITE
//!   is unsignaled and retired by the signaled status-word WRITE after it;
//!   inlining is the provider's choice (rrpc-core inlines up to the queue
//!   pair's `max_inline`, 64 bytes by default).
//!
//! Batching: [`RfClient::call_batch`] sends a §4.1 request batch in one
//! call (batch bit 61 of the status word) and fetches one result batch.
//! [`batcher::Batcher`] (and [`batcher::KvBatcher`] for [`crate::Op`]s)
//! drives it: requests are queued and sent when N are queued, when the
//! next one would take the batch over L bytes, or T after the first one,
//! on an injectable [`batcher::Clock`]; N is fixed or chosen by the Eq. 3
//! tuner ([`tune::BatchSizeTuner`]) from each batch's measured latency.
//! Results come back in push order. The decisions are the sans-IO
//! [`batcher::BatchControl`] over [`batch::BatchBuilder`] and
//! [`batch::FlushPolicy`]. A request over L goes as a single call; a
//! result batch over the response buffer is resent one entry per call
//! (at-least-once, see [`batcher`]). The §4.1 pipeline keeps several
//! batches outstanding: [`batcher::Batcher::with_clients`] holds one buffer
//! pair (one [`RfClient`] connection) per batch in flight, under a
//! threshold of outstanding requests ([`batcher::BatcherConfig::max_outstanding`]);
//! [`RfClient::submit_batch`] / [`RfClient::complete_batch`] are the split
//! call it is built on.
//!
//! [`Error::Timeout`]: crate::Error::Timeout
//! [`Error::TooLarge`]: crate::Error::TooLarge
//! [`Error::is_peer_gone`]: crate::Error::is_peer_gone

mod admit;
pub mod batch;
pub mod batcher;
pub mod client;
pub mod mode;
pub mod server;
pub mod tune;
pub mod wire;

pub use batcher::{
    BatchControl, BatchResult, Batcher, BatcherConfig, BatcherConfigBuilder, BatcherStats, Clock,
    FlushReason, KvBatcher, MonotonicClock, Sizing, Ticket, VirtualClock,
};
pub use client::{ClientStats, KvClient, RfClient, RfClientConfig, RfClientConfigBuilder};
pub use mode::{Mode, ModePolicy, ModeSwitch, ModeSwitchBuilder};
pub use server::{RfServer, RfServerBuilder};

/// The fabric an endpoint needs: shared memory for `shm://`, the verbs
/// provider for `rdma://` (on `rdma_device`, or the first device).
///
/// # Errors
/// [`crate::Error::Fabric`] if the verbs device cannot be opened;
/// [`crate::Error::InvalidConfig`] for `rdma://` when this crate was built
/// without its `verbs` feature.
pub fn fabric_for(
    endpoint: &rrpc_core::FabricAddr,
    rdma_device: Option<&str>,
) -> crate::Result<rrpc_core::Fabric> {
    match endpoint {
        rrpc_core::FabricAddr::Shm(_) => Ok(rrpc_core::Fabric::shm()),
        #[cfg(feature = "verbs")]
        rrpc_core::FabricAddr::Rdma(_) => Ok(rrpc_core::Fabric::verbs(rdma_device)?),
        #[cfg(not(feature = "verbs"))]
        rrpc_core::FabricAddr::Rdma(_) => {
            let _ = rdma_device;
            Err(crate::Error::InvalidConfig(
                "rdma:// needs the verbs provider: build rrpc-kv with feature `verbs`".into(),
            ))
        }
        other => Err(crate::Error::InvalidConfig(format!(
            "no RF-RPC fabric for endpoint {other:?}"
        ))),
    }
}
