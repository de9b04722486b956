//! The poller's shared state: [`Inner`], which every [`Poller`](crate::Poller) clone and every
//! [`Registration`](crate::Registration) holds, owns the shards and the polling threads, spawns
//! them and shuts them down. Above the shards and the polling threads' loop, below the
//! registrations (which it does not name) and the [`Poller`](crate::Poller) facade.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::config::PollerConfig;
use crate::error::{Error, Result};
use crate::stats::Counters;

use super::placement::Placement;
use super::shard::{Shard, lock};
use super::thread::{IdleWatch, LoopCfg, polling_loop};

/// Owner of the polling threads and of every registration's shared state.
pub(super) struct Inner {
    pub(super) cfg: PollerConfig,
    pub(super) counters: Arc<Counters>,
    pub(super) shared: Vec<Arc<Shard>>,
    /// Idle rescans of the shared shards.
    pub(super) watch: Arc<IdleWatch>,
    pub(super) shared_threads: Mutex<Vec<JoinHandle<()>>>,
    /// EVENT registrations (never polled; kept for shutdown).
    pub(super) event_shard: Arc<Shard>,
    /// BP: one shard and thread per registration.
    pub(super) bp: Mutex<Vec<(Arc<Shard>, JoinHandle<()>)>>,
    pub(super) bp_next_id: AtomicUsize,
    pub(super) shutdown: AtomicBool,
    pub(super) threads_alive: Arc<AtomicUsize>,
    /// [`Handoff::Always`](crate::Handoff::Always) in force: nothing spins.
    pub(super) always_handoff: bool,
    /// Where the polling threads run (RB² §IV-C).
    pub(super) placement: Arc<Placement>,
}

impl Inner {
    fn loop_cfg(&self, shared: bool) -> LoopCfg {
        LoopCfg {
            park_after: self.cfg.idle_park_after(),
            bell_park_after: self
                .cfg
                .doorbell_fallback()
                .then(|| self.cfg.doorbell_park_after())
                .flatten(),
            idle_interval: self.cfg.idle_poll_interval(),
            backoff: self.cfg.doorbell_fallback() && self.cfg.spin_backoff(),
            watch: shared.then(|| self.watch.clone()),
            mode: self.cfg.mode(),
        }
    }

    pub(super) fn spawn(&self, shard: &Arc<Shard>, shared: bool) -> Result<JoinHandle<()>> {
        let (s, c, cfg, alive, place) = (
            shard.clone(),
            self.counters.clone(),
            self.loop_cfg(shared),
            self.threads_alive.clone(),
            self.placement.clone(),
        );
        alive.fetch_add(1, Ordering::SeqCst);
        let mode = self.cfg.mode();
        crate::report::threads(1.0, mode);
        let h = std::thread::Builder::new()
            .name(format!("{}-{}", self.cfg.thread_name(), shard.id))
            .spawn(move || {
                place.enter();
                polling_loop(s, c, cfg);
                place.leave();
                alive.fetch_sub(1, Ordering::SeqCst);
                crate::report::threads(-1.0, mode);
            })
            .map_err(|e| {
                self.threads_alive.fetch_sub(1, Ordering::SeqCst);
                crate::report::threads(-1.0, mode);
                Error::Io {
                    op: "spawn polling thread",
                    source: e,
                }
            })?;
        let _ = shard.thread.set(h.thread().clone());
        Ok(h)
    }

    /// The shards that have a polling thread: the shared ones and BP's.
    pub(super) fn threaded_shards(&self) -> Vec<Arc<Shard>> {
        let mut v: Vec<Arc<Shard>> = self.shared.clone();
        v.extend(lock(&self.bp).iter().map(|(s, _)| s.clone()));
        v
    }

    fn all_shards(&self) -> Vec<Arc<Shard>> {
        let mut v = self.threaded_shards();
        v.push(self.event_shard.clone());
        v
    }

    pub(super) fn shutdown(&self) {
        if self.shutdown.swap(true, Ordering::SeqCst) {
            return;
        }
        let shards = self.all_shards();
        for s in &shards {
            s.stop();
        }
        for h in lock(&self.shared_threads).drain(..) {
            let _ = h.join();
        }
        for (_, h) in lock(&self.bp).drain(..) {
            let _ = h.join();
        }
        // Wake every waiting task; it sees the shutdown flag and returns `Error::Shutdown`.
        for s in &shards {
            for e in lock(&s.entries).iter() {
                e.force_wake();
            }
        }
        tracing::debug!("poller shut down");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}
