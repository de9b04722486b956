//! Entry points for `cargo fuzz` (the workspace's `fuzz/` crate) into
//! parsers of peer-written bytes that are not public API. Built only with
//! `--cfg fuzzing`, which cargo-fuzz sets.

/// A client's handshake section as the server reads it for shared queue
/// pairs (`sharing::parse_request`), re-encoded when it parses.
///
/// # Errors
/// The parser's refusal.
pub fn sharing_request(app: &[u8]) -> Result<Vec<u8>, String> {
    crate::sharing::fuzz_round_trip(app)
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

/// The first message of a ring connection on an `rrpc://` port with TLS,
/// as the server reads it for its ticket (`tls::parse_ticket`): the
/// ticket, or `None` for anything else. The peer writes these bytes
/// before it is authenticated.
pub fn ring_ticket(msg: &[u8]) -> Option<[u8; crate::tls::TICKET_LEN]> {
    crate::tls::parse_ticket(msg)
}
