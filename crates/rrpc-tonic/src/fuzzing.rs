//! Entry points for `cargo fuzz` (the workspace's `fuzz/` crate) into
//! parsers of peer-written bytes that are not public API. Built only with
//! `--cfg fuzzing`, which cargo-fuzz sets.

/// A client's handshake section as the server reads it for shared queue
/// pairs (`sharing::parse_request`), re-encoded when it parses.
///
/// # Errors
/// The parser's refusal.
pub fn sharing_request(app: &[u8]) -> Result<Vec<u8>, String> {
    crate::conn::sharing::fuzz_round_trip(app)
}

/// One `rrpc://` negotiation message (a client's hello or a server's
/// reply, `port::hello`), re-encoded when it parses.
///
/// # Errors
/// The parser's refusal.
pub fn port_hello(msg: &[u8]) -> Result<Vec<u8>, String> {
    crate::port::hello::decode(msg)
        .map(|m| m.encode())
        .map_err(|e| e.to_string())
}

/// A ring connection's ticket message (`tls::parse_ticket_request`, as
/// the server reads it) and the server's answer (`tls::parse_ticket_reply`,
/// as the client reads it), each re-encoded when it parses: both read
/// bytes the peer wrote in a ring.
pub fn ring_ticket(msg: &[u8]) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    crate::tls::fuzz_round_trip(msg)
}
