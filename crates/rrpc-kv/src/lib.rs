//! A Jakiro-like key-value store over RF-RPC (remote fetching).
//!
//! Specification: RF-RPC and Jakiro (Wu, Ma, Su et al., "RF-RPC: Remote
//! Fetching RPC Paradigm for RDMA-Enabled Network", §3-§5.1; "the RF-RPC
//! paper" in these docs), with YCSB from
//! RR-Compound §V-E. Its modules, each usable alone:
//!
//! - [`op`]: the store's operations and their binary encoding (what travels
//!   in an RF-RPC request or result).
//! - [`store`]: Jakiro's store. The key space is hashed into partitions, one
//!   per server thread (EREW); buckets of eight slots with strict LRU
//!   eviction inside a bucket; a memory bound. A persistent engine sits
//!   behind the same operations.
//! - [`rfrpc`]: RF-RPC, the remote-fetching RPC layer over `rrpc-core`: the
//!   client WRITEs a request into the server's memory, the server leaves the
//!   result in its own memory, and the client READs it back; the hybrid
//!   switch to server-reply, batching, and the tuners of `fetch_size`,
//!   `retry_limit` and the batch size.
//! - [`grpc`]: the `rrpc.kv.v1.Kv` gRPC service over any [`Execute`], served
//!   by tonic over TCP and over rrpc-tonic from the same binary.
//! - [`ycsb`]: the YCSB core workloads A-F and [`ycsb::driver`], the driver
//!   loop that `rrpc-kv-bench` and the `kv` benchmark suite share.
//!
//! Errors of every layer are one [`Error`].
//!
//! # Features
//! - `cli` (default): the binaries `rrpc-kv-server` and `rrpc-kv-bench`,
//!   and their dependencies (clap, indicatif, tracing-subscriber; it turns
//!   on `redis`). A library user can leave it out with
//!   `default-features = false`: 122 crates to build instead of 182 for a
//!   tonic service with the store.
//! - `redis`: `ycsb::redis`, the YCSB driver's Redis baseline.
//! - `verbs`: RF-RPC and the gRPC face over RDMA (rrpc-core's libibverbs
//!   provider; tested on soft-RoCE, not run on an RDMA NIC).

pub mod error;
pub mod grpc;
pub mod op;
pub mod rfrpc;
pub mod store;
pub mod ycsb;

pub use error::{Error, Result};
pub use op::{Execute, Op, OpResult};
