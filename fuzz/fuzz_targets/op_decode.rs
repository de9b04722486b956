//! Arbitrary bytes as an rrpc-kv operation (what a client writes into the
//! RF-RPC server's request buffer and what the gRPC face decodes) and as
//! its result (what a client READs back): decoding never panics, and
//! whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_kv::{Op, OpResult};

fuzz_target!(|data: &[u8]| {
    if let Ok(op) = Op::decode(data) {
        assert_eq!(op.to_bytes().expect("a decoded op re-encodes"), data);
    }
    if let Ok(r) = OpResult::decode(data) {
        assert_eq!(r.to_bytes(), data);
    }
});
