//! The bytes of peer memory a [`super::Listener`]'s connections have mapped:
//! one global budget, a budget per peer, and who gives way when the global
//! one nears its end.
//!
//! A peer is whoever its socket says it is ([`PeerKey`]): on a Unix socket
//! the process (`SO_PEERCRED`'s uid and pid), on TCP the source address. Three
//! rules, checked together under one lock when a handshake reserves its
//! grants:
//!
//! 1. **Per peer.** One peer's connections together map at most
//!    [`HandshakeConfig::max_peer_grant_bytes`](super::HandshakeConfig::max_peer_grant_bytes)
//!    (default [`DEFAULT_MAX_PEER_GRANT_BYTES`], 16 GiB: a quarter of the
//!    global budget), so the first comer cannot take it all.
//! 2. **Global.** All peers together map at most
//!    [`HandshakeConfig::max_total_grant_bytes`](super::HandshakeConfig::max_total_grant_bytes)
//!    (default 64 GiB).
//! 3. **Near the end, the biggest holder gives way.** Once a reservation
//!    would take the global total into its last eighth
//!    ([`NEAR_END_DIVISOR`]), the peer that already holds the most (ties
//!    included) is refused, not the newcomer: peers that hold less, a new
//!    one above all, are still admitted up to the global limit. Several
//!    processes of one hostile user are several peers; what bounds them
//!    together is the global budget and this rule, and the socket's
//!    permissions decide who may connect at all (README, "Security model").
//!
//! Sparse grants are counted at their mapped size: mapping is what costs
//! address space, whatever the peer has written.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Default of [`super::HandshakeConfig::max_peer_grant_bytes`]: 16 GiB, a
/// quarter of [`super::DEFAULT_MAX_TOTAL_GRANT_BYTES`] — 15 connections with
/// the largest rings, or thousands with the default 4 MiB ring.
pub const DEFAULT_MAX_PEER_GRANT_BYTES: u64 = 16 << 30;

/// "Near its end": the last `1 / NEAR_END_DIVISOR` of the global budget, where
/// the peer holding the most is refused before anyone else (rule 3 above).
pub const NEAR_END_DIVISOR: u64 = 8;

/// Who a peer is, as far as its socket tells us: the key of its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A process on this host (`shm://`: the Unix socket's `SO_PEERCRED`).
    Process {
        /// Its user id.
        uid: u32,
        /// Its process id.
        pid: i32,
    },
    /// A remote host (`rdma://`: the side channel's source address).
    Host(IpAddr),
    /// The socket did not say (`SO_PEERCRED` failed): all such peers share
    /// one budget.
    Unknown,
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Process { uid, pid } => write!(f, "pid={pid} uid={uid}"),
            PeerKey::Host(ip) => write!(f, "{ip}"),
            PeerKey::Unknown => f.write_str("an unidentified peer"),
        }
    }
}

/// Bytes of peer memory mapped for one listener's connections.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    per_peer: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    used: u64,
    by_peer: HashMap<PeerKey, u64>,
}

impl Budget {
    pub(crate) fn new(limit: u64, per_peer: u64) -> Budget {
        Budget {
            limit,
            per_peer,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is two counters updated together; a panic cannot leave
        // them half-written, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes reserved now, by all peers.
    pub(crate) fn used(&self) -> u64 {
        self.state().used
    }

    /// Bytes reserved now by `peer`.
    pub(crate) fn used_by(&self, peer: &PeerKey) -> u64 {
        self.state().by_peer.get(peer).copied().unwrap_or(0)
    }

    /// Reserves `bytes` for `peer`, under the three rules of the module docs.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] naming the rule that refused.
    pub(crate) fn reserve(self: &Arc<Self>, peer: PeerKey, bytes: u64) -> Result<BudgetGuard> {
        let mut st = self.state();
        let held = st.by_peer.get(&peer).copied().unwrap_or(0);
        let mine = held.saturating_add(bytes);
        if mine > self.per_peer {
            return Err(Error::LimitExceeded {
                what: "bytes of peer memory mapped for one peer (process or host) by this listener",
                requested: mine,
                limit: self.per_peer,
            });
        }
        let total = st.used.saturating_add(bytes);
        if total > self.limit {
            return Err(Error::LimitExceeded {
                what: "bytes of peer memory mapped by this listener",
                requested: total,
                limit: self.limit,
            });
        }
        let near_end = self.limit - self.limit / NEAR_END_DIVISOR;
        if total > near_end && held > 0 {
            let most_of_others = st
                .by_peer
                .iter()
                .filter(|(k, _)| **k != peer)
                .map(|(_, &b)| b)
                .max()
                .unwrap_or(0);
            if held >= most_of_others {
                return Err(Error::LimitExceeded {
                    what: "bytes of peer memory mapped by this listener, which is near its \
                           limit; the peer holding the most is refused first",
                    requested: total,
                    limit: self.limit,
                });
            }
        }
        st.used = total;
        st.by_peer.insert(peer, mine);
        Ok(BudgetGuard {
            budget: self.clone(),
            peer,
            bytes,
        })
    }

    fn release(&self, peer: &PeerKey, bytes: u64) {
        let mut st = self.state();
        st.used = st.used.saturating_sub(bytes);
        if let Some(b) = st.by_peer.get_mut(peer) {
            *b = b.saturating_sub(bytes);
            if *b == 0 {
                st.by_peer.remove(peer);
            }
        }
    }
}

/// A reservation against a listener's [`Budget`], returned on drop. Held
/// next to the peer mappings it pays for.
#[derive(Debug)]
pub(crate) struct BudgetGuard {
    budget: Arc<Budget>,
    peer: PeerKey,
    bytes: u64,
}

impl Drop for BudgetGuard {
    fn drop(&mut self) {
        self.budget.release(&self.peer, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(pid: i32) -> PeerKey {
        PeerKey::Process { uid: 1000, pid }
    }

    fn refused(r: Result<BudgetGuard>) -> String {
        match r {
            Err(Error::LimitExceeded { what, .. }) => what.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn one_peer_is_held_to_its_share_and_others_still_fit() {
        let b = Arc::new(Budget::new(64, 16));
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(b.reserve(pid(1), 4).expect("within its share"));
        }
        assert!(refused(b.reserve(pid(1), 1)).contains("one peer"));
        assert_eq!(b.used_by(&pid(1)), 16);
        // Another process still gets in.
        let other = b.reserve(pid(2), 4).expect("another peer");
        assert_eq!(b.used(), 20);
        drop(other);
        drop(held.pop());
        assert_eq!((b.used(), b.used_by(&pid(1))), (12, 12));
        assert_eq!(b.used_by(&pid(2)), 0);
        held.push(b.reserve(pid(1), 4).expect("room again"));
    }

    #[test]
    fn near_the_end_the_biggest_holder_is_refused_and_a_newcomer_admitted() {
        // 64 in all, 16 a peer, the last 8 "near the end".
        let b = Arc::new(Budget::new(64, 16));
        let mut held = Vec::new();
        for p in 1..=3 {
            held.push(b.reserve(pid(p), 16).expect("a full share"));
        }
        held.push(b.reserve(pid(4), 8).expect("up to 56 is not near the end"));
        assert_eq!(b.used(), 56);
        // pid 4 holds 8, less than the 16 others hold: it may go on...
        held.push(b.reserve(pid(4), 2).expect("not the biggest holder"));
        // ...and pid 1, the (tied) biggest holder, may not; nor could it anyway.
        assert!(refused(b.reserve(pid(1), 1)).contains("one peer"));
        // A newcomer is admitted up to the global limit.
        held.push(b.reserve(pid(5), 6).expect("a newcomer"));
        assert_eq!(b.used(), 64);
        assert!(refused(b.reserve(pid(6), 1)).contains("by this listener"));
    }

    #[test]
    fn near_the_end_a_tie_refuses_both() {
        let b = Arc::new(Budget::new(80, 40));
        let _a = b.reserve(pid(1), 35).unwrap();
        let _c = b.reserve(pid(2), 35).unwrap();
        // 70 + 1 is past 70 (80 - 80/8): both hold the most.
        assert!(refused(b.reserve(pid(1), 1)).contains("near its limit"));
        assert!(refused(b.reserve(pid(2), 1)).contains("near its limit"));
        let _n = b.reserve(pid(3), 10).expect("a newcomer fits");
    }

    #[test]
    fn keys_are_told_apart() {
        let b = Arc::new(Budget::new(100, 10));
        let _u = b.reserve(PeerKey::Process { uid: 1, pid: 7 }, 10).unwrap();
        let _v = b.reserve(PeerKey::Process { uid: 2, pid: 7 }, 10).unwrap();
        let _h = b.reserve(PeerKey::Host([10, 0, 0, 1].into()), 10).unwrap();
        let _x = b.reserve(PeerKey::Unknown, 10).unwrap();
        assert_eq!(b.used(), 40);
        assert!(b.reserve(PeerKey::Unknown, 1).is_err());
        assert_eq!(
            PeerKey::Process { uid: 1, pid: 7 }.to_string(),
            "pid=7 uid=1"
        );
    }
}
