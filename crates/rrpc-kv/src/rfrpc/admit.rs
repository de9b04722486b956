//! Admission of RF-RPC connections (sans-IO): how many handshakes may run
//! at once, and how many connections the server holds, in total and per
//! peer.
//!
//! Every connection costs the server a region of `request_buffer +
//! response_buffer` bytes and a place in a server thread's polling loop,
//! so a server bounds them: [`Limits::admit`] reserves a [`ConnSlot`] when a
//! client is taken off the listening socket (before its handshake, so that
//! handshakes in progress count too), and the slot is given back when it is
//! dropped, with the connection. A peer is whoever its socket says it is
//! ([`PeerKey`]): on `shm://` the process (`SO_PEERCRED`'s pid and uid), on
//! `rdma://` the side channel's source address.
//!
//! The handshakes in progress are bounded apart ([`Handshakes`]): a client
//! that connects and sends nothing holds a handshake thread until the
//! handshake timeout; past the bound a new client is closed at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rrpc_core::conn::PeerKey;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The server holds `limit` connections already.
    Total {
        /// `max_connections`.
        limit: usize,
    },
    /// This peer holds `limit` connections already.
    PerPeer {
        /// Who.
        peer: PeerKey,
        /// `max_connections_per_peer`.
        limit: usize,
    },
}

impl Refusal {
    /// The `reason` label of the refusal metric.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refusal::Total { .. } => "max_connections",
            Refusal::PerPeer { .. } => "max_connections_per_peer",
        }
    }
}

impl fmt::Display for Refusal {
    /// What the refused client reads in its `Rejected` error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Total { limit } => write!(
                f,
                "rf-rpc: server connection limit reached \
                 (max_connections {limit}); try again later"
            ),
            Refusal::PerPeer { peer, limit } => write!(
                f,
                "rf-rpc: connection limit per peer reached: {peer} holds \
                 {limit} connections (max_connections_per_peer {limit})"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    by_peer: HashMap<PeerKey, usize>,
}

/// The connection limits of one server and the connections held now.
#[derive(Debug)]
pub(crate) struct Limits {
    total: usize,
    per_peer: usize,
    state: Mutex<State>,
}

impl Limits {
    pub(crate) fn new(total: usize, per_peer: usize) -> Arc<Limits> {
        Arc::new(Limits {
            total,
            per_peer,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Two counters updated together under the lock, never across a
        // panic point: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves a connection for `peer`.
    ///
    /// # Errors
    /// The [`Refusal`] naming the limit it would pass (the per-peer limit
    /// first: it names the one to blame).
    pub(crate) fn admit(self: &Arc<Self>, peer: PeerKey) -> Result<ConnSlot, Refusal> {
        let mut st = self.state();
        let held = st.by_peer.get(&peer).copied().unwrap_or(0);
        if held >= self.per_peer {
            return Err(Refusal::PerPeer {
                peer,
                limit: self.per_peer,
            });
        }
        if st.total >= self.total {
            return Err(Refusal::Total { limit: self.total });
        }
        st.total += 1;
        *st.by_peer.entry(peer).or_insert(0) += 1;
        Ok(ConnSlot {
            limits: self.clone(),
            peer,
        })
    }

    /// Connections held now (in a handshake or established), in total and
    /// by `peer`.
    #[cfg(test)]
    fn held(&self, peer: &PeerKey) -> (usize, usize) {
        let st = self.state();
        (st.total, st.by_peer.get(peer).copied().unwrap_or(0))
    }
}

/// One admitted connection; given back when dropped.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    limits: Arc<Limits>,
    peer: PeerKey,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut st = self.limits.state();
        st.total = st.total.saturating_sub(1);
        if let Some(n) = st.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                st.by_peer.remove(&self.peer);
            }
        }
    }
}

/// The handshakes in progress, at most `limit`.
#[derive(Debug)]
pub(crate) struct Handshakes {
    limit: usize,
    running: AtomicUsize,
}

impl Handshakes {
    pub(crate) fn new(limit: usize) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            limit,
            running: AtomicUsize::new(0),
        })
    }

    /// The bound.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A place for one more handshake, or `None` when `limit` run already.
    pub(crate) fn start(self: &Arc<Self>) -> Option<HandshakeSlot> {
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| HandshakeSlot { of: self.clone() })
    }

    /// Handshakes running now.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

/// One handshake in progress; given back when dropped.
#[derive(Debug)]
pub(crate) struct HandshakeSlot {
    of: Arc<Handshakes>,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.of.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: i32) -> PeerKey {
        PeerKey::Process { uid: 1000, pid }
    }

    #[test]
    fn a_peer_is_refused_past_its_limit_and_others_still_admitted() {
        let l = Limits::new(5, 2);
        let a1 = l.admit(proc(1)).unwrap();
        let _a2 = l.admit(proc(1)).unwrap();
        let r = l.admit(proc(1)).unwrap_err();
        assert_eq!(
            r,
            Refusal::PerPeer {
                peer: proc(1),
                limit: 2
            }
        );
        assert!(r.to_string().contains("pid=1 uid=1000 holds 2"), "{r}");
        assert!(r.to_string().contains("max_connections_per_peer 2"), "{r}");
        let _b = l.admit(proc(2)).unwrap();
        assert_eq!(l.held(&proc(1)), (3, 2));
        // A slot given back is a slot again.
        drop(a1);
        assert_eq!(l.held(&proc(1)), (2, 1));
        let _a3 = l.admit(proc(1)).unwrap();
    }

    #[test]
    fn the_total_is_bounded_whoever_asks() {
        let l = Limits::new(3, 2);
        let held: Vec<_> = [1, 1, 2]
            .into_iter()
            .map(|p| l.admit(proc(p)).unwrap())
            .collect();
        let r = l.admit(proc(3)).unwrap_err();
        assert_eq!(r, Refusal::Total { limit: 3 });
        assert!(r.to_string().contains("max_connections 3"), "{r}");
        assert_eq!(r.reason(), "max_connections");
        drop(held);
        assert_eq!(l.held(&proc(1)), (0, 0));
        assert!(l.state().by_peer.is_empty(), "no peer left behind");
    }

    #[test]
    fn handshakes_are_bounded_and_given_back() {
        let h = Handshakes::new(2);
        let a = h.start().unwrap();
        let _b = h.start().unwrap();
        assert!(h.start().is_none());
        assert_eq!(h.running(), 2);
        drop(a);
        assert!(h.start().is_some());
        assert_eq!(h.running(), 1);
    }
}
