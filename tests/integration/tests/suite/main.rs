//! rrpc-tonic's integration tests, one module per feature, in one test
//! binary (test names read `<feature>::<transport>::<case>`, so
//! `cargo test -p rrpc-integration-tests --test suite sharing::` runs one
//! feature).
//!
//! One binary instead of one per file: the test build linked and
//! instantiated tonic's generics once per file, about 6 s each on 2 cores,
//! most of the integration tests' share of CI's build. The files that read
//! or change process-wide state stay binaries of their own, so nothing runs
//! beside them in their process: `hello_fds` and `release` count the
//! process's descriptors, `ring_sizing` its shared-memory RSS, `sigkill`
//! kills the processes it spawned, and `link_faults` takes the device's
//! link down under every connection of the process.

mod accept;
mod auth;
mod cancellation;
mod compression;
mod concurrency;
mod conn_limits;
mod connect;
mod deadlines;
mod endpoint;
mod flow_control;
mod injected_faults;
mod inproc;
mod layers;
mod message_sizes;
mod metadata;
mod one_port;
mod panics;
mod parity;
mod pool;
mod port_fold;
mod ring_encryption;
mod rpc_kinds;
mod server_options;
mod sharing;
mod shutdown;
mod spare;
mod tls;
