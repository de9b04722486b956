//! Arbitrary bytes as the verbs endpoint a peer's handshake carries (LID,
//! QPN, PSN, GID, MTU): decoding never panics, refuses what a queue pair
//! could not be moved to RTR with, and whatever decodes re-encodes to the
//! same bytes. Needs the `verbs` feature (libibverbs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = rrpc_core::fuzzing::verbs_endpoint(data) {
        assert_eq!(again, data);
    }
});
