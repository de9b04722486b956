//! Arbitrary bytes from a peer never panic the fast-path frame decoder or
//! the path negotiation's hello parser, every decoded frame lies inside the
//! message, and whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_tonic::frame::{self, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let mut covered = 0usize;
    for f in frame::frames(data) {
        let Ok(f) = f else { break };
        covered += HEADER_LEN + f.payload.len();
        assert!(covered <= data.len());
        if let Ok(head) = frame::parse_request_headers(f.payload) {
            let authority = head.authority.as_ref().map_or("", |a| a.as_str());
            let again = frame::request_headers_payload(head.path.as_str(), authority, &head.headers);
            let head2 = frame::parse_request_headers(&again).expect("re-encoded headers decode");
            assert_eq!(head2, head);
        }
        if let Ok((status, map)) = frame::parse_response_headers(f.payload) {
            let again = frame::response_headers_payload(status, &map);
            assert_eq!(frame::parse_response_headers(&again).expect("re-encoded decodes"), (status, map));
        }
        if let Ok(inc) = frame::parse_window_update(f.payload) {
            assert!(inc >= 1 && inc <= frame::MAX_WINDOW);
            assert_eq!(frame::window_update_payload(inc), f.payload);
        }
        if let Ok(map) = frame::parse_metadata(f.payload) {
            let again = frame::metadata_payload(&map);
            assert_eq!(frame::parse_metadata(&again).expect("re-encoded metadata decodes"), map);
        }
    }
    // The path negotiation's hello (the first ring message): only a
    // well-formed one parses, and it re-encodes to the same bytes.
    if let Ok((path, window)) = frame::parse_path_hello(data) {
        assert_eq!(&frame::path_hello(path, window)[..], data);
    }
    // Payloads on their own (a frame's payload is any byte string).
    let _ = frame::parse_request_headers(data);
    let _ = frame::parse_metadata(data);
    let _ = frame::parse_window_update(data);
    let _ = frame::parse_response_headers(data);
});
