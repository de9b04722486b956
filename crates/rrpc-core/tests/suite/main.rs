//! rrpc-core's integration tests, one binary (one link, one set of
//! monomorphised dependencies) with a module per feature. Tests that
//! read process-wide state (open descriptors, threads, CPU affinity)
//! keep binaries of their own beside it.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod conformance;
mod dialing;
mod faults;
mod handshake_errors;
mod logical;
mod shared_qp;
mod tls;
mod two_process;
