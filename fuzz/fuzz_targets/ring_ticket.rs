//! Arbitrary bytes as the first message of a ring connection on an
//! `rrpc://` port with TLS (the ticket a client presents before it is
//! authenticated): parsing never panics, and a message parses exactly
//! when it is the ticket magic `RRPT` followed by the ticket's 16 bytes,
//! nothing more (a trailing or missing byte is refused, never ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = rrpc_tonic::fuzzing::ring_ticket(data);
    let whole = data.len() == 4 + 16 && data.starts_with(b"RRPT");
    assert_eq!(parsed.is_some(), whole, "{data:?}");
    if let Some(t) = parsed {
        assert_eq!(&t[..], &data[4..]);
    }
});
