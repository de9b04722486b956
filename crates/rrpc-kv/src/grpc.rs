//! The gRPC face: `rrpc.kv.v1.Kv` (in progress).
