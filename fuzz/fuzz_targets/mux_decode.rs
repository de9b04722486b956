//! Arbitrary bytes from a peer on a shared connection's side channel
//! (rrpc-core `conn::mux`) never panic the decoder, whatever decodes
//! re-encodes to the same bytes, and a server's and a client's protocol
//! end fed what decodes never panic either (an error closes that peer's
//! shared connection; nothing else). The server has granted slots ahead,
//! so that opens ahead into them (and into others) reach its checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_core::conn::mux::{Mux, MuxLimits, MuxMessage, MuxRole, Parts};

fuzz_target!(|data: &[u8]| {
    let mut server = Mux::new(MuxRole::Server, MuxLimits::default());
    let _ = server.grant(4 * 4096, 4096);
    let slices = (0..2)
        .filter_map(|i| Some((i, server.take_slot(4096)?)))
        .collect();
    let _ = server.credit(Parts {
        sections: Vec::new(),
        slices,
    });
    let mut client = Mux::new(MuxRole::Client, MuxLimits::default());
    let mut rest = data;
    while let Ok(Some((m, used))) = MuxMessage::decode(rest) {
        assert!(used <= rest.len());
        assert_eq!(m.encode().expect("a decoded message re-encodes"), rest[..used]);
        let _ = server.handle(m.clone());
        let _ = client.handle(m);
        rest = &rest[used..];
    }
    for kind in 0..10 {
        let _ = MuxMessage::decode_body(kind, data);
    }
});
