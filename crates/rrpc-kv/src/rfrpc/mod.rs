//! RF-RPC (in progress).
