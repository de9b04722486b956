//! The path negotiation: which path (fast or HTTP/2) a new connection takes.
//!
//! The client offers a path and the server answers with the one chosen
//! (fast path only if both ends allow it). On `shm`/`rdma` the offer and
//! the answer ride in rrpc-core's handshake (a section under
//! [`HANDSHAKE_SECTION`](crate::frame::HANDSHAKE_SECTION),
//! in the hello and the accept), so a connect is one round trip; a refusal is the
//! handshake's `Reject`. On `inproc` they are the first message each way
//! over the pipe.
//!
//! ```text
//! hello (client) = "RRP2" path:u8 call_window:u32     (path: 0 fast, 1 HTTP/2)
//! reply (server) = "RRP2" path:u8 call_window:u32     (the path chosen)
//!                | "RRPX" reason                      (refused)
//! ```
//!
//! Each end's `call_window` is its fast-path receive window per call
//! ([`RrpcConfig::call_window`]): the other end's initial send credit.

use crate::conn::Pipe;
use crate::frame::HANDSHAKE_SECTION;
use crate::{Error, PathPreference, RrpcConfig};

/// Our section of a peer's hello or accept: empty when it sent none (the
/// readers then refuse it as a missing hello).
pub(crate) fn section_of(peer: &rrpc_core::conn::PeerInfo) -> &[u8] {
    peer.section(HANDSHAKE_SECTION).unwrap_or_default()
}

/// The path a connection ended up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Negotiated {
    /// The fast path; the peer's per-call receive window is our initial
    /// send credit per call.
    Fast {
        peer_window: u32,
    },
    Http2,
}

use crate::frame::{
    PATH_HELLO_LEN as HELLO_LEN, parse_path_hello as parse_hello, path_hello as hello_bytes,
};

fn pref_byte(p: PathPreference) -> u8 {
    match p {
        PathPreference::Fast => 0,
        PathPreference::Http2 => 1,
    }
}

/// Our path hello (client side): the path we prefer and our call window.
pub(crate) fn client_hello(cfg: &RrpcConfig) -> [u8; HELLO_LEN] {
    hello_bytes(pref_byte(cfg.path()), cfg.call_window())
}

/// Server side, sans-IO: the path for a client's hello (fast only if both
/// ends allow it) and the reply that says so.
///
/// # Errors
/// The reason a malformed hello is refused, for the client to read.
pub(crate) fn choose_path(
    hello: &[u8],
    cfg: &RrpcConfig,
) -> Result<(Negotiated, [u8; HELLO_LEN]), String> {
    let chosen = match parse_hello(hello)? {
        (0, peer_window) if cfg.path() == PathPreference::Fast => Negotiated::Fast { peer_window },
        _ => Negotiated::Http2,
    };
    let path = if matches!(chosen, Negotiated::Fast { .. }) {
        0
    } else {
        1
    };
    Ok((chosen, hello_bytes(path, cfg.call_window())))
}

/// Client side, sans-IO: the path the server's reply names.
///
/// # Errors
/// [`Error::Handshake`] for a refusal (`RRPX` and the server's reason) or a
/// malformed reply.
pub(crate) fn path_of_reply(reply: &[u8]) -> Result<Negotiated, Error> {
    if let Some(reason) = reply.strip_prefix(b"RRPX") {
        let reason = String::from_utf8_lossy(reason);
        // A server's connection limit (`port::limits`), on `inproc://`.
        if reason.starts_with(crate::error::CONNECTION_LIMIT_PREFIX) {
            return Err(Error::ConnectionLimit(reason.into_owned()));
        }
        return Err(Error::Handshake(format!(
            "server refused the path hello: {reason}"
        )));
    }
    match parse_hello(reply) {
        Ok((0, peer_window)) => Ok(Negotiated::Fast { peer_window }),
        Ok(_) => Ok(Negotiated::Http2),
        Err(e) => Err(Error::Handshake(format!("server's path reply: {e}"))),
    }
}

/// Client side of the path negotiation as the first message each way over
/// a pipe (`inproc://`; `shm://` and `rdma://` carry it in rrpc-core's
/// handshake instead, which saves a round trip).
pub(crate) async fn negotiate_client(
    pipe: &mut Pipe,
    cfg: &RrpcConfig,
) -> Result<Negotiated, Error> {
    let hello = client_hello(cfg);
    pipe.0
        .send_with(HELLO_LEN, &mut |s: &mut [u8]| s.copy_from_slice(&hello))
        .await?;
    let mut reply: Option<Vec<u8>> = None;
    if !pipe
        .1
        .recv_with(&mut |m: &[u8]| reply = Some(m.to_vec()))
        .await?
    {
        return Err(Error::Handshake(
            "server closed during path negotiation".into(),
        ));
    }
    path_of_reply(reply.as_deref().unwrap_or_default())
}

/// Server side of [`negotiate_client`].
pub(crate) async fn negotiate_server(
    pipe: &mut Pipe,
    cfg: &RrpcConfig,
) -> Result<Negotiated, Error> {
    let mut hello: Option<Vec<u8>> = None;
    if !pipe
        .1
        .recv_with(&mut |m: &[u8]| hello = Some(m.to_vec()))
        .await?
    {
        return Err(Error::Handshake(
            "client closed during path negotiation".into(),
        ));
    }
    match choose_path(hello.as_deref().unwrap_or_default(), cfg) {
        Ok((chosen, reply)) => {
            pipe.0
                .send_with(HELLO_LEN, &mut |s: &mut [u8]| s.copy_from_slice(&reply))
                .await?;
            Ok(chosen)
        }
        Err(e) => {
            let msg = format!("RRPX{e}");
            let _ = pipe
                .0
                .send_with(msg.len(), &mut |s: &mut [u8]| {
                    s.copy_from_slice(msg.as_bytes())
                })
                .await;
            Err(Error::Handshake(format!("client's path hello: {e}")))
        }
    }
}

/// What a client's setup gave the server.
pub(crate) enum Established {
    /// A connection to serve, on the path agreed.
    Pipe(Pipe, Negotiated),
    /// A shared connection the client opened: later connections run over
    /// it, nothing to serve on it (`sharing` docs).
    Shared,
}
