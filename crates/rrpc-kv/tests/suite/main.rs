//! rrpc-kv's integration tests, one binary (one link, one set of
//! monomorphised dependencies) with a module per feature. Tests that
//! read process-wide state (open descriptors, threads, CPU affinity)
//! keep binaries of their own beside it.

#[path = "../common/mod.rs"]
mod common;
#[path = "../store_model/mod.rs"]
mod store_model;

mod grpc;
mod rfrpc;
mod rfrpc_accept;
mod rfrpc_batch;
mod rfrpc_torn;
mod rfrpc_verbs;
mod server_bin;
mod store;
mod store_persistent;
mod ycsb_bench;
