//! rrpc-poller's integration tests, one binary (one link, one set of
//! monomorphised dependencies) with a module per feature. Tests that
//! read process-wide state (open descriptors, threads, CPU affinity)
//! keep binaries of their own beside it.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod e2e;
mod managed;
mod metrics;
mod modes;
mod parked_release;
mod stress;
