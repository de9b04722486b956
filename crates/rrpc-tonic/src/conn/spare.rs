//! Spare connections ([`RrpcConfig::spare_connections`]): dedicated
//! connections a client dialed ahead to a server it already connected to,
//! taken by the next connect to that server instead of dialing.
//!
//! Where a connect's time goes on `shm://` (docs/measured.md, "Where a
//! connect's time goes"): not in making regions or queue pairs (the bundle
//! pool already does that ahead, and measured no faster) but in the round
//! trip through the server and the four thread hand-offs around it
//! (client worker to a blocking thread, the server's worker to its blocking
//! thread, and back). A spare has done all of that before anyone asks for
//! it (the poller registration included), so a connect that finds one costs
//! a look at its side channel.
//!
//! This module is the sans-IO store: which spares wait for which server and
//! config, since when, whether a refill runs. `rings` dials them, checks
//! them ([`Connection::check_alive`](rrpc_core::conn::Connection::check_alive):
//! a server that restarted or died closed their side channels) and turns
//! one into a pipe.
//!
//! Spares are kept per server, config and tokio runtime (`rings` names
//! the runtime in the server's key): a spare is registered with the
//! reactor of the runtime that made it, and a context outlives runtimes, so
//! only a connect on that runtime (alive, then) takes it.
//!
//! **Spare lanes.** With shared queue pairs on `shm://` a spare is a lane
//! over the shared connection (rrpc-core `conn::lanes`): one message on its
//! side channel, rings in arena slots. `rings` opens every one missing at
//! once on a task of the runtime and starts a new open whenever one is
//! taken ([`Spares::shortfall`] counts those in flight), so a refill costs
//! about one round trip and back-to-back connects run at the rate the
//! server answers opens (docs/measured.md, "Spare lanes").
//!
//! **Expiry.** A spare nobody takes is dropped when its lease ends by a
//! sweeper task ([`Spares::expire`], one per context at a time, ending
//! when none is left), not only when the next connect looks: a spare
//! holds its connection at both ends, and a spare lane keeps its shared
//! connection in use.
//!
//! Bounds: at most `spare_connections` wait per (server, config), one
//! refill runs per (server, config) at a time, and a spare older than
//! [`RrpcConfig::peer_lease`] is dropped unused (the server may have
//! restarted behind a side channel that still looks open). A spare is an
//! ordinary connection at the server, which bounds it as any other
//! (`max_pending_handshakes`, its own limits); the client's bound is the
//! server's guarantee that one client holds at most that many idle ones.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use std::sync::Arc;

use rrpc_core::conn::Connection;

use crate::RrpcConfig;
use crate::conn::Pipe;
use crate::conn::negotiate::Negotiated;

/// A spare: a connection dialed, handshaken and registered with the
/// poller, its path agreed, and the connection itself (for the liveness
/// check before it is taken).
pub(crate) type Spare = (Pipe, Negotiated, Arc<Connection>);

/// The spares of one server and config.
struct Entry<T> {
    /// The server (its ring endpoint, as dialed).
    server: String,
    /// The config the spares were dialed with: only a connect with an equal
    /// one may take them (token, rings, path preference are per channel).
    cfg: RrpcConfig,
    /// Ready spares, oldest first, with when each was made.
    ready: VecDeque<(Instant, T)>,
    /// A refill is running.
    filling: bool,
}

impl<T> Entry<T> {
    fn wants(&self) -> bool {
        self.ready.len() < self.cfg.spare_connections()
    }
}

/// The spare connections of a context, by server and config.
pub(crate) struct Spares<T> {
    entries: Mutex<Vec<Entry<T>>>,
    /// A sweeper runs ([`Self::begin_sweep`]); cleared under `entries`'
    /// lock when it ends.
    sweeping: AtomicBool,
    /// Woken when a spare is pushed or a refill ends ([`Self::landed`]).
    landed: tokio::sync::Notify,
    /// Counters since the context started (the ready count is the entries').
    counts: Mutex<SpareStats>,
}

impl<T> Default for Spares<T> {
    fn default() -> Self {
        Spares {
            entries: Mutex::default(),
            sweeping: AtomicBool::new(false),
            landed: tokio::sync::Notify::new(),
            counts: Mutex::default(),
        }
    }
}

/// A context's spare connections ([`RrpcConfig::spare_connections`]), as
/// [`RrpcContext::spare_stats`](crate::RrpcContext::spare_stats) reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpareStats {
    /// Spares waiting now, over every server and config: each is a
    /// connection its server holds too.
    pub ready: usize,
    /// Spares dialed (and kept) since the context started.
    pub made: u64,
    /// Connects that took a spare instead of dialing.
    pub taken: u64,
    /// Spares dropped unused: found dead (their server closed them) or
    /// past [`RrpcConfig::peer_lease`], or made past the bound.
    pub dropped: u64,
}

/// What [`Spares::take`] found.
pub(crate) struct Taken<T> {
    /// A spare that passed the check, if any.
    pub(crate) spare: Option<T>,
    /// Spares found dead or past their lease: the caller drops them
    /// (outside the store's lock: closing a connection is a system call).
    pub(crate) dropped: Vec<T>,
}

/// Takes out every spare past its config's `peer_lease` at `now`.
fn expired<T>(entries: &mut [Entry<T>], now: Instant) -> Vec<T> {
    let mut gone = Vec::new();
    for e in entries.iter_mut() {
        // Oldest first: the expired ones are at the front.
        while e
            .ready
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= e.cfg.peer_lease())
        {
            gone.extend(e.ready.pop_front().map(|(_, t)| t));
        }
    }
    gone
}

impl<T> Spares<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry<T>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut SpareStats)) {
        f(&mut self.counts.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Takes the oldest spare for `server` and `cfg` that is younger than
    /// the config's `peer_lease` at `now` and that `alive` accepts; every
    /// one looked at and refused is returned to be dropped, and so is every
    /// spare of any server past its lease (so that spares nobody asks for
    /// any more, such as those of a runtime that ended, do not stay).
    pub(crate) fn take(
        &self,
        server: &str,
        cfg: &RrpcConfig,
        now: Instant,
        mut alive: impl FnMut(&T) -> bool,
    ) -> Taken<T> {
        let mut taken = Taken {
            spare: None,
            dropped: Vec::new(),
        };
        let mut entries = self.lock();
        taken.dropped = expired(&mut entries, now);
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.server == server && e.cfg == *cfg)
        {
            while let Some((_, t)) = e.ready.pop_front() {
                if alive(&t) {
                    taken.spare = Some(t);
                    break;
                }
                taken.dropped.push(t);
            }
        }
        entries.retain(|e| e.filling || !e.ready.is_empty());
        drop(entries);
        let (got, dropped) = (u64::from(taken.spare.is_some()), taken.dropped.len() as u64);
        self.count(|c| {
            c.taken += got;
            c.dropped += dropped;
        });
        taken
    }

    /// Starts a refill for `server` and `cfg` if none runs and fewer than
    /// `spare_connections` wait: `true` when the caller is to run it
    /// ([`Self::next`] before each dial, [`Self::push`] after).
    pub(crate) fn begin_fill(&self, server: &str, cfg: &RrpcConfig) -> bool {
        if cfg.spare_connections() == 0 {
            return false;
        }
        let mut entries = self.lock();
        let i = match entries
            .iter()
            .position(|e| e.server == server && e.cfg == *cfg)
        {
            Some(i) => i,
            None => {
                entries.push(Entry {
                    server: server.to_owned(),
                    cfg: cfg.clone(),
                    ready: VecDeque::new(),
                    filling: false,
                });
                entries.len() - 1
            }
        };
        let e = &mut entries[i];
        if e.filling || !e.wants() {
            return false;
        }
        e.filling = true;
        true
    }

    /// Whether the running refill is to dial one more; when not, the refill
    /// ends here (in the same lock: a take meanwhile starts a new one).
    pub(crate) fn next(&self, server: &str, cfg: &RrpcConfig) -> bool {
        self.shortfall(server, cfg, 0) > 0
    }

    /// How many more spares the running refill is to start, `in_flight`
    /// being started already and not pushed yet (a refill of lanes keeps
    /// several opens in flight). At 0 with none in flight the refill ends
    /// here, as with [`Self::next`].
    pub(crate) fn shortfall(&self, server: &str, cfg: &RrpcConfig, in_flight: usize) -> usize {
        let mut entries = self.lock();
        let Some(e) = entries
            .iter_mut()
            .find(|e| e.server == server && e.cfg == *cfg)
        else {
            return 0;
        };
        let n = e
            .cfg
            .spare_connections()
            .saturating_sub(e.ready.len() + in_flight);
        if n == 0 && in_flight == 0 {
            e.filling = false;
            drop(entries);
            self.landed.notify_waiters();
        }
        n
    }

    /// Whether a refill runs for `server` and `cfg`.
    pub(crate) fn filling(&self, server: &str, cfg: &RrpcConfig) -> bool {
        self.lock()
            .iter()
            .any(|e| e.filling && e.server == server && e.cfg == *cfg)
    }

    /// Resolves at the next spare pushed or refill ended, of any server:
    /// a connect that found none while a refill runs waits on it (create
    /// and `enable` it before looking, so that nothing is missed).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping it loses nothing.
    pub(crate) fn landed(&self) -> tokio::sync::futures::Notified<'_> {
        self.landed.notified()
    }

    /// Adds a spare the refill dialed at `now`. Past the bound (which
    /// [`Self::next`] makes rare) it is handed back, to be dropped.
    pub(crate) fn push(&self, server: &str, cfg: &RrpcConfig, now: Instant, t: T) -> Option<T> {
        let mut entries = self.lock();
        let back = match entries
            .iter_mut()
            .find(|e| e.server == server && e.cfg == *cfg)
        {
            Some(e) if e.wants() => {
                e.ready.push_back((now, t));
                None
            }
            _ => Some(t),
        };
        drop(entries);
        self.landed.notify_waiters();
        let kept = back.is_none();
        self.count(|c| {
            if kept {
                c.made += 1;
            } else {
                c.dropped += 1;
            }
        });
        back
    }

    /// Ends a refill that failed (the server is gone or refuses): the next
    /// connect starts another.
    pub(crate) fn stop_fill(&self, server: &str, cfg: &RrpcConfig) {
        let mut entries = self.lock();
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.server == server && e.cfg == *cfg)
        {
            e.filling = false;
        }
        entries.retain(|e| e.filling || !e.ready.is_empty());
        drop(entries);
        self.landed.notify_waiters();
    }

    /// Whether the caller is to start a sweeper ([`Self::expire`] every
    /// while until it says none is left): none runs now. Call after
    /// [`Self::push`].
    pub(crate) fn begin_sweep(&self) -> bool {
        !self.sweeping.swap(true, Ordering::AcqRel)
    }

    /// Ends a sweeper that stopped before [`Self::expire`] ended it (its
    /// runtime dropped it).
    pub(crate) fn end_sweep(&self) {
        let _entries = self.lock();
        self.sweeping.store(false, Ordering::Release);
    }

    /// Takes out every spare past its config's `peer_lease` at `now`, of
    /// any server, for the caller to drop: a spare nobody takes does not
    /// hold its connection (and, a lane, its shared connection) until the
    /// next connect looks. `true` when none is left: the sweeper ends
    /// (cleared in the same lock, so that a push after it starts another).
    pub(crate) fn expire(&self, now: Instant) -> (Vec<T>, bool) {
        let mut entries = self.lock();
        let gone = expired(&mut entries, now);
        entries.retain(|e| e.filling || !e.ready.is_empty());
        let none_left = entries.iter().all(|e| e.ready.is_empty());
        if none_left {
            self.sweeping.store(false, Ordering::Release);
        }
        drop(entries);
        let n = gone.len() as u64;
        self.count(|c| c.dropped += n);
        (gone, none_left)
    }

    /// How many spares wait, over every server and config.
    pub(crate) fn ready(&self) -> usize {
        self.lock().iter().map(|e| e.ready.len()).sum()
    }

    /// The counters, and how many wait now.
    pub(crate) fn stats(&self) -> SpareStats {
        let ready = self.ready();
        let mut s = *self.counts.lock().unwrap_or_else(|e| e.into_inner());
        s.ready = ready;
        s
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cfg(n: usize) -> RrpcConfig {
        RrpcConfig::builder()
            .spare_connections(n)
            .peer_lease(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    /// Fills `s` for `server` the way `rings` does, with `made` as dials.
    fn fill(s: &Spares<u32>, server: &str, c: &RrpcConfig, now: Instant, made: &mut u32) {
        if !s.begin_fill(server, c) {
            return;
        }
        while s.next(server, c) {
            *made += 1;
            assert!(s.push(server, c, now, *made).is_none());
        }
    }

    #[test]
    fn a_refill_stops_at_the_bound_and_one_runs_at_a_time() {
        let (s, c, t0) = (Spares::default(), cfg(3), Instant::now());
        assert!(s.begin_fill("a", &c));
        // A second connect while the first refill runs starts none.
        assert!(!s.begin_fill("a", &c));
        let mut made = 0;
        while s.next("a", &c) {
            made += 1;
            assert!(s.push("a", &c, t0, made).is_none());
        }
        assert_eq!((made, s.ready()), (3, 3));
        // Full: no refill, and a spare pushed past the bound is handed back.
        assert!(!s.begin_fill("a", &c));
        assert_eq!(s.push("a", &c, t0, 99), Some(99));
        assert_eq!(s.ready(), 3);
    }

    #[test]
    fn off_means_no_refill_and_nothing_kept() {
        let (s, t0) = (Spares::default(), Instant::now());
        assert!(!s.begin_fill("a", &cfg(0)));
        assert_eq!(s.push("a", &cfg(0), t0, 1), Some(1));
        assert_eq!(s.ready(), 0);
    }

    #[test]
    fn a_spare_is_for_its_server_and_an_equal_config_only() {
        let (s, c, t0) = (Spares::default(), cfg(1), Instant::now());
        let mut made = 0;
        fill(&s, "a", &c, t0, &mut made);
        let token = c.to_builder().token("t").build().unwrap();
        assert!(s.take("b", &c, t0, |_| true).spare.is_none());
        assert!(s.take("a", &token, t0, |_| true).spare.is_none());
        assert_eq!(s.take("a", &c.clone(), t0, |_| true).spare, Some(1));
        assert_eq!(s.ready(), 0);
    }

    #[test]
    fn a_sweep_drops_expired_spares_and_ends_when_none_is_left() {
        let s = Spares::default();
        let c = cfg(2);
        let t0 = Instant::now();
        let lease = c.peer_lease();
        assert!(s.begin_fill("a", &c));
        assert!(s.push("a", &c, t0, 1u32).is_none());
        assert!(s.push("a", &c, t0 + lease / 2, 2).is_none());
        assert!(s.begin_sweep());
        assert!(!s.begin_sweep(), "one sweeper at a time");
        // Nothing expired yet: kept, the sweeper goes on.
        assert_eq!(s.expire(t0 + lease / 4), (vec![], false));
        // The first expires; the second is kept.
        assert_eq!(s.expire(t0 + lease), (vec![1], false));
        assert_eq!(s.ready(), 1);
        // Then the second: none left, and the sweeper ends.
        assert_eq!(s.expire(t0 + lease * 2), (vec![2], true));
        assert_eq!(s.ready(), 0);
        assert_eq!(s.stats().dropped, 2);
        assert!(s.begin_sweep(), "a push after the end starts another");
    }

    #[test]
    fn dead_and_expired_spares_are_dropped_not_taken() {
        let (s, c, t0) = (Spares::default(), cfg(3), Instant::now());
        let mut made = 0;
        fill(&s, "a", &c, t0, &mut made);
        // 1 is dead (its server closed it): dropped, 2 taken, 3 waits.
        let got = s.take("a", &c, t0, |&t| t != 1);
        assert_eq!((got.spare, got.dropped), (Some(2), vec![1]));
        assert_eq!(s.ready(), 1);
        // Past the lease, even a live-looking one goes.
        let later = t0 + c.peer_lease();
        let got = s.take("a", &c, later, |_| true);
        assert_eq!((got.spare, got.dropped), (None, vec![3]));
        assert_eq!(s.ready(), 0);
        // The refill starts again after the take.
        fill(&s, "a", &c, later, &mut made);
        assert_eq!(s.ready(), 3);
        let st = s.stats();
        assert_eq!((st.ready, st.made, st.taken, st.dropped), (3, 6, 1, 2));
        // Nobody asks for "a" any more (its runtime ended): a take for
        // another server drops them once their lease is over.
        let got = s.take("b", &c, later + c.peer_lease(), |_| true);
        assert_eq!((got.spare, got.dropped), (None, vec![4, 5, 6]));
        assert_eq!(s.ready(), 0);
    }

    #[test]
    fn a_failed_refill_lets_the_next_connect_start_one() {
        let (s, c) = (Spares::<u32>::default(), cfg(2));
        assert!(s.begin_fill("a", &c));
        assert!(s.next("a", &c));
        s.stop_fill("a", &c);
        assert!(s.begin_fill("a", &c));
    }
}
