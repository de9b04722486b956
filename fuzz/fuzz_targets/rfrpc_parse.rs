//! Arbitrary peer-written bytes never panic the RF-RPC parsers (request
//! and response frames, batches, the server's handshake section), and
//! whatever parses is within bounds; a complete batch and a server section
//! re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_kv::rfrpc::{batch, wire};

fuzz_target!(|data: &[u8]| {
    let (seq, cap) = match data {
        [a, b, c, d, e, f, ..] => (
            u32::from_le_bytes([*a, *b, *c, *d]),
            u16::from_le_bytes([*e, *f]) as usize,
        ),
        _ => (1, 64),
    };
    if let Ok(wire::RequestState::Complete(h)) = wire::parse_request(data, seq) {
        assert!(wire::request_frame_len(h.len as usize) <= data.len());
    }
    match wire::parse_response(data, seq, cap) {
        Ok(wire::Fetched::Complete(h)) => {
            assert!(wire::response_frame_len(h.len as usize) <= data.len().min(cap));
        }
        Ok(wire::Fetched::NeedMore { total }) => assert!(total > data.len() && total <= cap),
        _ => {}
    }
    if let Ok(info) = wire::ServerInfo::decode(data) {
        assert_eq!(info.encode(), data, "a server section re-encodes as it came");
    }
    if let Ok(batch::BatchState::Complete(b)) = batch::parse(data, 256) {
        assert!(b.len <= data.len());
        let entries: Vec<&[u8]> = b.entries.iter().map(|r| &data[r.clone()]).collect();
        let again = batch::encode(b.seq, b.aux, entries).unwrap();
        assert_eq!(again.len(), b.len);
        let end = b.entries.last().map_or(8, |r| r.end);
        assert_eq!(&again[..end], &data[..end], "head and entries");
    }
});
