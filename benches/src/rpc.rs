//! The rpc suite (RR-Compound §V-A..C): tonic over TCP and over a Unix socket as baselines,
//! rrpc over shm on the HTTP/2 path and on the fast path, all in the same run.
//!
//! Server and clients run in one process on two single-thread tokio runtimes, each pinned to
//! its own CPU (rrpc's polling thread comes on top, see the notes in every table). The rrpc
//! rows use rrpc-tonic's default connection management (`rrpc_tonic::default_poller_config`).

// The service, transports, servers, clients and runtimes everything below runs on.
mod harness;
// The load generators.
mod loadgen;
// Servers in a child process of their own.
mod child;
// The suite: Table III and Fig. 10, then the experiments of `figs` and `load`.
mod suite;
// Figs. 8, 12, 14 and 15-16.
mod figs;
// Low load, CPU contention, idle connections (and the `--role hog` process).
mod load;
// Cluster mode's server and client roles.
mod cluster;

pub use child::{ChildServer, serve_child};
pub use cluster::{cluster_client, cluster_server};
pub use harness::{
    AnyClient, FIXED_RING_ENV, POLLER_VARIANTS, RDMA_DEVICE_ENV, ServerHandle, Svc, Transport,
    connect, connect_many, connect_once, connect_to, pb, poller_variant, rdma_device, rrpc_config,
    runtime, start_server, start_server_with, with_path,
};
pub use load::hog;
pub use loadgen::{Throughput, pingpong, stream_throughput, unary_load};
pub use suite::{EXPERIMENTS, run_suite};
// Shared by the experiment modules (`super::selected`, `super::BaseByClients`).
use suite::{BaseByClients, selected};
