//! Arbitrary bytes from a peer never panic the handshake decoder, and whatever
//! decodes re-encodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_core::handshake::{Kind, Message};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((m, used))) = Message::decode(data) {
        assert!(used <= data.len());
        let again = m.encode().expect("a decoded message re-encodes");
        let (m2, _) = Message::decode(&again).unwrap().unwrap();
        assert_eq!(m, m2);
    }
    for k in [Kind::Hello, Kind::Accept, Kind::Reject, Kind::Goodbye] {
        let _ = Message::decode_body(k, data);
    }
});
