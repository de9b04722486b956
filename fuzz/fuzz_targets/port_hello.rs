//! Arbitrary bytes as the first message on an `rrpc://` port (a client's
//! hello, or the server's reply as the client reads it): parsing never
//! panics, and whatever parses is exactly those bytes re-encoded (so no
//! length, bound or trailing byte is ever ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = rrpc_tonic::fuzzing::port_hello(data) {
        assert_eq!(again, data);
    }
});
