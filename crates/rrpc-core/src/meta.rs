//! A cache of what a connection to a peer established, with leases
//! (KRCore's DCCache and MRStore, §4.3, in spirit).
//!
//! KRCore caches a peer's DCT metadata, which only a dead host invalidates,
//! and remote memory regions under a lease, because an application may
//! deregister them at any time: a cached key is used only while its lease
//! runs, and the owner waits a lease before it frees the memory.
//!
//! rrpc caches one thing per peer: a [`SharedConnection`](crate::conn::SharedConnection),
//! its queue pair already connected, so that the next logical connection
//! to that peer skips the queue pair's creation and its `INIT → RTR → RTS`
//! ([`crate::conn::connect_logical`]). Ring region keys are never cached:
//! each logical connection grants fresh rings in its own handshake, so no
//! stale key can be used. An entry leaves the cache
//!
//! * when its **lease** runs out: `lease` after it was last used, unless it
//!   is still in use then (the caller says; a shared connection with
//!   logical connections on it is), and
//! * when the caller **sees the peer down** ([`PeerCache::invalidate`]: its
//!   side channel closed, or the peer no longer knows the entry).
//!
//! Sans-IO: every call takes the time, so the tests run on a virtual clock.
//! The cache holds at most `capacity` entries; inserting into a full cache
//! evicts the entry whose lease ends first.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A lease-based cache of per-peer values (module docs).
#[derive(Debug)]
pub struct PeerCache<K, V> {
    lease: Duration,
    capacity: usize,
    entries: HashMap<K, Entry<V>>,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    expires: Instant,
}

impl<K: Hash + Eq + Clone, V> PeerCache<K, V> {
    /// An empty cache whose entries live `lease` past their last use, at
    /// most `capacity` of them (at least one).
    pub fn new(lease: Duration, capacity: usize) -> Self {
        PeerCache {
            lease,
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Entries held, expired or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for `key` if its lease still runs at `now`, which renews
    /// it. An entry whose lease ended is removed and returned in `Err`, for
    /// the caller to close (it may still be in use: then the caller can put
    /// it back with [`Self::insert`]).
    pub fn get(&mut self, key: &K, now: Instant) -> Result<Option<&V>, V> {
        let lease = self.lease;
        match self.entries.get(key).map(|e| e.expires > now) {
            None => Ok(None),
            Some(true) => {
                let e = self.entries.get_mut(key).expect("present");
                e.expires = now + lease;
                Ok(Some(&e.value))
            }
            Some(false) => Err(self.entries.remove(key).expect("present").value),
        }
    }

    /// Caches `value` for `key` with a fresh lease. Returns what it
    /// displaced: the old value for `key`, or, in a full cache, the entry
    /// whose lease ends first.
    pub fn insert(&mut self, key: K, value: V, now: Instant) -> Option<V> {
        let expires = now + self.lease;
        if let Some(e) = self.entries.get_mut(&key) {
            e.expires = expires;
            return Some(std::mem::replace(&mut e.value, value));
        }
        let evicted = if self.entries.len() >= self.capacity {
            let first = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
                .expect("full, so not empty");
            self.entries.remove(&first).map(|e| e.value)
        } else {
            None
        };
        self.entries.insert(key, Entry { value, expires });
        evicted
    }

    /// The values held, expired or not.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.values().map(|e| &e.value)
    }

    /// Forgets `key` (the peer was seen down); returns its value.
    pub fn invalidate(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key).map(|e| e.value)
    }

    /// Removes and returns every entry whose lease ended by `now`, except
    /// those `in_use` says are still used: their leases are renewed.
    pub fn expire(&mut self, now: Instant, mut in_use: impl FnMut(&V) -> bool) -> Vec<V> {
        let lease = self.lease;
        let ended: Vec<K> = self
            .entries
            .iter_mut()
            .filter_map(|(k, e)| {
                if e.expires > now {
                    return None;
                }
                if in_use(&e.value) {
                    e.expires = now + lease;
                    return None;
                }
                Some(k.clone())
            })
            .collect();
        ended
            .iter()
            .filter_map(|k| self.entries.remove(k).map(|e| e.value))
            .collect()
    }

    /// Removes and returns every entry `dead` says is dead (its peer was
    /// seen down).
    pub fn invalidate_where(&mut self, mut dead: impl FnMut(&V) -> bool) -> Vec<V> {
        let gone: Vec<K> = self
            .entries
            .iter()
            .filter(|(_, e)| dead(&e.value))
            .map(|(k, _)| k.clone())
            .collect();
        gone.iter()
            .filter_map(|k| self.entries.remove(k).map(|e| e.value))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_entry_lives_its_lease_past_its_last_use() {
        let t0 = Instant::now();
        let mut c = PeerCache::new(secs(10), 8);
        assert!(c.insert("a", 1, t0).is_none());
        assert_eq!(c.get(&"a", t0 + secs(9)), Ok(Some(&1)));
        // The use at 9 s renewed it to 19 s.
        assert_eq!(c.get(&"a", t0 + secs(18)), Ok(Some(&1)));
        assert_eq!(c.get(&"a", t0 + secs(28)), Err(1), "ended at 28 s");
        assert_eq!(c.get(&"a", t0 + secs(28)), Ok(None), "and is gone");
        assert!(c.is_empty());
    }

    #[test]
    fn invalidation_forgets_at_once() {
        let t0 = Instant::now();
        let mut c = PeerCache::new(secs(10), 8);
        c.insert("a", 1, t0);
        c.insert("b", 2, t0);
        assert_eq!(c.invalidate(&"a"), Some(1));
        assert_eq!(c.get(&"a", t0), Ok(None));
        assert_eq!(c.invalidate_where(|v| *v == 2), vec![2]);
        assert!(c.is_empty());
    }

    #[test]
    fn expiry_spares_what_is_in_use_and_renews_it() {
        let t0 = Instant::now();
        let mut c = PeerCache::new(secs(10), 8);
        c.insert("idle", 1, t0);
        c.insert("busy", 2, t0);
        c.insert("young", 3, t0 + secs(5));
        let mut gone = c.expire(t0 + secs(10), |v| *v == 2);
        gone.sort();
        assert_eq!(gone, vec![1]);
        // "busy" was renewed at 10 s, to 20 s; "young" ends at 15 s.
        assert_eq!(c.expire(t0 + secs(15), |_| false), vec![3]);
        assert_eq!(c.get(&"busy", t0 + secs(19)), Ok(Some(&2)));
    }

    #[test]
    fn a_full_cache_evicts_the_entry_ending_first() {
        let t0 = Instant::now();
        let mut c = PeerCache::new(secs(10), 2);
        c.insert("a", 1, t0);
        c.insert("b", 2, t0 + secs(1));
        let _ = c.get(&"a", t0 + secs(2)); // now "b" ends first
        assert_eq!(c.insert("c", 3, t0 + secs(3)), Some(2));
        assert_eq!(c.insert("a", 4, t0 + secs(3)), Some(1), "replaces");
        assert_eq!(c.len(), 2);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32),
        Get(u8),
        Invalidate(u8),
        Expire,
        Wait(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u8..6).prop_map(Op::Get),
            (0u8..6).prop_map(Op::Invalidate),
            Just(Op::Expire),
            (0u8..20).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Against a model that keeps (value, last use): `get` returns a
        /// value exactly when it was inserted, not invalidated, and used
        /// within the lease; the cache never holds more than its capacity.
        #[test]
        fn never_serves_an_entry_past_its_lease(ops in proptest::collection::vec(op(), 1..200)) {
            let t0 = Instant::now();
            let lease = secs(10);
            let mut now = t0;
            let mut c = PeerCache::new(lease, 4);
            let mut model: HashMap<u8, (u32, Instant)> = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => {
                        if !model.contains_key(&k) && model.len() >= 4 {
                            // Any of the entries whose lease ends first.
                            let first = model.values().map(|(_, t)| *t).min().unwrap();
                            let evicted = c.insert(k, v, now).expect("evicts one");
                            let key = model
                                .iter()
                                .find(|(_, (mv, t))| *t == first && *mv == evicted)
                                .map(|(k, _)| *k);
                            prop_assert!(key.is_some(), "evicted {} that did not end first", evicted);
                            model.remove(&key.unwrap());
                        } else {
                            let old = c.insert(k, v, now);
                            prop_assert_eq!(old, model.get(&k).map(|(v, _)| *v));
                        }
                        model.insert(k, (v, now));
                    }
                    Op::Get(k) => {
                        let got = c.get(&k, now).map(|v| v.copied());
                        match model.get(&k).copied() {
                            None => prop_assert_eq!(got, Ok(None)),
                            Some((v, used)) if used + lease > now => {
                                prop_assert_eq!(got, Ok(Some(v)));
                                model.insert(k, (v, now));
                            }
                            Some((v, _)) => {
                                prop_assert_eq!(got, Err(v));
                                model.remove(&k);
                            }
                        }
                    }
                    Op::Invalidate(k) => {
                        prop_assert_eq!(c.invalidate(&k), model.remove(&k).map(|(v, _)| v));
                    }
                    Op::Expire => {
                        let mut gone = c.expire(now, |_| false);
                        gone.sort();
                        let mut want: Vec<u32> = model
                            .iter()
                            .filter(|(_, (_, used))| *used + lease <= now)
                            .map(|(_, (v, _))| *v)
                            .collect();
                        want.sort();
                        model.retain(|_, (_, used)| *used + lease > now);
                        prop_assert_eq!(gone, want);
                    }
                    Op::Wait(s) => now += secs(u64::from(s)),
                }
                prop_assert!(c.len() <= 4);
                prop_assert_eq!(c.len(), model.len());
            }
        }
    }
}
