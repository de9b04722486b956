//! A KRCore-style pool of pre-initialised connection resources (KRCore §3.1, §4.2).
//!
//! Creating a queue pair and registering its rings costs system calls (and,
//! on a NIC, milliseconds of driver work). KRCore keeps such resources ready
//! so that connecting costs one handshake round trip. [`ResourcePool`] keeps
//! up to `capacity` bundles made by a factory; [`ResourcePool::take`] returns
//! one at once (or builds one inline on a miss) and a background thread refills
//! the pool, so connection setup stays off the slow path.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::error::Result;

type Factory<T> = dyn Fn() -> Result<T> + Send + Sync;

struct Shared<T> {
    ready: Mutex<State<T>>,
    wake: Condvar,
    factory: Box<Factory<T>>,
    capacity: usize,
}

struct State<T> {
    items: VecDeque<T>,
    shutdown: bool,
    hits: u64,
    misses: u64,
}

/// Pre-made resources (a queue pair and its regions, typically).
pub struct ResourcePool<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    refill: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> std::fmt::Debug for ResourcePool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.ready.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("ResourcePool")
            .field("capacity", &self.shared.capacity)
            .field("ready", &st.items.len())
            .field("hits", &st.hits)
            .field("misses", &st.misses)
            .finish()
    }
}

/// Pool statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Items ready now.
    pub ready: usize,
    /// `take` calls served from the pool.
    pub hits: u64,
    /// `take` calls that had to build inline.
    pub misses: u64,
}

impl<T: Send + 'static> ResourcePool<T> {
    /// Creates a pool of up to `capacity` items made by `factory`, filled by a
    /// background thread. `capacity == 0` disables pooling (every take builds).
    pub fn new<F>(capacity: usize, factory: F) -> Self
    where
        F: Fn() -> Result<T> + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            ready: Mutex::new(State {
                items: VecDeque::with_capacity(capacity),
                shutdown: false,
                hits: 0,
                misses: 0,
            }),
            wake: Condvar::new(),
            factory: Box::new(factory),
            capacity,
        });
        let refill = (capacity > 0).then(|| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("rrpc-pool".into())
                .spawn(move || refill_loop(&s))
                .expect("spawn pool thread")
        });
        ResourcePool { shared, refill }
    }

    /// Takes a ready item, or builds one now if the pool is empty.
    ///
    /// # Errors
    /// The factory's error on a miss.
    pub fn take(&self) -> Result<T> {
        {
            let mut st = self.shared.ready.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(x) = st.items.pop_front() {
                st.hits += 1;
                self.shared.wake.notify_one();
                return Ok(x);
            }
            st.misses += 1;
            self.shared.wake.notify_one();
        }
        (self.shared.factory)()
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.shared.ready.lock().unwrap_or_else(|p| p.into_inner());
        PoolStats {
            ready: st.items.len(),
            hits: st.hits,
            misses: st.misses,
        }
    }

    /// Blocks until the pool is full (tests and warm-up).
    pub fn wait_full(&self) {
        let mut st = self.shared.ready.lock().unwrap_or_else(|p| p.into_inner());
        while st.items.len() < self.shared.capacity && !st.shutdown {
            st = self
                .shared
                .wake
                .wait_timeout(st, std::time::Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn refill_loop<T>(s: &Shared<T>) {
    loop {
        {
            let mut st = s.ready.lock().unwrap_or_else(|p| p.into_inner());
            while !st.shutdown && st.items.len() >= s.capacity {
                st = s.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.shutdown {
                return;
            }
        }
        match (s.factory)() {
            Ok(x) => {
                let mut st = s.ready.lock().unwrap_or_else(|p| p.into_inner());
                st.items.push_back(x);
                s.wake.notify_all();
            }
            Err(e) => {
                tracing::warn!(error = %e, "connection pool refill failed; retrying in 100 ms");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

impl<T: Send + 'static> Drop for ResourcePool<T> {
    fn drop(&mut self) {
        self.shared
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.refill.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn serves_prebuilt_items_then_refills() {
        let made = Arc::new(AtomicU32::new(0));
        let m = made.clone();
        let pool = ResourcePool::new(3, move || Ok(m.fetch_add(1, Ordering::SeqCst)));
        pool.wait_full();
        assert_eq!(pool.stats().ready, 3);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pool.stats().hits, 2);
        pool.wait_full();
        assert!(made.load(Ordering::SeqCst) >= 5);
    }

    #[test]
    fn zero_capacity_builds_inline() {
        let pool = ResourcePool::new(0, || Ok(7u8));
        assert_eq!(pool.take().unwrap(), 7);
        assert_eq!(pool.stats().misses, 1);
    }
}
