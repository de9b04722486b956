//! rrpc-ringbuf's integration tests, one binary (one link, one set of
//! monomorphised dependencies) with a module per feature. Tests that
//! read process-wide state (open descriptors, threads, CPU affinity)
//! keep binaries of their own beside it.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod event_mode;
mod negotiation;
mod pingpong;
mod placement;
mod self_sizing;
mod shared_qp;
mod two_process;
