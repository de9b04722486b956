//! Arbitrary bytes as a client's handshake section to an rrpc-tonic server
//! with shared queue pairs (a dedicated connection's path hello, the opening
//! of a shared connection, or a logical connection naming one): parsing
//! never panics, and whatever parses is sent as exactly those bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = rrpc_tonic::fuzzing::sharing_request(data) {
        assert_eq!(again, data);
    }
});
