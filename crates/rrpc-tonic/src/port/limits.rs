//! A server's limits on established connections
//! ([`RrpcConfig::max_connections`], [`RrpcConfig::max_connections_per_peer`]),
//! on every fabric it serves: the rings of `shm://`, `rdma://` and
//! `inproc://`, and an `rrpc://` port's TCP connections beside its rings.
//!
//! Sans-IO: [`Limits::admit`] takes a place for a peer or says which limit
//! refused ([`Refusal`]); the place ([`Slot`]) is given back when dropped,
//! so a connection that holds its slot for as long as it lives releases it
//! however it ends. The accept loops (`server`, this module's parent for the
//! port's TCP leg) take a slot when they take a client off the socket,
//! before its handshake: a refused client is answered with the refusal
//! (an rrpc-core `Reject`, a refused negotiation, or `ResourceExhausted` on
//! its HTTP/2 calls), never left waiting.
//!
//! Kept beside the port because the port's TCP leg is the lowest module
//! that admits connections; `server` shares one [`Limits`] among all the
//! listeners of a server.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::RrpcConfig;

/// How every refusal's reason starts, on every fabric: an rrpc client that
/// reads it in a `Reject` or a refused negotiation reports
/// [`crate::Error::ConnectionLimit`].
pub(crate) use crate::error::CONNECTION_LIMIT_PREFIX as REFUSAL_PREFIX;

/// The `metrics` counter of refusals, by `reason` (`per_peer`, `total`).
pub(crate) const REFUSED_COUNTER: &str = "rrpc_tonic_connections_refused_total";

/// Who a peer is, for [`RrpcConfig::max_connections_per_peer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PeerId {
    /// As its socket says ([`rrpc_core::conn::PeerKey`]): a process on
    /// `shm://` (`SO_PEERCRED`), a host on `rdma://` and TCP.
    Socket(rrpc_core::conn::PeerKey),
    /// `inproc://`: this process.
    InProcess,
}

impl PeerId {
    /// The peer of a TCP connection: its source address.
    pub(crate) fn host(ip: std::net::IpAddr) -> PeerId {
        PeerId::Socket(rrpc_core::conn::PeerKey::Host(ip))
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerId::Socket(k) => k.fmt(f),
            PeerId::InProcess => f.write_str("this process (inproc)"),
        }
    }
}

/// Which limit refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer holds [`RrpcConfig::max_connections_per_peer`] connections.
    PerPeer {
        /// Who.
        peer: PeerId,
        /// The limit.
        limit: usize,
    },
    /// The server holds [`RrpcConfig::max_connections`] connections.
    Total {
        /// The limit.
        limit: usize,
    },
}

impl Refusal {
    /// The counter's `reason` label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Refusal::PerPeer { .. } => "per_peer",
            Refusal::Total { .. } => "total",
        }
    }

    /// The reason the refused client reads: [`REFUSAL_PREFIX`], then the
    /// limit by its setting's name. Printable ASCII without `%` when the
    /// peer's name is (a `grpc-message` as it is).
    pub(crate) fn message(&self) -> String {
        match self {
            Refusal::PerPeer { peer, limit } => format!(
                "{REFUSAL_PREFIX}the server holds {limit} connections of this peer ({peer}), \
                 its max_connections_per_peer"
            ),
            Refusal::Total { limit } => {
                format!("{REFUSAL_PREFIX}the server holds {limit} connections, its max_connections")
            }
        }
    }
}

/// The connections a server holds, in total and by peer.
pub(crate) struct Limits {
    total: usize,
    per_peer: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: usize,
    by_peer: HashMap<PeerId, usize>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state();
        f.debug_struct("Limits")
            .field("total", &self.total)
            .field("per_peer", &self.per_peer)
            .field("held", &st.held)
            .field("peers", &st.by_peer.len())
            .finish()
    }
}

impl Limits {
    /// The limits of `cfg`, nothing held.
    pub(crate) fn new(cfg: &RrpcConfig) -> Arc<Limits> {
        Arc::new(Limits {
            total: cfg.max_connections(),
            per_peer: cfg.max_connections_per_peer(),
            state: Mutex::default(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Counters updated together under the lock; a panic cannot leave
        // them half-written, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections held now, by all peers.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.state().held
    }

    /// A place for one more connection of `peer`, or the limit that
    /// refuses it (the peer's first: a flooding peer is named as such),
    /// counted in [`REFUSED_COUNTER`] and logged.
    pub(crate) fn admit(self: &Arc<Self>, peer: PeerId) -> Result<Slot, Refusal> {
        let mut st = self.state();
        let mine = st.by_peer.get(&peer).copied().unwrap_or(0);
        let refusal = if mine >= self.per_peer {
            Some(Refusal::PerPeer {
                peer,
                limit: self.per_peer,
            })
        } else if st.held >= self.total {
            Some(Refusal::Total { limit: self.total })
        } else {
            None
        };
        if let Some(r) = refusal {
            drop(st);
            metrics::counter!(REFUSED_COUNTER, "reason" => r.label()).increment(1);
            tracing::warn!(%peer, reason = r.label(), "rrpc: connection refused: {}", r.message());
            return Err(r);
        }
        st.held += 1;
        *st.by_peer.entry(peer).or_default() += 1;
        Ok(Slot {
            limits: self.clone(),
            peer,
        })
    }

    fn release(&self, peer: &PeerId) {
        let mut st = self.state();
        st.held = st.held.saturating_sub(1);
        if let Some(n) = st.by_peer.get_mut(peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.by_peer.remove(peer);
            }
        }
    }
}

/// One connection's place under [`Limits`]: given back when dropped.
pub(crate) struct Slot {
    limits: Arc<Limits>,
    peer: PeerId,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").field("peer", &self.peer).finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limits.release(&self.peer);
    }
}

/// A stream tonic serves that holds its connection's [`Slot`] for as long
/// as tonic holds the stream (until the connection closes).
#[derive(Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    _slot: Slot,
}

impl<S> Counted<S> {
    pub(crate) fn new(inner: S, slot: Slot) -> Self {
        Counted { inner, _slot: slot }
    }

    /// The stream.
    #[cfg(test)]
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
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

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Counted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use rrpc_core::conn::PeerKey;

    fn limits(total: usize, per_peer: usize) -> Arc<Limits> {
        let cfg = RrpcConfig::builder()
            .max_connections(total)
            .max_connections_per_peer(per_peer)
            .build()
            .unwrap();
        Limits::new(&cfg)
    }

    fn process(pid: i32) -> PeerId {
        PeerId::Socket(PeerKey::Process { uid: 1, pid })
    }

    /// Refusals by reason, as the counter has them.
    fn refused(recorder: &DebuggingRecorder) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == REFUSED_COUNTER)
            .map(|(k, _, _, v)| {
                let reason = k
                    .key()
                    .labels()
                    .find(|l| l.key() == "reason")
                    .map(|l| l.value().to_string())
                    .unwrap_or_default();
                let DebugValue::Counter(n) = v else {
                    panic!("a counter")
                };
                (reason, n)
            })
            .collect();
        v.sort();
        v
    }

    /// One peer is refused past its limit while another still gets in, up
    /// to the total; every refusal is counted by its reason; a slot dropped
    /// gives its place back, to its peer and to the total.
    #[test]
    fn per_peer_then_total_refused_counted_and_released() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            let l = limits(3, 2);
            let (a, b, c) = (process(1), process(2), PeerId::InProcess);
            let a1 = l.admit(a).unwrap();
            let _a2 = l.admit(a).unwrap();
            assert_eq!(
                l.admit(a).unwrap_err(),
                Refusal::PerPeer { peer: a, limit: 2 }
            );
            let _b1 = l.admit(b).unwrap();
            assert_eq!(l.admit(c).unwrap_err(), Refusal::Total { limit: 3 });
            assert_eq!(l.held(), 3);
            drop(a1);
            assert_eq!(l.held(), 2);
            let _c1 = l.admit(c).expect("a place given back is taken");
            // Under its own limit again, the peer meets the full total.
            assert!(matches!(l.admit(a), Err(Refusal::Total { .. })));
            assert_eq!(
                refused(&recorder),
                vec![("per_peer".into(), 1), ("total".into(), 2)]
            );
        });
    }

    #[test]
    fn a_peer_with_nothing_held_is_forgotten() {
        let l = limits(4, 4);
        let s = l.admit(process(7)).unwrap();
        drop(s);
        assert_eq!(l.held(), 0);
        assert!(l.state().by_peer.is_empty());
    }

    #[test]
    fn the_reason_names_the_limit_and_is_a_plain_grpc_message() {
        for r in [
            Refusal::PerPeer {
                peer: process(5),
                limit: 4,
            },
            Refusal::Total { limit: 8 },
        ] {
            let m = r.message();
            assert!(m.starts_with(REFUSAL_PREFIX), "{m}");
            assert!(m.contains("max_connections"), "{m}");
            assert!(
                m.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'%'),
                "{m}"
            );
        }
    }
}
