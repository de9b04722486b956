//! Arbitrary bytes as the first message of a ring connection on a TLS
//! port (the client's ticket, with or without its ask for ring
//! encryption) and as the server's answer to it: parsing never panics,
//! and whatever parses is exactly those bytes re-encoded (no length,
//! flag or trailing byte ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (request, reply) = rrpc_tonic::fuzzing::ring_ticket(data);
    if let Some(again) = request {
        assert_eq!(again, data);
    }
    if let Some(again) = reply {
        assert_eq!(again, data);
    }
});
