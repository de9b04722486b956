//! Arbitrary bytes as a peer's ring parameters (its handshake section):
//! decoding never panics, whatever decodes re-encodes to the same bytes,
//! and checking it against our ring only ever returns a slot count or an
//! error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_ringbuf::{RingConfig, RingParams};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = RingParams::decode(data) {
        assert_eq!(p.encode(), data);
        let ours = RingParams::of(&RingConfig::default());
        if let Ok(initial) = ours.check_peer(&p) {
            assert!(initial >= rrpc_ringbuf::MIN_SLOT_COUNT);
            assert!(initial <= u64::from(p.slot_count));
        }
    }
});
