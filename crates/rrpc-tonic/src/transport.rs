//! URIs, listeners and dialers.
//!
//! | URI | transport |
//! |---|---|
//! | `http://host:port` | tonic over TCP (unchanged) |
//! | `unix:///path` | tonic over a Unix socket (unchanged; the `uds` baseline) |
//! | `inproc://name` | rrpc over an in-process pipe (tests, single-process apps); the server's side of a connection runs on the dialing client's runtime, polled in place by the client's sends |
//! | `shm:///path` | rrpc over shared-memory rings (rrpc-core `shm` provider) |
//! | `rdma://host:port` | rrpc over RDMA (rrpc-core `verbs` provider, feature `verbs`) |
//! | `rrpc://host:port` | one TCP port for every client: plain HTTP/2, or the best fabric both ends share (shm on one host, else verbs, else HTTP/2 on TCP; [`crate::port`]) |
//!
//! The path negotiation that follows a connect is [`crate::conn::negotiate`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;

use crate::conn::negotiate::{Established, Negotiated, negotiate_client, negotiate_server};
use crate::conn::{self, InPlace, Pipe};
use crate::error::rdma_unavailable;
use crate::{Error, RrpcConfig, RrpcContext};

/// A parsed transport address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Tcp(String),
    Unix(PathBuf),
    Inproc(String),
    Shm(PathBuf),
    Rdma(rrpc_core::FabricUri),
    /// `rrpc://host:port` ([`crate::port`]).
    Port(crate::port::PortTarget),
}

impl Target {
    pub(crate) fn parse(uri: &str) -> Result<Target, Error> {
        let bad = |reason: &str| Error::InvalidUri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad("missing scheme://"))?;
        if rest.is_empty() {
            return Err(bad("empty address"));
        }
        match scheme {
            "http" => Ok(Target::Tcp(rest.trim_end_matches('/').to_string())),
            "unix" => Ok(Target::Unix(PathBuf::from(rest))),
            "inproc" => Ok(Target::Inproc(rest.to_string())),
            "rrpc" => {
                let addr = rest.trim_end_matches('/');
                match addr.rsplit_once(':') {
                    Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                        Ok(Target::Port(crate::port::PortTarget::new(addr)))
                    }
                    _ => Err(bad("expected rrpc://host:port")),
                }
            }
            // rrpc-core's grammar, the one `rrpc_core::FabricAddr::parse` uses.
            "shm" | "rdma" => match rrpc_core::FabricUri::parse(uri)? {
                rrpc_core::FabricUri::Shm(path) => Ok(Target::Shm(path)),
                rdma => Ok(Target::Rdma(rdma)),
            },
            _ => Err(bad("unknown scheme (http, unix, inproc, shm, rdma, rrpc)")),
        }
    }

    pub(crate) fn tcp_addr(s: &str) -> Result<SocketAddr, Error> {
        s.parse().map_err(|_| Error::InvalidUri {
            uri: s.to_string(),
            reason: "expected ip:port".into(),
        })
    }
}

/// A source of raw (not yet negotiated) rrpc connections.
#[derive(Debug)]
pub(crate) enum RrpcListener {
    Inproc {
        name: String,
        rx: mpsc::Receiver<InprocDial>,
    },
    /// `shm://` or `rdma://`: rings on rrpc-core's fabric. Boxed: with the
    /// verbs provider the listener holds the device context and is far
    /// larger than the in-process variant.
    Rings(Box<crate::conn::rings::RingsListener>),
}

/// An in-process client as the listener receives it: its half of the pipe
/// and the runtime it dialed from, where the server's side of the
/// connection runs ([`Accepted::runtime`]).
pub(crate) struct InprocDial {
    pipe: Pipe,
    /// Where the server's side of the connection runs: polled in place by
    /// the client's sends, driven by a task on the client's runtime.
    host: Arc<InPlace>,
}

type Registry = Mutex<HashMap<String, mpsc::Sender<InprocDial>>>;

/// The in-process lookup table: listener name -> its accept queue.
fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl RrpcListener {
    pub(crate) fn bind(
        target: &Target,
        cfg: &RrpcConfig,
        ctx: &RrpcContext,
    ) -> Result<RrpcListener, Error> {
        match target {
            Target::Inproc(name) => {
                let (tx, rx) = mpsc::channel(64);
                let mut r = registry().lock().expect("registry lock");
                if r.get(name).is_some_and(|s| !s.is_closed()) {
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        format!("inproc://{name}"),
                    )));
                }
                r.insert(name.clone(), tx);
                Ok(RrpcListener::Inproc {
                    name: name.clone(),
                    rx,
                })
            }
            Target::Shm(path) => Ok(RrpcListener::Rings(Box::new(
                crate::conn::rings::RingsListener::bind(
                    rrpc_core::FabricAddr::Shm(path.clone()),
                    cfg,
                    ctx,
                )?,
            ))),
            Target::Rdma(uri) => Ok(RrpcListener::Rings(Box::new(
                crate::conn::rings::RingsListener::bind(rdma_endpoint(uri)?, cfg, ctx)?,
            ))),
            Target::Tcp(_) | Target::Unix(_) | Target::Port(_) => Err(Error::InvalidUri {
                uri: format!("{target:?}"),
                reason: "not an rrpc transport".into(),
            }),
        }
    }

    /// The side channel's socket address (`rdma://`), if it has one.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            RrpcListener::Inproc { .. } => None,
            RrpcListener::Rings(l) => l.local_addr(),
        }
    }

    /// Takes the next client off the listener; its setup is
    /// [`Accepted::establish`], run apart from the accept loop so that a
    /// slow client never delays the next one.
    ///
    /// # Cancel safety
    /// Cancel safe: a client is returned in the poll that takes it.
    pub(crate) async fn accept(&mut self) -> Option<Accepted> {
        match self {
            RrpcListener::Inproc { rx, .. } => {
                rx.recv().await.map(|d| Accepted::Ready(d.pipe, d.host))
            }
            RrpcListener::Rings(l) => l.accept().await.map(|p| Accepted::Rings(Box::new(p))),
        }
    }
}

/// A client taken off a listener, its transport handshake not yet run.
pub(crate) enum Accepted {
    /// In-process: already a pipe, and where the server's side runs (the
    /// runtime of the client that dialed it, and the client's sends).
    Ready(Pipe, Arc<InPlace>),
    /// `shm://` or `rdma://`: the rrpc-core handshake is still to come.
    Rings(Box<crate::conn::rings::RingsPending>),
}

impl Accepted {
    /// Who the client is, for logs.
    pub(crate) fn peer(&self) -> String {
        match self {
            Accepted::Ready(..) => "inproc".to_string(),
            Accepted::Rings(p) => p.peer_addr(),
        }
    }

    /// Who the client is, for the server's per-peer connection limit.
    pub(crate) fn peer_id(&self) -> crate::port::limits::PeerId {
        match self {
            Accepted::Ready(..) => crate::port::limits::PeerId::InProcess,
            Accepted::Rings(p) => crate::port::limits::PeerId::Socket(p.peer_key()),
        }
    }

    /// Where the server's side of this connection runs: `inproc://`
    /// connections in place ([`InPlace`]): driven by a task on the runtime
    /// of the client that dialed them and polled by the client's own
    /// sends, so a call and its handler take turns on the caller's thread
    /// (as a direct call to the service would) instead of waking another
    /// task, or another runtime's thread, for every message; `None`: a
    /// task of the server's runtime.
    pub(crate) fn in_place(&self) -> Option<Arc<InPlace>> {
        match self {
            Accepted::Ready(_, host) => Some(host.clone()),
            Accepted::Rings(_) => None,
        }
    }

    /// Refuses the client with `reason` where its connect reads it: the
    /// handshake's `Reject` on rings, the path negotiation's refusal
    /// in-process. Bounded by the handshake timeout on rings; in-process
    /// the client's hello is already on its way.
    pub(crate) async fn refuse(self, reason: String) -> Result<(), Error> {
        match self {
            Accepted::Ready(mut p, _) => {
                let _ = p.1.recv_with(&mut |_: &[u8]| {}).await?;
                let msg = format!("RRPX{reason}");
                p.0.send_with(msg.len(), &mut |s: &mut [u8]| {
                    s.copy_from_slice(msg.as_bytes())
                })
                .await
            }
            Accepted::Rings(p) => p.refuse(reason).await,
        }
    }

    /// Runs the transport's handshake and the path negotiation.
    pub(crate) async fn establish(self, cfg: &RrpcConfig) -> Result<Established, Error> {
        match self {
            Accepted::Ready(mut p, _) => {
                let path = negotiate_server(&mut p, cfg).await?;
                Ok(Established::Pipe(p, path))
            }
            Accepted::Rings(p) => p.establish().await,
        }
    }
}

impl Drop for RrpcListener {
    fn drop(&mut self) {
        match self {
            RrpcListener::Inproc { name, .. } => {
                let mut r = registry().lock().expect("registry lock");
                if r.get(name).is_some_and(|s| s.is_closed()) {
                    r.remove(name);
                }
            }
            RrpcListener::Rings(_) => {}
        }
    }
}

/// An `rdma://` URI, resolved (blocking: the system resolver).
fn rdma_endpoint(uri: &rrpc_core::FabricUri) -> Result<rrpc_core::FabricAddr, Error> {
    if cfg!(not(feature = "verbs")) {
        return Err(rdma_unavailable());
    }
    Ok(uri.resolve()?)
}

/// Dials an rrpc transport with `ctx`'s resources and negotiates the path.
pub(crate) async fn dial(
    target: &Target,
    cfg: &RrpcConfig,
    ctx: &RrpcContext,
) -> Result<(Pipe, Negotiated), Error> {
    match target {
        Target::Inproc(name) => {
            let tx = registry().lock().expect("registry lock").get(name).cloned();
            let tx = tx.ok_or_else(|| Error::NotListening(format!("inproc://{name}")))?;
            let (mut client, server, host) = conn::mem_pair_in_place(cfg.ring_size());
            let dialed = InprocDial { pipe: server, host };
            tx.send(dialed)
                .await
                .map_err(|_| Error::NotListening(format!("inproc://{name}")))?;
            let path = negotiate_client(&mut client, cfg).await?;
            Ok((client, path))
        }
        // No TLS on a bare ring address: no keys to seal with.
        Target::Shm(_) | Target::Rdma(_)
            if cfg.ring_encryption() == crate::RingEncryption::Required
                || (matches!(target, Target::Rdma(_))
                    && cfg.ring_encryption() != crate::RingEncryption::Off) =>
        {
            Err(crate::tls::needs_tls())
        }
        Target::Shm(path) => {
            crate::conn::rings::dial(rrpc_core::FabricAddr::Shm(path.clone()), None, cfg, ctx).await
        }
        Target::Rdma(uri) => {
            // Off the runtime's threads: a name lookup can block for seconds.
            let uri = uri.clone();
            let ep = tokio::task::spawn_blocking(move || rdma_endpoint(&uri))
                .await
                .map_err(|e| Error::Io(std::io::Error::other(e)))??;
            crate::conn::rings::dial(ep, None, cfg, ctx).await
        }
        // A ring channel on an `rrpc://` port: shm or verbs through the
        // side listener the port's negotiation names; its shared
        // connections are cached by the port (`sharing::PeerKey`).
        // Inside TLS, the ring connection's first message is the ticket of
        // the TLS session its negotiation ran in ([`crate::tls::Ticket`]).
        Target::Port(p) => {
            let (ep, ticket) = p.ring_endpoint(cfg).await?;
            let (mut pipe, path) = crate::conn::rings::dial(ep, Some(p.addr()), cfg, ctx).await?;
            match ticket {
                Some(t) => crate::tls::present_ticket(&mut pipe, &t, cfg).await?,
                None if crate::tls::seals(cfg, &pipe) => return Err(crate::tls::needs_tls()),
                None => {}
            }
            Ok((pipe, path))
        }
        Target::Tcp(_) | Target::Unix(_) => Err(Error::InvalidUri {
            uri: format!("{target:?}"),
            reason: "not an rrpc transport".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PathPreference;
    use crate::conn::negotiate::{choose_path, client_hello, path_of_reply};
    use crate::frame::path_hello as hello_bytes;

    #[test]
    fn parses_uris() {
        assert_eq!(
            Target::parse("http://127.0.0.1:5").unwrap(),
            Target::Tcp("127.0.0.1:5".into())
        );
        assert_eq!(
            Target::parse("shm:///run/g.sock").unwrap(),
            Target::Shm("/run/g.sock".into())
        );
        assert_eq!(
            Target::parse("rdma://0.0.0.0:50051").unwrap(),
            Target::Rdma(rrpc_core::FabricUri::parse("rdma://0.0.0.0:50051").unwrap())
        );
        // rrpc-core's grammar: the same URIs are refused by both parsers.
        for uri in ["shm://relative", "rdma://host", "rdma://::1:5", "shm://"] {
            assert!(Target::parse(uri).is_err(), "{uri}");
            assert!(rrpc_core::FabricAddr::parse(uri).is_err(), "{uri}");
        }
        assert_eq!(
            Target::parse("inproc://x").unwrap(),
            Target::Inproc("x".into())
        );
        assert!(Target::parse("shm://relative").is_err());
        assert!(Target::parse("ftp://x").is_err());
        assert!(matches!(
            Target::parse("rrpc://127.0.0.1:50051/").unwrap(),
            Target::Port(p) if p.addr() == "127.0.0.1:50051"
        ));
        assert!(Target::parse("rrpc://[::1]:5").is_ok());
        for uri in ["rrpc://host", "rrpc://:5", "rrpc://h:x", "rrpc://h:70000"] {
            assert!(Target::parse(uri).is_err(), "{uri}");
        }
        assert!(Target::parse("nothing").is_err());
    }

    #[tokio::test]
    async fn negotiation_picks_fast_only_if_both_allow() {
        let fast = Negotiated::Fast {
            peer_window: RrpcConfig::default().call_window(),
        };
        for (c, s, want) in [
            (PathPreference::Fast, PathPreference::Fast, fast),
            (
                PathPreference::Http2,
                PathPreference::Fast,
                Negotiated::Http2,
            ),
            (
                PathPreference::Fast,
                PathPreference::Http2,
                Negotiated::Http2,
            ),
        ] {
            let (mut a, mut b) = conn::mem_pair(4096);
            let (cc, sc) = (
                RrpcConfig::builder().path(c).build().unwrap(),
                RrpcConfig::builder().path(s).build().unwrap(),
            );
            let (x, y) = tokio::join!(negotiate_client(&mut a, &cc), negotiate_server(&mut b, &sc));
            assert_eq!(x.unwrap(), want);
            assert_eq!(y.unwrap(), want);
        }
    }

    /// Each end learns the other's call window; an old (RRP1) or malformed
    /// hello is refused with a reason the client sees.
    #[tokio::test]
    async fn negotiation_exchanges_call_windows_and_refuses_bad_hellos() {
        let (mut a, mut b) = conn::mem_pair(4096);
        let cc = RrpcConfig::builder().call_window(4096).build().unwrap();
        let sc = RrpcConfig::builder().call_window(1 << 20).build().unwrap();
        let (x, y) = tokio::join!(negotiate_client(&mut a, &cc), negotiate_server(&mut b, &sc));
        assert_eq!(
            x.unwrap(),
            Negotiated::Fast {
                peer_window: 1 << 20
            }
        );
        assert_eq!(y.unwrap(), Negotiated::Fast { peer_window: 4096 });
        for bad in [
            b"RRP1\0".to_vec(),
            hello_bytes(0, 10).to_vec(),
            hello_bytes(7, 4096).to_vec(),
            Vec::new(),
        ] {
            let (mut a, mut b) = conn::mem_pair(4096);
            let send = async {
                a.0.send_with(bad.len().max(1), &mut |s: &mut [u8]| {
                    s[..bad.len()].copy_from_slice(&bad)
                })
                .await
                .unwrap();
                let mut reply = Vec::new();
                a.1.recv_with(&mut |m: &[u8]| reply = m.to_vec())
                    .await
                    .unwrap();
                reply
            };
            let (reply, r) = tokio::join!(send, negotiate_server(&mut b, &sc));
            assert!(r.is_err(), "{bad:?} accepted");
            assert!(reply.starts_with(b"RRPX"), "{bad:?}: {reply:?}");
        }
    }

    /// The sans-IO halves the `shm`/`rdma` handshake carries: the server's
    /// reply names the path the client then takes; a refusal or a reply of
    /// another version is the client's `Handshake` error.
    #[test]
    fn path_replies_are_read_like_the_negotiation() {
        let (chosen, reply) = choose_path(
            &client_hello(&RrpcConfig::default()),
            &RrpcConfig::default(),
        )
        .unwrap();
        assert_eq!(path_of_reply(&reply).unwrap(), chosen);
        assert!(matches!(chosen, Negotiated::Fast { .. }));
        let (chosen, reply) = choose_path(
            &client_hello(&RrpcConfig::default()),
            &RrpcConfig::builder()
                .path(PathPreference::Http2)
                .build()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            (chosen, path_of_reply(&reply).unwrap()),
            (Negotiated::Http2, Negotiated::Http2)
        );
        for (bad, says) in [
            (
                &b"RRPXno thanks"[..],
                "server refused the path hello: no thanks",
            ),
            (&b"RRP1"[..], "server's path reply"),
            (&[][..], "server's path reply"),
        ] {
            let e = path_of_reply(bad).unwrap_err();
            assert!(matches!(&e, Error::Handshake(m) if m.contains(says)), "{e}");
        }
        assert!(choose_path(b"RRP1", &RrpcConfig::default()).is_err());
    }
}
